"""Every fused op the final version holds is said by exactly one line of `explain` (issue 39, newcomer finding 3).

A residual norm at a layer's edge (`FusedResidualLN`, `FusedResidualRmsNorm`) joins a residual sum to the norm
that reads it; its path (the common path of what it absorbed) named no layer, so GPT-2's, LLaMA's, ESM's and
Granite's final norm was said by no line at all, while DeiT's (ONNX Runtime named its SkipLayerNormalization after
the last linear) was credited to layer 1, and layer 0 was "compared with layer 1, where fuse_residual_ln.biased
fused" for it. One rule (`passes.placement.match_layer`) places such an op: post-LN, the layer whose sum it closes;
otherwise the layer whose sublayer reads it; none of either (the model's final norm, the embeddings' norm) is said on
the `outside the layers:` line. `explain` keys every match by that rule, so a layer's fused ops, the sibling pick
and the outside line read one placement.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.app.explain import decision_rows
from rlxviz.ir import Op, parse_ir
from rlxviz.ir.ops import FUSED_INTO, made_as
from rlxviz.passes import Pipeline
from rlxviz.passes.explain import explain
from rlxviz.passes.placement import match_layer
from rlxviz.passes.why.text import OUTSIDE_LAYERS, fused_list, outside_line
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.session.loading import load

ONNX = Path(__file__).parent / "fixtures" / "onnx"
MODELS = [str(ONNX / "gpt2.onnx"), "bert-tiny", "llama-block", str(ONNX / "llama.onnx"),
          str(ONNX / "cases" / "esm.qdyn.onnx"), str(ONNX / "cases" / "granite.onnx"),
          str(ONNX / "cases" / "deit.ortopt.onnx"), str(ONNX / "ortopt" / "bert.ortopt.onnx"),
          str(ONNX / "ortopt" / "gpt2.ortopt.onnx"), str(ONNX / "zoo" / "clip-text.dynamo-eager.onnx"),
          str(ONNX / "cases" / "gpt-neox.legacy-sdpa.onnx"), str(ONNX / "cases" / "bart-full.onnx"),
          str(ONNX / "zoo" / "mpnet.dynamo-eager.onnx")]
_ID = re.compile(r"%(\d+) ")


def _trace(model: str):
    return Pipeline.canonical().run(load(model, batch=2, seq=8).graph)


def _final_fused(trace) -> dict[int, str]:
    return {n.id: n.op.value for n in trace.final
            if n.op not in (Op.INPUT, Op.PARAM, Op.CONST) and made_as(n.op) == FUSED_INTO}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: Path(m).stem)
def test_every_final_fused_op_is_said_by_exactly_one_line(model):
    trace = _trace(model)
    v = RunVerdict.of(trace)
    d = v.to_dict()
    said = Counter(int(_ID.search(x + " ")[1]) for lv in d["layers"] for x in lv["done"])
    said.update(lv["fused_node"] for lv in d["layers"] if lv["fused_node"] is not None)
    said.update(int(_ID.search(x + " ")[1]) for x in d["outside_layers"])
    final = _final_fused(trace)
    assert final, "no fused op: nothing checked"
    assert {i: n for i, n in said.items() if n != 1} == {}  # none said twice
    assert set(said) == set(final), {i: final.get(i) for i in set(said) ^ set(final)}
    text = v.render()  # the text says what --json says: one source
    assert (outside_line(v) in text.splitlines()) == bool(v.outside)
    assert not v.outside or set(v.outside_in) == set(v.outside)  # each op said with its place
    heads = [ln for ln in text.splitlines() if ln.startswith(("layer ", "encoder layer", "decoder layer"))]
    assert len(heads) == len(v.layers)
    for lv, head in zip(v.layers, heads, strict=True):
        assert not lv.done or fused_list(lv.done) in head


@pytest.mark.parametrize("model,op", [(str(ONNX / "gpt2.onnx"), "FusedResidualLN"),
                                      (str(ONNX / "llama.onnx"), "FusedResidualRmsNorm"),
                                      (str(ONNX / "cases" / "esm.qdyn.onnx"), "FusedResidualLN"),
                                      (str(ONNX / "cases" / "granite.onnx"), "FusedResidualRmsNorm"),
                                      (str(ONNX / "cases" / "deit.ortopt.onnx"), "FusedResidualLN")],
                         ids=lambda x: Path(x).stem)
def test_the_models_final_norm_is_said_outside_the_layers(model, op):
    trace = _trace(model)
    v = RunVerdict.of(trace)
    norms = [i for i, o in _final_fused(trace).items() if o == op]
    assert len(norms) == 1 and v.counts[op] == 1
    assert [x for x in v.outside if x.startswith(f"{op} %{norms[0]} ")]
    assert not any(x.startswith(op) for lv in v.layers for x in lv.done)


def test_deit_ortopt_layer_0_is_compared_with_no_layer_credited_with_the_final_norm():
    """DeiT's final norm reads `layers.1.mlp.fc2` (ONNX Runtime named its SkipLayerNormalization after the last
    linear): layer 1 "fused" fuse_residual_ln.biased only by it, which made it layer 0's sibling."""
    trace = _trace(str(ONNX / "cases" / "deit.ortopt.onnx"))
    v = RunVerdict.of(trace)
    assert v.layer(1).done and not any("FusedResidualLN" in x for x in v.layer(1).done)
    assert explain(trace, 1).outcome("fuse_residual_ln.biased").status != "fused"
    for lv in v.layers:
        assert lv.sibling_rule != "fuse_residual_ln.biased"
    assert "where fuse_residual_ln.biased fused" not in v.render(verbose=True)
    rows = [r for r in decision_rows(trace) if r["kind"] == "fused" and r["rule"] == "fuse_residual_ln.biased"]
    assert [r["layer"] for r in rows] == [None]  # the app's decision table credits it as the verdict does


