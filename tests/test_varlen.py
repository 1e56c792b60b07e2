"""Packed variable-length batches (flash-attention's ``cu_seqlens``): positions restart per sequence,
so rotating or attending a packed batch equals doing it to each sequence alone."""

import math

import pytest
import torch

import posenc
from posenc.core.rope import DynamicNTKScaling
from posenc.functional import rope as R
from tests.reference import bias_oracle, rope_oracle

CU = torch.tensor([0, 3, 3, 7, 12], dtype=torch.int32)          # lengths 3, 0 (empty), 4, 5
OFFSETS = torch.tensor([2, 9, 0, 5])


def spans(cu):
    """``(i, start, end)`` of every non-empty sequence."""
    b = cu.tolist()
    return [(i, a, z) for i, (a, z) in enumerate(zip(b, b[1:], strict=False)) if z > a]


def tables(rows, dim, dtype=torch.float32):
    inv, _ = R.rope_inv_freq(dim)
    return R.rope_cos_sin(torch.arange(rows), inv, dtype=dtype)


def test_positions_from_cu_seqlens_by_hand():
    assert posenc.positions_from_cu_seqlens(CU).tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4]
    assert posenc.positions_from_cu_seqlens(CU, offset=OFFSETS).tolist() == [2, 3, 4, 0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert posenc.positions_from_cu_seqlens(CU, offset=10).tolist()[:4] == [10, 11, 12, 10]
    assert posenc.positions_from_cu_seqlens(torch.tensor([0, 0]), total=0).tolist() == []


@pytest.mark.parametrize("cu, total, match", [
    (torch.tensor([1, 3]), 3, "start at 0"),
    (torch.tensor([0, 4, 2, 5]), 5, "decrease"),
    (torch.tensor([0, 2, 4]), 5, "end at the number of tokens T=5"),
])
def test_bad_cu_seqlens_values_are_refused(cu, total, match):
    with pytest.raises(ValueError, match=match):
        posenc.positions_from_cu_seqlens(cu, total=total)
    with pytest.raises(ValueError, match=match):
        R.apply_rope_qk(torch.randn(total, 1, 4), None, *tables(8, 4), cu_seqlens=cu)


@pytest.mark.parametrize("cu, err, match", [
    ([0, 3], TypeError, "integer torch.Tensor"),
    (torch.tensor([0.0, 3.0]), TypeError, "int32 or int64"),
    (torch.tensor([0]), ValueError, "N >= 1"),
    (torch.tensor([[0, 3]]), ValueError, r"\(N \+ 1,\)"),
])
def test_bad_cu_seqlens_types_are_refused(cu, err, match):
    with pytest.raises(err, match=match):
        R.apply_rope_qk(torch.randn(3, 1, 4), None, *tables(8, 4), cu_seqlens=cu)


@pytest.mark.float64
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("offset", [0, 3, "per-sequence"])
def test_apply_rope_qk_packed_matches_the_float64_oracle_per_sequence(layout, offset):
    torch.manual_seed(0)
    q, k = torch.randn(12, 3, 10, dtype=torch.float64), torch.randn(12, 1, 10, dtype=torch.float64)   # GQA, rot 8 < 10
    off = OFFSETS if offset == "per-sequence" else offset
    qo, ko = R.apply_rope_qk(q, k, *tables(32, 8, torch.float64), cu_seqlens=CU, offset=off, layout=layout)
    freqs = rope_oracle.default(8, 10000.0)
    for i, a, z in spans(CU):
        start = int(OFFSETS[i]) if offset == "per-sequence" else offset
        pos = list(range(start, start + z - a))
        for got, x in ((qo, q), (ko, k)):
            want = rope_oracle.rotate(x[a:z].transpose(0, 1), pos, freqs, layout).transpose(0, 1)   # (len, H, D)
            torch.testing.assert_close(got[a:z], want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_equals_each_sequence_alone_bit_for_bit(dtype):
    torch.manual_seed(1)
    fused = torch.randn(12, 6, 8).to(dtype)                       # packed qkv projection (T, Hq + 2 Hk, D)
    q, k = fused[:, :4], fused[:, 4:5]                            # strided views
    cos, sin = tables(32, 8)
    qo, ko = R.apply_rope_qk(q, k, cos, sin, cu_seqlens=CU, offset=OFFSETS)
    for i, a, z in spans(CU):
        qa, ka = R.apply_rope_qk(q[a:z][None], k[a:z][None], cos, sin, offset=int(OFFSETS[i]), seq_dim=1)
        assert torch.equal(qo[a:z], qa[0]) and torch.equal(ko[a:z], ka[0])


def test_packed_inplace_rotates_the_given_tensors():
    q, k = torch.randn(12, 2, 8), torch.randn(12, 2, 8)
    cos, sin = tables(32, 8)
    want = R.apply_rope_qk(q, k, cos, sin, cu_seqlens=CU)
    q2, k2 = q.clone(), k.clone()
    out = R.apply_rope_qk(q2, k2, cos, sin, cu_seqlens=CU, inplace=True)
    assert out[0] is q2 and out[1] is k2
    assert torch.equal(q2, want[0]) and torch.equal(k2, want[1])


def test_packed_positions_past_the_table_are_refused_with_the_range():
    with pytest.raises(ValueError, match=r"\[0, 9\]"):
        R.apply_rope_qk(torch.randn(12, 1, 8), None, *tables(8, 8), cu_seqlens=CU, offset=OFFSETS)


@pytest.mark.parametrize("kwargs, err, match", [
    ({"positions": torch.arange(12)}, ValueError, "either cu_seqlens or positions"),
    ({"offset": torch.tensor([1, 2])}, ValueError, r"shape \(4,\)"),
    ({"offset": torch.tensor([1.0, 2, 3, 4])}, TypeError, "integer tensor"),
])
def test_packed_argument_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        R.apply_rope_qk(torch.randn(12, 1, 8), None, *tables(32, 8), cu_seqlens=CU, **kwargs)


def test_packed_needs_3d_tokens_and_matching_keys():
    with pytest.raises(ValueError, match=r"packed tokens \(T, H, D\)"):
        R.apply_rope_qk(torch.randn(1, 12, 1, 8), None, *tables(32, 8), cu_seqlens=CU)
    with pytest.raises(ValueError, match="same tokens T"):
        R.apply_rope_qk(torch.randn(12, 1, 8), torch.randn(11, 1, 8), *tables(32, 8), cu_seqlens=CU)


@pytest.mark.parametrize("rope", [
    pytest.param(lambda: posenc.RotaryEmbedding(8, max_seq_len=64), id="table"),
    pytest.param(lambda: posenc.RotaryEmbedding(8, max_seq_len=4), id="past-the-table"),
    pytest.param(lambda: posenc.RotaryEmbedding(
        8, max_seq_len=4, scaling=DynamicNTKScaling(factor=2.0, original_max_seq_len=4)), id="dynamic-ntk"),
])
def test_rotary_embedding_packed_equals_each_sequence_alone(rope):
    rope = rope()
    torch.manual_seed(2)
    q, k = torch.randn(12, 3, 8), torch.randn(12, 1, 8)
    qo, ko = rope(q, k, cu_seqlens=CU, offset=OFFSETS)
    for i, a, z in spans(CU):
        qa, ka = rope(q[a:z][None], k[a:z][None], offset=int(OFFSETS[i]), seq_dim=1)
        assert torch.equal(qo[a:z], qa[0]) and torch.equal(ko[a:z], ka[0])


@pytest.mark.float64
def test_dynamic_rule_uses_each_sequences_own_length():
    rope = posenc.RotaryEmbedding(8, max_seq_len=4, scaling=DynamicNTKScaling(factor=2.0, original_max_seq_len=4))
    q = torch.randn(9, 1, 8, dtype=torch.float64)
    cu = torch.tensor([0, 3, 9])                                  # lengths 3 (inside the context) and 6 (past it)
    out, _ = rope(q, cu_seqlens=cu)
    for (a, z), length in (((0, 3), 3), ((3, 9), 6)):
        freqs = rope_oracle.dynamic(8, 10000.0, 2.0, 4, length)
        want = rope_oracle.rotate(q[a:z].transpose(0, 1), range(z - a), freqs, "half").transpose(0, 1)
        torch.testing.assert_close(out[a:z], want, rtol=0, atol=1e-12)


def test_rotary_embedding_packed_gradients_match_each_sequence_alone():
    rope = posenc.RotaryEmbedding(8, max_seq_len=32)
    q = torch.randn(12, 2, 8, requires_grad=True)
    g = torch.randn(12, 2, 8)
    (rope(q, cu_seqlens=CU)[0] * g).sum().backward()
    for _, a, z in spans(CU):
        qa = q.detach()[a:z][None].requires_grad_()
        (rope(qa, seq_dim=1)[0] * g[a:z][None]).sum().backward()
        torch.testing.assert_close(q.grad[a:z], qa.grad[0], rtol=0, atol=1e-6)


def _oracle_attention(q, k, v, enc, causal, qpos, kpos):
    """float64 attention of one sequence (q (S, H, D), k/v (S_k, H_kv, D)) with the encoding by hand."""
    H = q.shape[1]
    q4, k4, v4 = (t.transpose(0, 1)[None].double() for t in (q, k, v))
    bias = None
    if isinstance(enc, posenc.RotaryEmbedding):
        freqs = rope_oracle.default(enc.dim, enc.base)
        q4 = rope_oracle.rotate(q4, qpos, freqs, "half")
        k4 = rope_oracle.rotate(k4, kpos, freqs, "half")
    elif isinstance(enc, posenc.AlibiBias):
        slopes = torch.tensor(bias_oracle.alibi_slopes(H), dtype=torch.float64)
        dist = torch.tensor([[kp - qp for kp in kpos] for qp in qpos], dtype=torch.float64)
        bias = slopes[:, None, None] * dist                      # m * (j - i) (symmetric=False)
    allowed = torch.tensor([[kp <= qp for kp in kpos] for qp in qpos]) if causal else None
    return bias_oracle.attention(q4, k4, v4, bias=bias, allowed=allowed)[0].transpose(0, 1)


@pytest.mark.float64
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("make", [lambda: None, lambda: posenc.RotaryEmbedding(8, max_seq_len=64),
                                  lambda: posenc.AlibiBias(4)], ids=["none", "rope", "alibi"])
def test_attention_packed_matches_the_oracle_per_sequence(causal, make):
    enc = make()
    if enc is not None:
        enc = enc.double()
    torch.manual_seed(3)
    q, k, v = (torch.randn(12, h, 8, dtype=torch.float64) for h in (4, 2, 2))   # GQA
    out = posenc.attention(q, k, v, encoding=enc, causal=causal, cu_seqlens=CU)
    assert out.shape == (12, 4, 8)
    for _, a, z in spans(CU):
        pos = list(range(z - a))
        want = _oracle_attention(q[a:z], k[a:z], v[a:z], enc, causal, pos, pos)
        torch.testing.assert_close(out[a:z], want, rtol=0, atol=1e-12)


@pytest.mark.float64
def test_attention_packed_decode_step_against_cached_keys():
    """One new query per sequence after its cached keys: queries sit at the last key position."""
    rope = posenc.RotaryEmbedding(8, max_seq_len=64).double()
    cu_q = torch.tensor([0, 1, 2, 3])
    cu_k = torch.tensor([0, 5, 6, 14])                              # 5, 1 and 8 keys
    q, k, v = torch.randn(3, 2, 8, dtype=torch.float64), *(torch.randn(14, 2, 8, dtype=torch.float64) for _ in "kv")
    out = posenc.attention(q, k, v, encoding=rope, causal=True, cu_seqlens=cu_q, cu_seqlens_k=cu_k)
    for (_, a, z), (_, ak, zk) in zip(spans(cu_q), spans(cu_k), strict=True):
        want = _oracle_attention(q[a:z], k[ak:zk], v[ak:zk], rope, True, [zk - ak - 1], list(range(zk - ak)))
        torch.testing.assert_close(out[a:z], want, rtol=0, atol=1e-12)


def test_attention_packed_with_a_dynamic_rule_equals_each_sequence_alone():
    rope = posenc.RotaryEmbedding(8, max_seq_len=4, scaling=DynamicNTKScaling(factor=2.0, original_max_seq_len=4))
    q, k, v = (torch.randn(12, 2, 8) for _ in "qkv")
    out = posenc.attention(q, k, v, encoding=rope, causal=True, cu_seqlens=CU)
    for _, a, z in spans(CU):
        alone = posenc.attention(*(t[a:z].transpose(0, 1)[None] for t in (q, k, v)), encoding=rope, causal=True)
        torch.testing.assert_close(out[a:z], alone[0].transpose(0, 1), rtol=0, atol=1e-6)


def test_attention_packed_flex_matches_sdpa():
    pytest.importorskip("torch.nn.attention.flex_attention")
    rope = posenc.RotaryEmbedding(8, max_seq_len=64)
    q, k, v = (torch.randn(12, 2, 8) for _ in "qkv")
    with torch.no_grad():
        a = posenc.attention(q, k, v, encoding=rope, causal=True, cu_seqlens=CU, backend="flex")
        b = posenc.attention(q, k, v, encoding=rope, causal=True, cu_seqlens=CU)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    ({"segment_ids": torch.zeros(1, 12, dtype=torch.long)}, "not accepted"),
    ({"attn_mask": torch.ones(12, 12, dtype=torch.bool)}, "not accepted"),
    ({"cu_seqlens": None, "cu_seqlens_k": CU}, "needs cu_seqlens"),
    ({"cu_seqlens_k": torch.tensor([0, 12])}, "same number of sequences"),
])
def test_attention_packed_errors(kwargs, match):
    q = k = v = torch.randn(12, 2, 8)
    kwargs = {"cu_seqlens": CU, **kwargs}
    with pytest.raises(ValueError, match=match):
        posenc.attention(q, k, v, **kwargs)


