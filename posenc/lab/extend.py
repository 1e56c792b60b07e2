"""``posenc compare --task extend``: which context-extension rule to fine-tune a RoPE model with.

Per seed, a byte-level RoPE :class:`~posenc.lab.TinyTransformer` is trained on windows of
``train_len`` bytes of Python's standard library (:mod:`posenc.lab.corpus`).  Then, for each rule,
a copy of it is fine-tuned on windows of ``factor x train_len`` bytes with the rule at that
``factor`` (plain RoPE, no rule, is the control), and the validation loss is measured at every
checkpoint of the fine-tuning, at the fine-tuning length and at 1x to 16x ``train_len``.

The fine-tuning learning rate is constant after a 5-step warm-up, so a budget of 25 steps is the
first 25 steps of the 100-step run: every budget comes from one run per rule and seed.  Step 0 is the
rule applied at inference with no fine-tuning.  The reported "steps to target" is the first
checkpoint whose loss at the fine-tuning length is at most the base model's loss at its own
training length (None: not reached within the budget), the criterion of Peng et al. (2023, YaRN,
Figure 2 and section 4), who compare rules by the fine-tuning steps they need for a given perplexity.

The rules (Peng et al. 2023 compare the first four):

- ``rope``: no rule (control); the model must learn the new positions by fine-tuning alone.
- ``linear``: position interpolation (PI, Chen et al. 2023), every frequency divided by ``factor``.
- ``ntk``: NTK-aware scaling (bloc97 2023), the base raised to ``factor^(d/(d-2))``.
- ``yarn``: YaRN (Peng et al. 2023): NTK-by-parts interpolation and the attention temperature.
- ``longrope``: LongRoPE-style per-pair factors (Ding et al. 2024) without LongRoPE's search: pair
  ``i`` of ``P`` is divided by ``factor^(i / (P - 1))``, from 1 for the fastest pair to ``factor``
  for the slowest, with LongRoPE's attention factor; original RoPE up to ``train_len``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from posenc.lab.results import versions

__all__ = ["EXTEND_METRICS", "EXTEND_RULES", "ExtendConfig", "extension_rule", "run_extend"]

EXTEND_RULES = ("rope", "linear", "ntk", "yarn", "longrope")

EXTEND_METRICS = {
    "loss": {"unit": "nats per byte", "better": "lower",
             "definition": "mean next-byte cross-entropy over non-overlapping validation windows of each length"},
    "steps_to_target": {"unit": "fine-tuning steps", "better": "lower",
                        "definition": "first checkpoint whose loss at the fine-tuning length is at most the base "
                                      "model's loss at its training length; null if not reached"},
}


def extension_rule(rule: str, factor: float, train_len: int, head_dim: int):
    """The :class:`~posenc.RopeScaling` of ``rule`` (None for plain ``rope``), as
    :func:`posenc.lab.rules.lab_rule` builds it."""
    from posenc.lab.rules import lab_rule

    if rule == "rope":
        return None
    if rule not in EXTEND_RULES:
        raise ValueError(f"unknown extension rule {rule!r}; choose from {', '.join(EXTEND_RULES)}")
    return lab_rule(rule, factor, train_len, head_dim)


@dataclasses.dataclass(frozen=True)
class ExtendConfig:
    """Everything that defines an extension run (written to results.json)."""

    rules: tuple[str, ...] = EXTEND_RULES
    train_len: int = 32
    factor: int = 4
    multipliers: tuple[int, ...] = (1, 2, 4, 8, 16)
    steps: int = 1500
    finetune_steps: int = 100
    checkpoints: tuple[int, ...] = (0, 5, 10, 25, 50, 100)
    budgets: tuple[int, ...] = (0, 25, 100)
    batch_size: int = 16
    dim: int = 96
    depth: int = 3
    num_heads: int = 4
    lr: float = 2e-3
    finetune_lr: float = 1e-3
    eval_windows: int = 24
    corpus_bytes: int | None = 3_000_000
    seeds: tuple[int, ...] = (0, 1, 2)
    workers: int = 1

    def __post_init__(self) -> None:
        for rule in self.rules:
            if rule not in EXTEND_RULES:
                raise ValueError(f"unknown extension rule {rule!r}; choose from {', '.join(EXTEND_RULES)}")
        if not self.seeds:
            raise ValueError("seeds must hold at least one seed, got ()")
        for b in (*self.budgets, *self.checkpoints):
            if not 0 <= b <= self.finetune_steps:
                raise ValueError(f"budgets and checkpoints must lie in [0, finetune_steps={self.finetune_steps}], "
                                 f"got {b}")
        if self.factor < 1 or self.train_len < 2:
            raise ValueError(f"need factor >= 1 and train_len >= 2, got {self.factor} and {self.train_len}")

    @classmethod
    def preset(cls, *, quick: bool, **overrides: Any) -> ExtendConfig:
        """The quick run (width 64, depth 2, 800 base steps) or the default one."""
        base: dict[str, Any] = {}
        if quick:
            base.update(steps=800, dim=64, depth=2, eval_windows=12)
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def checkpoint_steps(self) -> list[int]:
        return sorted({*self.checkpoints, *self.budgets, self.finetune_steps})


def _model(config: ExtendConfig):
    from posenc.lab.tiny import TinyTransformer

    return TinyTransformer(256, dim=config.dim, depth=config.depth, num_heads=config.num_heads, encoding="rope",
                           causal=True, max_seq_len=config.train_len * max(config.multipliers))


def _corpus(config: ExtendConfig):
    from posenc.lab.corpus import stdlib_corpus

    return stdlib_corpus(max_bytes=config.corpus_bytes)


def _lm_step(model, opt, batch) -> float:
    import torch
    import torch.nn.functional as F

    logits = model(batch[:, :-1])                                                 # (B, S, 256)
    loss = F.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def _base_job(job: tuple[ExtendConfig, int], report: Callable[[int, str], None]) -> dict:
    """Train the RoPE model of one seed at ``train_len``; returns its weights and losses."""
    import torch

    from posenc.lab.experiment import _eval_windows, _evaluate, _windows

    config, seed = job
    corpus = _corpus(config)
    torch.manual_seed(seed)
    model = _model(config)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, config.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(s, config.steps) / config.steps))))
    model.train()
    for step in range(config.steps):
        _lm_step(model, opt, _windows(corpus.train, config.train_len, config.batch_size, gen))
        sched.step()
        if step % 10 == 9:
            report(10, f"base seed {seed} step {step + 1}/{config.steps}")
    model.eval()
    loss = _evaluate(model, _eval_windows(corpus.valid, config.train_len, config.eval_windows))
    report(1, f"base seed {seed} evaluated")
    return {"state": {k: v.clone() for k, v in model.state_dict().items()}, "loss_at_train_len": loss}


def _finetune_job(job: tuple[ExtendConfig, int, str, dict], report: Callable[[int, str], None]) -> dict:
    """Fine-tune one seed's base model with one rule; losses at every checkpoint."""
    import torch

    from posenc.lab.experiment import _eval_windows, _evaluate, _windows

    config, seed, rule, state = job
    corpus = _corpus(config)
    model = _model(config)
    model.load_state_dict(state)
    head_dim = config.dim // config.num_heads
    long_len = config.factor * config.train_len
    model.with_rope_scaling(extension_rule(rule, float(config.factor), config.train_len, head_dim))
    lengths = [m * config.train_len for m in config.multipliers]
    evals = {L: _eval_windows(corpus.valid, L, config.eval_windows) for L in sorted({*lengths, long_len})}
    gen = torch.Generator().manual_seed(seed + 1_000_003)               # same batches for every rule
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=config.finetune_lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    at_long: dict[str, float] = {}
    by_budget: dict[str, dict[str, float]] = {}
    checkpoints = config.checkpoint_steps()

    def measure(step: int) -> None:
        model.eval()
        with torch.no_grad():
            at_long[str(step)] = _evaluate(model, evals[long_len])
            if step in config.budgets:
                by_budget[str(step)] = {str(L): _evaluate(model, evals[L]) for L in lengths}
        model.train()
        report(1, f"{rule} seed {seed} checkpoint {step}")

    if 0 in checkpoints:
        measure(0)
    model.train()
    for step in range(1, config.finetune_steps + 1):
        _lm_step(model, opt, _windows(corpus.train, long_len, config.batch_size, gen))
        sched.step()
        report(1, f"{rule} seed {seed} fine-tune {step}/{config.finetune_steps}")
        if step in checkpoints:
            measure(step)
    return {"loss_at_finetune_len": at_long, "loss": by_budget}


