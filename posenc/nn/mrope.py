"""``MultimodalRotaryEmbedding``: multimodal RoPE (M-RoPE) of Qwen2-VL and Qwen2.5-VL for queries and keys."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from posenc import _validate
from posenc._deprecate import UNSET, renamed_attribute
from posenc._torch.angles import angle_dtype, exact_cos_sin, has_float64, host_sin_cos, working_dtype
from posenc._torch.checks import (
    check_float_dtype,
    check_offset,
    check_position_bounds,
    check_qk,
    check_same_device,
    from_table,
)
from posenc._torch.engine_choice import check_rope_engine, engine_from_backend
from posenc._torch.rope_call import check_flags, check_head_dim, choose_engine, feed, promise
from posenc._torch.rows import check_given_rows, clamp_in_table
from posenc._torch.tables import TableModule
from posenc.core import exact as core_exact
from posenc.core import hf_config as core_hf_config
from posenc.core import mrope as core_mrope
from posenc.core import rope as core_rope
from posenc.functional.mrope import check_mrope_positions
from posenc.kernels import rope_engine

__all__ = ["MultimodalRotaryEmbedding"]


class MultimodalRotaryEmbedding(TableModule):
    r"""Multimodal rotary position embedding (M-RoPE, Qwen2-VL) applied to queries and keys.

    Every token has three positions, temporal ``t``, height ``h`` and width ``w`` (from
    :func:`posenc.mrope_positions`).  There is one frequency schedule ``theta_j = base^(-2j/dim)``,
    ``j = 0 .. dim/2 - 1``; ``mrope_section = (s_t, s_h, s_w)`` (summing to ``dim/2``) assigns the
    first ``s_t`` slots to ``t``, the next ``s_h`` to ``h`` and the rest to ``w``, and slot ``j``
    rotates its feature pair by ``p_a(j) * theta_j``::

        slot   0 ..  s_t-1 | s_t .. s_t+s_h-1 | .. dim/2-1     feature pairs (j, j + dim/2), "half"
        angle  t * theta_j | h * theta_j      | w * theta_j

    With ``mrope_interleaved=True`` the slots go ``t, h, w, t, h, w, ...`` instead (Qwen3-VL; see
    :func:`posenc.core.mrope.mrope_axis_plan`).  Text tokens carry ``t = h = w``, so for them this is
    exactly :class:`posenc.RotaryEmbedding` with the same ``dim`` and ``base``.

    Angles are exact (:mod:`posenc.core.exact`): a float32 table of ``cos``/``sin`` for positions
    ``0 .. max_seq_len - 1`` is built once by :meth:`reset_buffers` (non-persistent buffers that stay
    float32 after ``module.to(torch.bfloat16)``), each token's row is gathered slot by slot from the
    positions of its axes, and positions past the table (or float64 inputs) are computed exactly on
    the fly, autocast off, rounded once.  One range reduction per call decides between the two;
    ``assume_valid=True`` skips it (no device synchronisation), and while tracing positions are
    computed exactly unless promised in the table.  ``forward`` never writes to the module.

    Args:
        dim: rotary dim (features rotated per head), even; features of ``q`` past it pass through.
        mrope_section: frequency slots per axis ``(s_t, s_h, s_w)``, summing to ``dim / 2``
            (Qwen2-VL-7B: ``[16, 24, 24]`` for ``dim=128``).
        max_seq_len: table rows (positions ``0 .. max_seq_len - 1`` are looked up).
        base: frequency base (``rope_theta``).
        mrope_interleaved: Qwen3-VL's interleaved slot assignment instead of contiguous sections.
        layout: feature pairs ``"half"`` (``i, i + dim/2``; Hugging Face) or ``"interleaved"`` (``2i, 2i+1``).
        scaling: a context-extension rule whose frequencies do not depend on the sequence length
            (linear, YaRN, Llama 3, NTK) or None.
        engine: ``"auto"``, ``"torch"`` or ``"triton"``, as for :class:`posenc.RotaryEmbedding`.
        backend: the old name of ``engine`` (deprecated; it still works for now).
        device: device of the tables.

    Shape:
        ``q``: ``(B, H, S, D)`` (``seq_dim=-2``) or ``(B, S, H, D)`` (``seq_dim=1``); ``k`` likewise
        with its own head count; ``positions``: ``(S, 3)`` or ``(B, S, 3)``, axes ``t, h, w`` last
        (as :func:`posenc.mrope_positions` returns them and :func:`posenc.attention` passes them).
        The old order, axes first (``(3, S)``, ``(3, B, S)``), is still read for one release, with a
        ``DeprecationWarning``; a shape that fits both readings, such as ``(3, 3)``, is read axes last.

    Examples:
        >>> mrope = MultimodalRotaryEmbedding(6, [1, 1, 1])                  # theta = 1, 0.0464, 0.00215
        >>> q = torch.tensor([[[[1.0, 1.0, 1.0, 0.0, 0.0, 0.0]]]])            # (B=1, H=1, S=1, D=6)
        >>> positions = torch.tensor([[2, 3, 5]])                            # t=2, h=3, w=5: (S=1, 3)
        >>> mrope(q, positions=positions)[0]                                 # cos(p theta), then sin(p theta)
        tensor([[[[-0.4161,  0.9903,  0.9999,  0.9093,  0.1388,  0.0108]]]])

    References:
        Wang et al., "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World at Any
        Resolution", arXiv:2409.12191.  Su et al., "RoFormer", arXiv:2104.09864.
    """

    _table_buffers = ("inv_freq_table", "turns_by_axis", "digits_by_axis", "cos_table", "sin_table")
    _float64_buffers = ("inv_freq_table", "turns_by_axis")
    # buffers registered in __init__ (declared here for type checkers)
    inv_freq_table: torch.Tensor
    turns_by_axis: torch.Tensor
    digits_by_axis: torch.Tensor
    slot_axis: torch.Tensor
    slot_order: torch.Tensor
    cos_table: torch.Tensor
    sin_table: torch.Tensor
    _ignored_state_keys = ("inv_freq", "original_inv_freq", "cos_cached", "sin_cached")

    def __init__(
        self,
        dim: int,
        mrope_section: Any,
        *,
        max_seq_len: int = 4096,
        base: float = 10000.0,
        mrope_interleaved: bool = False,
        layout: str = "half",
        scaling: core_rope.RopeScaling | None = None,
        engine: str = "auto",
        backend: str = UNSET,
        device: torch.device | str | None = None,
    ) -> None:
        if backend is not UNSET:                 # the old name of engine=
            engine = engine_from_backend("MultimodalRotaryEmbedding", backend, engine)
        super().__init__()
        self.dim, self.max_seq_len, self.base, self.layout = core_rope.check_rotary_args(dim, max_seq_len, base, layout)
        self.engine = check_rope_engine(engine)
        plan = core_mrope.mrope_axis_plan(self.dim, mrope_section, interleaved=mrope_interleaved)
        self.mrope_section = core_mrope.check_mrope_section(mrope_section, self.dim)
        self.mrope_interleaved = mrope_interleaved
        if scaling is not None and not isinstance(scaling, core_rope.RopeScaling):
            raise TypeError(
                f"scaling must be None or a posenc scaling rule whose frequencies do not depend on the length "
                f"(LinearScaling, NTKScaling, YarnScaling, Llama3Scaling, ProportionalScaling), got {scaling!r}"
            )
        if scaling is not None and scaling.length_dependent:
            raise ValueError(
                f"MultimodalRotaryEmbedding takes scaling rules whose frequencies do not depend on the sequence "
                f"length (linear, NTK, YaRN, Llama 3); got {type(scaling).__name__}"
            )
        self._freqs = core_rope.frequencies(self.dim, self.base, scaling, None)   # validates scaling and base
        self.scaling = scaling
        self.attention_factor = 1.0 if scaling is None else scaling.attention_factor()
        slots = core_mrope.mrope_axis_slots(plan)
        self._axis_bounds = tuple(int(sum(len(s) for s in slots[:a])) for a in range(4))   # (0, n_t, n_t+n_h, h)
        self._contiguous = not mrope_interleaved
        h = self.dim // 2
        wide = angle_dtype(device)                          # float64, or float32 on a device without float64
        self.register_buffer("inv_freq_table", torch.empty(h, device=device, dtype=wide), persistent=False)
        # split frequencies (core.exact) in axis order: slots of t, then of h, then of w
        self.register_buffer("turns_by_axis", torch.empty(4, h, device=device, dtype=wide), persistent=False)
        # the same as float32 digits, for exact angles on a device without float64
        digits = (core_exact.POSITION_CHUNKS, core_exact.DIGIT_COLUMNS)
        self.register_buffer("digits_by_axis", torch.empty(*digits, h, device=device), persistent=False)
        self.register_buffer("slot_axis", torch.empty(h, device=device, dtype=torch.int64), persistent=False)
        self.register_buffer("slot_order", torch.empty(h, device=device, dtype=torch.int64), persistent=False)
        self.register_buffer("cos_table", torch.empty(self.max_seq_len, h, device=device), persistent=False)
        self.register_buffer("sin_table", torch.empty(self.max_seq_len, h, device=device), persistent=False)
        self._plan, self._slots = plan, slots
        self.reset_buffers()

    @classmethod
    def from_hf_config(
        cls,
        config: Any,
        *,
        max_seq_len: int = 4096,
        layout: str | None = None,
        engine: str = "auto",
        backend: str = UNSET,
        device=None,
    ) -> MultimodalRotaryEmbedding:
        """Build from a Qwen2-VL / Qwen2.5-VL (or Qwen3-VL) configuration, whole or its text config.

        ``mrope_section`` comes from ``rope_parameters`` (transformers 5) or ``rope_scaling``
        (transformers 4), the base from ``rope_theta``, the rotary dim from ``head_dim`` (else
        ``hidden_size // num_attention_heads``): see :func:`posenc.core.hf_config.mrope_from_hf`.
        A config without ``mrope_section`` gets its model type's default sections, as transformers'
        rotary class falls back to (Qwen2-VL ``[16, 24, 24]``); other configs without one raise
        ``ValueError``.  The layout is the model
        type's unless ``layout`` is given; the choice is logged at ``INFO`` level on the ``"posenc"``
        logger, and a ``layout`` that contradicts the model type warns with :class:`posenc.LayoutWarning`.
        """
        if backend is not UNSET:                 # the old name of engine=
            engine = engine_from_backend("MultimodalRotaryEmbedding.from_hf_config", backend, engine)
        base, rotary_dim, scaling, section, interleaved = core_hf_config.mrope_from_hf(config)
        layout = core_hf_config.choose_rope_layout(config, layout, who="MultimodalRotaryEmbedding.from_hf_config",
                                                   rotary_dim=rotary_dim)
        return cls(rotary_dim, section, max_seq_len=max_seq_len, base=base, mrope_interleaved=interleaved,
                   layout=layout, scaling=scaling, engine=engine, device=device)

    def reset_buffers(self) -> None:
        """(Re)build the tables in place, e.g. after meta-device construction and ``to_empty``."""
        device = self.cos_table.device
        if device.type == "meta":
            return
        order = [int(j) for s in self._slots for j in s]
        turns = core_exact.turns_split(self._freqs)                             # (4, h), slot order
        wide = self.turns_by_axis.dtype
        with torch.no_grad():
            self.inv_freq_table.copy_(torch.tensor([float(f) for f in self._freqs], dtype=wide))
            self.turns_by_axis.copy_(torch.from_numpy(turns[:, order].astype(
                np.float64 if wide == torch.float64 else np.float32)))
            self.digits_by_axis.copy_(torch.from_numpy(core_exact.turns_digits(turns[:, order]).copy()))
            self.slot_axis.copy_(torch.from_numpy(self._plan))
            self.slot_order.copy_(torch.tensor(order, dtype=torch.int64))
            if has_float64(device):
                c, s = exact_cos_sin(torch.arange(self.max_seq_len, device=device), turns, self.attention_factor,
                                     torch.float32)
            else:                                           # on the host (NumPy float64), moved as float32
                s, c = host_sin_cos(range(self.max_seq_len), turns, self.attention_factor)
            self.cos_table.copy_(c)
            self.sin_table.copy_(s)

    #: Old name of :attr:`engine` (deprecated).
    backend = renamed_attribute("backend", "engine")

    @property
    def inv_freq(self) -> torch.Tensor:
        """The float64 inverse frequencies ``(dim/2,)`` (one schedule for all three axes; a host tensor on a
        device without float64)."""
        if self.inv_freq_table.dtype != torch.float64:          # a device without float64: a host tensor
            return torch.from_numpy(np.array([float(f) for f in self._freqs], dtype=np.float64))
        return self.inv_freq_table

    # ---- cos/sin rows ------------------------------------------------------------------------------

    def cos_sin(
        self,
        positions: torch.Tensor,
        *,
        dtype: torch.dtype = torch.float32,
        assume_valid: bool = False,
        assume_in_table: Any = UNSET,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of shape ``positions.shape[:-1] + (dim/2,)`` for ``(..., 3)`` positions (axes last).

        Slot ``j`` holds ``cos(p_a(j) * theta_j)`` (attention factor included), ``a(j)`` the axis
        that drives slot ``j``.  ``assume_valid`` promises that every position lies in
        ``[0, max_seq_len)`` (no device read; the lookup stays bounds-checked); ``assume_in_table``
        is its old name (deprecated).
        """
        if assume_in_table is not UNSET:
            assume_valid = promise("MultimodalRotaryEmbedding.cos_sin", assume_in_table, assume_valid)
        positions = check_mrope_positions(positions, "MultimodalRotaryEmbedding.cos_sin")
        if positions.device != self.cos_table.device:
            check_same_device("positions", positions, "the tables", self.cos_table.device)
        check_float_dtype("dtype", dtype)
        _validate.check_bool("assume_valid", assume_valid)
        table = from_table("positions", positions, self.max_seq_len, table_ok=dtype == torch.float32,
                           assume=assume_valid)
        return self._rows(positions, table, dtype)

    def _rows(self, positions: torch.Tensor, table: bool, dtype: torch.dtype):
        """cos/sin rows for ``(..., 3)`` positions: gathered from the tables (``table``), else exact."""
        if table:
            h = self.dim // 2
            if torch.compiler.is_compiling():
                positions = clamp_in_table("positions", positions, self.max_seq_len)
            per_slot = positions.index_select(-1, self.slot_axis)                    # (..., h): p_a(j)
            flat = per_slot.long() * h + torch.arange(h, device=positions.device)      # row-major table index
            try:
                # (embedding rejects negative indices, which torch.take would wrap to the table's end)
                return (torch.embedding(self.cos_table.view(-1, 1), flat).squeeze(-1),
                        torch.embedding(self.sin_table.view(-1, 1), flat).squeeze(-1))
            except (IndexError, RuntimeError):                                         # a broken promise
                raise ValueError(
                    f"positions must lie in [0, {self.max_seq_len}) for the tables (they were promised to with "
                    f"assume_valid=True); drop the promise to have them checked or computed"
                ) from None
        parts = []
        for axis in range(3):
            lo, hi = self._axis_bounds[axis], self._axis_bounds[axis + 1]
            if hi > lo:
                parts.append(exact_cos_sin(positions[..., axis], self.turns_by_axis[:, lo:hi], self.attention_factor,
                                           dtype, self.digits_by_axis[..., lo:hi]))
        cos, sin = torch.cat([c for c, _ in parts], -1), torch.cat([s for _, s in parts], -1)   # (..., h) axis order
        if self._contiguous:
            return cos, sin
        return (torch.empty_like(cos).index_copy_(-1, self.slot_order, cos),
                torch.empty_like(sin).index_copy_(-1, self.slot_order, sin))

    # ---- rotation ----------------------------------------------------------------------------------

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        offset: int = 0,
        cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None,
        seq_dim: int = -2,
        inplace: bool = False,
        assume_valid: bool = False,
        assume_in_table: Any = UNSET,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rotate ``q`` and ``k`` (``k`` may be None); returns ``(q_rotated, k_rotated)``.

        Args:
            q: queries ``(B, H, S, D)`` or, with ``seq_dim=1``, ``(B, S, H, D)``; ``D >= dim``.
            k: keys of the same layout and sequence length (any head count), or None.
            positions: integer ``(S, 3)`` or ``(B, S, 3)`` positions, axes ``t, h, w`` last (e.g.
                from :func:`posenc.mrope_positions`); default: text positions ``offset + arange(S)``
                on all three axes.
            offset: first text position when ``positions`` is None (decoding step by step; with a
                prompt's rope delta ``d``, the token after ``n`` cached ones is at ``n + d``).
            cos_sin: rows from :meth:`cos_sin` instead of ``positions``: computed once per forward
                and shared by the layers (no range read, no gather per layer).
            seq_dim: sequence axis of ``q`` and ``k``.
            inplace: rotate ``q`` and ``k`` in place.
            assume_valid: promise that every position lies in ``[0, max_seq_len)``, so that their
                range is not read from the device (the lookup stays bounds-checked).
            assume_in_table: old name of ``assume_valid`` (deprecated).
        """
        if assume_in_table is not UNSET:
            assume_valid = promise("MultimodalRotaryEmbedding", assume_in_table, assume_valid)
        sd = check_qk(q, k, seq_dim, self.dim)
        check_flags(inplace, assume_valid)
        length = q.shape[sd]
        batch = q.shape[0] if sd > 0 else None
        device = q.device
        if device != self.cos_table.device:
            check_same_device("q", q, "the tables", self.cos_table.device)
        tracing = torch.compiler.is_compiling()
        if cos_sin is not None:
            if positions is not None or not (type(offset) is int and offset == 0):
                raise ValueError("pass either cos_sin (rows from cos_sin(positions)) or positions/offset, not both")
            cos, sin = check_given_rows(cos_sin, length=length, batch=batch, device=device, pairs=self.dim // 2)
            return self._rotate(q, k, sd, cos, sin, inplace)
        if positions is None:
            offset = check_offset(offset)
            if not tracing:
                check_position_bounds("positions", offset, offset + max(length, 1) - 1)
            positions = torch.arange(length, device=device).add_(offset).unsqueeze(-1).expand(-1, 3)   # (S, 3) text
            known = None if tracing else (offset, offset + length - 1)
        else:
            if not (type(offset) is int and offset == 0):
                raise ValueError("pass either positions or offset, not both (add the offset to positions)")
            positions = check_mrope_positions(positions, "MultimodalRotaryEmbedding")
            fits = positions.shape[-2] == length and (
                positions.dim() == 2 or positions.dim() == 3 and batch is not None and positions.shape[0] in (1, batch))
            if not fits:
                allowed = "(S, 3)" if batch is None else f"(S, 3) or (B, S, 3) with B={batch}"
                raise ValueError(f"positions must have shape {allowed}, S={length}; got {tuple(positions.shape)}")
            if positions.device != device:
                raise ValueError(f"positions are on {positions.device} but q on {device}; move them with .to()")
            known = None
        if not tracing and not length:
            return (q if inplace else q.clone()), (None if k is None else (k if inplace else k.clone()))
        cos, sin = self._rows_at(positions, q.dtype, assume_valid, known)
        return self._rotate(q, k, sd, cos, sin, inplace)

    def _rows_at(self, positions, dtype, assume, known=None):
        """Step 2 for checked ``(S, 3)``/``(B, S, 3)`` positions: table rows or exact ones, ``(S, h)``
        when shared by the batch, else ``(B, S, h)``."""
        work = working_dtype(dtype)
        table = from_table("positions", positions, self.max_seq_len, table_ok=work == torch.float32,
                           assume=assume, known=known)
        cos, sin = self._rows(positions, table, work)
        if cos.dim() == 3 and cos.shape[0] == 1:
            cos, sin = cos[0], sin[0]                                     # one row set shared by the batch
        return cos, sin

    def _rotate(self, q, k, sd, cos, sin, inplace):
        """Steps 3 and 4: rotate by rows ``(S, h)`` (shared by the batch) or ``(B, S, h)``."""
        engine = rope_engine(choose_engine(self.engine, q, k, sd))
        if cos.dim() == 2:                                                # (S, h)
            return feed(engine, q, k, inplace, cos=cos, sin=sin, positions=None, offset=0, layout=self.layout,
                        seq_dim=sd)
        index = torch.arange(cos.shape[0] * cos.shape[1], device=q.device).view(cos.shape[:2])   # (B, S) rows
        return feed(engine, q, k, inplace, cos=cos.flatten(0, 1), sin=sin.flatten(0, 1), positions=index, offset=0,
                    layout=self.layout, seq_dim=sd)

    # ---- what posenc.attention asks of an encoding ------------------------------------------------

    #: posenc.attention passes per-axis coordinates, axes last: ``(S, 3)`` or ``(B, S, 3)``
    position_axes = 3

    def attention_qk(self, q, k, *, positions, key_positions, seq_len, offsets, assume_valid):
        """Rotate queries at ``positions (..., S, 3)`` and keys at ``key_positions`` (axes t, h, w last,
        as :func:`posenc.mrope_positions` returns them), checked by ``posenc.attention``: this enters the
        pipeline after its validation step."""
        check_head_dim(q, self.dim)                        # the one thing attention cannot know: our dim
        if q.device != self.cos_table.device:
            check_same_device("q", q, "the tables", self.cos_table.device)
        cos, sin = self._rows_at(positions, q.dtype, assume_valid)
        if k is not None and key_positions is positions and q.shape[2] == k.shape[2]:
            return self._rotate(q, k, 2, cos, sin, False)                        # one range read, one gather
        q = self._rotate(q, None, 2, cos, sin, False)[0]
        if k is None:
            return q, None
        cos, sin = self._rows_at(key_positions, k.dtype, assume_valid)
        return q, self._rotate(k, None, 2, cos, sin, False)[0]

    def attention_bias(self, positions, key_positions, *, num_heads, dtype):
        """Rotary embeddings add no bias."""
        return None

    def attention_score_mod(self, positions, key_positions, *, num_heads):
        """Rotary embeddings modify no score."""
        return None

    def extra_repr(self) -> str:
        parts = [f"{self.dim}", f"mrope_section={list(self.mrope_section)}", f"max_seq_len={self.max_seq_len}",
                 f"base={self.base:g}", f"layout={self.layout!r}"]
        if self.mrope_interleaved:
            parts.append("mrope_interleaved=True")
        if self.scaling is not None:
            parts.append(f"scaling={self.scaling!r}")
        return ", ".join(parts)
