"""A Hugging Face model's decode step and prefill with and without posenc's patch, measured in one run (CPU).

    python benchmarks/bench_hf_decode.py [--repeats 15] [--threads 1] [--sizes 256x4,256x16,512x4,1024x2]
                                         [--dtypes float32,bfloat16] [--prefill 256]

For each size (hidden x layers) and dtype builds a random Llama (no download), then times one cached
decoding step at position 64 (``model(next_token, past_key_values=...)``, the cache cropped back
after each call so every call sees the same length) and a prefill of ``--prefill`` tokens, three
ways in the same run: unpatched, ``patch_model(model, backend=None)`` (posenc's cos/sin, the
model's rotation) and ``patch_model(model)`` (the default ``backend="auto"``: the rotation of q and
k through posenc's engine too).  Each repeat times the three ways one after the other (about
``--min-time`` seconds each), so that a ratio compares times taken within a second of each other on
a shared machine; prints the medians over ``--repeats`` and the ratios patched / unpatched per
repeat (median, and the middle half: 25th-75th percentile).  With CUDA, ``--device cuda --backend triton`` measures
the Triton kernel instead.
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import torch
import transformers

from posenc.integrations.transformers import patch_model, unpatch_model

from _timing import median_seconds

VARIANTS = ("unpatched", "cos/sin", "rotation")


def measure(hidden: int, layers: int, dtype: torch.dtype, args: argparse.Namespace
            ) -> dict[str, dict[str, list[float]]]:
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


if __name__ == "__main__":
    main()
