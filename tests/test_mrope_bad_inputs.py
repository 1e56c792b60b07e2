"""Bad inputs of mrope_positions, mrope_cos_sin, MultimodalRotaryEmbedding, mrope_from_hf and mrope_vision_from_hf (Wang et al. 2024, Qwen2-VL).

Each case either matches an independent float64 reference from ``tests/reference/`` or raises
``ValueError``/``TypeError`` naming the offending argument; any other exception or any warning fails it
(``tests/bad_inputs.py``).  ``tests/test_bad_inputs.py`` walks every public name against these cases.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc import (
    DynamicNTKScaling,
    LinearScaling,
)
from posenc.core.hf_config import mrope_from_hf, mrope_vision_from_hf
from posenc.functional.mrope import mrope_cos_sin, mrope_positions
from posenc.nn.mrope import MultimodalRotaryEmbedding
from tests.bad_inputs import (
    EXACT,
    META,
    NAN,
    Cases,
    arr,
    check_rotated,
    close,
    is_meta,
    rand,
    ref_cos_sin,
    ref_rope,
    run_case,
)
from tests.reference.grid_oracle import mrope_angles as ref_mrope_angles
from tests.reference.grid_oracle import mrope_rotate as ref_mrope
from tests.reference.rope_oracle import cos_sin as ref_cos_sin_theta
from tests.reference.rope_oracle import default as ref_theta

CASES = Cases()
bad, good = CASES.bad, CASES.good


# mrope_cos_sin
_INV8 = torch.tensor(ref_theta(8))                                                  # dim 8: (4,) float64
_PT = torch.arange(5)[:, None].expand(5, 3)                                         # text-only (S, 3)
_PIMG = torch.tensor([[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]]).T.contiguous()   # (S, 3):
# text, text, a 2x2 image, text; axes t, h, w last
for _id, _pos, _inv, _sec, _kw, _exc, _match in [
    ("positions-(B,S)", torch.arange(5)[None].expand(2, 5), _INV8, [2, 1, 1], {}, ValueError,
     r"positions must have shape \(S, 3\) or \(B, S, 3\), axes t, h, w last.*unsqueeze\(-1\)\.expand\(\*positions\.shape, 3\)"),
    ("positions-1-d", torch.arange(5), _INV8, [2, 1, 1], {}, ValueError,
     r"positions must have shape \(S, 3\) or \(B, S, 3\), axes t, h, w last; got \(5,\)"),
    ("positions-4-rows", torch.zeros(4, 5, dtype=torch.long), _INV8, [2, 1, 1], {}, ValueError,
     r"positions must have shape \(S, 3\).*positions\[1:\]\.movedim\(0, -1\)"),
    ("positions-4-axes", torch.zeros(5, 4, dtype=torch.long), _INV8, [2, 1, 1], {}, ValueError,
     r"positions must have shape \(S, 3\).*positions\[\.\.\., 1:\]"),
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
    ("per-row-int16", lambda: torch.stack([_PIMG, _PIMG.flip(0)]).to(torch.int16), [1, 2, 1], {},
     lambda p: tuple(f(ref_mrope_angles(p, 8, (1, 2, 1))) for f in (np.cos, np.sin)), 1e-6),
    ("uint8", lambda: (_PIMG + 250).to(torch.uint8), [2, 1, 1], {},
     lambda p: tuple(f(ref_mrope_angles(p, 8, (2, 1, 1))) for f in (np.cos, np.sin)), 1e-6),
    ("negative", lambda: _PIMG - 3, [2, 1, 1], {}, lambda p: tuple(f(ref_mrope_angles(p, 8, (2, 1, 1))) for f in (np.cos, np.sin)),
     1e-6),
    ("expanded", lambda: _PIMG[None].expand(2, 7, 3), [2, 1, 1], {},
     lambda p: tuple(f(ref_mrope_angles(p, 8, (2, 1, 1))) for f in (np.cos, np.sin)), 1e-6),
    ("non-contiguous", lambda: _PIMG.t().contiguous().t(), [0, 2, 2], {},
     lambda p: tuple(f(ref_mrope_angles(p, 8, (0, 2, 2))) for f in (np.cos, np.sin)), 1e-6),
    ("one-axis-sections", lambda: _PIMG, [4, 0, 0], {}, lambda p: ref_cos_sin(arr(_PIMG)[:, 0], 8), 1e-6),
    ("interleaved", lambda: _PIMG, [2, 1, 1], {"mrope_interleaved": True},
     lambda p: tuple(f(ref_mrope_angles(p, 8, (2, 1, 1), interleaved=True)) for f in (np.cos, np.sin)), 1e-6),
    ("attention_factor-float64", lambda: _PIMG, [2, 1, 1], {"attention_factor": 2, "dtype": torch.float64},
     lambda p: tuple(2 * f(ref_mrope_angles(p, 8, (2, 1, 1))) for f in (np.cos, np.sin)), 1e-13),
    ("bfloat16", lambda: _PIMG, [2, 1, 1], {"dtype": torch.bfloat16},
     lambda p: tuple(f(ref_mrope_angles(p, 8, (2, 1, 1))) for f in (np.cos, np.sin)), 4e-3),
    ("empty", lambda: torch.zeros(0, 3, dtype=torch.long), [2, 1, 1], {}, lambda p: (np.zeros((0, 4)),) * 2, 0),
    ("empty-per-row", lambda: torch.zeros(2, 0, 3, dtype=torch.long), [2, 1, 1], {}, lambda p: (np.zeros((2, 0, 4)),) * 2, 0),
]:
    good("mrope_cos_sin", _id, lambda m=_make, s=_sec, kw=_kw: (mrope_cos_sin(m(), _INV8, s, **kw), m()),
         lambda r, w=_want, a=_atol: close(r[0], w(arr(r[1])), atol=a, rtol=max(a, 1e-6)))
good("mrope_cos_sin", "inv_freq-float32", lambda: mrope_cos_sin(_PT, _INV8.float(), [2, 1, 1]),
     lambda r: close(r, ref_cos_sin_theta(np.arange(5), _INV8.float().double().numpy())))
good("mrope_cos_sin", "meta", lambda: mrope_cos_sin(_PIMG.to(META), _INV8, [2, 1, 1]), is_meta(((7, 4), (7, 4))))


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
    ("engine", {"engine": "cuda"}, ValueError, "engine must be one of"),
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
     r"positions must have shape \(S, 3\) or \(B, S, 3\), axes t, h, w last; got \(1, 7\)"),
    ("positions-1-d", lambda m: m(_QM, positions=torch.arange(7)), ValueError,
     r"positions must have shape \(S, 3\) or \(B, S, 3\), axes t, h, w last; got \(7,\)"),
    ("positions-4-rows", lambda m: m(_QM, positions=torch.zeros(4, 1, 7, dtype=torch.long)), ValueError,
     r"positions\[1:\]\.movedim\(0, -1\)"),
    ("positions-4-axes", lambda m: m(_QM, positions=torch.zeros(1, 7, 4, dtype=torch.long)), ValueError,
     r"positions\[\.\.\., 1:\]"),
    ("positions-float", lambda m: m(_QM, positions=_PIMG.float()), TypeError, "positions must hold integers"),
    ("positions-wrong-S", lambda m: m(_QM, positions=_PIMG[:6]), ValueError,
     r"positions must have shape \(S, 3\) or \(B, S, 3\) with B=1, S=7; got \(6, 3\)"),
    ("positions-wrong-B", lambda m: m(_QM, positions=_PIMG[None].expand(2, 7, 3)), ValueError,
     r"positions must have shape .* B=1, S=7; got \(2, 7, 3\)"),
    ("positions-batched-for-2-d-q", lambda m: m(rand(7, 8), positions=_PIMG[None]), ValueError,
     r"positions must have shape \(S, 3\), S=7"),
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
    ("assume_valid-str", lambda m: m(_QM, positions=_PIMG, assume_valid="y"), TypeError, "assume_valid must be a bool"),
    ("assume-broken-promise", lambda m: MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=2)(
        _QM, positions=_PIMG, assume_valid=True), ValueError, r"positions must lie in \[0, 2\) .*assume_valid=True"),
    # a negative position promised in the table must not wrap around to the table's last rows (torch.take)
    ("assume-broken-promise-negative", lambda m: MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=8)(
        _QM, positions=_PIMG - 1, assume_valid=True), ValueError, r"positions must lie in \[0, 8\) .*assume_valid=True"),
    ("cos_sin-positions", lambda m: m.cos_sin(torch.arange(7)), ValueError,
     r"positions must have shape \(S, 3\) or \(B, S, 3\), axes t, h, w last; got \(7,\)"),
    ("cos_sin-dtype", lambda m: m.cos_sin(_PIMG, dtype=torch.int32), TypeError, "dtype must be one of"),
    ("cos_sin-assume_valid-int", lambda m: m.cos_sin(_PIMG, assume_valid=1), TypeError, "assume_valid must be a bool"),
    ("from_hf_config-none", lambda m: MultimodalRotaryEmbedding.from_hf_config(None), TypeError, "config must be a transformers"),
    ("from_hf_config-1-d", lambda m: MultimodalRotaryEmbedding.from_hf_config({"head_dim": 8}), ValueError,
     "this config has no mrope_section"),
]:
    bad("MultimodalRotaryEmbedding", _id, lambda c=_call: c(MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=16)), _exc, _match)
# the old name with a bad value: refused under that name, without a warning (as every rotary entry point)
for _id, _call in [
    ("assume_in_table-str", lambda m: m(_QM, positions=_PIMG, assume_in_table="y")),
    ("cos_sin-assume-int", lambda m: m.cos_sin(_PIMG, assume_in_table=1)),
]:
    bad("MultimodalRotaryEmbedding", _id, lambda c=_call: c(MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=16)), TypeError,
        "assume_in_table must be a bool")


def _mrope_qk(case_id, make_module, make_qk, kw, want, atol=1e-5):
    def thunk():
        q, k = make_qk()
        q0, k0 = q.detach().clone(), None if k is None else k.detach().clone()
        return make_module()(q, k, **kw), q0, k0

    def check(r):
        (qo, ko), q0, k0 = r
        check_rotated(qo, ko, q0, *want(q0, k0), atol)
    good("MultimodalRotaryEmbedding", case_id, thunk, check)


def _mrope_want(p3, section=(2, 1, 1), layout="half", interleaved=False, seq1=False):
    def one(t):
        if t is None:
            return None
        if seq1:
            return np.swapaxes(ref_mrope(np.swapaxes(arr(t), 1, 2), p3, 8, section, layout=layout, interleaved=interleaved), 1, 2)
        return ref_mrope(t, p3, 8, section, layout=layout, interleaved=interleaved)
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
    ("batch-shared-(1,S,3)", lambda: _MR(8, [2, 1, 1]), lambda: (rand(3, 2, 7, 8), rand(3, 1, 7, 8)),
     {"positions": _PIMG[None]}, _mrope_want(arr(_PIMG)), 1e-5),
    ("per-row-int16", lambda: _MR(8, [1, 1, 2]), lambda: (rand(2, 2, 7, 8), None),
     {"positions": torch.stack([_PIMG, _PIMG.flip(0)]).to(torch.int16)},
     _mrope_want(np.stack([arr(_PIMG), arr(_PIMG)[::-1]]), (1, 1, 2)), 1e-5),
    ("uint8-assumed", lambda: _MR(8, [2, 1, 1]), lambda: (rand(1, 2, 7, 8), None),
     {"positions": _PIMG.to(torch.uint8), "assume_valid": True}, _mrope_want(arr(_PIMG)), 1e-5),
    ("past-table-negative", lambda: _MR(8, [2, 1, 1], max_seq_len=2), lambda: (rand(1, 2, 7, 8), None),
     {"positions": _PIMG * 3 - 5}, _mrope_want(arr(_PIMG) * 3 - 5), 1e-5),
    ("empty-seq", lambda: _MR(8, [2, 1, 1]), lambda: (torch.zeros(1, 2, 0, 8), torch.zeros(1, 1, 0, 8)),
     {"positions": torch.zeros(0, 3, dtype=torch.long)}, lambda q, k: (np.zeros((1, 2, 0, 8)), np.zeros((1, 1, 0, 8))), 0),
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
     {"positions": _PIMG[None].expand(2, 7, 3)}, _mrope_want(arr(_PIMG)), 1e-5),
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
    _QM.to(META), positions=_PIMG.to(META))[0], is_meta((1, 2, 7, 8)))
good("MultimodalRotaryEmbedding", "cos_sin-text-is-rope", lambda: _MR(8, [2, 1, 1], max_seq_len=2).cos_sin(
    torch.tensor([[-1], [9]]).expand(2, 3)), lambda r: close(r, ref_cos_sin(np.array([-1, 9]), 8)))


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
    """Positions (B, S, 3), axes last, equal ``want_pos`` on the real tokens (``real``: (B, S) bool, default all),
    deltas (B, 1).  ``want_pos`` is written rows t, h, w first, (3, B, S), as read off the rule."""
    def check(r):
        pos, delta = r
        want = np.moveaxis(np.asarray(want_pos, dtype=np.int64), 0, -1)                # (B, S, 3)
        assert pos.dtype == torch.int64 and tuple(pos.shape) == want.shape, (pos.dtype, pos.shape)
        mask = np.ones(want.shape[:-1], bool) if real is None else np.asarray(real, bool)
        np.testing.assert_array_equal(pos.numpy()[mask], want[mask])
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
    lambda r: (r[0].is_meta and r[0].shape == (1, 7, 3) and r[1].is_meta) or pytest.fail("not meta results"))


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


@pytest.mark.parametrize("name, thunk, error, check", CASES.params)
def test_bad_input(name, thunk, error, check):
    run_case(thunk, error, check)
