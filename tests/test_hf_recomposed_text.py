"""Text rotary modules that keep one row of positions per axis and lay the per-axis angles out with their own
``recomposition_frequencies``: NeoMME (two interleaved axes, one spectrum per layer type), HunYuan-VL's
M-RoPE (whose sections take the duplicated half from the other axes, which posenc's multimodal rule does not
express) and ERNIE 4.5-VL's (its frequencies stored in another order).  ``patch_model`` accepts both, with posenc's exact per-axis values in the module's layout.

The references are transformers' own classes (tiny random models, nothing downloaded) and a float64 oracle
written from the formula."""

import logging

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")

from posenc.integrations.transformers import patch_model  # noqa: E402
from tests import hf_zoo  # noqa: E402

TYPES = ["neomme", "hunyuan_vl_text", "ernie4_5_vl_moe_text"]


def _model(model_type):
    try:
        return hf_zoo.build(model_type)
    except (ImportError, LookupError, AttributeError, TypeError, KeyError) as e:
        pytest.skip(f"{model_type} cannot be built here: {e}")


def _rotary(model):
    return next(m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")
                and type(m).__module__.startswith("transformers."))


@pytest.mark.parametrize("model_type", TYPES)
def test_the_sweep_finds_the_model_accepted_and_equal(model_type):
    record = hf_zoo.check(model_type)
    if record["status"] in ("not built", "not run"):
        pytest.skip(f"{model_type}: {record['reason']}")
    assert record["status"] == "equal", record
    assert record["patched"] == ["recomposed"]


@pytest.mark.parametrize("model_type", TYPES)
def test_patched_values_are_exact_for_every_layer_type_far_out(model_type, caplog):
    model = _model(model_type)
    module = _rotary(model)
    types = [t for t in sorted(set(getattr(model.config, "layer_types", None) or [])) if
             hasattr(module, f"{t}_inv_freq")] or [None]
    positions = torch.arange(3000, 3024)[None, :]
    x = torch.zeros(1)
    own = {t: module(x, positions) if t is None else module(x, positions, t) for t in types}
    with caplog.at_level(logging.INFO, logger="posenc"):
        patch_model(model)
    assert "posenc_rope" in module._modules
    assert "text per-axis RoPE" in caplog.text
    for t in types:
        inv = getattr(module, f"{t}_inv_freq" if t else "inv_freq")
        base = (model.config.rope_parameters[t] if t else model.config.rope_parameters)["rope_theta"]
        count = inv.numel()
        formula = np.array([float(base) ** (-2.0 * j / (2 * count)) for j in range(count)])
        # the module may keep its frequencies in another order (ERNIE): each slot's nearest formula frequency
        freqs = formula[[int(np.abs(formula - f).argmin()) for f in inv.double().tolist()]]
        assert sorted(freqs) == sorted(formula)
        axes = module._modules["posenc_rope"].axes
        angle = torch.from_numpy(positions.expand(axes, -1, -1).double().numpy()[..., None] * freqs)
        recompose = type(module).recomposition_frequencies
        want = (recompose(module, angle.cos()), recompose(module, angle.sin()))
        got = module(x, positions) if t is None else module(x, positions, t)
        for g, o, w in zip(got, own[t], want, strict=True):
            assert float((g.double() - w).abs().max()) <= 6e-8       # correctly rounded
            assert float((o.double() - w).abs().max()) > 2e-7        # the float32 angles near 3000 are not


def test_a_text_module_that_changes_the_values_outside_its_layout_step_is_still_refused():
    """posenc reproduces what happens before the module's own ``recomposition_frequencies`` (the angles, cos
    and sin); a forward that changes the values elsewhere (here: the cosines doubled after the layout) is not
    reproduced, and the model is refused as before."""
    model = _model("neomme")
    module = _rotary(model)
    own = type(module).forward

    def forward(self, x, position_ids, layer_type=None):
        cos, sin = own(self, x, position_ids, layer_type)
        return cos * 2.0, sin

    module.__class__ = type("ScaledNeoMMERotaryEmbedding", (type(module),), {"forward": forward})
    with pytest.raises(ValueError, match="rotary_emb .* do not reproduce the module's own output"):
        patch_model(model)
    assert "posenc_rope" not in module._modules
