"""Bad inputs, walked through every public callable of ``posenc``, ``posenc.functional`` and ``posenc.nn``.

Every case either matches an independent float64 reference written here from the papers' formulas
(valid but unusual inputs: narrow or unsigned integer positions, empty sequences, non-contiguous or
expanded tensors, negative positions, NaN flowing through), or raises ``ValueError``/``TypeError``
whose message names the offending argument.  Any other exception (``IndexError``, ``RuntimeError``,
``ZeroDivisionError``, ``NotImplementedError``, an ``AssertionError`` inside posenc, ...) and any
warning raised by a call fail the case: see :func:`guarded`.

:func:`test_every_public_callable_is_walked` enumerates the modules' ``__all__``, so a new public
function without cases fails.  The Keras layers and the CLI have hardening tests of their own
(tests/keras/test_keras_hardening.py, tests/test_cli_errors.py); they get a light smoke walk here.

References:
    sinusoidal  PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d))   (Vaswani et al. 2017)
    RoPE        pairs (i, i + d/2) ("half") or (2i, 2i+1) ("interleaved"):
                (x1 cos - x2 sin, x2 cos + x1 sin), angle p * theta_i, theta_i = base^(-2i/d)   (Su et al. 2021)
    ALiBi       bias = -m_h * (q_pos - k_pos), m_h = 2^(-8h/n)   (Press et al. 2022)
    T5 buckets  Raffel et al. 2020 / Mesh TensorFlow's _relative_position_bucket
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch

import posenc
import posenc.functional as F
import posenc.nn
from posenc import (
    AlibiBias,
    DynamicNTKScaling,
    LearnedPositionalEmbedding,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    ProportionalScaling,
    RelativePositionBias,
    RopeScaling,
    RotaryEmbedding,
    SinusoidalEncoding,
    YarnScaling,
)
from posenc.core.hf_config import mrope_from_hf, mrope_vision_from_hf
from posenc.functional.axial import apply_axial_rope, axial_cos_sin, grid_positions
from posenc.functional.mrope import mrope_cos_sin, mrope_positions
from posenc.functional.resize import resize_position_embedding
from posenc.functional.sincos_nd import sincos_table_nd
from posenc.nn.axial_rotary import AxialRotaryEmbedding
from posenc.nn.mrope import MultimodalRotaryEmbedding
from posenc.nn.sincos_nd import SinusoidalEncodingND
from tests.reference.bias_oracle import t5_bucket

NAN, INF = float("nan"), float("inf")
META = "meta"
BASE = 10000.0
EXACT = r"must lie within \[-2\*\*31, 2\*\*31\]"


# ---- the generic guard ----------------------------------------------------------------------------


def guarded(thunk: Callable[[], object]) -> object:
    """Run ``thunk``; only ``ValueError``/``TypeError`` may escape, and no warning may be raised."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return thunk()
    except (ValueError, TypeError):
        raise
    except Exception as err:  # noqa: BLE001 - every other exception is the failure this suite looks for
        pytest.fail(f"{type(err).__name__} escaped (only ValueError/TypeError may): {err}", pytrace=False)


CASES: list = []


def bad(name: str, case_id: str, thunk: Callable[[], object], exc: type[Exception], match: str) -> None:
    """A case that must raise ``exc`` with a message matching ``match`` (which names the argument)."""
    CASES.append(pytest.param(name, thunk, (exc, match), None, id=f"{name}-{case_id}"))


def good(name: str, case_id: str, thunk: Callable[[], object], check: Callable[[object], None]) -> None:
    """A valid unusual input: ``check`` compares the result with a float64 reference."""
    CASES.append(pytest.param(name, thunk, None, check, id=f"{name}-{case_id}"))


# ---- float64 references from the formulas -----------------------------------------------------------


