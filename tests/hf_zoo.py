"""Tiny random models of every transformers model type with positions, and the parity check that
``patch_model`` must pass on each (shared by tests/test_hf_sweep.py and scripts/hf_sweep.py).

Nothing is downloaded: each model is built from its default configuration, shrunk generically (2
layers, hidden 64, 4 heads, vocabulary 256, small experts), seeded.  The check compares the patched
model with the unpatched one in float32: the whole prefill, then 8 cached greedy decoding steps
(their logits within 1e-5, max abs, and the same tokens), or a vision encoder's output for one random
image, and after ``unpatch_model`` the outputs must be bit-identical to the unpatched run.  A model in
which nothing was patched (every positional module left as the model's own) counts as refused.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import re
import signal
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

VOCAB = 256
ATOL = 1e-5
STEPS = 8

_LAYERS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_decoder_layers", "encoder_layers",
           "decoder_layers", "num_encoder_layers")
_SIZES = {
    # (the widths of Phi-4's audio convolutions, of Dots3's audio adapter and of Nemotron 3's audio head too)
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "cross_attention_hidden_size",
                     "depthwise_separable_out_channel", "ext_pw_out_channel", "adapter_input_size",
                     "audio_hidden_size"), 64),
    **dict.fromkeys(("intermediate_size", "d_ff", "ffn_dim", "n_inner", "encoder_ffn_dim", "decoder_ffn_dim",
                     "ffn_hidden_size"), 128),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "encoder_num_attention_heads", "decoder_num_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"), 2),
    **dict.fromkeys(("encoder_num_key_value_heads", "decoder_num_key_value_heads"), 4),   # (Moonshine: one per head)
    **dict.fromkeys(("head_dim", "d_kv", "kv_channels", "attention_head_dim"), 16),
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "kv_lora_rank": 16, "q_lora_rank": 32,
    **dict.fromkeys(("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"), 4),
    "num_experts_per_tok": 2, "moe_topk": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    "index_head_dim": 16, "index_n_heads": 4, "vocab_size": VOCAB,
}


#: sizes whose None the model derives from others (or reads as "none"): left as they are
_DERIVED = {"q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "index_head_dim",
            "index_n_heads", "n_group", "topk_group", "first_k_dense_replace", "n_shared_experts",
            "shared_expert_intermediate_size", "moe_intermediate_size"}


def model_types() -> dict[str, list[str]]:
    """Every model type of the installed transformers whose modeling code has a rotary class, ALiBi or a
    T5-style relative bias, with which of the three it has."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

    base = os.path.join(os.path.dirname(transformers.__file__), "models")
    found: dict[str, list[str]] = {}
    for model_type in CONFIG_MAPPING_NAMES:
        folder = os.path.join(base, model_type_to_module_name(model_type))
        if not os.path.isdir(folder):
            continue
        source = "".join(open(os.path.join(folder, f), encoding="utf-8").read() for f in sorted(os.listdir(folder))
                         if f.startswith("modeling_") and f.endswith(".py"))
        kinds = [k for k, hit in (("rotary", re.search(r"class \w*Rotary\w*\(", source)),
                                  ("alibi", "alibi" in source.lower()),
                                  ("t5-bias", "relative_attention_bias" in source)) if hit]
        if kinds:
            found[model_type] = kinds
    return found


def _get(config: Any, name: str) -> Any:
    """A configuration attribute, or None (also where a per-layer configuration refuses a global read)."""
    try:
        return getattr(config, name, None)
    except Exception:                                  # noqa: BLE001 -- transformers' per-layer attributes
        return None


