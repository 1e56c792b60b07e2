"""MkDocs hook: draw the figures of ``posenc plot`` at build time and publish them as ``gallery/*.png``.

The figures come from the same command users run (``python -m posenc plot``, in a subprocess so
that matplotlib's state stays out of the build), so the gallery always shows what the installed
code draws. Building the site therefore needs ``posenc[torch,plot]``; without it the build stops
with the error ``posenc plot`` printed. A figure that ``docs/gallery.md`` does not show is a
build warning, which ``mkdocs build --strict`` turns into an error.
"""

from __future__ import annotations

import logging
import pathlib
import shutil
import subprocess
import sys
import tempfile

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

GALLERY_DIR = "gallery"
GALLERY_PAGE = "gallery.md"

log = logging.getLogger("mkdocs.hooks.gallery")
_drawn: dict[str, pathlib.Path] = {}     # one drawing per process (mkdocs serve rebuilds reuse it)


def _draw(repo: pathlib.Path) -> pathlib.Path:
    if "out" in _drawn:
        return _drawn["out"]
    out = pathlib.Path(tempfile.mkdtemp(prefix="posenc-gallery-"))
    command = [sys.executable, "-m", "posenc", "plot", "--out", str(out)]
    proc = subprocess.run(command, cwd=repo, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        shutil.rmtree(out, ignore_errors=True)
        raise PluginError(
            f"the gallery runs `{' '.join(command[1:])}`, which failed with exit code {proc.returncode}:\n"
            f"{proc.stderr.strip()}\n"
            'Building the docs needs the plotting extras: pip install -e ".[torch,plot,docs]"'
        )
    _drawn["out"] = out
    return out


def figures() -> list[str]:
    """File names of the figures drawn in this build (empty before ``on_files``)."""
    out = _drawn.get("out")
    return sorted(p.name for p in out.glob("*.png")) if out else []


def on_files(files: Files, config: MkDocsConfig) -> Files:
    out = _draw(pathlib.Path(config.config_file_path).parent)
    for png in sorted(out.glob("*.png")):
        files.append(File.generated(config, f"{GALLERY_DIR}/{png.name}", abs_src_path=str(png)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri == GALLERY_PAGE:
        for name in figures():
            if f"{GALLERY_DIR}/{name}" not in markdown:
                log.warning(f"{GALLERY_PAGE} does not show the figure {GALLERY_DIR}/{name} that `posenc plot` draws; "
                            f"add it with a caption")
    return markdown


def on_shutdown() -> None:
    out = _drawn.pop("out", None)
    if out is not None:
        shutil.rmtree(out, ignore_errors=True)
