"""Reading the results of ``posenc compare`` (no torch needed): the summary table and the series
that came out identical.

The results dict is the one :func:`posenc.lab.experiment.compare` returns and ``posenc compare``
writes to ``results.json``: ``results["loss"][name][str(length)]`` is a validation loss in nats
per byte, lower is better.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["LM_METRICS", "POSITION_METRICS", "format_results", "identical_groups", "identical_notes"]

#: What the numbers of a language-modelling run mean, written to results.json as ``"metrics"``.
LM_METRICS = {
    "loss": {"unit": "nats per byte", "better": "lower",
             "definition": "mean per-token cross-entropy over non-overlapping validation windows"},
    "perplexity": {"unit": "per byte", "better": "lower", "definition": "exp(loss)"},
}
#: The same for ``--task position``.
POSITION_METRICS = {
    "accuracy": {"unit": "fraction of test rows", "better": "higher",
                 "definition": "the predicted position of the marked token is the true one"},
}


def identical_groups(series: Mapping[str, Mapping[str, float]]) -> list[list[str]]:
    """Names whose series are equal at every point (same keys, equal values), in input order.

    Only groups of two or more names are returned.

    Examples:
        >>> identical_groups({"a": {"8": 1.0, "16": 2.0}, "b": {"8": 1.0, "16": 2.5},
        ...                   "c": {"8": 1.0, "16": 2.0}})
        [['a', 'c']]
    """
    groups: list[list[str]] = []
    keys: list[tuple] = []
    for name, by in series.items():
        key = tuple(sorted((str(k), float(v)) for k, v in by.items()))
        for i, seen in enumerate(keys):
            if seen == key:
                groups[i].append(name)
                break
        else:
            keys.append(key)
            groups.append([name])
    return [g for g in groups if len(g) > 1]


def identical_notes(series: Mapping[str, Mapping[str, float]], *, where: str = "at every length") -> list[str]:
    """One sentence per group of identical series, e.g. ``"rope+ntk = rope+dynamic at every length"``."""
    return [f"{' = '.join(group)} {where}" for group in identical_groups(series)]


def format_results(results: Mapping) -> str:
    """The summary table of a language-modelling run, as Markdown, with its caption and notes.

    Examples:
        >>> print(format_results({"loss": {"rope": {"8": 1.0}, "alibi": {"8": 1.0}}}))
        Validation loss (nats per byte) and perplexity by evaluation length; lower is better.
        <BLANKLINE>
        | encoding | loss @ 8 | ppl @ 8 |
        |---|---:|---:|
        | rope | 1.000 | 2.72 |
        | alibi | 1.000 | 2.72 |
        <BLANKLINE>
        Identical results: rope = alibi at every length.
    """
    loss = results["loss"]
    lens = sorted({int(L) for by in loss.values() for L in by})
    head = ("| encoding | " + " | ".join(f"loss @ {L}" for L in lens) + " | "
            + " | ".join(f"ppl @ {L}" for L in lens) + " |")
    rule = "|---|" + "---:|" * (2 * len(lens))
    rows = []
    for name, by in loss.items():
        values = [by.get(str(L)) for L in lens]
        rows.append(f"| {name} | " + " | ".join("n/a" if v is None else f"{v:.3f}" for v in values) + " | "
                    + " | ".join("n/a" if v is None else f"{math.exp(v):.2f}" for v in values) + " |")
    lines = ["Validation loss (nats per byte) and perplexity by evaluation length; lower is better.", "",
             head, rule, *rows]
    notes = identical_notes(loss)
    if notes:
        lines += ["", "Identical results: " + "; ".join(notes) + "."]
    return "\n".join(lines)
