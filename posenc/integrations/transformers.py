"""Hugging Face transformers models with posenc's positional encodings, patched in place.

``patch_model(model)`` makes a loaded model take its positional encoding from posenc, for
``model(...)`` and ``model.generate(...)``, prefill and cached decoding alike; ``unpatch_model`` (or
the ``patched(model)`` context manager) restores the original.  Nothing is decided from a list of
model types: ``patch_model`` looks for the modules that hold a position rule, builds posenc's
version of each, and checks it against the module's own output before it changes anything.

- **RoPE**, any module following transformers' rotary contract (``forward(x, position_ids[,
  layer_type])`` returning ``(cos, sin)``, or Llama 4's complex ``freqs_cis``, with a ``config``):
  posenc builds :meth:`posenc.RotaryEmbedding.from_hf_config` from the module's configuration (one
  table per layer type), finds the format the module returns (``[cos, cos]``, each value twice,
  half width, ``(sin, cos)``, complex) by comparing with the module's output, and from then on the
  module returns posenc's exact values in that format.  The model's attention code still rotates q
  and k; its cache still holds keys rotated once, at the step that produced them, so
  length-dependent rules (dynamic NTK, LongRoPE) follow the model within a generation (the length
  is the largest position + 1 of each step; transformers' dynamic NTK also remembers the longest
  length seen by earlier calls, posenc does not: a module that already grew is checked against a
  fresh copy of itself, and computes as it did when loaded);
- **multimodal RoPE** (Qwen2-VL and its successors): the text model's rotary module returns
  posenc's exact M-RoPE cos/sin (:class:`posenc.MultimodalRotaryEmbedding`) for the ``(3, B, S)``
  positions the model computes (``get_rope_index`` and its rope deltas are the model's own);
- **ALiBi** (BLOOM, MPT): the bias comes from :func:`posenc.alibi_bias` with posenc's slopes;
- **T5 family** (T5, mT5, UMT5, Switch, UDOP, Pop2Piano, Pix2Struct, LongT5's full attention), and
  MPNet's ``compute_position_bias`` (the same buckets): the bucketed relative bias comes from
  :func:`posenc.relative_position_bucket` and the model's own bias weights (so training still updates
  them).

The self-check: before anything is changed, posenc's output is compared with the module's original
output (on a copy, so state such as dynamic NTK's cache is untouched) at positions near 0, around
the original and the extended context, and past it, in float32.  Near 0 they must agree to a few
float32 ulps; further out the allowance grows with the angle, because transformers computes
``position * inv_freq`` in float32 (posenc computes it exactly): ``8 + 16 * |angle|`` ulps of the
value's scale.  ALiBi slopes must agree to 4 ulps, T5 buckets exactly.  Any disagreement refuses the
whole model with a ``ValueError`` naming the module, the positions and the difference, and the model
is left as it was.

The rotation of q and k goes through posenc's engine too (``backend="auto"``, the default), where
the model's ``apply_rotary_pos_emb`` is recognised and reproduced at patch time; the pair layout is
the one the model's own rotate function mixes (:func:`rotation_layout`).  On CPU, and on any device
with ``backend="torch"``, a call of the patched rotary module gathers, with one lookup, its cos/sin
and the 2 x 2 mixing factors of each feature pair (:mod:`posenc.kernels.torch_mix`); each layer then
rotates q and k with two torch calls apiece, with the same products and additions as the model's
own code, so the outputs are equal bit for bit, in fewer calls.  With Triton on CUDA, ``"auto"``
picks posenc's Triton kernel.

Patch state lives on each patched module (a registered ``posenc_rope`` submodule for tables, picklable
callables for the replaced methods), so ``copy.deepcopy``, ``pickle`` / ``torch.save`` and patching
nested modules keep working; ``state_dict`` never contains posenc's tables, so ``save_pretrained``
writes the model's own weights and ``from_pretrained`` gives an unpatched model.

transformers is never imported by ``import posenc``; this module needs it only to be installed
for the models you pass (it reads their classes and configs, it does not import them itself).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import logging
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np
import torch

from posenc import _validate
from posenc._deprecate import UNSET
from posenc._torch.angles import angle_dtype, has_float64
from posenc._torch.backend import kernel_possible
from posenc._torch.rope_call import promise
from posenc._torch.rows import position_range, table_rows
from posenc._torch.tables import TableModule
from posenc.core import hf_config as core_hf_config
from posenc.core.notices import LOGGER_NAME
from posenc.core.rope import LongRopeScaling
from posenc.functional import (
    alibi_bias,
    alibi_slopes,
    apply_rope_qk,
    positions_from_mask,
    relative_position_bucket,
)
from posenc.kernels.torch_mix import mix_rows, mix_view, rotate_mixed
from posenc.nn import MultimodalRotaryEmbedding, RotaryEmbedding

__all__ = ["is_patched", "patch_model", "patched", "rotation_layout", "unpatch_model"]

_LEGACY_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text", "phi3", "gpt_neox",
                 "cohere", "glm", "deepseek_v3", "qwen2_vl", "qwen2_5_vl", "qwen2_vl_text", "qwen2_5_vl_text", "gptj",
                 "bloom", "mpt", "t5")
#: Rows precomputed per rotary table; positions past them are computed exactly on the fly.
_MAX_TABLE_ROWS = 1 << 14
#: The attribute that marks a patched module (a :class:`_Patch` in its instance dictionary).
_PATCH = "_posenc_patch"
_ULP = 2.0 ** -24                                            # float32 unit roundoff

_log = logging.getLogger(LOGGER_NAME)


def __getattr__(name: str) -> Any:
    if name == "SUPPORTED_MODEL_TYPES":
        warnings.warn("SUPPORTED_MODEL_TYPES is deprecated: patch_model checks each model against its own "
                      "output instead of a list of model types (see docs/integrations.md for the models "
                      "verified with your transformers)", DeprecationWarning, stacklevel=2)
        return _LEGACY_TYPES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- patch records: plain data on each patched module, picklable and copyable ---------------------------

class _Patch:
    """What :func:`patch_model` changed on one module: the instance attributes it replaced (with
    their old values, or none) and the name of the submodule it registered."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.saved: list[tuple[str, bool, Any]] = []
        self.submodule: str | None = None

    def __repr__(self) -> str:
        return f"posenc patch ({self.kind})"


