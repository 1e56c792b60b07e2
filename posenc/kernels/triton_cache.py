"""Fused RoPE + KV-cache write for decoding in one Triton launch (contiguous and paged caches).

Each program takes one token.  It finds where the token goes in the cache (row ``b`` at index
``cache_seqlens[b] + s`` of a contiguous ``(B, Hk, S_max, D)`` cache, or block
``slots[t] // block_size``, row ``slots[t] % block_size`` of a paged ``(num_blocks, block_size, Hk, D)``
cache), reads one row of the exact float32 cos/sin tables, rotates every head of k in float32 and
rounds it once straight to the cache dtype, copies v (and k's pass-through features) into the cache,
and then rotates q, in place or into a new tensor.  A write that would land outside the cache
(a negative slot: padding; or a broken ``assume_valid`` promise) is skipped, so the kernel never
writes outside the caches; a position outside the tables gives NaN rows, as in
:mod:`posenc.kernels.triton_rope`, whose ``_rotate_heads`` does the rotations.

k and v of a token are read before its q is written, and q may be rotated in place when it shares
a buffer with k and v (views of one fused qkv projection) as long as no element is shared.

An eager call launches the compiled kernel directly through a launch specialised once per signature
(:mod:`posenc.kernels.triton_launch`, :func:`prepare`).  While tracing, the launch is one of two custom
ops, ``posenc::rope_and_cache`` (returns a new q, mutates the caches) and ``posenc::rope_and_cache_``
(also mutates q), each with a fake implementation, so ``torch.compile(fullgraph=True)`` traces it.
There is no autograd formula: this is for inference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from posenc.kernels.triton_launch import Launch
from posenc.kernels.triton_rope import _converted, _float32_tables, _rotate_heads, num_warps, table_row

__all__ = ["prepare", "rope_and_cache"]


@triton.jit
def _copy_heads(src_ptr, dst_ptr, n_heads, s_h, s_d, o_h, o_d, start, stop,
                BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr):
    """Copy features ``[start, stop)`` of ``n_heads`` heads of one token, rounding once to ``dst``'s dtype."""
    for h0 in range(0, n_heads, BLOCK_H):
        offs_h = (h0 + tl.arange(0, BLOCK_H))[:, None].to(tl.int64)   # (int64: a row may pass 2**31 elements)
        for c0 in range(start, stop, BLOCK_C):
            offs_c = (c0 + tl.arange(0, BLOCK_C))[None, :]
            m = (offs_h < n_heads) & (offs_c < stop)
            x = tl.load(src_ptr + offs_h * s_h + offs_c * s_d, mask=m, other=0.0).to(tl.float32)
            tl.store(dst_ptr + offs_h * o_h + offs_c * o_d, x.to(dst_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rope_cache_kernel(
    q_ptr, k_ptr, v_ptr, qo_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, pos_ptr, idx_ptr,
    S, HQ, HK, P, CAP, BLOCK_SIZE,
    sq_b, sq_s, sq_h, sq_d, sk_b, sk_s, sk_h, sk_d, sv_b, sv_s, sv_h, sv_d, so_b, so_s, so_h, so_d,
    skc_blk, skc_row, skc_h, skc_d, svc_blk, svc_row, svc_h, svc_d,
    sp_b, sp_s, s_idx, st_row, st_col,
    DQ: tl.constexpr, DK: tl.constexpr, H2: tl.constexpr, PAGED: tl.constexpr, HAS_POS: tl.constexpr, INTERLEAVED: tl.constexpr, COPY_Q: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HC: tl.constexpr, BLOCK_C: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    b = tok // S                                                        # paged: S = 1, so b is the token
    s = tok % S
    if PAGED:
        slot = tl.load(idx_ptr + tok * s_idx).to(tl.int64)
        valid = (slot >= 0) & (slot < CAP)
        slot = tl.where(valid, slot, 0)
        blk = slot // BLOCK_SIZE
        row = slot % BLOCK_SIZE
        pos = tl.load(pos_ptr + tok * sp_b).to(tl.int64)
    else:
        row = tl.load(idx_ptr + b * s_idx).to(tl.int64) + s             # cache_seqlens[b] + s
        valid = (row >= 0) & (row < CAP)
        blk = b
        if HAS_POS:
            pos = tl.load(pos_ptr + b * sp_b + s * sp_s).to(tl.int64)
        else:
            pos = row
    c, sn = table_row(cos_ptr, sin_ptr, pos, P, H2, st_row, st_col, BLOCK_D)
    if valid:
        k_src = k_ptr + b * sk_b + s * sk_s
        kc_dst = kc_ptr + blk * skc_blk + row * skc_row
        _rotate_heads(k_src, kc_dst, HK, sk_h, sk_d, skc_h, skc_d, c, sn, H2, INTERLEAVED, BLOCK_H, BLOCK_D)
        _copy_heads(k_src, kc_dst, HK, sk_h, sk_d, skc_h, skc_d, 2 * H2, DK, BLOCK_HC, BLOCK_C)   # pass-through
        _copy_heads(v_ptr + b * sv_b + s * sv_s, vc_ptr + blk * svc_blk + row * svc_row, HK, sv_h, sv_d, svc_h,
                    svc_d, 0, DK, BLOCK_HC, BLOCK_C)
    q_src = q_ptr + b * sq_b + s * sq_s
    q_dst = qo_ptr + b * so_b + s * so_s
    _rotate_heads(q_src, q_dst, HQ, sq_h, sq_d, so_h, so_d, c, sn, H2, INTERLEAVED, BLOCK_H, BLOCK_D)
    if COPY_Q:
        _copy_heads(q_src, q_dst, HQ, sq_h, sq_d, so_h, so_d, 2 * H2, DQ, BLOCK_HC, BLOCK_C)


def _token_axes(t: torch.Tensor, paged: bool, seq_dim: int) -> tuple[int, int, int, int, int]:
    """``(heads, stride_b, stride_s, stride_h, stride_d)`` of q, k or v: ``(T, H, D)`` when paged (the
    token is ``b``, ``s`` is always 0), else ``(B, H, S, D)`` (``seq_dim`` 2) or ``(B, S, H, D)`` (1)."""
    if paged:
        return t.shape[1], t.stride(0), 0, t.stride(1), t.stride(2)
    if seq_dim == 2:
        return t.shape[1], t.stride(0), t.stride(2), t.stride(1), t.stride(3)
    return t.shape[2], t.stride(0), t.stride(1), t.stride(2), t.stride(3)


def _cache_axes(c: torch.Tensor, paged: bool) -> tuple[int, int, int, int]:
    """``(stride_block, stride_row, stride_h, stride_d)``: paged ``(num_blocks, block_size, Hk, D)``, or
    contiguous ``(B, Hk, S_max, D)`` (the batch row is the "block", the cache index the "row")."""
    if paged:
        return c.stride(0), c.stride(1), c.stride(2), c.stride(3)
    return c.stride(0), c.stride(2), c.stride(1), c.stride(3)


def launch_args(q, k, v, qo, k_cache, v_cache, cos, sin, index, positions, paged: bool, interleaved: bool,
                seq_dim: int) -> tuple[tuple[int], tuple, dict]:
    """``(grid, args, meta)`` of the launch :func:`launch` makes (the kernel's arguments, its
    constexprs and ``num_warps``): a pure function of shapes, strides and dtypes, so meta tensors
    do and the specializations can be compiled without a GPU."""
    if paged:
        B, S = q.shape[0], 1
        cap, block_size = k_cache.shape[0] * k_cache.shape[1], k_cache.shape[1]
    else:
        B, S = q.shape[0], q.shape[seq_dim]
        cap, block_size = k_cache.shape[2], 1
    h2 = cos.shape[-1]
    hq, *sq = _token_axes(q, paged, seq_dim)
    hk, *sk = _token_axes(k, paged, seq_dim)
    _, *sv = _token_axes(v, paged, seq_dim)
    _, *so = _token_axes(qo, paged, seq_dim)
    if positions is None:
        sp = (0, 0)
    elif positions.dim() == 1:
        sp = (positions.stride(0), 0) if paged else (0, positions.stride(0))
    else:
        sp = (positions.stride(0) if positions.shape[0] > 1 else 0, positions.stride(1))
    dq, dk = q.shape[-1], k.shape[-1]
    block_d = triton.next_power_of_2(h2)
    block_h = max(1, min(triton.next_power_of_2(max(hq, hk, 1)), max(1, 4096 // block_d)))
    block_c = min(triton.next_power_of_2(max(dq, dk)), 1024)
    block_hc = max(1, min(triton.next_power_of_2(max(hq, hk, 1)), max(1, 4096 // block_c)))
    args = (
        q, k, v, qo, k_cache, v_cache, cos, sin, positions if positions is not None else index, index,
        S, hq, hk, cos.shape[0], cap, block_size,
        *sq, *sk, *sv, *so, *_cache_axes(k_cache, paged), *_cache_axes(v_cache, paged),
        *sp, index.stride(0), cos.stride(0), cos.stride(1),
    )
    tile = min(block_h * block_d * (2 if interleaved else 1), block_hc * block_c)   # the smaller tile sets the warps
    meta = dict(DQ=dq, DK=dk, H2=h2, PAGED=paged, HAS_POS=positions is not None, INTERLEAVED=interleaved,
                COPY_Q=qo is not q and 2 * h2 < dq, BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_HC=block_hc,
                BLOCK_C=block_c, num_warps=num_warps(tile, min(q.element_size(), k_cache.element_size())))
    return (B * S,), args, meta


#: The kernel's tensor arguments come first; a call changes nothing else.
_TENSORS = 10


def specialize(q, k, v, qo, k_cache, v_cache, cos, sin, index, positions, paged: bool, interleaved: bool,
               seq_dim: int) -> Launch:
    """The launch of calls like this one (same shapes, strides and dtypes), specialised once; call it
    with ``(q, k, v, qo, k_cache, v_cache, cos, sin, positions or index, index)``."""
    grid, args, meta = launch_args(q, k, v, qo, k_cache, v_cache, cos, sin, index, positions, paged, interleaved,
                                   seq_dim)
    return Launch(_rope_cache_kernel, grid, args[_TENSORS:], meta, _TENSORS)


def launch(q, k, v, qo, k_cache, v_cache, cos, sin, index, positions, paged: bool, interleaved: bool,
           seq_dim: int) -> None:
    """Rotate ``q`` into ``qo`` (they may be the same tensor) and write rotated ``k`` and ``v`` into the
    caches, on q's device (a tensor on ``cuda:1`` works whatever the current device)."""
    grid, args, meta = launch_args(q, k, v, qo, k_cache, v_cache, cos, sin, index, positions, paged, interleaved,
                                   seq_dim)
    if grid[0] == 0:
        return
    Launch(_rope_cache_kernel, grid, args[_TENSORS:], meta, _TENSORS).fallback(args[:_TENSORS])


class _CacheWrite:
    """The eager rotation + cache write of calls with one signature (see :func:`rope_and_cache`)."""

    __slots__ = ("launch", "inplace", "convert")

    def __init__(self, launch: Launch | None, inplace: bool, convert: bool):
        self.launch, self.inplace, self.convert = launch, inplace, convert

    def __call__(self, q, k, v, k_cache, v_cache, cos, sin, index, positions, all_valid=None):
        if self.convert:
            cos, sin = _float32_tables(cos, sin)
        qo = q if self.inplace else torch.empty_like(q)
        if self.launch is not None:                                    # (None: no token to write)
            self.launch(q, k, v, qo, k_cache, v_cache, cos, sin, index if positions is None else positions, index)
        return qo


def prepare(q, k, v, k_cache, v_cache, cos, sin, index, positions, paged: bool, layout: str, seq_dim: int,
            inplace: bool) -> _CacheWrite:
    """The eager call of :func:`rope_and_cache` for calls like this one, specialised once (tables that
    are not float32 with one pair of strides are converted by every call): ``write(q, k, v, k_cache,
    v_cache, cos, sin, index, positions, all_valid=None) -> q_out`` (``all_valid`` is not read: the
    kernel skips writes outside the cache)."""
    convert = _converted(cos, sin)
    cos, sin = _float32_tables(cos, sin)
    qo = q if inplace else torch.empty_like(q, device="meta")
    tokens = q.shape[0] * (1 if paged else q.shape[seq_dim])
    launch = None if not tokens else specialize(q, k, v, qo, k_cache, v_cache, cos, sin, index, positions, paged,
                                                layout == "interleaved", seq_dim)
    return _CacheWrite(launch, inplace, convert)


@torch.library.custom_op("posenc::rope_and_cache", mutates_args=("k_cache", "v_cache"))
def _rope_and_cache_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, index: torch.Tensor,
                       positions: torch.Tensor | None, paged: bool, interleaved: bool,
                       seq_dim: int) -> torch.Tensor:
    qo = torch.empty_like(q)
    launch(q, k, v, qo, k_cache, v_cache, cos, sin, index, positions, paged, interleaved, seq_dim)
    return qo


@_rope_and_cache_op.register_fake
def _(q, k, v, k_cache, v_cache, cos, sin, index, positions, paged, interleaved, seq_dim):
    return torch.empty_like(q)


@torch.library.custom_op("posenc::rope_and_cache_", mutates_args=("q", "k_cache", "v_cache"))
def _rope_and_cache_inplace_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                               v_cache: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, index: torch.Tensor,
                               positions: torch.Tensor | None, paged: bool, interleaved: bool,
                               seq_dim: int) -> None:
    launch(q, k, v, q, k_cache, v_cache, cos, sin, index, positions, paged, interleaved, seq_dim)


@_rope_and_cache_inplace_op.register_fake
def _(q, k, v, k_cache, v_cache, cos, sin, index, positions, paged, interleaved, seq_dim):
    return None


def rope_and_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, *, index: torch.Tensor, positions: torch.Tensor | None,
                   paged: bool, layout: str, seq_dim: int, inplace: bool, all_valid: bool | None = None) -> torch.Tensor:
    """Rotate q (returned) and write rotated k and v into the caches, in one launch.

    The engine interface of :mod:`posenc.kernels`.  ``index`` is ``cache_seqlens`` ``(B,)``
    (contiguous cache, q ``(B, H, S, D)`` with ``seq_dim`` 2 or ``(B, S, H, D)`` with ``seq_dim`` 1)
    or ``slots`` ``(T,)`` (``paged``, q ``(T, H, D)``).  ``inplace`` rotates q itself; the caller has
    made sure q shares no element with k or v.  Callers validate the arguments and pick this engine.
    """
    if torch.compiler.is_compiling():
        cos, sin = _float32_tables(cos, sin)
        interleaved = layout == "interleaved"
        if inplace:
            _rope_and_cache_inplace_op(q, k, v, k_cache, v_cache, cos, sin, index, positions, paged, interleaved,
                                       seq_dim)
            return q
        return _rope_and_cache_op(q, k, v, k_cache, v_cache, cos, sin, index, positions, paged, interleaved, seq_dim)
    return prepare(q, k, v, k_cache, v_cache, cos, sin, index, positions, paged, layout, seq_dim, inplace)(
        q, k, v, k_cache, v_cache, cos, sin, index, positions)
