"""Text helpers shared by the views (no Panel import)."""

from __future__ import annotations

import re

_MD_INLINE = re.compile(r"([\\`*_\[\]<>|~#&!])")
_MD_LINE_START = re.compile(r"^(\s*)([-+=>])", re.MULTILINE)
_MD_NUMBERED = re.compile(r"^(\s*\d+)([.)])", re.MULTILINE)


def md_escape(text: str) -> str:
    """`text` as literal Markdown: emphasis, code, link, HTML and table characters backslash-escaped, and
    line-start list, heading and quote markers too, so guard messages such as `batch*seq = 1*65` render as
    written."""
    out = _MD_INLINE.sub(r"\\\1", text)
    out = _MD_LINE_START.sub(r"\1\\\2", out)
    return _MD_NUMBERED.sub(r"\1\\\2", out)
