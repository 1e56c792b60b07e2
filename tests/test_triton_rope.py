"""The fused Triton RoPE kernel, run on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1),
compared with the torch reference forward and backward."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before Triton decorates the kernel

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")

import posenc  # noqa: E402
from posenc._torch.engine_choice import resolve_rope_engine  # noqa: E402
from posenc.functional import rope as R  # noqa: E402
from tests.reference.oracle import ulps  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("TRITON_INTERPRET was set to something other than 1 before this module", allow_module_level=True)


def tables(rows, dim):
    inv, _ = R.rope_inv_freq(dim)
    return R.rope_cos_sin(torch.arange(rows), inv)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seq_dim", [2, 1])
def test_forward_matches_reference_on_strided_gqa_views(layout, dtype, seq_dim):
    torch.manual_seed(0)
    B, S, Hq, Hk, D, rot = 2, 37, 4, 2, 24, 16                    # odd length, GQA, partial rotary
    fused = torch.randn(B, S, Hq + 2 * Hk, D).to(dtype)           # a fused qkv projection output
    q, k = fused[:, :, :Hq], fused[:, :, Hq : Hq + Hk]             # strided views (B, S, H, D)
    if seq_dim == 2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)                # (B, H, S, D), still views
    cos, sin = tables(64, rot)
    positions = torch.randint(0, 64, (B, S))
    qt, kt = R.apply_rope_qk(q, k, cos, sin, positions=positions, layout=layout, seq_dim=seq_dim, engine="triton")
    qr, kr = R.apply_rope_qk(q, k, cos, sin, positions=positions, layout=layout, seq_dim=seq_dim, engine="torch")
    for got, ref in ((qt, qr), (kt, kr)):
        assert got.dtype == dtype and got.shape == ref.shape
        tol = ulps(dtype, ref.double()) if dtype != torch.float32 else torch.full_like(ref.double(), 2e-6)
        assert bool(((got.double() - ref.double()).abs() <= tol).all())
        assert torch.equal(got[..., rot:], ref[..., rot:])        # pass-through untouched


def test_offset_and_1d_positions():
    q, k = torch.randn(1, 3, 9, 16), torch.randn(1, 1, 9, 16)
    cos, sin = tables(32, 16)
    a = R.apply_rope_qk(q, k, cos, sin, offset=5, engine="triton")
    b = R.apply_rope_qk(q, k, cos, sin, positions=torch.arange(5, 14), engine="triton")
    c = R.apply_rope_qk(q, k, cos, sin, offset=5, engine="torch")
    for x, y, z in zip(a, b, c, strict=True):
        assert torch.equal(x, y)
        torch.testing.assert_close(x, z, rtol=0, atol=2e-6)


def test_inplace():
    q, k = torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    cos, sin = tables(16, 8)
    ref = R.apply_rope_qk(q, k, cos, sin, engine="torch")
    q2, k2 = q.clone(), k.clone()
    out = R.apply_rope_qk(q2, k2, cos, sin, inplace=True, engine="triton")
    assert out[0] is q2 and out[1] is k2
    torch.testing.assert_close(q2, ref[0], rtol=0, atol=2e-6)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_backward_rotates_by_minus_theta_and_matches_reference(layout):
    torch.manual_seed(1)
    q = torch.randn(2, 3, 11, 12, requires_grad=True)
    k = torch.randn(2, 1, 11, 12, requires_grad=True)
    cos, sin = tables(16, 8)
    gq, gk = torch.randn(2, 3, 11, 12), torch.randn(2, 1, 11, 12)
    qt, kt = R.apply_rope_qk(q, k, cos, sin, offset=2, layout=layout, engine="triton")
    torch.autograd.backward([qt, kt], [gq, gk])
    grads_t = q.grad.clone(), k.grad.clone()
    q.grad = k.grad = None
    qr, kr = R.apply_rope_qk(q, k, cos, sin, offset=2, layout=layout, engine="torch")
    torch.autograd.backward([qr, kr], [gq, gk])
    torch.testing.assert_close(grads_t[0], q.grad, rtol=0, atol=2e-6)
    torch.testing.assert_close(grads_t[1], k.grad, rtol=0, atol=2e-6)


def test_apply_rope_and_module_dispatch():
    x = torch.randn(2, 3, 10, 16)
    cos, sin = tables(10, 16)
    torch.testing.assert_close(R.apply_rope(x, cos, sin, engine="triton"), R.apply_rope(x, cos, sin, engine="torch"),
                               rtol=0, atol=2e-6)
    rope_t = posenc.RotaryEmbedding(16, max_seq_len=32, engine="triton")
    rope_r = posenc.RotaryEmbedding(16, max_seq_len=32, engine="torch")
    for a, b in zip(rope_t(x, x, offset=3), rope_r(x, x, offset=3), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-6)
    # "auto" keeps CPU tensors on the torch path even here
    assert resolve_rope_engine("auto", x, None) == "torch"


def test_positions_past_the_table_are_rejected_or_computed_never_wrong():
    x = torch.randn(1, 2, 4, 8)
    cos, sin = tables(8, 8)
    with pytest.raises(ValueError, match="outside the cos/sin table"):
        R.apply_rope_qk(x, None, cos, sin, offset=6, engine="triton")
    with pytest.raises(ValueError, match=r"must lie in \[0, 8\)"):
        R.apply_rope_qk(x, None, cos, sin, positions=torch.tensor([0, 1, 2, 8]), engine="triton")
    with pytest.raises(ValueError, match="go past the table"):
        posenc.RotaryEmbedding(8, max_seq_len=8, engine="triton")(x, offset=6)
    out, _ = posenc.RotaryEmbedding(8, max_seq_len=8, engine="auto")(x, offset=6)    # computed on the torch path
    ref, _ = posenc.RotaryEmbedding(8, max_seq_len=64, engine="torch")(x, offset=6)
    torch.testing.assert_close(out, ref, rtol=0, atol=2e-6)


def test_unsupported_cases_raise_for_explicit_triton():
    cos, sin = tables(8, 8)
    with pytest.raises(ValueError, match="does not support this case"):
        R.apply_rope(torch.randn(3, 8), cos[:3], sin[:3], engine="triton")
    with pytest.raises(ValueError, match="xPos"):
        posenc.RotaryEmbedding(8, xpos_scale_base=64.0, engine="triton")(torch.randn(1, 1, 3, 8))
    with pytest.raises(ValueError, match="engine must be one of"):
        R.apply_rope(torch.randn(1, 1, 3, 8), cos[:3], sin[:3], engine="cuda")


def test_torch_compile_fullgraph_traces_the_custom_op():
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    cos, sin = tables(8, 8)
    f = torch.compile(lambda q, k: R.apply_rope_qk(q, k, cos, sin, engine="triton"), fullgraph=True, backend="eager")
    a, b = f(q, k)
    ref = R.apply_rope_qk(q, k, cos, sin, engine="torch")
    torch.testing.assert_close(a, ref[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(b, ref[1], rtol=0, atol=2e-6)


def test_inplace_on_views_of_one_fused_buffer_rotates_each_once():
    torch.manual_seed(0)
    fused = torch.randn(1, 9, 3, 2, 16)                              # (B, S, q|k|v, H, D)
    cos, sin = tables(16, 16)
    want = R.apply_rope_qk(fused[:, :, 0].clone(), fused[:, :, 1].clone(), cos, sin, seq_dim=1, engine="torch")
    buf = fused.clone()
    R.apply_rope_qk(buf[:, :, 0], buf[:, :, 1], cos, sin, seq_dim=1, inplace=True, engine="triton")
    torch.testing.assert_close(buf[:, :, 0], want[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(buf[:, :, 1], want[1], rtol=0, atol=2e-6)
    rope = posenc.RotaryEmbedding(16, max_seq_len=16, engine="triton")
    buf = fused.clone()
    rope(buf[:, :, 0], buf[:, :, 1], seq_dim=1, inplace=True)
    torch.testing.assert_close(buf[:, :, 0], want[0], rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match="same tensor"):
        rope(buf[:, :, 0], buf[:, :, 0], seq_dim=1, inplace=True)


# ---- packed variable-length batches (cu_seqlens): the kernel finds each token's sequence itself ----

CU = torch.tensor([0, 3, 3, 7, 12, 13], dtype=torch.int32)           # lengths 3, 0, 4, 5, 1


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("offset", [0, 4, "per-sequence"])
def test_varlen_forward_matches_each_sequence_on_the_torch_engine(layout, dtype, offset):
    torch.manual_seed(2)
    fused = torch.randn(13, 4 + 2 * 2, 12).to(dtype)                # packed qkv (T, Hq + 2 Hk, D)
    q, k = fused[:, :4], fused[:, 4:6]                               # strided GQA views, rotary 8 < 12
    cos, sin = tables(32, 8)
    off = torch.tensor([1, 7, 0, 3, 20]) if offset == "per-sequence" else offset
    qt, kt = R.apply_rope_qk(q, k, cos, sin, cu_seqlens=CU, offset=off, layout=layout, engine="triton")
    qr, kr = R.apply_rope_qk(q, k, cos, sin, cu_seqlens=CU, offset=off, layout=layout, engine="torch")
    for got, ref in ((qt, qr), (kt, kr)):
        assert got.shape == ref.shape and got.dtype == dtype
        tol = ulps(dtype, ref.double()) if dtype != torch.float32 else torch.full_like(ref.double(), 2e-6)
        assert bool(((got.double() - ref.double()).abs() <= tol).all())
        assert torch.equal(got[..., 8:], ref[..., 8:])


def test_varlen_backward_and_inplace():
    torch.manual_seed(3)
    q = torch.randn(13, 2, 8, requires_grad=True)
    k = torch.randn(13, 1, 8, requires_grad=True)
    cos, sin = tables(32, 8)
    off = torch.tensor([1, 7, 0, 3, 20])
    g = torch.randn(13, 2, 8), torch.randn(13, 1, 8)
    torch.autograd.backward(R.apply_rope_qk(q, k, cos, sin, cu_seqlens=CU, offset=off, engine="triton"), g)
    grads = q.grad.clone(), k.grad.clone()
    q.grad = k.grad = None
    torch.autograd.backward(R.apply_rope_qk(q, k, cos, sin, cu_seqlens=CU, offset=off, engine="torch"), g)
    torch.testing.assert_close(grads[0], q.grad, rtol=0, atol=2e-6)
    torch.testing.assert_close(grads[1], k.grad, rtol=0, atol=2e-6)
    q2, k2 = q.detach().clone(), k.detach().clone()
    out = R.apply_rope_qk(q2, k2, cos, sin, cu_seqlens=CU, offset=off, inplace=True, engine="triton")
    assert out[0] is q2 and out[1] is k2
    ref = R.apply_rope_qk(q.detach(), k.detach(), cos, sin, cu_seqlens=CU, offset=off, engine="torch")
    torch.testing.assert_close(q2, ref[0], rtol=0, atol=2e-6)


def test_varlen_module_on_the_kernel_and_one_sequence():
    rope_t = posenc.RotaryEmbedding(8, max_seq_len=32, engine="triton")
    rope_r = posenc.RotaryEmbedding(8, max_seq_len=32, engine="torch")
    q = torch.randn(13, 3, 8)
    for cu in (CU, torch.tensor([0, 13])):
        torch.testing.assert_close(rope_t(q, cu_seqlens=cu)[0], rope_r(q, cu_seqlens=cu)[0], rtol=0, atol=2e-6)


def test_varlen_compiles_fullgraph():
    q, k = torch.randn(13, 2, 8), torch.randn(13, 1, 8)
    cos, sin = tables(32, 8)
    f = torch.compile(lambda q, k: R.apply_rope_qk(q, k, cos, sin, cu_seqlens=CU, engine="triton",
                                                   assume_valid=True), fullgraph=True, backend="eager")
    ref = R.apply_rope_qk(q, k, cos, sin, cu_seqlens=CU, engine="torch")
    for a, b in zip(f(q, k), ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-6)


def test_varlen_reads_strided_cu_seqlens_and_offsets():
    """Views with stride 2 (every other entry) and an expanded offset (stride 0) are read correctly."""
    q = torch.randn(13, 2, 8)
    cos, sin = tables(32, 8)
    cu_view = torch.stack([CU, torch.zeros_like(CU)], 1)[:, 0]               # stride 2
    offsets = torch.tensor([[1, 0], [7, 0], [0, 0], [3, 0], [20, 0]])[:, 0]  # stride 2
    for cu, off in ((cu_view, offsets), (CU, torch.tensor(4).expand(5))):
        got = R.apply_rope_qk(q, None, cos, sin, cu_seqlens=cu, offset=off, engine="triton")[0]
        ref = R.apply_rope_qk(q, None, cos, sin, cu_seqlens=cu.contiguous(), offset=off.contiguous(), engine="torch")[0]
        torch.testing.assert_close(got, ref, rtol=0, atol=2e-6)


@pytest.mark.parametrize("tokens", [1, 2, 4, 8])
def test_varlen_across_programs_of_several_tokens(tokens):
    """Sequences that straddle programs of several tokens (the launch's own choice is swept here)."""
    from posenc.kernels import triton_rope

    q, k = torch.randn(1, 13, 2, 8), torch.randn(1, 13, 1, 8)                 # (1, T, H, D)
    cos, sin = tables(32, 8)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    off = torch.tensor([1, 7, 0, 3, 20])
    triton_rope.launch(q, k, qo, ko, cos, sin, None, off, False, 1, False, CU, tokens=tokens)
    ref = R.apply_rope_qk(q[0], k[0], cos, sin, cu_seqlens=CU, offset=off, engine="torch")
    torch.testing.assert_close(qo[0], ref[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(ko[0], ref[1], rtol=0, atol=2e-6)
