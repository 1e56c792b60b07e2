"""The fused QK-RMSNorm + RoPE Triton kernel, run on CPU tensors through Triton's interpreter
(TRITON_INTERPRET=1), compared with the torch engine forward and backward (weights included)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before Triton decorates the kernel

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")

from posenc.functional import rope as R  # noqa: E402
from posenc.functional.norm_rope import rms_norm_rope_qk  # noqa: E402
from tests.reference.oracle import ulps  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("TRITON_INTERPRET was set to something other than 1 before this module", allow_module_level=True)

EPS32 = 2.0**-24


def tables(rows, dim):
    inv, _ = R.rope_inv_freq(dim)
    return R.rope_cos_sin(torch.arange(rows), inv)


def fused_qk(dtype, seq_dim, B=2, S=3, Hq=4, Hk=2, D=12):
    """q and k as strided views of one fused qkv projection output (B, S, Hq + 2 Hk, D)."""
    fused = torch.randn(B, S, Hq + 2 * Hk, D).to(dtype)
    q, k = fused[:, :, :Hq], fused[:, :, Hq : Hq + Hk]              # (B, S, H, D) views
    if seq_dim == 2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)                  # (B, H, S, D), still views
    return q.requires_grad_(), k.requires_grad_()


def weight(n, dtype):
    return (1.0 + 0.5 * torch.randn(n)).to(dtype).requires_grad_()


def close(got, ref, slack=16):
    """Both engines compute in float32 and round once, in different orders: the difference is a
    rounding flip (one ulp of the output dtype) plus float32 noise on the tensor's scale."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    ref64 = ref.detach().double()
    tol = ulps(ref.dtype, ref64) + slack * EPS32 * ref64.abs().amax()
    diff = (got.detach().double() - ref64).abs()
    assert bool((diff <= tol).all()), f"max excess {(diff - tol).max().item():.3g}"


def run(engine, q, k, wq, wk, cos, sin, grads, **kw):
    out = rms_norm_rope_qk(q, k, wq, wk, cos, sin, engine=engine, **kw)
    leaves = [t for t in (q, k, wq, wk) if t is not None]
    outs = [o for o in out if o is not None]
    return (*outs, *torch.autograd.grad(outs, leaves, grads[: len(outs)]))


def both_engines(q, k, wq, wk, cos, sin, **kw):
    outs = [o for o in rms_norm_rope_qk(q, k, wq, wk, cos, sin, engine="torch", **kw) if o is not None]
    grads = [torch.randn_like(o) for o in outs]
    return run("triton", q, k, wq, wk, cos, sin, grads, **kw), run("torch", q, k, wq, wk, cos, sin, grads, **kw)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim", [2, 1])
@pytest.mark.parametrize("extent", [("head", "head"), ("token", "token"), ("token", "head")], ids="-".join)
def test_forward_and_backward_match_the_torch_engine(layout, seq_dim, extent):
    torch.manual_seed(0)
    q, k = fused_qk(torch.float32, seq_dim)                         # GQA: 4 query heads, 2 key heads
    wq = weight(4 * 12 if extent[0] == "token" else 12, torch.float32)
    wk = weight(2 * 12 if extent[1] == "token" else 12, torch.float32)
    cos, sin = tables(16, 6)                                        # partial rotary: 6 of 12 features (3 pairs)
    positions = torch.randint(0, 16, (2, 3))
    got, want = both_engines(q, k, wq, wk, cos, sin, positions=positions, layout=layout, seq_dim=seq_dim,
                             weight_offset=1.0 if extent[1] == "head" else 0.0)
    for g, w in zip(got, want, strict=True):                        # q, k, grad q, grad k, grad wq, grad wk
        close(g, w)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("extent", ["head", "token"])
def test_half_precision(dtype, extent):
    torch.manual_seed(1)
    q, k = fused_qk(dtype, 1)
    wq = weight(48 if extent == "token" else 12, dtype)             # weights in the model's dtype
    wk = weight(24 if extent == "token" else 12, torch.float32)     # or in float32
    cos, sin = tables(16, 12)
    layout = "interleaved" if extent == "token" else "half"
    got, want = both_engines(q, k, wq, wk, cos, sin, offset=4, layout=layout, seq_dim=1, eps=1e-5)
    for g, w in zip(got, want, strict=True):
        close(g, w)


