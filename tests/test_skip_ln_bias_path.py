"""A SkipLayerNormalization's bias add is its bias parameter's module, its residual sum that module's layer (newcomer
finding on whisper-encoder.ortopt: %56, the bias add of layer 0's fc2, was said `model.layers.1.self_attn_layer_norm`
(the norm ONNX Runtime fused it with, the next layer's), so the CLI filed its gap under layer 0 while the inspector
said `provenance ... (layer 1)` with layer 1's verdict and the chip's tooltip named layer 1's norm).

`contrib.skip_ln`: s = input + skip closes the sublayer whose linear the bias is, so where no name of the sum's own
(output 3, input 0) carries a path it takes that linear's layer (`inferred_path`); the bias add takes the bias's path
(numbered like the driver, `_numbered_like`); the norm keeps its output's / gamma's."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rlxviz.ir import Op
from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.passes.trace import layer_of, place_label

WHISPER = Path(__file__).parent / "fixtures" / "onnx" / "ortopt" / "whisper-encoder.ortopt.onnx"
MS = "com.microsoft"
RULE, GUARD = "fuse_matmul_bias_act.bias_after_residual", "bias_after_residual"


def _skip_ln_model(path: Path, bias: str = "encoder.layer.0.fc2.bias") -> Path:
    """fc2 = MatMul(x, W) scoped `encoder.layer.0.fc2` (a dynamo export's name-scope metadata), then ORT's
    SkipLayerNormalization(fc2, x, gamma `encoder.layer.1.ln.weight`, beta, bias `bias`) -> (y, -, -, sum), all its
    values named as a dynamo export names them (`val_*`: no path)."""
    H = 8
    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
    inits = [w("val_w", H, H), w(bias, H), w("encoder.layer.1.ln.weight", H), w("encoder.layer.1.ln.bias", H)]
    mm = helper.make_node("MatMul", ["x", "val_w"], ["val_f2"], name="node_fc2")
    mm.metadata_props.add(key="pkg.torch.onnx.name_scopes",
                          value=repr(["", "encoder", "encoder.layer", "encoder.layer.0", "encoder.layer.0.fc2",
                                      "MatMul"]))
    sln = helper.make_node("SkipLayerNormalization", ["val_f2", "x", "encoder.layer.1.ln.weight",
                                                      "encoder.layer.1.ln.bias", bias], ["y", "", "", "val_sum"],
                           domain=MS, epsilon=1e-5, name="SkipLayerNorm_AddBias_0")
    g = helper.make_graph([mm, sln], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, H]),
                           helper.make_tensor_value_info("val_sum", TensorProto.FLOAT, [1, 4, H])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]),
              str(path))
    return path


def _adds(g) -> tuple:
    """(residual sum, bias add) of a graph with one SkipLayerNormalization: the add of two computed values, the add
    of one and a param."""
    adds = [n for n in g if n.op == Op.ADD]
    bias = [n for n in adds if any(g[i].op == Op.PARAM for i in n.inputs)]
    (s,) = [n for n in adds if n not in bias]
    (b,) = bias
    return s, b


def test_the_bias_add_is_the_bias_linears_and_the_sum_its_layer(tmp_path):
    g = load_onnx(_skip_ln_model(tmp_path / "m.onnx")).graph
    s, b = _adds(g)
    assert b.path == "encoder.layer.0.fc2"
    assert s.path == "encoder.layer.0"  # it closes layer 0's MLP: the layer, not the linear
    (ln,) = [n for n in g if n.op == Op.LAYER_NORM]
    assert ln.path == "encoder.layer.1.ln"  # the norm stays its gamma's: it opens layer 1


def test_a_bias_naming_no_module_leaves_both_adds_in_the_layer_they_close(tmp_path):
    """A bias whose name carries no path (`val_b`): the sum (and the bias add after it) take the layer of the deepest
    input, the sublayer output they close (`_deepest_input`), not gamma's next layer (falcon.ortopt's sum of layer 0
    was said `model.h.1.input_layernorm`)."""
    g = load_onnx(_skip_ln_model(tmp_path / "m.onnx", bias="val_b")).graph
    s, b = _adds(g)
    assert s.path == b.path == "encoder.layer.0"
    (ln,) = [n for n in g if n.op == Op.LAYER_NORM]
    assert ln.path == "encoder.layer.1.ln"


def test_falcon_ortopt_sum_closing_layer_0_is_layer_0s():
    """falcon.ortopt's SkipLayerNorm_0 (no bias; gamma `model.h.1.input_layernorm.weight`): its sum of the residual
    and layer 0's parallel attention + MLP is layer 0's, and so is the ElementwiseRegion made of it; the final sum is
    layer 1's, not `model.ln_f`."""
    path = Path(__file__).parent / "fixtures" / "onnx" / "ortopt" / "falcon.ortopt.onnx"
    m = load_onnx(str(path), batch=1, seq=16)
    sums = [n for n in m.graph if n.op == Op.ADD and any(m.graph[i].op == Op.GATHER for i in n.inputs)]
    assert [layer_of(n.path) for n in sums] == [0]  # embeddings + layer 0's sublayers
    final = Pipeline.canonical().run(m.graph).final
    (region,) = [n for n in final if n.op == Op.ELEMENTWISE_REGION and sums[0].id in n.absorbed]
    assert layer_of(region.path) == 0
    assert not any(n.path.startswith("model.ln_f") for n in m.graph if n.op == Op.ADD)


@functools.cache
def _whisper_trace():
    return Pipeline.canonical().run(load_onnx(str(WHISPER), batch=2, seq=8).graph)


def test_whisper_bias_add_56_is_layer_0s_fc2_by_path_inspector_and_place():
    from rlxviz.app.derived import step_places
    from rlxviz.app.explain import node_report

    trace = _whisper_trace()
    k = next(k for k, s in enumerate(trace.steps) if s.pass_name == "fuse_matmul_bias_act")
    before = trace.steps[k].before
    assert before[56].path == "model.layers.0.fc2" and layer_of(before[56].path) == 0
    rep = node_report(before, 56, trace)
    assert rep["path"] == "model.layers.0.fc2" and rep["layer"] == 0 and rep["verdict"]["layer"] == 0
    (said,) = [x for x in rep["decisions"] if x["rule"] == RULE and x["guard"] == GUARD]
    assert said["role"] == "the bias add"  # its own layer: no "in layer 0" aside
    (rej,) = [r for r in trace.steps[k].rejections if r.anchor == 56 and r.guard == GUARD]
    assert rej.path == "model.layers.0.fc2" and rej.layer == 0  # the place's name: `@ %56 (model.layers.0.fc2)`
    p = step_places(trace.steps[k], trace)  # the chip tooltip's places, each `%ANCHOR (PATH)`
    gaps, at = p.excused["gap in rlxviz's ops"], p.excused_at["gap in rlxviz's ops"]
    paths = ["model.layers.0.fc2", "model.layers.1.self_attn.out_proj"]
    assert at[0] == 56 and [before[a].path for a in at] == paths
    assert [g.split(": ")[0] for g in gaps] == [place_label(a, before[a].path, with_node=True) for a in at]
