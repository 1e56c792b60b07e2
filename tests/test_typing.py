"""Static typing: type checkers see posenc's real public names, while ``import posenc`` stays lazy.

``posenc/__init__.py`` resolves its public names on first use (a PEP 562 module ``__getattr__``
driven by ``_EXPORTS``) and imports the same names under ``if TYPE_CHECKING:`` for type checkers.
These tests check that the two lists agree and that mypy sees the real classes and functions.
"""

import ast
import importlib
import inspect
import pathlib
import re
import textwrap

import pytest

import posenc

INIT = pathlib.Path(posenc.__file__)
REPO = INIT.parent.parent


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _init_tree() -> ast.Module:
    return ast.parse(INIT.read_text())


def _exports(tree: ast.Module) -> dict[str, str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("posenc/__init__.py defines no _EXPORTS dict")


def _type_checking_imports(tree: ast.Module) -> dict[str, str]:
    """``{name: module}`` of the ``from module import name as name`` lines under ``if TYPE_CHECKING:``."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module, (
                    f"line {stmt.lineno}: only 'from module import name as name' belongs in the TYPE_CHECKING block"
                )
                for alias in stmt.names:
                    # the redundant alias marks an explicit re-export (mypy --no-implicit-reexport, pyright)
                    assert alias.asname == alias.name, f"write 'from {stmt.module} import {alias.name} as {alias.name}'"
                    assert alias.name not in found, f"{alias.name} is imported twice under TYPE_CHECKING"
                    found[alias.name] = stmt.module
    return found


def test_type_checking_imports_match_the_lazy_exports():
    tree = _init_tree()
    exports = _exports(tree)
    imports = _type_checking_imports(tree)
    assert set(imports) - set(exports) == set(), "imported for type checkers but not exported at run time"
    assert set(exports) - set(imports) == set(), "exported at run time but invisible to type checkers"
    wrong = {name: (imports[name], exports[name]) for name in exports if imports[name] != exports[name]}
    assert wrong == {}, "(TYPE_CHECKING module, _EXPORTS module) differ"


def test_the_lazy_exports_resolve_to_the_type_checking_objects():
    """What ``posenc.X`` returns at run time is the object the TYPE_CHECKING line names."""
    pytest.importorskip("torch")
    for name, module in _type_checking_imports(_init_tree()).items():
        assert getattr(posenc, name) is getattr(importlib.import_module(module), name), name


def test_posenc_init_imports_nothing_of_posenc_at_run_time():
    """Outside ``if TYPE_CHECKING:`` the package ``__init__`` imports no posenc module (laziness)."""
    tree = _init_tree()
    type_only = {
        id(sub)
        for node in tree.body
        if isinstance(node, ast.If) and _is_type_checking(node.test)
        for stmt in node.body
        for sub in ast.walk(stmt)
    }
    eager = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "posenc":
            eager.append(node.module)
        elif isinstance(node, ast.Import):
            eager += [a.name for a in node.names if a.name.split(".")[0] == "posenc"]
    assert eager == []


# ---- what mypy sees ---------------------------------------------------------------------------

_MYPY_INI = """\
[mypy]
python_version = 3.10
mypy_path = {repo}
show_error_codes = True
# (run with --no-site-packages: third-party packages, torch and NumPy included, read as Any; they
# are not what is checked here, and skipping them keeps a cold run to a few seconds)
ignore_missing_imports = True
"""


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory) -> pathlib.Path:
    """One mypy cache for this module's runs: the first run is cold, the others reuse it."""
    return tmp_path_factory.mktemp("mypy_cache")


def _run_mypy(tmp_path: pathlib.Path, cache: pathlib.Path, source: str) -> tuple[str, int]:
    api = pytest.importorskip("mypy.api")
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent(source))
    config = tmp_path / "mypy.ini"
    config.write_text(_MYPY_INI.format(repo=REPO))
    stdout, stderr, status = api.run([
        "--config-file", str(config), "--cache-dir", str(cache), "--no-site-packages",
        "--follow-imports", "silent", "--no-error-summary", "--hide-error-context", str(snippet),
    ])
    assert "error:" not in stderr, stderr
    return stdout, status


