"""Export an IR graph (any pipeline version) to ONNX, so ONNX Runtime can check it.

`export_onnx(graph, weights)` first runs the `unfuse` pass (every fused op becomes the primitives of its
decomposition in `rlxviz/ir/fused.py`, the one definition of its math), then writes each primitive as
standard ONNX ops (default domain, opset 18) with static shapes:

* one ONNX op where one exists (MatMul, Add, Softmax, LayerNormalization, Reshape, Slice for `narrow`, ...);
* `gelu`, `gelu_tanh`, `silu`, `relu2` (Relu, then Mul of it by itself), `rsqrt`, `rms_norm`, `attention` and
  `rope` as the ONNX primitives of the formulas the reference interpreter evaluates
  (`rlxviz/runtime/reference.py`), so the exported model computes what the reference computes (round-trip
  test: atol 1e-5).

Params become initializers named after the param; inputs keep their names; outputs are `output_0`, ...
Node names carry the IR path in the legacy exporter's form (`/encoder/layer.0/attention/MatMul_17`), so
`load_onnx` reads the provenance back, and `doc_string` says which pass made the node.

Raises `OnnxExportError` for an op with no ONNX form.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...ir import DType, Graph, Node, Op
from ...ir.ops import FUSED, SPECS
from ...ir.registry import registrar

EXPORT_OPSET = 18
_FLOATS = (DType.f16, DType.f32, DType.f64)
"""Dtypes whose node expansions write their constants in that dtype (ONNX ops take one float type per node)."""


class OnnxExportError(ValueError):
    """A graph that cannot be written as ONNX; the message names the node and op."""


def _tp(dtype: DType) -> int:
    from onnx import TensorProto

    return {DType.f32: TensorProto.FLOAT, DType.f16: TensorProto.FLOAT16, DType.bf16: TensorProto.FLOAT,
            DType.f64: TensorProto.DOUBLE, DType.i32: TensorProto.INT32, DType.i64: TensorProto.INT64,
            DType.bool: TensorProto.BOOL, DType.i8: TensorProto.INT8, DType.u8: TensorProto.UINT8}[dtype]


class _Writer:
    """Accumulates ONNX nodes and initializers; `c(...)` makes constants, `op(...)` nodes."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.k = 0
        self.prefix = ""
        self.doc = ""
        self.fdt: Any = np.float32  # the float dtype of the node being written: its expansion's constants take it

    def fresh(self, hint: str) -> str:
        self.k += 1
        return f"{hint}_{self.k}"

    def c(self, value: Any, dtype: np.dtype | type | None = None) -> str:
        """An initializer holding `value` as `dtype` (default: the float dtype of the node being written, so a
        float16 graph's expansions stay float16: ONNX binds one type per op)."""
        from onnx import numpy_helper

        name = self.fresh("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype or self.fdt), name))
        return name

    def ints(self, values: Any) -> str:
        return self.c(list(values), np.int64)

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        out = out or self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{self.prefix}{op_type}_{len(self.nodes)}",
                                           doc_string=self.doc, **attrs))
        return out


Exporter = Callable[[_Writer, Graph, Node, list[str], str], None]
"""`fn(w, graph, node, input_names, output_name)`: writes one IR node as ONNX nodes whose result is `output_name`."""
EXPORTS: dict[Op, Exporter] = {}
"""Op -> its exporter. An op not here whose spec names its ONNX operator (`OpSpec.onnx`) is written as that
operator on the same operands (`Add`, `Relu`, ...): `exporter(op)`."""
exports = registrar(EXPORTS)
"""`@exports(op, ...)`: register `fn(w, graph, node, ins, out)` as the ONNX form of the ops."""


