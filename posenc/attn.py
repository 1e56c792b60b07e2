"""`posenc.attention` (defined here, in `posenc.attn`): one attention entry point that applies any posenc encoding correctly.

Rotary embeddings rotate q and k; ALiBi and T5 biases are added to the logits; causal masking
compares *positions*, not indices; packed sequences stay inside their segment.  The reference
backend is ``torch.nn.functional.scaled_dot_product_attention``; ``backend="flex"`` uses
``torch.nn.attention.flex_attention`` (compiled), which applies the biases as a score modification
and the masks as a block mask, without materialising ``(S, S_k)`` tensors.

An encoding takes part through :class:`AttentionEncoding`, three methods it implements itself
(rotate q and k; a bias from positions; a flex score modification), so a new encoding is one class
and this module never repeats an encoding's formula.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import NamedTuple, Protocol, cast, runtime_checkable

import torch
import torch.nn.functional as F

from posenc import _validate
from posenc._deprecate import UNSET
from posenc._deprecate import warn as deprecation_warning
from posenc._torch.checks import check_positions, check_seq_len
from posenc._torch.rope_call import promise
from posenc._torch.varlen import check_cu_seqlens, sequence_ids, varlen_positions, varlen_range
from posenc._torch.window import score_allowed, structure_mask, temperature_factors
from posenc.core.schedule import LayerPositions, RopeSpec, Temperature, check_temperature, check_window_and_chunk
from posenc.functional.positions import positions_from_segment_ids

__all__ = ["ATTENTION_BACKENDS", "AttentionEncoding", "attention"]

ATTENTION_BACKENDS = ("sdpa", "flex")
try:
    _SDPA_HAS_GQA = "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
except (TypeError, ValueError):  # a builtin without a signature
    _SDPA_HAS_GQA = False
_compiled_flex = None


@runtime_checkable
class AttentionEncoding(Protocol):
    """What :func:`attention` asks of an encoding; :class:`~posenc.RotaryEmbedding`,
    :class:`~posenc.AlibiBias` and :class:`~posenc.RelativePositionBias` implement it.

    Positions are integer tensors ``(S,)``/``(B, S)`` (queries) and ``(S_k,)``/``(B, S_k)`` (keys);
    for the score modification they are ``(B, S)`` and ``(B, S_k)`` (padded to flex's blocks).  An
    encoding with an int attribute ``position_axes = n`` receives per-axis coordinates
    ``(S, n)``/``(B, S, n)`` in :meth:`attention_qk` instead (its bias and score modification, if
    any, then see token indices).

    An encoding whose scores are not "rotated q . k plus a bias" (contextual positions, or two
    score sets merged by distance) defines one more method, ``attention_scores(q, k, *, positions,
    key_positions, mask, scale, causal, keys_rotated, seq_len, offsets, assume_valid)``, returning
    the logits ``(B, H, S, S_k)`` before the mask; :func:`attention` then skips :meth:`attention_qk`
    and :meth:`attention_bias`, passes keys and values repeated to ``H`` heads and the additive
    ``mask`` (``-inf`` where a key is not allowed; ``None`` when nothing is masked), and applies
    the mask, softmax and dropout itself (SDPA backend only: flex cannot express such scores).
    """

    def attention_qk(self, q: torch.Tensor, k: torch.Tensor | None, *, positions: torch.Tensor,
                     key_positions: torch.Tensor, seq_len: int | None, offsets: tuple[int | None, int | None],
                     assume_valid: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(q, k)`` as attention should see them (rotated, or unchanged); ``k`` is None when the
        keys are already rotated (then ``(q, None)``).

        ``offsets`` are ``(query_offset, key_offset)``: where one is an int, those positions are
        ``offset + arange(length)``, known on the host, so nothing needs to be read from the device.
        ``assume_valid`` passes the caller's promise that explicit positions lie in the tables.  (An
        encoding whose method still takes the keyword's old name, ``assume_in_table``, is called with
        that name and a ``DeprecationWarning``.)

        :func:`attention` has validated every argument: an implementation trusts them and calls its
        own internals, not its public methods (which would validate again).
        """

    def attention_bias(self, positions: torch.Tensor, key_positions: torch.Tensor, *, num_heads: int,
                       dtype: torch.dtype) -> torch.Tensor | None:
        """A logit bias ``(H, S, S_k)`` / ``(B, H, S, S_k)``, or None."""

    def attention_score_mod(self, positions: torch.Tensor, key_positions: torch.Tensor, *,
                            num_heads: int) -> Callable | None:
        """A ``flex_attention`` ``score_mod(score, b, h, q_idx, kv_idx)`` adding the same bias, or None."""


def _flex():
    """``torch.compile(flex_attention)``, created on first use (flex needs compilation on CPU and GPU)."""
    global _compiled_flex
    if _compiled_flex is None:
        try:
            from torch.nn.attention.flex_attention import flex_attention
        except ImportError as err:  # torch < 2.5
            raise ValueError(f"backend='flex' needs torch.nn.attention.flex_attention (torch >= 2.5): {err}") from None
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating torch.Tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, S, D), got {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(
            f"q, k and v must share one dtype, got {q.dtype}, {k.dtype} and {v.dtype}; cast them, e.g. k.to(q.dtype)"
        )
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device} and {v.device}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree in (B, H, S_k)")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch and head dim")
    if not q.shape[-1] or not k.shape[1]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must have a head dim D >= 1, and k at least one head"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q has {q.shape[1]} heads, not a multiple of k's {k.shape[1]} (grouped-query attention)")


