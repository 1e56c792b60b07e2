"""posenc says which RoPE pair layout it used where it can tell (INFO records on the "posenc" logger)
and warns with LayoutWarning only when an argument contradicts what it read.  The layouts it names
are checked against transformers' own rotation functions, and the fix each message suggests is
applied and checked to give the same attention scores."""

import logging
import re
import warnings

import pytest
import torch

import posenc
from posenc.core import hf_config
from posenc.core.notices import LayoutWarning
from posenc.nn import RotaryEmbedding

SMALL = {"vocab_size": 96, "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
         "intermediate_size": 64, "max_position_embeddings": 64}
LLAMA = {"model_type": "llama", **SMALL}                                  # head_dim 16, half-split pairs
GPTJ = {"model_type": "gptj", "n_embd": 64, "n_head": 4, "rotary_dim": 8}  # head_dim 16, rotary 8, adjacent pairs
NEOX = {"model_type": "gpt_neox", **SMALL, "rotary_pct": 0.25}           # head_dim 16, rotary 4


def _records(caplog, prefix):
    return [r for r in caplog.records if r.name == "posenc" and r.getMessage().startswith(prefix)]


@pytest.fixture
def info(caplog):
    caplog.set_level(logging.INFO, logger="posenc")
    return caplog


@pytest.fixture
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# ---- what the INFO records say -------------------------------------------------------------------

@pytest.mark.parametrize(("config", "layout", "parts"), [
    (LLAMA, "half", ["model_type='llama'", "head_dim=16", "half-split pairs (i, i + d/2)",
                     "posenc.convert_rope_weight(w, num_heads, src='interleaved', dst='half')"]),
    (GPTJ, "interleaved", ["model_type='gptj'", "head_dim=16, rotary_dim=8", "adjacent features (2i, 2i + 1)",
                           "posenc.convert_rope_weight(w, num_heads, src='half', dst='interleaved')"]),
    (NEOX, "half", ["model_type='gpt_neox'", "head_dim=16, rotary_dim=4"]),
    ({"model_type": "deepseek_v3", **SMALL, "qk_rope_head_dim": 8, "rope_interleave": False}, "half",
     ["rope_interleave=False", "qk_rope_head_dim=8"]),
    # transformers' DeepSeek-V3 attention tests `if config.rope_interleave:`, so null means half-split too
    ({"model_type": "deepseek_v3", **SMALL, "qk_rope_head_dim": 8, "rope_interleave": None}, "half",
     ["rope_interleave=None"]),
    ({"model_type": "deepseek_v3", **SMALL, "qk_rope_head_dim": 8}, "interleaved", ["rope_interleave unset (default"]),
], ids=["llama", "gptj", "gpt_neox-partial", "deepseek_v3-half", "deepseek_v3-null", "deepseek_v3-interleaved"])
def test_from_hf_config_logs_the_layout_and_why(info, no_warnings, config, layout, parts):
    rope = RotaryEmbedding.from_hf_config(config)
    assert rope.layout == layout
    [record] = _records(info, "RotaryEmbedding.from_hf_config:")
    assert record.levelno == logging.INFO
    message = record.getMessage()
    assert message.startswith(f"RotaryEmbedding.from_hf_config: layout={layout!r} (config dict, ")
    for part in parts:
        assert part in message


def test_from_hf_config_names_the_transformers_config_class(info, no_warnings):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**SMALL)
    RotaryEmbedding.from_hf_config(config)
    [record] = _records(info, "RotaryEmbedding.from_hf_config:")
    assert "layout='half' (LlamaConfig, model_type='llama', head_dim=16: " in record.getMessage()


def test_rope_layout_from_hf_logs_its_answer(info, no_warnings):
    assert posenc.rope_layout_from_hf(GPTJ) == "interleaved"
    [record] = _records(info, "rope_layout_from_hf:")
    assert record.getMessage().startswith("rope_layout_from_hf: layout='interleaved' (config dict, model_type='gptj'")


