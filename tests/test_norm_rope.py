"""QK-RMSNorm + RoPE (the torch engine) against a float64 oracle written from the formula, against
torch.autograd of that oracle, and against the norms and rotation of real transformers modules
(Qwen3, Gemma-3, OLMo-2)."""

import pytest
import torch

from posenc.functional.norm_rope import rms_norm_rope_qk
from tests.reference.oracle import ulps

EPS32 = 2.0**-24


def tables(rows, dim, dtype=torch.float64, base=10000.0):
    """``(P, dim/2)`` cos/sin of ``p * base**(-2i/dim)``, straight from the formula in float64."""
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angle = torch.arange(rows, dtype=torch.float64)[:, None] * inv[None, :]
    return angle.cos().to(dtype), angle.sin().to(dtype)


def oracle(x, w, cos, sin, positions, *, eps, weight_offset, layout, seq_dim, token):
    """The float64 truth: ``rotate(x / sqrt(mean(x^2) + eps) * (weight_offset + w))``.

    ``x`` is ``(B, H, S, D)`` (``seq_dim=2``) or ``(B, S, H, D)`` (``seq_dim=1``); ``positions``
    ``(S,)`` or ``(B, S)``; ``token`` normalises all heads of a token together (``w`` of size H*D).
    Differentiable (for autograd's gradients)."""
    x = x.double()
    if seq_dim == 1:
        x = x.transpose(1, 2)                                       # (B, S, H, D) -> (B, H, S, D)
    B, H, S, D = x.shape
    if token:
        ms = (x * x).sum(dim=(1, 3), keepdim=True) / (H * D)        # one mean per token
        scale = weight_offset + w.double().reshape(H, D)[None, :, None, :]
    else:
        ms = (x * x).sum(dim=-1, keepdim=True) / D                   # one mean per head
        scale = weight_offset + w.double()
    u = x / torch.sqrt(ms + eps) * scale
    h = cos.shape[-1]
    if layout == "half":
        i1, i2 = torch.arange(h), torch.arange(h) + h
    else:
        i1, i2 = torch.arange(0, 2 * h, 2), torch.arange(1, 2 * h, 2)
    pos = positions.reshape(-1, S).expand(B, S)
    c, s = cos.double()[pos][:, None], sin.double()[pos][:, None]   # (B, 1, S, h)
    a, b = u[..., i1], u[..., i2]
    y = u.clone()
    y[..., i1] = a * c - b * s
    y[..., i2] = b * c + a * s
    return y.transpose(1, 2) if seq_dim == 1 else y


def make(dtype=torch.float64, *, seq_dim=2, extent=("head", "head"), B=2, S=5, Hq=4, Hk=2, D=12, requires_grad=False):
    """Random q, k and their weights; ``extent`` says per q/k whether the weight is (D,) or (H*D,)."""
    def shape(h):
        return (B, h, S, D) if seq_dim == 2 else (B, S, h, D)

    q = torch.randn(shape(Hq), dtype=torch.float64).to(dtype).requires_grad_(requires_grad)
    k = torch.randn(shape(Hk), dtype=torch.float64).to(dtype).requires_grad_(requires_grad)
    wq = torch.randn(Hq * D if extent[0] == "token" else D, dtype=torch.float64).to(dtype)
    wk = torch.randn(Hk * D if extent[1] == "token" else D, dtype=torch.float64).to(dtype)
    return q, k, wq.requires_grad_(requires_grad), wk.requires_grad_(requires_grad)


EXTENTS = [("head", "head"), ("token", "token"), ("token", "head")]


