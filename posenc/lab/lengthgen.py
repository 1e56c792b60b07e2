"""``posenc compare --task copy|reverse|addition|passkey``: does the model still do the task when longer?

A tiny decoder-only :class:`~posenc.lab.TinyTransformer` per encoding and seed is trained on
examples of sizes 1 to ``train_size`` (each batch one size, drawn uniformly; the loss is the
cross-entropy of the answer tokens only), then tested, without retraining, on ``eval_examples``
fresh examples of each size ``m x train_size``, ``m`` in ``multipliers`` (1, 2, 4, 8), as in
Kazemnejad et al. (2023).  The metric is exact match on the answer tokens (higher is better); the
fraction of answer tokens right is recorded too.

``rope+<rule>`` in ``encodings`` evaluates the RoPE-trained model of the same seed with a
context-extension rule applied at inference, factor = test length / longest training length.

Every (encoding, seed) is a job of its own on one CPU thread (:mod:`posenc.lab.pool`); its data come
from ``random.Random`` seeded by a string of the task, the seed and the size, and its weights from
``torch.manual_seed(seed)``.  The results therefore do not depend on how many jobs ran at once.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from posenc.lab.registry import DEFAULT_ENCODINGS, ENCODINGS
from posenc.lab.results import versions
from posenc.lab.tasks import TASKS, VOCAB_SIZE, sample_example

__all__ = ["ROPE_RULE_NAMES", "TASK_METRICS", "TaskConfig", "run_task", "split_encoding", "summarize"]

#: What the numbers of a task run mean, written to results.json as ``"metrics"``.
TASK_METRICS = {
    "exact_match": {"unit": "fraction of test examples", "better": "higher",
                    "definition": "every answer token (end marker included) is the model's most likely token "
                                  "given the true prefix; equal to greedy decoding being exactly right"},
    "token_accuracy": {"unit": "fraction of answer tokens", "better": "higher",
                       "definition": "answer tokens that are the model's most likely token given the true prefix"},
    "final_train_loss": {"unit": "nats per answer token", "better": "lower",
                         "definition": "cross-entropy of the answer tokens on the last training batch"},
}

#: (training size, steps) of the quick and default runs, per task
_SIZES = {
    "copy": (8, 1000, 3000), "reverse": (8, 1000, 3000), "addition": (3, 1000, 3000), "passkey": (24, 600, 2000),
}


#: The inference-time rules of ``rope+<rule>`` (the keys of :data:`posenc.lab.experiment.ROPE_RULES`,
#: named here so that the command line can check them without importing torch).
ROPE_RULE_NAMES = ("linear", "ntk", "dynamic", "yarn", "llama3")


def split_encoding(name: str) -> tuple[str, str | None]:
    """``"rope+yarn"`` -> ``("rope", "yarn")``; ``"alibi"`` -> ``("alibi", None)``; checked.

    Examples:
        >>> split_encoding("rope+yarn")
        ('rope', 'yarn')
    """
    ROPE_RULES = ROPE_RULE_NAMES
    base, _, rule = name.partition("+")
    if base not in ENCODINGS:
        raise ValueError(f"unknown encoding {name!r}; choose from {', '.join(ENCODINGS)} "
                         f"(or rope+<rule>, rule one of {', '.join(ROPE_RULES)})")
    if rule:
        if base != "rope" or rule not in ROPE_RULES:
            raise ValueError(f"unknown encoding {name!r}: only rope takes a rule, rope+<rule> with rule one of "
                             f"{', '.join(ROPE_RULES)}")
        return base, rule
    return base, None


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """Everything that defines a task run (written to results.json).

    ``workers`` (how many jobs run at once) changes the time a run takes, never its numbers.
    """

    task: str = "copy"
    encodings: tuple[str, ...] = DEFAULT_ENCODINGS
    train_size: int = 8
    multipliers: tuple[int, ...] = (1, 2, 4, 8)
    steps: int = 2500
    batch_size: int = 32
    dim: int = 64
    depth: int = 2
    num_heads: int = 4
    lr: float = 3e-3
    eval_examples: int = 200
    seeds: tuple[int, ...] = (0, 1, 2)
    reverse_answer: bool = True
    workers: int = 1

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose from {', '.join(TASKS)}")
        for name in self.encodings:
            split_encoding(name)
        if not self.seeds:
            raise ValueError("seeds must hold at least one seed, got ()")
        if self.train_size < TASKS[self.task].min_size or min(self.multipliers) < 1:
            raise ValueError(f"train_size and multipliers must be >= 1, got {self.train_size} and {self.multipliers}")
        longest = max(self.multipliers) * self.train_size
        if _seq_len(self.task, longest, self.reverse_answer) > MAX_SEQUENCE:
            largest = largest_train_size(self.task, max(self.multipliers), self.reverse_answer)
            raise ValueError(
                f"train_size={self.train_size} is too large for the {self.task} task: its test at "
                f"{max(self.multipliers)}x ({longest} items) would be a sequence of "
                f"{_seq_len(self.task, longest, self.reverse_answer)} tokens, over {MAX_SEQUENCE} (attention memory "
                f"grows with the square of the length); pass a train_size of at most {largest}")

    @classmethod
    def preset(cls, task: str, *, quick: bool, **overrides: Any) -> TaskConfig:
        """The quick (about 2 CPU-minutes per core pair) or default run of ``task``."""
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
        size, quick_steps, steps = _SIZES[task]
        base: dict[str, Any] = dict(task=task, train_size=size, steps=quick_steps if quick else steps)
        if quick:
            base.update(eval_examples=100)
        else:
            base.update(dim=96, depth=3)
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def eval_sizes(self) -> list[int]:
        return [m * self.train_size for m in self.multipliers]


#: The longest sequence a task trains or tests on (attention memory grows with its square).
MAX_SEQUENCE = 4096


def largest_train_size(task: str, multiplier: int = 8, reverse_answer: bool = True) -> int:
    """The largest training size of ``task`` whose test at ``multiplier`` times it fits :data:`MAX_SEQUENCE`."""
    lo, hi = TASKS[task].min_size, MAX_SEQUENCE
    while lo < hi:                                            # sequences grow with the size: bisect
        mid = (lo + hi + 1) // 2
        if _seq_len(task, mid * multiplier, reverse_answer) <= MAX_SEQUENCE:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _seq_len(task: str, n: int, reverse_answer: bool) -> int:
    return len(sample_example(task, random.Random(0), n, reverse_answer=reverse_answer).tokens)


def _batch(task: str, rng: random.Random, n: int, count: int, reverse_answer: bool):
    import torch

    examples = [sample_example(task, rng, n, reverse_answer=reverse_answer) for _ in range(count)]
    tokens = torch.tensor([e.tokens for e in examples])                          # (B, T)
    return tokens, examples[0].answer_start                                       # same for every row


def _train_job(job: tuple[TaskConfig, str, int], report: Callable[[int, str], None]) -> dict:
    """Train one encoding on one seed, then test it (and its rope rules) at every size."""
    import torch
    import torch.nn.functional as F

    from posenc.lab.experiment import ROPE_RULES
    from posenc.lab.tiny import TinyTransformer

    config, base, seed = job
    rules = [r for n in config.encodings for b, r in [split_encoding(n)] if b == base and r is not None]
    sizes = config.eval_sizes()
    train_max = _seq_len(config.task, config.train_size, config.reverse_answer) - 1
    longest = max(_seq_len(config.task, n, config.reverse_answer) for n in [*sizes, config.train_size])
    torch.manual_seed(seed)
    model = TinyTransformer(VOCAB_SIZE, dim=config.dim, depth=config.depth, num_heads=config.num_heads,
                            encoding=base, causal=True, max_seq_len=longest)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, config.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    rng = random.Random(f"{config.task}/train/{seed}")
    t0 = time.process_time()
    loss = torch.tensor(float("nan"))
    model.train()
    for step in range(config.steps):
        n = rng.randint(TASKS[config.task].min_size, config.train_size)
        tokens, start = _batch(config.task, rng, n, config.batch_size, config.reverse_answer)
        logits = model(tokens[:, :-1])                                            # (B, T - 1, V)
        answer = logits[:, start - 1 :]                                           # predicts tokens[start:]
        loss = F.cross_entropy(answer.reshape(-1, VOCAB_SIZE), tokens[:, start:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 10 == 9 or step == config.steps - 1:
            report(10 if step % 10 == 9 else step % 10 + 1, f"{base} seed {seed} step {step + 1}/{config.steps}")
    model.eval()
    out: dict[str, Any] = {"final_train_loss": float(loss.detach()), "train_cpu_seconds": time.process_time() - t0}
    names = [base, *(f"{base}+{r}" for r in rules)]
    scores: dict[str, dict[str, dict[str, float]]] = {nm: {"exact_match": {}, "token_accuracy": {}} for nm in names}
    with torch.no_grad():
        for n in sizes:
            erng = random.Random(f"{config.task}/test/{seed}/{n}")
            tokens, start = _batch(config.task, erng, n, config.eval_examples, config.reverse_answer)
            for nm, rule in zip(names, [None, *rules], strict=True):
                old = None
                seq = tokens.shape[1] - 1
                if rule is not None and seq > train_max:
                    old = model.with_rope_scaling(ROPE_RULES[rule](seq / train_max, train_max, model.dim // model.num_heads))
                preds = []
                for i in range(0, tokens.shape[0], 50):
                    logits = model(tokens[i : i + 50, :-1])
                    preds.append(logits[:, start - 1 :].argmax(-1))
                pred = torch.cat(preds)                                           # (N, answer length)
                target = tokens[:, start:]
                right = pred == target                                            # (N, answer length)
                scores[nm]["exact_match"][str(n)] = int(right.all(-1).sum()) / right.shape[0]
                scores[nm]["token_accuracy"][str(n)] = int(right.sum()) / right.numel()
                if old is not None:
                    model.pos_module = old
            report(1, f"{base} seed {seed} test {n}")
    out["scores"] = scores
    return out


def summarize(per_seed: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Mean, min, max and standard deviation over seeds of ``per_seed[seed][size]``."""
    sizes = next(iter(per_seed.values())).keys()
    out = {}
    for n in sizes:
        values = [per_seed[s][n] for s in per_seed]
        out[n] = {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
                  "std": statistics.pstdev(values)}
    return out


