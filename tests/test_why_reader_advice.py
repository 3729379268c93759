"""Issue 39, advice 1: a fusion refused because a value has another reader, or is a graph output, never advises
dead-code elimination unless the reader is dead.

DCE cannot remove what the model returns: where the value (a LayerNorm's input, a matmul's result, h1) is a graph
output, or its extra reader is read on to one, the fix line says so (a fusion would have to keep the value
materialised; changing it changes the model's outputs) and no line of the text, `--json` or the app's Why tab names
dead_code_elimination. Where the extra reader is dead, DCE is the right advice, and it is a checked fix. Variants are
made from case n4-15 (a post-LN layer with a probe) by moving the probe or the returned value.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from rlxviz.cli import main
from rlxviz.ir import parse_ir
from rlxviz.passes import Pipeline
from rlxviz.passes.guard import NO_MODEL_FIX, READ_BY_MODEL
from rlxviz.session import check_fusion
from rlxviz.session.advice import CHECKED, check_fixes

sys.path.insert(0, str(Path(__file__).parent))
from test_model_fixes import case_text  # noqa: E402

PROBE = ("  %43 = mul(%39, %39) : f32[2, 8, 64] @encoder.layer.0\n"
         "  %44 = reduce_mean(%43) {axes=[2], keepdims=false} : f32[2, 8] @encoder.layer.0\n")


def variant(returned: str | None = None, reader_of: str | None = None, reader_returned: bool = False) -> str:
    """n4-15 without its probe; `returned`: a node id also returned as output #1 (`%39` the first LayerNorm's input,
    `%42` h1, `%46` FFN.1's matmul); `reader_of`: an extra reader `mul(X, X)` of that node, returned as output #1 when
    `reader_returned`, else dead."""
    text = case_text("n4-15")
    assert PROBE in text and "  return %57, %44" in text
    text = text.replace(PROBE, "")
    outs = "%57"
    if reader_of is not None:
        text = text.replace("  return %57, %44", f"  %43 = mul({reader_of}, {reader_of}) : f32[2, 8, 64] "
                                                 f"@encoder.layer.0\n  return %57, %44")
        if reader_returned:
            outs += ", %43"
    if returned is not None:
        outs += f", {returned}"
    return text.replace("return %57, %44", f"return {outs}")


def explain_all(tmp_path: Path, capsys, text: str) -> tuple[str, str, dict]:
    """(`explain -v` text, `explain` text, `explain --json`) of IR `text`."""
    p = tmp_path / "m.rlx"
    p.write_text(text)
    main(["explain", str(p), "-v"])
    verbose = capsys.readouterr().out
    main(["explain", str(p)])
    plain = capsys.readouterr().out
    main(["explain", str(p), "--json"])
    return verbose, plain, json.loads(capsys.readouterr().out)


def _hints(d: dict, key: str = "fix") -> list[str]:
    """Every fix line (`key="compiler_fix"`: compiler fix) of `explain --json`: each layer's first, illegal-here and
    counted refusals'."""
    out = []
    for lv in d["layers"]:
        for o in [lv["first"], *lv["illegal"], *lv["rejections"]]:
            if o:
                out.append(o[key])
    return out


LIVE = {
    "ln_input_returned": dict(returned="%39"),
    "h1_returned": dict(returned="%42"),
    "matmul_returned": dict(returned="%46"),
    "h1_reader_returned": dict(reader_of="%42", reader_returned=True),
    "ln_input_reader_returned": dict(reader_of="%39", reader_returned=True),
}


@pytest.mark.parametrize("name", LIVE)
def test_a_model_output_is_never_advised_dead_code_elimination(tmp_path, capsys, name):
    verbose, plain, d = explain_all(tmp_path, capsys, variant(**LIVE[name]))
    said = [ln for ln in (verbose + plain).splitlines() if "after dead_code_elimination" not in ln]  # a version
    for text in (*said, *_hints(d), *_hints(d, "compiler_fix"), *(m for lv in d["layers"] for m in lv["misses"])):
        assert "dead_code_elimination" not in text, (name, text)
    hints = [o["fix"] for lv in d["layers"] for o in [lv["first"], *lv["illegal"], *lv["rejections"]]
             if o and o["kind"] == "illegal"]
    assert hints, d
    for h in hints:  # every illegal refusal's fix: the value is (or is read on to) a model output a fusion must keep
        assert h.startswith(NO_MODEL_FIX) and "graph output #" in h and "materialised" in h, h
    assert "materialised" in plain


