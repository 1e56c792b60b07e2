"""posenc: positional encodings for Transformers, exact and fast.

Public names are re-exported lazily (PEP 562 module ``__getattr__``), so ``import posenc`` stays
cheap and importing a framework-free part (``posenc.core``) never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "sinusoidal_table": "posenc.functional",
    "sinusoidal_encoding": "posenc.functional",
    "positions_from_mask": "posenc.functional",
    "rope_inv_freq": "posenc.functional",
    "rope_cos_sin": "posenc.functional",
    "apply_rope": "posenc.functional",
    "apply_rope_qk": "posenc.functional",
    "layout_permutation": "posenc.functional",
    "convert_rope_weight": "posenc.functional",
    "sincos_table_nd": "posenc.functional",
    "grid_positions": "posenc.functional",
    "axial_cos_sin": "posenc.functional",
    "apply_axial_rope": "posenc.functional",
    "resize_position_embedding": "posenc.functional",
    "mrope_positions": "posenc.functional",
    "mrope_cos_sin": "posenc.functional",
    "SinusoidalEncoding": "posenc.nn",
    "LearnedPositionalEmbedding": "posenc.nn",
    "RotaryEmbedding": "posenc.nn",
    "SinusoidalEncodingND": "posenc.nn",
    "AxialRotaryEmbedding": "posenc.nn",
    "MultimodalRotaryEmbedding": "posenc.nn",
    "LinearScaling": "posenc.core.rope",
    "NTKScaling": "posenc.core.rope",
    "DynamicNTKScaling": "posenc.core.rope",
    "YarnScaling": "posenc.core.rope",
    "Llama3Scaling": "posenc.core.rope",
    "LongRopeScaling": "posenc.core.rope",
    "ProportionalScaling": "posenc.core.rope",
    "RopeScaling": "posenc.core.rope",
    "rope_scaling_from_hf": "posenc.core.hf_config",
    "rope_layout_from_hf": "posenc.core.hf_config",
    "mrope_from_hf": "posenc.core.hf_config",
    "mrope_vision_from_hf": "posenc.core.hf_config",
    "alibi_slopes": "posenc.functional",
    "alibi_bias": "posenc.functional",
    "relative_position_bucket": "posenc.functional",
    "positions_from_segment_ids": "posenc.functional",
    "AlibiBias": "posenc.nn",
    "RelativePositionBias": "posenc.nn",
    "attention": "posenc.attn",
}

__all__ = sorted([*_EXPORTS, "__version__"])


#: The experiment code lives in posenc.lab (the CLI's ``posenc compare``), not in the library namespace.
_LAB = ("TinyTransformer", "list_encodings")


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        if name in _LAB:
            raise AttributeError(f"posenc.{name} is experiment code: import it from posenc.lab (from posenc.lab import {name})")
        raise AttributeError(f"module 'posenc' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as err:
        if err.name != "torch":
            raise
        raise ImportError(
            f"posenc.{name} needs PyTorch: pip install 'posenc[torch]' (Keras users: import posenc.keras)"
        ) from err
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
