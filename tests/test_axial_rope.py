"""Axial (N-axis) RoPE and RoPE-Mixed against a float64 oracle written from the formulas here, and
against diffusers (FLUX), timm (EVA 2-D RoPE, RoPE-Mixed) and rotary-embedding-torch."""

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before Triton decorates the kernel (as test_triton_rope)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from posenc.attn import attention  # noqa: E402
from posenc.core import axial as core_axial  # noqa: E402
from posenc.functional.axial import apply_axial_rope, axial_cos_sin, grid_positions  # noqa: E402
from posenc.nn.axial_rotary import AxialRotaryEmbedding  # noqa: E402
from tests.reference.grid_oracle import axial_angles, axial_pairs  # noqa: E402
from tests.reference.oracle import ulps  # noqa: E402
from tests.reference.rope_oracle import rotate_pairs  # noqa: E402
from tests.reference.timm_layers import timm_layer  # noqa: E402

# ---- against the independent oracle (tests/reference/grid_oracle.py) ------------------------------


def bhsd_angles(angles):
    """Angles of ``(S, h)`` or ``(B, S, h)`` positions against ``(B, H, S, D)``."""
    return angles if angles.ndim == 2 else angles[:, None]


def close(got, ref, dtype=torch.float32):
    """Within the rounding of the output dtype plus 2 eps of the inputs' magnitude (|x| < 6 here)."""
    eps = torch.finfo(dtype).eps
    ref = torch.as_tensor(ref, dtype=torch.float64)
    tol = ulps(dtype, ref) + 2 * eps * 12
    assert got.dtype == dtype
    assert bool(((got.double() - ref).abs() <= tol).all()), (got.double() - ref).abs().max()


# ---- the oracle, both layouts, shared and batched positions, both seq_dims -----------------------


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("seq_dim", [-2, 1])
def test_fixed_matches_oracle(layout, batched, seq_dim):
    axes_dims, base, D = (4, 6, 2), 100.0, 16                      # partial rotary: 12 of 16 features
    B, H, S = 2, 3, 7
    pos = torch.randint(0, 9, (B, S, 3) if batched else (S, 3))
    q, k = torch.randn(B, H, S, D), torch.randn(B, 1, S, D)        # GQA: one key head
    m = AxialRotaryEmbedding(axes_dims, base=base, layout=layout, max_seq_len=16)
    ang = bhsd_angles(axial_angles(pos.numpy(), axes_dims, base))
    pr = axial_pairs(axes_dims, layout)
    qi, ki = (q, k) if seq_dim == -2 else (q.transpose(1, 2), k.transpose(1, 2))
    qo, ko = m(qi, ki, positions=pos, seq_dim=seq_dim)
    if seq_dim == 1:
        qo, ko = qo.transpose(1, 2), ko.transpose(1, 2)
    close(qo, rotate_pairs(q.numpy(), ang, *pr))
    close(ko, rotate_pairs(k.numpy(), ang, *pr))
    assert torch.equal(qo[..., 12:], q[..., 12:])                  # pass-through untouched


@pytest.mark.float64
def test_positions_outside_table_and_float64_are_computed_exactly():
    axes_dims = (4, 4)
    m = AxialRotaryEmbedding(axes_dims, max_seq_len=8)
    pos = torch.tensor([[0, 3], [7, 8], [-5, 300], [70000, 2]])
    q = torch.randn(1, 2, 4, 8)
    ang = axial_angles(pos.numpy(), axes_dims, 10000.0)
    close(m(q, positions=pos)[0], rotate_pairs(q.numpy(), ang, *axial_pairs(axes_dims, "interleaved")))
    q64 = q.double()
    got = m(q64, positions=pos)[0]
    ref = rotate_pairs(q64.numpy(), ang, *axial_pairs(axes_dims, "interleaved"))
    assert got.dtype == torch.float64 and np.abs(got.numpy() - ref).max() < 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cos_sin_within_one_ulp(dtype):
    axes_dims, base = (8, 4), 10000.0
    pos = torch.tensor([[0, 1], [255, 256], [257, 1000], [4095, 3], [65537, 7], [5, 1023]])
    m = AxialRotaryEmbedding(axes_dims, base=base)                    # 1024 rows: 4095 and 65537 exact
    cos, sin = m.cos_sin(pos, dtype=dtype)
    truth = []
    for row in pos.tolist():
        ang = [row[a] * base ** (-2 * i / d) for a, d in enumerate(axes_dims) for i in range(d // 2)]
        truth.append(ang)
    for got, fn in ((cos, math.cos), (sin, math.sin)):
        t = torch.tensor([[fn(a) for a in r] for r in truth], dtype=torch.float64)
        assert got.dtype == dtype
        assert bool(((got.double() - t).abs() <= ulps(dtype, t)).all())
    assert not torch.equal(cos[1, :4], cos[2, :4])                   # 255/256/257 stay apart


# ---- third-party references ----------------------------------------------------------------------


def test_matches_diffusers_flux_pos_embed():
    pytest.importorskip("diffusers")
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    T, Hh, Ww = 5, 3, 4
    img = torch.nn.functional.pad(grid_positions((Hh, Ww)), (1, 0))              # (0, h, w)
    ids = torch.cat([torch.zeros(T, 3, dtype=torch.long), img])                  # text first, zeros
    q = torch.randn(1, 2, ids.shape[0], 128)
    cos, sin = FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])(ids.float())
    ref = apply_rotary_emb(q, (cos, sin))
    got = AxialRotaryEmbedding((16, 56, 56))(q, positions=ids)[0]
    torch.testing.assert_close(got, ref, rtol=0, atol=2e-6)


