"""The lab: a reference Transformer, the stdlib byte corpus, ``posenc compare`` and the plots.

Used by the CLI (``posenc compare``, ``posenc plot``, ``posenc list``) and importable for your own
experiments; the library (``posenc.core``, ``posenc.functional``, ``posenc.nn``) never imports it.
"""

from posenc.lab.registry import ENCODINGS, EncodingInfo, list_encodings
from posenc.lab.tiny import TinyTransformer

__all__ = ["ENCODINGS", "EncodingInfo", "TinyTransformer", "list_encodings"]
