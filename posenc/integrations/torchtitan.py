"""posenc's rotary embedding inside torchtitan models (Llama 3, Qwen 3, DeepSeek-V3 and any model built from
torchtitan's ``ComplexRoPE`` / ``CosSinRoPE`` configurations).

torchtitan describes a model as a tree of configurations and builds it (usually on the meta device) from
them.  :func:`use_posenc_rope` swaps every rotary configuration of such a tree for a
:class:`PosencRoPE` configuration with the same fields, so the model builds with posenc's rotary embedding:
exact tables, posenc's engines (the fused Triton kernel on CUDA), the positions torchtitan passes (its
context-parallel shards, packed documents), and query/key DTensors under tensor parallelism.
:func:`patch_model` does the same for a model already built.  Both are also torchtitan overrides
(``--override.imports posenc.integrations.torchtitan.posenc_complex_rope`` and ``posenc_cos_sin_rope``).

Every :class:`PosencRoPE` is checked at construction against the torchtitan module it replaces (built from
the same configuration, or the live module for :func:`patch_model`): both rotate the same random queries and
keys at positions near 0, around the original context of a scaling rule and up to ``max_seq_len``, and any
difference past float32 rounding (``8 + 16 * |angle|`` ulps, as torchtitan computes angles in float32)
raises ``ValueError`` naming the position and feature.  A configuration posenc cannot read (another
``scaling``, another RoPE class) raises before anything is built.

torchtitan is imported by this module only: ``import posenc`` never needs it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn

from posenc import _validate
from posenc.core.rope import Llama3Scaling, RopeScaling, YarnScaling
from posenc.integrations.transformers._common import _ULP
from posenc.nn.rotary import RotaryEmbedding

try:
    from torch.distributed.tensor import DTensor, Shard
    from torchtitan.config import derive, override
    from torchtitan.models.common.rope import ComplexRoPE, CosSinRoPE, RoPE
    from torchtitan.protocols.module import Module
except ImportError as err:                                        # pragma: no cover - the optional dependency
    raise ImportError(
        "posenc.integrations.torchtitan needs torchtitan (pip install torchtitan); posenc itself does not"
    ) from err

__all__ = ["PosencRoPE", "patch_model", "posenc_complex_rope", "posenc_cos_sin_rope", "rope_from_config",
           "use_posenc_rope"]

#: torchtitan's rotary classes and the pair layout each rotates with: ``ComplexRoPE`` multiplies adjacent
#: features as complex numbers (pairs ``2i, 2i + 1``), ``CosSinRoPE`` rotates halves (pairs ``i, i + dim/2``).
_LAYOUTS: dict[type, str] = {ComplexRoPE.Config: "interleaved", CosSinRoPE.Config: "half"}
_VERIFIED: set[tuple] = set()                                     # configurations already checked


def _scaling(config: Any) -> RopeScaling | None:
    """posenc's rule for a torchtitan RoPE configuration's ``scaling`` field."""
    kind = config.scaling
    if kind == "none":
        return None
    if kind == "llama":
        return Llama3Scaling(config.scaling_factor, config.original_max_position_embeddings,
                             low_freq_factor=config.low_freq_factor, high_freq_factor=config.high_freq_factor)
    if kind == "yarn":
        if not config.rope_factor > 1.0:                          # torchtitan: no interpolation at all
            return None
        # a pure rotation: torchtitan folds YaRN's attention temperature into the softmax scale instead
        return YarnScaling(config.rope_factor, config.original_seq_len, beta_fast=config.beta_fast,
                           beta_slow=config.beta_slow, attention_factor_override=1.0, truncate=config.truncate)
    raise ValueError(f"torchtitan RoPE scaling={kind!r} is not one posenc reads ('none', 'llama' or 'yarn'); "
                     f"keep torchtitan's module for it")


def _layout(config: Any) -> str:
    if isinstance(config, PosencRoPE.Config):
        return _validate.check_choice("layout", config.layout, ("interleaved", "half"))
    layout = _LAYOUTS.get(type(config))
    if layout is None:
        raise ValueError(
            f"{type(config).__qualname__} is not a torchtitan rotary configuration posenc replaces (ComplexRoPE or "
            f"CosSinRoPE; a subclass such as a multimodal RoPE has its own rules): keep torchtitan's module for "
            f"it, or select the ones to replace with fqns="
        )
    if layout == "half" and config.scaling == "llama":
        raise ValueError("torchtitan's CosSinRoPE refuses scaling='llama' (it raises NotImplementedError), so "
                         "there is no module to reproduce; use ComplexRoPE.Config for Llama 3 scaling")
    return layout


def rope_from_config(config: Any, *, engine: str = "auto", device: torch.device | str | None = None,
                     ) -> RotaryEmbedding:
    """posenc's :class:`~posenc.RotaryEmbedding` for a torchtitan ``ComplexRoPE.Config`` or
    ``CosSinRoPE.Config`` (or a :class:`PosencRoPE.Config`): the rotary dim, ``theta``, ``max_seq_len``,
    the pair layout of the class, and its ``scaling`` (``"llama"``: :class:`~posenc.Llama3Scaling`;
    ``"yarn"``: :class:`~posenc.YarnScaling` as a pure rotation, since torchtitan applies YaRN's attention
    factor in the softmax scale).  Not checked: :class:`PosencRoPE` checks what it builds."""
    layout = _layout(config)
    return RotaryEmbedding(config.dim, max_seq_len=config.max_seq_len, base=config.theta, layout=layout,
                           scaling=_scaling(config), engine=engine, device=device)


class PosencRoPE(Module):
    """A torchtitan rotary module computed by posenc: ``forward(query, key, positions=None)`` with
    ``query`` ``(B, L, H, D)``, ``key`` ``(B, L, H_kv, D)`` and ``positions`` ``(1 or B, L)``, as torchtitan's
    ``RoPE`` takes them, returning the rotated pair.

    Its configuration has every field of torchtitan's ``RoPE.Config`` (``dim``, ``max_seq_len``, ``theta``,
    ``scaling`` and the rules' parameters) plus ``layout`` (``"interleaved"`` for what ``ComplexRoPE``
    computes, ``"half"`` for ``CosSinRoPE``), ``engine`` (posenc's ``"auto"``, ``"torch"`` or ``"triton"``)
    and ``verify`` (the check against torchtitan's module at construction; on by default).

    Positions are the ones torchtitan passes (the rank's shard under context parallelism, per-document
    positions for packed batches), promised to lie in ``[0, max_seq_len)`` as torchtitan's own bounds check
    does, so no call reads anything back from the device; a position past the table still never reads
    outside it (it raises, or gives NaN rows in the Triton kernel).  DTensor queries and keys (tensor parallelism)
    rotate shard by shard: the rotation acts on each head's features, so heads, batch and sequence may be
    sharded; a shard of the head features themselves is refused.  The tables are non-persistent buffers
    rebuilt by torchtitan's ``init_states`` after a meta-device build, as its own RoPE caches are.
    """

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(RoPE.Config):
        layout: str = "interleaved"
        engine: str = "auto"
        verify: bool = True

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.rope = rope_from_config(config, engine=config.engine)
        if _validate.check_bool("verify", config.verify):
            reference = _twin_config(config)
            _verify(self, reference, None)

    def forward(self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(positions, DTensor):
            positions = positions.to_local()
        if isinstance(query, DTensor) or isinstance(key, DTensor):
            return _rotate_dtensors(self.rope, query, key, positions)
        return self.rope(query, key, positions=positions, seq_dim=1, assume_valid=positions is not None)

    def _init_self_buffers(self, *, buffer_device: torch.device | None = None) -> None:
        if buffer_device is not None:
            self.rope.to(buffer_device)
        self.rope.reset_buffers()

    def extra_repr(self) -> str:
        return f"layout={self.rope.layout!r}, engine={self.rope.engine!r}"


def _twin_config(config: Any) -> Any:
    """The torchtitan configuration a :class:`PosencRoPE.Config` stands for."""
    target = ComplexRoPE.Config if config.layout == "interleaved" else CosSinRoPE.Config
    return derive(config, target)


def _rotate_dtensors(rope: RotaryEmbedding, query: Any, key: Any, positions: torch.Tensor | None,
                     ) -> tuple[Any, Any]:
    """Rotate the local shards of DTensor queries and keys (at local ``positions``) and wrap them back with the
    same placements."""
    for name, t in (("query", query), ("key", key)):
        if not isinstance(t, DTensor):
            raise TypeError(f"PosencRoPE: {name} is a plain tensor while the other is a DTensor; pass both as "
                            f"DTensors (or both as local tensors)")
        for p in t.placements:
            if isinstance(p, Shard) and p.dim % t.ndim == t.ndim - 1:
                raise ValueError(f"PosencRoPE: {name} is sharded over its head features ({t.placements}); a rotation "
                                 f"mixes features of one head, so shard heads, batch or sequence instead")
    q, k = rope(query.to_local(), key.to_local(), positions=positions, seq_dim=1, assume_valid=positions is not None)
    wrap = [DTensor.from_local(out, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())
            for out, t in ((q, query), (k, key))]
    return wrap[0], wrap[1]


# ---- the check against torchtitan's module -------------------------------------------------------------


def _probe_positions(config: Any) -> torch.Tensor:
    """Positions near 0, around the scaling rule's original context and up to ``max_seq_len - 1``."""
    top = config.max_seq_len
    original = {"llama": config.original_max_position_embeddings, "yarn": config.original_seq_len}.get(config.scaling)
    starts = [0, max(top - 16, 0)] + ([max(original - 8, 0)] if original else [])
    picked = sorted({p for s in starts for p in range(s, s + 16) if p < top})
    return torch.tensor(picked)[None]


def _verify(module: PosencRoPE, reference_config: Any, live: nn.Module | None) -> None:
    """Raise when posenc's rotation differs from torchtitan's for the same configuration (``live``: an
    existing torchtitan module to compare with instead of one built from ``reference_config``)."""
    key = (type(reference_config).__qualname__, repr(reference_config), module.rope.engine)
    if live is None and key in _VERIFIED:
        return
    config = module.config
    with torch.device("cpu"):
        reference = reference_config.build() if live is None else live
        twin = rope_from_config(config, engine="torch", device="cpu")
        positions = _probe_positions(config)
        g = torch.Generator().manual_seed(0)
        n = positions.shape[1]
        q = torch.rand(1, n, 2, config.dim, generator=g) * 2 - 1
        k = torch.rand(1, n, 1, config.dim, generator=g) * 2 - 1
        ref_device = next((b.device for b in reference.buffers()), torch.device("cpu"))
        with torch.no_grad():
            want = reference(q.to(ref_device), k.to(ref_device), positions.to(ref_device))
            got = twin(q, k, positions=positions, seq_dim=1)
        freqs = torch.tensor([float(f) for f in twin._freqs], dtype=torch.float64)
        angle = positions[0, :, None].double() * freqs                                         # (n, dim/2)
        angle = torch.cat([angle, angle], -1) if twin.layout == "half" else angle.repeat_interleave(2, -1)
        allowed = (8.0 + 16.0 * angle.abs()) * _ULP * math.sqrt(2.0)            # |(x, y)| <= sqrt(2) per pair
        _compare(got, want, allowed, positions, reference, reference_config)
    if live is None:
        _VERIFIED.add(key)


def _describe(config: Any) -> str:
    """A rotary configuration's fields that matter for its scaling rule."""
    names = ["dim", "max_seq_len", "theta", "scaling"]
    names += {"llama": ["scaling_factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"],
              "yarn": ["rope_factor", "beta_fast", "beta_slow", "original_seq_len", "truncate"]}.get(config.scaling, [])
    return f"{type(config).__qualname__}(" + ", ".join(f"{n}={getattr(config, n)!r}" for n in names) + ")"


def _compare(got: Any, want: Any, allowed: torch.Tensor, positions: torch.Tensor, reference: nn.Module,
             reference_config: Any) -> None:
    for name, g_, w in (("query", got[0], want[0]), ("key", got[1], want[1])):
        w = w.detach().cpu().double()
        diff = (g_.double() - w).abs() / allowed[None, :, None, :]
        worst = float(diff.max())
        if not worst <= 1.0:
            at = torch.nonzero(diff == diff.max())[0].tolist()
            pos, feature = int(positions[0, at[1]]), at[3]
            raise ValueError(
                f"PosencRoPE does not reproduce torchtitan's {type(reference).__name__} for "
                f"{_describe(reference_config)}: the "
                f"rotated {name} differs at position {pos}, feature {feature}, by {worst:.3g} times float32 "
                f"rounding ({float(g_[tuple(at)]):.9g} against {float(w[tuple(at)]):.9g}); keep torchtitan's "
                f"module for this configuration (and report it), or pass verify=False to use posenc's anyway"
            )


# ---- swapping configurations and modules ---------------------------------------------------------------


def _replacement(config: Any, engine: str) -> PosencRoPE.Config:
    return derive(config, PosencRoPE.Config, layout=_layout(config), engine=engine)


def use_posenc_rope(model_config: Any, *, engine: str = "auto", fqns: list[str] | None = None) -> list[str]:
    """Replace, in place, every torchtitan rotary configuration (``ComplexRoPE.Config``, ``CosSinRoPE.Config``)
    of ``model_config`` with a :class:`PosencRoPE` configuration of the same fields (each module is checked
    against the one torchtitan would have built when the model is built); returns the replaced modules'
    names (``"layers.0.attention.rope"``, ...).

    Call it before ``model_config.build()`` (or let torchtitan call the overrides
    :func:`posenc_complex_rope` and :func:`posenc_cos_sin_rope`).  ``fqns`` restricts the swap to those
    names (``fnmatch`` patterns); any other RoPE configuration class (a multimodal one, say) among the
    selected ones raises ``ValueError`` rather than being left behind unnoticed.
    """
    import fnmatch

    _validate.check_choice("engine", engine, ("auto", "torch", "triton"))
    if not hasattr(model_config, "traverse"):
        raise TypeError(f"model_config must be a torchtitan model configuration (with .traverse), got "
                        f"{type(model_config).__name__}")
    found = [(fqn, cfg, parent, attr) for fqn, cfg, parent, attr in model_config.traverse(RoPE.Config)
             if fqns is None or any(fnmatch.fnmatchcase(fqn, pattern) for pattern in fqns)]
    swaps = []
    for fqn, cfg, parent, attr in found:                          # every one read before any is replaced
        if isinstance(cfg, PosencRoPE.Config):
            continue
        try:
            swaps.append((fqn, parent, attr, _replacement(cfg, engine)))
        except ValueError as err:
            raise ValueError(f"{fqn}: {err}") from None
    for _, parent, attr, new in swaps:
        if isinstance(parent, list):
            parent[attr] = new
        else:
            setattr(parent, attr, new)
    replaced = [fqn for fqn, *_ in swaps]
    if not replaced and not found:
        raise ValueError("model_config holds no torchtitan RoPE configuration" +
                         (f" matching fqns={fqns}" if fqns is not None else ""))
    return replaced


def patch_model(model: nn.Module, *, engine: str = "auto") -> list[str]:
    """Replace, in place, every ``ComplexRoPE`` / ``CosSinRoPE`` module of a built torchtitan model with a
    :class:`PosencRoPE` from its configuration, checked against that very module (or against one built
    afresh from the configuration while the model is still on the meta device); returns the replaced
    modules' names.  Other rotary classes raise ``ValueError``."""
    _validate.check_choice("engine", engine, ("auto", "torch", "triton"))
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, RoPE)]
    if not targets:
        raise ValueError(f"{type(model).__name__} holds no torchtitan RoPE module to replace")
    configs = []
    for name, old in targets:                                     # every one read before any is replaced
        try:
            configs.append(_replacement(old.config, engine))
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
    built = []
    for (name, old), new_config in zip(targets, configs, strict=True):
        cache = getattr(old, "cache", None)
        materialized = isinstance(cache, torch.Tensor) and not cache.is_meta
        device = cache.device if isinstance(cache, torch.Tensor) else torch.device("cpu")
        with torch.device(device):
            new = PosencRoPE(dataclasses.replace(new_config, verify=not materialized))
        if materialized:
            try:
                _verify(new, old.config, old)
            except ValueError as err:
                raise ValueError(f"{name}: {err} (a module whose cache was never initialised, e.g. built on the "
                                 f"meta device and moved with to_empty without init_states, differs from its "
                                 f"configuration too)") from None
        built.append((name, new))
    for name, new in built:
        parent_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, leaf, new)
    return [name for name, _ in built]


@override(target=ComplexRoPE.Config, exact=True, description="posenc's exact rotary embedding (interleaved pairs)")
def posenc_complex_rope(cfg: Any) -> PosencRoPE.Config:
    """torchtitan override: ``ComplexRoPE`` computed by posenc."""
    return _replacement(cfg, "auto")


@override(target=CosSinRoPE.Config, exact=True, description="posenc's exact rotary embedding (half pairs)")
def posenc_cos_sin_rope(cfg: Any) -> PosencRoPE.Config:
    """torchtitan override: ``CosSinRoPE`` computed by posenc."""
    return _replacement(cfg, "auto")
