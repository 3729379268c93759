"""A parallel block's residual-norm refusal is worded as a parallel block, and its compiler fix checked for one (a
newcomer run of GPT-NeoX).

GPT-NeoX's layer 1 said `pre-norm layout: the residual sum also feeds the next residual add ...` of a sum read by
THREE nodes: the attention's norm, the MLP's norm and the next residual add (`use_parallel_residual`). The words now
name the layout (`norm_per_sublayer`: both sublayers' norms read the sum, and the next add too) and what a whole fix
needs (one op normalizing the sum once per sublayer, returning it too). The compiler fix they name, a two-output
FusedResidualLN, was said to be enough at both places; it is not: one fused op absorbs the add once, so it takes the
add into the first norm and the second norm's match finds the sum taken (the engine's `already_fused`). That is
checked by running the two-output rule itself through the engine, and said by the caveat machinery
(`whatif.without_guard`, `caveat.fix_caveat`) as for any other fix that is not enough alone. Falcon's parallel block
(one norm for both sublayers) is worded as such, its fix enough; LLaMA-style pre-norm wording is unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
from clirun import case_trace as trace_of
from clirun import run as cli_run

from rlxviz.passes import PASSES, Trace
from rlxviz.passes.architecture import classify_layer
from rlxviz.passes.engine import find
from rlxviz.passes.guard import NOT_PROFITABLE
from rlxviz.passes.whatif import fix_alone_blocker, without_guard
from rlxviz.passes.why import policy
from rlxviz.passes.why.kinds import LayerArchitecture
from rlxviz.passes.why.verdict import RunVerdict

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"
NEOX = CASES / "gpt-neox.legacy-sdpa.onnx"
BOTH = "parallel block: both sublayers' norms (the attention's and the MLP's) read the residual sum"
ONE = "parallel block: one norm of the residual sum feeds both sublayers"
PRE = "pre-norm layout: the residual sum also feeds the next residual add"
ALONE = "alone it is not enough: already_fused (not profitable) fails next"


@functools.cache
def traced(stem: str) -> Trace:
    return trace_of(CASES / f"{stem}.onnx")


def _refusals(trace: Trace, layer: int) -> list[tuple[int, object]]:
    """`(step, refusal)` of each `sum_single_user` refusal of `fuse_residual_ln.residual` in `layer`, in graph order."""
    return [(k, r) for k, s in enumerate(trace.steps) for r in s.rejections
            if r.rule == "fuse_residual_ln.residual" and r.guard == "sum_single_user" and r.layer == layer]


@pytest.mark.parametrize("norms, words", [(2, BOTH), (1, ONE)])
@pytest.mark.parametrize("pass_name", ["fuse_residual_ln", "fuse_residual_rms_norm"])
def test_a_parallel_block_is_excused_in_its_own_words(pass_name, norms, words):
    arch = LayerArchitecture("parallel", "a parallel block", mask="causal", parallel_norms=norms)
    product = PASSES[pass_name].product
    for guard in ("sum_single_user", "biased_single_user"):
        why = policy.not_expected(arch, pass_name, guard)
        assert why is not None and why.startswith(words), why  # still excused: the count is the same
        assert PRE not in why and f"builds only the single-output {product}, which returns" in why, why
        assert f"compiler fix: a {pass_name} rule that builds {product}(with_sum=true)" in why, why
        assert ("once per sublayer" in why and "one of the two norms only" in why) == (norms == 2), why
    for kind in ("llama", "pre_ln"):  # real pre-norm layers keep their words
        assert policy.not_expected(LayerArchitecture(kind, kind), pass_name, "sum_single_user").startswith(PRE)


def test_the_classifier_counts_the_parallel_blocks_norms():
    neox, falcon = traced("gpt-neox.legacy-sdpa"), traced("falcon")
    for layer in (0, 1):
        a, b = classify_layer(neox.input, layer), classify_layer(falcon.input, layer)
        assert (a.kind, a.parallel_norms, a.has("norm_per_sublayer")) == ("parallel", 2, True), a
        assert (b.kind, b.parallel_norms, b.has("norm_per_sublayer")) == ("parallel", 1, False), b
    granite = classify_layer(traced("granite").input, 1)
    assert granite.parallel_norms == 0 and not granite.has("norm_per_sublayer")


def test_the_two_output_op_takes_the_add_into_one_norm_only():
    """The claim checked by the engine itself: the residual rule with its `sum_single_user` guard dropped and the sum
    returned too (`Rule.outputs`, `with_sum`: the two-output FusedResidualLN) matches at the first norm; at the
    second, `engine.find` records `already_fused` on the sum. `without_guard` says the same at each place."""
    trace = traced("gpt-neox.legacy-sdpa")
    (k, first), (k2, second) = _refusals(trace, 1)
    assert k == k2 and first.bindings["sum"] == second.bindings["sum"]  # both norms read one sum
    step = trace.steps[k]
    rule = next(r for r in PASSES["fuse_residual_ln"].rules if r.name == "fuse_residual_ln.residual")
    build = rule.build

    def with_sum(c):
        op, ins, attrs = build(c)
        return op, ins, {**attrs, "with_sum": True}

    two = dataclasses.replace(rule, steps=tuple(s for s in rule.steps if getattr(s, "name", "") != "sum_single_user"),
                              outputs=("sum",), build=with_sum, source=rule.source)
    found, refused = find(step.before, "fuse_residual_ln", [two], step.params)
    assert [f.anchor for f in found if f.anchor in (first.anchor, second.anchor)] == [first.anchor]
    taken = [r for r in refused if r.anchor == second.anchor]
    assert [(r.guard, r.kind) for r in taken] == [("already_fused", NOT_PROFITABLE)]
    assert first.bindings["sum"] in taken[0].offending
    # the caveat machinery's check agrees, place by place
    assert without_guard(trace, k, first) == []
    blocker = fix_alone_blocker(trace, k, second)
    assert blocker is not None and blocker[:2] == ("already_fused", NOT_PROFITABLE), blocker
    assert f"sum (node {first.bindings['sum']}" in blocker[2] and f"%{first.anchor}" in blocker[2], blocker


def test_explain_says_the_layout_and_that_the_fix_alone_is_not_enough(capsys):
    code, out, err = cli_run(capsys, "explain", "-v", NEOX)
    assert "Traceback" not in err and code in (0, 1), err
    lines = [ln for ln in out.splitlines() if "not expected here: fuse_residual_ln.residual (sum_single_user)" in ln]
    assert len(lines) == 2, out  # one line per place: their compiler fix's check differs
    assert all(BOTH in ln and PRE not in ln for ln in lines), lines
    (_, first), (_, second) = _refusals(traced("gpt-neox.legacy-sdpa"), 1)
    at = {ln.split(" @ %")[1].split(" ")[0]: ln for ln in lines}
    assert ALONE not in at[str(first.anchor)]
    assert at[str(second.anchor)].endswith(f"one of the two norms only; {ALONE})")
    # explain -v's fix line names the other norm beside the next residual add
    fix = next(ln for ln in out.splitlines() if "fix: none in the model: the other norm" in ln)
    assert f"(node {second.anchor}," in fix and "a parallel block" in fix and "into one of the norms only" in fix
    code, out, _ = cli_run(capsys, "explain", "--json", NEOX)
    doc = json.loads(out)
    said = [x for lv in doc["layers"] for x in lv["not_expected"] if "(sum_single_user)" in x]
    assert sorted(x.endswith(f"{ALONE})") for x in said) == [False, True], said
    # the first norm's fix line, the one `explain -v` prints for the rule, is checked enough there (it is)
    checks = [c for c in doc["fix_checks"] if (c["rule"], c["guard"]) == (first.rule, "sum_single_user")]
    assert [(c["anchor"], c["compiler_fix_enough"]) for c in checks] == [(first.anchor, True)], checks


@pytest.mark.parametrize("stem", ["granite", "optimum.llama-with-past", "falcon"])
def test_other_layouts_keep_their_words_and_an_enough_fix(stem):
    v = RunVerdict.of(traced(stem))
    said = [x for lv in v.layers for x in lv.not_expected if "(sum_single_user)" in x]
    assert said and not any("already_fused" in x or "alone it is not enough" in x for x in said), said
    words = ONE if stem == "falcon" else PRE
    assert all(words in x and BOTH not in x for x in said), said
