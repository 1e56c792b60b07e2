"""One validation per public call, counted: composed calls (``posenc.attention`` asking an encoding to
rotate or to bias) enter the encodings' trusted internals, never their public methods, so the same
arguments are not checked again (a regression guard: each check is a Python call on every step)."""

from __future__ import annotations

import collections
import sys

import pytest
import torch

import posenc

LIMIT = 10


def count_checks(fn) -> collections.Counter:
    """Calls of posenc functions named ``check_*``/``_check_*`` made by ``fn()``, by name: a first call
    (no plan kept by an earlier test of the process, see posenc._torch.plans, lets it skip validation)."""
    from posenc._torch import plans

    plans.clear()
    counts: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        code = frame.f_code
        name = code.co_name.lstrip("_")
        if event == "call" and "posenc" in code.co_filename and (name.startswith("check") or name == "decode_qk"):
            counts[code.co_name] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return counts


ENCODINGS = {
    "rope": lambda: posenc.RotaryEmbedding(8),
    "rope_yarn": lambda: posenc.RotaryEmbedding(8, scaling=posenc.YarnScaling(4.0, 8)),
    "alibi": lambda: posenc.AlibiBias(4),
    "t5": lambda: posenc.RelativePositionBias(4),
}


@pytest.mark.parametrize("explicit_positions", [False, True])
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_attention_checks_each_argument_once(name, explicit_positions):
    enc = ENCODINGS[name]()
    q, k, v = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    extra = {"positions": torch.arange(6), "key_positions": torch.arange(6)} if explicit_positions else {}
    counts = count_checks(lambda: posenc.attention(q, k, v, encoding=enc, causal=True, **extra))
    assert sum(counts.values()) <= LIMIT, dict(counts)
    assert counts["check_qk"] == 0 and counts["check_call"] == 0, "the encoding re-entered a public method"


def test_packed_attention_checks_each_argument_once():
    rope = posenc.RotaryEmbedding(8)
    q, k = torch.randn(7, 4, 8), torch.randn(7, 2, 8)
    cu = torch.tensor([0, 3, 7])
    counts = count_checks(lambda: posenc.attention(q, k, k, encoding=rope, causal=True, cu_seqlens=cu))
    assert sum(counts.values()) <= LIMIT, dict(counts)
    assert counts["check_qk"] == 0 and counts["check_call"] == 0


@pytest.mark.parametrize("call", ["module offset", "module positions", "apply_rope_qk", "rotate"])
def test_a_rotation_is_checked_once(call):
    rope = posenc.RotaryEmbedding(8)
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    fn = {
        "module offset": lambda: rope(q, k, offset=5),
        "module positions": lambda: rope(q, k, positions=torch.arange(3)),
        "apply_rope_qk": lambda: posenc.apply_rope_qk(q, k, rope.cos_table, rope.sin_table, offset=5),
        "rotate": lambda: rope.rotate(k, key=True, offset=5),
    }[call]
    counts = count_checks(fn)
    if counts["check_qk"] == 0:            # a decode step: checked and decided at once
        assert counts == {"decode_qk": 1}, dict(counts)
    else:
        assert counts["check_qk"] == 1 and counts["check_position_args"] == 1, dict(counts)
        assert sum(counts.values()) <= 7, dict(counts)


def test_the_counter_sees_checks():
    """Negative control: a call that validates is counted (the hook is not blind)."""
    counts = count_checks(lambda: posenc.RotaryEmbedding(8)(torch.randn(1, 1, 2, 8)))
    assert counts["check_qk"] == 1
