"""Every mapping in docs/migrating/ checked against the library it maps from.

Each test builds the peer's object with its own arguments and posenc's with the mapped ones, and
compares the outputs on the same inputs.  Peers compute angles in float32, so their error grows
with the position; posenc's angles are exact, so the two differ by the peer's float32 rounding:
``peer_atol`` (tests/reference/migration.py) bounds it, about ``2 |x| * 7 * 2**-24 * position``.
That bound is far below the order-1 difference of a wrong pair layout or a wrong base, and each
library has a negative control showing that the unmapped default (``layout="half"`` against an
interleaved peer, or the other way round) differs by more than 0.1.

Peers are skipped cleanly when not installed.  Meta's original Llama code is not a package; its
``precompute_freqs_cis``/``apply_rotary_emb`` are written below from their formula.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import posenc
from tests.reference.migration import U32, UBF16, peer_atol, torchtune_module

DTYPE_U = {torch.float32: U32, torch.bfloat16: UBF16}
#: posenc's precomputed rows in these tests (positions past them are computed exactly, as fast to test
#: and as exact as the table; a full 4096-row table would only slow the tests down).
ROWS = 256


def _quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def _close(actual: torch.Tensor, expected: torch.Tensor, atol: float) -> None:
    err = (actual.double() - expected.double()).abs().max().item()
    assert err <= atol, f"max abs difference {err:.3g} exceeds {atol:.3g}"


def _differs(actual: torch.Tensor, expected: torch.Tensor, by: float = 0.1) -> None:
    err = (actual.double() - expected.double()).abs().max().item()
    assert err > by, f"the unmapped default differs by only {err:.3g}; the test would not catch a wrong mapping"


def _qkv(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def _scores(q, k):
    """Attention logits ``q k^T`` over the sequence axis of ``(B, H, S, D)`` tensors, in float64."""
    return q.double() @ k.double().transpose(-1, -2)


# --------------------------------------------------------------------------------------------------
# rotary-embedding-torch (lucidrains): interleaved pairs
# --------------------------------------------------------------------------------------------------

RET_CASES = [
    # (head_dim, rotary dim, theta, interpolate_factor, theta_rescale_factor, offset, seq_before_head_dim, dtype)
    (64, 64, 10000.0, 1.0, 1.0, 0, False, torch.float32),
    (64, 32, 10000.0, 1.0, 1.0, 0, True, torch.float32),          # partial rotary, (B, S, H, D)
    (48, 16, 500000.0, 1.0, 1.0, 3000, False, torch.float32),     # another base, far positions
    (64, 64, 10000.0, 4.0, 1.0, 100, False, torch.float32),       # position interpolation
    (64, 64, 10000.0, 1.0, 2.0, 2000, True, torch.float32),       # NTK-aware base rescale
    (64, 64, 10000.0, 1.0, 1.0, 0, False, torch.bfloat16),        # positions < 256: exact in bfloat16
    (32, 32, 10000.0, 1.0, 1.0, 100, True, torch.bfloat16),
]


def _ret_posenc(rot, theta, interpolate, rescale, **kw):
    scaling = None
    if interpolate != 1.0:
        scaling = posenc.LinearScaling(interpolate)
    elif rescale != 1.0:
        scaling = posenc.NTKScaling(rescale)
    return posenc.RotaryEmbedding(rot, max_seq_len=ROWS, base=theta, scaling=scaling, **kw)


@pytest.mark.parametrize("head_dim, rot, theta, interpolate, rescale, offset, seq_first, dtype", RET_CASES)
def test_rotary_embedding_torch_rotate_queries_or_keys(head_dim, rot, theta, interpolate, rescale, offset, seq_first,
                                                        dtype):
    ret = pytest.importorskip("rotary_embedding_torch")
    S = 40
    shape = (2, S, 3, head_dim) if seq_first else (2, 3, S, head_dim)
    x = _qkv(shape, dtype)
    peer = ret.RotaryEmbedding(rot, theta=theta, interpolate_factor=interpolate, theta_rescale_factor=rescale,
                               seq_before_head_dim=seq_first)
    expected = peer.rotate_queries_or_keys(x, offset=offset)
    rope = _ret_posenc(rot, theta, interpolate, rescale, layout="interleaved")
    seq_dim = 1 if seq_first else -2
    out = rope.rotate(x, offset=offset, seq_dim=seq_dim)
    assert out.dtype == expected.dtype == dtype
    _close(out, expected, peer_atol(offset + S, x.abs().max().item(), output_u=DTYPE_U[dtype]))
    _differs(_ret_posenc(rot, theta, interpolate, rescale).rotate(x, offset=offset, seq_dim=seq_dim), expected)


@pytest.mark.parametrize("theta", [10000.0, 500.0, 500000.0])
@pytest.mark.parametrize("head_dim, rot, seq_first", [(64, 64, False), (64, 32, True), (48, 16, False)])
def test_rotary_embedding_torch_apply_rotary_emb_row(theta, head_dim, rot, seq_first):
    """The guide's ``apply_rotary_emb(freqs, t)`` row, taken literally: ``cos, sin`` from
    ``rope_inv_freq(dim, base=theta)``; without ``base=`` any theta but 10000 is wrong."""
    ret = pytest.importorskip("rotary_embedding_torch")
    S, start = 24, 1000
    positions = torch.arange(start, start + S)
    shape = (2, S, 3, head_dim) if seq_first else (2, 3, S, head_dim)
    t = _qkv(shape)
    freqs = ret.RotaryEmbedding(rot, theta=theta)(positions.float())              # (S, rot)
    if seq_first:
        expected = ret.apply_rotary_emb(freqs[:, None], t, seq_dim=1)
    else:
        expected = ret.apply_rotary_emb(freqs, t)

    def guide_row(base=None):
        kw = {} if base is None else {"base": base}
        cos, sin = posenc.rope_cos_sin(positions, posenc.rope_inv_freq(rot, **kw)[0])   # (S, rot/2)
        if seq_first:
            cos, sin = cos[:, None], sin[:, None]                                         # (S, 1, rot/2)
        return posenc.apply_rope(t, cos, sin, layout="interleaved")

    _close(guide_row(base=theta), expected, peer_atol(start + S, t.abs().max().item()))
    if theta != 10000.0:
        _differs(guide_row(), expected)                                   # the row without base=


def test_rotary_embedding_torch_cached_keys_is_an_offset_for_the_queries():
    ret = pytest.importorskip("rotary_embedding_torch")
    q, k = _qkv((1, 4, 3, 64), seed=1), _qkv((1, 4, 50, 64), seed=2)       # 3 new queries after 47 cached keys
    peer = ret.RotaryEmbedding(64)
    q_exp, k_exp = peer.rotate_queries_with_cached_keys(q, k)
    rope = posenc.RotaryEmbedding(64, max_seq_len=ROWS, layout="interleaved")
    q_out, k_out = rope.rotate(q, offset=50 - 3), rope.rotate(k, key=True)
    atol = peer_atol(50, max(q.abs().max().item(), k.abs().max().item()))
    _close(q_out, q_exp, atol)
    _close(k_out, k_exp, atol)


@pytest.mark.parametrize("seq_first", [False, True])
def test_rotary_embedding_torch_xpos_gives_the_same_scores(seq_first):
    """xPos: rotary-embedding-torch centres the scale's exponent on the middle of the sequence and
    posenc does not, so q and k differ by a per-pair constant factor and its inverse; the scores,
    which see only ``zeta^((m - n) / scale_base)``, are equal."""
    ret = pytest.importorskip("rotary_embedding_torch")
    S = 64
    shape = (1, S, 2, 32) if seq_first else (1, 2, S, 32)
    q, k = _qkv(shape, seed=3), _qkv(shape, seed=4)
    peer = ret.RotaryEmbedding(32, use_xpos=True, xpos_scale_base=64, seq_before_head_dim=seq_first)
    q_exp, k_exp = peer.rotate_queries_and_keys(q, k)
    rope = posenc.RotaryEmbedding(32, max_seq_len=ROWS, layout="interleaved", xpos_scale_base=64)
    q_out, k_out = rope(q, k, seq_dim=1 if seq_first else -2)
    if seq_first:                                                                 # (B, S, H, D) -> (B, H, S, D)
        q_exp, k_exp, q_out, k_out = (t.transpose(1, 2) for t in (q_exp, k_exp, q_out, k_out))
    expected = _scores(q_exp, k_exp)
    scale = expected.abs().max().item()
    _close(_scores(q_out, k_out), expected, 1e-4 * scale)
    _differs(q_out, q_exp, by=1e-3)                     # the individual tensors do differ (the centring)
    plain = posenc.RotaryEmbedding(32, max_seq_len=ROWS, layout="interleaved")(q, k, seq_dim=1 if seq_first else -2)
    if seq_first:
        plain = tuple(t.transpose(1, 2) for t in plain)
    _differs(_scores(*plain), expected)                 # xPos matters


def test_rotary_embedding_torch_bfloat16_positions_round_past_256():
    """What the migration guide states: the peer builds positions in the input dtype, so in
    bfloat16 position 257 becomes 256 (or 258) and its rotations are off by order 1; posenc's are not."""
    ret = pytest.importorskip("rotary_embedding_torch")
    x = _qkv((1, 1, 300, 64), torch.bfloat16)
    peer = ret.RotaryEmbedding(64).rotate_queries_or_keys(x)
    exact = posenc.RotaryEmbedding(64, max_seq_len=ROWS, layout="interleaved").rotate(x.double()).to(torch.bfloat16)
    ours = posenc.RotaryEmbedding(64, max_seq_len=ROWS, layout="interleaved").rotate(x)
    _close(ours, exact, 2 * 2 * x.abs().max().item() * UBF16)
    _differs(peer, exact)


