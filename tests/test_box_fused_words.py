"""A layers-view box whose ops are all fused, or fused but for ops no fusion takes, reads `fused` (a newcomer run).

esm.qdyn's `encoder` box, its one op a FusedResidualLN, read "partly fused"; so did its `embeddings` box, an
ElementwiseRegion beside a gather, a reshape and two dtype-changing casts: a box outside a layer was "partly fused"
whenever it held a fused op at all.

Decision: `viz.layers.all_fused`: a box with a fused op whose other ops are weight preparation or not fusable
(`not_fusable`: data movement, leaves, host ops, a cast that changes the dtype) reads `fused`, for a layer at a version
before its verdict settles; a box with an unfused op a fusion could take stays `partly fused`. A box outside the
layers reads as `explain` words it (`layers.outside_status`: tests/test_layer_box_legend.py).
"""

from __future__ import annotations

import functools
import html
from pathlib import Path

from test_near_miss_rule import trace_of

from rlxviz.ir import Op
from rlxviz.ir.builder import Builder
from rlxviz.passes import Trace
from rlxviz.passes.placement import FINAL_NORM_BOX
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.session.render import View, dot, picture
from rlxviz.viz.layers import layer_groups, not_fusable, place_key

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"
ESM, DEIT, ROBERTA = (CASES / f"{n}.onnx" for n in ("esm.qdyn", "deit.ortopt", "roberta"))


@functools.cache
def _trace(path: Path) -> Trace:
    return trace_of(path)


def _boxes(t: Trace, version: int) -> dict:
    g, ov, kw = picture(t, View(version, "layers", "after"))
    return layer_groups(g, ov, kw.get("verdicts"), kw.get("placed"))  # as drawn


def test_esms_encoder_and_embeddings_boxes_read_fused_not_partly_fused():
    t = _trace(ESM)
    last = len(t.versions()) - 1
    boxes = _boxes(t, last)
    # the final norm (path `encoder`) is placed outside the layers by structure: since newcomer run 18 it is drawn in
    # the `final norm` box, where `explain`'s `outside the layers:` line says it sits, not in a box named by its path
    enc, emb = boxes[place_key(FINAL_NORM_BOX)], boxes["g_embeddings"]
    assert [n.op for n in enc.nodes] == [Op.FUSED_RESIDUAL_LN] and enc.status == "fused"
    assert emb.fused and emb.status == "fused", [(n.op.value, n.id) for n in emb.nodes]
    text = html.unescape(dot(t, View(last, "layers", "after")))
    assert "partly fused" not in text, text[:2000]


def test_no_version_draws_a_box_partly_fused_with_nothing_left_to_fuse():
    for path in (ESM, DEIT, ROBERTA):
        t = _trace(path)
        for i in range(len(t.versions())):
            g = t.versions()[i][1]
            for box in _boxes(t, i).values():
                if box.status == "partly fused":
                    left = [n for n in box.nodes if n.op.value not in ("param", "const") and not n.op.value[0].isupper()
                            and not not_fusable(g, n)]
                    assert left, (path.stem, i, box.key)


def test_a_box_outside_the_layers_reads_as_explain_says_it_not_by_its_unfused_ops():
    t = _trace(DEIT)
    boxes = _boxes(t, len(t.versions()) - 1)
    # a FusedMatMulBiasAct beside a tanh: was `partly fused` (an unfused op a fusion could take); since newcomer
    # findings on layer boxes, a place outside the layers reads as `explain`'s `outside the layers:` line says it
    # (its fused ops, nothing missed: `layers.outside_status`; tests/test_layer_box_legend.py)
    pooler = boxes["g_pooler"]
    assert pooler.status == "fused" and any(n.op == Op.TANH for n in pooler.nodes)
    assert "pooler" in RunVerdict.of(t).outside_in.values()


def test_not_fusable_says_movement_and_dtype_changing_casts_only():
    b = Builder()
    x = b.input("x", (2, 3), "i64")
    cast = b.emit(Op.CAST, [x], dtype="bool")
    same = b.emit(Op.CAST, [cast], dtype="bool")
    chained = b.emit(Op.CAST, [same], dtype="bool")  # a region could join `same` with it
    r = b.emit(Op.RESHAPE, [chained], shape=(3, 2))
    t = b.emit(Op.TANH, [b.emit(Op.CAST, [r], dtype="f32")])
    b.output(t)
    g = b.build()
    assert not_fusable(g, g[cast]) and not_fusable(g, g[r])
    assert not not_fusable(g, g[same]) and not not_fusable(g, g[t])


GPT_NEOX = CASES / "gpt-neox.legacy-sdpa.onnx"


def test_a_lone_boolean_mask_op_leaves_nothing_to_fuse():
    """gpt-neox's `model` box (its final norm, a FusedResidualLN, beside the mask's gather, cast, reshape and one
    boolean `where`) read "partly fused": no region joins a lone `where` (`cleanup.region_of_one`), and mask logic is
    taken by no other fused op. A boolean op a region could join, and a lone float op, stay fusable."""
    t = _trace(GPT_NEOX)
    boxes = _boxes(t, len(t.versions()) - 1)
    g = t.versions()[-1][1]
    # since newcomer run 18 the final norm is drawn in the `final norm` box; the mask's ops stay in `model`
    box = boxes["g_model"]
    assert any(n.op == Op.WHERE for n in box.nodes) and all(not_fusable(g, n) for n in box.nodes), box.nodes
    assert box.status != "partly fused" and boxes[place_key(FINAL_NORM_BOX)].status == "fused"
    b = Builder()
    x = b.input("x", (2, 3), "f32")
    m = b.input("m", (2, 3), "bool")
    lone = b.emit(Op.WHERE, [m, m, m])
    pair = b.emit(Op.WHERE, [b.emit(Op.EQ, [x, x]), m, m])
    f = b.emit(Op.TANH, [b.emit(Op.RESHAPE, [x], shape=(3, 2))])
    b.output(lone)
    b.output(pair)
    b.output(f)
    g = b.build()
    assert not_fusable(g, g[lone])
    assert not not_fusable(g, g[pair]) and not not_fusable(g, g[f])
