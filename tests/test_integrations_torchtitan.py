"""posenc's RoPE inside torchtitan models, against torchtitan's own modules (skipped without torchtitan).

torchtitan is the truth here: its ``ComplexRoPE`` / ``CosSinRoPE`` built from every Llama 3, Qwen 3 and
DeepSeek-V3 configuration it registers, its models trained for a few steps on CPU (float32 losses equal to
1e-5), its context-parallel input sharding, DTensor queries, and its own tensor-parallel Llama on gloo
processes.  The FlexAttention backend of its language models has no backward on CPU, so the models here
attend with its ``ScaledDotProductAttention`` (a causal mask, which is what the training batches need).
torchtitan's trainer itself needs its repository's test dataset and tokenizer, which its package does not
ship, so the training loops here are written out (AdamW or SGD, cross-entropy)."""

from __future__ import annotations

import copy
import dataclasses
import importlib

import pytest
import torch

import posenc
from posenc.distributed import shard_indices
from tests.processes import run_ranks

titan = pytest.importorskip("torchtitan")
tt = pytest.importorskip("posenc.integrations.torchtitan")
from torchtitan.models.common.attention import ScaledDotProductAttention  # noqa: E402
from torchtitan.models.common.rope import ComplexRoPE, CosSinRoPE, RoPE  # noqa: E402

FAMILIES = ("llama3", "qwen3", "deepseek_v3")
# DeepSeek-V3's MoE router asks for a float32 autocast region, which CPU autocast declines with a warning
pytestmark = pytest.mark.filterwarnings("ignore:In CPU autocast:UserWarning")


#: every family registered with ComplexRoPE / CosSinRoPE configurations (YaRN truncated and not, Llama 3, plain)
SWEEP = (*FAMILIES, "gpt_oss", "kimi_k2_7", "muse_glimmer")


def _configs(family: str):
    """Every flavor's model configuration torchtitan registers for ``family``."""
    mod = importlib.import_module(f"torchtitan.models.{family}")
    table = next(v for k, v in vars(mod).items() if k.endswith("_configs") and isinstance(v, dict))
    return {flavor: mod.model_registry(flavor).model for flavor in table}


def _rope_configs():
    seen = {}
    for family in SWEEP:
        for flavor, cfg in _configs(family).items():
            for _, rope, _, _ in cfg.traverse(RoPE.Config):
                seen.setdefault(repr(rope), (f"{family}-{flavor}", rope))
    return list(seen.values())


ROPE_CONFIGS = _rope_configs()


def _ours(cfg):
    """The PosencRoPE configuration standing for a torchtitan RoPE configuration (what the overrides give)."""
    return tt._replacement(cfg, "auto")


@pytest.mark.slow
def test_every_registered_configuration_is_read_and_checked_against_torchtitans_module():
    """Building a PosencRoPE runs the check against torchtitan's module built from the same configuration;
    here it is repeated by hand with a tighter bound on the largest difference."""
    names = {name.split("-")[0] for name, _ in ROPE_CONFIGS}
    assert names == set(SWEEP), names
    kinds = {(type(cfg).__qualname__, cfg.scaling, cfg.truncate) for _, cfg in ROPE_CONFIGS}
    assert {("ComplexRoPE.Config", "llama", True), ("ComplexRoPE.Config", "yarn", True),
            ("CosSinRoPE.Config", "yarn", False), ("CosSinRoPE.Config", "none", True)} <= kinds, kinds
    for name, cfg in ROPE_CONFIGS:
        small = dataclasses.replace(cfg, max_seq_len=min(cfg.max_seq_len, 1 << 15))
        new = _ours(small).build()
        ref = small.build()
        pos = torch.tensor([[0, 1, 2, 17, 1000, small.max_seq_len - 1]])
        q = torch.rand(1, 6, 2, cfg.dim) * 2 - 1
        k = torch.rand(1, 6, 1, cfg.dim) * 2 - 1
        got, want = new(q, k, pos), ref(q, k, pos)
        # torchtitan rounds theta_i and each angle p * theta_i (<= p radians) to float32: a few ulps of p
        # radians, times |pair| <= sqrt(2), plus the rounding of cos, sin and the products
        bound = (2.0 ** -24 * (16 + 8 * pos[0].double()))[None, :, None, None]
        for g, w in zip(got, want, strict=True):
            err = (g.double() - w.double()).abs() / bound
            assert err.max() <= 1.0, (name, float(err.max()))


