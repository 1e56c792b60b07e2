"""Independent oracles for attention biases: ALiBi slopes by the paper's rule, T5 buckets by the
formula in float64, and attention by explicit softmax in float64.  Nothing here imports posenc."""

from __future__ import annotations

import math

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


def attention(q, k, v, bias=None, allowed=None, scale=None):
    """softmax(q k^T * scale + bias, masked) v in float64; q (B,H,S,D), k/v (B,H_kv,S_k,D)."""
    q, k, v = q.double(), k.double(), v.double()
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        logits = logits + bias.double()
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    return torch.softmax(logits, -1) @ v
