"""Reference models built on posenc (nothing in the library imports this package)."""

from posenc.models.registry import ENCODINGS, EncodingInfo, list_encodings
from posenc.models.tiny import TinyTransformer

__all__ = ["ENCODINGS", "EncodingInfo", "TinyTransformer", "list_encodings"]
