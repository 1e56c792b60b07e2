"""posenc inside real Hugging Face models: tiny random models of every supported family, built here
from configs (no downloads), give the same logits patched and unpatched for a prefill and cached
decoding steps; far from position 0 the patched model is the more accurate one."""

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")

from posenc.integrations.transformers import is_patched, patch_model, patched, unpatch_model  # noqa: E402

SMALL = {"vocab_size": 96, "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
         "intermediate_size": 128}


def _llama_like(cls, **extra):
    return lambda: cls(**SMALL, num_key_value_heads=2, max_position_embeddings=256, **extra)


FAMILIES = {
    "llama": (transformers.LlamaForCausalLM, _llama_like(transformers.LlamaConfig)),
    "llama-dynamic": (transformers.LlamaForCausalLM, _llama_like(
        transformers.LlamaConfig, rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
    "mistral": (transformers.MistralForCausalLM, _llama_like(transformers.MistralConfig)),
    "qwen2-yarn": (transformers.Qwen2ForCausalLM, _llama_like(
        transformers.Qwen2Config, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 16})),
    "qwen3": (transformers.Qwen3ForCausalLM, _llama_like(transformers.Qwen3Config, head_dim=16)),
    "gemma": (transformers.GemmaForCausalLM, _llama_like(transformers.GemmaConfig, head_dim=16)),
    "gemma2": (transformers.Gemma2ForCausalLM, _llama_like(transformers.Gemma2Config, head_dim=16)),
    "gemma3": (transformers.Gemma3ForCausalLM, _llama_like(
        transformers.Gemma3TextConfig, head_dim=16, sliding_window=8,
        rope_scaling={"rope_type": "linear", "factor": 4.0})),
    "phi3-longrope": (transformers.Phi3ForCausalLM, lambda: transformers.Phi3Config(
        **SMALL, num_key_value_heads=2, max_position_embeddings=256, original_max_position_embeddings=24,
        pad_token_id=0, rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(8)],
                                      "long_factor": [1.0 + 1.5 * i for i in range(8)]})),
    "gpt_neox": (transformers.GPTNeoXForCausalLM, lambda: transformers.GPTNeoXConfig(
        **SMALL, rotary_pct=0.25, rotary_emb_base=50000, max_position_embeddings=256)),
    "cohere": (transformers.CohereForCausalLM, _llama_like(transformers.CohereConfig)),
    "glm": (transformers.GlmForCausalLM, _llama_like(transformers.GlmConfig, head_dim=16, pad_token_id=0, eos_token_id=1)),
    "deepseek_v3": (transformers.DeepseekV3ForCausalLM, lambda: transformers.DeepseekV3Config(
        **SMALL, num_key_value_heads=4, max_position_embeddings=256, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16, kv_lora_rank=16, q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                      "mscale": 1.0, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1})),
    "gptj": (transformers.GPTJForCausalLM, lambda: transformers.GPTJConfig(
        vocab_size=96, n_embd=64, n_head=4, n_layer=2, rotary_dim=8, n_positions=256)),
    "bloom": (transformers.BloomForCausalLM, lambda: transformers.BloomConfig(
        vocab_size=96, hidden_size=64, n_head=4, n_layer=2)),
    "bloom-6-heads": (transformers.BloomForCausalLM, lambda: transformers.BloomConfig(
        vocab_size=96, hidden_size=48, n_head=6, n_layer=2)),
    "mpt": (transformers.MptForCausalLM, lambda: transformers.MptConfig(
        vocab_size=96, d_model=64, n_heads=4, n_layers=2, max_seq_len=256)),
    "t5": (transformers.T5ForConditionalGeneration, lambda: transformers.T5Config(
        vocab_size=96, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0)),
}


def _build(name):
    cls, make = FAMILIES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        model = cls(make()).eval()
    return model


def _greedy(model, ids, steps):
    """Logits of a prefill and of ``steps`` cached greedy decoding steps, and the tokens chosen."""
    logits, tokens = [], []
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            enc = model.get_encoder()(input_ids=ids)
            dec = torch.zeros(1, 1, dtype=torch.long)
            out = model(encoder_outputs=enc, decoder_input_ids=dec, use_cache=True)
        else:
            out = model(input_ids=ids, use_cache=True)
        for _ in range(steps + 1):
            logits.append(out.logits[:, -1])
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(int(nxt))
            if len(tokens) > steps:
                break
            if model.config.is_encoder_decoder:
                out = model(encoder_outputs=enc, decoder_input_ids=nxt, past_key_values=out.past_key_values,
                            use_cache=True)
            else:
                out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    return torch.stack(logits), tokens


