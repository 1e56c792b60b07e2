"""Shared timing helpers for the CPU benchmarks: medians from blocked_autorange, spread over repeats."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from torch.utils.benchmark import Timer


def median_seconds(fn: Callable[[], object], *, min_run_time: float = 0.4) -> float:
    """Median wall time of ``fn()`` from ``torch.utils.benchmark.Timer.blocked_autorange``."""
    with torch.inference_mode():
        return Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median


def repeated(fn: Callable[[], object], repeats: int = 3, **kw) -> list[float]:
    """``repeats`` independent medians (the spread shows how noisy this shared machine is)."""
    return [median_seconds(fn, **kw) for _ in range(repeats)]


def ratio_cell(times: list[float], limit: list[float]) -> str:
    """``median ratio (min-max)`` of ``times[i] / limit[i]`` over the repeats."""
    ratios = [t / lim for t, lim in zip(times, limit, strict=True)]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def ms(times: list[float]) -> str:
    return f"{statistics.median(times) * 1e3:.2f}"
