"""Rotary position embedding (RoFormer, Su et al. 2021) fused with the KV-cache write of a decoding step.

An inference engine rotates q and k and then stores k and v in a preallocated cache: vLLM runs
``rotary_embedding`` and then ``reshape_and_cache_flash``, two launches.  :func:`rope_and_cache`
does both in one call (one Triton launch on GPU) for the two cache kinds engines use::

    contiguous  (Hugging Face's static cache, flash-attn's flash_attn_with_kvcache)
        k_cache (B, Hk, S_max, D); token s of row b goes to index cache_seqlens[b] + s
    paged       (vLLM's flash layout, FlashInfer's NHD layout)
        k_cache (num_blocks, block_size, Hk, D); token t goes to block slots[t] // block_size,
        row slots[t] % block_size; a negative slot (padding) is not written

The rotation is :func:`posenc.functional.apply_rope_qk`'s: float32 math, one rounding (to q's dtype
for q, straight to the cache dtype for k).
"""

from __future__ import annotations

import torch

from posenc import _validate
from posenc._deprecate import UNSET
from posenc._torch import plans
from posenc._torch.checks import (
    check_float_tensor,
    check_inplace,
    check_position_args,
    check_qk,
    check_same_device,
    share_memory,
)
from posenc._torch.engine_choice import (
    engine_from_backend,
    kernel_limits,
    kernel_possible,
)
from posenc._torch.rope_call import check_table_options, choose_engine, table_rotary_dim
from posenc._torch.rows import guard_in_table, out_of_table
from posenc.kernels import engine as _engine

__all__ = ["rope_and_cache"]

_TABLE_FIX = "build a longer cos/sin table (rope_cos_sin(torch.arange(P), inv_freq) with a larger P)"


