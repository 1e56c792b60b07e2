"""The documentation site: every public name has an API entry, the nav matches the pages, the
gallery shows every figure, and scripts/check_site.py finds broken pages (in a real browser when
Chromium and playwright are installed, otherwise its pure parts only)."""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API = DOCS / "api"


def _load_script(name: str, path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module        # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


check_site = _load_script("posenc_check_site", ROOT / "scripts" / "check_site.py")


# ------------------------------------------------------------------------------------------------
# The API reference covers every public name.

_DIRECTIVE = re.compile(r"^:::[ \t]+(?P<ident>[\w.]+)[ \t]*$")
_MEMBERS_INLINE = re.compile(r"^\s+members:\s*\[(?P<names>[^\]]*)\]\s*$")
_MEMBERS_BLOCK = re.compile(r"^\s+members:\s*$")
_MEMBER_ITEM = re.compile(r"^\s+-\s*(?P<name>\w+)\s*$")


def api_directives(pages: list[pathlib.Path]) -> list[str]:
    """Identifiers rendered by ``::: ident`` directives; a directive with an explicit ``members:``
    list also renders ``ident.member`` for each member."""
    idents = []
    for page in pages:
        lines = page.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            match = _DIRECTIVE.match(lines[i])
            i += 1
            if not match:
                continue
            ident = match["ident"]
            idents.append(ident)
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                if _DIRECTIVE.match(lines[i]):
                    break
                inline = _MEMBERS_INLINE.match(lines[i])
                if inline:
                    idents += [f"{ident}.{n.strip().strip(chr(34) + chr(39))}" for n in inline["names"].split(",")
                               if n.strip()]
                elif _MEMBERS_BLOCK.match(lines[i]):
                    while i + 1 < len(lines) and _MEMBER_ITEM.match(lines[i + 1]):
                        i += 1
                        idents.append(f"{ident}.{_MEMBER_ITEM.match(lines[i])['name']}")
                i += 1
    return idents


def test_api_directives_parser(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# T\n\n::: pkg.a\n\n::: pkg.mod\n    options:\n      members: [b, 'c']\n\ntext ::: no\n"
                    "::: pkg.other\n    options:\n      members:\n        - d\n        - e\n::: pkg.last\n")
    assert api_directives([page]) == ["pkg.a", "pkg.mod", "pkg.mod.b", "pkg.mod.c", "pkg.other", "pkg.other.d",
                                      "pkg.other.e", "pkg.last"]


def _resolve(ident: str):
    """The object an identifier names: the longest importable module prefix, then attributes."""
    parts = ident.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as err:
            if err.name and not ".".join(parts[:cut]).startswith(err.name):
                raise                       # a dependency is missing, not the module
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(ident)


def _documented(idents: list[str]) -> list[tuple[str, object]]:
    out = []
    for ident in idents:
        if ident.startswith("posenc.keras") and importlib.util.find_spec("keras") is None:
            continue
        out.append((ident, _resolve(ident)))
    return out


API_PAGES = sorted(API.glob("*.md"))


@pytest.mark.parametrize("module_name", ["posenc", "posenc.functional", "posenc.nn", "posenc.keras", "posenc.attn",
                                         "posenc.integrations.transformers", "posenc.testing", "posenc.distributed",
                                         "posenc.integrations.torchtitan"])
def test_every_public_name_has_an_api_entry(module_name):
    if module_name == "posenc.keras":
        pytest.importorskip("keras")
    if module_name == "posenc.integrations.torchtitan":
        pytest.importorskip("torchtitan")
    module = importlib.import_module(module_name)
    documented = _documented(api_directives(API_PAGES))
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        # the entry must name it and be the very same object (the Keras scaling rules are the core classes)
        if not any(ident.rsplit(".", 1)[-1] == name and target is obj for ident, target in documented):
            missing.append(name)
    assert not missing, (f"{module_name}.__all__ names without an API entry in docs/api/*.md: {missing}; "
                         f"add a '::: <module>.<name>' directive")


def test_every_api_directive_names_an_existing_object():
    # a renamed or removed name leaves no stale entry behind (mkdocs build --strict says the same, slower)
    idents = api_directives(API_PAGES)
    assert len(idents) > 50
    for ident, obj in _documented(idents):
        assert obj is not None, ident


def test_api_pages_are_in_the_nav():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from pages(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from pages(value)

    nav = list(pages(config["nav"]))
    assert len(nav) == len(set(nav)), "a page appears twice in the nav"
    assert {f"api/{p.name}" for p in API_PAGES} <= set(nav)
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
               if not p.relative_to(DOCS).as_posix().startswith(("hooks/", "runs/"))}
    assert on_disk - set(nav) == set(), "pages missing from the nav in mkdocs.yml"
    assert config["theme"]["font"] is False     # Google Fonts would be a request to another host


# ------------------------------------------------------------------------------------------------
# The gallery shows every figure `posenc plot` draws.


def test_gallery_shows_every_plot_figure():
    drawn = set(re.findall(r'"(\w+\.png)"', (ROOT / "posenc" / "lab" / "plots.py").read_text(encoding="utf-8")))
    shown = set(re.findall(r"\]\(gallery/(\w+\.png)\)", (DOCS / "gallery.md").read_text(encoding="utf-8")))
    assert len(drawn) >= 5
    assert drawn == shown
    assert "(compare_quick.png)" in (DOCS / "gallery.md").read_text(encoding="utf-8")
    assert (DOCS / "compare_quick.png").is_file()


def test_cli_page_describes_what_posenc_plot_writes():
    """docs/cli.md names every figure, says how many, and what --max-len sets (the similarity figure
    reaches 4 x --max-len)."""
    drawn = set(re.findall(r'"(\w+\.png)"', (ROOT / "posenc" / "lab" / "plots.py").read_text(encoding="utf-8")))
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    section = page[page.index("## `posenc plot`"):]
    words = {5: "five", 6: "six", 7: "seven", 8: "eight"}
    assert f"Writes {words[len(drawn)]} PNG figures" in section
    assert drawn == set(re.findall(r"^\| `(\w+\.png)` \|", section, re.M))
    assert drawn == set(re.findall(r"^figures/(\w+\.png)$", section, re.M))
    assert "4 × max-len" in section and "largest distance shown" not in section
    from posenc.cli import build_parser

    plot_help = build_parser()._subparsers._group_actions[0].choices["plot"].format_help()
    assert f"{words[len(drawn)]} PNG figures" in " ".join(plot_help.split()) and "4 x --max-len" in plot_help


# ------------------------------------------------------------------------------------------------
# Install advice that works: posenc is not on PyPI, so `pip install "posenc[...]"` fails today.

_PYPI_EXTRA = re.compile(r"""pip install ["']?posenc\[""")


def _advice_files() -> list[pathlib.Path]:
    return ([ROOT / "README.md"] + sorted(DOCS.rglob("*.md")) + sorted((ROOT / "posenc").rglob("*.py")))


def test_pip_advice_does_not_rely_on_pypi():
    """Every ``pip install "posenc[...]"`` is said to be for once posenc is on PyPI; the advice that
    works today installs from a clone (``pip install ".[plot]"``) or the dependency itself."""
    bad = []
    for path in _advice_files():
        text = " ".join(path.read_text(encoding="utf-8").split())        # joins wrapped lines
        for match in _PYPI_EXTRA.finditer(text):
            context = text[max(0, match.start() - 80) : match.end() + 40]
            if "on PyPI" not in context:
                bad.append(f"{path.relative_to(ROOT)}: ...{context}...")
    assert not bad, "pip advice that fails while posenc is not on PyPI:\n" + "\n".join(bad)


_TORCH_RECIPE = ("On a normal Linux machine, `pip install torch==2.13.0` from PyPI fetches a CUDA build (several "
                 "GB); for a CPU-only install, run `pip install torch==2.13.0 --index-url "
                 "https://download.pytorch.org/whl/cpu` first (any `torch>=2.4` works).")


def test_readme_and_getting_started_give_the_same_torch_recipe():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for text in (readme, (DOCS / "getting-started.md").read_text(encoding="utf-8")):
        assert _TORCH_RECIPE in " ".join(text.split())
    # the quick start's two commands install torch from PyPI, as the recipe says
    quick = readme[readme.index("## Quick start"):].split("```")[1].splitlines()[1:]
    assert [line.split(" && ")[0] for line in quick] == ["pip install torch==2.13.0"] * 2


def test_cli_help_gives_install_advice_that_works_today():
    from posenc.cli import _torch_missing, build_parser

    epilog = " ".join(build_parser().format_help().split())
    assert 'pip install ".[torch,plot]"' in epilog and "pip install torch" in epilog
    assert "posenc[" not in epilog.replace('once posenc is on PyPI: pip install "posenc[torch,plot]"', "")
    assert _torch_missing("compare") is None or "posenc[" not in _torch_missing("compare")


# ------------------------------------------------------------------------------------------------
# The griffe extension that turns reST roles into cross-references.


def _griffe_ext():
    pytest.importorskip("griffe")
    return _load_script("posenc_griffe_ext", DOCS / "hooks" / "griffe_posenc.py")


def test_shared_parameter_entries_are_split():
    ext = _griffe_ext()
    text = "Summary.\n\nArgs:\n    q: queries.\n    k, v: keys and values,\n        continued.\n\nExamples:\n    >>> a, b: 1\n"
    assert ext._split_shared_params(text) == (
        "Summary.\n\nArgs:\n    q: queries.\n    k: keys and values,\n        continued.\n"
        "    v: keys and values,\n        continued.\n\nExamples:\n    >>> a, b: 1\n")


def test_prose_returns_keep_their_colons():
    ext = _griffe_ext()
    text = ("Returns:\n    ``(cos, sin)``, each ``shape[:-1] + (n,)``.\n\n"
            "Yields:\n    ``(a, b)``: two tensors.\n\nRaises:\n    ValueError: bad ``x``.\n")
    assert ext._protect_returns(text) == (
        "Returns:\n    ``(cos, sin)``, each\n        ``shape[:-1] + (n,)``.\n\n"
        "Yields:\n    (a, b): two tensors.\n\nRaises:\n    ValueError: bad ``x``.\n")
    assert ext._protect_returns("Returns:\n    Tensor: a type before the colon.\n") == (
        "Returns:\n    Tensor: a type before the colon.\n")


def test_roles_become_cross_references():
    ext = _griffe_ext()
    import griffe

    modules = {
        "__init__.py": "_EXPORTS = {'apply_rope': 'pkgx.functional'}\n",
        "functional/__init__.py": "from pkgx.functional.rope import apply_rope, layout_permutation\n",
        "functional/rope.py": (
            "def apply_rope(x):\n"
            "    '''Rotate; see :func:`layout_permutation`, :func:`~pkgx.apply_rope`, :class:`torch.Tensor`\n"
            "    and :meth:`_private`. The layout::\n\n        a b | c d\n    '''\n\n"
            "def layout_permutation(d):\n    '''P.'''\n"
        ),
    }

    class Extension(ext.PosencDocstrings):
        package = "pkgx"

    with griffe.temporary_visited_package("pkgx", modules) as pkg:
        Extension().on_package(pkg=pkg)
        text = pkg["functional.rope.apply_rope"].docstring.value
    assert '<autoref identifier="pkgx.functional.rope.layout_permutation" optional><code>layout_permutation</code>' in text
    assert '<autoref identifier="pkgx.functional.apply_rope" optional><code>apply_rope</code></autoref>' in text
    assert "<code>torch.Tensor</code>" in text and 'identifier="torch' not in text
    assert "The layout:\n" in text and "::" not in text


# ------------------------------------------------------------------------------------------------
# scripts/check_site.py: the pure parts.


def test_html_pages_lists_every_html_file(tmp_path):
    (tmp_path / "api" / "nn").mkdir(parents=True)
    for name in ("index.html", "404.html", "api/nn/index.html", "api/nn/x.png"):
        (tmp_path / name).write_text("x")
    assert check_site.html_pages(tmp_path) == ["404.html", "api/nn/index.html", "index.html"]


def test_anchor_ids_and_hrefs():
    html = ('<h2 id="a">A</h2><a name="b"></a><a href="x/#c">x</a><a href="https://e.org/">e</a>'
            '<div id="d &amp; e"></div><a>no href</a><link href="style.css">')
    assert check_site.anchor_ids(html) == {"a", "b", "d & e"}
    assert check_site.extract_hrefs(html) == ["x/#c", "https://e.org/"]


def test_internal_links_resolve_relative_and_drop_other_hosts():
    page = "http://127.0.0.1:8000/api/nn/"
    hrefs = ["../functional/#apply_rope", "#top", "/", "https://example.org/x", "mailto:a@b.c",
             "javascript:void(0)", "http://127.0.0.1:9999/other/", "../../gallery/x.png", "?q=1", ""]
    links = check_site.internal_links(hrefs, page)
    assert [(link.url, link.fragment) for link in links] == [
        ("http://127.0.0.1:8000/api/functional/", "apply_rope"),
        ("http://127.0.0.1:8000/api/nn/", "top"),
        ("http://127.0.0.1:8000/", ""),
        ("http://127.0.0.1:8000/gallery/x.png", ""),
        ("http://127.0.0.1:8000/api/nn/?q=1", ""),
    ]


def test_link_problems_reports_missing_pages_and_anchors():
    pages = {"http://h/good/": (200, '<h1 id="top">x</h1>'), "http://h/gone/": (404, ""), "http://h/down/": (0, "")}
    fetched = []

    def fetch(url):
        fetched.append(url)
        return pages[url]

    links = check_site.internal_links(["good/#top", "good/#nowhere", "gone/", "down/", "good/"], "http://h/")
    problems = check_site.link_problems("index.html", links, fetch)
    assert [(p.page, p.kind) for p in problems] == [("index.html", "link")] * 3
    assert "no element with id 'nowhere'" in problems[0].detail
    assert "HTTP 404" in problems[1].detail
    assert "no answer" in problems[2].detail


def test_is_local():
    origin = "http://127.0.0.1:8000"
    assert check_site.is_local("http://127.0.0.1:8000/assets/x.js", origin)
    assert check_site.is_local("data:image/png;base64,AAAA", origin)
    assert not check_site.is_local("https://fonts.googleapis.com/css", origin)
    assert not check_site.is_local("http://127.0.0.1:8001/x", origin)


def test_main_without_a_browser(tmp_path, capsys):
    (tmp_path / "index.html").write_text("<html></html>")
    missing = str(tmp_path / "no-chromium")
    assert check_site.main(["--site", str(tmp_path), "--chromium", missing, "--skip-if-no-chromium"]) == 0
    assert "skipped" in capsys.readouterr().err
    assert check_site.main(["--site", str(tmp_path), "--chromium", missing]) == 2
    assert check_site.main(["--site", str(tmp_path / "nothing-built")]) == 2
    assert "mkdocs build" in capsys.readouterr().err


def test_code_width_and_split_name_problems():
    blocks = [{"lines": 3, "wide": 2, "cols": 80, "longest": 97, "first": "  x = f(a, b)  # " + "c" * 60},
              {"lines": 1, "wide": 0, "cols": 40, "longest": 30, "first": "short"}]
    problems = check_site.code_width_problems("p.html", blocks)
    assert [(p.page, p.kind) for p in problems] == [("p.html", "code-width")] * 2
    assert problems[0].detail.startswith("2 of 3 lines wider than the 80 characters that fit (longest 97): ")
    assert problems[0].detail.endswith("...'") and len(problems[0].detail) < 160
    assert "content wider than its box" in problems[1].detail
    split = check_site.split_name_problems("t.html", [["rope_cos_sin", "rope_co", "s_sin"]])
    assert [str(p) for p in split] == ["t.html: split-name: 'rope_cos_sin' broken as 'rope_co' / 's_sin' in a table cell"]


def test_table_code_hook_adds_breaks_at_punctuation_and_camel_case_only():
    hook = _load_script("posenc_table_code", DOCS / "hooks" / "table_code.py")
    html = ('<p><code>keep.as.is</code></p><table><tr><th><code>a.b</code></th>'
            '<td>text. <code>posenc.core.AxialRotaryEmbedding(dim, x=&quot;y&quot;)</code> '
            '<code>INTERLEAVED_MODEL_TYPES</code> <a href="x.y">u.v</a></td></tr></table>')
    assert hook.wrap_table_code(html) == (
        '<p><code>keep.as.is</code></p><table><tr><th><code>a.<wbr>b</code></th>'
        '<td>text. <code>posenc.<wbr>core.<wbr>Axial<wbr>Rotary<wbr>Embedding(<wbr>dim, x=<wbr>&quot;y&quot;)</code> '
        '<code>INTERLEAVED_<wbr>MODEL_<wbr>TYPES</code> <a href="x.y">u.v</a></td></tr></table>')


_DOCS_CODE_WIDTH = 80          # characters a code block on the site shows at 1280 px


def _code_lines(page: pathlib.Path):
    fence, indent = None, 0
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        match = re.match(r"^(\s*)(`{3,}|~{3,})", line)
        if fence is None and match:
            fence, indent = match[2], len(match[1])
        elif fence is not None and line.strip().startswith(fence) and not line.strip().strip("`~"):
            fence = None
        elif fence is not None:
            yield number, line[indent:]


def test_docs_code_lines_fit_the_code_blocks():
    """Every line in a code block of docs/*.md fits the site's code block (scripts/check_site.py
    measures the same in Chromium): wrap long comments onto their own lines, split long calls."""
    wide = [f"{page.relative_to(ROOT)}:{number}: {len(text)} characters"
            for page in sorted(DOCS.rglob("*.md")) if "hooks" not in page.parts
            for number, text in _code_lines(page) if len(text) > _DOCS_CODE_WIDTH]
    assert not wide, "\n".join(wide)


# ------------------------------------------------------------------------------------------------
# scripts/check_site.py in Chromium, on a tiny site with known problems.

_HEAD = '<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>t</title></head>'


def test_browser_check_reports_exactly_the_planted_problems(tmp_path):
    pytest.importorskip("playwright.sync_api")
    if check_site.browser_missing(check_site.DEFAULT_CHROMIUM):
        pytest.skip(check_site.browser_missing(check_site.DEFAULT_CHROMIUM))
    (tmp_path / "sub").mkdir()
    (tmp_path / "index.html").write_text(
        _HEAD + '<body><h1 id="top">Good</h1><a href="sub/">sub</a> <a href="sub/#part">part</a> '
        '<a href="#top">top</a> <a href="https://example.org/not-fetched">external</a></body></html>')
    (tmp_path / "sub" / "index.html").write_text(
        _HEAD + '<body><h2 id="part">Part</h2><a href="../">home</a></body></html>')
    (tmp_path / "broken.html").write_text(
        _HEAD + '<body><a href="missing.html">gone</a> <a href="sub/#nowhere">bad anchor</a> '
        '<a href="index.html#top">fine</a></body></html>')
    (tmp_path / "noisy.html").write_text(
        _HEAD + "<body><p>ok</p><script>console.error('planted console error')</script></body></html>")
    narrow = "<style>pre { width: 400px; overflow: auto } td { width: 60px } td code { word-break: break-all }</style>"
    fits, wide = "x = 1  # fits", "y = f(" + ", ".join(["argument"] * 12) + ")  # cut off"
    (tmp_path / "layout.html").write_text(
        _HEAD + f"<body>{narrow}<pre><code>{fits}\n{wide}</code></pre>"                    # one wide block
        f"<pre><code>{fits}</code></pre>"                                                  # fits
        f"<pre style='white-space: pre-wrap'><code>{wide}</code></pre>"                    # wraps: visible
        f"<details><pre><code>{wide}</code></pre></details>"                               # closed: no box
        "<table style='table-layout: fixed; width: 200px'><tr><td><code>sinusoidalencodingtable</code></td>"
        "<td><code>a b c d e f g h</code></td></tr></table></body></html>")                # split / wraps at spaces

    problems = check_site.check_site(tmp_path)

    assert sorted((p.page, p.kind) for p in problems) == [
        ("broken.html", "link"), ("broken.html", "link"), ("layout.html", "code-width"),
        ("layout.html", "split-name"), ("noisy.html", "console")], problems
    details = " | ".join(p.detail for p in problems)
    assert "missing.html -> HTTP 404" in details
    assert "no element with id 'nowhere'" in details
    assert "planted console error" in details
    assert "1 of 2 lines wider than the" in details and "'sinusoidalencodingtable' broken as" in details
