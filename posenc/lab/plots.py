"""PNG figures that explain the encodings (``posenc plot``) and the experiment (``posenc compare``).

matplotlib is an optional extra (``pip install ".[plot]"`` in a clone of posenc, or
``pip install matplotlib``).
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

import torch

from posenc.lab.results import identical_groups, identical_notes

__all__ = ["compare_figure", "encoding_styles", "extend_figure", "line_styles", "plot_compare", "plot_encodings", "plot_vision",
           "require_matplotlib", "save_figure", "similarity_figure", "similarity_series", "task_figure"]


def require_matplotlib():
    """Import matplotlib with the Agg backend, or raise ``ImportError`` saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(
            'plots need matplotlib: pip install matplotlib (in a clone of posenc: pip install ".[plot]")'
        ) from err
    return plt


#: Markers and line styles: every series of a figure gets its own (marker, line style) pair, so
#: curves that coincide stay distinguishable without colour.
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p")
LINESTYLES = ("-", "--", "-.", ":")


def line_styles(n: int, *, first_style: int = 0) -> list[tuple[str, str]]:
    """``n`` distinct ``(marker, linestyle)`` pairs: markers first, then line styles.

    Examples:
        >>> line_styles(3)
        [('o', '-'), ('s', '-'), ('^', '-')]
        >>> len(set(line_styles(48))) == 48
        True
    """
    if n > len(MARKERS) * len(LINESTYLES):
        raise ValueError(f"at most {len(MARKERS) * len(LINESTYLES)} series can get distinct styles, got {n}")
    return [(MARKERS[i % len(MARKERS)], LINESTYLES[(first_style + i // len(MARKERS)) % len(LINESTYLES)])
            for i in range(n)]


def _coincide(a: Sequence[float], b: Sequence[float], atol: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= atol for x, y in zip(a, b, strict=True))


#: Each registered encoding's colour (the classic six first, as in every figure of the docs), then the rules'.
_CLASSIC_COLORS = {"none": "#222222", "sinusoidal": "#1f77b4", "learned": "#17becf", "rope": "#d62728",
                   "alibi": "#2ca02c", "t5": "#9467bd"}
_MORE_COLORS = ("#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#aec7e8", "#98df8a", "#ff9896", "#c5b0d5",
                "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173",
                "#3182bd", "#e6550d")


def encoding_styles(names: Sequence[str]) -> dict[str, tuple[str, str, str]]:
    """``(colour, marker, line style)`` per series of the compare figure: every registered encoding its own
    colour and ``(marker, line style)`` pair, whichever are drawn together; ``rope+<rule>`` series dashed, in
    colours of their own.

    Examples:
        >>> styles = encoding_styles(["rope", "alibi", "rope+yarn"])
        >>> styles["rope"], styles["rope+yarn"][2]
        (('#d62728', 'o', '-'), '--')
    """
    from posenc.lab.registry import ENCODINGS

    registered = list(_CLASSIC_COLORS) + [n for n in ENCODINGS if n not in _CLASSIC_COLORS]
    bases = [n for n in names if not n.startswith("rope+")]
    rules = [n for n in names if n.startswith("rope+")]
    others = [n for n in bases if n not in registered]
    palette = iter(_MORE_COLORS)
    colors = {**_CLASSIC_COLORS, **{n: next(palette) for n in registered[len(_CLASSIC_COLORS):]}}
    spare = list(palette)
    for i, name in enumerate(rules + others):                 # rules and unregistered names: the colours left
        colors[name] = spare[i % len(spare)] if spare else "#444444"
    pairs = dict(zip(bases, line_styles(len(bases)), strict=True))
    # rules: dashed, markers continuing after the base encodings' (pairs stay distinct)
    pairs.update(zip(rules, line_styles(len(bases) + len(rules), first_style=1)[len(bases):], strict=True))
    return {n: (colors[n], *pairs[n]) for n in names}


def compare_figure(results: dict):
    """The ``posenc compare`` figure as a matplotlib ``Figure``: loss against evaluation length.

    One line per encoding, each with its own marker and line style (rope+<rule> dashed); series
    that are equal at every length are named in the legend (``rope+dynamic (= rope+ntk)``), drawn
    with hollow, larger markers around the first, and listed in a note under the axes.
    """
    plt = require_matplotlib()
    cfg = results["config"]
    loss = results["loss"]
    fig, ax = plt.subplots(figsize=(9.0, 4.8), dpi=120)
    names = list(loss)
    styles = encoding_styles(names)
    same_as = {}
    for group in identical_groups(loss):
        for later in group[1:]:
            same_as[later] = group[0]
    for name in names:
        by_len = loss[name]
        lens = sorted(int(L) for L in by_len)
        color, marker, ls = styles[name]
        label = name if name not in same_as else f"{name} (= {same_as[name]})"
        hollow = name in same_as                          # drawn around the identical series, not over it
        ax.plot(lens, [by_len[str(L)] for L in lens], linestyle=ls, marker=marker, ms=7 if hollow else 4,
                mfc="none" if hollow else color, lw=1.8 if ls == "-" else 1.2, label=label, color=color)
    ax.axvline(cfg["train_len"], color="grey", ls=":", lw=1)
    ax.text(cfg["train_len"], ax.get_ylim()[0], " training length", va="bottom", fontsize=8, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({int(L) for by in loss.values() for L in by}))
    ax.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("evaluation length (bytes)")
    ax.set_ylabel("validation loss per byte (nats), lower is better")
    ax.set_title(f"Trained on {cfg['train_len']} bytes, evaluated longer (seed {cfg['seed']}, {cfg['steps']} steps)",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="encoding", title_fontsize=8)
    ax.grid(alpha=0.3)
    notes = identical_notes(loss)
    fig.tight_layout()
    if notes:
        fig.subplots_adjust(bottom=0.2)
        fig.text(0.01, 0.01, "Identical: " + "; ".join(notes), fontsize=8, color="#444444")
    return fig


def plot_compare(results: dict, path: pathlib.Path) -> pathlib.Path:
    """Write :func:`compare_figure` to ``path`` (PNG) and return ``path``."""
    plt = require_matplotlib()
    fig = compare_figure(results)
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


def similarity_figure(dist: Sequence[float], series: Mapping[str, Sequence[float]], *, atol: float = 1e-12):
    """Similarity against distance, one line per series (a distinct marker and line style each);
    a legend entry and a note say which series coincide at every distance (within ``atol``)."""
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=120)
    names = list(series)
    same_as: dict[str, str] = {}
    for i, name in enumerate(names):
        for first in names[:i]:
            if first not in same_as and _coincide(series[first], series[name], atol):
                same_as[name] = first
                break
    every = max(1, len(dist) // 16)
    for (name, values), (marker, ls) in zip(series.items(), line_styles(len(names)), strict=True):
        hollow = name in same_as
        label = name if not hollow else f"{name}\n(= {same_as[name].split(':')[0]} at every distance)"
        ax.plot(dist, values, linestyle=ls, marker=marker, markevery=every,
                ms=7 if hollow else 4, mfc="none" if hollow else None, lw=1.2, label=label)
    ax.set_xlabel("distance k")
    ax.set_ylabel("normalised dot product")
    ax.set_title("Similarity depends only on distance and decays, with ripples", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if same_as:
        fig.subplots_adjust(bottom=0.2)
        fig.text(0.01, 0.01, "Identical: " + "; ".join(
            f"{same_as[n].split(':')[0]} = {n.split(':')[0]} at every distance" for n in same_as), fontsize=8)
    return fig


def similarity_series(dim: int, length: int) -> tuple[list[int], dict[str, list[float]]]:
    """Distances ``0 .. 4 * length - 1`` and two similarity curves against distance.

    ``<PE(p), PE(p + k)>`` depends only on ``k``, and so does RoPE's ``<R(m) q, R(m + k) q>``; for
    ``q = 1`` both equal ``(2/d) sum_i cos(k w_i)``, so the two curves coincide.
    """
    import posenc

    dist = torch.arange(0, 4 * length)
    pe = posenc.sinusoidal_table(4 * length + 1, dim, dtype=torch.float64)
    sim_pe = (pe[0] * pe[dist]).sum(-1) / (dim / 2)
    rope = posenc.RotaryEmbedding(dim, max_seq_len=4 * length + 1)
    q = torch.ones(1, 1, 1, dim, dtype=torch.float64)
    rotated, _ = rope(q.expand(1, 1, dist.numel(), dim).contiguous(), positions=dist)
    sim_rope = (rotated[0, 0, 0] * rotated[0, 0]).sum(-1) / dim
    return dist.tolist(), {"sinusoidal: <PE(p), PE(p+k)> / (d/2)": sim_pe.tolist(),
                           "RoPE: <R(p) q, R(p+k) q> / |q|^2, q = 1": sim_rope.tolist()}


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

    dist, series = similarity_series(dim, length)
    fig = similarity_figure(dist, series)
    paths.append(out / "similarity_vs_distance.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    # How each family changes a logit as the key moves away from the query.
    d = torch.arange(0, length)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), dpi=120)
    alibi = posenc.AlibiBias(heads)(torch.tensor([length - 1]), torch.arange(length))[:, 0].flip(-1)
    for h, (marker, ls) in zip(range(heads), line_styles(heads), strict=True):
        axes[0].plot(d, alibi[h], lw=1, marker=marker, linestyle=ls, ms=3, markevery=max(1, length // 8),
                     label=f"head {h}: m = {posenc.alibi_slopes(heads)[h].item():.4g}")
    axes[0].set_title("ALiBi: -m_h * distance", fontsize=10)
    axes[0].legend(fontsize=6)
    torch.manual_seed(0)
    t5 = posenc.RelativePositionBias(1, bidirectional=False)
    buckets = t5.buckets(torch.tensor([length - 1]), torch.arange(length))[0].flip(-1)
    axes[1].step(d, buckets, where="post")
    axes[1].set_title("T5: bucket of the distance (causal, 32 buckets)", fontsize=10)
    axes[1].set_ylabel("bucket (one learned bias each)")
    gen = torch.Generator().manual_seed(0)
    rope = posenc.RotaryEmbedding(dim, max_seq_len=length)
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
    return paths + plot_vision(out) + plot_shards(out)


def plot_shards(out: pathlib.Path, *, seq_len: int = 32, world_size: int = 4) -> list[pathlib.Path]:
    """One figure: which rank holds which global position under contiguous and zigzag context
    parallelism, and each rank's share of causal attention work."""
    from posenc.distributed import shard_positions

    plt = require_matplotlib()
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2), dpi=120, gridspec_kw={"width_ratios": [3, 3, 2]})
    work: dict[str, list[int]] = {}
    for ax, load_balance in zip(axes[:2], ("contiguous", "zigzag"), strict=True):
        owner = torch.zeros(world_size, seq_len)
        work[load_balance] = []
        for r in range(world_size):
            pos = shard_positions(seq_len, r, world_size, load_balance=load_balance)
            owner[r, pos] = 1.0
            work[load_balance].append(int((pos + 1).sum()))                # keys seen by causal queries
        ax.imshow(owner.numpy(), aspect="auto", cmap="Blues", vmin=0, vmax=1.3, interpolation="nearest")
        ax.set_yticks(range(world_size), [f"rank {r}" for r in range(world_size)])
        ax.set_xlabel("global position")
        ax.set_title(f"{load_balance}: the positions each rank holds", fontsize=10)
    x = torch.arange(world_size)
    axes[2].bar(x - 0.2, work["contiguous"], width=0.4, label="contiguous", hatch="//", color="tab:gray")
    axes[2].bar(x + 0.2, work["zigzag"], width=0.4, label="zigzag", color="tab:blue")
    axes[2].set_xticks(range(world_size), [f"rank {r}" for r in range(world_size)])
    axes[2].set_title("causal work per rank (query-key pairs)", fontsize=10)
    axes[2].legend(fontsize=8)
    fig.suptitle(f"Context parallelism: {seq_len} tokens over {world_size} ranks", fontsize=10)
    fig.tight_layout()
    path = out / "context_parallel_shards.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]


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


def task_figure(results: dict):
    """Left: exact match against test size (log scale) per encoding, mean over seeds with bars from
    the lowest to the highest seed; right: the same for the fraction of answer tokens right."""
    plt = require_matplotlib()
    cfg = results["config"]
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.6), dpi=120)
    panels = (("exact_match", "exact match"), ("token_accuracy", "answer tokens right"))
    for ax, (metric, label) in zip(axes, panels, strict=True):
        series = results["summary"][metric]
        for (name, by), (marker, ls) in zip(series.items(), line_styles(len(series)), strict=True):
            sizes = sorted(int(n) for n in by)
            mean = [by[str(n)]["mean"] for n in sizes]
            low = [by[str(n)]["mean"] - by[str(n)]["min"] for n in sizes]
            high = [by[str(n)]["max"] - by[str(n)]["mean"] for n in sizes]
            ax.errorbar(sizes, mean, yerr=[low, high], marker=marker, linestyle=ls, capsize=3, lw=1.4, ms=5,
                        label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({int(n) for by in series.values() for n in by}))
        ax.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel(f"test size ({results['size_unit']}; trained on 1-{cfg['train_size']})")
        ax.set_ylabel(f"{label}, higher is better")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="encoding", title_fontsize=8)
    fig.suptitle(f"{results['task']}: {results['description']} ({len(cfg['seeds'])} seeds, mean and min-max, "
                 f"{cfg['steps']} steps)", fontsize=10)
    fig.tight_layout()
    return fig


