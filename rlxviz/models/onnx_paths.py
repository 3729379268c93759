"""Module paths for ONNX nodes that carry none: nodes a graph optimizer made (ONNX Runtime's transformer optimizer
names them `FullyConnect_MatMul_0`, `SkipLayerNorm_AddBias_1`, `FastGelu_AddBias_0`), read from the names of the
values they touch, so a layer keeps its MLP and norms (`onnx_import.node_path`'s last resort).

Two name forms carry a path: a legacy exporter's value name `/a/b.0/c/Op_output_0` (-> `a.b.0.c`) and a parameter
name `a.b.0.c.weight` / `.bias` (-> `a.b.0.c`). Outputs are read first (what the node makes), then inputs.
"""

from __future__ import annotations

import re
from typing import Any

_VALUE = re.compile(r"^/(.+)/[^/]+_output_\d+$")
_PARAM = re.compile(r"^([A-Za-z_]\w*(?:\.\w+)+)\.(?:weight|bias)$")


def path_of_name(name: str) -> str:
    """The module path a value or parameter name carries, or ''."""
    if m := _VALUE.match(name or ""):
        return ".".join(p for p in m.group(1).split("/") if p)
    if m := _PARAM.match(name or ""):
        return m.group(1)
    return ""


def path_from_values(node: Any) -> str:
    """The module path of an ONNX node from the names of its outputs, then its parameter inputs, then its other
    inputs; '' when none carries one."""
    for name in list(node.output) + [i for i in node.input if _PARAM.match(i or "")] + list(node.input):
        if p := path_of_name(name):
            return p
    return ""


__all__ = ["path_from_values", "path_of_name"]
