"""Reading single fields of a Hugging Face config for the RoPE scaling rules' ``from_hf``.

Each rule in :mod:`posenc.core.rope` reads its own parameters from a config's rope parameters
(``rope_parameters`` in transformers v5, ``rope_scaling`` in v4) and, where it needs them, from the
config's top level; these helpers give the same checks and messages to all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc import _validate

#: Model types whose LongRoPE reads ``short_mscale``/``long_mscale`` as the attention factor.
MSCALE_MODEL_TYPES = ("phimoe",)
#: The model type a config with Hunyuan's ``{"type": "dynamic", "alpha": a}`` (static NTK) belongs to.
NTK_ALPHA_MODEL_TYPE = "hunyuan_v1_dense"


def need(params: Mapping[str, Any], key: str, rule: str) -> Any:
    """``params[key]``, or a ``ValueError`` naming the rule and the missing key."""
    if params.get(key) is None:
        raise ValueError(f"rope scaling {rule!r} needs {key!r} in the config's rope parameters, got {dict(params)}")
    return params[key]


def whole(name: str, value: Any) -> int:
    """A count from a config: an int, or a float holding a whole number (JSON may write 8192.0)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return _validate.check_int(name, value)


def number(params: Mapping[str, Any], key: str, rule: str) -> float:
    """A required float parameter of ``rule``."""
    return _validate.check_float(key, need(params, key, rule))


def original_length(params: Mapping[str, Any], config: Mapping[str, Any], rule: str) -> int:
    """The pretraining context: ``original_max_position_embeddings`` (Phi-3 keeps it at the top
    level, which takes priority), else ``max_position_embeddings``."""
    value = config.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
    max_pos = config.get("max_position_embeddings")
    if not value and max_pos is not None:
        return whole("max_position_embeddings", max_pos)
    if value is None:
        raise ValueError(f"rope scaling {rule!r} needs original_max_position_embeddings or max_position_embeddings")
    return whole("original_max_position_embeddings", value)


def partial_rotary_factor(params: Mapping[str, Any], config: Mapping[str, Any]) -> float:
    """The rotated fraction of the head: ``partial_rotary_factor`` (rope parameters, then the top
    level) or GPT-NeoX's ``rotary_pct``; 1.0 when absent."""
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor", config.get("rotary_pct", 1.0)))
    partial = _validate.check_float("partial_rotary_factor", partial, positive=True)
    if partial > 1.0:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {partial}")
    return partial
