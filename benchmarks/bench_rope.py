"""RoPE on CPU: posenc against the memory-bound limit and the peers.

    python benchmarks/bench_rope.py [--repeats 3] [--batch 4 --heads 16 --seq 2048 --head-dim 128]

Rotates q and k of shape (B, H, S, D) in float32 and bfloat16 and reports, per implementation, the
median of ``--repeats`` blocked_autorange medians as a ratio to the limit measured in the same
repeat (copying q and k into preallocated buffers of the same dtype), the min-max spread, and the
largest error of the rotated q against a float64 rotation (same layout).  Timed:
  posenc      RotaryEmbedding(q, k, inplace=True) and out of place, both layouts
  reference   Llama's complex multiply (view_as_complex x freqs_cis), written out here
  peers       transformers apply_rotary_pos_emb (eager and torch.compile), torchtune
              RotaryPositionalEmbeddings, rotary-embedding-torch, x-transformers, when installed
              (``pip install .[bench]``); each with its tables precomputed and only the rotation timed,
              except where the peer recomputes them per call by design (x-transformers' cos()).
"""

from __future__ import annotations

import argparse
import importlib.util

import torch

from posenc import RotaryEmbedding

from _timing import median_seconds, ms, ratio_cell


def exact_rotation(q: torch.Tensor, layout: str) -> torch.Tensor:
    """float64 rotation of q by positions 0..S-1 with theta_i = 10000^(-2i/D)."""
    q = q.double()
    S, D = q.shape[-2], q.shape[-1]
    inv = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv
    c, s = torch.cos(ang), torch.sin(ang)
    if layout == "half":
        x1, x2 = q[..., : D // 2], q[..., D // 2 :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    x1, x2 = q[..., 0::2], q[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], -1).flatten(-2)


def peers(S: int, D: int, dtype: torch.dtype):
    """(label, layout, fn(q, k) -> (q', k')) for the installed peers (tables built outside the timing)."""
    out = []
    inv32 = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    freqs_cis = torch.polar(torch.ones(S, D // 2), torch.outer(torch.arange(S).float(), inv32))

    def llama(q, k):                                    # Meta's reference, float32 complex math
        qc = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        kc = torch.view_as_complex(k.float().reshape(*k.shape[:-1], -1, 2))
        return (torch.view_as_real(qc * freqs_cis).flatten(-2).type_as(q),
                torch.view_as_real(kc * freqs_cis).flatten(-2).type_as(k))
    out.append(("Llama reference (complex multiply)", "interleaved", llama))
    if importlib.util.find_spec("transformers"):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        emb = torch.cat([torch.outer(torch.arange(S).float(), inv32)] * 2, -1)
        cos, sin = emb.cos()[None].to(dtype), emb.sin()[None].to(dtype)      # as LlamaRotaryEmbedding returns
        out.append(("transformers apply_rotary_pos_emb", "half", lambda q, k: apply_rotary_pos_emb(q, k, cos, sin)))
        compiled = torch.compile(apply_rotary_pos_emb)
        out.append(("transformers apply_rotary_pos_emb, torch.compile", "half", lambda q, k: compiled(q, k, cos, sin)))
    if importlib.util.find_spec("torchtune"):
        try:
            from torchtune.modules import RotaryPositionalEmbeddings
            tt = RotaryPositionalEmbeddings(D, max_seq_len=S)
            out.append(("torchtune RotaryPositionalEmbeddings", "interleaved",
                        lambda q, k: (tt(q.transpose(1, 2)).transpose(1, 2), tt(k.transpose(1, 2)).transpose(1, 2))))
        except Exception as exc:  # torchtune's package __init__ pulls in many optional packages
            print(f"(torchtune not usable here: {type(exc).__name__}: {exc})")
    if importlib.util.find_spec("rotary_embedding_torch"):
        from rotary_embedding_torch import RotaryEmbedding as LucidRope
        lr = LucidRope(D).to(dtype)
        out.append(("rotary-embedding-torch", "interleaved",
                    lambda q, k: (lr.rotate_queries_or_keys(q), lr.rotate_queries_or_keys(k))))
    if importlib.util.find_spec("x_transformers"):
        from x_transformers.x_transformers import RotaryEmbedding as XRope
        from x_transformers.x_transformers import apply_rotary_pos_emb as x_apply
        xr = XRope(D)
        freqs, _ = xr(torch.arange(S))
        out.append(("x-transformers", "interleaved", lambda q, k: (x_apply(q, freqs), x_apply(k, freqs))))
    return out


def bench_dtype(dtype: torch.dtype, B: int, H: int, S: int, D: int, repeats: int) -> None:
    name = str(dtype).replace("torch.", "")
    q, k = torch.randn(B, H, S, D).to(dtype), torch.randn(B, H, S, D).to(dtype)
    qb, kb = torch.empty_like(q), torch.empty_like(k)
    truth = {lay: exact_rotation(q, lay) for lay in ("half", "interleaved")}
    rows = [("limit: copy q and k into preallocated buffers", None, lambda: (qb.copy_(q), kb.copy_(k)))]
    errors: dict[str, float] = {}
    for layout in ("half", "interleaved"):
        rope = RotaryEmbedding(D, max_seq_len=S, layout=layout)
        errors[f"posenc RotaryEmbedding {layout}, inplace=True"] = float((rope(q)[0].double() - truth[layout]).abs().max())
        errors[f"posenc RotaryEmbedding {layout}"] = errors[f"posenc RotaryEmbedding {layout}, inplace=True"]
        qi, ki = q.clone(), k.clone()
        rows.append((f"posenc RotaryEmbedding {layout}, inplace=True", layout,
                     lambda rope=rope, qi=qi, ki=ki: rope(qi, ki, inplace=True)))
        rows.append((f"posenc RotaryEmbedding {layout}", layout, lambda rope=rope: rope(q, k)))
    for label, layout, fn in peers(S, D, dtype):
        try:
            with torch.inference_mode():
                got = fn(q, k)[0]
            errors[label] = float((got.double() - truth[layout]).abs().max())
            rows.append((label, layout, lambda fn=fn: fn(q, k)))
        except Exception as exc:
            print(f"| {label} | {name} | failed: {type(exc).__name__}: {exc} | | |")
    times: dict[str, list[float]] = {lbl: [] for lbl, *_ in rows}
    for _ in range(repeats):
        for label, _, fn in rows:
            times[label].append(median_seconds(fn, min_run_time=0.3))
    limit = times[rows[0][0]]
    for label, layout, _ in rows:
        err = "" if layout is None else f"{errors[label]:.1e}"
        ratio = "1.00x" if layout is None else ratio_cell(times[label], limit)
        print(f"| {label} | {name} | {ms(times[label])} | {ratio} | {err} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"q and k of shape ({args.batch}, {args.heads}, {args.seq}, {args.head_dim}); torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; ratio: median over {args.repeats} repeats of time / limit (min-max)")
    print()
    print("| implementation | dtype | ms | ratio to limit | max error of rotated q vs float64 |")
    print("|---|---|---:|---:|---:|")
    for dtype in (torch.float32, torch.bfloat16):
        bench_dtype(dtype, args.batch, args.heads, args.seq, args.head_dim, args.repeats)


if __name__ == "__main__":
    main()
