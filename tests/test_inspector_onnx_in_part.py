"""An ONNX node absorbed in part, said so (newcomer): gpt2.ortopt's `FusedMatMulBiasAct %122` listed
`FastGelu_AddBias_0 (FastGelu)` among its absorbed ONNX nodes while the same panel said the FastGelu's GELU
`%57 gelu_tanh` was left out (a gap in rlxviz's ops): the importer made the FastGelu a bias param, an add and a
gelu_tanh, and the fusion took only the add. The list now says `(FastGelu, in part: its add, not its gelu_tanh
%57)` (`app.onnxorigin.onnx_in_part`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rlxviz import session
from rlxviz.app.explain import node_report, report_markdown
from rlxviz.app.onnxorigin import onnx_in_part
from rlxviz.app.text import md_code
from rlxviz.ir import Op
from rlxviz.passes import Pipeline
from rlxviz.viz.overlay import all_versions

GPT2 = Path(__file__).parent / "fixtures" / "onnx" / "ortopt" / "gpt2.ortopt.onnx"
MS = "com.microsoft"


def _onnx_line(rep: dict) -> str:
    return next(x for x in report_markdown(rep).split("\n\n") if "ONNX node" in x)


def _fused_linears(path: Path) -> tuple[dict, object, list[int]]:
    """(the model's `onnx_nodes`, its canonical run, the ids of the final graph's FusedMatMulBiasAct nodes)."""
    m = session.load(str(path), 1, 8)
    t = Pipeline.canonical().run(m.graph)
    return m.meta["onnx_nodes"], t, [n.id for n in t.final if n.op == Op.FUSED_MATMUL_BIAS_ACT]


def _check_fast_gelu_in_part(onnx_nodes: dict, t, node: int) -> None:
    """`node`'s report names its FastGelu as absorbed in part: its add taken, its gelu_tanh (still live) not."""
    g = t.final
    rep = node_report(g, node, t, None, onnx_nodes)
    gelu = next(i for i, (op, _, _) in onnx_nodes.items() if op == "FastGelu" and i in g and g[i].op == Op.GELU_TANH
                and g[i].inputs[0] == node)  # the gelu left out, reading the fused node
    name = onnx_nodes[gelu][1]
    assert ("FastGelu", name) in rep["onnx"]
    assert rep["onnx_part"] == {name: (("add",), (f"gelu_tanh %{gelu}",))}, rep["onnx_part"]
    line = _onnx_line(rep)
    assert f"(FastGelu, in part: its add, not its gelu\\_tanh %{gelu})" in line, line
    assert "(MatMul), " in line  # a whole ONNX node says nothing more
    # the left-out gelu's own report keeps its own ONNX node, not "in part" (its own, not absorbed)
    assert node_report(g, gelu, t, None, onnx_nodes)["onnx_part"] == {}


def test_gpt2_ortopts_fused_linear_absorbed_its_fast_gelu_in_part():
    onnx_nodes, t, fused = _fused_linears(GPT2)
    assert 122 in fused
    _check_fast_gelu_in_part(onnx_nodes, t, 122)


def test_a_contrib_node_imported_as_two_ir_nodes_one_absorbed(tmp_path):
    """A MatMul then a FastGelu with its bias (com.microsoft), built here: imported as a bias param, an add and a
    gelu_tanh; `fuse_matmul_bias_act` takes the add, leaves the gelu_tanh out (not on its allow-list)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((16, 32)) * 0.3).astype(np.float32), "fc_w")
    b = numpy_helper.from_array((rng.standard_normal(32) * 0.3).astype(np.float32), "fc_b")
    nodes = [helper.make_node("MatMul", ["x", "fc_w"], ["h"], name="fc"),
             helper.make_node("FastGelu", ["h", "fc_b"], ["y"], domain=MS, name="act <b>&")]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 16])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 32])], [w, b])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]),
              tmp_path / "m.onnx")
    onnx_nodes, t, fused = _fused_linears(tmp_path / "m.onnx")
    assert len(fused) == 1 and len([i for i, (op, _, _) in onnx_nodes.items() if op == "FastGelu"]) == 3
    _check_fast_gelu_in_part(onnx_nodes, t, fused[0])
    line = _onnx_line(node_report(t.final, fused[0], t, None, onnx_nodes))
    assert f"{md_code('act <b>&')} (FastGelu, in part: " in line and "<b>" not in line, line  # the name escaped
    # without the run's nodes the IR ops are unknown: nothing is said in part
    assert onnx_in_part(t.final[fused[0]], onnx_nodes) == {}
    assert onnx_in_part(t.final[fused[0]], onnx_nodes, all_versions(t), t.final) != {}
