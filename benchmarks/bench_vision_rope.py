"""2-D and N-axis RoPE on CPU: posenc against timm, rotary-embedding-torch and diffusers.

    python benchmarks/bench_vision_rope.py [--repeats 3] [--case vit flux] [--dtype float32 bfloat16]

Two shapes, each with q and k rotated per call:

  vit    ViT-L/16 at 224 px with EVA-style 2-D RoPE: B=32, 16 heads, 1 class token + 14x14 patches,
         head dim 64 split (32, 32) over the (h, w) axes, layout (B, H, S, D); the class token is not
         rotated (= rotated at position 0).
  flux   FLUX.1: B=1, 24 heads, 512 text + 64x64 = 4096 image tokens, head dim 128 split (16, 56, 56)
         over (t, h, w) as FLUX's EmbedND, text tokens at (0, 0, 0), layout (B, S, H, D) as diffusers'
         FLUX attention.

Every implementation gets its cos/sin (or frequency) rows built outside the timing, as a model builds
them once per forward and shares them across layers; only the rotation is timed.  posenc is also timed
from positions alone (rows built inside the call) and in place.  Each row prints the median of
``--repeats`` blocked_autorange medians as a ratio to the limit measured in the same repeat (copying q
and k into preallocated buffers of the same dtype), the min-max spread, the median time, and the
largest error of the rotated q against a float64 rotation.

Peers, when installed:
  timm                    apply_rot_embed_cat with its sin/cos embedding (EVA's path, class token
                          concatenated back); timm's package needs torchvision, which does not import beside the CPU
                          build of torch here; its RoPE module does not, and is loaded on its own
  rotary-embedding-torch  apply_rotary_emb with axial frequencies (``get_axial_freqs``)
  diffusers               FLUX's FluxPosEmbed (cos, sin) + apply_rotary_emb

A third case, qwen2vl, times multimodal RoPE on Qwen2-VL-7B's attention shapes (28 query heads, 4 key
heads, head dim 128, mrope_section (16, 24, 24)) for a prompt of 50 text tokens, four 448 x 448 images
(1024 tokens) and 50 text tokens: posenc with its rows given (cos_sin(positions), once per forward) or
from the (B, S, 3) positions (axes t, h, w last, as posenc.mrope_positions returns them), against
transformers' apply_rotary_pos_emb with the cos/sin of Qwen2VLRotaryEmbedding given (from the same
positions axes first, (3, B, S), as transformers takes them), and with them rebuilt per call.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import types

import torch

import posenc

from _timing import median_seconds, ms, ratio_cell

CASES = {
    # name: (B, H, prefix tokens, grid, axes dims, head dim, seq_dim)
    "vit": (32, 16, 1, (14, 14), (32, 32), 64, 2),
    "flux": (1, 24, 512, (64, 64), (16, 56, 56), 128, 1),
}


def import_timm_rope():
    """timm's ``layers.pos_embed_sincos``, or None when timm is not installed.  Without torchvision the
    module is loaded under empty stand-ins for the ``timm`` and ``timm.layers`` packages, whose
    ``__init__`` (models, data pipeline) needs torchvision; the RoPE code itself does not."""
    spec = importlib.util.find_spec("timm")
    if spec is None:
        return None
    if importlib.util.find_spec("torchvision") is not None:
        return importlib.import_module("timm.layers.pos_embed_sincos")
    root = os.path.dirname(spec.origin)
    for name, path in (("timm", root), ("timm.layers", os.path.join(root, "layers"))):
        pkg = types.ModuleType(name)
        pkg.__path__ = [path]
        sys.modules[name] = pkg
    try:
        return importlib.import_module("timm.layers.pos_embed_sincos")
    finally:                                            # other packages probe timm: leave no stand-in behind
        for name in [n for n in sys.modules if n == "timm" or n.startswith("timm.")]:
            del sys.modules[name]


def case_positions(case: str) -> torch.Tensor:
    """``(S, n_axes)`` integer positions: prefix tokens at 0, then the grid in row-major order."""
    _, _, prefix, grid, axes, _, _ = CASES[case]
    hh, ww = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    hw = torch.stack([hh.flatten(), ww.flatten()], -1)                       # (H*W, 2)
    if len(axes) == 3:                                                       # FLUX: (t, h, w), t = 0
        hw = torch.cat([torch.zeros(hw.shape[0], 1, dtype=torch.long), hw], -1)
    return torch.cat([torch.zeros(prefix, len(axes), dtype=torch.long), hw], 0)


def angles64(case: str) -> torch.Tensor:
    """``(S, D/2)`` float64 angles, one per interleaved pair: axis blocks in order, theta_i = 10000^(-2i/d_a)."""
    axes = CASES[case][4]
    pos = case_positions(case).double()
    parts = [pos[:, a, None] * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d) for a, d in enumerate(axes)]
    return torch.cat(parts, -1)


def exact_rotation(x: torch.Tensor, case: str) -> torch.Tensor:
    """float64 interleaved rotation of ``x`` by :func:`angles64` (sequence on CASES' seq_dim)."""
    seq_dim = CASES[case][6]
    ang = angles64(case)
    c, s = ang.cos(), ang.sin()
    if seq_dim == 1:                                                         # (B, S, H, D): rows per S
        c, s = c[:, None], s[:, None]
    x = x.double()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], -1).flatten(-2)


