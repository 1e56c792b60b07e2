"""Bad inputs of posenc.attention.

Each case either matches an independent float64 reference from ``tests/reference/`` or raises
``ValueError``/``TypeError`` naming the offending argument; any other exception or any warning fails it
(``tests/bad_inputs.py``).  ``tests/test_bad_inputs.py`` walks every public name against these cases.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posenc
from posenc import (
    AlibiBias,
    LearnedPositionalEmbedding,
    RelativePositionBias,
    RotaryEmbedding,
    SinusoidalEncoding,
)
from tests.bad_inputs import (
    INF,
    META,
    NAN,
    Cases,
    arr,
    close,
    rand,
    ref_rope,
    run_case,
)
from tests.reference.bias_oracle import alibi_bias as ref_alibi
from tests.reference.bias_oracle import alibi_slopes as ref_slopes
from tests.reference.bias_oracle import attention as ref_attention
from tests.reference.bias_oracle import t5_buckets as ref_bucket

CASES = Cases()
bad, good = CASES.bad, CASES.good


# ---- attention ------------------------------------------------------------------------------------


def _qkv(b=1, h=2, s=3, d=8, hk=None, sk=None, **kw):
    return rand(b, h, s, d, seed=11, **kw), rand(b, hk or h, sk or s, d, seed=12, **kw), rand(b, hk or h, sk or s, d, seed=13, **kw)


for _id, _call, _exc, _match in [
    ("q-int", lambda: posenc.attention(*(t.long() for t in _qkv())), TypeError, "q must be a floating torch.Tensor"),
    ("k-bool", lambda: (lambda q, k, v: posenc.attention(q, k.bool(), v))(*_qkv()), TypeError, "k must be a floating"),
    ("v-complex", lambda: (lambda q, k, v: posenc.attention(q, k, v.to(torch.complex64)))(*_qkv()), TypeError,
     "v must be a floating"),
    ("q-list", lambda: (lambda q, k, v: posenc.attention(q.tolist(), k, v))(*_qkv()), TypeError, "q must be a floating"),
    ("q-3-d", lambda: (lambda q, k, v: posenc.attention(q[0], k, v))(*_qkv()), ValueError, r"q must have shape \(B, H, S, D\)"),
    ("q-0-d", lambda: (lambda q, k, v: posenc.attention(torch.tensor(1.0), k, v))(*_qkv()), ValueError, "q must have shape"),
    ("dtypes", lambda: (lambda q, k, v: posenc.attention(q.half(), k, v))(*_qkv()), TypeError, "q, k and v must share one dtype"),
    ("k-meta", lambda: (lambda q, k, v: posenc.attention(q, k.to(META), v))(*_qkv()), ValueError, "q, k and v must be on one device"),
    ("head-dim-0", lambda: posenc.attention(*_qkv(d=0)), ValueError, "must have a head dim D >= 1"),
    ("kv-heads-0", lambda: posenc.attention(*_qkv(h=0)), ValueError, "k at least one head"),
    ("gqa", lambda: posenc.attention(*_qkv(h=3, hk=2)), ValueError, "q has 3 heads, not a multiple of k's 2"),
    ("kv-length", lambda: (lambda q, k, v: posenc.attention(q, k, v[:, :, :2]))(*_qkv()), ValueError, "k .* and v .* must agree"),
    ("qk-head-dim", lambda: (lambda q, k, v: posenc.attention(q[..., :6], k, v))(*_qkv()), ValueError,
     "q .* and k .* must agree in batch and head dim"),
    ("causal-str", lambda: posenc.attention(*_qkv(), causal="yes"), TypeError, "causal must be a bool"),
    ("dropout_p-nan", lambda: posenc.attention(*_qkv(), dropout_p=NAN), ValueError, "dropout_p must be finite"),
    ("dropout_p-1", lambda: posenc.attention(*_qkv(), dropout_p=1.0), ValueError, r"dropout_p must be in \[0, 1\)"),
    ("scale-inf", lambda: posenc.attention(*_qkv(), scale=INF), ValueError, "scale must be finite"),
    ("scale-nan", lambda: posenc.attention(*_qkv(), scale=NAN), ValueError, "scale must be finite"),
    ("scale-0", lambda: posenc.attention(*_qkv(), scale=0), ValueError, "scale must be > 0"),
    ("backend", lambda: posenc.attention(*_qkv(), backend="cuda"), ValueError, "backend must be one of"),
    ("keys_rotated-str", lambda: posenc.attention(*_qkv(), keys_rotated="yes"), TypeError, "keys_rotated must be a bool"),
    ("assume_in_table-str", lambda: posenc.attention(*_qkv(), assume_in_table="yes"), TypeError, "assume_in_table must be a bool"),
    ("assume_valid-str", lambda: posenc.attention(*_qkv(), assume_valid="yes"), TypeError, "assume_valid must be a bool"),
    ("seq_len-0", lambda: posenc.attention(*_qkv(), encoding=RotaryEmbedding(8), seq_len=0), ValueError, "seq_len must be >= 1"),
    ("seq_len-float", lambda: posenc.attention(*_qkv(), encoding=RotaryEmbedding(8), seq_len=3.0), TypeError,
     "seq_len must be an int"),
    ("encoding-str", lambda: posenc.attention(*_qkv(), encoding="rope"), TypeError, "encoding must be None"),
    ("encoding-additive", lambda: posenc.attention(*_qkv(), encoding=SinusoidalEncoding(8)), TypeError,
     "SinusoidalEncoding is an additive encoding"),
    ("encoding-learned", lambda: posenc.attention(*_qkv(), encoding=LearnedPositionalEmbedding(4, 8)), TypeError,
     "LearnedPositionalEmbedding is an additive encoding"),
    ("encoding-rotary-dim", lambda: posenc.attention(*_qkv(), encoding=RotaryEmbedding(16)), ValueError,
     "q has head dim 8 < rotary dim 16"),
    ("encoding-alibi-heads", lambda: posenc.attention(*_qkv(), encoding=AlibiBias(3)), ValueError, "AlibiBias has 3 heads"),
    ("encoding-t5-heads", lambda: posenc.attention(*_qkv(), encoding=RelativePositionBias(4)), ValueError,
     "RelativePositionBias has 4 heads"),
    ("encoding-rotary-meta", lambda: posenc.attention(*_qkv(), encoding=RotaryEmbedding(8, device=META)), ValueError,
     "q is on cpu but the tables on meta"),
    ("encoding-alibi-meta", lambda: posenc.attention(*_qkv(), encoding=AlibiBias(2, device=META)), ValueError,
     "slopes is on meta"),
    ("encoding-t5-meta", lambda: posenc.attention(*_qkv(), encoding=RelativePositionBias(2, device=META)), ValueError,
     "the weight on meta"),
    ("bias-int", lambda: posenc.attention(*_qkv(), encoding=torch.zeros(2, 3, 3, dtype=torch.long)), ValueError,
     "a precomputed bias must be a floating"),
    ("bias-shape", lambda: posenc.attention(*_qkv(), encoding=torch.zeros(2, 3, 4)), ValueError, "a precomputed bias must be"),
    ("bias-batch", lambda: posenc.attention(*_qkv(), encoding=torch.zeros(5, 2, 3, 3)), ValueError,
     r"a precomputed bias .* B=1"),
    ("bias-meta", lambda: posenc.attention(*_qkv(), encoding=torch.zeros(2, 3, 3, device=META)), ValueError,
     "precomputed bias .* is on meta"),
    ("key_positions-meta", lambda: posenc.attention(*_qkv(), key_positions=torch.arange(3, device=META), causal=True),
     ValueError, "key_positions are on meta"),
    ("segment_ids-float", lambda: posenc.attention(*_qkv(), segment_ids=torch.zeros(1, 3)), TypeError,
     "segment_ids must be an integer tensor"),
    ("segment_ids-complex", lambda: posenc.attention(*_qkv(), segment_ids=torch.zeros(1, 3, dtype=torch.complex64)),
     TypeError, "segment_ids must hold integers"),
    ("segment_ids-shape", lambda: posenc.attention(*_qkv(), segment_ids=torch.zeros(3, dtype=torch.long)), ValueError,
     r"segment_ids must have shape \(B, S\)"),
    ("segment_ids-meta", lambda: posenc.attention(*_qkv(), segment_ids=torch.zeros(1, 3, dtype=torch.long, device=META)),
     ValueError, "segment_ids are on meta"),
    ("attn_mask-complex", lambda: posenc.attention(*_qkv(), attn_mask=torch.ones(3, 3, dtype=torch.complex64)), TypeError,
     "attn_mask must be"),
    ("attn_mask-shape", lambda: posenc.attention(*_qkv(), attn_mask=torch.ones(1, 1, 1, 3, 3, dtype=torch.bool)), ValueError,
     "attn_mask of shape"),
    ("attn_mask-meta", lambda: posenc.attention(*_qkv(), attn_mask=torch.ones(3, 3, dtype=torch.bool, device=META)),
     ValueError, "attn_mask is on meta"),
    ("flex-attn_mask", lambda: posenc.attention(*_qkv(), attn_mask=torch.ones(3, 3, dtype=torch.bool), backend="flex"),
     ValueError, "backend='flex' takes no attn_mask"),
]:
    bad("attention", _id, _call, _exc, _match)


def _attention_good(case_id, make, kw, want, atol=1e-5):
    def thunk():
        q, k, v = make()
        return posenc.attention(q, k, v, **{k_: (a() if callable(a) and not isinstance(a, torch.nn.Module) else a)
                                            for k_, a in kw.items()}), (q, k, v)
    good("attention", case_id, thunk, lambda r: close(r[0], want(*r[1]), atol=atol))


def _plain(q, k, v, bias=None):
    return ref_attention(arr(q), arr(k), arr(v), bias)


for _id, _make, _kw, _want in [
    ("empty-queries", lambda: _qkv(s=0, sk=3), {"encoding": RotaryEmbedding(8)}, lambda q, k, v: np.zeros((1, 2, 0, 8))),
    ("empty-batch", lambda: _qkv(b=0), {"encoding": AlibiBias(2), "causal": True}, lambda q, k, v: np.zeros((0, 2, 3, 8))),
    ("gqa-rope", lambda: _qkv(h=4, hk=2), {"encoding": RotaryEmbedding(8)},
     lambda q, k, v: _plain(ref_rope(q, np.arange(3)), ref_rope(k, np.arange(3)), v)),
    ("non-contiguous", lambda: tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in _qkv()), {"encoding": RotaryEmbedding(8)},
     lambda q, k, v: _plain(ref_rope(q, np.arange(3)), ref_rope(k, np.arange(3)), v)),
    ("expanded", lambda: tuple(t[:, :1].expand(1, 2, 3, 8) for t in _qkv()), {"encoding": AlibiBias(2)},
     lambda q, k, v: _plain(q, k, v, ref_alibi(np.arange(3), np.arange(3), ref_slopes(2)))),
    ("query-after-cache-alibi", lambda: _qkv(s=1, sk=4), {"encoding": AlibiBias(2), "causal": True},
     lambda q, k, v: _plain(q, k, v, ref_alibi([3], np.arange(4), ref_slopes(2)))),
    ("uint8-mask", lambda: _qkv(), {"attn_mask": lambda: torch.tril(torch.ones(3, 3, dtype=torch.uint8))},
     lambda q, k, v: _plain(q, k, v, np.where(np.tril(np.ones((3, 3))) > 0, 0.0, -np.inf))),
    ("uint8-segments", lambda: _qkv(), {"segment_ids": lambda: torch.tensor([[7, 7, 2]], dtype=torch.uint8),
                                        "encoding": RotaryEmbedding(8)},
     lambda q, k, v: _plain(ref_rope(q, [0, 1, 0]), ref_rope(k, [0, 1, 0]), v,
                            np.where(np.array([[1, 1, 0], [1, 1, 0], [0, 0, 1]]) > 0, 0.0, -np.inf))),
    ("precomputed-float64-bias", lambda: _qkv(), {"encoding": lambda: torch.full((1, 3, 3), 0.5, dtype=torch.float64)},
     lambda q, k, v: _plain(q, k, v)),
    # (NaN in v propagates; torch's CPU flash SDPA kernel itself returns 0, not NaN, for an all-NaN query row)
    ("nan-inf-values", lambda: (lambda q, k, v: (q, k, v.index_put_((torch.tensor(1),), torch.tensor(NAN))))(*_qkv(b=2)),
     {"encoding": AlibiBias(2), "causal": True},
     lambda q, k, v: _plain(q, k, v, ref_alibi(np.arange(3), np.arange(3), ref_slopes(2))
                            + np.where(np.tril(np.ones((3, 3))) > 0, 0.0, -np.inf))),
]:
    _attention_good(_id, _make, _kw, _want)


def _t5_huge():
    q, k, v = _qkv()
    m = RelativePositionBias(2)
    pos = torch.tensor([0, 1, 2**53])
    out = posenc.attention(q, k, v, encoding=m, positions=pos, key_positions=pos)
    w = m.weight.detach().double().numpy()
    p = np.array([0, 1, 2**53], dtype=np.int64)
    bias = np.moveaxis(w[ref_bucket(p[None, :] - p[:, None])], -1, 0)
    return out, _plain(q, k, v, bias)


good("attention", "huge-positions-t5", _t5_huge, lambda r: close(r[0], r[1], atol=1e-5))


@pytest.mark.parametrize("name, thunk, error, check", CASES.params)
def test_bad_input(name, thunk, error, check):
    run_case(thunk, error, check)
