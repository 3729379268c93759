"""`--layers 0-K` slices list the residual stream first: the value `rlxviz run` names as its result and writes first
(newcomer run 3: `reference -> out.npz (val_69 int64 4)`, a reshape's shape vector, for roberta's layer 0)."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from rlxviz.models.onnx.slice import cut_values, slice_layers, stream_first

FIXTURES = ["tests/fixtures/onnx/bert.onnx", "tests/fixtures/onnx/gpt2.onnx", "tests/fixtures/onnx/llama.onnx",
            "tests/fixtures/onnx/cases/roberta.onnx", "tests/fixtures/onnx/cases/bart-full.onnx"]


@pytest.mark.parametrize("path", FIXTURES)
def test_a_slice_leads_with_the_residual_stream(path):
    whole = onnx.load(path, load_external_data=False).graph
    part = onnx.load(str(slice_layers(path, 0, 0)), load_external_data=False).graph
    first = part.output[0]
    dims = first.type.tensor_type.shape.dim
    assert first.type.tensor_type.elem_type == TensorProto.FLOAT and len(dims) == 3, first
    cut = cut_values(whole, 0)
    assert sorted(o.name for o in part.output) == sorted(cut)  # the same values, reordered only
    # the residual stream is the last float value layer 0 computes that later layers read
    floats = [o.name for o in part.output if o.type.tensor_type.elem_type == TensorProto.FLOAT]
    assert first.name == max(floats, key=cut.index)


def _vi(name: str, elem: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None)


def test_stream_first_orders_floats_last_computed_first_then_the_rest():
    graph = helper.make_graph([], "g", [], [_vi("h", TensorProto.FLOAT)],
                              value_info=[_vi("shape", TensorProto.INT64), _vi("cos", TensorProto.FLOAT16),
                                          _vi("sin", TensorProto.BFLOAT16)])
    # in the order their nodes ran: a shape vector, the RoPE tables, an untyped value, the hidden state
    assert stream_first(["shape", "cos", "sin", "untyped", "h"], graph) == ["h", "sin", "cos", "untyped", "shape"]
