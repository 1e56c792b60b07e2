"""Helpers of the Keras port (not public): exact NumPy tables from posenc.core, keras.ops glue and
the argument checks every layer shares.

Checks come in two kinds.  Static checks (dtypes, ranks, known sizes) run on every call, symbolic or
not.  Value checks (the range of ``positions``) run only where the values exist: NumPy inputs and
eager backend tensors.  Inside a traced graph (Keras functional building, ``jax.jit``,
``tf.function``, ``torch.compile``) there are no values, so only the static checks run.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from posenc import _validate
from posenc.core import exact

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_HOST = (np.ndarray, np.generic, list, tuple, int)          # values that live on the host
_INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_WIDER_THAN_INT32 = ("int64", "uint32", "uint64")


def exact_sin_cos(positions: np.ndarray, frequencies) -> tuple[np.ndarray, np.ndarray]:
    """Float64 ``(sin, cos)`` of ``positions[..., None] * frequencies`` (exact, see posenc.core.exact)."""
    return exact.sin_cos(np.asarray(positions, dtype=np.float64), exact.turns_split(tuple(frequencies)))


# ---- reading values where they exist ------------------------------------------------------------


def has_values(t) -> bool:
    """Whether the values of ``t`` can be read now (not symbolic, traced or being compiled)."""
    if isinstance(t, _HOST):
        return True
    if keras.backend.is_keras_tensor(t):
        return False
    backend = keras.backend.backend()
    if backend == "jax":
        import jax
        return not isinstance(t, jax.core.Tracer)
    if backend == "torch":                    # keras imported torch already: no new import
        import torch
        return not (getattr(t, "is_meta", False) or torch.compiler.is_compiling())
    if backend == "tensorflow":
        import tensorflow as tf
        return tf.executing_eagerly()
    return True


def static_shape(t) -> tuple[int | None, ...]:
    """``t.shape`` with every size not known as a plain int (symbolic, traced) as None."""
    return tuple(d if isinstance(d, int) else None for d in t.shape)


def differ(a: int | None, b: int | None) -> bool:
    """Two sizes that are both known and unequal."""
    return a is not None and b is not None and a != b


def dtype_name(t) -> str:
    """Keras's name of ``t.dtype`` (``"int64"``), or NumPy's for dtypes Keras has none for (``"object"``)."""
    try:
        return keras.backend.standardize_dtype(t.dtype)
    except ValueError:
        return str(t.dtype)


def value_range(t) -> tuple[int, int] | None:
    """``(min, max)`` of a non-empty integer tensor whose values exist, else None (one small read)."""
    if not has_values(t) or 0 in static_shape(t):
        return None
    if isinstance(t, np.ndarray):
        return int(t.min()), int(t.max())
    lo, hi = ops.convert_to_numpy(ops.stack([ops.min(t), ops.max(t)])).tolist()
    return int(lo), int(hi)


# ---- checks -------------------------------------------------------------------------------------


def check_int32_range(name: str, lo: int, hi: int) -> None:
    """Reject values in ``[lo, hi]`` that int32, the dtype the layers index in, cannot hold."""
    if lo < INT32_MIN or hi > INT32_MAX:
        raise ValueError(
            f"{name} must lie within [-2**31, 2**31 - 1] (the Keras layers index in int32), got values in "
            f"[{lo}, {hi}]; renumber the positions to fit int32"
        )


def integer_positions(name: str, positions):
    """``positions`` as a tensor or array of integers (any shape); host values become an array."""
    if isinstance(positions, _HOST):
        positions = np.asarray(positions)
    if not hasattr(positions, "dtype"):
        raise TypeError(f"{name} must be an integer tensor or array, got {type(positions).__name__}")
    dtype = dtype_name(positions)
    if dtype not in _INT_DTYPES:
        raise TypeError(
            f"{name} must hold integers (int32/int64), got dtype {dtype}; positions are indices, so build "
            f"them with keras.ops.arange or cast with keras.ops.cast({name}, 'int32')"
        )
    return positions


def check_position_values(name: str, positions) -> None:
    """Integer positions within int32: read (where they exist, :func:`has_values`) only for dtypes
    wider than int32, so int32 positions cost no read from the device."""
    if dtype_name(positions) in _WIDER_THAN_INT32 and (rng := value_range(positions)) is not None:
        check_int32_range(name, *rng)


def check_positions(name: str, positions):
    """``positions`` as a tensor or array of integers, ``(S,)`` or ``(B, S)``, within int32.

    The dtype and rank are checked always; the values as :func:`check_position_values` says.
    """
    positions = integer_positions(name, positions)
    if len(positions.shape) not in (1, 2):
        raise ValueError(f"{name} must have shape (S,) or (B, S), got {tuple(positions.shape)}")
    check_position_values(name, positions)
    return positions


def check_position_args(positions, offset, shape: tuple, seq_axis: int):
    """Check the ``positions``/``offset`` pair of a call on an input of ``shape`` (sequence at ``seq_axis``).

    ``positions`` (if given) must be integers ``(S,)``, or ``(B, S)`` with ``B`` 1 or the input's batch
    when the input has a batch axis before the sequence axis; it excludes a nonzero ``offset``.
    Returns ``(positions, offset)``, validated.
    """
    offset = _validate.check_int("offset", offset)
    length = shape[seq_axis]
    if positions is None:
        check_int32_range("positions (offset + arange(S))", offset, offset + max((length or 1) - 1, 0))
        return None, offset
    positions = check_positions("positions", positions)
    p = static_shape(positions)
    batch = shape[0] if seq_axis > 0 else None
    batch_ok = seq_axis > 0 and len(p) == 2 and (None in (p[0], batch) or p[0] in (1, batch))
    if (None not in (p[-1], length) and p[-1] != length) or not (len(p) == 1 or batch_ok):
        allowed = "(S,)" if seq_axis == 0 else f"(S,) or (B, S) with B={batch}"
        raise ValueError(f"positions must have shape {allowed}, S={length}; got {p}")
    if offset:
        raise ValueError("pass either positions or offset, not both (add the offset to positions)")
    return positions, offset


def check_float(name: str, t, fix: str = "") -> None:
    """Require a floating tensor."""
    if not hasattr(t, "dtype"):
        raise TypeError(f"{name} must be a floating tensor, got {type(t).__name__}")
    dtype = dtype_name(t)
    if not keras.backend.is_float_dtype(dtype):
        raise TypeError(f"{name} must be a floating tensor, got dtype {dtype}{fix}")


def check_qk_shape(name: str, t, dim: int, dim_name: str, fix: str) -> tuple:
    """``t`` (queries or keys) must be floating ``(..., S, D)`` with ``D >= dim``; returns its static
    shape.  ``dim_name`` describes ``dim`` and ``fix`` the layer to build instead, in the error."""
    check_float(name, t)
    shape = static_shape(t)
    if len(shape) < 2:
        raise ValueError(f"{name} must have at least 2 dims (..., S, D), got shape {shape}")
    if shape[-1] is not None and shape[-1] < dim:
        raise ValueError(f"{name} has head dim {shape[-1]} < {dim_name}; build the layer with {fix}")
    return shape


def check_embeddings(x, dim: int) -> None:
    """``x`` must be floating embeddings of shape ``(B, S, dim)`` or ``(S, dim)``."""
    check_float("x", x, "; embed token ids first (e.g. keras.layers.Embedding) or cast with keras.ops.cast(x, 'float32')")
    shape = static_shape(x)
    if len(shape) not in (2, 3) or shape[-1] not in (dim, None):
        raise ValueError(f"x must have shape (B, S, {dim}) or (S, {dim}) (last dimension dim={dim}), got shape {shape}")


def normalize_seq_dim(seq_dim, ndim: int) -> int:
    """``seq_dim`` as a non-negative axis of an ``ndim``-D tensor that is not the feature axis."""
    seq_dim = _validate.check_int("seq_dim", seq_dim)
    if not -ndim <= seq_dim < ndim or seq_dim % ndim == ndim - 1:
        raise ValueError(
            f"seq_dim={seq_dim} is not a sequence axis of a {ndim}-D tensor (features are last); "
            f"use -2 for (B, H, S, D) or 1 for (B, S, H, D)"
        )
    return seq_dim % ndim


class PositionsLayer(keras.layers.Layer):
    """Base of the port's layers: sees NumPy arguments before Keras turns them into tensors.

    Positions are checked first, since on JAX (without x64) that conversion would wrap int64 values
    silently; a NumPy integer ``offset`` goes on as a Python int, as an ``offset`` must be.
    """

    #: ``(name, index among call's arguments)`` of each argument that holds positions
    _position_args: tuple[tuple[str, int], ...] = (("positions", 1),)

    def __call__(self, *args, **kwargs):
        for name, i in self._position_args:
            value = args[i] if i < len(args) else kwargs.get(name)
            if isinstance(value, _HOST):
                check_positions(name, value)
        if isinstance(kwargs.get("offset"), np.integer):
            kwargs["offset"] = int(kwargs["offset"])
        return super().__call__(*args, **kwargs)


# ---- graph glue ---------------------------------------------------------------------------------


def positions_or_range(positions, seq_len, offset: int):
    """``positions`` as int32, or ``offset + arange(seq_len)``.

    Callers check concrete values against the int32 range first (:func:`check_positions`); inside a
    traced graph the cast is unchecked, so values past ``2**31 - 1`` would wrap there.
    """
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
