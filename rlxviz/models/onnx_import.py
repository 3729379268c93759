"""The ONNX importer's public names under their former module path (the importer is now the package
`rlxviz.models.onnx`, one job per module): `from rlxviz.models.onnx_import import load_onnx` keeps working.
Only the public names are here; patch a limit or a handler in the module that owns it (`onnx.driver`,
`onnx.validate`, `onnx.context`)."""

from __future__ import annotations

from .onnx import OPSETS, OnnxImportError, dtype_name, import_graph, load_onnx, node_label, node_path, onnx_dtype
from .onnx.validate import validate

__all__ = ["OPSETS", "OnnxImportError", "dtype_name", "import_graph", "load_onnx", "node_label", "node_path",
           "onnx_dtype", "validate"]