class _Call:
    """``owner.<name>(...)`` replaced by ``fn(owner, ...)``: a module-level function and its owner,
    so that the replacement pickles (by the function's name) and copies (with its owner)."""

    def __init__(self, owner: torch.nn.Module, fn: Callable[..., Any]) -> None:
        self.owner, self.fn = owner, fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(self.owner, *args, **kwargs)


class _Plan:
    """A verified change to one module, applied only once every module of the model is verified."""

    def __init__(self, module: torch.nn.Module, kind: str, methods: dict[str, Callable[..., Any]],
                 submodule: tuple[str, torch.nn.Module] | None = None, note: str = "") -> None:
        self.module, self.kind, self.methods, self.submodule, self.note = module, kind, methods, submodule, note
        self.fast: tuple[str, str] | None = None

    def apply(self) -> None:
        record = _Patch(self.kind)
        if self.fast is not None and self.submodule is not None:
            _install_fast(*self.fast, self.submodule[1])
        if self.submodule is not None:
            name, sub = self.submodule
            self.module.add_module(name, sub)
            record.submodule = name
        for name, value in self.methods.items():
            had = name in vars(self.module)
            record.saved.append((name, had, vars(self.module).get(name)))
            object.__setattr__(self.module, name, value)
        object.__setattr__(self.module, _PATCH, record)


def _unpatch_module(module: torch.nn.Module) -> None:
    record = vars(module).pop(_PATCH, None)
    if record is None:
        return
    for name, had, old in reversed(record.saved):
        if had:
            object.__setattr__(module, name, old)
        else:
            vars(module).pop(name, None)
    if record.submodule is not None:
        sub = module._modules.pop(record.submodule, None)
        fast = getattr(sub, "fast", None)
        if fast is not None and sub is not None:
            _uninstall_fast(fast[0], fast[1], sub)


def _is_patched(module: torch.nn.Module) -> bool:
    return _PATCH in vars(module)


# ---- the public entry points ------------------------------------------------------------------------------

