"""PNG figures that explain the encodings (``posenc plot``) and the experiment (``posenc compare``).

matplotlib is an optional extra (``pip install "posenc[plot]"``).
"""

from __future__ import annotations

import pathlib

import torch

__all__ = ["plot_compare", "plot_encodings", "plot_vision", "require_matplotlib"]


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
    return paths + plot_vision(out)


def plot_vision(out: pathlib.Path, *, grid: int = 16, dim: int = 64) -> list[pathlib.Path]:
    """Two figures for image patch grids (``grid x grid`` patches, ``dim`` features): the 2-D sin-cos
    table, and what axial RoPE makes of the distance between two patches."""
    import posenc

    plt = require_matplotlib()
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    n, q4, centre = grid * grid, dim // 4, (grid // 2) * grid + grid // 2

    # the MAE table: [sin(w) | cos(w) | sin(h) | cos(h)], tokens row-major (h * W + w)
    table = posenc.sincos_table_nd((grid, grid), dim, dtype=torch.float64)           # (n, dim)
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.9), dpi=110, gridspec_kw={"width_ratios": [2.2, 1, 1, 1.15]})
    axes[0].imshow(table.T.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower", interpolation="nearest")
    for j, name in enumerate(["sin(w f)", "cos(w f)", "sin(h f)", "cos(h f)"]):
        axes[0].axhline(j * q4 - 0.5, color="k", lw=0.6)
        axes[0].text(n + 2, j * q4 + q4 / 2, name, va="center", fontsize=8, clip_on=False)
    axes[0].set_xlabel("token index h * W + w")
    axes[0].set_ylabel("feature")
    axes[0].set_title(f"sincos_table_nd(({grid}, {grid}), {dim}): one quarter per function and axis", fontsize=9)
    k = 2                                                  # one frequency, f = base^(-k / (dim/4)), seen on the grid
    for ax, col, label in ((axes[1], k, "sin(w f): changes along w"), (axes[2], 2 * q4 + k, "sin(h f): changes along h")):
        ax.imshow(table[:, col].view(grid, grid).numpy(), cmap="RdBu", vmin=-1, vmax=1, interpolation="nearest")
        ax.set_title(f"feature {col}, {label}", fontsize=9)
        ax.set_xlabel("w")
        ax.set_ylabel("h")
    sim = (table @ table[centre]) / (dim / 2)                                        # (n,)
    im = axes[3].imshow(sim.view(grid, grid).numpy(), cmap="viridis", interpolation="nearest")
    axes[3].plot(grid // 2, grid // 2, "r+", ms=10)
    axes[3].set_title("<PE(centre), PE(h, w)> / (d/2): peaks at the centre", fontsize=9)
    axes[3].set_xlabel("w")
    fig.colorbar(im, ax=axes[3], fraction=0.046)
    fig.tight_layout()
    paths.append(out / "sincos_2d_table.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    # axial RoPE: the score of one query against keys at every patch depends on (dh, dw) only;
    # 1-D RoPE over the flattened index puts a patch's vertical neighbour `grid` positions away
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(dim, generator=gen, dtype=torch.float64)
    vk = (v + 0.3 * torch.randn(dim, generator=gen, dtype=torch.float64)).expand(1, 1, n, dim).contiguous()
    axial = posenc.AxialRotaryEmbedding((dim // 2, dim // 2))
    pos = posenc.grid_positions((grid, grid))                                       # (n, 2): (h, w)
    keys, _ = axial(vk, positions=pos)

    def scores(token: int) -> torch.Tensor:
        query, _ = axial(v.view(1, 1, 1, dim), positions=pos[token : token + 1])
        return (keys[0, 0] @ query[0, 0, 0]) / dim ** 0.5                             # (n,)

    other = 3 * grid + grid - 4                                                        # (h, w) = (3, grid - 4)
    flat = posenc.RotaryEmbedding(dim, layout="interleaved", max_seq_len=n)
    flat_keys, _ = flat(vk, positions=torch.arange(n))
    flat_query, _ = flat(v.view(1, 1, 1, dim), positions=torch.tensor([centre]))
    flat_scores = (flat_keys[0, 0] @ flat_query[0, 0, 0]) / dim ** 0.5
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.9), dpi=110)
    lo, hi = min(scores(centre).min(), flat_scores.min()).item(), max(scores(centre).max(), flat_scores.max()).item()
    for ax, token, title in ((axes[0], centre, "axial RoPE, query at the centre"),
                             (axes[1], other, "axial RoPE, query moved: same pattern, shifted")):
        ax.imshow(scores(token).view(grid, grid).numpy(), cmap="viridis", vmin=lo, vmax=hi, interpolation="nearest")
        ax.plot(token % grid, token // grid, "r+", ms=10)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("key w")
        ax.set_ylabel("key h")
    im = axes[2].imshow(flat_scores.view(grid, grid).numpy(), cmap="viridis", vmin=lo, vmax=hi, interpolation="nearest")
    axes[2].plot(grid // 2, grid // 2, "r+", ms=10)
    axes[2].set_title("1-D RoPE over the token index: rows far apart", fontsize=9)
    axes[2].set_xlabel("key w")
    fig.colorbar(im, ax=axes[2], fraction=0.046)
    s_c = scores(centre).view(grid, grid)
    d = torch.arange(grid) - grid // 2
    axes[3].plot(d, s_c[grid // 2], "o-", ms=3, label="axial: along w (dh = 0)")
    axes[3].plot(d, s_c[:, grid // 2], "s--", ms=3, label="axial: along h (dw = 0)")
    axes[3].plot(d, flat_scores.view(grid, grid)[:, grid // 2], "x:", ms=4, label="1-D RoPE: along h")
    axes[3].set_xlabel("offset from the query's patch")
    axes[3].set_ylabel("q.k / sqrt(d)")
    axes[3].set_title("Per-axis similarity (q, k similar vectors)", fontsize=9)
    axes[3].legend(fontsize=7)
    axes[3].grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out / "axial_similarity.png")
    fig.savefig(paths[-1])
    plt.close(fig)
    return paths