def _stats(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "std": statistics.pstdev(values)}


def run_extend(config: ExtendConfig, *, progress: bool = True, threads_note: str = "") -> dict:
    """Train, fine-tune and evaluate; returns the results dict that ``posenc compare`` writes."""
    from posenc.lab.experiment import Progress
    from posenc.lab.pool import run_jobs

    n_ck = len(config.checkpoint_steps())
    total = len(config.seeds) * (config.steps - config.steps % 10 + 1) + len(config.seeds) * len(config.rules) * (
        config.finetune_steps * 4 + n_ck)                                  # a 4x-long step costs about 4 short ones
    bar = Progress(total, enabled=progress, warmup=max(3, 3 * config.workers))
    scale = {"fine-tune": 4}

    def update(n: int, note: str) -> None:
        bar.update(n * scale.get(note.split(" ")[3] if note.count(" ") >= 3 else "", 1), note)

    t0 = time.monotonic()
    bases = run_jobs(_base_job, [(config, s) for s in config.seeds], workers=config.workers, update=update)
    jobs = [(config, s, rule, base["state"]) for s, base in zip(config.seeds, bases, strict=True) for rule in config.rules]
    tuned = run_jobs(_finetune_job, jobs, workers=config.workers, update=update)
    bar.close()
    target = {str(s): b["loss_at_train_len"] for s, b in zip(config.seeds, bases, strict=True)}
    per_seed: dict[str, dict[str, Any]] = {rule: {} for rule in config.rules}
    for (_, s, rule, _), out in zip(jobs, tuned, strict=True):
        reached = [int(k) for k, v in out["loss_at_finetune_len"].items() if v <= target[str(s)]]
        out["steps_to_target"] = min(reached) if reached else None
        per_seed[rule][str(s)] = out
    lengths = [str(m * config.train_len) for m in config.multipliers]
    summary: dict[str, Any] = {}
    for rule in config.rules:
        runs = list(per_seed[rule].values())
        summary[rule] = {
            "loss": {b: {L: _stats([r["loss"][str(b)][L] for r in runs]) for L in lengths} for b in map(str, config.budgets)},
            "loss_at_finetune_len": {k: _stats([r["loss_at_finetune_len"][k] for r in runs])
                                     for k in runs[0]["loss_at_finetune_len"]},
            "steps_to_target": [r["steps_to_target"] for r in runs],
        }
    return {
        "task": "extend",
        "config": dataclasses.asdict(config),
        "metrics": EXTEND_METRICS,
        "versions": versions(),
        "finetune_len": config.factor * config.train_len,
        "target_loss": target,
        "base_loss_at_train_len": _stats(list(target.values())),
        "summary": summary,
        "per_seed": per_seed,
        "wall_seconds": round(time.monotonic() - t0, 1),
        "threads": {"workers": config.workers, "threads_per_job": 1, "choice": threads_note},
        "notes": [
            "fine-tuning: constant learning rate after a 5-step warm-up; budget b = the first b steps of one run",
            "every rule fine-tunes the same base model on the same batches, at factor x train_len bytes",
            "step 0: the rule applied at inference only",
            f"loss past {config.factor}x: evaluated with the rule at factor {config.factor}, as fine-tuned",
        ],
    }


def loss_past(results: dict, rule: str, budget: int) -> dict[str, float]:
    """Mean loss of ``rule`` after ``budget`` steps at the lengths past the fine-tuning length."""
    fl = results["finetune_len"]
    return {L: s["mean"] for L, s in results["summary"][rule]["loss"][str(budget)].items() if int(L) > fl}

