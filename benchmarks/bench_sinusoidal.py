"""Additive sinusoidal encoding on CPU: posenc against the memory-bound limit and the peers.

    python benchmarks/bench_sinusoidal.py [--repeats 3] [--batch 8 --seq 2048 --dim 512]

For x of shape (B, S, D) in float32 and bfloat16 it times, in one process:
  limits   ``x + t`` (fresh output buffer) and ``torch.add(x, t, out=y)`` (preallocated y), t (S, D)
  posenc   ``SinusoidalEncoding(x)`` out of place and ``(x, inplace=True)``
  peers    x-transformers ScaledSinusoidalEmbedding, positional-encodings Summer(PositionalEncoding1D),
           transformers' Marian sinusoidal table, when installed (``pip install .[bench]``)
Each cell is the median of three blocked_autorange medians as a ratio to the limit of the same
kind and dtype measured in the same repeat, with the min-max spread; plus the largest error of
the added encoding against posenc's exact float64 table.  Ratios, not absolute times, are meant
to be compared: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import importlib.util

import torch

from posenc import SinusoidalEncoding, sinusoidal_table

from _timing import median_seconds, ms, ratio_cell


def peers(dim: int, seq: int):
    """(name, make(dtype) -> callable(x) returning x + PE), for the peers that are installed."""
    found = []
    if importlib.util.find_spec("x_transformers"):
        from x_transformers.x_transformers import ScaledSinusoidalEmbedding

        def make_xt(dtype):
            m = ScaledSinusoidalEmbedding(dim).to(dtype)
            with torch.no_grad():
                m.scale.fill_(1.0)   # a learned scale, dim**-0.5 at init: set to 1 to compare the table
            return lambda x: x + m(x)
        found.append(("x-transformers ScaledSinusoidalEmbedding (concat layout)", make_xt))
    if importlib.util.find_spec("positional_encodings"):
        from positional_encodings.torch_encodings import PositionalEncoding1D, Summer

        def make_pe(dtype):
            m = Summer(PositionalEncoding1D(dim)).to(dtype)
            return m
        found.append(("positional-encodings Summer(PositionalEncoding1D)", make_pe))
    if importlib.util.find_spec("transformers"):
        from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

        def make_marian(dtype):
            m = MarianSinusoidalPositionalEmbedding(seq, dim)
            with torch.no_grad():
                m.weight.copy_(m.create_weight())   # the model's _init_weights does this in transformers 5
            m = m.to(dtype)
            return lambda x: x + m(x.shape[:2])
        found.append(("transformers Marian sinusoidal (concat layout)", make_marian))
    return found


def bench_dtype(dtype: torch.dtype, B: int, S: int, D: int, repeats: int) -> None:
    """Print the table rows of one dtype."""
    name = str(dtype).replace("torch.", "")
    exact = sinusoidal_table(S, D, dtype=torch.float64)
    exact_concat = sinusoidal_table(S, D, dtype=torch.float64, layout="concat")
    x = torch.randn(B, S, D).to(dtype)
    t = exact.to(dtype)
    y = torch.empty_like(x)
    xi = x.clone()
    zero = torch.zeros(1, S, D, dtype=dtype)
    enc = SinusoidalEncoding(D, max_seq_len=S)
    err = float((enc(zero)[0].double() - exact).abs().max())
    # (label, callable, which limit, error of the encoding it adds)
    rows = [
        ("limit `x + t`", lambda: x + t, "out", None),
        ("limit `torch.add(x, t, out=y)`", lambda: torch.add(x, t, out=y), "into", None),
        ("posenc SinusoidalEncoding", lambda: enc(x), "out", err),
        ("posenc SinusoidalEncoding, inplace=True", lambda: enc(xi, inplace=True), "into", err),
    ]
    for pname, make in peers(D, S):
        try:
            fn = make(dtype)
            ref = exact_concat if "concat" in pname else exact
            rows.append((pname, (lambda fn=fn: fn(x)), "out", float((fn(zero).detach().double()[0] - ref).abs().max())))
        except Exception as exc:  # a peer's API drift must not stop the benchmark
            print(f"| {pname} | {name} | failed: {type(exc).__name__}: {exc} | | | |")
    # Every repeat times every row back to back, so each ratio compares timings taken together.
    times: dict[str, list[float]] = {label: [] for label, *_ in rows}
    for _ in range(repeats):
        for label, fn, _, _ in rows:
            times[label].append(median_seconds(fn))
    limits = {"out": times[rows[0][0]], "into": times[rows[1][0]]}
    limit_names = {"out": "`x + t`", "into": "`out=`"}
    for label, _, kind, e in rows:
        if e is None:
            print(f"| {label} | {name} | {ms(times[label])} | 1.00x | | |")
        else:
            print(f"| {label} | {name} | {ms(times[label])} | {ratio_cell(times[label], limits[kind])} | "
                  f"{limit_names[kind]} | {e:.1e} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"x of shape ({args.batch}, {args.seq}, {args.dim}); torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads; cells: median ratio to the limit (min-max over {args.repeats} repeats)")
    print()
    print("| implementation | dtype | ms | ratio | limit | max error of PE vs exact |")
    print("|---|---|---:|---:|---|---:|")
    for dtype in (torch.float32, torch.bfloat16):
        bench_dtype(dtype, args.batch, args.seq, args.dim, args.repeats)


if __name__ == "__main__":
    main()
