"""ONNX handlers of elementwise ops: numpy-broadcast binary and unary ops, Clip, CumSum, ArgMax, Reciprocal, Gelu,
Where, logic, Cast and Identity. Each maps exactly under the condition its docstring states."""

from __future__ import annotations

from typing import Any

import numpy as np

from ....ir.emitter import Ref
from ....ir.ops import ONNX_BINARY, ONNX_UNARY
from ..context import Value, _axis, _const, _Ctx, _ints, handles, onnx_dtype
from ..host import _host_op

# -- elementwise ---------------------------------------------------------------------------------------

@handles(*ONNX_BINARY)
def _binary(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Numpy-broadcast binary ops (two operands; Max/Min with more are folded pairwise)."""
    if len(x) < 2:
        raise ctx.fail("needs two operands")
    if n.op_type in ("Add", "Sub") and len(x) == 2:
        keep = _identity_operand(ctx, x[0], x[1], n.op_type == "Add")
        if keep is not None:
            return [keep]
    op = ONNX_BINARY[n.op_type]
    acc = ctx.ref(x[0])
    for y in x[1:]:
        acc = ctx.b.binary(op, acc, ctx.ref(y))
    return [acc]


def _is_zero(v: Value) -> bool:
    return isinstance(v, np.ndarray) and v.dtype.kind == "f" and not v.any()


def _identity_operand(ctx: _Ctx, a: Value, b: Value, commutative: bool) -> Value | None:
    """`x + 0`, `0 + x`, `x - 0` -> x, when the zero constant does not widen x's shape or dtype (exporters add
    an all-zero "no mask" tensor to attention scores, e.g. ViT). Exact except for the sign of a zero
    (-0.0 + 0.0 = +0.0), which no op here tells apart."""
    for x, z in ((a, b), (b, a)) if commutative else ((a, b),):
        if isinstance(x, Ref) and _is_zero(z) and ctx.dtype(x) == ctx.dtype(z) \
                and tuple(np.broadcast_shapes(ctx.shape(x), z.shape)) == ctx.shape(x):
            return x
    return None


@handles(*ONNX_UNARY)
def _unary(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    return [ctx.b.unary(ONNX_UNARY[n.op_type], ctx.ref(x[0]))]


@handles("Clip")
def _clip(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Clip(x, min, max) = min(max(x, lo), hi), each bound optional (opset >= 11: inputs). Exact: the same
    comparisons elementwise; a NaN x stays NaN (NumPy's and MLX's maximum/minimum propagate it, as Clip does); with
    min > max every element is max, as the spec says (max(x, lo) >= lo > hi)."""
    y = ctx.ref(x[0])
    lo = x[1] if len(x) > 1 else None
    hi = x[2] if len(x) > 2 else None
    if lo is not None:
        y = ctx.b.maximum(y, ctx.ref(lo))
    if hi is not None:
        y = ctx.b.minimum(y, ctx.ref(hi))
    return [y]


@handles("CumSum")
def _cumsum(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """CumSum(x, axis) with a constant axis -> `cumsum` (RoBERTa's position ids: cumsum of the mask)."""
    (axis,) = _ints(ctx, x[1], "axis")
    ax = _axis(ctx, axis, len(ctx.shape(x[0])))
    return [ctx.b.cumsum(ctx.ref(x[0]), ax, exclusive=bool(a.get("exclusive", 0)), reverse=bool(a.get("reverse", 0)))]


@handles("ArgMax")
def _argmax(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """ArgMax (the first largest index; select_last_index=1 is refused), i64 (CLIP's text pooling)."""
    if a.get("select_last_index", 0):  # the IR's argmax takes the first largest: the last one runs on the host
        if (host := _host_op(ctx, n, x, "")) is None:
            raise ctx.fail("select_last_index=1 is not supported (the IR's argmax takes the first largest)")
        return host
    ax = _axis(ctx, int(a.get("axis", 0)), len(ctx.shape(x[0])))
    return [ctx.b.argmax(ctx.ref(x[0]), ax, keepdims=bool(a.get("keepdims", 1)))]


@handles("Reciprocal")
def _reciprocal(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """1 / x (Reciprocal(Sqrt(y)) becomes rsqrt(y) in the pass canonicalize_exported.rsqrt)."""
    return [ctx.b.div(1.0, ctx.ref(x[0]))]


@handles("Gelu")
def _gelu(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    tanh = a.get("approximate", b"none") in (b"tanh", "tanh")
    return [ctx.b.gelu_tanh(ctx.ref(x[0])) if tanh else ctx.b.gelu(ctx.ref(x[0]))]


@handles("Where")
def _where(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    return [ctx.b.where(ctx.ref(x[0]), ctx.ref(x[1]), ctx.ref(x[2]))]


def _all_true(v: Value) -> bool:
    return isinstance(v, np.ndarray) and v.dtype == np.bool_ and bool(v.all())


@handles("And", "Or", "Not")
def _logic(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Boolean logic as `where`: and(p, q) = where(p, q, False), or(p, q) = where(p, True, q),
    not(p) = eq(p, False). `and` with an all-True constant is the other operand (expanded to the
    broadcast shape), which keeps exported attention masks in the form the mask guards know."""
    b = ctx.b
    if n.op_type == "Not":
        return [b.eq(ctx.ref(x[0]), ctx.ref(np.asarray(False)))]
    p, q = x
    out = tuple(np.broadcast_shapes(ctx.shape(p), ctx.shape(q)))
    if n.op_type == "And" and (_all_true(p) or _all_true(q)):
        keep = q if _all_true(p) else p
        r = ctx.ref(keep)
        return [r if ctx.shape(r) == out else b.expand(r, out)]
    if n.op_type == "And":
        return [b.where(ctx.ref(p), ctx.ref(q), ctx.ref(np.asarray(False)))]
    return [b.where(ctx.ref(p), ctx.ref(np.asarray(True)), ctx.ref(q))]


@handles("Cast")
def _cast(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    return [ctx.b.cast(ctx.ref(x[0]), onnx_dtype(int(a["to"])))]


@handles("Identity", "Dropout")
def _identity(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Identity; Dropout at inference (training_mode absent or false) is the identity too."""
    if n.op_type == "Dropout" and len(x) > 2 and x[2] is not None and bool(np.asarray(_const(x[2]))):
        raise ctx.fail("Dropout in training mode is not an inference graph")
    return [x[0]] + [None] * (len(n.output) - 1)

