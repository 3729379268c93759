"""Quantized ONNX ops, written as IR decompositions with int8/uint8 tensors (registered into `onnx.context.HANDLERS`).

`onnxruntime.quantization` writes two forms, both read here with their exact meaning:

* **QDQ** (`quantize_static`): `QuantizeLinear` / `DequantizeLinear` pairs around float ops. DequantizeLinear is
  `(cast(x, f32) - cast(zero_point, f32)) * scale`; QuantizeLinear is `saturate(round(x / scale) + zero_point)` cast
  to the zero point's type (u8 or i8). A constant quantized weight stays an i8/u8 param (its 1 byte per element is
  the point of quantizing), so the dequantization is a visible step of the graph: `cast -> sub -> mul` before the
  matmul that reads it.
* **Dynamic** (`quantize_dynamic`): `DynamicQuantizeLinear(x)` picks a per-tensor u8 scale and zero point from the
  tensor's own range (ONNX's formula: `scale = (max(0, max x) - min(0, min x)) / 255`, zero point
  `round(-min(0, min x) / scale)`), and `MatMulInteger(a, b, a_zp, b_zp) = (a - a_zp) @ (b - b_zp)` in int32. The
  importer writes the product in f32 chunks of the contraction axis small enough that every partial sum is an
  integer below 2**24 (so each chunk's f32 matmul is exact in any summation order), each chunk cast to i32 and
  the chunks added in i32: exact for every input, as ONNX Runtime's int32 kernel.

Rounding: QuantizeLinear and DynamicQuantizeLinear (its data and its zero point) round half to even, as ONNX and
ONNX Runtime's kernels (`nearbyint` of `x / scale`) do (`round_half_even`): a decomposition through `floor`, exact
for |v| < 2**23 (larger values saturate either way: the result is the same).

Forms refused in one line naming the node: blocked quantization (opset 21 `block_size`), float8/int4 types (no IR
dtype), a computed (non-constant) scale for QuantizeLinear/DequantizeLinear along an axis.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ....ir import DType
from ....ir.emitter import Ref
from ..context import Value, _axis, _Ctx, handles

_RANGES = {DType.u8: (0, 255), DType.i8: (-128, 127)}
"""The saturation range of each quantized type."""

EXACT_F32 = 1 << 24
"""Integers up to 2**24 are exact in f32; a chunk's partial sums stay below it."""


def _qtype(ctx: _Ctx, zp: Value, attrs: dict[str, Any], default: DType = DType.u8) -> DType:
    """The quantized type: the zero point's dtype, else `output_dtype` (opset 21), else u8."""
    if zp is not None:
        dt = ctx.dtype(zp)
    elif attrs.get("output_dtype"):
        from ..context import onnx_dtype

        dt = onnx_dtype(int(attrs["output_dtype"]))
    else:
        dt = default
    if dt not in _RANGES:
        raise ctx.fail(f"quantized type {dt} is not supported (supported: uint8, int8)")
    return dt


def round_half_even(ctx: _Ctx, v: Ref) -> Ref:
    """`rint(v)` (ties to even) of an f32 node through floor: `f = floor(v)`, `d = v - f`; `f + 1` when d > 0.5,
    f when d < 0.5, and on a tie the even one of f and f + 1 (`f + (f - 2 floor(f / 2))`). Exact for |v| < 2**23
    (v - f and f / 2 are exact there)."""
    b = ctx.b
    f = b.floor(v)
    d = b.sub(v, f)
    odd = b.sub(f, b.mul(b.floor(b.mul(f, 0.5)), 2.0))  # 1.0 for an odd f, 0.0 for an even one
    tie = b.add(f, odd)
    return b.where(b.gt(d, 0.5), b.add(f, 1.0), b.where(b.lt(d, 0.5), f, tie))


def _f32(ctx: _Ctx, v: Value) -> Ref:
    """`v` as an f32 node: a quantized tensor (an int8/uint8 constant of more than one element: a weight) stays its
    1-byte param, cast on the graph; any other constant is converted at import (exact for int8/uint8/int32)."""
    if isinstance(v, np.ndarray) and (v.size <= 1 or v.dtype not in (np.int8, np.uint8)):
        return ctx.ref(np.asarray(v, dtype=np.float32))
    r = ctx.ref(v)
    return r if ctx.dtype(r) == DType.f32 else ctx.b.cast(r, DType.f32)


def _is_zero(v: Value) -> bool:
    return v is None or isinstance(v, np.ndarray) and not np.asarray(v).any()


def _along(ctx: _Ctx, v: Value, axis: int | None, rank: int) -> Value:
    """A per-axis scale / zero point `[C]` reshaped to broadcast along `axis` of a rank-`rank` tensor."""
    if axis is None or not isinstance(v, np.ndarray) or v.ndim != 1 or v.size == 1:
        return v
    shape = [1] * rank
    shape[axis] = v.size
    return v.reshape(shape)


