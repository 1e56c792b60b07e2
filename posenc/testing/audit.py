"""``audit_hf``: what positions each layer of a Hugging Face model gets, and whether its code agrees.

From a ``config.json`` (a path, a dict, a ``PretrainedConfig``) or a loaded model, :func:`audit_hf`
reports per layer the rule, base, rotary dim, layout, window, NoPE layers and temperature
(:meth:`posenc.PositionSchedule.from_hf`), the context length before and after extension, flags
fields that contradict each other or that the model's code is known to ignore, and, when
transformers is installed, builds the model's rotary modules (or takes them from the model) and
inspects them with :func:`posenc.testing.inspect_rope`: the frequencies, attention factor and pair
layout they compute are compared with what the configuration says.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect as _inspect
import json
import math
import os
import pathlib
import textwrap
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from posenc import _validate
from posenc.core import hf_config as core_hf
from posenc.core.rope import HF_ROPE_TYPES
from posenc.core.schedule import PositionSchedule
from posenc.testing import _fit
from posenc.testing.rope import inspect_rope

#: Columns a printed report is wrapped at.
_WIDTH = 78
#: Fields that say a config has rotary positions.
_ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "rotary_dim", "rotary_pct", "partial_rotary_factor",
              "rotary_emb_base")
#: Rope types whose ``factor`` stretches ``original_max_position_embeddings`` to the model's context.
_STRETCHING = ("linear", "dynamic", "yarn", "llama3", "longrope")


@dataclasses.dataclass(frozen=True)
class ModuleCheck:
    """One rotary module of the model, inspected: ``agrees`` is None when it could not be compared."""

    name: str
    layer_type: str | None
    agrees: bool | None
    summary: str
    differences: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """What :func:`audit_hf` found.  ``print(report)`` shows it; ``ok`` is False when a field is flagged
    or a rotary module computes something other than its configuration says.

    Attributes:
        model_type: the configuration's ``model_type``.
        schedule: the per-layer table (or why it could not be read).
        context: the context length before and after extension, in words.
        layout: the pair layout the configuration implies, with its reason.
        flags: fields that contradict each other or that the model does not read, in words.
        warnings: values worth a second look that need not be wrong (a factor that does not
            stretch the original context to ``max_position_embeddings``).
        modules: the rotary modules inspected.
        notes: what could not be checked, and why.
    """

    model_type: str
    schedule: str
    context: str
    layout: str
    flags: tuple[str, ...]
    warnings: tuple[str, ...]
    modules: tuple[ModuleCheck, ...]
    notes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.flags and all(m.agrees is not False for m in self.modules)

    def __str__(self) -> str:
        def wrap(text: str, indent: int, hang: int = 2) -> list[str]:
            return textwrap.wrap(text, _WIDTH, initial_indent=" " * indent, subsequent_indent=" " * (indent + hang),
                                 break_on_hyphens=False, break_long_words=False)

        lines = [f"posenc audit: model_type={self.model_type!r}", *wrap(f"context: {self.context}", 2),
                 *wrap(f"layout: {self.layout}", 2), "  layers:"]
        lines += [f"    {row}" for row in self.schedule.splitlines()]
        lines.append("  rotary modules:" + (" none inspected" if not self.modules else ""))
        for m in self.modules:
            verdict = {True: "agrees with the config", False: "DIFFERS from the config", None: "not compared"}[m.agrees]
            where = m.name + (f" [{m.layer_type}]" if m.layer_type else "")
            lines += wrap(f"{where}: {verdict}; {m.summary}", 4)
            lines += [line for d in m.differences for line in wrap(f"- {d}", 6)]
        for title, items in (("flags", self.flags), ("warnings", self.warnings), ("notes", self.notes)):
            if items or title == "flags":
                lines.append(f"  {title}:" + (" none" if not items else ""))
                lines += [line for item in items for line in wrap(f"- {item}", 4)]
        return "\n".join(lines)


def audit_hf(config_or_model: Any, *, inspect_modules: bool = True, max_position: int = 2048) -> AuditReport:
    """Audit the positions of a Hugging Face model from its configuration or the model itself.

    Args:
        config_or_model: a path to a ``config.json`` or to a model folder holding one, a parsed
            ``config.json`` dict, a ``transformers`` ``PretrainedConfig``, or a loaded model (its
            rotary modules are then inspected as they are, weights untouched).
        inspect_modules: call the rotary modules (needs transformers for a config: the modules are
            built from it, which reads no weights).
        max_position: the last position the modules are probed at.

    Returns:
        An :class:`AuditReport`.

    Raises:
        TypeError: an argument of another kind.
        ValueError: a path without a ``config.json``, or a file that is not JSON.

    Examples:
        >>> report = audit_hf({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
        ...     "num_hidden_layers": 2, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        ...     "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        ...     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}, inspect_modules=False)
        >>> report.ok, report.flags
        (True, ())
        >>> print(report.warnings[0])
        factor x original_max_position_embeddings = 8 x 8192 = 65536, but max_position_embeddings = 131072: the llama3 rule interpolates for 65536 positions; check which length the model was trained to
    """
    _validate.check_bool("inspect_modules", inspect_modules)
    max_position = _validate.check_int("max_position", max_position, minimum=16)
    model, config = _resolve(config_or_model)
    d = core_hf.config_dict(config)
    text = d.get("text_config")
    level = dict(text) if d.get("num_hidden_layers") is None and isinstance(text, Mapping) else d
    model_type = str(d.get("model_type") or "?")
    notes: list[str] = []
    try:
        schedule = PositionSchedule.from_hf(_as_transformers_reads_it(config)).table()
    except (ValueError, TypeError) as e:
        schedule = "\n".join(textwrap.wrap(f"(not read: {e})", _WIDTH - 4, break_on_hyphens=False))
    flags, warnings = _flags(level)
    unreadable = _unreadable(config)
    if unreadable:
        flags.insert(0, unreadable)
    context = _context(level)
    try:
        found = core_hf.describe_rope_layout(d)
        layout = f"{found.layout} ({found.reason})"
    except (ValueError, TypeError) as e:
        layout = f"(not read: {e})"
    limit = min((v for v in (level.get("max_position_embeddings"), level.get("n_positions"))
                 if isinstance(v, int) and not isinstance(v, bool) and v > 16), default=None)
    if limit is not None and max_position >= limit:           # a table of limit rows holds positions 0 .. limit-1
        notes.append(f"rotary modules probed up to position {limit - 1} (the config's {limit} positions), not "
                     f"{max_position}")
        max_position = limit - 1
    modules: list[ModuleCheck] = []
    if inspect_modules:
        try:
            built = _rotary_modules(model, config)
        except ImportError as e:
            built = []
            notes.append(f"rotary modules not inspected: {e}")
        except Exception as e:                        # noqa: BLE001 -- reported: the model cannot be built here
            built = []
            notes.append(f"rotary modules not inspected: building them from the config failed ({type(e).__name__}: "
                         f"{str(e)[:160]})")
        for name, module in built:
            own = _own_config(name, module, model) or config
            for layer_type in _layer_types(module, core_hf.config_dict(own)):
                modules.append(_check_module(name, module, layer_type, model, own, max_position))
        if not built and not notes:
            notes.append("the model has no rotary module (a class named *RotaryEmbedding)")
    return AuditReport(model_type, schedule, context, layout, tuple(flags), tuple(warnings), tuple(modules),
                       tuple(notes))


def _resolve(obj: Any) -> tuple[Any, Any]:
    """``(model or None, config)``."""
    if isinstance(obj, torch.nn.Module):
        config = getattr(obj, "config", None)
        if config is None:
            raise TypeError(f"config_or_model: the module {type(obj).__name__} has no .config (pass a transformers "
                            "model, or its config)")
        return obj, config
    if isinstance(obj, (str, os.PathLike)):
        path = pathlib.Path(obj)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"config_or_model: {str(obj)!r} is neither a config.json nor a folder holding one")
        try:
            return None, json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"config_or_model: {str(path)!r} is not JSON ({e})") from e
    if isinstance(obj, Mapping) or hasattr(obj, "to_dict"):
        return None, obj
    raise TypeError(f"config_or_model must be a path, a config.json dict, a PretrainedConfig or a model, got "
                    f"{type(obj).__name__}")


def _as_transformers_reads_it(config: Any) -> Any:
    """A ``config.json`` dict through transformers' config class when it is installed: the class fills in
    what the model derives (``layer_types`` from ``use_sliding_window`` and ``max_window_layers``, say);
    the dict as it is otherwise."""
    if not isinstance(config, Mapping) or not config.get("model_type"):
        return config
    try:
        transformers = importlib.import_module("transformers")
        return transformers.AutoConfig.for_model(**copy.deepcopy(dict(config)))    # it edits nested dicts
    except Exception:                                 # noqa: BLE001 -- not installed, or a type it does not know
        return config


def _unreadable(config: Any) -> str | None:
    """Why the rope fields of a config that has some can be read neither as 1-D nor as multimodal RoPE
    (a wrong type or value), else None."""
    d = core_hf.config_dict(config)
    text = d.get("text_config")
    level = dict(text) if isinstance(text, Mapping) and d.get("num_hidden_layers") is None else d
    if not any(key in level for key in _ROPE_KEYS):
        return None
    per_type = [k for k, _ in _params(level) if k is not None]
    try:
        core_hf.rope_scaling_from_hf(config, layer_type=per_type[0] if per_type else None)
        return None
    except (ValueError, TypeError) as e:
        first = e
    try:
        core_hf.mrope_from_hf(config)
        return None
    except (ValueError, TypeError) as e:
        multimodal = "mrope_section" in str(level) or "multimodal" in str(first)
        return f"the rope fields cannot be read: {e if multimodal else first}"


def _params(d: Mapping[str, Any]) -> list[tuple[str | None, Mapping[str, Any]]]:
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        return []
    if params and all(v is None or isinstance(v, Mapping) for v in params.values()):
        return [(k, v) for k, v in params.items() if isinstance(v, Mapping)]
    return [(None, params)]


def _context(d: Mapping[str, Any]) -> str:
    mpe = d.get("max_position_embeddings")
    parts = [f"max_position_embeddings={mpe}" if mpe is not None else "max_position_embeddings not set"]
    for layer_type, p in _params(d):
        kind = p.get("rope_type") or p.get("type") or "default"
        where = f" ({layer_type})" if layer_type else ""
        orig, factor = p.get("original_max_position_embeddings"), p.get("factor")
        if kind not in ("default", "mrope"):                # "mrope" names the sections, not a scaling rule
            parts.append(f"{kind}{where}: " + (f"original {orig} x factor {factor:g}" if isinstance(orig, int) and
                                              isinstance(factor, (int, float)) else f"factor {factor}"))
    return "; ".join(parts)


def _flags(d: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """``(flags, warnings)``: fields that contradict each other or go unread, and lengths that disagree."""
    out: list[str] = []
    warnings: list[str] = []
    mpe = d.get("max_position_embeddings")
    for layer_type, p in _params(d):
        kind = p.get("rope_type") or p.get("type")
        orig, factor = p.get("original_max_position_embeddings"), p.get("factor")
        where = f" ({layer_type})" if layer_type else ""
        if kind in _STRETCHING and isinstance(orig, int) and isinstance(factor, (int, float)) and isinstance(mpe, int):
            if factor > 1 and orig >= mpe:
                out.append(f"original_max_position_embeddings={orig}{where} is not below max_position_embeddings={mpe}, "
                           f"yet factor={factor:g}: the context is not extended, or one of the lengths is wrong")
            elif kind != "longrope" and not math.isclose(factor * orig, mpe, rel_tol=1e-6):
                warnings.append(f"factor x original_max_position_embeddings = {factor:g} x {orig} = {factor * orig:g}, "
                                f"but max_position_embeddings = {mpe}{where}: the {kind} rule interpolates for "
                                f"{factor * orig:g} positions; check which length the model was trained to")
        if kind is not None and kind not in (*HF_ROPE_TYPES, "default", "mrope"):
            out.append(f"rope_type={kind!r}{where} is not a rule posenc knows; check the model's code reads it")
    scaling, parameters = d.get("rope_scaling"), d.get("rope_parameters")
    if isinstance(scaling, Mapping) and isinstance(parameters, Mapping) and scaling and parameters:
        a = scaling.get("rope_type") or scaling.get("type")
        b = parameters.get("rope_type") or parameters.get("type")
        if a is not None and b is not None and a != b:
            out.append(f"rope_scaling says rope_type={a!r} but rope_parameters says {b!r}: transformers reads "
                       "rope_parameters")
    if d.get("sliding_window") is not None and d.get("use_sliding_window") is False:
        out.append(f"sliding_window={d['sliding_window']} is set but use_sliding_window is false: the model attends "
                   "to the whole context (the window is ignored)")
    prf, rdim, head = d.get("partial_rotary_factor"), d.get("rotary_dim"), d.get("head_dim")
    if isinstance(prf, (int, float)) and isinstance(rdim, int) and isinstance(head, int) and int(head * prf) != rdim:
        out.append(f"rotary_dim={rdim} but head_dim x partial_rotary_factor = {head} x {prf:g} = {int(head * prf)}: "
                   "most transformers models read partial_rotary_factor and ignore rotary_dim")
    return out, warnings


def _rotary_modules(model: Any, config: Any) -> list[tuple[str, torch.nn.Module]]:
    if model is not None:
        seen, out = set(), []
        for name, module in model.named_modules():
            if type(module).__name__.endswith("RotaryEmbedding") and callable(getattr(module, "forward", None)):
                key = (type(module), id(getattr(module, "config", None)))
                if key not in seen:
                    seen.add(key)
                    out.append((name, module))
        return out
    try:
        transformers = importlib.import_module("transformers")
    except ImportError as e:
        raise ImportError("transformers is not installed (pip install transformers), so the model's rotary code "
                          "cannot be built from the config") from e
    d = core_hf.config_dict(config)
    if not hasattr(config, "to_dict"):
        config = transformers.AutoConfig.for_model(**copy.deepcopy(d))
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    names = importlib.import_module("transformers.models.auto.modeling_auto").MODEL_MAPPING_NAMES
    class_name = names.get(text.model_type) or names.get(d.get("model_type"))
    if class_name is None:
        raise ImportError(f"transformers {transformers.__version__} has no model for model_type={d.get('model_type')!r}")
    code = importlib.import_module(getattr(transformers, class_name).__module__)
    out = []
    for attr, cls in sorted(vars(code).items()):
        if isinstance(cls, type) and attr.endswith("RotaryEmbedding") and issubclass(cls, torch.nn.Module) \
                and cls.__module__ == code.__name__ and "Vision" not in attr:
            try:
                out.append((attr, cls(config=text)))
            except Exception:                        # noqa: BLE001 -- a class that needs another config: skipped
                continue
    return out


def _own_config(name: str, module: torch.nn.Module, model: Any) -> Any:
    """The configuration a rotary module was built from: its own ``config``, else that of the nearest
    enclosing module that keeps one (an audio or vision tower's, not the language model's)."""
    own = getattr(module, "config", None)
    if own is not None or model is None:
        return own
    parts = name.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        holder = model.get_submodule(".".join(parts[:cut])) if cut else model
        found = getattr(holder, "config", None)
        if found is not None and hasattr(found, "to_dict"):
            return found
    return None


def _layer_types(module: torch.nn.Module, d: Mapping[str, Any]) -> list[str | None]:
    if "layer_type" not in _inspect.signature(type(module).forward).parameters:
        return [None]
    kinds: list[str | None] = [k for k, _ in _params(d) if k is not None]
    return kinds or [None]


def _check_module(name: str, module: torch.nn.Module, layer_type: str | None, model: Any, config: Any,
                  max_position: int) -> ModuleCheck:
    axes = [0]                                        # 3: multimodal RoPE, position_ids (3, B, S) (text: all equal)

    def table(x: torch.Tensor, positions: torch.Tensor) -> Any:
        x = x.to(torch.float32)
        if axes[0]:
            positions = positions.reshape(1, 1, -1).expand(axes[0], 1, -1)
        return module(x, positions) if layer_type is None else module(x, positions, layer_type=layer_type)

    try:
        try:
            out = table(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, dtype=torch.int64))
        except (IndexError, RuntimeError, ValueError):
            axes[0] = 3
            out = table(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, dtype=torch.int64))
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            return ModuleCheck(name, layer_type, None, f"returns {type(out).__name__}, not (cos, sin): its own code "
                                                       "rotates, so it is not compared", ())
        width = int(out[0].shape[-1])
        report = inspect_rope(table, head_dim=2 * width, call="cos_sin", max_position=max_position)
    except Exception as e:                            # noqa: BLE001 -- reported as not compared
        return ModuleCheck(name, layer_type, None, f"could not be called as forward(x, position_ids) "
                                                   f"({type(e).__name__}: {str(e)[:120]})", ())
    layout = _module_layout(module, model)
    summary = (f"{report.fit.describe()}, attention factor {report.attention_factor:.6g}, cos/sin {width} wide"
               + (f", layout {layout}" if layout else ""))
    try:
        try:
            base, dim, rule = core_hf.rope_scaling_from_hf(config, layer_type=layer_type)
        except ValueError:
            # multimodal RoPE: text tokens have equal positions on every axis, a 1-D RoPE of the same base
            base, dim, rule = core_hf.mrope_from_hf(config)[:3]
        found = core_hf.describe_rope_layout(config, rotary_dim=dim)
    except (ValueError, TypeError) as e:
        return ModuleCheck(name, layer_type, None, summary + f"; the config is not read as 1-D RoPE ({str(e)[:120]})",
                           ())
    differences = []
    table_dim = report.rotary_dim
    if rule is not None and rule.length_dependent:
        length: int | None = max_position + 1
    else:
        length = None
    want = _fit.rule_frequencies(dim, base, rule, length)
    got = report.frequencies
    if table_dim != dim and not (len(got) == len(want) or rule is not None and rule.reads_partial_rotary):
        differences.append(f"the module's cos/sin cover {table_dim} features; the config says rotary dim {dim}")
    elif len(got) == len(want):
        off = np.abs(got / want - 1)
        if np.any(off > 1e-4):
            worst = int(np.argmax(off))
            differences.append(f"frequencies differ from the config's (base={base:g}, {_fit.describe_rule(rule)}) on "
                               f"{int((off > 1e-4).sum())} of {len(off)} pairs (pair {worst}: {got[worst]:.9g} vs "
                               f"{want[worst]:.9g}); the module computes {report.fit.describe()}")
        factor = 1.0 if rule is None else rule.attention_factor_at(length)
        if abs(report.attention_factor / factor - 1) > 1e-4:
            differences.append(f"attention factor {report.attention_factor:.6g}; the config's rule gives {factor:.6g}")
    if layout is not None and layout != found.layout and found.known:
        differences.append(f"the modeling code pairs features {layout}; the config is read as {found.layout}")
    elif layout is not None and not found.known:
        summary += " (the config does not name the layout: the code's is the one that counts)"
    if report.collision is not None:
        differences.append(f"positions {report.collision} and {report.collision + 1} get the same rotation")
    return ModuleCheck(name, layer_type, not differences, summary, tuple(differences))


def _module_layout(module: torch.nn.Module, model: Any) -> str | None:
    try:
        from posenc.integrations.transformers import rotation_layout
    except ImportError:
        return None
    try:
        layout, _ = rotation_layout(module, model)
    except Exception:                                 # noqa: BLE001 -- the layout stays unknown
        return None
    return layout