@pytest.mark.parametrize("name", list(FAMILIES))
def test_patched_model_reproduces_the_models_logits(name):
    model = _build(name)
    ids = torch.randint(1, 96, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        prefill = model(input_ids=ids, decoder_input_ids=ids[:, :33]).logits if model.config.is_encoder_decoder \
            else model(input_ids=ids).logits
    ref_logits, ref_tokens = _greedy(model, ids, 8)
    patch_model(model)
    with torch.no_grad():
        got = model(input_ids=ids, decoder_input_ids=ids[:, :33]).logits if model.config.is_encoder_decoder \
            else model(input_ids=ids).logits
    logits, tokens = _greedy(model, ids, 8)
    torch.testing.assert_close(got, prefill, rtol=0, atol=1e-5)                   # the whole prefill
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-5)             # 8 cached decoding steps
    assert tokens == ref_tokens
    unpatch_model(model)
    torch.testing.assert_close(_greedy(model, ids, 8)[0], ref_logits, rtol=0, atol=0)   # restored exactly


@pytest.mark.parametrize("name", ["llama", "phi3-longrope", "gpt_neox", "bloom", "t5"])
def test_generate_is_unchanged(name):
    model = _build(name)
    ids = torch.randint(1, 96, (1, 32), generator=torch.Generator().manual_seed(2))
    kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        expected = model.generate(ids, **kwargs)
        with patched(model):
            got = model.generate(ids, **kwargs)
    assert torch.equal(got, expected)
    assert not is_patched(model)


def _float64_rotary(module):
    """A float64 rotary forward from the RoPE formula itself (test oracle, independent of posenc)."""
    dim = 2 * module.inv_freq.numel()
    params = getattr(module.config, "rope_parameters", None) or {}
    base = params.get("rope_theta", getattr(module.config, "rope_theta", None))
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)

    def forward(x, position_ids, **kwargs):
        ang = position_ids.to(torch.float64)[..., None] * inv                     # exact to float64 rounding
        emb = torch.cat([ang, ang], -1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return forward


def test_far_from_position_zero_the_patched_model_is_closer_to_float64():
    model = _build("llama")
    ids = torch.randint(1, 96, (1, 32), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(100_000, 100_032)[None]
    reference = _build("llama").double()
    reference.model.rotary_emb.forward = _float64_rotary(reference.model.rotary_emb)
    with torch.no_grad():
        truth = reference(input_ids=ids, position_ids=positions).logits
        hf = model(input_ids=ids, position_ids=positions).logits.double()
        with patched(model):
            ours = model(input_ids=ids, position_ids=positions).logits.double()
    err_hf, err_ours = (hf - truth).abs().max().item(), (ours - truth).abs().max().item()
    assert err_ours < 1e-4 and err_ours * 10 < err_hf, (err_ours, err_hf)


def test_models_without_positions_and_double_patching():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=96, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match=r"found no positional module in GPT2LMHeadModel \(model_type='gpt2'\)"):
        patch_model(gpt2)
    assert not is_patched(gpt2)
    model = _build("llama")
    assert patch_model(patch_model(model)) is model and is_patched(model)
    record = vars(model.model.rotary_emb)["_posenc_patch"]
    assert record.kind == "rotary" and [name for name, _, _ in record.saved] == ["forward"]   # patched once
    unpatch_model(model)
    assert "forward" not in vars(model.model.rotary_emb) and "posenc_rope" not in model.model.rotary_emb._modules


def test_the_old_list_of_model_types_still_imports_with_a_deprecation_warning():
    import posenc.integrations.transformers as integration

    with pytest.warns(DeprecationWarning, match="SUPPORTED_MODEL_TYPES is deprecated"):
        types = integration.SUPPORTED_MODEL_TYPES
    assert {"llama", "gemma3", "phi3", "gptj", "bloom", "mpt", "t5"} <= set(types)


@pytest.mark.float64
def test_patching_keeps_state_dict_and_moves_with_the_model():
    model = _build("qwen3")
    keys = set(model.state_dict())
    patch_model(model)
    assert set(model.state_dict()) == keys                                        # posenc's tables are not state
    model.to(torch.float64)
    ids = torch.randint(1, 96, (1, 8))
    with torch.no_grad():
        assert model(input_ids=ids).logits.dtype == torch.float64


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_patched_model_runs_posencs_code(name, monkeypatch):
    import posenc.integrations.transformers as integration

    calls = []

    def counting(fn):
        def wrapper(*a, **kw):
            calls.append(fn.__name__)
            return fn(*a, **kw)
        return wrapper

    monkeypatch.setattr(integration._RotaryTables, "forward", counting(integration._RotaryTables.forward))
    from posenc.integrations.transformers import _bias

    for fn in ("alibi_bias", "relative_position_bucket"):
        monkeypatch.setattr(_bias, fn, counting(getattr(_bias, fn)))
    model = patch_model(_build(name))
    with torch.no_grad():
        ids = torch.randint(1, 96, (1, 6))
        model(input_ids=ids, decoder_input_ids=ids) if model.config.is_encoder_decoder else model(input_ids=ids)
    assert calls


def test_gptj_returns_posencs_exact_sin_cos_in_its_own_order():
    model = _build("gptj")
    rotary = next(m for m in model.modules() if type(m).__name__ == "GPTJRotaryEmbedding")
    positions = torch.tensor([[0, 1, 7, 200]])
    x = torch.zeros(1, 4, 8)
    with torch.no_grad():
        before = rotary(x, positions)
        patch_model(model)
        sin, cos = rotary(x, positions)
    inv = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)          # GPT-J: rotary_dim 8
    angles = positions[0, :, None].double() * inv
    torch.testing.assert_close(sin[0].double(), angles.sin(), rtol=0, atol=2 ** -24)   # exact, rounded once
    torch.testing.assert_close(cos[0].double(), angles.cos(), rtol=0, atol=2 ** -24)
    torch.testing.assert_close(sin, before[0], rtol=0, atol=1e-5)                   # the model's own order
    unpatch_model(model)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(rotary(x, positions), before, strict=True))


