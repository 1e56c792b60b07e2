"""Every Triton kernel compiled for real GPUs, without a GPU.

The interpreter tests (``tests/test_triton_*.py`` under ``TRITON_INTERPRET=1``) check what the
kernels compute; they never run Triton's compiler, so a kernel could pass them and still fail to
compile for a GPU, spill registers to local memory, or read memory a few bytes at a time.  Here
each launcher's own argument builder is run on meta tensors, the arguments are bound the way a
launch on contiguous CUDA tensors binds them (stride-1 arguments become constants, pointers and
integers divisible by 16 are marked so), and ``triton.compile`` builds PTX and a cubin for sm_80
and sm_90 with the ``ptxas`` the Triton wheel ships (and, marked slow, for the newer targets this
Triton knows, one specialization per flag combination).  The compiler runs in a child process,
since this one runs Triton's interpreter on machines without CUDA.  Each specialization must
compile, spill nothing, and move tiles of 512 bytes or more with 128-bit loads and stores.  See
``tests/triton_specs.py`` for the enumeration, and ``scripts/triton_compile_report.py``
for the table in ``docs/gpu.md`` (every target, every specialization).
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

triton = pytest.importorskip("triton")
triton_specs = pytest.importorskip("tests.triton_specs")

from posenc.kernels import triton_cache, triton_norm_rope, triton_rope  # noqa: E402

ARCHS = (80, 90)


@functools.cache
def _covering(kernel: str) -> list:
    return triton_specs.covering(kernel)


@functools.cache
def _flag_cover(kernel: str) -> list:
    """One specialization per flag combination (for the targets compiled in the slow test)."""
    seen, chosen = set(), []
    for spec in _covering(kernel):
        flags = next(item for item in triton_specs._items(spec) if item[0] == "flags")
        if flags not in seen:
            seen.add(flags)
            chosen.append(spec)
    return chosen


def _params():
    for kernel in triton_specs.KERNELS:
        for i, spec in enumerate(_covering(kernel)):
            for arch in ARCHS:
                yield pytest.param(kernel, i, arch, id=f"sm{arch}-{kernel}-{i}-{spec.case.label.replace(' ', '-')}")


@pytest.fixture(scope="session")
def compiler():
    """A child process running Triton's compiler (this one runs its interpreter on CPU machines)."""
    with triton_specs.Compiler() as child:
        yield child


def _check(compiler, spec, arch: int) -> None:
    out = compiler.compile(spec.case, arch)
    where = f"{spec.case.label} [{spec.flags}] on sm_{arch}"
    assert "error" not in out, f"{where} does not compile: {out.get('error')}"
    assert out["spills"] == 0, f"{where}: {out['spills']} bytes of register spills ({out['registers']} registers)"
    assert not out["local"], f"{where}: the PTX uses local memory"
    if triton_specs.tile_bytes(spec) >= 512:
        # a tile that gives every thread 16 bytes: its loads and stores must be 128-bit
        assert max(out["loads"]) == 128, f"{where}: global loads by width in bits {out['loads']}"
        assert max(out["stores"]) == 128, f"{where}: global stores by width in bits {out['stores']}"


@pytest.mark.parametrize(("kernel", "index", "arch"), list(_params()))
def test_compiles_without_spills_and_with_128_bit_accesses(compiler, kernel, index, arch):
    _check(compiler, _covering(kernel)[index], arch)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", triton_specs.KERNELS)
def test_compiles_for_newer_targets(compiler, kernel):
    newer = [a for a in _targets() if a not in ARCHS]
    if not newer:
        pytest.skip("this Triton knows no target newer than sm_90")
    for arch in newer:
        for spec in _flag_cover(kernel):
            _check(compiler, spec, arch)


