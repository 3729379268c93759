"""MLX lowering: one plain `mx` expression per IR op, fused ops included.

`LOWERINGS[op](attrs, *operands) -> mx.array` is the MLX twin of `reference.IMPLS`. Primitives
stay primitives; fused ops use MLX's fused kernels where they exist and where they pay on the
active device. RLX's MLX-lowering bugs (rlx-notes §4.2–4.5) are fixed here:

* the binary keep mask `[B, Sk]` is converted once to additive form (0 / `finfo(f32).min`) and
  shaped `[B, 1, 1, Sk]` — for `Attention`, `FusedAttentionBlock` and `FusedTransformerLayer` alike;
* `scale` is honoured; causal masks are bottom-right aligned when `Sq != Sk`
  (key j visible from query i iff `j <= i + Sk - Sq`), built explicitly rather than trusting
  the `"causal"` string's alignment;
* `gelu_tanh` is the tanh approximation (not the erf GELU); RmsNorm adds its beta;
  FusedSwiGLU honours `gate_first`.

`LoweringOptions` selects fast transcendentals (`rlxviz.runtime.fast`, default on) and the
attention kernel: `mx.fast.scaled_dot_product_attention` (`"sdpa"`) or matmul + fast softmax +
matmul (`"composed"`); `"auto"` takes `composed` on the CPU, where MLX 0.32's SDPA falls back to a
slower unfused path (measured 66–110 ms vs ~20 ms at B=8, S=128, 12 heads; see
`benchmarks/bench_runtime.py --micro`), and `sdpa` on the GPU.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..ir import DType, Node, Op, format_node
from ..ir.infer import parse_step
from ..ir.ops import FUSED_REGION_OPS
from ..ir.registry import registrar
from . import fast
from .mlx_backend import mx

Lowering = Callable[..., mx.array]
LOWERINGS: dict[Op, Lowering] = {}
NEG = -3.4028234663852886e38  # finfo(float32).min, as the NumPy reference uses for masked scores

MX_DTYPES: dict[DType, Any] = {
    DType.f32: mx.float32, DType.f16: mx.float16, DType.bf16: mx.bfloat16, DType.f64: mx.float64,
    DType.i32: mx.int32, DType.i64: mx.int64, DType.bool: mx.bool_,
}


class LoweringError(NotImplementedError):
    """An IR node has no MLX lowering (or its lowering failed); the message quotes the node's IR line."""


@dataclass(frozen=True)
class LoweringOptions:
    """How ops are lowered. Hashable: part of every compile-cache key.

    Attributes:
        fast_math: use `rlxviz.runtime.fast` (rational erf/tanh, polynomial exp) instead of
            `mx.erf`/`mx.exp`/`mx.tanh`/`mx.softmax` (errors <= ~1e-6, see `fast`).
        attention: `"sdpa"` (`mx.fast.scaled_dot_product_attention`), `"composed"`
            (matmul + softmax + matmul) or `"auto"` (composed on CPU, sdpa on GPU).
        compile_fused: wrap ElementwiseRegion and each fast-math kernel (GELU, softmax, ...) in
            `mx.compile`.
        compile_layers: wrap each FusedTransformerLayer in one `mx.compile`d function. `None`
            (default): on the GPU only. Measured on the CPU (all-MiniLM-L6-v2, batch 8, seq 128):
            the compiled layer is slower than the same ops uncompiled (272 vs 230 ms), because a
            compiled CPU graph runs its elementwise work serially on one thread.
        cpu_streams: on the CPU, run each fast-math kernel on this many CPU streams, split along
            axis 0 (MLX runs one elementwise kernel on one thread; separate streams run
            concurrently). 1 turns it off. Default: the number of cores.
    """

    fast_math: bool = True
    attention: str = "auto"
    compile_fused: bool = True
    cpu_streams: int = field(default_factory=lambda: os.cpu_count() or 1)
    compile_layers: bool | None = None

    def layers_compiled(self) -> bool:
        if self.compile_layers is not None:
            return self.compile_layers and self.compile_fused
        return self.compile_fused and mx.default_device() == mx.gpu

    def attention_impl(self) -> str:
        if self.attention != "auto":
            return self.attention
        return "sdpa" if mx.default_device() == mx.gpu else "composed"


