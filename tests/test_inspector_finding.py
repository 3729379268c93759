"""The node inspector lists the leftover scan's findings that name the clicked node (`passes.unrecognized`: a
family-shaped chain no rule made a candidate), as the chips and the matches table do. convbert.qdq's erf %2026
(`unrecognized.gelu`, "not expected here" in `explain -v`, the Why tab, its chip and its table row) read only
`fused by mark_elementwise_regions.chain`: the inspector read the step's own refusals, not the findings filed under it.
One record: the inspector reads `why.places.step_refusals` (`explain.node_decisions`), as the chips and the table do."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_session_expectations import layered_moments_norm

from rlxviz.app.explain import decision_markdown, decision_rows, node_decisions
from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV
from rlxviz.app.state import AppState
from rlxviz.passes import Pipeline
from rlxviz.passes.unrecognized import FINDING, unrecognized
from rlxviz.passes.why.places import REJECTED
from rlxviz.passes.why.policy import NOT_EXPECTED_HERE

CONVBERT = Path(__file__).parent / "fixtures/onnx/zoo/convbert.qdq.onnx"


@pytest.fixture(scope="module")
def convbert() -> AppState:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ALLOWED_DIRS_ENV, str(CONVBERT.parent))
        s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
        s.param.update(checkpoint_dir=str(CONVBERT), source="checkpoint")
    assert s.model.name == "convbert.qdq" and s.trace is not None, s.message
    return s


def test_the_clicked_erf_lists_its_not_expected_finding(convbert):
    """Each erf of convbert.qdq's GELU, clicked in the app's drawing: the drawer gives the finding that names it, with
    the table row's standing (`○ not expected here`) and pass, never "rejected"."""
    from rlxviz.app.panels import GraphCompare, NodeInspector

    s = convbert
    found = sorted((u for u in unrecognized(s.trace) if u.family == "gelu"), key=lambda u: u.nodes[0])
    assert len(found) == 2, found
    rows = {r["anchor"]: r for r in decision_rows(s.trace) if r["rule"] == f"{FINDING}.gelu"}
    s.step_to(f"after {rows[found[0].nodes[0]]['pass']}")
    compare, drawer = GraphCompare(state=s), NodeInspector(state=s)
    for u in found:
        erf = u.nodes[0]
        assert s.previous_graph[erf].op.value == "erf"
        compare.before.clicked = erf
        compare.before.clicks += 1
        text = drawer.pane.object
        assert f"{FINDING}.gelu" in text and "guard **no_rule**" in text, text
        assert f"○ {NOT_EXPECTED_HERE}</b>" in text and "rejected</b>" not in text, text
        mine = [d for d in node_decisions(s.trace, erf) if d["rule"] == f"{FINDING}.gelu"]
        assert [(d["pass"], d["standing"], d["anchor"]) for d in mine] == [
            (rows[erf]["pass"], rows[erf]["kind"], erf)], mine
        assert mine[0]["message"] == u.reason


def test_every_node_of_a_counted_finding_reads_it_as_a_near_miss():
    """A float norm written `E[x^2] - E[x]^2` (the check fails on it): each node of the chain reads the finding with
    the table's `rejected` standing and the family's hint, as `explain` prints it after `fix:`."""
    trace = Pipeline.canonical().run(layered_moments_norm())
    (u,) = unrecognized(trace)
    (row,) = [r for r in decision_rows(trace) if r["rule"] == f"{FINDING}.norm"]
    assert row["kind"] == REJECTED
    for i in u.nodes:
        (d,) = [d for d in node_decisions(trace, i) if d["rule"] == f"{FINDING}.norm"]
        assert (d["pass"], d["standing"], d["guard"], d["hint"]) == (row["pass"], REJECTED, "no_rule", u.hint), d
        assert d["role"] == "anchor" or i != u.nodes[0], d
        item = decision_markdown(d)
        assert "rejected</b>" in item and "○" not in item, item
