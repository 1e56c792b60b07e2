"""The fused RoPE + KV-cache Triton kernel, run on CPU tensors through Triton's interpreter
(TRITON_INTERPRET=1), compared with the torch engine of rope_and_cache."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before Triton decorates the kernel

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")

from posenc.functional import rope_cos_sin, rope_inv_freq  # noqa: E402
from posenc.functional.cache import _shares_nothing, rope_and_cache  # noqa: E402
from tests.reference.oracle import ulps  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("TRITON_INTERPRET was set to something other than 1 before this module", allow_module_level=True)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def tables(rows, dim):
    return rope_cos_sin(torch.arange(rows), rope_inv_freq(dim)[0])


def assert_close(got, ref):
    """Equal up to the float32 arithmetic's last bits (before the one rounding to ``ref``'s dtype)."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    g, r = got.double(), ref.double()
    tol = torch.full_like(r, 2e-6) if ref.dtype == torch.float32 else ulps(ref.dtype, r)
    same = (g - r).abs() <= tol
    both_nan = g.isnan() & r.isnan()
    assert bool((same | both_nan).all()), f"max difference {(g - r).abs().max().item():.3g}"


def run_both(make_args, kw):
    """rope_and_cache on fresh copies of the caches with each engine: ``[(q_out, k_cache, v_cache)] * 2``."""
    out = []
    for engine in ("triton", "torch"):
        q, k, v, k_cache, v_cache, cos, sin = make_args()
        kv = k.clone(), v.clone()
        q_out = rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, engine=engine, **kw)
        assert torch.equal(k, kv[0]) and torch.equal(v, kv[1])         # k and v never modified
        out.append((q_out, k_cache, v_cache))
    return out


def fused_contiguous(B, S, Hq, Hk, D, dtype, seq_dim, S_max, cache_dtype, seed=0):
    """q, k, v as strided views of one fused qkv projection output, and random caches."""
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(B, S, Hq + 2 * Hk, D, generator=g).to(dtype)  # (B, S, Hq + 2 Hk, D)
    q, k, v = fused[:, :, :Hq], fused[:, :, Hq : Hq + Hk], fused[:, :, Hq + Hk :]
    if seq_dim == 2:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))               # (B, H, S, D), still views
    caches = [torch.randn(B, Hk, S_max, D, generator=g).to(cache_dtype) for _ in range(2)]
    return fused, q, k, v, caches


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq_dim", [2, 1])
def test_contiguous_cache_matches_torch_on_fused_views(layout, dtype, seq_dim):
    B, S, Hq, Hk, D, d = 2, 3, 3, 2, 12, 8                              # GQA (3 % 2 != 0), partial rotary
    cos, sin = tables(32, d)

    def make():
        _, q, k, v, caches = fused_contiguous(B, S, Hq, Hk, D, dtype, seq_dim, 9, dtype)
        return q, k, v, *caches, cos, sin

    kw = dict(cache_seqlens=torch.tensor([0, 6], dtype=torch.int32), layout=layout, seq_dim=seq_dim)
    (qt, kt, vt), (qr, kr, vr) = run_both(make, kw)
    assert_close(qt, qr)
    assert_close(kt, kr)
    assert torch.equal(vt, vr)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("positions", [torch.tensor([[0, 0, 1], [4, 5, 6]]), torch.tensor([7, 8, 9])],
                         ids=["left_pad", "shared"])
def test_contiguous_cache_with_positions_and_another_cache_dtype(layout, positions):
    B, S, Hq, Hk, D = 2, 3, 4, 1, 8
    cos, sin = tables(16, 8)

    def make():
        _, q, k, v, caches = fused_contiguous(B, S, Hq, Hk, D, torch.bfloat16, 1, 8, torch.float32)
        return q, k, v, *caches, cos, sin

    kw = dict(cache_seqlens=torch.tensor([2, 5]), positions=positions, layout=layout, seq_dim=1)
    (qt, kt, vt), (qr, kr, vr) = run_both(make, kw)
    assert_close(qt, qr)
    assert_close(kt, kr)                                               # float32 cache: rotated k rounded once
    assert torch.equal(vt, vr)


