"""Bad inputs of posenc.testing: inspect_rope, assert_rope_close, inspect_bias, inspect_table, audit_hf.

Each case either matches an independent reference (the float64 oracles of ``tests/reference/``, or a value
derived by hand) or raises ``ValueError``/``TypeError`` naming the offending argument; any other exception or
any warning fails it (``tests/bad_inputs.py``).  ``tests/test_bad_inputs.py`` walks every public name
against these cases.
"""

from __future__ import annotations

import pathlib
import tempfile

import numpy as np
import pytest
import torch

import posenc
from posenc.testing import assert_rope_close, audit_hf, inspect_bias, inspect_rope, inspect_table
from tests.bad_inputs import Cases, close, run_case
from tests.reference import bias_oracle, peer_rope, rope_oracle
from tests.reference.oracle import sinusoidal_f64

CASES = Cases()
bad, good = CASES.bad, CASES.good

_HF8 = peer_rope.make_hf(8)
_SPEC8 = posenc.RopeSpec(8)


def _wrong_shape(q, k, positions):
    return q[..., :4], k


# ---- inspect_rope ------------------------------------------------------------------------------------

for _id, _call, _exc, _match in [
    ("fn-not-callable", lambda: inspect_rope(3, head_dim=8), TypeError, "fn must be callable"),
    ("head_dim-1", lambda: inspect_rope(_HF8, head_dim=1), ValueError, "head_dim must be >= 2"),
    ("head_dim-float", lambda: inspect_rope(_HF8, head_dim=8.0), TypeError, "head_dim must be an int"),
    ("call-unknown", lambda: inspect_rope(_HF8, head_dim=8, call="rot"), ValueError, "call must be one of"),
    ("qk_format-unknown", lambda: inspect_rope(_HF8, head_dim=8, qk_format="bsd"), ValueError,
     "qk_format must be one of"),
    ("max_position-8", lambda: inspect_rope(_HF8, head_dim=8, max_position=8), ValueError,
     "max_position must be >= 16"),
    ("threshold_ulps-0", lambda: inspect_rope(_HF8, head_dim=8, threshold_ulps=0), ValueError, "threshold_ulps"),
    ("dtypes-int", lambda: inspect_rope(_HF8, head_dim=8, dtypes=(torch.int64,)), TypeError,
     "dtypes must hold torch floating dtypes"),
    ("dtypes-empty", lambda: inspect_rope(_HF8, head_dim=8, dtypes=()), TypeError, "dtypes must be a non-empty"),
    ("cos_sin-without-apply", lambda: inspect_rope(_HF8, head_dim=8, call="rotate", cos_sin=lambda x, p: (x, x)),
     ValueError, "cos_sin= is only used with call='apply'"),
    ("apply-without-cos_sin", lambda: inspect_rope(_HF8, head_dim=8, call="apply"), ValueError,
     "call='apply' needs cos_sin="),
    ("cos_sin-not-callable", lambda: inspect_rope(_HF8, head_dim=8, cos_sin=3), TypeError, "cos_sin must be a callable"),
    ("fn-wrong-shape", lambda: inspect_rope(_wrong_shape, head_dim=8), ValueError, "fn returned q of shape"),
    ("fn-returns-one", lambda: inspect_rope(lambda q, k, p: q, head_dim=8), TypeError, r"fn must return \(q, k\)"),
    ("device-unknown", lambda: inspect_rope(_HF8, head_dim=8, device="nodevice"), ValueError, "device='nodevice'"),
    ("device-meta", lambda: inspect_rope(_HF8, head_dim=8, device="meta"), ValueError, "device='meta'"),
    ("fn-signature", lambda: inspect_rope(lambda a, b, c, d, e: a, head_dim=8), TypeError,
     "could not tell how to call fn"),
]:
    bad("inspect_rope", _id, _call, _exc, _match)

