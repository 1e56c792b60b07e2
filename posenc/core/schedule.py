"""Positions per layer: which encoding, which attention window and which temperature each layer uses.

Models of 2025 assign positions layer by layer.  Llama 4 leaves every fourth layer without RoPE
(NoPE), scales those layers' queries with a position-dependent temperature and restricts the RoPE
layers to chunks of 8192 tokens; Gemma 3 mixes sliding-window layers (base 1e4) with global ones
(base 1e6, scaled); Cohere2 and EXAONE 4 rotate only on their sliding-window layers; SmolLM3 drops
RoPE every fourth layer; gpt-oss alternates sliding and full layers.  A :class:`PositionSchedule`
says all of this in one object, one :class:`LayerPositions` per layer, built by hand or read from a
Hugging Face configuration with :meth:`PositionSchedule.from_hf`; ``print(schedule)`` shows a table.

Framework-free: an entry's encoding is any object (a torch or Keras ``RotaryEmbedding``, a bias
module, ``None`` for NoPE) or, straight from a config, a :class:`RopeSpec` that the torch and Keras
sides turn into their ``RotaryEmbedding`` (``posenc.nn.schedule_from_hf``,
``posenc.keras.schedule_from_hf``).

Conventions (the same as transformers' masks):

* ``window = w``: a query at position ``p`` sees keys at positions ``p - w < k <= p`` when causal
  (``w`` keys, itself included), ``|p - k| < w`` when not.
* ``chunk = c``: a query sees only keys of its own chunk, ``k // c == p // c``, chunks starting at
  absolute position 0 (and causal within the chunk when causal).
* a temperature multiplies each query by a factor of its position (or of the number of keys it
  sees), i.e. scales its content logits ``q . k``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, overload

from posenc import _validate
from posenc.core import hf_config as core_hf_config
from posenc.core.rope import ROPE_LAYOUTS, RopeScaling

__all__ = [
    "LayerPositions",
    "Llama4Temperature",
    "LogNTemperature",
    "PositionSchedule",
    "RopeSpec",
    "SSMaxTemperature",
    "Temperature",
    "check_chunk",
    "check_window",
]

LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


# ---- windows ---------------------------------------------------------------------------------------


def check_window(window: Any, name: str = "window") -> int | None:
    """``window`` as a positive int, or None (full attention)."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(f"{name} must be a positive int (keys a query sees, itself included) or None, got {window!r}")
    if window <= 0:
        raise ValueError(f"{name} must be >= 1 (keys a query sees, itself included), got {window}; "
                         f"pass None for full attention")
    if window > _LARGEST:
        raise ValueError(f"{name}={window} is larger than any sequence (positions are 64-bit integers, at most "
                         f"2**62 here); pass None for full attention")
    return int(window)


def check_chunk(chunk: Any, name: str = "chunk") -> int | None:
    """``chunk`` as a positive int, or None (no chunking)."""
    if chunk is None:
        return None
    if isinstance(chunk, bool) or not isinstance(chunk, int):
        raise TypeError(f"{name} must be a positive int (tokens per attention chunk) or None, got {chunk!r}")
    if chunk <= 0:
        raise ValueError(f"{name} must be >= 1 (tokens per attention chunk), got {chunk}; pass None for no chunks")
    if chunk > _LARGEST:
        raise ValueError(f"{name}={chunk} is larger than any sequence (positions are 64-bit integers, at most "
                         f"2**62 here); pass None for no chunks")
    return int(chunk)


#: The largest window or chunk: positions are int64, and differences of two positions must stay representable.
_LARGEST = 2 ** 62


def check_window_and_chunk(window: Any, chunk: Any) -> tuple[int | None, int | None]:
    """Both checked; a layer has one or the other (or neither), never both."""
    window, chunk = check_window(window), check_chunk(chunk)
    if window is not None and chunk is not None:
        raise ValueError(
            f"window={window} and chunk={chunk} contradict each other: a layer is sliding-window or chunked, "
            f"not both; pass one of them"
        )
    return window, chunk


# ---- temperatures ----------------------------------------------------------------------------------


