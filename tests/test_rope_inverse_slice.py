"""The inverse rotation (``inverse=True``: by ``-theta``) and the trailing rotary slice
(``rotary_slice="last"``) of ``apply_rope_qk`` and ``RotaryEmbedding``, against a float64 oracle
written from RoFormer's pair rotation (tests/reference/rope_oracle.py), on the torch engine, eager
and compiled.  The Triton kernel's cases are in tests/test_triton_rope_inverse.py."""

import numpy as np
import pytest
import torch

import posenc
from posenc.functional import apply_rope_qk, rope_cos_sin, rope_inv_freq
from posenc.nn import RotaryEmbedding
from tests.reference import rope_oracle as O

ROT, D, P = 8, 14, 64


def oracle(x, positions, layout, inverse, last, rot=ROT, base=10000.0):
    """x (..., S, D) rotated in float64: its leading or trailing ``rot`` features, by theta or -theta."""
    first, second = O.pair_indices(rot, layout)
    shift = x.shape[-1] - rot if last else 0
    first, second = [i + shift for i in first], [i + shift for i in second]
    angle = np.asarray(positions, dtype=np.float64)[:, None] * O.default(rot, base)
    return torch.from_numpy(O.rotate_pairs(x, -angle if inverse else angle, first, second))


def tables(rows=P, rot=ROT, dtype=torch.float32):
    return rope_cos_sin(torch.arange(rows), rope_inv_freq(rot)[0], dtype=dtype)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_apply_rope_qk_matches_the_float64_oracle(layout, inverse, last, inplace):
    torch.manual_seed(0)
    cos, sin = tables(dtype=torch.float64)
    q, k = torch.randn(2, 3, 5, D, dtype=torch.float64), torch.randn(2, 1, 5, D, dtype=torch.float64)
    q0, k0 = q.clone(), k.clone()
    qo, ko = apply_rope_qk(q, k, cos, sin, offset=7, layout=layout, inverse=inverse,
                           rotary_slice="last" if last else "first", inplace=inplace, engine="torch")
    torch.testing.assert_close(qo, oracle(q0, range(7, 12), layout, inverse, last), rtol=0, atol=1e-12)
    torch.testing.assert_close(ko, oracle(k0, range(7, 12), layout, inverse, last), rtol=0, atol=1e-12)
    if inplace:
        assert qo is q and ko is k
    else:
        assert torch.equal(q, q0) and torch.equal(k, k0)
    passed = slice(0, D - ROT) if last else slice(ROT, D)                       # the features that pass through
    assert torch.equal(qo[..., passed], q0[..., passed])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim", [1, 2])
def test_inverse_is_the_exact_transpose(dtype, layout, seq_dim):
    """Rotating by -theta is rotating with negated sines, to the last bit, on every path of the engine
    (a small decode-like call, a large blocked call, positions)."""
    torch.manual_seed(1)
    cos, sin = tables(4096)
    for S, kw in ((1, dict(offset=9)), (300, dict(offset=100)), (6, dict(positions=torch.tensor([5, 0, 4000, 3, 3, 1])))):
        shape = (2, S, 4, ROT) if seq_dim == 1 else (2, 4, S, ROT)
        q, k = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
        got = apply_rope_qk(q, k, cos, sin, layout=layout, seq_dim=seq_dim, inverse=True, engine="torch", **kw)
        want = apply_rope_qk(q, k, cos, -sin, layout=layout, seq_dim=seq_dim, engine="torch", **kw)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (S, kw)


def test_inverse_undoes_and_gives_the_transposed_gradient():
    torch.manual_seed(2)
    cos, sin = tables(dtype=torch.float64)
    x = torch.randn(1, 2, 5, D, dtype=torch.float64, requires_grad=True)
    for last in ("first", "last"):
        for inverse in (False, True):
            y = apply_rope_qk(x, None, cos, sin, offset=3, inverse=inverse, rotary_slice=last)[0]
            back = apply_rope_qk(y, None, cos, sin, offset=3, inverse=not inverse,
                                 rotary_slice=last)[0]
            torch.testing.assert_close(back, x, rtol=0, atol=1e-14)
            g = torch.randn_like(x)
            (grad,) = torch.autograd.grad(y, x, g)
            # d(R x)/dx applied to g is R^T g: the opposite rotation of g
            want = apply_rope_qk(g, None, cos, sin, offset=3, inverse=not inverse,
                                 rotary_slice=last)[0]
            torch.testing.assert_close(grad, want, rtol=0, atol=1e-14)
    assert torch.autograd.gradcheck(
        lambda t: apply_rope_qk(t, None, cos, sin, offset=3, inverse=True, rotary_slice="last")[0],
        (x.detach().clone().requires_grad_(),))


