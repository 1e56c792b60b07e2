"""The decode step's short path (``decode_step`` + ``decode_qk``): the same values as the general
path, within the exactness bound of a float64 oracle, and taken only where it applies."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc._torch import rope_call
from posenc.functional import apply_rope_qk
from tests.reference import rope_oracle

D = 16
TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _qk(shape_q, shape_k, dtype):
    return torch.randn(shape_q, dtype=torch.float64).to(dtype), torch.randn(shape_k, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim, length", [(-2, 1), (-2, 3), (2, 3), (1, 1), (1, 3)])
def test_the_short_path_equals_the_general_path_and_the_oracle(dtype, layout, seq_dim, length):
    rope = posenc.RotaryEmbedding(D, max_seq_len=64, layout=layout)
    if seq_dim == 1:
        q, k = _qk((1, length, 4, D), (1, length, 2, D), dtype)
    else:
        q, k = _qk((1, 4, length, D), (1, 2, length, D), dtype)
    offset = 40
    assert rope_call.decode_step(q, k, seq_dim, D, offset, rope.packed_table, "auto")   # the short path applies
    positions = torch.arange(offset, offset + length)
    general = rope(q, k, positions=positions, seq_dim=seq_dim)                         # the general path
    for short in (rope(q, k, offset=offset, seq_dim=seq_dim),
                  apply_rope_qk(q, k, rope.cos_table, rope.sin_table, offset=offset, layout=layout, seq_dim=seq_dim)):
        for got, want, x in zip(short, general, (q, k), strict=True):
            assert got.dtype == x.dtype and got.shape == x.shape
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            xs = x.transpose(1, 2) if seq_dim == 1 else x                                # oracle: (B, H, S, D)
            ref = rope_oracle.rotate(xs, positions, rope_oracle.default(D, 10000.0), layout)
            ref = ref.transpose(1, 2) if seq_dim == 1 else ref
            torch.testing.assert_close(got.double(), ref, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("case", ["batch-2", "k-none", "partial-rotary", "past-table", "float64", "grad", "triton",
                                  "meta-table"])
def test_the_short_path_declines_what_it_does_not_serve(case):
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    table, offset, backend, dim = posenc.RotaryEmbedding(D, max_seq_len=64).packed_table, 5, "auto", D
    if case == "batch-2":
        q, k = torch.randn(2, 4, 1, D), torch.randn(2, 2, 1, D)
    elif case == "k-none":
        k = None
    elif case == "partial-rotary":
        dim = D // 2
    elif case == "past-table":
        offset = 64
    elif case == "float64":
        q, k = q.double(), k.double()
    elif case == "grad":
        q.requires_grad_(True)
    elif case == "triton":
        backend = "triton"
    elif case == "meta-table":
        table = table.to("meta")
    assert rope_call.decode_step(q, k, -2, dim, offset, table, backend) == 0


@pytest.mark.parametrize("kw, name", [({"seq_len": "long"}, "seq_len"), ({"assume_valid": "yes"}, "assume_valid"),
                                      ({"seq_dim": 3}, "seq_dim"), ({"offset": 2.0}, "offset")])
def test_a_bad_argument_of_a_decode_step_is_still_refused(kw, name):
    rope = posenc.RotaryEmbedding(D, max_seq_len=64)
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    kw = {"offset": 5, **kw}
    with pytest.raises((TypeError, ValueError), match=name):
        rope(q, k, **kw)
    if name != "seq_len":                                  # (apply_rope_qk has no seq_len)
        with pytest.raises((TypeError, ValueError), match=name):
            apply_rope_qk(q, k, rope.cos_table, rope.sin_table, **kw)
