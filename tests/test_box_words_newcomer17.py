"""Layers-view boxes and layer lines that said one thing two ways (newcomer run 17).

1. esm.dynamo-eager's layer 0 read `partly fused` (yellow) before the first dead_code_elimination and `fused as far
   as ...` (green) after it, with the same ops: dead consts of the layer kept it unsettled. Decision: a layer is
   settled by its live compute nodes (`session.render._layer_nodes`), and dead ops leave nothing to fuse.
2. The model's final norm sat in `model` (with the embeddings), `encoder` or `other` by export. Decision: the residual
   norms `match_layer` places outside the layers (by structure, not path) share one box, named by their place
   (`placement.outside_box`: `final norm`; newcomer run 18 renamed it from `outside the layers`, which named every op
   in no layer in `explain`'s line).
3. A layer line's `%361 ... %365` held %362, said outside the layers. Decision: a range holds only listed ids.
4. `rewritten as` listed an attention a later rule replaced; `-v` left out the FusedMatMulBiasAct the QKV-column
   rewrite made beside its attention. Decision: both lists say the final version's nodes, one source of side products.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from test_near_miss_rule import trace_of

from rlxviz.passes import Trace
from rlxviz.passes.explain import explain
from rlxviz.passes.placement import FINAL_NORM_BOX
from rlxviz.passes.why.text import fused_list, id_runs
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.session.render import View, picture
from rlxviz.viz.layers import layer_groups, place_key

FIX = Path(__file__).parent / "fixtures" / "onnx"


@functools.cache
def _trace(path: Path) -> Trace:
    return trace_of(path)


def _boxes(t: Trace, version: int, side: str = "after") -> dict:
    g, ov, kw = picture(t, View(version, "layers", side))
    return layer_groups(g, ov, kw.get("verdicts"), kw.get("placed"))


def test_a_layer_with_the_same_live_ops_reads_alike_before_and_after_dead_code_elimination():
    t = _trace(FIX / "zoo" / "esm.dynamo-eager.onnx")
    for i, s in enumerate(t.steps, 1):
        if s.pass_name != "dead_code_elimination":
            continue
        before, after = _boxes(t, i, "before"), _boxes(t, i, "after")
        for k, b in after.items():
            if b.layer is not None and {n.id for n in b.nodes} == {n.id for n in before[k].nodes}:
                assert (before[k].tone, before[k].status) == (b.tone, b.status), (i, k)


def test_the_final_norm_is_boxed_outside_the_layers_alike_across_exports():
    cases = FIX / "cases"
    for path in (FIX / "zoo" / "esm.dynamo-eager.onnx", cases / "esm.qdyn.onnx", cases / "granite.onnx"):
        t = _trace(path)
        boxes = _boxes(t, len(t.versions()) - 1)
        out = boxes[place_key(FINAL_NORM_BOX)]
        assert out.title == FINAL_NORM_BOX and out.status == "fused", (path.stem, out.status)
        assert any(n.op.value.startswith("FusedResidual") for n in out.nodes), path.stem
        said = {int(i) for item in RunVerdict.of(t).outside if item.startswith("FusedResidual")
                for i in re.findall(r"%(\d+)", item)}
        assert said and said <= {n.id for n in out.nodes}, path.stem


def test_a_range_of_ids_holds_only_listed_ids():
    assert id_runs(["361", "363", "364", "365"]) == "%361, %363 ... %365"
    line = fused_list([f"FusedMatMulBiasAct %{i} (fuse_matmul_bias_act)" for i in (361, 363, 364, 365)])
    assert "%361 ... %365" not in line and "%363 ... %365" in line


def test_rewritten_lists_final_ops_and_verbose_lists_side_products():
    t = _trace(FIX / "cases" / "gpt-neox.legacy-sdpa.onnx")  # the QKV-column rewrite makes a FusedMatMulBiasAct
    v = RunVerdict.of(t).layers[0]
    ids = [int(item.split(" %", 1)[1].split(" ", 1)[0]) for item in v.rewritten]  # each item's own node: a re-made
    assert ids and all(i in t.final for i in ids), v.rewritten  # rope names the product it re-makes too (`REMADE`)
    made = explain(t, 0).made["fuse_attention_block.qkv_columns"]
    # the re-made QKV projection is credited to the pass whose fusion it is, naming the stage (`facts.REMADE`)
    credited = [int(item.split(" %", 1)[1].split(" ", 1)[0]) for item in v.done
                if item.endswith(", re-made by fuse_attention_block.qkv_columns)")]
    assert credited and all(str(i) in made for i in credited), (made, v.done)