def test_the_configuration_is_read_as_the_paper_rules_say():
    """The mapping itself, written out: Llama 3 scaling for ComplexRoPE 'llama', YaRN as a pure rotation
    (torchtitan puts its temperature in the softmax scale), no rule for YaRN with rope_factor <= 1."""
    llama = ComplexRoPE.Config(dim=64, max_seq_len=256, theta=500000.0, scaling="llama")
    rope = tt.rope_from_config(llama)
    assert (rope.dim, rope.base, rope.layout, rope.max_seq_len) == (64, 500000.0, "interleaved", 256)
    assert rope.scaling == posenc.Llama3Scaling(8.0, 8192, low_freq_factor=1.0, high_freq_factor=4.0)
    yarn = ComplexRoPE.Config(dim=64, max_seq_len=256, scaling="yarn", rope_factor=40.0, original_seq_len=4096)
    rope = tt.rope_from_config(yarn)
    assert rope.scaling == posenc.YarnScaling(40.0, 4096, attention_factor_override=1.0, truncate=True)
    assert rope.attention_factor == 1.0
    plain = tt.rope_from_config(CosSinRoPE.Config(dim=16, max_seq_len=32, scaling="yarn", rope_factor=1.0))
    assert plain.scaling is None and plain.layout == "half"


def _tiny(family: str, layers: int = 2, seq: int = 64):
    """torchtitan's debug model of ``family``, ``layers`` deep, attending with SDPA (causal)."""
    mod = importlib.import_module(f"torchtitan.models.{family}")
    cfg = mod.model_registry("debugmodel").model
    cfg.layers = cfg.layers[:layers]
    for layer in cfg.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
        layer.attention.rope = dataclasses.replace(layer.attention.rope, max_seq_len=seq)
    return cfg


def _materialize(cfg):
    with torch.device("meta"):
        model = cfg.build()
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_states(buffer_device=torch.device("cpu"))
    return model


def _train(model, steps: int = 4, seq: int = 64) -> list[float]:
    g = torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    tokens = torch.randint(0, 2048, (2, seq + 1), generator=g)     # one batch, learnt step by step
    for _ in range(steps):
        positions = torch.arange(seq)[None].expand(2, -1)
        logits = model(tokens[:, :-1], positions=positions)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_a_tiny_model_trains_with_posencs_rope_to_torchtitans_losses(family):
    cfg = _tiny(family)
    ours = copy.deepcopy(cfg)
    replaced = tt.use_posenc_rope(ours, engine="torch")
    assert replaced == ["layers.0.attention.rope", "layers.1.attention.rope"]
    theirs_model, ours_model = _materialize(cfg), _materialize(ours)
    assert type(ours_model.layers["0"].attention.rope) is tt.PosencRoPE
    # the same parameters, and no new state-dict keys (the tables are non-persistent, as torchtitan's cache)
    theirs_state, ours_state = theirs_model.state_dict(), ours_model.state_dict()
    assert list(theirs_state) == list(ours_state)
    for key in theirs_state:
        assert torch.equal(theirs_state[key], ours_state[key]), key
    want, got = _train(theirs_model), _train(ours_model)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=0)
    assert got[-1] < got[0]                                           # it learns