def ref_sinusoidal(p, dim: int, base: float = BASE) -> np.ndarray:
    """``(..., dim)``: PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d))."""
    j = np.arange(dim)
    angle = np.asarray(p, dtype=np.float64)[..., None] / base ** (2 * (j // 2) / dim)
    return np.where(j % 2 == 0, np.sin(angle), np.cos(angle))


def ref_theta(d: int, base: float = BASE) -> np.ndarray:
    """theta_i = base^(-2i/d), i = 0 .. d/2 - 1."""
    return base ** (-2 * np.arange(d // 2) / d)


def ref_cos_sin(p, d: int, base: float = BASE) -> tuple[np.ndarray, np.ndarray]:
    angle = np.asarray(p, dtype=np.float64)[..., None] * ref_theta(d, base)
    return np.cos(angle), np.sin(angle)


def ref_cos_sin_theta(p, theta) -> tuple[np.ndarray, np.ndarray]:
    angle = np.asarray(p, dtype=np.float64)[..., None] * np.asarray(theta, dtype=np.float64)
    return np.cos(angle), np.sin(angle)


@np.errstate(invalid="ignore", over="ignore")
def ref_rope(x: torch.Tensor, p, *, d: int | None = None, layout: str = "half", base: float = BASE,
             theta: np.ndarray | None = None) -> np.ndarray:
    """Rotate the first ``d`` features of ``x (..., S, D)`` at positions ``p (S,)`` or ``(B, S)``."""
    x = x.detach().double().cpu().numpy().copy()
    d = x.shape[-1] if d is None else d
    h = d // 2
    theta = ref_theta(d, base) if theta is None else theta
    p = np.asarray(p, dtype=np.float64)
    angle = p[..., None] * theta                                          # (S, h) or (B, S, h)
    if p.ndim == 2:
        angle = angle.reshape(angle.shape[0], *([1] * (x.ndim - 3)), *angle.shape[1:])
    c, s = np.cos(angle), np.sin(angle)
    first, second = (slice(0, h), slice(h, d)) if layout == "half" else (slice(0, d, 2), slice(1, d, 2))
    a, b = x[..., first].copy(), x[..., second].copy()
    x[..., first], x[..., second] = a * c - b * s, b * c + a * s
    return x


def ref_slopes(n: int) -> np.ndarray:
    """ALiBi slopes: 2^(-8h/n) for a power of two n; else those of the largest power of two c < n
    and every other slope of 2c heads."""
    def pow2(m):
        return [2.0 ** (-8.0 * h / m) for h in range(1, m + 1)]
    if n & (n - 1) == 0:
        return np.array(pow2(n))
    c = 2 ** int(math.floor(math.log2(n)))
    return np.array(pow2(c) + pow2(2 * c)[0::2][: n - c])


@np.errstate(invalid="ignore", over="ignore")
def ref_alibi(qp, kp, slopes, symmetric: bool = False) -> np.ndarray:
    """-m_h * (q - k): ``(H, S, S_k)``, or ``(B, H, S, S_k)`` when a position array is per row."""
    qp, kp = np.asarray(qp, dtype=np.int64), np.asarray(kp, dtype=np.int64)
    dist = qp[..., :, None] - kp[..., None, :]                            # exact integers
    dist = np.abs(dist) if symmetric else dist
    m = np.asarray(slopes, dtype=np.float64)
    if dist.ndim == 3:
        return -m[None, :, None, None] * dist[:, None].astype(np.float64)
    return -m[:, None, None] * dist[None].astype(np.float64)


def ref_bucket(rel, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """T5's bucket of each ``key - query`` distance (Mesh TensorFlow's formula, in float64)."""
    def one(r: int) -> int:
        return t5_bucket(r, bidirectional, num_buckets, max_distance)
    rel = np.asarray(rel, dtype=object)
    return np.vectorize(lambda r: one(int(r)), otypes=[np.int64])(rel) if rel.size else np.zeros(rel.shape, np.int64)


@np.errstate(invalid="ignore", over="ignore")
def ref_attention(q, k, v, bias=None) -> np.ndarray:
    """softmax(q k^T / sqrt(D) + bias) v in float64 (q, k, v as float64 arrays; GQA repeats k, v)."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    logits = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + bias
    if not logits.size:
        return np.zeros((*logits.shape[:-1], v.shape[-1]))
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def arr(t) -> np.ndarray:
    return t.detach().double().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def close(got, want, atol: float = 1e-6, rtol: float = 1e-6) -> None:
    """``got`` (tensor or tuple of tensors) equals ``want`` (arrays), NaN where the reference has NaN."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            close(g, w, atol, rtol)
        return
    assert isinstance(got, torch.Tensor), type(got)
    want = np.asarray(want)
    assert tuple(got.shape) == want.shape, (tuple(got.shape), want.shape)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got.cpu().numpy(), want)
    else:
        np.testing.assert_allclose(arr(got), want, atol=atol, rtol=rtol, equal_nan=True)


def rand(*shape, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Deterministic N(0, 1) tensor (its own generator: a reference can rebuild it)."""
    g = torch.Generator().manual_seed(seed * 1009 + sum(shape) * 31 + len(shape))
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def np_tables(rows: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``(rows, d/2)`` cos/sin tables from the formula (independent of posenc)."""
    c, s = ref_cos_sin(np.arange(rows), d)
    return torch.tensor(c, dtype=torch.float32), torch.tensor(s, dtype=torch.float32)


C8, S8 = np_tables(8, 8)                                                   # 8 rows, rotary dim 8


# ---- 1. positions: every callable that takes positions, through every kind of positions -------------


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
SLOPES = torch.tensor([0.5, 0.25])

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
     exc=ValueError, match="positions -1..1 exceed the learned table: num_positions=8")
_off("LearnedPositionalEmbedding", "offset-past-table",
     lambda: LearnedPositionalEmbedding(8, 5)(torch.zeros(3, 5), offset=2**53),
     exc=ValueError, match="exceed the learned table: num_positions=8")
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


# ---- 2. positions_from_mask, positions_from_segment_ids ----------------------------------------------


def ref_from_mask(mask, offset=0) -> np.ndarray:
    mask = np.asarray(mask) != 0
    out = np.zeros(mask.shape, np.int64)
    offs = np.broadcast_to(np.asarray(offset, np.int64), (mask.shape[0],))
    for b in range(mask.shape[0]):
        n = 0
        for s in range(mask.shape[1]):
            if mask[b, s]:
                out[b, s] = offs[b] + n
                n += 1
    return out


def ref_from_segments(ids) -> np.ndarray:
    ids = np.asarray(ids)
    rows = ids if ids.ndim == 2 else ids[None]
    out = np.zeros(rows.shape, np.int64)
    for b in range(rows.shape[0]):
        for s in range(1, rows.shape[1]):
            out[b, s] = out[b, s - 1] + 1 if rows[b, s] == rows[b, s - 1] else 0
    return out if ids.ndim == 2 else out[0]


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
# rope_and_cache: rotate q and k and write k and v into a preallocated cache (contiguous or paged)
def _cache_call(kind: str, **kw):
    q, k, v = rand(2, 2, 3, 8, seed=11), rand(2, 1, 3, 8, seed=12), rand(2, 1, 3, 8, seed=13)   # (B, H, S, D)
    kc, vc = torch.zeros(2, 1, 6, 8), torch.zeros(2, 1, 6, 8)                                  # (B, Hk, S_max, D)
    args = {"cache_seqlens": torch.tensor([0, 2])}
    if kind == "paged":
        q, k, v = q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1)            # (T=3, H, D)
        kc, vc = torch.zeros(3, 2, 1, 8), torch.zeros(3, 2, 1, 8)                              # (blocks, size, Hk, D)
        args = {"slots": torch.tensor([4, -1, 1]), "positions": torch.tensor([5, 0, 7])}
    args.update(kw)
    return F.rope_and_cache(q, k, v, kc, vc, C8, S8, **args), (q, k, v, kc, vc)


def _check_contiguous_cache(out):
    q_rot, (q, k, v, kc, vc) = out
    pos = np.array([[0, 1, 2], [2, 3, 4]])
    close(q_rot, np.stack([ref_rope(q[b], pos[b]) for b in range(2)]))
    for b, start in ((0, 0), (1, 2)):
        close(kc[b, :, start:start + 3], ref_rope(k[b], pos[b]))
        close(vc[b, :, start:start + 3], v[b].numpy())
    close(kc[0, :, 3:], np.zeros((1, 3, 8)))


def _check_paged_cache(out):
    q_rot, (q, k, v, kc, vc) = out
    pos = np.array([5, 0, 7])
    close(q_rot, ref_rope(q.transpose(0, 1), pos).transpose(1, 0, 2))
    close(kc[2, 0], ref_rope(k[0:1].transpose(0, 1), pos[0:1]).transpose(1, 0, 2)[0])
    close(vc[0, 1], v[2].numpy())
    assert int(vc.ne(0).any(-1).sum()) == 2                                  # the slot -1 token is not written


good("rope_and_cache", "contiguous-gqa", lambda: _cache_call("contiguous"), _check_contiguous_cache)
good("rope_and_cache", "paged-slot-minus-1", lambda: _cache_call("paged"), _check_paged_cache)
for _id, _kind, _kw, _exc, _match in [
    ("both-kinds", "contiguous", {"slots": torch.tensor([0, 1, 2])}, ValueError, "exactly one of cache_seqlens and slots"),
    ("seqlens-float", "contiguous", {"cache_seqlens": torch.tensor([0.0, 2.0])}, TypeError, "cache_seqlens must be an integer"),
    ("seqlens-shape", "contiguous", {"cache_seqlens": torch.tensor([0])}, ValueError, r"cache_seqlens must have shape \(2,\)"),
    ("cache-overflow", "contiguous", {"cache_seqlens": torch.tensor([0, 4])}, ValueError, "S_max=6"),
    ("slot-past-cache", "paged", {"slots": torch.tensor([6, 0, 1])}, ValueError, "slots must be < num_blocks"),
    ("paged-no-positions", "paged", {"positions": None}, ValueError, "positions .* are required with slots"),
    ("position-past-table", "paged", {"positions": torch.tensor([8, 0, 0])}, ValueError, r"must lie in \[0, 8\)"),
    ("assume-valid-int", "paged", {"assume_valid": 1}, TypeError, "assume_valid must be a bool"),
    ("layout", "paged", {"layout": "neox"}, ValueError, "layout must be one of"),
]:
    bad("rope_and_cache", _id, lambda kind=_kind, kw=_kw: _cache_call(kind, **kw), _exc, _match)


# rms_norm_rope_qk: RMSNorm of each head (weight (D,)) or of the whole token (weight (H*D,)), then RoPE
def ref_norm_rope(x: torch.Tensor, w, p, *, token: bool = False, offset: float = 0.0) -> np.ndarray:
    """x (B, H, S, D) -> RoPE(x * rsqrt(mean(x^2) + 1e-6) * (offset + w)) at positions p, in float64."""
    xd = x.detach().double()
    axes = (1, 3) if token else (3,)
    n = xd * torch.rsqrt(xd.pow(2).mean(axes, keepdim=True) + 1e-6)
    wd = torch.as_tensor(w, dtype=torch.float64)
    scale = (offset + wd).reshape(x.shape[1], 1, x.shape[3]) if token else offset + wd
    return ref_rope(n * scale, p)


def _norm_call(**kw):
    q, k = rand(2, 2, 3, 8, seed=21), rand(2, 1, 3, 8, seed=22)                            # (B, H, S, D)
    args = {"q": q, "k": k, "q_weight": torch.linspace(0.5, 1.5, 8), "k_weight": torch.linspace(1.5, 0.5, 8),
            "cos": C8, "sin": S8}
    args.update(kw)
    return F.rms_norm_rope_qk(**args), args


good("rms_norm_rope_qk", "per-head-gqa-offset", lambda: _norm_call(offset=4),
     lambda out: (close(out[0][0], ref_norm_rope(out[1]["q"], out[1]["q_weight"], [4, 5, 6])),
                  close(out[0][1], ref_norm_rope(out[1]["k"], out[1]["k_weight"], [4, 5, 6]))))
good("rms_norm_rope_qk", "token-wide-weight-gemma-offset",
     lambda: _norm_call(q_weight=torch.linspace(-0.5, 0.5, 16), weight_offset=1.0, k=None, k_weight=None),
     lambda out: close(out[0][0], ref_norm_rope(out[1]["q"], torch.linspace(-0.5, 0.5, 16), [0, 1, 2], token=True,
                                                offset=1.0)))
for _id, _kw, _exc, _match in [
    ("weight-shape", {"q_weight": torch.ones(7)}, ValueError, r"q_weight must have shape \(8,\) .* or \(16,\)"),
    ("weight-2-d", {"k_weight": torch.ones(1, 8)}, ValueError, r"k_weight must have shape \(8,\)"),
    ("weight-int", {"q_weight": torch.ones(8, dtype=torch.long)}, TypeError, "q_weight must be a floating tensor"),
    ("k-without-weight", {"k_weight": None}, ValueError, "k is given but k_weight is None"),
    ("weight-without-k", {"k": None}, ValueError, "k_weight is given but k is None"),
    ("eps-zero", {"eps": 0.0}, ValueError, "eps"),
    ("eps-nan", {"eps": NAN}, ValueError, "eps"),
    ("q-3-d", {"q": rand(2, 3, 8), "k": None, "k_weight": None}, ValueError, "q must be 4-D"),
    ("offset-past-table", {"offset": 6}, ValueError, "outside the cos/sin table"),
    ("layout", {"layout": "neox"}, ValueError, "layout must be one of"),
]:
    bad("rms_norm_rope_qk", _id, lambda kw=_kw: _norm_call(**kw), _exc, _match)


# positions_from_cu_seqlens: cumulative lengths of packed sequences; the reference numbers each one from its offset
def ref_from_cu(cu, offsets=None) -> np.ndarray:
    out = []
    for i, (a, z) in enumerate(zip(cu, cu[1:], strict=False)):
        out += [(0 if offsets is None else offsets[i]) + j for j in range(z - a)]
    return np.asarray(out, np.int64)


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


# ---- 3. sinusoidal_encoding, sinusoidal_table, SinusoidalEncoding ------------------------------------

P3 = torch.tensor([0, 5, 2])
for _id, _kw, _exc, _match in [
    ("dim-0", {"dim": 0}, ValueError, "dim must be >= 1"), ("dim-negative", {"dim": -2}, ValueError, "dim must be >= 1"),
    ("dim-float", {"dim": 4.0}, TypeError, "dim must be an int"), ("dim-bool", {"dim": True}, TypeError, "dim must be an int"),
    ("base-nan", {"base": NAN}, ValueError, "base must be finite"), ("base-inf", {"base": INF}, ValueError, "base must be finite"),
    ("base-0", {"base": 0.0}, ValueError, "base must be > 0"), ("base-negative", {"base": -10.0}, ValueError, "base must be > 0"),
    ("base-str", {"base": "1e4"}, TypeError, "base must be a real number"),
    ("base-tensor", {"base": torch.tensor([1e4, 1e3])}, TypeError, "base must be a real number"),
    ("layout", {"layout": "paper"}, ValueError, "layout must be one of"),
    ("dtype-int", {"dtype": torch.int64}, TypeError, "dtype must be one of"),
    ("dtype-complex", {"dtype": torch.complex64}, TypeError, "dtype must be one of"),
    ("dtype-str", {"dtype": "float32"}, TypeError, "dtype must be one of"),
]:
    _args = {"dim": 4, **_kw}
    bad("sinusoidal_encoding", _id, lambda a=_args: F.sinusoidal_encoding(P3, **a), _exc, _match)
    bad("sinusoidal_table", _id, lambda a=_args: F.sinusoidal_table(3, **a), _exc, _match)
for _dim in (1, 3, 5):
    good("sinusoidal_encoding", f"odd-dim-{_dim}", lambda d=_dim: F.sinusoidal_encoding(P3, d),
         lambda out, d=_dim: close(out, ref_sinusoidal(arr(P3), d)))
    good("sinusoidal_table", f"odd-dim-{_dim}", lambda d=_dim: F.sinusoidal_table(4, d, offset=-2),
         lambda out, d=_dim: close(out, ref_sinusoidal(np.arange(-2, 2), d)))
good("sinusoidal_encoding", "base-int", lambda: F.sinusoidal_encoding(P3, 6, base=100),
     lambda out: close(out, ref_sinusoidal(arr(P3), 6, base=100)))
good("sinusoidal_encoding", "float64", lambda: F.sinusoidal_encoding(P3, 6, dtype=torch.float64),
     lambda out: close(out, ref_sinusoidal(arr(P3), 6), atol=1e-12) or (out.dtype == torch.float64 or pytest.fail("dtype")))
good("sinusoidal_encoding", "bfloat16", lambda: F.sinusoidal_encoding(P3, 6, dtype=torch.bfloat16),
     lambda out: close(out, ref_sinusoidal(arr(P3), 6), atol=4e-3))
bad("sinusoidal_table", "length-negative", lambda: F.sinusoidal_table(-1, 4), ValueError, "length must be >= 0")
bad("sinusoidal_table", "length-float", lambda: F.sinusoidal_table(3.0, 4), TypeError, "length must be an int")
bad("sinusoidal_table", "offset-float", lambda: F.sinusoidal_table(3, 4, offset=0.5), TypeError, "offset must be an int")
bad("sinusoidal_table", "offset-2**31", lambda: F.sinusoidal_table(3, 4, offset=2**31 - 1), ValueError, f"positions {EXACT}")
bad("sinusoidal_table", "offset-2**53", lambda: F.sinusoidal_table(3, 4, offset=2**53), ValueError, f"positions {EXACT}")
good("sinusoidal_table", "length-0", lambda: F.sinusoidal_table(0, 4), lambda out: close(out, np.zeros((0, 4))))
good("sinusoidal_table", "length-0-offset-2**53", lambda: F.sinusoidal_table(0, 4, offset=2**53),
     lambda out: close(out, np.zeros((0, 4))))
good("sinusoidal_table", "last-exact-rows", lambda: F.sinusoidal_table(2, 4, offset=2**31 - 1),
     lambda out: close(out, ref_sinusoidal([2**31 - 1, 2**31], 4), atol=1e-5))
good("sinusoidal_table", "meta", lambda: F.sinusoidal_table(3, 4, device=META),
     lambda out: (out.is_meta and out.shape == (3, 4)) or pytest.fail("not a (3, 4) meta tensor"))

# SinusoidalEncoding: construction
for _id, _kw, _exc, _match in [
    ("dim-0", {"dim": 0}, ValueError, "dim must be >= 1"), ("dim-float", {"dim": 8.0}, TypeError, "dim must be an int"),
    ("max_seq_len-0", {"max_seq_len": 0}, ValueError, "max_seq_len must be >= 1"),
    ("max_seq_len-float", {"max_seq_len": 8.5}, TypeError, "max_seq_len must be an int"),
    ("base-nan", {"base": NAN}, ValueError, "base must be finite"), ("base-inf", {"base": INF}, ValueError, "base must be finite"),
    ("base-0", {"base": 0}, ValueError, "base must be > 0"), ("layout", {"layout": "half"}, ValueError, "layout must be one of"),
    ("scale-nan", {"scale": NAN}, ValueError, "scale must be finite"), ("scale-inf", {"scale": -INF}, ValueError, "scale must be finite"),
    ("scale-str", {"scale": "2"}, TypeError, "scale must be a real number"),
    ("dropout-nan", {"dropout": NAN}, ValueError, "dropout must be finite"),
    ("dropout-1", {"dropout": 1.0}, ValueError, r"dropout must be in \[0, 1\)"),
    ("dropout-negative", {"dropout": -0.1}, ValueError, "dropout must be >= 0"),
    ("dtype-float16", {"dtype": torch.float16}, TypeError, "dtype is the table's dtype"),
    ("dtype-int", {"dtype": torch.int64}, TypeError, "dtype is the table's dtype"),
]:
    bad("SinusoidalEncoding", f"init-{_id}", lambda kw=_kw: SinusoidalEncoding(**{"dim": 8, **kw}), _exc, _match)

# SinusoidalEncoding.forward: x
for _id, _make, _exc, _match in [
    ("x-int", lambda: torch.zeros(1, 3, 8, dtype=torch.long), TypeError, "x must be a floating tensor"),
    ("x-bool", lambda: torch.zeros(1, 3, 8, dtype=torch.bool), TypeError, "x must be a floating tensor"),
    ("x-complex", lambda: torch.zeros(1, 3, 8, dtype=torch.complex64), TypeError, "x must be a floating tensor"),
    ("x-uint8", lambda: torch.zeros(1, 3, 8, dtype=torch.uint8), TypeError, "x must be a floating tensor"),
    ("x-list", lambda: [[0.0] * 8], TypeError, "x must be a torch.Tensor"),
    ("x-0-d", lambda: torch.tensor(1.0), ValueError, r"x must have shape \(B, S, 8\)"),
    ("x-1-d", lambda: torch.zeros(8), ValueError, r"x must have shape \(B, S, 8\)"),
    ("x-4-d", lambda: torch.zeros(1, 1, 3, 8), ValueError, r"x must have shape \(B, S, 8\)"),
    ("x-wrong-dim", lambda: torch.zeros(1, 3, 6), ValueError, "the last dimension must equal dim=8"),
    ("x-meta", lambda: torch.zeros(1, 3, 8, device=META), ValueError, "x is on meta but the tables on cpu"),
]:
    bad("SinusoidalEncoding", _id, lambda m=_make: SinusoidalEncoding(8)(m()), _exc, _match)
    if _id not in ("x-meta",):
        bad("LearnedPositionalEmbedding", _id, lambda m=_make: LearnedPositionalEmbedding(4, 8)(m()), _exc, _match)
bad("LearnedPositionalEmbedding", "x-meta", lambda: LearnedPositionalEmbedding(4, 8)(torch.zeros(1, 3, 8, device=META)),
    ValueError, "x is on meta but the weight on cpu")
bad("SinusoidalEncoding", "module-meta", lambda: SinusoidalEncoding(8, device=META)(torch.zeros(1, 3, 8)), ValueError,
    "x is on cpu but the tables on meta.*reset_buffers")
bad("LearnedPositionalEmbedding", "module-meta", lambda: LearnedPositionalEmbedding(4, 8, device=META)(torch.zeros(1, 3, 8)),
    ValueError, "x is on cpu but the weight on meta")
good("SinusoidalEncoding", "all-meta", lambda: SinusoidalEncoding(8, device=META)(torch.zeros(2, 3, 8, device=META),
                                                                              positions=torch.arange(3, device=META)),
     lambda out: (out.is_meta and out.shape == (2, 3, 8)) or pytest.fail("not a (2, 3, 8) meta tensor"))
good("LearnedPositionalEmbedding", "all-meta",
     lambda: LearnedPositionalEmbedding(4, 8, device=META)(torch.zeros(2, 3, 8, device=META), positions=torch.arange(3, device=META)),
     lambda out: (out.is_meta and out.shape == (2, 3, 8)) or pytest.fail("not a (2, 3, 8) meta tensor"))


def _x_cases(name: str, module: Callable[[], torch.nn.Module], ref_pe: Callable[[np.ndarray], np.ndarray]) -> None:
    """Valid unusual ``x`` for an additive encoding of dim 5: the output must be ``x + PE``."""
    def want(x, positions=None):
        x = arr(x)
        pe = ref_pe(np.arange(x.shape[-2]) if positions is None else positions)
        return x + pe

    for _id, make, atol in [
        ("x-2-d", lambda: rand(3, 5), 1e-6),
        ("x-empty-seq", lambda: torch.zeros(2, 0, 5), 0),
        ("x-empty-batch", lambda: torch.zeros(0, 3, 5), 0),
        ("x-non-contiguous", lambda: rand(5, 3, 2).permute(2, 1, 0), 1e-6),
        ("x-expanded", lambda: rand(1, 3, 5).expand(4, 3, 5), 1e-6),
        ("x-float64", lambda: rand(2, 3, 5, dtype=torch.float64), 1e-12),
        ("x-float16", lambda: rand(2, 3, 5, dtype=torch.float16), 2e-3),
        ("x-bfloat16", lambda: rand(2, 3, 5, dtype=torch.bfloat16), 2e-2),
        ("x-nan-inf", lambda: torch.tensor([[NAN, INF, -INF, 0.0, 1.0]] * 3), 1e-6),
    ]:
        good(name, _id, lambda m=make: (lambda x: (module()(x), x))(m()),
             lambda r, a=atol: close(r[0], want(r[1]), atol=a, rtol=1e-6 if a < 1e-3 else 1e-2)
             or (r[0].dtype == r[1].dtype or pytest.fail("dtype changed")))
    good(name, "x-empty-seq-positions", lambda: module()(torch.zeros(2, 0, 5), positions=torch.zeros(2, 0, dtype=torch.int16)),
         lambda out: close(out, np.zeros((2, 0, 5))))


_x_cases("SinusoidalEncoding", lambda: SinusoidalEncoding(5, max_seq_len=4), lambda p: ref_sinusoidal(p, 5))
_x_cases("LearnedPositionalEmbedding", lambda: LearnedPositionalEmbedding(4, 5, init="sinusoidal"), lambda p: ref_sinusoidal(p, 5))
good("SinusoidalEncoding", "scale", lambda: (lambda x: (SinusoidalEncoding(5, scale=math.sqrt(5))(x), x))(rand(2, 3, 5)),
     lambda r: close(r[0], arr(r[1]) * math.sqrt(5) + ref_sinusoidal(np.arange(3), 5), atol=1e-5))
good("SinusoidalEncoding", "float64-table", lambda: (lambda x: (SinusoidalEncoding(5, dtype=torch.float64)(x), x))(
    rand(2, 3, 5, dtype=torch.float64)), lambda r: close(r[0], arr(r[1]) + ref_sinusoidal(np.arange(3), 5), atol=1e-12))

# SinusoidalEncoding: in place, aliasing
bad("SinusoidalEncoding", "inplace-str", lambda: SinusoidalEncoding(5)(rand(1, 3, 5), inplace="yes"), TypeError,
    "inplace must be a bool")
bad("SinusoidalEncoding", "inplace-expanded", lambda: SinusoidalEncoding(5)(rand(1, 3, 5).expand(2, 3, 5), inplace=True),
    ValueError, "x has elements that share memory")
bad("SinusoidalEncoding", "inplace-leaf-requires-grad",
    lambda: SinusoidalEncoding(5)(torch.zeros(1, 3, 5, requires_grad=True), inplace=True), ValueError, "x is .*leaf")
bad("SinusoidalEncoding", "inplace-view-of-leaf",
    lambda: SinusoidalEncoding(5)(torch.zeros(2, 3, 5, requires_grad=True)[1:], inplace=True), ValueError, "x is .*leaf")


def _inplace_sinusoidal(make):
    x = make()
    x0 = x.clone()
    return SinusoidalEncoding(5, max_seq_len=4)(x, inplace=True), x, x0


for _id, _make in [
    ("contiguous", lambda: rand(2, 3, 5)),
    ("non-contiguous", lambda: rand(5, 3, 2).permute(2, 1, 0)),
    ("view-of-a-buffer", lambda: rand(2, 3, 11)[..., 3:8]),
    ("non-leaf-requires-grad", lambda: rand(2, 3, 5).requires_grad_() * 1.0),
]:
    good("SinusoidalEncoding", f"inplace-{_id}", lambda m=_make: _inplace_sinusoidal(m),
         lambda r: (r[0] is r[1] or pytest.fail("not x itself")) or close(r[0], arr(r[2]) + ref_sinusoidal(np.arange(3), 5)))
good("SinusoidalEncoding", "inplace-no-grad-leaf",
     lambda: (lambda x: torch.no_grad()(lambda: SinusoidalEncoding(5)(x, inplace=True))())(torch.zeros(1, 3, 5, requires_grad=True)),
     lambda out: close(out, ref_sinusoidal(np.arange(3), 5)[None]))

# SinusoidalEncoding.table
bad("SinusoidalEncoding", "table-length-negative", lambda: SinusoidalEncoding(5).table(-1), ValueError, "length must be >= 0")
bad("SinusoidalEncoding", "table-length-float", lambda: SinusoidalEncoding(5).table(2.0), TypeError, "length must be an int")
bad("SinusoidalEncoding", "table-offset-float", lambda: SinusoidalEncoding(5).table(2, offset=1.5), TypeError, "offset must be an int")
bad("SinusoidalEncoding", "table-offset-2**53", lambda: SinusoidalEncoding(5).table(2, offset=2**53), ValueError, f"positions {EXACT}")
good("SinusoidalEncoding", "table-length-0", lambda: SinusoidalEncoding(5).table(0, offset=2**53),
     lambda out: close(out, np.zeros((0, 5))))
good("SinusoidalEncoding", "table-negative-offset", lambda: SinusoidalEncoding(5, max_seq_len=4).table(3, offset=-2),
     lambda out: close(out, ref_sinusoidal(np.arange(-2, 1), 5)))
good("SinusoidalEncoding", "table-meta", lambda: SinusoidalEncoding(5, device=META).table(3, offset=5000),
     lambda out: (out.is_meta and out.shape == (3, 5)) or pytest.fail("not a (3, 5) meta tensor"))


# ---- 4. LearnedPositionalEmbedding --------------------------------------------------------------------

for _id, _kw, _exc, _match in [
    ("num_positions-0", {"num_positions": 0}, ValueError, "num_positions must be >= 1"),
    ("num_positions-float", {"num_positions": 4.0}, TypeError, "num_positions must be an int"),
    ("dim-0", {"dim": 0}, ValueError, "dim must be >= 1"),
    ("init", {"init": "xavier"}, ValueError, "init must be one of"),
    ("padding_idx-negative", {"padding_idx": -1}, ValueError, "padding_idx must be >= 0"),
    ("padding_idx-past", {"padding_idx": 4}, ValueError, "padding_idx must be < num_positions=4"),
    ("padding_idx-float", {"padding_idx": 1.0}, TypeError, "padding_idx must be an int"),
    ("dtype-int", {"dtype": torch.int64}, TypeError, "dtype must be one of"),
    ("dtype-bool", {"dtype": torch.bool}, TypeError, "dtype must be one of"),
    ("dtype-complex", {"dtype": torch.complex64}, TypeError, "dtype must be one of"),
    ("dtype-str", {"dtype": "float32"}, TypeError, "dtype must be one of"),
]:
    bad("LearnedPositionalEmbedding", f"init-{_id}", lambda kw=_kw: LearnedPositionalEmbedding(**{"num_positions": 4, "dim": 8, **kw}),
        _exc, _match)
good("LearnedPositionalEmbedding", "padding-row", lambda: LearnedPositionalEmbedding(4, 5, init="sinusoidal", padding_idx=1)(
    torch.zeros(3, 5), positions=torch.tensor([1, 0, 1], dtype=torch.uint8)),
    lambda out: close(out, np.stack([np.zeros(5), ref_sinusoidal(0, 5), np.zeros(5)])))


# ---- 5. RoPE: rope_inv_freq, rope_cos_sin, layout_permutation, convert_rope_weight -------------------

for _id, _kw, _exc, _match in [
    ("dim-0", {"dim": 0}, ValueError, "dim must be >= 2"), ("dim-odd", {"dim": 7}, ValueError, r"rotary dim\)? must be even"),
    ("dim-float", {"dim": 8.0}, TypeError, "dim must be an int"),
    ("base-nan", {"base": NAN}, ValueError, "base must be finite"), ("base-inf", {"base": INF}, ValueError, "base must be finite"),
    ("base-0", {"base": 0.0}, ValueError, "base must be > 0"), ("base-1", {"base": 1.0}, ValueError, "base must not be 1"),
    ("base-str", {"base": "10000"}, TypeError, "base must be a real number"),
    ("scaling-str", {"scaling": "linear"}, TypeError, "scaling must be None or a posenc scaling rule"),
    ("scaling-dict", {"scaling": {"rule": "linear", "factor": 2.0}}, TypeError, "scaling must be None or a posenc"),
    ("scaling-base-class", {"scaling": RopeScaling()}, TypeError, "scaling must be a concrete rule"),
    ("seq_len-0", {"seq_len": 0}, ValueError, "seq_len must be >= 1"),
    ("seq_len-float", {"seq_len": 16.0}, TypeError, "seq_len must be an int"),
]:
    bad("rope_inv_freq", _id, lambda kw=_kw: F.rope_inv_freq(**{"dim": 8, **kw}), _exc, _match)
    bad("RotaryEmbedding", f"init-{_id}", lambda kw=_kw: RotaryEmbedding(**{"dim": 8, **kw}) if "seq_len" not in kw else
        RotaryEmbedding(8)(rand(1, 1, 3, 8), seq_len=kw["seq_len"]), _exc, _match)
good("rope_inv_freq", "dim-2", lambda: F.rope_inv_freq(2, base=3.0), lambda r: close(r[0], ref_theta(2, 3.0), atol=0, rtol=1e-15))
good("rope_inv_freq", "dim-6", lambda: F.rope_inv_freq(6), lambda r: close(r[0], ref_theta(6), atol=0, rtol=1e-15)
     or (r[1] == 1.0 or pytest.fail("attention factor")))
good("rope_inv_freq", "base-below-1", lambda: F.rope_inv_freq(4, base=0.5), lambda r: close(r[0], ref_theta(4, 0.5), atol=0, rtol=1e-15))

_INV = torch.tensor(ref_theta(8))
for _id, _inv, _kw, _exc, _match in [
    ("inv_freq-int", torch.tensor([1, 0]), {}, TypeError, "inv_freq must be a 1-D floating tensor"),
    ("inv_freq-complex", torch.tensor([1j]), {}, TypeError, "inv_freq must be a 1-D floating tensor"),
    ("inv_freq-0-d", torch.tensor(1.0), {}, TypeError, "inv_freq must be a 1-D floating tensor"),
    ("inv_freq-2-d", _INV[None], {}, TypeError, "inv_freq must be a 1-D floating tensor"),
    ("inv_freq-list", [1.0, 0.1], {}, TypeError, "inv_freq must be a 1-D floating tensor"),
    ("inv_freq-nan", torch.tensor([1.0, NAN], dtype=torch.float64), {}, ValueError, "inv_freq must be finite"),
    ("inv_freq-inf", torch.tensor([INF], dtype=torch.float64), {}, ValueError, "inv_freq must be finite"),
    ("inv_freq-meta", _INV.to(META), {}, ValueError, "inv_freq is on the meta device"),
    ("attention_factor-nan", _INV, {"attention_factor": NAN}, ValueError, "attention_factor must be finite"),
    ("attention_factor-inf", _INV, {"attention_factor": INF}, ValueError, "attention_factor must be finite"),
    ("attention_factor-negative", _INV, {"attention_factor": -1.0}, ValueError, "attention_factor must be >= 0"),
    ("attention_factor-tensor", _INV, {"attention_factor": torch.tensor(2.0)}, TypeError, "attention_factor must be a real"),
    ("dtype-int", _INV, {"dtype": torch.int32}, TypeError, "dtype must be one of"),
]:
    bad("rope_cos_sin", _id, lambda inv=_inv, kw=_kw: F.rope_cos_sin(torch.arange(3), inv, **kw), _exc, _match)
good("rope_cos_sin", "inv_freq-empty", lambda: F.rope_cos_sin(torch.arange(3), torch.zeros(0, dtype=torch.float64)),
     lambda r: close(r, (np.zeros((3, 0)), np.zeros((3, 0)))))
good("rope_cos_sin", "inv_freq-float32-non-contiguous", lambda: F.rope_cos_sin(torch.arange(3), _INV.float().repeat_interleave(2)[::2]),
     lambda r: close(r, ref_cos_sin(np.arange(3), 8)))
good("rope_cos_sin", "attention_factor", lambda: F.rope_cos_sin(torch.arange(3), _INV, attention_factor=2, dtype=torch.float64),
     lambda r: close(r, tuple(2 * t for t in ref_cos_sin(np.arange(3), 8)), atol=1e-12))

bad("layout_permutation", "dim-0", lambda: F.layout_permutation(0), ValueError, "dim must be >= 1")
bad("layout_permutation", "dim-float", lambda: F.layout_permutation(4.0), TypeError, "dim must be an int")
bad("layout_permutation", "dim-tensor", lambda: F.layout_permutation(torch.tensor(4)), TypeError, "dim must be an int")
for _dim in (1, 2, 5, 8):
    good("layout_permutation", f"dim-{_dim}", lambda d=_dim: F.layout_permutation(d),
         lambda out, d=_dim: close(out, np.array([*range(0, d, 2), *range(1, d, 2)], dtype=np.int64)))
good("layout_permutation", "meta", lambda: F.layout_permutation(6, device=META),
     lambda out: (out.is_meta and out.shape == (6,)) or pytest.fail("not a (6,) meta tensor"))


def ref_convert(w: np.ndarray, heads: int, src: str, dst: str, rot: int | None = None) -> np.ndarray:
    """Rows of each head: interleaved -> half takes [0, 2, 4, .., 1, 3, ..] of the rotary part."""
    hd = w.shape[0] // heads
    rot = hd if rot is None else rot
    perm = [*range(0, rot, 2), *range(1, rot, 2)]
    if src == dst:
        order = list(range(rot))
    elif src == "interleaved":
        order = perm
    else:
        order = list(np.argsort(perm))
    index = [h * hd + i for h in range(heads) for i in [*order, *range(rot, hd)]]
    return w[index]


_W = rand(12, 3)
for _id, _args, _kw, _exc, _match in [
    ("weight-list", ([[1.0]] * 4, 1), {}, TypeError, "weight must be a 1-D bias or 2-D"),
    ("weight-0-d", (torch.tensor(1.0), 1), {}, TypeError, "weight must be a 1-D bias or 2-D"),
    ("weight-3-d", (torch.zeros(2, 4, 3), 1), {}, TypeError, "weight must be a 1-D bias or 2-D"),
    ("weight-empty", (torch.zeros(0, 3), 1), {}, ValueError, "weight has 0 rows"),
    ("weight-1-row-heads", (torch.zeros(3, 3), 3), {}, ValueError, "weight has 3 rows"),
    ("num_heads-0", (_W, 0), {}, ValueError, "num_heads must be >= 1"),
    ("num_heads-float", (_W, 2.0), {}, TypeError, "num_heads must be an int"),
    ("num_heads-not-dividing", (_W, 5), {}, ValueError, "not a multiple of num_heads=5"),
    ("src", (_W, 2), {"src": "neox"}, ValueError, "src must be one of"),
    ("dst", (_W, 2), {"dst": None}, ValueError, "dst must be one of"),
    ("rotary_dim-odd", (_W, 2), {"rotary_dim": 3}, ValueError, "rotary_dim must be even"),
    ("rotary_dim-0", (_W, 2), {"rotary_dim": 0}, ValueError, "rotary_dim must be >= 2"),
    ("rotary_dim-past-head", (_W, 2), {"rotary_dim": 8}, ValueError, "rotary_dim must be even and <= head_dim=6"),
    ("rotary_dim-float", (_W, 2), {"rotary_dim": 4.0}, TypeError, "rotary_dim must be an int"),
]:
    bad("convert_rope_weight", _id, lambda a=_args, kw=_kw: F.convert_rope_weight(*a, **{"src": "interleaved", "dst": "half", **kw}),
        _exc, _match)
for _id, _make, _heads, _src, _dst, _rot in [
    ("int-weight", lambda: torch.arange(24).view(12, 2), 2, "interleaved", "half", None),
    ("bias", lambda: torch.arange(12.0), 3, "half", "interleaved", None),
    ("partial", lambda: rand(12, 3), 2, "interleaved", "half", 4),
    ("non-contiguous", lambda: rand(3, 12).t(), 2, "half", "interleaved", None),
    ("expanded", lambda: rand(12, 1).expand(12, 4), 2, "interleaved", "half", None),
    ("nan", lambda: torch.tensor([[NAN], [1.0], [INF], [2.0]]), 1, "interleaved", "half", None),
    ("same-layout", lambda: rand(12, 3), 2, "half", "half", None),
    ("meta", lambda: torch.zeros(12, 3, device=META), 2, "half", "interleaved", None),
]:
    def _check(r, src=_src, dst=_dst, heads=_heads, rot=_rot):
        out, w = r
        if w.is_meta:
            assert out.is_meta and out.shape == w.shape
            return
        assert out.data_ptr() != w.data_ptr()                                   # a copy, never the weight itself
        close(out, ref_convert(w.numpy(), heads, src, dst, rot).astype(w.numpy().dtype))
    good("convert_rope_weight", _id, lambda m=_make, h=_heads, s=_src, d=_dst, rot=_rot:
         (lambda w: (F.convert_rope_weight(w, h, src=s, dst=d, rotary_dim=rot), w))(m()), _check)


# ---- 6. apply_rope ------------------------------------------------------------------------------------

def _cs(rows=3, d=8):
    """``(rows, d/2)`` tables of a rotary dim ``d``."""
    return (C8[:rows], S8[:rows]) if d == 8 else np_tables(rows, d)


for _id, _call, _exc, _match in [
    ("x-int", lambda: F.apply_rope(torch.zeros(3, 8, dtype=torch.long), *_cs()), TypeError, "x must be a floating tensor"),
    ("x-bool", lambda: F.apply_rope(torch.zeros(3, 8, dtype=torch.bool), *_cs()), TypeError, "x must be a floating tensor"),
    ("x-complex", lambda: F.apply_rope(torch.zeros(3, 8, dtype=torch.complex64), *_cs()), TypeError, "x must be a floating"),
    ("x-list", lambda: F.apply_rope([[0.0] * 8] * 3, *_cs()), TypeError, "x must be a torch.Tensor"),
    ("cos-int", lambda: F.apply_rope(rand(3, 8), _cs()[0].long(), _cs()[1]), TypeError, "cos must be a floating tensor"),
    ("sin-complex", lambda: F.apply_rope(rand(3, 8), _cs()[0], _cs()[1].to(torch.complex64)), TypeError,
     "sin must be a floating tensor"),
    ("x-0-d", lambda: F.apply_rope(torch.tensor(1.0), *_cs()), ValueError, "x must have a feature axis"),
    ("cos-0-d", lambda: F.apply_rope(rand(3, 8), torch.tensor(1.0), torch.tensor(0.0)), ValueError,
     "cos must have a feature axis"),
    ("cos-sin-shapes", lambda: F.apply_rope(rand(3, 8), _cs()[0], _cs(2)[1]), ValueError, "cos and sin must have the same shape"),
    ("cos-no-frequency", lambda: F.apply_rope(rand(3, 8), torch.zeros(3, 0), torch.zeros(3, 0)), ValueError,
     "cos and sin must hold at least one frequency"),
    ("rotary-dim-past-x", lambda: F.apply_rope(rand(3, 6), *_cs()), ValueError, "rotary dim 2 \\* cos.shape\\[-1\\] = 8 exceeds"),
    ("cos-rows-mismatch", lambda: F.apply_rope(rand(3, 8), *_cs(2)), ValueError, "cos/sin of shape .* do not broadcast"),
    ("cos-higher-rank", lambda: F.apply_rope(rand(3, 8), _cs()[0][None], _cs()[1][None]), ValueError, "do not broadcast"),
    ("cos-meta", lambda: F.apply_rope(rand(3, 8), *(t.to(META) for t in _cs())), ValueError, "cos is on meta but x on cpu"),
    ("x-meta", lambda: F.apply_rope(rand(3, 8, dtype=torch.float32).to(META), *_cs()), ValueError, "cos is on cpu but x on meta"),
    ("layout", lambda: F.apply_rope(rand(3, 8), *_cs(), layout="neox"), ValueError, "layout must be one of"),
    ("backend", lambda: F.apply_rope(rand(3, 8), *_cs(), backend="cuda"), ValueError, "backend must be one of"),
    # float64: a case the kernel never takes (whether Triton runs here, e.g. TRITON_INTERPRET=1, or not)
    ("backend-triton-float64", lambda: F.apply_rope(rand(1, 1, 3, 8, dtype=torch.float64), *_cs(), backend="triton"),
     ValueError, "backend='triton'"),
    ("inplace-int", lambda: F.apply_rope(rand(3, 8), *_cs(), inplace=1), TypeError, "inplace must be a bool"),
    ("inplace-expanded", lambda: F.apply_rope(rand(1, 3, 8).expand(2, 3, 8), *_cs(), inplace=True), ValueError,
     "x has elements that share memory"),
    ("inplace-leaf", lambda: F.apply_rope(rand(3, 8).requires_grad_(), *_cs(), inplace=True), ValueError, "x is .*leaf"),
]:
    bad("apply_rope", _id, _call, _exc, _match)


def _rope_good(name, case_id, make_x, run, want, atol=1e-5, inplace=False):
    """``run(x)`` must equal ``want(x0)`` (``x0``: ``x`` before the call); in place, it returns ``x``."""
    def thunk():
        x = make_x()
        x0 = x.detach().clone()
        return run(x), x, x0

    def check(r):
        out, x, x0 = r
        first = out[0] if isinstance(out, tuple) else out
        if inplace:
            assert first is x, "in place must return x itself"
        assert first.dtype == x.dtype, "the result keeps x's dtype"
        close(out, want(x0), atol=atol, rtol=1e-6 if atol < 1e-3 else 1e-2)
    good(name, case_id, thunk, check)


for _id, _make, _run, _want, _atol, _inplace in [
    ("odd-head-dim", lambda: rand(3, 9), lambda x: F.apply_rope(x, *_cs()), lambda x: ref_rope(x, np.arange(3), d=8), 1e-5, False),
    ("partial-rotary", lambda: rand(2, 3, 8), lambda x: F.apply_rope(x, *_cs(3, 4)),
     lambda x: ref_rope(x, np.arange(3), d=4), 1e-5, False),
    ("1-d-x", lambda: rand(8), lambda x: F.apply_rope(x, C8[2], S8[2]), lambda x: ref_rope(x[None], [2])[0], 1e-5, False),
    ("empty-seq", lambda: torch.zeros(2, 0, 8), lambda x: F.apply_rope(x, *_cs(0)), lambda x: np.zeros((2, 0, 8)), 0, False),
    ("empty-batch", lambda: torch.zeros(0, 3, 8), lambda x: F.apply_rope(x, *_cs()), lambda x: np.zeros((0, 3, 8)), 0, False),
    ("non-contiguous", lambda: rand(8, 3).t(), lambda x: F.apply_rope(x, *_cs()), lambda x: ref_rope(x, np.arange(3)), 1e-5, False),
    ("expanded", lambda: rand(1, 3, 8).expand(4, 3, 8), lambda x: F.apply_rope(x, *_cs()),
     lambda x: ref_rope(x, np.arange(3)), 1e-5, False),
    ("cos-expanded", lambda: rand(3, 8), lambda x: F.apply_rope(x, C8[1:2, :].expand(3, 4), S8[1:2, :].expand(3, 4)),
     lambda x: ref_rope(x, [1, 1, 1]), 1e-5, False),
    ("interleaved", lambda: rand(2, 3, 8), lambda x: F.apply_rope(x, *_cs(), layout="interleaved"),
     lambda x: ref_rope(x, np.arange(3), layout="interleaved"), 1e-5, False),
    ("float64-x-float32-tables", lambda: rand(3, 8, dtype=torch.float64), lambda x: F.apply_rope(x, *_cs()),
     lambda x: ref_rope(x, np.arange(3)), 1e-6, False),
    ("float16-x-float64-tables", lambda: rand(3, 8, dtype=torch.float16), lambda x: F.apply_rope(x, *(t.double() for t in _cs())),
     lambda x: ref_rope(x, np.arange(3)), 4e-3, False),
    ("bfloat16", lambda: rand(3, 8, dtype=torch.bfloat16), lambda x: F.apply_rope(x, *_cs()),
     lambda x: ref_rope(x, np.arange(3)), 3e-2, False),
    ("nan-inf-x", lambda: torch.tensor([[NAN, 1.0, 0.0, 2.0, 1.0, 0.0, INF, 3.0]] * 3), lambda x: F.apply_rope(x, *_cs()),
     lambda x: ref_rope(x, np.arange(3)), 1e-5, False),
    ("inplace", lambda: rand(2, 3, 8), lambda x: F.apply_rope(x, *_cs(), inplace=True),
     lambda x: ref_rope(x, np.arange(3)), 1e-5, True),
    ("inplace-non-contiguous", lambda: rand(8, 3, 2).permute(2, 1, 0), lambda x: F.apply_rope(x, *_cs(), inplace=True),
     lambda x: ref_rope(x, np.arange(3)), 1e-5, True),
    ("inplace-partial-odd", lambda: rand(3, 7), lambda x: F.apply_rope(x, *_cs(3, 4), inplace=True),
     lambda x: ref_rope(x, np.arange(3), d=4), 1e-5, True),
    ("inplace-non-leaf-requires-grad", lambda: rand(3, 8).requires_grad_() * 1.0,
     lambda x: F.apply_rope(x, *_cs(), inplace=True), lambda x: ref_rope(x, np.arange(3)), 1e-5, True),
]:
    _rope_good("apply_rope", _id, _make, _run, _want, _atol, _inplace)


def _aliased_tables():
    """x rotated in place while cos and sin are other views of the same buffer."""
    buf = torch.empty(3, 16)
    buf[:, :8] = rand(3, 8)
    buf[:, 8:12], buf[:, 12:16] = _cs()
    x = buf[:, :8]
    x0 = x.clone()
    return F.apply_rope(x, buf[:, 8:12], buf[:, 12:16], inplace=True), x, x0


good("apply_rope", "inplace-tables-share-x-buffer", _aliased_tables,
     lambda r: (r[0] is r[1] or pytest.fail("not x")) or close(r[0], ref_rope(r[2], np.arange(3)), atol=1e-5))


# ---- 7. apply_rope_qk and RotaryEmbedding: q, k, tables -----------------------------------------------

def _qk_calls():
    """(name, call(q, k, **kw)) for the two q/k entry points, both with a rotary dim of 8."""
    return [
        ("apply_rope_qk", lambda q, k=None, **kw: F.apply_rope_qk(q, k, C8, S8, **kw)),
        ("RotaryEmbedding", lambda q, k=None, **kw: RotaryEmbedding(8, max_seq_len=8)(q, k, **kw)),
    ]


for _name, _call in _qk_calls():
    for _id, _args, _kw, _exc, _match in [
        ("q-int", lambda: (torch.zeros(1, 1, 3, 8, dtype=torch.int8),), {}, TypeError, "q must be a floating tensor"),
        ("q-bool", lambda: (torch.zeros(1, 1, 3, 8, dtype=torch.bool),), {}, TypeError, "q must be a floating tensor"),
        ("q-complex", lambda: (torch.zeros(1, 1, 3, 8, dtype=torch.complex64),), {}, TypeError, "q must be a floating tensor"),
        ("q-list", lambda: ([[0.0] * 8] * 3,), {}, TypeError, "q must be a torch.Tensor"),
        ("k-int", lambda: (rand(1, 1, 3, 8), torch.zeros(1, 1, 3, 8, dtype=torch.int32)), {}, TypeError,
         "k must be a floating tensor"),
        ("k-list", lambda: (rand(1, 1, 3, 8), [0.0]), {}, TypeError, "k must be a torch.Tensor"),
        ("q-0-d", lambda: (torch.tensor(1.0),), {}, ValueError, "q must have at least 2 dims"),
        ("q-1-d", lambda: (rand(8),), {}, ValueError, "q must have at least 2 dims"),
        ("q-head-dim-below-rotary", lambda: (rand(1, 1, 3, 6),), {}, ValueError, "q has head dim 6 < rotary dim 8"),
        ("q-head-dim-0", lambda: (torch.zeros(1, 1, 3, 0),), {}, ValueError, "q has head dim 0 < rotary dim 8"),
        ("k-head-dim-below-rotary", lambda: (rand(1, 1, 3, 8), rand(1, 1, 3, 4)), {}, ValueError, "k has head dim 4 < rotary"),
        ("k-rank", lambda: (rand(1, 1, 3, 8), rand(1, 3, 8)), {}, ValueError, "k .* must match q .* in rank"),
        ("k-seq-len", lambda: (rand(1, 1, 3, 8), rand(1, 1, 4, 8)), {}, ValueError, "k .* must match q .* sequence length"),
        ("k-batch", lambda: (rand(2, 1, 3, 8), rand(1, 1, 3, 8)), {}, ValueError, "k .* must match q .* batch"),
        ("k-meta", lambda: (rand(1, 1, 3, 8), rand(1, 1, 3, 8).to(META)), {}, ValueError, "k is on meta but q on cpu"),
        ("seq_dim-features", lambda: (rand(1, 1, 3, 8),), {"seq_dim": -1}, ValueError, "seq_dim=-1 is not a sequence axis"),
        ("seq_dim-out-of-range", lambda: (rand(1, 1, 3, 8),), {"seq_dim": 4}, ValueError, "seq_dim=4 is not a sequence axis"),
        ("seq_dim-float", lambda: (rand(1, 1, 3, 8),), {"seq_dim": 2.0}, TypeError, "seq_dim must be an int"),
        ("inplace-str", lambda: (rand(1, 1, 3, 8),), {"inplace": "yes"}, TypeError, "inplace must be a bool"),
        ("assume_in_table-str", lambda: (rand(1, 1, 3, 8),), {"assume_in_table": "yes"}, TypeError,
         "assume_in_table must be a bool"),
        ("assume_valid-str", lambda: (rand(1, 1, 3, 8),), {"assume_valid": "yes"}, TypeError,
         "assume_valid must be a bool"),
        ("inplace-q-is-k", lambda: (lambda t: (t, t))(rand(1, 1, 3, 8)), {"inplace": True}, ValueError,
         "q and k are the same tensor"),
        ("inplace-q-expanded", lambda: (rand(1, 1, 3, 8).expand(2, 1, 3, 8),), {"inplace": True}, ValueError,
         "q has elements that share memory"),
        ("inplace-k-expanded", lambda: (rand(1, 2, 3, 8), rand(1, 1, 3, 8).expand(1, 2, 3, 8)), {"inplace": True}, ValueError,
         "k has elements that share memory"),
        ("inplace-q-leaf", lambda: (rand(1, 1, 3, 8).requires_grad_(),), {"inplace": True}, ValueError, "q is .*leaf"),
        ("inplace-k-view-of-leaf", lambda: (rand(1, 1, 3, 8), rand(2, 1, 3, 8).requires_grad_()[:1]), {"inplace": True},
         ValueError, "k is .*leaf"),
    ]:
        bad(_name, _id, lambda c=_call, a=_args, kw=_kw: c(*a(), **kw), _exc, _match)
bad("RotaryEmbedding", "module-meta", lambda: RotaryEmbedding(8, device=META)(rand(1, 1, 3, 8)), ValueError,
    "q is on cpu but the tables on meta.*reset_buffers")
bad("RotaryEmbedding", "q-meta", lambda: RotaryEmbedding(8)(rand(1, 1, 3, 8).to(META)), ValueError, "q is on meta but the tables on cpu")
good("RotaryEmbedding", "all-meta", lambda: RotaryEmbedding(8, device=META)(rand(2, 1, 3, 8).to(META), positions=torch.arange(3, device=META)),
     lambda r: (r[0].is_meta and r[0].shape == (2, 1, 3, 8) and r[1] is None) or pytest.fail("not a meta result"))

# tables of apply_rope_qk
for _id, _cos, _sin, _exc, _match in [
    ("cos-int", C8.long(), S8, TypeError, "cos must be a floating tensor"),
    ("sin-bool", C8, S8.bool(), TypeError, "sin must be a floating tensor"),
    ("cos-list", C8.tolist(), S8, TypeError, "cos must be a torch.Tensor"),
    ("cos-1-d", C8[0], S8[0], ValueError, r"cos and sin must be \(P, d/2\) tables"),
    ("cos-3-d", C8[None], S8[None], ValueError, r"cos and sin must be \(P, d/2\) tables"),
    ("cos-sin-shapes", C8, S8[:4], ValueError, r"cos and sin must be \(P, d/2\) tables of one shape"),
    ("no-frequency", C8[:, :0], S8[:, :0], ValueError, "d/2 >= 1"),
    ("no-rows", C8[:0], S8[:0], ValueError, "outside the cos/sin table of 0 rows"),
    ("cos-meta", C8.to(META), S8.to(META), ValueError, "cos is on meta but q on cpu"),
    ("sin-meta", C8, S8.to(META), ValueError, "sin is on meta but q on cpu"),
]:
    bad("apply_rope_qk", _id, lambda c=_cos, s=_sin: F.apply_rope_qk(rand(1, 1, 3, 8), None, c, s), _exc, _match)
for _id, _kw, _exc, _match in [
    ("layout", {"layout": "neox"}, ValueError, "layout must be one of"),
    ("backend", {"backend": "cuda"}, ValueError, "backend must be one of"),
    ("assume-broken-promise", {"positions": torch.tensor([0, 9, 1]), "assume_valid": True}, ValueError,
     r"positions must lie in \[0, 8\) .*assume_valid=True"),
    ("assume-broken-promise-negative", {"positions": torch.tensor([0, -1, 1]), "assume_valid": True}, ValueError,
     r"positions must lie in \[0, 8\) .*assume_valid=True"),
]:
    bad("apply_rope_qk", _id, lambda kw=_kw: F.apply_rope_qk(rand(1, 1, 3, 8), None, C8, S8, **kw), _exc, _match)
for _id, _tables, _pos in [
    ("tables-float64", lambda: (C8.double(), S8.double()), np.arange(3)),
    ("tables-mixed-dtypes", lambda: (C8.half(), S8.double()), np.arange(3)),
    ("tables-non-contiguous", lambda: (C8.t().contiguous().t(), S8.t().contiguous().t()), np.arange(3)),
    ("tables-expanded", lambda: (C8[2:3].expand(8, 4), S8[2:3].expand(8, 4)), np.full(3, 2)),
    ("tables-views-of-one-buffer", lambda: tuple(torch.cat([C8, S8], 1).split(4, 1)), np.arange(3)),
]:
    good("apply_rope_qk", _id, lambda t=_tables: (lambda q, k: (F.apply_rope_qk(q, k, *t()), q, k))(rand(1, 2, 3, 8), rand(1, 1, 3, 8)),
         lambda r, pos=_pos, i=_id: close(r[0], (ref_rope(r[1], pos), ref_rope(r[2], pos)), atol=2e-3 if "mixed" in i else 1e-5,
                                          rtol=1e-2 if "mixed" in i else 1e-6))
bad("apply_rope_qk", "backend-triton-float64",
    lambda: F.apply_rope_qk(rand(1, 1, 3, 8, dtype=torch.float64), None, C8, S8, backend="triton"), ValueError, "backend='triton'")
bad("RotaryEmbedding", "backend-triton-float64",
    lambda: RotaryEmbedding(8, backend="triton")(rand(1, 1, 3, 8, dtype=torch.float64)), ValueError, "backend='triton'")
bad("RotaryEmbedding", "assume-broken-promise", lambda: RotaryEmbedding(8, max_seq_len=8)(
    rand(1, 1, 3, 8), positions=torch.tensor([0, 9, 1]), assume_valid=True), ValueError, r"positions must lie in \[0, 8\)")


def _qk_good(case_id, make, kw, want, atol=1e-5, inplace=False, names=("apply_rope_qk", "RotaryEmbedding")):
    """``make()`` -> ``(q, k)``; both entry points must give ``want(q0, k0)``."""
    for name, call in _qk_calls():
        if name not in names:
            continue

        def thunk(call=call):
            q, k = make()
            q0, k0 = q.detach().clone(), None if k is None else k.detach().clone()
            return call(q, k, **kw), (q, k), (q0, k0)

        def check(r):
            (qo, ko), (q, k), (q0, k0) = r
            if inplace:
                assert qo is q and ko is k, "in place must return q and k themselves"
            want_q, want_k = want(q0, k0)
            close(qo, want_q, atol=atol, rtol=1e-6 if atol < 1e-3 else 1e-2)
            if want_k is None:
                assert ko is None
            else:
                close(ko, want_k, atol=atol, rtol=1e-6 if atol < 1e-3 else 1e-2)
        good(name, case_id, thunk, check)


def _both(p, **kw):
    return lambda q, k: (ref_rope(q, p, **kw), None if k is None else ref_rope(k, p, **kw))


def _seq1(p):
    """Reference for (B, S, H, D) tensors: rotate (B, H, S, D) and move back."""
    def want(q, k):
        return tuple(None if t is None else np.swapaxes(ref_rope(t.transpose(1, 2), p), 1, 2) for t in (q, k))
    return want


for _id, _make, _kw, _want, _atol, _inplace in [
    ("gqa", lambda: (rand(2, 4, 3, 8), rand(2, 1, 3, 8)), {}, _both(np.arange(3)), 1e-5, False),
    ("k-none", lambda: (rand(2, 4, 3, 8), None), {"offset": 2}, _both(np.arange(2, 5)), 1e-5, False),
    ("odd-head-dim", lambda: (rand(1, 2, 3, 9), rand(1, 1, 3, 11)), {}, _both(np.arange(3), d=8), 1e-5, False),
    ("2-d", lambda: (rand(3, 8), rand(3, 8)), {}, _both(np.arange(3)), 1e-5, False),
    ("5-d", lambda: (rand(2, 1, 2, 3, 8), rand(2, 1, 1, 3, 8)), {"positions": torch.tensor([[3, 1, 0], [0, 0, 7]])},
     _both(np.array([[3, 1, 0], [0, 0, 7]])), 1e-5, False),
    ("empty-seq", lambda: (torch.zeros(1, 2, 0, 8), torch.zeros(1, 1, 0, 8)), {}, _both(np.zeros(0)), 0, False),
    ("empty-seq-positions", lambda: (torch.zeros(1, 2, 0, 8), None), {"positions": torch.zeros(0, dtype=torch.uint8)},
     _both(np.zeros(0)), 0, False),
    ("empty-batch", lambda: (torch.zeros(0, 2, 3, 8), torch.zeros(0, 1, 3, 8)), {}, _both(np.arange(3)), 0, False),
    ("empty-heads", lambda: (torch.zeros(1, 0, 3, 8), torch.zeros(1, 0, 3, 8)), {}, _both(np.arange(3)), 0, False),
    ("seq_dim-1", lambda: (rand(2, 3, 4, 8), rand(2, 3, 1, 8)), {"seq_dim": 1}, _seq1(np.arange(3)), 1e-5, False),
    ("seq_dim-1-non-contiguous", lambda: (rand(2, 4, 3, 8).transpose(1, 2), rand(2, 1, 3, 8).transpose(1, 2)),
     {"seq_dim": 1}, _seq1(np.arange(3)), 1e-5, False),
    ("non-contiguous", lambda: (rand(2, 3, 4, 8).transpose(1, 2), rand(8, 3, 1, 2).permute(3, 2, 1, 0)), {},
     _both(np.arange(3)), 1e-5, False),
    ("expanded", lambda: (rand(1, 1, 3, 8).expand(2, 4, 3, 8), rand(1, 1, 3, 8).expand(2, 2, 3, 8)), {},
     _both(np.arange(3)), 1e-5, False),
    ("q-is-k-out-of-place", lambda: (lambda t: (t, t))(rand(1, 2, 3, 8)), {}, _both(np.arange(3)), 1e-5, False),
    ("k-float64-q-float32", lambda: (rand(1, 2, 3, 8), rand(1, 1, 3, 8, dtype=torch.float64)), {}, _both(np.arange(3)), 1e-5,
     False),
    ("bfloat16", lambda: (rand(1, 2, 3, 8, dtype=torch.bfloat16), rand(1, 1, 3, 8, dtype=torch.bfloat16)), {},
     _both(np.arange(3)), 3e-2, False),
    ("nan-inf", lambda: (torch.tensor([NAN, 1, 0, 0, INF, 0, 0, 2.0]).expand(1, 1, 3, 8), None), {}, _both(np.arange(3)),
     1e-5, False),
    ("assume-uint8", lambda: (rand(2, 2, 3, 8), rand(2, 1, 3, 8)),
     {"positions": torch.tensor([[7, 0, 2], [1, 1, 1]], dtype=torch.uint8), "assume_valid": True},
     _both(np.array([[7, 0, 2], [1, 1, 1]])), 1e-5, False),
    ("inplace", lambda: (rand(1, 2, 3, 8), rand(1, 1, 3, 8)), {"inplace": True}, _both(np.arange(3)), 1e-5, True),
    ("inplace-non-contiguous", lambda: (rand(1, 3, 2, 8).transpose(1, 2), rand(1, 3, 1, 8).transpose(1, 2)),
     {"inplace": True, "offset": 4}, _both(np.arange(4, 7)), 1e-5, True),
    ("inplace-views-of-one-buffer", lambda: (lambda buf: (buf[:, :2], buf[:, 2:]))(rand(1, 3, 3, 8)),
     {"inplace": True}, _both(np.arange(3)), 1e-5, True),
    ("inplace-float16", lambda: (rand(1, 2, 3, 8, dtype=torch.float16), rand(1, 1, 3, 8, dtype=torch.float16)),
     {"inplace": True}, _both(np.arange(3)), 4e-3, True),
]:
    _qk_good(_id, _make, _kw, _want, _atol, _inplace)


def _overlapping_views(call):
    """q and k overlap (heads 1 of q are heads 0 of k): each must be rotated once, from the inputs."""
    buf = rand(1, 3, 3, 8)
    want = ref_rope(buf, np.arange(3))
    q, k = buf[:, :2], buf[:, 1:]
    call(q, k, inplace=True)
    return buf, want


def _no_grad_leaf(call):
    """In place on a leaf that requires grad is fine where autograd does not record."""
    q = rand(1, 2, 3, 8).requires_grad_()
    q0 = q.detach().clone()
    with torch.no_grad():
        return call(q, inplace=True), q, q0


for _name, _call in _qk_calls():
    good(_name, "inplace-overlapping-views", lambda c=_call: _overlapping_views(c), lambda r: close(r[0], r[1], atol=1e-5))
    good(_name, "inplace-no-grad-leaf", lambda c=_call: _no_grad_leaf(c),
         lambda r: (r[0][0] is r[1] or pytest.fail("not q")) or close(r[0][0], ref_rope(r[2], np.arange(3)), atol=1e-5))


# RotaryEmbedding: its own arguments and rules
for _id, _kw, _exc, _match in [
    ("max_seq_len-0", {"max_seq_len": 0}, ValueError, "max_seq_len must be >= 1"),
    ("layout", {"layout": "neox"}, ValueError, "layout must be one of"),
    ("backend", {"backend": "cuda"}, ValueError, "backend must be one of"),
    ("xpos-nan", {"xpos_scale_base": NAN}, ValueError, "xpos_scale_base must be finite"),
    ("xpos-0", {"xpos_scale_base": 0}, ValueError, "xpos_scale_base must be > 0"),
    ("dim-2-ntk", {"dim": 2, "scaling": NTKScaling(2.0)}, ValueError, "NTKScaling needs dim > 2"),
    ("longrope-factors-per-dim", {"scaling": LongRopeScaling([1.0], [2.0], 4)}, ValueError,
     "LongRopeScaling has 1 factors but the rotary dim 8 needs 4"),
]:
    bad("RotaryEmbedding", f"init-{_id}", lambda kw=_kw: RotaryEmbedding(**{"dim": 8, **kw}), _exc, _match)
for _id, _call, _exc, _match in [
    ("rotate-key-str", lambda r: r.rotate(rand(1, 1, 3, 8), key="yes"), TypeError, "key must be a bool"),
    ("rotate-q-int", lambda r: r.rotate(torch.zeros(1, 1, 3, 8, dtype=torch.long)), TypeError, "q must be a floating tensor"),
    ("rotate-positions-float", lambda r: r.rotate(rand(1, 1, 3, 8), positions=torch.arange(3.0)), TypeError,
     "positions must hold integers"),
    ("cos_sin-dtype", lambda r: r.cos_sin(torch.arange(3), dtype=torch.int32), TypeError, "dtype must be one of"),
    ("cos_sin-seq_len-0", lambda r: r.cos_sin(torch.arange(3), seq_len=0), ValueError, "seq_len must be >= 1"),
    ("cos_sin-positions-meta", lambda r: r.cos_sin(torch.arange(3, device=META)), ValueError,
     "positions is on meta but the tables on cpu"),
    ("xpos-huge", lambda r: RotaryEmbedding(8, xpos_scale_base=2.0)(rand(1, 1, 3, 8), offset=200), ValueError,
     r"xPos scales overflow float32 .*raise xpos_scale_base"),
    ("dynamic-empty-cos_sin", lambda r: RotaryEmbedding(8, max_seq_len=8, scaling=DynamicNTKScaling(2.0, 8)).cos_sin(
        torch.zeros(0, dtype=torch.long)), ValueError, "depends on the sequence length.*pass seq_len="),
    ("dynamic-huge", lambda r: RotaryEmbedding(8, max_seq_len=8, scaling=DynamicNTKScaling(2.0, 8))(
        rand(1, 1, 1, 8), positions=torch.tensor([2**31 + 1])), ValueError, f"positions {EXACT}"),
    ("from_hf_config-none", lambda r: RotaryEmbedding.from_hf_config(None), TypeError, "config must be a transformers"),
    ("from_hf_config-base-1", lambda r: RotaryEmbedding.from_hf_config({"head_dim": 8, "rope_theta": 1}), ValueError,
     "base must not be 1"),
]:
    bad("RotaryEmbedding", _id, lambda c=_call: c(RotaryEmbedding(8, max_seq_len=8)), _exc, _match)
good("RotaryEmbedding", "float64-beyond-table", lambda: (lambda q: (RotaryEmbedding(8, max_seq_len=2)(q, positions=torch.tensor(
    [-4, 0, 9]))[0], q))(rand(1, 2, 3, 8, dtype=torch.float64)), lambda r: close(r[0], ref_rope(r[1], [-4, 0, 9]), atol=1e-12))
good("RotaryEmbedding", "interleaved", lambda: (lambda q: (RotaryEmbedding(8, layout="interleaved")(q)[0], q))(rand(1, 2, 3, 8)),
     lambda r: close(r[0], ref_rope(r[1], np.arange(3), layout="interleaved"), atol=1e-5))
good("RotaryEmbedding", "linear-scaling", lambda: (lambda q: (RotaryEmbedding(8, scaling=LinearScaling(4))(q, offset=5)[0], q))(
    rand(1, 2, 3, 8)), lambda r: close(r[0], ref_rope(r[1], np.arange(5, 8), theta=ref_theta(8) / 4), atol=1e-5))
good("RotaryEmbedding", "rotate-key-dim-2", lambda: (lambda k: (RotaryEmbedding(2).rotate(k, key=True, offset=3), k))(rand(1, 3, 2)),
     lambda r: close(r[0], ref_rope(r[1], np.arange(3, 6)), atol=1e-5))
good("RotaryEmbedding", "cos_sin-0-d", lambda: RotaryEmbedding(8, max_seq_len=4).cos_sin(torch.tensor(9, dtype=torch.int16)),
     lambda r: close(r, ref_cos_sin(9, 8)))


# ---- 8. ALiBi and T5 biases ---------------------------------------------------------------------------

for _id, _call, _exc, _match in [
    ("num_heads-0", lambda: F.alibi_slopes(0), ValueError, "num_heads must be >= 1"),
    ("num_heads-float", lambda: F.alibi_slopes(8.0), TypeError, "num_heads must be an int"),
    ("num_heads-tensor", lambda: F.alibi_slopes(torch.tensor(8)), TypeError, "num_heads must be an int"),
    ("dtype-int", lambda: F.alibi_slopes(8, dtype=torch.int64), TypeError, "dtype must be one of"),
]:
    bad("alibi_slopes", _id, _call, _exc, _match)
for _n in (1, 3, 8, 12):
    good("alibi_slopes", f"num_heads-{_n}", lambda n=_n: F.alibi_slopes(n, dtype=torch.float64),
         lambda out, n=_n: close(out, ref_slopes(n), atol=0, rtol=1e-15))
good("alibi_slopes", "meta", lambda: F.alibi_slopes(4, device=META),
     lambda out: (out.is_meta and out.shape == (4,)) or pytest.fail("not a (4,) meta tensor"))

_A = torch.arange(3)
for _id, _kw, _exc, _match in [
    ("slopes-int", {"slopes": torch.tensor([1, 2])}, TypeError, "slopes must be a 1-D floating tensor"),
    ("slopes-complex", {"slopes": torch.tensor([1j])}, TypeError, "slopes must be a 1-D floating tensor"),
    ("slopes-0-d", {"slopes": torch.tensor(0.5)}, TypeError, "slopes must be a 1-D floating tensor"),
    ("slopes-2-d", {"slopes": torch.ones(2, 1)}, TypeError, "slopes must be a 1-D floating tensor"),
    ("slopes-list", {"slopes": [0.5]}, TypeError, "slopes must be a 1-D floating tensor"),
    ("slopes-meta", {"slopes": torch.ones(2, device=META)}, ValueError, "slopes is on meta but positions on cpu"),
    ("symmetric-str", {"symmetric": "yes"}, TypeError, "symmetric must be a bool"),
    ("dtype-int", {"dtype": torch.int32}, TypeError, "dtype must be one of"),
]:
    bad("alibi_bias", _id, lambda kw=_kw: F.alibi_bias(_A, _A, **{"slopes": SLOPES, **kw}), _exc, _match)
good("alibi_bias", "slopes-nan-inf", lambda: F.alibi_bias(_A, _A, torch.tensor([NAN, INF, 0.25])),
     lambda out: close(out, ref_alibi(arr(_A), arr(_A), [NAN, INF, 0.25])))
good("alibi_bias", "slopes-empty", lambda: F.alibi_bias(_A, _A, torch.zeros(0)), lambda out: close(out, np.zeros((0, 3, 3))))
good("alibi_bias", "slopes-non-contiguous-float64", lambda: F.alibi_bias(_A, _A, torch.tensor([0.5, 9, 0.25, 9])[::2].double(),
                                                                            dtype=torch.float64),
     lambda out: close(out, ref_alibi(arr(_A), arr(_A), [0.5, 0.25]), atol=0))
good("alibi_bias", "per-row-and-1-d", lambda: F.alibi_bias(torch.tensor([[4], [7]]), _A, SLOPES),
     lambda out: close(out, ref_alibi([[4], [7]], arr(_A), arr(SLOPES))))

for _id, _call, _exc, _match in [
    ("init-num_heads-0", lambda: AlibiBias(0), ValueError, "num_heads must be >= 1"),
    ("init-num_heads-float", lambda: AlibiBias(2.0), TypeError, "num_heads must be an int"),
    ("init-symmetric-str", lambda: AlibiBias(2, symmetric="yes"), TypeError, "symmetric must be a bool"),
    ("dtype-int", lambda: AlibiBias(2)(_A, dtype=torch.long), TypeError, "dtype must be one of"),
    ("module-meta", lambda: AlibiBias(2, device=META)(_A), ValueError, "slopes is on meta but positions on cpu.*reset_buffers"),
    ("head_range-past-the-heads", lambda: AlibiBias(4, head_range=(2, 5)), ValueError, r"0 <= start < stop <= num_heads=4"),
    ("head_range-empty", lambda: AlibiBias(4, head_range=(2, 2)), ValueError, r"0 <= start < stop"),
    ("head_range-int", lambda: AlibiBias(4, head_range=2), TypeError, r"head_range must be a \(start, stop\) pair"),
    ("head_range-float", lambda: AlibiBias(4, head_range=(0.0, 2)), TypeError, r"head_range\[0\] must be an int"),
    ("head_range-vs-q-heads", lambda: posenc.attention(*(rand(1, 4, 3, 8),) * 3, encoding=AlibiBias(4, head_range=(0, 2))),
     ValueError, r"AlibiBias has 2 heads \(heads \(0, 2\) of 4\) but q has 4"),
]:
    bad("AlibiBias", _id, _call, _exc, _match)
good("AlibiBias", "head_range-slice-of-the-slopes", lambda: AlibiBias(6, head_range=(3, 6))(_A, dtype=torch.float64),
     lambda out: close(out, ref_alibi(arr(_A), arr(_A), ref_slopes(6)[3:6]), atol=0, rtol=1e-15))
good("AlibiBias", "all-meta", lambda: AlibiBias(2, device=META)(torch.arange(3, device=META)),
     lambda out: (out.is_meta and out.shape == (2, 3, 3)) or pytest.fail("not a (2, 3, 3) meta tensor"))
good("AlibiBias", "symmetric-float64", lambda: AlibiBias(5, symmetric=True)(_A, torch.tensor([5, -1]), dtype=torch.float64),
     lambda out: close(out, ref_alibi(arr(_A), [5, -1], ref_slopes(5), symmetric=True), atol=0, rtol=1e-15))

for _id, _call, _exc, _match in [
    ("num_buckets-float", lambda: F.relative_position_bucket(_A, num_buckets=32.0), TypeError, "num_buckets must be an int"),
    ("num_buckets-1", lambda: F.relative_position_bucket(_A, num_buckets=1), ValueError, "num_buckets must be >= 2"),
    ("num_buckets-2-bidirectional", lambda: F.relative_position_bucket(_A, num_buckets=2), ValueError,
     "num_buckets=2 leaves 1 bucket"),
    ("max_distance-0", lambda: F.relative_position_bucket(_A, max_distance=0), ValueError, "max_distance must be >= 1"),
    ("max_distance-inside-exact", lambda: F.relative_position_bucket(_A, max_distance=8), ValueError,
     "max_distance must exceed the exact range"),
    ("max_distance-nan", lambda: F.relative_position_bucket(_A, max_distance=NAN), TypeError, "max_distance must be an int"),
    ("bidirectional-str", lambda: F.relative_position_bucket(_A, bidirectional="yes"), TypeError, "bidirectional must be a bool"),
]:
    bad("relative_position_bucket", _id, _call, _exc, _match)
good("relative_position_bucket", "int64-extremes", lambda: F.relative_position_bucket(torch.tensor([-(2**63), 2**63 - 1, -200, 16])),
     lambda out: close(out, ref_bucket([-(2**63), 2**63 - 1, -200, 16])))
good("relative_position_bucket", "causal", lambda: F.relative_position_bucket(torch.tensor([-200, -16, -8, -1, 0, 5]), bidirectional=False),
     lambda out: close(out, ref_bucket([-200, -16, -8, -1, 0, 5], bidirectional=False)))
good("relative_position_bucket", "few-buckets", lambda: F.relative_position_bucket(torch.arange(-9, 10), num_buckets=4, max_distance=3),
     lambda out: close(out, ref_bucket(np.arange(-9, 10), num_buckets=4, max_distance=3)))

for _id, _call, _exc, _match in [
    ("init-num_heads-0", lambda: RelativePositionBias(0), ValueError, "num_heads must be >= 1"),
    ("init-num_buckets-1", lambda: RelativePositionBias(2, num_buckets=1), ValueError, "num_buckets must be >= 2"),
    ("init-num_buckets-float", lambda: RelativePositionBias(2, num_buckets=32.0), TypeError, "num_buckets must be an int"),
    ("init-max_distance-0", lambda: RelativePositionBias(2, max_distance=0), ValueError, "max_distance must be >= 1"),
    ("init-bidirectional-str", lambda: RelativePositionBias(2, bidirectional="no"), TypeError, "bidirectional must be a bool"),
    ("init-dtype-int", lambda: RelativePositionBias(2, dtype=torch.int64), TypeError, "dtype must be one of"),
    ("init-dtype-complex", lambda: RelativePositionBias(2, dtype=torch.complex64), TypeError, "dtype must be one of"),
    ("module-meta", lambda: RelativePositionBias(2, device=META)(_A), ValueError, "positions is on cpu but the weight on meta"),
]:
    bad("RelativePositionBias", _id, _call, _exc, _match)
good("RelativePositionBias", "all-meta", lambda: RelativePositionBias(2, device=META)(torch.arange(3, device=META)),
     lambda out: (out.is_meta and out.shape == (2, 3, 3)) or pytest.fail("not a (2, 3, 3) meta tensor"))


# ---- 9. scaling rules, Hugging Face configs -----------------------------------------------------------

for _name, _make in [
    ("LinearScaling", lambda f: LinearScaling(f)),
    ("NTKScaling", lambda f: NTKScaling(f)),
    ("DynamicNTKScaling", lambda f: DynamicNTKScaling(f, 16)),
    ("YarnScaling", lambda f: YarnScaling(f, 16)),
    ("Llama3Scaling", lambda f: Llama3Scaling(f, 16)),
]:
    for _id, _f, _exc, _match in [
        ("factor-nan", NAN, ValueError, "factor must be finite"), ("factor-inf", INF, ValueError, "factor must be finite"),
        ("factor-below-1", 0.5, ValueError, "factor must be >= 1"), ("factor-0", 0.0, ValueError, "factor must be > 0"),
        ("factor-str", "2", TypeError, "factor must be a real number"),
        ("factor-tensor", torch.tensor([2.0, 3.0]), TypeError, "factor must be a real number"),
        ("factor-bool", True, TypeError, "factor must be a real number"),
    ]:
        bad(_name, _id, lambda m=_make, f=_f: m(f), _exc, _match)
for _name, _make in [
    ("DynamicNTKScaling", lambda o: DynamicNTKScaling(2.0, o)), ("YarnScaling", lambda o: YarnScaling(2.0, o)),
    ("Llama3Scaling", lambda o: Llama3Scaling(2.0, o)), ("LongRopeScaling", lambda o: LongRopeScaling([1.0], [1.0], o)),
]:
    bad(_name, "original-0", lambda m=_make: m(0), ValueError, "original_max_seq_len must be >= 1")
    bad(_name, "original-float", lambda m=_make: m(16.0), TypeError, "original_max_seq_len must be an int")
for _i, (_name, _call, _exc, _match) in enumerate([
    ("YarnScaling", lambda: YarnScaling(2.0, 16, beta_fast=INF), ValueError, "beta_fast must be finite"),
    ("YarnScaling", lambda: YarnScaling(2.0, 16, beta_slow=0), ValueError, "beta_slow must be > 0"),
    ("YarnScaling", lambda: YarnScaling(2.0, 16, mscale=NAN), ValueError, "mscale must be finite"),
    ("YarnScaling", lambda: YarnScaling(2.0, 16, mscale_all_dim=-1.0), ValueError, "mscale_all_dim must be >= 0"),
    ("YarnScaling", lambda: YarnScaling(2.0, 16, attention_factor_override=INF), ValueError,
     "attention_factor_override must be finite"),
    ("YarnScaling", lambda: YarnScaling(2.0, 16, truncate="yes"), TypeError, "truncate must be a bool"),
    ("Llama3Scaling", lambda: Llama3Scaling(2.0, 16, low_freq_factor=NAN), ValueError, "low_freq_factor must be finite"),
    ("Llama3Scaling", lambda: Llama3Scaling(2.0, 16, low_freq_factor=4.0, high_freq_factor=4.0), ValueError,
     "high_freq_factor must be > low_freq_factor"),
    ("LongRopeScaling", lambda: LongRopeScaling([1.0, NAN], [1.0, 1.0], 16), ValueError, r"short_factor\[1\] must be finite"),
    ("LongRopeScaling", lambda: LongRopeScaling([1.0], [0.0], 16), ValueError, r"long_factor\[0\] must be > 0"),
    ("LongRopeScaling", lambda: LongRopeScaling("12", [1.0], 16), TypeError, "short_factor must be a sequence of numbers"),
    ("LongRopeScaling", lambda: LongRopeScaling([1.0], 2.0, 16), TypeError, "long_factor must be a sequence of numbers"),
    ("LongRopeScaling", lambda: LongRopeScaling([1.0], [1.0, 1.0], 16), ValueError,
     "short_factor and long_factor must have the same length"),
    ("LongRopeScaling", lambda: LongRopeScaling([1.0], [1.0], 16, factor=INF), ValueError, "factor must be finite"),
    ("ProportionalScaling", lambda: ProportionalScaling(0.0), ValueError, "partial_rotary_factor must be > 0"),
    ("ProportionalScaling", lambda: ProportionalScaling(1.5), ValueError, r"partial_rotary_factor must be in \(0, 1\]"),
    ("ProportionalScaling", lambda: ProportionalScaling(NAN), ValueError, "partial_rotary_factor must be finite"),
    ("ProportionalScaling", lambda: ProportionalScaling(0.5, factor=0), ValueError, "factor must be > 0"),
    ("RopeScaling", lambda: RotaryEmbedding(8, scaling=RopeScaling()), TypeError, "scaling must be a concrete rule"),
    ("RopeScaling", lambda: F.rope_inv_freq(8, scaling=RopeScaling()), TypeError, "scaling must be a concrete rule"),
    ("DynamicNTKScaling", lambda: RotaryEmbedding(2, max_seq_len=4, scaling=DynamicNTKScaling(2.0, 4))(
        rand(1, 1, 6, 2)), ValueError, "DynamicNTKScaling needs dim > 2"),
]):
    bad(_name, f"{_i}-{_match.split(' ')[0]}", _call, _exc, _match)

# valid uses: the rules' formulas
_T8 = ref_theta(8)
for _name, _scaling, _seq_len, _want in [
    ("LinearScaling", LinearScaling(2), None, _T8 / 2),
    ("NTKScaling", NTKScaling(4.0), None, ref_theta(8, BASE * 4.0 ** (8 / 6))),
    ("DynamicNTKScaling", DynamicNTKScaling(2.0, 16), 16, _T8),
    ("DynamicNTKScaling", DynamicNTKScaling(2.0, 16), 32, ref_theta(8, BASE * (2.0 * 32 / 16 - 1) ** (8 / 6))),
    ("LongRopeScaling", LongRopeScaling([1.0, 2.0, 4.0, 8.0], [3.0, 3.0, 3.0, 3.0], 16), 16, _T8 / [1, 2, 4, 8]),
    ("LongRopeScaling", LongRopeScaling((x for x in [1.0, 2.0, 4.0, 8.0]), [3.0] * 4, 16), 17, _T8 / 3),
    ("ProportionalScaling", ProportionalScaling(0.5), None, np.concatenate([_T8[:2], [0.0, 0.0]])),
    ("YarnScaling", YarnScaling(1.0, 16), None, _T8),
    ("Llama3Scaling", Llama3Scaling(1.0, 16), None, _T8),
]:
    good(_name, f"frequencies-{_seq_len}", lambda s=_scaling, n=_seq_len: F.rope_inv_freq(8, scaling=s, seq_len=n),
         lambda r, w=_want: close(r[0], w, atol=0, rtol=1e-13))

_HF = {"head_dim": 8, "max_position_embeddings": 32}
for _id, _cfg, _exc, _match in [
    ("config-none", None, TypeError, "config must be a transformers PretrainedConfig or a dict"),
    ("config-list", [("head_dim", 8)], TypeError, "config must be a transformers PretrainedConfig or a dict"),
    ("head_dim-float", {"head_dim": 8.5}, TypeError, "head_dim must be an int"),
    ("head_dim-missing", {"rope_theta": 10.0}, ValueError, "config needs head_dim"),
    ("rope_theta-nan", {**_HF, "rope_theta": NAN}, ValueError, "rope_theta must be finite"),
    ("rope_theta-str", {**_HF, "rope_theta": "1e4"}, TypeError, "rope_theta must be a real number"),
    ("partial-2", {**_HF, "partial_rotary_factor": 2.0}, ValueError, "partial_rotary_factor must be in"),
    ("rope_scaling-list", {**_HF, "rope_scaling": [1]}, ValueError, "rope_scaling/rope_parameters must be a dict"),
    ("rope_type", {**_HF, "rope_scaling": {"rope_type": "ntk-by-parts"}}, ValueError, "unknown rope scaling type"),
    ("linear-factor-missing", {**_HF, "rope_scaling": {"type": "linear"}}, ValueError, "needs 'factor'"),
    ("linear-factor-str", {**_HF, "rope_scaling": {"type": "linear", "factor": "2"}}, TypeError, "factor must be a real"),
    ("linear-factor-list", {**_HF, "rope_scaling": {"type": "linear", "factor": [2]}}, TypeError, "factor must be a real"),
    ("linear-factor-nan", {**_HF, "rope_scaling": {"type": "linear", "factor": NAN}}, ValueError, "factor must be finite"),
    ("dynamic-max-pos-str", {"head_dim": 8, "max_position_embeddings": "4k", "rope_scaling": {"type": "dynamic", "factor": 2}},
     TypeError, "max_position_embeddings must be an int"),
    ("yarn-max-pos-str", {"head_dim": 8, "max_position_embeddings": "4k", "original_max_position_embeddings": 16,
                          "rope_scaling": {"type": "yarn"}}, TypeError, "max_position_embeddings must be an int"),
    ("yarn-original-fraction", {**_HF, "original_max_position_embeddings": 4.5, "rope_scaling": {"type": "yarn"}},
     TypeError, "original_max_position_embeddings must be an int"),
    ("yarn-beta-str", {**_HF, "rope_scaling": {"type": "yarn", "factor": 2, "beta_fast": "32"}}, TypeError,
     "beta_fast must be a real number"),
    ("yarn-truncate-str", {**_HF, "rope_scaling": {"type": "yarn", "factor": 2, "truncate": "no"}}, TypeError,
     "truncate must be a bool"),
    ("llama3-low-str", {**_HF, "rope_scaling": {"type": "llama3", "factor": 2, "low_freq_factor": "1", "high_freq_factor": 4}},
     TypeError, "low_freq_factor must be a real number"),
    ("longrope-factors-int", {**_HF, "rope_scaling": {"type": "longrope", "short_factor": 5, "long_factor": 5}}, TypeError,
     "short_factor must be a sequence of numbers"),
    ("proportional-factor-str", {**_HF, "rope_scaling": {"type": "proportional", "factor": "2"}}, TypeError,
     "factor must be a real number"),
    ("mrope", {**_HF, "rope_scaling": {"type": "default", "mrope_section": [2, 1, 1]}}, ValueError, "mrope_section"),
]:
    bad("rope_scaling_from_hf", _id, lambda c=_cfg: posenc.rope_scaling_from_hf(c), _exc, _match)
for _id, _cfg, _want in [
    ("max-pos-whole-float", {**_HF, "max_position_embeddings": 32.0, "rope_scaling": {"type": "dynamic", "factor": 2}},
     (BASE, 8, DynamicNTKScaling(2.0, 32))),
    ("yarn-truncate-null", {**_HF, "original_max_position_embeddings": 16, "rope_scaling": {"type": "yarn", "truncate": None}},
     (BASE, 8, YarnScaling(2.0, 16, truncate=False))),
    ("longrope-lists", {**_HF, "original_max_position_embeddings": 16,
                        "rope_scaling": {"type": "longrope", "short_factor": [1, 1, 1, 1], "long_factor": [2, 2, 2, 2]}},
     (BASE, 8, LongRopeScaling((1.0,) * 4, (2.0,) * 4, 16, factor=2.0))),
]:
    good("rope_scaling_from_hf", _id, lambda c=_cfg: posenc.rope_scaling_from_hf(c),
         lambda got, w=_want: (got == w) or pytest.fail(f"{got} != {w}"))
bad("rope_layout_from_hf", "config-none", lambda: posenc.rope_layout_from_hf(None), TypeError, "config must be a transformers")
bad("rope_layout_from_hf", "config-str", lambda: posenc.rope_layout_from_hf("gptj"), TypeError, "config must be a transformers")
good("rope_layout_from_hf", "model-type-unhashable", lambda: posenc.rope_layout_from_hf({"model_type": ["gptj"]}),
     lambda got: (got == "half") or pytest.fail(got))


# ---- 10. attention ------------------------------------------------------------------------------------


def _qkv(b=1, h=2, s=3, d=8, hk=None, sk=None, **kw):
    return rand(b, h, s, d, seed=11, **kw), rand(b, hk or h, sk or s, d, seed=12, **kw), rand(b, hk or h, sk or s, d, seed=13, **kw)


for _id, _call, _exc, _match in [
    ("q-int", lambda: posenc.attention(*(t.long() for t in _qkv())), TypeError, "q must be a floating torch.Tensor"),
    ("k-bool", lambda: (lambda q, k, v: posenc.attention(q, k.bool(), v))(*_qkv()), TypeError, "k must be a floating"),
    ("v-complex", lambda: (lambda q, k, v: posenc.attention(q, k, v.to(torch.complex64)))(*_qkv()), TypeError,
     "v must be a floating"),
    ("q-list", lambda: (lambda q, k, v: posenc.attention(q.tolist(), k, v))(*_qkv()), TypeError, "q must be a floating"),
    ("q-3-d", lambda: (lambda q, k, v: posenc.attention(q[0], k, v))(*_qkv()), ValueError, r"q must have shape \(B, H, S, D\)"),
    ("q-0-d", lambda: (lambda q, k, v: posenc.attention(torch.tensor(1.0), k, v))(*_qkv()), ValueError, "q must have shape"),
    ("dtypes", lambda: (lambda q, k, v: posenc.attention(q.half(), k, v))(*_qkv()), TypeError, "q, k and v must share one dtype"),
    ("k-meta", lambda: (lambda q, k, v: posenc.attention(q, k.to(META), v))(*_qkv()), ValueError, "q, k and v must be on one device"),
    ("head-dim-0", lambda: posenc.attention(*_qkv(d=0)), ValueError, "must have a head dim D >= 1"),
    ("kv-heads-0", lambda: posenc.attention(*_qkv(h=0)), ValueError, "k at least one head"),
    ("gqa", lambda: posenc.attention(*_qkv(h=3, hk=2)), ValueError, "q has 3 heads, not a multiple of k's 2"),
    ("kv-length", lambda: (lambda q, k, v: posenc.attention(q, k, v[:, :, :2]))(*_qkv()), ValueError, "k .* and v .* must agree"),
    ("qk-head-dim", lambda: (lambda q, k, v: posenc.attention(q[..., :6], k, v))(*_qkv()), ValueError,
     "q .* and k .* must agree in batch and head dim"),
    ("causal-str", lambda: posenc.attention(*_qkv(), causal="yes"), TypeError, "causal must be a bool"),
    ("dropout_p-nan", lambda: posenc.attention(*_qkv(), dropout_p=NAN), ValueError, "dropout_p must be finite"),
    ("dropout_p-1", lambda: posenc.attention(*_qkv(), dropout_p=1.0), ValueError, r"dropout_p must be in \[0, 1\)"),
    ("scale-inf", lambda: posenc.attention(*_qkv(), scale=INF), ValueError, "scale must be finite"),
    ("scale-nan", lambda: posenc.attention(*_qkv(), scale=NAN), ValueError, "scale must be finite"),
    ("scale-0", lambda: posenc.attention(*_qkv(), scale=0), ValueError, "scale must be > 0"),
    ("backend", lambda: posenc.attention(*_qkv(), backend="cuda"), ValueError, "backend must be one of"),
    ("keys_rotated-str", lambda: posenc.attention(*_qkv(), keys_rotated="yes"), TypeError, "keys_rotated must be a bool"),
    ("assume_in_table-str", lambda: posenc.attention(*_qkv(), assume_in_table="yes"), TypeError, "assume_in_table must be a bool"),
    ("assume_valid-str", lambda: posenc.attention(*_qkv(), assume_valid="yes"), TypeError, "assume_valid must be a bool"),
    ("seq_len-0", lambda: posenc.attention(*_qkv(), encoding=RotaryEmbedding(8), seq_len=0), ValueError, "seq_len must be >= 1"),
    ("seq_len-float", lambda: posenc.attention(*_qkv(), encoding=RotaryEmbedding(8), seq_len=3.0), TypeError,
     "seq_len must be an int"),
    ("encoding-str", lambda: posenc.attention(*_qkv(), encoding="rope"), TypeError, "encoding must be None"),
    ("encoding-additive", lambda: posenc.attention(*_qkv(), encoding=SinusoidalEncoding(8)), TypeError,
     "SinusoidalEncoding is an additive encoding"),
    ("encoding-learned", lambda: posenc.attention(*_qkv(), encoding=LearnedPositionalEmbedding(4, 8)), TypeError,
     "LearnedPositionalEmbedding is an additive encoding"),
    ("encoding-rotary-dim", lambda: posenc.attention(*_qkv(), encoding=RotaryEmbedding(16)), ValueError,
     "q has head dim 8 < rotary dim 16"),
    ("encoding-alibi-heads", lambda: posenc.attention(*_qkv(), encoding=AlibiBias(3)), ValueError, "AlibiBias has 3 heads"),
    ("encoding-t5-heads", lambda: posenc.attention(*_qkv(), encoding=RelativePositionBias(4)), ValueError,
     "RelativePositionBias has 4 heads"),
    ("encoding-rotary-meta", lambda: posenc.attention(*_qkv(), encoding=RotaryEmbedding(8, device=META)), ValueError,
     "q is on cpu but the tables on meta"),
    ("encoding-alibi-meta", lambda: posenc.attention(*_qkv(), encoding=AlibiBias(2, device=META)), ValueError,
     "slopes is on meta"),
    ("encoding-t5-meta", lambda: posenc.attention(*_qkv(), encoding=RelativePositionBias(2, device=META)), ValueError,
     "the weight on meta"),
    ("bias-int", lambda: posenc.attention(*_qkv(), encoding=torch.zeros(2, 3, 3, dtype=torch.long)), ValueError,
     "a precomputed bias must be a floating"),
    ("bias-shape", lambda: posenc.attention(*_qkv(), encoding=torch.zeros(2, 3, 4)), ValueError, "a precomputed bias must be"),
    ("bias-batch", lambda: posenc.attention(*_qkv(), encoding=torch.zeros(5, 2, 3, 3)), ValueError,
     r"a precomputed bias .* B=1"),
    ("bias-meta", lambda: posenc.attention(*_qkv(), encoding=torch.zeros(2, 3, 3, device=META)), ValueError,
     "precomputed bias .* is on meta"),
    ("key_positions-meta", lambda: posenc.attention(*_qkv(), key_positions=torch.arange(3, device=META), causal=True),
     ValueError, "key_positions are on meta"),
    ("segment_ids-float", lambda: posenc.attention(*_qkv(), segment_ids=torch.zeros(1, 3)), TypeError,
     "segment_ids must be an integer tensor"),
    ("segment_ids-complex", lambda: posenc.attention(*_qkv(), segment_ids=torch.zeros(1, 3, dtype=torch.complex64)),
     TypeError, "segment_ids must hold integers"),
    ("segment_ids-shape", lambda: posenc.attention(*_qkv(), segment_ids=torch.zeros(3, dtype=torch.long)), ValueError,
     r"segment_ids must have shape \(B, S\)"),
    ("segment_ids-meta", lambda: posenc.attention(*_qkv(), segment_ids=torch.zeros(1, 3, dtype=torch.long, device=META)),
     ValueError, "segment_ids are on meta"),
    ("attn_mask-complex", lambda: posenc.attention(*_qkv(), attn_mask=torch.ones(3, 3, dtype=torch.complex64)), TypeError,
     "attn_mask must be"),
    ("attn_mask-shape", lambda: posenc.attention(*_qkv(), attn_mask=torch.ones(1, 1, 1, 3, 3, dtype=torch.bool)), ValueError,
     "attn_mask of shape"),
    ("attn_mask-meta", lambda: posenc.attention(*_qkv(), attn_mask=torch.ones(3, 3, dtype=torch.bool, device=META)),
     ValueError, "attn_mask is on meta"),
    ("flex-attn_mask", lambda: posenc.attention(*_qkv(), attn_mask=torch.ones(3, 3, dtype=torch.bool), backend="flex"),
     ValueError, "backend='flex' takes no attn_mask"),
]:
    bad("attention", _id, _call, _exc, _match)


def _attention_good(case_id, make, kw, want, atol=1e-5):
    def thunk():
        q, k, v = make()
        return posenc.attention(q, k, v, **{k_: (a() if callable(a) and not isinstance(a, torch.nn.Module) else a)
                                            for k_, a in kw.items()}), (q, k, v)
    good("attention", case_id, thunk, lambda r: close(r[0], want(*r[1]), atol=atol))


def _plain(q, k, v, bias=None):
    return ref_attention(arr(q), arr(k), arr(v), bias)


for _id, _make, _kw, _want in [
    ("empty-queries", lambda: _qkv(s=0, sk=3), {"encoding": RotaryEmbedding(8)}, lambda q, k, v: np.zeros((1, 2, 0, 8))),
    ("empty-batch", lambda: _qkv(b=0), {"encoding": AlibiBias(2), "causal": True}, lambda q, k, v: np.zeros((0, 2, 3, 8))),
    ("gqa-rope", lambda: _qkv(h=4, hk=2), {"encoding": RotaryEmbedding(8)},
     lambda q, k, v: _plain(ref_rope(q, np.arange(3)), ref_rope(k, np.arange(3)), v)),
    ("non-contiguous", lambda: tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in _qkv()), {"encoding": RotaryEmbedding(8)},
     lambda q, k, v: _plain(ref_rope(q, np.arange(3)), ref_rope(k, np.arange(3)), v)),
    ("expanded", lambda: tuple(t[:, :1].expand(1, 2, 3, 8) for t in _qkv()), {"encoding": AlibiBias(2)},
     lambda q, k, v: _plain(q, k, v, ref_alibi(np.arange(3), np.arange(3), ref_slopes(2)))),
    ("query-after-cache-alibi", lambda: _qkv(s=1, sk=4), {"encoding": AlibiBias(2), "causal": True},
     lambda q, k, v: _plain(q, k, v, ref_alibi([3], np.arange(4), ref_slopes(2)))),
    ("uint8-mask", lambda: _qkv(), {"attn_mask": lambda: torch.tril(torch.ones(3, 3, dtype=torch.uint8))},
     lambda q, k, v: _plain(q, k, v, np.where(np.tril(np.ones((3, 3))) > 0, 0.0, -np.inf))),
    ("uint8-segments", lambda: _qkv(), {"segment_ids": lambda: torch.tensor([[7, 7, 2]], dtype=torch.uint8),
                                        "encoding": RotaryEmbedding(8)},
     lambda q, k, v: _plain(ref_rope(q, [0, 1, 0]), ref_rope(k, [0, 1, 0]), v,
                            np.where(np.array([[1, 1, 0], [1, 1, 0], [0, 0, 1]]) > 0, 0.0, -np.inf))),
    ("precomputed-float64-bias", lambda: _qkv(), {"encoding": lambda: torch.full((1, 3, 3), 0.5, dtype=torch.float64)},
     lambda q, k, v: _plain(q, k, v)),
    # (NaN in v propagates; torch's CPU flash SDPA kernel itself returns 0, not NaN, for an all-NaN query row)
    ("nan-inf-values", lambda: (lambda q, k, v: (q, k, v.index_put_((torch.tensor(1),), torch.tensor(NAN))))(*_qkv(b=2)),
     {"encoding": AlibiBias(2), "causal": True},
     lambda q, k, v: _plain(q, k, v, ref_alibi(np.arange(3), np.arange(3), ref_slopes(2))
                            + np.where(np.tril(np.ones((3, 3))) > 0, 0.0, -np.inf))),
]:
    _attention_good(_id, _make, _kw, _want)


def _t5_huge():
    q, k, v = _qkv()
    m = RelativePositionBias(2)
    pos = torch.tensor([0, 1, 2**53])
    out = posenc.attention(q, k, v, encoding=m, positions=pos, key_positions=pos)
    w = m.weight.detach().double().numpy()
    p = np.array([0, 1, 2**53], dtype=np.int64)
    bias = np.moveaxis(w[ref_bucket(p[None, :] - p[:, None])], -1, 0)
    return out, _plain(q, k, v, bias)


good("attention", "huge-positions-t5", _t5_huge, lambda r: close(r[0], r[1], atol=1e-5))


# ---- 11. extreme finite values: tiny and huge bases, factors, frequencies, lengths, scales --------------

for _id, _call in [
    ("sinusoidal_encoding", lambda: F.sinusoidal_encoding(P3, 8, base=1e-300)),
    ("sinusoidal_table", lambda: F.sinusoidal_table(3, 8, base=5e-324)),
    ("SinusoidalEncoding", lambda: SinusoidalEncoding(8, base=1e-300)),
    ("RotaryEmbedding", lambda: RotaryEmbedding(8, base=1e-300)),
    ("rope_cos_sin", lambda: F.rope_cos_sin(P3, torch.tensor([1.0, 1e308], dtype=torch.float64))),
    ("ProportionalScaling", lambda: RotaryEmbedding(8, scaling=ProportionalScaling(0.5, factor=1e-300))),
    ("LongRopeScaling", lambda: RotaryEmbedding(8, scaling=LongRopeScaling([1e-300] * 4, [1.0] * 4, 16))),
]:
    bad(_id, "huge-frequency", _call, ValueError, r"exceeds 2\*\*32 turns.*base far below 1, a tiny scaling factor or a huge inv_freq")
for _name, _make in [
    ("DynamicNTKScaling", lambda o: DynamicNTKScaling(2.0, o)), ("YarnScaling", lambda o: YarnScaling(2.0, o)),
    ("Llama3Scaling", lambda o: Llama3Scaling(2.0, o)), ("LongRopeScaling", lambda o: LongRopeScaling([1.0], [1.0], o)),
]:
    bad(_name, "original-10**400", lambda m=_make: m(10**400), ValueError, r"original_max_seq_len must be <= 2\*\*53")
bad("YarnScaling", "beta_fast-1e308", lambda: YarnScaling(2.0, 16, beta_fast=1e308), ValueError, "beta_fast=1e\\+308 is out of range")
bad("YarnScaling", "beta_slow-1e-308", lambda: YarnScaling(2.0, 2**53, beta_slow=1e-308), ValueError, "beta_slow=.* is out of range")
bad("SinusoidalEncoding", "scale-overflows-float16", lambda: SinusoidalEncoding(4, scale=7e4)(torch.ones(1, 2, 4, dtype=torch.float16)),
    ValueError, "scale=70000 overflows x's dtype torch.float16")
good("SinusoidalEncoding", "scale-large-float32", lambda: SinusoidalEncoding(4, scale=7e4)(torch.ones(1, 2, 4)),
     lambda out: close(out, 7e4 + ref_sinusoidal(np.arange(2), 4)[None]))
good("LinearScaling", "factor-1e306-subnormal-frequencies",
     lambda: (lambda q: (RotaryEmbedding(8, scaling=LinearScaling(1e306))(q, offset=2**31 - 3)[0], q))(rand(1, 2, 3, 8)),
     lambda r: close(r[0], ref_rope(r[1], np.arange(2**31 - 3, 2**31), theta=ref_theta(8) / 1e306), atol=1e-5))
good("rope_inv_freq", "subnormal-frequencies", lambda: F.rope_inv_freq(8, scaling=LinearScaling(1e306)),
     lambda r: close(r[0], ref_theta(8) / 1e306, atol=0, rtol=1e-12))
good("rope_cos_sin", "inv_freq-subnormal", lambda: F.rope_cos_sin(P3, torch.tensor([1e-310, 1.0], dtype=torch.float64), dtype=torch.float64),
     lambda r: close(r, ref_cos_sin_theta(arr(P3), np.array([1e-310, 1.0])), atol=0, rtol=1e-12))
good("rope_cos_sin", "inv_freq-large", lambda: F.rope_cos_sin(P3, torch.tensor([2.0**33], dtype=torch.float64)),
     lambda r: close(r, ref_cos_sin_theta(arr(P3), np.array([2.0**33])), atol=1e-6))
for _md in (10**30, 10**400):
    _rel = [-(2**63), -(10**15), -40000, -9, 0, 5, 40000, 10**15, 2**62, 2**63 - 1]
    good("relative_position_bucket", f"max_distance-{'1e30' if _md == 10**30 else '1e400'}",
         lambda md=_md, rel=_rel: F.relative_position_bucket(torch.tensor(rel), max_distance=md),
         lambda out, md=_md, rel=_rel: close(out, ref_bucket(rel, max_distance=md)))
good("RelativePositionBias", "max_distance-1e30",
     lambda: (lambda m: (m(torch.tensor([0, 10**15]), torch.tensor([5, -(2**62)])), m.weight.detach().double().numpy()))(
         RelativePositionBias(2, max_distance=10**30)),
     lambda r: close(r[0], np.moveaxis(r[1][ref_bucket(np.array([5, -(2**62)])[None, :] - np.array([0, 10**15])[:, None],
                                                     max_distance=10**30)], -1, 0)))


# ---- 12. patch grids and multimodal positions ---------------------------------------------------------
#
# sincos_table_nd / SinusoidalEncodingND (He et al. 2022, MAE; Yang et al. 2024, CogVideoX), grid_positions,
# axial_cos_sin / apply_axial_rope / AxialRotaryEmbedding (axial RoPE: FLUX, EVA; Heo et al. 2024, RoPE-Mixed),
# mrope_positions / mrope_cos_sin / MultimodalRotaryEmbedding / mrope_from_hf / mrope_vision_from_hf (Wang et al.
# 2024, Qwen2-VL), resize_position_embedding (Dosovitskiy et al. 2021, section 3.2).


def ref_sincos_nd(grid, dim: int, *, base: float = BASE, prefix: int = 0, order: str = "mae", scale=1.0) -> np.ndarray:
    """``(prefix + prod(grid), dim)``: tokens row-major after ``prefix`` zero rows; axis ``a`` at ``i * scale[a]``.

    1-D ``[sin(p f) | cos(p f)]``, ``f_k = base^(-k/(D/2))``; 2-D "mae" ``[sin(w f) | cos(w f) | sin(h f) | cos(h f)]``,
    "timm" ``[sin(h f) | sin(w f) | cos(h f) | cos(w f)]``, ``f_k = base^(-k/(D/4))``; 3-D ``[sin(t g) | cos(t g)]``
    with ``g_k = base^(-k/(D/8))`` over D/4 columns, then the 2-D "mae" table of width 3D/4 over ``(h, w)``.
    """
    scale = tuple(scale) if isinstance(scale, tuple) else (scale,) * len(grid)
    coords = np.meshgrid(*(np.arange(n, dtype=np.float64) * s for n, s in zip(grid, scale, strict=True)), indexing="ij")
    coords = [c.reshape(-1) for c in coords]                                   # one (N,) array per axis

    def block(p, count):                                                       # (N, count) angles
        return p[:, None] * base ** (-np.arange(count) / count)

    if len(grid) == 1:
        a = block(coords[0], dim // 2)
        table = np.concatenate([np.sin(a), np.cos(a)], 1)
    elif len(grid) == 2:
        h, w = block(coords[0], dim // 4), block(coords[1], dim // 4)
        parts = [np.sin(w), np.cos(w), np.sin(h), np.cos(h)] if order == "mae" else [np.sin(h), np.sin(w), np.cos(h), np.cos(w)]
        table = np.concatenate(parts, 1)
    else:
        t, h, w = block(coords[0], dim // 8), block(coords[1], 3 * dim // 16), block(coords[2], 3 * dim // 16)
        table = np.concatenate([np.sin(t), np.cos(t), np.sin(w), np.cos(w), np.sin(h), np.cos(h)], 1)
    return np.concatenate([np.zeros((prefix, dim)), table])


def ref_axial_angles(p, axes_dims, base: float = BASE) -> np.ndarray:
    """``(..., sum(axes_dims)/2)``: block ``a`` pair ``i`` turns by ``p_a * base^(-2i/axes_dims[a])``."""
    p = np.asarray(p, dtype=np.float64)
    return np.concatenate([p[..., a, None] * base ** (-2 * np.arange(d // 2) / d) for a, d in enumerate(axes_dims)], -1)


def ref_axial_cos_sin(p, axes_dims, base: float = BASE) -> tuple[np.ndarray, np.ndarray]:
    angle = ref_axial_angles(p, axes_dims, base)
    return np.cos(angle), np.sin(angle)


def _pairs(axes_dims, layout: str) -> tuple[list[int], list[int]]:
    """Feature indices (first, second) of every pair, in block order: (2i, 2i+1) or (i, i + d_a/2) in each block."""
    first, second, o = [], [], 0
    for d in axes_dims:
        for i in range(d // 2):
            first.append(o + (2 * i if layout == "interleaved" else i))
            second.append(o + (2 * i + 1 if layout == "interleaved" else d // 2 + i))
        o += d
    return first, second


@np.errstate(invalid="ignore", over="ignore")
def ref_rotate_pairs(x, angle, first, second) -> np.ndarray:
    """Rotate pairs ``(x[first], x[second])`` of ``x (..., S, D)`` by ``angle`` (broadcasting to ``(..., S, h)``)."""
    x = arr(x).copy()
    c, s = np.cos(angle), np.sin(angle)
    a, b = x[..., first].copy(), x[..., second].copy()
    x[..., first], x[..., second] = a * c - b * s, b * c + a * s
    return x


def ref_axial_rope(x, p, axes_dims, layout: str = "interleaved", base: float = BASE) -> np.ndarray:
    """Axial RoPE of ``x (B, H, S, D)`` (or ``(S, D)``) at ``p (S, n)`` or ``(B, S, n)``."""
    angle = ref_axial_angles(p, axes_dims, base)                              # (S, h) or (B, S, h)
    if angle.ndim == 3:
        angle = angle[:, None]                                                 # (B, 1, S, h)
    return ref_rotate_pairs(x, angle, *_pairs(axes_dims, layout))


def ref_mrope_angles(p3, dim: int, section, base: float = BASE, interleaved: bool = False) -> np.ndarray:
    """``(..., dim/2)``: slot ``j`` turns by ``p_a(j) * base^(-2j/dim)``; ``a(j)`` by contiguous sections, or
    Qwen3-VL's t, h, w, t, ... (h for ``j % 3 == 1, j < 3 s_h``; w for ``j % 3 == 2, j < 3 s_w``)."""
    p3 = np.asarray(p3, dtype=np.float64)
    s_t, s_h, s_w = section
    axis = []
    for j in range(dim // 2):
        if interleaved:
            axis.append(1 if j % 3 == 1 and j < 3 * s_h else 2 if j % 3 == 2 and j < 3 * s_w else 0)
        else:
            axis.append(0 if j < s_t else 1 if j < s_t + s_h else 2)
    theta = base ** (-2 * np.arange(dim // 2) / dim)
    return np.stack([p3[a] * theta[j] for j, a in enumerate(axis)], -1)


def ref_mrope(x, p3, dim: int, section, layout: str = "half", interleaved: bool = False) -> np.ndarray:
    """M-RoPE of ``x (B, H, S, D)`` at ``p3 (3, S)`` or ``(3, B, S)``: pairs ``(j, j + dim/2)`` ("half")."""
    angle = ref_mrope_angles(p3, dim, section, interleaved=interleaved)       # (S, h) or (B, S, h)
    if angle.ndim == 3:
        angle = angle[:, None]
    first, second = (list(range(dim // 2)), list(range(dim // 2, dim))) if layout == "half" else \
        (list(range(0, dim, 2)), list(range(1, dim, 2)))
    return ref_rotate_pairs(x, angle, first, second)


def _is_meta(shape):
    return lambda out: (all(t.is_meta and tuple(t.shape) == s for t, s in zip(
        out if isinstance(out, tuple) else (out,), shape if isinstance(shape[0], tuple) else (shape,), strict=True))
        or pytest.fail(f"not meta tensors of shape {shape}"))


# sincos_table_nd and SinusoidalEncodingND: construction arguments (shared checks)
for _id, _kw, _exc, _match in [
    ("grid_shape-int", {"grid_shape": 4}, TypeError, r"grid_shape must be a tuple .* pass \(4, 4\)"),
    ("grid_shape-none", {"grid_shape": None}, TypeError, "grid_shape must be a tuple of grid sizes"),
    ("grid_shape-float", {"grid_shape": (2.0, 2)}, TypeError, r"grid_shape\[0\] must be an int"),
    ("grid_shape-bool", {"grid_shape": (2, True)}, TypeError, r"grid_shape\[1\] must be an int"),
    ("grid_shape-str", {"grid_shape": "22"}, TypeError, r"grid_shape\[0\] must be an int"),
    ("grid_shape-tensor", {"grid_shape": (torch.tensor(2), 2)}, TypeError, r"grid_shape\[0\] must be an int"),
    ("grid_shape-0", {"grid_shape": (0, 2)}, ValueError, r"grid_shape\[0\] must be an int in \[1, 2\*\*31\]"),
    ("grid_shape-negative", {"grid_shape": (2, -3)}, ValueError, r"grid_shape\[1\] must be an int in \[1, 2\*\*31\]"),
    ("grid_shape-2**31+1", {"grid_shape": (2**31 + 1, 1)}, ValueError, r"grid_shape\[0\] must be an int in \[1, 2\*\*31\]"),
    ("grid_shape-empty", {"grid_shape": ()}, ValueError, "grid_shape must have 1, 2 or 3 entries"),
    ("grid_shape-4-d", {"grid_shape": (1, 1, 1, 2), "dim": 16}, ValueError, "grid_shape must have 1, 2 or 3 entries"),
    ("dim-float", {"dim": 8.0}, TypeError, "dim must be an int"),
    ("dim-bool", {"dim": True}, TypeError, "dim must be an int"),
    ("dim-0", {"dim": 0}, ValueError, "dim must be >= 1"),
    ("dim-2-d-not-multiple-of-4", {"dim": 6}, ValueError, "dim must be divisible by 4 for a 2-D grid.*dim=8"),
    ("dim-3-d-not-multiple-of-16", {"grid_shape": (1, 2, 2), "dim": 8}, ValueError, "dim must be divisible by 16 for a 3-D"),
    ("dim-1-d-odd", {"grid_shape": (3,), "dim": 5}, ValueError, "dim must be divisible by 2 for a 1-D grid"),
    ("base-nan", {"base": NAN}, ValueError, "base must be finite"),
    ("base-inf", {"base": INF}, ValueError, "base must be finite"),
    ("base-0", {"base": 0.0}, ValueError, "base must be > 0"),
    ("base-negative", {"base": -100.0}, ValueError, "base must be > 0"),
    ("base-str", {"base": "1e4"}, TypeError, "base must be a real number"),
    ("base-tiny", {"base": 1e-300}, ValueError, r"exceeds 2\*\*32 turns.*base far below 1"),
    ("prefix_tokens-negative", {"prefix_tokens": -1}, ValueError, "prefix_tokens must be >= 0"),
    ("prefix_tokens-float", {"prefix_tokens": 1.0}, TypeError, "prefix_tokens must be an int"),
    ("prefix_tokens-bool", {"prefix_tokens": True}, TypeError, "prefix_tokens must be an int"),
    ("order", {"order": "flux"}, ValueError, "order must be one of 'mae', 'timm'"),
    ("order-none", {"order": None}, ValueError, "order must be one of"),
    ("order-timm-3-d", {"grid_shape": (1, 2, 2), "dim": 16, "order": "timm"}, ValueError, 'order="timm" is defined for 2-D'),
    ("base_size-0", {"base_size": 0}, ValueError, "base_size must be > 0"),
    ("base_size-negative", {"base_size": -16}, ValueError, "base_size must be > 0"),
    ("base_size-nan", {"base_size": NAN}, ValueError, "base_size must be finite"),
    ("base_size-inf", {"base_size": INF}, ValueError, "base_size must be finite"),
    ("base_size-str", {"base_size": "16"}, TypeError, "base_size must be a real number"),
    ("base_size-per-axis-length", {"base_size": (16, 16, 16)}, ValueError, r"base_size must be a number or a tuple with one entry per grid axis \(2\)"),
    ("interpolation_scale-0", {"interpolation_scale": 0}, ValueError, "interpolation_scale must be > 0"),
    ("interpolation_scale-negative", {"interpolation_scale": -1.0}, ValueError, "interpolation_scale must be > 0"),
    ("interpolation_scale-nan", {"interpolation_scale": NAN}, ValueError, "interpolation_scale must be finite"),
    ("interpolation_scale-axis-inf", {"interpolation_scale": (1.0, INF)}, ValueError, r"interpolation_scale\[1\] must be finite"),
    ("interpolation_scale-set", {"interpolation_scale": {1.0, 2.0}}, TypeError, "interpolation_scale must be a real number"),
    # positions i / 1e-300: out of the exact range; the message must name the argument that caused it
    ("interpolation_scale-tiny", {"interpolation_scale": 1e-300}, ValueError, r"exceeds 2\*\*32 turns.*interpolation_scale"),
    ("base_size-huge", {"base_size": 1e300}, ValueError, r"exceeds 2\*\*32 turns.*base_size"),
]:
    _args = {"grid_shape": (2, 2), "dim": 8, **_kw}
    bad("sincos_table_nd", _id, lambda a=_args: sincos_table_nd(**a), _exc, _match)
    bad("SinusoidalEncodingND", f"init-{_id}", lambda a=_args: SinusoidalEncodingND(**a), _exc, _match)
for _id, _dtype in [("int", torch.int64), ("complex", torch.complex64), ("str", "float32")]:
    bad("sincos_table_nd", f"dtype-{_id}", lambda d=_dtype: sincos_table_nd((2, 2), 8, dtype=d), TypeError, "dtype must be one of")
for _id, _dtype in [("float16", torch.float16), ("int", torch.int32), ("str", "float32")]:
    bad("SinusoidalEncodingND", f"init-dtype-{_id}", lambda d=_dtype: SinusoidalEncodingND(8, (2, 2), dtype=d), TypeError,
        "dtype is the table's dtype and must be torch.float32 or torch.float64")
bad("SinusoidalEncodingND", "init-scale-nan", lambda: SinusoidalEncodingND(8, (2, 2), scale=NAN), ValueError, "scale must be finite")
bad("SinusoidalEncodingND", "init-scale-str", lambda: SinusoidalEncodingND(8, (2, 2), scale="1"), TypeError,
    "scale must be a real number")

for _id, _grid, _dim, _kw, _want in [
    ("1x1-prefix", (1, 1), 4, {"prefix_tokens": 3}, lambda: ref_sincos_nd((1, 1), 4, prefix=3)),
    ("1-d", (3,), 6, {}, lambda: ref_sincos_nd((3,), 6)),
    ("1-d-list", [3], 2, {}, lambda: ref_sincos_nd((3,), 2)),
    ("numpy-ints", (np.int64(2), np.int16(3)), 8, {}, lambda: ref_sincos_nd((2, 3), 8)),
    ("non-square", (1, 5), 8, {"prefix_tokens": 1}, lambda: ref_sincos_nd((1, 5), 8, prefix=1)),
    ("timm", (2, 3), 8, {"order": "timm"}, lambda: ref_sincos_nd((2, 3), 8, order="timm")),
    ("3-d", (2, 2, 3), 16, {"prefix_tokens": 1}, lambda: ref_sincos_nd((2, 2, 3), 16, prefix=1)),
    ("3-d-1x1x1", (1, 1, 1), 32, {}, lambda: ref_sincos_nd((1, 1, 1), 32)),
    ("base-1", (2, 2), 8, {"base": 1.0}, lambda: ref_sincos_nd((2, 2), 8, base=1.0)),
    ("base-int", (2, 2), 8, {"base": 100}, lambda: ref_sincos_nd((2, 2), 8, base=100.0)),
    ("base_size", (2, 4), 8, {"base_size": 8}, lambda: ref_sincos_nd((2, 4), 8, scale=(4.0, 2.0))),
    ("base_size-per-axis", (2, 4), 8, {"base_size": (1, 2)}, lambda: ref_sincos_nd((2, 4), 8, scale=(0.5, 0.5))),
    ("interpolation_scale-per-axis", (2, 3), 8, {"interpolation_scale": (2.0, 0.5)},
     lambda: ref_sincos_nd((2, 3), 8, scale=(0.5, 2.0))),
    ("interpolation_scale-3-d", (2, 1, 2), 16, {"interpolation_scale": (4, 1, 1)},
     lambda: ref_sincos_nd((2, 1, 2), 16, scale=(0.25, 1.0, 1.0))),
]:
    good("sincos_table_nd", _id, lambda g=_grid, d=_dim, kw=_kw: sincos_table_nd(g, d, **kw),
         lambda out, w=_want: close(out, w()) or (out.dtype == torch.float32 or pytest.fail(str(out.dtype))))
good("sincos_table_nd", "float64", lambda: sincos_table_nd((2, 3), 8, dtype=torch.float64, prefix_tokens=1),
     lambda out: close(out, ref_sincos_nd((2, 3), 8, prefix=1), atol=1e-14, rtol=1e-14))
good("sincos_table_nd", "bfloat16", lambda: sincos_table_nd((3, 3), 8, dtype=torch.bfloat16),
     lambda out: close(out, ref_sincos_nd((3, 3), 8), atol=4e-3, rtol=8e-3) or (out.dtype == torch.bfloat16 or pytest.fail("dtype")))
good("sincos_table_nd", "meta", lambda: sincos_table_nd((2, 3), 8, prefix_tokens=1, device=META), _is_meta((7, 8)))


def _nd_good(case_id, make, run, want, atol=1e-6):
    """``run(module, x)`` must equal ``want(x0)`` (``x0`` as float64 before the call)."""
    def thunk():
        m, x = make()
        x0 = arr(x).copy()
        return run(m, x), x, x0

    def check(r):
        out, x, x0 = r
        assert out.dtype == x.dtype, (out.dtype, x.dtype)
        close(out, want(x0), atol=atol, rtol=max(atol, 1e-6))
    good("SinusoidalEncodingND", case_id, thunk, check)


for _id, _make, _run, _want, _atol in [
    ("1x1-prefix", lambda: (SinusoidalEncodingND(8, (1, 1), prefix_tokens=2), rand(3, 8)), lambda m, x: m(x),
     lambda x: x + ref_sincos_nd((1, 1), 8, prefix=2), 1e-6),
    ("other-grid", lambda: (SinusoidalEncodingND(8, (2, 2), prefix_tokens=1), rand(2, 1 + 6, 8)),
     lambda m, x: m(x, grid_shape=(3, 2)), lambda x: x + ref_sincos_nd((3, 2), 8, prefix=1), 1e-6),
    ("other-grid-base_size", lambda: (SinusoidalEncodingND(8, (2, 2), base_size=2), rand(1, 9, 8)),
     lambda m, x: m(x, grid_shape=(3, 3)), lambda x: x + ref_sincos_nd((3, 3), 8, scale=2 / 3), 1e-6),
    ("3-d", lambda: (SinusoidalEncodingND(16, (2, 1, 2), interpolation_scale=(2.0, 1.0, 1.0)), rand(1, 4, 16)),
     lambda m, x: m(x), lambda x: x + ref_sincos_nd((2, 1, 2), 16, scale=(0.5, 1.0, 1.0)), 1e-6),
    ("timm", lambda: (SinusoidalEncodingND(8, (2, 3), order="timm"), rand(6, 8)), lambda m, x: m(x),
     lambda x: x + ref_sincos_nd((2, 3), 8, order="timm"), 1e-6),
    ("scale", lambda: (SinusoidalEncodingND(8, (2, 2), scale=0.5), rand(2, 4, 8)), lambda m, x: m(x),
     lambda x: 0.5 * x + ref_sincos_nd((2, 2), 8), 1e-6),
    ("non-contiguous", lambda: (SinusoidalEncodingND(8, (2, 2)), rand(8, 4, 2).permute(2, 1, 0)), lambda m, x: m(x),
     lambda x: x + ref_sincos_nd((2, 2), 8), 1e-6),
    ("expanded", lambda: (SinusoidalEncodingND(8, (2, 2)), rand(1, 4, 8).expand(3, 4, 8)), lambda m, x: m(x),
     lambda x: x + ref_sincos_nd((2, 2), 8), 1e-6),
    ("empty-batch", lambda: (SinusoidalEncodingND(8, (2, 2)), torch.zeros(0, 4, 8)), lambda m, x: m(x),
     lambda x: np.zeros((0, 4, 8)), 0),
    ("bfloat16", lambda: (SinusoidalEncodingND(8, (3, 3)), torch.zeros(2, 9, 8, dtype=torch.bfloat16)), lambda m, x: m(x),
     lambda x: x + ref_sincos_nd((3, 3), 8), 4e-3),
    ("module-bfloat16", lambda: (SinusoidalEncodingND(8, (3, 3)).to(torch.bfloat16), torch.zeros(9, 8)), lambda m, x: m(x),
     lambda x: x + ref_sincos_nd((3, 3), 8), 1e-6),
    ("float64", lambda: (SinusoidalEncodingND(8, (2, 3), dtype=torch.float64), rand(6, 8, dtype=torch.float64)),
     lambda m, x: m(x), lambda x: x + ref_sincos_nd((2, 3), 8), 1e-13),
    ("nan-inf", lambda: (SinusoidalEncodingND(8, (2, 2)), torch.tensor([NAN, INF, -INF, 0, 0, 0, 0, 0]).expand(4, 8)),
     lambda m, x: m(x), lambda x: x + ref_sincos_nd((2, 2), 8), 1e-6),
]:
    _nd_good(_id, _make, _run, _want, _atol)
good("SinusoidalEncodingND", "all-meta", lambda: SinusoidalEncodingND(8, (2, 2), device=META)(torch.zeros(2, 4, 8, device=META)),
     _is_meta((2, 4, 8)))
for _id, _call, _exc, _match in [
    ("x-list", lambda m: m([[0.0] * 8] * 4), TypeError, "x must be a torch.Tensor"),
    ("x-int", lambda m: m(torch.zeros(4, 8, dtype=torch.long)), TypeError, "x must be a floating tensor"),
    ("x-complex", lambda m: m(torch.zeros(4, 8, dtype=torch.complex64)), TypeError, "x must be a floating tensor"),
    ("x-dim", lambda m: m(torch.zeros(1, 4, 6)), ValueError, r"x must have shape \(B, S, 8\) or \(S, 8\)"),
    ("x-1-d", lambda m: m(torch.zeros(8)), ValueError, r"x must have shape \(B, S, 8\)"),
    ("x-4-d", lambda m: m(torch.zeros(1, 1, 4, 8)), ValueError, r"x must have shape \(B, S, 8\)"),
    ("x-meta", lambda m: m(torch.zeros(1, 4, 8, device=META)), ValueError, "x is on meta but the tables on cpu"),
    ("module-meta", lambda m: SinusoidalEncodingND(8, (2, 2), device=META)(torch.zeros(1, 4, 8)), ValueError,
     "x is on cpu but the tables on meta.*reset_buffers"),
    ("tokens-vs-grid", lambda m: m(torch.zeros(1, 5, 8)), ValueError,
     r"x has 5 tokens but the grid_shape=\(2, 2\) with prefix_tokens=0 has 4; pass grid_shape="),
    ("tokens-vs-prefix", lambda m: SinusoidalEncodingND(8, (2, 2), prefix_tokens=1)(torch.zeros(1, 4, 8)), ValueError,
     "x has 4 tokens but the grid_shape=.* with prefix_tokens=1 has 5"),
    ("tokens-vs-given-grid", lambda m: m(torch.zeros(1, 4, 8), grid_shape=(3, 3)), ValueError,
     r"x has 4 tokens but the given grid_shape=\(3, 3\)"),
    ("grid_shape-rank", lambda m: m(torch.zeros(1, 4, 8), grid_shape=(4,)), ValueError, "grid_shape must have 2 entries"),
    ("grid_shape-float", lambda m: m(torch.zeros(1, 4, 8), grid_shape=(2.0, 2)), TypeError, r"grid_shape\[0\] must be an int"),
    ("grid_shape-int", lambda m: m(torch.zeros(1, 4, 8), grid_shape=4), TypeError, "grid_shape must be a tuple"),
    ("grid_shape-0", lambda m: m(torch.zeros(1, 0, 8), grid_shape=(0, 2)), ValueError, r"grid_shape\[0\] must be an int in"),
    ("table-dtype-int", lambda m: m.table(dtype=torch.int32), TypeError, "dtype must be one of"),
    # like SinusoidalEncoding: a scale that overflows x's dtype is refused, not a torch RuntimeError
    ("scale-overflows-float16", lambda m: SinusoidalEncodingND(8, (2, 2), scale=7e4)(torch.ones(1, 4, 8, dtype=torch.float16)),
     ValueError, "scale=70000 overflows x's dtype torch.float16"),
]:
    bad("SinusoidalEncodingND", _id, lambda c=_call: c(SinusoidalEncodingND(8, (2, 2))), _exc, _match)


# grid_positions
for _id, _args, _kw, _exc, _match in [
    ("grid_shape-int", (4,), {}, TypeError, "grid_shape must be a non-empty sequence of ints"),
    ("grid_shape-empty", ((),), {}, TypeError, "grid_shape must be a non-empty sequence of ints"),
    ("grid_shape-str", ("22",), {}, TypeError, "grid_shape must be a non-empty sequence of ints"),
    ("grid_shape-tensor", (torch.tensor([2, 2]),), {}, TypeError, "grid_shape must be a non-empty sequence of ints"),
    ("grid_shape-float", ((2.0, 2),), {}, TypeError, r"grid_shape\[0\] must be an int"),
    ("grid_shape-bool", ((2, True),), {}, TypeError, r"grid_shape\[1\] must be an int"),
    ("grid_shape-0", ((0, 2),), {}, ValueError, r"grid_shape\[0\] must be >= 1"),
    ("grid_shape-negative", ((2, -1),), {}, ValueError, r"grid_shape\[1\] must be >= 1"),
    ("prefix_tokens-negative", ((2, 2),), {"prefix_tokens": -1}, ValueError, "prefix_tokens must be >= 0"),
    ("prefix_tokens-float", ((2, 2),), {"prefix_tokens": 1.0}, TypeError, "prefix_tokens must be an int"),
    ("prefix_tokens-bool", ((2, 2),), {"prefix_tokens": True}, TypeError, "prefix_tokens must be an int"),
]:
    bad("grid_positions", _id, lambda a=_args, kw=_kw: grid_positions(*a, **kw), _exc, _match)
for _id, _args, _kw, _want in [
    ("1x1-prefix", ((1, 1),), {"prefix_tokens": 2}, [[0, 0]] * 3),
    ("1-d", ((3,),), {}, [[0], [1], [2]]),
    ("3-d", ((2, 1, 2),), {"prefix_tokens": 1}, [[0, 0, 0], [0, 0, 0], [0, 0, 1], [1, 0, 0], [1, 0, 1]]),
    ("4-axes", ((1, 1, 1, 2),), {}, [[0, 0, 0, 0], [0, 0, 0, 1]]),
    ("list-numpy-ints", ([np.int32(2), 3],), {}, [[h, w] for h in range(2) for w in range(3)]),
]:
    good("grid_positions", _id, lambda a=_args, kw=_kw: grid_positions(*a, **kw),
         lambda out, w=_want: close(out, np.asarray(w, dtype=np.int64)))
good("grid_positions", "meta", lambda: grid_positions((2, 3), prefix_tokens=1, device=META), _is_meta((7, 2)))


# axial_cos_sin
_PG = torch.tensor([[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]])               # grid_positions((2, 3))
for _id, _pos, _dims, _kw, _exc, _match in [
    ("positions-float", _PG.float(), (4, 4), {}, TypeError, "positions must hold integers"),
    ("positions-bool", _PG.bool(), (4, 4), {}, TypeError, "positions must hold integers"),
    ("positions-list", _PG.tolist(), (4, 4), {}, TypeError, "positions must be an integer torch.Tensor"),
    ("positions-n_axes", _PG, (4, 4, 4), {}, ValueError, r"positions must have shape \(S, 3\) or \(B, S, 3\)"),
    ("positions-1-d", torch.arange(3), (4,), {}, ValueError, r"positions must have shape \(S, 1\)"),
    ("positions-0-d", torch.tensor(3), (4,), {}, ValueError, r"positions must have shape \(S, 1\)"),
    ("positions-2**31+1", torch.tensor([[0, 2**31 + 1]]), (4, 4), {}, ValueError, f"positions {EXACT}"),
    ("axes_dims-odd", _PG, (4, 3), {}, ValueError, "axes_dims must all be even.*axis 1 has 3"),
    ("axes_dims-0", _PG, (4, 0), {}, ValueError, r"axes_dims\[1\] must be >= 2"),
    ("axes_dims-float", _PG, (4, 4.0), {}, TypeError, r"axes_dims\[1\] must be an int"),
    ("axes_dims-bool", _PG, (True, 4), {}, TypeError, r"axes_dims\[0\] must be an int"),
    ("axes_dims-int", _PG, 8, {}, TypeError, "axes_dims must be a non-empty sequence of ints"),
    ("axes_dims-empty", _PG, (), {}, TypeError, "axes_dims must be a non-empty sequence of ints"),
    ("axes_dims-str", _PG, "44", {}, TypeError, "axes_dims must be a non-empty sequence of ints"),
    ("base-nan", _PG, (4, 4), {"base": NAN}, ValueError, "base must be finite"),
    ("base-0", _PG, (4, 4), {"base": 0}, ValueError, "base must be > 0"),
    ("base-negative", _PG, (4, 4), {"base": -1.0}, ValueError, "base must be > 0"),
    ("base-str", _PG, (4, 4), {"base": "1e4"}, TypeError, "base must be a real number"),
    ("base-tiny", _PG, (4, 4), {"base": 1e-300}, ValueError, r"exceeds 2\*\*32 turns.*base far below 1"),
    ("dtype-int", _PG, (4, 4), {"dtype": torch.int32}, TypeError, "dtype must be one of"),
]:
    bad("axial_cos_sin", _id, lambda p=_pos, d=_dims, kw=_kw: axial_cos_sin(p, d, **kw), _exc, _match)
for _id, _make, _dims, _kw, _atol in [
    ("negative-int16", lambda: torch.tensor([[-3, 0], [5, -7], [0, 0]], dtype=torch.int16), (4, 2), {}, 1e-6),
    ("uint8", lambda: _PG.to(torch.uint8) + 200, (4, 4), {}, 1e-6),
    ("empty", lambda: torch.zeros(0, 2, dtype=torch.long), (4, 4), {}, 0),
    ("per-row", lambda: torch.stack([_PG, _PG.flip(0)]), (2, 6), {}, 1e-6),
    ("expanded", lambda: _PG[None].expand(3, 6, 2), (4, 4), {}, 1e-6),
    ("non-contiguous", lambda: _PG.t().contiguous().t(), (4, 4), {}, 1e-6),
    ("4-d", lambda: _PG.view(1, 2, 3, 2).expand(2, 2, 3, 2), (4, 4), {}, 1e-6),
    ("one-axis", lambda: torch.tensor([[0], [4], [-2]]), (8,), {}, 1e-6),
    ("three-axes", lambda: torch.tensor([[0, 1, 2], [3, 0, 9]]), (2, 4, 6), {"base": 100}, 1e-6),
    ("float64", lambda: _PG * 1000, (4, 4), {"dtype": torch.float64}, 1e-13),
    ("bfloat16", lambda: _PG, (4, 4), {"dtype": torch.bfloat16}, 4e-3),
    ("int32-extremes", lambda: torch.tensor([[-(2**31), 2**31 - 1]], dtype=torch.int32), (2, 2), {"dtype": torch.float64}, 1e-12),
]:
    good("axial_cos_sin", _id, lambda m=_make, d=_dims, kw=_kw: (axial_cos_sin(m(), d, **kw), m()),
         lambda r, d=_dims, kw=_kw, a=_atol: close(r[0], ref_axial_cos_sin(arr(r[1]), d, kw.get("base", BASE)), atol=a,
                                                     rtol=max(a, 1e-6)))
good("axial_cos_sin", "meta", lambda: axial_cos_sin(_PG.to(META), (4, 2)), _is_meta(((6, 3), (6, 3))))


# apply_axial_rope
def _acs(dims=(4, 4), pos=_PG):
    return axial_cos_sin(pos, dims)


for _id, _call, _exc, _match in [
    ("x-int", lambda: apply_axial_rope(torch.zeros(6, 8, dtype=torch.long), *_acs()), TypeError, "x must be a floating tensor"),
    ("x-list", lambda: apply_axial_rope([[0.0] * 8] * 6, *_acs()), TypeError, "x must be a torch.Tensor"),
    ("cos-list", lambda: apply_axial_rope(rand(6, 8), [[1.0] * 4] * 6, [[0.0] * 4] * 6), TypeError, "cos must be a torch.Tensor"),
    ("x-int-half", lambda: apply_axial_rope(torch.zeros(6, 8, dtype=torch.long), *_acs(), axes_dims=(4, 4), layout="half"),
     TypeError, "x must be a floating tensor"),
    ("sin-list-half", lambda: apply_axial_rope(rand(6, 8), _acs()[0], [[0.0] * 4] * 6, axes_dims=(4, 4), layout="half"),
     TypeError, "sin must be a torch.Tensor"),
    ("layout", lambda: apply_axial_rope(rand(6, 8), *_acs(), layout="neox"), ValueError, "layout must be one of"),
    ("half-without-axes_dims", lambda: apply_axial_rope(rand(6, 8), *_acs(), layout="half"), ValueError,
     "layout='half' pairs features inside each axis block: pass axes_dims="),
    ("axes_dims-vs-cos", lambda: apply_axial_rope(rand(6, 8), *_acs(), axes_dims=(2, 2)), ValueError,
     r"cos has 4 pairs but axes_dims=\(2, 2\) has 2"),
    ("axes_dims-vs-cos-half", lambda: apply_axial_rope(rand(6, 8), *_acs(), axes_dims=(2, 2), layout="half"), ValueError,
     r"cos has 4 pairs but axes_dims=\(2, 2\) has 2"),
    ("axes_dims-odd", lambda: apply_axial_rope(rand(6, 8), *_acs(), axes_dims=(3, 5)), ValueError, "axes_dims must all be even"),
    ("axes_dims-odd-half", lambda: apply_axial_rope(rand(6, 8), *_acs(), axes_dims=(3, 5), layout="half"), ValueError,
     "axes_dims must all be even"),
    ("axes_dims-int", lambda: apply_axial_rope(rand(6, 8), *_acs(), axes_dims=8), TypeError,
     "axes_dims must be a non-empty sequence"),
    ("x-narrower-than-rotary", lambda: apply_axial_rope(rand(6, 6), *_acs()), ValueError, "exceeds x's feature dim 6"),
    ("x-narrower-than-rotary-half", lambda: apply_axial_rope(rand(6, 6), *_acs(), axes_dims=(4, 4), layout="half"),
     ValueError, r"sum\(axes_dims\) = 8 exceeds x's feature dim 6"),
    ("rows-vs-x", lambda: apply_axial_rope(rand(5, 8), *_acs()), ValueError, "do not broadcast"),
    ("rows-vs-x-half", lambda: apply_axial_rope(rand(5, 8), *_acs(), axes_dims=(4, 4), layout="half"), ValueError,
     "do not broadcast"),
    ("cos-sin-shapes-half", lambda: apply_axial_rope(rand(6, 8), _acs()[0], _acs()[1][:5], axes_dims=(4, 4), layout="half"),
     ValueError, "cos and sin must have the same shape"),
    ("cos-meta-half", lambda: apply_axial_rope(rand(6, 8), *(t.to(META) for t in _acs()), axes_dims=(4, 4), layout="half"),
     ValueError, "cos is on meta but x on cpu"),
    ("backend-half", lambda: apply_axial_rope(rand(6, 8), *_acs(), axes_dims=(4, 4), layout="half", backend="cuda"),
     ValueError, "backend must be one of"),
    ("inplace-int-half", lambda: apply_axial_rope(rand(6, 8), *_acs(), axes_dims=(4, 4), layout="half", inplace=1),
     TypeError, "inplace must be a bool"),
    # the checks apply_rope makes must hold on the half path too (today: IndexError / RuntimeError escape)
    ("x-0-d-half", lambda: apply_axial_rope(torch.tensor(1.0), *_acs(), axes_dims=(4, 4), layout="half"), ValueError,
     "x must have a feature axis"),
    ("cos-0-d-half", lambda: apply_axial_rope(rand(6, 8), torch.tensor(1.0), torch.tensor(0.0), axes_dims=(4, 4), layout="half"),
     ValueError, "cos must have a feature axis"),
    ("cos-0-d-axes_dims", lambda: apply_axial_rope(rand(6, 8), torch.tensor(1.0), torch.tensor(0.0), axes_dims=(4, 4)),
     ValueError, "cos must have a feature axis"),
    ("cos-list-axes_dims", lambda: apply_axial_rope(rand(6, 8), [[1.0] * 4] * 6, [[0.0] * 4] * 6, axes_dims=(4, 4)),
     TypeError, "cos must be a torch.Tensor"),
    ("inplace-expanded-half", lambda: apply_axial_rope(rand(1, 8).expand(6, 8), *_acs(), axes_dims=(4, 4), layout="half",
                                                           inplace=True), ValueError, "x has elements that share memory"),
    ("inplace-leaf-half", lambda: apply_axial_rope(rand(6, 8).requires_grad_(), *_acs(), axes_dims=(4, 4), layout="half",
                                                       inplace=True), ValueError, "x is .*leaf"),
]:
    bad("apply_axial_rope", _id, _call, _exc, _match)


_PNEG = torch.tensor([[-3, 2], [0, -1], [7, 0], [-2, -2]], dtype=torch.int16)
for _id, _make, _run, _want, _atol, _inplace in [
    ("interleaved-pass-through", lambda: rand(2, 2, 6, 10), lambda x: apply_axial_rope(x, *_acs()),
     lambda x: ref_axial_rope(x, arr(_PG), (4, 4)), 1e-5, False),
    ("half", lambda: rand(1, 2, 6, 8), lambda x: apply_axial_rope(x, *_acs((2, 6)), axes_dims=(2, 6), layout="half"),
     lambda x: ref_axial_rope(x, arr(_PG), (2, 6), "half"), 1e-5, False),
    ("half-pass-through", lambda: rand(6, 11), lambda x: apply_axial_rope(x, *_acs(), axes_dims=(4, 4), layout="half"),
     lambda x: ref_axial_rope(x, arr(_PG), (4, 4), "half"), 1e-5, False),
    ("negative-coordinates", lambda: rand(1, 1, 4, 8), lambda x: apply_axial_rope(x, *_acs(pos=_PNEG)),
     lambda x: ref_axial_rope(x, arr(_PNEG), (4, 4)), 1e-5, False),
    ("seq_dim-1-rows", lambda: rand(2, 6, 3, 8), lambda x: apply_axial_rope(x, *(t[:, None] for t in _acs())),
     lambda x: np.swapaxes(ref_axial_rope(np.swapaxes(arr(x), 1, 2), arr(_PG), (4, 4)), 1, 2), 1e-5, False),
    ("non-contiguous", lambda: rand(8, 6, 2).permute(2, 1, 0), lambda x: apply_axial_rope(x, *_acs()),
     lambda x: ref_axial_rope(x, arr(_PG), (4, 4)), 1e-5, False),
    ("expanded-half", lambda: rand(1, 1, 6, 8).expand(2, 3, 6, 8),
     lambda x: apply_axial_rope(x, *_acs(), axes_dims=(4, 4), layout="half"),
     lambda x: ref_axial_rope(x, arr(_PG), (4, 4), "half"), 1e-5, False),
    ("empty-seq", lambda: torch.zeros(2, 0, 8),
     lambda x: apply_axial_rope(x, *_acs(pos=torch.zeros(0, 2, dtype=torch.long)), axes_dims=(4, 4), layout="half"),
     lambda x: np.zeros((2, 0, 8)), 0, False),
    ("bfloat16", lambda: rand(1, 2, 6, 8, dtype=torch.bfloat16), lambda x: apply_axial_rope(x, *_acs()),
     lambda x: ref_axial_rope(x, arr(_PG), (4, 4)), 3e-2, False),
    ("bfloat16-half", lambda: rand(1, 2, 6, 8, dtype=torch.bfloat16),
     lambda x: apply_axial_rope(x, *_acs(), axes_dims=(4, 4), layout="half"),
     lambda x: ref_axial_rope(x, arr(_PG), (4, 4), "half"), 3e-2, False),
    ("inplace-half", lambda: rand(2, 6, 8), lambda x: apply_axial_rope(x, *_acs(), axes_dims=(4, 4), layout="half", inplace=True),
     lambda x: ref_axial_rope(x, arr(_PG), (4, 4), "half"), 1e-5, True),
    ("inplace-non-contiguous", lambda: rand(8, 6).t(), lambda x: apply_axial_rope(x, *_acs(), inplace=True),
     lambda x: ref_axial_rope(x, arr(_PG), (4, 4)), 1e-5, True),
]:
    _rope_good("apply_axial_rope", _id, _make, _run, _want, _atol, _inplace)


# AxialRotaryEmbedding
_QA = rand(1, 2, 6, 8, seed=21)
for _id, _kw, _exc, _match in [
    ("axes_dims-odd", {"axes_dims": (4, 3)}, ValueError, "axes_dims must all be even"),
    ("axes_dims-float", {"axes_dims": (4, 4.0)}, TypeError, r"axes_dims\[1\] must be an int"),
    ("axes_dims-int", {"axes_dims": 8}, TypeError, "axes_dims must be a non-empty sequence"),
    ("base-nan", {"base": NAN}, ValueError, "base must be finite"),
    ("base-0", {"base": 0}, ValueError, "base must be > 0"),
    ("base-tiny", {"base": 1e-300}, ValueError, r"exceeds 2\*\*32 turns"),
    ("layout", {"layout": "neox"}, ValueError, "layout must be one of"),
    ("learned-int", {"learned": 1}, TypeError, "learned must be a bool"),
    ("learned-without-num_heads", {"learned": True}, ValueError, "learned=True .* pass num_heads="),
    ("learned-num_heads-0", {"learned": True, "num_heads": 0}, ValueError, "num_heads must be >= 1"),
    ("learned-num_heads-float", {"learned": True, "num_heads": 2.0}, TypeError, "num_heads must be an int"),
    ("learned-dim-not-splittable", {"axes_dims": (2, 4), "learned": True, "num_heads": 2}, ValueError,
     r"sum\(axes_dims\) = 6 must be a multiple of 2 \* n_axes = 4"),
    ("learned-base-nan", {"learned": True, "num_heads": 2, "base": NAN}, ValueError, "base must be finite"),
    ("num_heads-fixed", {"num_heads": 2}, ValueError, "drop num_heads, or pass learned=True"),
    ("max_positions-0", {"max_positions": 0}, ValueError, "max_positions must be >= 1"),
    ("max_positions-negative", {"max_positions": -1}, ValueError, "max_positions must be >= 1"),
    ("max_positions-float", {"max_positions": 4.0}, TypeError, "max_positions must be an int"),
    ("max_positions-bool", {"max_positions": True}, TypeError, "max_positions must be an int"),
    ("backend", {"backend": "cuda"}, ValueError, "backend must be one of"),
]:
    bad("AxialRotaryEmbedding", f"init-{_id}", lambda kw=_kw: AxialRotaryEmbedding(**{"axes_dims": (4, 4), **kw}), _exc, _match)
for _id, _call, _exc, _match in [
    ("positions-float", lambda m: m(_QA, positions=_PG.float()), TypeError, "positions must hold integers"),
    ("positions-list", lambda m: m(_QA, positions=_PG.tolist()), TypeError, "positions must be an integer torch.Tensor"),
    ("positions-n_axes", lambda m: m(_QA, positions=grid_positions((1, 2, 3))), ValueError,
     r"positions must have shape \(S, 2\) or \(B, S, 2\)"),
    ("positions-1-d", lambda m: m(_QA, positions=torch.arange(6)), ValueError, r"positions must have shape \(S, 2\)"),
    ("positions-wrong-S", lambda m: m(_QA, positions=grid_positions((2, 2))), ValueError,
     r"positions must have shape \(6, 2\) or \(1, 6, 2\); got \(4, 2\)"),
    ("positions-wrong-B", lambda m: m(_QA.expand(2, 2, 6, 8), positions=_PG[None].expand(3, 6, 2)), ValueError,
     r"positions must have shape \(6, 2\) or \(2, 6, 2\); got \(3, 6, 2\)"),
    ("positions-4-d", lambda m: m(_QA, positions=_PG[None, None]), ValueError, r"positions must have shape \(6, 2\)"),
    ("positions-batched-for-2-d-q", lambda m: m(rand(6, 8), positions=_PG[None]), ValueError,
     r"positions must have shape \(6, 2\); got \(1, 6, 2\)"),
    ("positions-missing", lambda m: m(_QA), ValueError, "positions are required"),
    ("positions-meta", lambda m: m(_QA, positions=_PG.to(META)), ValueError, "positions are on meta but q on cpu"),
    ("positions-2**31+1", lambda m: m(_QA, positions=_PG * (2**31 + 1)), ValueError, f"positions {EXACT}"),
    ("q-meta", lambda m: m(_QA.to(META), positions=_PG.to(META)), ValueError, "q is on meta but the tables on cpu"),
    ("module-meta", lambda m: AxialRotaryEmbedding((4, 4), device=META)(_QA, positions=_PG), ValueError,
     "q is on cpu but the tables on meta.*reset_buffers"),
    ("q-int", lambda m: m(torch.zeros(1, 2, 6, 8, dtype=torch.long), positions=_PG), TypeError, "q must be a floating tensor"),
    ("q-1-d", lambda m: m(torch.zeros(8), positions=_PG), ValueError, "q must have at least 2 dims"),
    ("q-narrower-than-rotary", lambda m: m(rand(1, 2, 6, 6), positions=_PG), ValueError, "q has head dim 6 < rotary dim 8"),
    ("k-seq-len", lambda m: m(_QA, rand(1, 1, 5, 8), positions=_PG), ValueError, "k .* must match q"),
    ("seq_dim-features", lambda m: m(_QA, positions=_PG, seq_dim=-1), ValueError, "seq_dim=-1 is not a sequence axis"),
    ("seq_dim-float", lambda m: m(_QA, positions=_PG, seq_dim=2.0), TypeError, "seq_dim must be an int"),
    ("inplace-int", lambda m: m(_QA.clone(), positions=_PG, inplace=1), TypeError, "inplace must be a bool"),
    ("inplace-expanded", lambda m: m(_QA[:, :1].expand(1, 2, 6, 8), positions=_PG, inplace=True), ValueError,
     "q has elements that share memory"),
    ("assume_in_table-str", lambda m: m(_QA, positions=_PG, assume_in_table="yes"), TypeError, "assume_in_table must be a bool"),
    ("assume-broken-promise", lambda m: AxialRotaryEmbedding((4, 4), max_positions=2)(_QA, positions=_PG, assume_in_table=True),
     ValueError, r"positions must lie in \[0, 2\) .*assume_(in_table|valid)=True"),
    ("assume-broken-promise-negative", lambda m: m(_QA, positions=-_PG, assume_in_table=True), ValueError,
     r"positions must lie in \[0, 1024\) .*assume_(in_table|valid)=True"),
    ("positions-and-cos_sin", lambda m: m(_QA, positions=_PG, cos_sin=m.cos_sin(_PG)), ValueError,
     "pass either positions or cos_sin"),
    ("cos_sin-not-a-pair", lambda m: m(_QA, cos_sin=torch.zeros(6, 4)), TypeError, "cos_sin must be the \\(cos, sin\\) pair"),
    ("cos_sin-int", lambda m: m(_QA, cos_sin=(torch.zeros(6, 4, dtype=torch.long),) * 2), TypeError,
     "cos_sin's cos must be a floating tensor"),
    ("cos_sin-wrong-S", lambda m: m(_QA, cos_sin=m.cos_sin(_PG[:5])), ValueError, r"cos_sin must be \(S, dim/2\) .* S=6"),
    ("cos_sin-meta", lambda m: m(_QA, cos_sin=(torch.zeros(6, 4, device=META),) * 2), ValueError, "cos_sin's cos is on meta"),
    ("cos_sin-dtype", lambda m: m.cos_sin(_PG, dtype=torch.int32), TypeError, "dtype must be one of"),
    ("cos_sin-positions-meta", lambda m: m.cos_sin(_PG.to(META)), ValueError, "positions is on meta but the tables on cpu"),
    ("learned-heads", lambda m: AxialRotaryEmbedding((4, 4), learned=True, num_heads=3)(_QA, positions=_PG), ValueError,
     "q has 2 heads but the learned frequencies were built for num_heads=3"),
    ("learned-3-d-q", lambda m: AxialRotaryEmbedding((4, 4), learned=True, num_heads=2)(_QA[0], positions=_PG), ValueError,
     r"learned \(RoPE-Mixed\) frequencies differ per head, so q must be 4-D"),
]:
    bad("AxialRotaryEmbedding", _id, lambda c=_call: c(AxialRotaryEmbedding((4, 4))), _exc, _match)


def _check_rotated(qo, ko, q0, want_q, want_k, atol):
    """A rotated ``(q, k)`` pair against the reference: q keeps its dtype, k is None when none was given."""
    assert qo.dtype == q0.dtype
    close(qo, want_q, atol=atol, rtol=1e-6 if atol < 1e-3 else 1e-2)
    if want_k is None:
        assert ko is None
    else:
        close(ko, want_k, atol=atol, rtol=1e-6 if atol < 1e-3 else 1e-2)


def _axial_qk(case_id, make_module, make_qk, kw, want, atol=1e-5):
    """``module(q, k, **kw)`` must equal ``want(module, q0, k0)`` for each of q, k (k may be None)."""
    def thunk():
        m = make_module()
        q, k = make_qk()
        q0, k0 = q.detach().clone(), None if k is None else k.detach().clone()
        kw_ = {key: (v(m) if callable(v) else v) for key, v in kw.items()}
        return m(q, k, **kw_), m, q0, k0

    def check(r):
        (qo, ko), m, q0, k0 = r
        _check_rotated(qo, ko, q0, *want(m, q0, k0), atol)
    good("AxialRotaryEmbedding", case_id, thunk, check)


def _axial_want(p, dims=(4, 4), layout="interleaved", seq1=False):
    def one(t):
        if t is None:
            return None
        if seq1:                                                   # (B, S, H, D): rotate as (B, H, S, D)
            return np.swapaxes(ref_axial_rope(np.swapaxes(arr(t), 1, 2), p, dims, layout), 1, 2)
        return ref_axial_rope(t, p, dims, layout)
    return lambda m, q, k: (one(q), one(k))


def _mixed_want(p):
    """RoPE-Mixed: pair j of head h turns by sum_a p_a * freqs[a, h, j] (interleaved pairs), from the module's parameter."""
    def want(m, q, k):
        f = m.freqs.detach().double().numpy()                                   # (n, H, h)
        angle = np.einsum("...sa,ahj->...hsj", np.asarray(p, dtype=np.float64), f)  # (H, S, h) or (B, H, S, h)
        pairs = (list(range(0, 8, 2)), list(range(1, 8, 2)))
        return tuple(None if t is None else ref_rotate_pairs(t, angle, *pairs) for t in (q, k))
    return want


_P16 = torch.tensor([[0, 9], [1, 1], [3, 0], [2, 5], [0, 0], [7, 7]], dtype=torch.int16)
for _id, _module, _qk, _kw, _want, _atol in [
    ("negative-coordinates", lambda: AxialRotaryEmbedding((4, 4)), lambda: (rand(1, 2, 4, 8), rand(1, 1, 4, 8)),
     {"positions": _PNEG}, _axial_want(arr(_PNEG)), 1e-5),
    ("int16-past-table", lambda: AxialRotaryEmbedding((4, 4), max_positions=4), lambda: (rand(2, 2, 6, 8), None),
     {"positions": _P16}, _axial_want(arr(_P16)), 1e-5),
    ("uint8-in-table-assumed", lambda: AxialRotaryEmbedding((2, 6)), lambda: (rand(1, 2, 6, 8), rand(1, 1, 6, 8)),
     {"positions": _PG.to(torch.uint8), "assume_in_table": True}, _axial_want(arr(_PG), (2, 6)), 1e-5),
    ("batch-shared-(1,S,n)", lambda: AxialRotaryEmbedding((4, 4)), lambda: (rand(3, 2, 6, 8), rand(3, 1, 6, 8)),
     {"positions": _PG[None]}, _axial_want(arr(_PG)), 1e-5),
    ("per-row-(B,S,n)", lambda: AxialRotaryEmbedding((4, 4)), lambda: (rand(2, 2, 6, 8), rand(2, 2, 6, 8)),
     {"positions": torch.stack([_PG, _PG.flip(0)])}, _axial_want(np.stack([arr(_PG), arr(_PG)[::-1]])), 1e-5),
    ("per-row-expanded", lambda: AxialRotaryEmbedding((4, 4), layout="half"), lambda: (rand(2, 2, 6, 8), None),
     {"positions": _PG[None].expand(2, 6, 2)}, _axial_want(arr(_PG), layout="half"), 1e-5),
    ("empty-seq", lambda: AxialRotaryEmbedding((4, 4)), lambda: (torch.zeros(1, 2, 0, 8), torch.zeros(1, 1, 0, 8)),
     {"positions": torch.zeros(0, 2, dtype=torch.long)}, lambda m, q, k: (np.zeros((1, 2, 0, 8)), np.zeros((1, 1, 0, 8))), 0),
    ("empty-seq-half", lambda: AxialRotaryEmbedding((4, 4), layout="half"), lambda: (torch.zeros(1, 2, 0, 8), None),
     {"positions": torch.zeros(0, 2, dtype=torch.uint8)}, lambda m, q, k: (np.zeros((1, 2, 0, 8)), None), 0),
    ("1x1-grid-prefix", lambda: AxialRotaryEmbedding((4, 4)), lambda: (rand(1, 2, 3, 8), rand(1, 1, 3, 8)),
     {"positions": grid_positions((1, 1), prefix_tokens=2)}, lambda m, q, k: (arr(q), arr(k)), 0),
    ("bfloat16", lambda: AxialRotaryEmbedding((4, 4)), lambda: (rand(1, 2, 6, 8, dtype=torch.bfloat16),
                                                                 rand(1, 1, 6, 8, dtype=torch.bfloat16)),
     {"positions": _PG}, _axial_want(arr(_PG)), 3e-2),
    ("bfloat16-half-past-table", lambda: AxialRotaryEmbedding((4, 4), layout="half", max_positions=1),
     lambda: (rand(1, 2, 6, 8, dtype=torch.bfloat16), None), {"positions": _PG}, _axial_want(arr(_PG), layout="half"), 3e-2),
    ("float64", lambda: AxialRotaryEmbedding((4, 4)), lambda: (rand(1, 2, 6, 8, dtype=torch.float64), None),
     {"positions": _PG * 1000}, _axial_want(arr(_PG) * 1000), 1e-12),
    ("seq_dim-1-non-contiguous", lambda: AxialRotaryEmbedding((4, 4)),
     lambda: (rand(1, 2, 6, 8).transpose(1, 2), rand(1, 1, 6, 8).transpose(1, 2)),
     {"positions": _PG, "seq_dim": 1}, _axial_want(arr(_PG), seq1=True), 1e-5),
    ("expanded", lambda: AxialRotaryEmbedding((4, 4)), lambda: (rand(1, 1, 6, 8).expand(2, 3, 6, 8), rand(1, 1, 6, 8).expand(2, 1, 6, 8)),
     {"positions": _PG}, _axial_want(arr(_PG)), 1e-5),
    ("head-dim-past-rotary-half", lambda: AxialRotaryEmbedding((2, 4), layout="half"), lambda: (rand(1, 2, 6, 9), None),
     {"positions": _PG}, _axial_want(arr(_PG), (2, 4), "half"), 1e-5),
    ("2-d-q", lambda: AxialRotaryEmbedding((4, 4)), lambda: (rand(6, 8), rand(6, 8)), {"positions": _PG},
     _axial_want(arr(_PG)), 1e-5),
    ("cos_sin-rows", lambda: AxialRotaryEmbedding((4, 4), layout="half"), lambda: (rand(2, 2, 6, 8), None),
     {"cos_sin": lambda m: m.cos_sin(_PNEG[:2].repeat(3, 1))}, _axial_want(arr(_PNEG[:2].repeat(3, 1)), layout="half"), 1e-5),
    ("one-axis-half", lambda: AxialRotaryEmbedding((8,), layout="half"), lambda: (rand(1, 2, 3, 8), None),
     {"positions": torch.tensor([[5], [-1], [0]])}, _axial_want(np.array([[5], [-1], [0]]), (8,), "half"), 1e-5),
    ("learned-mixed", lambda: AxialRotaryEmbedding((4, 4), learned=True, num_heads=2),
     lambda: (rand(1, 2, 6, 8), rand(1, 2, 6, 8)), {"positions": _PNEG.repeat(2, 1)[:6]}, _mixed_want(arr(_PNEG.repeat(2, 1)[:6])),
     1e-5),
]:
    _axial_qk(_id, _module, _qk, _kw, _want, _atol)
good("AxialRotaryEmbedding", "all-meta", lambda: AxialRotaryEmbedding((4, 4), device=META)(
    _QA.to(META), positions=_PG.to(META))[0], _is_meta((1, 2, 6, 8)))


# mrope_cos_sin
_INV8 = torch.tensor(ref_theta(8))                                                  # dim 8: (4,) float64
_PT = torch.arange(5).expand(3, 5)                                                  # text-only (3, S)
_PIMG = torch.tensor([[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]])   # text, 2x2 image, text
for _id, _pos, _inv, _sec, _kw, _exc, _match in [
    ("positions-(B,S)", torch.arange(5)[None].expand(2, 5), _INV8, [2, 1, 1], {}, ValueError,
     r"positions must have shape \(3, S\) or \(3, B, S\).*expand\(3, -1, -1\)"),
    ("positions-1-d", torch.arange(5), _INV8, [2, 1, 1], {}, ValueError, r"positions must have shape \(3, S\)"),
    ("positions-4-rows", torch.zeros(4, 5, dtype=torch.long), _INV8, [2, 1, 1], {}, ValueError,
     r"positions must have shape \(3, S\).*positions\[1:\]"),
    ("positions-float", _PT.float(), _INV8, [2, 1, 1], {}, TypeError, "positions must hold integers"),
    ("positions-list", _PT.tolist(), _INV8, [2, 1, 1], {}, TypeError, "positions must be an integer torch.Tensor"),
    ("positions-2**31+1", _PT + 2**31 - 3, _INV8, [2, 1, 1], {}, ValueError, f"positions {EXACT}"),
    ("inv_freq-list", _PT, [1.0, 0.1, 0.01, 0.001], [2, 1, 1], {}, TypeError, "inv_freq must be a 1-D floating tensor"),
    ("inv_freq-int", _PT, torch.arange(4), [2, 1, 1], {}, TypeError, "inv_freq must be a 1-D floating tensor"),
    ("inv_freq-2-d", _PT, _INV8[None], [2, 1, 1], {}, TypeError, "inv_freq must be a 1-D floating tensor"),
    ("inv_freq-nan", _PT, torch.tensor([1.0, NAN, 1.0, 1.0]), [2, 1, 1], {}, ValueError, "inv_freq must be finite"),
    ("inv_freq-meta", _PT, _INV8.to(META), [2, 1, 1], {}, ValueError, "inv_freq is on the meta device"),
    ("inv_freq-huge", _PT, torch.tensor([1e300, 1.0, 1.0, 1.0], dtype=torch.float64), [2, 1, 1], {}, ValueError,
     r"exceeds 2\*\*32 turns.*huge inv_freq"),
    ("mrope_section-sum", _PT, _INV8, [2, 2, 2], {}, ValueError, r"mrope_section=\[2, 2, 2\] sums to 6 .* dim/2"),
    ("mrope_section-length", _PT, _INV8, [3, 1], {}, ValueError, "mrope_section must be a sequence of three"),
    ("mrope_section-negative", _PT, _INV8, [3, 2, -1], {}, ValueError, r"mrope_section\[2\] must be >= 0"),
    ("mrope_section-float", _PT, _INV8, [2.0, 1, 1], {}, TypeError, r"mrope_section\[0\] must be an int"),
    ("mrope_section-str", _PT, _INV8, "211", {}, ValueError, "mrope_section must be a sequence of three"),
    ("mrope_section-int", _PT, _INV8, 4, {}, ValueError, "mrope_section must be a sequence of three"),
    ("mrope_interleaved-int", _PT, _INV8, [2, 1, 1], {"mrope_interleaved": 1}, TypeError, "mrope_interleaved.* must be a bool"),
    ("mrope_interleaved-unfit", _PT, _INV8, [0, 0, 4], {"mrope_interleaved": True}, ValueError,
     r"interleaved mrope_section=\[0, 0, 4\] does not fit dim=8"),
    ("attention_factor-nan", _PT, _INV8, [2, 1, 1], {"attention_factor": NAN}, ValueError, "attention_factor must be finite"),
    ("attention_factor-negative", _PT, _INV8, [2, 1, 1], {"attention_factor": -1.0}, ValueError, "attention_factor must be >= 0"),
    ("dtype-int", _PT, _INV8, [2, 1, 1], {"dtype": torch.int64}, TypeError, "dtype must be one of"),
]:
    bad("mrope_cos_sin", _id, lambda p=_pos, i=_inv, s=_sec, kw=_kw: mrope_cos_sin(p, i, s, **kw), _exc, _match)
for _id, _make, _sec, _kw, _want, _atol in [
    ("text-only-is-rope", lambda: _PT, [2, 1, 1], {}, lambda p: ref_cos_sin(np.arange(5), 8), 1e-6),
    ("image", lambda: _PIMG, [2, 1, 1], {}, lambda p: tuple(f(ref_mrope_angles(p, 8, (2, 1, 1))) for f in (np.cos, np.sin)), 1e-6),
    ("per-row-int16", lambda: torch.stack([_PIMG, _PIMG.flip(1)], 1).to(torch.int16), [1, 2, 1], {},
     lambda p: tuple(f(ref_mrope_angles(p, 8, (1, 2, 1))) for f in (np.cos, np.sin)), 1e-6),
    ("uint8", lambda: (_PIMG + 250).to(torch.uint8), [2, 1, 1], {},
     lambda p: tuple(f(ref_mrope_angles(p, 8, (2, 1, 1))) for f in (np.cos, np.sin)), 1e-6),
    ("negative", lambda: _PIMG - 3, [2, 1, 1], {}, lambda p: tuple(f(ref_mrope_angles(p, 8, (2, 1, 1))) for f in (np.cos, np.sin)),
     1e-6),
    ("expanded", lambda: _PIMG[:, None].expand(3, 2, 7), [2, 1, 1], {},
     lambda p: tuple(f(ref_mrope_angles(p, 8, (2, 1, 1))) for f in (np.cos, np.sin)), 1e-6),
    ("non-contiguous", lambda: _PIMG.t().contiguous().t(), [0, 2, 2], {},
     lambda p: tuple(f(ref_mrope_angles(p, 8, (0, 2, 2))) for f in (np.cos, np.sin)), 1e-6),
    ("one-axis-sections", lambda: _PIMG, [4, 0, 0], {}, lambda p: ref_cos_sin(arr(_PIMG)[0], 8), 1e-6),
    ("interleaved", lambda: _PIMG, [2, 1, 1], {"mrope_interleaved": True},
     lambda p: tuple(f(ref_mrope_angles(p, 8, (2, 1, 1), interleaved=True)) for f in (np.cos, np.sin)), 1e-6),
    ("attention_factor-float64", lambda: _PIMG, [2, 1, 1], {"attention_factor": 2, "dtype": torch.float64},
     lambda p: tuple(2 * f(ref_mrope_angles(p, 8, (2, 1, 1))) for f in (np.cos, np.sin)), 1e-13),
    ("bfloat16", lambda: _PIMG, [2, 1, 1], {"dtype": torch.bfloat16},
     lambda p: tuple(f(ref_mrope_angles(p, 8, (2, 1, 1))) for f in (np.cos, np.sin)), 4e-3),
    ("empty", lambda: torch.zeros(3, 0, dtype=torch.long), [2, 1, 1], {}, lambda p: (np.zeros((0, 4)),) * 2, 0),
    ("empty-per-row", lambda: torch.zeros(3, 2, 0, dtype=torch.long), [2, 1, 1], {}, lambda p: (np.zeros((2, 0, 4)),) * 2, 0),
]:
    good("mrope_cos_sin", _id, lambda m=_make, s=_sec, kw=_kw: (mrope_cos_sin(m(), _INV8, s, **kw), m()),
         lambda r, w=_want, a=_atol: close(r[0], w(arr(r[1])), atol=a, rtol=max(a, 1e-6)))
good("mrope_cos_sin", "inv_freq-float32", lambda: mrope_cos_sin(_PT, _INV8.float(), [2, 1, 1]),
     lambda r: close(r, ref_cos_sin_theta(np.arange(5), _INV8.float().double().numpy())))
good("mrope_cos_sin", "meta", lambda: mrope_cos_sin(_PIMG.to(META), _INV8, [2, 1, 1]), _is_meta(((7, 4), (7, 4))))


# MultimodalRotaryEmbedding
_QM = rand(1, 2, 7, 8, seed=31)
for _id, _kw, _exc, _match in [
    ("dim-odd", {"dim": 7, "mrope_section": [1, 1, 1]}, ValueError, "dim .* must be even"),
    ("dim-float", {"dim": 8.0}, TypeError, "dim must be an int"),
    ("dim-0", {"dim": 0, "mrope_section": [0, 0, 0]}, ValueError, "dim must be >= 2"),
    ("mrope_section-sum", {"mrope_section": [2, 2, 2]}, ValueError, "mrope_section=.* sums to 6"),
    ("mrope_section-none", {"mrope_section": None}, ValueError, "mrope_section must be a sequence of three"),
    ("mrope_section-float", {"mrope_section": [2, 1.0, 1]}, TypeError, r"mrope_section\[1\] must be an int"),
    ("max_seq_len-0", {"max_seq_len": 0}, ValueError, "max_seq_len must be >= 1"),
    ("max_seq_len-float", {"max_seq_len": 4.0}, TypeError, "max_seq_len must be an int"),
    ("base-nan", {"base": NAN}, ValueError, "base must be finite"),
    ("base-negative", {"base": -1.0}, ValueError, "base must be > 0"),
    ("base-1", {"base": 1.0}, ValueError, "base must not be 1"),
    ("base-tiny", {"base": 1e-300}, ValueError, r"exceeds 2\*\*32 turns"),
    ("layout", {"layout": "neox"}, ValueError, "layout must be one of"),
    ("backend", {"backend": "cuda"}, ValueError, "backend must be one of"),
    ("mrope_interleaved-int", {"mrope_interleaved": 1}, TypeError, "mrope_interleaved.* must be a bool"),
    ("scaling-length-dependent", {"scaling": DynamicNTKScaling(2.0, 16)}, ValueError,
     "scaling rules whose frequencies do not depend on the sequence length"),
    # an unknown scaling object is refused with the fix, as by RotaryEmbedding (today: AttributeError)
    ("scaling-str", {"scaling": "linear"}, TypeError, "scaling must be None or a posenc scaling rule"),
]:
    bad("MultimodalRotaryEmbedding", f"init-{_id}",
        lambda kw=_kw: MultimodalRotaryEmbedding(**{"dim": 8, "mrope_section": [2, 1, 1], **kw}), _exc, _match)
for _id, _call, _exc, _match in [
    ("positions-(B,S)", lambda m: m(_QM, positions=torch.arange(7)[None]), ValueError,
     r"positions must have shape \(3, S\) or \(3, B, S\)"),
    ("positions-1-d", lambda m: m(_QM, positions=torch.arange(7)), ValueError, r"positions must have shape \(3, S\)"),
    ("positions-4-rows", lambda m: m(_QM, positions=torch.zeros(4, 1, 7, dtype=torch.long)), ValueError, r"positions\[1:\]"),
    ("positions-float", lambda m: m(_QM, positions=_PIMG.float()), TypeError, "positions must hold integers"),
    ("positions-wrong-S", lambda m: m(_QM, positions=_PIMG[:, :6]), ValueError,
     r"positions must have shape \(3, S\) or \(3, B, S\) with B=1, S=7; got \(3, 6\)"),
    ("positions-wrong-B", lambda m: m(_QM, positions=_PIMG[:, None].expand(3, 2, 7)), ValueError,
     r"positions must have shape .* B=1, S=7; got \(3, 2, 7\)"),
    ("positions-batched-for-2-d-q", lambda m: m(rand(7, 8), positions=_PIMG[:, None]), ValueError,
     r"positions must have shape \(3, S\), S=7"),
    ("positions-meta", lambda m: m(_QM, positions=_PIMG.to(META)), ValueError, "positions are on meta but q on cpu"),
    ("positions-2**31+1", lambda m: m(_QM, positions=_PIMG + 2**31 - 3), ValueError, f"positions {EXACT}"),
    ("positions-and-offset", lambda m: m(_QM, positions=_PIMG, offset=1), ValueError, "either positions or offset"),
    ("offset-float", lambda m: m(_QM, offset=1.0), TypeError, "offset must be an int"),
    ("offset-bool", lambda m: m(_QM, offset=True), TypeError, "offset must be an int"),
    ("offset-2**31", lambda m: m(_QM, offset=2**31), ValueError, f"positions {EXACT}"),
    ("q-meta", lambda m: m(_QM.to(META), positions=_PIMG.to(META)), ValueError, "q is on meta but the tables on cpu"),
    ("module-meta", lambda m: MultimodalRotaryEmbedding(8, [2, 1, 1], device=META)(_QM, positions=_PIMG), ValueError,
     "q is on cpu but the tables on meta.*reset_buffers"),
    ("q-int", lambda m: m(_QM.long(), positions=_PIMG), TypeError, "q must be a floating tensor"),
    ("q-narrower-than-rotary", lambda m: m(_QM[..., :6], positions=_PIMG), ValueError, "q has head dim 6 < rotary dim 8"),
    ("k-batch", lambda m: m(_QM, rand(2, 1, 7, 8), positions=_PIMG), ValueError, "k .* must match q"),
    ("inplace-int", lambda m: m(_QM.clone(), positions=_PIMG, inplace=1), TypeError, "inplace must be a bool"),
    ("inplace-expanded", lambda m: m(_QM[:, :1].expand(1, 2, 7, 8), positions=_PIMG, inplace=True), ValueError,
     "q has elements that share memory"),
    ("assume_in_table-str", lambda m: m(_QM, positions=_PIMG, assume_in_table="y"), TypeError, "assume_in_table must be a bool"),
    ("assume-broken-promise", lambda m: MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=2)(
        _QM, positions=_PIMG, assume_in_table=True), ValueError, r"positions must lie in \[0, 2\) .*assume_(in_table|valid)=True"),
    # a negative position promised in the table must not wrap around to the table's last rows (torch.take)
    ("assume-broken-promise-negative", lambda m: MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=8)(
        _QM, positions=_PIMG - 1, assume_in_table=True), ValueError, r"positions must lie in \[0, 8\) .*assume_in_table=True"),
    ("cos_sin-positions", lambda m: m.cos_sin(torch.arange(7)), ValueError, r"positions must have shape \(3, S\)"),
    ("cos_sin-dtype", lambda m: m.cos_sin(_PIMG, dtype=torch.int32), TypeError, "dtype must be one of"),
    ("cos_sin-assume-int", lambda m: m.cos_sin(_PIMG, assume_in_table=1), TypeError, "assume_in_table must be a bool"),
    ("from_hf_config-none", lambda m: MultimodalRotaryEmbedding.from_hf_config(None), TypeError, "config must be a transformers"),
    ("from_hf_config-1-d", lambda m: MultimodalRotaryEmbedding.from_hf_config({"head_dim": 8}), ValueError,
     "this config has no mrope_section"),
]:
    bad("MultimodalRotaryEmbedding", _id, lambda c=_call: c(MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=16)), _exc, _match)


def _mrope_qk(case_id, make_module, make_qk, kw, want, atol=1e-5):
    def thunk():
        q, k = make_qk()
        q0, k0 = q.detach().clone(), None if k is None else k.detach().clone()
        return make_module()(q, k, **kw), q0, k0

    def check(r):
        (qo, ko), q0, k0 = r
        _check_rotated(qo, ko, q0, *want(q0, k0), atol)
    good("MultimodalRotaryEmbedding", case_id, thunk, check)


def _mrope_want(p3, section=(2, 1, 1), layout="half", interleaved=False, seq1=False):
    def one(t):
        if t is None:
            return None
        if seq1:
            return np.swapaxes(ref_mrope(np.swapaxes(arr(t), 1, 2), p3, 8, section, layout, interleaved), 1, 2)
        return ref_mrope(t, p3, 8, section, layout, interleaved)
    return lambda q, k: (one(q), one(k))


_MR = MultimodalRotaryEmbedding
for _id, _module, _qk, _kw, _want, _atol in [
    ("text-only-is-rope", lambda: _MR(8, [2, 1, 1]), lambda: (rand(1, 2, 5, 8), rand(1, 1, 5, 8)), {"positions": _PT},
     lambda q, k: (ref_rope(q, np.arange(5)), ref_rope(k, np.arange(5))), 1e-5),
    ("default-positions-offset", lambda: _MR(8, [1, 2, 1], max_seq_len=4), lambda: (rand(1, 2, 3, 8), None), {"offset": 6},
     lambda q, k: (ref_rope(q, np.arange(6, 9)), None), 1e-5),
    ("offset-negative", lambda: _MR(8, [2, 1, 1]), lambda: (rand(1, 2, 3, 8), None), {"offset": -2},
     lambda q, k: (ref_rope(q, np.arange(-2, 1)), None), 1e-5),
    ("image", lambda: _MR(8, [2, 1, 1]), lambda: (rand(1, 2, 7, 8), rand(1, 1, 7, 8)), {"positions": _PIMG},
     _mrope_want(arr(_PIMG)), 1e-5),
    ("batch-shared-(3,1,S)", lambda: _MR(8, [2, 1, 1]), lambda: (rand(3, 2, 7, 8), rand(3, 1, 7, 8)),
     {"positions": _PIMG[:, None]}, _mrope_want(arr(_PIMG)), 1e-5),
    ("per-row-int16", lambda: _MR(8, [1, 1, 2]), lambda: (rand(2, 2, 7, 8), None),
     {"positions": torch.stack([_PIMG, _PIMG.flip(1)], 1).to(torch.int16)},
     _mrope_want(np.stack([arr(_PIMG), arr(_PIMG)[:, ::-1]], 1), (1, 1, 2)), 1e-5),
    ("uint8-assumed", lambda: _MR(8, [2, 1, 1]), lambda: (rand(1, 2, 7, 8), None),
     {"positions": _PIMG.to(torch.uint8), "assume_in_table": True}, _mrope_want(arr(_PIMG)), 1e-5),
    ("past-table-negative", lambda: _MR(8, [2, 1, 1], max_seq_len=2), lambda: (rand(1, 2, 7, 8), None),
     {"positions": _PIMG * 3 - 5}, _mrope_want(arr(_PIMG) * 3 - 5), 1e-5),
    ("empty-seq", lambda: _MR(8, [2, 1, 1]), lambda: (torch.zeros(1, 2, 0, 8), torch.zeros(1, 1, 0, 8)),
     {"positions": torch.zeros(3, 0, dtype=torch.long)}, lambda q, k: (np.zeros((1, 2, 0, 8)), np.zeros((1, 1, 0, 8))), 0),
    ("empty-seq-offset", lambda: _MR(8, [2, 1, 1]), lambda: (torch.zeros(1, 2, 0, 8), None), {"offset": 2**31},
     lambda q, k: (np.zeros((1, 2, 0, 8)), None), 0),
    ("bfloat16", lambda: _MR(8, [2, 1, 1]), lambda: (rand(1, 2, 7, 8, dtype=torch.bfloat16), rand(1, 1, 7, 8, dtype=torch.bfloat16)),
     {"positions": _PIMG}, _mrope_want(arr(_PIMG)), 3e-2),
    ("float64", lambda: _MR(8, [2, 1, 1], max_seq_len=2), lambda: (rand(1, 2, 7, 8, dtype=torch.float64), None),
     {"positions": _PIMG * 1000}, _mrope_want(arr(_PIMG) * 1000), 1e-12),
    ("seq_dim-1-non-contiguous", lambda: _MR(8, [2, 1, 1]),
     lambda: (rand(1, 2, 7, 8).transpose(1, 2), rand(1, 1, 7, 8).transpose(1, 2)),
     {"positions": _PIMG, "seq_dim": 1}, _mrope_want(arr(_PIMG), seq1=True), 1e-5),
    ("expanded", lambda: _MR(8, [2, 1, 1]), lambda: (rand(1, 1, 7, 8).expand(2, 3, 7, 8), rand(1, 1, 7, 8).expand(2, 1, 7, 8)),
     {"positions": _PIMG[:, None].expand(3, 2, 7)}, _mrope_want(arr(_PIMG)), 1e-5),
    ("interleaved-layout", lambda: _MR(8, [2, 1, 1], layout="interleaved"), lambda: (rand(1, 2, 7, 8), None),
     {"positions": _PIMG}, _mrope_want(arr(_PIMG), layout="interleaved"), 1e-5),
    ("mrope_interleaved", lambda: _MR(8, [2, 1, 1], mrope_interleaved=True), lambda: (rand(1, 2, 7, 8), None),
     {"positions": _PIMG}, _mrope_want(arr(_PIMG), interleaved=True), 1e-5),
    ("head-dim-past-rotary", lambda: _MR(8, [2, 1, 1]), lambda: (rand(1, 2, 7, 11), None), {"positions": _PIMG},
     _mrope_want(arr(_PIMG)), 1e-5),
    ("2-d-q", lambda: _MR(8, [2, 1, 1]), lambda: (rand(7, 8), rand(7, 8)), {"positions": _PIMG}, _mrope_want(arr(_PIMG)), 1e-5),
]:
    _mrope_qk(_id, _module, _qk, _kw, _want, _atol)
good("MultimodalRotaryEmbedding", "all-meta", lambda: _MR(8, [2, 1, 1], device=META)(
    _QM.to(META), positions=_PIMG.to(META))[0], _is_meta((1, 2, 7, 8)))
good("MultimodalRotaryEmbedding", "cos_sin-text-is-rope", lambda: _MR(8, [2, 1, 1], max_seq_len=2).cos_sin(
    torch.tensor([[-1, 9]]).expand(3, 2)), lambda r: close(r, ref_cos_sin(np.array([-1, 9]), 8)))


# mrope_positions: rows of (t, h, w) positions, written out by hand from the rule (text p, p+1, ...; an image
# (T, H, W) with merge m at p: t = p + k, h = p + row, w = p + col over (T, H/m, W/m); the next text at p + max(H, W)/m)
_IDS7 = torch.zeros(1, 7, dtype=torch.long)
_TYPES7 = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])
_G44 = torch.tensor([[1, 4, 4]])
for _id, _call, _exc, _match in [
    ("input_ids-list", lambda: mrope_positions([[0] * 7]), ValueError, r"input_ids must be a \(B, S\) tensor"),
    ("input_ids-1-d", lambda: mrope_positions(torch.zeros(7, dtype=torch.long)), ValueError,
     r"input_ids must be a \(B, S\) tensor.*input_ids\[None\]"),
    ("image-tokens-without-grid", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7), ValueError,
     "row 0 has image tokens at real positions 2..5 but image_grid_thw has only 0 grid"),
    ("image-token-id-without-grid", lambda: mrope_positions(torch.tensor([[5, 9, 9, 9, 9]]), image_token_id=9), ValueError,
     "image_grid_thw has only 0 grid"),
    ("grid-without-image-tokens", lambda: mrope_positions(_IDS7, image_grid_thw=_G44), ValueError,
     r"image_grid_thw has 1 grid\(s\) but the image tokens use 0"),
    ("video-tokens-without-grid", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7 * 2, image_grid_thw=_G44),
     ValueError, "video_grid_thw has only 0 grid"),
    ("image_grid_thw-float", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7, image_grid_thw=_G44.float()),
     TypeError, "image_grid_thw must hold integers"),
    ("image_grid_thw-list", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7, image_grid_thw=[[1, 4, 4]]),
     TypeError, "image_grid_thw must be an integer torch.Tensor"),
    ("image_grid_thw-1-d", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7, image_grid_thw=_G44[0]), ValueError,
     r"image_grid_thw must have shape \(N, 3\)"),
    ("video_grid_thw-2-columns", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7 * 2, video_grid_thw=_G44[:, 1:]),
     ValueError, r"video_grid_thw must have shape \(N, 3\)"),
    ("image_grid_thw-T-0", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7, image_grid_thw=torch.tensor([[0, 4, 4]])),
     ValueError, r"image_grid_thw\[0\] = \[0, 4, 4\] is not a \(T, H, W\) patch grid"),
    ("image_grid_thw-not-merge-multiple", lambda: mrope_positions(
        _IDS7, mm_token_type_ids=_TYPES7, image_grid_thw=torch.tensor([[1, 3, 4]])), ValueError,
     r"image_grid_thw\[0\] = \[1, 3, 4\] .* spatial_merge_size=2"),
    ("grid-larger-than-run", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7, image_grid_thw=torch.tensor([[1, 4, 6]])),
     ValueError, r"the run of 4 image tokens .* does not match image_grid_thw\[0\]"),
    ("mm_token_type_ids-float", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7.float(), image_grid_thw=_G44),
     TypeError, "mm_token_type_ids must hold integers"),
    ("mm_token_type_ids-list", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7.tolist()), TypeError,
     "mm_token_type_ids must be an integer torch.Tensor"),
    ("mm_token_type_ids-shape", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7[:, :6], image_grid_thw=_G44),
     ValueError, r"mm_token_type_ids must have the shape of input_ids \(1, 7\)"),
    ("mm_token_type_ids-3", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7 * 3), ValueError,
     r"mm_token_type_ids must be 0 \(text\), 1 \(image\) or 2 \(video\), got 3"),
    ("mm_token_type_ids-negative", lambda: mrope_positions(_IDS7, mm_token_type_ids=-_TYPES7), ValueError,
     "mm_token_type_ids must be 0 .* got -1"),
    ("types-and-token-ids", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7, image_grid_thw=_G44, image_token_id=5),
     ValueError, "either mm_token_type_ids or image_token_id/video_token_id"),
    ("image_token_id-float", lambda: mrope_positions(_IDS7, image_token_id=5.0), TypeError, "image_token_id must be an int"),
    ("video_token_id-bool", lambda: mrope_positions(_IDS7, video_token_id=True), TypeError, "video_token_id must be an int"),
    ("attention_mask-shape", lambda: mrope_positions(_IDS7, attention_mask=torch.ones(1, 6)), ValueError,
     r"attention_mask must have the shape of input_ids \(1, 7\)"),
    ("attention_mask-list", lambda: mrope_positions(_IDS7, attention_mask=[[1] * 7]), ValueError,
     "attention_mask must have the shape of input_ids"),
    ("spatial_merge_size-0", lambda: mrope_positions(_IDS7, spatial_merge_size=0), ValueError, "spatial_merge_size must be >= 1"),
    ("spatial_merge_size-float", lambda: mrope_positions(_IDS7, spatial_merge_size=2.0), TypeError,
     "spatial_merge_size must be an int"),
    ("spatial_merge_size-bool", lambda: mrope_positions(_IDS7, spatial_merge_size=True), TypeError,
     "spatial_merge_size must be an int"),
    ("tokens_per_second-0", lambda: mrope_positions(_IDS7, tokens_per_second=0), ValueError, "tokens_per_second must be >= 1"),
    ("tokens_per_second-nan", lambda: mrope_positions(_IDS7, tokens_per_second=NAN), ValueError,
     "tokens_per_second must be finite"),
    ("tokens_per_second-negative", lambda: mrope_positions(_IDS7, tokens_per_second=-2.0), ValueError,
     "tokens_per_second must be > 0"),
    ("tokens_per_second-str", lambda: mrope_positions(_IDS7, tokens_per_second="2"), TypeError,
     "tokens_per_second must be a real number"),
    ("tokens_per_second-bool", lambda: mrope_positions(_IDS7, tokens_per_second=True), TypeError, "tokens_per_second must be"),
    ("second_per_grid_ts-without-tokens_per_second", lambda: mrope_positions(_IDS7, second_per_grid_ts=[1.0]), ValueError,
     "second_per_grid_ts .* needs tokens_per_second"),
    ("second_per_grid_ts-short", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7 * 2, video_grid_thw=_G44,
                                                           tokens_per_second=2, second_per_grid_ts=[]), ValueError,
     "second_per_grid_ts has 0 entries for 1 videos"),
    # the seconds per grid must be checked like the other numbers (today: NaN turns into a garbage position,
    # a str raises AttributeError and an int a TypeError that names nothing)
    ("second_per_grid_ts-nan", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7 * 2, video_grid_thw=_G44,
                                                         tokens_per_second=2, second_per_grid_ts=[NAN]), ValueError,
     r"second_per_grid_ts\[0\] must be finite"),
    ("second_per_grid_ts-negative", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7 * 2,
                                                              video_grid_thw=torch.tensor([[2, 2, 4]]), tokens_per_second=2,
                                                              second_per_grid_ts=[-1.0]), ValueError,
     r"second_per_grid_ts\[0\] must be > 0"),
    ("second_per_grid_ts-str", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7 * 2, video_grid_thw=_G44,
                                                         tokens_per_second=2, second_per_grid_ts=["1"]), TypeError,
     r"second_per_grid_ts\[0\] must be a real number"),
    ("second_per_grid_ts-int", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7 * 2, video_grid_thw=_G44,
                                                         tokens_per_second=2, second_per_grid_ts=5), TypeError,
     "second_per_grid_ts must be a sequence"),
    # the rule reads token types and grids on the host: a meta tensor holds no values (today: NotImplementedError)
    ("input_ids-meta", lambda: mrope_positions(torch.zeros(1, 7, dtype=torch.long, device=META)), ValueError,
     "input_ids is on the meta device"),
    ("mm_token_type_ids-meta", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7.to(META), image_grid_thw=_G44),
     ValueError, "mm_token_type_ids is on the meta device"),
    ("image_grid_thw-meta", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7, image_grid_thw=_G44.to(META)),
     ValueError, "image_grid_thw is on the meta device"),
    ("attention_mask-meta", lambda: mrope_positions(_IDS7, attention_mask=torch.ones(1, 7, device=META)), ValueError,
     "attention_mask is on the meta device"),
]:
    bad("mrope_positions", _id, _call, _exc, _match)