@pytest.mark.parametrize(("config", "says"), [
    ({"hidden_size": 64, "num_attention_heads": 4}, "the config names no model type, so posenc assumes"),
    ({"model_type": "my_research_lm", "hidden_size": 64, "num_attention_heads": 4}, "a model type posenc has no layout on"),
])
def test_an_assumed_layout_says_so_and_a_given_one_does_not_warn(info, no_warnings, config, says):
    assert hf_config.describe_rope_layout(config).known is False
    assert RotaryEmbedding.from_hf_config(config).layout == "half"
    assert RotaryEmbedding.from_hf_config(config, layout="interleaved").layout == "interleaved"
    assumed, given = _records(info, "RotaryEmbedding.from_hf_config:")
    assert says in assumed.getMessage() and assumed.getMessage().startswith(
        "RotaryEmbedding.from_hf_config: layout='half' (")
    assert given.getMessage().startswith(
        "RotaryEmbedding.from_hf_config: layout='interleaved' as given; the config does not settle it (")


def test_a_layout_that_agrees_with_the_config_is_logged_as_given(info, no_warnings):
    assert RotaryEmbedding.from_hf_config(GPTJ, layout="interleaved").layout == "interleaved"
    [record] = _records(info, "RotaryEmbedding.from_hf_config:")
    assert record.getMessage().startswith(
        "RotaryEmbedding.from_hf_config: layout='interleaved' as given, as the config implies (config dict")


@pytest.mark.parametrize(("weight", "heads", "src", "dst", "rotary_dim", "text"), [
    (torch.zeros(64, 32), 4, "interleaved", "half", None,
     "convert_rope_weight: src='interleaved' -> dst='half' for a (64, 32) weight (num_heads=4 heads of head_dim=16): "
     "the first 16 rows of each head are reordered, so the result rotates correctly with layout='half'"),
    (torch.zeros(48), 2, "half", "interleaved", 8,
     "convert_rope_weight: src='half' -> dst='interleaved' for a (48,) bias (num_heads=2 heads of head_dim=24, "
     "rotary_dim=8): the first 8 rows of each head are reordered"),
    (torch.zeros(64, 32), 4, "half", "half", None,
     "convert_rope_weight: src and dst are both 'half': nothing to reorder, returning an unchanged copy of a (64, 32) "
     "weight (num_heads=4 heads of head_dim=16); if the checkpoint pairs features the other way, pass "
     "src='interleaved'"),
], ids=["weight", "partial-bias", "same-layout"])
def test_convert_rope_weight_logs_what_it_did(info, no_warnings, weight, heads, src, dst, rotary_dim, text):
    posenc.convert_rope_weight(weight, heads, src=src, dst=dst, rotary_dim=rotary_dim)
    [record] = _records(info, "convert_rope_weight:")
    assert record.levelno == logging.INFO and record.getMessage().startswith(text)


def test_nothing_is_formatted_or_printed_without_info_logging(caplog, capsys, no_warnings, monkeypatch):
    caplog.set_level(logging.WARNING, logger="posenc")

    def formatted(*args, **kwargs):
        raise AssertionError("a notice was formatted with INFO logging off")

    monkeypatch.setattr(hf_config, "conversion_hint", formatted)       # what every INFO record is built from
    monkeypatch.setattr(posenc.functional.rope, "_conversion_note", formatted)
    RotaryEmbedding.from_hf_config(LLAMA)
    posenc.convert_rope_weight(torch.zeros(8, 2), 1, src="interleaved", dst="half")
    assert not caplog.records
    assert capsys.readouterr() == ("", "")


def test_repr_shows_the_layout():
    assert "layout='interleaved'" in repr(RotaryEmbedding(8, layout="interleaved"))
    assert "layout='half'" in repr(RotaryEmbedding.from_hf_config(LLAMA))


# ---- LayoutWarning: contradictions only ----------------------------------------------------------

@pytest.mark.parametrize(("config", "layout", "implied"), [(LLAMA, "interleaved", "half"), (GPTJ, "half", "interleaved")])
def test_a_layout_contradicting_the_config_warns_at_the_callers_line(config, layout, implied):
    with pytest.warns(LayoutWarning, match=f"layout={layout!r} contradicts the config") as caught:
        rope = RotaryEmbedding.from_hf_config(config, layout=layout)
    assert rope.layout == layout                                       # the user's choice stands
    [w] = caught.list
    assert w.filename == __file__
    assert f"which implies layout={implied!r}" in str(w.message)
    assert f"posenc.convert_rope_weight(w, num_heads, src={implied!r}, dst={layout!r})" in str(w.message)
    assert issubclass(LayoutWarning, UserWarning)


QWEN2_VL = {"model_type": "qwen2_vl", "hidden_size": 64, "num_attention_heads": 4, "rope_theta": 10000.0,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}


