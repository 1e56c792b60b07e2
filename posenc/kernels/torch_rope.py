"""The pure-torch rotary engine: a differentiable reference, a small-tensor path and a cache-blocked path.

All three compute, for each feature pair ``(x1, x2)`` and its ``(cos, sin)``,
``(x1 cos - x2 sin, x2 cos + x1 sin)`` in the working precision (float32, float64 for float64
inputs) and round once to the input dtype.  Which path runs is this engine's own choice and does
not change the values beyond the rounding of the working precision:

- **reference** (:func:`rotate_reference`): plain elementwise maths, used when autograd records the
  call or while tracing (``torch.compile``/``torch.export``), where the other paths' in-place
  updates and Python loops have no place;
- **small** tensors (up to :data:`BLOCK` elements, e.g. one decode step): as few torch calls as
  possible, because each call costs more than its arithmetic.  The rows are read in their packed
  form (:func:`pack_tables`, the form ``RotaryEmbedding`` keeps its table in; built from ``cos``/``sin``
  rows otherwise): half-split pairs take ``x * [cos | cos] + roll(x, d/2) * [-sin | sin]``,
  interleaved pairs one complex multiplication by ``cos + i sin``; a decode step's q and k (batch 1)
  are rotated as one tensor;
- **large** tensors: cache-sized blocks, each read once, rotated in cache and written once, straight
  into the output (out of place) or back into ``x`` (in place).

Arguments arrive checked (see :mod:`posenc.functional.rope`).
"""

from __future__ import annotations

import torch

from posenc._torch.alloc import empty_like
from posenc._torch.angles import working_dtype
from posenc._torch.rows import broadcast_rows, table_rows
from posenc._torch.varlen import varlen_positions

__all__ = ["BLOCK", "pack_tables", "prepare", "rope_qk", "rotate", "rotate_reference", "unpack_tables"]

#: Elements per block of the cache-blocked path (float32: 1 MiB); smaller tensors take the small path.
BLOCK = 1 << 18