# --------------------------------------------------------------------------------------------------
# x-transformers (lucidrains): interleaved pairs, rotary dim = dim_head // 2 by default
# --------------------------------------------------------------------------------------------------

XT_CASES = [
    # (head_dim, rotary dim, interpolation_factor, base_rescale_factor, first position)
    (64, 32, 1.0, 1.0, 0),                 # x-transformers' default rotary_emb_dim = dim_head // 2
    (64, 64, 1.0, 1.0, 2000),
    (48, 16, 2.0, 1.0, 500),               # position interpolation
    (64, 64, 1.0, 4.0, 1000),              # NTK-aware base rescale
]


@pytest.mark.parametrize("head_dim, rot, interpolation, rescale, start", XT_CASES)
def test_x_transformers_rotary(head_dim, rot, interpolation, rescale, start):
    xt = pytest.importorskip("x_transformers.x_transformers")
    S = 33
    x = _qkv((2, 4, S, head_dim))
    peer = xt.RotaryEmbedding(rot, interpolation_factor=interpolation, base_rescale_factor=rescale)
    freqs, scale = peer(torch.arange(start, start + S))
    expected = xt.apply_rotary_pos_emb(x, freqs, scale)
    rope = _ret_posenc(rot, 10000.0, interpolation, rescale, layout="interleaved")
    _close(rope.rotate(x, offset=start), expected, peer_atol(start + S, x.abs().max().item()))
    _differs(_ret_posenc(rot, 10000.0, interpolation, rescale).rotate(x, offset=start), expected)


