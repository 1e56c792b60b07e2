"""``SinusoidalEncodingND``: adds the fixed sin-cos table of a 2-D/3-D patch grid to patch embeddings."""

from __future__ import annotations

import math

import torch

from posenc import _validate
from posenc._torch.angles import angle_dtype, check_float64_available, has_float64, host_round
from posenc._torch.checks import check_embeddings, check_float_dtype, check_same_device, embedding_seq_axis
from posenc._torch.tables import TableModule
from posenc.core import sincos_nd as core_sincos_nd
from posenc.core.sincos_nd import old_argument_order
from posenc.functional.sincos_nd import sincos_table_nd

__all__ = ["SinusoidalEncodingND"]

_HALF = {torch.bfloat16: "table_bfloat16", torch.float16: "table_float16"}


class SinusoidalEncodingND(TableModule):
    r"""Adds the sin-cos position table of an image (``(H, W)``) or video (``(T, H, W)``) patch grid.

    ``forward(x)`` returns ``x * scale + PE`` where ``PE`` is :func:`posenc.functional.sincos_table_nd`
    of ``grid_shape``: ``prefix_tokens`` zero rows (class or register tokens), then one row per
    patch in row-major order (token ``h * W + w``).  By default (``order="mae"``) a 2-D row is
    ``[sin(w f) | cos(w f) | sin(h f) | cos(h f)]`` with ``f_k = base^(-k / (D/4))``, as in MAE,
    Hugging Face ViTMAE and diffusers; ``order="timm"`` gives timm's
    ``[sin(h f) | sin(w f) | cos(h f) | cos(w f)]``; a 3-D grid gets CogVideoX's split (a ``D/4``
    temporal block, then the ``3D/4`` spatial table).

    The table of ``grid_shape`` is built once by :meth:`reset_buffers` from exact angles, rounded
    once to float32 (or float64), with bfloat16 and float16 copies rounded from the same exact values;
    the other wide dtype (float64 inputs on a float32 table, or the reverse) is assembled in the
    graph from exact per-axis values, rounded once.  The tables are non-persistent buffers: they never enter ``state_dict``, follow ``.to(device)``,
    and ``.to(torch.bfloat16)`` does not lower their precision.  ``forward(x, grid_shape=...)`` for
    another resolution computes that grid's table exactly on the fly, without changing the module
    (pass ``base_size`` to map every resolution onto the same span of positions, as diffusers does).
    That computation runs on the host: under ``torch.compile`` it is a graph break, which
    ``fullgraph=True`` refuses with a clear error (build a module for that grid instead), and
    ``torch.export`` records the table of the given grid as a constant.

    Args:
        grid_shape: ``(H, W)`` or ``(T, H, W)`` patches precomputed (``(S,)`` also works).
        dim: number of features ``D``: divisible by 4 for a 2-D grid, by 16 for a 3-D grid.  The
            old order ``SinusoidalEncodingND(dim, grid_shape)`` (an int first, a tuple or list
            second) still works for one release, with a ``DeprecationWarning``.
        base: frequency base (10000).
        prefix_tokens: leading tokens (class, registers) that get a zero encoding.
        order: ``"mae"`` or ``"timm"`` (2-D only).
        base_size: ``None`` (integer positions) or the grid length every resolution is scaled to
            (one number or one per axis): positions ``i * base_size / n``.
        interpolation_scale: divides the positions (one number or one per axis).
        scale: factor applied to ``x`` before the addition (never to the table).
        device: device of the tables.
        dtype: dtype of the main table, float32 (default) or float64.

    Shape:
        ``x``: ``(B, N, D)`` or ``(N, D)`` with ``N = prefix_tokens + prod(grid_shape)``; output: like ``x``.

    Examples:
        >>> enc = SinusoidalEncodingND((2, 3), 8, prefix_tokens=1)
        >>> enc(torch.zeros(4, 7, 8)).shape
        torch.Size([4, 7, 8])
        >>> enc(torch.zeros(1, 5, 8), grid_shape=(2, 2))[0, 2]      # token (h, w) = (0, 1)
        tensor([0.8415, 0.0100, 0.5403, 0.9999, 0.0000, 0.0000, 1.0000, 1.0000])

    References:
        He et al., "Masked Autoencoders Are Scalable Vision Learners", CVPR 2022.
        Yang et al., "CogVideoX: Text-to-Video Diffusion Models with An Expert Transformer", arXiv:2408.06072.
    """

    #: Added to the token embeddings, not applied inside attention (see :func:`posenc.attention`).
    adds_to_embeddings = True

    _table_buffers = ("table_main", "table_bfloat16", "table_float16", "axis_sin_cos")
    _float64_buffers = ("axis_sin_cos",)
    # buffers registered in __init__ (declared here for type checkers)
    table_main: torch.Tensor
    table_bfloat16: torch.Tensor
    table_float16: torch.Tensor
    axis_sin_cos: torch.Tensor

    def __init__(
        self,
        grid_shape: tuple[int, ...],
        dim: int,
        *,
        base: float = 10000.0,
        prefix_tokens: int = 0,
        order: str = "mae",
        base_size: float | tuple[float, ...] | None = None,
        interpolation_scale: float | tuple[float, ...] = 1.0,
        scale: float = 1.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        grid_shape, dim = old_argument_order(grid_shape, dim)
        (self.grid_shape, self.dim, self.base, self.prefix_tokens, self.order, self.base_size,
         self.interpolation_scale) = core_sincos_nd.check_table_args(
            grid_shape, dim, base, prefix_tokens, order, base_size, interpolation_scale)
        self.scale = _validate.check_float("scale", scale)
        dtype = torch.float32 if dtype is None else dtype
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(
                f"dtype is the table's dtype and must be torch.float32 or torch.float64, got {dtype!r}; "
                f"half-precision copies are kept automatically"
            )
        check_float64_available("dtype", dtype, torch.device(torch.get_default_device() if device is None else device))
        shape = (self.num_tokens(), self.dim)
        self.register_buffer("table_main", torch.empty(shape, device=device, dtype=dtype), persistent=False)
        for half, name in _HALF.items():
            self.register_buffer(name, torch.empty(shape, device=device, dtype=half), persistent=False)
        # the exact float64 (sin, cos) of every axis, zero-padded to (2, n_axes, max n, max width): the
        # table of the module's grid in any other dtype is assembled from them inside the graph (float32,
        # each value rounded once, on a device without float64)
        self._widths = core_sincos_nd.axis_widths(len(self.grid_shape), self.dim)
        axis_shape = (2, len(self.grid_shape), max(self.grid_shape), max(self._widths))
        self.register_buffer("axis_sin_cos", torch.empty(axis_shape, device=device, dtype=angle_dtype(device)),
                             persistent=False)
        self.reset_buffers()

    def num_tokens(self, grid_shape: tuple[int, ...] | None = None) -> int:
        """``prefix_tokens + prod(grid_shape)``: the sequence length ``N`` the table covers."""
        return self.prefix_tokens + math.prod(self.grid_shape if grid_shape is None else grid_shape)

    def reset_buffers(self) -> None:
        """(Re)build the tables in place, e.g. after construction on the meta device + ``to_empty``."""
        device = self.table_main.device
        if device.type == "meta":
            return
        parts = core_sincos_nd.axis_sin_cos(self.grid_shape, self.dim, self.base, self.base_size,
                                            self.interpolation_scale)           # exact float64, per axis
        wide = self.axis_sin_cos.dtype
        with torch.no_grad():
            self.axis_sin_cos.zero_()
            for a, (sin, cos) in enumerate(parts):
                n, w = sin.shape
                self.axis_sin_cos[0, a, :n, :w].copy_(host_round(sin, torch.float32) if wide != torch.float64
                                                      else torch.from_numpy(sin))
                self.axis_sin_cos[1, a, :n, :w].copy_(host_round(cos, torch.float32) if wide != torch.float64
                                                      else torch.from_numpy(cos))
            if not has_float64(device):
                # on the host (NumPy float64 core), each table rounded once and moved
                exact_np = core_sincos_nd.assemble(parts, self.grid_shape, self.order, self.prefix_tokens)
                for name in ("table_main", *_HALF.values()):
                    getattr(self, name).copy_(host_round(exact_np, getattr(self, name).dtype))
                return
            exact = self._own_table(torch.float64)                               # (N, D) float64
            for name in ("table_main", *_HALF.values()):
                getattr(self, name).copy_(exact)                                 # one rounding each

    def _own_table(self, dtype: torch.dtype) -> torch.Tensor:
        """The module's grid table in ``dtype``, assembled from the exact per-axis values (each rounded once)."""
        parts = [(self.axis_sin_cos[0, a, :n, :w].to(dtype), self.axis_sin_cos[1, a, :n, :w].to(dtype))
                 for a, (n, w) in enumerate(zip(self.grid_shape, self._widths, strict=True))]
        return core_sincos_nd.assemble(parts, self.grid_shape, self.order, self.prefix_tokens, xp=torch)

    def _compute(self, grid_shape, dtype: torch.dtype, device) -> torch.Tensor:
        return sincos_table_nd(
            grid_shape, self.dim, base=self.base, prefix_tokens=self.prefix_tokens, order=self.order,
            base_size=self.base_size, interpolation_scale=self.interpolation_scale, dtype=dtype, device=device)

    def _check_grid(self, grid_shape) -> tuple[int, ...]:
        return core_sincos_nd.call_grid(grid_shape, self.grid_shape, "module")

    def table(self, grid_shape: tuple[int, ...] | None = None, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The ``(prefix_tokens + prod(grid_shape), D)`` table (default: the precomputed grid).

        ``dtype`` defaults to the main table's; other grids are computed exactly, the module is unchanged.
        """
        grid_shape = self._check_grid(grid_shape)
        dtype = self.table_main.dtype if dtype is None else check_float_dtype("dtype", dtype)
        if grid_shape == self.grid_shape:
            buffer = self.table_main if dtype == self.table_main.dtype else getattr(self, _HALF.get(dtype, ""), None)
            return self._own_table(dtype) if buffer is None else buffer         # no host maths for the own grid
        return self._compute(grid_shape, dtype, self.table_main.device)

    def forward(self, x: torch.Tensor, *, grid_shape: tuple[int, ...] | None = None, seq_dim: int = -2) -> torch.Tensor:
        """Return ``x * scale + PE``.

        Args:
            x: ``(B, N, D)`` or ``(N, D)`` patch embeddings, ``N = prefix_tokens + prod(grid_shape)``, or
                ``(N, B, D)`` with ``seq_dim=0``.
            grid_shape: the grid of ``x`` if it differs from the module's (another resolution); its
                table is computed exactly for this call.
            seq_dim: the token axis of ``x``: ``-2`` (batch first, the default) or ``0`` (``nn.Transformer``'s
                default layout).
        """
        check_embeddings(x, self.dim)
        if embedding_seq_axis(x, seq_dim) == 0 and x.dim() == 3:          # (N, B, D): the same rows per batch
            return self.forward(x.transpose(0, 1), grid_shape=grid_shape).transpose(0, 1)
        if self.scale != 1.0 and abs(self.scale) > torch.finfo(x.dtype).max:
            raise ValueError(f"scale={self.scale:g} overflows x's dtype {x.dtype}; pass a smaller scale or a wider x")
        check_same_device("x", x, "the tables", self.table_main.device)
        grid = self._check_grid(grid_shape)
        tokens = self.num_tokens(grid)
        if x.shape[-2] != tokens:
            given = "" if grid_shape is None else "given "
            raise ValueError(
                f"x has {x.shape[-2]} tokens but the {given}grid_shape={grid} with prefix_tokens={self.prefix_tokens} "
                f"has {tokens}; pass grid_shape=(...) for the grid of x (prefix_tokens + prod(grid_shape) tokens)"
            )
        pe = self.table(grid, dtype=x.dtype)                                      # (N, D) in x.dtype
        if self.scale != 1.0:
            return torch.add(pe, x, alpha=self.scale)
        return x + pe

    def extra_repr(self) -> str:
        return (
            f"grid_shape={self.grid_shape}, dim={self.dim}, base={self.base:g}, prefix_tokens={self.prefix_tokens}, "
            f"order={self.order!r}, base_size={self.base_size}, interpolation_scale={self.interpolation_scale}, "
            f"scale={self.scale:g}"
        )
