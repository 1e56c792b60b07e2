"""Deployment matrix for the vision and multimodal encodings: ``SinusoidalEncodingND``,
``AxialRotaryEmbedding`` (fixed and learned), ``MultimodalRotaryEmbedding`` and
``resize_position_embedding`` through ``torch.compile(fullgraph=True)`` (static and dynamic shapes,
with recompile counts), ``torch.export`` with a dynamic length, ONNX run in onnxruntime,
pickle/deepcopy, ``state_dict``, meta-device construction, ``.to(bfloat16)`` and autocast.

Each path gives eager mode's answer or refuses up front with a clear error.  Where the traced
computation is the eager one (a table added, the learned angles, a resize) the outputs are compared
bit for bit.  The rotary modules read their float32 tables in eager mode when one range reduction
shows the positions inside them, while a traced graph (which reads nothing back from the device)
computes the same rows exactly: both are within 1 ulp of the true value, so those outputs are
compared to 4e-6 (a few float32 ulps of values of order 1; a wrong frequency, axis or row is off by
1e-2 or more).  Lengths straddle the tables (``max_seq_len=8`` per axis, ``max_seq_len=16`` for M-RoPE).
"""

from __future__ import annotations

import copy
import io
import pickle
import warnings

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from posenc.functional.axial import grid_positions
from posenc.functional.resize import resize_position_embedding
from posenc.functional.sincos_nd import sincos_table_nd
from posenc.nn.axial_rotary import AxialRotaryEmbedding
from posenc.nn.mrope import MultimodalRotaryEmbedding
from posenc.nn.sincos_nd import SinusoidalEncodingND
from tests.reference.grid_oracle import sincos_nd

BIG = 1 << 20                         # the upper bound of every dynamic dimension exported here
AXIAL_TABLE = 8                       # coordinates 0 .. 7 per axis are tabulated
MROPE_TABLE = 16


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _close(got, want):
    torch.testing.assert_close(got, want, rtol=4e-6, atol=4e-6)


def _close_pairs(got, want):
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None
        else:
            _close(g, w)


def _equal_pairs(got, want):
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def _randn(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed + sum(shape)))


def _dynamic_calls(fn, inputs, check):
    """Compile ``fn`` with dynamic shapes; ``check(got, eager)`` on every input; no graph after the first call."""
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    first = None
    for args in inputs:
        check(compiled(*args), fn(*args))
        first = counter.frame_count if first is None else first
    assert counter.frame_count == first, f"recompiled for new shapes: {counter.frame_count - first} more graphs"


class _Call(torch.nn.Module):
    """``fn(module, *inputs)`` as a module with named inputs (for ``torch.export`` / ONNX)."""

    def __init__(self, module, fn):
        super().__init__()
        self.module = module
        self.fn = fn

    def forward(self, a, b=None, c=None, d=None):
        return self.fn(self.module, *(t for t in (a, b, c, d) if t is not None))


def _no_host_reads(program):
    """No value is read back from the device inside an exported graph (no ``.item()`` / ``.tolist()``)."""
    reads = [n for n in program.graph.nodes if any(op in str(n.target) for op in ("aten.item", "_local_scalar_dense"))]
    assert not reads, reads


def _onnx_session(model, args, dynamic_shapes, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    for p in model.parameters():
        p.requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, args, dynamo=True, verbose=False, dynamic_shapes=dynamic_shapes)
    path = tmp_path / "model.onnx"
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def run(*inputs):
        feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs, strict=True)}
        return [torch.from_numpy(o) for o in session.run(None, feed)]

    return run


# ---- SinusoidalEncodingND --------------------------------------------------------------------------

SINCOS = {
    "2d_mae_cls": lambda: SinusoidalEncodingND((2, 3), 8, prefix_tokens=1),
    "2d_timm_scaled": lambda: SinusoidalEncodingND((3, 2), 8, order="timm", scale=2.0),
    "3d_base_size": lambda: SinusoidalEncodingND((2, 2, 3), 16, base_size=(2.0, 4.0, 4.0)),
}


@pytest.mark.parametrize("name", list(SINCOS))
def test_sincos_nd_own_grid_compiles_in_one_graph_bit_for_bit(name):
    enc = SINCOS[name]()
    x = _randn(2, enc.num_tokens(), enc.dim)
    static = torch.compile(enc, backend="aot_eager", fullgraph=True)
    assert torch.equal(static(x), enc(x))
    torch._dynamo.reset()
    _dynamic_calls(enc, [(_randn(b, enc.num_tokens(), enc.dim),) for b in (2, 3, 5)],
                   lambda got, want: torch.testing.assert_close(got, want, rtol=0, atol=0))


