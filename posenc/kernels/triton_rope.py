"""Fused RoPE for q and k in one Triton launch (both layouts, partial rotary, GQA, any strides).

Each program takes one token ``(b, s)``: it reads the token's position, one row of the exact
float32 cos/sin tables (a position outside the table reads nothing and gives NaN rows, so a
broken ``assume_valid`` promise is visible and never reads past the table) (GPU ``sin``/``cos`` of large float32 angles would lose the exactness of the
tables), and rotates every head of q and then of k in float32, rounding once to the output dtype.
q and k are read once and written once, which is the memory-bound minimum.  The backward pass is
the same kernel rotating by ``-theta`` (``CONJ``): rotations are orthogonal, so the gradient of
``R x`` is ``R^T g``; nothing is saved but the tables and the positions.

Host path.  An eager call launches the compiled kernel directly (:mod:`posenc.kernels.triton_launch`):
:func:`prepare` specialises a call once (grid, sizes and strides, compile-time settings) and the
rotation it returns allocates the outputs and launches, nothing more.  Training in eager mode goes
through a plain ``torch.autograd.Function`` whose backward rotates the incoming gradients as they are
(any strides, stride-0 gradients included) in one launch for q and k, into the gradient buffers
themselves when autograd alone holds them.  While tracing (``torch.compile``, ``torch.export``) the
same launch is the custom op ``posenc::rope_qk``, with a fake implementation and an autograd
formula, so compiled graphs hold one opaque node and no graph break.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from posenc.kernels.torch_rope import unpack_tables
from posenc.kernels.triton_launch import Launch

__all__ = ["prepare", "rope_qk"]


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, n_heads, s_h, s_d, o_h, o_d, c, sn, H2,
                  INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rotate the first 2 * H2 features of ``n_heads`` heads of one token (float32 math)."""
    offs_d = tl.arange(0, BLOCK_D)
    if INTERLEAVED:
        # pairs (2i, 2i + 1): load each row contiguously, split the pairs in registers, join back
        offs = tl.arange(0, 2 * BLOCK_D)
        d = offs[None, :]
        for h0 in range(0, n_heads, BLOCK_H):
            offs_h = (h0 + tl.arange(0, BLOCK_H))[:, None].to(tl.int64)   # (int64: a row may pass 2**31 elements)
            m = (offs_h < n_heads) & (offs < 2 * H2)[None, :]
            x = tl.load(src_ptr + offs_h * s_h + d * s_d, mask=m, other=0.0).to(tl.float32)
            x1, x2 = tl.split(tl.reshape(x, (BLOCK_H, BLOCK_D, 2)))
            out = tl.reshape(tl.join(x1 * c - x2 * sn, x2 * c + x1 * sn), (BLOCK_H, 2 * BLOCK_D))
            tl.store(dst_ptr + offs_h * o_h + d * o_d, out.to(dst_ptr.dtype.element_ty), mask=m)
    else:
        # pairs (i, i + d/2): two contiguous half-rows
        d1 = offs_d[None, :]
        d2 = (offs_d + H2)[None, :]
        for h0 in range(0, n_heads, BLOCK_H):
            offs_h = (h0 + tl.arange(0, BLOCK_H))[:, None].to(tl.int64)   # (int64: a row may pass 2**31 elements)
            m = (offs_h < n_heads) & (offs_d < H2)[None, :]
            x1 = tl.load(src_ptr + offs_h * s_h + d1 * s_d, mask=m, other=0.0).to(tl.float32)
            x2 = tl.load(src_ptr + offs_h * s_h + d2 * s_d, mask=m, other=0.0).to(tl.float32)
            tl.store(dst_ptr + offs_h * o_h + d1 * o_d, (x1 * c - x2 * sn).to(dst_ptr.dtype.element_ty), mask=m)
            tl.store(dst_ptr + offs_h * o_h + d2 * o_d, (x2 * c + x1 * sn).to(dst_ptr.dtype.element_ty), mask=m)


