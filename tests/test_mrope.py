"""Multimodal RoPE (Qwen2-VL / Qwen2.5-VL M-RoPE): the float64 oracle written from the paper's rule
(tests/reference/grid_oracle.py), transformers' own rotary classes, ``get_rope_index`` and whole tiny
models (random weights, built from configs: no downloads)."""

import math
import os
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")   # before Triton decorates the kernel (as test_triton_rope)

import numpy as np
import pytest
import torch

from posenc.core import hf_config as core_hf_config
from posenc.core import mrope as core_mrope
from posenc.core.rope import DynamicNTKScaling, LinearScaling
from posenc.functional.mrope import mrope_cos_sin, mrope_positions
from posenc.nn.mrope import MultimodalRotaryEmbedding
from posenc.nn.rotary import RotaryEmbedding
from tests.reference.grid_oracle import mrope_axes, mrope_rotate

EPS32 = float(np.finfo(np.float32).eps)


# ---- tolerance against the float64 oracle (slot j turns by p_axis(j) * base^(-2j/dim)) ---------------

def _tol(x):
    """0.5 ulp of the result plus 2 eps (|x1| + |x2|): bound by the largest input magnitude."""
    return 4 * EPS32 * float(np.abs(x).max()) + 1e-7


# ---- core ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dim,section,interleaved", [
    (12, [2, 2, 2], False), (12, [1, 3, 2], False), (128, [16, 24, 24], False), (128, [24, 20, 20], True),
    (12, [2, 2, 2], True), (8, [4, 0, 0], False),
])
def test_axis_plan_follows_the_rule(dim, section, interleaved):
    plan = core_mrope.mrope_axis_plan(dim, section, interleaved=interleaved)
    assert plan.tolist() == mrope_axes(dim, section, interleaved)
    assert [int((plan == a).sum()) for a in range(3)] == section


@pytest.mark.parametrize("section,match", [
    ([2, 2, 3], "sums to 7"), ([2, 2], "three"), ("abc", "three"), ([3, -1, 4], ">= 0"), ([2.0, 2, 2], "int"),
])
def test_bad_sections_raise(section, match):
    with pytest.raises((ValueError, TypeError), match=match):
        core_mrope.check_mrope_section(section, 12)
    with pytest.raises((ValueError, TypeError), match=match):
        MultimodalRotaryEmbedding(12, section)


def test_interleaved_sections_that_do_not_fit_raise():
    with pytest.raises(ValueError, match="does not fit"):
        core_mrope.mrope_axis_plan(12, [0, 0, 6], interleaved=True)


# ---- the module against the oracle ---------------------------------------------------------------------

CASES = [
    # dim, head_dim, section, interleaved, layout
    (16, 16, [2, 3, 3], False, "half"),
    (16, 20, [4, 2, 2], False, "interleaved"),      # partial rotary: 4 features pass through
    (18, 18, [3, 3, 3], True, "half"),
]


@pytest.mark.parametrize("dim,head_dim,section,interleaved,layout", CASES)
@pytest.mark.parametrize("where", ["table", "past-table", pytest.param("float64", marks=pytest.mark.float64)])
@pytest.mark.parametrize("seq_dim", [-2, 1])
def test_module_matches_the_float64_oracle(dim, head_dim, section, interleaved, layout, where, seq_dim):
    g = torch.Generator().manual_seed(3)
    B, H, S = 2, 3, 7
    q = torch.randn(B, H, S, head_dim, generator=g)
    k = torch.randn(B, 1, S, head_dim, generator=g)
    hi = 60 if where != "past-table" else 70000
    pos = torch.randint(0, hi, (B, S, 3), generator=g)                  # axes t, h, w last
    dtype = torch.float64 if where == "float64" else torch.float32
    m = MultimodalRotaryEmbedding(dim, section, max_seq_len=64, base=500.0, mrope_interleaved=interleaved,
                                  layout=layout)
    qi, ki = q.to(dtype), k.to(dtype)
    if seq_dim == 1:
        qi, ki = qi.transpose(1, 2), ki.transpose(1, 2)
    qr, kr = m(qi, ki, positions=pos, seq_dim=seq_dim)
    if seq_dim == 1:
        qr, kr = qr.transpose(1, 2), kr.transpose(1, 2)
    assert qr.dtype == kr.dtype == dtype
    for got, x in ((qr, q), (kr, k)):
        want = mrope_rotate(x.double().numpy(), pos.numpy(), dim, section, 500.0, interleaved=interleaved,
                             layout=layout)
        tol = 1e-12 if dtype == torch.float64 else _tol(x.numpy())
        np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=tol)


