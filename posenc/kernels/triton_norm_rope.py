"""Fused QK-RMSNorm + RoPE for q and k in one Triton launch (Qwen3, Gemma-3, OLMo-2 attention).

For every head ``x`` of q and then of k, each program (one token ``(b, s)``) computes, in float32::

    y = R(theta) u,   u = n * (weight_offset + w),   n = x * r,   r = rsqrt(mean(x^2) + eps)

and rounds once to the output dtype.  The mean runs over each head (``w`` of shape ``(D,)``, Qwen3,
Gemma-3) or over all heads of the token together (``w`` of shape ``(H*D,)``, OLMo-2, where
``w[h*D:(h+1)*D]`` scales head ``h``); the token-wide norm first sums the squares of the token's row
in one pass, then normalises and rotates it in a second.  The rotation reads one row of the float32
cos/sin tables, as :mod:`posenc.kernels.triton_rope` does (a position outside the table gives NaN
rows, never a read past the table).  Features past the rotary dim are normalised and scaled, not
rotated.

The backward pass is one launch as well.  With ``g_u = R^T g_y`` (the rotation by ``-theta``)::

    grad_w = sum over tokens (and heads) of g_u * n
    g_n    = g_u * (weight_offset + w)
    grad_x = r * (g_n - n * mean(g_n * n))           (the mean over the normalised extent)

Each program writes its token's share of ``grad_w`` to its own row of a float32 buffer, which
``torch.sum`` reduces afterwards: no atomics, so the result is deterministic.  Nothing is saved for
the backward pass but the inputs; ``r`` is recomputed.

An eager call launches the compiled kernel directly through a launch specialised once per signature
(:mod:`posenc.kernels.triton_launch`, :func:`prepare`), and eager training goes through a plain
``torch.autograd.Function``.  While tracing, both passes are the custom ops
``posenc::rms_norm_rope_qk`` and ``posenc::rms_norm_rope_qk_backward`` (with fake implementations and
an autograd formula), so ``torch.compile(fullgraph=True)`` traces them without graph breaks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from posenc.kernels.triton_launch import Launch
from posenc.kernels.triton_rope import _converted, _float32_tables, num_warps, table_row

__all__ = ["prepare", "rms_norm_rope_qk"]


@triton.jit
def _load_pairs(ptr, rows, s_row, s_col, H2, mask_rows,
                INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """The two members of every rotated pair of ``rows`` (``(BLOCK_H, 1)``), float32 ``(BLOCK_H, BLOCK_D)`` each."""
    if INTERLEAVED:
        # pairs (2i, 2i + 1): one contiguous row, split in registers
        offs = tl.arange(0, 2 * BLOCK_D)[None, :]
        m = mask_rows & (offs < 2 * H2)
        x = tl.load(ptr + rows * s_row + offs * s_col, mask=m, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(x, (BLOCK_H, BLOCK_D, 2)))
    else:
        # pairs (i, i + d/2): two contiguous half-rows
        offs = tl.arange(0, BLOCK_D)[None, :]
        m = mask_rows & (offs < H2)
        x1 = tl.load(ptr + rows * s_row + offs * s_col, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(ptr + rows * s_row + (offs + H2) * s_col, mask=m, other=0.0).to(tl.float32)
    return x1, x2


@triton.jit
def _store_pairs(ptr, rows, s_row, s_col, H2, mask_rows, y1, y2,
                 INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Write the pairs ``(y1, y2)`` back where :func:`_load_pairs` read them, rounded to ``ptr``'s dtype."""
    if INTERLEAVED:
        offs = tl.arange(0, 2 * BLOCK_D)[None, :]
        m = mask_rows & (offs < 2 * H2)
        y = tl.reshape(tl.join(y1, y2), (BLOCK_H, 2 * BLOCK_D))
        tl.store(ptr + rows * s_row + offs * s_col, y.to(ptr.dtype.element_ty), mask=m)
    else:
        offs = tl.arange(0, BLOCK_D)[None, :]
        m = mask_rows & (offs < H2)
        tl.store(ptr + rows * s_row + offs * s_col, y1.to(ptr.dtype.element_ty), mask=m)
        tl.store(ptr + rows * s_row + (offs + H2) * s_col, y2.to(ptr.dtype.element_ty), mask=m)


@triton.jit
def _rest_offsets(rows, s_row, s_col, H2, D, mask_rows, BLOCK_R: tl.constexpr):
    """Offsets and mask of the pass-through features ``2 * H2 .. D - 1`` of ``rows``."""
    offs = tl.arange(0, BLOCK_R)[None, :]
    return rows * s_row + (2 * H2 + offs) * s_col, mask_rows & (offs < D - 2 * H2)


