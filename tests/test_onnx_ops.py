"""The ops Hugging Face exports use, imported with computed (not constant) operands, each equal to ONNX's own
reference evaluator on the same model and inputs: IsNaN, Abs, Sin, Cos, Floor, Clip (both bounds, one, none),
CumSum (exclusive/reverse, int position ids), ArgMax, strided Slice (positive and negative steps), and
GatherElements with computed indices on each axis (RoBERTa's token-type buffer read at the position ids)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from rlxviz.ir import Op
from rlxviz.models.onnx import load_onnx
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions

rng = np.random.default_rng(20)
X = (rng.standard_normal((2, 4, 6)) * 3).astype(np.float32)
X[1, 2, 3] = np.nan


def _i64(name, v):
    return numpy_helper.from_array(np.asarray(v, dtype=np.int64), name)


def _f32(name, v):
    return numpy_helper.from_array(np.asarray(v, dtype=np.float32), name)


def _model(tmp_path: Path, nodes, inits=(), inputs=(("x", TensorProto.FLOAT, [2, 4, 6]),), out_type=None):
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    out = helper.make_tensor_value_info("y", out_type or TensorProto.FLOAT, None)
    g = helper.make_graph(nodes, "g", ins, [out], initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    return p, m


def _check(tmp_path, nodes, inits=(), feeds=None, inputs=None, out_type=None, mlx=True, want=None):
    feeds = feeds or {"x": X}
    kw = {} if inputs is None else {"inputs": inputs}
    p, m = _model(tmp_path, nodes, inits, out_type=out_type, **kw)
    want = ReferenceEvaluator(m).run(None, feeds)[0] if want is None else want
    model = load_onnx(p, input_shapes={k: v.shape for k, v in feeds.items()})
    got = run_reference(model.graph, feeds, model.weights)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    if mlx:
        out = MlxExecutor(LoweringOptions(fast_math=False)).run(model.graph, feeds, model.weights)[0]
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
    return model


@pytest.mark.parametrize("op", ["IsNaN", "Abs", "Sin", "Cos", "Floor"])
def test_unary_ops(tmp_path, op):
    nodes = [helper.make_node(op, ["x"], ["u"])]
    if op == "IsNaN":
        nodes.append(helper.make_node("Cast", ["u"], ["y"], to=TensorProto.FLOAT))
    else:
        nodes[0].output[0] = "y"
    _check(tmp_path, nodes)


@pytest.mark.parametrize("bounds", [("lo", "hi"), ("lo", ""), ("", "hi"), ()])
def test_clip(tmp_path, bounds):
    _check(tmp_path, [helper.make_node("Clip", ["x", *bounds], ["y"])], [_f32("lo", -1.5), _f32("hi", 2.0)])


@pytest.mark.parametrize("exclusive,reverse,axis", [(0, 0, 1), (1, 0, 2), (0, 1, -1), (1, 1, 0)])
def test_cumsum(tmp_path, exclusive, reverse, axis):
    _check(tmp_path, [helper.make_node("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)],
           [_i64("a", axis)], feeds={"x": np.nan_to_num(X)})


def test_cumsum_of_a_mask_gives_roberta_position_ids(tmp_path):
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=np.int64)
    nodes = [helper.make_node("CumSum", ["m", "a"], ["c"]), helper.make_node("Mul", ["c", "m"], ["p"]),
             helper.make_node("Add", ["p", "one"], ["y"])]
    _check(tmp_path, nodes, [_i64("a", 1), _i64("one", 1)], feeds={"m": mask},
           inputs=(("m", TensorProto.INT64, [2, 5]),), out_type=TensorProto.INT64)


@pytest.mark.parametrize("axis,keepdims", [(2, 1), (1, 0), (-1, 0)])
def test_argmax(tmp_path, axis, keepdims):
    x = np.nan_to_num(X)
    x[0, 0, :2] = 5.0  # a tie: the first index
    _check(tmp_path, [helper.make_node("ArgMax", ["x"], ["y"], axis=axis, keepdims=keepdims)], feeds={"x": x},
           out_type=TensorProto.INT64)


@pytest.mark.parametrize("starts,ends,axes,steps", [([0], [6], [2], [2]), ([5], [-100], [2], [-1]),
                                                    ([1, 0], [4, 6], [1, 2], [2, 3]), ([-1], [0], [1], [-2])])
def test_strided_slice(tmp_path, starts, ends, axes, steps):
    inits = [_i64("s", starts), _i64("e", ends), _i64("a", axes), _i64("t", steps)]
    _check(tmp_path, [helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])], inits)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_gather_elements_with_computed_indices(tmp_path, axis):
    d = X.shape[axis]
    shape = list(X.shape)
    shape[axis] = 5  # indices may be longer or shorter than the data along the gathered axis
    idx = rng.integers(-d, d, size=shape)
    nodes = [helper.make_node("Identity", ["i"], ["j"]), helper.make_node("GatherElements", ["x", "j"], ["y"],
                                                                            axis=axis)]
    # onnx.reference 1.2x refuses a negative axis here, so the expectation is NumPy's take_along_axis (the spec)
    want = np.take_along_axis(X, np.where(idx < 0, idx + d, idx), axis=axis)
    _check(tmp_path, nodes, feeds={"x": X, "i": idx.astype(np.int64)},
           inputs=(("x", TensorProto.FLOAT, [2, 4, 6]), ("i", TensorProto.INT64, list(idx.shape))), want=want)


def test_clip_with_min_above_max_gives_max_everywhere(tmp_path):
    """Valid ONNX: every element is max (min(max(x, lo), hi) with lo > hi); it was refused."""
    _check(tmp_path, [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], [_f32("lo", 20.0), _f32("hi", 5.0)],
           feeds={"x": np.nan_to_num(X)})


def test_argmax_select_last_index_runs_on_the_host(tmp_path):
    x = np.nan_to_num(X)
    x[0, 0, :3] = 9.0  # a tie of three: the last index wins
    m = _check(tmp_path, [helper.make_node("ArgMax", ["x"], ["y"], axis=2, keepdims=0, select_last_index=1)],
               feeds={"x": x}, out_type=TensorProto.INT64)
    assert any(n.op.value == "onnx_op" for n in m.graph)


def test_run_writes_each_output_under_its_name_in_its_dtype(tmp_path, capsys):
    """Integer outputs stay integers (an int64 cumsum past 2^24 was written as float32) under the ONNX names."""
    from clirun import run

    x = helper.make_tensor_value_info("x", TensorProto.INT64, [1, 3])
    outs = [helper.make_tensor_value_info(n, TensorProto.INT64, None) for n in ("total", "twice")]
    g = helper.make_graph([helper.make_node("CumSum", ["x", "a"], ["total"]),
                           helper.make_node("Add", ["total", "total"], ["twice"])], "g", [x], outs,
                          initializer=[_i64("a", 1)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "c.onnx")
    big = np.array([[2**40 + 1, 1, 2**53 + 1]], np.int64)
    np.savez(tmp_path / "in.npz", x=big)
    code, _, err = run(capsys, "run", tmp_path / "c.onnx", "-i", tmp_path / "in.npz", "-o", tmp_path / "o.npz")
    assert code == 0, err
    with np.load(tmp_path / "o.npz") as z:
        assert set(z.files) == {"total", "twice"} and z["total"].dtype == np.int64
        np.testing.assert_array_equal(z["total"], np.cumsum(big, axis=1))


@pytest.mark.parametrize("mode,pads,axes,fill", [
    ("constant", [0, 1, 2, 0, 0, 3], None, 0.0),          # Swin's window padding: zeros after the rows
    ("constant", [1, 0, 0, 2, 3, 1], None, -2.5),         # a fill value, both ends of every axis
    ("constant", [0, -1, 2, 0, 1, -2], None, 0.5),        # negative pads crop (a narrow, then the pad)
    ("constant", [2, 1], [-1], 1.0),                      # opset 18 axes: the last axis only
    ("reflect", [0, 3, 1, 1, 2, 5], None, None),          # mirrors without the edge: each pad < the axis size
    ("edge", [1, 0, 4, 0, 2, 1], None, None)])
def test_pad_is_an_ir_op_in_every_mode(tmp_path, mode, pads, axes, fill):
    ins = ["r", "p", "v" if fill is not None else ""] + (["ax"] if axes else [])
    inits = [_i64("p", pads)] + ([_f32("v", fill)] if fill is not None else []) + ([_i64("ax", axes)] if axes else [])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Pad", ins, ["y"], mode=mode)]
    import onnxruntime as ort  # onnx.reference refuses negative pads: ONNX Runtime's numbers

    _, m = _model(tmp_path, nodes, inits)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    model = _check(tmp_path, nodes, inits, want=want)
    assert Op.PAD in {n.op for n in model.graph} and Op.ONNX_OP not in {n.op for n in model.graph}


def test_pad_of_int_position_ids_keeps_the_dtype(tmp_path):
    ids = np.arange(8, dtype=np.int64).reshape(2, 4)
    nodes = [helper.make_node("Add", ["ids", "one"], ["s"]), helper.make_node("Pad", ["s", "p", "v"], ["y"])]
    _check(tmp_path, nodes, [_i64("one", 1), _i64("p", [0, 2, 0, 1]), _i64("v", 9)], feeds={"ids": ids},
           inputs=(("ids", TensorProto.INT64, [2, 4]),), out_type=TensorProto.INT64)


def test_pad_wrap_and_computed_pads_run_on_the_host(tmp_path):
    """`wrap` (opset 19) is not an IR pad mode; the pads computed from the input's values are not constant:
    both are valid forms, run on the host with ONNX's numbers."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Pad", ["r", "p"], ["y"], mode="wrap")]
    p, m = _model(tmp_path, nodes, [_i64("p", [0, 1, 2, 0, 0, 3])])
    m.opset_import[0].version = 19
    onnx.save(m, p)
    model = load_onnx(p)
    assert [n.attrs["op_type"] for n in model.graph if n.op == Op.ONNX_OP] == ["Pad"]
    want = ReferenceEvaluator(m).run(None, {"x": X})[0]
    np.testing.assert_allclose(run_reference(model.graph, {"x": X}, model.weights)[0], want)