def rope_and_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    cache_seqlens: torch.Tensor | None = None,
    slots: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    layout: str = "half",
    seq_dim: int = -2,
    inplace: bool = False,
    engine: str = "auto",
    backend: str = UNSET,
    assume_valid: bool = False,
) -> torch.Tensor:
    """Rotate q and k with RoPE and write the rotated k and v into a KV cache, in one call.

    What an inference engine does at every step, fused: q is rotated and returned; k is rotated and
    written into ``k_cache``, v copied into ``v_cache`` (both caches are updated in place; k and v
    themselves are never modified).  With ``engine="triton"`` (the default on CUDA) it is one
    kernel launch reading q, k and v once, instead of a rotation followed by a cache write.

    The rotation is :func:`posenc.functional.apply_rope_qk`'s (Su et al. 2021, "RoFormer"): each
    feature pair ``(x1, x2)`` at position ``m`` becomes ``(x1 cos - x2 sin, x2 cos + x1 sin)`` with
    the table row ``m``, computed in float32 and rounded once: q to its own dtype, k straight to the
    cache dtype (a float32 cache holding bfloat16 inputs gets the float32 result, not a bfloat16
    one).  v is converted to the cache dtype.  Features past the rotary dim ``d = 2 * cos.shape[-1]``
    pass through unchanged into the output and the cache (partial rotary).

    Pass exactly one of ``cache_seqlens`` and ``slots``; it picks the cache kind:

    - **contiguous cache** (``cache_seqlens``, as Hugging Face's static cache and flash-attn's
      ``flash_attn_with_kvcache``): token ``s`` of batch row ``b`` is written at index
      ``cache_seqlens[b] + s`` of ``k_cache[b]`` and rotated at that position, unless
      ``positions`` are given (e.g. rows padded on the left): then the rotation uses
      ``positions`` while the write index still follows ``cache_seqlens``.
    - **paged cache** (``slots``, as vLLM's flash layout and FlashInfer's NHD layout): token ``t``
      is written to block ``slots[t] // block_size``, row ``slots[t] % block_size``; a negative slot
      (vLLM's ``-1`` for padding tokens) is not written, but its q is still rotated.  Tokens are
      flattened, so ``seq_dim`` is ignored, and ``positions`` are required.  Slots are not checked
      for duplicates (that would cost a sort on the device): tokens sharing a slot all write it
      and one write survives, which one is unspecified (the torch engine on CPU keeps the last
      token's in practice; on CUDA the writes race).  Give each token its own slot.

    Args:
        q: queries, ``(B, Hq, S, D)`` (``seq_dim=-2``) or ``(B, S, Hq, D)`` (``seq_dim=1``) for a
            contiguous cache, ``(T, Hq, D)`` for a paged one; any strides (e.g. views of one fused
            qkv projection).
        k: keys, like ``q`` with ``Hk`` heads (GQA: ``Hq`` need not be a multiple of ``Hk``).
        v: values, the same shape as ``k``.
        k_cache: ``(B, Hk, S_max, D)`` (contiguous, whatever ``seq_dim``) or
            ``(num_blocks, block_size, Hk, D)`` (paged); any floating dtype, updated in place.
        v_cache: the same shape as ``k_cache``, updated in place; it may be a view of the same buffer
            as ``k_cache`` (e.g. ``kv[:, 0]`` and ``kv[:, 1]``) but must share no element with it.
        cos, sin: ``(P, d/2)`` tables with ``d <= D``, e.g.
            ``rope_cos_sin(torch.arange(P), inv_freq)``.
        cache_seqlens: ``(B,)`` integer tensor, the tokens already in each row of a contiguous
            cache.
        slots: ``(T,)`` integer tensor, each token's slot in a paged cache (negative: not written).
        positions: rotation positions, ``(S,)`` or ``(B, S)`` for a contiguous cache (default
            ``cache_seqlens[b] + s``), ``(T,)`` for a paged one (required).
        layout: ``"half"`` (pairs ``i, i + d/2``: GPT-NeoX, Hugging Face) or ``"interleaved"``
            (pairs ``2i, 2i + 1``: GPT-J, Meta's Llama code).
        seq_dim: the sequence axis of q, k and v for a contiguous cache (-2 or 1); ignored for a
            paged cache.
        inplace: rotate q itself and return it (k and v are still left untouched).
        engine: ``"auto"`` (the Triton kernel for CUDA tensors, else the torch engine),
            ``"torch"`` (a rotation then indexed writes, any device) or ``"triton"`` (the one-launch
            kernel; float16, bfloat16 and float32 tensors; raises if it cannot run).
        backend: the old name of ``engine`` (deprecated; it still works for now).
        assume_valid: promise that the positions lie in ``[0, P)`` and every write fits the cache,
            so that nothing is read back from the device (a decode step captured in a CUDA graph
            needs this).  Without it, one read per call checks them and raises a ``ValueError``
            naming the bad range.  A broken promise never writes outside the caches: the kernel
            skips such writes and gives NaN rows for positions outside the tables; the torch
            engine skips the writes and its table lookup stays bounds-checked (an error on CPU, a
            device-side assertion on CUDA).

    Shape:
        - contiguous: q ``(B, Hq, S, D)`` or ``(B, S, Hq, D)``, k and v ``(B, Hk, S, D)`` or
          ``(B, S, Hk, D)``, caches ``(B, Hk, S_max, D)``, cache_seqlens ``(B,)``.
        - paged: q ``(T, Hq, D)``, k and v ``(T, Hk, D)``, caches
          ``(num_blocks, block_size, Hk, D)``, slots and positions ``(T,)``.
        - output: like ``q``.

    Returns:
        The rotated queries: a new tensor, or ``q`` itself with ``inplace=True``.

    Raises:
        TypeError: non-tensor or non-floating q/k/v/caches/tables, non-integer cache_seqlens,
            slots or positions.
        ValueError: both or neither of ``cache_seqlens`` and ``slots``; shapes that do not match
            the cache kind; caches that share memory; positions outside the tables; writes past the end of the cache
            (``cache_seqlens[b] + S > S_max``, a slot ``>= num_blocks * block_size``); an input
            that requires grad while autograd records (use
            :func:`posenc.functional.apply_rope_qk` for training); ``engine="triton"`` where the
            kernel cannot run.

    Examples:
        A contiguous cache holding 5 tokens per row receives 3 more:

        >>> import torch
        >>> from posenc.functional import rope_cos_sin, rope_inv_freq
        >>> cos, sin = rope_cos_sin(torch.arange(32), rope_inv_freq(8)[0])
        >>> k_cache, v_cache = torch.zeros(2, 1, 16, 8), torch.zeros(2, 1, 16, 8)    # (B, Hk, S_max, D)
        >>> q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 1, 3, 8), torch.randn(2, 1, 3, 8)
        >>> q_rot = rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, cache_seqlens=torch.tensor([5, 5]))
        >>> torch.equal(v_cache[:, :, 5:8], v), bool(k_cache[:, :, 8:].eq(0).all())
        (True, True)

        A paged cache of 4 blocks of 2 slots; the second token is padding (slot -1):

        >>> k_cache, v_cache = torch.zeros(4, 2, 1, 8), torch.zeros(4, 2, 1, 8)     # (blocks, block_size, Hk, D)
        >>> q, k, v = torch.randn(2, 4, 8), torch.randn(2, 1, 8), torch.randn(2, 1, 8)
        >>> q_rot = rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, slots=torch.tensor([5, -1]),
        ...                        positions=torch.tensor([7, 0]))
        >>> torch.equal(v_cache[2, 1], v[0]), int(v_cache.ne(0).any(-1).sum())     # block 5 // 2, row 5 % 2
        (True, 1)

    References:
        Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
        arXiv:2104.09864.  Kwon et al. 2023, "Efficient Memory Management for Large Language Model
        Serving with PagedAttention" (the paged cache).
    """
    if backend is not UNSET:                 # the old name of engine=
        engine = engine_from_backend("rope_and_cache", backend, engine)
    key = None
    T = torch.Tensor
    if (type(q) is T and type(k) is T and type(v) is T and type(k_cache) is T and type(v_cache) is T
            and type(cos) is T and type(sin) is T and (cache_seqlens is None or type(cache_seqlens) is T)
            and (slots is None or type(slots) is T) and (positions is None or type(positions) is T)
            and type(seq_dim) is int and (inplace is False or inplace is True)
            and (assume_valid is False or assume_valid is True) and not torch.compiler.is_compiling()):
        # step 0: a call with the signature of one validated before runs its plan (posenc._torch.plans);
        # the caches' addresses are part of it (whether the two share memory was checked for them)
        index = cache_seqlens if slots is None else slots
        try:
            # (requiring grad is refused only while autograd records: the key says so then)
            grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or cos.requires_grad
                                                or sin.requires_grad or k_cache.requires_grad or v_cache.requires_grad)
            key = ("rope_and_cache", q.shape, q.stride(), q.dtype, q.device, grad,
                   k.shape, k.stride(), k.dtype, k.device, v.shape, v.stride(), v.dtype, v.device,
                   k_cache.shape, k_cache.stride(), k_cache.dtype, k_cache.device, k_cache.data_ptr(),
                   v_cache.shape, v_cache.stride(), v_cache.dtype, v_cache.device,
                   v_cache.data_ptr(), cos.shape, cos.stride(), cos.dtype, cos.device,
                   sin.shape, sin.stride(), sin.dtype, sin.device,
                   slots is None, None if index is None else (index.shape, index.stride(), index.dtype, index.device),
                   None if positions is None else (positions.shape, positions.stride(), positions.dtype,
                                                   positions.device),
                   layout, seq_dim, inplace, engine, assume_valid)
        except RuntimeError:                                            # (sparse tensors have no strides)
            key = None
        plan = plans.get(key)
        if plan is not None:
            paged, tokens, cap, token_dims = plan.data
            all_valid = None if assume_valid else _check_ranges(index, positions, paged, tokens, cap, plan.rows,  # type: ignore[arg-type]
                                                                False)
            if not inplace or _shares_nothing(q, (k, v), token_dims):
                return plan.run(q, k, v, k_cache, v_cache, cos, sin, index, positions, all_valid)
    paged = _cache_kind(cache_seqlens, slots)
    _check_no_grad(q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, cos=cos, sin=sin)
    rotary = table_rotary_dim(cos, sin)
    _validate.check_bool("inplace", inplace)
    _validate.check_bool("assume_valid", assume_valid)
    if paged:
        index, positions = _check_paged(q, k, v, k_cache, v_cache, slots, positions, rotary)
        sd, tokens = 0, q.shape[0]
    else:
        sd, index, positions = _check_contiguous(q, k, v, k_cache, v_cache, cache_seqlens, positions, seq_dim, rotary)
        tokens = q.shape[sd]
    check_table_options(q, cos, sin, layout, engine)
    cap = k_cache.shape[0] * k_cache.shape[1] if paged else k_cache.shape[2]
    all_valid = _check_ranges(index, positions, paged, tokens, cap, cos.shape[0], assume_valid)
    why = (_kernel_why(q, k, v, k_cache, v_cache, sd, paged) or "") if kernel_possible(engine, q) else ""
    name = choose_engine(engine, q, k, sd, why)
    mod = _engine("rope_and_cache", name)
    if inplace and not torch.compiler.is_compiling():
        check_inplace("q", q)
    token_dims = (0,) if paged else (0, sd)
    if torch.compiler.is_compiling():
        return mod.rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, index=index, positions=positions, paged=paged,
                                  layout=layout, seq_dim=sd, inplace=inplace, all_valid=all_valid)
    if inplace and not _shares_nothing(q, (k, v), token_dims):
        q_out = mod.rope_and_cache(q, k, v, k_cache, v_cache, cos, sin, index=index, positions=positions, paged=paged,
                                   layout=layout, seq_dim=sd, inplace=False, all_valid=all_valid)
        return q.copy_(q_out)                                          # q shares memory with k or v
    write = mod.prepare(q, k, v, k_cache, v_cache, cos, sin, index, positions, paged, layout, sd, inplace)
    plans.put(key, plans.Plan(write, cos.shape[0], 0, False, (paged, tokens, cap, token_dims)))
    return write(q, k, v, k_cache, v_cache, cos, sin, index, positions, all_valid)


