"""A Triton kernel launched at the cost of one launch (not public).

A decode-sized RoPE kernel runs for a few microseconds on a GPU; what a call costs is the Python
around it.  ``kernel[grid](*args)`` re-binds every argument on every call (Triton specialises each
integer on whether it is 1 or a multiple of 16 and each pointer on its alignment, then hashes the
result to find the compiled kernel): tens of microseconds for a kernel with 35 arguments.  A
:class:`Launch` does that work once per specialisation:

- its **grid**, its **fixed arguments** (sizes and strides, which a call with the same shapes and
  strides repeats) and its **compile-time settings** are computed once, by the kernel's own
  argument builder;
- a call passes only what changes between calls (the tensors and, for RoPE, the first position);
- the first call goes through ``kernel[grid](...)``, which compiles the kernel or finds it in
  Triton's cache and returns it; later calls whose pointers are 16-byte aligned (what that first
  call was compiled for, when it was aligned too) call the compiled kernel's launcher directly, as
  Triton's own ``JITFunction.run`` does after binding, with no binder and no device switch when the
  tensors are on the current device.

The direct call is taken only where this Triton calls its compiled kernels the same way (checked
once against the source of ``JITFunction.run``), no launch hook is installed (profilers), and the
compiled kernel has the attributes that call reads; anything else takes ``kernel[grid](...)``, as
does every launch under ``TRITON_INTERPRET=1``.  Kernels keep every per-call argument first, then
the fixed ones, then the compile-time ones, and mark the per-call integers ``do_not_specialize``:
so the arguments of a direct call are the per-call ones followed by the plan's, in the kernel's
order, exactly as ``kernel[grid]`` binds them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import operator
import re

import torch
import triton

__all__ = ["DIRECT", "Launch", "direct_supported"]

#: Set to False to take ``kernel[grid](...)`` for every launch (tests force the fallback with it).
DIRECT = True

#: How Triton's own ``JITFunction.run`` calls a compiled kernel after binding its arguments (Triton 3.2
#: to 3.9): the direct launch uses the same positional convention.
_CONVENTION = re.compile(
    r"kernel\.run\(\s*grid_0\s*,\s*grid_1\s*,\s*grid_2\s*,\s*stream\s*,\s*kernel\.function\s*,"
    r"\s*kernel\.packed_metadata\s*,\s*launch_metadata\s*,")

_data_ptr = torch.Tensor.data_ptr


@functools.cache
def direct_supported() -> bool:
    """Whether this Triton launches compiled kernels with the convention :class:`Launch` uses for its
    direct calls, read from the source of ``triton.runtime.jit.JITFunction.run`` (checked once)."""
    try:
        from triton.runtime.jit import JITFunction

        return _CONVENTION.search(inspect.getsource(JITFunction.run)) is not None
    except (ImportError, AttributeError, OSError, TypeError):
        return False


def _driver():
    return triton.runtime.driver.active


class Launch:
    """One specialisation of a kernel launch: ``launch(*per_call)`` runs ``kernel[grid](*per_call,
    *fixed, **meta)``, directly through the compiled kernel once it is known.

    ``per_call`` holds the arguments that change between calls, in the kernel's order (tensors, then
    integers marked ``do_not_specialize``); ``fixed`` the rest of the non-constexpr arguments;
    ``meta`` the constexprs and launch options.  ``tensors`` is how many of the per-call arguments
    are tensors (they come first).
    """

    __slots__ = ("kernel", "grid", "grid3", "fixed", "meta", "tensors", "direct")

    def __init__(self, kernel, grid: tuple[int, ...], fixed: tuple, meta: dict, tensors: int) -> None:
        self.kernel = kernel
        self.grid = grid
        self.grid3 = grid + (1,) * (3 - len(grid))
        self.fixed = fixed
        self.meta = meta
        self.tensors = tensors
        #: once known: ``(launcher, function, packed metadata, device index, constexpr values, Triton's
        #: runtime settings, current-device and current-stream getters)``
        self.direct: tuple | None = None

    def __call__(self, *per_call) -> None:
        d = self.direct
        if d is not None and DIRECT:
            # (launch hooks, e.g. a profiler's: Triton 3.9 keeps empty chains of them, earlier ones None)
            knobs = d[5]
            enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
            if (enter is None or not getattr(enter, "calls", True)) and (
                    leave is None or not getattr(leave, "calls", True)) and d[6]() == d[3]:
                n = self.tensors
                ptrs = tuple(map(_data_ptr, per_call[:n]))
                if not functools.reduce(operator.or_, ptrs) & 15:
                    g = self.grid3
                    d[0](g[0], g[1], g[2], d[7](d[3]), d[1], d[2], None, None, None, *ptrs, *per_call[n:],
                         *self.fixed, *d[4])
                    return
        self.fallback(per_call)

    def fallback(self, per_call: tuple) -> None:
        """``kernel[grid](...)`` on the tensors' device; remembers the compiled kernel for direct calls
        when this call's pointers were all 16-byte aligned."""
        first = per_call[0]
        # (Triton launches on the current device: switch only for tensors on another one)
        with (torch.cuda.device(first.device) if first.is_cuda and first.get_device() != torch.cuda.current_device()
              else contextlib.nullcontext()):
            compiled = self.kernel[self.grid](*per_call, *self.fixed, **self.meta)
        if self.direct is None and DIRECT and first.is_cuda and direct_supported():
            ptrs = tuple(map(_data_ptr, per_call[: self.tensors]))
            if not functools.reduce(operator.or_, ptrs) & 15:
                self.direct = _direct_call(self.kernel, compiled, self.meta, first.get_device())


def _direct_call(kernel, compiled, meta: dict, device: int) -> tuple | None:
    """What a direct call of ``compiled`` needs, or None where it lacks an attribute the call reads."""
    try:
        launcher, function, packed = compiled.run, compiled.function, compiled.packed_metadata
        names = [p.name for p in kernel.params if p.is_constexpr]
        constexprs = tuple(meta[name] for name in names)
        knobs = triton.knobs.runtime
        driver = _driver()
        getters = driver.get_current_device, driver.get_current_stream
    except (AttributeError, KeyError, TypeError):
        return None
    if launcher is None or function is None:
        return None
    return launcher, function, packed, device, constexprs, knobs, *getters
