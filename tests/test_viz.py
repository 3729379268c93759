"""Drawing: DOT content (pure, no layout engine), overlays, large-graph views, SVG from both engines."""

from __future__ import annotations

import re

import pytest

from rlxviz.ir import Op, Rewriter
from rlxviz.models import VARIANTS, load_model
from rlxviz.passes.trace import Match, PassStep, Rejection, Trace
from rlxviz.viz import (
    ENGINES,
    FAMILY_COLORS,
    GraphTooLarge,
    LayoutError,
    Overlay,
    available_engines,
    hashed_color,
    layer_groups,
    layout,
    op_color,
    render_dot,
    render_svg,
    save,
)
from rlxviz.viz.styles import NOT_NEAR_MISS


@pytest.fixture(scope="module")
def tiny():
    return load_model("bert-tiny", 1, 8).graph


def _by_path(g, op, path_part):
    return [n for n in g if n.op == op and path_part in n.path]


def fuse_linears(g, layer=0):
    """A stand-in pass: fuse every matmul+bias add of one layer into FusedMatMulBiasAct, as a PassStep."""
    rw = Rewriter(g, "fuse_matmul_bias_act")
    matches = []
    for mm in _by_path(g, Op.MATMUL, f"encoder.layer.{layer}."):
        (add,) = g.users(mm)
        w, b = mm.inputs[1], add.inputs[1]
        new = rw.fuse(Op.FUSED_MATMUL_BIAS_ACT, (mm.inputs[0], w, b), {"activation": None}, absorbed=(mm.id, add.id))
        matches.append(Match("fuse_matmul_bias_act", "fuse_matmul_bias_act.linear", add.id,
                             {"mm": mm.id, "bias_add": add.id}, new, mm.path))
    return PassStep("fuse_matmul_bias_act", g, rw.finish(), matches)


def h1_rejection(g, layer=0):
    """The rejection a transformer-layer pass reports on the extra_h1_user variant (built by hand here)."""
    lns = _by_path(g, Op.LAYER_NORM, f"encoder.layer.{layer}.")
    h1, ln2 = lns[0], lns[1]
    probe = next(u for u in g.users(h1) if u.op == Op.REDUCE_MEAN)
    attn = _by_path(g, Op.ATTENTION, f"encoder.layer.{layer}.")[0]
    return Rejection("fuse_transformer_layer", "fuse_transformer_layer.bert_post_ln", ln2.id, "guard",
                     "h1_user_count", f"h1 (%{h1.id}) has 3 users; needs exactly 2",
                     {"attn": attn.id, "ln1": h1.id, "ln2": ln2.id}, offending=(probe.id,),
                     offending_edges=((h1.id, probe.id),), path=f"encoder.layer.{layer}", hint="drop the probe")


def node_stmt(dot, i):
    m = re.search(rf"^\s*n{i} \[(.*)\]$", dot, re.M)
    assert m, f"no statement for n{i}"
    return m.group(1)


# -- plain graphs ------------------------------------------------------------------------------------
def test_full_view_ids_ranks_and_folded_params(tiny):
    dot = render_dot(tiny)
    for n in tiny.compute_nodes():
        assert f"id=n{n.id} " in node_stmt(dot, n.id)
    assert "rank=source" in dot and "rank=sink" in dot
    src = dot[dot.index("rank=source"):]
    assert "n0" in src[:200] and "n1" in src[:200]  # both inputs pinned to the top
    assert not any(f"\tn{p.id} [" in dot for p in tiny.params)  # params folded by default ...
    qkv = next(n for n in tiny if n.op == Op.MATMUL)
    assert "b: qkv.weight [64,192]" in node_stmt(dot, qkv.id)  # ... into their consumer's label
    assert "f32[1,8,192]" in node_stmt(dot, qkv.id)  # output type in the label
    att = tiny.find(Op.ATTENTION)[0]
    assert "heads=4 dh=16 mask=keep" in node_stmt(dot, att.id)  # key attributes in the label
    shown = render_dot(tiny, show_params=True)
    assert all(f"\tn{p.id} [" in shown for p in tiny.params)
    assert "label=\"f32" not in dot and 'label="f32[1,8,64]"' in render_dot(tiny, edge_labels=True)


def test_colors_stable_per_family_with_hashed_fallback():
    assert op_color(Op.MATMUL) == FAMILY_COLORS["blas"]
    assert op_color(Op.LAYER_NORM) == FAMILY_COLORS["norm"] != op_color(Op.ADD)
    assert op_color("not_an_op") == hashed_color("not_an_op") == hashed_color("not_an_op")
    assert re.fullmatch(r"#[0-9a-f]{6}", hashed_color("x")) and hashed_color("x") != hashed_color("y")