# ------------------------------------------------------------------------------------------------
# Validation


def _cache_kind(cache_seqlens: object, slots: object) -> bool:
    """Whether the call writes a paged cache (``slots``) rather than a contiguous one (``cache_seqlens``)."""
    if (cache_seqlens is None) == (slots is None):
        given = "both" if slots is not None else "neither"
        raise ValueError(
            f"pass exactly one of cache_seqlens and slots, got {given}: cache_seqlens (B,) for a contiguous cache "
            f"k_cache (B, Hk, S_max, D) (token s of row b goes to index cache_seqlens[b] + s), or slots (T,) for a "
            f"paged cache k_cache (num_blocks, block_size, Hk, D) (token t goes to slot slots[t])"
        )
    return slots is not None


def _check_no_grad(**tensors: object) -> None:
    if not torch.is_grad_enabled():
        return
    names = [name for name, t in tensors.items() if isinstance(t, torch.Tensor) and t.requires_grad]
    if names:
        raise ValueError(
            f"rope_and_cache is for inference and records no gradients, but {', '.join(names)} require(s) grad; use "
            f"apply_rope_qk for training, or call rope_and_cache under torch.no_grad() / torch.inference_mode()"
        )


def _check_index(name: str, t: object, length: int, device: torch.device, meaning: str) -> torch.Tensor:
    """An integer ``(length,)`` tensor on ``device``, returned as int32/int64."""
    if not isinstance(t, torch.Tensor) or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        got = f"dtype {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name} must be an integer torch.Tensor ({meaning}), got {got}; build it with "
                        f"torch.tensor([...]) or cast with .long()")
    if t.dim() != 1 or t.shape[0] != length:
        raise ValueError(f"{name} must have shape ({length},) ({meaning}), got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q on {device}; move it with .to()")
    return t if t.dtype in (torch.int32, torch.int64) else t.long()


