"""The Graph tab's search follows absorption to any depth (issue 39, a newcomer run: `attention` or `softmax` was
found inside one fused node, but once that fused node was absorbed in turn, softmax -> attention ->
FusedAttentionBlock -> FusedTransformerLayer, the search said "no match").

The pane's search reads `SvgGraph.absorbed` (`graphpane.absorbed_index`): per drawn fused node, each op it holds at
any depth, the ids, and the note shown ("softmax: absorbed into FusedTransformerLayer %N (layer 0) via
FusedAttentionBlock %M → attention %K"). The browser half (typing in the box) is tests/test_browser_search.py."""

from __future__ import annotations

import pytest

from rlxviz.app.graphpane import absorbed_index, folded_index, search_order
from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.ir import Op
from rlxviz.models import load_model
from rlxviz.passes import Pipeline
from rlxviz.viz.dot import node_tooltips
from rlxviz.viz.overlay import all_versions


def _final(preset: str) -> AppState:
    s = AppState(runner=Runner(background=False), preset=preset, seq=8)
    s.version = len(s.version_labels) - 1
    return s


def _rows(index, node_id):
    return {op: (ids, note) for op, ids, note in index[f"n{node_id}"]}


@pytest.fixture(scope="module")
def bert_tiny():
    return _final("bert-tiny")


def test_bert_tiny_final_version_finds_what_a_fused_node_inside_a_fused_node_holds(bert_tiny):
    """bert-tiny after the last pass: each FusedTransformerLayer absorbed a FusedAttentionBlock, which absorbed the
    attention op; the pane's index names attention (and the block itself) on the layer, with the block it went
    through."""
    from rlxviz.app.panels import GraphCompare

    s = bert_tiny
    pane = GraphCompare(state=s)
    layers = s.current_graph.find(Op.FUSED_TRANSFORMER_LAYER)
    assert layers and s.current_step is not None and s.current_step.pass_name != "fuse_transformer_layer"
    every = all_versions(s.trace)
    for ftl in layers:
        rows = _rows(pane.after.absorbed, ftl.id)
        block = next(i for i in ftl.absorbed if every[i].op == Op.FUSED_ATTENTION_BLOCK)
        ids, note = rows["attention"]
        assert all(every[i].op == Op.ATTENTION for i in ids) and ids
        assert note == (f"absorbed into FusedTransformerLayer %{ftl.id} (layer {ftl.path.split('.')[2]}) "
                        f"via FusedAttentionBlock %{block}")
        assert rows["FusedAttentionBlock"] == ([block], f"absorbed into FusedTransformerLayer %{ftl.id} "
                                                        f"(layer {ftl.path.split('.')[2]})")
    # the before pane (the graph the last pass saw) holds the same layers: its index has them too
    assert all(f"n{ftl.id}" in pane.before.absorbed for ftl in layers)


def test_every_held_node_is_listed_once_under_its_own_op(bert_tiny):
    """The index holds, for each fused node, what it absorbed and, for each of those that is a fused node, what that
    one absorbed, to the end: each id once, under its own op."""
    s = bert_tiny
    every = all_versions(s.trace)
    index = absorbed_index(s.current_graph, s.trace)
    for n in s.current_graph:
        if not n.absorbed:
            assert f"n{n.id}" not in index
            continue
        listed = [i for _, ids, _ in index[f"n{n.id}"] for i in ids]
        assert len(listed) == len(set(listed))
        assert all(every[i].op.value == op for op, ids, _ in index[f"n{n.id}"] for i in ids)
        assert set(n.absorbed) <= set(listed)
        for i in listed:  # closed: what a held fused node absorbed is held too
            assert set(every[i].absorbed) <= set(listed), (n.id, i)


def test_minilm_softmax_three_levels_down():
    """MiniLM (the real weights' graph): softmax was absorbed by attention, attention by FusedAttentionBlock, that by
    FusedTransformerLayer; the note names the chain, outermost first."""
    trace = Pipeline.canonical().run(load_model("minilm", 1, 8).graph)
    every = all_versions(trace)
    layers = trace.final.find(Op.FUSED_TRANSFORMER_LAYER)
    assert len(layers) == 6
    index = absorbed_index(trace.final, trace)
    for ftl in layers:
        ids, note = _rows(index, ftl.id)["softmax"]
        (sm,) = ids
        att = next(n for n in every if sm in n.absorbed)
        block = next(n for n in every if att.id in n.absorbed)
        assert att.op == Op.ATTENTION and block.op == Op.FUSED_ATTENTION_BLOCK and block.id in ftl.absorbed
        assert note.startswith(f"absorbed into FusedTransformerLayer %{ftl.id} (layer ")
        assert note.endswith(f"via FusedAttentionBlock %{block.id} → attention %{att.id}")


def test_llama_block_one_level_is_said_as_before():
    """llama-block's final version: what FusedSwiGLU absorbed itself is said with no `via` (the one-level wording);
    the gate and up matmuls are the packed matmul's, which computes them (`passes.made.replaced`, as its label and
    the inspector say), not FusedSwiGLU's too."""
    s = _final("llama-block")
    g = s.current_graph
    swiglu = g.find(Op.FUSED_SWIGLU)
    assert swiglu
    index = absorbed_index(g, s.trace)
    for n in swiglu:
        rows = _rows(index, n.id)
        assert {"silu", "mul"} <= set(rows) and "matmul" not in rows, rows
        assert rows["silu"][1] == f"absorbed into FusedSwiGLU %{n.id} (layer 0)"
        packed = g[n.inputs[0]]
        assert packed.op == Op.MATMUL
        assert _rows(index, packed.id)["matmul"][1] == f"absorbed into matmul %{packed.id} (layer 0)"


