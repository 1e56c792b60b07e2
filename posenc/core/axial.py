"""N-axis (axial) rotary embeddings and RoPE-Mixed frequencies (framework-free).

Axial RoPE gives each token one integer coordinate per axis (time, row, column, ...) and splits the
rotated features of a head into one block per axis: block ``a`` has ``axes_dims[a]`` features and
rotates by ``p_a * base^(-2i / axes_dims[a])``, ``i = 0 .. axes_dims[a]/2 - 1`` (the frequencies
restart in every block).  This is FLUX's ``EmbedND`` (axes ``(0, h, w)``, dims ``(16, 56, 56)``) and
EVA/timm's 2-D RoPE (axes ``(h, w)``, half the head each).  Scores then depend only on the offset
along every axis.

RoPE-Mixed (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer",
arXiv:2403.13298) learns the frequencies instead: pair ``j`` of head ``h`` rotates by
``sum_a p_a * F[a, h, j]``, so every pair mixes all axes.  :func:`mixed_frequencies` is the
paper's initialisation generalised to ``n`` axes.

Everything here is NumPy/float64 or :mod:`decimal`; the torch and Keras sides build on it.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Sequence

import numpy as np

from posenc import _validate
from posenc.core.rope import default_frequencies

#: ``base`` of RoPE-Mixed's initial magnitudes in the paper's code (``rope_theta = 10`` for mixed).
MIXED_BASE = 10.0


def check_axes_dims(axes_dims: object) -> tuple[int, ...]:
    """``axes_dims`` as a tuple of even ints >= 2, one per axis, else a ``TypeError``/``ValueError``."""
    if isinstance(axes_dims, (str, bytes)) or not isinstance(axes_dims, Sequence) or not len(axes_dims):
        raise TypeError(
            f"axes_dims must be a non-empty sequence of ints (features per axis, e.g. (16, 56, 56)), got {axes_dims!r}"
        )
    dims = tuple(_validate.check_int(f"axes_dims[{a}]", d, minimum=2) for a, d in enumerate(axes_dims))
    odd = [a for a, d in enumerate(dims) if d % 2]
    if odd:
        raise ValueError(
            f"axes_dims must all be even (features rotate in pairs), got {dims}: axis {odd[0]} has {dims[odd[0]]}; "
            f"round it to an even number"
        )
    return dims


def axial_frequencies(axes_dims: Sequence[int], base: float) -> tuple[decimal.Decimal, ...]:
    """The ``sum(axes_dims)/2`` frequencies in pair order: ``base^(-2i/d_a)`` for every block ``a``.

    Examples:
        >>> [round(float(f), 4) for f in axial_frequencies((2, 4), 100.0)]
        [1.0, 1.0, 0.1]
    """
    dims = check_axes_dims(axes_dims)
    base = _validate.check_float("base", base, positive=True)
    return tuple(f for d in dims for f in default_frequencies(d, base))


def pair_axes(axes_dims: Sequence[int]) -> np.ndarray:
    """The axis each rotary pair follows, ``(sum(axes_dims)/2,)`` int64.

    Examples:
        >>> pair_axes((2, 4)).tolist()
        [0, 1, 1]
    """
    dims = check_axes_dims(axes_dims)
    return np.repeat(np.arange(len(dims), dtype=np.int64), [d // 2 for d in dims])


def half_permutation(axes_dims: Sequence[int]) -> np.ndarray:
    """Feature order that turns per-block half pairs into one global half layout.

    With ``layout="half"`` block ``a`` (features ``o_a .. o_a + d_a - 1``) pairs ``o_a + i`` with
    ``o_a + d_a/2 + i``.  ``x[..., perm]`` lists every block's first halves, then every block's
    second halves, so that pair ``j`` becomes ``(j, j + D/2)`` (``D = sum(axes_dims)``), in the
    same pair order as :func:`axial_frequencies`.

    Examples:
        >>> half_permutation((2, 4)).tolist()
        [0, 2, 3, 1, 4, 5]
    """
    dims = check_axes_dims(axes_dims)
    offsets = np.cumsum((0,) + dims[:-1])
    first = [o + i for o, d in zip(offsets, dims, strict=True) for i in range(d // 2)]
    second = [o + d // 2 + i for o, d in zip(offsets, dims, strict=True) for i in range(d // 2)]
    return np.asarray(first + second, dtype=np.int64)


# ---- RoPE-Mixed --------------------------------------------------------------------------------


def check_mixed_dim(dim: int, n_axes: int) -> int:
    """Pairs per direction of RoPE-Mixed's initialisation: ``dim/2`` must split into ``n_axes`` groups."""
    if (dim // 2) % n_axes:
        raise ValueError(
            f"learned (RoPE-Mixed) frequencies split the dim/2 = {dim // 2} rotary pairs into one group per axis, "
            f"so sum(axes_dims) = {dim} must be a multiple of 2 * n_axes = {2 * n_axes}"
        )
    return dim // (2 * n_axes)


def mixed_magnitudes(dim: int, n_axes: int, base: float = MIXED_BASE) -> np.ndarray:
    """``base^(-2 n j / dim)`` for ``j = 0 .. dim/(2n) - 1``: the paper's ``theta^(-4j/dim)`` for 2 axes.

    Examples:
        >>> mixed_magnitudes(8, 2, 10.0).tolist()
        [1.0, 0.31622776601683794]
    """
    base = _validate.check_float("base", base, positive=True)
    m = check_mixed_dim(dim, n_axes)
    return np.power(base, -(2.0 * n_axes * np.arange(m)) / dim)


def plane_rotations(angles: np.ndarray) -> np.ndarray:
    """``(H, 2, 2)`` rotations by ``angles (H,)`` radians."""
    a = np.asarray(angles, dtype=np.float64)
    c, s = np.cos(a), np.sin(a)
    return np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2)


