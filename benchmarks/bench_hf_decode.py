"""A Hugging Face model's decode step with and without posenc's patch, measured in one run (CPU).

    python benchmarks/bench_hf_decode.py [--repeats 5] [--threads 1] [--layers 4 --hidden 512 --heads 8]

Builds a random Llama (no download), prefills 64 tokens, then times one cached decoding step
(``model(next_token, past_key_values=...)``, the cache cropped back after each call so every call
sees the same length) unpatched and patched with ``posenc.integrations.transformers.patch_model``.
Prints medians over ``--repeats`` and the ratio patched / unpatched per repeat (median, min-max).
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import torch
import transformers

from posenc.integrations.transformers import patch_model, unpatch_model

from _timing import median_seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.LlamaConfig(vocab_size=1000, hidden_size=args.hidden, num_attention_heads=args.heads,
                                          num_key_value_heads=max(1, args.heads // 4), num_hidden_layers=args.layers,
                                          intermediate_size=2 * args.hidden, max_position_embeddings=4096)
        model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 1000, (1, 64))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    token = torch.tensor([[7]])

    def step():
        out = model(input_ids=token, past_key_values=cache, use_cache=True)
        cache.crop(-1)                                                     # every call decodes position 64
        return out

    times = {"unpatched": [], "patched": []}
    for _ in range(args.repeats):
        times["unpatched"].append(median_seconds(step, min_run_time=0.3))
        patch_model(model)
        times["patched"].append(median_seconds(step, min_run_time=0.3))
        unpatch_model(model)
    ratios = [p / u for p, u in zip(times["patched"], times["unpatched"], strict=True)]
    print(f"Llama, {args.layers} layers, hidden {args.hidden}, {args.heads} heads; one decode step at position 64; "
          f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} thread(s)")
    print()
    print("| model | ms per step |")
    print("|---|---:|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts) * 1e3:.3f} |")
    print(f"\npatched / unpatched: {statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
