"""``RotaryEmbedding``: rotary position embedding for queries and keys, with every scaling rule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from posenc import _validate
from posenc.core import exact as _exact
from posenc.core import hf_config as _hf
from posenc.core import rope as _core
from posenc.functional import rope as _fr
from posenc.functional._common import check_position_args, check_positions
from posenc.nn._tables import TableModule

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(TableModule):
    r"""Rotary position embedding (RoFormer) applied to queries and keys.

    ``forward(q, k)`` rotates feature pair ``i`` of every head at position ``m`` by ``m * theta_i``,
    so attention scores depend only on the distance between query and key.  ``dim`` is the rotary
    dim (features rotated per head); the head dim comes from ``q``, and features past ``dim`` pass
    through unchanged (partial rotary, e.g. GPT-NeoX's 25%).

    Tables of ``cos``/``sin`` for positions ``0 .. max_seq_len - 1`` are built once at construction
    by :meth:`reset_buffers` from exact angles (frequencies to ~190 bits, see
    :mod:`posenc.core.exact`), times the rule's attention factor, rounded once to float32.  They are
    non-persistent buffers that stay float32 after ``module.to(torch.bfloat16)``; ``forward`` never
    writes to the module.  Positions past the table are computed exactly on the fly.  Float64
    inputs get float64 angles.

    Length-dependent rules (:class:`~posenc.DynamicNTKScaling`, :class:`~posenc.LongRopeScaling`)
    read ``seq_len`` (default: the largest position + 1).  Within the original context the
    precomputed table is used; beyond it the frequencies for that ``seq_len`` are computed for this
    call only.  Keys already in a KV cache keep the rotation they were given when they were cached:
    that is how these rules behave in every implementation, and why results of a dynamic rule
    depend on how a sequence was fed.

    Checkpoints of other libraries that store the derived tables (``inv_freq``, ``cos_cached``,
    ``sin_cached``, ``freqs``, ``freqs_cis``, torchtune's ``cache``/``theta``) load with
    ``strict=True``; the stored copies are ignored and never loaded.

    Args:
        dim: rotary dim, even.
        max_seq_len: rows precomputed.
        base: frequency base (``theta``/``rope_theta`` elsewhere).
        layout: ``"half"`` (GPT-NeoX, Hugging Face: pairs ``i, i + dim/2``) or ``"interleaved"``
            (GPT-J, Meta: pairs ``2i, 2i + 1``).
        scaling: a context-extension rule or None.
        xpos_scale_base: enables xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"):
            pair ``i`` of a query at position ``m`` is scaled by ``zeta_i^(m / xpos_scale_base)`` and
            of a key at ``n`` by ``zeta_i^(-n / xpos_scale_base)``, ``zeta_i = (2i/dim + 0.4) / 1.4``,
            so scores decay with ``m - n``.  Positions are not re-centred, so cached decoding is
            consistent; the key scale stays finite in float32 only for
            ``|position| < 70 * xpos_scale_base`` (``zeta_0^-p`` overflows beyond), and larger
            positions raise ``ValueError``.
        backend: ``"auto"`` (the fused Triton kernel for CUDA tensors when Triton imports and the
            case is supported: no xPos, positions inside the table, the table's frequencies; else
            the torch path), ``"torch"`` or ``"triton"`` (raises when the kernel cannot take a call).
        device: device of the tables.

    Shape:
        ``q``: ``(B, H, S, D)`` (``seq_dim=-2``) or ``(B, S, H, D)`` (``seq_dim=1``); ``k`` likewise
        with its own head count (GQA); ``positions``: ``(S,)`` or ``(B, S)``.

    Examples:
        >>> rope = RotaryEmbedding(4)
        >>> q = torch.tensor([[[[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]]])   # (1, 1, 2, 4)
        >>> rope(q)[0]
        tensor([[[[1.0000, 0.0000, 0.0000, 0.0000],
                  [0.5403, 0.0000, 0.8415, 0.0000]]]])

    References:
        Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv:2104.09864.
    """

    _table_buffers = ("inv_freq_table", "turns", "cos_table", "sin_table")
    _ignored_state_keys = (
        "inv_freq", "cos_cached", "sin_cached", "_cos_cached", "_sin_cached", "freqs", "freqs_cis", "cache", "theta",
        "original_inv_freq",
    )

    def __init__(
        self,
        dim: int,
        *,
        max_seq_len: int = 4096,
        base: float = 10000.0,
        layout: str = "half",
        scaling: _core.RopeScaling | None = None,
        xpos_scale_base: float | None = None,
        backend: str = "auto",
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.dim = _validate.check_int("dim", dim, minimum=2)
        if self.dim % 2:
            raise ValueError(f"dim (the rotary dim) must be even: features rotate in pairs; got {dim}")
        self.max_seq_len = _validate.check_int("max_seq_len", max_seq_len, minimum=1)
        self.base = _validate.check_float("base", base, positive=True)
        self.layout = _validate.check_choice("layout", layout, _fr.LAYOUTS)
        self.backend = _validate.check_choice("backend", backend, _fr.BACKENDS)
        # validates scaling and base too
        freqs = _core.frequencies(self.dim, self.base, scaling, None)
        self.scaling = scaling
        self.attention_factor = 1.0 if scaling is None else scaling.attention_factor()
        self.xpos_scale_base = (
            None if xpos_scale_base is None else _validate.check_float("xpos_scale_base", xpos_scale_base, positive=True)
        )
        h = self.dim // 2
        self.register_buffer("inv_freq_table", torch.empty(h, device=device, dtype=torch.float64), persistent=False)
        self.register_buffer("turns", torch.empty(4, h, device=device, dtype=torch.float64), persistent=False)
        for name in ("cos_table", "sin_table"):
            self.register_buffer(name, torch.empty(self.max_seq_len, h, device=device), persistent=False)
        self._freqs = freqs
        self.reset_buffers()

    @classmethod
    def from_hf_config(
        cls, config: Mapping[str, Any], *, max_seq_len: int = 4096, layout: str = "half", device=None
    ) -> RotaryEmbedding:
        """Build from a Hugging Face ``config.json`` dict (see :func:`posenc.rope_scaling_from_hf`)."""
        base, rotary_dim, scaling = _hf.rope_scaling_from_hf(config)
        return cls(rotary_dim, max_seq_len=max_seq_len, base=base, layout=layout, scaling=scaling, device=device)

    def reset_buffers(self) -> None:
        """(Re)build the tables in place, e.g. after meta-device construction and ``to_empty``."""
        device = self.cos_table.device
        if device.type == "meta":
            return
        with torch.no_grad():
            self.inv_freq_table.copy_(torch.tensor([float(f) for f in self._freqs], dtype=torch.float64))
            self.turns.copy_(torch.from_numpy(_exact.turns_split(self._freqs).copy()))
            c, s = _fr._exact_cos_sin(torch.arange(self.max_seq_len, device=device), self.turns,
                                      self.attention_factor, torch.float64)
            self.cos_table.copy_(c)                                           # one rounding
            self.sin_table.copy_(s)

    @property
    def inv_freq(self) -> torch.Tensor:
        """The table's float64 inverse frequencies ``(dim/2,)``."""
        return self.inv_freq_table

    def cos_sin(
        self, positions: torch.Tensor, *, seq_len: int | None = None, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of shape ``positions.shape + (dim/2,)``, attention factor included."""
        check_positions("positions", positions)
        return self._cos_sin(positions, self._range(positions), seq_len, dtype)

    @staticmethod
    def _range(positions: torch.Tensor) -> tuple[int, int]:
        """``(min, max)`` of ``positions``, read once per call (a device sync on GPUs); ``(0, 0)``
        when empty or while compiling, where data-dependent checks are skipped."""
        if positions.numel() and not torch.compiler.is_compiling():
            return int(positions.min()), int(positions.max())
        return 0, 0

    def _cos_sin(self, positions: torch.Tensor, rng: tuple[int, int], seq_len: int | None, dtype: torch.dtype):
        lo, hi = rng
        compiling = torch.compiler.is_compiling()
        if self.scaling is not None and self.scaling.length_dependent:
            length = seq_len if seq_len is not None else hi + 1
            freqs = self.scaling.frequencies(self.dim, self.base, length)
            if freqs != self._freqs:                                         # this call only
                return _fr._exact_cos_sin(positions, _exact.turns_split(freqs), self.attention_factor, dtype)
        if dtype == torch.float32 and not compiling and 0 <= lo and hi < self.max_seq_len:
            return self.cos_table[positions], self.sin_table[positions]
        if lo < -_exact.MAX_POSITION or hi > _exact.MAX_POSITION:
            raise ValueError(f"positions must lie within [-2**31, 2**31], got values in [{lo}, {hi}]")
        return _fr._exact_cos_sin(positions, self.turns, self.attention_factor, dtype)

    def _xpos_scale(self, positions: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """``zeta^(p / scale_base)`` per pair, float64 ``positions.shape + (dim/2,)``."""
        limit = 70 * self.xpos_scale_base
        if max(-lo, hi) >= limit:
            raise ValueError(
                f"xPos scales overflow float32 for |position| >= 70 * xpos_scale_base = {limit:g}; got positions in "
                f"[{lo}, {hi}]; raise xpos_scale_base"
            )
        log_zeta = torch.from_numpy(_core.xpos_zeta(self.dim)).log().to(positions.device)
        return torch.exp(positions.to(torch.float64)[..., None] / self.xpos_scale_base * log_zeta)

    def _check(self, name: str, t: torch.Tensor) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating tensor, got dtype {t.dtype}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dims (..., S, D), got shape {tuple(t.shape)}")
        if t.shape[-1] < self.dim:
            raise ValueError(
                f"{name} has head dim {t.shape[-1]} < rotary dim {self.dim}; build RotaryEmbedding with "
                f"dim <= the head dim"
            )

    def _positions(self, x: torch.Tensor, sd: int, positions: torch.Tensor | None, offset: int) -> torch.Tensor:
        """Validated positions ``(S,)`` or ``(B, S)`` for ``x`` with sequence axis ``sd``."""
        length = x.shape[sd]
        offset = check_position_args(positions, offset, length, x.shape[0] if sd > 0 else None)
        return torch.arange(offset, offset + length, device=x.device) if positions is None else positions

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        offset: int = 0,
        seq_dim: int = -2,
        inplace: bool = False,
        seq_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rotate ``q`` and ``k`` (``k`` may be None); returns ``(q_rotated, k_rotated)``.

        Args:
            q: queries ``(B, H, S, D)`` or, with ``seq_dim=1``, ``(B, S, H, D)``; ``D >= dim``.
            k: keys of the same layout and sequence length (any head count), or None.
            positions: integer positions ``(S,)`` or ``(B, S)`` (e.g. from
                :func:`posenc.positions_from_mask`); default ``offset + arange(S)``.
            offset: first position when ``positions`` is None (decoding step by step).
            seq_dim: sequence axis of ``q`` and ``k``.
            inplace: rotate ``q`` and ``k`` in place (the fast path; no output allocation).
            seq_len: current sequence length for length-dependent rules (default: the largest
                position + 1).
        """
        self._check("q", q)
        if k is not None:
            self._check("k", k)
        sd = _fr.normalize_seq_dim(q, seq_dim)
        if k is not None and (k.dim() != q.dim() or k.shape[sd] != q.shape[sd] or k.shape[0] != q.shape[0]):
            raise ValueError(f"k {tuple(k.shape)} must match q {tuple(q.shape)} in rank, batch and sequence length")
        if seq_len is not None:
            seq_len = _validate.check_int("seq_len", seq_len, minimum=1)
        positions = self._positions(q, sd, positions, offset)
        rng = self._range(positions)
        if self.backend != "torch":
            why = self._triton_why_not(q, k, sd, rng, seq_len)
            if _fr.use_triton(self.backend, q, why):
                from posenc.kernels import triton_rope

                return triton_rope.rope_qk(q, k, self.cos_table, self.sin_table, positions, 0,
                                           self.layout == "interleaved", sd, inplace)
        tables = self._tables(q, positions, rng, sd, seq_len)                     # once for q and k
        q_out = self._rotate(q, positions, rng, sd, tables, key=False, inplace=inplace)
        k_out = None if k is None else self._rotate(k, positions, rng, sd, tables, key=True, inplace=inplace)
        return q_out, k_out

    def _triton_why_not(self, q, k, sd, rng, seq_len) -> str | None:
        """Why the fused kernel cannot take this call (None if it can)."""
        why = _fr._triton_case(q, sd) or (None if k is None else _fr._triton_case(k, sd))
        if why:
            return why
        if self.xpos_scale_base is not None:
            return "xPos scales are applied by the torch path"
        if torch.compiler.is_compiling():
            return None if self.scaling is None or not self.scaling.length_dependent else "length-dependent rule"
        lo, hi = rng
        if lo < 0 or hi >= self.max_seq_len:
            return f"positions [{lo}, {hi}] go past the table of {self.max_seq_len} rows (the torch path computes them)"
        if self.scaling is not None and self.scaling.length_dependent:
            length = seq_len if seq_len is not None else hi + 1
            if self.scaling.frequencies(self.dim, self.base, length) != self._freqs:
                return f"the rule's frequencies for seq_len={length} differ from the table's"
        return None

    def rotate(
        self,
        x: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        offset: int = 0,
        key: bool = False,
        seq_dim: int = -2,
        inplace: bool = False,
        seq_len: int | None = None,
    ) -> torch.Tensor:
        """Rotate one tensor of queries (``key=False``) or keys (``key=True``) on its own positions.

        ``forward(q, k)`` is ``rotate(q)`` and ``rotate(k, key=True)`` with shared positions; call
        this directly when queries and keys sit at different positions (a query after cached keys).
        ``key`` matters only for xPos, whose key scale is the inverse of the query scale.
        """
        self._check("x", x)
        if not isinstance(key, bool):
            raise TypeError(f"key must be a bool, got {key!r}")
        sd = _fr.normalize_seq_dim(x, seq_dim)
        if seq_len is not None:
            seq_len = _validate.check_int("seq_len", seq_len, minimum=1)
        positions = self._positions(x, sd, positions, offset)
        rng = self._range(positions)
        tables = self._tables(x, positions, rng, sd, seq_len)
        return self._rotate(x, positions, rng, sd, tables, key=key, inplace=inplace)

    def _tables(self, x: torch.Tensor, positions: torch.Tensor, rng: tuple[int, int], sd: int, seq_len: int | None):
        """cos/sin for ``positions``, shaped to broadcast against ``x`` (sequence axis ``sd``)."""
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = self._cos_sin(positions, rng, seq_len, dtype)                # (S, h) or (B, S, h)
        return _fr.broadcast_rows(cos, x.dim(), sd), _fr.broadcast_rows(sin, x.dim(), sd)

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor, rng: tuple[int, int], sd: int, tables, *,
                key: bool, inplace: bool) -> torch.Tensor:
        """Rotate ``x`` whose sequence axis is ``sd`` by ``positions`` (validated) with ``tables``."""
        cos, sin = tables
        if self.xpos_scale_base is not None:
            scale = _fr.broadcast_rows(self._xpos_scale(positions, *rng), x.dim(), sd)      # float64
            if key:
                scale = 1.0 / scale
            cos, sin = (cos * scale).to(cos.dtype), (sin * scale).to(sin.dtype)
        return _fr.apply_rope(x, cos, sin, layout=self.layout, inplace=inplace)

    def extra_repr(self) -> str:
        parts = [f"{self.dim}", f"max_seq_len={self.max_seq_len}", f"base={self.base:g}", f"layout={self.layout!r}"]
        if self.scaling is not None:
            parts.append(f"scaling={self.scaling!r}")
        if self.xpos_scale_base is not None:
            parts.append(f"xpos_scale_base={self.xpos_scale_base:g}")
        return ", ".join(parts)


