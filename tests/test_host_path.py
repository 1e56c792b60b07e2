"""The host path of the Triton engines, counted on CPU under Triton's interpreter.

On a GPU a decode-sized rotation takes a few microseconds; what a call costs is its Python.  These
tests count, for eager calls that take the Triton engine (CPU tensors under ``TRITON_INTERPRET=1``),
what runs *outside* the kernel launch (whatever Triton runs beneath ``kernel[grid]`` is left out: the
interpreter executes the kernel there):

- calls of posenc's own Python functions (``sys.setprofile``);
- frames of torch's custom-op machinery (``torch._library``, ``torch._ops``), which an eager call must
  not enter (the custom ops exist for tracing);
- aten operators (a ``TorchDispatchMode``): only the outputs' allocations and views of the inputs;
- kernel launches: one per call, one per direction of a forward + backward.

The direct launch of a compiled kernel (no binder) needs a GPU; its argument layout is checked here
against Triton's own binder, and the fallback to ``kernel[grid](...)`` is what runs on CPU.
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")   # before Triton decorates the kernels

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

triton = pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")

import posenc  # noqa: E402
from posenc._torch import plans  # noqa: E402
from posenc.functional import apply_rope_qk, rms_norm_rope_qk, rope_cos_sin, rope_inv_freq  # noqa: E402
from posenc.kernels import triton_launch, triton_rope  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("TRITON_INTERPRET was set to something other than 1 before this module", allow_module_level=True)

POSENC = str(pathlib.Path(posenc.__file__).parent)
TRITON = str(pathlib.Path(triton.__file__).parent)
TORCH = str(pathlib.Path(torch.__file__).parent)
CUSTOM_OP_MACHINERY = (os.path.join(TORCH, "_library"), os.path.join(TORCH, "_ops.py"))
FALLBACK = triton_launch.Launch.fallback.__code__

#: aten operators an eager call may run outside its launch: the outputs' allocations and views
ALLOWED_OPS = {"empty_like", "empty", "empty_strided", "slice", "select", "view", "unsqueeze", "alias", "as_strided",
               "expand", "squeeze", "t", "transpose", "permute", "unbind", "split", "split_with_sizes", "detach"}


class Counts:
    """What ``fn()`` runs outside Triton's launches (see the module docstring)."""

    def __init__(self, fn, *, ops: bool = True):
        self.calls: list[str] = []
        self.machinery: list[str] = []
        self.launches = 0
        self.ops: list[tuple[str, tuple]] = []
        self._root = None                                   # the outermost Triton frame running, if any
        self._dispatching = False
        counts = self

        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counts._dispatching = True
                try:
                    if counts._root is None:
                        out = func(*args, **(kwargs or {}))
                        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
                        counts.ops.append((func.overloadpacket.__name__, shapes))
                        return out
                    return func(*args, **(kwargs or {}))
                finally:
                    counts._dispatching = False

        sys.setprofile(self._profile)
        try:
            if ops:
                with Ops():
                    self.out = fn()
            else:
                self.out = fn()
        finally:
            sys.setprofile(None)

    def _profile(self, frame, event, arg):
        if event == "return" and frame is self._root:
            self._root = None
            return
        if event != "call" or self._root is not None or self._dispatching:
            return
        code = frame.f_code
        path = code.co_filename
        if path.startswith(TRITON):
            self._root = frame
        elif path.startswith(POSENC):
            self.calls.append(f"{os.path.basename(path)}:{code.co_name}")
            if code is FALLBACK:
                self.launches += 1
        elif path.startswith(CUSTOM_OP_MACHINERY):
            self.machinery.append(f"{path}:{code.co_name}")

    def extra_ops(self, allowed=ALLOWED_OPS) -> list:
        return [op for op in self.ops if op[0] not in allowed]


def tables(rows=64, dim=64):
    return rope_cos_sin(torch.arange(rows), rope_inv_freq(dim)[0])


@pytest.fixture(autouse=True)
def fresh_plans():
    plans.clear()
    yield
    plans.clear()


def _decode(seq_dim=1, b=1, dtype=torch.bfloat16):
    """A decode step's q and k: 8 query and 2 key heads of 64, one token per row."""
    if seq_dim == 1:
        return torch.randn(b, 1, 8, 64).to(dtype), torch.randn(b, 1, 2, 64).to(dtype)
    return torch.randn(b, 8, 1, 64).to(dtype), torch.randn(b, 2, 1, 64).to(dtype)


POS = torch.tensor([[17], [3]])
#: two packed sequences of one token each (a decode step of a varlen batch)
CU = torch.tensor([0, 1, 2], dtype=torch.int32)

