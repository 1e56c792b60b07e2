"""Rotary modules that lay per-axis angles out with their own ``recomposition_frequencies``: vision towers
(MiniMax-M3-VL's three axes over part of the head, Step3, SAM3's scaled window coordinates, Gemma 4's
``H-H-W-W``) and text models whose module keeps one row of positions per axis (HunYuan-VL's M-RoPE, NeoMME's
two interleaved axes with one spectrum per layer type).

posenc computes the values (exact cos/sin of every coordinate, per axis); the module's own layout step places
them (in the models seen: concatenation, repetition, interleaving), and the scale and cast follow the module.
Each reading is verified against the module's own output before anything is changed, so a forward that does
anything else to the values is left as the model's own."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch

from posenc.integrations.transformers._common import _ULP, _config_of
from posenc.integrations.transformers._selfcheck import _rope_freqs
from posenc.integrations.transformers._state import _Call, _Plan
from posenc.nn import RotaryEmbedding


class _RecomposedAdapter(torch.nn.Module):
    """What a patched per-axis rotary module runs: posenc's exact cos/sin of every coordinate of
    ``position_ids`` (any number of axes, any shape; coordinates that are not integers, such as SAM3's scaled
    window positions, from float64 angles), each ``position_ids.shape + (F,)``, handed to the module's own
    ``recomposition_frequencies``, then scaled and cast as the module does.  ``ropes`` and ``scales`` are keyed
    by layer type (``"None"`` without layer types); ``orders`` holds, per layer type whose module keeps its
    frequencies in another order (ERNIE 4.5-VL pre-arranges height and width), which of posenc's frequencies
    each of its slots holds; ``axes``, for a text module, is how many rows of positions it makes of ``(B, S)``
    text positions (None: the positions are used as given)."""

    def __init__(self, ropes: dict[str, RotaryEmbedding], scales: dict[str, float], cast: bool,
                 axes: int | None = None, orders: dict[str, list[int]] | None = None) -> None:
        super().__init__()
        self.ropes = torch.nn.ModuleDict(ropes)
        self.scales, self.cast, self.axes = scales, cast, axes
        device = next(iter(ropes.values())).packed_table.device
        for key, order in (orders or {}).items():
            self.register_buffer(f"order_{key}", torch.tensor(order, device=device), persistent=False)

    def _ordered(self, t: torch.Tensor, key: str) -> torch.Tensor:
        order = self._buffers.get(f"order_{key}")
        return t if order is None else t.index_select(-1, order)

    def per_axis(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: Any = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        rope: RotaryEmbedding = self.ropes[str(layer_type)]  # type: ignore[assignment]
        if self.axes is not None and position_ids.dim() == 2:      # text positions (B, S): one row per axis
            position_ids = position_ids.expand(self.axes, -1, -1)
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        if position_ids.is_floating_point():        # scaled coordinates (SAM3's windows): angles in float64
            freqs = rope.inv_freq_table              # (float32 on a device without float64), on the tables' device
            angle = position_ids.to(freqs.dtype)[..., None] * freqs
            cos, sin = angle.cos().to(work), angle.sin().to(work)
        else:
            cos, sin = rope.cos_sin(position_ids.reshape(-1), dtype=work)
            shape = (*position_ids.shape, cos.shape[-1])
            cos, sin = cos.reshape(shape), sin.reshape(shape)
        key = str(layer_type)
        return self._ordered(cos, key), self._ordered(sin, key)

    def finish(self, cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor, layer_type: Any = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        scale = self.scales[str(layer_type)]
        if scale != 1.0:
            cos, sin = cos * scale, sin * scale
        return (cos.to(x.dtype), sin.to(x.dtype)) if self.cast else (cos, sin)


def _recomposed_forward(owner: Any, x: torch.Tensor, position_ids: torch.Tensor, layer_type: Any = None,
                        *args: Any, **kwargs: Any) -> Any:
    return _recompose(owner, owner._modules["posenc_rope"], x, position_ids, layer_type)


def _recompose(module: Any, adapter: _RecomposedAdapter, x: torch.Tensor, position_ids: torch.Tensor,
               layer_type: Any = None) -> Any:
    cos, sin = adapter.per_axis(x, position_ids, layer_type)
    recompose = type(module).recomposition_frequencies
    return adapter.finish(recompose(module, cos), recompose(module, sin), x, layer_type)


def _rules(module: Any, config: Any) -> dict[str, tuple[torch.Tensor, float, float]] | None:
    """Each layer type's (the module's inverse frequencies, base, attention scaling), or None where the
    configuration does not give them."""
    takes_type = "layer_type" in inspect.signature(type(module).forward).parameters
    named = sorted({t for t in (getattr(config, "layer_types", None) or []) if isinstance(t, str)})
    types: list[str | None] = list(named) if takes_type else []
    params = getattr(config, "rope_parameters", None) or {}
    rules = {}
    for layer_type in types or [None]:
        inv = getattr(module, f"{layer_type}_inv_freq" if layer_type else "inv_freq", None)
        if inv is None and layer_type:
            continue                                 # a layer type without rotary embedding
        own = params.get(layer_type) if layer_type and isinstance(params.get(layer_type), dict) else params
        base = own.get("rope_theta") if isinstance(own, dict) else getattr(config, "rope_theta", None)
        scale = getattr(module, f"{layer_type}_attention_scaling" if layer_type else "attention_scaling", 1.0)
        if not isinstance(inv, torch.Tensor) or inv.dim() != 1 or base is None \
                or not isinstance(scale, (int, float)) or isinstance(scale, bool):
            return None
        rules[str(layer_type)] = (inv, float(base), float(scale))
    return rules or None


def _order(inv: torch.Tensor, rope: RotaryEmbedding) -> list[int] | None:
    """Which of posenc's frequencies each of the module's slots holds (within float32 rounding), or None where
    they are not the same frequencies in some order."""
    mine = _rope_freqs(rope).tolist()
    order = []
    for f in inv.detach().double().cpu().tolist():
        j = min(range(len(mine)), key=lambda i: abs(mine[i] - f))
        if abs(mine[j] - f) > 1e-6 * mine[j]:
            return None
        order.append(j)
    return order if sorted(order) == list(range(len(mine))) else None


def _probes(axes: int, text: bool, device: Any) -> list[list[torch.Tensor]]:
    """Position readings to check, each a list of position tensors from 0, from 90 and from 1000, distinct per
    axis: for a vision tower, ``(axes, N)`` or ``(N, axes)`` (from 90 scaled by 0.4375: not integers); for a
    text module, one reading of both ``(B, S)`` positions (the module makes one row per axis) and
    ``(axes, B, S)`` ones."""
    n = 12
    starts = (0, 90, 1000)

    def distinct(start: int, dim: int) -> torch.Tensor:
        h = torch.arange(start, start + n, device=device)
        return torch.stack([(h * (2 * a + 3) + a) % (start + 17) for a in range(axes)], dim)

    if text:
        return [[torch.arange(s, s + n, device=device)[None, :] for s in starts] +
                [distinct(s, 0)[:, None, :] for s in starts]]
    return [[distinct(s, dim) * (0.4375 if s == 90 else 1) for s in starts] for dim in (0, -1)]


def _plan_recomposed(module: Any, where: str, model: torch.nn.Module, text: bool = False) -> _Plan | None:
    """A per-axis adapter for a module with a ``recomposition_frequencies`` layout step, verified against the
    module's own output on 2- and 3-axis positions (distinct per axis, up to ~1000; text modules also on
    ``(B, S)`` positions, for every layer type); None where no reading agrees."""
    if not callable(getattr(type(module), "recomposition_frequencies", None)):
        return None
    rules = _rules(module, _config_of(module, model))
    if rules is None:
        return None
    device = next(iter(rules.values()))[0].device
    try:
        ropes = {k: RotaryEmbedding(2 * inv.numel(), base=base, max_seq_len=64, device=device)
                 for k, (inv, base, _) in rules.items()}
    except (ValueError, TypeError):
        return None
    scales = {k: scale for k, (_, _, scale) in rules.items()}
    orders = {}
    for key, (inv, _, _) in rules.items():
        order = _order(inv, ropes[key])
        if order is None:
            return None
        if order != list(range(len(order))):
            orders[key] = order
    twin = copy.deepcopy(module)

    def own(x: torch.Tensor, positions: torch.Tensor, layer_type: str) -> Any:
        with torch.no_grad():
            return type(twin).forward(twin, x, positions) if layer_type == "None" else \
                type(twin).forward(twin, x, positions, layer_type)

    try:                                             # does the module hand back x's dtype?
        low = own(torch.zeros(1, device=device, dtype=torch.bfloat16),
                  torch.zeros((1, 4) if text else (2, 4), dtype=torch.long, device=device), next(iter(rules)))
        cast = low[0].dtype == torch.bfloat16
    except Exception:                                # noqa: BLE001 -- the readings below decide
        cast = False
    top = max(float(inv.max()) for inv, _, _ in rules.values())
    for axes in (2, 3):
        adapter = _RecomposedAdapter(ropes, scales, cast, axes if text else None, orders)
        for reading in _probes(axes, text, device):
            if _agrees(twin, adapter, own, reading, list(rules), top, max(abs(s) for s in scales.values())):
                kind, what = ("recomposed", "text") if text else ("axial", "vision")
                frequencies = ", ".join(str(inv.numel()) for inv, _, _ in rules.values())
                return _Plan(module, kind, {"forward": _Call(module, _recomposed_forward)}, ("posenc_rope", adapter),
                             note=f"{what} per-axis RoPE ({frequencies} frequencies per axis, the module's layout)")
    return None


def _agrees(twin: Any, adapter: _RecomposedAdapter, own: Any, reading: list[torch.Tensor], types: list[str],
            top: float, scale: float) -> bool:
    x = torch.zeros(1, device=reading[0].device)
    for layer_type in types:
        for positions in reading:
            try:
                want = own(x, positions, layer_type)
                with torch.no_grad():
                    got = _recompose(twin, adapter, x, positions, None if layer_type == "None" else layer_type)
            except Exception:                        # noqa: BLE001 -- another reading is tried
                return False
            if not (isinstance(want, tuple) and len(want) == 2 and all(
                    isinstance(w, torch.Tensor) and w.shape == g.shape for w, g in zip(want, got, strict=True))):
                return False
            allowed = (8.0 + 16.0 * (float(positions.max()) * top + 1.0)) * _ULP * max(scale, 1.0)
            if max(float((g.double() - w.double()).abs().max()) for g, w in zip(got, want, strict=True)) > allowed:
                return False
    return True
