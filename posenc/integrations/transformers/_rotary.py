"""The generic RoPE adapter: posenc's tables for a rotary module (one per layer type), returned in the
module's own format, built from its configuration and checked against its output before anything changes."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch

from posenc._torch.engine_choice import kernel_possible
from posenc._torch.rows import position_range, table_rows
from posenc._torch.tables import TableModule
from posenc.core.rope import LongRopeScaling
from posenc.integrations.transformers._common import (
    _FORMATS,
    _RENAMED_FORMATS,
    Route,
    _config_of,
    _layer_types,
    _rows,
    _silently,
)
from posenc.integrations.transformers._layout import rotation_layout
from posenc.integrations.transformers._selfcheck import (
    _angle_scale,
    _call_original,
    _compare,
    _grown,
    _probe_positions,
    _shape_of,
)
from posenc.integrations.transformers._stand_in import _ENTRY, _FastEntry, _install_fast, _is_compiling, _KernelEntry
from posenc.integrations.transformers._state import _Call, _Plan
from posenc.kernels.torch_mix import mix_rows, mix_view
from posenc.nn import RotaryEmbedding

# ---- RoPE: one generic adapter, verified against the module ------------------------------------------------

class _RotaryTables(TableModule):
    """posenc's rotary embedding for one layer type; ``cos`` and ``sin`` are views of its own exact
    float32 tables ``(rows, dim/2)`` (no copy), made again whenever the module moves.  The tables stay
    float32 when the model is cast (``model.to(torch.bfloat16)``).

    Where posenc also rotates q and k (``engine=``), ``mix`` holds, per row, everything a call
    returns and rotates with, so that one gather serves a call: ``(rows, 4 dim)``, the module's cos
    and sin in its own format, then the factors of :func:`posenc.kernels.torch_mix.mix_rows`.
    """

    _table_buffers = ("mix",)
    cos: torch.Tensor
    sin: torch.Tensor
    mix: torch.Tensor | None
    #: the widths of cos, sin and the factors in a row of ``mix`` (set with it)
    split: tuple[int, int, int]

    def __init__(self, rope: RotaryEmbedding, assume_valid: bool) -> None:
        super().__init__()
        self.assume_valid = assume_valid
        self.rope = rope
        self._share_tables()
        self.register_buffer("mix", None, persistent=False)
        self.mix_format: tuple[str, str, int] | None = None
        #: plain attributes (read per call without the module's attribute lookup)
        self.rows, self.length_dependent, self.dim = int(self.cos.shape[0]), bool(rope.length_dependent), rope.dim

    def _share_tables(self) -> None:
        """``cos`` and ``sin``: views of the rotary module's packed table (plain attributes, not buffers)."""
        self.cos, self.sin = self.rope.cos_table, self.rope.sin_table

    def _apply(self, fn, recurse: bool = True):
        out = super()._apply(fn, recurse)
        self._share_tables()                                   # the rotary module's table moved with it
        return out

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for name in ("cos", "sin"):                            # (copies kept as buffers by an earlier posenc)
            self._buffers.pop(name, None)
        self._share_tables()
        # (tables saved by an earlier posenc: the attributes it did not have, and no factor table)
        self._buffers.setdefault("mix", None)
        mix_format = vars(self).get("mix_format")
        if mix_format is not None:
            self.mix_format = (_RENAMED_FORMATS.get(mix_format[0], mix_format[0]), *mix_format[1:])
        rope = self.rope
        for name, value in (("mix_format", None), ("rows", int(self.cos.shape[0])), ("dim", rope.dim),
                            ("length_dependent", bool(rope.length_dependent))):
            vars(self).setdefault(name, value)

    def enable_mix(self, fmt: str, layout: str | None, sign: int = 1) -> None:
        """Build ``mix`` for a module returning cos/sin in ``fmt`` whose model mixes pairs as ``layout``
        (:data:`posenc.kernels.torch_mix.MIX_LAYOUTS`), rotating by ``sign`` times the angle;
        ``layout=None`` drops it."""
        self.mix_format = None if layout is None else (fmt, layout, sign)
        if layout is None:
            self.mix = None
            return
        with torch.no_grad():
            cos, sin = _to_format(self.cos, self.sin, fmt, torch.float32)
            self.split = (cos.shape[-1], sin.shape[-1], 2 * self.dim)
            self.mix = torch.cat([cos, sin, mix_rows(self.cos, sign * self.sin, layout)], -1)

    def reset_buffers(self) -> None:
        """Rebuild the tables in place (after ``to_empty``)."""
        self.rope.reset_buffers()
        self._share_tables()
        if self.mix_format is not None:
            self.enable_mix(*self.mix_format)

    def _in_table(self, position_ids: torch.Tensor, dtype: torch.dtype) -> bool:
        if dtype == torch.float64 or self.length_dependent:
            return False
        if self.assume_valid:                                                 # promised: no device reads
            return True
        if torch.compiler.is_compiling():
            return False
        lo, hi = position_range(position_ids)                                  # one small read
        return 0 <= lo and hi < self.rows

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``position_ids.shape + (dim/2,)``: table rows when the positions lie inside the
        table and no length-dependent rule changes the frequencies, else exact values for this call."""
        if self._in_table(position_ids, dtype):
            return table_rows(self.cos, position_ids, 0, 0), table_rows(self.sin, position_ids, 0, 0)
        return self.rope.cos_sin(position_ids, dtype=torch.float64 if dtype == torch.float64 else torch.float32)

    def mixed(self, position_ids: torch.Tensor, dtype: torch.dtype
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The module's ``(cos, sin)`` ``position_ids.shape + (dim,)`` in ``dtype`` and the factors of
        their rows (:func:`posenc.kernels.torch_mix.mix_view`, also in ``dtype``: the rotation rounds
        as the model's own code does), from one gather of ``mix`` (copies of cos/sin make them
        contiguous past one row); None where :meth:`forward` would not read the tables."""
        mix = self._buffers["mix"]
        if mix is None or dtype not in _LOW or self.length_dependent:
            return None
        index = position_ids if position_ids.dtype in (torch.int64, torch.int32) else position_ids.long()
        if position_ids.is_cpu:                                               # (not tracing: the caller checked)
            try:
                rows = torch.embedding(mix, index)                            # bounds-checked: nothing to read
            except IndexError:
                return None                                                   # past the table: computed
        elif self._in_table(position_ids, dtype):
            rows = torch.embedding(mix, index)
        else:
            return None
        if dtype is not torch.float32:
            rows = rows.to(dtype)                       # rounded once, as the model rounds its cos/sin
        cos, sin, m = rows.split_with_sizes(self.split, -1)
        return cos.contiguous(), sin.contiguous(), mix_view(m, self.mix_format[1])  # type: ignore[index]


