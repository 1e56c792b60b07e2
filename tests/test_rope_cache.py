"""rope_and_cache (RoPE + KV-cache write), torch engine: against a float64 oracle written here from the
RoPE formula with plain Python loops over the tokens, against apply_rope_qk, and its error messages."""

import math

import pytest
import torch

from posenc.functional import apply_rope_qk, rope_cos_sin, rope_inv_freq
from posenc.functional.cache import rope_and_cache
from tests.reference.oracle import ulps

BASE = 10000.0


def tables(rows, dim):
    return rope_cos_sin(torch.arange(rows), rope_inv_freq(dim, base=BASE)[0])


# ------------------------------------------------------------------------------------------------
# The oracle: float64 angles p * BASE**(-2i/d), pairs by layout, writes by loops over the tokens.


def rotate_row(x, p, d, layout):
    """``x (H, D)`` float64 rotated to position ``p``; also the magnitude ``|x_a| + |x_b|`` of each
    element's pair (0 for pass-through features, which are copied exactly)."""
    out, mag = x.clone(), torch.zeros_like(x)
    h = d // 2
    for i in range(h):
        theta = p * BASE ** (-2 * i / d)
        c, s = math.cos(theta), math.sin(theta)
        a, b = (i, i + h) if layout == "half" else (2 * i, 2 * i + 1)
        out[:, a] = x[:, a] * c - x[:, b] * s
        out[:, b] = x[:, b] * c + x[:, a] * s
        mag[:, a] = mag[:, b] = x[:, a].abs() + x[:, b].abs()
    return out, mag


def oracle_contiguous(q, k, v, k_cache, v_cache, seqlens, positions, d, layout, seq_dim):
    """Truth and pair magnitudes for q_out, k_cache, v_cache (float64), q/k/v as (B, S, H, D) inside."""
    if seq_dim == 2:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = q.double(), k.double(), v.double()
    q_out, q_mag = q.clone(), torch.zeros_like(q)
    kc, kc_mag, vc = k_cache.double().clone(), torch.zeros_like(k_cache, dtype=torch.float64), v_cache.double().clone()
    B, S = q.shape[:2]
    for b in range(B):
        for s in range(S):
            index = int(seqlens[b]) + s
            if positions is None:
                p = index
            else:
                p = int(positions[s]) if positions.dim() == 1 else int(positions[b if positions.shape[0] > 1 else 0, s])
            q_out[b, s], q_mag[b, s] = rotate_row(q[b, s], p, d, layout)
            kc[b, :, index], kc_mag[b, :, index] = rotate_row(k[b, s], p, d, layout)
            vc[b, :, index] = v[b, s]
    if seq_dim == 2:
        q_out, q_mag = q_out.transpose(1, 2), q_mag.transpose(1, 2)
    return (q_out, q_mag), (kc, kc_mag), vc


def oracle_paged(q, k, v, k_cache, v_cache, slots, positions, d, layout):
    q, k, v = q.double(), k.double(), v.double()
    q_out, q_mag = q.clone(), torch.zeros_like(q)
    kc, kc_mag, vc = k_cache.double().clone(), torch.zeros_like(k_cache, dtype=torch.float64), v_cache.double().clone()
    block_size = k_cache.shape[1]
    for t in range(q.shape[0]):
        p = int(positions[t])
        q_out[t], q_mag[t] = rotate_row(q[t], p, d, layout)
        slot = int(slots[t])
        if slot < 0:
            continue
        blk, row = slot // block_size, slot % block_size
        kc[blk, row], kc_mag[blk, row] = rotate_row(k[t], p, d, layout)
        vc[blk, row] = v[t]
    return (q_out, q_mag), (kc, kc_mag), vc


def assert_exact(got, truth_and_mag):
    """Within 0.5 ulp of the truth plus 2 eps (sum of the pair's input magnitudes), eps of got's dtype;
    where nothing is rotated (pass-through features, unwritten cache entries) exactly the truth converted
    to got's dtype."""
    truth, mag = truth_and_mag
    rotated = mag > 0
    tol = 0.5 * ulps(got.dtype, truth) + 2 * torch.finfo(got.dtype).eps * mag
    err = (got.double() - truth).abs()
    assert bool((err <= tol)[rotated].all()), f"max excess {(err - tol)[rotated].max().item():.3g}"
    assert torch.equal(got[~rotated], truth[~rotated].to(got.dtype))   # copied: one conversion at most


