"""Text shown on a terminal: model text (graph, input, param and file names, node paths) is data, and a name
holding an escape sequence must not retitle the terminal, clear the screen or forge a report line.

`shown(text)` escapes every control character (C0, DEL, C1) and the Unicode bidi/line-separator controls as
Python writes them in a string literal (`\\x1b`, `\\n`, `\\r`, `\\t`, `\\x9b`, `\\u202e`); with `keep_newlines`
the line breaks of a multi-line report stay. `ModelText` remembers the model strings that hold a line break
(`remember`) so that a report's own line breaks can be told from a name's (`ModelText.shown`). The CLI's one
print path calls it for everything it prints (`rlxviz.cli.output._emit`); JSON output is escaped by `json.dumps`.
It stands beside the IR, on the lowest floor, because every place that shows model text calls it: the drawing
(`viz.dot`), the CLI and the app (`app.text`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROLS_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                                   "\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def shown(text: str, keep_newlines: bool = False) -> str:
    """`text` with its control characters escaped (`\\x1b`, `\\n`, `\\u202e`, ...): safe to print on a terminal.
    With `keep_newlines`, `\\n` stays a line break (a multi-line report); everything else is escaped."""
    return (_CONTROLS_BUT_NEWLINE if keep_newlines else _CONTROLS).sub(_escape, text)


class ModelText:
    """The model strings holding a line break, remembered so a report's line breaks can be told from theirs."""

    def __init__(self) -> None:
        self._broken: set[str] = set()

    def remember(self, strings: Iterable[object]) -> None:
        """Remember each string (and, for dotted paths, each dotted prefix: layer paths) that holds `\\n`."""
        for s in strings:
            if not isinstance(s, str) or "\n" not in s or not s.strip():
                continue
            parts = s.split(".")
            self._broken.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if "\n" in p)

    def remember_graph(self, graph: object) -> None:
        """A graph's name, its nodes' `name` attributes and paths."""
        nodes = list(graph) if hasattr(graph, "__iter__") else []
        self.remember([getattr(graph, "name", None),
                       *(n.attrs.get("name") for n in nodes), *(n.path for n in nodes)])

    def shown(self, text: str) -> str:
        """`text` for the terminal: remembered model strings fully escaped (their `\\n` too), then every other
        control character except the report's own line breaks (`shown(text, keep_newlines=True)`)."""
        for s in sorted(self._broken, key=len, reverse=True):
            if s in text:
                text = text.replace(s, shown(s))
        return shown(text, keep_newlines=True)


__all__ = ["ModelText", "shown"]
