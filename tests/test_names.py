"""One name per concept: the new names work, the old ones still work with a DeprecationWarning naming the
new one (attributed to the caller's line), and passing both raises TypeError.

- M-RoPE positions axes last ``(S, 3)`` / ``(B, S, 3)``; axes first ``(3, S)`` / ``(3, B, S)`` is the old order;
- ``max_seq_len`` (was ``max_positions`` of AxialRotaryEmbedding, ``num_positions`` of LearnedPositionalEmbedding);
- ``assume_valid`` (was ``assume_in_table``) in MultimodalRotaryEmbedding and AxialRotaryEmbedding;
- ``SinusoidalEncodingND(grid_shape, dim)`` (was ``(dim, grid_shape)``).
"""

import warnings

import pytest
import torch

from posenc.functional.mrope import mrope_cos_sin, mrope_positions
from posenc.nn import AxialRotaryEmbedding, LearnedPositionalEmbedding, MultimodalRotaryEmbedding, SinusoidalEncodingND

# t, h, w of a text token, a 2 x 2 image and a text token: (S=7, 3), axes last
P = torch.tensor([[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]]).T.contiguous()


def _no_warning(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args, **kwargs)


def _warns(match, fn, *args, **kwargs):
    """``fn(...)`` under ``pytest.warns``, checking the warning points at this file (the caller's line)."""
    with pytest.warns(DeprecationWarning, match=match) as record:
        out = fn(*args, **kwargs)
    assert any(w.filename == __file__ for w in record if issubclass(w.category, DeprecationWarning)), \
        [(w.filename, str(w.message)) for w in record]
    return out


def _same(a, b):
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif a is None:
        assert b is None
    else:
        assert torch.equal(a, b), (a, b)


# ---- M-RoPE: positions axes last ----------------------------------------------------------------------------


def test_mrope_cos_sin_reads_the_old_axes_first_order_bit_for_bit_with_a_warning():
    inv = torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=torch.float64)
    new = _no_warning(mrope_cos_sin, P, inv, [2, 1, 1])
    assert new[0].shape == (7, 4)
    _same(_warns(r"movedim\(0, -1\)", lambda: mrope_cos_sin(P.T, inv, [2, 1, 1])), new)
    batched = torch.stack([P, P.flip(0)])                                             # (B=2, S=7, 3)
    new_b = _no_warning(mrope_cos_sin, batched, inv, [2, 1, 1], mrope_interleaved=True)
    old_b = _warns(r"movedim\(0, -1\)", lambda: mrope_cos_sin(batched.movedim(-1, 0), inv, [2, 1, 1],
                                                              mrope_interleaved=True))
    _same(old_b, new_b)


@pytest.mark.parametrize("seq_dim", [-2, 1])
def test_mrope_module_old_axes_first_positions_give_identical_outputs(seq_dim):
    m = MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=16)
    shape = (2, 3, 7, 8) if seq_dim == -2 else (2, 7, 3, 8)
    q, k = torch.randn(shape), torch.randn(shape)
    for pos in (P, torch.stack([P, P + 5])):                                          # (S, 3) and (B, S, 3)
        new = _no_warning(m, q, k, positions=pos, seq_dim=seq_dim)
        old = _warns(r"MultimodalRotaryEmbedding: .*axes t, h, w first.*movedim\(0, -1\)",
                     lambda pos=pos: m(q, k, positions=pos.movedim(-1, 0), seq_dim=seq_dim))
        _same(old, new)
        _same(_warns(r"movedim\(0, -1\)", lambda pos=pos: m.cos_sin(pos.movedim(-1, 0))), _no_warning(m.cos_sin, pos))
    far = P * 1000                                                                    # past the tables: exact
    _same(_warns("movedim", lambda: m(q, positions=far.T, seq_dim=seq_dim)), _no_warning(m, q, positions=far,
                                                                                          seq_dim=seq_dim))


def test_mrope_shape_that_fits_both_readings_is_read_axes_last_without_a_warning():
    m = MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=16)
    square = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])                         # (S=3, 3)
    cos, sin = _no_warning(m.cos_sin, square)
    for i in range(3):                                                                # token i is row i
        ci, si = m.cos_sin(square[i : i + 1])
        _same((cos[i : i + 1], sin[i : i + 1]), (ci, si))
    q = torch.randn(1, 2, 3, 8)
    _same(_no_warning(m, q, positions=square)[0], m(q, cos_sin=(cos, sin))[0])


