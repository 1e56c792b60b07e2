"""Former home of the experiment code, now :mod:`posenc.lab`; kept so that old imports still work until
posenc 0.2 removes it (deprecated since 2026-11, with a ``DeprecationWarning`` on import)."""

import sys
import warnings

from posenc import lab
from posenc.lab import (
    ENCODINGS,
    EncodingInfo,
    TinyTransformer,
    corpus,
    experiment,
    list_encodings,
    plots,
    registry,
    tiny,
)

# the old submodule paths (posenc.models.tiny, ...) name the same modules
for _module in (corpus, experiment, plots, registry, tiny):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
del _module, lab

__all__ = ["ENCODINGS", "EncodingInfo", "TinyTransformer", "list_encodings"]

warnings.warn("posenc.models moved to posenc.lab and will be removed in posenc 0.2; import from posenc.lab",
              DeprecationWarning, stacklevel=2)
