"""The ``posenc`` command line."""

import csv
import io
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from posenc.cli import main
from posenc.functional import sinusoidal_table
from tests.conftest import load_golden


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_default_format_prints_like_the_seeds(capsys):
    code, out, err = run(capsys, "table", "--dim", "6", "--max-len", "10")
    assert code == 0 and err == ""
    assert out.rstrip("\n") == load_golden("seeds.json")["000"]["table_printed"]


def test_json_format_round_trips_float32_values(capsys):
    code, out, _ = run(capsys, "table", "--dim", "5", "--max-len", "4", "--offset", "100", "--layout", "concat", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["offset"] == 100
    assert torch.equal(torch.tensor(data["rows"], dtype=torch.float32), sinusoidal_table(4, 5, offset=100, layout="concat"))


def test_csv_format(capsys):
    code, out, _ = run(capsys, "table", "--dim", "4", "--max-len", "3", "--base", "100", "--format", "csv")
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["position", "d0", "d1", "d2", "d3"]
    assert [int(r[0]) for r in rows[1:]] == [0, 1, 2]
    assert float(rows[2][3]) == pytest.approx(0.0998334, abs=1e-6)   # sin(1 / 100**(2/4))


def test_markdown_format(capsys):
    code, out, _ = run(capsys, "table", "--dim", "2", "--max-len", "2", "--format", "markdown")
    assert out.splitlines() == ["| position | d0 | d1 |", "|---:|---:|---:|", "| 0 | 0.0000 | 1.0000 |", "| 1 | 0.8415 | 0.5403 |"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["table", "--dim", "0", "--max-len", "3"], "argument --dim: must be an integer from 1 to 65536, got '0'"),
        (["table", "--dim", "4", "--max-len", "-2"], "argument --max-len: must be an integer from 0 to 10000000, got '-2'"),
        (["table", "--dim", "4", "--max-len", "3", "--base", "0"], "argument --base: must be a finite number > 0"),
    ],
)
def test_bad_values_exit_2_with_a_message_on_stderr(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == "" and message in err


def test_unknown_layout_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["table", "--dim", "4", "--max-len", "3", "--layout", "sincos"])
    assert exc.value.code == 2
    assert "invalid choice: 'sincos'" in capsys.readouterr().err


def test_python_dash_m_entry_point():
    proc = subprocess.run([sys.executable, "-m", "posenc", "table", "--dim", "2", "--max-len", "2", "--format", "json"],
                          capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout)["rows"][1][0] == pytest.approx(0.841471, abs=1e-6)


# --- posenc table without torch: NumPy values and torch's print format -------------------------


def _arrays():
    rng = np.random.default_rng(0)
    return {
        "unit": rng.uniform(-1, 1, (4, 5)),
        "wrapped": rng.uniform(-1, 1, (3, 30)),                      # rows longer than 80 characters
        "summarised": rng.uniform(-1, 1, (40, 64)),                  # > 1000 values: edges and "..."
        "long column": rng.uniform(-1, 1, (1200, 1)),
        "long row": rng.uniform(-1, 1, (1, 1200)),
        "scientific small": rng.uniform(-1, 1, (3, 4)) * 1e-6,
        "scientific wide": np.array([[1e-3, 5.0], [2.0, -0.5]]),
        "large": rng.uniform(-1, 1, (2, 3)) * 1e9,
        "whole": np.array([[0.0, 1.0], [-3.0, 12.0]]),
        "whole large": np.array([[0.0, 1e9], [3.0, 2.0]]),
        "zeros": np.zeros((2, 3)),
        "negative zero": np.array([[-0.0, 0.25]]),
        "single": np.array([[0.5]]),
        "empty": np.zeros((0, 4)),
    }


@pytest.mark.parametrize("name", list(_arrays()))
def test_torch_style_is_torch_repr(name):
    from posenc.cli import torch_style

    array = _arrays()[name].astype(np.float32)
    assert torch_style(array) == repr(torch.from_numpy(array))


@pytest.mark.parametrize("layout", ["interleaved", "concat", "tensor2tensor"])
@pytest.mark.parametrize("dim, base, offset", [(1, 10000.0, 0), (7, 10000.0, -3), (64, 10000.0, 0), (33, 500.0, 12345),
                                               (16, 1e6, 2**31 - 200)])
def test_numpy_table_equals_the_torch_table_bit_for_bit(layout, dim, base, offset):
    from posenc.cli import sinusoidal_rows

    rows = sinusoidal_rows(200, dim, base=base, layout=layout, offset=offset)
    assert rows.dtype == np.float32
    assert torch.equal(torch.from_numpy(rows), sinusoidal_table(200, dim, base=base, layout=layout, offset=offset))
