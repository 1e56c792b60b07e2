"""Vision towers whose rotary module computes per-axis angles and lays them out with its own
``recomposition_frequencies`` (MiniMax-M3-VL's 3-axis partial rule, SAM3's windows with scaled, non-integer
coordinates, Step3's): ``patch_model`` serves them posenc's exact per-axis cos/sin in the module's layout.

The references are transformers' own classes (tiny random models, nothing downloaded) and a float64 oracle
written from the formula: angle = coordinate * base^(-2j / (2F)) for the module's F frequencies per axis."""

import copy
import io
import logging

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")

from posenc.integrations.transformers import is_patched, patch_model, unpatch_model  # noqa: E402
from tests import hf_zoo  # noqa: E402

TOWERS = ["minimax_m3_vl_vision", "sam3_vit_model", "step3p5_vision"]


def _tower(model_type):
    try:
        model = hf_zoo.build(model_type)
        inputs = hf_zoo._inputs(model, 24)
    except (ImportError, LookupError, AttributeError, TypeError) as e:      # a transformers without the class
        pytest.skip(f"{model_type} cannot be built here: {e}")
    return model, inputs


def _rotary(model):
    return [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")
            and type(m).__module__.startswith("transformers.")]


def _oracle(module, positions):
    """float64 cos/sin of every coordinate, laid out by the module's own recomposition (a permutation and
    repetition of the per-axis values, which this test does not reimplement)."""
    count = module.inv_freq.numel()
    base = float(module.config.rope_parameters["rope_theta"])
    freqs = np.array([base ** (-2.0 * j / (2 * count)) for j in range(count)])
    angle = torch.from_numpy(positions.double().numpy()[..., None] * freqs)
    recompose = type(module).recomposition_frequencies
    return recompose(module, angle.cos()), recompose(module, angle.sin())


@pytest.mark.parametrize("model_type", TOWERS)
def test_per_axis_vision_tower_is_patched_and_equal(model_type):
    model, inputs = _tower(model_type)
    with torch.no_grad():
        want = model(**inputs)[0]
    patch_model(model)
    assert is_patched(model)
    rotary = _rotary(model)
    assert rotary and all("posenc_rope" in m._modules for m in rotary)
    with torch.no_grad():
        got = model(**inputs)[0]
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
    unpatch_model(model)
    with torch.no_grad():
        assert torch.equal(model(**inputs)[0], want)


@pytest.mark.parametrize("model_type", TOWERS)
def test_patched_per_axis_cos_sin_are_exact_far_out(model_type):
    """At coordinates near 3000 posenc's values are within one float32 rounding of the float64 oracle,
    which the model's own float32 angles are not."""
    model, _ = _tower(model_type)
    module = _rotary(model)[0]
    axes = 3 if model_type.startswith("minimax") else 2
    h = torch.arange(3000, 3016)
    positions = torch.stack([h + 7 * a for a in range(axes)], 0 if axes == 3 else -1)
    with torch.no_grad():
        own = module(torch.zeros(1), positions)
        patch_model(model)
        got = module(torch.zeros(1), positions)
    want = _oracle(module, positions)
    for g, o, w in zip(got, own, want, strict=True):
        assert g.dtype == torch.float32
        assert float((g.double() - w).abs().max()) <= 6e-8              # correctly rounded, to half an ulp of 1
        assert float((o.double() - w).abs().max()) > 5e-7               # float32 angles near 3000 are not


def test_sam3_scaled_coordinates_are_not_integers_and_stay_exact():
    """SAM3's global layers scale the window's coordinates by window / grid (a fraction): the patched module
    takes such coordinates and stays correctly rounded."""
    model, _ = _tower("sam3_vit_model")
    patch_model(model)
    layer = next(m for m in model.modules() if hasattr(m, "position_ids") and hasattr(m, "rotary_emb"))
    module = layer.rotary_emb
    assert "posenc_rope" in module._modules
    positions = layer.position_ids * (14 / 24) + 500
    assert positions.is_floating_point() and not torch.equal(positions, positions.round())
    with torch.no_grad():
        got = module(torch.zeros(1), positions)
    want = _oracle(module, positions)
    for g, w in zip(got, want, strict=True):
        assert float((g.double() - w).abs().max()) <= 6e-8


def test_patched_vision_tower_copies_saves_and_loads():
    model, inputs = _tower("minimax_m3_vl_vision")
    with torch.no_grad():
        want = model(**inputs)[0]
    patch_model(model)
    twin = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for m in (twin, loaded):
        assert is_patched(m)
        with torch.no_grad():
            assert torch.allclose(m(**inputs)[0], want, atol=1e-5, rtol=0)


def test_a_module_that_does_more_than_lay_out_is_left_as_its_own(caplog):
    """A rotary module whose forward changes the values after the layout step (here: doubles the angles'
    cosines) is not reproduced, so it stays the model's own and the record says why."""
    model, inputs = _tower("step3p5_vision")
    module = _rotary(model)[0]
    own = type(module).forward

    def forward(self, x, position_ids):
        cos, sin = own(self, x, position_ids)
        return cos * 2.0, sin

    module.__class__ = type("DoubledVisionRotaryEmbedding", (type(module),), {"forward": forward})
    with caplog.at_level(logging.INFO, logger="posenc"):
        patch_model(model)
    assert "posenc_rope" not in module._modules and not is_patched(model)
    assert "is left as the model's own (posenc's axial cos/sin do not reproduce its output)" in caplog.text


def _llama4_oracle(config):
    """Llama 4's vision table from the formula in float64: patch p of a side x side grid takes the angles
    (x + 1) * f_j then (y + 1) * f_j, f_j = base^(-2j / (head_dim / 2)); the class token, last, angle 0."""
    side = config.image_size // config.patch_size
    half = config.hidden_size // config.num_attention_heads // 2
    freqs = np.array([float(config.rope_parameters["rope_theta"]) ** (-2.0 * j / half) for j in range(half // 2)])
    cells = np.arange(side * side)
    angle = np.concatenate([(cells % side + 1)[:, None] * freqs, (cells // side + 1)[:, None] * freqs], -1)
    angle = np.concatenate([angle, np.zeros((1, angle.shape[1]))])
    return torch.from_numpy(np.cos(angle) + 1j * np.sin(angle))[:, None, :]


def test_llama4_vision_tower_is_patched_with_posencs_exact_grid_table():
    model, inputs = _tower("llama4_vision_model")
    with torch.no_grad():
        want = model(**inputs)[0]
    module = _rotary(model)[0]
    patch_model(model)
    assert "posenc_rope" in module._modules
    with torch.no_grad():
        table = module(torch.zeros(1))
        assert torch.allclose(model(**inputs)[0], want, atol=1e-5, rtol=0)
    oracle = _llama4_oracle(model.config)
    assert table.shape == oracle.shape and table.dtype == torch.complex64
    assert float((table.to(torch.complex128) - oracle).abs().max()) <= 1e-7     # each part within half an ulp


def test_a_llama4_table_of_another_rule_is_left_as_its_own(caplog):
    model, inputs = _tower("llama4_vision_model")
    module = _rotary(model)[0]
    module.freqs_ci = module.freqs_ci.conj()                     # the opposite rotation: not Llama 4's rule
    with caplog.at_level(logging.INFO, logger="posenc"):
        patch_model(model)
    assert "posenc_rope" not in module._modules
    assert "posenc's patch-grid cos/sin do not reproduce its table" in caplog.text
