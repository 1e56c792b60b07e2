"""Context and tensor parallelism with real processes: 2 and 4 CPU processes on the gloo backend run a
2-layer model with each encoding, sharded over the sequence (contiguous and zigzag, causal and
bidirectional) or over the heads, and must give the unsharded run's output and parameter gradients
(float64: 1e-10; float32: 1e-5).  Plus the single-process pieces: sharding, restoring, head ranges."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import posenc
from posenc.core.rope import DynamicNTKScaling, YarnScaling
from posenc.distributed import (
    context_parallel_attention,
    head_range,
    shard_positions,
    shard_sequence,
    unshard_sequence,
)
from tests.processes import run_ranks

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)

ENCODINGS = ("sinusoidal", "learned", "rope-yarn", "rope-dynamic", "alibi", "t5")
S, D_MODEL, HEADS, KV_HEADS, VOCAB = 16, 16, 4, 2, 32                 # grouped-query attention: 2 key heads
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


# ---- the single-process pieces ------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("load_balance", ["zigzag", "contiguous"])
def test_shards_cover_every_position_once_and_restore_the_order(world, load_balance):
    seq_len = 4 * world * 3
    shards = [shard_positions(seq_len, r, world, load_balance=load_balance) for r in range(world)]
    assert sorted(torch.cat(shards).tolist()) == list(range(seq_len))
    assert all(len(s) == seq_len // world for s in shards)
    x = torch.randn(2, seq_len, 3)
    parts = [shard_sequence(x, r, world, load_balance=load_balance) for r in range(world)]
    for part, pos in zip(parts, shards, strict=True):
        assert torch.equal(part, x[:, pos])
    assert torch.equal(unshard_sequence(parts, load_balance=load_balance), x)


def test_zigzag_by_hand_and_balanced_causal_work():
    assert shard_positions(8, 0, 2).tolist() == [0, 1, 6, 7]
    assert shard_positions(8, 1, 2).tolist() == [2, 3, 4, 5]
    assert shard_positions(16, 3, 4).tolist() == [6, 7, 8, 9]
    # causal work of a rank: sum over its queries of (position + 1) keys; zigzag makes it equal
    work = [int((shard_positions(64, r, 4) + 1).sum()) for r in range(4)]
    assert len(set(work)) == 1
    contiguous = [int((shard_positions(64, r, 4, load_balance="contiguous") + 1).sum()) for r in range(4)]
    assert len(set(contiguous)) == 4


@pytest.mark.parametrize("call, err, match", [
    (lambda: shard_positions(10, 0, 2), ValueError, "pad the sequence at the end to a multiple of 4"),
    (lambda: shard_positions(10, 0, 4, load_balance="contiguous"), ValueError, "multiple of 4"),
    (lambda: shard_positions(8, 2, 2), ValueError, r"rank=2 must lie in \[0, world_size=2\)"),
    (lambda: shard_positions(8, 0, 2, load_balance="ring"), ValueError, "load_balance must be one of"),
    (lambda: shard_positions(8, 0, 0), ValueError, "world_size"),
    (lambda: head_range(6, 0, 4), ValueError, "num_heads=6 does not split evenly over world_size=4"),
    (lambda: posenc.AlibiBias(8, head_range=(4, 9)), ValueError, r"0 <= start < stop <= num_heads=8"),
    (lambda: posenc.RelativePositionBias(8, head_range=(3,)), TypeError, r"\(start, stop\) pair"),
    (lambda: posenc.AlibiBias(8, head_range=(0, 2), tp_group=object()), ValueError, "head_range or tp_group, not both"),
    (lambda: posenc.AlibiBias(8, tp_group=object()), ValueError, "initialised torch.distributed process group"),
    (lambda: unshard_sequence([]), TypeError, "one per rank"),
    (lambda: context_parallel_attention(*(torch.randn(1, 1, 2, 4),) * 3, positions=torch.arange(2)), ValueError,
     "initialised torch.distributed process group"),
])
def test_distributed_argument_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()


def test_head_ranges_slice_the_full_models_slopes_and_weights():
    assert [head_range(8, r, 4) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    full = posenc.alibi_slopes(12, dtype=torch.float64)
    for r in range(3):
        a, b = head_range(12, r, 3)
        assert torch.equal(posenc.AlibiBias(12, head_range=(a, b)).slopes, full[a:b])
    t5 = posenc.RelativePositionBias(8)
    part = posenc.RelativePositionBias(8, head_range=(2, 6))
    part.load_state_dict(t5.state_dict())                            # a full checkpoint loads as the slice
    assert part.weight.shape == (32, 4) and torch.equal(part.weight, t5.weight[:, 2:6])
    pos = torch.arange(5)
    assert torch.equal(part(pos), t5(pos)[2:6])
    with pytest.raises(ValueError, match=r"has 4 heads \(heads \(2, 6\) of 8\) but q has 8"):
        posenc.attention(*(torch.randn(1, 8, 5, 4),) * 3, encoding=part)


# ---- the model, unsharded and sharded ------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.hd = D_MODEL // HEADS
        self.qkv = nn.Linear(D_MODEL, D_MODEL + 2 * KV_HEADS * self.hd, dtype=dtype)
        self.out = nn.Linear(D_MODEL, D_MODEL, dtype=dtype)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 2 * D_MODEL, dtype=dtype), nn.Tanh(),
                                 nn.Linear(2 * D_MODEL, D_MODEL, dtype=dtype))

    def forward(self, x, attend):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split([D_MODEL, KV_HEADS * self.hd, KV_HEADS * self.hd], -1)
        q = q.view(B, T, HEADS, self.hd).transpose(1, 2)                             # (B, H, T, hd)
        k, v = (t.view(B, T, KV_HEADS, self.hd).transpose(1, 2) for t in (k, v))    # (B, H_kv, T, hd)
        x = x + self.out(attend(q, k, v).transpose(1, 2).reshape(B, T, D_MODEL))
        return x + self.mlp(x)


class Tiny(nn.Module):
    """Token embedding, the encoding (added, or inside attention), two blocks, a readout."""

    def __init__(self, encoding: str, dtype):
        super().__init__()
        head_dim = D_MODEL // HEADS
        self.tok = nn.Embedding(VOCAB, D_MODEL, dtype=dtype)
        self.additive = self.inner = None
        if encoding == "sinusoidal":
            self.additive = posenc.SinusoidalEncoding(D_MODEL, max_seq_len=S)
        elif encoding == "learned":
            self.additive = posenc.LearnedPositionalEmbedding(S, D_MODEL, dtype=dtype)
        elif encoding == "rope-yarn":
            self.inner = posenc.RotaryEmbedding(head_dim, max_seq_len=S,
                                                scaling=YarnScaling(factor=4.0, original_max_seq_len=4))
        elif encoding == "rope-dynamic":                   # length-dependent: must see the global length
            self.inner = posenc.RotaryEmbedding(head_dim, max_seq_len=S,
                                                scaling=DynamicNTKScaling(factor=2.0, original_max_seq_len=4))
        elif encoding == "alibi":
            self.inner = posenc.AlibiBias(HEADS)
        else:
            self.inner = posenc.RelativePositionBias(HEADS, num_buckets=8, max_distance=8, dtype=dtype)
        self.blocks = nn.ModuleList([Block(dtype), Block(dtype)])
        self.readout = nn.Linear(D_MODEL, VOCAB, dtype=dtype)

    def forward(self, ids, positions, attend):
        x = self.tok(ids)
        if self.additive is not None:
            x = self.additive(x, positions=positions)
        for block in self.blocks:
            x = block(x, attend)
        return self.readout(x)


def _run_context_parallel(rank, world, dtype, encoding, load_balance, causal, *, real=S, group=None):
    """Unsharded reference and sharded run on every rank of ``group``; compare outputs and summed
    gradients.  ``real < S``: the last ``S - real`` tokens are padding (``seq_len=real``)."""
    torch.manual_seed(0)
    model = Tiny(encoding, dtype)
    ids = torch.randint(0, VOCAB, (2, S), generator=torch.Generator().manual_seed(1))
    weights = torch.randn(2, S, VOCAB, dtype=dtype, generator=torch.Generator().manual_seed(2))
    weights[:, real:] = 0                                                # padding contributes no loss
    index_dtype = torch.int32 if dtype == torch.float32 else torch.int64  # both index dtypes

    def full_attend(q, k, v):
        return posenc.attention(q, k, v, encoding=model.inner, causal=causal)

    ref = model(ids[:, :real], torch.arange(real, dtype=index_dtype), full_attend)
    (ref * weights[:, :real]).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    local = shard_positions(S, rank, world, load_balance=load_balance).to(index_dtype)

    def cp_attend(q, k, v):
        return context_parallel_attention(q, k, v, positions=local, encoding=model.inner, causal=causal, group=group,
                                          seq_len=real if real < S else None)

    out = model(shard_sequence(ids, rank, world, load_balance=load_balance), local, cp_attend)
    (out * shard_sequence(weights, rank, world, load_balance=load_balance)).sum().backward()
    gathered = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(gathered, out.detach().contiguous(), group=group)
    tol = TOLERANCE[dtype]
    what = f"{encoding}, {load_balance}, causal={causal}, {dtype}, world={world}, real={real}"
    whole = unshard_sequence(gathered, load_balance=load_balance)[:, :real]
    torch.testing.assert_close(whole, ref.detach(), rtol=0, atol=tol, msg=lambda m: f"output differs ({what}): {m}")
    for name, p in model.named_parameters():
        grad = p.grad.clone()
        dist.all_reduce(grad, group=group)                              # the replicated parameters' gradients
        torch.testing.assert_close(grad, ref_grads[name], rtol=0, atol=tol,
                                   msg=lambda m, name=name: f"gradient of {name} differs ({what}): {m}")


def _run_collectives(rank, world):
    """The backward's reduce-scatter path (taken for CUDA tensors) equals the all-reduce path here,
    and a mistake on one rank raises on every rank instead of hanging the others."""
    from posenc.distributed import _sum_scatter

    g = torch.randn(2, 3, 4 * world, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    torch.testing.assert_close(_sum_scatter(g, 2, reduce_scatter=True), _sum_scatter(g, 2, reduce_scatter=False),
                               rtol=0, atol=1e-12)
    n = 3 if rank == 0 else 4
    q = torch.randn(1, 2, n, 4)
    try:
        context_parallel_attention(q, q, q, positions=torch.arange(n))
    except ValueError as err:
        assert "S_local = [3, 4" in str(err), str(err)
    else:
        raise AssertionError("shards of different lengths were accepted")
    bad = torch.arange(4) if rank else torch.arange(3)                  # rank 0's positions do not match
    try:
        context_parallel_attention(*(torch.randn(1, 2, 4, 4),) * 3, positions=bad)
    except ValueError as err:
        assert ("positions must be (4,)" in str(err)) if rank == 0 else ("rank(s) [0]" in str(err)), str(err)
    else:
        raise AssertionError("invalid positions on one rank were accepted")


def _run_tensor_parallel(rank, world, dtype, kind, causal):
    """Heads sharded over the ranks: each holds the bias of its heads; outputs and gradients match."""
    torch.manual_seed(0)
    H = 2 * world
    full = posenc.AlibiBias(H) if kind == "alibi" else posenc.RelativePositionBias(H, dtype=dtype)
    start, stop = head_range(H, rank, world)
    part = posenc.AlibiBias(H, tp_group=dist.group.WORLD) if kind == "alibi" else \
        posenc.RelativePositionBias(H, head_range=(start, stop), dtype=dtype)
    assert part.head_range == (start, stop)
    part.load_state_dict(full.state_dict())
    q, k, v = (torch.randn(2, H, S, 4, dtype=dtype, generator=torch.Generator().manual_seed(i), requires_grad=True)
               for i in range(3))
    g = torch.randn(2, H, S, 4, dtype=dtype, generator=torch.Generator().manual_seed(9))
    ref = posenc.attention(q, k, v, encoding=full, causal=causal)
    (ref * g).sum().backward()
    ref_grads = [t.grad.clone() for t in (q, k, v)] + ([] if kind == "alibi" else [full.weight.grad.clone()])
    for t in (q, k, v):
        t.grad = None
    heads = slice(start, stop)
    out = posenc.attention(q[:, heads], k[:, heads], v[:, heads], encoding=part, causal=causal)
    (out * g[:, heads]).sum().backward()
    gathered = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(gathered, out.detach().contiguous())
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(torch.cat(gathered, 1), ref.detach(), rtol=0, atol=tol)
    for t, want in zip((q, k, v), ref_grads, strict=False):
        grad = t.grad.clone()
        dist.all_reduce(grad)
        torch.testing.assert_close(grad, want, rtol=0, atol=tol)
    if kind == "t5":
        torch.testing.assert_close(part.weight.grad, ref_grads[3][:, heads], rtol=0, atol=tol)


def _cp_runs(rank, world):
    done = 0
    for dtype in (torch.float64, torch.float32):
        for encoding in ENCODINGS:
            for load_balance in ("contiguous", "zigzag"):
                for causal in (False, True):
                    _run_context_parallel(rank, world, dtype, encoding, load_balance, causal)
                    done += 1
        for kind in ("alibi", "t5"):
            for causal in (False, True):
                _run_tensor_parallel(rank, world, dtype, kind, causal)
                done += 1
    for encoding, causal in (("rope-dynamic", False), ("t5", True), ("learned", True)):   # padded to S
        _run_context_parallel(rank, world, torch.float64, encoding, "zigzag", causal, real=S - 2)
        done += 1
    if world == 4:                                                  # two context-parallel groups of two
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        _run_context_parallel(rank % 2, 2, torch.float64, "rope-dynamic", "zigzag", True, group=pairs[rank // 2])
        done += 1
    _run_collectives(rank, world)
    return done


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_sharded_runs_equal_the_unsharded_run(world, tmp_path):
    runs = 2 * (len(ENCODINGS) * 4 + 4) + 3 + (world == 4)
    assert run_ranks(_cp_runs, world, tmp_path) == [str(runs)] * world


def test_context_parallel_in_one_process_equals_plain_attention(tmp_path):
    """World size 1: the gather is the identity, so this is posenc.attention at the given positions."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        rope = posenc.RotaryEmbedding(8, max_seq_len=32)
        q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
        pos = torch.tensor([0, 1, 2, 9, 10, 11])
        got = context_parallel_attention(q, k, v, positions=pos, encoding=rope, causal=True)
        want = posenc.attention(q, k, v, encoding=rope, positions=pos, key_positions=pos, causal=True, seq_len=6)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        with pytest.raises(ValueError, match=r"positions must be \(6,\)"):
            context_parallel_attention(q, k, v, positions=pos[:5])
        padded = context_parallel_attention(q, k, v, positions=torch.arange(6), encoding=rope, seq_len=4)
        alone = posenc.attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], encoding=rope)
        torch.testing.assert_close(padded[:, :, :4], alone, rtol=0, atol=1e-6)   # padding keys are masked out
    finally:
        dist.destroy_process_group()




