"""posenc.testing.inspect_bias: ALiBi slopes and T5 buckets recovered from a bias's outputs, checked against the
float64 oracles of tests/reference/bias_oracle.py (the paper's slope rule, T5's bucket formula), with the
bug classes planted: slopes for the wrong head count, the power-of-two formula on another head count, slopes in
another order, a bias that depends on absolute positions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posenc
from posenc.testing import BiasReport, inspect_bias
from tests.reference import bias_oracle


def _alibi(slopes, *, symmetric=False, causal_mask=False):
    """ALiBi from the oracle's float64 formula, as a model would compute it (optionally masked ahead)."""
    def fn(q, k):
        bias = torch.from_numpy(bias_oracle.alibi_bias(q.numpy(), k.numpy(), slopes, symmetric=symmetric))
        if causal_mask:
            bias = bias.masked_fill(k[None, None, :] > q[None, :, None], float("-inf"))
        return bias.float()
    return fn


def _t5(weight, **kw):
    def fn(q, k):
        rel = k.numpy()[None, :] - q.numpy()[:, None]
        buckets = torch.from_numpy(bias_oracle.t5_buckets(rel, **kw))
        return weight[buckets].permute(2, 0, 1)                   # (H, S, S_k)
    return fn


@pytest.mark.parametrize("heads", [1, 3, 8, 12, 20])
@pytest.mark.parametrize("form", ["plain", "symmetric", "masked"])
def test_alibi_slopes_are_recovered_and_named(heads, form):
    slopes = bias_oracle.alibi_slopes(heads)
    fn = _alibi(slopes, symmetric=form == "symmetric", causal_mask=form == "masked")
    report = inspect_bias(fn, num_heads=heads, length=128)
    assert report.kind == "alibi" and report.relative
    np.testing.assert_allclose(report.slopes, slopes, rtol=1e-6)
    assert report.slope_rule == f"the paper's slopes for {heads} heads" and report.findings == ()
    assert report.future == {"plain": "same line", "symmetric": "mirrored", "masked": "masked"}[form]


def test_posencs_alibi_module():
    report = inspect_bias(posenc.AlibiBias(num_heads=12), num_heads=12, length=64)
    assert report.slope_rule == "the paper's slopes for 12 heads" and report.findings == ()


def test_slopes_for_the_wrong_head_count_are_named():
    """A rank holding 12 of a 16-head model's heads but computing slopes for 16 and keeping the first 12."""
    report = inspect_bias(_alibi(bias_oracle.alibi_slopes(16)[:12]), num_heads=12, length=64)
    assert report.slope_rule == "the paper's slopes for 16 heads (the first 12)"
    assert any("not for num_heads=12" in f for f in report.findings)


def test_the_power_of_two_formula_on_another_head_count_is_named():
    report = inspect_bias(_alibi([2 ** (-8 * h / 12) for h in range(1, 13)]), num_heads=12, length=64)
    assert report.slope_rule == "2^(-8h/12) for h = 1..12"
    assert any("uses only for a power of two" in f for f in report.findings)


def test_slopes_in_another_order_are_named():
    report = inspect_bias(_alibi(bias_oracle.alibi_slopes(8)[::-1]), num_heads=8, length=64)
    assert any("assigned to other heads" in f for f in report.findings)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (64, 256), (16, 64)])
def test_t5_buckets_are_recovered(bidirectional, num_buckets, max_distance):
    weight = torch.randn(num_buckets, 4, generator=torch.Generator().manual_seed(0))
    fn = _t5(weight, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    report = inspect_bias(fn, num_heads=4, length=512)
    assert report.kind == "buckets" and report.relative and report.findings == ()
    assert report.buckets == (num_buckets, max_distance, bidirectional)
    assert report.future == ("other" if bidirectional else "zero")


def test_posencs_relative_position_bias_module():
    module = posenc.RelativePositionBias(num_heads=2, num_buckets=32, max_distance=128)
    torch.nn.init.normal_(module.weight, generator=torch.Generator().manual_seed(1))
    assert inspect_bias(module, num_heads=2).buckets == (32, 128, True)


def test_buckets_of_no_t5_bucketing_are_reported_with_their_boundaries():
    weight = torch.randn(9, 2, generator=torch.Generator().manual_seed(0))

    def clipped(q, k):                                           # Shaw et al.: distances clipped to [-4, 4]
        rel = (k[None, :] - q[:, None]).clamp(-4, 4) + 4
        return weight[rel].permute(2, 0, 1)

    report = inspect_bias(clipped, num_heads=2, length=64)
    assert report.kind == "buckets" and report.buckets is None
    assert report.boundaries == (-4, -3, -2, -1, 1, 2, 3, 4)
    assert any("match no T5 bucketing" in f for f in report.findings)


def test_a_bias_of_absolute_positions_is_named():
    report = inspect_bias(lambda q, k: (q[:, None] * k[None, :]).float()[None] * 1e-3, num_heads=1, length=32)
    assert not report.relative
    assert any("not only on their distance" in f for f in report.findings)


def test_a_bias_of_key_positions_alone_counts_as_relative():
    """BLOOM adds slope * key_position: a constant per query away from ALiBi, which softmax ignores."""
    slopes = bias_oracle.alibi_slopes(4)
    report = inspect_bias(lambda q, k: (torch.tensor(slopes)[:, None, None] * k.float()[None, None, :])
                          .expand(4, len(q), len(k)), num_heads=4, length=64)
    assert report.relative and report.kind == "alibi" and report.findings == ()


def test_the_printed_report():
    text = str(inspect_bias(_alibi(bias_oracle.alibi_slopes(4)), num_heads=4, length=32))
    assert "kind                  alibi" in text and "slopes" in text and "findings: none" in text
    assert isinstance(inspect_bias(_alibi([0.5]), num_heads=1, length=8), BiasReport)


@pytest.mark.parametrize("mask", [float("-inf"), torch.finfo(torch.float32).min])
def test_a_causal_mask_is_no_bucket_boundary(mask):
    """A causal T5 bias with the future masked, as -inf or as transformers' lowest float."""
    weight = torch.randn(32, 2, generator=torch.Generator().manual_seed(3))
    t5 = _t5(weight, bidirectional=False, num_buckets=32, max_distance=128)

    def masked(q, k):
        return t5(q, k).masked_fill(k[None, None, :] > q[None, :, None], mask)

    report = inspect_bias(masked, num_heads=2)
    assert (report.kind, report.buckets, report.future, report.relative) == ("buckets", (32, 128, False), "masked",
                                                                          True)


def test_alibi_in_bfloat16():
    """BLOOM returns its bias in the model's dtype: slopes within bfloat16's rounding."""
    slopes = bias_oracle.alibi_slopes(8)
    report = inspect_bias(lambda q, k: _alibi(slopes, causal_mask=True)(q, k).to(torch.bfloat16), num_heads=8,
                          length=128)
    assert report.kind == "alibi" and report.slope_rule == "the paper's slopes for 8 heads", str(report)
