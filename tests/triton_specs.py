"""The specializations the Triton launchers emit, compiled for real GPUs without one.

A Triton kernel is compiled once per *specialization*: the dtypes of its pointers, its constexprs
(flags and block sizes), ``num_warps``, and what the JIT infers from the argument values at launch
time (an integer equal to 1 becomes a constant, pointers and integers divisible by 16 are marked
so, which is what lets the compiler emit 128-bit loads).  The interpreter (``TRITON_INTERPRET=1``)
runs none of that, so this module rebuilds, without a GPU, the exact specializations a launch on
contiguous tensors gets:

1. :func:`cases` enumerates launches (dtypes, layouts, every flag combination, the head dims and
   head counts of real models) as *meta* tensors, which have shapes, strides and dtypes but no data;
2. each launcher's own ``*_args`` function turns a case into ``(grid, args, meta)``, the very
   arguments the real launch passes to the kernel;
3. :func:`specialize` binds them the way ``JITFunction.run`` does (Triton's own binder, with the
   CUDA backend of the chosen target), giving ``signature``, ``constexprs`` and ``attrs``;
4. :func:`compile_spec` runs ``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))``
   to PTX and cubin (the Triton wheel ships ``ptxas``) and reads registers, spills and the widths
   of the global loads and stores.

Meta tensors report a data pointer of 0, so every pointer counts as 16-byte aligned, as fresh
CUDA allocations are (the caching allocator aligns blocks to 512 bytes).

Test tooling, kept out of the installed package.  Used by ``tests/test_triton_compile.py``,
``tests/test_host_path.py`` and ``scripts/triton_compile_report.py``; it relies on
Triton's binder (``triton.runtime.jit.create_function_from_signature``), checked with Triton 3.x.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import re
import tempfile
from collections.abc import Iterator

import torch
import triton

from posenc.kernels import triton_cache, triton_norm_rope, triton_rope

__all__ = ["Case", "Compiled", "Compiler", "Spec", "cases", "compile_spec", "covering", "specialize", "targets"]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
HEAD_DIMS = (64, 80, 96, 128, 256)
# (query heads, key heads) of real models: MHA, GQA and MQA (completed below to every head count's blocks)
MODEL_HEADS = ((1, 1), (4, 4), (8, 1), (8, 8), (12, 12), (16, 2), (16, 16), (24, 8), (32, 8), (32, 32), (40, 8),
               (48, 8), (64, 8), (64, 64))


def _head_items(hq: int, hk: int) -> set:
    """What a head count decides: per head dim and query length, the RoPE launcher's tokens per
    program and heads per block; the power of two above the head count (every launcher's blocks
    follow it); and whether a count is 1 (the JIT then compiles it as a constant)."""
    items: set = {("np2", triton.next_power_of_2(max(hq, hk))), ("hq=1", hq == 1), ("hk=1", hk == 1)}
    for d, S in itertools.product(HEAD_DIMS, (1, 64)):
        h2 = d // 2
        block_h = min(triton.next_power_of_2(max(hq, hk)), 4096 // triton.next_power_of_2(h2))
        items.add((d, S, triton_rope.tokens_per_program(hq + hk, h2, 4 * S), block_h))
    return items


def _heads() -> tuple[tuple[int, int], ...]:
    """:data:`MODEL_HEADS` and as few more ``(hq, hk)`` (1 to 64 heads, ``hk`` dividing ``hq``) as reach
    every item :func:`_head_items` of any head count gives."""
    every = [(hq, hk) for hq in range(1, 65) for hk in range(1, hq + 1) if hq % hk == 0]
    todo = set().union(*(_head_items(*p) for p in every)) - set().union(*(_head_items(*p) for p in MODEL_HEADS))
    chosen = list(MODEL_HEADS)
    while todo:
        best = max(every, key=lambda p: len(_head_items(*p) & todo))
        chosen.append(best)
        todo -= _head_items(*best)
    return tuple(chosen)


HEADS = _heads()
META = torch.device("meta")


@dataclasses.dataclass(frozen=True)
class Case:
    """One launch: ``kernel`` is ``"rope"``, ``"cache"``, ``"norm_fwd"`` or ``"norm_bwd"``; ``mode``
    names the flags (see :func:`cases`); ``S`` is the query length (1: a decode step)."""

    kernel: str
    dtype: torch.dtype
    layout: str                  # "half" or "interleaved"
    seq_dim: int                 # 2: (B, H, S, D); 1: (B, S, H, D)
    head_dim: int
    hq: int
    hk: int
    mode: str
    B: int = 2
    S: int = 64

    @property
    def label(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        shape = "BHSD" if self.seq_dim == 2 else "BSHD"
        return (f"{self.kernel} {dt} {self.layout} {shape} D={self.head_dim} H={self.hq}/{self.hk} "
                f"{self.mode} B={self.B} S={self.S}")


@dataclasses.dataclass
class Spec:
    """A bound specialization: what ``triton.compile`` needs, plus the case that produced it."""

    case: Case
    fn: triton.runtime.jit.JITFunction
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict
    grid: tuple

    def key(self) -> tuple:
        """Two cases with the same key compile to the same binary."""
        return (self.fn.__name__, tuple(self.signature.items()), tuple(sorted(self.constexprs.items())),
                tuple(sorted((k, str(v)) for k, v in self.attrs.items())), tuple(sorted(self.options.items())))

    @property
    def flags(self) -> str:
        """The constexprs by name (``BLOCK_H=8 ...``), and the integer arguments equal to 1."""
        names = self.fn.arg_names
        by_name = {names[k[0]]: v for k, v in self.constexprs.items()}
        ones = sorted(n for n, v in by_name.items() if self.signature[n] == "constexpr" and not n.isupper())
        flags = " ".join(f"{n}={int(v) if isinstance(v, bool) else v}" for n, v in by_name.items() if n.isupper())
        return flags + (f" ({','.join(ones)}=1)" if ones else "") + f" warps={self.options['num_warps']}"


@dataclasses.dataclass
class Compiled:
    """What the compiler made of one specialization for one target."""

    spec: Spec
    arch: int
    registers: int
    spills: int                  # bytes of spill stores + spill loads (ptxas)
    local: bool                  # the PTX declares or touches local memory
    loads: dict                  # width in bits -> number of global load instructions
    stores: dict                 # width in bits -> number of global store instructions
    ptx: str

    @property
    def max_load(self) -> int:
        return max(self.loads, default=0)

    @property
    def max_store(self) -> int:
        return max(self.stores, default=0)


# ---- launches -------------------------------------------------------------------------------------

def _qkv(c: Case, heads: int, S: int | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    S = c.S if S is None else S
    shape = (c.B, heads, S, c.head_dim) if c.seq_dim == 2 else (c.B, S, heads, c.head_dim)
    return torch.empty(shape, dtype=dtype or c.dtype, device=META)


def _tables(c: Case, rows: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    h2 = c.head_dim // 2 if "partial" not in c.mode else c.head_dim // 4
    return torch.empty(rows, h2, device=META), torch.empty(rows, h2, device=META)


def _positions(c: Case) -> torch.Tensor | None:
    if "pos1d" in c.mode:
        return torch.empty(c.S, dtype=torch.int64, device=META)
    if "pos2d" in c.mode:
        return torch.empty(c.B, c.S, dtype=torch.int64, device=META)
    return None


def launch_of(c: Case) -> tuple:
    """``(kernel, grid, args, meta)`` of case ``c``, from the launcher's own argument builder."""
    interleaved = c.layout == "interleaved"
    cos, sin = _tables(c)
    positions = _positions(c)
    if c.kernel == "rope":
        varlen = "varlen" in c.mode                    # packed (1, T, H, D) with cu_seqlens
        q = _qkv(dataclasses.replace(c, B=1) if varlen else c, c.hq)
        k = _qkv(dataclasses.replace(c, B=1) if varlen else c, c.hk) if "nok" not in c.mode else None
        cu = torch.empty(9, dtype=torch.int32, device=META) if varlen else None
        offset = torch.empty(8, dtype=torch.int32, device=META) if "seqoff" in c.mode else 0
        grid, args, meta = triton_rope.launch_args(q, k, q, k, cos, sin, positions, offset, interleaved,
                                                   c.seq_dim, "conj" in c.mode, cu)
        return triton_rope._rope_qk_kernel, grid, args, meta
    if c.kernel == "cache":
        paged = "paged" in c.mode
        if paged:                                      # q, k, v (T, H, D); cache (blocks, block size, Hk, D)
            T = c.B * c.S
            q, k, v = (torch.empty(T, h, c.head_dim, dtype=c.dtype, device=META) for h in (c.hq, c.hk, c.hk))
            kc = torch.empty(64, 16, c.hk, c.head_dim, dtype=c.dtype, device=META)
            index = torch.empty(T, dtype=torch.int32, device=META)
            positions = torch.empty(T, dtype=torch.int64, device=META)
            seq_dim = 1
        else:                                          # cache (B, Hk, S_max, D)
            q, k, v = _qkv(c, c.hq), _qkv(c, c.hk), _qkv(c, c.hk)
            kc = torch.empty(c.B, c.hk, 4096, c.head_dim, dtype=c.dtype, device=META)
            index = torch.empty(c.B, dtype=torch.int32, device=META)
            seq_dim = c.seq_dim
        qo = torch.empty_like(q) if "newq" in c.mode else q
        grid, args, meta = triton_cache.launch_args(q, k, v, qo, kc, torch.empty_like(kc), cos, sin, index,
                                                    positions, paged, interleaved, seq_dim)
        return triton_cache._rope_cache_kernel, grid, args, meta
    q = _qkv(c, c.hq)
    k = _qkv(c, c.hk) if "nok" not in c.mode else None
    wq = torch.empty(c.hq * c.head_dim if "qtoken" in c.mode else c.head_dim, dtype=c.dtype, device=META)
    wk = (torch.empty(c.hk * c.head_dim if "ktoken" in c.mode else c.head_dim, dtype=c.dtype, device=META)
          if k is not None else None)
    if c.kernel == "norm_fwd":
        grid, args, meta = triton_norm_rope.forward_args(q, k, wq, wk, torch.empty_like(q),
                                                         torch.empty_like(k) if k is not None else q.new_empty(0),
                                                         cos, sin, positions, 0, 1e-6, 0.0, interleaved, c.seq_dim)
        return triton_norm_rope._norm_rope_qk_kernel, grid, args, meta
    rows = c.B * c.S
    dwq = torch.empty(rows, wq.shape[0], device=META)
    dwk = torch.empty(rows, wk.shape[0], device=META) if wk is not None else dwq.new_empty(0)
    grid, args, meta = triton_norm_rope.backward_args(
        torch.empty_like(q), torch.empty_like(k) if k is not None else None, q, k, wq, wk, torch.empty_like(q),
        torch.empty_like(k) if k is not None else q.new_empty(0), dwq, dwk, cos, sin, positions, 0, 1e-6, 0.0,
        interleaved, c.seq_dim)
    return triton_norm_rope._norm_rope_qk_bwd_kernel, grid, args, meta


