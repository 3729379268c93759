"""QDQ quantization steps of computed values, as the importer writes them, and a view of a graph without them.

ONNX's `QuantizeLinear(x) -> DequantizeLinear` pair on an activation (`quantize_static`'s QDQ form) is imported as
IR primitives (`models.onnx.handlers.quant`):

    v = x / scale                              (a constant scale)
    q = cast(min(max(round_half_even(v) [+ zp], lo), hi), u8|i8)   (round: floor, sub, mul, add, where, gt, lt)
    d = (cast(q, f32) [- zp]) * scale          (the dequantized value the float ops read)

`d` is `x` rounded to the 8-bit grid: the same value in kind (a tensor of the same shape and meaning), not in
number. The layer's architecture (norm before or after the residual add, which norm, which activation) is the float
model's; the steps sit between every op and hide it from patterns written for the float ops. `fake_quant_source`
reads one step back to its `x`; `without_quant_steps` is the graph with every step elided (each `d`'s readers read
`x`), for reading the layer's structure only: it does NOT keep the graph's numbers (the roundings are gone), so it
is never offered as a rewrite or run.

A dynamically quantized graph (`DynamicQuantizeLinear`: a scale computed from the tensor, its u8 values read by an
integer matmul without a scale) has no such step: its float ops read float values already.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir import DType, Graph, Node, Op

_ROUNDING = frozenset({Op.DIV, Op.FLOOR, Op.SUB, Op.MUL, Op.ADD, Op.WHERE, Op.GT, Op.LT, Op.MAX, Op.MIN})
"""The ops of `saturate(round_half_even(x / scale) + zp)` as the importer writes it."""
_CONSTANT = (Op.PARAM, Op.CONST)
MAX_STEP_NODES = 32
"""At most this many nodes between a quantizer's `x / scale` division and its cast (the importer writes 15)."""
QUANTIZED = (DType.u8, DType.i8)


def _constant(g: Graph, i: int) -> bool:
    return g[i].op in _CONSTANT


def dequantized_cast(g: Graph, n: Node) -> Node | None:
    """The u8/i8 cast `q` that `n` dequantizes, when `n` is `(cast(q, f32) [- const zp]) * const scale` and `q`
    quantizes a computed value (not a weight: a constant's `q` is the stored weight itself); else None."""
    if n.op != Op.MUL or len(n.inputs) != 2 or n.dtype != DType.f32:
        return None
    for y, s in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
        if not _constant(g, s):
            continue
        up = g[y]
        if up.op == Op.SUB and len(up.inputs) == 2 and _constant(g, up.inputs[1]):
            up = g[up.inputs[0]]
        if up.op != Op.CAST or up.dtype != DType.f32:
            continue
        q = g[up.inputs[0]]
        if q.op == Op.CAST and q.dtype in QUANTIZED and not _constant(g, q.inputs[0]):
            return q
    return None


def fake_quant_source(g: Graph, q: Node) -> int | None:
    """The `x` that the u8/i8 cast `q` quantizes (`saturate(round(x / scale) + zp)` with a constant scale), or None
    when `q`'s input is not that chain (at most `MAX_STEP_NODES` nodes of `_ROUNDING` ops, none of which is read
    outside the chain, above them one `x / scale` division)."""
    if q.op != Op.CAST or q.dtype not in QUANTIZED:
        return None
    chain: set[int] = set()
    todo = [q.inputs[0]]
    source: int | None = None
    while todo:
        i = todo.pop()
        if i in chain or _constant(g, i):
            continue
        n = g[i]
        if n.op not in _ROUNDING or len(chain) >= MAX_STEP_NODES:
            return None
        chain.add(i)
        if n.op == Op.DIV and _constant(g, n.inputs[1]) and not _constant(g, n.inputs[0]):
            if source not in (None, n.inputs[0]):
                return None
            source = n.inputs[0]
            continue
        todo += n.inputs
    if source is None or source in chain:
        return None
    if any(u.id not in chain and u.id != q.id for i in chain for u in g.users(i)):
        return None
    return source


