"""How posenc tells you what it decided: the ``"posenc"`` logger and :class:`LayoutWarning`.

Where posenc can tell which RoPE pair layout a checkpoint uses (a Hugging Face configuration, a
weight conversion, a patched model), it logs the layout it chose and why at ``INFO`` level on the
``"posenc"`` logger, and warns with :class:`LayoutWarning` when an argument contradicts what it
read.  To see the records::

    import logging
    logging.basicConfig()
    logging.getLogger("posenc").setLevel(logging.INFO)

To turn the warnings into errors (e.g. in a test suite)::

    import warnings, posenc
    warnings.simplefilter("error", posenc.LayoutWarning)
"""

from __future__ import annotations

__all__ = ["LOGGER_NAME", "LayoutWarning"]

#: The name of the logger posenc writes its notices to.
LOGGER_NAME = "posenc"


class LayoutWarning(UserWarning):
    """An argument contradicts the RoPE pair layout posenc read from a model or checkpoint.

    RoPE pairs features either as ``(i, i + d/2)`` (``layout="half"``: Hugging Face transformers'
    ``rotate_half``, GPT-NeoX) or as ``(2i, 2i + 1)`` (``layout="interleaved"``: GPT-J, Meta's
    original Llama code, rotary-embedding-torch, torchtune).  Weights trained with one layout give
    wrong attention scores under the other unless they are converted once with
    :func:`posenc.convert_rope_weight`.

    Examples:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warnings.warn("layout='interleaved' contradicts the config's 'half'", LayoutWarning)
        >>> caught[0].category.__name__, issubclass(LayoutWarning, UserWarning)
        ('LayoutWarning', True)
    """