@functools.cache
def _targets() -> tuple[int, ...]:
    """The targets the compiler child knows: a probe compile for each newer one."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "from tests.triton_specs import targets; print(*targets())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return tuple(int(a) for a in out.stdout.split())


# ---- the enumeration itself ------------------------------------------------------------------------

@pytest.mark.parametrize(("kernel", "combinations"), [
    ("rope", 4 * 2 * 2 * 2),      # (none, HAS_POS, HAS_CU, HAS_CU + HAS_SOFF) x HAS_K x INTERLEAVED x CONJ
    ("cache", (4 + 2) * 2),       # (contiguous: HAS_POS x COPY_Q; paged: COPY_Q) x INTERLEAVED
    ("norm_fwd", 2 * 2 * 6),      # HAS_POS x INTERLEAVED x (q alone: Q_TOKEN; q and k: Q_TOKEN x K_TOKEN)
    ("norm_bwd", 2 * 2 * 6),
])
def test_the_cover_reaches_every_flag_combination(kernel, combinations):
    flags = {next(i for i in triton_specs._items(s) if i[0] == "flags") for s in _covering(kernel)}
    assert len(flags) == combinations


def test_heuristics_reach_every_head_count_from_1_to_64():
    """The enumerated head counts produce every BLOCK_H and tokens per program that any head count
    from 1 to 64 would (so the cover misses no value the heuristics can pick)."""
    for d in triton_specs.HEAD_DIMS:
        h2 = d // 2
        for S in (1, 64):
            every = {(triton_rope.tokens_per_program(hq + hk, h2, 4 * S),
                      min(triton.next_power_of_2(max(hq, hk)), 4096 // triton.next_power_of_2(h2)))
                     for hq in range(1, 65) for hk in range(1, hq + 1) if hq % hk == 0}
            enumerated = {(triton_rope.tokens_per_program(hq + hk, h2, 4 * S),
                           min(triton.next_power_of_2(max(hq, hk)), 4096 // triton.next_power_of_2(h2)))
                          for hq, hk in triton_specs.HEADS}
            assert enumerated == every, (d, S, every - enumerated)


def test_meta_tensors_bind_like_fresh_tensors():
    """Meta tensors (data pointer 0) bind to the same specialization as freshly allocated ones, and a
    contiguous launch specialises the unit strides as constants and marks pointers 16-byte aligned."""
    case = triton_specs.Case("rope", torch.bfloat16, "half", 1, 128, 8, 2, "pos2d")
    meta = triton_specs.specialize(case)
    q = torch.empty(case.B, case.S, case.hq, case.head_dim, dtype=case.dtype)
    k = torch.empty(case.B, case.S, case.hk, case.head_dim, dtype=case.dtype)
    cos, sin = torch.empty(4096, 64), torch.empty(4096, 64)
    positions = torch.empty(case.B, case.S, dtype=torch.int64)
    grid, args, kw = triton_rope.launch_args(q, k, q, k, cos, sin, positions, 0, False, 1, False)
    fn = triton_specs._jit(triton_rope._rope_qk_kernel)
    backend, binder = triton_specs._binder(fn, 90)
    bound, spec, opts = binder(*args, **kw)
    _, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, spec, opts)
    assert (signature, constexprs, attrs) == (meta.signature, meta.constexprs, meta.attrs)
    names = fn.arg_names
    assert all(signature[n] == "constexpr" for n in ("sq_d", "sk_d", "so_d", "sko_d", "st_col"))
    assert attrs[(names.index("q_ptr"),)] == [["tt.divisibility", 16]]
    assert grid == meta.grid


@pytest.mark.parametrize("kernel", triton_specs.KERNELS)
def test_the_launch_passes_what_launch_args_builds(kernel, monkeypatch):
    """The real launch goes through the same argument builder the compile tests use."""
    calls = []

    class Spy:
        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, args, kw))

    c = triton_specs.Case(kernel, torch.float32, "half", 1, 64, 4, 2, "arange", B=1, S=3)
    fn, grid, args, meta = triton_specs.launch_of(c)
    module = {"rope": triton_rope, "cache": triton_cache}.get(kernel, triton_norm_rope)
    monkeypatch.setattr(module, fn.__name__, Spy())
    if kernel == "rope":
        q, k = torch.zeros(1, 3, 4, 64), torch.zeros(1, 3, 2, 64)
        cos = torch.zeros(4096, 32)
        triton_rope.launch(q, k, q, k, cos, cos, None, 0, False, 1, False)
        expected = triton_rope.launch_args(q, k, q, k, cos, cos, None, 0, False, 1, False)
    elif kernel == "cache":
        q, k, v = torch.zeros(1, 3, 4, 64), torch.zeros(1, 3, 2, 64), torch.zeros(1, 3, 2, 64)
        kc, vc, cos = torch.zeros(1, 2, 16, 64), torch.zeros(1, 2, 16, 64), torch.zeros(4096, 32)
        index = torch.zeros(1, dtype=torch.int32)
        triton_cache.launch(q, k, v, q, kc, vc, cos, cos, index, None, False, False, 1)
        expected = triton_cache.launch_args(q, k, v, q, kc, vc, cos, cos, index, None, False, False, 1)
    else:
        q, k, w = torch.zeros(1, 3, 4, 64), torch.zeros(1, 3, 2, 64), torch.zeros(64)
        cos = torch.zeros(4096, 32)
        if kernel == "norm_fwd":
            triton_norm_rope.launch_forward(q, k, w, w, q, k, cos, cos, None, 0, 1e-6, 0.0, False, 1)
            expected = triton_norm_rope.forward_args(q, k, w, w, q, k, cos, cos, None, 0, 1e-6, 0.0, False, 1)
        else:
            dw = torch.zeros(3, 64)
            triton_norm_rope.launch_backward(q, k, q, k, w, w, q, k, dw, dw, cos, cos, None, 0, 1e-6, 0.0, False, 1)
            expected = triton_norm_rope.backward_args(q, k, q, k, w, w, q, k, dw, dw, cos, cos, None, 0, 1e-6, 0.0,
                                                      False, 1)
    assert len(calls) == 1
    (grid, args, kw), (egrid, eargs, ekw) = calls[0], expected
    assert grid == egrid and kw == ekw
    assert all(a is b if isinstance(a, torch.Tensor) else a == b for a, b in zip(args, eargs, strict=True))

