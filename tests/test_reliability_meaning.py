"""Issue 40, one meaning or none: an ONNX model runs only under the file's own meaning.

* Inputs bind only symbolic dimensions: an array of another rank, or another size on a fixed dimension, is refused
  in one line naming the input, its shape and the file's (the handed `run_fixed_1x8.onnx` + `run_in_3x5x2.npz`,
  and variants); a dtype other than the input's (float64 for float32, int32 for int64) is refused with the cast
  to make, never converted silently.
* When ONNX Runtime refuses the file or the inputs, the run says so and stops: no other engine (onnx.reference)
  is asked to call version 0 equal.
* ONNX's checker runs before import: an initializer with dims [-1, 8], a ReduceMean with an `axes` attribute at
  opset 21, an attribute an op does not define, are refused in one line by every subcommand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from clirun import one_line, run
from onnx import TensorProto, helper, numpy_helper
from walltime import within

from rlxviz.models.onnx import OnnxImportError, load_onnx

DATA = Path(__file__).parent / "data" / "reliability" / "run_fixed_1x8"
BOUND_S = 10


def _model(tmp_path: Path, nodes, inputs, inits=(), opset=17, name="m.onnx", out_type=TensorProto.FLOAT) -> Path:
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    y = helper.make_tensor_value_info("y", out_type, None)
    m = helper.make_model(helper.make_graph(nodes, "g", ins, [y], initializer=list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset < 19 else 9
    p = tmp_path / name
    onnx.save(m, p)
    return p


def _npz(tmp_path: Path, name: str = "in.npz", **arrays) -> Path:
    p = tmp_path / name
    np.savez(p, **arrays)
    return p


def _run_refused(capsys, tmp_path, model: Path, inputs: Path, *fragments: str) -> str:
    out = tmp_path / "out.npz"
    with within(BOUND_S, f"run {model.name}"):
        code, _, err = run(capsys, "run", model, "-i", inputs, "-o", out)
    assert code == 2, err
    line = one_line(err, "run")
    for f in fragments:
        assert f in line, line
    assert "equals" not in err and not out.exists()
    return line


def test_handed_fixed_input_given_another_rank_is_refused(capsys, tmp_path):
    _run_refused(capsys, tmp_path, DATA / "run_fixed_1x8.onnx", DATA / "run_in_3x5x2.npz",
                 "input 'x' has shape [3, 5, 2] (rank 3)", "the file's input is [1, 8] (rank 2)")


@pytest.mark.parametrize("declared, given, fragments", [
    ([1, 8], (1, 9), ("input 'x' has shape [1, 9]", "the file fixes it to [1, 8] (dimension 1 is 8)")),
    ([1, 8], (2, 8), ("input 'x' has shape [2, 8]", "(dimension 0 is 1)")),
    ([1, 8], (8,), ("(rank 1)", "the file's input is [1, 8] (rank 2)")),
    (["batch", 8], (3, 4), ("input 'x' has shape [3, 4]", "the file fixes it to [batch, 8] (dimension 1 is 8)")),
    (["batch", "seq", 8], (2, 3), ("(rank 2)", "the file's input is [batch, seq, 8] (rank 3)")),
])
def test_an_array_binds_only_symbolic_dimensions(capsys, tmp_path, declared, given, fragments):
    p = _model(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, declared)])
    _run_refused(capsys, tmp_path, p, _npz(tmp_path, x=np.ones(given, np.float32)), *fragments)


def test_symbolic_dimensions_still_take_the_arrays_sizes(capsys, tmp_path):
    p = _model(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, ["batch", "seq", 8])])
    x = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)
    code, _, err = run(capsys, "run", p, "-i", _npz(tmp_path, x=x), "-o", tmp_path / "o.npz")
    assert code == 0 and "equals the ONNX model (ONNX Runtime" in err, err
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], np.maximum(x, 0))


@pytest.mark.parametrize("file_type, array, fragments", [
    (TensorProto.FLOAT, np.ones((1, 8), np.float64), ("input 'x' is float64, the graph needs f32", "astype")),
    (TensorProto.FLOAT, np.ones((1, 8), np.float16), ("input 'x' is float16, the graph needs f32",)),
    (TensorProto.INT64, np.ones((1, 8), np.int32), ("input 'x' is int32, the graph needs i64",)),
])
def test_an_input_of_another_dtype_is_refused_with_the_cast_to_make(capsys, tmp_path, file_type, array, fragments):
    node = helper.make_node("Relu", ["x"], ["y"]) if file_type == TensorProto.FLOAT else \
        helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)
    p = _model(tmp_path, [node], [("x", file_type, [1, 8])])
    _run_refused(capsys, tmp_path, p, _npz(tmp_path, x=array), *fragments, "not converted silently")


def test_time_refuses_another_dtype_too(capsys, tmp_path):
    p = _model(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [1, 8])])
    code, _, err = run(capsys, "time", p, "--inputs", _npz(tmp_path, x=np.ones((1, 8))), "-r", "1", "--warmup", "0")
    assert code == 2 and "is float64, the graph needs f32" in one_line(err, "time")


def test_onnx_runtime_refusing_the_file_stops_the_run(capsys, tmp_path):
    """Hardmax on float64 imports (a host node) but ONNX Runtime has no kernel for it: the run says so and stops,
    instead of calling version 0 equal through onnx.reference."""
    p = _model(tmp_path, [helper.make_node("Hardmax", ["x"], ["y"], axis=-1)], [("x", TensorProto.DOUBLE, ["b", 8])],
               out_type=TensorProto.DOUBLE)
    _run_refused(capsys, tmp_path, p, _npz(tmp_path, x=np.random.default_rng(0).random((2, 8))),
                 "ONNX Runtime", "refuses m.onnx", "Hardmax", "not run under another engine")


def test_onnx_runtime_refusing_the_inputs_stops_the_run(capsys, tmp_path, monkeypatch):
    """Should inputs reach ONNX Runtime that it refuses (its own checks, here a session whose run raises), the
    comparison says so and stops; onnx.reference is never asked."""
    import onnxruntime as ort

    class Refusing:
        def __init__(self, *a, **k):
            pass

        def run(self, *a, **k):
            raise ort.capi.onnxruntime_pybind11_state.InvalidArgument(
                "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: x")

    def no_reference(*a, **k):
        raise AssertionError("onnx.reference was asked")

    monkeypatch.setattr(ort, "InferenceSession", Refusing)
    monkeypatch.setattr("onnx.reference.ReferenceEvaluator", no_reference)
    p = _model(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, ["b", 8])])
    line = _run_refused(capsys, tmp_path, p, _npz(tmp_path, x=np.ones((2, 8), np.float32)),
                        "refuses these inputs for m.onnx", "Got invalid dimensions for input: x")
    assert "[ONNXRuntimeError]" not in line


def _neg_dims(tmp_path: Path) -> Path:
    w = numpy_helper.from_array(np.ones((1, 8), np.float32), "w")
    w.dims[:] = [-1, 8]
    return _model(tmp_path, [helper.make_node("Add", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, [1, 8])], [w],
                  name="neg.onnx")


CHECKER = {
    "initializer_dims_minus_1": (_neg_dims, "Negative dimension value (tensor name: w)"),
    "reduce_mean_axes_attr_opset21": (
        lambda t: _model(t, [helper.make_node("ReduceMean", ["x"], ["y"], axes=[1])],
                         [("x", TensorProto.FLOAT, [1, 8])], opset=21, name="rm.onnx"),
        "Unrecognized attribute: axes for operator ReduceMean"),
    "reduce_sum_axes_attr_opset13": (
        lambda t: _model(t, [helper.make_node("ReduceSum", ["x"], ["y"], axes=[1])],
                         [("x", TensorProto.FLOAT, [1, 8])], opset=13, name="rs.onnx"),
        "Unrecognized attribute: axes for operator ReduceSum"),
    "relu_with_an_attribute": (
        lambda t: _model(t, [helper.make_node("Relu", ["x"], ["y"], alpha=0.5)], [("x", TensorProto.FLOAT, [1, 8])],
                         name="relu.onnx"),
        "Unrecognized attribute: alpha for operator Relu"),
}


@pytest.mark.parametrize("case", list(CHECKER))
@pytest.mark.parametrize("command, extra", [
    ("run", ("-i", "{tmp}/in.npz", "-o", "{tmp}/o.npz")), ("explain", ()), ("time", ("-r", "1", "--warmup", "0")),
    ("ir", ()), ("render", ("-o", "{tmp}/g.svg")), ("export", ("{tmp}/g.onnx",)), ("overlay", ()),
])
def test_the_onnx_checker_refuses_before_import_in_every_subcommand(capsys, tmp_path, case, command, extra):
    make, fragment = CHECKER[case]
    p = make(tmp_path)
    _npz(tmp_path, x=np.ones((1, 8), np.float32))
    args = [a.format(tmp=tmp_path) for a in extra]
    with within(BOUND_S, f"{command} {case}"):
        code, _, err = run(capsys, command, p, *args)
    assert code == 2, err
    line = one_line(err, command)
    assert "rejected by the ONNX checker" in line and fragment in line and p.name in line, line
    assert not any(tmp_path.glob("o.npz")) and not any(tmp_path.glob("g.*"))


def test_the_checker_does_not_refuse_an_output_without_a_shape(tmp_path):
    """ONNX's checker wants a shape on every graph output, ONNX Runtime does not: a file without one still loads
    (every model of these tests leaves the output's shape out)."""
    p = _model(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [1, 8])])
    assert not onnx.load(str(p)).graph.output[0].type.tensor_type.HasField("shape")
    assert load_onnx(p).graph is not None
    assert not onnx.load(str(p)).graph.output[0].type.tensor_type.HasField("shape")  # the file is unchanged


