"""Frequencies and exact tables of the sinusoidal encoding (framework-free).

Vaswani et al. 2017, "Attention Is All You Need", section 3.5:

    PE(p, 2i)   = sin(p / base^(2i/d))
    PE(p, 2i+1) = cos(p / base^(2i/d))

so column ``j`` has angular frequency ``base^(-2*(j//2)/d)``.  Three conventions are offered:

``"interleaved"``
    The paper's layout: sin on even columns, cos on odd columns (the seeds, positional-encodings,
    keras-hub ``SinePositionEncoding``).  Any ``d >= 1``; for odd ``d`` the last column is a sine.
``"concat"``
    The same numbers with columns reordered ``[all sines | all cosines]``, i.e.
    ``interleaved[:, perm]`` with ``perm = [0, 2, 4, ..., 1, 3, 5, ...]`` (Hugging Face Marian,
    x-transformers).
``"tensor2tensor"``
    tensor2tensor's ``get_timing_signal_1d`` and fairseq's ``SinusoidalPositionalEmbedding``:
    ``[sin | cos]`` over ``h = d // 2`` frequencies ``base^(-k / max(h - 1, 1))`` (denominator
    ``h - 1`` instead of the paper's ``h``), with a zero column appended when ``d`` is odd.
"""

from __future__ import annotations

import decimal
import functools

import numpy as np

from posenc import _validate
from posenc.core import exact

SINUSOIDAL_LAYOUTS = ("interleaved", "concat", "tensor2tensor")
INITS = ("normal", "sinusoidal", "zeros")


def check_encoding_args(dim, max_seq_len, base, layout, scale, dropout) -> tuple[int, int, float, str, float, float]:
    """Validated ``SinusoidalEncoding`` arguments (shared by the torch and Keras layers)."""
    dim = _validate.check_int("dim", dim, minimum=1)
    max_seq_len = _validate.check_int("max_seq_len", max_seq_len, minimum=1)
    base = _validate.check_float("base", base, positive=True)
    layout = _validate.check_choice("layout", layout, SINUSOIDAL_LAYOUTS)
    scale = _validate.check_float("scale", scale)
    dropout = _validate.check_float("dropout", dropout, minimum=0.0)
    if dropout >= 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    return dim, max_seq_len, base, layout, scale, dropout


def check_learned_args(max_seq_len, dim, init, padding_idx) -> tuple[int, int, str, int | None]:
    """Validated ``LearnedPositionalEmbedding`` arguments (shared by the torch and Keras layers)."""
    if max_seq_len is None:
        raise TypeError("LearnedPositionalEmbedding needs max_seq_len, the rows of the table (its first argument)")
    if dim is None:
        raise TypeError("LearnedPositionalEmbedding needs dim, the number of features (its second argument)")
    max_seq_len = _validate.check_int("max_seq_len", max_seq_len, minimum=1)
    dim = _validate.check_int("dim", dim, minimum=1)
    init = _validate.check_choice("init", init, INITS)
    if padding_idx is not None:
        padding_idx = _validate.check_int("padding_idx", padding_idx, minimum=0)
        if padding_idx >= max_seq_len:
            raise ValueError(f"padding_idx must be < max_seq_len={max_seq_len}, got {padding_idx}")
    return max_seq_len, dim, init, padding_idx


def num_frequencies(dim: int, layout: str) -> int:
    """Number of distinct frequencies a ``dim``-wide table uses."""
    return dim // 2 if layout == "tensor2tensor" else (dim + 1) // 2


@functools.lru_cache(maxsize=128)
def frequencies(dim: int, base: float, layout: str) -> tuple[decimal.Decimal, ...]:
    """Angular frequencies (radians per position) to 60 significant digits.

    Args:
        dim: table width ``d``.
        base: the frequency base (10000 in the paper).
        layout: one of :data:`SINUSOIDAL_LAYOUTS`; ``"tensor2tensor"`` uses the ``h - 1`` denominator.

    Returns:
        ``num_frequencies(dim, layout)`` Decimals, the slowest last.
    """
    n = num_frequencies(dim, layout)
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        log_base = decimal.Decimal(base).ln()
        if layout == "tensor2tensor":
            denom = decimal.Decimal(max(n - 1, 1))
            return tuple((-(decimal.Decimal(k) / denom) * log_base).exp() for k in range(n))
        return tuple((-(decimal.Decimal(2 * k) / decimal.Decimal(dim)) * log_base).exp() for k in range(n))


def turns(dim: int, base: float, layout: str) -> np.ndarray:
    """``(3, n)`` float64 split of the frequencies in turns, for :func:`posenc.core.exact.sin_cos`."""
    return exact.turns_split(frequencies(dim, base, layout))


def assemble(sin, cos, dim: int, layout: str, xp=np):
    """Arrange ``sin``/``cos`` of shape ``(..., n)`` into a ``(..., dim)`` table in ``layout``.

    Works on NumPy arrays (``xp=numpy``) and torch tensors (``xp=torch``).
    """
    n = sin.shape[-1]
    lead = tuple(sin.shape[:-1])
    if layout == "interleaved":
        pairs = xp.stack((sin, cos), -1)                     # (..., n, 2)
        return pairs.reshape(lead + (2 * n,))[..., :dim]     # (..., 2n) -> odd dim drops the last cosine
    cat = np.concatenate if xp is np else xp.cat
    if layout == "concat":
        return cat((sin, cos[..., : dim // 2]), -1)
    parts: tuple = (sin, cos)                                # NumPy arrays or torch tensors
    if dim % 2:
        pad_shape = lead + (1,)
        parts += (np.zeros(pad_shape) if xp is np else sin.new_zeros(pad_shape),)
    return cat(parts, -1)


def table(positions: np.ndarray, dim: int, base: float = 10000.0, layout: str = "interleaved") -> np.ndarray:
    """Exact float64 encoding of integer ``positions`` (any shape), shape ``(..., dim)``."""
    pos = np.asarray(positions, dtype=np.float64)
    s, c = exact.sin_cos(pos, turns(dim, base, layout))
    return assemble(s, c, dim, layout)
