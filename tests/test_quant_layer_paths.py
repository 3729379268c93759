"""A quantized export's matmuls sit in the layer the float export names them in (newcomer 38 on convbert.qdyn: its
Q/K/V, convolution-kernel and conv-branch integer matmuls had no path, so the layer view drew "other: 130 op(s) ...
matmul×8" between layer 0 and 1 and the CLI put "ElementwiseRegion x14" outside the layers).

`onnxruntime.quantization` drops the name scopes of the nodes it replaces (`node_MatMul_71` becomes
`node_MatMul_71_quant`, with a Cast and scale Muls around it), so the import gives such runs the layer the exporter's
nodes next to them agree on (`onnx.paths.agreed_paths`). The quantize step before them had been lent the path of the
value it quantizes (`handlers.quant.quant_paths`): in a post-LN model that is the previous layer's output, whose path
outvoted the layer reading the projections. The oracle here is independent of that logic: the float export the
quantized file was made from (`NAME.dynamo-eager.onnx`) names each node's layer in its name scopes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from rlxviz.ir import Op
from rlxviz.models.module_calls import number_calls
from rlxviz.models.onnx import load_onnx, node_path
from rlxviz.passes.trace import layer_of
from rlxviz.viz import layer_groups

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
QUANTIZED = sorted(p.name.removesuffix(".onnx") for p in ZOO.glob("*.onnx") if p.suffixes[-2] in (".qdyn", ".qdq"))


def _float_layers(model: str) -> dict[str, int]:
    """ONNX node name -> the layer the float export's name scopes put it in, for the nodes inside a layer."""
    proto = onnx.load(ZOO / f"{model}.dynamo-eager.onnx", load_external_data=False)
    paths = number_calls([node_path(n) for n in proto.graph.node])
    return {n.name: k for n, p in zip(proto.graph.node, paths, strict=True) if (k := layer_of(p)) is not None}


def test_the_zoo_has_the_quantized_exports_this_checks():
    assert {"convbert.qdyn", "mobilebert.qdyn", "convbert.qdq"} <= set(QUANTIZED), QUANTIZED


@pytest.mark.parametrize("stem", QUANTIZED)
def test_every_matmul_sits_in_the_layer_its_float_node_is_named_in(stem):
    feeds = {k: v.shape for k, v in np.load(ZOO / f"{stem}.npz").items() if not k.startswith("out:")}
    m = load_onnx(ZOO / f"{stem}.onnx", input_shapes=feeds)
    want = _float_layers(stem.split(".")[0])
    made = m.meta["onnx_nodes"]  # IR node id -> (op type, ONNX node name, doc)
    checked, wrong = 0, []
    boxed = {n.id for grp in layer_groups(m.graph).values() if grp.layer is not None for n in grp.nodes}
    for n in m.graph:
        if n.op != Op.MATMUL or n.id not in made:
            continue
        name = re.sub(r"_quant$", "", made[n.id][1])  # quantize_dynamic's MatMulInteger: the float node's name + _quant
        if (layer := want.get(name)) is None:
            continue
        checked += 1
        if layer_of(n.path) != layer or n.id not in boxed:  # the drawing boxes it with its layer too
            wrong.append(f"%{n.id} {made[n.id][0]} {made[n.id][1]!r}: path {n.path!r}, float export's layer {layer}")
    assert checked >= 8, (stem, checked)  # every layer's projections at least
    assert not wrong, wrong
