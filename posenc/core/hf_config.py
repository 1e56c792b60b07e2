"""Read RoPE settings from a Hugging Face model configuration (framework-free).

A configuration is a ``transformers`` ``PretrainedConfig`` (read through its ``to_dict()``) or a
``config.json`` dict.  Families store their RoPE settings under different keys; every key below
changes the result, so each is read, and a key posenc cannot honour raises instead of being
dropped:

=====================  ==============================================================================
family                 keys
=====================  ==============================================================================
all (v5 and v4)        ``rope_parameters`` (v5) or ``rope_scaling`` (v4, with ``type``/``rope_type``),
                       ``rope_theta``, ``partial_rotary_factor``, ``head_dim`` (else
                       ``hidden_size // num_attention_heads``; a ``PretrainedConfig``'s
                       ``attribute_map`` aliases count), ``max_position_embeddings``,
                       ``original_max_position_embeddings``
composite configs      ``text_config`` (a ``PretrainedConfig``: what ``get_text_config(decoder=True)``
(Gemma-3, Llama-4,     returns): the language model's settings are read from there, logged at
Llava-style, VLMs)     ``INFO`` level
GPT-NeoX (raw json)    ``rotary_pct``, ``rotary_emb_base``
GPT-J, CodeGen         ``rotary_dim``, ``n_embd``, ``n_head``
DeepSeek-V2/V3         ``qk_rope_head_dim`` (the rotary part of the head, when there is no ``head_dim``),
                       ``rope_interleave``
Gemma-3, Gemma-4 and   per-layer-type ``rope_parameters`` (``{"full_attention": {...},
other per-layer-type   "sliding_attention": {...}}``) or ``rope_local_base_freq``: pick one with
models                 ``layer_type=``; ``per_layer_config`` overrides (Gemma-4's full-attention
                       ``head_dim``)
Hunyuan                ``{"type": "dynamic", "alpha": a}``: static NTK scaling of the base by
                       ``a^(d/(d-2))``, as transformers' Hunyuan code reads it
Phi-3, Phi-3.5-MoE     ``"type": "yarn"`` or ``"su"`` means LongRoPE (Phi-3); ``short_mscale`` and
                       ``long_mscale`` (Phi-3.5-MoE) are the attention factors within and past the
                       original context, switching with the short and long factors
Qwen2-VL / 2.5-VL,     ``mrope_section`` (multimodal RoPE; ``rope_type``/``type`` ``"mrope"`` means the
Qwen3-VL               default rule), ``mrope_interleaved``, ``text_config``; for
                       :func:`mrope_vision_from_hf`: ``vision_config.spatial_merge_size`` and
                       ``vision_config.tokens_per_second``.  :func:`rope_scaling_from_hf` raises on
                       them (3-D positions); :func:`mrope_from_hf` reads them, and falls back to
                       the model type's default sections as transformers does
=====================  ==============================================================================
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

from posenc import _validate
from posenc.core._hf_fields import partial_rotary_factor
from posenc.core.mrope import check_mrope_section
from posenc.core.notices import LOGGER_NAME, LayoutWarning
from posenc.core.rope import HF_ROPE_TYPES, ROPE_LAYOUTS, RopeScaling

_KNOWN = ("default", *HF_ROPE_TYPES)
#: Model types whose configuration reads an old ``"yarn"`` rope type as LongRoPE (transformers' Phi-3 code).
_YARN_IS_LONGROPE = ("phi3", "phi4_multimodal")
#: ``mrope_section`` that transformers' multimodal rotary classes fall back to when a config has none.
_MROPE_DEFAULT_SECTIONS: dict[str, tuple[int, int, int]] = {
    "qwen2_vl": (16, 24, 24), "qwen2_5_vl": (16, 24, 24), "qwen2_5_omni": (16, 24, 24), "qwen2_5_omni_thinker": (16, 24, 24),
    "paddleocr_vl": (16, 24, 24),
    "qwen3_vl": (24, 20, 20), "qwen3_vl_moe": (24, 20, 20), "qwen3_omni_moe": (24, 20, 20),
    "qwen3_omni_moe_thinker": (24, 20, 20),
    "glm4v": (8, 12, 12), "glm4v_moe": (8, 12, 12), "glm_ocr": (8, 12, 12), "glm_image": (8, 12, 12),
    "qwen3_5": (11, 11, 10), "qwen3_5_moe": (11, 11, 10),
}
_MROPE_MODEL_TYPES = tuple(_MROPE_DEFAULT_SECTIONS) + tuple(f"{t}_text" for t in _MROPE_DEFAULT_SECTIONS)


def _refuse_own_arrangement(config: Mapping[str, Any]) -> None:
    """Raise for model types whose rotary frequencies follow an arrangement of their own."""
    model_type = str(config.get("model_type") or "").removesuffix("_text")
    if model_type == "ernie4_5_vl_moe":
        raise ValueError(
            "model_type='ernie4_5_vl_moe' arranges its multimodal RoPE its own way (height and width frequencies "
            "interleaved and pre-rotated, time last), which neither RotaryEmbedding nor MultimodalRotaryEmbedding "
            "reproduces"
        )


def _mrope_default(model_type: str) -> tuple[int, int, int] | None:
    """The default ``mrope_section`` of a multimodal-RoPE model type (or its ``_text`` config)."""
    return _MROPE_DEFAULT_SECTIONS.get(model_type.removesuffix("_text"))
#: Model types whose RoPE pairs features (2i, 2i + 1); the others pair (i, i + d/2).
INTERLEAVED_MODEL_TYPES = (
    "gptj", "codegen", "cohere", "cohere2", "cohere2_moe", "glm", "glm4", "deepseek_v2", "deepseek_v3", "deepseek_v4",
    "ernie4_5",
    "ernie4_5_moe", "helium", "moonshine", "llama4", "llama4_text", "glm4v", "glm4v_text", "glm_ocr", "glm_ocr_text",
)
#: Model types whose heads rotate their *trailing* rotary-dim features (the leading ones pass through):
#: DeepSeek-V4 lays each head out as ``[nope | rope]``.  Every other model rotates the leading features.
TRAILING_ROTARY_MODEL_TYPES = ("deepseek_v4",)


def rope_slice_from_hf(config: object) -> str:
    """``"last"`` for a model type that rotates the trailing features of each head
    (:data:`TRAILING_ROTARY_MODEL_TYPES`), else ``"first"``."""
    model_type = config_dict(config).get("model_type")
    return "last" if model_type in TRAILING_ROTARY_MODEL_TYPES else "first"


#: Model types known to pair features (i, i + d/2) (transformers' ``rotate_half``).  Other model
#: types not in :data:`INTERLEAVED_MODEL_TYPES` are assumed to, as most transformers models do.
HALF_MODEL_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
    "gemma3_text", "phi", "phi3", "gpt_neox", "gpt_neox_japanese", "persimmon", "starcoder2", "stablelm", "olmo",
    "olmo2", "granite", "falcon", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text", "qwen3_vl",
    "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text",
)

_log = logging.getLogger(LOGGER_NAME)


def config_dict(config: object) -> dict[str, Any]:
    """A configuration as a plain dict: a ``PretrainedConfig`` through ``to_dict()``, or a mapping.

    A ``PretrainedConfig``'s ``attribute_map`` aliases (JetMoe's ``head_dim`` is ``kv_channels``,
    Zamba2's is ``attention_head_dim``) are added under their public names, as the model's code
    reads them through ``getattr``.
    """
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        result = to_dict()
        if isinstance(result, Mapping):
            result = dict(result)
            aliases = getattr(type(config), "attribute_map", None)
            if isinstance(aliases, Mapping):
                for alias, target in aliases.items():
                    if isinstance(alias, str) and isinstance(target, str) and result.get(alias) is None \
                            and result.get(target) is not None:
                        result[alias] = result[target]
            return result
    raise TypeError(
        f"config must be a transformers PretrainedConfig or a dict (a parsed config.json), got {type(config).__name__}"
    )


def _rope_params(config: Mapping[str, Any], layer_type: str | None) -> dict[str, Any]:
    """The rope parameter dict for ``layer_type`` (per-layer-type configs need one)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"rope_scaling/rope_parameters must be a dict, got {params!r}")
    per_type = any(isinstance(v, Mapping) for v in params.values()) and \
        all(v is None or isinstance(v, Mapping) for v in params.values())
    if per_type:
        if layer_type is None:
            raise ValueError(
                f"this config has rope parameters per layer type ({', '.join(params)}); pass layer_type= one of them"
            )
        if layer_type not in params:
            raise ValueError(f"layer_type must be one of {', '.join(repr(t) for t in params)}, got {layer_type!r}")
        if params[layer_type] is None:
            raise ValueError(
                f"layer_type={layer_type!r} has no rope parameters in this config (its layers use no rotary "
                f"embedding); pick one of {', '.join(repr(t) for t, v in params.items() if v is not None)}"
            )
        return dict(params[layer_type])
    params = dict(params)
    if layer_type is None and config.get("rope_local_base_freq") is not None:
        raise ValueError(
            "this config gives local (sliding-window) layers their own base, rope_local_base_freq; pass "
            "layer_type='full_attention' or 'sliding_attention'"
        )
    if layer_type is not None:
        local = config.get("rope_local_base_freq")
        if layer_type == "sliding_attention" and local is not None:
            return {"rope_type": "default", "rope_theta": local}             # Gemma-3's local layers: no scaling
        if layer_type not in ("full_attention", "sliding_attention"):
            raise ValueError(f"layer_type must be 'full_attention' or 'sliding_attention' here, got {layer_type!r}")
    return params


