"""A side-by-side diff of two versions' IR text (difflib's matcher, no Panel import), as rows and as HTML.

Lines are the model's text: each is shown as `ir.text.shown` makes it (control and bidi characters
escaped) and HTML-escaped (`text.html_text`); nothing of it becomes markup. Work is bounded: lines the two
texts share at both ends are skipped before matching, and the matcher's own junk heuristic keeps it near
linear on big graphs.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from .text import html_text

CONTEXT = 2
"""Unchanged lines kept around each change (the rest fold into one "N unchanged lines" row)."""
MAX_ROWS = 4000
"""Most rows drawn; the table then says how many it left out."""


@dataclass(frozen=True)
class DiffRow:
    """One row of the side-by-side table.

    Attributes:
        kind: `equal`, `replace`, `delete` (left only), `insert` (right only) or `skip` (`left` holds the count of
            unchanged lines folded away, as text).
        left_no / right_no: 1-based line numbers (None where that side has no line).
        left / right: the lines' text ('' where that side has none).
    """

    kind: str
    left_no: int | None
    left: str
    right_no: int | None
    right: str


def side_by_side(left: str, right: str, context: int = CONTEXT) -> list[DiffRow]:
    """Rows pairing the lines of `left` and `right` (two IR texts): changed lines side by side, `context`
    unchanged lines around each change, longer unchanged runs folded into a `skip` row."""
    a, b = left.splitlines(), right.splitlines()
    if a == b:
        return []
    rows: list[DiffRow] = []
    last = 0  # the left line after the previous group
    for group in difflib.SequenceMatcher(None, a, b).get_grouped_opcodes(context):
        if group[0][1] > last:
            rows.append(DiffRow("skip", None, str(group[0][1] - last), None, ""))
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                rows += [DiffRow("equal", i + 1, a[i], j + 1, b[j]) for i, j in zip(range(i1, i2), range(j1, j2),
                                                                                     strict=True)]
                continue
            for k in range(max(i2 - i1, j2 - j1)):
                i, j = i1 + k, j1 + k
                li, rj = i < i2, j < j2
                kind = "replace" if li and rj else "delete" if li else "insert"
                rows.append(DiffRow(kind, i + 1 if li else None, a[i] if li else "", j + 1 if rj else None,
                                    b[j] if rj else ""))
        last = group[-1][2]
    if last < len(a):
        rows.append(DiffRow("skip", None, str(len(a) - last), None, ""))
    return rows


_COLOURS = {"delete": ("#ffebe9", ""), "insert": ("", "#e6ffec"), "replace": ("#ffebe9", "#e6ffec"),
            "equal": ("", "")}


def diff_table(rows: list[DiffRow], left_title: str, right_title: str, max_rows: int = MAX_ROWS) -> str:
    """`side_by_side`'s rows as an HTML table (`rv-sbs`): line numbers, removed lines red on the left, added green on
    the right; every piece of text escaped. No rows: a note that the two versions hold the same IR."""
    if not rows:
        return f"<i>{html_text(left_title)} and {html_text(right_title)} hold the same IR.</i>"
    cell = "padding:0 6px;white-space:pre;font-family:monospace;font-size:12px;vertical-align:top"
    num = "padding:0 4px;color:#888;text-align:right;font-family:monospace;font-size:11px;vertical-align:top"
    out = [f"<table class='rv-sbs' style='border-collapse:collapse;width:100%;table-layout:fixed'>"
           f"<colgroup><col style='width:3.5em'><col style='width:calc(50% - 3.5em)'><col style='width:3.5em'>"
           f"<col style='width:calc(50% - 3.5em)'></colgroup>"
           f"<tr><th></th><th style='text-align:left'>{html_text(left_title)}</th><th></th>"
           f"<th style='text-align:left'>{html_text(right_title)}</th></tr>"]
    for r in rows[:max_rows]:
        if r.kind == "skip":
            out.append(f"<tr class='rv-sbs-skip'><td colspan='4' style='{num};text-align:center;background:#f6f8fa'>"
                       f"⋯ {html_text(r.left)} unchanged line(s) ⋯</td></tr>")
            continue
        bl, br = _COLOURS[r.kind]
        out.append(f"<tr class='rv-sbs-{r.kind}'><td style='{num}'>{r.left_no or ''}</td>"
                   f"<td style='{cell};background:{bl};overflow:hidden;text-overflow:ellipsis' "
                   f"title='{html_text(r.left)}'>{html_text(r.left)}</td>"
                   f"<td style='{num}'>{r.right_no or ''}</td>"
                   f"<td style='{cell};background:{br};overflow:hidden;text-overflow:ellipsis' "
                   f"title='{html_text(r.right)}'>{html_text(r.right)}</td></tr>")
    if len(rows) > max_rows:
        out.append(f"<tr><td colspan='4'><i>{len(rows) - max_rows} more row(s) not drawn: download both versions' "
                   "IR text to compare them whole.</i></td></tr>")
    return "".join(out) + "</table>"


__all__ = ["CONTEXT", "MAX_ROWS", "DiffRow", "diff_table", "side_by_side"]
