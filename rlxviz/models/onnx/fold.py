"""Constant folding at ONNX import, bounded before it runs.

Exporters compute shapes, position ids and mask tables from constants (Shape -> Gather -> Concat, Range,
ConstantOfShape, Trilu, ...). Once batch and seq are bound those nodes have constant inputs and are evaluated
here, so they never reach the IR. A hostile file can make the same step unbounded (a backtracking
`RegexFullMatch`, a `Loop` of 10^9 trips, a constant `If` branch of 40 GB, a 6000^3 MatMul), so folding is
restricted:

* **An allow-list** (`FOLDABLE`): the ops exporters use for shape arithmetic and constant tables. Control flow
  (`If`, `Loop`, `Scan`), string ops, random ops, and anything else are never evaluated here; a node of such an
  op with constant inputs is mapped like any other node, or refused naming it.
* **A cost bound checked first** (`check_fold`): the output shapes come from ONNX shape inference with data
  propagation over the small constant inputs (or, for `Range` and `NonZero`, from their own formula); an output
  whose shape cannot be known before running is refused. Each output is bounded by `MAX_FOLD_ELEMENTS`, all of
  them together with the constants already held by the memory limit, and a product (MatMul, Gemm, Einsum) by
  `MAX_FOLD_FLOPS`.

Errors are `FoldError` (a ValueError, one line), which the importer turns into its own error naming the node.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ...ir.host_rules import single_node_model
from ...ir.memory import format_bytes
from .context import Value, _Ctx

MAX_FOLD_ELEMENTS = 1 << 26
"""The most elements one folded output may hold (64 Mi: a [1, 1, 8192, 8192] causal table fits)."""

MAX_FOLD_FLOPS = 2_000_000_000
"""The most multiply-adds one folded product may take (~0.1-1 s in NumPy on one core)."""

FOLDABLE = frozenset({
    # shape arithmetic and constant tables
    "Constant", "ConstantOfShape", "Range", "Gather", "GatherElements", "GatherND", "Unsqueeze", "Squeeze",
    "Concat", "Slice", "Split", "Cast", "CastLike", "Reshape", "Expand", "Tile", "Transpose", "Flatten",
    "Identity", "Trilu", "CumSum", "NonZero", "ScatterND", "ScatterElements", "Pad", "OneHot",
    # elementwise
    "Add", "Sub", "Mul", "Div", "Mod", "Pow", "Neg", "Abs", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round",
    "Sign", "Exp", "Log", "Sin", "Cos", "Erf", "Tanh", "Sigmoid", "Relu", "Clip", "IsNaN", "IsInf",
    "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Where", "Min", "Max",
    # reductions and products
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ArgMax", "ArgMin", "Softmax",
    "MatMul", "Gemm", "Einsum",
})
"""Default-domain ops evaluated at import when every input is constant."""

_PRODUCTS = frozenset({"MatMul", "Gemm", "Einsum"})


class FoldError(ValueError):
    """A constant node that is not evaluated at import: the reason, in words (one line)."""


def node_attrs(node: Any) -> dict[str, Any]:
    """An ONNX node's attributes by name, as Python values."""
    from onnx import helper

    return {at.name: helper.get_attribute_value(at) for at in node.attribute}


def _range_shape(inputs: list[np.ndarray | None]) -> tuple[int, ...]:
    """Range's length, max(ceil((limit - start) / delta), 0), from its three scalar inputs (ONNX spec)."""
    start, limit, delta = (np.asarray(v).reshape(()).item() for v in inputs)
    if delta == 0:
        raise FoldError("Range with delta 0 never ends")
    return (max(math.ceil((limit - start) / delta), 0),)


Shape = tuple[tuple[int, ...], np.dtype]
"""An output's shape and dtype."""


def inferred_outputs(node: Any, inputs: list[np.ndarray | None], opset: int) -> list[Shape | None]:
    """The shape and dtype of each output of `node` on these constant inputs, before evaluating it: from ONNX
    shape inference with data propagation over the small inputs; None for an output it cannot fix.
    Raises nothing."""
    import onnx
    from onnx import helper

    n_out = len([o for o in node.output if o])
    if node.op_type == "Range" and len(inputs) == 3 and all(v is not None for v in inputs):
        try:
            return [(_range_shape(inputs), np.asarray(inputs[0]).dtype)]
        except (FoldError, TypeError, ValueError, OverflowError):
            return [None]
    if node.op_type == "NonZero" and inputs and inputs[0] is not None:  # data dependent: at most rank x size
        x = np.asarray(inputs[0])
        return [((x.ndim, x.size), np.dtype(np.int64))]
    try:
        consts = {name: arr for name, arr in zip(node.input, inputs, strict=False) if name and arr is not None}
        m = single_node_model(node, opset, consts, {})
        m = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference failing means the shapes are unknown: refused by check_fold
        return [None] * n_out
    found: list[Shape | None] = []
    for vi in m.graph.output:
        t = vi.type.tensor_type
        if not t.elem_type or not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
            found.append(None)
            continue
        try:
            dt = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        except Exception:  # noqa: BLE001 - a type NumPy lacks
            found.append(None)
            continue
        found.append((tuple(int(d.dim_value) for d in t.shape.dim), dt))
    return found


