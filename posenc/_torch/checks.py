"""Argument checks of the torch side: tensors, positions, offsets (not public).

Each raises ``TypeError``/``ValueError`` naming the argument, the bad value and the fix.
"""

from __future__ import annotations

from typing import cast

import torch

from posenc import _validate
from posenc._torch.rows import guard_in_table, position_range
from posenc.core import exact

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


_INDEX_DTYPES = (torch.int64, torch.int32)


def check_positions(name: str, positions: object) -> torch.Tensor:
    """Require an integer tensor of positions; returns it as int32/int64.

    Narrow and unsigned integer dtypes (``uint8``, ``int16``, ``uint32``, ...) are read as the
    numbers they hold (converted to int64), never as a boolean mask.
    """
    if not isinstance(positions, torch.Tensor):
        raise TypeError(
            f"{name} must be an integer torch.Tensor, got {type(positions).__name__}; "
            f"pass e.g. torch.arange(seq_len)"
        )
    if positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
        raise TypeError(
            f"{name} must hold integers (torch.int32/int64), got dtype {positions.dtype}; "
            f"positions are indices, so build them with torch.arange or cast with .long()"
        )
    if positions.dtype not in _INDEX_DTYPES:
        positions = positions.long()
    return positions


def check_position_bounds(name: str, lo: int, hi: int) -> None:
    """Reject a positions range ``[lo, hi]`` outside ``[-2**31, 2**31]``, where exact angles are no
    longer guaranteed."""
    if max(-lo, hi) > exact.MAX_POSITION:
        raise ValueError(f"{name} must lie within [-2**31, 2**31] for exact angles, got values in [{lo}, {hi}]")


def from_table(name: str, positions: torch.Tensor, rows: int, *, table_ok: bool, assume: bool,
               known: tuple[int, int] | None = None) -> bool:
    """The table-or-exact decision of a call with explicit positions: whether its rows come from a
    table of ``rows`` positions.

    ``table_ok``: the table serves this call at all (float32 work).  With ``assume`` (the caller
    promised ``[0, rows)``) nothing is read; while tracing the promise becomes a guard.  Otherwise the
    range (``known`` when the host already has it) decides, read once and bounds-checked; while
    tracing, or for empty or meta positions, it is the exact path.
    """
    tracing = torch.compiler.is_compiling()
    if table_ok and assume:
        if tracing:
            guard_in_table(name, positions, rows)
        return True
    rng = known
    if rng is None:
        if tracing or not positions.numel() or positions.is_meta:
            return False
        rng = position_range(positions)
        check_position_bounds(name, *rng)
    return table_ok and 0 <= rng[0] and rng[1] < rows


def check_position_range(name: str, positions: torch.Tensor) -> None:
    """:func:`check_position_bounds` of a positions tensor (one read from the device; none while
    tracing, where data-dependent checks cannot run, nor on the meta device, which holds no values)."""
    if positions.numel() and not positions.is_meta and not torch.compiler.is_compiling():
        check_position_bounds(name, *position_range(positions))


def check_offset(offset: object) -> int:
    """An ``offset`` is an int; while tracing it may also be a symbolic int (e.g. ``past_k.shape[2]``)."""
    if type(offset) is int or (isinstance(offset, torch.SymInt) and torch.compiler.is_compiling()):
        return cast(int, offset)  # a SymInt stands for an int while tracing
    return _validate.check_int("offset", offset)


def check_seq_len(seq_len: object) -> int | None:
    """``seq_len`` of a length-dependent rule: None or an int >= 1; while tracing also a symbolic
    int or a 0-d integer tensor (a length known only at run time)."""
    if seq_len is None or type(seq_len) is int and seq_len >= 1:
        return seq_len
    if torch.compiler.is_compiling() and (
        isinstance(seq_len, torch.SymInt)
        or isinstance(seq_len, torch.Tensor) and seq_len.dim() == 0 and not seq_len.dtype.is_floating_point
    ):
        return cast(int, seq_len)  # a symbolic length stands for an int while tracing
    return _validate.check_int("seq_len", seq_len, minimum=1)


def check_position_args(
    positions: torch.Tensor | None, offset: object, length: int, batch: int | None, device: torch.device
) -> tuple[torch.Tensor | None, int]:
    """Check the ``positions``/``offset`` pair of a call on a sequence of ``length`` tokens.

    ``positions`` (if given) must be integers of shape ``(S,)``, or ``(B, S)`` with ``B`` 1 or
    ``batch`` when the input has a batch axis (``batch`` not None), on ``device`` (the input's); it
    excludes a nonzero ``offset``.  Returns ``(positions, offset)``, positions as int32/int64.
    """
    if type(offset) is not int:
        offset = check_offset(offset)
    if positions is None:
        return None, offset
    positions = check_positions("positions", positions)
    batched_ok = batch is not None and positions.dim() == 2 and positions.shape[0] in (1, batch)
    if positions.dim() == 0 or positions.shape[-1] != length or not (positions.dim() == 1 or batched_ok):
        allowed = "(S,)" if batch is None else f"(S,) or (B, S) with B={batch}"
        raise ValueError(f"positions must have shape {allowed}, S={length}; got {tuple(positions.shape)}")
    if positions.device != device:
        raise ValueError(f"positions are on {positions.device} but the input on {device}; move them with .to()")
    if not (isinstance(offset, int) and offset == 0):
        raise ValueError("pass either positions or offset, not both (add the offset to positions)")
    return positions, offset


