"""A rotary decode step at its cost floor: the four steps of a rotary call in one function.

A decode step rotates one new token (or a few): q ``(1, H, S, D)`` and k ``(1, H_k, S, D)`` at a
host-known ``offset``.  At that size every torch call costs more than its arithmetic, so this
function takes the steps of :mod:`posenc._torch.rope_call` at once: it recognises the case on the
host (reading nothing from the device), and then rotates q and k with the torch engine's few calls:

- q and k concatenated along the heads and converted to float32 once (every product in float32);
- the half layout: ``x * [cos | cos] + roll(x, D/2) * [-sin | sin]``, the same two torch calls
  (a product, then ``addcmul_``) as the engine's other paths, so a decode step and a prefill agree
  bit for bit; the interleaved layout: one complex multiplication by ``cos + i sin``;
- one rounding back to the input dtype, and two views of the result.

The factors are precomputed whole tables that one lookup each turns into rows: views of
``RotaryEmbedding``'s packed table (:func:`posenc.kernels.factor_cache.decode_factors`), or, for ``apply_rope_qk``'s
``(cos, sin)`` tables, :mod:`posenc.kernels.factor_cache`.
"""

from __future__ import annotations

import torch

from posenc._torch.backend import kernel_possible
from posenc.kernels.factor_cache import cached_factors, table_factors

__all__ = ["DECODE_MAX", "decode_qk"]

#: Inputs a decode step serves at its floor (float64 inputs take float64 angles: the general path).
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Up to this many elements of q and k together (a decode step; the torch engine's small path).
DECODE_MAX = 1 << 18
#: The one rounding back from float32, by the tensor method that costs least per call.
_NARROW = {torch.bfloat16: torch.Tensor.bfloat16, torch.float16: torch.Tensor.half}
_F32 = torch.float32


def decode_qk(q: object, k: object, seq_dim: object, offset: object, dim: int, rows: int, backend: str,
              factors: tuple[torch.Tensor, ...] | None, tables: tuple[torch.Tensor, torch.Tensor, str] | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(q_rotated, k_rotated)`` for a decode step, or None when the call is not one.

    The case: ``q (1, H, S, D)`` and ``k (1, H_k, S, D)`` (``seq_dim`` -2 or 2; or ``(1, S, H, D)``
    with ``seq_dim=1``) of one float16/bfloat16/float32 dtype on the factors' device, ``D = dim``
    the rotary dim, at most :data:`DECODE_MAX` elements, no autograd (of q, k or the tables), not
    tracing, an int ``offset`` with the positions ``offset .. offset + S - 1`` inside the ``rows`` rows of the tables, and a
    ``backend`` that gives the torch engine for these tensors (``"torch"``, or ``"auto"`` off
    CUDA).  Every argument is then valid.  Anything else, an invalid argument included, returns
    None before any torch call: the caller's general path checks it and says what is wrong.

    ``factors`` are :func:`posenc.kernels.factor_cache.decode_factors` of the caller's packed table; or None, and ``tables``
    the float32 ``(cos, sin, layout)`` of ``apply_rope_qk``, whose factors come from
    :func:`posenc.kernels.factor_cache.cached_factors` (or are built from this step's rows).
    """
    # (tracing first: no test on a shape may become a guard of a compiled graph)
    if torch.compiler.is_compiling() or not (type(q) is torch.Tensor and type(k) is torch.Tensor
                                             and type(offset) is int):
        return None
    qs, ks = q.shape, k.shape
    if len(qs) != 4 or len(ks) != 4 or qs[0] != 1 or ks[0] != 1:
        return None
    if seq_dim == -2 or seq_dim == 2:
        sd = 2
    elif seq_dim == 1 and type(seq_dim) is int:
        sd = 1
    else:
        return None
    d, length, dtype = qs[3], qs[sd], q.dtype
    if not (d == dim and ks[3] == d and ks[sd] == length and k.dtype is dtype and dtype in _DTYPES and 0 < length
            and 0 <= offset and offset + length <= rows and q.numel() + k.numel() <= DECODE_MAX):
        return None
    table = factors[0] if factors is not None else tables[0]  # type: ignore[index]
    if kernel_possible(backend, q) or not (k.is_cpu and table.is_cpu if q.is_cpu else
                                           q.device == k.device == table.device):
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or factors is None and (
            tables[0].requires_grad or tables[1].requires_grad)):  # type: ignore[index]
        return None                                           # autograd records: the engine's reference path
    if factors is None:
        cos, sin, layout = tables                             # type: ignore[misc]
        factors = cached_factors(cos, sin, layout)
        if factors is None:                                   # this step's rows only
            factors = table_factors(cos.narrow(0, offset, length), sin.narrow(0, offset, length), layout)
            offset = 0
    head = 3 - sd                                             # the heads' axis
    both = torch.cat([q, k], head)                            # (1, H + H_k, S, D) or (1, S, H + H_k, D)
    if dtype is not _F32:
        both = both.float()
    if len(factors) == 2:
        a, b = factors
        if length == 1:
            a, b = a[offset], b[offset]
        else:
            a, b = a.narrow(0, offset, length), b.narrow(0, offset, length)
            if sd == 1:
                a, b = a.unsqueeze(1), b.unsqueeze(1)         # (S, 1, D) against (1, S, H, D)
        rot = both.roll(d >> 1, -1)                           # x2 first, then x1
        rot = both.mul_(a).addcmul_(rot, b)                   # (both is this call's own tensor)
    else:
        cis = factors[0][offset] if length == 1 else factors[0].narrow(0, offset, length)
        if length > 1 and sd == 1:
            cis = cis.unsqueeze(1)
        n0, n1, n2, _ = both.shape
        torch.view_as_complex(both.view(n0, n1, n2, d >> 1, 2)).mul_(cis)
        rot = both
    if dtype is not _F32:
        rot = _NARROW[dtype](rot)                             # one rounding
    q_out, k_out = rot.split_with_sizes((qs[head], ks[head]), head)
    return q_out, k_out