def _shrink(config: Any, seen: set[int]) -> None:
    if id(config) in seen:
        return
    seen.add(id(config))
    own = vars(config)
    # multi-head attention stays multi-head (ESM C's key norm spans all heads): one key head per query head
    mha = isinstance(own.get("num_key_value_heads"), int) and own.get("num_key_value_heads") == own.get(
        "num_attention_heads")
    for name, value in list(vars(config).items()):
        if value is None and name in _SIZES and name not in _DERIVED and hasattr(config, "hidden_size"):
            setattr(config, name, _SIZES[name])        # left for a checkpoint to give (MiniStral's head_dim)
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        if name in _LAYERS and value > 2:
            setattr(config, name, 2)
        elif name in _SIZES and value > _SIZES[name]:
            setattr(config, name, _SIZES[name])
        elif name.endswith("vocab_size") and value > VOCAB:          # a second vocabulary (unpadded, text, audio)
            setattr(config, name, VOCAB)
        elif name.endswith(("_token_id", "_token_index")) and value >= VOCAB - 56:
            setattr(config, name, VOCAB - 56 + (abs(hash(name)) % 50))
    if isinstance(_get(config, "qk_rope_head_dim"), int):
        if _get(config, "head_dim") is not None:
            config.head_dim = config.qk_rope_head_dim                     # MLA: head_dim is the rotary part
        if isinstance(_get(config, "num_key_value_heads"), int):
            config.num_key_value_heads = config.num_attention_heads       # MLA: one key per head
    for name in ("num_experts_per_tok", "moe_k"):
        if name in vars(config) and (getattr(config, name) is None or getattr(config, name) > 2):
            setattr(config, name, 2)
    if isinstance(_get(config, "qk_head_dim"), int):
        config.qk_head_dim = config.qk_rope_head_dim + config.qk_nope_head_dim
    ratio = vars(config).get("pixel_shuffle_ratio")
    if isinstance(ratio, float) and isinstance(vars(config).get("intermediate_size"), int):
        config.intermediate_size = int(config.hidden_size / ratio ** 2)    # Llama 4's vision adapter: the shuffle
    if isinstance(_get(config, "rotary_dim"), int) and config.rotary_dim > 8:
        config.rotary_dim = 8                                             # GPT-J, CodeGen: part of head_dim 16
    _keep_rotary_pairs(config)
    _rederive(config)
    for key in ("rope_parameters", "rope_scaling"):
        params = getattr(config, key, None)
        if not isinstance(params, dict):
            continue
        half = int(_head(config) * float(params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor",
                                                                                 1.0) or 1.0))) // 2
        if isinstance(params.get("mrope_section"), list):
            params["mrope_section"] = _sections(params["mrope_section"], half)
    if mha:
        config.num_key_value_heads = own["num_attention_heads"]
    kv = _get(config, "num_key_value_heads")
    heads = _get(config, "num_attention_heads")
    if isinstance(kv, int) and isinstance(heads, int) and heads % kv:
        config.num_key_value_heads = heads
    types = _get(config, "layer_types")
    layers = next((getattr(config, n) for n in _LAYERS if isinstance(getattr(config, n, None), int)), None)
    if isinstance(types, list) and layers is not None and len(types) != layers:
        distinct = list(dict.fromkeys(types))
        picked = (distinct + types)[:layers] if len(distinct) <= layers else types[:layers]
        config.layer_types = picked
    if layers is not None:
        _keep_attention(config, layers, types)
    blocks = own.get("layers_block_type")
    if isinstance(own.get("hybrid_layer_ids"), list) and isinstance(blocks, list):   # Zamba 2: derived when made
        config.hybrid_layer_ids = [i for i, kind in enumerate(blocks) if kind == "hybrid"]
    if isinstance(own.get("downsample_channels"), list):    # a neck that must end at the shrunk encoder's width
        config.downsample_channels = [min(c, _SIZES["hidden_size"]) for c in own["downsample_channels"]]
    picked = own.get("intermediate_layers_indices")          # layers whose outputs a vision tower keeps (Mllama)
    if layers is not None and isinstance(picked, list) and any(i >= layers for i in picked):
        config.intermediate_layers_indices = list(range(layers))
    for value in list(vars(config).values()):
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):
            _shrink(value, seen)


def _keep_attention(config: Any, layers: int, full: Any) -> None:
    """A hybrid model (attention among recurrent, convolution or linear-attention layers) cut to ``layers``
    layers keeps one attention layer, its last, so that its positions are still used."""
    own = vars(config)
    if isinstance(own.get("attn_layer_indices"), list) and own["attn_layer_indices"]:
        config.attn_layer_indices = [layers - 1]
    blocks = own.get("block_types")
    if isinstance(blocks, (list, tuple)) and "attention" in blocks and len(blocks) > layers:
        config.block_types = [b for b in blocks if b != "attention"][:layers - 1] + ["attention"]
    types = own.get("layer_types")
    attention = [t for t in (full if isinstance(full, list) else [])
                 if isinstance(t, str) and "attention" in t and "linear" not in t]
    if isinstance(types, list) and attention and not any(t in attention for t in types):
        config.layer_types = types[:-1] + [attention[0]]


