"""Command line interface: ``posenc ...`` and ``python -m posenc ...``.

Data goes to stdout, messages to stderr.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import pathlib
import sys
from collections.abc import Sequence

from posenc.core.sinusoidal import SINUSOIDAL_LAYOUTS

FORMATS = ("torch", "csv", "json", "markdown")


def _format_table(table, fmt: str, offset: int) -> str:
    if fmt == "torch":
        return repr(table)
    rows = table.double().tolist()
    if fmt == "json":
        return json.dumps({"offset": offset, "rows": rows})
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["position", *[f"d{j}" for j in range(table.shape[1])]])
        for i, row in enumerate(rows):
            writer.writerow([offset + i, *[repr(v) for v in row]])
        return buf.getvalue().rstrip("\n")
    head = "| position | " + " | ".join(f"d{j}" for j in range(table.shape[1])) + " |"
    rule = "|---:|" + "---:|" * table.shape[1]
    body = [f"| {offset + i} | " + " | ".join(f"{v:.4f}" for v in row) + " |" for i, row in enumerate(rows)]
    return "\n".join([head, rule, *body])


def _cmd_table(args: argparse.Namespace) -> int:
    from posenc.functional import sinusoidal_table

    table = sinusoidal_table(args.max_len, args.dim, base=args.base, layout=args.layout, offset=args.offset)
    print(_format_table(table, args.format, args.offset))
    return 0


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one length")
    return values


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def _cmd_list(args: argparse.Namespace) -> int:
    from posenc.lab.registry import list_encodings

    width = max(len(e.name) for e in list_encodings())
    for e in list_encodings():
        print(f"{e.name:<{width}}  {e.family:<8}  {e.description}")
    return 0


def _format_results(results: dict) -> str:
    lens = sorted({int(L) for by in results["loss"].values() for L in by})
    head = "| encoding | " + " | ".join(f"loss @ {L}" for L in lens) + " | " + " | ".join(f"ppl @ {L}" for L in lens) + " |"
    rule = "|---|" + "---:|" * (2 * len(lens))
    rows = []
    for name, by in results["loss"].items():
        losses = [by.get(str(L)) for L in lens]
        rows.append(f"| {name} | " + " | ".join("n/a" if v is None else f"{v:.3f}" for v in losses) + " | "
                    + " | ".join("n/a" if v is None else f"{math.exp(v):.2f}" for v in losses) + " |")
    return "\n".join([head, rule, *rows])


def _cmd_compare(args: argparse.Namespace) -> int:
    from posenc.lab.experiment import CompareConfig, compare, position_task

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for L in (*args.eval_lens, args.train_len):
        if L < 1:
            raise ValueError(f"lengths must be >= 1, got {L} (check --train-len and --eval-lens)")
    if args.task == "position":
        results = position_task(args.encodings, steps=args.steps or (150 if args.quick else 400), seed=args.seed)
        (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        print(f"position task (bidirectional, length {results['length']}, chance {results['chance']:.3f})")
        for name, acc in results["accuracy"].items():
            print(f"{name:<12} accuracy {acc:.3f}")
        print(f"wrote {out / 'results.json'}", file=sys.stderr)
        return 0
    overrides = {"encodings": args.encodings, "train_len": args.train_len, "eval_lens": args.eval_lens,
                 "seed": args.seed}
    if args.steps is not None:
        overrides["steps"] = args.steps
    config = CompareConfig.quick(**overrides) if args.quick else CompareConfig(**overrides)
    results = compare(config, progress=not args.no_progress)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(_format_results(results))
    print(f"wrote {out / 'results.json'} ({results['seconds']} s of training and evaluation)", file=sys.stderr)
    try:
        from posenc.lab.plots import plot_compare

        png = plot_compare(results, out / "compare.png")
        print(f"wrote {png}", file=sys.stderr)
    except ImportError as err:
        print(f"posenc compare: no plot: {err}", file=sys.stderr)
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from posenc.lab.plots import plot_encodings

    try:
        paths = plot_encodings(pathlib.Path(args.out), dim=args.dim, length=args.max_len)
    except ImportError as err:
        print(f"posenc plot: error: {err}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posenc", description="Positional encodings for Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("table", help="print a sinusoidal positional-encoding table")
    t.add_argument("--dim", type=int, required=True, help="features per position (d_model), any >= 1")
    t.add_argument("--max-len", type=int, required=True, help="number of positions (rows)")
    t.add_argument("--base", type=float, default=10000.0, help="frequency base (default 10000)")
    t.add_argument("--layout", choices=SINUSOIDAL_LAYOUTS, default="interleaved", help="column convention")
    t.add_argument("--offset", type=int, default=0, help="position of the first row")
    t.add_argument("--format", choices=FORMATS, default="torch", help="output format (torch prints like the seeds)")
    t.set_defaults(func=_cmd_table)

    ls = sub.add_parser("list", help="list the registered encodings")
    ls.set_defaults(func=_cmd_list)

    from posenc.lab.registry import ENCODINGS

    c = sub.add_parser("compare", help="train a tiny Transformer per encoding and measure it past its training length")
    c.add_argument("--encodings", type=_name_list, default=tuple(ENCODINGS),
                   help=f"comma-separated names (default: all: {','.join(ENCODINGS)})")
    c.add_argument("--train-len", type=int, default=64, help="training window in bytes (default 64)")
    c.add_argument("--eval-lens", type=_int_list, default=(64, 128, 256, 512), help="evaluation lengths (default 64,128,256,512)")
    c.add_argument("--steps", type=int, default=None, help="training steps per encoding (default 1000; 400 with --quick)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", default="posenc-compare", help="folder for results.json and compare.png")
    c.add_argument("--quick", action="store_true", help="a smaller model and budget: under 3 minutes on 2 CPU cores")
    c.add_argument("--task", choices=("lm", "position"), default="lm",
                   help="lm: language modelling past the training length; position: bidirectional order task")
    c.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    c.set_defaults(func=_cmd_compare)

    p = sub.add_parser("plot", help="write PNG figures that explain the encodings")
    p.add_argument("--out", default="posenc-plots")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--max-len", type=int, default=128)
    p.set_defaults(func=_cmd_plot)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "compare":
        from posenc.lab.registry import ENCODINGS

        unknown = [e for e in args.encodings if e not in ENCODINGS]
        if unknown or not args.encodings:
            parser.error(f"argument --encodings: unknown encoding(s) {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(ENCODINGS)}")
    try:
        return args.func(args)
    except (TypeError, ValueError) as err:
        print(f"posenc {args.command}: error: {err}", file=sys.stderr)
        return 2