def test_meta_device_build_then_init_states_gives_the_eager_tables():
    """Built on the meta device, moved with to_empty and initialised by torchtitan's init_states (as its
    trainer does), the tables equal a module built directly on the CPU: nothing left uninitialised."""
    cfg = tt.PosencRoPE.Config(dim=16, max_seq_len=64, theta=500000.0, scaling="llama")
    eager = cfg.build()
    with torch.device("meta"):
        late = cfg.build()
    assert late.rope.packed_table.is_meta
    late.to_empty(device="cpu")
    late.init_states(buffer_device=torch.device("cpu"))
    for name, buf in eager.rope.named_buffers():
        assert torch.equal(dict(late.rope.named_buffers())[name], buf), name
    assert late.rope.inv_freq_table[0] == 1.0


def test_patch_model_replaces_a_built_models_modules_and_keeps_its_outputs():
    torch.manual_seed(0)
    model = _materialize(_tiny("llama3"))
    tokens = torch.randint(0, 2048, (2, 64))
    positions = torch.arange(64)[None].expand(2, -1)
    before = model(tokens, positions=positions)
    assert tt.patch_model(model, engine="torch") == ["layers.0.attention.rope", "layers.1.attention.rope"]
    after = model(tokens, positions=positions)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
    # per-document positions (packed batches): posenc rotates at exactly the positions torchtitan passes
    packed = torch.cat([torch.arange(20), torch.arange(44)])[None].expand(2, -1)
    rope = model.layers["0"].attention.rope
    q, k = torch.randn(2, 64, 4, 16), torch.randn(2, 64, 2, 16)
    ref = ComplexRoPE.Config(dim=16, max_seq_len=64, theta=500000, scaling="llama").build()
    for g, w in zip(rope(q, k, packed), ref(q, k, packed), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)


@pytest.mark.parametrize("cls, layout", [(ComplexRoPE, "interleaved"), (CosSinRoPE, "half")])
def test_bfloat16_outputs_are_torchtitans_to_one_rounding_and_nearer_the_exact_rotation(cls, layout):
    """torchtitan rotates in float32 and rounds once to bfloat16, as posenc does; its float32 angles move a
    few results across a rounding boundary.  Where the two differ (by one bfloat16 ulp at most), posenc's
    result is the nearer one to the float64 rotation more often than not."""
    cfg = cls.Config(dim=64, max_seq_len=2048, theta=5e5)
    ours = _ours(cfg).build()
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 2048, 4, 64, generator=g).bfloat16(), torch.randn(2, 2048, 2, 64, generator=g).bfloat16()
    exact = ours.rope(q.double(), k.double(), seq_dim=1)

    def ulp(x):                                                        # of bfloat16 (8 significant bits)
        return torch.exp2(torch.floor(torch.log2(x.clamp_min(2.0 ** -126))) - 7)

    def pair_norm(x):                                                  # |(x_a, x_b)| of each feature's pair
        x = x.double()
        if layout == "half":
            a, b = x.chunk(2, -1)
            n = (a * a + b * b).sqrt()
            return torch.cat([n, n], -1)
        return x.unflatten(-1, (-1, 2)).norm(dim=-1).repeat_interleave(2, -1)

    for got, want, best, x in zip(ours(q, k), cfg.build()(q, k), exact, (q, k), strict=True):
        assert got.dtype == want.dtype == torch.bfloat16
        # one rounding of the result, plus one of the pair's scale (a small result of a large pair)
        bound = ulp(torch.maximum(got.double().abs(), want.double().abs())) + ulp(pair_norm(x))
        assert ((got.double() - want.double()).abs() <= bound).all()
        ours_err, theirs_err = (got.double() - best).abs(), (want.double() - best).abs()
        assert int((ours_err < theirs_err).sum()) > int((ours_err > theirs_err).sum())


