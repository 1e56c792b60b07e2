"""Independent oracles for attention biases: ALiBi slopes by the paper's rule, T5 buckets by the
formula in float64, and attention by explicit softmax in float64.  Nothing here imports posenc."""

from __future__ import annotations

import math

import numpy as np
import torch


def alibi_slopes(n: int) -> list[float]:
    """Press et al. 2022 reference rule (get_slopes)."""
    def pow2(k):
        start = 2 ** (-(2 ** -(math.log2(k) - 3)))
        return [start * start**i for i in range(k)]
    if math.log2(n).is_integer():
        return pow2(n)
    c = 2 ** math.floor(math.log2(n))
    return pow2(c) + alibi_slopes(2 * c)[0::2][: n - c]


def t5_bucket(rp: int, bidirectional=True, num_buckets=32, max_distance=128) -> int:
    b = 0
    if bidirectional:
        num_buckets //= 2
        if rp > 0:
            b += num_buckets
        n = abs(rp)
    else:
        n = max(-rp, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return b + n
    try:
        ratio = math.log(n / max_exact) / math.log(max_distance / max_exact)
    except OverflowError:                                       # integers past float64: logs of each
        ratio = (math.log(n) - math.log(max_exact)) / (math.log(max_distance) - math.log(max_exact))
    v = max_exact + int(ratio * (num_buckets - max_exact))
    return b + min(v, num_buckets - 1)


def alibi_bias(q_pos, k_pos, slopes, symmetric: bool = False) -> np.ndarray:
    """ALiBi's bias ``-m_h * (q - k)`` (``|q - k|`` when ``symmetric``) in float64 (Press et al. 2022):
    ``(H, S, S_k)``, or ``(B, H, S, S_k)`` when a position array is per row; distances exact in int64."""
    qp, kp = np.asarray(q_pos, dtype=np.int64), np.asarray(k_pos, dtype=np.int64)
    dist = qp[..., :, None] - kp[..., None, :]
    dist = np.abs(dist) if symmetric else dist
    m = np.asarray(slopes, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        if dist.ndim == 3:
            return -m[None, :, None, None] * dist[:, None].astype(np.float64)
        return -m[:, None, None] * dist[None].astype(np.float64)


def clipped_index(rel, max_distance: int, min_distance: int | None = None, symmetric: bool = False) -> np.ndarray:
    """Shaw et al. (2018): each distance clipped to [min_distance, max_distance] (min: -max_distance), one row per
    clipped distance counted from the most negative; by magnitude when symmetric."""
    low = -max_distance if min_distance is None else min_distance
    out = []
    for d in np.asarray(rel, dtype=object).ravel().tolist():
        c = min(max(int(d), low), max_distance)
        out.append(abs(c) if symmetric else c - low)
    return np.array(out, dtype=np.int64).reshape(np.shape(rel))


def t5_buckets(rel, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """:func:`t5_bucket` of every ``key - query`` distance in an array of any shape (int64)."""
    rel = np.asarray(rel, dtype=object)
    if not rel.size:
        return np.zeros(rel.shape, np.int64)
    return np.vectorize(lambda r: t5_bucket(int(r), bidirectional, num_buckets, max_distance), otypes=[np.int64])(rel)


def attention(q, k, v, bias=None, allowed=None, scale=None):
    """softmax(q k^T * scale + bias, masked) v in float64 (Vaswani et al. 2017, eq. 1); q (B,H,S,D),
    k/v (B,H_kv,S_k,D) as tensors or arrays; k and v repeated for grouped queries."""
    q, k, v = (_f64(t) for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        logits = logits + _f64(bias)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    return torch.softmax(logits, -1) @ v


def _f64(t) -> torch.Tensor:
    return t.double() if isinstance(t, torch.Tensor) else torch.as_tensor(np.asarray(t, dtype=np.float64))
