"""Reading RoPE settings from Hugging Face configurations, checked against transformers' own rotary
classes built from the same configuration (skipped where transformers is not installed), and against
raw config.json dicts with each family's keys."""

import copy
import json
import math
import warnings

import numpy as np
import pytest

import posenc
from posenc.core.hf_config import describe_rope_layout

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")


def _quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def _hf_rotary(config, cls_path, layer_type=None):
    """``(inv_freq, attention_scaling)`` of transformers' rotary module for ``config``."""
    module_name, cls_name = cls_path.rsplit(".", 1)
    module = __import__(f"transformers.models.{module_name}", fromlist=[cls_name])
    rotary = _quiet(getattr(module, cls_name), config)
    prefix = f"{layer_type}_" if layer_type else ""
    if layer_type and not hasattr(rotary, prefix + "inv_freq"):            # transformers 4.x: one module per type
        prefix = ""
        if layer_type == "sliding_attention":
            local = copy.deepcopy(config)
            local.rope_theta, local.rope_scaling = local.rope_local_base_freq, {"rope_type": "default"}
            rotary = _quiet(getattr(module, cls_name), local)
    inv = getattr(rotary, prefix + "inv_freq").double().numpy()
    return inv, float(getattr(rotary, prefix + "attention_scaling", 1.0))


