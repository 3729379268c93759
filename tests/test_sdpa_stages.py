"""`fuse_sdpa`'s canonicalizations are steps of the trace (issue 36 item 1): each stage (`fuse_sdpa/rope_heads`, ...)
runs as its own step with its own graph before and after, can be switched off like a pass (the pipeline, the CLI's
`-STEP`, the app's rows), and a misspelt step name fails when the pipeline is built. The pass itself keeps its name:
`fuse_sdpa` is the step of its own rule (`hf_attention`), the last of its steps, and `explain` reads the stages with
it as one pass, as when they ran inside it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clirun import one_line_error
from clirun import run as cli_run
from test_rope_heads import AT, rope_attention
from test_rope_pairs import interleaved_attention
from test_unwritten_forms import equal_numbers

from rlxviz.ir import Graph, Op, format_graph, parse_ir
from rlxviz.passes import PASSES, Pipeline
from rlxviz.passes.explain import explain
from rlxviz.passes.pipeline import STAGES
from rlxviz.passes.rules.heads import UNFOLD_HEADS
from rlxviz.passes.whatif import run_pipeline_of
from rlxviz.passes.why.verdict import layer_verdict
from rlxviz.session import PipelineError, build_pipeline
from rlxviz.session.pipeline import version_index

CASES = Path(__file__).parent / "data" / "cases"
STAGE_NAMES = [st.name for st in PASSES["fuse_sdpa"].stages]


def _ops(g: Graph, op: Op) -> int:
    return sum(1 for n in g if n.op == op)


def _rope_graph() -> Graph:
    return parse_ir(rope_attention())


def _in_layer_0(g: Graph) -> Graph:
    """`g` (built without paths) with every node in layer 0's attention, its param values kept."""
    lines = [ln + AT if ln.startswith("  %") and " @" not in ln else ln for ln in format_graph(g).splitlines()]
    out = parse_ir("\n".join(lines))
    return out.with_values(g.values)


def test_each_stage_is_a_step_of_its_own_before_the_pass():
    trace = Pipeline.canonical().run(_rope_graph())
    names = [s.pass_name for s in trace.steps]
    k = names.index("fuse_sdpa")
    assert names[k - len(STAGE_NAMES):k] == STAGE_NAMES
    assert STAGE_NAMES[:6] == ["fuse_sdpa/unfold_heads", "fuse_sdpa/canonical_heads", "fuse_sdpa/hoist_head_norms",
                               "fuse_sdpa/cast_rotation", "fuse_sdpa/cast_heads", "fuse_sdpa/rope_heads"]
    for prev, step in zip(trace.steps, trace.steps[1:], strict=False):
        assert step.before is prev.after  # each step starts from the graph the one before it left
    rope = trace.step("fuse_sdpa/rope_heads")
    assert _ops(rope.before, Op.ROPE) == 0 and _ops(rope.after, Op.ROPE) == 2 and rope.changed
    assert {m.rule for m in rope.matches} == {"fuse_sdpa.rope_heads"}
    assert all(m.pass_name == "fuse_sdpa" for m in rope.matches)  # records keep the pass's name
    own = trace.step("fuse_sdpa")
    assert _ops(own.before, Op.ATTENTION) == 0 and _ops(own.after, Op.ATTENTION) == 1
    assert {m.rule for m in own.matches} == {"fuse_sdpa.hf_attention"}
    assert not trace.step("fuse_sdpa/rope_pairs").changed
    assert dict(trace.versions())["after fuse_sdpa/rope_heads"] is rope.after


def test_the_folded_heads_stage_shows_its_lift():
    trace = Pipeline.canonical().run(parse_ir((CASES / "n3-08-bart-bmm-3d-heads.rlx").read_text()))
    lift = trace.step("fuse_sdpa/unfold_heads")
    assert lift.changed and {m.rule for m in lift.matches} == {"fuse_sdpa.unfold_heads"}
    assert _ops(lift.after, Op.ATTENTION) == 0 and _ops(trace.step("fuse_sdpa").after, Op.ATTENTION) >= 1
    assert all(n.rank == 4 for n in lift.after if n.op == Op.SOFTMAX)


