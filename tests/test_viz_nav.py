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
from rlxviz.viz import Overlay, render_svg

SVG = "{http://www.w3.org/2000/svg}"


def _state(**kw) -> AppState:
    return AppState(runner=Runner(background=False), **kw)


def _box_word(dot: str, layer: int) -> str:
    """The status word drawn in layer box `layer` of a layers-view DOT source."""
    stmt = re.search(rf"^\s*layer{layer} \[label=<(.*)$", dot, re.M)
    assert stmt, f"no box for layer {layer}"
    words = re.findall(r"<B>(fused|not fused|partly fused|rejected[^<]*)</B>", stmt.group(1))
    assert len(words) == 1, words
    return words[0]


def _why_word(s: AppState, layer: int) -> str:
    """The verdict of the "why didn't layer N fuse?" tab: `fused` or `not fused`."""
    m = re.search(rf"layer {layer}: (fused|NOT fused)", s.why_layer(layer))
    assert m, s.why_layer(layer)
    return m.group(1).lower()


@pytest.mark.parametrize("preset, variant", [("minilm", "none"), ("bert-tiny", "none"),
                                             ("bert-tiny", "extra_h1_user"), ("llama-block", "none")])
def test_layer_view_says_what_the_why_tab_says(preset, variant):
    """At the final version every layer box carries the Why tab's verdict word (the same session function),
    for fused layers, a teaching variant that breaks layer 0, and a LLaMA block (no FusedTransformerLayer
    expected: its partial fusions are what it expects)."""
    s = _state(preset=preset, variant=variant)
    s.version = len(s.version_labels) - 1
    dot = s.dot(view="collapsed")
    words = {i: (_box_word(dot, i), _why_word(s, i)) for i in s.layers()}
    assert words and all(box == why for box, why in words.values()), words
    if variant == "extra_h1_user":
        assert words[0] == ("not fused", "not fused") and words[1] == ("fused", "fused")
        assert "rejected: h1_user_count" in dot  # the first guard, as the Why tab names it
    else:
        assert {w for w, _ in words.values()} == {"fused"}


def test_layer_view_before_the_end_shows_progress_not_a_verdict():
    """An intermediate version is not the run's result: its boxes say how far fusion got there."""
    s = _state(preset="bert-tiny")
    s.step_to("after fuse_matmul_bias_act")
    assert _box_word(s.dot(view="collapsed"), 0) == "partly fused"


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
    return _state(preset="bert-tiny", variant="extra_h1_user")


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
