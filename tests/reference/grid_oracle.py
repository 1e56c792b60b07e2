"""Independent oracles for patch grids and multimodal positions, written from the papers' formulas.

* N-D sin-cos tables: MAE (He et al. 2022) for 2-D grids, in MAE's ``[sin w | cos w | sin h | cos h]`` or
  timm's ``[sin h | sin w | cos h | cos w]`` column order, and CogVideoX (Yang et al. 2024) for 3-D grids.
* Axial RoPE (FLUX; EVA; Heo et al. 2024): each axis rotates its own block of features.
* M-RoPE (Wang et al. 2024, Qwen2-VL; Qwen3-VL's interleaved sections): each frequency slot turns by the
  position on one of the three axes (t, h, w).

Nothing here imports posenc.
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np

from tests.reference.rope_oracle import pair_indices, rotate_pairs

# ---- N-D sin-cos tables ----------------------------------------------------------------------------


def axis_scale(n, base_size, interp) -> Fraction:
    """Exact factor from cell index to position on an axis of ``n`` cells: 1 / interp or base_size / (n * interp)."""
    return Fraction(1) / Fraction(interp) * (Fraction(base_size) / n if base_size is not None else 1)


def axis_positions(n, base_size, interp) -> list[Fraction]:
    """Positions of an axis of ``n`` cells as exact fractions."""
    return [i * axis_scale(n, base_size, interp) for i in range(n)]


def _block(pos, count, base):
    """1-D [sin | cos] block with ``count`` frequencies base^(-k / count), float64 -> (n, 2 * count)."""
    f = np.power(float(base), -np.arange(count) / count)
    angle = np.asarray([float(p) for p in pos])[:, None] * f
    return np.sin(angle), np.cos(angle)


def sincos_nd(grid, dim, *, order="mae", base=10000.0, prefix=0, base_size=None, interp=1.0) -> np.ndarray:
    """``(prefix + prod(grid), dim)`` float64 table: ``prefix`` zero rows, then the tokens row-major.

    1-D ``[sin(p f) | cos(p f)]``, ``f_k = base^(-k/(D/2))``; 2-D "mae" ``[sin(w f) | cos(w f) | sin(h f) | cos(h f)]``,
    "timm" ``[sin(h f) | sin(w f) | cos(h f) | cos(w f)]``, ``f_k = base^(-k/(D/4))``; 3-D ``[sin(t g) | cos(t g)]``
    with ``g_k = base^(-k/(D/8))`` over D/4 columns, then the 2-D "mae" table of width 3D/4 over ``(h, w)``.
    Axis ``a`` of ``n`` cells places cell ``i`` at ``i / interp[a]`` (times ``base_size[a] / n`` when given).
    """
    nd = len(grid)
    bs = base_size if isinstance(base_size, (tuple, list)) or base_size is None else (base_size,) * nd
    it = interp if isinstance(interp, (tuple, list)) else (interp,) * nd
    pos = [axis_positions(n, None if bs is None else bs[a], it[a]) for a, n in enumerate(grid)]
    idx = [g.reshape(-1) for g in np.meshgrid(*[np.arange(n) for n in grid], indexing="ij")]  # row-major
    if nd == 2:
        (h, w), q = idx, dim // 4
        sh, ch = (b[h] for b in _block(pos[0], q, base))
        sw, cw = (b[w] for b in _block(pos[1], q, base))
        cols = [sw, cw, sh, ch] if order == "mae" else [sh, sw, ch, cw]
    elif nd == 3:
        t, h, w = idx
        st, ct = (b[t] for b in _block(pos[0], dim // 8, base))
        q = 3 * dim // 16
        sh, ch = (b[h] for b in _block(pos[1], q, base))
        sw, cw = (b[w] for b in _block(pos[2], q, base))
        cols = [st, ct, sw, cw, sh, ch]
    else:
        cols = list(_block(pos[0], dim // 2, base))
    table = np.concatenate(cols, axis=1)
    return np.concatenate([np.zeros((prefix, dim)), table])


def sincos_nd_mp(grid, dim, token, col, *, base=10000.0, base_size=None, interp=1.0):
    """One entry of the "mae"-order table from mpmath at 200 bits, with exact rational positions."""
    mpmath.mp.prec = 200
    nd = len(grid)
    bs = base_size if isinstance(base_size, tuple) or base_size is None else (base_size,) * nd
    it = interp if isinstance(interp, tuple) else (interp,) * nd
    coords = [int(c) for c in np.unravel_index(token, grid)]
    if nd == 2:
        q = dim // 4
        blocks = [(1, q, "sin"), (1, q, "cos"), (0, q, "sin"), (0, q, "cos")]
    elif nd == 3:
        q = 3 * dim // 16
        blocks = [(0, dim // 8, "sin"), (0, dim // 8, "cos"), (2, q, "sin"), (2, q, "cos"), (1, q, "sin"), (1, q, "cos")]
    else:
        blocks = [(0, dim // 2, "sin"), (0, dim // 2, "cos")]
    for axis, count, fn in blocks:
        if col < count:
            p = coords[axis] * axis_scale(grid[axis], None if bs is None else bs[axis], it[axis])
            angle = mpmath.mpf(p.numerator) / p.denominator * mpmath.power(mpmath.mpf(base), -mpmath.mpf(col) / count)
            return mpmath.sin(angle) if fn == "sin" else mpmath.cos(angle)
        col -= count
    raise AssertionError("column out of range")


# ---- axial RoPE -------------------------------------------------------------------------------------


def axial_angles(p, axes_dims, base: float = 10000.0) -> np.ndarray:
    """``(..., sum(axes_dims)/2)``: block ``a`` pair ``i`` turns by ``p_a * base^(-2i/axes_dims[a])``."""
    p = np.asarray(p, dtype=np.float64)
    return np.concatenate([p[..., a, None] * base ** (-2 * np.arange(d // 2) / d) for a, d in enumerate(axes_dims)], -1)


def axial_cos_sin(p, axes_dims, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    angle = axial_angles(p, axes_dims, base)
    return np.cos(angle), np.sin(angle)


def axial_pairs(axes_dims, layout: str) -> tuple[list[int], list[int]]:
    """Feature indices (first, second) of every pair, in block order: (2i, 2i+1) or (i, i + d_a/2) in each block."""
    first, second, o = [], [], 0
    for d in axes_dims:
        a, b = pair_indices(d, layout)
        first += [o + i for i in a]
        second += [o + i for i in b]
        o += d
    return first, second


def axial_rotate(x, p, axes_dims, layout: str = "interleaved", base: float = 10000.0) -> np.ndarray:
    """Axial RoPE of ``x (B, H, S, D)`` (or ``(S, D)``) at ``p (S, n)`` or ``(B, S, n)``, in float64."""
    angle = axial_angles(p, axes_dims, base)                                  # (S, h) or (B, S, h)
    if angle.ndim == 3:
        angle = angle[:, None]                                                 # (B, 1, S, h)
    return rotate_pairs(x, angle, *axial_pairs(axes_dims, layout))


# ---- M-RoPE -----------------------------------------------------------------------------------------


def mrope_axes(dim: int, section, interleaved: bool = False) -> list[int]:
    """Axis (0 = t, 1 = h, 2 = w) of each of the ``dim/2`` frequency slots: contiguous sections, or Qwen3-VL's
    t, h, w, t, ... (h for ``j % 3 == 1, j < 3 s_h``; w for ``j % 3 == 2, j < 3 s_w``)."""
    s_t, s_h, s_w = section
    axes = []
    for j in range(dim // 2):
        if interleaved:
            axes.append(1 if j % 3 == 1 and j < 3 * s_h else 2 if j % 3 == 2 and j < 3 * s_w else 0)
        else:
            axes.append(0 if j < s_t else 1 if j < s_t + s_h else 2)
    return axes


def mrope_angles(p3, dim: int, section, base: float = 10000.0, interleaved: bool = False) -> np.ndarray:
    """``(..., dim/2)``: slot ``j`` turns by ``p_a(j) * base^(-2j/dim)`` for positions ``p3 (..., 3)``, axes
    t, h, w last."""
    p3 = np.asarray(p3, dtype=np.float64)
    theta = base ** (-2 * np.arange(dim // 2) / dim)
    return np.stack([p3[..., a] * theta[j] for j, a in enumerate(mrope_axes(dim, section, interleaved))], -1)


def mrope_rotate(x, p3, dim: int, section, base: float = 10000.0, *, layout: str = "half",
                 interleaved: bool = False) -> np.ndarray:
    """M-RoPE of ``x (B, H, S, D)`` at ``p3 (S, 3)`` or ``(B, S, 3)`` (axes t, h, w last), in float64."""
    angle = mrope_angles(p3, dim, section, base, interleaved)                 # (S, h) or (B, S, h)
    if angle.ndim == 3:
        angle = angle[:, None]
    return rotate_pairs(x, angle, *pair_indices(dim, layout))
