"""docs/migrating/keras-hub.md: keras-hub's RotaryEmbedding and SinePositionEncoding against posenc.keras.

Runs on the backend named by KERAS_BACKEND (torch in the main run, jax again), skipped when keras-hub
is not installed.  keras-hub computes positions and angles in float32 (in the compute dtype for
SinePositionEncoding), so it differs from posenc's exact tables by its float32 rounding, bounded by
``peer_atol`` (tests/reference/migration.py); a wrong layout or base differs by order 1.
"""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")
keras_hub = pytest.importorskip("keras_hub", reason="keras-hub is not installed (pip install keras-hub --no-deps)")
from keras import ops  # noqa: E402

import posenc.keras as pk  # noqa: E402
from tests.reference.migration import UBF16, peer_atol  # noqa: E402


def np_(t) -> np.ndarray:
    return np.asarray(ops.convert_to_numpy(ops.cast(t, "float32")), dtype=np.float64)


def _x(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _close(actual, expected, atol: float) -> None:
    err = float(np.max(np.abs(np_(actual) - np_(expected))))
    assert err <= atol, f"max abs difference {err:.3g} exceeds {atol:.3g}"


def _differs(actual, expected, by: float = 0.1) -> None:
    err = float(np.max(np.abs(np_(actual) - np_(expected))))
    assert err > by, f"the unmapped default differs by only {err:.3g}; the test would not catch a wrong mapping"


ROPE_CASES = [
    # (shape, keras-hub sequence_axis, posenc seq_dim, max_wavelength, rope_type, scaling_factor, start_index)
    ((2, 24, 3, 64), 1, 1, 10000, "linear", 1.0, 0),          # keras-hub's default (B, S, H, D)
    ((2, 3, 24, 32), 2, -2, 10000, "linear", 1.0, 0),         # (B, H, S, D)
    ((2, 24, 32), 1, -2, 500000, "linear", 1.0, 1000),        # (B, S, D), another base, decoding offset
    ((1, 24, 2, 64), 1, 1, 10000, "linear", 4.0, 300),        # position interpolation
]


def _posenc_scaling(rope_type, factor, dim):
    if rope_type == "linear":
        return None if factor == 1.0 else pk.LinearScaling(factor)
    if rope_type == "dynamic":                                # keras-hub's "dynamic" is a static linear rule
        return pk.LinearScaling(factor ** (dim / (dim - 2)))
    raise AssertionError(rope_type)


@pytest.mark.parametrize("shape, axis, seq_dim, base, rope_type, factor, start", ROPE_CASES)
def test_rotary_embedding(shape, axis, seq_dim, base, rope_type, factor, start):
    x = _x(shape)
    dim = shape[-1]
    peer = keras_hub.layers.RotaryEmbedding(max_wavelength=base, scaling_factor=factor, rope_type=rope_type,
                                            sequence_axis=axis)
    expected = peer(x, start_index=start)
    layer = pk.RotaryEmbedding(dim, max_seq_len=64, base=float(base), scaling=_posenc_scaling(rope_type, factor, dim))
    out = layer(x, offset=start, seq_dim=seq_dim)
    _close(out, expected, peer_atol(start + shape[axis], float(np.abs(x).max())))
    wrong = pk.RotaryEmbedding(dim, max_seq_len=64, base=float(base), layout="interleaved",
                               scaling=_posenc_scaling(rope_type, factor, dim))
    _differs(wrong(x, offset=start, seq_dim=seq_dim), expected)


@pytest.mark.parametrize("dim, factor", [(64, 2.0), (32, 8.0)])
def test_rotary_embedding_dynamic_type_is_a_linear_factor(dim, factor):
    """keras-hub's ``rope_type="dynamic"`` divides every frequency by ``factor^(d/(d-2))`` at every
    length: position interpolation by that factor, not transformers' dynamic NTK."""
    x = _x((1, 40, 2, dim), seed=1)
    peer = keras_hub.layers.RotaryEmbedding(scaling_factor=factor, rope_type="dynamic")
    expected = peer(x, start_index=500)
    layer = pk.RotaryEmbedding(dim, max_seq_len=64, scaling=_posenc_scaling("dynamic", factor, dim))
    _close(layer(x, offset=500, seq_dim=1), expected, peer_atol(540, float(np.abs(x).max())))
    ntk = pk.RotaryEmbedding(dim, max_seq_len=64, scaling=pk.NTKScaling(factor))
    _differs(ntk(x, offset=500, seq_dim=1), expected)


@pytest.mark.parametrize("factor, original, start", [(4.0, 256, 0), (8.0, 512, 2000)])
def test_rotary_embedding_yarn(factor, original, start):
    x = _x((1, 24, 2, 64), seed=2)
    peer = keras_hub.layers.RotaryEmbedding(scaling_factor=factor, rope_type="yarn", beta_fast=32.0, beta_slow=1.0,
                                            original_max_position_embeddings=original)
    expected = peer(x, start_index=start)
    rule = pk.YarnScaling(factor, original_max_seq_len=original, beta_fast=32.0, beta_slow=1.0)
    layer = pk.RotaryEmbedding(64, max_seq_len=64, scaling=rule)
    atol = peer_atol(start + 24, float(np.abs(x).max())) * layer.attention_factor
    _close(layer(x, offset=start, seq_dim=1), expected, atol)
    _differs(pk.RotaryEmbedding(64, max_seq_len=64)(x, offset=start, seq_dim=1), expected, by=0.05)


def test_rotary_embedding_positions():
    x = _x((2, 6, 2, 32), seed=3)
    positions = np.array([[0, 1, 2, 0, 1, 2], [5, 6, 7, 8, 9, 10]], dtype="int32")      # packed and shifted rows
    expected = keras_hub.layers.RotaryEmbedding()(x, positions=positions)
    out = pk.RotaryEmbedding(32, max_seq_len=64)(x, positions=positions, seq_dim=1)
    _close(out, expected, peer_atol(11, float(np.abs(x).max())))


@pytest.mark.parametrize("dim, base, start", [(64, 10000, 0), (33, 10000, 0), (32, 500, 900)])
def test_sine_position_encoding(dim, base, start):
    x = _x((2, 40, dim), seed=4)
    expected = x + np_(keras_hub.layers.SinePositionEncoding(max_wavelength=base)(x, start_index=start))
    out = pk.SinusoidalEncoding(dim, max_seq_len=64, base=float(base))(x, offset=start)
    _close(out, expected, peer_atol(start + 40, 1.0) + 4 * 2.0**-24 * float(np.abs(expected).max()))
    concat = pk.SinusoidalEncoding(dim, max_seq_len=64, base=float(base), layout="concat")(x, offset=start)
    _differs(concat, expected)


def test_sine_position_encoding_positions():
    x = np.zeros((2, 4, 16), dtype="float32")
    positions = np.array([[0, 1, 0, 1], [3, 4, 5, 6]], dtype="int32")
    expected = keras_hub.layers.SinePositionEncoding()(x, positions=positions)
    _close(pk.SinusoidalEncoding(16, max_seq_len=64)(x, positions=positions), expected, peer_atol(7, 1.0))


def test_rotary_embedding_mixed_bfloat16():
    """Under ``mixed_bfloat16`` keras-hub rounds cos and sin to bfloat16 before multiplying; posenc
    rotates in float32 and rounds once, so both land within a few bfloat16 ulps of each other."""
    x = _x((1, 16, 2, 64), seed=5)
    expected = keras_hub.layers.RotaryEmbedding(dtype="mixed_bfloat16")(x, start_index=100)
    out = pk.RotaryEmbedding(64, max_seq_len=256, dtype="mixed_bfloat16")(x, offset=100, seq_dim=1)
    assert ops.dtype(out) == "bfloat16"
    xmax = float(np.abs(x).max())
    _close(out, expected, 2 * xmax * 4 * UBF16 + peer_atol(116, xmax, output_u=UBF16))
    exact = pk.RotaryEmbedding(64, max_seq_len=256)(x, offset=100, seq_dim=1)
    assert np.abs(np_(out) - np_(exact)).max() <= np.abs(np_(expected) - np_(exact)).max()


def test_rotary_embedding_denominator_dim_through_the_torch_functions():
    """keras-hub's ``denominator_dim``: the torch functional layer with the frequencies of the wider head."""
    torch = pytest.importorskip("torch")
    import posenc

    x = _x((1, 20, 2, 16), seed=6)                               # the rotated slice, 16 features of a 64-wide head
    expected = keras_hub.layers.RotaryEmbedding(denominator_dim=64)(x, start_index=50)
    inv_freq = posenc.rope_inv_freq(64)[0][: 16 // 2]
    cos, sin = posenc.rope_cos_sin(torch.arange(50, 70), inv_freq)          # (S, 8)
    out = posenc.apply_rope(torch.from_numpy(x), cos[:, None], sin[:, None])  # (B, S, H, D): cos (S, 1, 8)
    _close(out.numpy(), expected, peer_atol(70, float(np.abs(x).max())))
    wrong = pk.RotaryEmbedding(16, max_seq_len=64)(x, offset=50, seq_dim=1)   # frequencies over 16, not 64
    _differs(wrong, expected)
