"""A patched Hugging Face model copied, pickled, saved, reloaded and patched in pieces: it stays patched
and equal, or comes back cleanly unpatched and equal, for every kind of adapter ``patch_model`` has
(rotary, multimodal rotary, BLOOM's and MPT's ALiBi, T5's relative bias).  Tiny random models from
default configurations (tests/hf_zoo.py), no download."""

import copy
import io
import pickle

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")

from posenc.integrations.transformers import is_patched, patch_model, unpatch_model  # noqa: E402
from tests import hf_zoo  # noqa: E402

KINDS = {"rotary": "llama", "mrope": "qwen2_vl", "bloom": "bloom", "mpt": "mpt", "t5": "t5"}


@pytest.fixture(scope="module")
def references():
    """Each kind's unpatched run (prefill, 8 cached steps, tokens)."""
    return {kind: hf_zoo.run(hf_zoo.build(model_type)) for kind, model_type in KINDS.items()}


def _kinds(model):
    return {vars(m)["_posenc_patch"].kind for m in model.modules() if "_posenc_patch" in vars(m)}


def _owners_are_its_own(model):
    """Every replaced method of a patched module calls posenc's code on that same module (not on the
    module it was copied from)."""
    for module in model.modules():
        record = vars(module).get("_posenc_patch")
        for name, _, _ in record.saved if record else ():
            assert vars(module)[name].owner is module, (type(module).__name__, name)


def _assert_equal(got, ref, exact=False):
    atol = 0 if exact else hf_zoo.ATOL
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=atol)
    assert len(got[1]) == len(ref[1]) == hf_zoo.STEPS or ref[0].dim() != 3
    for a, b in zip(got[1], ref[1], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=atol)
    assert got[2] == ref[2]


#: what each kind's model has patched (Qwen2-VL: its text model's M-RoPE and its vision tower's axial RoPE)
PATCHED = {kind: {kind} for kind in KINDS} | {"mrope": {"mrope", "axial"}}


def _patched(kind):
    model = patch_model(hf_zoo.build(KINDS[kind]))
    assert _kinds(model) == PATCHED[kind]
    return model


@pytest.mark.parametrize("kind", list(KINDS))
def test_deepcopy_stays_patched_and_computes_with_its_own_weights(kind, references):
    model = _patched(kind)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():                       # the original changes; the copy must not see it
            p.add_(0.5)
    assert is_patched(twin) and _kinds(twin) == PATCHED[kind]
    _owners_are_its_own(twin)
    _assert_equal(hf_zoo.run(twin), references[kind])
    unpatch_model(twin)
    _assert_equal(hf_zoo.run(twin), references[kind], exact=True)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_saved_and_loaded_stays_patched_and_equal(kind, how, references):
    model = _patched(kind)
    if how == "torch.save":
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
    else:
        loaded = pickle.loads(pickle.dumps(model))
    assert is_patched(loaded) and _kinds(loaded) == PATCHED[kind]
    _owners_are_its_own(loaded)
    _assert_equal(hf_zoo.run(loaded), references[kind])
    unpatch_model(loaded)
    assert not is_patched(loaded)
    _assert_equal(hf_zoo.run(loaded), references[kind], exact=True)


@pytest.mark.parametrize("kind", list(KINDS))
def test_state_dict_round_trip_holds_only_the_models_weights(kind, references):
    model = _patched(kind)
    plain = hf_zoo.build(KINDS[kind], seed=1)                # other weights, unpatched
    assert set(model.state_dict()) == set(plain.state_dict())
    plain.load_state_dict(model.state_dict())
    _assert_equal(hf_zoo.run(plain), references[kind], exact=True)
    other = patch_model(hf_zoo.build(KINDS[kind], seed=1))
    other.load_state_dict(model.state_dict())
    assert _kinds(other) == PATCHED[kind]
    _assert_equal(hf_zoo.run(other), references[kind])


@pytest.mark.parametrize("kind", list(KINDS))
def test_save_pretrained_comes_back_unpatched_and_equal(kind, references, tmp_path):
    model = _patched(kind)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    assert not is_patched(loaded)
    _assert_equal(hf_zoo.run(loaded), references[kind], exact=True)
    _assert_equal(hf_zoo.run(patch_model(loaded)), references[kind])


def _inner(model):
    return model.model if hasattr(model, "model") else getattr(model, "transformer", None) or model.encoder


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("order", ["inner first", "outer first"])
def test_nested_patching_and_unpatching_in_any_order(kind, order, references):
    model = hf_zoo.build(KINDS[kind])
    inner = _inner(model)
    patch_model(inner)
    patch_model(model)                                     # the rest of the model; the inner part stays as it is
    assert _kinds(model) == PATCHED[kind]
    _owners_are_its_own(model)
    _assert_equal(hf_zoo.run(model), references[kind])
    first, second = (inner, model) if order == "inner first" else (model, inner)
    unpatch_model(first)
    _assert_equal(hf_zoo.run(model), references[kind])     # what is left patched still computes the same
    unpatch_model(second)
    assert not is_patched(model)
    _assert_equal(hf_zoo.run(model), references[kind], exact=True)
    patch_model(model)                                     # and it patches again
    _assert_equal(hf_zoo.run(model), references[kind])


def _shares_the_rotary_table(model):
    """Every rotary adapter's cos and sin are views of its RotaryEmbedding's packed table, not copies."""
    from posenc.integrations.transformers._rotary import _RotaryTables

    tables = [m for m in model.modules() if isinstance(m, _RotaryTables)]
    assert tables
    for t in tables:
        base = t.rope.packed_table.untyped_storage().data_ptr()
        assert t.cos.untyped_storage().data_ptr() == base and t.sin.untyped_storage().data_ptr() == base
        torch.testing.assert_close(t.cos, t.rope.cos_table, rtol=0, atol=0)
    return tables


def test_the_rotary_adapter_keeps_no_copy_of_posencs_table_through_casts_copies_and_pickles():
    model = patch_model(hf_zoo.build("llama"))
    _shares_the_rotary_table(model)
    model.to(torch.bfloat16)                                        # tables stay float32, still shared
    assert all(t.cos.dtype == torch.float32 for t in _shares_the_rotary_table(model))
    _shares_the_rotary_table(copy.deepcopy(model))
    _shares_the_rotary_table(pickle.loads(pickle.dumps(model)))
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    _shares_the_rotary_table(torch.load(buffer, weights_only=False))
