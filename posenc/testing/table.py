"""What a sinusoidal position table holds: its layout, base and precision, from its values alone.

:func:`inspect_table` reads a table ``(P, D)`` (or a function of positions that returns one) as
pairs of sine and cosine columns in each of posenc's layouts (:mod:`posenc.core.sinusoidal`: the
paper's ``"interleaved"``, ``"concat"`` and ``"tensor2tensor"``), fits each pair's frequency over
rows ``1, 2, 4, ...``, finds the base of the geometric sequence, and compares every value with
posenc's exact table for that layout and base (Vaswani et al. 2017, section 3.5).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from posenc import _validate
from posenc.core import sinusoidal as core_sin
from posenc.testing import _fit

_RANGE_EDGES = (0, 256, 2048, 16384, 131072)


@dataclasses.dataclass(frozen=True)
class TableReport:
    """What :func:`inspect_table` found (``print(report)`` shows it).

    Attributes:
        rows, dim: the table's shape ``(P, D)`` (positions ``0 .. P-1``).
        dtype: the table's dtype.
        layout: ``"interleaved"``, ``"concat"``, ``"tensor2tensor"`` or ``"unknown"``.
        base: the base of the fitted frequencies in that layout's exponent, or None.
        frequencies: fitted frequency per sine/cosine pair (radians per position).
        fit_error: largest relative difference of the fitted frequencies from ``base``'s.
        max_ulps: largest error against posenc's exact table, in ulps of ``dtype``.
        max_abs: largest absolute error.
        first_over: the first position whose error passes ``threshold_ulps``, or None.
        collision: the first position whose row equals the next one, or None.
        findings: problems found, in words.
    """

    rows: int
    dim: int
    dtype: str
    layout: str
    base: float | None
    frequencies: np.ndarray = dataclasses.field(repr=False)
    fit_error: float
    precision: tuple[tuple[int, int, float, float], ...]
    first_over: int | None
    threshold_ulps: float
    collision: int | None
    findings: tuple[str, ...]

    @property
    def max_ulps(self) -> float:
        return max((r[2] for r in self.precision), default=math.nan)

    def __str__(self) -> str:
        rows = [("shape", f"({self.rows}, {self.dim}) {self.dtype}"), ("layout", self.layout),
                ("base", "-" if self.base is None else f"{self.base:g} (frequencies off by up to {self.fit_error:.2g})"),
                ("collisions", "none" if self.collision is None else
                 f"rows {self.collision} and {self.collision + 1} are equal")]
        width = max(len(k) for k, _ in rows)
        lines = ["sinusoidal table report"] + [f"  {k.ljust(width)}  {v}" for k, v in rows]
        if self.precision:
            lines.append(f"  precision against posenc's exact table ({self.dtype} ulp):")
            lines.append("    positions        max ulp     max abs")
            for lo, hi, u, a in self.precision:
                lines.append(f"    {f'{lo}..{hi - 1}':<15}  {u:>8.3g}  {a:>10.3g}")
            lines.append("    " + ("within the threshold everywhere" if self.first_over is None else
                                  f"first position over {self.threshold_ulps:g} ulp: {self.first_over}"))
        lines.append("  findings:" + (" none" if not self.findings else ""))
        lines += [f"    - {f}" for f in self.findings]
        return "\n".join(lines)


def inspect_table(table: Any, *, rows: int = 2048, base: float | None = None,
                  threshold_ulps: float = 2.0) -> TableReport:
    """Find the layout, base and precision of a sinusoidal position table.

    Args:
        table: a tensor or array ``(P, D)`` (a leading axis of 1 is accepted), or a callable
            ``table(positions) -> (S, D)`` called with ``positions = arange(rows)``.
        rows: positions probed when ``table`` is callable.
        base: the base you expect (a finding names a different one); None: just report it.
        threshold_ulps: error in ulps past which ``first_over`` names a position.

    Returns:
        A :class:`TableReport`.

    Raises:
        TypeError: a table that is neither a floating tensor/array nor a callable.
        ValueError: a table that is not 2-D, or fewer than 4 rows.

    Examples:
        >>> import posenc
        >>> report = inspect_table(posenc.sinusoidal_table(128, 64, layout="concat"))
        >>> report.layout, report.base, report.first_over
        ('concat', 10000.0, None)
    """
    threshold_ulps = _validate.check_float("threshold_ulps", threshold_ulps, positive=True)
    if base is not None:
        base = _validate.check_float("base", base, positive=True)
    values, dtype = _values(table, _validate.check_int("rows", rows, minimum=4))
    p, d = values.shape
    noise = 8 * float(_finfo(dtype).eps)          # how far a fitted frequency may sit off, in the table's precision
    findings: list[str] = []
    best: tuple[float, str, np.ndarray, float] | None = None
    for layout in core_sin.SINUSOIDAL_LAYOUTS:
        fitted = _fit_layout(values, layout)
        if fitted is None:
            continue
        freqs, residual = fitted
        fb, err = _base(freqs, d, layout, noise)
        score = max(residual, err)
        if best is None or score < best[0] or (math.isclose(score, best[0], rel_tol=0.5) and _rounder(fb, best[3])):
            best = (score, layout, freqs, fb)
    collision = _collision(values)
    if collision is not None:
        findings.append(f"rows {collision} and {collision + 1} are equal: the positions or the angles were held in a "
                        "16-bit float (bfloat16 holds integers exactly only up to 256)")
    if best is None or best[0] > 1e-2:
        findings.append("the columns are not sine/cosine pairs of one frequency in any known layout (interleaved, "
                        "concat, tensor2tensor)")
        return TableReport(p, d, dtype, "unknown", None, np.zeros(0), math.inf, (), None, threshold_ulps, collision,
                           tuple(findings))
    _, layout, freqs, fitted_base = best
    fit_error = _base(freqs, d, layout, noise)[1]
    if fit_error > max(1e-4, noise):
        findings.append(f"the frequencies are not the geometric sequence of one base in the {layout} layout (off by "
                        f"{fit_error:.2g}): a mistyped exponent")
    if base is not None and not math.isclose(fitted_base, base, rel_tol=1e-5):
        findings.append(f"the base is {fitted_base:g}, not {base:g}" + _exponent_hint(fitted_base, base))
    exact = core_sin.table(np.arange(p), d, fitted_base, layout)
    err = _fit.ulps(values, exact, _finfo(dtype)).max(1)
    absolute = np.abs(values - exact).max(1)
    edges = [e for e in _RANGE_EDGES if e < p] + [p]
    precision = tuple((lo, hi, float(err[lo:hi].max()), float(absolute[lo:hi].max()))
                      for lo, hi in zip(edges[:-1], edges[1:], strict=True))
    over = np.nonzero(err > threshold_ulps)[0]
    return TableReport(p, d, dtype, layout, fitted_base, freqs, fit_error, precision,
                       int(over[0]) if len(over) else None, threshold_ulps, collision, tuple(findings))


def _values(table: Any, rows: int) -> tuple[np.ndarray, str]:
    if callable(table) and not isinstance(table, (torch.Tensor, np.ndarray)):
        with torch.no_grad():
            table = table(torch.arange(rows))
    if isinstance(table, torch.Tensor):
        if not table.dtype.is_floating_point:
            raise TypeError(f"table must hold floating values, got {table.dtype}")
        dtype, values = str(table.dtype).removeprefix("torch."), table.detach().to("cpu", torch.float64).numpy()
    elif isinstance(table, np.ndarray):
        if table.dtype.kind != "f":
            raise TypeError(f"table must hold floating values, got {table.dtype}")
        dtype, values = str(table.dtype), table.astype(np.float64)
    else:
        raise TypeError(f"table must be a tensor, a NumPy array or a callable of positions, got {type(table).__name__}")
    if values.ndim == 3 and values.shape[0] == 1:
        values = values[0]
    if values.ndim != 2 or values.shape[0] < 4 or values.shape[1] < 1:
        raise ValueError(f"table must be (P, D) with P >= 4 positions, got shape {values.shape}")
    return values, dtype


def _finfo(dtype: str) -> Any:
    return torch.finfo(getattr(torch, dtype)) if hasattr(torch, dtype) else np.finfo(np.float64)


def _columns(d: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Sine and cosine column of each pair in ``layout`` (pairs with both columns only)."""
    if layout == "interleaved":
        n = d // 2
        return np.arange(n) * 2, np.arange(n) * 2 + 1
    if layout == "concat":
        n = (d + 1) // 2
        return np.arange(d // 2), np.arange(d // 2) + n
    h = d // 2
    return np.arange(h), np.arange(h) + h


def _fit_layout(values: np.ndarray, layout: str) -> tuple[np.ndarray, float] | None:
    d = values.shape[1]
    s_col, c_col = _columns(d, layout)
    if not len(s_col):
        return None
    s, c = values[:, s_col], values[:, c_col]
    if not (np.allclose(s[0], 0, atol=1e-2) and np.allclose(c[0], 1, atol=1e-2)):
        return None
    residual = float(np.abs(np.hypot(s, c) - 1).max())
    return _fit.frequencies_from_angles(np.arctan2(s, c)), residual


def _base(freqs: np.ndarray, d: int, layout: str, noise: float) -> tuple[float, float]:
    """The base whose frequencies in ``layout`` fit ``freqs`` (read between the first and last pair,
    rounded to the fewest digits within ``noise``) and the largest relative difference."""
    n = len(freqs)
    if n < 2 or not np.all(freqs > 0):
        return 10000.0, math.inf if n >= 2 else 0.0
    exponent = (n - 1) / max(n - 1, 1) if layout == "tensor2tensor" else 2 * (n - 1) / d
    fitted = _fit.snap(float((freqs[0] / freqs[-1]) ** (1.0 / exponent)), max(1e-5, noise))
    if not fitted > 1:
        return fitted, math.inf
    want = np.array([float(f) for f in core_sin.frequencies(d, fitted, layout)])[:n]
    return fitted, float(np.max(np.abs(want / freqs - 1)))


def _rounder(a: float, b: float) -> bool:
    """Whether ``a`` needs fewer significant digits than ``b`` (10000 over 10965.6)."""
    def digits(x: float) -> int:
        return next((k for k in range(1, 17) if float(f"{x:.{k - 1}e}") == x), 17)
    return digits(a) < digits(b)


def _collision(values: np.ndarray) -> int | None:
    same = np.all(values[1:-1] == values[2:], axis=1)
    return int(np.argmax(same)) + 1 if same.any() else None


def _exponent_hint(found: float, expected: float) -> str:
    for power, words in ((0.5, "an exponent i/d instead of 2i/d"), (2.0, "an exponent 4i/d instead of 2i/d")):
        if math.isclose(found, expected**power, rel_tol=1e-4):
            return f" (= {expected:g}^{power:g}: {words})"
    return ""