def test_a_call_runs_exactly_posencs_rotation_and_reads_nothing_back():
    """The wrapper adds no tensor work: the same aten operators as posenc's module called directly with the
    promise torchtitan's bounds check makes, none of which copies a value to the host."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    rope = tt.PosencRoPE.Config(dim=16, max_seq_len=64, theta=5e5, scaling="llama", engine="torch").build()
    q, k, pos = torch.randn(2, 8, 4, 16), torch.randn(2, 8, 2, 16), torch.arange(8)[None].expand(2, -1)
    rope(q, k, pos)                                     # the first call validates and plans; later ones reuse it
    with Ops() as wrapped:
        rope(q, k, pos)
    with Ops() as direct:
        rope.rope(q, k, positions=pos, seq_dim=1, assume_valid=True)
    assert wrapped.ops == direct.ops and wrapped.ops
    assert not {"_local_scalar_dense", "item", "is_nonzero", "equal"} & set(wrapped.ops), wrapped.ops


@pytest.mark.slow
def test_compiled_and_eager_calls_agree_bit_for_bit():
    rope = tt.PosencRoPE.Config(dim=16, max_seq_len=64, theta=5e5, scaling="llama", engine="torch").build()
    q, k, pos = torch.randn(2, 8, 4, 16), torch.randn(2, 8, 2, 16), torch.arange(8)[None].expand(2, -1)
    compiled = torch.compile(rope, fullgraph=True)
    for positions in (pos, None):
        for got, want in zip(compiled(q, k, positions), rope(q, k, positions), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_module_that_does_not_match_its_configuration_is_refused():
    """A torchtitan module whose cache was never initialised (a meta-device build moved with to_empty, no
    init_states) differs from its configuration: patch_model says so instead of replacing it silently."""
    model = _tiny("qwen3")
    with torch.device("meta"):
        built = model.build()
    built.to_empty(device="cpu")
    with torch.no_grad():
        for m in built.modules():
            if isinstance(m, RoPE):
                m.cache.fill_(0.5)
    with pytest.raises(ValueError, match=r"layers\.0\.attention\.rope: PosencRoPE does not reproduce torchtitan's "
                                         r"CosSinRoPE .* differs at position"):
        tt.patch_model(built)


def test_a_misread_configuration_is_caught_at_construction(monkeypatch):
    """The check is generic: if posenc read a field wrongly (here: the Llama 3 rule dropped), building fails."""
    monkeypatch.setattr(tt, "_scaling", lambda config: None)
    monkeypatch.setattr(tt, "_VERIFIED", set())
    cfg = ComplexRoPE.Config(dim=16, max_seq_len=20000, theta=500000.0, scaling="llama")
    with pytest.raises(ValueError, match=r"does not reproduce torchtitan's ComplexRoPE .* scaling='llama'.* differs at position \d+"):
        _ours(cfg).build()


def test_overrides_are_registered_and_derive_the_configuration():
    from torchtitan.config.override import _REGISTRY

    for name, cls, layout in (("posenc_complex_rope", ComplexRoPE.Config, "interleaved"),
                              ("posenc_cos_sin_rope", CosSinRoPE.Config, "half")):
        entry = _REGISTRY[f"posenc.integrations.torchtitan.{name}"]
        assert entry.target_cls is cls and entry.exact
        new = getattr(tt, name)(cls(dim=32, max_seq_len=128, theta=1e6))
        assert isinstance(new, tt.PosencRoPE.Config) and new.layout == layout and new.theta == 1e6


class SectionedRoPE(CosSinRoPE):
    """A RoPE subclass with rules of its own (as a multimodal RoPE has): not posenc's to replace."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(CosSinRoPE.Config):
        sections: tuple[int, ...] = ()


