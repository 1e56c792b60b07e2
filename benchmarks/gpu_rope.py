"""RoPE on a CUDA GPU: posenc's Triton kernels against the memory limit, torch.compile and the peers.

    python benchmarks/gpu_rope.py                      # every section, on the current CUDA device
    python benchmarks/gpu_rope.py --only decode varlen # some sections
    python benchmarks/gpu_rope.py --dry-run            # no GPU: run every posenc row once on CPU tensors
                                                       # under TRITON_INTERPRET=1 and check its values

Sections (each prints a Markdown table; times from ``triton.testing.do_bench``, in one process):

- ``prefill``: q and k of (4, 32, 4096, 128) and (1, 32, 32768, 128) as (B, H, S, D), and GQA with
  8 key heads (4, 4096, 32 | 8, 128) as (B, S, H, D); bfloat16 and float32.  Achieved bandwidth
  (q and k read and written once) and its ratio to a device copy of q and k.
- ``backward``: forward + backward of the same shapes (gradients of q and k), against twice the copy.
- ``decode``: one token per row, B = 1 and 64, 32 query and 8 key heads of 128, per-row positions.
  Microseconds per call: what a decoding step pays, launch and host overhead included.
- ``varlen``: 16 packed sequences of random lengths (16384 tokens in all), flash-attention's
  ``cu_seqlens`` format.
- ``cache``: a decode step's rotation fused with the KV-cache write (contiguous and paged caches),
  against the unfused sequence of the best peers: their rotation, then an indexed cache write.
- ``qknorm``: per-head RMSNorm of q and k then RoPE (Qwen3, Gemma-3), fused, forward and
  forward + backward, against the unfused sequences.
- ``graph``: a decode step (rotate, cache write, attention) captured in a CUDA graph and replayed
  under ``torch.cuda.set_sync_debug_mode("error")``; replay time against the eager step.
- ``tokens``: the Triton kernel's tokens-per-program setting swept on decode and small-head shapes
  (to tune :func:`posenc.kernels.triton_rope.tokens_per_program`).
- ``host``: what a decode call costs on the host: wall microseconds per call (2,000 calls, one
  synchronisation) and the kernels' GPU microseconds (profiler), for every posenc entry point and
  every peer, against an empty Triton launch with the same number of arguments (the floor).

Peers, each used where importable and called as its users call it: Hugging Face's eager
``q * cos + rotate_half(q) * sin`` and the same under ``torch.compile``; Liger-Kernel
(``LigerRopeFunction``, ``LigerRMSNormFunction``), given q and k in the (B, S, H, D) storage of a
transformers model's projections viewed as (B, H, S, D), as transformers' Liger integration does;
FlashInfer (``apply_rope_with_cos_sin_cache_inplace``); flash-attention's Triton rotary, both through
its public ``apply_rotary`` (which launches through ``torch.library.wrap_triton``) and as a direct
``rotary_kernel[grid](...)`` launch (without the compiled flash-attn package, point
``FLASH_ATTN_ROTARY_PY`` at ``flash_attn/ops/triton/rotary.py`` from its source distribution).
Every row also prints the largest difference of its rotated q from a float32 torch reference.
Without CUDA (and without ``--dry-run``) it says so and exits 0.  A dry run also tries the
importable peers on CPU under the interpreter: a smoke test of how this script calls them, not of
the peers (some peer kernels misbehave when interpreted, e.g. Liger-Kernel's in bfloat16).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable

if __name__ == "__main__" and "--dry-run" in sys.argv[1:]:
    # before anything imports Triton: Triton reads it when it decorates a kernel, and transformers and
    # Liger-Kernel import Triton (and decorate their kernels) as soon as they are imported
    os.environ["TRITON_INTERPRET"] = "1"

#: (the host cost first: a run cut short by gpu_check.sh's time limit still has it)
SECTIONS = ("host", "decode", "prefill", "backward", "cache", "qknorm", "varlen", "graph", "tokens")


class Bench:
    """Device, dtype-independent helpers and the peers found here."""

    def __init__(self, dry: bool):
        import torch

        self.torch = torch
        self.dry = dry
        self.device = "cpu" if dry else "cuda"
        self.peers: dict[str, Callable] = _load_peers(dry)   # (a dry run tries them on CPU, interpreted)
        self.compiled: dict[str, Callable] = {}

    # ---- timing and printing ------------------------------------------------------------------

    def time_ms(self, fn: Callable[[], object]) -> float | None:
        if self.dry:
            fn()
            return None
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100)

    def table(self, title: str, unit: str, rows: list, nbytes: float | None, limit_label: str | None) -> None:
        """Time ``rows`` ``(label, fn, check)`` and print them; ``check`` is ``(got, ref)`` or None.

        With ``nbytes``, prints GB/s and the ratio to the first row (the limit); else microseconds
        and the ratio of the best peer's time to each row's (> 1: faster than every peer)."""
        print(f"\n### {title}\n")
        if nbytes is not None:
            print(f"| implementation | ms | GB/s | x {limit_label} | max diff vs fp32 reference |")
            print("|---|---:|---:|---:|---:|")
        else:
            print(f"| implementation | {unit} | best peer / this | max diff vs fp32 reference |")
            print("|---|---:|---:|---:|")
        timed = []
        for label, fn, check in rows:
            try:
                if callable(check):                                  # a peer's check runs inside the guard
                    check = check()
                ms = self.time_ms(fn)
                diff = "" if check is None else f"{_max_diff(*check):.1e}"
            except Exception as exc:  # noqa: BLE001 - a peer that fails on this shape is reported, not fatal
                if label.startswith("posenc"):
                    raise
                print(f"| {label} | failed: {type(exc).__name__}: {str(exc)[:80]} | | |")
                continue
            timed.append((label, ms, diff))
        if not timed:
            return
        peers = [ms for label, ms, _ in timed if ms is not None and not label.startswith(("posenc", "limit"))]
        best_peer = min(peers) if peers else None
        for label, ms, diff in timed:
            if ms is None:
                print(f"| {label} | (dry run) |{' |' if nbytes is not None else ''} | {diff} |")
            elif nbytes is not None:
                print(f"| {label} | {ms:.3f} | {nbytes / ms / 1e6:.0f} | {timed[0][1] / ms:.2f} | {diff} |")
            else:
                ratio = "" if best_peer is None else f"{best_peer / ms:.2f}"
                print(f"| {label} | {ms * 1e3:.1f} | {ratio} | {diff} |")
        sys.stdout.flush()

    def compile(self, name: str, fn: Callable) -> Callable | None:
        """``torch.compile(fn)`` once per name (not in a dry run: compiling on CPU says nothing)."""
        if self.dry:
            return None
        if name not in self.compiled:
            self.compiled[name] = self.torch.compile(fn)
        return self.compiled[name]


def _max_diff(got, ref) -> float:
    return float((got.float() - ref.float()).abs().max())


def _load_peers(dry: bool) -> dict[str, Callable]:
    """The peers' entry points that import here (messages for those that fail).  In a dry run they
    are tried on CPU tensors under the interpreter, which checks how this script calls them."""
    peers: dict[str, Callable] = {}
    if importlib.util.find_spec("liger_kernel"):
        try:
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction
            from liger_kernel.ops.rope import LigerRopeFunction

            peers["liger_rope"] = LigerRopeFunction.apply
            peers["liger_rms_norm"] = LigerRMSNormFunction.apply
        except Exception as exc:  # noqa: BLE001
            print(f"(Liger-Kernel not usable: {type(exc).__name__}: {exc})")
    if importlib.util.find_spec("flashinfer"):
        try:
            from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace

            peers["flashinfer_rope"] = apply_rope_with_cos_sin_cache_inplace
        except Exception as exc:  # noqa: BLE001
            print(f"(FlashInfer not usable: {type(exc).__name__}: {exc})")
    path = os.environ.get("FLASH_ATTN_ROTARY_PY")
    try:
        if path:
            spec = importlib.util.spec_from_file_location("flash_attn_rotary", path)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            if dry:                                  # its wrapper enters torch.cuda.device(x.device.index)
                mod.torch = _NoCudaDevice()
            peers["flash_attn_rotary"] = mod.apply_rotary
        elif importlib.util.find_spec("flash_attn"):
            import flash_attn.ops.triton.rotary as mod
            from flash_attn.ops.triton.rotary import apply_rotary

            peers["flash_attn_rotary"] = apply_rotary
        if "flash_attn_rotary" in peers and hasattr(mod, "rotary_kernel"):
            peers["flash_attn_rotary_kernel"] = _flash_attn_direct(mod.rotary_kernel)
    except Exception as exc:  # noqa: BLE001
        print(f"(flash-attention's rotary not usable: {type(exc).__name__}: {exc})")
    return peers


def _flash_attn_direct(kernel) -> Callable:
    """flash-attention's ``rotary_kernel`` launched as ``kernel[grid](...)``, in place on ``x`` (B, S, H, D),
    without the ``torch.library.wrap_triton`` and device guard its ``apply_rotary`` adds: its kernel as
    an engine would call it.  The arguments follow its ``apply_rotary`` (no varlen, int offsets)."""
    import triton

    def rotate(x, cos, sin, seqlen_offsets=0):
        batch, seqlen, nheads, headdim = x.shape
        seqlen_ro, half = cos.shape
        rotary_dim = 2 * half
        grid = lambda meta: (triton.cdiv(nheads, meta["BLOCK_H"]), triton.cdiv(seqlen, meta["BLOCK_M"]), batch)  # noqa: E731
        kernel[grid](x, x, cos, sin, None, seqlen_offsets, seqlen, nheads, seqlen_ro,
                     x.stride(0), x.stride(-3), x.stride(-2), x.stride(-1),
                     x.stride(0), x.stride(-3), x.stride(-2), x.stride(-1),
                     rotary_dim, isinstance(seqlen_offsets, int) is False, False, False, False,
                     BLOCK_M=8 if rotary_dim <= 128 else 4, BLOCK_H=2)
        return x
    return rotate


class _NoCudaDevice:
    """``torch`` for a peer module run on CPU in a dry run: ``torch.cuda.device(i)`` does nothing."""

    def __getattr__(self, name: str):
        import torch

        if name == "cuda":
            import contextlib
            import types

            return types.SimpleNamespace(device=lambda *_: contextlib.nullcontext())
        return getattr(torch, name)


# ---- shared pieces -------------------------------------------------------------------------------


def _tables(bench: Bench, rows: int, dim: int):
    """Exact float32 ``(rows, dim/2)`` cos/sin tables on the device, and Hugging Face's
    ``(rows, dim)`` duplicated form, and FlashInfer's ``[cos | sin]`` cache."""
    import torch

    from posenc.functional import rope as R

    inv, _ = R.rope_inv_freq(dim)
    cos, sin = (t.to(bench.device) for t in R.rope_cos_sin(torch.arange(rows), inv))
    return cos, sin, torch.cat([cos, cos], -1), torch.cat([sin, sin], -1), torch.cat([cos, sin], -1)