def _rederive(config: Any) -> None:
    """Sizes a configuration derived from its full-size hidden size when it was made (the Mamba heads of
    Bamba and Granite 4.0-H, Zamba 2's attention and Mamba widths, LayoutLMv3's box embeddings), derived
    again from the shrunk one where they no longer fit it."""
    own = vars(config)
    hidden, expand = own.get("hidden_size"), own.get("mamba_expand")
    if not isinstance(hidden, int) or isinstance(hidden, bool):
        return
    if isinstance(expand, int) and isinstance(own.get("mamba_n_heads"), int) and isinstance(own.get("mamba_d_head"), int):
        inner = own.get("mamba_d_ssm") or expand * hidden
        if own["mamba_n_heads"] * own["mamba_d_head"] != inner:
            config.mamba_n_heads = min(own["mamba_n_heads"], 4)
            config.mamba_d_head = inner // config.mamba_n_heads
    if isinstance(expand, int) and isinstance(own.get("n_mamba_heads"), int) and isinstance(own.get("mamba_headdim"), int) \
            and own["n_mamba_heads"] * own["mamba_headdim"] != expand * hidden:
        config.mamba_headdim = expand * hidden // own["n_mamba_heads"]
    coordinate, shape = own.get("coordinate_size"), own.get("shape_size")
    if isinstance(coordinate, int) and isinstance(shape, int) and 4 * coordinate + 2 * shape != hidden:
        config.coordinate_size = hidden // 8                        # LayoutLMv3: 4 coordinates and 2 sizes
        config.shape_size = (hidden - 4 * config.coordinate_size) // 2   # of a box fill the hidden size
    heads = own.get("num_attention_heads")
    if isinstance(own.get("attention_hidden_size"), int) and own["attention_hidden_size"] > 2 * hidden \
            and isinstance(heads, int):
        config.attention_hidden_size = 2 * hidden
        if isinstance(own.get("attention_head_dim"), int):
            config.attention_head_dim = 2 * hidden // heads


def _give_attention(config: Any, source: str) -> None:
    """A hybrid whose default configuration has no attention layer at all (Bamba, Granite 4.0-H: every layer
    linear) gets one, its last, as their checkpoints have, so that the attention's positions are used; and a
    model that builds a sliding-window mask for every configuration gets a window longer than the sweep's
    sequences (the same mask as none)."""
    own = vars(config)
    for value in list(own.values()):
        if hasattr(value, "to_dict") and hasattr(value, "model_type") and value is not config:
            _give_attention(value, source)
    layers = next((own[n] for n in _LAYERS if isinstance(own.get(n), int)), None)
    if layers is None:
        return
    if "attn_layer_indices" in own and not own["attn_layer_indices"]:
        config.attn_layer_indices = [layers - 1]
    types = own.get("layer_types")
    if isinstance(types, list) and types and all(t == "linear_attention" for t in types) \
            and '"full_attention"' in source:
        config.layer_types = types[:-1] + ["full_attention"]
    if "sliding_window" in own and own["sliding_window"] is None and "create_sliding_window_causal_mask(" in source \
            and '"sliding_attention"' in source:
        config.sliding_window = 4096


def _keep_rotary_pairs(config: Any) -> None:
    """A shrunk head keeps at least 4 rotary pairs: a partial rotary factor meant for a wide head (DeepSeek-V4's
    64 of 512 features, 0.125) would leave none of a 16- or 8-feature head, so such a head becomes 32 features
    of which the last or first 8 rotate (the rest pass through, as in the full-size model)."""
    head = vars(config).get("head_dim")
    if not isinstance(head, int) or isinstance(head, bool):
        return
    factors = [vars(config).get("partial_rotary_factor")]
    for key in ("rope_parameters", "rope_scaling"):
        params = vars(config).get(key)
        if isinstance(params, dict):
            factors += [params.get("partial_rotary_factor")] + [
                v.get("partial_rotary_factor") for v in params.values() if isinstance(v, dict)]
    factors = [f for f in factors if isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f < 1]
    if not factors or int(head * min(factors)) >= 8:
        return
    config.head_dim = 32
    if isinstance(vars(config).get("partial_rotary_factor"), float):
        config.partial_rotary_factor = 0.25
    if isinstance(vars(config).get("qk_rope_head_dim"), int):
        config.qk_rope_head_dim = 8
    for key in ("rope_parameters", "rope_scaling"):
        params = vars(config).get(key)
        if isinstance(params, dict):
            for d in [params] + [v for v in params.values() if isinstance(v, dict)]:
                if "partial_rotary_factor" in d:
                    d["partial_rotary_factor"] = 0.25


def _head(config: Any) -> int:
    """The shrunk head dim (16, unless the shrink set another)."""
    head = vars(config).get("head_dim")
    return head if isinstance(head, int) and not isinstance(head, bool) and head > 0 else 16