#: The dtypes posenc's tables serve (float64 takes float64 angles, computed per call).
_LOW = (torch.float32, torch.bfloat16, torch.float16)


def _to_format(cos: torch.Tensor, sin: torch.Tensor, fmt: str, dtype: torch.dtype) -> Any:
    """posenc's ``(..., dim/2)`` cos/sin in the format a model's rotary module returns."""
    if fmt == "complex":
        return torch.complex(cos.float(), sin.float()) if dtype != torch.float64 else torch.complex(cos, sin)
    if fmt == "doubled":
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    elif fmt == "repeated":
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
    if fmt == "sin_cos":
        return sin.to(dtype), cos.to(dtype)
    return cos.to(dtype), sin.to(dtype)


_FORMAT_WORDS = {"doubled": "[cos, cos] per row", "repeated": "each value twice", "narrow": "half width",
                 "sin_cos": "(sin, cos), half width", "complex": "complex exp(i angle)"}


class _RotaryAdapter(torch.nn.Module):
    """What a patched rotary module runs: posenc's tables per layer type, returned in the module's format."""

    def __init__(self, tables: dict[str, _RotaryTables], fmt: str) -> None:
        super().__init__()
        self.tables = torch.nn.ModuleDict(tables)
        self.fmt = fmt
        #: the pairs the model's own rotate function mixes (found at patch time), and that function
        self.layout: str | None = None
        self.layout_source = ""
        #: (modeling module name, function name, engine) when the rotation is routed through posenc
        self.fast: Route | None = None
        #: why the model's own code rotates q and k (for the log), when it does
        self.why_not_fast = "engine=None"
        #: how posenc mixes the pairs where it rotates (found at patch time): the layout of
        #: :mod:`posenc.kernels.torch_mix`, the direction of the rotation (-1: by minus the angle), which
        #: features of a wider head rotate while the rest pass through ("first", "last"; False: wider heads
        #: are left to the function), and whether rows of any values are rotated as the function would
        self.mix_layout, self.sign, self.any_rows = "half", 1, False
        self.partial: str | bool = False
        #: the slices still in the running while the function is checked (see _reproduces)
        self.slices: list[str] = []
        #: how the model's rotate function computes in bfloat16 / float16 / float64, found at patch time:
        #: "model" (in that dtype) or "float32" (in float32, then rounded back); absent: its own code runs
        self.low: dict[torch.dtype, str] = {}

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: Any = None, **kwargs: Any) -> Any:
        out, entry = self.compute(x, position_ids, layer_type, self.fast)
        if entry is not None:
            # (an in-place change later retires the entry; inference tensors keep no version counter)
            entry.versions = None if out[0].is_inference() else (out[0]._version, out[1]._version)
            setattr(out[0], _ENTRY, entry)
        return out

    def compute(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: Any,
                fast: Route | None) -> tuple[Any, _FastEntry | None]:
        """The module's output and, with ``fast`` (and not tracing), what rotates q and k with it."""
        tables = self._modules["tables"]._modules                       # type: ignore[union-attr]
        key = str(layer_type)
        if key not in tables:
            if len(tables) != 1:
                raise ValueError(f"layer_type must be one of {sorted(tables)}, got {layer_type!r}")
            key = next(iter(tables))
        table: _RotaryTables = tables[key]                               # type: ignore[assignment]
        if fast is None or _is_compiling():
            cos, sin = table(position_ids, x.dtype)
            return _to_format(cos, sin, self.fmt, x.dtype), None
        engine, dtype, layout = fast.engine, x.dtype, self.mix_layout
        # the kernel: plain rotations, one row set for the batch (per-row positions: the torch engine)
        if (position_ids.dim() == 2 and position_ids.shape[0] == 1 and kernel_possible(engine, x) and self.sign == 1
                and layout == self.layout):
            cos, sin = table(position_ids, dtype)
            out = _to_format(cos, sin, self.fmt, dtype)
            return out, _KernelEntry(layout, cos.to(dtype), sin.to(dtype), engine, out[1], self.partial, self.any_rows)
        if dtype is not torch.float32 and dtype not in self.low:
            cos, sin = table(position_ids, dtype)                          # the model's own rotation
            return _to_format(cos, sin, self.fmt, dtype), None
        widen = self.low.get(dtype) == "float32"
        got = table.mixed(position_ids, dtype)
        if got is not None:                                                # the usual call: one gather
            return (got[0], got[1]), _FastEntry(layout, table.dim, got[2], widen, got[0], got[1], self.partial,
                                                self.sign, self.any_rows)
        cos, sin = table(position_ids, dtype)
        cos, sin = cos.to(dtype), sin.to(dtype)
        with torch.no_grad():
            rows = mix_rows(cos, sin if self.sign > 0 else -sin, layout)    # (B, S, 2d), in the model's dtype
        out = _to_format(cos, sin, self.fmt, dtype)
        return out, _FastEntry(layout, table.dim, mix_view(rows, layout), widen, out[0], out[1], self.partial,
                               self.sign, self.any_rows)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        # (adapters saved by an earlier posenc: what they lack, the cautious way: bfloat16, float16 and
        # float64 left to the model's own rotation until the model is patched again)
        for name, value in (("low", {}), ("mix_layout", self.layout or "half"), ("sign", 1), ("why_not_fast", ""),
                            ("partial", False), ("any_rows", False), ("slices", [])):
            vars(self).setdefault(name, value)
        if self.partial is True:                                   # (the leading features, as it then meant)
            self.partial = "first"
        self.fmt = _RENAMED_FORMATS.get(self.fmt, self.fmt)
        fast = getattr(self, "fast", None)
        if fast is not None:                                       # a copy or a loaded model: route it again
            self.fast = fast = Route(*fast)                        # (a plain tuple in earlier versions)
            _install_fast(fast.module, fast.function, self)