def _rotate_half(x):
    import torch

    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _transformers_rope() -> Callable | None:
    """transformers' own ``apply_rotary_pos_emb`` (Llama's), when transformers is installed."""
    if importlib.util.find_spec("transformers") is None:
        return None
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except Exception:  # noqa: BLE001 - a transformers without it: the same formula written here
        return None
    return apply_rotary_pos_emb


_HF_ROPE: Callable | None = None        # (found by main(), after the interpreter is set for a dry run)


def _hf(q, k, cos, sin):
    """Hugging Face's eager RoPE with cos/sin broadcast against q and k: transformers' own
    ``apply_rotary_pos_emb`` when installed (it unsqueezes one axis of the tables), else its formula
    ``q * cos + rotate_half(q) * sin``."""
    if _HF_ROPE is not None:
        axis = next(i for i in range(cos.dim()) if cos.shape[i] == 1)     # the axis the tables broadcast on
        return _HF_ROPE(q, k, cos.squeeze(axis), sin.squeeze(axis), unsqueeze_dim=axis)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


# ---- sections ------------------------------------------------------------------------------------


def _shapes(bench: Bench):
    """``(name, q shape, k shape, seq_dim)`` of the prefill and backward sections."""
    if bench.dry:
        return [("MHA (B, H, S, D)", (1, 4, 33, 64), (1, 4, 33, 64), 2),
                ("GQA (B, S, H, D)", (2, 17, 4, 64), (2, 17, 2, 64), 1)]
    return [("MHA (B, H, S, D)", (4, 32, 4096, 128), (4, 32, 4096, 128), 2),
            ("MHA (B, H, S, D)", (1, 32, 32768, 128), (1, 32, 32768, 128), 2),
            ("GQA, 8 key heads (B, S, H, D)", (4, 4096, 32, 128), (4, 4096, 8, 128), 1)]


def _dtypes(bench: Bench):
    import torch

    return (torch.bfloat16, torch.float32)


