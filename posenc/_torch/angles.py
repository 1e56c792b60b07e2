"""Exact angles on torch tensors, and the working precision of every rotation (not public)."""

from __future__ import annotations

import torch

from posenc.core import exact


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision rotations run in: float64 for float64 inputs, else float32 (rounded once to the
    input dtype at the end)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _no_autocast(device: torch.device) -> torch.autocast:
    """Autocast off for ``device`` (the meta device has no autocast of its own: CPU's stands in)."""
    return torch.autocast(device_type="cpu" if device.type == "meta" else device.type, enabled=False)


def exact_sin_cos(positions: torch.Tensor, turns) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 ``(sin, cos)`` of ``positions (...) * frequencies`` -> ``(..., n)``, see core.exact.

    ``turns`` is the ``(4, n)`` split of :func:`posenc.core.exact.turns_split`, as a NumPy array or
    a float64 tensor (e.g. a module buffer) on ``positions.device``.  Autocast is off: the angles
    never drop below float64, whatever the ambient precision.
    """
    if not isinstance(turns, torch.Tensor):
        turns = torch.tensor(turns, dtype=torch.float64, device=positions.device)
    with _no_autocast(positions.device):
        return exact.sin_cos(positions.to(torch.float64), turns, xp=torch)


def exact_cos_sin(positions: torch.Tensor, turns, attention_factor: float, dtype: torch.dtype):
    """``(cos, sin)`` of ``positions (...)`` with split frequencies ``turns (4, h)`` -> ``(..., h)``,
    times ``attention_factor``, each rounded once to ``dtype``."""
    s, c = exact_sin_cos(positions, turns)
    if attention_factor != 1.0:
        c, s = c * attention_factor, s * attention_factor
    return c.to(dtype), s.to(dtype)


def float64_cos_sin(positions: torch.Tensor, freqs: torch.Tensor, attention_factor: float, dtype: torch.dtype):
    """``(cos, sin)`` of ``positions (...) * freqs (h,)`` in plain float64 (not split: within a few
    float64 ulps of the angle), times ``attention_factor``, rounded to ``dtype``.  For frequencies
    that exist only inside a traced graph."""
    with _no_autocast(positions.device):
        angles = positions.to(torch.float64).unsqueeze(-1) * freqs
        c, s = torch.cos(angles), torch.sin(angles)
        if attention_factor != 1.0:
            c, s = c * attention_factor, s * attention_factor
        return c.to(dtype), s.to(dtype)