def test_x_transformers_rotary_takes_the_last_positions_when_decoding():
    """x-transformers passes the frequencies of every position so far and rotates the last S."""
    xt = pytest.importorskip("x_transformers.x_transformers")
    q = _qkv((1, 2, 1, 32))
    freqs, scale = xt.RotaryEmbedding(32)(torch.arange(0, 77))
    expected = xt.apply_rotary_pos_emb(q, freqs, scale)
    _close(posenc.RotaryEmbedding(32, max_seq_len=ROWS, layout="interleaved").rotate(q, offset=76), expected,
           peer_atol(77, q.abs().max().item()))


def test_x_transformers_xpos_gives_the_same_scores():
    xt = pytest.importorskip("x_transformers.x_transformers")
    S = 48
    q, k = _qkv((1, 2, S, 32), seed=5), _qkv((1, 2, S, 32), seed=6)
    freqs, scale = xt.RotaryEmbedding(32, use_xpos=True, scale_base=64)(torch.arange(S))
    q_exp, k_exp = xt.apply_rotary_pos_emb(q, freqs, scale), xt.apply_rotary_pos_emb(k, freqs, scale ** -1)
    q_out, k_out = posenc.RotaryEmbedding(32, max_seq_len=ROWS, layout="interleaved", xpos_scale_base=64)(q, k)
    expected = _scores(q_exp, k_exp)
    _close(_scores(q_out, k_out), expected, 1e-4 * expected.abs().max().item())


