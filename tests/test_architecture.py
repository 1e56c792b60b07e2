"""Package structure: dependency direction between the layers, no circles, no borrowed private names,
and lazy imports."""

import ast
import pathlib
import subprocess
import sys

import pytest

import posenc

ROOT = pathlib.Path(posenc.__file__).parent

# layer -> posenc layers it may import.  _validate and _deprecate (plain Python) and _torch (torch-side plumbing)
# are the shared private layers; every other underscore name stays inside its own package.
ALLOWED = {
    "core": {"core", "_validate", "_deprecate"},
    "_validate": set(),
    "_deprecate": set(),
    "_torch": {"core", "_torch", "_validate", "_deprecate"},
    "kernels": {"kernels", "_torch", "_deprecate"},
    "functional": {"core", "functional", "_validate", "_torch", "kernels", "_deprecate"},
    "nn": {"core", "functional", "nn", "_validate", "_torch", "kernels", "_deprecate"},
    "keras": {"core", "keras", "_validate", "_deprecate"},
    "attn": {"core", "functional", "nn", "_validate", "_torch", "_deprecate"},
    "lab": {"core", "functional", "nn", "attn", "_validate", "_torch", "lab", "distributed", "_deprecate"},
    "distributed": {"core", "functional", "nn", "attn", "_validate", "_torch", "_deprecate"},
    "models": {"lab", "_deprecate"},
    "integrations": {"core", "functional", "nn", "kernels", "_validate", "_torch", "integrations", "_deprecate"},
    "cli": {"core", "functional", "lab", "testing", "_deprecate"},
    "testing": {"core", "functional", "nn", "_validate", "_torch", "integrations", "testing", "_deprecate"},
    "__init__": set(),
    "__main__": {"cli"},
}
SHARED_PRIVATE = {"_validate", "_torch", "_deprecate"}