FAMILIES = [
    # (name, config factory, rotary class, layer_type, expected layout)
    ("llama-llama3", lambda: transformers.LlamaConfig(
        hidden_size=256, num_attention_heads=4, max_position_embeddings=4096, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 512}),
     "llama.modeling_llama.LlamaRotaryEmbedding", None, "half"),
    ("mistral", lambda: transformers.MistralConfig(hidden_size=256, num_attention_heads=4, head_dim=96),
     "mistral.modeling_mistral.MistralRotaryEmbedding", None, "half"),
    ("qwen2-yarn", lambda: transformers.Qwen2Config(
        hidden_size=256, num_attention_heads=4, rope_theta=1e6, max_position_embeddings=8192,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}),
     "qwen2.modeling_qwen2.Qwen2RotaryEmbedding", None, "half"),
    ("phi3-longrope", lambda: transformers.Phi3Config(
        hidden_size=256, num_attention_heads=4, max_position_embeddings=4096, original_max_position_embeddings=1024,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(32)],
                      "long_factor": [1.0 + 0.5 * i for i in range(32)]}),
     "phi3.modeling_phi3.Phi3RotaryEmbedding", None, "half"),
    ("gpt-neox-partial", lambda: transformers.GPTNeoXConfig(
        hidden_size=256, num_attention_heads=4, rotary_pct=0.25, rotary_emb_base=1e6),
     "gpt_neox.modeling_gpt_neox.GPTNeoXRotaryEmbedding", None, "half"),
    ("cohere", lambda: transformers.CohereConfig(hidden_size=256, num_attention_heads=4),
     "cohere.modeling_cohere.CohereRotaryEmbedding", None, "interleaved"),
    ("glm", lambda: transformers.GlmConfig(hidden_size=256, num_attention_heads=4, head_dim=64),
     "glm.modeling_glm.GlmRotaryEmbedding", None, "interleaved"),
    ("deepseek-v3-yarn", lambda: transformers.DeepseekV3Config(
        hidden_size=256, num_attention_heads=4, qk_rope_head_dim=32, qk_nope_head_dim=64, max_position_embeddings=16384,
        rope_scaling={"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
                      "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707}),
     "deepseek_v3.modeling_deepseek_v3.DeepseekV3RotaryEmbedding", None, "interleaved"),
    ("gemma3-full", lambda: transformers.Gemma3TextConfig(
        hidden_size=256, num_attention_heads=4, head_dim=64, rope_scaling={"rope_type": "linear", "factor": 8.0}),
     "gemma3.modeling_gemma3.Gemma3RotaryEmbedding", "full_attention", "half"),
    ("gemma3-sliding", lambda: transformers.Gemma3TextConfig(
        hidden_size=256, num_attention_heads=4, head_dim=64, rope_scaling={"rope_type": "linear", "factor": 8.0}),
     "gemma3.modeling_gemma3.Gemma3RotaryEmbedding", "sliding_attention", "half"),
]


@pytest.mark.parametrize("name, make, cls_path, layer_type, layout", FAMILIES, ids=[f[0] for f in FAMILIES])
@pytest.mark.parametrize("as_dict", [False, True], ids=["PretrainedConfig", "to_dict"])
def test_config_reading_matches_transformers_rotary_class(name, make, cls_path, layer_type, layout, as_dict):
    config = _quiet(make)
    hf_inv, hf_scale = _hf_rotary(config, cls_path, layer_type)
    source = json.loads(json.dumps(config.to_dict())) if as_dict else config
    rope = posenc.RotaryEmbedding.from_hf_config(source, layer_type=layer_type, max_seq_len=8)
    assert rope.dim == 2 * len(hf_inv)
    np.testing.assert_allclose(rope.inv_freq.numpy(), hf_inv, rtol=3e-6, atol=0)   # HF computes in float32
    assert rope.attention_factor == pytest.approx(hf_scale, rel=1e-6)
    assert rope.layout == layout


def test_gptj_reads_rotary_dim_and_is_interleaved():
    config = _quiet(transformers.GPTJConfig, n_embd=256, n_head=4, rotary_dim=32)
    from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions

    table = create_sinusoidal_positions(16, 32)                     # [sin | cos] of positions 0..15
    rope = posenc.RotaryEmbedding.from_hf_config(config, max_seq_len=16)
    assert (rope.dim, rope.layout, rope.base) == (32, "interleaved", 10000.0)
    np.testing.assert_allclose(rope.sin_table.numpy(), table[:, :16].numpy(), atol=2e-6)
    np.testing.assert_allclose(rope.cos_table.numpy(), table[:, 16:].numpy(), atol=2e-6)


# --- raw config.json dicts, as files on the hub hold them ---------------------------------------------

NEOX_JSON = {"model_type": "gpt_neox", "hidden_size": 2048, "num_attention_heads": 16, "rotary_pct": 0.25,
             "rotary_emb_base": 1000000, "max_position_embeddings": 4096}
DEEPSEEK_V3_JSON = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
                    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "rope_theta": 10000,
                    "max_position_embeddings": 163840,
                    "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}}
GEMMA3_JSON = {"model_type": "gemma3_text", "hidden_size": 2560, "num_attention_heads": 8, "head_dim": 256,
               "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
               "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}
GPTJ_JSON = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64, "n_positions": 2048}
QWEN2_VL_JSON = {"model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28, "rope_theta": 1e6,
                 "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}


def test_raw_config_json_of_each_family():
    assert posenc.rope_scaling_from_hf(NEOX_JSON) == (1e6, 32, None)            # 25% of 128, base 1e6
    base, dim, rule = posenc.rope_scaling_from_hf(DEEPSEEK_V3_JSON)
    assert (base, dim) == (10000.0, 64) and rule == posenc.YarnScaling(40.0, 4096, mscale=1.0, mscale_all_dim=1.0)
    assert posenc.rope_layout_from_hf(DEEPSEEK_V3_JSON) == "interleaved"
    assert posenc.rope_layout_from_hf({**DEEPSEEK_V3_JSON, "rope_interleave": False}) == "half"
    assert posenc.rope_scaling_from_hf(GEMMA3_JSON, layer_type="full_attention") == (1e6, 256, posenc.LinearScaling(8.0))
    assert posenc.rope_scaling_from_hf(GEMMA3_JSON, layer_type="sliding_attention") == (10000.0, 256, None)
    assert posenc.rope_scaling_from_hf(GPTJ_JSON) == (10000.0, 64, None)
    assert posenc.rope_layout_from_hf(GPTJ_JSON) == "interleaved"
    assert posenc.rope_layout_from_hf(NEOX_JSON) == "half"


@pytest.mark.parametrize("flag, layout", [(True, "interleaved"), (False, "half"), (None, "half")])
def test_rope_interleave_decides_in_any_model_type(flag, layout):
    """DeepSeek's latent attention, copied by other model types (GLM-4 MoE Lite, Mistral 4), picks its rotate
    function by ``if config.rope_interleave``: the flag names the layout whatever the model type."""
    found = describe_rope_layout({**DEEPSEEK_V3_JSON, "model_type": "glm4_moe_lite", "rope_interleave": flag})
    assert (found.layout, found.known) == (layout, True)
    assert f"rope_interleave={flag!r}" in found.reason


@pytest.mark.parametrize(
    "config, kwargs, match",
    [
        (GEMMA3_JSON, {}, "pass layer_type="),
        (_quiet(transformers.Gemma3TextConfig).to_dict(), {}, "per layer type"),
        (_quiet(transformers.Gemma3TextConfig).to_dict(), {"layer_type": "global"}, "layer_type must be one of"),
        (QWEN2_VL_JSON, {}, "multimodal RoPE"),
        ({**NEOX_JSON, "rotary_pct": 0.0}, {}, "partial_rotary_factor must be > 0"),
        ({**NEOX_JSON, "rotary_pct": 0.001}, {}, "leaves no feature pair"),
        ({**NEOX_JSON, "rope_theta": None, "rotary_emb_base": None}, {}, "rope_theta must be a real number"),
        ({"hidden_size": 64, "num_attention_heads": 0}, {}, "num_attention_heads must be >= 1"),
    ],
)
def test_keys_that_would_change_the_result_are_never_dropped(config, kwargs, match):
    if match in ("per layer type", "layer_type must be one of") and not isinstance(config.get("rope_parameters"), dict):
        pytest.skip("this transformers version keeps one set of rope parameters per config")
    with pytest.raises((ValueError, TypeError), match=match):
        posenc.rope_scaling_from_hf(config, **kwargs)


def test_config_must_be_a_config_or_a_dict():
    with pytest.raises(TypeError, match="PretrainedConfig or a dict"):
        posenc.rope_scaling_from_hf([("hidden_size", 64)])


def test_proportional_rope_matches_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if "proportional" not in ROPE_INIT_FUNCTIONS:
        pytest.skip("this transformers version has no proportional RoPE")
    config = _quiet(transformers.LlamaConfig, hidden_size=256, num_attention_heads=2, head_dim=128,
                    rope_parameters={"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                     "factor": 2.0})
    hf_inv, hf_scale = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu")
    base, dim, rule = posenc.rope_scaling_from_hf(config)
    assert dim == 128 and rule == posenc.ProportionalScaling(0.25, factor=2.0)
    ours, factor = posenc.rope_inv_freq(dim, base=base, scaling=rule)
    np.testing.assert_allclose(ours.numpy(), hf_inv.double().numpy(), rtol=3e-6, atol=0)
    assert factor == hf_scale == 1.0
    assert (ours[16:] == 0).all() and ours[15] == pytest.approx(10000.0 ** (-30 / 128) / 2, rel=1e-12)
    assert math.isclose(float(ours[0]), 0.5)


# --- cached decoding with length-dependent rules, as transformers' models run it ---------------------

def _hf_style_decode(config, rotary_cls_path, q, k, v):
    """One attention layer decoded token by token the way transformers' models do it: cos/sin from
    the model's rotary module for each step's position, every key rotated once when it is cached."""
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    module_name, cls_name = rotary_cls_path.rsplit(".", 1)
    module = __import__(f"transformers.models.{module_name}", fromlist=[cls_name])
    rotary = _quiet(getattr(module, cls_name), config)
    outs, cache = [], []
    for t in range(q.shape[2]):
        cos, sin = rotary(q, torch.tensor([[t]]))
        q_t, k_t = apply_rotary_pos_emb(q[:, :, t : t + 1], k[:, :, t : t + 1], cos, sin)
        cache.append(k_t)
        keys = torch.cat(cache, 2)
        outs.append(torch.nn.functional.scaled_dot_product_attention(q_t, keys, v[:, :, : t + 1]))
    return torch.cat(outs, 2)


ROTATED_ONCE = [
    ("dynamic-ntk", lambda: transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=2, max_position_embeddings=8,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "llama.modeling_llama.LlamaRotaryEmbedding"),
    ("longrope", lambda: transformers.Phi3Config(
        hidden_size=64, num_attention_heads=2, max_position_embeddings=64, original_max_position_embeddings=8,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.3 * i for i in range(16)],
                      "long_factor": [1.0 + 2.0 * i for i in range(16)]}), "phi3.modeling_phi3.Phi3RotaryEmbedding"),
]


@pytest.mark.parametrize("name, make, cls_path", ROTATED_ONCE, ids=[c[0] for c in ROTATED_ONCE])
def test_keys_rotated_once_in_the_cache_match_transformers_decoding(name, make, cls_path):
    import torch

    torch.manual_seed(0)
    config = _quiet(make)
    q, k, v = torch.randn(1, 2, 24, 32), torch.randn(1, 2, 24, 32), torch.randn(1, 2, 24, 32)
    expected = _hf_style_decode(config, cls_path, q, k, v)                 # crosses the original length (8)
    rope = posenc.RotaryEmbedding.from_hf_config(config, max_seq_len=64)
    outs, cache = [], []
    for t in range(q.shape[2]):
        cache.append(rope.rotate(k[:, :, t : t + 1], key=True, offset=t))  # each key once, at its own step
        outs.append(posenc.attention(q[:, :, t : t + 1], torch.cat(cache, 2), v[:, :, : t + 1], encoding=rope,
                                     keys_rotated=True, causal=True))
    torch.testing.assert_close(torch.cat(outs, 2), expected, rtol=0, atol=1e-5)
    # re-rotating the whole cache at the current length is a different model: it must not match
    again = torch.cat([posenc.attention(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], encoding=rope,
                                        causal=True) for t in range(q.shape[2])], 2)
    assert (again - expected).abs().max() > 1e-3


# --- families whose config keys transformers reads in its own way --------------------------------------
#
# Expected values: transformers' own rotary classes (or ROPE_INIT_FUNCTIONS) built from the same
# configuration; inverse frequencies agree to float32 rounding (transformers computes them in float32).

def _f32_close(ours, theirs):
    """Inverse frequencies equal up to float32 rounding of ``base ** (2i/d)`` in transformers: the float32
    exponent's own rounding is amplified by ``|ln inv_freq|``, so the bound is a few ulps times that."""
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    bound = 2.0**-22 * (2 + np.abs(np.log(np.where(theirs > 0, theirs, 1.0)))) * np.abs(theirs)
    bad = np.abs(ours - theirs) > bound
    assert not bad.any(), f"pairs {np.flatnonzero(bad).tolist()}: ours {ours[bad]} vs transformers {theirs[bad]}"


LLAMA4_TEXT = dict(hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=1 << 20,
                   rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 1.0, "original_max_position_embeddings": 8192})