def step_source(g: Graph, n: Node) -> int | None:
    """The value `x` of which `n` is the dequantized QDQ step (`n = dequantize(quantize(x))`), else None."""
    q = dequantized_cast(g, n)
    return None if q is None else fake_quant_source(g, q)


def _scalar(g: Graph, i: int) -> float | None:
    """The value of a one-element constant or param whose value `g` carries, else None."""
    n = g[i]
    if n.op == Op.CONST:
        v = n.attrs.get("value")
        while isinstance(v, tuple) and len(v) == 1:
            v = v[0]
        return float(v) if isinstance(v, int | float) else None
    if n.op == Op.PARAM and math.prod(n.shape) == 1 and (v := g.param_value(i)) is not None:
        return float(np.asarray(v).reshape(-1)[0])
    return None


def dequantized_scalar(g: Graph, n: Node) -> float | None:
    """The value of `n` when it dequantizes a one-element quantized constant (`(cast(c, f32) [- zp]) * scale`, or
    `const * scale` where the importer folded `c - zp`; all known: a quantized epsilon or exponent of a decomposed
    norm), computed in f32 as the graph does; else None."""
    if n.op != Op.MUL or len(n.inputs) != 2 or n.dtype != DType.f32 or math.prod(n.shape) != 1:
        return None
    if (a := _scalar(g, n.inputs[0])) is not None and (b := _scalar(g, n.inputs[1])) is not None:
        return float(np.float32(a) * np.float32(b))  # `x - zp` folded at import: `(x - zp) * scale`
    for y, s in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
        scale, up, zp = _scalar(g, s), g[y], 0.0
        if scale is None:
            continue
        if up.op == Op.SUB and len(up.inputs) == 2:
            zp, up = _scalar(g, up.inputs[1]), g[up.inputs[0]]
        if zp is None or up.op != Op.CAST or up.dtype != DType.f32 or g[up.inputs[0]].dtype not in QUANTIZED:
            continue
        if (c := _scalar(g, up.inputs[0])) is not None:
            return float((np.float32(c) - np.float32(zp)) * np.float32(scale))
    return None


def without_quant_steps(g: Graph) -> Graph | None:
    """`g` with every QDQ step of a computed value elided: each dequantized value's readers (and a graph output that
    is one) read the value it quantized, and the steps' nodes, dead then, are dropped; a dequantized one-element
    constant (an epsilon, an exponent) becomes the constant it holds. None when `g` has no QDQ step of a computed
    value. For reading structure only: the result does not keep `g`'s numbers (module doc). Node ids are kept."""
    sub: dict[int, int] = {}
    folded: dict[int, Node] = {}
    for n in g:
        if n.op == Op.MUL and (x := step_source(g, n)) is not None:
            sub[n.id] = x
        elif n.op == Op.MUL and (v := dequantized_scalar(g, n)) is not None:
            folded[n.id] = Node(n.id, Op.CONST, (), n.shape, DType.f32, {"value": v}, n.path)
    if not sub:
        return None

    def to(i: int) -> int:
        seen = 0
        while i in sub and seen <= len(sub):  # a step of a step: back to the first value
            i, seen = sub[i], seen + 1
        return i

    nodes = [folded[n.id] if n.id in folded else n if not any(i in sub for i in n.inputs)
             else n.replace(inputs=tuple(to(i) for i in n.inputs)) for n in g]
    outputs = [to(i) for i in g.outputs]
    by_id = {n.id: n for n in nodes}
    live, todo = set(outputs), list(outputs)
    while todo:
        for j in by_id[todo.pop()].inputs:
            if j not in live:
                live.add(j)
                todo.append(j)
    kept = [n for n in nodes if n.id in live or n.op in (Op.INPUT, *_CONSTANT)]
    return Graph(kept, outputs, g.name, g.next_id, g.values)


