"""Production paths of RoPE: one validation and one engine decision per call, no device reads when
decoding with an offset, positions never read outside a table (eager, promised, compiled, Triton),
and the small-tensor (decode-step) path against the reference."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before Triton decorates the kernel (as in test_triton_rope)

import pytest  # noqa: E402
import torch  # noqa: E402

import posenc  # noqa: E402
from posenc import kernels  # noqa: E402
from posenc._torch import alloc, engine_choice, plans, rope_call  # noqa: E402
from posenc.functional import rope as R  # noqa: E402
from posenc.kernels import torch_rope as E  # noqa: E402
from posenc.nn import rotary as rotary_module  # noqa: E402

HAS_TRITON_INTERPRETER = engine_choice._HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1"


def tables(rows, dim):
    inv, _ = R.rope_inv_freq(dim)
    return R.rope_cos_sin(torch.arange(rows), inv)


def public_calls(engine_name):
    """Every public entry point that rotates, with ``engine_name``, on a decode-step-like input."""
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 3, 16)
    cos, sin = tables(32, 16)
    rope = posenc.RotaryEmbedding(16, max_seq_len=32, engine=engine_name)
    return {
        "apply_rope": lambda: R.apply_rope(q, cos[:3], sin[:3], engine=engine_name),
        "apply_rope_qk": lambda: R.apply_rope_qk(q, k, cos, sin, offset=2, engine=engine_name),
        "apply_rope_qk positions": lambda: R.apply_rope_qk(q, k, cos, sin, positions=torch.tensor([4, 5, 6]),
                                                           engine=engine_name),
        "RotaryEmbedding": lambda: rope(q, k, offset=5),
        "RotaryEmbedding positions": lambda: rope(q, k, positions=torch.tensor([[1, 2, 3]])),
        "RotaryEmbedding.rotate": lambda: rope.rotate(k, offset=7, key=True),
        "attention": lambda: posenc.attention(q, k.repeat_interleave(2, 1), k.repeat_interleave(2, 1), encoding=rope,
                                              causal=True),
    }


@pytest.fixture
def kernel_spy(monkeypatch):
    """Pretend every tensor is one the kernel takes under "auto", and record which engines run."""
    calls = []
    torch_engine = kernels.engine("rope_qk", "torch")

    class FakeTriton:
        __name__ = "posenc.kernels.fake_triton"
        unpack_tables = staticmethod(torch_engine.unpack_tables)

        @staticmethod
        def rope_qk(*args, **kw):
            calls.append("triton")
            return torch_engine.rope_qk(*args, **kw)

        @staticmethod
        def prepare(*args, **kw):
            run = torch_engine.prepare(*args, **kw)

            def rotation(*a, **k):
                calls.append("triton")
                return run(*a, **k)
            return rotation

    monkeypatch.setattr(engine_choice, "auto_device", lambda x: True)
    monkeypatch.setattr(engine_choice, "triton_available", lambda device: True)
    real_engine = kernels.engine
    fake_engine = lambda op, name: FakeTriton if name == "triton" else real_engine(op, name)  # noqa: E731
    for module in (R, rotary_module):
        monkeypatch.setattr(module, "kernel_engine", fake_engine)
    monkeypatch.setattr(R, "rope_engine", lambda name: FakeTriton.rope_qk if name == "triton" else real_engine(
        "rope_qk", name).rope_qk)
    plans.clear()                                     # (a plan made with the real engines would skip the spy)
    yield calls
    plans.clear()


@pytest.mark.parametrize("name", list(public_calls("torch")))
def test_engine_torch_never_reaches_the_kernel(kernel_spy, name):
    public_calls("torch")[name]()
    assert kernel_spy == []


@pytest.mark.parametrize("name", ["apply_rope", "apply_rope_qk", "apply_rope_qk positions", "RotaryEmbedding",
                                  "RotaryEmbedding positions", "RotaryEmbedding.rotate"])
def test_engine_auto_takes_the_kernel_where_it_applies(kernel_spy, name):
    public_calls("auto")[name]()
    assert kernel_spy and set(kernel_spy) == {"triton"}


@pytest.mark.parametrize("name", ["apply_rope_qk", "apply_rope_qk positions", "RotaryEmbedding",
                                  "RotaryEmbedding positions", "RotaryEmbedding.rotate"])
def test_one_validation_and_one_decision_per_call(monkeypatch, name):
    """The first call validates and decides once; a second call with the same signature runs the first
    one's plan (step 0): no validation, no decision."""
    counts = {"check_qk": 0, "decide": 0}

    def counting(key, fn):
        def wrapper(*a, **kw):
            counts[key] += 1
            return fn(*a, **kw)
        return wrapper

    monkeypatch.setattr(rope_call, "check_qk", counting("check_qk", rope_call.check_qk))
    for module in (R, rotary_module):
        monkeypatch.setattr(module, "choose_engine", counting("decide", module.choose_engine))
    plans.clear()
    call = public_calls("auto")[name]
    call()
    assert counts == {"check_qk": 1, "decide": 1}
    call()
    expected = 1
    assert counts == {"check_qk": expected, "decide": expected}