@pytest.mark.float64
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim", [2, 1])
@pytest.mark.parametrize("extent", EXTENTS, ids="-".join)
@pytest.mark.parametrize("rot", [12, 8], ids=["full", "partial"])
@pytest.mark.parametrize("weight_offset", [0.0, 1.0])
def test_float64_matches_the_oracle(layout, seq_dim, extent, rot, weight_offset):
    q, k, wq, wk = make(seq_dim=seq_dim, extent=extent)              # GQA: 4 query heads, 2 key heads
    cos, sin = tables(16, rot)
    positions = torch.randint(0, 16, (2, 5))
    qo, ko = rms_norm_rope_qk(q, k, wq, wk, cos, sin, positions=positions, layout=layout, seq_dim=seq_dim,
                              weight_offset=weight_offset, eps=1e-6)
    for got, x, w, token in ((qo, q, wq, extent[0] == "token"), (ko, k, wk, extent[1] == "token")):
        want = oracle(x, w, cos, sin, positions, eps=1e-6, weight_offset=weight_offset, layout=layout,
                      seq_dim=seq_dim, token=token)
        assert got.dtype == torch.float64 and got.shape == x.shape
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("extent", EXTENTS[:2], ids="-".join)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_low_precision_rounds_once(dtype, extent, layout):
    """Within half an ulp of the truth plus the float32 work's own noise (the inputs and weights are
    taken as the exact values they hold)."""
    q, k, wq, wk = make(dtype, seq_dim=1, extent=extent)
    cos, sin = tables(16, 8, torch.float32)
    positions = torch.randint(0, 16, (5,))
    qo, ko = rms_norm_rope_qk(q, k, wq, wk, cos, sin, positions=positions, layout=layout, seq_dim=1)
    for got, x, w, token in ((qo, q, wq, extent[0] == "token"), (ko, k, wk, extent[1] == "token")):
        want = oracle(x, w, cos, sin, positions, eps=1e-6, weight_offset=0.0, layout=layout, seq_dim=1, token=token)
        assert got.dtype == dtype
        tol = 0.5 * ulps(dtype, want) + 16 * EPS32 * want.abs().amax()
        assert bool(((got.double() - want).abs() <= tol).all())


@pytest.mark.float64
def test_weights_of_another_dtype_are_read_in_the_working_precision():
    q, k, wq, wk = make(torch.bfloat16)
    cos, sin = tables(8, 12, torch.float32)
    a = rms_norm_rope_qk(q, k, wq, wk, cos, sin)
    b = rms_norm_rope_qk(q, k, wq.double(), wk.float(), cos, sin)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == torch.bfloat16 and torch.equal(x, y)


@pytest.mark.float64
def test_positions_none_offset_and_tensor_forms_agree():
    q, k, wq, wk = make(seq_dim=1)
    cos, sin = tables(32, 12)
    full = rms_norm_rope_qk(q, k, wq, wk, cos, sin, seq_dim=1)
    same = rms_norm_rope_qk(q, k, wq, wk, cos, sin, positions=torch.arange(5), seq_dim=1)
    batched = rms_norm_rope_qk(q, k, wq, wk, cos, sin, positions=torch.arange(5)[None], seq_dim=1)
    shifted = rms_norm_rope_qk(q, k, wq, wk, cos, sin, offset=7, seq_dim=1)
    by_tensor = rms_norm_rope_qk(q, k, wq, wk, cos, sin, positions=torch.arange(7, 12).expand(2, 5), seq_dim=1)
    for a, b, c in zip(full, same, batched, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    for a, b in zip(shifted, by_tensor, strict=True):
        assert torch.equal(a, b)
    # token by token with offset equals the full call
    steps = [rms_norm_rope_qk(q[:, t : t + 1], k[:, t : t + 1], wq, wk, cos, sin, offset=t, seq_dim=1)
             for t in range(5)]
    torch.testing.assert_close(torch.cat([s[0] for s in steps], 1), full[0], rtol=0, atol=1e-15)
    torch.testing.assert_close(torch.cat([s[1] for s in steps], 1), full[1], rtol=0, atol=1e-15)


def test_without_k_and_on_the_auto_backend():
    q, k, wq, wk = make(torch.float32)
    cos, sin = tables(8, 12, torch.float32)
    qo, ko = rms_norm_rope_qk(q, None, wq, None, cos, sin)
    assert ko is None
    ref = rms_norm_rope_qk(q, k, wq, wk, cos, sin, engine="torch")
    assert torch.equal(qo, ref[0])                                      # "auto" keeps CPU tensors on torch


@pytest.mark.float64
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("extent", EXTENTS, ids="-".join)
@pytest.mark.parametrize("seq_dim", [2, 1])
def test_gradients_match_autograd_of_the_oracle(layout, extent, seq_dim):
    q, k, wq, wk = make(seq_dim=seq_dim, extent=extent, requires_grad=True)
    cos, sin = tables(16, 8)                                            # partial rotary: 8 of 12 features
    positions = torch.randint(0, 16, (2, 5))
    kw = dict(eps=1e-5, weight_offset=1.0, layout=layout, seq_dim=seq_dim)
    qo, ko = rms_norm_rope_qk(q, k, wq, wk, cos, sin, positions=positions, **kw)
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    got = torch.autograd.grad([qo, ko], [q, k, wq, wk], [gq, gk])
    qr = oracle(q, wq, cos, sin, positions, token=extent[0] == "token", **kw)
    kr = oracle(k, wk, cos, sin, positions, token=extent[1] == "token", **kw)
    want = torch.autograd.grad([qr, kr], [q, k, wq, wk], [gq, gk])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.float64
@pytest.mark.parametrize("extent", EXTENTS[:2], ids="-".join)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_gradcheck(extent, layout):
    q, k, wq, wk = make(extent=extent, B=1, S=3, Hq=2, Hk=1, D=6, requires_grad=True)
    cos, sin = tables(8, 4)

    def f(q, k, wq, wk):
        return rms_norm_rope_qk(q, k, wq, wk, cos, sin, offset=2, layout=layout, weight_offset=0.5, eps=1e-3)

    assert torch.autograd.gradcheck(f, (q, k, wq, wk))


def test_float32_gradients_are_float32_accurate():
    q, k, wq, wk = make(torch.float32, extent=("token", "head"), requires_grad=True)
    cos, sin = tables(8, 12, torch.float32)
    qo, ko = rms_norm_rope_qk(q, k, wq, wk, cos, sin)
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    got = torch.autograd.grad([qo, ko], [q, k, wq, wk], [gq, gk])
    leaves = [t.detach().double().requires_grad_() for t in (q, k, wq, wk)]
    pos = torch.arange(5)
    kw = dict(eps=1e-6, weight_offset=0.0, layout="half", seq_dim=2)
    qr = oracle(leaves[0], leaves[2], cos, sin, pos, token=True, **kw)
    kr = oracle(leaves[1], leaves[3], cos, sin, pos, token=False, **kw)
    want = torch.autograd.grad([qr, kr], leaves, [gq.double(), gk.double()])
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=0, atol=64 * EPS32 * float(b.abs().amax()))