def test_the_multimodal_module_warns_on_a_contradiction_too(info):
    from posenc.nn.mrope import MultimodalRotaryEmbedding

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert MultimodalRotaryEmbedding.from_hf_config(QWEN2_VL).layout == "half"
    with pytest.warns(LayoutWarning, match="MultimodalRotaryEmbedding.from_hf_config: layout='interleaved' contradicts") \
            as caught:
        assert MultimodalRotaryEmbedding.from_hf_config(QWEN2_VL, layout="interleaved").layout == "interleaved"
    assert [w.filename for w in caught.list] == [__file__]
    assert [r.getMessage().split(" (")[0] for r in _records(info, "MultimodalRotaryEmbedding.from_hf_config:")] == [
        "MultimodalRotaryEmbedding.from_hf_config: layout='half'",
        "MultimodalRotaryEmbedding.from_hf_config: layout='interleaved' as given, overriding the config's 'half'"]


@pytest.mark.parametrize(("text_type", "layout"), [("glm4", "interleaved"), ("llama", "half")])
def test_a_wrapper_config_is_read_through_its_text_config(text_type, layout):
    found = hf_config.describe_rope_layout({"model_type": "my_vlm_wrapper", "text_config": {"model_type": text_type}})
    assert (found.layout, found.known) == (layout, True)
    assert found.reason.startswith(f"config dict.text_config, model_type={text_type!r}")


def test_an_invalid_layout_raises_before_any_notice(info):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="layout must be one of 'half', 'interleaved'; got 'neox'"):
            RotaryEmbedding.from_hf_config(LLAMA, layout="neox")
    assert not _records(info, "RotaryEmbedding.from_hf_config:")


def test_the_suggested_fix_gives_the_checkpoints_scores():
    """Apply the conversion the warning suggests to a 'half' checkpoint: the 'interleaved' embedding
    then gives the attention scores the checkpoint gives under the config's layout."""
    with pytest.warns(LayoutWarning) as caught:
        wrong = RotaryEmbedding.from_hf_config(LLAMA, layout="interleaved")
    src, dst = re.search(r"src='(\w+)', dst='(\w+)'\)", str(caught.list[0].message)).groups()
    right = RotaryEmbedding.from_hf_config(LLAMA)
    g = torch.Generator().manual_seed(0)
    wq, wk = torch.randn(64, 64, generator=g, dtype=torch.float64), torch.randn(32, 64, generator=g, dtype=torch.float64)
    x = torch.randn(1, 7, 64, generator=g, dtype=torch.float64)

    def scores(rope, wq, wk):
        q = (x @ wq.T).view(1, 7, 4, 16).transpose(1, 2)               # (B, H, S, D)
        k = (x @ wk.T).view(1, 7, 2, 16).transpose(1, 2)
        q, k = rope(q, k)
        return q @ k.repeat_interleave(2, 1).transpose(-1, -2)

    want = scores(right, wq, wk)
    got = scores(wrong, posenc.convert_rope_weight(wq, 4, src=src, dst=dst),
                 posenc.convert_rope_weight(wk, 2, src=src, dst=dst))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-10)
    assert not torch.allclose(scores(wrong, wq, wk), want, atol=1e-3)   # unconverted: wrong scores


def test_consistent_paths_do_not_warn(no_warnings):
    RotaryEmbedding.from_hf_config(LLAMA)
    RotaryEmbedding.from_hf_config(LLAMA, layout="half")
    RotaryEmbedding.from_hf_config(GPTJ, layout="interleaved")
    posenc.rope_layout_from_hf(GPTJ)
    posenc.convert_rope_weight(torch.zeros(8, 2), 1, src="half", dst="half")
    posenc.convert_rope_weight(torch.zeros(8, 2), 1, src="interleaved", dst="half")


# ---- the layouts posenc names are the ones transformers' code uses -------------------------------

def _pairing(rotate):
    """'half' or 'interleaved' from what a rotate function does to arange(8): half-split gives
    (-x4..-x7, x0..x3), adjacent pairs give (-x1, x0, -x3, x2, ...)."""
    x = torch.arange(1.0, 9.0)
    out = rotate(x.view(1, 1, 1, 8)).flatten()                         # (B, H, S, D), as the models call it
    if torch.equal(out, torch.cat([-x[4:], x[:4]])):
        return "half"
    if torch.equal(out, torch.stack([-x[1::2], x[0::2]], -1).flatten()):
        return "interleaved"
    raise AssertionError(f"unrecognised rotation {out}")


