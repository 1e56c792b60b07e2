"""Rotary position embedding frequencies and every context-extension rule (framework-free).

RoPE (Su et al. 2021, "RoFormer", arXiv:2104.09864) rotates feature pair ``i`` of a query or key at
position ``m`` by the angle ``m * theta_i`` with ``theta_i = base^(-2i/d)``, ``i = 0 .. d/2 - 1``.
The rules below change the frequencies (and sometimes scale cos/sin by an "attention factor") so a
model trained on ``L0`` positions can read longer inputs.  Where a reference implementation, not
the paper, fixes a detail (YaRN's mscale and truncation, Llama 3's smoothing, LongRoPE's switch),
posenc follows Hugging Face transformers' ``modeling_rope_utils``, and the tests check parity.

Frequencies are evaluated in 60-digit :mod:`decimal` arithmetic, so the tables built from them are
exact with respect to each rule's formula (see :mod:`posenc.core.exact`); discrete decisions
(YaRN's correction range, Llama 3's wavelength bands) are taken in float64, as the reference does.
"""

from __future__ import annotations

import dataclasses
import decimal
import functools
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from posenc import _validate
from posenc.core import _hf_fields as hf
from posenc.core.exact import DECIMAL_DIGITS, TWO_PI

_D = decimal.Decimal

#: Which features pair up: ``"half"`` pairs ``(i, i + d/2)`` (GPT-NeoX, Hugging Face),
#: ``"interleaved"`` pairs ``(2i, 2i + 1)`` (GPT-J, Meta's Llama code).
ROPE_LAYOUTS = ("half", "interleaved")


def _ctx() -> decimal.Context:
    return decimal.Context(prec=DECIMAL_DIGITS)


def _pow(x: decimal.Decimal, y: decimal.Decimal) -> decimal.Decimal:
    """``x ** y`` for ``x > 0`` and any real ``y``, to 60 digits."""
    with decimal.localcontext(_ctx()):
        return (y * x.ln()).exp()


def check_rotary_args(dim: object, max_seq_len: object, base: object, layout: object) -> tuple[int, int, float, str]:
    """The arguments every rotary table shares, checked: an even rotary ``dim``, ``max_seq_len >= 1``
    rows, a positive finite ``base`` and a pair ``layout`` of :data:`ROPE_LAYOUTS`."""
    dim = _validate.check_int("dim", dim, minimum=2)
    if dim % 2:
        raise ValueError(f"dim (the rotary dim) must be even: features rotate in pairs; got {dim}")
    return (dim, _validate.check_int("max_seq_len", max_seq_len, minimum=1),
            _validate.check_float("base", base, positive=True), _validate.check_choice("layout", layout, ROPE_LAYOUTS))


def default_frequencies(dim: int, base: float) -> tuple[decimal.Decimal, ...]:
    """``theta_i = base^(-2i/dim)`` for ``i = 0 .. dim/2 - 1`` (RoFormer, eq. 15)."""
    return _default_frequencies(dim, float(base))


