"""Exact angles on a device without float64 (Apple's MPS), simulated on the CPU.

Every case runs inside :func:`tests.no_float64.forbid_float64`: posenc takes its float32 path on the
CPU and raises if it creates or uses a float64 tensor.  The judge is mpmath at 200 bits
(``tests/reference``), at positions up to ``2**31``: near ``2**31 - 1``, near multiples of the table
size and random large ones, for every scaling rule, both layouts and float32/bfloat16/float16.
(``pytest --no-float64`` runs the other suites in the same mode.)
"""

from __future__ import annotations

import functools
import random

import mpmath
import numpy as np
import pytest
import torch

import posenc
from posenc import (
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    ProportionalScaling,
    YarnScaling,
)
from posenc._torch import angles, exact32
from posenc.core import exact as core_exact
from tests.no_float64 import Float64Used, forbid_float64
from tests.reference.oracle import sinusoidal_mp, ulp_error
from tests.reference.rope_oracle import theta_rule_mp

DIM = 16
ROWS = 4096                                                    # the table size
_rng = random.Random(20240531)
POSITIONS = sorted({0, 1, 2, ROWS - 1, ROWS, ROWS + 1, 2 * ROWS - 1, 2 * ROWS, 7 * ROWS + 3, 2**20 * ROWS // 2**12,
                    2**22 - 1, 2**22, 2**24 + 1, 2**31 - 2, 2**31 - 1, 2**31,
                    *(_rng.randrange(2**24, 2**31) for _ in range(6))})
