"""Checking an ONNX model against its ops' definitions before it is imported: the default-domain opset
(`default_opset`), ONNX's strict shape inference and checker over the whole model (`validate`, in a bounded child
process, on a copy whose weights are graph inputs of their type and shape: `light_model`), and a contrib node's
inputs against ONNX Runtime's operator schemas (`_contrib_inputs`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from ...ir.bounded import WALL_FACTOR, ForkedFailure, forked
from ...ir.host_rules import OPSETS
from .context import CONTRIB, OnnxImportError, _onnx
from .weights import externals_as_inputs


@functools.cache
def _ort_schemas() -> dict[tuple[str, str], tuple[int, int, frozenset[int]]]:
    """(domain, op) -> (fewest, most inputs, the positions of the required ones), from ONNX Runtime's operator
    schemas (its contrib ops: ONNX's checker knows none of them), the latest version of each; {} without ONNX
    Runtime. An optional input may be empty ('') before a required one (EmbedLayerNormalization's segment_ids).
    Raises nothing."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

        found = sorted(ort_c.get_all_operator_schema(), key=lambda x: x.since_version)
    except Exception:  # noqa: BLE001 - not installed, or a build without schemas
        return {}
    def required(x: Any) -> frozenset[int]:
        return frozenset(i for i, p in enumerate(x.inputs) if p.option.name == "Single")

    return {(x.domain, x.name): (int(x.min_input), int(x.max_input), required(x)) for x in found}


def _contrib_inputs(node: Any, domain: str) -> str | None:
    """Why the inputs of a non-default-domain node do not fit its op's schema in ONNX Runtime (its domain's, else
    ORT's own default-domain registration: SimplifiedLayerNormalization), or None (fits, or no schema known):
    a handler never reads an input the node does not have. Raises nothing."""
    schemas = _ort_schemas()
    arity = schemas.get((domain, node.op_type)) or schemas.get(("", node.op_type))
    if arity is None:
        return None
    lo, hi, needed = arity
    n = len(node.input)
    if not lo <= n <= hi:
        want = f"{lo}" if lo == hi else f"{lo} to {hi}"
        return f"takes {want} input(s) (ONNX Runtime's schema of {domain}.{node.op_type}); the node has {n}"
    if (k := next((i for i in sorted(needed) if i < n and not node.input[i]), None)) is not None:
        return f"its required input {k} is empty (ONNX Runtime's schema of {domain}.{node.op_type})"
    return None


def default_opset(proto: Any) -> int:
    """The model's default-domain opset. Raises OnnxImportError outside `OPSETS`."""
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset not in OPSETS:
        raise OnnxImportError(f"opset {opset} is not supported (supported: {OPSETS.start}-{OPSETS.stop - 1}; "
                              f"convert with onnx.version_converter.convert_version)")
    return opset


def validate(proto: Any) -> None:
    """Refuse a model that breaks a rule of its ops' ONNX definitions (an axis outside the rank, a reshape target
    with two -1, mismatched types, ...), as ONNX Runtime does, instead of importing it with another meaning: ONNX's
    strict shape inference over the whole graph (external data not needed: it reads shapes only). The inference
    is native code that a malformed file can crash (a GatherND with batch_dims -5 segfaults onnx 1.2x), so it runs
    in a forked child where the platform has fork: a crash or a run past `VALIDATE_SECONDS` refuses the file.

    Then ONNX's checker (`_checker`): together with the strict inference, `onnx.checker`'s full check (an
    initializer with dims [-1, 8], a ReduceMean with an `axes` attribute at opset 18+ are refused here, as ONNX
    Runtime refuses them).

    Both read the model with its weights as graph inputs of their type and shape (`light_model`: the same verdicts,
    without copying hundreds of MB of weights into ONNX's native code twice).

    Raises:
        OnnxImportError: the first rule broken, naming the op (and node, when ONNX names it), in one line; or that
            the inference crashed or took too long on this file.
    """
    def check(in_place: bool) -> str:
        light = light_model(proto, in_place=in_place)  # the weights' types and shapes, not their bytes: same verdicts
        return _strict_inference(light) or _checker(light)

    # a forked child changes its own copy-on-write proto (the parent's is untouched); else a light copy is made
    why = _isolated(lambda: check(True)) if hasattr(os, "fork") else check(False)
    if why:
        raise OnnxImportError(why)


LIGHT_BYTES = 4096
"""Initializers of at least this many bytes are handed to ONNX's shape inference and checker as graph inputs of
their type and shape (`light_model`), not with their bytes."""

_WEIGHT_TYPES = frozenset({1, 2, 3, 4, 5, 9, 10, 11, 16})
"""ONNX element types (FLOAT, UINT8, INT8, UINT16, INT16, BOOL, FLOAT16, DOUBLE, BFLOAT16) whose initializers
`light_model` may hand over without their bytes. Not INT32/INT64: the types of the shape-like operands (a Reshape's
shape, a Slice's starts) whose values ONNX's shape inference reads."""


def _fields(message: Any) -> Any:
    return message.DESCRIPTOR.fields


def _copy_fields(src: Any, dst: Any, skip: str) -> None:
    """Copy every field of the message `src` but `skip` into the empty message `dst` of the same type."""
    for fd in _fields(src):
        if fd.name == skip:
            continue
        value = getattr(src, fd.name)
        if getattr(fd, "is_repeated", None) or getattr(fd, "label", None) == 3:  # 3: LABEL_REPEATED (older protobuf)
            getattr(dst, fd.name).extend(value)
        elif fd.message_type is not None:
            if src.HasField(fd.name):
                getattr(dst, fd.name).CopyFrom(value)
        elif src.HasField(fd.name):
            setattr(dst, fd.name, value)


def _weights(graph: Any, min_bytes: int, ir_version: int) -> dict[int, Any]:
    """Initializer index -> its graph input (`onnx.ValueInfoProto`) for each initializer of `graph` that ONNX's shape
    inference and checker judge by its type and shape alone: a `_WEIGHT_TYPES` tensor of positive dims and at least
    `min_bytes` bytes, held in the file's own `raw_data` (at least the bytes its shape needs: the checker refuses
    fewer) and no other value field, its name unique among initializers and node outputs, and declared as a graph
    input (old exporters), if at all, with exactly that type and shape (and declared at all below IR version 4, where
    the checker demands it). Anything else keeps its bytes, so the
    checker's rules on tensors (negative dims, short data, two value fields, a duplicate name) judge it as before."""
    onnx = _onnx()
    names: dict[str, int] = {}
    for t in graph.initializer:
        names[t.name] = names.get(t.name, 0) + 1
    made = {o for n in graph.node for o in n.output}
    declared = {vi.name: vi for vi in graph.input}
    out: dict[int, Any] = {}
    for i, t in enumerate(graph.initializer):
        if t.data_type not in _WEIGHT_TYPES or not t.dims or any(d <= 0 for d in t.dims) or not t.name \
                or names[t.name] != 1 or t.name in made or t.data_location == onnx.TensorProto.EXTERNAL:
            continue
        need = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        for d in t.dims:
            need *= d
        if need < min_bytes or not t.HasField("raw_data") or t.HasField("segment") or len(t.external_data) \
                or any(len(getattr(t, f)) for f in ("float_data", "int32_data", "string_data", "int64_data",
                                                    "double_data", "uint64_data")):
            continue
        vi = onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        if (declared[t.name] != vi if t.name in declared else ir_version < 4) or len(t.raw_data) < need:
            continue
        out[i] = vi
    return out


def light_model(proto: Any, min_bytes: int = LIGHT_BYTES, in_place: bool = False) -> Any:
    """A new `onnx.ModelProto` (with `in_place`: `proto` itself, CHANGED) equal to `proto` except that each weight
    `_weights` picks (at least `min_bytes` bytes) is a graph input of its type and shape instead of an initializer:
    ONNX's strict shape inference and checker copy the whole model into native code, and a 434 MB BERT-base export's
    weights cost them 12 s (measured: inference 7.7 -> 0.0 s, checker 4.2 -> 0.03 s). Their verdicts are the same:
    they read a weight's type and shape, never its values (the values shape inference reads are those of shape-like
    operands: int32/int64, or a few float scales per axis, far under `min_bytes`), and a weight the checker could
    refuse on its own keeps its bytes. Without `in_place`, `proto` is not changed and its weights are not copied
    (nodes and small tensors are); `in_place` copies nothing (for a forked child's own copy)."""
    onnx = _onnx()
    g = proto.graph
    moved = _weights(g, min_bytes, proto.ir_version)
    if in_place:
        declared = {vi.name for vi in g.input}
        g.input.extend(vi for vi in moved.values() if vi.name not in declared)
        for i in sorted(moved, reverse=True):
            del g.initializer[i]
        return proto
    out = onnx.ModelProto()
    _copy_fields(proto, out, "graph")
    if proto.HasField("graph"):
        _copy_fields(g, out.graph, "initializer")
        out.graph.initializer.extend(t for i, t in enumerate(g.initializer) if i not in moved)
        declared = {vi.name for vi in g.input}
        out.graph.input.extend(vi for vi in moved.values() if vi.name not in declared)
    return out


def _ort_ops_aside(proto: Any) -> None:
    """Make ONNX's checker pass over the ops only ONNX Runtime defines, as ONNX Runtime runs them: a default-domain
    op ONNX has no schema for but ORT registers (SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization) is
    moved to ORT's domain, and ORT's domain gets an opset import when a node uses it without one (the checker
    skips ops of a domain it has no schemas for). Their inputs are checked against ORT's schemas instead
    (`_contrib_inputs`). CHANGES `proto` (the checker's copy)."""
    onnx = _onnx()
    ort_default = {op for dom, op in _ort_schemas() if dom == ""}
    for n in proto.graph.node:
        if not n.domain and n.op_type in ort_default and not onnx.defs.has(n.op_type):
            n.domain = CONTRIB
    if any(n.domain == CONTRIB for n in proto.graph.node) and not any(o.domain == CONTRIB for o in proto.opset_import):
        proto.opset_import.add(domain=CONTRIB, version=1)


def _checker(proto: Any) -> str:
    """'' when ONNX's checker accepts `proto` (its structure against the schemas of its opset: attributes each op
    defines, non-negative initializer dims, names, ...), else why not (one line). The checker also demands a type
    and a shape on every graph input and output, which ONNX Runtime does not (exporters leave an output's type or
    shape out; the strict inference, run first, checks the types that are there): those are given placeholders here
    first, so this CHANGES `proto` (called on `light_model`'s copy)."""
    onnx = _onnx()
    externals_as_inputs(proto)  # weights left in their file (onnx_weights): checked as inputs of their type
    for vi in (*proto.graph.input, *proto.graph.output):
        if not vi.HasField("type"):
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape"):
            vi.type.tensor_type.shape.SetInParent()
    _ort_ops_aside(proto)
    try:
        onnx.checker.check_model(proto)
    except Exception as e:  # noqa: BLE001 - ValidationError: the model is invalid
        text = " ".join(str(e).split()).replace(" ==> Context: ", "; ")
        if "must be topologically sorted" in text:  # the importer refuses each such node, naming the cycle or the
            return ""                                # dangling input (`import_graph`: "reads 'b', which no ...")
        return f"invalid ONNX model (rejected by the ONNX checker, as ONNX Runtime would): {text[:400]}"
    return ""


VALIDATE_SECONDS = 60.0
"""CPU time ONNX's whole-model shape inference may take in its child process (`RLIMIT_CPU` there); its wall time
is bounded at `bounded.WALL_FACTOR` times it."""


def _strict_inference(proto: Any) -> str:
    """'' when ONNX's strict shape inference accepts `proto`, else why not (one line)."""
    onnx = _onnx()
    try:
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    except Exception as e:  # noqa: BLE001 - InferenceError / ValidationError: the model is invalid
        text = " ".join(str(e).split())
        for prefix in ("[ShapeInferenceError] Inference error(s):", "[TypeInferenceError] Inference error(s):"):
            text = text.replace(prefix, "").strip()
        return f"invalid ONNX model (rejected by ONNX shape inference, as ONNX Runtime would): {text[:400]}"
    return ""


def _isolated(check: Callable[[], str]) -> str:
    """Run `check` in a forked child (`ir.bounded.forked`, the one bounded child-process helper) and return its text.
    The child may use `VALIDATE_SECONDS` of CPU time (`RLIMIT_CPU`: past it the kernel ends it with SIGXCPU) and
    `bounded.WALL_FACTOR` times that in wall time (a stopped or starved child); a child killed by a signal or past
    either limit gives a refusal saying so."""
    try:
        return forked(check, VALIDATE_SECONDS * WALL_FACTOR, cpu_s=VALIDATE_SECONDS)
    except ForkedFailure as e:
        if e.signal == "SIGXCPU":
            return f"ONNX's shape inference took over {VALIDATE_SECONDS:g} s of CPU time on this file; refused"
        if e.timed_out:
            return (f"ONNX's shape inference took over {VALIDATE_SECONDS * WALL_FACTOR:g} s of wall time on this file "
                    "(stopped or starved); refused")
        if e.signal:
            return f"ONNX's shape inference crashed on this file ({e.signal}): it is malformed; refused"
        return "ONNX's shape inference failed on this file; refused"


__all__ = ["LIGHT_BYTES", "VALIDATE_SECONDS", "default_opset", "light_model", "validate"]
