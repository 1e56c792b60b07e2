"""Clipped relative positions (Shaw et al. 2018): ``posenc.functional.clipped_relative_position`` against a
plain-Python oracle written from the paper, and ``patch_model`` on the learned clipped bias of
Phi-4-multimodal's audio encoder (transformers' own class, built tiny), whose window it finds by
reproducing the module, not by assuming it."""

import copy
import io
import logging
import pickle

import pytest
import torch

from posenc.functional import clipped_relative_position


def _oracle(distance: int, low: int, high: int, symmetric: bool) -> int:
    clipped = min(max(distance, low), high)
    return abs(clipped) if symmetric else clipped - low


@pytest.mark.parametrize(("high", "low", "symmetric"), [(2, None, False), (4, -4, True), (3, -4, False),
                                                        (0, 0, False), (5, -2, True)])
def test_clipped_relative_position_is_the_papers_window(high, low, symmetric):
    distances = list(range(-12, 13)) + [-(2**40), 2**40]
    got = clipped_relative_position(torch.tensor(distances), max_distance=high, min_distance=low, symmetric=symmetric)
    want = [_oracle(d, -high if low is None else low, high, symmetric) for d in distances]
    assert got.dtype == torch.int64 and got.tolist() == want


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"max_distance": -1}, ValueError, r"max_distance must be >= 0 .*got -1"),
    ({"max_distance": 2.0}, TypeError, r"max_distance must be an int, got 2.0"),
    ({"max_distance": 2, "min_distance": 1}, ValueError, r"min_distance must be <= 0 .*got 1"),
    ({"max_distance": 2, "symmetric": 1}, TypeError, r"symmetric must be a bool, got 1"),
])
def test_clipped_relative_position_names_a_bad_window(kwargs, error, match):
    with pytest.raises(error, match=match):
        clipped_relative_position(torch.tensor([0, 1]), **kwargs)


def test_clipped_relative_position_refuses_float_distances():
    with pytest.raises((TypeError, ValueError), match="relative_position"):
        clipped_relative_position(torch.tensor([0.5]), max_distance=2)


transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")
phi4 = pytest.importorskip("transformers.models.phi4_multimodal.modeling_phi4_multimodal",
                           reason="this transformers has no Phi-4-multimodal")

from posenc.integrations.transformers import is_patched, patch_model, unpatch_model  # noqa: E402
from tests import hf_zoo  # noqa: E402


def _bias_module(max_distance: int = 20, symmetric: bool = False) -> torch.nn.Module:
    config = phi4.Phi4MultimodalAudioConfig(num_attention_heads=2, bias_max_distance=max_distance,
                                            bias_symmetric=symmetric)
    torch.manual_seed(0)
    return phi4.Phi4MultimodalAudioRelativeAttentionBias(config).eval()


class _Holder(torch.nn.Module):
    def __init__(self, bias: torch.nn.Module) -> None:
        super().__init__()
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bias(x)


@pytest.mark.parametrize("length", [1, 5, 21, 45])
def test_phi4_audio_bias_is_patched_and_equal_past_both_edges_of_its_window(length):
    holder = _Holder(_bias_module(20))
    x = torch.zeros(1, length, 3)
    want = holder(x)
    patch_model(holder)
    assert is_patched(holder)
    got = holder(x)
    assert got.shape == want.shape == (1, 2, length, length) and torch.equal(got, want)
    unpatch_model(holder)
    assert not is_patched(holder) and torch.equal(holder(x), want)


def test_a_window_of_the_papers_shape_is_found_too():
    """A module clipping to [-M, M] (the paper's 2M + 1 rows) instead of Phi-4's [-M, M - 1] is reproduced
    with that window: the adapter tries both and keeps the one equal to the module."""
    class PaperWindow(phi4.Phi4MultimodalAudioRelativeAttentionBias):
        def __init__(self, config):
            super().__init__(config)
            self.bias_values = torch.nn.Embedding(2 * self.max_distance + 1, config.num_attention_heads)

        def forward(self, x):
            pos = torch.arange(x.size(1))
            rel = (pos[None, :] - pos[:, None]).clamp(-self.max_distance, self.max_distance) + self.max_distance
            return self.bias_values(rel).permute(2, 0, 1).unsqueeze(0)

    torch.manual_seed(0)
    holder = _Holder(PaperWindow(phi4.Phi4MultimodalAudioConfig(num_attention_heads=2, bias_max_distance=6)).eval())
    x = torch.zeros(1, 15, 3)
    want = holder(x)
    patch_model(holder)
    assert torch.equal(holder(x), want)


def test_a_module_that_clips_otherwise_is_refused_and_left_as_it_was():
    class Other(phi4.Phi4MultimodalAudioRelativeAttentionBias):
        def forward(self, x):
            pos = torch.arange(x.size(1))
            rel = (pos[None, :] - pos[:, None]).clamp(-3, 2) + self.num_buckets // 2     # not its max_distance
            return self.bias_values(rel).permute(2, 0, 1).unsqueeze(0)

    torch.manual_seed(0)
    holder = _Holder(Other(phi4.Phi4MultimodalAudioConfig(num_attention_heads=2, bias_max_distance=6)).eval())
    with pytest.raises(ValueError, match=r"does not reproduce the model's relative bias; the model is left unpatched"):
        patch_model(holder)
    assert not is_patched(holder)


def test_a_patched_bias_copies_pickles_and_logs_one_record(caplog):
    holder = _Holder(_bias_module(20))
    x = torch.zeros(1, 30, 3)
    want = holder(x)
    with caplog.at_level(logging.INFO, logger="posenc"):
        patch_model(holder)
    records = [r for r in caplog.records if r.name.startswith("posenc")]
    assert len(records) == 1 and "clipped relative position bias" in records[0].getMessage()
    twin = copy.deepcopy(holder)
    buffer = io.BytesIO()
    torch.save(holder, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    again = pickle.loads(pickle.dumps(holder))
    for m in (twin, loaded, again):
        assert is_patched(m) and torch.equal(m(x), want)


def test_the_tiny_phi4_audio_encoder_is_equal_when_patched():
    record = hf_zoo.check("phi4_multimodal_audio")
    if record["status"] in ("not built", "not run"):
        pytest.skip(f"phi4_multimodal_audio cannot be {record['status'].split()[1]} here: {record['reason']}")
    assert record["status"] == "equal" and record["patched"] == ["clipped"], record
    assert record["prefill_diff"] == 0.0