def test_casting_a_patched_model_keeps_posencs_tables_exact():
    fresh = patch_model(_build("llama"))
    cast = patch_model(_build("llama"))
    cast.to(torch.bfloat16).to(torch.float32)                                   # rounds the weights, not the tables
    x, positions = torch.zeros(1, 5, 64), torch.tensor([[0, 1, 255, 256, 70_000]])
    with torch.no_grad():
        for a, b in zip(fresh.model.rotary_emb(x, positions), cast.model.rotary_emb(x, positions), strict=True):
            assert torch.equal(a, b)


def test_patched_nested_keeps_an_earlier_patch():
    model = patch_model(_build("llama"))
    with patched(model):
        pass
    assert is_patched(model)
    with patched(model.model):
        pass
    assert is_patched(model)


@pytest.mark.parametrize("assume_in_table", [False, True])
def test_a_patched_model_compiles_with_fullgraph(assume_in_table):
    model = patch_model(_build("llama"), assume_in_table=assume_in_table)
    ids = torch.randint(1, 96, (1, 12))
    compiled = torch.compile(lambda ids: model(input_ids=ids).logits, fullgraph=True, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), model(input_ids=ids).logits, rtol=0, atol=1e-5)


# ---- engine=: the rotation of q and k through posenc's engine ---------------------------------------------

@pytest.mark.parametrize("name", ["llama", "gemma3", "gpt_neox", "cohere", "glm", "phi3-longrope"])
def test_backend_routes_the_rotation_through_posenc_and_keeps_parity(name, monkeypatch):
    import sys

    import posenc.integrations.transformers as integration

    model = _build(name)
    rotary = next(m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding"))
    code = sys.modules[type(rotary).__module__]
    import gc

    gc.collect()                                                   # (models other tests patched and dropped)
    current = code.apply_rotary_pos_emb
    original = getattr(current, "original", current)
    ids = torch.randint(1, 96, (1, 40), generator=torch.Generator().manual_seed(1))
    ref_logits, ref_tokens = _greedy(model, ids, 8)
    patch_model(model, engine="torch")
    calls = []
    fast = integration._FastEntry.rotate
    monkeypatch.setattr(integration._FastEntry, "rotate", lambda *a, **k: calls.append(1) or fast(*a, **k))
    logits, tokens = _greedy(model, ids, 8)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-5)
    assert tokens == ref_tokens
    assert len(calls) == 9 * model.config.num_hidden_layers                  # every layer, prefill and 8 steps
    assert isinstance(code.apply_rotary_pos_emb, integration._FastRotate)
    other = _build(name)                                                      # an unpatched model: its own code
    calls.clear()
    torch.testing.assert_close(_greedy(other, ids, 8)[0], ref_logits, rtol=0, atol=0)
    assert not calls
    unpatch_model(model)
    now = code.apply_rotary_pos_emb
    assert now is original or (isinstance(now, integration._FastRotate) and now.original is original and now.users)
    torch.testing.assert_close(_greedy(model, ids, 8)[0], ref_logits, rtol=0, atol=0)


