"""Rotary implementations written for the tests after peers' public formulas, with switches that plant the bug
classes ``posenc.testing`` must name.  Nothing here imports posenc.

Each ``make_*`` returns ``fn(q, k, positions) -> (q, k)`` for q, k ``(B, H, S, D)`` and positions ``(B, S)`` or
``(S,)``, rotating the first ``rot`` features (the last ``rot`` with ``trailing=True``) by ``positions * freqs``:

- ``make_hf``: transformers' formula: ``emb = cat(freqs, freqs)``, ``q * cos + rotate_half(q) * sin`` with
  ``rotate_half(x) = cat(-x2, x1)`` (pairs ``i, i + d/2``), table computed in ``table_dtype``;
- ``make_meta``: Meta's Llama reference ``apply_rotary_emb``: adjacent pairs viewed as complex numbers times
  ``polar(1, angle)`` (pairs ``2i, 2i + 1``);
- ``make_gptj``: GPT-J's ``rotate_every_two`` with ``repeat_interleave``d sin and cos (pairs ``2i, 2i + 1``).

Bugs: ``k_sign`` / ``q_sign`` = -1 rotate by ``-theta``; ``table_dtype=torch.bfloat16`` builds the angles in
bfloat16; ``decode_bug`` rotates a single-token call as position 0; ``trailing`` rotates the last features;
``freqs`` can be any frequencies (a rule, or a rule applied to the wrong pairs).
"""

from __future__ import annotations

import math

import numpy as np
import torch


def plain(rot: int, base: float = 10000.0) -> np.ndarray:
    return np.array([base ** (-2 * i / rot) for i in range(rot // 2)])


def llama3_on_wrong_band(rot: int, base: float, factor: float, original: int, high: float = 4.0) -> np.ndarray:
    """Llama 3's division by ``factor`` applied to the *short* wavelengths (the test of a flipped comparison)."""
    theta = plain(rot, base)
    wavelength = 2 * math.pi / theta
    return np.where(wavelength < original / high, theta / factor, theta)


def _angles(positions: torch.Tensor, freqs: np.ndarray, table_dtype: torch.dtype, decode_bug: bool) -> torch.Tensor:
    p = positions.reshape(-1)
    if decode_bug and p.numel() == 1:
        p = torch.zeros_like(p)                      # the bug: the cache offset is not added at decode
    f = torch.tensor(freqs, dtype=torch.float64)
    return (p.to(table_dtype)[:, None] * f.to(table_dtype)[None]).float()        # (S, rot/2)


def _apply(x: torch.Tensor, rot: int, trailing: bool, rotate) -> torch.Tensor:
    x = x.clone()
    part = slice(x.shape[-1] - rot, None) if trailing else slice(0, rot)
    x[..., part] = rotate(x[..., part])
    return x


def make_hf(rot: int, freqs: np.ndarray | None = None, *, table_dtype=torch.float32, q_sign: int = 1, k_sign: int = 1,
            trailing: bool = False, decode_bug: bool = False, attention_factor: float = 1.0):
    freqs = plain(rot) if freqs is None else freqs

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def fn(q, k, positions):
        ang = _angles(positions, freqs, table_dtype, decode_bug)
        emb = torch.cat((ang, ang), dim=-1)
        cos, sin = emb.cos() * attention_factor, emb.sin() * attention_factor
        out_q = _apply(q, rot, trailing, lambda x: x * cos + q_sign * rotate_half(x) * sin)
        out_k = _apply(k, rot, trailing, lambda x: x * cos + k_sign * rotate_half(x) * sin)
        return out_q, out_k

    return fn


def make_meta(rot: int, freqs: np.ndarray | None = None, *, table_dtype=torch.float32, q_sign: int = 1, k_sign: int = 1,
              trailing: bool = False, decode_bug: bool = False):
    freqs = plain(rot) if freqs is None else freqs

    def complex_rotate(x, ang, sign):
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
        turned = pairs * torch.polar(torch.ones_like(ang), sign * ang)
        return torch.view_as_real(turned).flatten(-2).to(x.dtype)

    def fn(q, k, positions):
        ang = _angles(positions, freqs, table_dtype, decode_bug)
        return (_apply(q, rot, trailing, lambda x: complex_rotate(x, ang, q_sign)),
                _apply(k, rot, trailing, lambda x: complex_rotate(x, ang, k_sign)))

    return fn


def make_gptj(rot: int, freqs: np.ndarray | None = None, *, table_dtype=torch.float32, q_sign: int = 1, k_sign: int = 1,
              trailing: bool = False, decode_bug: bool = False):
    freqs = plain(rot) if freqs is None else freqs

    def rotate_every_two(x):
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((-x2, x1), dim=-1).flatten(-2)

    def fn(q, k, positions):
        ang = _angles(positions, freqs, table_dtype, decode_bug)
        sin, cos = torch.repeat_interleave(ang.sin(), 2, -1), torch.repeat_interleave(ang.cos(), 2, -1)
        return (_apply(q, rot, trailing, lambda x: x * cos + q_sign * rotate_every_two(x) * sin),
                _apply(k, rot, trailing, lambda x: x * cos + k_sign * rotate_every_two(x) * sin))

    return fn


PEERS = {"hf": (make_hf, "half"), "meta": (make_meta, "interleaved"), "gptj": (make_gptj, "interleaved")}