def patch_model(model: torch.nn.Module, *, backend: str | None = "auto", assume_valid: bool = False,
                assume_in_table: bool = UNSET) -> torch.nn.Module:
    """Make ``model`` compute its positional encoding with posenc, in place; returns ``model``.

    Every module of ``model`` that holds a position rule is found (a rotary module following
    transformers' contract, multimodal RoPE, ALiBi, a T5-style relative bias), posenc's version of
    it is built and compared with the module's own output (see the module docstring: near 0 to a few
    float32 ulps, further out within transformers' own float32 angle error); only when every one
    agrees is anything changed.  Wrappers (vision-language models, encoder-decoders) have their
    text, vision and decoder parts patched alike.  Patching twice, or patching a model whose
    submodel is already patched, leaves the patched parts as they are.

    The pair layout the model's own code rotates with and the rotary dims are logged at ``INFO``
    level on the ``"posenc"`` logger.  Patching changes the encoding only, never the weights.

    Args:
        model: a loaded transformers model (any head, or a submodel such as ``model.model``).
        backend: ``"auto"`` (the default), ``"torch"`` or ``"triton"``: where the model's rotate
            function (``apply_rotary_pos_emb(q, k, cos, sin)``, or one that takes ``(x, cos, sin)``,
            of its modeling code) is recognised and reproduced by posenc's engine on random q and k,
            that function rotates q and k with posenc's engine for the cos/sin of patched models:
            the torch engine (checked to give the model's own results bit for bit, in fewer
            calls), or with ``"triton"`` (``"auto"`` on CUDA with Triton) posenc's Triton kernel
            (checked within 1e-5 in float32).  Calls with other cos/sin, and traced calls under
            ``torch.compile``, run the model's own function; where the function is not recognised,
            cos/sin only (logged at INFO).  ``None``: posenc supplies cos/sin and the model's own
            code always rotates q and k.
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
    if assume_in_table is not UNSET:
        assume_valid = promise("patch_model", assume_in_table, assume_valid)
    _patch(model, assume_valid, backend)
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
def patched(model: torch.nn.Module, *, backend: str | None = "auto", assume_valid: bool = False,
            assume_in_table: bool = UNSET) -> Iterator[torch.nn.Module]:
    """``with patched(model): ...`` runs the block with ``model`` patched, and restores after it
    exactly the modules it patched (a model that was patched already stays patched).
    ``backend`` and ``assume_valid`` as for :func:`patch_model` (``assume_in_table`` is the deprecated old
    name of ``assume_valid``)."""
    if assume_in_table is not UNSET:
        assume_valid = promise("patched", assume_in_table, assume_valid)
    done = _patch(model, assume_valid, backend)
    try:
        yield model
    finally:
        for module in done:
            _unpatch_module(module)


def _check_module(model: object, name: str = "model") -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{name} must be a torch.nn.Module (a loaded transformers model or one of its modules), got "
                        f"{type(model).__name__}")


def _patch(model: torch.nn.Module, assume_valid: bool, backend: str | None = None) -> list[torch.nn.Module]:
    """Verify and apply; returns the modules newly patched."""
    _check_module(model)
    try:
        return _verify_and_apply(model, assume_valid, backend)
    finally:
        for module in model.modules():
            vars(module).pop("_posenc_reference", None)


def _verify_and_apply(model: torch.nn.Module, assume_valid: bool, backend: str | None) -> list[torch.nn.Module]:
    _check_module(model)
    _validate.check_bool("assume_valid", assume_valid)
    if backend is not None and backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be None (cos/sin only), 'auto', 'torch' or 'triton', got {backend!r}")
    plans: list[_Plan] = []
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
        if kind == "vision":
            vision = _plan_axial(module, where, model)
            if isinstance(vision, str):
                _log.info("patch_model: %s: a vision tower's 2-D rotary module, left as the model's own (%s)", where,
                          vision)
            else:
                plans.append(vision)
            continue
        plan = _PLANNERS[kind](module, where, model, assume_valid)
        if backend is not None and isinstance(plan.submodule[1] if plan.submodule else None, _RotaryAdapter):
            _plan_fast_rotation(plan, where, backend)
        plans.append(plan)
    if not found:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        raise ValueError(
            f"patch_model found no positional module in {type(model).__name__} (model_type={model_type!r}): no rotary "
            f"module following transformers' contract (forward(x, position_ids) returning (cos, sin)), no ALiBi and no "
            f"T5-style relative bias; models with learned or sinusoidal absolute positions have nothing to patch"
        )
    if getattr(getattr(model, "config", None), "alibi", False) is True and not kinds & {"bloom", "mpt"}:
        raise ValueError(
            f"patch_model: {type(model).__name__} (alibi=True) builds its ALiBi bias with a module-level function of "
            f"its modeling code (Falcon), which posenc does not patch (its rotary module is unused then); the model "
            f"is left unpatched")
    for plan in plans:
        plan.apply()
    _log_plans(model, plans)
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
    if not ("Rotary" in cls.__name__ and callable(getattr(cls, "forward", None))):
        return None
    try:
        params = list(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError):
        return None
    if params[1:3] != ["x", "position_ids"]:
        return None
    if _config_of(module, model) is None:
        return None
    if "Vision" in cls.__name__ or _rope_type(_config_of(module, model)) == "axial":
        return "vision"                             # 2-D rotary of a vision tower: left as the model's
    return "mrope" if _mrope_section(module, model) is not None else "rotary"


def _config_of(module: torch.nn.Module, model: torch.nn.Module) -> Any:
    """The rotary module's configuration, else (GPT-J, CodeGen) the text configuration of the model."""
    config = getattr(module, "config", None)
    if config is None:
        config = getattr(model, "config", None)
        text = getattr(config, "get_text_config", None)
        config = text() if callable(text) else config
    return config if config is not None and (hasattr(config, "to_dict") or isinstance(config, dict)) else None


def _rope_type(config: Any) -> Any:
    params = getattr(config, "rope_parameters", None) or {}
    return params.get("rope_type") if isinstance(params, dict) else None


