"""Former home of the experiment code, now :mod:`posenc.lab`; kept so that old imports still work."""

import warnings

from posenc.lab import ENCODINGS, EncodingInfo, TinyTransformer, list_encodings

__all__ = ["ENCODINGS", "EncodingInfo", "TinyTransformer", "list_encodings"]

warnings.warn("posenc.models moved to posenc.lab; import from posenc.lab", DeprecationWarning, stacklevel=2)
