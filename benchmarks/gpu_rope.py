"""RoPE on a CUDA GPU: posenc's fused Triton kernel against the memory limit and the peers.

    python benchmarks/gpu_rope.py

For q and k of shape (4, 32, 4096, 128) and (1, 32, 32768, 128), in bfloat16 and float32, prints the
time (``triton.testing.do_bench``), the achieved bandwidth (q and k read once and written once) and
the ratio to a device copy of q and k into preallocated buffers, for: posenc in place and out of
place (both layouts), a Hugging Face-style eager ``q * cos + rotate_half(q) * sin``, the same under
``torch.compile``, and Liger-Kernel's RoPE when importable.  Each row also reports the largest
difference of the rotated q from a float32 torch reference.  Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import importlib.util
import sys

import torch


def bench_case(shape, dtype, hf, hf_compiled, liger) -> None:
    """Print the rows of one (shape, dtype)."""
    import triton.testing

    from posenc.functional import rope as R

    B, H, S, D = shape
    inv, _ = R.rope_inv_freq(D)
    cos_t, sin_t = R.rope_cos_sin(torch.arange(S), inv)
    cos_t, sin_t = cos_t.cuda(), sin_t.cuda()                               # (S, D/2) exact float32 tables
    q = torch.randn(shape, device="cuda", dtype=dtype)
    k = torch.randn(shape, device="cuda", dtype=dtype)
    qb, kb = torch.empty_like(q), torch.empty_like(k)
    nbytes = 2 * 2 * q.numel() * q.element_size()                          # q and k, read and written
    ref = {lay: R.apply_rope_qk(q.float(), None, cos_t, sin_t, layout=lay, backend="torch")[0]
           for lay in ("half", "interleaved")}
    cos_hf = torch.cat([cos_t, cos_t], -1)[None, None].to(dtype)            # (1, 1, S, D), HF-style
    sin_hf = torch.cat([sin_t, sin_t], -1)[None, None].to(dtype)
    rows = [("device copy of q and k (the limit)", lambda: (qb.copy_(q), kb.copy_(k)), None)]
    for layout in ("half", "interleaved"):
        qi, ki = q.clone(), k.clone()
        check = (R.apply_rope_qk(q, k, cos_t, sin_t, layout=layout, backend="triton")[0], ref[layout])
        rows.append((f"posenc triton {layout}, inplace=True",
                     lambda qi=qi, ki=ki, layout=layout: R.apply_rope_qk(qi, ki, cos_t, sin_t, layout=layout,
                                                                         inplace=True, backend="triton"), check))
        rows.append((f"posenc triton {layout}",
                     lambda layout=layout: R.apply_rope_qk(q, k, cos_t, sin_t, layout=layout, backend="triton"), None))
    rows.append(("Hugging Face eager (q*cos + rotate_half(q)*sin)", lambda: hf(q, k, cos_hf, sin_hf),
                 (hf(q, k, cos_hf, sin_hf)[0], ref["half"])))
    rows.append(("Hugging Face eager under torch.compile", lambda: hf_compiled(q, k, cos_hf, sin_hf),
                 (hf_compiled(q, k, cos_hf, sin_hf)[0], ref["half"])))
    if liger is not None:
        cos_l, sin_l = cos_hf[0], sin_hf[0]                                  # (1, S, D)
        try:
            out_l = liger(q.clone(), k.clone(), cos_l, sin_l)[0]
            rows.append(("Liger-Kernel LigerRopeFunction", lambda: liger(q, k, cos_l, sin_l), (out_l, ref["half"])))
        except Exception as exc:  # noqa: BLE001
            print(f"| Liger-Kernel | {dtype} | {shape} | failed: {type(exc).__name__}: {exc} | | | |")
    ms_copy = None
    name = str(dtype).replace("torch.", "")
    for label, fn, check in rows:
        ms = triton.testing.do_bench(fn)
        ms_copy = ms if ms_copy is None else ms_copy
        diff = "" if check is None else f"{(check[0].float() - check[1]).abs().max().item():.1e}"
        print(f"| {label} | {name} | {tuple(shape)} | {ms:.3f} | {nbytes / ms / 1e6:.0f} | {ms_copy / ms:.2f} | {diff} |",
              flush=True)


def main() -> int:
    if not torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        print("gpu_rope: no CUDA device (or no Triton) here; nothing to measure")
        return 0
    import triton

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print()
    print("| implementation | dtype | shape | ms | GB/s | x copy bandwidth | max diff vs fp32 reference |")
    print("|---|---|---|---:|---:|---:|---:|")

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def hf(q, k, cos, sin):
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    hf_compiled = torch.compile(hf)
    liger = None
    if importlib.util.find_spec("liger_kernel"):
        try:
            from liger_kernel.ops.rope import LigerRopeFunction
            liger = LigerRopeFunction.apply
        except Exception as exc:  # noqa: BLE001 - report and go on without it
            print(f"(Liger-Kernel not usable: {type(exc).__name__}: {exc})")

    for shape in ((4, 32, 4096, 128), (1, 32, 32768, 128)):
        for dtype in (torch.bfloat16, torch.float32):
            bench_case(shape, dtype, hf, hf_compiled, liger)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