@pytest.fixture
def device_reads(monkeypatch):
    """Count the ways a tensor's values come back to the host."""
    count = [0]
    for method in ("tolist", "item", "__int__", "__bool__", "__index__", "numpy"):
        original = getattr(torch.Tensor, method)

        def reading(self, *a, _original=original, **kw):
            count[0] += 1
            return _original(self, *a, **kw)
        monkeypatch.setattr(torch.Tensor, method, reading)
    return count


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("scaling", [None, posenc.YarnScaling(4.0, 8), posenc.DynamicNTKScaling(2.0, 8)])
def test_decoding_with_an_offset_reads_nothing_from_the_device(device_reads, layout, scaling):
    rope = posenc.RotaryEmbedding(16, max_seq_len=64, layout=layout, scaling=scaling)
    q, k = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 1, 16)
    cos, sin = tables(64, 16)
    device_reads[0] = 0
    rope(q, k, offset=30)
    rope(q, k, offset=3, inplace=True)
    R.apply_rope_qk(q, k, cos, sin, offset=30)
    assert device_reads[0] == 0


def test_positions_are_read_once_or_not_at_all_when_promised(device_reads):
    rope = posenc.RotaryEmbedding(16, max_seq_len=64)
    q, k = torch.randn(2, 4, 3, 16), torch.randn(2, 2, 3, 16)
    positions = torch.tensor([[5, 6, 7], [1, 2, 3]])
    cos, sin = tables(64, 16)
    for call, reads in [
        (lambda: rope(q, k, positions=positions), 1),
        (lambda: rope(q, k, positions=positions, assume_valid=True), 0),
        (lambda: R.apply_rope_qk(q, k, cos, sin, positions=positions), 1),
        (lambda: R.apply_rope_qk(q, k, cos, sin, positions=positions, assume_valid=True), 0),
    ]:
        device_reads[0] = 0
        call()
        assert device_reads[0] == reads


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_promised_positions_give_the_same_result_and_a_broken_promise_raises(layout):
    rope = posenc.RotaryEmbedding(16, max_seq_len=16, layout=layout)
    q, k = torch.randn(2, 4, 3, 16), torch.randn(2, 2, 3, 16)
    positions = torch.tensor([[5, 6, 7], [1, 2, 15]])
    for a, b in zip(rope(q, k, positions=positions, assume_valid=True), rope(q, k, positions=positions),
                    strict=True):
        assert torch.equal(a, b)
    cos, sin = rope.cos_table, rope.sin_table
    for bad in (torch.tensor([[5, 6, 16], [0, 1, 2]]), torch.tensor([[-1, 0, 1], [0, 1, 2]])):
        with pytest.raises(ValueError, match=r"must lie in \[0, 16\)"):
            rope(q, k, positions=bad, assume_valid=True)
        with pytest.raises(ValueError, match=r"must lie in \[0, 16\)"):
            R.apply_rope_qk(q, k, cos, sin, positions=bad, assume_valid=True)
    # without the promise, the module computes positions past its table exactly
    far = torch.tensor([[5, 6, 100], [-3, 1, 2]])
    ref = posenc.RotaryEmbedding(16, max_seq_len=128, layout=layout)
    torch.testing.assert_close(rope(q, k, positions=far.clamp(min=0))[0], ref(q, k, positions=far.clamp(min=0))[0],
                               rtol=0, atol=2e-6)


