"""One RoPE table read by Q's and K's rotations stays one table after `fuse_sdpa.rope_heads`: the rewriter reuses
an identical node it made (same op, attributes and operands: `Rewriter.emit`), so the `narrow` the rope op reads of
a full-width table is made once and shared, not once per rotation. Before, falcon's and granite's Q and K read two
identical copies of each table, and `fuse_attention_block`'s `rope_one_table` blamed "its own table pair" on the model
(a gap "FusedAttentionBlock with separate cos/sin tables") though the model computes each table once. Two tables
that are the same computation of one value are one table for that guard too (`block.same_computation`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_rope_heads import _feeds, _full_tables, rope_attention

from rlxviz.ir import Graph, Node, Op, Rewriter, parse_ir
from rlxviz.ir.builder import NodeEmitter
from rlxviz.ir.emitter import Ref
from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline, run_passes
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.runtime import run_reference

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"


def _twins(g: Graph) -> list[tuple[Node, Node]]:
    """Pairs of nodes of `g` that are one op with the same attributes on the same operands (one value twice)."""
    seen: dict[tuple, Node] = {}
    twins = []
    for n in g:
        if not n.inputs:
            continue
        key = (n.op, n.inputs, tuple(sorted((k, repr(v)) for k, v in n.attrs.items())))
        if key in seen:
            twins.append((seen[key], n))
        seen.setdefault(key, n)
    return twins


def _narrows_of(g: Graph, i: int) -> list[Node]:
    """The narrows that read node i, directly or through reshapes (a table's `[1, 1, S, r]` view)."""
    out = []
    for u in g.users(i):
        out += [u] if u.op == Op.NARROW else _narrows_of(g, u.id) if u.op == Op.RESHAPE else []
    return out


def _table_operands(g: Graph) -> set[int]:
    """The cos/sin operands of every rope op of `g`."""
    return {i for n in g if n.op == Op.ROPE for i in n.inputs[1:3]}


@pytest.mark.parametrize("n_rot", [16, 8])
def test_one_full_width_table_for_q_and_k_is_narrowed_once(n_rot):
    g = _full_tables(parse_ir(rope_attention(n_rot=n_rot, duplicated=False)), n_rot, equal=True)
    h = run_passes(g, ["fuse_sdpa"]).final
    ropes = [n for n in h if n.op == Op.ROPE]
    assert len(ropes) == 2 and ropes[0].inputs[1:3] == ropes[1].inputs[1:3]  # Q and K read one table pair
    for name in ("rotary_emb.cos_full", "rotary_emb.sin_full"):
        (param,) = [n for n in h if n.op == Op.PARAM and n.name == name]
        assert len(_narrows_of(h, param.id)) == 1, name
    assert not _twins(h)
    feeds, w = _feeds(g)
    w.update(g.values)
    for a, b in zip(run_reference(g, feeds, w), run_reference(h, feeds, w), strict=True):
        assert np.array_equal(a, b)


def test_the_rewriter_reuses_an_identical_node_it_made_until_it_is_removed():
    g = parse_ir(rope_attention(duplicated=False))
    rw = Rewriter(g, "test")
    table = next(n.id for n in g if n.op == Op.PARAM and n.name == "rotary_emb.cos_full")
    a = rw.narrow(table, 1, 0, 8)
    assert rw.narrow(table, -1 + 2, 0, 8) == a and rw.narrow(table, 1, 0, 4) != a
    rw.remove([a])
    assert rw.narrow(table, 1, 0, 8) != a  # a removed node is no value to share


def _falcon():
    io = dict(np.load(CASES / "falcon_io.npz"))
    feeds = {k: v for k, v in io.items() if not k.startswith("out:")}
    m = load_onnx(CASES / "falcon.onnx", input_shapes={k: v.shape for k, v in feeds.items()})
    return m, feeds, next(v for k, v in io.items() if k.startswith("out:"))


def test_falcon_reads_its_one_table_pair_once_and_its_block_fuses():
    """Falcon's export computes its cos and sin tables once (one param each, read by both layers' Q and K): after
    fuse_sdpa each is narrowed once, and the block takes the rotation, with the numbers kept."""
    m, feeds, want = _falcon()
    t = Pipeline.canonical().run(m.graph)
    after = dict(t.versions())["after fuse_sdpa"]
    assert len(_table_operands(after)) == 2 and not _twins(after)
    assert not [r for r in t.rejections if r.guard == "rope_one_table"]
    assert sum(n.op == Op.FUSED_ATTENTION_BLOCK and n.attrs["has_rope"] for n in t.final) == 2
    r = RunVerdict.of(t)
    assert r.layers and all(lv.fused and lv.status == "fused" and not lv.op_gaps for lv in r.layers)
    for v in (after, t.final):
        assert np.max(np.abs(run_reference(v, feeds, m.weights)[0] - want)) <= 1e-5


def _copied_k_tables(g: Graph) -> Graph:
    """`g` with K's rope reading its own copy of the (narrowed, reshaped) table chain Q's rope reads: one value
    computed twice, as a model may write it; made without the rewriter's reuse (`NodeEmitter.emit`)."""
    attn = next(n for n in g if n.op == Op.ATTENTION)
    k = g[attn.inputs[1]]
    rw = Rewriter(g, "copy")

    def copy(i: int) -> int:
        n = g[i]
        if n.op not in (Op.NARROW, Op.RESHAPE):
            return i
        return NodeEmitter.emit(rw, n.op, [copy(n.inputs[0])], **dict(n.attrs))

    with rw.provenance([k.id]):
        new = NodeEmitter.emit(rw, Op.ROPE, [k.inputs[0], copy(k.inputs[1]), copy(k.inputs[2])], **dict(k.attrs))
    rw.replace(k.id, new)
    return rw.finish()


def test_tables_that_are_one_computation_are_one_table_for_rope_one_table():
    from rlxviz.passes.rules.block import same_computation

    g = _full_tables(parse_ir(rope_attention(duplicated=False)), 16, equal=True)
    h = _copied_k_tables(run_passes(g, ["fuse_sdpa", "fuse_shared_input_matmul", "fuse_matmul_bias_act"]).final)
    attn = next(n for n in h if n.op == Op.ATTENTION)
    q, k = h[attn.inputs[0]], h[attn.inputs[1]]
    assert q.inputs[1:3] != k.inputs[1:3] and all(
        same_computation(h, a, b) for a, b in zip(q.inputs[1:3], k.inputs[1:3], strict=True))
    assert not same_computation(h, q.inputs[1], q.inputs[2])  # cos is not sin
    t = run_passes(h, ["fuse_attention_block"])
    assert not [r for r in t.rejections if r.guard == "rope_one_table"]  # not "each is rotated by its own pair"


def test_each_layer_quotes_its_own_block_refusal_though_the_layers_share_a_table():
    """Granite's two layers read one (shared) cos/sin narrow now; fuse_transformer_layer's "fuse_attention_block ran
    before and said no here" quotes the refusal anchored at its own layer's attention, not the other layer's that
    only shares the table (`report._refused_by`)."""
    from rlxviz.passes.report import in_context

    io = dict(np.load(CASES / "granite_io.npz"))
    shapes = {k: v.shape for k, v in io.items() if not k.startswith("out:")}
    t = Pipeline.canonical().run(load_onnx(CASES / "granite.onnx", input_shapes=shapes).graph)
    checked = 0
    for k, s in enumerate(t.steps):
        for r in s.rejections:
            if r.guard == "attn_is_fused_block" and r.headline:
                for text in in_context(t, k, r):  # its message and its fix line ("run fuse_attention_block first")
                    for quote in text.split("fuse_attention_block ran before and said no here: ")[1:]:
                        assert quote.startswith("default_scale") and f"(node {r.bindings['attn']}, " in quote, quote
                        checked += 1
    assert checked >= 2


def test_a_reused_node_is_placed_where_its_first_reader_is():
    """The later match's rewrite sits earlier in the graph: the node both share moves up to it, so that rewrite's
    product keeps its own place (before %4, which reads neither)."""
    g = parse_ir("""graph g {
  %0 = input {name="x"} : f32[4]
  %1 = param {name="p"} : f32[4]
  %2 = add(%0, %0) : f32[4]
  %3 = exp(%0) : f32[4]
  %4 = exp(%3) : f32[4]
  %5 = mul(%0, %0) : f32[4]
  %6 = add(%2, %4) : f32[4]
  %7 = add(%6, %5) : f32[4]
  return %7
}
""")
    rw = Rewriter(g, "test")
    made = []
    for old in (5, 2):  # the match at %5 first, then the one at %2
        with rw.provenance([old]):
            made.append(rw.add(rw.neg(Ref(1)), Ref(0)))
        rw.replace(old, made[-1])
    h = rw.finish()
    order = [n.id for n in h]
    assert order.index(made[1]) < order.index(3) < order.index(4)
