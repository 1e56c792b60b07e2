"""Multimodal RoPE (Qwen2-VL and its successors' text models)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from posenc.core import hf_config as core_hf_config
from posenc.integrations.transformers._common import _config_of, _rows, _silently
from posenc.integrations.transformers._rotary import _rotary_forward, _to_format
from posenc.integrations.transformers._selfcheck import (
    _call_original,
    _compare,
    _probe_positions,
    _shape_of,
)
from posenc.integrations.transformers._state import _Call, _Plan
from posenc.nn import MultimodalRotaryEmbedding

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
