"""Keras ``AxialRotaryEmbedding`` (N-axis RoPE: FLUX, EVA), mirroring posenc.nn (fixed frequencies)."""

from __future__ import annotations

import warnings

import keras
import numpy as np
from keras import ops

from posenc import _validate
from posenc._deprecate import UNSET, renamed
from posenc.core import axial as core_axial
from posenc.core.rope import ROPE_LAYOUTS
from posenc.keras._common import (
    PositionsLayer,
    check_position_values,
    check_qk_shape,
    differ,
    exact_sin_cos,
    integer_positions,
    normalize_seq_dim,
    static_shape,
)

__all__ = ["AxialRotaryEmbedding"]

@keras.saving.register_keras_serializable(package="posenc")
class AxialRotaryEmbedding(PositionsLayer):
    """Rotary embedding over several position axes; same conventions as
    :class:`posenc.nn.axial_rotary.AxialRotaryEmbedding` (fixed frequencies only).

    ``call(q, k=None, positions=..., seq_dim=-2)`` rotates the first ``sum(axes_dims)`` features of
    ``q`` (and ``k``) by the integer coordinates ``positions (S, n_axes)`` or ``(B, S, n_axes)``;
    block ``a`` rotates pair ``i`` by ``p_a * base^(-2i / axes_dims[a])``, pairs ``(2i, 2i+1)``
    (``layout="interleaved"``) or ``(i, i + d_a/2)`` (``"half"``) inside each block.  It returns
    ``(q, k)``, or the rotated ``q`` alone when ``k`` is None (a Keras graph output must be a
    tensor).  Coordinates ``0 .. max_seq_len - 1`` come from exact float32 tables (the same
    NumPy core as the torch side); others are computed in float32 in the graph.  The rotation
    runs in float32 and rounds once to the compute dtype.  ``max_positions`` is the old name of
    ``max_seq_len`` (deprecated), also as a key of a saved config.
    """

    _position_args = ()

    def __init__(self, axes_dims, *, base: float = 10000.0, layout: str = "interleaved", max_seq_len: int = 1024,
                 **kwargs) -> None:
        default = (AxialRotaryEmbedding.__init__.__kwdefaults__ or {})["max_seq_len"]   # the default object itself
        max_seq_len = renamed("AxialRotaryEmbedding", "max_positions", "max_seq_len", kwargs.pop("max_positions", UNSET),
                              max_seq_len, default)
        super().__init__(**kwargs)
        self.axes_dims = core_axial.check_axes_dims(tuple(axes_dims) if isinstance(axes_dims, list) else axes_dims)
        self.n_axes = len(self.axes_dims)
        self.dim = sum(self.axes_dims)
        self.base = _validate.check_float("base", base, positive=True)
        self.layout = _validate.check_choice("layout", layout, ROPE_LAYOUTS)
        self.max_seq_len = _validate.check_int("max_seq_len", max_seq_len, minimum=1)
        freqs = core_axial.axial_frequencies(self.axes_dims, self.base)
        s, c = exact_sin_cos(np.arange(self.max_seq_len), freqs)                     # (P, h) float64
        self._cos, self._sin = c.astype(np.float32), s.astype(np.float32)
        self._inv = np.array([float(f) for f in freqs])
        self._axis = core_axial.pair_axes(self.axes_dims)
        self._perm = core_axial.half_permutation(self.axes_dims)
        self._inverse = np.argsort(self._perm)

    @property
    def max_positions(self) -> int:
        """Old name of ``max_seq_len`` (deprecated)."""
        warnings.warn("AxialRotaryEmbedding.max_positions is deprecated and will be removed in the next release; "
                      "read max_seq_len instead", DeprecationWarning, stacklevel=2)
        return self.max_seq_len

    def _check_positions(self, positions, length, batch):
        positions = integer_positions("positions", positions)
        p = static_shape(positions)
        n = self.n_axes
        ok = len(p) in (2, 3) and p[-1] == n and not differ(p[-2], length) and (
            len(p) == 2 or (batch is not None and (None in (p[0], batch) or p[0] in (1, batch))))
        if not ok:
            raise ValueError(f"positions must have shape (S, {n}) or (B, S, {n}) with S={length}; got {p}")
        check_position_values("positions", positions)                   # no device read for int32
        return positions

    def cos_sin(self, positions):
        """float32 ``(cos, sin)`` of shape ``positions.shape[:-1] + (sum(axes_dims)/2,)``."""
        positions = self._check_positions(positions, None, None)
        return self._cos_sin(ops.cast(positions, "int32"))

    def _cos_sin(self, positions):
        per_pair = ops.take(positions, ops.convert_to_tensor(self._axis, dtype="int32"), axis=-1)   # (..., h)
        inv = ops.convert_to_tensor(self._inv.astype(np.float32))

        def analytic(fn):
            return lambda p: fn(ops.cast(p, "float32") * inv)

        h = self.dim // 2
        cols = ops.convert_to_tensor(np.arange(h, dtype=np.int32))
        # each pair reads its own column of the (P, h) table at its axis' coordinate
        flat_cos = np.ascontiguousarray(self._cos).reshape(-1, 1)
        flat_sin = np.ascontiguousarray(self._sin).reshape(-1, 1)
        rows = self.max_seq_len
        index = per_pair * h + cols
        inside = ops.logical_and(per_pair >= 0, per_pair < rows)
        safe = ops.where(inside, index, 0)

        def pick(table, fn):
            found = ops.take(ops.convert_to_tensor(table), safe, axis=0)[..., 0]
            return ops.where(inside, found, analytic(fn)(per_pair))

        return pick(flat_cos, ops.cos), pick(flat_sin, ops.sin)

    def _rotate(self, x, cos, sin):
        h = self.dim // 2
        x32 = ops.cast(x, "float32")
        rot, rest = x32[..., : self.dim], x32[..., self.dim :]
        if self.layout == "interleaved":
            pairs = ops.reshape(rot, (*ops.shape(rot)[:-1], h, 2))
            x1, x2 = pairs[..., 0], pairs[..., 1]
            out = ops.reshape(ops.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1), ops.shape(rot))
        else:
            perm = ops.take(rot, ops.convert_to_tensor(self._perm.astype(np.int32)), axis=-1)
            x1, x2 = perm[..., :h], perm[..., h:]
            out = ops.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
            out = ops.take(out, ops.convert_to_tensor(self._inverse.astype(np.int32)), axis=-1)
        if x.shape[-1] is not None and x.shape[-1] > self.dim:
            out = ops.concatenate([out, rest], axis=-1)
        return ops.cast(out, self.compute_dtype)

    @staticmethod
    def _broadcast(t, ndim: int, seq_axis: int, batched: bool):
        """``(S, h)``/``(B, S, h)`` -> broadcastable against ``(..., D)`` with sequence at ``seq_axis``."""
        lead = 1 if batched else 0
        for _ in range(ndim - 2 - seq_axis):
            t = ops.expand_dims(t, -2)
        for _ in range(seq_axis - lead):
            t = ops.expand_dims(t, lead)
        return t

    def _check_call(self, q, k, positions, seq_dim):
        shapes = []
        for name, t in (("q", q), ("k", k)):
            if t is None:
                continue
            shapes.append(check_qk_shape(name, t, self.dim, f"sum(axes_dims) = {self.dim}",
                                         "axes_dims summing to at most the head dim"))
        seq_axis = normalize_seq_dim(seq_dim, len(shapes[0]))
        if len(shapes) == 2:
            a, b = shapes
            if len(a) != len(b) or differ(a[seq_axis], b[seq_axis]) or differ(a[0], b[0]):
                raise ValueError(f"k {b} must match q {a} in rank, batch and sequence length")
        if positions is None:
            raise ValueError(f"positions are required: integer coordinates (S, {self.n_axes}) or (B, S, {self.n_axes})")
        batch = shapes[0][0] if seq_axis > 0 else None
        positions = self._check_positions(positions, shapes[0][seq_axis], batch)
        return seq_axis, positions

    def call(self, q, k=None, positions=None, seq_dim: int = -2):
        seq_axis, positions = self._check_call(q, k, positions, seq_dim)
        batched = len(positions.shape) == 3
        cos, sin = self._cos_sin(ops.cast(positions, "int32"))
        ndim = len(q.shape)
        cos, sin = self._broadcast(cos, ndim, seq_axis, batched), self._broadcast(sin, ndim, seq_axis, batched)
        q_out = self._rotate(q, cos, sin)
        return q_out if k is None else (q_out, self._rotate(k, cos, sin))

    def compute_output_spec(self, q, k=None, positions=None, seq_dim: int = -2):
        self._check_call(q, k, positions, seq_dim)
        spec = keras.KerasTensor(q.shape, dtype=self.compute_dtype)
        return spec if k is None else (spec, keras.KerasTensor(k.shape, dtype=self.compute_dtype))

    def get_config(self) -> dict:
        return {**super().get_config(), "axes_dims": list(self.axes_dims), "base": self.base, "layout": self.layout,
                "max_seq_len": self.max_seq_len}

