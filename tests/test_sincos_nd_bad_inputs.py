"""Bad inputs of sincos_table_nd and SinusoidalEncodingND (He et al. 2022, MAE; Yang et al. 2024, CogVideoX).

Each case either matches an independent float64 reference from ``tests/reference/`` or raises
``ValueError``/``TypeError`` naming the offending argument; any other exception or any warning fails it
(``tests/bad_inputs.py``).  ``tests/test_bad_inputs.py`` walks every public name against these cases.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc.functional.sincos_nd import sincos_table_nd
from posenc.nn.sincos_nd import SinusoidalEncodingND
from tests.bad_inputs import (
    INF,
    META,
    NAN,
    Cases,
    arr,
    close,
    is_meta,
    rand,
    run_case,
)
from tests.reference.grid_oracle import sincos_nd as ref_sincos_nd

CASES = Cases()
bad, good = CASES.bad, CASES.good


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
    bad("SinusoidalEncodingND", f"init-dtype-{_id}", lambda d=_dtype: SinusoidalEncodingND((2, 2), 8, dtype=d), TypeError,
        "dtype is the table's dtype and must be torch.float32 or torch.float64")
bad("SinusoidalEncodingND", "init-scale-nan", lambda: SinusoidalEncodingND((2, 2), 8, scale=NAN), ValueError, "scale must be finite")
bad("SinusoidalEncodingND", "init-scale-str", lambda: SinusoidalEncodingND((2, 2), 8, scale="1"), TypeError,
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
    ("base_size", (2, 4), 8, {"base_size": 8}, lambda: ref_sincos_nd((2, 4), 8, base_size=8)),
    ("base_size-per-axis", (2, 4), 8, {"base_size": (1, 2)}, lambda: ref_sincos_nd((2, 4), 8, base_size=(1, 2))),
    ("interpolation_scale-per-axis", (2, 3), 8, {"interpolation_scale": (2.0, 0.5)},
     lambda: ref_sincos_nd((2, 3), 8, interp=(2.0, 0.5))),
    ("interpolation_scale-3-d", (2, 1, 2), 16, {"interpolation_scale": (4, 1, 1)},
     lambda: ref_sincos_nd((2, 1, 2), 16, interp=(4, 1, 1))),
]:
    good("sincos_table_nd", _id, lambda g=_grid, d=_dim, kw=_kw: sincos_table_nd(g, d, **kw),
         lambda out, w=_want: close(out, w()) or (out.dtype == torch.float32 or pytest.fail(str(out.dtype))))
good("sincos_table_nd", "float64", lambda: sincos_table_nd((2, 3), 8, dtype=torch.float64, prefix_tokens=1),
     lambda out: close(out, ref_sincos_nd((2, 3), 8, prefix=1), atol=1e-14, rtol=1e-14))
good("sincos_table_nd", "bfloat16", lambda: sincos_table_nd((3, 3), 8, dtype=torch.bfloat16),
     lambda out: close(out, ref_sincos_nd((3, 3), 8), atol=4e-3, rtol=8e-3) or (out.dtype == torch.bfloat16 or pytest.fail("dtype")))
good("sincos_table_nd", "meta", lambda: sincos_table_nd((2, 3), 8, prefix_tokens=1, device=META), is_meta((7, 8)))


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
    ("1x1-prefix", lambda: (SinusoidalEncodingND((1, 1), 8, prefix_tokens=2), rand(3, 8)), lambda m, x: m(x),
     lambda x: x + ref_sincos_nd((1, 1), 8, prefix=2), 1e-6),
    ("other-grid", lambda: (SinusoidalEncodingND((2, 2), 8, prefix_tokens=1), rand(2, 1 + 6, 8)),
     lambda m, x: m(x, grid_shape=(3, 2)), lambda x: x + ref_sincos_nd((3, 2), 8, prefix=1), 1e-6),
    ("other-grid-base_size", lambda: (SinusoidalEncodingND((2, 2), 8, base_size=2), rand(1, 9, 8)),
     lambda m, x: m(x, grid_shape=(3, 3)), lambda x: x + ref_sincos_nd((3, 3), 8, base_size=2), 1e-6),
    ("3-d", lambda: (SinusoidalEncodingND((2, 1, 2), 16, interpolation_scale=(2.0, 1.0, 1.0)), rand(1, 4, 16)),
     lambda m, x: m(x), lambda x: x + ref_sincos_nd((2, 1, 2), 16, interp=(2.0, 1.0, 1.0)), 1e-6),
    ("timm", lambda: (SinusoidalEncodingND((2, 3), 8, order="timm"), rand(6, 8)), lambda m, x: m(x),
     lambda x: x + ref_sincos_nd((2, 3), 8, order="timm"), 1e-6),
    ("scale", lambda: (SinusoidalEncodingND((2, 2), 8, scale=0.5), rand(2, 4, 8)), lambda m, x: m(x),
     lambda x: 0.5 * x + ref_sincos_nd((2, 2), 8), 1e-6),
    ("non-contiguous", lambda: (SinusoidalEncodingND((2, 2), 8), rand(8, 4, 2).permute(2, 1, 0)), lambda m, x: m(x),
     lambda x: x + ref_sincos_nd((2, 2), 8), 1e-6),
    ("expanded", lambda: (SinusoidalEncodingND((2, 2), 8), rand(1, 4, 8).expand(3, 4, 8)), lambda m, x: m(x),
     lambda x: x + ref_sincos_nd((2, 2), 8), 1e-6),
    ("empty-batch", lambda: (SinusoidalEncodingND((2, 2), 8), torch.zeros(0, 4, 8)), lambda m, x: m(x),
     lambda x: np.zeros((0, 4, 8)), 0),
    ("bfloat16", lambda: (SinusoidalEncodingND((3, 3), 8), torch.zeros(2, 9, 8, dtype=torch.bfloat16)), lambda m, x: m(x),
     lambda x: x + ref_sincos_nd((3, 3), 8), 4e-3),
    ("module-bfloat16", lambda: (SinusoidalEncodingND((3, 3), 8).to(torch.bfloat16), torch.zeros(9, 8)), lambda m, x: m(x),
     lambda x: x + ref_sincos_nd((3, 3), 8), 1e-6),
    ("float64", lambda: (SinusoidalEncodingND((2, 3), 8, dtype=torch.float64), rand(6, 8, dtype=torch.float64)),
     lambda m, x: m(x), lambda x: x + ref_sincos_nd((2, 3), 8), 1e-13),
    ("nan-inf", lambda: (SinusoidalEncodingND((2, 2), 8), torch.tensor([NAN, INF, -INF, 0, 0, 0, 0, 0]).expand(4, 8)),
     lambda m, x: m(x), lambda x: x + ref_sincos_nd((2, 2), 8), 1e-6),
]:
    _nd_good(_id, _make, _run, _want, _atol)
good("SinusoidalEncodingND", "all-meta", lambda: SinusoidalEncodingND((2, 2), 8, device=META)(torch.zeros(2, 4, 8, device=META)),
     is_meta((2, 4, 8)))
for _id, _call, _exc, _match in [
    ("x-list", lambda m: m([[0.0] * 8] * 4), TypeError, "x must be a torch.Tensor"),
    ("x-int", lambda m: m(torch.zeros(4, 8, dtype=torch.long)), TypeError, "x must be a floating tensor"),
    ("x-complex", lambda m: m(torch.zeros(4, 8, dtype=torch.complex64)), TypeError, "x must be a floating tensor"),
    ("x-dim", lambda m: m(torch.zeros(1, 4, 6)), ValueError, r"x must have shape \(B, S, 8\) or \(S, 8\)"),
    ("x-1-d", lambda m: m(torch.zeros(8)), ValueError, r"x must have shape \(B, S, 8\)"),
    ("x-4-d", lambda m: m(torch.zeros(1, 1, 4, 8)), ValueError, r"x must have shape \(B, S, 8\)"),
    ("x-meta", lambda m: m(torch.zeros(1, 4, 8, device=META)), ValueError, "x is on meta but the tables on cpu"),
    ("module-meta", lambda m: SinusoidalEncodingND((2, 2), 8, device=META)(torch.zeros(1, 4, 8)), ValueError,
     "x is on cpu but the tables on meta.*reset_buffers"),
    ("tokens-vs-grid", lambda m: m(torch.zeros(1, 5, 8)), ValueError,
     r"x has 5 tokens but the grid_shape=\(2, 2\) with prefix_tokens=0 has 4; pass grid_shape="),
    ("tokens-vs-prefix", lambda m: SinusoidalEncodingND((2, 2), 8, prefix_tokens=1)(torch.zeros(1, 4, 8)), ValueError,
     "x has 4 tokens but the grid_shape=.* with prefix_tokens=1 has 5"),
    ("tokens-vs-given-grid", lambda m: m(torch.zeros(1, 4, 8), grid_shape=(3, 3)), ValueError,
     r"x has 4 tokens but the given grid_shape=\(3, 3\)"),
    ("grid_shape-rank", lambda m: m(torch.zeros(1, 4, 8), grid_shape=(4,)), ValueError, "grid_shape must have 2 entries"),
    ("grid_shape-float", lambda m: m(torch.zeros(1, 4, 8), grid_shape=(2.0, 2)), TypeError, r"grid_shape\[0\] must be an int"),
    ("grid_shape-int", lambda m: m(torch.zeros(1, 4, 8), grid_shape=4), TypeError, "grid_shape must be a tuple"),
    ("grid_shape-0", lambda m: m(torch.zeros(1, 0, 8), grid_shape=(0, 2)), ValueError, r"grid_shape\[0\] must be an int in"),
    ("table-dtype-int", lambda m: m.table(dtype=torch.int32), TypeError, "dtype must be one of"),
    # like SinusoidalEncoding: a scale that overflows x's dtype is refused, not a torch RuntimeError
    ("scale-overflows-float16", lambda m: SinusoidalEncodingND((2, 2), 8, scale=7e4)(torch.ones(1, 4, 8, dtype=torch.float16)),
     ValueError, "scale=70000 overflows x's dtype torch.float16"),
]:
    bad("SinusoidalEncodingND", _id, lambda c=_call: c(SinusoidalEncodingND((2, 2), 8)), _exc, _match)


@pytest.mark.parametrize("name, thunk, error, check", CASES.params)
def test_bad_input(name, thunk, error, check):
    run_case(thunk, error, check)
