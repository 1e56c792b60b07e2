"""posenc.keras rejects what posenc.nn rejects, with errors that name the argument and the fix.

Value checks run where values exist (NumPy, eager tensors); symbolic building and jit keep working.
Runs on the backend named by KERAS_BACKEND, like test_keras_layers.py.
"""

import numpy as np
import pytest

from tests.reference.oracle import sinusoidal_f64  # noqa: E402
from tests.reference.rope_oracle import default, rotate_np  # noqa: E402

keras = pytest.importorskip("keras")
from keras import ops  # noqa: E402

import posenc.keras as pk  # noqa: E402

BACKEND = keras.backend.backend()
X = np.zeros((1, 2, 4), dtype="float32")           # (B, S, D)
Q = np.zeros((1, 2, 3, 4), dtype="float32")        # (B, H, S, D)
INT32_RANGE = r"must lie within \[-2\*\*31, 2\*\*31 - 1\]"


def np_(t):
    return np.asarray(ops.convert_to_numpy(t))


def sinusoidal_ref(positions, dim, base=10000.0):
    """The reference table rows (tests/reference/oracle.py) for integer ``positions (...)`` -> ``(..., dim)``."""
    return sinusoidal_f64(positions, dim, base)


def rope_ref(x, positions, dim, base=10000.0):
    """The reference "half"-layout rotation (tests/reference/rope_oracle.py) of the first ``dim`` features."""
    return rotate_np(x, positions, default(dim, base), "half")


def backend_holds_int64():
    return keras.backend.standardize_dtype(ops.convert_to_tensor(np.array([1], dtype=np.int64)).dtype) == "int64"


# Each maker calls one layer with the given positions; S = 2 everywhere.
CALLS = {
    "sinusoidal": lambda p: pk.SinusoidalEncoding(4)(X, positions=p),
    "learned": lambda p: pk.LearnedPositionalEmbedding(8, 4)(X, positions=p),
    "rotary": lambda p: pk.RotaryEmbedding(4)(Q[:, :, :2], positions=p),
    "rotary.cos_sin": lambda p: pk.RotaryEmbedding(4).cos_sin(p),
    "alibi": lambda p: pk.AlibiBias(2)(p),
    "alibi.key_positions": lambda p: pk.AlibiBias(2)(np.arange(2), key_positions=p),
    "relative": lambda p: pk.RelativePositionBias(2)(p),
}


# ---- positions: dtype, rank, int32 range ---------------------------------------------------------


@pytest.mark.parametrize("name", CALLS)
@pytest.mark.parametrize("bad", [np.array([0.0, 1.0]), np.array([True, False]), np.array([0j, 1j]), [2**70, 0]],
                         ids=["float", "bool", "complex", "object"])
def test_non_integer_positions_raise_type_error(name, bad):
    with pytest.raises(TypeError, match=r"positions must hold integers .*keras\.ops\.cast"):
        CALLS[name](bad)


@pytest.mark.parametrize("name", CALLS)
def test_float_backend_tensor_positions_raise_type_error(name):
    with pytest.raises(TypeError, match="positions must hold integers"):
        CALLS[name](ops.convert_to_tensor(np.array([0.0, 1.0], dtype="float32")))


@pytest.mark.parametrize("name", CALLS)
@pytest.mark.parametrize("bad", [np.array([0, 2**31]), np.array([-(2**31) - 1, 0]), [2**40, 0]],
                         ids=["2**31", "-2**31-1", "list-2**40"])
def test_positions_past_int32_raise_instead_of_wrapping(name, bad):
    with pytest.raises(ValueError, match="positions.* " + INT32_RANGE):
        CALLS[name](bad)


@pytest.mark.parametrize("name", ["sinusoidal", "rotary", "alibi", "relative"])
def test_int64_backend_tensor_past_int32_raises(name):
    if not backend_holds_int64():
        pytest.skip("this backend stores integers as int32 (JAX without x64): NumPy inputs are checked instead")
    with pytest.raises(ValueError, match=INT32_RANGE):
        CALLS[name](ops.convert_to_tensor(np.array([0, 2**31], dtype=np.int64)))


@pytest.mark.parametrize("name", CALLS)
@pytest.mark.parametrize("bad", [np.array(1), np.zeros((1, 1, 2), dtype="int32")], ids=["0-d", "3-d"])
def test_positions_of_wrong_rank_raise(name, bad):
    with pytest.raises(ValueError, match=r"positions must have shape \(S,\) or \(B, S\)"):
        CALLS[name](bad)


