"""A switch to another model fits the new picture; a version step of the same model keeps the zoom (issue 39, a
newcomer run: zoomed into a corner of MiniLM's layer in the Why tab, then switched to bert-tiny or to IR text, the
pane kept the zoom and showed nothing of the new drawing).

The browser fits a picture whose `SvgGraph.scope` is new (or empty) and keeps the user's zoom and pan for a new
picture in the same scope (graphpane's ESM). These tests check what Python sends: every pane that draws a model
(the Graph tab's before and after panes, the Why tab's pane) gets a new scope with another model's picture and the
same scope with the same model's next version. tests/test_browser_zoom_search.py drives the browser half."""

from __future__ import annotations

import pytest
from served import SMALL_IR

from rlxviz.app.graphpane import ZoomScope
from rlxviz.app.jobs import Runner
from rlxviz.app.panels import GraphCompare
from rlxviz.app.state import AppState
from rlxviz.app.whyview import WhyView


def _state() -> AppState:
    return AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)


class _Sent:
    """Each (svg, scope) pair a pane held after an update that changed its picture."""

    def __init__(self, pane) -> None:
        self.pane, self.pairs = pane, []
        pane.param.watch(lambda e: self.pairs.append((pane.svg, pane.scope)), ["svg"])


def _switches(s: AppState):
    """Model switches the app offers: a preset, IR text, a variant, a preset again."""
    return [("preset llama-block", lambda: s.param.update(preset="llama-block")),
            ("IR text", lambda: s.param.update(ir_text=SMALL_IR, source="ir")),
            ("preset bert-tiny", lambda: s.param.update(source="preset", preset="bert-tiny")),
            ("variant", lambda: s.apply_variant("extra_h1_user"))]


def test_graph_tab_a_model_switch_sends_a_new_scope_a_version_step_the_same():
    s = _state()
    pane = GraphCompare(state=s)
    s.version = len(s.version_labels) - 1
    scope, svg = pane.after.scope, pane.after.svg
    assert pane.before.scope == scope and scope
    s.version -= 1  # a version step: another picture, the same scope (the zoom is kept)
    assert pane.after.svg != svg and pane.after.scope == pane.before.scope == scope
    seen = {scope}
    for name, switch in _switches(s):
        sent = _Sent(pane.after)
        switch()
        assert s.message_kind != "danger", (name, s.message)
        assert pane.after.scope not in seen, name  # a new model: a new scope, so the picture is fitted
        assert sent.pairs and sent.pairs[-1] == (pane.after.svg, pane.after.scope)
        seen.add(pane.after.scope)
        last = len(s.version_labels) - 1
        if last > 0:
            s.version = last
            kept = pane.after.scope
            s.version = last - 1
            assert pane.after.scope == kept, name


def test_why_tab_a_model_switch_sends_a_new_scope_a_version_step_the_same():
    """The Why tab's pane had no scope at all: every picture was "the same", so a kept zoom stayed on another
    model's drawing (an empty pane)."""
    s = _state()
    why = WhyView(state=s)
    assert why.graph.svg and why.graph.scope
    scope, svg = why.graph.scope, why.graph.svg
    s.version = len(s.version_labels) - 1  # a version step: the same model, the zoom is kept
    assert why.graph.scope == scope
    seen = {scope}
    for name, switch in _switches(s):
        sent = _Sent(why.graph)
        switch()
        assert why.graph.svg, name
        assert why.graph.scope not in seen, name
        assert sent.pairs and sent.pairs[-1][1] == why.graph.scope, name
        seen.add(why.graph.scope)
    assert svg  # the first picture was drawn in a scope of its own


@pytest.mark.parametrize("within", [("full", ""), ("focus", 1), ("layer", 0)])
def test_zoom_scope_changes_with_the_model_object_only(within):
    z = ZoomScope()
    a, b = object(), object()
    first = z(a, *within)
    assert z(a, *within) == first  # the same model: kept
    second = z(b, *within)
    assert second != first and z(b, *within) == second
    assert z(a, *within) not in (first, second)  # back to the first model is a switch too: fitted again
