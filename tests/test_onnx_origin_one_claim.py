"""Each ONNX node is named by one node of a version, the one that computes it (a newcomer's finding on esm.qdyn).

After `fuse_attention_block`, the inspector of esm's `%795 attention` listed 23 absorbed ONNX nodes, 14 of them the
rotation (`node_mul_137, node_neg_1, ... 4 Slice, 2 Concat`) that `rope %777` and `rope %782` still listed as theirs:
the reshape and transpose `fuse_sdpa.rope_heads` makes after each rope carried the rope's list (the rewriter gives
every node of a match its list), and the attention absorbed them. Likewise `qkv_columns`' new projection and ropes,
made beside the attention, each "absorbed" the whole match (gptj's rope: "44, of the fusion that made it").

Decision (`app.onnxorigin.onnx_claims`): a node made beside a product with the product's list (`passes.made`)
claims nothing and is not followed; a node another live node absorbed nearer is that node's; `qkv_columns` records
on its new projection and ropes the old node each re-makes, `hoist_scales` on each moved op its own.
Invariant checked on every version of each model: no ONNX node name is listed by more live nodes' inspector
reports than the importer made IR nodes of it (one, but for a node it split: esm's `node_mul_252`, a gelu's
product and a plain mul), each imported IR node claimed by at most one live node.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest

from rlxviz import session
from rlxviz.app.explain import node_report, report_markdown
from rlxviz.ir import Op
from rlxviz.passes import Pipeline

HERE = Path(__file__).parent
ZOO = HERE / "fixtures" / "onnx" / "zoo"
CASES = HERE / "fixtures" / "onnx" / "cases"
MODELS = [CASES / "esm.qdyn.onnx", ZOO / "gptj.dynamo-eager.onnx", CASES / "gpt-neox.legacy-sdpa.onnx",
          ZOO / "bert.dynamo-eager.onnx", ZOO / "llama.dynamo-eager.onnx"]
ROTATION = {"Neg", "Concat"}
"""ONNX op types of a rotate_half: none is an attention's once a rope computes the rotation (a Slice may be: the
V columns gpt-neox's attention reads off its packed projection)."""


def _run(path: Path):
    m = session.load(str(path), 1, 8)
    return m.meta["onnx_nodes"], Pipeline.canonical().run(m.graph)


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_no_onnx_node_is_named_by_two_live_nodes_of_a_version(path):
    onnx, t = _run(path)
    splits = Counter(name for _, name, _ in onnx.values())  # ONNX node -> the IR nodes the importer made of it
    seen: set[str] = set()
    attentions = 0
    for k, s in enumerate(t.steps):
        g = s.after
        if g.digest in seen:  # a step that changed nothing: the version checked already
            continue
        seen.add(g.digest)
        by_name: dict[str, list[int]] = defaultdict(list)
        for n in g:
            rep = node_report(g, n.id, t, None, onnx)
            for _, name in rep["onnx"]:
                by_name[name].append(n.id)
            if n.op == Op.ATTENTION and any(g[i].op == Op.ROPE for i in n.inputs[:2]):
                ops = {op for op, _ in rep["onnx"]}
                assert not ops & ROTATION, (path.stem, s.pass_name, k, n.id, rep["onnx"])
                ropes = {name for i in n.inputs[:2] for _, name in node_report(g, i, t, None, onnx)["onnx"]}
                assert ropes and not ropes & {name for _, name in rep["onnx"]}, (path.stem, s.pass_name, n.id)
                attentions += 1
        for name, holders in by_name.items():  # a node the importer split in two may be named twice, no more
            assert len(holders) <= splits[name], (path.stem, s.pass_name, k, name, holders)
    if path.stem in ("esm.qdyn", "gptj.dynamo-eager", "llama.dynamo-eager"):
        assert attentions, path.stem  # an attention reading its ropes was checked


def test_esms_attention_names_its_own_nodes_and_the_ropes_theirs():
    onnx, t = _run(CASES / "esm.qdyn.onnx")
    k = max(k for k, s in enumerate(t.steps) if s.pass_name == "fuse_attention_block")
    g = t.steps[k].after
    attn = next(n for n in g if n.op == Op.ATTENTION and all(g[i].op == Op.ROPE for i in n.inputs[:2]))
    rep = node_report(g, attn.id, t, None, onnx)
    names = {name for _, name in rep["onnx"]}
    ops = [op for op, _ in rep["onnx"]]
    assert {"MatMul", "Softmax"} <= set(ops) and not set(ops) & {*ROTATION, "Slice"}, rep["onnx"]
    for q in attn.inputs[:2]:
        rope = node_report(g, q, t, None, onnx)
        assert {"Neg", "Slice", "Concat", "Mul"} <= {op for op, _ in rope["onnx"]}, rope["onnx"]
        assert not names & {name for _, name in rope["onnx"]}
    line = next(x for x in report_markdown(rep).split("\n\n") if "ONNX" in x)
    assert line.startswith(f"**absorbed ONNX nodes** ({len(ops)}, compute first):"), line
    # the reshape rope_heads made after a rope (in its version) names none: the rope does
    j = next(j for j, s in enumerate(t.steps) if s.pass_name == "fuse_sdpa/rope_heads")
    s = t.steps[j]
    rope = next(n for n in s.after if n.op == Op.ROPE)
    view = next(u for u in s.after.users(rope.id) if u.op == Op.RESHAPE)
    text = report_markdown(node_report(s.after, view.id, t, None, onnx))
    assert f"**absorbed ONNX nodes**: none of its own; its match's are named by rope %{rope.id}" in text, text
    assert "of the fusion that made it" not in text


def test_llamas_packed_gate_up_matmul_names_its_matmuls_and_swiglu_the_rest():
    """llama's `fuse_swiglu.dual_matmul` makes a packed matmul and a FusedSwiGLU: the matmul computes both products,
    so it names the two MatMuls; FusedSwiGLU names the gate's activation and the product (newcomer run 20: the
    matmul said "none of its own" and FusedSwiGLU listed the MatMuls)."""
    onnx, t = _run(ZOO / "llama.dynamo-eager.onnx")
    k = next(k for k, s in enumerate(t.steps) if s.pass_name == "fuse_swiglu")
    g = t.steps[k].after
    swiglus = [n for n in g if n.op == Op.FUSED_SWIGLU]
    assert swiglus
    for sw in swiglus:
        mm = g[sw.inputs[0]]
        said_mm = report_markdown(node_report(g, mm.id, t, None, onnx))
        said_sw = report_markdown(node_report(g, sw.id, t, None, onnx))
        assert "**absorbed ONNX nodes** (2, compute first)" in said_mm and said_mm.count("(MatMul)") == 2, said_mm
        line = next(x for x in said_sw.splitlines() if "absorbed ONNX nodes" in x)
        assert "(MatMul)" not in line and "(Sigmoid)" in line, line
