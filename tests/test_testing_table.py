"""posenc.testing.inspect_table: the layout, base and precision of a sinusoidal table from its values, against
the float64 oracle of tests/reference/oracle.py (the paper's formula) and the seeds' code with its bugs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posenc
from posenc.testing import TableReport, inspect_table
from tests.reference.oracle import sinusoidal_f64


@pytest.mark.parametrize("layout", ["interleaved", "concat", "tensor2tensor"])
@pytest.mark.parametrize("dim, base", [(64, 10000.0), (33, 10000.0), (128, 500.0)])
def test_the_oracles_tables_are_read_back(layout, dim, base):
    table = sinusoidal_f64(np.arange(1024), dim, base, layout).astype(np.float32)
    report = inspect_table(table)
    assert report.layout == layout and report.base == base and report.findings == ()
    assert report.dtype == "float32" and report.max_ulps <= 1.0 and report.first_over is None


def test_posencs_float32_table_is_exact():
    report = inspect_table(posenc.sinusoidal_table(4096, 64), base=10000.0)
    assert report.dtype == "float32" and report.max_ulps <= 1.0 and report.findings == ()


def _seed_table(d_model: int, max_len: int, exponent: str) -> torch.Tensor:
    """The seeds' PositionalEncoding in float32: ``pe[:, 0::2] = sin(pos / 10000^(e))``, ``pe[:, 1::2] = cos``,
    with the exponent ``2i/d`` of the paper (i the pair index) or the mistyped ``2 * (2i) / d``."""
    i = torch.arange(0, d_model, 2).float()                     # the column of each sine: 2i
    e = {"paper": i / d_model, "mistyped": 2 * i / d_model}[exponent]
    den = torch.pow(10000, e)
    pos = torch.arange(max_len).float().unsqueeze(1)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos / den), torch.cos(pos / den)
    return pe


def test_the_seeds_formula_is_the_paper():
    report = inspect_table(_seed_table(64, 512, "paper"), base=10000.0)
    assert (report.layout, report.base, report.findings) == ("interleaved", 10000.0, ())


def test_a_mistyped_exponent_is_named():
    report = inspect_table(_seed_table(64, 512, "mistyped"), base=10000.0)
    assert report.base == 1e8
    assert any("10000^2" in f and "4i/d" in f for f in report.findings), report.findings


def test_positions_held_in_bfloat16_are_named():
    pos = torch.arange(1024).to(torch.bfloat16).double()
    table = sinusoidal_f64(pos.numpy(), 32, 10000.0, "interleaved")
    report = inspect_table(torch.from_numpy(table))
    assert report.collision == 256
    assert any("rows 256 and 257 are equal" in f for f in report.findings)


def test_not_a_sinusoidal_table():
    report = inspect_table(torch.randn(64, 16, generator=torch.Generator().manual_seed(0)))
    assert report.layout == "unknown" and any("not sine/cosine pairs" in f for f in report.findings)


def test_a_callable_table_and_the_printed_report():
    report = inspect_table(lambda p: posenc.sinusoidal_table(len(p), 32, layout="concat"), rows=256)
    assert isinstance(report, TableReport) and report.layout == "concat" and report.rows == 256
    text = str(report)
    assert "layout      concat" in text and "findings: none" in text
