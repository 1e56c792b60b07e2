"""Bad inputs of positions and offsets, through every callable that takes them; positions_from_mask, positions_from_segment_ids, positions_from_cu_seqlens.

Each case either matches an independent float64 reference from ``tests/reference/`` or raises
``ValueError``/``TypeError`` naming the offending argument; any other exception or any warning fails it
(``tests/bad_inputs.py``).  ``tests/test_bad_inputs.py`` walks every public name against these cases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
import torch

import posenc
import posenc.functional as F
from posenc import (
    AlibiBias,
    LearnedPositionalEmbedding,
    RelativePositionBias,
    RotaryEmbedding,
    SinusoidalEncoding,
)
from tests.bad_inputs import (
    C8,
    EXACT,
    META,
    NAN,
    S8,
    SLOPES,
    Cases,
    arr,
    close,
    rand,
    ref_cos_sin,
    ref_rope,
    run_case,
)
from tests.reference.bias_oracle import alibi_bias as ref_alibi
from tests.reference.bias_oracle import alibi_slopes as ref_slopes
from tests.reference.bias_oracle import attention as ref_attention
from tests.reference.bias_oracle import t5_buckets as ref_bucket
from tests.reference.oracle import sinusoidal_f64 as ref_sinusoidal
from tests.reference.positions_oracle import from_cu_seqlens as ref_from_cu
from tests.reference.positions_oracle import from_mask as ref_from_mask
from tests.reference.positions_oracle import from_segment_ids as ref_from_segments
from tests.reference.rope_oracle import default as ref_theta

CASES = Cases()
bad, good = CASES.bad, CASES.good


# ---- positions: every callable that takes positions, through every kind of positions -------------


@dataclasses.dataclass(frozen=True)
class PositionsCall:
    """One callable taking a positions argument ``arg``.

    ``run(p)`` builds whatever else the call needs from ``p``'s shape (sequence length
    ``p.shape[-1]``, batch ``p.shape[0]`` for ``(B, S)`` with ``B > 1``, else 2) and returns
    ``(output, extra)``; ``ref(values, extra)`` gives the float64 reference.
    """

    name: str
    label: str
    run: Callable
    ref: Callable
    arg: str = "positions"
    shapes: str = "seq"          # "seq": (S,) or (B, S) only; "any": any shape
    bounds: str = "exact"        # "exact": |p| <= 2**31; "table": inside a table; "none"
    alone: bool = False          # no other tensor involved, so meta positions give a meta result
    atol: float = 1e-6
    bounds_arg: str | None = None  # the name a range error gives, when not ``arg``


def _geometry(p: torch.Tensor) -> tuple[int, int]:
    """``(B, S)`` of the input a call builds for positions ``p``."""
    shape = tuple(p.shape) if hasattr(p, "shape") else np.shape(p)
    s = shape[-1] if shape else 1
    b = shape[0] if len(shape) == 2 and shape[0] > 1 else 2
    return b, s


def _bcast(values, b: int, s: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(values, dtype=np.int64), (b, s))


def _run_sinusoidal_module(p):
    b, s = _geometry(p)
    return SinusoidalEncoding(5, max_seq_len=4)(torch.zeros(b, s, 5), positions=p), b


def _run_learned(p):
    b, s = _geometry(p)
    return LearnedPositionalEmbedding(8, 5, init="sinusoidal")(torch.zeros(b, s, 5), positions=p), b


def _run_rotary(p):
    b, s = _geometry(p)
    q, k = rand(b, 2, s, 8, seed=1), rand(b, 1, s, 8, seed=2)
    return RotaryEmbedding(8, max_seq_len=4)(q, k, positions=p), (q, k)


def _ref_rotary(v, qk):
    q, k = qk
    p = v if np.ndim(v) == 1 else np.broadcast_to(v, (q.shape[0], v.shape[-1]))
    return ref_rope(q, p), ref_rope(k, p)


def _run_apply_rope_qk(p):
    b, s = _geometry(p)
    q, k = rand(b, 2, s, 8, seed=3), rand(b, 1, s, 8, seed=4)
    return F.apply_rope_qk(q, k, C8, S8, positions=p), (q, k)


def _run_attention(p, key=False):
    b, s = _geometry(p)
    q, k, v = rand(b, 2, s, 8, seed=5), rand(b, 1, s, 8, seed=6), rand(b, 1, s, 8, seed=7)
    where = {"key_positions": p} if key else {"positions": p}
    return posenc.attention(q, k, v, encoding=RotaryEmbedding(8, max_seq_len=4), **where), (q, k, v)


def _ref_attention(v_pos, qkv, key=False):
    q, k, v = qkv
    b, s = q.shape[0], q.shape[2]
    p = _bcast(v_pos, b, s)
    default = _bcast(np.arange(s), b, s)
    qp, kp = (default, p) if key else (p, default)
    return ref_attention(ref_rope(q, qp), ref_rope(k, kp), arr(v))


QP, KP = torch.tensor([0, 3]), torch.tensor([0, 1, 2, 5])

POSITION_CALLS = [
    PositionsCall("sinusoidal_encoding", "", lambda p: (F.sinusoidal_encoding(p, 5), None),
                  lambda v, _: ref_sinusoidal(v, 5), shapes="any", alone=True),
    PositionsCall("rope_cos_sin", "", lambda p: (F.rope_cos_sin(p, torch.tensor(ref_theta(8))), None),
                  lambda v, _: ref_cos_sin(v, 8), shapes="any", alone=True),
    PositionsCall("relative_position_bucket", "", lambda p: (F.relative_position_bucket(p), None),
                  lambda v, _: ref_bucket(v), arg="relative_position", shapes="any", bounds="none", alone=True),
    PositionsCall("relative_distances", "", lambda p: (F.relative_distances(p, KP), None),
                  lambda v, _: np.asarray(v, np.int64)[..., None] - arr(KP).astype(np.int64), bounds="none"),
    PositionsCall("relative_distances", "key", lambda p: (F.relative_distances(QP, p), None),
                  lambda v, _: arr(QP).astype(np.int64)[..., :, None] - np.asarray(v, np.int64)[..., None, :],
                  arg="key_positions", bounds="none"),
    PositionsCall("alibi_bias", "", lambda p: (F.alibi_bias(p, KP, SLOPES), None),
                  lambda v, _: ref_alibi(v, arr(KP), arr(SLOPES)), bounds="none"),
    PositionsCall("alibi_bias", "key", lambda p: (F.alibi_bias(QP, p, SLOPES, symmetric=True), None),
                  lambda v, _: ref_alibi(arr(QP), v, arr(SLOPES), symmetric=True), arg="key_positions",
                  bounds="none"),
    PositionsCall("AlibiBias", "", lambda p: (AlibiBias(2)(p), None),
                  lambda v, _: ref_alibi(v, v, ref_slopes(2)), bounds="none"),
    PositionsCall("AlibiBias", "key", lambda p: (AlibiBias(3)(QP, p), None),
                  lambda v, _: ref_alibi(arr(QP), v, ref_slopes(3)), arg="key_positions", bounds="none"),
    PositionsCall("RelativePositionBias", "",
                  lambda p: (lambda m: (m(p), m.weight.detach().double().numpy()))(RelativePositionBias(2)),
                  lambda v, w: np.moveaxis(w[ref_bucket(np.asarray(v)[..., None, :] - np.asarray(v)[..., :, None])], -1, -3),
                  bounds="none"),
    PositionsCall("RelativePositionBias", "key",
                  lambda p: (lambda m: (m(QP, p), m.weight.detach().double().numpy()))(
                      RelativePositionBias(2, bidirectional=False)),
                  lambda v, w: np.moveaxis(
                      w[ref_bucket(np.asarray(v)[..., None, :] - arr(QP)[:, None].astype(np.int64), False)], -1, -3),
                  arg="key_positions", bounds="none"),
    PositionsCall("SinusoidalEncoding", "", _run_sinusoidal_module,
                  lambda v, b: np.broadcast_to(ref_sinusoidal(v, 5), (b, *np.shape(v)[-1:], 5))),
    PositionsCall("LearnedPositionalEmbedding", "", _run_learned,
                  lambda v, b: np.broadcast_to(ref_sinusoidal(v, 5), (b, *np.shape(v)[-1:], 5)), bounds="table"),
    PositionsCall("RotaryEmbedding", "", _run_rotary, _ref_rotary, atol=1e-5),
    PositionsCall("RotaryEmbedding", "cos_sin", lambda p: (RotaryEmbedding(8, max_seq_len=4).cos_sin(p), None),
                  lambda v, _: ref_cos_sin(v, 8), shapes="any"),
    PositionsCall("apply_rope_qk", "", _run_apply_rope_qk, _ref_rotary, bounds="table", atol=1e-5),
    PositionsCall("attention", "", _run_attention, _ref_attention, atol=1e-5),
    PositionsCall("attention", "key", lambda p: _run_attention(p, key=True),
                  lambda v, qkv: _ref_attention(v, qkv, key=True), arg="key_positions", atol=1e-5,
                  bounds_arg="positions"),   # the keys' rotation names its own argument (rotate(k, positions=...))
]

#: (id, values, positions tensor maker, kind)
POSITIONS = [
    *[(f"dtype-{str(dt).split('.')[-1]}", [2, 0, 1], lambda v, dt=dt: torch.tensor(v).to(dt), "good")
      for dt in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.uint32, torch.int64)],
    *[(f"dtype-{str(dt).split('.')[-1]}", [2, 0, 1], lambda v, dt=dt: torch.tensor(v).to(dt), "non-integer")
      for dt in (torch.float32, torch.float64, torch.bool, torch.complex64)],
    ("list", [2, 0, 1], lambda v: list(v), "not-a-tensor"),
    ("numpy", [2, 0, 1], lambda v: np.asarray(v), "not-a-tensor"),
    ("0-d", 1, lambda v: torch.tensor(v), "shape"),
    ("3-d", [[[2, 0, 1]]], lambda v: torch.tensor(v), "shape"),
    ("per-row", [[2, 0, 1], [1, 1, 0]], lambda v: torch.tensor(v), "good"),
    ("per-row-broadcast", [[2, 0, 1]], lambda v: torch.tensor(v), "good"),
    ("empty", np.zeros(0, np.int64), lambda v: torch.tensor(v), "good"),
    ("empty-per-row", np.zeros((3, 0), np.int64), lambda v: torch.tensor(v), "good"),
    ("non-contiguous", [2, 0, 1], lambda v: torch.tensor([[x, 7] for x in v])[:, 0], "good"),
    ("expanded", [1, 1, 1], lambda v: torch.tensor([1]).expand(3), "good"),
    ("expanded-per-row", [[2, 0, 1], [2, 0, 1]], lambda v: torch.tensor(v[0]).expand(2, 3), "good"),
    ("negative", [-3, 0, 5], lambda v: torch.tensor(v), "negative"),
    ("int32-extremes", [-(2**31), 0, 2**31 - 1], lambda v: torch.tensor(v, dtype=torch.int32), "boundary"),
    ("2**31", [-(2**31), 0, 2**31], lambda v: torch.tensor(v), "boundary"),
    ("2**31+1", [0, 2**31 + 1, 1], lambda v: torch.tensor(v), "huge"),
    ("-2**31-1", [0, -(2**31) - 1, 1], lambda v: torch.tensor(v), "huge"),
    ("2**53", [0, 2**53, 1], lambda v: torch.tensor(v), "huge"),
    ("meta", [2, 0, 1], lambda v: torch.tensor(v, device=META), "meta"),
]


def _position_case(call: PositionsCall, case_id: str, values, make, kind: str) -> None:
    arg, name = call.arg, call.name

    def thunk():
        return call.run(make(values))

    def check(result, atol=call.atol):
        out, extra = result
        close(out, call.ref(np.asarray(values), extra), atol=atol)

    if kind == "non-integer":
        return bad(name, case_id, thunk, TypeError, f"{arg} must hold integers")
    if kind == "not-a-tensor":
        return bad(name, case_id, thunk, TypeError, f"{arg} must be an integer torch.Tensor")
    if kind == "shape" and call.shapes == "seq":
        return bad(name, case_id, thunk, ValueError, f"{arg} must have shape")
    if kind in ("negative", "huge", "boundary"):
        if call.bounds == "table":
            return bad(name, case_id, thunk, ValueError, rf"{arg} must lie in \[0, ")
        if call.bounds == "exact" and kind == "huge":
            return bad(name, case_id, thunk, ValueError, f"{call.bounds_arg or arg} {EXACT}")
        if kind == "boundary":
            return good(name, case_id, thunk, lambda r: check(r, atol=max(call.atol, 1e-5)))
    if kind == "meta":
        if not call.alone:
            return bad(name, case_id, thunk, ValueError, f"{arg}.* on meta|on meta.*{arg}")

        def check_meta(result):
            out, _ = result
            want = call.ref(np.asarray(values), None)
            for o, w in zip(out if isinstance(out, tuple) else (out,), want if isinstance(want, tuple) else (want,),
                            strict=True):
                assert o.is_meta and tuple(o.shape) == np.shape(w)
        return good(name, case_id, thunk, check_meta)
    return good(name, case_id, thunk, check)


for _call in POSITION_CALLS:
    for _case_id, _values, _make, _kind in POSITIONS:
        _position_case(_call, f"{_call.arg}-{_call.label + '-' if _call.label else ''}{_case_id}", _values, _make, _kind)


# positions that do not fit the input: length, batch, device, together with an offset
def _x(b=2, s=3, d=8):
    return torch.zeros(b, s, d)


for _name, _call in [
    ("SinusoidalEncoding", lambda **kw: SinusoidalEncoding(8)(_x(), **kw)),
    ("LearnedPositionalEmbedding", lambda **kw: LearnedPositionalEmbedding(8, 8)(_x(), **kw)),
    ("RotaryEmbedding", lambda **kw: RotaryEmbedding(8)(rand(2, 2, 3, 8), **kw)),
    ("apply_rope_qk", lambda **kw: F.apply_rope_qk(rand(2, 2, 3, 8), None, C8, S8, **kw)),
    ("attention", lambda **kw: posenc.attention(rand(2, 2, 3, 8), rand(2, 2, 3, 8), rand(2, 2, 3, 8), **kw)),
]:
    bad(_name, "positions-too-long", lambda c=_call: c(positions=torch.arange(4)), ValueError, "positions must have shape")
    bad(_name, "positions-wrong-batch", lambda c=_call: c(positions=torch.zeros(3, 3, dtype=torch.long)), ValueError,
        "positions must have shape")
    bad(_name, "positions-on-meta", lambda c=_call: c(positions=torch.arange(3, device=META)), ValueError,
        "positions are on meta")
    if _name != "attention":
        bad(_name, "positions-and-offset", lambda c=_call: c(positions=torch.arange(3), offset=1), ValueError,
            "either positions or offset")
        bad(_name, "offset-float", lambda c=_call: c(offset=1.0), TypeError, "offset must be an int")
        bad(_name, "offset-tensor", lambda c=_call: c(offset=torch.tensor(1)), TypeError, "offset must be an int")
        bad(_name, "offset-bool", lambda c=_call: c(offset=True), TypeError, "offset must be an int")
bad("RotaryEmbedding", "2-d-q-per-row-positions", lambda: RotaryEmbedding(8)(rand(3, 8), positions=torch.zeros(1, 3, dtype=torch.long)),
    ValueError, r"positions must have shape \(S,\)")
bad("apply_rope_qk", "seq_dim-0-per-row-positions",
    lambda: F.apply_rope_qk(rand(3, 2, 8), None, C8, S8, positions=torch.zeros(3, 3, dtype=torch.long), seq_dim=0),
    ValueError, r"positions must have shape \(S,\)")
bad("relative_distances", "batch-mismatch", lambda: F.relative_distances(torch.zeros(2, 3, dtype=torch.long),
                                                                         torch.zeros(3, 4, dtype=torch.long)),
    ValueError, "key_positions .* different batch sizes")
bad("AlibiBias", "batch-mismatch", lambda: AlibiBias(2)(torch.zeros(2, 3, dtype=torch.long),
                                                      torch.zeros(3, 4, dtype=torch.long)),
    ValueError, "key_positions .* different batch sizes")
bad("RelativePositionBias", "batch-mismatch", lambda: RelativePositionBias(2)(torch.zeros(2, 3, dtype=torch.long),
                                                                              torch.zeros(3, 4, dtype=torch.long)),
    ValueError, "key_positions .* different batch sizes")


# offsets: negative, past the tables, past 2**31
def _off(name, case_id, thunk, want=None, exc=None, match=None, atol=1e-6):
    if exc is not None:
        bad(name, case_id, thunk, exc, match)
    else:
        good(name, case_id, thunk, lambda out: close(out, want(), atol=atol))


_off("SinusoidalEncoding", "offset-negative", lambda: SinusoidalEncoding(5, max_seq_len=4)(torch.zeros(3, 5), offset=-2),
     want=lambda: ref_sinusoidal(np.arange(-2, 1), 5))
_off("SinusoidalEncoding", "offset-past-table", lambda: SinusoidalEncoding(5, max_seq_len=4)(torch.zeros(3, 5), offset=3),
     want=lambda: ref_sinusoidal(np.arange(3, 6), 5))
_off("SinusoidalEncoding", "offset-2**31+1", lambda: SinusoidalEncoding(5)(torch.zeros(3, 5), offset=2**31 + 1),
     exc=ValueError, match=f"positions {EXACT}")
_off("SinusoidalEncoding", "offset-2**53", lambda: SinusoidalEncoding(5)(torch.zeros(3, 5), offset=2**53),
     exc=ValueError, match=f"positions {EXACT}")
_off("LearnedPositionalEmbedding", "offset-negative", lambda: LearnedPositionalEmbedding(8, 5)(torch.zeros(3, 5), offset=-1),
     exc=ValueError, match=r"positions -1\.\.1 exceed the learned table: max_seq_len=8; build the module with max_seq_len >= 2")
_off("LearnedPositionalEmbedding", "offset-past-table",
     lambda: LearnedPositionalEmbedding(8, 5)(torch.zeros(3, 5), offset=2**53),
     exc=ValueError, match="exceed the learned table: max_seq_len=8")
_off("RotaryEmbedding", "offset-negative", lambda: RotaryEmbedding(8, max_seq_len=4)(rand(1, 1, 3, 8), offset=-2)[0],
     want=lambda: ref_rope(rand(1, 1, 3, 8), np.arange(-2, 1)), atol=1e-5)
_off("RotaryEmbedding", "offset-past-table", lambda: RotaryEmbedding(8, max_seq_len=4)(rand(1, 1, 3, 8), offset=3)[0],
     want=lambda: ref_rope(rand(1, 1, 3, 8), np.arange(3, 6)), atol=1e-5)
_off("RotaryEmbedding", "offset-2**31+1", lambda: RotaryEmbedding(8)(rand(1, 1, 3, 8), offset=2**31 + 1),
     exc=ValueError, match=f"positions {EXACT}")
_off("RotaryEmbedding", "offset-2**53", lambda: RotaryEmbedding(8)(rand(1, 1, 3, 8), offset=2**53),
     exc=ValueError, match=f"positions {EXACT}")
_off("apply_rope_qk", "offset-negative", lambda: F.apply_rope_qk(rand(1, 1, 3, 8), None, C8, S8, offset=-1),
     exc=ValueError, match=r"positions -1..1 are outside the cos/sin table of 8 rows")
_off("apply_rope_qk", "offset-2**53", lambda: F.apply_rope_qk(rand(1, 1, 3, 8), None, C8, S8, offset=2**53),
     exc=ValueError, match=r"positions 9007199254740992..\d+ are outside the cos/sin table")
_off("apply_rope_qk", "offset-last-rows", lambda: F.apply_rope_qk(rand(1, 1, 3, 8), None, C8, S8, offset=5)[0],
     want=lambda: ref_rope(rand(1, 1, 3, 8), np.arange(5, 8)), atol=1e-5)


# ---- positions_from_mask, positions_from_segment_ids ----------------------------------------------


MASK = [[0, 1, 1], [1, 1, 0]]
for _dt in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.uint32, torch.int64):
    good("positions_from_mask", f"mask-{str(_dt).split('.')[-1]}", lambda dt=_dt: F.positions_from_mask(torch.tensor(MASK).to(dt)),
         lambda out: close(out, ref_from_mask(MASK)))
    good("positions_from_segment_ids", f"ids-{str(_dt).split('.')[-1]}",
         lambda dt=_dt: F.positions_from_segment_ids(torch.tensor(MASK).to(dt)), lambda out: close(out, ref_from_segments(MASK)))
for _dt in (torch.float32, torch.float64, torch.complex64):
    bad("positions_from_mask", f"mask-{str(_dt).split('.')[-1]}", lambda dt=_dt: F.positions_from_mask(torch.tensor(MASK).to(dt)),
        TypeError, "mask must be bool or integer")
    bad("positions_from_segment_ids", f"ids-{str(_dt).split('.')[-1]}",
        lambda dt=_dt: F.positions_from_segment_ids(torch.tensor(MASK).to(dt)), TypeError, "segment_ids must hold integers")
bad("positions_from_mask", "mask-list", lambda: F.positions_from_mask(MASK), TypeError, "mask must be a torch.Tensor")
bad("positions_from_segment_ids", "ids-list", lambda: F.positions_from_segment_ids(MASK), TypeError,
    "segment_ids must be a torch.Tensor")
for _id, _t in [("0-d", lambda: torch.tensor(1)), ("1-d", lambda: torch.tensor([1, 1])), ("3-d", lambda: torch.ones(1, 2, 3))]:
    bad("positions_from_mask", f"mask-{_id}", lambda t=_t: F.positions_from_mask(t()), ValueError, "mask must have shape")
    if _id != "1-d":
        bad("positions_from_segment_ids", f"ids-{_id}", lambda t=_t: F.positions_from_segment_ids(t().long()), ValueError,
            "segment_ids must have shape")
for _id, _make, _values in [
    ("empty-seq", lambda: torch.zeros(2, 0, dtype=torch.long), np.zeros((2, 0), np.int64)),
    ("empty-batch", lambda: torch.zeros(0, 3, dtype=torch.long), np.zeros((0, 3), np.int64)),
    ("non-contiguous", lambda: torch.tensor(MASK).t().contiguous().t(), np.asarray(MASK)),
    ("expanded", lambda: torch.tensor([[1, 0, 1]]).expand(2, 3), np.asarray([[1, 0, 1]] * 2)),
]:
    good("positions_from_mask", f"mask-{_id}", lambda m=_make: F.positions_from_mask(m()),
         lambda out, v=_values: close(out, ref_from_mask(v)))
    good("positions_from_segment_ids", f"ids-{_id}", lambda m=_make: F.positions_from_segment_ids(m()),
         lambda out, v=_values: close(out, ref_from_segments(v)))
good("positions_from_segment_ids", "ids-1-d", lambda: F.positions_from_segment_ids(torch.tensor([4, 4, 2, 2, 2])),
     lambda out: close(out, ref_from_segments([4, 4, 2, 2, 2])))
good("positions_from_segment_ids", "ids-empty-1-d", lambda: F.positions_from_segment_ids(torch.zeros(0, dtype=torch.long)),
     lambda out: close(out, np.zeros(0, np.int64)))
good("positions_from_mask", "mask-meta", lambda: F.positions_from_mask(torch.ones(2, 3, dtype=torch.bool, device=META)),
     lambda out: (out.is_meta and out.shape == (2, 3)) or pytest.fail("not a (2, 3) meta tensor"))
good("positions_from_segment_ids", "ids-meta", lambda: F.positions_from_segment_ids(torch.ones(2, 3, dtype=torch.long, device=META)),
     lambda out: (out.is_meta and out.shape == (2, 3)) or pytest.fail("not a (2, 3) meta tensor"))


# positions_from_cu_seqlens: cumulative lengths of packed sequences; the reference numbers each one from its offset

good("positions_from_cu_seqlens", "cu-int32-empty-sequence", lambda: F.positions_from_cu_seqlens(
    torch.tensor([0, 2, 2, 5], dtype=torch.int32)), lambda out: close(out, ref_from_cu([0, 2, 2, 5])))
good("positions_from_cu_seqlens", "cu-offsets-int16", lambda: F.positions_from_cu_seqlens(
    torch.tensor([0, 1, 3]), offset=torch.tensor([9, 4], dtype=torch.int16)),
    lambda out: close(out, ref_from_cu([0, 1, 3], [9, 4])))
good("positions_from_cu_seqlens", "cu-no-tokens", lambda: F.positions_from_cu_seqlens(torch.tensor([0, 0])),
     lambda out: close(out, np.zeros(0, np.int64)))
good("positions_from_cu_seqlens", "cu-meta", lambda: F.positions_from_cu_seqlens(
    torch.tensor([0, 2, 5], device=META), total=5),
    lambda out: (out.is_meta and out.shape == (5,)) or pytest.fail("not a (5,) meta tensor"))
for _id, _cu, _kw, _exc, _match in [
    ("cu-list", lambda: [0, 2], {}, TypeError, "cu_seqlens must be an integer torch.Tensor"),
    ("cu-float", lambda: torch.tensor([0.0, 2.0]), {}, TypeError, "cu_seqlens must hold int32 or int64"),
    ("cu-uint8", lambda: torch.tensor([0, 2], dtype=torch.uint8), {}, TypeError, "cu_seqlens must hold int32 or int64"),
    ("cu-one-entry", lambda: torch.tensor([0]), {}, ValueError, r"cu_seqlens must have shape \(N \+ 1,\)"),
    ("cu-2-d", lambda: torch.tensor([[0, 2]]), {}, ValueError, r"cu_seqlens must have shape \(N \+ 1,\)"),
    ("cu-not-from-0", lambda: torch.tensor([1, 2]), {}, ValueError, "cu_seqlens must start at 0"),
    ("cu-decreasing", lambda: torch.tensor([0, 3, 2]), {}, ValueError, "never decrease"),
    ("cu-total", lambda: torch.tensor([0, 3]), {"total": 4}, ValueError, "end at the number of tokens T=4"),
    ("cu-total-negative", lambda: torch.tensor([0, 3]), {"total": -1}, ValueError, "total"),
    ("cu-offset-float", lambda: torch.tensor([0, 3]), {"offset": 1.5}, TypeError, "offset"),
    ("cu-offset-shape", lambda: torch.tensor([0, 3]), {"offset": torch.tensor([1, 2])}, ValueError,
     r"offset must be an int or one first position per sequence, shape \(1,\)"),
    ("cu-meta-no-total", lambda: torch.tensor([0, 3], device=META), {}, ValueError, "total"),
]:
    bad("positions_from_cu_seqlens", _id, lambda c=_cu, kw=_kw: F.positions_from_cu_seqlens(c(), **kw), _exc, _match)


for _id, _offset, _want in [
    ("int", 5, 5), ("negative", -5, -5), ("tensor", lambda: torch.tensor([5, 7]), [5, 7]),
    ("tensor-uint8", lambda: torch.tensor([5, 7], dtype=torch.uint8), [5, 7]), ("tensor-0-d", lambda: torch.tensor(4), 4),
    ("int64-top", 2**63 - 3, 2**63 - 3), ("int64-bottom", -(2**63), -(2**63)),
]:
    good("positions_from_mask", f"offset-{_id}",
         lambda o=_offset: F.positions_from_mask(torch.tensor(MASK).bool(), offset=o() if callable(o) else o),
         lambda out, w=_want: close(out, ref_from_mask(MASK, w)))
for _id, _offset, _exc, _match in [
    ("float", 1.0, TypeError, "offset must be an int"), ("nan", NAN, TypeError, "offset must be an int"),
    ("str", "1", TypeError, "offset must be an int"),
    ("tensor-float", lambda: torch.tensor([1.0, 2.0]), TypeError, "offset must be an int or an integer tensor"),
    ("tensor-bool", lambda: torch.tensor([True, False]), TypeError, "offset must be an int or an integer tensor"),
    ("tensor-complex", lambda: torch.tensor([1j, 2j]), TypeError, "offset must be an int or an integer tensor"),
    ("tensor-meta", lambda: torch.tensor([1, 2], device=META), ValueError, "offset is on meta"),
    ("tensor-2-d", lambda: torch.ones(2, 1, dtype=torch.long), ValueError, r"offset must be .* shape \(2,\)"),
    ("tensor-3", lambda: torch.ones(3, dtype=torch.long), ValueError, r"offset must be .* shape \(2,\)"),
    ("2**63-2", 2**63 - 2, ValueError, "offset=.* outside int64"),
    ("2**64", 2**64, ValueError, "offset=.* outside int64"),
    ("-2**63-1", -(2**63) - 1, ValueError, "offset=.* outside int64"),
]:
    bad("positions_from_mask", f"offset-{_id}",
        lambda o=_offset: F.positions_from_mask(torch.tensor(MASK).bool(), offset=o() if callable(o) else o), _exc, _match)


@pytest.mark.parametrize("name, thunk, error, check", CASES.params)
def test_bad_input(name, thunk, error, check):
    run_case(thunk, error, check)
