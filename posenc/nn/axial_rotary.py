"""``AxialRotaryEmbedding``: N-axis rotary embeddings (FLUX, EVA/timm) and learned RoPE-Mixed."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from posenc import _validate
from posenc._deprecate import UNSET, renamed, renamed_attribute
from posenc._torch import exact32
from posenc._torch.angles import _no_autocast, angle_dtype, exact_cos_sin, has_float64, host_sin_cos, working_dtype
from posenc._torch.checks import (
    check_float_dtype,
    check_qk,
    check_same_device,
    from_table,
    inplace_pair_overlaps,
)
from posenc._torch.engine_choice import check_rope_engine, engine_from_backend
from posenc._torch.rope_call import check_flags, check_head_dim, choose_engine, promise
from posenc._torch.rows import check_given_rows, clamp_in_table
from posenc._torch.tables import TableModule
from posenc.core import axial as core_axial
from posenc.core import exact as core_exact
from posenc.core.rope import ROPE_LAYOUTS
from posenc.functional import axial as functional_axial
from posenc.kernels import rope_engine, torch_rope

__all__ = ["AxialRotaryEmbedding"]


class AxialRotaryEmbedding(TableModule):
    r"""Rotary embedding over several position axes (time, height, width, ...), fixed or learned.

    Every token has one integer coordinate per axis: ``positions (S, n_axes)`` shared by the batch,
    or ``(B, S, n_axes)`` (e.g. from :func:`~posenc.functional.axial.grid_positions`).  The first
    ``dim = sum(axes_dims)`` features of each head split into one block per axis, in the order of
    the positions' columns; the rest pass through.  Block ``a`` rotates pair ``i`` by
    ``p_a * base^(-2i / axes_dims[a])`` (the frequencies restart in every block), so attention
    scores depend only on the offset along every axis.

    ``layout="interleaved"`` (default) pairs features ``(2i, 2i+1)`` inside each block, as FLUX's
    ``EmbedND`` (``axes_dims=(16, 56, 56)``, positions ``(0, h, w)`` for image tokens and zeros for
    text, ``base=10000``) and EVA/timm's 2-D RoPE (``axes_dims=(D/2, D/2)``, positions ``(h, w)``,
    class tokens at the origin, i.e. not rotated) do; ``layout="half"`` pairs ``(i, i + d_a/2)``
    inside each block.  The interleaved blocks concatenate into an ordinary interleaved cos/sin row
    per token, which the RoPE engines (torch, or the fused Triton kernel) apply.

    Fixed frequencies: cos/sin of coordinates ``0 .. max_seq_len - 1`` per axis are built once
    from exact angles (see :mod:`posenc.core.exact`) and rounded once to float32 (non-persistent
    buffers that stay float32 after ``module.to(torch.bfloat16)``); a token's row is gathered
    from them, so every value is within 1 ulp.  Coordinates outside the table (or float64 inputs)
    are computed exactly on the fly.  One range reduction per call decides; pass
    ``assume_valid=True`` to skip it (no device read), or precompute the rows once per grid with
    :meth:`cos_sin` and pass them as ``cos_sin=``.

    ``learned=True`` is RoPE-Mixed (Heo et al. 2024): the frequencies are a parameter
    ``freqs (n_axes, num_heads, dim/2)``, and pair ``j`` of head ``h`` rotates by
    ``sum_a p_a * freqs[a, h, j]``, mixing all axes.  They are initialised as in the paper: the
    pairs form ``n_axes`` groups, group ``g`` points along column ``g`` of a random rotation per
    head (two axes: a uniform angle ``phi``, giving ``[cos phi, cos(phi + pi/2)]`` and
    ``[sin phi, sin(phi + pi/2)]``; more axes: a uniformly random rotation), with magnitudes
    ``base^(-2 n_axes j / dim)`` and ``base = 10`` by default (the paper's ``theta``).  The paper's
    and timm's weights multiply their first frequency row by the column index: to load them, pass
    positions ``(w, h)``, ``grid_positions((H, W)).flip(-1)``.  Draws use
    torch's generator (``torch.manual_seed``).  Angles are computed in float64 from the parameter
    (with autocast off), not from the exact tables, and gradients reach ``freqs``; rotation runs in
    the torch engine (per-head rows).  ``axes_dims`` then only sets ``n_axes`` and ``dim``;
    ``module.to(torch.bfloat16)`` rounds the parameter like any other.

    Args:
        axes_dims: features per axis, each even, e.g. ``(16, 56, 56)``.
        base: frequency base (``theta``); default 10000 (fixed) or 10 (learned, the paper's).
        layout: ``"interleaved"`` (pairs ``2i, 2i+1`` per block) or ``"half"`` (``i, i + d_a/2``; with
            ``learned=True``, whose pairs mix every axis, ``j, j + dim/2`` over the rotated features).
        learned: RoPE-Mixed learned frequencies (needs ``num_heads``).
        num_heads: heads of q and k (learned mode: one set of frequencies per head).
        max_seq_len: coordinates ``0 .. max_seq_len - 1`` of every axis precomputed (fixed mode;
            default 1024).  It counts coordinates per axis, not tokens: a 64 x 64 grid needs 64.
        max_positions: old name of ``max_seq_len`` (deprecated).
        engine: ``"auto"``, ``"torch"`` or ``"triton"``, decided once per call as for
            :class:`~posenc.RotaryEmbedding`.
        backend: the old name of ``engine`` (deprecated; it still works for now).
        device: device of the tables and the parameter.

    Shape:
        ``q``: ``(B, H, S, D)`` (``seq_dim=-2``) or ``(B, S, H, D)`` (``seq_dim=1``), ``D >= dim``;
        ``k`` likewise (any head count in fixed mode, ``num_heads`` in learned mode);
        ``positions``: ``(S, n_axes)`` or ``(B, S, n_axes)`` integers.

    Examples:
        >>> from posenc.functional.axial import grid_positions
        >>> rope = AxialRotaryEmbedding((2, 2))
        >>> q = torch.tensor([[[[1.0, 0.0, 1.0, 0.0]] * 2]])            # (1, 1, 2, 4)
        >>> rope(q, positions=torch.tensor([[0, 0], [0, 1]]))[0]
        tensor([[[[1.0000, 0.0000, 1.0000, 0.0000],
                  [1.0000, 0.0000, 0.5403, 0.8415]]]])

    References:
        Su et al., "RoFormer", arXiv:2104.09864; Fang et al., "EVA-02", arXiv:2303.11331;
        Black Forest Labs, FLUX.1 (``EmbedND``); Heo et al., "Rotary Position Embedding for Vision
        Transformer", arXiv:2403.13298 (RoPE-Mixed).
    """

    _table_buffers = ("turns", "turns32", "packed_table", "pair_index", "half_perm", "half_inverse")
    _float64_buffers = ("turns",)
    # buffers registered in __init__ (declared here for type checkers)
    turns: torch.Tensor
    turns32: torch.Tensor
    packed_table: torch.Tensor
    pair_index: torch.Tensor
    half_perm: torch.Tensor
    half_inverse: torch.Tensor
    num_heads: int | None

    def __init__(
        self,
        axes_dims: Sequence[int],
        *,
        base: float | None = None,
        layout: str = "interleaved",
        learned: bool = False,
        num_heads: int | None = None,
        max_seq_len: int | None = None,
        engine: str = "auto",
        backend: str = UNSET,
        device: torch.device | str | None = None,
        max_positions: Any = UNSET,
    ) -> None:
        if backend is not UNSET:                 # the old name of engine=
            engine = engine_from_backend("AxialRotaryEmbedding", backend, engine)
        super().__init__()
        max_seq_len = renamed("AxialRotaryEmbedding", "max_positions", "max_seq_len", max_positions, max_seq_len, None)
        self.axes_dims = core_axial.check_axes_dims(axes_dims)
        self.n_axes = self.position_axes = len(self.axes_dims)
        self.dim = sum(self.axes_dims)
        _validate.check_bool("learned", learned)
        self.learned = learned
        default_base = core_axial.MIXED_BASE if learned else 10000.0
        self.base = default_base if base is None else _validate.check_float("base", base, positive=True)
        self.layout = _validate.check_choice("layout", layout, ROPE_LAYOUTS)
        if learned and max_seq_len is not None:
            raise ValueError(
                "max_seq_len sets the rows of the fixed tables; learned=True computes its angles from the learned "
                "frequencies and keeps no table: drop max_seq_len"
            )
        if not learned and num_heads is not None:
            raise ValueError(
                "num_heads sets the heads of learned (RoPE-Mixed) frequencies; fixed frequencies rotate every head "
                "alike: drop num_heads, or pass learned=True"
            )
        self.max_seq_len = 1024 if max_seq_len is None else _validate.check_int(
            "max_seq_len", max_seq_len, minimum=1)
        self.engine = check_rope_engine(engine)
        h = self.dim // 2
        if learned:
            if num_heads is None:
                raise ValueError("learned=True (RoPE-Mixed) learns frequencies per head: pass num_heads=")
            self.num_heads = _validate.check_int("num_heads", num_heads, minimum=1)
            core_axial.check_mixed_dim(self.dim, self.n_axes)
            self.freqs = nn.Parameter(torch.empty(self.n_axes, self.num_heads, h, device=device))
        else:
            self.num_heads = None
            self._freqs = core_axial.axial_frequencies(self.axes_dims, self.base)
            self.register_buffer("turns", torch.empty(4, h, device=device, dtype=angle_dtype(device)),
                                 persistent=False)
            # the same as float32 digits, for exact angles on a device without float64
            digits = (core_exact.POSITION_CHUNKS, core_exact.DIGIT_COLUMNS)
            self.register_buffer("turns32", torch.empty(*digits, h, device=device), persistent=False)
            # (cos, sin) pairs of every frequency at coordinates 0 .. max_seq_len - 1: (P, 2h)
            self.register_buffer("packed_table", torch.empty(self.max_seq_len, 2 * h, device=device),
                                 persistent=False)
            # row of a pair in the (P * h, 2) view of the table: coordinate * h + pair
            self.register_buffer("pair_index", torch.empty(2, h, device=device, dtype=torch.int64), persistent=False)
        self.register_buffer("half_perm", torch.empty(self.dim, device=device, dtype=torch.int64), persistent=False)
        self.register_buffer("half_inverse", torch.empty(self.dim, device=device, dtype=torch.int64), persistent=False)
        self.reset_buffers()
        if learned:
            self.reset_parameters()

    # ---- construction ------------------------------------------------------------------------------

    def reset_buffers(self) -> None:
        """(Re)build the tables in place, e.g. after meta-device construction and ``to_empty``."""
        device = self.half_perm.device
        if device.type == "meta":
            return
        with torch.no_grad():
            perm, inverse = functional_axial.half_index(self.axes_dims, self.dim, device)
            self.half_perm.copy_(perm)
            self.half_inverse.copy_(inverse)
            if self.learned:
                return
            split = core_exact.turns_split(self._freqs)
            self.turns.copy_(torch.from_numpy(split.astype(np.float64 if self.turns.dtype == torch.float64 else
                                                          np.float32)))
            self.turns32.copy_(torch.from_numpy(core_exact.turns_digits(split).copy()))
            h = self.dim // 2
            self.pair_index[0].copy_(torch.from_numpy(core_axial.pair_axes(self.axes_dims)))
            self.pair_index[1].copy_(torch.arange(h))
            if has_float64(device):
                grid = torch.arange(self.max_seq_len, device=device)
                c, s = exact_cos_sin(grid, self.turns, 1.0, torch.float32)              # (P, h), one rounding
            else:                                           # on the host (NumPy float64), moved as float32
                s, c = host_sin_cos(range(self.max_seq_len), split)
            self.packed_table.copy_(torch.stack([c, s], -1).flatten(-2))          # (P, 2h)

    def reset_parameters(self) -> None:
        """Draw RoPE-Mixed's initial frequencies (learned mode) with torch's generator."""
        if not self.learned or self.num_heads is None:                # (learned mode always has num_heads)
            return
        n, heads = self.n_axes, self.num_heads
        # drawn on the CPU generator whatever the default device (meta, cuda) and read as NumPy
        uniform = torch.rand(heads, dtype=torch.float64, device="cpu").numpy()
        normal = torch.randn(heads, n, n, dtype=torch.float64, device="cpu").numpy() if n > 2 else None
        rotations = core_axial.mixed_rotations(heads, n, uniform, normal)
        init = core_axial.mixed_frequencies(self.dim, n, rotations, self.base)
        with torch.no_grad():
            if self.freqs.device.type != "meta":
                # (rounded on the host: a device without float64 takes no float64 tensor)
                self.freqs.copy_(torch.from_numpy(init if self.freqs.dtype == torch.float64 else init.astype(np.float32)))

    #: Old name of :attr:`engine` (deprecated).
    backend = renamed_attribute("backend", "engine")

    @property
    def max_positions(self) -> int:
        """Old name of :attr:`max_seq_len` (deprecated)."""
        warnings.warn("AxialRotaryEmbedding.max_positions is deprecated and will be removed in the next release; "
                      "read max_seq_len instead", DeprecationWarning, stacklevel=2)
        return self.max_seq_len

    # ---- rows ------------------------------------------------------------------------------------

    def cos_sin(
        self,
        positions: torch.Tensor,
        *,
        dtype: torch.dtype = torch.float32,
        assume_valid: bool = False,
        assume_in_table: Any = UNSET,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` rows for ``positions (..., S, n_axes)``, to reuse across calls (``cos_sin=``).

        Fixed mode: ``(..., S, dim/2)``, exact, each value rounded once to ``dtype``.  Learned mode:
        ``(..., num_heads, S, dim/2)``, differentiable with respect to ``freqs``.  ``assume_valid``
        promises that every coordinate lies in ``[0, max_seq_len)`` (no device read);
        ``assume_in_table`` is its old name (deprecated).
        """
        if assume_in_table is not UNSET:
            assume_valid = promise("AxialRotaryEmbedding.cos_sin", assume_in_table, assume_valid)
        _validate.check_bool("assume_valid", assume_valid)
        check_float_dtype("dtype", dtype)
        positions = functional_axial.check_axial_positions("positions", positions, self.n_axes)
        device = self.half_perm.device
        if positions.device != device:
            check_same_device("positions", positions, "the tables", device)
        if self.learned:
            return self._learned_cos_sin(positions, dtype)
        kind, *rows = self._fixed_rows(positions, working_dtype(dtype), assume_valid)
        if kind == "packed":
            rows = [rows[0][..., 0::2], rows[0][..., 1::2]]
        # contiguous either way: rows gathered from the table or computed give the same strides, so a
        # compiled function taking them as cos_sin= is not recompiled when the grid leaves the table
        return rows[0].to(dtype).contiguous(), rows[1].to(dtype).contiguous()

    def _fixed_rows(self, positions: torch.Tensor, dtype: torch.dtype, assume: bool):
        """``("packed", (..., 2h))`` gathered from the table, or ``("cos_sin", cos, sin)`` computed."""
        table = cast(torch.Tensor, self._buffers["packed_table"])       # fixed mode holds the table
        if from_table("positions", positions, table.shape[0], table_ok=dtype == torch.float32, assume=assume):
            return "packed", self._gather(table, positions)
        c, s = functional_axial.axial_exact_cos_sin(positions, self.turns, self.axes_dims, dtype, self.turns32)
        return "cos_sin", c, s

    def _gather(self, table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Packed rows ``(..., 2h)``: pair ``j`` reads coordinate ``positions[..., axis(j)]``."""
        h = self.dim // 2
        axis, pair = cast(torch.Tensor, self._buffers["pair_index"])
        if torch.compiler.is_compiling():
            positions = clamp_in_table("positions", positions, table.shape[0])
        index = positions.index_select(-1, axis) * h + pair                          # (..., h)
        try:
            out = torch.embedding(table.view(-1, 2), index)                          # (..., h, 2)
        except IndexError:                                                           # a broken promise
            raise ValueError(
                f"positions must lie in [0, {table.shape[0]}) for this table (they were promised to with "
                f"assume_valid=True); drop the promise to have them checked or computed"
            ) from None
        return out.flatten(-2)

    def _learned_cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        """``(..., H, S, h)`` cos/sin of ``sum_a p_a * freqs[a]`` in float64, rounded to ``dtype``."""
        freqs = self.freqs
        if not has_float64(positions.device):
            with _no_autocast(positions.device):
                c, s = exact32.learned_cos_sin(positions, freqs.flatten(1))      # (..., S, H * h)
                c = c.unflatten(-1, (self.num_heads, self.dim // 2)).transpose(-3, -2)    # (..., H, S, h)
                s = s.unflatten(-1, (self.num_heads, self.dim // 2)).transpose(-3, -2)
                return c.to(dtype), s.to(dtype)
        with _no_autocast(positions.device):
            p = positions.to(torch.float64)                                           # (..., S, n)
            f = freqs.to(torch.float64).flatten(1)                                    # (n, H * h)
            angles = (p @ f).unflatten(-1, (self.num_heads, self.dim // 2))          # (..., S, H, h)
            angles = angles.transpose(-3, -2)                                         # (..., H, S, h)
            return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)

    # ---- forward ---------------------------------------------------------------------------------

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None,
        seq_dim: int = -2,
        inplace: bool = False,
        assume_valid: bool = False,
        assume_in_table: Any = UNSET,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rotate ``q`` and ``k`` (``k`` may be None); returns ``(q_rotated, k_rotated)``.

        Args:
            q: queries ``(B, H, S, D)`` or, with ``seq_dim=1``, ``(B, S, H, D)``; ``D >= dim``.
            k: keys of the same layout and sequence length, or None.
            positions: integer coordinates ``(S, n_axes)`` or ``(B, S, n_axes)``.
            cos_sin: rows from :meth:`cos_sin` instead of ``positions`` (computed once per grid).
            seq_dim: sequence axis of ``q`` and ``k``.
            inplace: rotate ``q`` and ``k`` in place.
            assume_valid: promise that every coordinate lies in ``[0, max_seq_len)``, so that
                their range is not read from the device (the lookup stays bounds-checked).
            assume_in_table: old name of ``assume_valid`` (deprecated).
        """
        if assume_in_table is not UNSET:
            assume_valid = promise("AxialRotaryEmbedding", assume_in_table, assume_valid)
        sd = check_qk(q, k, seq_dim, self.dim)
        check_flags(inplace, assume_valid)
        if self.learned:
            self._check_learned_heads(q, k, sd)
        return self._rotate(q, k, sd, self._call_rows(q, sd, positions, cos_sin, assume_valid), inplace)

    def rotate(
        self,
        x: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None,
        seq_dim: int = -2,
        inplace: bool = False,
        assume_valid: bool = False,
        assume_in_table: Any = UNSET,
    ) -> torch.Tensor:
        """Rotate one tensor (queries or keys) at its own positions; see :meth:`forward`."""
        if assume_in_table is not UNSET:
            assume_valid = promise("AxialRotaryEmbedding.rotate", assume_in_table, assume_valid)
        return self.forward(x, None, positions=positions, cos_sin=cos_sin, seq_dim=seq_dim, inplace=inplace,
                            assume_valid=assume_valid)[0]

    def _check_learned_heads(self, q, k, sd):
        if q.dim() != 4 or sd not in (1, 2):
            raise ValueError(
                f"learned (RoPE-Mixed) frequencies differ per head, so q must be 4-D (B, H, S, D) (seq_dim=-2) or "
                f"(B, S, H, D) (seq_dim=1); got shape {tuple(q.shape)} with seq_dim={sd}"
            )
        head = 1 if sd == 2 else 2
        for name, t in (("q", q), ("k", k)):
            if t is not None and t.shape[head] != self.num_heads:
                raise ValueError(
                    f"{name} has {t.shape[head]} heads but the learned frequencies were built for num_heads="
                    f"{self.num_heads}; pass tensors with that many heads (repeat shared key heads first)"
                )

    def _call_rows(self, q, sd, positions, cos_sin, assume):
        """The rows of this call, checked: ``("packed", rows)`` or ``("cos_sin", cos, sin)``."""
        length = q.shape[sd]
        batch = q.shape[0] if sd > 0 else None
        device = q.device
        if cos_sin is not None:
            if positions is not None:
                raise ValueError("pass either positions or cos_sin (rows from cos_sin(positions)), not both")
            heads = () if not self.learned else (self.num_heads,)
            return ("cos_sin", *check_given_rows(cos_sin, length=length, batch=batch, device=device,
                                                 pairs=self.dim // 2, heads=heads))
        if positions is None:
            raise ValueError(
                f"positions are required: integer coordinates (S, {self.n_axes}) or (B, S, {self.n_axes}), e.g. "
                f"from posenc.functional.axial.grid_positions (or pass cos_sin=)"
            )
        positions = functional_axial.check_axial_positions("positions", positions, self.n_axes)
        lead = positions.shape[:-2]
        if positions.dim() > 3 or positions.shape[-2] != length or (
                lead and (batch is None or lead[0] not in (1, batch))):
            allowed = f"({length}, {self.n_axes})" + ("" if batch is None else f" or ({batch}, {length}, {self.n_axes})")
            raise ValueError(f"positions must have shape {allowed}; got {tuple(positions.shape)}")
        if positions.device != device:
            raise ValueError(f"positions are on {positions.device} but q on {device}; move them with .to()")
        return self._rows_at(q, positions, assume)

    def _rows_at(self, q, positions, assume):
        """Step 2 for checked ``positions`` ``(S, n)``/``(B, S, n)``: the rows, gathered or computed."""
        if self.half_perm.device != q.device:
            check_same_device("q", q, "the tables", self.half_perm.device)
        if positions.dim() == 3 and positions.shape[0] == 1:
            positions = positions[0]                                     # shared by the batch: (S, n)
        if self.learned:
            return ("cos_sin", *self._learned_cos_sin(positions, working_dtype(q.dtype)))
        return self._fixed_rows(positions, working_dtype(q.dtype), assume)

    def _rotate(self, q, k, sd, rows, inplace):
        """Steps 3 and 4: the engine, decided once, rotates q and k by the call's rows."""
        if inplace and inplace_pair_overlaps(q, k):                    # views of one buffer: rotate, then copy
            qr, kr = self._rotate(q, k, sd, rows, False)
            return q.copy_(qr), (None if k is None or kr is None else k.copy_(kr))
        why = "learned (RoPE-Mixed) frequencies give every head its own rows, which the torch engine applies" if (
            self.learned) else None
        engine = rope_engine(choose_engine(self.engine, q, k, sd, why))
        kind, *tables = rows
        # (learned frequencies mix every axis: no per-axis blocks, "half" pairs (j, j + dim/2) over the whole)
        half = self.layout == "half" and self.n_axes > 1 and not self.learned
        if half:                                   # per-block half pairs = global half pairs after a permutation
            perm, inverse = self._buffers["half_perm"], self._buffers["half_inverse"]
            if q.shape[-1] > self.dim:                     # pass-through features keep their places
                tail = torch.arange(self.dim, q.shape[-1], device=perm.device)
                perm, inverse = torch.cat([perm, tail]), torch.cat([inverse, tail])
            qp = q.index_select(-1, perm)
            kp = None if k is None else k.index_select(-1, perm)
            # (the permuted copies are fresh: rotate them in place unless autograd records)
            qr, kr = self._apply_rows(engine, qp, kp, sd, kind, tables, not self._grad(qp, kp, tables), "half")
            qr = qr.index_select(-1, inverse)
            kr = None if kr is None else kr.index_select(-1, inverse)
            if inplace:
                return q.copy_(qr), (None if k is None else k.copy_(kr))
            return qr, kr
        return self._apply_rows(engine, q, k, sd, kind, tables, inplace, self.layout)

    @staticmethod
    def _grad(q, k, tables) -> bool:
        return torch.is_grad_enabled() and (
            q.requires_grad or (k is not None and k.requires_grad) or any(t.requires_grad for t in tables))

    def _apply_rows(self, engine, q, k, sd, kind, tables, inplace, layout):
        if self.learned:                                                  # (..., H, S, h) per-head rows
            cos, sin = tables
            if sd == 1:
                cos, sin = cos.transpose(-3, -2), sin.transpose(-3, -2)  # (..., S, H, h)
            return tuple(None if t is None else torch_rope.rotate(t, cos, sin, layout=layout, inplace=inplace)
                         for t in (q, k))
        if kind == "packed" and layout == "half":                         # packed rows hold (cos, sin) pairs
            kind, tables = "cos_sin", [tables[0][..., 0::2], tables[0][..., 1::2]]
        first = tables[0]
        if first.dim() == 2:                                              # one row per sequence position
            if kind == "packed":
                return engine(q, k, cos=None, sin=None, positions=None, offset=0, layout=layout, seq_dim=sd,
                              inplace=inplace, packed=first)
            return engine(q, k, cos=tables[0], sin=tables[1], positions=None, offset=0, layout=layout, seq_dim=sd,
                          inplace=inplace)
        B, S = first.shape[:2]
        index = torch.arange(B * S, device=first.device).view(B, S)       # row b*S + s for token (b, s)
        if kind == "packed":
            return engine(q, k, cos=None, sin=None, positions=index, offset=0, layout=layout, seq_dim=sd,
                          inplace=inplace, packed=first.flatten(0, 1))
        return engine(q, k, cos=tables[0].flatten(0, 1), sin=tables[1].flatten(0, 1), positions=index, offset=0,
                      layout=layout, seq_dim=sd, inplace=inplace)

    # ---- what posenc.attention asks of an encoding ------------------------------------------------

    def attention_qk(self, q, k, *, positions, key_positions, seq_len, offsets, assume_valid):
        """Rotate queries at ``positions (.., S, n_axes)`` and keys at ``key_positions`` (checked by
        ``posenc.attention``: this enters the pipeline after its validation step)."""
        check_head_dim(q, self.dim)                        # the one thing attention cannot know: our dim
        if self.learned:
            self._check_learned_heads(q, k, 2)
        if k is not None and key_positions is positions and q.shape[2] == k.shape[2]:
            return self._rotate(q, k, 2, self._rows_at(q, positions, assume_valid), False)   # one read, one gather
        q = self._rotate(q, None, 2, self._rows_at(q, positions, assume_valid), False)[0]
        return q, None if k is None else self._rotate(k, None, 2, self._rows_at(k, key_positions, assume_valid),
                                                      False)[0]

    def attention_bias(self, positions, key_positions, *, num_heads, dtype):
        """Rotary embeddings add no bias."""
        return None

    def attention_score_mod(self, positions, key_positions, *, num_heads):
        """Rotary embeddings modify no score."""
        return None

    def extra_repr(self) -> str:
        parts = [f"{self.axes_dims}", f"base={self.base:g}", f"layout={self.layout!r}"]
        if self.learned:
            parts.append(f"learned=True, num_heads={self.num_heads}")
        else:
            parts.append(f"max_seq_len={self.max_seq_len}")
        return ", ".join(parts)
