"""Helpers of the Keras port (not public): exact NumPy tables from posenc.core, keras.ops glue."""

from __future__ import annotations

import numpy as np
from keras import ops

from posenc.core import exact


def exact_sin_cos(positions: np.ndarray, frequencies) -> tuple[np.ndarray, np.ndarray]:
    """Float64 ``(sin, cos)`` of ``positions[..., None] * frequencies`` (exact, see posenc.core.exact)."""
    return exact.sin_cos(np.asarray(positions, dtype=np.float64), exact.turns_split(tuple(frequencies)))


def positions_or_range(positions, seq_len, offset: int):
    """``positions`` as int32, or ``offset + arange(seq_len)``."""
    if positions is None:
        return ops.arange(seq_len, dtype="int32") + offset
    return ops.cast(positions, "int32")


def lookup(table: np.ndarray, positions, fallback):
    """Rows of a float32 ``table (P, n)`` for ``positions (...)``; positions outside ``[0, P)`` use
    ``fallback(positions)`` (computed in graph), never a silently clipped row."""
    rows = table.shape[0]
    idx = ops.clip(positions, 0, rows - 1)
    inside = ops.logical_and(positions >= 0, positions < rows)
    found = ops.take(ops.convert_to_tensor(table, dtype="float32"), idx, axis=0)
    return ops.where(ops.expand_dims(inside, -1), found, fallback(positions))


def float32_angles(positions, inv_freq: np.ndarray):
    """``positions * inv_freq`` in float32 (only used past the exact tables)."""
    return ops.expand_dims(ops.cast(positions, "float32"), -1) * ops.convert_to_tensor(inv_freq.astype(np.float32))
