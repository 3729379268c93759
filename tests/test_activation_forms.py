"""Activations exporters write as primitives (issue 21): QuickGELU `x * sigmoid(1.702 x)` (CLIP), Swish with
another beta, squared ReLU. Each is recognized by name (`passes.activations`), so a layer with one has an MLP
(never "attention only (no MLP)"), and the fused linear that leaves it outside says so; nothing is rewritten, so
every version keeps the unfused numbers."""

import re

import pytest
from clirun import run as cli_run
from test_unwritten_forms import equal_numbers, ops

from rlxviz.ir import Graph, parse_ir
from rlxviz.ir.printer import format_graph
from rlxviz.models.bert import BertConfig, Variant, build_bert
from rlxviz.passes import Pipeline, missed_fusions
from rlxviz.passes.activations import activation_form
from rlxviz.passes.architecture import classify_layer
from rlxviz.passes.unrecognized import unrecognized

TINY = BertConfig(vocab_size=50, hidden=32, heads=2, intermediate=64, layers=1, max_position=16)

FORMS = {  # the activation of FC1's output %x, as node lines (ids from %200), ending in %out
    "quick_gelu": ["%200 = const {value=1.702} : f32[]", "%201 = mul({x}, %200) : T", "%202 = sigmoid(%201) : T",
                   "{out} = mul({x}, %202) : T"],
    "quick_gelu_swapped": ["%200 = const {value=1.702} : f32[]", "%201 = mul(%200, {x}) : T",
                           "%202 = sigmoid(%201) : T", "{out} = mul(%202, {x}) : T"],
    "quick_gelu_div": ["%200 = const {value=0.5875440658049353} : f32[]", "%201 = div({x}, %200) : T",
                       "%202 = sigmoid(%201) : T", "{out} = mul({x}, %202) : T"],
    "swish_beta2": ["%200 = const {value=2.0} : f32[]", "%201 = mul({x}, %200) : T", "%202 = sigmoid(%201) : T",
                    "{out} = mul({x}, %202) : T"],
    "squared_relu": ["%201 = relu({x}) : T", "{out} = mul(%201, %201) : T"],
    "squared_relu_pow": ["%200 = const {value=2.0} : f32[]", "%201 = relu({x}) : T", "{out} = pow(%201, %200) : T"],
}
NAMES = {"quick_gelu": "QuickGELU", "quick_gelu_swapped": "QuickGELU", "quick_gelu_div": "QuickGELU",
         "swish_beta2": "Swish (beta=2)", "squared_relu": "squared ReLU", "squared_relu_pow": "squared ReLU"}


def clip_like(form: str, pre_ln: bool = True) -> str:
    """A one-layer Hugging Face-style encoder (pre-LN as CLIP, or post-LN) whose FFN activation is `form`."""
    g = build_bert(TINY, batch=2, seq=8, style="hf", variant=Variant(pre_ln=True) if pre_ln else None)
    src = format_graph(g)
    m = re.search(r"  (%\d+) = gelu\((%\d+)\) : (.*?) (@\S+)\n", src)
    assert m is not None
    out, x, ty, at = m.groups()
    filled = [ln.replace("{x}", x).replace("{out}", out).replace(": T", ": " + ty) for ln in FORMS[form]]
    lines = "".join(f"  {ln} {at}\n" for ln in filled)
    return src.replace(m.group(0), lines)


@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_is_named_exactly(form):
    g = parse_ir(clip_like(form))
    found = [f for n in g if (f := activation_form(g, n)) is not None]
    assert [f.name for f in found] == [NAMES[form]]
    assert g[found[0].x].op.value == "add"  # FC1's bias add is the activation's input


def test_a_gate_or_a_vector_beta_is_not_the_family():
    src = """graph gate {
  %0 = input {name="x"} : f32[2, 8]
  %1 = input {name="y"} : f32[2, 8]
  %2 = const {value=1.702} : f32[]
  %3 = mul(%1, %2) : f32[2, 8]
  %4 = sigmoid(%3) : f32[2, 8]
  %5 = mul(%0, %4) : f32[2, 8]
  %6 = param {name="beta"} : f32[8]
  %7 = mul(%0, %6) : f32[2, 8]
  %8 = sigmoid(%7) : f32[2, 8]
  %9 = mul(%0, %8) : f32[2, 8]
  %10 = relu(%0) : f32[2, 8]
  %11 = relu(%0) : f32[2, 8]
  %12 = mul(%10, %11) : f32[2, 8]
  return %5, %9, %12
}"""
    g = parse_ir(src)
    assert all(activation_form(g, n) is None for n in g)  # a gate, a per-channel beta, two different relus


