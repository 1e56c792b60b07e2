"""The torch engine of RoPE fused with the KV-cache write: a rotation, then indexed writes (not public).

The reference of :mod:`posenc.kernels.triton_cache`, with the same signature: q is rotated by
:func:`posenc.kernels.torch_rope.rope_qk`, k too (rounded once, straight to the cache dtype), and k and
v are written with ``index_put_`` at ``cache_seqlens[b] + s`` (contiguous cache) or at their slots
(paged cache), reading nothing back from the device.
"""

from __future__ import annotations

import torch

from posenc._torch.angles import working_dtype
from posenc.kernels import torch_rope

__all__ = ["prepare", "rope_and_cache"]


def rope_and_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, *, index: torch.Tensor, positions: torch.Tensor | None,
                   paged: bool, layout: str, seq_dim: int, inplace: bool, all_valid: bool | None = None
                   ) -> torch.Tensor:
    """Rotate q (returned) and write rotated k and v into the caches: the reference of the fused kernel.

    The engine interface of :mod:`posenc.kernels` (see :func:`posenc.kernels.triton_cache.rope_and_cache`):
    a rotation by the torch engine, then indexed writes with ``index_put_``.  ``all_valid`` says whether
    every token is written (None: unknown, so writes outside the cache are skipped on the device).
    Callers validate the arguments and pick this engine.
    """
    sd = seq_dim
    if paged:
        rot_pos = positions                                                 # (T,)
    else:
        S = q.shape[sd]
        arange = torch.arange(S, device=q.device)
        rot_pos = positions if positions is not None else index.long()[:, None] + arange   # (B, S)
    work = k
    if k.dtype != k_cache.dtype:                                           # round once, to the cache dtype
        wd = torch.float64 if torch.float64 in (k.dtype, k_cache.dtype) else working_dtype(k.dtype)
        work = k.to(wd)
    def rotate(x: torch.Tensor, y: torch.Tensor | None, in_place: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        try:
            return torch_rope.rope_qk(x, y, cos=cos, sin=sin, positions=rot_pos, offset=0, layout=layout, seq_dim=sd,
                                      inplace=in_place)
        except ValueError as err:                                           # the lookup caught a broken promise
            raise ValueError(str(err).replace("checked or computed", "checked")) from None

    if inplace:
        k_rot = rotate(work, None, False)[0]
    else:
        q_out, k_rot_or_none = rotate(q, work, False)
        k_rot = work if k_rot_or_none is None else k_rot_or_none         # (never None: k was given)
    if paged:
        slot = index.long()                                                 # (T,)
        block_size = k_cache.shape[1]
        where = (slot // block_size, slot % block_size)
        valid = None if all_valid else (slot >= 0) & (slot < k_cache.shape[0] * block_size)
        k_rows, v_rows = k_rot, v                                           # (T, Hk, D)
        k_dst, v_dst = k_cache, v_cache                                     # (num_blocks, block_size, Hk, D)
    else:
        B, S = q.shape[0], q.shape[sd]
        row = (index.long()[:, None] + arange).reshape(-1)                 # (B * S,) cache indices
        where = (torch.arange(B, device=q.device).repeat_interleave(S), row)
        valid = None if all_valid else (row >= 0) & (row < k_cache.shape[2])
        if sd == 2:
            k_rot, v = k_rot.transpose(1, 2), v.transpose(1, 2)             # (B, Hk, S, D) -> (B, S, Hk, D)
        k_rows, v_rows = k_rot.reshape(B * S, *k_rot.shape[2:]), v.reshape(B * S, *v.shape[2:])   # (B * S, Hk, D)
        k_dst, v_dst = k_cache.transpose(1, 2), v_cache.transpose(1, 2)     # views (B, S_max, Hk, D)
    _write_rows(k_dst, where, k_rows, valid)
    _write_rows(v_dst, where, v_rows, valid)
    if inplace:
        return rotate(q, None, True)[0]
    return q_out


def _write_rows(dst: torch.Tensor, where: tuple[torch.Tensor, torch.Tensor], rows: torch.Tensor,
                valid: torch.Tensor | None) -> None:
    """``dst[where] = rows`` (cast to ``dst``'s dtype) for the tokens that are ``valid`` (all when None),
    without reading anything back from the device.

    A token that is not written repeats the write of the first written token (the same index and the
    same value, so duplicates cannot conflict); when no token is written, they all write back the value
    already at ``dst[0, 0]``.
    """
    rows = rows if rows.dtype == dst.dtype else rows.to(dst.dtype)
    if valid is None:
        dst.index_put_(where, rows)
        return
    n = valid.shape[0]
    if not n:
        return
    first = valid.to(torch.uint8).argmax()                                # the first written token (0 if none)
    src = torch.where(valid, torch.arange(n, device=valid.device), first)  # (N,) the token whose write to repeat
    keep = valid[src]                                                     # False only when no token is written
    where = (torch.where(keep, where[0][src], 0), torch.where(keep, where[1][src], 0))
    keep_rows = keep.reshape(n, *([1] * (rows.dim() - 1)))
    dst.index_put_(where, torch.where(keep_rows, rows[src], dst[where]))


def prepare(q, k, v, k_cache, v_cache, cos, sin, index, positions, paged: bool, layout: str, seq_dim: int,
            inplace: bool):
    """The eager call of :func:`rope_and_cache` for calls like this one: ``write(q, k, v, k_cache,
    v_cache, cos, sin, index, positions, all_valid=None) -> q_out``."""

    def write(q, k, v, k_cache, v_cache, cos, sin, index, positions, all_valid=None):
        return rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, index=index, positions=positions, paged=paged,
                              layout=layout, seq_dim=seq_dim, inplace=inplace, all_valid=all_valid)
    return write