@pytest.mark.parametrize("wrapped", [False, True], ids=["Llama4TextConfig", "Llama4Config"])
def test_llama4_llama3_rule_with_equal_band_factors_matches_transformers(wrapped, caplog):
    from transformers.models.llama4.modeling_llama4 import Llama4TextRotaryEmbedding

    text = _quiet(transformers.Llama4TextConfig, **LLAMA4_TEXT)
    rotary = _quiet(Llama4TextRotaryEmbedding, text)
    config = _quiet(transformers.Llama4Config, text_config=LLAMA4_TEXT) if wrapped else text
    with caplog.at_level("INFO", logger="posenc"):
        rope = posenc.RotaryEmbedding.from_hf_config(config, max_seq_len=8)
    _f32_close(rope.inv_freq.numpy(), rotary.inv_freq.double().numpy())
    assert rope.attention_factor == rotary.attention_scaling == 1.0
    # a hard switch: pairs with wavelength above 8192 are divided by 16, the others kept
    default = 500000.0 ** (-np.arange(0, 64, 2) / 64)
    long = 2 * np.pi / default > 8192
    assert long.any() and (~long).any()
    np.testing.assert_allclose(rope.inv_freq.numpy(), np.where(long, default / 16, default), rtol=1e-12)
    # Llama 4 multiplies q and k by complex numbers built from adjacent feature pairs
    assert rope.layout == "interleaved"
    if wrapped:
        assert "text_config" in caplog.text


