"""Multimodal RoPE (M-RoPE, Qwen2-VL): which position axis drives each frequency slot (framework-free).

M-RoPE keeps one RoPE frequency schedule ``theta_j = base^(-2j/dim)``, ``j = 0 .. dim/2 - 1``, and
gives every token three positions: temporal ``t``, height ``h`` and width ``w``.  Frequency slot
``j`` turns by ``p_a(j) * theta_j``, where the *plan* ``a(j)`` names the axis that drives slot ``j``:

- ``"sections"`` (Qwen2-VL, Qwen2.5-VL): ``mrope_section = (s_t, s_h, s_w)`` splits the slots into
  three contiguous runs, ``t`` for ``j < s_t``, ``h`` for ``j < s_t + s_h``, ``w`` for the rest::

      slot  0 .. s_t-1 | s_t .. s_t+s_h-1 | s_t+s_h .. dim/2-1
      axis  t  t  t  t | h  h  h  h  h  h | w  w  w  w  w  w

- interleaved (Qwen3-VL, ``mrope_interleaved``): slot ``j`` takes ``h`` when ``j % 3 == 1`` and
  ``j < 3 s_h``, ``w`` when ``j % 3 == 2`` and ``j < 3 s_w``, else ``t``::

      slot  0 1 2 3 4 5 6 ... | ... dim/2-1
      axis  t h w t h w t ... | t t t

Text tokens have ``p_t = p_h = p_w``, so for them M-RoPE is ordinary RoPE.  In both cases each slot
rotates one feature pair (``i, i + dim/2`` in the half layout Hugging Face uses).

References:
    Wang et al., "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World at Any
    Resolution", arXiv:2409.12191 (section 2.1, Multimodal Rotary Position Embedding).
    Bai et al., "Qwen2.5-VL Technical Report", arXiv:2502.13923 (absolute time encoding).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from posenc import _validate

__all__ = ["MROPE_AXES", "check_mrope_section", "mrope_axis_plan", "mrope_axis_slots"]

#: The three position axes of M-RoPE, in the order of ``mrope_section`` and of the positions' last axis ``(..., 3)``.
MROPE_AXES = ("t", "h", "w")


def check_mrope_section(mrope_section: object, dim: int) -> tuple[int, int, int]:
    """``mrope_section`` as three non-negative ints ``(s_t, s_h, s_w)`` summing to ``dim / 2``.

    Examples:
        >>> check_mrope_section([16, 24, 24], 128)
        (16, 24, 24)
    """
    dim = _validate.check_int("dim", dim, minimum=2)
    if isinstance(mrope_section, (str, bytes)) or not isinstance(mrope_section, Sequence) or len(mrope_section) != 3:
        raise ValueError(
            f"mrope_section must be a sequence of three frequency-slot counts (t, h, w), e.g. [16, 24, 24] for "
            f"dim=128; got {mrope_section!r}"
        )
    section = tuple(_validate.check_int(f"mrope_section[{i}]", s, minimum=0) for i, s in enumerate(mrope_section))
    if sum(section) != dim // 2 or dim % 2:
        raise ValueError(
            f"mrope_section={list(section)} sums to {sum(section)} frequency slots, but dim={dim} has {dim / 2:g} "
            f"(one per feature pair); the counts must sum to dim/2 (mrope_section counts pairs, not features)"
        )
    return section  # type: ignore[return-value]


def mrope_axis_plan(dim: int, mrope_section: object, *, interleaved: bool = False) -> np.ndarray:
    """The axis (0 = t, 1 = h, 2 = w) that drives each frequency slot: int64 ``(dim/2,)``.

    Args:
        dim: the rotary dim (two features per slot).
        mrope_section: slot counts ``(s_t, s_h, s_w)`` summing to ``dim / 2``.
        interleaved: Qwen3-VL's ``t, h, w, t, h, w, ...`` assignment instead of contiguous sections.

    Examples:
        >>> mrope_axis_plan(12, [2, 2, 2]).tolist()
        [0, 0, 1, 1, 2, 2]
        >>> mrope_axis_plan(12, [2, 2, 2], interleaved=True).tolist()
        [0, 1, 2, 0, 1, 2]
    """
    section = check_mrope_section(mrope_section, dim)
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved (mrope_interleaved) must be a bool, got {interleaved!r}")
    half = dim // 2
    if not interleaved:
        return np.repeat(np.arange(3, dtype=np.int64), section)
    plan = np.zeros(half, dtype=np.int64)
    j = np.arange(half)
    for axis in (1, 2):
        plan[(j % 3 == axis) & (j < 3 * section[axis])] = axis
    counts = tuple(int((plan == a).sum()) for a in range(3))
    if counts != section:
        raise ValueError(
            f"interleaved mrope_section={list(section)} does not fit dim={dim}: slots j % 3 == 1 below 3*s_h and "
            f"j % 3 == 2 below 3*s_w must exist for every h and w slot (got counts {list(counts)}); shrink s_h or "
            f"s_w or use contiguous sections"
        )
    return plan


def mrope_axis_slots(plan: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The frequency slots of each axis (t, h, w), increasing, from :func:`mrope_axis_plan`.

    Examples:
        >>> [s.tolist() for s in mrope_axis_slots(mrope_axis_plan(12, [2, 2, 2], interleaved=True))]
        [[0, 3], [1, 4], [2, 5]]
    """
    plan = np.asarray(plan)
    return tuple(np.flatnonzero(plan == a).astype(np.int64) for a in range(3))  # type: ignore[return-value]