def test_matches_timm_eva_rope_with_class_token():
    pe = timm_layer("pos_embed_sincos")
    D, Hh, Ww = 32, 3, 5
    rope = pe.RotaryEmbeddingCat(D, in_pixels=False, feat_shape=[Hh, Ww], temperature=10000)  # integer grid
    x = torch.randn(2, 4, 1 + Hh * Ww, D)
    ref = pe.apply_rot_embed_cat(x[:, :, 1:], rope.get_embed())
    got = AxialRotaryEmbedding((D // 2, D // 2))(x, positions=grid_positions((Hh, Ww), prefix_tokens=1))[0]
    torch.testing.assert_close(got[:, :, 1:], ref, rtol=0, atol=2e-6)
    assert torch.equal(got[:, :, 0], x[:, :, 0])                     # the class token is not rotated


def test_learned_matches_timm_rope_mixed_and_its_init():
    pe = timm_layer("pos_embed_sincos")
    H, hd, Hh, Ww = 3, 16, 3, 4
    m = AxialRotaryEmbedding((hd // 2, hd // 2), learned=True, num_heads=H)
    x = torch.randn(2, H, Hh * Ww, hd)
    # timm's own grid (RotaryEmbeddingMixed's default "xy" indexing): t_x is the column, t_y the row,
    # tokens row-major; its first frequency row multiplies t_x, so posenc takes positions (w, h)
    t_x, t_y = pe.get_mixed_grid([Hh, Ww], grid_indexing="xy")
    emb = pe.get_mixed_freqs(m.freqs.detach(), t_x, t_y)                                 # (H, N, 2 hd)
    ref = pe.apply_rot_embed_cat(x, emb)
    with torch.no_grad():
        got = m(x, positions=grid_positions((Hh, Ww)).flip(-1))[0]
        swapped = m(x, positions=grid_positions((Hh, Ww)))[0]
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    assert (swapped - ref).abs().max() > 1e-2                  # (h, w) would pair the weights with the wrong axes
    timm_init = pe.init_random_2d_freqs(hd, 1, H, temperature=10.0, rotate=False)[:, 0]     # (2, H, hd/2)
    ours = core_axial.mixed_frequencies(hd, 2, core_axial.plane_rotations(np.zeros(H)), 10.0)
    np.testing.assert_allclose(ours, timm_init.double().numpy(), rtol=0, atol=1e-7)


def test_matches_rotary_embedding_torch_axial_freqs():
    ret = pytest.importorskip("rotary_embedding_torch")
    Da, Hh, Ww = 8, 3, 4
    rope = ret.RotaryEmbedding(dim=Da, freqs_for="lang", theta=10000)
    freqs = rope.get_axial_freqs(Hh, Ww)                                         # (H, W, 2 Da)
    x = torch.randn(1, 2, Hh, Ww, 2 * Da)
    ref = ret.apply_rotary_emb(freqs, x).flatten(2, 3)
    got = AxialRotaryEmbedding((Da, Da))(x.flatten(2, 3), positions=grid_positions((Hh, Ww)))[0]
    torch.testing.assert_close(got, ref, rtol=0, atol=2e-6)


# ---- properties ----------------------------------------------------------------------------------


def scores(m, q, k, pos_q, pos_k):
    with torch.no_grad():
        return m.rotate(q, positions=pos_q).double() @ m.rotate(k, positions=pos_k).double().transpose(-1, -2)


@pytest.mark.float64
@pytest.mark.parametrize("learned", [False, True])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_scores_depend_only_on_per_axis_offsets(learned, layout, axis):
    m = AxialRotaryEmbedding((4, 4, 4), layout=layout, learned=learned, num_heads=2 if learned else None, base=None)
    q, k = torch.randn(1, 2, 6, 12, dtype=torch.float64), torch.randn(1, 2, 6, 12, dtype=torch.float64)
    pq, pk = torch.randint(0, 20, (6, 3)), torch.randint(0, 20, (6, 3))
    shift = torch.zeros(3, dtype=torch.long)
    shift[axis] = 37
    a, b = scores(m, q, k, pq, pk), scores(m, q, k, pq + shift, pk + shift)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    c = scores(m, q, k, pq + shift, pk)                                      # a shift of queries alone matters
    assert (a - c).abs().max() > 1e-3


@pytest.mark.float64
def test_learned_rotation_matches_formula_and_gradcheck():
    torch.manual_seed(3)
    H, axes_dims = 2, (4, 4, 4)
    m = AxialRotaryEmbedding(axes_dims, learned=True, num_heads=H).double()
    pos = torch.randint(0, 7, (5, 3))
    q = torch.randn(1, H, 5, 12, dtype=torch.float64)
    F = m.freqs.detach().numpy()                                             # (3, H, 6)
    ang = np.einsum("sa,ahj->hsj", pos.double().numpy(), F)                 # (H, S, h)
    ref = rotate_pairs(q.numpy(), ang, *axial_pairs(axes_dims, "interleaved"))
    np.testing.assert_allclose(m(q, positions=pos)[0].detach().numpy(), ref, rtol=0, atol=1e-12)

    freqs = m.freqs.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda fr: _rotate_with(m, q, pos, fr), (freqs,))
    m(q, positions=pos)[0].square().sum().backward()                        # gradients reach the parameter
    assert m.freqs.grad is not None and m.freqs.grad.abs().sum() > 0


def _rotate_with(m, q, pos, freqs):
    """The module's rotation with ``freqs`` substituted, differentiable in them."""
    saved = m.freqs
    try:
        del m.freqs
        m.freqs = freqs
        return m(q, positions=pos)[0]
    finally:
        del m.freqs
        m.freqs = saved


def test_mixed_init_follows_the_paper():
    torch.manual_seed(0)
    m = AxialRotaryEmbedding((8, 8), learned=True, num_heads=4)
    F = m.freqs.detach().double()                                            # (2, 4, 8)
    mag = 10.0 ** (-4.0 * np.arange(4) / 16)                                 # theta^(-4j/dim), theta = 10
    for h in range(4):
        fx, fy = F[0, h].numpy(), F[1, h].numpy()
        phi = math.atan2(fy[0], fx[0])
        np.testing.assert_allclose(fx, np.concatenate([mag * np.cos(phi), mag * np.cos(phi + np.pi / 2)]), atol=1e-7)
        np.testing.assert_allclose(fy, np.concatenate([mag * np.sin(phi), mag * np.sin(phi + np.pi / 2)]), atol=1e-7)
    r = core_axial.haar_rotations(np.random.default_rng(0).standard_normal((5, 3, 3)))
    np.testing.assert_allclose(r @ r.transpose(0, 2, 1), np.broadcast_to(np.eye(3), (5, 3, 3)), atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(r), 1.0, atol=1e-12)


# ---- fast paths, equivalences, module mechanics --------------------------------------------------


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_precomputed_rows_inplace_and_functional_agree(layout):
    m = AxialRotaryEmbedding((4, 8), layout=layout)
    pos = torch.randint(0, 30, (2, 9, 2))
    q, k = torch.randn(2, 3, 9, 16), torch.randn(2, 3, 9, 16)
    state = {n: b.clone() for n, b in m.named_buffers()}
    ref = m(q, k, positions=pos)
    rows = m.cos_sin(pos)
    assert rows[0].shape == (2, 9, 6)
    for a, b in zip(m(q, k, cos_sin=rows), ref, strict=True):
        assert torch.equal(a, b)
    q2, k2 = q.clone(), k.clone()
    out = m(q2, k2, positions=pos, inplace=True)
    assert out[0] is q2 and torch.equal(q2, ref[0]) and torch.equal(k2, ref[1])
    f = apply_axial_rope(q, rows[0][:, None], rows[1][:, None], axes_dims=(4, 8), layout=layout)
    torch.testing.assert_close(f, ref[0], rtol=0, atol=1e-6)
    fc, fs = axial_cos_sin(pos, (4, 8))
    assert torch.equal(fc, rows[0]) and torch.equal(fs, rows[1])
    assert all(torch.equal(b, state[n]) for n, b in m.named_buffers())        # forward never writes


def test_large_inputs_take_the_blocked_path_correctly():
    m = AxialRotaryEmbedding((16, 56, 56))
    pos = torch.cat([torch.zeros(8, 3, dtype=torch.long),
                     torch.nn.functional.pad(grid_positions((12, 12)), (1, 0))])
    q = torch.randn(2, 24, pos.shape[0], 128)                                # > the small path's size
    ang = axial_angles(pos.numpy(), (16, 56, 56), 10000.0)
    close(m(q, positions=pos)[0], rotate_pairs(q.numpy(), ang, *axial_pairs((16, 56, 56), "interleaved")))


@pytest.mark.float64
def test_bf16_inputs_tables_and_autocast():
    m = AxialRotaryEmbedding((8, 8)).to(torch.bfloat16)
    assert m.packed_table.dtype == torch.float32 and m.turns.dtype == torch.float64
    pos = torch.tensor([[255, 256], [257, 3], [1000, 4]])
    q = torch.randn(1, 2, 3, 16).to(torch.bfloat16)
    got = m(q, positions=pos)[0]
    ref = rotate_pairs(q.double().numpy(), axial_angles(pos.numpy(), (8, 8), 10000.0), *axial_pairs((8, 8), "interleaved"))
    close(got, ref, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(m(q, positions=pos)[0], got)
        assert torch.equal(m.cos_sin(pos)[0], m.cos_sin(pos)[0].float())


def test_meta_device_then_reset_buffers_and_state_dict():
    ref = AxialRotaryEmbedding((4, 6))
    m = AxialRotaryEmbedding((4, 6), device="meta").to_empty(device="cpu")
    m.reset_buffers()
    assert torch.equal(m.packed_table, ref.packed_table)
    assert list(m.state_dict()) == []
    assert sorted(AxialRotaryEmbedding((4, 4), learned=True, num_heads=2).state_dict()) == ["freqs"]


def test_grid_positions_row_major():
    import itertools

    g = grid_positions((2, 3, 4), prefix_tokens=2)
    assert g.dtype == torch.int64 and g.shape == (26, 3)
    assert g[:2].eq(0).all()
    assert g[2:].tolist() == [list(t) for t in itertools.product(range(2), range(3), range(4))]


# ---- posenc.attention --------------------------------------------------------------------------


@pytest.mark.parametrize("learned", [False, True])
def test_attention_rotates_with_per_axis_positions(learned):
    m = AxialRotaryEmbedding((4, 4), learned=learned, num_heads=2 if learned else None)
    pos = grid_positions((2, 3), prefix_tokens=1)
    q, k, v = (torch.randn(2, 2, 7, 8) for _ in range(3))
    with torch.no_grad():
        qr, kr = m(q, k, positions=pos)
        got = attention(q, k, v, encoding=m, positions=pos)
    ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, v)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    # causal masks and packed segments follow the token order; the rotation uses the coordinates
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    with torch.no_grad():
        got = attention(q, k, v, encoding=m, positions=pos, causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, v, attn_mask=causal)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    seg = torch.tensor([[0, 0, 0, 1, 1, 1, 1]]).expand(2, 7)
    with torch.no_grad():
        got = attention(q, k, v, encoding=m, positions=pos, segment_ids=seg)
    same = torch.zeros(7, 7, dtype=torch.bool)
    same[:3, :3] = same[3:, 3:] = True
    ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, v, attn_mask=same)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="per-axis coordinates"):
        attention(q, k, v, encoding=m)
    with pytest.raises(ValueError, match=r"\(7, 2\)"):
        attention(q, k, v, encoding=m, positions=torch.arange(7))


# ---- Triton (interpreted on CPU) -----------------------------------------------------------------


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("batched", [False, True])
def test_triton_matches_torch_engine(layout, batched):
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET was set to something other than 1")
    pos = torch.randint(0, 12, (2, 5, 2) if batched else (5, 2))
    q, k = torch.randn(2, 5, 3, 12), torch.randn(2, 5, 1, 12)               # (B, S, H, D), partial rotary
    mt = AxialRotaryEmbedding((4, 4), layout=layout, engine="triton")
    mr = AxialRotaryEmbedding((4, 4), layout=layout, engine="torch")
    for a, b in zip(mt(q, k, positions=pos, seq_dim=1), mr(q, k, positions=pos, seq_dim=1), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-6)
    q2 = q.clone()
    mt(q2, positions=pos, seq_dim=1, inplace=True)
    torch.testing.assert_close(q2, mr(q, positions=pos, seq_dim=1)[0], rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match="learned"):
        AxialRotaryEmbedding((4, 4), learned=True, num_heads=3, engine="triton")(q, positions=pos, seq_dim=1)


# ---- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"axes_dims": (4, 5)}, ValueError, "even"),
        ({"axes_dims": ()}, TypeError, "non-empty"),
        ({"axes_dims": 8}, TypeError, "sequence"),
        ({"axes_dims": (4, 4.0)}, TypeError, r"axes_dims\[1\]"),
        ({"axes_dims": (4, 4), "learned": True}, ValueError, "num_heads"),
        ({"axes_dims": (4, 4), "num_heads": 2}, ValueError, "drop num_heads, or pass learned=True"),
        ({"axes_dims": (4, 4), "learned": True, "num_heads": 2, "max_seq_len": 64}, ValueError, "keeps no table: drop max_seq_len"),
        ({"axes_dims": (2, 4), "learned": True, "num_heads": 2}, ValueError, "multiple of 2 \\* n_axes"),
        ({"axes_dims": (4, 4), "layout": "neox"}, ValueError, "layout"),
        ({"axes_dims": (4, 4), "engine": "cuda"}, ValueError, "engine"),
        ({"axes_dims": (4, 4), "base": -1.0}, ValueError, "base"),
    ],
)
def test_bad_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        AxialRotaryEmbedding(**kwargs)


