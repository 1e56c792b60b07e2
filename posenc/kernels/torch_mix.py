"""The torch engine of ``rounding="model"``: rotary embedding as a 2 x 2 mix of each feature pair,
rounded as a model's own eager code rounds.

Rotating one feature pair ``(x_a, x_b)`` by the angle ``t`` (Su et al., 2021, "RoFormer",
arXiv:2104.09864, eq. 13) is a 2 x 2 matrix per pair::

    out_a = cos t * x_a - sin t * x_b
    out_b = sin t * x_a + cos t * x_b

With the matrices of the rows a call needs laid out as factors ``M[..., i, j]`` (output slot
``i``, input slot ``j``), a rotation is two torch calls for any shape of rows, one row set per
batch element included (a left-padded batch): a broadcast product of ``x``, its pairs viewed as
an axis of two, with ``M``, and the addition of its two input slots.  With ``M`` in ``x``'s dtype each output
is ``round(round(x_a c) + round(x_b (-s)))``: the two products and the one addition of
transformers' ``q * cos + rotate_half(q) * sin`` with the same cos/sin, so the rotation equals the
model's own bit for bit in float32, bfloat16 and float16 alike (a low-precision product in
float32 would be slower there, as the promotion costs more than the arithmetic).

The factors are stored as one row of ``4h`` values per position (:func:`mix_rows`), so that a
table of them is looked up with the same gather as the model's cos/sin, and :func:`mix_view`
turns the gathered rows into the view :func:`rotate_mixed` multiplies by.

:func:`rope_qk` and :func:`prepare` are this engine's side of the engine interface of
:mod:`posenc.kernels` (what ``apply_rope_qk(..., rounding="model")`` runs); ``patch_model``'s stand-in
for a model's rotate function calls :func:`rotate_mixed` with factor rows it keeps per call.
"""

from __future__ import annotations

import torch

from posenc._torch.rows import broadcast_rows, table_rows
from posenc._torch.varlen import varlen_positions
from posenc.kernels.torch_rope import unpack_tables

__all__ = ["MIX_LAYOUTS", "mix_rows", "mix_view", "prepare", "rope_qk", "rotate_mixed", "unpack_tables"]

#: Up to this many elements of x the two input slots are added by a reduction over their axis (one
#: call, the least per-call cost); past it by an elementwise addition of the two slots (a reduction
#: over an axis of two runs several times slower per element).  Both round ``a + b`` once.
_SUM_MAX = 512


#: The pair layouts a mix reads and writes: per layout, how ``x`` ``(..., 2h)`` is viewed (``j``: the
#: input slot, ``i``: a new axis for the output slot), the factors' axes, and the axis summed over.
#: ``"half"``: pairs ``(k, k + h)``; ``"interleaved"``: pairs ``(2k, 2k + 1)``; ``"interleaved_to_half"``:
#: pairs read at ``(2k, 2k + 1)`` and written to ``(k, k + h)`` (the models that de-interleave their
#: features before a half-split rotation, as DeepSeek-V3's multi-head latent attention does).
MIX_LAYOUTS = ("half", "interleaved", "interleaved_to_half")


