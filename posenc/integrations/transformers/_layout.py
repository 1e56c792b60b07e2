"""The pair layout a model's own rotate function mixes, found by calling it on unit vectors."""

from __future__ import annotations

import inspect
import sys

import torch

from posenc.integrations.transformers._common import _check_module, _config_of, _layer_types
from posenc.integrations.transformers._selfcheck import _call_original

_ROTATE_FUNCTIONS = ("apply_rotary_pos_emb", "apply_rotary_emb", "apply_rotary_pos_emb_interleave")


def rotation_layout(module: torch.nn.Module, model: torch.nn.Module | None = None) -> tuple[str | None, str]:
    """The feature pairs the model's own code rotates with the output of rotary ``module``.

    Calls the rotate function of the module's modeling code (``apply_rotary_pos_emb`` or
    ``apply_rotary_emb``) on the unit vectors, with the module's own cos/sin (unpatched) at one
    position, and reads which feature each one is mixed with: ``(i, i + d/2)`` is ``"half"``,
    ``(2i, 2i + 1)`` is ``"interleaved"``.

    Returns:
        ``(layout, function name)``, or ``(None, why)`` when no rotate function could be called.
    """
    _check_module(module, "module")
    if model is not None:
        _check_module(model)
    code = sys.modules.get(type(module).__module__)
    config = _config_of(module, model if model is not None else module)
    layer_type = _layer_types(module, config)[0] if config is not None else None
    try:
        out, _ = _call_original(module, torch.zeros(1, 1, 8), torch.tensor([[3]]), layer_type, config)
    except Exception as e:                          # noqa: BLE001 -- reported, not raised
        return None, f"the module's own forward failed ({type(e).__name__})"
    outs = out if isinstance(out, (tuple, list)) else (out,)
    width = int(outs[0].shape[-1])
    names = list(_ROTATE_FUNCTIONS)
    if getattr(config, "rope_interleave", False):              # DeepSeek: the attention picks by this flag
        names.insert(0, names.pop(names.index("apply_rotary_pos_emb_interleave")))
    for name in names:
        fn = getattr(code, name, None)
        if not callable(fn):
            continue
        params = list(inspect.signature(fn).parameters)
        for dim in (width, 2 * width):
            q = torch.eye(dim).reshape(1, 1, dim, dim)            # unit vectors, one per row
            try:
                if len(outs) == 1:
                    rotated = fn(q, q, outs[0])
                elif len(params) > 1 and params[1] in ("sin", "cos"):
                    rotated = fn(q, *outs)
                else:
                    rotated = fn(q, q, *outs)
            except Exception:                       # noqa: BLE001 -- another width or calling convention
                continue
            rotated = rotated[0] if isinstance(rotated, (tuple, list)) else rotated
            if rotated.shape[-2:] != (dim, dim):
                continue
            layout = _pairs(rotated.reshape(dim, dim).detach().cpu().float())
            if layout is not None:
                return layout, name
    return None, "no rotate function of the modeling code could be called"


def _pairs(rotated: torch.Tensor) -> str | None:
    """``"half"`` or ``"interleaved"`` from the rotated unit vectors (row j: where e_j went).  Two input
    features are paired when their images share support (which also holds when the function permutes
    the features on the way, as DeepSeek's interleaved path does)."""
    mixed = rotated.abs() @ rotated.abs().T
    mixed.fill_diagonal_(0.0)
    rows = [j for j in range(mixed.shape[0]) if bool(mixed[j].abs().max() > 0)]
    if not rows:
        return None
    partner = {j: int(mixed[j].abs().argmax()) for j in rows}
    rot, width = len(rows), mixed.shape[0]
    if all(partner[j] == j ^ 1 for j in rows):
        return "interleaved"
    if all(partner[j] == (j + rot // 2) % rot for j in rows):
        return "half"                                 # the first rot features rotate (a partial rotary dim)
    if all(partner[j] == (j + width // 2) % width for j in rows):
        return "half"                                 # pairs across the whole head, some of zero frequency
    return None
