"""Attention biases and posenc.attention on CPU: time and peak memory per case.

    python benchmarks/bench_bias.py [--lengths 1024,2048,4096] [--heads 8] [--head-dim 64] [--batch 1]

Each case runs in its own subprocess.  After a warm-up call (which also compiles the flex path),
the process resets its peak-RSS counter (``/proc/self/clear_refs``), runs the case, and reports the
median time of a few calls and the peak memory above the resident size before the call.  Cases:
building the ALiBi and T5 biases (``(H, S, S)``), and one causal attention call with no encoding
(plain SDPA: the baseline), RoPE, ALiBi and T5, through SDPA and through flex_attention.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def run_case(case: str, S: int, H: int, D: int, B: int) -> dict:
    import torch

    import posenc

    torch.set_num_threads(2)
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    pos = torch.arange(S)
    enc = {"alibi": posenc.AlibiBias(H), "t5": posenc.RelativePositionBias(H), "rope": posenc.RotaryEmbedding(D),
           "none": None}
    if case.startswith("build-"):
        module = enc[case.split("-")[1]]
        def fn():
            return module(pos)
    else:
        name, backend = case.split("/")
        def fn():
            return posenc.attention(q, k, v, encoding=enc[name], causal=True, backend=backend)
    with torch.no_grad():
        fn()                                                     # warm-up (and flex compilation)
        times = []
        peak_extra = 0
        for _ in range(3):
            before = _rss_kib("VmRSS")
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")                                 # reset the peak (VmHWM) to the current RSS
            except OSError:
                pass
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
            peak_extra = max(peak_extra, _rss_kib("VmHWM") - before)
            del out
    times.sort()
    return {"case": case, "S": S, "ms": times[1] * 1e3, "peak_mib": peak_extra / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1024,2048,4096")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.length, args.heads, args.head_dim, args.batch)))
        return
    cases = ["build-alibi", "build-t5", "none/sdpa", "rope/sdpa", "alibi/sdpa", "t5/sdpa",
             "none/flex", "rope/flex", "alibi/flex", "t5/flex"]
    print(f"causal attention, B={args.batch}, H={args.heads}, D={args.head_dim}, float32, 2 threads; "
          f"median of 3 calls after a warm-up; peak = resident memory above the level before the call")
    print()
    print("| case | " + " | ".join(f"S={s} ms | S={s} peak MiB" for s in args.lengths.split(",")) + " |")
    print("|---|" + "---:|---:|" * len(args.lengths.split(",")))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for case in cases:
        cells = []
        for S in (int(s) for s in args.lengths.split(",")):
            cmd = [sys.executable, __file__, "--case", case, "--length", str(S), "--heads", str(args.heads),
                   "--head-dim", str(args.head_dim), "--batch", str(args.batch)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode or not lines:
                cells += ["failed", (proc.stderr.strip().splitlines() or ["?"])[-1][:60]]
                continue
            r = json.loads(lines[-1])
            cells += [f"{r['ms']:.1f}", f"{r['peak_mib']:.0f}"]
        print(f"| {case} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
