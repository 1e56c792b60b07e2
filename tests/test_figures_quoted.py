"""Every speed or GPU figure lives in one place: ``docs/benchmarks.md`` or ``docs/gpu.md``, in a
section that states the date, the device and the commit it was recorded at.  Anywhere else in the
README and the docs a figure is either absent or quoted: the passage holding it links the source
section and names the date, the device and the commit, and each of its numbers is one of the
source section's numbers (rounded as quoted).

A figure is a number with a speed unit (``×``/``x`` ratios, ``µs``, ``ms``, ``%``, ``GB/s``, "of a
copy", "times slower") in a passage that speaks of speed (a copy, faster, slower, costs, µs, a
launch, bandwidth); ratios of lengths ("8× the training length") are not figures.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SOURCES = {"benchmarks.md", "gpu.md"}

_NUMBER = r"\d+(?:\.\d+)?"
#: a number (or a range a–b) with a speed unit; groups 1 and 2 are the numbers.  A ratio (×) counts
#: when it has decimals or is a range: a whole "8×" is a multiple of a length, not a measurement.
_RATIO = re.compile(rf"(?<![\w.])({_NUMBER})(?:\s*(?:–|-|to)\s*({_NUMBER}))?\s*(?:×|x\b)")
_FIGURE = re.compile(
    rf"(?<![\w.])({_NUMBER})(?:\s*(?:–|-|to)\s*({_NUMBER}))?"
    rf"(?:\s*(?:µs\b|ms\b|%|GB/s|TB/s)|\s+of\s+(?:a|the)\s+(?:device\s+)?copy|\s+times\s+(?:slower|faster))")
_SPEED_WORDS = re.compile(r"a copy of q|device copy|\blimit\b|copy bandwidth|faster|slower|\bcosts?\b|µs|launch|"
                          r"bandwidth|GB/s", re.IGNORECASE)
_SOURCE_LINK = re.compile(r"\]\((?:docs/)?(benchmarks\.md|gpu\.md)#([\w-]+)\)")
_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
_COMMIT = re.compile(r"\bcommits?\s+[0-9a-f]{7,40}\b")
_DEVICE = re.compile(r"\b(?:CPU|H100|H200|A100|GPU)\b")


def _pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if p.name not in SOURCES)]


def _passages(text: str) -> list[str]:
    """Paragraphs, list items and table rows outside code blocks."""
    out, current, fenced = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        starts = line.lstrip().startswith(("- ", "* ", "|")) or re.match(r"\s*\d+\. ", line) or line.startswith("#")
        if not line.strip() or starts:
            if current:
                out.append(" ".join(current))
            current = [] if not line.strip() else [line]
            if line.lstrip().startswith("|") or line.startswith("#"):        # a row or heading is its own passage
                out.append(line)
                current = []
            continue
        current.append(line)
    if current:
        out.append(" ".join(current))
    return out


def _figures(passage: str) -> list[str]:
    """The numbers of the speed figures in a passage (none when it does not speak of speed)."""
    if not _SPEED_WORDS.search(passage):
        return []
    found = [(m.start(), n) for m in _FIGURE.finditer(passage) for n in m.groups() if n is not None]
    for m in _RATIO.finditer(passage):
        if m.group(2) is not None or "." in m.group(1):
            found += [(m.start(), n) for n in m.groups() if n is not None]
    return [n for _, n in sorted(found)]


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s+", "-", text)


def _sections(path: pathlib.Path) -> dict[str, str]:
    """Anchor -> the section's text (up to the next heading of the same or a higher level)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    heads = [(i, len(m.group(1)), m.group(2)) for i, line in enumerate(lines)
             if (m := re.match(r"(#{1,6})\s+(.*)", line)) and not _in_code(lines, i)]
    out = {}
    for n, (i, level, title) in enumerate(heads):
        end = next((j for j, lv, _ in heads[n + 1:] if lv <= level), len(lines))
        out[_slug(title)] = "\n".join(lines[i:end])
    return out