def make_qkv(shape_q, shape_k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(s, generator=g).to(dtype) for s in (shape_q, shape_k, shape_k))


DTYPES = [  # (q/k/v dtype, cache dtype)
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.float32),                                  # round once, to float32
    (torch.float16, torch.bfloat16),
]


# ------------------------------------------------------------------------------------------------
# Against the oracle


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim", [-2, 1])
@pytest.mark.parametrize("pos_kind", ["cache", "left_pad", "shared"])
@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: f"{d[0]}-{d[1]}".replace("torch.", ""))
def test_contiguous_cache_matches_oracle(layout, seq_dim, pos_kind, dtypes):
    dtype, cache_dtype = dtypes
    B, S, Hq, Hk, D, d, S_max = 3, 4, 5, 2, 12, 8, 11                 # GQA (5 % 2 != 0), partial rotary
    sd = seq_dim % 4
    shape = (lambda h: (B, h, S, D)) if sd == 2 else (lambda h: (B, S, h, D))
    q, k, v = make_qkv(shape(Hq), shape(Hk), dtype)
    k_cache = torch.randn(B, Hk, S_max, D).to(cache_dtype)
    v_cache = torch.randn(B, Hk, S_max, D).to(cache_dtype)
    seqlens = torch.tensor([0, 7, 3])
    positions = {"cache": None, "left_pad": torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8], [0, 0, 0, 1]]),
                 "shared": torch.tensor([9, 10, 11, 12])}[pos_kind]
    cos, sin = tables(16, d)
    want = oracle_contiguous(q, k, v, k_cache, v_cache, seqlens, positions, d, layout, sd)
    kv = k.clone(), v.clone()
    q_out = rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, cache_seqlens=seqlens, positions=positions,
                           layout=layout, seq_dim=seq_dim, engine="torch")
    assert q_out.dtype == dtype and q_out.shape == q.shape
    assert_exact(q_out, want[0])
    assert_exact(k_cache, want[1])
    assert torch.equal(v_cache, want[2].to(cache_dtype))              # v: one conversion to the cache dtype
    assert torch.equal(k, kv[0]) and torch.equal(v, kv[1])            # k and v never modified


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: f"{d[0]}-{d[1]}".replace("torch.", ""))
def test_paged_cache_matches_oracle_and_skips_negative_slots(layout, dtypes):
    dtype, cache_dtype = dtypes
    T, Hq, Hk, D, d, blocks, block_size = 6, 3, 1, 10, 6, 4, 3
    q, k, v = make_qkv((T, Hq, D), (T, Hk, D), dtype)
    k_cache = torch.randn(blocks, block_size, Hk, D).to(cache_dtype)
    v_cache = torch.randn(blocks, block_size, Hk, D).to(cache_dtype)
    slots = torch.tensor([4, -1, 11, 0, -1, 5])                        # -1: padding, not written
    positions = torch.tensor([3, 0, 9, 15, 2, 4])
    cos, sin = tables(16, d)
    want = oracle_paged(q, k, v, k_cache, v_cache, slots, positions, d, layout)
    q_out = rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, slots=slots, positions=positions, layout=layout,
                           seq_dim=1, engine="torch")                 # (seq_dim is ignored for a paged cache)
    assert_exact(q_out, want[0])                                       # padding tokens' q is rotated too
    assert_exact(k_cache, want[1])
    assert torch.equal(v_cache, want[2].to(cache_dtype))


