"""Every `also rejected` line says its standing (newcomer report): granite in float16 printed `also rejected:
canonicalize_exported.where_bias: bias_fills` under a fused layer, with no word on whether it counts. The line now
ends as the other refusal lines do: a near-miss (the chips' ✗) not counted against a fused layer, or counted against
a layer not fused."""

from __future__ import annotations

from pathlib import Path

from rlxviz import session
from rlxviz.passes.explain import Outcome
from rlxviz.passes.why.standing import standing
from rlxviz.passes.why.text import ALSO_REJECTED_COUNTED, ALSO_REJECTED_NOT_COUNTED, also_rejected_line

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"


def test_a_fused_layers_also_rejected_line_says_it_is_a_near_miss_not_counted():
    m = session.load(str(ZOO / "granite.fp16.onnx"), 1, 8)
    trace = session.run_pipeline(m.graph, session.build_pipeline())
    verdict = session.check_fusion(trace, m.name)
    text = verdict.render()
    lines = [ln for ln in text.splitlines() if ln.startswith("  also rejected: ")]
    assert len(lines) == 2, text
    assert all(ln.endswith("; " + ALSO_REJECTED_NOT_COUNTED) for ln in lines), lines
    assert all(layer.fused for layer in verdict.layers)
    # the words agree with the chips: the refusal is a near-miss (`standing` None: ✗)
    refused = [r for s in trace.steps for r in s.rejections if r.rule == "canonicalize_exported.where_bias"]
    assert refused and all(standing(trace, r) is None for r in refused if r.headline)


def test_a_layer_not_fused_says_its_further_refusal_counts():
    o = Outcome("fuse_residual_ln", "fuse_residual_ln.residual", "rejected", "sum_single_user", "guard", "m", "",
                (7,), "illegal")
    assert also_rejected_line(o, counted=True) == (
        f"  also rejected: fuse_residual_ln.residual: sum_single_user (illegal); {ALSO_REJECTED_COUNTED}")
