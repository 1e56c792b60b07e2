"""Exact sines and cosines of ``position * frequency`` (framework-free).

Every encoding in posenc reduces to ``sin(p * w)`` and ``cos(p * w)`` for integer positions ``p`` and
real frequencies ``w``.  Computing ``p * w`` in floating point loses absolute accuracy as ``p`` grows
(float32 peers are off by ~3e-4 at ``p = 2048``), and even float64 loses the *relative* accuracy of the
result near a zero of sine or cosine.  This module removes both losses:

1. The frequency is expressed in turns, ``f = w / (2*pi)``, to about 190 bits with :mod:`decimal`, and
   split into four float64 pieces ``f = f1 + f2 + f3 + f4`` where ``f1``, ``f2``, ``f3`` carry 22
   bits each.
2. For an integer ``|p| <= 2**31`` the products ``p*f1``, ``p*f2``, ``p*f3`` are exact in float64, so
   their fractional parts are exact; ``p*f4`` is below ``2**-35`` turns and its rounding error below
   ``2**-88`` turns.  The parts are summed as a double-double ``t`` in ``[-1/2, 1/2]``.
3. Symmetries fold ``t`` to ``[-1/4, 1/4]`` so that both outputs come from ``sin`` of a small argument
   whose *relative* error is a few float64 ulps: ``sin(2 pi t) = sin(2 pi (+-1/2 - t))`` and
   ``cos(2 pi t) = sin(2 pi (1/4 - |t|))``.

The result carries a relative error of about ``2**-51``, so rounding it once to float32, float16 or
bfloat16 gives a value within one ulp of the true value (almost always the correctly rounded one).

The arithmetic uses only ``+ - *``, ``round``, ``abs``, ``sign``, ``where`` and ``sin``, so the same
function runs on NumPy arrays or on torch tensors (pass the module as ``xp``).  It must run without
fused multiply-add contraction, which NumPy and eager torch never apply.
"""

from __future__ import annotations

import decimal
import functools
import math
from typing import Any

import numpy as np

#: Positions with a larger magnitude are rejected: beyond it ``p * f1`` is no longer exact.
MAX_POSITION = 2**31

#: 2*pi to 60 digits (a mathematical constant: 6.283185307179586476925286766559005768394...), shared
#: by every module that needs it beyond float64.
TWO_PI = decimal.Decimal("6.28318530717958647692528676655900576839433879875021164194989")
#: Decimal digits of the frequency arithmetic (about 190 bits), shared by every module that uses it.
DECIMAL_DIGITS = 60
#: Frequencies above this many turns per position are rejected: the four pieces (about 119 bits)
#: no longer reach the fractional part of ``p * f`` to float64 accuracy for every ``|p| <= 2**31``.
MAX_TURNS = 2**32
_TWO_PI_F64 = 2.0 * math.pi


def _split22(value: float) -> float:
    """Round ``value`` to its leading 22 significant bits (towards zero)."""
    if value == 0.0:
        return 0.0
    exponent = math.frexp(value)[1]
    quantum = math.ldexp(1.0, max(exponent - 22, -1074))        # subnormal values: the smallest quantum
    return math.trunc(value / quantum) * quantum


def turns_split(frequencies: tuple[decimal.Decimal | float, ...]) -> np.ndarray:
    """Return the ``(4, n)`` float64 pieces ``f1 + f2 + f3 + f4`` of ``frequency / (2*pi)``.

    Args:
        frequencies: angular frequencies (radians per position), as :class:`decimal.Decimal` for the
            full precision or as float (taken as the exact binary value).

    Returns:
        ``(4, n)`` float64 array whose column sums equal the frequencies in turns to ~120 bits.
    """
    return _turns_split_cached(tuple(decimal.Decimal(f) for f in frequencies))


@functools.lru_cache(maxsize=256)
def _turns_split_cached(frequencies: tuple[decimal.Decimal, ...]) -> np.ndarray:
    out = np.empty((4, len(frequencies)), dtype=np.float64)
    with decimal.localcontext() as ctx:
        ctx.prec = DECIMAL_DIGITS
        for j, w in enumerate(frequencies):
            rest = w / TWO_PI
            if abs(rest) > MAX_TURNS:
                raise ValueError(
                    f"a frequency of {float(w):.6g} radians per position exceeds 2**32 turns, where angles are no "
                    f"longer exact; it comes from a base far below 1, a tiny scaling factor or a huge inv_freq"
                )
            for k in range(3):
                out[k, j] = _split22(float(rest))
                rest -= decimal.Decimal(out[k, j])
            out[3, j] = float(rest)
    out.setflags(write=False)
    return out


def _two_sum(a: Any, b: Any) -> tuple[Any, Any]:
    """Knuth's error-free sum: ``a + b == s + e`` exactly."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def _frac(x: Any, xp: Any) -> Any:
    """``x - round(x)``; exact for any float64 ``x``."""
    return x - xp.round(x)


def sin_cos(positions: Any, split: Any, xp: Any = np) -> tuple[Any, Any]:
    """Exact ``sin(p * w)`` and ``cos(p * w)`` in float64.

    Args:
        positions: float64 array of integer values, ``|p| <= 2**31``, any shape ``(...)``.
        split: ``(4, n)`` float64 array from :func:`turns_split` (same array library as ``positions``).
        xp: the array namespace, ``numpy`` (default) or ``torch``.

    Returns:
        ``(sin, cos)``, each float64 of shape ``(..., n)``.
    """
    p = positions[..., None]                                   # (..., 1)
    a = _frac(p * split[0], xp)                                # exact, |a| <= 1/2, (..., n)
    b = _frac(p * split[1], xp)                                # exact
    c = _frac(p * split[2], xp)                                # exact
    d = p * split[3]                                           # |d| < 2**-35, error < 2**-88 turns
    hi, lo = _two_sum(a, b)
    hi, e = _two_sum(hi, c)
    lo = lo + e
    hi, e = _two_sum(hi, d)
    lo = lo + e
    hi = _frac(hi, xp)                                         # exact; t = hi + lo in [-1/2, 1/2]
    sign = xp.sign(hi)
    mag = xp.abs(hi)
    # sin(2 pi t): fold |t| > 1/4 onto 1/2 - |t| (Sterbenz: sign/2 - hi is exact there).
    s_arg = xp.where(mag > 0.25, (sign * 0.5 - hi) - lo, hi + lo)
    # cos(2 pi t) = sin(2 pi (1/4 - |t|)); 1/4 - |hi| is exact for |hi| >= 1/8.
    c_arg = (0.25 - mag) - sign * lo
    return xp.sin(s_arg * _TWO_PI_F64), xp.sin(c_arg * _TWO_PI_F64)
