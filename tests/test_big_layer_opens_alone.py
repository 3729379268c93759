"""A layer too big to open among the layer view's boxes is drawn alone, and a failed layout says what happened.

Newcomer run (convbert.qdq, 2739 ops, auto view = layer boxes): `softmax`, Enter. The search opened layer 0 (1289
ops) in place; Graphviz 2.43's `dot` crashed on that drawing (SIGSEGV) after 30-40 s and the pane said only
`Not shown: LayoutError: [layout] system failed (exit -11):`. Now a layer past `OPEN_IN_PLACE_NODES` ops is drawn
alone, as the focus view draws it (laid out in about a second), so the search's hit is drawn and centred; opening a
second one folds the first; and a layout program that crashes is named in words with what to do."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.ir import Op
from rlxviz.passes.trace import layer_of
from rlxviz.session.render import OPEN_IN_PLACE_NODES, drawn_alone, open_nodes
from rlxviz.viz import LayoutError, engine
from rlxviz.viz.engine import drawn_nodes, failure_text

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"


def _state(path: Path) -> AppState:
    s = AppState(runner=Runner(background=False))
    s.load_upload({path.name: path.read_bytes()})
    s.version = 0
    return s


@pytest.fixture(scope="module")
def qdq() -> AppState:
    return _state(ZOO / "convbert.qdq.onnx")


def test_the_search_hits_layer_opens_alone_with_the_hit_drawn(qdq):
    s = qdq
    assert s.resolved_view() == "collapsed"
    hit = next(n for n in s.current_graph if n.op == Op.SOFTMAX)
    layer = layer_of(hit.path)
    assert open_nodes(s.current_graph, [layer]) > OPEN_IN_PLACE_NODES
    s.toggle_layer(layer)  # what Enter on the hit inside the folded box does
    dot = s.dot()
    assert f"id=n{hit.id} " in dot  # drawn, so the browser centres it
    assert "subgraph cluster_layer" not in dot  # not among the boxes: the drawing `dot` crashed on
    assert "too many to open among the layer boxes" in s.caption() and "Fold all layers" in s.caption()
    s.expanded_layers = []


def test_opening_a_second_big_layer_folds_the_first(qdq):
    s = qdq
    first, second = s.layers()[:2]
    s.toggle_layer(first)
    s.toggle_layer(second)
    assert s.expanded_layers == [second]
    s.expanded_layers = []


def test_a_small_layer_still_opens_in_place():
    s = _state(ZOO / "convbert.dynamo-eager.onnx")
    s.view = "collapsed"
    layer = s.layers()[0]
    assert drawn_alone(s.current_graph, [layer]) is None
    s.toggle_layer(layer)
    assert "subgraph cluster_layer" in s.dot()
    s.toggle_layer(s.layers()[1])
    assert len(s.expanded_layers) == 2  # small layers open together


def test_a_crashed_layout_says_what_happened_and_what_to_do(tmp_path, monkeypatch):
    crash = tmp_path / "dot"
    crash.write_text("#!/bin/sh\ncat > /dev/null\nkill -SEGV $$\n")
    crash.chmod(crash.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(engine, "engine_path", lambda name: str(crash))
    monkeypatch.setenv("RLXVIZ_ENGINE", "system")
    with pytest.raises(LayoutError) as e:
        engine.layout('digraph g {\n\tnode [shape=box]\n\ta [label="x"]\n\tb [label="y"]\n\ta -> b [id=e1]\n}')
    said = str(e.value)
    assert "the drawing of 2 nodes failed" in said and "crashed (SIGSEGV)" in said, said
    assert "fold layers" in said and "exit -11" not in said


def test_failure_words():
    said = failure_text("system", 1, "Error: syntax error in line 3\n", 12, 0.2)
    assert said.startswith("[layout] the drawing of 12 nodes failed after 0 s: the layout program (system) stopped "
                           "with exit 1: Error: syntax error in line 3;")
    assert "crashed (signal 99)" in failure_text("system", -99, "", 3, 1.0)
    assert drawn_nodes("digraph g {\n graph [a=b]\n node [shape=box]\n edge [c=d]\n n1 [x=1]\n \"n 2\" [y]\n"
                       " n1 -> \"n 2\" [id=e]\n}") == 2


def test_no_engine_found_is_unchanged(monkeypatch):
    monkeypatch.setattr(engine, "available_engines", lambda: [])
    monkeypatch.delenv("RLXVIZ_ENGINE", raising=False)
    with pytest.raises(LayoutError, match="no Graphviz engine"):
        engine.layout("digraph g { a }")
    assert os.environ.get("RLXVIZ_ENGINE") is None


def test_the_page_says_a_layout_failure_without_its_type_name(monkeypatch):
    from rlxviz.app.stale import safe

    def crash() -> str:
        raise LayoutError(failure_text("system", -11, "", 1290, 31.0))

    _, said = safe(crash)
    assert said.startswith("[layout] the drawing of 1290 nodes failed after 31 s: the layout program (system) crashed "
                           "(SIGSEGV); fold layers"), said
    assert safe(lambda: 1 / 0)[1] == "ZeroDivisionError: division by zero"  # others keep their type's name


def test_the_docs_say_the_limit():
    docs = (Path(__file__).parent.parent / "docs" / "app.md").read_text(encoding="utf-8")
    assert f"a layer of more than {OPEN_IN_PLACE_NODES} ops" in docs