def _mrope_positions_check(want_pos, want_delta, real=None):
    """Positions (3, B, S) equal ``want_pos`` on the real tokens (``real``: (B, S) bool, default all), deltas (B, 1)."""
    def check(r):
        pos, delta = r
        want = np.asarray(want_pos, dtype=np.int64)
        assert pos.dtype == torch.int64 and tuple(pos.shape) == want.shape, (pos.dtype, pos.shape)
        mask = np.ones(want.shape[1:], bool) if real is None else np.asarray(real, bool)
        np.testing.assert_array_equal(pos.numpy()[:, mask], want[:, mask])
        close(delta, np.asarray(want_delta, dtype=np.int64).reshape(-1, 1))
    return check


_T7 = [[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]]   # text, text, 2x2 image, text
for _id, _call, _want, _delta, _real in [
    ("text-only", lambda: mrope_positions(torch.zeros(2, 4, dtype=torch.long)), [[list(range(4))] * 2] * 3, [0, 0], None),
    ("empty-seq", lambda: mrope_positions(torch.zeros(2, 0, dtype=torch.long)), np.zeros((3, 2, 0)), [0, 0], None),
    ("empty-batch", lambda: mrope_positions(torch.zeros(0, 3, dtype=torch.long)), np.zeros((3, 0, 3)), np.zeros((0, 1)), None),
    ("all-padding", lambda: mrope_positions(torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.zeros(1, 3)),
     np.zeros((3, 1, 3)), [0], [[False] * 3]),
    ("left-padding-bool-mask", lambda: mrope_positions(torch.zeros(1, 5, dtype=torch.long), attention_mask=torch.tensor(
        [[False, False, True, True, True]])), [[[0, 0, 0, 1, 2]]] * 3, [0], [[False, False, True, True, True]]),
    ("image-uint8-types-int16-grid", lambda: mrope_positions(_IDS7, mm_token_type_ids=_TYPES7.to(torch.uint8),
                                                               image_grid_thw=_G44.to(torch.int16)),
     [[row] for row in _T7], [-2], None),
    ("image-from-token-id", lambda: mrope_positions(torch.tensor([[7, 7, 9, 9, 9, 9, 7]]), image_token_id=9,
                                                      image_grid_thw=_G44), [[row] for row in _T7], [-2], None),
    ("image-padded-right", lambda: mrope_positions(torch.zeros(1, 9, dtype=torch.long), mm_token_type_ids=torch.tensor(
        [[0, 0, 1, 1, 1, 1, 0, 0, 0]]), image_grid_thw=_G44, attention_mask=torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0, 0]])),
     [[row + [0, 0]] for row in _T7], [-2], [[True] * 7 + [False] * 2]),
    ("1x1-image-merge-1", lambda: mrope_positions(torch.zeros(1, 3, dtype=torch.long), mm_token_type_ids=torch.tensor(
        [[1, 0, 0]]), image_grid_thw=torch.tensor([[1, 1, 1]]), spatial_merge_size=1), [[[0, 1, 2]]] * 3, [0], None),
    ("two-images-in-one-run", lambda: mrope_positions(torch.zeros(1, 3, dtype=torch.long), mm_token_type_ids=torch.tensor(
        [[1, 1, 0]]), image_grid_thw=torch.tensor([[1, 2, 2], [1, 2, 2]])), [[[0, 1, 2]]] * 3, [0], None),
    ("grids-numbered-across-batch", lambda: mrope_positions(torch.zeros(2, 2, dtype=torch.long), mm_token_type_ids=torch.tensor(
        [[1, 0], [0, 1]]), image_grid_thw=torch.tensor([[1, 2, 2], [1, 2, 2]])), [[[0, 1], [0, 1]]] * 3, [0, 0], None),
    # a video (T, H, W) = (2, 2, 2), merge 2: two tokens at t = p + trunc(k * 2 * 1.5) = p, p + 3; then text at p + 1
    ("video-tokens_per_second", lambda: mrope_positions(torch.zeros(1, 4, dtype=torch.long), mm_token_type_ids=torch.tensor(
        [[0, 2, 2, 0]]), video_grid_thw=torch.tensor([[2, 2, 2]]), tokens_per_second=2, second_per_grid_ts=[1.5]),
     [[[0, 1, 4, 2]], [[0, 1, 1, 2]], [[0, 1, 1, 2]]], [1], None),
    ("video-qwen2-vl", lambda: mrope_positions(torch.zeros(1, 4, dtype=torch.long), mm_token_type_ids=torch.tensor(
        [[0, 2, 2, 0]]), video_grid_thw=torch.tensor([[2, 2, 2]])), [[[0, 1, 2, 2]], [[0, 1, 1, 2]], [[0, 1, 1, 2]]], [-1], None),
]:
    good("mrope_positions", _id, _call, _mrope_positions_check(_want, _delta, _real))