@pytest.mark.parametrize("dim, theta, start", [(64, 10000.0, 0), (32, 500.0, 1000)])
def test_x_transformers_scaled_sinusoidal_is_the_concat_table(dim, theta, start):
    xt = pytest.importorskip("x_transformers.x_transformers")
    S = 20
    peer = xt.ScaledSinusoidalEmbedding(dim, theta=theta)
    expected = peer(torch.zeros(1, S, dim), offset=start)                      # (S, dim), times dim ** -0.5
    table = posenc.sinusoidal_table(S, dim, base=theta, layout="concat", offset=start) * dim ** -0.5
    _close(table, expected, peer_atol(start + S, dim ** -0.5))
    _differs(posenc.sinusoidal_table(S, dim, base=theta, offset=start) * dim ** -0.5, expected, by=0.05)


# --------------------------------------------------------------------------------------------------
# Hugging Face transformers: "half" pairs (rotate_half); every rope_scaling type
# --------------------------------------------------------------------------------------------------

_LLAMA = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)

HF_RULES = [
    # (name, rope_parameters, the posenc rule written from those keys by hand)
    ("default", {"rope_type": "default", "rope_theta": 10000.0}, None),
    ("linear", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, posenc.LinearScaling(4.0)),
    ("dynamic", {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
     posenc.DynamicNTKScaling(2.0, original_max_seq_len=2048)),
    ("yarn", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 512,
              "beta_fast": 32.0, "beta_slow": 1.0},
     posenc.YarnScaling(4.0, original_max_seq_len=512, beta_fast=32.0, beta_slow=1.0)),
    ("llama3", {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 512},
     posenc.Llama3Scaling(8.0, original_max_seq_len=512, low_freq_factor=1.0, high_freq_factor=4.0)),
]


def _hf_rotate(config, q, k, position_ids, cls_path="llama.modeling_llama.LlamaRotaryEmbedding", seq_first=False):
    pytest.importorskip("transformers")
    module_name, cls_name = cls_path.rsplit(".", 1)
    module = __import__(f"transformers.models.{module_name}", fromlist=[cls_name, "apply_rotary_pos_emb"])
    rotary = _quiet(getattr(module, cls_name), config)
    cos, sin = rotary(q, position_ids)                                            # (B, S, D)
    return module.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2 if seq_first else 1)


@pytest.mark.parametrize("name, params, rule", HF_RULES, ids=[r[0] for r in HF_RULES])
@pytest.mark.parametrize("start", [0, 3000])
@pytest.mark.parametrize("seq_first", [False, True], ids=["BHSD", "BSHD"])
def test_transformers_llama_rope_scaling_types(name, params, rule, start, seq_first):
    transformers = pytest.importorskip("transformers")
    config = _quiet(transformers.LlamaConfig, **_LLAMA, rope_parameters=params)
    S = 24
    shape_q, shape_k = ((2, S, 4, 64), (2, S, 2, 64)) if seq_first else ((2, 4, S, 64), (2, 2, S, 64))
    q, k = _qkv(shape_q, seed=7), _qkv(shape_k, seed=8)
    position_ids = torch.arange(start, start + S).expand(2, S)
    q_exp, k_exp = _hf_rotate(config, q, k, position_ids, seq_first=seq_first)
    # the mapping written by hand, and the same read from the config
    rope = posenc.RotaryEmbedding(64, max_seq_len=ROWS, base=params["rope_theta"], scaling=rule)
    assert posenc.rope_scaling_from_hf(config) == (params["rope_theta"], 64, rule)
    seq_dim = 1 if seq_first else -2
    q_out, k_out = rope(q, k, positions=position_ids, seq_dim=seq_dim)
    atol = peer_atol(start + S, max(q.abs().max().item(), k.abs().max().item())) * rope.attention_factor
    _close(q_out, q_exp, atol)
    _close(k_out, k_exp, atol)
    wrong = posenc.RotaryEmbedding(64, max_seq_len=ROWS, base=params["rope_theta"], scaling=rule, layout="interleaved")
    _differs(wrong(q, k, positions=position_ids, seq_dim=seq_dim)[0], q_exp)


