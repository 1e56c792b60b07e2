#!/usr/bin/env python3
"""Check the built documentation site in a real browser.

Serves ``site/`` (``mkdocs build`` output) on a free localhost port, opens every HTML page in
headless Chromium and fails, listing each problem, when

- a page does not load (navigation error, or HTTP status other than 200);
- a link is broken: every ``<a href>`` to the same host must answer 200, and a ``#fragment`` must
  be the ``id`` of an element on the target page (links to other hosts are not fetched);
- the page logs a console error, throws an uncaught exception, or a request to the local server
  fails (status 400 or more, or no answer);
- the page requests anything from another host (the site must work offline: no web fonts, no
  CDN scripts); such requests are blocked and reported;
- at a 1280 x 800 viewport, a visible code block holds lines wider than its box (the reader would
  have to scroll sideways to see the end of a comment or an argument), a table is wider than its
  box (its last columns hidden), or a code name in a table cell is broken between two letters or
  digits (a narrow column splitting it mid-word).

Usage::

    mkdocs build --strict && python scripts/check_site.py
    python scripts/check_site.py --screenshot index.html home.png --screenshot api/nn/ nn.png
    python scripts/check_site.py --skip-if-no-chromium     # CI: exit 0 when no browser is installed

Needs the Python ``playwright`` package and a Chromium binary (``--chromium``, default
``/usr/bin/chromium``); it never downloads a browser. Exit status: 0 clean, 1 problems found,
2 usage error or missing browser.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import html.parser
import http.server
import pathlib
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Request, Response, Route

DEFAULT_CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-proxy-server",                       # the site is on localhost: never through a proxy
]
#: Schemes of links that are not pages (nothing to fetch).
_NOT_FETCHED = ("mailto", "javascript", "data", "tel", "blob", "about")
#: Milliseconds to wait for a page to load, and then for its network to settle.
LOAD_TIMEOUT_MS = 30_000
SETTLE_TIMEOUT_MS = 5_000
#: The window the layout checks read the pages in: a common laptop screen.
VIEWPORT = {"width": 1280, "height": 800}

#: In the page: every visible code block whose content is wider than its box, as
#: ``{lines, wide, cols, longest, first}``: its line count, how many lines do not fit, how many
#: characters fit, the longest line's length and the first line that does not fit.  Blocks inside
#: closed ``<details>`` or hidden tabs have no box and are not measured.
_WIDE_CODE_JS = """() => {
  const out = [];
  for (const pre of document.querySelectorAll("pre")) {
    const code = pre.querySelector("code") || pre;
    const box = [pre, code].find(e => e.scrollWidth > e.clientWidth + 1);
    const shown = pre.checkVisibility ? pre.checkVisibility() : pre.getClientRects().length > 0;
    if (!box || !shown) continue;
    const probe = document.createElement("span");
    probe.textContent = "0".repeat(100);
    code.appendChild(probe);
    const charWidth = probe.getBoundingClientRect().width / 100;
    probe.remove();
    const style = getComputedStyle(box);
    const inner = box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const cols = Math.floor(inner / charWidth + 0.01);
    const lines = code.textContent.replace(/\\n$/, "").split("\\n");
    const wide = lines.filter(l => l.length > cols);
    out.push({lines: lines.length, wide: wide.length, cols: cols,
              longest: Math.max(...lines.map(l => l.length)), first: wide.length ? wide[0] : lines[0]});
  }
  return out;
}"""

#: In the page: every visible table wider than its box (its right-hand columns hidden until the
#: reader scrolls sideways), as ``{header, width, box}``: its first row's text and the two widths.
_WIDE_TABLES_JS = """() => {
  const out = [];
  for (const table of document.querySelectorAll("table")) {
    if (table.checkVisibility && !table.checkVisibility()) continue;
    const boxes = [table, table.parentElement, table.parentElement && table.parentElement.parentElement];
    const box = boxes.find(e => e && e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 0
                                && getComputedStyle(e).overflowX !== "visible");
    if (!box) continue;
    const first = table.querySelector("tr");
    out.push({header: first ? first.innerText.replace(/\\s+/g, " ").trim() : "",
              width: box.scrollWidth, box: box.clientWidth});
  }
  return out;
}"""

#: In the page: the text of every ``code`` element in a table cell that the browser broke between
#: two letters or digits (a name split mid-word), with the two pieces around the break.  Breaks at
#: a space, after punctuation (``-``, ``.``, ``_``, ``,``) or where a CamelCase word starts
#: (``AxialRotary`` / ``Embedding``) are where a name may wrap.
_SPLIT_NAMES_JS = """() => {
  const out = [];
  for (const code of document.querySelectorAll("td code, th code")) {
    if (code.getClientRects().length < 2) continue;
    const text = code.textContent, range = document.createRange();
    const tops = [];
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (let i = 0; i < node.length; i++) {
        range.setStart(node, i); range.setEnd(node, i + 1);
        const rect = range.getClientRects()[0];
        tops.push(rect ? rect.top : null);
      }
    }
    let last = null;
    for (let i = 0; i < text.length; i++) {
      if (tops[i] === null || /\\s/.test(text[i])) continue;
      // a break between two letters or digits, with no space between them and not where a
      // CamelCase word starts: a name split mid-word
      if (last !== null && tops[i] > tops[last] + 2 && !/\\s/.test(text.slice(last, i + 1))
          && /[A-Za-z0-9]/.test(text[last]) && /[A-Za-z0-9]/.test(text[i])
          && !(/[a-z0-9]/.test(text[last]) && /[A-Z]/.test(text[i]))) {
        out.push([text, text.slice(0, i), text.slice(i)]);
        break;
      }
      last = i;
    }
  }
  return out;
}"""


@dataclasses.dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong with one page: ``page`` is its site path (``api/nn/index.html``)."""

    page: str
    kind: str        # "load", "link", "console", "page-error", "request", "external-request",
                     # "code-width", "split-name", "table-width"
    detail: str

    def __str__(self) -> str:
        return f"{self.page}: {self.kind}: {self.detail}"


