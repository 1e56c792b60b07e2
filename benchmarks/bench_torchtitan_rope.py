"""posenc's RoPE in torchtitan against torchtitan's own modules, on the machine at hand.

    python benchmarks/bench_torchtitan_rope.py [--repeats 3] [--batch 2 --seq 2048 --heads 16 --kv-heads 4]
                                               [--device cpu|cuda]

For three configurations torchtitan registers (Llama 3 8B: ComplexRoPE with Llama 3 scaling, head dim 128;
Qwen 3 8B: CosSinRoPE, head dim 128; DeepSeek-V3: ComplexRoPE with YaRN on the 64 rotary features), rotates
q (B, S, H, D) and k (B, S, H_kv, D), torchtitan's layout, at positions 0..S-1 passed as a (B, S) tensor (as
its trainer passes them), and times the forward, and the forward plus backward, of torchtitan's module and of
``PosencRoPE`` (``engine="auto"``: the Triton kernel on CUDA).  Each cell is the median over ``--repeats`` of
posenc's time divided by torchtitan's, measured in the same repeat (below 1: posenc is faster), with the
min-max spread; the last column is the largest difference between the two outputs in float32.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch

from _timing import repeated

try:
    from torchtitan.models.common.rope import ComplexRoPE, CosSinRoPE

    from posenc.integrations.torchtitan import PosencRoPE
except ImportError as err:                                   # pragma: no cover - optional dependency
    raise SystemExit(f"this benchmark needs torchtitan (pip install torchtitan): {err}") from err

CASES = {
    "llama3-8B": (ComplexRoPE.Config(dim=128, max_seq_len=131072, theta=500000.0, scaling="llama"), "interleaved"),
    "qwen3-8B": (CosSinRoPE.Config(dim=128, max_seq_len=40960, theta=1000000.0), "half"),
    "deepseek-v3": (ComplexRoPE.Config(dim=64, max_seq_len=163840, theta=10000.0, scaling="yarn",
                                       rope_factor=40.0, original_seq_len=4096), "interleaved"),
}


def _cell(ours: list[float], theirs: list[float]) -> str:
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}; q ({args.batch}, "
          f"{args.seq}, {args.heads}, D), k ({args.batch}, {args.seq}, {args.kv_heads}, D); ratio posenc / "
          f"torchtitan, median of {args.repeats} (min-max)\n")
    print("| configuration | dtype | forward | forward + backward | max abs difference (float32) |")
    print("| --- | --- | --- | --- | --- |")
    for name, (cfg, layout) in CASES.items():
        with torch.device(device):
            theirs = cfg.build()
            fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
            ours = PosencRoPE.Config(**fields, layout=layout).build()
        positions = torch.arange(args.seq, device=device)[None].expand(args.batch, -1)
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator(device=device).manual_seed(0)
            q = torch.randn(args.batch, args.seq, args.heads, cfg.dim, device=device, dtype=dtype, generator=g)
            k = torch.randn(args.batch, args.seq, args.kv_heads, cfg.dim, device=device, dtype=dtype, generator=g)

            def fwd(module, q=q, k=k, positions=positions):
                def run():
                    out = module(q, k, positions)
                    sync()
                    return out
                return run

            def fwd_bwd(module, q=q, k=k, positions=positions):
                qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()

                def run():
                    a, b = module(qg, kg, positions)
                    (a.float().sum() + b.float().sum()).backward()
                    sync()
                return run

            forward = [(repeated(fwd(ours), 1)[0], repeated(fwd(theirs), 1)[0]) for _ in range(args.repeats)]
            with torch.enable_grad():
                both = [(_timed(fwd_bwd(ours)), _timed(fwd_bwd(theirs))) for _ in range(args.repeats)]
            diff = ""
            if dtype == torch.float32:
                pairs = zip(ours(q, k, positions), theirs(q, k, positions), strict=True)
                diff = f"{max(float((a - b).abs().max()) for a, b in pairs):.2e}"
            ours_f, theirs_f = zip(*forward, strict=True)
            ours_b, theirs_b = zip(*both, strict=True)
            print(f"| {name} | {str(dtype).replace('torch.', '')} | {_cell(list(ours_f), list(theirs_f))} | "
                  f"{_cell(list(ours_b), list(theirs_b))} | {diff} |")

def _timed(fn) -> float:
    """Median seconds of ``fn()`` with autograd on (``median_seconds`` runs under inference mode)."""
    import time

    fn()
    times = []
    for _ in range(7):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


if __name__ == "__main__":
    main()