def test_the_checker_leaves_the_callers_proto_unchanged(tmp_path):
    from rlxviz.models.onnx.validate import validate

    p = _model(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [1, 8])])
    proto = onnx.load(str(p))
    validate(proto)
    assert not proto.graph.output[0].type.tensor_type.HasField("shape")
    with pytest.raises(OnnxImportError, match="rejected by the ONNX checker"):
        validate(onnx.load(str(_neg_dims(tmp_path))))


def test_one_symbolic_dimension_binds_one_size_across_inputs(capsys, tmp_path):
    p = _model(tmp_path, [helper.make_node("Add", ["x", "m"], ["y"])],
               [("x", TensorProto.FLOAT, ["batch", 8]), ("m", TensorProto.FLOAT, ["batch", 8])])
    _run_refused(capsys, tmp_path, p, _npz(tmp_path, x=np.ones((2, 8), np.float32), m=np.ones((3, 8), np.float32)),
                 "its dimension 0 ('batch') is 3, but input 'x' binds 'batch' to 2")
    code, _, err = run(capsys, "run", p, "-i", _npz(tmp_path, "ok.npz", x=np.ones((2, 8), np.float32),
                                                    m=np.ones((2, 8), np.float32)), "-o", tmp_path / "o.npz")
    assert code == 0, err