def test_dot_is_deterministic(tiny):
    assert render_dot(tiny) == render_dot(tiny)


# -- overlays ----------------------------------------------------------------------------------------
def test_match_clusters_on_before_graph(tiny):
    step = fuse_linears(tiny)
    dot = render_dot(step.before, Overlay.before(step))
    assert len(step.matches) == 4
    for k, m in enumerate(step.matches):
        assert f"subgraph cluster_m{k} " in dot
        block = dot[dot.index(f"subgraph cluster_m{k} "):]
        block = block[:block.index("\t}")]
        assert f"{m.path} -> FusedMatMulBiasAct" in block  # labelled with the layer and the fused op
        assert "fuse_matmul_bias_act.linear" in block  # ... and the rule
        assert f"\t\tn{m.bindings['mm']} [" in block and f"\t\tn{m.bindings['bias_add']} [" in block
        assert "<I>mm</I>" in node_stmt(dot, m.bindings["mm"])  # bound roles visible
        assert "<I>bias_add</I>" in node_stmt(dot, m.bindings["bias_add"])


def test_fused_nodes_list_what_they_absorbed(tiny):
    step = fuse_linears(tiny)
    dot = render_dot(step.after, Overlay.after(step))
    for m in step.matches:
        stmt = node_stmt(dot, m.fused)
        assert "FusedMatMulBiasAct" in stmt and "by fuse_matmul_bias_act" in stmt
        assert "absorbed 2 node(s): matmul, add" in stmt
        assert f"absorbed: %{m.bindings['mm']} %{m.bindings['bias_add']}" in stmt  # tooltip lists ids
        assert f"{m.path} -&gt; FusedMatMulBiasAct" in stmt
        assert "penwidth=2.5" in stmt or "penwidth=2" in stmt


def test_rejection_marked_with_guard_and_offending_edge():
    g = load_model("bert-tiny", 1, 8, variant=VARIANTS["extra_h1_user"]).graph
    r = h1_rejection(g)
    dot = render_dot(g, Overlay(rejections=(r,)))
    anchor = node_stmt(dot, r.anchor)
    assert "dashed" in anchor and "#c62828" in anchor
    assert "tooltip=" in anchor and "guard h1_user_count: h1 (%" in anchor and "hint: drop the probe" in anchor
    assert "✗ h1_user_count" in anchor
    probe = node_stmt(dot, r.offending[0])
    assert "offending: h1_user_count" in probe and "penwidth=3" in probe
    h1, p = r.offending_edges[0]
    edge = re.search(rf"n{h1} -> n{p} \[(.*)\]", dot).group(1)
    assert "color=\"#c62828\"" in edge and "label=h1_user_count" in edge and f"id=e{h1}_{p}" in edge
    block = dot[dot.index("subgraph cluster_r0 "):]
    assert "fuse_transformer_layer.bert_post_ln: h1_user_count" in block[:block.index("\t}")]
    for role in ("attn", "ln1", "ln2"):  # ln1 is named h1 by the pattern: drawn as its messages say it
        assert f"<I>{'ln1 (role h1)' if role == 'ln1' else role}</I>" in node_stmt(dot, r.bindings[role])


def test_diff_overlay_added_removed_unchanged(tiny):
    step = fuse_linears(tiny)
    dot = render_dot(step.after, Overlay.diff(step.before, step.after))
    for i in step.removed:
        stmt = node_stmt(dot, i)
        assert "removed" in stmt and "dashed" in stmt
    for i in step.added:
        assert "#2e7d32" in node_stmt(dot, i)
    unchanged = next(n for n in step.after if n.op == Op.ATTENTION)
    assert "#2e7d32" not in node_stmt(dot, unchanged.id) and "removed" not in node_stmt(dot, unchanged.id)
    assert "diff: +4 added, -8 removed" in dot


# -- large graphs ------------------------------------------------------------------------------------
def test_layer_view_status():
    g = load_model("bert-tiny", 1, 8, variant=VARIANTS["extra_h1_user"]).graph
    step = fuse_linears(g, layer=1)
    ov = Overlay(rejections=(h1_rejection(g, 0),))
    groups = layer_groups(step.after, ov)
    assert groups["layer0"].status == "rejected" and groups["layer1"].status == "partly fused"
    dot = render_dot(step.after, ov, view="layers")
    assert "id=layer0" in dot and "id=layer1" in dot and "id=g_embeddings" in dot
    assert "rejected: h1_user_count" in dot and "partly fused" in dot
    assert "guard h1_user_count" in dot  # message in the box tooltip
    assert len(re.findall(r"^\tlayer\d+ \[", dot, re.M)) == 2  # one box per layer, not one per op


