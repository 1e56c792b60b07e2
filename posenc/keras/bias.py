"""Keras ``AlibiBias`` and ``RelativePositionBias``, mirroring posenc.nn."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from posenc import _validate
from posenc.core import alibi as core_alibi
from posenc.core import relative as core_relative


def _distances(positions, key_positions):
    """``q - k`` as int32, ``(S, S_k)`` or ``(B, S, S_k)``."""
    q = ops.cast(positions, "int32")
    k = ops.cast(key_positions, "int32")
    return ops.expand_dims(q, -1) - ops.expand_dims(k, -2)


@keras.saving.register_keras_serializable(package="posenc")
class AlibiBias(keras.layers.Layer):
    """ALiBi logit bias ``-m_h * (q_i - k_j)`` (``|q_i - k_j|`` if ``symmetric``), ``(H, S, S_k)``.

    Slopes follow the paper's rule for any head count (the same core as the torch side).
    """

    def __init__(self, num_heads: int, *, symmetric: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_heads = _validate.check_int("num_heads", num_heads, minimum=1)
        if not isinstance(symmetric, bool):
            raise TypeError(f"symmetric must be a bool, got {symmetric!r}")
        self.symmetric = symmetric
        self.slopes = np.array(core_alibi.alibi_slopes(self.num_heads), dtype=np.float32)

    def call(self, positions, key_positions=None):
        key_positions = positions if key_positions is None else key_positions
        dist = _distances(positions, key_positions)
        neg = -ops.abs(dist) if self.symmetric else -dist
        bias = ops.expand_dims(ops.cast(neg, "float32"), -3) * ops.reshape(ops.convert_to_tensor(self.slopes), (-1, 1, 1))
        return ops.cast(bias, self.compute_dtype)

    def get_config(self) -> dict:
        return {**super().get_config(), "num_heads": self.num_heads, "symmetric": self.symmetric}


@keras.saving.register_keras_serializable(package="posenc")
class RelativePositionBias(keras.layers.Layer):
    """T5 bucketed relative bias with a learned ``(num_buckets, num_heads)`` weight -> ``(H, S, S_k)``.

    Buckets come from exact integer thresholds (posenc.core.relative), identical to the torch side.
    """

    def __init__(self, num_heads: int, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_heads = _validate.check_int("num_heads", num_heads, minimum=1)
        self.num_buckets, self.max_distance, self.bidirectional = core_relative.check_bucket_args(
            num_buckets, max_distance, bidirectional)
        self.per_side, self.max_exact, thr = core_relative.thresholds(self.num_buckets, self.max_distance, self.bidirectional)
        self._thresholds = np.array(thr, dtype=np.int32)
        self.weight = self.add_weight(shape=(self.num_buckets, self.num_heads),
                                      initializer=keras.initializers.RandomNormal(stddev=1.0), name="weight")

    def buckets(self, positions, key_positions):
        rel = -_distances(positions, key_positions)                              # key - query
        if self.bidirectional:
            offset = ops.cast(rel > 0, "int32") * self.per_side
            n = ops.abs(rel)
        else:
            offset = ops.zeros_like(rel)
            n = ops.maximum(-rel, 0)
        thr = ops.convert_to_tensor(self._thresholds)
        far = self.max_exact + ops.sum(ops.cast(ops.expand_dims(n, -1) >= thr, "int32"), axis=-1)
        far = ops.minimum(far, self.per_side - 1)
        return offset + ops.where(n < self.max_exact, n, far)

    def call(self, positions, key_positions=None):
        key_positions = positions if key_positions is None else key_positions
        values = ops.take(self.weight, self.buckets(positions, key_positions), axis=0)   # (..., S, S_k, H)
        return ops.cast(ops.moveaxis(values, -1, -3), self.compute_dtype)

    def get_config(self) -> dict:
        return {**super().get_config(), "num_heads": self.num_heads, "num_buckets": self.num_buckets,
                "max_distance": self.max_distance, "bidirectional": self.bidirectional}
