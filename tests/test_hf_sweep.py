"""A representative sample of the coverage sweep (scripts/hf_sweep.py runs every model type): each kind
of adapter and the families people run now, built tiny from their default configurations (no
download), patched and compared with the unpatched model (tests/hf_zoo.py: prefill and 8 cached greedy
steps within 1e-5, the same tokens, bit-identical after unpatch_model).  A type that cannot be built
or run on CPU here skips with the reason; a refusal fails (these are types posenc must accept)."""

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")

from posenc.integrations.transformers import is_patched, patch_model, patched, rotation_layout, unpatch_model  # noqa: E402
from tests import hf_zoo  # noqa: E402

SAMPLE = {
    # adapter kinds
    "llama": "rotary", "qwen2_vl": "mrope", "qwen3_vl": "mrope", "bloom": "bloom", "mpt": "mpt", "t5": "t5",
    "gptj": "rotary",
    # families
    "llama4": "rotary", "gemma3": "rotary", "gemma3n_text": "rotary", "qwen3_moe": "rotary", "qwen3_next": "rotary",
    "gpt_oss": "rotary", "smollm3": "rotary", "cohere2": "rotary", "exaone4": "rotary", "glm4": "rotary",
    "deepseek_v3": "rotary", "mixtral": "rotary", "olmo2": "rotary", "granite": "rotary", "phi": "rotary",
    "stablelm": "rotary", "starcoder2": "rotary", "falcon": "rotary", "modernbert": "rotary", "mt5": "t5",
    "umt5": "t5", "longt5": "t5", "glm4v": "mrope", "deepseek_v4": "rotary", "phimoe": "rotary",
    "mpnet": "mpnet", "beam": "rotary", "granite4_vision_text": "rotary", "mlcd_vision_model": "axial",
    "pixtral": "axial",
    # vision and audio encoders fed synthetic grids and features; hybrids that keep one attention layer
    "qwen2_vl_vision": "axial", "glm4v_vision": "axial", "minimax_m3_vl_vision": "axial", "sam3_vit_model": "axial",
    "gemma4_vision": "axial", "llama4_vision_model": "axial", "lasr_encoder": "rotary", "lfm3": "rotary",
    "recurrent_gemma": "rotary", "pix2struct": "t5", "deepseek_ocr2_vision": "rotary", "phi4_multimodal_audio": "clipped",
    "layoutlmv3": "buckets", "cpmant": "buckets",
}
#: Sample types whose rotary modules the audit must compare with the config (and find equal).
AUDITED = {"llama", "gemma3", "deepseek_v3", "glm4v", "gptj", "phi3", "modernbert", "deepseek_v4"} & set(SAMPLE)
SLOW = {"qwen3_next", "gpt_oss", "gemma3n_text", "qwen3_vl", "glm4v", "longt5", "deepseek_v3"}


def test_the_sweep_enumerates_every_model_type_with_positions():
    found = hf_zoo.model_types()
    assert len(found) > 300
    assert found["llama"] == ["rotary"] and found["bloom"] == ["alibi"] and found["t5"] == ["t5-bias"]
    assert "gpt2" not in found                            # learned absolute positions: nothing to patch


@pytest.mark.parametrize("model_type", [pytest.param(t, marks=pytest.mark.slow) if t in SLOW else t for t in SAMPLE])
def test_sample_model_type_is_accepted_and_equal(model_type):
    record = hf_zoo.check(model_type)
    if record["status"] in ("not built", "not run"):
        pytest.skip(f"{model_type} cannot be {record['status'].split()[1]} on CPU here: {record['reason']}")
    assert record["status"] == "equal", record
    assert SAMPLE[model_type] in record["patched"], record
    # posenc.testing.audit_hf reads the same model: it must not contradict the sweep
    assert not record["audit"].startswith("differs"), record["audit"]
    if model_type in AUDITED:
        assert record["audit"] == "agrees", record["audit"]


@pytest.mark.parametrize("model_type", ["glm5_next_text", "clvp_decoder"])
def test_a_type_whose_default_model_holds_no_positional_module_is_not_counted_as_refused(model_type):
    """GLM-5-Next's text model applies no rotary embedding, CLVP's decoder has learned positions (its
    rotary class serves the speech encoder): patch_model finds nothing, which is not a refusal."""
    record = hf_zoo.check(model_type)
    if record["status"] in ("not built", "not run"):
        pytest.skip(f"{model_type} cannot be {record['status'].split()[1]} on CPU here: {record['reason']}")
    assert record["status"] == "no positions", record
    assert "found no positional module" in record["reason"]


LAYOUT_SAMPLE = ["llama", "llama4", "gptj", "cohere", "glm", "deepseek_v3", "gpt_neox", "phi", "qwen3_moe", "olmo2"]


