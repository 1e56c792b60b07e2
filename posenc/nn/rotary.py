"""``RotaryEmbedding``: rotary position embedding for queries and keys, with every scaling rule."""

from __future__ import annotations

from typing import Any, Protocol, cast

import numpy as np
import torch

from posenc import _validate
from posenc._deprecate import UNSET, renamed_attribute
from posenc._torch import exact32, plans
from posenc._torch.angles import angle_dtype, exact_cos_sin, float64_cos_sin, has_float64, host_sin_cos, working_dtype
from posenc._torch.checks import (
    check_float_dtype,
    check_position_bounds,
    check_positions,
    check_same_device,
    check_seq_len,
)
from posenc._torch.engine_choice import check_rope_engine, engine_from_backend
from posenc._torch.rope_call import (
    check_call,
    check_flags,
    check_head_dim,
    check_rotary_slice,
    choose_engine,
    feed,
    promise,
    rotate,
    trailing,
)
from posenc._torch.rows import clamp_in_table, position_range, provably_in_table, table_rows
from posenc._torch.tables import TableModule
from posenc._torch.varlen import check_varlen_call, varlen_positions, varlen_range
from posenc.core import exact as core_exact
from posenc.core import hf_config as core_hf_config
from posenc.core import rope as core_rope
from posenc.kernels import engine as kernel_engine
from posenc.kernels import rope_engine
from posenc.kernels.torch_rope import pack_tables, row_factors, unpack_tables

__all__ = ["RotaryEmbedding"]



