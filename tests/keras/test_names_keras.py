"""Keras layers: one name per concept (backend from KERAS_BACKEND).  The new names work, the old ones still
work with a DeprecationWarning naming the new one, both together raise, and a config saved with the old key
still loads."""

import warnings

import numpy as np
import pytest

keras = pytest.importorskip("keras")
from keras import ops  # noqa: E402

from posenc.keras import AxialRotaryEmbedding, LearnedPositionalEmbedding, SinusoidalEncodingND  # noqa: E402


def np_(t):
    return np.asarray(ops.convert_to_numpy(t))


def _no_warning(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args, **kwargs)


def _warns(match, fn):
    with pytest.warns(DeprecationWarning, match=match) as record:
        out = fn()
    return out, record


def test_learned_max_seq_len_and_its_old_name():
    new = _no_warning(LearnedPositionalEmbedding, 8, 4, init="sinusoidal")
    keyword = _no_warning(LearnedPositionalEmbedding, max_seq_len=8, dim=4, init="sinusoidal")
    old, record = _warns(r"LearnedPositionalEmbedding: num_positions= is deprecated.*pass max_seq_len=",
                         lambda: LearnedPositionalEmbedding(num_positions=8, dim=4, init="sinusoidal"))
    assert any(w.filename == __file__ for w in record)                              # the caller's line
    assert new.max_seq_len == keyword.max_seq_len == old.max_seq_len == 8
    x = np.zeros((2, 8, 4), dtype="float32")
    np.testing.assert_array_equal(np_(old(x)), np_(new(x)))
    np.testing.assert_array_equal(np_(keyword(x)), np_(new(x)))
    assert _warns(r"num_positions is deprecated.*max_seq_len", lambda: new.num_positions)[0] == 8
    with pytest.raises(TypeError, match=r"pass max_seq_len= only \(num_positions= is its old name"):
        LearnedPositionalEmbedding(8, 4, num_positions=8)
    with pytest.raises(ValueError, match=r"positions must lie in \[0, max_seq_len=8\).*max_seq_len >= 9"):
        new(np.zeros((1, 9, 4), dtype="float32"))


def test_learned_config_has_the_new_key_and_the_old_key_still_loads():
    layer = _no_warning(LearnedPositionalEmbedding, 6, 4, init="sinusoidal", padding_idx=0)
    config = layer.get_config()
    assert config["max_seq_len"] == 6 and "num_positions" not in config
    again = _no_warning(LearnedPositionalEmbedding.from_config, config)
    old_config = dict(config)
    old_config["num_positions"] = old_config.pop("max_seq_len")
    loaded, _ = _warns(r"num_positions= is deprecated.*pass max_seq_len=",
                       lambda: LearnedPositionalEmbedding.from_config(old_config))
    assert again.max_seq_len == loaded.max_seq_len == 6 and loaded.padding_idx == 0
    x = np.zeros((6, 4), dtype="float32")
    np.testing.assert_array_equal(np_(loaded(x)), np_(layer(x)))
    by_name, _ = _warns("num_positions=", lambda: keras.saving.deserialize_keras_object(
        {**keras.saving.serialize_keras_object(layer), "config": old_config}))
    assert isinstance(by_name, LearnedPositionalEmbedding) and by_name.max_seq_len == 6


def test_axial_max_seq_len_and_its_old_name():
    new = _no_warning(AxialRotaryEmbedding, (4, 4), max_seq_len=8)
    old, record = _warns(r"AxialRotaryEmbedding: max_positions= is deprecated.*pass max_seq_len=",
                         lambda: AxialRotaryEmbedding((4, 4), max_positions=8))
    assert any(w.filename == __file__ for w in record)
    assert new.max_seq_len == old.max_seq_len == 8
    assert _no_warning(AxialRotaryEmbedding, (4, 4)).max_seq_len == 1024
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 5, 8)).astype("float32")
    pos = np.array([[0, 1], [3, 7], [9, 2], [7, 7], [12, 0]], dtype="int32")         # some past the table
    np.testing.assert_array_equal(np_(old(q, positions=pos)), np_(new(q, positions=pos)))
    assert _warns(r"max_positions is deprecated.*max_seq_len", lambda: new.max_positions)[0] == 8
    with pytest.raises(TypeError, match=r"pass max_seq_len= only \(max_positions= is its old name"):
        AxialRotaryEmbedding((4, 4), max_seq_len=8, max_positions=8)
    with pytest.raises(TypeError, match=r"pass max_seq_len= only"):
        AxialRotaryEmbedding((4, 4), max_seq_len=1024, max_positions=8)             # the default's value, passed


def test_axial_config_has_the_new_key_and_the_old_key_still_loads():
    layer = _no_warning(AxialRotaryEmbedding, (4, 4), layout="half", max_seq_len=16)
    config = layer.get_config()
    assert config["max_seq_len"] == 16 and "max_positions" not in config
    old_config = dict(config)
    old_config["max_positions"] = old_config.pop("max_seq_len")
    loaded, _ = _warns(r"max_positions= is deprecated.*pass max_seq_len=",
                       lambda: AxialRotaryEmbedding.from_config(old_config))
    assert loaded.max_seq_len == 16 and loaded.layout == "half"
    assert _no_warning(AxialRotaryEmbedding.from_config, config).max_seq_len == 16


@pytest.mark.parametrize("grid", [(2, 3), [2, 3], (2, 2, 2)])
def test_sincos_nd_grid_first_and_the_old_order(grid):
    new = _no_warning(SinusoidalEncodingND, grid, 16, prefix_tokens=1)
    old, record = _warns(r"the order \(dim, grid_shape\) is deprecated.*pass the grid first",
                         lambda: SinusoidalEncodingND(16, grid, prefix_tokens=1))
    assert any(w.filename == __file__ for w in record)
    keyword = _no_warning(SinusoidalEncodingND, dim=16, grid_shape=grid, prefix_tokens=1)
    assert new.grid_shape == old.grid_shape == keyword.grid_shape == tuple(grid)
    np.testing.assert_array_equal(old.table(), new.table())
    np.testing.assert_array_equal(keyword.table(), new.table())
    loaded = _no_warning(SinusoidalEncodingND.from_config, new.get_config())      # keys, not positions
    np.testing.assert_array_equal(loaded.table(), new.table())
