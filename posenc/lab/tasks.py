"""Synthetic length-generalisation tasks, generated from a seed (no download, no torch).

Each task makes a token sequence ``prompt + answer`` for a size ``n``; a decoder-only model is
trained on sizes up to the training size and tested at 1x, 2x, 4x and 8x it (Kazemnejad et al.
2023, "The Impact of Positional Encoding on Length Generalization in Transformers", and Anil et al.
2022 before them).  The metric is exact match on the answer tokens: a test example counts only if
every answer token, end marker included, is the model's most likely token.  Scoring every answer
position in one forward pass on the true prefix gives the same number as greedy decoding: greedy
decoding sees the true prefix until its first mistake, and one mistake already fails the example.

The vocabulary (20 ids) is shared by every task:

======  =========================================================
0-9     digits (the items of copy and reverse, digits elsewhere)
10      ``BOS`` start of sequence
11      ``SEP`` end of the prompt (``=`` in addition)
12      ``EOS`` end of the answer (part of the answer)
13      ``PLUS`` between the operands of addition
14      ``KEY`` marks the passkey inside the filler
15      ``ASK`` asks for the passkey at the end
16-19   filler, a repeating "sentence" of four ids
======  =========================================================

Tasks (``n`` is the size that the lengths 1x..8x multiply):

- ``copy``: ``BOS x_1 .. x_n SEP | x_1 .. x_n EOS``.
- ``reverse``: ``BOS x_1 .. x_n SEP | x_n .. x_1 EOS``.
- ``addition``: ``BOS a PLUS b SEP | s EOS`` with ``a`` and ``b`` of ``n`` digits each (most
  significant first, leading zeros allowed) and ``s = a + b`` written on ``n + 1`` digits, least
  significant digit first by default (``reverse_answer=True``): then each answer digit depends
  on two operand digits and the carry of the digit just written, the order in which people add.
  Written most significant first, the first answer digit depends on every carry at once; Lee et
  al. (2023, "Teaching Arithmetic to Small Transformers") found small models learn the reversed
  form far more easily.  ``123 + 989 = 1112`` is the answer ``2 1 1 1``.
- ``passkey``: ``BOS filler.. KEY k_1 .. k_5 filler.. ASK | k_1 .. k_5 EOS``: a five-digit key at a
  random place in ``n`` filler tokens, asked for at the end (Mohtashami and Jaggi 2023, "Landmark
  Attention"; the test long-context papers report).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence

__all__ = ["TASKS", "VOCAB_SIZE", "Example", "TaskSpec", "addition_example", "copy_example", "exact_match",
           "passkey_example", "reverse_example", "sample_example", "token_accuracy"]

BOS, SEP, EOS, PLUS, KEY, ASK = 10, 11, 12, 13, 14, 15
FILLER = (16, 17, 18, 19)
VOCAB_SIZE = 20
PASSKEY_DIGITS = 5


@dataclasses.dataclass(frozen=True)
class Example:
    """One sequence: ``tokens[answer_start:]`` is the answer (its last token is ``EOS``)."""

    tokens: tuple[int, ...]
    answer_start: int

    @property
    def answer(self) -> tuple[int, ...]:
        return self.tokens[self.answer_start :]


def _digits(text: str | Sequence[int]) -> list[int]:
    if isinstance(text, str):
        if not text.isdigit() or not text.isascii():
            raise ValueError(f"expected decimal digits, got {text!r}")
        return [int(c) for c in text]
    out = [int(d) for d in text]
    if any(not 0 <= d <= 9 for d in out):
        raise ValueError(f"expected digits 0..9, got {list(text)!r}")
    return out


def copy_example(items: str | Sequence[int]) -> Example:
    """``BOS items SEP items EOS``.

    Examples:
        >>> copy_example("305").tokens
        (10, 3, 0, 5, 11, 3, 0, 5, 12)
    """
    x = _digits(items)
    return Example((BOS, *x, SEP, *x, EOS), len(x) + 2)


def reverse_example(items: str | Sequence[int]) -> Example:
    """``BOS items SEP reversed(items) EOS``.

    Examples:
        >>> reverse_example("305").answer
        (5, 0, 3, 12)
    """
    x = _digits(items)
    return Example((BOS, *x, SEP, *x[::-1], EOS), len(x) + 2)


def addition_example(a: str | Sequence[int], b: str | Sequence[int], *, reverse_answer: bool = True) -> Example:
    """``BOS a PLUS b SEP sum EOS``; the sum has one digit more than the longer operand.

    Examples:
        >>> addition_example("123", "989").answer        # 1112, least significant digit first
        (2, 1, 1, 1, 12)
        >>> addition_example("123", "989", reverse_answer=False).answer
        (1, 1, 1, 2, 12)
    """
    x, y = _digits(a), _digits(b)
    if not x or not y:
        raise ValueError(f"operands need at least one digit, got {a!r} and {b!r}")
    s, carry = [], 0                                          # schoolbook, least significant digit first
    for i in range(max(len(x), len(y))):
        carry, digit = divmod((x[-1 - i] if i < len(x) else 0) + (y[-1 - i] if i < len(y) else 0) + carry, 10)
        s.append(digit)
    s.append(carry)                                           # one digit more than the longer operand
    if not reverse_answer:
        s = s[::-1]
    prompt = (BOS, *x, PLUS, *y, SEP)
    return Example((*prompt, *s, EOS), len(prompt))


def passkey_example(key: str | Sequence[int], filler: int, where: int) -> Example:
    """``filler`` filler tokens with ``KEY key`` inserted after the first ``where`` of them.

    Examples:
        >>> passkey_example("42", filler=3, where=1).tokens
        (10, 16, 14, 4, 2, 17, 18, 15, 4, 2, 12)
    """
    k = _digits(key)
    if not 0 <= where <= filler:
        raise ValueError(f"where must be in [0, filler={filler}], got {where}")
    fill = [FILLER[i % len(FILLER)] for i in range(filler)]
    prompt = (BOS, *fill[:where], KEY, *k, *fill[where:], ASK)
    return Example((*prompt, *k, EOS), len(prompt))


def _random_digits(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10) for _ in range(n)]


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """A task: how to draw an example of size ``n`` and what ``n`` counts."""

    name: str
    unit: str
    description: str
    draw: Callable[[random.Random, int, bool], Example]
    min_size: int = 1


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec("copy", "items", "repeat a string of digits",
                 lambda rng, n, rev: copy_example(_random_digits(rng, n))),
        TaskSpec("reverse", "items", "write a string of digits backwards",
                 lambda rng, n, rev: reverse_example(_random_digits(rng, n))),
        TaskSpec("addition", "digits per operand", "add two n-digit numbers",
                 lambda rng, n, rev: addition_example(_random_digits(rng, n), _random_digits(rng, n),
                                                      reverse_answer=rev)),
        TaskSpec("passkey", "filler tokens", "retrieve a 5-digit key hidden in filler",
                 lambda rng, n, rev: passkey_example(_random_digits(rng, PASSKEY_DIGITS), n, rng.randint(0, n))),
    )
}


def sample_example(task: str, rng: random.Random, n: int, *, reverse_answer: bool = True) -> Example:
    """One example of ``task`` with size ``n`` drawn from ``rng``."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    return TASKS[task].draw(rng, n, reverse_answer)


