"""posenc.keras on the backend named by KERAS_BACKEND (CI runs torch and jax in separate processes)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

keras = pytest.importorskip("keras")
ml_dtypes = pytest.importorskip("ml_dtypes")
from keras import ops  # noqa: E402

import posenc.keras as pk  # noqa: E402
from tests.conftest import load_golden  # noqa: E402
from tests.reference.oracle import sinusoidal_f64  # noqa: E402

BACKEND = keras.backend.backend()


def np_(t):
    return np.asarray(keras.ops.convert_to_numpy(t))


def exact_table(length, dim, base=10000.0, offset=0):
    """The reference table (tests/reference/oracle.py) of positions ``offset .. offset + length - 1``."""
    return sinusoidal_f64(np.arange(offset, offset + length), dim, base)


def test_backend_is_the_requested_one():
    assert BACKEND == os.environ.get("KERAS_BACKEND", "torch")


def test_import_does_not_import_torch():
    code = "import sys, posenc.keras; print('torch' in sys.modules)"
    env = dict(os.environ, KERAS_BACKEND="jax" if BACKEND == "jax" else BACKEND)
    if BACKEND == "torch":
        pytest.skip("the torch backend imports torch itself")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("row", load_golden("sinusoidal.json")["rows"], ids=lambda r: f"{r['layout']}-{r['dim']}-{r['position']}")
def test_sinusoidal_goldens(row):
    layer = pk.SinusoidalEncoding(row["dim"], max_seq_len=8, base=row["base"], layout=row["layout"])
    out = layer(ops.zeros((1, row["position"] + 1, row["dim"])))
    assert np_(out)[0, -1].tolist() == pytest.approx(row["values"], abs=1e-6)


def test_sinusoidal_tables_equal_the_torch_side_bit_for_bit():
    torch = pytest.importorskip("torch")
    import posenc

    for dim, layout in ((6, "interleaved"), (7, "concat"), (9, "tensor2tensor")):
        keras_table = pk.SinusoidalEncoding(dim, max_seq_len=300, layout=layout).table()
        torch_table = posenc.sinusoidal_table(300, dim, layout=layout).numpy()
        assert np.array_equal(keras_table, torch_table)
    assert torch.get_num_threads() >= 1


@pytest.mark.parametrize("policy, np_dtype", [("mixed_bfloat16", ml_dtypes.bfloat16), ("mixed_float16", np.float16)])
def test_mixed_precision_outputs_are_the_exact_values_rounded(policy, np_dtype):
    layer = pk.SinusoidalEncoding(16, max_seq_len=70000, dtype=policy)
    pos = np.array([255, 256, 257, 4095, 65537])
    out = np_(layer(ops.zeros((1, 5, 16)), positions=ops.convert_to_tensor(pos)))
    assert str(layer.compute_dtype) in ("bfloat16", "float16")
    exact = np.stack([exact_table(1, 16, offset=int(p))[0] for p in pos])
    want = exact.astype(np_dtype).astype(np.float64)
    got = out.astype(np.float64)[0]
    ulp = np.abs(np.nextafter(want.astype(np_dtype), np.inf).astype(np.float64) - want) if np_dtype is np.float16 else \
        np.abs((want.astype(np.float32).view(np.int32) + 0x10000).view(np.float32) - want)
    assert np.all(np.abs(got - exact) <= ulp + 1e-12)
    assert not np.array_equal(got[1], got[2])                       # 256 and 257 stay distinct


def test_seed_002_model():
    """Seed 002's TransformerWithPositionalEncoding: vocab 50, length 10, d_model 16."""
    tokens = keras.Input(shape=(None,), dtype="int32")
    embedding = keras.layers.Embedding(50, 16)
    x = pk.SinusoidalEncoding(16, max_seq_len=10)(embedding(tokens))
    model = keras.Model(tokens, x)
    batch = np.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]], dtype="int32")
    out = np_(model(batch))
    emb = np_(embedding(batch))
    np.testing.assert_allclose(out, emb + exact_table(5, 16)[None].astype(np.float32), rtol=0, atol=1e-6)


def test_symbolic_inputs_with_unknown_batch_and_length():
    inp = keras.Input(shape=(None, 8))
    q = keras.layers.Reshape((-1, 2, 4))(inp)
    q = keras.layers.Permute((2, 1, 3))(q)                          # (B, H, S, D)
    rot = pk.RotaryEmbedding(4)(q)
    out = pk.SinusoidalEncoding(8)(inp)
    model = keras.Model(inp, [out, rot])
    a, b = model(np.zeros((3, 11, 8), dtype="float32"))
    assert tuple(a.shape) == (3, 11, 8) and tuple(b.shape) == (3, 2, 11, 4)