@functools.lru_cache(maxsize=256)
def _default_frequencies(dim: int, base: float) -> tuple[decimal.Decimal, ...]:
    with decimal.localcontext(_ctx()):
        b, d = _D(base), _D(dim)
        return tuple(_pow(b, -_D(2 * i) / d) for i in range(dim // 2))


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Base of the context-extension rules: frozen, hashable, validated at construction.

    Subclasses implement :meth:`_frequencies` and may override :meth:`attention_factor`.
    ``length_dependent`` rules (dynamic NTK, LongRoPE) also read the current sequence length.
    """

    name: ClassVar[str] = "none"
    length_dependent: ClassVar[bool] = False
    #: The ``rope_type`` values of Hugging Face configs that name this rule.
    hf_types: ClassVar[tuple[str, ...]] = ()
    #: Whether the rule reads ``partial_rotary_factor`` itself, the rotary dim then being the whole head.
    reads_partial_rotary: ClassVar[bool] = False

    @classmethod
    def from_hf(cls, params: Mapping[str, Any], config: Mapping[str, Any]) -> RopeScaling:
        """The rule from a Hugging Face config: its rope parameters ``params`` (``rope_parameters``
        or ``rope_scaling``) and its top level ``config`` (for ``max_position_embeddings``, the
        model type); a missing or bad field raises ``ValueError`` naming it."""
        raise NotImplementedError(f"{cls.__name__} has no Hugging Face configuration")

    def to_hf(self) -> dict[str, Any]:
        """The keys of a Hugging Face config that describe this rule: ``rope_parameters`` and the
        top-level keys the rule reads.  :meth:`from_hf` of them gives the rule back."""
        raise NotImplementedError(f"{type(self).__name__} has no Hugging Face configuration")

    def frequencies(self, dim: int, base: float, seq_len: int | None = None) -> tuple[decimal.Decimal, ...]:
        """Scaled frequencies (radians per position) as 60-digit Decimals, ``dim // 2`` of them."""
        return _cached_frequencies(self, dim, float(base), seq_len if self.length_dependent else None)

    def attention_factor(self) -> float:
        """Factor applied to cos and sin (1.0 unless the rule defines one)."""
        return 1.0

    def attention_factor_at(self, seq_len: int | None) -> float:
        """The factor for a sequence of ``seq_len`` tokens (None: within the original context):
        :meth:`attention_factor`, unless a length-dependent rule switches it past its original context
        (LongRoPE with a ``long_attention_factor``)."""
        return self.attention_factor()

    def frequencies_past(self, dim: int, base: float, length: Any, xp: Any) -> Any:
        """Float64 frequencies ``(dim/2,)`` for a sequence ``length > original_max_seq_len`` given as a
        0-d array of namespace ``xp`` (NumPy or torch), so that a traced graph follows a length known
        only at run time.  None when they do not depend on the length past the original context
        (then ``frequencies(dim, base, original_max_seq_len + 1)`` holds).  Length-dependent rules only.
        """
        raise NotImplementedError(f"{type(self).__name__} does not depend on the sequence length")

    def _frequencies(self, dim: int, base: float, seq_len: int | None) -> tuple[decimal.Decimal, ...]:
        raise NotImplementedError


@functools.lru_cache(maxsize=512)
def _cached_frequencies(rule: RopeScaling, dim: int, base: float, seq_len: int | None):
    with decimal.localcontext(_ctx()):
        return rule._frequencies(dim, base, seq_len)


def _positive(name: str, value: float) -> float:
    return _validate.check_float(name, value, positive=True)


def _factor(value: float) -> float:
    value = _validate.check_float("factor", value, positive=True)
    if value < 1.0:
        raise ValueError(f"factor must be >= 1 (it stretches the context), got {value}")
    return value


def _original(value: int) -> int:
    value = _validate.check_int("original_max_seq_len", value, minimum=1)
    if value > 2**53:
        raise ValueError(f"original_max_seq_len must be <= 2**53 (a float64 holds it exactly), got {value}")
    return value


@dataclasses.dataclass(frozen=True)
class LinearScaling(RopeScaling):
    """Position interpolation (Chen et al. 2023, arXiv:2306.15595): ``theta_i / factor``.

    Position ``m`` under the rule sees the angles of position ``m / factor`` without it.
    """

    factor: float
    name: ClassVar[str] = "linear"
    hf_types: ClassVar[tuple[str, ...]] = ("linear",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "factor", _factor(self.factor))

    @classmethod
    def from_hf(cls, params, config):
        return cls(hf.number(params, "factor", "linear"))

    def to_hf(self):
        return {"rope_parameters": {"rope_type": "linear", "factor": self.factor}}

    def _frequencies(self, dim, base, seq_len):
        f = _D(self.factor)
        return tuple(t / f for t in default_frequencies(dim, base))


@dataclasses.dataclass(frozen=True)
class NTKScaling(RopeScaling):
    """Static NTK-aware scaling (bloc97, 2023): the base becomes ``base * factor^(d/(d-2))``.

    High frequencies barely change, the lowest one is divided by ``factor``.
    """

    factor: float
    name: ClassVar[str] = "ntk"

    def __post_init__(self) -> None:
        object.__setattr__(self, "factor", _factor(self.factor))

    @classmethod
    def from_hf(cls, params, config):
        """Hunyuan's ``{"type": "dynamic", "alpha": a}``: static NTK scaling by ``a`` (transformers has
        no other static NTK rope type)."""
        model_type = config.get("model_type")
        if model_type and not str(model_type).startswith("hunyuan"):
            raise ValueError(
                f"rope scaling 'dynamic' with 'alpha' is Hunyuan's fixed NTK-alpha rule, but model_type="
                f"{model_type!r}, whose transformers code ignores alpha and applies dynamic NTK scaling by 'factor'; "
                f"remove alpha, or set model_type to the Hunyuan type the checkpoint comes from"
            )
        alpha = _validate.check_float("alpha", hf.need(params, "alpha", "dynamic"), positive=True)
        if alpha < 1.0:
            raise ValueError(f"alpha (Hunyuan's NTK base stretch) must be >= 1, got {alpha}")
        return cls(alpha)

    def to_hf(self):
        return {"model_type": hf.NTK_ALPHA_MODEL_TYPE, "rope_parameters": {"rope_type": "dynamic", "alpha": self.factor}}

    def _frequencies(self, dim, base, seq_len):
        if dim <= 2:
            raise ValueError(f"NTKScaling needs dim > 2 (the exponent is d/(d-2)), got dim={dim}")
        d = _D(dim)
        new_base = _D(base) * _pow(_D(self.factor), d / (d - 2))
        return tuple(_pow(new_base, -_D(2 * i) / d) for i in range(dim // 2))


@dataclasses.dataclass(frozen=True)
class DynamicNTKScaling(RopeScaling):
    """Dynamic NTK scaling (emozilla, 2023), as in transformers' ``"dynamic"`` rope type.

    For a sequence of ``L > L0`` positions the base becomes
    ``base * (factor * L / L0 - (factor - 1))^(d/(d-2))``; for ``L <= L0`` nothing changes.  The
    result depends only on the ``seq_len`` passed in (short -> long -> short gives identical
    results) and the base never shrinks, so it is never negative, NaN or complex.
    """

    factor: float
    original_max_seq_len: int
    name: ClassVar[str] = "dynamic"
    length_dependent: ClassVar[bool] = True
    hf_types: ClassVar[tuple[str, ...]] = ("dynamic",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "factor", _factor(self.factor))
        object.__setattr__(self, "original_max_seq_len", _original(self.original_max_seq_len))

    @classmethod
    def from_hf(cls, params, config):
        """``"dynamic"`` by ``factor`` past ``max_position_embeddings``; with Hunyuan's ``alpha``, the
        static rule :meth:`NTKScaling.from_hf` reads."""
        if params.get("alpha"):
            return NTKScaling.from_hf(params, config)
        max_pos = config.get("max_position_embeddings")
        if max_pos is None:
            raise ValueError("rope scaling 'dynamic' needs max_position_embeddings in the config")
        return cls(hf.number(params, "factor", "dynamic"), hf.whole("max_position_embeddings", max_pos))

    def to_hf(self):
        return {"max_position_embeddings": self.original_max_seq_len,
                "rope_parameters": {"rope_type": "dynamic", "factor": self.factor}}

    def _frequencies(self, dim, base, seq_len):
        length = max(seq_len or 0, self.original_max_seq_len)
        if length == self.original_max_seq_len:
            return default_frequencies(dim, base)
        if dim <= 2:
            raise ValueError(f"DynamicNTKScaling needs dim > 2 (the exponent is d/(d-2)), got dim={dim}")
        d, f = _D(dim), _D(self.factor)
        stretch = f * _D(length) / _D(self.original_max_seq_len) - (f - 1)
        new_base = _D(base) * _pow(stretch, d / (d - 2))
        return tuple(_pow(new_base, -_D(2 * i) / d) for i in range(dim // 2))

    def frequencies_past(self, dim, base, length, xp):
        """The same formula in float64 on an array ``length`` (within a few float64 ulps)."""
        if dim <= 2:
            raise ValueError(f"DynamicNTKScaling needs dim > 2 (the exponent is d/(d-2)), got dim={dim}")
        stretch = self.factor * length / self.original_max_seq_len - (self.factor - 1)
        log_base = math.log(base) + dim / (dim - 2) * xp.log(stretch)
        exponents = xp.arange(0, dim, 2, dtype=xp.float64) / dim
        if xp is not np:
            exponents = exponents.to(log_base.device)
        return xp.exp(-exponents * log_base)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 * mscale * ln(scale) + 1`` (1 for ``scale <= 1``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclasses.dataclass(frozen=True)
class YarnScaling(RopeScaling):
    """YaRN (Peng et al. 2023, arXiv:2309.00071): NTK-by-parts interpolation plus a temperature.

    Pair ``i`` completes ``L0 / lambda_i`` rotations over the original context.  Pairs with more
    than ``beta_fast`` rotations keep their frequency, pairs with fewer than ``beta_slow`` are
    interpolated (``theta_i / factor``), and a linear ramp over the pair index blends in between.
    The correction range is rounded outward when ``truncate`` (the default, as in transformers).

    The attention factor multiplies cos and sin: ``attention_factor`` if given (used as is, never
    multiplied again), else ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both
    are set (DeepSeek), else ``0.1 * ln(factor) + 1``.
    """

    factor: float
    original_max_seq_len: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor_override: float | None = None
    truncate: bool = True
    name: ClassVar[str] = "yarn"
    hf_types: ClassVar[tuple[str, ...]] = ("yarn",)

    @classmethod
    def from_hf(cls, params, config):
        """YaRN without a ``factor`` key raises (as transformers does); ``"factor": null`` means
        ``max_position_embeddings / original_max_position_embeddings``."""
        if "factor" not in params:
            raise ValueError(
                f"rope scaling 'yarn' needs 'factor' in the config's rope parameters (transformers refuses it too), got "
                f"{dict(params)}; set the factor, or \"factor\": null to use max_position_embeddings / "
                f"original_max_position_embeddings"
            )
        orig = hf.original_length(params, config, "yarn")
        factor = params.get("factor")
        if factor is None:                         # transformers: the ratio of the two lengths (1 if they agree)
            factor = hf.whole("max_position_embeddings", hf.need(config, "max_position_embeddings", "yarn")) / orig
        truncate = params.get("truncate", True)
        return cls(
            _validate.check_float("factor", factor), orig,
            beta_fast=_validate.check_float("beta_fast", params.get("beta_fast") or 32.0),
            beta_slow=_validate.check_float("beta_slow", params.get("beta_slow") or 1.0),
            mscale=params.get("mscale"), mscale_all_dim=params.get("mscale_all_dim"),
            attention_factor_override=params.get("attention_factor"), truncate=False if truncate is None else truncate,
        )

    def to_hf(self):
        params = {"rope_type": "yarn", "factor": self.factor, "original_max_position_embeddings":
                  self.original_max_seq_len, "beta_fast": self.beta_fast, "beta_slow": self.beta_slow,
                  "mscale": self.mscale, "mscale_all_dim": self.mscale_all_dim,
                  "attention_factor": self.attention_factor_override, "truncate": self.truncate}
        return {"rope_parameters": {key: value for key, value in params.items() if value is not None}}

    def __post_init__(self) -> None:
        object.__setattr__(self, "factor", _factor(self.factor))
        object.__setattr__(self, "original_max_seq_len", _original(self.original_max_seq_len))
        object.__setattr__(self, "beta_fast", _positive("beta_fast", self.beta_fast))
        object.__setattr__(self, "beta_slow", _positive("beta_slow", self.beta_slow))
        for field in ("beta_fast", "beta_slow"):
            ratio = self.original_max_seq_len / (getattr(self, field) * 2 * math.pi)
            if not 0.0 < ratio < math.inf:
                raise ValueError(
                    f"{field}={getattr(self, field):g} is out of range: original_max_seq_len / ({field} * 2 pi) "
                    f"must be a positive finite float (YaRN takes its logarithm)"
                )
        for field in ("mscale", "mscale_all_dim", "attention_factor_override"):
            value = getattr(self, field)
            if value is not None:
                object.__setattr__(self, field, _validate.check_float(field, value, minimum=0.0))
        _validate.check_bool("truncate", self.truncate)

    def attention_factor(self) -> float:
        if self.attention_factor_override is not None:
            return self.attention_factor_override
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)
        return yarn_mscale(self.factor)

    def correction_range(self, dim: int, base: float) -> tuple[float, float]:
        """Pair indices where the ramp starts and ends (float64, as the reference computes them)."""

        def pair_index(rotations: float) -> float:
            return dim * math.log(self.original_max_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = pair_index(self.beta_fast), pair_index(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, dim - 1)

    def _frequencies(self, dim, base, seq_len):
        low, high = self.correction_range(dim, base)
        if low == high:
            high += 0.001  # the reference's guard against a zero-width ramp
        f, lo, width = _D(self.factor), _D(low), _D(high) - _D(low)
        out = []
        for i, t in enumerate(default_frequencies(dim, base)):
            ramp = min(max((_D(i) - lo) / width, _D(0)), _D(1))   # 0: keep theta, 1: interpolate
            out.append(t / f * ramp + t * (1 - ramp))
        return tuple(out)


@dataclasses.dataclass(frozen=True)
class Llama3Scaling(RopeScaling):
    """Llama 3.1's frequency-band rule (Meta's reference; transformers' ``"llama3"``).

    With wavelength ``lambda_i = 2 pi / theta_i``: ``lambda < L0 / high_freq_factor`` keeps
    ``theta``; ``lambda > L0 / low_freq_factor`` uses ``theta / factor``; in between, with
    ``t = (L0 / lambda - low) / (high - low)``, ``(1 - t) theta / factor + t theta``.

    ``low_freq_factor == high_freq_factor`` (Llama 4's configuration) leaves no band in between: a
    hard switch at ``lambda = L0 / low_freq_factor``, as transformers computes it.  A pair whose
    wavelength falls exactly on that boundary has no defined smoothing weight (``0 / 0``;
    transformers gives NaN there) and raises.
    """

    factor: float
    original_max_seq_len: int
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    name: ClassVar[str] = "llama3"
    hf_types: ClassVar[tuple[str, ...]] = ("llama3",)

    @classmethod
    def from_hf(cls, params, config):
        return cls(hf.number(params, "factor", "llama3"), hf.original_length(params, config, "llama3"),
                   low_freq_factor=hf.number(params, "low_freq_factor", "llama3"),
                   high_freq_factor=hf.number(params, "high_freq_factor", "llama3"))

    def to_hf(self):
        return {"rope_parameters": {"rope_type": "llama3", "factor": self.factor,
                                    "original_max_position_embeddings": self.original_max_seq_len,
                                    "low_freq_factor": self.low_freq_factor, "high_freq_factor": self.high_freq_factor}}

    def __post_init__(self) -> None:
        object.__setattr__(self, "factor", _factor(self.factor))
        object.__setattr__(self, "original_max_seq_len", _original(self.original_max_seq_len))
        object.__setattr__(self, "low_freq_factor", _positive("low_freq_factor", self.low_freq_factor))
        object.__setattr__(self, "high_freq_factor", _positive("high_freq_factor", self.high_freq_factor))
        if self.high_freq_factor < self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor must be >= low_freq_factor (the smoothing band runs from L0 / high_freq_factor "
                f"to L0 / low_freq_factor), got {self.high_freq_factor} < {self.low_freq_factor}"
            )

    def _frequencies(self, dim, base, seq_len):
        L0 = self.original_max_seq_len
        low_wavelen, high_wavelen = L0 / self.low_freq_factor, L0 / self.high_freq_factor
        f, lo, hi = _D(self.factor), _D(self.low_freq_factor), _D(self.high_freq_factor)
        out = []
        for t in default_frequencies(dim, base):
            wavelen = 2 * math.pi / float(t)
            if wavelen < high_wavelen:
                out.append(t)
            elif wavelen > low_wavelen:
                out.append(t / f)
            elif hi == lo:                                  # on the boundary of an empty band: 0 / 0
                raise ValueError(
                    f"Llama3Scaling with low_freq_factor == high_freq_factor == {self.low_freq_factor} has a pair "
                    f"whose wavelength {wavelen!r} lies exactly on the switch L0 / low_freq_factor = {low_wavelen!r}, "
                    f"where the smoothing weight is 0 / 0 (transformers computes NaN); change base, dim or "
                    f"original_max_seq_len slightly, or set high_freq_factor > low_freq_factor"
                )
            else:
                smooth = (_D(L0) * t / TWO_PI - lo) / (hi - lo)
                out.append((1 - smooth) * t / f + smooth * t)
        return tuple(out)


@dataclasses.dataclass(frozen=True)
class LongRopeScaling(RopeScaling):
    """LongRoPE (Ding et al. 2024, arXiv:2402.13753), as in Phi-3: per-pair rescale factors.

    ``theta_i / ext_i`` with ``ext = short_factor`` while ``seq_len <= L0`` and ``long_factor``
    strictly after.  The attention factor is ``attention_factor`` if given, else
    ``sqrt(1 + ln(factor) / ln(L0))`` (1 when ``factor <= 1``); ``long_attention_factor``, when
    given, replaces it past ``L0``, switching with the factors (Phi-3.5-MoE's ``short_mscale`` and
    ``long_mscale``).
    """

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_seq_len: int
    factor: float = 1.0
    attention_factor_override: float | None = None
    long_attention_factor: float | None = None
    name: ClassVar[str] = "longrope"
    length_dependent: ClassVar[bool] = True
    hf_types: ClassVar[tuple[str, ...]] = ("longrope", "su")

    @classmethod
    def from_hf(cls, params, config):
        """``factor`` defaults to ``max_position_embeddings / original_max_position_embeddings``;
        Phi-3.5-MoE's ``short_mscale``/``long_mscale`` set the attention factor within and past the
        original context."""
        orig = hf.original_length(params, config, "longrope")
        max_pos = config.get("max_position_embeddings")
        factor = params.get("factor")
        if factor is None:
            factor = (hf.whole("max_position_embeddings", max_pos) / orig) if max_pos else 1.0
        within, past = _longrope_mscale(params, config.get("model_type"))
        return cls(hf.need(params, "short_factor", "longrope"), hf.need(params, "long_factor", "longrope"), orig,
                   factor=_validate.check_float("factor", factor), attention_factor_override=within,
                   long_attention_factor=past)

    def to_hf(self):
        params: dict[str, Any] = {"rope_type": "longrope", "short_factor": list(self.short_factor),
                                  "long_factor": list(self.long_factor), "factor": self.factor,
                                  "original_max_position_embeddings": self.original_max_seq_len}
        if self.long_attention_factor is None:
            if self.attention_factor_override is not None:
                params["attention_factor"] = self.attention_factor_override
            return {"rope_parameters": params}
        params["short_mscale"], params["long_mscale"] = self.attention_factor(), self.long_attention_factor
        return {"model_type": hf.MSCALE_MODEL_TYPES[0], "rope_parameters": params}

    def __post_init__(self) -> None:
        for field in ("short_factor", "long_factor"):
            value = getattr(self, field)
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise TypeError(f"{field} must be a sequence of numbers, got {value!r}")
            object.__setattr__(self, field, tuple(_positive(f"{field}[{i}]", v) for i, v in enumerate(value)))
        if len(self.short_factor) != len(self.long_factor):
            raise ValueError(
                f"short_factor and long_factor must have the same length (dim/2), got "
                f"{len(self.short_factor)} and {len(self.long_factor)}"
            )
        object.__setattr__(self, "original_max_seq_len", _original(self.original_max_seq_len))
        object.__setattr__(self, "factor", _positive("factor", self.factor))
        for field in ("attention_factor_override", "long_attention_factor"):
            if getattr(self, field) is not None:
                object.__setattr__(self, field, _validate.check_float(field, getattr(self, field), minimum=0.0))

    def attention_factor(self) -> float:
        if self.attention_factor_override is not None:
            return self.attention_factor_override
        if self.factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_seq_len))

    def attention_factor_at(self, seq_len: int | None) -> float:
        if self.long_attention_factor is not None and seq_len is not None and seq_len > self.original_max_seq_len:
            return self.long_attention_factor
        return self.attention_factor()

    def _frequencies(self, dim, base, seq_len):
        if len(self.short_factor) != dim // 2:
            raise ValueError(
                f"LongRopeScaling has {len(self.short_factor)} factors but the rotary dim {dim} needs {dim // 2}"
            )
        ext = self.long_factor if seq_len is not None and seq_len > self.original_max_seq_len else self.short_factor
        return tuple(t / _D(e) for t, e in zip(default_frequencies(dim, base), ext, strict=True))

    def frequencies_past(self, dim, base, length, xp):
        """None: past the original context the long factors hold whatever the length."""
        return None


@dataclasses.dataclass(frozen=True)
class ProportionalScaling(RopeScaling):
    """Proportional RoPE (Hugging Face's ``proportional`` rope type): the whole head is the rotary
    dim, but only its first ``int(partial_rotary_factor * dim // 2)`` pairs rotate, at the
    frequencies they have in the full head, ``base^(-2i/dim) / factor``; the other pairs get
    frequency 0 and pass through.  (Partial rotary instead rotates ``partial_rotary_factor * dim``
    features at ``base^(-2i/rotary_dim)``, pairing them among themselves.)
    """

    partial_rotary_factor: float
    factor: float = 1.0
    name: ClassVar[str] = "proportional"
    hf_types: ClassVar[tuple[str, ...]] = ("proportional",)
    reads_partial_rotary: ClassVar[bool] = True

    @classmethod
    def from_hf(cls, params, config):
        factor = _validate.check_float("factor", params.get("factor") or 1.0)
        return cls(hf.partial_rotary_factor(params, config), factor=factor)

    def to_hf(self):
        return {"rope_parameters": {"rope_type": "proportional", "partial_rotary_factor": self.partial_rotary_factor,
                                    "factor": self.factor}}

    def __post_init__(self) -> None:
        p = _validate.check_float("partial_rotary_factor", self.partial_rotary_factor, positive=True)
        if p > 1.0:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {p}")
        object.__setattr__(self, "partial_rotary_factor", p)
        object.__setattr__(self, "factor", _positive("factor", self.factor))

    def _frequencies(self, dim, base, seq_len):
        rotating = int(self.partial_rotary_factor * dim // 2)
        f = _D(self.factor)
        return tuple(t / f for t in default_frequencies(dim, base)[:rotating]) + (_D(0),) * (dim // 2 - rotating)


def _longrope_mscale(params: Mapping[str, Any], model_type: object) -> tuple[Any, Any]:
    """LongRoPE's attention factors ``(within, past)`` the original context: ``attention_factor``
    (``past`` None: the same), or Phi-3.5-MoE's ``short_mscale``/``long_mscale``, which switch with the
    factors."""
    short, long = params.get("short_mscale"), params.get("long_mscale")
    if short is None and long is None:
        return params.get("attention_factor"), None
    if model_type and model_type not in hf.MSCALE_MODEL_TYPES:
        raise ValueError(
            f"short_mscale/long_mscale are read by Phi-3.5-MoE (model_type 'phimoe'), but model_type={model_type!r}, "
            f"whose transformers code ignores them; remove them, or give the attention factor as attention_factor"
        )
    if short is None or long is None:
        raise ValueError(f"rope scaling 'longrope' needs both short_mscale and long_mscale, got {dict(params)}")
    if params.get("attention_factor") is not None:
        raise ValueError("give either attention_factor or short_mscale/long_mscale, not both")
    short = _validate.check_float("short_mscale", short, minimum=0.0)
    long = _validate.check_float("long_mscale", long, minimum=0.0)
    return short, (None if long == short else long)


#: Every scaling rule by name: the one registry that configs, Hugging Face configs, the exports
#: and the lab read (a new rule is one class here).
SCALINGS: dict[str, type[RopeScaling]] = {
    cls.name: cls for cls in (LinearScaling, NTKScaling, DynamicNTKScaling, YarnScaling, Llama3Scaling, LongRopeScaling,
                              ProportionalScaling)
}

#: Hugging Face ``rope_type`` -> rule (``"default"``, no rule, is not in it).
HF_ROPE_TYPES: dict[str, type[RopeScaling]] = {t: cls for cls in SCALINGS.values() for t in cls.hf_types}


def frequencies(dim: int, base: float, scaling: RopeScaling | None = None, seq_len: int | None = None):
    """Frequencies of a rotary embedding of ``dim`` rotated features under ``scaling``."""
    dim = _validate.check_int("dim", dim, minimum=2)
    if dim % 2:
        raise ValueError(f"the rotary dim must be even (features rotate in pairs), got {dim}")
    base = _validate.check_float("base", base, positive=True)
    if base == 1.0:
        raise ValueError("base must not be 1 (every pair would rotate at the same frequency 1)")
    if seq_len is not None:
        seq_len = _validate.check_int("seq_len", seq_len, minimum=1)
    if scaling is None:
        return default_frequencies(dim, base)
    if not isinstance(scaling, RopeScaling):
        raise TypeError(
            f"scaling must be None or a posenc scaling rule ({', '.join(c.__name__ for c in SCALINGS.values())}), "
            f"got {scaling!r}"
        )
    if type(scaling)._frequencies is RopeScaling._frequencies:
        raise TypeError(
            f"scaling must be a concrete rule ({', '.join(c.__name__ for c in SCALINGS.values())}), got "
            f"{type(scaling).__name__}, which defines no frequencies (a subclass implements _frequencies)"
        )
    return scaling.frequencies(dim, base, seq_len)


def inv_freq(dim: int, base: float, scaling: RopeScaling | None = None, seq_len: int | None = None) -> tuple[np.ndarray, float]:
    """``(inv_freq, attention_factor)``: float64 frequencies ``(dim/2,)`` and the cos/sin factor."""
    freqs = frequencies(dim, base, scaling, seq_len)
    factor = 1.0 if scaling is None else scaling.attention_factor_at(seq_len if scaling.length_dependent else None)
    return np.array([float(f) for f in freqs], dtype=np.float64), factor


def xpos_zeta(dim: int) -> np.ndarray:
    """xPos per-pair decay base ``zeta_i = (2i/d + 0.4) / 1.4`` (Sun et al. 2022, arXiv:2212.10554)."""
    return (np.arange(0, dim, 2, dtype=np.float64) / dim + 0.4) / 1.4


def scaling_to_config(scaling: RopeScaling | None) -> dict | None:
    """A JSON-ready dict of a rule (``{"rule": name, **fields}``), for configs and serialization."""
    if scaling is None:
        return None
    fields = dataclasses.asdict(scaling)
    for key, value in fields.items():
        if isinstance(value, tuple):
            fields[key] = list(value)
    return {"rule": scaling.name, **fields}


def scaling_from_config(config: dict | RopeScaling | None) -> RopeScaling | None:
    """Inverse of :func:`scaling_to_config`; unknown rules raise ``ValueError``."""
    if config is None or isinstance(config, RopeScaling):
        return config
    if not isinstance(config, dict) or "rule" not in config:
        raise TypeError(f"a scaling config must be a dict with a 'rule' key, got {config!r}")
    fields = dict(config)
    name = fields.pop("rule")
    if name not in SCALINGS:
        raise ValueError(f"unknown scaling rule {name!r}; choose from {', '.join(SCALINGS)}")
    return SCALINGS[name](**fields)