# ---- enumeration -----------------------------------------------------------------------------------

# every combination of each kernel's boolean constexprs, as the case modes that produce it
_FLAG_MODES = {
    # HAS_POS / HAS_CU / HAS_SOFF x HAS_K x CONJ (INTERLEAVED comes from the layout)
    "rope": [f"{idx}{k}{conj}" for idx in ("arange", "pos1d", "pos2d", "varlen", "varlen-seqoff")
             for k in ("", "-nok") for conj in ("", "-conj")],
    # PAGED x HAS_POS x COPY_Q (a new q with pass-through features: partial rotary)
    "cache": [f"{where}{q}" for where in ("contig", "contig-pos2d", "paged")
              for q in ("", "-newq", "-newq-partial")],
    # HAS_POS x HAS_K x Q_TOKEN x K_TOKEN, and pass-through features (BLOCK_R > 1)
    "norm_fwd": [f"{p}{k}{t}" for p in ("arange", "pos2d") for k, t in
                 (("-nok", ""), ("-nok", "-qtoken"), ("", ""), ("", "-qtoken"), ("", "-ktoken"),
                  ("", "-qtoken-ktoken"))] + ["arange-partial", "pos1d-partial-qtoken"],
}
_FLAG_MODES["norm_bwd"] = _FLAG_MODES["norm_fwd"]
KERNELS = tuple(_FLAG_MODES)


