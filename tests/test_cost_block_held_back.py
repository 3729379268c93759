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
    -v` say, read from the same words (`in_context`, `block_cost_in_context`): the block the interleaved RoPE gap
    holds back."""
    from rlxviz.app.panels import not_near_miss_mark
    from rlxviz.passes.guard import DOES_NOT_PAY
    from rlxviz.passes.why.places import cost_reason, places

    t = _cohere()
    declined = _declined(t)
    (k,) = {k for k, _ in declined}
    p = places(t, k)
    tip = not_near_miss_mark(p.faded, p.faded_at).replace("&#x27;", "'")
    for (_, r), item in zip(declined, p.faded[DOES_NOT_PAY], strict=True):
        said = in_context(t, k, r)[0]
        why = f"it would cost the attention block at {_claims(r)} {HELD}"
        assert cost_reason(said) == why, said
        assert item.endswith(f"(node {r.offending[0]}, {t.steps[k].before[r.offending[0]].path}): {why}"), item
        assert why in tip, tip


def test_cost_reason_reads_each_member_and_nothing_else():
    from rlxviz.passes.why.places import cost_reason

    two = ("a (node 1, p) is not merged: it would cost X (y; z); b (node 2, q) is not merged: it would cost W; "
           "merged: c, d")
    assert cost_reason(two) == "it would cost X (y; z); it would cost W"
    assert cost_reason("m is not merged: it would cost V; fewer than 2 matmuls would be left") == "it would cost V"
    assert cost_reason("no cost named here") == ""
