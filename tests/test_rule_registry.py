"""The one registry of RoPE scaling rules (``posenc.core.rope.SCALINGS``): every registered rule
round-trips through posenc's config dict and through a Hugging Face config, is exported from
``posenc`` and ``posenc.keras``, and is known to the lab.  A new rule that misses one of these
fails here (starting with :data:`SAMPLES`, which must name it).

Expected values are the rules themselves (a round trip gives back an equal rule) and, for the
Hugging Face configs, transformers' own ``ROPE_INIT_FUNCTIONS`` read from the config the rule wrote.
"""

import warnings

import numpy as np
import pytest

import posenc
from posenc.core import rope
from posenc.core.hf_config import rope_scaling_from_hf
from posenc.core.rope import SCALINGS, scaling_from_config, scaling_to_config

#: Instances of every registered rule, with their optional fields set and unset.
SAMPLES = {
    "linear": [rope.LinearScaling(2.0), rope.LinearScaling(7.5)],
    "ntk": [rope.NTKScaling(3.0)],
    "dynamic": [rope.DynamicNTKScaling(2.0, 512)],
    "yarn": [rope.YarnScaling(4.0, 256), rope.YarnScaling(8.0, 1024, beta_fast=16.0, beta_slow=2.0, mscale=0.7,
                                                         mscale_all_dim=0.7, truncate=False),
             rope.YarnScaling(4.0, 256, attention_factor_override=1.25)],
    "llama3": [rope.Llama3Scaling(8.0, 8192), rope.Llama3Scaling(16.0, 8192, low_freq_factor=2.0, high_freq_factor=2.0)],
    "longrope": [rope.LongRopeScaling((1.0, 1.5) * 4, (1.0, 2.0, 4.0, 8.0) * 2, 256, factor=8.0),
                 rope.LongRopeScaling((1.0,) * 8, (2.0,) * 8, 256, factor=4.0, attention_factor_override=1.1),
                 rope.LongRopeScaling((1.0,) * 8, (2.0,) * 8, 256, factor=4.0, attention_factor_override=1.1,
                                      long_attention_factor=1.3)],
    "proportional": [rope.ProportionalScaling(0.25, factor=2.0), rope.ProportionalScaling(1.0)],
}
HEAD = {"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 10000.0}        # head dim 16
CASES = [(name, i, rule) for name, rules in SAMPLES.items() for i, rule in enumerate(rules)]


def _hf_config(rule):
    """A whole config dict: the rule's keys over a small head."""
    config = {**HEAD, **rule.to_hf()}
    config["rope_parameters"] = {"rope_theta": HEAD["rope_theta"], **config["rope_parameters"]}
    return config


def test_every_registered_rule_has_samples_and_a_unique_name():
    assert set(SAMPLES) == set(SCALINGS)
    for name, cls in SCALINGS.items():
        assert cls.name == name and all(type(r) is cls for r in SAMPLES[name])


@pytest.mark.parametrize("name, i, rule", CASES, ids=[f"{n}-{i}" for n, i, _ in CASES])
def test_round_trip_through_posencs_config_dict(name, i, rule):
    config = scaling_to_config(rule)
    assert config["rule"] == name
    assert scaling_from_config(config) == rule


@pytest.mark.parametrize("name, i, rule", CASES, ids=[f"{n}-{i}" for n, i, _ in CASES])
def test_round_trip_through_a_hugging_face_config(name, i, rule):
    config = _hf_config(rule)
    base, dim, back = rope_scaling_from_hf(config)
    assert back == rule and base == 10000.0 and dim == 16
    # the same rule read from transformers' older key (rope_scaling, "type") as well
    params = dict(config.pop("rope_parameters"))
    params["type"] = params.pop("rope_type")
    assert rope_scaling_from_hf({**config, "rope_scaling": params})[2] == rule


def test_the_config_reader_knows_exactly_the_registered_rope_types():
    known = {t for cls in SCALINGS.values() for t in cls.hf_types}
    assert known == set(rope.HF_ROPE_TYPES)
    with pytest.raises(ValueError) as err:
        rope_scaling_from_hf({**HEAD, "rope_parameters": {"rope_type": "no-such-rule"}})
    listed = str(err.value).split("posenc supports ")[1].split(", ")
    assert set(listed) == {"default", *known}
    # every rule a config can name is reached, directly or (static NTK) through another rope type
    reached = {type(r).name for r in (rope_scaling_from_hf(_hf_config(s))[2] for rules in SAMPLES.values()
                                      for s in rules)}
    assert reached == set(SCALINGS)


@pytest.mark.parametrize("name, i, rule", CASES, ids=[f"{n}-{i}" for n, i, _ in CASES])
def test_the_hugging_face_config_a_rule_writes_means_the_same_rule_to_transformers(name, i, rule):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = _hf_config(rule)
    rope_type = config["rope_parameters"]["rope_type"]
    if rope_type not in ROPE_INIT_FUNCTIONS or "model_type" in config:
        pytest.skip(f"{name}: transformers reads this form in one family's model code, not ROPE_INIT_FUNCTIONS")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_config = transformers.LlamaConfig(**config)
    lengths = [None, rule.original_max_seq_len * 2] if rule.length_dependent else [None]
    for seq_len in lengths:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inv, hf_factor = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu", seq_len)
        ours, factor = rope.inv_freq(16, 10000.0, rule, seq_len)
        np.testing.assert_allclose(ours, inv.double().numpy(), rtol=3e-6, atol=0, err_msg=f"seq_len={seq_len}")
        assert factor == pytest.approx(hf_factor, rel=1e-6)


def test_every_registered_rule_is_exported_from_posenc():
    for cls in SCALINGS.values():
        assert getattr(posenc, cls.__name__) is cls
        assert cls.__name__ in posenc.__all__


def test_every_registered_rule_is_exported_from_posenc_keras():
    pytest.importorskip("keras")
    try:
        import posenc.keras as pk
    except ImportError as err:                     # no usable Keras backend here
        pytest.skip(str(err))
    for cls in SCALINGS.values():
        assert getattr(pk, cls.__name__) is cls
        assert cls.__name__ in pk.__all__


def test_every_registered_rule_is_known_to_the_lab():
    from posenc.lab.extend import EXTEND_RULES
    from posenc.lab.lengthgen import ROPE_RULE_NAMES
    from posenc.lab.rules import LAB_RULES, NOT_IN_LAB, lab_rule

    assert set(LAB_RULES) | set(NOT_IN_LAB) == set(SCALINGS)
    assert not set(LAB_RULES) & set(NOT_IN_LAB)
    assert all(reason for reason in NOT_IN_LAB.values())
    # the lab's lists name rules by their registered names (plain "rope" is the extension run's control)
    assert set(ROPE_RULE_NAMES) <= set(LAB_RULES)
    assert set(EXTEND_RULES) - {"rope"} <= set(LAB_RULES)
    for name, build in LAB_RULES.items():
        rule = lab_rule(name, 4.0, 32, 16)
        assert type(rule) is SCALINGS[name] and type(build(4.0, 32, 16)) is SCALINGS[name]
        assert rope.inv_freq(16, 10000.0, rule, 128)[0].shape == (8,)
    with pytest.raises(ValueError, match="unknown rope rule 'pi'"):
        lab_rule("pi", 4.0, 32, 16)