def _layer(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _modules():
    return sorted(ROOT.rglob("*.py"))


def _type_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under a top-level ``if TYPE_CHECKING:`` (imports for type checkers, never run)."""
    return {id(sub) for node in tree.body if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING" for stmt in node.body for sub in ast.walk(stmt)}


def _imports(path: pathlib.Path):
    """``(module, names)`` for every absolute import in ``path`` (``import a.b`` gives ``("a.b", [])``).
    The package ``__init__``'s type-only imports are left out: at run time it imports nothing of ours."""
    tree = ast.parse(path.read_text())
    skip = _type_only(tree) if path == ROOT / "__init__.py" else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def _posenc_targets(path: pathlib.Path):
    """The posenc modules ``path`` imports (``from posenc import x`` yields ``posenc.x``)."""
    for mod, names in _imports(path):
        if mod == "posenc":
            yield from (f"posenc.{n}" for n in names)
        elif mod.split(".")[0] == "posenc":
            yield mod


def test_every_module_belongs_to_a_known_layer():
    assert {_layer(p) for p in _modules()} <= set(ALLOWED)


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_dependency_direction(layer):
    for path in _modules():
        if _layer(path) != layer:
            continue
        for mod in _posenc_targets(path):
            target = mod.split(".")[1] if "." in mod else "__init__"
            assert target in ALLOWED[layer] | {layer}, f"{path.relative_to(ROOT)} imports {mod}"


def test_layers_form_no_circle():
    graph = {layer: deps - {layer} for layer, deps in ALLOWED.items()}
    done: set[str] = set()

    def visit(node, stack):
        assert node not in stack, f"circular layers: {' -> '.join([*stack, node])}"
        if node not in done:
            for dep in graph.get(node, ()):
                visit(dep, [*stack, node])
            done.add(node)

    for layer in graph:
        visit(layer, [])


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_uses_another_packages_private_names(path):
    layer = _layer(path)
    tree = ast.parse(path.read_text())
    foreign_aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "posenc":
            parts = node.module.split(".")
            owner = parts[1] if len(parts) > 1 else None
            for alias in node.names:
                full = [*parts[1:], alias.name]
                if owner in SHARED_PRIVATE or (owner is None and alias.name in SHARED_PRIVATE) or owner == layer:
                    continue
                assert not any(_private(p) for p in full), f"{path.relative_to(ROOT)} imports {node.module}.{alias.name}"
                foreign_aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "posenc" and len(parts) > 1 and parts[1] not in SHARED_PRIVATE | {layer}:
                    assert not any(_private(p) for p in parts), f"{path.relative_to(ROOT)} imports {alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in foreign_aliases:
            assert not _private(node.attr), f"{path.relative_to(ROOT)} reads {node.value.id}.{node.attr}"


def test_each_module_alias_means_one_module():
    """``from posenc.x import y as z``: the alias ``z`` names the same module in every file."""
    meaning: dict[str, str] = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("posenc"):
                for alias in node.names:
                    if alias.asname:
                        full = f"{node.module}.{alias.name}"
                        assert meaning.setdefault(alias.asname, full) == full, (
                            f"{path.relative_to(ROOT)}: alias {alias.asname} means {full} here and "
                            f"{meaning[alias.asname]} elsewhere"
                        )


def test_core_never_imports_torch_or_keras():
    for path in (ROOT / "core").rglob("*.py"):
        for mod, _ in _imports(path):
            assert mod.split(".")[0] not in {"torch", "keras", "tensorflow", "jax"}, (path, mod)


def test_library_layers_never_import_the_lab():
    for layer in ("core", "functional", "nn", "kernels", "_torch", "keras", "integrations"):
        for path in (ROOT / layer).rglob("*.py"):
            assert not any(m.startswith("posenc.lab") for m in _posenc_targets(path)), path


def test_the_transformers_integration_does_not_import_transformers():
    code = "import sys, posenc, posenc.integrations.transformers; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_only_the_torchtitan_integration_imports_torchtitan():
    code = ("import sys, posenc, posenc.integrations, posenc.integrations.transformers, posenc.distributed, "
            "posenc.testing; print('torchtitan' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    for path in ROOT.rglob("*.py"):
        if path.name != "torchtitan.py":
            assert not any(m.split(".")[0] == "torchtitan" for m, _ in _imports(path)), path


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


def test_the_lab_is_not_in_the_root_namespace_but_importable():
    assert "TinyTransformer" not in posenc.__all__
    with pytest.raises(AttributeError, match="from posenc.lab import TinyTransformer"):
        posenc.TinyTransformer  # noqa: B018
    from posenc.lab import TinyTransformer, list_encodings

    assert TinyTransformer is not None and list_encodings()


@pytest.mark.slow
def test_the_old_models_path_still_imports_with_a_deprecation_warning():
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    import posenc.models\nexcept DeprecationWarning as w:\n    print('warned:', w)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "posenc.lab" in out
    code = ("import warnings; warnings.simplefilter('ignore')\n"
            "import posenc.models.tiny, posenc.lab.tiny\n"
            "from posenc.models.registry import list_encodings\n"
            "print(posenc.models.tiny is posenc.lab.tiny, len(list_encodings()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    from posenc.lab import list_encodings
    assert out.split() == ["True", str(len(list_encodings()))]


ROTARY_ENTRY_MODULES = ["nn/rotary.py", "nn/axial_rotary.py", "nn/mrope.py", "functional/rope.py",
                        "functional/norm_rope.py", "functional/cache.py"]


@pytest.mark.parametrize("rel", ROTARY_ENTRY_MODULES)
def test_rotary_entry_points_decide_through_the_one_pipeline(rel):
    """The engine decision is made once, in ``_torch.rope_call.choose_engine``; no entry point calls
    the backend rule itself."""
    tree = ast.parse((ROOT / rel).read_text())
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert "resolve_rope_engine" not in called, rel
    assert "choose_engine" in called, rel


PROTOCOL = ("attention_qk", "attention_bias", "attention_score_mod")


@pytest.mark.parametrize("path", sorted((ROOT / "nn").glob("*.py")), ids=lambda p: p.name)
def test_protocol_methods_never_reenter_public_methods(path):
    """What ``posenc.attention`` calls trusts its checked arguments: no ``self(...)``,
    ``self.forward(...)`` or ``self.rotate(...)`` (which would validate them again)."""
    tree = ast.parse(path.read_text())
    for fn in ast.walk(tree):
        if not (isinstance(fn, ast.FunctionDef) and fn.name in PROTOCOL):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                f = node.func
                assert not (isinstance(f, ast.Name) and f.id == "self"), f"{path.name}:{fn.name} calls self(...)"
                assert not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self"
                            and f.attr in ("forward", "rotate", "cos_sin")), f"{path.name}:{fn.name} calls self.{f.attr}"


def test_attention_internals_take_records_not_long_argument_lists():
    """``posenc.attention`` keeps its public keywords; what it calls takes a few named records
    (the call's options, where the tokens are, the layer's structure): no internal function of
    ``posenc/attn.py`` has more than 8 parameters."""
    tree = ast.parse((ROOT / "attn.py").read_text())
    long = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name != "attention":
            a = node.args
            count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
            if count > 8:
                long[node.name] = count
    assert not long, long
