"""posenc.testing.inspect_rope and assert_rope_close: each bug class planted into otherwise correct
implementations (transformers', Meta's and GPT-J's public formulas, written for the tests in
tests/reference/peer_rope.py) must be named, and correct ones must pass."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import posenc
from posenc.core.rope import LinearScaling, Llama3Scaling, LongRopeScaling, NTKScaling, YarnScaling
from posenc.testing import RopeReport, assert_rope_close, inspect_rope
from tests.reference import peer_rope, rope_oracle

D = 64
PEERS = sorted(peer_rope.PEERS)


def _spec(layout: str, dim: int = D, base: float = 10000.0, scaling=None) -> posenc.RopeSpec:
    return posenc.RopeSpec(dim, base=base, scaling=scaling, layout=layout)


def _raises(fn, reference, match: str, **kw) -> str:
    with pytest.raises(AssertionError, match=match) as info:
        assert_rope_close(fn, reference, head_dim=kw.pop("head_dim", D), max_position=kw.pop("max_position", 1024),
                          **kw)
    return str(info.value)


# ---- correct implementations ----------------------------------------------------------------------


@pytest.mark.parametrize("peer", PEERS)
def test_a_correct_peer_formula_is_read_back(peer):
    make, layout = peer_rope.PEERS[peer]
    report = inspect_rope(make(D), head_dim=D, max_position=1024)
    assert report.layout == layout
    assert report.rotated == tuple(range(D)) and report.placement == "all" and report.rotary_dim == D
    assert report.direction == report.key_direction == "standard"
    assert report.base == 10000.0 and report.rule is None and report.fit.matched
    np.testing.assert_allclose(report.frequencies, rope_oracle.default(D), rtol=1e-6)
    assert report.attention_factor == pytest.approx(1.0, abs=1e-6)
    assert report.relative and report.decode is None and report.collision is None
    assert report.findings == ()
    assert_rope_close(make(D), _spec(layout), head_dim=D, max_position=1024)


def test_posenc_is_exact_and_the_float32_formula_is_not():
    """posenc's tables are within half an ulp of the exact values at every position; transformers' formula
    (angles multiplied in float32) drifts away as positions grow, and the report says from where."""
    rope = posenc.RotaryEmbedding(D, max_seq_len=8192)
    exact = inspect_rope(lambda q, k, p: rope(q, k, positions=p), head_dim=D, dtypes=(torch.float32, torch.bfloat16))
    assert all(r.max_ulps <= 1.0 for r in exact.precision), exact.precision       # "exact": within 1 ulp
    assert exact.first_over == {"float32": None, "bfloat16": None}
    drift = inspect_rope(peer_rope.make_hf(D), head_dim=D)
    assert drift.first_over["float32"] is not None
    late = [r for r in drift.precision if r.start >= 2048]
    assert late and late[0].max_abs > 1e-4                  # about p * ulp(theta) at p ~ 8000
    assert drift.findings == ()                             # imprecise, not wrong: no finding


def test_the_printed_report_is_a_table():
    text = str(inspect_rope(peer_rope.make_meta(D), head_dim=D, max_position=256))
    for row in ("rotated features", "pair layout", "interleaved: pairs (2i, 2i + 1)", "closest rule", "base=10000",
                "relative property", "holds", "precision", "float32", "findings: none"):
        assert row in text, (row, text)


# ---- the bug classes -------------------------------------------------------------------------------


@pytest.mark.parametrize("peer", PEERS)
def test_a_layout_swap_is_named(peer):
    make, layout = peer_rope.PEERS[peer]
    other = "half" if layout == "interleaved" else "interleaved"
    msg = _raises(make(D), _spec(other), "pair layout")
    assert f"({layout})" in msg and f"({other})" in msg


@pytest.mark.parametrize("peer", PEERS)
def test_a_wrong_base_is_named(peer):
    make, layout = peer_rope.PEERS[peer]
    fn = make(D, peer_rope.plain(D, 500000.0))
    assert inspect_rope(fn, head_dim=D, max_position=1024).base == 500000.0
    _raises(fn, _spec(layout), r"base: fn's frequencies are base\^\(-2i/d\) with base=500000; the reference's base=10000")


@pytest.mark.parametrize("peer", PEERS)
def test_a_table_built_in_bfloat16_is_named(peer):
    make, layout = peer_rope.PEERS[peer]
    fn = make(D, table_dtype=torch.bfloat16)
    report = inspect_rope(fn, head_dim=D, max_position=1024)
    assert report.collision == 256                           # 257 rounds to 256 in bfloat16
    assert any("positions 256 and 257 get the same rotation" in f for f in report.findings)
    _raises(fn, _spec(layout), "positions 256 and 257 get the same rotation")


@pytest.mark.parametrize("peer", PEERS)
def test_keys_rotated_the_other_way_are_named(peer):
    make, layout = peer_rope.PEERS[peer]
    report = inspect_rope(make(D, k_sign=-1), head_dim=D, max_position=1024)
    assert (report.direction, report.key_direction) == ("standard", "reversed")
    assert not report.relative
    _raises(make(D, k_sign=-1), _spec(layout), "q rotates standard but k rotates reversed")


@pytest.mark.parametrize("peer", PEERS)
def test_a_reversed_rotation_is_named(peer):
    make, layout = peer_rope.PEERS[peer]
    fn = make(D, q_sign=-1, k_sign=-1)
    report = inspect_rope(fn, head_dim=D, max_position=1024)
    assert report.direction == report.key_direction == "reversed" and report.relative
    _raises(fn, _spec(layout), r"direction: fn rotates q by -theta")


@pytest.mark.parametrize("peer", PEERS)
def test_scaling_on_the_wrong_frequencies_is_named(peer):
    make, layout = peer_rope.PEERS[peer]
    rule = Llama3Scaling(8.0, 1024)
    wrong = make(D, peer_rope.llama3_on_wrong_band(D, 10000.0, 8.0, 1024))
    msg = _raises(wrong, _spec(layout, scaling=rule), "the scaling is applied to the wrong frequencies")
    assert "changes pairs 0.." in msg.split("the reference")[0] or "frequencies of pairs 0.." in msg
    _raises(make(D), _spec(layout, scaling=rule), "the scaling rule is ignored")


@pytest.mark.parametrize("peer", PEERS)
def test_partial_rotary_on_the_wrong_slice_is_named(peer):
    make, layout = peer_rope.PEERS[peer]
    fn = make(16, trailing=True)
    report = inspect_rope(fn, head_dim=D, max_position=1024)
    assert report.rotated == tuple(range(D - 16, D)) and report.placement == "trailing"
    assert report.layout == layout and report.rotary_dim == 16
    _raises(fn, _spec(layout, dim=16), "the partial rotary is on the wrong slice")
    assert_rope_close(make(16), _spec(layout, dim=16), head_dim=D, max_position=1024)
    _raises(make(16), _spec(layout, dim=32), "rotary dim: fn rotates 16 features")


@pytest.mark.parametrize("peer", PEERS)
def test_a_dropped_decode_offset_is_named(peer):
    make, layout = peer_rope.PEERS[peer]
    report = inspect_rope(make(D, decode_bug=True), head_dim=D, max_position=1024)
    assert report.decode is not None and "gets position 0's" in report.decode
    _raises(make(D, decode_bug=True), _spec(layout), "the position offset is dropped at decode")


def test_positions_that_are_ignored_are_named():
    report = inspect_rope(lambda q, k, p: (q, k), head_dim=8, max_position=64)
    assert report.rotated == () and report.layout == "none"
    assert any("no feature rotates" in f for f in report.findings)


def test_another_pairing_is_reported_as_a_permutation():
    """Pairs (i, D - 1 - i): neither layout; the report lists the pairs, fastest first."""
    freqs = rope_oracle.default(8)

    def fn(q, k, positions):
        first, second = [0, 1, 2, 3], [7, 6, 5, 4]
        angle = positions.reshape(-1).double()[:, None] * torch.tensor(freqs)
        return (rope_oracle.rotate_pairs(q, angle.numpy(), first, second),
                rope_oracle.rotate_pairs(k, angle.numpy(), first, second))

    report = inspect_rope(lambda q, k, p: tuple(torch.from_numpy(t).float() for t in fn(q, k, p)), head_dim=8,
                          max_position=64)
    assert report.layout == "permutation"
    assert report.pairs == ((0, 7), (1, 6), (2, 5), (3, 4))
    np.testing.assert_allclose(report.frequencies, freqs, rtol=1e-6)


# ---- the closest rule ------------------------------------------------------------------------------


@pytest.mark.parametrize("rule, base, freqs, factor", [
    (LinearScaling(4.0), 10000.0, rope_oracle.linear(D, 10000.0, 4.0), 1.0),
    (NTKScaling(4.0), 10000.0, rope_oracle.ntk(D, 10000.0, 4.0), 1.0),
    (NTKScaling(8.0), 500000.0, rope_oracle.ntk(D, 500000.0, 8.0), 1.0),
    (Llama3Scaling(8.0, 8192), 500000.0, rope_oracle.llama3(D, 500000.0, 8.0, 8192), 1.0),
    (Llama3Scaling(32.0, 2048, low_freq_factor=1.0, high_freq_factor=2.0), 500000.0,
     rope_oracle.llama3(D, 500000.0, 32.0, 2048, 1.0, 2.0), 1.0),
    (YarnScaling(16.0, 4096), 500000.0, rope_oracle.yarn(D, 500000.0, 16.0, 4096),
     rope_oracle.yarn_attention_factor(16.0)),
    (YarnScaling(4.0, 32768, truncate=False), 1e6, rope_oracle.yarn(D, 1e6, 4.0, 32768, truncate=False),
     rope_oracle.yarn_attention_factor(4.0)),
], ids=["linear", "ntk", "ntk-500k", "llama3", "llama3-bands", "yarn", "yarn-untruncated"])
def test_the_closest_rule_is_found_with_its_parameters(rule, base, freqs, factor):
    fn = peer_rope.make_hf(D, freqs, attention_factor=factor)
    report = inspect_rope(fn, head_dim=D, max_position=2048)
    assert report.fit.matched and report.base == base and report.rule == rule, report.fit.describe()
    assert report.attention_factor == pytest.approx(factor, rel=1e-6)
    assert report.findings == ()
    assert_rope_close(fn, _spec("half", base=base, scaling=rule), head_dim=D, max_position=2048)


def test_a_dropped_yarn_temperature_is_named():
    fn = peer_rope.make_hf(D, rope_oracle.yarn(D, 500000.0, 16.0, 4096))          # frequencies right, factor 1
    msg = _raises(fn, _spec("half", base=500000.0, scaling=YarnScaling(16.0, 4096)), "attention factor")
    assert f"{rope_oracle.yarn_attention_factor(16.0):.6g}" in msg


# ---- calling conventions, references ---------------------------------------------------------------


def test_posenc_modules_in_both_tensor_formats():
    rope = posenc.RotaryEmbedding(32, max_seq_len=2048, layout="interleaved", base=1e6)
    bhsd = inspect_rope(lambda q, k, p: rope(q, k, positions=p), head_dim=48, max_position=512)
    bshd = inspect_rope(lambda q, k, p: rope(q, k, positions=p, seq_dim=1), head_dim=48, qk_format="bshd",
                        max_position=512)
    for r in (bhsd, bshd):
        assert (r.layout, r.placement, r.rotary_dim, r.base) == ("interleaved", "leading", 32, 1e6)
    assert_rope_close(lambda q, k, p: rope(q, k, positions=p), rope, head_dim=48, max_position=512)
    assert_rope_close(lambda q, k, p: rope(q, k, positions=p), bhsd, head_dim=48, max_position=512)


def test_a_report_of_another_implementation_is_a_reference():
    ref = inspect_rope(peer_rope.make_meta(D), head_dim=D, max_position=512)
    assert_rope_close(peer_rope.make_gptj(D), ref, head_dim=D, max_position=512)
    _raises(peer_rope.make_hf(D), ref, "pair layout", max_position=512)


def test_hugging_face_modules_and_configs():
    transformers = pytest.importorskip("transformers")
    from transformers.models.gptj import modeling_gptj
    from transformers.models.llama import modeling_llama

    config = transformers.LlamaConfig(
        hidden_size=256, num_attention_heads=4, max_position_embeddings=131072,
        rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_theta": 500000.0})
    module = modeling_llama.LlamaRotaryEmbedding(config)
    table = inspect_rope(module, head_dim=64, max_position=2048)
    assert table.call == "cos_sin" and table.direction == "assumed standard"
    assert table.rule == Llama3Scaling(8.0, 8192) and table.base == 500000.0
    assert_rope_close(modeling_llama.apply_rotary_pos_emb, config, cos_sin=module, head_dim=64, max_position=2048)
    _raises(modeling_llama.apply_rotary_pos_emb, _spec("half"), "scaling: fn applies Llama3Scaling", cos_sin=module,
            head_dim=64, max_position=2048)

    gptj = transformers.GPTJConfig(n_embd=256, n_head=4, rotary_dim=32, n_positions=4096)
    emb = modeling_gptj.GPTJRotaryEmbedding(gptj)                # returns (sin, cos), one value per pair

    def rotate(q, k, positions):
        sin, cos = emb(q, positions)
        turn = lambda x: torch.cat((modeling_gptj.apply_rotary_pos_emb(  # noqa: E731
            x[..., :32].transpose(1, 2), sin, cos).transpose(1, 2), x[..., 32:]), -1)
        return turn(q), turn(k)

    report = assert_rope_close(rotate, gptj, head_dim=64, max_position=1024)
    assert (report.layout, report.rotary_dim, report.placement) == ("interleaved", 32, "leading")


@pytest.mark.parametrize("call", ["rotate", "apply"])
def test_the_calling_convention_can_be_named(call):
    rope = posenc.RotaryEmbedding(16, max_seq_len=512)
    if call == "rotate":
        report = inspect_rope(lambda q, k, p, extra=None: rope(q, k, positions=p), head_dim=16, call="rotate",
                              max_position=128)
    else:
        def cos_sin(x, p):
            c, s = rope.cos_sin(p.reshape(-1))
            return torch.cat((c, c), -1), torch.cat((s, s), -1)

        def apply(q, k, cos, sin):
            half = lambda x: torch.cat((-x[..., 8:], x[..., :8]), -1)  # noqa: E731
            return q * cos + half(q) * sin, k * cos + half(k) * sin

        report = inspect_rope(apply, cos_sin=cos_sin, head_dim=16, max_position=128)
    assert report.call == call and report.layout == "half" and report.base == 10000.0


def test_report_is_a_frozen_record():
    report = inspect_rope(peer_rope.make_hf(8), head_dim=8, max_position=32)
    assert isinstance(report, RopeReport)
    with pytest.raises(AttributeError):
        report.layout = "x"  # type: ignore[misc]
    assert math.isfinite(report.relative_error)


def test_rotary_embedding_torch_itself():
    """The peer library as its users call it: adjacent pairs, base 10000, exact to float32 rounding."""
    ret = pytest.importorskip("rotary_embedding_torch")
    rot = ret.RotaryEmbedding(dim=32, cache_if_possible=False)

    def fn(q, k, positions):
        freqs = rot(positions.reshape(-1).float())                   # (S, 32): each frequency twice, adjacent
        return ret.apply_rotary_emb(freqs, q), ret.apply_rotary_emb(freqs, k)

    report = assert_rope_close(fn, _spec("interleaved", dim=32), head_dim=48, max_position=1024)
    assert (report.layout, report.placement, report.rotary_dim, report.base) == ("interleaved", "leading", 32, 1e4)
    _raises(fn, _spec("half", dim=32), "pair layout", head_dim=48)


def test_an_attention_factor_is_part_of_yarn_and_a_finding_elsewhere():
    """DeepSeek sets YaRN's mscale and mscale_all_dim equal: cos and sin unscaled.  That is still YaRN (its
    attention factor is a parameter); a factor on plain RoPE is no rule's."""
    deepseek = peer_rope.make_hf(D, rope_oracle.yarn(D, 10000.0, 40.0, 4096),
                                 attention_factor=rope_oracle.yarn_attention_factor(40.0, 1.0, 1.0))
    report = inspect_rope(deepseek, head_dim=D, max_position=2048)
    assert report.rule == YarnScaling(40.0, 4096, attention_factor_override=1.0) and report.findings == ()
    scaled = inspect_rope(peer_rope.make_hf(D, attention_factor=1.25), head_dim=D, max_position=512)
    assert scaled.attention_factor == pytest.approx(1.25) and scaled.rule is None
    assert any("cos and sin are scaled by 1.25" in f for f in scaled.findings)