def test_bad_calls():
    m = AxialRotaryEmbedding((4, 4))
    q = torch.randn(2, 2, 5, 8)
    with pytest.raises(ValueError, match="head dim 6 < rotary dim 8"):
        m(torch.randn(2, 2, 5, 6), positions=torch.zeros(5, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(S, 2\)"):
        m(q, positions=torch.zeros(5, 3, dtype=torch.long))                  # wrong n_axes
    with pytest.raises(ValueError, match=r"\(5, 2\)"):
        m(q, positions=torch.zeros(4, 2, dtype=torch.long))                  # wrong S
    with pytest.raises(ValueError, match=r"\(S, 2\)"):
        m(q, positions=torch.arange(5))                                      # scalar positions
    with pytest.raises(TypeError, match="integers"):
        m(q, positions=torch.zeros(5, 2))
    with pytest.raises(ValueError, match="required"):
        m(q)
    with pytest.raises(ValueError, match="either"):
        pos = torch.zeros(5, 2, dtype=torch.long)
        m(q, positions=pos, cos_sin=m.cos_sin(pos))
    with pytest.raises(ValueError, match="2\\*\\*31"):
        m(q, positions=torch.full((5, 2), 2**33))
    learned = AxialRotaryEmbedding((4, 4), learned=True, num_heads=3)
    with pytest.raises(ValueError, match="num_heads=3"):
        learned(q, positions=torch.zeros(5, 2, dtype=torch.long))


@pytest.mark.float64
def test_learned_half_layout_pairs_across_the_whole_rotated_part():
    """Learned frequencies mix every axis, so "half" pairs (j, j + dim/2) whatever the axes_dims split."""
    gen = torch.Generator().manual_seed(3)
    a = AxialRotaryEmbedding((8, 8), learned=True, num_heads=2, layout="half")
    b = AxialRotaryEmbedding((4, 12), learned=True, num_heads=2, layout="half")
    with torch.no_grad():
        b.freqs.copy_(a.freqs)
    x = torch.randn(1, 2, 6, 18, generator=gen, dtype=torch.float64)               # 2 pass-through features
    pos = torch.randint(-3, 9, (6, 2), generator=gen)
    ang = torch.einsum("sa,ahj->hsj", pos.double(), a.freqs.detach().double())     # (H, S, 8)
    c, s = ang.cos(), ang.sin()
    x1, x2 = x[..., :8], x[..., 8:16]
    want = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 16:]], -1)
    with torch.no_grad():
        for m in (a, b):
            torch.testing.assert_close(m(x, positions=pos)[0], want, rtol=0, atol=1e-12)
