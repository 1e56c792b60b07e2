"""The inverse rotation and the trailing rotary slice on the fused Triton RoPE kernel, run on CPU
tensors through Triton's interpreter (TRITON_INTERPRET=1), forward and backward, eager and traced,
against the torch engine (itself checked against a float64 oracle in tests/test_rope_inverse_slice.py)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before Triton decorates the kernel

import itertools  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")

import posenc  # noqa: E402
from posenc.functional import rope as R  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("TRITON_INTERPRET was set to something other than 1 before this module", allow_module_level=True)

ROT, D = 8, 12


def tables(rows=32, dim=ROT):
    return R.rope_cos_sin(torch.arange(rows), R.rope_inv_freq(dim)[0])


def close(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=2e-6)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim", [1, 2])
def test_forward_matches_the_torch_engine(layout, seq_dim):
    torch.manual_seed(0)
    cos, sin = tables()
    shape, kshape = ((2, 5, 3, D), (2, 5, 1, D)) if seq_dim == 1 else ((2, 3, 5, D), (2, 1, 5, D))
    q, k = torch.randn(shape), torch.randn(kshape)
    for inverse, last, inplace, at in itertools.product(
            (False, True), ("first", "last"), (False, True), (dict(offset=7), dict(positions=torch.tensor([4, 0, 31, 2, 2])))):
        kw = dict(layout=layout, seq_dim=seq_dim, inverse=inverse, rotary_slice=last, **at)
        want = R.apply_rope_qk(q, k, cos, sin, engine="torch", **kw)
        q2, k2 = q.clone(), k.clone()
        for _ in range(2):                                            # the second call runs the first one's plan
            got = R.apply_rope_qk(q2 if inplace else q, k2 if inplace else k, cos, sin, engine="triton",
                                  inplace=inplace, **kw)
            if inplace:
                assert got[0] is q2 and got[1] is k2
                close(q2, want[0])
                q2, k2 = q.clone(), k.clone()
            else:
                close(got[0], want[0])
                close(got[1], want[1])


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_backward_is_the_opposite_rotation(layout):
    torch.manual_seed(1)
    cos, sin = tables()
    gq, gk = torch.randn(2, 3, 7, D), torch.randn(2, 1, 7, D)
    for inverse, last in itertools.product((False, True), ("first", "last")):
        q = torch.randn(2, 3, 7, D, requires_grad=True)
        k = torch.randn(2, 1, 7, D, requires_grad=True)
        kw = dict(offset=2, layout=layout, inverse=inverse, rotary_slice=last)
        torch.autograd.backward(R.apply_rope_qk(q, k, cos, sin, engine="triton", **kw), [gq, gk])
        close(q.grad, R.apply_rope_qk(gq, None, cos, sin, engine="torch", **{**kw, "inverse": not inverse})[0])
        close(k.grad, R.apply_rope_qk(gk, None, cos, sin, engine="torch", **{**kw, "inverse": not inverse})[0])


def test_traced_custom_op_forward_and_backward():
    torch.manual_seed(2)
    cos, sin = tables()
    q = torch.randn(1, 2, 5, D, requires_grad=True)
    g = torch.randn(1, 2, 5, D)

    def f(q):
        return R.apply_rope_qk(q, None, cos, sin, offset=3, inverse=True, rotary_slice="last", engine="triton")[0]

    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True, backend="aot_eager")(q)
    want = R.apply_rope_qk(q.detach(), None, cos, sin, offset=3, inverse=True, rotary_slice="last", engine="torch")[0]
    close(out, want)
    out.backward(g)
    close(q.grad, R.apply_rope_qk(g, None, cos, sin, offset=3, rotary_slice="last", engine="torch")[0])


def test_packed_batch_and_module():
    torch.manual_seed(3)
    cos, sin = tables()
    q, k = torch.randn(9, 2, D), torch.randn(9, 1, D)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    for inverse in (False, True):
        kw = dict(cu_seqlens=cu, inverse=inverse, rotary_slice="last")
        for a, b in zip(R.apply_rope_qk(q, k, cos, sin, engine="triton", **kw),
                        R.apply_rope_qk(q, k, cos, sin, engine="torch", **kw), strict=True):
            close(a, b)
    x = torch.randn(1, 2, 6, D)
    rope_t = posenc.RotaryEmbedding(ROT, max_seq_len=32, layout="interleaved", rotary_slice="last", engine="triton")
    rope_r = posenc.RotaryEmbedding(ROT, max_seq_len=32, layout="interleaved", rotary_slice="last", engine="torch")
    for inverse in (False, True):
        close(rope_t(x, offset=5, inverse=inverse)[0], rope_r(x, offset=5, inverse=inverse)[0])


def test_deepseek_v4_patched_on_the_kernel(monkeypatch):
    """patch_model(engine="triton"): DeepSeek-V4's rotations of q and KV (trailing slice) and the
    inverse rotation of its output run on the kernel, none through the model's own function, and the
    patched model equals the unpatched one."""
    pytest.importorskip("transformers")
    import sys

    from posenc.integrations.transformers import patch_model, unpatch_model
    from posenc.kernels import triton_launch
    from tests import hf_zoo

    model = hf_zoo.build("deepseek_v4")
    want = hf_zoo.run(model, steps=2)
    patch_model(model, engine="triton")
    launches = []
    for name in ("__call__", "fallback"):
        method = getattr(triton_launch.Launch, name)
        monkeypatch.setattr(triton_launch.Launch, name,
                            lambda self, *a, _m=method: launches.append(1) or _m(self, *a))
    stand_in = sys.modules[type(model.model.rotary_emb).__module__].apply_rotary_pos_emb
    original, calls = stand_in.original, []
    monkeypatch.setattr(stand_in, "original", lambda *a, **k: calls.append(1) or original(*a, **k))
    got = hf_zoo.run(model, steps=2)
    assert not calls and launches
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-5)
    assert got[2] == want[2]
    monkeypatch.undo()
    unpatch_model(model)