def test_shared_positions_s_by_3_equal_per_row_positions():
    m = MultimodalRotaryEmbedding(16, [2, 3, 3])
    q = torch.randn(2, 2, 5, 16)
    pos = torch.tensor([[0, 0, 0], [1, 1, 1], [2, 2, 3], [2, 3, 2], [5, 5, 5]])       # (S, 3)
    torch.testing.assert_close(m(q, positions=pos)[0], m(q, positions=pos[None].expand(2, 5, 3))[0], rtol=0, atol=0)


def test_cos_sin_rows_are_exact_and_pick_each_slots_axis():
    m = MultimodalRotaryEmbedding(12, [1, 2, 3], max_seq_len=16, base=10000.0)
    pos = torch.tensor([[3, 7, 11], [40000, 5, 2**31 - 1]])               # (S, 3): in and past the table
    cos, sin = m.cos_sin(pos)
    axes = mrope_axes(12, [1, 2, 3], False)
    for s in range(2):
        for j in range(6):
            ang = int(pos[s, axes[j]]) * math.pow(10000.0, -2 * j / 12)
            # within one float32 ulp of the true value (float64 math is far more accurate than that here,
            # except for the 2**31 angle, where float64 itself is off by ~2e-7 rad)
            tol = 1.2e-7 if int(pos[s, axes[j]]) < 2**20 else 5e-7
            assert abs(float(cos[s, j]) - math.cos(ang)) <= tol
            assert abs(float(sin[s, j]) - math.sin(ang)) <= tol
    fc, fs = mrope_cos_sin(pos, m.inv_freq, [1, 2, 3])
    torch.testing.assert_close(fc, cos, rtol=0, atol=1.2e-7)
    torch.testing.assert_close(fs, sin, rtol=0, atol=1.2e-7)


def test_text_only_positions_equal_ordinary_rope():
    m = MultimodalRotaryEmbedding(16, [2, 3, 3], max_seq_len=32, base=1e6)
    rope = RotaryEmbedding(16, max_seq_len=32, base=1e6)
    q, k = torch.randn(2, 4, 9, 16), torch.randn(2, 2, 9, 16)
    text = torch.tensor([[0, 0, 0, 1, 2, 3, 4, 5, 6], list(range(30, 39))])          # in and past the table
    got = m(q, k, positions=text[..., None].expand(-1, -1, 3))
    want = rope(q, k, positions=text)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-7)
    for a, b in zip(m(q, k, offset=5), rope(q, k, offset=5), strict=True):         # default text positions
        torch.testing.assert_close(a, b, rtol=0, atol=2e-7)


@pytest.mark.float64
def test_bfloat16_keeps_float32_tables_and_autocast_changes_nothing():
    m = MultimodalRotaryEmbedding(16, [2, 3, 3], max_seq_len=300).to(torch.bfloat16)
    assert m.cos_table.dtype == torch.float32 and m.turns_by_axis.dtype == torch.float64
    pos = torch.tensor([[255, 256, 1], [256, 257, 2], [257, 258, 299]])          # (S, 3): t, h, w per token
    c, s = m.cos_sin(pos)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c2, s2 = m.cos_sin(pos)
    assert torch.equal(c, c2) and torch.equal(s, s2)
    assert not torch.equal(c[0], c[1])                                  # 256 and 257 stay distinct
    q = torch.randn(1, 2, 3, 16, dtype=torch.bfloat16)
    out = m(q, positions=pos)[0]
    assert out.dtype == torch.bfloat16
    want = mrope_rotate(q.double().numpy(), pos[None].numpy(), 16, [2, 3, 3], 10000.0)
    np.testing.assert_allclose(out.double().numpy(), want, rtol=0, atol=0.02)   # bf16 rounding of the output