@pytest.mark.parametrize("start", [0, 2000])
def test_transformers_longrope_phi3(start):
    transformers = pytest.importorskip("transformers")
    short = [1.0 + 0.1 * i for i in range(16)]
    long = [1.0 + 0.5 * i for i in range(16)]
    config = _quiet(transformers.Phi3Config, hidden_size=128, num_attention_heads=4, max_position_embeddings=4096,
                    original_max_position_embeddings=1024,
                    rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long})
    S = 16
    q, k = _qkv((1, 4, S, 32), seed=9), _qkv((1, 4, S, 32), seed=10)
    position_ids = torch.arange(start, start + S)[None]
    q_exp, k_exp = _hf_rotate(config, q, k, position_ids, "phi3.modeling_phi3.Phi3RotaryEmbedding")
    rule = posenc.LongRopeScaling(short_factor=tuple(short), long_factor=tuple(long), original_max_seq_len=1024,
                                  factor=4.0)
    rope = posenc.RotaryEmbedding(32, max_seq_len=ROWS, scaling=rule)
    q_out, k_out = rope(q, k, positions=position_ids)
    atol = peer_atol(start + S, max(q.abs().max().item(), k.abs().max().item())) * rope.attention_factor
    _close(q_out, q_exp, atol)
    _close(k_out, k_exp, atol)


def test_transformers_gpt_neox_partial_rotary():
    transformers = pytest.importorskip("transformers")
    config = _quiet(transformers.GPTNeoXConfig, hidden_size=256, num_attention_heads=4, rotary_pct=0.25,
                    rotary_emb_base=10000, max_position_embeddings=2048)
    q, k = _qkv((1, 4, 20, 64), seed=11), _qkv((1, 4, 20, 64), seed=12)
    position_ids = torch.arange(500, 520)[None]
    q_exp, k_exp = _hf_rotate(config, q, k, position_ids, "gpt_neox.modeling_gpt_neox.GPTNeoXRotaryEmbedding")
    rope = posenc.RotaryEmbedding(16, max_seq_len=ROWS)                     # rotary dim = 0.25 * 64
    q_out, k_out = rope(q, k, positions=position_ids)
    atol = peer_atol(520, max(q.abs().max().item(), k.abs().max().item()))
    _close(q_out, q_exp, atol)
    _close(k_out, k_exp, atol)
    assert torch.equal(q_out[..., 16:], q[..., 16:])


def test_transformers_bfloat16():
    """transformers rounds cos/sin to bfloat16 before multiplying; posenc rounds the result once."""
    transformers = pytest.importorskip("transformers")
    config = _quiet(transformers.LlamaConfig, **_LLAMA)
    q, k = _qkv((1, 4, 32, 64), torch.bfloat16, 13), _qkv((1, 2, 32, 64), torch.bfloat16, 14)
    position_ids = torch.arange(100, 132)[None]
    q_exp, _ = _hf_rotate(config, q, k, position_ids)
    q_out, _ = posenc.RotaryEmbedding(64, max_seq_len=ROWS)(q, k, positions=position_ids)
    assert q_out.dtype == torch.bfloat16
    xmax = q.abs().max().item()
    _close(q_out, q_exp, 2 * xmax * 3 * UBF16 + peer_atol(132, xmax, output_u=UBF16))   # + their cos/sin rounding
    exact = posenc.RotaryEmbedding(64, max_seq_len=ROWS)(q.double(), positions=position_ids)[0]
    assert (q_out.double() - exact).abs().max() <= (q_exp.double() - exact).abs().max()


# --------------------------------------------------------------------------------------------------
# Meta's original Llama code (interleaved pairs as complex numbers) and checkpoint conversion
# --------------------------------------------------------------------------------------------------


def meta_precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    """``precompute_freqs_cis`` of Meta's reference Llama (github.com/meta-llama/llama, llama/model.py),
    written from its formula: ``exp(i * t * theta^(-2j/dim))`` for ``t < end``, ``j < dim/2``, float32."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    angles = torch.outer(torch.arange(end, dtype=torch.float32), freqs)
    return torch.polar(torch.ones_like(angles), angles)                           # (end, dim/2) complex64


def meta_apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Meta's ``apply_rotary_emb`` for one tensor ``(B, S, H, D)``: features ``(2j, 2j+1)`` are one complex
    number, multiplied by ``freqs_cis`` ``(S, D/2)``."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))          # (B, S, H, D/2)
    rotated = pairs * freqs_cis[None, :, None, :]
    return torch.view_as_real(rotated).flatten(3).type_as(x)


def hf_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The row permutation of transformers' Llama conversion script (``permute`` in
    convert_llama_weights_to_hf.py), written from its formula: within each head, rows
    ``(2j, 2j+1)`` go to ``(j, j + D/2)``."""
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


