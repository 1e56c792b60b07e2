"""Keras ``LearnedPositionalEmbedding``, mirroring posenc.nn."""

from __future__ import annotations

import warnings

import keras
import numpy as np
from keras import ops

from posenc._deprecate import UNSET, renamed
from posenc.core import sinusoidal as core_sinusoidal
from posenc.keras._common import (
    PositionsLayer,
    check_embeddings,
    check_position_args,
    exact_sin_cos,
    positions_or_range,
    static_shape,
    value_range,
)


@keras.saving.register_keras_serializable(package="posenc")
class LearnedPositionalEmbedding(PositionsLayer):
    """Adds a trainable embedding of each absolute position: ``x + weight[positions]``.

    Same arguments as :class:`posenc.nn.LearnedPositionalEmbedding`.  ``padding_idx`` keeps that
    row at zero with zero gradient (the weight is multiplied by a constant row mask).

    ``x`` is ``(B, S, D)`` or ``(S, D)`` floating; ``positions`` (optional) integers ``(S,)`` or
    ``(B, S)``, excluding a nonzero ``offset``.  A position outside ``[0, max_seq_len)`` raises
    ``ValueError``: always for ``offset`` (the length is static), and for explicit ``positions``
    where their values are concrete (NumPy, eager tensors).  Inside a traced graph (``jax.jit``,
    ``tf.function``) explicit positions cannot be read and are not checked (JAX gives NaN rows for
    positions past the table), so size ``max_seq_len`` for the longest input there.  ``num_positions``
    is the old name of ``max_seq_len`` (deprecated), also as a key of a saved config.
    """

    def __init__(self, max_seq_len: int | None = None, dim: int | None = None, *, init: str = "normal",
                 padding_idx: int | None = None, **kwargs) -> None:
        max_seq_len = renamed("LearnedPositionalEmbedding", "num_positions", "max_seq_len",
                              kwargs.pop("num_positions", UNSET), max_seq_len, None)
        super().__init__(**kwargs)
        self.max_seq_len, self.dim, self.init, padding_idx = core_sinusoidal.check_learned_args(
            max_seq_len, dim, init, padding_idx)
        self.padding_idx = padding_idx
        if self.init == "sinusoidal":
            freqs = core_sinusoidal.frequencies(self.dim, 10000.0, "interleaved")
            s, c = exact_sin_cos(np.arange(self.max_seq_len), freqs)
            initializer = keras.initializers.Constant(core_sinusoidal.assemble(s, c, self.dim, "interleaved").astype(np.float32))
        elif self.init == "zeros":
            initializer = "zeros"
        else:
            initializer = keras.initializers.RandomNormal(stddev=0.02)
        self.weight = self.add_weight(shape=(self.max_seq_len, self.dim), initializer=initializer, name="weight")
        mask = np.ones((self.max_seq_len, 1), dtype=np.float32)
        if padding_idx is not None:
            mask[padding_idx] = 0.0
        self._row_mask = mask

    @property
    def num_positions(self) -> int:
        """Old name of ``max_seq_len`` (deprecated)."""
        warnings.warn("LearnedPositionalEmbedding.num_positions is deprecated and will be removed in the next "
                      "release; read max_seq_len instead", DeprecationWarning, stacklevel=2)
        return self.max_seq_len

    def _check_call(self, x, positions, offset):
        check_embeddings(x, self.dim)
        shape = static_shape(x)
        positions, offset = check_position_args(positions, offset, shape, len(shape) - 2)
        if positions is None and shape[-2] is not None:
            self._check_rows(offset, offset + shape[-2] - 1)
        elif positions is not None and (rng := value_range(positions)) is not None:
            self._check_rows(*rng)
        return positions, offset

    def _check_rows(self, lo: int, hi: int) -> None:
        """Reject positions ``[lo, hi]`` outside the table's rows ``[0, max_seq_len)``."""
        if hi < lo or (lo >= 0 and hi < self.max_seq_len):                   # empty, or inside
            return
        fix = "positions (and offset) index the table, so they must be >= 0" if lo < 0 else \
            f"build the layer with max_seq_len >= {hi + 1}"
        raise ValueError(f"positions must lie in [0, max_seq_len={self.max_seq_len}), got values in [{lo}, {hi}]; {fix}")

    def call(self, x, positions=None, offset: int = 0):
        positions, offset = self._check_call(x, positions, offset)
        pos = positions_or_range(positions, ops.shape(x)[-2], offset)
        weight = self.weight * ops.convert_to_tensor(self._row_mask, dtype=self.weight.dtype)
        return x + ops.cast(ops.take(weight, pos, axis=0), x.dtype)

    def compute_output_spec(self, x, positions=None, offset: int = 0):
        self._check_call(x, positions, offset)                                         # static checks only
        return keras.KerasTensor(x.shape, dtype=self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        return {**super().get_config(), "max_seq_len": self.max_seq_len, "dim": self.dim, "init": self.init,
                "padding_idx": self.padding_idx}