class Temperature:
    """A per-query logit temperature: each query is multiplied by :meth:`factor` of its position
    ``p`` (0-based) and of the number of keys ``n`` it sees.

    ``uses_visible`` says whether the factor needs ``n`` (then biases cannot be scaled with the queries, see
    :class:`SSMaxTemperature`).
    """

    uses_visible: bool = False

    def factor(self, position: int, visible: int) -> float:  # pragma: no cover - every rule overrides it
        raise NotImplementedError


@dataclass(frozen=True)
class Llama4Temperature(Temperature):
    """Llama 4's attention temperature tuning (``attn_temperature_tuning``) of its NoPE layers:
    ``q *= log1p(floor((p + 1) / floor_scale)) * attn_scale + 1``.

    From "Scalable-Softmax Is Superior for Attention" (Nakanishi, 2025) as Meta's Llama 4 code
    applies it: 1 up to position ``floor_scale - 2``, then growing with the log of the position.

    Args:
        floor_scale: tokens per step of the floor (Llama 4: 8192).
        attn_scale: strength (Llama 4: 0.1).

    Examples:
        >>> t = Llama4Temperature(floor_scale=8192, attn_scale=0.1)
        >>> t.factor(8190, 0), round(t.factor(8191, 0), 6)
        (1.0, 1.069315)
    """

    floor_scale: float = 8192.0
    attn_scale: float = 0.1

    def __post_init__(self) -> None:
        object.__setattr__(self, "floor_scale", _validate.check_float("floor_scale", self.floor_scale, positive=True))
        object.__setattr__(self, "attn_scale", _validate.check_float("attn_scale", self.attn_scale))

    def factor(self, position: int, visible: int) -> float:
        return math.log1p(math.floor((position + 1) / self.floor_scale)) * self.attn_scale + 1.0


@dataclass(frozen=True)
class LogNTemperature(Temperature):
    """Qwen's log-n attention scaling (``use_logn_attn``): a query at position ``p`` is scaled by
    ``log(p + 1) / log(original_max_seq_len)`` once ``p + 1`` exceeds the training length, 1 before.

    From "Overcoming a Theoretical Limitation of Self-Attention" (Chiang and Cholak, 2022) and the
    Qwen technical report (Bai et al., 2023), which uses it to extend the context at inference.

    Examples:
        >>> t = LogNTemperature(2048)
        >>> t.factor(2047, 0), round(t.factor(4095, 0), 6)
        (1.0, 1.090909)
    """

    original_max_seq_len: int = 2048

    def __post_init__(self) -> None:
        n = _validate.check_int("original_max_seq_len", self.original_max_seq_len, minimum=2)
        object.__setattr__(self, "original_max_seq_len", n)

    def factor(self, position: int, visible: int) -> float:
        n = position + 1
        return math.log(n) / math.log(self.original_max_seq_len) if n > self.original_max_seq_len else 1.0


@dataclass(frozen=True)
class SSMaxTemperature(Temperature):
    """Scalable-Softmax: the logits of a query that sees ``n`` keys are multiplied by ``s * log(n)``.

    From "Scalable-Softmax Is Superior for Attention" (Nakanishi, 2025), with a fixed ``s`` (the
    paper learns one per head; a learned ``s`` can multiply the queries before the call).  ``n``
    counts the keys the query may attend to: causal, window, chunk, segment and boolean
    ``attn_mask`` masks included.  Applied to the queries, so it scales the whole logit only when
    no bias is added: a layer with a bias encoding refuses it.

    Examples:
        >>> round(SSMaxTemperature(0.5).factor(0, 100), 6)
        2.302585
    """

    s: float = 1.0
    uses_visible = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "s", _validate.check_float("s", self.s, positive=True))

    def factor(self, position: int, visible: int) -> float:
        return self.s * math.log(max(visible, 1))


def check_temperature(temperature: Any, name: str = "temperature") -> Temperature | None:
    if temperature is None or isinstance(temperature, Temperature):
        return temperature
    raise TypeError(
        f"{name} must be None or a posenc temperature (Llama4Temperature, LogNTemperature, SSMaxTemperature), "
        f"got {type(temperature).__name__}"
    )


