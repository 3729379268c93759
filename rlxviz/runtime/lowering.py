"""MLX lowering: primitives map to MLX kernels; fused ops run their decomposition from `ir.fused`.

`MlxEmitter` is the MLX twin of the reference's `NumpyEmitter`: an `Emitter` whose values are
lazy `mx.array`s. A primitive op is one entry of `LOWERINGS` (`fn(e, attrs, *arrays)`); a fused op
runs `ir.fused.expand` — the same decomposition the NumPy reference computes and the `unfuse`
pass emits — so no fused op's math is written here. Where MLX has a faster way to run a piece,
the emitter overrides it, each override listed in `OVERRIDES` with its own equivalence test
against the plain decomposition (`tests/test_runtime_lowering.py`):

* `Emitter.linear` (`x @ w + b`, used by every fused linear) -> one `mx.addmm` (BLAS beta=1 epilogue) in f32;
* FusedTransformerLayer -> its decomposition traced once into `mx.compile` (`compile_layers`);
* ElementwiseRegion -> its decomposition traced once into `mx.compile` (`regions="compiled"`);
* on the CPU in float32, where `rlxviz.kernels` built (`LoweringOptions.kernels`): `attention` as one
  `RlxvizAttention` kernel, `Emitter.linear` / `Emitter.linear_act` as one `RlxvizGemm` (the weight packed
  once by `RlxvizPackWeights`, the bias and activation applied in the GEMM's store; `LoweringOptions.gemm`),
  else `mx.matmul` + one `RlxvizBiasAct`, and `Emitter.residual_norm` as one `RlxvizResidualLayerNorm` /
  `RlxvizResidualRmsNorm` (rlxviz's own C++ primitives; the unfused versions' matmul / add / GELU / norm
  nodes keep MLX's kernels, so the gain of a fused linear includes a different GEMM than OpenBLAS's).

RLX's MLX-lowering bugs (docs/rlx.md §4.2–4.5) are fixed in the primitives: the keep mask `[B, Sk]`
becomes additive (binary: 0 / the dtype's lowest finite value; with `mask_fill`: HF's
`(1 - mask) * fill`) shaped `[B, 1, 1, Sk]`; `scale` is honoured;
causal masks are bottom-right aligned when `Sq != Sk`; `gelu_tanh` is the tanh approximation;
RmsNorm adds its beta.

`LoweringOptions` (`runtime.lowering_options`, re-exported here) is an immutable record held by one executor (one per
session): nothing here is process-wide mutable state. Fields left `None` take the device's choice from
`DEVICE_LOWERING`. Which pieces run on rlxviz's CPU kernels is `runtime.kernel_routing` (`KernelRouting`, one per
emitter), and the GEMM's packed weights are its `runtime.packing.PackedWeights`: this module only lowers.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..ir import DType, Emitter, Node, Op, format_node
from ..ir.emitter import normalize_attrs
from ..ir.fused import DECOMPOSITIONS, expand
from ..ir.identity import IdentityMap
from ..ir.infer import parse_step
from ..ir.ops import FUSED_REGION_OPS
from ..ir.registry import registrar
from ..kernels.mlx_backend import mx
from . import fast
from .formulas import merge_heads, rope, split_heads
from .kernel_routing import GEMM_AUTO_MAX_ROWS, KERNEL_ACTS, KernelRouting
from .lowering_options import DEVICE_LOWERING, Choice, LoweringOptions, lowering_table, options_for
from .packing import PackedWeights

T = TypeVar("T")

NEG = -3.4028234663852886e38  # finfo(float32).min, as the NumPy reference uses for masked scores

MX_DTYPES: dict[DType, Any] = {
    DType.f32: mx.float32, DType.f16: mx.float16, DType.bf16: mx.bfloat16, DType.f64: mx.float64,
    DType.i8: mx.int8, DType.u8: mx.uint8, DType.i32: mx.int32, DType.i64: mx.int64, DType.bool: mx.bool_,
}
_FROM_MX = {v: k for k, v in MX_DTYPES.items()}


class LoweringError(NotImplementedError):
    """An IR node has no MLX lowering (or its lowering failed); the message quotes the node's IR line."""


