"""What an attention-logit bias computes: ALiBi slopes, T5 buckets, or neither, from its outputs alone.

:func:`inspect_bias` calls ``fn(query_positions, key_positions)`` on a square grid of positions and on
the same grid shifted, and reads each head's bias as a function of the distance ``d = key - query``:

- ALiBi (Press et al. 2022, "Train Short, Test Long", ICLR): linear in ``d`` on the past side, slope
  ``m_h`` per head; the slopes are compared with the paper's rule for the head count
  (:func:`posenc.core.alibi.alibi_slopes`) and, when they differ, with the rule for other head
  counts and with the plain ``2^(-8h/n)`` sequence (which the paper uses only for powers of two);
- T5 buckets (Raffel et al. 2020, section 2.1): constant between bucket boundaries; the boundaries are
  compared with T5's for every common (bucket count, maximum distance, direction)
  (:func:`posenc.core.relative.thresholds`);
- anything else (a learned table, a clipped window, a kernel) is reported as such, with whether it
  depends on the distance only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from posenc import _validate
from posenc.core import alibi as core_alibi
from posenc.core import relative as core_relative
from posenc.testing._probe import check_device

_BUCKETS = (8, 16, 32, 64, 128, 256)
_DISTANCES = (16, 20, 32, 64, 100, 128, 200, 256, 400, 512, 800, 1000, 1024, 2048, 4096)
_SHIFT = 1000


@dataclasses.dataclass(frozen=True)
class BiasReport:
    """What :func:`inspect_bias` found (``print(report)`` shows it).

    Attributes:
        num_heads: heads of the bias.
        length: positions probed per side.
        kind: ``"alibi"``, ``"buckets"``, ``"zero"`` or ``"other"``.
        relative: whether each head's bias depends only on ``key - query`` (up to a constant per
            query, which softmax ignores).
        future: how keys after the query are treated: ``"masked"`` (not finite), ``"mirrored"``
            (the bias of ``|d|``), ``"same line"`` (ALiBi's line continued), ``"zero"`` or ``"other"``.
        slopes: per-head ALiBi slopes (positive: the bias falls by ``slope`` per position back), or None.
        slope_rule: which rule the slopes follow, in words (ALiBi only).
        buckets: ``(num_buckets, max_distance, bidirectional)`` of the matching T5 bucketing, or None.
        boundaries: distances ``d`` where the bias changes value (``buckets`` and ``other``, first 64).
        findings: problems found, in words.
    """

    num_heads: int
    length: int
    kind: str
    relative: bool
    future: str
    slopes: np.ndarray | None = dataclasses.field(repr=False)
    slope_rule: str
    buckets: tuple[int, int, bool] | None
    boundaries: tuple[int, ...]
    findings: tuple[str, ...]

    def __str__(self) -> str:
        rows = [("kind", self.kind), ("depends on", "the distance only" if self.relative else "absolute positions"),
                ("keys after the query", self.future)]
        if self.slopes is not None:
            shown = ", ".join(f"{s:.6g}" for s in self.slopes[:8]) + (", ..." if len(self.slopes) > 8 else "")
            rows += [("slopes", shown), ("slope rule", self.slope_rule)]
        if self.buckets is not None:
            n, m, bi = self.buckets
            rows.append(("T5 buckets", f"num_buckets={n}, max_distance={m}, "
                                       f"{'bidirectional' if bi else 'causal (unidirectional)'}"))
        if self.kind in ("buckets", "other") and self.boundaries:
            rows.append(("changes at d", ", ".join(map(str, self.boundaries[:24])) +
                         (", ..." if len(self.boundaries) > 24 else "")))
        width = max(len(k) for k, _ in rows)
        lines = [f"bias report: {self.num_heads} heads, distances -{self.length - 1}..{self.length - 1}"]
        lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
        lines.append("  findings:" + (" none" if not self.findings else ""))
        lines += [f"    - {f}" for f in self.findings]
        return "\n".join(lines)


def inspect_bias(fn: Any, *, num_heads: int, length: int = 512, device: Any = None) -> BiasReport:
    """Find what an attention-logit bias computes, by calling it on chosen positions.

    Args:
        fn: ``fn(query_positions, key_positions) -> (H, S, S_k)`` (a leading batch axis of 1 is
            accepted), positions being int64 tensors ``(S,)`` and ``(S_k,)``: a posenc bias module, a
            model's bias helper wrapped in a lambda.
        num_heads: ``H``, the heads the bias is for (the paper's slopes depend on it).
        length: positions per side probed (distances ``-(length-1) .. length-1``); T5 buckets are told
            apart only up to this distance.
        device: where the positions live (default CPU).

    Returns:
        A :class:`BiasReport`.

    Raises:
        TypeError: ``fn`` not callable or not returning a tensor.
        ValueError: a bad argument, or a result whose shape is not ``(H, S, S_k)``.

    Examples:
        >>> import posenc, torch
        >>> alibi = posenc.AlibiBias(num_heads=12)
        >>> report = inspect_bias(lambda q, k: alibi(q, k), num_heads=12, length=64)
        >>> report.kind, report.slope_rule
        ('alibi', "the paper's slopes for 12 heads")
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable as fn(query_positions, key_positions), got {type(fn).__name__}")
    h = _validate.check_int("num_heads", num_heads, minimum=1)
    n = _validate.check_int("length", length, minimum=8)
    dev = check_device(device)
    pos = torch.arange(n, device=dev)
    grid, eps = _call(fn, pos, pos, h)                             # (H, S, S)
    shifted, _ = _call(fn, pos + _SHIFT, pos + _SHIFT, h)
    finite = np.isfinite(grid)
    scale = float(np.abs(grid[finite]).max()) if finite.any() else 0.0
    tol = max(1e-5, 4 * eps) * max(scale, 1.0) + 1e-6              # the output dtype's rounding
    same_mask = np.array_equal(finite, np.isfinite(shifted))
    # each row relative to its own diagonal: softmax ignores a constant per query
    centred = grid - np.diagonal(grid, axis1=1, axis2=2)[:, :, None]
    centred_shift = shifted - np.diagonal(shifted, axis1=1, axis2=2)[:, :, None]
    past = _profile(centred, n, side=-1)                           # (H, n): d = 0, -1, ..., -(n-1)
    ahead = _profile(centred, n, side=1)                           # (H, n): d = 0, 1, ..., n-1
    toeplitz = _is_toeplitz(centred, tol)
    relative = same_mask and toeplitz and bool(np.allclose(np.where(finite, centred, 0),
                                                           np.where(finite, centred_shift, 0), atol=tol, rtol=0))
    findings: list[str] = []
    if not relative:
        findings.append("the bias depends on where the query and key are, not only on their distance (or the shifted "
                        f"grid, positions +{_SHIFT}, gives another bias)")
    future = _future(past, ahead, tol)
    kind, slopes, rule, buckets = "other", None, "", None
    boundaries: list[int] = []
    d_past = np.arange(n, dtype=np.float64)                        # |d| on the past side
    if scale == 0.0:
        kind = "zero"
        findings.append("the bias is zero everywhere")
    elif np.all(np.isfinite(past)) and _linear(past, d_past, tol):
        kind = "alibi"
        slopes = -(past @ d_past) / (d_past @ d_past)              # least squares through 0
        rule, problem = _slope_rule(slopes, h, max(1e-3, 4 * eps))
        if problem:
            findings.append(problem)
    else:
        boundaries = _changes(past, ahead, tol)
        if boundaries and len(boundaries) <= 2 * max(_BUCKETS):
            kind = "buckets"
            buckets = _match_buckets(boundaries, n)
            if buckets is None:
                findings.append("piecewise-constant bias whose boundaries match no T5 bucketing (num_buckets "
                                f"{_BUCKETS}, max_distance up to {max(_DISTANCES)}, either direction)")
    return BiasReport(h, n, kind, relative, future, slopes, rule, buckets, tuple(boundaries[:64]), tuple(findings))


def _call(fn: Any, q: torch.Tensor, k: torch.Tensor, h: int) -> tuple[np.ndarray, float]:
    """The bias as float64 ``(H, S, S_k)`` with masked entries as ``-inf``, and the output dtype's eps."""
    with torch.no_grad():
        out = fn(q, k)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"fn must return a tensor (H, S, S_k), got {type(out).__name__}")
    if out.dim() == 4 and out.shape[0] == 1:
        out = out[0]
    want = (h, len(q), len(k))
    if tuple(out.shape) != want:
        raise ValueError(f"fn returned shape {tuple(out.shape)}, expected {want} (num_heads={h}, S, S_k)")
    if not out.dtype.is_floating_point:
        raise TypeError(f"fn must return a floating tensor, got {out.dtype}")
    info = torch.finfo(out.dtype)
    values = out.detach().to("cpu", torch.float64).numpy()
    # a mask written as the dtype's lowest value (as transformers writes it) is a mask, not a bias
    values = np.where(values <= info.min / 2, -np.inf, values)
    return values, float(info.eps)


def _profile(centred: np.ndarray, n: int, *, side: int) -> np.ndarray:
    """Each head's bias at distance ``side * j``, ``j = 0 .. n-1``, read where it is defined."""
    idx = np.arange(n)
    if side < 0:
        return centred[:, n - 1, n - 1 - idx]                    # last query, keys before it
    return centred[:, 0, idx]                                       # first query, keys after it


def _is_toeplitz(centred: np.ndarray, tol: float) -> bool:
    a, b = centred[:, 1:, 1:], centred[:, :-1, :-1]
    both = np.isfinite(a) & np.isfinite(b)
    return bool(np.array_equal(np.isfinite(a), np.isfinite(b)) and np.all(np.abs(a[both] - b[both]) <= tol))


def _future(past: np.ndarray, ahead: np.ndarray, tol: float) -> str:
    rest = ahead[:, 1:]
    if not np.all(np.isfinite(rest)):
        return "masked"
    if np.allclose(rest, past[:, 1:], atol=tol, rtol=0):
        return "mirrored"
    if np.allclose(rest, -past[:, 1:], atol=tol, rtol=0):
        return "same line"
    if np.allclose(rest, 0.0, atol=tol):
        return "zero"
    return "other"


def _linear(past: np.ndarray, d: np.ndarray, tol: float) -> bool:
    slopes = -(past @ d) / (d @ d)
    return bool(np.abs(past + slopes[:, None] * d).max() <= tol) and bool(np.any(np.abs(slopes) > 0))


def _slope_rule(slopes: np.ndarray, h: int, rtol: float) -> tuple[str, str]:
    def _close(a: np.ndarray, b: list[float]) -> bool:
        return len(a) == len(b) and bool(np.allclose(a, np.array(b), rtol=rtol, atol=0))

    paper = core_alibi.alibi_slopes(h)
    if _close(slopes, paper):
        return f"the paper's slopes for {h} heads", ""
    if _close(np.sort(slopes), sorted(paper)):
        return (f"the paper's slopes for {h} heads in another head order",
                f"the slopes are the paper's for {h} heads but assigned to other heads")
    plain = [2.0 ** (-8.0 * i / h) for i in range(1, h + 1)]
    if _close(slopes, plain):
        return (f"2^(-8h/{h}) for h = 1..{h}",
                f"the slopes are 2^(-8h/n) with n={h}, which the paper uses only for a power of two; for {h} heads it "
                f"takes the slopes of {2 ** (h.bit_length() - 1)} heads and every other slope of "
                f"{2 ** h.bit_length()}")
    for other in range(1, 4 * h + 65):
        ref = core_alibi.alibi_slopes(other)
        if other != h and len(ref) >= h and _close(slopes, ref[:h]):
            cut = "" if other == h else f" (the first {h})"
            return (f"the paper's slopes for {other} heads{cut}",
                    f"the slopes are the paper's for {other} heads{cut}, not for num_heads={h}: the head count given "
                    f"to the slope rule is wrong (tensor-parallel shards take their slice of the full model's slopes)")
    return ("no ALiBi rule", f"the slopes follow no ALiBi rule for {h} heads (first: {slopes[0]:.6g}, paper's "
                             f"{paper[0]:.6g})")


def _changes(past: np.ndarray, ahead: np.ndarray, tol: float) -> list[int]:
    """Distances ``d`` (key - query) where any head's bias differs from its value at ``d - 1`` (ahead)
    or ``d + 1`` (past)."""
    out = set()
    for j in range(1, past.shape[1]):
        if np.any(_differs(past[:, j], past[:, j - 1], tol)):
            out.add(-j)
        if np.any(_differs(ahead[:, j], ahead[:, j - 1], tol)):
            out.add(j)
    return sorted(out)


def _differs(a: np.ndarray, b: np.ndarray, tol: float) -> np.ndarray:
    """Where two distances' biases differ; a masked side (not finite) is no bucket boundary."""
    both = np.isfinite(a) & np.isfinite(b)
    diff = np.zeros(a.shape)
    diff[both] = a[both] - b[both]
    return both & (np.abs(diff) > tol)


def _t5_changes(num_buckets: int, max_distance: int, bidirectional: bool, n: int) -> list[int] | None:
    try:
        per_side, exact, thr = core_relative.thresholds(num_buckets, max_distance, bidirectional)
    except ValueError:
        return None

    rp = np.arange(-(n - 1), n)
    offset = np.where(bidirectional & (rp > 0), per_side, 0)
    dist = np.abs(rp) if bidirectional else np.maximum(-rp, 0)
    log_part = np.minimum(exact + np.searchsorted(np.array(thr, dtype=np.int64), dist, side="right"), per_side - 1)
    bucket = offset + np.where(dist < exact, dist, log_part)
    step = bucket[1:] != bucket[:-1]                                 # bucket(d) != bucket(d - 1), d = rp[1:]
    ahead = [int(d) for d in rp[1:][step] if d > 0]
    past = [int(d) - 1 for d in rp[1:][step] if d <= 0]               # as bucket(d) != bucket(d + 1)
    return sorted(past + ahead)


def _match_buckets(boundaries: list[int], n: int) -> tuple[int, int, bool] | None:
    for bidirectional in (True, False):
        for num_buckets in _BUCKETS:
            for max_distance in _DISTANCES:
                if _t5_changes(num_buckets, max_distance, bidirectional, n) == boundaries:
                    return num_buckets, max_distance, bidirectional
    return None
