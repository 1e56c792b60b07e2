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

from posenc._torch.backend import resolve_rope_backend  # noqa: E402
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
    qt, kt = R.apply_rope_qk(q, k, cos, sin, positions=pos, layout=layout, backend="triton")
    qr, kr = R.apply_rope_qk(q, k, cos, sin, positions=pos, layout=layout, backend="torch")
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
    assert resolve_rope_backend("auto", q, None) == "triton"
    f = torch.compile(lambda q: R.apply_rope_qk(q, None, cos, sin)[0], fullgraph=True)
    torch.testing.assert_close(f(q), R.apply_rope_qk(q, None, cos, sin, backend="torch")[0], rtol=0, atol=2e-6)
