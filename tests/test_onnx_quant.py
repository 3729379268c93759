"""Quantized ONNX files (`models.onnx.handlers.quant`): quantize_dynamic output (esm.qdyn, handed), a QDQ model and a
quantize_dynamic MLP built here, each imported with ONNX Runtime's numbers on the reference and on MLX, with the
quantized tensors kept as int8/uint8 (the quantization a visible step of the graph)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlxviz.ir import DType, Graph, Op
from rlxviz.models.onnx import OnnxImportError, load_onnx
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"


def _ort(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(path: Path, feeds: dict[str, np.ndarray], want: list[np.ndarray], atol: float = 1e-5) -> None:
    m = load_onnx(path, input_shapes={k: v.shape for k, v in feeds.items()})
    trace = Pipeline.canonical().run(m.graph)
    assert not [s.error for s in trace.steps if s.error]
    ex = MlxExecutor(LoweringOptions(fast_math=False))
    for g in (m.graph, trace.final):
        for got in (run_reference(g, feeds, m.weights), [np.asarray(o) for o in ex.run(g, feeds, m.weights)]):
            for a, b in zip(got, want, strict=True):
                np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64),
                                           atol=atol, rtol=0)
    return m


def test_esm_quantize_dynamic_imports_with_onnx_runtimes_numbers():
    """Was: `ValueError: [DType.from_numpy] unsupported numpy dtype 'uint8'` on the quantized embedding's Gather."""
    d = dict(np.load(CASES / "esm.qdyn_io.npz"))
    feeds = {k: v for k, v in d.items() if not k.startswith("out:")}
    m = _check(CASES / "esm.qdyn.onnx", feeds, [d["out:last_hidden_state"]])
    dtypes = {n.dtype for n in m.graph.params}
    assert {DType.u8, DType.i8} <= dtypes  # the embedding table (u8) and the weights (i8) stay quantized
    made = {op for op, _, _ in m.meta["onnx_nodes"].values()}
    assert {"DynamicQuantizeLinear", "MatMulInteger", "DequantizeLinear"} <= made


