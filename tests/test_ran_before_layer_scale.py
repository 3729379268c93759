"""An earlier pass's refusal cited for a role is the one at the place the role needs (a newcomer run).

beit (ortopt), layer 1: `ln1: the users of attn (node 170 ...) are mul (node 123, ...); needs FusedResidualLN:
fuse_residual_ln ran before and said no here: sum_single_user (illegal): sum (node 89, model.layers.0) has 2 users
(norm (node 92, ...layernorm_before), add (node 124 ...))`. BEiT scales the attention's output (layer scale: `attn *
lambda`) before the residual add, so `ln1`'s failed check blames that mul (%123); the sum it reaches is %124, closed
by layernorm_after %127. `report._refused_by` preferred a refusal anchored among the place's producers: the layer
input's norm %92 (bound as `hidden`) anchors fuse_residual_ln's refusal at sum %89, where %124 is only the extra
reader. Layer 0, whose input is no refused sum, cited sum %74 -> layernorm_after %77: the layers disagreed.

Decision: a refusal whose bound nodes include a node the failed check blames (`offending`: the mul %123, which the
refusal at %124 binds as its x) comes first, then one anchored among the producers, then any; the last of the best.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_model_fixes import case_text

from rlxviz.ir import parse_ir
from rlxviz.passes import Pipeline
from rlxviz.passes.report import in_context
from rlxviz.session.loading import load

BEIT = Path(__file__).parent / "fixtures" / "onnx" / "zoo" / "beit.ortopt.onnx"
CITED = re.compile(r"fuse_residual_ln ran before and said no here: sum_single_user \(illegal\): sum \(node (\d+), "
                   r"[^)]*\) has 2 users \(norm \(node (\d+), ([^)]*)\)")
L = "@encoder.layer.0"


def _ln1_sayings(g) -> dict[int, str]:
    """attn node -> the in-context message of each `ln1_is_residual_ln` refusal of `g`'s canonical run."""
    t = Pipeline.canonical().run(g)
    return {r.anchor: in_context(t, k, r)[0] for k, s in enumerate(t.steps) for r in s.rejections
            if r.guard == "ln1_is_residual_ln"}


def test_beits_layers_cite_the_sum_after_the_attention_each():
    said = _ln1_sayings(load(str(BEIT)).graph)
    cited = {a: CITED.search(m) for a, m in said.items()}
    assert all(cited.values()), said
    got = sorted((m.group(1), m.group(2), m.group(3)) for m in cited.values())
    assert got == [("124", "127", "model.layers.1.layernorm_after"), ("74", "77", "model.layers.0.layernorm_after")]


def _layer_scaled() -> str:
    """Case n4-15 (a post-LN layer whose first residual sum %39 a probe also reads) with its input a refused residual
    sum (%0 = inputs %90 + %91, read by the norm %94 the attention reads and by the residual add %39) and the
    attention's output scaled (layer scale: %96 = mul(attn out, lambda)) before the residual add."""
    t = case_text("n4-15")
    head = '  %0 = input {name="hidden_states"} : f32[2, 8, 64]\n'
    add = f"  %39 = add(%38, %0) : f32[2, 8, 64] {L}\n"
    assert head in t and add in t
    t = t.replace(head, '  %90 = input {name="hidden_states"} : f32[2, 8, 64]\n'
                        '  %91 = input {name="embeddings"} : f32[2, 8, 64]\n'
                        f"  %0 = add(%90, %91) : f32[2, 8, 64] {L}\n"
                        f'  %92 = param {{name="ln0.weight"}} : f32[64] {L}\n'
                        f'  %93 = param {{name="ln0.bias"}} : f32[64] {L}\n'
                        f"  %94 = layer_norm(%0, %92, %93) {{eps=1e-05, axis=-1}} : f32[2, 8, 64] {L}\n")
    for w in ("%8", "%14", "%20"):
        assert f"matmul(%0, {w})" in t
        t = t.replace(f"matmul(%0, {w})", f"matmul(%94, {w})")
    return t.replace(add, f'  %95 = param {{name="lambda_1"}} : f32[64] {L}\n'
                          f"  %96 = mul(%38, %95) : f32[2, 8, 64] {L}\n"
                          f"  %39 = add(%96, %0) : f32[2, 8, 64] {L}\n")


def test_a_layer_scaled_attention_cites_the_refusal_at_the_sum_it_reaches():
    said = _ln1_sayings(parse_ir(_layer_scaled()))
    assert len(said) == 1, said
    message = next(iter(said.values()))
    assert "are mul (node 96, encoder.layer.0); needs FusedResidualLN" in message, message
    m = CITED.search(message)
    assert m is not None and (m.group(1), m.group(2)) == ("39", "42"), message  # not sum %0 -> norm %94
    assert "mul (node 43, encoder.layer.0)" in message  # the probe: the sum's extra reader
