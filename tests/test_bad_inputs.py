"""The walk over every public callable of ``posenc``, ``posenc.functional`` and ``posenc.nn``.

The bad-input cases live next to each family's tests, one ``tests/test_<family>_bad_inputs.py`` per
family (positions, sinusoidal, rope, bias, attention, hf_config, sincos_nd, axial_rope, mrope, resize,
rope_cache, norm_rope), on the shared machinery of ``tests/bad_inputs.py``: every case either matches an
independent float64 reference from ``tests/reference/`` or raises ``ValueError``/``TypeError`` whose
message names the offending argument; any other exception and any warning fail it (:func:`guarded`).

:func:`test_every_public_callable_is_walked` enumerates the modules' ``__all__`` against the union of
the family tables (every ``tests/test_*_bad_inputs.py``), so a new public function without cases fails.
The Keras layers and the CLI have hardening tests of their own (tests/keras/test_keras_hardening.py,
tests/test_cli_errors.py); they get a light smoke walk here.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import warnings

import numpy as np
import pytest

import posenc
import posenc.functional as F
import posenc.nn
import posenc.testing
from posenc import RopeScaling
from tests.bad_inputs import NAN, guarded

FAMILIES = {
    path.stem: importlib.import_module(f"tests.{path.stem}")
    for path in sorted(pathlib.Path(__file__).parent.glob("test_*_bad_inputs.py"))
}
CASES = [case for module in FAMILIES.values() for case in module.CASES.params]


# ---- the walk ---------------------------------------------------------------------------------------

MODULES = (posenc, F, posenc.nn, posenc.testing)


def _public_callables() -> set[str]:
    """Every public function and class, less the warning categories (nothing to call them with) and the
    report records of posenc.testing (what its functions return; users read them, never build them)."""
    objs = {name: getattr(mod, name) for mod in MODULES for name in mod.__all__}
    return {n for n, o in objs.items() if callable(o) and not (isinstance(o, type) and issubclass(o, Warning))
            and not (dataclasses.is_dataclass(o) and o.__module__.startswith("posenc.testing"))}


def test_every_public_callable_is_walked():
    """A public callable without cases fails here: add good and bad cases for it to its family's file."""
    assert len(FAMILIES) >= 12, sorted(FAMILIES)
    counts: dict[str, list[int]] = {}
    for case in CASES:
        name, _, error, _ = case.values
        counts.setdefault(name, [0, 0])[error is None] += 1
    public = _public_callables()
    assert not public - set(counts), f"public callables without bad-input cases: {sorted(public - set(counts))}"
    assert not set(counts) - public, f"cases for names that are not public: {sorted(set(counts) - public)}"
    no_rejection = sorted(n for n in public if not counts[n][0])
    assert not no_rejection, f"callables never shown a bad input: {no_rejection}"
    no_valid = sorted(n for n in public - {"RopeScaling"} if not counts[n][1])
    assert not no_valid, f"callables never shown a valid unusual input: {no_valid}"
    assert isinstance(posenc.__version__, str)
    assert set(posenc.__all__) - {"__version__", "LayoutWarning"} <= public  # nothing public is left out of the walk


def test_the_guard_rejects_other_exceptions():
    for err in (IndexError("i"), RuntimeError("r"), ZeroDivisionError("z"), AttributeError("a"), AssertionError("a"),
                NotImplementedError("n"), KeyError("k")):
        def thunk(err=err):
            raise err
        with pytest.raises(pytest.fail.Exception, match=f"{type(err).__name__} escaped"):
            guarded(thunk)
    with pytest.raises(pytest.fail.Exception, match="UserWarning escaped"):
        guarded(lambda: warnings.warn("silently wrong", UserWarning, stacklevel=1))


# ---- light smoke walks: Keras layers, CLI -----------------------------------------------------------


def test_keras_layers_reject_float_positions():
    """posenc.keras: every public name is walked once (float positions / a NaN factor); the full
    hardening lives in tests/keras/test_keras_hardening.py."""
    keras = pytest.importorskip("keras")
    try:
        import posenc.keras as pk
    except ImportError as err:                                           # a backend that is not installed
        pytest.skip(f"posenc.keras does not import here: {err}")
    x, q, p = np.zeros((1, 2, 4), "float32"), np.zeros((1, 1, 2, 4), "float32"), np.array([0.0, 1.0])
    calls = {
        "SinusoidalEncoding": lambda: pk.SinusoidalEncoding(4)(x, positions=p),
        "LearnedPositionalEmbedding": lambda: pk.LearnedPositionalEmbedding(4, 4)(x, positions=p),
        "RotaryEmbedding": lambda: pk.RotaryEmbedding(4)(q, positions=p),
        "AlibiBias": lambda: pk.AlibiBias(2)(p),
        "RelativePositionBias": lambda: pk.RelativePositionBias(2)(p),
        "AxialRotaryEmbedding": lambda: pk.AxialRotaryEmbedding((2, 2))(q, positions=np.stack([p, p], -1)),
        "attention_window_mask": lambda: pk.attention_window_mask(p, window=2),
        "attention_temperature": lambda: pk.attention_temperature(p, pk.LogNTemperature(4)),
    }
    schedule_calls = {                                                   # shared with torch: tests/test_schedule_bad_inputs.py
        "schedule_from_hf": (lambda: pk.schedule_from_hf({"num_hidden_layers": 0}), "num_hidden_layers must be >= 1"),
        "PositionSchedule": (lambda: pk.PositionSchedule([]), "layers must hold at least one"),
        "LayerPositions": (lambda: pk.LayerPositions(None, window=0), "window must be >= 1"),
        "RopeSpec": (lambda: pk.RopeSpec(1), "dim must be >= 2"),
        "Llama4Temperature": (lambda: pk.Llama4Temperature(attn_scale=NAN), "attn_scale must be finite"),
        "LogNTemperature": (lambda: pk.LogNTemperature(1), "original_max_seq_len must be >= 2"),
        "SSMaxTemperature": (lambda: pk.SSMaxTemperature(NAN), "s must be finite"),
    }
    for name in pk.__all__:
        obj = getattr(pk, name)
        if name in calls:
            with pytest.raises(TypeError, match="positions must hold integers"):
                guarded(calls[name])
        elif name in schedule_calls:
            with pytest.raises(ValueError, match=schedule_calls[name][1]):
                guarded(schedule_calls[name][0])
        elif name == "SinusoidalEncodingND":                             # a grid, not positions
            with pytest.raises(TypeError, match=r"grid_shape\[0\] must be an int"):
                guarded(lambda: pk.SinusoidalEncodingND((1, 2), 4)(x, grid_shape=(1.0, 2)))
        else:                                                            # the scaling rules, shared with torch
            assert isinstance(obj, type) and issubclass(obj, RopeScaling), name
            args = {"LongRopeScaling": ([NAN], [1.0], 4), "ProportionalScaling": (NAN,), "LinearScaling": (NAN,),
                    "NTKScaling": (NAN,)}.get(name, (NAN, 4))
            with pytest.raises(ValueError, match="must be finite"):
                guarded(lambda obj=obj, args=args: obj(*args))
    assert keras.backend.backend()


def test_cli_subcommands_answer_help():
    from posenc.cli import build_parser, main

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    assert set(sub.choices) >= {"table", "list", "compare", "plot"}
    for argv in (["--help"], *([name, "--help"] for name in sub.choices)):
        with pytest.raises(SystemExit) as exit_info:
            guarded(lambda argv=argv: main(argv))
        assert exit_info.value.code == 0, argv
