"""Rotation engines behind one keyword-only interface.  ``import posenc`` imports none of them.

Each engine module defines ``rope_qk(q, k, *, cos, sin, positions, offset, layout, seq_dim,
inplace, packed=None) -> (q_out, k_out)``: rotate queries and keys by the rows of ``(P, d/2)`` float
tables (``cos``/``sin``, or both packed in one table by ``torch_rope.pack_tables``) for
``positions`` (``(S,)``/``(B, S)``) or ``offset + arange(S)``.  Arguments arrive checked: the public
functions in :mod:`posenc.functional` and :mod:`posenc.nn` validate them and pick the engine once.

- :mod:`posenc.kernels.torch_rope`: pure torch, any device; cache-blocked on large tensors, a
  few calls on small ones (decode steps); differentiable and traceable.
- :mod:`posenc.kernels.triton_rope`: the fused Triton kernel, one launch for q and k (imported on
  first use; CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``).

:func:`triton_available` says whether the Triton kernel can run for a tensor.
"""

from __future__ import annotations

from collections.abc import Callable

from posenc._torch.backend import triton_available
from posenc.kernels import torch_rope

__all__ = ["ENGINES", "rope_engine", "triton_available"]

ENGINES = ("torch", "triton")


def rope_engine(name: str) -> Callable:
    """The ``rope_qk`` function of engine ``name`` (``"torch"`` or ``"triton"``).  Traceable: the
    Triton module is imported with an import statement, which ``torch.compile`` can follow."""
    if name == "torch":
        return torch_rope.rope_qk
    if name == "triton":
        from posenc.kernels import triton_rope

        return triton_rope.rope_qk
    raise ValueError(f"engine must be one of {ENGINES}, got {name!r}")