def test_a_folded_layer_box_is_a_hit_for_an_op_held_deep_inside(bert_tiny):
    """The layer view: a layer box is a search hit when a node in it holds the op at any depth (Enter opens it, and
    the search runs again in the open layer, where the fused node is found through `absorbed`)."""
    s = bert_tiny
    folded = folded_index(s.current_graph, [], s.trace)
    for key in ("layer0", "layer1"):
        assert any("attention" in text and "fusedtransformerlayer" in text for _, text in folded[key])
    assert not any("attention" in str(text) for _, text in folded_index(s.current_graph, [])["layer0"])


def test_no_trace_no_index():
    """A bare graph (no run yet): nothing to resolve absorbed ids in, so an empty index (never an error)."""
    assert absorbed_index(load_model("bert-tiny", 1, 8).graph, None) == {}


def test_bert_tiny_as_exported_softmax_at_the_final_version_and_one_level_after_fuse_sdpa():
    """bert-tiny in Hugging Face primitives (`style="hf"`, the issue's run): after the last pass the softmax is
    three levels down (attention, FusedAttentionBlock, FusedTransformerLayer); after fuse_sdpa it is one level down
    and said as before ("absorbed into attention %N (layer k)", tests/test_browser_newcomer_nav.py)."""
    from rlxviz.app.panels import GraphCompare

    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8, style="hf")
    pane = GraphCompare(state=s)
    s.version = len(s.version_labels) - 1
    every = all_versions(s.trace)
    layers = s.current_graph.find(Op.FUSED_TRANSFORMER_LAYER)
    assert len(layers) == 2
    for ftl in layers:
        (sm,), note = _rows(pane.after.absorbed, ftl.id)["softmax"]
        att = next(n for n in every if sm in n.absorbed)
        block = next(n for n in every if att.id in n.absorbed)
        assert note == (f"absorbed into FusedTransformerLayer %{ftl.id} (layer {ftl.path.split('.')[2]}) "
                        f"via FusedAttentionBlock %{block.id} → attention %{att.id}")
    s.step_to("after fuse_sdpa")
    for att in s.current_graph.find(Op.ATTENTION):
        (sm,), note = _rows(pane.after.absorbed, att.id)["softmax"]
        assert every[sm].op == Op.SOFTMAX
        assert note == f"absorbed into attention %{att.id} (layer {att.path.split('.')[2]})"


def _after(trace, pass_name: str):
    return next(st.after for st in trace.steps if st.pass_name == pass_name)


@pytest.mark.parametrize("export", ["bert", "zoo/albert.ts-eager", "zoo/clip-text.ts-eager"])
def test_a_rewrite_that_makes_several_nodes_names_its_product_not_a_helper(export):
    """fuse_sdpa on an ONNX export makes a mask reshape, a cast and the attention op; each listed the match's 14
    absorbed nodes and the search said "softmax: absorbed into reshape %122". Only the attention op holds them (the
    mask's nodes absorb nothing, `test_made_beside`)."""
    from pathlib import Path

    from rlxviz import session

    model = session.load(str(Path(__file__).parent / "fixtures" / "onnx" / f"{export}.onnx"))
    trace = Pipeline.canonical().run(model.graph)
    graph = _after(trace, "fuse_sdpa")
    helpers = [n for n in graph if n.pass_name == "fuse_sdpa" and n.op != Op.ATTENTION
               and any(u.op == Op.ATTENTION for u in graph.users(n))]
    assert helpers, "fuse_sdpa made nodes beside the attention op"
    index = absorbed_index(graph, trace)
    holders = {graph[int(k[1:])].op for k, rows in index.items() if any(op == "softmax" for op, _, _ in rows)}
    assert holders == {Op.ATTENTION}, holders
    for n in helpers:  # a helper the product reads holds nothing in the search
        assert f"n{n.id}" not in index


def _order_with_open(state: AppState, query: str, open_layers: list[int]) -> list[int]:
    """What Enter steps through in the layers view of `state`'s shown version with `open_layers` drawn open."""
    g = state.current_graph
    folded = folded_index(g, open_layers, state.trace)
    boxed = {i for rows in folded.values() for i, _ in rows}
    drawn = {i: t for i, t in node_tooltips(g).items() if i not in boxed}
    return search_order([n.id for n in g], drawn, folded, absorbed_index(g, state.trace), query)


@pytest.mark.parametrize("query", ["attention", "layernorm", "gelu", "%21", "matmul"])
def test_the_search_steps_through_one_fixed_order_whichever_layers_are_open(bert_tiny, query):
    """Newcomer run (bert-base, "gelu"): each layer opened by the search restarted the count at 1/12, so hit k took
    k(k+1)/2 presses. A node inside a folded layer is a hit of its own, ranked as it is once drawn: opening layers one
    by one (as Enter does) never changes the hits nor their order."""
    ways = [_order_with_open(bert_tiny, query, layers) for layers in ([], [0], [1], [0, 1])]
    assert ways[0], query
    assert all(w == ways[0] for w in ways), ways
    assert len(set(ways[0])) == len(ways[0])


def test_an_earlier_version_keeps_its_order_too():
    """bert-tiny before any fusion: every op is drawn or folded on its own (many hits per layer)."""
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.version = 0
    ways = [_order_with_open(s, "add", layers) for layers in ([], [1], [0, 1])]
    assert len(ways[0]) > 4 and all(w == ways[0] for w in ways), ways
    rank = {n.id: k for k, n in enumerate(s.current_graph)}
    assert [rank[i] for i in ways[0]] == sorted(rank[i] for i in ways[0])  # graph order
