"""A refusal whose one fix is the compiler's is a gap in rlxviz's ops, by one rule (`policy.compiler_fix_only`).

A newcomer found `explain` saying "fix: none in the model" (GPT-2's tanh-GELU epilogue, n4-06's DeepNorm residual
scale) or "fix: nothing to change in the model" (n4-09's dequantize scale) beside exit status 1, "NOT fused", a `✗`
chip and `"nothing_to_change": false`, while the same kind of refusal declared per guard (`Guard.lacking`: Granite's
scale, a ViT's unmasked attention) read "fused as far as rlxviz's ops go", exit 0. One rule now decides for both: no
change to the model keeps the numbers and a compiler fix exists, so the refusal is counted `△`, named in "rlxviz's ops
lack: FORM" (the form its compiler fix names), and the run exits 0. A refusal whose model fix the rule proposes and its
check refutes still counts (`no checked fix in the model`), and a teaching variant that deviates from its siblings is
refused for its deviation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.ir import parse_ir
from rlxviz.models import VARIANTS, load_model
from rlxviz.passes import Pipeline
from rlxviz.passes.guard import COMPILER_ONLY, IN_MODEL, READ_BY_MODEL
from rlxviz.passes.why import policy
from rlxviz.passes.why.places import places
from rlxviz.passes.why.verdict import OP_GAP_GROUP, RunVerdict

TESTS = Path(__file__).parent
CASES = TESTS / "data" / "cases"
GPT2 = TESTS / "fixtures" / "onnx" / "gpt2.onnx"
NOTHING = "nothing in the model to change"
MODEL_SAYS_NONE = ("fix: none in the model", "fix: nothing to change in the model")


def _explain(capsys, *args) -> tuple[int, str, dict]:
    code, text, err = cli_run(capsys, "explain", *args)
    assert "Traceback" not in err, err
    jcode, out, err = cli_run(capsys, "explain", *args, "--json")
    assert jcode == code, err
    return code, text, json.loads(out)


def _agrees(code: int, text: str) -> None:
    """The words and the exit status agree: no fix line says the model has nothing to change beside exit 1."""
    if code == 1:
        assert not any(ln.strip().startswith(MODEL_SAYS_NONE) for ln in text.splitlines()), text


@pytest.mark.parametrize("args, form, status", [
    ((GPT2,), "FusedMatMulBiasAct with a gelu_tanh epilogue", "fused as far as rlxviz's ops go"),
    ((CASES / "n4-06-deepnorm-residual.rlx",), "residual scale (alpha) on FusedTransformerLayer",
     "fused as far as rlxviz's ops go"),
    ((CASES / "n4-09-dequant-scale-after-matmul.rlx",), "epilogue scale operand for FusedMatMulBiasAct",
     "fused as far as rlxviz's ops go"),
    (("bert-tiny", "--variant", "tanh_gelu", "--layer", 0), "FusedTransformerLayer with a gelu_tanh epilogue",
     "fused as far as rlxviz's ops go"),
], ids=["gpt2", "n4-06", "n4-09", "bert-tiny-tanh-gelu"])
def test_a_compiler_only_refusal_is_a_gap_in_every_form(capsys, args, form, status):
    code, text, d = _explain(capsys, *args)
    assert code == 0 and d["ok"], text
    assert d["gap_layers"] == len(d["layers"]) and d["fused_layers"] == 0 and form in d["gap_forms"], d["gap_forms"]
    assert f"fused as far as rlxviz's ops go (rlxviz lacks {', '.join(d['gap_forms'])}: " in text.splitlines()[
        next(i for i, ln in enumerate(text.splitlines()) if "layer(s) fused as expected" in ln)]
    for lv in d["layers"]:
        assert lv["status"] == status and lv["nothing_to_change"] and lv["gap_only"] and lv["first"] is None, lv
        assert any(g.startswith(form + " (") for g in lv["op_gaps"]), lv["op_gaps"]
    assert f"  rlxviz's ops lack: {form} (" in text and "NOT fused" not in text
    _agrees(code, text)


@pytest.mark.parametrize("name, rule", [("n4-06-deepnorm-residual", "fuse_transformer_layer"),
                                        ("n4-09-dequant-scale-after-matmul", "fuse_matmul_bias_act")])
def test_the_app_chip_marks_the_place_a_gap_not_a_near_miss(name, rule):
    """The version chip (`places`, what `step_places` gives the app) reads the same rule: `△`, not `✗`."""
    trace = Pipeline.canonical().run(parse_ir((CASES / f"{name}.rlx").read_text()))
    k = next(i for i, s in enumerate(trace.steps) if s.pass_name == rule)
    p = places(trace, k)
    assert not p.near_misses and p.excused.get(OP_GAP_GROUP) and p.lacks, p


def test_the_generated_ir_of_the_variant_reads_the_same(capsys, tmp_path):
    """`rlxviz ir bert-tiny --variant tanh_gelu`, explained as IR text: the gap, not a near-miss."""
    code, ir, err = cli_run(capsys, "ir", "bert-tiny", "--variant", "tanh_gelu", "--seq", 8)
    assert code == 0, err
    path = tmp_path / "bert-tiny-tanh.rlx"
    path.write_text(ir)
    code, text, d = _explain(capsys, path)
    assert code == 0 and d["gap_layers"] == 1 and d["fused_layers"] == 1, text
    assert "FusedTransformerLayer with a gelu_tanh epilogue" in d["gap_forms"]


def test_a_graph_with_no_layer_says_its_gap_in_the_headline(capsys):
    code, text, d = _explain(capsys, CASES / "07-gqa-fused-qkv.rlx")
    assert code == 0 and not d["layers"]
    head = text.splitlines()[0]
    assert head.endswith("final graph: no fused ops; held back by rlxviz's ops (rlxviz lacks FusedAttentionBlock "
                         f"without a mask operand: a compiler fix, {NOTHING})"), head
    assert d["headline"] == head and d["gap_forms"] == ["FusedAttentionBlock without a mask operand"]
    assert "  rlxviz's ops lack: FusedAttentionBlock without a mask operand (" in text


def test_a_refuted_model_fix_still_counts_and_says_so(capsys):
    """esm-like: the rule proposes a change to the model (the block's default scale) that no what-if applies; the
    check refutes that change, not every change, so the refusal counts (exit 1) and its line never says "none"."""
    code, text, d = _explain(capsys, CASES / "esm-like-q-scaled-before-rope.rlx")
    assert code == 1 and d["layers"][0]["first"]["guard"] == "default_scale"
    assert d["layers"][0]["first"]["remedy"] == IN_MODEL
    assert "fix: no checked fix in the model: " in text
    _agrees(code, text)


def test_a_dead_reader_stays_a_near_miss(capsys, tmp_path):
    """A change to the model that keeps its numbers (a dead probe removed by dead-code elimination) is a real
    near-miss: the rule does not touch it."""
    from test_model_fixes import probed

    path = tmp_path / "dead.rlx"
    path.write_text(probed(on="h1", returned=False))
    code, text, d = _explain(capsys, path)
    assert code == 1 and d["gap_layers"] == 0 and "NOT fused" in text
    assert d["layers"][0]["first"]["remedy"] == IN_MODEL


def test_a_deviating_layer_is_refused_for_its_deviation():
    """bert-tiny's pre_ln variant: the pre-LN layer among post-LN siblings is refused by `post_ln_order`, whose fix is
    the compiler's too (a pre-LN layer op), but a layer judged as its siblings' kind is refused for its deviation."""
    m = load_model("bert-tiny", seq=8, variant=VARIANTS["pre_ln"])
    lv = RunVerdict.of(Pipeline.canonical().run(m.graph)).layer(0)
    assert not lv.fused and lv.first is not None and lv.first.guard == "post_ln_order" and not lv.gaps


class _Refusal:
    def __init__(self, remedy: str, hint: str, fix: str) -> None:
        self.remedy, self.hint, self.fix = remedy, hint, fix


@pytest.mark.parametrize("remedy, hint, fix, gap", [
    (COMPILER_ONLY, "none in the model: alpha scales it", "a residual scale (alpha) on X: h1 = ...", True),
    (IN_MODEL, "nothing to change in the model: the scale is the weight's", "an epilogue scale operand for Y", True),
    (IN_MODEL, "remove the dead reader", "a fused op that also returns h1", False),  # a change that keeps numbers
    (COMPILER_ONLY, "none in the model: not a bias", "none: the op adds a bias vector", False),  # no compiler fix
    (COMPILER_ONLY, "none in the model: no rule", "", False),
    (READ_BY_MODEL, "none in the model: a later layer reads it", "an op that also returns it", False),  # illegal here
])
def test_the_rule(remedy, hint, fix, gap):
    assert policy.compiler_fix_only(_Refusal(remedy, hint, fix)) is gap


@pytest.mark.parametrize("fix, product, form", [
    ("a residual scale (alpha) on FusedTransformerLayer: h1 = LN(attn + alpha * hidden)", "",
     "residual scale (alpha) on FusedTransformerLayer"),
    ("an epilogue scale operand for FusedMatMulBiasAct (act(x @ w * s + bias), exact), or fold the scale", "",
     "epilogue scale operand for FusedMatMulBiasAct"),
    ("add gelu_tanh to the epilogue allow-list (the MLX lowering already computes it)", "FusedMatMulBiasAct",
     "FusedMatMulBiasAct with a gelu_tanh epilogue"),
    ("give FusedAttentionBlock a scale attribute (checked at this rule alone: ...)", "",
     "FusedAttentionBlock with a scale attribute"),
])
def test_the_form_comes_from_the_compiler_fix(fix, product, form):
    assert policy.fix_gap_form(fix, product) == form
