"""The Why tab for a graph whose nodes carry no layer path (issue 39's newcomer pasted
/work/shared/cases/03-prescaled-query.rlx): the text was right, the drawing pane beside it blank but for its search box
and zoom buttons. It now draws the final graph whole, and says why; with nothing to draw it says that in words."""

import re
from pathlib import Path

import pytest
from test_app_views import tiny

from rlxviz.app.whyview import WhyView
from rlxviz.ir import format_graph

CASES = Path(__file__).parent / "data" / "cases"


def _no_paths(text: str) -> str:
    return re.sub(r' @"[^"]*"| @\S+', "", text)


@pytest.mark.parametrize("ir", [
    lambda s: (CASES / "03-prescaled-query.rlx").read_text(),  # the newcomer's case: one attention, no paths
    lambda s: _no_paths(format_graph(s.model.graph)),  # bert-tiny with every node path dropped
    lambda s: "graph small {\n  %0 = input {name=\"x\"} : f32[2, 8]\n  %1 = tanh(%0) : f32[2, 8]\n  return %1\n}",
])
def test_a_graph_without_layers_draws_its_final_version(ir):
    s = tiny()
    why = WhyView(state=s)
    s.param.update(ir_text=ir(s), source="ir")
    assert s.model is not None and s.layers() == [] and s.message_kind != "danger", s.message
    assert "no node path names a layer" in why.text.object
    last = s.version_labels[-1]
    assert why.graph.visible and "<svg" in why.graph.svg and "class=\"node" in why.graph.svg
    assert why.graph.title == f"no layer to draw (no node path names one): the final graph, {last}", why.graph.title
    assert why.graph.svg == s.svg(len(s.version_labels) - 1)


def test_with_nothing_to_draw_the_pane_says_so_in_words(monkeypatch):
    s = tiny()
    why = WhyView(state=s)
    s.param.update(ir_text=_no_paths(format_graph(s.model.graph)), source="ir")

    def broken(*a, **k):
        raise RuntimeError("graphviz is missing")

    monkeypatch.setattr(type(s), "svg", broken)
    why._update()
    assert why.graph.visible and why.graph.svg == ""
    assert why.graph.title.startswith("No layers to draw: this graph's nodes carry no layer path; see the Graph tab")
    assert "graphviz is missing" in why.graph.title