def test_meta_device_state_dict_and_inplace():
    m = MultimodalRotaryEmbedding(16, [2, 3, 3], device="meta")
    m = m.to_empty(device="cpu")
    m.reset_buffers()
    ref = MultimodalRotaryEmbedding(16, [2, 3, 3])
    assert m.state_dict() == {} and torch.equal(m.cos_table, ref.cos_table)
    q, k = torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16)
    pos = torch.tensor([[0, 0, 0], [1, 1, 2], [1, 2, 1], [9, 9, 9]])             # (S, 3)
    want = ref(q, k, positions=pos)
    qi, ki = q.clone(), k.clone()
    got = m(qi, ki, positions=pos, inplace=True)
    assert got[0] is qi and got[1] is ki
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.float64
def test_gradients_are_the_transposed_rotation():
    m = MultimodalRotaryEmbedding(8, [2, 1, 1])
    pos = torch.tensor([[1, 2, 3], [4, 5, 6], [9, 3, 7]])                        # (S, 3)
    x = torch.randn(1, 1, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: m(t, positions=pos)[0], (x,))


def test_assume_valid_matches_and_a_broken_promise_raises():
    m = MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=16)
    q = torch.randn(1, 1, 3, 8)
    pos = torch.tensor([[1, 2, 3], [4, 5, 6], [9, 3, 7]])                        # (S, 3)
    torch.testing.assert_close(m(q, positions=pos, assume_valid=True), m(q, positions=pos), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"promised to with assume_valid=True"):
        m(q, positions=pos + 100, assume_valid=True)


@pytest.mark.parametrize("positions,match", [
    (torch.arange(4), r"\(S, 3\) or \(B, S, 3\), axes t, h, w last"),
    (torch.zeros(2, 4, 4, dtype=torch.long), r"positions\[\.\.\., 1:\]"),
    (torch.zeros(3, 4, 3, dtype=torch.long), "B=2"),
    (torch.zeros(2, 5, 3, dtype=torch.long), "S=4"),
    (torch.zeros(2, 4, 3), "integers"),
])
def test_bad_positions_raise(positions, match):
    m = MultimodalRotaryEmbedding(8, [2, 1, 1])
    with pytest.raises((ValueError, TypeError), match=match):
        m(torch.randn(2, 1, 4, 8), positions=positions)


def test_bad_module_arguments_raise():
    with pytest.raises(ValueError, match="sequence length"):
        MultimodalRotaryEmbedding(8, [2, 1, 1], scaling=DynamicNTKScaling(2.0, 16))
    with pytest.raises(ValueError, match="even"):
        MultimodalRotaryEmbedding(9, [2, 1, 1])
    with pytest.raises(TypeError, match="bool"):
        MultimodalRotaryEmbedding(8, [2, 1, 1], mrope_interleaved="yes")
    with pytest.raises(ValueError, match="not both"):
        MultimodalRotaryEmbedding(8, [2, 1, 1])(torch.randn(1, 1, 2, 8), positions=torch.zeros(2, 3, dtype=torch.long),
                                                offset=3)


def test_linear_scaling_divides_every_axis_position():
    m = MultimodalRotaryEmbedding(8, [2, 1, 1], scaling=LinearScaling(4.0))
    plain = MultimodalRotaryEmbedding(8, [2, 1, 1])
    pos = torch.tensor([[4, 12, 20], [8, 16, 0]])                                # (S, 3)
    torch.testing.assert_close(m.cos_sin(pos), plain.cos_sin(pos // 4), rtol=0, atol=1e-7)


# ---- transformers ---------------------------------------------------------------------------------------
# The tests that build transformers' Qwen2-VL / Qwen2.5-VL classes skip one by one (needs_qwen_vl) when
# transformers, or its Qwen2-VL / Qwen2.5-VL models, are missing; the rest of this file runs without it.

try:
    import transformers
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl
    from transformers.models.qwen2_vl import modeling_qwen2_vl

    from posenc.integrations.transformers import patch_model, unpatch_model
except ImportError:
    transformers = None
HAS_QWEN_VL = hasattr(transformers, "Qwen2VLConfig") and hasattr(transformers, "Qwen2_5_VLConfig")
needs_qwen_vl = pytest.mark.skipif(
    not HAS_QWEN_VL, reason="needs transformers with Qwen2-VL / Qwen2.5-VL (pip install transformers)")

IMAGE, VIDEO = 90, 91
SECTION = [2, 3, 3]                     # head_dim 16: 8 slots
TEXT = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, bos_token_id=0, eos_token_id=1, pad_token_id=0,
            rope_parameters={"rope_type": "default", "mrope_section": SECTION, "rope_theta": 10000.0})
VISION = {
    "qwen2_vl": dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, patch_size=2),
    "qwen2_5_vl": dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=2,
                       tokens_per_second=2, fullatt_block_indexes=[0], window_size=8),
}
FAMILIES = ("qwen2_vl", "qwen2_5_vl")
FAMILY = {"qwen2_vl": (transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration, modeling_qwen2_vl),
          "qwen2_5_vl": (transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration,
                         modeling_qwen2_5_vl)} if HAS_QWEN_VL else {}


