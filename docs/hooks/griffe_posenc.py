"""Griffe extension for the API reference: render posenc's reST-flavoured docstrings as Markdown.

posenc's docstrings are Google style (``Args:``, ``Shape:``, ``Returns:``, ``Examples:``) with two
Sphinx habits that Markdown does not know:

- cross-reference roles, ``:func:`posenc.apply_rope``` or ``:class:`~posenc.RotaryEmbedding```,
  become links to the documented object when it is in the reference (``posenc.X`` is looked up in
  the package's lazy export table, a bare name in the scopes of the docstring's object), and plain
  code otherwise (``torch.nn.Embedding``, ``ValueError``, private helpers);
- a paragraph ending in ``::`` before an indented literal block ends in ``:`` (the block is already
  indented, so Markdown renders it as code);
- an ``Args:`` entry that describes several parameters at once (``k, v: keys and values``) becomes
  one entry per parameter with the same description, as the Google style expects;
- a ``Returns:`` entry written as prose keeps its colons: the Google parser reads the text before
  the first colon as the return type, so ``positions.shape[:-1]`` in the first line is moved to a
  continuation line, and a leading code span (````(cos, sin)``: ...``) becomes the type.

It runs on the statically loaded package (``mkdocs.yml``: ``allow_inspection: false``), so it
imports neither posenc nor torch.
"""

from __future__ import annotations

import ast
import contextlib
import html
import pathlib
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`(?P<tilde>~?)(?P<target>[^`<>]+?)`")
_LITERAL_INTRO = re.compile(r"(?<=\S)::[ \t]*$", re.MULTILINE)
_LONE_LITERAL = re.compile(r"^[ \t]*::[ \t]*$", re.MULTILINE)
_PARAM_SECTION = re.compile(r"^(?P<indent>[ \t]*)(?:Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|"
                            r"Other Parameters):[ \t]*$")
_RETURNS_SECTION = re.compile(r"^(?P<indent>[ \t]*)(?:Returns|Yields):[ \t]*$")
_CODE_SPAN = re.compile(r"^``([^`]+)``$")
_SHARED_ENTRY = re.compile(r"^(?P<indent>[ \t]*)(?P<names>[\w*]+(?:[ \t]*,[ \t]*[\w*]+)+)(?P<rest>[ \t]*(?:\([^)]*\))?:.*)$")


def _exports(pkg: griffe.Module) -> dict[str, str]:
    """``name -> module`` for the names ``posenc`` re-exports lazily (its ``_EXPORTS`` table)."""
    exports: dict[str, str] = {}
    filepath = pkg.filepath
    tree = ast.parse(filepath.read_text(encoding="utf-8")) if isinstance(filepath, pathlib.Path) else ast.Module([], [])
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets) and node.value is not None:
                with contextlib.suppress(ValueError):       # not a literal: the imports below still count
                    exports.update(ast.literal_eval(node.value))
    # explicit imports in posenc/__init__.py (e.g. under TYPE_CHECKING) name the module directly
    for name, member in pkg.members.items():
        if isinstance(member, griffe.Alias) and name not in exports and member.target_path.startswith(pkg.name + "."):
            exports[name] = member.target_path.rsplit(".", 1)[0]
    return exports


def _scopes(obj: griffe.Object) -> list[griffe.Object]:
    scopes: list[griffe.Object] = []
    current: griffe.Object | None = obj
    while current is not None:
        scopes.append(current)
        current = current.parent
    return scopes