# ---- encodings from a config -------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeSpec:
    """A rotary encoding described without a framework: what a layer's ``RotaryEmbedding`` is built from.

    Args:
        dim: rotary dim (features rotated per head).
        base: frequency base (``rope_theta``).
        scaling: a scaling rule, or None.
        layout: ``"half"`` or ``"interleaved"``.
    """

    dim: int
    base: float = 10000.0
    scaling: RopeScaling | None = None
    layout: str = "half"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dim", _validate.check_int("dim", self.dim, minimum=2))
        object.__setattr__(self, "base", _validate.check_float("base", self.base, positive=True))
        _validate.check_choice("layout", self.layout, ROPE_LAYOUTS)
        if self.scaling is not None and not isinstance(self.scaling, RopeScaling):
            raise TypeError(f"scaling must be a RopeScaling rule or None, got {type(self.scaling).__name__}")


# ---- the schedule ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerPositions:
    """How one layer sees positions: its encoding, its attention window and its temperature.

    Args:
        encoding: the layer's encoding (a ``RotaryEmbedding`` with its own base and rule, a bias
            module, any ``posenc.attention`` encoding, a :class:`RopeSpec`), or None: no positional
            encoding (NoPE).
        window: sliding window ``w`` (keys a causal query sees, itself included), or None.
        chunk: attention chunk ``c`` (a query sees only its own chunk of absolute positions), or None.
        temperature: a :class:`Temperature`, or None.
        layer_type: a label for printing (Hugging Face's ``layer_types`` entry when read from a config).

    Raises:
        ValueError: ``window`` or ``chunk`` < 1, or both given.
        TypeError: a temperature that is not one of posenc's.
    """

    encoding: Any = None
    window: int | None = None
    chunk: int | None = None
    temperature: Temperature | None = None
    layer_type: str = ""

    def __post_init__(self) -> None:
        window, chunk = check_window_and_chunk(self.window, self.chunk)
        object.__setattr__(self, "window", window)
        object.__setattr__(self, "chunk", chunk)
        check_temperature(self.temperature)
        if not isinstance(self.layer_type, str):
            raise TypeError(f"layer_type must be a str label, got {type(self.layer_type).__name__}")
        if self.temperature is not None and self.temperature.uses_visible and _is_bias(self.encoding):
            raise ValueError(
                f"temperature={self.temperature!r} scales the whole logit, which posenc applies to the queries: the "
                f"bias of encoding={type(self.encoding).__name__} would stay unscaled; use it on a RoPE or NoPE layer"
            )

    @property
    def rotary(self) -> bool:
        """Whether the layer rotates q and k."""
        return self.encoding is not None and not _is_bias(self.encoding)

    def describe_encoding(self) -> str:
        """The encoding in a few words: ``NoPE``, ``RoPE d=64 base=5e+05 interleaved``, or its class name."""
        enc = self.encoding
        if enc is None:
            return "NoPE"
        dim, base = getattr(enc, "dim", None), getattr(enc, "base", None)
        if isinstance(dim, int) and isinstance(base, (int, float)) and not _is_bias(enc):
            scaling = getattr(enc, "scaling", None)
            rule = "" if scaling is None else f" {type(scaling).__name__}"
            return f"RoPE d={dim} base={base:g} {getattr(enc, 'layout', '?')}{rule}"
        return type(enc).__name__

    def describe_window(self) -> str:
        """``full``, ``sliding <w>`` or ``chunk <c>``."""
        if self.window is not None:
            return f"sliding {self.window}"
        if self.chunk is not None:
            return f"chunk {self.chunk}"
        return "full"

    def describe_temperature(self) -> str:
        """``-``, ``llama4(<floor_scale>, <attn_scale>)``, ``log-n(<L>)`` or ``ssmax(<s>)``."""
        t = self.temperature
        if t is None:
            return "-"
        if isinstance(t, Llama4Temperature):
            return f"llama4({t.floor_scale:g}, {t.attn_scale:g})"
        if isinstance(t, LogNTemperature):
            return f"log-n({t.original_max_seq_len})"
        if isinstance(t, SSMaxTemperature):
            return f"ssmax({t.s:g})"
        return type(t).__name__


def _is_bias(encoding: Any) -> bool:
    """An encoding that adds a bias to the logits instead of rotating q and k: a bias tensor, or an
    encoding that says so with a true ``adds_bias`` attribute (ALiBi, T5 buckets)."""
    if encoding is None or isinstance(encoding, RopeSpec):
        return False
    if type(encoding).__name__ == "Tensor":
        return True
    return bool(getattr(encoding, "adds_bias", False))


