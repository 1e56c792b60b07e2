"""The torch engine of QK-RMSNorm + RoPE: the plain differentiable reference (not public).

The reference of :mod:`posenc.kernels.triton_norm_rope`, with the same signature: each head ``x``
(or all heads of a token, for an ``(H*D,)`` weight) becomes
``rotate(x * rsqrt(mean(x^2) + eps) * (weight_offset + weight))`` in float32 (float64 for float64
inputs), rounded once to the input dtype, with the rows of the tables looked up as
:func:`posenc.kernels.torch_rope.rope_qk` looks them up.
"""

from __future__ import annotations

import torch

from posenc._torch.angles import working_dtype
from posenc._torch.rows import broadcast_rows, table_rows
from posenc.kernels import torch_rope

__all__ = ["norm_rope_reference", "prepare", "rms_norm_rope_qk"]


def rms_norm_rope_qk(q: torch.Tensor, k: torch.Tensor | None, q_weight: torch.Tensor, k_weight: torch.Tensor | None,
                     *, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None, offset: int, eps: float,
                     weight_offset: float, layout: str, seq_dim: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMS-normalise, scale and rotate q and k by the rows of ``(P, d/2)`` tables (differentiable).

    The engine interface of :mod:`posenc.kernels` (see
    :func:`posenc.kernels.triton_norm_rope.rms_norm_rope_qk`).  Callers validate the arguments and
    pick this engine.
    """
    seq_len = q.shape[seq_dim]
    c = table_rows(cos, positions, offset, seq_len)                     # (S, d/2) or (B, S, d/2)
    s = table_rows(sin, positions, offset, seq_len)
    c, s = broadcast_rows(c, 4, seq_dim), broadcast_rows(s, 4, seq_dim)  # against (B, H, S, d/2) or (B, S, H, d/2)
    head_axis = 3 - seq_dim                                             # (B, H, S, D): 1; (B, S, H, D): 2
    q_out = norm_rope_reference(q, q_weight, c, s, eps=eps, weight_offset=weight_offset, layout=layout,
                                head_axis=head_axis, token=q_weight.shape[0] != q.shape[-1])
    if k is None or k_weight is None:
        return q_out, None
    return q_out, norm_rope_reference(k, k_weight, c, s, eps=eps, weight_offset=weight_offset, layout=layout,
                                      head_axis=head_axis, token=k_weight.shape[0] != k.shape[-1])


def prepare(q, k, q_weight, k_weight, cos, sin, positions, offset: int, eps: float, weight_offset: float,
            layout: str, seq_dim: int):
    """The eager call of :func:`rms_norm_rope_qk` for calls like this one: ``rotation(q, k, q_weight,
    k_weight, cos, sin, positions, offset) -> (q_out, k_out)``."""

    def rotation(q, k, q_weight, k_weight, cos, sin, positions, offset):
        return rms_norm_rope_qk(q, k, q_weight, k_weight, cos=cos, sin=sin, positions=positions, offset=offset,
                                eps=eps, weight_offset=weight_offset, layout=layout, seq_dim=seq_dim)
    return rotation


def norm_rope_reference(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, eps: float,
                        weight_offset: float, layout: str, head_axis: int, token: bool) -> torch.Tensor:
    """The plain differentiable reference: ``rotate(x * rsqrt(mean(x^2) + eps) * (weight_offset + weight))``.

    ``x`` is 4-D with its heads on ``head_axis``; ``cos``/``sin`` broadcast against ``x[..., :d/2]``;
    ``token`` normalises all heads of a token together (``weight`` ``(H*D,)``), else each head
    (``weight`` ``(D,)``).  Float32 math (float64 for float64 ``x``), one rounding to ``x``'s dtype.
    """
    ct = working_dtype(x.dtype)
    xf = x.to(ct)
    w = weight.to(ct)
    if token:
        ms = xf.pow(2).mean(dim=(head_axis, -1), keepdim=True)          # (B, 1, S, 1) or (B, S, 1, 1)
        shape = [1, 1, 1, x.shape[-1]]
        shape[head_axis] = x.shape[head_axis]
        w = w.reshape(shape)                                            # (1, H, 1, D) or (1, 1, H, D)
    else:
        ms = xf.pow(2).mean(dim=-1, keepdim=True)                       # (B, H, S, 1) or (B, S, H, 1)
    u = xf * torch.rsqrt(ms + eps) * (weight_offset + w)
    rot = 2 * cos.shape[-1]
    y = torch_rope.rotate_reference(u, cos, sin, layout=layout)        # (working dtype: no rounding yet)
    if rot < x.shape[-1]:
        y = torch.cat([y, u[..., rot:]], dim=-1)                        # normalised pass-through features
    return y.to(x.dtype)