def _mrope_section(module: torch.nn.Module, model: torch.nn.Module) -> Any:
    section = getattr(module, "mrope_section", None)
    if section is not None:
        return section
    config = _config_of(module, model)
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return params.get("mrope_section") if isinstance(params, dict) else None


# ---- RoPE: one generic adapter, verified against the module ------------------------------------------------

class _RotaryTables(TableModule):
    """posenc's rotary embedding for one layer type, with its exact float32 cos/sin tables
    ``(rows, dim/2)``.  The tables stay float32 when the model is cast (``model.to(torch.bfloat16)``).

    Where posenc also rotates q and k (``backend=``), ``mix`` holds, per row, everything a call
    returns and rotates with, so that one gather serves a call: ``(rows, 4 dim)``, the module's cos
    and sin in its own format, then the factors of :func:`posenc.kernels.torch_mix.mix_rows`.
    """

    _table_buffers = ("cos", "sin", "mix")
    cos: torch.Tensor
    sin: torch.Tensor
    mix: torch.Tensor | None
    #: the widths of cos, sin and the factors in a row of ``mix`` (set with it)
    split: tuple[int, int, int]

    def __init__(self, rope: RotaryEmbedding, assume_valid: bool) -> None:
        super().__init__()
        self.assume_valid = assume_valid
        self.rope = rope
        self.register_buffer("cos", rope.cos_table.contiguous(), persistent=False)
        self.register_buffer("sin", rope.sin_table.contiguous(), persistent=False)
        self.register_buffer("mix", None, persistent=False)
        self.mix_format: tuple[str, str, int] | None = None
        #: plain attributes (read per call without the module's attribute lookup)
        self.rows, self.length_dependent, self.dim = int(self.cos.shape[0]), bool(rope.length_dependent), rope.dim

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        # (tables saved by an earlier posenc: the attributes it did not have, and no factor table)
        self._buffers.setdefault("mix", None)
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
        with torch.no_grad():
            self.cos.copy_(self.rope.cos_table)
            self.sin.copy_(self.rope.sin_table)
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
    if fmt == "half":
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    elif fmt == "pairs":
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
    if fmt == "sin_cos":
        return sin.to(dtype), cos.to(dtype)
    return cos.to(dtype), sin.to(dtype)


_FORMATS = ("half", "pairs", "narrow", "sin_cos", "complex")
_FORMAT_WORDS = {"half": "[cos, cos] per row", "pairs": "each value twice", "narrow": "half width",
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
        #: (modeling module name, function name, backend) when the rotation is routed through posenc
        self.fast: tuple[str, str, str] | None = None
        #: why the model's own code rotates q and k (for the log), when it does
        self.why_not_fast = "backend=None"
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
                fast: tuple[str, str, str] | None) -> tuple[Any, _FastEntry | None]:
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
        backend, dtype, layout = fast[2], x.dtype, self.mix_layout
        # the kernel: plain rotations, one row set for the batch (per-row positions: the torch engine)
        if (position_ids.dim() == 2 and position_ids.shape[0] == 1 and kernel_possible(backend, x) and self.sign == 1
                and layout == self.layout):
            cos, sin = table(position_ids, dtype)
            out = _to_format(cos, sin, self.fmt, dtype)
            return out, _KernelEntry(layout, cos.to(dtype), sin.to(dtype), backend, out[1], self.partial, self.any_rows)
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
        fast = getattr(self, "fast", None)
        if fast is not None:                                       # a copy or a loaded model: route it again
            _install_fast(fast[0], fast[1], self)


def _rotary_forward(owner: Any, *args: Any, **kwargs: Any) -> Any:
    return owner._modules["posenc_rope"].forward(*args, **kwargs)    # (an internal module: no hooks to run)


def _layer_types(module: torch.nn.Module, config: Any) -> list[str | None]:
    """The layer types a rotary module serves (``[None]`` for one table)."""
    if "layer_type" not in inspect.signature(type(module).forward).parameters:
        return [None]
    kinds = getattr(module, "layer_types", None) or getattr(config, "layer_types", None) or []
    kinds = sorted({str(k) for k in kinds})
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and kinds and not all(k in params for k in kinds):
        return [None]                                # one set of parameters for every layer type
    if isinstance(params, dict):                     # layer types without rotary embedding (NoPE layers)
        kinds = [k for k in kinds if params.get(k) is not None] or kinds
    return list(kinds) or [None]


def _rows(config: Any) -> int:
    return min(int(getattr(config, "max_position_embeddings", 4096) or 4096), _MAX_TABLE_ROWS)