def _check_options(given: _Options, q: torch.Tensor, k: torch.Tensor) -> _Options:
    """The call's options checked, with the default scale and the user's mask normalised; one
    comparison per argument when it is well formed."""
    causal, dropout_p, scale, seq_len, assume_valid, keys_rotated, backend, attn_mask = given
    if backend not in ATTENTION_BACKENDS:
        _validate.check_choice("backend", backend, ATTENTION_BACKENDS)
    if type(causal) is not bool:
        _validate.check_bool("causal", causal)
    if not (type(dropout_p) is float and 0.0 <= dropout_p < 1.0):
        dropout_p = _validate.check_float("dropout_p", dropout_p, minimum=0.0)
        if dropout_p >= 1.0:
            raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else _validate.check_float("scale", scale, positive=True)
    attn_mask = _attn_mask(attn_mask, q, k)
    _check_flags(keys_rotated, assume_valid)
    if seq_len is not None:
        seq_len = check_seq_len(seq_len)              # checked even where the encoding does not read it
    return _Options(causal, dropout_p, scale, seq_len, assume_valid, keys_rotated, backend, attn_mask)


def _positions_arg(name: str, p: torch.Tensor, batch: int, length: int, device: torch.device) -> torch.Tensor:
    p = check_positions(name, p)
    if p.dim() not in (1, 2) or p.shape[-1] != length or (p.dim() == 2 and p.shape[0] not in (1, batch)):
        raise ValueError(f"{name} must have shape ({length},) or ({batch}, {length}), got {tuple(p.shape)}")
    if p.device != device:
        raise ValueError(f"{name} are on {p.device} but q on {device}; move them with .to(q.device)")
    return p


def _all_positions(q, k, positions, key_positions, segment_ids):
    """``(positions, key_positions, segment_ids)`` with the documented defaults; the given ones checked
    (the defaults are built right here)."""
    B, _, S, _ = q.shape
    S_k = k.shape[2]
    if segment_ids is not None:
        if not isinstance(segment_ids, torch.Tensor) or segment_ids.dtype.is_floating_point:
            raise TypeError("segment_ids must be an integer tensor (B, S)")
        if segment_ids.shape != (B, S) or S != S_k:
            raise ValueError(
                f"segment_ids must have shape (B, S) = ({B}, {S}) and queries and keys the same length; "
                f"got {tuple(segment_ids.shape)} with S_k={S_k}"
            )
        if segment_ids.device != q.device:
            raise ValueError(f"segment_ids are on {segment_ids.device} but q on {q.device}; move them with .to(q.device)")
        if positions is not None:
            positions = _positions_arg("positions", positions, B, S, q.device)
        else:
            positions = positions_from_segment_ids(segment_ids)
        key_positions = positions if key_positions is None else _positions_arg("key_positions", key_positions, B,
                                                                                S_k, q.device)
        return positions, key_positions, segment_ids
    if positions is None:
        positions = torch.arange(S_k - S, S_k, device=q.device) if S <= S_k else torch.arange(S, device=q.device)
    else:
        positions = _positions_arg("positions", positions, B, S, q.device)
    if key_positions is None:
        key_positions = torch.arange(S_k, device=q.device)
    else:
        key_positions = _positions_arg("key_positions", key_positions, B, S_k, q.device)
    return positions, key_positions, segment_ids


def _axial_positions(q, k, positions, key_positions, axes: int):
    """Per-axis coordinates ``(S, axes)``/``(B, S, axes)`` for an encoding that declares
    ``position_axes``; ``key_positions`` default to ``positions`` when queries and keys have one length."""
    B, S, S_k = q.shape[0], q.shape[2], k.shape[2]
    if positions is None:
        raise ValueError(
            f"this encoding takes per-axis coordinates: pass positions of shape ({S}, {axes}) or ({B}, {S}, {axes}) "
            f"(e.g. posenc.functional.axial.grid_positions)"
        )
    shared = key_positions is None
    if shared:
        if S != S_k:
            raise ValueError(f"queries ({S}) and keys ({S_k}) differ in length: pass key_positions ({S_k}, {axes})")
        key_positions = positions
    out = []
    for name, p, length in (("positions", positions, S), ("key_positions", key_positions, S_k)):
        p = check_positions(name, p)
        if p.dim() not in (2, 3) or p.shape[-2:] != (length, axes) or (p.dim() == 3 and p.shape[0] not in (1, B)):
            raise ValueError(f"{name} must have shape ({length}, {axes}) or ({B}, {length}, {axes}), got {tuple(p.shape)}")
        if p.device != q.device:
            raise ValueError(f"{name} are on {p.device} but q on {q.device}; move them with .to(q.device)")
        out.append(p)
        if shared:                                    # the same tensor: the encoding rotates q and k in one call
            return p, p
    return out[0], out[1]


def _host_offsets(q, k, positions, key_positions, segment_ids) -> tuple[int | None, int | None]:
    """First query and key positions where the defaults make them ranges known on the host."""
    if segment_ids is not None:
        return None, None
    S, S_k = q.shape[2], k.shape[2]
    return (S_k - S if S <= S_k else 0) if positions is None else None, 0 if key_positions is None else None


def _precomputed_bias(bias: torch.Tensor, B: int, H: int, S: int, S_k: int, device: torch.device) -> torch.Tensor:
    if not bias.dtype.is_floating_point or bias.dim() not in (3, 4) or bias.shape[-2:] != (S, S_k) \
            or bias.shape[-3] not in (1, H) or (bias.dim() == 4 and bias.shape[0] not in (1, B)):
        raise ValueError(
            f"a precomputed bias must be a floating (H, S, S_k) or (B, H, S, S_k) tensor with B={B}, H={H}, S={S}, "
            f"S_k={S_k}; got {tuple(bias.shape)} {bias.dtype}"
        )
    if bias.device != device:
        raise ValueError(f"the precomputed bias (encoding) is on {bias.device} but q on {device}; move it with .to()")
    return bias


