"""Read RoPE settings from a Hugging Face ``config.json`` dict (framework-free)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.core.rope import (
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    RopeScaling,
    YarnScaling,
)

_KNOWN = ("default", "linear", "dynamic", "yarn", "llama3", "longrope", "su")


def _need(params: Mapping[str, Any], key: str, rule: str) -> Any:
    if params.get(key) is None:
        raise ValueError(f"rope scaling {rule!r} needs {key!r} in the config's rope parameters, got {dict(params)}")
    return params[key]


def rope_scaling_from_hf(config: Mapping[str, Any]) -> tuple[float, int, RopeScaling | None]:
    """``(base, rotary_dim, scaling)`` from a Hugging Face model config dict.

    Reads ``rope_theta``, the older ``rope_scaling`` (with ``type`` or ``rope_type``) or the newer
    ``rope_parameters`` dict, ``partial_rotary_factor``, ``head_dim`` (else ``hidden_size //
    num_attention_heads``) and ``max_position_embeddings``/``original_max_position_embeddings``.
    Rules: ``default``, ``linear``, ``dynamic``, ``yarn``, ``llama3``, ``longrope`` (and its old
    name ``su``).  Anything else raises :class:`ValueError` naming it; nothing falls back silently.

    Examples:
        >>> rope_scaling_from_hf({"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 500000.0,
        ...     "max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
        ...     "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})
        (500000.0, 128, Llama3Scaling(factor=8.0, original_max_seq_len=8192, low_freq_factor=1.0, high_freq_factor=4.0))
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict (a parsed config.json), got {type(config).__name__}")
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"rope_scaling/rope_parameters must be a dict, got {params!r}")
    if params and all(isinstance(v, Mapping) for v in params.values()):
        raise ValueError(
            f"per-layer-type rope parameters ({', '.join(params)}) are not supported by rope_scaling_from_hf; "
            f"pass one layer type's dict as config['rope_parameters']"
        )
    base = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    head_dim = config.get("head_dim")
    if head_dim is None:
        try:
            head_dim = int(config["hidden_size"]) // int(config["num_attention_heads"])
        except KeyError as err:
            raise ValueError(f"config needs head_dim, or hidden_size and num_attention_heads; missing {err}") from None
    factor_partial = float(params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)))
    rotary_dim = int(int(head_dim) * factor_partial)
    rule = params.get("rope_type", params.get("type", "default"))
    if rule not in _KNOWN:
        raise ValueError(f"unknown rope scaling type {rule!r}; posenc supports {', '.join(_KNOWN)}")
    max_pos = config.get("max_position_embeddings")

    def original() -> int:
        # Phi-3 keeps the pretraining length at the top level, and it takes priority there.
        value = config.get("original_max_position_embeddings") or params.get("original_max_position_embeddings") or max_pos
        if value is None:
            raise ValueError(f"rope scaling {rule!r} needs original_max_position_embeddings or max_position_embeddings")
        return int(value)

    if rule == "default":
        return base, rotary_dim, None
    if rule == "linear":
        return base, rotary_dim, LinearScaling(float(_need(params, "factor", rule)))
    if rule == "dynamic":
        if max_pos is None:
            raise ValueError("rope scaling 'dynamic' needs max_position_embeddings in the config")
        return base, rotary_dim, DynamicNTKScaling(float(_need(params, "factor", rule)), int(max_pos))
    if rule == "yarn":
        orig = original()
        factor = params.get("factor")
        if factor is None:
            factor = _need(config, "max_position_embeddings", rule) / orig
        return base, rotary_dim, YarnScaling(
            float(factor), orig,
            beta_fast=float(params.get("beta_fast") or 32.0), beta_slow=float(params.get("beta_slow") or 1.0),
            mscale=params.get("mscale"), mscale_all_dim=params.get("mscale_all_dim"),
            attention_factor_override=params.get("attention_factor"), truncate=bool(params.get("truncate", True)),
        )
    if rule == "llama3":
        return base, rotary_dim, Llama3Scaling(
            float(_need(params, "factor", rule)), original(),
            low_freq_factor=float(_need(params, "low_freq_factor", rule)),
            high_freq_factor=float(_need(params, "high_freq_factor", rule)),
        )
    orig = original()
    factor = params.get("factor")
    if factor is None:
        factor = (max_pos / orig) if max_pos else 1.0
    return base, rotary_dim, LongRopeScaling(
        tuple(_need(params, "short_factor", rule)), tuple(_need(params, "long_factor", rule)), orig,
        factor=float(factor), attention_factor_override=params.get("attention_factor"),
    )
