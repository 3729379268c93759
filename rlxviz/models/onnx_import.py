"""Import an ONNX model (torch.onnx, optimum, ONNX Runtime's optimizer output) into the rlxviz IR.

`load_onnx(path, batch, seq)` reads the file with the `onnx` package and returns a `Model`:

* **Static shapes.** Every symbolic input dimension is bound: a name containing `batch` (or the first
  axis) to `batch`, a name containing `seq`/`sequence`/`len` (or the second axis) to `seq`, unless
  `input_shapes` gives the input's full shape. Everything that then depends only on constants
  (the exporter's shape subgraphs: Shape, Gather, Unsqueeze, Concat, ConstantOfShape, Range, Trilu, ...)
  is folded with ONNX's own reference evaluator (`onnx.reference`), so it never reaches the IR.
* **Params.** Initializers (external data included) become `param` nodes named after them; a folded
  tensor that is used by a computed node becomes a param named after its ONNX value; rank-0 and
  one-element tensors become `const` nodes (so scale factors look like the constants the patterns want).
* **Provenance.** Each IR node's `path` is the exporter's module path: torch.onnx's
  `pkg.torch.onnx.name_scopes` metadata (`encoder.layer.0.attention.self.query`), else a legacy
  exporter's node name `/encoder/layer.0/attention/self/query/MatMul`. `Model.meta["onnx_nodes"]`
  maps each IR node id to `(op_type, node name, doc_string)` of the ONNX node it came from.
* **Ops.** The ones transformer exports use (`SUPPORTED_OPS`), the contrib fused ops ONNX Runtime's
  transformer optimizer emits (Attention, MultiHeadAttention, SkipLayerNormalization,
  SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization, BiasGelu, FastGelu, Gelu), and any
  standard op whose inputs are all constant. Opsets 13-21 of the default domain.
* **Errors.** `OnnxImportError` (a ValueError), one message: unreadable file, an opset outside 13-21,
  an unbound dimension, or every op that cannot be mapped at once, each with its node names and the opset.

Each mapping is exact (the IR computes what the ONNX op computes) under the condition stated in its
handler; a node outside that condition is an error, never an approximation.
"""

from __future__ import annotations

import ast
import functools
import math
import os
import re
import resource
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..ir import Builder, DType, Graph, Op, lint
from ..ir.emitter import Ref
from ..ir.graph import SMALL_VALUE
from ..ir.host_rules import ONNX_DTYPES, OPSETS, ForkedFailure, forked, form_refusal, inferred_types
from ..ir.lint import problems
from ..ir.ops import PAD_MODES
from . import onnx_contrib, onnx_quant  # noqa: F401 - their handlers register into HANDLERS (ORT contrib, quantized)
from .cpu_limit import WALL_FACTOR, Deadline
from .module_calls import number_calls
from .onnx_context import (
    CONTRIB,
    HANDLERS,
    OnnxImportError,
    UnsupportedForm,
    Value,
    _axis,
    _const,
    _Ctx,
    _last_axis,
    _onnx,
    _zeros_like_gamma,
    handles,
    node_label,
)
from .onnx_fold import FOLDABLE, FoldError, check_fold, fold, node_attrs
from .onnx_paths import path_from_values
from .onnx_quant import quant_paths
from .onnx_size import over_budget
from .onnx_weights import (
    LAZY_ELEMENTS,
    ExternalDataError,
    ExternalTensor,
    LazyWeights,
    bind_external,
    eager_bytes,
    externals_as_inputs,
    read_on_demand,
    split_external,
    transposed_view,
)
from .presets import Model

MAX_IMPORT_SECONDS = 120.0
"""CPU time one import may take (an export of a 7B model maps in seconds); past it, or past `cpu_limit.WALL_FACTOR`
times it in wall time (a stopped or starved process), the import stops, naming the node it reached, so no upload
holds a server's worker for long. CPU time, not wall time: a busy machine does not refuse a good file."""

_DTYPES = ONNX_DTYPES
"""ONNX TensorProto element type -> DType."""


def onnx_dtype(code: int) -> DType:
    """DType of an ONNX element type code. Raises OnnxImportError for types the IR lacks."""
    if code not in _DTYPES:
        name = dtype_name(code)
        raise OnnxImportError(f"element type {name} has no IR dtype (supported: float, float16, bfloat16, "
                              f"double, int8, uint8, int32, int64, bool)")
    return _DTYPES[code]


def dtype_name(code: int) -> str:
    """An ONNX element type code in words: `COMPLEX64`, or `999 (no ONNX data type)`."""
    try:
        return _onnx().TensorProto.DataType.Name(code)
    except ValueError:
        return f"{code} (no ONNX data type)"


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


def _ints(ctx: _Ctx, v: Value, what: str) -> list[int]:
    if not isinstance(v, np.ndarray):
        raise ctx.fail(f"{what} must be a constant once batch and seq are bound (it depends on a model input)")
    return [int(x) for x in np.asarray(v).reshape(-1)]


# -- elementwise ---------------------------------------------------------------------------------------

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Max": "maximum",
           "Min": "minimum", "Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt",
           "GreaterOrEqual": "ge"}