def _rotary_forward(owner: Any, *args: Any, **kwargs: Any) -> Any:
    return owner._modules["posenc_rope"].forward(*args, **kwargs)    # (an internal module: no hooks to run)

def _from_config(config: Any, layer_type: str | None, rows: int, where: str) -> RotaryEmbedding:
    try:
        with _silently():
            return RotaryEmbedding.from_hf_config(config, layer_type=layer_type, max_seq_len=rows)
    except (ValueError, TypeError, KeyError) as e:
        text = getattr(config, "get_text_config", None)
        inner = text() if callable(text) else None
        if inner is not None and inner is not config:
            with contextlib.suppress(ValueError, TypeError, KeyError), _silently():
                return RotaryEmbedding.from_hf_config(inner, layer_type=layer_type, max_seq_len=rows)
        hint = " (this is a composite configuration: its text model's settings are in config.text_config)" \
            if inner is not None and inner is not config else ""
        raise ValueError(f"patch_model: {where}: posenc cannot read this rotary module's configuration"
                         f"{'' if layer_type is None else f' for layer_type={layer_type!r}'}: {e}{hint}; the model "
                         f"is left unpatched") from e

def _plan_rotary(module: torch.nn.Module, where: str, model: torch.nn.Module, assume_valid: bool) -> _Plan:
    config = _config_of(module, model)
    device = next((b.device for b in module.buffers()), torch.device("cpu"))
    rows = _rows(config)
    tables: dict[str, _RotaryTables] = {}
    fmt: str | None = None
    reading = ""
    longest = _grown(module)
    if longest is not None:
        reading = (f"; reading: the module remembered {longest} positions from earlier calls, which posenc does not: "
                   f"each call takes the frequencies of its own length, as the model did when loaded")
    for layer_type in _layer_types(module, config):
        rope = _from_config(config, layer_type, rows, where).to(device)
        table = _RotaryTables(rope, assume_valid)
        try:
            fmt = _verify_rotary(module, where, layer_type, table, fmt, config)
        except ValueError:
            kept = _short_factors_kept(rope)
            if kept is None:
                raise
            table = _RotaryTables(kept.to(device), assume_valid)
            try:
                fmt = _verify_rotary(module, where, layer_type, table, fmt, config)
            except ValueError:
                pass
            else:
                reading += ("; reading: LongRoPE's short factors at every length, only the attention factor "
                            "switching past the original context, as this module computes")
            if "LongRoPE's short factors" not in reading:
                raise
        tables[str(layer_type)] = table
    assert fmt is not None
    _check_one_axis(module, where, config, rope.dim)
    adapter = _RotaryAdapter(tables, fmt).to(device)
    adapter.layout, adapter.layout_source = rotation_layout(module, model)
    dims = sorted({t.rope.dim for t in tables.values()})
    kinds = [k for k in tables if k != "None"]
    return _Plan(module, "rotary", {"forward": _Call(module, _rotary_forward)}, ("posenc_rope", adapter),
                 note=f"format {_FORMAT_WORDS[fmt]}, rotary dim {'/'.join(map(str, dims))}"
                      + (f", one table per layer type: {', '.join(kinds)}" if kinds else "") + reading)