# ---- ranks that disagree: the same ValueError on every rank --------------------------------------

DISAGREEMENTS = {                       # rank 0's and rank 1's (B, H_kv, D, dtype, positions' dtype, seq_len)
    "batch size B = [1, 2]": ((1, 2, 4, torch.float32, torch.int64, None), (2, 2, 4, torch.float32, torch.int64, None)),
    "KV heads H_kv = [2, 1]": ((1, 2, 4, torch.float32, torch.int64, None), (1, 1, 4, torch.float32, torch.int64, None)),
    "head dim D of k = [4, 8]": ((1, 2, 4, torch.float32, torch.int64, None), (1, 2, 8, torch.float32, torch.int64, None)),
    "dtype of k and v = ['torch.float32', 'torch.float64']": ((1, 2, 4, torch.float32, torch.int64, None),
                                                                (1, 2, 4, torch.float64, torch.int64, None)),
    "dtype of positions = ['torch.int64', 'torch.int32']": ((1, 2, 4, torch.float32, torch.int64, None),
                                                              (1, 2, 4, torch.float32, torch.int32, None)),
    "seq_len = [7, 8]": ((1, 2, 4, torch.float32, torch.int64, 7), (1, 2, 4, torch.float32, torch.int64, None)),
    "seq_len=9 exceeds the gathered length world_size * S_local = 2 * 4 = 8": (
        (1, 2, 4, torch.float32, torch.int64, 9), (1, 2, 4, torch.float32, torch.int64, 9)),
}