def _config(family):
    cls = FAMILY[family][0]
    return cls(text_config=dict(TEXT), vision_config=dict(VISION[family]), image_token_id=IMAGE, video_token_id=VIDEO,
               vision_start_token_id=92, vision_end_token_id=93)


@pytest.fixture(scope="module")
def models():
    built = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for family in FAMILY:
            torch.manual_seed(0)
            built[family] = FAMILY[family][1](_config(family)).eval()
    return built


def _prompt(rows, grids):
    """Left-padded ``(input_ids, mm_token_type_ids, attention_mask)`` from rows of ``(kind, count)``
    parts; an image/video part of count None takes its token count from the next grid."""
    grids = {k: list(v) for k, v in grids.items()}
    ids, types = [], []
    g = torch.Generator().manual_seed(5)
    for parts in rows:
        r_ids, r_types = [], []
        for kind, n in parts:
            if kind == "text":
                r_ids += torch.randint(2, 89, (n,), generator=g).tolist()
                r_types += [0] * n
            else:
                t, h, w = grids[kind].pop(0)
                n = t * (h // 2) * (w // 2)
                r_ids += [IMAGE if kind == "image" else VIDEO] * n
                r_types += [1 if kind == "image" else 2] * n
        ids.append(r_ids)
        types.append(r_types)
    length = max(map(len, ids))
    pad = lambda r: [0] * (length - len(r)) + r                                       # noqa: E731
    return (torch.tensor([pad(r) for r in ids]), torch.tensor([pad(r) for r in types]),
            torch.tensor([pad([1] * len(r)) for r in ids]))


T, IM, V = "text", "image", "video"
PROMPTS = {
    "mixed": ([[(T, 3), (IM, 0), (T, 2), (V, 0), (T, 4)], [(T, 2), (V, 0), (T, 3), (IM, 0), (T, 1)]],
              {IM: [[1, 4, 6], [1, 2, 4]], V: [[3, 4, 4], [2, 6, 2]]}),
    "images-only": ([[(T, 1), (IM, 0), (T, 1), (IM, 0), (T, 2)], [(T, 5)]], {IM: [[1, 6, 4], [1, 2, 2]]}),
    "video-only": ([[(T, 2), (V, 0), (T, 3)]], {V: [[4, 4, 6]]}),
    "several-images": ([[(IM, 0), (T, 1), (IM, 0), (T, 1), (IM, 0)], [(T, 2), (IM, 0), (T, 2)]],
                       {IM: [[1, 2, 2], [1, 4, 2], [1, 2, 8], [1, 6, 6]]}),
    "text-only": ([[(T, 6)], [(T, 3)]], {}),
}


def _grid(grids, kind):
    return torch.tensor(grids[kind]) if grids.get(kind) else None


def _hf_positions(model, family, ids, types, mask, grids, seconds):
    kwargs = {"second_per_grid_ts": seconds} if family == "qwen2_5_vl" else {}
    return model.model.get_rope_index(ids, types, _grid(grids, IM), _grid(grids, V), attention_mask=mask, **kwargs)


@needs_qwen_vl
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("masked", [True, False])
def test_positions_equal_get_rope_index(models, family, prompt, masked):
    rows, grids = PROMPTS[prompt]
    if not masked:                                                   # the first row alone, no attention mask
        rows = rows[:1]
        grids = {kind: g[:sum(part[0] == kind for part in rows[0])] for kind, g in grids.items()}
    ids, types, mask = _prompt(rows, grids)
    if not masked:
        mask = None
    n_videos = len(grids.get(V, []))
    seconds = torch.tensor([0.5, 1.7][:n_videos]) if n_videos and family == "qwen2_5_vl" else None
    want, want_delta = _hf_positions(models[family], family, ids, types, mask, grids, seconds)
    vision = core_hf_config.mrope_vision_from_hf(models[family].config)
    got, delta = mrope_positions(ids, mm_token_type_ids=types, image_grid_thw=_grid(grids, IM),
                                 video_grid_thw=_grid(grids, V), attention_mask=mask, second_per_grid_ts=seconds,
                                 **vision)
    valid = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    want = want.movedim(0, -1)                                       # transformers: (3, B, S); posenc: (B, S, 3)
    assert got.shape == want.shape
    assert torch.equal(got[valid], want[valid])
    assert torch.equal(delta, want_delta.long())
    by_ids, _ = mrope_positions(ids, image_token_id=IMAGE, video_token_id=VIDEO, image_grid_thw=_grid(grids, IM),
                                video_grid_thw=_grid(grids, V), attention_mask=mask, second_per_grid_ts=seconds,
                                **vision)
    assert torch.equal(by_ids[valid], want[valid])


@needs_qwen_vl
def test_qwen2_5_videos_default_to_one_second_per_grid(models):
    rows, grids = PROMPTS["video-only"]
    ids, types, mask = _prompt(rows, grids)
    want, _ = _hf_positions(models["qwen2_5_vl"], "qwen2_5_vl", ids, types, mask, grids, None)
    got, _ = mrope_positions(ids, mm_token_type_ids=types, video_grid_thw=_grid(grids, V), tokens_per_second=2)
    assert torch.equal(got, want.movedim(0, -1))                     # transformers: (3, B, S); posenc: (B, S, 3)
    assert got[0, :, 0].unique().tolist()[:4] == [0, 1, 2, 4]           # text, then frames 0, 2, 4, 6 seconds apart


def test_positions_bad_inputs_raise():
    ids, types, mask = _prompt(*PROMPTS["mixed"])
    grids = PROMPTS["mixed"][1]
    img, vid = _grid(grids, IM), _grid(grids, V)
    with pytest.raises(ValueError, match="image_grid_thw has only 0"):
        mrope_positions(ids, mm_token_type_ids=types, video_grid_thw=vid, attention_mask=mask)
    with pytest.raises(ValueError, match="image_grid_thw has 3 grid"):
        mrope_positions(ids, mm_token_type_ids=types, image_grid_thw=torch.cat([img, img[:1]]), video_grid_thw=vid,
                        attention_mask=mask)
    with pytest.raises(ValueError, match="does not match"):
        mrope_positions(ids, mm_token_type_ids=types, image_grid_thw=img * torch.tensor([1, 2, 1]), video_grid_thw=vid,
                        attention_mask=mask)
    with pytest.raises(ValueError, match="multiples of spatial_merge_size"):
        mrope_positions(ids, mm_token_type_ids=types, image_grid_thw=img + torch.tensor([0, 1, 0]),
                        video_grid_thw=vid, attention_mask=mask)
    with pytest.raises(ValueError, match="tokens_per_second"):
        mrope_positions(ids, mm_token_type_ids=types, image_grid_thw=img, video_grid_thw=vid,
                        second_per_grid_ts=torch.ones(2))
    with pytest.raises(ValueError, match="0 \\(text\\), 1 \\(image\\) or 2"):
        mrope_positions(ids, mm_token_type_ids=torch.where(types == 0, 3, types), image_grid_thw=img,
                        video_grid_thw=vid)
    with pytest.raises(ValueError, match=r"\(B, S\)"):
        mrope_positions(ids[0], mm_token_type_ids=types[0])
    with pytest.raises(ValueError, match="attention_mask"):
        mrope_positions(ids, mm_token_type_ids=types, attention_mask=mask[:, 1:], image_grid_thw=img,
                        video_grid_thw=vid)


@needs_qwen_vl
@pytest.mark.parametrize("family", FAMILIES)
def test_rotation_equals_transformers_rotary_and_apply(models, family):
    """transformers' own cos/sin (its text rotary class) and rotation on get_rope_index positions of a
    left-padded mixed prompt, against the module; valid tokens only."""
    rows, grids = PROMPTS["mixed"]
    ids, types, mask = _prompt(rows, grids)
    seconds = torch.tensor([0.5, 1.7]) if family == "qwen2_5_vl" else None
    pos, _ = _hf_positions(models[family], family, ids, types, mask, grids, seconds)
    text_config = models[family].config.text_config
    hf_rotary = getattr(FAMILY[family][2], ("Qwen2VL" if family == "qwen2_vl" else "Qwen2_5_VL") + "RotaryEmbedding")
    B, S = ids.shape
    q, k = torch.randn(B, 4, S, 16), torch.randn(B, 2, S, 16)
    cos, sin = hf_rotary(text_config)(q, pos)
    want_q, want_k = FAMILY[family][2].apply_rotary_pos_emb(q, k, cos, sin)
    m = MultimodalRotaryEmbedding.from_hf_config(models[family].config)
    got_q, got_k = m(q, k, positions=pos.movedim(0, -1))             # transformers' (3, B, S) to (B, S, 3)
    valid = mask.bool()
    # transformers computes the angles in float32: a few float32 ulps of these small angles
    torch.testing.assert_close(got_q.transpose(1, 2)[valid], want_q.transpose(1, 2)[valid], rtol=0, atol=1e-5)
    torch.testing.assert_close(got_k.transpose(1, 2)[valid], want_k.transpose(1, 2)[valid], rtol=0, atol=1e-5)
    oracle = mrope_rotate(q.double().numpy(), pos.movedim(0, -1).numpy(), 16, SECTION, 10000.0)
    np.testing.assert_allclose(got_q.double().numpy()[valid.numpy().nonzero()[0], :, valid.numpy().nonzero()[1]],
                               oracle[valid.numpy().nonzero()[0], :, valid.numpy().nonzero()[1]], rtol=0,
                               atol=_tol(q.numpy()))


@needs_qwen_vl
@pytest.mark.skipif(not hasattr(transformers, "Qwen3VLTextConfig"), reason="this transformers has no Qwen3-VL")
def test_interleaved_sections_equal_qwen3_vl_rotary():
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    cfg = transformers.Qwen3VLTextConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=18,
                                         num_hidden_layers=1, intermediate_size=64, vocab_size=96,
                                         rope_parameters={"rope_type": "default", "rope_theta": 5000.0,
                                                          "mrope_section": [3, 3, 3], "mrope_interleaved": True})
    pos = torch.randint(0, 50, (3, 2, 6), generator=torch.Generator().manual_seed(4))
    cos, sin = modeling_qwen3_vl.Qwen3VLTextRotaryEmbedding(cfg)(torch.zeros(1, dtype=torch.float32), pos)
    m = MultimodalRotaryEmbedding.from_hf_config(cfg)
    assert m.mrope_interleaved and m.mrope_section == (3, 3, 3)
    c, s = m.cos_sin(pos.movedim(0, -1))                             # transformers' (3, B, S) to (B, S, 3)
    torch.testing.assert_close(torch.cat([c, c], -1), cos, rtol=0, atol=2e-6)
    torch.testing.assert_close(torch.cat([s, s], -1), sin, rtol=0, atol=2e-6)