def test_mrope_default_text_positions_equal_explicit_axes_last_text_positions():
    m = MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=16)
    q = torch.randn(1, 2, 5, 8)
    text = (torch.arange(5) + 3).unsqueeze(-1).expand(-1, 3)                         # (S, 3)
    _same(_no_warning(m, q, offset=3), _no_warning(m, q, positions=text))


def test_mrope_positions_returns_axes_last_and_feeds_the_module_without_a_warning():
    ids = torch.zeros(1, 7, dtype=torch.long)
    types = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])
    pos, delta = mrope_positions(ids, mm_token_type_ids=types, image_grid_thw=torch.tensor([[1, 4, 4]]))
    assert pos.shape == (1, 7, 3) and torch.equal(pos[0], P) and delta.tolist() == [[-2]]
    m = MultimodalRotaryEmbedding(8, [2, 1, 1])
    q = torch.randn(1, 2, 7, 8)
    _same(_no_warning(m, q, positions=pos), _no_warning(m, q, positions=P))


@pytest.mark.parametrize("positions,match", [
    (torch.zeros(2, 7, 4, dtype=torch.long), r"\(S, 3\) or \(B, S, 3\).*positions\[\.\.\., 1:\]"),
    (torch.zeros(4, 2, 7, dtype=torch.long), r"positions\[1:\]\.movedim\(0, -1\)"),
    (torch.arange(7), r"axes t, h, w last.*unsqueeze\(-1\)"),
    (torch.zeros(1, 7, dtype=torch.long), r"\(S, 3\) or \(B, S, 3\)"),
])
def test_mrope_bad_positions_name_the_axes_last_shape(positions, match):
    m = MultimodalRotaryEmbedding(8, [2, 1, 1])
    with pytest.raises(ValueError, match=match):
        m(torch.randn(2, 2, 7, 8), positions=positions)


def test_mrope_wrong_length_names_the_axes_last_shape():
    m = MultimodalRotaryEmbedding(8, [2, 1, 1])
    with pytest.raises(ValueError, match=r"\(S, 3\) or \(B, S, 3\) with B=1, S=7; got \(6, 3\)"):
        m(torch.randn(1, 2, 7, 8), positions=P[:6])


def test_transformers_boundary_reads_axes_first_position_ids_without_a_warning():
    from posenc.integrations.transformers import _HFMropeTables

    config = {"model_type": "qwen2_vl", "hidden_size": 64, "num_attention_heads": 4, "rope_theta": 10000.0,
              "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}
    tables = _HFMropeTables(config, False)
    ids = torch.stack([P, P + 2]).movedim(-1, 0)                                      # transformers: (3, B, S)
    cos, sin = _no_warning(tables, ids, torch.float32)
    want_c, want_s = tables.rope.cos_sin(ids.movedim(0, -1))
    _same((cos, sin), (torch.cat([want_c, want_c], -1), torch.cat([want_s, want_s], -1)))
    text = torch.arange(7)[None].expand(2, -1)                                        # (B, S): text only
    _same(_no_warning(tables, text, torch.float32)[0], _no_warning(tables, text[None].expand(3, -1, -1), torch.float32)[0])


# ---- assume_valid (was assume_in_table) -------------------------------------------------------------------


def test_mrope_assume_valid_and_its_old_name():
    m = MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=16)
    q, k = torch.randn(1, 2, 7, 8), torch.randn(1, 1, 7, 8)
    new = _no_warning(m, q, k, positions=P, assume_valid=True)
    _same(new, m(q, k, positions=P))
    _same(_warns(r"MultimodalRotaryEmbedding: assume_in_table= is deprecated.*pass assume_valid=",
                 lambda: m(q, k, positions=P, assume_in_table=True)), new)
    _same(_warns(r"MultimodalRotaryEmbedding.cos_sin: assume_in_table=.*assume_valid=",
                 lambda: m.cos_sin(P, assume_in_table=True)), _no_warning(m.cos_sin, P, assume_valid=True))
    with pytest.raises(TypeError, match=r"pass assume_valid= only \(assume_in_table= is its old name"):
        m(q, positions=P, assume_valid=True, assume_in_table=True)
    with pytest.raises(TypeError, match="assume_valid= only"):
        m.cos_sin(P, assume_valid=True, assume_in_table=True)
    with pytest.raises(ValueError, match=r"promised to with assume_valid=True"):
        MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=2).cos_sin(P, assume_valid=True)
    with pytest.raises(TypeError, match="assume_valid must be a bool"):
        m(q, positions=P, assume_valid="yes")


