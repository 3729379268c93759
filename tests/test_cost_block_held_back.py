"""A cost test's "it would cost the attention block" names what holds the block back where none formed (a newcomer
run on cohere.dynamo-eager).

`fuse_shared_input_matmul`'s cost test keeps the MLP's matmul out of the Q/K/V merge "for the attention block at
attention (node 233)", on purpose also where `fuse_attention_block` then refuses that attention at a gap in rlxviz's
ops (`rope_halves`: FusedAttentionBlock with interleaved RoPE), since the compiler fix would form it. But `explain -v`,
`--json` and the app said "it would cost the attention block" beside no block: a cost this run does not pay. The
report layer now reads, for each protected attention, whether a FusedAttentionBlock took it in the end and, if not,
`fuse_attention_block`'s refusal at it (`report.block_cost_in_context`): "the attention block at attention (node
233, ...) that FusedAttentionBlock with interleaved RoPE would form (rlxviz lacks it: rope_halves; the compiler fix
forms it; Q/K/V packed ...)". Where the block formed (the test cases' parallel blocks), the words stay as they were.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from clirun import run
from test_fusion_cases import attention_layer, case
from test_shared_input_attention_group import parallel_block

from rlxviz import session
from rlxviz.app.explain import decision_rows
from rlxviz.ir import Op
from rlxviz.passes import Pipeline
from rlxviz.passes.guard import DOES_NOT_PAY
from rlxviz.passes.report import in_context
from rlxviz.passes.trace import Trace
from rlxviz.viz.overlay import worded

COHERE = Path(__file__).parent / "fixtures" / "onnx" / "zoo" / "cohere.dynamo-eager.onnx"
COST = "it would cost the attention block at attention (node "
HELD = ("that FusedAttentionBlock with interleaved RoPE would form (rlxviz lacks it: rope_halves; the compiler fix "
        "forms it; Q/K/V packed with it would be 192 wide instead of 64)")


@cache
def _cohere() -> Trace:
    return Pipeline.canonical().run(session.load(str(COHERE)).graph)


def _declined(t: Trace) -> list[tuple[int, object]]:
    return [(k, r) for k, s in enumerate(t.steps) for r in s.rejections if r.guard == "merge_keeps_fusions"]


def _claims(r) -> str:
    """The cost as the record words it: `attention (node N, PATH)`."""
    return r.message.split("the attention block at ")[1].split(" (Q/K/V")[0]


def test_cohere_names_the_gap_that_holds_the_protected_block_back():
    t = _cohere()
    assert not t.final.find(Op.FUSED_ATTENTION_BLOCK)
    declined = _declined(t)
    assert len(declined) == 2
    for k, r in declined:
        assert "(Q/K/V packed with it would be 192 wide instead of 64)" in r.message  # the record is as made
        said = in_context(t, k, r)[0]
        assert f"the attention block at {_claims(r)} {HELD}" in said, said
        (tip,) = [x.message for x in worded(t, t.steps[k]) if x is r or (x.rule, x.anchor) == (r.rule, r.anchor)]
        assert tip == said  # the graph's tooltips
    rows = [x for x in decision_rows(t) if x["guard"] == "merge_keeps_fusions"]  # the Matches table
    assert len(rows) == 2 and all(HELD in x["message"] and "(Q/K/V packed" not in x["message"] for x in rows)


def test_cohere_text_and_json_say_the_same(capsys):
    code, out, _ = run(capsys, "explain", "-v", COHERE)
    assert code == 0, out
    lines = [ln for ln in out.splitlines() if "merge_keeps_fusions" in ln and COST in ln]
    assert len(lines) >= 4 and all(HELD in ln for ln in lines), lines  # the cost test's heading and each layer's
    assert "(Q/K/V packed" not in out
    code, out, _ = run(capsys, "explain", "-v", "--json", COHERE)
    assert code == 0
    text = json.dumps(json.loads(out))
    assert "(Q/K/V packed" not in text and text.count(HELD) >= 4


def test_a_generated_parallel_block_held_back_by_a_gap_names_it():
    """The builder's GPT-J block with a causal mask: the block is refused at `mask_kind_keep`, a gap."""
    t = Pipeline.canonical().run(parallel_block("rope", False, None))
    assert not t.final.find(Op.FUSED_ATTENTION_BLOCK)
    ((k, r),) = _declined(t)
    said = in_context(t, k, r)[0]
    assert (f"the attention block at {_claims(r)} that FusedAttentionBlock with a causal mask kind would form "
            "(rlxviz lacks it: mask_kind_keep; the compiler fix forms it; Q/K/V packed with it would be 320 wide "
            "instead of 192)") in said, said


def test_without_the_block_pass_the_words_say_it_is_not_in_the_pipeline():
    t = Pipeline(["fuse_shared_input_matmul"]).run(parallel_block("direct", False, None))
    ((k, r),) = _declined(t)
    assert (f"the attention block at {_claims(r)}, which does not form in this run (fuse_attention_block is not in "
            "the pipeline; Q/K/V packed with it would be 320 wide instead of 192)") in in_context(t, k, r)[0]


