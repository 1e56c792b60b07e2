"""posenc.kernels.torch_mix: the rotation as a 2 x 2 mix per feature pair.  Golden values: a float64
NumPy rotation written from RoFormer's pair formula, and transformers' formula ``x * cos +
rotate_half(x) * sin`` written out here in the input's own dtype (the mix must equal it bit for bit:
the same two products and one addition)."""

import numpy as np
import pytest
import torch

from posenc.kernels.torch_mix import MIX_LAYOUTS, mix_rows, mix_view, rotate_mixed


def _angles(shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).uniform(-50.0, 50.0, shape))


def _oracle(x, angle, layout):
    """float64 rotation of pairs (i, i + h) or (2i, 2i + 1) by ``angle`` (..., h), broadcast like cos."""
    x, angle = x.double().numpy(), angle.numpy()
    h = x.shape[-1] // 2
    a, b = (x[..., :h], x[..., h:]) if layout == "half" else (x[..., 0::2], x[..., 1::2])
    c, s = np.cos(angle), np.sin(angle)
    out_a, out_b = a * c - b * s, a * s + b * c
    if layout == "interleaved":
        return np.stack([out_a, out_b], -1).reshape(out_a.shape[:-1] + (2 * h,))
    return np.concatenate([out_a, out_b], -1)                  # half, and interleaved_to_half (written half-split)


def _model_formula(x, cos, sin, layout):
    """transformers' rotation with full-width cos/sin in x's dtype (rotate_half, or its interleaved twin)."""
    h = x.shape[-1] // 2
    if layout == "interleaved_to_half":                    # DeepSeek-V3: de-interleave, then rotate half-split
        x = x.reshape(*x.shape[:-1], h, 2).transpose(-1, -2).reshape(x.shape)
        layout = "half"
    if layout == "half":
        full_c, full_s = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
        turned = torch.cat([-x[..., h:], x[..., :h]], -1)
    else:
        full_c, full_s = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        turned = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
    return x * full_c + turned * full_s


@pytest.mark.parametrize("heads", [3, 30])                                 # both ways of adding the two slots
@pytest.mark.parametrize("layout", MIX_LAYOUTS)
def test_the_mix_rotates_each_pair_by_its_angle(layout, heads):
    angle = _angles((2, 5, 8))                                             # (B, S, h): other rows per batch element
    cos, sin = torch.cos(angle), torch.sin(angle)
    x = torch.randn(2, heads, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    m = mix_view(mix_rows(cos, sin, layout), layout).unsqueeze(1)           # (B, 1, S, ...) against (B, H, S, D)
    got = rotate_mixed(x, m, layout)
    np.testing.assert_allclose(got.numpy(), _oracle(x, angle[:, None], layout), rtol=0, atol=1e-12)


@pytest.mark.parametrize("rows", [1, 7])                                  # a decode step (a reduction), a prefill
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", MIX_LAYOUTS)
def test_the_mix_equals_the_models_formula_bit_for_bit(layout, dtype, rows):
    angle = _angles((1, rows, 32), seed=2)
    cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
    x = torch.randn(1, rows, 4, 64, generator=torch.Generator().manual_seed(3)).to(dtype).transpose(1, 2)  # a view
    m = mix_view(mix_rows(cos, sin, layout), layout).unsqueeze(1)
    got = rotate_mixed(x, m, layout)
    want = _model_formula(x, cos.unsqueeze(1), sin.unsqueeze(1), layout)
    assert got.dtype == dtype and got.shape == x.shape
    assert torch.equal(got, want)


def test_mix_view_reads_strided_rows():
    """Rows sliced out of wider ones (the integration's one gather of cos, sin and factors) view alike."""
    angle = _angles((6, 4), seed=4)
    rows = mix_rows(torch.cos(angle), torch.sin(angle), "half")
    wide = torch.cat([torch.zeros(6, 5), rows], -1)[:, 5:]                 # the same values, row stride 21
    assert not wide.is_contiguous()
    assert torch.equal(mix_view(wide, "half"), mix_view(rows, "half"))


def test_the_factors_promote_as_cos_would():
    """float32 x with bfloat16 factors gives float32, as ``x * cos`` with bfloat16 cos would."""
    angle = _angles((1, 3, 4), seed=5)
    cos, sin = torch.cos(angle).bfloat16(), torch.sin(angle).bfloat16()
    x = torch.randn(1, 2, 3, 8, generator=torch.Generator().manual_seed(6))
    got = rotate_mixed(x, mix_view(mix_rows(cos, sin, "half"), "half").unsqueeze(1), "half")
    assert got.dtype == torch.float32
    assert torch.equal(got, _model_formula(x, cos.unsqueeze(1), sin.unsqueeze(1), "half"))
