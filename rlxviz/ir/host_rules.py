"""Which ONNX node may run on the host as an `onnx_op`, and the type it gives: one rule for every front end.

The ONNX importer keeps a node no handler maps as a host node (`ir.onnx_op`) only when it passes these rules,
and lint checks every `onnx_op` node against the very same rules wherever the node comes from (IR text, graph
JSON, the app's editor), so a file cannot run on the host what an import would have refused:

* **the form** (`form_refusal`): the default ONNX domain; not an op of `NEVER_ON_HOST` (control flow: unbounded
  work; strings; random: no fixed numbers; sequences and optionals: no tensor type); at least one output; no
  attribute holding a subgraph;
* **the opset**: one of `OPSETS` (the importer's; ONNX Runtime prints pages of log lines for others);
* **the type** (`inferred_types`): ONNX's strict shape inference, with data propagation over the small constant
  inputs, fixes every output's dtype and every dimension from the operand types; an `onnx_op` must declare
  exactly that type, so the memory budget counts what the node will make (a ConstantOfShape to [20000, 20000]
  cannot pass as `f32[2, 8]`);
* and, for an `onnx_op` (`onnx_op_problem`), the serialized node parses and its op type is the node's label
  (a node labelled Relu that holds Neg is refused: every view would name Relu while the numbers are Neg's).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .bounded import ForkedFailure, forked
from .dtype import DType

OPSETS = range(13, 22)
"""Default-domain opsets the importer accepts (13..21), and the opsets an `onnx_op` may hold."""

NEVER_ON_HOST = frozenset({"If", "Loop", "Scan", "SequenceMap", "RegexFullMatch", "StringConcat", "StringSplit",
                           "StringNormalizer", "RandomNormal", "RandomUniform", "RandomNormalLike",
                           "RandomUniformLike", "Multinomial", "Bernoulli", "Optional", "OptionalGetElement",
                           "OptionalHasElement"})
"""Ops never kept as host nodes: control flow (unbounded work), strings, random (no fixed numbers), optionals
(and every op whose name holds `Sequence`)."""

SMALL_FEED = 4096
"""Constant inputs up to this many elements go to shape inference with their values (shapes, repeats, ranges),
larger ones by their shape and type only."""

ONNX_DTYPES = {1: DType.f32, 10: DType.f16, 16: DType.bf16, 11: DType.f64, 6: DType.i32, 7: DType.i64,
               9: DType.bool, 2: DType.u8, 3: DType.i8}
"""ONNX TensorProto element type -> DType (the types the IR holds)."""

_GRAPH_ATTRS = (5, 10)
"""AttributeProto.GRAPH and GRAPHS: an attribute holding a subgraph."""


def single_node_model(node: Any, opset: int, consts: Mapping[str, np.ndarray],
                      typed: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> Any:
    """A ModelProto holding `node` alone, for ONNX shape inference: constants up to `SMALL_FEED` elements as
    initializers (so data propagation reads their values: shapes, repeats, ranges), larger ones and the computed
    inputs (`typed`: name -> (dtype, shape)) as typed graph inputs; outputs untyped."""
    import onnx
    from onnx import helper, numpy_helper

    inits, feeds = [], []
    for name, arr in consts.items():
        if arr.size <= SMALL_FEED:
            inits.append(numpy_helper.from_array(np.asarray(arr), name))
        else:
            typed = {**typed, name: (arr.dtype, tuple(arr.shape))}
    for name, (dt, shape) in typed.items():
        feeds.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), list(shape)))
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    g = helper.make_graph([node], "single", feeds, outs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=onnx.IR_VERSION)


def node_domain(node: Any) -> str:
    """The node's domain, '' for the default one (`ai.onnx` too)."""
    return "" if node.domain in ("", "ai.onnx") else node.domain


