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


def _fills(svg: str) -> dict[str, str]:
    """The first fill of each drawn node and layer box (`n<id>`, `layer<i>`; a box opened in place is a cluster)."""
    out = {}
    for m in re.finditer(r'<g id="((?:n|layer)\d+)" class="(node|cluster)">(.*?)</g>', svg, re.S):
        fill = re.search(r'fill="(#[0-9a-f]{6})"', m.group(3))
        if fill:
            out[m.group(1)] = fill.group(1)
    return out


def test_what_an_overlay_does_not_colour_reads_as_no_legend_colour(s):
    """A newcomer's error overlay on the collapsed view: the legend's "1e-07–1e-06" yellow was the fill of every
    "partly fused" layer box, and a node the pass removed kept its op fill inside an opened layer (a tan add read
    as the legend's orange). While an overlay is on, layer boxes and nodes without a figure are grey
    (`heat.UNCOLOURED`), far from every legend colour, and the legend says what the grey means."""
    from rlxviz.viz.heat import UNCOLOURED, UNCOLOURED_ROW
    from rlxviz.viz.styles import MIN_DELTA_E, delta_e

    s.view = "collapsed"
    partly = next(k for k in range(len(s.version_labels)) if "partly fused" in s.svg(k))
    s.param.update(version=partly, expanded_layers=[0], overlay="error")
    assert s.overlay_legend()[-1] == UNCOLOURED_ROW
    legend_fills = {c for c, _ in s.overlay_legend()} - {UNCOLOURED}
    for svg, heat in ((s.svg(), s.heat()), (s.svg_before(), s.heat_before())):
        coloured = {f"n{i}": f for i, f, _ in heat}
        fills = _fills(svg)  # the opened layer's nodes with a figure keep it; the closed layers' are not drawn
        shown = coloured.keys() & fills.keys()
        assert shown and all(fills[k] == coloured[k] for k in shown), partly
        boxes = {k: f for k, f in fills.items() if k.startswith("layer") and k != "layer0"}
        assert boxes and set(boxes.values()) == {UNCOLOURED}, boxes
        rest = {k: f for k, f in fills.items() if k.startswith("n") and k not in coloured}
        assert any(k[1:].isdigit() and f == UNCOLOURED for k, f in rest.items())
        for k, f in rest.items():
            assert all(delta_e(f, c) >= MIN_DELTA_E for c in legend_fills), (k, f)
    s.overlay = "none"  # no overlay: the status fills and op colours are back
    assert UNCOLOURED not in {f for k, f in _fills(s.svg()).items() if k.startswith("layer") and k != "layer0"}


def _cluster_fills(svg: str) -> dict[str, str]:
    """The fill of each match (`m<k>`) and rejection (`r<k>`) cluster drawn."""
    return {m.group(1): m.group(2) for m in re.finditer(r'<g id="([mr]\d+)" class="cluster">.*?fill="(#[0-9a-f]{6})"',
                                                        svg, re.S)}


@pytest.mark.parametrize("variant", [None, "extra_h1_user"])
def test_match_and_rejection_clusters_are_grey_under_an_overlay(s, variant):
    """A newcomer's error overlay on the before pane: the nodes it did not colour were grey, but each match's cluster
    kept its green or blue tint, read as a legend colour. While an overlay is on, a cluster's fill is grey
    (`heat.UNCOLOURED`, the legend's "not coloured") like every node and box it does not colour; without one the
    tints are back."""
    from rlxviz.viz.heat import UNCOLOURED

    if variant:
        s.apply_variant(variant)
    k = next(k for k in range(len(s.version_labels))
             if any(c.startswith("r" if variant else "m") for c in _cluster_fills(s.svg_before(k))))
    s.version = k
    plain = _cluster_fills(s.svg_before())
    assert plain and UNCOLOURED not in plain.values(), plain
    s.overlay = "error"
    assert s.heat_before(), k  # the overlay colours nodes of the before pane
    shaded = _cluster_fills(s.svg_before())
    assert shaded.keys() == plain.keys() and set(shaded.values()) == {UNCOLOURED}, shaded
    s.overlay = "none"
    assert _cluster_fills(s.svg_before()) == plain
