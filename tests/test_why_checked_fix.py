"""Issue 39, advice 3: an advised fix is checked, and its result decides the words.

esm.qdyn's `default_scale` refusal advised "give FusedAttentionBlock a scale attribute" and called that the fix,
yet with the scale taken as passed the block still does not form (its Q/K/V are no narrows of one packed QKV). The
compiler fix is now checked too (`passes.whatif.without_guard`: the rule again with the refused guard passed), and
a model fix whose what-if does not fuse says what then refuses (`passes.whatif.still_refused`): the line names the
next failing guard, or stands as written when nothing else fails. The text, `--json` and the app's decision table
(the vetted trace the Why tab reads) say the same.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from rlxviz.app.explain import decision_rows
from rlxviz.cli import main
from rlxviz.ir import parse_ir
from rlxviz.passes import Pipeline
from rlxviz.session import load
from rlxviz.session.advice import NO_FUSION, checked_verdict, vetted

sys.path.insert(0, str(Path(__file__).parent))
from test_model_fixes import case_text  # noqa: E402

TESTS = Path(__file__).parent
ESM = TESTS / "fixtures" / "onnx" / "cases" / "esm.qdyn.onnx"
ESM_LIKE = next((TESTS / "data" / "cases").glob("esm-like-*.rlx"))
SCALE_FIX = "give FusedAttentionBlock a scale attribute"


def _explain(capsys, *args) -> tuple[str, dict]:
    main(["explain", *map(str, args)])
    text = capsys.readouterr().out
    main(["explain", *map(str, args), "--json"])
    return text, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("path", [ESM_LIKE], ids=["esm-like"])
def test_a_scale_attribute_alone_is_not_said_to_fuse_the_block(path, capsys):
    """esm-like scales Q by 0.5 before its RoPE, twice the default 1/sqrt(16): a refusal that counts. (ESM's own
    float export scales Q by the default there, a gap in rlxviz's ops whose compiler fix's caveat
    `test_pre_rope_scale` checks.)"""
    text, d = _explain(capsys, path)
    firsts = [lv["first"] for lv in d["layers"] if lv["first"] and lv["first"]["guard"] == "default_scale"]
    assert firsts, d["layers"]
    for f in firsts:
        assert f["compiler_fix"].startswith(f"{SCALE_FIX} (checked at this rule alone: that passes default_scale "
                                            "only; then qkv_packed "), f
        assert f"compiler fix: {f['compiler_fix']}" in text
        assert "(the compiler fix is the fix)" not in f["fix"] and "passes this guard only" in f["fix"], f["fix"]
    assert "the compiler fix is the fix" not in text


def test_without_guard_names_the_next_guard_on_esm():
    from rlxviz.passes.whatif import without_guard

    m = load(str(ESM))
    trace = Pipeline.canonical().run(m.graph)
    got = [without_guard(trace, k, r) for k, s in enumerate(trace.steps) for r in s.rejections
           if r.guard == "default_scale" and r.headline]
    assert got and all(g and g[0][0] == "qkv_packed" for g in got), got


ENOUGH = {  # variant: (its first guard, how its compiler fix starts)
    # h1 returned: a layer op that also returns h1 is all it needs (the engine's escape check of the same h1 is the
    # same value's)
    "output_intermediate": ("h1_not_output", "multi-output fusion: a layer op that also returns ln1 (role h1)"),
    # tanh-GELU: the allow-list; the separate activation node after FFN.1 is the same node's (fuse_matmul_bias_act
    # refused it for the same allow-list)
    "tanh_gelu": ("fc1_activation", "add gelu_tanh to the epilogue allow-list"),
}


@pytest.mark.parametrize("variant", ENOUGH)
def test_a_compiler_fix_that_is_enough_stands_as_written(variant, capsys):
    """Control: the compiler fix line has no "checked" note when nothing else stands in the way."""
    text, d = _explain(capsys, "bert-tiny", "--variant", variant, "--layer", "0")
    guard, fix = ENOUGH[variant]
    # the refusal's check (tanh-GELU's is a gap in rlxviz's ops, not the layer's first rejection: its check is kept)
    (f,) = [f for f in d["fix_checks"] if f["guard"] == guard]
    assert f["compiler_fix"].startswith(fix) and f["compiler_fix_enough"] is True, f
    assert "(checked" not in text


def _dead_reader_and_tanh() -> str:
    """n4-15 with its probe moved to h1 and not returned (a dead reader: DCE is the checked fix of h1_user_count),
    and a tanh-GELU FFN (fc1_activation: a second failing guard of the layer op)."""
    text = case_text("n4-15").replace("mul(%39, %39)", "mul(%42, %42)").replace("return %57, %44", "return %57")
    return text.replace("= gelu(%48)", "= gelu_tanh(%48)")


def test_a_model_fix_whose_fusion_still_fails_names_what_then_refuses(tmp_path, capsys):
    p = tmp_path / "dead_tanh.rlx"
    p.write_text(_dead_reader_and_tanh())
    text, d = _explain(capsys, p)
    (lv,) = d["layers"]
    f = lv["first"]
    assert f["guard"] == "h1_user_count"
    assert "does not make the fusion happen: then fc1_activation (not recognized) fails: " in f["fix"], f["fix"]
    # the reader is dead: the compiler-side remedy is dead-code elimination before the pass (not a multi-output op),
    # and its check says what then refuses
    assert f["compiler_fix"].startswith("dead_code_elimination before fuse_transformer_layer: mul (node 43, "), f
    assert "multi-output" not in f["compiler_fix"]
    assert ("(checked at this rule alone: that passes h1_user_count only; then fc1_activation (not recognized) "
            "fails") in f["compiler_fix"]
    assert f"fix: {f['fix']}" in text and f"compiler fix: {f['compiler_fix']}" in text
    # the app's decision table reads the vetted trace: the same fix and compiler fix on the refusal's row
    g = parse_ir(_dead_reader_and_tanh())
    rng = np.random.default_rng(0)
    feeds = {n.name: rng.standard_normal(n.shape).astype(n.dtype.numpy) if n.dtype.is_float
             else np.ones(n.shape, n.dtype.numpy) for n in g.inputs}
    weights = {n.name: (0.3 * rng.standard_normal(n.shape)).astype(n.dtype.numpy) for n in g.params}
    trace = Pipeline.canonical().run(g)
    _, fixes = checked_verdict(trace, "m", feeds, weights, verbose=True)
    (c,) = [x for x in fixes if x.guard == "h1_user_count"]
    assert c.status == NO_FUSION and c.compiler == f["compiler_fix"]
    rows = [r for r in decision_rows(vetted(trace, fixes)) if r["guard"] == "h1_user_count" and r["kind"] == "rejected"]
    assert rows and all((r["hint"], r["fix"]) == (f["fix"], f["compiler_fix"]) for r in rows), rows


def test_one_compiler_fix_for_two_refusals_stands_as_written(capsys):
    """Control (case n4-06, DeepNorm): both residuals are scaled; the one residual-scale fix of the layer op covers
    the second norm's refusal (the same compiler fix) and each norm's operand refusal (the same scaled value)."""
    text, d = _explain(capsys, next((TESTS / "data" / "cases").glob("n4-06-*.rlx")))
    (lv,) = d["layers"]
    (gap,) = lv["gaps"]  # a gap in rlxviz's ops: no change to the model keeps alpha's numbers
    assert gap["by"] == "ln1_residual_scaled" and gap["form"] == "residual scale (alpha) on FusedTransformerLayer"
    assert not gap["blocker"] and "alone it is not enough" not in text
    assert "(checked" not in text
