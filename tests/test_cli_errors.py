"""Bad input to the ``posenc`` command line: a clear message on stderr and exit status 2 (a bad
command line) or 1 (an output that cannot be written), never a traceback."""

import errno
import json
import os
import pathlib
import subprocess
import sys

import pytest

import posenc.core.sinusoidal
import posenc.lab.experiment
import posenc.lab.plots
from posenc.cli import main


def run(capsys, argv):
    """``(status, stdout, stderr)`` of ``main(argv)``, whether it returns or exits."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@pytest.fixture
def no_training(monkeypatch):
    """Bad arguments must be rejected before any training starts."""
    def fail(*args, **kwargs):
        pytest.fail("training started despite a bad argument")

    monkeypatch.setattr(posenc.lab.experiment, "compare", fail)
    monkeypatch.setattr(posenc.lab.experiment, "position_task", fail)


TABLE = ["table", "--dim", "4", "--max-len", "3"]

USAGE_ERRORS = [
    # table
    (["table", "--dim", "0", "--max-len", "3"], "--dim", "'0'"),
    (["table", "--dim", "-4", "--max-len", "3"], "--dim", "'-4'"),
    (["table", "--dim", "x", "--max-len", "3"], "--dim", "'x'"),
    (["table", "--dim", "", "--max-len", "3"], "--dim", "''"),
    (["table", "--dim", "1000000000000", "--max-len", "3"], "--dim", "from 1 to 65536"),
    (["table", "--dim", "4", "--max-len", "-1"], "--max-len", "'-1'"),
    (["table", "--dim", "4", "--max-len", "2.5"], "--max-len", "'2.5'"),
    (["table", "--dim", "4", "--max-len", str(10**12)], "--max-len", str(10**12)),
    (["table", "--dim", "512", "--max-len", "100000"], "--max-len 100000 x --dim 512", "lower --max-len or --dim"),
    ([*TABLE, "--offset", str(2**40)], "--offset", str(2**40)),
    ([*TABLE, "--offset", str(2**63)], "--offset", str(2**63)),
    ([*TABLE, "--offset", str(-(2**63) - 1)], "--offset", str(-(2**63) - 1)),
    ([*TABLE, "--offset", str(2**31 - 1)], "--offset 2147483647 with --max-len 3", "at most 2147483646"),
    ([*TABLE, "--offset", "one"], "--offset", "'one'"),
    ([*TABLE, "--base", "0"], "--base", "> 0"),
    ([*TABLE, "--base", "-10"], "--base", "'-10'"),
    ([*TABLE, "--base", "nan"], "--base", "'nan'"),
    ([*TABLE, "--base", "1e400"], "--base", "finite"),
    ([*TABLE, "--base", ""], "--base", "''"),
    ([*TABLE, "--format", "xml"], "--format", "'xml'"),
    ([*TABLE, "--layout", "sincos"], "--layout", "'sincos'"),
    (["table", "--max-len", "3"], "--dim", "required"),
    (["list", "extra"], "unrecognized arguments", "extra"),
    (["transform"], "invalid choice", "'transform'"),
    # plot
    (["plot", "--max-len", "0"], "--max-len", "'0'"),
    (["plot", "--max-len", "-5"], "--max-len", "'-5'"),
    (["plot", "--max-len", str(10**12)], "--max-len", str(10**12)),
    (["plot", "--max-len", "100000"], "--max-len 100000 x --dim 64", "lower --max-len or --dim"),
    (["plot", "--dim", "7"], "--dim", "'7'"),
    (["plot", "--dim", "0"], "--dim", "even"),
    (["plot", "--dim", "-2"], "--dim", "'-2'"),
    (["plot", "--dim", str(2**40)], "--dim", "65536"),
    (["plot", "--dim", "sixty"], "--dim", "'sixty'"),
    (["plot", "--out", ""], "--out", "empty"),
    # compare
    (["compare", "--steps", "0"], "--steps", "'0'"),
    (["compare", "--steps", "-1"], "--steps", "'-1'"),
    (["compare", "--steps", "ten"], "--steps", "'ten'"),
    (["compare", "--steps", ""], "--steps", "''"),
    (["compare", "--train-len", "0"], "--train-len", "'0'"),
    (["compare", "--train-len", str(10**7)], "--train-len", "from 1 to 4096"),
    (["compare", "--eval-lens", "0,64"], "--eval-lens", "lengths must be >= 1, got 0"),
    (["compare", "--eval-lens", "64,-8"], "--eval-lens", "got -8"),
    (["compare", "--eval-lens", str(10**7)], "--eval-lens", "<= 4096"),
    (["compare", "--eval-lens", "64,x"], "--eval-lens", "comma-separated integers"),
    (["compare", "--eval-lens", ""], "--eval-lens", "at least one length"),
    (["compare", "--encodings", "rope,fourier"], "--encodings", "unknown encoding(s) fourier"),
    (["compare", "--encodings", ""], "--encodings", "choose from"),
    (["compare", "--encodings", ",,"], "--encodings", "an empty entry"),
    (["compare", "--encodings", "rope,rope"], "--encodings", "rope given more than once"),
    (["compare", "--seed", str(2**64)], "--seed", str(2**64)),
    (["compare", "--seed", "1.5"], "--seed", "'1.5'"),
    (["compare", "--task", "sorting"], "--task", "'sorting'"),
    (["compare", "--out", ""], "--out", "empty"),
    (["compare", "--device", "tpu"], "--device", "invalid choice: 'tpu'"),
    (["compare", "--device", "tpu"], "choose from", "cuda"),
    (["compare", "--threads", "0"], "--threads", "from 1 to 1024, got '0'"),
    (["compare", "--device", ""], "--device", "invalid choice: ''"),
]


@pytest.mark.parametrize("argv, option, detail", USAGE_ERRORS)
def test_bad_command_lines_exit_2_naming_the_option(capsys, no_training, tmp_path, argv, option, detail):
    if argv[0] in ("plot", "compare") and "--out" not in argv:
        argv = [*argv, "--out", str(tmp_path / "out")]
    code, out, err = run(capsys, argv)
    assert code == 2 and out == ""
    assert option in err and detail in err
    assert err.count("error:") == 1
    assert not (tmp_path / "out").exists()                        # nothing created for a bad command line


def test_compare_on_cuda_without_a_cuda_device_exits_2(capsys, monkeypatch, no_training, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out, err = run(capsys, ["compare", "--device", "cuda", "--out", str(tmp_path / "out")])
    assert code == 2 and out == ""
    assert "argument --device: got 'cuda' but no CUDA device is visible" in err and "pass --device cpu" in err
    assert not (tmp_path / "out").exists()


def test_plot_odd_dim_speaks_of_the_option_and_the_accepted_values(capsys, tmp_path):
    code, _, err = run(capsys, ["plot", "--dim", "7", "--out", str(tmp_path)])
    assert code == 2
    assert "argument --dim: must be an even integer from 2 to 65536" in err and "pass e.g. 8" in err
    assert "rotary dim" not in err


@pytest.mark.parametrize(
    "argv",
    [
        [*TABLE[:4], "2", "--offset", str(2**31 - 1)],                # last position 2**31: allowed
        [*TABLE, "--offset", str(-(2**31))],
        ["table", "--dim", "3", "--max-len", "0", "--offset", str(2**31)],
        ["table", "--dim", "1", "--max-len", "1"],
    ],
)
def test_values_at_the_bounds_are_accepted(capsys, argv):
    code, _, err = run(capsys, [*argv, "--format", "json"])
    assert code == 0 and err == ""


# --- outputs that cannot be written: exit 1 ---------------------------------------------------


@pytest.mark.parametrize("command", ["compare", "plot"])
def test_out_is_an_existing_file(capsys, no_training, tmp_path, command):
    path = tmp_path / "file.txt"
    path.write_text("keep me")
    code, out, err = run(capsys, [command, "--out", str(path)])
    assert code == 1 and out == ""
    assert f"posenc: cannot write {path}: Not a directory" in err and "--out" in err
    assert path.read_text() == "keep me"


@pytest.mark.parametrize("command", ["compare", "plot"])
def test_out_below_an_existing_file(capsys, no_training, tmp_path, command):
    (tmp_path / "file.txt").write_text("")
    code, _, err = run(capsys, [command, "--out", str(tmp_path / "file.txt" / "run")])
    assert code == 1 and "posenc: cannot write" in err and "Not a directory" in err


def test_compare_results_path_is_a_directory(capsys, no_training, tmp_path):
    (tmp_path / "results.json").mkdir()
    code, _, err = run(capsys, ["compare", "--task", "position", "--out", str(tmp_path)])
    assert code == 1 and f"cannot write {tmp_path / 'results.json'}: Is a directory" in err


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="permissions do not bind root")
@pytest.mark.parametrize("command", ["compare", "plot"])
def test_out_in_a_read_only_folder(capsys, no_training, tmp_path, command):
    tmp_path.chmod(0o500)
    try:
        code, _, err = run(capsys, [command, "--out", str(tmp_path / "run")])
    finally:
        tmp_path.chmod(0o700)
    assert code == 1 and "posenc: cannot write" in err and "Permission denied" in err


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_compare_full_disk(capsys, monkeypatch, tmp_path):
    results = {"task": "position", "length": 16, "chance": 1 / 16, "steps": 1, "seed": 0, "accuracy": {"rope": 1.0}}
    monkeypatch.setattr(posenc.lab.experiment, "position_task", lambda *a, **k: results)
    monkeypatch.setattr(pathlib.Path, "write_text", _disk_full)
    code, out, err = run(capsys, ["compare", "--task", "position", "--out", str(tmp_path)])
    assert code == 1
    assert "rope" in out                                           # the results still reach stdout
    assert f"posenc: cannot write {tmp_path / 'results.json'}: No space left on device" in err
    assert not (tmp_path / "results.json").exists()


def test_compare_plot_full_disk(capsys, monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    results = {"task": "lm", "loss": {"rope": {"8": 2.0, "16": 2.5}}, "seconds": 0.1,
               "config": {"train_len": 8, "seed": 0, "steps": 1}}
    monkeypatch.setattr(posenc.lab.experiment, "compare", lambda *a, **k: results)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", _disk_full)
    code, out, err = run(capsys, ["compare", "--encodings", "rope", "--out", str(tmp_path)])
    assert code == 1 and "| rope |" in out
    assert json.loads((tmp_path / "results.json").read_text())["loss"] == results["loss"]
    assert "posenc: cannot write" in err and "No space left on device" in err


def test_plot_full_disk(capsys, monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", _disk_full)
    code, out, err = run(capsys, ["plot", "--dim", "4", "--max-len", "4", "--out", str(tmp_path)])
    assert code == 1 and out == ""
    assert f"posenc: cannot write {tmp_path}: No space left on device" in err and "disk space" in err


def test_plot_without_matplotlib_exits_1(capsys, monkeypatch, tmp_path):
    def missing():
        raise ImportError("plots need matplotlib: pip install matplotlib")

    monkeypatch.setattr(posenc.lab.plots, "require_matplotlib", missing)
    code, _, err = run(capsys, ["plot", "--out", str(tmp_path / "run")])
    assert code == 1 and "posenc plot: error: plots need matplotlib" in err
    assert not (tmp_path / "run").exists()


class _Stdout:
    def __init__(self, exc):
        self.exc = exc

    def write(self, text):
        raise self.exc

    def flush(self):
        pass


def test_stdout_full(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", _Stdout(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
    code, _, err = run(capsys, TABLE)
    assert code == 1 and "posenc: cannot write standard output: No space left on device" in err


def test_stdout_closed_pipe_stops_quietly(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", _Stdout(BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))))
    code, _, err = run(capsys, TABLE)
    assert code == 1 and err == ""


# --- errors raised by posenc itself ------------------------------------------------------------


def test_a_value_posenc_rejects_is_reported_without_traceback(capsys, monkeypatch):
    def reject(*args, **kwargs):
        raise ValueError("dim must be >= 1, got 0")

    monkeypatch.setattr(posenc.core.sinusoidal, "table", reject)
    code, out, err = run(capsys, TABLE)
    assert code == 2 and out == "" and err == "posenc table: error: dim must be >= 1, got 0\n"


def test_unexpected_errors_stay_visible(monkeypatch):
    def bug(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(posenc.core.sinusoidal, "table", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        main(TABLE)


def test_interrupt_exits_130(capsys, monkeypatch, tmp_path):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(posenc.lab.experiment, "position_task", interrupted)
    code, _, err = run(capsys, ["compare", "--task", "position", "--out", str(tmp_path)])
    assert code == 130 and "posenc compare: interrupted" in err


# --- end to end ---------------------------------------------------------------------------------


def _posenc(*argv, **kwargs):
    kwargs.setdefault("stdout", subprocess.PIPE)
    return subprocess.run([sys.executable, "-m", "posenc", *argv], stderr=subprocess.PIPE, text=True, timeout=60,
                          **kwargs)


def test_end_to_end_usage_error_and_unwritable_out(tmp_path):
    proc = _posenc("compare", "--steps", "0", "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "posenc compare: error: argument --steps: must be an integer >= 1, got '0'" in proc.stderr
    (tmp_path / "file").write_text("")
    proc = _posenc("plot", "--out", str(tmp_path / "file"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr == f"posenc: cannot write {tmp_path / 'file'}: Not a directory; pass --out a folder you can write to\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_end_to_end_stdout_on_a_full_device():
    with open("/dev/full", "w") as full:
        proc = _posenc(*TABLE, stdout=full)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("posenc: cannot write standard output: No space left on device; "
                                   "free some disk space or redirect the output elsewhere")
