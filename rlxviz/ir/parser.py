"""Read the IR text form (see `printer`) back into a `Graph`.

Malformed text raises `IRSyntaxError` with the line and column and the offending line with a caret;
a graph that parses but is invalid (cycle, shape mismatch, bad arity) raises `GraphError` from `lint`.

The parser is safe on hostile text: attribute lists nest at most `MAX_NESTING` deep (checked without
recursing further), number literals are at most `MAX_NUMBER_CHARS` long, dimensions at most `MAX_DIM`,
and a bad string escape is reported at its column; every such error is an `IRSyntaxError`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from .dtype import DType
from .graph import Graph
from .node import Node
from .ops import Op

_TOKEN = re.compile(r"""
    (?P<ws>[ \t]+) | (?P<comment>(?:\#|//).*) |
    (?P<id>%\d+) |
    (?P<number>-?(?:inf|nan)\b|-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|-?\.\d+(?:[eE][-+]?\d+)?) |
    (?P<arrow><-) |
    (?P<ident>[A-Za-z_][A-Za-z0-9_.\-/]*) |
    (?P<punct>[=(){}\[\],:@])
""", re.VERBOSE)


MAX_NESTING = 16
"""Deepest attribute list nesting accepted (`[[1, 2], [3]]` is 2; the IR's own attrs use at most 2)."""

MAX_NUMBER_CHARS = 64
"""Longest number or `%id` literal accepted, in characters (2**63 has 19 digits)."""

MAX_STRING_CHARS = 4096
"""Longest quoted string, name or model path accepted, in characters (model paths use under 100)."""

MAX_PARSED_DIMS = 1024
"""Most dimensions a type may list before the parser stops reading it (lint refuses ranks over 32)."""

MAX_DIM = 2**62
"""Largest dimension accepted; the memory budget (`ir.memory`) refuses far smaller tensors."""


_SHOWN_CHARS = 160


def quote_place(text: str, col: int) -> str:
    """The line an error in IR text points at and a caret under its column, two lines indented by two spaces:
    `  %1 = tanh(%0 <b> : f32[2]` and `               ^`. A line longer than `_SHOWN_CHARS` shows a window around
    the column (`...` where it is cut); a tab before the column stays a tab in the caret's line, so the caret sits
    under its character wherever the tab stops are. The one formatter of the place for every front end
    (`IRSyntaxError`, the app's lint errors: `app.wording.explain_error`). The text is data: a front end that shows
    it as markup escapes it.

    Args:
        text: the whole line, without its line break.
        col: 1-based column (one past the line's end for "missing '}'" at its end).
    """
    at = max(col - 1, 0)
    shown = text
    if len(text) > _SHOWN_CHARS:  # a window around the column, not a line of megabytes
        lo = max(0, at - _SHOWN_CHARS // 2)
        tail = "..." if lo + _SHOWN_CHARS < len(text) else ""
        shown = ("..." if lo else "") + text[lo:lo + _SHOWN_CHARS] + tail
        at = at - lo + (3 if lo else 0)
    pad = "".join("\t" if c == "\t" else " " for c in shown[:at])
    return f"  {shown}\n  {pad}^"


def syntax_error_line(where: str, line: int, col: int, reason: str) -> str:
    """An IR syntax error in one line, as the CLI prints it and the app's message begins:
    `WHERE:LINE:COL: IR syntax error: REASON` (`g.ir:3:16: IR syntax error: unexpected character '<'`)."""
    return f"{where}:{line}:{col}: IR syntax error: {reason}"


class IRSyntaxError(ValueError):
    """Malformed IR text. `line` and `col` are 1-based; `reason` is the problem alone, `quoted` the line and a caret
    under the column (`quote_place`)."""

    def __init__(self, message: str, line: int, col: int, text: str) -> None:
        self.line, self.col, self.reason = line, col, message
        self.quoted = quote_place(text, col)
        super().__init__(f"line {line}, column {col}: {message}\n{self.quoted}")


@dataclass
class _Tok:
    kind: str
    text: str
    col: int


_QUOTE_OR_BACKSLASH = re.compile(r'["\\]')


def _string_end(text: str, pos: int, lineno: int) -> int:
    """End of the quoted string starting at `text[pos]` (the `"`), scanned without a regex backtracking stack
    (memory stays flat however long the line); at most `MAX_STRING_CHARS` characters are scanned."""
    limit = min(len(text), pos + MAX_STRING_CHARS)
    i = pos + 1
    while True:
        m = _QUOTE_OR_BACKSLASH.search(text, i, limit)
        if m is None:
            if limit < len(text):
                raise IRSyntaxError(f"quoted string longer than {MAX_STRING_CHARS} characters",
                                    lineno, pos + 1, text)
            raise IRSyntaxError("unterminated string", lineno, pos + 1, text)
        if m.group() == '"':
            return m.end()
        i = m.end() + 1  # skip the escaped character


class _Line:
    """One line's tokens, lexed one at a time as the parser asks for them: a line of megabytes never becomes
    millions of token objects at once (a 2 MB shape list cost 300 MB), and it is refused at its first fault."""

    def __init__(self, text: str, lineno: int) -> None:
        self.text, self.lineno, self._pos = text, lineno, 0
        self._cur = self._lex_one()  # after lineno is set: lexing errors report it
        self.first = self._cur

    def _lex_one(self) -> _Tok | None:
        text = self.text
        while self._pos < len(text):
            pos = self._pos
            if text[pos] == '"':
                self._pos = _string_end(text, pos, self.lineno)
                return _Tok("string", text[pos:self._pos], pos + 1)
            m = _TOKEN.match(text, pos)
            if not m:
                raise IRSyntaxError(f"unexpected character {text[pos]!r}", self.lineno, pos + 1, text)
            kind = m.lastgroup or ""
            if kind in ("number", "id") and m.end() - pos > MAX_NUMBER_CHARS:
                raise IRSyntaxError(f"number with {m.end() - pos} characters (at most {MAX_NUMBER_CHARS})",
                                    self.lineno, pos + 1, text)
            if kind == "ident" and m.end() - pos > MAX_STRING_CHARS:
                raise IRSyntaxError(f"name with {m.end() - pos} characters (at most {MAX_STRING_CHARS})",
                                    self.lineno, pos + 1, text)
            self._pos = m.end()
            if kind not in ("ws", "comment"):
                return _Tok(kind, m.group(), pos + 1)
        return None

    def error(self, msg: str, tok: _Tok | None = None) -> IRSyntaxError:
        col = tok.col if tok else (self._cur.col if self._cur is not None else len(self.text) + 1)
        return IRSyntaxError(msg, self.lineno, col, self.text)

    def peek(self) -> _Tok | None:
        return self._cur

    def next(self, expect: str | None = None, what: str = "") -> _Tok:
        t = self.peek()
        desc = what or repr(expect)
        if t is None:
            raise self.error(f"expected {desc}, found end of line")
        if expect is not None and t.text != expect and t.kind != expect:
            raise self.error(f"expected {desc}, found {t.text!r}", t)
        self._cur = self._lex_one()
        return t

    def accept(self, text: str) -> bool:
        t = self.peek()
        if t is not None and t.text == text:
            self._cur = self._lex_one()
            return True
        return False

    def end(self) -> None:
        t = self.peek()
        if t is not None:
            raise self.error(f"unexpected {t.text!r} at end of line", t)


def _string(ln: _Line, t: _Tok) -> str:
    """The value of a string token (JSON escapes); a bad escape is reported at its column."""
    try:
        return json.loads(t.text)
    except json.JSONDecodeError as e:
        raise IRSyntaxError(f"bad string: {e.msg}", ln.lineno, t.col + e.pos, ln.text) from None


def _value(ln: _Line, depth: int = 0) -> Any:
    t = ln.next(what="a value")
    if t.kind == "number":
        if t.text.lstrip("-") in ("inf", "nan"):
            return float(t.text)
        if any(c in t.text for c in ".eE"):
            x = float(t.text)
            if math.isinf(x):  # 1e999: a finite literal past float64 (an explicit `inf` is allowed)
                raise ln.error(f"number {t.text} is too large (beyond float64; write inf if infinity is meant)", t)
            return x
        return int(t.text)
    if t.kind == "string":
        return _string(ln, t)
    if t.kind == "ident" and t.text in ("true", "false", "none"):
        return {"true": True, "false": False, "none": None}[t.text]
    if t.text == "[":
        if depth >= MAX_NESTING:
            raise ln.error(f"attribute value nested deeper than {MAX_NESTING} levels", t)
        items: list[Any] = []
        if not ln.accept("]"):
            items.append(_value(ln, depth + 1))
            while ln.accept(","):
                items.append(_value(ln, depth + 1))
            ln.next("]", what="',' or ']'")
        return tuple(items)
    raise ln.error(f"expected a value, found {t.text!r}", t)


def _ids(ln: _Line, closer: str | None) -> list[tuple[int, _Tok]]:
    out = []
    while True:
        t = ln.next("id", what="a value like %3")
        out.append((int(t.text[1:]), t))
        if not ln.accept(","):
            break
    if closer:
        ln.next(closer, what=f"',' or {closer!r}")
    return out


def _node(ln: _Line, refs: list[tuple[int, _Tok, _Line]]) -> Node:
    nid = int(ln.next("id", what="a node id like %3").text[1:])
    ln.next("=")
    op_tok = ln.next("ident", what="an op name")
    try:
        op = Op(op_tok.text)
    except ValueError:
        raise ln.error(f"unknown op {op_tok.text!r}", op_tok) from None
    inputs: list[int] = []
    if ln.accept("("):
        for i, t in _ids(ln, ")"):
            inputs.append(i)
            refs.append((i, t, ln))
    attrs: dict[str, Any] = {}
    if ln.accept("{"):
        while True:
            key = ln.next("ident", what="an attribute name")
            if key.text in attrs:
                raise ln.error(f"duplicate attribute {key.text!r}", key)
            ln.next("=")
            attrs[key.text] = _value(ln)
            if not ln.accept(","):
                break
        ln.next("}", what="',' or '}'")
    ln.next(":", what="':' and a type like f32[2, 8]")
    dt = ln.next("ident", what="a dtype")
    try:
        dtype = DType(dt.text)
    except ValueError:
        raise ln.error(f"unknown dtype {dt.text!r} (expected one of {', '.join(DType)})", dt) from None
    ln.next("[", what="'[' and the shape")
    shape: list[int] = []
    if not ln.accept("]"):
        while True:
            d = ln.next("number", what="a dimension")
            if not d.text.isdigit():
                raise ln.error(f"dimension must be a non-negative integer, found {d.text!r}", d)
            if int(d.text) > MAX_DIM:
                raise ln.error(f"dimension {d.text} is larger than {MAX_DIM}", d)
            shape.append(int(d.text))
            if len(shape) > MAX_PARSED_DIMS:  # lint states the real limit (`lint.MAX_RANK`); this bounds memory
                raise ln.error(f"type with more than {MAX_PARSED_DIMS} dimensions", d)
            if not ln.accept(","):
                break
        ln.next("]", what="',' or ']'")
    path = ""
    if ln.accept("@"):
        p = ln.next(what="a model path")
        if p.kind not in ("ident", "string"):
            raise ln.error("expected a model path", p)
        path = _string(ln, p) if p.kind == "string" else p.text
    pass_name, absorbed = "", ()
    if ln.accept("["):
        p = ln.next(what="a pass name")
        if p.kind not in ("ident", "string"):
            raise ln.error("expected a pass name", p)
        pass_name = _string(ln, p) if p.kind == "string" else p.text
        if ln.accept("<-"):
            absorbed = tuple(i for i, _ in _ids(ln, None))
        ln.next("]")
    ln.end()
    return Node(nid, op, tuple(inputs), tuple(shape), dtype, attrs, path, pass_name, absorbed)


def node_line(text: str, nid: int) -> tuple[int, int] | None:
    """Where IR `text` defines node `%nid` (`%nid = op(...)`): its (line, column), 1-based, column at the `%`;
    None when no line defines it."""
    want = re.compile(rf"^(\s*)%{nid}\s*=")
    for k, line in enumerate(text.splitlines()):
        m = want.match(line)
        if m:
            return k + 1, len(m.group(1)) + 1
    return None


def parse_ir(text: str, verify: bool = True) -> Graph:
    """Parse IR text into a Graph (exact inverse of `format_graph`).

    Raises:
        IRSyntaxError: malformed text, unknown op or dtype, undefined value (line and column).
        GraphError: when `verify`, a structurally invalid graph (from `lint`).
    """
    lines = [_Line(t, k + 1) for k, t in enumerate(text.splitlines())]
    lines = [ln for ln in lines if ln.first is not None]
    if not lines:
        raise IRSyntaxError("empty IR text: expected 'graph NAME {'", 1, 1, "")
    head = lines[0]
    head.next("graph", what="'graph NAME {'")
    name_tok = head.next(what="a graph name")
    if name_tok.kind not in ("ident", "string", "number"):
        raise head.error("expected a graph name", name_tok)
    name = _string(head, name_tok) if name_tok.kind == "string" else name_tok.text
    next_id = None
    if head.peek() is not None and head.peek().text == "next_id":  # type: ignore[union-attr]
        head.next()
        head.next("=")
        nt = head.next("number", what="a non-negative integer")
        if not nt.text.isdigit():
            raise head.error(f"next_id must be a non-negative integer, found {nt.text!r}", nt)
        next_id = int(nt.text)
    head.next("{")
    head.end()
    nodes: dict[int, Node] = {}
    refs: list[tuple[int, _Tok, _Line]] = []
    outputs: list[int] = []
    closed = False
    for ln in lines[1:]:
        if closed:
            raise ln.error("text after the closing '}'")
        first = ln.peek()
        assert first is not None
        if first.text == "}":
            ln.next()
            ln.end()
            closed = True
        elif first.text == "return":
            ln.next()
            for i, t in _ids(ln, None):
                outputs.append(i)
                refs.append((i, t, ln))
            ln.end()
        else:
            n = _node(ln, refs)
            if n.id in nodes:
                raise ln.error(f"%{n.id} is defined twice", ln.first)
            nodes[n.id] = n
    if not closed:
        last = lines[-1]
        raise IRSyntaxError("missing closing '}'", last.lineno, len(last.text) + 1, last.text)
    for i, t, ln in refs:
        if i not in nodes:
            raise ln.error(f"undefined value %{i}", t)
    g = Graph(nodes.values(), outputs, name, next_id)
    if verify:
        from .lint import lint
        lint(g)
    return g