def test_called_directly_the_pass_still_runs_its_stages():
    g = _rope_graph()
    res = PASSES["fuse_sdpa"](g)
    assert _ops(res.graph, Op.ATTENTION) == 1 and _ops(res.graph, Op.ROPE) == 2
    assert {m.rule for m in res.matches} == {"fuse_sdpa.rope_heads", "fuse_sdpa.hf_attention"}
    assert _ops(PASSES["fuse_sdpa"].own(g).graph, Op.ATTENTION) == 0  # its own rule alone: the rotation blocks it


@pytest.mark.parametrize("graph, stage", [
    (lambda: _rope_graph(), "fuse_sdpa/rope_heads"),
    (lambda: parse_ir(rope_attention(n_rot=8, swapped=True)), "fuse_sdpa/rope_heads"),
    (lambda: _in_layer_0(interleaved_attention(d=16, n_rot=16)[0]), "fuse_sdpa/rope_pairs"),
    (lambda: _in_layer_0(interleaved_attention(d=8, n_rot=4, before_split=True, kv=2, spelling="gather")[0]),
     "fuse_sdpa/rope_pairs"),
], ids=["rotate-half", "rotate-half-partial-swapped", "interleaved", "interleaved-gpt-j-gqa"])
def test_switching_a_rope_stage_off_leaves_the_attention_unpacked_and_the_verdict_names_it(graph, stage):
    g = graph()
    on = Pipeline.canonical().run(g)
    assert _ops(on.step("fuse_sdpa").after, Op.ATTENTION) == 1
    off = Pipeline.canonical().disable(stage).run(g)
    assert stage not in [s.pass_name for s in off.steps] and "fuse_sdpa" in [s.pass_name for s in off.steps]
    assert _ops(off.final, Op.ATTENTION) == 0 and _ops(off.final, Op.FUSED_ATTENTION_BLOCK) == 0
    assert explain(off, 0).outcome("fuse_sdpa.hf_attention").guard == "rope_on_heads"
    v = layer_verdict(off, 0)
    assert not v.fused and v.first is not None and (v.first.rule, v.first.guard) == ("fuse_sdpa.hf_attention",
                                                                                      "rope_on_heads")
    # the stage was switched off, nothing else: the refusal says so and names no compiler fix (no gap in rlxviz's
    # ops, no model change; it read "teach it this form" and counted as a gap in rlxviz's ops)
    assert f"this pipeline skips the {stage} stage" in v.first.message and not v.gaps, v.first.message
    assert v.first.hint == f"nothing to change in the model: switch the {stage} stage back on (it rewrites this form)"
    # the same through the CLI's pass list and the pipeline a trace ran
    spec = build_pipeline(f"canonical,-{stage}")
    assert [s.pass_name for s in spec.run(g).steps] == [s.pass_name for s in off.steps]
    assert [s.pass_name for s in run_pipeline_of(off).run(g).steps] == [s.pass_name for s in off.steps]


def test_switching_the_pass_off_takes_its_stages_with_it():
    trace = Pipeline.canonical().disable("fuse_sdpa").run(_rope_graph())
    assert not any(s.family == "fuse_sdpa" for s in trace.steps)
    assert _ops(trace.final, Op.ROPE) == 0


@pytest.mark.parametrize("name", ["fuse_sdpa/rope_head", "fuse_sdpa.rope_heads", "fuse_sdpa/", "rope_heads"])
def test_a_misspelt_step_fails_when_the_pipeline_is_built(name):
    with pytest.raises(KeyError, match="unknown pass or step") as e:
        Pipeline.canonical().disable(name)
    if name != "fuse_sdpa/":
        assert "fuse_sdpa/rope_heads" in str(e.value)
    with pytest.raises(KeyError, match="unknown pass or step"):
        Pipeline(disabled={name})
    with pytest.raises(PipelineError, match="unknown pass or step"):
        build_pipeline(f"canonical,-{name}")