def exporter(op: Op) -> Exporter | None:
    """The ONNX form of `op`: its registered exporter, else its spec's ONNX operator on the same operands, else
    None (no ONNX form)."""
    if op in EXPORTS:
        return EXPORTS[op]
    onnx = SPECS[op].onnx
    if onnx is None:
        return None

    def same_operands(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
        w.op(onnx, ins, out)

    return same_operands


def _gelu(w: _Writer, x: str, out: str) -> str:
    """0.5 * x * (1 + erf(x / sqrt(2)))."""
    t = w.op("Erf", [w.op("Div", [x, w.c(math.sqrt(2.0))])])
    return w.op("Mul", [w.op("Mul", [w.c(0.5), x]), w.op("Add", [w.c(1.0), t])], out)


def _gelu_tanh(w: _Writer, x: str, out: str) -> str:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))."""
    cube = w.op("Mul", [w.c(0.044715), w.op("Pow", [x, w.c(3.0)])])
    t = w.op("Tanh", [w.op("Mul", [w.c(math.sqrt(2.0 / math.pi)), w.op("Add", [x, cube])])])
    return w.op("Mul", [w.op("Mul", [w.c(0.5), x]), w.op("Add", [w.c(1.0), t])], out)


def _rms_norm(w: _Writer, n: Node, x: str, g: str, b: str | None, out: str) -> str:
    """x / sqrt(mean(x^2, -1) + eps) * gamma (+ beta)."""
    ms = w.op("ReduceMean", [w.op("Mul", [x, x]), w.ints([-1])], keepdims=1)
    y = w.op("Mul", [w.op("Div", [x, w.op("Sqrt", [w.op("Add", [ms, w.c(float(n.attrs["eps"]))])])]), g])
    return w.op("Add", [y, b], out) if b is not None else w.op("Identity", [y], out)


def _heads(w: _Writer, x: str, shape: tuple[int, ...], heads: int, perm: tuple[int, ...]) -> str:
    b, s, hd = shape
    return w.op("Transpose", [w.op("Reshape", [x, w.ints([b, s, heads, hd // heads])])], perm=list(perm))


def _attention(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    """The reference's SDPA: heads split, (q k^T) * scale, mask (keep: where(mask > 0.5, s, f32 min); causal:
    bottom-right aligned; additive: + mask), softmax, @ v, heads merged. Grouped-query attention
    (`num_kv_heads` < `num_heads`) repeats each kv head for its group of query heads."""
    h, d = n.attrs["num_heads"], n.attrs["head_dim"]
    kvh = n.attrs.get("num_kv_heads") or h
    q_shape, k_shape = g[n.inputs[0]].shape, g[n.inputs[1]].shape
    b, sq, sk = q_shape[0], q_shape[1], k_shape[1]
    scale = n.attrs.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    qh = _heads(w, ins[0], q_shape, h, (0, 2, 1, 3))
    kh = _heads(w, ins[1], k_shape, kvh, (0, 2, 3, 1))
    vh = _heads(w, ins[2], g[n.inputs[2]].shape, kvh, (0, 2, 1, 3))
    if kvh != h:
        rep = h // kvh

        def repeat(t: str, tail: tuple[int, int]) -> str:
            t5 = w.op("Reshape", [t, w.ints([b, kvh, 1, *tail])])
            t5 = w.op("Expand", [t5, w.ints([b, kvh, rep, *tail])])
            return w.op("Reshape", [t5, w.ints([b, h, *tail])])

        kh, vh = repeat(kh, (d, sk)), repeat(vh, (sk, d))
    s = w.op("Mul", [w.op("MatMul", [qh, kh]), w.c(scale)])
    kind = n.attrs.get("mask", "none")
    neg = float(np.finfo(w.fdt).min)  # the dtype's own most negative value (float16: -65504)
    if kind == "keep":
        m = w.op("Reshape", [ins[3], w.ints([b, 1, 1, sk])])
        s = w.op("Where", [w.op("Greater", [m, w.c(0.5, g[n.inputs[3]].dtype.numpy)]), s, w.c(neg)])
    elif kind == "causal":
        visible = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
        s = w.op("Where", [w.c(visible, np.bool_), s, w.c(neg)])
    elif kind == "additive":
        s = w.op("Add", [s, ins[3]])
    o = w.op("MatMul", [w.op("Softmax", [s], axis=-1), vh])
    w.op("Reshape", [w.op("Transpose", [o], perm=[0, 2, 1, 3]), w.ints([b, sq, h * d])], out)


def _rope(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    """Rotary embedding (NeoX halves, or `interleaved` neighbour pairs) on packed [B, S, heads*head_dim] with cos/sin
    tables [max_pos, >= n_rot/2] (or [B or 1, >= S, >= n_rot/2], one per batch row)."""
    d, n_rot = n.attrs["head_dim"], n.attrs["n_rot"]
    b, s, hd = g[n.inputs[0]].shape
    half = n_rot // 2
    xh = w.op("Reshape", [ins[0], w.ints([b, s, hd // d, d])])

    def table(t: str) -> str:
        if g[n.inputs[1]].rank == 3:  # one table per batch row: [B or 1, S, n_rot/2]
            rows = g[n.inputs[1]].shape[0]
            part = w.op("Slice", [t, w.ints([0, 0, 0]), w.ints([rows, s, half]), w.ints([0, 1, 2])])
            return w.op("Reshape", [part, w.ints([rows, s, 1, half])])
        part = w.op("Slice", [t, w.ints([0, 0]), w.ints([s, half]), w.ints([0, 1])])
        return w.op("Reshape", [part, w.ints([1, s, 1, half])])

    c, sn = table(ins[1]), table(ins[2])

    def cut(lo: int, hi: int) -> str:
        return w.op("Slice", [xh, w.ints([lo]), w.ints([hi]), w.ints([3])])

    if n.attrs.get("interleaved", False):  # pairs (x[2i], x[2i+1]): a [.., n_rot/2, 2] view, rotated, back in place
        pairs = w.op("Reshape", [cut(0, n_rot), w.ints([b, s, hd // d, half, 2])])
        x1, x2 = (w.op("Squeeze", [w.op("Slice", [pairs, w.ints([k]), w.ints([k + 1]), w.ints([4])]), w.ints([4])])
                  for k in (0, 1))
        rot = [w.op("Unsqueeze", [r, w.ints([4])]) for r in (
            w.op("Sub", [w.op("Mul", [x1, c]), w.op("Mul", [x2, sn])]),
            w.op("Add", [w.op("Mul", [x2, c]), w.op("Mul", [x1, sn])]))]
        parts = [w.op("Reshape", [w.op("Concat", rot, axis=-1), w.ints([b, s, hd // d, n_rot])])]
    else:
        x1, x2 = cut(0, half), cut(half, n_rot)
        parts = [w.op("Sub", [w.op("Mul", [x1, c]), w.op("Mul", [x2, sn])]),
                 w.op("Add", [w.op("Mul", [x2, c]), w.op("Mul", [x1, sn])])]
    if n_rot < d:
        parts.append(cut(n_rot, d))
    w.op("Reshape", [w.op("Concat", parts, axis=-1), w.ints([b, s, hd])], out)


@exports(Op.WHERE)
def _where(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    if n.dtype == DType.bool:
        # ONNX Runtime has no bool Where kernel: (c and a) or (not c and b), the same truth table, broadcast alike
        c, a_, b_ = ins
        w.op("Or", [w.op("And", [c, a_]), w.op("And", [w.op("Not", [c]), b_])], out)
    else:
        w.op("Where", ins, out)


@exports(Op.NE)
def _ne(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    w.op("Not", [w.op("Equal", ins)], out)


@exports(Op.GELU)
def _gelu_node(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    _gelu(w, ins[0], out)


@exports(Op.GELU_TANH)
def _gelu_tanh_node(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    _gelu_tanh(w, ins[0], out)


@exports(Op.SILU)
def _silu(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    w.op("Mul", [ins[0], w.op("Sigmoid", ins)], out)


@exports(Op.RELU2)
def _relu2(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    r = w.op("Relu", ins)
    w.op("Mul", [r, r], out)


@exports(Op.RSQRT)
def _rsqrt(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    w.op("Reciprocal", [w.op("Sqrt", ins)], out)


@exports(Op.CAST)
def _cast(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    w.op("Cast", ins, out, to=_tp(DType(n.attrs["dtype"])))


@exports(Op.REDUCE_SUM, Op.REDUCE_MEAN, Op.REDUCE_MAX)
def _reduce(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    w.op(_onnx(n.op), [ins[0], w.ints(n.attrs["axes"])], out, keepdims=int(bool(n.attrs.get("keepdims", False))))


@exports(Op.SOFTMAX)
def _softmax(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    w.op("Softmax", ins, out, axis=int(n.attrs.get("axis", -1)))


@exports(Op.ARGMAX)
def _argmax(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    w.op("ArgMax", ins, out, axis=int(n.attrs["axis"]), keepdims=int(bool(n.attrs.get("keepdims", False))))


@exports(Op.CUMSUM)
def _cumsum(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    a = n.attrs
    w.op("CumSum", [ins[0], w.ints([int(a["axis"])])], out, exclusive=int(bool(a.get("exclusive"))),
         reverse=int(bool(a.get("reverse"))))


@exports(Op.LAYER_NORM)
def _layer_norm(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    w.op("LayerNormalization", ins, out, axis=-1, epsilon=float(n.attrs["eps"]))


@exports(Op.RMS_NORM)
def _rms_norm_node(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    _rms_norm(w, n, ins[0], ins[1], ins[2] if len(ins) > 2 else None, out)


@exports(Op.RESHAPE, Op.EXPAND)
def _reshape(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    w.op(_onnx(n.op), [ins[0], w.ints(n.shape)], out)


@exports(Op.TRANSPOSE)
def _transpose(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    w.op("Transpose", ins, out, perm=list(n.attrs["perm"]))


@exports(Op.NARROW)
def _narrow(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    st, a = int(n.attrs["start"]), n.attrs
    w.op("Slice", [ins[0], w.ints([st]), w.ints([st + int(a["length"])]), w.ints([int(a["axis"])])], out)


@exports(Op.CONCAT)
def _concat(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    w.op("Concat", ins, out, axis=int(n.attrs["axis"]))


@exports(Op.GATHER)
def _gather(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    w.op("Gather", ins, out, axis=0)


@exports(Op.PAD)
def _pad(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    mode = n.attrs.get("mode", "constant")
    fill = [w.c(n.attrs.get("value", 0.0), n.dtype.numpy)] if mode == "constant" else []
    w.op("Pad", [ins[0], w.ints(n.attrs["pads"]), *fill], out, mode=mode)


@exports(Op.ONNX_OP)
def _onnx_op(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    """The ONNX node it was imported from, on the export's value names."""
    from ...ir.onnx_op import decode

    a = n.attrs
    node = decode(a)
    it = iter(ins)
    node.input[:] = [next(it) if i else "" for i in node.input]
    k = int(a.get("output", 0))  # one IR node per output: the others get names nothing reads
    node.output[:] = [out if j == k else f"{out}.unused{j}" for j in range(max(len(node.output), k + 1))]
    node.name = f"{w.prefix}{node.op_type}_{len(w.nodes)}"
    w.nodes.append(node)


