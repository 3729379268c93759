"""A fused op the layers share sits outside them, in every view (newcomer run 22, finding 2).

T5's `ElementwiseRegion` %357 joins the attention mask's `where` (path `model.encoder`) and block 0's relative
position bias `add` (`model.encoder.block.0.layer.0.SelfAttention`); both encoder blocks' attentions read it. Its
match's path is its last step's, block 0's, so `explain` credited encoder layer 0 with it ("fused as far as
rlxviz's ops go", and the headline counted it), while the app boxed it by its own path in `model` and the
inspector named no layer.
`placement.shared` now credits such an op to no layer (the `model` place, where the app draws it), and `placed`
boxes every match's product where `match_layer` credits it (falcon.ortopt's residual-sum region of path `model.h`,
which `explain` credits to layer 1, was drawn in `model`).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
from clirun import run as cli_run
from test_near_miss_rule import trace_of

from rlxviz.app.explain import decision_rows, node_report, report_markdown
from rlxviz.ir import Op
from rlxviz.ir.ops import FUSED
from rlxviz.passes import Trace, placement
from rlxviz.passes.placement import outside_box
from rlxviz.passes.trace import layer_of
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.session.render import View, picture
from rlxviz.viz.box_words import SHARED as SHARED_WORDS
from rlxviz.viz.box_words import box_label, box_tooltip
from rlxviz.viz.layers import layer_groups

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
ORT = Path(__file__).parent / "fixtures" / "onnx" / "ortopt"
T5 = ZOO / "t5.encdec.onnx"
SHARED = [T5, ZOO / "t5-encoder.dynamo-eager.onnx", ZOO / "t5-encoder.ts-eager.onnx", ORT / "t5-encoder.ortopt.onnx",
          ZOO / "bloom.dynamo-eager.onnx", ZOO / "mpnet.dynamo-eager.onnx", ZOO / "mpnet.ts-eager.onnx"]
"""Models with a region of the mask and a position bias (T5's relative bias, BLOOM's ALiBi, MPNet's relative bias)
that every layer reads: each was credited to layer 0 by its match's path."""
_ID = re.compile(r"%(\d+) ")


@functools.cache
def _trace(path: Path) -> Trace:
    return trace_of(path)


def _said(t: Trace) -> dict[int, object]:
    """Each fused op of the final graph -> the layer the verdict lists it under (None: `outside the layers:`)."""
    v = RunVerdict.of(t)
    out: dict[int, object] = {int(_ID.search(x + " ")[1]): lv.layer for lv in v.layers for x in lv.done}
    out.update({int(_ID.search(x + " ")[1]): None for x in v.outside})
    return out


def _drawn(t: Trace) -> dict[int, object]:
    """Each node of the final version -> the layer of the box the app's layers view draws it in (None: a box
    outside the layers)."""
    g, ov, kw = picture(t, View(len(t.versions()) - 1, "layers", "after"))
    boxes = layer_groups(g, ov, kw.get("verdicts"), kw.get("placed"), kw.get("refusals"), kw.get("outside"))
    return {n.id: b.layer for b in boxes.values() for n in b.nodes}


def _shared_regions(t: Trace) -> list[int]:
    """Regions of the final graph that took in ops of no layer (their path names none) and that several layers read."""
    g = t.final
    return [n.id for n in g if n.op == Op.ELEMENTWISE_REGION and layer_of(n.path) is None
            and len({k for u in g.users(n.id) if (k := layer_of(u.path)) is not None}) > 1]


def test_t5_mask_and_bias_region_is_no_layer_s_own_fusion():
    t = _trace(T5)
    assert _shared_regions(t) == [357]
    assert placement.shared(t.final, 357)
    v = RunVerdict.of(t)
    enc0, enc1 = (lv for lv in v.layers if lv.layer.stack == "encoder")
    assert not enc0.done and enc0.status == enc1.status == "held back by rlxviz's ops"
    assert "ElementwiseRegion %357 (mark_elementwise_regions)" in v.outside
    assert outside_box(t, 357) == "model"
    assert _drawn(t)[357] is None  # the app's `model` box, as `explain` says
    rows = [r for r in decision_rows(t) if r["rule"] == "mark_elementwise_regions.chain"]
    assert [r["layer"] for r in rows] == [None]  # the Matches table names no layer
    rep = node_report(t.final, 357, t)
    assert rep["layer"] is None and rep["verdict"] is None
    assert "(layer" not in report_markdown(rep)


def test_t5_cli_and_json_say_the_region_outside_the_layers(capsys):
    code, out, _ = cli_run(capsys, "explain", T5)
    assert "encoder layer 0: held back by rlxviz's ops: no fused op" in out, out
    assert "fused as far as rlxviz's ops go" not in out
    assert "4 held back by rlxviz's ops" in out.splitlines()[1]
    outside = next(x for x in out.splitlines() if x.startswith("outside the layers:"))
    assert "model: ElementwiseRegion %357 (mark_elementwise_regions)" in outside
    code, out, _ = cli_run(capsys, "explain", T5, "--json")
    d = json.loads(out)
    assert d["outside_boxes"]["ElementwiseRegion %357 (mark_elementwise_regions)"] == "model"
    assert all(not lv["done"] for lv in d["layers"])


@pytest.mark.parametrize("path", SHARED, ids=lambda p: p.stem)
def test_a_region_every_layer_reads_is_said_and_drawn_outside_the_layers(path):
    t = _trace(path)
    regions = _shared_regions(t)
    assert regions, path.stem
    said, drawn = _said(t), _drawn(t)
    assert {i: said.get(i, "unsaid") for i in regions} == dict.fromkeys(regions), path.stem
    assert {i: drawn.get(i, "undrawn") for i in regions} == dict.fromkeys(regions), path.stem


@pytest.mark.parametrize("path", [T5, ORT / "falcon.ortopt.onnx", ZOO / "gemma3.dynamo-eager.onnx"],
                         ids=lambda p: p.stem)
def test_every_fused_op_is_drawn_where_the_verdict_says_it(path):
    """One placement: each fused op's box is the layer (or the place outside the layers) the verdict lists it under,
    whatever its path says (falcon.ortopt's region of path `model.h`, gemma3's per-layer mask regions of path
    `model`, each read by one layer, were credited to that layer and drawn in `model`)."""
    t = _trace(path)
    said, drawn = _said(t), _drawn(t)
    fused = [n.id for n in t.final if n.op in FUSED and n.id in said]
    assert fused, path.stem
    assert {i: drawn.get(i) for i in fused} == {i: said[i] for i in fused}, path.stem


@pytest.mark.parametrize("path", [ZOO / "gemma3.dynamo-eager.onnx", ORT / "clip-vision.ortopt.onnx"],
                         ids=lambda p: p.stem)
def test_the_inspector_names_the_layer_a_product_sits_in(path):
    """A product whose own path names no layer (gemma3's per-layer mask regions of path `model`, clip-vision's
    FusedResidualLN of path `model`) sits in the layer the verdict files it under. (falcon.ortopt's region of path
    `model.h` was one until its residual sum took the layer it closes, `contrib.skip_ln`.)"""
    t = _trace(path)
    said = _said(t)
    moved = [i for i, k in said.items() if k is not None and layer_of(t.final[i].path) is None]
    assert moved
    for i in moved:
        rep = node_report(t.final, i, t)
        assert rep["layer"] == said[i]
        assert f"(layer {said[i]})" in report_markdown(rep)


@pytest.mark.parametrize("path", [T5, ZOO / "t5-encoder.dynamo-eager.onnx", ORT / "t5-encoder.ortopt.onnx",
                                  ZOO / "mpnet.ts-eager.onnx"], ids=lambda p: p.stem)
def test_the_shared_position_bias_weighs_in_the_model_box_at_every_version(path):
    """Newcomer finding: T5's relative position bias (a folded `f32[1, 4, 16, 16]` weight), added in block 0 and
    read by every block, counted in encoder layer 0's box until `mark_elementwise_regions` took its add into the
    shared region, then in `model`'s. A box's weights are its own; these are every layer's: counted in `model` at
    every version, said there (`(1.02K shared)`, the tooltip's why), so the encoder's layers weigh alike."""
    t = _trace(path)
    for i in range(len(t.versions())):
        g, ov, kw = picture(t, View(i, "layers", "after"))
        boxes = layer_groups(g, ov, kw.get("verdicts"), kw.get("placed"), kw.get("refusals"), kw.get("outside"))
        model = boxes["g_model"]
        assert model.shared_weights == 4 * 16 * 16, (path.stem, i, model.shared_weights)
        assert "(1.02K shared)" in box_label(model) and SHARED_WORDS in box_tooltip(model), (path.stem, i)
        first = [b.weights for b in boxes.values() if b.layer is not None and b.layer.stack != "decoder"]
        assert len(first) == 2 and len(set(first)) == 1, (path.stem, i, first)
        assert not any(b.shared_weights for b in boxes.values() if b is not model)
