"""Bad inputs of rope_and_cache.

Each case either matches an independent float64 reference from ``tests/reference/`` or raises
``ValueError``/``TypeError`` naming the offending argument; any other exception or any warning fails it
(``tests/bad_inputs.py``).  ``tests/test_bad_inputs.py`` walks every public name against these cases.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posenc.functional as F
from tests.bad_inputs import (
    C8,
    S8,
    Cases,
    close,
    rand,
    ref_rope,
    run_case,
)

CASES = Cases()
bad, good = CASES.bad, CASES.good


# rope_and_cache: rotate q and k and write k and v into a preallocated cache (contiguous or paged)
def _cache_call(kind: str, **kw):
    q, k, v = rand(2, 2, 3, 8, seed=11), rand(2, 1, 3, 8, seed=12), rand(2, 1, 3, 8, seed=13)   # (B, H, S, D)
    kc, vc = torch.zeros(2, 1, 6, 8), torch.zeros(2, 1, 6, 8)                                  # (B, Hk, S_max, D)
    args = {"cache_seqlens": torch.tensor([0, 2])}
    if kind == "paged":
        q, k, v = q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1)            # (T=3, H, D)
        kc, vc = torch.zeros(3, 2, 1, 8), torch.zeros(3, 2, 1, 8)                              # (blocks, size, Hk, D)
        args = {"slots": torch.tensor([4, -1, 1]), "positions": torch.tensor([5, 0, 7])}
    args.update(kw)
    return F.rope_and_cache(q, k, v, kc, vc, C8, S8, **args), (q, k, v, kc, vc)


def _check_contiguous_cache(out):
    q_rot, (q, k, v, kc, vc) = out
    pos = np.array([[0, 1, 2], [2, 3, 4]])
    close(q_rot, np.stack([ref_rope(q[b], pos[b]) for b in range(2)]))
    for b, start in ((0, 0), (1, 2)):
        close(kc[b, :, start:start + 3], ref_rope(k[b], pos[b]))
        close(vc[b, :, start:start + 3], v[b].numpy())
    close(kc[0, :, 3:], np.zeros((1, 3, 8)))


def _check_paged_cache(out):
    q_rot, (q, k, v, kc, vc) = out
    pos = np.array([5, 0, 7])
    close(q_rot, ref_rope(q.transpose(0, 1), pos).transpose(1, 0, 2))
    close(kc[2, 0], ref_rope(k[0:1].transpose(0, 1), pos[0:1]).transpose(1, 0, 2)[0])
    close(vc[0, 1], v[2].numpy())
    assert int(vc.ne(0).any(-1).sum()) == 2                                  # the slot -1 token is not written


good("rope_and_cache", "contiguous-gqa", lambda: _cache_call("contiguous"), _check_contiguous_cache)
good("rope_and_cache", "paged-slot-minus-1", lambda: _cache_call("paged"), _check_paged_cache)
for _id, _kind, _kw, _exc, _match in [
    ("both-kinds", "contiguous", {"slots": torch.tensor([0, 1, 2])}, ValueError, "exactly one of cache_seqlens and slots"),
    ("seqlens-float", "contiguous", {"cache_seqlens": torch.tensor([0.0, 2.0])}, TypeError, "cache_seqlens must be an integer"),
    ("seqlens-shape", "contiguous", {"cache_seqlens": torch.tensor([0])}, ValueError, r"cache_seqlens must have shape \(2,\)"),
    ("cache-overflow", "contiguous", {"cache_seqlens": torch.tensor([0, 4])}, ValueError, "S_max=6"),
    ("slot-past-cache", "paged", {"slots": torch.tensor([6, 0, 1])}, ValueError, "slots must be < num_blocks"),
    ("paged-no-positions", "paged", {"positions": None}, ValueError, "positions .* are required with slots"),
    ("position-past-table", "paged", {"positions": torch.tensor([8, 0, 0])}, ValueError, r"must lie in \[0, 8\)"),
    ("assume-valid-int", "paged", {"assume_valid": 1}, TypeError, "assume_valid must be a bool"),
    ("layout", "paged", {"layout": "neox"}, ValueError, "layout must be one of"),
]:
    bad("rope_and_cache", _id, lambda kind=_kind, kw=_kw: _cache_call(kind, **kw), _exc, _match)


@pytest.mark.parametrize("name, thunk, error, check", CASES.params)
def test_bad_input(name, thunk, error, check):
    run_case(thunk, error, check)