def test_patched_copies_dropped_without_unpatching_stop_counting():
    """The stand-in counts the patched models that route the function weakly: copies made and dropped
    (patch_model's own checks on an already patched model make some) never keep it installed."""
    import copy
    import gc
    import sys

    model = _build("llama")
    code = sys.modules[type(model.model.rotary_emb).__module__]
    gc.collect()
    before = len(getattr(code.apply_rotary_pos_emb, "users", ()))
    patch_model(model)
    for _ in range(3):
        copy.deepcopy(model)                                        # made and dropped
    patch_model(model)                                              # again: nothing new to patch
    gc.collect()
    assert len(code.apply_rotary_pos_emb.users) == before + 1
    assert copy.copy(code.apply_rotary_pos_emb) is code.apply_rotary_pos_emb      # a function: copies are itself


ROUTED = ["llama", "llama-dynamic", "qwen2-yarn", "gemma3", "phi3-longrope", "gpt_neox", "cohere", "glm", "deepseek_v3"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ROUTED)
def test_the_default_rotation_equals_the_models_own_rotation_bit_for_bit(name, dtype):
    """patch_model's default (engine="auto", posenc's torch engine on CPU) rotates q and k with the
    same products and additions as the model's own function: the logits of a prefill and 8 cached
    steps equal, to the bit, those of the model rotating posenc's cos/sin itself (engine=None).
    The families cover half and interleaved pairs, pairs de-interleaved on the way (DeepSeek-V3's
    latent attention), a rotary part narrower than the head (GPT-NeoX, GLM), a length-dependent rule
    computed per call (dynamic NTK) and per-layer-type tables."""
    model = _build(name).to(dtype)
    ids = torch.randint(1, 96, (2, 30), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0                                              # a left-padded row: other positions per row
    kwargs = {"attention_mask": mask, "max_new_tokens": 8, "do_sample": False, "pad_token_id": 0,
              "output_logits": True, "return_dict_in_generate": True}
    with torch.no_grad():
        with patched(model, engine=None):
            want = model.generate(ids, **kwargs)
        with patched(model):
            assert next(m.posenc_rope for m in model.modules() if hasattr(m, "posenc_rope")).fast[2] == "auto"
            got = model.generate(ids, **kwargs)
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.logits, want.logits, strict=True):
        assert torch.equal(a, b)


def test_the_default_rotation_past_the_table_and_in_float64_equals_the_models_own():
    """Positions past the table (computed per call) and a float64 model take the per-call factors."""
    model = _build("llama")                                      # 256-row table
    ids = torch.randint(1, 96, (1, 250), generator=torch.Generator().manual_seed(6))
    for m in (model, _build("llama").double()):
        with torch.no_grad():
            with patched(m, engine=None):
                want = _greedy(m, ids, 12)                       # steps at positions 250 .. 261
            with patched(m):
                got = _greedy(m, ids, 12)
        assert torch.equal(got[0], want[0]) and got[1] == want[1]


def test_a_patched_model_moved_to_meta_and_back_rebuilds_its_tables():
    model = patch_model(_build("llama"))
    ids = torch.randint(1, 96, (1, 12))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    state = model.state_dict()
    model.to("meta").to_empty(device="cpu")
    model.load_state_dict(state)
    for module in model.modules():
        if hasattr(module, "reset_buffers") and type(module).__name__ == "_RotaryTables":
            module.reset_buffers()
    model.model.rotary_emb.original_inv_freq = model.model.rotary_emb.inv_freq           # (the model's own buffer)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, want, rtol=0, atol=0)


def test_backend_survives_copies_and_the_last_unpatch_restores_the_function():
    import copy
    import pickle
    import sys

    import posenc.integrations.transformers as integration

    model = _build("llama")
    code = sys.modules[type(model.model.rotary_emb).__module__]
    import gc

    gc.collect()
    before = len(getattr(code.apply_rotary_pos_emb, "users", ()))            # (other models patched in this process)
    patch_model(model, engine="torch")
    twin, loaded = copy.deepcopy(model), pickle.loads(pickle.dumps(model))
    assert len(code.apply_rotary_pos_emb.users) == before + 3
    ids = torch.randint(1, 96, (1, 12))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        for other in (twin, loaded):
            torch.testing.assert_close(other(input_ids=ids).logits, want, rtol=0, atol=0)
    for m in (model, twin):
        unpatch_model(m)
        assert isinstance(code.apply_rotary_pos_emb, integration._FastRotate)
    unpatch_model(loaded)
    if before:
        assert len(code.apply_rotary_pos_emb.users) == before
    else:                                                                     # the last user gone: the original back
        assert not isinstance(code.apply_rotary_pos_emb, integration._FastRotate)