def test_llama4_rotation_matches_its_complex_multiply_in_the_interleaved_layout():
    import torch
    from transformers.models.llama4.modeling_llama4 import Llama4TextRotaryEmbedding, apply_rotary_emb

    text = _quiet(transformers.Llama4TextConfig, **LLAMA4_TEXT)
    torch.manual_seed(0)
    q, k = torch.randn(1, 40, 4, 64), torch.randn(1, 40, 4, 64)            # (B, S, H, D) as Llama 4 holds them
    positions = torch.arange(40)[None]
    expected_q, expected_k = apply_rotary_emb(q, k, _quiet(Llama4TextRotaryEmbedding, text)(q, positions))
    rope = posenc.RotaryEmbedding.from_hf_config(text, max_seq_len=64)
    got_q = rope.rotate(q.transpose(1, 2)).transpose(1, 2)                  # posenc rotates (B, H, S, D)
    got_k = rope.rotate(k.transpose(1, 2), key=True).transpose(1, 2)
    torch.testing.assert_close(got_q, expected_q, rtol=0, atol=5e-5)       # float32 angles up to position 39
    torch.testing.assert_close(got_k, expected_k, rtol=0, atol=5e-5)
    half = posenc.RotaryEmbedding(64, max_seq_len=64, base=rope.base, scaling=rope.scaling, layout="half")
    assert (half.rotate(q.transpose(1, 2)).transpose(1, 2) - expected_q).abs().max() > 0.1   # the layout matters


