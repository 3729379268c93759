"""The node inspector tells "absorbed into a fusion" from "an operand of it" (a newcomer run: on minilm with
`extra_h1_user` at layer 1, `FusedAttentionBlock %381` said "fused by fuse_residual_ln.residual as x: %98 add,
%101 layer_norm -> FusedResidualLN %388"; %381 is bound to the role `x` but stays an input of %388, it is not one of
the nodes that fusion replaced). A node is "fused" by a match only when the match's product absorbed it (or it is
that product); a node bound to a role it keeps is "operand ROLE of PRODUCT"."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from rlxviz.app.explain import node_decisions, node_report, report_markdown
from rlxviz.ir import parse_ir
from rlxviz.models import VARIANTS, load_model
from rlxviz.passes import Pipeline
from rlxviz.passes.made import credit, made_in_run
from rlxviz.viz.overlay import all_versions

RESIDUAL_LN = """graph res_ln {
  %0 = input {name="x"} : f32[2, 8]
  %1 = input {name="y"} : f32[2, 8]
  %2 = param {name="w"} : f32[8]
  %3 = param {name="b"} : f32[8]
  %4 = relu(%1) : f32[2, 8] @encoder.layer.0.attention
  %5 = add(%4, %0) : f32[2, 8] @encoder.layer.0.attention.output.LayerNorm
  %6 = layer_norm(%5, %2, %3) {eps=1e-12} : f32[2, 8] @encoder.layer.0.attention.output.LayerNorm
  return %6
}"""


def _model(name: str, variant: str | None, layer: int):
    v = replace(VARIANTS[variant], layer=layer) if variant else None
    return Pipeline.canonical().run(load_model(name, seq=8, variant=v).graph)


CASES = {
    "minilm_extra_h1_user_1": lambda: _model("minilm", "extra_h1_user", 1),
    "bert_tiny_extra_h1_user_0": lambda: _model("bert-tiny", "extra_h1_user", 0),
    "bert_tiny_plain": lambda: _model("bert-tiny", None, 0),
    "residual_ln_ir": lambda: Pipeline.canonical().run(parse_ir(RESIDUAL_LN)),
}


def _plain(markdown: str) -> str:
    return re.sub(r"<[^>]+>", "", markdown).replace("\\", "")


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bound_operand_is_not_said_to_be_fused(case):
    trace = CASES[case]()
    operands = 0
    for s in trace.steps:
        for m in s.matches:
            if m.fused is None:
                continue
            made = s.after[m.fused]
            for role, i in m.bindings.items():
                i = int(i)
                if i not in s.before or i == m.fused:
                    continue
                mine = [d for d in node_decisions(trace, i) if d["rule"] == m.rule and d["anchor"] == m.anchor]
                assert mine, (case, m.rule, role, i)
                # what the product replaced itself is fused; what a node made beside it replaced, re-made (the
                # merged bias add of `fuse_shared_input_matmul` the adds); what it copied and left, kept
                cr = credit(made, s.after, made_in_run(trace), all_versions(trace))
                want = ("fused" if i in cr.replaced else "re-made" if i in cr.remade else
                        "kept" if i in cr.kept else "operand")
                assert {d["outcome"] for d in mine} == {want}, (case, m.rule, role, i, mine)
                if want != "operand":
                    continue
                operands += 1
                assert mine[0]["role"] == role and mine[0]["made"] == f"{made.op.value} %{made.id}"
                g = s.before if i not in s.after else s.after
                text = _plain(report_markdown(node_report(g, i, trace)))
                items = [ln for ln in text.splitlines() if ln.startswith("- ") and m.rule in ln
                         and f"%{made.id}" in ln]
                assert len(items) == 1, text
                line = items[0]
                assert line.startswith(f"- operand *{role}* of {made.op.value} %{made.id} ({m.rule} matched"), line
                assert "fused by" not in line and "->" not in line, line
    assert operands, case  # each case binds at least one node it keeps (a residual, an attention output)


def test_minilm_attention_block_is_an_operand_of_the_residual_ln():
    """The newcomer's node: %381 (layer 1's FusedAttentionBlock) is `x` of FusedResidualLN, not fused into it,
    while the add and the layer_norm that fusion replaced are still "fused by" it."""
    trace = _model("minilm", "extra_h1_user", 1)
    k, m = next((k, m) for k, s in enumerate(trace.steps) for m in s.matches
                if m.rule == "fuse_residual_ln.residual" and m.path.startswith("encoder.layer.1.attention"))
    s = trace.steps[k]
    x = int(m.bindings["x"])
    assert s.before[x].op.value == "FusedAttentionBlock" and x in s.after
    text = _plain(report_markdown(node_report(s.after, x, trace)))
    line = next(ln for ln in text.splitlines() if "fuse_residual_ln.residual" in ln)
    assert line == (f"- operand *x* of FusedResidualLN %{m.fused} (fuse_residual_ln.residual matched; "
                    "all guards passed)"), line
    for role in ("sum", "norm"):
        text = _plain(report_markdown(node_report(s.before, int(m.bindings[role]), trace)))
        assert f"- fused by fuse_residual_ln.residual as *{role}*:" in text, text


def test_a_node_clicked_in_the_before_pane_is_described_as_that_version_has_it():
    """Newcomer run: FusedAttentionBlock %381 clicked in the *before fuse_transformer_layer* pane was described as
    the after version has it (operand %398 FusedTransformerLayer, where the clicked pane reads FusedResidualLN), and
    the drawer did not say which version it showed."""
    from rlxviz.app.jobs import Runner
    from rlxviz.app.panels import GraphCompare, NodeInspector
    from rlxviz.app.state import AppState

    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8, variant="extra_h1_user",
                 variant_layer=1)
    s.step_to("after fuse_transformer_layer")
    prev, cur = s.previous_graph, s.current_graph
    moved = [n.id for n in prev if n.id in cur and prev[n.id].inputs != cur[n.id].inputs]
    assert moved, "a node both versions hold, reading other operands in each"
    compare, drawer = GraphCompare(state=s), NodeInspector(state=s)
    for pane, where, mine, other in ((compare.before, "before", prev, cur), (compare.after, "after", cur, prev)):
        pane.clicked = moved[0]
        pane.clicks += 1
        text = drawer.pane.object
        assert f"As the {where} fuse_transformer_layer version has it" in text, text
        own = {f"%{i}" for i in mine[moved[0]].inputs} - {f"%{i}" for i in other[moved[0]].inputs}
        assert all(o in text for o in own), (where, own, text)


def test_a_click_elsewhere_after_a_before_pane_click_reads_the_shown_version():
    """A click in the IR text or the Why tab's drawing is not a before-pane click: the drawer reads the version
    shown again."""
    from rlxviz.app.jobs import Runner
    from rlxviz.app.panels import GraphCompare, IRView, NodeInspector
    from rlxviz.app.state import AppState

    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.step_to("after fuse_transformer_layer")
    compare, ir, drawer = GraphCompare(state=s), IRView(state=s), NodeInspector(state=s)
    shared = next(n.id for n in s.previous_graph if n.id in s.current_graph)
    compare.before.clicked = shared
    compare.before.clicks += 1
    assert "As the before fuse_transformer_layer" in drawer.pane.object
    ir.ir.clicked = shared
    ir.ir.clicks += 1
    assert "As the after fuse_transformer_layer" in drawer.pane.object, drawer.pane.object