def form_refusal(node: Any) -> str | None:
    """Why `node` (an ONNX NodeProto) may never run on the host, as a phrase (`Loop is control flow, ...`), or None.
    Raises nothing."""
    if domain := node_domain(node):
        return f"its domain {domain!r} is not the default ONNX domain"
    if node.op_type in NEVER_ON_HOST or "Sequence" in node.op_type:
        return "it is a kind of op that never runs on the host (control flow, string, sequence, random, optional)"
    if not any(node.output):
        return "it names no output"
    sub = next((at.name for at in node.attribute if at.type in _GRAPH_ATTRS), None)
    if sub is not None:
        return f"its attribute {sub!r} holds a subgraph (never run on the host)"
    return None


Typed = dict[str, tuple[DType, tuple[int, ...]]]
"""Output name -> (dtype, shape)."""


def inferred_types(node: Any, opset: int, consts: Mapping[str, np.ndarray],
                   typed: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> Typed | str:
    """The dtype and shape ONNX's strict shape inference gives each named output of `node` on these inputs
    (`consts`: name -> value, `typed`: name -> (NumPy dtype, shape)), or why it gives none (a phrase: an output
    whose type or a dimension it cannot fix, a dtype the IR lacks, or the inference's own error). Raises nothing."""
    import onnx

    try:
        m = single_node_model(node, opset, consts, typed)
        m = onnx.shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
    except Exception as e:  # noqa: BLE001 - InferenceError, ValidationError, a bad dtype: the node is untyped
        text = " ".join(str(e).split())[:200]
        return f"ONNX shape inference refuses it ({type(e).__name__}{': ' + text if text else ''})"
    types: Typed = {}
    for out in m.graph.output:
        t = out.type.tensor_type
        if not out.type.HasField("tensor_type") or t.elem_type not in ONNX_DTYPES:
            return f"ONNX shape inference gives output {out.name!r} no tensor type the IR holds"
        if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
            return f"ONNX shape inference does not fix the shape of output {out.name!r}"
        types[out.name] = (ONNX_DTYPES[t.elem_type], tuple(int(d.dim_value) for d in t.shape.dim))
    missing = next((o for o in node.output if o and o not in types), None)
    if missing is not None:
        return f"ONNX shape inference gives output {missing!r} no type"
    return types


HostCheck = tuple[Mapping[str, Any], Sequence[tuple[DType, tuple[int, ...]]], Sequence[np.ndarray | None]]
"""One `onnx_op` node to check: its attributes, its operand types (dtype, shape) in order, and each operand's value
where it is known (a const, a param whose value the graph holds), else None."""

LINT_SECONDS = 20.0
"""Wall time the forked child checking a graph's new `onnx_op` nodes may take (ONNX shape inference per node)."""

_CACHE: dict[tuple[Any, ...], str | None] = {}
_CACHE_LIMIT = 4096


def onnx_op_problem(attrs: Mapping[str, Any], operands: Sequence[tuple[DType, tuple[int, ...]]],
                    values: Sequence[np.ndarray | None]) -> str | None:
    """Why an `onnx_op` node with these attributes cannot run on the host, in one line, or None (`onnx_op_problems`
    for one node). Raises nothing."""
    return onnx_op_problems([(attrs, operands, values)])[0]


def onnx_op_problems(checks: Sequence[HostCheck]) -> list[str | None]:
    """For each `onnx_op` node, why it cannot run on the host (one line), or None: the rules of the module
    docstring. Cached by node, opset, operand types and small values (lint runs after every pass). ONNX's shape
    inference is native code that a hostile node can crash (a GatherND with batch_dims -5 segfaults onnx 1.2x), so
    the nodes not yet cached are checked in one forked child where the platform has fork (bounded by
    `LINT_SECONDS`); when it crashes, in halves, until the refusal names the node. Raises nothing."""
    keys = [_key(*c) for c in checks]
    todo = sorted({k for k in keys if k is not None and k not in _CACHE}, key=repr)
    if todo:
        for k, why in zip(todo, _run_checks(todo), strict=True):
            if len(_CACHE) >= _CACHE_LIMIT:
                _CACHE.pop(next(iter(_CACHE)))
            _CACHE[k] = why
    return [_CACHE[k] if k is not None else "unreadable onnx_op attributes" for k in keys]


def _key(attrs: Mapping[str, Any], operands: Sequence[tuple[DType, tuple[int, ...]]],
         values: Sequence[np.ndarray | None]) -> tuple[Any, ...] | None:
    try:
        types = tuple((str(d), tuple(int(x) for x in s)) for d, s in operands)
        vals = tuple(None if v is None or v.size > SMALL_FEED else (str(v.dtype), tuple(v.shape), v.tobytes())
                     for v in values)
        return (str(attrs["node"]), str(attrs["op_type"]), int(attrs["opset"]), int(attrs.get("output", 0)),
                str(attrs["dtype"]), tuple(int(x) for x in attrs["shape"]), types, vals)
    except (KeyError, TypeError, ValueError):  # lint's signature check names a missing attribute first
        return None


def _run_checks(keys: list[tuple[Any, ...]]) -> list[str | None]:
    if not hasattr(os, "fork"):
        return [_problem(*k) for k in keys]
    import onnx.shape_inference  # noqa: F401 - imported once here, not in every child
    try:
        return json.loads(forked(lambda: json.dumps([_problem(*k) for k in keys]), LINT_SECONDS))
    except ForkedFailure as e:
        if len(keys) == 1 or not e.signal:  # a time-out is not split: n children would take n times as long
            nodes = len({k[0] for k in keys})  # one ONNX node per serialized text, whatever outputs the IR reads
            where = "on this node" if nodes == 1 else f"on this graph's {nodes} host nodes"
            return [f"{k[1]} cannot run on the host: ONNX shape inference {e.said()} {where}" for k in keys]
    half = len(keys) // 2  # a crash: halves, until the refusal names the node that crashed (log2(n) children)
    return _run_checks(keys[:half]) + _run_checks(keys[half:])


def _problem(text: str, label: str, opset: int, output: int, dtype: str, shape: tuple[int, ...],
             operands: tuple[tuple[str, tuple[int, ...]], ...],
             values: tuple[tuple[str, tuple[int, ...], bytes] | None, ...]) -> str | None:
    import base64

    from onnx import NodeProto

    try:
        node = NodeProto()
        node.ParseFromString(base64.b64decode(text, validate=True))
    except Exception as e:  # noqa: BLE001 - binascii.Error, protobuf's DecodeError
        return f"its node attribute is not a serialized ONNX node ({type(e).__name__})"
    if node.op_type != label:
        return (f"labelled {label!r} but its ONNX node is {node.op_type or '(no op type)'!r}: the label must be "
                f"the node's op type")
    if opset not in OPSETS:
        return f"opset {opset} is not supported (supported: {OPSETS.start}-{OPSETS.stop - 1})"
    if why := form_refusal(node):
        return f"{label} cannot run on the host: {why}"
    names = [i for i in node.input if i]
    if len(names) != len(operands):
        return f"its ONNX node reads {len(names)} input(s) but the onnx_op has {len(operands)} operand(s)"
    if not 0 <= output < len(node.output) or not node.output[output]:
        return f"output {output} is not an output its ONNX node names ({len(node.output)} output(s))"
    consts: dict[str, np.ndarray] = {}
    typed: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    for name, (dt, shp), v in zip(names, operands, values, strict=True):
        if v is not None:
            consts[name] = np.frombuffer(v[2], dtype=np.dtype(v[0])).reshape(v[1])
        else:
            typed[name] = (DType(dt).numpy, shp)
    types = inferred_types(node, opset, consts, typed)
    if isinstance(types, str):
        return f"{label} cannot run on the host: {types}"
    want_dt, want_shape = types[node.output[output]]
    if (dtype, shape) != (want_dt.value, want_shape):
        return (f"declares {dtype}{list(shape)} but ONNX shape inference gives its {label} node "
                f"{want_dt.value}{list(want_shape)} on these operands")
    return None


__all__ = ["NEVER_ON_HOST", "ONNX_DTYPES", "OPSETS", "SMALL_FEED", "ForkedFailure", "form_refusal", "forked",
           "inferred_types", "node_domain", "onnx_op_problem", "onnx_op_problems", "single_node_model"]