def test_int32_bounds_themselves_are_accepted():
    out = np_(pk.SinusoidalEncoding(4, max_seq_len=4)(X, positions=np.array([-(2**31), 2**31 - 1])))
    assert out.shape == (1, 2, 4) and np.all(np.isfinite(out))
    alibi = pk.AlibiBias(1)
    bias = np_(alibi(np.array([2**31 - 1]), key_positions=np.array([0])))
    np.testing.assert_allclose(bias[0, 0, 0], -float(alibi.slopes[0]) * (2**31 - 1), rtol=1e-6)


@pytest.mark.parametrize("make", [
    lambda: pk.SinusoidalEncoding(4)(X, positions=np.array([0, 1, 2])),                 # S = 3, x has S = 2
    lambda: pk.SinusoidalEncoding(4)(X, positions=np.zeros((3, 2), dtype="int32")),     # B = 3, x has B = 1
    lambda: pk.SinusoidalEncoding(4)(X[0], positions=np.zeros((1, 2), dtype="int32")),  # (S, D) x: (S,) only
    lambda: pk.LearnedPositionalEmbedding(8, 4)(X, positions=np.array([0])),
    lambda: pk.RotaryEmbedding(4)(Q, positions=np.array([0, 1])),
    lambda: pk.RotaryEmbedding(4)(np.zeros((3, 2, 4), "float32"), positions=np.zeros((1, 3), "int32"), seq_dim=0),
])
def test_positions_of_wrong_shape_raise(make):
    with pytest.raises(ValueError, match=r"positions must have shape \(S,\).*S=\d; got"):
        make()


def test_positions_and_offset_together_raise():
    for layer, x in ((pk.SinusoidalEncoding(4), X), (pk.LearnedPositionalEmbedding(8, 4), X), (pk.RotaryEmbedding(4), Q)):
        with pytest.raises(ValueError, match="pass either positions or offset, not both"):
            layer(x, positions=np.arange(x.shape[-2]), offset=1)


def test_bias_batch_sizes_must_agree_and_distances_fit_int32():
    alibi = pk.AlibiBias(2)
    with pytest.raises(ValueError, match=r"positions \(2, 3\) and key_positions \(3, 3\) have different batch sizes"):
        alibi(np.zeros((2, 3), "int32"), key_positions=np.zeros((3, 3), "int32"))
    with pytest.raises(ValueError, match="positions - key_positions " + INT32_RANGE):
        alibi(np.array([2**31 - 1]), key_positions=np.array([-1]))
    with pytest.raises(ValueError, match="positions - key_positions " + INT32_RANGE):
        pk.RelativePositionBias(2).buckets(np.array([-(2**31)]), np.array([1]))


# ---- the learned table --------------------------------------------------------------------------


@pytest.mark.parametrize("as_tensor", [False, True], ids=["numpy", "tensor"])
@pytest.mark.parametrize("bad, match", [
    ([0, 8], r"got values in \[0, 8\]; build the layer with max_seq_len >= 9"),
    ([-1, 3], r"got values in \[-1, 3\]; positions \(and offset\) index the table, so they must be >= 0"),
])
def test_learned_positions_outside_the_table_raise(as_tensor, bad, match):
    layer = pk.LearnedPositionalEmbedding(8, 4, init="sinusoidal")
    positions = np.array([bad], dtype="int32")                                          # (B, S) = (1, 2)
    positions = ops.convert_to_tensor(positions) if as_tensor else positions
    with pytest.raises(ValueError, match=r"positions must lie in \[0, max_seq_len=8\), " + match):
        layer(X, positions=positions)


@pytest.mark.parametrize("offset, match", [(-1, r"\[-1, 0\]"), (7, r"\[7, 8\]")])
def test_learned_offset_outside_the_table_raises(offset, match):
    with pytest.raises(ValueError, match=r"positions must lie in \[0, max_seq_len=8\), got values in " + match):
        pk.LearnedPositionalEmbedding(8, 4)(X, offset=offset)


def test_learned_rows_inside_the_table_equal_the_exact_table():
    layer = pk.LearnedPositionalEmbedding(8, 4, init="sinusoidal")
    positions = np.array([[7, 0], [3, 5]], dtype=np.int64)
    x = np.ones((2, 2, 4), dtype="float32")
    out = np_(layer(x, positions=positions))
    np.testing.assert_allclose(out, 1.0 + sinusoidal_ref(positions, 4), rtol=0, atol=1e-6)
    out = np_(layer(x, offset=np.int64(6)))                                             # NumPy ints are ints
    np.testing.assert_allclose(out, 1.0 + np.broadcast_to(sinusoidal_ref(np.arange(6, 8), 4), (2, 2, 4)), rtol=0, atol=1e-6)