def _sections(section: list[int], half: int) -> list[int]:
    """Multimodal RoPE sections scaled to ``half`` frequency slots (head_dim 16); sections equal in the original
    stay equal (ERNIE 4.5-VL pairs its height and width slots), the remainder going to the first one that has
    no equal."""
    total = sum(section)
    out = [max(1, s * half // total) for s in section]
    unique = [i for i, s in enumerate(section) if section.count(s) == 1]
    out[unique[0] if unique else 0] += half - sum(out)
    return out


_HEADS = ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
          "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
          "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "MODEL_MAPPING_NAMES")


def _class_for(model_type: str, config: Any) -> Any:
    """A model class of the modeling module that takes this configuration (types without an auto class,
    such as the text model of a multimodal family)."""
    from transformers import PreTrainedModel

    module = modeling_module(model_type)
    found = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, PreTrainedModel)
             and getattr(c, "config_class", None) is type(config) and c.forward is not torch.nn.Module.forward]
    for suffix in ("ForCausalLM", "ForConditionalGeneration", "Model"):
        for c in found:
            if c.__name__.endswith(suffix):
                return c
    if found:
        return found[0]
    raise LookupError("no model class takes this configuration")


def _mrope_defaults(model_type: str, config: Any, seen: set[int], default: list[int] | None = None) -> None:
    """Multimodal RoPE families whose default configuration leaves the sections to the module (which
    assumes head_dim 128): the module's default sections (``default``, read from its code), scaled to the
    shrunk head."""
    if id(config) in seen:
        return
    seen.add(id(config))
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params and params.get("mrope_section") is None \
            and hasattr(config, "vocab_size"):
        half = int(_head(config) * float(params.get("partial_rotary_factor", 1.0) or 1.0)) // 2
        if half < 4:
            config.head_dim = 32
            half *= 2
        params["mrope_section"] = _sections(default or [4, 2, 2], half)
    for value in list(vars(config).values()):
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):
            _mrope_defaults(model_type, value, seen, default)