def test_esm_qdyn_exported_versions_load_in_onnx_runtime_with_its_numbers(tmp_path):
    """`rlxviz export` of the input and the final version: ONNX Runtime runs each, with the file's numbers."""
    from rlxviz.models.onnx.export import export_onnx

    d = dict(np.load(CASES / "esm.qdyn_io.npz"))
    feeds = {k: v for k, v in d.items() if not k.startswith("out:")}
    m = load_onnx(CASES / "esm.qdyn.onnx", input_shapes={k: v.shape for k, v in feeds.items()})
    for k, g in enumerate((m.graph, Pipeline.canonical().run(m.graph).final)):
        export_onnx(g, m.weights, tmp_path / f"v{k}.onnx")
        got = ort.InferenceSession(str(tmp_path / f"v{k}.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
        for name, o in zip(m.meta["onnx_outputs"], got, strict=True):
            np.testing.assert_allclose(o, d[f"out:{name}"], atol=1e-5, rtol=0)


def _qdq_model(path: Path, per_channel: bool) -> dict[str, np.ndarray]:
    """x [2, 5, 16] -> Q/DQ (u8, scale 0.05, zp 128) -> MatMul with a DQ'd i8 weight [16, 8] (+ bias) -> Relu."""
    rng = np.random.default_rng(3)
    k, n = 16, 8
    wq = rng.integers(-127, 128, size=(k, n)).astype(np.int8)
    wscale = (rng.uniform(0.005, 0.02, size=n) if per_channel else np.asarray(0.01)).astype(np.float32)
    wzp = np.zeros(n if per_channel else (), np.int8)
    inits = [numpy_helper.from_array(wq, "w_q"), numpy_helper.from_array(wscale, "w_scale"),
             numpy_helper.from_array(wzp, "w_zp"), numpy_helper.from_array(np.asarray(0.05, np.float32), "x_scale"),
             numpy_helper.from_array(np.asarray(128, np.uint8), "x_zp"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w"], axis=1),
             helper.make_node("MatMul", ["xd", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "bias"], ["pre"]),
             helper.make_node("Relu", ["pre"], ["y"])]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", n])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    x = rng.standard_normal((2, 5, k)).astype(np.float32) * 3
    x[0, 0, :4] = [0.025, 0.075, -0.025, 100.0]  # ties (0.5, 1.5, -0.5 steps) and a value that saturates
    return {"x": x}


@pytest.mark.parametrize("per_channel", [False, True])
def test_qdq_matmul_has_onnx_runtimes_numbers(tmp_path, per_channel):
    feeds = _qdq_model(tmp_path / "qdq.onnx", per_channel)
    m = _check(tmp_path / "qdq.onnx", feeds, _ort(tmp_path / "qdq.onnx", feeds))
    # the weight stays an i8 param, dequantized on the graph (cast -> mul) before the matmul
    (w,) = [n for n in m.graph.params if n.dtype == DType.i8]
    assert any(u.op == Op.CAST for u in m.graph.users(w.id))


def _qdq_mlp(path: Path) -> dict[str, np.ndarray]:
    """A layer `layers.0` whose fc1/fc2 weights are int8 constants dequantized (QDQ weights), bias, GELU between."""
    rng = np.random.default_rng(7)
    k, h = 16, 32
    inits, nodes = [], []
    for nm, shape in (("fc1", (k, h)), ("fc2", (h, k))):
        w = f"layers.0.{nm}.weight"
        inits += [numpy_helper.from_array(rng.integers(-127, 128, size=shape).astype(np.int8), w + "_q"),
                  numpy_helper.from_array(np.asarray(0.01, np.float32), w + "_s"),
                  numpy_helper.from_array(np.asarray(3, np.int8), w + "_z"),
                  numpy_helper.from_array(rng.standard_normal(shape[1]).astype(np.float32), f"layers.0.{nm}.bias")]
        nodes.append(helper.make_node("DequantizeLinear", [w + "_q", w + "_s", w + "_z"], [w],
                                      name=f"/layers.0/{nm}/DequantizeLinear"))
    nodes += [helper.make_node("MatMul", ["x", "layers.0.fc1.weight"], ["a"], name="/layers.0/fc1/MatMul"),
              helper.make_node("Add", ["a", "layers.0.fc1.bias"], ["b"], name="/layers.0/fc1/Add"),
              helper.make_node("Gelu", ["b"], ["c"], name="/layers.0/act/Gelu"),
              helper.make_node("MatMul", ["c", "layers.0.fc2.weight"], ["d"], name="/layers.0/fc2/MatMul"),
              helper.make_node("Add", ["d", "layers.0.fc2.bias"], ["y"], name="/layers.0/fc2/Add")]
    io = [helper.make_tensor_value_info(v, TensorProto.FLOAT, ["batch", "seq", k]) for v in ("x", "y")]
    g = helper.make_graph(nodes, "qdq_mlp", io[:1], io[1:], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    return {"x": rng.standard_normal((2, 5, k)).astype(np.float32)}


def test_dequantized_weights_keep_the_layers_fusions(tmp_path, capsys):
    """A dequantized int8 weight is an f32 matmul operand: FusedMatMulBiasAct forms on both linears (GELU epilogue
    on fc1) with ONNX Runtime's numbers, and explain names the quantization step."""
    from clirun import run

    feeds = _qdq_mlp(tmp_path / "m.onnx")
    _check(tmp_path / "m.onnx", feeds, _ort(tmp_path / "m.onnx", feeds))
    m = load_onnx(tmp_path / "m.onnx", input_shapes={"x": (2, 5, 16)})
    final = Pipeline.canonical().run(m.graph).final
    fused = [n for n in final if n.op == Op.FUSED_MATMUL_BIAS_ACT]
    assert sorted(str(n.attrs.get("activation")) for n in fused) == ["None", "gelu"]
    code, out, _ = run(capsys, "explain", tmp_path / "m.onnx")
    assert code == 0 and "quantized: 2 DequantizeLinear" in out and "the matmul fusions apply to it" in out


def _mlp(path: Path, k: int = 24, h: int = 48) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal((k, h)).astype(np.float32) * 0.2, "fc1.weight"),
             numpy_helper.from_array(rng.standard_normal(h).astype(np.float32) * 0.1, "fc1.bias"),
             numpy_helper.from_array(rng.standard_normal((h, k)).astype(np.float32) * 0.2, "fc2.weight"),
             numpy_helper.from_array(rng.standard_normal(k).astype(np.float32) * 0.1, "fc2.bias")]
    nodes = [helper.make_node("MatMul", ["x", "fc1.weight"], ["a"], name="/fc1/MatMul"),
             helper.make_node("Add", ["a", "fc1.bias"], ["b"], name="/fc1/Add"),
             helper.make_node("Relu", ["b"], ["c"], name="/act/Relu"),
             helper.make_node("MatMul", ["c", "fc2.weight"], ["d"], name="/fc2/MatMul"),
             helper.make_node("Add", ["d", "fc2.bias"], ["y"], name="/fc2/Add")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", k])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return {"x": rng.standard_normal((2, 6, k)).astype(np.float32)}


@pytest.mark.parametrize("weight_type", ["QInt8", "QUInt8"])
def test_quantize_dynamic_mlp_has_onnx_runtimes_numbers(tmp_path, weight_type):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    feeds = _mlp(tmp_path / "mlp.onnx")
    quantize_dynamic(str(tmp_path / "mlp.onnx"), str(tmp_path / "q.onnx"), weight_type=getattr(QuantType, weight_type))
    ops = {n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    _check(tmp_path / "q.onnx", feeds, _ort(tmp_path / "q.onnx", feeds))


@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_static_qdq_mlp_has_onnx_runtimes_numbers(tmp_path, per_channel):
    """onnxruntime.quantization.quantize_static in QDQ format (u8 activations, i8 weights) on the MLP."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    feeds = _mlp(tmp_path / "mlp.onnx")
    rng = np.random.default_rng(8)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = [{"x": rng.standard_normal(feeds["x"].shape).astype(np.float32)} for _ in range(4)]

        def get_next(self):
            return self.left.pop() if self.left else None

    quantize_static(str(tmp_path / "mlp.onnx"), str(tmp_path / "q.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=per_channel)
    ops = {n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    _check(tmp_path / "q.onnx", feeds, _ort(tmp_path / "q.onnx", feeds))


def test_matmul_integer_is_exact_past_f32s_integers(tmp_path):
    """K = 700 at the extremes (255 - 0) * (-128 - 0) sums to -22.8M, past 2**24: written in chunks, each exact,
    added in i32, the int32 result equals ONNX Runtime's to the unit."""
    k = 700
    b = np.full((k, 3), -128, np.int8)
    b[:, 1] = 127
    b[::7, 2] = 5
    g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b", "azp"], ["y"])], "mi",
                          [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, k])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 3])],
                          [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.asarray(0, np.uint8), "azp")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "mi.onnx"))
    a = np.full((2, k), 255, np.uint8)
    a[1, ::3] = 1
    want = _ort(tmp_path / "mi.onnx", {"a": a})
    assert abs(int(want[0].min())) > 1 << 24
    m = load_onnx(tmp_path / "mi.onnx")
    assert sum(1 for n in m.graph if n.op == Op.MATMUL) > 1  # chunked
    np.testing.assert_array_equal(run_reference(m.graph, {"a": a}, m.weights)[0], want[0])
    ex = MlxExecutor(LoweringOptions(fast_math=False))
    np.testing.assert_array_equal(np.asarray(ex.run(m.graph, {"a": a}, m.weights)[0]), want[0])