def run_task(config: TaskConfig, *, progress: bool = True, threads_note: str = "") -> dict:
    """Run every (encoding, seed) job; returns the results dict that ``posenc compare`` writes."""
    import torch

    from posenc.lab.experiment import Progress
    from posenc.lab.pool import run_jobs

    bases = list(dict.fromkeys(split_encoding(n)[0] for n in config.encodings))
    jobs = [(config, base, seed) for seed in config.seeds for base in bases]
    units = config.steps + len(config.multipliers)
    bar = Progress(len(jobs) * units, enabled=progress, warmup=max(3, config.workers * 3))
    t0, c0 = time.monotonic(), time.process_time()
    outputs = run_jobs(_train_job, jobs, workers=config.workers, update=lambda n, note: bar.update(n, note))
    bar.close()
    by_name: dict[str, dict[str, dict[str, dict[str, float]]]] = {}   # metric -> name -> seed -> size
    train_loss: dict[str, dict[str, float]] = {}
    for (_, base, seed), result in zip(jobs, outputs, strict=True):
        train_loss.setdefault(base, {})[str(seed)] = result["final_train_loss"]
        for nm, metrics in result["scores"].items():
            for metric, by_size in metrics.items():
                by_name.setdefault(metric, {}).setdefault(nm, {})[str(seed)] = by_size
    order = [n for n in config.encodings]
    spec = TASKS[config.task]
    return {
        "task": config.task,
        "description": spec.description,
        "size_unit": spec.unit,
        "config": dataclasses.asdict(config),
        "metrics": TASK_METRICS,
        "versions": versions(),
        "per_seed": {m: {nm: by_name[m][nm] for nm in order} for m in by_name},
        "summary": {m: {nm: summarize(by_name[m][nm]) for nm in order} for m in by_name},
        "final_train_loss": train_loss,
        "train_sequence_tokens": _seq_len(config.task, config.train_size, config.reverse_answer),
        "test_sequence_tokens": {str(n): _seq_len(config.task, n, config.reverse_answer) for n in config.eval_sizes()},
        "wall_seconds": round(time.monotonic() - t0, 1),
        "cpu_seconds_this_process": round(time.process_time() - c0, 1),
        "job_cpu_seconds": round(sum(r["train_cpu_seconds"] for r in outputs), 1),
        "threads": {"workers": config.workers, "threads_per_job": 1, "choice": threads_note,
                    "torch_threads_default": torch.get_num_threads()},
        "notes": [
            "exact_match and token_accuracy: one forward pass on the true prefix, argmax at every answer position",
            "sizes are in " + spec.unit + "; training draws sizes 1.." + str(config.train_size) + " uniformly",
            "learned: table sized to the longest test sequence; rows past the training length keep their random init",
            "rope+<rule>: the rope model of the same seed with the rule at factor test length / training length",
        ],
    }