def test_backend_where_the_rotate_function_is_not_recognised_keeps_the_models_rotation(caplog):
    model = _build("gptj")                                         # apply_rotary_pos_emb(tensor, sin, cos)
    with caplog.at_level("INFO", logger="posenc"):
        patch_model(model, engine="torch")
    assert "the model's own attention code rotates q and k in this layout (its rotate function takes neither " \
           "(q, k, cos, sin) nor (x, cos, sin) with real cos/sin)" in caplog.text
    assert model.transformer.rotary_emb.posenc_rope.fast is None


def test_a_rotate_function_posenc_matches_only_to_rounding_keeps_its_own_rotation(monkeypatch):
    """The self-check asks for the model's own results bit for bit: a function that rotates the same
    pairs by the same angles but rounds differently (here in float64) keeps its own rotation."""
    from transformers.models.llama import modeling_llama

    def in_float64(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim).double(), sin.unsqueeze(unsqueeze_dim).double()
        turn = modeling_llama.rotate_half
        return ((q.double() * cos + turn(q.double()) * sin).to(q.dtype),
                (k.double() * cos + turn(k.double()) * sin).to(k.dtype))

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", in_float64)
    model = patch_model(_build("llama"))
    adapter = model.model.rotary_emb.posenc_rope
    assert adapter.fast is None
    assert adapter.why_not_fast == "posenc's engine does not reproduce it bit for bit on random q and k"
    assert modeling_llama.apply_rotary_pos_emb is in_float64


def test_the_stand_in_leaves_other_calls_to_the_models_function():
    """Calls the entry was not checked for run the model's own function: another sin than the one
    returned with this cos, q shorter than cos (a function may slice cos to q's length), and a q whose
    dtype differs from cos's (under autocast the function's own promotion and rounding apply)."""
    import sys

    model = patch_model(_build("llama"))
    code = sys.modules[type(model.model.rotary_emb).__module__]
    stand_in, original = code.apply_rotary_pos_emb, code.apply_rotary_pos_emb.original
    x = torch.zeros(1, 6, 16)
    cos, sin = model.model.rotary_emb(x, torch.arange(6)[None])
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 6, 16, generator=gen), torch.randn(1, 2, 6, 16, generator=gen)
    cases = [(q, k, cos, -sin), (q.bfloat16(), k.bfloat16(), cos, sin)]
    for args in cases:
        for a, b in zip(stand_in(*args), original(*args), strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)

    def sliced(q, k, cos, sin, unsqueeze_dim=1):                    # cos cut to q's length (MuseGlimmer)
        c, s_ = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        cq, sq = c[..., -q.shape[-2]:, :], s_[..., -q.shape[-2]:, :]
        turn = sys.modules["transformers.models.llama.modeling_llama"].rotate_half
        return q * cq + turn(q) * sq, k * c + turn(k) * s_
    wrapped = type(stand_in)(sliced)
    got, want = wrapped(q[:, :, -2:], k, cos, sin), sliced(q[:, :, -2:], k, cos, sin)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("name", ["cohere", "llama"])
def test_float64_and_autocast_keep_the_models_own_rounding(name):
    """Cohere rotates in float32 whatever q's dtype; in float64 and under CPU autocast (bfloat16 q,
    float32 cos) the patched model gives the logits of the model rotating posenc's cos/sin itself."""
    ids = torch.randint(1, 96, (1, 20), generator=torch.Generator().manual_seed(7))
    model64 = _build(name).double()
    with torch.no_grad():
        with patched(model64, engine=None):
            want = model64(input_ids=ids).logits
        with patched(model64):
            got = model64(input_ids=ids).logits
    assert torch.equal(got, want)
    model = _build(name)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with patched(model, engine=None):
            want = model(input_ids=ids).logits
        with patched(model):
            got = model(input_ids=ids).logits
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_a_patched_model_saved_by_an_earlier_posenc_still_runs():
    """State from before the rotation was routed (no factor table, fewer attributes) loads and runs."""
    import pickle

    model = patch_model(_build("llama"), engine=None)
    ids = torch.randint(1, 96, (1, 12))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    adapter = model.model.rotary_emb.posenc_rope
    table = next(iter(adapter.tables.values()))
    for name in ("low", "mix_layout", "sign", "why_not_fast", "partial"):
        vars(adapter).pop(name)
    for name in ("mix_format", "rows", "dim", "length_dependent", "split"):
        vars(table).pop(name, None)                                   # (split: only with a factor table)
    table._buffers.pop("mix")
    loaded = pickle.loads(pickle.dumps(model))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, rtol=0, atol=0)


