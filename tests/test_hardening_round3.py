"""Hardening, round three: inputs near the edges of int64, caches that share memory, positions whose
differences pass int64, broken promises under ``torch.compile``, and a traced T5 bias free of
``functools.lru_cache`` (the distributed cases are in ``tests/test_distributed.py``)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import posenc
from posenc.functional import rope as R
from posenc.functional import rope_and_cache

INT64_MAX = 2**63 - 1
CU = torch.tensor([0, 3, 5])                                     # lengths 3 and 2


def tables(rows, dim):
    inv, _ = R.rope_inv_freq(dim)
    return R.rope_cos_sin(torch.arange(rows), inv)


# ---- packed offsets near 2**63 ------------------------------------------------------------------


@pytest.mark.parametrize("offset, which", [
    (INT64_MAX - 1, r"offset=9223372036854775806"),                      # 3 tokens: the last at 2**63
    (torch.tensor([INT64_MAX - 1, 0]), r"offset\[0\]=9223372036854775806"),
    (torch.tensor([0, INT64_MAX]), r"offset\[1\]=9223372036854775807"),  # 2 tokens: the last at 2**63
])
def test_packed_offsets_past_int64_are_refused_naming_offset(offset, which):
    match = which + r" puts the last position of sequence \d \(length \d\) past int64"
    with pytest.raises(ValueError, match=match):
        posenc.positions_from_cu_seqlens(CU, offset=offset)
    q = torch.randn(5, 2, 8)
    with pytest.raises(ValueError, match=match):
        R.apply_rope_qk(q, None, *tables(16, 8), cu_seqlens=CU, offset=offset)
    with pytest.raises(ValueError, match=match):                          # not a promise that was never made
        posenc.RotaryEmbedding(8, max_seq_len=16)(q, q.clone(), cu_seqlens=CU, offset=offset)


def test_packed_offsets_that_just_fit_int64_give_exact_positions():
    got = posenc.positions_from_cu_seqlens(CU, offset=torch.tensor([INT64_MAX - 2, INT64_MAX - 1]))
    assert got.tolist() == [INT64_MAX - 2, INT64_MAX - 1, INT64_MAX, INT64_MAX - 1, INT64_MAX]
    low = -(2**63)
    assert posenc.positions_from_cu_seqlens(CU, offset=low).tolist() == [low, low + 1, low + 2, low, low + 1]


def test_an_int_offset_outside_int64_is_refused():
    with pytest.raises(ValueError, match=r"offset=9223372036854775808 lies outside int64"):
        posenc.positions_from_cu_seqlens(CU, offset=2**63)


def test_a_decrease_hidden_by_a_wrapping_difference_is_refused():
    # lengths by subtraction: big, -2 - big (wraps to a positive number), 7: no negative length
    cu = torch.tensor([0, INT64_MAX, -2, 5])
    with pytest.raises(ValueError, match="decrease"):
        posenc.positions_from_cu_seqlens(cu, total=5)


# ---- caches that share memory -------------------------------------------------------------------


def _paged_call(k_cache, v_cache):
    cos, sin = tables(32, 8)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, h, 8, generator=g) for h in (4, 1, 1))
    return rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, slots=torch.tensor([0, 3, 5]),
                          positions=torch.tensor([1, 2, 3]), engine="torch")


@pytest.mark.parametrize("shift", [1, 8, 63])                       # elements between the two caches' starts
def test_partially_overlapping_caches_are_refused(shift):
    buf = torch.zeros(64 + shift)
    k_cache, v_cache = buf[:64].view(4, 2, 1, 8), buf[shift:64 + shift].view(4, 2, 1, 8)
    with pytest.raises(ValueError, match="k_cache and v_cache share memory"):
        _paged_call(k_cache, v_cache)
    assert not buf.any()                                             # nothing was written


def test_a_cache_overlapping_in_part_of_its_bytes_is_refused():
    buf = torch.zeros(64 * 4 + 2, dtype=torch.uint8)
    k_cache = buf[:256].view(torch.float32).view(4, 2, 1, 8)
    v_cache = buf[2:258].view(torch.float16).view(4, 2, 1, 16)[..., :8]   # starts inside k_cache's first float
    with pytest.raises(ValueError, match="share memory"):
        _paged_call(k_cache, v_cache)


def test_interleaved_views_of_one_buffer_are_accepted():
    kv = torch.zeros(4, 2, 2, 1, 8)                                  # (num_blocks, 2, block_size, Hk, D)
    _paged_call(kv[:, 0], kv[:, 1])
    alone_k, alone_v = torch.zeros(4, 2, 1, 8), torch.zeros(4, 2, 1, 8)
    _paged_call(alone_k, alone_v)
    assert torch.equal(kv[:, 0], alone_k) and torch.equal(kv[:, 1], alone_v)


def _bytes_of(t):
    size = t.element_size()
    out = set()
    for index in itertools.product(*(range(n) for n in t.shape)):
        start = t.data_ptr() + sum(i * s for i, s in zip(index, t.stride(), strict=True)) * size
        out.update(range(start, start + size))
    return out


def test_share_memory_agrees_with_enumerating_the_bytes():
    from posenc._torch.checks import share_memory

    rng = random.Random(0)
    buf = torch.zeros(4096)
    seen = set()
    for _ in range(1500):
        views = []
        for _ in range(2):
            shape = [rng.randint(1, 4) for _ in range(rng.randint(1, 4))]
            stride = [rng.choice([0, 1, 2, 3, 4, 8, 12, 16, 24, 48]) for _ in shape]
            views.append(buf.as_strided(shape, stride, rng.randint(0, 160)))
        a, b = views
        if rng.random() < 0.3 and b.stride(-1) == 1:
            b = b.view(torch.int16)                                  # halves: overlaps of part of an element
        want = bool(_bytes_of(a) & _bytes_of(b))
        assert share_memory(a, b) == want, (a.shape, a.stride(), a.storage_offset(), b.shape, b.stride(),
                                            b.storage_offset(), b.dtype)
        seen.add(want)
    assert seen == {True, False}


# ---- query and key positions further apart than int64 holds ------------------------------------

EDGES = [-(2**63), -(2**62), -5, 0, 3, 2**62 + 1, 2**63 - 1]


def _t5_reference(module, q, k):
    from posenc.core.relative import relative_position_bucket

    return [[relative_position_bucket(kj - qi, bidirectional=module.bidirectional, num_buckets=module.num_buckets,
                                      max_distance=module.max_distance) for kj in k] for qi in q]


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_are_exact_for_distances_past_int64(bidirectional):
    t5 = posenc.RelativePositionBias(2, bidirectional=bidirectional)
    q = k = torch.tensor(EDGES)
    want = torch.tensor(_t5_reference(t5, EDGES, EDGES))
    assert torch.equal(t5.buckets(q, k), want)
    assert torch.equal(t5(q, k), t5.weight[want].movedim(-1, -3))
    assert torch.equal(t5.attention_bias(q, k, num_heads=2, dtype=torch.float32), t5(q, k))
    with torch.no_grad():
        score_mod = t5.attention_score_mod(q[None], k[None], num_heads=2)
        for i, j in itertools.product(range(len(EDGES)), repeat=2):
            got = score_mod(torch.tensor(0.0), torch.tensor(0), torch.tensor(1), torch.tensor(i), torch.tensor(j))
            assert got == t5.weight[want[i, j], 1], (EDGES[i], EDGES[j])


def test_relative_distances_saturate_instead_of_wrapping():
    from posenc.functional import relative_distances

    q = torch.tensor([2**62 + 1, -(2**63), 5])
    k = torch.tensor([-(2**62), 2**63 - 1, 7])
    got = relative_distances(q, k)
    want = [[max(min(a - b, 2**63 - 1), -(2**63)) for b in k.tolist()] for a in q.tolist()]
    assert got.tolist() == want


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_alibi_is_right_for_distances_past_int64(symmetric, dtype):
    alibi = posenc.AlibiBias(2, symmetric=symmetric)
    q = k = torch.tensor(EDGES)
    slopes = alibi.slopes.tolist()
    # the exact value in Python integers, rounded once
    want = torch.tensor([[[-m * (abs(a - b) if symmetric else a - b) for b in EDGES] for a in EDGES] for m in slopes],
                        dtype=torch.float64).to(dtype)
    got = alibi(q, k, dtype=dtype)
    torch.testing.assert_close(got, want, rtol=2 * torch.finfo(dtype).eps, atol=0)
    assert torch.equal(torch.sign(got), torch.sign(want))
    assert torch.equal(alibi.attention_bias(q, k, num_heads=2, dtype=dtype), got)
    assert not torch.signbit(alibi(torch.tensor([2**62]), torch.tensor([2**62]))).any()   # +0.0 on the diagonal
    score_mod = alibi.attention_score_mod(q[None], k[None], num_heads=2)
    for i, j in itertools.product(range(len(EDGES)), repeat=2):
        s = score_mod(torch.tensor(0.0), torch.tensor(0), torch.tensor(1), torch.tensor(i), torch.tensor(j))
        torch.testing.assert_close(s.double(), want[1, i, j].double(), rtol=2 * torch.finfo(torch.float32).eps,
                                   atol=0)


# ---- a broken assume_valid promise under torch.compile raises, it does not abort ---------------

_BROKEN_PROMISE = r"""
import sys
import torch
import posenc