def test_bert_tiny_returned_probe_of_h1_is_no_dce(capsys):
    """The issue's own case: bert-tiny's `extra_h1_user` variant, h1 read by a probe the model returns."""
    main(["explain", "bert-tiny", "--variant", "extra_h1_user", "--layer", "0"])
    out = capsys.readouterr().out
    assert "h1_user_count" in out and "dead_code_elimination" not in out
    assert "graph output #1, reads ln1 (role h1)" in out and "keep ln1 (role h1) materialised" in out


DEAD = {"h1_dead_reader": ("%42", "h1_user_count"), "ln_input_dead_reader": ("%39", "residual_sum_single_user")}


def _feeds_weights(g, seed: int = 0):
    rng = np.random.default_rng(seed)
    feeds = {n.name: (rng.standard_normal(n.shape).astype(n.dtype.numpy) if n.dtype.is_float
                      else np.ones(n.shape, n.dtype.numpy)) for n in g.inputs}
    weights = {n.name: (0.3 * rng.standard_normal(n.shape)).astype(n.dtype.numpy) for n in g.params}
    return feeds, weights


@pytest.mark.parametrize("name", DEAD)
def test_a_dead_reader_is_advised_dead_code_elimination_and_it_is_checked(tmp_path, capsys, name):
    on, guard = DEAD[name]
    text = variant(reader_of=on)
    _, plain, d = explain_all(tmp_path, capsys, text)
    (lv,) = d["layers"]
    assert lv["first"]["guard"] == guard
    hint = lv["first"]["fix"]
    assert "mul (node 43" in hint and "reaches no graph output" in hint and "dead_code_elimination" in hint, hint
    assert f"fix: {hint}" in plain
    # the compiler-side remedy of a dead reader: dead-code elimination before the refusing pass, no multi-output op
    cfix = lv["first"]["compiler_fix"]
    assert cfix.startswith("dead_code_elimination before fuse_transformer_layer: mul (node 43") and \
        "multi-output" not in cfix, cfix
    assert f"compiler fix: {cfix}" in plain
    g = parse_ir(text)
    feeds, weights = _feeds_weights(g)
    trace = Pipeline.canonical().run(g)
    fixes = check_fixes(trace, check_fusion(trace, "m"), feeds, weights)
    first = next(f for f in fixes if f.guard == guard)
    assert first.status == CHECKED and first.printed == hint, first


def test_reader_advice_is_one_rule_for_the_guard_factories_and_the_layer_guard():
    """`single_user` (the residual norm's) and the layer's residual-sum guard word a returned
    reader the same way (`guard.reader_advice`): remedy `read by the model`, no DCE."""
    g = parse_ir(variant(reader_of="%39", reader_returned=True))
    trace = Pipeline.canonical().run(g)
    readers = [r for r in trace.rejections if r.guard in ("sum_single_user", "residual_sum_single_user")]
    assert {r.guard for r in readers} == {"sum_single_user", "residual_sum_single_user"}
    for r in readers:
        assert r.remedy == READ_BY_MODEL and "dead_code_elimination" not in r.hint + r.fix, r
        assert "materialised" in r.hint


@pytest.mark.parametrize(("on", "shape", "pass_name", "guard"), [
    ("%42", "64", "fuse_transformer_layer", "h1_user_count"),
    ("%39", "64", "fuse_transformer_layer", "residual_sum_single_user"),
    ("%46", "256", "fuse_matmul_bias_act", "mm_single_user")])
def test_a_dead_readers_compiler_fix_is_dce_before_the_refusing_pass(on, shape, pass_name, guard):
    """Every reader guard words the compiler fix of a refusal whose extra readers are all dead as dead-code
    elimination before its own pass (the canonical pipeline runs it only after the fusions), never as a multi-output
    op; the same reader, returned by the model, keeps the multi-output fix."""
    for returned in (False, True):
        text = variant(reader_of=on, reader_returned=returned).replace(
            f"%43 = mul({on}, {on}) : f32[2, 8, 64]", f"%43 = mul({on}, {on}) : f32[2, 8, {shape}]")
        trace = Pipeline.canonical().run(parse_ir(text))
        (r,) = [r for r in trace.rejections if r.guard == guard and r.pass_name == pass_name]
        if returned:
            assert "dead_code_elimination" not in r.fix and "returns" in r.fix, r.fix
        else:
            assert r.fix == (f"dead_code_elimination before {pass_name}: mul (node 43, encoder.layer.0) reaches no "
                             "graph output (dead code), so removing it first keeps every output and leaves the fusion "
                             "nothing to drop"), r.fix


