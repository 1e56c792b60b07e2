"""``posenc compare --task copy|reverse|addition|passkey|extend``: the command line around the lab runs."""

import json

import pytest

pytest.importorskip("torch")

from posenc.cli import main  # noqa: E402


def _run(tmp_path, *args):
    return main(["compare", "--no-progress", "--threads", "1", "--out", str(tmp_path), *args])


@pytest.mark.parametrize("task", ["copy", "passkey"])
def test_task_writes_results_and_prints_the_table(tmp_path, capsys, task):
    code = _run(tmp_path, "--task", task, "--quick", "--steps", "3", "--seeds", "2", "--train-len", "2",
                "--encodings", "none,rope,rope+ntk")
    assert code == 0
    out, err = capsys.readouterr()
    assert f"{task}: exact match on the answer" in out
    assert "| rope+ntk |" in out and "2 (1x)" in out and "16 (8x)" in out
    assert "1 worker(s) of 1 thread (--threads 1)" in err
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["config"]["seeds"] == [0, 1] and res["config"]["steps"] == 3
    assert res["threads"]["choice"] == "--threads 1"
    assert list(res["summary"]["exact_match"]) == ["none", "rope", "rope+ntk"]


def test_same_seed_same_printed_digits(tmp_path, capsys):
    args = ("--task", "reverse", "--quick", "--steps", "5", "--seeds", "1", "--train-len", "2", "--encodings",
            "alibi,t5")
    assert _run(tmp_path / "a", *args) == 0
    first = capsys.readouterr().out
    assert _run(tmp_path / "b", *args) == 0
    assert capsys.readouterr().out == first
    a = json.loads((tmp_path / "a" / "results.json").read_text())
    b = json.loads((tmp_path / "b" / "results.json").read_text())
    assert a["per_seed"] == b["per_seed"]


def test_addition_order_is_recorded(tmp_path, capsys):
    assert _run(tmp_path, "--task", "addition", "--quick", "--steps", "2", "--seeds", "1", "--train-len", "1",
                "--encodings", "none", "--addition-order", "plain") == 0
    assert json.loads((tmp_path / "results.json").read_text())["config"]["reverse_answer"] is False


def test_rules_only_with_the_tasks(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        _run(tmp_path, "--task", "lm", "--encodings", "rope+yarn")
    assert exc.value.code == 2
    assert "rope+<rule> is for the tasks" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["rope+fourier", "alibi+yarn", "fourier"])
def test_unknown_rule_or_encoding_is_refused(tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as exc:
        _run(tmp_path, "--task", "copy", "--encodings", bad)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"unknown encoding(s) {bad}" in err and "rope+<rule>" in err


def test_tasks_refuse_cuda(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as exc:
        _run(tmp_path, "--task", "copy", "--device", "cuda")
    assert exc.value.code == 2
    assert "runs on the CPU only" in capsys.readouterr().err


def test_extend_prints_losses_and_steps_to_target(tmp_path, capsys):
    code = _run(tmp_path, "--task", "extend", "--quick", "--steps", "3", "--seeds", "1", "--train-len", "4")
    assert code == 0
    out = capsys.readouterr().out
    assert "| yarn | 100 |" in out and "| longrope | 0 |" in out
    assert "- linear: " in out
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["finetune_len"] == 16 and res["task"] == "extend"
    assert (tmp_path / "extend.png").exists() or "no plot" in capsys.readouterr().err


def test_automatic_thread_choice_is_printed(tmp_path, capsys, monkeypatch):
    import posenc.lab.pool as pool

    monkeypatch.setattr(pool.os, "getloadavg", lambda: (10.0, 10.0, 10.0))
    code = main(["compare", "--no-progress", "--out", str(tmp_path), "--task", "copy", "--steps", "1", "--seeds",
                 "1", "--train-len", "1", "--encodings", "none", "--quick"])
    assert code == 0
    assert "1 worker(s) of 1 thread (automatic: 1 of" in capsys.readouterr().err
