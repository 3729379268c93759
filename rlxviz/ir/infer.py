"""Shape and dtype inference: one rule per op, fused ops included.

RLX's `infer_shape.rs` returns "unknown" for FusedSwiGLU, FusedAttentionBlock,
FusedTransformerLayer and ElementwiseRegion (docs/rlx.md §7.12); here every op has a rule, so the
verifier checks every node after every pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .dtype import DType, promote
from .ops import (
    ACTIVATIONS,
    BINARY,
    BLOCK_MASK_KINDS,
    COMPARE,
    FUSED_REGION_OPS,
    PREDICATES,
    REDUCE,
    SPECS,
    UNARY,
    Op,
    kv_heads,
    pack,
    unpack,
)
from .registry import registrar

Shape = tuple[int, ...]


class TensorType(NamedTuple):
    """Static shape and element type of one tensor."""

    shape: Shape
    dtype: DType

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


class ShapeError(ValueError):
    """An op's operands or attributes are inconsistent; the message says which and why."""


Rule = Callable[[dict[str, Any], Sequence[TensorType]], TensorType]
RULES: dict[Op, Rule] = {}


rule = registrar(RULES)
"""`@rule(op, ...)`: register an inference rule `fn(attrs, operand_types) -> TensorType`."""


def infer(op: Op, attrs: dict[str, Any], operands: Sequence[TensorType]) -> TensorType:
    """Infer the output type of `op` applied to `operands`.

    Raises:
        ShapeError: operand shapes/dtypes or attributes do not fit the op; the message names the op.
    """
    if op not in RULES:
        raise ShapeError(f"[{op.value}] has no inference rule (leaves carry their own type)")
    try:
        return RULES[op](attrs, operands)
    except ShapeError as e:
        raise ShapeError(f"[{op.value}] {e}") from None
    except KeyError as e:
        raise ShapeError(f"[{op.value}] missing attribute {e}") from None
    except (TypeError, ValueError, IndexError, ZeroDivisionError) as e:
        # malformed attributes (e.g. a string inside `shape`) or a wrong operand count
        raise ShapeError(f"[{op.value}] bad operands or attributes ({type(e).__name__}: {e})") from None


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ShapeError(msg)


def _fmt(t: TensorType) -> str:
    return str(t)


def broadcast(a: Shape, b: Shape) -> Shape:
    """NumPy broadcasting of two shapes. Raises ShapeError when they are incompatible."""
    if a == b:
        return a
    out = []
    for i in range(max(len(a), len(b))):
        x = a[len(a) - 1 - i] if i < len(a) else 1
        y = b[len(b) - 1 - i] if i < len(b) else 1
        if not (x == y or x == 1 or y == 1):
            raise ShapeError(f"shapes {list(a)} and {list(b)} do not broadcast")
        out.append(max(x, y) if min(x, y) != 0 else 0)
    return tuple(reversed(out))


def norm_axis(axis: int, rank: int) -> int:
    """Turn a possibly negative axis into 0..rank-1. Raises ShapeError when out of range."""
    _check(-rank <= axis < rank, f"axis {axis} out of range for rank {rank}")
    return axis % rank


