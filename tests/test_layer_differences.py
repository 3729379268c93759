"""The sibling comparison ("layer N fused with RULE; the layers differ in:") lists only real differences (a newcomer
run: minilm with `extra_h1_user` at layer 1 listed "layer 0: layer_norm@output.LayerNorm(...)" vs "layer 1:
layer_norm@output.LayerNorm(...) users=4", though both output LayerNorms have 4 users: the layer's output was taken
to be its last node in graph order, and the variant's probe comes after it, so one layer's output was counted and the
other's was not). Both layers' output is found the same way (the node leaving the layer that depends on most of it),
so user counts are compared like for like, wherever the layers sit in the stack."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlxviz.ir import parse_ir
from rlxviz.models import PRESETS, VARIANTS, load_model
from rlxviz.passes import Pipeline
from rlxviz.passes.explain import _signature, explain
from rlxviz.passes.trace import layer_of
from rlxviz.passes.why.text import render_layer
from rlxviz.passes.why.verdict import RunVerdict

MODELS = [m for m in ("bert-tiny", "minilm-shaped", "minilm") if m in PRESETS]


def _trace(model: str, variant: str | None = None, layer: int = 0):
    v = replace(VARIANTS[variant], layer=layer) if variant else None
    return Pipeline.canonical().run(load_model(model, seq=8, variant=v).graph)


def _layers(model: str) -> int:
    return len({layer_of(n.path) for n in load_model(model, seq=8).graph} - {None})


def _where(model: str) -> tuple[int, int]:
    """Two layers to break: an early one and the last of the stack (whose output is the graph's)."""
    n = _layers(model)
    return (0, n - 1) if n == 2 else (1, n - 1)


@pytest.mark.parametrize("model", MODELS)
def test_an_extra_reader_of_h1_is_the_only_difference(model):
    for where in _where(model):
        trace = _trace(model, "dead_h1_user", where)  # a dead probe: a near-miss (a returned one is illegal here)
        ex = explain(trace, where)
        assert ex.sibling is not None and ex.sibling_rule == "fuse_transformer_layer.bert_post_ln"
        h1 = "layer_norm@attention.output.LayerNorm(add@attention.output.LayerNorm, param, param)"
        mine, theirs = f"layer {where}: ", f"layer {ex.sibling}: "
        assert sorted(ex.differences) == sorted([f"{theirs}{h1} users=2", f"{mine}{h1} users=3",
                                                 f"{mine}reduce_mean@probe(layer_norm@attention.output.LayerNorm) "
                                                 "users=0"]), (model, where, ex.differences)
        assert not any("@output.LayerNorm" in d for d in ex.differences)
        # the same words where explain and the Why tab print them
        text = render_layer(next(v for v in RunVerdict.of(trace).layers if v.layer == where))
        assert "output.LayerNorm(add@output.LayerNorm, param, param)" not in text, text
        assert f"{mine}reduce_mean@probe(layer_norm@attention.output.LayerNorm)" in text, text


@pytest.mark.parametrize("model", MODELS)
def test_a_returned_h1_and_a_tanh_gelu_are_each_one_difference(model):
    last = _where(model)[1]
    ex = explain(_trace(model, "output_intermediate", last), last)
    assert len(ex.differences) == 2 and any(d.startswith(f"layer {last}: ") and d.endswith("users=2 [graph output]")
                                            for d in ex.differences), ex.differences
    ex = explain(_trace(model, "tanh_gelu", last), last)
    assert ex.differences and all("gelu" in d for d in ex.differences), ex.differences


@pytest.mark.parametrize("model", MODELS)
def test_layers_built_alike_have_the_same_signature(model):
    """Nothing differs: every layer of the plain model, the first and the last included, gives the same lines."""
    g = load_model(model, seq=8).graph
    n = _layers(model)
    sigs = [_signature(g, k) for k in range(n)]
    assert sigs[0] and all(s == sigs[0] for s in sigs), model


STACK = """graph stack {
  %0 = input {name="x"} : f32[2, 8]
  %1 = abs(%0) : f32[2, 8] @embeddings
  %2 = relu(%1) : f32[2, 8] @layer.0.a
  %3 = neg(%2) : f32[2, 8] @layer.0.b
  %4 = tanh(%3) : f32[2, 8] @layer.0.c
  %5 = exp(%2) : f32[2, 8] @layer.0.side
  %6 = relu(%4) : f32[2, 8] @layer.1.a
  %7 = neg(%6) : f32[2, 8] @layer.1.b
  %8 = tanh(%7) : f32[2, 8] @layer.1.c
  %9 = exp(%6) : f32[2, 8] @layer.1.side
  return %8, %5, %9
}"""


def test_a_side_output_after_the_layer_output_is_compared_as_a_node():
    """In graph order each layer's side output comes last; the layer's output is `tanh` (it depends on the most), so
    layer 0 (read by layer 1) and layer 1 (returned) give the same lines."""
    g = parse_ir(STACK)
    assert _signature(g, 0) == _signature(g, 1) == ["relu@a(<layer input>) users=2", "neg@b(relu@a) users=1",
                                                    "tanh@c(neg@b)", "exp@side(relu@a) users=0 [graph output]"]
