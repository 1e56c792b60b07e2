"""Every ``posenc compare --task``, in one registry: how each builds its configuration from the
command's options, runs, formats its results and draws its figure.

The command line reads this table for its choices, its checks (which options a task takes) and
its one pipeline: configure, run, print, write ``results.json``, draw.  Importing it needs no
torch; each entry imports what it runs when it runs.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from posenc.lab.tasks import TASKS

__all__ = ["CompareOptions", "LAB_TASKS", "LabTask", "SEQUENCE_TASKS"]

#: The length-generalisation tasks of :mod:`posenc.lab.lengthgen` (copy, reverse, addition, passkey).
SEQUENCE_TASKS: tuple[str, ...] = tuple(TASKS)


@dataclasses.dataclass(frozen=True)
class CompareOptions:
    """The options of one ``posenc compare`` run, as the command line checked them (None: the
    task's own default)."""

    encodings: tuple[str, ...]
    quick: bool = False
    train_len: int | None = None
    steps: int | None = None
    seed: int = 0
    seeds: int | None = None
    eval_lens: tuple[int, ...] | None = None
    addition_order: str | None = None
    device: str = "cpu"
    threads: int | None = None
    threads_note: str = ""
    progress: bool = True

    def seed_list(self) -> tuple[int, ...]:
        """``seed, seed + 1, ...``: ``seeds`` of them (3 by default)."""
        return tuple(range(self.seed, self.seed + (self.seeds or 3)))


@dataclasses.dataclass(frozen=True)
class LabTask:
    """One ``--task``: ``run(options)`` returns the results dict written to ``results.json``,
    ``format(results)`` the text printed, ``figure(results)`` a matplotlib figure (None: no figure).

    ``takes`` names the task-only options it reads (``"eval_lens"``, ``"seeds"``,
    ``"addition_order"``, ``"rope_rules"`` for ``rope+<rule>`` encodings); ``parallel`` says
    whether it runs jobs side by side on one thread each (CPU only) rather than one model on
    ``threads`` threads.
    """

    name: str
    run: Callable[[CompareOptions], dict]
    format: Callable[[dict], str]
    figure: Callable[[dict], Any] | None
    figure_file: str | None
    takes: frozenset[str]
    parallel: bool


def _lazy(module: str, name: str) -> Callable[..., Any]:
    """``module.name``, imported when called (the registry itself imports neither torch nor matplotlib)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)
    call.__name__ = name
    return call


def _run_lm(options: CompareOptions) -> dict:
    from posenc.lab.experiment import CompareConfig, compare

    overrides: dict[str, Any] = {"encodings": options.encodings, "train_len": options.train_len or 64,
                                 "eval_lens": options.eval_lens or (64, 128, 256, 512), "seed": options.seed,
                                 "device": options.device, "threads": options.threads}
    if options.steps is not None:
        overrides["steps"] = options.steps
    config = CompareConfig.quick(**overrides) if options.quick else CompareConfig(**overrides)
    results = compare(config, progress=options.progress)
    results["threads_choice"] = options.threads_note
    return results


def _run_position(options: CompareOptions) -> dict:
    from posenc.lab.experiment import position_task

    return position_task(options.encodings, steps=options.steps or (150 if options.quick else 400),
                         seed=options.seed, progress=options.progress, device=options.device,
                         threads=options.threads)


def _format_position(results: dict) -> str:
    return "\n".join([f"position task (bidirectional, length {results['length']}, chance {results['chance']:.3f}; "
                      "accuracy, higher is better)",
                      *(f"{name:<12} accuracy {acc:.3f}" for name, acc in results["accuracy"].items())])


def _sequence_task(task: str) -> Callable[[CompareOptions], dict]:
    def run(options: CompareOptions) -> dict:
        from posenc.lab.lengthgen import TaskConfig, run_task

        config = TaskConfig.preset(task, quick=options.quick, encodings=options.encodings,
                                   train_size=options.train_len, steps=options.steps, seeds=options.seed_list(),
                                   workers=options.threads, reverse_answer=options.addition_order != "plain")
        return run_task(config, progress=options.progress, threads_note=options.threads_note)
    return run


def _run_extend(options: CompareOptions) -> dict:
    from posenc.lab.extend import ExtendConfig, run_extend

    config = ExtendConfig.preset(quick=options.quick, train_len=options.train_len, steps=options.steps,
                                 seeds=options.seed_list(), workers=options.threads)
    return run_extend(config, progress=options.progress, threads_note=options.threads_note)


LAB_TASKS: dict[str, LabTask] = {
    task.name: task for task in (
        LabTask("lm", _run_lm, _lazy("posenc.lab.results", "format_results"),
                _lazy("posenc.lab.plots", "compare_figure"), "compare.png", frozenset({"eval_lens"}), False),
        LabTask("position", _run_position, _format_position, None, None, frozenset(), False),
        *(LabTask(name, _sequence_task(name), _lazy("posenc.lab.results", "format_task_results"),
                  _lazy("posenc.lab.plots", "task_figure"), f"{name}.png",
                  frozenset({"seeds", "rope_rules", *(("addition_order",) if name == "addition" else ())}), True)
          for name in SEQUENCE_TASKS),
        LabTask("extend", _run_extend, _lazy("posenc.lab.results", "format_extend_results"),
                _lazy("posenc.lab.plots", "extend_figure"), "extend.png", frozenset({"seeds"}), True),
    )
}
