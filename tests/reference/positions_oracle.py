"""Independent oracles of the position rules for padded and packed batches, written as plain loops.

* From a padding mask: each real token numbered from the row's offset, padding skipped (Hugging Face's
  ``position_ids = cumsum(mask) - 1``).
* From segment ids: positions restart at 0 wherever the id changes (packed sequences, Krell et al. 2021).
* From cumulative lengths ``cu_seqlens`` (FlashAttention's varlen layout): each sequence numbered from
  its offset.

Nothing here imports posenc.
"""

from __future__ import annotations

import numpy as np


def from_mask(mask, offset=0) -> np.ndarray:
    """``(B, S)`` positions of the non-zero entries of ``mask``, counted from ``offset`` (an int or one per row)."""
    mask = np.asarray(mask) != 0
    out = np.zeros(mask.shape, np.int64)
    offs = np.broadcast_to(np.asarray(offset, np.int64), (mask.shape[0],))
    for b in range(mask.shape[0]):
        n = 0
        for s in range(mask.shape[1]):
            if mask[b, s]:
                out[b, s] = offs[b] + n
                n += 1
    return out


def from_segment_ids(ids) -> np.ndarray:
    """``(B, S)`` or ``(S,)`` positions: 0 at each token whose id differs from the previous one, else one more."""
    ids = np.asarray(ids)
    rows = ids if ids.ndim == 2 else ids[None]
    out = np.zeros(rows.shape, np.int64)
    for b in range(rows.shape[0]):
        for s in range(1, rows.shape[1]):
            out[b, s] = out[b, s - 1] + 1 if rows[b, s] == rows[b, s - 1] else 0
    return out if ids.ndim == 2 else out[0]


def from_cu_seqlens(cu, offsets=None) -> np.ndarray:
    """``(T,)`` positions of packed sequences ``[cu[i], cu[i+1])``, each numbered from ``offsets[i]`` (default 0)."""
    out = []
    for i, (a, z) in enumerate(zip(cu, cu[1:], strict=False)):
        out += [(0 if offsets is None else offsets[i]) + j for j in range(z - a)]
    return np.asarray(out, np.int64)
