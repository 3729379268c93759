"""An exporter's hook is no module, and what runs after the layers has a box of its own (newcomer finding).

deit.qdq's collapsed layers view had a top box `_empty_nn_module_stack_from_metadata_hook` (20 ops), and `explain`
said it under `outside the layers:`: torch.export names the module stack of a node a pass made so
(`torch._export.passes._node_metadata_hook`), and the ONNX exporter writes it into the node's name scopes. It is no
part of the model: `onnx.paths` reads such a name as no module path, and the ops go where path-less ops go (deit's
input quantization: the path of the convolution that reads it).
Its `model` box held the embeddings and the final norm (`model.layernorm`) alike, so an arrow ran from
`model.layers.1` back up into `model`, which read as a cycle. What runs after the layers is boxed apart
(`placement.after_places`: `model.layernorm`), and `explain` says the same place.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import onnx
import pytest
from test_near_miss_rule import trace_of

from rlxviz.ir import Op, parse_ir
from rlxviz.ir.ops import FUSED
from rlxviz.models.onnx.paths import module_path, node_path
from rlxviz.passes import Trace
from rlxviz.passes.placement import AFTER_BOX, after_box, after_layers, after_places, outside_box
from rlxviz.passes.why.text import OUTSIDE_LAYERS
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.session.render import View, picture
from rlxviz.viz.layers import LayerGroup, layer_groups

FIX = Path(__file__).parent / "fixtures" / "onnx"
DEIT_QDQ = FIX / "zoo" / "deit.qdq.onnx"
HOOK = "_empty_nn_module_stack_from_metadata_hook"
MODELS = [DEIT_QDQ, FIX / "zoo" / "granite.qdq.onnx", FIX / "cases" / "optimum.llama-with-past.onnx",
          FIX / "zoo" / "deit.dynamo-eager.onnx", FIX / "vit.onnx"]
"""Exports of several exporters whose layers view had a box of the exporter's hook (deit.qdq, and the dynamo
exports' shape ops), or one holding both what runs before the layers and after them: deit.qdq's and granite.qdq's
`model` (their final norms, quantized, are no residual norm that `placed` puts in `final norm`), and
optimum.llama-with-past's input, whose final norm's casts sat in `model`."""


@functools.cache
def _trace(path: Path) -> Trace:
    return trace_of(path)


def _boxes(t: Trace, version: int) -> tuple[object, dict[str, LayerGroup]]:
    """(graph, the layers view's boxes) of version `version` as the app draws it."""
    g, ov, kw = picture(t, View(version, "layers", "after" if version else "before"))
    return g, layer_groups(g, ov, kw.get("verdicts"), kw.get("placed"), kw.get("refusals"), kw.get("outside"))


def _cycle(g, boxes: dict[str, LayerGroup]) -> list[str]:
    """The titles along a cycle of the boxes' edges (one per value a box reads from another), [] when none."""
    of = {n.id: b.key for b in boxes.values() for n in b.nodes}
    adj: dict[str, set[str]] = {}
    for n in g:
        for j in n.inputs:
            if (a := of.get(j)) and (b := of.get(n.id)) and a != b:
                adj.setdefault(a, set()).add(b)
    state: dict[str, int] = {}

    def visit(u: str, path: list[str]) -> list[str]:
        state[u] = 1
        for v in sorted(adj.get(u, ())):
            if state.get(v) == 1:
                return [*path[path.index(v):], u, v] if v in path else [u, v]
            if v not in state and (c := visit(v, [*path, u])):
                return c
        state[u] = 2
        return []

    for u in sorted(adj):
        if u not in state and (c := visit(u, [])):
            return [boxes[k].title for k in dict.fromkeys(c)]
    return []


def _scoped(scopes: str, name: str = "node_Shape_0") -> onnx.NodeProto:
    n = onnx.helper.make_node("Shape", ["x"], ["y"], name=name)
    p = n.metadata_props.add()
    p.key, p.value = "pkg.torch.onnx.name_scopes", scopes
    return n


def test_an_exporter_hook_is_no_module_path():
    assert node_path(_scoped(f"['{HOOK}', 'sym_size_int_3']")) == ""
    assert node_path(_scoped(f"['{HOOK}$1', 'sym_size_int_3']")) == ""
    assert node_path(_scoped("['', 'model', 'model.layers.0', 'linear']")) == "model.layers.0"
    assert node_path(onnx.helper.make_node("Shape", ["x"], ["y"], name=f"/{HOOK}/Shape")) == ""
    assert module_path(f"model.{HOOK}.x") == "model" and module_path("_orig_mod.model.norm") == "_orig_mod.model.norm"


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_no_box_or_line_names_the_hook(path):
    t = _trace(path)
    for version in (0, len(t.versions()) - 1):
        assert not [b.title for b in _boxes(t, version)[1].values() if "hook" in b.title], (path.stem, version)
    v = RunVerdict.of(t)
    assert "hook" not in v.render() and not [p for p in v.outside_in.values() if "hook" in p], path.stem


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_the_boxes_flow_one_way(path):
    """No arrow runs back from a layer into a box drawn above it: deit.qdq's ran `model.layers.1` -> `model`."""
    t = _trace(path)
    for version in (0, len(t.versions()) - 1):
        assert _cycle(*_boxes(t, version)) == [], (path.stem, version)


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_the_outside_line_says_the_places_the_boxes_draw(path):
    t = _trace(path)
    g, boxes = _boxes(t, len(t.versions()) - 1)
    where = {n.id: b for b in boxes.values() for n in b.nodes}
    v = RunVerdict.of(t)
    said = {int(re.search(r"%(\d+)", item)[1]): item for item in v.outside}
    assert {i for i, b in where.items() if b.layer is None and g[i].op in FUSED} == set(said), path.stem
    for i, item in said.items():
        assert where[i].title == v.outside_in[item] == outside_box(t, i), (path.stem, item)
    after = after_layers(g)  # none of what runs after the layers shares a box with what does not
    for b in boxes.values():
        if b.layer is None:
            assert len({n.id in after for n in b.nodes}) == 1, (path.stem, b.title)


def test_deit_qdq_draws_its_final_norm_apart_from_its_embeddings():
    t = _trace(DEIT_QDQ)
    g, boxes = _boxes(t, len(t.versions()) - 1)
    outside = {b.title for b in boxes.values() if b.layer is None}
    assert outside == {"model", "model.layernorm"}, outside
    line = next(ln for ln in RunVerdict.of(t).render().splitlines() if ln.startswith(f"{OUTSIDE_LAYERS}: "))
    assert "; model.layernorm: " in line and HOOK not in line, line


def test_after_the_layers_by_structure_named_by_path():
    g = parse_ir("""graph g {
  %0 = input {name="x"} : f32[2, 8] @model.embeddings
  %1 = relu(%0) : f32[2, 8] @model.embeddings
  %2 = exp(%1) : f32[2, 8] @model.layers.0
  %3 = neg(%2) : f32[2, 8] @model.norm
  %4 = tanh(%3) : f32[2, 8]
  %5 = sigmoid(%4) : f32[2, 8] @head
  return %5
}
""")
    assert after_places(g) == {3: "model.norm", 4: AFTER_BOX, 5: "head"}
    assert after_box("model", {"model"}) == AFTER_BOX and after_box("pooler.dense", {"encoder"}) == "pooler"
    titles = {n.id: b.title for b in layer_groups(g).values() for n in b.nodes}
    assert titles == {1: "model", 2: "model.layers.0", 3: "model.norm", 4: AFTER_BOX, 5: "head"}, titles
    assert g[1].op == Op.RELU


@pytest.mark.parametrize("path", MODELS[:3], ids=lambda p: p.stem)
def test_a_node_after_the_layers_keeps_its_box_across_versions(path):
    """Each node is drawn in a box of one name at every version that holds it (`placed` keeps the place of the first
    version that holds it)."""
    t = _trace(path)
    titles: dict[int, set[str]] = {}
    for k in range(len(t.versions())):
        for b in _boxes(t, k)[1].values():
            for n in b.nodes:
                titles.setdefault(n.id, set()).add(b.title)
    assert {i: s for i, s in titles.items() if len(s) > 1} == {}, path.stem
    assert path != DEIT_QDQ or {"model.layernorm"} in titles.values()
