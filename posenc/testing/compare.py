"""``assert_rope_close``: a rotary implementation against a reference, with a message that names what differs."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from posenc import _validate
from posenc.core import exact
from posenc.core import hf_config as core_hf
from posenc.core import rope as core_rope
from posenc.core.schedule import RopeSpec
from posenc.nn.rotary import RotaryEmbedding
from posenc.testing import _fit
from posenc.testing.rope import RopeReport, run_probes

#: Default absolute tolerance on cos/sin values per dtype: two units in the last place at 1 for 16-bit
#: floats; for float32 well above the rounding of an angle computed in float32 at a few thousand
#: positions (which grows with the position), far below any wrong frequency, layout or offset.
_ATOL = {torch.float64: 1e-9, torch.float32: 1e-3, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@dataclasses.dataclass(frozen=True)
class Expected:
    """What a reference rotates: ``rotated`` features in ``pairs`` (pair ``i`` first), frequencies
    ``freqs`` per pair, the attention factor, and a description for messages."""

    rotated: tuple[int, ...]
    pairs: tuple[tuple[int, int], ...]
    layout: str
    placement: str
    rotary_dim: int
    base: float
    rule: core_rope.RopeScaling | None
    freqs: np.ndarray
    attention_factor: float
    direction: str
    label: str


def expected_rope(reference: Any, *, head_dim: int, seq_len: int, layer_type: str | None = None) -> Expected:
    """The :class:`Expected` rotation of ``reference``: a posenc ``RotaryEmbedding``, a
    :class:`posenc.RopeSpec`, a Hugging Face config (``PretrainedConfig`` or ``config.json`` dict; a
    per-layer-type config takes ``layer_type``) or a :class:`RopeReport` (another implementation)."""
    if isinstance(reference, RopeReport):
        return _from_report(reference)
    if isinstance(reference, RopeSpec):
        return _from_spec(reference.dim, reference.base, reference.scaling, reference.layout, "first", head_dim,
                          seq_len, f"RopeSpec(dim={reference.dim}, base={reference.base:g})")
    if isinstance(reference, RotaryEmbedding):
        r = reference
        return _from_spec(r.dim, r.base, r.scaling, r.layout, r.rotary_slice, head_dim, seq_len,
                          f"RotaryEmbedding(dim={r.dim}, base={r.base:g})")
    if isinstance(reference, Mapping) or hasattr(reference, "to_dict"):
        base, dim, rule = core_hf.rope_scaling_from_hf(reference, layer_type=layer_type)
        layout = core_hf.describe_rope_layout(reference, rotary_dim=dim).layout
        kind = core_hf.config_dict(reference).get("model_type") or "config"
        return _from_spec(dim, base, rule, layout, core_hf.rope_slice_from_hf(reference), head_dim, seq_len,
                          f"the {kind} config (rotary dim {dim}, base {base:g})")
    raise TypeError(
        f"reference must be a posenc RotaryEmbedding, a posenc.RopeSpec, a Hugging Face config (PretrainedConfig or "
        f"config.json dict) or a RopeReport from inspect_rope, got {type(reference).__name__}"
    )


def _from_spec(dim: int, base: float, rule: core_rope.RopeScaling | None, layout: str, rotary_slice: str,
               head_dim: int, seq_len: int, label: str) -> Expected:
    if dim > head_dim:
        raise ValueError(f"the reference rotates {dim} features but head_dim={head_dim}: pass the head dim of the "
                         f"model the reference describes")
    start = head_dim - dim if rotary_slice == "last" else 0
    half = dim // 2
    pairs = tuple((start + i, start + i + half) if layout == "half" else (start + 2 * i, start + 2 * i + 1)
                  for i in range(half))
    placement = "all" if dim == head_dim else "trailing" if rotary_slice == "last" else "leading"
    length = seq_len if rule is not None and rule.length_dependent else None
    freqs = _fit.rule_frequencies(dim, base, rule, length)
    factor = 1.0 if rule is None else rule.attention_factor_at(length)
    label = label if rule is None else f"{label[:-1]}, {_fit.describe_rule(rule)})"
    return Expected(tuple(range(start, start + dim)), pairs, layout, placement, dim, float(base), rule, freqs,
                    factor, "standard", label)


def _from_report(r: RopeReport) -> Expected:
    freqs = r.pair_frequencies
    return Expected(r.rotated, r.pairs, r.layout, r.placement, r.rotary_dim, r.base or math.nan, r.rule, freqs,
                    r.attention_factor, r.direction, "the reference implementation's report")


def assert_rope_close(
    fn: Any,
    reference: Any,
    *,
    head_dim: int,
    call: str = "auto",
    cos_sin: Any = None,
    qk_format: str = "bhsd",
    dtypes: Sequence[torch.dtype] = (torch.float32,),
    max_position: int = 4096,
    atol: float | None = None,
    freq_rtol: float = 1e-4,
    layer_type: str | None = None,
    device: Any = None,
) -> RopeReport:
    """Raise ``AssertionError`` unless ``fn`` rotates as ``reference`` does, naming what differs.

    Like ``torch.testing.assert_close`` for a rotary implementation, but the message says *what*
    differs: the rotated features (a partial rotary on the wrong slice), the pair layout, the
    direction, the base, which pairs a scaling rule changes (a rule applied to the wrong
    frequencies), the attention factor, decode at an offset, positions that collide, and the first
    position from which values pass ``atol``.

    Args:
        fn, call, cos_sin, qk_format, device: the implementation and how to call it, as in
            :func:`inspect_rope`.
        reference: a posenc ``RotaryEmbedding``, a :class:`posenc.RopeSpec`, a Hugging Face config
            (``PretrainedConfig`` or ``config.json`` dict) or a :class:`RopeReport` of another
            implementation.
        head_dim: features per head.
        dtypes: dtypes the values are compared in.
        max_position: the last position compared.
        atol: largest absolute difference of a cos/sin value from the reference's exact value (default per
            dtype: 1e-3 for float32, two units in the last place at 1 for 16-bit floats, 1e-9 for float64).
        freq_rtol: largest relative difference of a pair's frequency.
        layer_type: for a config with rope parameters per layer type.

    Returns:
        The :class:`RopeReport` of ``fn`` (when nothing differs).

    Raises:
        AssertionError: listing every difference found.
        TypeError, ValueError: bad arguments (named).

    Examples:
        >>> import posenc
        >>> rope = posenc.RotaryEmbedding(64, max_seq_len=4096)
        >>> other = posenc.RotaryEmbedding(64, max_seq_len=4096, layout="interleaved")
        >>> try:
        ...     assert_rope_close(lambda q, k, p: other(q, k, positions=p), rope, head_dim=64, max_position=256)
        ... except AssertionError as e:
        ...     print(str(e).splitlines()[1].split(":")[:2])
        ['  - pair layout', ' fn pairs (2i, 2i + 1) (interleaved); the reference pairs (i, i + 32) (half)']
    """
    max_position = _validate.check_int("max_position", max_position, minimum=16)
    freq_rtol = _validate.check_float("freq_rtol", freq_rtol, positive=True)
    if atol is not None:
        atol = _validate.check_float("atol", atol, positive=True)
    head_dim = _validate.check_int("head_dim", head_dim, minimum=2)
    want = expected_rope(reference, head_dim=head_dim, seq_len=max_position + 1, layer_type=layer_type)
    run = run_probes(fn, head_dim=head_dim, call=call, cos_sin=cos_sin, qk_format=qk_format, dtypes=dtypes,
                     max_position=max_position, threshold_ulps=2.0, device=device)
    got = run.report
    problems = _structure(got, want)
    if not problems:
        problems += _frequencies(got, want, freq_rtol)
    if not problems and abs(got.attention_factor / want.attention_factor - 1) > 1e-4:
        problems.append(f"attention factor: fn scales cos and sin by {got.attention_factor:.6g}; the reference by "
                        f"{want.attention_factor:.6g}" + _factor_hint(want))
    # what the comparison above names itself (direction, frequencies, attention factor) is not repeated
    problems += [f for f in got.findings if not f.startswith(("no known rule", "both q and k rotate by",
                                                             "cos and sin are scaled by"))]
    if not problems:
        problems += _values(run, want, atol)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise AssertionError(f"fn differs from {want.label}:\n{lines}\nfn: {got.fit.describe()}")
    return got


def _pairs_text(layout: str, rotary_dim: int) -> str:
    return {"half": f"(i, i + {rotary_dim // 2}) (half)", "interleaved": "(2i, 2i + 1) (interleaved)"}.get(
        layout, "features in another order")


def _structure(got: RopeReport, want: Expected) -> list[str]:
    out = []
    if set(got.rotated) != set(want.rotated):
        span = lambda r: f"{r[0]}..{r[-1]}" if r else "none"                 # noqa: E731
        if len(got.rotated) == len(want.rotated):
            out.append(f"rotated features: fn rotates features {span(got.rotated)} ({got.placement}); the reference "
                       f"rotates {span(want.rotated)} ({want.placement}): the partial rotary is on the wrong slice")
        else:
            out.append(f"rotary dim: fn rotates {len(got.rotated)} features ({span(got.rotated)}); the reference "
                       f"{len(want.rotated)} ({span(want.rotated)})")
        return out
    if set(got.pairs) != set(want.pairs):
        out.append(f"pair layout: fn pairs {_pairs_text(got.layout, got.rotary_dim)}; the reference pairs "
                   f"{_pairs_text(want.layout, want.rotary_dim)}: weights trained with one layout need "
                   f"posenc.convert_rope_weight (or layout=) for the other")
        return out
    if got.direction in ("reversed", "mixed") and want.direction == "standard":
        out.append(f"direction: fn rotates q by -theta ({got.direction}: e_a -> cos e_a - sin e_b); the reference by "
                   f"+theta: the sign of sin (or of rotate_half) is flipped")
    elif got.direction == "standard" and want.direction == "reversed":
        out.append("direction: fn rotates by +theta; the reference by -theta")
    return out


def _frequencies(got: RopeReport, want: Expected, rtol: float) -> list[str]:
    index = {pair: i for i, pair in enumerate(want.pairs)}
    mine = got.pair_frequencies
    theirs = np.array([want.freqs[index[pair]] for pair in got.pairs])
    off = np.abs(mine / theirs - 1) > rtol
    if not off.any():
        return []
    base = want.base
    worst = int(np.argmax(np.abs(mine / theirs - 1)))
    differ = (f"frequencies: {int(off.sum())} of {len(off)} pairs differ by more than {rtol:g} (pair {worst}: fn "
              f"{mine[worst]:.9g}, the reference {theirs[worst]:.9g})")
    if not math.isfinite(base):                          # a reference report whose frequencies fit no base
        return [differ]
    plain = _fit.rule_frequencies(want.rotary_dim, base, None)
    ref_order = np.array([index[pair] for pair in got.pairs])
    fn_scale, ref_scale = plain[ref_order] / mine, plain[ref_order] / theirs
    fn_scaled = np.nonzero(np.abs(fn_scale - 1) > rtol)[0]
    ref_scaled = np.nonzero(np.abs(ref_scale - 1) > rtol)[0]
    fit = got.fit
    if fit.matched and fit.base is not None:
        said = []
        if fit.base != base:
            said.append(f"base: fn's frequencies are base^(-2i/d) with base={fit.base:g}; the reference's base={base:g}")
        if fit.rule != want.rule and fit.rule is not None:
            said.append(f"scaling: fn applies {_fit.describe_rule(fit.rule)}; the reference "
                        + ("has no scaling" if want.rule is None else f"applies {_fit.describe_rule(want.rule)}"))
        elif fit.rule != want.rule:
            said.append(f"scaling: fn leaves every frequency at base^(-2i/d); the reference ({_fit.describe_rule(want.rule)}) "
                        f"changes {_pair_set(ref_scaled, plain[ref_order])}: the scaling rule is ignored")
        if said:
            return said
    if want.rule is not None and not np.array_equal(fn_scaled, ref_scaled):
        return [f"scaled pairs: fn changes the frequencies of {_pair_set(fn_scaled, plain[ref_order])}; the reference "
                f"({_fit.describe_rule(want.rule)}) changes {_pair_set(ref_scaled, plain[ref_order])}: the scaling is "
                f"applied to the wrong frequencies"]
    return [f"{differ}; fn's {_fit.scale_runs(mine, want.rotary_dim, base)} of base^(-2i/d), the reference's "
            f"{_fit.scale_runs(theirs, want.rotary_dim, base)}"]


def _pair_set(idx: np.ndarray, plain: np.ndarray) -> str:
    if not len(idx):
        return "no pair"
    waves = 2 * math.pi / plain[idx]
    return (f"pairs {idx.min()}..{idx.max()} ({len(idx)} pairs; wavelengths {waves.min():.4g} to {waves.max():.4g} "
            f"positions)")


def _factor_hint(want: Expected) -> str:
    if isinstance(want.rule, core_rope.YarnScaling):
        return " (YaRN multiplies cos and sin by its temperature 0.1 ln(factor) + 1 unless attention_factor is set)"
    return ""


def _values(run: Any, want: Expected, atol: float | None) -> list[str]:
    out = []
    positions = np.arange(run.report.max_position + 1, dtype=np.float64)
    index = {pair: i for i, pair in enumerate(want.pairs)}
    freqs = tuple(float(want.freqs[index[pair]]) for pair in run.ordered)
    sin, cos = exact.sin_cos(positions, exact.turns_split(freqs))
    a = np.array([p[0] for p in run.ordered])
    b = np.array([p[1] for p in run.ordered])
    target = np.concatenate((cos, sin * run.signs), 1) * want.attention_factor
    for dtype, full in run.full.items():
        tol = _ATOL.get(dtype, 1e-3) if atol is None else atol
        err = np.abs(np.concatenate((full[:, a], full[:, b]), 1) - target).max(1)
        over = np.nonzero(err > tol)[0]
        if len(over):
            out.append(f"values ({str(dtype).removeprefix('torch.')}): cos/sin differ from the reference's exact values "
                       f"by up to {err.max():.3g} (atol {tol:g}) from position {int(over[0])} on")
    return out
