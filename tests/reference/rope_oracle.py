"""Independent float64 oracles of RoPE frequencies and rotations, written from the papers' formulas
(RoFormer; PI; NTK; dynamic NTK; YaRN; Llama 3.1; LongRoPE) as summarised in FAILURE_MODES.md 3.3.
Nothing here imports posenc."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import torch


def default(dim, base=10000.0):
    return np.array([base ** (-2 * i / dim) for i in range(dim // 2)])


def linear(dim, base, factor):
    return default(dim, base) / factor


def ntk(dim, base, factor):
    return default(dim, base * factor ** (dim / (dim - 2)))


def dynamic(dim, base, factor, original, seq_len):
    if seq_len <= original:
        return default(dim, base)
    return default(dim, base * ((factor * seq_len / original) - (factor - 1)) ** (dim / (dim - 2)))


def yarn(dim, base, factor, original, beta_fast=32.0, beta_slow=1.0, truncate=True):
    theta = default(dim, base)

    def index(rot):   # the pair index whose wavelength fits `rot` times into the original context
        return dim * math.log(original / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = index(beta_fast), index(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)     # 1 = interpolate
    return theta / factor * ramp + theta * (1 - ramp)


def yarn_attention_factor(factor, mscale=None, mscale_all_dim=None):
    def m(s, k=1.0):
        return 1.0 if s <= 1 else 0.1 * k * math.log(s) + 1.0
    if mscale and mscale_all_dim:
        return m(factor, mscale) / m(factor, mscale_all_dim)
    return m(factor)


def _llama3_rule(theta, factor, original, low, high, pi):
    """Llama 3.1's rule on frequencies ``theta`` in the precision of ``theta`` and ``pi`` (float or mpmath):
    short wavelengths kept, long ones divided by ``factor``, a smooth blend between."""
    out = []
    for t in theta:
        wavelen = 2 * pi / t
        if wavelen < original / high:
            out.append(t)
        elif wavelen > original / low:
            out.append(t / factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * t / factor + smooth * t)
    return out


def llama3(dim, base, factor, original, low=1.0, high=4.0):
    return np.array(_llama3_rule(default(dim, base), factor, original, low, high, math.pi))


def longrope(dim, base, short, long, original, seq_len):
    ext = np.array(long if seq_len is not None and seq_len > original else short)
    return default(dim, base) / ext


def cos_sin_mp(positions, freqs):
    """mpmath cos/sin of exact products ``p * f`` (the frequencies taken as given)."""
    mpmath.mp.prec = 200
    cos = [[mpmath.cos(int(p) * mpmath.mpf(float(f))) for f in freqs] for p in positions]
    sin = [[mpmath.sin(int(p) * mpmath.mpf(float(f))) for f in freqs] for p in positions]
    return cos, sin


def cos_sin(positions, freqs) -> tuple[np.ndarray, np.ndarray]:
    """``(..., len(freqs))`` float64 cos and sin of ``p * f`` for positions of any shape (RoFormer eq. 14)."""
    angle = np.asarray(positions, dtype=np.float64)[..., None] * np.asarray(freqs, dtype=np.float64)
    return np.cos(angle), np.sin(angle)


def rotate_pairs(x, angle, first, second) -> np.ndarray:
    """Rotate the feature pairs ``(x[..., first], x[..., second])`` by ``angle`` in float64 (RoFormer eq. 14):
    ``(x1 cos - x2 sin, x2 cos + x1 sin)``; ``angle`` broadcasts against ``x[..., first]``."""
    x = (x.detach().double().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)).copy()
    with np.errstate(invalid="ignore", over="ignore"):
        c, s = np.cos(angle), np.sin(angle)
        a, b = x[..., first].copy(), x[..., second].copy()
        x[..., first], x[..., second] = a * c - b * s, b * c + a * s
    return x


def pair_indices(rotary_dim: int, layout: str) -> tuple[list[int], list[int]]:
    """Feature indices of the rotary pairs: ``(i, i + d/2)`` ("half") or ``(2i, 2i + 1)`` ("interleaved")."""
    h = rotary_dim // 2
    if layout == "half":
        return list(range(h)), list(range(h, rotary_dim))
    return list(range(0, rotary_dim, 2)), list(range(1, rotary_dim, 2))


def rotate_np(x, positions, freqs, layout: str = "half") -> np.ndarray:
    """Explicit per-pair 2x2 rotation in float64 (RoFormer eq. 14) of the first ``2 * len(freqs)`` features of
    ``x (..., S, D)`` at positions ``(S,)``, or ``(B, S)`` (one row per leading batch entry of ``x``)."""
    freqs = np.asarray(freqs, dtype=np.float64)
    p = np.asarray(positions, dtype=np.float64)
    angle = p[..., None] * freqs                                          # (S, h) or (B, S, h)
    if p.ndim == 2:
        angle = angle.reshape(angle.shape[0], *([1] * (np.ndim(x) - 3)), *angle.shape[1:])
    return rotate_pairs(x, angle, *pair_indices(2 * len(freqs), layout))


def rotate(x: torch.Tensor, positions, freqs, layout: str) -> torch.Tensor:
    """:func:`rotate_np` as a float64 tensor."""
    return torch.from_numpy(rotate_np(x, positions, freqs, layout))


def convert_weight(w: np.ndarray, heads: int, src: str, dst: str, rot: int | None = None) -> np.ndarray:
    """Rows of a q/k projection moved between layouts, head by head: interleaved -> half takes rows
    ``[0, 2, 4, .., 1, 3, ..]`` of each head's rotary part (the pairing of RoFormer eq. 14 in each layout)."""
    hd = w.shape[0] // heads
    rot = hd if rot is None else rot
    perm = [*range(0, rot, 2), *range(1, rot, 2)]
    if src == dst:
        order = list(range(rot))
    elif src == "interleaved":
        order = perm
    else:
        order = list(np.argsort(perm))
    index = [h * hd + i for h in range(heads) for i in [*order, *range(rot, hd)]]
    return w[index]