@pytest.mark.parametrize(("model_type", "module", "function"), [
    ("llama", "llama", "rotate_half"), ("mistral", "mistral", "rotate_half"), ("qwen2", "qwen2", "rotate_half"),
    ("qwen3", "qwen3", "rotate_half"), ("gemma3_text", "gemma3", "rotate_half"), ("phi3", "phi3", "rotate_half"),
    ("gpt_neox", "gpt_neox", "rotate_half"), ("qwen2_vl", "qwen2_vl", "rotate_half"),
    ("cohere", "cohere", "rotate_half"), ("cohere2", "cohere2", "rotate_half"), ("glm", "glm", "rotate_half"),
    ("gptj", "gptj", "rotate_every_two"), ("codegen", "codegen", "rotate_every_two"),
    ("cohere2_moe", "cohere2_moe", "rotate_half"), ("glm4", "glm4", "rotate_half"), ("ernie4_5", "ernie4_5", "rotate_half"),
    ("ernie4_5_moe", "ernie4_5_moe", "rotate_half"), ("helium", "helium", "rotate_half"),
    ("moonshine", "moonshine", "rotate_half"), ("qwen3_vl", "qwen3_vl", "rotate_half"),
    ("qwen3_vl_moe", "qwen3_vl_moe", "rotate_half"), ("starcoder2", "starcoder2", "rotate_half"), ("olmo2", "olmo2", "rotate_half"),
])
def test_the_named_layout_matches_transformers_rotation(model_type, module, function):
    pytest.importorskip("transformers")
    mod = pytest.importorskip(f"transformers.models.{module}.modeling_{module}")
    assert hf_config.describe_rope_layout({"model_type": model_type}).layout == _pairing(getattr(mod, function))


# ---- patch_model ---------------------------------------------------------------------------------

def _tiny(name):
    transformers = pytest.importorskip("transformers")
    configs = {
        "llama": lambda: (transformers.LlamaForCausalLM, transformers.LlamaConfig(**SMALL, num_key_value_heads=2)),
        "cohere": lambda: (transformers.CohereForCausalLM, transformers.CohereConfig(**SMALL, num_key_value_heads=2)),
        "gemma3": lambda: (transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(
            **{**SMALL, "num_hidden_layers": 2}, num_key_value_heads=2, head_dim=16, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"])),
        "gptj": lambda: (transformers.GPTJForCausalLM, transformers.GPTJConfig(
            vocab_size=96, n_embd=64, n_head=4, n_layer=2, rotary_dim=8, n_positions=64)),
    }
    cls, config = configs[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(config).eval()


@pytest.mark.parametrize(("name", "text"), [
    ("llama", "patch_model: LlamaForCausalLM: layout='half' (LlamaConfig, model_type='llama', head_dim=16: transformers "
              "rotates half-split pairs (i, i + d/2)); posenc now supplies the cos/sin of its rotary module, "),
    ("cohere", "patch_model: CohereForCausalLM: layout='interleaved' (CohereConfig, model_type='cohere', head_dim=16: "
               "the model pairs adjacent features (2i, 2i + 1)); "),
    ("gemma3", "patch_model: Gemma3ForCausalLM: layout='half' (Gemma3TextConfig, model_type='gemma3_text', "
               "head_dim=16: transformers rotates half-split pairs (i, i + d/2)); posenc now supplies the cos/sin of "
               "its rotary module (one table per layer type: full_attention, sliding_attention)"),
    ("gptj", tuple("patch_model: GPTJForCausalLM: layout='interleaved' (GPTJConfig, model_type='gptj', head_dim=16, "
                   "rotary_dim=8: the model pairs adjacent features (2i, 2i + 1)); posenc now supplies the sin/cos "
                   f"tables of {where}" for where in ("its rotary module", "2 attention layers"))),   # (< 5.24: per layer)
])
def test_patch_model_logs_the_models_layout(info, name, text):
    from posenc.integrations.transformers import patch_model, unpatch_model

    model = _tiny(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayoutWarning)
        patch_model(model)
    unpatch_model(model)
    [record] = _records(info, "patch_model:")
    assert record.getMessage().startswith(text), record.getMessage()     # (text: one string or alternatives)
    assert "weights are used as they are" in record.getMessage()