@pytest.mark.parametrize("name", list(SINCOS))
def test_sincos_nd_exports_with_a_dynamic_batch(name):
    enc = SINCOS[name]()
    n = enc.num_tokens()
    batch = torch.export.Dim("batch", min=1, max=BIG)
    program = torch.export.export(_Call(enc, lambda m, x: m(x)), (_randn(2, n, enc.dim),),
                                  dynamic_shapes=({0: batch},))
    _no_host_reads(program)
    for b in (1, 7):
        x = _randn(b, n, enc.dim, seed=1)
        assert torch.equal(program.module()(x), enc(x))


def test_sincos_nd_export_with_a_dynamic_token_count_is_refused_up_front():
    enc = SINCOS["2d_mae_cls"]()                                         # the grid fixes N = 1 + 2 * 3
    tokens = torch.export.Dim("tokens", min=2, max=BIG)
    with pytest.raises(Exception, match=r"(?s)specialized it to be a constant \(7\)|tokens = 7"):
        torch.export.export(_Call(enc, lambda m, x: m(x)), (_randn(2, 7, 8),), dynamic_shapes=({1: tokens},))


def test_sincos_nd_onnx_runs_in_onnxruntime_at_two_batch_sizes(tmp_path):
    enc = SINCOS["2d_mae_cls"]()
    batch = torch.export.Dim("batch", min=1, max=BIG)
    run = _onnx_session(_Call(enc, lambda m, x: m(x)), (_randn(2, 7, 8),),
                        ({0: batch},), tmp_path)
    for b in (1, 5):
        x = _randn(b, 7, 8, seed=2)
        assert torch.equal(run(x)[0], enc(x))


def test_sincos_nd_another_grid_compiles_with_a_graph_break_and_matches_eager():
    enc = SINCOS["2d_mae_cls"]()
    before = {n: b.clone() for n, b in enc.named_buffers()}
    fn = lambda x: enc(x, grid_shape=(3, 4))                                   # noqa: E731
    want = torch.from_numpy(sincos_nd((3, 4), 8, prefix=1)).float()          # the table, independently
    torch.testing.assert_close(fn(torch.zeros(2, 13, 8))[1], want, rtol=2.4e-7, atol=1e-12)   # within 2 ulp
    x = _randn(2, 13, 8)
    assert torch.equal(torch.compile(fn, backend="aot_eager")(x), fn(x))
    assert all(torch.equal(b, before[n]) for n, b in enc.named_buffers())   # forward changed nothing


def test_sincos_nd_another_grid_under_fullgraph_is_refused_with_the_fix():
    enc = SINCOS["2d_mae_cls"]()
    compiled = torch.compile(lambda x: enc(x, grid_shape=(3, 4)), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match=r"(?s)computed on the host.*SinusoidalEncodingND\(grid_shape, dim\)"):
        compiled(_randn(2, 13, 8))
    with pytest.raises(Exception, match="computed on the host"):                # the functional form too
        torch.compile(lambda: sincos_table_nd((3, 4), 8), backend="aot_eager", fullgraph=True)()


def test_sincos_nd_another_grid_exports_as_that_grids_constant_table():
    enc = SINCOS["2d_mae_cls"]()
    batch = torch.export.Dim("batch", min=1, max=BIG)
    program = torch.export.export(_Call(enc, lambda m, x: m(x, grid_shape=(3, 4))), (_randn(2, 13, 8),),
                                  dynamic_shapes=({0: batch},))
    x = _randn(3, 13, 8, seed=3)
    assert torch.equal(program.module()(x), enc(x, grid_shape=(3, 4)))




# ---- AxialRotaryEmbedding (fixed) ------------------------------------------------------------------


