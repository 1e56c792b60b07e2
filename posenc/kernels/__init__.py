"""Optional fast paths.  Nothing here is imported by ``import posenc``; Triton is imported lazily.

:func:`triton_available` says whether the Triton RoPE kernel can run for a tensor: on CUDA when
Triton imports, and on CPU tensors only under ``TRITON_INTERPRET=1`` (how CI tests it).
"""

from __future__ import annotations

import importlib.util
import os

import torch

__all__ = ["triton_available"]

# Decided once, at import, so that the dispatch rule is a constant inside torch.compile graphs.
_HAS_TRITON = importlib.util.find_spec("triton") is not None


def triton_available(device: torch.device) -> bool:
    """True when the Triton kernel can run on ``device`` here."""
    if not _HAS_TRITON:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
