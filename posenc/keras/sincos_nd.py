"""Keras ``SinusoidalEncodingND``: the sin-cos table of a 2-D/3-D patch grid, mirroring posenc.nn."""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from posenc import _validate
from posenc.core import sincos_nd as core_sincos_nd
from posenc.keras._common import check_embeddings, differ, static_shape


@keras.saving.register_keras_serializable(package="posenc")
class SinusoidalEncodingND(keras.layers.Layer):
    """Adds the sin-cos position table of an image or video patch grid: ``x * scale + PE``.

    Same arguments and numbers as :class:`posenc.nn.SinusoidalEncodingND` (without ``device``; the
    grid first, then ``dim``, the old order ``(dim, grid_shape)`` still read with a
    ``DeprecationWarning``):
    ``PE`` has ``prefix_tokens`` zero rows, then one row per patch of ``grid_shape`` in row-major
    order; a 2-D row is ``[sin(w f) | cos(w f) | sin(h f) | cos(h f)]`` with
    ``f_k = base^(-k / (D/4))`` (``order="mae"``: MAE, ViTMAE, diffusers) or
    ``[sin(h f) | sin(w f) | cos(h f) | cos(w f)]`` (``order="timm"``); a 3-D grid ``(T, H, W)``
    gets CogVideoX's split.  The table is computed in NumPy from exact angles and rounded once to
    float32; the sum is formed in float32 and rounded once to the layer's compute dtype.  Another
    grid (``call(x, grid_shape=...)``, sizes known when the graph is built) gets its own exact table.

    ``x`` is ``(B, N, D)`` or ``(N, D)`` floating with ``N = prefix_tokens + prod(grid_shape)``.

    Examples:
        >>> import keras
        >>> layer = SinusoidalEncodingND((2, 3), 8, prefix_tokens=1)
        >>> tuple(layer(keras.ops.zeros((1, 7, 8))).shape)
        (1, 7, 8)
        >>> layer.table((1, 2))[2].tolist()  # doctest: +ELLIPSIS
        [0.84147..., 0.00999..., 0.54030..., 0.99994..., 0.0, 0.0, 1.0, 1.0]
    """

    def __init__(self, grid_shape, dim: int, *, base: float = 10000.0, prefix_tokens: int = 0, order: str = "mae",
                 base_size=None, interpolation_scale=1.0, scale: float = 1.0, **kwargs) -> None:
        grid_shape, dim = core_sincos_nd.old_argument_order(grid_shape, dim)
        super().__init__(**kwargs)
        (self.grid_shape, self.dim, self.base, self.prefix_tokens, self.order, self.base_size,
         self.interpolation_scale) = core_sincos_nd.check_table_args(
            grid_shape, dim, base, prefix_tokens, order, base_size, interpolation_scale)
        self.scale = _validate.check_float("scale", scale)
        self._table = self._compute(self.grid_shape)                                     # (N, D) float32

    def _compute(self, grid_shape) -> np.ndarray:
        return core_sincos_nd.table(
            grid_shape, self.dim, base=self.base, prefix_tokens=self.prefix_tokens, order=self.order,
            base_size=self.base_size, interpolation_scale=self.interpolation_scale).astype(np.float32)

    def num_tokens(self, grid_shape=None) -> int:
        """``prefix_tokens + prod(grid_shape)``: the sequence length ``N`` the table covers."""
        return self.prefix_tokens + math.prod(self.grid_shape if grid_shape is None else grid_shape)

    def _check_grid(self, grid_shape) -> tuple[int, ...]:
        return core_sincos_nd.call_grid(grid_shape, self.grid_shape, "layer")

    def table(self, grid_shape=None) -> np.ndarray:
        """The ``(prefix_tokens + prod(grid_shape), D)`` float32 table (NumPy); default: the layer's grid."""
        grid_shape = self._check_grid(grid_shape)
        return self._table if grid_shape == self.grid_shape else self._compute(grid_shape)

    def _check_call(self, x, grid_shape) -> tuple[int, ...]:
        check_embeddings(x, self.dim)
        grid = self._check_grid(grid_shape)
        tokens = self.num_tokens(grid)
        if differ(static_shape(x)[-2], tokens):
            given = "" if grid_shape is None else "given "
            raise ValueError(
                f"x has {static_shape(x)[-2]} tokens but the {given}grid_shape={grid} with "
                f"prefix_tokens={self.prefix_tokens} has {tokens}; pass grid_shape=(...) for the grid of x "
                f"(prefix_tokens + prod(grid_shape) tokens)"
            )
        return grid

    def call(self, x, grid_shape=None):
        pe = ops.convert_to_tensor(self.table(self._check_call(x, grid_shape)), dtype="float32")   # (N, D)
        return ops.cast(ops.cast(x, "float32") * self.scale + pe, self.compute_dtype)

    def compute_output_spec(self, x, grid_shape=None):
        self._check_call(x, grid_shape)                                                   # static checks only
        return keras.KerasTensor(x.shape, dtype=self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        return {**super().get_config(), "dim": self.dim, "grid_shape": list(self.grid_shape), "base": self.base,
                "prefix_tokens": self.prefix_tokens, "order": self.order,
                "base_size": None if self.base_size is None else list(self.base_size),
                "interpolation_scale": list(self.interpolation_scale), "scale": self.scale}