def test_backend_triton_rotates_with_the_kernel_where_it_takes_the_rows(monkeypatch):
    """engine="triton" (the kernel runs on CPU under TRITON_INTERPRET=1, as the test suite sets):
    one row set for the batch goes through the kernel (within 1e-5 of the model, the same tokens);
    per-row positions (a left-padded batch), which the kernel does not take, through the torch engine."""
    import os

    import posenc.integrations.transformers as integration
    from posenc._torch.engine_choice import triton_available

    if os.environ.get("TRITON_INTERPRET") != "1" or not triton_available(torch.device("cpu")):
        pytest.skip("the Triton kernel runs on CPU tensors under TRITON_INTERPRET=1 only (and needs Triton)")
    model = _build("gpt_neox")                                    # a rotary part narrower than the head
    ids = torch.randint(1, 96, (1, 20), generator=torch.Generator().manual_seed(8))
    ref_logits, ref_tokens = _greedy(model, ids, 3)
    calls = []
    kernel = integration._KernelEntry.rotate
    monkeypatch.setattr(integration._KernelEntry, "rotate", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    with patched(model, engine="triton"):
        assert model.gpt_neox.rotary_emb.posenc_rope.fast[2] == "triton"
        calls.clear()                                                  # (the patch-time check's own calls)
        logits, tokens = _greedy(model, ids, 3)
        assert len(calls) == 4 * model.config.num_hidden_layers
        torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-5)
        assert tokens == ref_tokens
        pair = torch.randint(2, 96, (2, 12), generator=torch.Generator().manual_seed(9))
        mask = torch.ones_like(pair)
        mask[0, :4] = 0
        rows = (mask.cumsum(-1) - 1).clamp(min=0)                      # each row's own positions
        calls.clear()
        with torch.no_grad():
            got = model(input_ids=pair, attention_mask=mask, position_ids=rows).logits
        assert not calls                                               # per-row positions: the torch engine
    with torch.no_grad():
        want = model(input_ids=pair, attention_mask=mask, position_ids=rows).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_the_log_says_who_rotates_q_and_k(caplog):
    for engine, said in (("auto", "posenc rotates q and k in this layout (the same roundings as the model's own "
                                   "apply_rotary_pos_emb)"),
                          (None, "the model's own attention code rotates q and k in this layout (engine=None)")):
        caplog.clear()
        with caplog.at_level("INFO", logger="posenc"):
            patch_model(_build("llama"), engine=engine)
        assert said in caplog.text


def test_backend_must_be_known():
    with pytest.raises(ValueError, match=r"engine must be None \(cos/sin only\), 'auto', 'torch' or 'triton', got 'cuda'"):
        patch_model(_build("llama"), engine="cuda")


@pytest.mark.parametrize("name, engine", [("llama", None), ("llama", "torch"), ("gemma3", None), ("gemma3", "torch"),
                                           ("phi3-longrope", None), ("phi3-longrope", "torch"), ("bloom", None)])