# ---- configs -------------------------------------------------------------------------------------------

QWEN2_VL_V4_JSON = {"model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28, "rope_theta": 1e6,
                    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
                    "vision_config": {"spatial_merge_size": 2}}
QWEN2_5_VL_V4_JSON = {"model_type": "qwen2_5_vl", "hidden_size": 2048, "num_attention_heads": 16, "rope_theta": 1e6,
                      "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
                      "vision_config": {"spatial_merge_size": 2, "tokens_per_second": 2}}


@pytest.mark.parametrize("config,want", [
    (QWEN2_VL_V4_JSON, (1e6, 128, None, (16, 24, 24), False)),
    (QWEN2_5_VL_V4_JSON, (1e6, 128, None, (16, 24, 24), False)),
    ({**QWEN2_VL_V4_JSON, "rope_scaling": {"rope_type": "linear", "factor": 2.0, "mrope_section": [16, 24, 24]}},
     (1e6, 128, LinearScaling(2.0), (16, 24, 24), False)),
])
def test_mrope_from_hf_reads_v4_config_json(config, want):
    assert core_hf_config.mrope_from_hf(config) == want


@needs_qwen_vl
@pytest.mark.parametrize("family", FAMILIES)
def test_from_hf_config_reads_v5_configs_whole_or_text(family):
    config = _config(family)
    hf = getattr(FAMILY[family][2], ("Qwen2VL" if family == "qwen2_vl" else "Qwen2_5_VL") + "RotaryEmbedding")(
        config.text_config)
    for cfg in (config, config.text_config, config.to_dict()):
        m = MultimodalRotaryEmbedding.from_hf_config(cfg)
        assert (m.dim, m.mrope_section, m.base, m.layout) == (16, tuple(SECTION), 10000.0, "half")
        torch.testing.assert_close(m.inv_freq.float(), hf.inv_freq, rtol=1e-6, atol=0)
    assert core_hf_config.mrope_vision_from_hf(config) == {
        "spatial_merge_size": 2, "tokens_per_second": 2 if family == "qwen2_5_vl" else None}


