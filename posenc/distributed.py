"""Positions under context and tensor parallelism, on ``torch.distributed``.

Long-context training shards the *sequence* across devices (context parallelism, as in Llama 3's
all-gather scheme, torchtitan and Transformer Engine) and the *heads* across devices (tensor
parallelism, as in Megatron-LM and BLOOM).  A positional encoding stays correct only if

- each shard encodes its **global** positions, which causal load balancing makes non-contiguous:
  with ``load_balance="zigzag"`` the sequence is cut into ``2W`` chunks and rank ``r`` of ``W``
  holds chunks ``r`` and ``2W - 1 - r``, so every rank gets the same share of causal work::

      W = 2, 8 tokens:   chunks  [0 1] [2 3] [4 5] [6 7]
                         rank 0:  [0 1]             [6 7]
                         rank 1:        [2 3] [4 5]

- attention masks compare global positions, not local indices;
- length-dependent rules (dynamic NTK, LongRoPE, YaRN's thresholds) use the global length;
- ALiBi slopes and T5 bias heads of a rank are *its slice* of the full model's heads
  (:class:`~posenc.AlibiBias` and :class:`~posenc.RelativePositionBias` take ``head_range``).

This module gives the pieces: :func:`shard_positions`, :func:`shard_sequence` and
:func:`unshard_sequence` (the token layout), :func:`head_range` and
:func:`tensor_parallel_head_range` (the head layout), and :func:`context_parallel_attention`, which
all-gathers keys and values across the group with autograd (``torch.distributed`` collectives:
the backward pass sums the keys' and values' gradients over the ranks) and applies any posenc encoding with global positions.  ``torch.distributed`` is imported only by
the functions that communicate.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from posenc import _validate
from posenc._torch.heads import split_heads
from posenc.attn import attention

__all__ = [
    "LOAD_BALANCE",
    "check_shard_positions",
    "context_parallel_attention",
    "head_range",
    "shard_indices",
    "shard_positions",
    "shard_sequence",
    "tensor_parallel_head_range",
    "unshard_sequence",
]

#: How a sequence is cut across ranks: ``"zigzag"`` (chunks ``r`` and ``2W - 1 - r`` of ``2W``, balanced
#: causal work; torch's head-tail balancer), ``"contiguous"`` (rank ``r`` holds the ``r``-th block; torch's
#: ``context_parallel`` without load balancing) or ``"per_document"`` (the head-tail cut applied inside each
#: packed document, in the order of torch's per-document head-tail balancer).
LOAD_BALANCE = ("zigzag", "contiguous", "per_document")

_Documents = tuple[tuple[int, ...], ...]


def _check_layout(seq_len: object, world_size: object, load_balance: object) -> tuple[int, int, int]:
    """``(seq_len, world_size, chunks)`` checked; the length must split into the chunks evenly."""
    seq_len = _validate.check_int("seq_len", seq_len, minimum=0)
    world_size = _validate.check_int("world_size", world_size, minimum=1)
    _validate.check_choice("load_balance", load_balance, LOAD_BALANCE)
    chunks = world_size if load_balance == "contiguous" else 2 * world_size
    if seq_len % chunks:
        raise ValueError(
            f"seq_len={seq_len} does not split into {chunks} equal chunks ({load_balance} sharding over world_size="
            f"{world_size}); pad the sequence at the end to a multiple of {chunks} and pass the real length as "
            f"context_parallel_attention(..., seq_len=)"
        )
    return seq_len, world_size, chunks


def _check_documents(doc_lengths: object, seq_len: int, world_size: int, load_balance: str) -> _Documents | None:
    """``doc_lengths`` as one tuple of lengths per batch row (a flat list is one row for every batch row), or
    None; every row must add up to ``seq_len``, and under ``"per_document"`` every document must split into
    ``2 * world_size`` chunks."""
    if doc_lengths is None:
        if load_balance == "per_document":
            raise ValueError("load_balance='per_document' needs doc_lengths=[...]: the lengths of the packed "
                             "documents, in order, adding up to seq_len")
        return None
    if isinstance(doc_lengths, torch.Tensor):
        if doc_lengths.is_floating_point() or doc_lengths.is_complex() or doc_lengths.dim() not in (1, 2):
            raise TypeError(f"doc_lengths must be integers, (N,) or (B, N), got a {doc_lengths.dtype} tensor of "
                            f"shape {tuple(doc_lengths.shape)}")
        doc_lengths = doc_lengths.tolist()
    if not isinstance(doc_lengths, (list, tuple)) or not doc_lengths:
        raise TypeError(f"doc_lengths must be a non-empty list of document lengths (or one list per batch row), "
                        f"got {doc_lengths!r}")
    nested = [isinstance(row, (list, tuple)) for row in doc_lengths]
    if any(nested) and not all(nested):
        raise TypeError("doc_lengths mixes lengths and lists: give one flat list of lengths, or one list per "
                        "batch row")
    rows = doc_lengths if all(nested) else [doc_lengths]
    out = []
    for b, row in enumerate(rows):
        if not row:
            raise ValueError(f"doc_lengths[{b}] is empty; every batch row holds at least one document")
        lengths = tuple(_validate.check_int("doc_lengths", n, minimum=1) for n in row)
        if sum(lengths) != seq_len:
            where = f"doc_lengths[{b}]" if len(rows) > 1 else "doc_lengths"
            raise ValueError(f"{where} add up to {sum(lengths)}, but seq_len={seq_len}: the documents must fill the "
                             f"packed sequence exactly (count the padding as a document of its own)")
        if load_balance == "per_document":
            for i, n in enumerate(lengths):
                if n % (2 * world_size):
                    raise ValueError(
                        f"document {i} has {n} tokens, which do not split into {2 * world_size} equal chunks "
                        f"(per_document sharding over world_size={world_size}); pad every document to a multiple "
                        f"of {2 * world_size}"
                    )
        out.append(lengths)
    return tuple(out)


def _order(seq_len: int, world_size: int, load_balance: str, docs: tuple[int, ...] | None) -> torch.Tensor:
    """The sequence's token indices ``(S,)`` in the order the ranks hold them: rank ``r`` holds entries
    ``r * S / W .. (r + 1) * S / W - 1`` (what torch's load balancers produce before the even split)."""
    if load_balance == "contiguous":
        return torch.arange(seq_len)
    ranks = torch.arange(world_size)
    chunk_ids = torch.stack([ranks, 2 * world_size - 1 - ranks], 1).reshape(-1)    # chunks r, 2W - 1 - r by rank
    docs = docs or ()
    # zigzag: one cut of the whole sequence; per_document: each document's own cut
    pieces = [(0, seq_len)] if load_balance == "zigzag" else list(zip(_starts(docs), docs, strict=True))
    parts = []
    for start, length in pieces:
        size = length // (2 * world_size)
        parts.append((start + chunk_ids[:, None] * size + torch.arange(size)).reshape(-1))
    return torch.cat(parts)


def _layout(seq_len: object, rank: object, world_size: object, load_balance: object, doc_lengths: object,
            ) -> tuple[int, int, int, str, _Documents | None]:
    seq_len, world_size, _ = _check_layout(seq_len, world_size, load_balance)
    rank = _validate.check_int("rank", rank, minimum=0)
    if rank >= world_size:
        raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")
    docs = _check_documents(doc_lengths, seq_len, world_size, str(load_balance))
    return seq_len, rank, world_size, str(load_balance), docs


def _orders(seq_len: int, world_size: int, load_balance: str, docs: _Documents | None) -> torch.Tensor:
    """:func:`_order` of the sequence: ``(S,)`` when every batch row shares it, ``(B, S)`` for one
    ``doc_lengths`` list per row.  It is also the rank-ordered concatenation of every rank's shard."""
    if docs is None or len(docs) == 1:
        return _order(seq_len, world_size, load_balance, None if docs is None else docs[0])
    if load_balance != "per_document":                  # the cut ignores the documents: one order for all rows
        return _order(seq_len, world_size, load_balance, None).expand(len(docs), seq_len)
    return torch.stack([_order(seq_len, world_size, load_balance, row) for row in docs])


def _rank_indices(seq_len: int, rank: int, world_size: int, load_balance: str, docs: _Documents | None,
                  device: torch.device | str | None) -> torch.Tensor:
    local = seq_len // world_size
    return _orders(seq_len, world_size, load_balance, docs)[..., rank * local:(rank + 1) * local].contiguous().to(
        device)


def shard_indices(seq_len: int, rank: int, world_size: int, *, load_balance: str = "zigzag",
                  doc_lengths: Any = None, device: torch.device | str | None = None) -> torch.Tensor:
    """The indices, in the global sequence, of the tokens that rank ``rank`` of ``world_size`` holds, in its
    order: what torch's context-parallel sharding keeps on that rank.

    Args:
        seq_len: the global (packed) sequence length ``S``.
        rank, world_size: this rank in the context-parallel group, and the group's size ``W``.
        load_balance: ``"zigzag"`` (chunks ``rank`` and ``2W - 1 - rank`` of ``2W``: torch's head-tail
            balancer), ``"contiguous"`` (block ``rank`` of ``W``), or ``"per_document"`` (each packed
            document cut into ``2W`` chunks and paired the same way, in the order of torch's per-document
            head-tail balancer, whose even split then gives each rank ``S / W`` consecutive entries).
        doc_lengths: the packed documents' lengths, in order (one list, or one list per batch row); needed
            by ``"per_document"``, and by :func:`shard_positions` to restart positions in every document.
        device: of the result.

    Returns:
        ``(S / W,)`` int64 indices, or ``(B, S / W)`` for one ``doc_lengths`` list per batch row.

    Examples:
        >>> shard_indices(8, 1, 2)
        tensor([2, 3, 4, 5])
        >>> shard_indices(16, 0, 2, load_balance="per_document", doc_lengths=[4, 8, 4])
        tensor([ 0,  3,  1,  2,  4,  5, 10, 11])
    """
    seq_len, rank, world_size, load_balance, docs = _layout(seq_len, rank, world_size, load_balance, doc_lengths)
    return _rank_indices(seq_len, rank, world_size, load_balance, docs, device)


def shard_positions(seq_len: int, rank: int, world_size: int, *, load_balance: str = "zigzag",
                    doc_lengths: Any = None, device: torch.device | str | None = None) -> torch.Tensor:
    """The positions of the tokens that rank ``rank`` of ``world_size`` holds, in its order: their global
    positions, or with ``doc_lengths`` their positions inside their own packed document (restarting at 0 in
    every document, as :func:`posenc.positions_from_cu_seqlens` gives them before sharding).

    Args:
        seq_len: the global sequence length ``S`` (a multiple of ``2 * world_size`` for zigzag, of
            ``world_size`` for contiguous sharding; per-document sharding needs every document to be a
            multiple of ``2 * world_size``).
        rank, world_size: this rank in the context-parallel group, and the group's size ``W``.
        load_balance: ``"zigzag"``, ``"contiguous"`` or ``"per_document"`` (see :func:`shard_indices`).
        doc_lengths: the packed documents' lengths, in order (one list, or one list per batch row).
        device: of the result.

    Returns:
        ``(S / W,)`` int64 positions (``(B, S / W)`` for one ``doc_lengths`` list per batch row): pass them
        as ``positions`` to any posenc encoding or, without ``doc_lengths``, to
        :func:`context_parallel_attention`.

    Raises:
        ValueError: a length that does not split evenly (with the length to pad to), a rank outside
            ``[0, world_size)``, an unknown ``load_balance``, document lengths that do not add up to
            ``seq_len`` or do not split evenly.

    Examples:
        >>> shard_positions(8, 0, 2)
        tensor([0, 1, 6, 7])
        >>> shard_positions(8, 1, 2, load_balance="contiguous")
        tensor([4, 5, 6, 7])
        >>> shard_positions(8, 0, 2, doc_lengths=[3, 5])
        tensor([0, 1, 3, 4])
    """
    seq_len, rank, world_size, load_balance, docs = _layout(seq_len, rank, world_size, load_balance, doc_lengths)
    index = _rank_indices(seq_len, rank, world_size, load_balance, docs, device)
    if docs is None:
        return index
    # each token's position inside its document: its index minus where its document starts
    within = torch.stack([torch.arange(seq_len) - torch.tensor(_starts(row)).repeat_interleave(torch.tensor(row))
                          for row in docs]).to(device)
    if len(docs) == 1:
        return within[0].index_select(0, index)
    return within.gather(1, index)


def _starts(row: tuple[int, ...]) -> list[int]:
    """Where each document of a row begins."""
    return [0, *itertools.accumulate(row)][:len(row)]


def _take(x: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """``x``'s entries at ``index`` along ``dim``: one index for every batch row, or ``(B, n)`` per row
    (batch axis 0)."""
    if index.dim() == 1:
        return x.index_select(dim, index)
    if dim == 0 or x.shape[0] != index.shape[0]:
        raise ValueError(f"one doc_lengths list per batch row needs the batch on axis 0 and the sequence on another "
                         f"axis: {index.shape[0]} rows of documents, x of shape {tuple(x.shape)} with dim={dim}")
    shape = [index.shape[0]] + [1] * (x.dim() - 1)
    shape[dim] = index.shape[1]
    full = list(x.shape)
    full[dim] = index.shape[1]
    return x.gather(dim, index.view(shape).expand(full))


def shard_sequence(x: torch.Tensor, rank: int, world_size: int, *, dim: int = 1,
                   load_balance: str = "zigzag", doc_lengths: Any = None) -> torch.Tensor:
    """The tokens of ``x`` (sequence axis ``dim``) that rank ``rank`` holds, in :func:`shard_indices` order.

    Examples:
        >>> shard_sequence(torch.arange(8)[None], 1, 2)
        tensor([[2, 3, 4, 5]])
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    dim = _seq_axis(x, dim)
    seq_len, rank, world_size, load_balance, docs = _layout(x.shape[dim], rank, world_size, load_balance,
                                                            doc_lengths)
    return _take(x, dim, _rank_indices(seq_len, rank, world_size, load_balance, docs, x.device))


def unshard_sequence(shards: list[torch.Tensor] | tuple[torch.Tensor, ...], *, dim: int = 1,
                     load_balance: str = "zigzag", doc_lengths: Any = None) -> torch.Tensor:
    """The full sequence, in its original order, from every rank's shard (in rank order, e.g. from
    ``torch.distributed.all_gather``).  Differentiable.

    Examples:
        >>> x = torch.arange(8)[None]
        >>> unshard_sequence([shard_sequence(x, r, 2) for r in range(2)])
        tensor([[0, 1, 2, 3, 4, 5, 6, 7]])
    """
    if not isinstance(shards, (list, tuple)) or not shards or not all(isinstance(s, torch.Tensor) for s in shards):
        raise TypeError("shards must be a non-empty list of tensors, one per rank in rank order")
    dim = _seq_axis(shards[0], dim)
    if any(s.shape != shards[0].shape for s in shards):
        raise ValueError(f"every shard must have one shape; got {[tuple(s.shape) for s in shards]}")
    world_size = len(shards)
    seq_len, _, world_size, load_balance, docs = _layout(world_size * shards[0].shape[dim], 0, world_size,
                                                         load_balance, doc_lengths)
    order = _orders(seq_len, world_size, load_balance, docs).to(shards[0].device)
    inverse = torch.argsort(order, dim=-1)                                  # gathered index of each position
    return _take(torch.cat(list(shards), dim), dim, inverse)


def check_shard_positions(positions: torch.Tensor, seq_len: int, *, load_balance: str = "zigzag",
                          doc_lengths: Any = None, group: Any = None) -> None:
    """Check, on every rank of ``group`` at once, that each rank's ``positions`` are the ones its shard must
    encode under this layout (what :func:`shard_positions` gives), and that the ranks agree on the layout.

    Positions that torch's or torchtitan's context-parallel sharding produced (passed among the sharded
    buffers) pass by construction; positions computed separately can silently belong to another layout
    (torch's ``context_parallel`` cuts contiguous blocks when the length is not a multiple of ``2W``, a
    per-document balancer cuts documents, a rank may use another rank's index).  On a mismatch every rank
    raises ``ValueError`` (its own finding on the faulty ranks, naming them on the others) instead of
    training on shifted positions.  One all-gather of two integers and a few reads from the device: a
    check for the first steps or a test, not for every step.

    Args:
        positions: this rank's positions, ``(S / W,)`` or ``(B, S / W)`` (``(1, S / W)`` too).
        seq_len, load_balance, doc_lengths: the layout, as for :func:`shard_positions`.
        group: the context-parallel process group (default: the world).
    """
    import zlib

    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("check_shard_positions needs an initialised torch.distributed process group "
                         "(torch.distributed.init_process_group)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if not isinstance(positions, torch.Tensor):
        raise TypeError(f"positions must be a torch.Tensor, got {type(positions).__name__}")
    problem: Exception | None = None
    try:
        want = shard_positions(seq_len, rank, world, load_balance=load_balance, doc_lengths=doc_lengths,
                               device=positions.device)
        problem = _positions_problem(positions, want, rank, world, load_balance)
    except (TypeError, ValueError) as err:
        problem = err
    layout = zlib.crc32(repr((seq_len, load_balance, doc_lengths)).encode()) & 0x7FFFFFFF
    mine = torch.tensor([problem is not None, layout], dtype=torch.int64, device=positions.device)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine, group=group)
    table = torch.stack(everyone).tolist()                                  # one read
    if problem is not None:
        raise problem
    bad = [r for r, (failed, _) in enumerate(table) if failed]
    if bad:
        raise ValueError(f"rank(s) {bad} of the group hold positions that do not match the context-parallel "
                         f"layout (their error says how); this rank stops too")
    if len({crc for _, crc in table}) > 1:
        raise ValueError("the ranks of the group passed different layouts (seq_len, load_balance or doc_lengths) "
                         "to check_shard_positions; every rank must describe the same sharding")


def _positions_problem(positions: torch.Tensor, want: torch.Tensor, rank: int, world: int,
                       load_balance: str) -> ValueError | None:
    """Why ``positions`` are not the expected shard ``want`` (None when they are)."""
    if positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
        return ValueError(f"positions must be an integer tensor, got {positions.dtype}")
    n = want.shape[-1]
    if positions.dim() not in (1, 2) or positions.shape[-1] != n or (want.dim() == 2 and positions.dim() == 2 and
                                                                     positions.shape[0] not in (1, want.shape[0])):
        return ValueError(f"rank {rank}: positions of shape {tuple(positions.shape)} are not a shard of this layout, "
                          f"which gives every rank of {world} {n} tokens ({tuple(want.shape)})")
    rows = positions if positions.dim() == 2 else positions[None]
    diff = (rows != (want if want.dim() == 2 else want[None])).nonzero()
    if diff.numel() == 0:
        return None
    b, i = diff[0].tolist()
    row = want[b] if want.dim() == 2 else want
    got = int(rows[min(b, rows.shape[0] - 1), i])                          # a (1, n) row compared with B rows
    hint = (" (torch's context_parallel cuts contiguous blocks when seq_len is not a multiple of 2W)"
            if load_balance == "zigzag" else "")
    at = f"{b}, {i}" if positions.dim() == 2 else f"{i}"
    return ValueError(f"rank {rank}: positions[{at}] = {got} where the {load_balance} layout puts "
                      f"{int(row[i])}; {int(diff.shape[0])} of {rows.numel()} positions differ{hint}; pass the "
                      f"positions among the buffers torch shards, or compute them with shard_positions for the "
                      f"layout the inputs were sharded with")


def _seq_axis(x: torch.Tensor, dim: object) -> int:
    dim = _validate.check_int("dim", dim)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim} is not an axis of a {x.dim()}-D tensor")
    return dim % x.dim()


def head_range(num_heads: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, stop)``: the heads rank ``rank`` of a ``world_size``-way tensor-parallel group holds
    (Megatron-style contiguous blocks; ``num_heads`` must be a multiple of ``world_size``).

    Examples:
        >>> head_range(8, 1, 4)
        (2, 4)
    """
    return split_heads(num_heads, rank, world_size)


def tensor_parallel_head_range(num_heads: int, group: Any = None) -> tuple[int, int]:
    """:func:`head_range` for this process in the tensor-parallel ``group`` (default: the world).
    The bias modules take the group directly too: ``AlibiBias(num_heads, tp_group=group)``."""
    import torch.distributed as dist

    return split_heads(num_heads, dist.get_rank(group), dist.get_world_size(group))


def context_parallel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    positions: torch.Tensor,
    encoding: Any = None,
    causal: bool = False,
    group: Any = None,
    seq_len: int | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    backend: str = "sdpa",
    assume_valid: bool = False,
) -> torch.Tensor:
    """Attention of this rank's queries over the whole sharded sequence (all-gather context parallelism).

    Every rank of ``group`` holds a shard of the sequence (:func:`shard_sequence`) and calls this
    with its shard's q, k, v and global ``positions``.  Keys, values and their positions are
    all-gathered (with autograd: the backward pass sums each key's gradient over the ranks whose
    queries used it, as Llama 3's context parallelism does), and :func:`posenc.attention` then
    applies ``encoding`` at global positions: rotary embeddings rotate q and the gathered keys at
    their own positions, ALiBi and T5 biases are built from the position differences, and
    ``causal`` compares global positions, so any sharding order is right.  Length-dependent rotary
    rules see the global length.

    Args:
        q: this rank's queries ``(B, H, S_local, D)``.
        k, v: this rank's keys and values ``(B, H_kv, S_local, D)`` (unrotated).
        positions: ``(S_local,)`` global positions of this shard, e.g. from :func:`shard_positions`.
        encoding: as for :func:`posenc.attention` (a rotary module, an ``AlibiBias``, a
            ``RelativePositionBias``, or None for additive encodings applied to the embeddings);
            under tensor parallelism too, the bias modules built with this rank's ``head_range``.
        causal: mask keys at later global positions.
        group: the context-parallel process group (default: the world).
        seq_len: the real global length, at most and by default ``world_size * S_local``.  A
            sequence padded to split evenly passes its unpadded length: keys at positions ``>= seq_len`` are then
            masked out (their queries' rows are padding to ignore), and length-dependent rules see
            the real length.
        scale, dropout_p, backend: as for :func:`posenc.attention`.  Dropout masks are drawn on
            each rank: seed the ranks differently (or use ``dropout_p=0``) to avoid repeating one
            mask on every shard.
        assume_valid: promise that every rank passes shards of one length, batch size, KV heads,
            head dims and dtype, positions of one dtype and the same ``seq_len``.  Without it, the
            ranks first exchange these and whether their arguments are valid (one small collective and one read from the device), so that a mistake on
            one rank raises a ``ValueError`` on every rank instead of hanging the others in the
            all-gather.

    Returns:
        ``(B, H, S_local, D)``: this rank's rows of the attention output.

    Raises:
        ValueError: positions of the wrong shape or device, shards of different lengths, ranks that
            disagree on the batch size, KV heads, head dims, dtype, positions' dtype or
            ``seq_len`` (the same error on every rank), a ``seq_len`` longer than the gathered
            sequence, padding with ``backend="flex"``, a ``torch.distributed`` group that is not
            initialised, and whatever :func:`posenc.attention` rejects.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("context_parallel_attention needs an initialised torch.distributed process group "
                         "(torch.distributed.init_process_group)")
    _validate.check_bool("assume_valid", assume_valid)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    problem = _shard_problem(q, k, v, positions, seq_len)
    if problem is None and seq_len is not None:
        seq_len = int(seq_len)
    world = dist.get_world_size(group)
    if not assume_valid:
        _agree(problem, _shard_summary(k, v, positions, seq_len), k.device, group)
    elif problem is not None:
        raise problem
    total = world * k.shape[2]
    if seq_len is not None and seq_len > total:
        raise ValueError(_long_seq_len(seq_len, world, k.shape[2]))
    seq_len = total if seq_len is None else seq_len
    k_all = _GatherSequence.apply(k, 2, group)                              # (B, H_kv, W * S_local, D), autograd
    v_all = _GatherSequence.apply(v, 2, group)
    all_positions = [torch.empty_like(positions) for _ in range(world)]
    dist.all_gather(all_positions, positions.contiguous(), group=group)     # integers: no gradient
    key_positions = torch.cat(all_positions)
    real_keys = None
    if seq_len < total:                                                     # padding at the end: not a key
        if backend == "flex":
            raise ValueError("padding (seq_len < world_size * S_local) needs backend='sdpa': flex takes no attn_mask")
        real_keys = key_positions < seq_len                                 # (W * S_local,)
    return attention(
        q, k_all, v_all, encoding=encoding, positions=positions, key_positions=key_positions, causal=causal,
        attn_mask=real_keys, scale=scale, dropout_p=dropout_p, seq_len=seq_len, backend=backend,
    )


def _shard_problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: object,
                   seq_len: object) -> Exception | None:
    """What is wrong with this rank's arguments (None if nothing), without raising yet."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            return ValueError(f"{name} must be this rank's (B, H, S_local, D) shard, got shape {tuple(t.shape)}")
    if v.shape[:3] != k.shape[:3] or v.dtype != k.dtype or v.device != k.device:
        return ValueError(f"v must be (B, H_kv, S_local, D_v) like k, with k's dtype and device; got k "
                          f"{tuple(k.shape)} {k.dtype} on {k.device} and v {tuple(v.shape)} {v.dtype} on {v.device}")
    if (q.shape[0], q.shape[2], q.shape[3]) != (k.shape[0], k.shape[2], k.shape[3]) or q.dtype != k.dtype:
        return ValueError(f"q must be (B, H, S_local, D) with k's batch size, length, head dim and dtype; got q "
                          f"{tuple(q.shape)} {q.dtype} and k {tuple(k.shape)} {k.dtype}")
    if not isinstance(positions, torch.Tensor) or positions.dtype.is_floating_point or positions.dtype == torch.bool:
        return ValueError("positions must be an integer tensor (S_local,) of global positions, e.g. from "
                          "shard_positions")
    if positions.shape != (k.shape[2],) or positions.device != k.device:
        return ValueError(f"positions must be ({k.shape[2]},) on {k.device}, the global positions of this shard; "
                          f"got {tuple(positions.shape)} on {positions.device}")
    if seq_len is not None:
        try:
            _validate.check_int("seq_len", seq_len, minimum=1)
        except (TypeError, ValueError) as err:
            return err
    return None


#: Every torch dtype, in one fixed order: a dtype travels between ranks as its index here.
_DTYPES = tuple(sorted({t for t in vars(torch).values() if isinstance(t, torch.dtype)}, key=str))

#: What the ranks must agree on, in the order :func:`_shard_summary` lists it.
_AGREED = ("S_local", "batch size B", "KV heads H_kv", "head dim D of k", "head dim D_v of v", "dtype of k and v",
           "dtype of positions", "seq_len")


def _shard_summary(k: torch.Tensor, v: torch.Tensor, positions: object, seq_len: object) -> list[int]:
    """This rank's entries of :data:`_AGREED` as integers (-1 where an argument is unusable; a
    ``seq_len`` of None is 0): what the all-gathers need to be equal on every rank."""
    B, hk, n, d = k.shape if k.dim() == 4 else (-1, -1, -1, -1)
    dv = v.shape[3] if v.dim() == 4 else -1
    pos = _DTYPES.index(positions.dtype) if isinstance(positions, torch.Tensor) else -1
    length = 0 if seq_len is None else min(seq_len, 2**63 - 1) if isinstance(seq_len, int) else -1
    return [n, B, hk, d, dv, _DTYPES.index(k.dtype), pos, length]


def _long_seq_len(seq_len: int, world: int, local: int) -> str:
    return (f"seq_len={seq_len} exceeds the gathered length world_size * S_local = {world} * {local} = "
            f"{world * local}; seq_len is the real length of a sequence padded at the end, at most the padded "
            f"length (omit it when nothing is padded)")


def _agree(problem: Exception | None, summary: list[int], device: torch.device, group: Any) -> None:
    """Exchange every rank's :func:`_shard_summary` and validity, and raise on every rank if any rank
    has a problem (its own error there, a ``ValueError`` naming it elsewhere), or the same
    ``ValueError`` on every rank if the ranks disagree on a shape, a dtype or ``seq_len``, or if
    ``seq_len`` is longer than the gathered sequence."""
    import torch.distributed as dist

    mine = torch.tensor([problem is not None, *summary], dtype=torch.int64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    table = torch.stack(everyone).tolist()                                  # one read
    bad = [r for r, (failed, *_) in enumerate(table) if failed]
    if problem is not None:
        raise problem
    if bad:
        raise ValueError(f"rank(s) {bad} of the group passed invalid arguments to context_parallel_attention "
                         f"(their error says which); this rank stops too")
    columns = list(zip(*(row[1:] for row in table), strict=True))         # one tuple per _AGREED entry, by rank
    if len(set(columns[0])) > 1:
        raise ValueError(f"every rank must hold a shard of one length, got S_local = {list(columns[0])} by rank; "
                         f"shard the sequence with shard_sequence (pad it to a multiple of the chunks and pass "
                         f"seq_len=)")
    world, local = len(table), columns[0][0]
    seq_lens = [n or world * local for n in columns[-1]]                   # None: the gathered length
    columns[-1] = tuple(seq_lens)
    differ = []
    for name, values in zip(_AGREED[1:], columns[1:], strict=True):
        if len(set(values)) > 1:
            shown = [str(_DTYPES[c]) for c in values] if name.startswith("dtype") else list(values)
            differ.append(f"{name} = {shown}")
    if differ:
        raise ValueError(f"the ranks of the group disagree on {'; '.join(differ)} (by rank); every rank must pass "
                         f"shards of one batch size, KV heads, head dims and dtype, positions of one dtype and the "
                         f"same seq_len")
    if seq_lens[0] > world * local:
        raise ValueError(_long_seq_len(seq_lens[0], world, local))


class _GatherSequence(torch.autograd.Function):
    """All-gather along ``dim`` (rank order) whose backward sums the gradient over the ranks and keeps
    this rank's slice (a reduce-scatter).

    (``torch.distributed.nn.functional.all_gather`` is deprecated, and on gloo its backward scatters
    into buffers shaped like the incoming gradients, which are strided views after a ``cat``: the
    gradients came out wrong.)
    """

    @staticmethod
    def forward(ctx, x, dim, group):
        import torch.distributed as dist

        ctx.dim, ctx.group = dim, group
        parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim)

    @staticmethod
    def backward(ctx, grad):
        return _sum_scatter(grad, ctx.dim, ctx.group), None, None


def _sum_scatter(grad: torch.Tensor, dim: int, group: Any = None, *, reduce_scatter: bool | None = None) -> torch.Tensor:
    """This rank's block (along ``dim``, rank order) of the sum of ``grad`` over the ranks: the
    backward pass of the all-gather.  A reduce-scatter for CUDA tensors (``reduce_scatter`` forces
    the choice), else an all-reduce and a slice, which every backend has."""
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    size = grad.shape[dim] // world
    if reduce_scatter if reduce_scatter is not None else grad.is_cuda:
        moved = grad.movedim(dim, 0).contiguous()                           # (W * n, ...): rank r's rows are block r
        out = torch.empty_like(moved.narrow(0, 0, size))
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        scatter(out, moved, group=group)
        return out.movedim(0, dim)
    total = grad.contiguous().clone()
    dist.all_reduce(total, group=group)
    return total.narrow(dim, rank * size, size)