LAYERS = [
    lambda: pk.SinusoidalEncoding(8, max_seq_len=32, base=500.0, layout="concat", scale=2.0, dropout=0.1),
    lambda: pk.LearnedPositionalEmbedding(16, 8, init="sinusoidal", padding_idx=0),
    lambda: pk.RotaryEmbedding(8, max_seq_len=64, layout="interleaved", scaling=pk.YarnScaling(4.0, 16), xpos_scale_base=256.0),
    lambda: pk.RotaryEmbedding(8, scaling=pk.LongRopeScaling([1.0] * 4, [2.0] * 4, 16, factor=4.0)),
    lambda: pk.AlibiBias(6, symmetric=True),
    lambda: pk.RelativePositionBias(4, num_buckets=16, max_distance=40, bidirectional=False),
]


@pytest.mark.parametrize("make", LAYERS)
def test_get_config_round_trips_and_lists_every_argument(make):
    layer = make()
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    json.dumps(config)                                                 # plain JSON
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer) and restored.get_config() == config
    import inspect
    params = [p for p in inspect.signature(type(layer).__init__).parameters if p not in ("self", "kwargs")]
    assert set(params) <= set(config)


def test_rotary_matches_the_torch_module():
    torch = pytest.importorskip("torch")
    import posenc

    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 9, 12)).astype(np.float32)
    k = rng.standard_normal((2, 1, 9, 12)).astype(np.float32)
    for kwargs in (dict(), dict(layout="interleaved"), dict(scaling=posenc.Llama3Scaling(4.0, 8)),
                   dict(scaling=posenc.YarnScaling(4.0, 8)), dict(xpos_scale_base=64.0)):
        ref = posenc.RotaryEmbedding(8, max_seq_len=32, **kwargs)
        ours = pk.RotaryEmbedding(8, max_seq_len=32, **kwargs)
        rq, rk = ref(torch.from_numpy(q), torch.from_numpy(k), offset=5)
        oq, ok = ours(ops.convert_to_tensor(q), ops.convert_to_tensor(k), offset=5)
        np.testing.assert_allclose(np_(oq), rq.numpy(), rtol=0, atol=2e-6)
        np.testing.assert_allclose(np_(ok), rk.numpy(), rtol=0, atol=2e-6)
        cos_k, _ = ours.cos_sin(ops.arange(32))
        assert np.array_equal(np_(cos_k), ref.cos_table.numpy())       # identical tables


def test_rotary_seq_dim_one_and_per_row_positions():
    rope = pk.RotaryEmbedding(8)
    x = np.random.default_rng(1).standard_normal((2, 4, 6, 8)).astype(np.float32)    # (B, H, S, D)
    a = rope(ops.convert_to_tensor(x))
    b = rope(ops.convert_to_tensor(x.transpose(0, 2, 1, 3)), seq_dim=1)
    np.testing.assert_allclose(np_(b).transpose(0, 2, 1, 3), np_(a), rtol=0, atol=1e-6)
    pos = np.tile(np.arange(6), (2, 1)).astype("int32")
    c = rope(ops.convert_to_tensor(x), positions=ops.convert_to_tensor(pos))
    np.testing.assert_allclose(np_(c), np_(a), rtol=0, atol=1e-6)


def test_longrope_switches_after_the_original_length():
    rule = pk.LongRopeScaling([1.0] * 4, [4.0] * 4, 16, factor=4.0)
    rope = pk.RotaryEmbedding(8, max_seq_len=64, scaling=rule)
    short, _ = rope.cos_sin(ops.arange(3), seq_len=16)
    long, _ = rope.cos_sin(ops.arange(3), seq_len=17)
    assert not np.allclose(np_(short), np_(long))


def test_bias_goldens_and_parity():
    gold = load_golden("bias.json")
    for n, slopes in gold["alibi_slopes"].items():
        np.testing.assert_allclose(pk.AlibiBias(int(n)).slopes, slopes, rtol=0, atol=5e-7)
    t5 = pk.RelativePositionBias(1)
    for rp, bucket in gold["t5_bidirectional"]:
        assert int(np_(t5.buckets(ops.convert_to_tensor([0]), ops.convert_to_tensor([rp])))[0, 0]) == bucket
    t5c = pk.RelativePositionBias(1, bidirectional=False)
    for rp, bucket in gold["t5_causal"]:
        assert int(np_(t5c.buckets(ops.convert_to_tensor([0]), ops.convert_to_tensor([rp])))[0, 0]) == bucket
    bias = np_(pk.AlibiBias(2)(ops.arange(4)))
    assert bias.shape == (2, 4, 4) and bias[0, 3, 0] == pytest.approx(-3 * 0.0625)


