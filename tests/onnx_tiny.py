"""A one-node ONNX model as bytes, for tests that load, upload or open a file by path without caring what it
computes."""

from __future__ import annotations

from onnx import TensorProto, helper


def onnx_bytes(op: str = "Sigmoid") -> bytes:
    """A one-node ONNX model (`y = op(x)`, f32[2, 8], opset 17), serialized."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    m = helper.make_model(helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    return m.SerializeToString()