def test_a_stage_is_no_pass_of_a_list():
    with pytest.raises(PipelineError, match="is a step of the pass 'fuse_sdpa', which the list does not hold"):
        build_pipeline("canonicalize_norm,fuse_sdpa/rope_heads")
    some = build_pipeline("fuse_sdpa/unfold_heads,fuse_sdpa/rope_heads,fuse_sdpa")  # the app's rows, two ticked
    assert [p.name for p in some.steps()] == ["fuse_sdpa/unfold_heads", "fuse_sdpa/rope_heads", "fuse_sdpa"]
    assert [p.name for p in build_pipeline("fuse_sdpa").steps()] == [*STAGE_NAMES, "fuse_sdpa"]
    with pytest.raises(KeyError, match="is a step of the pass"):
        Pipeline(["fuse_sdpa/rope_heads"]).run(_rope_graph())
    with pytest.raises(PipelineError, match="takes only steps to switch off"):
        build_pipeline("canonical,-fuse_sdpa/rope_heads,fuse_sdpa")


def test_a_version_is_named_by_its_step():
    trace = Pipeline.canonical().run(_rope_graph())
    names = [s.pass_name for s in trace.steps]
    assert version_index(trace, "fuse_sdpa/rope_heads") == names.index("fuse_sdpa/rope_heads") + 1
    assert version_index(trace, "fuse_sdpa") == names.index("fuse_sdpa") + 1
    with pytest.raises(PipelineError, match="fuse_sdpa/rope_heads"):
        version_index(trace, "fuse_sdpa/rope_head")


def test_explain_reads_the_stages_with_their_pass():
    trace = Pipeline.canonical().run(_rope_graph())
    ex = explain(trace, 0)
    sdpa = [o for o in ex.outcomes if o.pass_name == "fuse_sdpa"]
    assert [o.rule for o in sdpa][:2] == ["fuse_sdpa.rope_heads", "fuse_sdpa.hf_attention"]  # the stage ran first
    assert all(o.status == "fused" for o in sdpa)
    assert not any("/" in o.pass_name for o in ex.outcomes)
    assert trace.pass_number([s.pass_name for s in trace.steps].index("fuse_attention_block")) == \
        list(Pipeline.canonical().names).index("fuse_attention_block") + 1


def test_every_stage_is_listed_with_its_rules():
    assert list(STAGES) == [*STAGE_NAMES, "fuse_attention_block/qkv_columns"] and len(STAGE_NAMES) == 13
    assert all(st.product == "" and st.expected_of == () for st in STAGES.values())
    assert all(st.rules for n, st in STAGES.items() if n != "fuse_sdpa/unfold_heads")


def _two_folded_layers() -> Graph:
    """n3-08 (BART's bmm on `[B*H, S, d]`) with its layer written twice, the second reading the first's output and
    the same mask: two folded attentions in one graph."""
    lines = [ln for ln in (CASES / "n3-08-bart-bmm-3d-heads.rlx").read_text().splitlines() if not ln.startswith("#")]
    head, body = lines[0], [ln for ln in lines[1:] if ln.startswith("  %")]
    out = int(next(ln for ln in lines if ln.strip().startswith("return")).split("%")[1])
    shift = out + 1

    def renumber(m: re.Match[str]) -> str:
        i = int(m.group(1))
        return f"%{out if i == 0 else 1 if i == 1 else i + shift}"

    second = [re.sub(r"%(\d+)", renumber, ln).replace("layers.0", "layers.1").replace('name="', 'name="l1.')
              for ln in body if " = input " not in ln]
    return parse_ir("\n".join([head, *body, *second, f"  return %{out + shift}", "}"]))


