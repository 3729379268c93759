"""The matches table says a row's kind once (newcomer report): a place that keeps the model's own term read
`the model's own term` in the kind column and again in the why column (granite in float16: the where-mask kept as
the attention's additive operand). The why column holds the guard's kind only where it adds to the kind column."""

from __future__ import annotations

from pathlib import Path

from rlxviz import session
from rlxviz.app.explain import decision_rows
from rlxviz.passes.guard import MODEL_TERM

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"


def test_a_model_term_row_says_its_kind_once():
    m = session.load(str(ZOO / "granite.fp16.onnx"), 1, 8)
    rows = decision_rows(session.run_pipeline(m.graph, session.build_pipeline()))
    own = [r for r in rows if r["kind"] == MODEL_TERM]
    assert own, [r["kind"] for r in rows]
    assert all(MODEL_TERM not in r["why"] for r in own), [r["why"] for r in own]
    # a refusal whose guard's kind differs from its standing keeps it (the near-miss's "not recognized")
    other = [r for r in rows if r["kind"] not in ("fused", MODEL_TERM)]
    assert other and all(r["why"] for r in other), [(r["kind"], r["why"]) for r in other]
    assert all(r["kind"] not in r["why"] for r in rows if r["kind"] != "fused")
