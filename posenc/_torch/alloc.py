"""Output allocation for large CPU tensors (not public).

A fresh tensor of tens of MiB is mapped by the C allocator and page-faulted 4 KiB at a time on its
first write: for an out-of-place rotation that costs several times the rotation itself (every
library pays it).  :func:`empty_like` advises the kernel to back such an output with transparent
huge pages (``madvise(MADV_HUGEPAGE)``, Linux), which makes the first write cost about one more
pass over the memory.  Elsewhere (other systems, THP disabled, GPUs) it is ``torch.empty_like``.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import torch

_HUGE_PAGE = 2 << 20
#: Outputs from this size on are advised (smaller ones gain nothing measurable).
MIN_BYTES = 8 << 20
_ADVICE = getattr(mmap, "MADV_HUGEPAGE", None) if sys.platform.startswith("linux") else None
_madvise = None


def _libc_madvise():
    global _madvise
    if _madvise is None:
        fn = ctypes.CDLL(None, use_errno=True).madvise
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        fn.restype = ctypes.c_int
        _madvise = fn
    return _madvise


def empty_like(x: torch.Tensor) -> torch.Tensor:
    """``torch.empty_like(x)``, advised for huge pages when it is a large CPU tensor on Linux.

    The advice is a hint on memory nothing has touched yet; if the kernel declines it (THP off),
    nothing changes.
    """
    out = torch.empty_like(x)
    nbytes = out.numel() * out.element_size()
    if _ADVICE is None or out.device.type != "cpu" or nbytes < MIN_BYTES or not out.is_contiguous():
        return out
    start = -(-out.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE                      # whole huge pages inside
    end = (out.data_ptr() + nbytes) // _HUGE_PAGE * _HUGE_PAGE
    if end > start:
        _libc_madvise()(start, end - start, _ADVICE)
    return out