def _short_factors_kept(rope: RotaryEmbedding) -> RotaryEmbedding | None:
    """The second reading of a LongRoPE rule whose attention factor switches past the original context
    (Phi-3.5-MoE's ``short_mscale``/``long_mscale``): the short factors kept at every length, only the
    attention factor switching, which is what transformers' ``PhimoeRotaryEmbedding`` computes (the
    configuration's reading, LongRoPE's, switches the factors with it).  None for any other rule.  Used
    only where the module itself is reproduced by it (checked like the first)."""
    rule = rope.scaling
    if not (isinstance(rule, LongRopeScaling) and rule.long_attention_factor is not None
            and rule.long_factor != rule.short_factor):
        return None
    return RotaryEmbedding(rope.dim, max_seq_len=rope.max_seq_len, base=rope.base, layout=rope.layout,
                           scaling=dataclasses.replace(rule, long_factor=rule.short_factor), engine=rope.engine)


def _verify_rotary(module: torch.nn.Module, where: str, layer_type: str | None, table: _RotaryTables,
                   fmt: str | None, config: Any) -> str:
    """The module's output format, checked at every probe position; raises ValueError on disagreement."""
    rope = table.rope
    device = table.cos.device
    x = torch.zeros(1, 1, rope.dim, device=device)
    what = "" if layer_type is None else f" (layer_type={layer_type!r})"
    candidates = [fmt] if fmt is not None else list(_FORMATS)
    promised, table.assume_valid = table.assume_valid, False        # the probes go past the table
    try:
        return _verify_probes(module, where, layer_type, table, candidates, config, x, what)
    finally:
        table.assume_valid = promised