def haar_rotations(gaussians: np.ndarray) -> np.ndarray:
    """Uniformly random rotations ``(H, n, n)`` from standard normal matrices ``(H, n, n)``.

    The QR factor with the signs of ``R``'s diagonal taken out is Haar-distributed on O(n)
    (Mezzadri 2007); one column is negated where the determinant is -1, which gives SO(n).
    """
    g = np.asarray(gaussians, dtype=np.float64)
    q, r = np.linalg.qr(g)
    d = np.sign(np.diagonal(r, axis1=-2, axis2=-1))
    d = np.where(d == 0, 1.0, d)
    q = q * d[..., None, :]
    flip = np.linalg.det(q) < 0
    q[flip, :, 0] *= -1
    return q


def mixed_frequencies(dim: int, n_axes: int, rotations: np.ndarray, base: float = MIXED_BASE) -> np.ndarray:
    """RoPE-Mixed initial frequencies ``F (n_axes, H, dim/2)`` from one rotation per head.

    Pairs form ``n_axes`` groups of ``m = dim/(2 n_axes)``; pair ``g*m + j`` of head ``h`` points in
    direction ``rotations[h][:, g]`` (column ``g``) with magnitude ``base^(-2 n j / dim)``:
    ``F[a, h, g*m + j] = mag_j * rotations[h, a, g]``.  For two axes and a rotation by ``phi`` this
    is the paper's initialisation: ``F_x = mag * [cos phi, cos(phi + pi/2)]``,
    ``F_y = mag * [sin phi, sin(phi + pi/2)]``.

    Args:
        dim: rotary dim, a multiple of ``2 * n_axes``.
        n_axes: number of position axes.
        rotations: ``(H, n_axes, n_axes)`` rotation matrices (:func:`plane_rotations`,
            :func:`haar_rotations`).
        base: base of the magnitudes (the paper: 10).

    Examples:
        >>> f = mixed_frequencies(4, 2, plane_rotations([0.0]))
        >>> (f.round(6) + 0.0).tolist()              # F_x = [1, 0], F_y = [0, 1]
        [[[1.0, 0.0]], [[0.0, 1.0]]]
    """
    dim = _validate.check_int("dim", dim, minimum=2)
    n_axes = _validate.check_int("n_axes", n_axes, minimum=1)
    mag = mixed_magnitudes(dim, n_axes, base)                              # (m,)
    rot = np.asarray(rotations, dtype=np.float64)
    if rot.ndim != 3 or rot.shape[1:] != (n_axes, n_axes):
        raise ValueError(f"rotations must have shape (H, {n_axes}, {n_axes}), got {rot.shape}")
    # (H, a, g) x (j,) -> (a, H, g, j) -> (a, H, g*m + j)
    out = rot.transpose(1, 0, 2)[..., None] * mag
    return out.reshape(n_axes, rot.shape[0], dim // 2)


def mixed_rotations(num_heads: int, n_axes: int, uniform: np.ndarray, normal: np.ndarray | None) -> np.ndarray:
    """One random rotation per head from caller-drawn random numbers (so that the caller's
    generator decides): two axes use a uniform angle ``2 pi u`` (the paper), more axes a Haar
    rotation of the normals ``(H, n, n)``, one axis the identity."""
    if n_axes == 1:
        return np.ones((num_heads, 1, 1))
    if n_axes == 2:
        return plane_rotations(2.0 * math.pi * np.asarray(uniform, dtype=np.float64).reshape(num_heads))
    return haar_rotations(np.asarray(normal, dtype=np.float64).reshape(num_heads, n_axes, n_axes))
