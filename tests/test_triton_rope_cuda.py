"""The compiled Triton kernel on a real CUDA device (skipped without one).

Run it in its own process (``pytest tests/test_triton_rope_cuda.py``): Triton decides at import
whether kernels are interpreted, and tests/test_triton_rope.py turns the interpreter on.
"""

import os

import pytest
import torch

if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("needs a CUDA device and compiled (not interpreted) Triton kernels", allow_module_level=True)
pytest.importorskip("triton")

from posenc._torch.engine_choice import resolve_rope_engine  # noqa: E402
from posenc.functional import rope as R  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_cuda_kernel_matches_reference_forward_and_backward(dtype, layout):
    torch.manual_seed(0)
    B, S, Hq, Hk, D, rot = 2, 217, 8, 2, 128, 96
    fused = torch.randn(B, S, Hq + 2 * Hk, D, device="cuda", dtype=dtype, requires_grad=True)
    q, k = fused[:, :, :Hq].transpose(1, 2), fused[:, :, Hq : Hq + Hk].transpose(1, 2)   # strided views
    inv, _ = R.rope_inv_freq(rot)
    cos, sin = (t.cuda() for t in R.rope_cos_sin(torch.arange(4096), inv))
    pos = torch.randint(0, 4096, (B, S), device="cuda")
    qt, kt = R.apply_rope_qk(q, k, cos, sin, positions=pos, layout=layout, engine="triton")
    qr, kr = R.apply_rope_qk(q, k, cos, sin, positions=pos, layout=layout, engine="torch")
    tol = {torch.float32: 2e-6, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(qt, qr, rtol=tol, atol=tol)
    torch.testing.assert_close(kt, kr, rtol=tol, atol=tol)
    g = torch.randn_like(qt)
    (gt,) = torch.autograd.grad(qt, fused, g)
    (gr,) = torch.autograd.grad(qr, fused, g)
    torch.testing.assert_close(gt, gr, rtol=tol, atol=tol)


def test_cuda_auto_dispatch_and_compile():
    q = torch.randn(1, 4, 64, 64, device="cuda")
    inv, _ = R.rope_inv_freq(64)
    cos, sin = (t.cuda() for t in R.rope_cos_sin(torch.arange(64), inv))
    assert resolve_rope_engine("auto", q, None) == "triton"
    f = torch.compile(lambda q: R.apply_rope_qk(q, None, cos, sin)[0], fullgraph=True)
    torch.testing.assert_close(f(q), R.apply_rope_qk(q, None, cos, sin, engine="torch")[0], rtol=0, atol=2e-6)


# ---- the direct launch of the compiled kernel (posenc.kernels.triton_launch) ---------------------------------


def _decode_step(dtype=torch.bfloat16, B=4):
    inv, _ = R.rope_inv_freq(128)
    cos, sin = (t.cuda() for t in R.rope_cos_sin(torch.arange(4096), inv))
    q = torch.randn(B, 1, 32, 128, device="cuda", dtype=dtype)
    k = torch.randn(B, 1, 8, 128, device="cuda", dtype=dtype)
    pos = torch.randint(0, 4096, (B, 1), device="cuda")
    return q, k, cos, sin, pos


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_plan_launches_the_compiled_kernel_directly_with_the_result_of_kernel_grid(dtype, monkeypatch):
    from posenc._torch import plans
    from posenc.kernels import triton_launch

    assert triton_launch.direct_supported(), "this Triton launches compiled kernels another way: direct launch off"
    q, k, cos, sin, pos = _decode_step(dtype)
    plans.clear()
    first = R.apply_rope_qk(q, k, cos, sin, positions=pos, seq_dim=1, engine="triton", assume_valid=True)
    (plan,) = plans._plans.values()
    assert plan.run.launch.direct is not None                  # kept by the first (aligned) call
    calls = []
    real = triton_launch.Launch.fallback
    monkeypatch.setattr(triton_launch.Launch, "fallback", lambda self, args: (calls.append(1), real(self, args)))
    direct = R.apply_rope_qk(q, k, cos, sin, positions=pos, seq_dim=1, engine="triton", assume_valid=True)
    assert calls == []                                          # no kernel[grid](...) on the second call
    monkeypatch.setattr(triton_launch, "DIRECT", False)
    plans.clear()
    forced = [R.apply_rope_qk(q, k, cos, sin, positions=pos, seq_dim=1, engine="triton", assume_valid=True)
              for _ in range(2)][1]
    assert calls == [1, 1]                                      # forced: every launch through kernel[grid](...)
    for a, b, c in zip(first, direct, forced, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_an_unaligned_view_takes_kernel_grid_and_gives_the_same_values():
    from posenc._torch import plans

    q, k, cos, sin, pos = _decode_step(torch.float32)
    plans.clear()
    R.apply_rope_qk(q, k, cos, sin, positions=pos, seq_dim=1, engine="triton", assume_valid=True)
    buf = torch.randn(q.numel() + 1, device="cuda")
    q2 = buf[1:].view_as(q)                                     # 4 bytes past a 16-byte boundary
    q2.copy_(q)
    got = R.apply_rope_qk(q2, k, cos, sin, positions=pos, seq_dim=1, engine="triton", assume_valid=True)
    want = R.apply_rope_qk(q, k, cos, sin, positions=pos, seq_dim=1, engine="torch")
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=2e-6)


def test_the_backward_rotates_owned_gradients_in_place_and_leaves_the_users_alone():
    q = torch.randn(2, 64, 8, 128, device="cuda", requires_grad=True)
    k = torch.randn(2, 64, 2, 128, device="cuda", requires_grad=True)
    inv, _ = R.rope_inv_freq(128)
    cos, sin = (t.cuda() for t in R.rope_cos_sin(torch.arange(128), inv))
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    keep = gq.clone(), gk.clone()
    qt, kt = R.apply_rope_qk(q, k, cos, sin, seq_dim=1, engine="triton")
    dq, dk = torch.autograd.grad((qt, kt), (q, k), (gq, gk))
    assert torch.equal(gq, keep[0]) and torch.equal(gk, keep[1])
    qr, kr = R.apply_rope_qk(q, k, cos, sin, seq_dim=1, engine="torch")
    rq, rk = torch.autograd.grad((qr, kr), (q, k), (gq, gk))
    torch.testing.assert_close(dq, rq, rtol=0, atol=2e-6)
    torch.testing.assert_close(dk, rk, rtol=0, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_cuda_inverse_and_trailing_slice_forward_and_backward(dtype, layout):
    """DeepSeek-V4's two operations on the compiled kernel: the trailing 64 of 512 features, by theta
    and by -theta, against the torch engine; the gradient is the opposite rotation."""
    torch.manual_seed(0)
    B, S, H, D, rot = 2, 33, 4, 512, 64
    cos, sin = (t.cuda() for t in R.rope_cos_sin(torch.arange(256), R.rope_inv_freq(rot)[0]))
    pos = torch.randint(0, 256, (B, S), device="cuda")
    for inverse in (False, True):
        q = torch.randn(B, S, H, D, device="cuda", dtype=dtype, requires_grad=True)
        kw = dict(positions=pos, layout=layout, seq_dim=1, inverse=inverse, rotary_slice="last")
        out = R.apply_rope_qk(q, None, cos, sin, engine="triton", **kw)[0]
        ref = R.apply_rope_qk(q.detach(), None, cos, sin, engine="torch", **kw)[0]
        tol = 2e-6 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(out, ref, rtol=0, atol=tol)
        assert torch.equal(out[..., : D - rot], q.detach()[..., : D - rot])
        g = torch.randn_like(out)
        out.backward(g)
        want = R.apply_rope_qk(g, None, cos, sin, engine="torch", **{**kw, "inverse": not inverse})[0]
        torch.testing.assert_close(q.grad, want, rtol=0, atol=tol)