torch.set_num_threads(2)                          # inductor's gather then runs in a parallel loop
S, D = 4096, 64
rope = posenc.RotaryEmbedding(D, max_seq_len=S)
if sys.argv[1] == "varlen":                       # a packed batch whose second sequence passes the table
    cos, sin = rope.cos_table, rope.sin_table
    compiled = torch.compile(lambda q, k, cu, off: posenc.functional.apply_rope_qk(
        q, k, cos, sin, cu_seqlens=cu, offset=off, assume_valid=True), backend="inductor")
    q, k, cu = torch.randn(2 * S, 8, D), torch.randn(2 * S, 8, D), torch.tensor([0, S, 2 * S])
    compiled(q, k, cu, torch.tensor([0, 0]))
    compiled(q, k, cu, torch.tensor([0, 10]))
    print("returned without an error")
    sys.exit(0)
if sys.argv[1] == "functional":
    cos, sin = rope.cos_table, rope.sin_table
    def f(q, k, p):
        return posenc.functional.apply_rope_qk(q, k, cos, sin, positions=p, assume_valid=True)
else:
    def f(q, k, p):
        return rope(q, k, positions=p, assume_valid=True)
compiled = torch.compile(f, backend="inductor")
q, k = torch.randn(2, 8, S, D), torch.randn(2, 8, S, D)
compiled(q, k, torch.arange(S))
bad = torch.arange(S)
bad[-1] = S + 5                                   # outside the table, though promised inside
compiled(q, k, bad)
print("returned without an error")
"""


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["functional", "module", "varlen"])
def test_a_broken_promise_under_inductor_raises_instead_of_aborting(entry, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("torch._inductor")
    script = tmp_path / "broken_promise.py"
    script.write_text(_BROKEN_PROMISE)
    root = str(Path(__file__).resolve().parents[1])                  # this checkout's posenc
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(script), entry], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])      # an exception, not a signal (-6: abort)
    assert "positions must lie in [0, 4096)" in done.stderr, done.stderr[-2000:]
    assert "returned without an error" not in done.stdout


# ---- a traced T5 bias calls no functools.lru_cache function ------------------------------------


def _t5_call(name):
    from posenc.functional import relative_position_bucket

    t5 = posenc.RelativePositionBias(4, num_buckets=8, max_distance=16)
    p = torch.arange(6)
    q = k = v = torch.randn(1, 4, 6, 8)
    if name == "forward":
        return (lambda p: t5(p, p + 2)), (p,), t5(p, p + 2)
    if name == "bucket":
        return (lambda r: relative_position_bucket(r, num_buckets=8, max_distance=16)), (p - 3,), \
            relative_position_bucket(p - 3, num_buckets=8, max_distance=16)
    backend = "flex" if name == "flex" else "sdpa"
    if backend == "flex":
        pytest.importorskip("torch.nn.attention.flex_attention")
    return (lambda q, k, v: posenc.attention(q, k, v, encoding=t5, backend=backend)), (q, k, v), \
        posenc.attention(q, k, v, encoding=t5)


@pytest.mark.parametrize("name", ["forward", "bucket", "sdpa", "flex"])
def test_compiling_the_t5_bias_calls_no_cached_host_function(name):
    import warnings

    fn, args, want = _t5_call(name)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        got = torch.compile(fn, backend="eager", fullgraph=name != "flex")(*args)
    cached = [str(w.message) for w in caught if "lru_cache" in str(w.message)]
    assert not cached, cached
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