#: Keys that size the attention heads; a config with none of them is read through its ``text_config``.
_DIM_KEYS = ("head_dim", "hidden_size", "num_attention_heads", "n_embd", "n_head", "qk_rope_head_dim", "rotary_dim")
#: Where a composite config.json keeps its language model's settings, in order.
_TEXT_KEYS = ("text_config", "decoder", "generator")
#: Model types whose code rotates ``config.rotary_dim`` features (transformers' other rotary classes
#: ignore a ``rotary_dim`` key and rotate ``head_dim * partial_rotary_factor``).
_ROTARY_DIM_MODEL_TYPES = ("gptj", "codegen")


def _head_dim(config: Mapping[str, Any], where: str = "config") -> int:
    """The head dim transformers' rotary classes use: ``head_dim``, else ``hidden_size // num_attention_heads``.

    A raw DeepSeek config.json has no ``head_dim``, and its config class sets it to
    ``qk_rope_head_dim``; GPT-J and CodeGen rotate ``rotary_dim`` features (also a raw config
    without a model type that names ``rotary_dim``).
    """
    model_type = config.get("model_type")
    if config.get("rotary_dim") is not None and (model_type in _ROTARY_DIM_MODEL_TYPES or not model_type):
        return _validate.check_int("rotary_dim", config["rotary_dim"], minimum=2)
    if config.get("head_dim") is not None:
        return _validate.check_int("head_dim", config["head_dim"], minimum=2)
    if config.get("qk_rope_head_dim") is not None:
        return _validate.check_int("qk_rope_head_dim", config["qk_rope_head_dim"], minimum=2)
    hidden = config.get("hidden_size", config.get("n_embd"))
    heads = config.get("num_attention_heads", config.get("n_head"))
    if hidden is None or heads is None:
        hint = (" (this is the text_config of a composite config)" if where != "config" else
                "; a composite config (a vision-language model such as Gemma-3, Llama-4, Qwen2-VL, or a "
                "Llava-style wrapper) keeps them in its text_config, and this config has no text_config: pass "
                "the language model's config (config.get_text_config())")
        raise ValueError(f"{where} needs head_dim, or hidden_size and num_attention_heads (n_embd and n_head){hint}")
    heads = _validate.check_int("num_attention_heads", heads, minimum=1)
    return _validate.check_int("hidden_size", hidden, minimum=1) // heads


