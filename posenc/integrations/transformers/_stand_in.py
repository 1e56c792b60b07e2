"""The stand-in for a modeling module's rotate function, and its contract.

The contract, written once: a patched rotary module's ``forward`` returns the cos/sin of posenc's
tables in the module's format and, where the model's rotate function was reproduced at patch time
(:func:`_verify_fast`), attaches to the returned ``cos`` an entry (:class:`_FastEntry`, or
:class:`_KernelEntry` for the Triton kernel) under the attribute ``_posenc_rotation``, with the
version counters of the cos and sin it returned.  The modeling module's ``apply_rotary_pos_emb``
(or ``apply_rotary_emb``, ...) is replaced, process-wide and for as long as a patched model uses
it, by :class:`_FastRotate`: called with a cos that carries an entry, it rotates q and k with
posenc's engine when the sin is the one returned with that cos and neither was changed since, or,
where the entry allows any rows (half-width cos/sin checked with random rows at patch time), from
the rows it is given; anything else (another model's cos/sin, changed rows in another format,
traced calls, shapes or dtypes the entry was not checked for) runs the model's own function.  The
last ``unpatch_model`` of the models that use it puts the function back."""

from __future__ import annotations

import inspect
import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch

from posenc._torch.angles import has_float64
from posenc._torch.engine_choice import kernel_possible
from posenc.functional import (
    apply_rope_qk,
)
from posenc.integrations.transformers._common import Route
from posenc.integrations.transformers._layout import _ROTATE_FUNCTIONS
from posenc.kernels.torch_mix import mix_rows, mix_view, rotate_mixed

if TYPE_CHECKING:
    from posenc.integrations.transformers._rotary import _RotaryAdapter, _RotaryTables
    from posenc.integrations.transformers._state import _Plan

#: The attribute of the cos a patched rotary module returns that holds what rotates q and k with it
#: (on the tensor itself: it lives exactly as long as that cos, and a layer reads it at once).
_ENTRY = "_posenc_rotation"
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling


class _FastEntry:
    """What rotates q and k as the model's function would with the cos/sin of one call of a patched
    rotary module: posenc's ``rounding="model"`` engine (:mod:`posenc.kernels.torch_mix`), with its factors in
    the model's dtype (widened to float32 with ``widen``, for functions that compute there), broadcast
    as the model broadcasts cos (``unsqueeze_dim``).  It serves 4-D tensors of cos's dtype and
    sequence length, and heads wider than the rotary dim only where the function was seen to pass
    the rest through (``partial``: ``"first"`` where the leading features rotate, ``"last"`` where the
    trailing ones do, as in DeepSeek-V4); anything else is left to the model's function.

    ``any_rows``: the function was also reproduced with cos/sin rows of any values (half-width rows,
    one value per pair), so that a call with other rows than the module returned (DeepSeek-V4 rotates
    its attention output back with ``-sin``; custom code may change them in place) is rotated by
    posenc's engine from the rows it is given (:meth:`rotate_rows`)."""

    __slots__ = ("layout", "dim", "mix", "by_axis", "widen", "partner", "dtype", "length", "partial", "versions",
                 "sign", "any_rows")
    #: the version counters of the cos and sin returned with the entry (set by the module's forward; None
    #: for inference tensors, which keep none: under ``torch.inference_mode`` an in-place change goes unseen)
    versions: tuple[int, int] | None

    def __init__(self, layout: str, dim: int, mix: torch.Tensor, widen: bool, cos: torch.Tensor, sin: torch.Tensor,
                 partial: str | bool, sign: int = 1, any_rows: bool = False) -> None:
        self.layout, self.dim, self.widen, self.partial = layout, dim, widen, partial
        self.sign, self.any_rows = sign, any_rows
        #: the sin returned with this cos (a call with another sin is not this entry's), cos's dtype and length
        self.partner, self.dtype, self.length = sin, cos.dtype, cos.shape[-2]
        self.mix = mix.float() if widen else mix
        #: the factors unsqueezed at the model's ``unsqueeze_dim`` (1: q ``(B, H, S, D)``)
        self.by_axis = {1: self.mix.unsqueeze(1)}

    def _serves(self, x: torch.Tensor, unsqueeze: int) -> bool:
        return (x.dtype is self.dtype and x.dim() == 4 and x.shape[3 - unsqueeze] == self.length
                and (x.shape[-1] == self.dim or (bool(self.partial) and x.shape[-1] > self.dim)))

    def _takes_rows(self, cos: torch.Tensor, sin: torch.Tensor) -> bool:
        """Whether given cos/sin are half-width rows of this entry's call (any values)."""
        return (self.any_rows and type(sin) is _Tensor and cos.dim() == 3 and cos.shape == sin.shape
                and 2 * cos.shape[-1] == self.dim and cos.shape[-2] == self.length and cos.dtype is self.dtype
                and sin.dtype is self.dtype)

    def route(self, xs: tuple[torch.Tensor, ...], cos: torch.Tensor, sin: Any,
              unsqueeze: Any) -> tuple[torch.Tensor, ...] | None:
        """``xs`` (q and k, or one tensor) rotated as the stand-in's call asks, or None for the model's own
        function: by the entry's factors when ``cos``/``sin`` are the pair the module returned, unchanged
        since; else, where the entry allows it, from the rows given."""
        if unsqueeze != 1 and unsqueeze != 2:
            return None
        if self.partner is sin and (self.versions is None or self.versions == (cos._version, sin._version)):
            if len(xs) == 2:
                return self.rotate(xs[0], xs[1], unsqueeze)
            one = self.rotate_one(xs[0], unsqueeze)
            return None if one is None else (one,)
        return self.rotate_rows(xs, cos, sin, unsqueeze) if self.any_rows else None       # other or changed rows

    def rotate(self, q: torch.Tensor, k: torch.Tensor, unsqueeze: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """q and k rotated, or None when they are not what the entry rotates (the model's own function
        then runs)."""
        dim, dtype, seq = self.dim, self.dtype, 3 - unsqueeze
        if (q.shape[-1] == dim == k.shape[-1] and q.dtype is dtype and k.dtype is dtype and q.dim() == 4
                and k.dim() == 4 and q.shape[seq] == self.length == k.shape[seq] and not self.widen):
            m = self.by_axis.get(unsqueeze)                             # the usual call, in the fewest steps
            if m is None:
                m = self.by_axis[unsqueeze] = self.mix.unsqueeze(unsqueeze)
            return rotate_mixed(q, m, self.layout), rotate_mixed(k, m, self.layout)
        if not (self._serves(q, unsqueeze) and self._serves(k, unsqueeze)):
            return None
        m = self._factors(unsqueeze)
        return self._with(q, m), self._with(k, m)

    def rotate_one(self, x: torch.Tensor, unsqueeze: int) -> torch.Tensor | None:
        """One tensor rotated (for functions that take one at a time), or None (see :meth:`rotate`)."""
        return self._with(x, self._factors(unsqueeze)) if self._serves(x, unsqueeze) else None

    def rotate_rows(self, xs: tuple[torch.Tensor, ...], cos: torch.Tensor, sin: torch.Tensor,
                    unsqueeze: int) -> tuple[torch.Tensor, ...] | None:
        """``xs`` rotated by the given half-width rows, or None (the model's function then runs)."""
        if not (self._takes_rows(cos, sin) and all(self._serves(x, unsqueeze) for x in xs)):
            return None
        m = mix_view(mix_rows(cos, sin if self.sign > 0 else -sin, self.layout), self.layout)
        m = (m.float() if self.widen else m).unsqueeze(unsqueeze)
        return tuple(self._with(x, m) for x in xs)

    def _factors(self, unsqueeze: int) -> torch.Tensor:
        m = self.by_axis.get(unsqueeze)
        if m is None:
            m = self.by_axis[unsqueeze] = self.mix.unsqueeze(unsqueeze)
        return m

    def _with(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        dim = self.dim
        last = self.partial == "last" and x.shape[-1] > dim
        part = x if x.shape[-1] == dim else (x[..., -dim:] if last else x[..., :dim])
        if self.widen:                                               # computed in float32, rounded back once
            out = rotate_mixed(part.float(), m, self.layout).to(x.dtype)
        else:
            out = rotate_mixed(part, m, self.layout)
        if x.shape[-1] == dim:
            return out
        return torch.cat([x[..., :-dim], out], -1) if last else torch.cat([out, x[..., dim:]], -1)   # pass-through


class _KernelEntry(_FastEntry):
    """:class:`_FastEntry` for the Triton kernel, which reads the narrow ``(1, S, d/2)`` cos and sin of one
    row set for the batch (the entry of a call with one row of positions)."""

    __slots__ = ("cos", "sin", "engine")

    def __init__(self, layout: str, cos: torch.Tensor, sin: torch.Tensor, engine: str, sin_out: torch.Tensor,
                 partial: str | bool, any_rows: bool = False) -> None:
        self.layout, self.dim, self.partner, self.partial = layout, 2 * cos.shape[-1], sin_out, partial
        self.dtype, self.length, self.sign, self.any_rows = cos.dtype, cos.shape[-2], 1, any_rows
        self.cos, self.sin, self.engine = cos, sin, engine

    def _kernel(self, q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                unsqueeze: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        last = self.partial == "last" and q.shape[-1] > self.dim
        return apply_rope_qk(q, k, cos[0], sin[0], layout=self.layout, seq_dim=3 - unsqueeze, engine=self.engine,
                             rotary_slice="last" if last else "first")

    def rotate_one(self, x: torch.Tensor, unsqueeze: int) -> torch.Tensor | None:
        return self._kernel(x, None, self.cos, self.sin, unsqueeze)[0] if self._serves(x, unsqueeze) else None

    def rotate_rows(self, xs: tuple[torch.Tensor, ...], cos: torch.Tensor, sin: torch.Tensor,
                    unsqueeze: int) -> tuple[torch.Tensor, ...] | None:
        if not (self._takes_rows(cos, sin) and cos.shape[0] == 1 and all(self._serves(x, unsqueeze) for x in xs)):
            return None
        return tuple(self._kernel(x, None, cos, sin, unsqueeze)[0] for x in xs)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, unsqueeze: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not (self._serves(q, unsqueeze) and self._serves(k, unsqueeze)):
            return None
        if q.shape[-1] == k.shape[-1]:                                  # q and k in one launch
            q_out, k_out = self._kernel(q, k, self.cos, self.sin, unsqueeze)
            return q_out, cast(torch.Tensor, k_out)
        return (self._kernel(q, None, self.cos, self.sin, unsqueeze)[0],
                cast(torch.Tensor, self._kernel(k, None, self.cos, self.sin, unsqueeze)[0]))


class _FastRotate:
    """Stands in for a modeling module's ``apply_rotary_pos_emb(q, k, cos, sin, ..., unsqueeze_dim=1)``:
    posenc's engine for the cos/sin a patched rotary module returned (passed by position, as
    transformers does), the model's own function for anything else (another model's cos/sin, other
    sin, traced calls, shapes or dtypes the entry does not serve)."""

    #: the number of leading tensors the function rotates: (q, k) here, (x,) for :class:`_FastRotateOne`
    tensors = 2

    def __new__(cls, original: Callable[..., Any] | None = None) -> _FastRotate:
        if cls is _FastRotate and original is not None and _takes_one(original):
            cls = _FastRotateOne                                   # (x, cos, sin, ...): one tensor at a time
        return super().__new__(cls)

    def __init__(self, original: Callable[..., Any]) -> None:
        self.original = original
        #: the patched models' adapters that route this function (held weakly: a model collected
        #: without unpatch_model stops counting)
        self.users: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self.signature = inspect.signature(original)
        param = self.signature.parameters.get("unsqueeze_dim")
        self.unsqueeze = 1 if param is None or param.default is inspect.Parameter.empty else param.default

    def _unsqueeze(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The call's ``unsqueeze_dim`` (the function's own default when not passed)."""
        if len(args) == self.tensors + 2 and not kwargs:
            return self.unsqueeze
        try:
            return self.signature.bind(*args, **kwargs).arguments.get("unsqueeze_dim", self.unsqueeze)
        except TypeError:
            return None                                            # the function itself will say what is wrong

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # (tracing first: the traced graph holds the model's own function)
        if not _is_compiling() and len(args) >= 4:
            q, k, cos, sin = args[0], args[1], args[2], args[3]
            entry = getattr(cos, _ENTRY, None)
            if entry is not None and type(q) is _Tensor and type(k) is _Tensor:
                unsqueeze = self.unsqueeze if len(args) == 4 and not kwargs else self._unsqueeze(args, kwargs)
                out = entry.route((q, k), cos, sin, unsqueeze)
                if out is not None:
                    return out
        return self.original(*args, **kwargs)

    def __copy__(self) -> _FastRotate:
        return self                                                # (a function: copies are itself)

    def __deepcopy__(self, memo: dict[int, Any]) -> _FastRotate:
        return self


class _FastRotateOne(_FastRotate):
    """:class:`_FastRotate` for a function that rotates one tensor, ``(x, cos, sin, ..., unsqueeze_dim=1)``."""

    tensors = 1

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not _is_compiling() and len(args) >= 3:
            x, cos, sin = args[0], args[1], args[2]
            entry = getattr(cos, _ENTRY, None)
            if entry is not None and type(x) is _Tensor:
                out = entry.route((x,), cos, sin, self._unsqueeze(args, kwargs))
                if out is not None:
                    return out[0]
        return self.original(*args, **kwargs)


def _takes_one(fn: Callable[..., Any]) -> bool:
    """Whether a rotate function takes one tensor, ``(x, cos, sin, ...)``, rather than ``(q, k, cos, sin, ...)``."""
    return list(inspect.signature(fn).parameters)[:3] == ["x", "cos", "sin"]


def _install_fast(module_name: str, name: str, adapter: torch.nn.Module) -> None:
    code = sys.modules.get(module_name)
    if code is None:
        return
    current = getattr(code, name, None)
    if not isinstance(current, _FastRotate):
        if not callable(current):
            return
        current = _FastRotate(current)
        setattr(code, name, current)
    current.users.add(adapter)


def _uninstall_fast(module_name: str, name: str, adapter: torch.nn.Module) -> None:
    """Forget ``adapter``; the last patched model gone (unpatched, or collected), the function goes back."""
    code = sys.modules.get(module_name)
    current = getattr(code, name, None) if code is not None else None
    if isinstance(current, _FastRotate):
        current.users.discard(adapter)
        if not current.users:
            setattr(code, name, current.original)


def _plan_fast_rotation(plan: _Plan, where: str, engine: str) -> None:
    """Route the model's rotation through posenc's engine where its rotate function is recognised and
    reproduced on random q and k (:func:`_verify_fast`); else leave it (logged)."""
    adapter = cast("_RotaryAdapter", plan.submodule[1] if plan.submodule else None)
    module = plan.module
    code = sys.modules.get(type(module).__module__)
    name = adapter.layout_source
    fn = getattr(code, name, None) if name in _ROTATE_FUNCTIONS else None
    if isinstance(fn, _FastRotate):
        fn = fn.original
    why = ""
    if code is None:
        why = "its modeling code is not loaded"
    elif adapter.fmt not in ("doubled", "repeated", "narrow") or adapter.layout is None or fn is None:
        why = "its rotate function takes neither (q, k, cos, sin) nor (x, cos, sin) with real cos/sin"
    elif not callable(fn) or (list(inspect.signature(fn).parameters)[:4] != ["q", "k", "cos", "sin"]
                              and not _takes_one(fn)):
        why = f"{name} does not take (q, k, cos, sin) or (x, cos, sin)"
    else:
        why = _verify_fast(adapter, fn, engine)
    if why:
        for table in adapter.tables.values():
            cast("_RotaryTables", table).enable_mix(adapter.fmt, None)     # only the tables the module returns
        adapter.why_not_fast = why                                       # (said in patch_model's log record)
        return
    module_name = type(module).__module__
    adapter.fast = plan.fast = Route(module_name, name, engine)


def _verify_fast(adapter: _RotaryAdapter, fn: Callable[..., Any], engine: str) -> str:
    """Why posenc's engine does not stand in for the model's rotate function ``fn``, or "" when it
    reproduces it on random q and k in float32 (:func:`_reproduces`: bit for bit with the torch
    engine), trying the ways of mixing the pairs the layout found allows, in either direction.

    Then, for bfloat16, float16 and float64, finds how the function computes there: in that dtype, or
    in float32 and rounded back (``adapter.low``); only a way that reproduces it bit for bit is kept,
    and without one the model's own function rotates in that dtype.  Heads wider than the rotary dim
    are served only where every check saw the function rotate the leading or the trailing features and
    pass the rest through (``adapter.partial``), and rows other than the module's own only where every
    check reproduced the function with random half-width rows (``adapter.any_rows``)."""
    adapter.low = {}
    tables = [cast("_RotaryTables", t) for t in adapter.tables.values()]
    promised = [t.assume_valid for t in tables]
    for t in tables:
        t.assume_valid = False                               # the probes go past the tables
    try:
        ways = [("half", 1), ("half", -1)] if adapter.layout == "half" else \
            [("interleaved", 1), ("interleaved_to_half", 1), ("interleaved", -1), ("interleaved_to_half", -1)]
        for adapter.mix_layout, adapter.sign in ways:
            adapter.slices, adapter.any_rows = ["first", "last"], adapter.fmt == "narrow"
            why = _reproduces(adapter, fn, engine, torch.float32)
            if not why:
                break
        if not why and not kernel_possible(engine, tables[0].cos):  # (the kernel computes in float32, rounds once)
            for dtype in (torch.bfloat16, torch.float16, torch.float64):
                if dtype == torch.float64 and not has_float64(tables[0].cos.device):
                    continue                                 # (a device without float64: nothing to route)
                for mode in ("model", "float32"):
                    adapter.low[dtype] = mode
                    if not _reproduces(adapter, fn, engine, dtype):
                        break
                    del adapter.low[dtype]
        return why
    finally:
        adapter.partial = adapter.slices[0] if adapter.slices else False
        adapter.slices = []
        for t, p in zip(tables, promised, strict=True):
            t.assume_valid = p


def _reproduces(adapter: _RotaryAdapter, fn: Callable[..., Any], engine: str, dtype: torch.dtype) -> str:
    """Why posenc's rotation for ``dtype`` differs from ``fn``'s, or "": bit for bit with the torch
    engine (the same products and additions), within 1e-5 with the Triton kernel (float32 only:
    it computes in float32 and rounds once).  For a head wider than the rotary dim, each slice still in
    ``adapter.slices`` that ``fn`` does not rotate as posenc would is dropped from it; random half-width
    rows that posenc does not rotate as ``fn`` does clear ``adapter.any_rows``."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    fast = Route("", "", engine)
    exact = not kernel_possible(engine, cast("_RotaryTables", next(iter(adapter.tables.values()))).cos)
    one = _takes_one(fn)

    def same(got: Any, want: Any) -> bool:
        return got is not None and isinstance(want, tuple) and all(
            torch.equal(g, w) if exact else torch.allclose(g, w, rtol=0, atol=1e-5)
            for g, w in zip(got, want, strict=True))

    def call(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        return (fn(q, cos, sin), fn(k, cos, sin)) if one else fn(q, k, cos, sin)

    for layer_type, table in adapter.tables.items():
        table = cast("_RotaryTables", table)
        dim, device, rows = int(table.rope.dim), table.cos.device, int(table.cos.shape[0])
        table.enable_mix(adapter.fmt, adapter.mix_layout, adapter.sign)
        inside = torch.tensor([[0, 1, 2, 3, 4], [5, 9, 40, rows - 2, rows - 1]], device=device)
        past = torch.tensor([[0, 1, 2, 700, 5000], [3, rows, rows + 1, 3 * rows, 7]], device=device)
        kind = None if layer_type == "None" else layer_type
        for positions in (inside, past, inside[1:], past[1:]):       # (one row set: what the kernel takes)
            for extra in (0, 8):                                      # the whole head rotated, or a pass-through part
                wide = torch.float64 if dtype == torch.float64 else torch.float32   # (float64: every bit used)
                q = torch.randn(2, 3, 5, dim + extra, generator=gen, dtype=wide).to(device, dtype)
                k = torch.randn(2, 2, 5, dim + extra, generator=gen, dtype=wide).to(device, dtype)
                x = torch.zeros(1, 1, dim, device=device, dtype=dtype)
                parts: list[str | bool] = list(adapter.slices) if extra else [False]
                for part in parts:
                    adapter.partial = part
                    try:
                        with torch.no_grad():
                            (cos, sin), entry = adapter.compute(x, positions, kind, fast)
                            entry = cast(_FastEntry, entry)
                            want = call(q, k, cos, sin)
                            if one:
                                got = None if (a := entry.rotate_one(q, 1)) is None or \
                                    (b := entry.rotate_one(k, 1)) is None else (a, b)
                            else:
                                got = entry.rotate(q, k, 1)
                            ok = same(got, want)
                            if ok and adapter.any_rows:               # rows of any values, as given
                                shape = tuple(cos.shape)
                                cr = torch.randn(shape, generator=gen, dtype=wide).to(device, cos.dtype)
                                sr = torch.randn(shape, generator=gen, dtype=wide).to(device, sin.dtype)
                                if not same(entry.rotate_rows((q, k), cr, sr, 1), call(q, k, cr, sr)):
                                    adapter.any_rows = False
                    except Exception as e:                            # noqa: BLE001 -- reported as the reason
                        if extra:
                            adapter.slices.remove(cast(str, part))
                            continue
                        return f"posenc's engine could not take its shapes ({type(e).__name__}: {e})"
                    if extra and not ok:
                        adapter.slices.remove(cast(str, part))        # this slice: the model's own function
                    elif not ok:
                        return "posenc's engine does not reproduce it " + ("bit for bit " if exact else "") + \
                            "on random q and k"
    return ""