def rms_norm_rope(x: torch.Tensor, w, positions, *, token: bool = False, offset: float = 0.0, eps: float = 1e-6,
                  layout: str = "half", base: float = 10000.0) -> np.ndarray:
    """``x (B, H, S, D)`` -> RoPE(x * rsqrt(mean(x^2) + eps) * (offset + w)) in float64 (RMSNorm, Zhang and
    Sennrich 2019, of each head, or of the whole token when ``token``; then RoFormer's rotation)."""
    xd = x.detach().double()
    axes = (1, 3) if token else (3,)
    n = xd * torch.rsqrt(xd.pow(2).mean(axes, keepdim=True) + eps)
    wd = torch.as_tensor(w, dtype=torch.float64)
    scale = (offset + wd).reshape(x.shape[1], 1, x.shape[3]) if token else offset + wd
    return rotate_np(n * scale, positions, default(x.shape[-1], base), layout)


def cos_sin_rule_mp(positions: list[int], dim: int, base: float, kind: str, factor: float, original: int):
    """``(cos, sin)`` rows ``a * cos(p theta_i)`` in mpmath (at the caller's precision), ``theta_i`` from each
    rule's published formula: "none" (RoFormer), "linear" (PI), "ntk" (base * f^(d / (d - 2))) or "yarn"
    (NTK-by-parts with YaRN's temperature ``a = 0.1 ln f + 1``)."""
    d = mpmath.mpf(dim)
    theta = [mpmath.power(mpmath.mpf(base), -mpmath.mpf(2 * i) / d) for i in range(dim // 2)]
    a = mpmath.mpf(1)
    f = mpmath.mpf(factor)
    if kind == "linear":                                                     # position interpolation
        theta = [t / f for t in theta]
    elif kind == "ntk":                                                      # base * f^(d / (d - 2))
        new_base = mpmath.mpf(base) * mpmath.power(f, d / (d - 2))
        theta = [mpmath.power(new_base, -mpmath.mpf(2 * i) / d) for i in range(dim // 2)]
    elif kind == "yarn":                                                     # NTK-by-parts + temperature
        def pair_index(rotations):
            return d * mpmath.log(original / (rotations * 2 * mpmath.pi)) / (2 * mpmath.log(base))
        low = max(int(mpmath.floor(pair_index(32))), 0)
        high = min(int(mpmath.ceil(pair_index(1))), dim - 1)
        width = mpmath.mpf(high - low) if high != low else mpmath.mpf("0.001")
        ramps = [min(max((i - low) / width, mpmath.mpf(0)), mpmath.mpf(1)) for i in range(dim // 2)]
        theta = [t / f * r + t * (1 - r) for t, r in zip(theta, ramps, strict=True)]
        a = mpmath.log(f) / 10 + 1 if factor > 1 else mpmath.mpf(1)
    cos = [[a * mpmath.cos(p * t) for t in theta] for p in positions]
    sin = [[a * mpmath.sin(p * t) for t in theta] for p in positions]
    return cos, sin


def theta_rule_mp(dim: int, base: float, kind: str, *, factor: float = 1.0, original: int = 0, seq_len: int = 0,
                  short=(), long=(), partial: float = 1.0, low: float = 1.0, high: float = 4.0):
    """``(theta, a)``: each rule's frequencies ``theta_i`` and attention factor ``a`` in mpmath, from the
    published formulas: "none", "linear", "ntk", "yarn" (as :func:`cos_sin_rule_mp`), "dynamic" (base
    ``* (f L / L0 - (f - 1))^(d/(d-2))`` for ``L > L0``), "llama3" (Llama 3.1's wavelength bands),
    "longrope" (``theta_i / ext_i``, long factors for ``L > L0``, ``a = sqrt(1 + ln f / ln L0)``) and
    "proportional" (the first ``int(p d / 2)`` pairs at ``theta_i / f``, the rest at 0)."""
    d, f = mpmath.mpf(dim), mpmath.mpf(factor)
    theta = [mpmath.power(mpmath.mpf(base), -mpmath.mpf(2 * i) / d) for i in range(dim // 2)]
    a = mpmath.mpf(1)
    if kind in ("none", "linear", "ntk", "yarn"):
        if kind == "linear":
            theta = [t / f for t in theta]
        elif kind == "ntk":
            nb = mpmath.mpf(base) * mpmath.power(f, d / (d - 2))
            theta = [mpmath.power(nb, -mpmath.mpf(2 * i) / d) for i in range(dim // 2)]
        elif kind == "yarn":
            def pair_index(rotations):
                return d * mpmath.log(original / (rotations * 2 * mpmath.pi)) / (2 * mpmath.log(base))
            lo = max(int(mpmath.floor(pair_index(32))), 0)
            hi = min(int(mpmath.ceil(pair_index(1))), dim - 1)
            width = mpmath.mpf(hi - lo) if hi != lo else mpmath.mpf("0.001")
            ramps = [min(max((i - lo) / width, mpmath.mpf(0)), mpmath.mpf(1)) for i in range(dim // 2)]
            theta = [t / f * r + t * (1 - r) for t, r in zip(theta, ramps, strict=True)]
    elif kind == "dynamic":
        if seq_len > original:
            nb = mpmath.mpf(base) * mpmath.power(f * seq_len / original - (f - 1), d / (d - 2))
            theta = [mpmath.power(nb, -mpmath.mpf(2 * i) / d) for i in range(dim // 2)]
    elif kind == "llama3":
        theta = _llama3_rule(theta, f, original, low, high, mpmath.pi)
    elif kind == "longrope":
        ext = long if seq_len > original else short
        theta = [t / mpmath.mpf(e) for t, e in zip(theta, ext, strict=True)]
        if factor > 1:
            a = mpmath.sqrt(1 + mpmath.log(f) / mpmath.log(original))
    elif kind == "proportional":
        rotating = int(partial * dim // 2)
        theta = [t / f for t in theta[:rotating]] + [mpmath.mpf(0)] * (dim // 2 - rotating)
    else:
        raise ValueError(kind)
    if kind == "yarn" and factor > 1:
        a = mpmath.log(f) / 10 + 1
    return theta, a
