"""Keras AxialRotaryEmbedding against a float64 oracle from the formula (backend from KERAS_BACKEND)."""

import numpy as np
import pytest

keras = pytest.importorskip("keras")
from keras import ops  # noqa: E402

from posenc.keras.axial_rotary import AxialRotaryEmbedding  # noqa: E402
from tests.reference.grid_oracle import axial_rotate  # noqa: E402


def np_(t):
    return np.asarray(ops.convert_to_numpy(t))




@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("batched", [False, True])
def test_matches_oracle_inside_and_outside_table(layout, batched):
    rng = np.random.default_rng(0)
    axes_dims, base = (4, 6), 100.0
    pos = rng.integers(-3, 20, size=(2, 5, 2) if batched else (5, 2)).astype("int32")   # table: 0..15
    q = rng.standard_normal((2, 3, 5, 12)).astype("float32")                             # partial rotary
    k = rng.standard_normal((2, 1, 5, 12)).astype("float32")
    layer = AxialRotaryEmbedding(axes_dims, base=base, layout=layout, max_seq_len=16)
    qo, ko = layer(q, k, positions=pos)
    np.testing.assert_allclose(np_(qo), axial_rotate(q, pos, axes_dims, layout, base), rtol=0, atol=3e-6)
    np.testing.assert_allclose(np_(ko), axial_rotate(k, pos, axes_dims, layout, base), rtol=0, atol=3e-6)
    np.testing.assert_array_equal(np_(qo)[..., 10:], q[..., 10:])


def test_seq_dim_1_and_cos_sin_rows():
    rng = np.random.default_rng(1)
    pos = np.array([[0, 0], [1, 2], [3, 1]], dtype="int32")
    q = rng.standard_normal((1, 3, 2, 8)).astype("float32")                              # (B, S, H, D)
    layer = AxialRotaryEmbedding((4, 4))
    got = np_(layer(q, positions=pos, seq_dim=1))
    ref = axial_rotate(q.transpose(0, 2, 1, 3), pos, (4, 4), "interleaved", 10000.0).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, ref, rtol=0, atol=3e-6)
    cos, sin = layer.cos_sin(pos)
    np.testing.assert_allclose(np_(cos)[1], np.cos([1, 0.01, 2, 0.02]), rtol=0, atol=1e-7)
    np.testing.assert_allclose(np_(sin)[2], np.sin([3, 0.03, 1, 0.01]), rtol=0, atol=1e-7)


def test_config_round_trip():
    layer = AxialRotaryEmbedding((16, 56, 56), layout="half", max_seq_len=64)
    again = AxialRotaryEmbedding.from_config(layer.get_config())
    assert again.axes_dims == (16, 56, 56) and again.layout == "half" and again.max_seq_len == 64


def test_bad_input():
    with pytest.raises(ValueError, match="even"):
        AxialRotaryEmbedding((4, 3))
    layer = AxialRotaryEmbedding((4, 4))
    q = np.zeros((1, 1, 3, 8), "float32")
    with pytest.raises(ValueError, match=r"\(S, 2\)"):
        layer(q, positions=np.zeros((3, 3), "int32"))
    with pytest.raises(TypeError, match="integers"):
        layer(q, positions=np.zeros((3, 2), "float32"))
    with pytest.raises(ValueError, match="required"):
        layer(q)
    with pytest.raises(ValueError, match="head dim 6"):
        layer(np.zeros((1, 1, 3, 6), "float32"), positions=np.zeros((3, 2), "int32"))
