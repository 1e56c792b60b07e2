"""Resizing learned position tables to a new sequence length or image grid (pure torch).

A learned absolute table trained at one resolution is reused at another by resampling its rows as a
signal: a 2-D table of ``H x W`` patch positions (ViT, Dosovitskiy et al. 2021, section 3.2;
DeiT, Touvron et al. 2021) as an image of ``C`` channels, a 1-D table of ``N`` positions as a curve.
Rows that are not on the grid (class or register tokens) are kept as they are and stay first.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from posenc import _validate
from posenc._torch.angles import _no_autocast, working_dtype
from posenc._torch.checks import check_float_tensor

__all__ = ["RESIZE_MODES_1D", "RESIZE_MODES_2D", "resize_position_embedding"]

#: Interpolation modes of a 2-D grid (``new_size=(H, W)``), named as in ``torch.nn.functional.interpolate``.
RESIZE_MODES_2D = ("bicubic", "bilinear", "nearest", "nearest-exact", "area")
#: Interpolation modes of a 1-D table (``new_size`` an int): the same kernels along one axis.
RESIZE_MODES_1D = ("cubic", "linear", "nearest", "nearest-exact", "area")

_ON_ONE_AXIS = {"cubic": "bicubic", "linear": "bilinear"}      # 1-D name -> the kernel on a (1, N) grid
_SMOOTH = ("bicubic", "bilinear")                              # the modes with an anti-aliasing filter


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _grid_size(name: str, value: object) -> tuple[int, int]:
    """A 2-D size ``(H, W)``: a tuple, list or ``torch.Size`` of two ints >= 1."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(
            f"{name} must be an int (a 1-D table) or a pair (H, W) (a 2-D grid), got {value!r}; "
            f"pass e.g. {name}=(16, 16)"
        )
    return (_validate.check_int(f"{name}[0]", value[0], minimum=1),
            _validate.check_int(f"{name}[1]", value[1], minimum=1))


