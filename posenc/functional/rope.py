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

import logging
import math

import torch

from posenc import _validate
from posenc._deprecate import UNSET
from posenc._torch import plans
from posenc._torch.angles import check_float64_available, exact_cos_sin
from posenc._torch.checks import (
    check_float_dtype,
    check_float_tensor,
    check_inplace,
    check_position_range,
    check_positions,
    check_qk,
    check_same_device,
    inplace_pair_overlaps,
)
from posenc._torch.engine_choice import (
    check_rope_engine,
    engine_from_backend,
    kernel_limits,
    kernel_possible,
)
from posenc._torch.rope_call import (
    check_call,
    check_flags,
    check_rotary_slice,
    check_table_options,
    choose_engine,
    feed,
    promise,
    rotate,
    table_positions_ok,
    table_rotary_dim,
    trailing,
)
from posenc._torch.rows import guard_in_table, out_of_table
from posenc._torch.varlen import check_varlen_call, varlen_positions, varlen_range
from posenc.core import exact as core_exact
from posenc.core import rope as core_rope
from posenc.core.notices import LOGGER_NAME
from posenc.core.rope import ROPE_LAYOUTS
from posenc.kernels import engine as kernel_engine
from posenc.kernels import rope_engine, torch_mix, torch_rope

__all__ = [
    "apply_rope",
    "apply_rope_qk",
    "convert_rope_weight",
    "layout_permutation",
    "rope_cos_sin",
    "rope_inv_freq",
]

_log = logging.getLogger(LOGGER_NAME)