def test_compiled_lookups_refuse_positions_outside_the_table():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    cos, sin = tables(8, 8)
    f = torch.compile(lambda q, k, p: R.apply_rope_qk(q, k, cos, sin, positions=p), fullgraph=True, backend="eager")
    torch.testing.assert_close(f(q, k, torch.tensor([1, 2, 3]))[0],
                               R.apply_rope_qk(q, k, cos, sin, positions=torch.tensor([1, 2, 3]))[0])
    with pytest.raises(RuntimeError, match=r"must lie in \[0, 8\)"):
        f(q, k, torch.tensor([1, 2, 8]))


def test_compiled_module_computes_positions_past_its_table_like_eager():
    rope = posenc.RotaryEmbedding(8, max_seq_len=8)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    positions = torch.tensor([2, 9, 1000])
    f = torch.compile(lambda q, k, p: rope(q, k, positions=p), fullgraph=True, backend="eager")
    for a, b in zip(f(q, k, positions), rope(q, k, positions=positions), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-6)


@pytest.mark.skipif(not HAS_TRITON_INTERPRETER, reason="needs Triton's interpreter (TRITON_INTERPRET=1)")
def test_the_kernel_never_reads_outside_its_table():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    cos, sin = tables(8, 8)
    engine = kernels.rope_engine("triton")
    qo, ko = engine(q, k, cos=cos, sin=sin, positions=torch.tensor([1, 8, -1]), offset=0, layout="half", seq_dim=2,
                    inplace=False)
    ref = R.apply_rope_qk(q, k, cos, sin, positions=torch.tensor([1, 1, 1]), engine="torch")
    torch.testing.assert_close(qo[:, :, 0], ref[0][:, :, 0], rtol=0, atol=2e-6)
    assert bool(qo[:, :, 1:].isnan().all()) and bool(ko[:, :, 1:].isnan().all())       # visible, not wrong
    with pytest.raises(ValueError, match=r"must lie in \[0, 8\)"):                        # checked by default
        R.apply_rope_qk(q, k, cos, sin, positions=torch.tensor([1, 8, 2]), engine="triton")


@pytest.mark.skipif(not HAS_TRITON_INTERPRETER, reason="needs Triton's interpreter (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_the_kernel_reads_the_modules_packed_tables(layout):
    rope_t = posenc.RotaryEmbedding(16, max_seq_len=32, layout=layout, engine="triton")
    rope_r = posenc.RotaryEmbedding(16, max_seq_len=32, layout=layout, engine="torch")
    q, k = torch.randn(2, 3, 5, 16), torch.randn(2, 1, 5, 16)
    positions = torch.tensor([[0, 3, 9, 31, 2], [4, 4, 4, 4, 4]])
    for kw in ({"offset": 20}, {"positions": positions}, {"positions": positions, "assume_valid": True}):
        for a, b in zip(rope_t(q, k, **kw), rope_r(q, k, **kw), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-6)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seq_dim", [2, 1])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("use_module", [False, True])
def test_decode_step_path_equals_the_reference(layout, dtype, seq_dim, batch, use_module):
    torch.manual_seed(0)
    hq, hk, D = 8, 2, 32
    q = torch.randn((batch, hq, 1, D) if seq_dim == 2 else (batch, 1, hq, D)).to(dtype)
    k = torch.randn((batch, hk, 1, D) if seq_dim == 2 else (batch, 1, hk, D)).to(dtype)
    rope = posenc.RotaryEmbedding(D, max_seq_len=64, layout=layout)
    if use_module:
        qo, ko = rope(q, k, offset=37, seq_dim=seq_dim)
    else:
        qo, ko = R.apply_rope_qk(q, k, rope.cos_table, rope.sin_table, offset=37, layout=layout, seq_dim=seq_dim)
    c, s = rope.cos_table[37:38], rope.sin_table[37:38]                # (S, h) for (B, H, S, D)
    if seq_dim == 1:
        c, s = c[:, None], s[:, None]                                   # (S, 1, h) for (B, S, H, D)
    for got, x in ((qo, q), (ko, k)):
        ref = E.rotate_reference(x, c, s, layout=layout)
        assert got.shape == x.shape and got.dtype == dtype and got.is_contiguous()
        tol = 2e-6 if dtype == torch.float32 else torch.finfo(dtype).eps * 4
        torch.testing.assert_close(got.float(), ref.float(), rtol=0, atol=tol)
    q2, k2 = q.clone(), k.clone()
    out = rope(q2, k2, offset=37, seq_dim=seq_dim, inplace=True)
    assert out[0] is q2 and out[1] is k2 and torch.equal(q2, qo) and torch.equal(k2, ko)


def test_outputs_never_alias_the_inputs_out_of_place():
    rope = posenc.RotaryEmbedding(16, max_seq_len=8)
    q, k = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 1, 16)
    qo, ko = rope(q, k, offset=0)                                   # position 0: the identity rotation
    assert torch.equal(qo, q) and qo.data_ptr() != q.data_ptr() and ko.data_ptr() != k.data_ptr()