def test_a_left_padded_batch_generates_the_same(name, engine):
    model = _build(name)
    ids = torch.randint(2, 96, (2, 20), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[0, :7] = 0                                                   # the first row is 7 tokens shorter
    ids[0, :7] = 0
    kwargs = {"attention_mask": mask, "max_new_tokens": 6, "do_sample": False, "pad_token_id": 0,
              "output_scores": True, "return_dict_in_generate": True}
    with torch.no_grad():
        expected = model.generate(ids, **kwargs)
        with patched(model, engine=engine):
            got = model.generate(ids, **kwargs)
    assert torch.equal(got.sequences, expected.sequences)
    for a, b in zip(got.scores, expected.scores, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["llama", "gemma3", "gptj", "deepseek_v3"])
def test_a_model_cast_to_bfloat16_before_patching_is_checked_against_its_float32_frequencies(name):
    """``model.to(torch.bfloat16)`` rounds the rotary module's frequency buffers; the self-check compares
    with the float32 module its configuration builds, and the patched module then returns the float32
    module's values rounded once to bfloat16, where the cast module is much further off."""
    import inspect

    model = _build(name)
    rotary = next(m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding"))
    extra = (sorted(rotary.layer_types)[0],) if "layer_type" in inspect.signature(rotary.forward).parameters else ()
    positions = torch.arange(200, 224)[None]                                 # inside GPT-J's 256-row table
    with torch.no_grad():
        ref = rotary(torch.zeros(1, 24, 8), positions, *extra)               # float32, before the cast
        model.to(torch.bfloat16)
        x = torch.zeros(1, 24, 8, dtype=torch.bfloat16)
        cast = rotary(x, positions, *extra)
        patch_model(model)
        ours = rotary(x, positions, *extra)
        assert torch.isfinite(model(input_ids=torch.randint(1, 96, (1, 8))).logits).all()
    assert not any("_posenc_reference" in vars(m) for m in model.modules())
    for r, c, o in zip(ref, cast, ours, strict=True):
        assert o.dtype == torch.bfloat16
        err_ours, err_cast = (o.float() - r).abs().max().item(), (c.float() - r).abs().max().item()
        assert err_ours <= 2 ** -8, (err_ours, err_cast)                      # one bfloat16 rounding
        if name != "gptj":                               # (GPT-J's cast table is rounded once too: no worse)
            assert err_cast > 2 ** -8, (err_ours, err_cast)                   # angles from rounded frequencies


def test_phimoe_with_its_own_short_and_long_mscale_is_patched_and_equal(caplog):
    """Phi-3.5-MoE's attention factors (short_mscale 1.05, long_mscale 1.243163121016122) switch past the
    original context; transformers' Phimoe module keeps its short factors there, and the patch reproduces
    that module (logits past the original context, and cached greedy steps across it)."""
    import logging

    h = 8
    config = transformers.PhimoeConfig(
        hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=2, vocab_size=100, max_position_embeddings=256,
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1 + 0.1 * i for i in range(h)],
                             long_factor=[2 + 0.5 * i for i in range(h)], short_mscale=1.05,
                             long_mscale=1.243163121016122, original_max_position_embeddings=64))
    torch.manual_seed(0)
    model = transformers.PhimoeForCausalLM(config).eval()
    ids = torch.randint(0, 100, (2, 90))
    with torch.no_grad():
        want = model(ids).logits
        want_steps = model.generate(ids[:, :58], max_new_tokens=12, do_sample=False)
    with caplog.at_level(logging.INFO, logger="posenc"):
        patch_model(model)
    assert is_patched(model)
    assert "short factors at every length" in caplog.text
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=1e-5)
        assert torch.equal(model.generate(ids[:, :58], max_new_tokens=12, do_sample=False), want_steps)


@pytest.mark.parametrize("change", ["cos.mul_(0.5)", "sin.neg_()", "cos[..., :2].zero_()"])
def test_cos_sin_changed_in_place_after_the_rotary_call_rotate_as_the_models_own_function(change):
    """Custom attention code may change the cos/sin it got before rotating; posenc's stand-in for the
    model's apply_rotary_pos_emb then gives the model's own result with the changed values."""
    import sys

    cls, make = FAMILIES["llama"]
    torch.manual_seed(0)
    model = cls(make()).eval()
    patch_model(model)
    code = sys.modules[type(model.model.rotary_emb).__module__]
    stand_in = code.apply_rotary_pos_emb
    q, k = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16)
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(q, torch.arange(3, 8)[None])
        untouched = stand_in(q, k, cos, sin)
        exec(change, {}, {"cos": cos, "sin": sin})
        got = stand_in(q, k, cos, sin)
        want = stand_in.original(q, k, cos, sin)
    assert not torch.equal(got[0], untouched[0])
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    unpatch_model(model)


def test_dynamic_ntk_module_grown_by_earlier_calls_is_patched_as_loaded(caplog):
    """transformers' dynamic NTK remembers the longest sequence it saw; posenc keeps no such state, so a
    model that already ran past its original length is patched to compute as the model did when
    loaded (checked against a fresh copy of the module), and the record says so."""
    import copy
    import logging

    config = transformers.LlamaConfig(**SMALL, num_key_value_heads=2, max_position_embeddings=64,
                                      rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    loaded = copy.deepcopy(model)
    with torch.no_grad():
        model(torch.randint(0, 96, (1, 200)))                        # grows the module's remembered length
    ids = torch.randint(0, 96, (2, 100))
    with torch.no_grad():
        want = loaded(ids).logits
        assert not torch.allclose(model(ids).logits, want, rtol=0, atol=1e-4)    # the grown state differs
        steps = loaded.generate(ids[:, :60], max_new_tokens=8, do_sample=False)
    with caplog.at_level(logging.INFO, logger="posenc"):
        patch_model(model)
    assert "remembered 200 positions" in caplog.text
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=1e-5)
        assert torch.equal(model.generate(ids[:, :60], max_new_tokens=8, do_sample=False), steps)


