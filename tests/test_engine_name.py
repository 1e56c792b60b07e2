"""One name per concept: ``engine=`` chooses what rotates q and k (``"auto"``, ``"torch"``,
``"triton"``), everywhere; ``backend=`` is only ``posenc.attention``'s attention implementation
(``"sdpa"``, ``"flex"``).  The rotary ``backend=`` still works for one release, with a
``DeprecationWarning`` naming ``engine=``; both together raise ``TypeError``."""

import inspect
import warnings

import pytest

torch = pytest.importorskip("torch")

import posenc  # noqa: E402
from posenc._deprecate import UNSET  # noqa: E402
from posenc._torch.engine_choice import ROPE_ENGINES  # noqa: E402
from posenc.attn import ATTENTION_BACKENDS  # noqa: E402


def _public_signatures():
    """``(name, signature)`` of every public function and of the constructors and builders of every
    public class of ``posenc``, ``posenc.functional`` and the transformers adapter."""
    import posenc.functional as F
    import posenc.integrations.transformers as T

    out = []
    for module in (posenc, F, T):
        for name in module.__all__:
            obj = getattr(module, name)
            members = [getattr(obj, m) for m in ("__init__", "from_hf_config", "forward", "rotate", "cos_sin")
                       if m in vars(obj)] if inspect.isclass(obj) else [obj]
            for fn in members:
                if callable(fn):
                    try:
                        out.append((f"{module.__name__}.{name}", inspect.signature(fn)))
                    except (TypeError, ValueError):
                        pass
    return out


SIGNATURES = _public_signatures()


def test_engine_means_the_rotation_engine_everywhere():
    with_engine = [(name, sig.parameters["engine"].default) for name, sig in SIGNATURES if "engine" in sig.parameters]
    assert len(with_engine) >= 12, with_engine
    for name, default in with_engine:
        assert default in (*ROPE_ENGINES, None) and default == "auto", (name, default)


def test_backend_means_the_attention_implementation_or_is_the_deprecated_alias():
    for name, sig in SIGNATURES:
        if "backend" not in sig.parameters:
            continue
        default = sig.parameters["backend"].default
        if default is UNSET:                       # the rotary keyword's old name, beside engine=
            assert "engine" in sig.parameters, name
        else:
            assert default in ATTENTION_BACKENDS and "engine" not in sig.parameters, (name, default)


_GEN = torch.Generator().manual_seed(0)
_Q, _K = torch.randn(1, 2, 3, 8, generator=_GEN), torch.randn(1, 2, 3, 8, generator=_GEN)


def _calls(**kw):
    q, k = _Q.clone(), _K.clone()
    cos, sin = posenc.functional.rope_cos_sin(torch.arange(8), posenc.rope_inv_freq(8)[0])
    w = torch.ones(8)
    return {
        "apply_rope": lambda: posenc.apply_rope(q, cos[:3], sin[:3], **kw),
        "apply_rope_qk": lambda: posenc.apply_rope_qk(q, k, cos, sin, **kw),
        "rms_norm_rope_qk": lambda: posenc.rms_norm_rope_qk(q, k, w, w, cos, sin, **kw),
        "RotaryEmbedding": lambda: posenc.RotaryEmbedding(8, max_seq_len=8, **kw)(q, k),
        "AxialRotaryEmbedding": lambda: posenc.AxialRotaryEmbedding((4, 4), **kw)(
            q, k, positions=torch.zeros(3, 2, dtype=torch.long)),
    }


@pytest.mark.parametrize("name", list(_calls()))
def test_the_old_keyword_warns_and_gives_the_same_result(name):
    new = _calls(engine="torch")[name]()
    with pytest.warns(DeprecationWarning, match="backend= is deprecated.*pass engine= instead"):
        old = _calls(backend="torch")[name]()
    for a, b in zip(new if isinstance(new, tuple) else (new,), old if isinstance(old, tuple) else (old,),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(TypeError, match="pass engine= only"):
        _calls(engine="triton", backend="torch")[name]()


@pytest.mark.parametrize("module", [lambda: posenc.RotaryEmbedding(8), lambda: posenc.AxialRotaryEmbedding((4, 4)),
                                    lambda: posenc.MultimodalRotaryEmbedding(16, mrope_section=(2, 3, 3))])
def test_the_old_attribute_warns_and_reads_the_engine(module):
    m = module()
    with pytest.warns(DeprecationWarning, match=r"\.backend is deprecated.*read \.engine"):
        assert m.backend == m.engine == "auto"


def test_a_bad_engine_names_the_keyword():
    with pytest.raises(ValueError, match="engine must be one of"):
        posenc.RotaryEmbedding(8, engine="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ValueError, match="engine must be one of"):
            posenc.RotaryEmbedding(8, backend="cuda")