# ------------------------------------------------------------------------------------------------
# Pure functions: which pages, which links, which anchors (tested without a browser).


def html_pages(site: pathlib.Path) -> list[str]:
    """Site-relative paths (POSIX) of every ``.html`` file under ``site``, sorted."""
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html") if p.is_file())


class _Collector(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"] or "")
        if tag == "a" and values.get("name"):
            self.ids.add(values["name"] or "")
        if tag == "a" and values.get("href") is not None:
            self.hrefs.append(values["href"] or "")


def _parse(text: str) -> _Collector:
    collector = _Collector()
    collector.feed(text)
    collector.close()
    return collector


def anchor_ids(text: str) -> set[str]:
    """Every fragment target of an HTML document: ``id`` attributes, and ``name`` on ``<a>``."""
    return _parse(text).ids


def extract_hrefs(text: str) -> list[str]:
    """The raw ``href`` of every ``<a>`` in an HTML document, in order."""
    return _parse(text).hrefs


@dataclasses.dataclass(frozen=True)
class Link:
    """A link to the local site: the ``url`` to fetch (no fragment) and its ``fragment`` ('' if none)."""

    href: str
    url: str
    fragment: str


def internal_links(hrefs: Iterable[str], page_url: str) -> list[Link]:
    """The links among ``hrefs`` (as written on the page at ``page_url``) that point to the same host.

    Relative links are resolved against ``page_url``; links to other hosts and non-page schemes
    (``mailto:``, ``javascript:``, ...) are left out. A bare ``#fragment`` points to the page itself.
    """
    origin = urllib.parse.urlsplit(page_url)
    links = []
    for href in hrefs:
        href = href.strip()
        if not href or urllib.parse.urlsplit(href).scheme in _NOT_FETCHED:
            continue
        absolute = urllib.parse.urljoin(page_url, href)
        parts = urllib.parse.urlsplit(absolute)
        if parts.scheme not in ("http", "https") or parts.netloc != origin.netloc:
            continue
        url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path or "/", parts.query, ""))
        links.append(Link(href, url, urllib.parse.unquote(parts.fragment)))
    return links


Fetch = Callable[[str], tuple[int, str]]


def link_problems(page: str, links: Iterable[Link], fetch: Fetch) -> list[Problem]:
    """Problems with ``links`` found on ``page``: a target that does not answer 200, or a fragment
    that is no ``id`` on the target. ``fetch(url) -> (status, html)`` is called once per target
    (callers cache it); the status is 0 when nothing answered."""
    problems = []
    for link in links:
        status, text = fetch(link.url)
        if status != 200:
            problems.append(Problem(page, "link", f"{link.href} -> HTTP {status or 'no answer'} ({link.url})"))
        elif link.fragment and link.fragment not in _ids_cached(text):
            problems.append(Problem(page, "link", f"{link.href} -> no element with id {link.fragment!r} on {link.url}"))
    return problems


@functools.lru_cache(maxsize=256)
def _ids_cached(text: str) -> frozenset[str]:
    return frozenset(anchor_ids(text))


