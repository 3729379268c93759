"""The node inspector says one outcome per rule and role (issue 39, a newcomer run: a matmul fused into
FusedMatMulBiasAct while its activation was refused by `epilogue_activation` was listed both "passed (fused)" and
"failed epilogue_activation"). A fusion that left something out is one entry: what was fused into what, what was left
out and why, in the words `rlxviz explain` uses (`Outcome.soft`); the left-out node says what it was left out of."""

from __future__ import annotations

import html
import re
from collections import Counter

import pytest

from rlxviz.app.explain import node_report, report_markdown
from rlxviz.ir import parse_ir
from rlxviz.models import VARIANTS, load_model
from rlxviz.passes import Pipeline, explain
from rlxviz.passes.trace import layer_of
from rlxviz.passes.why.places import place_standings
from rlxviz.passes.why.verdict import OP_GAP_GROUP

LINEAR = """graph ffn {{
  %0 = input {{name="x"}} : f32[2, 8]
  %1 = param {{name="w"}} : f32[8, 16]
  %2 = param {{name="b"}} : f32[16]
  %3 = matmul(%0, %1) : f32[2, 16] @encoder.layer.0.intermediate.dense
  %4 = add(%3, %2) : f32[2, 16] @encoder.layer.0.intermediate.dense
  %5 = {act}(%4) : f32[2, 16] @encoder.layer.0.intermediate.act
  return %5
}}"""


def _ir(act: str):
    return Pipeline.canonical().run(parse_ir(LINEAR.format(act=act)))


def _bert_tanh():
    return Pipeline.canonical().run(load_model("bert-tiny", seq=8, variant=VARIANTS["tanh_gelu"]).graph)


CASES = {"gelu_tanh": lambda: _ir("gelu_tanh"), "relu": lambda: _ir("relu"), "bert_tanh_gelu": _bert_tanh}


def _plain(markdown: str) -> str:
    return re.sub(r"<[^>]+>", "", markdown).replace("\\", "")


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_fusion_that_left_its_activation_out_is_one_answer(case):
    trace = CASES[case]()
    soft = [(k, r) for k, s in enumerate(trace.steps) for r in s.rejections
            if r.soft and r.guard == "epilogue_activation"]
    assert soft, case
    k, r = soft[0]
    step = trace.steps[k]
    m = next(m for m in step.matches if (m.rule, m.anchor) == (r.rule, r.anchor))
    made = step.after[m.fused]
    act = r.offending[0]
    # explain's one answer for the layer: the rule fused, and left this out
    said = [o for o in explain(trace, layer_of(r.path)).outcomes if o.rule == r.rule and o.status == "fused"]
    assert said and (r.guard, r.kind) in {(g, kd) for o in said for g, kd, _ in o.soft}
    for node in (m.bindings["mm"], m.bindings["add"], m.fused):
        g = step.after if node == m.fused else step.before
        rep = node_report(g, node, trace)
        mine = [d for d in rep["decisions"] if d["rule"] == r.rule and d["anchor"] == m.anchor]
        assert len(mine) == 1, mine  # one role, one outcome: not "passed" and "failed" for one guard
        (d,) = mine
        assert d["outcome"] == "fused" and d["guard"] == "epilogue_activation" and d["made"] == f"{made.op.value} " \
            f"%{made.id}"
        assert [x["guard"] for x in d["left_out"]] == ["epilogue_activation"]
        assert d["left_out"][0]["nodes"] == [f"%{act} {step.before[act].op.value}"]
        assert d["left_out"][0]["message"] in {msg for o in said for _, _, msg in o.soft}  # explain's words
        assert f"%{m.bindings['mm']} matmul" in d["fused"] and f"%{m.bindings['add']} add" in d["fused"]
        text = _plain(report_markdown(rep))
        item = [ln for ln in text.splitlines() if r.rule in ln and ln.startswith("- ") and f"%{made.id}" in ln]
        assert len(item) == 1, text
        line = item[0]
        assert "fused" in line and "left out" in line and "rejected" not in line and "failed" not in line, line
        assert "all guards passed" not in line and line.count("epilogue_activation") == 1, line
        assert f"-> {made.op.value} %{made.id}" in line and f"%{act} {step.before[act].op.value}" in line, line
        facts = Counter((x["rule"], x["anchor"], x["role"], x["guard"]) for x in rep["decisions"])
        assert facts.most_common(1)[0][1] == 1
    # the activation itself: left out of that fusion, and why; never "rejected"
    rep = node_report(step.before, act, trace)
    (d,) = [d for d in rep["decisions"] if d["rule"] == r.rule and d["anchor"] == m.anchor]
    assert d["outcome"] == "left out" and d["guard"] == "epilogue_activation" and d["made"] == \
        f"{made.op.value} %{made.id}"
    line = next(ln for ln in _plain(report_markdown(rep)).splitlines() if r.rule in ln and ln.startswith("- ")
                and f"%{made.id}" in ln)
    # at a gap in rlxviz's ops (tanh-GELU, relu: off the epilogue allow-list) it says so, as the drawing's △ does
    st = place_standings(trace, k)[(r.rule, r.anchor)][1]
    word = f"- left out (△ {OP_GAP_GROUP}) of" if st is not None and st[0] == OP_GAP_GROUP else "- left out of"
    assert html.unescape(line).startswith(word), line
    assert f"-> {made.op.value} %{made.id}" in line and "rejected" not in line


