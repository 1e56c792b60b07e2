"""Vision towers' 2-D (and 3-D) rotary modules: the axial rule of Qwen2-VL's successors and Pixtral, and Llama 4's
fixed table of patch-grid angles; modules that lay per-axis angles out with their own
``recomposition_frequencies`` (MiniMax-M3-VL, Step3, SAM3, Gemma 4) are read by ``_recomposed``.  Each adapter
is verified against the module's own output before anything is changed; a module no reading reproduces stays
the model's own, and the record says why."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from posenc.core.rope import LinearScaling
from posenc.integrations.transformers._common import _ULP, _config_of
from posenc.integrations.transformers._recomposed import _plan_recomposed
from posenc.integrations.transformers._rotary import _rotary_forward, _to_format
from posenc.integrations.transformers._selfcheck import _call_original, _compare, _rope_freqs
from posenc.integrations.transformers._state import _Call, _Plan
from posenc.nn import RotaryEmbedding

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
    """An axial vision adapter verified against the module, else a per-axis one through the module's own layout
    step (:mod:`._recomposed`), or why there is none."""
    axial = _plan_axial_rule(module, model)
    if isinstance(axial, _Plan):
        return axial
    recomposed = _plan_recomposed(module, where, model)
    return recomposed if recomposed is not None else axial


def _plan_axial_rule(module: Any, model: torch.nn.Module) -> _Plan | str:
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
    return "posenc's axial cos/sin do not reproduce its output"


# ---- Llama 4's vision tower: one fixed table for its square patch grid and a class token ------------------------

class _GridTableAdapter(torch.nn.Module):
    """What a patched Llama 4 vision rotary module returns: posenc's exact ``cos + i sin`` of its patch grid, the
    columns' (x + 1) angles then the rows' (y + 1), patches row by row, then the class token (angle 0), shape
    ``(side**2 + 1, 1, 2F)``; built once, like the module's own table."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.freqs_ci = torch.nn.Buffer(table, persistent=False)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.freqs_ci.to(hidden_states.device)


def _grid_table(config: Any, device: Any, dtype: torch.dtype) -> torch.Tensor | str:
    """posenc's table for a Llama 4 vision configuration, or why it cannot be read."""
    params = getattr(config, "rope_parameters", None) or {}
    base = params.get("rope_theta") if isinstance(params, dict) else None
    image, patch = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    width, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if base is None or not (isinstance(image, int) and isinstance(patch, int) and isinstance(width, int)
                            and isinstance(heads, int) and min(image, patch, width, heads) > 0):
        return "its configuration does not give the base, image, patch and head sizes of a patch-grid table"
    side = image // patch
    try:
        rope = RotaryEmbedding(width // heads // 2, base=float(base), max_seq_len=side + 1, device=device)
    except (ValueError, TypeError) as e:
        return f"posenc cannot build its rule ({e})"
    cells = torch.arange(side * side, device=device)
    cos_x, sin_x = rope.cos_sin(cells % side + 1)
    cos_y, sin_y = rope.cos_sin(cells // side + 1)
    cos, sin = torch.cat([cos_x, cos_y], -1), torch.cat([sin_x, sin_y], -1)
    cos = torch.cat([cos, torch.ones_like(cos[:1])])                 # the class token: angle 0
    sin = torch.cat([sin, torch.zeros_like(sin[:1])])
    return torch.complex(cos, sin)[:, None, :].to(dtype)


def _plan_grid_table(module: Any, where: str, model: torch.nn.Module) -> _Plan | str:
    """A Llama 4 vision table adapter verified against the module's own table, or why there is none."""
    own = module.freqs_ci
    table = _grid_table(_config_of(module, model), own.device, own.dtype)
    if isinstance(table, str):
        return table
    if table.shape != own.shape:
        return f"posenc's patch-grid table has shape {tuple(table.shape)}, the module's {tuple(own.shape)}"
    side = int(round((own.shape[0] - 1) ** 0.5))
    allowed = (8.0 + 16.0 * (side + 1)) * _ULP
    if float((table - own).abs().max()) > allowed:
        return "posenc's patch-grid cos/sin do not reproduce its table"
    return _Plan(module, "axial", {"forward": _Call(module, _rotary_forward)}, ("posenc_rope", _GridTableAdapter(table)),
                 note=f"vision patch-grid RoPE ({side} x {side} patches and a class token)")