def test_bad_inputs_are_refused_with_the_reason():
    with pytest.raises(TypeError, match="model_config must be a torchtitan model configuration"):
        tt.use_posenc_rope(object())
    with pytest.raises(ValueError, match="engine must be one of"):
        tt.use_posenc_rope(_tiny("llama3"), engine="cuda")
    with pytest.raises(ValueError, match="scaling='ntk' is not one posenc reads"):
        tt.rope_from_config(ComplexRoPE.Config(dim=8, max_seq_len=8, scaling="ntk"))
    with pytest.raises(ValueError, match="CosSinRoPE refuses scaling='llama'"):
        tt.rope_from_config(CosSinRoPE.Config(dim=8, max_seq_len=8, scaling="llama"))
    cfg = _tiny("qwen3")
    cfg.layers[1].attention.rope = SectionedRoPE.Config(dim=128, max_seq_len=64, sections=(2, 3, 3))
    with pytest.raises(ValueError, match=r"layers\.1\.attention\.rope: .*SectionedRoPE.Config is not a torchtitan "
                                         r"rotary configuration posenc replaces"):
        tt.use_posenc_rope(cfg)
    assert tt.use_posenc_rope(cfg, fqns=["layers.0.*"]) == ["layers.0.attention.rope"]
    with pytest.raises(ValueError, match="holds no torchtitan RoPE configuration matching"):
        tt.use_posenc_rope(cfg, fqns=["nothing"])
    with pytest.raises(ValueError, match="holds no torchtitan RoPE module"):
        tt.patch_model(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="layout must be one of"):
        tt.PosencRoPE.Config(dim=8, max_seq_len=8, layout="neox").build()
    with pytest.raises(TypeError, match="verify must be a bool"):
        tt.PosencRoPE.Config(dim=8, max_seq_len=8, verify="yes").build()
    with pytest.raises(ValueError, match="engine must be one of"):
        tt.PosencRoPE.Config(dim=8, max_seq_len=8, engine="cuda").build()
    with pytest.raises(ValueError, match=r"dim \(the rotary dim\) must be even"):
        tt.PosencRoPE.Config(dim=7, max_seq_len=8).build()
    rope = tt.PosencRoPE.Config(dim=8, max_seq_len=8).build()
    with pytest.raises(TypeError, match="plain tensor while the other is a DTensor"):
        tt._rotate_dtensors(rope.rope, torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), None)
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 8\)"):
        rope(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8), torch.tensor([[7, 8]]))


# ---- context parallelism (torchtitan's input sharding) and tensor parallelism (DTensor) on gloo --------