def section_prefill(bench: Bench, backward: bool = False) -> None:
    import torch

    from posenc.functional import rope as R

    for name, qs, ks, sd in _shapes(bench):
        S, D = qs[sd], qs[-1]
        cos, sin, cos_hf, sin_hf, cs_cache = _tables(bench, S, D)
        for dtype in _dtypes(bench):
            q = torch.randn(qs, device=bench.device, dtype=dtype)
            k = torch.randn(ks, device=bench.device, dtype=dtype)
            nbytes = 2 * (q.numel() + k.numel()) * q.element_size() * (2 if backward else 1)
            ref = R.apply_rope_qk(q.float(), None, cos, sin, seq_dim=sd, engine="torch")[0]
            bshape = (1, 1, S, D) if sd == 2 else (1, S, 1, D)                # HF's cos/sin broadcast
            c_hf, s_hf = cos_hf.view(bshape).to(dtype), sin_hf.view(bshape).to(dtype)
            rows = _prefill_rows(bench, q, k, cos, sin, c_hf, s_hf, cs_cache, sd, ref, backward)
            title = (f"{'Forward + backward' if backward else 'Forward'}: {name} q {qs}, k {ks}, "
                     f"{str(dtype).replace('torch.', '')}")
            bench.table(title, "ms", rows, nbytes, "copy" if not backward else "2 copies")
            del q, k
            if not bench.dry:
                torch.cuda.empty_cache()


def _prefill_rows(bench, q, k, cos, sin, c_hf, s_hf, cs_cache, sd, ref, backward):
    import torch

    from posenc.functional import rope as R

    qb, kb = torch.empty_like(q), torch.empty_like(k)
    if backward:
        gq, gk = torch.randn_like(q), torch.randn_like(k)
        qg, kg = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()

        def train(fn):                                   # (autograd.grad: no accumulation into .grad)
            return lambda: torch.autograd.grad(fn(qg, kg), (qg, kg), (gq, gk))

        rows = [("limit: copy q and k twice", lambda: (qb.copy_(q), kb.copy_(k), qb.copy_(q), kb.copy_(k)), None)]
        rows.append(("posenc triton (autograd)", train(lambda a, b: R.apply_rope_qk(a, b, cos, sin, seq_dim=sd,
                                                                                    engine="triton")), None))
        rows.append(("HF eager (autograd)", train(lambda a, b: _hf(a, b, c_hf, s_hf)), None))
        hfc = bench.compile("hf", _hf)
        if hfc is not None:
            rows.append(("HF eager under torch.compile (autograd)", train(lambda a, b: hfc(a, b, c_hf, s_hf)), None))
        liger = bench.peers.get("liger_rope")
        if liger is not None:
            # as transformers models call it: (B, S, H, D) storage viewed as (B, H, S, D), cos (1, S, D)
            c_l, s_l = c_hf.reshape(1, -1, c_hf.shape[-1]), s_hf.reshape(1, -1, s_hf.shape[-1])
            ql_g, kl_g = (_bshd(t, sd).requires_grad_() for t in (q, k))
            gl_q, gl_k = _bshd(gq, sd).transpose(1, 2), _bshd(gk, sd).transpose(1, 2)
            rows.append(("Liger LigerRopeFunction, (B, S, H, D) storage (autograd)",
                         lambda: torch.autograd.grad(liger(ql_g.transpose(1, 2), kl_g.transpose(1, 2), c_l, s_l),
                                                     (ql_g, kl_g), (gl_q, gl_k)), None))
        return rows
    rows = [("limit: copy q and k", lambda: (qb.copy_(q), kb.copy_(k)), None)]
    qi, ki = q.clone(), k.clone()
    rows.append(("posenc triton, inplace=True",
                 lambda: R.apply_rope_qk(qi, ki, cos, sin, seq_dim=sd, inplace=True, engine="triton"),
                 lambda: (R.apply_rope_qk(q.clone(), k.clone(), cos, sin, seq_dim=sd, inplace=True,
                                          engine="triton")[0], ref)))
    rows.append(("posenc triton", lambda: R.apply_rope_qk(q, k, cos, sin, seq_dim=sd, engine="triton"),
                 lambda: (R.apply_rope_qk(q, k, cos, sin, seq_dim=sd, engine="triton")[0], ref)))
    rows.append(("HF eager", lambda: _hf(q, k, c_hf, s_hf), (_hf(q, k, c_hf, s_hf)[0], ref)))
    hfc = bench.compile("hf", _hf)
    if hfc is not None:
        rows.append(("HF eager under torch.compile", lambda: hfc(q, k, c_hf, s_hf), (hfc(q, k, c_hf, s_hf)[0], ref)))
    rows += _peer_prefill_rows(bench, q, k, cos, sin, c_hf, s_hf, cs_cache, sd, ref)
    return rows


def _peer_prefill_rows(bench, q, k, cos, sin, c_hf, s_hf, cs_cache, sd, ref):
    """The in-place peers, each on copies in its own layout (the same bytes)."""
    import torch

    rows = []
    qt = q if sd == 1 else q.transpose(1, 2)                               # (B, S, H, D) views
    kt = k if sd == 1 else k.transpose(1, 2)
    B, S, Hq, D = qt.shape
    liger = bench.peers.get("liger_rope")
    if liger is not None:
        # as transformers models call it: their (B, S, H, D) projections viewed as (B, H, S, D)
        ql, kl = _bshd(q, sd), _bshd(k, sd)
        c_l, s_l = c_hf.reshape(1, S, D), s_hf.reshape(1, S, D)

        def liger_check():
            out = liger(ql.clone().transpose(1, 2), kl.clone().transpose(1, 2), c_l, s_l)[0]   # (B, H, S, D)
            return (out if sd == 2 else out.transpose(1, 2), ref)
        rows.append(("Liger LigerRopeFunction, (B, S, H, D) storage",
                     lambda: liger(ql.transpose(1, 2), kl.transpose(1, 2), c_l, s_l), liger_check))
    fi = bench.peers.get("flashinfer_rope")
    if fi is not None:                                                     # FlashInfer: (tokens, H * D)
        qf, kf = qt.reshape(B * S, Hq * D).clone(), kt.reshape(B * S, -1).clone()
        pos = torch.arange(S, device=q.device).repeat(B)

        def fi_check():
            check_q = qf.clone()
            fi(pos, check_q, kf.clone(), D, cs_cache, True)
            return (check_q.view(B, S, Hq, D) if sd == 1 else check_q.view(B, S, Hq, D).transpose(1, 2), ref)
        rows.append(("FlashInfer apply_rope_with_cos_sin_cache_inplace", lambda: fi(pos, qf, kf, D, cs_cache, True),
                     fi_check))
    fa = bench.peers.get("flash_attn_rotary")
    if fa is not None:                                                     # flash-attn: (B, S, H, D), q then k
        qa, ka = (t.clone(memory_format=torch.contiguous_format) for t in (qt, kt))   # own copies, rotated in place
        c_fa, s_fa = cos.to(q.dtype), sin.to(q.dtype)                      # flash-attn wants x's dtype
        rows.append(("flash-attention apply_rotary (q and k, in place)",
                     lambda: (fa(qa, c_fa, s_fa, inplace=True), fa(ka, c_fa, s_fa, inplace=True)),
                     lambda: (fa(qt.contiguous(), c_fa, s_fa) if sd == 1 else
                              fa(qt.contiguous(), c_fa, s_fa).transpose(1, 2), ref)))
        direct = bench.peers.get("flash_attn_rotary_kernel")
        if direct is not None:
            qd, kd = qa.clone(), ka.clone()
            rows.append(("flash-attention rotary_kernel launched directly (q and k, in place)",
                         lambda: (direct(qd, c_fa, s_fa), direct(kd, c_fa, s_fa)),
                         lambda: (direct(qt.contiguous(), c_fa, s_fa) if sd == 1 else
                                  direct(qt.contiguous(), c_fa, s_fa).transpose(1, 2), ref)))
    return rows