def test_packed_batch_with_inverse_and_last():
    torch.manual_seed(3)
    cos, sin = tables(dtype=torch.float64)
    q = torch.randn(7, 2, D, dtype=torch.float64)
    cu = torch.tensor([0, 4, 7], dtype=torch.int32)
    qo, _ = apply_rope_qk(q, None, cos, sin, cu_seqlens=cu, inverse=True, rotary_slice="last")
    positions = [0, 1, 2, 3, 0, 1, 2]
    want = oracle(q.transpose(0, 1), positions, "half", True, True).transpose(0, 1)        # (H, T, D) -> (T, H, D)
    torch.testing.assert_close(qo, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_module_rotary_slice_and_inverse(layout):
    torch.manual_seed(4)
    rope = RotaryEmbedding(ROT, max_seq_len=P, layout=layout, rotary_slice="last")
    assert "rotary_slice='last'" in repr(rope)
    q, k = torch.randn(2, 3, 5, D), torch.randn(2, 1, 5, D)
    for inverse in (False, True):
        for kw, pos in ((dict(offset=7), range(7, 12)), (dict(positions=torch.tensor([3, 9, 0, 63, 2])), [3, 9, 0, 63, 2])):
            for _ in range(2):                                        # the second call runs the first one's plan
                qo, ko = rope(q, k, inverse=inverse, **kw)
                torch.testing.assert_close(qo.double(), oracle(q, pos, layout, inverse, True), rtol=0, atol=2e-6)
                torch.testing.assert_close(ko.double(), oracle(k, pos, layout, inverse, True), rtol=0, atol=2e-6)
            assert torch.equal(rope.rotate(q, inverse=inverse, **kw), qo)
            q2 = q.clone()
            assert rope(q2, None, inplace=True, inverse=inverse, **kw)[0] is q2 and torch.equal(q2, qo)
    # past the table: exact angles computed for the call, inverse included
    qo = rope(q, offset=200)[0]
    torch.testing.assert_close(qo.double(), oracle(q, range(200, 205), layout, False, True), rtol=0, atol=2e-5)
    torch.testing.assert_close(rope(qo, offset=200, inverse=True)[0], q, rtol=0, atol=2e-5)


def test_attention_rotates_the_trailing_features():
    """posenc.attention with a rotary_slice="last" module equals attention over q and k rotated by hand."""
    torch.manual_seed(5)
    rope = RotaryEmbedding(ROT, max_seq_len=P, rotary_slice="last")
    q, k, v = torch.randn(1, 2, 6, D), torch.randn(1, 2, 6, D), torch.randn(1, 2, 6, D)
    got = posenc.attention(q, k, v, encoding=rope, causal=True)
    qr = oracle(q, range(6), "half", False, True).float()
    kr = oracle(k, range(6), "half", False, True).float()
    want = torch.nn.functional.scaled_dot_product_attention(qr, kr, v, is_causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_first_and_last_agree_when_the_head_is_the_rotary_dim():
    torch.manual_seed(6)
    cos, sin = tables()
    q = torch.randn(1, 2, 4, ROT)
    a = apply_rope_qk(q, None, cos, sin, rotary_slice="first", inverse=True)[0]
    b = apply_rope_qk(q, None, cos, sin, rotary_slice="last", inverse=True)[0]
    assert torch.equal(a, b)


def test_compiled_matches_eager():
    torch.manual_seed(7)
    cos, sin = tables()
    rope = RotaryEmbedding(ROT, max_seq_len=P, layout="interleaved", rotary_slice="last")
    q, k = torch.randn(1, 2, 5, D), torch.randn(1, 1, 5, D)

    def step(q, k):
        a = apply_rope_qk(q, k, cos, sin, offset=4, inverse=True, rotary_slice="last", layout="interleaved")
        b = rope(q, k, offset=4, inverse=True)
        return a[0], a[1], b[0], b[1]

    eager = step(q, k)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k)
    for e, c in zip(eager, compiled, strict=True):
        torch.testing.assert_close(c, e, rtol=0, atol=1e-6)
    torch.testing.assert_close(eager[0], eager[2], rtol=0, atol=1e-6)


def test_bad_options_name_the_argument():
    cos, sin = tables()
    q = torch.randn(1, 2, 4, D)
    with pytest.raises(ValueError, match="rotary_slice"):
        apply_rope_qk(q, None, cos, sin, rotary_slice="middle")
    with pytest.raises(ValueError, match="rotary_slice"):
        RotaryEmbedding(ROT, rotary_slice="end")
    with pytest.raises((TypeError, ValueError), match="inverse"):
        apply_rope_qk(q, None, cos, sin, inverse="yes")
    with pytest.raises((TypeError, ValueError), match="inverse"):
        RotaryEmbedding(ROT)(q, inverse=1)
    with pytest.raises((TypeError, ValueError), match="inplace"):
        apply_rope_qk(q, None, cos, sin, rotary_slice="last", inplace="no")
    with pytest.raises(ValueError, match="head dim"):
        apply_rope_qk(q[..., :4], None, cos, sin, rotary_slice="last")