def code_width_problems(page: str, blocks: Iterable[dict]) -> list[Problem]:
    """Problems for code blocks measured wider than their box (``_WIDE_CODE_JS``'s records)."""
    problems = []
    for block in blocks:
        first = block["first"].strip()
        first = first if len(first) <= 60 else first[:57] + "..."
        if block["wide"]:
            what = (f"{block['wide']} of {block['lines']} line{'s' * (block['lines'] != 1)} wider than the "
                    f"{block['cols']} characters that fit (longest {block['longest']})")
        else:   # wider than its box, yet no line is: the box itself is too narrow (a table, a layout bug)
            what = f"content wider than its box ({block['cols']} characters fit)"
        problems.append(Problem(page, "code-width", f"{what}: {first!r}"))
    return problems


def table_width_problems(page: str, tables: Iterable[dict]) -> list[Problem]:
    """Problems for tables wider than their box (``_WIDE_TABLES_JS``'s records)."""
    problems = []
    for table in tables:
        header = table["header"] if len(table["header"]) <= 60 else table["header"][:57] + "..."
        problems.append(Problem(page, "table-width", f"{table['width']} px wide in a {table['box']} px box, "
                                                     f"its last columns hidden: {header!r}"))
    return problems


def split_name_problems(page: str, names: Iterable[list[str]]) -> list[Problem]:
    """Problems for code names broken mid-word in table cells (``_SPLIT_NAMES_JS``'s records)."""
    return [Problem(page, "split-name", f"{text!r} broken as {head!r} / {tail!r} in a table cell")
            for text, head, tail in names]


def is_local(url: str, origin: str) -> bool:
    """Whether ``url`` is served by the local server at ``origin`` (``http://127.0.0.1:PORT``),
    or needs no server at all (``data:``, ``blob:``, ``about:``)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("data", "blob", "about"):
        return True
    return parts.netloc == urllib.parse.urlsplit(origin).netloc


# ------------------------------------------------------------------------------------------------
# The server and the browser.


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve(site: pathlib.Path) -> Iterator[str]:
    """Serve ``site`` on a free port of 127.0.0.1 in a background thread; yields the origin URL."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def make_fetch() -> Fetch:
    """``fetch(url) -> (status, text)`` over HTTP, cached per URL.  The local server is asked
    directly, never through a proxy that the environment names (``http_proxy``)."""
    cache: dict[str, tuple[int, str]] = {}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def fetch(url: str) -> tuple[int, str]:
        if url not in cache:
            try:
                with opener.open(url, timeout=10) as response:
                    body = response.read()
                    kind = response.headers.get_content_type()
                    cache[url] = (response.status, body.decode("utf-8", "replace") if "html" in kind else "")
            except urllib.error.HTTPError as err:
                cache[url] = (err.code, "")
            except (urllib.error.URLError, OSError):
                cache[url] = (0, "")
        return cache[url]

    return fetch