def halves(x: torch.Tensor, h: int, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two members of every pair, as views of ``x[..., :2h]``."""
    if layout == "half":
        return x[..., :h], x[..., h : 2 * h]
    return x[..., 0 : 2 * h : 2], x[..., 1 : 2 * h : 2]


def rotate_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str) -> torch.Tensor:
    """Differentiable out-of-place rotation of ``x[..., :2h]`` (the plain reference), ``h = cos.shape[-1]``."""
    h = cos.shape[-1]
    ct = working_dtype(x.dtype)
    x1, x2 = halves(x.to(ct), h, layout)
    c, s = cos.to(ct), sin.to(ct)
    o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
    if layout == "half":
        rot = torch.cat([o1, o2], dim=-1)
    else:
        rot = torch.stack([o1, o2], dim=-1).flatten(-2)                  # (..., h, 2) -> (..., 2h)
    return rot.to(x.dtype)


def _complex_view(t: torch.Tensor) -> torch.Tensor | None:
    """``t (..., 2h)`` viewed as complex ``(..., h)`` when its strides allow it, else None."""
    if t.stride(-1) != 1 or any(st % 2 for st in t.stride()[:-1]) or t.storage_offset() % 2:
        return None
    return torch.view_as_complex(t.unflatten(-1, (t.shape[-1] // 2, 2)))


def _blocks(xs: list[torch.Tensor], bs: list[torch.Tensor]):
    """Split same-shaped ``xs`` (and ``bs``, broadcasting against them with the same rank) along
    leading dims into cache-sized blocks; yields ``(x_blocks, b_blocks)``."""
    x = xs[0]
    if x.numel() <= BLOCK or x.dim() == 1:
        yield xs, bs
        return
    n0 = x.shape[0]
    per = x.numel() // max(n0, 1)
    if per <= BLOCK:
        step = max(1, BLOCK // max(per, 1))
        for i in range(0, n0, step):
            sl = slice(i, i + step)
            yield [t[sl] for t in xs], [b if b.shape[0] == 1 else b[sl] for b in bs]
    else:
        for i in range(n0):
            yield from _blocks([t[i] for t in xs], [b[0] if b.shape[0] == 1 else b[i] for b in bs])


def _rotate_blocked(src: torch.Tensor, dst: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, h: int, layout: str,
                    inplace: bool) -> None:
    """``dst = rotate(src)`` for ``x[..., :2h]`` views (``inplace``: the same memory), block by block.

    Out of place in the working dtype, each block is written straight into ``dst`` (interleaved
    pairs as one complex multiplication, half-split pairs as two products each).  Otherwise each
    block is rotated in a working copy (``t = x1; x1 = x1 cos - x2 sin; x2 = x2 cos + t sin``, the
    same operations, so in place and out of place agree bit for bit) and rounded back once.
    """
    ct = working_dtype(dst.dtype)
    c = cos.to(ct).reshape((1,) * (dst.dim() - cos.dim()) + tuple(cos.shape))
    s = sin.to(ct).reshape(c.shape)
    use_complex = layout == "interleaved"
    bcast = [c, s, torch.complex(c, s)] if use_complex else [c, s]
    direct = not inplace and dst.dtype == ct
    scratch: dict[str, torch.Tensor] = {}

    def buffer(name: str, shape: torch.Size) -> torch.Tensor:
        n = shape.numel()
        if name not in scratch or scratch[name].numel() < n:
            scratch[name] = torch.empty(max(n, BLOCK), dtype=ct, device=dst.device)
        return scratch[name][:n].view(shape)

    for (sb, db), (cb, sib, *cis) in _blocks([src, dst], bcast):
        if direct:
            sc = _complex_view(sb) if use_complex else None
            dc = _complex_view(db) if sc is not None else None
            if sc is not None and dc is not None:
                torch.mul(sc, cis[0], out=dc)
                continue
            x1, x2 = halves(sb, h, layout)
            o1, o2 = halves(db, h, layout)
            torch.mul(x1, cb, out=o1).addcmul_(x2, sib, value=-1)
            torch.mul(x2, cb, out=o2).addcmul_(x1, sib)
            continue
        if db.dtype == ct:
            work = db                                                      # in place, working dtype
        else:
            work = buffer("work", db.shape)                                # float32 copy of the block
            work.copy_(sb)
        wc = _complex_view(work) if use_complex else None
        if wc is not None:
            wc.mul_(cis[0])
        else:
            x1, x2 = halves(work, h, layout)
            tmp = buffer("tmp", x1.shape)
            tmp.copy_(x1)                                                  # the same operations as out of place,
            x1.mul_(cb).addcmul_(x2, sib, value=-1)                        # so both round identically
            x2.mul_(cb).addcmul_(tmp, sib)
        if work is not db:
            db.copy_(work)                                                 # one rounding to x's dtype


def _rotate_rows(x: torch.Tensor, rows: torch.Tensor, h: int, layout: str) -> torch.Tensor:
    """``x (..., 2h)`` rotated by packed float32 ``rows`` (:func:`pack_tables`) that broadcast against it:
    a new tensor of ``x``'s dtype (float32 products, one rounding)."""
    if layout == "half":
        a, b = rows.chunk(2, -1)                                          # [cos | cos], [-sin | sin]
        rot = x * a                                                        # float32 even for half-precision x
        rot.addcmul_(x.roll(h, -1), b)                                    # x2 -> first half, x1 -> second
    else:
        xw = x if x.dtype == torch.float32 else x.float()
        xc = _complex_view(xw)
        if xc is None:
            # odd strides or an odd storage offset (a view starting at an odd element, which
            # contiguous() would return as it is): a fresh contiguous copy always has a complex view
            xc = torch.view_as_complex(xw.clone(memory_format=torch.contiguous_format).unflatten(-1, (h, 2)))
        rot = torch.view_as_real(xc * torch.view_as_complex(rows.unflatten(-1, (h, 2)))).flatten(-2)
    return rot if rot.dtype == x.dtype else rot.to(x.dtype)               # one rounding


def _rotate_small(x: torch.Tensor, rows: torch.Tensor, h: int, layout: str, inplace: bool) -> torch.Tensor:
    """Rotate a small ``x`` by packed ``rows`` in a handful of torch calls (see the module docstring)."""
    d = 2 * h
    xr = x if d == x.shape[-1] else x[..., :d]
    rot = _rotate_rows(xr, rows, h, layout)
    if inplace:
        xr.copy_(rot)
        return x
    if xr is x and (rot.stride() == x.stride() or x.is_contiguous()):
        return rot
    out = torch.empty_like(x)                                              # the strides out-of-place outputs have
    out[..., :d] = rot
    if d < x.shape[-1]:
        out[..., d:] = x[..., d:]                                          # pass-through features
    return out


def _rotate_small_qk(q: torch.Tensor, k: torch.Tensor | None, rows: torch.Tensor, h: int, layout: str, inplace: bool,
                     seq_dim: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The small path for q and k (same dtype).  A decode step's q and k (batch 1, one token) are
    rotated as one tensor, concatenated along the head axis and split back into contiguous outputs:
    half the calls.  The two outputs are views of one buffer, so a key kept as it is (not copied
    into a cache) also keeps its query's memory alive."""
    if k is not None and seq_dim is not None and not inplace and q.dim() == 4 and 2 * h == q.shape[-1]:
        head = 1 if seq_dim == 2 else 2                                    # (B, H, S, D) or (B, S, H, D)
        qs, ks = q.shape, k.shape
        if qs[0] == 1 and ks[0] == 1 and (head == 1 or qs[1] == ks[1] == 1) and qs[head + 1 :] == ks[head + 1 :]:
            both = _rotate_rows(torch.cat([q, k], head), rows, h, layout)
            q_out, k_out = both.split_with_sizes([qs[head], ks[head]], head)
            return q_out, k_out
    return _rotate_small(q, rows, h, layout, inplace), (
        None if k is None else _rotate_small(k, rows, h, layout, inplace))


def _rotate_large(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, h: int, layout: str,
                  inplace: bool) -> torch.Tensor:
    d = 2 * h
    if inplace:
        xr = x if d == x.shape[-1] else x[..., :d]
        _rotate_blocked(xr, xr, cos, sin, h, layout, True)
        return x
    out = empty_like(x)                                                    # huge pages for large CPU outputs
    if d < x.shape[-1]:
        out[..., d:] = x[..., d:]                                          # pass-through features
    _rotate_blocked(x[..., :d], out[..., :d], cos, sin, h, layout, False)
    return out


def _needs_reference(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Autograd records the call, or it is being traced."""
    grad = torch.is_grad_enabled() and (
        q.requires_grad or (k is not None and k.requires_grad) or cos.requires_grad or sin.requires_grad
    )
    return grad or torch.compiler.is_compiling()


def _rotate_pair(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                 inplace: bool, seq_dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate ``q`` and ``k`` (None allowed) with cos/sin broadcasting against both; ``seq_dim``
    (when known) lets a decode step's q and k share the small path's calls."""
    h = cos.shape[-1]
    if _needs_reference(q, k, cos, sin):
        q_out = _reference_call(q, cos, sin, h, layout, inplace)
        return q_out, None if k is None else _reference_call(k, cos, sin, h, layout, inplace)
    if _small(q, k):
        return _rotate_small_qk(q, k, _float32(pack_tables(cos, sin, layout)), h, layout, inplace, seq_dim)
    q_out = _rotate_one(q, cos, sin, h, layout, inplace)
    return q_out, None if k is None else _rotate_one(k, cos, sin, h, layout, inplace)


def _small(q: torch.Tensor, k: torch.Tensor | None) -> bool:
    """Whether q and k take the small path: up to :data:`BLOCK` elements each, one dtype, float32 work."""
    return q.numel() <= BLOCK and q.dtype != torch.float64 and (
        k is None or (k.numel() <= BLOCK and k.dtype == q.dtype))


def _float32(rows: torch.Tensor) -> torch.Tensor:
    return rows if rows.dtype == torch.float32 else rows.float()


def _rotate_one(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, h: int, layout: str,
                inplace: bool) -> torch.Tensor:
    if x.numel() > BLOCK or x.dtype == torch.float64:
        return _rotate_large(x, cos, sin, h, layout, inplace)
    return _rotate_small(x, _float32(pack_tables(cos, sin, layout)), h, layout, inplace)


def _reference_call(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, h: int, layout: str,
                    inplace: bool) -> torch.Tensor:
    rot = rotate_reference(x, cos, sin, layout=layout)
    if inplace:
        x[..., : 2 * h] = rot
        return x
    return rot if 2 * h == x.shape[-1] else torch.cat([rot, x[..., 2 * h :]], dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str, inplace: bool) -> torch.Tensor:
    """Rotate ``x[..., :2h]`` by cos/sin ``(..., h)`` that broadcast against ``x[..., :h]``."""
    return _rotate_pair(x, None, cos, sin, layout, inplace)[0]


def pack_tables(cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """The ``packed`` form of ``(P, h)`` tables that :func:`rope_qk` reads without preparation:
    rows ``[cos | cos | -sin | sin]`` (``(P, 4h)``, half layout) or ``(cos, sin)`` pairs
    (``(P, 2h)``, interleaved layout: one complex number per pair)."""
    if layout == "half":
        return torch.cat([cos, cos, -sin, sin], -1)
    return torch.stack([cos, sin], -1).flatten(-2)


def row_factors(packed: torch.Tensor, layout: str) -> tuple[torch.Tensor, ...]:
    """Views of a :func:`pack_tables` table that give a one-token call (a decode step) its factor
    rows by one index each: ``([cos | cos], [-sin | sin])`` (half layout, ``(P, 2h)`` each) or ``cos + i sin`` (interleaved,
    ``(P, h)`` complex).  Made where the table is made, by the module that owns it."""
    if layout == "half":
        d = packed.shape[-1] // 2
        return packed[:, :d], packed[:, d:]
    return (torch.view_as_complex(packed.view(packed.shape[0], -1, 2)),)


def unpack_tables(packed: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``(P, h)`` views of a :func:`pack_tables` table."""
    if layout == "half":
        h = packed.shape[-1] // 4
        return packed[:, :h], packed[:, 3 * h :]
    return packed[:, 0::2], packed[:, 1::2]


def rope_qk(q: torch.Tensor, k: torch.Tensor | None, *, cos: torch.Tensor | None, sin: torch.Tensor | None,
            positions: torch.Tensor | None, offset: int | torch.Tensor, layout: str, seq_dim: int, inplace: bool,
            packed: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
            inverse: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate q and k by the rows of ``(P, h)`` tables for ``positions`` or ``offset + arange(S)``.

    The engine interface of :mod:`posenc.kernels`.  The tables are ``cos``/``sin`` (views of any
    strides), or ``packed``: the table in its :func:`pack_tables` form (float32, as ``RotaryEmbedding``
    stores it), which the small path reads without building rows (``cos``/``sin`` may then be None).  ``seq_dim``
    is the non-negative sequence axis of q and k; positions lie inside the tables (the caller checked
    or guarded them; the lookup is bounds-checked as well).  With ``cu_seqlens``, q and k are packed
    ``(T, H, D)`` sequences whose positions restart at ``offset`` (an int, or a tensor with one first
    position per sequence).  ``inverse`` rotates by ``-theta`` (the transpose): the sine rows are
    negated, which is exact, so the result is the transpose to the last bit.
    """
    if inverse and packed is not None:
        cos, sin, packed = *unpack_tables(packed, layout), None             # (the negated rows are built below)
    if cu_seqlens is not None:
        pos = varlen_positions(cu_seqlens, q.shape[0], offset)[None]      # (1, T)
        if torch.compiler.is_compiling():
            # (the caller asserted the range; a gather failing inside a compiled CPU loop would abort)
            pos = pos.clamp(0, (cos if cos is not None else packed).shape[0] - 1)   # type: ignore[union-attr]
        qo, ko = rope_qk(q[None], None if k is None else k[None], cos=cos, sin=sin, positions=pos, offset=0,
                         layout=layout, seq_dim=1, inplace=inplace, packed=packed, inverse=inverse)   # (1, T, H, D)
        if inplace:
            return q, k
        return qo[0], (None if ko is None else ko[0])
    assert not isinstance(offset, torch.Tensor)                            # per-sequence offsets need cu_seqlens
    seq_len = q.shape[seq_dim]
    nd = q.dim()
    if cos is None or sin is None:
        cos, sin = unpack_tables(packed, layout)                           # type: ignore[arg-type]
    # (the reference test first: while tracing, no size test may become a guard on the shapes)
    if not _needs_reference(q, k, cos, sin) and _small(q, k):
        h = cos.shape[-1]
        if packed is not None:
            rows = table_rows(packed, positions, offset, seq_len)          # (S, 4h | 2h) or (B, S, ...)
        else:
            s_rows = table_rows(sin, positions, offset, seq_len)
            rows = pack_tables(table_rows(cos, positions, offset, seq_len), -s_rows if inverse else s_rows, layout)
        if rows.dim() != 2 or seq_dim != nd - 2:
            rows = broadcast_rows(rows, nd, seq_dim)
        return _rotate_small_qk(q, k, _float32(rows), h, layout, inplace, seq_dim)
    c = table_rows(cos, positions, offset, seq_len)
    s = table_rows(sin, positions, offset, seq_len)
    if inverse:
        s = -s
    if c.dim() != 2 or seq_dim != nd - 2:
        c, s = broadcast_rows(c, nd, seq_dim), broadcast_rows(s, nd, seq_dim)
    return _rotate_pair(q, k, c, s, layout, inplace, seq_dim)


#: The one rounding back from float32 of a small call, by the tensor method that costs least per call.
_NARROW = {torch.bfloat16: torch.Tensor.bfloat16, torch.float16: torch.Tensor.half}


def prepare(q, k, cos, sin, positions, offset, layout: str, seq_dim: int, inplace: bool, cu_seqlens=None,
            inverse: bool = False):
    """The eager call of :func:`rope_qk` for calls like this one: ``rotation(q, k, cos, sin, positions,
    offset, cu_seqlens=None, packed=None) -> (q_out, k_out)``.

    A small call (q and k up to :data:`BLOCK` elements each: a decode step, or a short prefill; out of
    place, at an offset, no autograd, not inverse) gets a
    rotation with its path decided here: one lookup of the rows (in their packed form when ``packed``
    is passed), then the small path's few calls; any other call takes :func:`rope_qk`, which picks
    its path by size.
    """
    h, S, nd = cos.shape[-1], q.shape[seq_dim], q.dim()
    if (positions is not None or cu_seqlens is not None or inplace or inverse or _needs_reference(q, k, cos, sin)
            or not _small(q, k)):
        def rotation(q, k, cos, sin, positions, offset, cu_seqlens=None, packed=None, factors=None):
            return rope_qk(q, k, cos=cos, sin=sin, positions=positions, offset=offset, layout=layout, seq_dim=seq_dim,
                           inplace=inplace, packed=packed, cu_seqlens=cu_seqlens, inverse=inverse)
        return rotation
    # rows (S, W) against x: as they are for (..., S, D), else (S, 1, W); one row broadcasts as (W,)
    shape = None if seq_dim == nd - 2 or S == 1 else broadcast_rows(cos.new_empty(S, 1, device="meta"), nd,
                                                                      seq_dim).shape[:-1]
    head = 1 if seq_dim == 2 else 2                                         # (B, H, S, D) or (B, S, H, D)
    concat = (k is not None and nd == 4 and seq_dim in (1, 2) and 2 * h == q.shape[-1] and q.shape[0] == 1
              and k.shape[0] == 1 and (head == 1 or q.shape[1] == k.shape[1] == 1)
              and q.shape[head + 1:] == k.shape[head + 1:])
    sizes = (q.shape[head], k.shape[head]) if concat else None
    half = layout == "half"
    pairs = (*q.shape[:head], (q.shape[head] + k.shape[head]) if concat else 0, *q.shape[head + 1:-1], h, 2)
    halves = (*pairs[:-2], 2, h)

    def small_call(q, k, cos, sin, positions, offset, cu_seqlens=None, packed=None, factors=None):
        if concat and S == 1:
            if factors is not None:                                         # the owner's views of its table
                return _factored(q, k, tuple(f[offset] for f in factors))
            if packed is None:
                return _token(q, k, cos[offset], sin[offset])
        # (one token: an integer index costs half what a one-row slice does)
        if packed is not None:
            rows = packed[offset] if S == 1 else packed.narrow(0, offset, S)   # (4h | 2h) or (S, 4h | 2h)
        elif S == 1:
            rows = pack_tables(cos[offset], sin[offset], layout)
        else:
            rows = pack_tables(cos.narrow(0, offset, S), sin.narrow(0, offset, S), layout)
        if shape is not None:
            rows = rows.view(*shape, rows.shape[-1])                        # e.g. (S, 1, W) against (B, S, H, D)
        if rows.dtype != torch.float32:
            rows = rows.float()
        if concat:                                      # [cos | cos], [-sin | sin] or cos + i sin
            return _factored(q, k, rows.chunk(2, -1) if half else (
                torch.view_as_complex(rows.view(*rows.shape[:-1], h, 2)),))
        return _rotate_small(q, rows, h, layout, False), (None if k is None else _rotate_small(k, rows, h, layout, False))

    def _factored(q, k, rows):
        """q and k as one fresh float32 tensor, rotated in place by factor rows ``([cos | cos], [-sin | sin])``
        or ``(cos + i sin,)``, rounded once and split back."""
        both = torch.cat([q, k], head)
        dtype = both.dtype
        if dtype != torch.float32:
            both = both.float()
        if half:
            rot = both.roll(h, -1)                                          # x2 first, then x1
            both.mul_(rows[0]).addcmul_(rot, rows[1])
        else:
            torch.view_as_complex(both.view(pairs)).mul_(rows[0])
        if dtype != torch.float32:
            both = _NARROW[dtype](both)                                     # one rounding
        return both.split_with_sizes(sizes, head)

    def _token(q, k, c, s):
        """One token from ``(h,)`` cos/sin rows, with no packed rows to build: the half layout as
        ``x * cos`` on the ``(..., 2, h)`` view, then ``- x2 * sin`` and ``+ x1 * sin`` added to its two
        halves (the products and sums of the packed rows, and of the large path), the interleaved one
        as a multiplication by ``complex(cos, sin)``."""
        both = torch.cat([q, k], head)
        dtype = both.dtype
        if dtype != torch.float32:
            both = both.float()
        if c.dtype != torch.float32:
            c, s = c.float(), s.float()
        if half:
            x = both.view(halves)                                           # (..., 2, h): the pairs' two members
            x1, x2 = x.unbind(-2)
            both = x * c
            o1, o2 = both.unbind(-2)
            o1.addcmul_(x2, s, value=-1)
            o2.addcmul_(x1, s)
            both = both.view(pairs[:-2] + (2 * h,))
        else:
            torch.view_as_complex(both.view(pairs)).mul_(torch.complex(c, s))
        if dtype != torch.float32:
            both = _NARROW[dtype](both)                                     # one rounding
        return both.split_with_sizes(sizes, head)
    return small_call
