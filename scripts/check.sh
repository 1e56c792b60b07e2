#!/usr/bin/env bash
# Everything CI checks, in order; the first failing step stops the run.
#   lint (ruff), types (mypy), the test suite (torch, and Keras on the torch backend), Keras again
#   on JAX (both spread over the CPU cores by pytest-xdist), the strict docs build, every built page
#   rendered in headless Chromium (when Chromium is installed), and the sdist/wheel build, twine
#   check and install into a fresh venv.
set -euo pipefail
cd "$(dirname "$0")/.."
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
t0=$(date +%s)
step() {
  local s; s=$(date +%s)
  echo "== $*" >&2
  "$@"
  echo "== ok in $(( $(date +%s) - s )) s: $*" >&2
}
step ruff check .
step mypy -p posenc
step python -m pytest -n auto
KERAS_BACKEND=jax step python -m pytest -n auto tests/keras
step mkdocs build --strict --quiet --site-dir "$site"
step python scripts/check_site.py --site "$site" --skip-if-no-chromium
step bash scripts/check_package.sh
echo "check: all steps passed in $(( $(date +%s) - t0 )) s" >&2
