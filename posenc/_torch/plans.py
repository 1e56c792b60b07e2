"""Step 0 of a rotary call: the plan of a call seen before (not public).

A public rotary call (``apply_rope_qk``, ``RotaryEmbedding``, ``rope_and_cache``,
``rms_norm_rope_qk``) validates its arguments, decides between the table and exact angles, and picks
its engine (steps 1 to 3 of :mod:`posenc._torch.rope_call`).  Every one of those outcomes is a
function of what the arguments *are* (their types, shapes, strides, dtypes and devices, whether
autograd records them, the options) and of a few values that a call checks on its own: the first
position (an int on the host), the positions' range (one read, none when promised), and whether an
in-place call's q and k share memory.

So the first call with a given signature takes the whole pipeline and leaves a *plan*, keyed by that
signature: the engine's eager call prepared once (for the Triton kernels, a launch specialised once,
see :mod:`posenc.kernels.triton_launch`) and the values each call must still check.  A later call
with the same key checks those values and runs the plan: it is validated by having the signature of
a validated call, and nothing is decided twice.  This is the one recogniser of a repeated call (a
decode step is the common one) that every rotary entry point shares; anything the plan does not
cover (a value out of range, a subclass of ``torch.Tensor``, a deprecated argument, tracing) takes
the full pipeline, which raises or computes as always.

A key holds no tensor and a plan no tensor data: nothing in here can go stale when a table changes,
moves or is freed (tables are passed to every call).  While tracing (``torch.compile``,
``torch.export``) plans are neither read nor made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from posenc._torch.rows import position_range

__all__ = ["MAX_PLANS", "Plan", "clear", "find", "get", "put"]

#: Plans kept; past this many the cache starts afresh (a plan is rebuilt by its next call).
MAX_PLANS = 4096

_plans: dict[tuple, Plan] = {}


class Plan:
    """A call's outcome: ``run``, the engine's prepared eager call, and what each call still checks.

    ``rows`` is the table's length and ``length`` the call's sequence length, so that a call at
    ``offset`` uses the plan only when ``0 <= offset <= last`` (``last = rows - length``);
    ``read_range`` says whether the positions' range is read per call (given and not promised);
    ``data`` holds what else an operation's per-call checks need.
    """

    __slots__ = ("run", "rows", "last", "read_range", "data")

    def __init__(self, run: Callable[..., Any], rows: int, length: int, read_range: bool, data: tuple = ()) -> None:
        self.run, self.rows, self.last, self.read_range, self.data = run, rows, rows - length, read_range, data


def get(key: tuple | None) -> Plan | None:
    """The plan of ``key`` (None when there is none, or when ``key`` is None or unhashable)."""
    if key is None:
        return None
    try:
        return _plans.get(key)
    except TypeError:                                   # an unhashable option: the pipeline says what is wrong
        return None


def find(key: tuple | None, q: torch.Tensor, k: torch.Tensor | None, positions: torch.Tensor | None, offset: int,
         inplace: bool) -> Plan | None:
    """The plan of a rotation's ``key``, when this call may run it: positions ``offset .. offset + S - 1``
    inside the table, or ``positions`` inside it (read once, unless promised when the plan was made),
    and, in place, q and k sharing no memory.  None sends the call through the whole pipeline."""
    if key is None:
        return None
    try:
        plan = _plans.get(key)
    except TypeError:                                   # an unhashable option: the pipeline says what is wrong
        return None
    if plan is None:
        return None
    if positions is None:
        ok = 0 <= offset <= plan.last
    elif offset:
        return None                                     # (positions and an offset: the pipeline refuses it)
    elif plan.read_range:
        lo, hi = position_range(positions)
        ok = 0 <= lo and hi < plan.rows
    else:
        ok = True
    if ok and (not inplace or k is None or not torch._C._overlaps(q, k)):
        return plan
    return None


def put(key: tuple | None, plan: Plan) -> None:
    """Keep ``plan`` for ``key`` (nothing while tracing, or when ``key`` is None)."""
    if key is None or torch.compiler.is_compiling():
        return
    if len(_plans) >= MAX_PLANS:
        _plans.clear()
    try:
        _plans[key] = plan
    except TypeError:
        pass


def clear() -> None:
    """Forget every plan (tests)."""
    _plans.clear()