good("mrope_positions", "input_ids-on-meta-with-types", lambda: mrope_positions(
    torch.zeros(1, 7, dtype=torch.long, device=META), mm_token_type_ids=_TYPES7, image_grid_thw=_G44),
    lambda r: (r[0].is_meta and r[0].shape == (3, 1, 7) and r[1].is_meta) or pytest.fail("not meta results"))


# mrope_from_hf, mrope_vision_from_hf
_QCFG = {"hidden_size": 64, "num_attention_heads": 8, "rope_theta": 1e6,
         "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}}
for _id, _cfg, _exc, _match in [
    ("config-none", None, TypeError, "config must be a transformers PretrainedConfig or a dict"),
    ("config-list", [("head_dim", 8)], TypeError, "config must be a transformers PretrainedConfig or a dict"),
    ("no-mrope_section", {"head_dim": 8, "rope_theta": 1e4}, ValueError, "this config has no mrope_section"),
    ("text_config-not-a-dict", {"text_config": [1]}, ValueError, "this config has no mrope_section"),
    ("head_dim-missing", {"rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}}, ValueError,
     "config needs head_dim, or hidden_size and num_attention_heads"),
    ("num_attention_heads-missing", {"hidden_size": 64, "mrope_section": [2, 1, 1]}, ValueError, "config needs head_dim"),
    ("hidden_size-str", {"hidden_size": "64", "num_attention_heads": 8, "mrope_section": [2, 1, 1]}, TypeError,
     "hidden_size must be an int"),
    ("head_dim-0", {"head_dim": 0, "mrope_section": [0, 0, 0]}, ValueError, "head_dim must be >= 2"),
    ("mrope_section-sum", {**_QCFG, "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 2]}}, ValueError,
     r"mrope_section=\[2, 2, 2\] sums to 6"),
    ("mrope_section-vs-partial", {**_QCFG, "partial_rotary_factor": 0.5}, ValueError, "sums to 4 .* dim=4"),
    ("mrope_section-str", {**_QCFG, "rope_scaling": {"type": "mrope", "mrope_section": "211"}}, ValueError,
     "mrope_section must be a sequence of three"),
    ("mrope_section-float", {**_QCFG, "rope_scaling": {"type": "mrope", "mrope_section": [2.0, 1, 1]}}, TypeError,
     r"mrope_section\[0\] must be an int"),
    ("mrope_interleaved-str", {**_QCFG, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1], "mrope_interleaved": "yes"}},
     ValueError, "mrope_interleaved must be true or false"),
    ("rope_theta-nan", {**_QCFG, "rope_theta": NAN}, ValueError, "rope_theta must be finite"),
    ("rope_theta-0", {**_QCFG, "rope_theta": 0}, ValueError, "rope_theta must be > 0"),
    ("rope_theta-str", {**_QCFG, "rope_theta": "1e6"}, TypeError, "rope_theta must be a real number"),
    ("rope_type-unknown", {**_QCFG, "rope_scaling": {"type": "mrope2", "mrope_section": [2, 1, 1]}}, ValueError,
     "unknown rope scaling type 'mrope2'"),
    ("rope_scaling-list", {**_QCFG, "rope_scaling": [1]}, ValueError, "rope_scaling/rope_parameters must be a dict"),
    ("linear-factor-missing", {**_QCFG, "rope_scaling": {"type": "linear", "mrope_section": [2, 1, 1]}}, ValueError,
     "rope scaling 'linear' needs 'factor'"),
]:
    bad("mrope_from_hf", _id, lambda c=_cfg: mrope_from_hf(c), _exc, _match)
for _id, _cfg, _want in [
    ("transformers-4", _QCFG, (1e6, 8, None, (2, 1, 1), False)),
    ("text_config", {"model_type": "qwen2_vl", "text_config": _QCFG}, (1e6, 8, None, (2, 1, 1), False)),
    ("transformers-5-interleaved", {"head_dim": 8, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5,
                                                                       "mrope_section": [2, 1, 1], "mrope_interleaved": True}},
     (5e5, 8, None, (2, 1, 1), True)),
    ("top-level-section-zero-counts", {"head_dim": 8, "mrope_section": [4, 0, 0]}, (1e4, 8, None, (4, 0, 0), False)),
    ("linear-beside-sections", {"head_dim": 8, "rope_scaling": {"type": "linear", "factor": 2, "mrope_section": (1, 2, 1)}},
     (1e4, 8, LinearScaling(2.0), (1, 2, 1), False)),
]:
    good("mrope_from_hf", _id, lambda c=_cfg: mrope_from_hf(c),
         lambda got, w=_want: (got == w and type(got[0]) is float) or pytest.fail(f"{got} != {w}"))