exports(Op.ATTENTION)(_attention)
exports(Op.ROPE)(_rope)


def _onnx(op: Op) -> str:
    name = SPECS[op].onnx
    assert name is not None, op
    return name


def _node(w: _Writer, g: Graph, n: Node, ins: list[str], out: str) -> None:
    fn = exporter(n.op)
    if fn is None:
        raise OnnxExportError(f"%{n.id} ({n.op.value}) at {n.path or '<root>'}: no ONNX form for this op")
    fn(w, g, n, ins, out)


def export_onnx(graph: Graph, weights: Mapping[str, np.ndarray], path: str | Path | None = None,
                name: str | None = None) -> Any:
    """An `onnx.ModelProto` computing `graph` (fused ops expanded by `unfuse`), saved to `path` when given.

    Args:
        graph: any graph version (e.g. `trace.versions[k]`).
        weights: param name -> array; each param becomes an initializer.
        path: where to save the `.onnx` file (None: do not save).

    Raises:
        OnnxExportError: an op with no ONNX form, or a param without a weight.
    """
    import onnx
    from onnx import helper, numpy_helper

    from ...passes.pipeline import run_pass

    g = run_pass(graph, "unfuse") if any(n.op in FUSED for n in graph) else graph
    w = _Writer()
    names: dict[int, str] = {}
    inputs = []
    for n in g:
        if n.op == Op.INPUT:
            names[n.id] = n.attrs["name"]
            inputs.append(helper.make_tensor_value_info(n.attrs["name"], _tp(n.dtype), list(n.shape)))
        elif n.op == Op.PARAM:
            pname = n.attrs["name"]
            if pname not in weights:
                raise OnnxExportError(f"param {pname!r} (%{n.id}) has no weight")
            if pname not in names.values():
                w.inits.append(numpy_helper.from_array(np.asarray(weights[pname], dtype=n.dtype.numpy), pname))
            names[n.id] = pname
        elif n.op == Op.CONST:
            names[n.id] = w.c(np.asarray(n.attrs["value"]).reshape(n.shape), n.dtype.numpy)
        else:
            out = f"v{n.id}"
            w.prefix = "/" + "/".join(n.path.split(".")) + "/" if n.path else "/"
            w.doc = f"rlxviz %{n.id} {n.op.value}" + (f", made by {n.pass_name}" if n.pass_name else "")
            w.fdt = n.dtype.numpy if n.dtype in _FLOATS else np.float32
            _node(w, g, n, [names[i] for i in n.inputs], out)
            names[n.id] = out
    outputs = []
    for k, o in enumerate(g.outputs):
        node = g[o]
        oname = f"output_{k}"
        w.prefix, w.doc = "/", ""
        w.op("Identity", [names[o]], oname)
        outputs.append(helper.make_tensor_value_info(oname, _tp(node.dtype), list(node.shape)))
    model = helper.make_model(helper.make_graph(w.nodes, name or graph.name, inputs, outputs, w.inits),
                              opset_imports=[helper.make_opsetid("", EXPORT_OPSET)], producer_name="rlxviz",
                              ir_version=9)
    onnx.checker.check_model(model)
    if path is not None:
        onnx.save(model, str(path))
    return model


__all__ = ["EXPORTS", "EXPORT_OPSET", "OnnxExportError", "export_onnx", "exporter", "exports"]
