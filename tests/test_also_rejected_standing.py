"""Every `also rejected` line says its standing (newcomer report): granite in float16 printed `also rejected:
canonicalize_exported.where_bias: bias_fills` under a fused layer, with no word on whether it counts. The line now
ends as the other refusal lines do: a near-miss (the chips' ✗) not counted against a fused layer, or counted against
a layer not fused. (Granite's own line is gone since: its f16 fill is f16's min, and the sum the model's own term.)"""

from __future__ import annotations

from pathlib import Path

from rlxviz import session
from rlxviz.passes.explain import Outcome
from rlxviz.passes.refusal_kinds import KINDS, MODEL_TERM
from rlxviz.passes.why.standing import standing
from rlxviz.passes.why.text import ALSO_REJECTED_COUNTED, ALSO_REJECTED_NOT_COUNTED, also_rejected_line

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"


def test_a_fused_layers_also_rejected_line_says_it_is_a_near_miss_not_counted():
    o = Outcome("canonicalize_exported", "canonicalize_exported.where_bias", "rejected", "scores_f32", "guard", "m", "",
                (7,), "not recognized")
    assert also_rejected_line(o, counted=False) == (
        "  also rejected: canonicalize_exported.where_bias: scores_f32 (not recognized); " + ALSO_REJECTED_NOT_COUNTED)


def test_granites_float16_padding_sum_is_the_models_own_term_not_an_also_rejected_near_miss():
    """Granite in float16 was the example of an `also rejected` near-miss: where_bias refused its padding sum for a
    fill of -65504 that is f16's own min. In f16 the sum is no where (|s| >= 16 rounds away from the fill), so the
    refusal is `fill_absorbs`, the model's own term: no `also rejected` line, no `✗`."""
    m = session.load(str(ZOO / "granite.fp16.onnx"), 1, 8)
    trace = session.run_pipeline(m.graph, session.build_pipeline())
    verdict = session.check_fusion(trace, m.name)
    text = verdict.render()
    assert not [ln for ln in text.splitlines() if ln.startswith("  also rejected: ")], text
    refused = [r for s in trace.steps for r in s.rejections if r.rule == "canonicalize_exported.where_bias"]
    assert len(refused) == 2 and {r.guard for r in refused} == {"fill_absorbs"}
    assert all(standing(trace, r) == (MODEL_TERM, KINDS[MODEL_TERM]) for r in refused)


def test_a_layer_not_fused_says_its_further_refusal_counts():
    o = Outcome("fuse_residual_ln", "fuse_residual_ln.residual", "rejected", "sum_single_user", "guard", "m", "",
                (7,), "illegal")
    assert also_rejected_line(o, counted=True) == (
        f"  also rejected: fuse_residual_ln.residual: sum_single_user (illegal); {ALSO_REJECTED_COUNTED}")
