"""Bad inputs of RoPE: rope_inv_freq, rope_cos_sin, layout_permutation, convert_rope_weight, apply_rope, apply_rope_qk, RotaryEmbedding and the scaling rules.

Each case either matches an independent float64 reference from ``tests/reference/`` or raises
``ValueError``/``TypeError`` naming the offending argument; any other exception or any warning fails it
(``tests/bad_inputs.py``).  ``tests/test_bad_inputs.py`` walks every public name against these cases.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posenc.functional as F
from posenc import (
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    ProportionalScaling,
    RopeScaling,
    RotaryEmbedding,
    YarnScaling,
)
from tests.bad_inputs import (
    BASE,
    C8,
    EXACT,
    INF,
    META,
    NAN,
    P3,
    S8,
    Cases,
    arr,
    close,
    np_tables,
    rand,
    ref_cos_sin,
    ref_rope,
    rope_good,
    run_case,
)
from tests.reference.rope_oracle import convert_weight as ref_convert
from tests.reference.rope_oracle import cos_sin as ref_cos_sin_theta
from tests.reference.rope_oracle import default as ref_theta

CASES = Cases()
bad, good = CASES.bad, CASES.good


# ---- RoPE: rope_inv_freq, rope_cos_sin, layout_permutation, convert_rope_weight -------------------

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


# ---- apply_rope ------------------------------------------------------------------------------------

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
    ("engine", lambda: F.apply_rope(rand(3, 8), *_cs(), engine="cuda"), ValueError, "engine must be one of"),
    # float64: a case the kernel never takes (whether Triton runs here, e.g. TRITON_INTERPRET=1, or not)
    ("engine-triton-float64", lambda: F.apply_rope(rand(1, 1, 3, 8, dtype=torch.float64), *_cs(), engine="triton"),
     ValueError, "engine='triton'"),
    ("inplace-int", lambda: F.apply_rope(rand(3, 8), *_cs(), inplace=1), TypeError, "inplace must be a bool"),
    ("inplace-expanded", lambda: F.apply_rope(rand(1, 3, 8).expand(2, 3, 8), *_cs(), inplace=True), ValueError,
     "x has elements that share memory"),
    ("inplace-leaf", lambda: F.apply_rope(rand(3, 8).requires_grad_(), *_cs(), inplace=True), ValueError, "x is .*leaf"),
]:
    bad("apply_rope", _id, _call, _exc, _match)


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
    rope_good(CASES, "apply_rope", _id, _make, _run, _want, _atol, _inplace)


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


# ---- apply_rope_qk and RotaryEmbedding: q, k, tables -----------------------------------------------

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
    ("engine", {"engine": "cuda"}, ValueError, "engine must be one of"),
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
bad("apply_rope_qk", "engine-triton-float64",
    lambda: F.apply_rope_qk(rand(1, 1, 3, 8, dtype=torch.float64), None, C8, S8, engine="triton"), ValueError, "engine='triton'")
bad("RotaryEmbedding", "engine-triton-float64",
    lambda: RotaryEmbedding(8, engine="triton")(rand(1, 1, 3, 8, dtype=torch.float64)), ValueError, "engine='triton'")
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
    ("engine", {"engine": "cuda"}, ValueError, "engine must be one of"),
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

# ---- scaling rules, Hugging Face configs -----------------------------------------------------------

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
    ("Llama3Scaling", lambda: Llama3Scaling(2.0, 16, low_freq_factor=4.0, high_freq_factor=2.0), ValueError,
     "high_freq_factor must be >= low_freq_factor"),
    ("LongRopeScaling", lambda: LongRopeScaling([1.0, NAN], [1.0, 1.0], 16), ValueError, r"short_factor\[1\] must be finite"),
    ("LongRopeScaling", lambda: LongRopeScaling([1.0], [1.0], 16, long_attention_factor=-1.0), ValueError,
     "long_attention_factor must be >= 0"),
    ("LongRopeScaling", lambda: LongRopeScaling([1.0], [1.0], 16, long_attention_factor="1"), TypeError,
     "long_attention_factor must be a real number"),
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


# extreme finite values: tiny and huge bases, factors, frequencies, lengths, scales
for _id, _call in [
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
good("LinearScaling", "factor-1e306-subnormal-frequencies",
     lambda: (lambda q: (RotaryEmbedding(8, scaling=LinearScaling(1e306))(q, offset=2**31 - 3)[0], q))(rand(1, 2, 3, 8)),
     lambda r: close(r[0], ref_rope(r[1], np.arange(2**31 - 3, 2**31), theta=ref_theta(8) / 1e306), atol=1e-5))
good("rope_inv_freq", "subnormal-frequencies", lambda: F.rope_inv_freq(8, scaling=LinearScaling(1e306)),
     lambda r: close(r[0], ref_theta(8) / 1e306, atol=0, rtol=1e-12))
good("rope_cos_sin", "inv_freq-subnormal", lambda: F.rope_cos_sin(P3, torch.tensor([1e-310, 1.0], dtype=torch.float64), dtype=torch.float64),
     lambda r: close(r, ref_cos_sin_theta(arr(P3), np.array([1e-310, 1.0])), atol=0, rtol=1e-12))
good("rope_cos_sin", "inv_freq-large", lambda: F.rope_cos_sin(P3, torch.tensor([2.0**33], dtype=torch.float64)),
     lambda r: close(r, ref_cos_sin_theta(arr(P3), np.array([2.0**33])), atol=1e-6))


@pytest.mark.parametrize("name, thunk, error, check", CASES.params)
def test_bad_input(name, thunk, error, check):
    run_case(thunk, error, check)
