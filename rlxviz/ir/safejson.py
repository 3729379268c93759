"""JSON text from untrusted files (graph JSON, `config.json`, safetensors indexes), read with bounds.

`json.loads` alone recurses once per nesting level (a few thousand `[` raise `RecursionError`, a
traceback), accepts `NaN`/`Infinity`, and raises a `ValueError` without position for integers over
4,300 digits. `loads` checks all three first and raises `JSONTextError` (a `ValueError`) whose message
names the line and column.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 64
"""Deepest nesting of arrays/objects accepted (model configs and graph JSON use fewer than 10)."""

MAX_NUMBER_CHARS = 64
"""Longest number literal accepted (characters); 2**63 has 19 digits."""

_SCAN = re.compile(r'"(?:[^"\\]++|\\.)*+"?|[\[{]|[\]}]|-?\d[\d.eE+\-]*')
"""Strings (skipped), brackets and numbers. The string part is possessive: a plain `(?:\\.|[^"\\])*` keeps a
backtracking frame per character (a 2 MB string cost 250 MB); this one runs in flat memory."""


class JSONTextError(ValueError):
    """Malformed or out-of-bounds JSON text. `line` and `col` are 1-based."""

    def __init__(self, reason: str, line: int, col: int) -> None:
        self.reason, self.line, self.col = reason, line, col
        super().__init__(f"line {line} column {col}: {reason}")


def _position(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _overflows(tok: str) -> bool:
    """Whether the number literal `tok` is finite as written but inf as a float (json.loads reads 1e999 as inf)."""
    if not any(c in tok for c in ".eE"):
        return False
    try:
        return math.isinf(float(tok))
    except ValueError:  # not a number after all: json.loads reports it
        return False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not JSON")


def loads(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse `text` as JSON, refusing deep nesting, long numbers and non-finite numbers.

    Args:
        text: the JSON text.
        max_depth: deepest array/object nesting accepted.

    Returns:
        The parsed value (dicts, lists, str, int, finite float, bool, None).

    Raises:
        JSONTextError: invalid JSON, nesting deeper than `max_depth`, a number literal longer than
            `MAX_NUMBER_CHARS`, `NaN`/`Infinity`, or a finite literal past float64 (`1e999`, which
            `json.loads` reads as inf); the message gives the line and column.
    """
    depth = 0
    for m in _SCAN.finditer(text):
        tok = m.group()
        c = tok[0]
        if c in "[{":
            depth += 1
            if depth > max_depth:
                raise JSONTextError(f"nesting deeper than {max_depth} levels", *_position(text, m.start()))
        elif c in "]}":
            depth -= 1
        elif c != '"' and len(tok) > MAX_NUMBER_CHARS:
            raise JSONTextError(f"number with {len(tok)} characters (at most {MAX_NUMBER_CHARS})",
                                *_position(text, m.start()))
        elif c != '"' and _overflows(tok):
            raise JSONTextError(f"number {tok} is too large (beyond float64)", *_position(text, m.start()))
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise JSONTextError(e.msg, e.lineno, e.colno) from None
    except (ValueError, RecursionError) as e:  # a non-finite constant (position unknown to the hook)
        m = re.search(r"-?\b(?:NaN|Infinity)\b", text)
        line, col = _position(text, m.start()) if m else (1, 1)
        raise JSONTextError(str(e) if isinstance(e, ValueError) else "nesting too deep", line, col) from None


__all__ = ["MAX_DEPTH", "MAX_NUMBER_CHARS", "JSONTextError", "loads"]
