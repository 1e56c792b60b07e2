"""Attention biases: ALiBi (BLOOM, MPT); T5's relative position buckets, in ``compute_bias``, in MPNet's
``compute_position_bias`` or in a bucket method of the module's own (LayoutLMv3, CPM-Ant); and clipped
relative positions over a learned table (Phi-4-multimodal's audio encoder)."""

from __future__ import annotations

import functools
import inspect
from typing import Any, cast

import numpy as np
import torch

from posenc._torch.angles import angle_dtype
from posenc.functional import (
    alibi_bias,
    alibi_slopes,
    clipped_relative_position,
    positions_from_mask,
    relative_position_bucket,
)
from posenc.integrations.transformers._common import _ULP
from posenc.integrations.transformers._selfcheck import _host
from posenc.integrations.transformers._state import _Call, _Plan

# ---- ALiBi: BLOOM and MPT -------------------------------------------------------------------------------------

def _bloom_alibi(owner: Any, attention_mask: torch.Tensor, num_heads: int, dtype: torch.dtype) -> torch.Tensor:
    positions = positions_from_mask(attention_mask != 0)                    # (B, S_k): pads get 0
    slopes = alibi_slopes(num_heads, dtype=angle_dtype(attention_mask.device), device=attention_mask.device)
    zero = torch.zeros(positions.shape[0], 1, dtype=torch.long, device=positions.device)
    bias = alibi_bias(zero, positions, slopes, dtype=torch.float32)         # (B, H, 1, S_k): slope * key pos
    return bias.reshape(-1, 1, positions.shape[-1]).to(dtype)


def _bloom_forward(owner: Any, *args: Any, **kwargs: Any) -> Any:
    """BLOOM (transformers 5) builds its ALiBi inline when no attention mask is given; an all-ones
    mask (the same attention) routes it through ``build_alibi_tensor``."""
    forward = type(owner).forward
    bound = inspect.signature(forward).bind_partial(owner, *args, **kwargs)
    given = bound.arguments
    extra = given.get("kwargs") or {}                   # (transformers >= 5.24 names the cache ``cache``)
    caches = (given.get("cache"), given.get("past_key_values"), extra.get("cache"), extra.get("past_key_values"))
    cache = next((c for c in caches if c is not None), None)
    if given.get("attention_mask") is None and (cache is None or hasattr(cache, "get_seq_length")):
        ref: Any = given.get("input_ids") if given.get("input_ids") is not None else given.get("inputs_embeds")
        past = cache.get_seq_length() if cache is not None else 0
        given["attention_mask"] = torch.ones(ref.shape[0], past + ref.shape[1], dtype=torch.long, device=ref.device)
    return forward(*bound.args, **bound.kwargs)


def _close_to(got: torch.Tensor, want: torch.Tensor, ulps: float) -> bool:
    if got.shape != want.shape:
        return False
    g, w = _host(got), _host(want)
    return bool((np.abs(g - w) <= ulps * _ULP * np.abs(w) + 1e-30).all())


def _plan_bloom(module: Any, where: str, model: torch.nn.Module, assume_valid: bool) -> _Plan:
    heads = int(getattr(module, "num_heads", 0) or getattr(getattr(module, "config", None), "n_head", 0) or 0)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    for n in sorted({heads, 4, 6} - {0}):
        want = type(module).build_alibi_tensor(module, mask, n, torch.float32) \
            if "self" in inspect.signature(type(module).build_alibi_tensor).parameters else \
            type(module).build_alibi_tensor(mask, n, torch.float32)
        got = _bloom_alibi(module, mask, n, torch.float32)
        if not _close_to(got, want, 4):
            raise ValueError(f"patch_model: {where}: posenc's ALiBi bias for {n} heads does not reproduce the model's "
                             f"build_alibi_tensor; the model is left unpatched")
    return _Plan(module, "bloom", {"build_alibi_tensor": _Call(module, _bloom_alibi),
                                   "forward": _Call(module, _bloom_forward)}, note="ALiBi")


def _mpt_alibi(owner: Any, num_heads: int, sequence_length: int, alibi_bias_max: int = 8,
               device: Any = None) -> torch.Tensor:
    slopes = alibi_slopes(num_heads, dtype=angle_dtype(device), device=device)
    last = torch.tensor([sequence_length - 1], device=device)
    keys = torch.arange(sequence_length, device=device)
    return alibi_bias(last, keys, slopes, dtype=torch.float32)               # (H, 1, L): slope * (j - L + 1)


