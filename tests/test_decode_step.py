"""The decode step's short path (``kernels.torch_decode.decode_qk``): the same values as the general
path, within the exactness bound of a float64 oracle, and taken only where it applies."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.functional import apply_rope_qk
from posenc.kernels import factor_cache
from posenc.kernels.factor_cache import decode_factors
from posenc.kernels.torch_decode import decode_qk
from tests.reference import rope_oracle

D = 16
TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _qk(shape_q, shape_k, dtype):
    return torch.randn(shape_q, dtype=torch.float64).to(dtype), torch.randn(shape_k, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim, length", [(-2, 1), (-2, 3), (2, 3), (1, 1), (1, 3)])
def test_the_short_path_equals_the_general_path_and_the_oracle(dtype, layout, seq_dim, length):
    rope = posenc.RotaryEmbedding(D, max_seq_len=64, layout=layout)
    if seq_dim == 1:
        q, k = _qk((1, length, 4, D), (1, length, 2, D), dtype)
    else:
        q, k = _qk((1, 4, length, D), (1, 2, length, D), dtype)
    offset = 40
    factors = decode_factors(rope.packed_table, layout)
    assert decode_qk(q, k, seq_dim, offset, D, 64, "auto", factors) is not None         # the short path applies
    positions = torch.arange(offset, offset + length)
    general = rope(q, k, positions=positions, seq_dim=seq_dim)                         # the general path
    for short in (rope(q, k, offset=offset, seq_dim=seq_dim),
                  apply_rope_qk(q, k, rope.cos_table, rope.sin_table, offset=offset, layout=layout, seq_dim=seq_dim)):
        for got, want, x in zip(short, general, (q, k), strict=True):
            assert got.dtype == x.dtype and got.shape == x.shape
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            xs = x.transpose(1, 2) if seq_dim == 1 else x                                # oracle: (B, H, S, D)
            ref = rope_oracle.rotate(xs, positions, rope_oracle.default(D, 10000.0), layout)
            ref = ref.transpose(1, 2) if seq_dim == 1 else ref
            torch.testing.assert_close(got.double(), ref, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("case", ["batch-2", "k-none", "partial-rotary", "past-table", "float64", "grad", "triton",
                                  "meta-table"])
def test_the_short_path_declines_what_it_does_not_serve(case):
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    table, offset, backend, dim = posenc.RotaryEmbedding(D, max_seq_len=64).packed_table, 5, "auto", D
    if case == "batch-2":
        q, k = torch.randn(2, 4, 1, D), torch.randn(2, 2, 1, D)
    elif case == "k-none":
        k = None
    elif case == "partial-rotary":
        dim = D // 2
    elif case == "past-table":
        offset = 64
    elif case == "float64":
        q, k = q.double(), k.double()
    elif case == "grad":
        q.requires_grad_(True)
    elif case == "triton":
        backend = "triton"
    elif case == "meta-table":
        table = table.to("meta")
    assert decode_qk(q, k, -2, offset, dim, table.shape[0], backend, decode_factors(table, "half")) is None


@pytest.mark.parametrize("kw, name", [({"seq_len": "long"}, "seq_len"), ({"assume_valid": "yes"}, "assume_valid"),
                                      ({"seq_dim": 3}, "seq_dim"), ({"offset": 2.0}, "offset")])
def test_a_bad_argument_of_a_decode_step_is_still_refused(kw, name):
    rope = posenc.RotaryEmbedding(D, max_seq_len=64)
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    kw = {"offset": 5, **kw}
    with pytest.raises((TypeError, ValueError), match=name):
        rope(q, k, **kw)
    if name != "seq_len":                                  # (apply_rope_qk has no seq_len)
        with pytest.raises((TypeError, ValueError), match=name):
            apply_rope_qk(q, k, rope.cos_table, rope.sin_table, **kw)


# --- the factors of apply_rope_qk's (cos, sin) tables, built once per table pair -------------------------------


def _tables(rows=64, dim=D):
    inv, _ = posenc.functional.rope_inv_freq(dim)
    return posenc.functional.rope_cos_sin(torch.arange(rows), inv)


def _step_and_general(q, k, cos, sin, offset, layout):
    """A decode step and the general path (positions=) over the same tables."""
    step = apply_rope_qk(q, k, cos, sin, offset=offset, layout=layout)
    general = apply_rope_qk(q, k, cos, sin, positions=torch.arange(offset, offset + q.shape[2]), layout=layout)
    return step, general


def _assert_equal(a, b):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.fixture
def fresh_cache():
    factor_cache.clear()
    yield factor_cache._entries
    factor_cache.clear()


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_a_table_written_in_place_is_not_served_stale_factors(fresh_cache, layout):
    cos, sin = _tables()
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    _assert_equal(*_step_and_general(q, k, cos, sin, 9, layout))
    assert len(fresh_cache) == 1
    with torch.no_grad():
        cos.mul_(0.5)                                      # the same tensors, new values
        sin[9].fill_(0.25)                                 # (a write through a view bumps the version too)
    step, general = _step_and_general(q, k, cos, sin, 9, layout)
    _assert_equal(step, general)
    unchanged = apply_rope_qk(q, k, *_tables(), offset=9, layout=layout)
    assert not torch.equal(step[0], unchanged[0])


def test_new_views_of_the_same_tables_share_one_entry(fresh_cache):
    rope = posenc.RotaryEmbedding(D, max_seq_len=64)
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    for offset in (3, 4, 5):                               # cos_table / sin_table: new views at every access
        _assert_equal(apply_rope_qk(q, k, rope.cos_table, rope.sin_table, offset=offset),
                      rope(q, k, positions=torch.tensor([offset])))
    assert len(fresh_cache) == 1


def test_the_cache_keeps_a_few_table_pairs(fresh_cache):
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    for _ in range(factor_cache.SIZE + 3):
        apply_rope_qk(q, k, *_tables(), offset=1)
    assert len(fresh_cache) == factor_cache.SIZE


@pytest.mark.parametrize("case", ["grad", "inference", "large"])
def test_tables_it_must_not_copy_are_served_per_step(fresh_cache, case):
    rows = factor_cache.MAX_ELEMENTS // (D // 2) + 1 if case == "large" else 64
    if case == "inference":
        with torch.inference_mode():
            cos, sin = _tables(rows)
    else:
        cos, sin = _tables(rows)
    if case == "grad":
        cos.requires_grad_(True)
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    step, general = _step_and_general(q, k, cos, sin, rows - 1, "half")
    _assert_equal(step, general)
    assert fresh_cache == []
    if case == "grad":                                     # the gradient reaches the table
        step[0].sum().backward()
        assert cos.grad is not None and cos.grad[rows - 1].abs().sum() > 0 and cos.grad[: rows - 1].abs().sum() == 0


def test_a_module_copy_decodes_with_its_own_table():
    import copy

    rope = posenc.RotaryEmbedding(D, max_seq_len=64)
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    before = rope(q, k, offset=7)                          # makes the decode views of the original table
    twin = copy.deepcopy(rope)
    with torch.no_grad():
        rope.packed_table.mul_(2.0)                        # change the original's table only
    _assert_equal(twin(q, k, offset=7), before)
    _assert_equal(rope(q, k, offset=7), rope(q, k, positions=torch.tensor([7])))
    rope.to("meta").to_empty(device="cpu")                 # a new table: new views, rebuilt values
    rope.reset_buffers()
    _assert_equal(rope(q, k, offset=7), before)


def test_a_shorter_view_of_the_same_memory_gets_its_own_entry(fresh_cache):
    cos, sin = _tables()
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    for tables in ((cos, sin), (cos[:32], sin[:32]), (cos, sin)):   # same first address, other shapes
        _assert_equal(*_step_and_general(q, k, *tables, 9, "half"))
    assert len(fresh_cache) == 2 and fresh_cache[0][0] is cos       # the full tables' entry was kept, then reused
