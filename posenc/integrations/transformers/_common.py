"""What every part of the transformers adapter shares: the patch marker and limits, the posenc logger, and
how a module's configuration, layer types and table length are read."""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from posenc.core.notices import LOGGER_NAME

_LEGACY_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text", "phi3", "gpt_neox",
                 "cohere", "glm", "deepseek_v3", "qwen2_vl", "qwen2_5_vl", "qwen2_vl_text", "qwen2_5_vl_text", "gptj",
                 "bloom", "mpt", "t5")
#: Rows precomputed per rotary table; positions past them are computed exactly on the fly.
_MAX_TABLE_ROWS = 1 << 14
#: The attribute that marks a patched module (a :class:`_Patch` in its instance dictionary).
_PATCH = "_posenc_patch"
_ULP = 2.0 ** -24                                            # float32 unit roundoff

_log = logging.getLogger(LOGGER_NAME)

def _check_module(model: object, name: str = "model") -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{name} must be a torch.nn.Module (a loaded transformers model or one of its modules), got "
                        f"{type(model).__name__}")

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


class Route(NamedTuple):
    """Where a patched model's rotation goes through posenc: the modeling module and the name of its rotate
    function that the stand-in replaces, and the engine (``engine``) it rotates with."""

    module: str
    function: str
    engine: str


#: The cos/sin formats of rotary modules (how a module lays out a position's row; not a pair layout):
#: ``"doubled"`` ``[cos, cos]`` per row, ``"repeated"`` each value twice, ``"narrow"`` half width,
#: ``"sin_cos"`` ``(sin, cos)`` half width, ``"complex"`` ``exp(i angle)``.
_FORMATS = ("doubled", "repeated", "narrow", "sin_cos", "complex")
#: Format names of patches saved by earlier versions, which named them after the pair layouts.
_RENAMED_FORMATS = {"half": "doubled", "pairs": "repeated"}