_OPTS = LoweringOptions()


def current_options() -> LoweringOptions:
    """The options in force for lowering (set with `using`)."""
    return _OPTS


@contextmanager
def using(options: LoweringOptions) -> Iterator[LoweringOptions]:
    """Lower with `options` inside the block (not thread-safe; the executor holds it while tracing)."""
    global _OPTS
    prev, _OPTS = _OPTS, options
    try:
        yield options
    finally:
        _OPTS = prev


lowers = registrar(LOWERINGS)
"""`@lowers(op, ...)`: register `fn(attrs, *arrays) -> mx.array` as the MLX lowering."""


def lower_node(node: Node, args: list[mx.array]) -> mx.array:
    """Apply the lowering of `node.op` to its operand arrays.

    Raises:
        LoweringError: no lowering is registered for the op; the message includes the IR line.
    """
    fn = LOWERINGS.get(node.op)
    if fn is None:
        raise LoweringError(f"no MLX lowering for op {node.op.value!r}:\n  {format_node(node)}")
    return fn(node.attrs, *args)


# -- unary / activations ----------------------------------------------------------------------
_KERNELS: dict[tuple[Any, ...], Callable[..., mx.array]] = {}


def kernel(fn: Callable[..., mx.array], *static: Any) -> Callable[[mx.array], mx.array]:
    """`fn(x, *static)` as one `mx.compile`d kernel (when `compile_fused`), cached per function and
    static args.

    On the CPU, MLX runs each eager elementwise op as its own pass over memory; compiling a
    fast-math chain fuses it (measured: fast softmax over `[8,12,128,128]` 11.2 -> 7.4 ms,
    fast exp over `[1024,1536]` 8.5 -> 4.8 ms)."""
    k: Callable[[mx.array], mx.array]
    if not _OPTS.compile_fused:
        k = (lambda x: fn(x, *static)) if static else fn
    else:
        key = (fn, static)
        k = _KERNELS.get(key)  # type: ignore[assignment]
        if k is None:
            k = _KERNELS[key] = mx.compile((lambda x: fn(x, *static)) if static else fn)
    return k


_STREAMS: list[Any] = []
_MIN_PARALLEL = 1 << 16


