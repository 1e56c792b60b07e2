"""resize_position_embedding and LearnedPositionalEmbedding.resize.

References: a float64 NumPy oracle written here from the resampling formulas (Keys' cubic
convolution, Pillow's anti-aliased filters, area averaging), hand-derived ramps, a plain
reshape + ``interpolate`` reference, and timm's ``resample_abs_pos_embed`` itself.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from posenc.functional.resize import resize_position_embedding
from posenc.nn.learned import LearnedPositionalEmbedding
from tests.reference.timm_layers import timm_layer


# ---------------------------------------------------------------- references
def _keys(x: float, a: float) -> float:
    """Keys' cubic convolution kernel with parameter ``a``."""
    x = abs(x)
    if x < 1:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    if x < 2:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def _axis_weights(n_in: int, n_out: int, kernel: str, antialias: bool) -> np.ndarray:
    """``(n_out, n_in)`` float64 matrix resampling one axis, pixel centres at ``i + 0.5`` (align_corners=False)."""
    w = np.zeros((n_out, n_in))
    scale = n_in / n_out
    for i in range(n_out):
        if antialias:            # Pillow: the filter stretched by the shrink factor, over its support, normalised
            radius, filt = (1, lambda x: max(0.0, 1 - abs(x))) if kernel == "bilinear" else (2, lambda x: _keys(x, -0.5))
            stretch = max(scale, 1.0)
            center = scale * (i + 0.5)
            lo = max(int(center - radius * stretch + 0.5), 0)
            hi = min(int(center + radius * stretch + 0.5), n_in)
            for j in range(lo, hi):
                w[i, j] = filt((j - center + 0.5) / stretch)
            w[i] /= w[i].sum()
        elif kernel == "bilinear":          # source coordinate clamped at 0, neighbour clamped at the end
            src = max((i + 0.5) * scale - 0.5, 0.0)
            j0 = min(int(src), n_in - 1)
            t = src - j0
            w[i, j0] += 1 - t
            w[i, min(j0 + 1, n_in - 1)] += t
        elif kernel == "bicubic":           # Keys a = -0.75, four taps, indices clamped to the edge
            src = (i + 0.5) * scale - 0.5
            j0 = math.floor(src)
            for j in range(j0 - 1, j0 + 3):
                w[i, min(max(j, 0), n_in - 1)] += _keys(src - j, -0.75)
        elif kernel == "nearest":           # floor(i * scale), scale held in float32 as torch documents
            w[i, min(int(np.float32(i) * np.float32(n_in / n_out)), n_in - 1)] = 1
        elif kernel == "nearest-exact":
            w[i, min(int((np.float32(i) + np.float32(0.5)) * np.float32(n_in / n_out)), n_in - 1)] = 1
        elif kernel == "area":              # mean over [floor(i n_in / n_out), ceil((i + 1) n_in / n_out))
            lo, hi = (i * n_in) // n_out, -(-(i + 1) * n_in // n_out)
            w[i, lo:hi] = 1 / (hi - lo)
    return w


def _oracle(table, prefix, old, new, kernel, antialias):
    """Float64 resize of an ``(N, C)`` table: prefix rows, then the separable resampling of the grid."""
    t = np.asarray(table.detach().double().reshape(table.shape[-2], -1))
    grid = t[prefix:].reshape(old[0], old[1], -1)                     # (H, W, C)
    wh = _axis_weights(old[0], new[0], kernel, antialias)
    ww = _axis_weights(old[1], new[1], kernel, antialias)
    out = np.einsum("ih,jw,hwc->ijc", wh, ww, grid).reshape(new[0] * new[1], -1)
    return torch.from_numpy(np.concatenate([t[:prefix], out]))


def _plain(table, prefix, old, new, mode, antialias):
    """The textbook recipe for a (1, N, C) table: split, reshape to (1, C, H, W), interpolate in float32."""
    grid = table[:, prefix:].float().reshape(1, old[0], old[1], -1).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=new, mode=mode, antialias=antialias,
                         align_corners=False if mode in ("bilinear", "bicubic") else None)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], -1).to(table.dtype)
    return torch.cat([table[:, :prefix], grid], dim=1)


# (old grid, new grid, prefix rows)
GRIDS = [((4, 4), (7, 7), 1), ((7, 7), (4, 4), 0), ((3, 5), (6, 2), 4), ((6, 6), (6, 9), 1),
         ((5, 3), (2, 8), 0), ((2, 2), (1, 1), 1), ((8, 4), (3, 11), 2)]