class _ConfigObject:
    """A stand-in for a PretrainedConfig: read through ``to_dict()``."""

    def __init__(self, **kw):
        self._kw = kw

    def to_dict(self):
        return dict(self._kw)


for _id, _cfg, _exc, _match in [
    ("config-none", None, TypeError, "config must be a transformers PretrainedConfig or a dict"),
    ("qwen3_vl", {"model_type": "qwen3_vl"}, ValueError, "model_type='qwen3_vl' places video frames with timestamps"),
    ("spatial_merge_size-0", {"vision_config": {"spatial_merge_size": 0}}, ValueError, "spatial_merge_size must be >= 1"),
    ("spatial_merge_size-float", {"vision_config": {"spatial_merge_size": 2.0}}, TypeError, "spatial_merge_size must be an int"),
    ("spatial_merge_size-null", {"vision_config": {"spatial_merge_size": None}}, TypeError, "spatial_merge_size must be an int"),
    ("tokens_per_second-0", {"vision_config": {"tokens_per_second": 0}}, ValueError, "tokens_per_second must be >= 1"),
    ("tokens_per_second-nan", {"vision_config": {"tokens_per_second": NAN}}, ValueError, "tokens_per_second must be finite"),
    ("tokens_per_second-str", {"vision_config": {"tokens_per_second": "2"}}, TypeError, "tokens_per_second must be a real number"),
    ("tokens_per_second-bool", {"vision_config": {"tokens_per_second": True}}, TypeError, "tokens_per_second must be a real"),
    # the message must name vision_config, not the config itself
    ("vision_config-list", {"vision_config": [1]}, TypeError, "vision_config must be"),
]:
    bad("mrope_vision_from_hf", _id, lambda c=_cfg: mrope_vision_from_hf(c), _exc, _match)