class _LengthRule(Protocol):
    """What a length-dependent scaling rule (dynamic NTK, LongRoPE) offers beyond :class:`RopeScaling`."""

    original_max_seq_len: int

    def attention_factor_at(self, seq_len: int | None) -> float: ...

    def frequencies(self, dim: int, base: float, seq_len: int | None = None) -> tuple[Any, ...]: ...

    def frequencies_past(self, dim: int, base: float, length: Any, xp: Any) -> Any: ...


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
    inputs get float64 angles.  On a device without float64 (Apple's MPS) the table is built on the
    host and the angles past it are computed in float32 with error-free transformations, to the
    same one-ulp result (see "Devices without float64" in the getting-started guide; Dekker 1971,
    Cody and Waite 1980).

    Decoding step by step with ``offset`` reads nothing back from the device: the positions'
    range is known on the host.  With a ``positions`` tensor, one range reduction per call decides
    between the table and exact computation; pass ``assume_valid=True`` to promise that every
    position lies in ``[0, max_seq_len)`` and skip it (no device synchronisation, as a CUDA-graph
    captured decode step needs).  The lookup stays bounds-checked, so a broken promise raises (or,
    in the Triton kernel, gives NaN rows) and never reads outside the tables.  While tracing
    (``torch.compile``, ``torch.export``) the range is unknown: positions are computed exactly, or
    looked up under a traceable assertion with ``assume_valid=True`` or ``engine="triton"``.

    Length-dependent rules (:class:`~posenc.DynamicNTKScaling`, :class:`~posenc.LongRopeScaling`)
    read ``seq_len`` (default: the largest position + 1).  Within the original context the
    precomputed table is used; beyond it the frequencies for that ``seq_len`` are computed for this
    call only.  Keys rotated into a KV cache keep the rotation of the step that cached them (rotate
    each new key once with ``rotate(k, key=True, offset=t)`` and pass ``keys_rotated=True`` to
    :func:`posenc.attention`): that is how Hugging Face models cache keys, and why results of a
    dynamic rule depend on how a sequence was fed.

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
        engine: ``"auto"`` (the fused Triton kernel for CUDA tensors when Triton imports and the
            case is supported: no xPos, positions inside the table, the table's frequencies; else
            the torch engine), ``"torch"`` (never the kernel) or ``"triton"`` (raises when the
            kernel cannot take a call).  Decided once per call, reading nothing from the device.
        backend: the old name of ``engine`` (deprecated; it still works for now).
        rotary_slice: which ``dim`` features of a head rotate when the head is wider: ``"first"``
            (the leading ones: GPT-NeoX, Llama) or ``"last"`` (the trailing ones: DeepSeek-V4's
            latent heads); the others pass through unchanged.
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

    _table_buffers = ("inv_freq_table", "turns", "past_turns", "turns32", "past_turns32", "packed_table")
    _float64_buffers = ("inv_freq_table", "turns", "past_turns")
    inv_freq_table: torch.Tensor
    turns: torch.Tensor
    past_turns: torch.Tensor
    turns32: torch.Tensor
    past_turns32: torch.Tensor
    packed_table: torch.Tensor
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
        scaling: core_rope.RopeScaling | None = None,
        xpos_scale_base: float | None = None,
        engine: str = "auto",
        backend: str = UNSET,
        rotary_slice: str = "first",
        device: torch.device | str | None = None,
    ) -> None:
        if backend is not UNSET:                 # the old name of engine=
            engine = engine_from_backend("RotaryEmbedding", backend, engine)
        super().__init__()
        self.dim, self.max_seq_len, self.base, self.layout = core_rope.check_rotary_args(dim, max_seq_len, base, layout)
        self.engine = check_rope_engine(engine)
        self.rotary_slice = check_rotary_slice(rotary_slice)
        # validates scaling and base too
        freqs = core_rope.frequencies(self.dim, self.base, scaling, None)
        self.scaling = scaling
        self._length_dependent = scaling is not None and scaling.length_dependent
        self.attention_factor = 1.0 if scaling is None else scaling.attention_factor()
        # past the original context a rule may switch its factor too (Phi-3.5-MoE's long_mscale)
        self._past_factor = self.attention_factor if not self._length_dependent else self._rule.attention_factor_at(
            self._rule.original_max_seq_len + 1)
        self.xpos_scale_base = (
            None if xpos_scale_base is None else _validate.check_float("xpos_scale_base", xpos_scale_base, positive=True)
        )
        if self.xpos_scale_base is not None:
            # xPos's exponent rate log(zeta) / scale_base as float32 (hi, lo) lists, for devices without float64
            rate = np.log(core_rope.xpos_zeta(self.dim)) / self.xpos_scale_base
            rate_hi = rate.astype(np.float32)
            self._xpos_rate32 = (rate_hi.tolist(), (rate - rate_hi.astype(np.float64)).astype(np.float32).tolist())
        # the table's frequencies serve every call (no length-dependent rule, no xPos scales)
        self._plain = not self._length_dependent and self.xpos_scale_base is None
        # what a call's plan depends on of this module (posenc._torch.plans; its table is passed per call)
        self._signature = (self.dim, self.max_seq_len, self.layout, self.engine, self.rotary_slice)
        h = self.dim // 2
        # float64 where the device has it; on a device without float64 (Apple's MPS) float32, and the
        # angles come from the float32 digits below (tables are then built on the host)
        wide = angle_dtype(device)
        self.register_buffer("inv_freq_table", torch.empty(h, device=device, dtype=wide), persistent=False)
        self.register_buffer("turns", torch.empty(4, h, device=device, dtype=wide), persistent=False)
        # length-dependent rules: the frequencies just past the original context, for traced graphs
        past = 0 if not self._length_dependent else h
        self.register_buffer("past_turns", torch.empty(4, past, device=device, dtype=wide), persistent=False)
        # the same frequencies as float32 digits, for exact angles without float64
        digits = (core_exact.POSITION_CHUNKS, core_exact.DIGIT_COLUMNS)
        self.register_buffer("turns32", torch.empty(*digits, h, device=device), persistent=False)
        self.register_buffer("past_turns32", torch.empty(*digits, past, device=device), persistent=False)
        # cos/sin rows packed as the torch engine reads them (cos_table and sin_table are views):
        # [cos | cos | -sin | sin] for "half", (cos, sin) pairs for "interleaved"
        width = 4 * h if self.layout == "half" else 2 * h
        self.register_buffer("packed_table", torch.empty(self.max_seq_len, width, device=device), persistent=False)
        self._freqs = freqs
        self._factors: tuple[torch.Tensor | None, tuple[torch.Tensor, ...]] = (None, ())
        self.reset_buffers()

    @classmethod
    def from_hf_config(
        cls,
        config: Any,
        *,
        layer_type: str | None = None,
        max_seq_len: int = 4096,
        layout: str | None = None,
        engine: str = "auto",
        backend: str = UNSET,
        rotary_slice: str | None = None,
        device: torch.device | str | None = None,
    ) -> RotaryEmbedding:
        """Build from a Hugging Face configuration: a ``PretrainedConfig`` or a ``config.json`` dict.

        The base, rotary dim and scaling rule come from :func:`posenc.rope_scaling_from_hf` (with
        ``layer_type`` for per-layer-type models such as Gemma-3); the pair layout from the model
        type (:func:`posenc.rope_layout_from_hf`) unless ``layout`` is given.  The layout chosen and
        why are logged at ``INFO`` level on the ``"posenc"`` logger.  A composite config (Gemma-3,
        Llama-4, Llava-style wrappers) is read through its ``text_config``, also logged at ``INFO``.
        Keys posenc cannot honour raise :class:`ValueError` with the reason (multimodal RoPE: use
        :meth:`posenc.MultimodalRotaryEmbedding.from_hf_config`).

        ``rotary_slice`` (default: from the model type) says which features of a wider head rotate:
        DeepSeek-V4 (``model_type="deepseek_v4"``) rotates the trailing ones, every other model the
        leading ones.

        A ``layout`` that contradicts the model type warns with :class:`posenc.LayoutWarning`: the
        checkpoint's weights rotate with the config's layout.  Fix: leave ``layout`` out, or convert
        the weights once with ``posenc.convert_rope_weight(w, num_heads, src=<config's>, dst=layout)``.
        """
        if backend is not UNSET:                 # the old name of engine=
            engine = engine_from_backend("RotaryEmbedding.from_hf_config", backend, engine)
        base, rotary_dim, scaling = core_hf_config.rope_scaling_from_hf(config, layer_type=layer_type)
        layout = core_hf_config.choose_rope_layout(config, layout, who="RotaryEmbedding.from_hf_config",
                                                   rotary_dim=rotary_dim)
        if rotary_slice is None:
            rotary_slice = core_hf_config.rope_slice_from_hf(config)
        return cls(rotary_dim, max_seq_len=max_seq_len, base=base, layout=layout, scaling=scaling, engine=engine,
                   rotary_slice=rotary_slice, device=device)

    def reset_buffers(self) -> None:
        """(Re)build the tables in place, e.g. after meta-device construction and ``to_empty``."""
        device = self.packed_table.device
        if device.type == "meta":
            return
        wide = self.turns.dtype                             # float64, or float32 on a device without float64
        np_wide = np.float64 if wide == torch.float64 else np.float32
        split = core_exact.turns_split(self._freqs)
        with torch.no_grad():
            self.inv_freq_table.copy_(torch.tensor([float(f) for f in self._freqs], dtype=wide))
            self.turns.copy_(torch.from_numpy(split.astype(np_wide)))
            self.turns32.copy_(torch.from_numpy(core_exact.turns_digits(split).copy()))
            if self._length_dependent:
                past = core_exact.turns_split(
                    core_rope.frequencies(self.dim, self.base, self.scaling, self._rule.original_max_seq_len + 1))
                self.past_turns.copy_(torch.from_numpy(past.astype(np_wide)))
                self.past_turns32.copy_(torch.from_numpy(core_exact.turns_digits(past).copy()))
            if has_float64(device):
                c, s = exact_cos_sin(torch.arange(self.max_seq_len, device=device), self.turns, self.attention_factor,
                                     torch.float64)
            else:                                           # on the host (NumPy float64), moved as float32
                s, c = host_sin_cos(range(self.max_seq_len), split, self.attention_factor)
            self.packed_table.copy_(pack_tables(c, s, self.layout))           # one rounding
        self._make_factors()

    def _make_factors(self) -> None:
        """The decode step's factor rows as views of the packed table (:func:`row_factors`), made with
        the table (here and whenever ``.to()`` moves it); a step uses them only while they view the
        table the module holds, so ``forward`` never writes them."""
        table = cast(torch.Tensor, self._buffers["packed_table"])
        self._factors = (table, row_factors(table, self.layout))

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)
        self._make_factors()
        return self

    #: Old name of :attr:`engine` (deprecated).
    backend = renamed_attribute("backend", "engine")

    @property
    def _rule(self) -> _LengthRule:
        """The scaling rule, read only where it is length-dependent (so not None)."""
        return cast(_LengthRule, self.scaling)

    @property
    def length_dependent(self) -> bool:
        """Whether the scaling rule's frequencies depend on the sequence length (dynamic NTK, LongRoPE)."""
        return self._length_dependent

    @property
    def cos_table(self) -> torch.Tensor:
        """``cos`` of the precomputed positions, float32 ``(max_seq_len, dim/2)`` (a view)."""
        return unpack_tables(self.packed_table, self.layout)[0]

    @property
    def sin_table(self) -> torch.Tensor:
        """``sin`` of the precomputed positions, float32 ``(max_seq_len, dim/2)`` (a view)."""
        return unpack_tables(self.packed_table, self.layout)[1]

    @property
    def inv_freq(self) -> torch.Tensor:
        """The table's float64 inverse frequencies ``(dim/2,)`` (a host tensor on a device without float64)."""
        if self.inv_freq_table.dtype != torch.float64:          # a device without float64: a host tensor
            return torch.from_numpy(np.array([float(f) for f in self._freqs], dtype=np.float64))
        return self.inv_freq_table

    def cos_sin(
        self, positions: torch.Tensor, *, seq_len: int | None = None, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of shape ``positions.shape + (dim/2,)``, attention factor included."""
        positions = check_positions("positions", positions)
        if positions.device != self.packed_table.device:
            check_same_device("positions", positions, "the tables", self.packed_table.device)
        check_float_dtype("dtype", dtype)
        length: Any = check_seq_len(seq_len)              # an int or None; symbolic while tracing
        rng = self._range(positions, False)
        if rng is not None:
            check_position_bounds("positions", *rng)
        if self._length_dependent and torch.compiler.is_compiling():
            return self._traced_rule_cos_sin(positions, rng, length, dtype)
        freqs = self._call_frequencies(rng, length)
        if freqs is None and dtype == torch.float32 and self._in_table(rng):
            return table_rows(self.cos_table, positions, 0, 0), table_rows(self.sin_table, positions, 0, 0)
        return self._exact(positions, rng, freqs, dtype)

    # ---- the public entry points: validate once (step 1), then the trusted pipeline -----------------

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
        assume_valid: bool = False,
        cu_seqlens: torch.Tensor | None = None,
        inverse: bool = False,
        assume_in_table: bool = UNSET,
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
            assume_valid: promise that ``positions`` lie in ``[0, max_seq_len)``: their range
                is not read back from the device (see the class docstring).  With ``cu_seqlens``,
                it also promises valid cumulative lengths.  (Formerly ``assume_in_table``, which
                still works for now with a ``DeprecationWarning``.)
            cu_seqlens: a packed variable-length batch (flash-attention's varlen format): q
                ``(T, H, D)`` and k ``(T, H_k, D)`` hold ``N`` sequences back to back and
                ``cu_seqlens`` ``(N + 1,)`` their cumulative lengths ``[0, ..., T]``.  Positions
                restart at ``offset`` in every sequence (an int, or an integer tensor ``(N,)``:
                the tokens already cached per sequence), so the result equals rotating each
                sequence alone, length-dependent rules included (each sequence with its own
                length, unless ``seq_len`` is given).  ``seq_dim`` is not used.
            inverse: rotate by ``-theta``: the transpose of the rotation (xPos scales included),
                which undoes it exactly (DeepSeek-V4 rotates its attention output back this way).
        """
        if self.rotary_slice == "last" and self._last(q, inplace):    # the trailing features' views, in place
            qv, kv, qo, ko = trailing(q, k, self.dim, inplace)
            self.forward(qv, kv, positions=positions, offset=offset, seq_dim=seq_dim, inplace=True, seq_len=seq_len,
                         assume_valid=assume_valid, cu_seqlens=cu_seqlens, inverse=inverse,
                         assume_in_table=assume_in_table)
            return qo, ko
        key = None
        if seq_len is None and cu_seqlens is None and assume_in_table is UNSET:
            # step 0: a call with the signature of one validated before runs its plan (posenc._torch.plans)
            key, table = self._plan_key(q, k, positions, offset, seq_dim, inplace, assume_valid, inverse)
            plan = plans.find(key, q, k, positions, offset, inplace)
            if plan is not None:
                views = self._factors                            # (the table's own views, made with it)
                return plan.run(q, k, None, None, positions, offset, None, table,
                                views[1] if views[0] is table else None)
        if assume_in_table is not UNSET:
            assume_valid = promise("RotaryEmbedding", assume_in_table, assume_valid)
        if type(inverse) is not bool:
            _validate.check_bool("inverse", inverse)
        if cu_seqlens is not None:
            return self._forward_varlen(q, k, positions, offset, seq_len, assume_valid, inplace, cu_seqlens, inverse)
        sd, positions, offset, seq_len = check_call(q, k, seq_dim, self.dim, positions, offset, inplace,
                                                    assume_valid, seq_len)
        return self._rotate(q, k, sd, positions, offset, seq_len, assume_valid, inplace, False, key, inverse)

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
        assume_valid: bool = False,
        inverse: bool = False,
        assume_in_table: bool = UNSET,
    ) -> torch.Tensor:
        """Rotate one tensor of queries (``key=False``) or keys (``key=True``) on its own positions.

        ``forward(q, k)`` is ``rotate(q)`` and ``rotate(k, key=True)`` with shared positions; call
        this directly when queries and keys sit at different positions (a query after cached keys).
        ``key`` matters only for xPos, whose key scale is the inverse of the query scale;
        ``inverse`` rotates by ``-theta`` (see :meth:`forward`).
        """
        if self.rotary_slice == "last" and self._last(x, inplace):    # the trailing features' view, in place
            xv, _, xo, _ = trailing(x, None, self.dim, inplace)
            self.rotate(xv, positions=positions, offset=offset, key=key, seq_dim=seq_dim, inplace=True,
                        seq_len=seq_len, assume_valid=assume_valid, inverse=inverse, assume_in_table=assume_in_table)
            return xo
        plan_key = None
        if seq_len is None and assume_in_table is UNSET and (key is False or key is True):
            # step 0 (``key`` changes nothing without xPos): as forward(x)
            plan_key, table = self._plan_key(x, None, positions, offset, seq_dim, inplace, assume_valid, inverse)
            plan = plans.find(plan_key, x, None, positions, offset, inplace)
            if plan is not None:
                return plan.run(x, None, None, None, positions, offset, None, table)[0]
        if assume_in_table is not UNSET:
            assume_valid = promise("RotaryEmbedding.rotate", assume_in_table, assume_valid)
        if type(key) is not bool:
            _validate.check_bool("key", key)
        if type(inverse) is not bool:
            _validate.check_bool("inverse", inverse)
        sd, positions, offset, seq_len = check_call(x, None, seq_dim, self.dim, positions, offset, inplace,
                                                    assume_valid, seq_len)
        return self._rotate(x, None, sd, positions, offset, seq_len, assume_valid, inplace, key, plan_key, inverse)[0]

    def _last(self, q: object, inplace: object) -> bool:
        """With ``rotary_slice="last"``, whether a call's heads are wider than the rotary dim: then it
        rotates views of their trailing features in place (``inplace`` checked here, the rest by that
        call).  (Asked only of such modules: the common case costs no call.)"""
        if not isinstance(q, torch.Tensor) or not q.dim() or q.shape[-1] <= self.dim:
            return False
        _validate.check_bool("inplace", inplace)
        return True

    def _plan_key(self, q, k, positions, offset, seq_dim, inplace, assume_valid,
                  inverse=False) -> tuple[tuple | None, torch.Tensor]:
        """The key of a call's plan (:mod:`posenc._torch.plans`: everything its validation and engine
        decision read), None for a call no plan serves (a module whose frequencies depend on the call,
        an argument of another type than a plan's, tracing), and the table it rotates by."""
        table = cast(torch.Tensor, self._buffers["packed_table"])   # (not through nn.Module.__getattr__)
        if not (self._plain and type(q) is torch.Tensor and type(offset) is int and type(seq_dim) is int
                and (k is None or type(k) is torch.Tensor) and (positions is None or type(positions) is torch.Tensor)
                and (inplace is False or inplace is True) and (assume_valid is False or assume_valid is True)
                and (inverse is False or inverse is True) and not torch.compiler.is_compiling()):
            return None, table
        try:
            # (which tensors require grad matters only while autograd records)
            grad = torch.is_grad_enabled() and (q.requires_grad, k is not None and k.requires_grad)
            key = ("RotaryEmbedding", self._signature, table.device, q.shape, q.stride(), q.dtype, q.device,
                   None if k is None else (k.shape, k.stride(), k.dtype, k.device),
                   None if positions is None else (positions.shape, positions.stride(), positions.dtype,
                                                   positions.device),
                   seq_dim, inplace, assume_valid, inverse, grad)
        except RuntimeError:                                         # (sparse tensors have no strides)
            return None, table
        return key, table

    def _forward_varlen(self, q, k, positions, offset, seq_len, assume, inplace, cu_seqlens, inverse):
        """:meth:`forward` on a packed ``(T, H, D)`` batch: positions from ``cu_seqlens``, checked
        and ranged in one device read, then one rotation of the whole batch."""
        cu_seqlens, offset = check_varlen_call(q, k, self.dim, positions, cu_seqlens, offset)
        check_flags(inplace, assume)
        if seq_len is not None:
            seq_len = check_seq_len(seq_len)
        if seq_len is None and self._length_dependent:
            # each sequence alone has its own length, hence its own frequencies: one call per sequence
            return self._rotate_each(q, k, offset, assume, inplace, cu_seqlens, inverse)
        rng = None if assume or torch.compiler.is_compiling() else varlen_range(cu_seqlens, q.shape[0], offset)
        in_table = assume or (rng is not None and self._in_table(rng))
        pos = varlen_positions(cu_seqlens, q.shape[0], offset)[None]                 # (1, T)
        qo, ko = self._rotate(q[None], None if k is None else k[None], 1, pos, 0, seq_len, in_table, inplace,
                              False, None, inverse)                                  # (1, T, H, D)
        if inplace:
            return q, k
        return qo[0], (None if ko is None else ko[0])

    def _rotate_each(self, q, k, offset, assume, inplace, cu_seqlens, inverse):
        """Rotate every sequence of a packed batch alone (lengths read from the device once)."""
        if not assume:
            varlen_range(cu_seqlens, q.shape[0], offset)                             # checks cu_seqlens
        bounds = cu_seqlens.tolist()
        starts = offset.tolist() if isinstance(offset, torch.Tensor) else [offset] * (len(bounds) - 1)
        outs_q, outs_k = [], []
        for a, b, start in zip(bounds, bounds[1:], starts, strict=False):
            if a == b:
                continue
            qi, ki = self._rotate(q[a:b][None], None if k is None else k[a:b][None], 1, None, start, None,
                                  assume, inplace, False, None, inverse)             # (1, len, H, D)
            outs_q.append(qi[0])
            outs_k.append(None if ki is None else ki[0])
        if inplace:
            return q, k
        if not outs_q:
            return q.clone(), (None if k is None else k.clone())
        return torch.cat(outs_q), (None if k is None else torch.cat(outs_k))

    # ---- steps 2-4 for checked arguments: table or exact, the engine, the rotation ----------------

    def _rotate(self, q, k, sd, positions, offset, seq_len, assume, inplace, q_is_key, key=None, inverse=False):
        """Rotate checked ``q``/``k`` (sequence axis ``sd``) at ``positions`` or ``offset + arange(S)``
        (by ``-theta`` with ``inverse``); a rotation by the table's rows leaves its plan for ``key`` (see
        :mod:`posenc._torch.plans`)."""
        if self.rotary_slice == "last" and q.shape[-1] > self.dim:        # (internal callers: posenc.attention)
            qv, kv, qo, ko = trailing(q, k, self.dim, inplace)
            self._rotate(qv, kv, sd, positions, offset, seq_len, assume, True, q_is_key, None, inverse)
            return qo, ko
        table = self._buffers["packed_table"]                  # (not through nn.Module.__getattr__: per-step cost)
        if q.device != table.device:
            check_same_device("q", q, "the tables", table.device)
        length = q.shape[sd]
        tracing = torch.compiler.is_compiling()
        if not tracing:
            if not length:
                return tuple(None if t is None else (t if inplace else t.clone()) for t in (q, k))
            if (positions is None and self._plain and q.dtype != torch.float64 and 0 <= offset
                    and offset + length <= self.max_seq_len):
                # the decode step: table rows at a host-known offset, nothing else to decide
                mod = kernel_engine("rope_qk", choose_engine(self.engine, q, k, sd))
                return rotate(key, mod, q, k, None, None, table, None, offset, self.layout, sd, inplace, False,
                              inverse)
        rows, positions, rng, why = self._rows(q, positions, offset, length, seq_len, assume, tracing)
        name = choose_engine(self.engine, q, k, sd, why)
        if rows is None:                                                             # the table's rows
            return rotate(key, kernel_engine("rope_qk", name), q, k, None, None, table, positions, offset, self.layout, sd,
                          inplace, positions is not None and not assume, inverse)
        one_shot = rope_engine(name)
        cos, sin = rows
        if self.xpos_scale_base is None:
            return self._feed_rows(one_shot, q, k, sd, positions, cos, sin, inplace, inverse)
        scale = self._xpos_scale(positions, rng)                                     # float64, like cos
        outs = []
        for t, is_key in ((q, q_is_key), (k, True)):
            if t is not None:
                sc = 1.0 / scale if is_key else scale
                c, s = (cos * sc).to(cos.dtype), (sin * sc).to(sin.dtype)
                t = self._feed_rows(one_shot, t, None, sd, positions, c, s, inplace, inverse)[0]
            outs.append(t)
        return outs[0], outs[1]

    def _rows(self, q, positions, offset, length, seq_len, assume, tracing):
        """Step 2, table or exact: ``(None, positions, rng, None)`` to read the table, else
        ``((cos, sin), positions, rng, why)`` computed for this call, ``why`` saying why the kernel
        cannot take them (None if it can); ``rng`` is the positions' ``(min, max)`` when known on the
        host."""
        known_in_table = False
        if positions is None:
            # while tracing, the range is not read on the host: a table read only where static
            # shapes prove it in range, else computed exactly below, with no guard on the shapes,
            # so one graph (torch.export, dynamic=True) takes every length as eager mode does
            rng = None if tracing else (offset, offset + length - 1)
            known_in_table = tracing and provably_in_table(offset, length, self.max_seq_len)
            if seq_len is None and self._length_dependent:
                seq_len = offset + length
        else:
            rng = self._range(positions, assume)
        traced_rule = self._length_dependent and tracing
        freqs = None if traced_rule else self._call_frequencies(rng, seq_len)
        own_freqs = traced_rule or freqs is not None
        from_table = not own_freqs and self.xpos_scale_base is None and q.dtype != torch.float64 and (
            self._in_table(rng) if rng is not None else known_in_table or assume and positions is not None)
        if from_table:
            if rng is None and tracing and positions is not None:
                positions = clamp_in_table("positions", positions, self.max_seq_len)
            return None, positions, rng, None
        if rng is None and positions is not None:
            rng = self._range(positions, False)              # computed exactly: the promise does not cover it
        if positions is None:
            positions = torch.arange(offset, offset + length, device=q.device)
        if traced_rule:
            rows = self._traced_rule_cos_sin(positions, rng, seq_len, working_dtype(q.dtype))
        else:
            rows = self._exact(positions, rng, freqs, working_dtype(q.dtype))        # (S, h) or (B, S, h)
        if self.xpos_scale_base is not None:
            why: str | None = "xPos scales are applied by the torch engine"
        elif own_freqs:
            why = "the rule's frequencies for this length differ from the table's"
        elif q.dtype == torch.float64:
            why = f"dtype {q.dtype} is not supported by the kernel (float16, bfloat16, float32)"
        elif rng is not None:
            why = (f"positions [{rng[0]}, {rng[1]}] go past the table of {self.max_seq_len} rows (the torch engine "
                   f"computes them)")
        else:                                       # (engine="triton" takes the computed rows)
            why = "positions of unknown range while tracing are computed by the torch engine" if (
                self.engine == "auto") else None
        return rows, positions, rng, why

    def _feed_rows(self, engine, q, k, sd, positions, cos, sin, inplace, inverse=False):
        """Rotate by rows computed for this call: ``(S, h)``, or ``(B, S, h)`` read as a table."""
        if cos.dim() == 2:
            return feed(engine, q, k, inplace, cos=cos, sin=sin, positions=None, offset=0, layout=self.layout,
                        seq_dim=sd, inverse=inverse)
        index = torch.arange(positions.numel(), device=cos.device).view(positions.shape)     # (B, S)
        return feed(engine, q, k, inplace, cos=cos.flatten(0, 1), sin=sin.flatten(0, 1), positions=index, offset=0,
                    layout=self.layout, seq_dim=sd, inverse=inverse)

    # ---- what posenc.attention asks of an encoding ------------------------------------------------

    def attention_qk(self, q, k, *, positions, key_positions, seq_len, offsets, assume_valid):
        """Rotate queries at ``positions`` and (unrotated) keys at ``key_positions``; where
        ``offsets`` gives a host-known first position, by offset (no device reads).

        ``posenc.attention`` has checked every argument: this enters the pipeline after its
        validation step.  Length-dependent rules use ``seq_len``, by default the largest key
        position + 1.
        """
        check_head_dim(q, self.dim)                        # the one thing attention cannot know: our dim
        q_offset, k_offset = offsets
        if seq_len is None and self._length_dependent:
            if k_offset is not None:
                seq_len = k_offset + key_positions.shape[-1]
            elif torch.compiler.is_compiling():
                seq_len = key_positions.max() + 1                                    # in the graph
            else:
                rng = self._range(key_positions, assume_valid)                       # one read, when needed
                seq_len = None if rng is None else rng[1] + 1
        q_at = (None, q_offset) if q_offset is not None else (positions, 0)
        q = self._rotate(q, None, 2, *q_at, seq_len, assume_valid, False, False)[0]             # (B, H, S, D)
        if k is None:
            return q, None
        k_at = (None, k_offset) if k_offset is not None else (key_positions, 0)
        return q, self._rotate(k, None, 2, *k_at, seq_len, assume_valid, False, True)[0]        # (B, H_kv, S_k, D)

    def attention_bias(self, positions, key_positions, *, num_heads, dtype):
        """Rotary embeddings add no bias."""
        return None

    def attention_score_mod(self, positions, key_positions, *, num_heads):
        """Rotary embeddings modify no score."""
        return None

    # ---- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _range(positions: torch.Tensor, assume: bool) -> tuple[int, int] | None:
        """``(min, max)`` of ``positions`` (one device read), or None when unknown: promised in the
        table, tracing (no data-dependent reads), empty, or on the meta device (no values)."""
        if assume or not positions.numel() or positions.is_meta or torch.compiler.is_compiling():
            return None
        return position_range(positions)

    def _in_table(self, rng: tuple[int, int] | None) -> bool:
        return rng is not None and 0 <= rng[0] and rng[1] < self.max_seq_len

    def _call_frequencies(self, rng: tuple[int, int] | None, seq_len: int | None):
        """The rule's ``(frequencies, attention factor)`` for this call when they differ from the table's,
        else None."""
        if not self._length_dependent:
            return None
        if seq_len is None:
            if rng is None:
                raise ValueError(
                    f"{type(self.scaling).__name__} depends on the sequence length, which cannot be read from "
                    f"positions here (they are traced, promised in the table or empty); pass seq_len="
                )
            seq_len = rng[1] + 1
        freqs = self._rule.frequencies(self.dim, self.base, seq_len)
        factor = self._rule.attention_factor_at(seq_len)
        return None if freqs == self._freqs and factor == self.attention_factor else (freqs, factor)

    def _traced_rule_cos_sin(self, positions: torch.Tensor, rng, seq_len, dtype: torch.dtype):
        """cos/sin of a length-dependent rule while tracing, where decimal arithmetic cannot run.

        The length (``seq_len``, else the largest position + 1) is compared with the original
        context inside the graph, so one graph serves every length: within the context, the exact
        table frequencies; past it, the rule's frequencies for that length (LongRoPE's long factors
        exactly; dynamic NTK's formula in float64, which agrees with eager mode to about one
        float32 ulp).
        """
        if seq_len is None and rng is not None:
            seq_len = rng[1] + 1
        if seq_len is None:
            seq_len = positions.max() + 1
        if not has_float64(positions.device):
            # no float64 here: the table's and LongRoPE's long frequencies are exact (float32 digits);
            # dynamic NTK's length-dependent frequencies would need float64 inside the graph
            if self._rule.frequencies_past(self.dim, self.base, np.float64(self._rule.original_max_seq_len + 1),
                                          np) is not None:
                raise ValueError(
                    f"{type(self.scaling).__name__} under torch.compile needs float64 inside the graph, which device "
                    f"{positions.device} does not have; run this module eagerly there (its frequencies for each length "
                    f"are then computed on the host)"
                )
            length = seq_len if isinstance(seq_len, torch.Tensor) else torch.full((), seq_len, device=positions.device)
            c_in, s_in = exact_cos_sin(positions, self.turns, self.attention_factor, dtype, self.turns32)
            c_out, s_out = exact_cos_sin(positions, self.past_turns, self._past_factor, dtype, self.past_turns32)
            beyond = length > self._rule.original_max_seq_len
            return torch.where(beyond, c_out, c_in), torch.where(beyond, s_out, s_in)
        if isinstance(seq_len, torch.Tensor):
            length = seq_len.to(torch.float64)
        else:                                                   # an int or a symbolic int: no specialisation
            length = torch.full((), seq_len, dtype=torch.float64, device=positions.device)
        c_in, s_in = exact_cos_sin(positions, self.turns, self.attention_factor, dtype)
        past = self._rule.frequencies_past(self.dim, self.base, length, torch)
        if past is None:
            c_out, s_out = exact_cos_sin(positions, self.past_turns, self._past_factor, dtype)
        else:
            c_out, s_out = float64_cos_sin(positions, past, self._past_factor, dtype)
        beyond = length > self._rule.original_max_seq_len
        return torch.where(beyond, c_out, c_in), torch.where(beyond, s_out, s_in)

    def _exact(self, positions: torch.Tensor, rng, call, dtype: torch.dtype):
        """Exact cos/sin of ``positions`` for this call (``call``: the rule's frequencies and attention
        factor from :meth:`_call_frequencies`, None: the table's)."""
        if rng is not None:
            check_position_bounds("positions", *rng)
        if call is None:
            return exact_cos_sin(positions, self.turns, self.attention_factor, dtype, self.turns32)
        freqs, factor = call
        return exact_cos_sin(positions, core_exact.turns_split(freqs), factor, dtype)

    def _xpos_scale(self, positions: torch.Tensor, rng) -> torch.Tensor:
        """``zeta^(p / scale_base)`` per pair, float64 ``positions.shape + (dim/2,)``."""
        scale_base = cast(float, self.xpos_scale_base)                # set: only xPos modules call this
        limit = 70 * scale_base
        lo, hi = rng if rng is not None else (0, 0)         # unknown only while traced: unchecked there
        if max(-lo, hi) >= limit:
            raise ValueError(
                f"xPos scales overflow float32 for |position| >= 70 * xpos_scale_base = {limit:g}; got positions in "
                f"[{lo}, {hi}]; raise xpos_scale_base"
            )
        if not has_float64(positions.device):
            # float32: p * log(zeta) / scale_base as a double-float (p < 2**24 here), then exp(hi) * (1 + lo)
            hi, lo = self._xpos_rate32
            p = positions.to(torch.float32)[..., None]
            xh, xl = exact32.two_prod(p, torch.tensor(hi, device=positions.device))
            xl = xl + p * torch.tensor(lo, device=positions.device)
            return torch.exp(xh) * (1.0 + xl)
        log_zeta = torch.from_numpy(core_rope.xpos_zeta(self.dim)).log().to(positions.device)
        return torch.exp(positions.to(torch.float64)[..., None] / scale_base * log_zeta)

    def extra_repr(self) -> str:
        parts = [f"{self.dim}", f"max_seq_len={self.max_seq_len}", f"base={self.base:g}", f"layout={self.layout!r}"]
        if self.scaling is not None:
            parts.append(f"scaling={self.scaling!r}")
        if self.xpos_scale_base is not None:
            parts.append(f"xpos_scale_base={self.xpos_scale_base:g}")
        if self.rotary_slice != "first":
            parts.append(f"rotary_slice={self.rotary_slice!r}")
        return ", ".join(parts)