@pytest.mark.parametrize("paged", [False, True])
def test_inplace_rotates_q_itself_and_leaves_k_v_alone(paged):
    cos, sin = tables(16, 8)
    if paged:
        q, k, v = make_qkv((4, 2, 8), (4, 1, 8), torch.float32)
        kw = dict(slots=torch.tensor([0, 3, -1, 5]), positions=torch.tensor([1, 2, 3, 4]))
        shape = (2, 4, 1, 8)
    else:
        q, k, v = make_qkv((2, 2, 3, 8), (2, 1, 3, 8), torch.float32)
        kw = dict(cache_seqlens=torch.tensor([1, 4]))
        shape = (2, 1, 8, 8)
    caches = [torch.zeros(shape) for _ in range(4)]
    want = rope_and_cache(q, k, v, caches[0], caches[1], cos, sin, engine="torch", **kw)
    kv = k.clone(), v.clone()
    q2 = q.clone()
    out = rope_and_cache(q2, k, v, caches[2], caches[3], cos, sin, inplace=True, engine="torch", **kw)
    assert out is q2
    assert torch.equal(q2, want)
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])
    assert torch.equal(k, kv[0]) and torch.equal(v, kv[1])


@pytest.mark.parametrize("seq_dim", [-2, 1])
def test_q_and_written_k_equal_apply_rope_qk(seq_dim):
    B, S, Hq, Hk, D = 2, 3, 4, 2, 16
    sd = seq_dim % 4
    shape = (lambda h: (B, h, S, D)) if sd == 2 else (lambda h: (B, S, h, D))
    q, k, v = make_qkv(shape(Hq), shape(Hk), torch.bfloat16)
    cos, sin = tables(32, 12)
    seqlens = torch.tensor([2, 6])
    k_cache, v_cache = torch.zeros(B, Hk, 10, D, dtype=torch.bfloat16), torch.zeros(B, Hk, 10, D, dtype=torch.bfloat16)
    q_out = rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, cache_seqlens=seqlens, seq_dim=seq_dim,
                           engine="torch")
    positions = seqlens[:, None] + torch.arange(S)
    q_ref, k_ref = apply_rope_qk(q, k, cos, sin, positions=positions, seq_dim=seq_dim, engine="torch")
    assert torch.equal(q_out, q_ref)
    k_ref = k_ref if sd == 2 else k_ref.transpose(1, 2)               # (B, Hk, S, D), the cache's layout
    for b in range(B):
        assert torch.equal(k_cache[b, :, seqlens[b] : seqlens[b] + S], k_ref[b])


def test_paged_q_and_written_k_equal_apply_rope_qk():
    q, k, v = make_qkv((5, 4, 8), (5, 2, 8), torch.float16)
    cos, sin = tables(32, 8)
    slots, positions = torch.tensor([7, 2, 9, 0, 4]), torch.tensor([20, 3, 1, 0, 31])
    k_cache, v_cache = torch.zeros(3, 4, 2, 8, dtype=torch.float16), torch.zeros(3, 4, 2, 8, dtype=torch.float16)
    q_out = rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, slots=slots, positions=positions,
                           layout="interleaved", engine="torch")
    q_ref, k_ref = apply_rope_qk(q, k, cos, sin, positions=positions, layout="interleaved", seq_dim=0, engine="torch")
    assert torch.equal(q_out, q_ref)
    assert torch.equal(k_cache.flatten(0, 1)[slots], k_ref)
    assert torch.equal(v_cache.flatten(0, 1)[slots], v)


@pytest.mark.parametrize("seq_dim", [-2, 1])
def test_five_decode_steps_equal_one_prefill(seq_dim):
    B, S, Hq, Hk, D = 2, 5, 2, 1, 8
    sd = seq_dim % 4
    shape = (lambda h: (B, h, S, D)) if sd == 2 else (lambda h: (B, S, h, D))
    q, k, v = make_qkv(shape(Hq), shape(Hk), torch.float32)
    cos, sin = tables(16, 8)
    start = torch.tensor([0, 3])
    prefill = [torch.zeros(B, Hk, 9, D) for _ in range(2)]
    q_all = rope_and_cache(q, k, v, *prefill, cos, sin, cache_seqlens=start, seq_dim=seq_dim, engine="torch")
    steps = [torch.zeros(B, Hk, 9, D) for _ in range(2)]
    outs = []
    for i in range(S):
        one = [t.narrow(sd, i, 1) for t in (q, k, v)]
        outs.append(rope_and_cache(*one, *steps, cos, sin, cache_seqlens=start + i, seq_dim=seq_dim, engine="torch"))
    assert torch.equal(torch.cat(outs, sd), q_all)
    assert torch.equal(steps[0], prefill[0]) and torch.equal(steps[1], prefill[1])