def test_offset_equals_1d_positions_without_k_and_weight_grads_are_deterministic():
    torch.manual_seed(2)
    q = torch.randn(1, 3, 4, 10, requires_grad=True)
    wq = weight(10, torch.float32)
    cos, sin = tables(16, 8)
    a = rms_norm_rope_qk(q, None, wq, None, cos, sin, offset=5, engine="triton")
    b = rms_norm_rope_qk(q, None, wq, None, cos, sin, positions=torch.arange(5, 9), engine="triton")
    assert a[1] is None and b[1] is None and torch.equal(a[0], b[0])
    g = torch.randn_like(a[0])
    first = torch.autograd.grad(a[0], (q, wq), g)
    second = torch.autograd.grad(b[0], (q, wq), g)
    assert all(torch.equal(x, y) for x, y in zip(first, second, strict=True))   # no atomics: bit for bit
    ref = run("torch", q, None, wq, None, cos, sin, [g], offset=5)
    for x, y in zip((a[0], *first), ref, strict=True):
        close(x, y)


def test_broken_in_table_promise_gives_nan_rows_never_a_read_past_the_table():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    w = torch.ones(8)
    cos, sin = tables(8, 8)
    qo, ko = rms_norm_rope_qk(q, k, w, w, cos, sin, positions=torch.tensor([0, 1, 8]), assume_valid=True,
                              engine="triton")
    assert bool(qo[:, :, 2].isnan().all() and ko[:, :, 2].isnan().all())
    ref = rms_norm_rope_qk(q[:, :, :2], k[:, :, :2], w, w, cos, sin, engine="torch")
    close(qo[:, :, :2], ref[0])
    close(ko[:, :, :2], ref[1])


def test_cases_the_kernel_cannot_take_raise_for_explicit_triton():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    w = torch.ones(8)
    cos, sin = tables(8, 8)
    with pytest.raises(ValueError, match="does not support this case: dtype torch.float64"):
        rms_norm_rope_qk(q.double(), k.double(), w, w, cos, sin, engine="triton")
    with pytest.raises(ValueError, match="gradients with respect to cos/sin"):
        rms_norm_rope_qk(q, k, w, w, cos.requires_grad_(), sin, engine="triton")
    # "auto" keeps CPU tensors on the torch engine even with the interpreter on
    a = rms_norm_rope_qk(q, k, w, w, cos.detach(), sin, engine="auto")
    b = rms_norm_rope_qk(q, k, w, w, cos.detach(), sin, engine="torch")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_torch_compile_fullgraph_traces_the_custom_ops():
    torch.manual_seed(3)
    q = torch.randn(1, 2, 3, 8, requires_grad=True)
    k = torch.randn(1, 1, 3, 8, requires_grad=True)
    wq, wk = weight(16, torch.float32), weight(8, torch.float32)
    cos, sin = tables(8, 8)

    def f(q, k, wq, wk):
        return rms_norm_rope_qk(q, k, wq, wk, cos, sin, offset=1, engine="triton")

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    got = compiled(q, k, wq, wk)
    grads = [torch.randn_like(o) for o in got]
    got = (*got, *torch.autograd.grad(got, (q, k, wq, wk), grads))
    want = run("torch", q, k, wq, wk, cos, sin, grads, offset=1)
    for g, w in zip(got, want, strict=True):
        close(g, w)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_many_heads_take_several_head_blocks(layout):
    """32 query heads of 128 features (64 rotated) do not fit one block of heads: the token-wide
    norm sums its squares over several blocks, the per-head weight gradient accumulates over them."""
    torch.manual_seed(4)
    q = torch.randn(1, 2, 32, 128, requires_grad=True)
    k = torch.randn(1, 2, 8, 128, requires_grad=True)
    wq, wk = weight(32 * 128, torch.float32), weight(128, torch.float32)
    cos, sin = tables(8, 64)
    got, want = both_engines(q, k, wq, wk, cos, sin, positions=torch.tensor([[6, 1]]), layout=layout, seq_dim=1)
    for g, w in zip(got, want, strict=True):
        close(g, w)


def test_strided_weights_and_expanded_gradients():
    torch.manual_seed(5)
    q = torch.randn(2, 3, 2, 8, requires_grad=True)
    wq = torch.randn(32)[::2].requires_grad_()                      # a (16,) = (H*D,) view with stride 2
    cos, sin = tables(8, 8)
    qo, _ = rms_norm_rope_qk(q, None, wq, None, cos, sin, seq_dim=1, engine="triton")
    got = (qo, *torch.autograd.grad(qo.sum(), (q, wq)))           # sum(): a gradient with stride 0
    want = run("torch", q, None, wq, None, cos, sin, [torch.ones_like(qo)], seq_dim=1)
    for g, w in zip(got, want, strict=True):
        close(g, w)
