"""Helpers shared by the torch functional layer (not public)."""

from __future__ import annotations

import torch

from posenc import _validate
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


def check_position_args(positions: torch.Tensor | None, offset: object, length: int, batch: int | None) -> int:
    """Check the ``positions``/``offset`` pair of a call on a sequence of ``length`` tokens.

    ``positions`` (if given) must be integers of shape ``(S,)``, or ``(B, S)`` with ``B`` 1 or
    ``batch`` when the input has a batch axis (``batch`` not None); it excludes a nonzero
    ``offset``.  Returns the validated ``offset``.
    """
    offset = _validate.check_int("offset", offset)
    if positions is None:
        return offset
    check_positions("positions", positions)
    batched_ok = batch is not None and positions.dim() == 2 and positions.shape[0] in (1, batch)
    if positions.shape[-1] != length or not (positions.dim() == 1 or batched_ok):
        allowed = "(S,)" if batch is None else f"(S,) or (B, S) with B={batch}"
        raise ValueError(f"positions must have shape {allowed}, S={length}; got {tuple(positions.shape)}")
    if offset:
        raise ValueError("pass either positions or offset, not both (add the offset to positions)")
    return offset


def check_embeddings(x: object, dim: int) -> None:
    """``x`` must be floating embeddings of shape ``(B, S, dim)`` or ``(S, dim)``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(
            f"x must be a floating tensor, got dtype {x.dtype}; embed token ids first "
            f"(e.g. nn.Embedding) or cast with x.float()"
        )
    if x.dim() not in (2, 3) or x.shape[-1] != dim:
        raise ValueError(
            f"x must have shape (B, S, {dim}) or (S, {dim}), got {tuple(x.shape)}; the last dimension must equal dim={dim}"
        )


def check_float_dtype(name: str, dtype: object) -> torch.dtype:
    """Require a floating torch dtype supported for encodings."""
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be one of torch.float16, torch.bfloat16, torch.float32, torch.float64; got {dtype!r}"
        )
    return dtype  # type: ignore[return-value]


def exact_sin_cos(positions: torch.Tensor, turns) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 ``(sin, cos)`` of ``positions (...) * frequencies`` -> ``(..., n)``, see core.exact.

    ``turns`` is the ``(4, n)`` split of :func:`posenc.core.exact.turns_split`, as a NumPy array or
    a float64 tensor (e.g. a module buffer) on ``positions.device``.  Autocast is off: the angles
    never drop below float64, whatever the ambient precision.
    """
    if not isinstance(turns, torch.Tensor):
        turns = torch.tensor(turns, dtype=torch.float64, device=positions.device)
    with torch.autocast(device_type=positions.device.type, enabled=False):
        return exact.sin_cos(positions.to(torch.float64), turns, xp=torch)