@pytest.mark.parametrize("start", [0, 5000])
def test_meta_llama_apply_rotary_emb_is_interleaved(start):
    S = 16
    q = _qkv((2, S, 4, 32), seed=15)
    expected = meta_apply_rotary_emb(q, meta_precompute_freqs_cis(32, start + S, 500000.0)[start:])
    rope = posenc.RotaryEmbedding(32, max_seq_len=ROWS, base=500000.0, layout="interleaved")
    _close(rope.rotate(q, offset=start, seq_dim=1), expected, peer_atol(start + S, q.abs().max().item()))
    _differs(posenc.RotaryEmbedding(32, max_seq_len=ROWS, base=500000.0).rotate(q, offset=start, seq_dim=1), expected)


@pytest.mark.parametrize("n_heads, n_kv_heads, start", [(4, 4, 0), (4, 2, 1000)])
def test_meta_checkpoint_converted_for_layout_half(n_heads, n_kv_heads, start):
    """A Meta checkpoint run with posenc's default layout="half": convert wq and wk once with
    convert_rope_weight (wk with the key/value head count) and the attention scores are Meta's."""
    head_dim, hidden, S = 32, 64, 12
    wq, wk = _qkv((n_heads * head_dim, hidden), seed=16) / 8, _qkv((n_kv_heads * head_dim, hidden), seed=17) / 8
    x = _qkv((1, S, hidden), seed=18)
    freqs_cis = meta_precompute_freqs_cis(head_dim, start + S)[start:]
    q_meta = meta_apply_rotary_emb((x @ wq.T).view(1, S, n_heads, head_dim), freqs_cis)
    k_meta = meta_apply_rotary_emb((x @ wk.T).view(1, S, n_kv_heads, head_dim), freqs_cis)
    k_meta = k_meta.repeat_interleave(n_heads // n_kv_heads, dim=2)
    expected = _scores(q_meta.transpose(1, 2), k_meta.transpose(1, 2))

    wq_half = posenc.convert_rope_weight(wq, n_heads, src="interleaved", dst="half")
    wk_half = posenc.convert_rope_weight(wk, n_kv_heads, src="interleaved", dst="half")
    assert torch.equal(wq_half, hf_permute(wq, n_heads)) and torch.equal(wk_half, hf_permute(wk, n_kv_heads))
    rope = posenc.RotaryEmbedding(head_dim, max_seq_len=ROWS)                                         # layout="half"
    q, k = (x @ wq_half.T).view(1, S, n_heads, head_dim), (x @ wk_half.T).view(1, S, n_kv_heads, head_dim)
    q, k = rope(q, k, offset=start, seq_dim=1)
    k = k.repeat_interleave(n_heads // n_kv_heads, dim=2)
    scores = _scores(q.transpose(1, 2), k.transpose(1, 2))
    xmax = max(q_meta.abs().max().item(), k_meta.abs().max().item())
    _close(scores, expected, head_dim * xmax * peer_atol(start + S, xmax))
    # the rotated q is Meta's with each head's features in the half order
    _close(q, q_meta[..., posenc.layout_permutation(head_dim)], peer_atol(start + S, xmax))
    # the same checkpoint without conversion, under layout="half": wrong scores
    q_raw, k_raw = rope((x @ wq.T).view(1, S, n_heads, head_dim), (x @ wk.T).view(1, S, n_kv_heads, head_dim),
                        offset=start, seq_dim=1)
    k_raw = k_raw.repeat_interleave(n_heads // n_kv_heads, dim=2)
    _differs(_scores(q_raw.transpose(1, 2), k_raw.transpose(1, 2)), expected)


# --------------------------------------------------------------------------------------------------
# torchtune: interleaved pairs, (B, S, H, D), input_pos
# --------------------------------------------------------------------------------------------------

TT_CASES = [
    # (dim, base, max_seq_len, input_pos kind, dtype)
    (64, 10000.0, 512, None, torch.float32),
    (32, 500000.0, 4096, "offset", torch.float32),
    (64, 10000.0, 4096, "packed", torch.float32),
    (64, 10000.0, 512, None, torch.bfloat16),
    (32, 10000.0, 4096, "offset", torch.bfloat16),
]


def _input_pos(kind, B, S):
    if kind is None:
        return None
    if kind == "offset":
        return torch.arange(3000, 3000 + S).expand(B, S)
    return torch.cat([torch.arange(S // 2), torch.arange(S - S // 2)]).expand(B, S)     # two packed documents


@pytest.mark.parametrize("dim, base, max_seq_len, kind, dtype", TT_CASES)
def test_torchtune_rotary_positional_embeddings(dim, base, max_seq_len, kind, dtype):
    tt = torchtune_module("modules/position_embeddings.py")
    B, S = 2, 30
    x = _qkv((B, S, 4, dim), dtype, seed=19)
    input_pos = _input_pos(kind, B, S)
    expected = tt.RotaryPositionalEmbeddings(dim, max_seq_len=max_seq_len, base=base)(x, input_pos=input_pos)
    rope = posenc.RotaryEmbedding(dim, max_seq_len=ROWS, base=base, layout="interleaved")
    out = rope.rotate(x, positions=input_pos, seq_dim=1)
    assert out.dtype == dtype
    top = S if input_pos is None else int(input_pos.max()) + 1
    _close(out, expected, peer_atol(top, x.abs().max().item(), output_u=DTYPE_U[dtype]))
    _differs(posenc.RotaryEmbedding(dim, max_seq_len=ROWS, base=base).rotate(x, positions=input_pos, seq_dim=1),
             expected)


@pytest.mark.parametrize("dim, start", [(64, 0), (128, 20000)])
def test_torchtune_llama3_scaled_rope(dim, start):
    tt = torchtune_module("models/llama3_1/_position_embeddings.py")
    S = 16
    x = _qkv((1, S, 2, dim), seed=20)
    peer = tt.Llama3ScaledRoPE(dim, max_seq_len=start + S, base=500000, scale_factor=8, low_freq_factor=1,
                               high_freq_factor=4, old_context_len=8192)
    input_pos = torch.arange(start, start + S)[None]
    expected = peer(x, input_pos=input_pos)
    rule = posenc.Llama3Scaling(8.0, original_max_seq_len=8192, low_freq_factor=1.0, high_freq_factor=4.0)
    rope = posenc.RotaryEmbedding(dim, max_seq_len=ROWS, base=500000.0, layout="interleaved", scaling=rule)
    _close(rope.rotate(x, positions=input_pos, seq_dim=1), expected, peer_atol(start + S, x.abs().max().item()))
    unscaled = posenc.RotaryEmbedding(dim, max_seq_len=ROWS, base=500000.0, layout="interleaved")
    if start:                                                     # the rule matters far from position 0
        _differs(unscaled.rotate(x, positions=input_pos, seq_dim=1), expected)


def test_torchtune_decoding_step_is_an_offset():
    tt = torchtune_module("modules/position_embeddings.py")
    x = _qkv((1, 1, 4, 64), seed=21)
    expected = tt.RotaryPositionalEmbeddings(64, max_seq_len=512)(x, input_pos=torch.tensor([[300]]))
    _close(posenc.RotaryEmbedding(64, max_seq_len=ROWS, layout="interleaved").rotate(x, offset=300, seq_dim=1), expected,
           peer_atol(301, x.abs().max().item()))


# --------------------------------------------------------------------------------------------------
# positional-encodings (tatp22): interleaved sin/cos tables, returned rather than added
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("channels", [64, 10])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_positional_encodings_1d(channels, dtype):
    pe = pytest.importorskip("positional_encodings.torch_encodings")
    S = 300
    x = torch.zeros(2, S, channels, dtype=dtype)
    expected = pe.PositionalEncoding1D(channels)(x)                                # (B, S, ch)
    table = posenc.sinusoidal_table(S, channels, dtype=dtype)
    _close(table.expand(2, S, channels), expected, peer_atol(S, 1.0, output_u=DTYPE_U[dtype]))
    _close(posenc.SinusoidalEncoding(channels, max_seq_len=S)(x), pe.Summer(pe.PositionalEncoding1D(channels))(x),
           peer_atol(S, 1.0, output_u=DTYPE_U[dtype]))
    _differs(posenc.sinusoidal_table(S, channels, layout="concat", dtype=dtype), expected[0])


def test_positional_encodings_1d_odd_channels_use_the_next_even_width():
    """For odd ``ch`` the peer computes ``ch + 1`` columns (frequencies over ``ch + 1``) and drops the last."""
    pe = pytest.importorskip("positional_encodings.torch_encodings")
    expected = pe.PositionalEncoding1D(7)(torch.zeros(1, 50, 7))[0]
    _close(posenc.sinusoidal_table(50, 8)[:, :7], expected, peer_atol(50, 1.0))
    _differs(posenc.sinusoidal_table(50, 7), expected, by=1e-3)      # posenc's own odd width uses d = 7


def _per_axis_table(x, channels):
    """The guide's ``per_axis_table``: positional-encodings' ``PositionalEncoding2D/3D(channels)(x)[0]``
    for ``x`` of shape ``(B, *grid, ch)``, from posenc's 1-D tables: one interleaved block of ``c``
    columns per axis, ``c`` from the constructor's ``channels``, cut to the input's ``ch``."""
    *grid, ch = x.shape[1:]
    n = len(grid)
    c = 2 * math.ceil(channels / (2 * n))
    blocks = []
    for axis, size in enumerate(grid):
        shape = [1] * n + [c]
        shape[axis] = size
        blocks.append(posenc.sinusoidal_table(size, c).view(shape).expand(*grid, c))
    return torch.cat(blocks, dim=-1)[..., :ch]


# (grid, constructor channels, the input's last dimension): the peer cuts its table to the input's,
# which may differ from the constructor's (up to n * c columns)
ND_CASES = [((6, 9), 32, 32), ((5, 7), 30, 30), ((3, 4, 5), 48, 48), ((2, 3, 4), 20, 20),
            ((6, 9), 32, 20), ((5, 7), 30, 32), ((3, 4, 5), 48, 40), ((2, 3, 4), 20, 24), ((4, 5), 10, 7)]


@pytest.mark.parametrize("grid, channels, width", ND_CASES)
def test_positional_encodings_2d_3d_are_per_axis_1d_tables(grid, channels, width):
    pe = pytest.importorskip("positional_encodings.torch_encodings")
    cls = {2: pe.PositionalEncoding2D, 3: pe.PositionalEncoding3D}[len(grid)]
    x = torch.zeros(1, *grid, width)
    expected = cls(channels)(x)[0]
    table = _per_axis_table(x, channels)
    assert table.shape == expected.shape
    _close(table, expected, peer_atol(max(grid), 1.0))
    _close(x + table, pe.Summer(cls(channels))(x), peer_atol(max(grid), 1.0))


def test_positional_encodings_2d_is_sincos_table_nd_with_columns_reordered():
    """posenc's MAE 2-D table holds the same values: ``[concat(y) | concat(x)]`` against the peer's
    ``[interleaved(x) | interleaved(y)]``, for ``channels`` divisible by 4."""
    pe = pytest.importorskip("positional_encodings.torch_encodings")
    X, Y, D = 6, 9, 32
    expected = pe.PositionalEncoding2D(D)(torch.zeros(1, X, Y, D))[0]
    c = D // 2
    to_interleaved = torch.argsort(posenc.layout_permutation(c))
    columns = torch.cat([c + to_interleaved, to_interleaved])
    table = posenc.sincos_table_nd((X, Y), D).view(X, Y, D)[..., columns]
    _close(table, expected, peer_atol(max(X, Y), 1.0))
    _differs(posenc.sincos_table_nd((X, Y), D).view(X, Y, D), expected)


def test_the_test_extra_installs_the_peers():
    """The README's test command installs the ``test`` extra: the peers these tests compare against
    are in it, so that the tests run instead of skipping (torchtune is installed with --no-deps)."""
    tomllib = pytest.importorskip("tomllib")
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    with open(root / "pyproject.toml", "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["test"]
    names = {req.split(">")[0].split("=")[0].split("[")[0].strip().lower() for req in extra}
    assert {"rotary-embedding-torch", "x-transformers", "positional-encodings", "transformers"} <= names


@pytest.mark.parametrize("page, peer", [("rotary-embedding-torch", "rotary_embedding_torch"),
                                        ("x-transformers", "x_transformers"),
                                        ("positional-encodings", "positional_encodings"),
                                        ("transformers", "transformers")])
def test_the_guides_python_blocks_run(page, peer):
    """Each guide's ``python`` blocks, run in order as one script: their assertions compare posenc
    with the peer as a reader would copy them."""
    pytest.importorskip(peer)
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "migrating" / f"{page}.md").read_text("utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert blocks
    namespace: dict = {}
    exec(compile("\n".join(blocks), f"docs/migrating/{page}.md", "exec"), namespace)
