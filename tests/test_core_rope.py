"""RoPE frequencies and context-extension rules: goldens, oracle parity, HF parity, validation."""

import json
import math

import numpy as np
import pytest

import posenc
from posenc.core import rope
from tests.reference import rope_oracle as oracle

RTOL = 1e-13   # the oracle is float64; posenc's Decimal frequencies are rounded once


def freqs(rule, dim=128, base=10000.0, seq_len=None):
    return rope.inv_freq(dim, base, rule, seq_len)


def test_default_golden_head_dim_128():
    # HF test_default_rope_numerically / FAILURE_MODES 3.2: [1.0, 0.86596, 0.74989, 0.64938, ..., 1.1548e-4]
    f, factor = freqs(None)
    assert f[:4] == pytest.approx([1.0, 0.86596, 0.74989, 0.64938], abs=5e-6)
    assert f[-1] == pytest.approx(1.1548e-4, rel=1e-4)
    assert factor == 1.0


def test_llama31_8b_golden():
    # FAILURE_MODES 3.3: base 5e5, d 128, factor 8, low 1, high 4, original 8192
    f, factor = freqs(posenc.Llama3Scaling(8.0, 8192, low_freq_factor=1.0, high_freq_factor=4.0), base=5e5)
    assert f[0] == 1.0 and factor == 1.0
    assert f[20] == pytest.approx(1.6560e-2, rel=1e-4)
    assert f[40] == pytest.approx(3.4281e-5, rel=1e-4)
    assert f[63] == pytest.approx(3.0689e-7, rel=1e-4)


CASES = [
    ("default", None, lambda d, b: oracle.default(d, b)),
    ("linear", posenc.LinearScaling(4.0), lambda d, b: oracle.linear(d, b, 4.0)),
    ("ntk", posenc.NTKScaling(8.0), lambda d, b: oracle.ntk(d, b, 8.0)),
    ("yarn", posenc.YarnScaling(10.0, 2048), lambda d, b: oracle.yarn(d, b, 10.0, 2048)),
    ("yarn-no-truncate", posenc.YarnScaling(16.0, 4096, beta_fast=16, beta_slow=2, truncate=False),
     lambda d, b: oracle.yarn(d, b, 16.0, 4096, 16, 2, truncate=False)),
    ("llama3", posenc.Llama3Scaling(10.0, 2048), lambda d, b: oracle.llama3(d, b, 10.0, 2048)),
]


@pytest.mark.parametrize("name, rule, ref", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dim, base", [(128, 10000.0), (64, 500000.0), (32, 1e6), (8, 10000.0)])
def test_rules_match_the_float64_oracle(name, rule, ref, dim, base):
    f, _ = freqs(rule, dim, base)
    np.testing.assert_allclose(f, ref(dim, base), rtol=RTOL, atol=0)


@pytest.mark.parametrize("seq_len", [None, 1, 2048, 2049, 16384, 100000])
def test_dynamic_ntk_matches_oracle_and_depends_only_on_seq_len(seq_len):
    rule = posenc.DynamicNTKScaling(10.0, 2048)
    f, _ = freqs(rule, seq_len=seq_len)
    np.testing.assert_allclose(f, oracle.dynamic(128, 1e4, 10.0, 2048, seq_len or 0), rtol=RTOL)
    assert np.all(np.isfinite(f)) and np.all(f > 0)


def test_dynamic_ntk_short_long_short_is_stateless():
    rule = posenc.DynamicNTKScaling(4.0, 1024)
    short1, _ = freqs(rule, seq_len=100)
    long, _ = freqs(rule, seq_len=8000)
    short2, _ = freqs(rule, seq_len=100)
    assert np.array_equal(short1, short2) and np.array_equal(short1, freqs(None)[0])
    assert np.all(long <= short1) and long[-1] < short1[-1]


def test_linear_is_default_over_factor_and_positions_interpolate():
    f, _ = freqs(posenc.LinearScaling(4.0))
    np.testing.assert_allclose(f * 4.0, freqs(None)[0], rtol=1e-15)


def test_yarn_is_bounded_and_extremes():
    rule = posenc.YarnScaling(10.0, 2048)
    f, factor = freqs(rule)
    d = freqs(None)[0]
    assert np.all(f <= d * (1 + 1e-15)) and np.all(f >= d / 10 * (1 - 1e-15))
    assert f[0] == d[0]                                  # fastest pairs keep their frequency
    np.testing.assert_allclose(f[-1], d[-1] / 10, rtol=1e-15)   # slowest are interpolated
    assert factor == pytest.approx(0.1 * math.log(10) + 1)
    # beta_fast huge: every pair with < beta_fast rotations is interpolated (HF property test)
    f2, _ = freqs(posenc.YarnScaling(10.0, 2048, beta_fast=1000))
    np.testing.assert_allclose(f2[-20:], d[-20:] / 10, rtol=1e-15)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(), 0.1 * math.log(40) + 1),
        (dict(mscale=1.0, mscale_all_dim=1.0), 1.0),                    # DeepSeek-V2 style
        (dict(mscale=0.707, mscale_all_dim=0.707), 1.0),
        (dict(mscale=1.0, mscale_all_dim=0.0), 0.1 * math.log(40) + 1),  # mscale_all_dim falsy -> default
        (dict(attention_factor_override=0.5), 0.5),                     # used as given, not multiplied again
        (dict(attention_factor_override=1.0, mscale=1.0, mscale_all_dim=0.5), 1.0),
    ],
)
def test_yarn_attention_factor(kwargs, expected):
    rule = posenc.YarnScaling(40.0, 4096, **kwargs)
    assert rule.attention_factor() == pytest.approx(expected, rel=1e-15)
    ref_kwargs = {k: v for k, v in kwargs.items() if k in ("mscale", "mscale_all_dim")}
    if "attention_factor_override" not in kwargs:
        assert rule.attention_factor() == pytest.approx(oracle.yarn_attention_factor(40.0, **ref_kwargs))