# ---- offset, seq_dim, seq_len -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1.0, True, "1", None])
def test_non_int_offset_raises(bad):
    for layer, x in ((pk.SinusoidalEncoding(4), X), (pk.LearnedPositionalEmbedding(8, 4), X), (pk.RotaryEmbedding(4), Q)):
        with pytest.raises(TypeError, match="offset must be an int"):
            layer(x, offset=bad)


@pytest.mark.parametrize("offset", [2**31, 2**31 - 1, -(2**31) - 1])
def test_offset_past_int32_raises(offset):
    for layer, x in ((pk.SinusoidalEncoding(4), X), (pk.RotaryEmbedding(4), Q)):
        with pytest.raises(ValueError, match=r"positions \(offset \+ arange\(S\)\) " + INT32_RANGE):
            layer(x, offset=offset)


def test_offset_results_equal_the_float64_reference():
    out = np_(pk.SinusoidalEncoding(4, max_seq_len=8)(X, offset=np.int64(6)))           # rows 6, 7: inside
    np.testing.assert_allclose(out[0], sinusoidal_ref(np.arange(6, 8), 4), rtol=0, atol=1e-6)
    q = np.random.default_rng(0).standard_normal((1, 2, 3, 6)).astype(np.float32)
    out = np_(pk.RotaryEmbedding(4, max_seq_len=8)(q, offset=-2))                      # negative: outside
    np.testing.assert_allclose(out, rope_ref(q, np.arange(-2, 1), 4), rtol=0, atol=2e-6)


@pytest.mark.parametrize("seq_dim", [4, -5, 3, -1, 100])
def test_seq_dim_outside_the_sequence_axes_raises(seq_dim):
    with pytest.raises(ValueError, match=rf"seq_dim={seq_dim} is not a sequence axis of a 4-D tensor \(features are last\); "
                                         r"use -2 for \(B, H, S, D\) or 1 for \(B, S, H, D\)"):
        pk.RotaryEmbedding(4)(Q, seq_dim=seq_dim)


def test_non_int_seq_dim_raises():
    with pytest.raises(TypeError, match="seq_dim must be an int"):
        pk.RotaryEmbedding(4)(Q, seq_dim=1.0)