@triton.jit
def _load_head_block(x_ptr, w_ptr, rows, s_h, s_d, w_h, w_d, H2, D, mh,
                     INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_R: tl.constexpr):
    """``x`` (pairs and pass-through) and ``w`` of a block of heads, float32."""
    x1, x2 = _load_pairs(x_ptr, rows, s_h, s_d, H2, mh, INTERLEAVED, BLOCK_H, BLOCK_D)
    xo, xm = _rest_offsets(rows, s_h, s_d, H2, D, mh, BLOCK_R)
    x3 = tl.load(x_ptr + xo, mask=xm, other=0.0).to(tl.float32)
    w1, w2 = _load_pairs(w_ptr, rows, w_h, w_d, H2, mh, INTERLEAVED, BLOCK_H, BLOCK_D)
    wo, wm = _rest_offsets(rows, w_h, w_d, H2, D, mh, BLOCK_R)
    w3 = tl.load(w_ptr + wo, mask=wm, other=0.0).to(tl.float32)
    return x1, x2, x3, w1, w2, w3


@triton.jit
def _sum_sq(x1, x2, x3):
    """Per-head sums of squares, ``(BLOCK_H, 1)``."""
    return (tl.sum(x1 * x1, 1, keep_dims=True) + tl.sum(x2 * x2, 1, keep_dims=True)
            + tl.sum(x3 * x3, 1, keep_dims=True))