def test_large_outputs_are_ordinary_tensors():
    x = torch.randn(1024, 4096)                                     # 16 MiB: advised for huge pages
    out = alloc.empty_like(x)
    assert out.shape == x.shape and out.dtype == x.dtype and out.is_contiguous()
    out.copy_(x)
    assert torch.equal(out, x)
    q = torch.randn(2, 8, 1024, 128)                                # the large out-of-place path
    cos, sin = tables(1024, 128)
    torch.testing.assert_close(R.apply_rope(q, cos, sin), E.rotate_reference(q, cos, sin, layout="half"),
                               rtol=0, atol=2e-6)


def test_input_checks_at_the_boundary():
    x = torch.randn(2, 3, 8)
    cos, sin = tables(3, 8)
    with pytest.raises(ValueError, match="do not broadcast to x"):
        R.apply_rope(x, cos.expand(2, 2, 3, 4), sin.expand(2, 2, 3, 4))        # would grow the output
    with pytest.raises(TypeError, match="dtype must be one of"):
        R.rope_cos_sin(torch.arange(3), torch.ones(2, dtype=torch.float64), dtype=torch.int64)
    with pytest.raises(TypeError, match="assume_in_table must be a bool"):
        posenc.RotaryEmbedding(8)(torch.randn(1, 1, 3, 8), assume_in_table=1)
    with pytest.raises(TypeError, match="assume_valid must be a bool"):
        posenc.RotaryEmbedding(8)(torch.randn(1, 1, 3, 8), assume_valid=1)
    with pytest.raises(ValueError, match="pass seq_len"):
        posenc.RotaryEmbedding(8, scaling=posenc.DynamicNTKScaling(2.0, 8))(
            torch.randn(1, 1, 3, 8), positions=torch.arange(3), assume_valid=True)


class _RotateAt(torch.nn.Module):
    def __init__(self, assume):
        super().__init__()
        self.rope = posenc.RotaryEmbedding(8, max_seq_len=16)
        self.assume = assume

    def forward(self, q, k, positions):
        return self.rope(q, k, positions=positions, assume_valid=self.assume)


def test_exported_module_computes_or_refuses_positions_past_its_table():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    far = torch.tensor([1, 2, 20])
    exported = torch.export.export(_RotateAt(False), (q, k, torch.tensor([1, 2, 3]))).module()
    for a, b in zip(exported(q, k, far), _RotateAt(False)(q, k, far), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-6)                     # computed exactly, as eager
    promised = torch.export.export(_RotateAt(True), (q, k, torch.tensor([1, 2, 3]))).module()
    torch.testing.assert_close(promised(q, k, torch.tensor([4, 5, 6]))[0], _RotateAt(True)(q, k, torch.tensor([4, 5, 6]))[0])
    with pytest.raises(RuntimeError, match=r"must lie in \[0, 16\)"):
        promised(q, k, far)


@pytest.mark.parametrize("scaling", [None, posenc.DynamicNTKScaling(2.0, 8)])
def test_an_attention_decode_step_with_rope_reads_nothing_from_the_device(device_reads, scaling):
    rope = posenc.RotaryEmbedding(16, max_seq_len=64, scaling=scaling)
    q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16)
    device_reads[0] = 0
    out = posenc.attention(q, k, v, encoding=rope, causal=True)                 # query at 19 after 19 cached keys
    assert device_reads[0] == 0
    explicit = posenc.attention(q, k, v, encoding=rope, causal=True, positions=torch.tensor([19]),
                                key_positions=torch.arange(20))
    torch.testing.assert_close(out, explicit, rtol=0, atol=1e-6)