def _plan_mpt(module: Any, where: str, model: torch.nn.Module, assume_valid: bool) -> _Plan:
    # transformers calls build_mpt_alibi_tensor with its default alibi_bias_max=8 whatever the config says
    # (attn_config.alibi_bias_max is not passed on), so the check is against what the model computes.
    heads = int(getattr(module, "num_heads", 0) or getattr(getattr(model, "config", None), "n_heads", 0) or 0)
    length = 40
    for n in sorted({heads, 4} - {0}):
        want = type(module).build_mpt_alibi_tensor(module, n, length, device=None)
        got = _mpt_alibi(module, n, length)
        if not _close_to(got, want.to(got.dtype), 4):
            raise ValueError(f"patch_model: {where}: MPT's ALiBi slopes for {n} heads differ from the ALiBi paper's "
                             f"(posenc's); the model is left unpatched")
    return _Plan(module, "mpt", {"build_mpt_alibi_tensor": _Call(module, _mpt_alibi)}, note="ALiBi")


# ---- T5 family -------------------------------------------------------------------------------------------------

def _t5_bias(owner: Any, query_length: int, key_length: int, device: Any = None, past_seen_tokens: int = 0,
             cache_position: torch.Tensor | None = None, *, bidirectional: bool | None = None) -> torch.Tensor:
    device = owner.relative_attention_bias.weight.device if device is None else device
    if cache_position is not None:                                           # transformers 4.x
        queries = cache_position.to(device)
    else:
        queries = torch.arange(query_length, dtype=torch.long, device=device) + past_seen_tokens
    keys = torch.arange(key_length, dtype=torch.long, device=device)
    both = not owner.is_decoder if bidirectional is None else bidirectional
    buckets = relative_position_bucket(keys[None, :] - queries[:, None], bidirectional=both,
                                       num_buckets=owner.relative_attention_num_buckets,
                                       max_distance=owner.relative_attention_max_distance)
    values = owner.relative_attention_bias(buckets)                           # (S, S_k, H), the model's weights
    return values.permute(2, 0, 1).unsqueeze(0)                              # (1, H, S, S_k)


def _t5_reproduces(module: Any, bidirectional: bool) -> str:
    """The first probe (as words) on which posenc's buckets in this direction differ from the model's
    ``compute_bias``, or "" where every probe agrees."""
    distance = int(module.relative_attention_max_distance)
    for q, k, past in ((7, 7, 0), (1, 40, 39), (5, 300, 295), (3, 2 * distance + 3, 0)):
        with torch.no_grad():
            want = type(module).compute_bias(module, q, k, past_seen_tokens=past) if past else \
                type(module).compute_bias(module, q, k)
            got = _t5_bias(module, q, k, past_seen_tokens=past, bidirectional=bidirectional)
        if want.shape != got.shape or not torch.equal(want, got):
            return f"{q} queries after {past} and {k} keys"
    return ""


