"""Bad inputs of rope_scaling_from_hf, rope_layout_from_hf.

Each case either matches an independent float64 reference from ``tests/reference/`` or raises
``ValueError``/``TypeError`` naming the offending argument; any other exception or any warning fails it
(``tests/bad_inputs.py``).  ``tests/test_bad_inputs.py`` walks every public name against these cases.
"""

from __future__ import annotations

import pytest

import posenc
from posenc import (
    DynamicNTKScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    YarnScaling,
)
from tests.bad_inputs import (
    BASE,
    NAN,
    Cases,
    run_case,
)

CASES = Cases()
bad, good = CASES.bad, CASES.good


_HF = {"head_dim": 8, "max_position_embeddings": 32}
for _id, _cfg, _exc, _match in [
    ("config-none", None, TypeError, "config must be a transformers PretrainedConfig or a dict"),
    ("config-list", [("head_dim", 8)], TypeError, "config must be a transformers PretrainedConfig or a dict"),
    ("head_dim-float", {"head_dim": 8.5}, TypeError, "head_dim must be an int"),
    ("head_dim-missing", {"rope_theta": 10.0}, ValueError, "config needs head_dim"),
    ("rope_theta-nan", {**_HF, "rope_theta": NAN}, ValueError, "rope_theta must be finite"),
    ("rope_theta-str", {**_HF, "rope_theta": "1e4"}, TypeError, "rope_theta must be a real number"),
    ("partial-2", {**_HF, "partial_rotary_factor": 2.0}, ValueError, "partial_rotary_factor must be in"),
    ("rope_scaling-list", {**_HF, "rope_scaling": [1]}, ValueError, "rope_scaling/rope_parameters must be a dict"),
    ("rope_type", {**_HF, "rope_scaling": {"rope_type": "ntk-by-parts"}}, ValueError, "unknown rope scaling type"),
    ("linear-factor-missing", {**_HF, "rope_scaling": {"type": "linear"}}, ValueError, "needs 'factor'"),
    ("linear-factor-str", {**_HF, "rope_scaling": {"type": "linear", "factor": "2"}}, TypeError, "factor must be a real"),
    ("linear-factor-list", {**_HF, "rope_scaling": {"type": "linear", "factor": [2]}}, TypeError, "factor must be a real"),
    ("linear-factor-nan", {**_HF, "rope_scaling": {"type": "linear", "factor": NAN}}, ValueError, "factor must be finite"),
    ("dynamic-max-pos-str", {"head_dim": 8, "max_position_embeddings": "4k", "rope_scaling": {"type": "dynamic", "factor": 2}},
     TypeError, "max_position_embeddings must be an int"),
    ("yarn-max-pos-str", {"head_dim": 8, "max_position_embeddings": "4k", "original_max_position_embeddings": 16,
                          "rope_scaling": {"type": "yarn", "factor": None}}, TypeError, "max_position_embeddings must be an int"),
    ("yarn-original-fraction", {**_HF, "original_max_position_embeddings": 4.5,
                                "rope_scaling": {"type": "yarn", "factor": None}},
     TypeError, "original_max_position_embeddings must be an int"),
    ("yarn-beta-str", {**_HF, "rope_scaling": {"type": "yarn", "factor": 2, "beta_fast": "32"}}, TypeError,
     "beta_fast must be a real number"),
    ("yarn-truncate-str", {**_HF, "rope_scaling": {"type": "yarn", "factor": 2, "truncate": "no"}}, TypeError,
     "truncate must be a bool"),
    ("llama3-low-str", {**_HF, "rope_scaling": {"type": "llama3", "factor": 2, "low_freq_factor": "1", "high_freq_factor": 4}},
     TypeError, "low_freq_factor must be a real number"),
    ("longrope-factors-int", {**_HF, "rope_scaling": {"type": "longrope", "short_factor": 5, "long_factor": 5}}, TypeError,
     "short_factor must be a sequence of numbers"),
    ("proportional-factor-str", {**_HF, "rope_scaling": {"type": "proportional", "factor": "2"}}, TypeError,
     "factor must be a real number"),
    ("mrope", {**_HF, "rope_scaling": {"type": "default", "mrope_section": [2, 1, 1]}}, ValueError, "mrope_section"),
    ("mrope-default-sections", {**_HF, "model_type": "qwen2_vl"}, ValueError, "multimodal RoPE"),
    ("yarn-factor-missing", {**_HF, "rope_scaling": {"type": "yarn"}}, ValueError, "needs 'factor'"),
    ("alpha-not-hunyuan", {**_HF, "model_type": "llama", "rope_scaling": {"type": "dynamic", "factor": 2, "alpha": 4}},
     ValueError, "Hunyuan's fixed NTK-alpha rule"),
    ("alpha-str", {**_HF, "rope_scaling": {"type": "dynamic", "alpha": "4"}}, TypeError, "alpha must be a real number"),
    ("alpha-below-1", {**_HF, "rope_scaling": {"type": "dynamic", "alpha": 0.5}}, ValueError, "alpha .* must be >= 1"),
    ("mscale-not-phimoe", {**_HF, "model_type": "phi3", "rope_scaling": {
        "type": "longrope", "short_factor": [1] * 4, "long_factor": [2] * 4, "short_mscale": 1.2, "long_mscale": 1.2}},
     ValueError, "short_mscale/long_mscale are read by Phi-3.5-MoE"),
    ("mscale-str", {**_HF, "rope_scaling": {
        "type": "longrope", "short_factor": [1] * 4, "long_factor": [2] * 4, "short_mscale": "1", "long_mscale": 1}},
     TypeError, "short_mscale must be a real number"),
    ("mscale-and-attention-factor", {**_HF, "rope_scaling": {
        "type": "longrope", "short_factor": [1] * 4, "long_factor": [2] * 4, "short_mscale": 1.2, "long_mscale": 1.2,
        "attention_factor": 1.1}}, ValueError, "either attention_factor or short_mscale"),
    ("odd-rotary-dim", {"head_dim": 10, "partial_rotary_factor": 0.5}, ValueError, "an odd count"),
    ("axial", {**_HF, "rope_parameters": {"rope_type": "axial"}}, ValueError, "rope type 'axial' is 2-D RoPE"),
    ("vision-encoder", {**_HF, "patch_size": 16}, ValueError, "looks like a vision encoder"),
    ("ernie-vl", {**_HF, "model_type": "ernie4_5_vl_moe_text"}, ValueError, "arranges its multimodal RoPE its own way"),
    ("wrapper-without-text-config", {"model_type": "llava", "vision_config": {}}, ValueError,
     "keeps them in its text_config"),
    ("text-config-without-dims", {"model_type": "llava", "text_config": {"rope_theta": 10.0}}, ValueError,
     "config.text_config needs head_dim"),
    ("text-config-str", {"model_type": "llava", "text_config": "llama"}, ValueError, "config needs head_dim"),
]:
    bad("rope_scaling_from_hf", _id, lambda c=_cfg: posenc.rope_scaling_from_hf(c), _exc, _match)
