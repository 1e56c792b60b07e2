"""Engines: for each rotary operation, a torch engine and a Triton engine behind one signature.

``import posenc`` imports none of them.  The operations, and the modules of their two engines:

- ``rope_qk``: rotate queries and keys by the rows of ``(P, d/2)`` cos/sin tables for ``positions``
  (``(S,)``/``(B, S)``) or ``offset + arange(S)``, or a packed batch (``cu_seqlens``):
  :mod:`~posenc.kernels.torch_rope` and :mod:`~posenc.kernels.triton_rope`, and, for
  ``rounding="model"`` (rounded as a model's eager code rounds), :mod:`~posenc.kernels.torch_mix`;
- ``rope_and_cache``: rotate q, and write the rotated k and v into a contiguous or paged KV cache:
  :mod:`~posenc.kernels.torch_cache` and :mod:`~posenc.kernels.triton_cache`;
- ``rms_norm_rope_qk``: the per-head (or per-token) RMSNorm of q and k followed by the rotation:
  :mod:`~posenc.kernels.torch_norm_rope` and :mod:`~posenc.kernels.triton_norm_rope`.

Each engine module defines the operation under its name, a one-shot call with keyword arguments,
and ``prepare(...)``: the eager call specialised once for calls with the same shapes, strides,
dtypes and settings, which a public call keeps as its plan (:mod:`posenc._torch.plans`).  The torch
engines are plain torch (any device; differentiable and traceable) and stay beside each kernel as its
reference; the Triton engines run on CUDA tensors (CPU tensors under ``TRITON_INTERPRET=1``).

Arguments arrive checked, and the engine is chosen once, by the public functions of
:mod:`posenc.functional` and the modules of :mod:`posenc.nn`: nothing in this package validates or
decides again.  The tables are float32 ``cos``/``sin`` views (any strides), or a table in its packed
form (:func:`~posenc.kernels.torch_rope.pack_tables`, the one form ``RotaryEmbedding`` keeps).

:func:`triton_available` says whether the Triton kernels can run for a tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from posenc._torch.engine_choice import triton_available
from posenc.kernels import torch_rope

__all__ = ["ENGINES", "OPS", "engine", "rope_engine", "triton_available"]

ENGINES = ("torch", "triton")
OPS = ("rope_qk", "rope_and_cache", "rms_norm_rope_qk")


def engine(op: str, name: str) -> ModuleType:
    """The module of engine ``name`` (``"torch"`` or ``"triton"``) for operation ``op`` (one of
    :data:`OPS`): it defines ``op`` and ``prepare``.  Traceable: the modules are imported with import
    statements, which ``torch.compile`` can follow, and the Triton ones only on first use."""
    if name == "torch":
        if op == "rope_qk":
            return torch_rope
        if op == "rope_and_cache":
            from posenc.kernels import torch_cache

            return torch_cache
        if op == "rms_norm_rope_qk":
            from posenc.kernels import torch_norm_rope

            return torch_norm_rope
    elif name == "triton":
        if op == "rope_qk":
            from posenc.kernels import triton_rope

            return triton_rope
        if op == "rope_and_cache":
            from posenc.kernels import triton_cache

            return triton_cache
        if op == "rms_norm_rope_qk":
            from posenc.kernels import triton_norm_rope

            return triton_norm_rope
    else:
        raise ValueError(f"engine must be one of {ENGINES}, got {name!r}")
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


def rope_engine(name: str) -> Callable:
    """The one-shot ``rope_qk`` of engine ``name``."""
    return engine("rope_qk", name).rope_qk
