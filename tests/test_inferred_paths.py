"""A path inferred for a node ONNX Runtime's optimizer made claims only what is known (`contrib.inferred_path`): a
contrib node whose own name and value names carry no module path (a dynamo export run through the optimizer:
`SkipLayerNorm_0`, values `mul_3`, `linear_3`) takes the layer of what computes its inputs, not the module of its
deepest input. gemma.ortopt's post-attention RMSNorm and its residual sum were said `model.layers.0.self_attn.o_proj`
(`explain -v`: `%65 (model.layers.0.self_attn.o_proj)`), as if they were the output projection."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlxviz.ir import Op
from rlxviz.models.onnx import load_onnx
from rlxviz.models.onnx.handlers.contrib import inferred_path
from rlxviz.passes import Pipeline
from rlxviz.passes.architecture import classify_layer
from rlxviz.passes.trace import layer_of
from rlxviz.session import check_fusion

FIXTURES = Path(__file__).parent / "fixtures" / "onnx"
MS = "com.microsoft"


def _load(path: Path):
    d = dict(np.load(path.with_name(path.stem + "_io.npz")))
    return load_onnx(path, input_shapes={k: v.shape for k, v in d.items() if not k.startswith("out:")})


def _projection_readers(g, op: Op, proj: str) -> list:
    """The `op` nodes reading (directly, or through one add) a matmul whose path ends in `proj`."""
    def reads_proj(n) -> bool:
        return any(g[i].op == Op.MATMUL and g[i].path.endswith(proj) for i in n.inputs if i in g)
    adds = [n for n in g if n.op == Op.ADD and reads_proj(n)]
    return adds if op == Op.ADD else [n for n in g if n.op == op and any(i in {a.id for a in adds} for i in n.inputs)]


@pytest.mark.parametrize(("proj", "layers", "norms"), [("self_attn.o_proj", (0, 1), (0, 1)),
                                                       ("mlp.down_proj", (0, 1), (1, 1))])
def test_gemma_ortopt_residual_sums_and_norms_are_their_layers_not_the_projection(proj, layers, norms):
    """Each SkipSimplifiedLayerNormalization after o_proj / down_proj: its residual sum is said `model.layers.K` (the
    layer of the projection it reads), never the projection's path; its RMSNorm is said the layer it opens: after
    layer 0's down_proj, layer 1's input norm (`place_opening_norms`); after layer 1's, the final norm (no layer reads
    it, so it keeps its inferred layer: placement says it outside the layers once fused)."""
    g = _load(FIXTURES / "ortopt" / "gemma.ortopt.onnx").graph
    for op, want in ((Op.ADD, layers), (Op.RMS_NORM, norms)):
        found = _projection_readers(g, op, proj)
        assert [n.path for n in found] == [f"model.layers.{k}" for k in want], op
        assert [layer_of(n.path) for n in found] == list(want)


def test_gemma_ortopt_split_norm_is_the_layer_it_opens(capsys):
    """ORT's SkipSimplifiedLayerNormalization joins layer 0's MLP residual add and layer 1's input RMSNorm; the sum
    goes on to layer 1's next residual add. The norm (%77 in `explain -v`), its gamma and zero beta were said layer 0
    (the layer of its deepest input); its readers are layer 1's Q/K/V, so it is layer 1's, as the export's
    `model.layers.1.input_layernorm` was. The sum stays layer 0's. Layer 0's input norm (a SimplifiedLayerNormalization
    of the embeddings, which go on to the first residual add) was said `model`: it is layer 0's."""
    from clirun import run as cli_run

    g = _load(FIXTURES / "ortopt" / "gemma.ortopt.onnx").graph
    (norm,) = [n for n in g if n.op == Op.RMS_NORM and g[n.inputs[0]].op == Op.ADD
               and any(u.path.startswith("model.layers.1.self_attn") for u in g.users(n.id))]
    assert norm.path == "model.layers.1" and layer_of(g[norm.inputs[0]].path) == 0
    assert [g[i].path for i in norm.inputs[1:]] == ["model.layers.1"] * 2
    first = min((n for n in g if n.op == Op.RMS_NORM), key=lambda n: n.id)  # ORT's SimplifiedLayerNormalization
    assert first.path == "model.layers.0" and all(u.path.startswith("model.layers.0.") for u in g.users(first.id))
    out = cli_run(capsys, "explain", FIXTURES / "ortopt" / "gemma.ortopt.onnx", "-v")[1]
    layer0, layer1 = out.split("\nlayer 1: ")
    assert f"%{norm.id} (model.layers.0)" not in out and f"norm (node {norm.id}, model.layers.1)" in layer1
    assert f"node {norm.id}," not in layer0


def test_gemma_ortopt_layers_keep_their_kind_mlp_norms_and_verdicts():
    """Layer 0 (and 1) of gemma.ortopt is still read as the LLaMA-style layer of the export it came from (pre-norm
    RMSNorm, GeGLU MLP, RoPE) and fuses as expected; explain's lines name the layer, not o_proj."""
    m = _load(FIXTURES / "ortopt" / "gemma.ortopt.onnx")
    trace = Pipeline.canonical().run(m.graph)
    check = check_fusion(trace, "gemma")
    assert [(lay.layer, lay.fused, lay.architecture.kind) for lay in check.layers] == [(0, True, "llama"),
                                                                                       (1, True, "llama")]
    arch = classify_layer(m.graph, 0)
    assert arch.norm == "RMSNorm" and arch.swiglu and arch.rope and arch.description.startswith("LLaMA: pre-norm")
    text = "\n".join(lay.render(verbose=True) for lay in check.layers)
    assert "o_proj)" not in text and "down_proj)" not in text
    assert "sum (node 62, model.layers.0)" in text