CALLS = {
    # name: (limit of posenc calls, fn(q, k, cos, sin, rope) -> the call)
    "apply_rope_qk offset, promised": (8, lambda q, k, c, s, r: lambda: apply_rope_qk(
        q, k, c, s, offset=17, seq_dim=1, engine="triton", assume_valid=True)),
    "apply_rope_qk positions, promised": (8, lambda q, k, c, s, r: lambda: apply_rope_qk(
        q, k, c, s, positions=POS, seq_dim=1, engine="triton", assume_valid=True)),
    "RotaryEmbedding offset": (10, lambda q, k, c, s, r: lambda: r(q, k, offset=17, seq_dim=1)),
    "RotaryEmbedding positions, promised": (10, lambda q, k, c, s, r: lambda: r(
        q, k, positions=POS, seq_dim=1, assume_valid=True)),
    "RotaryEmbedding.rotate offset": (10, lambda q, k, c, s, r: lambda: r.rotate(k, offset=17, seq_dim=1, key=True)),
    "apply_rope_qk packed, promised": (8, lambda q, k, c, s, r: (lambda qp, kp: lambda: apply_rope_qk(
        qp, kp, c, s, cu_seqlens=CU, offset=17, engine="triton", assume_valid=True))(q[:, 0], k[:, 0])),
}
CHECKED = {
    "apply_rope_qk offset": lambda q, k, c, s, r: lambda: apply_rope_qk(q, k, c, s, offset=17, seq_dim=1,
                                                                          engine="triton"),
    "apply_rope_qk positions": lambda q, k, c, s, r: lambda: apply_rope_qk(
        q, k, c, s, positions=POS, seq_dim=1, engine="triton"),
    "RotaryEmbedding positions": lambda q, k, c, s, r: lambda: r(q, k, positions=POS,
                                                                 seq_dim=1),
    "apply_rope_qk packed": lambda q, k, c, s, r: (lambda qp, kp: lambda: apply_rope_qk(
        qp, kp, c, s, cu_seqlens=CU, offset=17, engine="triton"))(q[:, 0], k[:, 0]),
}


def _setup(name_call):
    q, k = _decode(b=2)
    cos, sin = tables()
    rope = posenc.RotaryEmbedding(64, max_seq_len=64, engine="triton")
    return name_call(q, k, cos, sin, rope)


