"""The NumPy reference interpreter: the oracle every pass and every MLX lowering is checked against.

Every primitive has one NumPy rule (float32 in, float32 out); every fused op is computed through
its decomposition in `rlxviz.ir.fused`, the same code the `unfuse` pass emits. Values are freed
after their last use.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from scipy import special

from ..ir import DType, Emitter, Graph, Node, Op
from ..ir.emitter import normalize_attrs
from ..ir.fused import DECOMPOSITIONS, expand
from ..ir.registry import registrar
from .formulas import merge_heads, rope, split_heads

Impl = Callable[..., np.ndarray]
IMPLS: dict[Op, Impl] = {}
_NEG = float(np.finfo(np.float32).min)


impl = registrar(IMPLS)
"""`@impl(op, ...)`: register the NumPy rule `fn(attrs, *arrays) -> array`."""


def _f(fn: Callable[..., np.ndarray]) -> Impl:
    return lambda attrs, *xs: fn(*xs)


for _op, _fn in {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.divide,
                 Op.POW: np.power, Op.MAX: np.maximum, Op.MIN: np.minimum, Op.EQ: np.equal,
                 Op.NE: np.not_equal, Op.LT: np.less, Op.LE: np.less_equal, Op.GT: np.greater,
                 Op.GE: np.greater_equal, Op.TANH: np.tanh, Op.EXP: np.exp, Op.LOG: np.log,
                 Op.SQRT: np.sqrt, Op.NEG: np.negative, Op.ERF: special.erf, Op.MATMUL: np.matmul,
                 Op.ABS: np.abs, Op.ISNAN: np.isnan, Op.SIN: np.sin, Op.COS: np.cos, Op.FLOOR: np.floor,
                 Op.WHERE: np.where}.items():
    IMPLS[_op] = _f(_fn)


@impl(Op.ONNX_OP)
def _onnx_op(a: dict, *xs: np.ndarray) -> np.ndarray:
    from ..ir.onnx_op import evaluate

    return evaluate(a, xs)


@impl(Op.PAD)
def _pad(a: dict, x: np.ndarray) -> np.ndarray:
    """ONNX Pad: `np.pad` with ONNX's begins-then-ends `pads`; reflect and edge are NumPy's modes of the names."""
    r, pads, mode = x.ndim, a["pads"], a.get("mode", "constant")
    width = [(pads[i], pads[r + i]) for i in range(r)]
    if mode == "constant":
        return np.pad(x, width, mode="constant", constant_values=np.asarray(a.get("value", 0.0)).astype(x.dtype))
    return np.pad(x, width, mode=mode)


@impl(Op.ARGMAX)
def _argmax(a: dict, x: np.ndarray) -> np.ndarray:
    return np.argmax(x, axis=a["axis"], keepdims=bool(a.get("keepdims", False))).astype(np.int64)


@impl(Op.CUMSUM)
def _cumsum(a: dict, x: np.ndarray) -> np.ndarray:
    """ONNX CumSum: inclusive running sum along `axis`; `exclusive` shifts it by one (a zero first), `reverse`
    runs from the end."""
    ax = a["axis"] % x.ndim
    y = np.flip(x, ax) if a.get("reverse") else x
    c = np.cumsum(y, axis=ax, dtype=x.dtype)
    if a.get("exclusive"):
        c = c - y
    return np.flip(c, ax) if a.get("reverse") else c


@impl(Op.GELU)
def _gelu(a: dict, x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1.0 + special.erf(x / np.sqrt(2.0)))).astype(x.dtype)


@impl(Op.GELU_TANH)
def _gelu_tanh(a: dict, x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))).astype(x.dtype)


@impl(Op.SIGMOID)
def _sigmoid(a: dict, x: np.ndarray) -> np.ndarray:
    return special.expit(x).astype(x.dtype)


@impl(Op.SILU)
def _silu(a: dict, x: np.ndarray) -> np.ndarray:
    return (x * special.expit(x)).astype(x.dtype)


@impl(Op.RELU)
def _relu(a: dict, x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0).astype(x.dtype)


@impl(Op.RELU2)
def _relu2(a: dict, x: np.ndarray) -> np.ndarray:
    """Squared ReLU `r * r` with `r = relu(x)`, in x's dtype: the very product `relu(x) * relu(x)` computes."""
    r = np.maximum(x, 0).astype(x.dtype)
    return (r * r).astype(x.dtype)


@impl(Op.RSQRT)
def _rsqrt(a: dict, x: np.ndarray) -> np.ndarray:
    return (1.0 / np.sqrt(x)).astype(x.dtype)