def resize_position_embedding(
    table: torch.Tensor,
    new_size: int | tuple[int, int],
    *,
    old_size: int | tuple[int, int] | None = None,
    prefix_tokens: int = 1,
    mode: str | None = None,
    antialias: bool = True,
) -> torch.Tensor:
    """Resample a learned position table to a new length (1-D) or grid (2-D).

    The first ``prefix_tokens`` rows (a class token, register tokens, ...) are returned unchanged and
    first; the remaining ``H * W`` rows, read row-major as an ``H x W`` grid of ``C`` channels, are
    resized with ``torch.nn.functional.interpolate(size=new_size, mode=mode, antialias=antialias,
    align_corners=False)``.  A 1-D table (``new_size`` an int) is the same resize of a ``1 x N`` grid
    along its one axis, so its modes are the 2-D kernels under 1-D names (``"cubic"``, ``"linear"``);
    unlike 1-D ``interpolate``, they take ``antialias`` too.

    For 2-D grids this equals timm's ``resample_abs_pos_embed(table, new_size, old_size,
    num_prefix_tokens=prefix_tokens, interpolation=mode, antialias=antialias)``: float32, float16
    and bfloat16 tables are resized in float32 and rounded once to their dtype, bit for bit as timm
    does.  Float64 tables are resized in float64 (timm rounds them through float32).  Autocast is off
    inside.  The result is differentiable with respect to ``table`` (fine-tuning at a new resolution
    trains the original table), on any device.  When the grid does not change the table itself is
    returned, as timm does.

    Args:
        table: the learned table, ``(N, C)`` or ``(1, N, C)``, ``N = prefix_tokens + H * W``.
        new_size: ``(H', W')`` for a 2-D grid, or an int ``N'`` (rows after the prefix) for a 1-D table.
        old_size: the current grid ``(H, W)`` (int ``N - prefix_tokens`` for a 1-D table).  ``None``
            reads a 2-D grid as a square, which needs ``N - prefix_tokens`` to be a perfect square.
        prefix_tokens: leading rows that are not on the grid (timm's ``num_prefix_tokens``; 1 is a
            ViT class token).  Pass 0 for a table that is all grid, like a plain sequence table.
        mode: 2-D: ``"bicubic"`` (default, as timm), ``"bilinear"``, ``"nearest"``, ``"nearest-exact"``,
            ``"area"``.  1-D: ``"cubic"`` (default), ``"linear"``, ``"nearest"``, ``"nearest-exact"``,
            ``"area"``.  ``"cubic"`` and ``"bicubic"`` are Keys' cubic convolution (``a = -0.75``;
            ``a = -0.5`` with ``antialias``, as Pillow).
        antialias: low-pass filter when shrinking (Pillow's resampling), for the cubic and linear
            modes only: pass ``antialias=False`` with ``"nearest"``, ``"nearest-exact"`` or ``"area"``.

    Shape:
        ``table``: ``(N, C)`` or ``(1, N, C)``; output: the same rank, ``N' = prefix_tokens + H' * W'``
        rows (``prefix_tokens + new_size`` in 1-D), same dtype and device.

    Returns:
        The resized table.

    Raises:
        TypeError: if ``table`` is not a floating tensor, a size is not an int or a pair of ints, or
            ``antialias`` is not a bool.
        ValueError: if ``table`` has another shape, a size is below 1, ``old_size`` does not match
            the table, ``old_size`` is missing for a non-square grid, ``mode`` is unknown for the
            table's rank, or ``antialias=True`` is asked of a mode without a filter.

    Examples:
        >>> table = torch.arange(4.0).view(4, 1)            # a ramp: positions 0..3, one feature
        >>> resize_position_embedding(table, 8, prefix_tokens=0, mode="linear", antialias=False).view(-1)
        tensor([0.0000, 0.2500, 0.7500, 1.2500, 1.7500, 2.2500, 2.7500, 3.0000])
        >>> vit = torch.randn(1, 1 + 14 * 14, 8)            # class token + a 14 x 14 grid
        >>> resize_position_embedding(vit, (24, 24)).shape
        torch.Size([1, 577, 8])

    References:
        Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021, section 3.2 (2-D
        interpolation of the pre-trained position embeddings).  Keys, "Cubic convolution
        interpolation for digital image processing", IEEE TASSP 1981.
    """
    check_float_tensor("table", table)
    if table.dim() not in (2, 3) or (table.dim() == 3 and table.shape[0] != 1):
        raise ValueError(
            f"table must have shape (N, C) or (1, N, C), got {tuple(table.shape)}; resize one table at a time "
            f"(e.g. pass model.pos_embed, not a batch of tables)"
        )
    num_rows, channels = table.shape[-2], table.shape[-1]
    prefix = _validate.check_int("prefix_tokens", prefix_tokens, minimum=0)
    grid_rows = num_rows - prefix
    if grid_rows < 1:
        raise ValueError(
            f"prefix_tokens={prefix} leaves no grid rows in a table of N={num_rows} rows; "
            f"pass prefix_tokens < {num_rows} (0 when every row is a position)"
        )

    if _is_int(new_size):                                            # 1-D: a (1, N) grid
        modes = RESIZE_MODES_1D
        new = (1, _validate.check_int("new_size", new_size, minimum=1))
        if old_size is None:
            old = (1, grid_rows)
        elif _is_int(old_size):
            old = (1, _validate.check_int("old_size", old_size, minimum=1))
        else:
            raise TypeError(f"old_size must be an int like new_size={new_size} (a 1-D table), got {old_size!r}")
        if old[1] != grid_rows:
            raise ValueError(
                f"old_size={old[1]} does not match the table: N={num_rows} rows minus prefix_tokens={prefix} "
                f"leaves {grid_rows}; pass old_size={grid_rows} (or fix prefix_tokens)"
            )
    else:
        modes = RESIZE_MODES_2D
        new = _grid_size("new_size", new_size)
        if old_size is None:
            side = math.isqrt(grid_rows)
            if side * side != grid_rows:
                raise ValueError(
                    f"the grid part of the table has {grid_rows} rows (N={num_rows} minus prefix_tokens={prefix}), "
                    f"not a square; pass old_size=(H, W) with H * W = {grid_rows} (or fix prefix_tokens)"
                )
            old = (side, side)
        else:
            if _is_int(old_size):
                raise TypeError(f"old_size must be a pair (H, W) like new_size={tuple(new)}, got {old_size!r}")
            old = _grid_size("old_size", old_size)
            if old[0] * old[1] != grid_rows:
                raise ValueError(
                    f"old_size={old} holds {old[0] * old[1]} positions but the table has {grid_rows} grid rows "
                    f"(N={num_rows} minus prefix_tokens={prefix}); pass old_size with H * W = {grid_rows}"
                )
    if mode is None:
        mode = modes[0]
    if mode in (RESIZE_MODES_1D if modes is RESIZE_MODES_2D else RESIZE_MODES_2D) and mode not in modes:
        rank = "1-D table (new_size an int)" if modes is RESIZE_MODES_1D else "2-D grid (new_size a pair)"
        raise ValueError(f"mode={mode!r} is not a mode of a {rank}; pass one of {', '.join(map(repr, modes))}")
    _validate.check_choice("mode", mode, modes)
    _validate.check_bool("antialias", antialias)
    kernel = _ON_ONE_AXIS.get(mode, mode)
    if antialias and kernel not in _SMOOTH:
        raise ValueError(
            f"antialias=True applies to the cubic and linear modes only, not mode={mode!r}; pass antialias=False"
        )

    if old == new and not torch.compiler.is_compiling():
        return table                                                 # nothing to resample (as timm)
    (h, w), (new_h, new_w) = old, new
    if channels == 0:                                                # nothing to interpolate: an empty grid
        grid = table.new_empty(new_h * new_w, 0)
        if table.dim() == 3:
            grid = grid.unsqueeze(0)
        return torch.cat([table[..., :prefix, :], grid], dim=-2)
    with _no_autocast(table.device):
        grid = table[..., prefix:, :].to(working_dtype(table.dtype))            # (..., H * W, C)
        grid = grid.reshape(1, h, w, channels).permute(0, 3, 1, 2)               # (1, C, H, W)
        grid = F.interpolate(
            grid, size=(new_h, new_w), mode=kernel, antialias=antialias,
            align_corners=False if kernel in _SMOOTH else None,
        )                                                                        # (1, C, H', W')
        grid = grid.permute(0, 2, 3, 1).reshape(new_h * new_w, channels)        # (H' * W', C)
        grid = grid.to(table.dtype)
    if table.dim() == 3:
        grid = grid.unsqueeze(0)                                                 # (1, H' * W', C)
    return torch.cat([table[..., :prefix, :], grid], dim=-2) if prefix else grid
