"""ONNX handlers of linear algebra (MatMul, Gemm, Conv), normalisation, softmax and reductions. Each maps exactly
under the condition its docstring states."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ....ir.emitter import Ref
from ..context import Value, _axis, _const, _Ctx, _ints, _last_axis, _zeros_like_gamma, handles
from ..host import _host_op
from .movement import _reshape_source, _reshape_to

# -- linear algebra --------------------------------------------------------------------------------------

@handles("MatMul")
def _matmul(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    if len(ctx.shape(x[0])) < 2 or len(ctx.shape(x[1])) < 2:
        raise ctx.unsupported("rank-1 operands are not supported (the IR's matmul takes rank >= 2)")
    return [ctx.b.matmul(ctx.ref(x[0]), ctx.ref(x[1]))]


@handles("Gemm")
def _gemm(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """alpha * A' @ B' + beta * C; a transposed constant B is transposed at import."""
    b = ctx.b
    A, B = x[0], x[1]
    if a.get("transA", 0):
        A = A.T if isinstance(A, np.ndarray) else b.transpose(A, (1, 0))
    if a.get("transB", 0):
        B = np.ascontiguousarray(B.T) if isinstance(B, np.ndarray) else b.transpose(B, (1, 0))
    flat_rows = False
    if isinstance(A, Ref) and not a.get("transA", 0):
        src = _reshape_source(ctx, A)
        ss, (rows, k) = ctx.shape(src), ctx.shape(A)
        # GPT-2's Conv1D: view(-1, H) -> Gemm -> view(B, S, N). Rows are independent in a matmul, so the
        # Gemm on [B, S, H] followed by a flatten is the same; the restoring view then collapses and the
        # projection looks like every other linear
        flat_rows = len(ss) >= 3 and ss[0] * ss[1] == rows and math.prod(ss[2:]) == k
        if flat_rows:
            A = _reshape_to(ctx, src, (ss[0], ss[1], k))
    y = b.matmul(ctx.ref(A), ctx.ref(B))
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    if alpha != 1.0:
        y = b.mul(y, alpha)
    if len(x) > 2 and x[2] is not None:
        c = x[2]
        if beta != 1.0:
            c = c * np.float32(beta) if isinstance(c, np.ndarray) else b.mul(c, beta)
        y = b.add(y, ctx.ref(c))
    if flat_rows:
        shape = ctx.shape(y)
        y = b.reshape(y, (math.prod(shape[:-1]), shape[-1]))
    return [y]


@handles("Conv")
def _conv(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """A 2-D patch embedding (kernel == strides, no padding, dilation 1, group 1, H and W divisible by the kernel:
    ViT) is written as patchify (reshape + transpose), matmul with the flattened kernel, bias. Any other Conv
    (Whisper's 1-D stem, padded or strided kernels) is a host node (`ir.onnx_op`, run by ONNX Runtime)."""
    b = ctx.b
    w = _const(x[1])
    xs = ctx.shape(x[0])
    group = int(a.get("group", 1))
    if w is not None and (len(xs) != w.ndim or w.ndim < 3 or xs[1] != w.shape[1] * group):
        raise ctx.fail(f"input {list(xs)} does not fit the kernel {list(w.shape)} with group {group} (ONNX Conv needs "
                       f"[N, C, *spatial] of the kernel's rank with C = kernel channels * group)")
    if w is None or w.ndim != 4:
        return _conv_on_host(ctx, n, x, "a convolution that is not a 2-D patch embedding with a constant kernel")
    o, c, kh, kw = w.shape
    strides = list(a.get("strides", [1, 1]))
    pads = list(a.get("pads", [0, 0, 0, 0]))
    ok = (len(xs) == 4 and strides == [kh, kw] and not any(pads) and int(a.get("group", 1)) == 1
          and list(a.get("dilations", [1, 1])) == [1, 1] and a.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET")
          and xs[2] % kh == 0 and xs[3] % kw == 0 and xs[1] == c)
    if not ok:
        return _conv_on_host(ctx, n, x, f"kernel {[kh, kw]}, strides {strides}, pads {pads}, input {list(xs)} is not a "
                                        "patch embedding (kernel == strides, no padding, no groups)")
    bn, hp, wp = xs[0], xs[2] // kh, xs[3] // kw
    t = b.reshape(ctx.ref(x[0]), (bn, c, hp, kh, wp, kw))
    t = b.transpose(t, (0, 2, 4, 1, 3, 5))
    t = b.reshape(t, (bn, hp * wp, c * kh * kw))
    y = b.matmul(t, ctx.ref(np.ascontiguousarray(w.reshape(o, c * kh * kw).T)))
    if len(x) > 2 and x[2] is not None:
        y = b.add(y, ctx.ref(x[2]))
    y = b.transpose(b.reshape(y, (bn, hp, wp, o)), (0, 3, 1, 2))
    return [y]


def _conv_on_host(ctx: _Ctx, n: Any, x: list[Value], why: str) -> list[Value]:
    if (host := _host_op(ctx, n, x, "")) is None:
        raise ctx.fail(f"{why}, and ONNX shape inference does not fix its output type for a host node")
    return host


# -- normalisation and softmax -----------------------------------------------------------------------------

@handles("LayerNormalization")
def _layer_norm(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """LayerNormalization over the last axis; a missing bias is zeros. Mean / InvStdDev outputs unsupported."""
    _last_axis(ctx, x[0], int(a.get("axis", -1)))
    if len(n.output) > 1 and any(n.output[1:]):
        raise ctx.unsupported("the Mean / InvStdDev outputs are not supported")
    beta = ctx.ref(x[2]) if len(x) > 2 and x[2] is not None else _zeros_like_gamma(ctx, x[1])
    return [ctx.b.layer_norm(ctx.ref(x[0]), ctx.ref(x[1]), beta, float(a.get("epsilon", 1e-5)))]


@handles("Softmax")
def _softmax(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Softmax (opset >= 13: over one axis, default -1)."""
    return [ctx.b.softmax(ctx.ref(x[0]), int(a.get("axis", -1)))]


@handles("ReduceMean", "ReduceSum", "ReduceMax")
def _reduce(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Axes from the attribute (ReduceMean/Max before opset 18) or the second input; keepdims default 1."""
    rank = len(ctx.shape(x[0]))
    if len(x) > 1 and x[1] is not None:
        axes = _ints(ctx, x[1], "axes")
    else:
        axes = [int(v) for v in a.get("axes", [])]
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            return [x[0]]
        axes = list(range(rank))
    fn = {"ReduceMean": ctx.b.reduce_mean, "ReduceSum": ctx.b.reduce_sum, "ReduceMax": ctx.b.reduce_max}[n.op_type]
    picked = tuple(_axis(ctx, v, rank, "reduce axis") for v in axes)
    return [fn(ctx.ref(x[0]), picked, keepdims=bool(a.get("keepdims", 1)))]