def _resolve(target: str, obj: griffe.Object, pkg_name: str, exports: dict[str, str]) -> str | None:
    """The absolute path ``target`` names from inside ``obj``'s docstring, or None when it is not ours."""
    target = target.lstrip(".")
    first, _, rest = target.partition(".")
    if first == pkg_name:
        name, _, tail = rest.partition(".")
        if name in exports:
            return ".".join(filter(None, [exports[name], name, tail]))
        return target
    for scope in _scopes(obj):
        member = scope.members.get(first)
        if member is None:
            continue
        base = member.target_path if isinstance(member, griffe.Alias) else member.path
        if not base.startswith(pkg_name + "."):
            return None
        return ".".join(filter(None, [base, rest]))
    return None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _split_shared_params(text: str) -> str:
    """``a, b: text`` inside an ``Args:`` section -> ``a: text`` and ``b: text`` (continuation lines too)."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    section: int | None = None       # indentation of the current "Args:" heading
    while i < len(lines):
        line = lines[i]
        if line.strip() and section is not None and _indent(line) <= section:
            section = None
        heading = _PARAM_SECTION.match(line)
        if heading:
            section = len(heading["indent"].expandtabs())
            out.append(line)
            i += 1
            continue
        entry = _SHARED_ENTRY.match(line) if section is not None else None
        if entry is None:
            out.append(line)
            i += 1
            continue
        j = i + 1                                    # continuation: blank lines or deeper indentation
        while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > _indent(line)):
            j += 1
        while j > i + 1 and not lines[j - 1].strip():
            j -= 1
        for name in re.split(r"[ \t]*,[ \t]*", entry["names"]):
            out.append(f"{entry['indent']}{name}{entry['rest']}")
            out.extend(lines[i + 1 : j])
        i = j
    return "\n".join(out)


def _is_expression(text: str) -> bool:
    try:
        compile(text, "<type>", "eval")
    except SyntaxError:
        return False
    return True


def _protect_returns(text: str) -> str:
    """Keep prose ``Returns:``/``Yields:`` entries whole (see the module docstring)."""
    lines = text.split("\n")
    section: int | None = None       # indentation of the current "Returns:" heading
    entry: int | None = None         # indentation of its entries
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        if section is not None and _indent(line) <= section:
            section = entry = None
        heading = _RETURNS_SECTION.match(line)
        if heading:
            section, entry = len(heading["indent"]), None
            continue
        if section is None:
            continue
        if entry is None:
            entry = _indent(line)
        if _indent(line) != entry or ":" not in line:
            continue
        body = line[entry:]
        before, after = body.split(":", 1)
        code = _CODE_SPAN.match(before.strip())
        if code:                                     # ``(cos, sin)``: text -> type (cos, sin)
            lines[i] = f"{' ' * entry}{code[1]}:{after}"
        elif "`" in before or not _is_expression(before.strip()):
            cut = before.rfind(" ")                  # prose: no colon may stay in the first line
            if cut > 0:
                lines[i] = f"{' ' * entry}{body[:cut]}\n{' ' * (entry + 4)}{body[cut + 1:]}"
    return "\n".join(lines)


def _rewrite(text: str, obj: griffe.Object, pkg_name: str, exports: dict[str, str]) -> str:
    def link(match: re.Match[str]) -> str:
        target = match["target"].strip()
        shown = target.lstrip(".").rsplit(".", 1)[-1] if match["tilde"] else target
        code = f"<code>{html.escape(shown)}</code>"
        path = _resolve(target, obj, pkg_name, exports)
        if path is None:
            return code
        return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'

    text = _protect_returns(_split_shared_params(_ROLE.sub(link, text)))
    text = _LONE_LITERAL.sub("", text)
    return _LITERAL_INTRO.sub(":", text)


class PosencDocstrings(griffe.Extension):
    """Rewrites every docstring of the loaded package once it is fully loaded."""

    #: The package whose docstrings are rewritten (others are left alone).
    package = "posenc"

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != self.package:
            return
        exports = _exports(pkg)
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if obj.docstring is not None:
                obj.docstring.value = _rewrite(obj.docstring.value, obj, pkg.name, exports)
            stack.extend(member for member in obj.members.values() if not isinstance(member, griffe.Alias))

    def on_package_loaded(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """The same hook under its name in griffe releases before ``on_package`` (the rewrite is idempotent)."""
        self.on_package(pkg=pkg)