def test_empty_step_writes_nothing():
    cos, sin = tables(8, 8)
    q, k, v = torch.zeros(2, 1, 0, 8), torch.zeros(2, 1, 0, 8), torch.zeros(2, 1, 0, 8)
    k_cache, v_cache = torch.ones(2, 1, 4, 8), torch.ones(2, 1, 4, 8)
    out = rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, cache_seqlens=torch.tensor([4, 4]), engine="torch")
    assert out.shape == q.shape and bool(k_cache.eq(1).all()) and bool(v_cache.eq(1).all())


# ------------------------------------------------------------------------------------------------
# assume_valid: nothing read back; a broken promise never writes outside the caches


@pytest.mark.parametrize("paged", [False, True])
def test_assume_valid_reads_nothing_back(paged, monkeypatch):
    cos, sin = tables(16, 8)
    if paged:
        q, k, v = make_qkv((3, 2, 8), (3, 1, 8), torch.float32)
        kw = dict(slots=torch.tensor([0, -1, 5]), positions=torch.tensor([1, 2, 3]))
        shape = (2, 4, 1, 8)
    else:
        q, k, v = make_qkv((2, 2, 3, 8), (2, 1, 3, 8), torch.float32)
        kw = dict(cache_seqlens=torch.tensor([1, 4]))
        shape = (2, 1, 8, 8)
    want = [torch.zeros(shape) for _ in range(2)]
    q_want = rope_and_cache(q, k, v, *want, cos, sin, engine="torch", **kw)

    def no_read(*args, **kwargs):
        raise AssertionError("read back from the device")

    monkeypatch.setattr(torch.Tensor, "tolist", no_read)
    monkeypatch.setattr(torch.Tensor, "item", no_read)
    got = [torch.zeros(shape) for _ in range(2)]
    q_got = rope_and_cache(q, k, v, *got, cos, sin, engine="torch", assume_valid=True, **kw)
    monkeypatch.undo()
    assert torch.equal(q_got, q_want) and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_broken_promise_skips_writes_outside_the_cache():
    cos, sin = tables(16, 8)
    q, k, v = make_qkv((1, 1, 3, 8), (1, 1, 3, 8), torch.float32)
    k_cache, v_cache = torch.full((1, 1, 4, 8), 5.0), torch.full((1, 1, 4, 8), 5.0)
    # tokens at cache indices 2, 3, 4: the last does not fit and is skipped (positions stay in the table)
    rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, cache_seqlens=torch.tensor([2]), assume_valid=True,
                   engine="torch")
    assert torch.equal(v_cache[0, 0, 2:], v[0, 0, :2]) and bool(v_cache[0, 0, :2].eq(5).all())
    k_cache, v_cache = torch.full((2, 2, 1, 8), 5.0), torch.full((2, 2, 1, 8), 5.0)
    rope_and_cache(q[0, 0, :, None], k[0, 0, :, None], v[0, 0, :, None], k_cache, v_cache, cos, sin,
                   slots=torch.tensor([9, 1, -3]), positions=torch.tensor([0, 1, 2]), assume_valid=True,
                   engine="torch")                                      # slot 9 >= 4 and -3: not written
    assert torch.equal(v_cache[0, 1, 0], v[0, 0, 1])
    assert int(v_cache.ne(5).any(-1).sum()) == 1 and int(k_cache.ne(5).any(-1).sum()) == 1


def test_broken_position_promise_is_caught_by_the_lookup_and_names_assume_valid():
    cos, sin = tables(16, 8)
    q, k, v = make_qkv((3, 1, 8), (3, 1, 8), torch.float32)
    k_cache, v_cache = torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8)
    with pytest.raises(ValueError, match=r"must lie in \[0, 16\).*assume_valid=True"):
        rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, slots=torch.tensor([0, 1, 2]),
                       positions=torch.tensor([0, 1, 16]), assume_valid=True, engine="torch")


