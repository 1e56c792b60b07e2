"""posenc.core.exact: sin/cos of position * frequency with float64 *relative* accuracy."""

import decimal

import mpmath
import numpy as np
import pytest
import torch

from posenc.core import exact

mpmath.mp.prec = 200

# Numerators of continued-fraction convergents of pi: p * 1 rad lands extremely close to a multiple
# of pi, where sin(p) is tiny and float64 angles lose all relative accuracy.
NEAR_PI_MULTIPLES = [22, 333, 355, 103993, 104348, 208341, 312689, 833719, 1146408, 4272943,
                     5419351, 80143857, 165707065, 245850922, 411557987, 1068966896]


def _rel_err(value: float, truth) -> float:
    return float(abs(mpmath.mpf(value) - truth) / abs(truth)) if truth != 0 else abs(value)


@pytest.mark.parametrize("p", NEAR_PI_MULTIPLES)
def test_sin_near_multiples_of_pi_keeps_relative_accuracy(p):
    split = exact.turns_split((decimal.Decimal(1),))
    s, c = exact.sin_cos(np.array([float(p)]), split)
    assert _rel_err(s[0, 0], mpmath.sin(p)) < 2.0**-48
    assert _rel_err(c[0, 0], mpmath.cos(p)) < 2.0**-48


def test_plain_float64_products_lose_accuracy_where_the_engine_does_not():
    # Documents why the exact engine exists: sin(p * w) with p * w rounded in float64 is off by far
    # more than 2**-48 in relative terms once p is large.
    w = 10000.0 ** (-2 / 6)
    positions = np.arange(2**20 - 2000, 2**20, dtype=np.float64)
    naive = np.sin(positions * w)
    ours, _ = exact.sin_cos(positions, exact.turns_split((w,)))
    worst_naive = max(_rel_err(naive[i], mpmath.sin(int(p) * mpmath.mpf(w))) for i, p in enumerate(positions[:200]))
    worst_ours = max(_rel_err(ours[i, 0], mpmath.sin(int(p) * mpmath.mpf(w))) for i, p in enumerate(positions[:200]))
    assert worst_naive > 2.0**-40
    assert worst_ours < 2.0**-48


@pytest.mark.parametrize("xp_name", ["numpy", "torch"])
def test_random_frequencies_and_positions_against_mpmath(xp_name):
    rng = np.random.default_rng(1)
    freqs = [float(f) for f in 10.0 ** rng.uniform(-6, 0.5, size=12)]
    positions = np.concatenate([[0, 1, -1, 255, 256, 257, 4095, 65537, 2**20, 2**31, -(2**31)],
                                rng.integers(-(2**31), 2**31, size=20)]).astype(np.float64)
    split = exact.turns_split(tuple(freqs))
    if xp_name == "torch":
        s, c = exact.sin_cos(torch.tensor(positions), torch.tensor(split), xp=torch)
        s, c = s.numpy(), c.numpy()
    else:
        s, c = exact.sin_cos(positions, split)
    for i, p in enumerate(positions):
        for j, f in enumerate(freqs):
            angle = int(p) * mpmath.mpf(f)
            assert _rel_err(s[i, j], mpmath.sin(angle)) < 2.0**-48, (p, f)
            assert _rel_err(c[i, j], mpmath.cos(angle)) < 2.0**-48, (p, f)


def test_numpy_and_torch_paths_agree_to_float64_rounding():
    # The reductions are identical; only the final float64 sin (NumPy's vs torch's libm) may differ.
    split = exact.turns_split((1.0, 0.1, 1e-4))
    pos = np.arange(-50, 5000, 7, dtype=np.float64)
    s_np, c_np = exact.sin_cos(pos, split)
    s_t, c_t = exact.sin_cos(torch.tensor(pos), torch.tensor(split), xp=torch)
    np.testing.assert_allclose(s_t.numpy(), s_np, rtol=2**-50, atol=0)
    np.testing.assert_allclose(c_t.numpy(), c_np, rtol=2**-50, atol=0)


def test_split_pieces_sum_to_the_frequency_in_turns():
    w = decimal.Decimal("0.0215443469003188372175929356651935049525934494219210")
    pieces = exact.turns_split((w,))[:, 0]
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        turns = w / decimal.Decimal(mpmath.nstr(2 * mpmath.pi, 60))
        total = sum(decimal.Decimal(float(f)) for f in pieces)
        assert abs(total - turns) / turns < decimal.Decimal("1e-34")
    # The first three pieces carry at most 22 significant bits so that p * f is exact for |p| <= 2**31.
    for piece in pieces[:3]:
        mantissa, _ = np.frexp(piece)
        assert float(mantissa * 2**22) == int(mantissa * 2**22)
