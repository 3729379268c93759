"""Text from a model, shown as text: the one escaping helper every view uses (no Panel import).

Node paths, names, attribute values, graph names, guard messages that quote them, file names and error
messages are data chosen by whoever wrote the model file. Panel's Markdown pane renders raw HTML and
Markdown images (a `<script>`, an `onerror` handler or `![x](http://...)` in a path would run or fetch),
so every piece of such text goes through one of these before it reaches a pane:

* `md_escape(text)`: inline Markdown text (every Markdown and HTML metacharacter backslash-escaped);
* `md_code(text)`: the same, set in a monospace `<code>` element (a Markdown code span cannot be escaped:
  a backtick in the text would end it);
* `md_pre(text)`: a block of lines (IR, details) as a `<pre>` element with HTML-escaped content (a fenced
  block ends at the first line of backticks in the text);
* `html_text(text)`: text for an HTML pane or attribute (`html.escape`, quotes included).

Each first escapes control characters and Unicode bidi controls as the CLI does (`ir.text.shown`:
`\\x1b`, `\\u202e`), keeping line breaks: a right-to-left override in a path must not make the page show other
text than the model holds.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable

from ..ir.text import shown

_MD_INLINE = re.compile(r"([\\`*_\[\]<>|~#&!])")  # emphasis, code, links, images, raw HTML, tables, entities
_MD_LINE_START = re.compile(r"^(\s*)([-+=>])", re.MULTILINE)  # list, setext heading and quote markers
_MD_NUMBERED = re.compile(r"^(\s*\d+)([.)])", re.MULTILINE)
_BREAKS = re.compile(r"\r\n?|[\u2028\u2029\x0b\x0c\x85]")
_LINKS = re.compile(r"(:)(?=//)|(?<![\w.])(www)(\.)", re.IGNORECASE)  # no clickable outside link (linkify)


def _visible(text: object) -> str:
    """`text` with its line breaks made `\\n` and every other control or bidi character escaped (`shown`)."""
    return shown(_BREAKS.sub("\n", str(text)), keep_newlines=True)


def md_escape(text: str) -> str:
    """`text` as literal Markdown: emphasis, code, link, image, HTML, entity and table characters
    backslash-escaped, and line-start list, heading and quote markers too, so `batch*seq = 1*65` and
    `<img src=x onerror=...>` both render as written; URLs stay text, not links. Line breaks other than `\\n`
    become `\\n`."""
    out = _MD_INLINE.sub(r"\\\1", _visible(text))
    out = _MD_LINE_START.sub(r"\1\\\2", out)
    out = _LINKS.sub(lambda m: "\\:" if m.group(1) else f"{m.group(2)}\\.", out)
    return _MD_NUMBERED.sub(r"\1\\\2", out)


def md_code(text: str) -> str:
    """`text` in a monospace `<code>` element inside Markdown, escaped as `md_escape` does (safe for any text,
    backticks included)."""
    return f"<code>{md_escape(text)}</code>"


def md_pre(text: str) -> str:
    """A block of lines for a Markdown pane: a `<pre>` element (an HTML block that Markdown leaves alone
    until `</pre>`) whose content is HTML-escaped, so no line of `text` can end it or add markup."""
    return f"\n\n<pre>{html.escape(_visible(text), quote=True)}</pre>\n\n"


def html_text(text: str) -> str:
    """`text` for an HTML pane or an attribute value: `<`, `>`, `&` and both quotes escaped."""
    return html.escape(_visible(text), quote=True)


_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def download_name(model: str, version: str | None, ext: str) -> str:
    """A download's file name after the model and the version it holds: `minilm.after-fuse_sdpa.svg`, or
    `minilm.trace.json` for the whole run (`version=None`). The model's name is data from its file: every run of
    characters other than letters, digits, `.`, `_` and `-` becomes one `-` (no path, no quote, no control
    character), a leading `.` is dropped, and it is cut to 80 characters; an empty name reads `model`."""
    def part(text: str) -> str:
        return _UNSAFE_NAME.sub("-", text).strip("-.")[:80]

    stem = part(model) or "model"
    if version:
        stem += "." + (part(version) or "version")
    return f"{stem}.{ext}"


SELECT_PX_PER_CHAR = 6.4
"""Width of one character of a select's 14 px system font, on average over version labels (6.2 px measured in
Chromium on "11: after fuse_transformer_layer (33 ops)"), rounded up."""
SELECT_PAD_PX = 44
"""A select's padding and its arrow, px."""


def select_width(labels: Iterable[str], least: int = 100, most: int | None = None) -> int:
    """A select's width (px) that shows its longest option label whole (the text plus `SELECT_PAD_PX`), at least
    `least` and, given `most`, at most that (a longer label is cut there). A 120 px layer picker cut bart-full's
    `decoder layer 0` to `decoder layer` at 1280 px: the number, the one word that tells the layers apart, was the
    part cut; a fixed 270 px version list cut "11: after fuse_transformer_layer (33 ops)" at "(33 op"."""
    longest = max((len(x) for x in labels), default=0)
    width = max(least, math.ceil(longest * SELECT_PX_PER_CHAR + SELECT_PAD_PX))
    return width if most is None else min(width, most)


__all__ = ["SELECT_PAD_PX", "SELECT_PX_PER_CHAR", "download_name", "html_text", "md_code", "md_escape", "md_pre",
           "select_width"]
