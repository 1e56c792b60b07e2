"""Every Triton kernel against the torch engine on a real CUDA device, over the head dims, dtypes and
layouts that tests/test_triton_compile.py compiles, and on a second GPU (skipped without them).

Run it in its own process (``pytest tests/test_triton_kernels_cuda.py``, as ``scripts/gpu_check.sh``
does): Triton decides at import whether kernels are interpreted, and the interpreter tests turn the
interpreter on.
"""

import os

import pytest
import torch

if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("needs a CUDA device and compiled (not interpreted) Triton kernels", allow_module_level=True)
pytest.importorskip("triton")

import posenc  # noqa: E402
from posenc.functional import rope as R  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
HEAD_DIMS = [64, 80, 96, 128, 256]


def tables(rows, dim, device="cuda"):
    inv, _ = R.rope_inv_freq(dim)
    return tuple(t.to(device) for t in R.rope_cos_sin(torch.arange(rows), inv))


def close(got, ref, dtype):
    tol = 2e-6 if dtype == torch.float32 else (1 / 64 if dtype == torch.bfloat16 else 2e-3)
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol * 4)


def qk(B, S, hq, hk, D, dtype, seq_dim, device="cuda", grad=False):
    shape = (lambda h: (B, h, S, D)) if seq_dim == 2 else (lambda h: (B, S, h, D))
    return tuple(torch.randn(shape(h), device=device, dtype=dtype, requires_grad=grad) for h in (hq, hk))


@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(("seq_dim", "hq", "hk", "S"), [(2, 32, 32, 67), (1, 12, 1, 1), (1, 64, 8, 33)])
def test_rope_kernel_matches_the_torch_engine(D, dtype, layout, seq_dim, hq, hk, S):
    torch.manual_seed(D)
    q, k = qk(3, S, hq, hk, D, dtype, seq_dim, grad=True)
    cos, sin = tables(256, D)
    positions = torch.randint(0, 256, (3, S), device="cuda")
    outs = [R.apply_rope_qk(q, k, cos, sin, positions=positions, layout=layout, seq_dim=seq_dim, engine=b)
            for b in ("triton", "torch")]
    for got, ref in zip(*outs, strict=True):
        close(got, ref, dtype)
    g = [torch.randn_like(t) for t in outs[0]]
    grads = [torch.autograd.grad(out, (q, k), g) for out in outs]
    for got, ref in zip(*grads, strict=True):
        close(got, ref, dtype)


