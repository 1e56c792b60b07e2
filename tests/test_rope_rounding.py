"""``apply_rope_qk(..., rounding="model")``: the rotation rounded as a model's own eager code rounds it.

The reference is the formula as Hugging Face models write it, ``q * cos + rotate_half(q) * sin`` (and
GPT-J's ``rotate_every_two`` for interleaved pairs) with cos/sin cast to q's dtype, computed here with plain
torch operations in q's dtype; where transformers is installed, its own ``apply_rotary_pos_emb`` too.  The
default ``rounding="exact"`` rounds once from float32 and is the closer of the two to a float64 oracle."""

import pytest
import torch

from posenc.functional import apply_rope_qk, rope_cos_sin, rope_inv_freq

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
COS, SIN = rope_cos_sin(torch.arange(4096), rope_inv_freq(16)[0])          # (P, 8) float32 tables


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def _rotate_every_two(x):
    return torch.stack([-x[..., 1::2], x[..., ::2]], -1).flatten(-2)


def _model(x, positions, layout, *, seq_dim=-2, sign=1.0):
    """The model's formula in x's dtype (rows for ``positions`` broadcast along ``seq_dim``)."""
    c, s = COS[positions], sign * SIN[positions]
    if layout == "half":
        c, s, turn = torch.cat([c, c], -1), torch.cat([s, s], -1), _rotate_half
    else:
        c, s, turn = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1), _rotate_every_two
    c, s = c.to(x.dtype), s.to(x.dtype)
    if seq_dim == 1:                                                        # (B, S, H, D): rows (S, 1, D)
        c, s = c.unsqueeze(-2), s.unsqueeze(-2)
    elif c.dim() == 3:                                                      # (B, S, D) rows against (B, H, S, D)
        c, s = c.unsqueeze(1), s.unsqueeze(1)
    return x * c + turn(x) * s


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_model_rounding_equals_the_models_formula_bit_for_bit(dtype, layout):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 10, 16, generator=gen).to(dtype)
    k = torch.randn(2, 2, 10, 16, generator=gen).to(dtype)
    positions = torch.tensor([[3000 + i for i in range(10)], [7 * i for i in range(10)]])
    qr, kr = apply_rope_qk(q, k, COS, SIN, positions=positions, layout=layout, rounding="model")
    assert torch.equal(qr, _model(q, positions, layout)) and torch.equal(kr, _model(k, positions, layout))
    if dtype is not torch.float32:                          # (float32: the two roundings may coincide)
        exact, _ = apply_rope_qk(q, k, COS, SIN, positions=positions, layout=layout)
        assert not torch.equal(exact, qr)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_model_rounding_with_offset_seq_dim_and_a_repeated_call(dtype):
    """A decode-like call at an offset, q and k ``(B, S, H, D)``, and the same call again (its kept plan)."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 3, 4, 16, generator=gen).to(dtype)
    k = torch.randn(1, 3, 2, 16, generator=gen).to(dtype)
    positions = torch.arange(500, 503)
    for _ in range(2):
        qr, kr = apply_rope_qk(q, k, COS, SIN, offset=500, seq_dim=1, rounding="model")
        assert torch.equal(qr, _model(q, positions, "half", seq_dim=1))
        assert torch.equal(kr, _model(k, positions, "half", seq_dim=1))


def test_model_rounding_inverse_slice_inplace_and_packed():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 6, 24, generator=gen).to(torch.bfloat16)
    positions = torch.arange(6)
    # the inverse: the formula with -sin
    back, _ = apply_rope_qk(q[..., :16], None, COS, SIN, inverse=True, rounding="model")
    assert torch.equal(back, _model(q[..., :16], positions, "half", sign=-1.0))
    # the trailing 16 of 24 features rotate, the leading 8 pass through
    last, _ = apply_rope_qk(q, None, COS, SIN, rotary_slice="last", rounding="model")
    assert torch.equal(last[..., :8], q[..., :8]) and torch.equal(last[..., 8:], _model(q[..., 8:], positions, "half"))
    # in place equals out of place
    out, _ = apply_rope_qk(q[..., :16], None, COS, SIN, rounding="model")
    inplace = q[..., :16].clone()
    apply_rope_qk(inplace, None, COS, SIN, inplace=True, rounding="model")
    assert torch.equal(inplace, out)
    # a packed batch of 4 and 2 tokens: each sequence as if alone
    t = torch.randn(6, 2, 16, generator=gen).to(torch.bfloat16)
    cu = torch.tensor([0, 4, 6], dtype=torch.int32)
    packed, _ = apply_rope_qk(t, None, COS, SIN, cu_seqlens=cu, rounding="model")
    alone, _ = apply_rope_qk(t[4:][None], None, COS, SIN, seq_dim=1, rounding="model")
    assert torch.equal(packed[4:], alone[0])
    assert torch.equal(alone[0], _model(t[4:][None], torch.arange(2), "half", seq_dim=1)[0])


def test_model_rounding_is_differentiable():
    q = torch.randn(1, 2, 5, 16, dtype=torch.float64, requires_grad=True)
    out, _ = apply_rope_qk(q, None, COS, SIN, rounding="model")
    (grad,) = torch.autograd.grad(out.square().sum(), q)
    q2 = q.detach().clone().requires_grad_(True)
    (want,) = torch.autograd.grad(_model(q2, torch.arange(5), "half").square().sum(), q2)
    assert torch.allclose(grad, want, rtol=0, atol=1e-12)


def test_model_rounding_equals_transformers_own_function():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 9, 16, generator=gen).to(torch.bfloat16)
    k = torch.randn(2, 2, 9, 16, generator=gen).to(torch.bfloat16)
    positions = torch.arange(100, 109).expand(2, -1)
    cos = torch.cat([COS[positions], COS[positions]], -1).to(torch.bfloat16)   # what a Llama rotary module returns
    sin = torch.cat([SIN[positions], SIN[positions]], -1).to(torch.bfloat16)
    want = apply_rotary_pos_emb(q, k, cos, sin)
    got = apply_rope_qk(q, k, COS, SIN, positions=positions, rounding="model")
    assert transformers.__version__ and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_rounding_is_checked_with_clear_errors():
    q = torch.randn(1, 1, 2, 16)
    with pytest.raises(ValueError, match="rounding"):
        apply_rope_qk(q, None, COS, SIN, rounding="fast")
    with pytest.raises(ValueError, match="rounding='model' runs on the torch engine"):
        apply_rope_qk(q, None, COS, SIN, rounding="model", engine="triton")


def test_model_rounding_refuses_a_fullgraph_compile_and_runs_eagerly_otherwise():
    q = torch.randn(1, 2, 5, 16).to(torch.bfloat16)
    eager, _ = apply_rope_qk(q, None, COS, SIN, rounding="model")
    broken = torch.compile(lambda x: apply_rope_qk(x, None, COS, SIN, rounding="model")[0], backend="eager")
    assert torch.equal(broken(q), eager)                   # the call runs outside the graph: eager rounding
    strict = torch.compile(lambda x: apply_rope_qk(x, None, COS, SIN, rounding="model")[0], backend="eager",
                           fullgraph=True)
    with pytest.raises(Exception, match="rounding='model' reproduces eager per-operation rounding"):
        strict(q)