def _check_encoding(encoding: object) -> None:
    if encoding is None or isinstance(encoding, (torch.Tensor, AttentionEncoding)):
        return
    if getattr(encoding, "adds_to_embeddings", False):
        raise TypeError(
            f"{type(encoding).__name__} is an additive encoding: add it to the token embeddings before the "
            f"Q/K/V projections, and call attention with encoding=None"
        )
    raise TypeError(
        f"encoding must be None, a RotaryEmbedding, an AlibiBias, a RelativePositionBias, another "
        f"posenc.attn.AttentionEncoding or a bias tensor; got {type(encoding).__name__}"
    )


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    encoding: AttentionEncoding | torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    key_positions: torch.Tensor | None = None,
    causal: bool = False,
    segment_ids: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    seq_len: int | None = None,
    assume_valid: bool = False,
    keys_rotated: bool = False,
    backend: str = "sdpa",
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    layer: LayerPositions | None = None,
    window: int | None = None,
    chunk: int | None = None,
    temperature: Temperature | None = None,
    sinks: torch.Tensor | None = None,
    assume_in_table: bool = UNSET,
) -> torch.Tensor:
    """Scaled dot-product attention with a positional encoding applied the right way.

    Args:
        q: queries ``(B, H, S, D)``.
        k, v: keys and values ``(B, H_kv, S_k, D)``; ``H`` must be a multiple of ``H_kv`` (GQA).
        encoding: ``None``; a :class:`~posenc.RotaryEmbedding` (rotates q at ``positions`` and k
            at ``key_positions``: pass *unrotated* keys); an :class:`~posenc.AlibiBias` or
            :class:`~posenc.RelativePositionBias` (the bias is built here from the positions); any
            object implementing :class:`AttentionEncoding`; or a precomputed bias tensor
            ``(H, S, S_k)`` / ``(B, H, S, S_k)`` from one of them, so a model builds it once per
            forward and shares it across layers.  Additive encodings
            (:class:`~posenc.SinusoidalEncoding`, :class:`~posenc.LearnedPositionalEmbedding`)
            belong on the embeddings and raise ``TypeError`` here.
        positions: query positions ``(S,)`` or ``(B, S)``; for an encoding with ``position_axes = n``
            (:class:`~posenc.AxialRotaryEmbedding`, :class:`~posenc.MultimodalRotaryEmbedding`) per-axis coordinates ``(S, n)`` or
            ``(B, S, n)``, required, with ``key_positions`` defaulting to them; ``causal`` and
            ``segment_ids`` then follow the token order (queries are the last ``S`` keys, positions
            restart in every segment), as with the defaults below.  Default: restart at 0 in every segment
            if ``segment_ids`` is given, else the *last* ``S`` key positions
            (``S_k - S .. S_k - 1``), which is what a query after cached keys needs.
        key_positions: key positions ``(S_k,)`` or ``(B, S_k)``; default like ``positions`` with
            ``segment_ids``, else ``0 .. S_k - 1``.
        causal: a query attends to keys whose *position* is <= its own.  (SDPA's ``is_causal``
            aligns by index from the top left, which is wrong when ``S < S_k``.)
        segment_ids: ``(B, S)`` ids of packed sequences (needs ``S == S_k``): attention stays
            inside each segment, and positions restart at 0 in each one.
        attn_mask: extra mask broadcasting to ``(B, H, S, S_k)``: bool or integer (True/nonzero =
            attend, like the 0/1 masks of Hugging Face tokenizers) or float (added to the logits).
            SDPA backend only.
        dropout_p: attention dropout probability (applied whenever > 0; pass 0.0 in eval).
        scale: logit scale, default ``1 / sqrt(D)``.
        seq_len: current length for length-dependent rotary rules (default: the largest key
            position + 1).
        assume_valid: promise that explicit ``positions``/``key_positions`` lie inside the rotary
            tables (and, with ``cu_seqlens``, that the cumulative lengths are valid), so that
            nothing is read from the device to check them (see :class:`~posenc.RotaryEmbedding`).
            With the default positions nothing is read anyway: they are ranges known on the host.
            (Formerly ``assume_in_table``, which still works for now with a ``DeprecationWarning``.)
        keys_rotated: ``k`` is already rotated, each key once, when it entered the KV cache (e.g.
            ``rope.rotate(k_new, key=True, offset=t)``), so only the queries are rotated here.  This
            is how Hugging Face models cache keys, and with a length-dependent rule (dynamic NTK,
            LongRoPE) it is the only way to match them: each key keeps the frequencies of the step
            that produced it.  The default (``False``) rotates the given unrotated keys at
            ``key_positions``, all with the frequencies of the current length, as if the whole
            sequence were fed at once.  The two agree for every rule that does not depend on the
            length.
        backend: ``"sdpa"`` (reference) or ``"flex"`` (compiled ``flex_attention``: no ``(S, S_k)``
            bias tensors; no ``attn_mask``/dropout; RelativePositionBias only without gradients).
        cu_seqlens: a packed variable-length batch in flash-attention's varlen format: q ``(T, H, D)``
            holds ``N`` sequences back to back and ``cu_seqlens`` ``(N + 1,)`` (int32/int64) their
            cumulative lengths ``[0, ..., T]``; k and v are ``(T_k, H_kv, D)``.  Attention stays
            inside each sequence and positions restart in each one, so the result equals
            attending each sequence alone (a length-dependent rotary rule uses each sequence's
            own length).  Excludes ``positions``, ``key_positions``, ``segment_ids`` and
            ``attn_mask``.
        cu_seqlens_k: the keys' cumulative lengths when they differ from the queries' (a decode or
            chunked-prefill step against cached keys): sequence ``i``'s queries are the last
            ``len_q`` of its ``len_k`` positions, as in flash-attention.  Default: ``cu_seqlens``.
        layer: one layer's entry of a :class:`~posenc.core.schedule.PositionSchedule`: its
            encoding, window, chunk and temperature, in place of the four arguments (which must
            then be left out).
        window: sliding window ``w``: a causal query at position ``p`` sees the keys at positions
            ``p - w < k <= p`` (``w`` keys, itself included, as transformers' ``sliding_window``);
            without ``causal``, ``|p - k| < w``.  Over a KV cache this is by position, so the
            cache may hold more keys than the window.
        chunk: chunked attention ``c``: a query sees only keys of its own chunk of absolute
            positions, ``k // c == p // c`` (Llama 4's ``attention_chunk_size``); not with ``window``.
        temperature: a per-query logit temperature
            (:class:`~posenc.core.schedule.Llama4Temperature`,
            :class:`~posenc.core.schedule.LogNTemperature`,
            :class:`~posenc.core.schedule.SSMaxTemperature`): each query is multiplied by its
            factor, computed from its position (or, for SSMax, the number of keys it may see,
            counted on a boolean ``(S, S_k)`` mask, also with flex).  SSMax refuses an encoding
            that adds a bias (the bias would stay unscaled).
        sinks: per-head sink logits ``(H,)`` (gpt-oss; "Efficient Streaming Language Models with
            Attention Sinks", Xiao et al. 2024): each softmax gets one more term ``exp(sinks[h])``
            in its denominator that attends to nothing, so a query may put weight nowhere.  A
            query with every key masked then gives zeros.

    Returns:
        ``(B, H, S, D)``; ``(T, H, D)`` with ``cu_seqlens``.

    Examples:
        >>> import posenc
        >>> q = k = v = torch.randn(1, 2, 5, 8)
        >>> posenc.attention(q, k, v, encoding=posenc.AlibiBias(2), causal=True).shape
        torch.Size([1, 2, 5, 8])
    """
    if assume_in_table is not UNSET:
        assume_valid = promise("attention", assume_in_table, assume_valid)
    encoding, structure = _layer_options(encoding, layer, window, chunk, temperature, sinks)
    given = _Options(causal, dropout_p, scale, seq_len, assume_valid, keys_rotated, backend, attn_mask)
    if cu_seqlens is not None or cu_seqlens_k is not None:
        return _varlen_attention(q, k, v, (cu_seqlens, cu_seqlens_k), (positions, key_positions, segment_ids),
                                 encoding, given, structure)
    _check_qkv(q, k, v)
    _check_sinks(structure.sinks, q)
    options = _check_options(given, q, k)
    _check_encoding(encoding)
    where = _where(q, k, encoding, positions, key_positions, segment_ids)
    if isinstance(encoding, torch.Tensor):
        B, H, S, _ = q.shape
        bias = _precomputed_bias(encoding, B, H, S, k.shape[2], q.device)
        if options.backend == "flex":
            raise ValueError("backend='flex' builds biases itself: pass the AlibiBias/RelativePositionBias module")
        allowed = _allowed(where, options.causal, options.attn_mask, structure)
        q = _temper(q, structure, where.positions, allowed, bias, k.shape[2])
        return _sdpa(q, k, v, _combine_mask(q, allowed, bias, options.attn_mask), options.dropout_p, options.scale,
                     structure.sinks)
    return _attend(q, k, v, encoding, where, options, structure)


