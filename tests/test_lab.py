"""posenc.lab: TinyTransformer, the corpus, posenc compare / plot / list."""

import json
import pathlib

import pytest
import torch

import posenc
from posenc.cli import main
from posenc.lab import TinyTransformer, list_encodings
from posenc.lab.corpus import stdlib_corpus, stdlib_files
from posenc.lab.experiment import CompareConfig, compare, position_task

NAMES = [e.name for e in list_encodings()]


def test_registry_and_public_listing():
    assert NAMES == ["none", "sinusoidal", "learned", "rope", "alibi", "t5"]
    assert "list_encodings" not in posenc.__all__                       # lab code stays out of the root


@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_causal_masking(name):
    torch.manual_seed(0)
    model = TinyTransformer(50, dim=32, depth=2, num_heads=4, encoding=name, max_seq_len=32).eval()
    tokens = torch.randint(0, 50, (2, 12))
    out = model(tokens)
    assert out.shape == (2, 12, 50)
    changed = tokens.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 50                   # change only future tokens
    with torch.no_grad():
        torch.testing.assert_close(model(changed)[:, :8], out[:, :8].detach(), rtol=0, atol=1e-5)
        assert not torch.allclose(model(changed)[:, 8:], out[:, 8:])


@pytest.mark.parametrize("name", NAMES)
def test_packed_rows_equal_separate_rows(name):
    torch.manual_seed(0)
    model = TinyTransformer(50, dim=32, depth=1, num_heads=4, encoding=name, max_seq_len=32).eval()
    a, b = torch.randint(0, 50, (1, 7)), torch.randint(0, 50, (1, 5))
    packed = model(torch.cat([a, b], 1), segment_ids=torch.tensor([[0] * 7 + [1] * 5]))
    with torch.no_grad():
        torch.testing.assert_close(packed, torch.cat([model(a), model(b)], 1), rtol=1e-5, atol=1e-5)


@pytest.fixture
def one_thread():
    # tiny models train faster on one thread, and never oversubscribe a busy 2-core machine
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def test_every_encoding_beats_none_on_the_bidirectional_order_task(one_thread):
    result = position_task(NAMES, length=8, steps=250, dim=32, depth=2, batch_size=64, seed=0, progress=False)
    acc = result["accuracy"]
    assert acc["none"] < result["chance"] + 0.1                   # no order information: chance level
    for name in NAMES[1:]:
        # symmetric ALiBi cannot tell p from L-1-p, so it tops out near 50%; the rest reach ~100%
        assert acc[name] > acc["none"] + 0.15, (name, acc)


def test_with_rope_scaling_swaps_and_restores():
    model = TinyTransformer(20, dim=16, depth=1, num_heads=2, encoding="rope")
    old = model.with_rope_scaling(posenc.LinearScaling(2.0))
    assert isinstance(model.pos_module.scaling, posenc.LinearScaling)
    model.pos_module = old
    with pytest.raises(ValueError, match="needs encoding='rope'"):
        TinyTransformer(20, dim=16, depth=1, num_heads=2, encoding="alibi").with_rope_scaling(None)


def test_learned_model_rejects_positions_past_its_table():
    model = TinyTransformer(20, dim=16, depth=1, num_heads=2, encoding="learned", max_seq_len=8)
    with pytest.raises(ValueError, match="num_positions=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        (dict(encoding="xpos"), ValueError, "encoding must be one of"),
        (dict(num_heads=3), ValueError, "divisible"),
        (dict(causal="yes"), TypeError, "causal must be a bool"),
    ],
)
def test_model_bad_arguments(kwargs, err, match):
    with pytest.raises(err, match=match):
        TinyTransformer(10, **{"dim": 16, "depth": 1, "num_heads": 2, **kwargs})


def test_corpus_is_deterministic_split_by_file_and_skips_tests(tmp_path):
    kept = sorted([f"m{i}.py" for i in range(30)] + ["pkg/b.py"])
    for rel in [*kept, "pkg/test/c.py", "site-packages/d.py", "tests/e.py", "z.txt"]:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {rel}\n" * 3)
    files = [rel for rel, _ in stdlib_files(tmp_path)]
    assert files == kept
    one = stdlib_corpus(root=tmp_path)
    c1, c2 = stdlib_corpus(root=tmp_path), stdlib_corpus(root=tmp_path)
    assert torch.equal(c1.train, c2.train) and torch.equal(c1.valid, c2.valid)
    assert set(c1.train_files).isdisjoint(c1.valid_files)
    assert sorted(c1.train_files + c1.valid_files) == files
    assert one.train_files == c1.train_files


def test_real_stdlib_corpus_is_deterministic():
    a, b = stdlib_corpus(max_bytes=200_000), stdlib_corpus(max_bytes=200_000)
    assert a.train.numel() == 200_000 and torch.equal(a.train, b.train) and torch.equal(a.valid, b.valid)
    assert a.train.dtype == torch.uint8 and set(a.train_files).isdisjoint(a.valid_files)


TINY = dict(encodings=("none", "rope", "alibi"), train_len=8, eval_lens=(8, 16), steps=3, batch_size=4, dim=16,
            depth=1, num_heads=2, eval_windows=2, corpus_bytes=50_000, rope_rules=("linear", "yarn"))


def test_compare_is_deterministic_for_a_seed(one_thread):
    a = compare(CompareConfig(**TINY), progress=False)
    b = compare(CompareConfig(**TINY), progress=False)
    assert a["loss"] == b["loss"]
    assert set(a["loss"]) == {"none", "rope", "alibi", "rope+linear", "rope+yarn"}
    assert a["loss"]["rope+linear"]["8"] == a["loss"]["rope"]["8"]          # no rule within the training length


def test_cli_compare_writes_results_and_png(tmp_path, capsys, one_thread):
    pytest.importorskip("matplotlib")
    out = tmp_path / "run"
    code = main(["compare", "--encodings", "none,learned,rope", "--train-len", "8", "--eval-lens", "8,16",
                 "--steps", "2", "--quick", "--out", str(out), "--no-progress"])
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["train_len"] == 8 and set(data["loss"]["learned"]) == {"8", "16"}
    assert all(isinstance(v, float) for by in data["loss"].values() for v in by.values())
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| rope+yarn |" in capsys.readouterr().out


def test_cli_position_task(tmp_path, capsys):
    code = main(["compare", "--task", "position", "--encodings", "none,rope", "--steps", "2", "--out", str(tmp_path)])
    assert code == 0 and json.loads((tmp_path / "results.json").read_text())["task"] == "position"
    assert "rope" in capsys.readouterr().out


def test_cli_plot_writes_pngs(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["plot", "--out", str(tmp_path), "--dim", "16", "--max-len", "32"]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["axial_similarity.png", "logits_vs_distance.png", "similarity_vs_distance.png", "sincos_2d_table.png",
                     "sinusoidal_table.png"]
    assert all(pathlib.Path(tmp_path / n).read_bytes()[:4] == b"\x89PNG" for n in names)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["compare", "--encodings", "rope,fourier"], "unknown encoding(s) fourier"),
        (["compare", "--eval-lens", "0,64"], "lengths must be >= 1, got 0"),
        (["compare", "--eval-lens", "a,b"], "expected comma-separated integers"),
    ],
)
def test_cli_compare_errors(argv, message, capsys, tmp_path):
    try:
        code = main([*argv, "--out", str(tmp_path)])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_list(capsys):
    assert main(["list"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == NAMES
