"""Keras SinusoidalEncodingND on the backend named by KERAS_BACKEND (torch in the main run, jax again)."""

import inspect
import json
import math

import numpy as np
import pytest

keras = pytest.importorskip("keras")
ml_dtypes = pytest.importorskip("ml_dtypes")
from keras import ops  # noqa: E402

from posenc.keras.sincos_nd import SinusoidalEncodingND  # noqa: E402
from tests.reference.grid_oracle import sincos_nd as oracle  # noqa: E402

BACKEND = keras.backend.backend()


def np_(t):
    return np.asarray(ops.convert_to_numpy(t))




def f32_ulp(v):
    v = np.asarray(v, dtype=np.float32)
    return np.abs(np.nextafter(v, np.float32(np.inf)) - v).astype(np.float64)


@pytest.mark.parametrize(
    "grid, dim, kw",
    [
        ((3, 5), 8, {}),
        ((4, 4), 16, dict(prefix=1, base_size=8)),
        ((2, 7), 12, dict(order="timm", base=100.0)),
        ((2, 3, 4), 32, dict(interp=(2.0, 1.5, 1.5))),
    ],
)
def test_layer_adds_the_oracle_table(grid, dim, kw):
    layer = SinusoidalEncodingND(grid, dim, order=kw.get("order", "mae"), base=kw.get("base", 10000.0),
                                 prefix_tokens=kw.get("prefix", 0), base_size=kw.get("base_size"),
                                 interpolation_scale=kw.get("interp", 1.0))
    truth = oracle(grid, dim, **kw)
    table = layer.table()
    assert table.dtype == np.float32 and table.shape == (kw.get("prefix", 0) + math.prod(grid), dim)
    assert np.all(np.abs(table - truth) <= f32_ulp(truth) + 1e-30)
    x = np.random.default_rng(0).standard_normal((2, *table.shape)).astype("float32")
    out = np_(layer(x))
    assert np.array_equal(out, x + table)


def test_unbatched_input_scale_and_other_grid():
    layer = SinusoidalEncodingND((4, 4), 16, prefix_tokens=1, base_size=4, scale=2.0)
    x = np.ones((17, 16), dtype="float32")
    assert np.array_equal(np_(layer(x)), 2.0 * x + layer.table())
    other = np_(layer(np.zeros((1, 1 + 6 * 10, 16), dtype="float32"), grid_shape=(6, 10)))[0]
    truth = oracle((6, 10), 16, prefix=1, base_size=4)
    assert np.all(np.abs(other - truth) <= f32_ulp(truth) + 1e-30)
    assert layer.table().shape == (17, 16)                         # the layer's own table is unchanged


def test_tables_equal_the_torch_side_bit_for_bit():
    pytest.importorskip("torch")
    from posenc.functional.sincos_nd import sincos_table_nd

    for grid, dim, kw in (((3, 5), 16, dict(base_size=16)), ((2, 6), 8, dict(order="timm")),
                          ((2, 3, 4), 32, dict(prefix_tokens=2, interpolation_scale=(1.0, 2.0, 2.0)))):
        layer = SinusoidalEncodingND(grid, dim, **kw)
        assert np.array_equal(layer.table(), sincos_table_nd(grid, dim, **kw).numpy())


@pytest.mark.parametrize("policy, np_dtype", [("mixed_bfloat16", ml_dtypes.bfloat16), ("mixed_float16", np.float16)])
def test_mixed_precision_outputs_are_the_exact_values_rounded(policy, np_dtype):
    layer = SinusoidalEncodingND((5, 7), 16, base_size=16, dtype=policy)
    out = np_(layer(ops.zeros((1, 35, 16)))).astype(np.float64)[0]
    assert str(layer.compute_dtype) in ("bfloat16", "float16")
    truth = oracle((5, 7), 16, base_size=16)
    info = ml_dtypes.finfo(np_dtype)
    mag = np.maximum(np.abs(truth), float(info.smallest_normal))
    ulp = np.exp2(np.floor(np.log2(mag)) - info.nmant)               # the dtype's spacing at each value
    assert np.all(np.abs(out - truth) <= ulp)


def test_symbolic_model_and_jit():
    inp = keras.Input(shape=(13, 8))
    model = keras.Model(inp, SinusoidalEncodingND((3, 4), 8, prefix_tokens=1)(inp))
    x = np.zeros((2, 13, 8), dtype="float32")
    out = model.predict(x, verbose=0)                                # compiled (jit on JAX)
    assert out.shape == (2, 13, 8)
    assert np.array_equal(out[1], SinusoidalEncodingND((3, 4), 8, prefix_tokens=1).table())


def test_get_config_round_trips_and_lists_every_argument():
    layer = SinusoidalEncodingND((2, 3), 16, base=500.0, prefix_tokens=2, order="timm", base_size=(4, 6),
                                 interpolation_scale=0.5, scale=3.0)
    config = layer.get_config()
    json.dumps(config)
    clone = SinusoidalEncodingND.from_config(config)
    assert clone.get_config() == config and np.array_equal(clone.table(), layer.table())
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is SinusoidalEncodingND and restored.get_config() == config
    params = [p for p in inspect.signature(SinusoidalEncodingND.__init__).parameters if p not in ("self", "kwargs")]
    assert set(params) <= set(config)


@pytest.mark.parametrize(
    "make, err, match",
    [
        (lambda: SinusoidalEncodingND((2, 2), 6), ValueError, r"dim must be divisible by 4 for a 2-D grid"),
        (lambda: SinusoidalEncodingND((2, 2, 2), 24), ValueError, r"dim must be divisible by 16 for a 3-D grid"),
        (lambda: SinusoidalEncodingND(4, 8), TypeError, r"grid_shape must be a tuple .* pass \(4, 4\)"),
        (lambda: SinusoidalEncodingND((2, 0), 8), ValueError, r"grid_shape\[1\] must be an int in \[1, 2\*\*31\]"),
        (lambda: SinusoidalEncodingND((2, 2), 8, order="vit"), ValueError, r"order must be one of 'mae', 'timm'"),
        (lambda: SinusoidalEncodingND((2, 2, 2), 16, order="timm"), ValueError, r'order="timm" is defined for 2-D'),
        (lambda: SinusoidalEncodingND((2, 2), 8, base_size=(1, 2, 3)), ValueError, r"one entry per grid axis \(2\)"),
        (lambda: SinusoidalEncodingND((2, 3), 8, prefix_tokens=1)(np.zeros((1, 6, 8), "float32")), ValueError,
         r"x has 6 tokens but the grid_shape=\(2, 3\) with prefix_tokens=1 has 7"),
        (lambda: SinusoidalEncodingND((2, 3), 8)(np.zeros((1, 6, 8), "float32"), grid_shape=(2, 2, 2)), ValueError,
         r"grid_shape must have 2 entries like the layer's"),
        (lambda: SinusoidalEncodingND((2, 3), 8)(np.zeros((1, 6, 4), "float32")), ValueError, r"last dimension dim=8"),
        (lambda: SinusoidalEncodingND((2, 3), 8)(np.zeros((1, 6, 8), "int32")), TypeError, r"x must be a floating tensor"),
    ],
)
def test_bad_input(make, err, match):
    with pytest.raises(err, match=match):
        make()