class _Silent(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


@contextlib.contextmanager
def _silently() -> Iterator[None]:
    """The configuration readers' own INFO records held back: ``patch_model`` logs one record per call,
    with the layout found from the model's code (a reader's guess from the model type would contradict it)."""
    silent = _Silent()
    _log.addFilter(silent)
    try:
        yield
    finally:
        _log.removeFilter(silent)


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
    configuration's reading, as Microsoft's reference code and vLLM compute it, switches both).  None for
    any other rule.  Used only where the module itself is reproduced by it (checked like the first)."""
    rule = rope.scaling
    if not (isinstance(rule, LongRopeScaling) and rule.long_attention_factor is not None
            and rule.long_factor != rule.short_factor):
        return None
    return RotaryEmbedding(rope.dim, max_seq_len=rope.max_seq_len, base=rope.base, layout=rope.layout,
                           scaling=dataclasses.replace(rule, long_factor=rule.short_factor), backend=rope.backend)


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


# ---- the rotation of q and k through posenc's engines (backend=) ---------------------------------------------

#: The attribute of the cos a patched rotary module returns that holds what rotates q and k with it
#: (on the tensor itself: it lives exactly as long as that cos, and a layer reads it at once).
_ENTRY = "_posenc_rotation"
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling


class _FastEntry:
    """What rotates q and k as the model's function would with the cos/sin of one call of a patched
    rotary module: posenc's torch engine, with the factors of :mod:`posenc.kernels.torch_mix` in
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

    __slots__ = ("cos", "sin", "backend")

    def __init__(self, layout: str, cos: torch.Tensor, sin: torch.Tensor, backend: str, sin_out: torch.Tensor,
                 partial: str | bool, any_rows: bool = False) -> None:
        self.layout, self.dim, self.partner, self.partial = layout, 2 * cos.shape[-1], sin_out, partial
        self.dtype, self.length, self.sign, self.any_rows = cos.dtype, cos.shape[-2], 1, any_rows
        self.cos, self.sin, self.backend = cos, sin, backend

    def _kernel(self, q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                unsqueeze: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        last = self.partial == "last" and q.shape[-1] > self.dim
        return apply_rope_qk(q, k, cos[0], sin[0], layout=self.layout, seq_dim=3 - unsqueeze, backend=self.backend,
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
                out = None
                if unsqueeze == 1 or unsqueeze == 2:
                    if entry.partner is sin and (entry.versions is None or entry.versions == (cos._version, sin._version)):
                        out = entry.rotate(q, k, unsqueeze)                  # the module's own cos/sin, as returned
                    elif entry.any_rows:
                        out = entry.rotate_rows((q, k), cos, sin, unsqueeze)   # other rows, or changed ones
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
                unsqueeze = self._unsqueeze(args, kwargs)
                out = None
                if unsqueeze == 1 or unsqueeze == 2:
                    if entry.partner is sin and (entry.versions is None or entry.versions == (cos._version, sin._version)):
                        out = entry.rotate_one(x, unsqueeze)
                    elif entry.any_rows:
                        got = entry.rotate_rows((x,), cos, sin, unsqueeze)
                        out = None if got is None else got[0]
                if out is not None:
                    return out
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


def _plan_fast_rotation(plan: _Plan, where: str, backend: str) -> None:
    """Route the model's rotation through posenc's engine where its rotate function is recognised and
    reproduced on random q and k (:func:`_verify_fast`); else leave it (logged)."""
    adapter = cast(_RotaryAdapter, plan.submodule[1] if plan.submodule else None)
    module = plan.module
    code = sys.modules.get(type(module).__module__)
    name = adapter.layout_source
    fn = getattr(code, name, None) if name in _ROTATE_FUNCTIONS else None
    if isinstance(fn, _FastRotate):
        fn = fn.original
    why = ""
    if code is None:
        why = "its modeling code is not loaded"
    elif adapter.fmt not in ("half", "pairs", "narrow") or adapter.layout is None or fn is None:
        why = "its rotate function takes neither (q, k, cos, sin) nor (x, cos, sin) with real cos/sin"
    elif not callable(fn) or (list(inspect.signature(fn).parameters)[:4] != ["q", "k", "cos", "sin"]
                              and not _takes_one(fn)):
        why = f"{name} does not take (q, k, cos, sin) or (x, cos, sin)"
    else:
        why = _verify_fast(adapter, fn, backend)
    if why:
        for table in adapter.tables.values():
            cast(_RotaryTables, table).enable_mix(adapter.fmt, None)     # only the tables the module returns
        adapter.why_not_fast = why                                       # (said in patch_model's log record)
        return
    module_name = type(module).__module__
    adapter.fast = (module_name, name, backend)
    plan.fast = (module_name, name)


def _verify_fast(adapter: _RotaryAdapter, fn: Callable[..., Any], backend: str) -> str:
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
    tables = [cast(_RotaryTables, t) for t in adapter.tables.values()]
    promised = [t.assume_valid for t in tables]
    for t in tables:
        t.assume_valid = False                               # the probes go past the tables
    try:
        ways = [("half", 1), ("half", -1)] if adapter.layout == "half" else \
            [("interleaved", 1), ("interleaved_to_half", 1), ("interleaved", -1), ("interleaved_to_half", -1)]
        for adapter.mix_layout, adapter.sign in ways:
            adapter.slices, adapter.any_rows = ["first", "last"], adapter.fmt == "narrow"
            why = _reproduces(adapter, fn, backend, torch.float32)
            if not why:
                break
        if not why and not kernel_possible(backend, tables[0].cos):  # (the kernel computes in float32, rounds once)
            for dtype in (torch.bfloat16, torch.float16, torch.float64):
                if dtype == torch.float64 and not has_float64(tables[0].cos.device):
                    continue                                 # (a device without float64: nothing to route)
                for mode in ("model", "float32"):
                    adapter.low[dtype] = mode
                    if not _reproduces(adapter, fn, backend, dtype):
                        break
                    del adapter.low[dtype]
        return why
    finally:
        adapter.partial = adapter.slices[0] if adapter.slices else False
        adapter.slices = []
        for t, p in zip(tables, promised, strict=True):
            t.assume_valid = p


def _reproduces(adapter: _RotaryAdapter, fn: Callable[..., Any], backend: str, dtype: torch.dtype) -> str:
    """Why posenc's rotation for ``dtype`` differs from ``fn``'s, or "": bit for bit with the torch
    engine (the same products and additions), within 1e-5 with the Triton kernel (float32 only:
    it computes in float32 and rounds once).  For a head wider than the rotary dim, each slice still in
    ``adapter.slices`` that ``fn`` does not rotate as posenc would is dropped from it; random half-width
    rows that posenc does not rotate as ``fn`` does clear ``adapter.any_rows``."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    fast = ("", "", backend)
    exact = not kernel_possible(backend, cast(_RotaryTables, next(iter(adapter.tables.values()))).cos)
    one = _takes_one(fn)

    def same(got: Any, want: Any) -> bool:
        return got is not None and isinstance(want, tuple) and all(
            torch.equal(g, w) if exact else torch.allclose(g, w, rtol=0, atol=1e-5)
            for g, w in zip(got, want, strict=True))

    def call(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        return (fn(q, cos, sin), fn(k, cos, sin)) if one else fn(q, k, cos, sin)

    for layer_type, table in adapter.tables.items():
        table = cast(_RotaryTables, table)
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


def _shape_of(out: Any) -> str:
    if isinstance(out, (tuple, list)):
        return "(" + ", ".join(_shape_of(o) for o in out) + ")"
    return str(tuple(out.shape)) if isinstance(out, torch.Tensor) else type(out).__name__


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
    for fmt in ("half", "pairs", "narrow"):
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
    module's format."""

    def __init__(self, rope: RotaryEmbedding, fmt: str, axes_first: bool) -> None:
        super().__init__()
        self.rope = rope
        self.fmt = fmt
        self.axes_first = axes_first

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        rows, cols = (position_ids[0], position_ids[1]) if self.axes_first else (position_ids[..., 0],
                                                                                 position_ids[..., 1])
        c_h, s_h = self.rope.cos_sin(rows, dtype=work)                             # (N, d/4) each
        c_w, s_w = self.rope.cos_sin(cols, dtype=work)
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
    except (ValueError, TypeError) as e:
        return f"posenc cannot build its rule ({e})"
    for fmt, axes_first in ((f, a) for a in (False, True) for f in ("half", "narrow", "pairs")):
        adapter = _AxialAdapter(rope, fmt, axes_first)
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


# ---- ALiBi: BLOOM and MPT -------------------------------------------------------------------------------------

def _bloom_alibi(owner: Any, attention_mask: torch.Tensor, num_heads: int, dtype: torch.dtype) -> torch.Tensor:
    positions = positions_from_mask(attention_mask != 0)                    # (B, S_k): pads get 0
    slopes = alibi_slopes(num_heads, dtype=angle_dtype(attention_mask.device), device=attention_mask.device)
    zero = torch.zeros(positions.shape[0], 1, dtype=torch.long, device=positions.device)
    bias = alibi_bias(zero, positions, slopes, dtype=torch.float32)         # (B, H, 1, S_k): slope * key pos
    return bias.reshape(-1, 1, positions.shape[-1]).to(dtype)


def _bloom_forward(owner: Any, *args: Any, **kwargs: Any) -> Any:
    """BLOOM (transformers 5) builds its ALiBi inline when no attention mask is given; an all-ones
    mask (the same attention) routes it through ``build_alibi_tensor``."""
    forward = type(owner).forward
    bound = inspect.signature(forward).bind_partial(owner, *args, **kwargs)
    given = bound.arguments
    extra = given.get("kwargs") or {}                   # (transformers >= 5.24 names the cache ``cache``)
    caches = (given.get("cache"), given.get("past_key_values"), extra.get("cache"), extra.get("past_key_values"))
    cache = next((c for c in caches if c is not None), None)
    if given.get("attention_mask") is None and (cache is None or hasattr(cache, "get_seq_length")):
        ref: Any = given.get("input_ids") if given.get("input_ids") is not None else given.get("inputs_embeds")
        past = cache.get_seq_length() if cache is not None else 0
        given["attention_mask"] = torch.ones(ref.shape[0], past + ref.shape[1], dtype=torch.long, device=ref.device)
    return forward(*bound.args, **bound.kwargs)


def _close_to(got: torch.Tensor, want: torch.Tensor, ulps: float) -> bool:
    if got.shape != want.shape:
        return False
    g, w = _host(got), _host(want)
    return bool((np.abs(g - w) <= ulps * _ULP * np.abs(w) + 1e-30).all())


def _plan_bloom(module: Any, where: str, model: torch.nn.Module, assume_valid: bool) -> _Plan:
    heads = int(getattr(module, "num_heads", 0) or getattr(getattr(module, "config", None), "n_head", 0) or 0)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    for n in sorted({heads, 4, 6} - {0}):
        want = type(module).build_alibi_tensor(module, mask, n, torch.float32) \
            if "self" in inspect.signature(type(module).build_alibi_tensor).parameters else \
            type(module).build_alibi_tensor(mask, n, torch.float32)
        got = _bloom_alibi(module, mask, n, torch.float32)
        if not _close_to(got, want, 4):
            raise ValueError(f"patch_model: {where}: posenc's ALiBi bias for {n} heads does not reproduce the model's "
                             f"build_alibi_tensor; the model is left unpatched")
    return _Plan(module, "bloom", {"build_alibi_tensor": _Call(module, _bloom_alibi),
                                   "forward": _Call(module, _bloom_forward)}, note="ALiBi")


def _mpt_alibi(owner: Any, num_heads: int, sequence_length: int, alibi_bias_max: int = 8,
               device: Any = None) -> torch.Tensor:
    slopes = alibi_slopes(num_heads, dtype=angle_dtype(device), device=device)
    last = torch.tensor([sequence_length - 1], device=device)
    keys = torch.arange(sequence_length, device=device)
    return alibi_bias(last, keys, slopes, dtype=torch.float32)               # (H, 1, L): slope * (j - L + 1)


def _plan_mpt(module: Any, where: str, model: torch.nn.Module, assume_valid: bool) -> _Plan:
    # transformers calls build_mpt_alibi_tensor with its default alibi_bias_max=8 whatever the config says
    # (attn_config.alibi_bias_max is not passed on), so the check is against what the model computes.
    heads = int(getattr(module, "num_heads", 0) or getattr(getattr(model, "config", None), "n_heads", 0) or 0)
    length = 40
    for n in sorted({heads, 4} - {0}):
        want = type(module).build_mpt_alibi_tensor(module, n, length, device=None)
        got = _mpt_alibi(module, n, length)
        if not _close_to(got, want.to(got.dtype), 4):
            raise ValueError(f"patch_model: {where}: MPT's ALiBi slopes for {n} heads differ from the ALiBi paper's "
                             f"(posenc's); the model is left unpatched")
    return _Plan(module, "mpt", {"build_mpt_alibi_tensor": _Call(module, _mpt_alibi)}, note="ALiBi")


# ---- T5 family -------------------------------------------------------------------------------------------------

def _t5_bias(owner: Any, query_length: int, key_length: int, device: Any = None, past_seen_tokens: int = 0,
             cache_position: torch.Tensor | None = None) -> torch.Tensor:
    device = owner.relative_attention_bias.weight.device if device is None else device
    if cache_position is not None:                                           # transformers 4.x
        queries = cache_position.to(device)
    else:
        queries = torch.arange(query_length, dtype=torch.long, device=device) + past_seen_tokens
    keys = torch.arange(key_length, dtype=torch.long, device=device)
    buckets = relative_position_bucket(keys[None, :] - queries[:, None], bidirectional=not owner.is_decoder,
                                       num_buckets=owner.relative_attention_num_buckets,
                                       max_distance=owner.relative_attention_max_distance)
    values = owner.relative_attention_bias(buckets)                           # (S, S_k, H), the model's weights
    return values.permute(2, 0, 1).unsqueeze(0)                              # (1, H, S, S_k)


def _plan_t5(module: Any, where: str, model: torch.nn.Module, assume_valid: bool) -> _Plan:
    buckets = int(module.relative_attention_num_buckets)
    distance = int(module.relative_attention_max_distance)
    exact = (buckets // 2 if not module.is_decoder else buckets) // 2
    if distance <= exact:
        raise ValueError(
            f"patch_model: {where}: relative_attention_max_distance={distance} must exceed the exact range {exact} "
            f"(half the {'' if module.is_decoder else 'per-direction '}buckets of relative_attention_num_buckets="
            f"{buckets}): the logarithmic buckets divide by log(max_distance / exact range), which is 0 here; set "
            f"relative_attention_max_distance > {exact}; the model is left unpatched")
    for q, k, past in ((7, 7, 0), (1, 40, 39), (5, 300, 295), (3, 2 * distance + 3, 0)):
        with torch.no_grad():
            want = type(module).compute_bias(module, q, k, past_seen_tokens=past) if past else \
                type(module).compute_bias(module, q, k)
            got = _t5_bias(module, q, k, past_seen_tokens=past)
        if want.shape != got.shape or not torch.equal(want, got):
            raise ValueError(f"patch_model: {where}: posenc's relative position buckets do not reproduce the model's "
                             f"compute_bias for {q} queries after {past} and {k} keys; the model is left unpatched")
    return _Plan(module, "t5", {"compute_bias": _Call(module, _t5_bias)}, note="T5 relative bias")


def _mpnet_bias(owner: Any, x: torch.Tensor, position_ids: torch.Tensor | None = None,
                num_buckets: int = 32) -> torch.Tensor:
    """MPNet's ``compute_position_bias``: T5's bidirectional buckets (maximum distance 128) of key minus query
    position over the model's bias weights, ``(B, H, S, S)``."""
    bsz, length = x.size(0), x.size(1)
    if position_ids is not None:
        queries, keys = position_ids[:, :, None], position_ids[:, None, :]
    else:
        queries = torch.arange(length, dtype=torch.long, device=x.device)[:, None]
        keys = torch.arange(length, dtype=torch.long, device=x.device)[None, :]
    buckets = relative_position_bucket(keys - queries, bidirectional=True, num_buckets=num_buckets,
                                       max_distance=128)
    values = owner.relative_attention_bias(buckets).permute([2, 0, 1]).unsqueeze(0)      # (1, H, S, S)
    return values.expand((bsz, -1, length, length)).contiguous()


def _plan_mpnet(module: Any, where: str, model: torch.nn.Module, assume_valid: bool) -> _Plan:
    device = module.relative_attention_bias.weight.device
    for length in (1, 7, 40, 300):
        x = torch.zeros(2, length, 1, device=device)
        with torch.no_grad():
            want = type(module).compute_position_bias(module, x)
            got = _mpnet_bias(module, x)
        if want.shape != got.shape or not torch.equal(want, got):
            raise ValueError(f"patch_model: {where}: posenc's relative position buckets do not reproduce the model's "
                             f"compute_position_bias for {length} tokens; the model is left unpatched")
    return _Plan(module, "mpnet", {"compute_position_bias": _Call(module, _mpnet_bias)},
                 note="relative position bias (T5's buckets)")


_PLANNERS: dict[str, Callable[[torch.nn.Module, str, torch.nn.Module, bool], _Plan]] = {
    "rotary": _plan_rotary, "mrope": _plan_mrope, "bloom": _plan_bloom, "mpt": _plan_mpt, "t5": _plan_t5,
    "mpnet": _plan_mpnet,
}


# ---- the INFO record -----------------------------------------------------------------------------------------

def _modules(count: int, what: str) -> str:
    return f"its {what}" if count == 1 else f"{count} {what}s"


def _log_plans(model: torch.nn.Module, plans: list[_Plan]) -> None:
    if not plans or not _log.isEnabledFor(logging.INFO):
        return
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
            rotation = f"posenc rotates q and k in this layout (the same roundings as the model's own {routed[0][1]})"
        else:
            whys = sorted({a.why_not_fast for a in generic if a.fast is None})
            rotation = ("the model's own attention code rotates q and k in this layout" +
                        (f" ({'; '.join(whys)})" if whys else "") +
                        (f", except in {_modules(len(routed), 'rotary module')} posenc reproduces" if routed else ""))
        readings = sorted({r for p in rotary for r in p.note.split("; reading: ")[1:]})
        _log.info(
            "patch_model: %s: layout=%r (%s); posenc now supplies %s%s, %s, and the model's weights are used as they "
            "are; %s",
            type(model).__name__, layout, reason, what, "".join(f" ({r})" for r in readings), rotation,
            core_hf_config.conversion_hint(layout),
        )
    others = [p for p in plans if p.kind not in ("rotary", "mrope")]
    if others:
        _log.info("patch_model: %s: posenc now supplies the %s of %s", type(model).__name__,
                  " and ".join(sorted({p.note for p in others})), _modules(len(others), "module"))


def _tables_of(plan: _Plan) -> list[Any]:
    sub = plan.submodule[1] if plan.submodule is not None else None
    if isinstance(sub, _RotaryAdapter):
        return list(sub.tables.values())
    if isinstance(sub, _MropeAdapter):
        return [sub.tables]
    return []