@triton.jit
def table_row(cos_ptr, sin_ptr, pos, P, H2, st_row, st_col, BLOCK_D: tl.constexpr):
    """The cos/sin row of position ``pos``, ``(1, BLOCK_D)`` each, in float32: 0 in the lanes past
    ``H2``, and NaN in every lane for a position outside the ``P`` rows (never a read past the table)."""
    offs_d = tl.arange(0, BLOCK_D)
    pos_d = offs_d.to(tl.int64) * 0 + pos                                   # the position, per feature
    inside = (pos_d >= 0) & (pos_d < P)
    row = tl.where(inside, pos_d, 0)
    mask_d = (offs_d < H2) & inside
    c = tl.load(cos_ptr + row * st_row + offs_d * st_col, mask=mask_d, other=0.0)
    sn = tl.load(sin_ptr + row * st_row + offs_d * st_col, mask=mask_d, other=0.0)
    return tl.where(inside, c, float("nan"))[None, :], tl.where(inside, sn, float("nan"))[None, :]


@triton.jit(do_not_specialize=["offset"])
def _rope_qk_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, pos_ptr, cu_ptr, soff_ptr, offset,
    S, HQ, HK, P, sq_b, sq_s, sq_h, sq_d, sk_b, sk_s, sk_h, sk_d,
    so_b, so_s, so_h, so_d, sko_b, sko_s, sko_h, sko_d,
    sp_b, sp_s, st_row, st_col, n_seqs, n_steps, n_tokens,
    H2: tl.constexpr, HAS_POS: tl.constexpr, HAS_K: tl.constexpr, INTERLEAVED: tl.constexpr, CONJ: tl.constexpr,
    HAS_CU: tl.constexpr, HAS_SOFF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    TOKENS: tl.constexpr,
):
    # (the arguments a call changes come first, then the sizes and strides, then the constexprs:
    # see posenc.kernels.triton_launch)
    # TOKENS consecutive tokens per program: fewer, fuller programs when a token has few heads
    for i in tl.static_range(TOKENS):
        tok = tl.program_id(0).to(tl.int64) * TOKENS + i
        if tok < n_tokens:
            b = tok // S
            s = tok % S
            if HAS_CU:
                # packed sequences: binary search for the last i with cu[i] <= tok (n_steps >= ceil(log2(N)))
                lo = tl.zeros((), dtype=tl.int64)
                hi = lo + n_seqs
                for _ in range(n_steps):
                    mid = (lo + hi) // 2
                    go = tl.load(cu_ptr + mid).to(tl.int64) <= tok
                    lo = tl.where(go, mid, lo)
                    hi = tl.where(go, hi, mid)
                pos = tok - tl.load(cu_ptr + lo).to(tl.int64)
                if HAS_SOFF:
                    pos += tl.load(soff_ptr + lo).to(tl.int64)
                else:
                    pos += offset
            elif HAS_POS:
                pos = tl.load(pos_ptr + b * sp_b + s * sp_s).to(tl.int64)
            else:
                pos = (s + offset).to(tl.int64)
            c, sn = table_row(cos_ptr, sin_ptr, pos, P, H2, st_row, st_col, BLOCK_D)
            if CONJ:
                sn = -sn
            _rotate_heads(q_ptr + b * sq_b + s * sq_s, qo_ptr + b * so_b + s * so_s, HQ, sq_h, sq_d, so_h, so_d, c,
                          sn, H2, INTERLEAVED, BLOCK_H, BLOCK_D)
            if HAS_K:
                _rotate_heads(k_ptr + b * sk_b + s * sk_s, ko_ptr + b * sko_b + s * sko_s, HK, sk_h, sk_d, sko_h,
                              sko_d, c, sn, H2, INTERLEAVED, BLOCK_H, BLOCK_D)


