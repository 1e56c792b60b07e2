"""posenc's sharding against torch's own context parallelism
(``torch.distributed.tensor.experimental.context_parallel``).

Single process: :func:`posenc.distributed.shard_indices` equals torch's head-tail and per-document head-tail
load balancers index for index, over many lengths, world sizes and document layouts, and the positions each
rank must encode are the packed positions at those indices.  Multi-process (gloo, 2 and 4 CPU processes):
torch's buffer-sharding step shards q, k and a positions buffer, and every rank's positions and rotated q/k
equal the unsharded computation at the tokens the rank holds (which a buffer of token indices, sharded with
the others, names independently of posenc).  The ring attention itself needs CUDA: see
``tests/test_context_parallel_cuda.py``."""

from __future__ import annotations

import random

import pytest
import torch

import posenc
from posenc.core.rope import DynamicNTKScaling, YarnScaling
from posenc.distributed import (
    check_shard_positions,
    shard_indices,
    shard_positions,
    shard_sequence,
    unshard_sequence,
)
from tests.processes import run_ranks

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)
balancers = pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._load_balancer")
HeadTail = balancers._HeadTailLoadBalancer
PerDocument = balancers._PerDocumentHeadTailLoadBalancer


def _torch_rank_indices(balancer, world: int) -> torch.Tensor:
    """What torch keeps on each rank: its balancer's order, split evenly along the sequence ``(W, B, S / W)``."""
    order = balancer._generate_indices().long()                        # (1 or B, S)
    return torch.stack(order.chunk(world, dim=-1))


def _layouts(world: int, count: int, rng: random.Random) -> list[list[int]]:
    """Random document layouts whose documents are multiples of ``2 * world`` tokens."""
    unit = 2 * world
    return [[unit * rng.randint(1, 5) for _ in range(rng.randint(1, 5))] for _ in range(count)]


def _packed_positions(doc_lengths: list[int]) -> torch.Tensor:
    cu = torch.tensor([0, *torch.tensor(doc_lengths).cumsum(0).tolist()])
    return posenc.positions_from_cu_seqlens(cu)


# ---- index for index against torch's balancers -----------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
def test_zigzag_is_torchs_head_tail_balancer(world):
    for seq_len in sorted({2 * world, 4 * world, 6 * world, 14 * world, 32 * world, 2 * world * 37}):
        want = _torch_rank_indices(HeadTail(seq_len, world, "cpu"), world)
        for r in range(world):
            assert torch.equal(shard_indices(seq_len, r, world), want[r, 0]), (seq_len, world, r)
            assert torch.equal(shard_positions(seq_len, r, world), want[r, 0])


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_per_document_is_torchs_per_document_balancer(world):
    rng = random.Random(world)
    for docs in _layouts(world, 25, rng):
        seq_len = sum(docs)
        want = _torch_rank_indices(PerDocument([docs], world, "cpu"), world)
        packed = _packed_positions(docs)
        for r in range(world):
            got = shard_indices(seq_len, r, world, load_balance="per_document", doc_lengths=docs)
            assert torch.equal(got, want[r, 0]), (docs, world, r)
            # what the rank must encode: each document's own positions at the tokens it holds
            pos = shard_positions(seq_len, r, world, load_balance="per_document", doc_lengths=docs)
            assert torch.equal(pos, packed[want[r, 0]])