def _text_level(config: object, who: str) -> tuple[dict[str, Any], str]:
    """``(settings, where)``: the settings of the config's language model.

    A composite config (vision-language models, Llava-style wrappers, encoder-decoder pairs) keeps
    them in a sub-config: for a ``PretrainedConfig`` the one its ``get_text_config(decoder=True)``
    returns, for a dict its ``text_config`` (else ``decoder``, ``generator``).  The switch is logged
    at ``INFO`` level.
    """
    outer = config_dict(config)
    text: object = None
    if isinstance(config, Mapping):
        text = next((outer[k] for k in _TEXT_KEYS if isinstance(outer.get(k), Mapping)), None)
    elif callable(getattr(config, "get_text_config", None)):
        try:
            text = config.get_text_config(decoder=True)  # type: ignore[attr-defined]
        except ValueError:                               # several candidates: fall back to text_config
            text = getattr(config, "text_config", None)
        if text is config:
            text = None
    if text is None:
        return outer, "config"
    inner = config_dict(text)
    if not any(inner.get(k) is not None for k in _DIM_KEYS) and any(outer.get(k) is not None for k in _DIM_KEYS):
        return outer, "config"
    if _log.isEnabledFor(logging.INFO):
        _log.info("%s: model_type=%r is a composite config; reading the rotary settings of its language model "
                  "from text_config (model_type=%r)", who, outer.get("model_type"), inner.get("model_type"))
    return inner, "config.text_config"


