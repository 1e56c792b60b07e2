"""Package structure rules from STYLE.md: dependency direction and lazy imports."""

import ast
import pathlib
import subprocess
import sys

import pytest

import posenc

ROOT = pathlib.Path(posenc.__file__).parent

# layer -> posenc layers it may import (_validate is plain Python, so core may share its checks)
ALLOWED = {
    "core": {"core", "_validate"},
    "functional": {"core", "functional", "_validate", "kernels"},
    "nn": {"core", "functional", "nn", "_validate", "kernels"},
    "kernels": {"kernels"},
}


def _imports(path: pathlib.Path):
    """Every absolute module name imported by ``path`` (``from posenc import x`` yields ``posenc.x``)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "posenc":
                yield from (f"posenc.{a.name}" for a in node.names)
            else:
                yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def _posenc_imports(path: pathlib.Path):
    return (m for m in _imports(path) if m.split(".")[0] == "posenc")


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_dependency_direction(layer):
    for path in (ROOT / layer).rglob("*.py"):
        for mod in _posenc_imports(path):
            parts = mod.split(".")
            target = parts[1] if len(parts) > 1 else "posenc"
            assert target in ALLOWED[layer], f"{path.relative_to(ROOT)} imports {mod}"


def test_core_never_imports_torch_or_keras():
    for path in (ROOT / "core").rglob("*.py"):
        for mod in _imports(path):
            assert mod.split(".")[0] not in {"torch", "keras", "tensorflow", "jax"}, (path, mod)


@pytest.mark.parametrize("module", ["posenc", "posenc.core"])
def test_import_does_not_pull_in_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_all_is_explicit_and_resolvable():
    for name in posenc.__all__:
        assert getattr(posenc, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        posenc.nope  # noqa: B018
