"""A Hugging Face model's decode step and prefill with and without posenc's patch, measured in one run.

    python benchmarks/bench_hf_decode.py [--repeats 15] [--threads 1] [--sizes 256x4,256x16,512x4,1024x2]
                                         [--dtypes float32,bfloat16] [--prefill 256] [--batch 1]
                                         [--engines none,auto] [--device cpu] [--inside]

For each size (hidden x layers) and dtype builds a random Llama (no download), then times one cached
decoding step at position 64 (``model(next_token, past_key_values=...)``, the cache cropped back
after each call so every call sees the same length) and a prefill of ``--prefill`` tokens, for
``--batch`` sequences, several ways in the same run: unpatched, and ``patch_model(model,
engine=...)`` for each of ``--engines`` (``none``: posenc's cos/sin, the model's rotation;
``auto``, ``torch``, ``triton``: the rotation of q and k through that engine too).  Each repeat
times the ways one after the other (about ``--min-time`` seconds each), so that a ratio compares
times taken within a second of each other on a shared machine; prints the medians over
``--repeats`` and the ratios patched / unpatched per repeat (median, and the middle half: 25th-75th
percentile).

Then a parity table: the logits of the prefill and of ``--steps`` greedy decoding steps of each way
against a first unpatched run (max abs difference, and whether the generated tokens are the same),
with a second unpatched run as the baseline: on CUDA, bfloat16 kernels are not bit-deterministic
between two identical runs, so a patched model is judged against that spread, not against zero.

``--device cuda`` (defaults there: ``--engines none,torch,triton``, CUDA timings synchronised by
``torch.utils.benchmark``) is what ``scripts/gpu_check.sh`` runs.  ``--inside`` also times, per call
inside the decode step of the first size, the rotary module and the modeling code's
``apply_rotary_pos_emb``.
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


def variants(engines: list[str]) -> list[str]:
    """The ways a run measures: ``unpatched``, then ``none`` (posenc's cos/sin only) and each engine."""
    return ["unpatched", *engines]


def patch(model: torch.nn.Module, variant: str) -> None:
    if variant != "unpatched":
        patch_model(model, engine=None if variant == "none" else variant)


def build(hidden: int, layers: int, dtype: torch.dtype, args: argparse.Namespace
          ) -> tuple[torch.nn.Module, Callable[[], object], Callable[[], object]]:
    """A random Llama of this size, its decode step at position 64 and its prefill."""
    heads, batch = max(1, hidden // 64), args.batch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.LlamaConfig(vocab_size=1000, hidden_size=hidden, num_attention_heads=heads,
                                          num_key_value_heads=max(1, heads // 4), num_hidden_layers=layers,
                                          intermediate_size=2 * hidden, max_position_embeddings=4096)
        model = transformers.LlamaForCausalLM(config).eval().to(args.device, dtype)
    ids = torch.randint(0, 1000, (batch, 64), device=args.device)
    long_ids = torch.randint(0, 1000, (batch, args.prefill), device=args.device)
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    token = torch.full((batch, 1), 7, device=args.device)

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
    ways = variants(args.engines)
    times: dict[str, dict[str, list[float]]] = {m: {v: [] for v in ways} for m in ("decode", "prefill")}
    for _ in range(args.repeats):
        for variant in ways:
            patch(model, variant)
            step(), prefill()                                                  # warm up
            times["decode"][variant].append(median_seconds(step, min_run_time=args.min_time))
            times["prefill"][variant].append(median_seconds(prefill, min_run_time=args.min_time))
            unpatch_model(model)
    return times


def parity(hidden: int, layers: int, dtype: torch.dtype, args: argparse.Namespace) -> list[tuple[str, float, float,
                                                                                                  bool]]:
    """``(way, prefill max |diff|, steps max |diff|, same tokens)`` of each way against a first unpatched
    run: the prefill's logits and ``--steps`` greedy steps (a second unpatched run first: the baseline)."""
    model, _, _ = build(hidden, layers, dtype, args)
    ids = torch.randint(0, 1000, (args.batch, args.prefill), device=args.device,
                        generator=torch.Generator(device=args.device).manual_seed(1))

    def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float()
            out = model.generate(ids, max_new_tokens=args.steps, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=0)
        return logits, torch.stack(out.logits).float(), out.sequences

    first = run()
    rows = []
    for variant in ["unpatched (again)", *args.engines]:
        patch(model, "unpatched" if variant.startswith("unpatched") else variant)
        got = run()
        unpatch_model(model)
        rows.append((variant, (got[0] - first[0]).abs().max().item(), (got[1] - first[1]).abs().max().item(),
                     torch.equal(got[2], first[2])))
    return rows


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
                    patch_model(model, engine=args.engines[-1])
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
    ap.add_argument("--batch", type=int, default=1, help="sequences per call")
    ap.add_argument("--steps", type=int, default=8, help="greedy steps of the parity check")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--min-time", type=float, default=0.1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated torch dtypes")
    ap.add_argument("--engines", default=None, help="comma-separated ways to patch: none (posenc's cos/sin "
                    "only), auto, torch, triton (default: none,auto on CPU, none,torch,triton on CUDA)")
    ap.add_argument("--engine", default=None, choices=("auto", "torch", "triton"),
                    help="one engine (the same as --engines none,ENGINE)")
    ap.add_argument("--inside", action="store_true", help="also time the rotary module and the rotate function "
                    "per call inside the decode step of the first size (patched with the last engine)")
    args = ap.parse_args()
    if args.engines is None:
        args.engines = f"none,{args.engine}" if args.engine else (
            "none,torch,triton" if args.device.startswith("cuda") else "none,auto")
    args.engines = [b.strip() for b in args.engines.split(",")]
    for b in args.engines:
        if b not in ("none", "auto", "torch", "triton"):
            ap.error(f"--engines: {b!r} is not one of none, auto, torch, triton")
    torch.set_num_threads(args.threads)
    ways = variants(args.engines)
    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else \
        f"{torch.get_num_threads()} CPU thread(s)"
    print(f"Llama (head_dim 64); decode: one step at position 64; prefill: {args.prefill} tokens; batch "
          f"{args.batch}; torch {torch.__version__}, transformers {transformers.__version__}, {where}; "
          f"{args.repeats} repeats")
    print()
    print("| hidden x layers | dtype | pass | " + " | ".join(f"{w} ms" for w in ways) + " | "
          + " | ".join(f"{w} / unpatched" for w in ways[1:]) + " |")
    print("|---|---|---|" + "---:|" * (2 * len(ways) - 1))
    sizes = [tuple(int(v) for v in size.split("x")) for size in args.sizes.split(",")]
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        for hidden, layers in sizes:
            times = measure(hidden, layers, dtype, args)
            for mode, by in times.items():
                cells = []
                for variant in ways[1:]:
                    ratios = [p / u for p, u in zip(by[variant], by["unpatched"], strict=True)]
                    low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
                    cells.append(f"{statistics.median(ratios):.3f}x ({low:.3f}-{high:.3f})")
                print(f"| {hidden} x {layers} | {name} | {mode} | "
                      + " | ".join(f"{statistics.median(by[v]) * 1e3:.3f}" for v in ways) + " | "
                      + " | ".join(cells) + " |", flush=True)
    hidden, layers = sizes[0]
    print()
    print(f"Parity ({hidden} x {layers}, batch {args.batch}, {args.prefill} tokens then {args.steps} greedy steps), "
          f"against a first unpatched run; the second unpatched run is the baseline:")
    print()
    print("| dtype | way | prefill max abs diff | steps max abs diff | same tokens |")
    print("|---|---|---:|---:|---|")
    for name in args.dtypes.split(","):
        for way, pre, steps, same in parity(hidden, layers, getattr(torch, name), args):
            print(f"| {name} | {way} | {pre:.2e} | {steps:.2e} | {'yes' if same else 'no'} |", flush=True)
    if args.inside:
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