#: Keys of a per-layer override that change the rotary embedding.
_ROPE_KEYS = (*_DIM_KEYS, "partial_rotary_factor", "rope_parameters", "rope_scaling", "rope_theta",
              "max_position_embeddings", "original_max_position_embeddings")


def _layer_config(config: dict[str, Any], layer_type: str | None) -> dict[str, Any]:
    """``config`` with the ``per_layer_config`` overrides of ``layer_type``'s layers (Gemma 4's full-attention
    layers have their own ``head_dim``); layers of one type that disagree raise."""
    per_layer = config.get("per_layer_config")
    if not per_layer or layer_type is None:
        return config
    if not isinstance(per_layer, Mapping):
        raise ValueError(f"per_layer_config must be a dict of layer index -> overrides, got {per_layer!r}")
    by_index = {int(k): v for k, v in per_layer.items() if str(k).strip().isdigit() and isinstance(v, Mapping)}
    types = config.get("layer_types") or []
    found = [{k: v for k, v in by_index.get(i, {}).items() if k in _ROPE_KEYS} for i, t in enumerate(types)
             if t == layer_type]
    if not found:
        return config
    if any(f != found[0] for f in found):
        raise ValueError(
            f"the layers of layer_type={layer_type!r} override their rotary settings differently in per_layer_config "
            f"({found}); posenc builds one rotary table per layer type"
        )
    return {**config, **found[0]}


def rope_scaling_from_hf(config: object, *, layer_type: str | None = None) -> tuple[float, int, RopeScaling | None]:
    """``(base, rotary_dim, scaling)`` from a Hugging Face model configuration.

    Args:
        config: a ``transformers`` ``PretrainedConfig`` or a ``config.json`` dict (see the module
            docstring for the keys read, per family).
        layer_type: for configs with rope parameters per layer type (Gemma-3:
            ``"full_attention"`` or ``"sliding_attention"``).

    Rules: ``default``, ``linear``, ``dynamic``, ``yarn``, ``llama3``, ``longrope`` (and its old
    name ``su``) and ``proportional``.  Anything else raises :class:`ValueError` naming it; nothing
    falls back silently.  Family details follow transformers' model code: Hunyuan's
    ``{"type": "dynamic", "alpha": a}`` is static NTK scaling by ``a``; Phi-3's ``"yarn"`` is
    LongRoPE; Phi-3.5-MoE's ``short_mscale``/``long_mscale`` set the attention factor within and past
    the original context (switching with the short and long factors); YaRN without a
    ``factor`` key raises, and ``"factor": null`` means ``max_position_embeddings /
    original_max_position_embeddings``.

    A composite config (Gemma-3, Llama-4, Qwen2-VL, Llava-style wrappers) whose top level sizes no
    attention head is read through its ``text_config`` (logged at ``INFO`` level).

    Examples:
        >>> rope_scaling_from_hf({"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 500000.0,
        ...     "max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
        ...     "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})
        (500000.0, 128, Llama3Scaling(factor=8.0, original_max_seq_len=8192, low_freq_factor=1.0, high_freq_factor=4.0))
        >>> rope_scaling_from_hf({"hidden_size": 2048, "num_attention_heads": 16, "rotary_pct": 0.25,
        ...     "rotary_emb_base": 1000000})                               # a GPT-NeoX config.json
        (1000000.0, 32, None)
    """
    config, where = _text_level(config, "rope_scaling_from_hf")
    params = _rope_params(config, layer_type)
    config = _layer_config(config, layer_type)
    model_type = str(config.get("model_type") or "")
    _refuse_own_arrangement(config)
    if config.get("patch_size") is not None and config.get("vocab_size") is None:
        raise ValueError(
            f"model_type={model_type!r} looks like a vision encoder (patch_size, no vocab_size): its rotary embedding "
            f"runs over patch rows and columns (2-D), not 1-D token positions; use posenc's axial rotary encoding"
        )
    if params.get("mrope_section") is not None or config.get("mrope_section") is not None \
            or _mrope_default(model_type) is not None:
        raise ValueError(
            f"this config uses multimodal RoPE (mrope_section{'' if model_type not in _MROPE_MODEL_TYPES else f', model_type={model_type!r}'}: "
            "3-D positions for text, image and video); rope_scaling_from_hf reads 1-D rotary embeddings only: use "
            "mrope_from_hf or MultimodalRotaryEmbedding.from_hf_config"
        )
    return _read_rope(config, params, where)