def tokens_per_program(heads: int, h2: int, n_tokens: int) -> int:
    """Tokens one program rotates: 1 when a token carries more than 1024 elements (e.g. 5 heads of
    128 or more), up to 16 for tokens with few small heads, never more than there are tokens."""
    per_token = max(heads, 1) * 2 * h2
    want = max(1, min(16, 2048 // per_token))
    return max(1, min(1 << (want.bit_length() - 1), triton.next_power_of_2(max(n_tokens, 1))))


def num_warps(tile: int, element_size: int) -> int:
    """Warps for a program whose loads and stores each span a ``tile`` of elements of ``element_size``
    bytes: as many as keep 16 bytes per thread (128-bit accesses), from 1 to 8.  Triton spreads a
    tile over all the program's threads, so more warps would split each thread's share below one
    128-bit access (a tile under 512 bytes gets one warp and narrower accesses)."""
    warps = max(1, min(8, tile * element_size // (16 * 32)))
    return 1 << (warps.bit_length() - 1)


def _axes(t: torch.Tensor, seq_dim: int) -> tuple[int, int, int, int, int]:
    """``(heads, stride_b, stride_s, stride_h, stride_d)`` of a 4-D (B, H, S, D) or (B, S, H, D) tensor."""
    if seq_dim == 2:
        return t.shape[1], t.stride(0), t.stride(2), t.stride(1), t.stride(3)
    return t.shape[2], t.stride(0), t.stride(1), t.stride(2), t.stride(3)


#: How many of the kernel's leading arguments are tensors, and how many change between calls.
_TENSORS, _PER_CALL = 9, 10


def launch_args(q, k, qo, ko, cos, sin, positions, offset, interleaved: bool, seq_dim: int, conj: bool,
                cu_seqlens=None, tokens: int | None = None) -> tuple[tuple[int], tuple, dict]:
    """``(grid, args, meta)`` of the launch: the kernel's arguments (those a call changes first) and
    its compile-time settings (constexprs and ``num_warps``).  A pure function of the tensors' shapes,
    strides and dtypes (meta tensors do), so the specializations can be enumerated and compiled
    without a GPU.  ``offset`` is an int, or with ``cu_seqlens`` a tensor of first positions."""
    B, S = q.shape[0], q.shape[seq_dim]
    h2 = cos.shape[-1]
    hq, *sq = _axes(q, seq_dim)
    _, *so = _axes(qo, seq_dim)
    if k is not None:
        hk, *sk = _axes(k, seq_dim)
        _, *sko = _axes(ko, seq_dim)
    else:
        hk, sk, sko, k, ko = 0, [0, 0, 0, 0], [0, 0, 0, 0], q, qo
    if positions is not None:
        sp = (0, positions.stride(0)) if positions.dim() == 1 else (
            positions.stride(0) if positions.shape[0] > 1 else 0, positions.stride(1))
    else:
        sp = (0, 0)
    n_seqs = 0 if cu_seqlens is None else cu_seqlens.shape[0] - 1
    seq_off = offset if isinstance(offset, torch.Tensor) else None
    block_d = triton.next_power_of_2(h2)
    block_h = max(1, min(triton.next_power_of_2(max(hq, hk, 1)), max(1, 4096 // block_d)))
    n_tokens = B * S
    tokens = tokens_per_program(hq + hk, h2, n_tokens) if tokens is None else tokens
    args = (
        q, k, qo, ko, cos, sin, positions if positions is not None else cos,
        cu_seqlens if cu_seqlens is not None else cos, seq_off if seq_off is not None else cos,
        0 if seq_off is not None else offset,
        S, hq, hk, cos.shape[0], *sq, *sk, *so, *sko, *sp, cos.stride(0), cos.stride(1),
        n_seqs, max(n_seqs - 1, 1).bit_length() + 1, n_tokens,
    )
    meta = dict(H2=h2, HAS_POS=positions is not None, HAS_K=hk > 0, INTERLEAVED=interleaved, CONJ=conj,
                HAS_CU=cu_seqlens is not None, HAS_SOFF=seq_off is not None, BLOCK_H=block_h, BLOCK_D=block_d,
                TOKENS=tokens, num_warps=num_warps(block_h * block_d * (2 if interleaved else 1), q.element_size()))
    return (triton.cdiv(n_tokens, tokens),), args, meta


def specialize(q, k, qo, ko, cos, sin, positions, offset, interleaved: bool, seq_dim: int, conj: bool,
               cu_seqlens=None, tokens: int | None = None) -> Launch:
    """The :class:`~posenc.kernels.triton_launch.Launch` of calls like this one; call it with the
    per-call arguments ``(q, k, qo, ko, cos, sin, positions, cu_seqlens, seq_offsets, offset)``
    (each absent tensor replaced by ``cos``), see :func:`per_call`."""
    grid, args, meta = launch_args(q, k, qo, ko, cos, sin, positions, offset, interleaved, seq_dim, conj,
                                   cu_seqlens, tokens)
    return Launch(_rope_qk_kernel, grid, args[_PER_CALL:], meta, _TENSORS)


def launch(q, k, qo, ko, cos, sin, positions, offset, interleaved: bool, seq_dim: int, conj: bool,
           cu_seqlens=None, tokens: int | None = None) -> None:
    """Rotate ``q`` (and ``k``) into ``qo`` (and ``ko``) in one launch, specialised for this call only
    (benchmarks sweep ``tokens`` per program with it); they may alias for in-place rotation.

    With ``cu_seqlens`` (``(N + 1,)``), q is ``(1, T, H, D)`` (``seq_dim=1``) holding packed
    sequences, and ``offset`` an int or an ``(N,)`` tensor of first positions."""
    grid, args, meta = launch_args(q, k, qo, ko, cos, sin, positions, offset, interleaved, seq_dim, conj,
                                   cu_seqlens, tokens)
    Launch(_rope_qk_kernel, grid, args[_PER_CALL:], meta, _TENSORS).fallback(args[:_PER_CALL])


def _converted(cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether the kernel reads converted copies of these tables (it reads float32 tables with one pair
    of strides for both); a prepared call converts them on every call then (see :func:`_float32_tables`)."""
    return cos.dtype != torch.float32 or sin.dtype != torch.float32 or cos.stride() != sin.stride()


def _float32_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables as the kernel reads them: float32, with one pair of strides for both."""
    if _converted(cos, sin):
        return cos.to(torch.float32).contiguous(), sin.to(torch.float32).contiguous()
    return cos, sin


def _new_like(x: torch.Tensor, rotary: int) -> torch.Tensor:
    out = torch.empty_like(x)
    if rotary < x.shape[-1]:
        out[..., rotary:] = x[..., rotary:]                                # pass-through features
    return out


class _Rotation:
    """The eager rotation of calls with one signature: outputs allocated, one launch (see :func:`prepare`)."""

    __slots__ = ("launch", "rotary", "inplace", "packed_batch", "grad", "spec", "layout", "convert")

    def __init__(self, launch: Launch, rotary: int, inplace: bool, packed_batch: bool, grad: bool, layout: str,
                 seq_dim: int, convert: bool, inverse: bool):
        # (recording autograd, an in-place call rotates out of place and copies back: autograd records the copy)
        self.launch, self.rotary, self.inplace, self.packed_batch, self.grad = launch, rotary, inplace, packed_batch, grad
        self.layout, self.convert = layout, convert
        self.spec = (layout == "interleaved", seq_dim, inverse)      # for the backward pass

    def __call__(self, q, k, cos, sin, positions, offset, cu_seqlens=None, packed=None, factors=None):
        if cos is None:
            cos, sin = unpack_tables(packed, self.layout)                  # views of RotaryEmbedding's table
        if self.convert:
            cos, sin = _float32_tables(cos, sin)
        if not self.grad:
            return self.forward(q, k, cos, sin, positions, offset, cu_seqlens)
        out = _Autograd.apply(q, k, cos, sin, positions, offset, cu_seqlens, self)
        qo, ko = (out, None) if k is None else out
        if not self.inplace:
            return qo, ko
        q.copy_(qo)
        if k is not None:
            k.copy_(ko)
        return q, k

    def forward(self, q, k, cos, sin, positions, offset, cu_seqlens):
        if self.packed_batch:                                              # (T, H, D) -> (1, T, H, D)
            q4, k4 = q[None], (None if k is None else k[None])
        else:
            q4, k4 = q, k
        if self.inplace and not self.grad:
            qo, ko = q4, k4
        else:
            qo = _new_like(q4, self.rotary) if self.rotary < q4.shape[-1] else torch.empty_like(q4)
            ko = None if k4 is None else (_new_like(k4, self.rotary) if self.rotary < k4.shape[-1]
                                          else torch.empty_like(k4))
        soff, first = (offset, 0) if isinstance(offset, torch.Tensor) else (cos, offset)
        self.launch(q4, q4 if k4 is None else k4, qo, qo if ko is None else ko, cos, sin,
                    cos if positions is None else positions, cos if cu_seqlens is None else cu_seqlens, soff, first)
        if self.inplace and not self.grad:
            return q, k
        if self.packed_batch:
            return qo[0], (None if ko is None else ko[0])
        return qo, ko


def prepare(q, k, cos, sin, positions, offset, layout: str, seq_dim: int, inplace: bool,
            cu_seqlens=None, inverse: bool = False) -> _Rotation:
    """The eager rotation of calls like this one: ``rotation(q, k, cos, sin, positions, offset,
    cu_seqlens) -> (q_out, k_out)``, specialised once for these shapes, strides and dtypes (tables
    that are not float32 with one pair of strides are converted by every call, see
    :func:`_float32_tables`).

    ``seq_dim`` is 2 for ``(B, H, S, D)`` or 1 for ``(B, S, H, D)``; with ``cu_seqlens`` q and k are
    packed ``(T, H, D)`` sequences and ``offset`` an int or a tensor of first positions; ``inverse``
    rotates by ``-theta``.  The rotation records gradients (one launch forward, one backward) when
    autograd records q or k."""
    grad = torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad))
    convert = _converted(cos, sin)
    cos, sin = _float32_tables(cos, sin)
    packed_batch = cu_seqlens is not None
    if packed_batch:
        q, k, seq_dim = q[None], (None if k is None else k[None]), 1
    same = inplace and not grad                                            # (see _Rotation)
    qo = q if same else torch.empty_like(q, device="meta")
    ko = None if k is None else (k if same else torch.empty_like(k, device="meta"))
    launch = specialize(q, k, qo, ko, cos, sin, positions, offset, layout == "interleaved", seq_dim, inverse,
                        cu_seqlens)
    return _Rotation(launch, 2 * cos.shape[-1], inplace, packed_batch, grad, layout, seq_dim, convert, inverse)


def _owned(g: torch.Tensor | None) -> bool:
    """Whether autograd alone holds the gradient ``g``, so that the backward pass may write into it: no
    other tensor or Python name refers to it or to its memory (a gradient passed by the user, or one
    handed to several nodes, is not), and its elements do not overlap."""
    if g is None or g._base is not None or g.requires_grad:
        return False
    try:
        alone = g._use_count() == 1 and torch._C._storage_Use_Count(  # type: ignore[attr-defined]
            g.untyped_storage()._cdata) <= 2
    except (AttributeError, RuntimeError):                             # (a torch without these counters)
        return False
    return alone and torch._debug_has_internal_overlap(g) == 0


def _rotate_back(grad_q, grad_k, cos, sin, positions, offset, cu_seqlens, interleaved: bool, seq_dim: int,
                 rotary: int, conj: bool):
    """``R^T`` of the gradients (the rotation by ``-theta``, or by ``theta`` when the forward pass was the
    inverse rotation: ``conj``) in one launch, read through their strides."""
    gq, gk = grad_q, grad_k
    if cu_seqlens is not None:
        gq, gk = gq[None], (None if gk is None else gk[None])
    dq = gq if _owned(grad_q) else _new_like(gq, rotary)
    dk = None if gk is None else (gk if _owned(grad_k) else _new_like(gk, rotary))
    launch(gq, gk, dq, dk, cos, sin, positions, offset, interleaved, seq_dim, conj, cu_seqlens)
    if cu_seqlens is not None:
        return dq[0], (None if dk is None else dk[0])
    return dq, dk


class _Autograd(torch.autograd.Function):
    """Eager training: the prepared launch forward, the rotation by ``-theta`` backward (no custom-op
    dispatch on either side)."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, positions, offset, cu_seqlens, rotation):
        qo, ko = rotation.forward(q, k, cos, sin, positions, offset, cu_seqlens)
        ctx.save_for_backward(cos, sin, positions, offset if isinstance(offset, torch.Tensor) else None, cu_seqlens)
        ctx.first = offset if not isinstance(offset, torch.Tensor) else None
        ctx.rotation = rotation
        if ko is None:
            return qo
        return qo, ko

    @staticmethod
    def backward(ctx, grad_q, grad_k=None):
        cos, sin, positions, seq_offsets, cu_seqlens = ctx.saved_tensors
        interleaved, seq_dim, inverse = ctx.rotation.spec
        offset = seq_offsets if seq_offsets is not None else ctx.first
        dq, dk = _rotate_back(grad_q, grad_k, cos, sin, positions, offset, cu_seqlens, interleaved, seq_dim,
                              ctx.rotation.rotary, not inverse)
        return dq, dk, None, None, None, None, None, None


# ---- tracing: one opaque node for torch.compile / torch.export -------------------------------------------------


@torch.library.custom_op("posenc::rope_qk", mutates_args=())
def _rope_qk_op(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                positions: torch.Tensor | None, offset: int, interleaved: bool, seq_dim: int,
                conj: bool, cu_seqlens: torch.Tensor | None = None,
                seq_offsets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    rotary = 2 * cos.shape[-1]
    qo = _new_like(q, rotary)
    ko = _new_like(k, rotary) if k is not None else q.new_empty(0)
    launch(q, k, qo, ko if k is not None else None, cos, sin, positions,
           seq_offsets if seq_offsets is not None else offset, interleaved, seq_dim, conj, cu_seqlens)
    return qo, ko


@_rope_qk_op.register_fake
def _(q, k, cos, sin, positions, offset, interleaved, seq_dim, conj, cu_seqlens=None, seq_offsets=None):
    return torch.empty_like(q), (torch.empty_like(k) if k is not None else q.new_empty(0))


def _setup_context(ctx, inputs, output):
    q, k, cos, sin, positions, offset, interleaved, seq_dim, conj, cu_seqlens, seq_offsets = inputs
    empty = cos.new_empty(0)
    ctx.save_for_backward(cos, sin, *(t if t is not None else empty for t in (positions, cu_seqlens, seq_offsets)))
    ctx.given = tuple(t is not None for t in (positions, cu_seqlens, seq_offsets))
    ctx.has_k = k is not None
    ctx.args = (offset, interleaved, seq_dim, conj)


def _backward(ctx, grad_q, grad_k):
    cos, sin, *index = ctx.saved_tensors
    positions, cu_seqlens, seq_offsets = (t if given else None for t, given in zip(index, ctx.given, strict=True))
    offset, interleaved, seq_dim, conj = ctx.args
    gq, gk = _rope_qk_op(grad_q, grad_k if ctx.has_k else None, cos, sin, positions, offset, interleaved, seq_dim,
                         not conj, cu_seqlens, seq_offsets)
    return (gq, (gk if ctx.has_k else None)) + (None,) * 9


_rope_qk_op.register_autograd(_backward, setup_context=_setup_context)


def _traced(q, k, cos, sin, positions, offset, layout: str, seq_dim: int, inplace: bool, cu_seqlens, inverse: bool):
    """The rotation while tracing: the custom op (out of place, then copied back for ``inplace``)."""
    interleaved = layout == "interleaved"
    if cu_seqlens is not None:                                             # (T, H, D) -> (1, T, H, D)
        seq_offsets, first = (offset, 0) if isinstance(offset, torch.Tensor) else (None, offset)
        qo, ko = _rope_qk_op(q[None], None if k is None else k[None], cos, sin, None, first, interleaved, 1, inverse,
                             cu_seqlens, seq_offsets)
        qo, ko = qo[0], (ko[0] if k is not None else None)
    else:
        qo, ko = _rope_qk_op(q, k, cos, sin, positions, offset, interleaved, seq_dim, inverse)
        ko = ko if k is not None else None
    if inplace:
        q.copy_(qo)
        if k is not None:
            k.copy_(ko)
        return q, k
    return qo, ko


def rope_qk(q: torch.Tensor, k: torch.Tensor | None, *, cos: torch.Tensor | None, sin: torch.Tensor | None,
            positions: torch.Tensor | None, offset: int | torch.Tensor, layout: str, seq_dim: int, inplace: bool,
            packed: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
            inverse: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate q and k by the rows of ``(P, d/2)`` tables for ``positions`` or ``offset + arange(S)``
    (by ``-theta`` with ``inverse``: the kernel's ``CONJ`` setting).

    The engine interface of :mod:`posenc.kernels`: the tables are ``cos``/``sin``, or views of
    ``packed`` (:func:`~posenc.kernels.torch_rope.pack_tables`), read through their strides.  ``seq_dim`` is 2 for ``(B, H, S, D)`` or 1 for
    ``(B, S, H, D)``; ``positions`` is ``(S,)``, ``(B, S)`` or None.  With ``cu_seqlens``, q and k
    are packed ``(T, H, D)`` sequences whose positions restart at ``offset`` (an int or one per
    sequence), found inside the kernel.  Callers validate the arguments and pick this engine.
    """
    if cos is None or sin is None:
        cos, sin = unpack_tables(packed, layout)                           # type: ignore[arg-type]
    if positions is not None and positions.device != q.device:
        positions = positions.to(q.device)
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.contiguous()                                # the kernel reads them with stride 1
        if isinstance(offset, torch.Tensor):
            offset = offset.contiguous()
    if torch.compiler.is_compiling():
        cos, sin = _float32_tables(cos, sin)
        return _traced(q, k, cos, sin, positions, offset, layout, seq_dim, inplace, cu_seqlens, inverse)
    return prepare(q, k, cos, sin, positions, offset, layout, seq_dim, inplace, cu_seqlens, inverse)(
        q, k, cos, sin, positions, offset, cu_seqlens)