def test_from_hf_config_errors():
    with pytest.raises(ValueError, match="no mrope_section"):
        core_hf_config.mrope_from_hf({"hidden_size": 64, "num_attention_heads": 4})
    with pytest.raises(ValueError, match="sums to 30"):
        core_hf_config.mrope_from_hf({**QWEN2_VL_V4_JSON, "rope_scaling": {"type": "mrope",
                                                                          "mrope_section": [10, 10, 10]}})
    with pytest.raises(ValueError, match="multimodal RoPE"):
        RotaryEmbedding.from_hf_config(QWEN2_VL_V4_JSON)
    with pytest.raises(ValueError, match="sequence length"):
        MultimodalRotaryEmbedding.from_hf_config({**QWEN2_VL_V4_JSON, "max_position_embeddings": 4096, "rope_scaling": {
            "rope_type": "dynamic", "factor": 2.0, "mrope_section": [16, 24, 24]}})
    with pytest.raises(ValueError, match="get_rope_index"):
        core_hf_config.mrope_vision_from_hf({"model_type": "qwen3_vl"})


# ---- patch_model ---------------------------------------------------------------------------------------

def _inputs(family, config):
    rows, grids = PROMPTS["mixed"]
    ids, types, mask = _prompt(rows, grids)
    vc = config.vision_config
    width = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    g = torch.Generator().manual_seed(6)
    img, vid = _grid(grids, IM), _grid(grids, V)
    kwargs = dict(input_ids=ids, attention_mask=mask, mm_token_type_ids=types, image_grid_thw=img, video_grid_thw=vid,
                  pixel_values=torch.randn(int(img.prod(-1).sum()), width, generator=g),
                  pixel_values_videos=torch.randn(int(vid.prod(-1).sum()), width, generator=g))
    if family == "qwen2_5_vl":
        kwargs["second_per_grid_ts"] = torch.tensor([0.5, 1.7])
    return kwargs, mask.bool()


