"""T5 relative position buckets (Raffel et al. 2020), clipped relative positions (Shaw et al. 2018) and
relative distances: pure torch functions."""

from __future__ import annotations

import torch

from posenc._torch.checks import check_positions
from posenc.core import relative as core_relative

__all__ = ["clipped_relative_position", "relative_distances", "relative_position_bucket"]

_FAR = 2**62


def relative_distances(positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """``q_i - k_j`` as int64: ``(S, S_k)`` for 1-D positions, ``(B, S, S_k)`` if either is ``(B, ...)``.

    Exact whenever the difference fits int64; one that does not (positions beyond ``+-2**62``
    apart, e.g. ``q = 2**62 + 1``, ``k = -2**62``) saturates to ``2**63 - 1`` or ``-2**63``, so it
    keeps its sign and stays past every bucket threshold.
    """
    check_position_pair(positions, key_positions)
    return difference(positions.long().unsqueeze(-1), key_positions.long().unsqueeze(-2))


def check_position_pair(positions: torch.Tensor, key_positions: torch.Tensor) -> None:
    """Integer ``(S,)``/``(B, S)`` query and key positions with one batch size, on one device."""
    for name, p in (("positions", positions), ("key_positions", key_positions)):
        check_positions(name, p)
        if p.dim() not in (1, 2):
            raise ValueError(f"{name} must have shape (S,) or (B, S), got {tuple(p.shape)}")
    if positions.dim() == 2 and key_positions.dim() == 2 and positions.shape[0] != key_positions.shape[0]:
        raise ValueError(
            f"positions {tuple(positions.shape)} and key_positions {tuple(key_positions.shape)} have different batch sizes"
        )
    if positions.device != key_positions.device:
        raise ValueError(f"positions is on {positions.device} but key_positions on {key_positions.device}")


def difference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a - b`` of int64 tensors (broadcast), saturated to ``[-2**63, 2**63 - 1]`` instead of wrapping.

    Elementwise and traceable (no reads from the device).  The subtraction overflowed exactly when
    ``a`` and ``b`` have different signs and the wrapped result's sign differs from ``a``'s; the
    true difference then lies past the limit on ``a``'s side.
    """
    d = a - b
    wrapped = ((a ^ b) & (a ^ d)) < 0
    return torch.where(wrapped, torch.where(a < 0, _INT64_MIN, _INT64_MAX), d)


def difference_value(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, *, absolute: bool = False,
                     negate: bool = False) -> torch.Tensor:
    """``a - b`` of int64 tensors (broadcast) as a ``dtype`` float, right even where the integer
    difference wraps (``|a - b| >= 2**63``): one rounding where it fits int64, at most two past it.

    ``absolute``: ``|a - b|``; with ``negate`` too: ``-|a - b|``, computed as ``min - max`` so that
    a zero difference gives ``+0.0``.  Elementwise and traceable (no reads from the device).
    """
    if absolute:
        hi, lo = torch.maximum(a, b), torch.minimum(a, b)
        if negate:                                                       # lo - hi in [-(2**64 - 1), 0]
            d = lo - hi
            return d.to(dtype) - torch.where(d > 0, _TWO64, 0.0).to(dtype)
        d = hi - lo                                                      # in [0, 2**64 - 1]
        return d.to(dtype) + torch.where(d < 0, _TWO64, 0.0).to(dtype)
    if negate:
        a, b = b, a
    d = a - b
    wrapped = ((a ^ b) & (a ^ d)) < 0                                    # the true value is d + 2**64 or d - 2**64
    return d.to(dtype) + torch.where(wrapped, torch.where(a < 0, -_TWO64, _TWO64), 0.0).to(dtype)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_TWO64 = 2.0**64


def relative_position_bucket(
    relative_position: torch.Tensor,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """T5 bucket of each ``key - query`` distance (any shape, integer), exact for any distance.

    Args:
        relative_position: integer tensor of ``key_position - query_position``.
        bidirectional: half the buckets for keys after the query (encoder); else future keys share
            bucket 0 (decoder).
        num_buckets: total buckets.
        max_distance: distances from here on share the last bucket.

    Returns:
        int64 buckets, same shape.

    Examples:
        >>> relative_position_bucket(torch.tensor([-200, -16, -8, -7, -1, 0, 1, 7, 8, 16, 127, 200]))
        tensor([15, 10,  8,  7,  1,  0, 17, 23, 24, 26, 31, 31])
    """
    # traced: without core's host cache, which Dynamo would skip with a warning
    thresholds = core_relative.thresholds(num_buckets, max_distance, bidirectional,
                                          cache=not torch.compiler.is_compiling())
    return bucket_of_distances(check_positions("relative_position", relative_position), thresholds,
                               bidirectional=bidirectional)


def bucket_of_distances(relative_position: torch.Tensor, thresholds: tuple[int, int, tuple[int, ...]], *,
                        bidirectional: bool) -> torch.Tensor:
    """:func:`relative_position_bucket` of a checked integer tensor, with the bucket boundaries
    ``thresholds`` from :func:`posenc.core.relative.thresholds` computed once (a module does so at
    construction, so traced code never calls the cached host function)."""
    per_side, max_exact, thr = thresholds
    # distances past +-2**62 share the last bucket anyway; clamping keeps |rp| representable
    rp = relative_position.long().clamp(-_FAR, _FAR)
    if bidirectional:
        offset = (rp > 0).long() * per_side
        n = rp.abs()
    else:
        offset = torch.zeros_like(rp)
        n = (-rp).clamp(min=0)
    if thr and thr[-1] > _FAR:                                   # never reached by clamped distances
        thr = tuple(min(t, _FAR + 1) for t in thr)
    boundaries = torch.tensor(thr, dtype=torch.long, device=rp.device)
    far = (max_exact + torch.bucketize(n, boundaries, right=True)).clamp(max=per_side - 1)
    return offset + torch.where(n < max_exact, n, far)


def clipped_relative_position(
    relative_position: torch.Tensor,
    *,
    max_distance: int,
    min_distance: int | None = None,
    symmetric: bool = False,
) -> torch.Tensor:
    """Index of each ``key - query`` distance into a learned table of clipped relative positions.

    Shaw, Uszkoreit and Vaswani, "Self-Attention with Relative Position Representations" (2018): every
    distance beyond the window shares the embedding of the window's edge, so the table has one row per
    distance in ``[min_distance, max_distance]``.  The index is ``clip(d, min_distance, max_distance)
    - min_distance``; with ``symmetric`` a distance and its negation share a row, ``|clip(d, ...)|``.

    Args:
        relative_position: integer tensor of ``key_position - query_position`` (any shape).
        max_distance: the largest distance with its own row (``K`` in the paper).
        min_distance: the most negative one; ``-max_distance`` (the paper's window) when omitted.
            Conformer-style audio encoders (Phi-4-multimodal's) use ``-M`` and ``M - 1``.
        symmetric: index by the clipped distance's magnitude.

    Returns:
        int64 indices, the shape of ``relative_position``: in ``[0, max_distance - min_distance]``, or
        ``[0, max(max_distance, -min_distance)]`` with ``symmetric``.

    Examples:
        >>> clipped_relative_position(torch.tensor([-9, -2, 0, 1, 2, 9]), max_distance=2)
        tensor([0, 0, 2, 3, 4, 4])
    """
    for name, value in (("max_distance", max_distance), ("min_distance", min_distance)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be a bool, got {symmetric!r}")
    if max_distance < 0:
        raise ValueError(f"max_distance must be >= 0 (the largest distance with its own row), got {max_distance}")
    low = -max_distance if min_distance is None else min_distance
    if low > 0:
        raise ValueError(f"min_distance must be <= 0 (the most negative distance with its own row), got {low}")
    clipped = check_positions("relative_position", relative_position).long().clamp(low, max_distance)
    return clipped.abs() if symmetric else clipped - low
