"""An activation written as primitives that no op computes (QuickGELU, Swish with a beta other than 1) is a gap in
rlxviz's ops, one verdict in every view: `canonicalize_exported.activation_op` refuses it (`not recognized`, remedy
`compiler only`, compiler fix: an op for it), so `explain`'s text and `--json` say "fused as far as rlxviz's ops go"
with exit 0, and the app's version chip marks it `△` with a Matches & rejections row of that group.

gpt-oss (newcomer finding): its experts' `gate * sigmoid(1.702 * gate)` on a clamped gate was an
`unrecognized.activation` finding with an empty kind, no standing and no compiler fix: `NOT fused`, exit 1, while
the chips and the table showed nothing and clip-vision's same form (a linear's epilogue) was a `△` gap.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.app.derived import version_rows
from rlxviz.app.explain import decision_rows
from rlxviz.app.panels import OP_GAP_MARK, counts_html
from rlxviz.ir import parse_ir
from rlxviz.passes import Pipeline
from rlxviz.passes.refusal_kinds import COMPILER_ONLY, NOT_RECOGNIZED
from rlxviz.passes.unrecognized import unrecognized
from rlxviz.passes.why.facts import RunFacts
from rlxviz.passes.why.standing import standing
from rlxviz.passes.why.verdict import EXIT_OK, OP_GAP_GROUP, RunVerdict

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
RULE, GUARD = "canonicalize_exported.activation_op", "activation_op"

FORMS = {  # the activation of %3 (a clamped value, as gpt-oss's gate), ending in %7: (lines, name)
    "quick_gelu": (["%4 = const {value=1.702} : f32[]", "%5 = mul(%3, %4) : T", "%6 = sigmoid(%5) : T",
                    "%7 = mul(%3, %6) : T"], "QuickGELU"),
    "quick_gelu_div": (["%4 = const {value=0.5875440658049353} : f32[]", "%5 = div(%3, %4) : T",
                        "%6 = sigmoid(%5) : T", "%7 = mul(%6, %3) : T"], "QuickGELU"),
    "swish_beta2": (["%4 = const {value=2.0} : f32[]", "%5 = mul(%4, %3) : T", "%6 = sigmoid(%5) : T",
                     "%7 = mul(%3, %6) : T"], "Swish (beta=2)"),
}


def expert(form: str) -> str:
    """A one-layer MLP whose activation `form` reads a clamped value (no linear's bias add: no epilogue refusal)."""
    lines, _ = FORMS[form]
    at = " @model.layers.0.mlp.experts"
    body = "".join(f"  {ln.replace(': T', ': f32[4, 32]')}{at}\n" for ln in lines)
    return (f"graph expert_{form} {{\n"
            f"  %0 = input {{name=\"x\"}} : f32[4, 16]\n"
            f"  %1 = param {{name=\"up.weight\"}} : f32[16, 32]{at}\n"
            f"  %2 = matmul(%0, %1) : f32[4, 32]{at}\n"
            f"  %8 = const {{value=7.0}} : f32[]{at}\n"
            f"  %3 = min(%2, %8) : f32[4, 32]{at}\n{body}"
            f"  %9 = param {{name=\"down.weight\"}} : f32[32, 16]{at}\n"
            f"  %10 = matmul(%7, %9) : f32[4, 16]{at}\n"
            f"  return %10\n}}")


@pytest.mark.parametrize("form", list(FORMS))
def test_an_activation_no_op_computes_is_a_gap_refusal_not_an_unrecognized_miss(form):
    name = FORMS[form][1]
    t = Pipeline.canonical().run(parse_ir(expert(form)))
    (r,) = [r for s in t.steps for r in s.rejections if r.rule == RULE]
    assert (r.guard, r.kind, r.remedy, r.anchor) == (GUARD, NOT_RECOGNIZED, COMPILER_ONLY, 7)
    assert name in r.message and r.fix.startswith(f"a {name} op (x * sigmoid(") and r.hint.startswith("nothing")
    assert unrecognized(t) == []  # the refusal names its nodes: no finding without a kind beside it
    assert standing(t, r)[0] == OP_GAP_GROUP
    v = RunVerdict.of(t)
    (lv,) = v.layers
    assert lv.fused and lv.gap_only and lv.first is None and not lv.misses
    assert lv.status == "fused as far as rlxviz's ops go"
    assert lv.op_gaps == [f"{name} op ({RULE}: {GUARD})"] and v.exit_status == EXIT_OK and v.ok


def test_the_chip_marks_it_a_gap_and_the_table_lists_it_so():
    t = Pipeline.canonical().run(parse_ir(expert("quick_gelu")))
    rows = version_rows(t, [(i, label) for i, (label, _) in enumerate(t.versions())])
    (row,) = [r for r in rows if r["version"] == "after canonicalize_exported"]
    assert row["op_gap_at"] == [7] and row["rejections"] == 0 and row["lacks"] == ["QuickGELU op"]
    assert f"{OP_GAP_MARK}1</span>" in counts_html([row], -1, lambda k: "")
    (d,) = [d for d in decision_rows(t) if d["rule"] == RULE]
    assert d["kind"] == OP_GAP_GROUP and d["guard"] == GUARD


def test_a_silu_or_a_linears_quick_gelu_is_not_this_refusal():
    """SiLU becomes `silu` (an op computes it); a linear's QuickGELU is the fused linear's `epilogue_activation` gap
    (clip-vision), not a second gap here."""
    silu = expert("quick_gelu").replace("{value=1.702}", "{value=1.0}").replace("mul(%3, %4)", "add(%3, %11)")
    silu = silu.replace("%5 = add(%3, %11)", "%5 = min(%3, %3)").replace("sigmoid(%5)", "sigmoid(%3)")
    t = Pipeline.canonical().run(parse_ir(silu))
    assert any(m.rule == "canonicalize_exported.silu" for s in t.steps for m in s.matches)
    assert not [r for s in t.steps for r in s.rejections if r.rule == RULE]
    linear = expert("quick_gelu").replace("%8 = const {value=7.0}", "%8 = param {name=\"up.bias\"}").replace(
        "%8 = param {name=\"up.bias\"} : f32[]", "%8 = param {name=\"up.bias\"} : f32[32]").replace("min(%2, %8)",
                                                                                                  "add(%2, %8)")
    t = Pipeline.canonical().run(parse_ir(linear))
    assert not [r for s in t.steps for r in s.rejections if r.rule == RULE]
    (r,) = [r for s in t.steps for r in s.rejections if r.guard == "epilogue_activation"]
    assert RunVerdict.of(t).layers[0].op_gaps == [
        "FusedMatMulBiasAct with a QuickGELU epilogue (fuse_matmul_bias_act.bias_act: epilogue_activation)"]


RESIDUAL = """graph mlp_quick_gelu_output_mm {
  %0 = input {name="x"} : f32[2, 4, 16]
  %1 = param {name="fc1.weight"} : f32[16, 32] @model.layers.0.mlp
  %2 = matmul(%0, %1) : f32[2, 4, 32] @model.layers.0.mlp
  %9 = param {name="fc1.bias"} : f32[32] @model.layers.0.mlp
  %10 = add(%2, %9) : f32[2, 4, 32] @model.layers.0.mlp
  %3 = const {value=1.702} : f32[] @model.layers.0.mlp
  %4 = mul(%3, %10) : f32[2, 4, 32] @model.layers.0.mlp
  %5 = sigmoid(%4) : f32[2, 4, 32] @model.layers.0.mlp
  %6 = mul(%5, %10) : f32[2, 4, 32] @model.layers.0.mlp
  %7 = param {name="fc2.weight"} : f32[32, 16] @model.layers.0.mlp
  %8 = matmul(%6, %7) : f32[2, 4, 16] @model.layers.0.mlp
  return %8, %2
}"""


def test_an_unrecognized_activation_no_op_computes_is_the_same_gap(capsys, tmp_path):
    """A linear's QuickGELU whose linear is refused before its epilogue is looked at (its matmul is a graph output):
    no rule names the form, so the unrecognized scan does, with the kind `not recognized`, remedy `compiler only`
    and the op's compiler fix; the verdict counts it as the same gap (exit 0), not as a miss without a kind."""
    t = Pipeline.canonical().run(parse_ir(RESIDUAL))
    (u,) = unrecognized(t)
    m = u.as_missed()
    assert (m.pattern, m.guard, m.kind, m.remedy) == ("unrecognized.activation", "no_rule", NOT_RECOGNIZED,
                                                      COMPILER_ONLY)
    assert m.fix.startswith("a QuickGELU op") and m in RunFacts.of(t).misses()
    (lv,) = RunVerdict.of(t).layers
    assert lv.fused and not lv.misses and lv.op_gaps == ["QuickGELU op (unrecognized.activation: no_rule)"]
    path = tmp_path / "g.ir"
    path.write_text(RESIDUAL)
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 0 and "gap in rlxviz's ops: unrecognized.activation (no_rule)" in out, out


def test_an_unrecognized_family_names_its_kind():
    """Every finding says its kind (`not recognized`: no rule takes the form); the guard's brackets were empty."""
    t = Pipeline.canonical().run(parse_ir(RESIDUAL))
    assert "no_rule [not recognized]: " in str(unrecognized(t)[0].as_missed())


def test_gpt_oss_experts_quick_gelu_is_a_gap_everywhere(capsys):
    path = ZOO / "gpt-oss.dynamo-eager.onnx"
    code, out, _ = cli_run(capsys, "explain", path)
    jcode, js, _ = cli_run(capsys, "explain", path, "--json")
    d = json.loads(js)
    assert code == jcode == 0 and d["ok"] and d["misses"] == [] and d["gap_layers"] == len(d["layers"]) == 2
    assert "QuickGELU op" in d["gap_forms"] and "unrecognized" not in out
    for layer in d["layers"]:
        assert layer["first"] is None and layer["misses"] == [] and layer["gap_only"]
        assert layer["status"].startswith("fused as far as rlxviz's ops")
        (g,) = [g for g in layer["gaps"] if g["rule"] == RULE]
        assert g["form"] == "QuickGELU op" and g["by"] == GUARD
        assert any(line.startswith(f"{RULE} ({GUARD})") for line in layer["gap_refusals"])
    assert "rlxviz's ops lack: QuickGELU op (canonicalize_exported.activation_op: activation_op)" in out
    assert f"{RULE}: {GUARD} (guard, not recognized; △ gap in rlxviz's ops)" in cli_run(
        capsys, "explain", path, "-v")[1]


EPILOGUE = "then FusedMatMulBiasAct takes it as an epilogue"
BARE_FC1 = """graph bare_fc1_quick_gelu {
  %0 = input {name="x"} : f32[4, 16]
  %1 = param {name="up.weight"} : f32[16, 32] @model.layers.0.mlp
  %2 = matmul(%0, %1) : f32[4, 32] @model.layers.0.mlp
  %3 = const {value=1.702} : f32[] @model.layers.0.mlp
  %4 = mul(%2, %3) : f32[4, 32] @model.layers.0.mlp
  %5 = sigmoid(%4) : f32[4, 32] @model.layers.0.mlp
  %6 = mul(%2, %5) : f32[4, 32] @model.layers.0.mlp
  %7 = param {name="down.weight"} : f32[32, 16] @model.layers.0.mlp
  %8 = matmul(%6, %7) : f32[4, 16] @model.layers.0.mlp
  return %8
}"""


def test_the_fix_names_the_epilogue_only_where_a_linear_feeds_the_activation():
    """gpt-oss (newcomer finding): QuickGELU on `clamp(slice(gate))` had the compiler fix "then FusedMatMulBiasAct takes
    it as an epilogue", but no linear's output feeds it, so no epilogue could take it: the fix names the op alone and
    the message says why no fused op takes it. A bias-less FC1's QuickGELU (`act(x @ w)`, `zero_bias_act`'s form)
    keeps the epilogue clause; a linear whose matmul is also a graph output (no fusion takes it) does not."""
    t = Pipeline.canonical().run(parse_ir(expert("quick_gelu")))
    (r,) = [r for s in t.steps for r in s.rejections if r.rule == RULE]
    assert r.fix == "a QuickGELU op (x * sigmoid(1.702 * x))", r.fix
    assert "its input, min (node 3, model.layers.0.mlp.experts), is no linear's output" in r.message
    assert "allow-list" not in r.message
    bare = BARE_FC1
    t = Pipeline.canonical().run(parse_ir(bare))
    (r,) = [r for s in t.steps for r in s.rejections if r.rule == RULE]
    assert r.fix.endswith(EPILOGUE + " once the allow-list has it") and "allow-list is gelu" in r.message
    (u,) = unrecognized(Pipeline.canonical().run(parse_ir(RESIDUAL)))
    assert u.fix == "a QuickGELU op (x * sigmoid(1.702 * x))", u.fix


def test_gpt_oss_names_the_product_and_no_epilogue(capsys):
    out = cli_run(capsys, "explain", ZOO / "gpt-oss.dynamo-eager.onnx", "-v")[1]
    assert "outer product" not in out and EPILOGUE not in out
    assert "ending at the product x * sigmoid(k x) (node 140, model.layers.0.mlp.experts)" in out
    assert "compiler fix: a QuickGELU op (x * sigmoid(1.702 * x))\n" in out
