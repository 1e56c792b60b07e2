"""Tensors that start at any element of their storage (``buf[1:].view(...)``): every rotary entry point,
both layouts, every engine, in and out of place, small (decode) and large (cache-blocked) tensors.

An interleaved pair is rotated as one complex number, which needs an even storage offset; a view
starting at an odd element must be rotated all the same (it once raised ``TypeError``).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from posenc import RotaryEmbedding, apply_rope, apply_rope_qk, rms_norm_rope_qk, rope_and_cache
from posenc.kernels.torch_rope import BLOCK
from tests.reference import rope_oracle

ENGINES = ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="the Triton engine runs on CPU tensors only under Triton's interpreter (tests/conftest.py)"))]
OFFSETS = [0, 1, 2, 3]
LAYOUTS = ["half", "interleaved"]
D = 8


def _view(shape, start, dtype=torch.float32):
    """A contiguous tensor of ``shape`` that starts at element ``start`` of its storage."""
    n = 1
    for s in shape:
        n *= s
    buf = torch.randn(n + 4, dtype=torch.float64).to(dtype)
    return buf[start : start + n].view(shape)


def _oracle(x, positions, layout):
    freqs = rope_oracle.default(D, 10000.0)
    return rope_oracle.rotate(x, positions, freqs, layout).float()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("start", OFFSETS)
@pytest.mark.parametrize("inplace", [False, True])
def test_rotary_embedding_and_apply_rope_qk(start, layout, engine, inplace):
    rope = RotaryEmbedding(D, max_seq_len=16, layout=layout, engine=engine)
    q, k = _view((1, 2, 5, D), start), _view((1, 1, 5, D), 3 - start)
    want_q, want_k = _oracle(q, range(3, 8), layout), _oracle(k, range(3, 8), layout)
    for fn in (lambda a, b: rope(a, b, offset=3, inplace=inplace),
               lambda a, b: apply_rope_qk(a, b, rope.cos_table, rope.sin_table, offset=3, layout=layout,
                                          engine=engine, inplace=inplace)):
        qv, kv = q.clone(), k.clone()
        if inplace:                                   # rotate the odd-offset views themselves
            qv, kv = _view(q.shape, start), _view(k.shape, 3 - start)
            qv.copy_(q)
            kv.copy_(k)
        qo, ko = fn(qv, kv)
        torch.testing.assert_close(qo, want_q, atol=2e-6, rtol=0)
        torch.testing.assert_close(ko, want_k, atol=2e-6, rtol=0)
        if inplace:
            assert qo.data_ptr() == qv.data_ptr()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("start", OFFSETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inplace", [False, True])
def test_large_tensors_take_the_blocked_path(start, layout, dtype, inplace):
    S = BLOCK // (4 * D) + 3                                         # > BLOCK elements: the cache-blocked path
    x = _view((1, 4, S, D), start, dtype)
    rope = RotaryEmbedding(D, max_seq_len=S, layout=layout, engine="torch")
    want = _oracle(x.float(), range(S), layout).to(dtype)
    out = rope(x, inplace=inplace)[0]
    tol = 2e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), want.float(), atol=tol, rtol=0)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("start", OFFSETS)
def test_apply_rope(start, layout, engine):
    rope = RotaryEmbedding(D, max_seq_len=16, layout=layout)
    x = _view((1, 2, 5, D), start)
    out = apply_rope(x, rope.cos_table[:5], rope.sin_table[:5], layout=layout, engine=engine)
    torch.testing.assert_close(out, _oracle(x, range(5), layout), atol=2e-6, rtol=0)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("start", OFFSETS)
def test_rope_and_cache(start, layout, engine):
    rope = RotaryEmbedding(D, max_seq_len=16, layout=layout)
    q, k, v = _view((2, 2, 1, D), start), _view((2, 1, 1, D), 3 - start), _view((2, 1, 1, D), start)
    kc, vc = torch.zeros(2, 1, 6, D), torch.zeros(2, 1, 6, D)
    lens = torch.tensor([2, 4])
    qo = rope_and_cache(q, k, v, kc, vc, rope.cos_table, rope.sin_table, cache_seqlens=lens, layout=layout,
                        engine=engine)
    for b, p in enumerate((2, 4)):
        torch.testing.assert_close(qo[b], _oracle(q[b : b + 1], [p], layout)[0], atol=2e-6, rtol=0)
        torch.testing.assert_close(kc[b, :, p], _oracle(k[b : b + 1], [p], layout)[0, :, 0], atol=2e-6, rtol=0)
        torch.testing.assert_close(vc[b, :, p], v[b, :, 0])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("start", OFFSETS)
def test_rms_norm_rope_qk(start, layout, engine):
    rope = RotaryEmbedding(D, max_seq_len=16, layout=layout)
    q, k = _view((1, 2, 3, D), start), _view((1, 1, 3, D), 3 - start)
    w = torch.rand(D) + 0.5
    qo, ko = rms_norm_rope_qk(q, k, w, w, rope.cos_table, rope.sin_table, layout=layout, engine=engine)
    for x, out in ((q, qo), (k, ko)):
        xd = x.double()
        normed = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        torch.testing.assert_close(out, _oracle(normed, range(3), layout), atol=1e-5, rtol=0)
