"""One rotary call, in four steps, shared by every rotary entry point (not public).

::

    public boundary            (apply_rope_qk, RotaryEmbedding.forward / rotate, the axial and
          |                     multimodal modules, rope_and_cache, rms_norm_rope_qk)
    0. the plan                a call with the signature of one seen before runs that call's plan
          |                     (posenc._torch.plans): its few per-call checks, then the engine
    1. check_call / check_varlen_call     validate once: q, k, positions or offset, flags
          |
    2. rows                    table or exact, decided once: a table's rows by position (checked
          |                     against the table's length, one read at most), or rows computed
          |                     for this call (exact angles: RotaryEmbedding past its table)
    3. choose_engine           the torch engine or the Triton kernel, decided once, no device reads
          |
    4. rotate / feed           the engine's call prepared once (kept as the plan of the call's
                                signature) rotates q and k (views of one buffer: out of place,
                                then copied back)

Whatever runs after step 1 trusts its arguments: protocol methods that ``posenc.attention`` calls
enter at step 2, never through a public method (which would validate again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from posenc import _validate
from posenc._deprecate import UNSET, renamed
from posenc._torch import plans
from posenc._torch.checks import (
    check_float_tensor,
    check_position_args,
    check_qk,
    check_same_device,
    check_seq_len,
    inplace_pair_overlaps,
)
from posenc._torch.engine_choice import (
    ROPE_ENGINES,
    check_rope_engine,
    kernel_limits,
    kernel_possible,
    resolve_rope_engine,
)
from posenc._torch.rows import clamp_in_table, out_of_table, position_range
from posenc.core.rope import ROPE_LAYOUTS

_FIX = "build a longer table or use posenc.nn.RotaryEmbedding, which computes them"


def check_flags(inplace: object, assume: object) -> None:
    """``inplace`` and the in-range promise ``assume_valid`` are bools (one comparison each when they are)."""
    if type(inplace) is not bool:
        _validate.check_bool("inplace", inplace)
    if type(assume) is not bool:
        _validate.check_bool("assume_valid", assume)


def promise(where: str, old_value: object, new_value: object) -> bool:
    """The in-range promise ``assume_valid`` of a call of ``where``, also accepted under its old
    name ``assume_in_table`` (deprecated), checked as a bool under the name the caller used."""
    if old_value is UNSET:
        return cast(bool, new_value)                                     # (checked with the other flags)
    _validate.check_bool("assume_in_table", old_value)               # a bad value is an error, not a warning
    return renamed(where, "assume_in_table", "assume_valid", old_value, new_value, False,
                   tracing=torch.compiler.is_compiling())


def check_head_dim(q: torch.Tensor, rotary_dim: int) -> None:
    """What ``posenc.attention`` cannot check for an encoding: ``q`` holds at least its rotary dim."""
    if q.shape[-1] < rotary_dim:
        raise ValueError(
            f"q has head dim {q.shape[-1]} < rotary dim {rotary_dim}; build the rotary embedding for a rotary dim "
            f"<= the head dim"
        )


def check_call(q: object, k: object, seq_dim: object, rotary_dim: int, positions: torch.Tensor | None, offset: object,
               inplace: object, assume: object, seq_len: object = None):
    """Step 1 for a padded call: ``(sd, positions, offset, seq_len)``, all checked.

    ``q``/``k`` are floating tensors of one rank, batch and length (head counts may differ), with
    at least ``rotary_dim`` features; ``positions`` ``(S,)``/``(B, S)`` or an int ``offset``.
    """
    sd = check_qk(q, k, seq_dim, rotary_dim)
    q = cast(torch.Tensor, q)                                            # (check_qk raised otherwise)
    positions, offset = check_position_args(positions, offset, q.shape[sd], q.shape[0] if sd > 0 else None,
                                            q.device)
    check_flags(inplace, assume)
    if seq_len is not None:
        seq_len = check_seq_len(seq_len)
    return sd, positions, offset, seq_len


def check_table_options(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: object, engine: object) -> None:
    """The tables' device, the layout and the engine of a call that rotates ``q`` from ``(P, d/2)``
    tables (written for speed: one comparison each on the hot path)."""
    if cos.device != q.device or sin.device != q.device:
        for name, t in (("cos", cos), ("sin", sin)):
            check_same_device(name, t, "q", q.device)
    if layout not in ROPE_LAYOUTS:
        _validate.check_choice("layout", layout, ROPE_LAYOUTS)
    if engine not in ROPE_ENGINES:
        check_rope_engine(engine)


def table_rotary_dim(cos: torch.Tensor, sin: torch.Tensor) -> int:
    """Check ``(P, d/2)`` cos/sin tables; returns the rotary dim ``d``."""
    for name, t in (("cos", cos), ("sin", sin)):
        if not (isinstance(t, torch.Tensor) and t.dtype.is_floating_point):
            check_float_tensor(name, t)
    if cos.dim() != 2 or cos.shape != sin.shape or not cos.shape[-1]:
        raise ValueError(
            f"cos and sin must be (P, d/2) tables of one shape with d/2 >= 1, got {tuple(cos.shape)} and "
            f"{tuple(sin.shape)}"
        )
    return 2 * cos.shape[-1]


def table_positions_ok(positions: torch.Tensor | None, offset: int, length: int, rows: int, assume: bool,
                       name: str = "positions") -> torch.Tensor | None:
    """Step 2 for caller-given tables (no exact fallback): positions must lie in ``[0, rows)``.

    Checked on the host for an offset, with one range reduction for a tensor, and not at all when
    promised (``assume``).  While compiling, a traceable assertion checks them and the positions
    returned are clamped into the table: a gather that fails inside a compiled CPU loop (inductor's
    own bounds check) would abort the process, where the assertion raises an error.  Returns the
    positions to look up.
    """
    if positions is None:
        if offset < 0 or offset + length > rows:
            raise ValueError(
                f"{name} {offset}..{offset + length - 1} are outside the cos/sin table of {rows} rows; {_FIX}"
            )
    elif torch.compiler.is_compiling():
        return clamp_in_table(name, positions, rows)
    elif assume or not positions.numel():
        return positions
    else:
        lo, hi = position_range(positions)
        if lo < 0 or hi >= rows:
            raise out_of_table(name, lo, hi, rows, _FIX)
    return positions


def choose_engine(engine: str, q: torch.Tensor, k: torch.Tensor | None, sd: int | None,
                  why: str | None = None) -> str:
    """Step 3: ``"torch"`` or ``"triton"`` for this call.  Reads nothing from the device.

    ``why`` is the caller's reason why the kernel cannot take the call; None lets this function
    check the kernel's limits on ``q`` and ``k`` (sequence axis ``sd``), and ``""`` says the caller
    has checked them all and the kernel can.
    """
    if not kernel_possible(engine, q):
        return "torch"
    if why is None:
        why = kernel_limits(q, sd) or (None if k is None else kernel_limits(k, sd))
    return resolve_rope_engine(engine, q, why or None)


#: Which features of a head rotate: the leading ``d`` (``"first"``, GPT-NeoX, Llama) or the trailing
#: ``d`` (``"last"``, DeepSeek-V4's latent heads); the others pass through unchanged.
ROTARY_SLICES = ("first", "last")


def check_rotary_slice(rotary_slice: object) -> str:
    if rotary_slice not in ROTARY_SLICES:
        _validate.check_choice("rotary_slice", rotary_slice, ROTARY_SLICES)
    return cast(str, rotary_slice)


def trailing(q: torch.Tensor, k: torch.Tensor | None, rotary_dim: int, inplace: bool):
    """``rotary_slice="last"``: ``(q_view, k_view, q_out, k_out)``, the views holding the trailing
    ``rotary_dim`` features of ``q_out``/``k_out``, to be rotated in place.  In place those are q and
    k themselves; out of place, copies of them (the leading features pass through with the copy)."""
    if not inplace:
        q = q.clone()
        k = None if k is None else k.clone()
    return q[..., q.shape[-1] - rotary_dim:], (None if k is None else k[..., k.shape[-1] - rotary_dim:]), q, k


def feed(engine: Callable, q: torch.Tensor, k: torch.Tensor | None, inplace: bool, **rows):
    """Step 4: ``engine(q, k, inplace=..., **rows)``; q and k that share memory (views of one fused
    QKV buffer) are rotated out of place and copied back."""
    if inplace and inplace_pair_overlaps(q, k) and k is not None:
        qr, kr = engine(q, k, inplace=False, **rows)
        return q.copy_(qr), k.copy_(kr)
    return engine(q, k, inplace=inplace, **rows)


def rotate(key: tuple | None, mod: Any, q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor | None,
           sin: torch.Tensor | None, packed: torch.Tensor | None, positions: torch.Tensor | None, offset: int,
           layout: str, sd: int, inplace: bool, read_range: bool, inverse: bool = False):
    """Step 4 with the plan: the call of engine module ``mod`` (``posenc.kernels.engine("rope_qk", name)``)
    prepared for this call, kept as the plan of ``key`` (see :mod:`posenc._torch.plans`), then run.  The
    tables are ``cos``/``sin`` or ``packed``; ``inverse`` rotates by ``-theta``.

    ``read_range``: later calls with this key read their positions' range (given, not promised).
    Calls that share memory between q and k in place, or that record autograd in place, run without
    keeping a plan; while tracing, the engine's one-shot call runs (for the Triton engines, its
    custom op).
    """
    if torch.compiler.is_compiling():
        return feed(mod.rope_qk, q, k, inplace, cos=cos, sin=sin, packed=packed, positions=positions, offset=offset,
                    layout=layout, seq_dim=sd, inverse=inverse)
    if inplace:
        if inplace_pair_overlaps(q, k):                 # views of one buffer: out of place, then copied back
            qr, kr = mod.rope_qk(q, k, cos=cos, sin=sin, packed=packed, positions=positions, offset=offset,
                                 layout=layout, seq_dim=sd, inplace=False, inverse=inverse)
            return q.copy_(qr), k.copy_(kr)             # type: ignore[union-attr]
        if torch.is_grad_enabled() and (q.requires_grad or k is not None and k.requires_grad):
            key = None                                  # (autograd records an in-place call: checked each time)
    cv, sv = (cos, sin) if cos is not None and sin is not None else mod.unpack_tables(packed, layout)
    run = mod.prepare(q, k, cv, sv, positions, offset, layout, sd, inplace, None, inverse)
    plans.put(key, plans.Plan(run, cv.shape[0], q.shape[sd], read_range))
    return run(q, k, cos, sin, positions, offset, None, packed)