for _id, _cfg, _want in [
    ("empty", {}, {"spatial_merge_size": 2, "tokens_per_second": None}),
    ("model_type-unhashable", {"model_type": ["qwen3_vl"]}, {"spatial_merge_size": 2, "tokens_per_second": None}),
    ("tokens_per_second-top-level", {"tokens_per_second": 4}, {"spatial_merge_size": 2, "tokens_per_second": 4}),
    ("tokens_per_second-float", {"vision_config": {"spatial_merge_size": 1, "tokens_per_second": 2.5}},
     {"spatial_merge_size": 1, "tokens_per_second": 2.5}),
    ("config-object", _ConfigObject(vision_config=_ConfigObject(spatial_merge_size=4, tokens_per_second=2)),
     {"spatial_merge_size": 4, "tokens_per_second": 2}),
]:
    good("mrope_vision_from_hf", _id, lambda c=_cfg: mrope_vision_from_hf(c),
         lambda got, w=_want: (got == w) or pytest.fail(f"{got} != {w}"))


# resize_position_embedding: an independent recipe, reshape + torch.nn.functional.interpolate(align_corners=False)
def ref_resize_2d(table: torch.Tensor, new, old, prefix: int, mode: str = "bicubic", antialias: bool = True) -> torch.Tensor:
    t = table.reshape(-1, table.shape[-1])                                     # (N, C)
    work = torch.float64 if t.dtype == torch.float64 else torch.float32
    grid = t[prefix:].to(work).T.reshape(1, -1, *old)                          # (1, C, H, W)
    kw = {"align_corners": False} if mode in ("bicubic", "bilinear") else {}
    out = torch.nn.functional.interpolate(grid, size=new, mode=mode, antialias=antialias, **kw)
    out = out.reshape(t.shape[1], -1).T.to(t.dtype)                            # (H' * W', C)
    return torch.cat([t[:prefix], out]).reshape(*table.shape[:-2], -1, table.shape[-1])