@needs_qwen_vl
@pytest.mark.parametrize("family", FAMILIES)
def test_patched_model_reproduces_the_models_logits(models, family):
    model = models[family]
    kwargs, valid = _inputs(family, model.config)
    rotary = model.model.language_model.rotary_emb
    with torch.no_grad():
        model.model.rope_deltas = None
        want = model(**kwargs).logits
        model.model.rope_deltas = None
        want_gen = model.generate(**kwargs, max_new_tokens=4, do_sample=False, output_scores=True,
                                  return_dict_in_generate=True)
        patch_model(model)
        try:
            assert "forward" in vars(rotary)                               # the text rotary is routed through posenc
            assert "forward" in vars(model.model.visual.rotary_pos_emb)       # and the vision tower's axial RoPE
            model.model.rope_deltas = None
            got = model(**kwargs).logits
            model.model.rope_deltas = None
            got_gen = model.generate(**kwargs, max_new_tokens=4, do_sample=False, output_scores=True,
                                     return_dict_in_generate=True)
            # far from position 0 posenc's cos/sin are exact where the model's float32 angles are not
            far = torch.tensor([[[70001, 90003]]]).expand(3, 1, 2)
            cos, _ = rotary(torch.zeros(1, dtype=torch.float32), far)
            axes = mrope_axes(16, SECTION, False)
            exact = [math.cos(int(far[axes[j], 0, 1]) * math.pow(10000.0, -2 * j / 16)) for j in range(8)]
            np.testing.assert_allclose(cos[0, 1, :8].double().numpy(), exact, rtol=0, atol=1.2e-7)
        finally:
            unpatch_model(model)
    torch.testing.assert_close(got[valid], want[valid], rtol=0, atol=1e-5)
    assert torch.equal(got_gen.sequences, want_gen.sequences)
    torch.testing.assert_close(torch.stack(got_gen.scores), torch.stack(want_gen.scores), rtol=0, atol=1e-5)
    assert "forward" not in vars(rotary)
    with torch.no_grad():
        model.model.rope_deltas = None
        torch.testing.assert_close(model(**kwargs).logits, want, rtol=0, atol=0)      # restored exactly