def _deepseek_v4():
    from tests import hf_zoo

    model = hf_zoo.build("deepseek_v4")           # heads of 32 features whose trailing 8 rotate
    assert model.config.head_dim == 32 and model.config.partial_rotary_factor == 0.25
    return model


def test_deepseek_v4_config_reads_both_rotary_configurations():
    """from_hf_config on DeepSeek-V4: interleaved pairs of the trailing features, each layer type's base;
    the rotation and its inverse equal the model's own apply_rotary_pos_emb(x, cos, sin) and (x, cos, -sin)."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4

    import posenc

    config = _deepseek_v4().config
    torch.manual_seed(0)
    x = torch.randn(2, 4, 6, config.head_dim)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 30, 2, 9, 100, 1]])
    for layer_type, base in (("main", 10000.0), ("compress", 160000.0)):
        rope = posenc.RotaryEmbedding.from_hf_config(config, layer_type=layer_type)
        assert (rope.dim, rope.base, rope.layout, rope.rotary_slice) == (8, base, "interleaved", "last")
        cos, sin = v4.DeepseekV4RotaryEmbedding(config)(x, positions, layer_type=layer_type)
        torch.testing.assert_close(rope(x, positions=positions)[0], v4.apply_rotary_pos_emb(x, cos, sin),
                                   rtol=0, atol=1e-6)
        torch.testing.assert_close(rope(x, positions=positions, inverse=True)[0],
                                   v4.apply_rotary_pos_emb(x, cos, -sin), rtol=0, atol=1e-6)


def test_deepseek_v4_is_patched_with_every_rotation_on_posenc_and_one_record(caplog):
    """q, the latent KV and the compressed KV, and the inverse rotation of the attention output with
    -sin, all go through posenc's engine (the model's own function is never called), the patched model
    equals the unpatched one, and patch_model logs one record."""
    import logging
    import sys

    from tests import hf_zoo

    model = _deepseek_v4()
    want = hf_zoo.run(model)
    with caplog.at_level(logging.INFO, logger="posenc"):
        patch_model(model)
    records = [r for r in caplog.records if r.name == "posenc"]
    assert len(records) == 1 and "layout='interleaved'" in records[0].getMessage(), [r.getMessage() for r in records]
    adapters = [m.posenc_rope for m in model.modules() if hasattr(m, "posenc_rope")]
    assert {(a.partial, a.any_rows) for a in adapters} == {("last", True)}
    stand_in = sys.modules[type(model.model.rotary_emb).__module__].apply_rotary_pos_emb
    original, calls = stand_in.original, []
    stand_in.original = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        got = hf_zoo.run(model)
    finally:
        stand_in.original = original
    assert not calls
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=hf_zoo.ATOL)
    for a, b in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=hf_zoo.ATOL)
    assert got[2] == want[2]
    unpatch_model(model)


def test_patched_model_under_inference_mode():
    """Inference tensors keep no version counter: the patched model still runs (and equals the unpatched
    one) under torch.inference_mode, through posenc's rotation."""
    cls, make = FAMILIES["llama"]
    torch.manual_seed(0)
    model = cls(make()).eval()
    ids = torch.randint(0, 96, (2, 12))
    with torch.inference_mode():
        want = model(ids).logits
        steps = model.generate(ids, max_new_tokens=4, do_sample=False)
    patch_model(model)
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=1e-5)
        assert torch.equal(model.generate(ids, max_new_tokens=4, do_sample=False), steps)
    unpatch_model(model)


def test_one_record_per_patch_model_call(caplog):
    """A model with a rotary module and a vision tower left as its own still gets one INFO record that says
    both (here: a T5 bias model and a Llama each give exactly one)."""
    import logging

    for name in ("llama", "t5"):
        with caplog.at_level(logging.INFO, logger="posenc"):
            caplog.clear()
            patch_model(_build(name))
        records = [r.getMessage() for r in caplog.records if r.name == "posenc"]
        assert len(records) == 1 and records[0].startswith("patch_model: "), records