def ref_linear_1d(values: np.ndarray, new: int) -> np.ndarray:
    """Linear resampling (align_corners=False) of ``values (N, C)`` to ``new`` rows, from the formula."""
    n = values.shape[0]
    src = np.clip((np.arange(new) + 0.5) * n / new - 0.5, 0, n - 1)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, n - 1)
    frac = (src - lo)[:, None]
    return values[lo] * (1 - frac) + values[hi] * frac


_TAB = rand(1 + 4, 3, seed=41)                                                      # class token + a 2x2 grid
for _id, _call, _exc, _match in [
    ("table-list", lambda: resize_position_embedding([[0.0] * 3] * 5, (3, 3)), TypeError, "table must be a torch.Tensor"),
    ("table-int", lambda: resize_position_embedding(torch.zeros(5, 3, dtype=torch.long), (3, 3)), TypeError,
     "table must be a floating tensor"),
    ("table-1-d", lambda: resize_position_embedding(torch.zeros(5), 2), ValueError, r"table must have shape \(N, C\)"),
    ("table-0-d", lambda: resize_position_embedding(torch.tensor(1.0), 2), ValueError, r"table must have shape \(N, C\)"),
    ("table-batch-of-tables", lambda: resize_position_embedding(torch.zeros(2, 5, 3), (3, 3)), ValueError,
     r"table must have shape \(N, C\) or \(1, N, C\)"),
    ("new_size-0", lambda: resize_position_embedding(_TAB, 0), ValueError, "new_size must be >= 1"),
    ("new_size-negative", lambda: resize_position_embedding(_TAB, -1), ValueError, "new_size must be >= 1"),
    ("new_size-float", lambda: resize_position_embedding(_TAB, 2.0), TypeError, "new_size must be an int .* or a pair"),
    ("new_size-nan", lambda: resize_position_embedding(_TAB, NAN), TypeError, "new_size must be an int .* or a pair"),
    ("new_size-bool", lambda: resize_position_embedding(_TAB, True), TypeError, "new_size must be an int .* or a pair"),
    ("new_size-str", lambda: resize_position_embedding(_TAB, "3"), TypeError, "new_size must be an int .* or a pair"),
    ("new_size-tensor", lambda: resize_position_embedding(_TAB, torch.tensor(3)), TypeError, "new_size must be an int"),
    ("new_size-triple", lambda: resize_position_embedding(_TAB, (2, 2, 2)), TypeError, "new_size must be an int .* or a pair"),
    ("new_size-pair-0", lambda: resize_position_embedding(_TAB, (0, 2)), ValueError, r"new_size\[0\] must be >= 1"),
    ("new_size-pair-float", lambda: resize_position_embedding(_TAB, (3, 3.0)), TypeError, r"new_size\[1\] must be an int"),
    ("old_size-mismatch-1-d", lambda: resize_position_embedding(_TAB, 8, old_size=3), ValueError,
     "old_size=3 does not match the table: N=5 rows minus prefix_tokens=1 leaves 4"),
    ("old_size-0-1-d", lambda: resize_position_embedding(_TAB, 8, old_size=0), ValueError, "old_size must be >= 1"),
    ("old_size-pair-for-1-d", lambda: resize_position_embedding(_TAB, 8, old_size=(2, 2)), TypeError,
     "old_size must be an int like new_size=8"),
    ("old_size-float-1-d", lambda: resize_position_embedding(_TAB, 8, old_size=4.0), TypeError, "old_size must be an int"),
    ("old_size-int-for-2-d", lambda: resize_position_embedding(_TAB, (3, 3), old_size=4), TypeError,
     r"old_size must be a pair \(H, W\)"),
    ("old_size-mismatch-2-d", lambda: resize_position_embedding(_TAB, (3, 3), old_size=(1, 3)), ValueError,
     r"old_size=\(1, 3\) holds 3 positions but the table has 4 grid rows"),
    ("old_size-pair-0", lambda: resize_position_embedding(_TAB, (3, 3), old_size=(0, 4)), ValueError, r"old_size\[0\] must be >= 1"),
    ("not-a-square", lambda: resize_position_embedding(torch.zeros(7, 3), (3, 3)), ValueError,
     r"6 rows .* not a square; pass old_size=\(H, W\)"),
    ("prefix_tokens-negative", lambda: resize_position_embedding(_TAB, 2, prefix_tokens=-1), ValueError,
     "prefix_tokens must be >= 0"),
    ("prefix_tokens-float", lambda: resize_position_embedding(_TAB, 2, prefix_tokens=1.0), TypeError,
     "prefix_tokens must be an int"),
    ("prefix_tokens-whole-table", lambda: resize_position_embedding(_TAB, 2, prefix_tokens=5), ValueError,
     "prefix_tokens=5 leaves no grid rows in a table of N=5 rows"),
    ("mode-unknown", lambda: resize_position_embedding(_TAB, 2, mode="lanczos"), ValueError, "mode must be one of"),
    ("mode-int", lambda: resize_position_embedding(_TAB, 2, mode=3), ValueError, "mode must be one of"),
    ("mode-2-d-for-1-d", lambda: resize_position_embedding(_TAB, 2, mode="bicubic"), ValueError,
     "mode='bicubic' is not a mode of a 1-D table"),
    ("mode-1-d-for-2-d", lambda: resize_position_embedding(_TAB, (3, 3), mode="linear"), ValueError,
     "mode='linear' is not a mode of a 2-D grid"),
    ("antialias-nearest", lambda: resize_position_embedding(_TAB, (3, 3), mode="nearest"), ValueError,
     "antialias=True applies to the cubic and linear modes only"),
    ("antialias-int", lambda: resize_position_embedding(_TAB, 2, antialias=1), TypeError, "antialias must be a bool"),
]:
    bad("resize_position_embedding", _id, _call, _exc, _match)


