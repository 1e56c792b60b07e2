"""Sin-cos position tables over 1-D, 2-D and 3-D grids (framework-free).

A patch grid of shape ``(H, W)`` (images) or ``(T, H, W)`` (video) is flattened row-major: token
``h * W + w``, or ``(t * H + h) * W + w``.  Each token's row is a concatenation of 1-D sin-cos
encodings of its coordinates, one block of columns per grid axis:

``order="mae"``, 2-D (MAE, Hugging Face ViTMAE, diffusers ``get_2d_sincos_pos_embed``)
    ``[sin(w) | cos(w) | sin(h) | cos(h)]``: four quarters of ``D/4`` columns; column ``k`` of a
    quarter has frequency ``base^(-k / (D/4))``.  The column (``w``) coordinate comes first.
``order="timm"``, 2-D (timm ``build_sincos2d_pos_embed``)
    ``[sin(h) | sin(w) | cos(h) | cos(w)]`` with the same frequencies and the same row order.
``order="mae"``, 3-D (CogVideoX, diffusers ``get_3d_sincos_pos_embed``)
    ``[sin(t) | cos(t) | sin(w) | cos(w) | sin(h) | cos(h)]``: a temporal block of ``D/4`` columns
    with frequencies ``base^(-k / (D/8))``, then the 2-D table of width ``3D/4`` over ``(h, w)``,
    whose quarters have ``3D/16`` columns and frequencies ``base^(-k / (3D/16))``.
``order="mae"``, 1-D
    ``[sin(p) | cos(p)]`` with frequencies ``base^(-k / (D/2))`` (the ``"concat"`` sinusoidal layout).

Positions along an axis of length ``n`` are ``i / interpolation_scale`` (``i = 0 .. n - 1``), or
``i * base_size / (n * interpolation_scale)`` when ``base_size`` is given (diffusers' resolution
rule, which maps every grid onto the span of a ``base_size`` grid).  The scale is folded into the
frequency in :mod:`decimal`, so the angles stay exact (see :mod:`posenc.core.exact`).
"""

from __future__ import annotations

import decimal
import functools
import math
import numbers
import warnings

import numpy as np

from posenc import _validate
from posenc._deprecate import caller_stacklevel
from posenc.core import exact

SINCOS_ND_ORDERS = ("mae", "timm")
#: Grid ranks supported, with the divisor ``dim`` must be a multiple of for each.
DIM_MULTIPLE = {1: 2, 2: 4, 3: 16}


def check_grid_shape(name: str, grid_shape) -> tuple[int, ...]:
    """``grid_shape`` as a tuple of 1 to 3 ints >= 1 (``(S,)``, ``(H, W)`` or ``(T, H, W)``)."""
    if isinstance(grid_shape, numbers.Integral) and not isinstance(grid_shape, bool):
        raise TypeError(
            f"{name} must be a tuple of grid sizes such as (H, W) or (T, H, W), got the int {grid_shape!r}; "
            f"for a square grid pass ({grid_shape}, {grid_shape})"
        )
    try:
        sizes = tuple(grid_shape)
    except TypeError:
        raise TypeError(
            f"{name} must be a tuple of grid sizes such as (H, W) or (T, H, W), got {grid_shape!r} "
            f"({type(grid_shape).__name__})"
        ) from None
    if not 1 <= len(sizes) <= 3:
        raise ValueError(f"{name} must have 1, 2 or 3 entries ((S,), (H, W) or (T, H, W)), got {sizes!r}")
    for i, n in enumerate(sizes):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"{name}[{i}] must be an int, got {n!r} ({type(n).__name__}); pass whole grid sizes")
        if not 1 <= int(n) <= exact.MAX_POSITION:
            raise ValueError(f"{name}[{i}] must be an int in [1, 2**31], got {n} (in {name}={sizes!r})")
    return tuple(int(n) for n in sizes)


def call_grid(grid_shape: object, own: tuple[int, ...], owner: str) -> tuple[int, ...]:
    """The grid of one call of a table module or layer: ``own`` when ``grid_shape`` is None, else a
    checked grid with as many axes as ``own``."""
    if grid_shape is None:
        return own
    grid_shape = check_grid_shape("grid_shape", grid_shape)
    if len(grid_shape) != len(own):
        raise ValueError(f"grid_shape must have {len(own)} entries like the {owner}'s grid_shape={own}, got {grid_shape}")
    return grid_shape