def rope_inv_freq(
    dim: int,
    *,
    base: float = 10000.0,
    scaling: core_rope.RopeScaling | None = None,
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
    freqs, factor = core_rope.inv_freq(dim, base, scaling, seq_len)
    return torch.from_numpy(freqs), factor


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
    positions = check_positions("positions", positions)
    check_position_range("positions", positions)
    if not isinstance(inv_freq, torch.Tensor) or inv_freq.dim() != 1 or not inv_freq.dtype.is_floating_point:
        raise TypeError(f"inv_freq must be a 1-D floating tensor of frequencies (dim/2,), got {inv_freq!r:.80}")
    if inv_freq.is_meta:
        raise ValueError(
            "inv_freq is on the meta device, which holds no values, but its frequencies are read here; pass them on "
            "a real device (e.g. rope_inv_freq(dim)[0])"
        )
    freqs = tuple(float(f) for f in inv_freq.tolist())            # a host read, in any dtype
    if not all(map(math.isfinite, freqs)):
        raise ValueError(f"inv_freq must be finite, got {inv_freq!r:.80}")
    attention_factor = _validate.check_float("attention_factor", attention_factor, minimum=0.0)
    check_float_dtype("dtype", dtype)
    check_float64_available("dtype", dtype, positions.device)
    turns = core_exact.turns_split(freqs)
    return exact_cos_sin(positions, turns, attention_factor, dtype)


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
    count and k with the key/value head count.  What was converted (layouts, heads, head dim) is
    logged at ``INFO`` level on the ``"posenc"`` logger.

    To load Meta's original Llama weights (or rotary-embedding-torch / torchtune ones, which pair
    adjacent features too) into a ``layout="half"`` model, convert its q and k projections once:
    ``convert_rope_weight(w, num_heads, src="interleaved", dst="half")``.

    Args:
        weight: ``(num_heads * head_dim, in_features)`` projection weight, or its ``(num_heads * head_dim,)`` bias.
        num_heads: heads in this projection.
        src, dst: ``"interleaved"`` or ``"half"``.
        rotary_dim: rotated features per head (default: the whole head).

    Returns:
        The permuted copy, same shape (an unchanged copy when ``src == dst``).

    Raises:
        TypeError: ``weight`` is not a 1-D or 2-D tensor.
        ValueError: an unknown layout, rows that do not split into ``num_heads`` heads, or a
            ``rotary_dim`` that is odd or larger than the head dim.

    Examples:
        >>> w = torch.arange(4.0)[:, None]                 # one head of 4 rows: pairs (0, 1), (2, 3)
        >>> convert_rope_weight(w, 1, src="interleaved", dst="half").flatten()
        tensor([0., 2., 1., 3.])
    """
    _validate.check_choice("src", src, ROPE_LAYOUTS)
    _validate.check_choice("dst", dst, ROPE_LAYOUTS)
    num_heads = _validate.check_int("num_heads", num_heads, minimum=1)
    if not isinstance(weight, torch.Tensor) or weight.dim() not in (1, 2):
        raise TypeError("weight must be a 1-D bias or 2-D (out_features, in_features) tensor")
    if weight.shape[0] % num_heads:
        raise ValueError(f"weight has {weight.shape[0]} rows, not a multiple of num_heads={num_heads}")
    head_dim = weight.shape[0] // num_heads
    if head_dim < 2:
        raise ValueError(
            f"weight has {weight.shape[0]} rows, so num_heads={num_heads} heads of {head_dim} features each; a rotary "
            f"head needs at least 2 (pass the full q or k projection and its head count)"
        )
    rotary_dim = head_dim if rotary_dim is None else _validate.check_int("rotary_dim", rotary_dim, minimum=2)
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be even and <= head_dim={head_dim}, got {rotary_dim}")
    if _log.isEnabledFor(logging.INFO):
        _log.info("%s", _conversion_note(weight, num_heads, head_dim, rotary_dim, src, dst))
    if src == dst:
        return weight.clone()
    perm = layout_permutation(rotary_dim, device=weight.device)
    if src == "half":
        perm = torch.argsort(perm)                                    # the inverse permutation
    index = torch.cat([perm, torch.arange(rotary_dim, head_dim, device=weight.device)])
    heads = weight.reshape(num_heads, head_dim, *weight.shape[1:])   # (H, head_dim[, in])
    return heads[:, index].reshape(weight.shape)


def _conversion_note(weight: torch.Tensor, num_heads: int, head_dim: int, rotary_dim: int, src: str, dst: str) -> str:
    """What :func:`convert_rope_weight` does with ``weight``, for the ``"posenc"`` log."""
    kind = "bias" if weight.dim() == 1 else "weight"
    split = (f"a {tuple(weight.shape)} {kind} (num_heads={num_heads} heads of head_dim={head_dim}"
             + (f", rotary_dim={rotary_dim})" if rotary_dim != head_dim else ")"))
    if src == dst:
        other = "interleaved" if src == "half" else "half"
        return (f"convert_rope_weight: src and dst are both {src!r}: nothing to reorder, returning an unchanged copy "
                f"of {split}; if the checkpoint pairs features the other way, pass src={other!r}")
    return (f"convert_rope_weight: src={src!r} -> dst={dst!r} for {split}: the first {rotary_dim} rows of each head "
            f"are reordered, so the result rotates correctly with layout={dst!r}; a wrong num_heads reorders the "
            f"wrong rows: pass this projection's own head count (for k under GQA, the key/value head count)")


def _check_rope_args(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> int:
    """Check ``apply_rope``'s tensors; returns ``h = cos.shape[-1]``."""
    _validate.check_choice("layout", layout, ROPE_LAYOUTS)
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        check_float_tensor(name, t)
        if t.dim() == 0:
            raise ValueError(f"{name} must have a feature axis (..., D), got a 0-d tensor")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    h = cos.shape[-1]
    if not h:
        raise ValueError(f"cos and sin must hold at least one frequency (..., d/2 >= 1), got shape {tuple(cos.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        check_same_device(name, t, "x", x.device)
    if 2 * h > x.shape[-1]:
        raise ValueError(
            f"the rotary dim 2 * cos.shape[-1] = {2 * h} exceeds x's feature dim {x.shape[-1]}; "
            f"build cos/sin for a rotary dim <= the head dim"
        )
    pairs = x.shape[:-1] + (h,)
    try:
        fits = torch.broadcast_shapes(pairs, cos.shape) == pairs
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"cos/sin of shape {tuple(cos.shape)} do not broadcast to x[..., :{h}] of shape {tuple(pairs)}; "
            f"for x (B, H, S, D) pass (S, D/2), for (B, S, H, D) pass (S, 1, D/2)"
        )
    return h


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


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "half",
    inplace: bool = False,
    engine: str = "auto",
    backend: str = UNSET,
) -> torch.Tensor:
    """Rotate the first ``2 * cos.shape[-1]`` features of ``x``; the rest pass through unchanged.

    Args:
        x: ``(..., D)`` queries or keys, e.g. ``(B, H, S, D)`` or ``(B, S, H, D)``; any strides.
        cos, sin: ``(..., d/2)`` broadcasting against ``x[..., :d/2]``: ``(S, d/2)`` for
            ``(B, H, S, D)``, ``(S, 1, d/2)`` for ``(B, S, H, D)``, ``(B, 1, S, d/2)`` for per-row
            positions; from :func:`rope_cos_sin`.
        layout: ``"half"`` (pairs ``i, i + d/2``) or ``"interleaved"`` (pairs ``2i, 2i + 1``).
        inplace: rotate ``x`` itself and return it (no output allocation; the fast path).
        engine: ``"auto"`` (Triton for supported CUDA tensors, else torch), ``"torch"`` or
            ``"triton"`` (raises if the kernel cannot take the case).  The kernel takes 4-D ``x``
            with one ``(S, d/2)`` row set broadcast along axis 2 (or ``(S, 1, d/2)`` along axis 1).
        backend: the old name of ``engine`` (deprecated; it still works for now).

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
    if backend is not UNSET:                 # the old name of engine=
        engine = engine_from_backend("apply_rope", backend, engine)
    h = _check_rope_args(x, cos, sin, layout)
    engine = check_rope_engine(engine)
    _validate.check_bool("inplace", inplace)
    if inplace and not torch.compiler.is_compiling():
        check_inplace("x", x)
    seq_dim: int | None = None
    why: str | None = ""
    if kernel_possible(engine, x):                   # the kernel's own conditions, computed only when it may run
        seq_dim = _shared_rows_axis(x, cos, h)
        why = kernel_limits(x, seq_dim) if seq_dim is not None else "cos/sin must be one (S, d/2) row set shared by the batch"
        if why is None and (cos.requires_grad or sin.requires_grad):
            why = "gradients with respect to cos/sin are computed by the torch engine"
    if choose_engine(engine, x, None, seq_dim, why or "") == "triton":
        return rope_engine("triton")(x, None, cos=cos.reshape(-1, h), sin=sin.reshape(-1, h), positions=None, offset=0,
                                     layout=layout, seq_dim=seq_dim, inplace=inplace)[0]
    return torch_rope.rotate(x, cos, sin, layout=layout, inplace=inplace)


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
    engine: str = "auto",
    backend: str = UNSET,
    assume_valid: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    inverse: bool = False,
    rotary_slice: str = "first",
    rounding: str = "exact",
    assume_in_table: bool = UNSET,
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
        offset: first position when ``positions`` is None (step-by-step decoding); with
            ``cu_seqlens``, an int for every sequence or an integer tensor ``(N,)`` with one first
            position per sequence (the tokens already cached for it).
        layout: ``"half"`` or ``"interleaved"``.
        seq_dim: the sequence axis of q and k (not used with ``cu_seqlens``).
        inplace: rotate q and k in place.
        engine: ``"auto"``, ``"torch"`` or ``"triton"`` (the fused kernel: one launch for q and k,
            reading the tables directly).
        backend: the old name of ``engine`` (deprecated; it still works for now).
        assume_valid: promise that every entry of ``positions`` lies in ``[0, P)``, so that
            their range is not read back from the device (no synchronisation: what a decode step
            captured in a CUDA graph needs).  The lookup stays bounds-checked (an error on CPU, a
            device-side assertion on CUDA; the Triton kernel gives NaN rows), so a broken promise
            never reads outside the tables.  Without it, one range reduction per call checks
            ``positions`` (none with ``offset``, whose range is known on the host).  With
            ``cu_seqlens`` it also promises valid cumulative lengths, which are otherwise checked
            in the same read.  (Formerly ``assume_in_table``, which still works for now with a
            ``DeprecationWarning``.)
        cu_seqlens: packed variable-length batch, as flash-attention's varlen functions take it:
            q ``(T, H, D)`` and k ``(T, H_k, D)`` hold ``N`` sequences back to back, and
            ``cu_seqlens`` ``(N + 1,)`` (int32/int64) their cumulative lengths ``[0, ..., T]``.
            Positions restart at ``offset`` in every sequence, so the result equals rotating
            each sequence alone.  The Triton kernel finds each token's sequence itself.
        inverse: rotate by ``-theta`` instead of ``theta``: the transpose (and inverse) of the
            rotation, exact to the last bit (the sines are negated; nothing else changes).  Undoes a
            rotation, as DeepSeek-V4 does to its attention output, whose values are rotated keys.
        rotary_slice: which ``d`` features of each head rotate: ``"first"`` (the leading ones, as
            GPT-NeoX and Llama) or ``"last"`` (the trailing ones, as DeepSeek-V4's latent heads);
            the other ``D - d`` features pass through unchanged.  Out of place, ``"last"`` copies q
            and k once and rotates the trailing features of the copies in place.
        rounding: ``"exact"`` (the default: each output computed in float32, float64 for float64
            inputs, and rounded once) or ``"model"``: rounded as a model's own eager code,
            ``q * cos + rotate_half(q) * sin`` in q's dtype, rounds (the rows rounded to q's dtype,
            each product and the sum rounded to it), so that a bfloat16 or float16 model's rotation
            is reproduced bit for bit where its cos/sin are the same.  ``"model"`` runs on the torch
            engine in eager mode; with ``engine="triton"`` or under ``torch.compile`` (whose fused
            kernels round as they choose) it raises.

    Raises:
        TypeError: non-tensor or non-floating q/k/cos/sin, non-integer positions.
        ValueError: shapes that do not match, positions outside the tables, an unknown layout,
            engine or rounding, ``engine="triton"`` for a case the kernel cannot take,
            ``rounding="model"`` with ``engine="triton"`` or while compiling.

    Returns:
        ``(q_rotated, k_rotated)`` (``k_rotated`` is None when ``k`` is None).

    Examples:
        Two packed sequences of 3 and 2 tokens; the second restarts at position 0:

        >>> cos, sin = rope_cos_sin(torch.arange(8), rope_inv_freq(4)[0])
        >>> q = torch.randn(5, 2, 4)                                  # (T, H, D)
        >>> cu = torch.tensor([0, 3, 5], dtype=torch.int32)
        >>> packed, _ = apply_rope_qk(q, None, cos, sin, cu_seqlens=cu)
        >>> alone, _ = apply_rope_qk(q[3:][None], None, cos, sin, seq_dim=1)
        >>> torch.equal(packed[3:], alone[0])
        True
    """
    if backend is not UNSET:                 # the old name of engine=
        engine = engine_from_backend("apply_rope_qk", backend, engine)
    if rounding != "exact":
        _check_model_rounding(rounding, engine)
    if rotary_slice != "first":
        return _apply_rope_last(q, k, cos, sin, positions, offset, layout, seq_dim, inplace, engine, assume_valid,
                                cu_seqlens, inverse, rotary_slice, assume_in_table, rounding)
    key = None
    if (cu_seqlens is None and assume_in_table is UNSET and type(q) is torch.Tensor and type(cos) is torch.Tensor
            and type(sin) is torch.Tensor and type(offset) is int and type(seq_dim) is int
            and (k is None or type(k) is torch.Tensor) and (positions is None or type(positions) is torch.Tensor)
            and (inplace is False or inplace is True) and (assume_valid is False or assume_valid is True)
            and (inverse is False or inverse is True) and not torch.compiler.is_compiling()):
        # step 0: a call with the signature of one validated before runs its plan (posenc._torch.plans)
        try:
            # (which tensors require grad matters only while autograd records)
            grad = torch.is_grad_enabled() and (q.requires_grad, k is not None and k.requires_grad,
                                                cos.requires_grad, sin.requires_grad)
            key = ("apply_rope_qk", q.shape, q.stride(), q.dtype, q.device,
                   None if k is None else (k.shape, k.stride(), k.dtype, k.device),
                   cos.shape, cos.stride(), cos.dtype, cos.device, sin.shape, sin.stride(), sin.dtype, sin.device,
                   None if positions is None else (positions.shape, positions.stride(), positions.dtype,
                                                   positions.device),
                   layout, seq_dim, inplace, engine, assume_valid, inverse, grad, rounding)
        except RuntimeError:                                            # (sparse tensors have no strides)
            key = None
        plan = plans.find(key, q, k, positions, offset, inplace)
        if plan is not None:
            return plan.run(q, k, cos, sin, positions, offset)
    elif cu_seqlens is not None and assume_in_table is UNSET and positions is None:
        # step 0 for a packed batch: a call like one validated before runs its plan after the range of its
        # positions (and the validity of cu_seqlens) is read, or without a read when promised
        key = _varlen_key(q, k, cos, sin, cu_seqlens, offset, layout, inplace, engine, assume_valid, inverse,
                          rounding)
        plan = plans.get(key)
        if plan is not None and (not inplace or k is None or not torch._C._overlaps(q, k)):
            lo, hi = varlen_range(cu_seqlens, q.shape[0], offset) if plan.read_range else (0, -1)
            if 0 <= lo and hi < plan.rows:
                return plan.run(q, k, cos, sin, None, offset, cu_seqlens)
    if assume_in_table is not UNSET:
        assume_valid = promise("apply_rope_qk", assume_in_table, assume_valid)
    if type(inverse) is not bool:
        _validate.check_bool("inverse", inverse)
    if cu_seqlens is not None:
        return _apply_rope_varlen(q, k, cos, sin, positions, offset, layout, inplace, engine, assume_valid,
                                  cu_seqlens, inverse, key, rounding)
    sd, positions, offset, _ = check_call(q, k, seq_dim, table_rotary_dim(cos, sin), positions, offset, inplace,
                                          assume_valid)
    check_table_options(q, cos, sin, layout, engine)
    positions = table_positions_ok(positions, offset, q.shape[sd], cos.shape[0], assume_valid)
    read_range = positions is not None and not assume_valid and q.shape[sd] > 0
    mod = torch_mix if rounding == "model" else kernel_engine("rope_qk", choose_engine(engine, q, k, sd))
    return rotate(key, mod, q, k, cos, sin, None, positions, offset, layout, sd, inplace, read_range, inverse)