def test_layer_view_fused_layer(tiny):
    """A layer reduced to one fused node reads as fused."""
    layer = [n for n in tiny.compute_nodes() if "encoder.layer.1." in n.path]
    x = layer[0].inputs[0]
    rw = Rewriter(tiny, "fuse_everything")
    rw.fuse(Op.GELU, (x,), {}, absorbed=[n.id for n in layer])
    assert layer_groups(rw.finish())["layer1"].status == "unfused"  # one node, but not a fused op
    rw = Rewriter(tiny, "fuse_everything")
    rw.fuse(Op.FUSED_RESIDUAL_LN, (x, x, *layer[-1].inputs[1:]), {"eps": 1e-12}, absorbed=[n.id for n in layer])
    assert layer_groups(rw.finish())["layer1"].status == "fused"


def test_focus_view_and_node_limit():
    g = load_model("bert-base-shaped", 1, 16).graph
    dot = render_dot(g, focus=5)
    ids = {int(i) for i in re.findall(r"^\s*n(\d+) \[", dot, re.M)}
    assert ids and all("encoder.layer.5." in g[i].path for i in ids)
    assert "\ts" in dot and "… %" in dot  # neighbours drawn as stubs
    with pytest.raises(GraphTooLarge, match="view='layers'"):
        render_dot(g, max_nodes=100)
    assert render_dot(g, view="layers", max_nodes=100)
    with pytest.raises(ValueError, match="layers"):
        render_dot(g, focus=40)


# -- layout engines ----------------------------------------------------------------------------------
def test_both_engines_installed():
    assert available_engines() == list(ENGINES)


@pytest.mark.parametrize("engine", ENGINES)
def test_svg_from_each_engine_keeps_ids(engine, tiny):
    step = fuse_linears(tiny)
    out = render_svg(step.before, Overlay.before(step), engine=engine)
    assert out.engine == engine and out.seconds > 0 and out.svg.lstrip().startswith("<?xml")
    for n in step.before.compute_nodes():
        assert f'id="n{n.id}"' in out.svg
    assert 'id="m0"' in out.svg and 'id="out0"' in out.svg
    m = step.matches[0]
    assert f'id="e{m.bindings["mm"]}_{m.bindings["bias_add"]}"' in out.svg
    assert "FusedMatMulBiasAct" in out.svg and "qkv.weight" in out.svg  # labels rendered, not ids
    layers = render_svg(tiny, view="layers", engine=engine)
    assert 'id="layer0"' in layers.svg and 'id="layer1"' in layers.svg


def test_layout_errors_are_clear():
    with pytest.raises(LayoutError, match="failed"):
        layout("digraph { a -> ", engine="graphviz-pure")


def test_auto_falls_back_to_pip_engine_without_system_graphviz(monkeypatch, tiny):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert available_engines() == ["graphviz-pure"]
    with pytest.raises(LayoutError, match="not installed"):
        render_svg(tiny, engine="system")
    assert render_svg(tiny, view="layers").engine == "graphviz-pure"


def test_save_formats(tmp_path, tiny):
    assert save(tmp_path / "g.dot", tiny).read_text().startswith("digraph")
    assert "<svg" in save(tmp_path / "g.svg", tiny, view="layers").read_text()
    assert save(tmp_path / "g.png", tiny, view="layers", engine="graphviz-pure").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="suffix"):
        save(tmp_path / "g.txt", tiny)


def test_trace_summary_overlay(tiny):
    step = fuse_linears(tiny)
    trace = Trace(tiny, [step], "demo")
    ov = Overlay.trace_summary(trace)
    assert len(ov.fused) == 4 and len(ov.origin) == len(tiny) + 4  # every version's nodes
    assert "partly fused" in render_dot(trace.final, ov, view="layers")


# -- with the real pipeline --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_trace():
    from rlxviz.passes import Pipeline
    return Pipeline.canonical().run(load_model("bert-tiny", 1, 8, style="rlx").graph)


