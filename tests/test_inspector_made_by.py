"""The inspector's "made by" / "became" line and the other pane's marks read what a node replaced itself (a newcomer
finding: at gptj's version 21, `fuse_attention_block/qkv_columns`, attention %233 read "made by
fuse_attention_block/qkv_columns from %199, %196, %215, ..., %214, %209" and the before pane marked the ropes %199,
%196 and the Q/K/V projection %214, beside its "created by fuse_attention_block, replacing %215, ..." line that
leaves them out: `qkv_columns` re-made them as %229, %231 and %227, which are their counterparts).

`explain.counterparts` follows `made.replaced`, the rule of the labels and the "replacing" list; the report's
"created by" line goes where the step's "made by" line says as much, compared by pass (`family_of`), not by the
step's whole `pass/stage` name; where it says more (what the node was made beside: gpt-neox's %231) it stays, and
the step's line goes, so which pass made a node is said once. The IR line keeps the rewrite's whole record (the
IR text `rlxviz ir` prints and parses back); a note under it names what the node did not replace itself."""

from __future__ import annotations

from functools import cache

import pytest
from named_exports import FILES, ONNX

from rlxviz import session
from rlxviz.app.explain import counterpart_line, counterparts
from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.passes import Pipeline
from rlxviz.passes.made import made_in_run, replaced
from rlxviz.passes.trace import Trace
from rlxviz.viz.overlay import all_versions

QKV = "fuse_attention_block/qkv_columns"


@cache
def _trace(name: str) -> Trace:
    return Pipeline.canonical().run(session.load(str(ONNX / FILES[name])).graph)


def _step(trace: Trace, name: str):
    return next(s for s in trace.steps if s.pass_name == name)


def test_gptj_233_is_made_from_what_it_replaced_itself():
    trace = _trace("gptj")
    s = _step(trace, QKV)
    assert set(s.after[233].absorbed) >= {199, 196, 214}  # the raw record lists the ropes and the QKV projection
    mine = list(replaced(s.after[233], s.after, made_in_run(trace), all_versions(trace)))
    assert not {199, 196, 214} & set(mine), mine
    before, after = counterparts(s.before, s.after, 233, trace)
    assert (before, after) == ([i for i in mine if i in s.before], [233])
    line = counterpart_line(s.before, s.after, 233, QKV, trace).replace("\\", "")
    assert line.endswith("from " + ", ".join(f"%{i}" for i in mine) + " (marked in the before pane)"), line
    # each node qkv_columns re-made became the node that re-made it, never the attention as well
    for old, new in {199: 229, 196: 231, 214: 227}.items():
        assert counterparts(s.before, s.after, old, trace) == ([old], [new]), old


@pytest.mark.parametrize("name", ["gptj", "gpt-neox", "cohere", "llama", "bert"])
def test_counterparts_are_what_each_node_replaced_itself(name):
    """In every step: a node made is marked in the before pane by what it replaced itself, a node removed in the
    after pane by the nodes that replaced it themselves; so the two panes' marks agree both ways."""
    trace = _trace(name)
    beside, versions = made_in_run(trace), all_versions(trace)
    differ = 0
    for s in trace.steps:
        kept = {n.id for n in s.before} & {n.id for n in s.after}
        for n in s.after:
            if n.id in kept:
                continue
            mine = [i for i in replaced(n, s.after, beside, versions) if i in s.before]
            assert counterparts(s.before, s.after, n.id, trace) == (mine, [n.id]), (s.pass_name, n.id)
            differ += mine != [i for i in n.absorbed if i in s.before]
            for i in mine:
                assert n.id in counterparts(s.before, s.after, i, trace)[1], (s.pass_name, n.id, i)
    if name in ("gptj", "gpt-neox", "cohere"):
        assert differ, name  # qkv_columns' products list what it re-made beside them


@cache
def _app() -> AppState:
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    path = ONNX / FILES["gptj"]
    s.load_upload({path.name: path.read_bytes()})
    assert s.trace is not None and s.message_kind != "danger", s.message
    s.hide_unchanged = False
    return s


def test_the_app_marks_and_says_what_233_replaced_once():
    from rlxviz.app.panels import GraphCompare, NodeInspector

    s = _app()
    graph, inspector = GraphCompare(state=s), NodeInspector(state=s)
    s.step_to(f"after {QKV}")
    step = s.current_step
    assert step is not None and step.pass_name == QKV
    mine = [i for i in replaced(step.after[233], step.after, made_in_run(s.trace), all_versions(s.trace))
            if i in step.before]
    s.selected_node = 233
    assert sorted(graph.before.related) == sorted(mine), graph.before.related
    assert not {199, 196, 214} & set(graph.before.related)
    text = inspector.pane.object.replace("\\", "")
    made_by = [p for p in text.split("\n\n") if p.startswith("**made by**")]
    assert len(made_by) == 1 and "%199" not in made_by[0] and "%214" not in made_by[0], made_by
    assert "created by" not in text, text  # the step's line says the same: said once
    # the IR line stays the rewrite's record, as `rlxviz ir` prints and parses it; a note says what it left to others
    assert f"[fuse_attention_block &lt;- {', '.join(f'%{i}' for i in step.after[233].absorbed)}]" in text
    assert "this node did not replace %199, %196, %214 itself" in text, text
    s.selected_node = 214  # the Q/K/V projection, clicked in the before pane: re-made as %227
    assert graph.after.related == [227], graph.after.related
    assert "**became** %227" in inspector.pane.object


def test_a_node_made_beside_a_product_says_who_made_it_once():
    """gptj's re-made Q/K/V projection %227: its "created by" line says what it was made beside and what it
    re-makes, so that line stays, with the pane note, and the step's "made by" line goes."""
    from rlxviz.app.panels import NodeInspector

    s = _app()
    inspector = NodeInspector(state=s)
    s.step_to(f"after {QKV}")
    s.selected_node = 227
    text = inspector.pane.object.replace("\\", "")
    created = [p for p in text.split("\n\n") if p.startswith("**created by**")]
    assert len(created) == 1 and "beside attention %233" in created[0], created
    assert created[0].endswith("(marked in the before pane)") and "replacing %214" in created[0], created
    assert "**made by**" not in text, text
