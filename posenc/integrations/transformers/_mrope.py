"""Multimodal RoPE (Qwen2-VL and its successors' text models) and the axial 2-D RoPE of their vision towers."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from posenc.core import hf_config as core_hf_config
from posenc.core.rope import LinearScaling
from posenc.integrations.transformers._common import _ULP, _config_of, _rows, _silently
from posenc.integrations.transformers._rotary import _rotary_forward, _to_format
from posenc.integrations.transformers._selfcheck import (
    _call_original,
    _compare,
    _probe_positions,
    _rope_freqs,
    _shape_of,
)
from posenc.integrations.transformers._state import _Call, _Plan
from posenc.nn import MultimodalRotaryEmbedding, RotaryEmbedding

# ---- multimodal RoPE ----------------------------------------------------------------------------------------

class _HFMropeTables(torch.nn.Module):
    """posenc's M-RoPE for a Qwen2-VL-style text model, returning ``(B, S, d)`` cos/sin laid out as
    the model reads them (``[cos, cos]`` per row).  Its tables stay float32 under ``model.to(dtype)``."""

    def __init__(self, config: Any, assume_valid: bool) -> None:
        super().__init__()
        self.assume_valid = assume_valid
        with _silently():
            self.rope = MultimodalRotaryEmbedding.from_hf_config(config, max_seq_len=_rows(config))

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``(B, S, d)`` (``[cos, cos]`` per row) for transformers' axes-first ``(3, B, S)``
        positions (``(B, S)`` or ``(1, B, S)``: text)."""
        cos, sin = self.narrow(position_ids, dtype)
        return torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)

    def narrow(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``(B, S, d/2)``, the positions moved to posenc's axes-last ``(B, S, 3)``."""
        if position_ids.dim() == 2:
            position_ids = position_ids[None]
        position_ids = position_ids.expand(3, -1, -1).movedim(0, -1)                 # (B, S, 3)
        work = torch.float64 if dtype == torch.float64 else torch.float32
        cos, sin = self.rope.cos_sin(position_ids, dtype=work, assume_valid=self.assume_valid and
                                     work == torch.float32)
        return cos.to(dtype), sin.to(dtype)


class _MropeAdapter(torch.nn.Module):
    """What a patched multimodal rotary module runs: posenc's M-RoPE in the module's format."""

    def __init__(self, tables: _HFMropeTables, fmt: str) -> None:
        super().__init__()
        self.tables = tables
        self.fmt = fmt

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        cos, sin = self.tables.narrow(position_ids, x.dtype)
        return _to_format(cos, sin, self.fmt, x.dtype)


def _mrope_configs(module: Any, config: Any) -> list[dict[str, Any]]:
    """The configuration as the module reads it (its own ``mrope_section`` where the config has none,
    as transformers falls back to a default), with either order of the sections' slots."""
    cfg = core_hf_config.config_dict(config)
    key = "rope_parameters" if isinstance(cfg.get("rope_parameters"), dict) else "rope_scaling"
    params = dict(cfg.get(key) or {})
    if params.get("mrope_section") is None and getattr(module, "mrope_section", None) is not None:
        params["mrope_section"] = list(module.mrope_section)
    first = bool(params.get("mrope_interleaved", cfg.get("mrope_interleaved", False)))
    out = []
    for interleaved in (first, not first):
        out.append({**cfg, key: {**params, "mrope_interleaved": interleaved}})
    return out


def _plan_mrope(module: Any, where: str, model: torch.nn.Module, assume_valid: bool) -> _Plan:
    config = _config_of(module, model)
    device = next((b.device for b in module.buffers()), torch.device("cpu"))
    failures: list[str] = []
    for cfg in _mrope_configs(module, config):
        order = "interleaved" if cfg.get("rope_parameters", cfg.get("rope_scaling", {}))["mrope_interleaved"] \
            else "contiguous"
        try:
            tables = _HFMropeTables(cfg, assume_valid).to(device)
        except (ValueError, TypeError, KeyError) as e:
            failures.append(f"{order} sections: posenc cannot read the configuration: {e}")
            continue
        fmt, problem = _verify_mrope(module, tables, config)
        if fmt is not None:
            return _Plan(module, "mrope", {"forward": _Call(module, _rotary_forward)},
                         ("posenc_rope", _MropeAdapter(tables, fmt)), note=f"multimodal, rotary dim {tables.rope.dim}")
        failures.append(f"{order} sections: {problem}")
    raise ValueError(f"patch_model: {where}: posenc's multimodal cos/sin do not reproduce the module's own output "
                     f"({'; '.join(failures)}); the model is left unpatched")


def _verify_mrope(module: torch.nn.Module, tables: _HFMropeTables, config: Any) -> tuple[str | None, str]:
    """The module's output format, or None and what disagreed."""
    problem = ""
    for fmt in ("doubled", "repeated", "narrow"):
        problem = _verify_mrope_format(module, tables, config, fmt) or ""
        if not problem:
            return fmt, ""
    return None, problem


def _verify_mrope_format(module: torch.nn.Module, tables: _HFMropeTables, config: Any, fmt: str) -> str | None:
    rope, device = tables.rope, next((b.device for b in tables.buffers()), torch.device("cpu"))
    x = torch.zeros(1, 1, 2 * rope.dim, device=device)
    promised, tables.assume_valid = tables.assume_valid, False            # the probes go past the table
    try:
        for base in _probe_positions(config):
            t = base.to(device)
            positions = torch.stack([t, t // 2 + 1, t % 7 + t // 3])                 # (3, B, S): distinct axes
            try:
                want, _ = _call_original(module, x, positions, None, config)
            except Exception as e:                      # noqa: BLE001 -- the module itself cannot go there
                if int(base.min()) == 0:
                    return f"calling the module's own forward(x, position_ids) failed ({type(e).__name__}: {e})"
                continue
            with torch.no_grad():
                got = _to_format(*tables.narrow(positions, torch.float32), fmt, torch.float32)
            top = max((float(f) for f in getattr(rope, "_freqs", ())), default=1.0)
            half = rope.dim // 2
            score = _compare(got, want, np.full(half, top), positions.amax(0), 1.0)
            if score is None or score > 1.0:
                return (f"at positions "
                        f"{int(positions.min())}..{int(positions.max())} "
                        + (f"the output shape is {_shape_of(want)}" if score is None else
                           f"off by {score:.3g} times the allowance"))
        return None
    finally:
        tables.assume_valid = promised


# ---- vision towers: axial 2-D RoPE (Qwen2-VL's and its successors' vision encoders) -------------------------

class _AxialAdapter(torch.nn.Module):
    """What a patched axial vision rotary module runs: exact cos/sin of the row and column positions
    (``(N, 2)``, or ``(2, N)`` with ``axes_first``), side by side (``[rows | columns]``), in the
    module's format.  ``columns`` is the columns' rule where it differs from the rows' (Pixtral gives
    the rows the even frequencies of the head and the columns the odd ones), else None."""

    def __init__(self, rope: RotaryEmbedding, fmt: str, axes_first: bool,
                 columns: RotaryEmbedding | None = None) -> None:
        super().__init__()
        self.rope = rope
        self.columns = columns
        self.fmt = fmt
        self.axes_first = axes_first

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if "columns" not in self._modules and "columns" not in vars(self):   # (saved by an earlier posenc)
            self.columns = None

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        rows, cols = (position_ids[0], position_ids[1]) if self.axes_first else (position_ids[..., 0],
                                                                                 position_ids[..., 1])
        c_h, s_h = self.rope.cos_sin(rows, dtype=work)                             # (N, d/4) each
        c_w, s_w = (self.rope if self.columns is None else self.columns).cos_sin(cols, dtype=work)
        return _to_format(torch.cat([c_h, c_w], -1), torch.cat([s_h, s_w], -1), self.fmt, x.dtype)


def _plan_axial(module: Any, where: str, model: torch.nn.Module) -> _Plan | str:
    """An axial vision adapter verified against the module, or why there is none."""
    config = _config_of(module, model)
    params = getattr(config, "rope_parameters", None) or {}
    base = params.get("rope_theta") if isinstance(params, dict) else None
    base = base if base is not None else getattr(config, "rope_theta", None)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "num_heads", None)
    width = getattr(config, "embed_dim", None) or getattr(config, "hidden_size", None)
    dim = getattr(config, "head_dim", None) or (width // heads if width and heads else None)
    inv = getattr(module, "inv_freq", None)
    if base is None or not isinstance(dim, int) or not isinstance(inv, torch.Tensor) or dim % 4:
        return "its configuration does not give the base and head dim of an axial rule"
    device = inv.device
    try:
        rope = RotaryEmbedding(dim // 2, base=float(base), max_seq_len=64, device=device)
        # the columns at the head's odd frequencies base^(-(4j + 2) / dim): the rows' divided by base^(2 / dim)
        odd = RotaryEmbedding(dim // 2, base=float(base), max_seq_len=64, device=device,
                              scaling=LinearScaling(float(base) ** (2.0 / dim)))
    except (ValueError, TypeError) as e:
        return f"posenc cannot build its rule ({e})"
    readings = ((f, a, c) for c in (None, odd) for a in (False, True) for f in ("doubled", "narrow", "repeated"))
    for fmt, axes_first, columns in readings:
        adapter = _AxialAdapter(rope, fmt, axes_first, columns)
        ok = True
        for start in (0, 90, 1000):
            h = torch.arange(start, start + 12, device=device)
            positions = torch.stack([h, (h * 5 + 3) % (start + 17)], 0 if axes_first else -1)   # distinct axes
            x = torch.zeros(12, dim, device=device)
            try:
                want, _ = _call_original(module, x, positions, None, config)
            except Exception as e:                  # noqa: BLE001 -- reported as the reason
                return f"calling its own forward(x, position_ids) failed ({type(e).__name__})"
            try:
                with torch.no_grad():
                    got = adapter(x, positions)
            except (ValueError, TypeError, IndexError) as e:
                return f"posenc's axial rule cannot take its positions ({type(e).__name__})"
            scale = np.full(dim // 2, float(_rope_freqs(rope).max()))
            score = _compare(got, want, scale, positions.amax(0 if axes_first else -1), 1.0)
            if score is None or score > 1.0:
                ok = False
                break
        if ok:
            return _Plan(module, "axial", {"forward": _Call(module, _rotary_forward)}, ("posenc_rope", adapter),
                         note=f"vision axial RoPE, head dim {dim}")
    recomposed = _plan_recomposed(module, where, model, config, inv)
    return recomposed if recomposed is not None else "posenc's axial cos/sin do not reproduce its output"


# ---- vision towers whose module recomposes per-axis angles (MiniMax-M3-VL, Step3, SAM3, Gemma 4, ...) --------

class _RecomposedAdapter(torch.nn.Module):
    """What a patched per-axis vision rotary module runs: posenc's exact cos/sin of every coordinate of
    ``position_ids`` (any number of axes, any shape; coordinates that are not integers, such as SAM3's scaled
    window positions, from float64 angles), each ``position_ids.shape + (F,)``, handed to the module's
    own ``recomposition_frequencies`` (which only lays the per-axis values out: concatenation, repetition,
    interleaving), then scaled and cast as the module does.  The values are posenc's, the layout the module's."""

    def __init__(self, rope: RotaryEmbedding, scale: float, cast: bool) -> None:
        super().__init__()
        self.rope, self.scale, self.cast = rope, scale, cast

    def per_axis(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        if position_ids.is_floating_point():        # scaled coordinates (SAM3's windows): angles in float64
            wide = torch.float32 if position_ids.device.type == "mps" else torch.float64
            freqs = torch.tensor([float(f) for f in self.rope._freqs], dtype=wide, device=position_ids.device)
            angle = position_ids.to(wide)[..., None] * freqs
            return angle.cos().to(work), angle.sin().to(work)
        cos, sin = self.rope.cos_sin(position_ids.reshape(-1), dtype=work)
        shape = (*position_ids.shape, cos.shape[-1])
        return cos.reshape(shape), sin.reshape(shape)

    def finish(self, cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.scale != 1.0:
            cos, sin = cos * self.scale, sin * self.scale
        return (cos.to(x.dtype), sin.to(x.dtype)) if self.cast else (cos, sin)


def _recomposed_forward(owner: Any, x: torch.Tensor, position_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    return _recompose(owner, owner._modules["posenc_rope"], x, position_ids)


def _recompose(module: Any, adapter: _RecomposedAdapter, x: torch.Tensor, position_ids: torch.Tensor) -> Any:
    cos, sin = adapter.per_axis(x, position_ids)
    recompose = type(module).recomposition_frequencies
    return adapter.finish(recompose(module, cos), recompose(module, sin), x)


def _plan_recomposed(module: Any, where: str, model: torch.nn.Module, config: Any, inv: torch.Tensor) -> _Plan | None:
    """A per-axis adapter for a module with a ``recomposition_frequencies`` layout step, verified against the
    module's own output on 2- and 3-axis positions (distinct per axis, up to ~1000); None where it does not agree."""
    if not callable(getattr(type(module), "recomposition_frequencies", None)) or inv.dim() != 1:
        return None
    params = getattr(config, "rope_parameters", None) or {}
    base = params.get("rope_theta") if isinstance(params, dict) else getattr(config, "rope_theta", None)
    scale = getattr(module, "attention_scaling", 1.0)
    if base is None or not isinstance(scale, (int, float)) or isinstance(scale, bool):
        return None
    device = inv.device
    try:
        rope = RotaryEmbedding(2 * inv.numel(), base=float(base), max_seq_len=64, device=device)
    except (ValueError, TypeError):
        return None
    twin = copy.deepcopy(module)
    try:                                             # does the module hand back x's dtype?
        with torch.no_grad():
            low = type(twin).forward(twin, torch.zeros(1, device=device, dtype=torch.bfloat16),
                                     torch.zeros(2, 4, dtype=torch.long, device=device))
        cast = low[0].dtype == torch.bfloat16
    except Exception:                                # noqa: BLE001 -- the readings below decide
        cast = False
    adapter = _RecomposedAdapter(rope, float(scale), cast)
    for axes in (2, 3):
        for axes_first in (True, False):
            n = 12
            shape = (axes, n) if axes_first else (n, axes)
            worst = 0.0
            for start in (0, 90, 1000):
                h = torch.arange(start, start + n, device=device)
                columns = [(h * (2 * a + 3) + a) % (start + 17) for a in range(axes)]
                positions = torch.stack(columns, 0 if axes_first else -1).reshape(shape)
                if start == 90:                      # scaled coordinates too (not integers)
                    positions = positions * 0.4375
                x = torch.zeros(1, device=device)
                try:
                    with torch.no_grad():
                        want = type(twin).forward(twin, x, positions)
                        got = _recompose(twin, adapter, x, positions)
                except Exception:                    # noqa: BLE001 -- another reading is tried
                    worst = float("inf")
                    break
                if not (isinstance(want, tuple) and len(want) == 2 and all(
                        isinstance(w, torch.Tensor) and w.shape == g.shape for w, g in zip(want, got, strict=True))):
                    worst = float("inf")
                    break
                angle = float(positions.max()) * float(inv.max()) + 1.0
                allowed = (8.0 + 16.0 * angle) * _ULP * max(abs(float(scale)), 1.0)
                worst = max(worst, max(float((g.double() - w.double()).abs().max()) for g, w in zip(got, want,
                                                                                                    strict=True))
                            / allowed)
            if worst <= 1.0:
                return _Plan(module, "axial", {"forward": _Call(module, _recomposed_forward)}, ("posenc_rope", adapter),
                             note=f"vision per-axis RoPE ({inv.numel()} frequencies per axis, the module's layout)")
    return None
