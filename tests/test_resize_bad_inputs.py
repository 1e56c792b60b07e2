"""Bad inputs of resize_position_embedding (Dosovitskiy et al. 2021, section 3.2).

Each case either matches an independent float64 reference from ``tests/reference/`` or raises
``ValueError``/``TypeError`` naming the offending argument; any other exception or any warning fails it
(``tests/bad_inputs.py``).  ``tests/test_bad_inputs.py`` walks every public name against these cases.
"""

from __future__ import annotations

import pytest
import torch

from posenc.functional.resize import resize_position_embedding
from tests.bad_inputs import (
    META,
    NAN,
    Cases,
    arr,
    close,
    is_meta,
    rand,
    run_case,
)
from tests.reference.resize_oracle import linear_1d as ref_linear_1d
from tests.reference.resize_oracle import resize_2d as ref_resize_2d

CASES = Cases()
bad, good = CASES.bad, CASES.good


# resize_position_embedding: the reference is an independent recipe, reshape + torch.nn.functional.interpolate(align_corners=False)
_TAB = rand(1 + 4, 3, seed=41)                                                      # class token + a 2x2 grid
for _id, _call, _exc, _match in [
    ("table-list", lambda: resize_position_embedding([[0.0] * 3] * 5, (3, 3)), TypeError, "table must be a torch.Tensor"),
    ("table-int", lambda: resize_position_embedding(torch.zeros(5, 3, dtype=torch.long), (3, 3)), TypeError,
     "table must be a floating tensor"),
    ("table-1-d", lambda: resize_position_embedding(torch.zeros(5), 2), ValueError, r"table must have shape \(N, C\)"),
    ("table-0-d", lambda: resize_position_embedding(torch.tensor(1.0), 2), ValueError, r"table must have shape \(N, C\)"),
    ("table-batch-of-tables", lambda: resize_position_embedding(torch.zeros(2, 5, 3), (3, 3)), ValueError,
     r"table must have shape \(N, C\) or \(1, N, C\)"),
    ("new_size-0", lambda: resize_position_embedding(_TAB, 0), ValueError, "new_size must be >= 1"),
    ("new_size-negative", lambda: resize_position_embedding(_TAB, -1), ValueError, "new_size must be >= 1"),
    ("new_size-float", lambda: resize_position_embedding(_TAB, 2.0), TypeError, "new_size must be an int .* or a pair"),
    ("new_size-nan", lambda: resize_position_embedding(_TAB, NAN), TypeError, "new_size must be an int .* or a pair"),
    ("new_size-bool", lambda: resize_position_embedding(_TAB, True), TypeError, "new_size must be an int .* or a pair"),
    ("new_size-str", lambda: resize_position_embedding(_TAB, "3"), TypeError, "new_size must be an int .* or a pair"),
    ("new_size-tensor", lambda: resize_position_embedding(_TAB, torch.tensor(3)), TypeError, "new_size must be an int"),
    ("new_size-triple", lambda: resize_position_embedding(_TAB, (2, 2, 2)), TypeError, "new_size must be an int .* or a pair"),
    ("new_size-pair-0", lambda: resize_position_embedding(_TAB, (0, 2)), ValueError, r"new_size\[0\] must be >= 1"),
    ("new_size-pair-float", lambda: resize_position_embedding(_TAB, (3, 3.0)), TypeError, r"new_size\[1\] must be an int"),
    ("old_size-mismatch-1-d", lambda: resize_position_embedding(_TAB, 8, old_size=3), ValueError,
     "old_size=3 does not match the table: N=5 rows minus prefix_tokens=1 leaves 4"),
    ("old_size-0-1-d", lambda: resize_position_embedding(_TAB, 8, old_size=0), ValueError, "old_size must be >= 1"),
    ("old_size-pair-for-1-d", lambda: resize_position_embedding(_TAB, 8, old_size=(2, 2)), TypeError,
     "old_size must be an int like new_size=8"),
    ("old_size-float-1-d", lambda: resize_position_embedding(_TAB, 8, old_size=4.0), TypeError, "old_size must be an int"),
    ("old_size-int-for-2-d", lambda: resize_position_embedding(_TAB, (3, 3), old_size=4), TypeError,
     r"old_size must be a pair \(H, W\)"),
    ("old_size-mismatch-2-d", lambda: resize_position_embedding(_TAB, (3, 3), old_size=(1, 3)), ValueError,
     r"old_size=\(1, 3\) holds 3 positions but the table has 4 grid rows"),
    ("old_size-pair-0", lambda: resize_position_embedding(_TAB, (3, 3), old_size=(0, 4)), ValueError, r"old_size\[0\] must be >= 1"),
    ("not-a-square", lambda: resize_position_embedding(torch.zeros(7, 3), (3, 3)), ValueError,
     r"6 rows .* not a square; pass old_size=\(H, W\)"),
    ("prefix_tokens-negative", lambda: resize_position_embedding(_TAB, 2, prefix_tokens=-1), ValueError,
     "prefix_tokens must be >= 0"),
    ("prefix_tokens-float", lambda: resize_position_embedding(_TAB, 2, prefix_tokens=1.0), TypeError,
     "prefix_tokens must be an int"),
    ("prefix_tokens-whole-table", lambda: resize_position_embedding(_TAB, 2, prefix_tokens=5), ValueError,
     "prefix_tokens=5 leaves no grid rows in a table of N=5 rows"),
    ("mode-unknown", lambda: resize_position_embedding(_TAB, 2, mode="lanczos"), ValueError, "mode must be one of"),
    ("mode-int", lambda: resize_position_embedding(_TAB, 2, mode=3), ValueError, "mode must be one of"),
    ("mode-2-d-for-1-d", lambda: resize_position_embedding(_TAB, 2, mode="bicubic"), ValueError,
     "mode='bicubic' is not a mode of a 1-D table"),
    ("mode-1-d-for-2-d", lambda: resize_position_embedding(_TAB, (3, 3), mode="linear"), ValueError,
     "mode='linear' is not a mode of a 2-D grid"),
    ("antialias-nearest", lambda: resize_position_embedding(_TAB, (3, 3), mode="nearest"), ValueError,
     "antialias=True applies to the cubic and linear modes only"),
    ("antialias-int", lambda: resize_position_embedding(_TAB, 2, antialias=1), TypeError, "antialias must be a bool"),
]:
    bad("resize_position_embedding", _id, _call, _exc, _match)


