"""A linear whose bias ONNX Runtime's optimizer moved after the residual add is named, not left bare in silence (a
newcomer run on deit.ortopt: every layer's o_proj and fc2 stayed plain MatMuls, every `fuse_matmul_bias_act.*` rule
"not applicable", yet the layer read "fused as far as rlxviz's ops go" with only the FusedAttentionBlock gap named).

The optimizer writes `(x @ w + skip) + bias`: the bias is SkipLayerNormalization's bias input, added after the
residual as its kernel does. FusedMatMulBiasAct takes no residual, and adding the bias first rounds differently, so no
change to the model keeps its numbers: the rule `fuse_matmul_bias_act.bias_after_residual` names the place (guard
`bias_after_residual`, not recognized, compiler fix only), which the project's standing rules count as a gap in
rlxviz's ops (`why.standing`), in the text, `--json`, the app's Why tab and the chips alike. Where one norm reads the
biased sum (post-LN BERT, a final norm) FusedResidualLN takes the bias (`fuse_residual_ln.biased`), and the rule is
quiet: there FusedTransformerLayer's `ln1_no_bias`/`fc2_bias_after_residual` name the order and the gap
(`test_post_ln_residual_bias`)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from clirun import run as cli_run
from inapp import uploaded

from rlxviz.ir import Op
from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.passes.report import taken_later
from rlxviz.passes.why.policy import TAKEN_LATER_GROUP
from rlxviz.passes.why.standing import standing
from rlxviz.passes.why.verdict import OP_GAP_GROUP, RunVerdict

ONNX = Path(__file__).parent / "fixtures" / "onnx"
RULE, GUARD = "fuse_matmul_bias_act.bias_after_residual", "bias_after_residual"
FORM = "FusedMatMulBiasAct with a residual operand added before its bias"
PRE_LN = [ONNX / "cases" / "deit.ortopt.onnx", ONNX / "ortopt" / "gpt2.ortopt.onnx",
          ONNX / "ortopt" / "clip-text.ortopt.onnx"]
POST_LN = [ONNX / "ortopt" / "bert.ortopt.onnx", ONNX / "ortopt" / "distilbert.ortopt.onnx"]


@functools.cache
def _trace(path: Path):
    """The canonical run of the file at batch 2 and seq 8, made once per test process (its tests only read it)."""
    return Pipeline.canonical().run(load_onnx(str(path), batch=2, seq=8).graph)


def _refusals(trace):
    return [r for r in trace.rejections if r.rule == RULE]


@pytest.mark.parametrize("path", PRE_LN, ids=lambda p: p.stem)
def test_each_pre_ln_layer_names_its_bare_linears_as_a_gap_in_rlxvizs_ops(path):
    trace = _trace(path)
    refused = _refusals(trace)
    assert refused, "no linear named"
    k = next(k for k, s in enumerate(trace.steps) if s.pass_name == "fuse_matmul_bias_act")
    for r in refused:  # a compiler fix, not a near-miss; clip-text's o_proj, taken by FusedAttentionBlock: neither
        group = TAKEN_LATER_GROUP if taken_later(trace, k, r) else OP_GAP_GROUP
        assert r.guard == GUARD and standing(trace, r)[0] == group
        if path.stem == "deit.ortopt":  # its o_proj and fc2 are left bare (clip-text's block takes its o_proj)
            assert trace.final[r.bindings["mm"]].op == Op.MATMUL
        assert "SkipLayerNormalization" in r.message and "takes no residual" in r.message
        assert r.fix.startswith("a FusedMatMulBiasAct with a residual operand") and r.hint.startswith("nothing to")
    v = RunVerdict.of(trace)
    assert FORM in v.headline
    bare = [r for r in refused if not taken_later(trace, k, r)]  # clip-text's o_proj: FusedAttentionBlock takes it
    for lv in v.layers:
        if any(r.layer == lv.layer for r in bare):  # in its matmul's layer (`trace.REFUSAL_LAYER_RULE`)
            assert lv.status.startswith("fused as far as") and FORM in lv.gap_forms, lv.status
            assert f"{FORM} ({RULE}: {GUARD})" in lv.op_gaps


@pytest.mark.parametrize("path", POST_LN, ids=lambda p: p.stem)
def test_a_norm_that_takes_the_bias_is_no_such_place(path):
    """Post-LN: FusedResidualLN(has_bias) takes the residual and the bias, so the rule says nothing."""
    trace = _trace(path)
    assert not _refusals(trace)
    assert any(n.op == Op.FUSED_RESIDUAL_LN and n.attrs.get("has_bias") for n in trace.final)


def test_text_json_and_the_why_tab_say_the_same(capsys, monkeypatch):
    path = PRE_LN[0]
    code, text, _ = cli_run(capsys, "explain", path)
    jcode, out, _ = cli_run(capsys, "explain", path, "--json")
    j = json.loads(out)
    assert code == jcode == 0 and j["ok"] and FORM in j["gap_forms"] and j["headline"] in text
    _, verbose, _ = cli_run(capsys, "explain", path, "-v")
    s = uploaded(monkeypatch, path)  # the upload in this process
    for d in j["layers"]:
        gap = f"{FORM} ({RULE}: {GUARD})"
        assert gap in d["op_gaps"] and f"  rlxviz's ops lack: {gap}" in text
        assert any(x.startswith(f"{RULE} ({GUARD}) ") for x in d["gap_refusals"])  # a gap's own list (issue 39)
        assert f"rlxviz's ops lack: {gap}" in s.why_layer(d["layer"]).replace("\\", "")
    # its per-rule line says its standing (a gap in rlxviz's ops, the chips' △), not a near-miss's bare words
    assert f"[rejected] {RULE}: {GUARD} (guard, not recognized; △ gap in rlxviz's ops)" in verbose
    assert "compiler fix: a FusedMatMulBiasAct with a residual operand added before its bias" in verbose


def test_a_place_whose_linear_a_later_pass_fuses_is_no_standing_gap(capsys):
    """clip-text.ortopt has two such places whose bias add is named after layer 1's norm; at %98 the linear is the
    attention's output projection, which FusedAttentionBlock takes after all (`Rule.taken_later`,
    `report.taken_later`): explain, --json and the layer's gap name only %64, whose fc2 stays a bare matmul: layer 0's
    (`trace.REFUSAL_LAYER_RULE`: its matmul's layer). A place whose linear stays bare (deit's) still counts."""
    from rlxviz.passes.report import missed_fusions

    trace = _trace(ONNX / "ortopt" / "clip-text.ortopt.onnx")
    k = next(k for k, s in enumerate(trace.steps) if s.pass_name == "fuse_matmul_bias_act")
    at = {r.anchor: r for r in trace.steps[k].rejections if r.rule == RULE}
    assert any(n.op == Op.FUSED_ATTENTION_BLOCK and at[98].bindings["mm"] in n.absorbed for n in trace.final)
    assert taken_later(trace, k, at[98]) and not taken_later(trace, k, at[64])
    assert {m.node for m in missed_fusions(trace) if m.pattern == RULE} == {64}
    code, text, _ = cli_run(capsys, "explain", ONNX / "ortopt" / "clip-text.ortopt.onnx")
    jcode, out, _ = cli_run(capsys, "explain", ONNX / "ortopt" / "clip-text.ortopt.onnx", "--json")
    assert code == jcode == 0
    line = next(x for x in text.splitlines() if x.startswith(f"  {OP_GAP_GROUP}: {RULE} ({GUARD})"))
    assert f"{RULE} ({GUARD}) @ %64 (" in line and "%98" not in line, line
    # filed in layer 0, its fc2's, though the optimizer named its bias add after layer 1's norm
    (gap,) = [g for g in json.loads(out)["layers"][0]["gaps"] if g["rule"] == RULE]
    assert gap["at"] == [64]
    deit = _trace(PRE_LN[0])
    assert len([m for m in missed_fusions(deit) if m.pattern == RULE]) == len(_refusals(deit)) == 3
