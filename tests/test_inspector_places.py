"""The node inspector tells each node only the guards of the places it belongs to (issue 39: on the DeepNorm case
`n4-06-deepnorm-residual.rlx`, clicking the first LayerNorm's FusedResidualLN listed `ln2_residual_scaled` and
`ln2_operand_order`, the second norm's refusals, "as ln1"; its gamma listed all four "as ln1_g").

A FusedTransformerLayer candidate (anchored at the attention) binds the nodes of both residual norms; each failing
guard is about one of them (`Rejection.place_role`: the guard's first role). A node is told a refusal when it is the
candidate's anchor, a node the guard marks (`offending`, `subject`), or bound to the role the guard is about; never
when it is bound only to another place's role. A node that belongs to several places (a norm's own fusion and the
layer candidate, two residual-norm candidates that share a LayerNorm) has its items grouped under each place's label
(its anchor, and the part of the candidate the guard is about: `%72 FusedAttentionBlock (ln2 %74 FusedResidualLN)`).

Variants of our own: DeepNorm scaling only the second residual, and a post-LN layer that logs both residual sums
(two refused FusedResidualLN places sharing the first norm, which is one place's norm and the other's residual);
the invariant is checked on the built-in presets too (pre-LN BERT, an extra reader of h1).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlxviz.app.explain import node_decisions, node_report, report_markdown
from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.passes.trace import Rejection, Trace

CASES = Path(__file__).parent / "data" / "cases"
DEEPNORM = (CASES / "n4-06-deepnorm-residual.rlx").read_text()
LOGGED = (CASES / "n4-15-residual-logged.rlx").read_text()
LAYER = "fuse_transformer_layer.bert_post_ln"


def _state(text: str) -> AppState:
    return AppState(runner=Runner(background=False), source="ir", ir_text=text, seq=8)


def _deepnorm_second_only() -> str:
    """DeepNorm's alpha on the FFN residual only: the first residual adds the layer input unscaled."""
    text = DEEPNORM.replace("%41 = add(%38, %40)", "%41 = add(%38, %0)")
    assert text != DEEPNORM
    return text


def _both_sums_logged() -> str:
    """N4-15 with a second logging probe, on the FFN's residual sum: both residual norms are refused, and the first
    norm (h1) is the second place's residual operand."""
    text = LOGGED.replace("  return %57, %44\n",
                          "  %58 = mul(%54, %54) : f32[2, 8, 64] @encoder.layer.0\n"
                          "  %59 = reduce_mean(%58) {axes=[2], keepdims=false} : f32[2, 8] @encoder.layer.0\n"
                          "  return %57, %44, %59\n")
    assert text != LOGGED
    return text


def _layer_refusals(trace: Trace) -> list[Rejection]:
    return [r for r in trace.rejections if r.rule == LAYER]


def _graph_of(trace: Trace, node: int):
    """The last version that holds `node` (the one a click in the after pane reads)."""
    return next(s.after for s in reversed(trace.steps) if node in s.after)


def _guards(trace: Trace, node: int, rule: str = LAYER) -> set[str]:
    return {d["guard"] for d in node_decisions(trace, node) if d["rule"] == rule and d["outcome"] != "fused"}


@pytest.mark.parametrize("text, scaled", [(DEEPNORM, ("ln1", "ln2")), (_deepnorm_second_only(), ("ln2",))],
                         ids=["deepnorm", "deepnorm_second_only"])
def test_a_norms_nodes_are_told_only_their_norms_guards(text, scaled):
    s = _state(text)
    trace = s.advised_trace()
    refused = _layer_refusals(trace)
    assert {r.guard for r in refused} >= {f"{ln}_residual_scaled" for ln in scaled}, refused
    bindings = refused[0].bindings
    for ln in ("ln1", "ln2"):
        other = "ln2" if ln == "ln1" else "ln1"
        for role in (ln, f"{ln}_g", f"{ln}_b"):
            told = _guards(trace, bindings[role])
            assert not {g for g in told if g.startswith(f"{other}_")}, (role, told)
            if role == ln:  # the norm itself is told its own refusals
                assert {g for g in told if g.startswith(f"{ln}_")} == {r.guard for r in refused
                                                                      if r.guard.startswith(f"{ln}_")}, (role, told)
    # what the app's inspector shows for the first norm, as it is clicked in the final version
    ln1 = bindings["ln1"]
    text1 = report_markdown(node_report(_graph_of(trace, ln1), ln1, trace, verdict=s.verdict()))
    told = text1.partition("**guards evaluated on this node**")[2]  # (the layer's verdict above is the layer's)
    # a follower's mark names the place's gaps, as the drawing's note does (`beside the gap ln1_residual_scaled,
    # ln2_residual_scaled:`): the gaps of the candidate, not a guard told to this node
    told = re.sub(r"△ (beside the gap|fix of) [^<]*</b>", "", told)
    assert told and "ln2\\_" not in told and "ln2_" not in told, text1


