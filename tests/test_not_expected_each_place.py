"""A not-expected line of several places names each place's own nodes (newcomer report): deit's ORT-optimized layer 0
has the bias added after the residual at two places, o_proj's matmul and fc2's, and the line named only o_proj's
(fc2 only under -v). Each further place now says its own part of the reason, the shared rest once."""

from __future__ import annotations

from pathlib import Path

from rlxviz import session
from rlxviz.passes.why.excused import Excused, own_part

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"


def test_each_bias_after_residual_place_names_its_matmul():
    m = session.load(str(ZOO / "deit.ortopt.onnx"), 1, 8)
    trace = session.run_pipeline(m.graph, session.build_pipeline())
    layer0 = session.check_fusion(trace, m.name).layers[0]
    line = next(x for x in layer0.gap_refusals if x.startswith("fuse_matmul_bias_act.bias_after_residual"))
    assert "at 2 places" in line, line
    assert "model.layers.0.attention.o_proj" in line and "model.layers.0.mlp.fc2" in line, line
    assert "(the rest as at %" in line and line.count("SkipLayerNormalization") == 1, line


def test_a_further_place_says_its_own_part_and_a_same_reason_is_said_once():
    tail = "after which the rest of the reason is the same for both places here"
    first, other = f"a (node 1, p.q) {tail}", f"a (node 5, p.fc2) {tail}"
    assert own_part(other, first, 1) == "a (node 5, p.fc2) ... (the rest as at %1)"
    assert own_part("short (node 5)", "short (node 1)", 1) == "short (node 5)"  # no long shared tail: whole
    x = Excused("r.p", "g", first, "why", {1: "p", 5: "p"}, reasons={5: other})
    assert x.line == (f"r.p (g) at 2 places, %1 (p) and %5 (p): at %1: {first}; at %5: a (node 5, p.fc2) ... "
                      "(the rest as at %1); why it is not expected here: why")
    assert Excused("r.p", "g", first, "why", {1: "p", 5: "p"}).line.count("at %") == 1  # one reason: said once
