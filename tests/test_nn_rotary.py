"""posenc.nn.RotaryEmbedding: exact tables, equivalences, scaling rules, xPos, module mechanics."""

import mpmath
import pytest
import torch

import posenc
from posenc.core import rope as core
from posenc.functional import positions_from_mask
from posenc.functional import rope as R
from tests.reference import rope_oracle as oracle
from tests.reference.oracle import ulps

mpmath.mp.prec = 200


def qk(b=2, hq=4, hk=2, s=9, d=32, dtype=torch.float32):
    return torch.randn(b, hq, s, d).to(dtype), torch.randn(b, hk, s, d).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tables_within_one_ulp_of_the_formula(dtype):
    # the true value is cos(p * 10000^(-2i/d)) with the frequency taken exactly (mpmath), not its float64
    rope = posenc.RotaryEmbedding(32, max_seq_len=300)
    positions = [0, 1, 255, 256, 257, 299, 4095, 65537, 2**20 - 1, 2**20]
    cos, sin = rope.cos_sin(torch.tensor(positions), dtype=dtype)
    for got, fn in ((cos, mpmath.cos), (sin, mpmath.sin)):
        truth = torch.tensor([[float(fn(p * mpmath.power(10000, mpmath.mpf(-2 * i) / 32))) for i in range(16)]
                              for p in positions], dtype=torch.float64)
        assert got.dtype == dtype
        assert bool(((got.double() - truth).abs() <= ulps(dtype, truth)).all())


