"""Nodes a match makes beside its product say so and claim none of the match's nodes (a newcomer run on BART: after
`fuse_sdpa` the mask's `reshape` and `cast` each read "by fuse_sdpa / absorbed 14 node(s): transpose×5, ...", the
same list as the `attention` they feed). Only the product (`Match.fused`) lists the absorbed nodes; the mask operand
absorbs nothing (`Rewriter.absorbing`) and its label, tooltip and the inspector name the product it was made for:
"made by fuse_sdpa.hf_attention beside attention %N (the mask operand)". The same for `rope_heads`' tables and the
heads view it re-makes after the rope op."""

from __future__ import annotations

import re
from pathlib import Path

from rlxviz import session
from rlxviz.app.explain import node_report, report_markdown
from rlxviz.ir import Op, format_graph
from rlxviz.passes import Pipeline
from rlxviz.passes.made import made_beside, made_in_run
from rlxviz.viz.dot import graph_to_dot, node_tooltips
from rlxviz.viz.overlay import Overlay

ZOO = Path(__file__).parent / "fixtures" / "onnx"


def _run(name: str):
    model = session.load(str(ZOO / f"{name}.onnx"))
    return Pipeline.canonical().run(model.graph)


def _labels(dot: str) -> dict[int, str]:
    """Each drawn node's HTML label in DOT source `dot`, by id."""
    return {int(m[1]): m[2] for m in re.finditer(r"^\tn(\d+) \[label=<(.*?)> color=", dot, re.M)}


def _step(trace, pass_name: str):
    return next(s for s in trace.steps if s.pass_name == pass_name)


def test_the_mask_operand_absorbs_nothing_and_says_whose_it_is():
    trace = _run("bert")
    step = _step(trace, "fuse_sdpa")
    g = step.after
    products = {m.fused for m in step.matches if m.fused is not None}
    made = [g[i] for i in step.added if i not in products]
    assert made and {n.op for n in made} >= {Op.CAST}, [n.op for n in made]
    assert all(not n.absorbed for n in made), [(n.op, n.absorbed) for n in made]
    cast = next(n for n in made if n.op == Op.CAST)
    text = next(ln for ln in format_graph(g).splitlines() if ln.strip().startswith(f"%{cast.id} = cast"))
    assert "<-" not in text, text
    beside = made_beside(step)[cast.id]
    reader = g[beside.product]
    assert reader.op == Op.ATTENTION and reader.inputs[3] == cast.id
    words = f"made by fuse_sdpa.hf_attention beside attention %{reader.id} (the mask operand"
    assert beside.words.startswith(words), beside.words
    ov = Overlay.after(step)  # the after pane, as the app draws it (no trace)
    label = _labels(graph_to_dot(g, ov))[cast.id]
    assert "absorbed" not in label and "made by fuse_sdpa.hf_attention beside" in label, label
    assert f"attention %{reader.id} (the mask operand" in label, label
    tip = node_tooltips(g, ov)[cast.id]
    assert "absorbed" not in tip and words in tip, tip
    md = report_markdown(node_report(g, cast.id, trace))  # the inspector says the same
    assert "beside attention" in md and "replacing" not in md, md
    prod = report_markdown(node_report(g, reader.id, trace))
    assert "replacing %" in prod


def test_rope_heads_names_its_tables_and_the_heads_it_remakes():
    trace = _run("llama")
    step = _step(trace, "fuse_sdpa/rope_heads")
    ropes = {m.fused for m in step.matches if m.fused is not None and step.after[m.fused].op == Op.ROPE}
    assert ropes, [m.rule for m in step.matches]
    made = made_in_run(trace)
    g = step.after
    for r in ropes:
        for i in g[r].inputs[1:]:  # cos, sin tables: operands, absorbing nothing
            if i in step.added:
                assert not g[i].absorbed and made[i].upstream, (i, g[i])
        after = [u for u in g.users(r) if u.id in step.added]
        for u in after:  # the heads view of the result: reads it, claims nothing in its label
            assert made[u.id].words.startswith(f"made by fuse_sdpa.rope_heads after rope %{r} (reads its result")
    labels = _labels(graph_to_dot(g, Overlay.after(step)))
    claims = [i for i in step.added if "absorbed" in labels.get(i, "")]
    assert set(claims) <= ropes, (claims, ropes)


def test_a_node_made_for_several_operands_names_them_all():
    """GPT-NeoX: `qkv_columns` re-makes the fused QKV projection the attention reads as Q, K and V: it is made for all
    three, not for the first one the walk met."""
    model = session.load(str(ZOO / "cases" / "gpt-neox.legacy-sdpa.onnx"))
    step = _step(Pipeline.canonical().run(model.graph), "fuse_attention_block/qkv_columns")
    made = made_beside(step)
    projections = [i for i, b in made.items() if step.after[i].op == Op.FUSED_MATMUL_BIAS_ACT]
    assert projections, {step.after[i].op for i in made}
    for i in projections:
        assert made[i].words.endswith("(the q, k and v operands)"), made[i].words