def mix_rows(cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """The factors ``(..., 4h)`` of narrow ``cos``/``sin`` ``(..., h)`` rows, ``M[i, j]`` (output slot
    ``i``, input slot ``j``: ``[[cos, -sin], [sin, cos]]``) laid out as :func:`mix_view` reads them:
    ``(i, j, pair)`` for ``"half"``, ``(pair, i, j)`` for ``"interleaved"``, ``(i, pair, j)`` for
    ``"interleaved_to_half"``.  (A rotation the other way round takes ``-sin``.)"""
    m = torch.stack([torch.stack([cos, -sin]), torch.stack([sin, cos])])    # (2 outputs, 2 inputs, ..., h)
    m = m.movedim((0, 1), _FACTOR_AXES[layout])
    return m.flatten(-3)


def mix_view(rows: torch.Tensor, layout: str) -> torch.Tensor:
    """The factors ``M`` for :func:`rotate_mixed` from :func:`mix_rows` rows ``(..., 4h)`` (a view,
    so rows may be a strided slice of wider ones): ``(..., 2, 2, h)`` for ``"half"``,
    ``(..., h, 2, 2)`` for ``"interleaved"``, ``(..., 2, h, 2)`` for ``"interleaved_to_half"``."""
    h = rows.shape[-1] >> 2
    return rows.view(*rows.shape[:-1], *_VIEW[layout](h))


def rotate_mixed(x: torch.Tensor, m: torch.Tensor, layout: str) -> torch.Tensor:
    """``x`` ``(..., 2h)`` rotated by the factors ``m`` of :func:`mix_view`, broadcast against ``x``'s
    leading axes and promoted with it as cos/sin rows would be (``x * cos`` has the dtype of the
    result)."""
    h = x.shape[-1] >> 1
    if layout == "half":
        both, axis = x.reshape(*x.shape[:-1], 1, 2, h) * m, -2
    elif layout == "interleaved":
        both, axis = x.reshape(*x.shape[:-1], h, 1, 2) * m, -1
    else:
        both, axis = x.reshape(*x.shape[:-1], 1, h, 2) * m, -1
    if x.numel() <= _SUM_MAX:
        return both.sum(axis).flatten(-2)              # a few rows: one reduction call costs least
    a, b = both.unbind(axis)
    return torch.add(a, b).flatten(-2)                 # more: an elementwise addition is far cheaper


#: where mix_rows moves the (output, input) axes, and the factors' trailing shape, per layout
_FACTOR_AXES = {"half": (-3, -2), "interleaved": (-2, -1), "interleaved_to_half": (-3, -1)}
_VIEW = {"half": lambda h: (2, 2, h), "interleaved": lambda h: (h, 2, 2), "interleaved_to_half": lambda h: (2, h, 2)}


# ---- the engine interface (posenc.kernels): apply_rope_qk(..., rounding="model") ------------------------------

def rope_qk(q: torch.Tensor, k: torch.Tensor | None, *, cos: torch.Tensor | None, sin: torch.Tensor | None,
            positions: torch.Tensor | None, offset: int | torch.Tensor, layout: str, seq_dim: int, inplace: bool,
            packed: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
            inverse: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate q and k by the rows of ``(P, h)`` tables as :func:`posenc.kernels.torch_rope.rope_qk` does, but
    rounded as a model's eager ``x * cos + rotate_half(x) * sin`` in x's dtype: the rows rounded to q's dtype,
    each product and the sum rounded to it.  Differentiable (out of place; in place copies the result back)."""
    if cos is None or sin is None:
        cos, sin = unpack_tables(packed, layout)                            # type: ignore[arg-type]
    if cu_seqlens is not None:
        pos = varlen_positions(cu_seqlens, q.shape[0], offset)[None]        # (1, T)
        qo, ko = rope_qk(q[None], None if k is None else k[None], cos=cos, sin=sin, positions=pos, offset=0,
                         layout=layout, seq_dim=1, inplace=inplace, inverse=inverse)
        return (q, k) if inplace else (qo[0], None if ko is None else ko[0])
    assert not isinstance(offset, torch.Tensor)                             # per-sequence offsets need cu_seqlens
    seq_len, nd, h = q.shape[seq_dim], q.dim(), cos.shape[-1]
    c = table_rows(cos, positions, offset, seq_len).to(q.dtype)             # rounded once, as the model's rows
    s = table_rows(sin, positions, offset, seq_len).to(q.dtype)
    rows = mix_rows(c, -s if inverse else s, layout)                        # (S, 4h) or (B, S, 4h)
    if rows.dim() != 2 or seq_dim != nd - 2:
        rows = broadcast_rows(rows, nd, seq_dim)
    m = mix_view(rows, layout)
    return _rotate(q, m, h, layout, inplace), (None if k is None else _rotate(k, m, h, layout, inplace))


def _rotate(x: torch.Tensor, m: torch.Tensor, h: int, layout: str, inplace: bool) -> torch.Tensor:
    d = 2 * h
    rot = rotate_mixed(x if d == x.shape[-1] else x[..., :d], m, layout)
    if inplace:
        x[..., :d] = rot
        return x
    return rot if d == x.shape[-1] else torch.cat([rot, x[..., d:]], -1)


def prepare(q, k, cos, sin, positions, offset, layout: str, seq_dim: int, inplace: bool, cu_seqlens=None,
            inverse: bool = False):
    """The eager call of :func:`rope_qk` for calls like this one (the plan a public call keeps)."""
    def rotation(q, k, cos, sin, positions, offset, cu_seqlens=None, packed=None, factors=None):
        return rope_qk(q, k, cos=cos, sin=sin, positions=positions, offset=offset, layout=layout, seq_dim=seq_dim,
                       inplace=inplace, packed=packed, cu_seqlens=cu_seqlens, inverse=inverse)
    return rotation