def _run_disagreements(rank, world):
    """Each case: rank 1 differs from rank 0 (or both pass a seq_len past the gathered length); both
    must raise one ValueError with one message, and the group must stay usable."""
    rope = posenc.RotaryEmbedding(8, max_seq_len=16, scaling=DynamicNTKScaling(factor=2.0, original_max_seq_len=4))
    for expected, setups in DISAGREEMENTS.items():
        B, hk, d, dtype, index_dtype, seq_len = setups[rank]
        q = torch.randn(B, 2, 4, d, dtype=dtype)
        k = v = torch.randn(B, hk, 4, d, dtype=dtype)
        positions = shard_positions(8, rank, world).to(index_dtype)
        try:
            context_parallel_attention(q, k, v, positions=positions, encoding=rope if d == 8 else None,
                                       seq_len=seq_len)
        except ValueError as err:
            message = str(err)
        else:
            message = "no error"
        messages = [None] * world
        dist.all_gather_object(messages, message)
        assert messages[0] == messages[1], messages
        assert expected in message, (expected, message)
    return "ok"


def test_ranks_that_disagree_raise_one_error_on_every_rank(tmp_path):
    assert run_ranks(_run_disagreements, 2, tmp_path) == ["ok", "ok"]


def test_seq_len_past_the_gathered_length_is_refused(tmp_path):
    """A seq_len longer than world_size * S_local used to be accepted (dynamic NTK then saw a wrong length)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        rope = posenc.RotaryEmbedding(8, max_seq_len=32, scaling=DynamicNTKScaling(factor=2.0, original_max_seq_len=4))
        q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
        for assume_valid in (False, True):
            with pytest.raises(ValueError, match=r"seq_len=7 exceeds the gathered length .* = 6"):
                context_parallel_attention(q, k, v, positions=torch.arange(6), encoding=rope, seq_len=7,
                                           assume_valid=assume_valid)
        with pytest.raises(TypeError, match="seq_len must be an int"):
            context_parallel_attention(q, k, v, positions=torch.arange(6), encoding=rope, seq_len=6.0)
        exact = context_parallel_attention(q, k, v, positions=torch.arange(6), encoding=rope, seq_len=6)
        torch.testing.assert_close(exact, posenc.attention(q, k, v, encoding=rope), rtol=0, atol=1e-6)
    finally:
        dist.destroy_process_group()
