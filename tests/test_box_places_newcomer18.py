"""Where an op in no layer sits: one placement for `explain`'s `outside the layers:` line and the layers view's
boxes (newcomer run 18, finding 6).

esm.qdyn's line said `outside the layers: FusedResidualLN %797 (fuse_residual_ln), ElementwiseRegion %798
(mark_elementwise_regions)`, while the app drew %798 in an `embeddings` box and only %797 in its `outside the layers`
box; and the final norm's box was `encoder` before `fuse_residual_ln` and `outside the layers` after it. Decision:
`placement.outside_box` names the place of each op in no layer (a residual norm placed by structure: `final norm` or
`embeddings`, with the no-layer nodes it absorbed at every version; every other op: its path's first part); the line
says each op in its place (`final norm: FusedResidualLN %797 (...); embeddings: ElementwiseRegion %798 (...)`) and
the app draws one box per place, of that name.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from test_near_miss_rule import trace_of

from rlxviz.ir.ops import FUSED
from rlxviz.passes import Trace
from rlxviz.passes.placement import FINAL_NORM_BOX, outside_box
from rlxviz.passes.trace import layer_of
from rlxviz.passes.why.text import OUTSIDE_LAYERS, fused_list
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.session.render import View, picture
from rlxviz.viz.layers import LayerGroup, layer_groups

FIX = Path(__file__).parent / "fixtures" / "onnx"
MODELS = [FIX / "cases" / "esm.qdyn.onnx", FIX / "bert.onnx", FIX / "cases" / "deit.ortopt.onnx",
          FIX / "cases" / "granite.onnx", FIX / "cases" / "bart-full.onnx", FIX / "ortopt" / "gpt2.ortopt.onnx"]
ESM = MODELS[0]


@functools.cache
def _trace(path: Path) -> Trace:
    return trace_of(path)


def _boxes(t: Trace, version: int) -> dict[str, LayerGroup]:
    """The layers view's boxes of version `version` as the app draws them (the version selected: its after pane)."""
    g, ov, kw = picture(t, View(version, "layers", "after" if version else "before"))
    return layer_groups(g, ov, kw.get("verdicts"), kw.get("placed"))


def _where(boxes: dict[str, LayerGroup]) -> dict[int, LayerGroup]:
    return {n.id: b for b in boxes.values() for n in b.nodes}


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_the_outside_line_says_each_op_in_the_box_the_app_draws_it_in(path):
    t = _trace(path)
    v = RunVerdict.of(t)
    where = _where(_boxes(t, len(t.versions()) - 1))
    said = {int(re.search(r"%(\d+)", item)[1]): item for item in v.outside}
    # the fused ops drawn in no layer's box are those the line lists, and each sits in the box its place names
    drawn = {i for i, b in where.items() if b.layer is None and t.final[i].op in FUSED}
    assert drawn == set(said), (path.stem, drawn, said)
    for i, item in said.items():
        assert where[i].title == v.outside_in[item] == outside_box(t, i), (path.stem, item, where[i].title)
    text = v.render().splitlines()
    line = next(ln for ln in text if ln.startswith(f"{OUTSIDE_LAYERS}: "))
    for place in dict.fromkeys(v.outside_in.values()):
        mine = [x for x in v.outside if v.outside_in[x] == place]
        assert f"{place}: {fused_list(mine)}" in line, (path.stem, line)


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_a_nodes_box_keeps_its_name_across_versions(path):
    """A node in no layer is drawn in a box of one name at every version that holds it, and the no-layer nodes a
    fused op absorbed sat, before it was made, in the box it sits in (esm.qdyn's final `layer_norm` %768 in
    `encoder`, then its FusedResidualLN %797 in `outside the layers`)."""
    t = _trace(path)
    titles: dict[int, set[str]] = {}
    for k in range(len(t.versions())):
        for i, b in _where(_boxes(t, k)).items():
            titles.setdefault(i, set()).add(b.title)
    assert {i: s for i, s in titles.items() if len(s) > 1} == {}, path.stem
    final = _where(_boxes(t, len(t.versions()) - 1))
    checked = 0
    for i, b in final.items():
        if b.layer is not None or t.final[i].op not in FUSED:
            continue
        for a in t.final[i].absorbed:
            g = next((g for _, g in t.versions() if a in g), None)
            if g is not None and layer_of(g[a].path) is None and a in titles:
                assert titles[a] == {b.title}, (path.stem, i, a, titles[a], b.title)
                checked += 1
    assert checked or path.stem in ("deit.ortopt", "bart-full"), path.stem


def test_esm_qdyn_draws_its_final_norm_in_the_final_norm_box_at_version_22():
    t = _trace(ESM)
    assert t.versions()[22][0] == "after fuse_attention_block"
    boxes = _boxes(t, 22)
    norm = next(b for b in boxes.values() if any(n.op.value == "layer_norm" and layer_of(n.path) is None
                                                 for n in b.nodes))
    assert norm.title == FINAL_NORM_BOX and "g_encoder" not in boxes, sorted(boxes)
    v = RunVerdict.of(t)
    assert v.outside_in == {"FusedResidualLN %797 (fuse_residual_ln)": FINAL_NORM_BOX,
                            "ElementwiseRegion %798 (mark_elementwise_regions)": "embeddings"}
    assert (f"{OUTSIDE_LAYERS}: final norm: FusedResidualLN %797 (fuse_residual_ln); "
            f"embeddings: ElementwiseRegion %798 (mark_elementwise_regions)") in v.render().splitlines()


def test_the_search_index_holds_each_node_in_the_box_it_is_drawn_in():
    """The Graph tab's search over folded boxes (`folded_index`) keyed the final norm by its path's box (`g_encoder`),
    which the drawing no longer has."""
    from rlxviz.app.graphpane import folded_index

    t = _trace(ESM)
    for k in (22, len(t.versions()) - 1):
        drawn = {key: sorted(n.id for n in b.nodes) for key, b in _boxes(t, k).items()}
        index = {key: sorted(int(i) for i, _ in rows) for key, rows in folded_index(t.versions()[k][1], [], t).items()}
        assert index == drawn, k


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_a_norm_takes_into_its_box_what_it_absorbed_never_an_operand(path):
    """bart-full's embeddings norm read `gather` %4 (`x`, an operand it binds but does not absorb): %4 stays in its
    path's box, `encoder`; only the nodes a placed norm absorbed (`Node.absorbed`) follow it. What runs after the
    layers is placed by its own rule (`placement.after_places`: deit.ortopt's pooler `narrow`). A weight placed is
    one only values the layers share read in the final graph, in their place (granite's mask `bitwise_and`,
    `other`)."""
    from rlxviz.ir import Op
    from rlxviz.passes.placement import RESIDUAL_NORMS, after_layers, placed, shared

    t = _trace(path)
    where = placed(t)
    nodes = {n.id: n for _, g in t.versions() for n in g}
    absorbed_by = {a: n.id for n in nodes.values() for a in n.absorbed}
    after = {i for _, g in t.versions() for i in after_layers(g)}
    for i, place in where.items():
        if nodes[i].op in RESIDUAL_NORMS or (i in after and i not in absorbed_by):
            continue
        if nodes[i].op == Op.PARAM:
            readers = t.final.users(i)
            assert readers and all(shared(t.final, u.id) and outside_box(t, u.id) == place for u in readers), i
            continue
        assert i in absorbed_by and where.get(absorbed_by[i]) == place, (path.stem, i, nodes[i].op.value, place)