def test_pipeline_transformer_layer_clusters_and_fused_nodes(tiny_trace):
    step = tiny_trace.step("fuse_transformer_layer")
    assert len(step.matches) == 2
    dot = render_dot(step.before, Overlay.before(step, trace=tiny_trace))
    for k in range(2):
        assert f"encoder.layer.{k} -> FusedTransformerLayer" in dot
    m = step.matches[0]
    for role in ("attn", "ln1", "fc1", "fc2", "ln2"):
        stmt = node_stmt(dot, m.bindings[role])
        assert f"<I>{'ln1 (role h1)' if role == 'ln1' else role}</I>" in stmt
    block = dot[dot.index("subgraph cluster_m0 "):]
    block = block[:block.index("\t}")]
    assert all(f"\t\tn{m.bindings[r]} [" in block for r in ("attn", "ln1", "fc1", "fc2", "ln2"))
    assert f"\t\tn{m.bindings['hidden']} [" not in block  # an operand, not absorbed
    final = render_dot(tiny_trace.final, Overlay.trace_summary(tiny_trace))
    stmt = node_stmt(final, m.fused)
    assert "FusedTransformerLayer" in stmt and "by fuse_transformer_layer" in stmt
    assert "FusedResidualLN×2" in stmt and "FusedAttentionBlock" in stmt  # absorbed ops named across versions
    layers = render_dot(tiny_trace.final, Overlay.trace_summary(tiny_trace), view="layers")
    # both layers and the embeddings (an ElementwiseRegion beside the norm a ○ refuses: nothing to fix, as `explain`'s
    # `outside the layers:` line says it; tests/test_layer_box_legend.py)
    assert layers.count("<B>fused</B>") == 3 and 'id=g_embeddings' in layers
    emb = next(x for x in layers.splitlines() if x.strip().startswith("g_embeddings "))
    assert "<B>fused</B>" in emb and "partly fused" not in emb


def test_pipeline_rejection_extra_h1_user():
    from rlxviz.passes import Pipeline
    g = load_model("bert-tiny", 1, 8, style="rlx", variant=VARIANTS["extra_h1_user"]).graph
    trace = Pipeline.canonical().run(g)
    step = trace.step("fuse_transformer_layer")
    (r,) = [r for r in step.rejections if r.guard == "h1_user_count"]
    dot = render_dot(step.before, Overlay.before(step, trace=trace), focus=0)
    anchor, subject = node_stmt(dot, r.anchor), node_stmt(dot, r.subject)
    assert "guard h1_user_count: ln1 (role h1) (node" in anchor  # the anchor carries the tooltip
    assert "guard h1_user_count: ln1 (role h1) (node" in subject  # h1 carries the mark
    # a reader the model returns: illegal for its layer, no near-miss (the chips' ○), so no red dashed ✗
    assert "○ illegal here: h1_user_count" in subject and "dashed" not in subject and "✗" not in dot
    assert "cluster_r0" in dot and "encoder.layer.1 -> FusedTransformerLayer" not in dot  # focus: layer 0 only
    layers = layer_groups(trace.final, Overlay.trace_summary(trace))
    assert layers["layer0"].status == NOT_NEAR_MISS and layers["layer1"].status == "fused"


def test_rejection_marks_the_node_its_guard_is_about():
    """h1_user_count is about h1 (ln1), not the attention anchor: the ✗ mark goes on h1."""
    from rlxviz.passes import Pipeline

    g = load_model("bert-tiny", 1, 8, variant=VARIANTS["extra_h1_user"]).graph
    step = Pipeline.canonical().run(g).step("fuse_transformer_layer")
    r = next(r for r in step.rejections if r.guard == "h1_user_count")
    assert r.subject == r.bindings["ln1"] and r.subject != r.anchor
    dot = render_dot(step.before, Overlay.before(step))
    h1_line = next(line for line in dot.splitlines() if line.strip().startswith(f"n{r.subject} "))
    anchor_line = next(line for line in dot.splitlines() if line.strip().startswith(f"n{r.anchor} "))
    assert "✗ h1_user_count" in h1_line and "✗ h1_user_count" not in anchor_line


def test_layer_view_fused_layer_with_merged_weights():
    """The canonical pipeline leaves each layer one FusedTransformerLayer plus the concat of its Q/K/V weights
    (weight preparation): the layers view says `fused`, as the pipeline's fused-layer count does."""
    from rlxviz.passes import Pipeline

    final = Pipeline.canonical().run(load_model("minilm", 1, 8).graph).final
    groups = layer_groups(final)
    assert final.op_counts().get("FusedTransformerLayer") == 6
    assert any(n.op == Op.CONCAT for n in groups["layer0"].nodes)  # the merged weights are in the box
    assert all(groups[f"layer{i}"].status == "fused" for i in range(6))