def _read_rope(config: Mapping[str, Any], params: Mapping[str, Any],
               where: str = "config") -> tuple[float, int, RopeScaling | None]:
    """``(base, rotary_dim, scaling)`` from a config dict and its rope parameters."""
    theta = params.get("rope_theta", config.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    base = _validate.check_float("rope_theta", theta, positive=True)
    head_dim = _head_dim(config, where)
    partial = partial_rotary_factor(params, config)
    rule = params.get("rope_type") or params.get("type") or "default"
    model_type = config.get("model_type")
    if rule == "yarn" and model_type in _YARN_IS_LONGROPE:
        rule = "longrope"                          # Phi-3 and Phi-4-multimodal read an old "yarn" as LongRoPE
    if rule == "axial":
        raise ValueError(
            "rope type 'axial' is 2-D RoPE over image patch rows and columns (a vision encoder), not 1-D "
            "positions; use posenc's axial rotary encoding for it"
        )
    if rule not in _KNOWN:
        raise ValueError(f"unknown rope scaling type {rule!r}; posenc supports {', '.join(_KNOWN)}")
    rule_class = HF_ROPE_TYPES.get(rule)                                # None: "default", no rule
    if rule_class is not None and rule_class.reads_partial_rotary:      # the whole head, some pairs at rest
        return base, head_dim, rule_class.from_hf(params, config)
    rotary_dim = int(head_dim * partial)
    if rotary_dim < 2:
        raise ValueError(f"partial_rotary_factor={partial} of head_dim={head_dim} leaves no feature pair to rotate")
    if rotary_dim % 2:
        raise ValueError(
            f"head_dim={head_dim} with partial_rotary_factor={partial} gives {rotary_dim} rotary features, an odd "
            f"count: transformers then builds {(rotary_dim + 1) // 2} frequencies base^(-2i/{rotary_dim}) for "
            f"{rotary_dim + 1} features, which posenc's rotary tables (base^(-2i/dim) for an even dim) cannot "
            f"reproduce; choose head_dim and partial_rotary_factor whose product is even"
        )
    return base, rotary_dim, None if rule_class is None else rule_class.from_hf(params, config)


class RopeLayoutSource(NamedTuple):
    """The RoPE pair layout a configuration implies, and why (from :func:`describe_rope_layout`)."""

    #: ``"half"`` or ``"interleaved"``.
    layout: str
    #: Where it comes from, for messages: the config class, model type and head dims.
    reason: str
    #: Whether the model type names the layout (False: assumed, the model type is missing or unknown).
    known: bool


def _dims_note(config: Mapping[str, Any], rotary_dim: int | None) -> str:
    """``head_dim=...`` (and the rotary part of the head) as far as the config states them, for messages."""

    def count(key: str) -> int | None:
        value = config.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    head = count("head_dim")
    if head is None:
        hidden, heads = count("hidden_size") or count("n_embd"), count("num_attention_heads") or count("n_head")
        head = hidden // heads if hidden and heads else None
    if count("qk_rope_head_dim") is not None:                     # DeepSeek: a rotary part beside the rest
        return f"qk_rope_head_dim={count('qk_rope_head_dim')}"
    rotary = rotary_dim if rotary_dim is not None else count("rotary_dim")
    parts = [] if head is None else [f"head_dim={head}"]
    if rotary is not None and rotary != head:
        parts.append(f"rotary_dim={rotary}")
    return ", ".join(parts)


def describe_rope_layout(config: object, *, rotary_dim: int | None = None) -> RopeLayoutSource:
    """The pair layout a configuration implies, with the reason as :func:`rope_layout_from_hf` logs it.

    Args:
        config: a ``transformers`` ``PretrainedConfig`` or a ``config.json`` dict.
        rotary_dim: the rotated features per head, when known, to name in the reason.

    Examples:
        >>> found = describe_rope_layout({"model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64})
        >>> found.layout, found.known
        ('interleaved', True)
        >>> found.reason
        "config dict, model_type='gptj', head_dim=256, rotary_dim=64: the model pairs adjacent features (2i, 2i + 1)"
    """
    source = "config dict" if isinstance(config, Mapping) else type(config).__name__
    config = config_dict(config)
    model_type = config.get("model_type")
    text = config.get("text_config")
    if model_type not in (*INTERLEAVED_MODEL_TYPES, *HALF_MODEL_TYPES) and isinstance(text, Mapping) \
            and text.get("model_type") in (*INTERLEAVED_MODEL_TYPES, *HALF_MODEL_TYPES):
        config, source = dict(text), f"{source}.text_config"       # a wrapper: its text model rotates q and k
        model_type = config["model_type"]
    dims = _dims_note(config, rotary_dim)
    where = f"{source}, model_type={model_type!r}" + (f", {dims}" if dims else "")
    adjacent, split = "the model pairs adjacent features (2i, 2i + 1)", "transformers rotates half-split pairs (i, i + d/2)"
    if model_type == "deepseek_v3":                                    # the model tests the flag's truth
        if "rope_interleave" in config and not config["rope_interleave"]:
            return RopeLayoutSource("half", f"{where}, rope_interleave={config['rope_interleave']!r}: {split}", True)
        flag = f"rope_interleave={config['rope_interleave']!r}" if "rope_interleave" in config else \
            "rope_interleave unset (default true)"
        return RopeLayoutSource("interleaved", f"{where}, {flag}: {adjacent}", True)
    if "rope_interleave" in config and model_type not in (*INTERLEAVED_MODEL_TYPES, *HALF_MODEL_TYPES):
        # DeepSeek's latent attention, as its derivatives (GLM-4 MoE Lite, Mistral 4, ...) copy it: the attention
        # picks the rotate function by the flag's truth
        flag = f"rope_interleave={config['rope_interleave']!r}"
        if config["rope_interleave"]:
            return RopeLayoutSource("interleaved", f"{where}, {flag}: {adjacent}", True)
        return RopeLayoutSource("half", f"{where}, {flag}: {split}", True)
    if model_type in INTERLEAVED_MODEL_TYPES:
        return RopeLayoutSource("interleaved", f"{where}: {adjacent}", True)
    if model_type in HALF_MODEL_TYPES:
        return RopeLayoutSource("half", f"{where}: {split}", True)
    if not isinstance(model_type, str) or not model_type:
        return RopeLayoutSource(
            "half", f"{where}: the config names no model type, so posenc assumes transformers' half-split pairs "
                    f"(i, i + d/2)", False)
    return RopeLayoutSource(
        "half", f"{where}: a model type posenc has no layout on record for, so it assumes transformers' half-split "
                f"pairs (i, i + d/2); if the model's rotate_half pairs x[..., 0::2] with x[..., 1::2], pass "
                f"layout='interleaved'", False)


def rope_layout_from_hf(config: object) -> str:
    """The pair layout a model family uses: ``"interleaved"`` (pairs ``2i, 2i + 1``: GPT-J, Cohere,
    GLM, DeepSeek-V2/V3 unless ``rope_interleave`` is false or null, and the other types in
    :data:`INTERLEAVED_MODEL_TYPES`) or ``"half"`` (pairs ``i, i + d/2``:
    Llama, Mistral, Qwen, Gemma, Phi-3, GPT-NeoX and most others).

    The layout and the reason are logged at ``INFO`` level on the ``"posenc"`` logger.  Weights
    from a checkpoint of the other layout (Meta's original Llama code, rotary-embedding-torch and
    torchtune pair adjacent features) must be converted once:
    ``posenc.convert_rope_weight(w, num_heads, src="interleaved", dst="half")``.

    Examples:
        >>> rope_layout_from_hf({"model_type": "gptj"}), rope_layout_from_hf({"model_type": "llama"})
        ('interleaved', 'half')
    """
    found = describe_rope_layout(config)
    if _log.isEnabledFor(logging.INFO):
        _log.info("rope_layout_from_hf: layout=%r (%s); %s", found.layout, found.reason, conversion_hint(found.layout))
    return found.layout


def choose_rope_layout(config: object, layout: str | None, *, who: str, rotary_dim: int | None = None,
                       stacklevel: int = 3) -> str:
    """The layout a ``from_hf_config`` builds with: ``layout`` when given, else the config's.

    Logs the choice and why at ``INFO`` level, and warns with :class:`~posenc.core.notices.LayoutWarning`
    (at the caller's caller, ``stacklevel``) when a given ``layout`` contradicts the model type.
    ``who`` names the caller in the messages.
    """
    if layout is not None:
        layout = _validate.check_choice("layout", layout, ROPE_LAYOUTS)
    found = describe_rope_layout(config, rotary_dim=rotary_dim)
    if layout is None:
        layout = found.layout
        how = f"layout={layout!r} ({found.reason})"
    elif not found.known:
        how = f"layout={layout!r} as given; the config does not settle it ({found.reason})"
    elif layout == found.layout:
        how = f"layout={layout!r} as given, as the config implies ({found.reason})"
    else:
        how = f"layout={layout!r} as given, overriding the config's {found.layout!r} ({found.reason})"
        warnings.warn(
            f"{who}: layout={layout!r} contradicts the config, which implies layout={found.layout!r} "
            f"({found.reason}); weights trained with this config rotate as {found.layout!r} and give wrong "
            f"attention scores here unless converted: leave layout= out, or convert them once with "
            f"posenc.convert_rope_weight(w, num_heads, src={found.layout!r}, dst={layout!r})",
            LayoutWarning,
            stacklevel=stacklevel,
        )
    if _log.isEnabledFor(logging.INFO):
        _log.info("%s: %s; %s", who, how, conversion_hint(layout))
    return layout


def conversion_hint(layout: str) -> str:
    """One line on moving weights of the other layout into ``layout`` (for posenc's messages)."""
    other = "interleaved" if layout == "half" else "half"
    who = ("weights from Meta's original Llama code, rotary-embedding-torch or torchtune pair adjacent features"
           if layout == "half" else "weights trained with half-split pairs (transformers' rotate_half)")
    return (f"{who}: convert them once with posenc.convert_rope_weight(w, num_heads, src={other!r}, "
            f"dst={layout!r})")


def _mrope_config(config: object) -> tuple[dict[str, Any], str]:
    """``(settings, where)``: the (text) config that holds ``mrope_section``: the config itself or its
    ``text_config``, else the config that sizes the attention heads (see :func:`_text_level`)."""
    outer = config_dict(config)

    def has_section(c: Mapping[str, Any]) -> bool:
        params = c.get("rope_parameters") or c.get("rope_scaling") or {}
        return c.get("mrope_section") is not None or isinstance(params, Mapping) and params.get("mrope_section") is not None

    if has_section(outer):
        return outer, "config"
    text = outer.get("text_config") if isinstance(config, Mapping) else getattr(config, "text_config", None)
    if isinstance(config, Mapping) and not isinstance(text, Mapping):
        text = None
    if text is not None and has_section(config_dict(text)):
        return config_dict(text), "config.text_config"
    return _text_level(config, "mrope_from_hf")


def mrope_from_hf(config: object) -> tuple[float, int, RopeScaling | None, tuple[int, int, int], bool]:
    """``(base, rotary_dim, scaling, mrope_section, mrope_interleaved)`` of a multimodal-RoPE config.

    Reads Qwen2-VL, Qwen2.5-VL and Qwen3-VL configurations, whole (the text settings are read from
    ``text_config`` when the top level has none) or as their text config: ``mrope_section`` from
    ``rope_parameters`` (transformers 5) or ``rope_scaling`` (transformers 4, where ``"type":
    "mrope"`` names the default rule), the base from ``rope_theta``, the head dim as for
    :func:`rope_scaling_from_hf`, and any scaling rule beside the sections.  A config without
    ``mrope_section`` gets its model type's default sections, as transformers' rotary class falls
    back to (Qwen2-VL and Qwen2.5-VL ``[16, 24, 24]``, Qwen3-VL ``[24, 20, 20]``, GLM-4V
    ``[8, 12, 12]``, ...).

    Raises:
        ValueError: no ``mrope_section`` and a model type without default sections (a 1-D RoPE
            config: use :func:`rope_scaling_from_hf`), or sections that do not sum to ``rotary_dim / 2``.

    Examples:
        >>> mrope_from_hf({"hidden_size": 3584, "num_attention_heads": 28, "rope_theta": 1000000.0,
        ...                "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}})
        (1000000.0, 128, None, (16, 24, 24), False)
    """
    outer_type = str(config_dict(config).get("model_type") or "")
    config, where = _mrope_config(config)
    _refuse_own_arrangement(config)
    params = _rope_params(config, None)
    section = params.get("mrope_section", config.get("mrope_section"))
    if section is None:
        section = _mrope_default(str(config.get("model_type") or "")) or _mrope_default(outer_type)
        if section is None:
            raise ValueError(
                "this config has no mrope_section (in rope_parameters, rope_scaling or text_config) and its model "
                "type has no default sections, so it is not a multimodal RoPE config; read 1-D RoPE with "
                "rope_scaling_from_hf / RotaryEmbedding.from_hf_config"
            )
        if _log.isEnabledFor(logging.INFO):
            _log.info("mrope_from_hf: the config has no mrope_section; using model_type=%r's default %s, as "
                      "transformers' rotary class does", config.get("model_type") or outer_type, list(section))
    interleaved = params.get("mrope_interleaved", config.get("mrope_interleaved", False))
    if not isinstance(interleaved, bool):
        raise ValueError(f"mrope_interleaved must be true or false, got {interleaved!r}")
    params = dict(params)
    for key in ("rope_type", "type"):
        if params.get(key) == "mrope":                                   # transformers 4's name for the default
            params[key] = "default"
    if params.get("rope_type") is None and params.get("type") is not None:
        params["rope_type"] = params["type"]
    base, rotary_dim, scaling = _read_rope(config, params, where)
    return base, rotary_dim, scaling, check_mrope_section(section, rotary_dim), interleaved


def mrope_vision_from_hf(config: object) -> dict[str, Any]:
    """``{"spatial_merge_size": ..., "tokens_per_second": ...}`` from a Qwen2-VL / Qwen2.5-VL config,
    as keyword arguments for :func:`posenc.mrope_positions`.

    ``spatial_merge_size`` comes from ``vision_config`` (default 2); ``tokens_per_second`` too,
    where it exists (Qwen2.5-VL: temporal positions scale with time), else None (Qwen2-VL: one
    temporal position per frame grid).  Qwen3-VL numbers its video frames differently and raises.

    Examples:
        >>> mrope_vision_from_hf({"model_type": "qwen2_5_vl", "vision_config": {"spatial_merge_size": 2,
        ...                       "tokens_per_second": 2}})
        {'spatial_merge_size': 2, 'tokens_per_second': 2}
    """
    config = config_dict(config)
    model_type = str(config.get("model_type") or "")
    if model_type.startswith(("qwen3_vl", "qwen3_omni", "glm4v")):
        raise ValueError(
            f"model_type={model_type!r} places video frames with timestamps, not the Qwen2-VL / Qwen2.5-VL rule that "
            f"mrope_positions follows; use the model's own get_rope_index for its positions"
        )
    vision = config.get("vision_config")
    if vision is not None and not isinstance(vision, Mapping):
        if not callable(getattr(vision, "to_dict", None)):
            raise TypeError(f"vision_config must be a dict or a PretrainedConfig, got {type(vision).__name__}")
        vision = config_dict(vision)
    vision = vision or {}
    merge = _validate.check_int("spatial_merge_size", vision.get("spatial_merge_size", 2), minimum=1)
    tps = vision.get("tokens_per_second", config.get("tokens_per_second"))
    if isinstance(tps, int) and not isinstance(tps, bool):
        tps = _validate.check_int("tokens_per_second", tps, minimum=1)
    elif tps is not None:
        tps = _validate.check_float("tokens_per_second", tps, positive=True)
    return {"spatial_merge_size": merge, "tokens_per_second": tps}