class _Options(NamedTuple):
    """How one call attends: its flags, scale, rotary length, engine and the user's mask (checked by
    :func:`_check_options`, except in the record :func:`attention` first builds from its arguments)."""

    causal: bool
    dropout_p: float
    scale: float | None
    seq_len: int | None
    assume_valid: bool
    keys_rotated: bool
    backend: str
    attn_mask: torch.Tensor | None = None


class _Where(NamedTuple):
    """Where the tokens are: ``positions``/``key_positions`` ``(S,)``/``(B, S)`` order them (masks,
    biases); ``enc_positions`` are the ``(query, key)`` positions the encoding rotates by (per-axis
    coordinates for an encoding with ``position_axes``); ``offsets`` the first query and key
    positions where they are ranges known on the host; the segment ids of queries and keys."""

    positions: torch.Tensor
    key_positions: torch.Tensor
    enc_positions: tuple[torch.Tensor, torch.Tensor]
    offsets: tuple[int | None, int | None] = (None, None)
    segment_ids: torch.Tensor | None = None
    key_segment_ids: torch.Tensor | None = None


def _where(q, k, encoding, positions, key_positions, segment_ids) -> _Where:
    """The checked positions of a padded call, with their documented defaults."""
    axes = getattr(encoding, "position_axes", None) if not isinstance(encoding, torch.Tensor) else None
    if axes is None:
        offsets = _host_offsets(q, k, positions, key_positions, segment_ids)
        positions, key_positions, segment_ids = _all_positions(q, k, positions, key_positions, segment_ids)
        return _Where(positions, key_positions, (positions, key_positions), offsets, segment_ids, segment_ids)
    # per-axis coordinates (..., S, n_axes) for the encoding only; masks (causal, segments) follow the token
    # order, as for the defaults of 1-D encodings
    enc_positions = _axial_positions(q, k, positions, key_positions, axes)
    positions, key_positions, segment_ids = _all_positions(q, k, None, None, segment_ids)
    return _Where(positions, key_positions, enc_positions, (None, None), segment_ids, segment_ids)


class _Structure(NamedTuple):
    """A layer's window, chunk, temperature and sink logits, checked (all None: plain attention)."""

    window: int | None = None
    chunk: int | None = None
    temperature: Temperature | None = None
    sinks: torch.Tensor | None = None


_PLAIN = _Structure()


def _layer_options(encoding, layer, window, chunk, temperature, sinks=None) -> tuple[
        AttentionEncoding | torch.Tensor | None, _Structure]:
    """``(encoding, structure)`` from a schedule entry or the direct arguments (not both)."""
    if layer is not None:
        if not isinstance(layer, LayerPositions):
            raise TypeError(
                f"layer must be a LayerPositions (one entry of a PositionSchedule), got {type(layer).__name__}")
        given = [name for name, value in (("encoding", encoding), ("window", window), ("chunk", chunk),
                                          ("temperature", temperature)) if value is not None]
        if given:
            raise ValueError(
                f"layer= already sets the encoding, window, chunk and temperature; leave out {', '.join(given)} "
                f"(or build another LayerPositions)")
        encoding, window, chunk, temperature = layer.encoding, layer.window, layer.chunk, layer.temperature
    if isinstance(encoding, RopeSpec):
        raise TypeError(
            "encoding is a RopeSpec (a description read from a config): build the layers' RotaryEmbedding modules "
            "with posenc.nn.schedule_from_hf(config), or RotaryEmbedding(spec.dim, base=spec.base, "
            "scaling=spec.scaling, layout=spec.layout)")
    if window is None and chunk is None and temperature is None and sinks is None:
        return encoding, _PLAIN
    window, chunk = check_window_and_chunk(window, chunk)
    return encoding, _Structure(window, chunk, check_temperature(temperature), sinks)