def _resize_good(case_id, make, run, want, atol=1e-6, exact_dtype=True):
    def thunk():
        t = make()
        return run(t), t

    def check(r):
        out, t = r
        w = want(t)
        assert out.dtype == t.dtype and tuple(out.shape) == tuple(w.shape), (out.dtype, out.shape, w.shape)
        if exact_dtype and t.dtype in (torch.bfloat16, torch.float16):
            assert torch.equal(out, w), "a half table is resized in float32 and rounded once"
        close(out, arr(w), atol=atol, rtol=max(atol, 1e-6))
    good("resize_position_embedding", case_id, thunk, check)


for _id, _make, _run, _want, _atol in [
    ("2-d-upsample", lambda: rand(1 + 4, 3, seed=42), lambda t: resize_position_embedding(t, (3, 5)),
     lambda t: ref_resize_2d(t, (3, 5), (2, 2), 1), 1e-6),
    ("2-d-downsample-antialias", lambda: rand(1, 2 + 16, 4, seed=43), lambda t: resize_position_embedding(t, (3, 2), prefix_tokens=2),
     lambda t: ref_resize_2d(t, (3, 2), (4, 4), 2), 1e-6),
    ("2-d-non-square-old_size", lambda: rand(6, 2, seed=44), lambda t: resize_position_embedding(
        t, (4, 6), old_size=(2, 3), prefix_tokens=0, mode="bilinear"), lambda t: ref_resize_2d(t, (4, 6), (2, 3), 0, "bilinear"), 1e-6),
    ("2-d-1x1-grid", lambda: rand(2, 3, seed=45), lambda t: resize_position_embedding(t, (3, 3), mode="nearest", antialias=False),
     lambda t: torch.cat([t[:1], t[1:].expand(9, 3)]), 0),
    ("2-d-to-1x1-area", lambda: rand(1 + 4, 3, seed=46), lambda t: resize_position_embedding(t, (1, 1), mode="area",
                                                                                                antialias=False),
     lambda t: torch.cat([t[:1], t[1:].mean(0, keepdim=True)]), 1e-6),
    ("2-d-bfloat16", lambda: rand(1 + 9, 4, seed=47, dtype=torch.bfloat16), lambda t: resize_position_embedding(t, (5, 4)),
     lambda t: ref_resize_2d(t, (5, 4), (3, 3), 1), 0),
    ("2-d-float64", lambda: rand(1 + 9, 4, seed=48, dtype=torch.float64), lambda t: resize_position_embedding(t, (2, 5)),
     lambda t: ref_resize_2d(t, (2, 5), (3, 3), 1), 1e-12),
    ("2-d-non-contiguous", lambda: rand(3, 1 + 4, seed=49).T, lambda t: resize_position_embedding(t, (3, 3)),
     lambda t: ref_resize_2d(t.contiguous(), (3, 3), (2, 2), 1), 1e-6),
    ("1-d-linear-prefix", lambda: rand(2 + 4, 3, seed=50), lambda t: resize_position_embedding(
        t, 7, prefix_tokens=2, mode="linear", antialias=False),
     lambda t: torch.cat([t[:2], torch.tensor(ref_linear_1d(arr(t[2:]), 7), dtype=t.dtype)]), 1e-6),
    ("1-d-nearest-one-row", lambda: rand(1, 3, seed=51), lambda t: resize_position_embedding(
        t, 4, prefix_tokens=0, mode="nearest", antialias=False), lambda t: t.expand(4, 3), 0),
    ("1-d-rank-3", lambda: rand(1, 1 + 3, 2, seed=52), lambda t: resize_position_embedding(t, 6, mode="linear", antialias=False),
     lambda t: torch.cat([t[:, :1], torch.tensor(ref_linear_1d(arr(t[0, 1:]), 6), dtype=t.dtype)[None]], 1), 1e-6),
    ("nan-stays-in-its-rows", lambda: torch.tensor([[NAN, 1.0], [0.0, 2.0], [1.0, 4.0]]), lambda t: resize_position_embedding(
        t, 4, prefix_tokens=1, mode="nearest", antialias=False), lambda t: t[[0, 1, 1, 2, 2]], 0),
    # a table without features resizes to a table without features (today: a RuntimeError from interpolate)
    ("no-channels", lambda: torch.zeros(1 + 4, 0), lambda t: resize_position_embedding(t, (3, 3)),
     lambda t: torch.zeros(1 + 9, 0), 0),
]:
    _resize_good(_id, _make, _run, _want, _atol)
good("resize_position_embedding", "same-size-is-the-table", lambda: (lambda t: (resize_position_embedding(t, (2, 2)), t))(_TAB),
     lambda r: (r[0] is r[1]) or pytest.fail("a resize to the same grid returns the table itself"))
good("resize_position_embedding", "same-size-1-d", lambda: (lambda t: (resize_position_embedding(t, 4, old_size=4), t))(_TAB),
     lambda r: (r[0] is r[1]) or pytest.fail("a resize to the same length returns the table itself"))
good("resize_position_embedding", "meta", lambda: resize_position_embedding(torch.zeros(1, 1 + 4, 3, device=META), (3, 2)),
     _is_meta((1, 7, 3)))


# ---- the walk ---------------------------------------------------------------------------------------

MODULES = (posenc, F, posenc.nn)


def _public_callables() -> set[str]:
    """Every public function and class, less the warning categories (nothing to call them with)."""
    objs = {name: getattr(mod, name) for mod in MODULES for name in mod.__all__}
    return {n for n, o in objs.items() if callable(o) and not (isinstance(o, type) and issubclass(o, Warning))}


def test_every_public_callable_is_walked():
    """A public callable without cases fails here: add good and bad cases for it above."""
    counts: dict[str, list[int]] = {}
    for case in CASES:
        name, _, error, _ = case.values
        counts.setdefault(name, [0, 0])[error is None] += 1
    public = _public_callables()
    assert not public - set(counts), f"public callables without bad-input cases: {sorted(public - set(counts))}"
    assert not set(counts) - public, f"cases for names that are not public: {sorted(set(counts) - public)}"
    no_rejection = sorted(n for n in public if not counts[n][0])
    assert not no_rejection, f"callables never shown a bad input: {no_rejection}"
    no_valid = sorted(n for n in public - {"RopeScaling"} if not counts[n][1])
    assert not no_valid, f"callables never shown a valid unusual input: {no_valid}"
    assert isinstance(posenc.__version__, str)
    assert set(posenc.__all__) - {"__version__", "LayoutWarning"} <= public  # nothing public is left out of the walk


@pytest.mark.parametrize("name, thunk, error, check", CASES)
def test_bad_input(name, thunk, error, check):
    if error is None:
        check(guarded(thunk))
        return
    exc, match = error
    with pytest.raises(exc, match=match):
        guarded(thunk)


def test_the_guard_rejects_other_exceptions():
    for err in (IndexError("i"), RuntimeError("r"), ZeroDivisionError("z"), AttributeError("a"), AssertionError("a"),
                NotImplementedError("n"), KeyError("k")):
        def thunk(err=err):
            raise err
        with pytest.raises(pytest.fail.Exception, match=f"{type(err).__name__} escaped"):
            guarded(thunk)
    with pytest.raises(pytest.fail.Exception, match="UserWarning escaped"):
        guarded(lambda: warnings.warn("silently wrong", UserWarning, stacklevel=1))


# ---- light smoke walks: Keras layers, CLI -----------------------------------------------------------


def test_keras_layers_reject_float_positions():
    """posenc.keras: every public name is walked once (float positions / a NaN factor); the full
    hardening lives in tests/keras/test_keras_hardening.py."""
    keras = pytest.importorskip("keras")
    try:
        import posenc.keras as pk
    except ImportError as err:                                           # a backend that is not installed
        pytest.skip(f"posenc.keras does not import here: {err}")
    x, q, p = np.zeros((1, 2, 4), "float32"), np.zeros((1, 1, 2, 4), "float32"), np.array([0.0, 1.0])
    calls = {
        "SinusoidalEncoding": lambda: pk.SinusoidalEncoding(4)(x, positions=p),
        "LearnedPositionalEmbedding": lambda: pk.LearnedPositionalEmbedding(4, 4)(x, positions=p),
        "RotaryEmbedding": lambda: pk.RotaryEmbedding(4)(q, positions=p),
        "AlibiBias": lambda: pk.AlibiBias(2)(p),
        "RelativePositionBias": lambda: pk.RelativePositionBias(2)(p),
        "AxialRotaryEmbedding": lambda: pk.AxialRotaryEmbedding((2, 2))(q, positions=np.stack([p, p], -1)),
    }
    for name in pk.__all__:
        obj = getattr(pk, name)
        if name in calls:
            with pytest.raises(TypeError, match="positions must hold integers"):
                guarded(calls[name])
        elif name == "SinusoidalEncodingND":                             # a grid, not positions
            with pytest.raises(TypeError, match=r"grid_shape\[0\] must be an int"):
                guarded(lambda: pk.SinusoidalEncodingND(4, (1, 2))(x, grid_shape=(1.0, 2)))
        else:                                                            # the scaling rules, shared with torch
            assert isinstance(obj, type) and issubclass(obj, RopeScaling), name
            args = {"LongRopeScaling": ([NAN], [1.0], 4), "ProportionalScaling": (NAN,), "LinearScaling": (NAN,),
                    "NTKScaling": (NAN,)}.get(name, (NAN, 4))
            with pytest.raises(ValueError, match="must be finite"):
                guarded(lambda obj=obj, args=args: obj(*args))
    assert keras.backend.backend()


def test_cli_subcommands_answer_help():
    from posenc.cli import build_parser, main

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    assert set(sub.choices) >= {"table", "list", "compare", "plot"}
    for argv in (["--help"], *([name, "--help"] for name in sub.choices)):
        with pytest.raises(SystemExit) as exit_info:
            guarded(lambda argv=argv: main(argv))
        assert exit_info.value.code == 0, argv