def build(model_type: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random float32 model of ``model_type`` (the causal-LM head where there is one)."""
    import transformers
    from transformers.models.auto import modeling_auto

    config = transformers.AutoConfig.for_model(model_type)
    _shrink(config, set())
    source = open(modeling_module(model_type).__file__, encoding="utf-8").read()
    if "mrope_section" in source:
        found = re.search(r"""get\(["']mrope_section["'], \[(\d+), (\d+), (\d+)\]\)""", source)
        _mrope_defaults(model_type, config, set(), [int(v) for v in found.groups()] if found else None)
    _give_attention(config, source)
    if "create_position_ids_from_input_ids(" in source and getattr(config, "pad_token_id", 0) is None:
        config.pad_token_id = 1                  # RoBERTa-style positions count from the padding id (ESM)
    for mapping in _HEADS:
        name = getattr(modeling_auto, mapping).get(model_type)
        if isinstance(name, (tuple, list)):
            name = name[0]
        cls = getattr(transformers, name, None) if name else None
        if cls is not None and cls.forward is not torch.nn.Module.forward:
            break
    else:
        cls = _class_for(model_type, config)
    wants = getattr(cls, "config_class", None)
    if wants is not None and not isinstance(config, wants) and hasattr(config, "get_text_config"):
        config = config.get_text_config()                 # e.g. Llama4ForCausalLM takes the text config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        model = cls(config).eval().float()
    return model


_CHOSEN: weakref.WeakKeyDictionary[torch.nn.Module, Callable[[], dict[str, torch.Tensor]]] = \
    weakref.WeakKeyDictionary()


def _inputs(model: torch.nn.Module, length: int) -> dict[str, torch.Tensor]:
    """Token ids for a text model; for a vision or audio encoder, synthetic inputs of the shapes it takes
    (the first of :func:`_candidates` that the unpatched model runs on, remembered on the model so that the
    patched run gets the same)."""
    chosen = _CHOSEN.get(model)
    if chosen is not None:
        return chosen()
    options = list(_candidates(model, length))
    if not options:
        wanted = _required(model) or [getattr(model, "main_input_name", "input_ids")]
        raise LookupError(f"needs inputs the sweep does not synthesise ({', '.join(wanted)}); not run")
    if len(options) == 1:
        return options[0]()
    errors = []
    # an encoder-decoder reads these inputs in its encoder (the decoder's come in run())
    probe = model.get_encoder() if _encoder_decoder(model) else model
    for make in options:
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                probe(**make())
        except _Timeout:
            raise
        except Exception as e:                          # noqa: BLE001 -- the next shape is tried
            errors.append(e)
            continue
        _CHOSEN[model] = make
        return make()
    raise errors[0]


def _first_widths(model: torch.nn.Module) -> list[int]:
    """The input widths of the first linear and convolution layers (a patch embedding, an audio front end)."""
    widths: list[int] = []
    for kind in (torch.nn.Linear, torch.nn.Conv1d, (torch.nn.Conv2d, torch.nn.Conv3d)):
        layer = next((m for m in model.modules() if isinstance(m, kind)), None)
        if isinstance(layer, torch.nn.Linear):
            widths.append(layer.in_features)
        elif isinstance(layer, torch.nn.Conv1d):
            widths.append(layer.in_channels)
        elif layer is not None:
            widths.append(int(layer.weight[0].numel()))
    return widths


def _vocabulary(model: torch.nn.Module) -> int:
    """Token ids are drawn below 150, or below the input embedding's size where it is smaller (ESM C)."""
    try:
        embedding = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return 150
    size = getattr(embedding, "num_embeddings", None)
    return min(150, size) if isinstance(size, int) and size > 8 else 150


def _required(model: torch.nn.Module, nullable: bool = True) -> list[str]:
    """The forward's arguments without a default (``nullable=False``: less those whose annotation allows
    None, such as Phi-4's audio ``mask``, which the sweep passes as None)."""
    params = inspect.signature(type(model).forward).parameters.values()
    return [p.name for p in params if p.name != "self" and p.default is p.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and (nullable or "None" not in str(p.annotation))]


def _int(config: Any, *names: str, default: int | None = None) -> int | None:
    """The first integer (or the first entry of a list) a configuration or its vision/audio part gives."""
    for part in (config, getattr(config, "vision_config", None), getattr(config, "audio_config", None),
                 getattr(config, "encoder_config", None), getattr(config, "sam_config", None)):
        for name in names:
            value = getattr(part, name, None) if part is not None else None
            if isinstance(value, (list, tuple)) and value:
                value = value[0]
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return default


def _candidates(model: torch.nn.Module, length: int) -> Iterator[Callable[[], dict[str, torch.Tensor]]]:
    """Input makers for ``model``: token ids, or an image (as pixels, or as the flattened patches of a
    ``grid_thw`` of 1 x 4 x 4 patches (a multiple of the spatial merge), or as Pix2Struct's patches led by
    their row and column), or audio features or samples (with their lengths where the model takes them)."""
    name = getattr(model, "main_input_name", "input_ids")
    required = _required(model, nullable=False)
    config = model.config
    first = name if name in required or not required else required[0]
    nones = {n: None for n in set(_required(model)) - set(required) - {first}}

    def seeded(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(*shape, generator=torch.Generator().manual_seed(1))

    if first == "input_ids" and set(required) <= {"input_ids"}:
        top = _vocabulary(model)
        ids = lambda: torch.randint(3, top, (1, length), generator=torch.Generator().manual_seed(1))  # noqa: E731
        if _names(model, "bbox"):       # a document model: a box per token, left to right, as integer
            corners = (torch.arange(length)[:, None] * 20 + torch.tensor([0, 0, 15, 10])).clamp(max=1000)  # (S, 4)
            yield lambda: {"input_ids": ids(), "bbox": corners[None]}             # coordinates (LayoutLM)
            yield lambda: {"input_ids": ids(), "bbox": corners[None] / 1000}      # or in [0, 1] (UDOP)
            return
        yield lambda: {"input_ids": ids(), **nones}
        return
    if first == "inputs_embeds" and set(required) <= {"inputs_embeds"} and _int(config, "hidden_size", "d_model"):
        yield lambda: {"inputs_embeds": seeded((1, length, _int(config, "hidden_size", "d_model"))), **nones}
        return
    if first == "past_values" and set(required) <= {"past_values"}:            # a time series
        yield lambda: {"past_values": seeded((1, 256))}
        return
    patch = _int(config, "patch_size", "spatial_patch_size")
    channels = _int(config, "num_channels", "in_channels", "in_chans", "num_input_channels", default=3)
    temporal = _int(config, "temporal_patch_size", default=1)
    merge = _int(config, "spatial_merge_size", "merge_size", "spatial_merge", default=2)
    mels = _int(config, "num_mel_bins", "feature_size", "n_mels", "input_feat_size", "mel_bins", "num_mels",
                "input_dim", "input_size")
    tiles = _int(config, "max_num_tiles", default=1)
    side = 2 * merge if merge <= 4 else merge                 # patches per side of the grid
    count = side * side
    grid = torch.tensor([[1, side, side]])
    extras = {"grid_thw": lambda: grid, "image_grid_thw": lambda: grid, "merge_sizes": lambda: torch.tensor([merge]),
              "pixel_position_ids": lambda: torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side),
                                                                        indexing="ij"), -1).reshape(1, count, 2),
              "audio_mel_mask": lambda: torch.zeros(1, 64, dtype=torch.bool),
              # 64 frames of audio as waveform samples (Dots3's chunk lengths)
              "chunk_sample_lengths": lambda: torch.tensor([64 * (_int(config, "hop_length") or 160)]),
              # one image of every tile, its aspect ratio the first (Mllama)
              "aspect_ratio_ids": lambda: torch.tensor([[1]]),
              "aspect_ratio_mask": lambda: torch.ones(1, 1, tiles, dtype=torch.long)}
    if not set(required) - {first} <= set(extras):
        return
    widths = _first_widths(model)                            # what the first layer takes
    if first == "flattened_patches" and widths:              # Pix2Struct: row, column, then the patch's pixels
        where = torch.stack(torch.meshgrid(torch.arange(1, side + 1), torch.arange(1, side + 1), indexing="ij"), -1)
        yield lambda: {first: torch.cat([where.reshape(1, count, 2).float(), seeded((1, count, widths[0]))], -1)}
        return
    shapes: list[tuple[int, ...]] = []
    if first in ("pixel_values", "hidden_states", "patch_embeds") and patch:
        flats = dict.fromkeys([channels * temporal * patch * patch, channels * patch * patch] + widths)
        if "grid_thw" in required or "image_grid_thw" in required:
            shapes += [(count, flat) for flat in flats] + [(1, count, flat) for flat in flats]
        else:
            shapes += [(1, count, flat) for flat in flats]
        image = _int(config, "image_size", "img_size")
        if image and image // patch != side:           # a position table for the whole configured image
            shapes += [(1, (image // patch) ** 2, flat) for flat in flats]
        shapes += [(1, channels, side * patch, side * patch), (count, channels, temporal, patch, patch),
                   (count, channels, patch, patch), (1, count, channels, patch, patch)]
    image = _int(config, "image_size", "img_size")
    if first == "pixel_values" and image and "aspect_ratio_ids" in required:
        shapes.append((1, 1, tiles, channels, image, image))
    audio = first in ("input_features", "audio_mel") or (first == "hidden_states" and not patch and mels)
    lengths: dict[str, Callable[[], torch.Tensor]] = {}
    if first == "pixel_values" and image:                    # models whose position table fixes the image size
        shapes.append((1, channels, image, image))
    elif audio:
        for width in dict.fromkeys(([mels] if mels else []) + widths + [128, 80]):   # (the usual mel counts)
            shapes += [(1, width, 64), (1, 64, width)]
        shapes += [(1, mels or 128, 3000)]
        if _names(model, "feature_lens") and mels:           # (Qwen-Omni: the clips' frames side by side)
            shapes.insert(0, (mels, 64))
            lengths = {"feature_lens": lambda: torch.tensor([64])}
    elif first == "input_values":
        shapes += [(1, 3200), (1, 1, 3200)]
    for shape in shapes:
        yield lambda shape=shape: {first: seeded(shape), **nones, **{k: extras[k]() for k in required if k != first},
                                   **({k: make() for k, make in lengths.items()} if len(shape) == 2 else {})}
    optional = [k for k in ("grid_thw", "image_grid_thw") if k not in required and _names(model, k)]
    for shape in shapes if optional and first == "pixel_values" else []:     # then with the patch grid it
        yield lambda shape=shape: {first: seeded(shape), **nones, optional[0]: grid}   # may take (PaddleOCR-VL)


#: whether a model's own cache works, found on its first (unpatched) run; where it fails in transformers
#: (HRM-Text's decode step indexes a cache layer it did not make), that run and the later ones compare the
#: prefill without a cache
_CACHE_WORKS: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()


def run(model: torch.nn.Module, steps: int = STEPS, length: int = 24) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
    """The prefill output, and the logits and tokens of ``steps`` cached greedy steps (none for models
    without a cache or logits)."""
    inputs = _inputs(model, length)
    enc_dec = _encoder_decoder(model)
    if enc_dec and ("input_ids" in inputs or _takes(model, "decoder_input_ids")):
        # text to text, or speech to text (Moonshine: the encoder reads the audio); the decoder starts
        # from 7 token ids and continues greedily against the encoder's output
        ids = inputs["input_ids"] if "input_ids" in inputs else torch.randint(
            3, _vocabulary(model), (1, 7), generator=torch.Generator().manual_seed(1))
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enc = model.get_encoder()(**inputs)
            out = model(encoder_outputs=enc, decoder_input_ids=ids[:, :7], use_cache=True)
            return _greedy(out, steps, lambda nxt, cache: model(encoder_outputs=enc, decoder_input_ids=nxt,
                                                                 past_key_values=cache, use_cache=True))
    if "input_ids" not in inputs:                       # a vision encoder: its output, no decoding
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model(**inputs)
        first = out[0] if isinstance(out, (tuple, list)) or hasattr(out, "to_tuple") else out
        return first.detach().clone(), [], []
    ids = inputs["input_ids"]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not _takes(model, "use_cache"):
            return _greedy(model(input_ids=ids), steps, lambda nxt, cache: None)
        if _CACHE_WORKS.get(model) is False:
            return _greedy(model(input_ids=ids, use_cache=False), 0, lambda nxt, cache: None)
        try:
            out = model(input_ids=ids, use_cache=True)
            result = _greedy(out, steps, lambda nxt, cache: model(input_ids=nxt, past_key_values=cache,
                                                                   use_cache=True))
        except _Timeout:
            raise
        except Exception:                               # noqa: BLE001 -- decided on the first (unpatched) run
            if model in _CACHE_WORKS:
                raise
            _CACHE_WORKS[model] = False
            return _greedy(model(input_ids=ids, use_cache=False), 0, lambda nxt, cache: None)
        _CACHE_WORKS[model] = True
        return result


def _encoder_decoder(model: torch.nn.Module) -> bool:
    """An encoder and a decoder: said by the configuration, or by a forward that takes decoder inputs
    (Pix2Struct, whose top-level configuration does not say)."""
    return bool(getattr(model.config, "is_encoder_decoder", False)) or (
        _names(model, "decoder_input_ids") and hasattr(model, "get_encoder"))


def _greedy(out: Any, steps: int, step: Callable[[torch.Tensor, Any], Any]
            ) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
    """The prefill output ``out``'s logits (or first output), then ``steps`` cached greedy steps."""
    first = getattr(out, "logits", None)
    if first is None:
        first = out[0]
    prefill = first.detach().clone()
    logits: list[torch.Tensor] = []
    tokens: list[int] = []
    if getattr(out, "logits", None) is None or getattr(out, "past_key_values", None) is None:
        return prefill, logits, tokens
    for _ in range(steps):
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(int(nxt))
        out = step(nxt, out.past_key_values)
        logits.append(out.logits[:, -1].detach().clone())
    return prefill, logits, tokens


def _takes(model: torch.nn.Module, name: str) -> bool:
    """The forward names this argument or takes any keyword."""
    params = inspect.signature(type(model).forward).parameters.values()
    return _names(model, name) or any(p.kind == p.VAR_KEYWORD for p in params)


def _names(model: torch.nn.Module, name: str) -> bool:
    """The forward names this argument (not only takes any keyword, as :func:`_takes` also accepts)."""
    return name in inspect.signature(type(model).forward).parameters


def _diff(a: Any, b: Any) -> float:
    if isinstance(a, torch.Tensor):
        if a.shape != b.shape:
            return float("inf")
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    return max((_diff(x, y) for x, y in zip(a, b, strict=True)), default=0.0)


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def check(model_type: str, timeout: int = 180) -> dict[str, Any]:
    """Build, run unpatched, patch, run, unpatch, run: the sweep's record for one model type.

    ``status`` is ``"equal"`` (accepted and equal), ``"different"`` (accepted but not equal: a bug),
    ``"refused"`` (patch_model raised, with its reason), ``"no positions"`` (the tiny model of the type's
    default configuration holds no positional module at all: its rotary class serves another part or another
    configuration, so there is nothing to patch), ``"not built"`` or ``"not run"`` (the tiny
    model could not be built or run unpatched on CPU, with the reason), or ``"error"`` (something
    else went wrong after patching)."""
    from posenc.integrations.transformers import is_patched, patch_model, unpatch_model

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    record: dict[str, Any] = {"model_type": model_type}
    try:
        try:
            model = build(model_type)
        except _Timeout:
            raise
        except Exception as e:                         # noqa: BLE001 -- recorded, not raised
            return {**record, "status": "not built", "reason": _reason(e)}
        record["class"] = type(model).__name__
        try:
            ref = run(model)
        except _Timeout:
            raise
        except Exception as e:                         # noqa: BLE001
            return {**record, "status": "not run", "reason": _reason(e)}
        said, log = _Said(), logging.getLogger("posenc")
        level = log.level
        log.addHandler(said)
        log.setLevel(logging.INFO)
        try:
            patch_model(model)
        except _Timeout:
            raise
        except Exception as e:                         # noqa: BLE001
            if not _positional_modules(model):
                return {**record, "status": "no positions", "reason": "this default configuration builds no "
                        "rotary, ALiBi or relative-bias module (nothing to patch): " + _reason(e)}
            return {**record, "status": "refused", "reason": _reason(e)}
        finally:
            log.removeHandler(said)
            log.setLevel(level)
        record["patched"] = sorted({v.kind for m in model.modules() for k, v in vars(m).items()
                                    if k == "_posenc_patch"})
        if not record["patched"]:                      # every positional module left as the model's own
            return {**record, "status": "refused", "reason": "nothing patched: " + " ".join(said.messages)}
        record.update(layouts(model))
        try:
            got = run(model)
        except _Timeout:
            raise
        except Exception as e:                         # noqa: BLE001
            return {**record, "status": "error", "reason": "patched model failed: " + _reason(e)}
        prefill, steps = _diff(got[0], ref[0]), _diff(got[1], ref[1])
        record.update(prefill_diff=prefill, steps_diff=steps, steps=len(ref[1]), tokens_equal=got[2] == ref[2])
        unpatch_model(model)
        again = run(model)
        restored = not is_patched(model) and torch.equal(again[0], ref[0]) and \
            all(torch.equal(a, b) for a, b in zip(again[1], ref[1], strict=True)) and again[2] == ref[2]
        record["restored"] = restored
        record["audit"] = audit(model)
        ok = prefill <= ATOL and steps <= ATOL and got[2] == ref[2] and restored
        record["status"] = "equal" if ok else "different"
        return record
    except _Timeout:
        return {**record, "status": "not run", "reason": f"took longer than {timeout} s on CPU"}
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def audit(model: torch.nn.Module) -> str:
    """``posenc.testing.audit_hf`` of the (unpatched) model in a word: ``"agrees"`` (every rotary module it
    could call computes what the config says), ``"differs: ..."`` or ``"not compared: ..."`` (no rotary
    module it could call: vision encoders fed patch grids, attention-bias models)."""
    from posenc.testing import audit_hf

    report = audit_hf(model, max_position=512)
    verdicts = [m.agrees for m in report.modules]
    if any(v is False for v in verdicts):
        return "differs: " + "; ".join(d for m in report.modules for d in m.differences)
    if any(verdicts):
        return "agrees"
    return "not compared: " + ("; ".join(m.summary for m in report.modules) or "; ".join(report.notes))


def _positional_modules(model: torch.nn.Module) -> list[str]:
    """The modules of ``model`` that look like position rules (a class named rotary/RoPE/ALiBi, or a relative
    attention bias, as a module or a parameter: ``relative_attention_bias``, LayoutLM's ``rel_pos_bias``,
    CPM-Ant's), whatever contract they follow."""
    from posenc.integrations.transformers._patch import _RELATIVE_BIAS

    return [name for name, m in model.named_modules()
            if re.search(r"rotary|rope|alibi", type(m).__name__, re.I)
            or any(_RELATIVE_BIAS.match(child) for child in [*m._modules, *m._parameters])]


class _Said(logging.Handler):
    """The messages posenc logs while a model is patched (what it left as the model's own, and why)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def layouts(model: torch.nn.Module) -> dict[str, Any]:
    """The pair layouts of a patched model: found from its rotate function, and read from its config."""
    from posenc.core import hf_config

    adapters = [m.posenc_rope for m in model.modules() if "posenc_rope" in m._modules
                and hasattr(m.posenc_rope, "layout")]
    found = sorted({str(a.layout) for a in adapters})
    #: who rotates q and k: posenc's engine (its dtypes bit for bit as the model's code) or the model's code
    rotation = sorted({"posenc" if getattr(a, "fast", None) else "model" for a in adapters})
    try:
        config = hf_config.rope_layout_from_hf(model.config.get_text_config())
    except Exception as e:                             # noqa: BLE001 -- recorded
        config = f"unreadable ({type(e).__name__})"
    return {"layout": found, "layout_config": config, "rotation": rotation} if found else {}


def _reason(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) < 400 else text[:397] + "..."


def modeling_module(model_type: str) -> Any:
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    name = model_type_to_module_name(model_type)
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")