def _sink_logits(sinks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Sink logits in ``dtype``, ``+inf`` (and anything past half the dtype's largest value) lowered to that: the
    limit of a sink logit growing without bound, which takes all the weight (its value is zero, so the output is
    0), instead of the NaN of ``inf - inf`` inside the softmax."""
    return sinks.to(dtype).clamp(max=torch.finfo(dtype).max / 2)


def _check_sinks(sinks: object, q: torch.Tensor) -> None:
    """Sink logits must be a floating ``(H,)`` tensor on q's device."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor) or not sinks.dtype.is_floating_point:
        raise TypeError(f"sinks must be a floating torch.Tensor (H,) of sink logits, got "
                        f"{getattr(sinks, 'dtype', type(sinks).__name__)}")
    if sinks.shape != (q.shape[1],):
        raise ValueError(f"sinks must have shape (H,) = ({q.shape[1]},), one logit per query head; "
                         f"got {tuple(sinks.shape)}")
    if sinks.device != q.device:
        raise ValueError(f"sinks are on {sinks.device} but q on {q.device}; move them with .to(q.device)")


def _check_flags(keys_rotated: object, assume_valid: object) -> None:
    if type(keys_rotated) is not bool:
        _validate.check_bool("keys_rotated", keys_rotated)
    if type(assume_valid) is not bool:
        _validate.check_bool("assume_valid", assume_valid)


def _attend(q, k, v, encoding, where: _Where, options: _Options, structure: _Structure = _PLAIN) -> torch.Tensor:
    """The attention body, padded or packed, for checked arguments: the encoding rotates q and k
    (protocol methods: no validation again), then SDPA with one mask, or flex_attention."""
    if encoding is not None and hasattr(encoding, "attention_scores"):
        return _scores_attention(q, k, v, encoding, where, options, structure)
    causal, dropout_p, scale, seq_len, assume_valid, keys_rotated, backend, attn_mask = options
    positions, key_positions = where.positions, where.key_positions
    if encoding is not None:
        q, k_rot = encoding.attention_qk(q, None if keys_rotated else k, positions=where.enc_positions[0],
                                         key_positions=where.enc_positions[1], seq_len=seq_len,
                                         offsets=where.offsets, **{_promise_keyword(encoding): assume_valid})
        if not keys_rotated:
            if k_rot is None:
                raise TypeError(
                    f"{type(encoding).__name__}.attention_qk returned None for the keys it was given; "
                    f"it must return (q, k), rotated or unchanged"
                )
            k = k_rot
    if backend == "flex":
        if attn_mask is not None or dropout_p:
            raise ValueError("backend='flex' takes no attn_mask or dropout_p; use causal/segment_ids, or backend='sdpa'")
        if structure.temperature is not None:
            visible = structure.temperature.uses_visible
            allowed = _allowed(where, causal, None, structure) if visible else None
            mod = None if encoding is None or not visible else encoding.attention_score_mod(
                positions.expand(q.shape[0], -1), key_positions.expand(q.shape[0], -1), num_heads=q.shape[1])
            q = _temper(q, structure, positions, allowed, mod, k.shape[2])
        return _flex_attention(q, k, v, encoding, where, causal, scale, structure)
    bias = None if encoding is None else encoding.attention_bias(positions, key_positions, num_heads=q.shape[1],
                                                                  dtype=q.dtype)
    allowed = _allowed(where, causal, attn_mask, structure)
    q = _temper(q, structure, positions, allowed, bias, k.shape[2])
    return _sdpa(q, k, v, _combine_mask(q, allowed, bias, attn_mask), dropout_p, scale, structure.sinks)


def _temper(q: torch.Tensor, structure: _Structure, positions: torch.Tensor, allowed: torch.Tensor | None,
            bias: object, key_len: int) -> torch.Tensor:
    """``q`` times the layer's temperature factors ``(B|1, H|1, S, 1)`` (unchanged without one).

    ``allowed``: the "may attend" mask, whose row sums are the keys each query sees (SSMax);
    ``bias``: the encoding's bias or score modification, which SSMax cannot scale with the queries.
    """
    temperature = structure.temperature
    if temperature is None:
        return q
    visible = None
    if temperature.uses_visible:
        if bias is not None:
            raise ValueError(
                f"temperature={temperature!r} scales the whole logit, which posenc applies to the queries: the "
                f"encoding's bias would stay unscaled; use SSMax on a RoPE or NoPE layer")
        if allowed is None:                                                   # nothing masked: every key
            visible = torch.full((1, 1, q.shape[2]), key_len, device=q.device)
        else:
            visible = allowed.sum(-1)                                         # (B|1, H|1, S)
    pos = positions if positions.dim() == 2 else positions[None]              # (B|1, S)
    factors = temperature_factors(temperature, pos[:, None], visible, q.dtype)
    return q * factors.unsqueeze(-1)                                          # (B|1, H|1, S, 1)


def _scores_attention(q, k, v, encoding, where: _Where, options: _Options,
                      structure: _Structure = _PLAIN) -> torch.Tensor:
    """Attention for an encoding that computes the logits itself (``attention_scores``): the masks
    (with the layer's window or chunk) as one additive float mask, the encoding's logits, then
    softmax (float32 or wider, with the sink logits if any) and ``@ v``."""
    causal, dropout_p, scale, seq_len, assume_valid, keys_rotated, backend, attn_mask = options
    if backend == "flex":
        raise ValueError(
            f"backend='flex' cannot express {type(encoding).__name__}, whose scores depend on q and k beyond a "
            f"score modification; use backend='sdpa'"
        )
    if structure.temperature is not None:
        raise ValueError(
            f"temperature={structure.temperature!r} cannot be combined with {type(encoding).__name__}, which computes "
            f"its logits from q and k itself (a query temperature would change its positions too); use it on a "
            f"RoPE, bias or NoPE layer")
    if q.shape[1] != k.shape[1]:                                                 # grouped-query attention
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)         # (B, H, S_k, D)
    work = torch.promote_types(q.dtype, torch.float32)
    allowed = _allowed(where, causal, attn_mask, structure)
    mask = _combine_mask(q, allowed, None, attn_mask)
    if mask is not None:
        mask = (torch.zeros((), dtype=work, device=q.device).masked_fill(~mask, float("-inf"))
                if mask.dtype == torch.bool else mask.to(work))                  # (B|1, H|1, S|1, S_k)
    scores = encoding.attention_scores(q, k, positions=where.positions, key_positions=where.key_positions,
                                       mask=mask, scale=scale, causal=causal, keys_rotated=keys_rotated,
                                       seq_len=seq_len, offsets=where.offsets,
                                       assume_valid=assume_valid).to(work)                    # (B, H, S, S_k)
    if mask is not None:
        scores = scores + mask
    if structure.sinks is not None:                                              # one more logit per head, no value
        sink = _sink_logits(structure.sinks, work)[None, :, None, None].expand(*scores.shape[:3], 1)
        probs = torch.softmax(torch.cat([scores, sink], -1), dim=-1)[..., :-1]  # (B, H, S, S_k)
    else:
        probs = torch.softmax(scores, dim=-1)
    if mask is not None:                                                         # a row with no key attends to none
        probs = probs.masked_fill((scores == float("-inf")).all(-1, keepdim=True), 0.0)
    if dropout_p:
        probs = F.dropout(probs, p=dropout_p)
    return (probs @ v.to(work)).to(v.dtype)                                      # (B, H, S, D)


#: The keyword an encoding's ``attention_qk`` takes the in-range promise under, per type.
_PROMISE_KEYWORD: dict[type, str] = {}


def _keyword_of(encoding: object) -> str:
    params = inspect.signature(cast(AttentionEncoding, encoding).attention_qk).parameters
    return "assume_in_table" if "assume_in_table" in params and "assume_valid" not in params else "assume_valid"


def _promise_keyword(encoding: object) -> str:
    """``"assume_valid"``, or ``"assume_in_table"`` for an encoding written against the protocol's old
    keyword (a ``DeprecationWarning``, once per type)."""
    kind = type(encoding)
    if torch.compiler.is_compiling():              # read from the signature: a cache filled while tracing would
        return _keyword_of(encoding)               # be a guard that fails on the next call (a second graph)
    keyword = _PROMISE_KEYWORD.get(kind)
    if keyword is None:
        keyword = _keyword_of(encoding)
        if keyword == "assume_in_table":
            deprecation_warning(
                f"{kind.__name__}.attention_qk takes assume_in_table=, the old name of the protocol's keyword; "
                f"rename it to assume_valid= (the old name works for now and will be removed in the next release)")
        _PROMISE_KEYWORD[kind] = keyword
    return keyword


def _sdpa(q, k, v, mask, dropout_p: float, scale: float | None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA with grouped-query attention (``enable_gqa`` where torch has it); ``sinks`` become one
    more key of zeros (value zeros) whose logit is the head's sink, through the float mask."""
    if sinks is not None:
        k, v = _append_sink_key(k, v)
        if mask is None:
            mask = torch.zeros((1, 1, 1, k.shape[2] - 1), dtype=q.dtype, device=q.device)
        elif mask.dtype == torch.bool:
            mask = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
        last = F.pad(torch.zeros(k.shape[2] - 1, dtype=torch.bool, device=q.device), (0, 1), value=True)  # (S_k + 1,)
        # the mask with one more column, the sink logit: (B|1, H, S|1, S_k + 1)
        mask = torch.where(last, _sink_logits(sinks, q.dtype)[None, :, None, None], F.pad(mask.to(q.dtype), (0, 1)))
    if q.shape[1] != k.shape[1]:
        if _SDPA_HAS_GQA:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                                                  enable_gqa=True)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


def _varlen_attention(q, k, v, cu: tuple, extra: tuple, encoding, given: _Options, structure: _Structure):
    """:func:`attention` on packed ``(T, H, D)`` sequences: per-sequence positions and a
    same-sequence mask from ``cu = (cu_seqlens, cu_seqlens_k)``, then the one attention body on a
    batch of one.  ``extra`` holds the arguments that must be None with packed sequences."""
    cu_q, cu_k = _check_varlen(q, k, v, cu, extra + (given.attn_mask,), encoding, given.assume_valid)
    q4, k4, v4 = (t.transpose(0, 1)[None] for t in (q, k, v))          # (1, H, T, D)
    if given.seq_len is None and getattr(encoding, "length_dependent", False):
        # each sequence alone has its own length, hence its own frequencies: one call per sequence
        call = {"encoding": encoding, "causal": given.causal, "dropout_p": given.dropout_p, "scale": given.scale,
                "assume_valid": given.assume_valid, "keys_rotated": given.keys_rotated, "backend": given.backend,
                "window": structure.window, "chunk": structure.chunk, "temperature": structure.temperature,
                "sinks": structure.sinks}
        outs = [attention(q4[:, :, a:b], k4[:, :, ak:bk], v4[:, :, ak:bk], **call)[0]             # (H, len, D)
                for (a, b), (ak, bk) in zip(_pairs(cu_q), _pairs(cu_k), strict=True) if a < b]
        out = torch.cat(outs, 1) if outs else q4[0, :, :0]
        return out.transpose(0, 1).contiguous()                        # (T, H, D)
    _check_qkv(q4, k4, v4)
    _check_sinks(structure.sinks, q4)
    options = _check_options(given, q4, k4)
    seq_q = sequence_ids(cu_q, q.shape[0])                              # (T,)
    seq_k = seq_q if cu_k is cu_q else sequence_ids(cu_k, k.shape[0])   # (T_k,)
    pos_k = varlen_positions(cu_k, k.shape[0], 0, seq_k)
    pos_q = varlen_positions(cu_q, q.shape[0], 0, seq_q)
    if cu_k is not cu_q:                                                # queries are the last len_q of len_k positions
        shift = (cu_k[1:] - cu_k[:-1]).long() - (cu_q[1:] - cu_q[:-1]).long()   # (N,)
        pos_q = pos_q + shift[seq_q]
    positions, key_positions = pos_q[None], pos_k[None]                 # (1, T), (1, T_k)
    where = _Where(positions, key_positions, (positions, key_positions), (None, None), seq_q[None], seq_k[None])
    out = _attend(q4, k4, v4, encoding, where, options, structure)
    return out[0].transpose(0, 1).contiguous()                         # (T, H, D)


def _check_varlen(q, k, v, cu: tuple, extra: tuple, encoding, assume_valid) -> tuple[torch.Tensor, torch.Tensor]:
    """Check a packed call; returns ``(cu_q, cu_k)`` (the same tensor when the keys share the lengths)."""
    cu_seqlens, cu_seqlens_k = cu
    if any(t is not None for t in extra):
        raise ValueError(
            "with cu_seqlens, positions, key_positions, segment_ids and attn_mask are not accepted: the cumulative "
            "lengths define the positions and the masking"
        )
    if cu_seqlens is None:
        raise ValueError("cu_seqlens_k needs cu_seqlens (the queries' cumulative lengths) as well")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(
                f"with cu_seqlens, {name} must be packed tokens (T, H, D), got {getattr(t, 'shape', type(t).__name__)}"
            )
    _check_encoding(encoding)
    if isinstance(encoding, torch.Tensor) or getattr(encoding, "position_axes", None) is not None:
        raise ValueError(
            "with cu_seqlens, pass a 1-D encoding module (not a precomputed bias tensor, nor an encoding of per-axis "
            "coordinates, which takes a padded batch with positions)"
        )
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must hold the same tokens T_k")
    if cu_seqlens_k is None and k.shape[0] != q.shape[0]:
        raise ValueError(
            f"q holds {q.shape[0]} tokens but k {k.shape[0]}: keys of other lengths than the queries (cached keys) need "
            f"their own cumulative lengths, cu_seqlens_k"
        )
    cu_q = check_cu_seqlens(cu_seqlens, q.device)
    cu_k = cu_q if cu_seqlens_k is None else check_cu_seqlens(cu_seqlens_k, q.device)
    if cu_k.shape != cu_q.shape:
        raise ValueError(
            f"cu_seqlens ({cu_q.shape[0] - 1} sequences) and cu_seqlens_k ({cu_k.shape[0] - 1}) must describe the "
            f"same number of sequences"
        )
    if type(assume_valid) is not bool:
        _validate.check_bool("assume_valid", assume_valid)
    if not assume_valid and not torch.compiler.is_compiling():
        varlen_range(cu_q, q.shape[0], 0)                                # checks the values (one read each)
        if cu_k is not cu_q:
            varlen_range(cu_k, k.shape[0], 0)
    return cu_q, cu_k


def _pairs(cu: torch.Tensor) -> list[tuple[int, int]]:
    bounds = cu.tolist()
    return list(zip(bounds, bounds[1:], strict=False))


def _attn_mask(attn_mask: object, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """The user's mask, checked: bool or integer (nonzero = attend, as transformers' 0/1 masks) or
    float (added to the logits), broadcasting to ``(B, H, S, S_k)``."""
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, torch.Tensor) or attn_mask.dtype.is_complex:
        raise TypeError(
            f"attn_mask must be a bool, integer or floating tensor, got {getattr(attn_mask, 'dtype', type(attn_mask))}"
        )
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    try:
        fits = attn_mask.dim() <= 4 and torch.broadcast_shapes(attn_mask.shape, full) == full
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to (B, H, S, S_k) = {full}; "
            f"pass e.g. (S, S_k) or (B, 1, S, S_k)"
        )
    if attn_mask.device != q.device:
        raise ValueError(f"attn_mask is on {attn_mask.device} but q on {q.device}; move it with .to(q.device)")
    if attn_mask.dtype.is_floating_point:
        return attn_mask
    return attn_mask if attn_mask.dtype == torch.bool else attn_mask != 0