def _per_axis(name: str, value, ndim: int) -> tuple[float, ...]:
    """A positive number, or one per grid axis, as a tuple of ``ndim`` floats."""
    if isinstance(value, (tuple, list)):
        if len(value) != ndim:
            raise ValueError(
                f"{name} must be a number or a tuple with one entry per grid axis ({ndim}), got {tuple(value)!r}"
            )
        return tuple(_validate.check_float(f"{name}[{i}]", v, positive=True) for i, v in enumerate(value))
    return (_validate.check_float(name, value, positive=True),) * ndim


def check_dim(dim, ndim: int) -> int:
    """``dim`` as an int that the grid rank's column split divides."""
    dim = _validate.check_int("dim", dim, minimum=1)
    multiple = DIM_MULTIPLE[ndim]
    if dim % multiple:
        split = {1: "[sin | cos]", 2: "four quarters", 3: "a D/4 temporal block and two 3D/16-column halves of 3D/4"}
        raise ValueError(
            f"dim must be divisible by {multiple} for a {ndim}-D grid ({split[ndim]}), got dim={dim}; "
            f"pass e.g. dim={dim + multiple - dim % multiple}"
        )
    return dim


def old_argument_order(grid_shape, dim):
    """``(grid_shape, dim)`` of a ``SinusoidalEncodingND(grid_shape, dim)`` call, also read from the
    old order ``(dim, grid_shape)`` (an int first, a tuple or list second) with a ``DeprecationWarning``."""
    if isinstance(grid_shape, numbers.Integral) and not isinstance(grid_shape, bool) and isinstance(dim, (tuple, list)):
        warnings.warn(
            f"SinusoidalEncodingND({grid_shape}, {tuple(dim)}): the order (dim, grid_shape) is deprecated and will be "
            f"refused in the next release; pass the grid first, SinusoidalEncodingND({tuple(dim)}, {grid_shape})",
            DeprecationWarning,
            stacklevel=caller_stacklevel(),
        )
        return dim, grid_shape
    return grid_shape, dim


def check_table_args(grid_shape, dim, base, prefix_tokens, order, base_size, interpolation_scale):
    """Validated arguments of a sin-cos N-D table (shared by the torch and Keras sides).

    Returns ``(grid_shape, dim, base, prefix_tokens, order, base_size, interpolation_scale)`` with
    ``base_size`` None or a tuple of floats per axis and ``interpolation_scale`` a tuple per axis.
    """
    grid_shape = check_grid_shape("grid_shape", grid_shape)
    ndim = len(grid_shape)
    order = _validate.check_choice("order", order, SINCOS_ND_ORDERS)
    if order == "timm" and ndim != 2:
        raise ValueError(f'order="timm" is defined for 2-D grids (H, W) only, got grid_shape={grid_shape}; use order="mae"')
    dim = check_dim(dim, ndim)
    base = _validate.check_float("base", base, positive=True)
    prefix_tokens = _validate.check_int("prefix_tokens", prefix_tokens, minimum=0)
    if base_size is not None:
        base_size = _per_axis("base_size", base_size, ndim)
    interpolation_scale = _per_axis("interpolation_scale", interpolation_scale, ndim)
    return grid_shape, dim, base, prefix_tokens, order, base_size, interpolation_scale