@triton.jit
def _norm_rope_heads(x_ptr, y_ptr, w_ptr, n_heads, D, s_h, s_d, o_h, o_d, w_h, w_d, c, sn, H2, eps, w_off,
                     TOKEN_NORM: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    """Normalise, scale and rotate the ``n_heads`` heads of one token (float32 math, one rounding)."""
    if TOKEN_NORM:
        # pass 1: the sum of squares over the token's whole row (all heads)
        acc = tl.zeros((BLOCK_H, 1), dtype=tl.float32)
        for h0 in range(0, n_heads, BLOCK_H):
            rows = (h0 + tl.arange(0, BLOCK_H))[:, None].to(tl.int64)   # (int64: a row may pass 2**31 elements)
            mh = rows < n_heads
            x1, x2 = _load_pairs(x_ptr, rows, s_h, s_d, H2, mh, INTERLEAVED, BLOCK_H, BLOCK_D)
            xo, xm = _rest_offsets(rows, s_h, s_d, H2, D, mh, BLOCK_R)
            x3 = tl.load(x_ptr + xo, mask=xm, other=0.0).to(tl.float32)
            acc += _sum_sq(x1, x2, x3)
        r_token = tl.rsqrt(tl.sum(acc) / (n_heads * D) + eps)
    for h0 in range(0, n_heads, BLOCK_H):
        rows = (h0 + tl.arange(0, BLOCK_H))[:, None].to(tl.int64)   # (int64: a row may pass 2**31 elements)
        mh = rows < n_heads
        x1, x2, x3, w1, w2, w3 = _load_head_block(x_ptr, w_ptr, rows, s_h, s_d, w_h, w_d, H2, D, mh,
                                                  INTERLEAVED, BLOCK_H, BLOCK_D, BLOCK_R)
        if TOKEN_NORM:
            r = r_token
        else:
            r = tl.rsqrt(_sum_sq(x1, x2, x3) / D + eps)                  # (BLOCK_H, 1)
        u1 = x1 * r * (w_off + w1)
        u2 = x2 * r * (w_off + w2)
        u3 = x3 * r * (w_off + w3)
        _store_pairs(y_ptr, rows, o_h, o_d, H2, mh, u1 * c - u2 * sn, u2 * c + u1 * sn, INTERLEAVED, BLOCK_H, BLOCK_D)
        yo, ym = _rest_offsets(rows, o_h, o_d, H2, D, mh, BLOCK_R)
        tl.store(y_ptr + yo, u3.to(y_ptr.dtype.element_ty), mask=ym)


@triton.jit
def _norm_rope_heads_bwd(x_ptr, g_ptr, dx_ptr, w_ptr, dw_ptr, n_heads, D, s_h, s_d, g_h, g_d, o_h, o_d, w_h, w_d,
                         c, sn, H2, eps, w_off, TOKEN_NORM: tl.constexpr, INTERLEAVED: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    """Gradients of one token's heads: ``dx`` (rounded to its dtype) and the token's share of ``grad_w``
    (float32, at ``dw_ptr``: ``(D,)`` summed over the heads, or ``(H*D,)`` for the token-wide norm)."""
    if TOKEN_NORM:
        # pass 1: sum(x^2) and sum(g_n * x) over the token's whole row
        acc_ss = tl.zeros((BLOCK_H, 1), dtype=tl.float32)
        acc_gx = tl.zeros((BLOCK_H, 1), dtype=tl.float32)
        for h0 in range(0, n_heads, BLOCK_H):
            rows = (h0 + tl.arange(0, BLOCK_H))[:, None].to(tl.int64)   # (int64: a row may pass 2**31 elements)
            mh = rows < n_heads
            x1, x2, x3, w1, w2, w3 = _load_head_block(x_ptr, w_ptr, rows, s_h, s_d, w_h, w_d, H2, D, mh,
                                                      INTERLEAVED, BLOCK_H, BLOCK_D, BLOCK_R)
            g1, g2 = _load_pairs(g_ptr, rows, g_h, g_d, H2, mh, INTERLEAVED, BLOCK_H, BLOCK_D)
            go, gm = _rest_offsets(rows, g_h, g_d, H2, D, mh, BLOCK_R)
            g3 = tl.load(g_ptr + go, mask=gm, other=0.0).to(tl.float32)
            gn1 = (g1 * c + g2 * sn) * (w_off + w1)                       # g_n = (R^T g_y) * w'
            gn2 = (g2 * c - g1 * sn) * (w_off + w2)
            gn3 = g3 * (w_off + w3)
            acc_ss += _sum_sq(x1, x2, x3)
            acc_gx += (tl.sum(gn1 * x1, 1, keep_dims=True) + tl.sum(gn2 * x2, 1, keep_dims=True)
                       + tl.sum(gn3 * x3, 1, keep_dims=True))
        n_total = n_heads * D
        r_token = tl.rsqrt(tl.sum(acc_ss) / n_total + eps)
        m_token = r_token * tl.sum(acc_gx) / n_total                        # mean(g_n * n)
    else:
        dw1 = tl.zeros((1, BLOCK_D), dtype=tl.float32)
        dw2 = tl.zeros((1, BLOCK_D), dtype=tl.float32)
        dw3 = tl.zeros((1, BLOCK_R), dtype=tl.float32)
    for h0 in range(0, n_heads, BLOCK_H):
        rows = (h0 + tl.arange(0, BLOCK_H))[:, None].to(tl.int64)   # (int64: a row may pass 2**31 elements)
        mh = rows < n_heads
        x1, x2, x3, w1, w2, w3 = _load_head_block(x_ptr, w_ptr, rows, s_h, s_d, w_h, w_d, H2, D, mh,
                                                  INTERLEAVED, BLOCK_H, BLOCK_D, BLOCK_R)
        g1, g2 = _load_pairs(g_ptr, rows, g_h, g_d, H2, mh, INTERLEAVED, BLOCK_H, BLOCK_D)
        go, gm = _rest_offsets(rows, g_h, g_d, H2, D, mh, BLOCK_R)
        g3 = tl.load(g_ptr + go, mask=gm, other=0.0).to(tl.float32)
        gu1 = g1 * c + g2 * sn                                              # g_u = R^T g_y: rotate by -theta
        gu2 = g2 * c - g1 * sn
        gn1 = gu1 * (w_off + w1)
        gn2 = gu2 * (w_off + w2)
        gn3 = g3 * (w_off + w3)
        if TOKEN_NORM:
            r = r_token
            m = m_token
        else:
            r = tl.rsqrt(_sum_sq(x1, x2, x3) / D + eps)                     # (BLOCK_H, 1)
            m = r * (tl.sum(gn1 * x1, 1, keep_dims=True) + tl.sum(gn2 * x2, 1, keep_dims=True)
                     + tl.sum(gn3 * x3, 1, keep_dims=True)) / D
        n1 = x1 * r
        n2 = x2 * r
        n3 = x3 * r
        _store_pairs(dx_ptr, rows, o_h, o_d, H2, mh, r * (gn1 - n1 * m), r * (gn2 - n2 * m),
                     INTERLEAVED, BLOCK_H, BLOCK_D)
        do, dm = _rest_offsets(rows, o_h, o_d, H2, D, mh, BLOCK_R)
        tl.store(dx_ptr + do, (r * (gn3 - n3 * m)).to(dx_ptr.dtype.element_ty), mask=dm)
        if TOKEN_NORM:
            # this token's grad_w is g_u * n itself: head h at w[h*D:(h+1)*D]
            _store_pairs(dw_ptr, rows, D, 1, H2, mh, gu1 * n1, gu2 * n2, INTERLEAVED, BLOCK_H, BLOCK_D)
            dwo, dwm = _rest_offsets(rows, D, 1, H2, D, mh, BLOCK_R)
            tl.store(dw_ptr + dwo, g3 * n3, mask=dwm)
        else:
            dw1 += tl.sum(gu1 * n1, 0, keep_dims=True)
            dw2 += tl.sum(gu2 * n2, 0, keep_dims=True)
            dw3 += tl.sum(g3 * n3, 0, keep_dims=True)
    if not TOKEN_NORM:
        row0 = tl.zeros((1, 1), dtype=tl.int32)
        _store_pairs(dw_ptr, row0, 0, 1, H2, row0 == 0, dw1, dw2, INTERLEAVED, 1, BLOCK_D)
        dwo, dwm = _rest_offsets(row0, 0, 1, H2, D, row0 == 0, BLOCK_R)
        tl.store(dw_ptr + dwo, dw3, mask=dwm)


@triton.jit
def _angles(cos_ptr, sin_ptr, pos_ptr, b, s, offset, H2, P, sp_b, sp_s, st_row, st_col,
            HAS_POS: tl.constexpr, BLOCK_D: tl.constexpr):
    """The token's cos/sin row, ``(1, BLOCK_D)`` each: NaN for a position outside the table, 0 in the
    lanes past ``H2`` (the backward pass sums over them, so they must not hold NaN)."""
    if HAS_POS:
        pos = tl.load(pos_ptr + b * sp_b + s * sp_s).to(tl.int64)
    else:
        pos = (s + offset).to(tl.int64)
    return table_row(cos_ptr, sin_ptr, pos, P, H2, st_row, st_col, BLOCK_D)


@triton.jit(do_not_specialize=["offset"])
def _norm_rope_qk_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, pos_ptr, offset,
    S, HQ, HK, P, eps, w_off, wq_h, wq_d, wk_h, wk_d,
    sq_b, sq_s, sq_h, sq_d, sk_b, sk_s, sk_h, sk_d,
    so_b, so_s, so_h, so_d, sko_b, sko_s, sko_h, sko_d,
    sp_b, sp_s, st_row, st_col,
    DQ: tl.constexpr, DK: tl.constexpr, H2: tl.constexpr, HAS_POS: tl.constexpr, HAS_K: tl.constexpr, Q_TOKEN: tl.constexpr, K_TOKEN: tl.constexpr,
    INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)                                    # (offsets past 2**31 elements)
    b = tok // S
    s = tok % S
    c, sn = _angles(cos_ptr, sin_ptr, pos_ptr, b, s, offset, H2, P, sp_b, sp_s, st_row, st_col, HAS_POS, BLOCK_D)
    _norm_rope_heads(q_ptr + b * sq_b + s * sq_s, qo_ptr + b * so_b + s * so_s, wq_ptr, HQ, DQ, sq_h, sq_d, so_h, so_d,
                     wq_h, wq_d, c, sn, H2, eps, w_off, Q_TOKEN, INTERLEAVED, BLOCK_H, BLOCK_D, BLOCK_R)
    if HAS_K:
        _norm_rope_heads(k_ptr + b * sk_b + s * sk_s, ko_ptr + b * sko_b + s * sko_s, wk_ptr, HK, DK, sk_h, sk_d,
                         sko_h, sko_d, wk_h, wk_d, c, sn, H2, eps, w_off, K_TOKEN, INTERLEAVED, BLOCK_H, BLOCK_D,
                         BLOCK_R)


@triton.jit(do_not_specialize=["offset"])
def _norm_rope_qk_bwd_kernel(
    q_ptr, k_ptr, gq_ptr, gk_ptr, dq_ptr, dk_ptr, wq_ptr, wk_ptr, dwq_ptr, dwk_ptr, cos_ptr, sin_ptr, pos_ptr, offset,
    S, HQ, HK, P, eps, w_off, wq_h, wq_d, wk_h, wk_d, dwq_row, dwk_row,
    sq_b, sq_s, sq_h, sq_d, sk_b, sk_s, sk_h, sk_d,
    sgq_b, sgq_s, sgq_h, sgq_d, sgk_b, sgk_s, sgk_h, sgk_d,
    so_b, so_s, so_h, so_d, sko_b, sko_s, sko_h, sko_d,
    sp_b, sp_s, st_row, st_col,
    DQ: tl.constexpr, DK: tl.constexpr, H2: tl.constexpr, HAS_POS: tl.constexpr, HAS_K: tl.constexpr, Q_TOKEN: tl.constexpr, K_TOKEN: tl.constexpr,
    INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)                                    # (offsets past 2**31 elements)
    b = tok // S
    s = tok % S
    c, sn = _angles(cos_ptr, sin_ptr, pos_ptr, b, s, offset, H2, P, sp_b, sp_s, st_row, st_col, HAS_POS, BLOCK_D)
    _norm_rope_heads_bwd(q_ptr + b * sq_b + s * sq_s, gq_ptr + b * sgq_b + s * sgq_s, dq_ptr + b * so_b + s * so_s,
                         wq_ptr, dwq_ptr + tok * dwq_row, HQ, DQ, sq_h, sq_d, sgq_h, sgq_d, so_h, so_d,
                         wq_h, wq_d, c, sn, H2, eps, w_off, Q_TOKEN, INTERLEAVED, BLOCK_H, BLOCK_D, BLOCK_R)
    if HAS_K:
        _norm_rope_heads_bwd(k_ptr + b * sk_b + s * sk_s, gk_ptr + b * sgk_b + s * sgk_s,
                             dk_ptr + b * sko_b + s * sko_s, wk_ptr, dwk_ptr + tok * dwk_row, HK, DK,
                             sk_h, sk_d, sgk_h, sgk_d, sko_h, sko_d, wk_h, wk_d, c, sn, H2, eps, w_off, K_TOKEN,
                             INTERLEAVED, BLOCK_H, BLOCK_D, BLOCK_R)


def _axes(t: torch.Tensor, seq_dim: int) -> tuple[int, int, int, int, int]:
    """``(heads, stride_b, stride_s, stride_h, stride_d)`` of a 4-D (B, H, S, D) or (B, S, H, D) tensor."""
    if seq_dim == 2:
        return t.shape[1], t.stride(0), t.stride(2), t.stride(1), t.stride(3)
    return t.shape[2], t.stride(0), t.stride(1), t.stride(2), t.stride(3)


def _weight_strides(x: torch.Tensor, w: torch.Tensor) -> tuple[int, int, bool]:
    """``(stride per head, stride per feature, token-wide?)`` of the RMSNorm weight ``w`` of ``x``: a
    ``(D,)`` weight serves every head (stride 0 per head), an ``(H*D,)`` one a whole token."""
    token = w.shape[0] != x.shape[-1]                                   # (H*D,): all heads of a token together
    return (x.shape[-1] * w.stride(0) if token else 0), w.stride(0), token


def _positions_strides(positions: torch.Tensor | None) -> tuple[int, int]:
    if positions is None:
        return 0, 0
    if positions.dim() == 1:
        return 0, positions.stride(0)
    return (positions.stride(0) if positions.shape[0] > 1 else 0), positions.stride(1)


def _blocks(h2: int, dq: int, dk: int, heads: int, budget: int, interleaved: bool,
            element_size: int) -> tuple[int, int, int, int]:
    """``(BLOCK_H, BLOCK_D, BLOCK_R, num_warps)``: heads per step, pairs, pass-through features and warps;
    a step holds at most ``budget`` features of each operand, and the warps keep 16 bytes of the
    widest load per thread (see :func:`posenc.kernels.triton_rope.num_warps`)."""
    block_d = triton.next_power_of_2(h2)
    block_r = triton.next_power_of_2(max(dq - 2 * h2, dk - 2 * h2, 1))
    width = 2 * block_d + block_r
    cap = max(1, budget // width)
    cap = 1 << (cap.bit_length() - 1)                                  # tl.arange needs a power of 2
    block_h = min(triton.next_power_of_2(max(heads, 1)), cap)
    # the widest access sets the warps: the pairs, or the pass-through features of a partial rotary
    # (sized by the pairs alone, a step of 8 heads of 128 features with 64 rotated took one warp and
    # 251 registers per thread in the backward pass)
    widest = max(block_d * (2 if interleaved else 1), block_r if block_r > 1 else 0)
    return block_h, block_d, block_r, num_warps(block_h * widest, element_size)


class _Call:
    """What both launches share: shapes, strides of q, k, the weights, positions and tables."""

    def __init__(self, q, k, q_weight, k_weight, cos, sin, positions, seq_dim: int):
        self.B, self.S = q.shape[0], q.shape[seq_dim]
        self.h2 = cos.shape[-1]
        self.hq, *self.sq = _axes(q, seq_dim)
        self.dq = q.shape[-1]
        self.wq = _weight_strides(q, q_weight)
        if k is not None:
            self.hk, *self.sk = _axes(k, seq_dim)
            self.dk = k.shape[-1]
            self.wk = _weight_strides(k, k_weight)
        else:
            self.hk, self.sk, self.dk, self.wk = 0, [0, 0, 0, 0], 0, (0, 0, False)
        self.sp = _positions_strides(positions)
        self.tables = (cos.shape[0], cos.stride(0), cos.stride(1))
        self.element_size = q.element_size()

    def flags(self, positions, interleaved: bool, budget: int, maxnreg: int | None = None) -> dict:
        block_h, block_d, block_r, warps = _blocks(self.h2, self.dq, self.dk, max(self.hq, self.hk), budget,
                                                   interleaved, self.element_size)
        flags = dict(DQ=self.dq, DK=self.dk, H2=self.h2, HAS_POS=positions is not None, HAS_K=self.hk > 0, Q_TOKEN=self.wq[2], K_TOKEN=self.wk[2],
                     INTERLEAVED=interleaved, BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_R=block_r, num_warps=warps)
        if maxnreg is not None:
            flags["maxnreg"] = maxnreg
        return flags


def _strides(t: torch.Tensor | None, seq_dim: int) -> list[int]:
    return list(_axes(t, seq_dim)[1:]) if t is not None else [0, 0, 0, 0]


def forward_args(q, k, q_weight, k_weight, qo, ko, cos, sin, positions, offset: int, eps: float,
                 weight_offset: float, interleaved: bool, seq_dim: int) -> tuple[tuple[int], tuple, dict]:
    """``(grid, args, meta)`` of :func:`launch_forward`'s launch: a pure function of shapes, strides
    and dtypes (meta tensors do), so its specializations compile without a GPU."""
    call = _Call(q, k, q_weight, k_weight, cos, sin, positions, seq_dim)
    P, st_row, st_col = call.tables
    args = (
        q, k if k is not None else q, qo, ko if k is not None else qo, q_weight,
        k_weight if k is not None else q_weight, cos, sin, positions if positions is not None else cos, offset,
        call.S, call.hq, call.hk, P, eps, weight_offset,
        call.wq[0], call.wq[1], call.wk[0], call.wk[1],
        *call.sq, *call.sk, *_strides(qo, seq_dim), *_strides(ko if k is not None else None, seq_dim),
        *call.sp, st_row, st_col,
    )
    # maxnreg: a register ceiling.  Without one, the ptxas of Triton 3.9 kept some sm_90 and sm_100
    # specializations at 32 to 56 registers and spilled 4 to 12 bytes to local memory (caught by
    # tests/test_triton_compile.py); with a ceiling of 128 they take what they need, and 128 keeps a
    # quarter of the SM's warps.  The backward pass (below) gets the same ceiling.
    return (call.B * call.S,), args, call.flags(positions, interleaved, 2048, maxnreg=128)


#: The kernels' tensor arguments come first, then the first position; nothing else changes between calls.
_FWD_TENSORS, _FWD_PER_CALL, _BWD_TENSORS = 9, 10, 13


def launch_forward(q, k, q_weight, k_weight, qo, ko, cos, sin, positions, offset: int, eps: float,
                   weight_offset: float, interleaved: bool, seq_dim: int) -> None:
    """Normalise and rotate ``q`` (and ``k``) into ``qo`` (and ``ko``), on q's device."""
    grid, args, meta = forward_args(q, k, q_weight, k_weight, qo, ko, cos, sin, positions, offset, eps,
                                    weight_offset, interleaved, seq_dim)
    Launch(_norm_rope_qk_kernel, grid, args[_FWD_PER_CALL:], meta, _FWD_TENSORS).fallback(args[:_FWD_PER_CALL])


def backward_args(grad_q, grad_k, q, k, q_weight, k_weight, dq, dk, dwq, dwk, cos, sin, positions, offset: int,
                  eps: float, weight_offset: float, interleaved: bool,
                  seq_dim: int) -> tuple[tuple[int], tuple, dict]:
    """``(grid, args, meta)`` of :func:`launch_backward`'s launch (see :func:`forward_args`)."""
    call = _Call(q, k, q_weight, k_weight, cos, sin, positions, seq_dim)
    P, st_row, st_col = call.tables
    has_k = k is not None
    args = (
        q, k if has_k else q, grad_q, grad_k if has_k else grad_q, dq, dk if has_k else dq, q_weight,
        k_weight if has_k else q_weight, dwq, dwk if has_k else dwq, cos, sin,
        positions if positions is not None else cos, offset,
        call.S, call.hq, call.hk, P, eps, weight_offset,
        call.wq[0], call.wq[1], call.wk[0], call.wk[1], dwq.stride(0), dwk.stride(0) if has_k else 0,
        *call.sq, *call.sk, *_strides(grad_q, seq_dim), *_strides(grad_k if has_k else None, seq_dim),
        *_strides(dq, seq_dim), *_strides(dk if has_k else None, seq_dim),
        *call.sp, st_row, st_col,
    )
    return (call.B * call.S,), args, call.flags(positions, interleaved, 1024, maxnreg=128)


def launch_backward(grad_q, grad_k, q, k, q_weight, k_weight, dq, dk, dwq, dwk, cos, sin, positions, offset: int,
                    eps: float, weight_offset: float, interleaved: bool, seq_dim: int) -> None:
    """``dq`` (and ``dk``) and the per-token shares ``dwq`` (and ``dwk``), ``(B*S, len(w) or D)`` float32."""
    grid, args, meta = backward_args(grad_q, grad_k, q, k, q_weight, k_weight, dq, dk, dwq, dwk, cos, sin,
                                     positions, offset, eps, weight_offset, interleaved, seq_dim)
    Launch(_norm_rope_qk_bwd_kernel, grid, args[_BWD_TENSORS + 1:], meta, _BWD_TENSORS).fallback(
        args[:_BWD_TENSORS + 1])


def _weight_rows(x: torch.Tensor, w: torch.Tensor, seq_dim: int) -> torch.Tensor:
    """An empty float32 ``(B*S, len(w))`` buffer for each token's share of ``grad_w``."""
    return torch.empty(x.shape[0] * x.shape[seq_dim], w.shape[0], dtype=torch.float32, device=x.device)


def _backward_launch(grad_q, grad_k, q, k, q_weight, k_weight, cos, sin, positions, offset, eps, weight_offset,
                     interleaved, seq_dim):
    """``(dq, dk, grad_wq, grad_wk)`` in one launch (``dk``/``grad_wk`` empty without k), the gradients read
    through their strides; the weights' gradients are the per-token shares summed (no atomics)."""
    dq = torch.empty_like(q)
    dwq = _weight_rows(q, q_weight, seq_dim)
    if k is not None and k_weight is not None:
        dk, dwk = torch.empty_like(k), _weight_rows(k, k_weight, seq_dim)
    else:
        dk, dwk = q.new_empty(0), dwq.new_empty(0)
    launch_backward(grad_q, grad_k if k is not None else None, q, k, q_weight, k_weight, dq, dk, dwq, dwk, cos, sin,
                    positions, offset, eps, weight_offset, interleaved, seq_dim)
    grad_wq = dwq.sum(0).to(q_weight.dtype)                              # deterministic: no atomics
    grad_wk = dwk.sum(0).to(k_weight.dtype) if k_weight is not None else q_weight.new_empty(0)
    return dq, dk, grad_wq, grad_wk


class _NormRotation:
    """The eager QK-norm + rotation of calls with one signature: outputs allocated, one launch (see
    :func:`prepare`)."""

    __slots__ = ("launch", "grad", "spec", "convert")

    def __init__(self, launch: Launch, grad: bool, spec: tuple, convert: bool):
        self.launch, self.grad, self.spec = launch, grad, spec        # spec: (eps, weight_offset, interleaved, seq_dim)
        self.convert = convert

    def __call__(self, q, k, q_weight, k_weight, cos, sin, positions, offset):
        if self.convert:
            cos, sin = _float32_tables(cos, sin)
        if self.grad:
            return _NormAutograd.apply(q, k, q_weight, k_weight, cos, sin, positions, offset, self)
        return self.forward(q, k, q_weight, k_weight, cos, sin, positions, offset)

    def forward(self, q, k, q_weight, k_weight, cos, sin, positions, offset):
        qo = torch.empty_like(q)
        ko = None if k is None else torch.empty_like(k)
        self.launch(q, q if k is None else k, qo, qo if ko is None else ko, q_weight,
                    q_weight if k_weight is None else k_weight, cos, sin, cos if positions is None else positions,
                    offset)
        return qo, ko


class _NormAutograd(torch.autograd.Function):
    """Eager training: the prepared launch forward, one launch backward (no custom-op dispatch)."""

    @staticmethod
    def forward(ctx, q, k, q_weight, k_weight, cos, sin, positions, offset, rotation):
        qo, ko = rotation.forward(q, k, q_weight, k_weight, cos, sin, positions, offset)
        ctx.save_for_backward(q, k, q_weight, k_weight, cos, sin, positions)
        ctx.offset, ctx.rotation = offset, rotation
        return qo, ko

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        q, k, q_weight, k_weight, cos, sin, positions = ctx.saved_tensors
        eps, weight_offset, interleaved, seq_dim = ctx.rotation.spec
        dq, dk, dwq, dwk = _backward_launch(grad_q, grad_k, q, k, q_weight, k_weight, cos, sin, positions, ctx.offset,
                                            eps, weight_offset, interleaved, seq_dim)
        if k is None:
            dk = dwk = None
        return dq, dk, dwq, dwk, None, None, None, None, None


def prepare(q, k, q_weight, k_weight, cos, sin, positions, offset: int, eps: float, weight_offset: float,
            layout: str, seq_dim: int) -> _NormRotation:
    """The eager call of :func:`rms_norm_rope_qk` for calls like this one (same shapes, strides, dtypes and
    settings), specialised once (tables that are not float32 with one pair of strides are converted by
    every call):
    ``rotation(q, k, q_weight, k_weight, cos, sin, positions, offset) -> (q_out, k_out)``, recording
    gradients when autograd records any of q, k and the weights."""
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, q_weight, k_weight))
    convert = _converted(cos, sin)
    cos, sin = _float32_tables(cos, sin)
    qo = torch.empty_like(q, device="meta")
    ko = None if k is None else torch.empty_like(k, device="meta")
    interleaved = layout == "interleaved"
    grid, args, meta = forward_args(q, k, q_weight, k_weight, qo, ko, cos, sin, positions, offset, eps,
                                    weight_offset, interleaved, seq_dim)
    launch = Launch(_norm_rope_qk_kernel, grid, args[_FWD_PER_CALL:], meta, _FWD_TENSORS)
    return _NormRotation(launch, grad, (eps, weight_offset, interleaved, seq_dim), convert)


