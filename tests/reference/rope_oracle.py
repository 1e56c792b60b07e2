"""Independent float64 oracles of RoPE frequencies and rotations, written from the papers' formulas
(RoFormer; PI; NTK; dynamic NTK; YaRN; Llama 3.1; LongRoPE) as summarised in FAILURE_MODES.md 3.3.
Nothing here imports posenc."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import torch


def default(dim, base):
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


def llama3(dim, base, factor, original, low=1.0, high=4.0):
    out = []
    for t in default(dim, base):
        wavelen = 2 * math.pi / t
        if wavelen < original / high:
            out.append(t)
        elif wavelen > original / low:
            out.append(t / factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * t / factor + smooth * t)
    return np.array(out)


def longrope(dim, base, short, long, original, seq_len):
    ext = np.array(long if seq_len is not None and seq_len > original else short)
    return default(dim, base) / ext


def cos_sin_mp(positions, freqs):
    """mpmath cos/sin of exact products ``p * f`` (the frequencies taken as given)."""
    mpmath.mp.prec = 200
    cos = [[mpmath.cos(int(p) * mpmath.mpf(float(f))) for f in freqs] for p in positions]
    sin = [[mpmath.sin(int(p) * mpmath.mpf(float(f))) for f in freqs] for p in positions]
    return cos, sin


def rotate(x: torch.Tensor, positions, freqs, layout: str) -> torch.Tensor:
    """Explicit per-pair 2x2 rotation in float64 (RoFormer eq. 14), rotary dim = 2 * len(freqs)."""
    x = x.double().clone()
    h = len(freqs)
    pos = torch.as_tensor(positions, dtype=torch.float64)
    for i, f in enumerate(freqs):
        a, b = (i, i + h) if layout == "half" else (2 * i, 2 * i + 1)
        angle = pos * float(f)                      # broadcast over the sequence axis (-2)
        c, s = torch.cos(angle)[:, None], torch.sin(angle)[:, None]
        x1, x2 = x[..., a : a + 1].clone(), x[..., b : b + 1].clone()
        x[..., a : a + 1] = x1 * c - x2 * s
        x[..., b : b + 1] = x2 * c + x1 * s
    return x
