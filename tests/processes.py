"""Run a test's worker in ``world`` CPU processes on the gloo backend, bounded in time, and collect what each
rank wrote: the multi-process tests of context and tensor parallelism share it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch

TIME_LIMIT = 240                                                     # seconds for one group of processes


def _entry(rank: int, worker: Callable[..., object], world: int, store: str, result_dir: str, args: tuple) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)                                        # two cores for up to four processes
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        result = worker(rank, world, *args)
        with open(os.path.join(result_dir, f"rank{rank}.done"), "w") as f:
            f.write(str(result))
    finally:
        dist.destroy_process_group()


def run_ranks(worker: Callable[..., object], world: int, tmp_path: Path, *args: object,
              limit: float = TIME_LIMIT) -> list[str]:
    """Start ``worker(rank, world, *args)`` in ``world`` spawned processes (a gloo group over all of them is
    initialised first and destroyed after); return what each returned, as text, in rank order.  A process
    that fails fails the test; none is left behind."""
    mp = pytest.importorskip("torch.multiprocessing")
    context = mp.start_processes(_entry, args=(worker, world, str(tmp_path / "store"), str(tmp_path), args),
                                 nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + limit
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail(f"the {world} processes did not finish within {limit} s")
    finally:
        for p in context.processes:                                  # never leave a process behind
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
    return [(tmp_path / f"rank{r}.done").read_text() for r in range(world)]