def test_per_document_rows_of_a_batch_are_sharded_each_by_its_own_documents():
    world, rng = 2, random.Random(7)
    first = _layouts(world, 1, rng)[0]
    seq_len = sum(first)
    second = [4] * (seq_len // 4)                                     # another layout of the same length
    rows = [first, second]
    want = _torch_rank_indices(PerDocument(rows, world, "cpu"), world)
    x = torch.randn(2, seq_len, 3)
    parts = []
    for r in range(world):
        got = shard_indices(seq_len, r, world, load_balance="per_document", doc_lengths=rows)
        assert got.shape == (2, seq_len // world) and torch.equal(got, want[r])
        pos = shard_positions(seq_len, r, world, load_balance="per_document", doc_lengths=rows)
        for b in range(2):
            assert torch.equal(pos[b], _packed_positions(rows[b])[want[r, b]])
        parts.append(shard_sequence(x, r, world, load_balance="per_document", doc_lengths=rows))
        assert torch.equal(parts[-1], torch.stack([x[b, want[r, b]] for b in range(2)]))
    assert torch.equal(unshard_sequence(parts, load_balance="per_document", doc_lengths=rows), x)


@pytest.mark.parametrize("load_balance", ["zigzag", "contiguous"])
def test_document_positions_under_whole_sequence_sharding(load_balance):
    """torchtitan's default: the head-tail cut of the whole packed sequence, each token keeping the position
    inside its own document (so documents need not be multiples of anything)."""
    rng = random.Random(3)
    for world in (1, 2, 4):
        for _ in range(10):
            docs = [rng.randint(1, 9) for _ in range(rng.randint(1, 6))]
            docs[-1] += (-sum(docs)) % (2 * world)                     # the packed length splits evenly
            seq_len = sum(docs)
            packed = _packed_positions(docs)
            for r in range(world):
                index = shard_indices(seq_len, r, world, load_balance=load_balance)
                got = shard_positions(seq_len, r, world, load_balance=load_balance, doc_lengths=docs)
                assert torch.equal(got, packed[index]), (docs, world, r)


def test_torchs_default_falls_back_to_contiguous_when_the_length_does_not_split_into_2w():
    """``context_parallel`` load-balances only when the length is a multiple of ``2 W``, else it cuts contiguous
    blocks without saying so: positions must travel with the inputs (or be computed for the layout it chose)."""
    assert balancers._create_default_load_balancer(12, 4, "cpu") is None
    assert isinstance(balancers._create_default_load_balancer(16, 4, "cpu"), HeadTail)


@pytest.mark.parametrize("call, err, match", [
    (lambda: shard_positions(16, 0, 2, load_balance="per_document"), ValueError, "needs doc_lengths"),
    (lambda: shard_positions(16, 0, 2, doc_lengths=[4, 8]), ValueError, r"add up to 12, but seq_len=16"),
    (lambda: shard_positions(16, 0, 2, load_balance="per_document", doc_lengths=[4, 6, 6]), ValueError,
     r"document 1 has 6 tokens, which do not split into 4 equal chunks .* multiple of 4"),
    (lambda: shard_positions(16, 0, 2, doc_lengths=[[8, 8], [4, 8]]), ValueError,
     r"doc_lengths\[1\] add up to 12"),
    (lambda: shard_positions(16, 0, 2, doc_lengths=[8, [8]]), TypeError, "mixes lengths and lists"),
    (lambda: shard_positions(16, 0, 2, doc_lengths=[16, 0]), ValueError, "doc_lengths must be >= 1"),
    (lambda: shard_positions(16, 0, 2, doc_lengths=[]), TypeError, "non-empty list"),
    (lambda: shard_positions(16, 0, 2, doc_lengths=[8.0, 8]), TypeError, "doc_lengths must be an int"),
    (lambda: shard_positions(16, 0, 2, doc_lengths=torch.tensor([8.0, 8.0])), TypeError, "must be integers"),
    (lambda: shard_sequence(torch.zeros(16, 2), 0, 2, dim=0, doc_lengths=[[8, 8], [8, 8]]), ValueError,
     "batch on axis 0"),
    (lambda: shard_indices(16, 2, 2), ValueError, r"rank=2 must lie in \[0, world_size=2\)"),
    (lambda: shard_indices(16, 0, 2, load_balance="ring"), ValueError, "load_balance must be one of"),
])
def test_document_argument_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()


# ---- torch's own buffer sharding, on a gloo mesh of 2 and 4 processes ------------------------------


def _rope() -> posenc.RotaryEmbedding:
    return posenc.RotaryEmbedding(8, max_seq_len=64, scaling=YarnScaling(factor=4.0, original_max_seq_len=16))


def _check_shard(rank, world, rope, q, k, pos, idx, full_q, full_k, want_pos, want_idx, seq_len):
    """One rank's buffers after torch sharded them: posenc's positions and indices, and the rotation."""
    assert torch.equal(idx, want_idx), (rank, world, idx, want_idx)
    assert torch.equal(pos, want_pos), (rank, world, pos, want_pos)
    got_q, got_k = rope(q, k, positions=pos, seq_dim=1, seq_len=seq_len)
    rows = torch.arange(idx.shape[0])[:, None]
    torch.testing.assert_close(got_q, full_q[rows, idx], rtol=0, atol=0)
    torch.testing.assert_close(got_k, full_k[rows, idx], rtol=0, atol=0)


def _buffers(seq_len, positions):
    g = torch.Generator().manual_seed(seq_len)
    q = torch.randn(2, seq_len, 2, 8, generator=g)                    # (B, S, H, D): torchtitan's layout
    k = torch.randn(2, seq_len, 1, 8, generator=g)
    idx = torch.arange(seq_len).expand(2, seq_len).clone()
    return q, k, positions.expand(2, seq_len).clone(), idx


def _cp_worker(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _context_parallel_shard

    mesh = init_device_mesh("cpu", (world,))
    checks = 0
    for rope in (_rope(), posenc.RotaryEmbedding(8, max_seq_len=64, layout="interleaved",
                                                 scaling=DynamicNTKScaling(factor=2.0, original_max_seq_len=8))):
        # 1. the documented recipe: positions among context_parallel's buffers, global ones
        for seq_len in (2 * world, 6 * world, 16 * world, 3 * world):
            q, k, pos, idx = _buffers(seq_len, torch.arange(seq_len))
            full_q, full_k = rope(q, k, positions=pos, seq_dim=1, seq_len=seq_len)
            # torch load-balances only lengths that split into 2W chunks
            lb = "zigzag" if seq_len % (2 * world) == 0 else "contiguous"
            with context_parallel(mesh, buffers=[q, k, pos, idx], buffer_seq_dims=[1, 1, 1, 1]):
                want = shard_positions(seq_len, rank, world, load_balance=lb).expand(2, -1)
                _check_shard(rank, world, rope, q, k, pos, idx, full_q, full_k, want, want, seq_len)
                check_shard_positions(pos, seq_len, load_balance=lb)
            assert q.shape[1] == seq_len                                # the buffers are restored afterwards
            checks += 1
        # 2. packed documents: torch's per-document balancer, and its head-tail cut of the packed sequence
        unit = 2 * world
        layouts = ([unit, 3 * unit, unit], [[unit, 4 * unit], [2 * unit, 3 * unit]])
        for docs in layouts:
            rows = docs if isinstance(docs[0], list) else [docs] * 2
            seq_len = sum(rows[0])
            packed = torch.stack([_packed_positions(row) for row in rows])
            for kind in ("per_document", "zigzag"):
                q, k, pos, idx = _buffers(seq_len, packed)
                full_q, full_k = rope(q, k, positions=pos, seq_dim=1, seq_len=seq_len)
                balancer = PerDocument(rows, world, "cpu") if kind == "per_document" else HeadTail(seq_len, world,
                                                                                                  "cpu")
                q, k, pos, idx = _context_parallel_shard(mesh, [q, k, pos, idx], [1, 1, 1, 1], load_balancer=balancer)
                want_idx = shard_indices(seq_len, rank, world, load_balance=kind, doc_lengths=rows).expand(2, -1)
                want_pos = shard_positions(seq_len, rank, world, load_balance=kind, doc_lengths=rows).expand(2, -1)
                _check_shard(rank, world, rope, q, k, pos, idx, full_q, full_k, want_pos, want_idx, seq_len)
                check_shard_positions(pos, seq_len, load_balance=kind, doc_lengths=rows)
                checks += 1
    checks += _mismatches(rank, world)
    return checks


def _raises_everywhere(call, mine: str, others: str | None = None) -> None:
    try:
        call()
    except ValueError as err:
        assert mine in str(err) or (others is not None and others in str(err)), (mine, others, str(err))
    else:
        raise AssertionError(f"accepted on rank {dist.get_rank()}: {mine}")


def _mismatches(rank: int, world: int) -> int:
    """Positions that do not match the layout raise a ValueError on every rank, never a silent shift."""
    seq_len = 8 * world
    # rank 1 uses rank 0's positions: its own error there, a pointer to rank 1 elsewhere
    pos = shard_positions(seq_len, 0 if rank == 1 else rank, world)
    _raises_everywhere(lambda: check_shard_positions(pos, seq_len),
                       "rank 1: positions[0] = 0 where the zigzag layout puts 4",
                       "rank(s) [1] of the group hold positions that do not match")
    # what torch's context_parallel does with a length that is not a multiple of 2W (contiguous blocks),
    # checked as zigzag: the layout itself is refused, on every rank alike
    odd = 3 * world
    contiguous = shard_positions(odd, rank, world, load_balance="contiguous")
    _raises_everywhere(lambda: check_shard_positions(contiguous, odd), f"seq_len={odd} does not split into "
                       f"{2 * world} equal chunks")
    # positions right for another world size
    other = shard_positions(seq_len, rank % 2, 2 * world)
    _raises_everywhere(lambda: check_shard_positions(other, seq_len), f"rank {rank}: positions of shape (4,) are not "
                       f"a shard of this layout")
    # the ranks describe different document layouts, each consistent with its own positions
    docs = [2 * world, 6 * world] if rank == 0 else [4 * world, 4 * world]
    mine = shard_positions(seq_len, rank, world, doc_lengths=docs)
    _raises_everywhere(lambda: check_shard_positions(mine, seq_len, doc_lengths=docs), "passed different layouts")
    return 1


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_torchs_buffer_sharding_gives_every_rank_its_positions_and_rotation(world, tmp_path):
    assert run_ranks(_cp_worker, world, tmp_path) == ["17"] * world


def test_check_shard_positions_needs_a_process_group_and_integer_positions(tmp_path):
    with pytest.raises(ValueError, match="needs an initialised torch.distributed process group"):
        check_shard_positions(torch.arange(4), 4)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        check_shard_positions(torch.arange(6), 6)                      # one rank holds everything
        check_shard_positions(torch.tensor([[0, 1, 0, 1, 2, 3]]), 6, doc_lengths=[2, 4])
        with pytest.raises(TypeError, match="positions must be a torch.Tensor"):
            check_shard_positions([0, 1], 2)
        with pytest.raises(ValueError, match="positions must be an integer tensor, got torch.float32"):
            check_shard_positions(torch.arange(6.0), 6)
        with pytest.raises(ValueError, match=r"positions\[2\] = 9 where the contiguous layout puts 2"):
            check_shard_positions(torch.tensor([0, 1, 9, 3]), 4, load_balance="contiguous")
    finally:
        dist.destroy_process_group()
