"""Axial (N-axis) rotary embeddings as pure functions: grid positions, exact cos/sin rows, rotation.

A token carries one integer coordinate per axis, ``positions (..., S, n_axes)``.  The rotated
features of a head split into one block per axis (``axes_dims``); block ``a`` rotates by
``p_a * base^(-2i / axes_dims[a])``.  See :class:`posenc.nn.axial_rotary.AxialRotaryEmbedding` for
the module, conventions and references.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from posenc import _validate
from posenc._deprecate import UNSET
from posenc._torch.angles import check_float64_available, exact_cos_sin, has_float64
from posenc._torch.checks import (
    check_float_dtype,
    check_float_tensor,
    check_inplace,
    check_position_range,
    check_positions,
)
from posenc._torch.engine_choice import engine_from_backend
from posenc.core import axial as core_axial
from posenc.core import exact as core_exact
from posenc.core.rope import ROPE_LAYOUTS
from posenc.functional.rope import apply_rope

__all__ = ["apply_axial_rope", "axial_cos_sin", "grid_positions"]


def grid_positions(
    grid_shape: Sequence[int], *, prefix_tokens: int = 0, device: torch.device | str | None = None
) -> torch.Tensor:
    """Integer coordinates of a row-major grid, after ``prefix_tokens`` rows of zeros.

    Row ``prefix_tokens + t`` holds the coordinates of grid cell ``t`` in row-major (C) order, one
    column per axis of ``grid_shape``.  Prefix tokens (a ViT's class/register tokens) sit at the
    origin, where every rotation is the identity: they are not rotated.

    For FLUX-style text + image sequences, give text tokens all-zero rows and image tokens
    ``(0, h, w)``: ``torch.cat([torch.zeros(T, 3, dtype=torch.long), F.pad(grid_positions((H, W)),
    (1, 0))])`` (text first, as FLUX concatenates them).

    Args:
        grid_shape: sizes of the axes, e.g. ``(H, W)`` patches or ``(T, H, W)``.
        prefix_tokens: zero rows before the grid.
        device: device of the result.

    Returns:
        ``(prefix_tokens + prod(grid_shape), len(grid_shape))`` int64.

    Examples:
        >>> grid_positions((2, 3), prefix_tokens=1).tolist()
        [[0, 0], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    """
    if isinstance(grid_shape, (str, bytes)) or not isinstance(grid_shape, Sequence) or not len(grid_shape):
        raise TypeError(f"grid_shape must be a non-empty sequence of ints, e.g. (14, 14); got {grid_shape!r}")
    sizes = [_validate.check_int(f"grid_shape[{a}]", s, minimum=1) for a, s in enumerate(grid_shape)]
    prefix_tokens = _validate.check_int("prefix_tokens", prefix_tokens, minimum=0)
    axes = torch.meshgrid(*(torch.arange(s, device=device) for s in sizes), indexing="ij")
    grid = torch.stack(axes, -1).reshape(math.prod(sizes), len(sizes))          # (prod, n)
    if prefix_tokens:
        grid = torch.cat([grid.new_zeros(prefix_tokens, len(sizes)), grid])      # (prefix + prod, n)
    return grid


def check_axial_positions(name: str, positions: object, n_axes: int) -> torch.Tensor:
    """An integer tensor ``(..., n_axes)`` with at least one token axis, as int32/int64."""
    positions = check_positions(name, positions)
    if positions.dim() < 2 or positions.shape[-1] != n_axes:
        raise ValueError(
            f"{name} must have shape (S, {n_axes}) or (B, S, {n_axes}): one integer coordinate per axis in the "
            f"last dim; got {tuple(positions.shape)} (build them with grid_positions)"
        )
    return positions


def axial_cos_sin(
    positions: torch.Tensor,
    axes_dims: Sequence[int],
    *,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact ``cos``/``sin`` rows of axial RoPE, pairs in block order.

    Pair ``j`` of block ``a`` at coordinates ``p`` has angle ``p_a * base^(-2i / axes_dims[a])``
    (``i`` counted inside the block); the angles are exact (see :mod:`posenc.core.exact`) and each
    value is rounded once to ``dtype``.  The rows are ordinary RoPE rows: pass them to
    :func:`apply_axial_rope` (or, for the interleaved layout, to :func:`posenc.functional.rope.apply_rope`).

    Args:
        positions: integer coordinates ``(..., n_axes)``, e.g. ``(S, n_axes)`` from
            :func:`grid_positions` or ``(B, S, n_axes)``.
        axes_dims: features per axis, even, e.g. ``(16, 56, 56)`` (FLUX).
        base: frequency base (``theta``).
        dtype: output dtype.

    Returns:
        ``(cos, sin)``, each ``positions.shape[:-1] + (sum(axes_dims)/2,)``.

    Examples:
        >>> cos, sin = axial_cos_sin(torch.tensor([[1, 2]]), (2, 2))
        >>> cos, sin                              # cos 1, cos 2; sin 1, sin 2
        (tensor([[ 0.5403, -0.4161]]), tensor([[0.8415, 0.9093]]))
    """
    dims = core_axial.check_axes_dims(axes_dims)
    positions = check_axial_positions("positions", positions, len(dims))
    check_position_range("positions", positions)
    check_float_dtype("dtype", dtype)
    freqs = core_axial.axial_frequencies(dims, base)
    check_float64_available("dtype", dtype, positions.device)
    split = core_exact.turns_split(freqs)
    # (a host array on a device without float64: each axis's digits are made from it on the host)
    turns = torch.from_numpy(split.copy()).to(positions.device) if has_float64(positions.device) else split
    return axial_exact_cos_sin(positions, turns, dims, dtype)


def axial_exact_cos_sin(positions: torch.Tensor, turns, axes_dims: tuple[int, ...], dtype: torch.dtype,
                        digits: torch.Tensor | None = None):
    """Exact rows from checked ``positions (..., n)`` and the split frequencies ``turns (4, h)``
    (a tensor, or a host array), with their float32 ``digits (3, 8, h)`` for a device without float64."""
    cos, sin, start = [], [], 0
    for a, d in enumerate(axes_dims):
        part = None if digits is None else digits[..., start : start + d // 2]
        c, s = exact_cos_sin(positions[..., a], turns[:, start : start + d // 2], 1.0, dtype, part)   # (..., d/2)
        cos.append(c)
        sin.append(s)
        start += d // 2
    if len(axes_dims) == 1:
        return cos[0], sin[0]
    return torch.cat(cos, -1), torch.cat(sin, -1)                                           # (..., h)


def half_index(axes_dims: Sequence[int], head_dim: int, device: torch.device | None = None):
    """``(perm, inverse)`` feature indices ``(head_dim,)`` for the per-block half layout (see
    :func:`posenc.core.axial.half_permutation`); features past ``sum(axes_dims)`` stay in place."""
    perm = torch.from_numpy(core_axial.half_permutation(axes_dims))
    perm = torch.cat([perm, torch.arange(perm.numel(), head_dim)]).to(device)
    return perm, torch.argsort(perm)


def apply_axial_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    axes_dims: Sequence[int] | None = None,
    layout: str = "interleaved",
    inplace: bool = False,
    engine: str = "auto",
    backend: str = UNSET,
) -> torch.Tensor:
    """Rotate the first ``2 * cos.shape[-1]`` features of ``x`` by axial cos/sin rows.

    With ``layout="interleaved"`` (FLUX, EVA/timm) the axis blocks concatenate into one interleaved
    row per token, so this is :func:`posenc.functional.rope.apply_rope`.  With ``layout="half"``
    every block pairs ``(i, i + d_a/2)``; that needs ``axes_dims``.

    Args:
        x: ``(..., D)``, e.g. ``(B, H, S, D)``; features past ``sum(axes_dims)`` pass through.
        cos, sin: rows from :func:`axial_cos_sin`, broadcasting like :func:`apply_rope`'s
            (``(S, h)`` for ``(B, H, S, D)``, ``(S, 1, h)`` for ``(B, S, H, D)``).
        axes_dims: features per axis (needed for ``layout="half"``).
        layout: ``"interleaved"`` or ``"half"``.
        inplace: rotate ``x`` itself.
        engine: ``"auto"``, ``"torch"`` or ``"triton"``, as for :func:`apply_rope`.
        backend: the old name of ``engine`` (deprecated; it still works for now).

    Returns:
        The rotated tensor, shape and dtype of ``x``.

    Examples:
        >>> cos, sin = axial_cos_sin(torch.tensor([[0, 1]]), (2, 2))
        >>> apply_axial_rope(torch.tensor([[1.0, 0.0, 1.0, 0.0]]), cos, sin)
        tensor([[1.0000, 0.0000, 0.5403, 0.8415]])
    """
    if backend is not UNSET:                 # the old name of engine=
        engine = engine_from_backend("apply_axial_rope", backend, engine)
    _validate.check_choice("layout", layout, ROPE_LAYOUTS)
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if check_float_tensor(name, t).dim() == 0:
            raise ValueError(f"{name} must have a feature axis (..., {'D' if name == 'x' else 'dim/2'}), got a 0-d tensor")
    if layout == "interleaved":
        if axes_dims is not None and 2 * cos.shape[-1] != sum(core_axial.check_axes_dims(axes_dims)):
            raise ValueError(
                f"cos has {cos.shape[-1]} pairs but axes_dims={tuple(axes_dims)} has {sum(axes_dims) // 2}; build cos "
                f"and sin with axial_cos_sin(positions, axes_dims) for these axes_dims"
            )
        return apply_rope(x, cos, sin, layout="interleaved", inplace=inplace, engine=engine)
    if axes_dims is None:
        raise ValueError("layout='half' pairs features inside each axis block: pass axes_dims=")
    dims = core_axial.check_axes_dims(axes_dims)
    if 2 * cos.shape[-1] != sum(dims):
        raise ValueError(
            f"cos has {cos.shape[-1]} pairs but axes_dims={dims} has {sum(dims) // 2}; build cos and sin with "
            f"axial_cos_sin(positions, axes_dims) for these axes_dims"
        )
    if sum(dims) > x.shape[-1]:
        raise ValueError(
            f"sum(axes_dims) = {sum(dims)} exceeds x's feature dim {x.shape[-1]}; the axes share one head: pass "
            f"axes_dims summing to at most {x.shape[-1]}"
        )
    _validate.check_bool("inplace", inplace)
    if inplace:
        check_inplace("x", x)
    perm, inverse = half_index(dims, x.shape[-1], x.device)
    rotated = apply_rope(x.index_select(-1, perm), cos, sin, layout="half", engine=engine).index_select(-1, inverse)
    return x.copy_(rotated) if inplace else rotated
