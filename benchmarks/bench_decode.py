"""One decode step of RoPE on CPU: posenc's per-call cost against the peers, measured in one run.

    python benchmarks/bench_decode.py [--repeats 5] [--threads 1] [--q-heads 32 --kv-heads 8 --head-dim 128]

A decode step rotates one new token: q (1, H_q, 1, D) and k (1, H_kv, 1, D) at position 1000 of a
4096-row table.  At this size every torch call costs far more than its arithmetic, so what is
measured is the work per call: validation, table lookup and the number of torch calls.  Each row
is the median over ``--repeats`` of ``blocked_autorange`` medians; the ratio columns are the median
(min-max) over the repeats of the row's time divided by transformers' (or Llama's) time in the same
repeat.  The closing lines hold posenc's offset rows (both layouts, float32 and bfloat16) to at most
0.6x transformers and 1.2x Llama.

  transformers   ``apply_rotary_pos_emb(q, k, cos, sin)`` after looking its cos/sin rows up in
                 precomputed (P, D) tables by ``position_ids``, as its models do per layer
  Llama          Meta's reference: ``freqs_cis[start:start + 1]`` and a complex multiplication
  plain          a half-split rotation from float32 (P, D/2) tables, written out here
  posenc         ``RotaryEmbedding(q, k, offset=)`` and ``apply_rope_qk(q, k, cos, sin, offset=)``
                 in both layouts (half as transformers, interleaved as Llama), ``(positions=)``
                 and ``(positions=, assume_valid=True)``
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics

import torch

from posenc import RotaryEmbedding, apply_rope_qk

from _timing import median_seconds

P, POS = 4096, 1000


def peers(D: int, dtype: torch.dtype, q: torch.Tensor, k: torch.Tensor) -> list[tuple[str, object]]:
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    angles = torch.outer(torch.arange(P).float(), inv)                           # (P, D/2)
    out = []
    if importlib.util.find_spec("transformers"):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        emb = torch.cat([angles, angles], -1)
        cos_cached, sin_cached = emb.cos().to(dtype), emb.sin().to(dtype)         # (P, D)
        position_ids = torch.tensor([[POS]])

        def hf():
            cos = cos_cached[position_ids]                                      # (1, 1, D)
            sin = sin_cached[position_ids]
            return apply_rotary_pos_emb(q, k, cos, sin)
        out.append(("transformers apply_rotary_pos_emb + table lookup", hf))
    freqs_cis = torch.polar(torch.ones_like(angles), angles)                     # (P, D/2) complex64

    def llama():
        f = freqs_cis[POS : POS + 1]
        qc = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        kc = torch.view_as_complex(k.float().reshape(*k.shape[:-1], -1, 2))
        return (torch.view_as_real(qc * f).flatten(-2).type_as(q), torch.view_as_real(kc * f).flatten(-2).type_as(k))
    out.append(("Llama reference (complex multiply)", llama))
    cos_t, sin_t = angles.cos(), angles.sin()
    h = D // 2

    def plain():
        c, s = cos_t[POS : POS + 1], sin_t[POS : POS + 1]
        rot = []
        for x in (q, k):
            x1, x2 = x[..., :h].float(), x[..., h:].float()
            rot.append(torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x.dtype))
        return rot
    out.append(("plain half-split from a float32 table", plain))
    return out


#: The targets a decode step of posenc is held to (medians over the repeats of per-repeat ratios).
TARGET_HF, TARGET_LLAMA = 0.6, 1.2


def bench(dtype: torch.dtype, hq: int, hk: int, D: int, repeats: int) -> list[tuple[str, float, float]]:
    """Print one table section; return ``(label, ratio to transformers, ratio to Llama)`` of the gated rows."""
    name = str(dtype).replace("torch.", "")
    q, k = torch.randn(1, hq, 1, D).to(dtype), torch.randn(1, hk, 1, D).to(dtype)
    positions = torch.tensor([POS])
    rows = peers(D, dtype, q, k)
    gated = []
    for layout in ("half", "interleaved"):
        rope = RotaryEmbedding(D, max_seq_len=P, layout=layout)
        cos, sin = rope.cos_table, rope.sin_table
        gated += [
            (f"posenc RotaryEmbedding(q, k, offset=), {layout}", lambda r=rope: r(q, k, offset=POS)),
            (f"posenc apply_rope_qk(q, k, cos, sin, offset=), {layout}",
             lambda c=cos, s=sin, lay=layout: apply_rope_qk(q, k, c, s, offset=POS, layout=lay)),
        ]
    rope = RotaryEmbedding(D, max_seq_len=P)
    rows += gated + [
        ("posenc RotaryEmbedding(q, k, positions=)", lambda: rope(q, k, positions=positions)),
        ("posenc RotaryEmbedding(q, k, positions=, assume_valid=True)",
         lambda: rope(q, k, positions=positions, assume_valid=True)),
    ]
    times: dict[str, list[float]] = {label: [] for label, _ in rows}
    for _ in range(repeats):
        for label, fn in rows:
            times[label].append(median_seconds(fn, min_run_time=0.2))
    labels = [label for label, _ in rows]
    hf = times[labels[0]] if labels[0].startswith("transformers") else None
    llama = times["Llama reference (complex multiply)"]
    out = []
    for label in labels:
        r_hf = _ratio(times[label], hf) if hf else None
        r_llama = _ratio(times[label], llama)
        print(f"| {label} | {name} | {statistics.median(times[label]) * 1e6:.1f} | "
              f"{'-' if r_hf is None else _cell(r_hf)} | {_cell(r_llama)} |")
        if label in dict(gated):
            out.append((f"{label} ({name})", statistics.median(r_hf) if r_hf else float("nan"),
                        statistics.median(r_llama)))
    return out


def _ratio(times: list[float], base: list[float]) -> list[float]:
    return [t / b for t, b in zip(times, base, strict=True)]


def _cell(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"decode step: q (1, {args.q_heads}, 1, {args.head_dim}), k (1, {args.kv_heads}, 1, {args.head_dim}), "
          f"position {POS} of {P}; torch {torch.__version__}, {torch.get_num_threads()} thread(s); ratio to the "
          f"first row, median (min-max) over {args.repeats} repeats")
    print()
    print("| implementation | dtype | µs per step | × transformers | × Llama |")
    print("|---|---|---:|---:|---:|")
    gated = []
    for dtype in (torch.float32, torch.bfloat16):
        gated += bench(dtype, args.q_heads, args.kv_heads, args.head_dim, args.repeats)
    print()
    print(f"targets: at most {TARGET_HF}x transformers and {TARGET_LLAMA}x Llama (medians of the per-repeat ratios)")
    for label, r_hf, r_llama in gated:
        ok = r_hf <= TARGET_HF and r_llama <= TARGET_LLAMA
        print(f"  {'met ' if ok else 'MISS'}  {label}: {r_hf:.2f}x transformers, {r_llama:.2f}x Llama")


if __name__ == "__main__":
    main()
