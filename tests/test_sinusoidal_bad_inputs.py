"""Bad inputs of the additive encodings: sinusoidal_encoding, sinusoidal_table, SinusoidalEncoding and LearnedPositionalEmbedding (which share their checks of x).

Each case either matches an independent float64 reference from ``tests/reference/`` or raises
``ValueError``/``TypeError`` naming the offending argument; any other exception or any warning fails it
(``tests/bad_inputs.py``).  ``tests/test_bad_inputs.py`` walks every public name against these cases.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

import posenc.functional as F
from posenc import (
    LearnedPositionalEmbedding,
    SinusoidalEncoding,
)
from tests.bad_inputs import (
    EXACT,
    INF,
    META,
    NAN,
    P3,
    Cases,
    arr,
    close,
    rand,
    run_case,
)
from tests.reference.oracle import sinusoidal_f64 as ref_sinusoidal

CASES = Cases()
bad, good = CASES.bad, CASES.good


# ---- sinusoidal_encoding, sinusoidal_table, SinusoidalEncoding ------------------------------------

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


# ---- LearnedPositionalEmbedding --------------------------------------------------------------------

for _id, _kw, _exc, _match in [
    ("max_seq_len-0", {"max_seq_len": 0}, ValueError, "max_seq_len must be >= 1"),
    ("max_seq_len-float", {"max_seq_len": 4.0}, TypeError, "max_seq_len must be an int"),
    ("dim-0", {"dim": 0}, ValueError, "dim must be >= 1"),
    ("init", {"init": "xavier"}, ValueError, "init must be one of"),
    ("padding_idx-negative", {"padding_idx": -1}, ValueError, "padding_idx must be >= 0"),
    ("padding_idx-past", {"padding_idx": 4}, ValueError, "padding_idx must be < max_seq_len=4"),
    ("padding_idx-float", {"padding_idx": 1.0}, TypeError, "padding_idx must be an int"),
    ("dtype-int", {"dtype": torch.int64}, TypeError, "dtype must be one of"),
    ("dtype-bool", {"dtype": torch.bool}, TypeError, "dtype must be one of"),
    ("dtype-complex", {"dtype": torch.complex64}, TypeError, "dtype must be one of"),
    ("dtype-str", {"dtype": "float32"}, TypeError, "dtype must be one of"),
]:
    bad("LearnedPositionalEmbedding", f"init-{_id}", lambda kw=_kw: LearnedPositionalEmbedding(**{"max_seq_len": 4, "dim": 8, **kw}),
        _exc, _match)
good("LearnedPositionalEmbedding", "padding-row", lambda: LearnedPositionalEmbedding(4, 5, init="sinusoidal", padding_idx=1)(
    torch.zeros(3, 5), positions=torch.tensor([1, 0, 1], dtype=torch.uint8)),
    lambda out: close(out, np.stack([np.zeros(5), ref_sinusoidal(0, 5), np.zeros(5)])))



# extreme finite values: tiny and huge bases, factors, frequencies, lengths, scales
for _id, _call in [
    ("sinusoidal_encoding", lambda: F.sinusoidal_encoding(P3, 8, base=1e-300)),
    ("sinusoidal_table", lambda: F.sinusoidal_table(3, 8, base=5e-324)),
    ("SinusoidalEncoding", lambda: SinusoidalEncoding(8, base=1e-300)),
]:
    bad(_id, "huge-frequency", _call, ValueError, r"exceeds 2\*\*32 turns.*base far below 1, a tiny scaling factor or a huge inv_freq")

bad("SinusoidalEncoding", "scale-overflows-float16", lambda: SinusoidalEncoding(4, scale=7e4)(torch.ones(1, 2, 4, dtype=torch.float16)),
    ValueError, "scale=70000 overflows x's dtype torch.float16")
good("SinusoidalEncoding", "scale-large-float32", lambda: SinusoidalEncoding(4, scale=7e4)(torch.ones(1, 2, 4)),
     lambda out: close(out, 7e4 + ref_sinusoidal(np.arange(2), 4)[None]))


@pytest.mark.parametrize("name, thunk, error, check", CASES.params)
def test_bad_input(name, thunk, error, check):
    run_case(thunk, error, check)
