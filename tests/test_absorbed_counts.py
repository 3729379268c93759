"""A drawn node's "absorbed N" counts what it replaced itself (rlxviz issue 39, a newcomer's finding).

The Why tab's drawing of llama's layer 0 (the final version) said "absorbed 8 node(s)" on the two bias `expand`s
`fuse_attention_block` makes beside its FusedAttentionBlock and on the FusedAttentionBlock: the rewriter gives every
node of a match the match's list, and the after pane drawn without the run knew only the last step's nodes made
beside a product. The inspector's ONNX provenance already named each node once (`app.onnxorigin.onnx_claims`).

Decision: one reading, `passes.made.replaced`: a node made beside a product with the product's list replaced
nothing; an id another live node absorbed in a shorter list (or as long, made later) is that node's; an id still
live was not replaced. The drawing's label and tooltip, the inspector's `replacing` and the first level of its ONNX
provenance all read it, and every drawing of a run knows what the whole run made beside its products.
Invariant, on every version of each model: no absorbed id is claimed by two drawn nodes, each label's count is its
tooltip's list, and the nodes a step made together claim exactly the nodes it removed that they absorbed.
"""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path

import pytest

from rlxviz import session
from rlxviz.app.explain import node_report, report_markdown
from rlxviz.ir import Op
from rlxviz.passes import Pipeline, Trace
from rlxviz.passes.trace import layer_of
from rlxviz.session.render import View, dot

ONNX = Path(__file__).parent / "fixtures" / "onnx"
MODELS = {"llama": ONNX / "llama.onnx", "mistral-gqa": ONNX / "zoo" / "mistral.dynamo-eager.onnx",
          "bert": ONNX / "bert.onnx", "minilm": "minilm", "gptj": ONNX / "zoo" / "gptj.dynamo-eager.onnx",
          "esm": ONNX / "cases" / "esm.qdyn.onnx", "falcon-mqa": ONNX / "cases" / "falcon.onnx"}
"""Models whose rewrites make several nodes per match: llama's bias expands and packed gate/up matmul, mistral's
K/V heads repeated for grouped-query attention, falcon's for multi-query, gptj's `qkv_columns` ropes, esm's
rope heads views, bert's mask operand."""
NODE = re.compile(r'^\tn(\d+) \[label=<(.*?)> color=.*?tooltip="(.*?)"\]$', re.M)


@functools.cache
def _trace(name: str) -> Trace:
    path = MODELS[name]
    model = session.load(str(path), 1, 8) if isinstance(path, Path) else session.load(path)
    return Pipeline.canonical().run(model.graph)


def _drawn(source: str) -> dict[int, tuple[int | None, list[int]]]:
    """Each drawn node of DOT `source` -> (the N of its label's "absorbed N node(s)", its tooltip's absorbed ids)."""
    out: dict[int, tuple[int | None, list[int]]] = {}
    for m in NODE.finditer(source):
        count = re.search(r"absorbed (\d+) node\(s\)", m[2])
        tip = re.search(r"\\nabsorbed: ([%\d ]+)", html.unescape(m[3]))
        out[int(m[1])] = (int(count[1]) if count else None,
                          [int(i) for i in tip[1].replace("%", "").split()] if tip else [])
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_no_two_drawn_nodes_claim_one_absorbed_node_and_a_step_claims_what_it_removed(name):
    t = _trace(name)
    seen: set[str] = set()
    checked = 0
    for k, s in enumerate(t.steps, start=1):
        if s.after.digest in seen or not s.added:
            continue
        seen.add(s.after.digest)
        drawn = _drawn(dot(t, View(k, "full", "after")))  # the Graph tab's after pane of the step
        owner: dict[int, int] = {}
        for i, (count, ids) in drawn.items():
            assert count == (len(ids) or None), (name, s.pass_name, i, count, ids)
            for a in ids:
                assert a not in owner, (name, s.pass_name, f"%{a} claimed by %{owner[a]} and %{i}")
                owner[a] = i
        added = set(s.added)
        took = {a for i in added for a in s.after[i].absorbed} & set(s.removed)
        mine = {a for a, i in owner.items() if i in added}
        assert mine == took, (name, s.pass_name, sorted(took - mine), sorted(mine - took))
        checked += bool(took)
    assert checked >= 5, (name, checked)


def test_llamas_bias_expands_claim_none_of_the_attention_blocks_nodes():
    t = _trace("llama")
    last = len(t.versions()) - 1
    g = t.steps[-1].after
    blocks = [n for n in g if n.op == Op.FUSED_ATTENTION_BLOCK and layer_of(n.path) == 0]
    assert len(blocks) == 1
    block = blocks[0]
    expands = [g[i] for i in block.inputs if g[i].op == Op.EXPAND and g[i].pass_name == "fuse_attention_block"]
    assert len(expands) == 2 and all(e.absorbed == block.absorbed for e in expands)  # the rewriter's lists
    why = _drawn(dot(t, View(last, "full", "why", 0)))  # the Why tab's drawing of layer 0
    assert why[block.id] == (len(block.absorbed), list(block.absorbed)), why[block.id]
    source = dot(t, View(last, "full", "why", 0))
    labels = {int(m[1]): m[2] for m in NODE.finditer(source)}
    for e in expands:
        assert why[e.id] == (None, []), (e.id, why[e.id])
        assert "absorbed" not in labels[e.id], labels[e.id]
        assert f"beside FusedAttentionBlock %{block.id}" in labels[e.id], labels[e.id]
        md = report_markdown(node_report(g, e.id, t))  # the inspector says the same
        assert "replacing" not in md and f"beside FusedAttentionBlock %{block.id}" in md, md
    assert "absorbed 8 node(s): " in labels[block.id], labels[block.id]  # its ops named, through the run
    md = report_markdown(node_report(g, block.id, t))
    assert "replacing " + ", ".join(f"%{i}" for i in block.absorbed) in md, md


def test_llamas_packed_gate_up_matmul_counts_its_matmuls_and_swiglu_the_rest():
    """`fuse_swiglu.dual_matmul` records on its packed matmul the two MatMuls it computes: its label counts them and
    FusedSwiGLU the gate's activation and the product, as the inspector's ONNX provenance names them."""
    t = _trace("llama")
    k = next(k for k, s in enumerate(t.steps, start=1) if s.pass_name == "fuse_swiglu")
    g = t.steps[k - 1].after
    drawn = _drawn(dot(t, View(k, "full", "after")))
    swiglus = [n for n in g if n.op == Op.FUSED_SWIGLU]
    assert swiglus
    for sw in swiglus:
        mm = g[sw.inputs[0]]
        assert mm.op == Op.MATMUL and set(mm.absorbed) < set(sw.absorbed)
        assert drawn[mm.id] == (len(mm.absorbed), list(mm.absorbed))
        assert drawn[sw.id][1] == [i for i in sw.absorbed if i not in mm.absorbed]
        assert node_report(g, sw.id, t)["absorbed"] == drawn[sw.id][1]

