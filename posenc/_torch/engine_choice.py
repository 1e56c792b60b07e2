"""The one engine decision for rotary embeddings: the torch engine or the Triton kernel (not public).

A public call resolves its engine here, once, and calls the engine it gets; nothing beneath it
decides again.  ``engine="torch"`` never reaches the kernel; ``engine="triton"`` raises when the
kernel cannot take the call; ``"auto"`` takes the kernel for CUDA tensors it supports.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from posenc import _validate
from posenc._deprecate import renamed

#: ``"auto"``: the Triton kernel for CUDA tensors when Triton imports and the kernel takes the case
#: (4-D q/k with the sequence on axis 1 or 2, float16/bfloat16/float32), else the torch engine.
ROPE_ENGINES = ("auto", "torch", "triton")

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Decided once, at import, so that the dispatch rule is a constant inside torch.compile graphs.
_HAS_TRITON = importlib.util.find_spec("triton") is not None


def triton_available(device: torch.device) -> bool:
    """True when the Triton kernel can run on ``device`` here: CUDA tensors when Triton imports,
    CPU tensors only under ``TRITON_INTERPRET=1``."""
    if not _HAS_TRITON:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


def check_rope_engine(engine: object) -> str:
    """``engine`` if it is one of :data:`ROPE_ENGINES`, else ``ValueError`` listing them."""
    return _validate.check_choice("engine", engine, ROPE_ENGINES)


def engine_from_backend(where: str, backend: Any, engine: Any) -> Any:
    """The ``engine=`` of a call of ``where`` that passed the keyword's old name, ``backend=`` (deprecated):
    a ``DeprecationWarning`` (none while tracing), or ``TypeError`` if both were given.  Callers test
    ``backend is not UNSET`` first, so a call with the new name pays nothing."""
    return renamed(where, "backend", "engine", backend, engine, "auto", tracing=torch.compiler.is_compiling())


def kernel_limits(x: torch.Tensor, seq_dim: int | None) -> str | None:
    """Why the Triton kernel cannot rotate ``x`` with sequence axis ``seq_dim`` (None if it can)."""
    if x.dim() != 4:
        return f"x must be 4-D (B, H, S, D) or (B, S, H, D), got {x.dim()}-D"
    if seq_dim not in (1, 2):
        return "the sequence axis must be 1 or 2 of a 4-D tensor"
    if x.dtype not in _KERNEL_DTYPES:
        return f"dtype {x.dtype} is not supported by the kernel (float16, bfloat16, float32)"
    return None


def auto_device(x: torch.Tensor) -> bool:
    """Whether ``"auto"`` considers the kernel for ``x``: CUDA tensors."""
    return x.is_cuda


def kernel_possible(engine: str, x: torch.Tensor) -> bool:
    """Whether :func:`resolve_rope_engine` may pick the kernel for ``x`` (so that callers compute
    the kernel's limits only then): never for ``"torch"``, for ``"auto"`` only on CUDA."""
    return engine == "triton" or (engine == "auto" and auto_device(x))


def resolve_rope_engine(engine: str, x: torch.Tensor, why_not: str | None) -> str:
    """``"torch"`` or ``"triton"`` for a call on ``x``; ``why_not`` says why the kernel cannot take it.

    ``engine`` is already checked.  The rule is deterministic and reads nothing from the device.
    """
    if engine == "torch":
        return "torch"
    if engine == "triton":
        if not triton_available(x.device):
            raise ValueError(
                "engine='triton' needs Triton and a CUDA tensor (CPU tensors only with TRITON_INTERPRET=1); "
                "use engine='torch' or 'auto'"
            )
        if why_not is not None:
            raise ValueError(f"engine='triton' does not support this case: {why_not}; use engine='torch' or 'auto'")
        return "triton"
    return "triton" if auto_device(x) and why_not is None and triton_available(x.device) else "torch"
