"""``patch_model`` and its companions: the walk over a model's modules, the adapter each needs, and the one
INFO record of a call."""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from posenc import _validate
from posenc._deprecate import UNSET
from posenc._torch.engine_choice import engine_from_backend
from posenc._torch.rope_call import promise
from posenc.core import hf_config as core_hf_config
from posenc.integrations.transformers._bias import (
    _plan_bloom,
    _plan_bucket_method,
    _plan_clipped,
    _plan_mpnet,
    _plan_mpt,
    _plan_t5,
    bucket_method,
)
from posenc.integrations.transformers._common import _PATCH, _check_module, _config_of, _log, _mrope_section, _rope_type
from posenc.integrations.transformers._mrope import _MropeAdapter, _plan_mrope
from posenc.integrations.transformers._recomposed import _plan_recomposed
from posenc.integrations.transformers._rotary import _plan_rotary, _RotaryAdapter
from posenc.integrations.transformers._stand_in import _plan_fast_rotation
from posenc.integrations.transformers._state import _is_patched, _Plan, _unpatch_module
from posenc.integrations.transformers._vision import _plan_axial, _plan_grid_table

# ---- the public entry points ------------------------------------------------------------------------------

def patch_model(model: torch.nn.Module, *, engine: str | None = "auto", assume_valid: bool = False, backend: str = UNSET,
                assume_in_table: bool = UNSET) -> torch.nn.Module:
    """Make ``model`` compute its positional encoding with posenc, in place; returns ``model``.

    Every module of ``model`` that holds a position rule is found (a rotary module following
    transformers' contract, multimodal RoPE, ALiBi, a T5-style relative bias), posenc's version of
    it is built and compared with the module's own output (see the package docstring: near 0 to a few
    float32 ulps, further out within transformers' own float32 angle error); only when every one
    agrees is anything changed.  Wrappers (vision-language models, encoder-decoders) have their
    text, vision and decoder parts patched alike.  Patching twice, or patching a model whose
    submodel is already patched, leaves the patched parts as they are.

    The pair layout the model's own code rotates with and the rotary dims are logged at ``INFO``
    level on the ``"posenc"`` logger.  Patching changes the encoding only, never the weights.

    Args:
        model: a loaded transformers model (any head, or a submodel such as ``model.model``).
        engine: ``"auto"`` (the default), ``"torch"`` or ``"triton"``: where the model's rotate
            function (``apply_rotary_pos_emb(q, k, cos, sin)``, or one that takes ``(x, cos, sin)``,
            of its modeling code) is recognised and reproduced by posenc's engine on random q and k,
            that function rotates q and k with posenc's engine for the cos/sin of patched models:
            the torch engine (checked to give the model's own results bit for bit, in fewer
            calls), or with ``"triton"`` (``"auto"`` on CUDA with Triton) posenc's Triton kernel
            (checked within 1e-5 in float32).  Calls with other cos/sin, and traced calls under
            ``torch.compile``, run the model's own function; where the function is not recognised,
            cos/sin only (logged at INFO).  ``None``: posenc supplies cos/sin and the model's own
            code always rotates q and k.
        backend: the old name of ``engine`` (deprecated; it still works for now).
        assume_valid: for RoPE models, promise that every position lies below the rotary tables'
            rows (``min(max_position_embeddings, 16384)``) and that no length-dependent rule needs
            the current length: cos/sin are then looked up without reading the positions back
            from the device (what ``torch.compile(fullgraph=True)`` and CUDA graphs need).  The
            lookup stays bounds-checked.  Without it, each forward reads the positions' range
            once, and under ``torch.compile`` the values are computed exactly instead.
        assume_in_table: the old name of ``assume_valid`` (deprecated; it still works for now).

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
        ValueError: no positional module was found, or one posenc cannot reproduce (its
            configuration cannot be read exactly, or the self-check disagrees); the message names the
            module and why, and the model is left unchanged.
    """
    if backend is not UNSET:                 # the old name of engine=
        engine = engine_from_backend("patch_model", backend, engine)
    if assume_in_table is not UNSET:
        assume_valid = promise("patch_model", assume_in_table, assume_valid)
    _patch(model, assume_valid, engine)
    return model