def _resize_good(case_id, make, run, want, atol=1e-6, exact_dtype=True):
    def thunk():
        t = make()
        return run(t), t

    def check(r):
        out, t = r
        w = want(t)
        assert out.dtype == t.dtype and tuple(out.shape) == tuple(w.shape), (out.dtype, out.shape, w.shape)
        if exact_dtype and t.dtype in (torch.bfloat16, torch.float16):
            assert torch.equal(out, w), "a half table is resized in float32 and rounded once"
        close(out, arr(w), atol=atol, rtol=max(atol, 1e-6))
    good("resize_position_embedding", case_id, thunk, check)


for _id, _make, _run, _want, _atol in [
    ("2-d-upsample", lambda: rand(1 + 4, 3, seed=42), lambda t: resize_position_embedding(t, (3, 5)),
     lambda t: ref_resize_2d(t, (3, 5), (2, 2), 1), 1e-6),
    ("2-d-downsample-antialias", lambda: rand(1, 2 + 16, 4, seed=43), lambda t: resize_position_embedding(t, (3, 2), prefix_tokens=2),
     lambda t: ref_resize_2d(t, (3, 2), (4, 4), 2), 1e-6),
    ("2-d-non-square-old_size", lambda: rand(6, 2, seed=44), lambda t: resize_position_embedding(
        t, (4, 6), old_size=(2, 3), prefix_tokens=0, mode="bilinear"), lambda t: ref_resize_2d(t, (4, 6), (2, 3), 0, "bilinear"), 1e-6),
    ("2-d-1x1-grid", lambda: rand(2, 3, seed=45), lambda t: resize_position_embedding(t, (3, 3), mode="nearest", antialias=False),
     lambda t: torch.cat([t[:1], t[1:].expand(9, 3)]), 0),
    ("2-d-to-1x1-area", lambda: rand(1 + 4, 3, seed=46), lambda t: resize_position_embedding(t, (1, 1), mode="area",
                                                                                                antialias=False),
     lambda t: torch.cat([t[:1], t[1:].mean(0, keepdim=True)]), 1e-6),
    ("2-d-bfloat16", lambda: rand(1 + 9, 4, seed=47, dtype=torch.bfloat16), lambda t: resize_position_embedding(t, (5, 4)),
     lambda t: ref_resize_2d(t, (5, 4), (3, 3), 1), 0),
    ("2-d-float64", lambda: rand(1 + 9, 4, seed=48, dtype=torch.float64), lambda t: resize_position_embedding(t, (2, 5)),
     lambda t: ref_resize_2d(t, (2, 5), (3, 3), 1), 1e-12),
    ("2-d-non-contiguous", lambda: rand(3, 1 + 4, seed=49).T, lambda t: resize_position_embedding(t, (3, 3)),
     lambda t: ref_resize_2d(t.contiguous(), (3, 3), (2, 2), 1), 1e-6),
    ("1-d-linear-prefix", lambda: rand(2 + 4, 3, seed=50), lambda t: resize_position_embedding(
        t, 7, prefix_tokens=2, mode="linear", antialias=False),
     lambda t: torch.cat([t[:2], torch.tensor(ref_linear_1d(arr(t[2:]), 7), dtype=t.dtype)]), 1e-6),
    ("1-d-nearest-one-row", lambda: rand(1, 3, seed=51), lambda t: resize_position_embedding(
        t, 4, prefix_tokens=0, mode="nearest", antialias=False), lambda t: t.expand(4, 3), 0),
    ("1-d-rank-3", lambda: rand(1, 1 + 3, 2, seed=52), lambda t: resize_position_embedding(t, 6, mode="linear", antialias=False),
     lambda t: torch.cat([t[:, :1], torch.tensor(ref_linear_1d(arr(t[0, 1:]), 6), dtype=t.dtype)[None]], 1), 1e-6),
    ("nan-stays-in-its-rows", lambda: torch.tensor([[NAN, 1.0], [0.0, 2.0], [1.0, 4.0]]), lambda t: resize_position_embedding(
        t, 4, prefix_tokens=1, mode="nearest", antialias=False), lambda t: t[[0, 1, 1, 2, 2]], 0),
    # a table without features resizes to a table without features (today: a RuntimeError from interpolate)
    ("no-channels", lambda: torch.zeros(1 + 4, 0), lambda t: resize_position_embedding(t, (3, 3)),
     lambda t: torch.zeros(1 + 9, 0), 0),
]:
    _resize_good(_id, _make, _run, _want, _atol)
good("resize_position_embedding", "same-size-is-the-table", lambda: (lambda t: (resize_position_embedding(t, (2, 2)), t))(_TAB),
     lambda r: (r[0] is r[1]) or pytest.fail("a resize to the same grid returns the table itself"))
good("resize_position_embedding", "same-size-1-d", lambda: (lambda t: (resize_position_embedding(t, 4, old_size=4), t))(_TAB),
     lambda r: (r[0] is r[1]) or pytest.fail("a resize to the same length returns the table itself"))
good("resize_position_embedding", "meta", lambda: resize_position_embedding(torch.zeros(1, 1 + 4, 3, device=META), (3, 2)),
     is_meta((1, 7, 3)))


@pytest.mark.parametrize("name, thunk, error, check", CASES.params)
def test_bad_input(name, thunk, error, check):
    run_case(thunk, error, check)