def test_where_the_block_formed_the_words_stay():
    for g in (case("16"), attention_layer(plain=True)):
        t = Pipeline.canonical().run(g)
        assert t.final.find(Op.FUSED_ATTENTION_BLOCK)
        ((k, r),) = _declined(t)
        assert "the attention block at attention (node " in r.message and in_context(t, k, r)[0] == r.message
        rows = [x for x in decision_rows(t) if x["guard"] == "merge_keeps_fusions"]
        assert [x["message"] for x in rows] == [r.message]


def test_cohere_chip_tooltip_says_why_the_matmul_was_left_out():
    """The `○ does not pay` chip's tooltip item after fuse_shared_input_matmul said which node was left out
    (`left out matmul (node 238, model.layers.0.mlp)`) but not why; it now carries the cost the table and `explain
    -v` say, made from the same record (`Rejection.costs`, `block_cost_in_context`): the block the interleaved RoPE
    gap holds back."""
    from costwords import cost_reason

    from rlxviz.app.panels import not_near_miss_mark
    from rlxviz.passes.guard import DOES_NOT_PAY
    from rlxviz.passes.why.places import places

    t = _cohere()
    declined = _declined(t)
    (k,) = {k for k, _ in declined}
    p = places(t, k)
    tip = not_near_miss_mark(p.faded, p.faded_at).replace("&#x27;", "'")
    for (_, r), item in zip(declined, p.faded[DOES_NOT_PAY], strict=True):
        said = in_context(t, k, r)[0]
        why = f"it would cost the attention block at {_claims(r)} {HELD}"
        assert cost_reason(t, r) == why and why in said, said
        assert f"(node {r.offending[0]}, {t.steps[k].before[r.offending[0]].path}) is not merged: {why}" in item, item
        assert why in tip, tip


def test_the_words_are_made_from_the_recorded_costs_not_read_back(monkeypatch):
    """The cost test records each left-out member's cost (`Rejection.costs`); the message in context, the text's line
    and the chip item's reason are made from that record, so a refusal whose message is worded otherwise (or names
    no cost at all) still says the same cost: nothing parses the words back."""
    from dataclasses import replace

    from costwords import cost_reason

    from rlxviz.passes.report import block_cost_in_context, left_out_line
    from rlxviz.passes.why.places import own_item, places

    t = Pipeline.canonical().run(parallel_block("rope", False, None))
    ((k, r),) = _declined(t)
    (c,) = r.costs.costs
    assert c.member == r.offending[0] and (c.width, c.qkv_width, c.epilogue) == (320, 192, None)
    assert t.steps[k].before[c.attention].op == Op.ATTENTION
    assert r.message == r.costs.message()  # the record's own words, as the rule made them
    said, why, line = in_context(t, k, r)[0], cost_reason(t, r), left_out_line(t, r)
    item = places(t, k).excused[DOES_NOT_PAY]
    assert why.startswith("it would cost the attention block at attention (node ") and why in said and why in line
    t = Pipeline.canonical().run(parallel_block("rope", False, None))  # a fresh run, worded otherwise before any view
    rs = t.steps[k].rejections
    rs[rs.index(r)] = other = replace(r, message="the cost test said no (worded otherwise)")
    assert cost_reason(t, other) == why and block_cost_in_context(t, other) == said == in_context(t, k, other)[0]
    assert left_out_line(t, other) == line and places(t, k).excused[DOES_NOT_PAY] == item
    bare = replace(r, costs=None)  # a refusal that records no costs: its message as it is
    assert cost_reason(t, bare) == "" and block_cost_in_context(t, bare) == r.message
    from rlxviz.passes.merge_costs import MergeCosts  # the message worded otherwise, in context too: the same reason

    monkeypatch.setattr(MergeCosts, "message", lambda self, *block: "left out: " + self.reason(*block))
    t = Pipeline.canonical().run(parallel_block("rope", False, None))
    ((k, r),) = _declined(t)
    assert r.message.startswith("left out: it would cost ") and cost_reason(t, r) == why
    assert places(t, k).excused[DOES_NOT_PAY] == [own_item(r, t)]  # the chip says what `explain` says, as worded
    assert why in own_item(r, t) and own_item(r, t).endswith(left_out_line(t, r).split(" [not profitable]: ")[1])


def test_each_member_says_its_own_cost():
    """Two members left out, one losing its epilogue and the attention block, one its epilogue alone: each its own
    cost, whatever its label holds (`;`, parentheses), then the members merged or the one left."""
    from rlxviz.passes.merge_costs import Cost, MergeCosts

    a = Cost(7, "a (node 7, p; q)", 9, "gelu", 3, "attention (node 3, x)", 96, 64)
    b = Cost(8, "b (node 8, r)", 10, "silu")
    two = MergeCosts((a, b), ("c", "d"))
    assert two.message() == ("a (node 7, p; q) is not merged: it would cost its gelu epilogue (gelu node 9) and the "
                             "attention block at attention (node 3, x) (Q/K/V packed with it would be 96 wide instead "
                             "of 64); b (node 8, r) is not merged: it would cost its silu epilogue (silu node 10); "
                             "merged: c, d")
    assert two.reason(lambda c: "THE BLOCK" if c is a else None) == ("it would cost its gelu epilogue (gelu node 9) "
                                                                      "and THE BLOCK; it would cost its silu epilogue "
                                                                      "(silu node 10)")
    assert MergeCosts((b,), ("c",)).message().endswith("; fewer than 2 matmuls would be left to merge (only c)")
    assert MergeCosts((b,)).message().endswith("; fewer than 2 matmuls would be left to merge")