def test_torch_compile_fullgraph():
    q, k, wq, wk = make(torch.float32, extent=("token", "head"))
    cos, sin = tables(8, 12, torch.float32)
    f = torch.compile(lambda q, k: rms_norm_rope_qk(q, k, wq, wk, cos, sin, offset=1, engine="torch"),
                      fullgraph=True, backend="eager")
    for a, b in zip(f(q, k), rms_norm_rope_qk(q, k, wq, wk, cos, sin, offset=1, engine="torch"), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _call(**change):
    q, k, wq, wk = make(torch.float32)
    cos, sin = tables(8, 12, torch.float32)
    args = dict(q=q, k=k, q_weight=wq, k_weight=wk, cos=cos, sin=sin)
    args.update(change)
    return rms_norm_rope_qk(args.pop("q"), args.pop("k"), args.pop("q_weight"), args.pop("k_weight"),
                            args.pop("cos"), args.pop("sin"), **args)


@pytest.mark.parametrize("change, error, match", [
    (dict(q_weight=torch.ones(7)), ValueError, r"q_weight must have shape \(12,\) .* or \(48,\) = \(H\*D,\)"),
    (dict(k_weight=torch.ones(2, 12)), ValueError, r"k_weight must have shape \(12,\) .* or \(24,\)"),
    (dict(q_weight=torch.ones(12, dtype=torch.int64)), TypeError, "q_weight must be a floating tensor"),
    (dict(q_weight=[1.0] * 12), TypeError, "q_weight must be a torch.Tensor"),
    (dict(k_weight=torch.ones(12, device="meta")), ValueError, "k_weight is on meta but q on cpu"),
    (dict(k=None), ValueError, "k_weight is given but k is None"),
    (dict(k_weight=None), ValueError, "k is given but k_weight is None"),
    (dict(eps=0.0), ValueError, "eps must be > 0"),
    (dict(eps="1e-6"), TypeError, "eps must be a real number"),
    (dict(weight_offset=float("nan")), ValueError, "weight_offset must be finite"),
    (dict(q=torch.randn(2, 5, 12), k=None, k_weight=None), ValueError, "q must be 4-D"),
    (dict(seq_dim=0), ValueError, "q must be 4-D"),
    (dict(seq_dim=3), ValueError, "seq_dim=3 is not a sequence axis"),
    (dict(layout="neox"), ValueError, "layout must be one of"),
    (dict(engine="cuda"), ValueError, "engine must be one of"),
    (dict(offset=4), ValueError, "outside the cos/sin table"),
    (dict(positions=torch.tensor([0, 1, 2, 3, 8])), ValueError, r"must lie in \[0, 8\)"),
    (dict(positions=torch.arange(4)), ValueError, "positions must have shape"),
    (dict(positions=torch.arange(5.0)), TypeError, "positions must hold integers"),
    (dict(cos=torch.ones(8, 7), sin=torch.ones(8, 7)), ValueError, "head dim 12 < rotary dim 14"),
    (dict(assume_in_table=1), TypeError, "assume_in_table must be a bool"),
    (dict(assume_valid=1), TypeError, "assume_valid must be a bool"),
])
def test_bad_inputs_raise_with_the_fix(change, error, match):
    with pytest.raises(error, match=match):
        _call(**change)


def test_backend_triton_raises_when_the_kernel_cannot_take_the_case():
    # float64 is not a kernel dtype; without Triton or its interpreter the message says what is missing
    with pytest.raises(ValueError, match="engine='triton'"):
        rms_norm_rope_qk(*make(), *tables(8, 12), engine="triton")


# --- real transformers modules ----------------------------------------------------------------------


def _hf_rows(cos, sin, positions, dtype):
    """Hugging Face's (B, S, D) cos/sin (``cat([c, c])`` rows) from posenc's (P, D/2) tables."""
    return torch.cat([cos, cos], -1)[positions].to(dtype), torch.cat([sin, sin], -1)[positions].to(dtype)


def _qwen3_like(module_cls, config, dtype):
    attn = module_cls(config, layer_idx=0).to(dtype)
    with torch.no_grad():
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.normal_()
    return attn


def _projections(attn, B, S, hidden, dtype):
    x = torch.randn(B, S, hidden, dtype=dtype)
    with torch.no_grad():
        return attn.q_proj(x), attn.k_proj(x)                           # (B, S, H*D), (B, S, H_k*D)


def _qwen3(dtype):
    modeling = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    config = pytest.importorskip("transformers").Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6)
    return modeling, _qwen3_like(modeling.Qwen3Attention, config, dtype)