def _bshd(t, seq_dim: int = 1):
    """A copy of ``t`` in (B, S, H, D) storage, the layout of a transformers model's projections."""
    import torch

    x = t if seq_dim == 1 else t.transpose(1, 2)
    return x.clone(memory_format=torch.contiguous_format)


def section_decode(bench: Bench) -> None:
    import torch

    import posenc
    from posenc.functional import rope as R

    Hq, Hk, D, P = (4, 2, 64, 64) if bench.dry else (32, 8, 128, 4096)
    cos, sin, cos_hf, sin_hf, cs_cache = _tables(bench, P, D)
    rope = posenc.RotaryEmbedding(D, max_seq_len=P, device=bench.device)
    for B in (1, 64) if not bench.dry else (1, 3):
        for dtype in _dtypes(bench):
            q = torch.randn(B, 1, Hq, D, device=bench.device, dtype=dtype)      # (B, S=1, H, D)
            k = torch.randn(B, 1, Hk, D, device=bench.device, dtype=dtype)
            pos = torch.randint(0, P, (B, 1), device=bench.device)
            ref = R.apply_rope_qk(q.float(), None, cos, sin, positions=pos, seq_dim=1, engine="torch")[0]
            got = R.apply_rope_qk(q, k, cos, sin, positions=pos, seq_dim=1, engine="triton", assume_valid=True)
            rows = [
                ("posenc apply_rope_qk (triton, positions promised in the table)",
                 lambda q=q, k=k, pos=pos: R.apply_rope_qk(q, k, cos, sin, positions=pos, seq_dim=1, engine="triton",
                                                           assume_valid=True), (got[0], ref)),
                ("posenc RotaryEmbedding module (assume_valid=True)",
                 lambda q=q, k=k, pos=pos: rope(q, k, positions=pos, seq_dim=1, assume_valid=True), None),
            ]
            c_hf = cos_hf[pos].unsqueeze(2).to(dtype)                         # (B, 1, 1, D)
            s_hf = sin_hf[pos].unsqueeze(2).to(dtype)
            rows.append(("HF eager (rows gathered per call)",
                         lambda q=q, k=k, pos=pos: _hf(q, k, cos_hf[pos].unsqueeze(2).to(q.dtype),
                                                       sin_hf[pos].unsqueeze(2).to(q.dtype)),
                         (_hf(q, k, c_hf, s_hf)[0], ref)))
            hfc = bench.compile("hf_decode", lambda q, k, pos: _hf(q, k, cos_hf[pos].unsqueeze(2).to(q.dtype),
                                                                   sin_hf[pos].unsqueeze(2).to(q.dtype)))
            if hfc is not None:
                rows.append(("HF eager under torch.compile", lambda q=q, k=k, pos=pos: hfc(q, k, pos),
                             (hfc(q, k, pos)[0], ref)))
            rows += _peer_decode_rows(bench, q, k, pos, cos, sin, cos_hf, sin_hf, cs_cache, ref)
            bench.table(f"Decode step: B={B}, S=1, {Hq} query / {Hk} key heads of {D}, "
                        f"{str(dtype).replace('torch.', '')}", "us per call", rows, None, None)


def _peer_decode_rows(bench, q, k, pos, cos, sin, cos_hf, sin_hf, cs_cache, ref):

    rows = []
    B, _, Hq, D = q.shape
    liger = bench.peers.get("liger_rope")
    if liger is not None:                  # (B, S, H, D) storage viewed as (B, H, S, D), cos (B, S, D)
        ql, kl = q.clone(), k.clone()                                       # own copies, (B, 1, H, D)
        rows.append(("Liger LigerRopeFunction, (B, S, H, D) storage (rows gathered per call)",
                     lambda: liger(ql.transpose(1, 2), kl.transpose(1, 2), cos_hf[pos].to(q.dtype),
                                   sin_hf[pos].to(q.dtype)),
                     lambda: (liger(ql.clone().transpose(1, 2), kl.clone().transpose(1, 2), cos_hf[pos].to(q.dtype),
                                    sin_hf[pos].to(q.dtype))[0].transpose(1, 2), ref)))
    fi = bench.peers.get("flashinfer_rope")
    if fi is not None:
        qf, kf, pf = q.reshape(B, Hq * D).clone(), k.reshape(B, -1).clone(), pos.reshape(B)

        def fi_check():
            check_q = qf.clone()
            fi(pf, check_q, kf.clone(), D, cs_cache, True)
            return check_q.view(B, 1, Hq, D), ref
        rows.append(("FlashInfer apply_rope_with_cos_sin_cache_inplace", lambda: fi(pf, qf, kf, D, cs_cache, True),
                     fi_check))
    fa = bench.peers.get("flash_attn_rotary")
    if fa is not None:                                                     # per-row positions as seqlen offsets
        qa, ka, off = q.clone(), k.clone(), pos.reshape(B).int()
        c_fa, s_fa = cos.to(q.dtype), sin.to(q.dtype)                      # flash-attn wants x's dtype
        rows.append(("flash-attention apply_rotary (seqlen_offsets per row, q then k)",
                     lambda: (fa(qa, c_fa, s_fa, seqlen_offsets=off, inplace=True),
                              fa(ka, c_fa, s_fa, seqlen_offsets=off, inplace=True)),
                     lambda: (fa(q.clone(), c_fa, s_fa, seqlen_offsets=off), ref)))
        direct = bench.peers.get("flash_attn_rotary_kernel")
        if direct is not None:
            qd, kd = q.clone(), k.clone()
            rows.append(("flash-attention rotary_kernel launched directly (seqlen_offsets per row, q then k)",
                         lambda: (direct(qd, c_fa, s_fa, off), direct(kd, c_fa, s_fa, off)),
                         lambda: (direct(q.clone(), c_fa, s_fa, off), ref)))
    return rows