@pytest.mark.parametrize("model_type", LAYOUT_SAMPLE)
def test_the_layout_found_is_the_one_the_models_rotate_function_uses(model_type):
    """posenc's rotation in the layout patch_model found reproduces the model's own rotate function
    applied to random q with the model's own cos/sin (the reference is the model's code)."""
    import sys

    from posenc.functional import apply_rope

    model = hf_zoo.build(model_type)
    rotary = next(m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")
                  and "Vision" not in type(m).__name__)
    layout, function = rotation_layout(rotary, model)
    assert layout in ("half", "interleaved"), function
    code = sys.modules[type(rotary).__module__]
    fn = getattr(code, function)
    positions = torch.tensor([[0, 1, 5, 40]])
    out = rotary(torch.zeros(1, 4, 8), positions)
    outs = out if isinstance(out, tuple) else (out,)
    width = outs[0].shape[-1]
    dim = 2 * width if len(outs) == 1 or "sin" in list(__import__("inspect").signature(fn).parameters)[1:2] \
        else width
    q = torch.randn(1, 2, 4, dim, generator=torch.Generator().manual_seed(0))    # (B, H, S, D)
    if len(outs) == 1:                                                          # complex (Llama 4): (B, S, H, D)
        want = fn(q.transpose(1, 2), q.transpose(1, 2), outs[0])[0].transpose(1, 2)
        cos, sin = outs[0].real, outs[0].imag
    elif dim == 2 * width:                                                      # GPT-J: (sin, cos), (B, S, H, D)
        want = fn(q.transpose(1, 2), *outs).transpose(1, 2)
        sin, cos = outs
    else:
        want = fn(q, q, *outs)[0]
        cos, sin = outs
        # the angles from the model's own table, as posenc's narrow (B, S, D/2) cos/sin: [cos, cos] or pairs
        doubled = torch.equal(cos[..., : width // 2], cos[..., width // 2:])
        cos, sin = (cos[..., : width // 2], sin[..., : width // 2]) if doubled else (cos[..., ::2], sin[..., ::2])
    got = apply_rope(q, cos[:, None], sin[:, None], layout=layout)
    if function == "apply_rotary_pos_emb_interleave":                           # it returns half-ordered features
        from posenc.functional import layout_permutation
        got = got[..., layout_permutation(dim)]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    if model_type == "llama4":
        assert layout == "interleaved"                                          # complex pairs (2i, 2i + 1)


@pytest.mark.parametrize("model_type", ["llama", "nanochat", "openai_privacy_filter", "gpt_oss", "glm4_moe_lite",
                                        "mistral_large4", "gemma4_text"])
def test_posenc_rotates_q_and_k_bit_for_bit_as_the_models_own_function(model_type):
    """Each way of mixing the pairs the self-check can pick, on a model of the installed transformers:
    half-split pairs (Llama), the rotation the other way round (NanoChat's rotate_half), half-width
    cos/sin in interleaved pairs (the privacy filter) and half-split (gpt-oss), pairs de-interleaved
    before a half-split rotation (the DeepSeek-V3 family's latent attention), and a function that takes
    one tensor at a time (Gemma 4, whose full-attention layers rotate some pairs by zero).  posenc rotates q and k
    (the default engine) and the outputs equal, to the bit, the model rotating posenc's cos/sin
    itself (engine=None)."""
    model = hf_zoo.build(model_type)
    with patched(model, engine=None):
        want = hf_zoo.run(model)
    with patched(model):
        assert hf_zoo.layouts(model)["rotation"] == ["posenc"]
        got = hf_zoo.run(model)
    assert torch.equal(got[0], want[0]) and got[2] == want[2]
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1], strict=True))


def test_a_module_whose_output_disagrees_is_refused_and_the_model_untouched():
    model = hf_zoo.build("llama")
    model.config.rope_parameters["rope_theta"] = 20000.0        # the config now says what the module does not do
    with pytest.raises(ValueError, match=r"LlamaForCausalLM.model.rotary_emb: posenc's cos/sin do not reproduce the "
                                         r"module's own output at positions"):
        patch_model(model)
    rotary = model.model.rotary_emb
    assert "_posenc_patch" not in vars(rotary) and "forward" not in vars(rotary) and "posenc_rope" not in rotary._modules


def test_an_unknown_output_format_is_refused(monkeypatch):
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaRotaryEmbedding.forward

    def tampered(self, x, position_ids):
        cos, sin = original(self, x, position_ids)
        return cos * 1.001, sin                              # 0.1 %: far beyond float32 rounding
    model = hf_zoo.build("llama")
    monkeypatch.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", tampered)
    with pytest.raises(ValueError, match="closest format is off by"):
        patch_model(model)


def test_mpt_with_alibi_bias_max_16_is_patched_as_transformers_computes_it():
    model = hf_zoo.build("mpt")
    model.config.attn_config.alibi_bias_max = 16               # transformers never passes it on
    ref = hf_zoo.run(model)
    got = hf_zoo.run(patch_model(model))
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=hf_zoo.ATOL)
    assert got[2] == ref[2]


def test_a_t5_bias_whose_max_distance_equals_the_exact_range_is_refused_up_front():
    config = transformers.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                                   relative_attention_num_buckets=32, relative_attention_max_distance=8,
                                   decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    with pytest.raises(ValueError, match=r"relative_attention_max_distance=8 must exceed the exact range 8"):
        patch_model(model)
    assert not any("_posenc_patch" in vars(m) for m in model.modules())