def cases(kernel: str, *, full: bool = False) -> Iterator[Case]:
    """The launches to compile for ``kernel``.

    Two sweeps that together reach every specialization the launcher can emit for contiguous
    tensors: every flag combination (both layouts, both q/k layouts, each dtype; with ``full``,
    every dtype for every combination, else the dtypes taken in turn), and every block size,
    tokens-per-program and warp count the heuristics pick for head dims 64 to 256 and 1 to 64
    heads, prefill (``S=64``) and decode (``S=1``), in every dtype and both layouts.
    """
    for i, (mode, layout, seq_dim) in enumerate(itertools.product(_FLAG_MODES[kernel], ("half", "interleaved"),
                                                                  (2, 1))):
        if seq_dim == 2 and ("varlen" in mode or "paged" in mode):
            continue                                   # packed and paged tensors are (T, H, D)
        for dtype in (DTYPES if full else (DTYPES[i % 3],)):
            yield Case(kernel, dtype, layout, seq_dim, 128, 8, 2, mode, S=17 if i % 4 == 3 else 64)
    base = {"rope": "arange", "cache": "contig", "norm_fwd": "arange", "norm_bwd": "arange"}[kernel]
    for dtype, layout, d, (hq, hk), S in itertools.product(DTYPES, ("half", "interleaved"), HEAD_DIMS, HEADS,
                                                           (64, 1)):
        mode = base if kernel != "cache" or S == 1 else "contig-pos2d"
        yield Case(kernel, dtype, layout, 1, d, hq, hk, mode, B=4, S=S)