def test_broken_promise_with_no_token_written_changes_nothing():
    cos, sin = tables(16, 8)
    q, k, v = make_qkv((2, 1, 8), (2, 1, 8), torch.float32)
    k_cache, v_cache = torch.randn(2, 2, 1, 8), torch.randn(2, 2, 1, 8)
    before = k_cache.clone(), v_cache.clone()
    rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, slots=torch.tensor([-1, 4]), positions=torch.tensor([0, 1]),
                   assume_valid=True, engine="torch")
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


# ------------------------------------------------------------------------------------------------
# Bad inputs


def contiguous_args(B=2, S=3, Hq=2, Hk=1, D=8, S_max=8):
    q, k, v = make_qkv((B, Hq, S, D), (B, Hk, S, D), torch.float32)
    return q, k, v, torch.zeros(B, Hk, S_max, D), torch.zeros(B, Hk, S_max, D), *tables(16, 8)


def paged_args(T=3, Hq=2, Hk=1, D=8):
    q, k, v = make_qkv((T, Hq, D), (T, Hk, D), torch.float32)
    return q, k, v, torch.zeros(4, 2, Hk, D), torch.zeros(4, 2, Hk, D), *tables(16, 8)


SEQ = torch.tensor([0, 2])
SLOTS, POS = torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2])


def test_exactly_one_cache_kind():
    with pytest.raises(ValueError, match="exactly one of cache_seqlens and slots, got neither"):
        rope_and_cache(*contiguous_args())
    with pytest.raises(ValueError, match="exactly one of cache_seqlens and slots, got both.*contiguous.*paged"):
        rope_and_cache(*paged_args(), cache_seqlens=SEQ, slots=SLOTS, positions=POS)


@pytest.mark.parametrize("change, match", [
    (lambda a: a[:3] + (torch.zeros(2, 2, 8, 8),) + a[4:], r"k_cache must be \(B, Hk, S_max, D\).*= \(2, 1, \*, 8\)"),
    (lambda a: a[:3] + (torch.zeros(3, 1, 8, 8),) + a[4:], r"k_cache must be .*got \(3, 1, 8, 8\)"),
    (lambda a: a[:3] + (torch.zeros(2, 8, 1, 8),) + a[4:], r"whatever seq_dim"),
    (lambda a: a[:4] + (torch.zeros(2, 1, 9, 8),) + a[5:], r"v_cache \(2, 1, 9, 8\) must have the shape of k_cache"),
    (lambda a: a[:2] + (a[2][..., :4],) + a[3:], r"v \(2, 1, 3, 4\) must have the shape of k"),
])
def test_contiguous_shape_errors(change, match):
    with pytest.raises(ValueError, match=match):
        rope_and_cache(*change(contiguous_args()), cache_seqlens=SEQ)


def test_contiguous_index_errors():
    a = contiguous_args()
    with pytest.raises(ValueError, match=r"q must be \(B, Hq, S, D\) with seq_dim=-2 or \(B, S, Hq, D\) with seq_dim=1"):
        rope_and_cache(*a, cache_seqlens=SEQ, seq_dim=0)
    with pytest.raises(ValueError, match=r"cache_seqlens must have shape \(2,\)"):
        rope_and_cache(*a, cache_seqlens=torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="cache_seqlens must be an integer torch.Tensor"):
        rope_and_cache(*a, cache_seqlens=torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="cache_seqlens must be an integer torch.Tensor"):
        rope_and_cache(*a, cache_seqlens=[1, 2])
    with pytest.raises(ValueError, match=r"positions must have shape \(S,\) or \(B, S\)"):
        rope_and_cache(*a, cache_seqlens=SEQ, positions=torch.arange(4))


