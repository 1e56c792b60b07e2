"""The oracles in ``tests/reference/`` are sharp: a plausible but wrong computation fails them."""

import mpmath
import pytest
import torch

from tests.reference.oracle import assert_within_one_f32_ulp
from tests.reference.rope_oracle import cos_sin_rule_mp


def test_rope_table_oracle_can_fail():
    """The oracle is sharp: a float32-angle cos (what most libraries compute) fails it."""
    dim, p = 8, 2**20 + 7
    with mpmath.workdps(50):
        cos, _ = cos_sin_rule_mp([p], dim, 10000.0, "none", 1.0, 0)
        naive = torch.cos(torch.tensor(float(p)) * torch.tensor([10000.0 ** (-2 * i / dim) for i in range(dim // 2)]))
        with pytest.raises(AssertionError):
            assert_within_one_f32_ulp(naive[None].numpy(), cos, "naive")
