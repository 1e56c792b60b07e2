"""The full coverage sweep of ``patch_model`` over every model type of the installed transformers.

    OMP_NUM_THREADS=1 python scripts/hf_sweep.py [--out sweep.json] [--markdown table.md] [--only a,b]

Every model type whose modeling code has a rotary class, ALiBi or a T5-style relative bias is built
tiny from its default configuration (no download), patched, and compared with the unpatched model
(tests/hf_zoo.py: prefill and 8 cached greedy steps within 1e-5, the same tokens, unpatch restores
bit-identical outputs).  Writes a JSON record per type and a markdown table (the one in
docs/integrations.md), and prints the counts.  ``--resume`` keeps the records already in ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests import hf_zoo  # noqa: E402


def markdown(records: list[dict], version: str) -> str:
    counts = collections.Counter(r["status"] for r in records)
    routed = sum(1 for r in records if r["status"] == "equal" and "posenc" in r.get("rotation", []))
    lines = [
        f"Swept with transformers {version}: {len(records)} model types whose modeling code has a position rule; "
        + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("equal", "different", "error", "refused", "no positions",
                                                         "not built", "not run"))
        + f". In {routed} of the equal ones posenc also rotates q and k (patched: q/k rotation). "
        + "`posenc audit` on the equal ones: " + ", ".join(
            f"{sum(1 for r in records if r['status'] == 'equal' and r.get('audit', '').startswith(k))} {word}"
            for k, word in (("agrees", "agree"), ("differs", "differ"), ("not compared", "not compared")))
        + " (not compared: no rotary module it can call as forward(x, position_ids), as in vision encoders "
          "and attention-bias models).",
        "",
        "| model type | result | patched | layout | detail |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(records, key=lambda r: r["model_type"]):
        if r["status"] in ("equal", "different"):
            detail = f"prefill {r['prefill_diff']:.1e}, {r['steps']} steps {r['steps_diff']:.1e}"
        else:
            detail = r.get("reason", "").replace("|", "/")
            detail = detail if len(detail) < 72 else detail[:69] + "..."
        layout = ", ".join(x for x in r.get("layout", []) if x != "None")
        patched = r.get("patched", []) + (["q/k rotation"] if "posenc" in r.get("rotation", []) else [])
        lines.append(f"| `{r['model_type']}` | {r['status']} | {', '.join(patched)} | {layout} | "
                     f"{detail.replace('<', '&lt;')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="hf_sweep.json")
    parser.add_argument("--markdown", default="hf_sweep.md")
    parser.add_argument("--only", default="", help="comma-separated model types (default: all)")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--redo", default="", help="with --resume: comma-separated model types to check again")
    parser.add_argument("--timeout", type=int, default=180)
    parser.add_argument("--docs", default="", help="a markdown page whose sweep section to rewrite "
                        "(between <!-- sweep:begin --> and <!-- sweep:end -->), e.g. docs/integrations.md")
    args = parser.parse_args()
    import torch
    import transformers

    torch.set_num_threads(1)
    types = hf_zoo.model_types()
    wanted = [t for t in types if not args.only or t in args.only.split(",")]
    records: dict[str, dict] = {}
    if args.resume and os.path.exists(args.out):
        records = {r["model_type"]: r for r in json.load(open(args.out))["records"]
                   if r["model_type"] not in args.redo.split(",")}
    for i, model_type in enumerate(wanted):
        if model_type in records:
            continue
        t0 = time.time()
        record = hf_zoo.check(model_type, timeout=args.timeout)
        record["kinds"] = types[model_type]
        record["seconds"] = round(time.time() - t0, 1)
        records[model_type] = record
        print(f"[{i + 1}/{len(wanted)}] {model_type}: {record['status']} {record.get('reason', '')[:150]}", flush=True)
        with open(args.out, "w") as f:
            json.dump({"transformers": transformers.__version__, "records": list(records.values())}, f, indent=1)
    done = [records[t] for t in wanted if t in records]
    with open(args.markdown, "w") as f:
        f.write(markdown(done, transformers.__version__))
    if args.docs:
        write_docs(args.docs, markdown(done, transformers.__version__))
    counts = collections.Counter(r["status"] for r in done)
    print("counts:", dict(counts))


def write_docs(path: str, table: str) -> None:
    begin, end = "<!-- sweep:begin -->", "<!-- sweep:end -->"
    text = open(path, encoding="utf-8").read()
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + begin + "\n" + table + end + tail)


if __name__ == "__main__":
    main()
