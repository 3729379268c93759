"""A per-token sigmoid gate that scales a whole expert output (Qwen2-MoE's shared expert, issue 38 case n4-12) is a
scale, not a gated linear unit: no `unrecognized.glu`, the experts fuse as SwiGLU and the layer is fused as
expected. Two more graphs of the kind (the gate on a plain GELU MLP's output, the gate on one matmul of the same
input, the mul's operands swapped); a true GLU (a sigmoid gate of the value's own width) is still reported."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from clirun import run

from rlxviz.ir import Builder, Graph, Op, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.passes.unrecognized import unrecognized
from rlxviz.runtime import run_reference
from rlxviz.session import check_fusion

N412 = Path(__file__).parent / "data" / "cases" / "n4-12-moe-soft-routing-shared-expert.rlx"


def gated(kind: str) -> Graph:
    """sigmoid(x @ w_g) [B, S, gate_width] times a value [B, S, 64] from x: `mlp` (a GELU MLP's output, width-1
    gate), `matmul` (x @ W directly, width-1 gate, the mul's operands swapped), `glu` (x @ W_u with a gate of the
    same width 64: a true GLU)."""
    b = Builder(f"gated_{kind}")
    x = b.input("hidden_states", (2, 8, 64))
    with b.scope("model.layers.0.mlp"):
        width = 64 if kind == "glu" else 1
        gate = b.sigmoid(b.matmul(x, b.param("shared_expert_gate.weight", (64, width))))
        if kind == "mlp":
            h = b.gelu(b.linear(x, b.param("fc1.weight", (64, 128)), b.param("fc1.bias", (128,))))
            value = b.matmul(h, b.param("fc2.weight", (128, 64)))
            y = b.mul(value, gate)
        else:
            value = b.matmul(x, b.param("up.weight", (64, 64)))
            y = b.mul(gate, value)
        out = b.add(y, x)
    b.output(out)
    return b.build()


def numbers_equal(g: Graph, trace) -> None:
    rng = np.random.default_rng(0)
    feeds = {n.name: rng.standard_normal(n.shape).astype(np.float32) for n in g.inputs}
    w = {n.name: (0.2 * rng.standard_normal(n.shape)).astype(np.float32) for n in g.params}
    ref = run_reference(g, feeds, w)[0]
    for label, v in trace.versions()[1:]:
        np.testing.assert_allclose(run_reference(v, feeds, w)[0], ref, rtol=1e-5, atol=1e-5, err_msg=label)


def test_n4_12_shared_expert_gate_is_a_scale_and_the_layer_fuses(capsys):
    g = parse_ir(N412.read_text())
    trace = Pipeline.canonical().run(g)
    assert [u.family for u in unrecognized(trace)] == []
    assert sum(n.op == Op.FUSED_SWIGLU for n in trace.final) == 3
    status = check_fusion(trace, "n4-12").layers[0]
    assert status.fused, status.render()
    numbers_equal(g, trace)
    code, out, err = run(capsys, "explain", N412)
    assert code == 0, out + err
    assert "1/1 layer(s) fused as expected" in out and "glu" not in out.lower().replace("swiglu", "")


@pytest.mark.parametrize("kind", ["mlp", "matmul"])
def test_width_one_gates_are_not_glus(kind):
    g = gated(kind)
    trace = Pipeline.canonical().run(g)
    assert "glu" not in [u.family for u in unrecognized(trace)]
    numbers_equal(g, trace)


def test_a_true_sigmoid_glu_is_still_reported():
    g = gated("glu")
    trace = Pipeline.canonical().run(g)
    assert "glu" in [u.family for u in unrecognized(trace)]
