"""The self-check of a rotary module: the positions it is probed at, the module it is compared with (itself,
or a fresh copy when the model was cast or a dynamic-NTK module has grown), and the allowance: ``8 + 16 *
|angle|`` float32 ulps of the value's scale, as transformers computes ``position * inv_freq`` in float32."""

from __future__ import annotations

import contextlib
import copy
from typing import Any, cast

import numpy as np
import torch

from posenc.integrations.transformers._common import _ULP
from posenc.nn import RotaryEmbedding


def _probe_positions(config: Any) -> list[torch.Tensor]:
    """Position batches ``(2, n)`` near 0, around the original and extended context, and past it."""
    length = int(getattr(config, "max_position_embeddings", 0) or 4096)
    length = min(length, 1 << 20)
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(params, dict) and any(isinstance(v, dict) for v in params.values()):
        params = next(v for v in params.values() if isinstance(v, dict))
    original = params.get("original_max_position_embeddings") if isinstance(params, dict) else None
    original = int(original or getattr(config, "original_max_position_embeddings", 0) or length)
    starts = sorted({0, max(original - 6, 0), max(length - 6, 0), 3 * length + 5})
    return [torch.stack([torch.arange(s, s + 12), torch.arange(s + 3, s + 15)]) for s in starts]


def _host(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as a float64 (or complex128) NumPy array on the host: the patch-time checks
    compute there, so that they run on devices without float64 (Apple's MPS) too."""
    t = t.detach().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()                                                   # exact; NumPy has no bfloat16
    a = t.numpy()
    return a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)


def _rope_freqs(rope: RotaryEmbedding) -> np.ndarray:
    """posenc's frequencies (its length-independent ones) as a host float64 array."""
    return np.array([float(f) for f in rope._freqs], dtype=np.float64)


def _angle_scale(copy_module: torch.nn.Module, layer_type: str | None, rope: RotaryEmbedding) -> np.ndarray:
    """Inverse frequencies ``(dim/2,)`` bounding the angles the module used (its own buffer after the
    call, which length-dependent rules update; posenc's otherwise)."""
    ours = _rope_freqs(rope)
    for name in (f"{layer_type}_inv_freq", "inv_freq"):
        buf = getattr(copy_module, name, None)
        if isinstance(buf, torch.Tensor) and buf.numel() == rope.dim // 2:
            return np.maximum(np.abs(_host(buf)).reshape(-1), ours)
    return np.full(rope.dim // 2, float(ours.max()))


def _grown(module: torch.nn.Module) -> int | None:
    """The length a dynamic-NTK module remembers from earlier calls when it is past its original one
    (transformers keeps the frequencies of the longest sequence seen until a shorter one than the
    original context comes), else None."""
    original = vars(module).get("original_max_seq_len")
    if original is None:
        return None
    longest = None
    for name, value in vars(module).items():
        if name.endswith("max_seq_len_cached"):
            with contextlib.suppress(TypeError, ValueError, RuntimeError):
                if int(value) > int(original):
                    longest = max(longest or 0, int(value))
    return longest


def _reference(module: torch.nn.Module, config: Any = None) -> torch.nn.Module:
    """The module to compare with: the module itself, or a float32 one in its initial state built afresh
    from its configuration when the model was cast (``model.to(torch.bfloat16)`` rounds its frequency
    buffers: the cast model's frequencies are a rounding of the fresh ones) or when a dynamic-NTK module
    remembers a longer sequence from earlier calls (posenc keeps no such state: it compares with the
    module as loaded)."""
    low = [b for b in module.buffers() if b.is_floating_point() and b.dtype not in (torch.float32, torch.float64)]
    if not low and _grown(module) is None:
        return module
    cached = vars(module).get("_posenc_reference")
    if cached is not None:
        return cast(torch.nn.Module, cached[0])
    fresh: torch.nn.Module = module
    config = getattr(module, "config", None) if getattr(module, "config", None) is not None else config
    if config is not None:
        for make in (lambda: type(module)(config=config), lambda: type(module)(config)):
            try:
                built = make().to(next((b.device for b in module.buffers()), torch.device("cpu")))
            except Exception:                           # noqa: BLE001 -- another constructor, or none
                continue
            if all(not b.is_floating_point() or b.dtype in (torch.float32, torch.float64) for b in built.buffers()):
                fresh = built.eval()
                break
    if fresh is module and not low:
        raise ValueError(f"patch_model: {type(module).__name__} remembers a sequence of {_grown(module)} positions "
                         f"from earlier calls (transformers' dynamic NTK keeps the frequencies of the longest one), "
                         f"and posenc, which keeps no such state, could not build the module afresh from its "
                         f"configuration to compare with; patch the model before running it, or reload it")
    object.__setattr__(module, "_posenc_reference", (fresh,))      # for this patch_model call only
    return fresh


def _call_original(module: torch.nn.Module, x: torch.Tensor, positions: torch.Tensor, layer_type: str | None,
                   config: Any = None) -> Any:
    twin = copy.deepcopy(_reference(module, config))              # the module's own state stays as it was
    with torch.no_grad():
        out = type(twin).forward(twin, x, positions) if layer_type is None else \
            type(twin).forward(twin, x, positions, layer_type)
    return out, twin


def _compare(got: Any, want: Any, scale: np.ndarray, positions: torch.Tensor, factor: float) -> float | None:
    """Largest difference over its allowance (<= 1 passes); None when the shapes or kinds differ."""
    wants = want if isinstance(want, (tuple, list)) else (want,)
    gots = got if isinstance(got, (tuple, list)) else (got,)
    if len(wants) != len(gots):
        return None
    worst = 0.0
    for g, w in zip(gots, wants, strict=True):
        if not isinstance(w, torch.Tensor) or g.shape != w.shape or g.is_complex() != w.is_complex():
            return None
        angle = _host(positions)[..., None] * scale                                # (B, S, dim/2)
        cols = w.shape[-1]
        if cols == 2 * angle.shape[-1]:
            angle = np.concatenate([angle, angle], -1)    # the allowance: the same for either doubling
            swapped = angle.reshape(*angle.shape[:-1], 2, -1).swapaxes(-1, -2).reshape(angle.shape)
            angle = np.maximum(angle, swapped)
        if cols != angle.shape[-1]:
            return None
        allowed = (8.0 + 16.0 * np.abs(angle)) * _ULP * max(abs(factor), 1.0)
        diff = np.abs(_host(g) - _host(w))
        worst = max(worst, float((diff / allowed.reshape(diff.shape)).max()))
    return worst

def _shape_of(out: Any) -> str:
    if isinstance(out, (tuple, list)):
        return "(" + ", ".join(_shape_of(o) for o in out) + ")"
    return str(tuple(out.shape)) if isinstance(out, torch.Tensor) else type(out).__name__
