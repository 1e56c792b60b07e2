"""Helpers shared by the torch functional layer (not public)."""

from __future__ import annotations

import torch

from posenc.core import exact

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_positions(name: str, positions: object) -> torch.Tensor:
    """Require an integer tensor of positions with ``|p| <= 2**31``."""
    if not isinstance(positions, torch.Tensor):
        raise TypeError(
            f"{name} must be an integer torch.Tensor, got {type(positions).__name__}; "
            f"pass e.g. torch.arange(seq_len)"
        )
    if positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
        raise TypeError(
            f"{name} must hold integers (torch.int32/int64), got dtype {positions.dtype}; "
            f"positions are indices, so build them with torch.arange or cast with .long()"
        )
    return positions


def check_position_range(name: str, positions: torch.Tensor) -> None:
    """Reject positions outside ``[-2**31, 2**31]`` where exact angles are no longer guaranteed."""
    if positions.numel() and not torch.compiler.is_compiling():
        lo, hi = int(positions.min()), int(positions.max())
        if max(-lo, hi) > exact.MAX_POSITION:
            raise ValueError(
                f"{name} must lie within [-2**31, 2**31] for exact angles, got values in [{lo}, {hi}]"
            )


def check_float_dtype(name: str, dtype: object) -> torch.dtype:
    """Require a floating torch dtype supported for encodings."""
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be one of torch.float16, torch.bfloat16, torch.float32, torch.float64; got {dtype!r}"
        )
    return dtype  # type: ignore[return-value]


def exact_sin_cos(positions: torch.Tensor, split_np) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 ``(sin, cos)`` of ``positions * frequencies`` on ``positions.device``; see core.exact."""
    pos = positions.to(torch.float64)
    split = torch.tensor(split_np, dtype=torch.float64, device=positions.device)
    with torch.autocast(device_type=pos.device.type, enabled=False):
        return exact.sin_cos(pos, split, xp=torch)