def test_axial_assume_valid_and_its_old_name():
    m = AxialRotaryEmbedding((4, 4), max_seq_len=8)
    pos = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]])
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    new = _no_warning(m, q, k, positions=pos, assume_valid=True)
    _same(new, m(q, k, positions=pos))
    _same(_warns(r"AxialRotaryEmbedding: assume_in_table=.*assume_valid=", lambda: m(q, k, positions=pos,
                                                                                     assume_in_table=True)), new)
    _same(_warns(r"AxialRotaryEmbedding.rotate: assume_in_table=.*assume_valid=",
                 lambda: m.rotate(q, positions=pos, assume_in_table=True)), new[0])
    _same(_warns(r"AxialRotaryEmbedding.cos_sin: assume_in_table=.*assume_valid=",
                 lambda: m.cos_sin(pos, assume_in_table=True)), _no_warning(m.cos_sin, pos, assume_valid=True))
    for call in (lambda: m(q, positions=pos, assume_valid=True, assume_in_table=True),
                 lambda: m.rotate(q, positions=pos, assume_valid=True, assume_in_table=False),
                 lambda: m.cos_sin(pos, assume_valid=True, assume_in_table=True)):
        with pytest.raises(TypeError, match=r"pass assume_valid= only"):
            call()
    with pytest.raises(ValueError, match=r"promised to with assume_valid=True"):
        m(q, positions=pos + 10, assume_valid=True)


# ---- max_seq_len (was max_positions / num_positions) ------------------------------------------------------


def test_axial_max_seq_len_and_its_old_name():
    new = _no_warning(AxialRotaryEmbedding, (4, 6), max_seq_len=12)
    old = _warns(r"AxialRotaryEmbedding: max_positions= is deprecated.*pass max_seq_len=",
                 lambda: AxialRotaryEmbedding((4, 6), max_positions=12))
    assert new.max_seq_len == old.max_seq_len == 12 and new.packed_table.shape[0] == 12
    _same(old.packed_table, new.packed_table)
    pos = torch.tensor([[0, 3], [11, 2], [20, 1]])                                   # the last row past the table
    q = torch.randn(1, 2, 3, 10)
    _same(old(q, positions=pos), new(q, positions=pos))
    assert _warns(r"AxialRotaryEmbedding.max_positions is deprecated.*max_seq_len", lambda: new.max_positions) == 12
    assert "max_seq_len=12" in repr(new)
    with pytest.raises(TypeError, match=r"pass max_seq_len= only \(max_positions= is its old name"):
        AxialRotaryEmbedding((4, 6), max_seq_len=12, max_positions=12)
    with pytest.raises(ValueError, match="max_seq_len must be >= 1"):
        AxialRotaryEmbedding((4, 6), max_seq_len=0)
    with pytest.raises(ValueError, match="drop max_seq_len"):
        AxialRotaryEmbedding((4, 4), learned=True, num_heads=2, max_seq_len=8)


def test_learned_max_seq_len_positional_keyword_and_old_name():
    positional = _no_warning(LearnedPositionalEmbedding, 8, 4, init="sinusoidal")
    keyword = _no_warning(LearnedPositionalEmbedding, max_seq_len=8, dim=4, init="sinusoidal")
    old = _warns(r"LearnedPositionalEmbedding: num_positions= is deprecated.*pass max_seq_len=",
                 lambda: LearnedPositionalEmbedding(num_positions=8, dim=4, init="sinusoidal"))
    assert positional.max_seq_len == keyword.max_seq_len == old.max_seq_len == 8
    _same(old.weight, positional.weight)
    _same(keyword.weight, positional.weight)
    x = torch.randn(2, 8, 4)
    _same(old(x), positional(x))
    assert _warns(r"LearnedPositionalEmbedding.num_positions is deprecated.*max_seq_len",
                  lambda: positional.num_positions) == 8
    with pytest.raises(TypeError, match=r"pass max_seq_len= only \(num_positions= is its old name"):
        LearnedPositionalEmbedding(8, 4, num_positions=8)
    with pytest.raises(TypeError, match="needs max_seq_len"):
        LearnedPositionalEmbedding(dim=4)
    with pytest.raises(TypeError, match="needs dim"):
        LearnedPositionalEmbedding(8)
    with pytest.raises(ValueError, match=r"max_seq_len=8; build the module with max_seq_len >= 9"):
        positional(torch.zeros(1, 9, 4))
    with pytest.raises(ValueError, match=r"padding_idx must be < max_seq_len=8"):
        LearnedPositionalEmbedding(8, 4, padding_idx=8)


