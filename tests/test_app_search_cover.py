"""The node drawer lies over the after pane's right edge while a node is selected (`panels.NodeInspector`); the pane
is told how wide (`SvgGraph.cover`) so its search centres a hit in the part left visible, not under the drawer
(a newcomer run: roberta's `encoder.layer.1.output.dense` was centred at the pane's middle, under the drawer, only
its ring's left edge showing). The browser half is tests/test_browser_search_visible.py."""

from rlxviz.app.graphpane import _ESM
from rlxviz.app.jobs import Runner
from rlxviz.app.panels import DRAWER_PX, GraphCompare
from rlxviz.app.state import AppState


def test_the_after_pane_knows_the_drawer_covers_it_while_a_node_is_selected():
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.version = 1
    pane = GraphCompare(state=s)
    assert (pane.before.cover, pane.after.cover) == (0, 0)
    s.selected_node = next(iter(s.current_graph)).id  # a click: the drawer opens
    assert (pane.before.cover, pane.after.cover) == (0, DRAWER_PX)
    s.selected_node = None  # its ✕: the drawer closes
    assert (pane.before.cover, pane.after.cover) == (0, 0)


def test_the_search_centres_in_the_width_the_drawer_leaves():
    centring = [line for line in _ESM.splitlines() if "tx = " in line and "px * s" in line]
    assert centring and all("seenW()" in line for line in centring), centring
    assert "model.cover" in _ESM