@pytest.mark.parametrize("name", list(CALLS))
def test_an_eager_call_costs_its_plan_and_one_launch(name):
    limit, make = CALLS[name]
    call = _setup(make)
    first = Counts(call, ops=False)                         # the whole pipeline, leaving a plan
    warm = Counts(call, ops=False)
    assert first.launches == 1 and warm.launches == 1
    assert not first.machinery and not warm.machinery, "an eager call entered the custom-op machinery"
    assert len(warm.calls) <= limit, warm.calls
    ops = Counts(call)                                      # (a dispatch mode runs torch._library code itself)
    assert ops.launches == 1 and not ops.extra_ops(), ops.extra_ops()
    for a, b in zip(first.out if isinstance(first.out, tuple) else (first.out,),
                    warm.out if isinstance(warm.out, tuple) else (warm.out,), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", list(CHECKED))
def test_a_checked_call_stays_small(name):
    call = _setup(CHECKED[name])
    Counts(call, ops=False)
    warm = Counts(call, ops=False)
    assert warm.launches == 1 and not warm.machinery
    assert len(warm.calls) <= 20, warm.calls


def _cache_call(promised):
    B, S_max = 2, 32
    q, k, v = torch.randn(B, 1, 8, 64), torch.randn(B, 1, 2, 64), torch.randn(B, 1, 2, 64)
    kc, vc = torch.zeros(B, 2, S_max, 64), torch.zeros(B, 2, S_max, 64)
    cos, sin = tables()
    lens = torch.tensor([3, 9])
    return lambda: posenc.rope_and_cache(q, k, v, kc, vc, cos, sin, cache_seqlens=lens, seq_dim=1, engine="triton",
                                         assume_valid=promised)


def _norm_call(promised):
    q, k = _decode(b=2)
    w = torch.rand(64) + 0.5
    cos, sin = tables()
    return lambda: rms_norm_rope_qk(q, k, w, w, cos, sin, offset=5, seq_dim=1, engine="triton",
                                    assume_valid=promised)


@pytest.mark.parametrize("make", [_cache_call, _norm_call], ids=["rope_and_cache", "rms_norm_rope_qk"])
def test_the_fused_operations_cost_their_plan_and_one_launch(make):
    promised = make(True)
    Counts(promised, ops=False)
    warm = Counts(promised, ops=False)
    assert warm.launches == 1 and not warm.machinery
    assert len(warm.calls) <= 10, warm.calls
    ops = Counts(promised)
    assert not ops.extra_ops(), ops.extra_ops()
    checked = make(False)
    Counts(checked, ops=False)
    warm = Counts(checked, ops=False)
    assert warm.launches == 1 and len(warm.calls) <= 20, warm.calls


def test_the_counter_sees_what_it_counts():
    """Negative controls: the custom op is seen as machinery, and a clone as an extra aten op."""
    q, k = _decode(b=2)
    cos, sin = tables()
    seen = Counts(lambda: triton_rope._rope_qk_op(q, k, cos, sin, None, 3, False, 1, False), ops=False)
    assert seen.machinery and seen.launches == 1
    assert Counts(lambda: q.clone()).extra_ops() == [("clone", ((2, 1, 8, 64),))]


# ---- forward + backward: one launch per direction, the gradients read as they come ------------------------------


def _training(layout, seq_dim):
    torch.manual_seed(0)
    shape_q, shape_k = ((2, 9, 4, 32), (2, 9, 2, 32)) if seq_dim == 1 else ((2, 4, 9, 32), (2, 2, 9, 32))
    q = torch.randn(shape_q, requires_grad=True)
    k = torch.randn(shape_k, requires_grad=True)
    cos, sin = tables(16, 32)
    return q, k, cos, sin


def _big_copies(counts, *tensors):
    sizes = {t.numel() for t in tensors}
    copying = {"clone", "copy_", "contiguous", "_to_copy", "copy"}
    return [op for op in counts.ops if op[0] in copying and any(
        torch.Size(shape).numel() in sizes for shape in op[1])]


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim", [1, 2])
def test_forward_and_backward_launch_once_each_and_copy_nothing(layout, seq_dim):
    q, k, cos, sin = _training(layout, seq_dim)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    kw = dict(offset=2, layout=layout, seq_dim=seq_dim, engine="triton")
    assert not Counts(lambda: torch.autograd.grad(apply_rope_qk(q, k, cos, sin, **kw), (q, k), (gq, gk)),
                      ops=False).machinery
    fwd = Counts(lambda: apply_rope_qk(q, k, cos, sin, **kw))
    qo, ko = fwd.out
    bwd = Counts(lambda: torch.autograd.grad((qo, ko), (q, k), (gq, gk)))
    assert fwd.launches == 1 and bwd.launches == 1
    assert not _big_copies(fwd, q, k) and not _big_copies(bwd, q, k), (fwd.ops, bwd.ops)
    dq, dk = bwd.out
    assert torch.equal(gq, gq.clone()) and not (dq.data_ptr() == gq.data_ptr())      # the user's gradient is untouched
    ref = apply_rope_qk(q, k, cos, sin, offset=2, layout=layout, seq_dim=seq_dim, engine="torch")
    for got, want in zip((qo, ko), ref, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    rq, rk = torch.autograd.grad(ref, (q, k), (gq, gk))
    torch.testing.assert_close(dq, rq, rtol=0, atol=2e-6)
    torch.testing.assert_close(dk, rk, rtol=0, atol=2e-6)


def test_a_gradient_autograd_owns_is_rotated_in_place():
    q, k, cos, sin = _training("half", 1)
    w_q, w_k = torch.randn_like(q), torch.randn_like(k)
    qo, ko = apply_rope_qk(q, k, cos, sin, offset=2, seq_dim=1, engine="triton")
    loss = (qo * w_q).sum() + (ko * w_k).sum()
    run = Counts(lambda: torch.autograd.grad(loss, (q, k)))
    allocated = [op for op in run.ops if op[0] in ("empty_like", "empty", "empty_strided")]
    assert run.launches == 1 and not allocated, run.ops            # MulBackward's gradients, rotated where they lie
    ref = apply_rope_qk(q, k, cos, sin, offset=2, seq_dim=1, engine="torch")
    want = torch.autograd.grad((ref[0] * w_q).sum() + (ref[1] * w_k).sum(), (q, k))
    for got, exp in zip(run.out, want, strict=True):
        torch.testing.assert_close(got, exp, rtol=0, atol=2e-6)


def test_a_gradient_shared_by_two_nodes_is_not_overwritten():
    """One gradient tensor handed to two rotations (``a + b``): the first must not rotate it in place."""
    q1, k1, cos, sin = _training("half", 1)
    q2 = torch.randn_like(q1, requires_grad=True)
    w = torch.randn_like(q1)
    a, _ = apply_rope_qk(q1, None, cos, sin, offset=2, seq_dim=1, engine="triton")
    b, _ = apply_rope_qk(q2, None, cos, sin, offset=5, seq_dim=1, engine="triton")
    g1, g2 = torch.autograd.grad(((a + b) * w).sum(), (q1, q2))
    r1, _ = apply_rope_qk(q1, None, cos, sin, offset=2, seq_dim=1, engine="torch")
    r2, _ = apply_rope_qk(q2, None, cos, sin, offset=5, seq_dim=1, engine="torch")
    w1, w2 = torch.autograd.grad(((r1 + r2) * w).sum(), (q1, q2))
    torch.testing.assert_close(g1, w1, rtol=0, atol=2e-6)
    torch.testing.assert_close(g2, w2, rtol=0, atol=2e-6)


def test_a_stride_zero_gradient_is_read_as_it_is():
    q, k, cos, sin = _training("interleaved", 2)
    qo, ko = apply_rope_qk(q, k, cos, sin, offset=1, layout="interleaved", engine="triton")
    run = Counts(lambda: torch.autograd.grad(qo.sum() + ko.sum(), (q, k)))   # ones expanded: stride 0
    assert run.launches == 1 and not _big_copies(run, q, k), run.ops
    ref = apply_rope_qk(q, k, cos, sin, offset=1, layout="interleaved", engine="torch")
    for got, exp in zip(run.out, torch.autograd.grad(ref[0].sum() + ref[1].sum(), (q, k)), strict=True):
        torch.testing.assert_close(got, exp, rtol=0, atol=2e-6)


# ---- the direct launch: Triton's calling convention, and the fallback ------------------------------------------


def test_this_triton_calls_compiled_kernels_as_the_direct_launch_does():
    assert triton_launch.direct_supported()


def test_another_convention_takes_the_fallback(monkeypatch):
    triton_launch.direct_supported.cache_clear()
    monkeypatch.setattr(triton_launch.inspect, "getsource", lambda fn: "def run(self):\n    kernel.launch(grid)\n")
    try:
        assert not triton_launch.direct_supported()
    finally:
        triton_launch.direct_supported.cache_clear()


class _FakeDriver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 1234


class _FakeCompiled:
    function, packed_metadata = "function", "metadata"

    def __init__(self):
        self.runs = []

    def run(self, *args):
        self.runs.append(args)


def test_a_direct_launch_passes_what_kernel_grid_binds(monkeypatch):
    """The arguments of a direct call equal, in order, those Triton's own binder gives the compiled kernel."""
    from tests import triton_specs

    q, k = torch.randn(2, 3, 8, 64), torch.randn(2, 3, 2, 64)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    cos, sin = tables()
    positions = torch.tensor([[1, 2, 3], [4, 5, 6]])
    grid, args, meta = triton_rope.launch_args(q, k, qo, ko, cos, sin, positions, 0, False, 1, False)
    jit = triton_specs._jit(triton_rope._rope_qk_kernel)
    _, binder = triton_specs._binder(jit, 90)
    bound, _, _ = binder(*args, **meta)
    compiled = _FakeCompiled()
    launch = triton_launch.Launch(jit, grid, args[triton_rope._PER_CALL:], meta, triton_rope._TENSORS)
    monkeypatch.setattr(triton_launch, "_driver", lambda: _FakeDriver())
    launch.direct = triton_launch._direct_call(jit, compiled, meta, 0)
    per_call = args[: triton_rope._PER_CALL]
    if any(t.data_ptr() % 16 for t in per_call[: triton_rope._TENSORS]):
        pytest.skip("an allocation here was not 16-byte aligned")
    launch(*per_call)
    (call,) = compiled.runs
    assert call[:9] == (*launch.grid3, 1234, "function", "metadata", None, None, None)
    assert launch.grid3 == (*grid, 1, 1)[:3]
    expected = [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in bound.values()]
    assert list(call[9:]) == expected


def test_a_launch_is_direct_only_once_compiled_aligned_and_allowed(monkeypatch):
    """On CPU every launch takes ``kernel[grid](...)``: no compiled kernel is kept, whatever DIRECT says."""
    q, k = _decode(b=2)
    cos, sin = tables()
    rotation = triton_rope.prepare(q, k, cos, sin, None, 3, "half", 1, False)
    first = rotation(q, k, cos, sin, None, 3)
    assert rotation.launch.direct is None
    monkeypatch.setattr(triton_launch, "DIRECT", False)
    for a, b in zip(rotation(q, k, cos, sin, None, 3), first, strict=True):
        assert torch.equal(a, b)
