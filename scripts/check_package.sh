#!/usr/bin/env bash
# Build the sdist and the wheel, check them with twine, and install the wheel into a fresh virtual
# environment with NumPy alone (no torch): the framework-free parts and the CLI's table must work.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
twine check --strict "$work/dist"/*

version=$(python -c "import ast, pathlib; t = ast.parse(pathlib.Path('posenc/__init__.py').read_text()); print(next(n.value.value for n in t.body if isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', '') == '__version__'))")
wheel="$work/dist/posenc-$version-py3-none-any.whl"
sdist="$work/dist/posenc-$version.tar.gz"
for f in "$wheel" "$sdist"; do
  [[ -f "$f" ]] || { echo "check_package: missing $f (built: $(ls "$work/dist"))" >&2; exit 1; }
done

# What ships: the typing marker and the license in the wheel, no tests; the sdist carries LICENSE and CHANGELOG.
python - "$wheel" "$sdist" <<'PY'
import sys, tarfile, zipfile
wheel, sdist = sys.argv[1:]
names = zipfile.ZipFile(wheel).namelist()
problems = []
if "posenc/py.typed" not in names:
    problems.append("the wheel lacks posenc/py.typed")
if not any(n.endswith("licenses/LICENSE") or n.endswith("/LICENSE") for n in names):
    problems.append("the wheel lacks LICENSE")
if any(n.startswith(("tests/", "benchmarks/", "docs/")) for n in names):
    problems.append("the wheel ships tests, benchmarks or docs")
members = tarfile.open(sdist).getnames()
for want in ("LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml"):
    if not any(m.endswith("/" + want) and m.count("/") == 1 for m in members):
        problems.append(f"the sdist lacks {want}")
if problems:
    sys.exit("check_package: " + "; ".join(problems))
print(f"check_package: wheel holds {len(names)} files, sdist {len(members)}")
PY

python -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "$wheel"
cd "$work"  # not the clone: the installed wheel must be what is imported
"$work/venv/bin/python" - "$version" <<'PY'
import importlib.metadata, importlib.util, sys
import posenc, posenc.core.sinusoidal
assert importlib.util.find_spec("torch") is None, "this check needs a venv without torch"
if posenc.__version__ != sys.argv[1] or importlib.metadata.version("posenc") != sys.argv[1]:
    sys.exit(f"check_package: version mismatch: {posenc.__version__} / {importlib.metadata.version('posenc')} / {sys.argv[1]}")
print("check_package: installed", posenc.__version__, "from", posenc.__file__)
PY
"$work/venv/bin/posenc" --help >/dev/null
"$work/venv/bin/posenc" table --dim 4 --max-len 2 --format csv
"$work/venv/bin/posenc" table --dim 6 --max-len 3                 # printed as torch prints a tensor, without torch
"$work/venv/bin/posenc" list >/dev/null
echo "check_package: sdist and wheel built, twine check passed, the wheel installs and runs without torch"