MODES = [("bicubic", True), ("bicubic", False), ("bilinear", True), ("bilinear", False),
         ("nearest", False), ("nearest-exact", False), ("area", False)]


def _table(old, prefix, c=5, dtype=torch.float64):
    return torch.randn(1, prefix + old[0] * old[1], c, dtype=torch.float64).to(dtype)


def _call(table, old, new, prefix, mode, antialias):
    square = old[0] == old[1]
    return resize_position_embedding(table, new, old_size=None if square else old, prefix_tokens=prefix,
                                     mode=mode, antialias=antialias)


# ---------------------------------------------------------------- 2-D against the oracle and timm
@pytest.mark.parametrize("mode,antialias", MODES)
@pytest.mark.parametrize("old,new,prefix", GRIDS)
def test_float64_matches_the_oracle(old, new, prefix, mode, antialias):
    table = _table(old, prefix)
    out = _call(table, old, new, prefix, mode, antialias)
    assert out.shape == (1, prefix + new[0] * new[1], 5) and out.dtype == torch.float64
    torch.testing.assert_close(out[0], _oracle(table[0], prefix, old, new, mode, antialias), rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode,antialias", MODES)
@pytest.mark.parametrize("old,new,prefix", GRIDS)
def test_float32_matches_the_oracle_and_the_plain_recipe(old, new, prefix, mode, antialias):
    table = _table(old, prefix, dtype=torch.float32)
    out = _call(table, old, new, prefix, mode, antialias)
    assert torch.equal(out, _plain(table, prefix, old, new, mode, antialias))
    expected = _oracle(table[0], prefix, old, new, mode, antialias).float()
    torch.testing.assert_close(out[0], expected, rtol=0, atol=4 * torch.finfo(torch.float32).eps * 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("mode,antialias", MODES)
@pytest.mark.parametrize("old,new,prefix", GRIDS[:4] + GRIDS[6:])
def test_equals_timm(old, new, prefix, mode, antialias, dtype):
    resample = timm_layer("pos_embed").resample_abs_pos_embed
    table = _table(old, prefix, dtype=dtype)
    ours = _call(table, old, new, prefix, mode, antialias)
    theirs = resample(table, list(new), old_size=None if old[0] == old[1] else list(old),
                      num_prefix_tokens=prefix, interpolation=mode, antialias=antialias)
    assert ours.dtype == theirs.dtype == dtype
    if dtype == torch.float64:       # timm rounds float64 through float32; we stay in float64
        torch.testing.assert_close(ours, theirs, rtol=0, atol=8 * torch.finfo(torch.float32).eps * 4)
    else:
        assert torch.equal(ours, theirs)


def test_equals_timm_for_a_vit_b16_table_224_to_384():
    resample = timm_layer("pos_embed").resample_abs_pos_embed
    table = torch.randn(1, 1 + 14 * 14, 64) * 0.02
    assert torch.equal(resize_position_embedding(table, (24, 24)), resample(table, [24, 24]))
    # unequal token counts with the same square side count: timm resamples, and so do we
    assert torch.equal(resize_position_embedding(table, (28, 7), old_size=(14, 14)),
                       resample(table, [28, 7], old_size=[14, 14]))


# ---------------------------------------------------------------- hand-derived values
@pytest.mark.parametrize("old,new", [((3, 4), (7, 9)), ((6, 5), (4, 2)), ((2, 2), (5, 5))])
def test_bilinear_of_a_ramp_is_the_ramp_at_the_clamped_source_coordinates(old, new):
    # f(y, x) = 3 y - 2 x + 1 on the grid; bilinear interpolation reproduces planes exactly, and
    # torch (like timm) clamps the source coordinate (i + 0.5) * in / out - 0.5 to [0, in - 1].
    y, x = torch.meshgrid(torch.arange(old[0], dtype=torch.float64), torch.arange(old[1], dtype=torch.float64),
                          indexing="ij")
    table = (3 * y - 2 * x + 1).reshape(-1, 1)
    out = resize_position_embedding(table, new, old_size=old, prefix_tokens=0, mode="bilinear", antialias=False)

    def src(i, n_in, n_out):
        return min(max((i + 0.5) * n_in / n_out - 0.5, 0.0), n_in - 1.0)

    expected = [[3 * src(i, old[0], new[0]) - 2 * src(j, old[1], new[1]) + 1 for j in range(new[1])]
                for i in range(new[0])]
    torch.testing.assert_close(out.view(new), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-13)


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
@pytest.mark.parametrize("n_in,n_out", [(8, 20), (6, 13), (9, 30)])
def test_antialiased_upsampling_reproduces_ramps_and_cubic_reproduces_parabolas(mode, n_in, n_out):
    # Enlarging, Pillow's filters are sampled at unit spacing: the triangle reproduces lines and
    # Keys' kernel with a = -1/2 reproduces quadratics (Keys 1981), so away from the edges the output
    # is f at the source coordinate (i + 0.5) * n_in / n_out - 0.5.
    def f(x):
        return 0.25 * x * x - x + 2 if mode == "bicubic" else 0.5 * x - 1

    table = f(torch.arange(n_in, dtype=torch.float64)).reshape(1, n_in, 1)
    out = resize_position_embedding(table, (1, n_out), old_size=(1, n_in), prefix_tokens=0, mode=mode)
    scale = n_in / n_out
    reach = 2 if mode == "bicubic" else 1
    inner = [i for i in range(n_out) if reach - 1 <= (i + 0.5) * scale - 0.5 <= n_in - reach]
    assert len(inner) >= n_out // 2
    expected = torch.tensor([f((i + 0.5) * scale - 0.5) for i in inner], dtype=torch.float64)
    torch.testing.assert_close(out[0, inner, 0], expected, rtol=0, atol=1e-12)


def test_nearest_and_area_halving_by_hand():
    table = torch.arange(16.0).reshape(16, 1)                        # a 4 x 4 grid of 0..15
    nearest = resize_position_embedding(table, (2, 2), prefix_tokens=0, mode="nearest", antialias=False)
    area = resize_position_embedding(table, (2, 2), prefix_tokens=0, mode="area", antialias=False)
    assert nearest.view(-1).tolist() == [0.0, 2.0, 8.0, 10.0]
    assert area.view(-1).tolist() == [2.5, 4.5, 10.5, 12.5]          # means of the 2 x 2 blocks


# ---------------------------------------------------------------- 1-D tables
@pytest.mark.parametrize("mode,antialias", [("cubic", True), ("cubic", False), ("linear", True), ("linear", False),
                                            ("nearest", False), ("nearest-exact", False), ("area", False)])
@pytest.mark.parametrize("n_in,n_out,prefix", [(10, 23, 0), (23, 10, 2), (7, 7 * 3, 1), (16, 5, 0)])
def test_1d_matches_the_oracle_and_the_2d_resize_of_a_single_row(n_in, n_out, prefix, mode, antialias):
    table = torch.randn(prefix + n_in, 3, dtype=torch.float64)
    out = resize_position_embedding(table, n_out, prefix_tokens=prefix, mode=mode, antialias=antialias)
    assert out.shape == (prefix + n_out, 3)
    kernel = {"cubic": "bicubic", "linear": "bilinear"}.get(mode, mode)
    torch.testing.assert_close(out, _oracle(table, prefix, (1, n_in), (1, n_out), kernel, antialias),
                               rtol=0, atol=1e-12)
    as_grid = resize_position_embedding(table, (1, n_out), old_size=(1, n_in), prefix_tokens=prefix,
                                        mode=kernel, antialias=antialias)
    assert torch.equal(out, as_grid)


@pytest.mark.parametrize("n_in,n_out", [(10, 23), (23, 10), (6, 6 * 4)])
def test_1d_without_antialias_equals_torchs_own_1d_resamplers(n_in, n_out):
    table = torch.randn(n_in, 4)
    seq = table.T[None]                                               # (1, C, N)
    for mode, expected in [
        ("linear", F.interpolate(seq, size=n_out, mode="linear", align_corners=False)),
        ("nearest", F.interpolate(seq, size=n_out, mode="nearest")),
        ("nearest-exact", F.interpolate(seq, size=n_out, mode="nearest-exact")),
        ("area", F.adaptive_avg_pool1d(seq, n_out)),
    ]:
        out = resize_position_embedding(table, n_out, prefix_tokens=0, mode=mode, antialias=False)
        torch.testing.assert_close(out, expected[0].T, rtol=1e-6, atol=1e-6)


def test_1d_default_mode_is_antialiased_cubic_and_2d_default_is_bicubic():
    table = torch.randn(20, 3)
    assert torch.equal(resize_position_embedding(table, 9, prefix_tokens=0),
                       resize_position_embedding(table, 9, prefix_tokens=0, mode="cubic", antialias=True))
    grid = torch.randn(1, 1 + 36, 3)
    assert torch.equal(resize_position_embedding(grid, (4, 5)),
                       resize_position_embedding(grid, (4, 5), prefix_tokens=1, mode="bicubic", antialias=True))


# ---------------------------------------------------------------- structure, dtypes, autocast
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_is_computed_in_float32_and_rounded_once(dtype):
    table = _table((6, 6), 4, dtype=dtype)
    out = resize_position_embedding(table, (4, 9), prefix_tokens=4)
    assert out.dtype == dtype
    assert torch.equal(out[:, :4], table[:, :4])                      # prefix rows untouched, first
    expected = _oracle(table[0], 4, (6, 6), (4, 9), "bicubic", True)  # float64 from the same inputs
    ulp = torch.finfo(dtype).eps * expected.abs().clamp_min(torch.finfo(dtype).tiny)
    assert bool(((out[0].double() - expected).abs() <= ulp).all())   # one rounding: within 1 ulp


def test_both_ranks_and_prefix_rows_are_kept_bitwise():
    table = torch.randn(1, 4 + 25, 6)
    out3 = resize_position_embedding(table, (3, 8), prefix_tokens=4)
    out2 = resize_position_embedding(table[0], (3, 8), prefix_tokens=4)
    assert out3.shape == (1, 28, 6) and out2.shape == (28, 6)
    assert torch.equal(out3[0], out2)
    assert torch.equal(out2[:4], table[0, :4])


def test_an_unchanged_grid_returns_the_table_itself():
    table = torch.randn(1, 1 + 16, 3)
    assert resize_position_embedding(table, (4, 4)) is table
    rows = table[0]
    assert resize_position_embedding(rows, 16) is rows                 # 1-D, prefix row + 16 positions
    seq = torch.randn(12, 3)
    assert resize_position_embedding(seq, 12, prefix_tokens=0) is seq
    # same number of rows, a different grid: resampled
    flat = torch.randn(1, 32, 3)
    out = resize_position_embedding(flat, (4, 8), old_size=(8, 4), prefix_tokens=0, mode="bilinear")
    assert out.shape == flat.shape and not torch.equal(out, flat)


def test_autocast_does_not_change_the_result():
    table = torch.randn(1, 1 + 49, 8)
    plain = resize_position_embedding(table, (5, 11))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = resize_position_embedding(table, (5, 11))
    assert inside.dtype == torch.float32 and torch.equal(inside, plain)


def test_compiles_in_one_graph_and_exports():
    table = torch.randn(1, 1 + 49, 8)
    compiled = torch.compile(lambda t: resize_position_embedding(t, (9, 9)), fullgraph=True, backend="eager")
    assert torch.equal(compiled(table), resize_position_embedding(table, (9, 9)))

    class AddResized(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = torch.nn.Parameter(table.clone())

        def forward(self, x):                                          # (1, 81, 8)
            return x + resize_position_embedding(self.pos, (9, 9))[:, 1:]

    module, x = AddResized(), torch.randn(1, 81, 8)
    assert torch.equal(torch.export.export(module, (x,)).module()(x), module(x))


def test_meta_device_gives_shapes_only():
    out = resize_position_embedding(torch.empty(1, 1 + 64, 16, device="meta"), (12, 12))
    assert out.is_meta and out.shape == (1, 145, 16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_cpu(dtype):
    table = _table((7, 7), 1, c=32, dtype=dtype)
    cpu = resize_position_embedding(table, (12, 9))
    gpu = resize_position_embedding(table.cuda(), (12, 9))
    assert gpu.device.type == "cuda" and gpu.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=tol, atol=tol)


# ---------------------------------------------------------------- gradients
@pytest.mark.parametrize("new_size,old_size,prefix,mode,antialias", [
    ((2, 5), None, 1, "bicubic", True),
    ((5, 4), (3, 2), 2, "bicubic", False),
    ((2, 2), None, 0, "bilinear", True),
    (7, None, 1, "linear", False),
    (3, None, 0, "cubic", True),
    (4, None, 1, "area", False),
])
def test_gradcheck_float64(new_size, old_size, prefix, mode, antialias):
    rows = 6 if old_size is not None else (9 if isinstance(new_size, tuple) else 5)
    table = torch.randn(prefix + rows, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda t: resize_position_embedding(t, new_size, old_size=old_size, prefix_tokens=prefix, mode=mode,
                                            antialias=antialias), (table,))


def test_gradient_is_the_transposed_resampling_and_reaches_the_prefix_rows():
    table = torch.randn(1, 2 + 16, 3, dtype=torch.float64, requires_grad=True)
    g = torch.randn(1, 2 + 30, 3, dtype=torch.float64)
    resize_position_embedding(table, (5, 6), prefix_tokens=2).backward(g)
    wh, ww = _axis_weights(4, 5, "bicubic", True), _axis_weights(4, 6, "bicubic", True)
    grid_grad = np.einsum("ih,jw,ijc->hwc", wh, ww, g[0, 2:].numpy().reshape(5, 6, 3)).reshape(16, 3)
    torch.testing.assert_close(table.grad[0, :2], g[0, :2])
    torch.testing.assert_close(table.grad[0, 2:], torch.from_numpy(grid_grad), rtol=0, atol=1e-12)


def test_bfloat16_gradients_flow_in_the_tables_dtype():
    table = torch.randn(1, 1 + 16, 4).to(torch.bfloat16).requires_grad_()
    resize_position_embedding(table, (6, 6)).float().square().sum().backward()
    assert table.grad.dtype == torch.bfloat16 and torch.count_nonzero(table.grad) > 0


# ---------------------------------------------------------------- LearnedPositionalEmbedding.resize
def test_module_resize_returns_a_new_module_and_leaves_the_old_one_alone():
    emb = LearnedPositionalEmbedding(12, 4)
    before = emb.weight.detach().clone()
    weight = emb.weight
    new = emb.resize(30)
    assert new is not emb and isinstance(new, LearnedPositionalEmbedding)
    assert emb.weight is weight and torch.equal(emb.weight, before) and emb.max_seq_len == 12
    assert new.max_seq_len == 30 and new.weight.shape == (30, 4) and new.weight.is_leaf
    expected = _oracle(before.double(), 0, (1, 12), (1, 30), "bicubic", True).float()
    torch.testing.assert_close(new.weight.detach(), expected, rtol=0, atol=1e-6)
    assert torch.equal(new.weight.detach(), resize_position_embedding(before, 30, prefix_tokens=0))
    x = torch.randn(2, 30, 4)
    assert torch.equal(new(x), x + new.weight)                       # the new length is usable
    assert set(new.state_dict()) == {"weight"}


@pytest.mark.parametrize("mode,antialias", [("linear", False), ("nearest", False), ("area", False), ("cubic", False)])
def test_module_resize_modes(mode, antialias):
    emb = LearnedPositionalEmbedding(9, 3)
    new = emb.resize(4, mode=mode, antialias=antialias)
    expected = _oracle(emb.weight, 0, (1, 9), (1, 4), {"cubic": "bicubic", "linear": "bilinear"}.get(mode, mode),
                       antialias)
    torch.testing.assert_close(new.weight.detach().double(), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("padding_idx", [0, 1])
def test_module_resize_keeps_the_rows_up_to_padding_idx(padding_idx):
    emb = LearnedPositionalEmbedding(10, 3, padding_idx=padding_idx)
    new = emb.resize(20, mode="linear", antialias=False)
    kept = padding_idx + 1
    assert new.padding_idx == padding_idx
    assert torch.equal(new.weight[:kept], emb.weight[:kept])
    assert torch.count_nonzero(new.weight[padding_idx]) == 0
    expected = _oracle(emb.weight[kept:], 0, (1, 10 - kept), (1, 20 - kept), "bilinear", False).float()
    torch.testing.assert_close(new.weight[kept:].detach(), expected, rtol=0, atol=1e-6)
    out = new(torch.zeros(1, 3, 3), positions=torch.tensor([padding_idx, kept, 19]))
    out.sum().backward()
    assert torch.count_nonzero(new.weight.grad[padding_idx]) == 0    # the padding row still gets no gradient


def test_module_resize_keeps_dtype_device_flags_and_draws_no_random_numbers():
    emb = LearnedPositionalEmbedding(16, 6, init="sinusoidal", dtype=torch.bfloat16)
    emb.weight.requires_grad_(False)
    emb.eval()
    state = torch.random.get_rng_state()
    new = emb.resize(24)
    assert torch.equal(state, torch.random.get_rng_state())
    assert new.weight.dtype == torch.bfloat16 and new.weight.device == emb.weight.device
    assert not new.weight.requires_grad and not new.training and new.init == "sinusoidal" and new.dim == 6
    expected = resize_position_embedding(emb.weight.detach().float(), 24, prefix_tokens=0).to(torch.bfloat16)
    assert torch.equal(new.weight, expected)                         # float32 maths, one rounding


def test_module_resize_to_the_same_size_copies():
    emb = LearnedPositionalEmbedding(8, 2)
    new = emb.resize(8)
    assert torch.equal(new.weight, emb.weight)
    assert new.weight.data_ptr() != emb.weight.data_ptr()
    with torch.no_grad():
        new.weight.add_(1)
    assert not torch.equal(new.weight, emb.weight)


def test_module_resize_on_the_meta_device():
    new = LearnedPositionalEmbedding(8, 4, device="meta").resize(20)
    assert new.weight.is_meta and new.weight.shape == (20, 4)


def test_module_resize_bad_input():
    emb = LearnedPositionalEmbedding(8, 4, padding_idx=1)
    with pytest.raises(ValueError, match=r"max_seq_len must be >= 1, got 0"):
        emb.resize(0)
    with pytest.raises(TypeError, match=r"max_seq_len must be an int"):
        emb.resize(8.0)
    with pytest.raises(ValueError, match=r"padding_idx=1 .* max_seq_len > 2"):
        emb.resize(2)
    with pytest.raises(ValueError, match=r"padding_idx=3 .*\(current 4\)"):
        LearnedPositionalEmbedding(4, 2, padding_idx=3).resize(10)
    with pytest.raises(ValueError, match=r"mode='bicubic' is not a mode of a 1-D table.*'cubic'"):
        emb.resize(16, mode="bicubic")


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("call,exc,pattern", [
    (lambda: resize_position_embedding(torch.arange(17).view(17, 1), (2, 2)), TypeError, r"table must be a floating"),
    (lambda: resize_position_embedding([[0.0]], 1), TypeError, r"table must be a torch.Tensor"),
    (lambda: resize_position_embedding(torch.zeros(17), (2, 2)), ValueError, r"\(N, C\) or \(1, N, C\), got \(17,\)"),
    (lambda: resize_position_embedding(torch.zeros(2, 17, 3), (2, 2)), ValueError, r"got \(2, 17, 3\)"),
    (lambda: resize_position_embedding(torch.zeros(1, 1, 17, 3), (2, 2)), ValueError, r"got \(1, 1, 17, 3\)"),
    (lambda: resize_position_embedding(torch.zeros(1, 1 + 12, 3), (4, 4)), ValueError,
     r"12 rows \(N=13 minus prefix_tokens=1\), not a square; pass old_size=\(H, W\) with H \* W = 12"),
    (lambda: resize_position_embedding(torch.zeros(1, 1 + 12, 3), (4, 4), old_size=(3, 5)), ValueError,
     r"old_size=\(3, 5\) holds 15 positions but the table has 12 grid rows"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), 5, old_size=8), ValueError,
     r"old_size=8 does not match the table.*pass old_size=9"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), 5, old_size=(3, 3)), TypeError, r"old_size must be an int"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), (3, 3), old_size=9), TypeError, r"old_size must be a pair"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), 0), ValueError, r"new_size must be >= 1, got 0"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), -4), ValueError, r"new_size must be >= 1, got -4"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), (0, 3)), ValueError, r"new_size\[0\] must be >= 1"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), (3,)), TypeError, r"new_size must be an int .* or a pair"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), 2.5), TypeError, r"new_size must be an int"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), True), TypeError, r"new_size must be an int"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), (3, 3), old_size=(3, 0)), ValueError,
     r"old_size\[1\] must be >= 1"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), 4, prefix_tokens=-1), ValueError,
     r"prefix_tokens must be >= 0"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), 4, prefix_tokens=10), ValueError,
     r"prefix_tokens=10 leaves no grid rows in a table of N=10 rows"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), (3, 3), mode="lanczos"), ValueError,
     r"mode must be one of 'bicubic', 'bilinear'.*got 'lanczos'"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), 4, mode="bicubic"), ValueError,
     r"mode='bicubic' is not a mode of a 1-D table .*'cubic', 'linear'"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), (3, 3), mode="linear"), ValueError,
     r"mode='linear' is not a mode of a 2-D grid .*'bicubic', 'bilinear'"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), (3, 3), mode="nearest"), ValueError,
     r"antialias=True applies to the cubic and linear modes only, not mode='nearest'; pass antialias=False"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), 4, mode="area"), ValueError,
     r"not mode='area'; pass antialias=False"),
    (lambda: resize_position_embedding(torch.zeros(10, 3), 4, antialias=1), TypeError, r"antialias must be a bool"),
])
def test_bad_input_raises_with_the_fix(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()