def float_cast(g: Graph, n: Node) -> bool:
    """`n` casts a float value to another float dtype (f16 <-> f32, bf16): the same value in kind."""
    return n.op == Op.CAST and n.dtype.is_float and g[n.inputs[0]].dtype.is_float


def origin(g: Graph, i: int) -> int:
    """The value `i` is a copy of in kind: up through float casts and QDQ steps (`i` itself when it is neither)."""
    for _ in range(len(g)):
        n = g[i]
        if float_cast(g, n):
            i = n.inputs[0]
        elif (x := step_source(g, n)) is not None:
            i = x
        else:
            return i
    return i


def readers(g: Graph, i: int) -> tuple[list[Node], bool]:
    """The nodes that read value `i` in kind, seen through float casts and QDQ steps (a cast's or a step's readers
    instead of the cast or the step), and whether `i` or one of those copies is a graph output."""
    out: list[Node] = []
    output = False
    todo, seen = [i], {i}
    while todo:
        v = todo.pop()
        output = output or g.is_output(v)
        for u in g.users(v):
            if float_cast(g, u):
                nxt = [u.id]
            elif u.op == Op.DIV and u.inputs[0] == v and _constant(g, u.inputs[1]):
                nxt = _dequantized_from(g, u, v)
            else:
                nxt = []
            if not nxt:
                out.append(u)
            for w in nxt:
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
    return out, output


def _dequantized_from(g: Graph, div: Node, x: int) -> list[int]:
    """The dequantized values of the QDQ steps whose quantizer starts at `div` (`x / scale`); [] when `div` starts
    none (then it is an ordinary reader of `x`)."""
    seen, todo, casts = {div.id}, [div.id], []
    while todo and len(seen) <= MAX_STEP_NODES + 1:
        for u in g.users(todo.pop()):
            if u.id in seen:
                continue
            seen.add(u.id)
            if u.op == Op.CAST and u.dtype in QUANTIZED:
                casts.append(u)
            elif u.op in _ROUNDING:
                todo.append(u.id)
    out = []
    for q in casts:
        if fake_quant_source(g, q) != x:
            return []
        if any(c.op != Op.CAST or c.dtype != DType.f32 for c in g.users(q.id)):
            return []  # the 8-bit value is read as such too: not only a step
        ds = [d.id for c in g.users(q.id) for y in (c, *g.users(c.id)) for d in (y, *g.users(y.id))
              if d.op == Op.MUL and (k := dequantized_cast(g, d)) is not None and k.id == q.id]
        if not ds:
            return []
        out += list(dict.fromkeys(ds))
    return out


def _integer_operand(g: Graph, i: int) -> bool:
    """`i` is an int8/uint8 value read as f32 (`cast(q, f32)`, minus a zero point, or a narrow of that: a chunk of
    K rows), as the importer writes an operand of ONNX's MatMulInteger (`models.onnx.handlers.quant`)."""
    n = g[i]
    if n.op == Op.NARROW:
        n = g[n.inputs[0]]
    if n.op == Op.SUB and len(n.inputs) == 2:
        n = g[n.inputs[0]]
    return n.op == Op.CAST and n.dtype == DType.f32 and g[n.inputs[0]].dtype in QUANTIZED


def integer_matmul(g: Graph, n: Node) -> bool:
    """`n` is an integer matmul as the importer writes ONNX's MatMulInteger (`quantize_dynamic`'s projections): a
    matmul of two int8/uint8 operands read as f32 (each centered by its zero point), its product cast to i32. No
    float-matmul fusion takes it (its epilogue is the cast, then a scale); the one reading of that form."""
    return (n.op == Op.MATMUL and len(n.inputs) == 2 and all(_integer_operand(g, i) for i in n.inputs)
            and any(u.op == Op.CAST and u.dtype == DType.i32 for u in g.users(n.id)))


__all__ = ["MAX_STEP_NODES", "dequantized_cast", "fake_quant_source", "float_cast", "integer_matmul", "origin",
           "readers", "step_source", "without_quant_steps"]