def _scoped(node: onnx.NodeProto, path: str) -> onnx.NodeProto:
    """`node` with torch.onnx's name-scope metadata naming module `path` (a dynamo export's node)."""
    parts = path.split(".")
    scopes = ["", *(".".join(parts[:k]) for k in range(1, len(parts) + 1)), node.op_type]
    node.metadata_props.add(key="pkg.torch.onnx.name_scopes", value=repr(scopes))
    return node


def test_a_bert_layer_optimized_from_a_dynamo_export_says_its_layer(tmp_path):
    """A post-LN BERT layer (`encoder.layer.3`, another layout than gemma's) as ORT's optimizer writes it from a dynamo
    export: MatMuls carrying name scopes, then SkipLayerNormalization and BiasGelu nodes with no path in their names
    or their values' (`val_*`). The sums, norms and GELU are said `encoder.layer.3`, not the dense projection they
    read; the layer is still a BERT layer with its MLP, and fuses."""
    B, S, H, N = 1, 4, 8, 2
    rng = np.random.default_rng(3)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
    inits = [w(name, *shape) for name, shape in (
        ("val_ge", (H,)), ("val_be", (H,)), ("val_qkv_w", (H, 3 * H)), ("val_qkv_b", (3 * H,)), ("val_o_w", (H, H)),
        ("val_o_b", (H,)), ("val_g1", (H,)), ("val_b1", (H,)), ("val_f1_w", (H, 4 * H)), ("val_f1_b", (4 * H,)),
        ("val_f2_w", (4 * H, H)), ("val_f2_b", (H,)), ("val_g2", (H,)), ("val_b2", (H,)))]
    layer = "encoder.layer.3"
    nodes = [_scoped(helper.make_node("LayerNormalization", ["x", "val_ge", "val_be"], ["val_0"], epsilon=1e-5,
                                      name="node_emb_ln"), "embeddings.LayerNorm"),
             _scoped(helper.make_node("Attention", ["val_0", "val_qkv_w", "val_qkv_b", "mask"], ["val_1"], domain=MS,
                                      num_heads=N, name="node_attn"), f"{layer}.attention.self"),
             _scoped(helper.make_node("MatMul", ["val_1", "val_o_w"], ["val_2m"], name="node_o"),
                     f"{layer}.attention.output.dense"),
             _scoped(helper.make_node("Add", ["val_2m", "val_o_b"], ["val_2"], name="node_o_b"),
                     f"{layer}.attention.output.dense"),
             helper.make_node("SkipLayerNormalization", ["val_2", "val_0", "val_g1", "val_b1"], ["val_3"],
                              domain=MS, epsilon=1e-5, name="SkipLayerNorm_0"),
             _scoped(helper.make_node("MatMul", ["val_3", "val_f1_w"], ["val_4"], name="node_f1"),
                     f"{layer}.intermediate.dense"),
             helper.make_node("BiasGelu", ["val_4", "val_f1_b"], ["val_5"], domain=MS, name="BiasGelu_0"),
             _scoped(helper.make_node("MatMul", ["val_5", "val_f2_w"], ["val_6m"], name="node_f2"),
                     f"{layer}.output.dense"),
             _scoped(helper.make_node("Add", ["val_6m", "val_f2_b"], ["val_6"], name="node_f2_b"),
                     f"{layer}.output.dense"),
             helper.make_node("SkipLayerNormalization", ["val_6", "val_3", "val_g2", "val_b2"], ["y"],
                              domain=MS, epsilon=1e-5, name="SkipLayerNorm_1")]
    g = helper.make_graph(nodes, "bert", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, H]),
                                          helper.make_tensor_value_info("mask", TensorProto.INT32, [B, S])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, H])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]),
              str(tmp_path / "bert.onnx"))
    m = load_onnx(tmp_path / "bert.onnx")
    made = sorted(n.op.value for n in m.graph if n.path == layer and n.op != Op.PARAM)  # ORT's nodes
    assert made == sorted(["add", "layer_norm"] * 2 + ["add", "gelu"])  # two skip-norms, a bias GELU
    dense = [n.op.value for n in m.graph if n.path.endswith(".dense") and n.op != Op.PARAM]
    assert dense == ["matmul", "add", "matmul", "matmul", "add"]  # the scoped linears only (fc1's bias: BiasGelu's)
    arch = classify_layer(m.graph, 3)
    assert arch.kind == "post_ln" and arch.norm == "LayerNorm"
    check = check_fusion(Pipeline.canonical().run(m.graph), "bert")
    assert [(lay.layer, lay.fused) for lay in check.layers] == [(3, True)]


@pytest.mark.parametrize(("deepest", "claimed"), [
    ("model.layers.0.self_attn.o_proj", "model.layers.0"),  # in a layer: the layer
    ("transformer.h.11.mlp.c_fc", "transformer.h.11"),
    ("decoder.block.1.layer.0.SelfAttention.o", "decoder.block.1"),
    ("albert.encoder.albert_layer_groups.0.albert_layers.0@1.attention.dense",  # a numbered call (number_calls)
     "albert.encoder.albert_layer_groups.0.albert_layers.0@1"),
    ("model.conv1", "model"),  # in no layer: its parent module
    ("embeddings.LayerNorm", "embeddings"),
    ("model", ""),
    ("", "")])
def test_inferred_path_is_the_layer_else_the_parent(deepest, claimed):
    """The claim is a prefix of the deepest path in the same layer (and stack): placement reads the same layer."""
    assert inferred_path(deepest) == claimed
    assert layer_of(claimed) == layer_of(deepest)
