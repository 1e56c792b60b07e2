"""Packed variable-length batches described by ``cu_seqlens`` (not public).

flash-attention's varlen convention: the tokens of ``N`` sequences are concatenated into one
``(T, H, D)`` tensor, and the int32/int64 vector ``cu_seqlens`` ``(N + 1,)`` holds the cumulative
lengths ``[0, len_0, len_0 + len_1, ..., T]``: sequence ``i`` is tokens ``cu_seqlens[i] ..
cu_seqlens[i + 1] - 1``.  Its positions restart at 0, or at ``offset[i]`` (tokens already cached for
that sequence, when decoding).
"""

from __future__ import annotations

import torch

from posenc._torch.checks import check_offset

_FIX = "build it as torch.cat([zeros(1), lengths.cumsum(0)]) (int32 or int64) on the tokens' device"


def check_cu_seqlens(cu_seqlens: object, device: torch.device) -> torch.Tensor:
    """The shape, dtype and device of ``cu_seqlens`` (its values are checked by :func:`varlen_range`)."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be an integer torch.Tensor (N + 1,), got {type(cu_seqlens).__name__}; {_FIX}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens must hold int32 or int64 cumulative lengths, got dtype {cu_seqlens.dtype}; {_FIX}")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(
            f"cu_seqlens must have shape (N + 1,) with N >= 1 sequences, got {tuple(cu_seqlens.shape)}; {_FIX}"
        )
    if cu_seqlens.device != device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but the tokens on {device}; move it with .to()")
    return cu_seqlens


def check_varlen_offset(offset: object, num_seqs: int, device: torch.device) -> int | torch.Tensor:
    """``offset`` of a packed batch: an int for every sequence, or an integer tensor ``(N,)``."""
    if not isinstance(offset, torch.Tensor):
        offset = check_offset(offset)
        if not isinstance(offset, int) or _INT64_MIN <= offset <= _INT64_MAX:
            return offset
        raise ValueError(f"offset={offset} lies outside int64; pass a first position within [-2**63, 2**63 - 1]")
    if offset.dtype.is_floating_point or offset.dtype.is_complex or offset.dtype == torch.bool:
        raise TypeError(f"offset must be an int or an integer tensor (N,), got dtype {offset.dtype}; use .long()")
    if offset.shape != (num_seqs,):
        raise ValueError(
            f"offset must be an int or one first position per sequence, shape ({num_seqs},) for "
            f"cu_seqlens of {num_seqs + 1} entries; got shape {tuple(offset.shape)}"
        )
    if offset.device != device:
        raise ValueError(f"offset is on {offset.device} but the tokens on {device}; move it with .to()")
    return offset


_INT64_MIN, _INT64_MAX = torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max


def varlen_range(cu_seqlens: torch.Tensor, total: int, offset: int | torch.Tensor) -> tuple[int, int]:
    """Check the values of ``cu_seqlens`` against ``total`` tokens, and ``offset`` against int64,
    with one read from the device, and return the ``(min, max)`` position of the packed batch
    (``(0, -1)`` when it is empty).

    Nothing here can overflow: a decrease is found by comparing neighbours (a difference of two
    int64 values may wrap), and a last position ``offset[i] + len_i - 1`` past int64 is found by
    comparing ``offset[i]`` with ``2**63 - len_i`` before adding.
    """
    cu = cu_seqlens.long()
    decrease = (cu[1:] < cu[:-1]).any()
    lengths = (cu[1:] - cu[:-1]).clamp_(min=0)                           # (N,) exact when nothing decreases
    starts = offset.long() if isinstance(offset, torch.Tensor) else torch.full_like(lengths, offset)
    nonempty = lengths > 0
    steps = (lengths - 1).clamp_(min=0)                                  # last position = start + steps
    past = nonempty & (starts > _INT64_MAX - steps)                      # start + steps would pass int64
    fits = nonempty & ~past
    worst = past.long().argmax()                                         # the first such sequence (N >= 1)
    stats = torch.stack([
        cu[0], cu[-1], decrease.long(), past.any().long(), worst, starts[worst], lengths[worst],
        torch.where(nonempty, starts, _INT64_MAX).min(),
        torch.where(fits, starts + torch.where(fits, steps, 0), _INT64_MIN).max(),
    ]).tolist()                                                          # one transfer
    first, last, decreases, overflow, worst, start, length, lo, hi = stats
    if first != 0 or last != total or decreases:
        raise ValueError(
            f"cu_seqlens must start at 0, never decrease and end at the number of tokens T={total}; got first "
            f"{first}, last {last}{', and a decrease' if decreases else ''}; {_FIX}"
        )
    if overflow:
        which = f"offset[{worst}]={start}" if isinstance(offset, torch.Tensor) else f"offset={start}"
        raise ValueError(
            f"{which} puts the last position of sequence {worst} (length {length}) past int64 (2**63 - 1); "
            f"pass offsets with offset + length - 1 <= 2**63 - 1"
        )
    return (lo, hi) if total else (0, -1)


def varlen_positions(cu_seqlens: torch.Tensor, total: int, offset: int | torch.Tensor,
                     seq: torch.Tensor | None = None) -> torch.Tensor:
    """``(T,)`` int64 positions of a packed batch (no reads from the device); ``seq`` is
    :func:`sequence_ids` when the caller has it already.

    Token ``t`` of sequence ``i`` (``cu[i] <= t < cu[i + 1]``) is at ``t - cu[i] + offset[i]``.
    """
    cu = cu_seqlens.long()
    seq = sequence_ids(cu, total) if seq is None else seq
    pos = torch.arange(total, device=cu.device) - cu[seq]
    if isinstance(offset, torch.Tensor):
        return pos + offset.long()[seq]
    return pos + offset if offset else pos


def sequence_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """``(T,)`` int64 index of each token's sequence (no reads from the device)."""
    tokens = torch.arange(total, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens.long()[1:], tokens, right=True).clamp_(max=cu_seqlens.shape[0] - 2)


def check_varlen_call(q: torch.Tensor, k: torch.Tensor | None, rotary_dim: int, positions: object,
                      cu_seqlens: object, offset: object) -> tuple[torch.Tensor, int | torch.Tensor]:
    """Check a rotation of packed tokens; returns ``(cu_seqlens, offset)`` checked."""
    _check_varlen_qk(q, k, rotary_dim)
    if positions is not None:
        raise ValueError("pass either cu_seqlens or positions, not both: cu_seqlens defines the positions")
    cu = check_cu_seqlens(cu_seqlens, q.device)
    return cu, check_varlen_offset(offset, cu.shape[0] - 1, q.device)


def _check_varlen_qk(q: torch.Tensor, k: torch.Tensor | None, rotary_dim: int | None) -> None:
    """Packed queries ``(T, H, D)`` and keys ``(T, H_k, D)`` (or None)."""
    for name, t in (("q", q), ("k", k)):
        if t is None and name == "k":
            continue
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating torch.Tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        if t.dim() != 3:
            raise ValueError(
                f"with cu_seqlens, {name} must be packed tokens (T, H, D), got shape {tuple(t.shape)}; "
                f"for a padded (B, S, H, D) batch pass positions instead"
            )
        if rotary_dim is not None and t.shape[-1] < rotary_dim:
            raise ValueError(f"{name} has head dim {t.shape[-1]} < rotary dim {rotary_dim}")
    if k is not None:
        if k.shape[0] != q.shape[0]:
            raise ValueError(f"k {tuple(k.shape)} and q {tuple(q.shape)} must hold the same tokens T")
        if k.device != q.device:
            raise ValueError(f"k is on {k.device} but q on {q.device}; move it with .to()")

