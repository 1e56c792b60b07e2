"""Helpers for the migration parity tests (tests/test_migration.py, tests/keras/test_migration_keras_hub.py).

``peer_atol`` is the error bound of a peer library that forms RoPE or sinusoidal angles in float32;
``torchtune_module`` loads one torchtune source file without running torchtune's package
``__init__``, which imports torchao, datasets and the rest of its training stack.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

import pytest

_LOADED: dict[str, types.ModuleType] = {}

#: float32 unit roundoff.
U32 = 2.0**-24
#: bfloat16 unit roundoff.
UBF16 = 2.0**-8


def peer_atol(max_position: int, x_abs_max: float, *, output_u: float = U32) -> float:
    """Largest error a peer that computes angles in float32 can make on one rotated (or added) value.

    The peer forms ``theta_i = base^(-2i/d)`` with a float32 ``pow`` and division (a few ulp,
    bounded here by ``6 u``) and the angle ``p * theta_i`` with one more float32 rounding, so its
    angle is off by at most ``7 u p theta_i <= 7 u p`` radians, and its cos and sin by that plus one
    ulp.  A rotated value mixes two inputs, ``x1 cos - x2 sin``, so it is off by at most
    ``2 |x|max (7 u p + 2 u)``, plus the rounding of the result to the output dtype
    (``output_u``, times the largest output ``2 |x|max``), made once by posenc and once by the peer.
    posenc's own error is below the last term (its angles are exact).  The bound grows with the
    position, as the peer's error does, yet stays far below the order-1 error of a wrong layout or
    base: ``7 u p`` is 1.7e-3 at p = 4096.
    """
    return 2.0 * x_abs_max * (7.0 * U32 * max_position + 2.0 * U32) + 2.0 * 2.0 * x_abs_max * output_u


def torchtune_module(relative_path: str) -> types.ModuleType:
    """A torchtune source file (``"modules/position_embeddings.py"``), loaded on its own, or skip.

    Only files that import nothing of torchtune itself can be loaded this way; the two rotary files
    used here import torch and the standard library only.
    """
    if relative_path in _LOADED:
        return _LOADED[relative_path]
    spec = importlib.util.find_spec("torchtune")          # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torchtune is not installed (pip install torchtune --no-deps)")
    path = os.path.join(list(spec.submodule_search_locations)[0], relative_path)
    if not os.path.exists(path):
        pytest.skip(f"this torchtune has no {relative_path}")
    name = "_posenc_tests_torchtune_" + relative_path.replace("/", "_").removesuffix(".py")
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except ImportError as err:
        del sys.modules[name]
        pytest.skip(f"torchtune's {relative_path} cannot be loaded on its own: {err}")
    _LOADED[relative_path] = module
    return module