def test_llama3_rule_with_a_pair_exactly_on_the_switch_is_refused():
    # pair 0 (theta = 1) has wavelength 2 pi; low = high = L0 / (2 pi) puts the switch exactly there, where
    # the smoothing weight is 0 / 0 (transformers computes NaN)
    rule = posenc.Llama3Scaling(2.0, 8, low_freq_factor=8 / (2 * math.pi), high_freq_factor=8 / (2 * math.pi))
    with pytest.raises(ValueError, match="exactly on the switch"):
        posenc.rope_inv_freq(8, base=10000.0, scaling=rule)


@pytest.mark.parametrize("module_name, cfg_name, cls_name", [
    ("hunyuan_v1_dense", "HunYuanDenseV1Config", "HunYuanDenseV1RotaryEmbedding"),
    ("hunyuan_v1_moe", "HunYuanMoEV1Config", "HunYuanMoEV1RotaryEmbedding"),
])
@pytest.mark.parametrize("as_dict", [False, True], ids=["PretrainedConfig", "to_dict"])
def test_hunyuan_dynamic_alpha_is_static_ntk_as_transformers_reads_it(module_name, cfg_name, cls_name, as_dict):
    module = __import__(f"transformers.models.{module_name}.modeling_{module_name}", fromlist=[cls_name])
    # Hunyuan-A13B's rope_scaling as its config.json writes it (transformers' Hunyuan code reads only alpha)
    config = _quiet(getattr(transformers, cfg_name), hidden_size=256, num_attention_heads=4, head_dim=64,
                    max_position_embeddings=256, rope_theta=10000.0,
                    rope_scaling={"alpha": 1000.0, "beta_fast": 32, "beta_slow": 1, "factor": 1.0, "mscale": 1.0,
                                  "mscale_all_dim": 1.0, "type": "dynamic"})
    rotary = _quiet(getattr(module, cls_name), config)
    source = json.loads(json.dumps(config.to_dict())) if as_dict else config
    base, dim, rule = posenc.rope_scaling_from_hf(source)
    assert (dim, rule) == (64, posenc.NTKScaling(1000.0))
    rope = posenc.RotaryEmbedding.from_hf_config(source, max_seq_len=8)
    _f32_close(rope.inv_freq.numpy(), rotary.inv_freq.double().numpy())
    # paper formula (bloc97's NTK-aware base): base * alpha^(d/(d-2)), whatever the sequence length
    expected = (10000.0 * 1000.0 ** (64 / 62)) ** (-np.arange(0, 64, 2) / 64)
    np.testing.assert_allclose(rope.inv_freq.numpy(), expected, rtol=1e-12)
    assert not rope.length_dependent


def test_alpha_outside_hunyuan_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="Hunyuan's fixed NTK-alpha rule, but model_type='llama'"):
        posenc.rope_scaling_from_hf({"model_type": "llama", "head_dim": 8, "max_position_embeddings": 32,
                                     "rope_scaling": {"type": "dynamic", "factor": 2.0, "alpha": 4.0}})


PHIMOE_SHORT = [1.0 + 0.05 * i for i in range(32)]
PHIMOE_LONG = [1.0 + 0.5 * i for i in range(32)]


def test_phimoe_short_and_long_mscale_set_the_attention_factor():
    import torch
    from transformers.models.phimoe.modeling_phimoe import PhimoeRotaryEmbedding

    config = _quiet(transformers.PhimoeConfig, hidden_size=256, num_attention_heads=4, max_position_embeddings=4096,
                    original_max_position_embeddings=1024,
                    rope_scaling={"type": "longrope", "short_factor": PHIMOE_SHORT, "long_factor": PHIMOE_LONG,
                                  "short_mscale": 1.243163121016122, "long_mscale": 1.243163121016122,
                                  "original_max_position_embeddings": 1024})
    rotary = _quiet(PhimoeRotaryEmbedding, config)
    x = torch.zeros(1, 1, 64)
    positions = torch.arange(0, 1024, 37)[None]                     # inside the original context
    cos, sin = rotary(x, positions)
    rope = posenc.RotaryEmbedding.from_hf_config(config, max_seq_len=1024)
    assert rope.attention_factor == 1.243163121016122                 # not LongRoPE's sqrt(1 + ln 4 / ln 1024)
    ours_cos, ours_sin = rope.cos_sin(positions[0], seq_len=1024)
    atol = 1.25 * 1024 * 2.0**-22          # transformers forms position * inv_freq in float32, up to position 1024
    torch.testing.assert_close(ours_cos, cos[0, :, :32], rtol=0, atol=atol)
    torch.testing.assert_close(ours_sin, sin[0, :, :32], rtol=0, atol=atol)


