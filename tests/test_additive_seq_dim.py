"""The additive modules take ``(S, B, D)`` embeddings with ``seq_dim=0`` (``nn.Transformer``'s default layout).

Golden values: the paper's formula in float64 NumPy, PE(p, 2i) = sin(p / 10000^(2i/D)), PE(p, 2i+1) = cos(...),
added along the sequence axis (the same row for every batch element)."""

import math

import numpy as np
import pytest
import torch

from posenc.nn import LearnedPositionalEmbedding, SinusoidalEncoding, SinusoidalEncodingND


def _paper(seq_len, dim, offset=0):
    p = np.arange(offset, offset + seq_len, dtype=np.float64)[:, None]
    i = np.arange(dim)[None, :]
    angle = p / 10000.0 ** ((i - i % 2) / dim)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle))


def test_sinusoidal_encodes_the_sequence_axis_of_s_b_d():
    enc = SinusoidalEncoding(8, max_seq_len=64)
    x = torch.zeros(5, 3, 8)                                 # (S, B, D)
    out = enc(x, seq_dim=0, offset=7)
    want = _paper(5, 8, offset=7)
    for b in range(3):                                        # every batch element gets rows 7..11
        assert np.abs(out[:, b].double().numpy() - want).max() < 1e-7
    assert not torch.allclose(enc(x), out)                    # without seq_dim: the batch axis (the trap)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sinusoidal_seq_dim_0_equals_the_batch_first_call(dtype):
    enc = SinusoidalEncoding(8, max_seq_len=64, scale=math.sqrt(8))
    x = torch.randn(6, 2, 8).to(dtype)
    first = enc(x.transpose(0, 1)).transpose(0, 1)
    assert torch.equal(enc(x, seq_dim=0), first)
    assert torch.equal(enc(x, seq_dim=-3), first)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [9, 9, 10, 11, 70, 71]])   # (B, S), past the table too
    assert torch.equal(enc(x, seq_dim=0, positions=positions),
                       enc(x.transpose(0, 1), positions=positions).transpose(0, 1))
    y = x.clone()
    assert enc(y, seq_dim=0, inplace=True) is y and torch.equal(y, first)


def test_learned_and_nd_take_seq_dim():
    learned = LearnedPositionalEmbedding(16, 8)
    x = torch.randn(5, 3, 8)
    assert torch.equal(learned(x, seq_dim=0), learned(x.transpose(0, 1)).transpose(0, 1))
    assert torch.allclose(learned(x, seq_dim=0)[:, 1] - x[:, 1], learned.weight[:5].detach(), atol=1e-6)
    grid = SinusoidalEncodingND((2, 3), 8)
    p = torch.randn(6, 2, 8)
    assert torch.equal(grid(p, seq_dim=0), grid(p.transpose(0, 1)).transpose(0, 1))


@pytest.mark.parametrize("bad", [2, 1.0, "0", None])
def test_a_seq_dim_that_is_not_the_sequence_axis_is_refused(bad):
    enc = SinusoidalEncoding(8, max_seq_len=16)
    with pytest.raises(ValueError, match="seq_dim must be x's sequence axis"):
        enc(torch.zeros(2, 3, 8), seq_dim=bad)
    with pytest.raises(ValueError, match="seq_dim must be x's sequence axis"):
        enc(torch.zeros(3, 8), seq_dim=0 if bad == 2 else bad) if bad != 2 else enc(torch.zeros(3, 8), seq_dim=1)