def _check_kv(q: torch.Tensor, k: object, v: object) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v: floating tensors of one shape, on q's device."""
    k = check_float_tensor("k", k)
    v = check_float_tensor("v", v)
    if v.shape != k.shape:
        raise ValueError(f"v {tuple(v.shape)} must have the shape of k {tuple(k.shape)}")
    check_same_device("v", v, "q", q.device)
    return k, v


def _check_caches(q: torch.Tensor, k: torch.Tensor, k_cache: object, v_cache: object, want: tuple[int | None, ...],
                  kind: str) -> None:
    """Floating caches of one shape matching ``want`` (None: any size), on q's device, free of self-overlap."""
    k_cache = check_float_tensor("k_cache", k_cache)
    v_cache = check_float_tensor("v_cache", v_cache)
    if k_cache.dim() != len(want) or any(w is not None and n != w for n, w in zip(k_cache.shape, want, strict=True)):
        shown = "(" + ", ".join("*" if w is None else str(w) for w in want) + ")"
        raise ValueError(f"k_cache must be {kind} = {shown} for k of shape {tuple(k.shape)}, got "
                         f"{tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache {tuple(v_cache.shape)} must have the shape of k_cache {tuple(k_cache.shape)}")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_same_device(name, c, "q", q.device)
    if torch.compiler.is_compiling():
        return                                                          # (memory is not inspected while tracing)
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if torch._debug_has_internal_overlap(c) == 1:
            raise ValueError(f"{name} has elements that share memory (an expand()ed tensor, stride 0), so writes "
                             f"would collide; allocate the cache with torch.zeros or torch.empty")
    if k_cache.data_ptr() == v_cache.data_ptr() and k_cache.stride() == v_cache.stride() and k_cache.numel():
        raise ValueError("k_cache and v_cache are the same tensor; keys and values need a cache each")
    if share_memory(k_cache, v_cache):
        raise ValueError(
            f"k_cache and v_cache share memory (views of one buffer whose elements overlap: k_cache at element "
            f"offset {k_cache.storage_offset()} with strides {k_cache.stride()}, v_cache at "
            f"{v_cache.storage_offset()} with strides {v_cache.stride()}), so key and value writes would collide; "
            f"give each its own memory, e.g. kv[0] and kv[1] of one (2, ...) buffer"
        )


