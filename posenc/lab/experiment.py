"""``posenc compare``: train a tiny Transformer per encoding, then measure it past its training length.

Language modelling on bytes of Python's standard library (:mod:`posenc.lab.corpus`): each model
trains on windows of ``train_len`` bytes, then is evaluated, without retraining, on validation
windows of every ``eval_len``; the per-token loss is averaged over all positions of
non-overlapping windows (as in Press et al. 2022).  The RoPE-trained model is also evaluated with
each context-extension rule applied at inference with ``factor = eval_len / train_len``, which is
how those rules are used.  The learned table is sized to the longest evaluation length: its rows
past ``train_len`` are never trained (they keep their random initialisation), and the results say so.

``task="position"`` is a bidirectional, order-sensitive toy task instead: find the position of the
one marked token among random tokens.  Attention without positional information is
permutation-equivariant, so ``none`` cannot beat chance there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

import torch
import torch.nn.functional as F

from posenc import _validate
from posenc.core.rope import RopeScaling
from posenc.lab.corpus import stdlib_corpus
from posenc.lab.lengthgen import ROPE_RULE_NAMES
from posenc.lab.registry import DEFAULT_ENCODINGS, ENCODINGS
from posenc.lab.results import LM_METRICS, POSITION_METRICS, identical_notes, versions
from posenc.lab.rules import LAB_RULES
from posenc.lab.tiny import TinyTransformer

__all__ = ["CompareConfig", "ROPE_RULES", "compare", "position_task"]

#: name -> rule for a given stretch factor, training length and head dim: the inference-time rules of
#: ``rope+<rule>``, built by :mod:`posenc.lab.rules`
ROPE_RULES: dict[str, Callable[[float, int, int], RopeScaling]] = {name: LAB_RULES[name] for name in ROPE_RULE_NAMES}


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """Everything that defines a run (written to results.json).

    ``device`` is ``"cpu"`` or ``"cuda"``.  ``threads`` is the number of CPU threads torch uses
    while the run lasts (restored after it; None keeps torch's setting, one per core).  The
    thread count decides how sums are split, so a seed repeats results bit for bit only at the
    same count.  On a busy machine, ``threads=1`` is several times faster: these models are small,
    and threads that wait for each other while other programs hold the cores waste most of their
    time.
    """

    encodings: tuple[str, ...] = DEFAULT_ENCODINGS
    train_len: int = 64
    eval_lens: tuple[int, ...] = (64, 128, 256, 512)
    steps: int = 1000
    batch_size: int = 32
    dim: int = 96
    depth: int = 3
    num_heads: int = 4
    lr: float = 2e-3
    eval_windows: int = 48
    seed: int = 0
    corpus_bytes: int | None = None
    rope_rules: tuple[str, ...] = tuple(ROPE_RULES)
    device: str = "cpu"
    threads: int | None = None

    @classmethod
    def quick(cls, **overrides) -> CompareConfig:
        """A smaller model and budget (width 64, depth 2, 400 steps): about a minute on 2 CPU cores."""
        base: dict[str, Any] = dict(steps=400, dim=64, depth=2, num_heads=4, batch_size=24, eval_windows=16,
                                    corpus_bytes=3_000_000)
        base.update(overrides)
        return cls(**base)


def format_seconds(seconds: float) -> str:
    """A duration for the progress line: ``42s``, ``3m05s``, ``1h02m``.

    Examples:
        >>> format_seconds(42.4), format_seconds(185), format_seconds(3725)
        ('42s', '3m05s', '1h02m')
    """
    s = max(0, round(seconds))
    if s < 100:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """A dependency-free progress bar on stderr (messages stay off stdout).

    The time left is extrapolated from the pace after a warm-up: the first ``warmup`` updates
    (the first steps of a model pay for allocations and thread start-up) are left out, and the
    line reads ``estimating...`` until ``min_timed`` units after them have been timed.  From then
    on, time left = units left x (time since the warm-up) / (units since the warm-up).

    Args:
        total: units of work (training steps plus evaluations).
        enabled: print at all.
        clock: seconds as a float, ``time.monotonic`` by default (tests pass a fake one).
        stream: where lines go, ``sys.stderr`` by default.
        warmup: updates left out of the pace.
        min_timed: units to time after the warm-up before showing a time left.
    """

    def __init__(self, total: int, enabled: bool = True, *, clock: Callable[[], float] = time.monotonic,
                 stream: TextIO | None = None, warmup: int = 3, min_timed: int = 5) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self.clock = clock
        self.stream = sys.stderr if stream is None else stream
        self.start = clock()
        self.tty = self.stream.isatty()
        self.warmup, self.min_timed = warmup, min_timed
        self._updates = 0
        # (time, units done) when the warm-up ended
        self._warm: tuple[float, int] | None = (self.start, 0) if warmup <= 0 else None
        self._last = -1

    def eta(self, now: float) -> float | None:
        """Seconds left at time ``now``, or None while the pace is still being measured."""
        if self._warm is None:
            return None
        t0, done0 = self._warm
        timed = self.done - done0
        if timed < self.min_timed:
            return None
        return (self.total - self.done) * (now - t0) / timed

    def line(self, now: float, note: str = "") -> str:
        """The progress line at time ``now``."""
        frac = self.done / max(self.total, 1)
        eta = self.eta(now)
        left = "estimating..." if eta is None else f"~{format_seconds(eta)} left"
        return (f"[{'#' * int(frac * 30):<30}] {int(frac * 100):3d}% {format_seconds(now - self.start):>6} elapsed, "
                f"{left:<13}  {note}")

    def update(self, n: int = 1, note: str = "") -> None:
        now = self.clock()
        self.done += n
        self._updates += 1
        if self._updates == self.warmup:
            self._warm = (now, self.done)
        if not self.enabled:
            return
        pct = int(self.done / max(self.total, 1) * 100)
        if not self.tty and pct == self._last:
            return
        self._last = pct
        line = self.line(now, note)
        self.stream.write(("\r" + line[:110].ljust(110)) if self.tty else (line + "\n") if pct % 10 == 0 else "")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")


def _windows(data: torch.Tensor, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, data.numel() - length - 1, (count,), generator=generator)
    return torch.stack([data[s : s + length + 1] for s in starts.tolist()]).long()      # (count, length + 1)


def _eval_windows(data: torch.Tensor, length: int, count: int) -> torch.Tensor:
    """``count`` non-overlapping validation windows spread evenly over the data."""
    usable = data.numel() - length - 1
    count = max(1, min(count, usable // (length + 1)))
    starts = torch.linspace(0, usable, count).long()
    return torch.stack([data[s : s + length + 1] for s in starts.tolist()]).long()


def _train(model: torch.nn.Module, batch_fn: Callable[[int], tuple], steps: int, lr: float,
           loss_fn: Callable, progress: Progress, label: str) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        inputs = batch_fn(step)
        loss = loss_fn(model, *inputs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        progress.update(1, f"{label} step {step + 1}/{steps} loss {loss.item():.3f}")
    model.eval()
    return float(loss.detach())


def _lm_loss(model, batch):
    logits = model(batch[:, :-1])                                                 # (B, S, 256)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def _device(device: str) -> torch.device:
    """``"cpu"`` or ``"cuda"`` (or ``"cuda:N"``) as a torch device, checked."""
    if not isinstance(device, str) or device.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda' (or 'cuda:N'), got {device!r}")
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device must be 'cpu' or 'cuda' (or 'cuda:N'), got {device!r}: {err}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but no CUDA device is visible to PyTorch "
                         "(torch.cuda.is_available() is False); use device='cpu'")
    return dev


@torch.no_grad()
def _evaluate(model, windows: torch.Tensor, batch_size: int = 8) -> float:
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], batch_size):
        batch = windows[i : i + batch_size]
        logits = model(batch[:, :-1])
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum").item()
        count += batch[:, 1:].numel()
    return total / count


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` intra-op CPU threads, then restore the previous number."""
    if threads is None:
        yield
        return
    threads = _validate.check_int("threads", threads, minimum=1)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def compare(config: CompareConfig, *, progress: bool = True) -> dict:
    """Run the experiment; returns the results dict that ``posenc compare`` writes to results.json."""
    with _torch_threads(config.threads):
        return _compare(config, progress)


def _compare(config: CompareConfig, progress: bool) -> dict:
    for name in config.encodings:
        if name not in ENCODINGS:
            raise ValueError(f"unknown encoding {name!r}; choose from {', '.join(ENCODINGS)}")
    for name in config.rope_rules:
        if name not in ROPE_RULES:
            raise ValueError(f"unknown rope rule {name!r}; choose from {', '.join(ROPE_RULES)}")
    if min(config.eval_lens) < 1 or config.train_len < 1:
        raise ValueError(f"lengths must be >= 1, got train_len={config.train_len}, eval_lens={config.eval_lens}")
    device = _device(config.device)
    corpus = stdlib_corpus(max_bytes=config.corpus_bytes)
    max_len = max(max(config.eval_lens), config.train_len)
    evals = {L: _eval_windows(corpus.valid, L, config.eval_windows).to(device) for L in config.eval_lens}
    n_rules = len(config.rope_rules) if "rope" in config.encodings else 0
    bar = Progress(len(config.encodings) * config.steps + (len(config.encodings) + n_rules) * len(config.eval_lens),
                   enabled=progress)
    results: dict[str, dict[str, float]] = {}
    train_loss: dict[str, float] = {}
    t0 = time.monotonic()
    for name in config.encodings:
        torch.manual_seed(config.seed)
        gen = torch.Generator().manual_seed(config.seed)
        model = TinyTransformer(256, dim=config.dim, depth=config.depth, num_heads=config.num_heads, encoding=name,
                                causal=True, max_seq_len=max_len).to(device)

        def batch(step: int, gen: torch.Generator = gen) -> tuple[torch.Tensor]:
            # drawn on the CPU whatever the device: a seed selects the same data everywhere
            return (_windows(corpus.train, config.train_len, config.batch_size, gen).to(device),)

        train_loss[name] = _train(model, batch, config.steps, config.lr, _lm_loss, bar, name)
        results[name] = {}
        for L, windows in evals.items():
            results[name][str(L)] = _evaluate(model, windows)
            bar.update(1, f"{name} eval {L}")
        if name == "rope":
            for rule in config.rope_rules:
                key = f"rope+{rule}"
                results[key] = {}
                for L, windows in evals.items():
                    if L <= config.train_len:
                        results[key][str(L)] = results["rope"][str(L)]
                    else:
                        old = model.with_rope_scaling(ROPE_RULES[rule](L / config.train_len, config.train_len,
                                                                        model.dim // model.num_heads))
                        results[key][str(L)] = _evaluate(model, windows)
                        model.pos_module = old
                    bar.update(1, f"{key} eval {L}")
    bar.close()
    return {
        "task": "lm",
        "config": dataclasses.asdict(config),
        "device": str(device),
        "metrics": LM_METRICS,
        "versions": versions(),
        "loss": results,
        "final_train_loss": train_loss,
        "seconds": round(time.monotonic() - t0, 1),
        "corpus": {"train_bytes": int(corpus.train.numel()), "valid_bytes": int(corpus.valid.numel()),
                   "valid_files": len(corpus.valid_files)},
        "notes": [
            "loss: mean per-token cross-entropy (nats) over non-overlapping validation windows of each length",
            "learned: table sized to the longest evaluation length; rows past train_len keep their random init",
            "rope+<rule>: the rope model evaluated with the rule at factor eval_len/train_len, no retraining",
            *(f"identical: {note}" for note in identical_notes(results)),
        ],
    }


def position_task(encodings: Sequence[str], *, length: int = 16, steps: int = 300, seed: int = 0,
                  dim: int = 64, depth: int = 2, num_heads: int = 4, batch_size: int = 64,
                  progress: bool = True, device: str = "cpu", threads: int | None = None) -> dict:
    """Bidirectional toy task: predict the position of the single marked token.

    Tokens are random ids 0..7 with one marker (id 8) at a random position; the model outputs a
    distribution over the ``length`` positions at the marker.  Returns accuracy per encoding on a
    fixed held-out set (chance is ``1 / length``; higher is better).  Data are drawn on the CPU and
    moved to ``device``, so a seed gives the same data on every device.  ``threads``: CPU threads
    torch uses meanwhile, as in :class:`CompareConfig`.
    """
    with _torch_threads(threads):
        return _position_task(encodings, length=length, steps=steps, seed=seed, dim=dim, depth=depth,
                              num_heads=num_heads, batch_size=batch_size, progress=progress, device=device,
                              threads=threads)


def _position_task(encodings: Sequence[str], *, length: int, steps: int, seed: int, dim: int, depth: int,
                   num_heads: int, batch_size: int, progress: bool, device: str, threads: int | None) -> dict:
    vocab, marker = 9, 8
    dev = _device(device)

    def sample(n: int, generator: torch.Generator):
        tokens = torch.randint(0, 8, (n, length), generator=generator)
        where = torch.randint(0, length, (n,), generator=generator)
        tokens[torch.arange(n), where] = marker
        return tokens, where

    test_tokens, test_where = (t.to(dev) for t in sample(512, torch.Generator().manual_seed(seed + 10_000)))
    bar = Progress(len(encodings) * steps, enabled=progress)
    accuracy = {}
    for name in encodings:
        if name not in ENCODINGS:
            raise ValueError(f"unknown encoding {name!r}; choose from {', '.join(ENCODINGS)}")
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        model = TinyTransformer(vocab, dim=dim, depth=depth, num_heads=num_heads, encoding=name, causal=False,
                                max_seq_len=length, num_classes=length).to(dev)

        def loss_fn(model, tokens, where):
            logits = model(tokens)[torch.arange(tokens.shape[0], device=tokens.device), where]  # (B, length)
            return F.cross_entropy(logits, where)

        def batch(step: int, gen: torch.Generator = gen) -> tuple[torch.Tensor, ...]:
            return tuple(t.to(dev) for t in sample(batch_size, gen))

        _train(model, batch, steps, 3e-3, loss_fn, bar, name)
        with torch.no_grad():
            pred = model(test_tokens)[torch.arange(test_tokens.shape[0], device=dev), test_where].argmax(-1)
        accuracy[name] = float((pred == test_where).float().mean())
    bar.close()
    return {"task": "position", "length": length, "chance": 1 / length, "steps": steps, "seed": seed,
            "device": str(dev), "threads": threads, "metrics": POSITION_METRICS, "versions": versions(),
            "accuracy": accuracy}