def test_per_pair_factors_are_read_as_longrope():
    """LongRoPE's searched factors follow no formula: they are read back one per pair (Phi-3's form; its fast
    pairs keep factors near 1, which fixes the base)."""
    short = [1.0 if i < 12 else 1.0 + 0.075 * (i - 11) for i in range(D // 2)]
    freqs = rope_oracle.longrope(D, 10000.0, short, short, 4096, None)
    report = inspect_rope(peer_rope.make_hf(D, freqs, attention_factor=1.19), head_dim=D, max_position=2048)
    assert isinstance(report.rule, LongRopeScaling) and report.findings == ()
    np.testing.assert_allclose(report.rule.short_factor, short, rtol=1e-5)
    assert report.rule.attention_factor() == pytest.approx(1.19)
    assert report.base == 10000.0 and "one factor per pair, 1 to 2.5" in report.fit.describe()
    config = {"model_type": "phi3", "hidden_size": 256, "num_attention_heads": 4, "rope_theta": 10000.0,
              "max_position_embeddings": 16384, "rope_scaling": {"rope_type": "longrope", "short_factor": short,
              "long_factor": [2 * x for x in short], "original_max_position_embeddings": 4096,
              "attention_factor": 1.19}}
    assert_rope_close(peer_rope.make_hf(D, freqs, attention_factor=1.19), config, head_dim=D, max_position=2048)
    msg = _raises(peer_rope.make_hf(D, freqs / 1.1, attention_factor=1.19), config, "scaling: fn applies "
                  r"LongRopeScaling\(one factor per pair, 1.1 to 2.75", max_position=2048)
    assert "the reference applies LongRopeScaling(short factors 1 to 2.5, long factors 2 to 5" in msg


@pytest.mark.parametrize("base", [500042.0, 731766.0, 12345.0])
def test_a_base_that_is_not_round_is_kept_as_measured(base):
    """The base is rounded only where the rounded one fits as well: 500042 is neither 500040 nor an NTK base."""
    rope = posenc.RotaryEmbedding(96, max_seq_len=4096, base=base)
    report = inspect_rope(lambda q, k, p: rope(q, k, positions=p), head_dim=96, max_position=2048)
    assert (report.base, report.rule, report.findings) == (base, None, ())
    assert report.first_over == {"float32": None}                 # measured against the right base: exact


def test_phi3_shaped_long_factors_are_read_per_pair():
    """Factors that keep no two neighbours equal (Phi-3's long factors rise from 1.08 to about 65)."""
    long = [1.08 * 1.1 ** i if i < 44 else 65.0 for i in range(48)]
    freqs = rope_oracle.longrope(96, 10000.0, long, long, 4096, None)
    report = inspect_rope(peer_rope.make_hf(96, freqs), head_dim=96, max_position=2048)
    assert report.base == 10000.0 and isinstance(report.rule, LongRopeScaling) and report.findings == ()
    np.testing.assert_allclose(report.rule.short_factor, long, rtol=1e-5)


@pytest.mark.parametrize("rule", [posenc.DynamicNTKScaling(4.0, 1024),
                                  LongRopeScaling([1.0] * 32, [2.0] * 32, 1024)], ids=["dynamic", "longrope"])
def test_a_rule_of_the_sequence_length_is_no_dropped_offset(rule):
    """A decode step at position p sees the frequencies of a p + 1 long sequence, as a call on 0..p does."""
    rope = posenc.RotaryEmbedding(D, max_seq_len=8192, scaling=rule)
    fn = lambda q, k, p: rope(q, k, positions=p)  # noqa: E731
    report = inspect_rope(fn, head_dim=D, max_position=4096)
    assert report.decode is None
    assert_rope_close(fn, rope, head_dim=D, max_position=4096)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_posenc_against_itself_in_16_bit(dtype):
    """The frequencies are fitted from float32 outputs whatever dtypes lists (16-bit cos/sin are too coarse)."""
    rope = posenc.RotaryEmbedding(128, max_seq_len=4096, scaling=Llama3Scaling(8.0, 1024), base=500000.0)
    fn = lambda q, k, p: rope(q, k, positions=p)  # noqa: E731
    report = assert_rope_close(fn, rope, head_dim=128, dtypes=(dtype,), max_position=2048)
    assert report.rule == Llama3Scaling(8.0, 1024)