class PositionSchedule(Sequence[LayerPositions]):
    """One :class:`LayerPositions` per layer of a model.

    Build it by hand (a list of entries, or :meth:`repeat` of a pattern) or from a Hugging Face
    configuration (:meth:`from_hf`); index it by layer, pass ``schedule[i]`` to
    ``posenc.attention(..., layer=schedule[i])``; ``print(schedule)`` shows a per-layer table.

    Args:
        layers: the entries, one per layer.
        num_layers: the model's layer count, when known: the schedule's length must match it.

    Raises:
        TypeError: an entry that is not a :class:`LayerPositions`.
        ValueError: an empty schedule, or a length other than ``num_layers``.

    Examples:
        >>> nope, local = LayerPositions(None), LayerPositions(RopeSpec(64), window=4096)
        >>> s = PositionSchedule.repeat([local, local, local, nope], num_layers=8)
        >>> len(s), s[3].encoding, s[4].window
        (8, None, 4096)
    """

    def __init__(self, layers: Iterable[LayerPositions], *, num_layers: int | None = None) -> None:
        entries = tuple(layers) if not isinstance(layers, (str, bytes, Mapping)) else None
        if entries is None:
            raise TypeError(f"layers must be an iterable of LayerPositions, got {type(layers).__name__}")
        for i, entry in enumerate(entries):
            if not isinstance(entry, LayerPositions):
                raise TypeError(f"layers[{i}] must be a LayerPositions, got {type(entry).__name__}")
        if not entries:
            raise ValueError("layers must hold at least one LayerPositions (one per layer of the model)")
        self._layers = entries
        if num_layers is not None:
            self.check_num_layers(num_layers)

    @classmethod
    def repeat(cls, pattern: Sequence[LayerPositions], *, num_layers: int) -> PositionSchedule:
        """``pattern`` repeated (and cut) to ``num_layers`` layers, e.g. Gemma 3's five local, one global."""
        num_layers = _validate.check_int("num_layers", num_layers, minimum=1)
        pattern = tuple(pattern)
        if not pattern:
            raise ValueError("pattern must hold at least one LayerPositions")
        return cls([pattern[i % len(pattern)] for i in range(num_layers)])

    def check_num_layers(self, num_layers: int) -> PositionSchedule:
        """Raise ``ValueError`` unless the schedule has exactly ``num_layers`` entries; returns itself."""
        num_layers = _validate.check_int("num_layers", num_layers, minimum=1)
        if len(self._layers) != num_layers:
            raise ValueError(
                f"the schedule has {len(self._layers)} layers but num_layers={num_layers}: give one LayerPositions "
                f"per layer of the model"
            )
        return self

    def __len__(self) -> int:
        return len(self._layers)

    @overload
    def __getitem__(self, index: int) -> LayerPositions: ...

    @overload
    def __getitem__(self, index: slice) -> PositionSchedule: ...

    def __getitem__(self, index: int | slice) -> LayerPositions | PositionSchedule:
        if isinstance(index, slice):
            return PositionSchedule(self._layers[index])
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"a schedule is indexed by layer (an int), got {type(index).__name__}")
        if not -len(self._layers) <= index < len(self._layers):
            raise IndexError(f"layer {index} out of range for a schedule of {len(self._layers)} layers")
        return self._layers[index]

    def __iter__(self) -> Iterator[LayerPositions]:
        return iter(self._layers)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PositionSchedule) and self._layers == other._layers

    def __hash__(self) -> int:
        return hash(self._layers)

    def map_encodings(self, build: Callable[[RopeSpec], Any]) -> PositionSchedule:
        """A copy whose :class:`RopeSpec` encodings are replaced by ``build(spec)``, one call per
        distinct spec (layers with the same spec share one module)."""
        built: dict[RopeSpec, Any] = {}
        out = []
        for entry in self._layers:
            if isinstance(entry.encoding, RopeSpec):
                if entry.encoding not in built:
                    built[entry.encoding] = build(entry.encoding)
                entry = replace(entry, encoding=built[entry.encoding])
            out.append(entry)
        return PositionSchedule(out)

    def __repr__(self) -> str:
        return f"PositionSchedule({len(self._layers)} layers)\n{self.table()}"

    def __str__(self) -> str:
        return self.table()

    def table(self) -> str:
        """The per-layer table that ``print(schedule)`` shows."""
        head = ("layer", "type", "encoding", "window", "temperature")
        rows = [(str(i), e.layer_type.removesuffix("_attention") or "-", e.describe_encoding(), e.describe_window(), e.describe_temperature())
                for i, e in enumerate(self._layers)]
        widths = [max(len(r[c]) for r in (head, *rows)) for c in range(len(head))]
        line = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
        return "\n".join([line(head), "  ".join("-" * w for w in widths), *map(line, rows)])

    @classmethod
    def from_hf(cls, config: object, *, encodings: Callable[[RopeSpec], Any] | None = None) -> PositionSchedule:
        """Read a model's schedule from its Hugging Face configuration.

        Keys read: ``num_hidden_layers``, ``layer_types`` (``full_attention``,
        ``sliding_attention``, ``chunked_attention``; derived as each family derives it when
        absent), ``sliding_window``, ``attention_chunk_size``, ``no_rope_layers`` (1 = the layer
        *uses* RoPE, in Llama 4 and SmolLM3 alike), ``no_rope_layer_interval``,
        ``attn_temperature_tuning``, ``floor_scale``, ``attn_scale``, ``use_logn_attn`` and
        ``seq_length`` (Qwen), the (per-layer-type) rope parameters, and the family rules:

        ==============  =================================================================
        family          which layers rotate; which slide
        ==============  =================================================================
        Llama 4         ``no_rope_layers[i] == 1``; RoPE layers chunked, NoPE layers full
                        with temperature tuning
        SmolLM3         ``no_rope_layers[i] == 1``; sliding only if ``use_sliding_window``
        Cohere2         only sliding layers rotate (pattern of 4: 3 sliding, 1 full)
        EXAONE 4        only sliding layers rotate, unless ``sliding_window`` is None (all)
        Gemma 3 / 4     all; sliding layers base 1e4, full layers their own parameters
        OLMo 3, gpt-oss all; per-layer-type parameters where given
        ==============  =================================================================

        Args:
            config: a ``transformers`` ``PretrainedConfig`` or a ``config.json`` dict (a wrapper's
                ``text_config`` is read when the wrapper has no layers of its own).
            encodings: builds each layer's encoding from its :class:`RopeSpec` (default: keep the
                specs; ``posenc.nn.schedule_from_hf`` builds torch ``RotaryEmbedding`` modules).

        Raises:
            ValueError: a missing, wrong or contradictory field, named (never a silent default).
        """
        d = core_hf_config.config_dict(config)
        text = d.get("text_config")
        if d.get("num_hidden_layers") is None and isinstance(text, Mapping):
            d = dict(text)
        return _from_hf(d, encodings)