def test_the_layer_line_says_what_explain_says_of_the_blocker():
    """The node's layer line says the layer's status as `explain` does: tanh-GELU left outside the epilogue is a gap
    in rlxviz's ops (no change to the model keeps its numbers), so "fused as far as rlxviz's ops go", no blocker."""
    trace = _ir("gelu_tanh")
    from rlxviz.passes.why.verdict import RunVerdict

    v = RunVerdict.of(trace).layers[0]
    assert not v.blocker and v.gap_only
    text = _plain(report_markdown(node_report(trace.input, 4, trace)))
    assert f"layer 0: {v.status}" in text.replace("**", "") and v.render().startswith(f"layer 0: {v.status}: ")


def test_a_refused_candidate_still_lists_each_failing_guard_once():
    """A hard rejection is unchanged in kind: `rejected`, each failing guard once per role (bert-tiny with an extra
    reader of h1: `h1_user_count`)."""
    trace = Pipeline.canonical().run(load_model("bert-tiny", seq=8, variant=VARIANTS["dead_h1_user"]).graph)
    r = next(r for r in trace.rejections if r.guard == "h1_user_count")
    k = next(i for i, s in enumerate(trace.steps) if r in s.rejections)
    rep = node_report(trace.steps[k].before, r.anchor, trace)
    hits = [d for d in rep["decisions"] if d["guard"] == "h1_user_count"]
    assert len(hits) == 1 and hits[0]["outcome"].startswith("rejected")
    text = _plain(report_markdown(rep))
    assert "rejected" in text and "guard h1_user_count" in text.replace("*", "")


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_decisions_table_does_not_say_all_passed_for_a_fusion_that_left_something_out(case):
    """The Matches & rejections table: the fused row of a fusion that left its activation out names the guard it was
    made without (its own "left out" row says why), never "all passed"."""
    from rlxviz.app.explain import decision_rows

    trace = CASES[case]()
    rows = decision_rows(trace)
    # a soft place's row reads its standing: tanh-GELU and ReLU left outside are gaps in rlxviz's ops
    softs = [r for r in rows if r["kind"] in ("left out", OP_GAP_GROUP) and r["guard"] == "epilogue_activation"]
    assert softs, case
    for soft in softs:
        (fused,) = [r for r in rows if r["kind"] == "fused" and (r["step"], r["rule"], r["anchor"]) ==
                    (soft["step"], soft["rule"], soft["anchor"])]
        assert fused["guard"] == "passed; left out by epilogue_activation", fused
        assert "without %" in fused["message"] and "FusedMatMulBiasAct" in fused["message"], fused
    assert any(r["kind"] == "fused" and r["guard"] == "all passed" for r in rows) or case != "bert_tanh_gelu"
