"""Rotary position embedding (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position
Embedding", arXiv:2104.09864): pure torch functions.

Feature pair ``(x1, x2)`` at position ``m`` with frequency ``theta`` becomes
``(x1 cos(m theta) - x2 sin(m theta), x2 cos(m theta) + x1 sin(m theta))``.  Which features pair up
is the ``layout``::

    layout="half"         (GPT-NeoX, Hugging Face)      pairs (i, i + d/2)
        x = [ a0 a1 a2 a3 | b0 b1 b2 b3 | pass-through ]     pair i = (a_i, b_i)
    layout="interleaved"  (GPT-J, Meta's Llama code)   pairs (2i, 2i + 1)
        x = [ a0 b0 a1 b1 a2 b2 a3 b3 | pass-through ]       pair i = (a_i, b_i)

``x_half = x_interleaved[..., layout_permutation(d)]`` converts one into the other.  Features past
the rotary dim ``d = 2 * cos.shape[-1]`` pass through unchanged (partial rotary).

Angles are exact (:mod:`posenc.core.exact`); the rotation runs in float32 (float64 for float64
inputs) and rounds once to the input dtype.
"""

from __future__ import annotations

import torch

from posenc import _validate
from posenc.core import exact as _exact
from posenc.core import rope as _core
from posenc.functional._common import check_position_args, check_position_range, check_positions, exact_sin_cos

__all__ = [
    "apply_rope",
    "apply_rope_qk",
    "convert_rope_weight",
    "layout_permutation",
    "rope_cos_sin",
    "rope_inv_freq",
]

LAYOUTS = ("half", "interleaved")
#: ``"auto"`` uses the Triton kernel for CUDA tensors when Triton imports and the case is supported
#: (4-D q/k with the sequence on axis 1 or 2, float16/bfloat16/float32), else the torch path.
BACKENDS = ("auto", "torch", "triton")
#: Elements per block of the cache-blocked in-place path (float32: 1 MiB).
_BLOCK = 1 << 18


