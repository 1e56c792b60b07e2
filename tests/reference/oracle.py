"""Independent oracles written from the papers' formulas (mpmath at 200 bits, or float64 ``math``).

Nothing here imports posenc: these are the references the tests compare posenc against.
"""

from __future__ import annotations

import mpmath
import numpy as np
import torch

mpmath.mp.prec = 200


def sinusoidal_mp(position: int, dim: int, base: float = 10000.0, layout: str = "interleaved") -> list:
    """Row of the sinusoidal table as mpmath numbers (Vaswani et al. 2017, section 3.5)."""
    b = mpmath.mpf(base)
    if layout == "tensor2tensor":
        h = dim // 2
        inv = [mpmath.exp(-k * mpmath.log(b) / max(h - 1, 1)) for k in range(h)]
        return [mpmath.sin(position * w) for w in inv] + [mpmath.cos(position * w) for w in inv] + [mpmath.mpf(0)] * (dim % 2)
    row = []
    for j in range(dim):
        w = mpmath.power(b, -mpmath.mpf(2 * (j // 2)) / dim)
        row.append(mpmath.sin(position * w) if j % 2 == 0 else mpmath.cos(position * w))
    if layout == "concat":
        row = row[0::2] + row[1::2]
    return row


def sinusoidal_f64(positions, dim: int, base: float = 10000.0, layout: str = "interleaved") -> np.ndarray:
    """``(..., dim)`` float64 table rows for positions of any shape (Vaswani et al. 2017, section 3.5).

    "interleaved": PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d)); "concat": the
    same columns as ``[sin ... | cos ...]``; "tensor2tensor": ``[sin(p w_k) | cos(p w_k)]`` with
    ``w_k = base^(-k / max(d/2 - 1, 1))`` and a zero column when ``d`` is odd.  Accurate to ~1e-12
    for small positions (the angle is rounded once in float64).
    """
    p = np.asarray(positions, dtype=np.float64)[..., None]
    if layout == "tensor2tensor":
        h = dim // 2
        angle = p * base ** (-np.arange(h) / max(h - 1, 1))
        zeros = np.zeros((*angle.shape[:-1], dim % 2))
        return np.concatenate([np.sin(angle), np.cos(angle), zeros], -1)
    j = np.arange(dim)
    angle = p / np.power(base, 2 * (j // 2) / dim)
    row = np.where(j % 2 == 0, np.sin(angle), np.cos(angle))
    if layout == "concat":
        row = np.concatenate([row[..., 0::2], row[..., 1::2]], -1)
    return row


def ulps(dtype: torch.dtype, truth: torch.Tensor) -> torch.Tensor:
    """The gap between the two ``dtype`` numbers around each float64 ``truth`` (the larger side)."""
    r = truth.to(dtype)
    up = torch.nextafter(r, torch.full_like(r, float("inf"))).double()
    dn = torch.nextafter(r, torch.full_like(r, float("-inf"))).double()
    return torch.maximum(up - r.double(), r.double() - dn)


def ulp_error(values: torch.Tensor, truth: list, dtype: torch.dtype) -> float:
    """Largest ``|value - truth| / ulp(truth)`` in ``dtype``; ``truth`` a flat list of mpmath numbers.

    The difference is taken in float64, whose own error (2**-53 relative) is negligible against the
    ulp of float32, float16 or bfloat16.
    """
    t64 = torch.tensor([float(t) for t in truth], dtype=torch.float64)
    v64 = values.detach().flatten().to(torch.float64)
    return float(((v64 - t64).abs() / ulps(dtype, t64)).max())


def round_f32(x: mpmath.mpf) -> np.float32:
    """``x`` correctly rounded to float32 (normal range: a 24-bit significand, nearest-even)."""
    with mpmath.workprec(24):
        r = +x
    return np.float32(float(r))                                              # exact: r has 24 bits


def assert_within_one_f32_ulp(got: np.ndarray, truth: list[list[mpmath.mpf]], what: str) -> None:
    """float32 ``got`` is within one ulp of the correctly rounded ``truth`` (rows of mpmath numbers)."""
    want = np.array([[round_f32(t) for t in row] for row in truth], dtype=np.float32)
    assert got.dtype == np.float32 and got.shape == want.shape
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    ulp = np.spacing(np.abs(want)).astype(np.float64)
    bad = np.argwhere(err > ulp)
    assert not bad.size, f"{what}: {len(bad)} values off by more than one ulp, first at {tuple(bad[0])}: " \
                         f"got {got[tuple(bad[0])]!r}, correctly rounded {want[tuple(bad[0])]!r}"