def extend_figure(results: dict):
    """Left: loss at the fine-tuning length against fine-tuning steps per rule; right: loss against
    length after the largest budget."""
    plt = require_matplotlib()
    cfg = results["config"]
    summary = results["summary"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.0, 4.4), dpi=120)
    styles = line_styles(len(summary))
    for (rule, s), (marker, ls) in zip(summary.items(), styles, strict=True):
        steps = sorted(int(k) for k in s["loss_at_finetune_len"])
        xs = [max(k, 0.5) for k in steps]                              # step 0 drawn at 0.5 on the log axis
        ys = [s["loss_at_finetune_len"][str(k)]["mean"] for k in steps]
        left.plot(xs, ys, marker=marker, linestyle=ls, label=rule)
        last = str(max(int(b) for b in s["loss"]))
        lens = sorted(int(L) for L in s["loss"][last])
        right.plot(lens, [s["loss"][last][str(L)]["mean"] for L in lens], marker=marker, linestyle=ls, label=rule)
    target = results["base_loss_at_train_len"]["mean"]
    left.axhline(target, color="grey", ls=":", lw=1)
    left.text(0.5, target, " target: base loss at its training length", va="bottom", fontsize=8, color="grey")
    left.set_xscale("log")
    left.set_xlabel("fine-tuning steps (step 0 drawn at 0.5)")
    left.set_ylabel(f"loss at {results['finetune_len']} bytes (nats/byte)")
    left.set_title(f"Fine-tuning at {results['finetune_len']} bytes, mean of {len(cfg['seeds'])} seeds", fontsize=10)
    right.axvline(results["finetune_len"], color="grey", ls=":", lw=1)
    right.set_xscale("log", base=2)
    right.set_xticks(sorted({int(L) for s in summary.values() for b in s["loss"].values() for L in b}))
    right.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
    right.set_xlabel("evaluation length (bytes)")
    right.set_ylabel("loss (nats/byte), lower is better")
    right.set_title(f"After {cfg['finetune_steps']} steps; dotted: fine-tuning length", fontsize=10)
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title="rule", title_fontsize=8)
    fig.tight_layout()
    return fig


def save_figure(fig, path: pathlib.Path) -> pathlib.Path:
    """Write ``fig`` to ``path`` (PNG), close it, and return ``path``."""
    plt = require_matplotlib()
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