def rope_inv_freq(
    dim: int,
    *,
    base: float = 10000.0,
    scaling: _core.RopeScaling | None = None,
    seq_len: int | None = None,
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention factor of a rotary embedding.

    Args:
        dim: rotary dim (even): the number of features rotated.
        base: frequency base (``theta``/``rope_theta`` elsewhere).
        scaling: a context-extension rule (:class:`posenc.LinearScaling`, ...) or None.
        seq_len: the current sequence length, read only by length-dependent rules
            (dynamic NTK, LongRoPE).

    Returns:
        ``(inv_freq, attention_factor)``: float64 tensor ``(dim/2,)`` and a float.

    Examples:
        >>> inv_freq, factor = rope_inv_freq(8)
        >>> inv_freq
        tensor([1.0000, 0.1000, 0.0100, 0.0010], dtype=torch.float64)
    """
    freqs, factor = _core.inv_freq(dim, base, scaling, seq_len)
    return torch.from_numpy(freqs), factor


def _exact_cos_sin(positions: torch.Tensor, turns, attention_factor: float, dtype: torch.dtype):
    """``(cos, sin)`` of ``positions (...)`` with split frequencies ``turns (4, h)`` -> ``(..., h)``."""
    s, c = exact_sin_cos(positions, turns)
    if attention_factor != 1.0:
        c, s = c * attention_factor, s * attention_factor
    return c.to(dtype), s.to(dtype)


def rope_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    attention_factor: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Layout-free ``cos``/``sin`` of ``positions * inv_freq``, times ``attention_factor``.

    The angles are exact for the given (float64) frequencies and each value is rounded once to
    ``dtype``.  :class:`posenc.nn.RotaryEmbedding` goes further and uses the frequencies to ~190
    bits, so its tables are exact with respect to the rule's formula itself.

    Args:
        positions: integer tensor of any shape, e.g. ``(S,)`` or ``(B, S)``.
        inv_freq: ``(dim/2,)`` frequencies, e.g. from :func:`rope_inv_freq`.
        attention_factor: multiplies cos and sin (YaRN, LongRoPE).
        dtype: output dtype.

    Returns:
        ``(cos, sin)``, each of shape ``(..., dim/2)``.

    Examples:
        >>> cos, sin = rope_cos_sin(torch.arange(3), torch.tensor([1.0], dtype=torch.float64))
        >>> cos.squeeze(-1), sin.squeeze(-1)
        (tensor([ 1.0000,  0.5403, -0.4161]), tensor([0.0000, 0.8415, 0.9093]))
    """
    check_positions("positions", positions)
    check_position_range("positions", positions)
    if not isinstance(inv_freq, torch.Tensor) or inv_freq.dim() != 1:
        raise TypeError(f"inv_freq must be a 1-D tensor of frequencies (dim/2,), got {inv_freq!r:.80}")
    attention_factor = _validate.check_float("attention_factor", attention_factor, minimum=0.0)
    turns = _exact.turns_split(tuple(float(f) for f in inv_freq.detach().double().cpu()))
    return _exact_cos_sin(positions, turns, attention_factor, dtype)


def layout_permutation(dim: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """``cat(arange(0, dim, 2), arange(1, dim, 2))``: ``x_half = x_interleaved[..., perm]``.

    Examples:
        >>> layout_permutation(6)
        tensor([0, 2, 4, 1, 3, 5])
    """
    dim = _validate.check_int("dim", dim, minimum=1)
    return torch.cat([torch.arange(0, dim, 2, device=device), torch.arange(1, dim, 2, device=device)])


def convert_rope_weight(
    weight: torch.Tensor,
    num_heads: int,
    *,
    src: str,
    dst: str,
    rotary_dim: int | None = None,
) -> torch.Tensor:
    """Permute a q or k projection between ``"interleaved"`` and ``"half"`` RoPE checkpoints.

    A model whose RoPE pairs features ``(2i, 2i+1)`` (Meta's Llama code) gives the same attention
    scores as a ``"half"`` model (Hugging Face) whose projection rows are permuted within every
    head by :func:`layout_permutation` (the permutation of transformers' ``convert_llama_weights``).
    Only the first ``rotary_dim`` rows of each head move.  Under GQA, convert q with the query head
    count and k with the key/value head count.

    Args:
        weight: ``(num_heads * head_dim, in_features)`` projection weight, or its ``(num_heads * head_dim,)`` bias.
        num_heads: heads in this projection.
        src, dst: ``"interleaved"`` or ``"half"``.
        rotary_dim: rotated features per head (default: the whole head).

    Returns:
        The permuted copy, same shape.
    """
    _validate.check_choice("src", src, LAYOUTS)
    _validate.check_choice("dst", dst, LAYOUTS)
    num_heads = _validate.check_int("num_heads", num_heads, minimum=1)
    if not isinstance(weight, torch.Tensor) or weight.dim() not in (1, 2):
        raise TypeError("weight must be a 1-D bias or 2-D (out_features, in_features) tensor")
    if weight.shape[0] % num_heads:
        raise ValueError(f"weight has {weight.shape[0]} rows, not a multiple of num_heads={num_heads}")
    head_dim = weight.shape[0] // num_heads
    rotary_dim = head_dim if rotary_dim is None else _validate.check_int("rotary_dim", rotary_dim, minimum=2)
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be even and <= head_dim={head_dim}, got {rotary_dim}")
    if src == dst:
        return weight.clone()
    perm = layout_permutation(rotary_dim, device=weight.device)
    if src == "half":
        perm = torch.argsort(perm)                                    # the inverse permutation
    index = torch.cat([perm, torch.arange(rotary_dim, head_dim, device=weight.device)])
    heads = weight.reshape(num_heads, head_dim, *weight.shape[1:])   # (H, head_dim[, in])
    return heads[:, index].reshape(weight.shape)


def _halves(x: torch.Tensor, h: int, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two members of every pair, as views of ``x[..., :2h]``."""
    if layout == "half":
        return x[..., :h], x[..., h : 2 * h]
    return x[..., 0 : 2 * h : 2], x[..., 1 : 2 * h : 2]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_rope_args(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> int:
    _validate.check_choice("layout", layout, LAYOUTS)
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating tensor, got dtype {t.dtype}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    h = cos.shape[-1]
    if 2 * h > x.shape[-1]:
        raise ValueError(
            f"the rotary dim 2 * cos.shape[-1] = {2 * h} exceeds x's feature dim {x.shape[-1]}; "
            f"build cos/sin for a rotary dim <= the head dim"
        )
    try:
        torch.broadcast_shapes(x[..., :h].shape, cos.shape)
    except RuntimeError:
        raise ValueError(
            f"cos/sin of shape {tuple(cos.shape)} do not broadcast against x[..., :{h}] of shape "
            f"{tuple(x[..., :h].shape)}; for x (B, H, S, D) pass (S, D/2), for (B, S, H, D) pass (S, 1, D/2)"
        ) from None
    return h


def _rotate_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, h: int, layout: str) -> torch.Tensor:
    """Differentiable out-of-place rotation of ``x[..., :2h]`` (the plain reference)."""
    ct = _compute_dtype(x.dtype)
    x1, x2 = _halves(x.to(ct), h, layout)
    c, s = cos.to(ct), sin.to(ct)
    o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
    if layout == "half":
        rot = torch.cat([o1, o2], dim=-1)
    else:
        rot = torch.stack([o1, o2], dim=-1).flatten(-2)                  # (..., h, 2) -> (..., 2h)
    return rot.to(x.dtype)


def _blocks(xs: list[torch.Tensor], bs: list[torch.Tensor]):
    """Split same-shaped ``xs`` (and ``bs``, broadcasting against them with the same rank) along
    leading dims into cache-sized blocks; yields ``(x_blocks, b_blocks)``."""
    x = xs[0]
    if x.numel() <= _BLOCK or x.dim() == 1:
        yield xs, bs
        return
    n0 = x.shape[0]
    per = x.numel() // max(n0, 1)
    if per <= _BLOCK:
        step = max(1, _BLOCK // max(per, 1))
        for i in range(0, n0, step):
            sl = slice(i, i + step)
            yield [t[sl] for t in xs], [b if b.shape[0] == 1 else b[sl] for b in bs]
    else:
        for i in range(n0):
            yield from _blocks([t[i] for t in xs], [b[0] if b.shape[0] == 1 else b[i] for b in bs])


def _complex_view(t: torch.Tensor) -> torch.Tensor | None:
    """``t (..., 2h)`` viewed as complex ``(..., h)`` when its strides allow it, else None."""
    if t.stride(-1) != 1 or any(st % 2 for st in t.stride()[:-1]) or t.storage_offset() % 2:
        return None
    return torch.view_as_complex(t.unflatten(-1, (t.shape[-1] // 2, 2)))


def _rotate_blocked(src: torch.Tensor, dst: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, h: int, layout: str) -> None:
    """``dst = rotate(src)`` for ``x[..., :2h]`` views (``dst`` may be ``src``), block by block.

    Each block stays in cache while it is upcast to float32 (if needed), rotated and rounded back
    once.  Interleaved pairs rotate as one complex multiplication; half-split pairs take
    ``t = x1 sin; x1 = x1 cos - x2 sin; x2 = x2 cos + t``.  The values equal the reference's up to
    the rounding of the float32 arithmetic.
    """
    ct = _compute_dtype(dst.dtype)
    c = cos.to(ct).reshape((1,) * (dst.dim() - cos.dim()) + tuple(cos.shape))
    s = sin.to(ct).reshape(c.shape)
    use_complex = layout == "interleaved"
    bcast = [c, s, torch.complex(c, s)] if use_complex else [c, s]
    scratch: dict[str, torch.Tensor] = {}

    def buffer(name: str, shape: torch.Size) -> torch.Tensor:
        n = shape.numel()
        if name not in scratch or scratch[name].numel() < n:
            scratch[name] = torch.empty(max(n, _BLOCK), dtype=ct, device=dst.device)
        return scratch[name][:n].view(shape)

    for (sb, db), (cb, sib, *cis) in _blocks([src, dst], bcast):
        if db.dtype == ct:
            work = db
            if sb is not db:
                work.copy_(sb)
        else:
            work = buffer("work", db.shape)                                # float32 copy of the block
            work.copy_(sb)
        wc = _complex_view(work) if use_complex else None
        if wc is not None:
            wc.mul_(cis[0])
        else:
            x1, x2 = _halves(work, h, layout)
            tmp = buffer("tmp", x1.shape)
            torch.mul(x1, sib, out=tmp)
            x1.mul_(cb).addcmul_(x2, sib, value=-1)
            x2.mul_(cb).add_(tmp)
        if work is not db:
            db.copy_(work)                                                 # one rounding to x's dtype


def _triton_case(x: torch.Tensor, seq_dim: int | None) -> str | None:
    """Why the Triton kernel cannot take ``x`` (None if it can)."""
    if x.dim() != 4:
        return f"x must be 4-D (B, H, S, D) or (B, S, H, D), got {x.dim()}-D"
    if seq_dim not in (1, 2):
        return "the sequence axis must be 1 or 2 of a 4-D tensor"
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"dtype {x.dtype} is not supported by the kernel (float16, bfloat16, float32)"
    return None


def _shared_rows_axis(x: torch.Tensor, cos: torch.Tensor, h: int) -> int | None:
    """The axis of a 4-D ``x`` along which ``cos`` is one ``(S, h)`` row set, as the kernel needs:
    ``(..., S, h)`` against axis 2, ``(..., S, 1, h)`` against axis 1 (leading dims all 1)."""
    rows = cos.numel() // h
    if x.dim() != 4 or rows < 2:
        return None
    if tuple(cos.shape[-3:]) == (rows, 1, h) and x.shape[1] == rows:
        return 1
    if tuple(cos.shape[-2:]) == (rows, h) and x.shape[2] == rows:
        return 2
    return None


def use_triton(backend: str, x: torch.Tensor, why_not: str | None) -> bool:
    """Resolve ``backend`` for ``x``: the documented, deterministic dispatch rule."""
    _validate.check_choice("backend", backend, BACKENDS)
    if backend == "torch":
        return False
    from posenc.kernels import triton_available

    if backend == "triton":
        if not triton_available(x.device):
            raise ValueError(
                "backend='triton' needs Triton and a CUDA tensor (CPU tensors only with TRITON_INTERPRET=1); "
                "use backend='torch' or 'auto'"
            )
        if why_not is not None:
            raise ValueError(f"backend='triton' does not support this case: {why_not}; use backend='torch' or 'auto'")
        return True
    return x.device.type == "cuda" and why_not is None and triton_available(x.device)


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "half",
    inplace: bool = False,
    backend: str = "auto",
) -> torch.Tensor:
    """Rotate the first ``2 * cos.shape[-1]`` features of ``x``; the rest pass through unchanged.

    Args:
        x: ``(..., D)`` queries or keys, e.g. ``(B, H, S, D)`` or ``(B, S, H, D)``; any strides.
        cos, sin: ``(..., d/2)`` broadcasting against ``x[..., :d/2]``: ``(S, d/2)`` for
            ``(B, H, S, D)``, ``(S, 1, d/2)`` for ``(B, S, H, D)``, ``(B, 1, S, d/2)`` for per-row
            positions; from :func:`rope_cos_sin`.
        layout: ``"half"`` (pairs ``i, i + d/2``) or ``"interleaved"`` (pairs ``2i, 2i + 1``).
        inplace: rotate ``x`` itself and return it (no output allocation; the fast path).
        backend: ``"auto"`` (Triton for supported CUDA tensors, else torch), ``"torch"`` or
            ``"triton"`` (raises if the kernel cannot take the case).  The kernel takes 4-D ``x``
            with one ``(S, d/2)`` row set broadcast along axis 2 (or ``(S, 1, d/2)`` along axis 1).

    Returns:
        The rotated tensor, same shape and dtype as ``x``.

    Raises:
        TypeError: non-tensor or non-floating input.
        ValueError: unknown layout, rotary dim larger than ``D``, shapes that do not broadcast.

    Examples:
        >>> x = torch.tensor([[1.0, 0.0]])                      # one pair at position 1, theta = 1
        >>> cos, sin = torch.tensor([[0.5403]]), torch.tensor([[0.8415]])
        >>> apply_rope(x, cos, sin)
        tensor([[0.5403, 0.8415]])
    """
    h = _check_rope_args(x, cos, sin, layout)
    if backend != "torch":
        seq_dim = _shared_rows_axis(x, cos, h)
        why = _triton_case(x, seq_dim) if seq_dim is not None else "cos/sin must be one (S, d/2) row set shared by the batch"
        if not (cos.requires_grad or sin.requires_grad) and use_triton(backend, x, why):
            from posenc.kernels import triton_rope

            c = cos.reshape(-1, h).to(torch.float32).contiguous()
            s = sin.reshape(-1, h).to(torch.float32).contiguous()
            return triton_rope.rope_qk(x, None, c, s, None, 0, layout == "interleaved", seq_dim, inplace)[0]
    differentiable = torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad)
    if differentiable or torch.compiler.is_compiling():
        rot = _rotate_reference(x, cos, sin, h, layout)
        if inplace:
            x[..., : 2 * h] = rot
            return x
        return rot if 2 * h == x.shape[-1] else torch.cat([rot, x[..., 2 * h :]], dim=-1)
    if inplace:
        _rotate_blocked(x[..., : 2 * h], x[..., : 2 * h], cos, sin, h, layout)
        return x
    out = torch.empty_like(x)
    if 2 * h < x.shape[-1]:
        out[..., 2 * h :] = x[..., 2 * h :]
    _rotate_blocked(x[..., : 2 * h], out[..., : 2 * h], cos, sin, h, layout)
    return out


def _rows(table: torch.Tensor, positions: torch.Tensor | None, offset: int, seq_len: int) -> torch.Tensor:
    """Rows of a ``(P, d/2)`` table for ``positions`` (``(S,)``/``(B, S)``) or ``offset + arange(S)``."""
    if positions is None:
        if offset < 0 or offset + seq_len > table.shape[0]:
            raise ValueError(
                f"positions {offset}..{offset + seq_len - 1} are outside the cos/sin table of {table.shape[0]} rows; "
                f"build a longer table or use posenc.nn.RotaryEmbedding, which computes them"
            )
        return table[offset : offset + seq_len]
    if positions.numel() and not torch.compiler.is_compiling():
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= table.shape[0]:
            raise ValueError(
                f"positions must lie in [0, {table.shape[0]}) for this cos/sin table, got values in [{lo}, {hi}]"
            )
    return table[positions]


def broadcast_rows(rows: torch.Tensor, ndim: int, seq_dim: int) -> torch.Tensor:
    """Reshape ``(S, h)`` or ``(B, S, h)`` rows to broadcast against an ``ndim``-D tensor whose
    sequence axis is ``seq_dim`` (features last)."""
    shape = [1] * ndim
    shape[seq_dim] = rows.shape[-2]
    shape[-1] = rows.shape[-1]
    if rows.dim() == 3:
        if seq_dim == 0:
            raise ValueError("per-row positions (B, S) need a batch axis before the sequence axis")
        shape[0] = rows.shape[0]
    return rows.reshape(shape)


def normalize_seq_dim(x: torch.Tensor, seq_dim: int) -> int:
    """``seq_dim`` as a non-negative axis of ``x`` that is not the feature axis."""
    seq_dim = _validate.check_int("seq_dim", seq_dim)
    nd = x.dim()
    if not -nd <= seq_dim < nd or seq_dim % nd == nd - 1:
        raise ValueError(
            f"seq_dim={seq_dim} is not a sequence axis of a {nd}-D tensor (features are last); "
            f"use -2 for (B, H, S, D) or 1 for (B, S, H, D)"
        )
    return seq_dim % nd


def apply_rope_qk(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    positions: torch.Tensor | None = None,
    offset: int = 0,
    layout: str = "half",
    seq_dim: int = -2,
    inplace: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate queries and keys together from ``(P, d/2)`` cos/sin tables.

    The rows for ``positions`` (``(S,)`` or ``(B, S)``), or for ``offset .. offset + S - 1``, are
    looked up and broadcast along ``seq_dim``; q and k may have different head counts (GQA).
    This is the single call a fused kernel plugs in under.

    Args:
        q: ``(B, H, S, D)`` (``seq_dim=-2``) or ``(B, S, H, D)`` (``seq_dim=1``).
        k: like ``q`` with its own head count, or None.
        cos, sin: tables ``(P, d/2)``, e.g. ``rope_cos_sin(torch.arange(P), inv_freq)``.
        positions: integer positions, ``(S,)`` or ``(B, S)``; default ``offset + arange(S)``.
        offset: first position when ``positions`` is None (step-by-step decoding).
        layout: ``"half"`` or ``"interleaved"``.
        seq_dim: the sequence axis of q and k.
        inplace: rotate q and k in place.
        backend: ``"auto"``, ``"torch"`` or ``"triton"`` (the fused kernel: one launch for q and k,
            reading the tables directly).

    Returns:
        ``(q_rotated, k_rotated)`` (``k_rotated`` is None when ``k`` is None).
    """
    if not isinstance(q, torch.Tensor) or (k is not None and not isinstance(k, torch.Tensor)):
        raise TypeError("q (and k, unless None) must be torch.Tensors")
    if cos.dim() != 2 or cos.shape != sin.shape:
        raise ValueError(f"cos and sin must be (P, d/2) tables of one shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    sd = normalize_seq_dim(q, seq_dim)
    seq_len = q.shape[sd]
    if k is not None and (k.dim() != q.dim() or k.shape[sd] != seq_len or k.shape[0] != q.shape[0]):
        raise ValueError(f"k {tuple(k.shape)} must match q {tuple(q.shape)} in rank, batch and sequence length")
    offset = check_position_args(positions, offset, seq_len, q.shape[0] if sd > 0 else None)
    why = _triton_case(q, sd) or (None if k is None else _triton_case(k, sd))
    if use_triton(backend, q, why):
        _rows(cos, positions, offset, seq_len)                              # the same range checks, same errors
        from posenc.kernels import triton_rope

        pos = None if positions is None else positions.to(q.device)
        return triton_rope.rope_qk(q, k, cos.to(torch.float32).contiguous(), sin.to(torch.float32).contiguous(), pos,
                                   offset, layout == "interleaved", sd, inplace)
    c = broadcast_rows(_rows(cos, positions, offset, seq_len), q.dim(), sd)
    s = broadcast_rows(_rows(sin, positions, offset, seq_len), q.dim(), sd)
    q_out = apply_rope(q, c, s, layout=layout, inplace=inplace)
    k_out = None if k is None else apply_rope(k, c, s, layout=layout, inplace=inplace)
    return q_out, k_out
