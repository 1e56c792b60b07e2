"""The lab: a reference Transformer, the stdlib byte corpus, ``posenc compare`` and the plots.

Used by the CLI (``posenc compare``, ``posenc plot``, ``posenc list``) and importable for your own
experiments; the library (``posenc.core``, ``posenc.functional``, ``posenc.nn``) never imports it.

``TinyTransformer`` is resolved on first use, so ``import posenc.lab`` and the registry
(``posenc.lab.registry``, ``posenc list``) work without PyTorch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from posenc.lab.registry import ENCODINGS, EncodingInfo, list_encodings

if TYPE_CHECKING:
    from posenc.lab.tiny import TinyTransformer

__all__ = ["ENCODINGS", "EncodingInfo", "TinyTransformer", "list_encodings"]


def __getattr__(name: str) -> Any:
    if name != "TinyTransformer":
        raise AttributeError(f"module 'posenc.lab' has no attribute {name!r}")
    try:
        value = importlib.import_module("posenc.lab.tiny").TinyTransformer
    except ModuleNotFoundError as err:
        if err.name != "torch":
            raise
        raise ImportError("posenc.lab.TinyTransformer needs PyTorch: pip install torch") from err
    globals()[name] = value
    return value