def test_an_unsupported_quantized_form_is_one_line(tmp_path):
    """Blocked quantization (opset 21 block_size) is refused naming the node, never a raw ValueError."""
    g = helper.make_graph([helper.make_node("DequantizeLinear", ["x", "s"], ["y"], name="dq", axis=1, block_size=2)],
                          "bq", [helper.make_tensor_value_info("x", TensorProto.INT8, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                          [numpy_helper.from_array(np.ones((2, 2), np.float32), "s")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), str(tmp_path / "bq.onnx"))
    with pytest.raises(OnnxImportError, match=r"DequantizeLinear node 'dq' \(opset 21\): blocked quantization"):
        load_onnx(tmp_path / "bq.onnx")


def _dql_graph(tmp_path: Path):
    g = helper.make_graph([helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
                           helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "dql",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "dql.onnx"))
    return load_onnx(tmp_path / "dql.onnx").graph


@pytest.mark.parametrize(("step", "x_moved", "flip"), [(1, 1e-6, True), (2, 1e-6, False), (1, 0.3, False)])
def test_a_quantization_step_moved_by_rounding_is_told_from_a_pass_error(tmp_path, step, x_moved, flip):
    """`quant_flip.quantization_flip`: a version whose quantized tensor moved by one step while what it rounds
    agrees at rounding level is a flip; two steps, or a rounded value that differs for real, is not."""
    from rlxviz.runtime.precision import Tolerance
    from rlxviz.runtime.quant_flip import quantization_flip, quantizers

    g = _dql_graph(tmp_path)
    (q,) = [n for n in quantizers(g) if n.shape == (4,)]  # the data; the zero point is the other quantizer
    version = Graph(g.nodes, g.outputs, name="version")  # the same graph, told apart by its name

    def run(graph, feeds, weights):  # the backend under test, stubbed: each asked node's value in each graph
        moved = graph.name == "version"
        out = []
        for i in graph.outputs:
            n = graph[i]
            if n.shape != (4,):
                out.append(np.asarray(5, n.dtype.numpy))
            elif n.op == Op.CAST:
                out.append(np.asarray([10, 20, 30, 40], np.uint8) + np.asarray([step if moved else 0, 0, 0, 0],
                                                                                 np.uint8))
            else:
                out.append(np.asarray([9.5, 20.0, 30.0, 40.0]) + (x_moved if moved else 0.0))
        return out

    why = quantization_flip(version, g, {"x": np.zeros(4, np.float32)}, {}, Tolerance(1e-3, 1e-4), run)
    assert bool(why) == flip, why
    if flip:
        assert why.startswith(f"1 of 4 value(s) of the quantized tensor %{q.id}")


def test_time_never_blames_a_pass_for_a_quantization_step(capsys):
    """`rlxviz time` on esm.qdyn: MLX's fused attention rounds differently at the last bit; where that moves a
    DynamicQuantizeLinear value by a step (the `holes` inputs, here), the note says so instead of "fuse_sdpa changed
    the numbers"."""
    from clirun import run

    code, out, err = run(capsys, "time", CASES / "esm.qdyn.onnx", "--repeat", "1", "--warmup", "0")
    assert "changed the numbers" not in out, out
    assert code in (0, 1) and "Traceback" not in err


def test_conv_integer_runs_on_the_host_with_its_uint8_operands(tmp_path):
    """ConvInteger (quantize_dynamic of a Conv) has no IR op: with uint8 in the IR's dtypes it is a host node that
    ONNX Runtime evaluates, exactly (was: refused for its uint8 type)."""
    w = np.random.default_rng(0).integers(0, 255, (4, 3, 2, 2)).astype(np.uint8)
    g = helper.make_graph([helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], name="ci")], "c",
                          [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 5, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 4, 4, 4])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.asarray(3, np.uint8), "xz")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "ci.onnx"))
    m = load_onnx(tmp_path / "ci.onnx")
    assert [n.attrs["op_type"] for n in m.graph if n.op == Op.ONNX_OP] == ["ConvInteger"]
    x = np.random.default_rng(1).integers(0, 255, (1, 3, 5, 5)).astype(np.uint8)
    want = _ort(tmp_path / "ci.onnx", {"x": x})[0]
    np.testing.assert_array_equal(run_reference(m.graph, {"x": x}, m.weights)[0], want)


def test_dynamic_quantize_linear_rounds_ties_to_even_as_onnx_runtime(tmp_path):
    """x spans [-1.25, 126.25]: scale 0.5 exactly, zero point -(-1.25) / 0.5 = 2.5, a tie (even: 2), and data ties
    (0.25 / 0.5 = 0.5 -> 0, 0.75 / 0.5 = 1.5 -> 2): all three outputs equal ONNX Runtime's."""
    g = helper.make_graph([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "dql",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [6]),
                           helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
                           helper.make_tensor_value_info("z", TensorProto.UINT8, [])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "d.onnx"))
    x = np.asarray([-1.25, 126.25, 0.25, 0.75, -0.25, 3.0], np.float32)
    want = _ort(tmp_path / "d.onnx", {"x": x})
    assert int(want[2]) == 2  # the tie went to even
    m = load_onnx(tmp_path / "d.onnx")
    ex = MlxExecutor(LoweringOptions(fast_math=False))
    for got in (run_reference(m.graph, {"x": x}, m.weights), ex.run(m.graph, {"x": x}, m.weights)):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(a), b)