def _flops(node: Any, inputs: list[np.ndarray | None], out: tuple[int, ...]) -> int:
    """Multiply-adds of a product: output elements x the contracted length (Einsum: the product of every
    distinct input dimension, an upper bound)."""
    if node.op_type == "Einsum":
        dims: dict[str, int] = {}
        spec = node_attrs(node).get("equation", b"")
        lhs = (spec.decode() if isinstance(spec, bytes) else str(spec)).split("->")[0].replace(" ", "")
        for term, arr in zip(lhs.split(","), inputs, strict=False):
            if arr is None or "." in term:
                return math.prod(int(a.size) for a in inputs if a is not None)
            for c, d in zip(term, arr.shape, strict=False):
                dims[c] = int(d)
        return math.prod(dims.values())
    a = inputs[0]
    if a is None or a.ndim == 0:
        return math.prod(out)
    k = a.shape[0] if node.op_type == "Gemm" and node_attrs(node).get("transA", 0) else a.shape[-1]
    return math.prod(out) * int(k)


def human_bytes(n: float) -> str:
    """`n` bytes as `12 B`, `3.4 KiB`, `149.0 GiB`, as the session's messages say them (`session.limits.human_bytes`,
    which the importer, a floor below the session, does not import)."""
    return format_bytes(round(n))


def check_fold(node: Any, inputs: list[np.ndarray | None], opset: int, held_bytes: int,
               max_bytes: int | None) -> None:
    """Refuse folding `node` unless it is allow-listed and its cost is known and bounded, before it runs.

    Args:
        node: an ONNX NodeProto of the default domain whose inputs are all constant (or absent).
        inputs: the constant inputs (None for an absent optional input).
        held_bytes: bytes of constants already held by the import.
        max_bytes: the memory limit (None: only the fixed bounds apply).

    Raises:
        FoldError: not an allow-listed op; an output whose shape cannot be known before running; an output over
            `MAX_FOLD_ELEMENTS`; all outputs with `held_bytes` over `max_bytes`; a product over `MAX_FOLD_FLOPS`.
    """
    if node.op_type not in FOLDABLE:
        kind = ("control flow" if node.op_type in ("If", "Loop", "Scan", "SequenceMap")
                else "a string op" if "String" in node.op_type or "Regex" in node.op_type else "not a shape op")
        raise FoldError(f"its inputs are constant, but {node.op_type} ({kind}) is not evaluated at import: only "
                        f"the shape arithmetic exporters emit is folded, each bounded before it runs")
    total = 0
    for i, found in enumerate(inferred_outputs(node, inputs, opset)):
        if found is None:
            raise FoldError(f"the shape of output {i} cannot be known before folding it, so its cost cannot be "
                            f"bounded")
        shape, dt = found
        elems = math.prod(shape)
        need = elems * dt.itemsize
        total += need
        if max_bytes is not None and held_bytes + total > max_bytes:
            held = f" (with {human_bytes(held_bytes)} of constants already held)" if need <= max_bytes else ""
            raise FoldError(f"folding it would materialize a constant {dt.name}{list(shape)} of {human_bytes(need)}"
                            f"{held}, over the limit of {human_bytes(max_bytes)}; use smaller shapes, or raise "
                            f"RLXVIZ_MAX_MEMORY_MB (CLI: --max-memory-mb) if the machine has the memory")
        if elems > MAX_FOLD_ELEMENTS:
            raise FoldError(f"folding it would build a constant {dt.name}{list(shape)} of {elems:,} elements "
                            f"({human_bytes(need)}), over the {MAX_FOLD_ELEMENTS:,} a folded constant may hold")
        if node.op_type in _PRODUCTS and (flops := _flops(node, inputs, shape)) > MAX_FOLD_FLOPS:
            raise FoldError(f"folding it would take {flops:,} multiply-adds, over the {MAX_FOLD_FLOPS:,} a folded "
                            f"product may take")


def _gather_elements(node: Any, x: list[np.ndarray | None], a: dict[str, Any]) -> list[np.ndarray]:
    data, idx = x[0], np.asarray(x[1])
    axis = int(a.get("axis", 0)) % data.ndim
    return [np.take_along_axis(data, np.where(idx < 0, idx + data.shape[axis], idx), axis=axis)]


_NUMPY_FOLDS: dict[str, Callable[[Any, list[np.ndarray | None], dict[str, Any]], list[np.ndarray]]] = {
    "GatherElements": _gather_elements}
"""Folds done in NumPy where onnx.reference is wrong (its GatherElements breaks past 32 choices, onnx 1.23)."""


def fold(node: Any, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """Evaluate one standard node on constant inputs with ONNX's reference evaluator (call `check_fold` first).
    Raises whatever the evaluator raises for an invalid node.

    IEEE results are the node's values, not faults: `log(0) = -inf` in T5's relative-position buckets, clipped a few
    nodes later (ONNX Runtime computes the same), so NumPy's floating-point warnings are silenced here; a user saw
    them as `warning: divide by zero encountered in log` on a good file."""
    from onnx.reference import ReferenceEvaluator

    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        if node.op_type in _NUMPY_FOLDS:
            return _NUMPY_FOLDS[node.op_type](node, inputs, node_attrs(node))
        feeds = {name: arr for name, arr in zip(node.input, inputs, strict=True) if name}
        ev = ReferenceEvaluator(node, opsets={"": opset})
        return [np.asarray(o) for o in ev.run(None, feeds)]


def _shape_op(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> np.ndarray:
    s = ctx.shape(x[0])
    if n.op_type == "Size":
        return np.asarray(math.prod(s), dtype=np.int64)
    r = len(s)
    start = int(a.get("start", 0))
    end = int(a.get("end", r))
    start = max(0, min(r, start + r if start < 0 else start))
    end = max(0, min(r, end + r if end < 0 else end))
    return np.asarray(s[start:end], dtype=np.int64)


__all__ = ["FOLDABLE", "MAX_FOLD_ELEMENTS", "MAX_FOLD_FLOPS", "FoldError", "check_fold", "fold", "inferred_outputs",
           "node_attrs", "single_node_model"]