def _check_contiguous(q, k, v, k_cache, v_cache, cache_seqlens, positions, seq_dim, rotary):
    """Check a contiguous-cache call; returns ``(seq_dim, cache_seqlens, positions)``, normalized."""
    q = check_float_tensor("q", q)
    k, v = _check_kv(q, k, v)
    sd = check_qk(q, k, seq_dim, rotary)
    if q.dim() != 4 or sd not in (1, 2):
        raise ValueError(
            f"with cache_seqlens (a contiguous cache) q must be (B, Hq, S, D) with seq_dim=-2 or (B, S, Hq, D) with "
            f"seq_dim=1, got shape {tuple(q.shape)} with seq_dim={seq_dim}; for a paged cache pass slots= and "
            f"q (T, Hq, D)"
        )
    B, S = q.shape[0], q.shape[sd]
    hk = k.shape[1 if sd == 2 else 2]
    _check_caches(q, k, k_cache, v_cache, (B, hk, None, k.shape[-1]), "(B, Hk, S_max, D) (whatever seq_dim)")
    index = _check_index("cache_seqlens", cache_seqlens, B, q.device, "tokens already in each row's cache")
    positions, _ = check_position_args(positions, 0, S, B, q.device)
    return sd, index, positions


def _check_paged(q, k, v, k_cache, v_cache, slots, positions, rotary):
    """Check a paged-cache call; returns ``(slots, positions)``, normalized."""
    q = check_float_tensor("q", q)
    k, v = _check_kv(q, k, v)
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(
            f"with slots (a paged cache) q must be (T, Hq, D) and k, v (T, Hk, D), got {tuple(q.shape)} and "
            f"{tuple(k.shape)}; for a contiguous cache pass cache_seqlens= and q (B, Hq, S, D)"
        )
    check_qk(q, k, 0, rotary)
    T, hk = q.shape[0], k.shape[1]
    _check_caches(q, k, k_cache, v_cache, (None, None, hk, k.shape[-1]), "(num_blocks, block_size, Hk, D)")
    index = _check_index("slots", slots, T, q.device, "each token's slot in the paged cache, negative: not written")
    if positions is None:
        raise ValueError(
            "positions (T,) are required with slots (a paged cache): a slot says where a token is stored, not where "
            "it stands in its sequence; pass each token's position, e.g. positions=context_lens_before + offsets"
        )
    positions, _ = check_position_args(positions, 0, T, None, q.device)
    return index, positions


