"""Patched transformers models on a CUDA device (skipped without one): float32 logits equal the
unpatched model's; in bfloat16, where CUDA kernels are not deterministic between two identical runs,
a patched run differs from the unpatched one by no more than two unpatched runs differ."""

import os

import pytest
import torch

if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("needs a CUDA device and compiled (not interpreted) Triton kernels", allow_module_level=True)
transformers = pytest.importorskip("transformers")

from posenc.integrations.transformers import patch_model, unpatch_model  # noqa: E402

CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(vocab_size=96, hidden_size=256, num_attention_heads=4,
                                              num_key_value_heads=2, num_hidden_layers=2, intermediate_size=256,
                                              max_position_embeddings=1024),
    "qwen3": lambda: transformers.Qwen3Config(vocab_size=96, hidden_size=256, num_attention_heads=4,
                                              num_key_value_heads=2, num_hidden_layers=2, intermediate_size=256,
                                              head_dim=64, max_position_embeddings=1024),
}
CLASSES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def _model(name, dtype):
    torch.manual_seed(0)
    return getattr(transformers, CLASSES[name])(CONFIGS[name]()).eval().to("cuda", dtype)


def _run(model, ids, steps=8):
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=steps, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    return out.sequences, torch.stack(out.logits).float()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_float32_patched_logits_equal_the_models(name):
    model = _model(name, torch.float32)
    ids = torch.randint(0, 96, (4, 512), device="cuda")
    tokens, logits = _run(model, ids)
    patch_model(model)
    p_tokens, p_logits = _run(model, ids)
    unpatch_model(model)
    assert torch.equal(tokens, p_tokens)
    torch.testing.assert_close(p_logits, logits, rtol=0, atol=2e-4)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_bfloat16_patched_runs_vary_no_more_than_unpatched_ones(name):
    model = _model(name, torch.bfloat16)
    ids = torch.randint(0, 96, (4, 512), device="cuda")
    _, first = _run(model, ids, steps=1)
    _, second = _run(model, ids, steps=1)
    noise = float((first - second).abs().max())
    patch_model(model)
    _, patched = _run(model, ids, steps=1)
    unpatch_model(model)
    scale = float(first.abs().max())
    assert float((patched - first).abs().max()) <= max(noise, 2 ** -7 * scale), (noise, scale)


def test_deepseek_v4_on_the_kernel_equals_the_model():
    """DeepSeek-V4's rotations (the trailing slice of q and the shared KV, the compressed keys, and the
    output rotated back with -sin) on the Triton kernel, none through the model's own function; float32
    logits and greedy tokens equal the unpatched model's."""
    import sys

    from tests import hf_zoo

    model = hf_zoo.build("deepseek_v4").to("cuda")
    ids = torch.randint(3, 150, (2, 64), device="cuda")
    tokens, logits = _run(model, ids)
    patch_model(model, engine="triton")
    stand_in = sys.modules[type(model.model.rotary_emb).__module__].apply_rotary_pos_emb
    original, calls = stand_in.original, []
    stand_in.original = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        p_tokens, p_logits = _run(model, ids)
    finally:
        stand_in.original = original
    unpatch_model(model)
    assert not calls
    assert torch.equal(tokens, p_tokens)
    torch.testing.assert_close(p_logits, logits, rtol=0, atol=2e-4)
