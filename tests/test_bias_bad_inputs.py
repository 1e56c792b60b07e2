"""Bad inputs of ALiBi and T5 biases: alibi_slopes, alibi_bias, AlibiBias, relative_position_bucket, relative_distances, clipped_relative_position, RelativePositionBias.

Each case either matches an independent float64 reference from ``tests/reference/`` or raises
``ValueError``/``TypeError`` naming the offending argument; any other exception or any warning fails it
(``tests/bad_inputs.py``).  ``tests/test_bad_inputs.py`` walks every public name against these cases.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posenc
import posenc.functional as F
from posenc import (
    AlibiBias,
    RelativePositionBias,
)
from tests.bad_inputs import (
    INF,
    META,
    NAN,
    SLOPES,
    Cases,
    arr,
    close,
    rand,
    run_case,
)
from tests.reference.bias_oracle import alibi_bias as ref_alibi
from tests.reference.bias_oracle import alibi_slopes as ref_slopes
from tests.reference.bias_oracle import clipped_index as ref_clipped
from tests.reference.bias_oracle import t5_buckets as ref_bucket

CASES = Cases()
bad, good = CASES.bad, CASES.good


# ---- ALiBi and T5 biases ---------------------------------------------------------------------------

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
    ("max_distance-negative", lambda: F.clipped_relative_position(_A, max_distance=-1), ValueError,
     "max_distance must be >= 0"),
    ("max_distance-float", lambda: F.clipped_relative_position(_A, max_distance=2.0), TypeError,
     "max_distance must be an int"),
    ("max_distance-nan", lambda: F.clipped_relative_position(_A, max_distance=NAN), TypeError,
     "max_distance must be an int"),
    ("max_distance-bool", lambda: F.clipped_relative_position(_A, max_distance=True), TypeError,
     "max_distance must be an int"),
    ("min_distance-positive", lambda: F.clipped_relative_position(_A, max_distance=2, min_distance=1), ValueError,
     "min_distance must be <= 0"),
    ("symmetric-int", lambda: F.clipped_relative_position(_A, max_distance=2, symmetric=1), TypeError,
     "symmetric must be a bool"),
    ("float-distances", lambda: F.clipped_relative_position(torch.tensor([0.5]), max_distance=2), TypeError,
     "relative_position"),
]:
    bad("clipped_relative_position", _id, _call, _exc, _match)
good("clipped_relative_position", "int64-extremes",
     lambda: F.clipped_relative_position(torch.tensor([-(2**63), 2**63 - 1, -3, 0, 2]), max_distance=2),
     lambda out: close(out, ref_clipped([-(2**63), 2**63 - 1, -3, 0, 2], 2)))
good("clipped_relative_position", "zero-window", lambda: F.clipped_relative_position(torch.arange(-3, 4), max_distance=0),
     lambda out: close(out, ref_clipped(np.arange(-3, 4), 0)))
good("clipped_relative_position", "conformer-symmetric",
     lambda: F.clipped_relative_position(torch.arange(-9, 10).reshape(19, 1), max_distance=4, min_distance=-5,
                                         symmetric=True),
     lambda out: close(out, ref_clipped(np.arange(-9, 10).reshape(19, 1), 4, -5, symmetric=True)))

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



# extreme finite values: tiny and huge bases, factors, frequencies, lengths, scales
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


@pytest.mark.parametrize("name, thunk, error, check", CASES.params)
def test_bad_input(name, thunk, error, check):
    run_case(thunk, error, check)
