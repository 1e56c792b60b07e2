"""Bad inputs of grid_positions, axial_cos_sin, apply_axial_rope and AxialRotaryEmbedding (axial RoPE: FLUX, EVA; Heo et al. 2024, RoPE-Mixed).

Each case either matches an independent float64 reference from ``tests/reference/`` or raises
``ValueError``/``TypeError`` naming the offending argument; any other exception or any warning fails it
(``tests/bad_inputs.py``).  ``tests/test_bad_inputs.py`` walks every public name against these cases.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc.functional.axial import apply_axial_rope, axial_cos_sin, grid_positions
from posenc.nn.axial_rotary import AxialRotaryEmbedding
from tests.bad_inputs import (
    BASE,
    EXACT,
    META,
    NAN,
    Cases,
    arr,
    check_rotated,
    close,
    is_meta,
    rand,
    rope_good,
    run_case,
)
from tests.reference.grid_oracle import axial_cos_sin as ref_axial_cos_sin
from tests.reference.grid_oracle import axial_rotate as ref_axial_rope
from tests.reference.rope_oracle import rotate_pairs as ref_rotate_pairs

CASES = Cases()
bad, good = CASES.bad, CASES.good


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
good("grid_positions", "meta", lambda: grid_positions((2, 3), prefix_tokens=1, device=META), is_meta((7, 2)))


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
good("axial_cos_sin", "meta", lambda: axial_cos_sin(_PG.to(META), (4, 2)), is_meta(((6, 3), (6, 3))))


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
    ("engine-half", lambda: apply_axial_rope(rand(6, 8), *_acs(), axes_dims=(4, 4), layout="half", engine="cuda"),
     ValueError, "engine must be one of"),
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
    rope_good(CASES, "apply_axial_rope", _id, _make, _run, _want, _atol, _inplace)


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
    ("max_seq_len-0", {"max_seq_len": 0}, ValueError, "max_seq_len must be >= 1"),
    ("max_seq_len-negative", {"max_seq_len": -1}, ValueError, "max_seq_len must be >= 1"),
    ("max_seq_len-float", {"max_seq_len": 4.0}, TypeError, "max_seq_len must be an int"),
    ("max_seq_len-bool", {"max_seq_len": True}, TypeError, "max_seq_len must be an int"),
    ("engine", {"engine": "cuda"}, ValueError, "engine must be one of"),
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
    ("assume_valid-str", lambda m: m(_QA, positions=_PG, assume_valid="yes"), TypeError, "assume_valid must be a bool"),
    ("assume-broken-promise", lambda m: AxialRotaryEmbedding((4, 4), max_seq_len=2)(_QA, positions=_PG, assume_valid=True),
     ValueError, r"positions must lie in \[0, 2\) .*assume_valid=True"),
    ("assume-broken-promise-negative", lambda m: m(_QA, positions=-_PG, assume_valid=True), ValueError,
     r"positions must lie in \[0, 1024\) .*assume_valid=True"),
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
# The old name with a bad value must be refused under that name, without a warning (as RotaryEmbedding,
# apply_rope_qk and posenc.attention do)
bad("AxialRotaryEmbedding", "assume_in_table-str", lambda: AxialRotaryEmbedding((4, 4))(
    _QA, positions=_PG, assume_in_table="yes"), TypeError, "assume_in_table must be a bool")


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
        check_rotated(qo, ko, q0, *want(m, q0, k0), atol)
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
    ("int16-past-table", lambda: AxialRotaryEmbedding((4, 4), max_seq_len=4), lambda: (rand(2, 2, 6, 8), None),
     {"positions": _P16}, _axial_want(arr(_P16)), 1e-5),
    ("uint8-in-table-assumed", lambda: AxialRotaryEmbedding((2, 6)), lambda: (rand(1, 2, 6, 8), rand(1, 1, 6, 8)),
     {"positions": _PG.to(torch.uint8), "assume_valid": True}, _axial_want(arr(_PG), (2, 6)), 1e-5),
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
    ("bfloat16-half-past-table", lambda: AxialRotaryEmbedding((4, 4), layout="half", max_seq_len=1),
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
    _QA.to(META), positions=_PG.to(META))[0], is_meta((1, 2, 6, 8)))


@pytest.mark.parametrize("name, thunk, error, check", CASES.params)
def test_bad_input(name, thunk, error, check):
    run_case(thunk, error, check)