def targets() -> list[int]:
    """Compute capabilities to compile for: 80 and 90, and the newer ones this Triton and its ptxas
    know (100, 120), found by compiling a one-line kernel."""
    found = [80, 90]
    for arch in (100, 120):
        try:
            triton.compile(triton.compiler.ASTSource(_probe, {"x": "*fp32"}, {}, {}),
                           target=triton.backends.compiler.GPUTarget("cuda", arch, 32))
        except Exception:                              # this Triton or its ptxas does not know the target
            continue
        found.append(arch)
    return found


@triton.jit
def _probe(x):
    triton.language.store(x, 1.0)


# ---- binding and compiling ------------------------------------------------------------------------

_BINDERS: dict[tuple[int, int], tuple] = {}
_OPTIONS = ("num_warps", "num_stages", "maxnreg")            # the compile options a launcher may set


def _binder(fn, arch: int):
    """The CUDA backend of ``sm_<arch>`` and ``fn``'s argument binder, as ``JITFunction.create_binder``
    makes them (without asking a driver for the target).  Cached by identity: hashing a
    ``JITFunction`` walks its dependencies."""
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    key = (id(fn), arch)
    if key not in _BINDERS:
        backend = make_backend(triton.backends.compiler.GPUTarget("cuda", arch, 32))
        _BINDERS[key] = (backend, create_function_from_signature(fn.signature, fn.params, backend), fn)
    return _BINDERS[key][:2]


def specialize(c: Case, arch: int = 90) -> Spec:
    """Bind case ``c`` as ``JITFunction.run`` would on a GPU of compute capability ``arch``."""
    fn, grid, args, meta = launch_of(c)
    fn = _jit(fn)
    backend, binder = _binder(fn, arch)
    kwargs = dict(meta)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return Spec(c, fn, signature, constexprs, attrs, {k: meta[k] for k in _OPTIONS if k in meta}, grid)


_JITS: dict[int, object] = {}


