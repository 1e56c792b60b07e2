"""ALiBi head slopes (framework-free).

Press, Smith and Lewis 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input
Length Extrapolation" (ICLR), section 3: head ``h = 1..n`` of ``n`` (a power of two) adds
``-m_h * (i - j)`` to the logit of query ``i`` and key ``j``, with the geometric sequence
``m_h = 2^(-8h/n)``.  For other head counts the reference code (``get_slopes`` in the authors'
fairseq fork) takes the slopes of the largest power of two ``c < n`` and then every other slope of
``2c`` heads: ``slopes(c) + slopes(2c)[0::2][: n - c]``.
"""

from __future__ import annotations

import math

from posenc import _validate


def _power_of_two_slopes(n: int) -> list[float]:
    # 2^(-8h/n) for h = 1..n; exact powers of two when n divides 8, else correctly rounded by exp2
    return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]


def alibi_slopes(num_heads: int) -> list[float]:
    """Slopes of ``num_heads`` heads, steepest first for the power-of-two part.

    Examples:
        >>> alibi_slopes(3)
        [0.0625, 0.00390625, 0.25]
    """
    n = _validate.check_int("num_heads", num_heads, minimum=1)
    if n & (n - 1) == 0:
        return _power_of_two_slopes(n)
    c = 2 ** math.floor(math.log2(n))
    return _power_of_two_slopes(c) + _power_of_two_slopes(2 * c)[0::2][: n - c]