def test_a_relative_bias_of_another_contract_is_named_in_the_refusal():
    """A model whose only positions are a relative bias no adapter recognises is not told it has learned
    or sinusoidal absolute positions: the refusal names the module that holds the bias."""
    class SegmentBias(torch.nn.Module):                 # a learned bias under T5's name, its own contract
        def __init__(self) -> None:
            super().__init__()
            self.relative_attention_bias = torch.nn.Parameter(torch.zeros(8, 2))

        def forward(self, segments: torch.Tensor) -> torch.Tensor:
            return self.relative_attention_bias[segments]

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), SegmentBias())
    with pytest.raises(ValueError, match=r"relative position biases of another contract \(SegmentBias\)"):
        patch_model(model)


def test_cpm_ant_position_buckets_are_posencs_in_the_methods_dtype():
    """CPM-Ant computes T5's bidirectional buckets in its own ``_position_bucket`` (int32); posenc's exact
    buckets replace it, in int32, and the segment buckets stay the model's."""
    model = hf_zoo.build("cpmant")
    owner = next(m for m in model.modules() if hasattr(type(m), "_position_bucket"))
    rel = torch.arange(-300, 301, dtype=torch.int32)[None, :]
    want = type(owner)._position_bucket(owner, rel, num_buckets=owner.num_buckets, max_distance=owner.max_distance)
    patch_model(model)
    got = owner._position_bucket(rel, num_buckets=owner.num_buckets, max_distance=owner.max_distance)
    assert got.dtype == want.dtype == torch.int32 and torch.equal(got, want)
    assert "_segment_relative_position_bucket" not in vars(owner)
    unpatch_model(model)
    assert "_position_bucket" not in vars(owner)


def test_layoutlmv3_buckets_that_differ_from_t5s_are_refused_with_the_distance():
    """LayoutLMv3 computes T5's buckets in a method of its encoder; posenc replaces the method only where its
    exact buckets equal the method's on every distance the model uses. A method that differs (here, one
    bucket off past distance 40) is refused, naming the first distance, and the model stays as it was."""
    model = hf_zoo.build("layoutlmv3")
    encoder = model.encoder

    class Shifted(type(encoder)):
        def relative_position_bucket(self, relative_position, bidirectional=True, num_buckets=32, max_distance=128):
            out = super().relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance)
            return out + (relative_position > 40).long()

    encoder.__class__ = Shifted
    with pytest.raises(ValueError, match=r"differ from the model's relative_position_bucket at distance 41 "):
        patch_model(model)
    assert not is_patched(model)


def test_pix2struct_text_attention_which_does_not_say_its_direction_gets_the_direction_its_buckets_have():
    """Pix2Struct's text attention has no ``is_decoder``; its ``compute_bias`` always buckets in one
    direction.  The adapter finds that direction by reproducing ``compute_bias`` and uses it, not a guess:
    the bias it installs equals the model's for queries after a cache."""
    model = hf_zoo.build("pix2struct")
    owners = [m for m in model.modules() if hasattr(m, "relative_attention_bias") and not hasattr(m, "is_decoder")]
    assert owners, "the text attention of Pix2Struct no longer lacks is_decoder; this test guards nothing"
    want = [type(m).compute_bias(m, 5, 300, past_seen_tokens=295) for m in owners]
    patch_model(model)
    for m, expected in zip(owners, want, strict=True):
        got = m.compute_bias(5, 300, past_seen_tokens=295)
        assert torch.equal(got, expected)
    unpatch_model(model)


def test_a_rotary_module_holding_a_wrapper_config_is_read_through_its_text_config():
    model = hf_zoo.build("llama")
    rotary = model.model.rotary_emb
    ref = hf_zoo.run(model)
    rotary.config = transformers.LlavaConfig(text_config=model.config.to_dict())   # a wrapper, as VLMs hold
    patch_model(model)
    got = hf_zoo.run(model)
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=hf_zoo.ATOL)
    unpatch_model(model)


def test_mpt_with_six_heads_is_patched_and_equal():
    """MPT orders its slopes for a head count that is not a power of two its own way; for 6 heads it
    comes to the ALiBi paper's slopes, which the self-check confirms."""
    config = hf_zoo.build("mpt").config
    config.n_heads, config.d_model = 6, 48
    torch.manual_seed(0)
    model = transformers.MptForCausalLM(config).eval()
    ref = hf_zoo.run(model)
    got = hf_zoo.run(patch_model(model))
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=hf_zoo.ATOL)
    assert got[2] == ref[2]


def test_falcon_with_alibi_is_refused_rather_than_patching_its_unused_rotary_module():
    config = transformers.FalconConfig(vocab_size=96, hidden_size=64, num_attention_heads=4, num_hidden_layers=1,
                                       alibi=True)
    model = transformers.FalconForCausalLM(config).eval()
    with pytest.raises(ValueError, match=r"FalconForCausalLM \(alibi=True\) builds its ALiBi bias with a module-level"):
        patch_model(model)
    assert not any("_posenc_patch" in vars(m) for m in model.modules())