def _longrope():
    short = [1.0 + 0.01 * i for i in range(64)]
    long = [1.0 + 0.5 * i for i in range(64)]
    return posenc.LongRopeScaling(short, long, 4096, factor=32.0), short, long


@pytest.mark.parametrize("seq_len, which", [(None, "short"), (4096, "short"), (4097, "long"), (131072, "long")])
def test_longrope_switches_strictly_after_the_original_length(seq_len, which):
    rule, short, long = _longrope()
    f, factor = freqs(rule, seq_len=seq_len)
    np.testing.assert_allclose(f, oracle.longrope(128, 1e4, short, long, 4096, seq_len), rtol=RTOL)
    np.testing.assert_allclose(f, oracle.default(128, 1e4) / np.array(short if which == "short" else long), rtol=RTOL)
    assert factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))


def test_longrope_factor_one_has_unit_attention_factor():
    assert posenc.LongRopeScaling([1.0] * 4, [2.0] * 4, 100).attention_factor() == 1.0


def test_rules_are_frozen_and_hashable():
    rule = posenc.YarnScaling(4.0, 1024)
    assert hash(rule) == hash(posenc.YarnScaling(4.0, 1024))
    with pytest.raises(AttributeError):
        rule.factor = 2.0


@pytest.mark.parametrize(
    "make, err, match",
    [
        (lambda: posenc.LinearScaling(0.5), ValueError, "factor must be >= 1"),
        (lambda: posenc.LinearScaling("2"), TypeError, "factor must be a real number"),
        (lambda: posenc.NTKScaling(float("nan")), ValueError, "factor must be finite"),
        (lambda: posenc.DynamicNTKScaling(2.0, 0), ValueError, "original_max_seq_len must be >= 1"),
        (lambda: posenc.YarnScaling(4.0, 1024, beta_fast=-1), ValueError, "beta_fast must be > 0"),
        (lambda: posenc.YarnScaling(4.0, 1024, truncate="yes"), TypeError, "truncate must be a bool"),
        (lambda: posenc.Llama3Scaling(8.0, 8192, low_freq_factor=4.0, high_freq_factor=1.0), ValueError, "high_freq_factor must be >"),
        (lambda: posenc.LongRopeScaling([1.0, 2.0], [1.0], 100), ValueError, "same length"),
        (lambda: posenc.LongRopeScaling([1.0, -2.0], [1.0, 1.0], 100), ValueError, r"short_factor\[1\] must be > 0"),
        (lambda: rope.inv_freq(7, 1e4), ValueError, "rotary dim must be even"),
        (lambda: rope.inv_freq(8, -1.0), ValueError, "base must be > 0"),
        (lambda: rope.inv_freq(8, 1e4, "yarn"), TypeError, "scaling must be None or a posenc scaling rule"),
        (lambda: rope.inv_freq(8, 1e4, posenc.LongRopeScaling([1.0] * 3, [1.0] * 3, 10)), ValueError, "needs 4"),
        (lambda: rope.inv_freq(2, 1e4, posenc.NTKScaling(2.0)), ValueError, "needs dim > 2"),
    ],
)
def test_bad_rules_raise(make, err, match):
    with pytest.raises(err, match=match):
        make()


# --- Hugging Face config.json dicts --------------------------------------------------------------

LLAMA31 = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072, "rope_theta": 500000.0,
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}}
QWEN_YARN = {"hidden_size": 3584, "num_attention_heads": 28, "max_position_embeddings": 32768, "rope_theta": 1e6,
             "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
DEEPSEEK_YARN = {"hidden_size": 2048, "num_attention_heads": 16, "head_dim": 64, "max_position_embeddings": 163840,
                 "rope_theta": 10000.0, "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                 "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096}}