def _plan_t5(module: Any, where: str, model: torch.nn.Module, assume_valid: bool) -> _Plan:
    """T5's buckets, in the direction the module says (``is_decoder``: one direction); a module that does not
    say (Pix2Struct's text attention, always one direction) gets the direction whose buckets reproduce its
    ``compute_bias``."""
    buckets = int(module.relative_attention_num_buckets)
    distance = int(module.relative_attention_max_distance)
    said = getattr(module, "is_decoder", None)
    directions = [not said] if isinstance(said, bool) else [False, True]
    exact = {d: (buckets // 2 if d else buckets) // 2 for d in directions}
    if all(distance <= exact[d] for d in directions):
        bidirectional = directions[0]
        raise ValueError(
            f"patch_model: {where}: relative_attention_max_distance={distance} must exceed the exact range "
            f"{exact[bidirectional]} (half the {'per-direction ' if bidirectional else ''}buckets of "
            f"relative_attention_num_buckets={buckets}): the logarithmic buckets divide by log(max_distance / "
            f"exact range), which is 0 here; set relative_attention_max_distance > {exact[bidirectional]}; the "
            f"model is left unpatched")
    differs = ""
    for bidirectional in (d for d in directions if distance > exact[d]):
        differs = _t5_reproduces(module, bidirectional)
        if not differs:
            call = _t5_bias if isinstance(said, bool) else functools.partial(_t5_bias, bidirectional=bidirectional)
            return _Plan(module, "t5", {"compute_bias": _Call(module, call)}, note="T5 relative bias")
    raise ValueError(f"patch_model: {where}: posenc's relative position buckets do not reproduce the model's "
                     f"compute_bias for {differs}; the model is left unpatched")


def _mpnet_bias(owner: Any, x: torch.Tensor, position_ids: torch.Tensor | None = None,
                num_buckets: int = 32) -> torch.Tensor:
    """MPNet's ``compute_position_bias``: T5's bidirectional buckets (maximum distance 128) of key minus query
    position over the model's bias weights, ``(B, H, S, S)``."""
    bsz, length = x.size(0), x.size(1)
    if position_ids is not None:
        queries, keys = position_ids[:, :, None], position_ids[:, None, :]
    else:
        queries = torch.arange(length, dtype=torch.long, device=x.device)[:, None]
        keys = torch.arange(length, dtype=torch.long, device=x.device)[None, :]
    buckets = relative_position_bucket(keys - queries, bidirectional=True, num_buckets=num_buckets,
                                       max_distance=128)
    values = owner.relative_attention_bias(buckets).permute([2, 0, 1]).unsqueeze(0)      # (1, H, S, S)
    return values.expand((bsz, -1, length, length)).contiguous()


def _plan_mpnet(module: Any, where: str, model: torch.nn.Module, assume_valid: bool) -> _Plan:
    device = module.relative_attention_bias.weight.device
    for length in (1, 7, 40, 300):
        x = torch.zeros(2, length, 1, device=device)
        with torch.no_grad():
            want = type(module).compute_position_bias(module, x)
            got = _mpnet_bias(module, x)
        if want.shape != got.shape or not torch.equal(want, got):
            raise ValueError(f"patch_model: {where}: posenc's relative position buckets do not reproduce the model's "
                             f"compute_position_bias for {length} tokens; the model is left unpatched")
    return _Plan(module, "mpnet", {"compute_position_bias": _Call(module, _mpnet_bias)},
                 note="relative position bias (T5's buckets)")


# ---- clipped relative positions: a learned table indexed by the clipped distance -----------------------------

def _clipped_bias(owner: Any, x: torch.Tensor, *, low: int, high: int) -> torch.Tensor:
    """The module's ``forward(x)``: ``(1, H, S, S)`` rows of its learned table, indexed by the key-minus-query
    distance clipped to ``[low, high]`` (Shaw et al. 2018), by magnitude where the module is symmetric."""
    positions = torch.arange(x.size(1), device=x.device)
    index = clipped_relative_position(positions[None, :] - positions[:, None], max_distance=high, min_distance=low,
                                      symmetric=owner.symmetric)
    return owner.bias_values(index).permute(2, 0, 1).unsqueeze(0)


def _plan_clipped(module: Any, where: str, model: torch.nn.Module, assume_valid: bool) -> _Plan:
    """The window the module clips to is found, not assumed: the paper's ``[-M, M]`` or the Conformer
    variant's ``[-M, M - 1]``, whichever fits the module's table and reproduces its own ``forward`` exactly
    on sequences that reach past both edges."""
    distance = int(module.max_distance)
    device = module.bias_values.weight.device
    lengths = (1, 7, distance + 3)
    want = {}
    with torch.no_grad():
        for length in lengths:
            try:
                want[length] = type(module).forward(module, torch.zeros(1, length, 1, device=device))
            except (IndexError, RuntimeError) as e:
                raise ValueError(f"patch_model: {where}: the model's own clipped relative bias fails for {length} "
                                 f"positions ({type(e).__name__}: {e}), so there is nothing to reproduce; the model "
                                 f"is left unpatched") from e
        rows = module.bias_values.num_embeddings
        for low, high in ((-distance, distance - 1), (-distance, distance)):
            if (max(high, -low) if module.symmetric else high - low) >= rows:
                continue                                     # indices past the module's table
            if all(torch.equal(_clipped_bias(module, torch.zeros(1, n, 1, device=device), low=low, high=high),
                               want[n]) for n in lengths):
                call = functools.partial(_clipped_bias, low=low, high=high)
                return _Plan(module, "clipped", {"forward": _Call(module, call)},
                             note="clipped relative position bias")
    raise ValueError(f"patch_model: {where}: clipping key-minus-query distances to [-{distance}, {distance} - 1] or "
                     f"[-{distance}, {distance}] does not reproduce the model's relative bias; the model is left "
                     f"unpatched")


# ---- T5's buckets in a module's own method (LayoutLMv3, CPM-Ant) ---------------------------------------------

#: the bucket methods modules keep, with their arguments: LayoutLMv3's takes a direction, CPM-Ant's is always
#: bidirectional
BUCKET_METHODS = {
    "relative_position_bucket": ["self", "relative_position", "bidirectional", "num_buckets", "max_distance"],
    "_position_bucket": ["self", "relative_position", "num_buckets", "max_distance"],
}


def bucket_method(cls: type) -> str | None:
    """The name of the bucket method of :data:`BUCKET_METHODS` that ``cls`` defines with its arguments, or None."""
    return next((name for name, params in BUCKET_METHODS.items() if callable(getattr(cls, name, None))
                 and list(inspect.signature(getattr(cls, name)).parameters) == params), None)


def _bucket_method(owner: Any, relative_position: torch.Tensor, bidirectional: bool = True, num_buckets: int = 32,
                   max_distance: int = 128) -> torch.Tensor:
    """A module's ``relative_position_bucket`` method: T5's buckets, exact for every distance."""
    return relative_position_bucket(relative_position, bidirectional=bidirectional, num_buckets=num_buckets,
                                    max_distance=max_distance)


def _bidirectional_bucket_method(owner: Any, relative_position: torch.Tensor, num_buckets: int = 32,
                                 max_distance: int = 128, *, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A module's ``_position_bucket`` method (CPM-Ant): T5's bidirectional buckets, in the method's dtype."""
    return relative_position_bucket(relative_position, num_buckets=num_buckets, max_distance=max_distance).to(dtype)


def _bucket_pairs(module: Any) -> list[tuple[int, int]]:
    """The (bucket count, maximum distance) pairs a module keeps: ``*_bins`` beside ``max_*`` (LayoutLMv3's 1-D
    and 2-D pairs), or ``num_buckets`` beside ``max_distance`` (CPM-Ant)."""
    def whole(name: str) -> int | None:
        value = getattr(module, name, None)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    pairs = {(whole(b), whole("max_" + b[:-len("_bins")])) for b in vars(module) if b.endswith("_bins")}
    pairs.add((whole("num_buckets"), whole("max_distance")))
    return sorted((b, d) for b, d in pairs if b is not None and d is not None)


def _plan_bucket_method(module: Any, where: str, model: torch.nn.Module, assume_valid: bool) -> _Plan:
    """Every (buckets, maximum distance) pair the module keeps, checked in each direction its method takes on
    every distance up to past the maximum; the replacement returns the method's dtype."""
    name = cast(str, bucket_method(type(module)))                         # (found so by _kind)
    method = getattr(type(module), name)
    two_way = "bidirectional" in BUCKET_METHODS[name]
    pairs = _bucket_pairs(module)
    if not pairs:
        raise ValueError(f"patch_model: {where}: {type(module).__name__} keeps no bucket count with its maximum "
                         f"distance, so posenc cannot check its buckets; the model is left unpatched")
    device = next(iter(module.parameters()), torch.empty(0)).device
    dtypes = set()
    for buckets, distance in pairs:
        rel = torch.arange(-distance - 3, distance + 4, device=device)
        for bidirectional in (True, False) if two_way else (True,):
            with torch.no_grad():
                if two_way:
                    want = method(module, rel, bidirectional=bidirectional, num_buckets=buckets,
                                  max_distance=distance)
                else:
                    want = method(module, rel, num_buckets=buckets, max_distance=distance)
                got = relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=buckets,
                                               max_distance=distance)
            dtypes.add(want.dtype)
            if not torch.equal(want.long(), got):
                first = int(rel[(want.long() != got).nonzero()[0, 0]])
                raise ValueError(f"patch_model: {where}: posenc's relative position buckets differ from the model's "
                                 f"{name} at distance {first} ({buckets} buckets, maximum distance {distance}, "
                                 f"bidirectional={bidirectional}); the model is left unpatched")
    if two_way:
        call: Any = _bucket_method
    else:
        call = functools.partial(_bidirectional_bucket_method, dtype=dtypes.pop() if len(dtypes) == 1 else torch.int64)
    return _Plan(module, "buckets", {name: _Call(module, call)}, note="relative position buckets (T5's)")
