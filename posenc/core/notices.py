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

import sys
import warnings
from typing import Any

from posenc._deprecate import UNSET, renamed

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


_INTERNAL_PACKAGES = ("posenc", "torch", "keras")


def caller_stacklevel() -> int:
    """``stacklevel`` for a warning raised by the calling function that points at the first frame
    outside posenc, torch and keras: the user's line, also through ``Module.__call__``."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] in _INTERNAL_PACKAGES:
        frame = frame.f_back
        level += 1
    return level


def renamed_in_call(where: str, old: str, new: str, old_value: Any, new_value: Any, default: Any, *,
                    tracing: bool = False) -> Any:
    """:func:`posenc._deprecate.renamed` for a keyword of a method that may run through the framework's
    ``__call__`` (``forward``) or inside a compiled graph: the same value, error and message, the
    warning attributed to the user's line.  While ``tracing`` (``torch.compile``, ``torch.export``,
    which cannot trace a warning) the old name is accepted without one."""
    if old_value is UNSET or new_value is not default:
        return renamed(where, old, new, old_value, new_value, default)           # the new value, or the TypeError
    if not tracing:
        warnings.warn(
            f"{where}: {old}= is deprecated and will be removed in the next release; pass {new}= instead",
            DeprecationWarning,
            stacklevel=caller_stacklevel(),
        )
    return old_value