def test_attention_packed_keys_of_another_length_need_their_own_lengths():
    q, k = torch.randn(12, 2, 8), torch.randn(9, 2, 8)
    with pytest.raises(ValueError, match="need their own cumulative lengths, cu_seqlens_k"):
        posenc.attention(q, k, k, cu_seqlens=CU)
    with pytest.raises(ValueError, match="must hold the same tokens T_k"):
        posenc.attention(q, k, k[:8], cu_seqlens=CU, cu_seqlens_k=torch.tensor([0, 2, 2, 5, 9]))


def test_attention_packed_needs_packed_tokens():
    q = k = v = torch.randn(1, 2, 12, 8)
    with pytest.raises(ValueError, match=r"packed tokens \(T, H, D\)"):
        posenc.attention(q, k, v, cu_seqlens=CU)


def test_sinusoidal_packed_positions_equal_each_sequence_alone():
    """Additive encodings take the packed positions directly."""
    enc = posenc.SinusoidalEncoding(6, max_seq_len=16)
    pos = posenc.positions_from_cu_seqlens(CU)
    rows = enc(torch.zeros(1, 12, 6), positions=pos[None])[0]
    for _, a, z in spans(CU):
        want = [[math.sin(p / 10000 ** (2 * (j // 2) / 6)) if j % 2 == 0 else math.cos(p / 10000 ** (2 * (j // 2) / 6))
                 for j in range(6)] for p in range(z - a)]
        torch.testing.assert_close(rows[a:z].double(), torch.tensor(want, dtype=torch.float64).reshape(-1, 6),
                                   rtol=0, atol=1e-7)


def test_packed_rotation_compiles_and_guards_the_table():
    cos, sin = tables(16, 8)
    q = torch.randn(12, 2, 8)
    f = torch.compile(lambda q, cu, off: R.apply_rope_qk(q, None, cos, sin, cu_seqlens=cu, offset=off)[0],
                      fullgraph=True, backend="eager")
    torch.testing.assert_close(f(q, CU, 0), R.apply_rope_qk(q, None, cos, sin, cu_seqlens=CU)[0], rtol=0, atol=1e-6)
    with pytest.raises(RuntimeError, match=r"must lie in \[0, 16\)"):
        f(q, CU, 12)                                                     # positions up to 16: past the table


def test_a_repeated_packed_call_runs_its_plan_and_still_checks_its_values():
    """A packed call with the signature of one validated before runs that call's plan: the same result,
    fewer calls; its positions' range is still read (an out-of-table offset and invalid cu_seqlens
    raise as on the first call), and not read when promised."""
    import sys

    import posenc
    from posenc._torch import plans

    inv, _ = posenc.rope_inv_freq(8)
    cos, sin = posenc.rope_cos_sin(torch.arange(16), inv)
    q, k = torch.randn(7, 2, 8), torch.randn(7, 1, 8)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    plans.clear()

    def calls(fn):
        n = [0]

        def profile(frame, event, arg):
            if event == "call" and "posenc" in frame.f_code.co_filename:
                n[0] += 1
        sys.setprofile(profile)
        try:
            out = fn()
        finally:
            sys.setprofile(None)
        return out, n[0]

    first, n_first = calls(lambda: posenc.apply_rope_qk(q, k, cos, sin, cu_seqlens=cu, offset=2, engine="torch"))
    again, n_again = calls(lambda: posenc.apply_rope_qk(q, k, cos, sin, cu_seqlens=cu, offset=2, engine="torch"))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert n_again < n_first
    with pytest.raises(ValueError, match="outside the cos/sin table|must lie in"):
        posenc.apply_rope_qk(q, k, cos, sin, cu_seqlens=cu, offset=13, engine="torch")
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
        posenc.apply_rope_qk(q, k, cos, sin, cu_seqlens=torch.tensor([0, 3, 6], dtype=torch.int32), offset=2,
                             engine="torch")
    want = posenc.apply_rope_qk(q[3:][None], k[3:][None], cos, sin, offset=2, seq_dim=1, engine="torch")
    torch.testing.assert_close(again[0][3:], want[0][0], rtol=0, atol=0)