good("inspect_rope", "one-pair", lambda: inspect_rope(peer_rope.make_hf(2), head_dim=2, max_position=16),
     lambda r: (close(torch.tensor(r.frequencies), rope_oracle.default(2)), r.rotated == (0, 1) or pytest.fail(r)))
good("inspect_rope", "odd-head", lambda: inspect_rope(peer_rope.make_hf(4), head_dim=5, max_position=16),
     lambda r: (r.rotated == (0, 1, 2, 3) and r.placement == "leading") or pytest.fail(str(r)))
good("inspect_rope", "one-dtype", lambda: inspect_rope(_HF8, head_dim=8, dtypes=torch.bfloat16, max_position=64),
     lambda r: close(torch.tensor(r.frequencies), rope_oracle.default(8), rtol=2e-3))


# ---- assert_rope_close -------------------------------------------------------------------------------

for _id, _call, _exc, _match in [
    ("reference-int", lambda: assert_rope_close(_HF8, 3, head_dim=8), TypeError, "reference must be"),
    ("reference-wider", lambda: assert_rope_close(_HF8, posenc.RopeSpec(16), head_dim=8), ValueError,
     "the reference rotates 16 features but head_dim=8"),
    ("atol-negative", lambda: assert_rope_close(_HF8, _SPEC8, head_dim=8, atol=-1.0), ValueError, "atol"),
    ("freq_rtol-0", lambda: assert_rope_close(_HF8, _SPEC8, head_dim=8, freq_rtol=0.0), ValueError, "freq_rtol"),
    ("max_position-3", lambda: assert_rope_close(_HF8, _SPEC8, head_dim=8, max_position=3), ValueError,
     "max_position must be >= 16"),
    ("head_dim-str", lambda: assert_rope_close(_HF8, _SPEC8, head_dim="8"), TypeError, "head_dim must be an int"),
    ("config-mrope", lambda: assert_rope_close(_HF8, {"model_type": "qwen2_vl", "hidden_size": 32,
                                                      "num_attention_heads": 4, "rope_theta": 1e6,
                                                      "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]}},
                                               head_dim=8), ValueError, "multimodal RoPE"),
]:
    bad("assert_rope_close", _id, _call, _exc, _match)

good("assert_rope_close", "config-dict", lambda: assert_rope_close(
        _HF8, {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "rope_theta": 10000.0},
        head_dim=8, max_position=64),
     lambda r: close(torch.tensor(r.frequencies), rope_oracle.default(8)))
good("assert_rope_close", "float64-atol", lambda: assert_rope_close(
        _HF8, _SPEC8, head_dim=8, max_position=64, dtypes=(torch.float64,), atol=1e-5),
     lambda r: (r.layout == "half") or pytest.fail(str(r)))


# ---- inspect_bias ------------------------------------------------------------------------------------

_ALIBI2 = lambda q, k: torch.from_numpy(bias_oracle.alibi_bias(q.numpy(), k.numpy(), [0.5, 0.25]))  # noqa: E731

for _id, _call, _exc, _match in [
    ("fn-not-callable", lambda: inspect_bias(None, num_heads=2), TypeError, "fn must be callable"),
    ("num_heads-0", lambda: inspect_bias(_ALIBI2, num_heads=0), ValueError, "num_heads must be >= 1"),
    ("num_heads-wrong", lambda: inspect_bias(_ALIBI2, num_heads=3), ValueError, r"expected \(3, 512, 512\) \(num_heads=3"),
    ("length-4", lambda: inspect_bias(_ALIBI2, num_heads=2, length=4), ValueError, "length must be >= 8"),
    ("device-unknown", lambda: inspect_bias(_ALIBI2, num_heads=2, device="nodevice"), ValueError, "device="),
    ("fn-returns-array", lambda: inspect_bias(lambda q, k: np.zeros((2, 8, 8)), num_heads=2, length=8), TypeError,
     "fn must return a tensor"),
]:
    bad("inspect_bias", _id, _call, _exc, _match)

good("inspect_bias", "batch-axis", lambda: inspect_bias(lambda q, k: _ALIBI2(q, k)[None], num_heads=2, length=8),
     lambda r: close(torch.tensor(r.slopes), [0.5, 0.25]))
good("inspect_bias", "all-zero", lambda: inspect_bias(lambda q, k: torch.zeros(1, len(q), len(k)), num_heads=1,
                                                      length=8),
     lambda r: (r.kind == "zero") or pytest.fail(str(r)))


# ---- inspect_table -----------------------------------------------------------------------------------

for _id, _call, _exc, _match in [
    ("table-int", lambda: inspect_table(torch.zeros(8, 4, dtype=torch.int64)), TypeError,
     "table must hold floating values"),
    ("table-1d", lambda: inspect_table(torch.zeros(8)), ValueError, r"table must be \(P, D\)"),
    ("table-list", lambda: inspect_table([[0.0, 1.0]]), TypeError, "table must be a tensor, a NumPy array"),
    ("table-3-rows", lambda: inspect_table(np.zeros((3, 4))), ValueError, "P >= 4"),
    ("rows-2", lambda: inspect_table(lambda p: torch.zeros(len(p), 4), rows=2), ValueError, "rows must be >= 4"),
    ("base-negative", lambda: inspect_table(np.zeros((8, 4)), base=-1.0), ValueError, "base"),
    ("threshold_ulps-nan", lambda: inspect_table(np.zeros((8, 4)), threshold_ulps=float("nan")), ValueError,
     "threshold_ulps"),
]:
    bad("inspect_table", _id, _call, _exc, _match)

good("inspect_table", "leading-axis", lambda: inspect_table(sinusoidal_f64(np.arange(64), 8)[None]),
     lambda r: (r.layout == "interleaved" and r.base == 10000.0) or pytest.fail(str(r)))
good("inspect_table", "float16", lambda: inspect_table(sinusoidal_f64(np.arange(64), 8).astype(np.float16)),
     lambda r: (r.dtype == "float16" and r.max_ulps <= 1.0) or pytest.fail(str(r)))


# ---- audit_hf ----------------------------------------------------------------------------------------

for _id, _call, _exc, _match in [
    ("int", lambda: audit_hf(42), TypeError, "config_or_model must be"),
    ("missing-path", lambda: audit_hf("/nonexistent/model"), ValueError, "neither a config.json"),
    ("module-without-config", lambda: audit_hf(torch.nn.Linear(2, 2)), TypeError, "has no .config"),
    ("max_position-1", lambda: audit_hf({}, max_position=1), ValueError, "max_position must be >= 16"),
    ("inspect_modules-str", lambda: audit_hf({}, inspect_modules="no"), TypeError, "inspect_modules must be a bool"),
]:
    bad("audit_hf", _id, _call, _exc, _match)


def _not_json():
    path = pathlib.Path(tempfile.mkdtemp()) / "config.json"
    path.write_text("{not json")
    return audit_hf(path)


bad("audit_hf", "not-json", _not_json, ValueError, "is not JSON")
good("audit_hf", "partial-rotary", lambda: audit_hf({"model_type": "gpt_neox", "hidden_size": 256,
                                                     "num_attention_heads": 4, "num_hidden_layers": 1,
                                                     "rotary_pct": 0.25}, inspect_modules=False),
     lambda r: ("RoPE d=16 base=10000 half" in r.schedule) or pytest.fail(r.schedule))   # 64 x 0.25 = 16
good("audit_hf", "no-positions", lambda: audit_hf({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 1},
                                                   inspect_modules=False),
     lambda r: (r.flags == () and r.modules == ()) or pytest.fail(str(r)))


@pytest.mark.parametrize("name, thunk, error, check", CASES.params)
def test_bad_input(name, thunk, error, check):
    run_case(thunk, error, check)