# squared ReLU is no longer left outside: `canonicalize_exported.relu2` makes it the epilogue activation relu2
# (issue 37; tests/test_epilogue_forms.py)
@pytest.mark.parametrize("form", ["quick_gelu", "quick_gelu_swapped", "swish_beta2"])
def test_a_clip_layer_has_an_mlp_and_names_what_fc1_leaves_outside(capsys, tmp_path, form):
    path = tmp_path / "clip.ir"
    path.write_text(clip_like(form))
    g = parse_ir(path.read_text())
    arch = classify_layer(g, 0)
    assert arch.kind == "pre_ln" and "no MLP" not in arch.description and NAMES[form] in arch.description
    t = equal_numbers(g)
    (r,) = [r for r in t.rejections if r.guard == "epilogue_activation"]
    assert NAMES[form] in r.message and "stays outside" in r.message and "allow-list" in r.message
    assert ops(t.final).get("FusedMatMulBiasAct") == 2  # FC1 (without its activation) and FC2; QKV in the block
    code, out, _ = cli_run(capsys, "explain", path)
    # the model's activation is its own (no change keeps its numbers): a gap in rlxviz's ops, named, exit 0
    assert code == 0 and "attention only" not in out and "epilogue_activation" in out and NAMES[form] in out
    lacks = ("a {} epilogue" if " " not in NAMES[form] else "an epilogue for {}").format(NAMES[form])
    assert f"rlxviz's ops lack: FusedMatMulBiasAct with {lacks}" in out, out  # an op form, not "op for ..."


def test_a_post_ln_layer_names_quick_gelu_in_fc1_activation(capsys, tmp_path):
    path = tmp_path / "clip_post.ir"
    path.write_text(clip_like("quick_gelu", pre_ln=False))
    g = parse_ir(path.read_text())
    assert classify_layer(g, 0).kind == "post_ln"
    t = equal_numbers(g)
    (m,) = [m for m in missed_fusions(t) if m.guard == "fc1_activation"]
    assert "QuickGELU x * sigmoid(1.702 * x)" in m.reason
    assert "QuickGELU" in m.fix and "gelu_tanh" not in m.fix
    code, out, _ = cli_run(capsys, "explain", path, "-v")
    assert code == 0 and "compiler fix: add QuickGELU to the epilogue allow-list, with an op for it" in out  # a gap
    assert "rlxviz's ops lack: FusedTransformerLayer with a QuickGELU epilogue" in out  # an op form, not "op for"


BIASLESS = """graph mlp_quick_gelu {
  %0 = input {name="x"} : f32[2, 4, 16]
  %1 = param {name="fc1.weight"} : f32[16, 32] @model.layers.0.mlp
  %2 = matmul(%0, %1) : f32[2, 4, 32] @model.layers.0.mlp
  %3 = const {value=1.702} : f32[] @model.layers.0.mlp
  %4 = mul(%3, %2) : f32[2, 4, 32] @model.layers.0.mlp
  %5 = sigmoid(%4) : f32[2, 4, 32] @model.layers.0.mlp
  %6 = mul(%5, %2) : f32[2, 4, 32] @model.layers.0.mlp
  %7 = param {name="fc2.weight"} : f32[32, 16] @model.layers.0.mlp
  %8 = matmul(%6, %7) : f32[2, 4, 16] @model.layers.0.mlp
  return %8
}"""


def test_a_bias_less_fc1s_quick_gelu_is_a_gap_in_rlxvizs_ops_not_a_gate(capsys, tmp_path):
    """A bias-less FC1: no fusion rule anchors on the matmul + QuickGELU; `canonicalize_exported.activation_op` names
    it as an activation no op computes (the scan once read `sigmoid` gating a matmul as a GLU, then called it an
    `unrecognized.activation` miss without a kind, exit 1): a gap in rlxviz's ops, exit 0
    (tests/test_activation_op_gap.py)."""
    g: Graph = parse_ir(BIASLESS)
    t = equal_numbers(g)
    assert unrecognized(t) == []
    (r,) = [r for s in t.steps for r in s.rejections if r.rule == "canonicalize_exported.activation_op"]
    assert "QuickGELU" in r.message
    path = tmp_path / "g.ir"
    path.write_text(BIASLESS)
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 0 and "rlxviz's ops lack: QuickGELU op" in out and "glu" not in out.lower().replace("gelu", "")


def test_the_canonical_pipeline_never_rewrites_the_forms():
    """Named, not rewritten: the activation's nodes survive every pass up to region marking."""
    g = parse_ir(clip_like("quick_gelu"))
    t = Pipeline.canonical().run(g)
    before = next(s.before for s in t.steps if s.pass_name == "mark_elementwise_regions")
    assert sum(1 for n in before if n.op.value == "sigmoid") == 1