for _id, _cfg, _layer, _exc, _match in [
    ("nope-layer", {**_HF, "layer_types": ["full_attention", "nope"],
                    "rope_parameters": {"full_attention": {"rope_type": "default"}, "nope": None}}, "nope",
     ValueError, "has no rope parameters"),
    ("per-layer-conflict", {**_HF, "layer_types": ["full_attention", "full_attention"],
                            "per_layer_config": {"0": {"head_dim": 16}, "1": {"head_dim": 32}}}, "full_attention",
     ValueError, "override their rotary settings differently"),
    ("per-layer-not-dict", {**_HF, "layer_types": ["full_attention"], "per_layer_config": [1]}, "full_attention",
     ValueError, "per_layer_config must be a dict"),
]:
    bad("rope_scaling_from_hf", _id, lambda c=_cfg, t=_layer: posenc.rope_scaling_from_hf(c, layer_type=t), _exc, _match)
for _id, _cfg, _want in [
    ("max-pos-whole-float", {**_HF, "max_position_embeddings": 32.0, "rope_scaling": {"type": "dynamic", "factor": 2}},
     (BASE, 8, DynamicNTKScaling(2.0, 32))),
    ("yarn-truncate-null", {**_HF, "original_max_position_embeddings": 16, "rope_scaling": {"type": "yarn", "factor": None, "truncate": None}},
     (BASE, 8, YarnScaling(2.0, 16, truncate=False))),
    ("llama3-equal-band-factors", {**_HF, "rope_scaling": {"type": "llama3", "factor": 2, "low_freq_factor": 1,
                                                           "high_freq_factor": 1}},
     (BASE, 8, Llama3Scaling(2.0, 32, low_freq_factor=1.0, high_freq_factor=1.0))),
    ("hunyuan-alpha", {**_HF, "model_type": "hunyuan_v1_dense", "rope_scaling": {"type": "dynamic", "alpha": 4.0}},
     (BASE, 8, NTKScaling(4.0))),
    ("phimoe-mscale", {**_HF, "model_type": "phimoe", "original_max_position_embeddings": 16, "rope_scaling": {
        "type": "longrope", "short_factor": [1] * 4, "long_factor": [2] * 4, "short_mscale": 1.2, "long_mscale": 1.2}},
     (BASE, 8, LongRopeScaling((1.0,) * 4, (2.0,) * 4, 16, factor=2.0, attention_factor_override=1.2))),
    ("phimoe-mscales-differ", {**_HF, "model_type": "phimoe", "original_max_position_embeddings": 16, "rope_scaling": {
        "type": "longrope", "short_factor": [1] * 4, "long_factor": [2] * 4, "short_mscale": 1.05, "long_mscale": 1.25}},
     (BASE, 8, LongRopeScaling((1.0,) * 4, (2.0,) * 4, 16, factor=2.0, attention_factor_override=1.05,
                               long_attention_factor=1.25))),
    ("phi3-yarn-is-longrope", {**_HF, "model_type": "phi3", "original_max_position_embeddings": 16, "rope_scaling": {
        "type": "yarn", "short_factor": [1] * 4, "long_factor": [2] * 4}},
     (BASE, 8, LongRopeScaling((1.0,) * 4, (2.0,) * 4, 16, factor=2.0))),
    ("wrapper-text-config", {"model_type": "llava", "text_config": {**_HF, "model_type": "llama"}}, (BASE, 8, None)),
    ("longrope-lists", {**_HF, "original_max_position_embeddings": 16,
                        "rope_scaling": {"type": "longrope", "short_factor": [1, 1, 1, 1], "long_factor": [2, 2, 2, 2]}},
     (BASE, 8, LongRopeScaling((1.0,) * 4, (2.0,) * 4, 16, factor=2.0))),
]:
    good("rope_scaling_from_hf", _id, lambda c=_cfg: posenc.rope_scaling_from_hf(c),
         lambda got, w=_want: (got == w) or pytest.fail(f"{got} != {w}"))
good("rope_scaling_from_hf", "per-layer-override",                       # Gemma 4 writes layer indices as "05"
     lambda: posenc.rope_scaling_from_hf({**_HF, "layer_types": ["sliding_attention", "full_attention"],
                                          "per_layer_config": {"01": {"head_dim": 16}}, "rope_parameters": {
                                              "sliding_attention": {"rope_type": "default"},
                                              "full_attention": {"rope_type": "default"}}}, layer_type="full_attention"),
     lambda got: (got == (BASE, 16, None)) or pytest.fail(got))
bad("rope_layout_from_hf", "config-none", lambda: posenc.rope_layout_from_hf(None), TypeError, "config must be a transformers")
bad("rope_layout_from_hf", "config-str", lambda: posenc.rope_layout_from_hf("gptj"), TypeError, "config must be a transformers")
good("rope_layout_from_hf", "model-type-unhashable", lambda: posenc.rope_layout_from_hf({"model_type": ["gptj"]}),
     lambda got: (got == "half") or pytest.fail(got))


@pytest.mark.parametrize("name, thunk, error, check", CASES.params)
def test_bad_input(name, thunk, error, check):
    run_case(thunk, error, check)
