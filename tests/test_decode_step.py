"""Step 0 of a rotary call (``posenc._torch.plans``): a call with the signature of one validated
before runs that call's plan; the same values as the whole pipeline, within the exactness bound of a
float64 oracle, and taken only where it applies: everything else still validates, computes or
refuses as before."""

from __future__ import annotations

import copy

import pytest
import torch

import posenc
from posenc._torch import plans
from posenc.functional import apply_rope_qk
from tests.reference import rope_oracle

D = 16
TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float16: 2e-3}


@pytest.fixture(autouse=True)
def fresh_plans():
    plans.clear()
    yield plans._plans
    plans.clear()


def _qk(shape_q, shape_k, dtype):
    return torch.randn(shape_q, dtype=torch.float64).to(dtype), torch.randn(shape_k, dtype=torch.float64).to(dtype)


def _equal(a, b):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim, length", [(-2, 1), (-2, 3), (2, 3), (1, 1), (1, 3)])
def test_a_planned_call_equals_the_pipeline_and_the_oracle(fresh_plans, dtype, layout, seq_dim, length):
    rope = posenc.RotaryEmbedding(D, max_seq_len=64, layout=layout)
    if seq_dim == 1:
        q, k = _qk((1, length, 4, D), (1, length, 2, D), dtype)
    else:
        q, k = _qk((1, 4, length, D), (1, 2, length, D), dtype)
    offset = 40
    positions = torch.arange(offset, offset + length)
    general = rope(q, k, positions=positions, seq_dim=seq_dim)                         # (a plan of its own)
    for call in (lambda off: rope(q, k, offset=off, seq_dim=seq_dim),
                 lambda off: apply_rope_qk(q, k, rope.cos_table, rope.sin_table, offset=off, layout=layout,
                                           seq_dim=seq_dim)):
        before = len(fresh_plans)
        first = call(offset)                                                           # the pipeline: a new plan
        assert len(fresh_plans) == before + 1
        planned = call(offset)                                                         # the plan
        assert len(fresh_plans) == before + 1
        for got in (first, planned):
            _equal(got, general)
        for got, x in zip(planned, (q, k), strict=True):
            assert got.dtype == x.dtype and got.shape == x.shape
            xs = x.transpose(1, 2) if seq_dim == 1 else x                                # oracle: (B, H, S, D)
            ref = rope_oracle.rotate(xs, positions, rope_oracle.default(D, 10000.0), layout)
            ref = ref.transpose(1, 2) if seq_dim == 1 else ref
            torch.testing.assert_close(got.double(), ref, rtol=0, atol=TOL[dtype])


def test_a_plan_serves_every_offset_inside_the_table_and_none_past_it(fresh_plans):
    rope = posenc.RotaryEmbedding(D, max_seq_len=8)
    wide = posenc.RotaryEmbedding(D, max_seq_len=64)
    q, k = torch.randn(1, 4, 2, D), torch.randn(1, 2, 2, D)
    for offset in (0, 3, 6, 7, 20, 6):                  # 7 and 20 go past the table of 8: computed exactly
        _equal(rope(q, k, offset=offset), wide(q, k, offset=offset))
    cos, sin = rope.cos_table, rope.sin_table
    apply_rope_qk(q, k, cos, sin, offset=6)
    with pytest.raises(ValueError, match="outside the cos/sin table"):
        apply_rope_qk(q, k, cos, sin, offset=7)
    with pytest.raises(ValueError, match="outside the cos/sin table"):
        apply_rope_qk(q, k, cos, sin, offset=-1)


def test_positions_are_checked_by_every_call_unless_promised(fresh_plans):
    rope = posenc.RotaryEmbedding(D, max_seq_len=8)
    wide = posenc.RotaryEmbedding(D, max_seq_len=64)
    q, k = torch.randn(1, 4, 2, D), torch.randn(1, 2, 2, D)
    cos, sin = rope.cos_table, rope.sin_table
    for positions in (torch.tensor([1, 2]), torch.tensor([7, 9]), torch.tensor([3, 4])):
        _equal(rope(q, k, positions=positions), wide(q, k, positions=positions))   # 9: past the table, computed
    apply_rope_qk(q, k, cos, sin, positions=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"must lie in \[0, 8\)"):
        apply_rope_qk(q, k, cos, sin, positions=torch.tensor([7, 8]))
    apply_rope_qk(q, k, cos, sin, positions=torch.tensor([1, 2]), assume_valid=True)
    with pytest.raises(ValueError, match="assume_valid"):                # a broken promise: the lookup's own check
        apply_rope_qk(q, k, cos, sin, positions=torch.tensor([7, 8]), assume_valid=True)


@pytest.mark.parametrize("kw, name", [({"seq_len": "long"}, "seq_len"), ({"assume_valid": "yes"}, "assume_valid"),
                                      ({"seq_dim": 3}, "seq_dim"), ({"offset": 2.0}, "offset"),
                                      ({"seq_dim": 2.0}, "seq_dim"), ({"inplace": 1}, "inplace"),
                                      ({"positions": torch.tensor([1]), "offset": 2}, "positions")])