def test_learned_resize_max_seq_len_and_its_old_name():
    emb = LearnedPositionalEmbedding(6, 3, init="sinusoidal", padding_idx=0)
    new = _no_warning(emb.resize, 10, mode="linear", antialias=False)
    keyword = _no_warning(emb.resize, max_seq_len=10, mode="linear", antialias=False)
    old = _warns(r"LearnedPositionalEmbedding.resize: num_positions= is deprecated.*pass max_seq_len=",
                 lambda: emb.resize(num_positions=10, mode="linear", antialias=False))
    assert new.max_seq_len == keyword.max_seq_len == old.max_seq_len == 10
    _same(old.weight, new.weight)
    _same(keyword.weight, new.weight)
    with pytest.raises(TypeError, match=r"pass max_seq_len= only"):
        emb.resize(10, num_positions=10)
    with pytest.raises(TypeError, match="needs max_seq_len"):
        emb.resize()
    with pytest.raises(ValueError, match=r"max_seq_len must be >= 1, got 0"):
        emb.resize(0)
    with pytest.raises(ValueError, match=r"got max_seq_len=1 .* pass max_seq_len > 1"):
        emb.resize(1)


# ---- SinusoidalEncodingND(grid_shape, dim) ------------------------------------------------------------------


@pytest.mark.parametrize("grid", [(2, 3), [2, 3], (2, 2, 3)])
def test_sincos_nd_grid_first_and_the_old_order(grid):
    dim = 16
    new = _no_warning(SinusoidalEncodingND, grid, dim, prefix_tokens=1)
    old = _warns(r"the order \(dim, grid_shape\) is deprecated.*pass the grid first",
                 lambda: SinusoidalEncodingND(dim, grid, prefix_tokens=1))
    keyword = _no_warning(SinusoidalEncodingND, dim=dim, grid_shape=grid, prefix_tokens=1)
    assert new.grid_shape == old.grid_shape == keyword.grid_shape == tuple(grid) and new.dim == old.dim == dim
    _same(old.table(), new.table())
    _same(keyword.table(), new.table())
    x = torch.randn(2, new.num_tokens(), dim)
    _same(old(x), new(x))
    assert repr(new) == repr(old) and f"grid_shape={tuple(grid)}, dim={dim}" in repr(new)


def test_sincos_nd_bad_arguments_are_not_read_as_the_old_order():
    with pytest.raises((TypeError, ValueError)):
        _no_warning(SinusoidalEncodingND, 8, 16)                                     # two ints: no grid at all
    with pytest.raises((TypeError, ValueError)):
        _no_warning(SinusoidalEncodingND, True, (2, 2))                              # a bool is no dim


# ---- inside torch.compile: the old names still work (a traced graph cannot warn) ---------------------------


def test_old_names_and_order_compile_in_one_graph():
    m = MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=16)
    axial = AxialRotaryEmbedding((4, 4), max_seq_len=8)
    q = torch.randn(1, 2, 7, 8)
    grid = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1], [3, 3]])

    def old(q, p, g):
        return m(q, positions=p.T, assume_in_table=True)[0], axial.rotate(q, positions=g, assume_in_table=True)

    def new(q, p, g):
        return m(q, positions=p, assume_valid=True)[0], axial.rotate(q, positions=g, assume_valid=True)

    got = torch.compile(old, backend="aot_eager", fullgraph=True)(q, P, grid)
    _same(got, torch.compile(new, backend="aot_eager", fullgraph=True)(q, P, grid))
    torch.testing.assert_close(got, new(q, P, grid), rtol=0, atol=1e-6)
