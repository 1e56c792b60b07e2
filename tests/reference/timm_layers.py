"""timm's layer modules for parity tests, importable without torchvision.

timm's package ``__init__`` imports its models and data pipeline, which need torchvision; PyPI's
torchvision does not import beside the CPU build of torch used here.  The positional-embedding
modules themselves need neither, so when torchvision is missing, ``timm.layers.<name>`` is loaded
under empty stand-ins for the ``timm`` and ``timm.layers`` packages (their ``__init__`` not run),
and every ``timm`` entry is taken out of ``sys.modules`` again afterwards, so other tests see
the environment unchanged.  Skips the calling test when timm is not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

import pytest

_LOADED: dict[str, types.ModuleType] = {}


def timm_layer(name: str) -> types.ModuleType:
    """``timm.layers.<name>`` (e.g. ``"pos_embed"``, ``"pos_embed_sincos"``), or skip."""
    if name in _LOADED:
        return _LOADED[name]
    spec = importlib.util.find_spec("timm")
    if spec is None:
        pytest.skip("timm is not installed")
    if importlib.util.find_spec("torchvision") is not None:
        module = importlib.import_module(f"timm.layers.{name}")
    else:
        root = os.path.dirname(spec.origin)
        saved = {n: sys.modules.pop(n) for n in list(sys.modules) if n == "timm" or n.startswith("timm.")}
        for pkg_name, path in (("timm", root), ("timm.layers", os.path.join(root, "layers"))):
            pkg = types.ModuleType(pkg_name)
            pkg.__path__ = [path]
            sys.modules[pkg_name] = pkg
        try:
            module = importlib.import_module(f"timm.layers.{name}")
        except ImportError as err:
            pytest.skip(f"timm.layers.{name} cannot be imported here: {err}")
        finally:
            for n in [n for n in sys.modules if n == "timm" or n.startswith("timm.")]:
                del sys.modules[n]
            sys.modules.update(saved)
    _LOADED[name] = module
    return module
