"""`--layers 0-K` slices end at their float values, the residual stream first: the value `rlxviz run` names as its
result (newcomer run 3: `reference -> out.npz (val_69 int64 4)`, a reshape's shape vector, for roberta's layer 0;
run 4: the shape vectors still written beside it)."""

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
    # the float values of the cut only (no shape vector), and the residual stream is the last one layer 0 computes
    assert {o.name for o in part.output} < set(cut)
    assert all(o.type.tensor_type.elem_type == TensorProto.FLOAT for o in part.output), part.output
    assert first.name == max((o.name for o in part.output), key=cut.index)


def _vi(name: str, elem: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None)


def test_stream_first_keeps_floats_last_computed_first():
    graph = helper.make_graph([], "g", [], [_vi("h", TensorProto.FLOAT)],
                              value_info=[_vi("shape", TensorProto.INT64), _vi("cos", TensorProto.FLOAT16),
                                          _vi("sin", TensorProto.BFLOAT16)])
    # in the order their nodes ran: a shape vector, the RoPE tables, an untyped value, the hidden state
    assert stream_first(["shape", "cos", "sin", "untyped", "h"], graph) == ["h", "sin", "cos"]
    assert stream_first(["shape", "untyped"], graph) == ["untyped", "shape"]  # no float: all, last computed first
