"""Command line interface: ``posenc ...`` and ``python -m posenc ...``.

Data goes to stdout, messages to stderr.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Sequence

from posenc.core.sinusoidal import LAYOUTS

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posenc", description="Positional encodings for Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("table", help="print a sinusoidal positional-encoding table")
    t.add_argument("--dim", type=int, required=True, help="features per position (d_model), any >= 1")
    t.add_argument("--max-len", type=int, required=True, help="number of positions (rows)")
    t.add_argument("--base", type=float, default=10000.0, help="frequency base (default 10000)")
    t.add_argument("--layout", choices=LAYOUTS, default="interleaved", help="column convention")
    t.add_argument("--offset", type=int, default=0, help="position of the first row")
    t.add_argument("--format", choices=FORMATS, default="torch", help="output format (torch prints like the seeds)")
    t.set_defaults(func=_cmd_table)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (TypeError, ValueError) as err:
        print(f"posenc {args.command}: error: {err}", file=sys.stderr)
        return 2