# -- the emitter ------------------------------------------------------------------------------------------
Lowering = Callable[..., mx.array]
LOWERINGS: dict[Op, Lowering] = {}
"""Primitive op -> `fn(e: MlxEmitter, attrs, *arrays) -> mx.array`. Fused ops are not here: they run
their decomposition (`ir.fused`), except for the `OVERRIDES`."""


lowers = registrar(LOWERINGS)
"""`@lowers(op, ...)`: register `fn(e, attrs, *arrays) -> mx.array` as the MLX lowering of primitive ops."""


@dataclass(frozen=True)
class Override:
    """A fused op run differently from its plain decomposition because MLX does it faster.

    Attributes:
        fn: `fn(e, attrs, operands) -> mx.array`.
        applies: `applies(options)`: whether the override is in force under these options.
        doc: what it does and why it computes the same numbers.
    """

    fn: Callable[[MlxEmitter, dict[str, Any], Sequence[mx.array]], mx.array]
    applies: Callable[[LoweringOptions], bool]
    doc: str


OVERRIDES: dict[Op, Override] = {}
"""Fused op -> `Override`. Each one has an equivalence test against `ir.fused.expand`."""


_STREAMS: list[Any] = []
_STREAMS_LOCK = threading.Lock()
_MIN_PARALLEL = 1 << 16


def cpu_streams(n: int) -> list[Any]:
    """`n` CPU streams from a process-wide pool (streams are MLX resources, created once, never options)."""
    with _STREAMS_LOCK:
        while len(_STREAMS) < n:
            _STREAMS.append(mx.new_stream(mx.cpu))
        return _STREAMS[:n]


