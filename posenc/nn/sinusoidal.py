"""``SinusoidalEncoding``: adds the fixed sinusoidal table to embeddings."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from posenc import _validate
from posenc._torch.angles import angle_dtype, check_float64_available, exact_sin_cos, has_float64, host_round
from posenc._torch.checks import (
    check_embeddings,
    check_inplace,
    check_position_args,
    check_position_bounds,
    check_same_device,
    embedding_seq_axis,
)
from posenc._torch.rows import position_range, provably_in_table, table_rows
from posenc._torch.tables import TableModule
from posenc.core import exact as core_exact
from posenc.core import sinusoidal as core_sinusoidal

__all__ = ["SinusoidalEncoding"]

_HALF = {torch.bfloat16: "table_bfloat16", torch.float16: "table_float16"}


class SinusoidalEncoding(TableModule):
    r"""Adds the sinusoidal positional encoding to a sequence of embeddings.

    ``forward(x)`` returns ``x * scale + PE[offset : offset + S]`` with
    ``PE(p, 2i) = sin(p / base^(2i/D))`` and ``PE(p, 2i+1) = cos(p / base^(2i/D))``.
    The paper multiplies the token embeddings by ``sqrt(d_model)`` before adding the encoding:
    pass ``scale=math.sqrt(dim)`` for that (``scale`` multiplies ``x`` only, never the table).

    The table of ``max_seq_len`` rows is built once, at construction, by :meth:`reset_buffers`, from
    exact angles rounded once to float32 (or to ``dtype`` if that is float64), with bfloat16 and
    float16 copies rounded once from the same exact values (so half-precision inputs add a table of
    their own dtype, at full speed).  The tables are non-persistent buffers: they never enter
    ``state_dict``, they follow ``.to(device)``, and ``.to(torch.bfloat16)`` does not lower their
    precision.  Checkpoints that stored such a table under a common name (``pe``,
    ``positional_encodings``, fairseq's ``_float_tensor``) still load with ``strict=True``: the
    stored copy is ignored.  Positions outside ``[0, max_seq_len)`` are computed exactly on the fly, without
    changing the module; float64 inputs (with a float32 table) also take that path.

    Args:
        dim: number of features ``D`` (any ``D >= 1``).
        max_seq_len: rows precomputed.
        base: frequency base (10000 in the paper).
        layout: ``"interleaved"`` (paper), ``"concat"`` or ``"tensor2tensor"``; see
            :func:`posenc.functional.sinusoidal_encoding`.
        scale: factor applied to ``x`` before the addition.
        dropout: dropout probability applied to the sum (as in the paper), only in training mode.
        device: device of the tables.
        dtype: dtype of the main table, float32 (default) or float64.

    Shape:
        ``x``: ``(B, S, D)`` or ``(S, D)`` (``(S, B, D)`` with ``seq_dim=0``); ``positions``: ``(S,)`` or
        ``(B, S)``; output: like ``x``.

    Examples:
        >>> enc = SinusoidalEncoding(6, max_seq_len=10)
        >>> enc(torch.zeros(1, 2, 6))
        tensor([[[0.0000, 1.0000, 0.0000, 1.0000, 0.0000, 1.0000],
                 [0.8415, 0.5403, 0.0464, 0.9989, 0.0022, 1.0000]]])

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017, section 3.5.
    """

    #: Added to the token embeddings, not applied inside attention (see :func:`posenc.attention`).
    adds_to_embeddings = True

    _table_buffers = ("table_main", "table_bfloat16", "table_float16", "turns", "turns32")
    _float64_buffers = ("turns",)
    # buffers registered in __init__ (declared here for type checkers)
    table_main: torch.Tensor
    table_bfloat16: torch.Tensor
    table_float16: torch.Tensor
    turns: torch.Tensor
    turns32: torch.Tensor
    # persistent table buffers of common implementations (seed 001, the PyTorch tutorial, fairseq)
    _ignored_state_keys = ("pe", "positional_encodings", "positional_encoding", "_float_tensor")

    def __init__(
        self,
        dim: int,
        *,
        max_seq_len: int = 2048,
        base: float = 10000.0,
        layout: str = "interleaved",
        scale: float = 1.0,
        dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim, self.max_seq_len, self.base, self.layout, self.scale, self.dropout = core_sinusoidal.check_encoding_args(
            dim, max_seq_len, base, layout, scale, dropout)
        dtype = torch.float32 if dtype is None else dtype
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(
                f"dtype is the table's dtype and must be torch.float32 or torch.float64, got {dtype!r}; "
                f"half-precision copies are kept automatically"
            )
        check_float64_available("dtype", dtype, torch.device(torch.get_default_device() if device is None else device))
        shape = (self.max_seq_len, self.dim)
        self.register_buffer("table_main", torch.empty(shape, device=device, dtype=dtype), persistent=False)
        for half, name in _HALF.items():
            self.register_buffer(name, torch.empty(shape, device=device, dtype=half), persistent=False)
        # Frequencies in turns, split for exact angles past the table (see posenc.core.exact).
        n = core_sinusoidal.num_frequencies(self.dim, self.layout)
        self.register_buffer("turns", torch.empty(4, n, device=device, dtype=angle_dtype(device)), persistent=False)
        # the same frequencies as float32 digits, for devices without float64 (see posenc._torch.exact32)
        digits = (core_exact.POSITION_CHUNKS, core_exact.DIGIT_COLUMNS)
        self.register_buffer("turns32", torch.empty(*digits, n, device=device), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        """(Re)build the tables in place, e.g. after construction on the meta device + ``to_empty``."""
        device = self.table_main.device
        if device.type == "meta":
            return
        split = core_sinusoidal.turns(self.dim, self.base, self.layout)
        with torch.no_grad():
            self.turns.copy_(torch.from_numpy(split.astype(np.float64 if self.turns.dtype == torch.float64 else
                                                          np.float32)))
            self.turns32.copy_(torch.from_numpy(core_exact.turns_digits(split).copy()))
            if not has_float64(device):
                # on the host (NumPy float64 core), each table rounded once and moved
                exact_np = core_sinusoidal.table(np.arange(self.max_seq_len), self.dim, self.base, self.layout)
                for name in ("table_main", *_HALF.values()):
                    getattr(self, name).copy_(host_round(exact_np, getattr(self, name).dtype))
                return
            exact = self._exact(torch.arange(self.max_seq_len, device=device))  # (P, D) float64
            for name in ("table_main", *_HALF.values()):
                getattr(self, name).copy_(exact)                                # one rounding each

    def _exact(self, positions: torch.Tensor) -> torch.Tensor:
        """Float64 encoding of ``positions`` ``(...)`` -> ``(..., D)``, exact to ~2**-51 relative
        (float32 within one ulp on a device without float64)."""
        s, c = exact_sin_cos(positions, self.turns, self.turns32)
        return core_sinusoidal.assemble(s, c, self.dim, self.layout, xp=torch)

    def table(self, length: int | None = None, *, offset: int = 0) -> torch.Tensor:
        """The ``(length, D)`` table starting at position ``offset`` (default: all ``max_seq_len`` rows).

        This is what the seeds' ``PositionalEncoding.forward()`` returns.
        """
        length = self.max_seq_len if length is None else _validate.check_int("length", length, minimum=0)
        offset = _validate.check_int("offset", offset)
        if 0 <= offset and offset + length <= self.max_seq_len:
            return self.table_main[offset : offset + length]
        if length:
            check_position_bounds("positions", offset, offset + length - 1)
        positions = torch.arange(offset, offset + length, device=self.table_main.device)
        return self._exact(positions).to(self.table_main.dtype)

    def _encoding(self, x: torch.Tensor, positions: torch.Tensor | None, offset: int, seq_len: int) -> torch.Tensor:
        """The encoding to add to ``x``: ``(S, D)`` or ``(B, S, D)`` in ``x.dtype``."""
        table = self.table_main if x.dtype == self.table_main.dtype else getattr(self, _HALF.get(x.dtype, ""), None)
        if positions is None:
            if torch.compiler.is_compiling():
                # no guard on symbolic shapes: an exported module takes any length, as eager mode does
                if table is not None and provably_in_table(offset, seq_len, self.max_seq_len):
                    return table[offset : offset + seq_len]
            elif seq_len:
                check_position_bounds("positions", offset, offset + seq_len - 1)
                if table is not None and 0 <= offset and offset + seq_len <= self.max_seq_len:
                    return table[offset : offset + seq_len]                    # (S, D) view
            positions = torch.arange(offset, offset + seq_len, device=x.device)
        elif positions.numel() and not positions.is_meta and not torch.compiler.is_compiling():
            lo, hi = position_range(positions)                                 # one read
            check_position_bounds("positions", lo, hi)
            if table is not None and 0 <= lo and hi < self.max_seq_len:
                return table_rows(table, positions, 0, 0)                      # (..., S, D) gather
        return self._exact(positions).to(x.dtype)

    def forward(
        self,
        x: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        offset: int = 0,
        inplace: bool = False,
        seq_dim: int = -2,
    ) -> torch.Tensor:
        """Return ``x * scale + PE`` (then dropout).

        Args:
            x: ``(B, S, D)`` or ``(S, D)`` floating tensor, or ``(S, B, D)`` with ``seq_dim=0``.
            positions: optional integer positions ``(S,)`` or ``(B, S)`` (e.g. from
                :func:`posenc.functional.positions_from_mask`); default ``offset + arange(S)``.
            offset: first position when ``positions`` is None (decoding step by step).
            inplace: add into ``x`` and return it (no output allocation: the fast path).  Needs
                ``x`` not to be a leaf that requires grad.
            seq_dim: the sequence axis of ``x``: ``-2`` (batch first, the default) or ``0`` for
                ``(S, B, D)``, the layout ``nn.Transformer`` and ``nn.TransformerEncoder`` use unless
                built with ``batch_first=True``.
        """
        check_embeddings(x, self.dim)
        check_same_device("x", x, "the tables", self.table_main.device)
        sd = embedding_seq_axis(x, seq_dim)
        seq_len = x.shape[sd]
        batch = None if x.dim() == 2 else x.shape[1 - sd]
        positions, offset = check_position_args(positions, offset, seq_len, batch, x.device)
        _validate.check_bool("inplace", inplace)
        if inplace and not torch.compiler.is_compiling():
            check_inplace("x", x)
        if self.scale != 1.0 and abs(self.scale) > torch.finfo(x.dtype).max:
            raise ValueError(f"scale={self.scale:g} overflows x's dtype {x.dtype}; pass a smaller scale or a wider x")
        pe = self._encoding(x, positions, offset, seq_len)
        if sd == 0 and x.dim() == 3:                                        # (S, B, D): rows broadcast per batch
            pe = pe.unsqueeze(1) if pe.dim() == 2 else pe.transpose(0, 1)
        grad_path = torch.is_grad_enabled() and x.requires_grad
        if inplace:
            if grad_path:
                out = (x.mul_(self.scale) if self.scale != 1.0 else x).add_(pe)
            else:
                out = torch.add(pe, x, alpha=self.scale, out=x)               # one pass: pe + scale*x
        elif grad_path:
            out = torch.add(pe, x, alpha=self.scale) if self.scale != 1.0 else x + pe
        else:
            out = torch.add(pe, x, alpha=self.scale, out=torch.empty_like(x))
        if self.dropout and self.training:
            out = F.dropout(out, self.dropout, training=True, inplace=inplace)
        return out

    def extra_repr(self) -> str:
        return (
            f"{self.dim}, max_seq_len={self.max_seq_len}, base={self.base:g}, layout={self.layout!r}, "
            f"scale={self.scale:g}, dropout={self.dropout:g}"
        )
