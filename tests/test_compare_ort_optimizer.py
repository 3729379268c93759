"""benchmarks/compare_ort_optimizer.py reads ONNX Runtime's optimized model back as the file ORT would save: the
optimizer's in-memory model lacks the `com.microsoft` opset import, which ONNX's shape inference (and so rlxviz's
importer) needs for the contrib nodes (the optimizer itself needs sympy, so the check is on a hand-built model)."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import onnx
from clirun import ROOT
from onnx import TensorProto, helper


def benchmark() -> ModuleType:
    """benchmarks/compare_ort_optimizer.py as a module."""
    spec = importlib.util.spec_from_file_location("compare_ort_optimizer",
                                                  ROOT / "benchmarks" / "compare_ort_optimizer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(domain: str) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    node = helper.make_node("FastGelu" if domain else "Relu", ["x"], ["y"], domain=domain)
    return helper.make_model(helper.make_graph([node], "g", [x], [y]),
                             opset_imports=[helper.make_opsetid("", 18)])


def test_as_saved_declares_the_contrib_domain_once():
    """A model with a com.microsoft node gets that opset import (once, however often called), as ORT saves it."""
    as_saved = benchmark().as_saved
    model = as_saved(as_saved(_model("com.microsoft")))
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 18), ("com.microsoft", 1)]
    onnx.shape_inference.infer_shapes(model, strict_mode=True)  # declared: ONNX infers the contrib node


def test_as_saved_leaves_a_plain_model_alone():
    """A model without contrib nodes keeps its opset imports."""
    model = benchmark().as_saved(_model(""))
    assert [o.domain for o in model.opset_import] == [""]