def _allowed(where: _Where, causal: bool, attn_mask: torch.Tensor | None,
             structure: _Structure = _PLAIN) -> torch.Tensor | None:
    """The boolean "may attend" mask ``(B|1, H|1, S, S_k)``: causality, the layer's window or chunk,
    segments and a boolean ``attn_mask``; None when nothing is masked."""
    allowed = structure_mask(where.positions, where.key_positions, causal, structure.window, structure.chunk)
    segment_ids = where.segment_ids
    if segment_ids is not None:
        key_segments = segment_ids if where.key_segment_ids is None else where.key_segment_ids
        same = segment_ids.unsqueeze(-1) == key_segments.unsqueeze(-2)          # (B, S, S_k)
        allowed = same if allowed is None else allowed & same
    if allowed is not None:
        allowed = allowed.unsqueeze(-3)                                         # (..., 1, S, S_k)
    if attn_mask is not None and not attn_mask.dtype.is_floating_point:
        allowed = attn_mask if allowed is None else allowed & attn_mask
    if allowed is not None and allowed.dim() < 4:                               # e.g. a (S_k,) key mask
        allowed = allowed.reshape((1,) * (4 - allowed.dim()) + tuple(allowed.shape))   # (1, H|1, S|1, S_k)
    return allowed


def _combine_mask(q, allowed, bias, attn_mask):
    """SDPA's mask: ``allowed`` alone, or one additive float mask if a bias or a float mask is given."""
    user_float = attn_mask if attn_mask is not None and attn_mask.dtype.is_floating_point else None
    if bias is None and user_float is None:
        return allowed
    mask = torch.zeros((), dtype=q.dtype, device=q.device)
    for extra in (bias, user_float):
        if extra is not None:
            mask = mask + extra.to(q.dtype)
    if allowed is not None:
        mask = mask.masked_fill(~allowed, float("-inf"))
    if mask.dim() < 4:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))        # (1, H|1, S|1, S_k)
    return mask