def test_phimoe_attention_factor_switches_with_the_length():
    """Phi-3.5-MoE's own values (short_mscale 1.05, long_mscale 1.243163121016122; factor lists made up):
    within the original context cos/sin carry short_mscale, past it long_mscale, as transformers'
    PhimoeRotaryEmbedding scales them (seq_len = the largest position + 1).  The frequencies switch to
    the long factors past the original context, as LongRoPE's do (Microsoft's reference code and vLLM);
    transformers' Phimoe module keeps the short ones, which the angles below show."""
    import math

    import numpy as np
    import torch
    from transformers.models.phimoe.modeling_phimoe import PhimoeRotaryEmbedding

    short_m, long_m = 1.05, 1.243163121016122
    config = _quiet(transformers.PhimoeConfig, hidden_size=256, num_attention_heads=4, max_position_embeddings=4096,
                    original_max_position_embeddings=1024,
                    rope_scaling={"type": "longrope", "short_factor": PHIMOE_SHORT, "long_factor": PHIMOE_LONG,
                                  "short_mscale": short_m, "long_mscale": long_m,
                                  "original_max_position_embeddings": 1024})
    rope = posenc.RotaryEmbedding.from_hf_config(config, max_seq_len=1024)
    assert rope.scaling.attention_factor_at(1024) == short_m and rope.scaling.attention_factor_at(1025) == long_m
    rotary = _quiet(PhimoeRotaryEmbedding, config)
    x = torch.zeros(1, 1, 64)
    theta = np.array([rope.base ** (-2 * i / 64) for i in range(32)])
    for positions, m, ext in ((torch.arange(0, 1024, 37), short_m, PHIMOE_SHORT),
                              (torch.arange(1000, 2000, 37), long_m, PHIMOE_LONG)):
        cos_t, sin_t = (t[0, :, :32].double() for t in rotary(x, positions[None]))
        cos, sin = (t.double() for t in rope.cos_sin(positions))                    # seq_len: largest + 1
        # the attention factor: |(cos, sin)| of every pair, ours and transformers'
        torch.testing.assert_close(torch.hypot(cos, sin), torch.full_like(cos, m), rtol=0, atol=1e-6)
        torch.testing.assert_close(torch.hypot(cos_t, sin_t), torch.full_like(cos_t, m), rtol=0, atol=1e-6)
        # ours: the float64 angles of the factors of this length, times m
        angle = positions.double().numpy()[:, None] * theta / np.array(ext)
        torch.testing.assert_close(cos, torch.from_numpy(m * np.cos(angle)), rtol=0, atol=1e-6)
        torch.testing.assert_close(sin, torch.from_numpy(m * np.sin(angle)), rtol=0, atol=1e-6)
        if m == short_m:                                              # within the context: transformers' too
            atol = 1.25 * 1024 * 2.0**-22 * m
            torch.testing.assert_close(cos, cos_t, rtol=0, atol=atol)
            torch.testing.assert_close(sin, sin_t, rtol=0, atol=atol)
    assert math.isclose(rope(torch.ones(1, 1, 1, 64), offset=1500)[0].norm().item(), long_m * 8, rel_tol=1e-6)


@pytest.mark.parametrize("params, match", [
    ({"short_mscale": 1.2}, "needs both short_mscale and long_mscale"),
    ({"long_mscale": 1.2}, "needs both short_mscale and long_mscale"),
])
def test_phimoe_mscales_posenc_cannot_honour_are_refused(params, match):
    config = {"model_type": "phimoe", "head_dim": 8, "max_position_embeddings": 64,
              "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
                               "original_max_position_embeddings": 16, **params}}
    with pytest.raises(ValueError, match=match):
        posenc.rope_scaling_from_hf(config)


