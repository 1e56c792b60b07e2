"""What a rotary implementation computes, found by calling it on chosen inputs.

:func:`inspect_rope` never reads the code it inspects.  It rotates unit vectors and sums of them at
chosen positions and reads back, from the outputs alone:

- which features rotate and how they pair up (the pair layout, or an explicit list of pairs);
- the direction of the rotation, for queries and keys apart;
- each pair's frequency (fitted over positions ``1, 2, 4, ...``) and the attention factor;
- the known rule closest to those frequencies (plain RoPE with its base, linear interpolation,
  NTK-aware scaling, Llama 3's bands, YaRN, or LongRoPE's one factor per pair when no formula
  fits);
- whether attention scores depend only on the distance (the relative property of RoFormer, Su et al.
  2021, arXiv:2104.09864, section 3.4.2), and whether a single-token call (decode) rotates a token
  as its position says;
- its precision per dtype and position range against posenc's exact tables (:mod:`posenc.core.exact`):
  the largest error in units of the dtype's last place (ulp), and the first position where it passes a
  threshold; positions that get the same rotation as their successor (a table or positions held in a
  16-bit float, where 256 and 257 collide) are named.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from posenc import _validate
from posenc.core import exact
from posenc.core import rope as core_rope
from posenc.testing import _fit
from posenc.testing._probe import Probe

#: Position ranges the precision table is split into (the last one ends at ``max_position``).
_RANGE_EDGES = (0, 256, 2048, 16384, 131072)
#: Distances and start positions of the relative-property check.
_DISTANCES = (0, 1, 3, 50, -7)
_STARTS = (0, 1, 17, 300, 1000, 4000)
#: Positions at which a single-token call is compared with the same token inside a full call.
_DECODE_POSITIONS = (0, 1, 5, 300, 4095)


@dataclasses.dataclass(frozen=True)
class PrecisionRow:
    """Largest error of one dtype over positions ``[start, stop)`` (``stop`` exclusive)."""

    dtype: str
    start: int
    stop: int
    max_ulps: float
    max_abs: float


@dataclasses.dataclass(frozen=True)
class RopeReport:
    """What :func:`inspect_rope` found.  ``print(report)`` shows it as a table; ``findings`` lists the
    problems it found on its own (without a reference to compare with), in words.

    Attributes:
        head_dim: features per head probed.
        call: how ``fn`` was called (``"rotate"``, ``"cos_sin"`` or ``"apply"``).
        rotated: indices of the features that rotate.
        placement: ``"all"``, ``"leading"``, ``"trailing"``, ``"whole head"`` (pairs span the head but
            some have zero frequency) or ``"scattered"``.
        layout: ``"half"`` (pairs ``i, i + r/2`` of the ``r`` rotated features), ``"interleaved"``
            (``2i, 2i + 1``), ``"permutation"`` (another pairing; see ``pairs``) or ``"none"``.
        pairs: the pairs ``(a, b)`` in frequency order (pair ``i`` of the rule); ``e_a`` turns towards ``e_b``.
        slots: each pair's index into ``frequencies``.
        rotary_dim: ``2 * len(frequencies)``: the rotary dim the frequencies are indexed by.
        direction, key_direction: ``"standard"`` (``e_a -> cos e_a + sin e_b``, RoFormer's), ``"reversed"``
            (by ``-theta``), ``"mixed"``, or ``"assumed standard"`` (``call="cos_sin"``: only cos/sin are seen).
        frequencies: fitted angular frequency per pair (radians per position), float64; 0 for a pair slot
            that does not rotate.
        attention_factor: the factor on cos and sin (1 for plain RoPE, YaRN's temperature for YaRN).
        fit: the closest known rule (:class:`posenc.testing.RuleFit`).
        relative_error: largest spread of the score ``q_m . k_n`` over pairs with the same ``m - n``,
            relative to ``|q| |k|``.
        decode: None when single-token calls agree with full calls, else what differs.
        collision: the first position ``p`` rotated exactly as ``p + 1``, or None.
        precision: one :class:`PrecisionRow` per dtype and position range.
        first_over: per dtype, the first position whose error exceeds ``threshold_ulps``, or None.
        threshold_ulps: the threshold of ``first_over``.
        max_position: the last position probed.
        findings: problems found, in words (empty: none).
    """

    head_dim: int
    call: str
    rotated: tuple[int, ...]
    placement: str
    layout: str
    pairs: tuple[tuple[int, int], ...]
    slots: tuple[int, ...] = dataclasses.field(repr=False)
    rotary_dim: int
    direction: str
    key_direction: str
    frequencies: np.ndarray = dataclasses.field(repr=False)
    attention_factor: float
    fit: _fit.RuleFit
    relative_error: float
    decode: str | None
    collision: int | None
    precision: tuple[PrecisionRow, ...]
    first_over: dict[str, int | None]
    threshold_ulps: float
    max_position: int
    findings: tuple[str, ...]

    @property
    def base(self) -> float | None:
        """The base of the closest rule (None when nothing rotates)."""
        return self.fit.base

    @property
    def rule(self) -> core_rope.RopeScaling | None:
        """The scaling rule of the closest match (None: plain RoPE, or no match; see ``fit.matched``)."""
        return self.fit.rule

    @property
    def pair_frequencies(self) -> np.ndarray:
        """The frequency of each of ``pairs``, in their order."""
        return self.frequencies[list(self.slots)]

    @property
    def relative(self) -> bool:
        """Whether attention scores depend only on the distance (within 1e-2 of ``|q| |k|``)."""
        return self.relative_error <= 1e-2

    def __str__(self) -> str:
        rows = [
            ("rotated features", _describe_rotated(self)),
            ("pair layout", _describe_layout(self)),
            ("direction", f"q: {self.direction}, k: {self.key_direction}"),
            ("closest rule", self.fit.describe()),
            *([("scale per pair", _fit.scale_runs(self.frequencies, self.rotary_dim, self.fit.base))]
              if self.fit.base and (self.fit.rule is not None or not self.fit.matched) else []),
            ("attention factor", f"{self.attention_factor:.6g}"),
            ("relative property", ("holds" if self.relative else "FAILS") +
             f" (score spread {self.relative_error:.2g} of |q||k| at equal distance)"),
            ("decode (one token)", self.decode or "same rotation as inside a full call"),
            ("collisions", "none" if self.collision is None else
             f"positions {self.collision} and {self.collision + 1} get the same rotation"),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"RoPE report: head_dim={self.head_dim}, call={self.call!r}, positions 0..{self.max_position}"]
        lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
        lines.append("  precision against posenc's exact table, in ulp of the dtype:")
        lines.append("    dtype      positions        max ulp     max abs")
        for r in self.precision:
            lines.append(f"    {r.dtype:<9}  {f'{r.start}..{r.stop - 1}':<15}  {r.max_ulps:>8.3g}  {r.max_abs:>10.3g}")
        for dtype, first in self.first_over.items():
            lines.append(f"    {dtype}: " + ("within the threshold everywhere" if first is None else
                                            f"first position over {self.threshold_ulps:g} ulp: {first}"))
        lines.append("  findings:" + (" none" if not self.findings else ""))
        lines += [f"    - {f}" for f in self.findings]
        return "\n".join(lines)


def _describe_rotated(r: RopeReport) -> str:
    if not r.rotated:
        return f"none of {r.head_dim}"
    span = f"{r.rotated[0]}..{r.rotated[-1]}"
    return f"{len(r.rotated)} of {r.head_dim} ({r.placement}: features {span}); rotary dim {r.rotary_dim}"


def _describe_layout(r: RopeReport) -> str:
    if r.layout == "half":
        return f"half: pairs (i, i + {r.rotary_dim // 2})"
    if r.layout == "interleaved":
        return "interleaved: pairs (2i, 2i + 1)"
    if r.layout == "permutation":
        shown = ", ".join(f"({a}, {b})" for a, b in r.pairs[:4])
        return f"another pairing: {shown}{', ...' if len(r.pairs) > 4 else ''}"
    if r.layout.startswith("from the cos table"):
        return r.layout
    return r.layout


# ---- the probe -----------------------------------------------------------------------------------


def inspect_rope(
    fn: Any,
    *,
    head_dim: int,
    call: str = "auto",
    cos_sin: Any = None,
    qk_format: str = "bhsd",
    dtypes: Sequence[torch.dtype] = (torch.float32,),
    max_position: int = 8192,
    threshold_ulps: float = 2.0,
    device: Any = None,
) -> RopeReport:
    """Find what a rotary position embedding computes, by calling it on chosen inputs.

    Args:
        fn: the implementation: ``fn(q, k, positions) -> (q, k)`` (``call="rotate"``), a module
            ``fn(x, positions) -> (cos, sin)`` such as a Hugging Face ``*RotaryEmbedding``
            (``call="cos_sin"``), or ``fn(q, k, cos, sin) -> (q, k)`` with ``cos_sin=`` the table module
            (``call="apply"``, e.g. ``apply_rotary_pos_emb``).  ``"auto"`` picks ``"apply"`` when
            ``cos_sin`` is given, else by the number of required positional parameters (3 or 2).
        head_dim: features per head.
        call: see ``fn``.
        cos_sin: the table module for ``call="apply"``.
        qk_format: ``"bhsd"`` (q ``(B, H, S, D)``, Hugging Face and posenc's modules) or ``"bshd"``.
        dtypes: dtypes to measure precision in; the first one is also used to fit the frequencies.
        max_position: last position probed (a full call covers ``0 .. max_position``).
        threshold_ulps: error, in ulps of the dtype, past which ``first_over`` reports a position.
        device: where the probes live (default CPU).

    Returns:
        A :class:`RopeReport`.

    Raises:
        TypeError: ``fn`` not callable, or returning something other than two tensors.
        ValueError: a bad argument, or outputs whose shape is not the inputs'.

    Examples:
        >>> import posenc
        >>> rope = posenc.RotaryEmbedding(64, max_seq_len=4096, base=10000.0)
        >>> report = inspect_rope(lambda q, k, p: rope(q, k, positions=p), head_dim=64, max_position=512)
        >>> report.layout, report.direction, report.base, report.rule, report.findings
        ('half', 'standard', 10000.0, None, ())
    """
    return run_probes(fn, head_dim=head_dim, call=call, cos_sin=cos_sin, qk_format=qk_format, dtypes=dtypes,
                      max_position=max_position, threshold_ulps=threshold_ulps, device=device).report


@dataclasses.dataclass(frozen=True)
class ProbeRun:
    """A report with the outputs it was read from: ``full[dtype]`` ``(S, D)`` is the rotated sum of the
    pairs' first unit vectors at positions ``0 .. max_position``; ``ordered[i]`` is pair ``i``'s
    features and ``signs[i]`` its direction."""

    report: RopeReport
    full: dict[torch.dtype, np.ndarray]
    ordered: list[tuple[int, int]]
    signs: np.ndarray


def run_probes(fn: Any, *, head_dim: int, call: str, cos_sin: Any, qk_format: str, dtypes: Sequence[torch.dtype],
               max_position: int, threshold_ulps: float, device: Any) -> ProbeRun:
    """:func:`inspect_rope`, keeping the probe outputs (for :func:`posenc.testing.assert_rope_close`)."""
    max_position = _validate.check_int("max_position", max_position, minimum=16)
    threshold_ulps = _validate.check_float("threshold_ulps", threshold_ulps, positive=True)
    dtypes = _check_dtypes(dtypes)
    probe = Probe(fn, head_dim=head_dim, call=call, cos_sin=cos_sin, qk_format=qk_format, device=device)
    d = probe.head_dim
    findings: list[str] = []

    # 1. unit vectors at positions 0..3: which features rotate, their pairs, the direction
    eye = np.repeat(np.eye(d)[:, None, :], 4, axis=1)                  # (D, 4, D): e_j at every position
    uq, uk = probe.rotate(eye, eye, np.arange(4), dtypes[0])
    pairs_q, dir_q, mix_q = _pairs(uq)
    pairs_k, dir_k, mix_k = _pairs(uk)
    for who, mix in (("q", mix_q), ("k", mix_k)):
        if mix:
            findings.append(f"{who}: {mix}")
    if sorted(pairs_q) != sorted(pairs_k):
        findings.append("q and k rotate different feature pairs: attention scores are not a function of the "
                        "distance")
    rotated = tuple(sorted(j for pair in pairs_q for j in pair))
    if not rotated:
        findings.append("no feature rotates: fn ignores the positions (or rotates by zero angles)")
    layout, placement, slots, rotary_dim = _layout(pairs_q, d)
    if probe.call == "cos_sin" and probe.table_layout == "per-pair":
        layout = "from the cos table: one value per pair (the layout is the apply function's)"
    direction, key_direction = _direction(pairs_q, dir_q), _direction(pairs_k, dir_k)
    if probe.call == "cos_sin":
        direction = key_direction = "assumed standard"
    elif rotated and direction != key_direction:
        findings.append(f"q rotates {direction} but k rotates {key_direction}: scores then depend on the sum of the "
                        "positions, not on their distance")
    elif direction == "reversed":
        findings.append("both q and k rotate by -theta (e_a -> cos e_a - sin e_b): the mirror image of RoFormer's "
                        "rotation, so weights trained with the usual direction read every distance negated")
    elif direction == "mixed":
        findings.append("some pairs rotate by +theta and others by -theta")
    zero = uq[:, 0, :]
    factor0 = float(np.median([zero[a, a] for a, _ in pairs_q])) if pairs_q else 1.0
    if pairs_q and not np.allclose(zero, np.diag(np.where(np.isin(np.arange(d), rotated), factor0, 1.0)),
                                   atol=1e-3 * abs(factor0)):
        findings.append("position 0 is not the identity: positions are shifted (or an offset is added)")

    # 2. one probe vector at every position 0..max_position, in each dtype: frequencies and precision
    positions = np.arange(max_position + 1)
    v = np.zeros((1, len(positions), d))
    for a, _ in pairs_q:
        v[0, :, a] = 1.0
    full = {dt: probe.rotate(v, v, positions, dt)[0][0] for dt in dtypes}            # (S, D) per dtype
    # frequencies are fitted from float32 outputs whatever dtypes holds: a 16-bit output rounds cos and sin
    # to 3 digits, too coarse to tell rules apart (float64, when asked for, is finer still)
    fit_dtype = torch.float64 if torch.float64 in full else torch.float32
    first = full[fit_dtype] if fit_dtype in full else probe.rotate(v, v, positions, fit_dtype)[0][0]
    ordered = [pairs_q[j] for j in slots]                                            # pair of each slot
    signs = np.array([dir_q[p] for p in ordered]) if ordered else np.zeros(0)
    freqs_fit, factor = _fit_frequencies(first, ordered, signs)
    frequencies = np.zeros(rotary_dim // 2)
    if layout == "permutation":
        order = np.argsort(-freqs_fit, kind="stable")
        ordered, freqs_fit, signs = [ordered[i] for i in order], freqs_fit[order], signs[order]
    slot_index = _slot_index(ordered, layout, rotary_dim, rotated, d)
    frequencies[slot_index] = freqs_fit
    fit = _fit.closest_rule(frequencies, rotary_dim) \
        if np.all(frequencies > 0) else \
        _fit.RuleFit(None, None, math.inf, False)
    if rotated and fit.base is None:
        findings.append("the frequencies could not be fitted (a pair with zero frequency, or fewer than one per slot)")
    elif rotated and not fit.matched and fit.base is not None:
        findings.append(f"no known rule matches the frequencies (nearest: base={fit.base:g}, "
                        f"{_fit.describe_rule(fit.rule)}, off by up to {fit.error:.2g}; "
                        f"{_fit.scale_runs(frequencies, rotary_dim, fit.base)} of base^(-2i/d))")
    fit = _with_factor(fit, factor, findings) if rotated else fit

    # 3. the relative property, 4. decode, 5. collisions and precision
    relative_error = _relative(probe, d, max_position, fit_dtype) if rotated else 0.0
    if rotated and relative_error > 1e-2:
        findings.append(f"attention scores at the same distance differ by up to {relative_error:.2g} of |q||k|: "
                        "the relative property fails")
    decode = _decode(probe, v, first, max_position, fit_dtype) if rotated else None
    if decode is not None:
        findings.append(decode)
    collision = _collision(full, rotated)
    if collision is not None:
        findings.append(f"positions {collision} and {collision + 1} get the same rotation: the angles or the "
                        "positions are held in a 16-bit float (bfloat16 holds integers exactly only up to 256)")
    reference = fit.rule if fit.matched else None
    ref_freqs = _fit.rule_frequencies(rotary_dim, fit.base, reference) if fit.matched and fit.base else frequencies
    ref_factor = reference.attention_factor() if reference is not None else _fit.snap(factor, 1e-4)
    precision, first_over = _precision(full, ordered, signs, ref_freqs[slot_index] if len(slot_index) else ref_freqs,
                                       ref_factor, positions, threshold_ulps)
    report = RopeReport(
        head_dim=d, call=probe.call, rotated=rotated, placement=placement, layout=layout, pairs=tuple(ordered),
        slots=tuple(int(i) for i in slot_index),
        rotary_dim=rotary_dim, direction=direction, key_direction=key_direction, frequencies=frequencies,
        attention_factor=factor, fit=fit, relative_error=relative_error, decode=decode, collision=collision,
        precision=precision, first_over=first_over, threshold_ulps=threshold_ulps, max_position=max_position,
        findings=tuple(findings),
    )
    return ProbeRun(report, full, ordered, signs)


def _with_factor(fit: _fit.RuleFit, factor: float, findings: list[str]) -> _fit.RuleFit:
    """The fit with the measured attention factor: YaRN and LongRoPE take any factor (``attention_factor``,
    or YaRN's ``mscale`` pair as DeepSeek sets it); for the other rules a factor other than theirs is a
    finding."""
    rule = fit.rule
    expected = 1.0 if rule is None else rule.attention_factor()
    if not fit.matched or abs(factor - expected) <= 1e-3 * max(abs(factor), 1e-30):
        return fit
    if isinstance(rule, (core_rope.YarnScaling, core_rope.LongRopeScaling)) and factor > 0:
        return dataclasses.replace(fit, rule=dataclasses.replace(rule, attention_factor_override=_fit.snap(factor, 1e-5)))
    findings.append(f"cos and sin are scaled by {factor:.6g}, which {_fit.describe_rule(rule)} does not do "
                    f"(its factor is {expected:g})")
    return fit


def _check_dtypes(dtypes: Any) -> tuple[torch.dtype, ...]:
    if isinstance(dtypes, torch.dtype):
        dtypes = (dtypes,)
    if not isinstance(dtypes, (tuple, list)) or not dtypes:
        raise TypeError(f"dtypes must be a non-empty sequence of torch floating dtypes, got {dtypes!r}")
    for dt in dtypes:
        if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
            raise TypeError(f"dtypes must hold torch floating dtypes (e.g. torch.float32, torch.bfloat16), got {dt!r}")
    return tuple(dtypes)


def _pairs(images: np.ndarray) -> tuple[list[tuple[int, int]], dict[tuple[int, int], int], str]:
    """Pairs ``(a, b)`` (``a < b``) from the images of the unit vectors ``(D, 4, D)`` at positions
    0..3, the sign of ``e_a``'s image at ``b`` per pair, and a note when the images mix more than pairs."""
    d = images.shape[0]
    mixed = np.abs(images[:, 1:, :]).sum(1)                   # (D, D): where e_j went, over positions 1..3
    np.fill_diagonal(mixed, 0.0)
    pairs, signs, notes = [], {}, ""
    for j in range(d):
        row = mixed[j]
        if row.max() <= 0:
            continue
        partner = int(row.argmax())
        if (row > 1e-6 * row.max()).sum() > 1:
            notes = f"feature {j} is mixed with more than one other feature (not a rotation of pairs)"
        if j < partner:
            pairs.append((j, partner))
            at = next((p for p in (1, 2, 3) if images[j, p, partner] != 0), 1)
            signs[(j, partner)] = 1 if images[j, at, partner] > 0 else -1
    return pairs, signs, notes


def _direction(pairs: list[tuple[int, int]], signs: dict[tuple[int, int], int]) -> str:
    values = {signs[p] for p in pairs}
    if not values:
        return "none"
    return "standard" if values == {1} else "reversed" if values == {-1} else "mixed"


def _layout(pairs: list[tuple[int, int]], d: int) -> tuple[str, str, list[int], int]:
    """``(layout, placement, slots, rotary_dim)``: ``slots`` orders ``pairs`` by pair index."""
    if not pairs:
        return "none", "none", [], 0
    rotated = sorted(j for p in pairs for j in p)
    n = len(rotated)
    r0 = rotated[0]
    contiguous = rotated == list(range(r0, r0 + n))
    by_first = sorted(range(len(pairs)), key=lambda i: pairs[i][0])
    placement = "all" if n == d else "leading" if r0 == 0 and contiguous else \
        "trailing" if contiguous and r0 + n == d else "scattered"
    as_set = set(pairs)
    if contiguous and as_set == {(r0 + i, r0 + i + n // 2) for i in range(n // 2)}:
        return "half", placement, by_first, n
    if contiguous and as_set == {(r0 + 2 * i, r0 + 2 * i + 1) for i in range(n // 2)}:
        return "interleaved", placement, by_first, n
    if d % 2 == 0 and all(b == a + d // 2 for a, b in pairs):
        return "half", "whole head", by_first, d                  # some pairs of the head have zero frequency
    if all(a % 2 == 0 and b == a + 1 for a, b in pairs):
        return "interleaved", "whole head", by_first, d
    return "permutation", placement, by_first, 2 * len(pairs)


def _slot_index(ordered: list[tuple[int, int]], layout: str, rotary_dim: int, rotated: tuple[int, ...],
                d: int) -> np.ndarray:
    """The frequency index of each pair in ``ordered``."""
    if not ordered:
        return np.zeros(0, dtype=np.int64)
    if layout == "half" and rotary_dim == d and len(rotated) < d:
        return np.array([a for a, _ in ordered])
    if layout == "interleaved" and rotary_dim == d and len(rotated) < d:
        return np.array([a // 2 for a, _ in ordered])
    return np.arange(len(ordered))


def _angles(out: np.ndarray, ordered: list[tuple[int, int]], signs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(theta, r)`` per position and pair ``(S, n)`` from the rotated sum of the pairs' first unit vectors."""
    a = np.array([p[0] for p in ordered], dtype=np.int64)
    b = np.array([p[1] for p in ordered], dtype=np.int64)
    c, s = out[:, a], out[:, b] * signs
    return np.arctan2(s, c), np.hypot(c, s)


def _fit_frequencies(out: np.ndarray, ordered: list[tuple[int, int]],
                     signs: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-pair frequency (:func:`posenc.testing._fit.frequencies_from_angles`) and the factor."""
    if not ordered:
        return np.zeros(0), 1.0
    theta, radius = _angles(out, ordered, signs)
    return _fit.frequencies_from_angles(theta), float(np.median(radius[1:]))


def _relative(probe: Probe, d: int, max_position: int, dtype: torch.dtype) -> float:
    """Largest spread of ``q_m . k_n`` over ``(m, n)`` with the same ``m - n``, relative to ``|q||k|``."""
    rng = np.random.default_rng(0)
    xq, xk = rng.standard_normal(d), rng.standard_normal(d)
    pairs = [(s + max(dist, 0), s + max(-dist, 0)) for s in _STARTS for dist in _DISTANCES
             if s + abs(dist) <= max_position]
    positions = np.array(sorted({p for pair in pairs for p in pair}))
    index = {int(p): i for i, p in enumerate(positions)}
    q, k = probe.rotate(np.broadcast_to(xq, (1, len(positions), d)), np.broadcast_to(xk, (1, len(positions), d)),
                        positions, dtype)
    spread = 0.0
    for dist in _DISTANCES:
        scores = [float(q[0, index[m]] @ k[0, index[n]]) for m, n in pairs if m - n == dist]
        if scores:
            spread = max(spread, max(scores) - min(scores))
    return spread / float(np.linalg.norm(xq) * np.linalg.norm(xk))


def _decode(probe: Probe, v: np.ndarray, full: np.ndarray, max_position: int, dtype: torch.dtype) -> str | None:
    """None when a token rotated alone (``S = 1``, decode) or in a chunk starting past 0 gets the rotation
    of its position in a full call; else what it got instead."""
    scale = float(np.abs(full).max()) or 1.0
    tol = 8 * float(torch.finfo(dtype).eps) * scale
    for p in (p for p in _DECODE_POSITIONS if p <= max_position):
        one = probe.rotate(v[:, :1], v[:, :1], np.array([p]), dtype)[0][0, 0]
        if np.abs(one - full[p]).max() > tol:
            # a rule that reads the sequence length (dynamic NTK, LongRoPE) rotates position p of a call on
            # 0..p as a cache-filled decode step sees it: that is no dropped offset
            upto = probe.rotate(v[:, : p + 1], v[:, : p + 1], np.arange(p + 1), dtype)[0][0, -1]
            if np.abs(one - upto).max() <= tol:
                continue
            match = int(np.abs(full - one).max(1).argmin())
            seen = f" (it gets position {match}'s)" if np.abs(full[match] - one).max() <= tol else ""
            return (f"a single-token call at position {p} is not rotated as position {p}{seen}: the position "
                    "offset is dropped at decode")
    start = min(300, max_position - 8)
    chunk = probe.rotate(v[:, :8], v[:, :8], np.arange(start, start + 8), dtype)[0][0]
    upto = probe.rotate(v[:, : start + 8], v[:, : start + 8], np.arange(start + 8), dtype)[0][0, start:]
    if np.abs(chunk - full[start:start + 8]).max() > tol and np.abs(chunk - upto).max() > tol:
        return (f"a call on positions {start}..{start + 7} is not rotated as those positions: the position offset "
                "is dropped for calls that do not start at 0")
    return None


def _collision(full: dict[torch.dtype, np.ndarray], rotated: tuple[int, ...]) -> int | None:
    if not rotated:
        return None
    firsts = []
    for out in full.values():
        same = np.all(out[1:-1, list(rotated)] == out[2:, list(rotated)], axis=1)      # p = 1 .. max - 1
        if same.any():
            firsts.append(int(np.argmax(same)) + 1)
    return min(firsts) if firsts else None


def _precision(full: dict[torch.dtype, np.ndarray], ordered: list[tuple[int, int]], signs: np.ndarray,
               freqs: np.ndarray, factor: float, positions: np.ndarray,
               threshold: float) -> tuple[tuple[PrecisionRow, ...], dict[str, int | None]]:
    if not ordered:
        return (), {str(dt).removeprefix("torch."): None for dt in full}
    sin, cos = exact.sin_cos(positions.astype(np.float64), exact.turns_split(tuple(float(f) for f in freqs)))
    a = np.array([p[0] for p in ordered])
    b = np.array([p[1] for p in ordered])
    want = np.concatenate((factor * cos, factor * sin * signs), 1)                 # (S, 2n): at a, then at b
    rows, first_over = [], {}
    edges = [e for e in _RANGE_EDGES if e < len(positions)] + [len(positions)]
    for dt, out in full.items():
        got = np.concatenate((out[:, a], out[:, b]), 1)
        err = _fit.ulps(got, want, torch.finfo(dt)).max(1)                         # (S,)
        absolute = np.abs(got - want).max(1)
        name = str(dt).removeprefix("torch.")
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            rows.append(PrecisionRow(name, lo, hi, float(err[lo:hi].max()), float(absolute[lo:hi].max())))
        over = np.nonzero(err > threshold)[0]
        first_over[name] = int(over[0]) if len(over) else None
    return tuple(rows), first_over
