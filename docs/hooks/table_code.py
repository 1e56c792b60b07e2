"""MkDocs hook: let code in table cells wrap at the punctuation inside names, not mid-word.

A narrow column used to split a long name such as ``posenc.core.hf_config.INTERLEAVED_MODEL_TYPES``
anywhere (``INTERLEAVED_MO`` / ``DEL_TYPES``). Browsers break lines at spaces but not after ``.``
or ``_``, so this hook adds a line-break opportunity (``<wbr>``) inside ``<code>`` in table cells
after each ``.``, ``(``, ``,``, ``=``, ``/`` and ``_``, and between the words of a CamelCase name:
the name then wraps as ``posenc.core.hf_config.`` / ``INTERLEAVED_MODEL_TYPES`` or
``AxialRotary`` / ``Embedding``. The text is unchanged (copying it gives no extra characters).
``scripts/check_site.py`` reports any name still split inside a word.
"""

from __future__ import annotations

import re

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

_CELL = re.compile(r"(<t[dh]\b[^>]*>)(.*?)(</t[dh]>)", re.S)
_CODE = re.compile(r"(<code\b[^>]*>)(.*?)(</code>)", re.S)
_TAG_OR_TEXT = re.compile(r"(<[^>]+>)|([^<]+)")
#: after ``.``, ``(``, ``,``, ``=``, ``/`` or ``_``, and between the words of a CamelCase name
_BREAK = re.compile(r"(?<=[.(,=/_])(?=[^\s<_])|(?<=[a-z0-9])(?=[A-Z])")


def _break_text(text: str) -> str:
    """``<wbr>`` after each break character of ``text`` (HTML), outside tags and entities."""
    out = []
    for tag, chars in _TAG_OR_TEXT.findall(text):
        out.append(tag or _BREAK.sub("<wbr>", chars))
    return "".join(out)


def wrap_table_code(html: str) -> str:
    """``html`` with line-break opportunities after punctuation in every ``<code>`` of a table cell."""
    def cell(match: re.Match) -> str:
        body = _CODE.sub(lambda m: m[1] + _break_text(m[2]) + m[3], match[2])
        return match[1] + body + match[3]

    return _CELL.sub(cell, html)


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return wrap_table_code(html)
