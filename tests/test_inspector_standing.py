"""The inspector (a node clicked) says a refused place's standing as the chips, the matches table and `explain` do
(`passes.why.places.place_status`): minilm's %12 (embeddings.LayerNorm, a broadcast sum) read "rejected
fuse_residual_ln.residual as anchor (guard)" in red while the chips and the table called it "not a candidate" and
`explain` "lookalike, not a candidate (nothing to fix, not a near-miss)"; granite's %187 read "rejected" where the
others say "not expected here"."""

from __future__ import annotations

import re

import pytest

from rlxviz.app.explain import decision_markdown, decision_rows, node_decisions, node_report, report_markdown
from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.passes.why.places import LEFT_OUT_STATUS, REJECTED
from rlxviz.passes.why.text import left_out_heading


@pytest.fixture(scope="module")
def minilm() -> AppState:
    return AppState(runner=Runner(background=False), preset="minilm")


def test_a_lookalike_is_not_called_rejected(minilm):
    s = minilm
    row = next(r for r in decision_rows(s.trace) if r["rule"] == "fuse_residual_ln.residual"
               and r["path"] == "embeddings.LayerNorm")
    assert row["kind"] == "not a candidate"
    text = report_markdown(node_report(s.trace.input, row["anchor"], s.trace))
    said = [line for line in text.splitlines() if "fuse\\_residual\\_ln.residual" in line]
    assert said and not any("rejected</b>" in line for line in said), said
    assert any("○ not a candidate" in line and "nothing to fix, not a near-miss" in line for line in said), said


def test_every_refused_place_has_the_tables_standing_in_the_inspector(minilm):
    """Each refusal row of the matches table: its anchor's inspector gives the place the row's kind, in the words
    of the verdict's heading for a place that is no near-miss, and "rejected" only for a near-miss."""
    s = minilm
    rows = [r for r in decision_rows(s.trace) if r["kind"] != "fused"]
    excused = [r for r in rows if r["kind"] not in (REJECTED, LEFT_OUT_STATUS)]
    assert excused, "minilm has places that are no near-miss"
    for r in rows:
        mine = [d for d in node_decisions(s.trace, r["anchor"])
                if (d["pass"], d["rule"], d.get("anchor")) == (r["pass"], r["rule"], r["anchor"]) and "standing" in d]
        assert mine and {d["standing"] for d in mine} == {r["kind"]}, (r, mine)
        for d in mine:
            item = decision_markdown(d)
            if r["kind"] in (REJECTED, LEFT_OUT_STATUS):
                assert "○" not in item
            else:
                assert f"○ {r['kind']}</b>" in item and "rejected</b>" not in item, item
                assert left_out_heading(r["kind"], 1).split(" ", 1)[1].split(" (")[0] in item.replace("\\", "")


def test_the_standing_line_escapes_its_text():
    d = {"pass": "p", "rule": "r.x", "role": "anchor", "outcome": "rejected (guard)", "stage": "guard", "guard": "g",
         "kind": "illegal",
         "message": "<img src=x onerror=alert(1)>", "hint": "", "fix": "", "anchor": 3, "place": "",
         "standing": "not expected here", "standing_why": "*a* <script>alert(2)</script> [l](http://x)"}
    item = decision_markdown(d)
    assert not re.search(r"(?<!\\)<(img|script)|(?<!\\)\]\(http", item), item
    assert "○ not expected here" in item and "rejected</b>" not in item
