"""benchmarks/gpu_rope.py --dry-run: every posenc row of the GPU benchmark runs on CPU tensors under
Triton's interpreter and agrees with the float32 reference (so the script works when a GPU is there)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_dry_run_checks_every_posenc_row():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_rope.py"), "--dry-run"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    for title in ("Forward: MHA", "Forward + backward: GQA", "Decode step: B=3", "Packed batch",
                  "contiguous cache", "paged cache", "QK-RMSNorm + RoPE forward + backward", "Tokens per program"):
        assert title in out, f"section {title!r} missing from the dry run"
    checked = 0
    dtype = None
    for line in out.splitlines():
        if line.startswith("### "):
            dtype = "bfloat16" if "bfloat16" in line else "float32"
        if line.startswith("| posenc") and "(dry run)" in line:
            cell = line.rstrip(" |").split("|")[-1].strip()
            if re.fullmatch(r"[0-9.e+-]+", cell):
                # bfloat16 rounds values of magnitude < 8 to within 2**-5; float32 to about 1e-6
                assert float(cell) <= (0.032 if dtype == "bfloat16" else 1e-5), line
                checked += 1
    assert checked >= 15, f"only {checked} posenc rows carried a check"