def check_embeddings(x: object, dim: int) -> None:
    """``x`` must be floating embeddings of shape ``(B, S, dim)`` or ``(S, dim)``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(
            f"x must be a floating tensor, got dtype {x.dtype}; embed token ids first "
            f"(e.g. nn.Embedding) or cast with x.float()"
        )
    if x.dim() not in (2, 3) or x.shape[-1] != dim:
        raise ValueError(
            f"x must have shape (B, S, {dim}) or (S, {dim}), got {tuple(x.shape)}; the last dimension must equal dim={dim}"
        )


def embedding_seq_axis(x: torch.Tensor, seq_dim: object) -> int:
    """The sequence axis of embeddings ``x`` (checked by :func:`check_embeddings`): ``0`` for ``(S, B, D)``
    (``seq_dim=0``, the layout of ``nn.Transformer`` without ``batch_first``), else ``x.dim() - 2``."""
    if type(seq_dim) is int and seq_dim in (-2, x.dim() - 2):
        return x.dim() - 2
    if type(seq_dim) is int and x.dim() == 3 and seq_dim in (0, -3):
        return 0
    raise ValueError(
        f"seq_dim must be x's sequence axis: -2 (or 1) for (B, S, D) and (S, D) embeddings, 0 for (S, B, D) "
        f"(nn.Transformer's default layout, batch_first=False), got {seq_dim!r} for x of shape {tuple(x.shape)}")


def check_same_device(name: str, t: torch.Tensor, other: str, device: torch.device) -> None:
    """``t`` must be on ``device``, where ``other`` (a module's tables, ``q``) lives."""
    if t.device != device:
        raise ValueError(
            f"{name} is on {t.device} but {other} on {device}; move one of them with .to() (a module built on the "
            f"meta device needs .to_empty(device=...) and reset_buffers() first)"
        )


def check_inplace(name: str, t: torch.Tensor) -> None:
    """An in-place target must not have elements sharing memory (``expand``: stride 0), nor be (a view
    of) a leaf tensor that requires grad while autograd records."""
    if t.requires_grad and torch.is_grad_enabled() and (t if t._base is None else t._base).is_leaf:
        raise ValueError(
            f"{name} is (a view of) a leaf tensor that requires grad, which autograd cannot modify in place; "
            f"pass inplace=False (or rotate/add under torch.no_grad())"
        )
    if torch._debug_has_internal_overlap(t) == 1:
        raise ValueError(
            f"{name} has elements that share memory (an expand()ed tensor, stride 0), so it cannot be rotated in "
            f"place; pass {name}.contiguous() or inplace=False"
        )


def inplace_pair_overlaps(q: torch.Tensor, k: torch.Tensor | None) -> bool:
    """Check in-place targets ``q`` and ``k``; whether they may share memory (e.g. views of one fused
    QKV buffer), in which case the caller rotates out of place and copies back.

    ``q`` and ``k`` being the very same tensor is refused: rotating it "twice in place" has no
    meaning (pass ``k=None`` to rotate it once).  Nothing is checked while tracing.
    """
    if torch.compiler.is_compiling():
        return False
    check_inplace("q", q)
    if k is None:
        return False
    check_inplace("k", k)
    if q.data_ptr() == k.data_ptr() and q.shape == k.shape and q.stride() == k.stride():
        raise ValueError("q and k are the same tensor: rotating both in place would rotate it twice; pass k=None")
    return torch._C._overlaps(q, k)


def check_float_dtype(name: str, dtype: object) -> torch.dtype:
    """Require a floating torch dtype supported for encodings."""
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be one of torch.float16, torch.bfloat16, torch.float32, torch.float64; got {dtype!r}"
        )
    return dtype