def exact_match(predictions: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> float:
    """Fraction of rows whose predicted answer equals the target answer token for token.

    Examples:
        >>> exact_match([[1, 2, 12], [1, 3, 12]], [[1, 2, 12], [1, 2, 12]])
        0.5
    """
    if len(predictions) != len(targets) or not targets:
        raise ValueError(f"need as many predictions as targets (at least one), got {len(predictions)} "
                         f"and {len(targets)}")
    return sum(list(p) == list(t) for p, t in zip(predictions, targets, strict=True)) / len(targets)


def token_accuracy(predictions: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> float:
    """Fraction of answer tokens predicted right, over all rows (rows of equal length).

    Examples:
        >>> token_accuracy([[1, 2, 12], [1, 3, 12]], [[1, 2, 12], [1, 2, 12]])
        0.8333333333333334
    """
    if len(predictions) != len(targets) or not targets:
        raise ValueError(f"need as many predictions as targets (at least one), got {len(predictions)} "
                         f"and {len(targets)}")
    right = total = 0
    for p, t in zip(predictions, targets, strict=True):
        if len(p) != len(t):
            raise ValueError(f"a prediction has {len(p)} tokens but its target {len(t)}")
        right += sum(a == b for a, b in zip(p, t, strict=True))
        total += len(t)
    return right / total