def peers(case: str, dtype: torch.dtype):
    """(label, fn(q, k) -> (q', k')) for the installed peers, tables built here, outside the timing."""
    _, _, prefix, grid, axes, D, seq_dim = CASES[case]
    out = []
    ang = angles64(case).float()                                             # (S, D/2): what each peer builds
    timm_rope = import_timm_rope()
    if timm_rope is not None:
        if case == "vit":
            # EVA: RotaryEmbeddingCat over the patch grid; the class token is split off and put back
            emb = timm_rope.RotaryEmbeddingCat(D, in_pixels=False, feat_shape=list(grid)).get_embed()

            def timm_fn(q, k):
                return tuple(torch.cat([x[:, :, :prefix], timm_rope.apply_rot_embed_cat(x[:, :, prefix:], emb)], 2)
                             for x in (q, k))
        else:
            emb = torch.cat([ang.sin().repeat_interleave(2, -1), ang.cos().repeat_interleave(2, -1)], -1)[:, None]

            def timm_fn(q, k):
                return timm_rope.apply_rot_embed_cat(q, emb), timm_rope.apply_rot_embed_cat(k, emb)
        out.append(("timm apply_rot_embed_cat", timm_fn))
    if importlib.util.find_spec("rotary_embedding_torch"):
        from rotary_embedding_torch import RotaryEmbedding as LucidRotary
        from rotary_embedding_torch import apply_rotary_emb

        if case == "vit":
            rot = LucidRotary(D // 2)                                        # per axis: D/2 features
            freqs = rot.get_axial_freqs(*grid).flatten(0, 1)                  # (H*W, D)
            freqs = torch.cat([torch.zeros(prefix, D), freqs], 0)            # class token at position 0
        else:
            freqs = ang.repeat_interleave(2, -1)[:, None]                     # (S, 1, D): axial rows, (B, S, H, D)

        def lucid_fn(q, k):
            return (apply_rotary_emb(freqs, q, seq_dim=seq_dim, freqs_seq_dim=0),
                    apply_rotary_emb(freqs, k, seq_dim=seq_dim, freqs_seq_dim=0))
        out.append(("rotary-embedding-torch apply_rotary_emb", lucid_fn))
    if importlib.util.find_spec("diffusers"):
        from diffusers.models.embeddings import apply_rotary_emb as diffusers_apply
        from diffusers.models.transformers.transformer_flux import FluxPosEmbed

        cos_sin = FluxPosEmbed(10000, list(axes))(case_positions(case))

        def diffusers_fn(q, k):
            return (diffusers_apply(q, cos_sin, sequence_dim=seq_dim), diffusers_apply(k, cos_sin, sequence_dim=seq_dim))
        out.append(("diffusers FluxPosEmbed + apply_rotary_emb", diffusers_fn))
    return out


def ours(case: str):
    """(label, fn(q, k) -> (q', k'), in place?) for posenc."""
    _, _, prefix, grid, axes, D, seq_dim = CASES[case]
    rope = posenc.AxialRotaryEmbedding(axes)
    positions = posenc.grid_positions(grid, prefix_tokens=prefix) if len(axes) == 2 else case_positions(case)
    rows = rope.cos_sin(positions)

    return [
        ("posenc AxialRotaryEmbedding, rows given", lambda q, k: rope(q, k, cos_sin=rows, seq_dim=seq_dim), False),
        ("posenc AxialRotaryEmbedding, positions given", lambda q, k: rope(q, k, positions=positions, seq_dim=seq_dim),
         False),
        ("posenc AxialRotaryEmbedding, rows given, inplace", lambda q, k: rope(q, k, cos_sin=rows, seq_dim=seq_dim,
                                                                                inplace=True), True),
    ]


def run(case: str, dtype: torch.dtype, repeats: int) -> None:
    B, H, prefix, grid, axes, D, seq_dim = CASES[case]
    S = prefix + grid[0] * grid[1]
    shape = (B, H, S, D) if seq_dim == 2 else (B, S, H, D)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(shape, generator=gen).to(dtype)
    k = torch.randn(shape, generator=gen).to(dtype)
    q_buf, k_buf = torch.empty_like(q), torch.empty_like(k)
    want = exact_rotation(q, case)

    def limit():
        q_buf.copy_(q)
        k_buf.copy_(k)

    impls = ours(case) + [(label, fn, False) for label, fn in peers(case, dtype)]
    calls, errors = [], []
    for _, fn, inplace in impls:
        if inplace:                                     # rotates its own copies over and over: same cost
            qw, kw = q.clone(), k.clone()
            calls.append(lambda fn=fn, qw=qw, kw=kw: fn(qw, kw))
            errors.append((fn(q.clone(), k.clone())[0].double() - want).abs().max().item())
        else:
            calls.append(lambda fn=fn: fn(q, k))
            errors.append((fn(q, k)[0].double() - want).abs().max().item())
    # one repeat = the limit, then every implementation, so each ratio compares times taken together
    lim, times = [], [[] for _ in impls]
    for _ in range(repeats):
        lim.append(median_seconds(limit))
        for t, call in zip(times, calls, strict=True):
            t.append(median_seconds(call))
    print(f"\n{case}: q, k {tuple(shape)} {str(dtype).removeprefix('torch.')}, axes dims {axes}")
    print("| implementation | x copy of q, k (min-max) | ms | max error of q vs float64 |")
    print("|---|---|---|---|")
    print(f"| copy q and k (the limit) | 1.00x | {ms(lim)} | - |")
    for (label, _, _), t, err in zip(impls, times, errors, strict=True):
        print(f"| {label} | {ratio_cell(t, lim)} | {ms(t)} | {err:.1e} |")


# ---- multimodal RoPE (Qwen2-VL) -------------------------------------------------------------------

#: 50 text tokens, four 448 x 448 images (32 x 32 patches, merged 2 x 2: 256 tokens each), 50 text tokens
MROPE_IMAGES, MROPE_TEXT, MROPE_SECTION = 4, 50, (16, 24, 24)


def mrope_prompt() -> tuple[torch.Tensor, torch.Tensor]:
    """``(1, S, 3)`` positions of the prompt (posenc.mrope_positions, axes t, h, w last) and the float64 angles
    ``(S, 64)``."""
    kinds = torch.tensor([[0] * MROPE_TEXT + [1] * (256 * MROPE_IMAGES) + [0] * MROPE_TEXT])
    grids = torch.tensor([[1, 32, 32]] * MROPE_IMAGES)
    positions, _ = posenc.mrope_positions(torch.zeros_like(kinds), mm_token_type_ids=kinds, image_grid_thw=grids)
    axis = torch.repeat_interleave(torch.arange(3), torch.tensor(MROPE_SECTION))          # slot -> t, h, w
    theta = 10000.0 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    angles = positions[0].double()[:, axis] * theta                                         # (S, 64)
    return positions, angles


def run_mrope(dtype: torch.dtype, repeats: int) -> None:
    """Qwen2-VL-7B's attention: 28 query heads, 4 key heads, head dim 128, (B, H, S, D), half layout."""
    positions, angles = mrope_prompt()                                   # (1, S, 3): axes last
    S = positions.shape[-2]
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 28, S, 128, generator=gen).to(dtype)
    k = torch.randn(1, 4, S, 128, generator=gen).to(dtype)
    q_buf, k_buf = torch.empty_like(q), torch.empty_like(k)
    c, s = angles.cos(), angles.sin()
    x = q.double()
    want = torch.cat([x[..., :64] * c - x[..., 64:] * s, x[..., 64:] * c + x[..., :64] * s], -1)

    def limit():
        q_buf.copy_(q)
        k_buf.copy_(k)

    mrope = posenc.MultimodalRotaryEmbedding(128, list(MROPE_SECTION))
    rows = mrope.cos_sin(positions)                                     # once per forward, shared by the layers
    impls = [("posenc MultimodalRotaryEmbedding(q, k, cos_sin=rows)", lambda: mrope(q, k, cos_sin=rows)),
             ("posenc, rows given, in place", lambda: mrope(qw, kw, cos_sin=rows, inplace=True)),
             ("posenc, positions given", lambda: mrope(q, k, positions=positions))]
    qw, kw = q.clone(), k.clone()
    errors = [(mrope(q, k, positions=positions)[0].double() - want).abs().max().item()] * 3
    if importlib.util.find_spec("transformers"):
        from transformers import Qwen2VLConfig
        from transformers.models.qwen2_vl import modeling_qwen2_vl as hf

        cfg = Qwen2VLConfig(hidden_size=28 * 128, num_attention_heads=28, num_key_value_heads=4,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                             "mrope_section": list(MROPE_SECTION)}).get_text_config()
        hf_positions = positions.movedim(-1, 0)                         # transformers takes them axes first: (3, 1, S)
        cos, sin = hf.Qwen2VLRotaryEmbedding(cfg)(q, hf_positions)       # once per forward, shared by the layers
        impls.append(("transformers apply_rotary_pos_emb (cos/sin given)",
                      lambda: hf.apply_rotary_pos_emb(q, k, cos, sin)))
        errors.append((hf.apply_rotary_pos_emb(q, k, cos, sin)[0].double() - want).abs().max().item())
        rotary = hf.Qwen2VLRotaryEmbedding(cfg)
        impls.append(("transformers Qwen2VLRotaryEmbedding + apply_rotary_pos_emb",
                      lambda: hf.apply_rotary_pos_emb(q, k, *rotary(q, hf_positions))))
        errors.append(errors[-1])
    lim, times = [], [[] for _ in impls]
    for _ in range(repeats):
        lim.append(median_seconds(limit))
        for t, (_, fn) in zip(times, impls, strict=True):
            t.append(median_seconds(fn))
    print(f"\nqwen2vl: q (1, 28, {S}, 128), k (1, 4, {S}, 128) {str(dtype).removeprefix('torch.')}, "
          f"mrope_section {MROPE_SECTION}")
    print("| implementation | x copy of q, k (min-max) | ms | max error of q vs float64 |")
    print("|---|---|---|---|")
    print(f"| copy q and k (the limit) | 1.00x | {ms(lim)} | - |")
    for (label, _), t, err in zip(impls, times, errors, strict=True):
        print(f"| {label} | {ratio_cell(t, lim)} | {ms(t)} | {err:.1e} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--case", nargs="+", choices=[*sorted(CASES), "qwen2vl"], default=["vit", "flux", "qwen2vl"])
    ap.add_argument("--dtype", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"])
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, inference_mode; tables built outside the timing")
    for case in args.case:
        for dtype in args.dtype:
            if case == "qwen2vl":
                run_mrope(getattr(torch, dtype), args.repeats)
            else:
                run(case, getattr(torch, dtype), args.repeats)


if __name__ == "__main__":
    main()