# ---- reading configs -----------------------------------------------------------------------------


def _field_int(d: Mapping[str, Any], key: str, minimum: int = 1) -> int:
    value = d.get(key)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return _validate.check_int(key, value, minimum=minimum)


def _pattern_types(n: int, pattern: int) -> list[str]:
    """``pattern - 1`` sliding layers then one full, repeated (transformers' ``sliding_window_pattern``)."""
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]


def _no_rope_layers(d: Mapping[str, Any], n: int) -> list[int]:
    """Per layer, 1 if the layer uses RoPE, 0 if it is NoPE (transformers' ``no_rope_layers``)."""
    flags = d.get("no_rope_layers")
    if not flags:                                   # transformers treats an empty list as absent too
        interval = _field_int(d, "no_rope_layer_interval") if d.get("no_rope_layer_interval") is not None else 4
        return [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(flags, (list, tuple)) or len(flags) != n:
        raise ValueError(
            f"no_rope_layers must list one flag per layer (num_hidden_layers={n}), got "
            f"{len(flags) if isinstance(flags, (list, tuple)) else type(flags).__name__}"
        )
    for i, f in enumerate(flags):
        if isinstance(f, bool) or f not in (0, 1):
            raise ValueError(f"no_rope_layers[{i}] must be 1 (the layer uses RoPE) or 0 (NoPE), got {f!r}")
    return [int(f) for f in flags]


def _default_layer_types(d: Mapping[str, Any], n: int, family: str) -> list[str]:
    if family == "llama4":
        chunk = d.get("attention_chunk_size")
        return ["chunked_attention" if rope and chunk is not None else "full_attention"
                for rope in _no_rope_layers(d, n)]
    if family == "smollm3":
        slide = bool(d.get("use_sliding_window")) and d.get("sliding_window") is not None
        return ["sliding_attention" if slide and not rope else "full_attention" for rope in _no_rope_layers(d, n)]
    if family == "exaone4":
        pattern = d.get("sliding_window_pattern", 4)
        if d.get("sliding_window") is None:
            return ["full_attention"] * n
        if isinstance(pattern, str):
            if not pattern or set(pattern) - {"L", "G"}:
                raise ValueError(f"sliding_window_pattern must be an int or a string of 'L' and 'G', got {pattern!r}")
            return ["sliding_attention" if pattern[i % len(pattern)] == "L" else "full_attention" for i in range(n)]
        return _pattern_types(n, _field_int(d, "sliding_window_pattern"))
    if family in _PATTERNS:
        default = _PATTERNS[family]
        pattern = d.get("sliding_window_pattern", default) if family in ("gemma3", "cohere2") else default
        types = _pattern_types(n, _validate.check_int("sliding_window_pattern", pattern, minimum=1))
        if family == "gemma4" and types:
            types[-1] = "full_attention"
        return types
    if d.get("sliding_window") is not None or d.get("attention_chunk_size") is not None:
        raise ValueError(
            f"the config sets sliding_window/attention_chunk_size but no layer_types, and posenc does not know which "
            f"layers of model_type={d.get('model_type')!r} use them: pass a config with layer_types"
        )
    return ["full_attention"] * n


#: ``sliding_window_pattern`` defaults per family (``pattern - 1`` sliding layers, then one full).
_PATTERNS = {"gemma3": 6, "gemma3_text": 6, "gemma4": 6, "gemma4_text": 6, "cohere2": 4, "olmo3": 4, "gpt_oss": 2}

#: Which layers rotate, per family: a function of (config, layer index, layer type, no-rope flags).
_ROTATES: dict[str, Callable[[Mapping[str, Any], int, str, list[int] | None], bool]] = {
    "llama4": lambda d, i, t, flags: bool(flags and flags[i]),
    "smollm3": lambda d, i, t, flags: bool(flags and flags[i]),
    "cohere2": lambda d, i, t, flags: t == "sliding_attention",
    "exaone4": lambda d, i, t, flags: d.get("sliding_window") is None or t == "sliding_attention",
}

_FAMILY = {"llama4_text": "llama4", "llama4": "llama4", "gemma3_text": "gemma3", "gemma4_text": "gemma4",
           "cohere2_moe": "cohere2"}


def _family(d: Mapping[str, Any]) -> str:
    mt = d.get("model_type") or ""
    return _FAMILY.get(mt, mt)


def _layer_types(d: Mapping[str, Any], n: int, family: str) -> list[str]:
    types = d.get("layer_types")
    if types is None:
        types = _default_layer_types(d, n, family)
    if not isinstance(types, (list, tuple)) or len(types) != n:
        got = len(types) if isinstance(types, (list, tuple)) else type(types).__name__
        raise ValueError(f"layer_types must list one type per layer (num_hidden_layers={n}), got {got}")
    for i, t in enumerate(types):
        if t not in LAYER_TYPES:
            raise ValueError(f"layer_types[{i}] must be one of {', '.join(map(repr, LAYER_TYPES))}, got {t!r}")
    return list(types)


#: transformers' defaults of the fields read here, per family: a config.json that leaves a key out
#: means the default, as when transformers loads it (a key given as null stays null).
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama4": {"attention_chunk_size": 8192, "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1},
    "gemma3": {"sliding_window": 4096},
    "gemma4": {"sliding_window": 512},
    "cohere2": {"sliding_window": 4096},
    "exaone4": {"sliding_window": 4096},
    "olmo3": {"sliding_window": 4096},
    "gpt_oss": {"sliding_window": 128},
}