#: How :func:`apply_rope_qk` rounds: once from float32 (``"exact"``), or as a model's eager code (``"model"``).
ROUNDINGS = ("exact", "model")


def _check_model_rounding(rounding: object, engine: object) -> None:
    """``rounding`` is known, and ``"model"`` is asked where it can run (the torch engine, eager)."""
    _validate.check_choice("rounding", rounding, ROUNDINGS)
    if engine == "triton":
        raise ValueError("rounding='model' runs on the torch engine (the Triton kernel computes in float32 and "
                         "rounds once); pass engine='torch' or 'auto', or rounding='exact'")
    if torch.compiler.is_compiling():
        raise ValueError("rounding='model' reproduces eager per-operation rounding, which torch.compile's fused "
                         "kernels do not keep; use rounding='exact' in compiled code")


def _apply_rope_last(q, k, cos, sin, positions, offset, layout, seq_dim, inplace, engine, assume_valid, cu_seqlens,
                     inverse, rotary_slice, assume_in_table, rounding="exact"):
    """:func:`apply_rope_qk` with ``rotary_slice="last"``: the trailing features' views rotated in place
    by the ``"first"`` call (which validates everything else and keeps its plan)."""
    check_rotary_slice(rotary_slice)
    d = table_rotary_dim(cos, sin)
    check_qk(q, k, seq_dim if cu_seqlens is None else 0, d)
    _validate.check_bool("inplace", inplace)
    qv, kv, qo, ko = trailing(q, k, d, inplace)
    apply_rope_qk(qv, kv, cos, sin, positions=positions, offset=offset, layout=layout, seq_dim=seq_dim, inplace=True,
                  engine=engine, assume_valid=assume_valid, cu_seqlens=cu_seqlens, inverse=inverse,
                  rounding=rounding, assume_in_table=assume_in_table)
    return qo, ko