def axis_widths(ndim: int, dim: int) -> tuple[int, ...]:
    """Number of frequencies of each grid axis (in grid order), e.g. ``(D/8, 3D/16, 3D/16)`` in 3-D."""
    if ndim == 1:
        return (dim // 2,)
    if ndim == 2:
        return (dim // 4, dim // 4)
    return (dim // 8, 3 * dim // 16, 3 * dim // 16)


def column_plan(ndim: int, order: str) -> tuple[tuple[int, str], ...]:
    """The column blocks, left to right, as ``(grid axis, "sin" | "cos")``.

    >>> column_plan(2, "mae")
    ((1, 'sin'), (1, 'cos'), (0, 'sin'), (0, 'cos'))
    >>> column_plan(2, "timm")
    ((0, 'sin'), (1, 'sin'), (0, 'cos'), (1, 'cos'))
    """
    if order == "timm":
        return ((0, "sin"), (1, "sin"), (0, "cos"), (1, "cos"))
    axes = {1: (0,), 2: (1, 0), 3: (0, 2, 1)}[ndim]        # 3-D: t, then the 2-D table's w before h
    return tuple((axis, fn) for axis in axes for fn in ("sin", "cos"))


def position_scales(grid_shape, base_size, interpolation_scale) -> tuple[decimal.Decimal, ...]:
    """Exact factor turning index ``i`` into the position of each axis: ``base_size / (n * interpolation_scale)``
    (or ``1 / interpolation_scale``), from the binary values of the floats, to 60 digits."""
    with decimal.localcontext() as ctx:
        ctx.prec = exact.DECIMAL_DIGITS
        scales = []
        for a, n in enumerate(grid_shape):
            s = decimal.Decimal(1) / decimal.Decimal(interpolation_scale[a])
            if base_size is not None:
                s = s * decimal.Decimal(base_size[a]) / decimal.Decimal(n)
            scales.append(+s)
        return tuple(scales)


@functools.lru_cache(maxsize=256)
def axis_frequencies(count: int, base: float, scale: decimal.Decimal) -> tuple[decimal.Decimal, ...]:
    """``scale * base^(-k / count)`` for ``k = 0 .. count - 1`` (radians per grid index), 60 digits."""
    with decimal.localcontext() as ctx:
        ctx.prec = exact.DECIMAL_DIGITS
        log_base = decimal.Decimal(base).ln()
        n = decimal.Decimal(count)
        return tuple(scale * (-(decimal.Decimal(k) / n) * log_base).exp() for k in range(count))


def axis_sin_cos(grid_shape, dim, base, base_size, interpolation_scale) -> list[tuple[np.ndarray, np.ndarray]]:
    """Exact float64 ``(sin, cos)`` of each grid axis, each of shape ``(n_axis, width_axis)``.

    Arguments as returned by :func:`check_table_args`.  Each value carries a relative error of about
    ``2**-51``, so rounding it once to float32, float16 or bfloat16 lands within one ulp of the truth.
    """
    widths = axis_widths(len(grid_shape), dim)
    scales = position_scales(grid_shape, base_size, interpolation_scale)
    out = []
    for n, width, scale in zip(grid_shape, widths, scales, strict=True):
        try:
            split = exact.turns_split(axis_frequencies(width, base, scale))   # (4, width)
        except ValueError as err:                                     # name the arguments that set the scale
            raise ValueError(
                f"{err}; here the positions are i * base_size / (n * interpolation_scale) with base={base:g}, "
                f"base_size={base_size}, interpolation_scale={interpolation_scale}: raise interpolation_scale or "
                f"lower base_size"
            ) from None
        out.append(exact.sin_cos(np.arange(n, dtype=np.float64), split))       # 2 x (n, width)
    return out


def assemble(axis_tables, grid_shape, order: str, prefix_tokens: int = 0, xp=np):
    """Broadcast per-axis ``(sin, cos)`` tables over the grid into the ``(prefix + prod(grid), D)`` table.

    ``axis_tables`` is a list of ``(sin, cos)`` pairs of shape ``(n_axis, width_axis)`` (NumPy arrays
    with ``xp=numpy``, torch tensors with ``xp=torch``), already in the output dtype: broadcasting
    and concatenation copy values, so the table is rounded exactly as its per-axis parts were.
    """
    ndim = len(grid_shape)
    tokens = math.prod(grid_shape)
    blocks = []
    for axis, fn in column_plan(ndim, order):
        part = axis_tables[axis][0 if fn == "sin" else 1]                     # (n_axis, w)
        shape = [1] * ndim + [part.shape[-1]]
        shape[axis] = grid_shape[axis]
        part = part.reshape(shape)                                             # (1.., n_axis, 1.., w)
        full = tuple(grid_shape) + (part.shape[-1],)
        part = np.broadcast_to(part, full) if xp is np else part.expand(full)  # (*grid, w)
        blocks.append(part.reshape(tokens, -1))                                # (N, w), row-major tokens
    if xp is np:
        table = np.concatenate(blocks, axis=-1)                                # (N, D)
        if prefix_tokens:
            table = np.concatenate([np.zeros((prefix_tokens, table.shape[1]), table.dtype), table])
        return table
    table = xp.cat(blocks, dim=-1)                                             # (N, D)
    if prefix_tokens:
        table = xp.cat([table.new_zeros(prefix_tokens, table.shape[1]), table])
    return table


def table(grid_shape, dim, *, base=10000.0, prefix_tokens=0, order="mae", base_size=None,
          interpolation_scale=1.0) -> np.ndarray:
    """The exact float64 table ``(prefix_tokens + prod(grid_shape), dim)`` (NumPy).

    Examples:
        >>> table((1, 2), 4).tolist()          # rows (h, w) = (0, 0), (0, 1): [sin w, cos w, sin h, cos h]
        [[0.0, 1.0, 0.0, 1.0], [0.8414709848078965, 0.5403023058681398, 0.0, 1.0]]
    """
    grid_shape, dim, base, prefix_tokens, order, base_size, interpolation_scale = check_table_args(
        grid_shape, dim, base, prefix_tokens, order, base_size, interpolation_scale)
    parts = axis_sin_cos(grid_shape, dim, base, base_size, interpolation_scale)
    return assemble(parts, grid_shape, order, prefix_tokens)
