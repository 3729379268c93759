"""`Emitter`: the op vocabulary as methods, independent of what an emitted value is.

The same method calls build IR nodes (`Builder`, `Rewriter`: a value is a node id) or compute
NumPy arrays (the reference interpreter's eager emitter: a value is an array). Fused-op semantics
in `rlxviz.ir.fused` are written once against this interface and shared by the reference
interpreter and the `unfuse` pass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from .dtype import DType
from .ops import SPECS, Op

V = TypeVar("V")


class Ref(int):
    """A node id returned by a graph-building emitter; distinct from a Python int used as a scalar."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"%{int(self)}"

    def __str__(self) -> str:
        return int.__repr__(self)

Scalar = int | float


def normalize_attrs(op: Op, attrs: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and turn lists into tuples so attributes are canonical and hashable-ish."""
    spec = SPECS[op]
    out: dict[str, Any] = {}
    for key, a in spec.attrs.items():
        if key in attrs:
            out[key] = _freeze(attrs[key])
        elif not a.required:
            out[key] = a.default
    for key in attrs:
        if key not in out:
            out[key] = _freeze(attrs[key])  # unknown attrs are kept so the verifier can name them
    return out


_PLAIN = frozenset({int, float, str, bool, type(None)})


def _freeze(v: Any) -> Any:
    if type(v) in _PLAIN:  # most attrs, first: the MLX lowering normalizes every node's attrs on every call
        return v
    if isinstance(v, list | tuple):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, DType):
        return v.value
    if isinstance(v, np.generic):  # np.int64(3) -> 3, np.float32(0.5) -> 0.5, np.bool_ -> bool
        return v.item()
    if isinstance(v, int) and not isinstance(v, bool) and type(v) is not int:  # Ref, IntEnum -> int
        return int(v)
    return v


class Emitter(ABC, Generic[V]):
    """Op methods shared by graph builders and eager evaluators. Subclasses implement `emit`,
    `const`, `shape_of` and `dtype_of`."""

    @abstractmethod
    def emit(self, op: Op, inputs: Sequence[V], **attrs: Any) -> V:
        """Apply `op` to `inputs` with `attrs`; returns the new value."""

    @abstractmethod
    def const(self, value: Scalar | Sequence[Scalar], dtype: DType = DType.f32) -> V:
        """A constant scalar (shape `()`) or small vector (shape `(n,)`)."""

    @abstractmethod
    def shape_of(self, v: V) -> tuple[int, ...]: ...

    @abstractmethod
    def dtype_of(self, v: V) -> DType: ...

    def is_scalar(self, x: object) -> bool:
        """True for a Python number that should become a constant (not a value of this emitter)."""
        return isinstance(x, bool | int | float) and not isinstance(x, Ref)

    def _v(self, x: V | Scalar, like: V | None = None) -> V:
        if self.is_scalar(x):
            dtype = self.dtype_of(like) if like is not None else DType.f32
            return self.const(x, dtype if dtype.is_float else DType.f32)
        return x  # type: ignore[return-value]

    def _bin(self, op: Op, a: V | Scalar, b: V | Scalar) -> V:
        like = None if self.is_scalar(a) and self.is_scalar(b) else b if self.is_scalar(a) else a
        return self.emit(op, (self._v(a, like), self._v(b, like)))

    # linear algebra
    def matmul(self, a: V, b: V) -> V:
        """`a @ b`: `[..., M, K] x [..., K, N] -> [..., M, N]` with batch broadcasting."""
        return self.emit(Op.MATMUL, (a, b))

    def linear(self, x: V, w: V, b: V | None = None) -> V:
        """`x @ w (+ b)` as primitives; `w` is `[in, out]` (Hugging Face weights transposed)."""
        y = self.matmul(x, w)
        return self.add(y, b) if b is not None else y

    def linear_act(self, x: V, w: V, b: V | None, act: str | None) -> V:
        """`act(x @ w (+ b))`: `linear`, then the unary op `act` (None: no activation). One method so a
        backend can run the bias add and the activation as one kernel (the MLX emitter's CPU kernels)."""
        y = self.linear(x, w, b)
        return y if act is None else self.unary(act, y)

    # binary
    def binary(self, op: Op | str, a: V | Scalar, b: V | Scalar) -> V:
        """Apply the broadcasting binary or compare op named `op` (e.g. `Op.MAX`, `"lt"`); a Python number
        becomes a constant of the other operand's dtype."""
        return self._bin(Op(op), a, b)

    def add(self, a: V | Scalar, b: V | Scalar) -> V: return self._bin(Op.ADD, a, b)
    def sub(self, a: V | Scalar, b: V | Scalar) -> V: return self._bin(Op.SUB, a, b)
    def mul(self, a: V | Scalar, b: V | Scalar) -> V: return self._bin(Op.MUL, a, b)
    def div(self, a: V | Scalar, b: V | Scalar) -> V: return self._bin(Op.DIV, a, b)
    def pow(self, a: V | Scalar, b: V | Scalar) -> V: return self._bin(Op.POW, a, b)
    def maximum(self, a: V | Scalar, b: V | Scalar) -> V: return self._bin(Op.MAX, a, b)
    def minimum(self, a: V | Scalar, b: V | Scalar) -> V: return self._bin(Op.MIN, a, b)

    # compare
    def eq(self, a: V | Scalar, b: V | Scalar) -> V: return self._bin(Op.EQ, a, b)
    def ne(self, a: V | Scalar, b: V | Scalar) -> V: return self._bin(Op.NE, a, b)
    def lt(self, a: V | Scalar, b: V | Scalar) -> V: return self._bin(Op.LT, a, b)
    def le(self, a: V | Scalar, b: V | Scalar) -> V: return self._bin(Op.LE, a, b)
    def gt(self, a: V | Scalar, b: V | Scalar) -> V: return self._bin(Op.GT, a, b)
    def ge(self, a: V | Scalar, b: V | Scalar) -> V: return self._bin(Op.GE, a, b)

    def where(self, cond: V, on_true: V | Scalar, on_false: V | Scalar) -> V:
        like = None if self.is_scalar(on_true) and self.is_scalar(on_false) else (
            on_false if self.is_scalar(on_true) else on_true)
        return self.emit(Op.WHERE, (cond, self._v(on_true, like), self._v(on_false, like)))

    def cast(self, x: V, dtype: DType | str) -> V:
        return self.emit(Op.CAST, (x,), dtype=DType(dtype).value)

    # unary
    def unary(self, op: Op | str, x: V) -> V:
        """Apply the unary op or activation named `op` (e.g. `"gelu"`)."""
        return self.emit(Op(op), (x,))

    def gelu(self, x: V) -> V:
        """Exact GELU, `0.5 x (1 + erf(x / sqrt 2))` (Hendrycks & Gimpel 2016)."""
        return self.emit(Op.GELU, (x,))

    def gelu_tanh(self, x: V) -> V:
        """Tanh-approximated GELU, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`."""
        return self.emit(Op.GELU_TANH, (x,))

    def silu(self, x: V) -> V: return self.emit(Op.SILU, (x,))
    def relu(self, x: V) -> V: return self.emit(Op.RELU, (x,))
    def relu2(self, x: V) -> V: return self.emit(Op.RELU2, (x,))  # squared ReLU, relu(x) * relu(x)
    def sigmoid(self, x: V) -> V: return self.emit(Op.SIGMOID, (x,))
    def tanh(self, x: V) -> V: return self.emit(Op.TANH, (x,))
    def exp(self, x: V) -> V: return self.emit(Op.EXP, (x,))
    def log(self, x: V) -> V: return self.emit(Op.LOG, (x,))
    def sqrt(self, x: V) -> V: return self.emit(Op.SQRT, (x,))
    def rsqrt(self, x: V) -> V: return self.emit(Op.RSQRT, (x,))
    def neg(self, x: V) -> V: return self.emit(Op.NEG, (x,))
    def erf(self, x: V) -> V: return self.emit(Op.ERF, (x,))
    def abs(self, x: V) -> V: return self.emit(Op.ABS, (x,))
    def isnan(self, x: V) -> V: return self.emit(Op.ISNAN, (x,))
    def sin(self, x: V) -> V: return self.emit(Op.SIN, (x,))
    def cos(self, x: V) -> V: return self.emit(Op.COS, (x,))
    def floor(self, x: V) -> V: return self.emit(Op.FLOOR, (x,))

    # reductions
    def reduce_sum(self, x: V, axes: Sequence[int], keepdims: bool = False) -> V:
        return self.emit(Op.REDUCE_SUM, (x,), axes=tuple(axes), keepdims=keepdims)

    def reduce_mean(self, x: V, axes: Sequence[int], keepdims: bool = False) -> V:
        return self.emit(Op.REDUCE_MEAN, (x,), axes=tuple(axes), keepdims=keepdims)

    def reduce_max(self, x: V, axes: Sequence[int], keepdims: bool = False) -> V:
        return self.emit(Op.REDUCE_MAX, (x,), axes=tuple(axes), keepdims=keepdims)

    def softmax(self, x: V, axis: int = -1) -> V:
        return self.emit(Op.SOFTMAX, (x,), axis=axis)

    def argmax(self, x: V, axis: int, keepdims: bool = False) -> V:
        """Index (i64) of the first largest value along `axis` (ONNX ArgMax with select_last_index=0)."""
        return self.emit(Op.ARGMAX, (x,), axis=axis, keepdims=keepdims)

    def cumsum(self, x: V, axis: int, exclusive: bool = False, reverse: bool = False) -> V:
        """Running sum along `axis` (ONNX CumSum): `exclusive` leaves out the element itself, `reverse` sums
        from the end. Same shape and dtype as `x` (ints stay ints: position ids from a mask)."""
        return self.emit(Op.CUMSUM, (x,), axis=axis, exclusive=exclusive, reverse=reverse)

    # normalisation
    def layer_norm(self, x: V, gamma: V, beta: V, eps: float = 1e-12) -> V:
        """LayerNorm over the last axis: `(x - mean) / sqrt(var + eps) * gamma + beta` (Ba et al. 2016)."""
        return self.emit(Op.LAYER_NORM, (x, gamma, beta), eps=float(eps), axis=-1)

    def rms_norm(self, x: V, gamma: V, beta: V | None = None, eps: float = 1e-6) -> V:
        """RMSNorm over the last axis: `x / sqrt(mean(x^2) + eps) * gamma [+ beta]` (Zhang & Sennrich 2019).
        Without `beta` the node has two operands (LLaMA's form)."""
        ins = (x, gamma) if beta is None else (x, gamma, beta)
        return self.emit(Op.RMS_NORM, ins, eps=float(eps), axis=-1)

    def residual_norm(self, x: V, residual: V, bias: V | None, gamma: V, beta: V | None, eps: float,
                      kind: str = "layer_norm") -> V:
        """`norm(x + residual [+ bias])` over the last axis, `kind` `layer_norm` or `rms_norm` (see those):
        two adds, then the norm. One method so a backend can run it as one pass (the MLX emitter's CPU kernels)."""
        s = self.add(x, residual)
        if bias is not None:
            s = self.add(s, bias)
        if kind == "layer_norm":
            return self.layer_norm(s, gamma, beta, eps)  # type: ignore[arg-type]
        return self.rms_norm(s, gamma, beta, eps)

    # data movement
    def reshape(self, x: V, shape: Sequence[int]) -> V:
        return self.emit(Op.RESHAPE, (x,), shape=tuple(shape))

    def transpose(self, x: V, perm: Sequence[int]) -> V:
        return self.emit(Op.TRANSPOSE, (x,), perm=tuple(perm))

    def pad(self, x: V, pads: Sequence[int], mode: str = "constant", value: float = 0.0) -> V:
        """ONNX Pad: `pads` = [begin_0, ..., begin_{r-1}, end_0, ..., end_{r-1}] (each >= 0) elements added on
        each axis; `mode` `constant` (fill `value`, in `x`'s dtype), `reflect` or `edge` (`ops.PAD_MODES`).
        Same dtype as `x`; axis i grows by begin_i + end_i (Swin's window padding)."""
        return self.emit(Op.PAD, (x,), pads=tuple(int(p) for p in pads), mode=mode, value=value)

    def narrow(self, x: V, axis: int, start: int, length: int) -> V:
        return self.emit(Op.NARROW, (x,), axis=axis, start=start, length=length)

    def concat(self, xs: Sequence[V], axis: int) -> V:
        return self.emit(Op.CONCAT, tuple(xs), axis=axis)

    def expand(self, x: V, shape: Sequence[int]) -> V:
        return self.emit(Op.EXPAND, (x,), shape=tuple(shape))

    def gather(self, table: V, indices: V) -> V:
        """Embedding lookup: `table[indices]`, `[V, H]` x `[B, S]` -> `[B, S, H]`."""
        return self.emit(Op.GATHER, (table, indices), axis=0)

    # transformer blocks
    def attention(self, q: V, k: V, v: V, mask: V | None = None, *, num_heads: int, head_dim: int,
                  mask_kind: str = "none", scale: float | None = None, num_kv_heads: int | None = None,
                  mask_fill: float | None = None) -> V:
        """Scaled dot-product attention on packed `[B, S, heads*head_dim]` q (Vaswani et al. 2017).

        k/v are `[B, Sk, kv_heads*head_dim]`; `num_kv_heads` (default `num_heads`) < `num_heads` is
        grouped-query attention (query head i reads kv head `i // (num_heads // num_kv_heads)`).
        `mask_kind`: `none`, `causal`, `keep` (`[B, Sk]`, 1 = attend) or `additive`
        (broadcastable to `[B, heads, Sq, Sk]`). `scale` defaults to `1/sqrt(head_dim)`.
        `mask_fill` (keep only): None = binary keep mask; a float f adds `(1 - mask) * f` to the
        scores (Hugging Face's extended mask, see `ops.MASK_KINDS`).
        """
        ins = (q, k, v) if mask is None else (q, k, v, mask)
        return self.emit(Op.ATTENTION, ins, num_heads=num_heads, head_dim=head_dim, mask=mask_kind,
                         scale=None if scale is None else float(scale), num_kv_heads=num_kv_heads,
                         mask_fill=None if mask_fill is None else float(mask_fill))

    def rope(self, x: V, cos: V, sin: V, head_dim: int, n_rot: int | None = None, interleaved: bool = False) -> V:
        """Rotary embedding on packed `[B, S, heads*head_dim]` (`runtime.formulas.rope`): NeoX halves, or
        `interleaved` neighbour pairs (GPT-J); `cos`/`sin` are `[max_pos, n_rot/2]` tables indexed by sequence
        position (Su et al. 2021)."""
        if interleaved:
            return self.emit(Op.ROPE, (x, cos, sin), head_dim=head_dim, n_rot=n_rot or head_dim, interleaved=True)
        return self.emit(Op.ROPE, (x, cos, sin), head_dim=head_dim, n_rot=n_rot or head_dim)

    # fused ops
    def fused_matmul_bias_act(self, x: V, w: V, bias: V, activation: str | None = None) -> V:
        return self.emit(Op.FUSED_MATMUL_BIAS_ACT, (x, w, bias), activation=activation)
