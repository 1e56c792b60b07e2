"""T5's bucketed relative positions (framework-free).

Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer" (JMLR), section 2.1, as implemented in Mesh TensorFlow and Hugging Face's
``T5Attention._relative_position_bucket``.  With ``relative_position = key - query``:

- bidirectional: half the buckets are for keys after the query (offset ``num_buckets / 2``), and
  ``n = |relative_position|``; causal: ``n = max(-relative_position, 0)`` (future keys -> bucket 0);
- ``n < max_exact = buckets / 2`` gets its own bucket ``n``; larger ``n`` is bucketed
  logarithmically, ``max_exact + floor(ln(n / max_exact) / ln(max_distance / max_exact) *
  (buckets - max_exact))``, capped at ``buckets - 1``.

posenc turns the logarithmic part into exact integer thresholds (the smallest ``n`` of each bucket),
found here in integer arithmetic, so the torch side buckets with an exact search instead of a
float32 logarithm.
"""

from __future__ import annotations

import functools
import math

from posenc import _validate


def check_bucket_args(num_buckets: int, max_distance: int, bidirectional: bool) -> tuple[int, int, bool]:
    num_buckets = _validate.check_int("num_buckets", num_buckets, minimum=2)
    max_distance = _validate.check_int("max_distance", max_distance, minimum=1)
    _validate.check_bool("bidirectional", bidirectional)
    per_side = num_buckets // 2 if bidirectional else num_buckets
    if per_side < 2:
        raise ValueError(
            f"num_buckets={num_buckets} leaves {per_side} bucket(s) per direction; pass num_buckets >= "
            f"{4 if bidirectional else 2}"
        )
    if max_distance <= per_side // 2:
        raise ValueError(
            f"max_distance must exceed the exact range num_buckets{'/2' if bidirectional else ''}/2 = {per_side // 2}, "
            f"got {max_distance}"
        )
    return num_buckets, max_distance, bidirectional


def thresholds(num_buckets: int, max_distance: int, bidirectional: bool, *,
               cache: bool = True) -> tuple[int, int, tuple[int, ...]]:
    """``(per_side, max_exact, thr)``: ``n >= max_exact`` lands in ``max_exact + #{t in thr: t <= n}``.

    ``thr[k - 1]`` is the smallest ``n`` whose logarithmic bucket offset is at least ``k``.  The
    arguments are validated on every call (the cache below would let ``32.0`` pass as ``32``).
    ``cache=False`` computes them afresh, for code that ``torch.compile`` traces (Dynamo skips a
    ``functools.lru_cache`` wrapper, warning that the result may be silently wrong).
    """
    checked = check_bucket_args(num_buckets, max_distance, bidirectional)
    return _cached_thresholds(*checked) if cache else _thresholds(*checked)


def _thresholds(num_buckets: int, max_distance: int, bidirectional: bool) -> tuple[int, int, tuple[int, ...]]:
    per_side = num_buckets // 2 if bidirectional else num_buckets
    max_exact = per_side // 2
    span = per_side - max_exact
    out = []
    for k in range(1, span):
        # smallest n with ln(n / max_exact) / ln(max_distance / max_exact) * span >= k, that is
        # (n / max_exact)^span >= (max_distance / max_exact)^k: exact in integers
        def reaches(n: int, k: int = k) -> bool:
            return n**span * max_exact**k >= max_exact**span * max_distance**k

        try:
            guess = math.floor(max_exact * (max_distance / max_exact) ** (k / span)) - 1          # a guess below
        except OverflowError:                                          # a max_distance past float64
            guess = max_exact
        out.append(_least(reaches, max_exact, guess))
    return per_side, max_exact, tuple(out)


_cached_thresholds = functools.lru_cache(maxsize=64)(_thresholds)


def _least(reaches, lowest: int, guess: int) -> int:
    """The smallest ``n >= lowest`` with ``reaches(n)`` (monotone), searched from ``guess``: galloping
    steps bracket it, then bisection (a float guess can be off by far more than a few units)."""
    hi, step = max(guess, lowest), 1
    while not reaches(hi):
        hi, step = hi + step, 2 * step
    lo, step = hi - 1, 1                                   # lo: below ``lowest`` or not reaching, once done
    while lo >= lowest and reaches(lo):
        hi, lo, step = lo, lo - step, 2 * step
    lo = max(lo, lowest - 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        hi, lo = (mid, lo) if reaches(mid) else (hi, mid)
    return hi


def relative_position_bucket(relative_position: int, *, bidirectional: bool = True, num_buckets: int = 32,
                             max_distance: int = 128) -> int:
    """Bucket of one relative position ``key - query`` (scalar reference).

    Examples:
        >>> [relative_position_bucket(r) for r in (-200, -16, -1, 0, 1, 16, 200)]
        [15, 10, 1, 0, 17, 26, 31]
    """
    per_side, max_exact, thr = thresholds(num_buckets, max_distance, bidirectional)
    rp = _validate.check_int("relative_position", relative_position)
    offset = per_side if bidirectional and rp > 0 else 0
    n = abs(rp) if bidirectional else max(-rp, 0)
    if n < max_exact:
        return offset + n
    return offset + min(max_exact + sum(1 for t in thr if t <= n), per_side - 1)