def test_compiled_xpos_with_a_positions_tensor_equals_eager():
    rope = posenc.RotaryEmbedding(8, max_seq_len=16, xpos_scale_base=64.0)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    positions = torch.tensor([3, 4, 40])
    f = torch.compile(lambda q, k, p: rope(q, k, positions=p), fullgraph=True, backend="eager")
    for a, b in zip(f(q, k, positions), rope(q, k, positions=positions), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-6)
    for a, b in zip(rope(q, k, positions=positions.clamp(max=15), assume_valid=True),
                    rope(q, k, positions=positions.clamp(max=15)), strict=True):
        assert torch.equal(a, b)


@pytest.mark.skipif(not HAS_TRITON_INTERPRETER, reason="needs Triton's interpreter (TRITON_INTERPRET=1)")
def test_first_call_under_compile_traces_without_graph_breaks():
    """In a fresh process no engine module is loaded yet: picking one must not break the graph."""
    import subprocess
    import sys

    code = (
        "import os; os.environ['TRITON_INTERPRET'] = '1'\n"
        "import torch, posenc\n"
        "q = torch.randn(1, 2, 5, 8)\n"
        "for engine in ('torch', 'triton'):\n"
        "    rope = posenc.RotaryEmbedding(8, max_seq_len=8, engine=engine)\n"
        "    f = torch.compile(lambda q: rope(q, q, positions=torch.tensor([0, 1, 2, 3, 7]))[0], fullgraph=True,\n"
        "                      backend='eager')\n"
        "    assert torch.allclose(f(q), rope(q, q, positions=torch.tensor([0, 1, 2, 3, 7]))[0], atol=2e-6)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_exact_paths_check_positions_even_when_promised():
    rope = posenc.RotaryEmbedding(64, max_seq_len=4096, xpos_scale_base=512.0)
    q = torch.randn(1, 1, 1, 64)
    with pytest.raises(ValueError, match="xPos scales overflow"):
        rope(q, q, positions=torch.tensor([40000]), assume_valid=True)
    small = posenc.RotaryEmbedding(8, max_seq_len=4096, xpos_scale_base=10.0)
    q8 = torch.randn(1, 1, 1, 8)
    torch.testing.assert_close(small.rotate(q8, positions=torch.tensor([3]), key=True, assume_valid=True),
                               small.rotate(q8, positions=torch.tensor([3]), key=True))
    with pytest.raises(ValueError, match=r"within \[-2\*\*31, 2\*\*31\]"):
        posenc.RotaryEmbedding(8).rotate(q8.double(), positions=torch.tensor([2**40]), assume_valid=True)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_cos_sin_reads_narrow_integer_positions_as_indices(dtype):
    rope = posenc.RotaryEmbedding(4, max_seq_len=4)
    positions = torch.tensor([1, 0, 1, 3])
    cos, sin = rope.cos_sin(positions.to(dtype))
    assert torch.equal(cos, rope.cos_table[positions]) and torch.equal(sin, rope.sin_table[positions])


def test_zero_dim_inputs_raise_value_errors():
    cos, sin = tables(3, 8)
    with pytest.raises(ValueError, match="x must have a feature axis"):
        R.apply_rope(torch.tensor(1.0), cos, sin)
    with pytest.raises(ValueError, match="cos must have a feature axis"):
        R.apply_rope(torch.randn(3, 8), torch.tensor(1.0), torch.tensor(1.0))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary", [4, 8])
def test_out_of_place_outputs_keep_the_strides_of_empty_like(layout, rotary):
    x = torch.randn(1, 5, 4, 8).transpose(1, 2)                      # (B, H, S, D) view of (B, S, H, D)
    cos, sin = tables(5, rotary)
    out = R.apply_rope(x, cos, sin, layout=layout)
    assert out.stride() == torch.empty_like(x).stride() == x.stride()
    out.transpose(1, 2).view(1, 5, 32)                               # as attention code reshapes it
    torch.testing.assert_close(out[..., rotary:], x[..., rotary:], rtol=0, atol=0)