@needs_qwen_vl
@pytest.mark.parametrize("family", FAMILIES)
def test_patch_text_model_alone(family):
    text_cls = transformers.Qwen2VLTextModel if family == "qwen2_vl" else transformers.Qwen2_5_VLTextModel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        model = text_cls(_config(family).text_config).eval()
    ids = torch.randint(2, 90, (1, 12), generator=torch.Generator().manual_seed(7))
    pos = torch.tensor([[[0, 1, 2, 2, 2, 2, 4, 5, 6, 7, 8, 9]], [[0, 1, 2, 2, 3, 3, 4, 5, 6, 7, 8, 9]],
                        [[0, 1, 2, 3, 2, 3, 4, 5, 6, 7, 8, 9]]])
    with torch.no_grad():
        want = model(input_ids=ids, position_ids=pos).last_hidden_state
        patch_model(model)
        got = model(input_ids=ids, position_ids=pos).last_hidden_state
        unpatch_model(model)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


# ---- posenc.attention and the Triton engine ---------------------------------------------------------


def test_attention_takes_per_axis_positions_axes_last():
    """posenc.attention rotates with the (t, h, w) coordinates, axes last, and masks by token order."""
    from posenc.attn import attention

    m = MultimodalRotaryEmbedding(8, [1, 1, 2])
    ids = torch.tensor([[5, 6, 9, 9, 9, 9, 7]])
    types = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])
    pos, _ = mrope_positions(ids, mm_token_type_ids=types, image_grid_thw=torch.tensor([[1, 4, 4]]))   # (1, 7, 3)
    q, k, v = (torch.randn(1, 2, 7, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    qr, kr = (torch.from_numpy(mrope_rotate(t.numpy(), pos.numpy(), 8, [1, 1, 2], 10000.0)).float() for t in (q, k))
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    want = torch.nn.functional.scaled_dot_product_attention(qr, kr, v, attn_mask=causal)
    with torch.no_grad():
        got = attention(q, k, v, encoding=m, positions=pos, causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match=r"\(7, 3\)"):
        attention(q, k, v, encoding=m, positions=pos[0].T)                                 # axes first: refused


@pytest.mark.parametrize("batched", [False, True])
def test_triton_engine_matches_torch_engine(batched):
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton kernel runs on CPU tensors under TRITON_INTERPRET=1 only")
    gen = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 40, (2, 5, 3) if batched else (5, 3), generator=gen)
    q, k = torch.randn(2, 3, 5, 12, generator=gen), torch.randn(2, 1, 5, 12, generator=gen)   # partial rotary
    mt = MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=32, engine="triton")
    mr = MultimodalRotaryEmbedding(8, [2, 1, 1], max_seq_len=32, engine="torch")
    for a, b in zip(mt(q, k, positions=pos), mr(q, k, positions=pos), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("shape", [(6, 3), (2, 6, 3), (1, 6, 3)])
def test_rows_computed_once_rotate_like_positions(shape):
    """cos_sin(positions), passed to every layer, gives what positions= gives (and the oracle)."""
    gen = torch.Generator().manual_seed(1)
    m = MultimodalRotaryEmbedding(12, [2, 2, 2], max_seq_len=16)
    pos = torch.randint(0, 40, shape, generator=gen)                       # some past the 16-row table
    q, k = torch.randn(2, 3, 6, 12, generator=gen), torch.randn(2, 1, 6, 12, generator=gen)
    rows = m.cos_sin(pos)
    for got, ref in zip(m(q, k, cos_sin=rows), m(q, k, positions=pos), strict=True):
        assert torch.equal(got, ref)
    pos3 = pos if pos.dim() == 3 else pos[None]
    want = mrope_rotate(q.numpy(), pos3.expand(2, 6, 3).numpy(), 12, [2, 2, 2], 10000.0)
    np.testing.assert_allclose(m(q, cos_sin=rows)[0].numpy(), want, rtol=0, atol=_tol(want))
    with pytest.raises(ValueError, match="not both"):
        m(q, k, positions=pos, cos_sin=rows)
    with pytest.raises(ValueError, match="cos_sin must be"):
        m(q[:, :, :5], cos_sin=rows)