@rule(*BINARY)
def _binary(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    return TensorType(broadcast(x[0].shape, x[1].shape), promote(x[0].dtype, x[1].dtype))


@rule(*COMPARE)
def _compare(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    return TensorType(broadcast(x[0].shape, x[1].shape), DType.bool)


@rule(*UNARY)
def _unary(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    _check(x[0].dtype.is_float, f"needs a float operand, got {_fmt(x[0])}")
    return x[0]


@rule(*PREDICATES)
def _predicate(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    _check(x[0].dtype.is_float, f"needs a float operand, got {_fmt(x[0])}")
    return TensorType(x[0].shape, DType.bool)


@rule(Op.ONNX_OP)
def _onnx_op(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    """The type ONNX shape inference gave the node at import (held in its attributes)."""
    try:
        return TensorType(tuple(attrs["shape"]), DType(attrs["dtype"]))
    except ValueError:
        raise ShapeError(f"unknown dtype {attrs['dtype']!r}") from None


@rule(Op.ARGMAX)
def _argmax(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    """The index of the first largest value along `axis`, as i64 (ONNX ArgMax, select_last_index=0)."""
    _check(len(x[0].shape) >= 1, f"needs rank >= 1, got {_fmt(x[0])}")
    ax = norm_axis(attrs["axis"], len(x[0].shape))
    shape = list(x[0].shape)
    if attrs.get("keepdims", False):
        shape[ax] = 1
    else:
        del shape[ax]
    return TensorType(tuple(shape), DType.i64)


@rule(Op.CUMSUM)
def _cumsum(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    """Running sum along `axis` (ONNX CumSum): same shape and dtype; not for bool."""
    _check(len(x[0].shape) >= 1, f"needs rank >= 1, got {_fmt(x[0])}")
    _check(x[0].dtype != DType.bool, f"needs a numeric operand, got {_fmt(x[0])}")
    norm_axis(attrs["axis"], len(x[0].shape))
    return x[0]


@rule(Op.PAD)
def _pad(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    """ONNX Pad: `pads` = [begin_0, ..., begin_{r-1}, end_0, ..., end_{r-1}], each >= 0; axis i grows by
    begin_i + end_i. `reflect` needs every pad < that axis's size, `edge` a non-empty axis where it pads."""
    shape, r, pads = x[0].shape, len(x[0].shape), tuple(attrs["pads"])
    _check(r >= 1, f"needs rank >= 1, got {_fmt(x[0])}")
    _check(len(pads) == 2 * r, f"pads needs {2 * r} values (begins, then ends) for {_fmt(x[0])}, got {len(pads)}")
    _check(all(p >= 0 for p in pads), f"pads must be >= 0 (a crop is a narrow), got {list(pads)}")
    mode = attrs.get("mode", "constant")
    for i, n in enumerate(shape):
        if mode == "reflect":
            _check(max(pads[i], pads[r + i]) < n, f"reflect pads axis {i} by {max(pads[i], pads[r + i])}, "
                                                  f"needs < its size {n}")
        elif mode == "edge":
            _check(n > 0 or pads[i] == pads[r + i] == 0, f"edge pads the empty axis {i}")
    return TensorType(tuple(n + pads[i] + pads[r + i] for i, n in enumerate(shape)), x[0].dtype)


@rule(Op.WHERE)
def _where(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    _check(x[0].dtype == DType.bool, f"condition must be bool, got {_fmt(x[0])}")
    shape = broadcast(broadcast(x[0].shape, x[1].shape), x[2].shape)
    return TensorType(shape, promote(x[1].dtype, x[2].dtype))


@rule(Op.CAST)
def _cast(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    try:
        return TensorType(x[0].shape, DType(attrs["dtype"]))
    except ValueError:
        raise ShapeError(f"unknown dtype {attrs['dtype']!r}") from None


@rule(Op.MATMUL)
def _matmul(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    a, b = x
    _check(len(a.shape) >= 2 and len(b.shape) >= 2, f"operands need rank >= 2, got {_fmt(a)} and {_fmt(b)}")
    _check(a.shape[-1] == b.shape[-2],
           f"contraction mismatch: {_fmt(a)} @ {_fmt(b)} ({a.shape[-1]} != {b.shape[-2]})")
    batch = broadcast(a.shape[:-2], b.shape[:-2])
    return TensorType((*batch, a.shape[-2], b.shape[-1]), promote(a.dtype, b.dtype))


@rule(*REDUCE)
def _reduce(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    rank = len(x[0].shape)
    axes = {norm_axis(a, rank) for a in attrs["axes"]}
    _check(len(axes) == len(attrs["axes"]), f"repeated axis in {list(attrs['axes'])}")
    keep = attrs.get("keepdims", False)
    shape = tuple(1 if i in axes else d for i, d in enumerate(x[0].shape) if keep or i not in axes)
    return TensorType(shape, x[0].dtype)


@rule(Op.SOFTMAX)
def _softmax(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    norm_axis(attrs.get("axis", -1), len(x[0].shape))
    _check(x[0].dtype.is_float, f"needs a float operand, got {_fmt(x[0])}")
    return x[0]


def _norm_params(x: TensorType, params: Sequence[TensorType], what: str) -> None:
    _check(len(x.shape) >= 1, "input must have rank >= 1")
    hidden = x.shape[-1]
    for name, p in zip(("gamma", "beta", "bias"), params, strict=False):
        _check(p.shape == (hidden,), f"{what}: {name} must be [{hidden}] (the last axis of {_fmt(x)}), got {_fmt(p)}")


def _norm(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    _check(x[0].dtype.is_float, f"needs a float operand, got {_fmt(x[0])}")
    _check(norm_axis(attrs.get("axis", -1), len(x[0].shape)) == len(x[0].shape) - 1,
           "only the last axis can be normalised")
    _norm_params(x[0], x[1:], "norm")
    return x[0]


@rule(Op.LAYER_NORM)
def _layer_norm(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    _check(len(x) == 3, f"takes x, gamma, beta; got {len(x)} operands")
    return _norm(attrs, x)


@rule(Op.RMS_NORM)
def _rms_norm(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    _check(len(x) in (2, 3), f"takes x, gamma[, beta]; got {len(x)} operands")
    return _norm(attrs, x)


@rule(Op.RESHAPE)
def _reshape(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    target = list(attrs["shape"])
    n = math.prod(x[0].shape)
    _check(target.count(-1) <= 1, f"at most one -1 in shape {target}")
    if -1 in target:
        known = math.prod(d for d in target if d != -1)
        _check(known > 0 and n % known == 0, f"cannot reshape {_fmt(x[0])} to {target}")
        target[target.index(-1)] = n // known
    _check(all(d >= 0 for d in target) and math.prod(target) == n,
           f"cannot reshape {_fmt(x[0])} ({n} elements) to {list(attrs['shape'])}")
    return TensorType(tuple(target), x[0].dtype)


@rule(Op.TRANSPOSE)
def _transpose(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    perm = tuple(attrs["perm"])
    _check(sorted(perm) == list(range(len(x[0].shape))), f"perm {list(perm)} is not a permutation for {_fmt(x[0])}")
    return TensorType(tuple(x[0].shape[p] for p in perm), x[0].dtype)


@rule(Op.NARROW)
def _narrow(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    shape = list(x[0].shape)
    axis = norm_axis(attrs["axis"], len(shape))
    start, length = attrs["start"], attrs["length"]
    _check(0 <= start and length >= 0 and start + length <= shape[axis],
           f"slice [{start}, {start + length}) out of bounds for axis {axis} of {_fmt(x[0])}")
    shape[axis] = length
    return TensorType(tuple(shape), x[0].dtype)


@rule(Op.CONCAT)
def _concat(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    first = x[0]
    axis = norm_axis(attrs["axis"], len(first.shape))
    total = 0
    for t in x:
        _check(t.dtype == first.dtype, f"dtype mismatch: {_fmt(first)} vs {_fmt(t)}")
        _check(len(t.shape) == len(first.shape) and all(
            a == b for i, (a, b) in enumerate(zip(t.shape, first.shape, strict=True)) if i != axis),
            f"shapes differ outside axis {axis}: {_fmt(first)} vs {_fmt(t)}")
        total += t.shape[axis]
    shape = list(first.shape)
    shape[axis] = total
    return TensorType(tuple(shape), first.dtype)


@rule(Op.EXPAND)
def _expand(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    target = tuple(attrs["shape"])
    _check(broadcast(x[0].shape, target) == target, f"cannot expand {_fmt(x[0])} to {list(target)}")
    return TensorType(target, x[0].dtype)


@rule(Op.GATHER)
def _gather(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    table, idx = x
    _check(attrs.get("axis", 0) == 0, "only axis 0 is supported")
    _check(len(table.shape) >= 1, f"table must have rank >= 1, got {_fmt(table)}")
    _check(idx.dtype.is_int, f"indices must be integers, got {_fmt(idx)}")
    return TensorType((*idx.shape, *table.shape[1:]), table.dtype)


def _heads_ok(heads: int, head_dim: int) -> None:
    _check(heads > 0 and head_dim > 0, f"num_heads {heads} and head_dim {head_dim} must be positive")


def _kv_ok(attrs: dict[str, Any]) -> int:
    h, kv = attrs["num_heads"], kv_heads(attrs)
    _check(isinstance(kv, int) and 0 < kv <= h and h % kv == 0,
           f"num_kv_heads {kv} must divide num_heads {h} (grouped-query attention)")
    return kv


def _packed(q: TensorType, heads: int, head_dim: int, what: str) -> None:
    _check(len(q.shape) == 3, f"{what} must be packed [batch, seq, heads*head_dim], got {_fmt(q)}")
    _check(q.shape[-1] == heads * head_dim,
           f"{what} last dim {q.shape[-1]} != num_heads*head_dim = {heads}*{head_dim}")


@rule(Op.ATTENTION)
def _attention(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    h, d, mask = attrs["num_heads"], attrs["head_dim"], attrs.get("mask", "none")
    _heads_ok(h, d)
    kv = _kv_ok(attrs)
    _check(mask in ("none", "causal", "keep", "additive"), f"unknown mask kind {mask!r}")
    for name, t, n in zip("qkv", x[:3], (h, kv, kv), strict=False):
        _packed(t, n, d, name)
    q, k, v = x[:3]
    _check(k.shape == v.shape, f"k {_fmt(k)} and v {_fmt(v)} differ")
    _check(q.shape[0] == k.shape[0], f"batch of q {_fmt(q)} and k {_fmt(k)} differ")
    _check(q.dtype == k.dtype == v.dtype, "q, k, v dtypes differ")
    _check(attrs.get("mask_fill") is None or mask == "keep",
           f"mask_fill={attrs.get('mask_fill')} needs mask kind 'keep', got {mask!r}")
    has_mask = mask in ("keep", "additive")
    _check(len(x) == 3 + has_mask, f"mask kind {mask!r} takes {3 + has_mask} operands, got {len(x)}")
    b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    if mask == "keep":
        _check(x[3].shape == (b, sk), f"keep mask must be [batch, kv_len] = [{b}, {sk}], got {_fmt(x[3])}")
    if mask == "additive":
        ok = len(x[3].shape) <= 4
        try:
            ok = ok and broadcast(x[3].shape, (b, h, sq, sk)) == (b, h, sq, sk)
        except ShapeError:
            ok = False
        _check(ok, f"additive mask {_fmt(x[3])} does not broadcast to [{b}, {h}, {sq}, {sk}]")
    return q


@rule(Op.ROPE)
def _rope(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    d, n_rot = attrs["head_dim"], attrs["n_rot"]
    t, cos, sin = x
    _check(d > 0, f"head_dim {d} must be positive")
    _check(len(t.shape) == 3 and t.shape[-1] % d == 0, f"x must be packed [batch, seq, heads*{d}], got {_fmt(t)}")
    _check(n_rot % 2 == 0 and 0 < n_rot <= d, f"n_rot {n_rot} must be even and <= head_dim {d}")
    for name, c in (("cos", cos), ("sin", sin)):
        per_row = len(c.shape) == 3 and c.shape[0] in (1, t.shape[0])  # [B or 1, S, n/2]: one table per batch row
        _check((len(c.shape) == 2 or per_row) and c.shape[-2] >= t.shape[1] and c.shape[-1] >= n_rot // 2,
               f"{name} must be [max_pos >= {t.shape[1]}, >= {n_rot // 2}] (or [{t.shape[0]} or 1, that, that] per "
               f"batch row), got {_fmt(c)}")
    _check(len(cos.shape) == len(sin.shape), f"cos {_fmt(cos)} and sin {_fmt(sin)} must have one rank")
    return t


_ACT_NAMES = frozenset(a.value for a in ACTIVATIONS)


def _act_ok(name: str | None, optional: bool = True) -> None:
    _check((optional and name is None) or name in _ACT_NAMES,
           f"unknown activation {name!r} (expected one of {sorted(_ACT_NAMES)})")


@rule(Op.FUSED_MATMUL_BIAS_ACT)
def _fmba(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    _act_ok(attrs.get("activation"))
    out = _matmul({}, x[:2])
    _check(len(x[2].shape) <= 1 and x[2].shape in ((), (1,), (out.shape[-1],)),
           f"bias must be rank <= 1 with length {out.shape[-1]}, got {_fmt(x[2])}")
    return out


@rule(Op.FUSED_RESIDUAL_LN, Op.FUSED_RESIDUAL_RMS_NORM)
def _fused_residual_norm(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    has_bias = attrs.get("has_bias", False)
    _check(len(x) == 4 + has_bias, f"has_bias={has_bias} takes {4 + has_bias} operands, got {len(x)}")
    _check(x[0].shape == x[1].shape, f"x {_fmt(x[0])} and residual {_fmt(x[1])} differ")
    _norm_params(x[0], x[2:] if not has_bias else (x[3], x[4], x[2]), "residual norm")
    if attrs.get("with_sum", False):  # two outputs packed on the last axis: [normalized, sum]
        _check(len(x[0].shape) >= 1, f"with_sum packs on the last axis; x is {_fmt(x[0])}")
        return TensorType((*x[0].shape[:-1], 2 * x[0].shape[-1]), x[0].dtype)
    return x[0]


@rule(Op.FUSED_SWIGLU)
def _swiglu(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    shape = x[0].shape
    _check(len(shape) >= 1 and shape[-1] % 2 == 0, f"packed input needs an even last dim, got {_fmt(x[0])}")
    return TensorType((*shape[:-1], shape[-1] // 2), x[0].dtype)


def _linear(inp: TensorType, w: TensorType, b: TensorType | None, what: str) -> TensorType:
    _check(len(w.shape) == 2, f"{what} weight must be [in, out], got {_fmt(w)}")
    out = _matmul({}, (inp, w))
    if b is not None:
        _check(b.shape == (w.shape[1],), f"{what} bias must be [{w.shape[1]}], got {_fmt(b)}")
    return out


@rule(Op.FUSED_ATTENTION_BLOCK)
def _fab(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    h, d = attrs["num_heads"], attrs["head_dim"]
    has_bias, has_rope = attrs.get("has_bias", True), attrs.get("has_rope", False)
    _check(len(x) == 4 + 2 * has_bias + 2 * has_rope,
           f"has_bias={has_bias}, has_rope={has_rope} takes {4 + 2 * has_bias + 2 * has_rope} operands")
    r = unpack(Op.FUSED_ATTENTION_BLOCK, attrs, x)
    hidden, mask = r["hidden"], r["mask"]
    _heads_ok(h, d)
    _check(len(hidden.shape) == 3, f"hidden must be [batch, seq, hidden], got {_fmt(hidden)}")
    kv = _kv_ok(attrs)
    qkv = _linear(hidden, r["qkv_w"], r.get("qkv_b"), "qkv")
    want = (h + 2 * kv) * d
    formula = "3*num_heads*head_dim" if kv == h else "(num_heads + 2*num_kv_heads)*head_dim"
    _check(qkv.shape[-1] == want, f"qkv width {qkv.shape[-1]} != {formula} = {want}")
    attn = TensorType((*hidden.shape[:2], h * d), qkv.dtype)
    kind = attrs.get("mask", "keep")
    _check(kind in BLOCK_MASK_KINDS, f"unknown block mask kind {kind!r} (one of {', '.join(BLOCK_MASK_KINDS)})")
    if kind == "keep":
        _check(mask.shape == hidden.shape[:2],
               f"mask must be [batch, seq] = {list(hidden.shape[:2])}, got {_fmt(mask)}")
    else:  # the attention's own check: broadcastable to [B, heads, S, S], no mask_fill
        packed = TensorType((*hidden.shape[:2], kv * d), qkv.dtype)
        _attention({"num_heads": h, "head_dim": d, "num_kv_heads": kv, "mask": kind,
                    "mask_fill": attrs.get("mask_fill")}, (attn, packed, packed, mask))
    if has_rope:
        _rope({"head_dim": d, "n_rot": d}, (attn, r["rope_cos"], r["rope_sin"]))
    _check(attrs.get("rope_dtype") is None or has_rope, "rope_dtype is the dtype of the RoPE: it needs has_rope=True")
    return _linear(attn, r["out_w"], r.get("out_b"), "out")


@rule(Op.FUSED_TRANSFORMER_LAYER)
def _ftl(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    _check(attrs.get("has_bias", True), "only has_bias=True (the 14-input layout) is supported")
    h, d, inter = attrs["num_heads"], attrs["head_dim"], attrs["intermediate_size"]
    r = unpack(Op.FUSED_TRANSFORMER_LAYER, attrs, x)
    hidden, fc1_w = r["hidden"], r["fc1_w"]
    block = {"num_heads": h, "head_dim": d, "has_bias": True, "has_rope": False, "mask": attrs.get("mask", "keep"),
             "mask_fill": attrs.get("mask_fill")}
    attn_out = _fab(block, pack(Op.FUSED_ATTENTION_BLOCK, block, r))
    _check(attn_out.shape == hidden.shape, f"attention output {_fmt(attn_out)} != hidden {_fmt(hidden)}")
    _norm_params(hidden, (r["ln1_g"], r["ln1_b"]), "ln1")
    _check(fc1_w.shape[-1:] == (inter,), f"fc1 weight {_fmt(fc1_w)} has no intermediate dim {inter}")
    mid = _linear(hidden, fc1_w, r["fc1_b"], "fc1")
    out = _linear(mid, r["fc2_w"], r["fc2_b"], "fc2")
    _check(out.shape == hidden.shape, f"ffn output {_fmt(out)} != hidden {_fmt(hidden)}")
    _norm_params(hidden, (r["ln2_g"], r["ln2_b"]), "ln2")
    _act_ok(attrs["activation"], optional=False)
    return hidden


def parse_step(step: Sequence[Any]) -> tuple[Op, dict[str, Any], tuple[str, ...]]:
    """Decode an ElementwiseRegion chain step `(op, *operands)`, where op may be `cast:f16`
    and each operand is `iK` (external input K) or `sK` (earlier step K)."""
    _check(isinstance(step, tuple | list) and len(step) >= 1 and all(isinstance(s, str) for s in step),
           f"chain step must be a tuple of strings (op, *operands), got {step!r}")
    name, *refs = step
    attrs: dict[str, Any] = {}
    if name.startswith("cast:"):
        name, attrs["dtype"] = "cast", name.split(":", 1)[1]
    try:
        op = Op(name)
    except ValueError:
        raise ShapeError(f"unknown chain op {name!r}") from None
    _check(op in FUSED_REGION_OPS, f"{op.value} is not elementwise")
    arity = SPECS[op].arity
    _check(arity is None or len(refs) in arity, f"chain op {op.value} takes {arity} operand(s), got {len(refs)}")
    return op, attrs, tuple(refs)


@rule(Op.ELEMENTWISE_REGION)
def _region(attrs: dict[str, Any], x: Sequence[TensorType]) -> TensorType:
    chain = attrs["chain"]
    _check(len(chain) >= 1, "empty chain")
    steps: list[TensorType] = []
    for k, step in enumerate(chain):
        op, step_attrs, refs = parse_step(step)
        operands = []
        for r in refs:
            kind, idx = r[:1], int(r[1:]) if r[1:].isdigit() else -1
            _check(kind in ("i", "s") and 0 <= idx < (len(x) if kind == "i" else k),
                   f"step {k}: bad operand {r!r}")
            operands.append(x[idx] if kind == "i" else steps[idx])
        steps.append(infer(op, step_attrs, operands))
    out = steps[-1]
    for k, t in enumerate(x):  # every external input must broadcast *into* the result (RLX input_modulus)
        _check(broadcast(t.shape, out.shape) == out.shape,
               f"input i{k} {_fmt(t)} is larger than the result {_fmt(out)}")
    return out