@pytest.mark.parametrize("case", ["n3-08-bart-bmm-3d-heads", "n3-08v-folded-scaled-scores",
                                  "n3-08w-folded-position-bias", "two-layers"])
def test_the_lift_is_a_rule_with_one_match_per_softmax_and_keeps_the_numbers(case):
    g = _two_folded_layers() if case == "two-layers" else parse_ir((CASES / f"{case}.rlx").read_text())
    trace = Pipeline.canonical().run(g)
    lift = trace.step("fuse_sdpa/unfold_heads")
    folded = [n.id for n in lift.before if n.op == Op.SOFTMAX]
    assert lift.changed and not lift.rejections and not lift.error
    assert sorted(m.anchor for m in lift.matches) == sorted(folded)
    assert all(m.rule == UNFOLD_HEADS.name and m.fused is None and m.bindings == {"softmax": m.anchor}
               for m in lift.matches)
    assert all(n.rank == 4 for n in lift.after if n.op == Op.SOFTMAX)
    g2 = lift.after
    assert not [n.id for n in g2 if n.op == Op.MATMUL and all(g2[i].rank == 3 for i in n.inputs)]  # no bmm left
    assert _ops(trace.step("fuse_sdpa").after, Op.ATTENTION) == len(folded)
    equal_numbers(g)


def test_a_softmax_of_no_folded_chain_is_no_candidate():
    trace = Pipeline.canonical().run(parse_ir((CASES / "n3-08c-bart-4d-control.rlx").read_text()))
    lift = trace.step("fuse_sdpa/unfold_heads")
    assert not lift.changed and not lift.matches and not lift.rejections


def test_the_app_lists_each_stage_as_a_row_to_switch_off():
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState

    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    k = s.passes.index("fuse_sdpa")
    assert s.passes[k - len(STAGE_NAMES):k] == STAGE_NAMES and s.pipeline_spec == [
        p for p in s.passes if p not in STAGES]
    assert [st.pass_name for st in s.trace.steps][:k + 1] == s.passes[:k + 1]
    i = s.passes.index("fuse_sdpa/hoist_scales")
    s.toggle_pass(i, False)
    assert "-fuse_sdpa/hoist_scales" in s.pipeline_spec and "fuse_sdpa/hoist_scales" not in s.pipeline_spec
    ran = [st.pass_name for st in s.trace.steps]
    assert "fuse_sdpa/hoist_scales" not in ran and "fuse_sdpa/rope_heads" in ran and "fuse_sdpa" in ran
    s.toggle_pass(k, False)  # the pass itself off: its stages go with it
    assert not any(st.family == "fuse_sdpa" for st in s.trace.steps)


def test_the_cli_switches_a_step_off_and_names_a_misspelt_one(capsys, tmp_path):
    path = tmp_path / "rope.rlx"
    path.write_text(rope_attention())
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 0, out
    code, out, _ = cli_run(capsys, "explain", path, "--pipeline", "canonical,-fuse_sdpa/rope_heads")
    assert code != 0 and "rope_on_heads" in out
    code, out, _ = cli_run(capsys, "ir", path, "--pipeline", "canonical", "--after", "fuse_sdpa/rope_heads")
    assert code == 0 and "rope(" in out and "attention(" not in out
    code, _, err = cli_run(capsys, "explain", path, "--pipeline", "canonical,-fuse_sdpa/rope_head")
    one_line_error(err, "explain", "did you mean 'fuse_sdpa/rope_heads'")
    code, out, _ = cli_run(capsys, "passes", "--pipeline", "canonical,-fuse_sdpa/rope_heads", "--json")
    (sdpa,) = [p for p in json.loads(out)["passes"] if p["name"] == "fuse_sdpa"]
    assert [st["name"] for st in sdpa["stages"]] == STAGE_NAMES
    assert [st["name"] for st in sdpa["stages"] if st["off"]] == ["fuse_sdpa/rope_heads"]
