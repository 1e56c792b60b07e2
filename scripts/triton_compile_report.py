"""Compile every Triton kernel's specializations for real GPU targets (no GPU needed) and print a
Markdown table: kernel, specialization, target, registers, spills, widest global load and store.

    python scripts/triton_compile_report.py                 # the compact cover, sm_80 and sm_90 and newer
    python scripts/triton_compile_report.py --arch 90       # one target
    python scripts/triton_compile_report.py --summary       # one line per kernel and target only
    python scripts/triton_compile_report.py --rows 90       # every target, but the rows of sm_90 only

The specializations are those ``tests/test_triton_compile.py`` compiles (see
``tests/triton_specs.py``): each launcher's own argument builder run on meta tensors and
bound as a launch on contiguous CUDA tensors binds it.  ``docs/gpu.md`` holds this script's output.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)           # compile, never interpret (read when triton is imported)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton  # noqa: E402

from tests import triton_specs  # noqa: E402


def _widths(counts: dict) -> str:
    return " ".join(f"{bits}×{n}" for bits, n in sorted(counts.items(), reverse=True))


def _commit() -> str:
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    try:
        out = subprocess.run(["git", "-C", root, "log", "-1", "--format=%h %cs"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "posenc/kernels"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return out + (" (kernels modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="*", help="compute capabilities (default: 80, 90 and newer known)")
    parser.add_argument("--kernel", nargs="*", choices=triton_specs.KERNELS, help="kernels (default: all)")
    parser.add_argument("--summary", action="store_true", help="only the per-kernel summary")
    parser.add_argument("--rows", type=int, nargs="*", help="targets whose per-specialization rows to print "
                        "(default: every target compiled)")
    args = parser.parse_args(argv)
    archs = args.arch or triton_specs.targets()
    kernels = args.kernel or triton_specs.KERNELS
    t0 = time.time()
    rows, summary, failures = [], [], 0
    for kernel in kernels:
        specs = triton_specs.covering(kernel)
        for arch in archs:
            regs, spills, widest = [], 0, []
            for spec in specs:
                try:
                    out = triton_specs.compile_spec(spec, arch)
                except Exception as exc:               # report it and go on: the table shows every failure
                    failures += 1
                    rows.append(f"| {kernel} | {spec.case.label} — {spec.flags} | sm_{arch} | compile error: "
                                f"{str(exc).splitlines()[0][:80]} | | | |")
                    continue
                regs.append(out.registers)
                spills += out.spills
                widest.append((out.max_load, out.max_store, triton_specs.tile_bytes(spec) >= 512))
                if args.rows is None or arch in args.rows:
                    rows.append(f"| {kernel} | {spec.case.label} — {spec.flags} | sm_{arch} | {out.registers} | "
                                f"{out.spills} | {_widths(out.loads)} | {_widths(out.stores)} |")
            wide = [w for w in widest if w[2]]
            summary.append(
                f"| {kernel} | sm_{arch} | {len(specs)} | {min(regs, default=0)}–{max(regs, default=0)} | {spills} | "
                f"{sum(1 for w in wide if w[0] == 128 and w[1] == 128)} of {len(wide)} |")
    print(f"Compiled with Triton {triton.__version__} (its own ptxas), no GPU, on "
          f"{datetime.date.today().isoformat()}, kernels at commit {_commit()}, "
          f"in {time.time() - t0:.0f} s.\n")
    print("| kernel | target | specializations | registers | spill bytes | 128-bit loads and stores "
          "(tiles of 512 bytes or more) |")
    print("|---|---|---:|---:|---:|---:|")
    print("\n".join(summary))
    if not args.summary:
        print("\n| kernel | specialization | target | registers | spill bytes | global loads (bits×count) "
              "| global stores (bits×count) |")
        print("|---|---|---|---:|---:|---|---|")
        print("\n".join(rows))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