@handles(*_BINARY)
def _binary(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Numpy-broadcast binary ops (two operands; Max/Min with more are folded pairwise)."""
    if len(x) < 2:
        raise ctx.fail("needs two operands")
    if n.op_type in ("Add", "Sub") and len(x) == 2:
        keep = _identity_operand(ctx, x[0], x[1], n.op_type == "Add")
        if keep is not None:
            return [keep]
    fn = getattr(ctx.b, _BINARY[n.op_type])
    acc = ctx.ref(x[0])
    for y in x[1:]:
        acc = fn(acc, ctx.ref(y))
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


_UNARY = {"Sqrt": "sqrt", "Erf": "erf", "Tanh": "tanh", "Sigmoid": "sigmoid", "Exp": "exp", "Log": "log",
          "Neg": "neg", "Relu": "relu", "Abs": "abs", "IsNaN": "isnan", "Sin": "sin", "Cos": "cos", "Floor": "floor"}


@handles(*_UNARY)
def _unary(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    return [ctx.b.unary(_UNARY[n.op_type], ctx.ref(x[0]))]


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


# -- data movement ---------------------------------------------------------------------------------------

def _reshape_source(ctx: _Ctx, v: Value) -> Value:
    """The tensor a reshape node reads (reshape of a reshape is one reshape of the source)."""
    while isinstance(v, Ref) and (n := ctx.b.lookup(v)).op == Op.RESHAPE:
        v = Ref(n.inputs[0])
    return v


def _reshape_to(ctx: _Ctx, v: Value, shape: Sequence[int]) -> Value:
    """`v` reshaped to `shape`; chained reshapes collapse (exact: a reshape only relabels the row-major
    order), so a flatten-then-restore pair leaves the source itself."""
    shape = tuple(int(d) for d in shape)
    if isinstance(v, np.ndarray):
        out = v.reshape(shape)
        if (name := ctx.value_names.get(v)) is not None:  # a reshaped constant keeps its ONNX name in messages
            ctx.value_names.setdefault(out, name)
        return out
    v = _reshape_source(ctx, v)
    return v if ctx.shape(v) == shape else ctx.b.reshape(v, shape)


@handles("Reshape")
def _reshape(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Target from a constant shape: 0 copies the input's dim (unless allowzero), one -1 is inferred."""
    src = ctx.shape(x[0])
    target = _ints(ctx, x[1], "the target shape")
    if not a.get("allowzero", 0):
        target = [src[i] if d == 0 else d for i, d in enumerate(target)]
    if -1 in target:
        known = math.prod(d for d in target if d != -1)
        target[target.index(-1)] = math.prod(src) // known if known else 0
    return [_reshape_to(ctx, x[0], target)]


@handles("Flatten")
def _flatten(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    s = ctx.shape(x[0])
    k = _axis(ctx, int(a.get("axis", 1)), len(s) + 1)
    return [_reshape_to(ctx, x[0], (math.prod(s[:k]), math.prod(s[k:])))]


@handles("Unsqueeze")
def _unsqueeze(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    s = list(ctx.shape(x[0]))
    new = _ints(ctx, x[1], "axes")
    axes = sorted(_axis(ctx, v, len(s) + len(new), "unsqueeze axis") for v in new)
    if len(set(axes)) != len(axes):
        raise ctx.fail(f"unsqueeze axes {new} repeat an axis")
    for ax in axes:
        s.insert(ax, 1)
    return [_reshape_to(ctx, x[0], s)]


@handles("Squeeze")
def _squeeze(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    s = ctx.shape(x[0])
    if len(x) > 1 and x[1] is not None:
        axes = {_axis(ctx, v, len(s), "squeeze axis") for v in _ints(ctx, x[1], "axes")}
        if wide := [i for i in sorted(axes) if s[i] != 1]:
            raise ctx.fail(f"squeeze of axis {wide[0]}, which holds {s[wide[0]]} (only size-1 axes can be squeezed)")
    else:
        axes = {i for i, d in enumerate(s) if d == 1}
    return [_reshape_to(ctx, x[0], [d for i, d in enumerate(s) if i not in axes])]


@handles("Transpose")
def _transpose(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    r = len(ctx.shape(x[0]))
    perm = tuple(int(p) for p in a.get("perm", range(r - 1, -1, -1)))
    if perm == tuple(range(r)):
        return [x[0]]
    if perm == (0, 2, 3, 1):
        # onnxscript merges the head split (0, 2, 1, 3) and the key transpose (0, 1, 3, 2) into one; written
        # back as the two (same result: (0, 2, 1, 3) composed with (0, 1, 3, 2) is (0, 2, 3, 1)), the form
        # attention patterns match
        return [ctx.b.transpose(ctx.b.transpose(ctx.ref(x[0]), (0, 2, 1, 3)), (0, 1, 3, 2))]
    return [ctx.b.transpose(ctx.ref(x[0]), perm)]


@handles("Concat")
def _concat(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    parts = [v for v in x if v is not None and 0 not in ctx.shape(v)]
    if len(parts) == 1:
        return [parts[0]]
    return [ctx.b.concat([ctx.ref(v) for v in parts], int(a["axis"]))]


def _narrow(ctx: _Ctx, v: Value, axis: int, start: int, length: int) -> Value:
    if start == 0 and length == ctx.shape(v)[axis]:
        return v
    return ctx.b.narrow(ctx.ref(v), axis, start, length)


@handles("Split")
def _split(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Sizes from the second input, the `split` attribute, or equal parts (`num_outputs` / output count)."""
    s = ctx.shape(x[0])
    axis = _axis(ctx, int(a.get("axis", 0)), len(s))
    if len(x) > 1 and x[1] is not None:
        sizes = _ints(ctx, x[1], "split")
    elif "split" in a:
        sizes = [int(v) for v in a["split"]]
    else:
        k = len(n.output)
        step = -(-s[axis] // k)
        sizes = [min(step, s[axis] - i * step) for i in range(k)]
    if sum(sizes) != s[axis] or any(size < 0 for size in sizes) or len(sizes) != len(n.output):
        raise ctx.fail(f"split sizes {sizes} into {len(n.output)} output(s) do not cover axis {axis} of "
                       f"{list(s)} (the sizes must be non-negative, one per output, and add up to {s[axis]})")
    outs, start = [], 0
    for size in sizes:
        outs.append(_narrow(ctx, x[0], axis, start, size))
        start += size
    return outs


@handles("Slice")
def _slice(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Constant starts/ends/axes with step 1 -> one narrow per sliced axis (bounds clamped as ONNX does)."""
    s = ctx.shape(x[0])
    starts, ends = _ints(ctx, x[1], "starts"), _ints(ctx, x[2], "ends")
    axes = _ints(ctx, x[3], "axes") if len(x) > 3 and x[3] is not None else list(range(len(starts)))
    steps = _ints(ctx, x[4], "steps") if len(x) > 4 and x[4] is not None else [1] * len(starts)
    if len(steps) != len(starts) or len(ends) != len(starts) or len(axes) != len(starts) or 0 in steps:
        raise ctx.fail(f"starts {starts}, ends {ends}, axes {axes}, steps {steps}: one of each per sliced axis, "
                       f"steps not 0")
    v = x[0]
    for st, en, ax, step in zip(starts, ends, axes, steps, strict=True):
        ax = _axis(ctx, ax, len(s), "slice axis")
        d = s[ax]
        if step == 1:
            st = max(0, min(d, st + d if st < 0 else st))
            en = max(0, min(d, en + d if en < 0 else en))
            v = _narrow(ctx, v, ax, st, max(0, en - st))
            continue
        # a strided slice is a gather of the indices Python's slice picks (ONNX clamps as slice.indices does)
        picked = np.arange(d, dtype=np.int64)[slice(st, en, step)].copy()
        if picked.size == 0:
            raise ctx.fail(f"the slice {st}:{en}:{step} of axis {ax} is empty (empty tensors are not supported)")
        v = _gather_axis(ctx, v, ax, picked)
    return [v]


@handles("Pad")
def _pad(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Pad(data, pads[, constant_value[, axes]]) (opset 13+) with constant pads, an optional constant fill value
    and `axes` (opset 18) -> `pad` (constant, reflect, edge); a negative pad (a crop) of constant mode is a narrow
    first (crop and fill on one axis commute in constant mode). `wrap`, computed pads or fill, and a negative
    pad in reflect/edge mode are valid forms left to the host (`UnsupportedForm`)."""
    s = ctx.shape(x[0])
    r = len(s)
    mode = a.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in PAD_MODES:
        raise ctx.unsupported(f"mode {mode!r} is not an IR pad mode ({', '.join(PAD_MODES)})")
    if not isinstance(x[1], np.ndarray):
        raise ctx.unsupported("the pads are computed from a model input (the IR's pad takes constant pads)")
    pads = _ints(ctx, x[1], "pads")
    fill = x[2] if len(x) > 2 else None
    if fill is not None and not isinstance(fill, np.ndarray):
        raise ctx.unsupported("the constant value is computed (the IR's pad takes a constant fill)")
    value = np.asarray(fill).reshape(-1)[0].item() if fill is not None and np.asarray(fill).size else 0.0
    if len(x) > 3 and x[3] is not None:  # axes: pads for those axes only, the others 0
        axes = [_axis(ctx, ax, r, "pad axis") for ax in _ints(ctx, x[3], "axes")]
        if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes):
            raise ctx.fail(f"pads {pads} needs 2 values per axis of {axes}, each axis once")
        full = [0] * (2 * r)
        for k, ax in enumerate(axes):
            full[ax], full[r + ax] = pads[k], pads[len(axes) + k]
        pads = full
    if len(pads) != 2 * r:
        raise ctx.fail(f"pads {pads} needs {2 * r} values (begins, then ends) for a rank-{r} input")
    v = x[0]
    if any(p < 0 for p in pads):
        if mode != "constant":
            raise ctx.unsupported(f"a negative pad in {mode} mode (pads {pads})")
        for ax in range(r):
            lo, hi = max(0, -pads[ax]), max(0, -pads[r + ax])
            if lo or hi:
                if lo + hi >= s[ax]:
                    raise ctx.fail(f"pads {pads} crop axis {ax} of size {s[ax]} to nothing (empty tensors are not "
                                   f"supported)")
                v = _narrow(ctx, v, ax, lo, s[ax] - lo - hi)
        pads = [max(0, p) for p in pads]
    if mode == "reflect" and any(max(pads[i], pads[r + i]) >= ctx.shape(v)[i] for i in range(r)):
        raise ctx.fail(f"reflect pads {pads} reach past the edge of {list(ctx.shape(v))} (each pad < its axis)")
    if not any(pads):
        return [v]
    dtype = ctx.dtype(x[0])
    fill_value = bool(value) if dtype == DType.bool else int(value) if not dtype.is_float else float(value)
    return [ctx.b.pad(ctx.ref(v), pads, mode=mode, value=fill_value)]


@handles("Gather")
def _gather(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Embedding lookups (axis 0, computed indices) map to `gather`; constant indices on any axis map to
    narrow (+ reshape for a scalar index) when they are one contiguous run, else to `gather` on axis 0."""
    data, idx = x
    s = ctx.shape(data)
    axis = _axis(ctx, int(a.get("axis", 0)), len(s))
    if isinstance(idx, np.ndarray):
        ids = np.where(idx < 0, idx + s[axis], idx).astype(np.int64)
        flat = ids.reshape(-1)
        if flat.size and np.array_equal(flat, np.arange(flat[0], flat[0] + flat.size)):
            out = _narrow(ctx, data, axis, int(flat[0]), int(flat.size))
            return [_reshape_to(ctx, out, (*s[:axis], *ids.shape, *s[axis + 1:]))]
        idx = ids
    return [_gather_axis(ctx, data, axis, idx)]


@handles("GatherElements")
def _gather_elements(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """GatherElements with computed indices (constant ones are folded): `out[i] = data[i with i[axis] =
    idx[i]]` as one axis-0 gather from the flattened data, at flat index `offsets + idx' * stride[axis]` with
    `offsets` the constant row-major offset of every other coordinate and `idx' = where(idx < 0, idx + d, idx)`.
    Exact for indices in [-d, d - 1] (ONNX's domain; the runtime checks gather indices before running).
    RoBERTa's token-type buffer read at the position ids is this form."""
    data, idx = x
    s, t = ctx.shape(data), ctx.shape(idx)
    if len(s) != len(t) or any(ti > si for k, (ti, si) in enumerate(zip(t, s, strict=True)) if k != a.get("axis", 0)):
        raise ctx.fail(f"indices {list(t)} do not fit data {list(s)} (same rank, no larger on the other axes)")
    ax = _axis(ctx, int(a.get("axis", 0)), len(s))
    b = ctx.b
    strides = [math.prod(s[k + 1:]) for k in range(len(s))]
    grid = np.indices(t, dtype=np.int64)
    offsets = sum(grid[k] * strides[k] for k in range(len(s)) if k != ax)
    i = ctx.ref(idx)
    if ctx.dtype(idx) != DType.i64:
        i = b.cast(i, DType.i64)
    d = ctx.ref(np.asarray(s[ax], dtype=np.int64))
    i = b.where(b.lt(i, ctx.ref(np.asarray(0, dtype=np.int64))), b.add(i, d), i)
    if strides[ax] != 1:
        i = b.mul(i, ctx.ref(np.asarray(strides[ax], dtype=np.int64)))
    if np.any(offsets):
        i = b.add(i, ctx.ref(np.asarray(offsets, dtype=np.int64)))
    table = _reshape_to(ctx, data, (math.prod(s), 1))
    return [_reshape_to(ctx, b.gather(ctx.ref(table), i), t)]


def _gather_axis(ctx: _Ctx, data: Value, axis: int, idx: Value) -> Ref:
    """`take(data, idx, axis)` as the IR's axis-0 gather: the axis moved to the front and back (exact)."""
    b, s = ctx.b, ctx.shape(data)
    if axis == 0:
        return b.gather(ctx.ref(data), ctx.ref(idx))
    perm = (axis, *[i for i in range(len(s)) if i != axis])
    g = b.gather(b.transpose(ctx.ref(data), perm), ctx.ref(idx))
    r = len(ctx.shape(idx))
    return b.transpose(g, (*range(r, r + axis), *range(r), *range(r + axis, r + len(s) - 1)))


def _broadcast_view(flat: np.ndarray, dims: tuple[int, ...]) -> tuple[int, ...] | None:
    """If flat indices `flat` into an array of leading shape `dims` just repeat it along new axes (a
    broadcast of a reshape), the shape to reshape it to before expanding; else None."""
    keep = tuple(i for i in range(flat.ndim) if flat.shape[i] > 1 and np.ptp(flat, axis=i).any())
    reduced = flat[tuple(slice(None) if i in keep else slice(0, 1) for i in range(flat.ndim))]
    ok = (reduced.size == math.prod(dims) and np.array_equal(reduced.reshape(-1), np.arange(reduced.size))
          and [d for d in reduced.shape if d > 1] == [d for d in dims if d > 1])
    return reduced.shape if ok else None


@handles("GatherND")
def _gather_nd(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Constant indices (batch_dims 0) only. When they read the data in order along new axes (how
    torch.onnx exports `mask[batch_idx, kv_idx]`), the result is reshape + expand; otherwise
    flatten + gather with the flattened indices."""
    data, idx = x
    if int(a.get("batch_dims", 0)) != 0 or not isinstance(idx, np.ndarray):
        raise ctx.unsupported("only constant indices with batch_dims 0 are supported")
    s = ctx.shape(data)
    k = idx.shape[-1]
    lead, rest = s[:k], s[k:]
    ids = np.where(idx < 0, idx + np.asarray(lead), idx)
    flat = np.ravel_multi_index(tuple(np.moveaxis(ids, -1, 0)), lead) if k else np.zeros(idx.shape[:-1], np.int64)
    out_shape = (*flat.shape, *rest)
    view = _broadcast_view(np.asarray(flat), tuple(lead))
    b = ctx.b
    if view is not None:
        r = _reshape_to(ctx, data, (*view, *rest))
        rr = ctx.ref(r)
        return [rr if ctx.shape(rr) == out_shape else b.expand(rr, out_shape)]
    table = _reshape_to(ctx, data, (math.prod(lead), *rest))
    return [b.gather(ctx.ref(table), ctx.ref(np.asarray(flat, dtype=np.int64)))]


@handles("Expand")
def _expand(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    target = tuple(np.broadcast_shapes(ctx.shape(x[0]), tuple(_ints(ctx, x[1], "the target shape"))))
    if target == ctx.shape(x[0]):
        return [x[0]]
    s = ctx.shape(x[0])
    r = ctx.ref(x[0])
    if len(s) < len(target):
        r = ctx.b.reshape(r, (1,) * (len(target) - len(s)) + tuple(s))
    return [ctx.b.expand(r, target)]


# -- folding and the driver ----------------------------------------------------------------------------------

def _host_op(ctx: _Ctx, node: Any, ins: list[Value], domain: str) -> list[Ref | None] | None:
    """`onnx_op` nodes for a default-domain ONNX node no handler maps (`ir.onnx_op`): one per output the graph
    names (TopK's values and indices are two nodes, each evaluating the ONNX node and keeping its `output`), no
    subgraph, inputs the IR can hold, and output types ONNX shape inference fixes from the bound input shapes.
    None when any of these fails (the op is then listed as unmapped). Raises nothing."""
    from ..ir.onnx_op import encode

    if domain or form_refusal(node) is not None:  # the form rules lint applies to every `onnx_op` (ir.host_rules)
        return None
    try:
        named = [(name, v) for name, v in zip(node.input, ins, strict=True) if name]
        consts = {name: v for name, v in named if isinstance(v, np.ndarray)}
        typed = {name: (np.dtype(ctx.dtype(v).numpy), ctx.shape(v)) for name, v in named if name not in consts}
    except Exception:  # noqa: BLE001 - an input the IR cannot hold: the op stays unmapped, named in the one error
        return None
    types = inferred_types(node, ctx.opset, consts, typed)
    if isinstance(types, str):  # not inferable: the op stays unmapped, named in the one error
        return None
    operands = [ctx.ref(v) for name, v in zip(node.input, ins, strict=True) if name]
    if not operands:
        return None
    text, several = encode(node), sum(1 for o in node.output if o) > 1 or len(node.output) > 1
    refs: list[Ref | None] = []
    for k, o in enumerate(node.output):
        if not o:
            refs.append(None)
            continue
        dtype, shape = types[o]
        extra = {"output": k} if several else {}
        refs.append(Ref(ctx.b.emit(Op.ONNX_OP, tuple(operands), op_type=node.op_type, name=node.name or "",
                                   node=text, opset=ctx.opset, shape=shape, dtype=dtype.value, **extra)))
    return refs


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


_NAME_SCOPES = "pkg.torch.onnx.name_scopes"
MAX_SCOPES_TEXT = 8192
"""The longest name-scope metadata read (a real one is a few hundred bytes); longer is ignored, the node name used."""


def node_path(node: Any) -> str:
    """The exporter's module path of an ONNX node: torch.onnx's name-scope metadata, else a legacy
    `/a/b.0/c/Op` node name as `a.b.0.c`, else the path its values' names carry (`onnx_paths.path_from_values`:
    nodes a graph optimizer made); '' when none is present."""
    for p in node.metadata_props:
        if p.key == _NAME_SCOPES:
            if len(p.value) > MAX_SCOPES_TEXT:  # parsed with a bound: 400 KB of it took 179 MB
                break
            try:
                scopes = ast.literal_eval(p.value)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                break
            if not isinstance(scopes, list | tuple):
                break
            mods = [s for s in scopes[:-1] if isinstance(s, str) and s]
            return mods[-1] if mods else ""
    name = node.name or ""
    if name.startswith("/"):
        return ".".join(part for part in name.split("/")[1:-1] if part)
    return path_from_values(node)  # a node an optimizer made: the path its values' names carry


_BATCH_RE = re.compile(r"batch", re.I)
_SEQ_RE = re.compile(r"seq|sequence|len|token", re.I)


def _bind_input(vi: Any, batch: int, seq: int, shapes: Mapping[str, Sequence[int]]) -> tuple[tuple[int, ...], DType]:
    t = vi.type.tensor_type
    dtype = onnx_dtype(t.elem_type)
    if vi.name in shapes:
        given = tuple(int(d) for d in shapes[vi.name])
        if (bad := next((i for i, d in enumerate(given) if d <= 0), None)) is not None:
            raise OnnxImportError(f"input {vi.name!r}: dimension {bad} is {given[bad]}; a graph input's dimensions "
                                  f"must be positive")
        if why := _binds(vi, given):
            raise OnnxImportError(why)
        return given, dtype
    dims = []
    for i, d in enumerate(t.shape.dim):
        if d.HasField("dim_value") and d.dim_value <= 0:
            raise OnnxImportError(f"input {vi.name!r}: dimension {i} is {d.dim_value}; a graph input's dimensions "
                                  f"must be positive")
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif _BATCH_RE.search(d.dim_param or "") or (i == 0 and not _SEQ_RE.search(d.dim_param or "")):
            dims.append(batch)
        elif _SEQ_RE.search(d.dim_param or "") or i == 1:
            dims.append(seq)
        else:
            raise OnnxImportError(f"input {vi.name!r}: cannot bind dimension {i} ({d.dim_param or '?'}); "
                                  f"give its shape with input_shapes={{'{vi.name}': [...]}}")
    return tuple(dims), dtype


def _binds(vi: Any, given: tuple[int, ...]) -> str:
    """Why the array shape `given` cannot bind the graph input `vi`, or '': an array binds only the symbolic
    dimensions of the file's input (a `dim_param`, or none given); its rank and every fixed dimension must be the
    file's, else the model would run under another meaning than the file's (ONNX Runtime refuses such inputs).
    An input with no shape in the file binds any. Raises nothing."""
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return ""
    declared = [int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    shown = "[" + ", ".join(str(d) for d in declared) + "]"
    where = f"input {vi.name!r} has shape {list(given)}"
    if len(given) != len(declared):
        return (f"{where} (rank {len(given)}); the file's input is {shown} (rank {len(declared)}): an array binds only "
                f"the input's symbolic dimensions")
    fixed = [i for i, d in enumerate(declared) if isinstance(d, int) and d != given[i]]
    if fixed:
        return (f"{where}; the file fixes it to {shown} (dimension {fixed[0]} is {declared[fixed[0]]}): an array "
                f"binds only the input's symbolic dimensions")
    return ""


def _same_symbols(vi: Any, shape: tuple[int, ...], bound: dict[str, tuple[int, str]]) -> str:
    """Why the array shape `shape` binds a symbolic dimension of input `vi` to another size than an earlier input
    bound the same symbol to (`bound`: symbol -> (size, input), updated), or '': one symbol has one size.
    Raises nothing."""
    t = vi.type.tensor_type
    for i, d in enumerate(t.shape.dim if t.HasField("shape") else ()):
        if not d.dim_param or i >= len(shape):
            continue
        size, by = bound.setdefault(d.dim_param, (shape[i], vi.name))
        if size != shape[i]:
            return (f"input {vi.name!r} has shape {list(shape)}: its dimension {i} ({d.dim_param!r}) is {shape[i]}, "
                    f"but input {by!r} binds {d.dim_param!r} to {size}")
    return ""


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

    Raises:
        OnnxImportError: the first rule broken, naming the op (and node, when ONNX names it), in one line; or that
            the inference crashed or took too long on this file.
    """
    if hasattr(os, "fork"):  # the child may change its copy-on-write proto: the parent's is untouched
        why = _isolated(lambda: _strict_inference(proto) or _checker(proto))
    else:
        why = _strict_inference(proto) or _checker(_copy(proto))
    if why:
        raise OnnxImportError(why)


def _copy(proto: Any) -> Any:
    out = type(proto)()
    out.CopyFrom(proto)
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
    first, so this CHANGES `proto` (called on a forked child's copy, or on a copy)."""
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
is bounded at `cpu_limit.WALL_FACTOR` times it."""


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
    """Run `check` in a forked child (`ir.host_rules.forked`, the one such runner) and return its text. The child
    may use `VALIDATE_SECONDS` of CPU time (`RLIMIT_CPU`: past it the kernel ends it with SIGXCPU) and
    `cpu_limit.WALL_FACTOR` times that in wall time (a stopped or starved child); a child killed by a signal or past
    either limit gives a refusal saying so."""

    def capped() -> str:  # in the child
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        soft = max(1, math.ceil(VALIDATE_SECONDS))
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
        return check()

    try:
        return forked(capped, VALIDATE_SECONDS * WALL_FACTOR)
    except ForkedFailure as e:
        if e.signal == "SIGXCPU":
            return f"ONNX's shape inference took over {VALIDATE_SECONDS:g} s of CPU time on this file; refused"
        if e.timed_out:
            return (f"ONNX's shape inference took over {VALIDATE_SECONDS * WALL_FACTOR:g} s of wall time on this file "
                    "(stopped or starved); refused")
        if e.signal:
            return f"ONNX's shape inference crashed on this file ({e.signal}): it is malformed; refused"
        return "ONNX's shape inference failed on this file; refused"


def _misfit(ctx: _Ctx, node: Any, ins: list[Value]) -> str | None:
    """Why the bound shapes do not fit what the export fixed, in one sentence naming the limit, or None: a Gather
    whose constant indices run past a table (a position table of N rows: `seq 65 is over the 64 positions of the
    export's position table 'wpe.weight'`), or an Expand of a fixed-shape tensor to a shape it cannot broadcast
    to (a buffer traced at one sequence length). Checked before the node is folded or mapped, so the user reads
    the limit, not NumPy's IndexError/broadcast message. Raises nothing."""
    if node.domain not in ("", "ai.onnx") or len(ins) < 2 or ins[0] is None or ins[1] is None:
        return None
    where = f"({node_label(node)})"
    if node.op_type == "Gather" and isinstance(ins[1], np.ndarray) and ins[1].size:
        shape = ctx.shape(ins[0])
        if not shape:
            return None
        axis = int(node_attrs(node).get("axis", 0)) % len(shape)
        rows, hi, lo = shape[axis], int(ins[1].max()), int(ins[1].min())
        if lo >= -rows and hi < rows:
            return None
        table = ctx.value_names.get(ins[0], node.input[0])
        if ctx.seq is not None and hi + 1 == ctx.seq and lo >= 0:
            return f"seq {ctx.seq} is over the {rows} positions of the export's position table {table!r} {where}"
        bad = hi if hi >= rows else lo
        return f"index {bad} is outside the {rows} rows of {table!r} (axis {axis}) {where}"
    if node.op_type == "Expand" and isinstance(ins[1], np.ndarray):
        s, t = ctx.shape(ins[0]), tuple(int(d) for d in ins[1].reshape(-1))
        if (neg := next((d for d in t if d < 0), None)) is not None:  # Expand has no -1 (Reshape's "infer")
            return f"Expand's shape {list(t)} holds the negative dimension {neg} {where}"
        try:
            np.broadcast_shapes(s, t)
            return None
        except ValueError:
            pass
        n = max(len(s), len(t))
        s1, t1 = (1,) * (n - len(s)) + tuple(s), (1,) * (n - len(t)) + t
        axis = next((i for i in range(n) if s1[i] != 1 and t1[i] != 1 and s1[i] != t1[i]), None)
        if axis is None:
            return f"{list(s)} cannot expand to {list(t)} {where}"
        name = ctx.value_names.get(ins[0], node.input[0])
        fixed = f"the export's fixed-shape tensor {name!r} {list(s)}"
        if ctx.seq is not None and t1[axis] == ctx.seq:
            return (f"seq {ctx.seq} is over the {s1[axis]} positions of {fixed} (it cannot expand to {list(t)}) "
                    f"{where}")
        return f"{fixed} cannot expand to {list(t)}: axis {axis - (n - len(s))} holds {s1[axis]} {where}"
    return None


def import_graph(proto: Any, batch: int = 1, seq: int = 128, input_shapes: Mapping[str, Sequence[int]] | None = None,
                 name: str | None = None, max_bytes: int | None = None,
                 external: Mapping[str, ExternalTensor] | None = None,
                 ) -> tuple[Graph, Mapping[str, np.ndarray], dict[int, tuple[str, str, str]]]:
    """An IR graph, its weights and per-node ONNX provenance from an `onnx.ModelProto` (external data loaded, except
    the initializers in `external`: `onnx_weights.split_external`, left in their file, each a param at its first use).

    Returns:
        (graph, weights: param name -> array (an `onnx_weights.LazyWeights` when `external` names a used
        initializer), provenance: IR node id -> (op_type, node name, doc_string)).

    Raises:
        OnnxImportError: unsupported opset, dtype, unbound or non-positive dimension, a node reading a value
            nothing produced, a folded constant over `max_bytes` (with the constants already held), or
            unmappable ops (all listed at once).
    """
    from onnx import numpy_helper

    opset = default_opset(proto)
    validate(proto)
    g = proto.graph
    shapes = dict(input_shapes or {})
    b = Builder(name or g.name or "onnx")
    weights: dict[str, np.ndarray] = {}
    ctx = _Ctx(b, opset, weights, seq=seq, max_bytes=max_bytes)
    env: dict[str, Value] = {}
    pending = dict(external or {})
    lazy: dict[str, ExternalTensor] = {}

    def lazy_param(t: ExternalTensor) -> Ref:  # named and placed as `_Ctx.ref` names and places an initializer
        base = t.name if "." in t.name or not b.path else f"{b.path}.{t.name}"
        lazy[pname := ctx._unique(base)] = t
        return b.param(pname, t.shape, onnx_dtype(t.data_type))

    for init in g.initializer:
        if init.name in pending:
            continue
        arr = numpy_helper.to_array(init)
        env[init.name] = arr
        ctx.held_bytes += arr.nbytes
        ctx.value_names[arr] = init.name
    bound: dict[str, tuple[int, str]] = {}  # symbolic dimension -> (size, the input that bound it)
    for vi in g.input:
        if vi.name in env or vi.name in pending:
            continue
        shape, dtype = _bind_input(vi, batch, seq, shapes)
        if vi.name in shapes and (why := _same_symbols(vi, shape, bound)):
            raise OnnxImportError(why)
        if vi.name in shapes and len(shape) >= 2:
            ctx.seq = int(shape[1])  # shapes from the caller's arrays: their seq is the one bound
        env[vi.name] = b.input(vi.name, shape, dtype)
        ctx.names.add(vi.name)
    provenance: dict[int, tuple[str, str, str]] = {}
    unmapped: dict[str, list[str]] = {}
    errors: list[str] = []
    poisoned: set[str] = set()
    deadline = Deadline(MAX_IMPORT_SECONDS)
    paths = number_calls([node_path(node) for node in g.node])  # one layer module called N times: N layers
    paths = quant_paths(g.node, paths)  # a quantizer's Q/DQ nodes: the path of the value they quantize
    for node, path in zip(g.node, paths, strict=True):
        if late := deadline.exceeded():  # every step is bounded; this bounds their sum (a graph of 10^6 nodes)
            ctx.node = node
            raise OnnxImportError(str(ctx.fail(f"the import has {late}; stopped here (a graph of {len(g.node):,} "
                                               f"nodes)")))
        if any(i in poisoned for i in node.input if i):
            poisoned.update(node.output)
            continue
        if pending:
            if transposed_view(pending, node, env):  # a Transpose of a weight in its file: read transposed
                continue
            if (table := read_on_demand(pending, node, env)) is not None:  # a table selected by constants
                ctx.held_bytes += table.nbytes
                ctx.value_names[table] = node.input[0]
            b.path = path
            bind_external(pending, node.input, env, lazy_param)
        if (missing := next((i for i in node.input if i and i not in env), None)) is not None:
            ctx.node = node
            raise OnnxImportError(str(ctx.fail(f"reads {missing!r}, which no earlier node or input produces "
                                               f"(a cycle or a dangling input)")))
        ins: list[Value] = [env[i] if i else None for i in node.input]
        attrs = node_attrs(node)
        ctx.node = node
        b.path = path  # before anything emits: a handler's nodes and a host node carry this node's path
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        try:
            if (misfit := _misfit(ctx, node, ins)) is not None:
                raise OnnxImportError(misfit)
            if domain == "" and node.op_type in ("Shape", "Size"):
                outs: list[Value] = [_shape_op(ctx, node, ins, attrs)]
            elif domain == "" and node.op_type in FOLDABLE and all(isinstance(v, np.ndarray) or v is None
                                                                  for v in ins):
                try:
                    check_fold(node, ins, opset, ctx.held_bytes, ctx.max_bytes)  # type: ignore[arg-type]
                except FoldError as e:
                    raise ctx.fail(str(e)) from None
                outs = fold(node, ins, opset)  # type: ignore[arg-type]
                ctx.held_bytes += sum(o.nbytes for o in outs if isinstance(o, np.ndarray))
            elif (domain, node.op_type) in HANDLERS:
                if (domain or not _onnx().defs.has(node.op_type)) and (why := _contrib_inputs(node, domain)):
                    raise ctx.fail(why)
                first = b._next
                try:
                    outs = HANDLERS[(domain, node.op_type)](ctx, node, ins, attrs)
                except UnsupportedForm:
                    # a valid form the handler does not map (GatherND with computed indices): an opaque host node
                    # when it refused before emitting anything and the host can type it; else its error
                    if b._next != first or (hosts := _host_op(ctx, node, ins, domain)) is None:
                        raise
                    outs = hosts  # type: ignore[assignment]
                for i in range(first, b._next):
                    provenance[i] = (node.op_type, node.name, node.doc_string)
            elif (hosts := _host_op(ctx, node, ins, domain)) is not None:
                for host in hosts:
                    if host is not None:
                        provenance[int(host)] = (node.op_type, node.name, node.doc_string)
                outs = hosts  # type: ignore[assignment]
            else:
                key = node.op_type if domain == "" else f"{domain}.{node.op_type}"
                unmapped.setdefault(key, []).append(node.name or "(unnamed)")
                poisoned.update(node.output)
                continue
        except OnnxImportError as e:
            errors.append(str(e))
            poisoned.update(node.output)
            continue
        except Exception as e:  # noqa: BLE001 - a shape/type error in one node becomes a named error
            said = " ".join(str(e).split())
            errors.append(f"{node_label(node)} (opset {opset}): {type(e).__name__}"
                          f"{': ' + said if said else ' (with no message: a step of its import found no value)'}")
            poisoned.update(node.output)
            continue
        for out_name, v in zip(node.output, outs, strict=False):
            if out_name:
                env[out_name] = v
                if isinstance(v, np.ndarray):
                    ctx.value_names.setdefault(v, out_name)
    if unmapped:
        listing = "; ".join(f"{op} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                            for op, names in sorted(unmapped.items()))
        raise OnnxImportError(f"{len(unmapped)} op(s) cannot be mapped to the IR (opset {opset}): {listing}")
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise OnnxImportError(errors[0] + more)
    b.path = ""
    bind_external(pending, [o.name for o in g.output], env, lazy_param)
    outs = []
    for o in g.output:
        v = env.get(o.name)
        if v is None:
            raise OnnxImportError(f"graph output {o.name!r} is not produced by any node")
        outs.append(ctx.ref(v))
    b.output(*outs)
    from ..passes.pipeline import run_pass

    # the small weights' values go with the graph before lint: an `onnx_op` whose output shape ONNX infers from a
    # constant input (Resize's sizes) is checked with that value, as `_host_op` typed it (`ir.host_rules`)
    built = b.build().with_values({k: v for k, v in weights.items() if v.size <= SMALL_VALUE})
    if bad := problems(built):  # a rank, dtype or attribute the IR cannot hold: named by the ONNX node it came from
        nid, msg = bad[0]
        made = provenance.get(nid) if nid is not None else None
        where = (f"{made[0]} node {made[1]!r}" if made else
                 f"{built[nid].op.value} {built[nid].attrs.get('name')!r}" if nid is not None else "the graph")
        raise OnnxImportError(f"{where} (opset {opset}): {msg}")
    graph = lint(run_pass(built, "dead_code_elimination"), "onnx import")
    used = {n.name for n in graph.params}
    weights = {k: v for k, v in weights.items() if k in used}
    small = {k: v for k, v in weights.items() if v.size <= SMALL_VALUE}  # what guards on constant tables read
    lazy = {k: t for k, t in lazy.items() if k in used}
    return graph.with_values(small), LazyWeights(weights, lazy) if lazy else weights, provenance


def _size(n: int) -> str:
    return f"{n} bytes" if n < 2**20 else f"{n / 2**20:.1f} MiB"


def _bound_external_data(proto: Any, folder: Path, path: str | Path) -> None:
    """Make each external initializer read exactly the bytes its dims and dtype declare: a missing `length` is set
    to that size (ONNX would read to the end of the file: a 4-byte tensor read a 1 GB file), a `length` that
    differs, or data running past the end of its file, is refused before anything is read.

    Raises:
        OnnxImportError: naming the initializer, its declared size and what the file holds.
    """
    onnx = _onnx()
    for t in proto.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        try:
            need = math.prod(t.dims) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if info.get("length") else None
        except (ValueError, KeyError, TypeError) as e:
            raise OnnxImportError(f"{path}: initializer {t.name!r}: unreadable external data entry ({e})") from None
        where = info.get("location", "")
        f = folder / where
        inside = where and f.resolve().is_relative_to(folder.resolve())  # outside: refused by onnx, unread here
        size = f.stat().st_size if inside and f.is_file() else None
        if length is not None and length != need:
            raise OnnxImportError(f"{path}: initializer {t.name!r} declares {length} bytes of external data; its "
                                  f"dims {list(t.dims)} need {need}")
        if size is not None and (offset < 0 or offset + need > size):
            raise OnnxImportError(f"{path}: initializer {t.name!r} needs bytes {offset}..{offset + need} of {where!r}, "
                                  f"which holds {size}")
        if length is None:
            entry = t.external_data.add()
            entry.key, entry.value = "length", str(need)


def _check_initializer_types(proto: Any, path: str | Path) -> None:
    """Refuse an initializer whose data type code is no ONNX tensor type (999, UNDEFINED): nothing could size or
    read it. Raises OnnxImportError naming the initializer and the code."""
    onnx = _onnx()
    for t in proto.graph.initializer:
        try:
            onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
        except (KeyError, ValueError, TypeError):
            raise OnnxImportError(f"{path}: initializer {t.name!r} has data type {dtype_name(t.data_type)}: no "
                                  f"tensor of that type can be read; refused") from None


def load_onnx(path: str | Path, batch: int = 1, seq: int = 128, input_shapes: Mapping[str, Sequence[int]] | None = None,
              external_data_dir: str | Path | None = None, name: str | None = None,
              max_bytes: int | None = None, lazy_elements: int | None = LAZY_ELEMENTS) -> Model:
    """A `Model` from an `.onnx` file.

    Args:
        path: the `.onnx` file.
        batch, seq: values for the symbolic batch / sequence dimensions of the inputs.
        input_shapes: full static shapes for some inputs (by name), overriding the binding.
        external_data_dir: where the external-data files live (default: the model's folder).
        name: the model name (default: the file's stem).
        max_bytes: refuse a model whose initializers held in memory (the file's own and the external ones of at
            most `lazy_elements` elements) would take more bytes, checked from their declared shapes before the
            external data is read, and a file whose size or text counts more (`onnx_size.over_budget`), checked
            before it is parsed.
        lazy_elements: external initializers with more elements stay in their file until their values are
            needed (`onnx_weights`: the model's weights are then a `LazyWeights`); None reads them all at load.

    Raises:
        OnnxImportError: unreadable or invalid file, too large, missing external data, or anything
            `import_graph` refuses.
    """
    onnx = _onnx()
    p = Path(path)
    if not p.is_file():
        raise OnnxImportError(f"{path}: no such file")
    if max_bytes is not None and (why := over_budget(p, max_bytes)) is not None:  # before parsing (onnx_size)
        raise OnnxImportError(f"{path}: {why}")
    try:
        proto = onnx.load(str(p), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf DecodeError and friends
        raise OnnxImportError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    if not proto.HasField("graph"):
        why = "the file is empty" if p.stat().st_size == 0 else "it holds no graph"
        raise OnnxImportError(f"{path}: not an ONNX model ({why})")
    _check_initializer_types(proto, path)  # before any size is computed from a data type
    folder = Path(external_data_dir or p.parent)
    if max_bytes is not None:
        need = eager_bytes(proto, {t.name for t in proto.graph.initializer  # those left in their file: not held
                                   if t.data_location == onnx.TensorProto.EXTERNAL and lazy_elements is not None
                                   and math.prod(t.dims) > lazy_elements})
        if need > max_bytes:
            raise OnnxImportError(f"{path}: its initializers need {_size(need)}, over the limit of {_size(max_bytes)} "
                                  f"(--max-memory-mb / RLXVIZ_MAX_MEMORY_MB)")
    _bound_external_data(proto, folder, path)
    try:
        external = split_external(proto, folder, lazy_elements)  # reads the small ones; the large stay in the file
    except (ExternalDataError, OSError) as e:  # missing file, path escaping the folder, short read
        raise OnnxImportError(f"{path}: cannot load external data ({type(e).__name__}: {e})") from None
    try:
        graph, weights, provenance = import_graph(proto, batch, seq, input_shapes, name or p.stem, max_bytes,
                                                  external)
    except OnnxImportError as e:
        raise OnnxImportError(f"{path}: {e}") from None
    producer = f"{proto.producer_name} {proto.producer_version}".strip()
    return Model(name or p.stem, graph, weights, None, f"ONNX export {p.name}" + (f" ({producer})" if producer else ""),
                 meta={"onnx_file": str(p), "opset": default_opset(proto), "producer": producer,
                       "onnx_outputs": [o.name for o in proto.graph.output],
                       "onnx_nodes": provenance})



__all__ = ["OPSETS", "OnnxImportError", "dtype_name", "import_graph", "load_onnx", "node_label", "node_path",
           "onnx_dtype", "validate"]
