"""The Why tab's drawing of a layer whose first rejection is a leftover-scan finding (`passes.unrecognized`: a float
LayerNorm written `E[x^2] - E[x]^2`, `unrecognized.norm`, the check fails on it): it drew the final version with no
mark, because `why.verdict.why_step` found no step of the finding's pass (`unrecognized` is no pass of the run).
Decision: it draws the graph before the step the finding is filed under (`RunFacts.filed_step`, of
`RunFacts.findings`: the first step of a pass that recognizes the family, `canonicalize_norm`), marked and counted
as that step's before pane and chip mark it (`why.places.step_refusals`): one answer to one question."""

from __future__ import annotations

import html

from test_session_expectations import layered_moments_norm

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.app.whyview import WhyView
from rlxviz.ir.printer import format_graph
from rlxviz.passes import Pipeline
from rlxviz.passes.unrecognized import FINDING, unrecognized
from rlxviz.passes.why.facts import RunFacts
from rlxviz.passes.why.policy import recognizers
from rlxviz.passes.why.verdict import layer_verdict, why_step
from rlxviz.session.render import View, dot, picture
from rlxviz.viz.overlay import Overlay


def test_the_why_drawing_is_before_the_step_its_finding_is_filed_under():
    trace = Pipeline.canonical().run(layered_moments_norm())
    (u,) = unrecognized(trace)
    first = layer_verdict(trace, 0).first
    assert first is not None and first.rule == f"{FINDING}.norm", first
    ((filed, (r,)),) = RunFacts.of(trace).findings().items()
    assert (r.rule, r.anchor) == (first.rule, u.nodes[0])
    k = why_step(trace, 0)
    assert k == filed and trace.steps[k].pass_name in recognizers("norm"), (k, filed)
    g, ov, _ = picture(trace, View(version=len(trace.versions()) - 1, side="why", focus=0))
    assert g is trace.steps[k].before and ov is not None
    assert [(x.rule, x.anchor) for x in ov.rejections] == [(r.rule, r.anchor)]
    assert ov.title.startswith(f"before {trace.steps[k].pass_name}, in this layer: 0 match(es), 1 rejected place")
    drawn = html.unescape(dot(trace, View(version=len(trace.versions()) - 1, side="why", focus=0)))
    assert "✗ no_rule" in drawn and f"REJECTED {FINDING}.norm [structure] guard no_rule" in drawn
    # the Graph tab's before pane of that step marks it alike (its chip counts it: `step_refusals`)
    assert Overlay.before(trace.steps[k], trace=trace).rejections == ov.rejections
    assert html.unescape(dot(trace, View(version=k + 1, side="before"))).count("✗ no_rule") == 1


def test_the_why_tab_draws_the_finding_its_text_names_first():
    s = AppState(runner=Runner(background=False), source="ir", ir_text=format_graph(layered_moments_norm()))
    assert s.layers() == [0], s.message
    view = WhyView(state=s)
    assert s.selected_layer == 0  # the first layer not fused as expected
    why = html.unescape(view.text.object).replace("\\", "")
    assert f"first rejection: {FINDING}.norm" in why, why
    k = why_step(s.trace, 0)
    assert k is not None and s.why_graph_drawn() is s.trace.steps[k].before
    assert "✗ no_rule" in html.unescape(view.graph.svg)