def test_the_candidates_anchor_has_every_guard_under_its_place():
    """The attention anchors the layer candidate: every refusal is about it, each under its norm's label."""
    s = _state(DEEPNORM)
    trace = s.advised_trace()
    refused = _layer_refusals(trace)
    anchor = refused[0].anchor
    assert _guards(trace, anchor) == {r.guard for r in refused}
    lines = report_markdown(node_report(_graph_of(trace, anchor), anchor, trace)).split("\n\n")
    heads = [k for k, ln in enumerate(lines) if ln.startswith("*at ")]
    assert len(heads) >= 3, lines  # its own fusion, x of the first norm's fusion, the two norms of the candidate
    for r in refused:
        item = next(k for k, ln in enumerate(lines) if f"**{r.guard}**" in ln)
        head = lines[max(h for h in heads if h < item)]
        ln = r.guard.split("_", 1)[0]
        assert f"%{anchor} " in head and f"({ln} %{r.bindings[ln]} " in head, (r.guard, head)


def test_two_refused_residual_norms_that_share_a_norm_keep_apart():
    s = _state(_both_sums_logged())
    trace = s.advised_trace()
    places = [r for r in trace.rejections if r.rule == "fuse_residual_ln.residual" and r.guard == "sum_single_user"]
    assert len(places) == 2, [(r.rule, r.anchor, r.guard) for r in trace.rejections]
    first, second = sorted(places, key=lambda r: r.anchor)
    h1 = first.bindings["norm"]
    assert second.bindings["residual"] == h1  # the first norm is the second place's residual operand
    told = [d for d in node_decisions(trace, h1) if d["rule"] == first.rule]
    assert {d["anchor"] for d in told if d["outcome"].startswith("rejected")} == {first.anchor}, told
    # the second place's nodes are not told the first place's refusal
    for role in ("norm", "sum", "gamma"):
        node = second.bindings[role]
        assert first.anchor not in {d["anchor"] for d in node_decisions(trace, node) if d["rule"] == first.rule}
    # in the inspector, each item of h1 sits under its own place's label
    lines = report_markdown(node_report(trace.steps[0].before, h1, trace)).split("\n\n")
    heads = [k for k, ln in enumerate(lines) if ln.startswith("*at ")]
    assert heads, lines  # h1 is the first norm's place and the FFN's input
    item = next(k for k, ln in enumerate(lines) if "**sum_single_user**" in ln)
    assert f"%{first.anchor} " in lines[max(h for h in heads if h < item)]
    assert sum("**sum_single_user**" in ln for ln in lines) == 1, lines


def _foreign(trace: Trace) -> list[tuple[int, str, int, str]]:
    """(node, rule, anchor, guard) of every refusal told to a node bound only to another place's role of it (what a
    fusion left out, a soft rejection, is said with the fusion to each node of it: not a refusal)."""
    out = []
    for r in trace.rejections:
        place = r.place_role
        if place is None or r.soft:
            continue
        for node in r.bindings.values():
            if node in (r.anchor, r.subject, r.bindings[place], *r.offending):
                continue
            hit = [d for d in node_decisions(trace, node)
                   if (d["rule"], d["anchor"], d["guard"]) == (r.rule, r.anchor, r.guard)
                   and not d["outcome"] == "fused"]
            out += [(node, r.rule, r.anchor, r.guard)] if hit else []
    return out


@pytest.mark.parametrize("preset, variant", [("bert-tiny", "pre_ln"), ("bert-tiny", "extra_h1_user"),
                                             ("bert-tiny", "tanh_gelu")])
def test_no_node_is_told_another_places_guard(preset, variant):
    s = AppState(runner=Runner(background=False), preset=preset, seq=8)
    s.apply_variant(variant)
    trace = s.advised_trace()
    assert any(r.place_role for r in trace.rejections), variant
    assert _foreign(trace) == []


@pytest.mark.parametrize("text", [DEEPNORM, _deepnorm_second_only(), _both_sums_logged()],
                         ids=["deepnorm", "deepnorm_second_only", "both_sums_logged"])
def test_no_node_of_the_cases_is_told_another_places_guard(text):
    trace = _state(text).advised_trace()
    assert _foreign(trace) == []
    # and a refusal still reaches the node it is about
    for r in trace.rejections:
        if r.place_role is not None:
            assert r.guard in {d["guard"] for d in node_decisions(trace, r.bindings[r.place_role])}, r.guard


def test_a_node_of_one_place_has_no_labels():
    s = _state(DEEPNORM)
    trace = s.advised_trace()
    g = _layer_refusals(trace)[0].bindings["ln1_g"]
    text = report_markdown(node_report(trace.steps[0].before, g, trace))
    assert not re.search(r"^\*at ", text, re.M), text