def section_varlen(bench: Bench) -> None:
    import torch

    from posenc.functional import rope as R

    gen = torch.Generator().manual_seed(0)
    n, total, Hq, Hk, D = (4, 40, 4, 2, 64) if bench.dry else (16, 16384, 32, 8, 128)
    cuts = torch.randperm(total - 1, generator=gen)[: n - 1].add(1).sort().values
    cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([total])]).to(torch.int32).to(bench.device)
    lengths = (cu[1:] - cu[:-1]).tolist()
    P = max(lengths)
    cos, sin, cos_hf, sin_hf, cs_cache = _tables(bench, P, D)
    pos = torch.cat([torch.arange(n_) for n_ in lengths]).to(bench.device)   # what the peers take instead
    for dtype in _dtypes(bench):
        q = torch.randn(total, Hq, D, device=bench.device, dtype=dtype)     # (T, H, D)
        k = torch.randn(total, Hk, D, device=bench.device, dtype=dtype)
        nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
        ref = R.apply_rope_qk(q.float()[None], None, cos, sin, positions=pos[None], seq_dim=1, engine="torch")[0][0]
        qb, kb = torch.empty_like(q), torch.empty_like(k)
        qi, ki = q.clone(), k.clone()
        rows = [("limit: copy q and k", lambda: (qb.copy_(q), kb.copy_(k)), None),
                ("posenc triton, cu_seqlens, inplace=True",
                 lambda: R.apply_rope_qk(qi, ki, cos, sin, cu_seqlens=cu, inplace=True, engine="triton",
                                         assume_valid=True),
                 lambda: (R.apply_rope_qk(q.clone(), k.clone(), cos, sin, cu_seqlens=cu, inplace=True,
                                          engine="triton")[0], ref)),
                ("posenc triton, cu_seqlens",
                 lambda: R.apply_rope_qk(q, k, cos, sin, cu_seqlens=cu, engine="triton", assume_valid=True),
                 lambda: (R.apply_rope_qk(q, k, cos, sin, cu_seqlens=cu, engine="triton")[0], ref))]
        hfc = bench.compile("hf_varlen", lambda q, k, pos: _hf(q, k, cos_hf[pos][:, None].to(q.dtype),
                                                               sin_hf[pos][:, None].to(q.dtype)))
        if hfc is not None:
            rows.append(("HF eager under torch.compile (positions given)", lambda: hfc(q, k, pos),
                         (hfc(q, k, pos)[0], ref)))
        fa = bench.peers.get("flash_attn_rotary")
        if fa is not None:
            qa, ka = q.clone(), k.clone()
            c_fa, s_fa = cos.to(dtype), sin.to(dtype)                      # flash-attn wants x's dtype
            rows.append(("flash-attention apply_rotary (cu_seqlens, max_seqlen; q then k)",
                         lambda: (fa(qa, c_fa, s_fa, cu_seqlens=cu, max_seqlen=P, inplace=True),
                                  fa(ka, c_fa, s_fa, cu_seqlens=cu, max_seqlen=P, inplace=True)),
                         lambda: (fa(q.clone(), c_fa, s_fa, cu_seqlens=cu, max_seqlen=P), ref)))
        fi = bench.peers.get("flashinfer_rope")
        if fi is not None:
            qf, kf = q.reshape(total, -1).clone(), k.reshape(total, -1).clone()
            rows.append(("FlashInfer apply_rope_with_cos_sin_cache_inplace (positions given)",
                         lambda: fi(pos, qf, kf, D, cs_cache, True), None))
        bench.table(f"Packed batch: {n} sequences, {total} tokens, {Hq} query / {Hk} key heads of {D}, "
                    f"{str(dtype).replace('torch.', '')}", "ms", rows, nbytes, "copy")


def section_cache(bench: Bench) -> None:
    import torch

    import posenc
    from posenc.functional import rope as R

    B, Hq, Hk, D, S_max, block = (3, 4, 2, 64, 32, 8) if bench.dry else (64, 32, 8, 128, 4096, 16)
    cos, sin, cos_hf, sin_hf, cs_cache = _tables(bench, S_max, D)
    for dtype in _dtypes(bench):
        q = torch.randn(B, 1, Hq, D, device=bench.device, dtype=dtype)          # (B, S=1, H, D)
        k = torch.randn(B, 1, Hk, D, device=bench.device, dtype=dtype)
        v = torch.randn(B, 1, Hk, D, device=bench.device, dtype=dtype)
        lens = torch.randint(0, S_max - 1, (B,), device=bench.device)
        kc = torch.zeros(B, Hk, S_max, D, device=bench.device, dtype=dtype)     # (B, Hk, S_max, D)
        vc = torch.zeros_like(kc)
        rows_b = torch.arange(B, device=bench.device)

        def unfused_posenc():
            qr, kr = R.apply_rope_qk(q, k, cos, sin, positions=lens[:, None], seq_dim=1, engine="triton",
                                     assume_valid=True)
            kc[rows_b, :, lens] = kr[:, 0]
            vc[rows_b, :, lens] = v[:, 0]
            return qr

        ref_q = R.apply_rope_qk(q.float(), None, cos, sin, positions=lens[:, None], seq_dim=1, engine="torch")[0]
        got = posenc.rope_and_cache(q, k, v, kc, vc, cos, sin, cache_seqlens=lens, seq_dim=1, engine="triton",
                                    assume_valid=True)
        rows = [("posenc rope_and_cache, contiguous cache (one launch)",
                 lambda: posenc.rope_and_cache(q, k, v, kc, vc, cos, sin, cache_seqlens=lens, seq_dim=1,
                                               engine="triton", assume_valid=True), (got, ref_q)),
                ("posenc apply_rope_qk, then the cache write (unfused)", unfused_posenc, None)]
        fi = bench.peers.get("flashinfer_rope")
        if fi is not None:
            qf, kf = q.reshape(B, -1).clone(), k.reshape(B, -1).clone()

            def unfused_flashinfer():
                fi(lens, qf, kf, D, cs_cache, True)
                kc[rows_b, :, lens] = kf.view(B, Hk, D)
                vc[rows_b, :, lens] = v[:, 0]

            rows.append(("FlashInfer rope in place, then the cache write (unfused)", unfused_flashinfer, None))
        step = bench.compile("cache_step", lambda q, k, v, lens: _hf_cache_step(q, k, v, lens, kc, vc, cos_hf, sin_hf))
        if step is not None:
            rows.append(("HF eager rope + cache write under torch.compile", lambda: step(q, k, v, lens), None))
        bench.table(f"Decode step with the KV-cache write, contiguous cache (B={B}, S_max={S_max}, {Hq} | {Hk} heads "
                    f"of {D}), {str(dtype).replace('torch.', '')}", "us per call", rows, None, None)
        _cache_paged(bench, q, k, v, lens, cos, sin, cs_cache, block, ref_q)