def _from_hf(d: dict[str, Any], encodings: Callable[[RopeSpec], Any] | None) -> PositionSchedule:
    n = _field_int(d, "num_hidden_layers")
    family = _family(d)
    d = {**_DEFAULTS.get(family, {}), **d}
    bidirectional = d.get("use_bidirectional_attention")
    if bidirectional not in (None, False, "vision"):
        raise ValueError(
            f"use_bidirectional_attention={bidirectional!r}: posenc's schedule reads causal text models (a "
            f"bidirectional sliding window is |q - k| < w with causal=False); build that schedule by hand"
        )
    types = _layer_types(d, n, family)
    uses_flags = family in ("llama4", "smollm3") or d.get("no_rope_layers") is not None
    flags = _no_rope_layers(d, n) if uses_flags else None
    rotates = _ROTATES.get(family)
    if rotates is None:                               # any family: no_rope_layers if given, else every layer
        rotates = lambda d, i, t, flags: bool(flags[i]) if flags is not None else True  # noqa: E731
    if "sliding_attention" in types:
        window = check_window(d.get("sliding_window"), "sliding_window") if d.get("sliding_window") is not None \
            else None
        if window is None:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is None: set sliding_window")
        if family == "smollm3" and not d.get("use_sliding_window"):
            raise ValueError(
                "layer_types has sliding_attention layers but use_sliding_window is false: SmolLM3 would attend "
                "fully there; set use_sliding_window or make those layers full_attention"
            )
    if "chunked_attention" in types:
        if d.get("attention_chunk_size") is None:
            raise ValueError("layer_types has chunked_attention layers but attention_chunk_size is None: set it")
        check_chunk(d.get("attention_chunk_size"), "attention_chunk_size")
    temperature: Temperature | None = None
    tuning = d.get("attn_temperature_tuning")
    if tuning not in (None, False, True, 0, 1):
        raise ValueError(f"attn_temperature_tuning must be true or false, got {tuning!r}")
    if tuning:
        temperature = Llama4Temperature(
            floor_scale=_finite(d, "floor_scale", 8192.0), attn_scale=_finite(d, "attn_scale", 0.1))
    logn = None
    if d.get("use_logn_attn"):
        if d.get("seq_length") is None:
            raise ValueError("use_logn_attn needs seq_length (the training length the log-n scaling starts after)")
        logn = LogNTemperature(_field_int(d, "seq_length", minimum=2))
    specs: dict[str, RopeSpec] = {}
    entries = []
    for i, t in enumerate(types):
        rope = rotates(d, i, t, flags)
        spec = None
        if rope:
            if t not in specs:
                specs[t] = _rope_spec(d, t, i)
            spec = specs[t]
        layer_temperature = temperature if (temperature is not None and not rope) else logn
        entries.append(LayerPositions(
            spec,
            window=d["sliding_window"] if t == "sliding_attention" else None,
            chunk=d["attention_chunk_size"] if t == "chunked_attention" else None,
            temperature=layer_temperature,
            layer_type=t,
        ))
    schedule = PositionSchedule(entries, num_layers=n)
    return schedule if encodings is None else schedule.map_encodings(encodings)


def _finite(d: Mapping[str, Any], key: str, default: float) -> float:
    value = d.get(key)
    return _validate.check_float(key, default if value is None else value)


def _rope_spec(d: dict[str, Any], layer_type: str, index: int) -> RopeSpec:
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    per_type = isinstance(params, Mapping) and bool(params) and all(isinstance(v, Mapping) for v in params.values())
    local = d.get("rope_local_base_freq") is not None
    cfg = d
    per_layer = d.get("per_layer_config")                 # Gemma 4: the global layers' own head_dim
    if isinstance(per_layer, Mapping):
        override = per_layer.get(index, per_layer.get(str(index)))
        if isinstance(override, Mapping) and override.get("head_dim") is not None:
            cfg = {**d, "head_dim": override["head_dim"]}
    if (per_type or local) and layer_type == "chunked_attention":
        raise ValueError("a per-layer-type rope config has no parameters for chunked_attention layers")
    base, dim, scaling = core_hf_config.rope_scaling_from_hf(cfg, layer_type=layer_type if (per_type or local)
                                                             else None)
    layout = core_hf_config.describe_rope_layout(d, rotary_dim=dim).layout
    return RopeSpec(dim, base, scaling, layout)