def test_a_bad_argument_is_refused_after_a_good_call_made_a_plan(kw, name):
    rope = posenc.RotaryEmbedding(D, max_seq_len=64)
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    good = {"offset": 5, "seq_dim": 2, "inplace": False, "assume_valid": False}
    rope(q, k, **good)
    apply_rope_qk(q, k, rope.cos_table, rope.sin_table, **good)
    kw = {"offset": 5, **kw} if "positions" not in kw else kw
    with pytest.raises((TypeError, ValueError), match=name):
        rope(q, k, **kw)
    if name != "seq_len":                                  # (apply_rope_qk has no seq_len)
        with pytest.raises((TypeError, ValueError), match=name):
            apply_rope_qk(q, k, rope.cos_table, rope.sin_table, **kw)


def test_a_table_written_in_place_is_read_as_it_is_now():
    cos, sin = posenc.functional.rope_cos_sin(torch.arange(64), posenc.functional.rope_inv_freq(D)[0])
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    before = apply_rope_qk(q, k, cos, sin, offset=9)
    with torch.no_grad():
        cos.mul_(0.5)                                      # the same tensors, new values
        sin[9].fill_(0.25)
    after = apply_rope_qk(q, k, cos, sin, offset=9)
    _equal(after, apply_rope_qk(q, k, cos, sin, positions=torch.tensor([9])))
    assert not torch.equal(before[0], after[0])


def test_the_gradient_reaches_a_table_that_requires_grad():
    cos, sin = posenc.functional.rope_cos_sin(torch.arange(64), posenc.functional.rope_inv_freq(D)[0])
    cos.requires_grad_(True)
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    for _ in range(2):                                     # the pipeline, then the plan
        cos.grad = None
        step = apply_rope_qk(q, k, cos, sin, offset=63)
        step[0].sum().backward()
        assert cos.grad is not None and cos.grad[63].abs().sum() > 0 and cos.grad[:63].abs().sum() == 0


def test_a_module_copy_and_a_moved_module_rotate_with_their_own_tables():
    rope = posenc.RotaryEmbedding(D, max_seq_len=64)
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    before = rope(q, k, offset=7)
    twin = copy.deepcopy(rope)
    with torch.no_grad():
        rope.packed_table.mul_(2.0)                        # change the original's table only
    _equal(twin(q, k, offset=7), before)
    _equal(rope(q, k, offset=7), rope(q, k, positions=torch.tensor([7])))
    rope.to("meta")
    with pytest.raises(ValueError, match="meta"):          # the plan's key holds the table's device
        rope(q, k, offset=7)
    rope.to_empty(device="cpu")
    rope.reset_buffers()
    _equal(rope(q, k, offset=7), before)


def test_forward_writes_nothing_on_the_module():
    rope = posenc.RotaryEmbedding(D, max_seq_len=64)
    state = {name: value for name, value in vars(rope).items() if not name.startswith("_buffers")}
    buffers = dict(rope._buffers)
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    for call in (lambda: rope(q, k, offset=3), lambda: rope(q, k, offset=3), lambda: rope(q, k, positions=torch.tensor([2])),
                 lambda: rope.rotate(k, offset=4, key=True), lambda: rope(q, k, offset=70)):
        call()
    assert {name: value for name, value in vars(rope).items() if not name.startswith("_buffers")}.keys() == state.keys()
    assert all(vars(rope)[name] is value for name, value in state.items())
    assert all(rope._buffers[name] is t for name, t in buffers.items())


def test_in_place_calls_whose_q_and_k_share_memory_take_the_pipeline():
    rope = posenc.RotaryEmbedding(D, max_seq_len=64)
    fused = torch.randn(1, 1, 6, D)                       # (B, S, H, D): 4 query heads, 2 key heads
    q, k = fused[:, :, :4], fused[:, :, 4:]
    ref = rope(q.clone(), k.clone(), offset=5, seq_dim=1)
    rope(torch.randn(1, 1, 4, D), torch.randn(1, 1, 2, D), offset=5, seq_dim=1, inplace=True)   # (other memory)
    out = rope(q, k, offset=5, seq_dim=1, inplace=True)
    assert out[0] is q and out[1] is k
    _equal((q, k), ref)
    with pytest.raises(ValueError, match="same tensor"):
        rope(q, q, offset=5, seq_dim=1, inplace=True)


def test_tensor_subclasses_and_parameters_take_the_pipeline(fresh_plans):
    rope = posenc.RotaryEmbedding(D, max_seq_len=64)
    q = torch.nn.Parameter(torch.randn(1, 4, 1, D))
    k = torch.randn(1, 2, 1, D)
    out = rope(q, k, offset=3)
    out[0].sum().backward()
    assert q.grad is not None and not fresh_plans


def test_the_plan_cache_is_bounded(monkeypatch, fresh_plans):
    monkeypatch.setattr(plans, "MAX_PLANS", 3)
    rope = posenc.RotaryEmbedding(D, max_seq_len=64)
    for heads in range(1, 8):
        rope(torch.randn(1, heads, 1, D), None, offset=1)
        assert len(fresh_plans) <= 3
