#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one command, written to one Markdown report.
#
#   bash scripts/gpu_check.sh [REPORT.md]        (default: gpu-report-<UTC time>.md in the current folder)
#
# 1. every CUDA test, in parallel (pytest-xdist, when installed): the compiled kernels against the
#    torch engine, the direct launch against Triton's own, no host synchronisation under
#    torch.cuda.set_sync_debug_mode("error"), CUDA-graph capture and replay of decode steps, inputs
#    on a second GPU, patched transformers models against unpatched ones; and the compile check of
#    every kernel specialization;
# 2. every section of benchmarks/gpu_rope.py against every installed peer (transformers eager and
#    compiled, Liger-Kernel, FlashInfer, flash-attention's rotary; the absent ones are listed),
#    the host cost of a decode call included;
# 3. benchmarks/bench_hf_decode.py on CUDA: a Llama's prefill and decode step unpatched and patched
#    with each engine (cos/sin only, torch, triton), float32 and bfloat16, with a parity table
#    against a second unpatched run (bfloat16 on CUDA is not bit-deterministic between two runs).
#
# The report starts with the date, the commit, the GPU and the versions, and is written as the run
# goes: a run cut off (or stopped by the time limits below) still leaves what it measured.  Meant to
# finish in about 6 minutes on one H100/H200, and stopped at 8 at most: the tests get GPU_CHECK_TEST_S
# seconds (default 200), the kernel benchmark GPU_CHECK_BENCH_S (default 220) and the model benchmark
# GPU_CHECK_HF_S (default 80).  The script exits non-zero when a test or a
# benchmark section fails, and prints where the report is either way.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
report=$(realpath -m "${1:-gpu-report-$(date -u +%Y%m%dT%H%M%SZ).md}")
unset TRITON_INTERPRET

if ! $PY -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: no CUDA device visible to torch here; nothing to check" >&2
  exit 2
fi

CUDA_TESTS=(
  tests/test_triton_kernels_cuda.py   # every kernel vs the torch engine; inputs on cuda:1
  tests/test_triton_rope_cuda.py      # the RoPE kernel forward/backward, auto dispatch, torch.compile, direct launch
  tests/test_hf_cuda.py               # patched transformers models vs unpatched ones on CUDA
  tests/test_gpu_paths_cuda.py        # varlen, KV cache, QK-norm; no sync; a fused decode step in a graph
  tests/test_cuda_decode.py           # module decode steps without sync, captured in a CUDA graph
  tests/test_context_parallel_cuda.py # ring attention (torch's context_parallel) with posenc's RoPE: 2 GPUs
  tests/test_triton_compile.py        # every specialization compiled for sm_80/90 and newer (no GPU needed)
)

{
  echo "# posenc GPU check"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- commit: $(git log -1 --format='%h %cs %s' 2>/dev/null || echo unknown)$(git status --porcelain posenc 2>/dev/null | grep -q . && echo ' (with local changes to posenc/)')"
  $PY - <<'EOF'
import importlib.metadata as md
import torch
import triton
props = torch.cuda.get_device_properties(0)
print(f"- GPU: {torch.cuda.get_device_name(0)} (sm_{props.major}{props.minor}, {props.total_memory / 2**30:.0f} GiB),"
      f" {torch.cuda.device_count()} visible; CUDA {torch.version.cuda}")
import sys
print(f"- python {sys.version.split()[0]}, torch {torch.__version__}, triton {triton.__version__}")
peers = []
for name in ("transformers", "liger-kernel", "flashinfer-python", "flashinfer", "flash-attn"):
    try:
        peers.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        peers.append(f"{name} absent")
print("- peers: " + ", ".join(peers))
EOF
  echo
} > "$report"

status=0
logs=$(mktemp -d)
workers=()
if $PY -c 'import xdist' 2>/dev/null; then workers=(-n "${GPU_CHECK_WORKERS:-8}"); fi
echo "## Tests (${#CUDA_TESTS[@]} files${workers:+, pytest ${workers[*]}})" >> "$report"
echo >> "$report"
echo "== tests" >&2
start=$(date +%s)
timeout "${GPU_CHECK_TEST_S:-200}" $PY -m pytest "${CUDA_TESTS[@]}" "${workers[@]}" -q -p no:randomly -rfEs \
  -o addopts="" > "$logs/tests.log" 2>&1
rc=$?
summary=$(grep -E '^=+ .*(passed|failed|skipped|error).* =+$|^[0-9]+ (passed|failed|skipped)' "$logs/tests.log" | tail -1 | tr -d '=' | sed 's/^ *//')
[ -z "$summary" ] && summary="exit code $rc"
[ $rc -eq 124 ] && summary="**stopped after ${GPU_CHECK_TEST_S:-200} s** ($summary)"
# exit code 5: every test skipped or none collected (e.g. a single GPU for a two-GPU file)
if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then status=1; summary="**FAILED** ($summary)"; fi
echo "$summary, in $(( $(date +%s) - start )) s" >> "$report"
echo "   $summary" >&2
if grep -qE '^(FAILED|ERROR) ' "$logs/tests.log"; then
  { echo; echo "<details><summary>failures</summary>"; echo; echo '```'
    grep -E '^(FAILED|ERROR) ' "$logs/tests.log" | head -50; echo '```'; echo "</details>"; } >> "$report"
fi
{ echo; echo "<details><summary>skipped</summary>"; echo; echo '```'
  grep -E '^SKIPPED' "$logs/tests.log" | head -30; echo '```'; echo "</details>"; } >> "$report"

# section NAME LIMIT_S TITLE COMMAND...: one benchmark of the report, appended as it runs and stopped at LIMIT_S
section() {
  local name=$1 limit=$2 title=$3 start rc
  shift 3
  { echo; echo "## $title"; echo; } >> "$report"
  echo "== $title" >&2
  start=$(date +%s)
  timeout "$limit" "$@" >> "$report" 2> "$logs/$name.err"
  rc=$?
  { echo; echo "($name: $(( $(date +%s) - start )) s)"; } >> "$report"
  if [ $rc -eq 124 ]; then
    status=1
    echo "**The $name was stopped after $limit s; what it wrote above is complete.**" >> "$report"
  elif [ $rc -ne 0 ]; then
    status=1
    { echo; echo "**The $name failed (exit code $rc):**"; echo; echo '```'; tail -30 "$logs/$name.err"; echo '```'; } \
      >> "$report"
  fi
}

section benchmark "${GPU_CHECK_BENCH_S:-220}" "Benchmarks (benchmarks/gpu_rope.py, every section)" \
  $PY -u benchmarks/gpu_rope.py
section model-benchmark "${GPU_CHECK_HF_S:-80}" "Inside a model (benchmarks/bench_hf_decode.py --device cuda)" \
  $PY -u benchmarks/bench_hf_decode.py --device cuda --sizes 1024x4 --dtypes float32,bfloat16 --repeats 3 \
  --min-time 0.05 --prefill 512 --batch 4 --steps 64

echo >> "$report"
echo "Overall: $([ $status -eq 0 ] && echo 'every test passed and every benchmark section ran' || echo '**FAILURES above**')." >> "$report"
rm -rf "$logs"
echo "gpu_check: report written to $report" >&2
[ $status -eq 0 ] && echo "gpu_check: all passed" >&2 || echo "gpu_check: FAILED (see the report)" >&2
exit $status
