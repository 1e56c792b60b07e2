"""benchmarks/gpu_rope.py --dry-run: every posenc row of the GPU benchmark runs on CPU tensors under
Triton's interpreter and agrees with the float32 reference (so the script works when a GPU is there)."""

import os
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
                  "contiguous cache", "paged cache", "QK-RMSNorm + RoPE forward + backward", "Tokens per program",
                  "Host cost of a decode call: B=3"):
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


# ---- scripts/gpu_check.sh: the one command for a CUDA machine ----------------------------------------

def _cuda_test_files() -> set[str]:
    """Test files that skip without CUDA (their module-level skip names it)."""
    found = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        head = path.read_text()[:3000]
        if re.search(r"if not torch\.cuda\.is_available\(\)", head) and "allow_module_level=True" in head:
            found.add(f"tests/{path.name}")
    return found


def test_gpu_check_runs_every_cuda_test_file_and_the_whole_benchmark():
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    listed = set(re.findall(r"^\s+(tests/test_\w+\.py)", script, re.M))
    cuda_files = _cuda_test_files()
    assert len(cuda_files) >= 4
    assert cuda_files <= listed, f"CUDA test files missing from gpu_check.sh: {cuda_files - listed}"
    assert "tests/test_triton_compile.py" in listed
    assert all((ROOT / f).exists() for f in listed)
    run = re.search(r"\$PY -u benchmarks/gpu_rope\.py(.*)$", script, re.M)
    assert run is not None and "--only" not in run.group(1)             # every section


def test_gpu_check_without_cuda_says_so_and_exits_2(tmp_path):
    report = tmp_path / "report.md"
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(report)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable})
    assert run.returncode == 2, run.stderr
    assert "no CUDA device" in run.stderr
    assert not report.exists()


def test_gpu_check_runs_the_tests_in_parallel_within_time_limits_and_reports_as_it_goes():
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    assert re.search(r"workers=\(-n ", script)                               # pytest-xdist where installed
    assert 'timeout "${GPU_CHECK_TEST_S:-200}"' in script and 'section benchmark "${GPU_CHECK_BENCH_S:-220}"' in script
    assert 'section model-benchmark "${GPU_CHECK_HF_S:-80}"' in script      # the model benchmark, with parity
    assert re.search(r"-u benchmarks/bench_hf_decode\.py --device cuda", script)
    assert 'timeout "$limit" "$@" >> "$report"' in script                 # appended while it runs, unbuffered
    assert "-u benchmarks/gpu_rope.py" in script
