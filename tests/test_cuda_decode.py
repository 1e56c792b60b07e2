"""Decode steps on a real CUDA device (skipped without one): no host synchronisation, and capture in
a CUDA graph.  Run where a GPU is available: ``pytest tests/test_cuda_decode.py``."""

import pytest
import torch

import posenc

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


def _layer_step(rope, x, wq, wk, wv, cache_k, cache_v, offset):
    """One attention layer for one new token at ``offset``, writing its key/value into the cache."""
    q = (x @ wq).view(1, 1, 4, 16).transpose(1, 2)                            # (1, H, 1, D)
    k = (x @ wk).view(1, 1, 2, 16).transpose(1, 2)
    v = (x @ wv).view(1, 1, 2, 16).transpose(1, 2)
    q, k = rope(q, k, offset=offset)
    cache_k[:, :, offset : offset + 1] = k
    cache_v[:, :, offset : offset + 1] = v
    keys, values = cache_k[:, :, : offset + 1], cache_v[:, :, : offset + 1]
    out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
    return out.transpose(1, 2).reshape(1, 64)


@pytest.mark.parametrize("engine", ["torch", "auto"])
def test_attention_decode_step_runs_without_synchronisation(engine):
    rope = posenc.RotaryEmbedding(16, max_seq_len=256, engine=engine).cuda()
    q, k, v = (torch.randn(1, h, s, 16, device="cuda") for h, s in ((4, 1), (2, 100), (2, 100)))
    pos = torch.tensor([99], device="cuda")                  # (a copy from the host synchronises: made before)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        posenc.attention(q, k, v, encoding=rope, causal=True)
        rope(q, k[:, :, :1], offset=99)
        rope(q, k[:, :, :1], positions=pos, assume_valid=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("engine", ["torch", "auto"])
def test_two_layer_decode_step_captures_and_replays_in_a_cuda_graph(engine):
    torch.manual_seed(0)
    rope = posenc.RotaryEmbedding(16, max_seq_len=256, engine=engine).cuda()
    weights = [[torch.randn(64, n, device="cuda") / 8 for n in (64, 32, 32)] for _ in range(2)]
    caches = [(torch.zeros(1, 2, 256, 16, device="cuda"), torch.zeros(1, 2, 256, 16, device="cuda")) for _ in range(2)]
    x = torch.randn(1, 64, device="cuda")

    def step():
        h = x
        for (wq, wk, wv), (ck, cv) in zip(weights, caches, strict=True):
            h = h + _layer_step(rope, h, wq, wk, wv, ck, cv, 37)
        return h

    expected = step().clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()                                                                  # warm up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, expected, rtol=1e-5, atol=1e-5)
