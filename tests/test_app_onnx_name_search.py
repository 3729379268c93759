"""The Graph tab's search finds the ONNX node name the inspector shows (newcomer run on falcon: the inspector of the
softmax said `ONNX node node_Softmax_144 (Softmax), domain ai.onnx`; typing `node_Softmax_144` said "no match").

The pane's search reads `SvgGraph.names` (`graphpane.onnx_names`: `n<id>` -> the ONNX node name of each imported node,
`Model.meta["onnx_nodes"]`, made once per model): a node imported from a matching ONNX node is an exact hit, at every
version it is kept; a fused node that absorbed it is a hit after them, with the absorbed note. The browser's half
mirrors `search_order` (`named`, `absorbedNote` in graphpane.js)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlxviz.app.graphpane import OnnxNames, absorbed_index, folded_index, onnx_names, search_order
from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.ir import Op
from rlxviz.viz.dot import node_tooltips
from rlxviz.viz.overlay import all_versions

FALCON = Path("/work/shared/cases/onnx/falcon.onnx")


@pytest.fixture(scope="module")
def falcon() -> AppState:
    s = AppState(runner=Runner(background=False))
    s.load_upload({FALCON.name: FALCON.read_bytes()})
    return s


def _softmax_name(s: AppState) -> tuple[int, str]:
    """The first softmax of version 0 and the ONNX node name the inspector shows for it."""
    onnx = s.model.meta["onnx_nodes"]
    n = next(n for n in s.trace.input if n.op == Op.SOFTMAX)
    return n.id, onnx[n.id][1]


def _hits(s: AppState, query: str, open_layers: list[int] | None = None) -> list[int]:
    """What Enter steps through at the version shown, as the pane's search does (`search_order`), with the layers of
    `open_layers` drawn open in the layer view (None: the full view)."""
    g = s.current_graph
    folded = folded_index(g, open_layers, s.trace) if open_layers is not None else {}
    boxed = {i for rows in folded.values() for i, _ in rows}
    drawn = {i: t for i, t in node_tooltips(g).items() if i not in boxed}
    names = onnx_names(s.model.meta["onnx_nodes"])
    return search_order([n.id for n in g], drawn, folded, absorbed_index(g, s.trace), query, names)


def test_the_inspectors_onnx_name_finds_its_node_at_version_0(falcon):
    s = falcon
    s.version = 0
    i, name = _softmax_name(s)
    assert name.startswith("node_Softmax"), name  # as the inspector shows it
    for q in (name, name.lower(), name.upper(), name[len("node_"):]):
        assert _hits(s, q) == [i], q
    for open_layers in ([], s.layers()):  # inside a folded layer box, and drawn open
        assert _hits(s, name, open_layers) == [i]
    assert _hits(s, f"%{i}") == [i]  # an id query stays the node's id only


def test_a_fused_node_that_absorbed_the_onnx_node_is_a_hit(falcon):
    """At the final version the softmax is inside a fused node: that node is the hit, as for the op `softmax`."""
    s = falcon
    s.version = len(s.version_labels) - 1
    i, name = _softmax_name(s)
    g = s.current_graph
    assert i not in g  # absorbed
    index = absorbed_index(g, s.trace)
    holder = [int(k[1:]) for k, rows in index.items() if any(i in ids for _, ids, _ in rows)]
    assert holder, "some fused node holds the softmax"
    assert _hits(s, name) == holder
    assert set(_hits(s, name)) <= set(_hits(s, "softmax"))


def test_every_version_finds_the_name(falcon):
    """Each version holds either the imported node or a node that absorbed it: the name never says "no match"."""
    s = falcon
    _, name = _softmax_name(s)
    every = all_versions(s.trace)
    for k in range(len(s.version_labels)):
        s.version = k
        hits = _hits(s, name)
        assert hits, (k, s.version_labels[k])
        assert all(h in every for h in hits)


def test_the_index_is_made_once_per_model(falcon):
    onnx = falcon.model.meta["onnx_nodes"]
    names = OnnxNames()
    first = names(onnx)
    assert names(onnx) is first and first
    assert names(None) == {} and names(onnx) is not first  # another model: made again
    assert onnx_names(None) == {}


def test_the_graph_pane_sends_the_names(falcon):
    from rlxviz.app.panels import GraphCompare

    s = falcon
    s.version = 0
    i, name = _softmax_name(s)
    pane = GraphCompare(state=s)
    assert pane.after.names[f"n{i}"] == name
