"""A node label shortens a long value (a newcomer run on gpt-neox: the gathers `fuse_attention_block/qkv_columns`
makes printed their whole index list, "indices: (0, 1, 2, … 15, 48, 49, …", a node ~1000 px wide that shrank the rest
of the fit view to specks, in the Graph and Why tabs). `viz.styles.short_value` is the one place a label shortens a
value; the node inspector still prints it whole."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from rlxviz import session
from rlxviz.app.explain import node_report, report_markdown
from rlxviz.ir import Op
from rlxviz.ir.printer import format_value
from rlxviz.passes import Pipeline
from rlxviz.session.loading import layer_indices
from rlxviz.session.render import View
from rlxviz.session.render import dot as render_dot
from rlxviz.viz.styles import VALUE_WIDTH, short_value

ONNX = Path(__file__).parent / "fixtures" / "onnx"
NEOX = [ONNX / "cases" / "gpt-neox.legacy-sdpa.onnx", *sorted((ONNX / "zoo").glob("gpt-neox.*.onnx"))]
LINE_MAX = 64
"""The widest line a node label of these drawings may have, in characters (its longest other lines: a folded
weight's ONNX name and shape, 62)."""


def _label_lines(dot: str) -> dict[int, list[str]]:
    """Each drawn node's label lines (text, tags dropped) in DOT source `dot`, by id."""
    out = {}
    for m in re.finditer(r"^\tn(\d+) \[label=<(.*?)> (?:color|fillcolor|id)=", dot, re.M):
        out[int(m[1])] = [html.unescape(re.sub(r"<[^>]*>", "", s)) for s in m[2].split("<BR/>")]
    return out


@pytest.fixture(scope="module", params=NEOX, ids=lambda p: p.stem)
def neox(request):
    return Pipeline.canonical().run(session.load(str(request.param)).graph)


def test_every_label_line_of_the_gpt_neox_drawings_is_short(neox):
    """Every version, before and after its pass, and every layer's Why drawing."""
    views = [View(version=i, side=side) for i in range(len(neox.versions())) for side in ("after", "before")]
    views += [View(version=len(neox.steps), side="why", focus=k) for k in layer_indices(neox.input)]
    seen = 0
    for v in views:
        labels = _label_lines(render_dot(neox, v))
        assert labels, v
        seen += len(labels)
        wide = {i: ln for i, lines in labels.items() for ln in lines if len(ln) > LINE_MAX}
        assert not wide, (v, wide)
    assert seen > 100


def test_the_qkv_columns_gather_label_shortens_its_indices_and_the_inspector_prints_them_whole():
    trace = Pipeline.canonical().run(session.load(str(NEOX[0])).graph)
    step = next(s for s in trace.steps if s.pass_name == "fuse_attention_block/qkv_columns")
    g = step.after
    gathers = [n for n in g if n.op == Op.GATHER and g[n.inputs[1]].op == Op.CONST and n.id in step.added]
    assert gathers, "qkv_columns made no gather of constant indices"
    labels = _label_lines(render_dot(trace, View(version=trace.steps.index(step) + 1)))
    for n in gathers:
        value = g[n.inputs[1]].attrs["value"]
        line = next(ln for ln in labels[n.id] if ln.startswith("indices: "))
        assert line == f"indices: {short_value(value)}" and f"· {len(value)} values" in line, line
        md = report_markdown(node_report(g, n.id, trace))
        assert format_value(value).replace("[", r"\[").replace("]", r"\]") in md, md


@pytest.mark.parametrize(("value", "want"), [
    ((0, 2, 1, 3), "(0,2,1,3)"),  # short: whole, as before
    (tuple(range(48)), "(0..47) · 48 values"),
    ((*range(16), *range(48, 64), *range(96, 112)), "(0..15, 48..63, 96..111) · 48 values"),
    (tuple(range(0, 128, 2)), "(0, 2, 4, 6, 8, 10, 12, …, 126) · 64 values"),
    ((0.5,) * 30, "(0.5, 0.5, 0.5, 0.5, …, 0.5) · 30 values"),
])
def test_short_value_lists_first_items_the_last_and_the_count(value, want):
    assert short_value(value) == want
    assert len(want) <= VALUE_WIDTH


def test_short_value_gives_runs_first_and_last_when_they_do_not_all_fit():
    """gpt-neox's Q/K/V columns per head: 4 heads of 16 in a 192-wide projection packed (q, k, v) per head."""
    value = tuple(head * 48 + part * 16 + d for part in range(3) for head in range(4) for d in range(16))
    s = short_value(value)
    assert s.startswith("(0..15, 48..63") and s.endswith(", …, 176..191) · 192 values"), s
    assert len(s) <= VALUE_WIDTH