def _hf_cache_step(q, k, v, lens, kc, vc, cos_hf, sin_hf):
    rows = __import__("torch").arange(q.shape[0], device=q.device)
    c, s = cos_hf[lens][:, None, None].to(q.dtype), sin_hf[lens][:, None, None].to(q.dtype)
    qr, kr = _hf(q, k, c, s)
    kc[rows, :, lens] = kr[:, 0]
    vc[rows, :, lens] = v[:, 0]
    return qr


def _cache_paged(bench, q, k, v, lens, cos, sin, cs_cache, block, ref_q):
    import torch

    import posenc

    B, _, Hq, D = q.shape
    Hk = k.shape[2]
    n_blocks = B * (cos.shape[0] // block)
    kc = torch.zeros(n_blocks, block, Hk, D, device=q.device, dtype=q.dtype)   # (blocks, block_size, Hk, D)
    vc = torch.zeros_like(kc)
    slots = torch.randperm(n_blocks * block, device=q.device)[:B]
    qt, kt, vt = q[:, 0], k[:, 0], v[:, 0]                                      # (T=B, H, D)
    got = posenc.rope_and_cache(qt, kt, vt, kc, vc, cos, sin, slots=slots, positions=lens, engine="triton",
                                assume_valid=True)
    rows = [("posenc rope_and_cache, paged cache (one launch)",
             lambda: posenc.rope_and_cache(qt, kt, vt, kc, vc, cos, sin, slots=slots, positions=lens,
                                           engine="triton", assume_valid=True), (got, ref_q[:, 0]))]
    flat_k, flat_v = kc.view(-1, Hk, D), vc.view(-1, Hk, D)

    def unfused_posenc():
        qr, kr = posenc.apply_rope_qk(qt[None], kt[None], cos, sin, positions=lens[None], seq_dim=1,
                                      engine="triton", assume_valid=True)
        flat_k.index_copy_(0, slots, kr[0])
        flat_v.index_copy_(0, slots, vt)
        return qr

    rows.append(("posenc apply_rope_qk, then index_copy_ into the pages (unfused)", unfused_posenc, None))
    fi = bench.peers.get("flashinfer_rope")
    if fi is not None:
        qf, kf = qt.reshape(B, -1).clone(), kt.reshape(B, -1).clone()

        def unfused_flashinfer():
            fi(lens, qf, kf, D, cs_cache, True)
            flat_k.index_copy_(0, slots, kf.view(B, Hk, D))
            flat_v.index_copy_(0, slots, vt)

        rows.append(("FlashInfer rope in place, then index_copy_ into the pages (vLLM's two steps)",
                     unfused_flashinfer, None))
    bench.table(f"Decode step with the KV-cache write, paged cache ({n_blocks} blocks of {block}), "
                f"{str(q.dtype).replace('torch.', '')}", "us per call", rows, None, None)


def section_qknorm(bench: Bench) -> None:
    import torch

    try:
        from posenc.functional.norm_rope import rms_norm_rope_qk
    except ImportError:
        print("\n(qknorm: posenc.functional.norm_rope is not available)")
        return
    from posenc.functional import rope as R

    B, S, Hq, Hk, D = (1, 9, 4, 2, 64) if bench.dry else (4, 4096, 32, 8, 128)
    cos, sin, cos_hf, sin_hf, _ = _tables(bench, S, D)
    eps = 1e-6
    for dtype in _dtypes(bench):
        q = torch.randn(B, S, Hq, D, device=bench.device, dtype=dtype)        # (B, S, H, D)
        k = torch.randn(B, S, Hk, D, device=bench.device, dtype=dtype)
        wq = torch.rand(D, device=bench.device, dtype=dtype) + 0.5
        wk = torch.rand(D, device=bench.device, dtype=dtype) + 0.5
        c_hf, s_hf = cos_hf.view(1, S, 1, D).to(dtype), sin_hf.view(1, S, 1, D).to(dtype)

        def norm(x, w):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

        def eager(q, k, wq, wk):
            return _hf(norm(q, wq), norm(k, wk), c_hf, s_hf)

        ref = R.apply_rope_qk(norm(q.float(), wq.float()), None, cos, sin, seq_dim=1, engine="torch")[0]
        fused = rms_norm_rope_qk(q, k, wq, wk, cos, sin, eps=eps, seq_dim=1, engine="triton")
        for train in (False, True):
            rows = _qknorm_rows(bench, q, k, wq, wk, cos, sin, eps, eager, norm, c_hf, s_hf, train,
                                rms_norm_rope_qk, fused[0], ref)
            nbytes = 2 * (q.numel() + k.numel()) * q.element_size() * (2 if train else 1)
            bench.table(f"QK-RMSNorm + RoPE {'forward + backward' if train else 'forward'}: q {tuple(q.shape)}, "
                        f"k {tuple(k.shape)}, {str(dtype).replace('torch.', '')}", "ms", rows, nbytes,
                        "2 copies" if train else "copy")


def _qknorm_rows(bench, q, k, wq, wk, cos, sin, eps, eager, norm, c_hf, s_hf, train, fused_fn, got, ref):
    import torch

    from posenc.functional import rope as R

    qb, kb = torch.empty_like(q), torch.empty_like(k)
    copies = (lambda: (qb.copy_(q), kb.copy_(k), qb.copy_(q), kb.copy_(k))) if train else (
        lambda: (qb.copy_(q), kb.copy_(k)))
    impls = [("posenc rms_norm_rope_qk (one kernel)",
              lambda a, b, wa, wb: fused_fn(a, b, wa, wb, cos, sin, eps=eps, seq_dim=1, engine="triton")),
             ("torch RMSNorm, then posenc apply_rope_qk (unfused)",
              lambda a, b, wa, wb: R.apply_rope_qk(norm(a, wa), norm(b, wb), cos, sin, seq_dim=1, engine="triton")),
             ("HF eager (Qwen3RMSNorm + apply_rotary_pos_emb)", eager)]
    compiled = bench.compile("qknorm_eager", eager)
    if compiled is not None:
        impls.append(("HF eager under torch.compile", compiled))
    liger_n, liger_r = bench.peers.get("liger_rms_norm"), bench.peers.get("liger_rope")
    if liger_n is not None and liger_r is not None:
        c_l, s_l = c_hf[:, :, 0], s_hf[:, :, 0]                                  # (1, S, D)

        def liger(a, b, wa, wb):
            an = liger_n(a, wa, eps, 0.0, "llama", False).transpose(1, 2)
            bn = liger_n(b, wb, eps, 0.0, "llama", False).transpose(1, 2)
            return liger_r(an, bn, c_l, s_l)
        impls.append(("Liger RMSNorm, then Liger RoPE (unfused)", liger))
    rows = [("limit: copy q and k" + (" twice" if train else ""), copies, None)]
    for i, (label, fn) in enumerate(impls):
        if train:
            args = [t.detach().clone().requires_grad_() for t in (q, k, wq, wk)]
            rows.append((label + " (autograd)", _backward_step(fn, args), None))
        else:
            rows.append((label, lambda fn=fn: fn(q, k, wq, wk), (got, ref) if i == 0 else None))
    return rows


def _backward_step(fn: Callable, args: list) -> Callable[[], object]:
    """Forward and backward of ``fn(*args)`` with fixed random output gradients, drawn on the first call
    (inside the table's guard, so a peer that fails here is reported, not fatal)."""
    import torch

    grads: list = []

    def step():
        out = fn(*args)
        if not grads:
            grads.extend(torch.randn_like(o) for o in out)
        return torch.autograd.grad(out, args, grads)
    return step


def section_graph(bench: Bench) -> None:
    """Capture a decode step in a CUDA graph and replay it under the sync debug mode."""
    import torch

    import posenc

    if bench.dry:
        print("\n(graph: CUDA graphs need a GPU; skipped in a dry run)")
        return
    B, Hq, Hk, D, S_max = 8, 32, 8, 128, 1024
    cos, sin, *_ = _tables(bench, S_max, D)
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)          # (B, H, S=1, D)
    k = torch.randn(B, Hk, 1, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kc = torch.randn(B, Hk, S_max, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    lens = torch.randint(1, S_max - 1, (B,), device="cuda")
    keys = torch.arange(S_max, device="cuda")

    def step():
        qr = posenc.rope_and_cache(q, k, v, kc, vc, cos, sin, cache_seqlens=lens, engine="triton", assume_valid=True)
        mask = (keys[None, :] <= lens[:, None])[:, None, None]                # (B, 1, 1, S_max)
        return torch.nn.functional.scaled_dot_product_attention(qr, kc, vc, attn_mask=mask, enable_gqa=True)

    eager = step()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()                                                                 # warm up: compile the kernels
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            out = step()
        graph.replay()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    print(f"\n### CUDA graph of a decode step (B={B}, {Hq} | {Hk} heads of {D}, S_max={S_max}, bfloat16)\n")
    print(f"captured and replayed with no host-device sync; max diff replay vs eager: {_max_diff(out, eager):.1e}")
    print(f"eager step: {bench.time_ms(step) * 1e3:.1f} us, graph replay: {bench.time_ms(graph.replay) * 1e3:.1f} us")


def section_tokens(bench: Bench) -> None:
    """Sweep the tokens rotated per program on shapes where it matters."""
    import torch

    from posenc.kernels import triton_rope

    shapes = [(64, 1, 32, 8, 128), (64, 1, 4, 1, 64), (1, 4096, 4, 1, 64), (1, 4096, 32, 8, 128)]
    if bench.dry:
        shapes = [(2, 3, 2, 1, 16)]
    print("\n### Tokens per program (B, S, Hq, Hk, D), bfloat16: us per call\n")
    print("| shape | default | " + " | ".join(f"{t}" for t in (1, 2, 4, 8, 16)) + " |")
    print("|---|---:|" + "---:|" * 5)
    for B, S, Hq, Hk, D in shapes:
        cos, sin, *_ = _tables(bench, S, D)
        q = torch.randn(B, S, Hq, D, device=bench.device, dtype=torch.bfloat16)
        k = torch.randn(B, S, Hk, D, device=bench.device, dtype=torch.bfloat16)
        default = triton_rope.tokens_per_program(Hq + Hk, D // 2, B * S)
        cells = []
        for t in (1, 2, 4, 8, 16):
            ms = bench.time_ms(lambda t=t: triton_rope.launch(q, k, q, k, cos, sin, None, 0, False, 1, False,
                                                              tokens=t))
            cells.append("dry" if ms is None else f"{ms * 1e3:.1f}")
        print(f"| {(B, S, Hq, Hk, D)} | {default} | " + " | ".join(cells) + " |")


def _empty_kernels():
    """Triton kernels that do nothing, with 3 and with 35 arguments (9 pointers and 26 integers, as
    posenc's RoPE kernel): the floor of a launch from Python."""
    import triton

    @triton.jit
    def empty3(a, b, c):
        pass

    @triton.jit
    def empty35(p0, p1, p2, p3, p4, p5, p6, p7, p8, i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14,
                i15, i16, i17, i18, i19, i20, i21, i22, i23, i24, i25):
        pass

    return empty3, empty35


def _host_cost(bench: Bench, fn: Callable[[], object], calls: int = 2000) -> tuple[float, float] | None:
    """``(wall us per call, GPU us per call)``: ``calls`` calls and one synchronisation, then the kernels'
    own time from the profiler over 50 calls (None in a dry run)."""
    import time

    import torch

    fn()
    if bench.dry:
        return None
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / calls * 1e6
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
    gpu = 0.0
    for e in prof.key_averages():
        gpu += float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0))
    return wall, gpu / 50


def section_host(bench: Bench) -> None:
    """What a decode call costs on the host, against an empty launch of the same arity (the floor)."""
    import torch

    import posenc
    from posenc._torch import plans
    from posenc.functional import rope as R
    from posenc.kernels import triton_launch, triton_rope

    empty3, empty35 = _empty_kernels()
    Hq, Hk, D, P = (4, 2, 64, 64) if bench.dry else (32, 8, 128, 4096)
    cos, sin, cos_hf, sin_hf, _ = _tables(bench, P, D)
    rope = posenc.RotaryEmbedding(D, max_seq_len=P, device=bench.device)
    x = torch.zeros(8, device=bench.device)
    ints = list(range(1, 27))
    floors = [("empty Triton kernel, 3 arguments", lambda: empty3[(1,)](x, x, x)),
              ("empty Triton kernel, 35 arguments (9 pointers, 26 integers)",
               lambda: empty35[(1,)](x, x, x, x, x, x, x, x, x, *ints)),
              ("one aten operator (x.add_(1))", lambda: x.add_(1))]
    for B in (1, 64) if not bench.dry else (1, 3):
        for dtype in _dtypes(bench):
            q = torch.randn(B, 1, Hq, D, device=bench.device, dtype=dtype)         # (B, S=1, H, D)
            k = torch.randn(B, 1, Hk, D, device=bench.device, dtype=dtype)
            v = torch.randn_like(k)
            pos = torch.randint(0, P - 1, (B, 1), device=bench.device)
            lens = pos[:, 0].clone()
            kc = torch.zeros(B, Hk, P, D, device=bench.device, dtype=dtype)
            vc = torch.zeros_like(kc)
            w = torch.rand(D, device=bench.device, dtype=dtype) + 0.5
            rotation = triton_rope.prepare(q, k, cos, sin, pos, 0, "half", 1, False)

            def fallback(q=q, k=k, pos=pos):
                triton_launch.DIRECT = False
                try:
                    return R.apply_rope_qk(q, k, cos, sin, positions=pos, seq_dim=1, engine="triton",
                                           assume_valid=True)
                finally:
                    triton_launch.DIRECT = True

            posenc_rows = [
                ("posenc: the prepared rotation alone (a plan's run)", lambda: rotation(q, k, cos, sin, pos, 0)),
                ("posenc apply_rope_qk, positions promised", lambda: R.apply_rope_qk(
                    q, k, cos, sin, positions=pos, seq_dim=1, engine="triton", assume_valid=True)),
                ("posenc apply_rope_qk, positions checked (one read)", lambda: R.apply_rope_qk(
                    q, k, cos, sin, positions=pos, seq_dim=1, engine="triton")),
                ("posenc apply_rope_qk, offset", lambda: R.apply_rope_qk(q, k, cos, sin, offset=17, seq_dim=1,
                                                                          engine="triton")),
                ("posenc RotaryEmbedding, offset", lambda: rope(q, k, offset=17, seq_dim=1)),
                ("posenc RotaryEmbedding, positions promised", lambda: rope(q, k, positions=pos, seq_dim=1,
                                                                            assume_valid=True)),
                ("posenc rope_and_cache, promised", lambda: posenc.rope_and_cache(
                    q, k, v, kc, vc, cos, sin, cache_seqlens=lens, seq_dim=1, engine="triton", assume_valid=True)),
                ("posenc rms_norm_rope_qk, promised", lambda: posenc.rms_norm_rope_qk(
                    q, k, w, w, cos, sin, positions=pos, seq_dim=1, engine="triton", assume_valid=True)),
                ("posenc apply_rope_qk, positions promised, kernel[grid] fallback (no direct launch)", fallback),
            ]
            peer_rows = [("HF eager (rows gathered per call)",
                          lambda q=q, k=k, pos=pos: _hf(q, k, cos_hf[pos].unsqueeze(2).to(q.dtype),
                                                        sin_hf[pos].unsqueeze(2).to(q.dtype)))]
            hfc = bench.compile("hf_decode", lambda q, k, pos: _hf(q, k, cos_hf[pos].unsqueeze(2).to(q.dtype),
                                                                   sin_hf[pos].unsqueeze(2).to(q.dtype)))
            if hfc is not None:
                peer_rows.append(("HF eager under torch.compile", lambda q=q, k=k, pos=pos: hfc(q, k, pos)))
            liger = bench.peers.get("liger_rope")
            if liger is not None:
                peer_rows.append(("Liger LigerRopeFunction, (B, S, H, D) storage",
                                  lambda q=q, k=k, pos=pos: liger(q.transpose(1, 2), k.transpose(1, 2),
                                                                  cos_hf[pos].to(q.dtype), sin_hf[pos].to(q.dtype))))
            fa, direct = bench.peers.get("flash_attn_rotary"), bench.peers.get("flash_attn_rotary_kernel")
            off = pos.reshape(B).int()
            c_fa, s_fa = cos.to(dtype), sin.to(dtype)
            if fa is not None:
                peer_rows.append(("flash-attention apply_rotary (q then k, in place)", lambda q=q, k=k, off=off: (
                    fa(q, c_fa, s_fa, seqlen_offsets=off, inplace=True), fa(k, c_fa, s_fa, seqlen_offsets=off,
                                                                             inplace=True))))
            if direct is not None:
                peer_rows.append(("flash-attention rotary_kernel launched directly (q then k)",
                                  lambda q=q, k=k, off=off: (direct(q, c_fa, s_fa, off), direct(k, c_fa, s_fa, off))))
            name = str(dtype).replace("torch.", "")
            print(f"\n### Host cost of a decode call: B={B}, {Hq} | {Hk} heads of {D}, {name}\n")
            print("| call | wall us per call | GPU us per call | wall / empty 35-argument launch |")
            print("|---|---:|---:|---:|")
            measured = [(label, _host_cost(bench, fn)) for label, fn in floors + posenc_rows + peer_rows]
            floor = measured[1][1][0] if measured[1][1] is not None else None
            for label, cost in measured:
                if cost is None:
                    print(f"| {label} | (dry run) | | |")
                else:
                    print(f"| {label} | {cost[0]:.1f} | {cost[1]:.1f} | {cost[0] / floor:.2f} |")
            direct_plans = [p for p in plans._plans.values() if getattr(getattr(p.run, "launch", None), "direct", None)]
            print(f"\nposenc plans kept: {len(plans._plans)}; with a direct launch of the compiled kernel: "
                  f"{len(direct_plans)}; this Triton's launch convention matches: {triton_launch.direct_supported()}")
            sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="sections to run")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: run each posenc row once on small CPU tensors under TRITON_INTERPRET=1")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"                       # before Triton decorates any kernel
    global _HF_ROPE
    _HF_ROPE = _transformers_rope()
    import torch

    if importlib.util.find_spec("triton") is None:
        print("gpu_rope: Triton is not installed here; nothing to measure")
        return 0
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_rope: no CUDA device here; nothing to measure (--dry-run checks the rows on CPU)")
        return 0
    import triton

    bench = Bench(args.dry_run)
    where = "CPU, Triton interpreter (dry run: no timings)" if args.dry_run else torch.cuda.get_device_name()
    print(f"device: {where}, torch {torch.__version__}, triton {triton.__version__}; peers: "
          f"{', '.join(sorted(bench.peers)) or 'none importable'}; HF eager rows: "
          f"{'transformers apply_rotary_pos_emb' if _HF_ROPE is not None else 'its formula (transformers absent)'}")
    sections = {"prefill": section_prefill, "backward": lambda b: section_prefill(b, backward=True),
                "decode": section_decode, "varlen": section_varlen, "cache": section_cache,
                "qknorm": section_qknorm, "graph": section_graph, "tokens": section_tokens, "host": section_host}
    failed = []
    for name in args.only:
        try:
            sections[name](bench)
        except Exception as exc:  # noqa: BLE001 - report it, run the other sections, exit non-zero
            import traceback

            failed.append(name)
            print(f"\n**Section {name} failed:** {type(exc).__name__}: {str(exc)[:300]}")
            traceback.print_exc()
    if failed:
        print(f"\ngpu_rope: failed sections: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
