"""posenc.nn.LearnedPositionalEmbedding."""

import pytest
import torch

from posenc.functional import sinusoidal_table
from posenc.nn import LearnedPositionalEmbedding


def test_forward_adds_rows_of_the_weight():
    emb = LearnedPositionalEmbedding(16, 4)
    x = torch.randn(3, 5, 4)
    assert torch.equal(emb(x), x + emb.weight[:5])
    assert torch.equal(emb(x, offset=11), x + emb.weight[11:16])


def test_positions_and_batched_positions():
    emb = LearnedPositionalEmbedding(16, 4)
    x = torch.randn(2, 3, 4)
    pos = torch.tensor([[0, 4, 15], [2, 2, 2]])
    assert torch.equal(emb(x, positions=pos), x + emb.weight[pos])
    assert torch.equal(emb(x, positions=torch.arange(3)), emb(x))


def test_sinusoidal_init_equals_the_exact_table():
    emb = LearnedPositionalEmbedding(50, 6, init="sinusoidal")
    assert torch.equal(emb.weight.data, sinusoidal_table(50, 6))


def test_normal_init_has_the_documented_scale_and_zeros_init_is_zero():
    w = LearnedPositionalEmbedding(2000, 64).weight.detach()
    assert 0.018 < float(w.std()) < 0.022 and abs(float(w.mean())) < 0.002
    assert torch.count_nonzero(LearnedPositionalEmbedding(8, 4, init="zeros").weight) == 0


def test_gradients_reach_exactly_the_used_rows():
    emb = LearnedPositionalEmbedding(10, 3)
    x = torch.randn(2, 4, 3)
    g = torch.randn(2, 4, 3)
    emb(x, positions=torch.tensor([1, 1, 5, 9])).backward(g)
    expected = torch.zeros(10, 3)
    expected[1] = g[:, 0].sum(0) + g[:, 1].sum(0)
    expected[5] = g[:, 2].sum(0)
    expected[9] = g[:, 3].sum(0)
    torch.testing.assert_close(emb.weight.grad, expected)


def test_padding_idx_row_is_zero_and_gets_no_gradient():
    emb = LearnedPositionalEmbedding(10, 3, padding_idx=0)
    assert torch.count_nonzero(emb.weight[0]) == 0
    x = torch.randn(1, 3, 3)
    out = emb(x, positions=torch.tensor([0, 1, 2]))
    assert torch.equal(out[0, 0], x[0, 0])
    out.sum().backward()
    assert torch.count_nonzero(emb.weight.grad[0]) == 0
    assert torch.equal(emb.weight.grad[1], torch.ones(3))


def test_past_the_table_raises_value_error_naming_max_seq_len():
    emb = LearnedPositionalEmbedding(8, 4)
    with pytest.raises(ValueError, match=r"max_seq_len=8; build the module with max_seq_len >= 9"):
        emb(torch.zeros(1, 9, 4))
    with pytest.raises(ValueError, match=r"exceed the learned table: max_seq_len=8; build the module with max_seq_len >= 9"):
        emb(torch.zeros(1, 2, 4), offset=7)
    with pytest.raises(ValueError, match=r"max_seq_len=8\), got values in \[0, 8\]"):
        emb(torch.zeros(1, 2, 4), positions=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match=r"got values in \[-1, 0\]"):
        emb(torch.zeros(1, 2, 4), positions=torch.tensor([-1, 0]))


def test_output_dtype_follows_x():
    emb = LearnedPositionalEmbedding(8, 4)
    assert emb(torch.zeros(2, 4, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_meta_device_and_state_dict():
    emb = LearnedPositionalEmbedding(8, 4, device="meta", init="sinusoidal")
    assert emb.weight.is_meta
    emb.to_empty(device="cpu")
    emb.reset_parameters()
    assert torch.equal(emb.weight.data, sinusoidal_table(8, 4))
    assert list(emb.state_dict()) == ["weight"]


def test_compile_fullgraph():
    emb = LearnedPositionalEmbedding(8, 4)
    x = torch.randn(2, 5, 4)
    assert torch.equal(torch.compile(emb, fullgraph=True, backend="eager")(x), emb(x))


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        (dict(max_seq_len=0, dim=4), ValueError, "max_seq_len must be >= 1"),
        (dict(max_seq_len=4, dim=0), ValueError, "dim must be >= 1"),
        (dict(max_seq_len=4, dim=2, init="uniform"), ValueError, "init must be one of"),
        (dict(max_seq_len=4, dim=2, padding_idx=4), ValueError, "padding_idx must be < max_seq_len=4"),
    ],
)
def test_bad_constructor_arguments(kwargs, err, match):
    with pytest.raises(err, match=match):
        LearnedPositionalEmbedding(**kwargs)


@pytest.mark.parametrize(
    "call, err, match",
    [
        (lambda e: e(torch.zeros(1, 2, 5)), ValueError, "last dimension must equal dim=4"),
        (lambda e: e(torch.zeros(1, 2, 4, dtype=torch.int64)), TypeError, "x must be a floating"),
        (lambda e: e(torch.zeros(1, 2, 4), positions=torch.tensor([0.0, 1.0])), TypeError, "positions must hold integers"),
        (lambda e: e(torch.zeros(1, 2, 4), positions=torch.arange(3)), ValueError, "positions must have shape"),
    ],
)
def test_bad_forward_input(call, err, match):
    with pytest.raises(err, match=match):
        call(LearnedPositionalEmbedding(8, 4))