@impl(Op.CAST)
def _cast(a: dict, x: np.ndarray) -> np.ndarray:
    return x.astype(DType(a["dtype"]).numpy)


IMPLS[Op.REDUCE_SUM] = lambda a, x: np.sum(x, axis=tuple(a["axes"]), keepdims=a["keepdims"]).astype(x.dtype)
IMPLS[Op.REDUCE_MEAN] = lambda a, x: np.mean(x, axis=tuple(a["axes"]), keepdims=a["keepdims"]).astype(x.dtype)
IMPLS[Op.REDUCE_MAX] = lambda a, x: np.max(x, axis=tuple(a["axes"]), keepdims=a["keepdims"])


@impl(Op.SOFTMAX)
def _softmax(a: dict, x: np.ndarray) -> np.ndarray:
    return special.softmax(x, axis=a["axis"]).astype(x.dtype)


def _stats(x: np.ndarray) -> np.ndarray:
    """`x` widened to at least float32 for a norm's statistics (as kernels keep them: an f16
    LayerNorm of values near 300 must not overflow in its variance)."""
    return x.astype(np.promote_types(x.dtype, np.float32), copy=False)


@impl(Op.LAYER_NORM)
def _layer_norm(a: dict, x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    xf = _stats(x)
    mu = xf.mean(-1, keepdims=True)
    var = np.square(xf - mu).mean(-1, keepdims=True)
    return ((xf - mu) / np.sqrt(var + a["eps"]) * g + b).astype(x.dtype)


@impl(Op.RMS_NORM)
def _rms_norm(a: dict, x: np.ndarray, g: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    xf = _stats(x)
    y = xf / np.sqrt(np.square(xf).mean(-1, keepdims=True) + a["eps"]) * g
    return (y if b is None else y + b).astype(x.dtype)


IMPLS[Op.RESHAPE] = lambda a, x: x.reshape(a["shape"])
IMPLS[Op.TRANSPOSE] = lambda a, x: np.transpose(x, a["perm"])
IMPLS[Op.EXPAND] = lambda a, x: np.broadcast_to(x, a["shape"])
IMPLS[Op.CONCAT] = lambda a, *xs: np.concatenate(xs, axis=a["axis"])
IMPLS[Op.GATHER] = lambda a, table, idx: np.take(table, idx, axis=0)


@impl(Op.NARROW)
def _narrow(a: dict, x: np.ndarray) -> np.ndarray:
    sl = [slice(None)] * x.ndim
    sl[a["axis"]] = slice(a["start"], a["start"] + a["length"])
    return x[tuple(sl)]


@impl(Op.ATTENTION)
def _attention(a: dict, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    h, d = a["num_heads"], a["head_dim"]
    scale = a["scale"] if a["scale"] is not None else 1.0 / np.sqrt(d)
    kv = a.get("num_kv_heads") or h
    qh, kh, vh = split_heads(q, h), split_heads(k, kv), split_heads(v, kv)
    if kv != h:  # grouped-query: query head i reads kv head i // (h // kv), as HF repeat_kv
        kh, vh = np.repeat(kh, h // kv, axis=1), np.repeat(vh, h // kv, axis=1)
    s = (qh @ kh.transpose(0, 1, 3, 2)) * qh.dtype.type(scale)
    sq, sk = s.shape[-2:]
    kind = a["mask"]
    low = np.finfo(s.dtype).min if s.dtype.kind == "f" else _NEG
    if kind == "keep" and a.get("mask_fill") is not None:  # HF's extended mask, in the mask's own dtype
        m = mask[:, None, None, :]
        s = s + (m.dtype.type(1) - m) * m.dtype.type(a["mask_fill"])
    elif kind == "keep":
        s = np.where(mask[:, None, None, :] > 0.5, s, low)
    elif kind == "causal":
        visible = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
        s = np.where(visible, s, low)
    elif kind == "additive":
        s = s + mask
    p = special.softmax(s.astype(np.promote_types(s.dtype, np.float32)), axis=-1).astype(q.dtype)
    return merge_heads(p @ vh)


@impl(Op.ROPE)
def _rope(a: dict, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    return rope(x, cos, sin, a["head_dim"], a["n_rot"], np.concatenate, a.get("interleaved", False)).astype(x.dtype)


class NumpyEmitter(Emitter[np.ndarray]):
    """Evaluates op methods eagerly on NumPy arrays, each in its dtype (float32 by default).

    Args:
        float_dtype: when set (the float64 oracle), every float value and every cast to a float
            dtype uses it instead of the declared one.
    """

    def __init__(self, float_dtype: Any = None) -> None:
        self.float_dtype = None if float_dtype is None else np.dtype(float_dtype)

    def numpy_dtype(self, dtype: DType) -> np.dtype:
        """The NumPy dtype a value of IR dtype `dtype` is computed in."""
        d = DType(dtype)
        return self.float_dtype if self.float_dtype is not None and d.is_float else np.dtype(d.numpy)

    def emit(self, op: Op, inputs: Sequence[np.ndarray], **attrs: Any) -> np.ndarray:
        attrs = normalize_attrs(op, attrs)
        if op in DECOMPOSITIONS:
            return expand(self, op, attrs, inputs)
        if op == Op.CAST:
            return np.asarray(inputs[0]).astype(self.numpy_dtype(DType(attrs["dtype"])))
        return np.asarray(IMPLS[op](attrs, *inputs))

    def const(self, value: Any, dtype: DType = DType.f32) -> np.ndarray:
        return np.asarray(value, dtype=self.numpy_dtype(DType(dtype)))

    def shape_of(self, v: np.ndarray) -> tuple[int, ...]:
        return tuple(v.shape)

    def dtype_of(self, v: np.ndarray) -> DType:
        return DType.from_numpy(v.dtype)


def bind_leaf(node: Node, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
              dtype: Any = None) -> np.ndarray:
    """The array for an input, param or const node, checked against the node's shape.

    Raises:
        KeyError: an input or param has no value (names it).
        ValueError: a value's shape differs from the node's (names both shapes).
    """
    dtype = node.dtype.numpy if dtype is None else dtype
    if node.op == Op.CONST:
        return np.asarray(np.asarray(node.attrs["value"]).astype(node.dtype.numpy), dtype=dtype)
    source, kind = (feeds, "input") if node.op == Op.INPUT else (weights, "param")
    name = node.attrs["name"]
    if name not in source:
        raise KeyError(f"no value for {kind} {name!r} (%{node.id}, expected {node.type})")
    arr = np.asarray(source[name])
    if tuple(arr.shape) != node.shape:
        raise ValueError(f"{kind} {name!r}: expected shape {list(node.shape)}, got {list(arr.shape)}")
    arr = arr.astype(node.dtype.numpy, copy=False)
    if node.dtype == DType.bf16 and np.dtype(dtype).itemsize > 4:  # the oracle sees the bf16-rounded value
        arr = round_bf16(arr)
    return arr.astype(dtype, copy=False)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 `x` rounded to the nearest bfloat16 (ties to even), returned as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return np.where(np.isfinite(x), rounded.view(np.float32), x).astype(np.float32)


@contextmanager
def quiet_numerics() -> Iterator[None]:
    """NumPy's numeric warnings off (overflow, invalid, divide by zero, casts, 'Mean of empty slice'): a graph's
    inf/NaN results are its outputs, reported by whoever reads them (`session.all_finite`, the verdicts), never
    as Python warnings on stderr."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def gather_out_of_range(graph: Graph, n: Node, indices: np.ndarray) -> str | None:
    """Why gather `n` cannot read these `indices`, in one line naming the gather and its table, or None when every
    index is in `-rows..rows-1` (negatives count from the end, in NumPy and MLX alike). The one wording of this
    check for the reference and MLX (`executor.check_gather_indices`)."""
    table = graph[n.inputs[0]]
    rows = table.shape[0] if table.shape else 0
    v = np.asarray(indices)
    if v.size == 0:
        return None
    lo, hi = int(np.min(v)), int(np.max(v))
    if -rows <= lo and hi < rows:
        return None
    what = f"{table.attrs['name']!r}" if table.op == Op.PARAM else f"%{table.id} ({table.op.value})"
    at = f", {n.path}" if n.path else ""
    return (f"gather %{n.id}{at}: index values {lo}..{hi} lie outside the {rows} rows of {what} ({-rows}..{rows - 1}); "
            f"a longer sequence than the model's position table, or token ids past its vocabulary")


def run_reference(graph: Graph, feeds: Mapping[str, np.ndarray],
                  weights: Mapping[str, np.ndarray] | None = None, float_dtype: Any = None) -> list[np.ndarray]:
    """Execute `graph` in NumPy; returns the graph outputs in order.

    Args:
        graph: a verified graph.
        feeds: input name -> array, e.g. `input_ids` int64 `[batch, seq]`.
        weights: param name -> float32 array.

    Each result is cast to its node's declared dtype (bf16 computes as f32); norms keep their
    statistics in at least float32. With `float_dtype=np.float64` every float value is computed in
    float64 instead (leaves rounded to their declared dtype first): the oracle (`run_oracle`).

    Raises:
        KeyError / ValueError: a missing or mis-shaped input or weight (see `bind_leaf`).
        RuntimeError: a computed shape differs from the node's declared shape (an inference/NumPy
            disagreement; the message names the node).
    """
    from ..ir.onnx_op import host_run

    with quiet_numerics(), host_run():
        env = _run_reference(graph, feeds, weights or {}, float_dtype, frozenset())
    return [env[o] for o in graph.outputs]


def reference_values(graph: Graph, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray] | None,
                     keep: Iterable[int], float_dtype: Any = None) -> dict[int, np.ndarray]:
    """The values of the nodes `keep` (ids of `graph`) in one NumPy run of `graph` (as `run_reference`; with
    `float_dtype=np.float64` the oracle's values): node id -> array. Every other value is dropped after its last
    use, so the run holds the schedule's live values plus the kept ones. Raises as `run_reference`."""
    from ..ir.onnx_op import host_run

    keep = frozenset(keep)
    with quiet_numerics(), host_run():
        env = _run_reference(graph, feeds, weights or {}, float_dtype, keep)
    return {i: env[i] for i in keep if i in env}


def _run_reference(graph: Graph, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
                   float_dtype: Any, keep: frozenset[int]) -> dict[int, np.ndarray]:
    e = NumpyEmitter(float_dtype)
    remaining = {n.id: graph.use_count(n) for n in graph}
    env: dict[int, np.ndarray] = {}
    outs = set(graph.outputs) | keep
    tables = _gather_only_tables(graph) if float_dtype is not None else frozenset()

    def param(i: int) -> np.ndarray:
        """A param bound at its first use (so the run holds only the live ones in `float_dtype`); a table only
        gathered from stays in its own dtype: the gather's rows are cast instead (the same values)."""
        p = graph[i]
        env[i] = bind_leaf(p, feeds, weights, p.dtype.numpy if i in tables else e.numpy_dtype(p.dtype))
        return env[i]

    for n in graph:
        if n.op == Op.PARAM and n.id not in outs:
            if n.attrs["name"] not in weights:  # a missing weight is named where it was before, not at its use
                bind_leaf(n, feeds, weights)
            continue
        if n.op in (Op.INPUT, Op.PARAM, Op.CONST):
            env[n.id] = bind_leaf(n, feeds, weights, e.numpy_dtype(n.dtype))
        else:
            args = [env[i] if i in env else param(i) for i in n.inputs]
            if n.op == Op.GATHER and (why := gather_out_of_range(graph, n, args[1])):
                raise ValueError(why)
            out = e.emit(n.op, args, **n.attrs)
            if tuple(out.shape) != n.shape:
                raise RuntimeError(f"[run_reference] %{n.id} ({n.op.value}) computed shape {list(out.shape)}, "
                                   f"but the IR declares {n.type}")
            # NumPy's own promotion (e.g. int / int -> float64) must not leak past the IR's dtype
            want = e.numpy_dtype(n.dtype)
            env[n.id] = out if out.dtype == want else out.astype(want)
            for i in set(n.inputs):
                remaining[i] -= 1
                if remaining[i] == 0 and i not in keep:
                    del env[i]
    return env


def _gather_only_tables(graph: Graph) -> frozenset[int]:
    """f32/f16 params whose every use is as the table (operand 0) of a `gather` and that are no output: the oracle
    may gather their rows first and widen only those (exact: a cast commutes with selecting elements). An 8B
    model's embedding is 2.1 GB as float32 and would be 4.2 GB as float64."""
    users: dict[int, list[tuple[Node, int]]] = {}
    for n in graph:
        for k, i in enumerate(n.inputs):
            users.setdefault(i, []).append((n, k))
    return frozenset(n.id for n in graph if n.op == Op.PARAM and n.dtype in (DType.f32, DType.f16)
                     and n.id not in graph.outputs and users.get(n.id)
                     and all(u.op == Op.GATHER and k == 0 for u, k in users[n.id]))


def run_oracle(graph: Graph, feeds: Mapping[str, np.ndarray],
               weights: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """The oracle: `graph` evaluated with every float value in float64 (inputs and params are first
    rounded to their declared dtype, so an f16 graph is judged on the values it was given).

    Returns float64 arrays for float outputs. Raises as `run_reference`.
    """
    return run_reference(graph, feeds, weights, float_dtype=np.float64)