def _jit(fn):
    """``fn`` as a ``JITFunction``: under ``TRITON_INTERPRET=1`` the kernels are interpreted functions,
    whose arguments bind the same way but which cannot be compiled (see :class:`Compiler`)."""
    from triton.runtime.jit import JITFunction

    if isinstance(fn, JITFunction):
        return fn
    if id(fn) not in _JITS:
        kwargs = {k: v for k, v in fn.kwargs.items() if k in ("do_not_specialize", "do_not_specialize_on_alignment")}
        _JITS[id(fn)] = (JITFunction(fn.fn, **kwargs), fn)      # (the interpreted function kept alive: its id is the key)
    return _JITS[id(fn)][0]


_ACCESS = re.compile(r"^\s*(?:@%p\d+\s+)?(ld|st)\.global((?:\.\w+)*)\s", re.M)
_BITS = {"b8": 8, "u8": 8, "s8": 8, "b16": 16, "u16": 16, "s16": 16, "f16": 16, "bf16": 16, "b32": 32, "u32": 32,
         "s32": 32, "f32": 32, "b64": 64, "u64": 64, "s64": 64, "f64": 64, "b128": 128}


def _widths(ptx: str) -> tuple[dict, dict]:
    """Global loads and stores by width in bits (``ld.global.v4.b32`` is 128)."""
    found: dict[str, dict[int, int]] = {"ld": {}, "st": {}}
    for op, suffix in _ACCESS.findall(ptx):
        parts = suffix.strip(".").split(".")
        lanes = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d", p)), 1)
        bits = next((_BITS[p] for p in reversed(parts) if p in _BITS), 0)
        found[op][lanes * bits] = found[op].get(lanes * bits, 0) + 1
    return found["ld"], found["st"]


@contextlib.contextmanager
def _fresh_compiler() -> Iterator[io.StringIO]:
    """Compile every kernel anew (nothing cached across runs, nor reused from a cache directory)
    with ptxas's ``-v`` report captured."""
    knobs = triton.knobs
    saved = (knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log, knobs.cache.dir)
    log = io.StringIO()
    with tempfile.TemporaryDirectory() as cache_dir:
        knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log, knobs.cache.dir = True, True, cache_dir
        try:
            with contextlib.redirect_stdout(log):
                yield log
        finally:
            knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log, knobs.cache.dir = saved


def compile_spec(spec: Spec, arch: int) -> Compiled:
    """Compile ``spec`` for ``sm_<arch>`` (no GPU needed) and read registers, spills and access widths.

    Needs the compiler: in a process running under ``TRITON_INTERPRET=1`` use :class:`Compiler`."""
    if triton.knobs.runtime.interpret:
        raise RuntimeError("Triton runs interpreted here (TRITON_INTERPRET=1): compile through Compiler()")
    with _fresh_compiler() as log:
        kernel = triton.compile(triton.compiler.ASTSource(spec.fn, spec.signature, spec.constexprs, spec.attrs),
                                target=triton.backends.compiler.GPUTarget("cuda", arch, 32),
                                options=dict(spec.options))
    text = log.getvalue()
    regs = [int(m) for m in re.findall(r"Used (\d+) registers", text)]
    spills = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)]
    if not regs or not spills:
        raise RuntimeError(f"no ptxas report for {spec.case.label} on sm_{arch}:\n{text}")
    ptx = kernel.asm["ptx"]
    loads, stores = _widths(ptx)
    local = bool(re.search(r"\.local\b", ptx))
    return Compiled(spec, arch, max(regs), max(spills), local, loads, stores, ptx)


# ---- a compact set that covers them all ------------------------------------------------------------

def tile_bytes(spec: Spec) -> int:
    """Bytes of the narrowest full-width tile the kernel loads and stores (one operand's heads of one
    token): 128-bit accesses need 16 of them per thread, 512 per warp."""
    cx = {spec.fn.arg_names[k[0]]: v for k, v in spec.constexprs.items()}
    tile = cx["BLOCK_H"] * cx["BLOCK_D"] * (2 if cx["INTERLEAVED"] else 1)
    if "BLOCK_HC" in cx:
        tile = min(tile, cx["BLOCK_HC"] * cx["BLOCK_C"])
    return tile * spec.case.dtype.itemsize


