"""Argument checks shared by every layer of posenc.

Each check raises :class:`TypeError` or :class:`ValueError` with a message that names the argument,
shows the bad value and says how to fix it.  Library code never uses ``assert`` for user input.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is a bool (not merely truthy: ``1`` or ``"yes"`` is refused)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__}); pass True or False")
    return value


def check_int(name: str, value: Any, *, minimum: int | None = None) -> int:
    """Return ``value`` as an int, rejecting bools, floats and values below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__}); pass a whole number")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}; pass an int >= {minimum}")
    return value


def check_float(name: str, value: Any, *, positive: bool = False, minimum: float | None = None) -> float:
    """Return ``value`` as a finite float, optionally requiring ``> 0`` or ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not -math.inf < value < math.inf:                 # (comparisons: traceable, unlike math.isfinite)
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}; pass a positive number")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``; never fall back silently."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value


def check_head_range(num_heads: int, head_range: Any) -> tuple[int, int]:
    """``head_range`` as ``(start, stop)`` with ``0 <= start < stop <= num_heads`` (None: every head):
    the heads of a tensor-parallel rank, out of the full model's ``num_heads``."""
    if head_range is None:
        return 0, num_heads
    if not isinstance(head_range, (tuple, list)) or len(head_range) != 2:
        raise TypeError(
            f"head_range must be a (start, stop) pair of ints, got {head_range!r}; e.g. "
            f"posenc.distributed.head_range(num_heads, rank, world_size)"
        )
    start = check_int("head_range[0]", head_range[0], minimum=0)
    stop = check_int("head_range[1]", head_range[1], minimum=1)
    if not start < stop <= num_heads:
        raise ValueError(f"head_range=({start}, {stop}) must satisfy 0 <= start < stop <= num_heads={num_heads}")
    return start, stop