@pytest.mark.parametrize("change, match", [
    (lambda a: (a[0][None],) + a[1:], r"with slots \(a paged cache\) q must be \(T, Hq, D\)"),
    (lambda a: a[:3] + (torch.zeros(4, 2, 2, 8),) + a[4:], r"k_cache must be \(num_blocks, block_size, Hk, D\)"),
    (lambda a: a[:3] + (torch.zeros(4, 2, 8),) + a[4:], r"= \(\*, \*, 1, 8\)"),
    (lambda a: a[:4] + (torch.zeros(4, 3, 1, 8),) + a[5:], r"v_cache .* must have the shape of k_cache"),
])
def test_paged_shape_errors(change, match):
    with pytest.raises(ValueError, match=match):
        rope_and_cache(*change(paged_args()), slots=SLOTS, positions=POS)


def test_paged_index_errors():
    a = paged_args()
    with pytest.raises(ValueError, match=r"positions \(T,\) are required with slots"):
        rope_and_cache(*a, slots=SLOTS)
    with pytest.raises(ValueError, match=r"slots must have shape \(3,\)"):
        rope_and_cache(*a, slots=SLOTS[:2], positions=POS)
    with pytest.raises(ValueError, match=r"positions must have shape \(S,\), S=3"):
        rope_and_cache(*a, slots=SLOTS, positions=POS[None])


def test_writes_past_the_cache_are_rejected_with_the_range():
    with pytest.raises(ValueError, match=r"S_max=8 tokens per row, but cache_seqlens \+ S reaches 9 .*up to 6, S=3"):
        rope_and_cache(*contiguous_args(), cache_seqlens=torch.tensor([0, 6]))
    with pytest.raises(ValueError, match=r"cache_seqlens must be >= 0.*\[-1, 2\]"):
        rope_and_cache(*contiguous_args(), cache_seqlens=torch.tensor([-1, 2]))
    with pytest.raises(ValueError, match=r"slots must be < num_blocks \* block_size = 8 .*up to 8"):
        rope_and_cache(*paged_args(), slots=torch.tensor([0, 8, -1]), positions=POS)


def test_positions_outside_the_table_are_rejected():
    with pytest.raises(ValueError, match=r"cache_seqlens\[b\] \+ s reach 16, outside the cos/sin table of 16 rows"):
        rope_and_cache(*contiguous_args(S_max=32), cache_seqlens=torch.tensor([0, 14]))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 16\).*\[0, 16\]"):
        rope_and_cache(*contiguous_args(), cache_seqlens=SEQ, positions=torch.tensor([0, 1, 16]))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 16\).*\[-2, 2\]"):
        rope_and_cache(*paged_args(), slots=SLOTS, positions=torch.tensor([0, -2, 2]))


def test_grad_is_refused():
    q, *rest = contiguous_args()
    q.requires_grad_(True)
    with pytest.raises(ValueError, match="for inference.*but q require.*use apply_rope_qk for training"):
        rope_and_cache(q, *rest, cache_seqlens=SEQ)
    with torch.no_grad():
        rope_and_cache(q, *rest, cache_seqlens=SEQ)                     # fine without autograd


def test_other_argument_errors():
    a = contiguous_args()
    with pytest.raises(ValueError, match="layout must be one of"):
        rope_and_cache(*a, cache_seqlens=SEQ, layout="neox")
    with pytest.raises(ValueError, match="engine must be one of"):
        rope_and_cache(*a, cache_seqlens=SEQ, engine="cuda")
    with pytest.raises(TypeError, match="assume_valid must be a bool"):
        rope_and_cache(*a, cache_seqlens=SEQ, assume_valid=1)
    with pytest.raises(ValueError, match="same tensor"):
        rope_and_cache(*a[:3], a[3], a[3], *a[5:], cache_seqlens=SEQ)
    with pytest.raises(ValueError, match="share memory"):
        rope_and_cache(*a[:3], torch.zeros(2, 1, 1, 8).expand(2, 1, 8, 8), *a[4:], cache_seqlens=SEQ)
    with pytest.raises(ValueError, match="exceeds|rotary dim"):
        rope_and_cache(*a[:5], *tables(16, 10), cache_seqlens=SEQ)
    with pytest.raises(TypeError, match="k_cache must be a floating tensor"):
        rope_and_cache(*a[:3], a[3].long(), *a[4:], cache_seqlens=SEQ)
