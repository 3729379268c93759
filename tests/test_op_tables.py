"""Every op against every table: each IR op has a signature (`SPECS`), a shape rule (`RULES`), a NumPy
reference (`IMPLS`, or a decomposition for a fused op), an MLX lowering and an ONNX form, and the four agree on
a sample graph: reference == MLX == ONNX Runtime on the exported file. Adding an op without a sample here fails
`test_every_primitive_op_has_a_sample`, so no table can be forgotten."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from rlxviz.ir import Builder, Graph, Op
from rlxviz.ir.fused import DECOMPOSITIONS
from rlxviz.ir.infer import RULES
from rlxviz.ir.onnx_op import encode
from rlxviz.ir.ops import FUSED, LEAF, SPECS
from rlxviz.models.onnx.export import export_onnx
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LOWERINGS, LoweringOptions
from rlxviz.runtime.reference import IMPLS

rng = np.random.default_rng(24)
X = rng.standard_normal((2, 3, 8)).astype(np.float32) * 2
X[0, 0, 0] = X[0, 0, 1]  # a tie for argmax: the first index wins
IDS = np.array([[0, 3, 1], [2, 2, 5]], dtype=np.int64)


def _unary(op: Op) -> Callable[[Builder], None]:
    return lambda b: b.output(b.unary(op, b.input("x", X.shape)))


def _binary(op: Op) -> Callable[[Builder], None]:
    def make(b: Builder) -> None:
        x = b.input("x", X.shape)
        y = b.add(b.mul(x, 0.5), 0.25)
        b.output(b.emit(op, (x, y)))
    return make


def _x(b: Builder):
    return b.input("x", X.shape)


SAMPLES: dict[Op, Callable[[Builder], None]] = {
    **{op: _binary(op) for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN, Op.EQ, Op.NE, Op.LT, Op.LE,
                                  Op.GT, Op.GE)},
    Op.POW: lambda b: b.output(b.pow(b.abs(_x(b)), 1.5)),
    **{op: _unary(op) for op in (Op.GELU, Op.GELU_TANH, Op.SILU, Op.RELU, Op.RELU2, Op.SIGMOID, Op.TANH, Op.EXP, Op.NEG,
                                 Op.ERF, Op.ABS, Op.SIN, Op.COS, Op.FLOOR, Op.ISNAN)},
    Op.LOG: lambda b: b.output(b.log(b.add(b.abs(_x(b)), 0.5))),
    Op.SQRT: lambda b: b.output(b.sqrt(b.abs(_x(b)))),
    Op.RSQRT: lambda b: b.output(b.rsqrt(b.add(b.abs(_x(b)), 0.5))),
    Op.WHERE: lambda b: b.output(b.where(b.gt(_x(b), 0.0), 1.0, -1.0)),
    Op.CAST: lambda b: b.output(b.cast(_x(b), "f16")),
    Op.MATMUL: lambda b: b.output(b.matmul(_x(b), b.param("w", (8, 4)))),
    Op.REDUCE_SUM: lambda b: b.output(b.reduce_sum(_x(b), (1,), keepdims=True)),
    Op.REDUCE_MEAN: lambda b: b.output(b.reduce_mean(_x(b), (2,))),
    Op.REDUCE_MAX: lambda b: b.output(b.reduce_max(_x(b), (0, 2))),
    Op.SOFTMAX: lambda b: b.output(b.softmax(_x(b), -1)),
    Op.ARGMAX: lambda b: b.output(b.argmax(_x(b), 2)),
    Op.CUMSUM: lambda b: (x := _x(b), b.output(b.cumsum(x, 1), b.cumsum(x, 2, exclusive=True, reverse=True),
                                               b.cumsum(b.input("ids", IDS.shape, "i64"), 1))),
    Op.LAYER_NORM: lambda b: b.output(b.layer_norm(_x(b), b.param("g", (8,)), b.param("bt", (8,)), 1e-5)),
    Op.RMS_NORM: lambda b: b.output(b.rms_norm(_x(b), b.param("g", (8,)), eps=1e-6)),
    Op.RESHAPE: lambda b: b.output(b.reshape(_x(b), (6, 8))),
    Op.TRANSPOSE: lambda b: b.output(b.transpose(_x(b), (2, 0, 1))),
    Op.NARROW: lambda b: b.output(b.narrow(_x(b), 2, 3, 4)),
    Op.CONCAT: lambda b: b.output(b.concat([_x(b), b.param("c", (2, 1, 8))], 1)),
    Op.EXPAND: lambda b: b.output(b.expand(b.reshape(b.narrow(_x(b), 0, 0, 1), (1, 3, 8)), (4, 3, 8))),
    Op.GATHER: lambda b: b.output(b.gather(b.param("table", (6, 8)), b.input("ids", IDS.shape, "i64"))),
    Op.PAD: lambda b: (x := _x(b), b.output(b.pad(x, (0, 1, 3, 0, 0, 2)), b.pad(x, (1, 0, 0, 0, 2, 1), value=-1.5),
                                            b.pad(x, (0, 2, 7, 0, 1, 3), "reflect"),
                                            b.pad(x, (1, 0, 2, 0, 3, 0), "edge"),
                                            b.pad(b.input("ids", IDS.shape, "i64"), (0, 1, 0, 2), value=7))),
    Op.ATTENTION: lambda b: (x := _x(b), b.output(b.attention(x, x, x, num_heads=2, head_dim=4))),
    Op.ROPE: lambda b: (x := _x(b), t := (b.param("cos", (3, 2)), b.param("sin", (3, 2))),
                        b.output(b.rope(x, *t, 4), b.rope(x, *t, 4, interleaved=True),
                                 b.rope(x, *t, 8, n_rot=4, interleaved=True))),
    Op.ONNX_OP: lambda b: b.output(b.emit(Op.ONNX_OP, (_x(b),), op_type="Hardmax", node=encode(
        helper.make_node("Hardmax", ["a"], ["y"], axis=-1)), opset=18, shape=X.shape, dtype="f32")),
}


def _weights(g: Graph) -> dict[str, np.ndarray]:
    return {n.attrs["name"]: rng.standard_normal(n.shape).astype(np.float32) for n in g.params}


def _feeds(g: Graph) -> dict[str, np.ndarray]:
    return {n.attrs["name"]: X if n.attrs["name"] == "x" else IDS for n in g.inputs}


def test_every_op_has_a_signature_a_shape_rule_and_a_reference():
    for op in Op:
        assert op in SPECS, op
        if op in LEAF:
            continue
        assert op in RULES, op
        assert (op in IMPLS) != (op in DECOMPOSITIONS), op  # exactly one NumPy meaning
        assert op in FUSED or op in LOWERINGS, op


def test_every_primitive_op_has_a_sample():
    assert set(SAMPLES) == {op for op in Op if op not in LEAF | FUSED}


@pytest.mark.parametrize("op", list(SAMPLES), ids=lambda op: op.value)
def test_reference_mlx_and_onnx_runtime_agree(op):
    b = Builder(f"op_{op.value}")
    SAMPLES[op](b)
    g = b.build()
    assert op in {n.op for n in g}
    feeds, weights = _feeds(g), _weights(g)
    want = run_reference(g, feeds, weights)
    got = MlxExecutor(LoweringOptions(fast_math=False, compile_fused=False)).run(g, feeds, weights)
    model = export_onnx(g, weights)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    from_ort = sess.run(None, feeds)
    for w, m, o in zip(want, got, from_ort, strict=True):
        m = np.asarray(m)
        assert m.shape == w.shape == o.shape and o.dtype == w.dtype
        tol = 2e-3 if w.dtype == np.float16 else 1e-5
        np.testing.assert_allclose(m.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)
        np.testing.assert_allclose(o.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)