NEGATIVE = [-1, -ROWS, -(2**31 - 1), -(2**31)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
LONG = tuple(1.0 + 0.37 * i for i in range(DIM // 2))
SHORT = tuple(1.0 + 0.01 * i for i in range(DIM // 2))

# rule name -> (the posenc rule, the oracle's keyword arguments; seq_len is the call's largest position + 1)
RULES = {
    "default": (None, {"kind": "none"}),
    "linear": (LinearScaling(4.0), {"kind": "linear", "factor": 4.0}),
    "ntk": (NTKScaling(4.0), {"kind": "ntk", "factor": 4.0}),
    "dynamic": (DynamicNTKScaling(4.0, 1024), {"kind": "dynamic", "factor": 4.0, "original": 1024}),
    "yarn": (YarnScaling(8.0, 1024), {"kind": "yarn", "factor": 8.0, "original": 1024}),
    "llama3": (Llama3Scaling(8.0, 512), {"kind": "llama3", "factor": 8.0, "original": 512}),
    "longrope": (LongRopeScaling(SHORT, LONG, 1024, factor=16.0),
                 {"kind": "longrope", "factor": 16.0, "original": 1024, "short": SHORT, "long": LONG}),
    "proportional": (ProportionalScaling(0.5, factor=2.0), {"kind": "proportional", "partial": 0.5, "factor": 2.0}),
}


@pytest.fixture
def no_float64():
    with forbid_float64():
        yield


@functools.cache
def rope_truth(rule: str, positions: tuple[int, ...], seq_len: int):
    """mpmath ``(a cos(p theta_i), a sin(p theta_i))`` for the rule at ``seq_len``, flat lists in row order."""
    mpmath.mp.prec = 200
    theta, a = theta_rule_mp(DIM, 10000.0, seq_len=seq_len, **RULES[rule][1])
    cos = [a * mpmath.cos(p * t) for p in positions for t in theta]
    sin = [a * mpmath.sin(p * t) for p in positions for t in theta]
    return cos, sin


# ---- RotaryEmbedding: every rule, both layouts, three output dtypes --------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rule", list(RULES))
def test_rotary_forward_within_one_ulp_of_mpmath_up_to_2_31(rule, layout, dtype, no_float64):
    rope = posenc.RotaryEmbedding(DIM, max_seq_len=ROWS, layout=layout, scaling=RULES[rule][0])
    positions = torch.tensor(POSITIONS)
    # unit pairs (x1, x2) = (1, 0): the rotation returns (cos, sin) of each pair exactly, rounded to dtype
    q = torch.zeros(1, 1, len(POSITIONS), DIM, dtype=dtype)
    if layout == "half":
        q[..., : DIM // 2] = 1
    else:
        q[..., 0::2] = 1
    out = rope(q, positions=positions)[0][0, 0]                                     # (S, D)
    cos, sin = (out[:, : DIM // 2], out[:, DIM // 2 :]) if layout == "half" else (out[:, 0::2], out[:, 1::2])
    assert out.dtype == dtype
    truth_cos, truth_sin = rope_truth(rule, tuple(POSITIONS), max(POSITIONS) + 1)
    assert ulp_error(cos, truth_cos, dtype) <= 1.0
    assert ulp_error(sin, truth_sin, dtype) <= 1.0


@pytest.mark.parametrize("rule", list(RULES))
def test_rotary_cos_sin_and_tables_within_one_ulp(rule, no_float64):
    rope = posenc.RotaryEmbedding(DIM, max_seq_len=ROWS, scaling=RULES[rule][0])
    assert not [name for name, b in rope.named_buffers() if b.dtype == torch.float64]
    past = [p for p in POSITIONS if p >= ROWS]
    for positions in ([0, 1, ROWS // 2, ROWS - 1], past, NEGATIVE):
        seq_len = max(max(positions) + 1, 1)
        cos, sin = rope.cos_sin(torch.tensor(positions), seq_len=seq_len)
        truth_cos, truth_sin = rope_truth(rule, tuple(positions), seq_len)
        assert cos.dtype == torch.float32
        assert ulp_error(cos, truth_cos, torch.float32) <= 1.0, positions
        assert ulp_error(sin, truth_sin, torch.float32) <= 1.0, positions


def test_tables_are_built_on_the_host_and_moved_as_float32(no_float64, monkeypatch):
    calls = {"host": 0, "device": 0}
    real_host, real_device = core_exact.sin_cos, exact32.sin_cos

    def host(positions, split, xp=np):
        assert xp is np and isinstance(positions, np.ndarray) and isinstance(split, np.ndarray)
        calls["host"] += 1
        return real_host(positions, split, xp)

    def device(*args, **kwargs):
        calls["device"] += 1
        return real_device(*args, **kwargs)

    monkeypatch.setattr(core_exact, "sin_cos", host)
    monkeypatch.setattr(exact32, "sin_cos", device)
    rope = posenc.RotaryEmbedding(DIM, max_seq_len=64)
    enc = posenc.SinusoidalEncoding(DIM, max_seq_len=64)
    assert calls == {"host": 2, "device": 0}                           # both tables on the host, NumPy float64
    for module in (rope, enc):
        dtypes = {name: b.dtype for name, b in module.named_buffers() if b.is_floating_point()}
        assert torch.float64 not in dtypes.values(), dtypes
    assert rope.packed_table.dtype == torch.float32 and enc.table_main.dtype == torch.float32
    rope(torch.randn(1, 1, 3, DIM), positions=torch.tensor([5, 70, 2**31 - 1]))    # past the table: on the device
    assert calls == {"host": 2, "device": 1}


def test_moving_between_device_kinds_rebuilds_the_frequency_buffers():
    rope = posenc.RotaryEmbedding(DIM, max_seq_len=32, scaling=YarnScaling(4.0, 16))
    assert rope.turns.dtype == torch.float64
    reference = rope.packed_table.clone()
    angles.NO_FLOAT64_DEVICE_TYPES.add("cpu")          # the CPU now "has no float64", as MPS: move there
    try:
        rope.to("cpu")
        assert rope.turns.dtype == torch.float32 and rope.inv_freq_table.dtype == torch.float32
        assert rope.inv_freq.dtype == torch.float64 and rope.inv_freq.device.type == "cpu"   # host frequencies
        assert torch.equal(rope.packed_table, reference)            # host tables equal the float64 device's
        with forbid_float64():
            rope(torch.randn(1, 1, 2, DIM), positions=torch.tensor([3, 2**31 - 1]))
    finally:
        angles.NO_FLOAT64_DEVICE_TYPES.discard("cpu")
    rope.to("cpu")                                                  # back on a device with float64
    assert rope.turns.dtype == torch.float64 and torch.equal(rope.packed_table, reference)


# ---- apply_rope's exact path, sinusoidal encodings ---------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_cos_sin_within_one_ulp(dtype):
    inv_freq, _ = posenc.rope_inv_freq(DIM)                             # host float64 frequencies
    with forbid_float64():
        cos, sin = posenc.rope_cos_sin(torch.tensor(POSITIONS + NEGATIVE), inv_freq, dtype=dtype)
    mpmath.mp.prec = 200
    freqs = [mpmath.mpf(float(f)) for f in inv_freq.tolist()]              # taken as given
    assert ulp_error(cos, [mpmath.cos(p * f) for p in POSITIONS + NEGATIVE for f in freqs], dtype) <= 1.0
    assert ulp_error(sin, [mpmath.sin(p * f) for p in POSITIONS + NEGATIVE for f in freqs], dtype) <= 1.0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["interleaved", "concat", "tensor2tensor"])
def test_sinusoidal_encoding_within_one_ulp(layout, dtype, no_float64):
    dim = 15 if layout == "tensor2tensor" else 14
    got = posenc.sinusoidal_encoding(torch.tensor(POSITIONS + NEGATIVE), dim, layout=layout, dtype=dtype)
    assert got.dtype == dtype
    truth = [v for p in POSITIONS + NEGATIVE for v in sinusoidal_mp(p, dim, 10000.0, layout)]
    assert ulp_error(got, truth, dtype) <= 1.0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sinusoidal_module_table_and_past_it(dtype, no_float64):
    enc = posenc.SinusoidalEncoding(DIM, max_seq_len=ROWS)
    positions = torch.tensor([[0, ROWS - 1, ROWS, 2**31 - 1]])
    out = enc(torch.zeros(1, 4, DIM, dtype=dtype), positions=positions)
    truth = [v for p in positions[0].tolist() for v in sinusoidal_mp(p, DIM)]
    assert out.dtype == dtype and ulp_error(out, truth, dtype) <= 1.0
    table = getattr(enc, {torch.float32: "table_main", torch.bfloat16: "table_bfloat16",
                          torch.float16: "table_float16"}[dtype])[:300]
    assert ulp_error(table, [v for p in range(300) for v in sinusoidal_mp(p, DIM)], dtype) <= 0.501  # rounded once


def test_sincos_nd_tables(no_float64):
    enc = posenc.SinusoidalEncodingND((4, 6), DIM)
    assert enc.axis_sin_cos.dtype == torch.float32
    other = posenc.sincos_table_nd((5, 7), DIM, dtype=torch.bfloat16)
    assert other.dtype == torch.bfloat16 and enc.table_main.dtype == torch.float32
    with pytest.raises(TypeError, match="no float64"):
        posenc.sincos_table_nd((2, 2), DIM, dtype=torch.float64)


def test_float64_outputs_raise_a_clear_error(no_float64):
    with pytest.raises(TypeError, match=r"dtype=torch.float64 is not available on device cpu.*pass torch.float32"):
        posenc.sinusoidal_table(4, DIM, dtype=torch.float64)
    with pytest.raises(TypeError, match="no float64"):
        posenc.SinusoidalEncoding(DIM, dtype=torch.float64)
    with pytest.raises(TypeError, match="no float64"):
        posenc.rope_cos_sin(torch.arange(3), torch.ones(2), dtype=torch.float64)


# ---- multimodal and axial rotary ---------------------------------------------------------------------

def test_mrope_within_one_ulp_past_the_table(no_float64):
    m = posenc.MultimodalRotaryEmbedding(12, [1, 2, 3], max_seq_len=64)
    pos = torch.tensor([[3, 7, 11], [2**31 - 1, 40000, 64], [5, 2**30 + 3, 63]])   # (S, 3)
    cos, sin = m.cos_sin(pos)
    mpmath.mp.prec = 200
    theta = [mpmath.power(10000, -mpmath.mpf(2 * j) / 12) for j in range(6)]
    axes = [0, 1, 1, 2, 2, 2]                                                       # sections [1, 2, 3]
    rows = pos.tolist()
    assert ulp_error(cos, [mpmath.cos(r[axes[j]] * theta[j]) for r in rows for j in range(6)], torch.float32) <= 1
    assert ulp_error(sin, [mpmath.sin(r[axes[j]] * theta[j]) for r in rows for j in range(6)], torch.float32) <= 1


def test_axial_fixed_rows_equal_the_float64_path():
    pos = torch.tensor([[0, 5], [1023, 1024], [2**31 - 1, 77], [123456789, 2**30]])
    want = posenc.AxialRotaryEmbedding((8, 8)).cos_sin(pos)                 # the float64 path
    with forbid_float64():
        got = posenc.AxialRotaryEmbedding((8, 8)).cos_sin(pos)
    for g, w in zip(got, want, strict=True):                                 # both within one ulp of the truth
        assert ((g.double() - w.double()).abs() <= 2 * torch.finfo(torch.float32).eps).all()


def test_axial_learned_angles_are_reduced_without_float64():
    torch.manual_seed(0)
    m = posenc.AxialRotaryEmbedding((8, 8), learned=True, num_heads=2)
    pos = torch.tensor([[0, 5], [1000, 999], [4000, 3]])
    with torch.no_grad():
        f = m.freqs.double().flatten(1)
        ang = pos.double() @ f                                              # float64 on the host side of the test
    with forbid_float64():
        cos, sin = m.cos_sin(pos)                                           # (H, S, h)
        cos.sum().backward()
    want_c = torch.cos(ang).unflatten(-1, (2, 8)).transpose(0, 1)
    want_s = torch.sin(ang).unflatten(-1, (2, 8)).transpose(0, 1)
    # reduced by 2 pi as a double-float: the float32 rounding of the reduced angle, not of p * f
    assert (cos.double() - want_c).abs().max() <= 4e-7 and (sin.double() - want_s).abs().max() <= 4e-7
    assert m.freqs.grad is not None and torch.isfinite(m.freqs.grad).all()
    plain = torch.cos(pos.float() @ m.freqs.detach().flatten(1))           # float32 without the reduction
    assert (plain.double().unflatten(-1, (2, 8)).transpose(0, 1) - want_c).abs().max() > 4e-7


# ---- the float32 algorithm itself, on hard cases --------------------------------------------------------

CONVERGENTS = [22, 333, 355, 103993, 104348, 208341, 312689, 833719, 1146408, 4272943, 5419351, 80143857,
               165707065, 245850922, 411557987, 1068966896]                # p close to a multiple of pi


@pytest.mark.parametrize("freq", [1.0, 0.5, 2.0, 1e-4, 3.0e3])
def test_exact32_near_zeros_of_sine_and_cosine(freq):
    positions = CONVERGENTS + [-p for p in CONVERGENTS] + [2 * p for p in CONVERGENTS if 2 * p <= 2**31]
    digits = torch.from_numpy(core_exact.turns_digits(core_exact.turns_split([freq])).copy())
    with forbid_float64():
        s, c = exact32.sin_cos(torch.tensor(positions), digits)
    mpmath.mp.prec = 200
    f = mpmath.mpf(freq)
    assert ulp_error(s, [mpmath.sin(p * f) for p in positions], torch.float32) <= 1.0
    assert ulp_error(c, [mpmath.cos(p * f) for p in positions], torch.float32) <= 1.0


def test_the_mode_catches_float64_in_posenc():
    with forbid_float64(), pytest.raises(Float64Used, match="posenc"):
        angles.float64_cos_sin(torch.arange(3), torch.ones(2, dtype=torch.float32), 1.0, torch.float32)
    with forbid_float64():
        torch.zeros(2, dtype=torch.float64).sum()                          # the test's own float64 is allowed


def test_xpos_scales_without_float64_match_the_float64_path():
    q, k = torch.randn(1, 2, 5, DIM), torch.randn(1, 2, 5, DIM)
    positions = torch.tensor([0, 7, 300, 4000, 20000])
    want = posenc.RotaryEmbedding(DIM, max_seq_len=64, xpos_scale_base=512.0)(q, k, positions=positions)
    with forbid_float64():
        got = posenc.RotaryEmbedding(DIM, max_seq_len=64, xpos_scale_base=512.0)(q, k, positions=positions)
    for g, w in zip(got, want, strict=True):
        # relative to each row's scale: a rotated value may cancel, both paths round scaled cos/sin to float32
        assert ((g - w).abs() / w.abs().amax(-1, keepdim=True)).max() <= 4e-6


def test_traced_length_rules_without_float64(no_float64):
    # what a compiled graph runs for a length-dependent rule (called directly: compiling is slow)
    rope = posenc.RotaryEmbedding(DIM, max_seq_len=64, scaling=RULES["longrope"][0])
    positions = torch.tensor([3, 2000, 2**31 - 1])
    for seq_len in (100, 2**31):
        got = rope._traced_rule_cos_sin(positions, None, seq_len, torch.float32)
        want = rope.cos_sin(positions, seq_len=seq_len)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    dynamic = posenc.RotaryEmbedding(DIM, max_seq_len=64, scaling=RULES["dynamic"][0])
    with pytest.raises(ValueError, match="needs float64 inside the graph.*run this module eagerly"):
        dynamic._traced_rule_cos_sin(positions, None, 5000, torch.float32)


@pytest.mark.parametrize("make", [
    lambda device: posenc.RotaryEmbedding(DIM, max_seq_len=64, scaling=RULES["longrope"][0], device=device),
    lambda device: posenc.SinusoidalEncoding(DIM, max_seq_len=64, device=device),
    lambda device: posenc.MultimodalRotaryEmbedding(12, [1, 2, 3], max_seq_len=64, device=device),
    lambda device: posenc.AxialRotaryEmbedding((8, 8), max_seq_len=64, device=device),
    lambda device: posenc.SinusoidalEncodingND((4, 6), DIM, device=device),
], ids=["rotary", "sinusoidal", "mrope", "axial", "sincos_nd"])
def test_meta_device_to_empty_and_state_dict(make, no_float64):
    eager = make(None)
    meta = make("meta")
    meta.to_empty(device="cpu")
    meta.reset_buffers()
    built = dict(meta.named_buffers())
    assert sorted(built) == sorted(name for name, _ in eager.named_buffers())
    for name, a in eager.named_buffers():
        assert a.dtype == built[name].dtype != torch.float64 and torch.equal(a, built[name]), name
    assert list(eager.state_dict()) == []                            # the float32 digits are not saved either


# ---- the research encodings that compute angles: FoPE and Sandwich -------------------------------------------


def test_fope_without_float64_matches_the_float64_oracle_at_large_positions():
    from tests.reference import encodings_oracle as ref

    torch.manual_seed(0)
    with forbid_float64():
        fope = posenc.FourierRotaryEmbedding(8, train_len=100, sigma=0.3)
        assert fope.freqs.dtype == torch.float32
        q = torch.randn(1, 2, 4, 10)
        pos = torch.tensor([0, 4097, 2**24 + 1, 2**31 - 1])
        got = fope(q, positions=pos)[0].detach()
    want = ref.fope_rotate(q.numpy(), pos.numpy(), 8, 10000.0, 100, fope.cos_coef.detach().numpy(),
                           fope.sin_coef.detach().numpy())
    # float32 arithmetic of the series and the rotation; a float32 angle at 2**31 would be off by whole radians
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=2e-5)


def test_sandwich_without_float64_matches_the_float64_oracle():
    from tests.reference import encodings_oracle as ref

    qp, kp = [0, 1, 5000, 2**24 + 3], [0, 2, 4999, 2**24]
    with forbid_float64():
        bias = posenc.SandwichBias(4, dim=16)(torch.tensor(qp), torch.tensor(kp))
    assert bias.dtype == torch.float32
    np.testing.assert_allclose(bias.numpy(), ref.sandwich(qp, kp, 16, 4), rtol=0, atol=1e-5)


def test_patch_model_checks_itself_without_float64(no_float64):
    """On a device without float64, patch_model's self-checks and its check of the model's rotate function
    run without creating a float64 tensor (float64 rotations are left to the model's own code), and the
    patched model equals the unpatched one."""
    transformers = pytest.importorskip("transformers")
    from posenc.integrations.transformers import is_patched, patch_model

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 100, (1, 12))
    with torch.no_grad():
        want = model(ids).logits
        steps = model.generate(ids, max_new_tokens=6, do_sample=False)
    patch_model(model)
    assert is_patched(model)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=1e-5)
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), steps)
