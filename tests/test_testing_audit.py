"""posenc.testing.audit_hf and ``posenc audit``: per-layer positions of a Hugging Face config, flags for fields
that contradict each other or go unread, and the model's rotary modules checked against the config (a module
planted to ignore its config's scaling must be named)."""

from __future__ import annotations

import json

import pytest
import torch

from posenc.cli import main
from posenc.testing import AuditReport, audit_hf
from tests.reference import rope_oracle

LLAMA31 = {
    "model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 64,
    "intermediate_size": 512, "rope_theta": 500000.0, "max_position_embeddings": 131072,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}


def test_the_per_layer_table_and_the_context_are_read_from_the_config():
    report = audit_hf(LLAMA31, inspect_modules=False)
    assert isinstance(report, AuditReport) and report.model_type == "llama"
    assert "RoPE d=64 base=500000 half Llama3Scaling" in report.schedule
    assert "llama3: original 8192 x factor 8" in report.context and report.layout.startswith("half")
    assert report.flags == () and report.ok
    assert report.warnings == ("factor x original_max_position_embeddings = 8 x 8192 = 65536, but "
                               "max_position_embeddings = 131072: the llama3 rule interpolates for 65536 positions; "
                               "check which length the model was trained to",)


@pytest.mark.parametrize("extra, flag", [
    ({"sliding_window": 4096, "use_sliding_window": False}, "sliding_window=4096 is set but use_sliding_window is false"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 8.0}}, "rope_scaling says rope_type='llama3' but "
                                                                "rope_parameters says 'yarn'"),
    ({"head_dim": 64, "partial_rotary_factor": 0.5, "rotary_dim": 64}, "rotary_dim=64 but head_dim x "
                                                                        "partial_rotary_factor = 64 x 0.5 = 32"),
    ({"max_position_embeddings": 4096}, "original_max_position_embeddings=8192 is not below "
                                        "max_position_embeddings=4096, yet factor=8"),
])
def test_contradicting_fields_are_flagged(extra, flag):
    report = audit_hf({**LLAMA31, **extra}, inspect_modules=False)
    assert any(flag in f for f in report.flags), report.flags
    assert not report.ok


def test_the_config_given_is_left_as_it_was():
    pytest.importorskip("transformers")                 # its config classes edit nested dicts in place
    config = json.loads(json.dumps({**LLAMA31, "partial_rotary_factor": 0.5}))
    before = json.dumps(config, sort_keys=True)
    audit_hf(config, max_position=64)
    assert json.dumps(config, sort_keys=True) == before


def test_the_models_rotary_module_is_built_from_the_config_and_agrees():
    pytest.importorskip("transformers")
    report = audit_hf(LLAMA31, max_position=1024)
    (module,) = report.modules
    assert module.agrees is True and "Llama3Scaling(factor=8, original_max_seq_len=8192)" in module.summary
    assert "layout half" in module.summary
    gptj = audit_hf({"model_type": "gptj", "n_embd": 256, "n_head": 4, "rotary_dim": 32, "n_layer": 2},
                    max_position=512)
    assert [m.agrees for m in gptj.modules] == [True] and "layout interleaved" in gptj.modules[0].summary


class _IgnoresScaling(torch.nn.Module):
    """A rotary module that reads the base from its config but drops its scaling rule (the bug to find)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        base = config.rope_parameters["rope_theta"]
        self.register_buffer("inv_freq", torch.tensor(rope_oracle.default(64, base)), persistent=False)

    def forward(self, x, position_ids):
        angle = position_ids[..., None].double() * self.inv_freq
        emb = torch.cat((angle, angle), -1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class _Model(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.rotary_emb = _IgnoresScaling(config)


def test_a_module_that_ignores_its_configs_scaling_is_named():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**{k: v for k, v in LLAMA31.items() if k not in ("model_type", "rope_scaling",
                                                                                        "rope_theta")},
                                      rope_parameters={**LLAMA31["rope_scaling"], "rope_theta": 500000.0})
    cls = type("IgnoringRotaryEmbedding", (_IgnoresScaling,), {})     # the audit finds *RotaryEmbedding classes
    model = _Model(config)
    model.rotary_emb = cls(config)
    report = audit_hf(model, max_position=1024)
    (module,) = report.modules
    assert module.agrees is False and not report.ok
    assert "frequencies differ from the config's (base=500000, Llama3Scaling" in module.differences[0]
    assert "the module computes base=500000, default (no scaling)" in module.differences[0]


def test_the_command_line(tmp_path, capsys):
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(LLAMA31))
    assert main(["audit", str(tmp_path), "--max-position", "512"]) == 0
    out = capsys.readouterr().out
    assert "posenc audit: model_type='llama'" in out and "LlamaRotaryEmbedding: agrees with the config" in out
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA31, "sliding_window": 64, "use_sliding_window": False}))
    assert main(["audit", str(tmp_path / "config.json"), "--no-modules"]) == 1
    assert "use_sliding_window is false" in capsys.readouterr().out


def test_the_command_line_refuses_a_missing_config(tmp_path, capsys):
    assert main(["audit", str(tmp_path)]) == 2
    assert "neither a config.json nor a folder holding one" in capsys.readouterr().err


def test_a_config_whose_rope_fields_cannot_be_read_is_flagged():
    report = audit_hf({**LLAMA31, "rope_scaling": {"rope_type": "linear", "factor": "2"}}, inspect_modules=False)
    assert not report.ok and report.flags[0].startswith("the rope fields cannot be read: factor must be a real number")


def test_multimodal_rope_sections_are_read_and_not_flagged():
    qwen2_vl = {"model_type": "qwen2_vl", "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
                "rope_theta": 1e6, "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]}}
    assert audit_hf(qwen2_vl, inspect_modules=False).flags == ()
    wrong = audit_hf({**qwen2_vl, "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]}}, inspect_modules=False)
    assert "mrope_section=[4, 6, 6] sums to 16" in wrong.flags[0]


def test_modules_are_probed_within_the_configs_positions():
    pytest.importorskip("transformers")
    report = audit_hf({"model_type": "gptj", "n_embd": 256, "n_head": 4, "rotary_dim": 32, "n_layer": 2,
                       "n_positions": 2048})
    assert [m.agrees for m in report.modules] == [True]
    assert "probed up to position 2047" in report.notes[0]
