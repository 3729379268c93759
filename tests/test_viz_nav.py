"""Graph navigation in the app's drawings: the layer view's status words agree with "why didn't layer N
fuse?", the culprit of a rejection is drawn and marked, and layers expand in place in the layer view."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from rlxviz.app.explain import decision_rows
from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.ir import Op
from rlxviz.models import load_model
from rlxviz.passes.trace import Rejection
from rlxviz.session import render as drawing
from rlxviz.viz import GraphTooLarge, Overlay, render_dot, render_svg

SVG = "{http://www.w3.org/2000/svg}"


def _state(**kw) -> AppState:
    return AppState(runner=Runner(background=False), **kw)


def _box_word(dot: str, layer: int) -> str:
    """The status word drawn in layer box `layer` of a layers-view DOT source."""
    stmt = re.search(rf"^\s*layer{layer} \[label=<(.*)$", dot, re.M)
    assert stmt, f"no box for layer {layer}"
    words = re.findall(r"<B>(fused(?: as far as [^<]*)?|not fused|partly fused|rejected[^<]*|"
                       r"final: (?:not )?fused)</B>", stmt.group(1))
    assert len(words) == 1, words
    return words[0]


def _why_word(s: AppState, layer: int) -> str:
    """The verdict of the "why didn't layer N fuse?" tab: `fused`, `fused as far as ...` or `not fused`."""
    m = re.search(rf"layer {layer}: (fused as far as [^:]*|fused|NOT fused)", s.why_layer(layer))
    assert m, s.why_layer(layer)
    return m.group(1).lower()


@pytest.mark.parametrize("preset, variant", [("minilm", "none"), ("bert-tiny", "none"),
                                             ("bert-tiny", "dead_h1_user"), ("bert-tiny", "extra_h1_user"),
                                             ("llama-block", "none")])
def test_layer_view_says_what_the_why_tab_says(preset, variant):
    """At the final version every layer box carries the Why tab's verdict word (the same session function),
    for fused layers, a teaching variant that breaks layer 0, and a LLaMA block (no FusedTransformerLayer
    expected: its partial fusions are what it expects)."""
    s = _state(preset=preset, variant=variant)
    s.version = len(s.version_labels) - 1
    dot = s.dot(view="collapsed")
    words = {i: (_box_word(dot, i), _why_word(s, i)) for i in s.layers()}
    assert words and all(box == why for box, why in words.values()), words
    if variant == "extra_h1_user":  # the probe is returned: the layer op is illegal there, its parts fused
        assert words[0] == ("fused as far as legal", "fused as far as legal") and words[1] == ("fused", "fused")
    elif variant == "dead_h1_user":
        assert words[0] == ("not fused", "not fused") and words[1] == ("fused", "fused")
        assert "rejected: h1_user_count" in dot  # the first guard, as the Why tab names it
    elif preset == "llama-block":  # its causal attention is a form rlxviz's block lacks
        assert {w for w, _ in words.values()} == {"fused as far as rlxviz's ops go"}
    else:
        assert {w for w, _ in words.values()} == {"fused"}


def test_before_and_after_panes_agree_on_a_layer_that_is_already_final():
    """The before pane of the final version shows the graph its pass saw: a layer that pass did not change
    (dead_h1_user's layer 0, rejected earlier) has the same nodes as in the final graph, so both panes carry the
    Why tab's verdict; they said "partly fused" and "not fused" side by side."""
    s = _state(preset="bert-tiny", variant="dead_h1_user")
    s.version = len(s.version_labels) - 1
    before = drawing.dot(*s._drawing(None, "collapsed", side="before"))
    assert _box_word(before, 0) == _box_word(s.dot(view="collapsed"), 0) == _why_word(s, 0) == "not fused"
    assert "rejected: h1_user_count" in before


def test_layer_view_before_the_end_shows_progress_and_the_final_verdict():
    """An intermediate version is not the run's result: its boxes say how far fusion got there, labelled as such,
    beside the run's final verdict (issue 39's newcomer run: the box said only how far fusion got, while docs/app.md
    said it shows the final verdict; this test asserted that old box)."""
    s = _state(preset="bert-tiny")
    s.step_to("after fuse_matmul_bias_act")
    dot = s.dot(view="collapsed")
    assert _box_word(dot, 0) == "final: fused" == f"final: {_why_word(s, 0)}"
    assert "at this version: partly fused (FusedMatMulBiasAct" in re.search(r"^\s*layer0 \[label=<(.*)$", dot,
                                                                            re.M).group(1)


# -- the culprit of a rejection is drawn and marked -------------------------------------------------
def _svg_nodes(svg: str) -> dict[str, set[str]]:
    """`g` element id -> its classes, for every node and edge group of an SVG."""
    root = ET.fromstring(svg)
    return {g.get("id"): set(g.get("class", "").split()) for g in root.iter(f"{SVG}g")
            if {"node", "edge"} & set(g.get("class", "").split())}


def _h1_users(s: AppState) -> tuple[Rejection, int, list[int]]:
    """The h1_user_count rejection of the run, its culprit (the probe) and h1's legitimate users."""
    step = s.trace.step("fuse_transformer_layer")
    r = next(r for r in step.rejections if r.guard == "h1_user_count")
    h1 = step.before[r.bindings["ln1"]]
    (probe,) = r.offending
    assert step.before[probe].op == Op.REDUCE_MEAN and step.before[probe].path == "encoder.layer.0.probe"
    legit = [u.id for u in step.before.users(h1) if u.id != probe]
    assert len(legit) == 2
    return r, probe, legit


@pytest.fixture(scope="module")
def h1_state() -> AppState:
    return _state(preset="bert-tiny", variant="dead_h1_user")  # a near-miss: the Why tab draws its culprit


def test_why_drawing_marks_the_extra_reader_not_the_legitimate_users(h1_state):
    s = h1_state
    s.selected_layer = 0
    r, probe, legit = _h1_users(s)
    nodes = _svg_nodes(s.svg_why())
    assert "offending" in nodes[f"n{probe}"] and "node" in nodes[f"n{probe}"]  # drawn whole, not as a stub
    assert f"s{probe}" not in nodes
    for i in legit:
        assert f"n{i}" in nodes and "offending" not in nodes[f"n{i}"]
    assert [k for k, c in nodes.items() if "offending" in c and "node" in c] == [f"n{probe}"]
    (edge,) = [k for k, c in nodes.items() if "offending" in c and "edge" in c]
    assert edge == f"e{r.bindings['ln1']}_{probe}"  # h1 -> the extra reader


def test_graph_tab_marks_and_highlights_the_culprit(h1_state):
    """The Graph tab's 'before fuse_transformer_layer' pane marks the probe; the rejection's table row
    highlights it (and the anchor), never h1's legitimate users."""
    s = h1_state
    _, probe, legit = _h1_users(s)
    s.step_to("after fuse_transformer_layer")
    nodes = _svg_nodes(s.svg_before(view="full"))
    assert "offending" in nodes[f"n{probe}"] and not any("offending" in nodes[f"n{i}"] for i in legit)
    row = next(r for r in decision_rows(s.trace) if r["guard"] == "h1_user_count")
    s.show_decision(row)
    assert s.highlight[0] == probe and not set(legit) & set(s.highlight)


def test_culprit_outside_the_focused_layer_is_drawn_and_marked():
    """A rejection of layer 0 whose offending node lies in layer 1: the focus on layer 0 still draws it whole
    and marks it (not a grey stub)."""
    g = load_model("bert-tiny", 1, 8).graph
    lns = [n for n in g if n.op == Op.LAYER_NORM and "encoder.layer.0." in n.path]
    outside = next(n for n in g if n.op == Op.MATMUL and "encoder.layer.1." in n.path)
    r = Rejection("fuse_transformer_layer", "fuse_transformer_layer.bert_post_ln", lns[1].id, "guard",
                  "h1_user_count", "h1 has 3 users", {"ln1": lns[0].id, "ln2": lns[1].id},
                  offending=(outside.id,), path="encoder.layer.0")
    nodes = _svg_nodes(render_svg(g, Overlay(rejections=(r,)), focus=0).svg)
    assert "offending" in nodes[f"n{outside.id}"]
    assert [k for k, c in nodes.items() if "offending" in c] == [f"n{outside.id}"]


# -- a layer expanded in place in the collapsed overview ---------------------------------------------
def test_expanded_layer_drawn_in_place():
    """`expanded` opens layer 1 as a cluster of its nodes (full-view ids and labels); layer 0 stays one box;
    edges inside the open layer are drawn one by one, edges to the rest go box to node."""
    g = load_model("bert-tiny", 1, 8).graph
    dot = render_dot(g, view="layers", expanded=(1, 7))  # 7: not a layer of this model, ignored
    ids = {int(i) for i in re.findall(r"^\s*n(\d+) \[", dot, re.M)}
    layer1 = {n.id for n in g.compute_nodes() if "encoder.layer.1." in n.path}
    assert layer1 <= ids and not any("encoder.layer.0." in g[i].path for i in ids)
    assert "subgraph cluster_layer1" in dot and re.search(r"^\s*layer0 \[", dot, re.M)
    assert not re.search(r"^\s*layer1 \[", dot, re.M)  # no box for the open layer
    inner = next(n for n in g.compute_nodes() if n.id in layer1 and any(j in layer1 for j in n.inputs))
    j = next(j for j in inner.inputs if j in layer1)
    assert f"id=e{j}_{inner.id}" in dot
    first = next(n for n in g.compute_nodes() if n.id in layer1 and any(
        "encoder.layer.0." in g[j].path for j in n.inputs))
    assert f"layer0 -> n{first.id}" in dot
    assert render_dot(g, view="layers") != dot and "cluster_layer" not in render_dot(g, view="layers")
    with pytest.raises(GraphTooLarge, match="expand fewer"):
        render_dot(g, view="layers", expanded=(0, 1), max_nodes=20)


def test_toggle_layer_expands_and_folds_in_the_app_state():
    s = _state(preset="bert-tiny", view="collapsed")
    closed = s.dot()
    s.toggle_layer(1)
    assert s.expanded_layers == [1] and s.selected_layer == 1
    assert "subgraph cluster_layer1" in s.dot() and "<svg" in s.svg()
    s.toggle_layer(0)
    assert sorted(s.expanded_layers) == [0, 1]
    s.toggle_layer(1)
    s.toggle_layer(0)
    assert s.expanded_layers == [] and s.dot() == closed
    s.param.update(view="full", expanded_layers=[1])
    assert "cluster_layer1" not in s.dot()  # only the collapsed overview opens layers


def test_auto_view_is_the_overview_for_big_models_and_stays_across_versions(monkeypatch):
    """`auto`: more layers than FULL_VIEW_LAYERS (6: MiniLM is drawn whole, BERT-base's 12 layers are not) means
    the overview, decided on the input graph, so every version of the run gets the same view."""
    from rlxviz.app import derived as app_state  # where `resolved_view` reads it

    s = _state(preset="bert-tiny")
    assert app_state.FULL_VIEW_LAYERS == 6 and s.resolved_view() == "full"
    monkeypatch.setattr(app_state, "FULL_VIEW_LAYERS", 1)  # bert-tiny's 2 layers now count as big
    views = set()
    for k in range(len(s.version_labels)):
        s.version = k
        views.add(s.resolved_view())
    assert views == {"collapsed"}


def test_table_row_opens_its_layer_in_the_overview(h1_state):
    """In the collapsed overview a rejection row's nodes would hide inside a box: the row expands the layers
    that hold them, and the 'before' pane draws the culprit marked."""
    s = h1_state
    _, probe, legit = _h1_users(s)
    s.param.update(view="collapsed", expanded_layers=[])
    row = next(r for r in decision_rows(s.trace) if r["guard"] == "h1_user_count")
    s.show_decision(row)
    assert s.expanded_layers == [0] and s.highlight[0] == probe
    nodes = _svg_nodes(s.svg_before())
    assert "layer1" in nodes and "layer0" not in nodes  # layer 1 a box, layer 0 open (a cluster)
    assert "offending" in nodes[f"n{probe}"] and not any("offending" in nodes[f"n{i}"] for i in legit)
    s.param.update(view="auto", expanded_layers=[])


def test_expanded_layer_keeps_model_text_as_text():
    """Paths and weight names are model text: inside an open layer they reach the SVG as text, never markup."""
    from rlxviz.ir import Graph

    g = load_model("bert-tiny", 1, 8).graph
    evil = '"><script>alert(1)</script><img src=x onerror=alert(2)>'
    nodes = [n.replace(path=n.path + evil) if "encoder.layer.1." in n.path else n for n in g]
    nodes = [n.replace(attrs={**n.attrs, "name": n.attrs["name"] + evil}) if n.op == Op.PARAM else n for n in nodes]
    bad = Graph(nodes, g.outputs, "x" + evil)
    svg = render_svg(bad, view="layers", expanded=(1,)).svg
    root = ET.fromstring(svg)  # well-formed: nothing broke out of an attribute or a label
    tags = {el.tag.split("}")[-1] for el in root.iter()}
    assert "script" not in tags and "img" not in tags
    assert any(evil in (el.text or "") for el in root.iter(f"{SVG}text"))  # shown, as text
    assert "subgraph" not in svg and "<script" not in svg


def test_search_index_of_folded_layers_matches_the_drawn_boxes():
    """The collapsed view's panes carry, per folded layer box, the nodes drawn inside it (`SvgGraph.folded`): the
    search finds an op, `%id` or a path inside a folded layer through its box. Its keys are the boxes
    the SVG draws; every compute node is either drawn or listed under its box; an opened layer is not listed."""
    from rlxviz.app.panels import GraphCompare

    s = _state(preset="bert-tiny", view="collapsed")
    view = GraphCompare(state=s)
    boxes = set(re.findall(r'<g id="(layer\d+|g_[^"]+)" class="node"', view.after.svg))
    folded = view.after.folded
    assert {"layer0", "layer1", "g_embeddings"} <= boxes and set(folded) == boxes
    drawn = {int(i) for i in re.findall(r'<g id="n(\d+)" class="node"', view.after.svg)}
    listed = {nid for rows in folded.values() for nid, _ in rows}
    assert {n.id for n in s.current_graph.compute_nodes()} <= drawn | listed and not drawn & listed
    texts = [t for rows in folded.values() for _, t in rows]
    assert any(t.startswith("layer_norm -> f32") for t in texts) and all(t == t.lower() for t in texts)
    assert any("path: encoder.layer.1." in t for _, t in folded["layer1"])
    s.toggle_layer(1)
    assert "layer1" not in view.after.folded and "layer0" in view.after.folded
    s.view = "full"
    assert view.after.folded == {}
