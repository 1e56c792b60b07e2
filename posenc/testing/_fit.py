"""The known rule closest to a set of measured rotary frequencies, and small numeric helpers.

Frequencies measured from an implementation are compared with posenc's exact frequencies of each
rule (:mod:`posenc.core.rope`): plain ``base^(-2i/d)``, linear position interpolation, Llama 3's
frequency bands and YaRN's ramp, over the parameter values published configurations use.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from posenc.core import rope as core_rope

#: The original length of a per-pair (LongRoPE) fit, whose short and long factors are the same measured ones.
_ANY_LENGTH = 2**53
#: NTK-aware factors tried when a fitted base is not round (Code Llama's and Hunyuan's among them).
_NTK_FACTORS = (2.0, 3.0, 4.0, 8.0, 16.0, 32.0, 64.0, 100.0, 1000.0)
#: Bases tried for per-pair (LongRoPE) factors when the fitted one is not round.
_ROUND_BASES = (1e4, 5e4, 1e5, 5e5, 1e6, 2e6, 5e6, 1e7, 1e8)
#: Original context lengths tried for the rules that have one (powers of two, 512 .. 262144).
_LENGTHS = tuple(2**k for k in range(9, 19))
#: (low_freq_factor, high_freq_factor) pairs tried for Llama 3's rule (Llama 3.1: (1, 4)).
_LLAMA3_BANDS = ((1.0, 4.0), (1.0, 2.0), (2.0, 4.0), (1.0, 8.0), (1.0, 1.0), (2.0, 8.0), (4.0, 4.0))
#: (beta_fast, beta_slow, truncate) tried for YaRN (the paper's 32 and 1, with and without rounding).
_YARN_BETAS = ((32.0, 1.0, True), (32.0, 1.0, False))


@dataclasses.dataclass(frozen=True)
class RuleFit:
    """The closest known rule: ``base``, ``rule`` (None: plain RoPE) and the largest relative
    frequency difference ``error`` from it; ``rule`` is None and ``matched`` False when no rule
    came within the tolerance (then ``base`` is the fastest pairs' base)."""

    base: float | None
    rule: core_rope.RopeScaling | None
    error: float
    matched: bool

    def describe(self) -> str:
        if self.base is None:
            return "no frequencies to fit"
        what = describe_rule(self.rule)
        if not self.matched:
            return f"none within tolerance; nearest: base={self.base:g}, {what} (frequencies differ by up to {self.error:.2g})"
        return f"base={self.base:g}, {what}"


def snap(x: float, rtol: float = 1e-6) -> float:
    """``x`` rounded to the fewest significant digits (up to 7) within ``rtol``: fitted 9999.99999 -> 10000."""
    if not math.isfinite(x) or x == 0:
        return x
    for digits in range(1, 8):
        r = float(f"{x:.{digits - 1}e}")
        if abs(r - x) <= rtol * abs(x):
            return r
    return x


def rule_frequencies(dim: int, base: float, rule: core_rope.RopeScaling | None,
                     seq_len: int | None = None) -> np.ndarray:
    """float64 frequencies ``(dim/2,)`` of ``rule`` (posenc's exact values, rounded once)."""
    return np.array([float(f) for f in core_rope.frequencies(dim, base, rule, seq_len)], dtype=np.float64)


def _error(freqs: np.ndarray, other: np.ndarray) -> float:
    return float(np.max(np.abs(other / freqs - 1.0)))


def closest_rule(freqs: np.ndarray, dim: int, *, tol: float = 1e-4) -> RuleFit:
    """The rule whose frequencies for rotary ``dim`` lie closest to ``freqs`` (``(dim/2,)``, positive).

    Every rule here keeps the ratio of neighbouring frequencies at ``base^(2/d)`` over a band of
    pairs (all of them for plain RoPE and linear interpolation; the fast and the slow band for
    Llama 3 and YaRN), so the base comes from the longest run of equal ratios; the per-pair scale
    ``base^(-2i/d) / theta_i`` then tells the rules apart, tried over common parameters.  ``tol`` is the
    largest relative frequency difference that still matches.  The base is rounded to fewer digits
    only where the rounded base fits the run as well as the measured one (500000 for 499999.99, but
    500042 stays).
    """
    n = len(freqs)
    if n == 0 or not np.all(freqs > 0):
        return RuleFit(None, None, math.inf, False)
    if n == 1:                                           # one pair: any base gives frequency 1
        base = 10000.0
    else:
        raw, run = _run_base(freqs, dim)
        base = _rounded(raw, freqs, dim, run)
    if not base > 1:
        return RuleFit(None, None, math.inf, False)
    plain = rule_frequencies(dim, base, None)
    scale = plain / freqs
    fits = [_ntk(base, dim, RuleFit(base, None, _error(freqs, plain), True), freqs)]
    top = snap(float(np.max(scale)), 1e-4)
    if top > 1:
        for rule in _candidates(top, uniform=bool(np.ptp(scale) <= tol * top)):
            try:
                other = rule_frequencies(dim, base, rule)
            except ValueError:                           # a Llama 3 band edge exactly on a pair
                continue
            fits.append(RuleFit(base, rule, _error(freqs, other), True))
    best = min(fits, key=lambda f: f.error)
    if best.error <= tol:
        return best
    for candidate in ((base,) if _digits(base) <= 3 else ()) + _ROUND_BASES:
        per_pair = _per_pair(rule_frequencies(dim, candidate, None) / freqs, tol)
        if per_pair is not None:
            return RuleFit(candidate, per_pair, _error(freqs, rule_frequencies(dim, candidate, per_pair)), True)
    if fits[0].error <= 10 * best.error:                 # no rule fits: name the plain base unless a rule is far closer
        best = fits[0]
    return dataclasses.replace(best, matched=False)


def _rounded(raw: float, freqs: np.ndarray, dim: int, run: tuple[int, int]) -> float:
    """``raw`` rounded to the fewest digits whose plain frequencies fit the run's pairs about as well as
    ``raw``'s (the measurement's own rounding, ~1e-7 in float32, sets the scale)."""
    s, t = run
    idx = np.arange(s, t + 1)

    def off(base: float) -> float:
        plain = rule_frequencies(dim, base, None)[idx]
        ratio = plain / freqs[idx]
        return float(np.max(np.abs(ratio / ratio[0] - 1)))      # a constant factor (a rule) does not count

    if not raw > 1:
        return raw
    allowed = max(3 * off(raw), 1e-7)
    for digits in range(1, 8):
        candidate = float(f"{raw:.{digits - 1}e}")
        if candidate > 1 and off(candidate) <= allowed:
            return candidate
    return float(f"{raw:.9g}")


def _per_pair(scale: np.ndarray, tol: float) -> core_rope.LongRopeScaling | None:
    """LongRoPE's form, one factor per pair, when no parametric rule fits: every factor stretches (>= 1)
    and the factors grow with the wavelength (a dip of 2% allowed), as searched factors do; a pattern that
    scales fast pairs more than slow ones is no rule's.  Per-pair factors can absorb any base; the base is
    the one read from the run of pairs the factors leave in a geometric sequence (the fast pairs, which
    LongRoPE keeps near 1)."""
    if np.any(scale < 1 - tol) or np.any(scale[1:] < 0.98 * scale[:-1]) or scale[0] > 1.25:
        return None
    factors = tuple(snap(float(x), 1e-6) for x in scale)
    return core_rope.LongRopeScaling(factors, factors, _ANY_LENGTH)


def describe_rule(rule: core_rope.RopeScaling | None) -> str:
    """A rule in a few words: its class and the fields that differ from their defaults."""
    if rule is None:
        return "default (no scaling)"
    if isinstance(rule, core_rope.LongRopeScaling):                # factor lists in a few words
        extra = "" if rule.attention_factor_override is None else f", attention_factor={rule.attention_factor():g}"
        short = f"{min(rule.short_factor):g} to {max(rule.short_factor):g}"
        if rule.original_max_seq_len == _ANY_LENGTH:
            return f"LongRopeScaling(one factor per pair, {short}{extra})"
        return (f"LongRopeScaling(short factors {short}, long factors {min(rule.long_factor):g} to "
                f"{max(rule.long_factor):g}, original_max_seq_len={rule.original_max_seq_len}, "
                f"factor={rule.factor:g}{extra})")
    shown = []
    for field in dataclasses.fields(rule):
        value = getattr(rule, field.name)
        if field.default is dataclasses.MISSING or value != field.default:
            shown.append(f"{field.name}={value:g}" if isinstance(value, float) else f"{field.name}={value!r}")
    return f"{type(rule).__name__}({', '.join(shown)})"


def _digits(x: float) -> int:
    """Significant digits ``x`` needs (10000 -> 1, 41817.1 -> 6)."""
    return next((k for k in range(1, 17) if float(f"{x:.{k - 1}e}") == x), 17)


def _ntk(base: float, dim: int, plain: RuleFit, freqs: np.ndarray) -> RuleFit:
    """NTK-aware scaling is plain RoPE with the base ``b * s^(d/(d-2))``: when the fitted base is not a
    round number but ``base / s^(d/(d-2))`` is a one- or two-digit one for a common factor ``s`` and
    fits as well, name the rule (the same frequencies)."""
    if dim <= 2 or _digits(base) <= 3 or plain.error > 1e-5:      # round already, or not geometric at all
        return plain
    for factor in _NTK_FACTORS:
        original = float(f"{base / factor ** (dim / (dim - 2)):.1e}")
        rule = core_rope.NTKScaling(factor)
        error = _error(freqs, rule_frequencies(dim, original, rule))
        if error <= max(2 * plain.error, 2e-7):
            return RuleFit(original, rule, error, True)
    return plain


def scale_runs(freqs: np.ndarray, dim: int, base: float, *, rtol: float = 1e-4) -> str:
    """The per-pair scale ``base^(-2i/d) / theta_i`` in words, runs of equal values joined:
    ``"pairs 0..19: 1; 20..25: 1.2 to 6.5; 26..31: 8"``."""
    scale = rule_frequencies(dim, base, None) / freqs
    same = np.abs(scale[1:] / scale[:-1] - 1) <= rtol             # pair i + 1 scaled as pair i
    parts, i, n = [], 0, len(scale)
    while i < n:
        j = i
        if i + 1 < n and same[i]:
            while j + 1 < n and same[j]:
                j += 1
            parts.append(f"{i}..{j}: {snap(float(scale[i]), 1e-4):g}")
        else:
            while j + 1 < n and not same[j] and not (j + 2 < n and same[j + 1]):
                j += 1
            value = f"{snap(float(scale[i]), 1e-3):g}"
            parts.append(f"{i}: {value}" if j == i else f"{i}..{j}: {value} to {snap(float(scale[j]), 1e-3):g}")
        i = j + 1
    return "pairs " + "; ".join(parts)


def _run_base(freqs: np.ndarray, dim: int) -> tuple[float, tuple[int, int]]:
    """``(base, (s, t))``: the base from the longest run of pairs ``s .. t`` whose neighbours' ratios agree
    (to 1e-4), read between the run's two ends (the longer the lever, the less rounding matters); the
    fastest run wins a tie."""
    steps = np.log(freqs[:-1] / freqs[1:])                   # log(theta_i / theta_{i+1}) = (2/d) log base
    best, start = (0, 1), 0
    for i in range(1, len(steps) + 1):
        if i == len(steps) or abs(steps[i] - steps[start]) > 1e-4 * abs(steps[start]):
            if i - start > best[1] - best[0]:
                best = (start, i)
            start = i
    s, t = best                                              # steps s .. t-1: pairs s .. t
    return math.exp(math.log(freqs[s] / freqs[t]) * dim / (2 * (t - s))), best


def _candidates(factor: float, *, uniform: bool) -> list[core_rope.RopeScaling]:
    out: list[core_rope.RopeScaling] = [core_rope.LinearScaling(factor)]
    if uniform:                                          # every pair scaled alike: linear interpolation
        return out
    for length in _LENGTHS:
        for low, high in _LLAMA3_BANDS:
            out.append(core_rope.Llama3Scaling(factor, length, low_freq_factor=low, high_freq_factor=high))
        for fast, slow, truncate in _YARN_BETAS:
            out.append(core_rope.YarnScaling(factor, length, beta_fast=fast, beta_slow=slow, truncate=truncate))
    return out


def frequencies_from_angles(theta: np.ndarray) -> np.ndarray:
    """Each column's frequency from its angles ``theta`` ``(P, n)`` (mod 2 pi) at positions ``0 .. P-1``:
    read at position 1, then refined at positions 2, 4, 8, ... (the turns counted from the estimate so
    far).  Powers of two are exact in every float format, so a table whose positions were rounded to a
    16-bit float still gives the frequencies it was built with."""
    omega = theta[1].copy()
    p = 2
    while p < theta.shape[0]:
        turns = np.round((omega * p - theta[p]) / (2 * math.pi))
        omega = (theta[p] + 2 * math.pi * turns) / p
        p *= 2
    return omega


def ulps(values: np.ndarray, exact: np.ndarray, finfo: Any) -> np.ndarray:
    """``|values - exact|`` in units of the last place of the dtype described by ``finfo``, at ``exact``."""
    mag = np.maximum(np.abs(exact), float(finfo.tiny))
    spacing = np.exp2(np.floor(np.log2(mag))) * float(finfo.eps)
    return np.abs(values - exact) / spacing