def _varlen_key(q, k, cos, sin, cu_seqlens, offset, layout, inplace, engine, assume, inverse,
                rounding="exact") -> tuple | None:
    """The plan key of a packed call (:mod:`posenc._torch.plans`), None for a call no plan serves:
    arguments of other types than a plan's, strided ``cu_seqlens`` or offsets, tracing."""
    if not (type(q) is torch.Tensor and type(cos) is torch.Tensor and type(sin) is torch.Tensor
            and type(cu_seqlens) is torch.Tensor and (k is None or type(k) is torch.Tensor)
            and (type(offset) is int or type(offset) is torch.Tensor) and (inplace is False or inplace is True)
            and (assume is False or assume is True) and (inverse is False or inverse is True)
            and not torch.compiler.is_compiling()):
        return None
    try:
        if cu_seqlens.stride() != (1,) or (type(offset) is torch.Tensor and offset.stride() != (1,)):
            return None
        grad = torch.is_grad_enabled() and (q.requires_grad, k is not None and k.requires_grad,
                                            cos.requires_grad, sin.requires_grad)
        return ("apply_rope_qk varlen", q.shape, q.stride(), q.dtype, q.device,
                None if k is None else (k.shape, k.stride(), k.dtype, k.device),
                cos.shape, cos.stride(), cos.dtype, cos.device, sin.shape, sin.stride(), sin.dtype, sin.device,
                cu_seqlens.shape, cu_seqlens.dtype, cu_seqlens.device,
                None if not isinstance(offset, torch.Tensor) else (offset.shape, offset.dtype, offset.device),
                layout, inplace, engine, assume, inverse, grad, rounding)
    except RuntimeError:                                                # (sparse tensors have no strides)
        return None