def test_yarn_without_factor_is_refused_as_transformers_refuses_it():
    config = {"hidden_size": 64, "num_attention_heads": 2, "max_position_embeddings": 8192,
              "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 2048}}
    with pytest.raises(KeyError, match="factor"):
        _quiet(transformers.LlamaConfig, **config)
    with pytest.raises(ValueError, match="needs 'factor'"):
        posenc.rope_scaling_from_hf(config)


def test_yarn_with_null_factor_infers_it_from_the_two_lengths_as_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = _quiet(transformers.LlamaConfig, hidden_size=256, num_attention_heads=4, max_position_embeddings=8192,
                    rope_parameters={"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 2048})
    hf_inv, hf_scale = _quiet(ROPE_INIT_FUNCTIONS["yarn"], config)
    base, dim, rule = posenc.rope_scaling_from_hf(config)
    assert rule.factor == 4.0 and rule.original_max_seq_len == 2048
    ours, factor = posenc.rope_inv_freq(dim, base=base, scaling=rule)
    _f32_close(ours.numpy(), hf_inv.double().numpy())
    assert factor == pytest.approx(hf_scale, rel=1e-12) and factor == pytest.approx(0.1 * math.log(4.0) + 1)


def test_raw_phi3_config_with_yarn_type_is_longrope_as_transformers_reads_it():
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    raw = {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 131072,
           "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
           "rope_scaling": {"type": "yarn", "short_factor": PHIMOE_SHORT + [1.0] * 16,
                            "long_factor": PHIMOE_LONG + [1.0] * 16}}
    rotary = _quiet(Phi3RotaryEmbedding, _quiet(transformers.Phi3Config, **{k: v for k, v in raw.items()
                                                                           if k != "model_type"}))
    base, dim, rule = posenc.rope_scaling_from_hf(raw)
    assert isinstance(rule, posenc.LongRopeScaling) and dim == 96
    factor = rule.attention_factor()
    assert factor == pytest.approx(rotary.attention_scaling, rel=1e-12)
    assert factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)), rel=1e-12)   # 1.190, not 1.347
    assert round(factor, 3) == 1.190


