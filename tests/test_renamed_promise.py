"""``assume_valid`` is the one name of the in-range promise; ``assume_in_table``, its old name, keeps
working for one release with a ``DeprecationWarning`` that names the new one."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import posenc
from posenc.functional import apply_rope_qk, rms_norm_rope_qk

ROPE = posenc.RotaryEmbedding(8, max_seq_len=16)
Q, K = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
POS = torch.tensor([4, 9, 2])

CALLS = {
    "RotaryEmbedding": lambda **kw: ROPE(Q, K, positions=POS, **kw),
    "RotaryEmbedding.rotate": lambda **kw: ROPE.rotate(Q, positions=POS, **kw),
    "apply_rope_qk": lambda **kw: apply_rope_qk(Q, K, ROPE.cos_table, ROPE.sin_table, positions=POS, **kw),
    "rms_norm_rope_qk": lambda **kw: rms_norm_rope_qk(Q, K, torch.ones(8), torch.ones(8), ROPE.cos_table,
                                                      ROPE.sin_table, positions=POS, **kw),
    "attention": lambda **kw: posenc.attention(Q, K, K, encoding=ROPE, positions=POS, key_positions=POS, **kw),
}


def _same(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", list(CALLS))
def test_the_old_name_warns_and_gives_the_same_result(name):
    call = CALLS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = call(assume_valid=True)
    with pytest.warns(DeprecationWarning, match=r"assume_in_table= is deprecated.*pass assume_valid= instead") as rec:
        old = call(assume_in_table=True)
    assert _same(new, old)
    assert rec[0].filename == __file__                    # the warning points at the caller's line


def test_the_warning_points_at_the_line_of_the_call():
    with pytest.warns(DeprecationWarning) as rec:
        line = inspect.currentframe().f_lineno + 1
        ROPE(Q, K, positions=POS, assume_in_table=True)                   # through nn.Module.__call__
    assert (rec[0].filename, rec[0].lineno) == (__file__, line)
    with pytest.warns(DeprecationWarning) as rec:
        line = inspect.currentframe().f_lineno + 1
        apply_rope_qk(Q, K, ROPE.cos_table, ROPE.sin_table, positions=POS, assume_in_table=True)
    assert (rec[0].filename, rec[0].lineno) == (__file__, line)


@pytest.mark.parametrize("name", list(CALLS))
def test_both_names_raise(name):
    with pytest.raises(TypeError, match="pass assume_valid= only"):
        CALLS[name](assume_valid=True, assume_in_table=True)


@pytest.mark.parametrize("name", list(CALLS))
def test_a_bad_old_value_is_an_error_naming_the_old_name_not_a_warning(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="assume_in_table must be a bool"):
            CALLS[name](assume_in_table="yes")


def test_an_encoding_written_with_the_old_protocol_keyword_still_works():
    class OldStyle:                                       # attention_qk with the keyword's old name
        def attention_qk(self, q, k, *, positions, key_positions, seq_len, offsets, assume_in_table):
            self.seen = assume_in_table
            return q, k

        def attention_bias(self, positions, key_positions, *, num_heads, dtype):
            return None

        def attention_score_mod(self, positions, key_positions, *, num_heads):
            return None

    enc = OldStyle()
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.warns(DeprecationWarning, match="OldStyle.attention_qk takes assume_in_table="):
        out = posenc.attention(q, k, v, encoding=enc, assume_valid=True)
    assert enc.seen is True
    torch.testing.assert_close(out, posenc.attention(q, k, v), rtol=0, atol=0)


def test_patch_model_takes_the_new_name_and_warns_for_the_old_one():
    transformers = pytest.importorskip("transformers")
    from posenc.integrations.transformers import patch_model, unpatch_model

    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        want = model(ids).logits
        patch_model(model, assume_valid=True)
        got = model(ids).logits
        unpatch_model(model)
        with pytest.warns(DeprecationWarning, match="patch_model: assume_in_table= is deprecated"):
            patch_model(model, assume_in_table=True)
        old = model(ids).logits
        unpatch_model(model)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert torch.equal(got, old)