def _parallel_worker(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torchtitan.distributed.context_parallel.api import cp_shard

    mesh = init_device_mesh("cpu", (world,))
    cfg = ComplexRoPE.Config(dim=16, max_seq_len=128, theta=500000.0, scaling="llama",
                             original_max_position_embeddings=32)
    ref = cfg.build()
    ours = _ours(cfg).build()
    g = torch.Generator().manual_seed(0)
    S = 16 * world
    q, k = torch.randn(2, S, 4, 16, generator=g), torch.randn(2, S, 2, 16, generator=g)
    packed = torch.cat([torch.arange(S // 4), torch.arange(S - S // 4)])[None].expand(2, -1).contiguous()
    full_q, full_k = ours(q, k, packed)
    checks = 0
    # context parallelism: torchtitan shards (inputs, labels, positions) with torch's head-tail balancer
    for balancer in ("headtail", None):
        idx = torch.arange(S)[None].expand(2, -1).contiguous()
        (sq, sk, spos, sidx), _ = cp_shard(mesh, (q, k, packed, idx), None, balancer)
        want_idx = shard_indices(S, rank, world,
                                 load_balance="zigzag" if balancer else "contiguous")
        assert torch.equal(sidx[0], want_idx)
        got_q, got_k = ours(sq, sk, spos)
        torch.testing.assert_close(got_q, full_q[:, want_idx], rtol=0, atol=0)
        torch.testing.assert_close(got_k, full_k[:, want_idx], rtol=0, atol=0)
        for a, b in zip((got_q, got_k), ref(sq, sk, spos), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        checks += 1
    # tensor parallelism: heads sharded (Shard(2)), positions a plain tensor, as torchtitan passes them
    dq, dk = distribute_tensor(q, mesh, [Shard(2)]), distribute_tensor(k, mesh, [Shard(2)])
    out_q, out_k = ours(dq, dk, packed)
    assert out_q.placements == (Shard(2),) and out_q.shape == q.shape
    torch.testing.assert_close(out_q.full_tensor(), full_q, rtol=0, atol=0)
    torch.testing.assert_close(out_k.full_tensor(), full_k, rtol=0, atol=0)
    # (torchtitan's own module takes DTensors only on the named dp/cp/tp mesh its trainer builds; the
    # unsharded result, compared with torchtitan's above, is the reference here)
    # gradients flow through the DTensor wrapping
    dq_leaf = distribute_tensor(q, mesh, [Shard(2)]).requires_grad_()
    ours(dq_leaf, dk, packed)[0].sum().backward()
    leaf = q.clone().requires_grad_()
    ours(leaf, k, packed)[0].sum().backward()
    torch.testing.assert_close(dq_leaf.grad.full_tensor(), leaf.grad, rtol=0, atol=1e-6)
    checks += 1
    # replicated inputs rotate whole; a shard of the head features is refused on every rank
    rep_q, _ = ours(distribute_tensor(q, mesh, [Replicate()]), distribute_tensor(k, mesh, [Replicate()]), packed)
    torch.testing.assert_close(rep_q.to_local(), full_q, rtol=0, atol=0)
    try:
        ours(distribute_tensor(q, mesh, [Shard(3)]), distribute_tensor(k, mesh, [Shard(3)]), packed)
    except ValueError as err:
        assert "sharded over its head features" in str(err), err
        checks += 1
    return checks


@pytest.mark.slow
@pytest.mark.parametrize("world", [2])
def test_torchtitans_context_parallel_shards_and_tensor_parallel_dtensors(world, tmp_path):
    assert run_ranks(_parallel_worker, world, tmp_path) == ["4"] * world


def _tensor_parallel_worker(rank, world):
    """torchtitan's own tensor parallelism (its ``parallelize`` with the partial-DTensor backend): the
    attention's queries and keys reach the RoPE module as DTensors sharded over heads.  Two CPU-only
    adjustments: torchtitan builds its meshes for CUDA when no accelerator is found (set to CPU here), and
    DTensor's random-number tracker cannot seed a CPU mesh (the initial weights are then drawn per rank
    from the same seed, which is all the comparison needs)."""
    import torch.distributed.tensor._dispatch as dispatch
    import torchtitan.distributed.parallel_dims as parallel_dims
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config

    parallel_dims.device_type = "cpu"
    dispatch.is_rng_supported_mesh = lambda mesh: False
    dims = parallel_dims.ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=world, pp=1, ep=1, world_size=world,
                                      spmd_backend="partial_dtensor")
    dims.build_mesh()
    seen = []
    rotate = tt._rotate_dtensors

    def spy(rope, query, key, positions):
        seen.append(tuple(query.placements))
        return rotate(rope, query, key, positions)

    tt._rotate_dtensors = spy
    losses = {}
    for name in ("torchtitan", "posenc"):
        cfg = _tiny("llama3")
        if name == "posenc":
            tt.use_posenc_rope(cfg, engine="torch")
        set_llama3_sharding_config(cfg, enable_sp=False)
        with torch.device("meta"):
            model = cfg.build()
        model.parallelize(dims)
        model.to_empty(device="cpu")
        torch.manual_seed(0)
        model.init_states(buffer_device=torch.device("cpu"))
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, 2048, (2, 65), generator=g)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses[name] = []
        for _ in range(2):
            logits = model(tokens[:, :-1], positions=torch.arange(64)[None].expand(2, -1))
            logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
    from torch.distributed.tensor import Shard

    assert seen and all(p == (Shard(2),) for p in seen), seen       # DTensor queries, heads sharded
    torch.testing.assert_close(torch.tensor(losses["posenc"]), torch.tensor(losses["torchtitan"]), rtol=1e-5, atol=0)
    return len(seen)


@pytest.mark.slow
def test_torchtitans_tensor_parallel_llama_gives_its_losses_with_posencs_rope(tmp_path):
    assert run_ranks(_tensor_parallel_worker, 2, tmp_path) == ["4", "4"]