class MlxEmitter(Emitter[mx.array]):
    """Emits MLX arrays under one fully resolved `LoweringOptions` record for one device.

    Args:
        options: resolved options (`LoweringOptions.for_device`); unresolved ones are resolved here.
        device: `cpu` or `gpu`.

    Compiled kernels and compiled fused ops are cached on the emitter (one per executor), keyed
    by function and attributes; options never change for an emitter.
    """

    def __init__(self, options: LoweringOptions | None = None, device: str = "cpu") -> None:
        self.device = device
        self.options = (options or LoweringOptions()).for_device(device)
        self._kernels: dict[tuple[Any, ...], Callable[..., mx.array]] = {}
        self._compiled: dict[tuple[Any, ...], Callable[..., mx.array]] = {}
        self.routing = KernelRouting.load(self.options.kernels, device, self.options.gemm)
        """Which pieces run on rlxviz's CPU kernels, the calls, what ran and the packed weights (`KernelRouting`)."""

    # the routing's state and the packed weights, under the names the executor, timing and tests use
    @property
    def cpu_kernels(self) -> Any:
        """rlxviz's CPU kernels module (`rlxviz.kernels`), None when off, unavailable or not on the CPU."""
        return self.routing.module

    @property
    def kernels_isa(self) -> str | None:
        """The vector ISA the kernels were built for (`avx512`, `avx2`, ...), None without them."""
        return self.routing.isa

    @kernels_isa.setter
    def kernels_isa(self, isa: str | None) -> None:
        self.routing.isa = isa

    @property
    def kernels_ran(self) -> set[str]:
        """The rlxviz kernels this emitter has emitted (`attention`, `bias+gelu`, ...), for timing headers."""
        return self.routing.ran

    @property
    def packing(self) -> PackedWeights:
        """The GEMM's weights packed once per weight array (`PackedWeights`)."""
        return self.routing.packed

    @property
    def _packed(self) -> IdentityMap[mx.array, mx.array]:
        return self.routing.packed.cache

    def packed_weights(self) -> list[mx.array]:
        """The packed weight arrays kept so far (`PackedWeights.arrays`)."""
        return self.routing.packed.arrays()

    def with_packing_evaluated(self, build: Callable[[], T]) -> tuple[T, bool]:
        """`build()`, then the packed weights it made evaluated (`PackedWeights.with_evaluated`)."""
        return self.routing.packed.with_evaluated(build)

    def drop_packed(self, weights: Sequence[mx.array]) -> None:
        """Forget the packed layouts of these weight arrays (`PackedWeights.drop`)."""
        self.routing.packed.drop(weights)

    def clear_packed(self) -> None:
        """Drop the packed weights (`MlxExecutor.clear`)."""
        self.routing.packed.clear()

    def gemm_wanted(self, x: mx.array) -> bool:
        """`KernelRouting.gemm_wanted`: `options.gemm` for `x [..., K]`."""
        return self.routing.gemm_wanted(x)

    def gemm_applies(self, x: mx.array, w: mx.array, b: mx.array | None, act: str | None) -> bool:
        """`KernelRouting.gemm_applies`: whether `linear` / `linear_act` run rlxviz's GEMM."""
        return self.routing.gemm_applies(x, w, b, act)

    def bias_act_kernel_applies(self, x: mx.array, w: mx.array, b: mx.array | None, act: str | None) -> bool:
        """`KernelRouting.bias_act_applies`: whether `linear_act` runs the `bias_act` kernel."""
        return self.routing.bias_act_applies(x, w, b, act)

    def residual_norm_kernel_applies(self, x: mx.array, residual: mx.array, bias: mx.array | None, gamma: mx.array,
                                     beta: mx.array | None) -> bool:
        """`KernelRouting.residual_norm_applies`: whether `residual_norm` runs the kernel."""
        return self.routing.residual_norm_applies(x, residual, bias, gamma, beta)

    # Emitter interface
    def emit(self, op: Op, inputs: Sequence[mx.array], **attrs: Any) -> mx.array:
        """Lower `op` on `inputs`: an override, else the primitive's kernel, else the decomposition.

        Raises:
            LoweringError: no lowering and no decomposition for `op`.
        """
        attrs = normalize_attrs(op, attrs)  # optional attrs left out take their defaults: what lint accepts lowers
        ov = OVERRIDES.get(op)
        if ov is not None and ov.applies(self.options):
            return ov.fn(self, attrs, inputs)
        fn = LOWERINGS.get(op)
        if fn is not None:
            return fn(self, attrs, *inputs)
        if op in DECOMPOSITIONS:
            return expand(self, op, attrs, inputs)
        raise LoweringError(f"no MLX lowering for op {op.value!r}")

    def const(self, value: Any, dtype: DType = DType.f32) -> mx.array:
        return mx.array(value, dtype=MX_DTYPES[DType(dtype)])

    def shape_of(self, v: mx.array) -> tuple[int, ...]:
        return tuple(v.shape)

    def dtype_of(self, v: mx.array) -> DType:
        return _FROM_MX[v.dtype]

    def is_scalar(self, x: object) -> bool:
        return not isinstance(x, mx.array) and super().is_scalar(x)

    # override: linear
    def linear(self, x: mx.array, w: mx.array, b: mx.array | None = None) -> mx.array:
        """Override of `Emitter.linear` (matmul, then add). Where `gemm_applies`: one `RlxvizGemm`, the bias
        added in the GEMM's store (float32 throughout, as the unfused graph). Else `x @ w + b` as one
        `mx.addmm`, the BLAS beta=1 epilogue, when there is a bias and the result is float32 (same numbers up
        to float32 rounding of the add). In f16/bf16 it stays matmul, then add: addmm adds the bias to the
        float32 accumulator and rounds once, the unfused graph rounds the matmul and then the sum, so they
        differ by one ulp in about a quarter of the elements (up to 3e-2 in bf16), which a fused linear must
        not do."""
        if self.gemm_applies(x, w, b, None):
            return self.routing.gemm(x, w, b, None)
        if b is None:
            return mx.matmul(x, w)
        if mx.result_type(x, w, b) != mx.float32:
            return mx.matmul(x, w) + b
        return mx.addmm(b, x, w)

    def linear_act(self, x: mx.array, w: mx.array, b: mx.array | None, act: str | None) -> mx.array:
        """Override of `Emitter.linear_act` (`act(x @ w + b)`): where `gemm_applies`, one `RlxvizGemm` (bias
        and activation in its store, the activation in `fast`'s formulas); else where
        `bias_act_kernel_applies`, `mx.matmul` then rlxviz's `bias_act` CPU kernel (bias add and activation
        in one pass); otherwise `linear`, then the activation's lowering."""
        if self.gemm_applies(x, w, b, act):
            return self.routing.gemm(x, w, b, act)
        if self.bias_act_kernel_applies(x, w, b, act):
            return self.routing.bias_act(x, w, b, act)  # type: ignore[arg-type]
        y = self.linear(x, w, b)
        return y if act is None else self.unary(act, y)

    def residual_norm(self, x: mx.array, residual: mx.array, bias: mx.array | None, gamma: mx.array,
                      beta: mx.array | None, eps: float, kind: str = "layer_norm") -> mx.array:
        """Override of `Emitter.residual_norm`: with rlxviz's CPU kernels, float32 operands, `x` and
        `residual` of one shape and `[N]` bias/gamma/beta, one `residual_norm` kernel (sum, statistics and
        scale in one pass over each row, float32 like `mx.fast.layer_norm`); otherwise the two adds and the norm."""
        if self.residual_norm_kernel_applies(x, residual, bias, gamma, beta):
            return self.routing.residual_norm(x, residual, bias, gamma, beta, eps, kind)
        return super().residual_norm(x, residual, bias, gamma, beta, eps, kind)

    # kernels
    def kernel(self, fn: Callable[..., mx.array], *static: Any) -> Callable[[mx.array], mx.array]:
        """`fn(x, *static)` as one `mx.compile`d kernel (when `compile_fused`), cached per function and
        static args. On the CPU, MLX runs each eager elementwise op as its own pass over memory;
        compiling a fast-math chain fuses it (fast softmax `[8,12,128,128]` 11.2 -> 7.4 ms)."""
        if not self.options.compile_fused:
            return (lambda x: fn(x, *static)) if static else fn
        key = (fn, static)
        k = self._kernels.get(key)
        if k is None:
            k = self._kernels[key] = mx.compile((lambda x: fn(x, *static)) if static else fn)
        return k

    def parallel_rows(self, fn: Callable[[mx.array], mx.array], x: mx.array) -> mx.array:
        """`fn(x)` on `cpu_streams` CPU streams, one slice of axis 0 each, then concatenated.

        MLX's CPU backend runs an elementwise kernel on a single thread, but separate streams run
        concurrently (2 cores: fast softmax `[8,12,128,128]` 13.9 -> 6.6-10 ms, fast GELU
        `[8,128,1536]` 21 -> 7 ms). Small tensors, a single row, or the GPU run `fn(x)`."""
        n = min(self.options.cpu_streams or 1, x.shape[0] if x.ndim else 1)
        if n < 2 or x.size < _MIN_PARALLEL or self.device != "cpu":
            return fn(x)
        cuts = [x.shape[0] * i // n for i in range(n + 1)]
        parts = []
        for stream, lo, hi in zip(cpu_streams(n), cuts, cuts[1:], strict=False):
            with mx.stream(stream):
                parts.append(fn(x[lo:hi]))
        return mx.concatenate(parts, axis=0)

    def compiled(self, key: tuple[Any, ...], make: Callable[[], Callable[..., mx.array]],
                 enabled: bool = True) -> Callable[..., mx.array]:
        """The function for `key` built once by `make()`, `mx.compile`d when `enabled` and `compile_fused`."""
        fn = self._compiled.get(key)
        if fn is None:
            plain = make()
            fn = self._compiled[key] = mx.compile(plain) if enabled and self.options.compile_fused else plain
        return fn

    def softmax(self, x: mx.array, axis: int = -1) -> mx.array:
        """Softmax: fast polynomial exp (one compiled kernel, rows split over CPU streams) or `mx.softmax`."""
        if not self.options.fast_math:
            return mx.softmax(x, axis=axis)
        k = self.kernel(fast.softmax, axis)
        return k(x) if axis % max(x.ndim, 1) == 0 else self.parallel_rows(k, x)


def lower_node(e: MlxEmitter, node: Node, args: list[mx.array]) -> mx.array:
    """Lower one IR node on its operand arrays.

    Raises:
        LoweringError: no lowering for the op; the message includes the node's IR line.
    """
    try:
        return e.emit(node.op, args, **node.attrs)
    except LoweringError as err:
        raise LoweringError(f"{err}:\n  {format_node(node)}") from None


# -- unary / activations ----------------------------------------------------------------------------------
def _plain_gelu(x: mx.array) -> mx.array:
    return 0.5 * x * (1.0 + mx.erf(x * (1.0 / math.sqrt(2.0))))


def _plain_gelu_tanh(x: mx.array) -> mx.array:
    return 0.5 * x * (1.0 + mx.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


UNARY_FAST: dict[Op, tuple[Callable[[mx.array], mx.array], Callable[[mx.array], mx.array]]] = {
    Op.GELU: (fast.gelu, _plain_gelu),
    Op.GELU_TANH: (fast.gelu_tanh, _plain_gelu_tanh),
    Op.SILU: (fast.silu, lambda x: x * mx.sigmoid(x)),
    Op.SIGMOID: (fast.sigmoid, mx.sigmoid),
    Op.TANH: (fast.tanh, mx.tanh),
    Op.EXP: (fast.exp, mx.exp),
    Op.ERF: (fast.erf, mx.erf),
}
"""Unary op -> (fast-math formulation, MLX's own kernel)."""


def _unary(fast_fn: Callable[[mx.array], mx.array], plain: Callable[[mx.array], mx.array]) -> Lowering:
    def lower(e: MlxEmitter, a: dict, x: mx.array) -> mx.array:
        return e.parallel_rows(e.kernel(fast_fn), x) if e.options.fast_math else plain(x)
    return lower


for _op, (_f, _p) in UNARY_FAST.items():
    lowers(_op)(_unary(_f, _p))

_SIMPLE: dict[Op, Callable[..., mx.array]] = {
    Op.MATMUL: mx.matmul, Op.ADD: mx.add, Op.SUB: mx.subtract, Op.MUL: mx.multiply, Op.DIV: mx.divide,
    Op.POW: mx.power, Op.MAX: mx.maximum, Op.MIN: mx.minimum,
    Op.EQ: mx.equal, Op.NE: mx.not_equal, Op.LT: mx.less, Op.LE: mx.less_equal, Op.GT: mx.greater,
    Op.GE: mx.greater_equal, Op.WHERE: mx.where,
    Op.RELU: lambda x: mx.maximum(x, 0.0), Op.RELU2: lambda x: mx.square(mx.maximum(x, 0.0)),
    Op.LOG: mx.log, Op.SQRT: mx.sqrt, Op.RSQRT: mx.rsqrt,
    Op.NEG: mx.negative, Op.ABS: mx.abs, Op.ISNAN: mx.isnan, Op.SIN: mx.sin, Op.COS: mx.cos, Op.FLOOR: mx.floor,
}
for _op, _fn in _SIMPLE.items():
    lowers(_op)((lambda fn: lambda e, a, *xs: fn(*xs))(_fn))


@lowers(Op.CAST)
def _cast(e: MlxEmitter, a: dict, x: mx.array) -> mx.array:
    return x.astype(MX_DTYPES[DType(a["dtype"])])


# -- reductions, softmax, norms -----------------------------------------------------------------------------
@lowers(Op.REDUCE_SUM)
def _sum(e: MlxEmitter, a: dict, x: mx.array) -> mx.array:
    return mx.sum(x, axis=list(a["axes"]), keepdims=a.get("keepdims", False))


@lowers(Op.REDUCE_MEAN)
def _mean(e: MlxEmitter, a: dict, x: mx.array) -> mx.array:
    return mx.mean(x, axis=list(a["axes"]), keepdims=a.get("keepdims", False))


@lowers(Op.REDUCE_MAX)
def _max(e: MlxEmitter, a: dict, x: mx.array) -> mx.array:
    return mx.max(x, axis=list(a["axes"]), keepdims=a.get("keepdims", False))


@lowers(Op.ONNX_OP)
def _onnx_op(e: MlxEmitter, a: dict, *xs: mx.array) -> mx.array:
    """On the host: the operands evaluated and copied to NumPy, the ONNX node run by onnx.reference, the result
    copied back (so a graph holding one is never compiled whole: `executor.build_program`)."""
    from ..ir.onnx_op import evaluate

    return mx.array(evaluate(a, xs))  # the MLX arrays themselves: the run's cache keys on their identity


@lowers(Op.ARGMAX)
def _argmax(e: MlxEmitter, a: dict, x: mx.array) -> mx.array:
    return mx.argmax(x, axis=a["axis"], keepdims=a.get("keepdims", False)).astype(mx.int64)


@lowers(Op.CUMSUM)
def _cumsum(e: MlxEmitter, a: dict, x: mx.array) -> mx.array:
    return mx.cumsum(x, axis=a["axis"], reverse=a.get("reverse", False), inclusive=not a.get("exclusive", False))


@lowers(Op.SOFTMAX)
def _softmax(e: MlxEmitter, a: dict, x: mx.array) -> mx.array:
    return e.softmax(x, a.get("axis", -1))


def _last(axis: int, x: mx.array) -> bool:
    return axis in (-1, x.ndim - 1)


@lowers(Op.LAYER_NORM)
def _layer_norm(e: MlxEmitter, a: dict, x: mx.array, g: mx.array, b: mx.array) -> mx.array:
    axis = a.get("axis", -1)
    if _last(axis, x):
        return mx.fast.layer_norm(x, g, b, a["eps"])
    mu = mx.mean(x, axis=axis, keepdims=True)
    var = mx.mean(mx.square(x - mu), axis=axis, keepdims=True)
    return (x - mu) * mx.rsqrt(var + a["eps"]) * g + b


@lowers(Op.RMS_NORM)
def _rms_norm(e: MlxEmitter, a: dict, x: mx.array, g: mx.array, b: mx.array | None = None) -> mx.array:
    axis = a.get("axis", -1)
    if _last(axis, x):
        y = mx.fast.rms_norm(x, g, a["eps"])
    else:
        y = x * mx.rsqrt(mx.mean(mx.square(x), axis=axis, keepdims=True) + a["eps"]) * g
    return y if b is None else y + b  # MLX's rms_norm has no beta: add it (RLX drops it)


# -- data movement ---------------------------------------------------------------------------------------------
lowers(Op.RESHAPE)(lambda e, a, x: mx.reshape(x, a["shape"]))
lowers(Op.TRANSPOSE)(lambda e, a, x: mx.transpose(x, a["perm"]))
lowers(Op.EXPAND)(lambda e, a, x: mx.broadcast_to(x, a["shape"]))
lowers(Op.CONCAT)(lambda e, a, *xs: mx.concatenate(xs, axis=a["axis"]))
lowers(Op.GATHER)(lambda e, a, table, idx: mx.take(table, idx, axis=a.get("axis", 0)))


@lowers(Op.NARROW)
def _narrow(e: MlxEmitter, a: dict, x: mx.array) -> mx.array:
    axis = a["axis"] % x.ndim
    idx = (slice(None),) * axis + (slice(a["start"], a["start"] + a["length"]),)
    return x[idx]


@lowers(Op.PAD)
def _pad(e: MlxEmitter, a: dict, x: mx.array) -> mx.array:
    """`mx.pad` for constant and edge; reflect as one gather per padded axis (indices b..1, 0..n-1, n-2..n-1-e)."""
    r, pads, mode = x.ndim, a["pads"], a.get("mode", "constant")
    width = [(pads[i], pads[r + i]) for i in range(r)]
    if mode != "reflect":
        return mx.pad(x, width, mode=mode, constant_values=mx.array(a.get("value", 0.0), dtype=x.dtype))
    for ax, (lo, hi) in enumerate(width):
        if lo or hi:
            n = x.shape[ax]
            idx = list(range(lo, 0, -1)) + list(range(n)) + list(range(n - 2, n - 2 - hi, -1))
            x = mx.take(x, mx.array(idx, dtype=mx.int32), axis=ax)
    return x


# -- attention, RoPE --------------------------------------------------------------------------------------------
def lowest(dtype: Any) -> float:
    """The lowest finite value of float dtype `dtype` (a masked score: finite, so an all-masked row is uniform)."""
    return float(mx.finfo(dtype).min) if mx.issubdtype(dtype, mx.floating) else NEG


def keep_to_additive(mask: mx.array, dtype: Any = mx.float32, fill: float | None = None) -> mx.array:
    """Keep mask `[B, Sk]` (1 = attend) -> additive `[B, 1, 1, Sk]`.

    `fill=None`: binary, 0 kept and the dtype's lowest finite value padded. A float `fill` (the
    attention's `mask_fill`): Hugging Face's `(1 - mask) * fill`, computed in the mask's dtype as the
    unfused graph does, so an all-zero row is a constant shift (see `ops.MASK_KINDS`)."""
    if fill is None:
        add = mx.where(mask > 0.5, mx.array(0.0, dtype), mx.array(lowest(dtype), dtype))
    else:
        add = (mx.array(1.0, mask.dtype) - mask) * mx.array(fill, mask.dtype)
    return add.reshape(mask.shape[0], 1, 1, mask.shape[-1])


def causal_additive(sq: int, sk: int, dtype: Any = mx.float32) -> mx.array:
    """Additive causal mask `[Sq, Sk]`, bottom-right aligned: key j visible from query i iff j <= i + Sk - Sq."""
    visible = mx.arange(sk)[None, :] <= mx.arange(sq)[:, None] + (sk - sq)
    return mx.where(visible, mx.array(0.0, dtype), mx.array(lowest(dtype), dtype))


def attention(e: MlxEmitter, q: mx.array, k: mx.array, v: mx.array, mask: mx.array | None, *, heads: int,
              head_dim: int, kind: str = "none", scale: float | None = None, kv_heads: int | None = None,
              fill: float | None = None) -> mx.array:
    """Multi-head attention on packed `[B, S, heads*head_dim]` q/k/v -> `[B, Sq, heads*head_dim]`.

    k/v have `kv_heads` heads (default `heads`); fewer is grouped-query attention (kv head `i // rep`
    serves query head i).

    `kind`: `none`, `causal`, `keep` (binary `[B, Sk]`) or `additive` (broadcastable to
    `[B, heads, Sq, Sk]`). `scale` defaults to `1/sqrt(head_dim)`. The kernel is
    `e.options.attention`: `sdpa` (`mx.fast.scaled_dot_product_attention`) or `composed`. `fill`: the
    keep mask's `mask_fill` (see `keep_to_additive`).
    """
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    kv = kv_heads or heads
    qh, kh, vh = split_heads(q, heads), split_heads(k, kv), split_heads(v, kv)
    sq, sk = qh.shape[2], kh.shape[2]
    bias: mx.array | None
    select: mx.array | None = None
    if kind == "keep" and fill is None and q.dtype != mx.float32:
        # where semantics in a narrow dtype: s + finfo(f16).min is the fill only for |s| < 16, so an additive keep
        # mask would change a fully masked row (uniform under where); a bool mask is exact in every dtype
        select, bias = (mask > 0.5).reshape(mask.shape[0], 1, 1, mask.shape[-1]), None
    elif kind == "keep":
        bias = keep_to_additive(mask, q.dtype, fill)
    elif kind == "causal":
        bias = causal_additive(sq, sk, q.dtype)
    elif kind == "additive":
        bias = mask.astype(q.dtype)
    else:
        bias = None
    if e.routing.attention_applies(q, k, v):
        return e.routing.attention(q, k, v, bias, heads, kv, head_dim, scale)
    if e.options.attention == "sdpa":  # GQA-aware; a bool mask: a fully masked row is uniform, as under where
        o = mx.fast.scaled_dot_product_attention(qh, kh, vh, scale=scale, mask=bias if select is None else select)
    else:
        if kv != heads:
            kh, vh = mx.repeat(kh, heads // kv, axis=1), mx.repeat(vh, heads // kv, axis=1)
        s = (qh * scale) @ kh.transpose(0, 1, 3, 2)
        if bias is not None:
            s = s + bias
        if select is not None:
            s = mx.where(select, s, mx.array(lowest(s.dtype), s.dtype))
        o = e.softmax(s, -1) @ vh
    return merge_heads(o)


@lowers(Op.ATTENTION)
def _attention(e: MlxEmitter, a: dict, q: mx.array, k: mx.array, v: mx.array, mask: mx.array | None = None
               ) -> mx.array:
    return attention(e, q, k, v, mask, heads=a["num_heads"], head_dim=a["head_dim"], kind=a.get("mask", "none"),
                     scale=a.get("scale"), kv_heads=a.get("num_kv_heads"), fill=a.get("mask_fill"))


@lowers(Op.ROPE)
def _rope(e: MlxEmitter, a: dict, x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """NeoX half-split or interleaved rotation (`formulas.rope`, shared with the NumPy reference: the op takes
    arbitrary cos/sin tables, which `mx.fast.rope` cannot, as it computes its angles from a base or freqs)."""
    return rope(x, cos, sin, a["head_dim"], a["n_rot"], lambda xs, axis: mx.concatenate(xs, axis=axis),
                a.get("interleaved", False))


# -- overrides of fused ops ----------------------------------------------------------------------------------------
def _freeze(v: Any) -> Any:
    return tuple(_freeze(x) for x in v) if isinstance(v, list | tuple) else v


def _attrs_key(op: Op, a: dict[str, Any]) -> tuple[Any, ...]:
    return (op, tuple(sorted((k, _freeze(v)) for k, v in a.items())))


def _compiled_decomposition(op: Op) -> Callable[[MlxEmitter, dict[str, Any], Sequence[mx.array]], mx.array]:
    """Run `op`'s decomposition (`ir.fused.expand`) as one `mx.compile`d function per attribute set."""
    def run(e: MlxEmitter, a: dict[str, Any], xs: Sequence[mx.array]) -> mx.array:
        def make() -> Callable[..., mx.array]:
            return lambda *args: expand(e, op, a, args)
        return e.compiled(_attrs_key(op, a), make)(*xs)
    return run


def _check_region(e: MlxEmitter, a: dict[str, Any], xs: Sequence[mx.array]) -> mx.array:
    for step in a["chain"]:
        op = parse_step(step)[0]
        if op not in FUSED_REGION_OPS or op not in LOWERINGS:
            raise LoweringError(f"ElementwiseRegion step {op.value!r} has no MLX lowering")
    return _compiled_decomposition(Op.ELEMENTWISE_REGION)(e, a, xs)


OVERRIDES[Op.FUSED_TRANSFORMER_LAYER] = Override(
    _compiled_decomposition(Op.FUSED_TRANSFORMER_LAYER),
    lambda o: bool(o.compile_layers and o.compile_fused),
    "the layer's decomposition traced once into one mx.compile'd function (same ops, one MLX graph)")
OVERRIDES[Op.ELEMENTWISE_REGION] = Override(
    _check_region, lambda o: o.regions == "compiled" and o.compile_fused,
    "the region's chain traced once into one mx.compile'd function (same ops, fused into one kernel)")

EMITTER_OVERRIDES: dict[str, str] = {"linear": MlxEmitter.linear.__doc__ or "",
                                     "linear_act": MlxEmitter.linear_act.__doc__ or "",
                                     "residual_norm": MlxEmitter.residual_norm.__doc__ or ""}
"""`Emitter` methods the MLX emitter replaces (used by the decompositions), with why."""

__all__ = ["DEVICE_LOWERING", "GEMM_AUTO_MAX_ROWS", "KERNEL_ACTS", "LOWERINGS", "OVERRIDES", "Choice", "LoweringError",
           "LoweringOptions", "MlxEmitter", "attention", "lower_node", "lowering_table", "options_for"]