def fused_paged(T, Hq, Hk, D, dtype, blocks, block_size, cache_dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(T, Hq + 2 * Hk, D, generator=g).to(dtype)     # (T, Hq + 2 Hk, D)
    q, k, v = fused[:, :Hq], fused[:, Hq : Hq + Hk], fused[:, Hq + Hk :]
    caches = [torch.randn(blocks, block_size, Hk, D, generator=g).to(cache_dtype) for _ in range(2)]
    return fused, q, k, v, caches


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_cache_matches_torch_and_skips_negative_slots(layout, dtype):
    T, Hq, Hk, D, d = 5, 3, 2, 10, 6
    cos, sin = tables(32, d)

    def make():
        _, q, k, v, caches = fused_paged(T, Hq, Hk, D, dtype, 3, 4, torch.float16)
        return q, k, v, *caches, cos, sin

    kw = dict(slots=torch.tensor([5, -1, 11, 0, -1]), positions=torch.tensor([3, 0, 31, 9, 1]), layout=layout)
    (qt, kt, vt), (qr, kr, vr) = run_both(make, kw)
    assert_close(qt, qr)
    assert_close(kt, kr)
    assert torch.equal(vt, vr)
    untouched = make()[3]                                              # the same random caches, unwritten
    written = torch.zeros(12, dtype=torch.bool)
    written[torch.tensor([5, 11, 0])] = True
    assert torch.equal(kt.flatten(0, 1)[~written], untouched.flatten(0, 1)[~written])


@pytest.mark.parametrize("paged", [False, True])
def test_assume_valid_gives_the_same_result(paged):
    cos, sin = tables(16, 8)
    if paged:
        kw = dict(slots=torch.tensor([1, -1, 6]), positions=torch.tensor([2, 3, 4]))
        _, q, k, v, (kc1, vc1) = fused_paged(3, 2, 1, 8, torch.float32, 2, 4, torch.float32)
    else:
        kw = dict(cache_seqlens=torch.tensor([0, 3]))
        _, q, k, v, (kc1, vc1) = fused_contiguous(2, 2, 2, 1, 8, torch.float32, 2, 6, torch.float32)
    kc2, vc2 = kc1.clone(), vc1.clone()
    a = rope_and_cache(q, k, v, kc1, vc1, cos, sin, engine="triton", **kw)
    b = rope_and_cache(q, k, v, kc2, vc2, cos, sin, engine="triton", assume_valid=True, **kw)
    assert torch.equal(a, b) and torch.equal(kc1, kc2) and torch.equal(vc1, vc2)


def test_broken_promise_never_writes_outside_and_gives_nan_rows():
    cos, sin = tables(4, 8)
    q, k, v = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8)
    k_cache, v_cache = torch.full((1, 1, 4, 8), 5.0), torch.full((1, 1, 4, 8), 5.0)
    # cache indices and positions 2, 3, 4: the last one fits neither the cache (skipped) nor the table (NaN)
    q_out = rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, cache_seqlens=torch.tensor([2]), engine="triton",
                           assume_valid=True)
    assert bool(k_cache[0, 0, :2].eq(5).all()) and torch.equal(v_cache[0, 0, 2:], v[0, 0, :2])
    assert not q_out[0, 0, :2].isnan().any() and bool(q_out[0, 0, 2].isnan().all())
    k_cache = torch.full((2, 2, 1, 8), 5.0)
    v_cache = torch.full((2, 2, 1, 8), 5.0)
    rope_and_cache(q[0, 0, :, None], k[0, 0, :, None], v[0, 0, :, None], k_cache, v_cache, cos, sin,
                   slots=torch.tensor([4, 1, 100]), positions=torch.tensor([0, 1, 2]), engine="triton",
                   assume_valid=True)
    assert int(v_cache.ne(5).any(-1).sum()) == 1 and torch.equal(v_cache[0, 1, 0], v[0, 0, 1])


@pytest.mark.parametrize("paged, seq_dim", [(False, 2), (False, 1), (True, None)])
def test_inplace_on_fused_views_rotates_q_only(paged, seq_dim):
    cos, sin = tables(16, 8)
    if paged:
        fused, q, k, v, caches = fused_paged(4, 2, 1, 12, torch.bfloat16, 2, 4, torch.bfloat16)
        kw = dict(slots=torch.tensor([0, 5, -1, 2]), positions=torch.tensor([1, 2, 3, 4]))
    else:
        fused, q, k, v, caches = fused_contiguous(2, 3, 2, 1, 12, torch.bfloat16, seq_dim, 6, torch.bfloat16)
        kw = dict(cache_seqlens=torch.tensor([0, 3]), seq_dim=seq_dim)
    want_caches = [c.clone() for c in caches]
    want = rope_and_cache(q, k, v, *want_caches, cos, sin, engine="torch", **kw)
    kv = k.clone(), v.clone()
    out = rope_and_cache(q, k, v, *caches, cos, sin, engine="triton", inplace=True, **kw)
    assert out is q
    assert_close(q, want)
    assert_close(caches[0], want_caches[0])
    assert torch.equal(caches[1], want_caches[1])
    assert torch.equal(k, kv[0]) and torch.equal(v, kv[1])