@pytest.mark.parametrize("as_dict", [False, True], ids=["PretrainedConfig", "to_dict"])
def test_qwen2_vl_without_mrope_section_uses_transformers_default_sections(as_dict):
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

    config = _quiet(transformers.Qwen2VLTextConfig, hidden_size=256, num_attention_heads=2,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    assert "mrope_section" not in config.rope_parameters
    rotary = _quiet(Qwen2VLRotaryEmbedding, config)
    source = json.loads(json.dumps(config.to_dict())) if as_dict else config
    base, dim, rule, section, interleaved = posenc.mrope_from_hf(source)
    assert section == tuple(rotary.mrope_section) == (16, 24, 24) and dim == 128 and not interleaved
    rope = posenc.MultimodalRotaryEmbedding.from_hf_config(source, max_seq_len=8)
    _f32_close(rope.inv_freq.numpy(), rotary.inv_freq.double().numpy())
    with pytest.raises(ValueError, match="multimodal RoPE"):                    # never read as 1-D RoPE
        posenc.rope_scaling_from_hf(source)


COMPOSITES = [
    ("gemma3", lambda: transformers.Gemma3Config(text_config={"hidden_size": 256, "num_attention_heads": 4,
                                                              "head_dim": 64}),
     "gemma3.modeling_gemma3.Gemma3RotaryEmbedding", "full_attention"),
    ("llava", lambda: transformers.LlavaConfig(text_config={"model_type": "llama", "hidden_size": 256,
                                                            "num_attention_heads": 4}),
     "llama.modeling_llama.LlamaRotaryEmbedding", None),
    ("llama4", lambda: transformers.Llama4Config(text_config=LLAMA4_TEXT),
     "llama4.modeling_llama4.Llama4TextRotaryEmbedding", None),
]


@pytest.mark.parametrize("name, make, cls_path, layer_type", COMPOSITES, ids=[c[0] for c in COMPOSITES])
@pytest.mark.parametrize("as_dict", [False, True], ids=["PretrainedConfig", "to_dict"])
def test_composite_configs_are_read_through_text_config(name, make, cls_path, layer_type, as_dict, caplog):
    config = _quiet(make)
    hf_inv, hf_scale = _hf_rotary(config.get_text_config(), cls_path, layer_type)
    source = json.loads(json.dumps(config.to_dict())) if as_dict else config
    with caplog.at_level("INFO", logger="posenc"):
        rope = posenc.RotaryEmbedding.from_hf_config(source, layer_type=layer_type, max_seq_len=8)
    _f32_close(rope.inv_freq.numpy(), hf_inv)
    assert rope.attention_factor == pytest.approx(hf_scale, rel=1e-12)
    assert "reading the rotary settings of its language model from text_config" in caplog.text


def test_composite_config_without_text_config_names_text_config():
    wrapper = json.loads(json.dumps(_quiet(transformers.LlavaConfig).to_dict()))
    del wrapper["text_config"]
    with pytest.raises(ValueError, match="config needs head_dim.*keeps them in its text_config"):
        posenc.rope_scaling_from_hf(wrapper)


# --- every rope type transformers has, over a grid of parameters -----------------------------------------

GRID_RULES = [                              # (rope_type, parameters besides rope_type and partial_rotary_factor)
    ("default", {}),
    ("linear", {"factor": 4.0}),
    ("dynamic", {"factor": 2.0}),
    ("yarn", {"factor": 4.0}),
    ("yarn", {"factor": None}),                                         # inferred: max_pos / original
    ("yarn", {"factor": 8.0, "beta_fast": 16, "beta_slow": 2}),
    ("yarn", {"factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707}),   # DeepSeek's attention factor
    ("yarn", {"factor": 4.0, "attention_factor": 1.5}),
    ("yarn", {"factor": 4.0, "truncate": False}),
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    ("llama3", {"factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0}),   # Llama 4: no smoothing band
    ("longrope", {}),                                                   # factor from max_pos / original
    ("longrope", {"factor": 2.0, "attention_factor": 1.1}),
    ("proportional", {"factor": 1.0}),
    ("proportional", {"factor": 2.0}),
]
GRID_HEADS = [("hidden256/4", {"hidden_size": 256, "num_attention_heads": 4}),
              ("head_dim48", {"hidden_size": 256, "num_attention_heads": 4, "head_dim": 48})]
GRID_PARTIALS = [None, 0.5, 0.3]            # 0.3 of 64 is 19 features: odd, refused (0.3 of 48 is 14)
GRID_ORIGINALS = [None, 1024]               # original_max_position_embeddings absent (= max_pos) or 1024
GRID = [
    pytest.param(rule, params, heads, partial, orig, seq_len,
                 id=f"{rule}-{i}-{label}-p{partial}-o{orig}" + (f"-L{seq_len}" if seq_len else ""))
    for i, (rule, params) in enumerate(GRID_RULES)
    for label, heads in GRID_HEADS
    for partial in GRID_PARTIALS
    for orig in GRID_ORIGINALS
    for seq_len in ((None, 8192) if rule in ("dynamic", "longrope") else (None,))
]


def test_grid_covers_every_rope_type_transformers_has():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert set(ROPE_INIT_FUNCTIONS) <= {rule for rule, _ in GRID_RULES}


@pytest.mark.parametrize("rule, params, heads, partial, orig, seq_len", GRID)
def test_every_rope_type_matches_transformers_over_a_grid(rule, params, heads, partial, orig, seq_len):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding

    head_dim = heads.get("head_dim") or heads["hidden_size"] // heads["num_attention_heads"]
    dim = int(head_dim * (partial or 1.0)) if rule != "proportional" else head_dim
    params = dict(params)
    if rule == "longrope":                                 # one factor per frequency pair
        params.update(short_factor=[1.0 + 0.1 * i for i in range((dim + 1) // 2)],
                      long_factor=[1.0 + 0.7 * i for i in range((dim + 1) // 2)])
    rope_parameters = {"rope_type": rule, "rope_theta": 500000.0, **params}
    if partial is not None:
        rope_parameters["partial_rotary_factor"] = partial
    if orig is not None:
        rope_parameters["original_max_position_embeddings"] = orig
    config = _quiet(transformers.LlamaConfig, max_position_embeddings=4096, rope_parameters=rope_parameters, **heads)
    source = json.loads(json.dumps(config.to_dict()))
    try:
        if rule == "default":                              # GPT-NeoX's default honours partial_rotary_factor
            hf_inv, hf_scale = GPTNeoXRotaryEmbedding.compute_default_rope_parameters(config)
        else:
            hf_inv, hf_scale = _quiet(ROPE_INIT_FUNCTIONS[rule], config, "cpu", seq_len=seq_len)
    except RuntimeError:                                   # YaRN's ramp cannot broadcast over an odd rotary dim
        assert dim % 2 and rule == "yarn"
        with pytest.raises(ValueError, match="an odd count"):
            posenc.rope_scaling_from_hf(source)
        return
    hf_inv = hf_inv.double().numpy()
    if dim % 2:                                            # transformers: ceil(dim/2) pairs at base^(-2i/dim)
        assert len(hf_inv) == (dim + 1) // 2
        with pytest.raises(ValueError, match="an odd count"):
            posenc.rope_scaling_from_hf(source)
        return
    for cfg in (config, source):
        base, rotary_dim, scaling = posenc.rope_scaling_from_hf(cfg)
        ours, factor = posenc.rope_inv_freq(rotary_dim, base=base, scaling=scaling, seq_len=seq_len)
        _f32_close(ours.numpy(), hf_inv)
        assert factor == pytest.approx(float(hf_scale), rel=1e-12)