def _check_ranges(index: torch.Tensor, positions: torch.Tensor | None, paged: bool, tokens: int, cap: int,
                  rows: int, assume_valid: bool) -> bool | None:
    """Check that positions lie in the tables and every write fits the cache, with one read from the
    device; returns whether every token is written (None when unknown: promised or traced)."""
    if assume_valid or index.is_meta:
        return None
    if torch.compiler.is_compiling():
        _guard_ranges(index, positions, paged, tokens, cap, rows)
        return None
    if not tokens or not index.numel():
        return True
    stats = [*torch.aminmax(index)] + ([*torch.aminmax(positions)] if positions is not None else [])
    lo, hi, *pos = torch.stack([s.long() for s in stats]).tolist()        # one transfer
    if paged:
        if hi >= cap:
            raise ValueError(
                f"slots must be < num_blocks * block_size = {cap} (or negative: not written), got values up to {hi}; "
                f"allocate more blocks or fix the slot mapping"
            )
    else:
        if lo < 0:
            raise ValueError(f"cache_seqlens must be >= 0 (tokens already in each row's cache), got values in "
                             f"[{lo}, {hi}]")
        if hi + tokens > cap:
            raise ValueError(
                f"the cache holds S_max={cap} tokens per row, but cache_seqlens + S reaches {hi + tokens} "
                f"(cache_seqlens up to {hi}, S={tokens}); allocate a longer cache (B, Hk, >= {hi + tokens}, D) or "
                f"write fewer tokens"
            )
        if positions is None and hi + tokens > rows:
            raise ValueError(
                f"the rotation positions cache_seqlens[b] + s reach {hi + tokens - 1}, outside the cos/sin table of "
                f"{rows} rows; {_TABLE_FIX}"
            )
    if positions is not None and (pos[0] < 0 or pos[1] >= rows):
        raise out_of_table("positions", pos[0], pos[1], rows, _TABLE_FIX)
    return not paged or lo >= 0


def _guard_ranges(index, positions, paged, tokens, cap, rows) -> None:
    """The checks of :func:`_check_ranges` as traceable assertions (nothing is read back while tracing)."""
    if paged:
        torch._assert_async((index < cap).all(), f"slots must be < num_blocks * block_size = {cap}")
    else:
        ok = ((index >= 0) & (index + tokens <= cap)).all()
        torch._assert_async(ok, f"cache_seqlens + S must lie in [0, S_max={cap}]")
        if positions is None:
            torch._assert_async((index + tokens <= rows).all(), f"cache_seqlens + S must be <= {rows} table rows")
    if positions is not None:
        guard_in_table("positions", positions, rows)


def _kernel_why(q, k, v, k_cache, v_cache, sd: int, paged: bool) -> str | None:
    """Why the Triton kernel cannot take the call (None if it can): the tensors' dtypes."""
    for name, t in (("q", q), ("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() == 3:
            t = t.unsqueeze(1)                                             # (T, H, D) -> (T, 1, H, D)
        why = kernel_limits(t, sd if name in ("q", "k", "v") and not paged else 1)
        if why is not None:
            return f"{name}: {why}"
    return None


def _shares_nothing(q: torch.Tensor, others: tuple[torch.Tensor, ...], token_dims: tuple[int, ...]) -> bool:
    """Whether ``q`` provably shares no element with ``others`` that the kernel reads, so that it may be
    rotated in place in the same launch.

    True when no other tensor overlaps q's memory, or when they are views of one buffer laid out token
    by token (a fused qkv projection): the same token strides, disjoint byte ranges within a token, and
    token windows that do not overlap.
    """
    near = [t for t in others if t.numel() and torch._C._overlaps(q, t)]
    if not near or not q.numel():
        return True
    tensors = [q, *near]
    steps = [tuple(t.stride(d) * t.element_size() for d in token_dims) for t in tensors]
    if any(s != steps[0] for s in steps):
        return False
    spans = []
    for t in tensors:
        start = t.storage_offset() * t.element_size()
        inner = sum((t.shape[d] - 1) * t.stride(d) for d in range(t.dim()) if d not in token_dims)
        spans.append((start, start + (inner + 1) * t.element_size()))   # bytes of one token, [start, end)
    (q0, q1), rest = spans[0], spans[1:]
    if any(s < q1 and q0 < e for s, e in rest):
        return False
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    reach = hi - lo                                                     # every tensor's bytes of one token
    for step, n in sorted((st, q.shape[d]) for st, d in zip(steps[0], token_dims, strict=True) if q.shape[d] > 1):
        if step < reach:
            return False
        reach += step * (n - 1)
    return True