def _scale_axis(ctx: _Ctx, x: Value, scale: Value, attrs: dict[str, Any]) -> int | None:
    if int(attrs.get("block_size", 0) or 0):
        raise ctx.fail("blocked quantization (block_size) is not supported")
    rank = len(ctx.shape(x))
    if math.prod(ctx.shape(scale)) <= 1:
        return None
    if not isinstance(scale, np.ndarray):
        raise ctx.fail("a per-axis scale must be a constant")
    return _axis(ctx, int(attrs.get("axis", 1)), rank)


@handles("DequantizeLinear")
def dequantize_linear(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """DequantizeLinear(x, scale[, zero_point]) = (x - zero_point) * scale in f32; per-tensor or per-axis (a
    constant scale along `axis`). An i32 x (a bias) is exact in f32 up to 2**24."""
    data, scale = x[0], x[1]
    zp = x[2] if len(x) > 2 else None
    axis = _scale_axis(ctx, data, scale, a)
    rank = len(ctx.shape(data))
    if ctx.dtype(scale) != DType.f32:
        raise ctx.fail(f"scale of type {ctx.dtype(scale)} is not supported (float only)")
    b = ctx.b
    y = _f32(ctx, data)
    if not _is_zero(zp):
        y = b.sub(y, _f32(ctx, _along(ctx, zp, axis, rank)))
    return [b.mul(y, ctx.ref(_along(ctx, scale, axis, rank)))]


def _quantize(ctx: _Ctx, xf: Ref, scale: Ref, zp: Ref | None, qt: DType) -> Ref:
    """saturate(round_half_even(x / scale) + zp), cast to `qt` (ONNX Runtime divides by the scale too)."""
    b = ctx.b
    lo, hi = _RANGES[qt]
    y = round_half_even(ctx, b.div(xf, scale))
    if zp is not None:
        y = b.add(y, zp)
    y = b.minimum(b.maximum(y, float(lo)), float(hi))
    return b.cast(y, qt)


@handles("QuantizeLinear")
def quantize_linear(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """QuantizeLinear(x, scale[, zero_point]) = saturate(round(x / scale) + zero_point) as u8/i8 (ties to even);
    per-tensor or per-axis with a constant scale. A float x of another width is computed in f32 (f16 values and
    bf16 ones are exact in f32)."""
    data, scale = x[0], x[1]
    zp = x[2] if len(x) > 2 else None
    qt = _qtype(ctx, zp, a)
    if not int(a.get("saturate", 1)):
        raise ctx.fail("saturate=0 applies to float8 outputs only")
    axis = _scale_axis(ctx, data, scale, a)
    rank = len(ctx.shape(data))
    zr = None if _is_zero(zp) else _f32(ctx, _along(ctx, zp, axis, rank))
    return [_quantize(ctx, _f32(ctx, data), _f32(ctx, _along(ctx, scale, axis, rank)), zr, qt)]


@handles("DynamicQuantizeLinear")
def dynamic_quantize_linear(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """DynamicQuantizeLinear(x f32) -> (y u8, scale f32 [], zero_point u8 []), over the whole tensor:
    lo = min(0, min x), hi = max(0, max x); scale = (hi - lo) / 255 (1 when hi == lo, as ONNX Runtime: an all-zero
    x); zero_point = round_half_even(clamp(-lo / scale, 0, 255)) (ONNX Runtime's `GetQuantizationParameter`);
    y = saturate(round_half_even(x / scale) + zero_point), the division and rounding of its `MlasQuantizeLinear`."""
    b = ctx.b
    xf = ctx.ref(x[0])
    if ctx.dtype(xf) != DType.f32:
        raise ctx.fail(f"input of type {ctx.dtype(xf)} is not supported (float only)")
    axes = tuple(range(len(ctx.shape(xf))))
    hi = b.maximum(b.reduce_max(xf, axes), 0.0)
    lo = b.minimum(b.neg(b.reduce_max(b.neg(xf), axes)), 0.0)
    span = b.sub(hi, lo)
    scale = b.where(b.eq(span, 0.0), 1.0, b.div(span, 255.0))
    zpf = round_half_even(ctx, b.minimum(b.maximum(b.div(b.neg(lo), scale), 0.0), 255.0))
    y = _quantize(ctx, xf, scale, zpf, DType.u8)
    outs: list[Value] = [y, scale, b.cast(zpf, DType.u8)]
    return outs[:len(n.output)]


def _centered(ctx: _Ctx, v: Value, zp: Value, axis_of_zp: int | None, rank: int) -> tuple[Value, int]:
    """`v - zp` as f32 (a constant folded at import), and the largest |v - zp| it can hold (the type's span)."""
    if isinstance(v, np.ndarray) and (zp is None or isinstance(zp, np.ndarray)):
        z = 0 if zp is None else np.asarray(_along(ctx, zp, axis_of_zp, rank), dtype=np.int64)
        c = np.asarray(v, dtype=np.int64) - z
        return c.astype(np.float32), int(np.abs(c).max(initial=0))  # |c| <= 255: exact in f32
    lo, hi = _RANGES.get(ctx.dtype(v), (0, 0))
    y = _f32(ctx, v)
    if not _is_zero(zp):
        y = ctx.b.sub(y, _f32(ctx, _along(ctx, zp, axis_of_zp, rank)))
    return y, hi - lo


@handles("MatMulInteger")
def matmul_integer(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """MatMulInteger(A, B[, a_zero_point][, b_zero_point]) = (A - a_zp) @ (B - b_zp) in int32, A and B uint8/int8.
    Computed as f32 matmuls over chunks of K rows (each chunk's |partial sums| below 2**24, so exact), each cast to
    i32, the chunks added in i32: the int32 result for every input. A constant B (the usual weight) is kept as its
    int8/uint8 param and converted on the graph; its zero point, when not 0, subtracted there too. A per-column b
    zero point ([N]) is supported; a per-row a zero point is refused."""
    A, B = x[0], x[1]
    azp = x[2] if len(x) > 2 else None
    bzp = x[3] if len(x) > 3 else None
    for v in (A, B):
        if ctx.dtype(v) not in _RANGES:
            raise ctx.fail(f"operand of type {ctx.dtype(v)} is not supported (uint8 or int8)")
    sa, sb = ctx.shape(A), ctx.shape(B)
    if len(sa) < 2 or len(sb) < 2:
        raise ctx.unsupported("rank-1 operands are not supported (the IR's matmul takes rank >= 2)")
    if azp is not None and math.prod(ctx.shape(azp)) > 1:
        raise ctx.fail("a per-row zero point for A is not supported")
    b = ctx.b
    ac, amax = _centered(ctx, A, azp, None, len(sa))
    if isinstance(B, np.ndarray):  # a weight: kept as its i8/u8 param, converted (and centered) on the graph
        bz = None if bzp is None else _along(ctx, bzp, len(sb) - 1, len(sb)) if np.ndim(bzp) == 1 else bzp
        _, bmax = _centered(ctx, B, bz, None, len(sb))
        bc: Value = ctx.b.cast(ctx.ref(B), DType.f32)
        if not _is_zero(bz):
            bc = b.sub(bc, _f32(ctx, bz))
    else:
        bc, bmax = _centered(ctx, B, bzp, len(sb) - 1, len(sb))
    k = sa[-1]
    step = max(1, (EXACT_F32 - 1) // max(1, amax * bmax))
    parts = []
    for start in range(0, k, step):
        size = min(step, k - start)
        pa = ac if size == k else b.narrow(ctx.ref(ac), len(sa) - 1, start, size)
        pb = bc if size == k else b.narrow(ctx.ref(bc), len(sb) - 2, start, size)
        parts.append(b.cast(b.matmul(ctx.ref(pa), ctx.ref(pb)), DType.i32))
    out = parts[0]
    for p in parts[1:]:
        out = b.add(out, p)
    return [out]


__all__ = ["EXACT_F32", "dequantize_linear", "dynamic_quantize_linear", "matmul_integer", "quantize_linear",
           "round_half_even"]


QUANT_STEPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
"""ONNX ops a quantizer inserts around the exporter's nodes (with no module path of their own)."""


def quant_paths(nodes: Any, paths: list[str]) -> list[str]:
    """`paths` (one per ONNX node, in graph order) with each pathless quantization step given the path of the value
    it quantizes: the node producing its first input (an activation's QuantizeLinear, the DequantizeLinear of that),
    else its first reader's (a weight's DequantizeLinear: the matmul that reads it). `onnxruntime.quantization`
    names the nodes it inserts after values (`val_114_QuantizeLinear`), so without this they belong to no layer and
    a layer's quantized activations are invisible to its verdict. Other nodes keep their path."""
    out = list(paths)
    producer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    for k, n in enumerate(nodes):
        for v in n.input:
            readers.setdefault(v, []).append(k)
        for v in n.output:
            producer[v] = k
    for k, n in enumerate(nodes):  # forward: a producer's path is final before its readers are reached
        if out[k] or n.op_type not in QUANT_STEPS or not n.input:
            continue
        src = producer.get(n.input[0])
        if src is not None and out[src]:
            out[k] = out[src]
    for k in range(len(nodes) - 1, -1, -1):  # backward: a weight's steps take their reader's path
        n = nodes[k]
        if out[k] or n.op_type not in QUANT_STEPS:
            continue
        for r in (r for v in n.output for r in readers.get(v, ())):
            if out[r]:
                out[k] = out[r]
                break
    return out
