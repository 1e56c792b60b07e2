"""A Hugging Face model's decode step and prefill with and without posenc's patch, measured in one run (CPU).

    python benchmarks/bench_hf_decode.py [--repeats 15] [--threads 1] [--sizes 256x4,256x16,512x4,1024x2]
                                         [--dtypes float32,bfloat16] [--prefill 256] [--inside]

For each size (hidden x layers) and dtype builds a random Llama (no download), then times one cached
decoding step at position 64 (``model(next_token, past_key_values=...)``, the cache cropped back
after each call so every call sees the same length) and a prefill of ``--prefill`` tokens, three
ways in the same run: unpatched, ``patch_model(model, backend=None)`` (posenc's cos/sin, the
model's rotation) and ``patch_model(model)`` (the default ``backend="auto"``: the rotation of q and
k through posenc's engine too).  Each repeat times the three ways one after the other (about
``--min-time`` seconds each), so that a ratio compares times taken within a second of each other on
a shared machine; prints the medians over ``--repeats`` and the ratios patched / unpatched per
repeat (median, and the middle half: 25th-75th percentile).  ``--inside`` also times, per call
inside the decode step of the first size, the rotary module and the modeling code's
``apply_rotary_pos_emb``.  With CUDA, ``--device cuda --backend triton`` measures the Triton kernel.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import transformers

from posenc.integrations.transformers import patch_model, unpatch_model

from _timing import median_seconds

VARIANTS = ("unpatched", "cos/sin", "rotation")


def build(hidden: int, layers: int, dtype: torch.dtype, args: argparse.Namespace
          ) -> tuple[torch.nn.Module, Callable[[], object], Callable[[], object]]:
    """A random Llama of this size, its decode step at position 64 and its prefill."""
    heads = max(1, hidden // 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.LlamaConfig(vocab_size=1000, hidden_size=hidden, num_attention_heads=heads,
                                          num_key_value_heads=max(1, heads // 4), num_hidden_layers=layers,
                                          intermediate_size=2 * hidden, max_position_embeddings=4096)
        model = transformers.LlamaForCausalLM(config).eval().to(args.device, dtype)
    ids = torch.randint(0, 1000, (1, 64), device=args.device)
    long_ids = torch.randint(0, 1000, (1, args.prefill), device=args.device)
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    token = torch.tensor([[7]], device=args.device)

    def step():
        out = model(input_ids=token, past_key_values=cache, use_cache=True)
        cache.crop(-1)                                                     # every call decodes position 64
        return out

    def prefill():
        return model(input_ids=long_ids, use_cache=False)

    return model, step, prefill


def measure(hidden: int, layers: int, dtype: torch.dtype, args: argparse.Namespace
            ) -> dict[str, dict[str, list[float]]]:
    model, step, prefill = build(hidden, layers, dtype, args)
    times: dict[str, dict[str, list[float]]] = {m: {v: [] for v in VARIANTS} for m in ("decode", "prefill")}
    for _ in range(args.repeats):
        for variant in VARIANTS:
            if variant != "unpatched":
                patch_model(model, backend=None if variant == "cos/sin" else args.backend)
            step(), prefill()                                                  # warm up
            times["decode"][variant].append(median_seconds(step, min_run_time=args.min_time))
            times["prefill"][variant].append(median_seconds(prefill, min_run_time=args.min_time))
            unpatch_model(model)
    return times


def inside(hidden: int, layers: int, dtype: torch.dtype, args: argparse.Namespace, calls: int = 300
           ) -> dict[str, dict[str, float]]:
    """Median wall time per call, inside the decode step, of the rotary module and of the modeling
    code's ``apply_rotary_pos_emb``, unpatched and with ``patch_model``'s default: each wrapped in a
    timer for ``calls`` steps, in ``--repeats`` alternating rounds."""
    model, step, _ = build(hidden, layers, dtype, args)
    rotary = model.model.rotary_emb
    code = sys.modules[type(rotary).__module__]
    spent: dict[str, dict[str, list[float]]] = {v: {"rotary module": [], "apply_rotary_pos_emb": []}
                                                for v in ("unpatched", "patched")}

    def timed(fn: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
        def call(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            into.append(time.perf_counter() - t0)
            return out
        return call

    with torch.inference_mode():
        for _ in range(max(1, args.repeats // 3)):
            for variant in spent:
                if variant == "patched":
                    patch_model(model, backend=args.backend)
                had, forward, function = "forward" in vars(rotary), rotary.forward, code.apply_rotary_pos_emb
                rotary.forward = timed(forward, spent[variant]["rotary module"])
                code.apply_rotary_pos_emb = timed(function, spent[variant]["apply_rotary_pos_emb"])
                try:
                    for _ in range(calls):
                        step()
                finally:
                    code.apply_rotary_pos_emb = function
                    if had:
                        rotary.forward = forward
                    else:
                        del rotary.forward
                unpatch_model(model)
    return {v: {part: statistics.median(times) for part, times in by.items()} for v, by in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="256x4,256x16,512x4,1024x2", help="hidden x layers, comma-separated")
    ap.add_argument("--prefill", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--min-time", type=float, default=0.1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated torch dtypes")
    ap.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"))
    ap.add_argument("--inside", action="store_true", help="also time the rotary module and the rotate function "
                    "per call inside the decode step of the first size")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"Llama (head_dim 64); decode: one step at position 64; prefill: {args.prefill} tokens; torch "
          f"{torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} thread(s), "
          f"{args.device}, rotation backend {args.backend!r}; {args.repeats} repeats")
    print()
    print("| hidden x layers | dtype | pass | unpatched ms | cos/sin ms | rotation ms | cos/sin / unpatched | "
          "rotation / unpatched |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        for size in args.sizes.split(","):
            hidden, layers = (int(v) for v in size.split("x"))
            times = measure(hidden, layers, dtype, args)
            for mode, by in times.items():
                cells = []
                for variant in VARIANTS[1:]:
                    ratios = [p / u for p, u in zip(by[variant], by["unpatched"], strict=True)]
                    low, _, high = statistics.quantiles(ratios, n=4)
                    cells.append(f"{statistics.median(ratios):.3f}x ({low:.3f}-{high:.3f})")
                print(f"| {hidden} x {layers} | {name} | {mode} | "
                      + " | ".join(f"{statistics.median(by[v]) * 1e3:.3f}" for v in VARIANTS) + " | "
                      + " | ".join(cells) + " |", flush=True)
    if args.inside:
        hidden, layers = (int(v) for v in args.sizes.split(",")[0].split("x"))
        print()
        print(f"Inside the decode step ({hidden} x {layers}), median per call:")
        print()
        print("| dtype | part | unpatched µs | patched µs |")
        print("|---|---|---:|---:|")
        for name in args.dtypes.split(","):
            got = inside(hidden, layers, getattr(torch, name), args)
            for part in got["unpatched"]:
                print(f"| {name} | {part} | {got['unpatched'][part] * 1e6:.1f} | {got['patched'][part] * 1e6:.1f} |",
                      flush=True)


if __name__ == "__main__":
    main()