def test_only_views_sharing_no_element_are_rotated_in_the_same_launch():
    fused = torch.randn(2, 3, 4, 8)                                    # (B, S, q|q|k|v, D)
    q, k, v = fused[:, :, :2], fused[:, :, 2:3], fused[:, :, 3:]
    assert _shares_nothing(q, (k, v), (0, 1))
    assert _shares_nothing(q.transpose(1, 2), (k.transpose(1, 2), v.transpose(1, 2)), (0, 2))
    assert not _shares_nothing(q, (q, v), (0, 1))                      # q is k
    assert not _shares_nothing(fused[:, :, :3], (k, v), (0, 1))        # q holds k's head
    flat = fused.flatten(1, 2)                                         # (B, S * 4, D): tokens of 1 head ...
    assert not _shares_nothing(flat[:, 1:3, None], (flat[:, 0:2, None],), (0, 1))   # ... q(t) is k(t + 1)


def test_inplace_when_q_is_k_rotates_the_original_key_into_the_cache():
    cos, sin = tables(16, 8)
    x, v = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8)
    caches = [torch.zeros(1, 1, 4, 8) for _ in range(4)]
    x_t, x_r = x.clone(), x.clone()
    rope_and_cache(x_t, x_t, v, caches[0], caches[1], cos, sin, cache_seqlens=torch.tensor([1]), inplace=True,
                   engine="triton")
    rope_and_cache(x_r, x_r, v, caches[2], caches[3], cos, sin, cache_seqlens=torch.tensor([1]), inplace=True,
                   engine="torch")
    assert_close(x_t, x_r)
    assert_close(caches[0], caches[2])
    assert_close(caches[0][:, :, 1:], x_r)                             # k rotated once, from its original values


def test_backend_choice():
    a = fused_contiguous(1, 2, 1, 1, 8, torch.float32, 2, 4, torch.float64)
    cos, sin = tables(8, 8)
    with pytest.raises(ValueError, match="does not support this case: k_cache: dtype torch.float64"):
        rope_and_cache(*a[1:4], *a[4], cos, sin, cache_seqlens=torch.tensor([0]), engine="triton")
    rope_and_cache(*a[1:4], *a[4], cos, sin, cache_seqlens=torch.tensor([0]), engine="auto")   # CPU: torch


def test_custom_ops_pass_opcheck():
    from posenc.kernels import triton_cache  # noqa: F401  (registers the ops)

    cos, sin = tables(8, 8)
    q, k, v = torch.randn(1, 2, 2, 8), torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8)
    caches = torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 8)
    args = (q, k, v, *caches, cos, sin, torch.tensor([1]), None, False, False, 2)
    for op in (torch.ops.posenc.rope_and_cache.default, torch.ops.posenc.rope_and_cache_.default):
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("inplace", [False, True])
def test_torch_compile_fullgraph_traces_the_custom_op(inplace):
    cos, sin = tables(16, 8)
    seqlens = torch.tensor([1, 2])

    def step(q, k, v, k_cache, v_cache):
        return rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, cache_seqlens=seqlens, inplace=inplace,
                              engine="triton")

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 2, 8, generator=g) for h in (2, 1, 1))
    ref_caches, caches = [torch.zeros(2, 1, 6, 8) for _ in range(2)], [torch.zeros(2, 1, 6, 8) for _ in range(2)]
    ref = rope_and_cache(q.clone(), k, v, *ref_caches, cos, sin, cache_seqlens=seqlens, engine="torch")
    q_in = q.clone()
    out = torch.compile(step, fullgraph=True, backend="eager")(q_in, k, v, *caches)
    assert_close(out, ref)
    assert_close(caches[0], ref_caches[0])
    assert torch.equal(caches[1], ref_caches[1])
    if inplace:
        assert_close(q_in, ref)