def unpatch_model(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`patch_model` on every patched module inside ``model`` (a no-op where nothing is
    patched); returns ``model``.  Unpatching a submodel, or the whole model, in any order is safe."""
    _check_module(model)
    for module in list(model.modules()):
        _unpatch_module(module)
    return model


def is_patched(model: torch.nn.Module) -> bool:
    """Whether any module inside ``model`` is patched by :func:`patch_model`."""
    _check_module(model)
    return any(_is_patched(m) for m in model.modules())


@contextlib.contextmanager
def patched(model: torch.nn.Module, *, engine: str | None = "auto", assume_valid: bool = False, backend: str = UNSET,
            assume_in_table: bool = UNSET) -> Iterator[torch.nn.Module]:
    """``with patched(model): ...`` runs the block with ``model`` patched, and restores after it
    exactly the modules it patched (a model that was patched already stays patched).
    ``engine`` and ``assume_valid`` as for :func:`patch_model` (``assume_in_table`` is the deprecated old
    name of ``assume_valid``)."""
    if backend is not UNSET:                 # the old name of engine=
        engine = engine_from_backend("patched", backend, engine)
    if assume_in_table is not UNSET:
        assume_valid = promise("patched", assume_in_table, assume_valid)
    done = _patch(model, assume_valid, engine)
    try:
        yield model
    finally:
        for module in done:
            _unpatch_module(module)

def _patch(model: torch.nn.Module, assume_valid: bool, engine: str | None = None) -> list[torch.nn.Module]:
    """Verify and apply; returns the modules newly patched."""
    _check_module(model)
    try:
        return _verify_and_apply(model, assume_valid, engine)
    finally:
        for module in model.modules():
            vars(module).pop("_posenc_reference", None)


def _verify_and_apply(model: torch.nn.Module, assume_valid: bool, engine: str | None) -> list[torch.nn.Module]:
    _check_module(model)
    _validate.check_bool("assume_valid", assume_valid)
    if engine is not None and engine not in ("auto", "torch", "triton"):
        raise ValueError(f"engine must be None (cos/sin only), 'auto', 'torch' or 'triton', got {engine!r}")
    plans: list[_Plan] = []
    left: list[str] = []                                     # modules left as the model's own, and why
    found = 0
    kinds: set[str] = set()
    for path, module in model.named_modules():
        kind = _kind(module, model)
        if kind is None:
            continue
        found += 1
        kinds.add(kind)
        if _is_patched(module):
            continue
        where = f"{type(model).__name__}.{path}" if path else type(model).__name__
        if kind in ("vision", "grid_table"):
            vision = (_plan_axial if kind == "vision" else _plan_grid_table)(module, where, model)
            if isinstance(vision, str) and kind == "vision":
                with contextlib.suppress(ValueError):       # a vision tower's 1-D rotary over its token sequence
                    vision = _plan_rotary(module, where, model, assume_valid)    # (DeepSeek-OCR 2's encoder)
                    if engine is not None:
                        _plan_fast_rotation(vision, where, engine)
            if isinstance(vision, str):
                left.append(f"{where}, a vision tower's 2-D rotary module, is left as the model's own ({vision})")
            else:
                plans.append(vision)
            continue
        try:
            plan = _PLANNERS[kind](module, where, model, assume_valid)
        except ValueError:
            recomposed = _plan_recomposed(module, where, model, text=True)   # the module's own layout step
            if recomposed is None:
                raise
            plans.append(recomposed)
            continue
        if engine is not None and isinstance(plan.submodule[1] if plan.submodule else None, _RotaryAdapter):
            _plan_fast_rotation(plan, where, engine)
        plans.append(plan)
    if not found:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        unknown = sorted({type(m).__name__ for m in model.modules()
                          if any(_RELATIVE_BIAS.match(n) for n in [*m._modules, *m._parameters])})
        held = (f"; it holds relative position biases of another contract ({', '.join(unknown)}), which posenc has "
                f"no adapter for, so they stay the model's own") if unknown else \
            "; models with learned or sinusoidal absolute positions have nothing to patch"
        raise ValueError(
            f"patch_model found no positional module in {type(model).__name__} (model_type={model_type!r}): no rotary "
            f"module following transformers' contract (forward(x, position_ids) returning (cos, sin)), no ALiBi and no "
            f"T5-style relative bias" + held
        )
    if getattr(getattr(model, "config", None), "alibi", False) is True and not kinds & {"bloom", "mpt"}:
        raise ValueError(
            f"patch_model: {type(model).__name__} (alibi=True) builds its ALiBi bias with a module-level function of "
            f"its modeling code (Falcon), which posenc does not patch (its rotary module is unused then); the model "
            f"is left unpatched")
    for plan in plans:
        plan.apply()
    _log_plans(model, plans, left)
    return [p.module for p in plans]


def _kind(module: torch.nn.Module, model: torch.nn.Module) -> str | None:
    """Which adapter a module needs, or None for modules without a position rule of their own."""
    cls = type(module)
    if _is_patched(module):
        return str(vars(module)[_PATCH].kind)
    if hasattr(cls, "build_alibi_tensor"):
        return "bloom"
    if hasattr(cls, "build_mpt_alibi_tensor"):
        return "mpt"
    if hasattr(cls, "compute_bias") and getattr(module, "has_relative_attention_bias", False) \
            and hasattr(module, "relative_attention_bias"):
        params = list(inspect.signature(cls.compute_bias).parameters)
        return "t5" if params[1:3] == ["query_length", "key_length"] else None
    if hasattr(cls, "compute_position_bias") and hasattr(module, "relative_attention_bias") \
            and list(inspect.signature(cls.compute_position_bias).parameters)[1:4] == ["x", "position_ids", "num_buckets"]:
        return "mpnet"                               # MPNet: T5's bidirectional buckets under another name
    if bucket_method(cls) is not None:
        return "buckets"                             # T5's buckets in a method of the module's own (LayoutLMv3)
    if isinstance(getattr(module, "bias_values", None), torch.nn.Embedding) and isinstance(
            getattr(module, "max_distance", None), int) and isinstance(getattr(module, "symmetric", None), bool):
        return "clipped"                             # a learned table of clipped distances (Phi-4's audio)
    if not ("Rotary" in cls.__name__ and callable(getattr(cls, "forward", None))):
        return None
    try:
        params = list(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError):
        return None
    table = getattr(module, "freqs_ci", None)
    if params[1:] == ["hidden_states"] and isinstance(table, torch.Tensor) and table.is_complex():
        return "grid_table"                         # Llama 4's vision tower: a fixed table of its patch grid
    if params[1:3] != ["x", "position_ids"]:
        return None
    if _config_of(module, model) is None:
        return None
    # (a vision-language model's text part, "...VisionText...", is not a vision tower)
    if "Vision" in cls.__name__.replace("VisionText", "") or _rope_type(_config_of(module, model)) == "axial":
        return "vision"                             # 2-D rotary of a vision tower: left as the model's
    return "mrope" if _mrope_section(module, model) is not None else "rotary"

#: the names relative position biases go by in transformers (T5's, LayoutLMv3's ``rel_pos_bias`` and
#: ``rel_pos_x_bias``, CPM-Ant's parameter): held by a module no adapter recognises, they are named in the refusal
_RELATIVE_BIAS = re.compile(r"relative_attention_bias|rel_pos(_[a-z]+)?_bias")

_PLANNERS: dict[str, Callable[[torch.nn.Module, str, torch.nn.Module, bool], _Plan]] = {
    "rotary": _plan_rotary, "mrope": _plan_mrope, "bloom": _plan_bloom, "mpt": _plan_mpt, "t5": _plan_t5,
    "mpnet": _plan_mpnet, "clipped": _plan_clipped, "buckets": _plan_bucket_method,
}


# ---- the INFO record -----------------------------------------------------------------------------------------

def _modules(count: int, what: str) -> str:
    return f"its {what}" if count == 1 else f"{count} {what}s"


def _log_plans(model: torch.nn.Module, plans: list[_Plan], left: list[str]) -> None:
    """The one INFO record of a ``patch_model`` call: what posenc now supplies, and what it left."""
    if not (plans or left) or not _log.isEnabledFor(logging.INFO):
        return
    parts = []
    rotary = [p for p in plans if p.kind in ("rotary", "mrope")]
    if rotary:
        dims = [t.rope.dim for p in rotary for t in _tables_of(p)]
        adapters: list[Any] = [p.submodule[1] for p in rotary if p.submodule is not None]
        generic = [a for a in adapters if isinstance(a, _RotaryAdapter)]
        kinds = sorted({k for a in generic for k in a.tables if k != "None"})
        per_type = f" (one table per layer type: {', '.join(kinds)})" if kinds else ""
        fmt = {a.fmt for a in generic}
        what = ("the sin/cos tables of " if fmt == {"sin_cos"} else
                "the multimodal cos/sin of " if all(p.kind == "mrope" for p in rotary) else "the cos/sin of ")
        what += _modules(len(rotary), "rotary module") + per_type
        config = getattr(model, "config", None)
        found = core_hf_config.describe_rope_layout(config, rotary_dim=max(dims))
        layout, reason = found.layout, found.reason
        code = {(a.layout, a.layout_source) for a in generic if a.layout}
        if len(code) == 1:
            (code_layout, source), = code
            if code_layout != layout:
                layout = code_layout
                reason = (f"the model's own {source} pairs " +
                          ("adjacent features (2i, 2i + 1)" if layout == "interleaved" else "features (i, i + d/2)"))
        routed = [a.fast for a in generic if a.fast is not None]
        if routed and len(routed) == len(adapters):
            rotation = (f"posenc rotates q and k in this layout (the same roundings as the model's own "
                        f"{routed[0].function})")
        else:
            whys = sorted({a.why_not_fast for a in generic if a.fast is None})
            rotation = ("the model's own attention code rotates q and k in this layout" +
                        (f" ({'; '.join(whys)})" if whys else "") +
                        (f", except in {_modules(len(routed), 'rotary module')} posenc reproduces" if routed else ""))
        readings = "".join(f" ({r})" for r in sorted({r for p in rotary for r in p.note.split("; reading: ")[1:]}))
        parts.append(f"layout={layout!r} ({reason}); posenc now supplies {what}{readings}, {rotation}, and the "
                     f"model's weights are used as they are; {core_hf_config.conversion_hint(layout)}")
    others = [p for p in plans if p.kind not in ("rotary", "mrope")]
    if others:
        parts.append(f"posenc now supplies the {' and '.join(sorted({p.note for p in others}))} of "
                     f"{_modules(len(others), 'module')}")
    _log.info("patch_model: %s: %s", type(model).__name__, "; ".join(parts + left))


def _tables_of(plan: _Plan) -> list[Any]:
    sub = plan.submodule[1] if plan.submodule is not None else None
    if isinstance(sub, _RotaryAdapter):
        return list(sub.tables.values())
    if isinstance(sub, _MropeAdapter):
        return [sub.tables]
    return []
