"""Attention windows and temperatures on tensors, for checked arguments (the public checks are in
``posenc.functional.window`` and ``posenc.attention``).

The conventions are :mod:`posenc.core.schedule`'s: a window ``w`` lets a causal query at ``p`` see
keys ``p - w < k <= p``; a chunk ``c`` keeps a query inside ``k // c == p // c``; a temperature
multiplies each query by a factor of its position or of the number of keys it sees.
"""

from __future__ import annotations

import math

import torch

from posenc._torch.angles import angle_dtype
from posenc.core.schedule import Llama4Temperature, LogNTemperature, SSMaxTemperature, Temperature


def structure_mask(positions: torch.Tensor, key_positions: torch.Tensor, causal: bool, window: int | None,
                   chunk: int | None) -> torch.Tensor | None:
    """Boolean "may attend" ``(S, S_k)`` / ``(B, S, S_k)`` from causality, window and chunk; None if none applies."""
    return score_allowed(causal, window, chunk, positions.unsqueeze(-1), key_positions.unsqueeze(-2))


def score_allowed(causal: bool, window: int | torch.Tensor | None, chunk: int | torch.Tensor | None, qp: torch.Tensor,
                  kp: torch.Tensor):
    """The rule of :func:`structure_mask` on positions that broadcast against each other: flex_attention's
    scalar positions (``qp``, ``kp``: gathered positions), or ``(..., S, 1)`` against ``(..., 1, S_k)``
    (``//`` of integer tensors rounds towards minus infinity, as the chunk rule needs).  ``window`` and
    ``chunk`` may be 0-d integer tensors (flex_attention's masks take them as data, not as constants)."""
    ok = None

    def both(a, b):
        return b if a is None else a & b
    if causal:
        ok = kp <= qp
    if window is not None:
        ok = both(ok, kp > qp - window)
        if not causal:
            ok = ok & (kp < qp + window)
    if chunk is not None:
        ok = both(ok, (kp // chunk) == (qp // chunk))
    return ok


def temperature_factors(temperature: Temperature, positions: torch.Tensor, visible: torch.Tensor | None,
                        dtype: torch.dtype) -> torch.Tensor:
    """Per-query factors, the shape of ``positions`` (or of ``visible`` for SSMax), in ``dtype``.

    Computed in float64 from integer positions and rounded once (in float32 on a device without
    float64, such as Apple's MPS).
    """
    work = angle_dtype(positions.device)
    if isinstance(temperature, Llama4Temperature):
        steps = torch.floor((positions.to(work) + 1.0) / temperature.floor_scale)
        out = torch.log1p(steps) * temperature.attn_scale + 1.0
    elif isinstance(temperature, LogNTemperature):
        n = positions.to(work) + 1.0
        length = temperature.original_max_seq_len
        out = torch.where(n > length, torch.log(n.clamp(min=1.0)) / math.log(length), torch.ones_like(n))
    elif isinstance(temperature, SSMaxTemperature):
        assert visible is not None                                           # the caller counts the keys
        out = temperature.s * torch.log(visible.to(work).clamp(min=1.0))
    else:                                                                    # a rule without a torch formula
        raise ValueError(f"temperature {temperature!r} has no torch implementation")
    return out.to(dtype)
