"""Keras ``LearnedPositionalEmbedding``, mirroring posenc.nn."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from posenc import _validate
from posenc.core import sinusoidal as core_sinusoidal
from posenc.keras._common import exact_sin_cos, positions_or_range


@keras.saving.register_keras_serializable(package="posenc")
class LearnedPositionalEmbedding(keras.layers.Layer):
    """Adds a trainable embedding of each absolute position: ``x + weight[positions]``.

    Same arguments as :class:`posenc.nn.LearnedPositionalEmbedding`.  ``padding_idx`` keeps that
    row at zero with zero gradient (the weight is multiplied by a constant row mask).  A static
    length past the table raises ``ValueError``; inside a compiled graph, explicit positions cannot
    be checked, so size ``num_positions`` for the longest input.
    """

    def __init__(self, num_positions: int, dim: int, *, init: str = "normal", padding_idx: int | None = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_positions, self.dim, self.init, padding_idx = core_sinusoidal.check_learned_args(
            num_positions, dim, init, padding_idx)
        self.padding_idx = padding_idx
        if self.init == "sinusoidal":
            freqs = core_sinusoidal.frequencies(self.dim, 10000.0, "interleaved")
            s, c = exact_sin_cos(np.arange(self.num_positions), freqs)
            initializer = keras.initializers.Constant(core_sinusoidal.assemble(s, c, self.dim, "interleaved").astype(np.float32))
        elif self.init == "zeros":
            initializer = "zeros"
        else:
            initializer = keras.initializers.RandomNormal(stddev=0.02)
        self.weight = self.add_weight(shape=(self.num_positions, self.dim), initializer=initializer, name="weight")
        mask = np.ones((self.num_positions, 1), dtype=np.float32)
        if padding_idx is not None:
            mask[padding_idx] = 0.0
        self._row_mask = mask

    def call(self, x, positions=None, offset: int = 0):
        if x.shape[-1] is not None and x.shape[-1] != self.dim:
            raise ValueError(f"x must have last dimension dim={self.dim}, got shape {tuple(x.shape)}")
        offset = _validate.check_int("offset", offset)
        seq_len = x.shape[-2]
        if positions is None and seq_len is not None and (offset < 0 or offset + seq_len > self.num_positions):
            raise ValueError(
                f"positions {offset}..{offset + seq_len - 1} exceed the learned table: num_positions="
                f"{self.num_positions}; build the layer with num_positions >= {offset + seq_len}"
            )
        pos = positions_or_range(positions, ops.shape(x)[-2], offset)
        weight = self.weight * ops.convert_to_tensor(self._row_mask, dtype=self.weight.dtype)
        return x + ops.cast(ops.take(weight, pos, axis=0), x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        return {**super().get_config(), "num_positions": self.num_positions, "dim": self.dim, "init": self.init,
                "padding_idx": self.padding_idx}