def _hf_reference(modeling, attn, q, k, cos_hf, sin_hf, *, whole_projection=False):
    """Hugging Face's attention: norm q and k (per head, or the whole projection), then rotate."""
    B, S = q.shape[:2]
    with torch.no_grad():
        if whole_projection:                                            # OLMo-2: norm, then split heads
            qh = attn.q_norm(q).view(B, S, -1, attn.head_dim).transpose(1, 2)
            kh = attn.k_norm(k).view(B, S, -1, attn.head_dim).transpose(1, 2)
        else:                                                           # Qwen3, Gemma-3: split heads, then norm
            qh = attn.q_norm(q.view(B, S, -1, attn.head_dim)).transpose(1, 2)
            kh = attn.k_norm(k.view(B, S, -1, attn.head_dim)).transpose(1, 2)
        return modeling.apply_rotary_pos_emb(qh, kh, cos_hf, sin_hf)   # (B, H, S, D) each


def test_qwen3_attention_norms_and_rotation_float32():
    modeling, attn = _qwen3(torch.float32)
    B, S = 2, 7
    q, k = _projections(attn, B, S, 32, torch.float32)
    cos, sin = tables(16, 8, torch.float32)
    positions = torch.randint(0, 16, (B, S))
    q_ref, k_ref = _hf_reference(modeling, attn, q, k, *_hf_rows(cos, sin, positions, torch.float32))
    qo, ko = rms_norm_rope_qk(q.view(B, S, 4, 8), k.view(B, S, 2, 8), attn.q_norm.weight, attn.k_norm.weight, cos,
                              sin, positions=positions, eps=attn.q_norm.variance_epsilon, seq_dim=1)
    for got, ref in ((qo, q_ref), (ko, k_ref)):
        torch.testing.assert_close(got.transpose(1, 2), ref, rtol=0, atol=4 * EPS32 * float(ref.abs().amax()))