def _verify_probes(module: torch.nn.Module, where: str, layer_type: str | None, table: _RotaryTables,
                   candidates: list[str], config: Any, x: torch.Tensor, what: str) -> str:
    rope, device = table.rope, table.cos.device
    for i, positions in enumerate(_probe_positions(config)):
        positions = positions.to(device)
        try:
            want, twin = _call_original(module, x, positions, layer_type, config)
        except Exception as e:                      # noqa: BLE001 -- the module itself cannot go there
            if i == 0:
                raise ValueError(f"patch_model: {where}{what}: calling the module's own forward(x, position_ids) "
                                 f"failed ({type(e).__name__}: {e}); the model is left unpatched") from e
            continue
        with torch.no_grad():
            cos, sin = table(positions, torch.float32)
        scale = _angle_scale(twin, layer_type, rope)
        scores = {c: _compare(_to_format(cos, sin, c, torch.float32), want, scale, positions, rope.attention_factor)
                  for c in candidates}
        fine = [c for c in candidates if (score := scores[c]) is not None and score <= 1.0]
        if not fine:
            known = [s for s in scores.values() if s is not None]
            detail = f"the closest format is off by {min(known):.3g} times the allowance" if known else \
                "no format posenc knows has the module's output shape " + _shape_of(want)
            raise ValueError(
                f"patch_model: {where}{what}: posenc's cos/sin do not reproduce the module's own output at positions "
                f"{int(positions.min())}..{int(positions.max())} ({detail}; allowed: 8 + 16*|angle| float32 ulps, "
                f"transformers' own float32 rounding); the model is left unpatched"
            )
        candidates = fine[:1]
    return candidates[0]

def _check_one_axis(module: torch.nn.Module, where: str, config: Any, dim: int) -> None:
    """Refuse a module that reads several position axes (M-RoPE-style ``(A, B, S)`` position_ids) that
    the generic adapter would read as one."""
    layer_type = _layer_types(module, config)[0]
    t = torch.arange(3, 15).expand(2, -1)
    x = torch.zeros(1, 1, dim)
    for axes in (2, 3, 4):
        multi = torch.stack([t + 7 * a for a in range(axes)])                      # (A, B, S): distinct axes
        try:
            got, _ = _call_original(module, x, multi, layer_type, config)
            one, _ = _call_original(module, x, multi[0], layer_type, config)
        except Exception:                           # noqa: BLE001 -- one axis only: the contract
            continue
        outs = got if isinstance(got, (tuple, list)) else (got,)
        ones = one if isinstance(one, (tuple, list)) else (one,)
        # one axis: a leading axis is read as more batch; several: the axes collapse into one (B, S, d) result
        collapsed = len(outs) == len(ones) and all(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                                                   and a.shape == b.shape for a, b in zip(outs, ones, strict=True))
        if collapsed and not all(torch.equal(a, b) for a, b in zip(outs, ones, strict=True)):
            raise ValueError(f"patch_model: {where}: this rotary module reads {axes} position axes "
                             f"(position_ids of shape ({axes}, B, S)), which posenc's generic rotary adapter does not "
                             f"(multimodal RoPE needs an mrope_section in the configuration); the model is left "
                             f"unpatched")
