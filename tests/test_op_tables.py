"""Every op against every table: each IR op has its facts (`SPECS`: signature, family, roles, ONNX name, FLOPs,
activation flags), a shape rule (`RULES`), a NumPy reference (`IMPLS`, or a decomposition for a fused op), an MLX
lowering and an ONNX form, and the four agree on a sample graph: reference == MLX == ONNX Runtime on the exported
file. Adding an op is its `Op` member, its `SPECS` entry, its implementations and its sample here: forgetting the
sample fails `test_every_primitive_op_has_a_sample`, and every other table (families, activation lists, the
kernels' `KERNEL_ACTS`, the ONNX name tables, the roofline's FLOPs) is derived from `SPECS` and checked below,
including against the C++ kernels' activation list."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from rlxviz.ir import Builder, Graph, Op, ops
from rlxviz.ir.fused import DECOMPOSITIONS
from rlxviz.ir.infer import RULES
from rlxviz.ir.onnx_op import encode
from rlxviz.ir.ops import FUSED, LEAF, SPECS, OpSpec
from rlxviz.models.onnx.export import EXPORTS, export_onnx, exporter
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


# -- the op facts (`OpSpec`) and the tables derived from them -------------------------------------------------------

KERNELS = Path(__file__).resolve().parents[1] / "rlxviz" / "kernels"


def test_every_op_has_its_facts():
    """A primitive's FLOPs and ONNX form are facts of its spec (a fused op's are its decomposition's), and a
    registered exporter is never shadowed by a spec name it ignores."""
    for op in Op:
        spec = SPECS[op]
        assert (spec.flops is None) == (op in FUSED), op
        assert op in FUSED or op in LEAF or exporter(op) is not None, op
        assert ops.family(op) != "other" or spec.kind == "host", op
    assert not set(EXPORTS) & (LEAF | FUSED)


def test_the_families_and_activation_lists_are_the_specs():
    kind = {op: SPECS[op].kind for op in Op}
    assert ops.UNARY == {op for op in Op if kind[op] == "unary"}
    assert ops.COMMUTATIVE == {op for op in Op if SPECS[op].commutative} and ops.COMMUTATIVE <= ops.BINARY
    assert ops.FUSED == {op for op in Op if kind[op] == "fused"} == {op for op in Op if op.value[0].isupper()}
    assert ops.EPILOGUE_ACTIVATIONS == tuple(op for op in Op if SPECS[op].epilogue)
    assert set(ops.EPILOGUE_ACTIVATIONS) <= set(ops.KERNEL_ACTIVATIONS) <= ops.ACTIVATIONS
    assert set(ops.MLP_ACTIVATIONS) | set(ops.GATE_ACTIVATIONS) <= ops.ACTIVATIONS
    assert [SPECS[a].gate for a in ops.GATE_ACTIVATIONS] == list(range(len(ops.GATE_ACTIVATIONS)))
    names = tuple(sorted(a.value for a in ops.ACTIVATIONS))
    assert SPECS[Op.FUSED_MATMUL_BIAS_ACT].attrs["activation"].choices == (None, *names)
    assert SPECS[Op.FUSED_TRANSFORMER_LAYER].attrs["activation"].choices == names
    swiglu = SPECS[Op.FUSED_SWIGLU].attrs["activation"]
    assert swiglu.choices == tuple(a.value for a in ops.GATE_ACTIVATIONS) and swiglu.default == "silu"

    from rlxviz.passes import guard
    from rlxviz.runtime.lowering import KERNEL_ACTS

    assert guard.EPILOGUE_ACTIVATIONS == tuple(a.value for a in ops.EPILOGUE_ACTIVATIONS)
    assert KERNEL_ACTS == {a.value for a in ops.KERNEL_ACTIVATIONS}


def test_a_misspelt_spec_fails_when_written():
    with pytest.raises(ValueError, match="kind 'unray'"):
        OpSpec((1,), kind="unray")
    with pytest.raises(ValueError, match="activation=True"):
        OpSpec((1,), kind="unary", epilogue=True)
    with pytest.raises(TypeError):
        OpSpec((1,), kind="unary", kernel=True)  # type: ignore[call-arg]


def test_the_roofline_flops_are_the_specs():
    from rlxviz.session.roofline import TRANSCENDENTAL_FLOPS, op_flops

    for op, make in SAMPLES.items():
        b = Builder(f"op_{op.value}")
        make(b)
        g = b.build()
        for n in g.compute_nodes():
            per = SPECS[n.op].flops
            want = per(g, n) if callable(per) else per * int(np.prod(n.shape))
            assert op_flops(g, n) == want, (op, n.op)
    assert TRANSCENDENTAL_FLOPS == {op: SPECS[op].flops for op in ops.ELEMENTWISE
                                    if isinstance(SPECS[op].flops, int) and SPECS[op].flops > 1}
    assert TRANSCENDENTAL_FLOPS[Op.GELU] == ops.ERF_FLOPS + 4


def test_the_onnx_name_tables_are_the_specs_inverse():
    named = [op for op in Op if SPECS[op].onnx is not None]
    assert len({SPECS[op].onnx for op in named}) == len(named)  # no ONNX operator is two ops
    assert ops.ONNX_OPS == {SPECS[op].onnx: op for op in named}
    assert all(ops.onnx_op(name) == op and ops.onnx_name(op) == name for name, op in ops.ONNX_OPS.items())
    assert set(ops.ONNX_UNARY.values()) == {op for op in named if op in ops.UNARY | ops.PREDICATES}
    assert set(ops.ONNX_BINARY.values()) == {op for op in named if op in ops.BINARY | ops.COMPARE}
    assert ops.ONNX_BINARY["Max"] == Op.MAX and ops.ONNX_UNARY["IsNaN"] == Op.ISNAN and ops.onnx_op("Gelu") is None


@pytest.mark.parametrize("op", [op for op in SAMPLES if SPECS[op].onnx], ids=lambda op: op.value)
def test_an_op_with_an_onnx_name_exports_to_it_and_imports_to_itself(op, tmp_path):
    """`OpSpec.onnx` is a two-way fact: the exported sample holds that ONNX operator and the importer maps it back
    to the op (so the importer's name tables, derived from the spec, cannot drift from the exporter's)."""
    import onnx

    from rlxviz.models.onnx_import import load_onnx

    b = Builder(f"op_{op.value}")
    SAMPLES[op](b)
    g = b.build()
    model = export_onnx(g, _weights(g))
    assert SPECS[op].onnx in {n.op_type for n in model.graph.node}
    onnx.save(model, str(tmp_path / "m.onnx"))
    assert op in {n.op for n in load_onnx(tmp_path / "m.onnx").graph}


def test_the_kernels_activation_lists_are_the_specs():
    """The C++ kernels' activation list, written in `act.h` (the enum and `act<A>`'s branches), `common.h`
    (`parse_act`), `vmath.h` (the formulas), the two binding docstrings and the package docstring, is `none`
    plus the spec's kernel activations (`OpSpec.kernel_act`), in `Op`'s order."""
    want = ["none", *(a.value for a in ops.KERNEL_ACTIVATIONS)]
    src = KERNELS / "src"
    act_h = (src / "act.h").read_text()
    enum = re.search(r"enum class Act \{([^}]*)\}", act_h)
    assert enum is not None
    assert [m.strip() for m in enum.group(1).split(",") if m.strip()] == want
    branches = re.findall(r"A == Act::(\w+)\) return vm::(\w+)\(x\)", act_h)
    assert [a for a, _ in branches] == want[1:] and all(a == f for a, f in branches)
    parsed = re.findall(r'if \(act == "(\w+)"\) return Act::(\w+);', (src / "common.h").read_text())
    assert [a for a, _ in parsed] == want and all(a == m for a, m in parsed)
    vmath = (src / "vmath.h").read_text()
    assert all(re.search(rf"inline float {a}\(float x\)", vmath) for a in want[1:])
    docs = re.findall(r"act one of ([\w ,\n\"]+?)\.", (src / "bindings.cpp").read_text())
    docs += re.findall(r"`act` one of ([\w ,\n]+?)\.", (KERNELS / "__init__.py").read_text())
    assert len(docs) == 3
    for doc in docs:
        assert re.findall(r"\w+", doc.replace('"', "")) == want, doc
