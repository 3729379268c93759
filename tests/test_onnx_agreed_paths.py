"""Nodes a tool inserted into an ONNX file take the layer their neighbours agree on (a newcomer run on esm.qdyn: the
12 MatMulInteger projections `onnxruntime.quantization` names `node_MatMul_55_quant`, their Casts and scale Muls had
no path, so the layer view drew "other: 112 op(s), 65.5K weights" outside both layers). A run of pathless nodes
takes the common path of the pathed nodes next to it when they name one layer (`onnx.paths.agreed_paths`), and the
weights it reads are named and placed with it; a run between two layers stays pathless."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rlxviz.ir import Op
from rlxviz.models.onnx import load_onnx
from rlxviz.passes.trace import layer_of
from rlxviz.viz import layer_groups

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"


def _model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), n) for n in ("w0", "w1", "w2")]
    inits.append(numpy_helper.from_array(np.full((4,), 0.5, np.float32), "s"))
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["a"], name="/layers.0/fc/MatMul"),
        helper.make_node("Mul", ["a", "s"], ["b"], name="node_Mul_5_quant_scales_mul"),  # between layer 0's nodes
        helper.make_node("Relu", ["b"], ["c"], name="/layers.0/act/Relu"),
        helper.make_node("Add", ["c", "c"], ["d"], name="Add_9"),  # between layer 0 and layer 1: no one layer
        helper.make_node("MatMul", ["d", "w1"], ["e"], name="/layers.1/fc/MatMul"),
        helper.make_node("MatMul", ["e", "w2"], ["f"], name="node_MatMul_7_quant"),  # read by nothing, fed by layer 1
        helper.make_node("Cast", ["f"], ["y"], name="Cast_12", to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(nodes, "toy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def test_pathless_nodes_take_the_layer_their_neighbours_agree_on(tmp_path):
    f = _model(tmp_path / "toy.onnx")
    g = load_onnx(f).graph
    by_op = {}
    for n in g:
        by_op.setdefault(n.op, []).append(n)
    mul, = by_op[Op.MUL]
    assert mul.path == "layers.0", mul.path  # the common path of layers.0.fc and layers.0.act
    add, = by_op[Op.ADD]
    assert add.path == "", add.path  # its neighbours are in layers 0 and 1
    last = [n for n in by_op[Op.MATMUL] if n.path != "layers.0.fc"]
    assert [n.path for n in last] == ["layers.1.fc", "layers.1.fc"], [n.path for n in last]
    w2 = g[last[1].inputs[1]]
    assert w2.op == Op.PARAM and layer_of(w2.path) == 1, w2  # the weight it reads: placed with it
    s = g[mul.inputs[1]]
    assert layer_of(s.path) == 0, s
    again = load_onnx(f).graph  # deterministic
    assert [(n.id, n.path) for n in again] == [(n.id, n.path) for n in g]


def test_esm_qdyn_projections_sit_in_their_layers():
    g = load_onnx(CASES / "esm.qdyn.onnx").graph
    matmuls = [n for n in g if n.op == Op.MATMUL]
    assert matmuls and all(layer_of(n.path) is not None for n in matmuls), \
        [f"%{n.id} {n.path!r}" for n in matmuls if layer_of(n.path) is None]
    quantized = [n for n in g.params if "quantized" in n.attrs["name"] and n.dtype.name in ("i8", "u8")]
    assert all(layer_of(n.path) is not None for n in quantized if any(u.op == Op.MATMUL for u in g.users(n))), \
        [n.path for n in quantized]
    groups = layer_groups(g)
    other = [grp for grp in groups.values() if grp.layer is None and any(n.op == Op.MATMUL for n in grp.nodes)]
    assert not other, [(grp.title, len(grp.nodes)) for grp in other]
    layers = {int(grp.layer): grp for grp in groups.values() if grp.layer is not None}
    assert sorted(layers) == [0, 1]
    assert [sum(n.op == Op.MATMUL for n in layers[k].nodes) for k in (0, 1)] == [8, 8]