def test_learned_embedding_padding_row_and_range_check():
    layer = pk.LearnedPositionalEmbedding(8, 4, init="normal", padding_idx=2)
    out = np_(layer(ops.zeros((1, 4, 4))))
    assert np.all(out[0, 2] == 0) and np.any(out[0, 1] != 0)
    with pytest.raises(ValueError, match=r"max_seq_len=8\), got values in \[0, 8\]; build the layer with max_seq_len >= 9"):
        layer(ops.zeros((1, 9, 4)))


@pytest.mark.parametrize(
    "make, err, match",
    [
        (lambda: pk.RotaryEmbedding(7), ValueError, "must be even"),
        (lambda: pk.RotaryEmbedding(8, scaling={"rule": "mrope", "factor": 2}), ValueError, "unknown scaling rule 'mrope'"),
        (lambda: pk.SinusoidalEncoding(0), ValueError, "dim must be >= 1"),
        (lambda: pk.SinusoidalEncoding(4, layout="sincos"), ValueError, "layout must be one of"),
        (lambda: pk.AlibiBias(0), ValueError, "num_heads must be >= 1"),
        (lambda: pk.SinusoidalEncoding(4)(ops.zeros((1, 3, 5))), ValueError, "last dimension dim=4"),
    ],
)
def test_bad_input(make, err, match):
    with pytest.raises(err, match=match):
        make()


def test_bias_layers_hold_a_tensor_parallel_slice_of_the_heads():
    from posenc.keras import AlibiBias, RelativePositionBias

    pos = np.arange(5)
    full, part = AlibiBias(8), AlibiBias(8, head_range=(2, 6))
    np.testing.assert_allclose(ops.convert_to_numpy(part(pos)), ops.convert_to_numpy(full(pos))[2:6], rtol=0, atol=0)
    again = AlibiBias.from_config(part.get_config())
    assert again.head_range == (2, 6) and ops.convert_to_numpy(again(pos)).shape == (4, 5, 5)
    t5 = RelativePositionBias(8, head_range=(4, 8))
    assert tuple(t5.weight.shape) == (32, 4) and ops.convert_to_numpy(t5(pos)).shape == (4, 5, 5)
    with pytest.raises(ValueError, match=r"0 <= start < stop <= num_heads=8"):
        AlibiBias(8, head_range=(6, 9))


def test_longrope_attention_factor_switches_with_the_factors():
    """Phi-3.5-MoE's short_mscale/long_mscale: |(cos, sin)| is the short factor up to the original
    length and the long one past it, with the short and long frequencies (float64 oracle)."""
    rule = pk.LongRopeScaling([1.0] * 4, [4.0] * 4, 16, factor=4.0, attention_factor_override=1.05,
                              long_attention_factor=1.25)
    rope = pk.RotaryEmbedding(8, max_seq_len=64, scaling=rule)
    theta = np.array([10000.0 ** (-2 * i / 8) for i in range(4)])
    pos = np.arange(5)
    for seq_len, m, ext in ((16, 1.05, 1.0), (17, 1.25, 4.0)):
        c, s = (np_(t) for t in rope.cos_sin(ops.arange(5), seq_len=seq_len))
        angle = pos[:, None] * theta / ext
        np.testing.assert_allclose(c, m * np.cos(angle), rtol=0, atol=1e-6)
        np.testing.assert_allclose(s, m * np.sin(angle), rtol=0, atol=1e-6)


def test_trailing_slice_and_inverse_match_torch():
    """rotary_slice="last" and inverse=True as in the torch module (DeepSeek-V4's two operations), and a
    round trip through the config."""
    torch = pytest.importorskip("torch")
    import posenc

    x = np.random.default_rng(0).standard_normal((1, 2, 5, 12)).astype(np.float32)
    for layout in ("half", "interleaved"):
        ours = pk.RotaryEmbedding(8, max_seq_len=32, layout=layout, rotary_slice="last")
        ours = pk.RotaryEmbedding.from_config(ours.get_config())
        ref = posenc.RotaryEmbedding(8, max_seq_len=32, layout=layout, rotary_slice="last")
        for inverse in (False, True):
            got = np_(ours(ops.convert_to_tensor(x), offset=3, inverse=inverse))
            want = ref(torch.from_numpy(x), offset=3, inverse=inverse)[0].numpy()
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
            np.testing.assert_array_equal(got[..., :4], x[..., :4])
    with pytest.raises(ValueError, match="rotary_slice"):
        pk.RotaryEmbedding(8, rotary_slice="middle")