PHI3 = {"hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0 + 0.02 * i for i in range(48)],
                         "long_factor": [1.0 + 0.9 * i for i in range(48)]}}
NEOX = {"hidden_size": 2048, "num_attention_heads": 8, "rotary_pct": 0.25, "partial_rotary_factor": 0.25,
        "max_position_embeddings": 2048, "rope_theta": 10000.0}
LINEAR_OLD = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096,
              "rope_scaling": {"type": "linear", "factor": 2.0}}
DYNAMIC = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096,
           "rope_scaling": {"type": "dynamic", "factor": 2.0}}
NEW_STYLE = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
             "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}


def test_from_hf_llama31():
    base, dim, rule = posenc.rope_scaling_from_hf(LLAMA31)
    assert (base, dim) == (500000.0, 128)
    assert rule == posenc.Llama3Scaling(8.0, 8192, 1.0, 4.0)
    assert posenc.rope_scaling_from_hf(NEW_STYLE) == (base, dim, rule)


def test_from_hf_other_models():
    assert posenc.rope_scaling_from_hf(QWEN_YARN) == (1e6, 128, posenc.YarnScaling(4.0, 32768))
    base, dim, rule = posenc.rope_scaling_from_hf(DEEPSEEK_YARN)
    assert dim == 64 and rule.attention_factor() == pytest.approx(1.0)
    base, dim, rule = posenc.rope_scaling_from_hf(PHI3)
    assert dim == 96 and rule.original_max_seq_len == 4096 and rule.factor == 32.0
    assert posenc.rope_scaling_from_hf(NEOX) == (10000.0, 64, None)
    assert posenc.rope_scaling_from_hf(LINEAR_OLD)[2] == posenc.LinearScaling(2.0)
    assert posenc.rope_scaling_from_hf(DYNAMIC)[2] == posenc.DynamicNTKScaling(2.0, 4096)
    assert posenc.rope_scaling_from_hf(json.loads(json.dumps(LLAMA31)))[1] == 128


@pytest.mark.parametrize(
    "config, match",
    [
        ({**LLAMA31, "rope_scaling": {"rope_type": "mrope", "factor": 2.0}}, "unknown rope scaling type 'mrope'"),
        ({**LLAMA31, "rope_scaling": {"rope_type": "linear"}}, "needs 'factor'"),
        ({**LLAMA31, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "needs 'low_freq_factor'"),
        ({**LLAMA31, "rope_scaling": {"type": "longrope", "long_factor": [1.0]}}, "needs 'short_factor'"),
        ({"rope_theta": 1e4}, "needs head_dim"),
        ({**LLAMA31, "rope_scaling": [1, 2]}, "must be a dict"),
    ],
)
def test_from_hf_rejects_unknown_or_malformed(config, match):
    with pytest.raises(ValueError, match=match):
        posenc.rope_scaling_from_hf(config)


# --- parity with Hugging Face transformers' own functions -------------------------------------------

HF_CASES = [
    ("default", {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096}, [None]),
    ("llama3", LLAMA31, [None]),
    ("llama3-new", NEW_STYLE, [None]),
    ("linear", LINEAR_OLD, [None]),
    ("dynamic", DYNAMIC, [None, 100, 4096, 16384]),
    ("yarn", QWEN_YARN, [None]),
    ("yarn-deepseek", DEEPSEEK_YARN, [None]),
    ("yarn-10x", {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 20480,
                  "rope_scaling": {"rope_type": "yarn", "factor": 10.0, "beta_fast": 32, "beta_slow": 1,
                                   "original_max_position_embeddings": 2048}}, [None]),
    ("longrope", PHI3, [None, 4096, 4097]),
    ("partial", {**NEOX, "rope_scaling": {"type": "linear", "factor": 2.0}}, [None]),
]


@pytest.mark.parametrize("name, config, seq_lens", HF_CASES, ids=[c[0] for c in HF_CASES])
def test_parity_with_transformers(name, config, seq_lens):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = transformers.LlamaConfig(**json.loads(json.dumps(config)))
    params = hf_config.rope_parameters
    rope_type = params.get("rope_type", "default")
    base, dim, rule = posenc.rope_scaling_from_hf(config)
    for seq_len in seq_lens:
        if rope_type == "default":
            hf_base = params["rope_theta"]
            hf_freq = 1.0 / (hf_base ** (np.arange(0, dim, 2) / dim))
            hf_factor = 1.0
        else:
            inv, hf_factor = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu", seq_len)
            hf_freq = inv.double().numpy()
        ours, factor = rope.inv_freq(dim, base, rule, seq_len)
        # transformers computes in float32: agree to float32 rounding
        np.testing.assert_allclose(ours, hf_freq, rtol=3e-6, atol=0, err_msg=f"seq_len={seq_len}")
        assert factor == pytest.approx(hf_factor, rel=1e-12)
