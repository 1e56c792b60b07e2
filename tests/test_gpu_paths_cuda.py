"""The varlen, KV-cache and QK-norm Triton kernels on a real CUDA device (skipped without one): compiled
kernels against the torch engine, no host synchronisation, and a decode step captured in a CUDA graph.

Run it in its own process (``pytest tests/test_gpu_paths_cuda.py``): Triton decides at import whether
kernels are interpreted, and the interpreter tests turn the interpreter on.
"""

import contextlib
import os

import pytest
import torch

if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("needs a CUDA device and compiled (not interpreted) Triton kernels", allow_module_level=True)
pytest.importorskip("triton")

import posenc  # noqa: E402
from posenc.functional import rope as R  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def tables(rows, dim):
    inv, _ = R.rope_inv_freq(dim)
    return tuple(t.cuda() for t in R.rope_cos_sin(torch.arange(rows), inv))


def close(got, ref, dtype):
    tol = 2e-6 if dtype == torch.float32 else (1 / 64 if dtype == torch.bfloat16 else 2e-3)
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol * 4)


@contextlib.contextmanager
def no_sync():
    """Any host-device synchronisation inside raises (build the inputs before: copies from the host sync)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_kernel_matches_the_torch_engine_forward_and_backward(dtype):
    torch.manual_seed(0)
    cu = torch.tensor([0, 100, 100, 357, 1000], dtype=torch.int32, device="cuda")
    fused = torch.randn(1000, 8 + 2 * 2, 128, device="cuda", dtype=dtype, requires_grad=True)
    q, k = fused[:, :8], fused[:, 8:10]
    cos, sin = tables(2048, 96)
    off = torch.tensor([0, 5, 700, 3], device="cuda")
    qt, kt = R.apply_rope_qk(q, k, cos, sin, cu_seqlens=cu, offset=off, engine="triton")
    qr, kr = R.apply_rope_qk(q, k, cos, sin, cu_seqlens=cu, offset=off, engine="torch")
    close(qt, qr, dtype)
    close(kt, kr, dtype)
    g = torch.randn_like(qt), torch.randn_like(kt)
    gt = torch.autograd.grad((qt, kt), fused, g)[0]
    gr = torch.autograd.grad((qr, kr), fused, g)[0]
    close(gt, gr, dtype)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_and_cache_kernel_matches_the_torch_engine(paged, dtype):
    torch.manual_seed(1)
    B, Hq, Hk, D, S_max = 6, 8, 2, 128, 64
    cos, sin = tables(S_max, D)
    q, k, v = (torch.randn(B, 1, h, D, device="cuda", dtype=dtype) for h in (Hq, Hk, Hk))
    lens = torch.randint(0, S_max - 1, (B,), device="cuda")
    outs = []
    for engine in ("triton", "torch"):
        if paged:
            kc = torch.zeros(B * S_max // 16, 16, Hk, D, device="cuda", dtype=dtype)
            vc = torch.zeros_like(kc)
            slots = torch.arange(B, device="cuda") * 16 + 3
            qo = posenc.rope_and_cache(q[:, 0], k[:, 0], v[:, 0], kc, vc, cos, sin, slots=slots, positions=lens,
                                       engine=engine)
        else:
            kc = torch.zeros(B, Hk, S_max, D, device="cuda", dtype=dtype)
            vc = torch.zeros_like(kc)
            qo = posenc.rope_and_cache(q, k, v, kc, vc, cos, sin, cache_seqlens=lens, seq_dim=1, engine=engine)
        outs.append((qo, kc, vc))
    for got, ref in zip(*outs, strict=True):
        close(got, ref, dtype)


def test_rms_norm_rope_kernel_matches_the_torch_engine():
    norm_rope = pytest.importorskip("posenc.functional.norm_rope")
    torch.manual_seed(2)
    q = torch.randn(2, 300, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 300, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    wq = (torch.rand(128, device="cuda") + 0.5).requires_grad_()
    wk = (torch.rand(128, device="cuda") + 0.5).requires_grad_()
    cos, sin = tables(512, 128)
    outs = [norm_rope.rms_norm_rope_qk(q, k, wq, wk, cos, sin, seq_dim=1, engine=b) for b in ("triton", "torch")]
    for got, ref in zip(*outs, strict=True):
        close(got, ref, torch.bfloat16)
    g = [torch.randn_like(t) for t in outs[0]]
    grads = [torch.autograd.grad(out, (q, k, wq, wk), g) for out in outs]
    for got, ref in zip(*grads, strict=True):
        torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_the_new_paths_run_without_synchronisation():
    cos, sin = tables(256, 64)
    cu = torch.tensor([0, 3, 9], dtype=torch.int32, device="cuda")
    q, k = torch.randn(9, 4, 64, device="cuda"), torch.randn(9, 2, 64, device="cuda")
    kc, vc = torch.zeros(2, 2, 32, 64, device="cuda"), torch.zeros(2, 2, 32, 64, device="cuda")
    qd, kd = torch.randn(2, 4, 1, 64, device="cuda"), torch.randn(2, 2, 1, 64, device="cuda")
    lens = torch.tensor([3, 7], device="cuda")
    wq, wk = torch.ones(64, device="cuda"), torch.ones(64, device="cuda")
    rope = posenc.RotaryEmbedding(64, max_seq_len=256, device="cuda")        # (its tables come from the host)
    with no_sync():
        R.apply_rope_qk(q, k, cos, sin, cu_seqlens=cu, assume_valid=True)
        rope(q, k, cu_seqlens=cu, assume_valid=True)
        posenc.rope_and_cache(qd, kd, kd, kc, vc, cos, sin, cache_seqlens=lens, assume_valid=True)
        posenc.rms_norm_rope_qk(qd, kd, wq, wk, cos, sin, offset=5)


def test_decode_step_captures_and_replays_in_a_cuda_graph():
    B, Hq, Hk, D, S_max = 4, 8, 2, 64, 128
    cos, sin = tables(S_max, D)
    q = torch.randn(B, Hq, 1, D, device="cuda")
    k, v = torch.randn(B, Hk, 1, D, device="cuda"), torch.randn(B, Hk, 1, D, device="cuda")
    kc, vc = torch.randn(B, Hk, S_max, D, device="cuda"), torch.randn(B, Hk, S_max, D, device="cuda")
    lens = torch.tensor([5, 0, 77, 126], device="cuda")
    keys = torch.arange(S_max, device="cuda")

    def step():
        qr = posenc.rope_and_cache(q, k, v, kc, vc, cos, sin, cache_seqlens=lens, assume_valid=True)
        mask = (keys[None, :] <= lens[:, None])[:, None, None]                 # (B, 1, 1, S_max)
        return torch.nn.functional.scaled_dot_product_attention(qr, kc, vc, attn_mask=mask, enable_gqa=True)

    kc0, vc0 = kc.clone(), vc.clone()
    eager = step()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            out = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    kc.copy_(kc0)
    vc.copy_(vc0)
    lens.copy_(torch.tensor([6, 1, 78, 127], device="cuda"))                  # the next step: new lengths
    graph.replay()
    torch.cuda.synchronize()
    kc.copy_(kc0)
    vc.copy_(vc0)
    want = step()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert not torch.equal(out, eager)                                         # the replay saw the new lengths
