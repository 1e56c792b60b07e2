"""Keras ``RotaryEmbedding`` (RoFormer) with every scaling rule, mirroring posenc.nn."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from posenc import _validate
from posenc.core import rope as core_rope
from posenc.keras._common import (
    PositionsLayer,
    check_position_args,
    check_positions,
    check_qk_shape,
    differ,
    exact_sin_cos,
    float32_angles,
    lookup,
    normalize_seq_dim,
    positions_or_range,
)


def _check_seq_len(seq_len):
    """A Python/NumPy ``seq_len`` must be an int >= 1; a tensor (e.g. traced) is used as given."""
    if seq_len is None or (hasattr(seq_len, "shape") and not isinstance(seq_len, np.generic)):
        return seq_len
    return _validate.check_int("seq_len", seq_len, minimum=1)


@keras.saving.register_keras_serializable(package="posenc")
class RotaryEmbedding(PositionsLayer):
    """Rotates queries and keys; same arguments and defaults as :class:`posenc.nn.RotaryEmbedding`.

    ``call(q, k, positions=None, offset=0, seq_dim=-2, seq_len=None, inverse=False)`` returns ``(q, k)``;
    ``call(q)`` returns the rotated ``q`` alone (the torch module returns ``(q, None)``, but a Keras
    graph output must be a tensor).
    cos/sin tables for ``max_seq_len`` positions are computed at construction from exact angles
    (the same NumPy core as the torch side, so the tables are bit-identical), times the rule's
    attention factor, rounded once to float32; the rotation runs in float32 and rounds once to the
    compute dtype.  Unknown rules raise; nothing falls back silently (unlike keras-hub's
    ``rope_type``).  LongRoPE keeps a table for each factor set and switches strictly after the
    original length; dynamic NTK past the original length, and any position past the tables, use
    float32 angles computed in the graph.

    ``q`` and ``k`` are floating, with at least 2 dims, the same rank, batch and sequence length
    (head counts may differ) and a head dim of at least ``dim``; ``seq_dim`` names their sequence
    axis (not the last, feature axis).  ``positions`` (optional) are integers ``(S,)`` or ``(B, S)``,
    excluding a nonzero ``offset``.  Positions are indexed in int32: values outside
    ``[-2**31, 2**31 - 1]`` raise ``ValueError`` where they are concrete (NumPy, eager tensors), but
    inside a traced graph (``jax.jit``, ``tf.function``) they cannot be read and would wrap.
    """

    _position_args = (("positions", 2),)

    def __init__(self, dim: int, *, max_seq_len: int = 4096, base: float = 10000.0, layout: str = "half",
                 scaling: core_rope.RopeScaling | dict | None = None, xpos_scale_base: float | None = None,
                 rotary_slice: str = "first", **kwargs) -> None:
        super().__init__(**kwargs)
        self.dim, self.max_seq_len, self.base, self.layout = core_rope.check_rotary_args(dim, max_seq_len, base, layout)
        self.rotary_slice = _validate.check_choice("rotary_slice", rotary_slice, ("first", "last"))
        self.scaling = core_rope.scaling_from_config(scaling)
        self.xpos_scale_base = None if xpos_scale_base is None else _validate.check_float(
            "xpos_scale_base", xpos_scale_base, positive=True)
        self.attention_factor = 1.0 if self.scaling is None else self.scaling.attention_factor()
        self._tables = {"base": self._build(None)}
        if isinstance(self.scaling, core_rope.LongRopeScaling):
            self._tables["long"] = self._build(self.scaling.original_max_seq_len + 1)

    def _build(self, seq_len):
        freqs = core_rope.frequencies(self.dim, self.base, self.scaling, seq_len)
        s, c = exact_sin_cos(np.arange(self.max_seq_len), freqs)
        f = 1.0 if self.scaling is None else self.scaling.attention_factor_at(seq_len)   # (LongRoPE's may switch)
        return (c * f).astype(np.float32), (s * f).astype(np.float32), np.array([float(x) for x in freqs]), f

    def cos_sin(self, positions, seq_len=None):
        """float32 ``(cos, sin)`` of shape ``positions.shape + (dim/2,)`` for integer ``positions``
        ``(S,)`` or ``(B, S)``; ``seq_len`` is the length that length-dependent rules see."""
        positions = ops.cast(check_positions("positions", positions), "int32")
        return self._cos_sin(positions, _check_seq_len(seq_len))

    def _cos_sin(self, positions, seq_len):
        def pick(key):
            cos_t, sin_t, inv, factor = self._tables[key]
            def analytic(which):
                return lambda p: (ops.cos if which == "cos" else ops.sin)(float32_angles(p, inv)) * factor
            return lookup(cos_t, positions, analytic("cos")), lookup(sin_t, positions, analytic("sin"))

        cos, sin = pick("base")
        rule = self.scaling
        if rule is not None and rule.length_dependent:
            length = ops.max(positions) + 1 if seq_len is None else seq_len
            longer = ops.greater(length, rule.original_max_seq_len)
            if isinstance(rule, core_rope.LongRopeScaling):
                cos_l, sin_l = pick("long")
            else:   # dynamic NTK: the base grows with the length, in float32 in the graph
                d = self.dim
                stretch = rule.factor * ops.cast(length, "float32") / rule.original_max_seq_len - (rule.factor - 1)
                new_base = self.base * ops.power(ops.maximum(stretch, 1.0), d / (d - 2))
                exps = ops.convert_to_tensor(-np.arange(0, d, 2, dtype=np.float32) / d)
                inv = ops.power(new_base, exps)
                angles = ops.expand_dims(ops.cast(positions, "float32"), -1) * inv
                cos_l, sin_l = ops.cos(angles), ops.sin(angles)
            cos, sin = ops.where(longer, cos_l, cos), ops.where(longer, sin_l, sin)
        return cos, sin

    def _rotate(self, x, cos, sin, key: bool, positions, seq_axis: int, inverse: bool = False):
        h = self.dim // 2
        if inverse:                                       # by -theta: the transpose
            sin = -sin
        if self.xpos_scale_base is not None:
            log_zeta = ops.convert_to_tensor(np.log(core_rope.xpos_zeta(self.dim)).astype(np.float32))
            power = ops.expand_dims(ops.cast(positions, "float32"), -1) / self.xpos_scale_base
            scale = ops.exp(power * log_zeta * (-1.0 if key else 1.0))
            scale = self._broadcast(scale, ops.ndim(x), seq_axis, positions)
            cos, sin = cos * scale, sin * scale
        x32 = ops.cast(x, "float32")
        last = self.rotary_slice == "last"
        rot, rest = (x32[..., -2 * h :], x32[..., : -2 * h]) if last else (x32[..., : 2 * h], x32[..., 2 * h :])
        if self.layout == "half":
            x1, x2 = rot[..., :h], rot[..., h:]
            out = ops.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        else:
            pairs = ops.reshape(rot, (*ops.shape(rot)[:-1], h, 2))
            x1, x2 = pairs[..., 0], pairs[..., 1]
            out = ops.reshape(ops.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1), ops.shape(rot))
        if x.shape[-1] is None or x.shape[-1] > 2 * h:
            out = ops.concatenate([rest, out] if last else [out, rest], axis=-1)
        return ops.cast(out, self.compute_dtype)

    @staticmethod
    def _broadcast(t, ndim: int, seq_axis: int, positions):
        """``(S, h)``/``(B, S, h)`` -> broadcastable against ``(..., D)`` with sequence at ``seq_axis``."""
        batched = len(positions.shape) == 2
        lead = 1 if batched else 0
        # axes between the sequence axis and the features get size 1
        for _ in range(ndim - 1 - seq_axis - 1):
            t = ops.expand_dims(t, -2)
        for _ in range(seq_axis - lead):
            t = ops.expand_dims(t, lead)
        return t

    def _check_qk(self, name: str, t) -> tuple:
        """``t`` must be floating ``(..., S, D)`` with ``D >= dim``; returns its static shape."""
        return check_qk_shape(name, t, self.dim, f"rotary dim {self.dim}", "a rotary dim <= the head dim")

    def _check_call(self, q, k, positions, offset, seq_dim, seq_len):
        """Checks of a call; returns ``(seq_axis, positions, offset, seq_len)``, validated."""
        shape = self._check_qk("q", q)
        seq_axis = normalize_seq_dim(seq_dim, len(shape))
        if k is not None:
            ks = self._check_qk("k", k)
            if len(ks) != len(shape) or differ(ks[seq_axis], shape[seq_axis]) or differ(ks[0], shape[0]):
                raise ValueError(f"k {ks} must match q {shape} in rank, batch and sequence length")
        positions, offset = check_position_args(positions, offset, shape, seq_axis)
        return seq_axis, positions, offset, _check_seq_len(seq_len)

    def call(self, q, k=None, positions=None, offset: int = 0, seq_dim: int = -2, seq_len=None, inverse: bool = False):
        seq_axis, positions, offset, seq_len = self._check_call(q, k, positions, offset, seq_dim, seq_len)
        inverse = _validate.check_bool("inverse", inverse)
        ndim = len(q.shape)
        pos = positions_or_range(positions, ops.shape(q)[seq_axis], offset)
        cos, sin = self._cos_sin(pos, seq_len)
        cos, sin = self._broadcast(cos, ndim, seq_axis, pos), self._broadcast(sin, ndim, seq_axis, pos)
        q_out = self._rotate(q, cos, sin, False, pos, seq_axis, inverse)
        if k is None:
            return q_out                     # Keras graph outputs must be tensors: no (q, None) pair
        return q_out, self._rotate(k, cos, sin, True, pos, seq_axis, inverse)

    def compute_output_spec(self, q, k=None, positions=None, offset: int = 0, seq_dim: int = -2, seq_len=None,
                            inverse: bool = False):
        self._check_call(q, k, positions, offset, seq_dim, seq_len)                      # static checks only
        spec = keras.KerasTensor(q.shape, dtype=self.compute_dtype)
        return spec if k is None else (spec, keras.KerasTensor(k.shape, dtype=self.compute_dtype))

    def get_config(self) -> dict:
        return {**super().get_config(), "dim": self.dim, "max_seq_len": self.max_seq_len, "base": self.base,
                "layout": self.layout, "scaling": core_rope.scaling_to_config(self.scaling),
                "xpos_scale_base": self.xpos_scale_base, "rotary_slice": self.rotary_slice}