@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("paged", [False, True])
def test_cache_kernel_matches_the_torch_engine(D, dtype, layout, paged):
    torch.manual_seed(D + 1)
    B, Hq, Hk, S_max = 5, 16, 4, 64
    cos, sin = tables(S_max, D // 2 if D == 80 else D)            # head dim 80: partial rotary, copied features
    q, k, v = (torch.randn(B, 1, h, D, device="cuda", dtype=dtype) for h in (Hq, Hk, Hk))
    lens = torch.randint(0, S_max - 1, (B,), device="cuda")
    outs = []
    for engine in ("triton", "torch"):
        if paged:
            kc = torch.zeros(B * S_max // 16, 16, Hk, D, device="cuda", dtype=dtype)
            vc = torch.zeros_like(kc)
            slots = torch.arange(B, device="cuda") * 16 + 5
            qo = posenc.rope_and_cache(q[:, 0], k[:, 0], v[:, 0], kc, vc, cos, sin, slots=slots, positions=lens,
                                       layout=layout, engine=engine)
        else:
            kc = torch.zeros(B, Hk, S_max, D, device="cuda", dtype=dtype)
            vc = torch.zeros_like(kc)
            qo = posenc.rope_and_cache(q, k, v, kc, vc, cos, sin, cache_seqlens=lens, seq_dim=1, layout=layout,
                                       engine=engine)
        outs.append((qo, kc, vc))
    for got, ref in zip(*outs, strict=True):
        close(got, ref, dtype)


@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("token_wide", [False, True])
def test_norm_rope_kernel_matches_the_torch_engine_forward_and_backward(D, dtype, layout, token_wide):
    torch.manual_seed(D + 2)
    hq, hk = 8, 2
    q, k = qk(2, 45, hq, hk, D, dtype, 1, grad=True)
    wq = (torch.rand(hq * D if token_wide else D, device="cuda") + 0.5).requires_grad_()
    wk = (torch.rand(hk * D if token_wide else D, device="cuda") + 0.5).requires_grad_()
    cos, sin = tables(128, D)
    outs = [posenc.rms_norm_rope_qk(q, k, wq, wk, cos, sin, offset=7, layout=layout, seq_dim=1, engine=b)
            for b in ("triton", "torch")]
    for got, ref in zip(*outs, strict=True):
        close(got, ref, dtype)
    g = [torch.randn_like(t) for t in outs[0]]
    grads = [torch.autograd.grad(out, (q, k, wq, wk), g) for out in outs]
    for got, ref in zip(*grads, strict=True):
        torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_every_kernel_runs_on_the_inputs_device_not_the_current_one():
    """Tensors on cuda:1 while cuda:0 is current: each launch must go to cuda:1 (a launch on the
    wrong device reads garbage or faults)."""
    dev = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    torch.manual_seed(3)
    D, dtype = 128, torch.bfloat16
    q, k = qk(2, 9, 8, 2, D, dtype, 1, device=dev)
    cos, sin = tables(64, D, dev)
    got = R.apply_rope_qk(q, k, cos, sin, seq_dim=1, engine="triton")
    ref = R.apply_rope_qk(q, k, cos, sin, seq_dim=1, engine="torch")
    for a, b in zip(got, ref, strict=True):
        assert a.device == dev
        close(a, b, dtype)
    cu = torch.tensor([0, 4, 18], dtype=torch.int32, device=dev)
    packed_q, packed_k = q.reshape(18, 8, D), k.reshape(18, 2, D)
    got = R.apply_rope_qk(packed_q, packed_k, cos, sin, cu_seqlens=cu, engine="triton")
    ref = R.apply_rope_qk(packed_q, packed_k, cos, sin, cu_seqlens=cu, engine="torch")
    for a, b in zip(got, ref, strict=True):
        close(a, b, dtype)
    wq, wk = torch.rand(D, device=dev) + 0.5, torch.rand(D, device=dev) + 0.5
    got = posenc.rms_norm_rope_qk(q, k, wq, wk, cos, sin, seq_dim=1, engine="triton")
    ref = posenc.rms_norm_rope_qk(q, k, wq, wk, cos, sin, seq_dim=1, engine="torch")
    for a, b in zip(got, ref, strict=True):
        close(a, b, dtype)
    qd, kd, vd = (torch.randn(2, 1, h, D, device=dev, dtype=dtype) for h in (8, 2, 2))
    lens = torch.tensor([3, 40], device=dev)
    outs = []
    for engine in ("triton", "torch"):
        kc, vc = torch.zeros(2, 2, 64, D, device=dev, dtype=dtype), torch.zeros(2, 2, 64, D, device=dev, dtype=dtype)
        outs.append((posenc.rope_and_cache(qd, kd, vd, kc, vc, cos, sin, cache_seqlens=lens, seq_dim=1,
                                           engine=engine), kc, vc))
    for a, b in zip(*outs, strict=True):
        close(a, b, dtype)
    torch.cuda.synchronize(dev)


def test_rope_kernel_decode_step_captures_without_sync_and_replays_in_a_cuda_graph():
    """The plain RoPE kernel with per-row positions (what a batched decode step passes), captured with
    host synchronisation forbidden and replayed after the positions changed."""
    B, Hq, Hk, D = 4, 8, 2, 128
    cos, sin = tables(256, D)
    q, k = qk(B, 1, Hq, Hk, D, torch.bfloat16, 1)
    positions = torch.tensor([[3], [0], [200], [17]], device="cuda")

    def step():
        return R.apply_rope_qk(q, k, cos, sin, positions=positions, seq_dim=1, engine="triton", assume_valid=True)

    step()                                                         # compile outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            qo, ko = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    positions.copy_(torch.tensor([[4], [1], [201], [18]], device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    want = R.apply_rope_qk(q, k, cos, sin, positions=positions, seq_dim=1, engine="torch")
    close(qo, want[0], torch.bfloat16)
    close(ko, want[1], torch.bfloat16)