@pytest.mark.parametrize("seq_dim", [0, 1, 2, -2, -3, -4])
def test_every_valid_seq_dim_equals_the_reference(seq_dim):
    x = np.random.default_rng(1).standard_normal((2, 3, 5, 4)).astype(np.float32)
    out = np_(pk.RotaryEmbedding(4)(x, seq_dim=seq_dim))
    seq_axis = seq_dim % 4
    want = np.moveaxis(rope_ref(np.moveaxis(x, seq_axis, -2), np.arange(x.shape[seq_axis]), 4), -2, seq_axis)
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("bad, err", [(0, ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_seq_len_raises(bad, err):
    with pytest.raises(err, match="seq_len must be"):
        pk.RotaryEmbedding(4)(Q, seq_len=bad)
    with pytest.raises(err, match="seq_len must be"):
        pk.RotaryEmbedding(4).cos_sin(np.arange(3), seq_len=bad)


# ---- inputs: dtype and rank ---------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda: pk.SinusoidalEncoding(4), lambda: pk.LearnedPositionalEmbedding(8, 4)])
def test_embedding_inputs_must_be_float_of_rank_2_or_3(make):
    layer = make()
    with pytest.raises(TypeError, match=r"x must be a floating tensor, got dtype int32; embed token ids first"):
        layer(np.zeros((1, 2, 4), dtype="int32"))
    for shape in ((), (4,), (1, 1, 2, 4)):
        with pytest.raises(ValueError, match=rf"x must have shape \(B, S, 4\) or \(S, 4\) .*got shape {re_shape(shape)}"):
            layer(ops.zeros(shape))
    with pytest.raises(ValueError, match=r"last dimension dim=4"):
        layer(ops.zeros((1, 2, 5)))


def re_shape(shape):
    return str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")


def test_rotary_inputs_must_be_float_with_matching_shapes():
    rope = pk.RotaryEmbedding(4)
    with pytest.raises(TypeError, match="q must be a floating tensor, got dtype int32"):
        rope(Q.astype("int32"))
    with pytest.raises(TypeError, match="k must be a floating tensor, got dtype int32"):
        rope(Q, Q.astype("int32"))
    for shape in ((), (4,)):
        with pytest.raises(ValueError, match=r"q must have at least 2 dims \(\.\.\., S, D\)"):
            rope(ops.zeros(shape))
    with pytest.raises(ValueError, match=r"k \(1, 2, 5, 4\) must match q \(1, 2, 3, 4\) in rank, batch and sequence length"):
        rope(Q, np.zeros((1, 2, 5, 4), "float32"))
    with pytest.raises(ValueError, match="must match q .* in rank"):
        rope(Q, np.zeros((2, 3, 4), "float32"))
    with pytest.raises(ValueError, match="k has head dim 2 < rotary dim 4; build the layer with a rotary dim <= the head dim"):
        rope(Q, np.zeros((1, 2, 3, 2), "float32"))


# ---- constructors -------------------------------------------------------------------------------


@pytest.mark.parametrize("make, err, match", [
    (lambda: pk.RotaryEmbedding(0), ValueError, "dim must be >= 2"),
    (lambda: pk.RotaryEmbedding(5), ValueError, "dim .* must be even"),
    (lambda: pk.RotaryEmbedding(8.0), TypeError, "dim must be an int"),
    (lambda: pk.RotaryEmbedding(True), TypeError, "dim must be an int"),
    (lambda: pk.RotaryEmbedding(8, max_seq_len=0), ValueError, "max_seq_len must be >= 1"),
    (lambda: pk.RotaryEmbedding(8, base=-1.0), ValueError, "base must be > 0"),
    (lambda: pk.RotaryEmbedding(8, layout="gptj"), ValueError, "layout must be one of"),
    (lambda: pk.RotaryEmbedding(8, xpos_scale_base=0.0), ValueError, "xpos_scale_base must be > 0"),
    (lambda: pk.SinusoidalEncoding(0), ValueError, "dim must be >= 1"),
    (lambda: pk.SinusoidalEncoding(4, max_seq_len=0), ValueError, "max_seq_len must be >= 1"),
    (lambda: pk.SinusoidalEncoding(4, dropout=1.0), ValueError, r"dropout must be in \[0, 1\)"),
    (lambda: pk.LearnedPositionalEmbedding(0, 4), ValueError, "max_seq_len must be >= 1"),
    (lambda: pk.LearnedPositionalEmbedding(8, 0), ValueError, "dim must be >= 1"),
    (lambda: pk.LearnedPositionalEmbedding(8, 4, padding_idx=8), ValueError, "padding_idx must be < max_seq_len=8"),
    (lambda: pk.LearnedPositionalEmbedding(8, 4, init="xavier"), ValueError, "init must be one of"),
    (lambda: pk.AlibiBias(0), ValueError, "num_heads must be >= 1"),
    (lambda: pk.AlibiBias(2.0), TypeError, "num_heads must be an int"),
    (lambda: pk.AlibiBias(2, symmetric=1), TypeError, "symmetric must be a bool"),
    (lambda: pk.RelativePositionBias(0), ValueError, "num_heads must be >= 1"),
    (lambda: pk.RelativePositionBias(2, num_buckets=3), ValueError, r"num_buckets=3 leaves 1 bucket\(s\) per direction"),
    (lambda: pk.RelativePositionBias(2, max_distance=0), ValueError, "max_distance must be >= 1"),
])
def test_bad_constructor_arguments_raise(make, err, match):
    with pytest.raises(err, match=match):
        make()


# ---- good values: equal to float64 references ---------------------------------------------------


def test_sinusoidal_numpy_int64_positions_equal_the_reference():
    positions = np.array([[0, 9], [3, 300]], dtype=np.int64)                            # 300 is past the table
    out = np_(pk.SinusoidalEncoding(4, max_seq_len=10)(np.zeros((2, 2, 4), "float32"), positions=positions))
    np.testing.assert_allclose(out[0], sinusoidal_ref(positions[0], 4), rtol=0, atol=1e-6)      # table rows
    np.testing.assert_allclose(out, sinusoidal_ref(positions, 4), rtol=0, atol=5e-5)            # float32 angles


def test_rotary_numpy_positions_equal_the_reference():
    q = np.random.default_rng(2).standard_normal((2, 4, 3, 6)).astype(np.float32)      # (B, S, H, D)
    positions = np.array([5, 0, 17, 3], dtype=np.int64)
    out = np_(pk.RotaryEmbedding(4, max_seq_len=16)(q, positions=positions, seq_dim=1))
    want = np.swapaxes(rope_ref(np.swapaxes(q, 1, 2), positions, 4), 1, 2)
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-6)


def test_alibi_per_row_positions_equal_the_reference():
    positions = np.array([[0, 1, 2], [5, 6, 7]], dtype=np.int64)
    out = np_(pk.AlibiBias(2)(positions, key_positions=np.array([0, 4])))               # (B, H, S, S_k)
    slopes = np.array([0.5 ** 4, 0.5 ** 8])                                            # H = 2
    dist = positions[:, :, None] - np.array([0, 4])[None, None, :]
    np.testing.assert_allclose(out, -slopes[None, :, None, None] * dist[:, None], rtol=0, atol=1e-6)


# ---- symbolic building and jit keep working ------------------------------------------------------


def test_functional_models_with_positions_inputs_build_and_run():
    x_in, pos_in = keras.Input((None, 4)), keras.Input((None,), dtype="int32")
    q_in = keras.Input((2, None, 4))
    outs = [pk.SinusoidalEncoding(4)(x_in, positions=pos_in), pk.LearnedPositionalEmbedding(8, 4)(x_in, positions=pos_in),
            pk.RotaryEmbedding(4)(q_in, positions=pos_in), pk.AlibiBias(2)(pos_in), pk.RelativePositionBias(2)(pos_in)]
    assert tuple(outs[3].shape) == (None, 2, None, None)
    model = keras.Model([x_in, q_in, pos_in], outs)
    positions = np.array([[1, 5, 2]], dtype="int32")
    sin, *_ = model.predict([np.zeros((1, 3, 4)), np.zeros((1, 2, 3, 4)), positions], verbose=0)   # jit on JAX
    np.testing.assert_allclose(sin, sinusoidal_ref(positions, 4), rtol=0, atol=1e-6)


def test_symbolic_inputs_get_the_static_checks():
    pos_in = keras.Input((None,), dtype="int32")
    with pytest.raises(TypeError, match="positions must hold integers"):
        pk.SinusoidalEncoding(4)(keras.Input((None, 4)), positions=keras.Input((None,), dtype="float32"))
    with pytest.raises(TypeError, match="x must be a floating tensor"):
        pk.LearnedPositionalEmbedding(8, 4)(keras.Input((None, 4), dtype="int32"))
    with pytest.raises(ValueError, match="seq_dim=3 is not a sequence axis"):
        pk.RotaryEmbedding(4)(keras.Input((2, None, 4)), seq_dim=3)
    with pytest.raises(TypeError, match="key_positions must hold integers"):
        pk.AlibiBias(2)(pos_in, key_positions=keras.Input((None,), dtype="float32"))
    with pytest.raises(ValueError, match=r"positions must have shape \(S,\) or \(B, S\)"):
        pk.RelativePositionBias(2)(keras.Input((None, None), dtype="int32"))


def test_eager_call_of_a_functional_model_checks_values():
    x_in, pos_in = keras.Input((None, 4)), keras.Input((None,), dtype="int32")
    model = keras.Model([x_in, pos_in], pk.LearnedPositionalEmbedding(8, 4)(x_in, positions=pos_in))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, max_seq_len=8\), got values in \[1, 9\]"):
        model([np.zeros((1, 2, 4), "float32"), np.array([[1, 9]], dtype="int32")])


def test_jax_jit_traces_without_value_checks():
    if BACKEND != "jax":
        pytest.skip("jax.jit needs the JAX backend")
    import jax

    layer, rope = pk.SinusoidalEncoding(4), pk.RotaryEmbedding(4)
    positions = np.array([3, 0, 11], dtype="int32")
    out = jax.jit(lambda p: layer(ops.zeros((1, 3, 4)), positions=p))(positions)
    np.testing.assert_allclose(np_(out)[0], sinusoidal_ref(positions, 4), rtol=0, atol=1e-6)
    q = np.random.default_rng(3).standard_normal((1, 2, 3, 4)).astype(np.float32)
    out = jax.jit(lambda q, p: rope(q, positions=p))(q, positions)
    np.testing.assert_allclose(np_(out), rope_ref(q, positions, 4), rtol=0, atol=2e-6)
    alibi = pk.AlibiBias(1)
    bias = jax.jit(lambda p: alibi(p))(positions)
    want = -float(alibi.slopes[0]) * (positions[:, None] - positions[None, :])
    np.testing.assert_allclose(np_(bias)[0], want, rtol=0, atol=1e-6)
