"""No valid model is refused for an op: an ONNX node the IR has no op for (Hardmax, LpNormalization, Mod, ...)
becomes one `onnx_op` node run on the host by onnx.reference. The model loads, draws, prints and parses back as
IR text, explains and times (each naming the host nodes), exports to a file ONNX Runtime runs, and computes
ONNX Runtime's numbers on the reference and on MLX. Control flow, random and string ops are still refused."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from clirun import run
from onnx import TensorProto, helper, numpy_helper

from rlxviz.ir import Op, format_graph, parse_ir
from rlxviz.models.onnx import OnnxImportError, load_onnx
from rlxviz.models.onnx.export import export_onnx
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor

rng = np.random.default_rng(3)
X = rng.standard_normal((2, 3, 8)).astype(np.float32)

HOST = {
    "Hardmax": (helper.make_node("Hardmax", ["r"], ["h"], axis=-1, name="hm"), []),
    "LpNormalization": (helper.make_node("LpNormalization", ["r"], ["h"], axis=-1, p=2, name="lp"), []),
    # onnx.reference computes p=1 wrongly on negative inputs (1.2x): host nodes run on ONNX Runtime
    "LpNormalization_p1": (helper.make_node("LpNormalization", ["x"], ["h"], axis=-1, p=1, name="lp1"), []),
    "Mod": (helper.make_node("Mod", ["r", "k"], ["h"], fmod=1, name="mod"),
            [numpy_helper.from_array(np.asarray(0.7, np.float32), "k")]),
}


def _model(tmp_path: Path, op: str) -> Path:
    node, inits = HOST[op]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), node, helper.make_node("Add", ["h", "x"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], initializer=inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    p = tmp_path / f"{op}.onnx"
    onnx.save(m, p)
    return p


def _ort(model, feeds):
    src = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("op", list(HOST))
def test_an_op_the_ir_lacks_runs_on_the_host_with_onnx_runtimes_numbers(tmp_path, op):
    p = _model(tmp_path, op)
    m = load_onnx(p, batch=2, seq=3)
    host = [n for n in m.graph if n.op == Op.ONNX_OP]
    assert [n.attrs["op_type"] for n in host] == [op.split("_")[0]]
    want = _ort(p, {"x": X})
    np.testing.assert_allclose(run_reference(m.graph, {"x": X}, m.weights)[0], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(MlxExecutor().run(m.graph, {"x": X}, m.weights)[0]), want, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(_ort(export_onnx(m.graph, m.weights), {"x": X}), want, rtol=1e-6, atol=1e-6)
    text = format_graph(m.graph)
    assert format_graph(parse_ir(text)) == text  # the IR text holds the node


def test_explain_time_and_render_name_the_host_nodes(tmp_path, capsys):
    p = _model(tmp_path, "Hardmax")
    for command, extra in (("explain", []), ("time", ["--repeat", "1", "--no-battery"])):
        code, out, _ = run(capsys, command, p, "--batch", 2, "--seq", 3, *extra)
        assert code == 0 and "1 node(s) the IR has no op for ran on the host (ONNX Runtime): %2 Hardmax 'hm'" in out
    code, _, err = run(capsys, "render", p, "--batch", 2, "--seq", 3, "-o", tmp_path / "g.svg")
    assert code == 0, err
    assert code == 0 and "Hardmax" in (tmp_path / "g.svg").read_text() or "onnx_op" in (tmp_path / "g.svg").read_text()


@pytest.mark.parametrize("node", [helper.make_node("RandomNormalLike", ["x"], ["h"], name="rnd"),
                                  helper.make_node("Unique", ["x"], ["h", "i", "j", "c"], name="uq")])
def test_random_and_multi_output_ops_are_still_refused_by_name(tmp_path, node):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([node, helper.make_node("Add", ["h", "x"], ["y"])], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "r.onnx")
    with pytest.raises(OnnxImportError, match=f"cannot be mapped to the IR.*{node.op_type}"):
        load_onnx(tmp_path / "r.onnx")


def _conv_model(tmp_path: Path, kernel: tuple[int, ...], pads: list[int], strides: list[int],
                channels: int = 4) -> Path:
    """Conv with a constant kernel on x [batch, channels, *spatial], then Relu (Whisper's 1-D stem, a padded 2-D)."""
    w = numpy_helper.from_array(rng.standard_normal(kernel).astype(np.float32) * 0.3, "w")
    bias = numpy_helper.from_array(rng.standard_normal(kernel[0]).astype(np.float32), "b")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", channels] + [12] * (len(kernel) - 2))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=pads, strides=strides, name="conv"),
             helper.make_node("Relu", ["c"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], initializer=[w, bias]),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    p = tmp_path / "conv.onnx"
    onnx.save(m, p)
    return p


@pytest.mark.parametrize("kernel, pads, strides", [
    ((6, 4, 3), [1, 1], [1]),           # Whisper's conv1: 1-D, padded
    ((6, 4, 3), [1, 1], [2]),           # Whisper's conv2: strided
    ((5, 4, 3, 3), [1, 1, 1, 1], [1, 1]),  # a padded 2-D conv (not a patch embedding)
])
def test_a_conv_that_is_not_a_patch_embedding_runs_on_the_host(tmp_path, kernel, pads, strides):
    p = _conv_model(tmp_path, kernel, pads, strides)
    m = load_onnx(p, batch=2)
    assert [n.attrs["op_type"] for n in m.graph if n.op == Op.ONNX_OP] == ["Conv"], \
        [(n.op.value, n.attrs.get("op_type")) for n in m.graph if n.op == Op.ONNX_OP]
    x = rng.standard_normal((2, 4) + (12,) * (len(kernel) - 2)).astype(np.float32)
    want = _ort(p, {"x": x})
    np.testing.assert_allclose(run_reference(m.graph, {"x": x}, m.weights)[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(MlxExecutor().run(m.graph, {"x": x}, m.weights)[0]), want,
                               rtol=1e-5, atol=1e-5)


def test_a_conv_whose_input_does_not_fit_its_kernel_is_refused(tmp_path):
    p = _conv_model(tmp_path, (6, 3, 3), [1, 1], [1], channels=4)  # kernel takes 3 channels, the input has 4
    with pytest.raises(OnnxImportError, match="does not fit the kernel"):
        load_onnx(p, batch=2)


def _router_model(tmp_path: Path, which: str) -> Path:
    """An MoE router as torch exports it: TopK's values and indices both read (`topk`), or a GatherND whose indices
    are computed from the input (`gathernd`: the IR's gather takes constant indices only)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    k = numpy_helper.from_array(np.asarray([2], np.int64), "k")
    if which == "topk":
        nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=-1),
                 helper.make_node("TopK", ["p", "k"], ["vals", "idx"], axis=-1, name="router_topk"),
                 helper.make_node("Cast", ["idx"], ["fidx"], to=TensorProto.FLOAT),
                 helper.make_node("Add", ["vals", "fidx"], ["y"])]
        inits = [k]
    else:
        nodes = [helper.make_node("ArgMax", ["x"], ["am"], axis=-1, keepdims=1),  # [2, 3, 1], computed
                 helper.make_node("GatherND", ["x", "am"], ["g"], batch_dims=2, name="pick"),
                 helper.make_node("Relu", ["g"], ["y"])]
        inits = []
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], initializer=inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    p = tmp_path / f"{which}.onnx"
    onnx.save(m, p)
    return p


@pytest.mark.parametrize("which, op_types", [("topk", ["TopK", "TopK"]), ("gathernd", ["GatherND"])])
def test_a_multi_output_or_unmapped_form_runs_on_the_host_with_onnx_runtimes_numbers(tmp_path, which, op_types):
    """TopK's two outputs are two host nodes (`output` 0 and 1); a GatherND with computed indices, which the
    handler does not map, is a host node too. Reference, MLX and the exported file give ONNX Runtime's numbers."""
    p = _router_model(tmp_path, which)
    m = load_onnx(p)
    host = [n for n in m.graph if n.op == Op.ONNX_OP]
    assert [n.attrs["op_type"] for n in host] == op_types
    if which == "topk":
        assert [n.attrs.get("output", 0) for n in host] == [0, 1] and host[1].dtype.value == "i64"
    want = _ort(p, {"x": X})
    np.testing.assert_allclose(run_reference(m.graph, {"x": X}, m.weights)[0], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(MlxExecutor().run(m.graph, {"x": X}, m.weights)[0]), want,
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(_ort(export_onnx(m.graph, m.weights), {"x": X}), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("host", ["Hardmax", "TopK"])
def test_a_host_node_carries_its_own_onnx_nodes_module_path(tmp_path, host):
    """The host node is emitted under the module path of the ONNX node it holds, not the previous node's (the
    path was set only after the host node was built, so explain and the drawing put it in the wrong layer)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    k = numpy_helper.from_array(np.asarray([2], np.int64), "k")
    held = (helper.make_node("Hardmax", ["r"], ["h"], axis=-1, name="/encoder/layer.1/pick/Hardmax")
            if host == "Hardmax" else
            helper.make_node("TopK", ["r", "k"], ["h", "i"], axis=-1, name="/encoder/layer.1/pick/TopK"))
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="/encoder/layer.0/act/Relu"), held,
             helper.make_node("Neg", ["h"], ["y"], name="/encoder/layer.2/out/Neg")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], initializer=[k] if host == "TopK" else []),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    p = tmp_path / "paths.onnx"
    onnx.save(m, p)
    g = load_onnx(p).graph
    paths = {n.op: n.path for n in g if n.op in (Op.RELU, Op.ONNX_OP, Op.NEG)}
    assert paths == {Op.RELU: "encoder.layer.0.act", Op.ONNX_OP: "encoder.layer.1.pick", Op.NEG: "encoder.layer.2.out"}


def _count_host_evaluations(monkeypatch) -> list[str]:
    import rlxviz.ir.onnx_op as onnx_op

    calls: list[str] = []
    real = onnx_op._evaluate_all

    def counted(attrs, arrays):
        calls.append(attrs["op_type"])
        return real(attrs, arrays)

    monkeypatch.setattr(onnx_op, "_evaluate_all", counted)
    return calls


@pytest.mark.parametrize("engine", ["reference", "mlx", "mlx-compiled"])
def test_a_multi_output_host_node_runs_once_per_run(tmp_path, monkeypatch, engine):
    """TopK's values and indices are two IR nodes over one ONNX node: each run evaluates that node once (the
    run's cache, keyed by the node and the identity of its input arrays), and every run evaluates it anew."""
    p = _router_model(tmp_path, "topk")
    m = load_onnx(p)
    assert sum(1 for n in m.graph if n.op == Op.ONNX_OP) == 2
    want = _ort(p, {"x": X})
    calls = _count_host_evaluations(monkeypatch)
    ex = MlxExecutor(compile_graph=engine == "mlx-compiled")
    for r in range(2):
        x = X * (1 + r)  # a new input each run: a cache kept across runs would answer the first run's numbers
        got = (run_reference(m.graph, {"x": x}, m.weights)[0] if engine == "reference"
               else np.asarray(ex.run(m.graph, {"x": x}, m.weights)[0]))
        np.testing.assert_allclose(got, _ort(p, {"x": x}) if r else want, rtol=1e-6, atol=1e-6)
        assert calls == ["TopK"] * (r + 1)


def test_two_host_nodes_of_the_same_onnx_node_on_different_arrays_each_run(tmp_path, monkeypatch):
    """Two TopK nodes of equal shapes, on x and on -x, are each evaluated once in a run, each with its own numbers
    (the run's cache answers only the same node on the very same input arrays)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    k = numpy_helper.from_array(np.asarray([2], np.int64), "k")
    nodes = [helper.make_node("Neg", ["x"], ["nx"]),
             helper.make_node("TopK", ["x", "k"], ["v1", "i1"], axis=-1),
             helper.make_node("TopK", ["nx", "k"], ["v2", "i2"], axis=-1),
             helper.make_node("Add", ["v1", "v2"], ["y"])]
    mp = helper.make_model(helper.make_graph(nodes, "g", [x], [y], initializer=[k]),
                           opset_imports=[helper.make_opsetid("", 17)])
    mp.ir_version = 8
    p = tmp_path / "two_topk.onnx"
    onnx.save(mp, p)
    m = load_onnx(p)
    calls = _count_host_evaluations(monkeypatch)
    np.testing.assert_allclose(run_reference(m.graph, {"x": X}, m.weights)[0], _ort(p, {"x": X}), rtol=1e-6,
                               atol=1e-6)
    assert calls == ["TopK", "TopK"]


WHISPER = Path(__file__).parent / "fixtures" / "onnx" / "ortopt" / "whisper-encoder.ortopt.onnx"
"""Whisper's encoder after ONNX Runtime's optimizer: its Conv nodes are `onnx_op` host nodes."""


def test_a_host_node_is_drawn_and_inspected_by_its_onnx_op_and_name_never_its_blob(tmp_path):
    """A drawing labelled a host node `op_type=Conv node=Cg5pbnB1dF9mZWF0dXJlcwoSbW9kZ…` and its tooltip and the
    inspector printed the whole base64 of the serialized node: the label names the ONNX op and node
    (`Conv node_conv1d`), the tooltip and the inspector name the blob by its size."""
    from rlxviz.app.explain import node_report, report_markdown
    from rlxviz.viz import graph_to_dot

    m = load_onnx(WHISPER)
    host = [n for n in m.graph if n.op == Op.ONNX_OP]
    assert host and all(len(n.attrs["node"]) > 100 for n in host)
    dot = graph_to_dot(m.graph)
    for n in host:
        label = f">{n.attrs['op_type']} {n.attrs['name']}<"
        assert label in dot, label
        assert n.attrs["node"][:24] not in dot  # not in the label, not in the tooltip
        text = report_markdown(node_report(m.graph, n.id))
        size = len(base64.b64decode(n.attrs["node"]))
        assert n.attrs["node"][:24] not in text and f"ONNX node, {size:,} bytes" in text, text
    assert "Conv node_conv1d" in dot


def test_a_two_output_host_node_is_counted_once(tmp_path, capsys):
    """gpt-oss (newcomer finding): "12 node(s) ... ran on the host" counted each router TopK twice, once per output
    (values and indices are two IR nodes over one ONNX node). The line counts ONNX nodes and names the outputs."""
    from rlxviz.session import describe_host

    m = load_onnx(_router_model(tmp_path, "topk"))
    a, b = [n.id for n in m.graph if n.op == Op.ONNX_OP]
    assert describe_host(m.graph) == (f"1 node(s) the IR has no op for ran on the host (ONNX Runtime): "
                                      f"%{a} TopK 'router_topk' (outputs %{a}, %{b})")
    code, out, _ = run(capsys, "explain", Path(__file__).parent / "fixtures" / "onnx" / "zoo" /
                       "gpt-oss.dynamo-eager.onnx")
    assert "10 node(s) the IR has no op for ran on the host" in out and "%106 TopK 'node_topk__1' (outputs %106, " \
                                                                       "%107)" in out, out