def _items(spec: Spec) -> set:
    """What a specialization exercises: its flag combination; per layout, each value of each block
    size, tokens per program, head dim and argument specialised to 1; per dtype and layout, each
    warp count and whether the rotary half-width is a multiple of 16 (what decides the vector width
    of each access)."""
    names = spec.fn.arg_names
    cx = {names[k[0]]: v for k, v in spec.constexprs.items()}
    flags = tuple(sorted((n, v) for n, v in cx.items() if isinstance(v, bool)))
    layout, dtype = cx["INTERLEAVED"], spec.case.dtype
    items = {("flags", flags)} | {(layout, n, v) for n, v in cx.items() if not isinstance(v, bool)}
    return items | {(dtype, layout, "warps", spec.options["num_warps"]), (dtype, layout, "H2 % 16", cx["H2"] % 16)}


def covering(kernel: str) -> list[Spec]:
    """A small set of specializations of ``kernel`` that together exercise every item (see
    :func:`_items`) that the specializations :func:`cases` enumerates do: a greedy set cover over
    the distinct specializations."""
    distinct: dict[tuple, Spec] = {}
    for c in cases(kernel):
        spec = specialize(c)
        distinct.setdefault(spec.key(), spec)
    specs = list(distinct.values())
    todo = set().union(*(_items(s) for s in specs))
    chosen = []
    while todo:
        best = max(specs, key=lambda s: len(_items(s) & todo))
        chosen.append(best)
        todo -= _items(best)
    return chosen


# ---- compiling from an interpreted process -----------------------------------------------------------

def _case_json(c: Case) -> dict:
    return {**dataclasses.asdict(c), "dtype": str(c.dtype).removeprefix("torch.")}


def _summary(out: Compiled) -> dict:
    return {"registers": out.registers, "spills": out.spills, "local": out.local,
            "loads": {str(k): v for k, v in out.loads.items()}, "stores": {str(k): v for k, v in out.stores.items()}}


class Compiler:
    """Compiles cases in a child Python process that runs Triton's compiler, not its interpreter.

    The test suite runs the kernels under ``TRITON_INTERPRET=1``, which Triton reads once, at import:
    its kernels are then interpreted functions that cannot be compiled.  The child starts once
    (``with Compiler() as compiler:``) and answers :meth:`compile` requests one JSON line each.
    """

    def __enter__(self) -> Compiler:
        import os
        import subprocess
        import sys

        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))          # the repository
        self._child = subprocess.Popen([sys.executable, "-m", "tests.triton_specs"], env=env, text=True, cwd=root,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return self

    def __exit__(self, *exc) -> None:
        assert self._child.stdin is not None
        self._child.stdin.close()
        self._child.wait(timeout=60)

    def compile(self, c: Case, arch: int) -> dict:
        """``registers``, ``spills``, ``local``, ``loads`` and ``stores`` (width in bits -> count) of
        case ``c`` compiled for ``sm_<arch>``, or ``error``: the compiler's message."""
        import json

        assert self._child.stdin is not None and self._child.stdout is not None
        self._child.stdin.write(json.dumps({"case": _case_json(c), "arch": arch}) + "\n")
        self._child.stdin.flush()
        line = self._child.stdout.readline()
        if not line:
            raise RuntimeError(f"the compiler process exited (code {self._child.poll()})")
        out = json.loads(line)
        for key in ("loads", "stores"):
            if key in out:
                out[key] = {int(k): v for k, v in out[key].items()}
        return out


def _serve() -> None:
    """The child of :class:`Compiler`: one JSON request per line on stdin, one JSON answer per line."""
    import json
    import sys

    answer = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        fields = dict(request["case"])
        fields["dtype"] = getattr(torch, fields["dtype"])
        try:
            result = _summary(compile_spec(specialize(Case(**fields)), request["arch"]))
        except Exception as exc:                       # the compiler's own error, returned to the caller
            result = {"error": f"{type(exc).__name__}: {exc}"}
        answer.write(json.dumps(result) + "\n")
        answer.flush()


if __name__ == "__main__":
    _serve()