def check_float_tensor(name: str, t: object) -> torch.Tensor:
    """Require a floating ``torch.Tensor``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating tensor, got dtype {t.dtype}")
    return t


def normalize_seq_dim(x: torch.Tensor, seq_dim: object) -> int:
    """``seq_dim`` as a non-negative axis of ``x`` that is not the feature axis."""
    seq_dim = _validate.check_int("seq_dim", seq_dim)
    nd = x.dim()
    if not -nd <= seq_dim < nd or seq_dim % nd == nd - 1:
        raise ValueError(
            f"seq_dim={seq_dim} is not a sequence axis of a {nd}-D tensor (features are last); "
            f"use -2 for (B, H, S, D) or 1 for (B, S, H, D)"
        )
    return seq_dim % nd


def check_qk(q: object, k: object, seq_dim: object, rotary_dim: int | None = None) -> int:
    """Check queries and keys rotated together; returns the normalized sequence axis.

    ``q`` and ``k`` (``k`` may be None) must be floating tensors of at least 2 dims with the same
    rank, batch size and sequence length (head counts may differ: GQA), and a feature dim of at
    least ``rotary_dim`` when given.  (Written for speed: it runs on every decode step.)
    """
    if not (isinstance(q, torch.Tensor) and q.dtype.is_floating_point):
        q = check_float_tensor("q", q)                                  # raises with the fix
    nd = q.dim()
    if nd < 2:
        raise ValueError(f"q must have at least 2 dims (..., S, D), got shape {tuple(q.shape)}")
    if type(seq_dim) is not int:
        seq_dim = _validate.check_int("seq_dim", seq_dim)
    if not -nd <= seq_dim < nd or seq_dim % nd == nd - 1:
        normalize_seq_dim(q, seq_dim)                                   # raises with the fix
    sd = seq_dim % nd
    if rotary_dim is not None and q.shape[-1] < rotary_dim:
        raise ValueError(
            f"q has head dim {q.shape[-1]} < rotary dim {rotary_dim}; build the rotary embedding (or cos/sin) "
            f"for a rotary dim <= the head dim"
        )
    if k is not None:
        if not (isinstance(k, torch.Tensor) and k.dtype.is_floating_point):
            k = check_float_tensor("k", k)                              # raises with the fix
        if k.device != q.device:
            check_same_device("k", k, "q", q.device)
        if k.dim() != nd or k.shape[sd] != q.shape[sd] or k.shape[0] != q.shape[0]:
            raise ValueError(f"k {tuple(k.shape)} must match q {tuple(q.shape)} in rank, batch and sequence length")
        if rotary_dim is not None and k.shape[-1] < rotary_dim:
            raise ValueError(
                f"k has head dim {k.shape[-1]} < rotary dim {rotary_dim}; build the rotary embedding (or cos/sin) "
                f"for a rotary dim <= the head dim"
            )
    return sd


def share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether some element of ``a`` and some element of ``b`` share a byte of memory (host-side: only
    pointers, shapes and strides are read, never the values).

    Exact, unlike ``torch._C._overlaps`` (which answers True for any two views of one buffer whose
    byte ranges interleave, e.g. the keys and values halves ``kv[:, 0]`` and ``kv[:, 1]`` of a
    FlashInfer-style ``(num_blocks, 2, block_size, H, D)`` cache).  Element ``i`` of ``a`` and ``j`` of
    ``b`` overlap when ``p_a + sum(i_d a_d) - p_b - sum(j_d b_d)`` lies in ``(-size_a, size_b)``
    (bytes); the search takes the strides from the largest down, keeping a coefficient only if the
    smaller strides can still reach the interval, so it visits a handful of nodes for real layouts.
    Past a fixed budget of steps (strides chosen to defeat it) it answers True: refusing is safe.
    """
    if not a.numel() or not b.numel() or a.is_meta or b.is_meta:
        return False
    sa, sb = a.element_size(), b.element_size()

    def span(t: torch.Tensor, size: int) -> tuple[int, int]:
        last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))   # (torch strides are >= 0)
        return t.data_ptr(), t.data_ptr() + (last + 1) * size           # bytes [start, end)

    (a0, a1), (b0, b1) = span(a, sa), span(b, sb)
    if a1 <= b0 or b1 <= a0:
        return False
    # sum over terms of c * step, c in [lo, hi]: a's strides with c = i_d in [0, n - 1], b's with
    # c = -j_d in [-(n - 1), 0]; equal steps merge (c = i - j)
    terms: dict[int, tuple[int, int]] = {}
    for t, size, sign in ((a, sa, 1), (b, sb, -1)):
        for n, s in zip(t.shape, t.stride(), strict=True):
            if n == 1 or s == 0:
                continue
            step, lo, hi = s * size, *sorted((0, sign * (n - 1)))
            old = terms.get(step, (0, 0))
            terms[step] = (old[0] + lo, old[1] + hi)
    steps = sorted(terms.items(), reverse=True)                         # largest step first
    reach_lo = [0] * (len(steps) + 1)                                   # reach of the steps after i
    reach_hi = [0] * (len(steps) + 1)
    for i in range(len(steps) - 1, -1, -1):
        step, (lo, hi) = steps[i]
        reach_lo[i], reach_hi[i] = reach_lo[i + 1] + lo * step, reach_hi[i + 1] + hi * step
    budget = [10_000]
    base = a.data_ptr() - b.data_ptr()

    def reachable(i: int, low: int, high: int) -> bool:
        """Whether the steps from ``i`` on can sum to a value in the open interval ``(low, high)``."""
        budget[0] -= 1
        if budget[0] < 0:
            return True
        if i == len(steps):
            return low < 0 < high
        step, (lo, hi) = steps[i]
        c_min = max(lo, -(-(low + 1 - reach_hi[i + 1]) // step))        # c * step > low - reach_hi
        c_max = min(hi, (high - 1 - reach_lo[i + 1]) // step)           # c * step < high - reach_lo
        return any(reachable(i + 1, low - c * step, high - c * step) for c in range(c_min, c_max + 1))

    # a's element i at base + sum(a terms) (relative to b's start) meets b's element j when
    # base + sum(a) - sum(b) lies in (-sa, sb)
    return reachable(0, -sa - base, sb - base)