_FLEX_BLOCK = 128


def _padded_length(n: int) -> int:
    """``n`` rounded up to a shape class: 128 times a power of two.  Compiled flex_attention
    compiles once per class (a decode of 100k tokens sees 11), and the block mask skips the padded
    key blocks, so the padding costs little."""
    blocks = -(-n // _FLEX_BLOCK)
    return _FLEX_BLOCK * (1 << (blocks - 1).bit_length())


def _pad_to_block(t: torch.Tensor, dim: int, value=0) -> torch.Tensor:
    extra = _padded_length(t.shape[dim]) - t.shape[dim]
    if not extra:
        return t.contiguous()                   # as padded tensors are: strides are part of the compiled shape
    pad = [0, 0] * (t.dim() - 1 - dim % t.dim()) + [0, extra]
    return F.pad(t, pad, value=value)


def _append_sink_key(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` and ``v`` with one more key of zeros at the end, where a sink logit goes."""
    zeros = k.new_zeros(k.shape[:2] + (1, k.shape[-1]))                          # (B, H_kv, 1, D)
    return torch.cat([k, zeros], 2), torch.cat([v, zeros.expand(-1, -1, -1, v.shape[-1])], 2)


def _with_sink(mask_mod, score_mod, is_sink: torch.Tensor, sinks: torch.Tensor):
    """flex's ``(mask_mod, score_mod)`` with the sink key always visible and scored ``sinks[h]``."""
    def sink_mask(b, h, qi, ki):
        return mask_mod(b, h, qi, ki) | is_sink[ki]

    def sink_score(score, b, h, qi, ki):
        if score_mod is not None:
            score = score_mod(score, b, h, qi, ki)
        return torch.where(is_sink[ki], sinks[h], score)
    return sink_mask, sink_score


def _flex_attention(q, k, v, encoding, where: _Where, causal: bool, scale: float | None,
                    structure: _Structure = _PLAIN) -> torch.Tensor:
    """flex_attention path: biases as score_mod, masks as a block mask; nothing of size (S, S_k).

    Lengths are padded to multiples of flex's 128-wide blocks (torch 2.13's CPU kernel gave wrong
    results, and NaN, for some unaligned lengths such as S = 40 with D = 16, never for aligned
    ones in our tests), in shape classes of 128 times a power of two, so that decoding step by
    step compiles once per class, not once per step.  Padded keys are masked out; padded queries
    see key 0 and are dropped.  Sink logits are one more key of zeros, right after the real ones,
    whose score is the head's sink (flex on CPU cannot return the log-sum-exp that would
    otherwise rescale the output).
    """
    from torch.nn.attention.flex_attention import create_block_mask

    B, H, S, _ = q.shape
    S_k = k.shape[2]
    sinks, positions, segment_ids = structure.sinks, where.positions, where.segment_ids
    kpos_real = where.key_positions.expand(B, S_k)
    kseg_real = segment_ids if where.key_segment_ids is None else where.key_segment_ids
    if sinks is not None:                                                        # the sink key at index S_k
        k, v = _append_sink_key(k, v)
        kpos_real = F.pad(kpos_real, (0, 1))
        kseg_real = None if kseg_real is None else F.pad(kseg_real, (0, 1))
    qpos = _pad_to_block(positions.expand(B, S).contiguous(), -1)                # (B, Sp)
    kpos = _pad_to_block(kpos_real.contiguous(), -1)                             # (B, Skp)
    q, k, v = _pad_to_block(q, 2), _pad_to_block(k, 2), _pad_to_block(v, 2)
    seg = None if segment_ids is None else _pad_to_block(segment_ids, -1)
    kseg = None if kseg_real is None else _pad_to_block(kseg_real, -1)
    Sp, Skp = q.shape[2], k.shape[2]
    score_mod = None if encoding is None else encoding.attention_score_mod(qpos, kpos, num_heads=H)
    # The masks read tensors, never the lengths as Python ints: compiled flex_attention guards on
    # the ints a mask captures, and a decode step's key length changes at every step.
    real_key = _pad_to_block(torch.ones(S_k, dtype=torch.bool, device=q.device), 0, value=False)   # (Skp,)
    padded_query = _pad_to_block(torch.zeros(S, dtype=torch.bool, device=q.device), 0, value=True)  # (Sp,)

    # the window and chunk as data too: one compiled kernel serves every value (a captured int is a guard)
    window = None if structure.window is None else torch.tensor(structure.window, device=q.device)
    chunk = None if structure.chunk is None else torch.tensor(structure.chunk, device=q.device)

    def mask_mod(b, h, qi, ki):
        ok = real_key[ki]
        if causal or window is not None or chunk is not None:
            ok = ok & score_allowed(causal, window, chunk, qpos[b, qi], kpos[b, ki])
        if seg is not None:
            ok = ok & (seg[b, qi] == kseg[b, ki])
        return ok | (padded_query[qi] & (ki == 0))                               # padded queries: key 0
    if sinks is not None:
        is_sink = _pad_to_block(F.pad(torch.zeros(S_k, dtype=torch.bool, device=q.device), (0, 1), value=True), 0,
                                value=False)                                     # (Skp,)
        mask_mod, score_mod = _with_sink(mask_mod, score_mod, is_sink, _sink_logits(sinks, q.dtype))
    block_mask = None
    if causal or seg is not None or Skp != S_k or Sp != S or window is not None or chunk is not None:
        block_mask = create_block_mask(mask_mod, B, None, Sp, Skp, device=q.device)
    kwargs = {"enable_gqa": True} if H != k.shape[1] else {}
    out = _flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, **kwargs)
    return out[:, :, :S]