def test_qwen3_in_bfloat16_rounds_more_often_than_posenc():
    """Hugging Face rounds to bfloat16 after the norm, after the weight and inside the rotation;
    posenc rounds once: within half an ulp of the truth, closer to it on average, and within a
    couple of ulps (of the rotated pair's size) of Hugging Face."""
    modeling, attn = _qwen3(torch.bfloat16)
    B, S = 2, 64
    q, k = _projections(attn, B, S, 32, torch.bfloat16)
    cos, sin = tables(64, 8, torch.float32)
    positions = torch.arange(S).expand(B, S)
    q_ref, _ = _hf_reference(modeling, attn, q, k, *_hf_rows(cos, sin, positions, torch.bfloat16))
    qo, _ = rms_norm_rope_qk(q.view(B, S, 4, 8), k.view(B, S, 2, 8), attn.q_norm.weight, attn.k_norm.weight, cos,
                             sin, positions=positions, seq_dim=1)
    qo, hf = qo.detach().double(), q_ref.transpose(1, 2).double()
    kw = dict(eps=1e-6, weight_offset=0.0, layout="half", seq_dim=1, token=False)
    w = attn.q_norm.weight.detach()
    truth = oracle(q.view(B, S, 4, 8), w, cos, sin, positions, **kw)
    u = oracle(q.view(B, S, 4, 8), w, torch.ones_like(cos), torch.zeros_like(sin), positions, **kw).abs()
    pair = torch.maximum(u[..., :4], u[..., 4:]).repeat(1, 1, 1, 2)    # the larger member of each pair
    assert bool(((qo - truth).abs() <= 0.5 * ulps(torch.bfloat16, truth) + 16 * EPS32 * truth.abs().amax()).all())
    assert float((qo - truth).abs().mean()) < float((hf - truth).abs().mean())
    assert bool(((qo - hf).abs() <= 3 * ulps(torch.bfloat16, pair)).all())


def test_gemma3_norm_scales_by_one_plus_weight():
    modeling = pytest.importorskip("transformers.models.gemma3.modeling_gemma3")
    config = pytest.importorskip("transformers").Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6)
    attn = _qwen3_like(modeling.Gemma3Attention, config, torch.float32)
    B, S = 2, 6
    q, k = _projections(attn, B, S, 32, torch.float32)
    cos, sin = tables(16, 8, torch.float32)
    positions = torch.randint(0, 16, (S,))
    q_ref, k_ref = _hf_reference(modeling, attn, q, k, *_hf_rows(cos, sin, positions[None], torch.float32))
    qo, ko = rms_norm_rope_qk(q.view(B, S, 4, 8), k.view(B, S, 2, 8), attn.q_norm.weight, attn.k_norm.weight, cos,
                              sin, positions=positions, eps=attn.q_norm.eps, weight_offset=1.0, seq_dim=1)
    for got, ref in ((qo, q_ref), (ko, k_ref)):
        torch.testing.assert_close(got.transpose(1, 2), ref, rtol=0, atol=4 * EPS32 * float(ref.abs().amax()))


def test_olmo2_norms_the_whole_projection():
    modeling = pytest.importorskip("transformers.models.olmo2.modeling_olmo2")
    config = pytest.importorskip("transformers").Olmo2Config(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    attn = _qwen3_like(modeling.Olmo2Attention, config, torch.float32)
    assert attn.q_norm.weight.shape == (32,) and attn.k_norm.weight.shape == (16,)    # (H*D,)
    B, S = 2, 6
    q, k = _projections(attn, B, S, 32, torch.float32)
    cos, sin = tables(16, 8, torch.float32)
    q_ref, k_ref = _hf_reference(modeling, attn, q, k, *_hf_rows(cos, sin, torch.arange(3, 3 + S)[None],
                                                                 torch.float32), whole_projection=True)
    qo, ko = rms_norm_rope_qk(q.view(B, S, 4, 8), k.view(B, S, 2, 8), attn.q_norm.weight, attn.k_norm.weight, cos,
                              sin, offset=3, eps=attn.q_norm.variance_epsilon, seq_dim=1)
    for got, ref in ((qo, q_ref), (ko, k_ref)):
        torch.testing.assert_close(got.transpose(1, 2), ref, rtol=0, atol=4 * EPS32 * float(ref.abs().amax()))