def _apply_rope_varlen(q, k, cos, sin, positions, offset, layout, inplace, engine, assume, cu_seqlens, inverse,
                       key=None, rounding="exact"):
    """:func:`apply_rope_qk` for a packed ``(T, H, D)`` batch described by ``cu_seqlens``; the call's
    engine prepared once is kept as the plan of ``key``."""
    cu_seqlens, offset = check_varlen_call(q, k, table_rotary_dim(cos, sin), positions, cu_seqlens, offset)
    check_table_options(q, cos, sin, layout, engine)
    check_flags(inplace, assume)
    if torch.compiler.is_compiling():                                   # a traceable assertion, no reads
        guard_in_table("positions", varlen_positions(cu_seqlens, q.shape[0], offset), cos.shape[0])
    elif assume:
        pass
    else:
        lo, hi = varlen_range(cu_seqlens, q.shape[0], offset)
        if q.shape[0] and (lo < 0 or hi >= cos.shape[0]):
            raise out_of_table("positions", lo, hi, cos.shape[0],
                               "build a longer table or use posenc.nn.RotaryEmbedding, which computes them")
    why = None
    if kernel_possible(engine, q):
        why = kernel_limits(q[None], 1) or (None if k is None else kernel_limits(k[None], 1))
    mod = torch_mix if rounding == "model" else kernel_engine("rope_qk", choose_engine(engine, q, k, None, why or ""))
    if (key is None or torch.compiler.is_compiling() or (inplace and inplace_pair_overlaps(q, k))
            or (inplace and torch.is_grad_enabled() and (q.requires_grad or k is not None and k.requires_grad))):
        return feed(mod.rope_qk, q, k, inplace, cos=cos, sin=sin, positions=None, offset=offset, layout=layout,
                    seq_dim=0, cu_seqlens=cu_seqlens, inverse=inverse)
    run = mod.prepare(q, k, cos, sin, None, offset, layout, 0, inplace, cu_seqlens, inverse)
    plans.put(key, plans.Plan(run, cos.shape[0], 0, not assume))
    return run(q, k, cos, sin, None, offset, cu_seqlens)