def test_tables_stay_float32_after_casting_and_under_autocast():
    rope = posenc.RotaryEmbedding(16, max_seq_len=64)
    before = {k: v.clone() for k, v in rope.named_buffers()}
    rope.to(torch.bfloat16)
    for name, buf in rope.named_buffers():
        assert buf.dtype == before[name].dtype and torch.equal(buf, before[name]), name
    q, k = qk(d=16, dtype=torch.bfloat16)
    plain = rope(q, k, offset=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = rope(q, k, offset=300)
    assert torch.equal(plain[0], under[0]) and torch.equal(plain[1], under[1])
    assert plain[0].dtype == torch.bfloat16 and plain[1].dtype == torch.bfloat16
    # 256 and 257 stay distinct in a bf16 module
    one = torch.ones(1, 1, 2, 16, dtype=torch.bfloat16)
    out, _ = rope(one, positions=torch.tensor([256, 257]))
    assert not torch.equal(out[0, 0, 0], out[0, 0, 1])


@pytest.mark.float64
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_forward_matches_the_rotation_oracle_with_partial_rotary_and_gqa(layout):
    rope = posenc.RotaryEmbedding(24, max_seq_len=64, layout=layout)
    q, k = qk(d=40, dtype=torch.float64)
    qo, ko = rope(q, k, offset=20)
    inv = rope.inv_freq.tolist()
    torch.testing.assert_close(qo, oracle.rotate(q, torch.arange(20, 29), inv, layout), rtol=0, atol=1e-12)
    torch.testing.assert_close(ko, oracle.rotate(k, torch.arange(20, 29), inv, layout), rtol=0, atol=1e-12)
    assert torch.equal(qo[..., 24:], q[..., 24:])


def test_positions_none_equals_arange_and_token_by_token_equals_full():
    rope = posenc.RotaryEmbedding(16, max_seq_len=8)          # runs past the table too
    q, k = qk(s=12, d=16)
    full = rope(q, k)
    assert all(torch.equal(a, b) for a, b in zip(full, rope(q, k, positions=torch.arange(12)), strict=True))
    steps = [rope(q[:, :, i : i + 1], k[:, :, i : i + 1], offset=i) for i in range(12)]
    assert torch.equal(torch.cat([s[0] for s in steps], 2), full[0])
    assert torch.equal(torch.cat([s[1] for s in steps], 2), full[1])


def test_left_padded_row_equals_its_unpadded_run():
    rope = posenc.RotaryEmbedding(16, max_seq_len=32)
    q = torch.randn(1, 2, 5, 16)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    padded = torch.cat([torch.zeros(1, 2, 3, 16), q], dim=2)
    out, _ = rope(padded, positions=positions_from_mask(mask))
    alone, _ = rope(q)
    assert torch.equal(out[:, :, 3:], alone)


def test_seq_dim_one_equals_transposed():
    rope = posenc.RotaryEmbedding(16)
    q, k = qk(d=16)
    a = rope(q, k, offset=7)
    b = rope(q.transpose(1, 2), k.transpose(1, 2), offset=7, seq_dim=1)
    assert torch.equal(b[0].transpose(1, 2), a[0]) and torch.equal(b[1].transpose(1, 2), a[1])


def test_inplace_equals_out_of_place_and_never_mutates_the_module():
    rope = posenc.RotaryEmbedding(16, max_seq_len=16)
    before = {k: v.clone() for k, v in rope.named_buffers()}
    q, k = qk(d=16)
    qo, ko = rope(q, k, offset=10)
    q2, k2 = q.clone(), k.clone()
    qi, ki = rope(q2, k2, offset=10, inplace=True)
    assert qi is q2 and ki is k2 and torch.equal(qi, qo) and torch.equal(ki, ko)
    assert all(torch.equal(v, before[n]) for n, v in rope.named_buffers())


@pytest.mark.float64
def test_relative_scores_through_the_module():
    rope = posenc.RotaryEmbedding(32, max_seq_len=16)
    q, k = torch.randn(1, 1, 1, 32, dtype=torch.float64), torch.randn(1, 1, 1, 32, dtype=torch.float64)

    def score(m, n):
        return float(rope(q, positions=torch.tensor([m]))[0].flatten() @ rope(k, positions=torch.tensor([n]))[0].flatten())

    for shift in (0, 3, 1000, 2**20):
        assert score(7 + shift, 3 + shift) == pytest.approx(score(7, 3), abs=1e-11)


def test_linear_scaling_position_m_sees_position_m_over_factor():
    plain = posenc.RotaryEmbedding(16, max_seq_len=64)
    scaled = posenc.RotaryEmbedding(16, max_seq_len=64, scaling=posenc.LinearScaling(4.0))
    c1, s1 = scaled.cos_sin(torch.tensor([8, 40]))
    c2, s2 = plain.cos_sin(torch.tensor([2, 10]))
    torch.testing.assert_close(c1, c2, rtol=0, atol=1e-6)
    torch.testing.assert_close(s1, s2, rtol=0, atol=1e-6)


@pytest.mark.float64
def test_dynamic_ntk_short_inputs_equal_unscaled_and_long_inputs_use_the_final_length():
    rule = posenc.DynamicNTKScaling(4.0, 16)
    rope = posenc.RotaryEmbedding(16, max_seq_len=64, scaling=rule)
    plain = posenc.RotaryEmbedding(16, max_seq_len=64)
    q, k = qk(s=16, d=16)
    assert torch.equal(rope(q, k)[0], plain(q, k)[0])
    long_q = torch.randn(1, 1, 40, 16, dtype=torch.float64)
    out, _ = rope(long_q)                                      # seq_len defaults to 40
    inv, _ = core.inv_freq(16, 1e4, rule, 40)
    torch.testing.assert_close(out, oracle.rotate(long_q, torch.arange(40), inv.tolist(), "half"), rtol=0, atol=1e-12)
    # short -> long -> short: identical
    assert torch.equal(rope(q, k)[0], plain(q, k)[0])
    # a decode step at position 39 with seq_len=40 equals the last row of the full call
    step, _ = rope(long_q[:, :, 39:], offset=39)
    torch.testing.assert_close(step, out[:, :, 39:], rtol=0, atol=0)


def test_longrope_switches_tables_past_the_original_length():
    rule = posenc.LongRopeScaling([1.0] * 8, [4.0] * 8, 32, factor=4.0)
    rope = posenc.RotaryEmbedding(16, max_seq_len=128, scaling=rule)
    cs, _ = rope.cos_sin(torch.arange(3), seq_len=32)
    cl, _ = rope.cos_sin(torch.arange(3), seq_len=33)
    plain = posenc.RotaryEmbedding(16, max_seq_len=128, scaling=posenc.LinearScaling(4.0))
    factor = rule.attention_factor()
    torch.testing.assert_close(cl, plain.cos_sin(torch.arange(3))[0] * factor, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(cs, cl)


def test_yarn_attention_factor_scales_cos_and_sin_once():
    rule = posenc.YarnScaling(8.0, 64)
    rope = posenc.RotaryEmbedding(16, max_seq_len=8, scaling=rule)
    c, s = rope.cos_sin(torch.arange(100))
    torch.testing.assert_close(c**2 + s**2, torch.full_like(c, rule.attention_factor() ** 2), rtol=1e-6, atol=0)


@pytest.mark.float64
def test_xpos_scores_depend_only_on_distance_and_decay():
    rope = posenc.RotaryEmbedding(16, xpos_scale_base=64.0)
    q = torch.randn(1, 1, 1, 16, dtype=torch.float64)
    k = q.clone()

    def score(m, n):
        qo, _ = rope(q, positions=torch.tensor([m]))
        _, ko = rope(q, k, positions=torch.tensor([n]))
        return float(qo.flatten() @ ko.flatten())

    assert score(50, 10) == pytest.approx(score(1050, 1010), rel=1e-10)
    with pytest.raises(ValueError, match="xPos scales overflow"):
        rope(q, positions=torch.tensor([70 * 64]))


@pytest.mark.float64
def test_state_dict_is_empty_and_foreign_tables_load_strictly():
    model = torch.nn.ModuleDict({"rope": posenc.RotaryEmbedding(16)})
    assert list(model.state_dict()) == []
    legacy = {"rope.inv_freq": torch.ones(8), "rope.cos_cached": torch.ones(4, 16), "rope.sin_cached": torch.ones(4, 16),
              "rope.freqs": torch.ones(8), "rope.cache": torch.ones(4, 8, 2)}
    model.load_state_dict(legacy, strict=True)
    assert torch.equal(model["rope"].inv_freq, posenc.rope_inv_freq(16)[0])


def test_meta_device_to_empty_reset_buffers():
    eager = posenc.RotaryEmbedding(16, max_seq_len=32, scaling=posenc.YarnScaling(4.0, 8))
    meta = posenc.RotaryEmbedding(16, max_seq_len=32, scaling=posenc.YarnScaling(4.0, 8), device="meta")
    meta.to_empty(device="cpu")
    meta.reset_buffers()
    for (name, a), (_, b) in zip(eager.named_buffers(), meta.named_buffers(), strict=True):
        assert torch.equal(a, b), name


def test_from_hf_config():
    config = {"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 1024, "rope_theta": 5e5,
              "partial_rotary_factor": 0.5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 128}}
    rope = posenc.RotaryEmbedding.from_hf_config(config, max_seq_len=64)
    assert rope.dim == 32 and rope.base == 5e5 and isinstance(rope.scaling, posenc.Llama3Scaling)
    assert "scaling=Llama3Scaling" in repr(rope)


def test_compile_fullgraph():
    rope = posenc.RotaryEmbedding(16, max_seq_len=64)
    q, k = qk(d=16)
    compiled = torch.compile(rope, fullgraph=True)
    for a, b in zip(compiled(q, k, offset=5), rope(q, k, offset=5), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_move_and_values():
    rope = posenc.RotaryEmbedding(64, max_seq_len=512).to("cuda", torch.bfloat16)
    assert all(b.device.type == "cuda" for b in rope.buffers()) and rope.cos_table.dtype == torch.float32
    q, k = qk(d=64, dtype=torch.bfloat16)
    cpu = posenc.RotaryEmbedding(64, max_seq_len=512)
    for a, b in zip(rope(q.cuda(), k.cuda(), offset=1000), cpu(q, k, offset=1000), strict=True):
        torch.testing.assert_close(a.cpu().double(), b.double(), rtol=0, atol=ulps(torch.bfloat16, b.double()).max().item())


@pytest.mark.parametrize(
    "make, err, match",
    [
        (lambda: posenc.RotaryEmbedding(7), ValueError, "dim .* must be even"),
        (lambda: posenc.RotaryEmbedding(8, layout="neox"), ValueError, "layout must be one of"),
        (lambda: posenc.RotaryEmbedding(8, scaling="linear"), TypeError, "scaling must be None or a posenc"),
        (lambda: posenc.RotaryEmbedding(8, base=0), ValueError, "base must be > 0"),
        (lambda: posenc.RotaryEmbedding(8, xpos_scale_base=-1.0), ValueError, "xpos_scale_base must be > 0"),
        (lambda: posenc.RotaryEmbedding(64)(torch.randn(1, 2, 3, 32)), ValueError, "head dim 32 < rotary dim 64"),
        (lambda: posenc.RotaryEmbedding(8)(torch.randn(1, 2, 3, 8), positions=torch.tensor([0.0, 1.0, 2.0])), TypeError, "positions must hold integers"),
        (lambda: posenc.RotaryEmbedding(8)(torch.randn(1, 2, 3, 8), positions=torch.arange(4)), ValueError, "positions must have shape"),
        (lambda: posenc.RotaryEmbedding(8)(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 4, 8)), ValueError, "must match q"),
        (lambda: posenc.RotaryEmbedding(8)(torch.randn(1, 2, 3, 8).long()), TypeError, "q must be a floating"),
        (lambda: posenc.RotaryEmbedding(8)(torch.randn(1, 2, 3, 8), offset=2**31), ValueError, "within"),
    ],
)
def test_bad_input(make, err, match):
    with pytest.raises(err, match=match):
        make()


def test_rotation_function_of_module_equals_functional_qk():
    rope = posenc.RotaryEmbedding(16, max_seq_len=64, layout="interleaved")
    q, k = qk(d=16)
    a = rope(q, k, offset=3)
    b = R.apply_rope_qk(q, k, rope.cos_table, rope.sin_table, offset=3, layout="interleaved")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_torch_export_matches_eager():
    rope = posenc.RotaryEmbedding(16, max_seq_len=64)
    q, k = qk(d=16)
    exported = torch.export.export(rope, (q, k))
    for a, b in zip(exported.module()(q, k), rope(q, k), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-6)


@pytest.mark.float64
def test_forward_within_the_table_never_recomputes_angles(monkeypatch):
    from posenc.core import exact

    calls = []
    real = exact.sin_cos
    monkeypatch.setattr(exact, "sin_cos", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    rope = posenc.RotaryEmbedding(16, max_seq_len=64)
    assert len(calls) == 1                                   # once, at construction
    q, k = qk(d=16)
    rope(q, k), rope(q, k, offset=55), rope(q, k, positions=torch.arange(9) * 7)
    assert len(calls) == 1
    rope(q, k, offset=56)                                    # rows 56..64: past the table, computed once
    assert len(calls) == 2


def test_longrope_long_attention_factor_eager_and_compiled():
    """The attention factor past the original length (Phi-3.5-MoE's long_mscale) applies wherever the
    long factors do: eager rows computed past the table, and the traced graph's switch on the length."""
    import numpy as np

    rule = posenc.LongRopeScaling([1.0] * 4, [4.0] * 4, 16, factor=4.0, attention_factor_override=1.05,
                                  long_attention_factor=1.25)
    rope = posenc.RotaryEmbedding(8, max_seq_len=64, scaling=rule)
    theta = np.array([10000.0 ** (-2 * i / 8) for i in range(4)])
    positions = torch.arange(3)
    for seq_len, m, ext in ((16, 1.05, 1.0), (40, 1.25, 4.0)):
        angle = positions.double().numpy()[:, None] * theta / ext
        cos, sin = rope.cos_sin(positions, seq_len=seq_len)
        torch.testing.assert_close(cos.double(), torch.from_numpy(m * np.cos(angle)), rtol=0, atol=1e-6)
        torch.testing.assert_close(sin.double(), torch.from_numpy(m * np.sin(angle)), rtol=0, atol=1e-6)
    x = torch.ones(1, 1, 20, 8)
    eager = rope(x)[0]                                               # seq_len 20 > 16: long factors, 1.25
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: rope(t)[0], fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-6)
    pair = eager[0, 0, :, 0] ** 2 + eager[0, 0, :, 4] ** 2         # |R x|^2 of the unit pair (1, 1) is 2 m^2
    torch.testing.assert_close(pair, torch.full_like(pair, 2 * 1.25**2), rtol=0, atol=1e-5)