def parallel_rows(fn: Callable[[mx.array], mx.array], x: mx.array) -> mx.array:
    """`fn(x)` computed on `cpu_streams` CPU streams, one slice of axis 0 each, then concatenated.

    MLX's CPU backend runs an elementwise kernel on a single thread, but separate streams run
    concurrently (measured on 2 cores: fast softmax over `[8,12,128,128]` 13.9 -> 6.6-10 ms, fast
    GELU over `[8,128,1536]` 21 -> 7 ms). Small tensors, a single row, or a GPU device run `fn(x)`."""
    n = min(_OPTS.cpu_streams, x.shape[0] if x.ndim else 1)
    if n < 2 or x.size < _MIN_PARALLEL or mx.default_device() != mx.cpu:
        return fn(x)
    while len(_STREAMS) < n:
        _STREAMS.append(mx.new_stream(mx.cpu))
    cuts = [x.shape[0] * i // n for i in range(n + 1)]
    parts = []
    for stream, lo, hi in zip(_STREAMS, cuts, cuts[1:], strict=False):
        with mx.stream(stream):
            parts.append(fn(x[lo:hi]))
    return mx.concatenate(parts, axis=0)


def _pick(fast_fn: Callable[[mx.array], mx.array], plain: Callable[[mx.array], mx.array]) -> Lowering:
    return lambda a, x: parallel_rows(kernel(fast_fn), x) if _OPTS.fast_math else plain(x)


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
for _op, (_f, _p) in UNARY_FAST.items():
    LOWERINGS[_op] = _pick(_f, _p)


def activation(name: str | None, x: mx.array) -> mx.array:
    """Apply the activation (or unary op) named `name` under the current options; None = identity."""
    return x if name is None else LOWERINGS[Op(name)]({}, x)


_SIMPLE: dict[Op, Callable[..., mx.array]] = {
    Op.MATMUL: mx.matmul, Op.ADD: mx.add, Op.SUB: mx.subtract, Op.MUL: mx.multiply, Op.DIV: mx.divide,
    Op.POW: mx.power, Op.MAX: mx.maximum, Op.MIN: mx.minimum,
    Op.EQ: mx.equal, Op.NE: mx.not_equal, Op.LT: mx.less, Op.LE: mx.less_equal, Op.GT: mx.greater,
    Op.GE: mx.greater_equal, Op.WHERE: mx.where,
    Op.RELU: lambda x: mx.maximum(x, 0.0), Op.LOG: mx.log, Op.SQRT: mx.sqrt, Op.RSQRT: mx.rsqrt,
    Op.NEG: mx.negative, Op.ABS: mx.abs, Op.ISNAN: mx.isnan,
}
for _op, _fn in _SIMPLE.items():
    LOWERINGS[_op] = (lambda fn: lambda a, *xs: fn(*xs))(_fn)


@lowers(Op.CAST)
def _cast(a: dict, x: mx.array) -> mx.array:
    return x.astype(MX_DTYPES[DType(a["dtype"])])


# -- reductions, softmax, norms ------------------------------------------------------------------
@lowers(Op.REDUCE_SUM)
def _sum(a: dict, x: mx.array) -> mx.array:
    return mx.sum(x, axis=list(a["axes"]), keepdims=a["keepdims"])


@lowers(Op.REDUCE_MEAN)
def _mean(a: dict, x: mx.array) -> mx.array:
    return mx.mean(x, axis=list(a["axes"]), keepdims=a["keepdims"])


@lowers(Op.REDUCE_MAX)
def _max(a: dict, x: mx.array) -> mx.array:
    return mx.max(x, axis=list(a["axes"]), keepdims=a["keepdims"])


def softmax(x: mx.array, axis: int = -1) -> mx.array:
    """Softmax under the current options (fast polynomial exp or `mx.softmax`)."""
    if not _OPTS.fast_math:
        return mx.softmax(x, axis=axis)
    k = kernel(fast.softmax, axis)
    return k(x) if axis % max(x.ndim, 1) == 0 else parallel_rows(k, x)


@lowers(Op.SOFTMAX)
def _softmax(a: dict, x: mx.array) -> mx.array:
    return softmax(x, a.get("axis", -1))


def _last(axis: int, x: mx.array) -> bool:
    return axis in (-1, x.ndim - 1)


@lowers(Op.LAYER_NORM)
def _layer_norm(a: dict, x: mx.array, g: mx.array, b: mx.array) -> mx.array:
    if _last(a.get("axis", -1), x):
        return mx.fast.layer_norm(x, g, b, a["eps"])
    mu = mx.mean(x, axis=a["axis"], keepdims=True)
    var = mx.mean(mx.square(x - mu), axis=a["axis"], keepdims=True)
    return (x - mu) * mx.rsqrt(var + a["eps"]) * g + b


@lowers(Op.RMS_NORM)
def _rms_norm(a: dict, x: mx.array, g: mx.array, b: mx.array | None = None) -> mx.array:
    if _last(a.get("axis", -1), x):
        y = mx.fast.rms_norm(x, g, a["eps"])
    else:
        y = x * mx.rsqrt(mx.mean(mx.square(x), axis=a["axis"], keepdims=True) + a["eps"]) * g
    return y if b is None else y + b  # MLX's rms_norm has no beta: add it (RLX drops it)


# -- data movement ---------------------------------------------------------------------------------
LOWERINGS[Op.RESHAPE] = lambda a, x: mx.reshape(x, a["shape"])
LOWERINGS[Op.TRANSPOSE] = lambda a, x: mx.transpose(x, a["perm"])
LOWERINGS[Op.EXPAND] = lambda a, x: mx.broadcast_to(x, a["shape"])
LOWERINGS[Op.CONCAT] = lambda a, *xs: mx.concatenate(xs, axis=a["axis"])
LOWERINGS[Op.GATHER] = lambda a, table, idx: mx.take(table, idx, axis=a.get("axis", 0))


@lowers(Op.NARROW)
def _narrow(a: dict, x: mx.array) -> mx.array:
    axis = a["axis"] % x.ndim
    idx = (slice(None),) * axis + (slice(a["start"], a["start"] + a["length"]),)
    return x[idx]


# -- attention ---------------------------------------------------------------------------------------
def _heads(x: mx.array, h: int) -> mx.array:
    b, s, _ = x.shape
    return x.reshape(b, s, h, -1).transpose(0, 2, 1, 3)


def keep_to_additive(mask: mx.array, dtype: Any = mx.float32) -> mx.array:
    """Binary keep mask `[B, Sk]` (1 = attend) -> additive `[B, 1, 1, Sk]`: 0 kept, `finfo(f32).min` padded."""
    add = mx.where(mask > 0.5, mx.array(0.0, dtype), mx.array(NEG, dtype))
    return add.reshape(mask.shape[0], 1, 1, mask.shape[-1])


def causal_additive(sq: int, sk: int, dtype: Any = mx.float32) -> mx.array:
    """Additive causal mask `[Sq, Sk]`, bottom-right aligned: key j visible from query i iff j <= i + Sk - Sq."""
    visible = mx.arange(sk)[None, :] <= mx.arange(sq)[:, None] + (sk - sq)
    return mx.where(visible, mx.array(0.0, dtype), mx.array(NEG, dtype))


def attention(q: mx.array, k: mx.array, v: mx.array, mask: mx.array | None, *, heads: int, head_dim: int,
              kind: str = "none", scale: float | None = None, kv_heads: int | None = None) -> mx.array:
    """Multi-head attention on packed `[B, S, heads*head_dim]` q/k/v -> `[B, Sq, heads*head_dim]`.

    k/v have `kv_heads` heads (default `heads`); fewer is grouped-query attention (kv head `i // rep`
    serves query head i).

    `kind`: `none`, `causal`, `keep` (binary `[B, Sk]`) or `additive` (broadcastable to
    `[B, heads, Sq, Sk]`). `scale` defaults to `1/sqrt(head_dim)`.
    """
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    kv = kv_heads or heads
    qh, kh, vh = _heads(q, heads), _heads(k, kv), _heads(v, kv)
    sq, sk = qh.shape[2], kh.shape[2]
    bias: mx.array | None
    if kind == "keep":
        bias = keep_to_additive(mask, q.dtype)
    elif kind == "causal":
        bias = causal_additive(sq, sk, q.dtype)
    elif kind == "additive":
        bias = mask.astype(q.dtype)
    else:
        bias = None
    if _OPTS.attention_impl() == "sdpa":
        o = mx.fast.scaled_dot_product_attention(qh, kh, vh, scale=scale, mask=bias)  # GQA-aware
    else:
        if kv != heads:
            kh, vh = mx.repeat(kh, heads // kv, axis=1), mx.repeat(vh, heads // kv, axis=1)
        s = (qh * scale) @ kh.transpose(0, 1, 3, 2)
        if bias is not None:
            s = s + bias
        o = softmax(s, -1) @ vh
    b = o.shape[0]
    return o.transpose(0, 2, 1, 3).reshape(b, sq, heads * head_dim)


@lowers(Op.ATTENTION)
def _attention(a: dict, q: mx.array, k: mx.array, v: mx.array, mask: mx.array | None = None) -> mx.array:
    return attention(q, k, v, mask, heads=a["num_heads"], head_dim=a["head_dim"], kind=a.get("mask", "none"),
                     scale=a.get("scale"), kv_heads=a.get("num_kv_heads"))


@lowers(Op.ROPE)
def _rope(a: dict, x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """NeoX half-split rotation of packed `[B, S, heads*head_dim]`; tables `[max_pos, >= n_rot/2]`."""
    d, n_rot = a["head_dim"], a["n_rot"]
    b, s, hd = x.shape
    xh = x.reshape(b, s, hd // d, d)
    half = n_rot // 2
    c, sn = cos[:s, :half][None, :, None, :], sin[:s, :half][None, :, None, :]
    x1, x2 = xh[..., :half], xh[..., half:n_rot]
    parts = [x1 * c - x2 * sn, x2 * c + x1 * sn]
    if n_rot < d:
        parts.append(xh[..., n_rot:])
    return mx.concatenate(parts, axis=-1).reshape(b, s, hd)


# -- fused ops ---------------------------------------------------------------------------------------
def linear(x: mx.array, w: mx.array, b: mx.array | None = None) -> mx.array:
    """`x @ w + b` as one `mx.addmm` (BLAS beta=1 epilogue) when there is a bias."""
    return mx.matmul(x, w) if b is None else mx.addmm(b, x, w)


@lowers(Op.FUSED_MATMUL_BIAS_ACT)
def _fmba(a: dict, x: mx.array, w: mx.array, bias: mx.array) -> mx.array:
    return activation(a.get("activation"), linear(x, w, bias))


def _residual(a: dict, xs: tuple[mx.array, ...]) -> tuple[mx.array, mx.array, mx.array]:
    s = xs[0] + xs[1]
    if a.get("has_bias", False):
        return s + xs[2], xs[3], xs[4]
    return s, xs[2], xs[3]


@lowers(Op.FUSED_RESIDUAL_LN)
def _frln(a: dict, *xs: mx.array) -> mx.array:
    s, g, b = _residual(a, xs)
    return mx.fast.layer_norm(s, g, b, a["eps"])


@lowers(Op.FUSED_RESIDUAL_RMS_NORM)
def _frrms(a: dict, *xs: mx.array) -> mx.array:
    s, g, b = _residual(a, xs)
    return mx.fast.rms_norm(s, g, a["eps"]) + b


@lowers(Op.FUSED_SWIGLU)
def _swiglu(a: dict, x: mx.array) -> mx.array:
    n = x.shape[-1] // 2
    lo, hi = x[..., :n], x[..., n:]
    up, gate = (hi, lo) if a.get("gate_first", False) else (lo, hi)
    return activation("silu", gate) * up


def attention_block(heads: int, head_dim: int, hidden: mx.array, qkv_w: mx.array, out_w: mx.array,
                    mask: mx.array, qkv_b: mx.array | None = None, out_b: mx.array | None = None,
                    rope: tuple[mx.array, mx.array] | None = None, kv_heads: int | None = None) -> mx.array:
    """QKV projection, split Q|K|V (widths heads*head_dim, kv_heads*head_dim twice), [RoPE on q, k],
    keep-masked attention, output projection."""
    qkv = linear(hidden, qkv_w, qkv_b)
    w, kw = heads * head_dim, (kv_heads or heads) * head_dim
    q, k, v = qkv[..., :w], qkv[..., w:w + kw], qkv[..., w + kw:w + 2 * kw]
    if rope is not None:
        ra = {"head_dim": head_dim, "n_rot": head_dim}
        q, k = _rope(ra, q, *rope), _rope(ra, k, *rope)
    att = attention(q, k, v, mask, heads=heads, head_dim=head_dim, kind="keep", kv_heads=kv_heads)
    return linear(att, out_w, out_b)


@lowers(Op.FUSED_ATTENTION_BLOCK)
def _fab(a: dict, *x: mx.array) -> mx.array:
    k = 4
    qkv_b = out_b = None
    if a.get("has_bias", True):
        qkv_b, out_b, k = x[4], x[5], 6
    rope = (x[k], x[k + 1]) if a.get("has_rope", False) else None
    return attention_block(a["num_heads"], a["head_dim"], x[0], x[1], x[2], x[3], qkv_b, out_b, rope,
                           a.get("num_kv_heads"))


_COMPILED: dict[tuple[Any, ...], Callable[..., mx.array]] = {}


def _freeze(v: Any) -> Any:
    return tuple(_freeze(x) for x in v) if isinstance(v, list | tuple) else v


def compiled(key: tuple[Any, ...], make: Callable[[], Callable[..., mx.array]],
             enabled: bool | None = None) -> Callable[..., mx.array]:
    """The `mx.compile`d function for `key` (op, attributes, options), built once by `make()`.

    With `enabled` False (default: `compile_fused`) the plain function is returned (still cached)."""
    full = (*key, _OPTS)
    fn = _COMPILED.get(full)
    if fn is None:
        opts = _OPTS
        plain = make()

        def traced(*xs: mx.array) -> mx.array:
            with using(opts):  # the trace must see the options of the call that created it
                return plain(*xs)

        on = opts.compile_fused if enabled is None else enabled
        fn = _COMPILED[full] = mx.compile(traced) if on else traced
    return fn


def clear_compiled() -> None:
    """Drop every cached compiled fused-op function and fast-math kernel."""
    _COMPILED.clear()
    _KERNELS.clear()


def _ftl_fn(a: dict) -> Callable[..., mx.array]:
    heads, head_dim, act = a["num_heads"], a["head_dim"], a["activation"]
    eps1, eps2 = a["eps1"], a["eps2"]

    def layer(hidden: mx.array, qkv_w: mx.array, qkv_b: mx.array, out_w: mx.array, out_b: mx.array,
              ln1_g: mx.array, ln1_b: mx.array, fc1_w: mx.array, fc1_b: mx.array, fc2_w: mx.array,
              fc2_b: mx.array, ln2_g: mx.array, ln2_b: mx.array, mask: mx.array) -> mx.array:
        att = attention_block(heads, head_dim, hidden, qkv_w, out_w, mask, qkv_b, out_b)
        h1 = mx.fast.layer_norm(att + hidden, ln1_g, ln1_b, eps1)
        mid = activation(act, linear(h1, fc1_w, fc1_b))
        return mx.fast.layer_norm(linear(mid, fc2_w, fc2_b) + h1, ln2_g, ln2_b, eps2)

    return layer


@lowers(Op.FUSED_TRANSFORMER_LAYER)
def _ftl(a: dict, *x: mx.array) -> mx.array:
    """Post-norm BERT layer (14-input layout) as one MLX function per attribute set, `mx.compile`d
    where that pays (`LoweringOptions.compile_layers`: on the GPU by default)."""
    key = (Op.FUSED_TRANSFORMER_LAYER, tuple(sorted((k, _freeze(v)) for k, v in a.items())))
    return compiled(key, lambda: _ftl_fn(a), _OPTS.layers_compiled())(*x)


def _region_fn(chain: tuple[Any, ...]) -> Callable[..., mx.array]:
    steps = [parse_step(s) for s in chain]
    for op, _, _ in steps:
        if op not in FUSED_REGION_OPS or op not in LOWERINGS:
            raise LoweringError(f"ElementwiseRegion step {op.value!r} has no MLX lowering")

    def region(*xs: mx.array) -> mx.array:
        vals: list[mx.array] = []
        for op, step_attrs, refs in steps:
            args = [xs[int(r[1:])] if r[0] == "i" else vals[int(r[1:])] for r in refs]
            vals.append(LOWERINGS[op](step_attrs, *args))
        return vals[-1]

    return region


@lowers(Op.ELEMENTWISE_REGION)
def _region(a: dict, *x: mx.array) -> mx.array:
    """Replay the chain (step k reads inputs `iK` and earlier steps `sK`) as one compiled function."""
    chain = _freeze(a["chain"])
    return compiled((Op.ELEMENTWISE_REGION, chain), lambda: _region_fn(chain))(*x)
