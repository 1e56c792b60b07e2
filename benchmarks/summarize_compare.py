"""Mean and spread of ``posenc compare`` results over seeds.

    python benchmarks/summarize_compare.py runs/seed0/results.json runs/seed1/results.json ...

Prints a markdown table: for each encoding and evaluation length, the mean loss (nats per byte)
over the runs and its min-max range.
"""

from __future__ import annotations

import json
import statistics
import sys


def main(paths: list[str]) -> int:
    runs = [json.loads(open(p).read()) for p in paths]
    if not runs:
        print("usage: summarize_compare.py results.json [results.json ...]", file=sys.stderr)
        return 2
    configs = {json.dumps({k: v for k, v in r["config"].items() if k != "seed"}, sort_keys=True) for r in runs}
    if len(configs) != 1:
        print("the runs differ in more than the seed; refusing to average them", file=sys.stderr)
        return 2
    lens = sorted({int(L) for r in runs for by in r["loss"].values() for L in by})
    seeds = [r["config"]["seed"] for r in runs]
    print(f"{len(runs)} seeds ({', '.join(map(str, seeds))}); mean loss per byte (min-max)")
    print()
    print("| encoding | " + " | ".join(f"{L}" for L in lens) + " |")
    print("|---|" + "---:|" * len(lens))
    for name in runs[0]["loss"]:
        cells = []
        for L in lens:
            vals = [r["loss"][name][str(L)] for r in runs]
            cells.append(f"{statistics.mean(vals):.3f} ({min(vals):.3f}-{max(vals):.3f})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