# ---- tracing: opaque nodes for torch.compile / torch.export ----------------------------------------------------


@torch.library.custom_op("posenc::rms_norm_rope_qk", mutates_args=())
def _norm_rope_op(q: torch.Tensor, k: torch.Tensor | None, q_weight: torch.Tensor, k_weight: torch.Tensor | None,
                  cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None, offset: int, eps: float,
                  weight_offset: float, interleaved: bool, seq_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    qo = torch.empty_like(q)
    ko = torch.empty_like(k) if k is not None else q.new_empty(0)
    launch_forward(q, k, q_weight, k_weight, qo, ko, cos, sin, positions, offset, eps, weight_offset, interleaved,
                   seq_dim)
    return qo, ko


@_norm_rope_op.register_fake
def _(q, k, q_weight, k_weight, cos, sin, positions, offset, eps, weight_offset, interleaved, seq_dim):
    return torch.empty_like(q), (torch.empty_like(k) if k is not None else q.new_empty(0))


@torch.library.custom_op("posenc::rms_norm_rope_qk_backward", mutates_args=())
def _norm_rope_bwd_op(grad_q: torch.Tensor, grad_k: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor | None,
                      q_weight: torch.Tensor, k_weight: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                      positions: torch.Tensor | None, offset: int, eps: float, weight_offset: float,
                      interleaved: bool, seq_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_launch(grad_q, grad_k, q, k, q_weight, k_weight, cos, sin, positions, offset, eps,
                            weight_offset, interleaved, seq_dim)


@_norm_rope_bwd_op.register_fake
def _(grad_q, grad_k, q, k, q_weight, k_weight, cos, sin, positions, offset, eps, weight_offset, interleaved,
      seq_dim):
    return (torch.empty_like(q), torch.empty_like(k) if k is not None else q.new_empty(0), torch.empty_like(q_weight),
            torch.empty_like(k_weight) if k_weight is not None else q_weight.new_empty(0))


def _setup_context(ctx, inputs, output):
    q, k, q_weight, k_weight, cos, sin, positions, offset, eps, weight_offset, interleaved, seq_dim = inputs
    empty = q.new_empty(0)
    ctx.save_for_backward(q, k if k is not None else empty, q_weight, k_weight if k_weight is not None else empty,
                          cos, sin, positions if positions is not None else empty)
    ctx.has_k = k is not None
    ctx.has_pos = positions is not None
    ctx.args = (offset, eps, weight_offset, interleaved, seq_dim)


def _backward(ctx, grad_q, grad_k):
    q, k, q_weight, k_weight, cos, sin, positions = ctx.saved_tensors
    k, k_weight = (k, k_weight) if ctx.has_k else (None, None)
    dq, dk, dwq, dwk = _norm_rope_bwd_op(grad_q, grad_k if ctx.has_k else None, q, k, q_weight, k_weight, cos, sin,
                                         positions if ctx.has_pos else None, *ctx.args)
    if not ctx.has_k:
        dk = dwk = None
    return dq, dk, dwq, dwk, None, None, None, None, None, None, None, None


_norm_rope_op.register_autograd(_backward, setup_context=_setup_context)


def rms_norm_rope_qk(q: torch.Tensor, k: torch.Tensor | None, q_weight: torch.Tensor, k_weight: torch.Tensor | None,
                     *, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None, offset: int, eps: float,
                     weight_offset: float, layout: str, seq_dim: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMS-normalise, scale and rotate q and k by the rows of ``(P, d/2)`` tables, one launch for both.

    The engine interface of :mod:`posenc.kernels`.  ``seq_dim`` is 2 for ``(B, H, S, D)`` or 1 for
    ``(B, S, H, D)``; each weight is ``(D,)`` (a norm per head) or ``(H*D,)`` (one norm over the
    token's heads); ``positions`` is ``(S,)``, ``(B, S)`` or None.  Callers validate the arguments
    and pick this engine.
    """
    if torch.compiler.is_compiling():
        cos, sin = _float32_tables(cos, sin)
        qo, ko = _norm_rope_op(q, k, q_weight, k_weight, cos, sin, positions, offset, float(eps),
                               float(weight_offset), layout == "interleaved", seq_dim)
        return qo, (ko if k is not None else None)
    return prepare(q, k, q_weight, k_weight, cos, sin, positions, offset, float(eps), float(weight_offset), layout,
                   seq_dim)(q, k, q_weight, k_weight, cos, sin, positions, offset)
