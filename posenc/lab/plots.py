"""PNG figures that explain the encodings (``posenc plot``) and the experiment (``posenc compare``).

matplotlib is an optional extra (``pip install "posenc[plot]"``).
"""

from __future__ import annotations

import pathlib

import torch

__all__ = ["plot_compare", "plot_encodings", "require_matplotlib"]


def require_matplotlib():
    """Import matplotlib with the Agg backend, or raise ``ImportError`` saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(
            'plots need matplotlib: pip install "posenc[plot]" (or pip install matplotlib)'
        ) from err
    return plt


def plot_compare(results: dict, path: pathlib.Path) -> pathlib.Path:
    """Loss against evaluation length, one line per encoding, the training length marked."""
    plt = require_matplotlib()
    cfg = results["config"]
    fig, ax = plt.subplots(figsize=(9.0, 4.8), dpi=120)
    base_colors = {"none": "#222222", "sinusoidal": "#1f77b4", "learned": "#17becf", "rope": "#d62728",
                   "alibi": "#2ca02c", "t5": "#9467bd"}
    rule_colors = ["#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#aec7e8"]
    rules = [n for n in results["loss"] if n not in base_colors]
    for name, by_len in results["loss"].items():
        lens = sorted(int(L) for L in by_len)
        style = "--" if name.startswith("rope+") else "-"
        color = base_colors.get(name) or rule_colors[rules.index(name) % len(rule_colors)]
        ax.plot(lens, [by_len[str(L)] for L in lens], style, marker="o", ms=3.5, lw=1.8 if style == "-" else 1.2,
                label=name, color=color)
    ax.axvline(cfg["train_len"], color="grey", ls=":", lw=1)
    ax.text(cfg["train_len"], ax.get_ylim()[0], " training length", va="bottom", fontsize=8, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(int(L) for L in next(iter(results["loss"].values()))))
    ax.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("evaluation length (bytes)")
    ax.set_ylabel("validation loss per byte (nats)")
    ax.set_title(f"Trained on {cfg['train_len']} bytes, evaluated longer (seed {cfg['seed']}, {cfg['steps']} steps)",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="encoding", title_fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_encodings(out: pathlib.Path, *, dim: int = 64, length: int = 128, heads: int = 8) -> list[pathlib.Path]:
    """Three figures: the sinusoidal table, similarity against distance, logit change against distance."""
    import posenc

    plt = require_matplotlib()
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    table = posenc.sinusoidal_table(length, dim)
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=120)
    im = ax.imshow(table.T.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower")
    ax.set_xlabel("position p")
    ax.set_ylabel("feature j (sin on even, cos on odd)")
    ax.set_title(f"Sinusoidal table PE(p, j), d_model = {dim}: fast pairs at the bottom, slow ones at the top", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    paths.append(out / "sinusoidal_table.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    # <PE(p), PE(p + k)> depends only on k; RoPE's <R(m) q, R(m + k) q> likewise.
    dist = torch.arange(0, 4 * length)
    pe = posenc.sinusoidal_table(4 * length + 1, dim, dtype=torch.float64)
    sim_pe = (pe[0] * pe[dist]).sum(-1) / (dim / 2)
    rope = posenc.RotaryEmbedding(dim, max_seq_len=4 * length + 1)
    q = torch.ones(1, 1, 1, dim, dtype=torch.float64)
    rotated, _ = rope(q.expand(1, 1, dist.numel(), dim).contiguous(), positions=dist)
    sim_rope = (rotated[0, 0, 0] * rotated[0, 0]).sum(-1) / dim
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=120)
    ax.plot(dist, sim_pe, label="sinusoidal: <PE(p), PE(p+k)> / (d/2)")
    ax.plot(dist, sim_rope, label="RoPE: <R(p) q, R(p+k) q> / |q|^2, q = 1")
    ax.set_xlabel("distance k")
    ax.set_ylabel("normalised dot product")
    ax.set_title("Similarity depends only on distance and decays, with ripples", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out / "similarity_vs_distance.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    # How each family changes a logit as the key moves away from the query.
    d = torch.arange(0, length)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), dpi=120)
    alibi = posenc.AlibiBias(heads)(torch.tensor([length - 1]), torch.arange(length))[:, 0].flip(-1)
    for h in range(heads):
        axes[0].plot(d, alibi[h], lw=1, label=f"head {h}: m = {posenc.alibi_slopes(heads)[h].item():.4g}")
    axes[0].set_title("ALiBi: -m_h * distance", fontsize=10)
    axes[0].legend(fontsize=6)
    torch.manual_seed(0)
    t5 = posenc.RelativePositionBias(1, bidirectional=False)
    buckets = t5.buckets(torch.tensor([length - 1]), torch.arange(length))[0].flip(-1)
    axes[1].step(d, buckets, where="post")
    axes[1].set_title("T5: bucket of the distance (causal, 32 buckets)", fontsize=10)
    axes[1].set_ylabel("bucket (one learned bias each)")
    gen = torch.Generator().manual_seed(0)
    qv = torch.randn(1, 1, 1, dim, generator=gen, dtype=torch.float64)
    kv = qv + 0.3 * torch.randn(1, 1, 1, dim, generator=gen, dtype=torch.float64)
    rq, _ = rope(qv, positions=torch.tensor([0]))
    rk, _ = rope(kv.expand(1, 1, length, dim).contiguous(), positions=d)
    axes[2].plot(d, (rq[0, 0] * rk[0, 0]).sum(-1) / dim ** 0.5)
    axes[2].set_title("RoPE: q.k / sqrt(d) of a similar q, k pair", fontsize=10)
    for ax in axes:
        ax.set_xlabel("distance between query and key")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("added to the logit")
    fig.tight_layout()
    paths.append(out / "logits_vs_distance.png")
    fig.savefig(paths[-1])
    plt.close(fig)
    return paths
