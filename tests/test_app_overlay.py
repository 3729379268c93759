"""The app's per-node overlay (`AppState.overlay`): the same figures as `rlxviz overlay` (`session.overlays`),
measured in the timing process for the version shown, drawn as node fills with the figure in each tooltip, a
legend with units, and a refusal over the memory budget as a message."""

import re

import pytest

from rlxviz import session
from rlxviz.app.jobs import Runner
from rlxviz.app.measure import OVERLAY_RUNS
from rlxviz.app.panels import legend_html
from rlxviz.app.state import AppState
from rlxviz.session.overlays import UNITS, node_figures
from rlxviz.viz.heat import PALETTE


@pytest.fixture
def s():
    st = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8, style="hf")
    st.version = len(st.version_labels) - 1
    return st


def test_error_overlay_is_the_service_figures_drawn_on_the_shown_version(s):
    assert s.heat() == () and s.overlay_legend() == []
    s.overlay = "error"
    f = s.node_figures
    assert f is not None and f.kind == "error" and f.version == s.version_index() and s.overlay_status == ""
    want = node_figures(s.trace, s.version_index(), "error", session.feeds(s.model, s.text), s.model.weights,
                        device=s.device)
    assert f.values.keys() == want.values.keys()
    assert all(f.values[i] == pytest.approx(want.values[i], rel=1e-6, abs=1e-12) for i in want.values)
    svg = s.svg()
    tips = re.findall(r"error vs version 0(?:'|&#39;)s reference: ", svg)
    assert len(tips) == len(f.values)
    assert [c for c, _ in s.overlay_legend()][:len(PALETTE)] == list(PALETTE)


def test_the_figures_follow_the_version_and_none_clears_them(s):
    s.overlay = "time"
    last = s.node_figures
    s.version = 0
    assert s.node_figures.version == 0 and s.node_figures is not last
    from rlxviz.runtime.executor import static_ids

    g = s.trace.input  # every compute node but those a program computes once from the weights has a share
    assert len(s.heat()) == len([n for n in g.compute_nodes() if n.id not in static_ids(g)])
    assert sum(s.node_figures.share(i) for i in s.node_figures.values) == pytest.approx(1.0)
    s.version = len(s.version_labels) - 1
    assert s.node_figures is last  # measured before: from the cache, not again
    s.overlay = "none"
    assert s.node_figures is None and s.heat() == () and "error vs" not in s.svg() and "time:" not in s.svg()


def test_over_the_memory_budget_is_a_message_not_a_traceback(s, monkeypatch):
    OVERLAY_RUNS.clear()  # measured by an earlier test: a cached figure holds no memory to refuse
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", "0.01")
    s.overlay = "error"
    assert s.node_figures is None and s.overlay_status == "not measured"
    assert "over the limit" in s.message and "Traceback" not in s.message and not s.busy


def test_legend_has_units_and_escapes_its_text():
    out = legend_html([("#ffffb2", "< 1%"), ("#b10026", "≥ 40%")], UNITS["time"], "stopped <after> 3")
    assert "% of the per-node time" in out and "&lt; 1%" in out and "&lt;after&gt;" in out and "<after>" not in out
    assert legend_html([], "x", "") == ""