def _in_code(lines: list[str], index: int) -> bool:
    return sum(1 for line in lines[:index] if line.lstrip().startswith("```")) % 2 == 1


def _matches(quoted: str, numbers: set[str]) -> bool:
    """``quoted`` is one of ``numbers``, or one of them rounded to ``quoted``'s decimals."""
    decimals = len(quoted.partition(".")[2])
    return any(n == quoted or f"{float(n):.{decimals}f}" == quoted for n in numbers)


def _segments(passage: str) -> list[tuple[str, str | None, str | None]]:
    """``(text, source page, anchor)``: the passage cut after each link to a source section; the
    last piece, after the last link, has no source."""
    out, start = [], 0
    for m in _SOURCE_LINK.finditer(passage):
        out.append((passage[start:m.end()], m.group(1), m.group(2)))
        start = m.end()
    out.append((passage[start:], None, None))
    return out


SOURCE_SECTIONS = {name: _sections(DOCS / name) for name in SOURCES}
QUOTES = [(page.relative_to(ROOT).as_posix(), passage) for page in _pages()
          for passage in _passages(page.read_text(encoding="utf-8")) if _figures(passage)]


def test_the_pages_quote_figures():
    """The detector sees the quotes this test exists for (a broken detector would pass vacuously)."""
    pages = {page for page, _ in QUOTES}
    assert {"README.md", "docs/index.md", "docs/choosing.md"} <= pages


@pytest.mark.parametrize("page, passage", QUOTES, ids=[f"{p}:{i}" for i, (p, _) in enumerate(QUOTES)])
def test_every_figure_outside_the_sources_is_quoted_with_date_device_and_commit(page, passage):
    for text, source, anchor in _segments(passage):
        figures = _figures(text) if _SPEED_WORDS.search(passage) else []
        if not figures:
            continue
        assert source is not None, f"{page}: figures {figures} with no link to benchmarks.md or gpu.md after " \
                                   f"them: {text.strip()[:200]!r}"
        section = SOURCE_SECTIONS[source].get(anchor)
        assert section is not None, f"{page}: no section #{anchor} in docs/{source}"
        for what, pattern in (("date", _DATE), ("device", _DEVICE), ("commit", _COMMIT)):
            assert pattern.search(text), f"{page}: the quote {text.strip()[:160]!r} names no {what}"
            assert pattern.search(section), f"docs/{source}#{anchor} states no {what}"
        numbers = set(re.findall(_NUMBER, section))
        missing = [f for f in figures if not _matches(f, numbers)]
        assert not missing, f"{page}: {missing} are not figures of docs/{source}#{anchor}: {text.strip()[:200]!r}"


def test_every_source_section_with_figures_states_date_device_and_commit():
    for name, sections in SOURCE_SECTIONS.items():
        for anchor, text in sections.items():
            if text.startswith("# "):                     # the page title's section is the whole page
                continue
            rows = [p for p in _passages(text) if _figures(p) and p.lstrip().startswith("|")]
            if not rows:
                continue
            for what, pattern in (("date", _DATE), ("device", _DEVICE), ("commit", _COMMIT)):
                assert pattern.search(text), f"docs/{name}#{anchor} has measured tables but states no {what}"


def test_the_detector_and_the_rounding_rule():
    assert _figures("RoPE in place costs 0.95–2.6× a copy of q and k") == ["0.95", "2.6"]
    assert _figures("a prefill at 0.92–0.98 of a device copy") == ["0.92", "0.98"]
    assert _figures("the loss stays flat at 8× the training length") == []
    assert _matches("2.6", {"2.64"}) and _matches("67", {"66.73"}) and not _matches("2.7", {"2.64"})
    quote = "CPU 1.5× a copy (2026-11-23, commit abcdef1; [t](benchmarks.md#x)) then 3× faster"
    assert [(s, a) for _, s, a in _segments(quote)] == [("benchmarks.md", "x"), (None, None)]