def test_a_dead_readers_refusal_is_not_worded_plain_illegal(capsys):
    """Start strip ②'s refusal (`dead_h1_user`: h1's extra reader reaches no output) is `illegal` only as the graph
    stands: the text words its kind so (`refusal_kinds.kind_words`), the app's Why tab too, and `--json` keeps the
    kind `illegal`; a live reader (`extra_h1_user`, a probe the model returns) keeps plain `illegal`."""
    from rlxviz.app.explain import _why_markdown
    from rlxviz.passes.refusal_kinds import DEAD_READER_KIND, DEAD_READERS_KIND, ILLEGAL, kind_words

    main(["explain", "bert-tiny", "--variant", "dead_h1_user", "--layer", "0", "-v"])
    dead = capsys.readouterr().out
    assert f"guard h1_user_count (guard, {DEAD_READER_KIND}):" in dead, dead
    # the per-rule line ends its parentheses with the refusal's standing (a near-miss here)
    assert "h1_user_count (guard, illegal)" not in dead and "h1_user_count (guard, illegal;" not in dead and \
        f"h1_user_count (guard, {DEAD_READER_KIND}; ✗ near-miss)" in \
        dead.split("[rejected] fuse_transformer_layer.bert_post_ln: ", 1)[1], dead
    main(["explain", "bert-tiny", "--variant", "dead_h1_user", "--layer", "0", "--json"])
    (lv,) = json.loads(capsys.readouterr().out)["layers"]
    assert lv["first"]["kind"] == ILLEGAL, lv["first"]
    main(["explain", "bert-tiny", "--variant", "extra_h1_user", "--layer", "0", "-v"])
    live = capsys.readouterr().out
    assert "guard h1_user_count (guard, illegal):" in live and "dead code" not in live.split("fix:", 1)[0], live
    cfix, dead_ids = lv["first"]["compiler_fix"], tuple(lv["first"]["dead"])
    said = _why_markdown("h1_user_count", ILLEGAL, "m", "", cfix, dead_ids)
    assert f"(**{DEAD_READER_KIND}**)" not in said and f"guard **h1_user_count** ({DEAD_READER_KIND}): m" in said
    assert _why_markdown("g", ILLEGAL, "m", "", "a multi-output op").startswith("guard **g** (illegal): m")
    # the words come from the readers as data, never from the fix's text
    assert _why_markdown("h1_user_count", ILLEGAL, "m", "", cfix).startswith("guard **h1_user_count** (illegal): m")
    assert kind_words(ILLEGAL, (7, 9)) == DEAD_READERS_KIND and kind_words(ILLEGAL, (7,)) == DEAD_READER_KIND
    assert kind_words(ILLEGAL) == ILLEGAL and kind_words("not recognized", dead_ids) == "not recognized"


def test_the_dead_readers_are_data_on_the_refusal(capsys):
    """② breaks a layer with an extra reader of h1 that reaches no output (`dead_h1_user`): its refusal carries that
    reader's node id (`Rejection.dead`, `Outcome.dead`, `--json`'s `dead`), the node the compiler fix names; every
    other refusal of the run, and a live extra reader's (`extra_h1_user`, returned by the model), carries none."""
    from rlxviz.passes.explain import explain
    from rlxviz.session import OpenRequest, open_model

    main(["explain", "bert-tiny", "--variant", "dead_h1_user", "--layer", "0", "--json"])
    (lv,) = json.loads(capsys.readouterr().out)["layers"]
    assert lv["first"]["guard"] == "h1_user_count" and len(lv["first"]["dead"]) == 1, lv["first"]
    main(["explain", "bert-tiny", "--variant", "extra_h1_user", "--layer", "0", "--json"])
    (live,) = json.loads(capsys.readouterr().out)["layers"]
    outs = [o for o in (live["first"], *live["rejections"], *live["illegal"]) if o]  # illegal for the layer
    assert "h1_user_count" in [o["guard"] for o in outs] and all(o["dead"] == [] for o in outs), outs
    for variant, layer in (("dead_h1_user", 0), ("extra_h1_user", 0), ("none", 0)):
        model = open_model(OpenRequest(source="bert-tiny", seq=8, variant=variant, variant_layer=layer))
        trace = Pipeline.canonical().run(model.graph)
        found = [(k, r) for k, st in enumerate(trace.steps) for r in st.rejections if r.dead]
        if variant != "dead_h1_user":
            assert not found, (variant, found)
            continue
        (k, r), = found
        assert r.guard == "h1_user_count" and r.layer == 0 and r.dead == tuple(lv["first"]["dead"]), r
        node = trace.steps[k].before[r.dead[0]]
        assert node.op.value == "reduce_mean" and f"(node {node.id}, {node.path})" in r.fix, (node, r.fix)
        (o,) = [o for o in explain(trace, 0).outcomes if o.guard == "h1_user_count"]
        assert o.dead == r.dead
