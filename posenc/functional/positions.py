"""Per-token positions for padded batches."""

from __future__ import annotations

import torch

from posenc import _validate
from posenc._torch.varlen import check_cu_seqlens, check_varlen_offset, varlen_positions, varlen_range

__all__ = ["positions_from_cu_seqlens", "positions_from_mask", "positions_from_segment_ids"]


def positions_from_mask(mask: torch.Tensor, *, offset: int | torch.Tensor = 0) -> torch.Tensor:
    """Positions of the real tokens in a padded batch.

    Real tokens (``mask`` true/nonzero) are numbered ``offset, offset + 1, ...`` from left to right in
    each row, whatever padding comes before them, so a left-padded row gets the same positions as
    the unpadded sequence.  Padding tokens get position ``0`` (a valid index for every table; their
    outputs are meant to be masked out of attention anyway).

    Args:
        mask: ``(B, S)`` bool or integer tensor, nonzero for real tokens.
        offset: first position of each row: an int or a ``(B,)`` integer tensor (e.g. the number of
            tokens already in a KV cache).

    Returns:
        ``(B, S)`` int64 positions.

    Examples:
        >>> positions_from_mask(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]]))
        tensor([[0, 0, 0, 1, 2],
                [0, 1, 2, 3, 0]])
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor of shape (B, S), got {type(mask).__name__}")
    if mask.dim() != 2:
        raise ValueError(f"mask must have shape (B, S), got shape {tuple(mask.shape)}; add a batch dim with mask[None]")
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise TypeError(f"mask must be bool or integer, got dtype {mask.dtype}; use mask.bool()")
    real = mask != 0                                            # (B, S)
    pos = torch.cumsum(real, dim=-1, dtype=torch.int64) - 1     # (B, S)
    if isinstance(offset, torch.Tensor):
        if offset.dtype.is_floating_point or offset.dtype.is_complex or offset.dtype == torch.bool:
            raise TypeError(
                f"offset must be an int or an integer tensor, got dtype {offset.dtype}; cast it with offset.long()"
            )
        if offset.device != mask.device:
            raise ValueError(f"offset is on {offset.device} but mask on {mask.device}; move it with .to(mask.device)")
        if offset.shape not in ((), (mask.shape[0],)):
            raise ValueError(
                f"offset must be an int or an integer tensor of shape ({mask.shape[0]},), "
                f"got dtype {offset.dtype} shape {tuple(offset.shape)}"
            )
        pos = pos + offset.to(torch.int64).reshape(-1, 1)
    else:
        offset = _validate.check_int("offset", offset)
        if not -(2**63) <= offset <= 2**63 - max(mask.shape[-1], 1):
            raise ValueError(f"offset={offset} puts positions outside int64; pass an offset within [-2**63, 2**63 - S]")
        pos = pos + offset
    return torch.where(real, pos, torch.zeros_like(pos))


def positions_from_segment_ids(segment_ids: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 wherever the segment id changes along a row.

    For packed batches ``[A; B; ...]`` this gives each document the positions it would have alone,
    for every encoding family (additive tables, rotary, attention biases).

    Args:
        segment_ids: ``(B, S)`` or ``(S,)`` integer ids; a new segment starts where the id differs
            from the previous token's.

    Returns:
        int64 positions of the same shape.

    Examples:
        >>> positions_from_segment_ids(torch.tensor([[0, 0, 0, 1, 1, 2], [5, 5, 5, 5, 7, 7]]))
        tensor([[0, 1, 2, 0, 1, 0],
                [0, 1, 2, 3, 0, 1]])
    """
    if not isinstance(segment_ids, torch.Tensor):
        raise TypeError(f"segment_ids must be a torch.Tensor, got {type(segment_ids).__name__}")
    if segment_ids.dtype.is_floating_point or segment_ids.dtype.is_complex:
        raise TypeError(f"segment_ids must hold integers, got dtype {segment_ids.dtype}")
    if segment_ids.dim() not in (1, 2):
        raise ValueError(f"segment_ids must have shape (B, S) or (S,), got {tuple(segment_ids.shape)}")
    ids = segment_ids if segment_ids.dim() == 2 else segment_ids[None]    # (B, S)
    idx = torch.arange(ids.shape[-1], device=ids.device).expand_as(ids)   # (B, S)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    first = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=-1).values
    pos = idx - first
    return pos if segment_ids.dim() == 2 else pos[0]


def positions_from_cu_seqlens(
    cu_seqlens: torch.Tensor, *, offset: int | torch.Tensor = 0, total: int | None = None
) -> torch.Tensor:
    """Positions of the tokens of a packed batch in flash-attention's varlen format.

    ``N`` sequences lie back to back in ``T`` tokens, and ``cu_seqlens`` ``(N + 1,)`` holds their
    cumulative lengths ``[0, len_0, len_0 + len_1, ..., T]``.  Each sequence is numbered from
    ``offset`` (or ``offset[i]``), as if it were alone: what every encoding family needs for
    packed training batches, and, with per-sequence offsets, for decoding against cached tokens.

    Args:
        cu_seqlens: ``(N + 1,)`` int32/int64 cumulative lengths, starting at 0, never decreasing.
        offset: first position of every sequence: an int, or an integer tensor ``(N,)``.
        total: the number of tokens ``T``; default ``cu_seqlens[-1]`` (read from the device;
            required on the meta device).

    Returns:
        ``(T,)`` int64 positions.  The values of ``cu_seqlens`` are checked (one read from the
        device).

    Raises:
        TypeError: non-integer ``cu_seqlens`` or ``offset``.
        ValueError: a wrong shape, or cumulative lengths that do not start at 0, decrease or do
            not end at ``total``.

    Examples:
        >>> positions_from_cu_seqlens(torch.tensor([0, 3, 5, 9]))
        tensor([0, 1, 2, 0, 1, 0, 1, 2, 3])
        >>> positions_from_cu_seqlens(torch.tensor([0, 1, 2]), offset=torch.tensor([7, 4]))
        tensor([7, 4])
    """
    device = cu_seqlens.device if isinstance(cu_seqlens, torch.Tensor) else torch.device("cpu")
    cu_seqlens = check_cu_seqlens(cu_seqlens, device)
    offset = check_varlen_offset(offset, cu_seqlens.shape[0] - 1, device)
    if total is None:
        if cu_seqlens.is_meta:
            raise ValueError("cu_seqlens on the meta device holds no values: pass total= (the number of tokens T)")
        total = int(cu_seqlens[-1])
    total = _validate.check_int("total", total, minimum=0)
    if not cu_seqlens.is_meta:
        varlen_range(cu_seqlens, total, offset)
    return varlen_positions(cu_seqlens, total, offset)