def _revealed(stdout: str) -> dict[int, str]:
    """``{line: type}`` of the snippet's ``reveal_type`` notes."""
    return {int(m[1]): m[2] for m in re.finditer(r'snippet\.py:(\d+): note: Revealed type is "(.*)"', stdout)}


def test_mypy_sees_every_public_name_as_its_real_object(tmp_path, mypy_cache):
    names = sorted(_exports(_init_tree()))
    lines = ["import posenc", "import posenc.keras", *(f"reveal_type(posenc.{n})" for n in names),
             "reveal_type(posenc.keras.RotaryEmbedding)", "reveal_type(posenc.__version__)"]
    stdout, status = _run_mypy(tmp_path, mypy_cache, "\n".join(lines) + "\n")
    revealed = _revealed(stdout)
    assert status == 0 and "error:" not in stdout, stdout
    first = 3                                                   # line of the first reveal_type
    for i, name in enumerate(names):
        text = revealed.get(first + i)
        assert text is not None, f"no revealed type for posenc.{name}:\n{stdout}"
        assert text.startswith(("def ", "Overload(")), f"posenc.{name} is seen as {text!r}, not a function or class"
        if name[0].isupper():                                   # a class: its constructor returns an instance
            assert "posenc." in text and text.endswith(f".{name}"), f"posenc.{name} is seen as {text!r}"
        else:                                                   # a function: mypy sees its real parameters
            params = inspect.signature(getattr(posenc, name)).parameters
            missing = [p for p in params if f"{p}:" not in text]
            assert not missing, f"posenc.{name} is seen as {text!r}, without parameters {missing}"
    assert revealed[first + len(names)].endswith("-> posenc.keras.rotary.RotaryEmbedding")
    assert revealed[first + len(names) + 1] in ("str", "builtins.str")


def test_mypy_names_the_defining_modules(tmp_path, mypy_cache):
    stdout, _ = _run_mypy(tmp_path, mypy_cache, """\
        import posenc
        reveal_type(posenc.RotaryEmbedding)
        reveal_type(posenc.apply_rope)
        reveal_type(posenc.YarnScaling)
        reveal_type(posenc.attention)
    """)
    revealed = _revealed(stdout)
    assert revealed[2].endswith("-> posenc.nn.rotary.RotaryEmbedding"), revealed[2]
    assert revealed[2] != "Any"
    # apply_rope(x, cos, sin, *, layout=...): the real signature, keyword names included
    assert revealed[3].startswith("def (") and re.search(r"layout: (builtins\.)?str", revealed[3]), revealed[3]
    assert revealed[4].endswith("-> posenc.core.rope.YarnScaling"), revealed[4]
    assert "encoding:" in revealed[5] and re.search(r"causal: (builtins\.)?bool", revealed[5]), revealed[5]


def test_mypy_reports_a_misspelt_public_name(tmp_path, mypy_cache):
    """The run-time ``__getattr__`` is hidden from type checkers, so a typo is an error, not Any."""
    stdout, status = _run_mypy(tmp_path, mypy_cache, """\
        import posenc
        posenc.RotaryEmbeding
        posenc.TinyTransformer
    """)
    assert status == 1
    assert 'snippet.py:2: error: Module has no attribute "RotaryEmbeding"' in stdout, stdout
    assert 'snippet.py:3: error: Module has no attribute "TinyTransformer"' in stdout, stdout


def test_the_package_is_marked_typed():
    """PEP 561: type checkers read an installed package's annotations only when it ships ``py.typed``."""
    assert (INIT.parent / "py.typed").is_file()
    tomllib = pytest.importorskip("tomllib")                   # Python >= 3.11
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["posenc"]
