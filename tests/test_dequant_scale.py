"""A scale between a matmul and its bias (weight-only quantization's dequantize scale, issue 38 case n4-09): the
mul is named (`fuse_matmul_bias_act.scale_before_bias` / `scale_before_act`, not recognized), the layer is not
"fused as expected" with the matmul left out but "fused as far as rlxviz's ops go" (nothing in the model to change:
the scale is the quantized weight's own; the compiler fix is an epilogue scale operand, exit 0), and no version
changes the numbers. The control (n4-09c: the scale
applied to the weight before the matmul) fuses as before. Two more graphs of the kind: no bias (gelu right after
the scale), and a scalar scale written `mul(s, mm)` with `add(bias, ...)` and silu; and graphs that are not of the
kind (a scaled LoRA branch added to the base projection, attention scores) get no such rejection."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from clirun import run

from rlxviz.ir import Builder, DType, Graph, Op, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference
from rlxviz.session import check_fusion

CASES = Path(__file__).parent / "data" / "cases"
N409 = CASES / "n4-09-dequant-scale-after-matmul.rlx"
N409C = CASES / "n4-09c-dequant-before-matmul-control.rlx"
GUARDS = ("scale_before_bias", "scale_before_act")


def scaled_mlp(bias: bool = True, scalar: bool = False, swapped: bool = False, act: str = "gelu") -> Graph:
    """act(x @ cast(Wq) * s [+ b]) -> fc2, the scale `[256]` (or a scalar const), f16 weight cast to f32."""
    b = Builder("scaled_mlp")
    x = b.input("hidden_states", (2, 8, 64))
    with b.scope("model.layers.0.mlp"):
        w = b.cast(b.param("fc1.qweight", (64, 256), DType.f16), DType.f32)
        mm = b.matmul(x, w)
        s = b.const(0.02) if scalar else b.param("fc1.weight_scale", (256,))
        y = b.mul(s, mm) if swapped else b.mul(mm, s)
        if bias:
            bb = b.param("fc1.bias", (256,))
            y = b.add(bb, y) if swapped else b.add(y, bb)
        y = b.gelu(y) if act == "gelu" else b.silu(y)
        out = b.linear(y, b.param("fc2.weight", (256, 64)), b.param("fc2.bias", (64,)))
    b.output(out)
    return b.build()


def lora(scalar_scale: float = 2.0) -> Graph:
    """base = x @ W + b; out = gelu(base + (x @ A) @ B * alpha): the scaled branch is added to a full-size tensor."""
    b = Builder("lora")
    x = b.input("hidden_states", (2, 8, 64))
    with b.scope("model.layers.0.mlp"):
        base = b.linear(x, b.param("fc1.weight", (64, 256)), b.param("fc1.bias", (256,)))
        branch = b.mul(b.matmul(b.matmul(x, b.param("lora_A", (64, 8))), b.param("lora_B", (8, 256))),
                       b.const(scalar_scale))
        y = b.gelu(b.add(base, branch))
        out = b.linear(y, b.param("fc2.weight", (256, 64)), b.param("fc2.bias", (64,)))
    b.output(out)
    return b.build()


def numbers_equal(g: Graph, trace) -> None:
    rng = np.random.default_rng(0)
    feeds = {n.name: rng.standard_normal(n.shape).astype(np.float32) for n in g.inputs}
    w = {n.name: (0.2 * rng.standard_normal(n.shape)).astype(n.dtype.numpy) for n in g.params}
    ref = run_reference(g, feeds, w)[0]
    for label, v in trace.versions()[1:]:
        np.testing.assert_allclose(run_reference(v, feeds, w)[0], ref, rtol=1e-5, atol=1e-5, err_msg=label)


def scale_rejections(trace) -> list:
    return [r for r in trace.rejections if r.guard in GUARDS]


def test_n4_09_names_the_scale_mul_and_the_layer_is_not_fused_as_expected(capsys):
    g = parse_ir(N409.read_text())
    trace = Pipeline.canonical().run(g)
    (r,) = scale_rejections(trace)
    mul = next(n for n in g if n.op == Op.MUL)
    assert r.rule == "fuse_matmul_bias_act.scale_before_bias" and r.subject == mul.id
    assert f"node {mul.id}" in r.message and "between the matmul and its bias add" in r.message
    assert "compiler" not in r.hint and r.fix  # nothing to change in the model; the fix is the compiler's
    status = check_fusion(trace, "n4-09").layers[0]
    assert status.gap_only and status.first is None and [g.by for g in status.gaps] == ["scale_before_bias"]
    numbers_equal(g, trace)
    code, out, err = run(capsys, "explain", N409)
    assert code == 0, out + err
    assert out.splitlines()[1].startswith("layer 0: fused as far as rlxviz's ops go: ") and "scale_before_bias" in out
    assert "rlxviz's ops lack: epilogue scale operand for FusedMatMulBiasAct" in out
    assert f"the scale mul (node {mul.id}" in out


def test_n4_09c_control_still_fuses_both_linears(capsys):
    g = parse_ir(N409C.read_text())
    trace = Pipeline.canonical().run(g)
    assert not scale_rejections(trace)
    assert sum(n.op == Op.FUSED_MATMUL_BIAS_ACT for n in trace.final) == 2
    numbers_equal(g, trace)
    code, out, _ = run(capsys, "explain", N409C)
    assert code == 0 and "1/1 layer(s) fused as expected" in out


@pytest.mark.parametrize("kwargs, rule", [
    ({"bias": False}, "fuse_matmul_bias_act.scale_before_act"),
    ({"scalar": True, "swapped": True, "act": "silu"}, "fuse_matmul_bias_act.scale_before_bias"),
])
def test_variants_of_the_kind_are_named_and_keep_the_numbers(kwargs, rule):
    g = scaled_mlp(**kwargs)
    trace = Pipeline.canonical().run(g)
    (r,) = scale_rejections(trace)
    assert r.rule == rule and g[r.subject].op == Op.MUL
    status = check_fusion(trace, "v").layers[0]
    assert status.gap_only and {g.by for g in status.gaps} <= set(GUARDS) and status.gaps
    numbers_equal(g, trace)


def test_not_the_kind_gets_no_scale_rejection():
    """A scaled LoRA branch added to the base projection is no bias add of the scaled matmul: quiet."""
    for g in (lora(), lora(0.5)):
        trace = Pipeline.canonical().run(g)
        assert not scale_rejections(trace)
        numbers_equal(g, trace)
