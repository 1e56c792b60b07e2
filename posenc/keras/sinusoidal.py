"""Keras ``SinusoidalEncoding`` (Vaswani et al. 2017, section 3.5), mirroring posenc.nn."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from posenc import _validate
from posenc.core import sinusoidal as core_sinusoidal
from posenc.keras._common import (
    PositionsLayer,
    check_embeddings,
    check_position_args,
    exact_sin_cos,
    float32_angles,
    lookup,
    positions_or_range,
    static_shape,
)


@keras.saving.register_keras_serializable(package="posenc")
class SinusoidalEncoding(PositionsLayer):
    """Adds the sinusoidal positional encoding: ``x * scale + PE`` (then dropout in training).

    Same arguments as :class:`posenc.nn.SinusoidalEncoding` (without ``device``/``inplace``).  The
    table of ``max_seq_len`` rows is computed at construction in NumPy from exact angles and rounded
    once to float32; the sum is formed in float32 and rounded once to the layer's compute dtype, so
    ``mixed_bfloat16``/``mixed_float16`` policies get the exact result rounded to their dtype.
    Positions past the table use float32 angles computed in the graph (error up to about
    ``position * 6e-8``), since JAX has no float64 by default.

    ``x`` is ``(B, S, D)`` or ``(S, D)`` floating; ``positions`` (optional) integers ``(S,)`` or
    ``(B, S)``, excluding a nonzero ``offset``.  Positions are indexed in int32: values outside
    ``[-2**31, 2**31 - 1]`` raise ``ValueError`` where they are concrete (NumPy, eager tensors), but
    inside a traced graph (``jax.jit``, ``tf.function``) they cannot be read and would wrap.

    Examples:
        >>> import keras
        >>> SinusoidalEncoding(6, max_seq_len=10)(keras.ops.zeros((1, 2, 6)))[0, 1].tolist()  # doctest: +ELLIPSIS
        [0.84147..., 0.54030..., 0.04639..., 0.99892..., 0.00215..., 0.99999...]
    """

    def __init__(self, dim: int, *, max_seq_len: int = 2048, base: float = 10000.0, layout: str = "interleaved",
                 scale: float = 1.0, dropout: float = 0.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.dim, self.max_seq_len, self.base, self.layout, self.scale, self.dropout = core_sinusoidal.check_encoding_args(
            dim, max_seq_len, base, layout, scale, dropout)
        freqs = core_sinusoidal.frequencies(self.dim, self.base, self.layout)
        s, c = exact_sin_cos(np.arange(self.max_seq_len), freqs)
        self._table = core_sinusoidal.assemble(s, c, self.dim, self.layout).astype(np.float32)      # (P, D), one rounding
        self._inv_freq = np.array([float(f) for f in freqs])
        self._drop = keras.layers.Dropout(self.dropout) if self.dropout else None

    def table(self, length: int | None = None) -> np.ndarray:
        """The ``(length, D)`` float32 table (NumPy), rows ``0 .. length - 1``."""
        length = self.max_seq_len if length is None else _validate.check_int("length", length, minimum=0)
        if length <= self.max_seq_len:
            return self._table[:length]
        s, c = exact_sin_cos(np.arange(length), core_sinusoidal.frequencies(self.dim, self.base, self.layout))
        return core_sinusoidal.assemble(s, c, self.dim, self.layout).astype(np.float32)

    def _analytic(self, positions):
        angles = float32_angles(positions, self._inv_freq)
        s, c = ops.sin(angles), ops.cos(angles)
        if self.layout == "interleaved":
            pairs = ops.stack([s, c], axis=-1)
            flat = ops.reshape(pairs, (*ops.shape(pairs)[:-2], 2 * self._inv_freq.size))
            return flat[..., : self.dim]
        parts = [s, c[..., : self.dim // 2]] if self.layout == "concat" else [s, c] + (
            [ops.zeros_like(s[..., :1])] if self.dim % 2 else [])
        return ops.concatenate(parts, axis=-1)

    def _check_call(self, x, positions, offset):
        check_embeddings(x, self.dim)
        shape = static_shape(x)
        return check_position_args(positions, offset, shape, len(shape) - 2)

    def call(self, x, positions=None, offset: int = 0, training=None):
        positions, offset = self._check_call(x, positions, offset)
        pos = positions_or_range(positions, ops.shape(x)[-2], offset)
        pe = lookup(self._table, pos, self._analytic)                                    # (..., S, D) float32
        out = ops.cast(ops.cast(x, "float32") * self.scale + pe, self.compute_dtype)
        if self._drop is not None:
            out = self._drop(out, training=training)
        return out

    def compute_output_spec(self, x, positions=None, offset: int = 0, training=None):
        self._check_call(x, positions, offset)                                         # static checks only
        return keras.KerasTensor(x.shape, dtype=self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        return {**super().get_config(), "dim": self.dim, "max_seq_len": self.max_seq_len, "base": self.base,
                "layout": self.layout, "scale": self.scale, "dropout": self.dropout}