def _axial_inputs(s, *, batch=1, per_row=False, head_dim=10, seed=0):
    q = _randn(batch, 2, s, head_dim, seed=seed)
    k = _randn(batch, 2, s, head_dim, seed=seed + 1)
    t = torch.arange(s)
    pos = torch.stack([t % 3, t // 3], -1)                                      # coordinates (S, 2)
    if per_row:
        pos = torch.stack([pos, pos.flip(0)])                                   # (2, S, 2): one grid per row
    return q, k, pos


def _axial(layout="interleaved"):
    return AxialRotaryEmbedding((4, 4), layout=layout, max_seq_len=AXIAL_TABLE)


AXIAL_CALLS = {
    "positions": lambda m, q, k, p: m(q, k, positions=p),
    "assume_valid": lambda m, q, k, p: m(q, k, positions=p, assume_valid=True),
    "cos_sin": lambda m, q, k, c, s: m(q, k, cos_sin=(c, s)),
}


def _axial_args(m, call, s, **kw):
    q, k, pos = _axial_inputs(s, **kw)
    return (q, k, *m.cos_sin(pos)) if call == "cos_sin" else (q, k, pos)


AXIAL_COMPILE_CASES = [   # (call, positions per batch row, layout)
    *[("positions", per_row, layout) for per_row in (False, True) for layout in ("interleaved", "half")],
    ("assume_valid", False, "interleaved"), ("assume_valid", True, "half"),
    ("cos_sin", False, "interleaved"), ("cos_sin", True, "interleaved"), ("cos_sin", False, "half"),
]


@pytest.mark.parametrize(("call", "per_row", "layout"), AXIAL_COMPILE_CASES)
def test_axial_compiles_in_one_graph_with_no_recompile_across_lengths(call, per_row, layout):
    m = _axial(layout)
    fn = lambda *a: AXIAL_CALLS[call](m, *a)                                    # noqa: E731
    kw = {"batch": 2, "per_row": per_row}
    static_args = _axial_args(m, call, 9, **kw)
    _close_pairs(torch.compile(fn, backend="aot_eager", fullgraph=True)(*static_args), fn(*static_args))
    torch._dynamo.reset()
    lengths = (5, 9, 20) if call == "assume_valid" else (5, 9, 30)         # 30 leaves the table (coordinate 9)
    _dynamic_calls(fn, [_axial_args(m, call, s, **kw) for s in lengths], _close_pairs)


def test_axial_under_inductor_with_dynamic_lengths_equals_eager():
    m = _axial()
    fn = lambda q, k, p: m(q, k, positions=p)                                   # noqa: E731
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)                  # the default backend
    for s in (5, 40):
        args = _axial_args(m, "positions", s, batch=2, per_row=True)
        _close_pairs(compiled(*args), fn(*args))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("call", list(AXIAL_CALLS))
def test_axial_exports_with_a_dynamic_length(call, layout):
    m = _axial(layout)
    length = torch.export.Dim("length", min=2, max=BIG)
    dyn = ({2: length}, {2: length}, {0: length}) + (({0: length},) if call == "cos_sin" else ())
    program = torch.export.export(_Call(m, AXIAL_CALLS[call]), _axial_args(m, call, 6), dynamic_shapes=dyn)
    _no_host_reads(program)
    for s in (3, 20) if call == "assume_valid" else (3, 40):
        args = _axial_args(m, call, s, seed=4)
        _close_pairs(program.module()(*args), AXIAL_CALLS[call](m, *args))


@pytest.mark.parametrize("module", ["axial", "mrope"])
def test_an_exported_in_table_promise_is_checked_at_run_time(module):
    length = torch.export.Dim("length", min=2, max=BIG)
    if module == "axial":
        m = _axial()
        args, too_far, rows = _axial_args(m, "positions", 6), _axial_args(m, "positions", 30), AXIAL_TABLE
        dyn = ({2: length}, {2: length}, {0: length})
    else:
        m, args, too_far, rows = _mrope(), _mrope_args(6), _mrope_args(40), MROPE_TABLE
        dyn = ({2: length}, {2: length}, {0: length})
    call = (AXIAL_CALLS if module == "axial" else MROPE_CALLS)["assume_valid"]
    program = torch.export.export(_Call(m, call), args, dynamic_shapes=dyn)
    _no_host_reads(program)
    with pytest.raises(RuntimeError, match=rf"positions must lie in \[0, {rows}\)"):
        program.module()(*too_far)                                               # past the table: never read


AXIAL_ONNX_CASES = {   # name -> (call, layout or "learned")
    "positions_interleaved": ("positions", "interleaved"),
    "positions_half": ("positions", "half"),
    "assume_valid": ("assume_valid", "interleaved"),
    "cos_sin": ("cos_sin", "interleaved"),
    "learned": ("positions", "learned"),
}


@pytest.mark.parametrize("case", list(AXIAL_ONNX_CASES))
def test_axial_onnx_runs_in_onnxruntime_at_two_lengths(case, tmp_path):
    call, layout = AXIAL_ONNX_CASES[case]
    if layout == "learned":
        torch.manual_seed(0)
        m = AxialRotaryEmbedding((4, 4), learned=True, num_heads=2)
    else:
        m = _axial(layout)
    length = torch.export.Dim("length", min=2, max=BIG)
    dyn = ({2: length}, {2: length}, {0: length}) + (({0: length},) if call == "cos_sin" else ())
    model = _Call(m, AXIAL_CALLS[call])
    run = _onnx_session(model, _axial_args(m, call, 6), dyn, tmp_path)
    for s in (5, 20) if call == "assume_valid" else (5, 40):
        args = _axial_args(m, call, s, seed=5)
        with torch.no_grad():
            _close_pairs(run(*args), model(*args))


# ---- AxialRotaryEmbedding (learned, RoPE-Mixed) ----------------------------------------------------


@pytest.mark.parametrize("seq_dim", [-2, 1])
def test_axial_learned_compiles_with_outputs_and_gradients_equal_to_eager(seq_dim):
    torch.manual_seed(0)
    m = AxialRotaryEmbedding((4, 4), learned=True, num_heads=2)

    def loss_and_grads(fn, s):
        q, k, pos = _axial_inputs(s, head_dim=8)
        if seq_dim == 1:
            q, k = q.transpose(1, 2), k.transpose(1, 2)                         # (B, S, H, D)
        q, k = q.requires_grad_(), k.requires_grad_()
        m.zero_grad(set_to_none=True)
        qr, kr = fn(q, k, pos)
        (qr.square().sum() + (kr * torch.linspace(-1, 1, kr.shape[-1])).sum()).backward()
        return qr.detach(), kr.detach(), q.grad, k.grad, m.freqs.grad.clone()

    eager = lambda q, k, p: m(q, k, positions=p, seq_dim=seq_dim)               # noqa: E731
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(eager, backend=counter, fullgraph=True, dynamic=True)
    first = None
    for s in (5, 9, 30):
        got, want = loss_and_grads(compiled, s), loss_and_grads(eager, s)
        for g, w in zip(got[:2], want[:2], strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)                    # the same float64 angles
        for g, w in zip(got[2:], want[2:], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)              # backward sums may reassociate
        first = counter.frame_count if first is None else first
    assert counter.frame_count == first


# ---- MultimodalRotaryEmbedding ---------------------------------------------------------------------


def _mrope():
    return MultimodalRotaryEmbedding(16, [2, 3, 3], max_seq_len=MROPE_TABLE)


def _mrope_positions(s, batch=None):
    t = torch.arange(s)
    pos = torch.stack([t, t // 2, t % 5], -1)                                    # (S, 3): t, h, w last
    return pos if batch is None else torch.stack([pos, pos.flip(0)])[:batch]     # (B, S, 3)


def _mrope_args(s, batch=None, seed=0):
    b = batch or 1
    return _randn(b, 2, s, 20, seed=seed), _randn(b, 1, s, 20, seed=seed + 1), _mrope_positions(s, batch)


MROPE_CALLS = {
    "positions": lambda m, q, k, p: m(q, k, positions=p),
    "assume_valid": lambda m, q, k, p: m(q, k, positions=p, assume_valid=True),
}


@pytest.mark.parametrize("batch", [None, 2], ids=["shared", "per_row"])
@pytest.mark.parametrize("call", list(MROPE_CALLS))
def test_mrope_compiles_in_one_graph_with_no_recompile_across_lengths(call, batch):
    m = _mrope()
    fn = lambda *a: MROPE_CALLS[call](m, *a)                                    # noqa: E731
    _close_pairs(torch.compile(fn, backend="aot_eager", fullgraph=True)(*_mrope_args(9, batch)),
                 fn(*_mrope_args(9, batch)))
    torch._dynamo.reset()
    lengths = (5, 9, 16) if call == "assume_valid" else (5, 9, 40)          # 40 leaves the table
    _dynamic_calls(fn, [_mrope_args(s, batch) for s in lengths], _close_pairs)


def test_mrope_text_positions_compile_with_an_offset():
    m = _mrope()
    fn = lambda q, k: m(q, k, offset=7)                                         # noqa: E731
    _dynamic_calls(fn, [_mrope_args(s)[:2] for s in (3, 9, 30)], _close_pairs)


@pytest.mark.parametrize("call", list(MROPE_CALLS))
def test_mrope_exports_with_a_dynamic_length(call):
    m = _mrope()
    length = torch.export.Dim("length", min=2, max=BIG)
    program = torch.export.export(_Call(m, MROPE_CALLS[call]), _mrope_args(6, 2),
                                  dynamic_shapes=({2: length}, {2: length}, {1: length}))
    _no_host_reads(program)
    for s in (3, 16) if call == "assume_valid" else (3, 40):
        args = _mrope_args(s, 2, seed=6)
        _close_pairs(program.module()(*args), MROPE_CALLS[call](m, *args))


def test_mrope_export_of_a_decode_step_with_a_shape_derived_offset():
    m = _mrope()
    step = _Call(m, lambda m, q, k, past: m(q, k, offset=past.shape[2]))      # the offset is a symbolic int
    q, k = _randn(1, 2, 1, 16), _randn(1, 1, 1, 16)
    past = torch.export.Dim("past", min=1, max=BIG)
    program = torch.export.export(step, (q, k, _randn(1, 1, 5, 16)),
                                  dynamic_shapes=(None, None, {2: past}))
    _no_host_reads(program)
    for n in (3, 15, 16, 40):
        _close_pairs(program.module()(q, k, _randn(1, 1, n, 16)), m(q, k, offset=n))


def test_mrope_onnx_runs_in_onnxruntime_at_two_lengths(tmp_path):
    m = _mrope()
    model = _Call(m, MROPE_CALLS["positions"])
    length = torch.export.Dim("length", min=2, max=BIG)
    run = _onnx_session(model, _mrope_args(6), ({2: length}, {2: length}, {0: length}), tmp_path)
    for s in (5, 40):
        args = _mrope_args(s, seed=7)
        with torch.no_grad():
            _close_pairs(run(*args), model(*args))


# ---- resize_position_embedding ---------------------------------------------------------------------

RESIZES = {
    "bicubic_antialias": dict(new_size=(5, 7), old_size=(3, 4), prefix_tokens=1),
    "bilinear_shrink": dict(new_size=(2, 3), old_size=(3, 4), prefix_tokens=1, mode="bilinear"),
    "nearest": dict(new_size=(5, 7), old_size=(3, 4), prefix_tokens=1, mode="nearest", antialias=False),
    "area": dict(new_size=(2, 2), old_size=(3, 4), prefix_tokens=1, mode="area", antialias=False),
    "1d_linear": dict(new_size=20, prefix_tokens=1, mode="linear"),
    "unchanged": dict(new_size=(3, 4), old_size=(3, 4), prefix_tokens=1),
}


@pytest.mark.parametrize(("name", "dtype"), [(n, torch.float32) for n in RESIZES]
                         + [("bicubic_antialias", torch.bfloat16), ("area", torch.bfloat16)])
def test_resize_compiles_bit_for_bit_and_once_across_channel_counts(name, dtype):
    fn = lambda t: resize_position_embedding(t, **RESIZES[name])               # noqa: E731
    table = _randn(1, 13, 8).to(dtype)
    assert torch.equal(torch.compile(fn, backend="aot_eager", fullgraph=True)(table), fn(table))
    torch._dynamo.reset()
    _dynamic_calls(fn, [(_randn(1, 13, c).to(dtype),) for c in (6, 8, 12)],
                   lambda got, want: torch.testing.assert_close(got, want, rtol=0, atol=0))


@pytest.mark.parametrize("name", list(RESIZES))
def test_resize_exports_with_a_dynamic_channel_count(name):
    channels = torch.export.Dim("channels", min=1, max=BIG)
    program = torch.export.export(_Call(None, lambda _, t: resize_position_embedding(t, **RESIZES[name])),
                                  (_randn(1, 13, 8),), dynamic_shapes=({2: channels},))
    for c in (3, 16):
        table = _randn(1, 13, c, seed=8)
        assert torch.equal(program.module()(table), resize_position_embedding(table, **RESIZES[name]))


def test_resize_gradients_under_compile_equal_eager():
    fn = lambda t: resize_position_embedding(t, (5, 7), old_size=(3, 4))        # noqa: E731
    grads = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        table = _randn(1, 13, 8).requires_grad_()
        (f(table) * torch.linspace(-1, 1, 8)).square().sum().backward()
        grads.append(table.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-6, atol=1e-6)


# ---- module mechanics: pickle, state_dict, meta device, bfloat16 -----------------------------------


def _learned():
    torch.manual_seed(0)
    return AxialRotaryEmbedding((4, 4), learned=True, num_heads=2)


def _rotate(m, x, positions):
    q, k = m(x, 0.5 * x.flip(-1), positions=positions)
    return torch.cat([q, k], -1)


MODULES = {   # name -> (factory, call(module, x), x, parameter names in state_dict)
    "sincos_nd": (lambda: SINCOS["2d_mae_cls"](), lambda m, x: m(x), lambda: _randn(2, 7, 8), set()),
    "axial": (_axial, lambda m, x: _rotate(m, x, _axial_inputs(30)[2]), lambda: _randn(1, 2, 30, 10), set()),
    "axial_half": (lambda: _axial("half"), lambda m, x: _rotate(m, x, _axial_inputs(12)[2]),
                   lambda: _randn(1, 2, 12, 10), set()),
    "axial_learned": (_learned, lambda m, x: _rotate(m, x, _axial_inputs(12)[2]), lambda: _randn(1, 2, 12, 8),
                      {"freqs"}),
    "mrope": (_mrope, lambda m, x: _rotate(m, x, _mrope_positions(40)), lambda: _randn(1, 2, 40, 20), set()),
    "mrope_in_table": (_mrope, lambda m, x: _rotate(m, x, _mrope_positions(12)), lambda: _randn(1, 2, 12, 20),
                       set()),
}


def _same_buffers(got, want):
    got, want = dict(got.named_buffers()), dict(want.named_buffers())
    assert set(got) == set(want)
    for n, b in want.items():
        assert got[n].dtype == b.dtype and torch.equal(got[n], b), n


@pytest.mark.parametrize("name", list(MODULES))
def test_pickle_deepcopy_and_state_dict_hold_no_tables(name):
    factory, call, x, params = MODULES[name]
    m, x = factory(), x()
    with torch.no_grad():
        want = call(m, x)
        for clone in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
            assert torch.equal(call(clone, x), want)
    state = m.state_dict()
    assert set(state) == params                                          # tables never enter a checkpoint
    buf = io.BytesIO()
    torch.save(state, buf)
    torch.manual_seed(123)                                               # another draw for a learned module
    fresh = factory()
    fresh.load_state_dict(torch.load(io.BytesIO(buf.getvalue())), strict=True)
    with torch.no_grad():
        assert torch.equal(call(fresh, x), want)


@pytest.mark.parametrize("name", list(MODULES))
def test_meta_construction_then_to_empty_and_reset_equals_eager(name):
    factory, call, x, _ = MODULES[name]
    m, x = factory(), x()
    with torch.device("meta"):
        meta = factory()
    assert all(b.is_meta for b in meta.buffers())
    meta = meta.to_empty(device="cpu")
    meta.reset_buffers()
    meta.load_state_dict(m.state_dict(), strict=True)                    # a learned module's parameter
    _same_buffers(meta, m)
    with torch.no_grad():
        assert torch.equal(call(meta, x), call(m, x))


@pytest.mark.parametrize("name", [n for n in MODULES if n != "axial_learned"])
def test_to_bfloat16_keeps_the_tables_and_autocast_changes_nothing(name):
    factory, call, x, _ = MODULES[name]
    m, x = factory(), x()
    with torch.no_grad():
        want = call(m, x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.equal(call(m, x), want)                         # angles never drop to bfloat16
        converted = copy.deepcopy(m).to(torch.bfloat16)
        _same_buffers(converted, m)                                      # same precision, same values
        assert torch.equal(call(converted, x.bfloat16()), call(m, x.bfloat16()))


def test_learned_to_bfloat16_rounds_only_the_parameter():
    m = _learned()
    converted = copy.deepcopy(m).to(torch.bfloat16)
    assert converted.freqs.dtype == torch.bfloat16
    _same_buffers(converted, m)
    x, pos = _randn(1, 2, 12, 8), grid_positions((3, 4))
    with torch.no_grad():                                                # angles from the rounded frequencies
        m.freqs.copy_(converted.freqs.float())
        torch.testing.assert_close(_rotate(converted, x.bfloat16(), pos), _rotate(m, x.bfloat16(), pos),
                                   rtol=0, atol=0)
