"""Bad inputs of rms_norm_rope_qk.

Each case either matches an independent float64 reference from ``tests/reference/`` or raises
``ValueError``/``TypeError`` naming the offending argument; any other exception or any warning fails it
(``tests/bad_inputs.py``).  ``tests/test_bad_inputs.py`` walks every public name against these cases.
"""

from __future__ import annotations

import pytest
import torch

import posenc.functional as F
from tests.bad_inputs import (
    C8,
    NAN,
    S8,
    Cases,
    close,
    rand,
    run_case,
)
from tests.reference.rope_oracle import rms_norm_rope as ref_norm_rope

CASES = Cases()
bad, good = CASES.bad, CASES.good


# rms_norm_rope_qk: RMSNorm of each head (weight (D,)) or of the whole token (weight (H*D,)), then RoPE

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


@pytest.mark.parametrize("name, thunk, error, check", CASES.params)
def test_bad_input(name, thunk, error, check):
    run_case(thunk, error, check)