def test_explain_json_and_text_carry_the_outside_line(capsys):
    model = str(ONNX / "gpt2.onnx")
    code, out, _ = cli_run(capsys, "explain", model, "--json")
    d = json.loads(out)
    assert [x.split(" %")[0] for x in d["outside_layers"]] == ["FusedResidualLN"]
    _, text, _ = cli_run(capsys, "explain", model)
    item = d["outside_layers"][0]  # said in its place, the name of the app's box that holds it (newcomer run 18)
    assert d["outside_boxes"] == {item: "final norm"}
    assert f"{OUTSIDE_LAYERS}: final norm: {item}" in text.splitlines()


def test_post_ln_residual_norm_closes_its_own_layer_and_the_embeddings_norm_is_outside():
    """Post-LN without the whole-layer op: each residual norm in the layer whose sum it closes (its readers are the
    next layer's: by readers it would move one layer on); the embeddings' norm outside."""
    trace = _trace(str(ONNX / "ortopt" / "bert.ortopt.onnx"))
    v = RunVerdict.of(trace)
    inside = [lv.layer for lv in v.layers for x in lv.done if x.startswith("FusedResidualLN")]
    assert inside == [0, 0, 1, 1]
    assert [x.split(" %")[0] for x in v.outside] == ["FusedResidualLN"]  # the embeddings' norm
    emb = int(_ID.search(v.outside[0])[1])
    m = next(m for s in trace.steps for m in s.matches if m.fused == emb)
    assert "embeddings" in m.path


_PRE_LN_EDGE = """graph edge {
  %0 = input {name="x"} : f32[2, 8, 16]
  %1 = param {name="h.0.mlp.weight"} : f32[16, 16] @h.0.mlp
  %2 = matmul(%0, %1) : f32[2, 8, 16] @h.0.mlp
  %3 = add(%2, %0) : f32[2, 8, 16] @h.0
  %4 = param {name="h.1.ln_1.weight"} : f32[16] @h.1.ln_1
  %5 = param {name="h.1.ln_1.bias"} : f32[16] @h.1.ln_1
  %6 = layer_norm(%3, %4, %5) {eps=1e-05, axis=-1} : f32[2, 8, 16] @h.1.ln_1
  %7 = param {name="h.1.mlp.weight"} : f32[16, 16] @h.1.mlp
  %8 = matmul(%6, %7) : f32[2, 8, 16] @h.1.mlp
  %9 = gelu(%8) : f32[2, 8, 16] @h.1.mlp
  return %9
}"""


def test_a_norm_that_opens_the_next_layer_is_said_by_that_layer():
    """The residual sum closes layer 0 and the norm opens layer 1 (its reader): the op's path names no layer (`h`),
    the rule says layer 1, once."""
    trace = Pipeline(["fuse_residual_ln"]).run(parse_ir(_PRE_LN_EDGE))
    step = trace.steps[0]
    m = next(m for m in step.matches if m.fused is not None)
    assert m.layer is None  # `h`: the common path of `h.0` and `h.1.ln_1`
    assert match_layer(trace.input, step.before, step.after, m) == 1
    v = RunVerdict.of(trace)
    assert [lv.layer for lv in v.layers for x in lv.done if x.startswith("FusedResidualLN")] == [1]
    assert v.outside == []
