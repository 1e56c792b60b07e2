"""Regression tests: inputs that once gave silently wrong results or crashed deep inside torch.

Every good case is checked against an independent float64 reference written here from the
formulas; every bad case must raise ValueError/TypeError naming the argument.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import posenc
import posenc.functional as F
from posenc import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalEncoding
from tests.reference.oracle import sinusoidal_f64
from tests.reference.rope_oracle import default, rotate_np


def ref_sinusoidal(positions, dim, base=10000.0):
    """The reference table rows (tests/reference/oracle.py)."""
    return sinusoidal_f64(positions, dim, base)


def ref_rope_half(x, positions, base=10000.0):
    """The reference rotation of every feature of x (..., S, d), "half" layout (tests/reference/rope_oracle.py)."""
    return rotate_np(x, positions, default(x.shape[-1], base), "half")


NARROW_INTS = [torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.uint64]


@pytest.mark.parametrize("dtype", NARROW_INTS)
def test_every_integer_dtype_reads_positions_as_numbers_never_as_a_mask(dtype):
    pos = torch.tensor([2, 0, 1]).to(dtype)          # uint8 once indexed like a boolean mask
    x = torch.zeros(1, 3, 6)
    got = SinusoidalEncoding(6, max_seq_len=8)(x, positions=pos)[0]
    np.testing.assert_allclose(got.double().numpy(), ref_sinusoidal([2, 0, 1], 6), atol=1e-7)
    q = torch.randn(1, 1, 3, 8)
    got = RotaryEmbedding(8, max_seq_len=8)(q, positions=pos)[0]
    np.testing.assert_allclose(got.double().numpy(), ref_rope_half(q, [2, 0, 1]), atol=1e-6)
    emb = LearnedPositionalEmbedding(4, 6)
    np.testing.assert_array_equal(emb(x, positions=pos)[0].detach().numpy(), emb.weight[[2, 0, 1]].detach().numpy())
    got = F.sinusoidal_encoding(pos, 6)
    np.testing.assert_allclose(got.double().numpy(), ref_sinusoidal([2, 0, 1], 6), atol=1e-7)


@pytest.mark.parametrize("call", [
    lambda p: RotaryEmbedding(8)(torch.randn(1, 1, 1, 8), positions=p),
    lambda p: SinusoidalEncoding(8)(torch.zeros(1, 1, 8), positions=p),
    lambda p: LearnedPositionalEmbedding(4, 8)(torch.zeros(1, 1, 8), positions=p),
    lambda p: F.apply_rope_qk(torch.randn(1, 1, 1, 8), None, torch.ones(4, 4), torch.zeros(4, 4), positions=p),
])
def test_zero_dim_positions_raise_value_error_naming_positions(call):
    with pytest.raises(ValueError, match="positions must have shape"):
        call(torch.tensor(1))


def test_integer_attn_mask_masks_like_a_boolean_mask():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    mask01 = torch.tril(torch.ones(4, 4, dtype=torch.long))           # transformers' 0/1 masks
    got = posenc.attention(q, k, v, attn_mask=mask01)
    # reference: softmax over allowed keys only, float64
    logits = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(8)
    logits = logits.masked_fill(mask01 == 0, float("-inf"))
    want = torch.softmax(logits, -1) @ v.double()
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    ({"attn_mask": torch.ones(3, 3, dtype=torch.bool)}, "attn_mask of shape"),
    ({"attn_mask": [[1]]}, "attn_mask must be"),
    ({"attn_mask": torch.ones(4, 4, dtype=torch.complex64)}, "attn_mask must be"),
])
def test_attention_rejects_bad_masks_up_front(kwargs, match):
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises((ValueError, TypeError), match=match):
        posenc.attention(q, k, v, encoding=posenc.RotaryEmbedding(8), **kwargs)


def test_attention_rejects_mixed_dtypes_naming_them():
    q = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        posenc.attention(q, q.double(), v)


def test_learned_padding_row_gets_no_gradient_with_default_positions():
    emb = LearnedPositionalEmbedding(8, 4, padding_idx=0)
    x = torch.zeros(2, 5, 4)
    emb(x).sum().backward()
    assert emb.weight.grad[0].abs().sum() == 0                       # the padding row is not trained
    assert emb.weight.grad[1:5].abs().min() > 0                      # the others are
    emb.weight.grad = None
    emb(x[:, :3], offset=2).sum().backward()                         # a slice without the padding row
    assert emb.weight.grad[2:5].abs().min() > 0


@pytest.mark.parametrize("big", [2**31 + 1, 2**40, 2**53])
def test_positions_past_2_31_raise_everywhere(big):
    with pytest.raises(ValueError, match=r"2\*\*31"):
        SinusoidalEncoding(8)(torch.zeros(1, 1, 8), positions=torch.tensor([big]))
    with pytest.raises(ValueError, match=r"2\*\*31"):
        SinusoidalEncoding(8)(torch.zeros(1, 1, 8), offset=big)
    with pytest.raises(ValueError, match=r"2\*\*31"):
        SinusoidalEncoding(8).table(2, offset=big)
    dyn = RotaryEmbedding(8, max_seq_len=16, scaling=posenc.DynamicNTKScaling(2.0, 16))
    for kwargs in ({"positions": torch.tensor([big])}, {"offset": big}, {"positions": torch.tensor([big]), "seq_len": 64}):
        with pytest.raises(ValueError, match=r"2\*\*31"):
            dyn(torch.randn(1, 1, 1, 8), **kwargs)
    with pytest.raises(ValueError, match=r"2\*\*31"):
        dyn.cos_sin(torch.tensor([big]))


def test_inplace_rotation_of_views_of_one_qkv_buffer_rotates_each_once():
    torch.manual_seed(0)
    qkv = torch.randn(1, 5, 3, 2, 8)                                 # (B, S, 3, H, D), fused projection
    want_q = ref_rope_half(qkv[:, :, 0].transpose(1, 2), range(5))
    want_k = ref_rope_half(qkv[:, :, 1].transpose(1, 2), range(5))
    rope = RotaryEmbedding(8)
    for rotate in (lambda q, k: rope(q, k, seq_dim=1, inplace=True),
                   lambda q, k: F.apply_rope_qk(q, k, rope.cos_table, rope.sin_table, seq_dim=1, inplace=True)):
        buf = qkv.clone()
        rotate(buf[:, :, 0], buf[:, :, 1])
        np.testing.assert_allclose(buf[:, :, 0].transpose(1, 2).double().numpy(), want_q, atol=1e-6)
        np.testing.assert_allclose(buf[:, :, 1].transpose(1, 2).double().numpy(), want_k, atol=1e-6)
        torch.testing.assert_close(buf[:, :, 2], qkv[:, :, 2], atol=0, rtol=0)   # v untouched


def test_inplace_with_q_and_k_the_same_tensor_raises():
    x = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="same tensor"):
        RotaryEmbedding(8)(x, x, inplace=True)
    rope = RotaryEmbedding(8)
    with pytest.raises(ValueError, match="same tensor"):
        F.apply_rope_qk(x, x, rope.cos_table, rope.sin_table, inplace=True)


def test_inplace_on_an_expanded_tensor_raises_naming_it():
    x = torch.randn(1, 1, 4, 8).expand(2, 1, 4, 8)
    with pytest.raises(ValueError, match="q has elements that share memory"):
        RotaryEmbedding(8)(x, inplace=True)
    with pytest.raises(ValueError, match="x has elements that share memory"):
        F.apply_rope(x, torch.ones(4, 4), torch.zeros(4, 4), inplace=True)
    with pytest.raises(ValueError, match="x has elements that share memory"):
        SinusoidalEncoding(8)(torch.zeros(1, 4, 8).expand(2, 4, 8), inplace=True)


def test_relative_position_bucket_of_the_most_negative_int64():
    extreme = torch.tensor([-(2**63), 2**63 - 1, -(2**62) - 5])
    for bidirectional in (True, False):
        got = F.relative_position_bucket(extreme, bidirectional=bidirectional).tolist()
        want = [posenc.core.relative.relative_position_bucket(int(r), bidirectional=bidirectional) for r in extreme]
        assert got == want
        assert all(0 <= b < 32 for b in got)


def test_bucket_arguments_are_validated_on_every_call_not_only_on_a_cache_miss():
    F.relative_position_bucket(torch.arange(3))                      # fills the cache for (32, 128, True)
    with pytest.raises(TypeError, match="num_buckets"):
        F.relative_position_bucket(torch.arange(3), num_buckets=32.0)


def test_cos_sin_tables_must_hold_a_frequency_and_be_finite():
    with pytest.raises(ValueError, match="at least one frequency"):
        F.apply_rope(torch.randn(2, 4), torch.zeros(2, 0), torch.zeros(2, 0))
    with pytest.raises(ValueError, match="d/2 >= 1"):
        F.apply_rope_qk(torch.randn(1, 1, 2, 4), None, torch.zeros(4, 0), torch.zeros(4, 0))
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="inv_freq must be finite"):
            F.rope_cos_sin(torch.arange(3), torch.tensor([bad], dtype=torch.float64))
    with pytest.raises(TypeError, match="inv_freq"):
        F.rope_cos_sin(torch.arange(3), torch.tensor([1]))
    with pytest.raises(TypeError, match="dtype"):
        F.rope_cos_sin(torch.arange(3), torch.ones(1, dtype=torch.float64), dtype=torch.int64)


def test_device_mismatch_raises_value_error_with_the_fix():
    meta_rope = RotaryEmbedding(8, device="meta")
    with pytest.raises(ValueError, match="q is on cpu but the tables on meta.*reset_buffers"):
        meta_rope(torch.randn(1, 1, 2, 8))
    with pytest.raises(ValueError, match="x is on cpu but the tables on meta"):
        SinusoidalEncoding(8, device="meta")(torch.zeros(1, 2, 8))
    with pytest.raises(ValueError, match="x is on cpu but the weight on meta"):
        LearnedPositionalEmbedding(4, 8, device="meta")(torch.zeros(1, 2, 8))
    with pytest.raises(ValueError, match="k is on meta but q on cpu"):
        RotaryEmbedding(8)(torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8, device="meta"))
    with pytest.raises(ValueError, match="positions are on meta"):
        RotaryEmbedding(8)(torch.randn(1, 1, 2, 8), positions=torch.arange(2, device="meta"))


@pytest.mark.parametrize("flag", ["inplace", "assume_valid", "assume_in_table"])
def test_boolean_flags_must_be_bools(flag):
    with pytest.raises(TypeError, match=flag):
        RotaryEmbedding(8)(torch.randn(1, 1, 2, 8), **{flag: "yes"})


@pytest.mark.parametrize("shape", [(2, 4, 4), (1, 4, 4), (4, 1, 4)])
def test_apply_rope_refuses_cos_sin_that_would_change_the_output_shape(shape):
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="do not broadcast to x"):
        F.apply_rope(x, torch.ones(shape), torch.zeros(shape))
    out = F.apply_rope(x, torch.ones(4, 4), torch.zeros(4, 4))          # cos = 1, sin = 0: the identity
    assert out.shape == x.shape and torch.equal(out, x)


@pytest.mark.parametrize("encoding", [None, posenc.AlibiBias(2)], ids=["none", "alibi"])
@pytest.mark.parametrize("bad", [0, 2.5, "8"])
def test_attention_checks_seq_len_even_when_the_encoding_ignores_it(encoding, bad):
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises((ValueError, TypeError), match="seq_len"):
        posenc.attention(q, q, q, encoding=encoding, seq_len=bad)