def browser_missing(chromium: str) -> str | None:
    """Why the browser check cannot run, or None when it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package playwright is not installed (pip install playwright; no browser download needed)"
    if not pathlib.Path(chromium).is_file():
        return f"no Chromium at {chromium} (install the chromium package or pass --chromium PATH)"
    return None


@contextlib.contextmanager
def _browser(chromium: str) -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class _PageCheck:
    """One page being checked: listeners attached and navigation started; :meth:`finish` collects."""

    def __init__(self, context: BrowserContext, origin: str, page_path: str) -> None:
        self.origin, self.page_path, self.url = origin, page_path, f"{origin}/{page_path}"
        self.problems: list[Problem] = []
        self.page = page = context.new_page()
        page.route("**/*", self._route)
        page.on("console", self._console)
        page.on("pageerror", lambda err: self._add("page-error", str(err)))
        page.on("response", self._response)
        page.on("requestfailed", self._failed)
        self.response = None
        try:   # start loading; several pages load side by side while earlier ones are finished
            self.response = page.goto(self.url, wait_until="commit", timeout=LOAD_TIMEOUT_MS)
        except Exception as err:   # playwright's Error/TimeoutError: the page did not load
            self._add("load", f"navigation failed: {str(err).splitlines()[0]}")

    def _add(self, kind: str, detail: str) -> None:
        self.problems.append(Problem(self.page_path, kind, detail))

    def _route(self, route: Route) -> None:
        url = route.request.url
        if is_local(url, self.origin):
            route.continue_()
        else:
            self._add("external-request", url)
            route.abort()

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            where = message.location or {}
            at = f" ({where.get('url')}:{where.get('lineNumber')})" if where.get("url") else ""
            self._add("console", f"{message.text}{at}")

    def _response(self, response: Response) -> None:
        if response.status >= 400 and is_local(response.url, self.origin):
            self._add("request", f"{response.url} -> HTTP {response.status}")

    def _failed(self, request: Request) -> None:
        if is_local(request.url, self.origin):
            self._add("request", f"{request.url} failed: {request.failure}")

    def finish(self, fetch: Fetch) -> list[Problem]:
        page = self.page
        if not any(p.kind == "load" for p in self.problems):
            if self.response is None or self.response.status != 200:
                status = self.response.status if self.response is not None else "no response"
                self._add("load", f"HTTP {status}")
            try:
                page.wait_for_load_state("load", timeout=LOAD_TIMEOUT_MS)
            except Exception as err:
                self._add("load", f"did not finish loading: {str(err).splitlines()[0]}")
            else:
                with contextlib.suppress(Exception):   # a page that keeps polling never goes idle
                    page.wait_for_load_state("networkidle", timeout=SETTLE_TIMEOUT_MS)
                hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
                self.problems += link_problems(self.page_path, internal_links(hrefs, self.url), fetch)
                self.problems += code_width_problems(self.page_path, page.evaluate(_WIDE_CODE_JS))
                self.problems += split_name_problems(self.page_path, page.evaluate(_SPLIT_NAMES_JS))
                self.problems += table_width_problems(self.page_path, page.evaluate(_WIDE_TABLES_JS))
        page.close()
        return self.problems


def check_site(site: pathlib.Path, *, chromium: str = DEFAULT_CHROMIUM,
               pages: Iterable[str] | None = None, parallel: int = 4) -> list[Problem]:
    """Every problem on ``pages`` (default: every HTML page) of the site built in ``site``,
    loading up to ``parallel`` pages at a time."""
    fetch = make_fetch()
    todo = list(html_pages(site) if pages is None else pages)
    problems: list[Problem] = []
    with serve(site) as origin, _browser(chromium) as browser:
        context = browser.new_context(service_workers="block", viewport=VIEWPORT)
        for start in range(0, len(todo), parallel):
            checks = [_PageCheck(context, origin, path) for path in todo[start : start + parallel]]
            for check in checks:
                problems += check.finish(fetch)
        context.close()
    return sorted(set(problems))


def screenshot(site: pathlib.Path, page_path: str, out: pathlib.Path, *, chromium: str = DEFAULT_CHROMIUM,
               width: int = 1280, height: int = 800) -> None:
    """Write a full-page PNG of one page of the site (``index.html``, ``api/nn/``, ...)."""
    with serve(site) as origin, _browser(chromium) as browser:
        page = browser.new_page(viewport={"width": width, "height": height})
        response = page.goto(f"{origin}/{page_path.lstrip('/')}", wait_until="load", timeout=LOAD_TIMEOUT_MS)
        if response is None or response.status != 200:
            raise FileNotFoundError(f"{page_path} did not load from {site} (HTTP {response.status if response else '-'})")
        with contextlib.suppress(Exception):
            page.wait_for_load_state("networkidle", timeout=SETTLE_TIMEOUT_MS)
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=pathlib.Path, default=pathlib.Path("site"),
                        help="folder that mkdocs build wrote (default: site)")
    parser.add_argument("--chromium", default=DEFAULT_CHROMIUM, help=f"Chromium binary (default {DEFAULT_CHROMIUM})")
    parser.add_argument("--screenshot", nargs=2, action="append", metavar=("PAGE", "OUT.png"), default=[],
                        help="write a full-page screenshot of PAGE (a site path such as index.html or api/nn/) "
                             "to OUT.png instead of checking; may be repeated")
    parser.add_argument("--skip-if-no-chromium", action="store_true",
                        help="exit 0 with a message when playwright or Chromium is missing")
    args = parser.parse_args(argv)

    site = args.site
    if not (site / "index.html").is_file():
        print(f"check_site: error: {site}/index.html not found; build the site first (mkdocs build --strict) "
              f"or pass --site DIR", file=sys.stderr)
        return 2
    missing = browser_missing(args.chromium)
    if missing:
        if args.skip_if_no_chromium:
            print(f"check_site: skipped: {missing}", file=sys.stderr)
            return 0
        print(f"check_site: error: {missing}", file=sys.stderr)
        return 2

    if args.screenshot:
        for page_path, out in args.screenshot:
            try:
                screenshot(site, page_path, pathlib.Path(out), chromium=args.chromium)
            except FileNotFoundError as err:
                print(f"check_site: error: {err}", file=sys.stderr)
                return 1
            print(out)
        return 0

    pages = html_pages(site)
    problems = check_site(site, chromium=args.chromium, pages=pages)
    for problem in problems:
        print(problem)
    print(f"check_site: {len(pages)} pages, {len(problems)} problem{'s' * (len(problems) != 1)}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
