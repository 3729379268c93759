"""The op set: one enum value per operation, families as frozensets, and each op's signature.

Op names and fused-op input layouts follow RLX (`rlx-ir/src/op.rs`, `rlx-notes.md` §1.4–1.5).
Unlike RLX, binary/unary/compare/reduce operators are individual ops (grouped by family), so
a pattern names exactly the op it wants and the printer needs no sub-operator syntax.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

T = TypeVar("T")


class Op(StrEnum):
    # leaves
    INPUT = "input"
    PARAM = "param"
    CONST = "const"
    # linear algebra
    MATMUL = "matmul"
    # binary (numpy broadcasting)
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    MAX = "max"
    MIN = "min"
    # unary / activations
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    SILU = "silu"
    RELU = "relu"
    RELU2 = "relu2"  # squared ReLU, relu(x)^2 (Primer, Nemotron)
    SIGMOID = "sigmoid"
    TANH = "tanh"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    NEG = "neg"
    ERF = "erf"
    ABS = "abs"
    SIN = "sin"
    COS = "cos"
    FLOOR = "floor"
    # predicates -> bool
    ISNAN = "isnan"
    # compare -> bool
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    WHERE = "where"
    CAST = "cast"
    # reductions
    REDUCE_SUM = "reduce_sum"
    REDUCE_MEAN = "reduce_mean"
    REDUCE_MAX = "reduce_max"
    SOFTMAX = "softmax"
    ARGMAX = "argmax"
    CUMSUM = "cumsum"
    # normalisation
    LAYER_NORM = "layer_norm"
    RMS_NORM = "rms_norm"
    # data movement
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    NARROW = "narrow"
    CONCAT = "concat"
    EXPAND = "expand"
    GATHER = "gather"
    PAD = "pad"
    # transformer blocks
    ATTENTION = "attention"
    ROPE = "rope"
    # an ONNX node the IR has no op for, evaluated on the host (`ir.onnx_op`)
    ONNX_OP = "onnx_op"
    # fused ops (RLX names)
    FUSED_MATMUL_BIAS_ACT = "FusedMatMulBiasAct"
    FUSED_RESIDUAL_LN = "FusedResidualLN"
    FUSED_RESIDUAL_RMS_NORM = "FusedResidualRmsNorm"
    FUSED_SWIGLU = "FusedSwiGLU"
    FUSED_ATTENTION_BLOCK = "FusedAttentionBlock"
    FUSED_TRANSFORMER_LAYER = "FusedTransformerLayer"
    ELEMENTWISE_REGION = "ElementwiseRegion"


LEAF = frozenset({Op.INPUT, Op.PARAM, Op.CONST})
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.MAX, Op.MIN})
COMMUTATIVE = frozenset({Op.ADD, Op.MUL, Op.MAX, Op.MIN})
UNARY = frozenset({Op.GELU, Op.GELU_TANH, Op.SILU, Op.RELU, Op.RELU2, Op.SIGMOID, Op.TANH, Op.EXP, Op.LOG,
                   Op.SQRT, Op.RSQRT, Op.NEG, Op.ERF, Op.ABS, Op.SIN, Op.COS, Op.FLOOR})
ACTIVATIONS = frozenset({Op.GELU, Op.GELU_TANH, Op.SILU, Op.RELU, Op.RELU2, Op.SIGMOID, Op.TANH})
EPILOGUE_ACTIVATIONS: tuple[Op, ...] = (Op.GELU, Op.SILU, Op.RELU2)
"""The one table of the activations a fused linear takes in its epilogue (`FusedMatMulBiasAct`'s `activation`,
FusedTransformerLayer's fc1), in the order messages list them: `passes.guard.EPILOGUE_ACTIVATIONS` (names) and the
rules' patterns derive from it. Which of them rlxviz's C++ kernels compute is `runtime.lowering.KERNEL_ACTS` (the
others run the activation's own MLX lowering after the kernel's bias add; a test checks that list against the
kernels' `Act`)."""
GATE_ACTIVATIONS: tuple[Op, ...] = (Op.SILU, Op.GELU, Op.GELU_TANH)
"""The gates `FusedSwiGLU` takes (`activation`): SwiGLU (silu) and GeGLU (gelu, gelu_tanh), first the default."""
COMPARE = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE})
PREDICATES = frozenset({Op.ISNAN})
"""Unary ops with a bool result."""
ELEMENTWISE = BINARY | UNARY | COMPARE | PREDICATES | {Op.WHERE, Op.CAST}
FUSED_REGION_OPS = ELEMENTWISE
"""Ops allowed as steps of an ElementwiseRegion chain."""
REDUCE = frozenset({Op.REDUCE_SUM, Op.REDUCE_MEAN, Op.REDUCE_MAX})
MOVEMENT = frozenset({Op.RESHAPE, Op.TRANSPOSE, Op.NARROW, Op.CONCAT, Op.EXPAND, Op.GATHER, Op.PAD})
FUSED = frozenset({Op.FUSED_MATMUL_BIAS_ACT, Op.FUSED_RESIDUAL_LN, Op.FUSED_RESIDUAL_RMS_NORM,
                   Op.FUSED_SWIGLU, Op.FUSED_ATTENTION_BLOCK, Op.FUSED_TRANSFORMER_LAYER,
                   Op.ELEMENTWISE_REGION})
BLAS = frozenset({Op.MATMUL, Op.FUSED_MATMUL_BIAS_ACT})

def kv_heads(attrs: dict[str, Any]) -> int:
    """Key/value heads of an `attention` or `FusedAttentionBlock` (`num_kv_heads`, default `num_heads`: MHA).

    Grouped-query attention (GQA): query head i reads key/value head `i // (num_heads // num_kv_heads)`,
    as Hugging Face's `repeat_kv`."""
    kv = attrs.get("num_kv_heads")
    return attrs["num_heads"] if kv is None else kv


PAD_MODES = ("constant", "reflect", "edge")
"""`pad` modes, as ONNX Pad's: `constant` fills with `value`; `reflect` mirrors without repeating the edge
(`[a b c]` padded by 2 on the left: `[c b a b c]`); `edge` repeats the edge value."""

MASK_KINDS = ("none", "causal", "keep", "additive")
"""Attention mask kinds. `keep`: a `[B, Sk]` mask, 1 = attend, 0 = padding (RLX `Custom`); with the
attribute `mask_fill=None` it is binary (a key with mask <= 0.5 gets the dtype's lowest finite score),
with `mask_fill=f` the scores get `(1 - mask) * f` added, exactly Hugging Face's extended mask (so a
row whose mask is all zeros is shifted by `f` everywhere and still attends normally);
`additive`: a bias broadcastable to `[B, heads, Sq, Sk]` added to the scaled scores (RLX `Bias`);
`causal`: key j visible from query i when j <= i + (Sk - Sq) (bottom-right aligned, as RLX's CPU)."""

BLOCK_MASK_KINDS = ("keep", "additive")
"""The mask kinds FusedAttentionBlock and FusedTransformerLayer take (attribute `mask`, default `keep`): their
`mask` operand is the attention's, with the attention's meaning (`MASK_KINDS`): a `[B, S]` keep mask, or an
additive bias broadcastable to `[B, heads, S, S]` (a TorchScript sdpa padding mask `[B, 1, S, S]`, a band)."""


def family(op: Op) -> str:
    """A short family name used for colours and grouping (`leaf`, `binary`, `fused`, ...)."""
    for name, group in _FAMILIES:
        if op in group:
            return name
    return "other"


_FAMILIES = (("leaf", LEAF), ("blas", BLAS - FUSED), ("binary", BINARY), ("unary", UNARY),
             ("compare", COMPARE | PREDICATES | {Op.WHERE, Op.CAST}),
             ("reduce", REDUCE | {Op.SOFTMAX, Op.ARGMAX, Op.CUMSUM}),
             ("norm", {Op.LAYER_NORM, Op.RMS_NORM}), ("movement", MOVEMENT),
             ("attention", {Op.ATTENTION, Op.ROPE}), ("fused", FUSED))


@dataclass(frozen=True)
class AttrSpec:
    """One attribute of an op: its Python type(s), whether it may be omitted, a default, the allowed
    values (`choices`) and, for tuple values, the allowed element types (`items`)."""

    types: tuple[type, ...]
    required: bool = True
    default: Any = None
    choices: tuple[Any, ...] | None = None
    items: tuple[type, ...] | None = None


@dataclass(frozen=True)
class OpSpec:
    """Signature of an op: allowed operand counts and attribute schema."""

    arity: tuple[int, ...] | None  # None: variadic (>= 1)
    attrs: dict[str, AttrSpec] = field(default_factory=dict)


def _a(*types: type, required: bool = True, default: Any = None, choices: tuple[Any, ...] | None = None,
       items: tuple[type, ...] | None = None) -> AttrSpec:
    return AttrSpec(types, required, default, choices, items)


_INT, _FLOAT, _STR, _BOOL, _TUP = (int,), (int, float), (str,), (bool,), (tuple,)
_NONE = type(None)
_ACT_NAMES = tuple(sorted(a.value for a in ACTIVATIONS))

SPECS: dict[Op, OpSpec] = {
    Op.INPUT: OpSpec((0,), {"name": _a(str)}),
    Op.PARAM: OpSpec((0,), {"name": _a(str)}),
    Op.CONST: OpSpec((0,), {"value": _a(int, float, bool, tuple, items=(int, float, bool, tuple))}),
    Op.MATMUL: OpSpec((2,)),
    **{op: OpSpec((2,)) for op in BINARY | COMPARE},
    **{op: OpSpec((1,)) for op in UNARY | PREDICATES},
    Op.WHERE: OpSpec((3,)),
    Op.CAST: OpSpec((1,), {"dtype": _a(str)}),
    **{op: OpSpec((1,), {"axes": _a(tuple, items=_INT), "keepdims": _a(bool, required=False, default=False)})
       for op in REDUCE},
    Op.SOFTMAX: OpSpec((1,), {"axis": _a(int, required=False, default=-1)}),
    Op.ARGMAX: OpSpec((1,), {"axis": _a(int), "keepdims": _a(bool, required=False, default=False)}),
    Op.CUMSUM: OpSpec((1,), {"axis": _a(int), "exclusive": _a(bool, required=False, default=False),
                             "reverse": _a(bool, required=False, default=False)}),
    Op.LAYER_NORM: OpSpec((3,), {"eps": _a(int, float), "axis": _a(int, required=False, default=-1)}),
    Op.RMS_NORM: OpSpec((2, 3), {"eps": _a(int, float), "axis": _a(int, required=False, default=-1)}),
    Op.RESHAPE: OpSpec((1,), {"shape": _a(tuple, items=_INT)}),
    Op.TRANSPOSE: OpSpec((1,), {"perm": _a(tuple, items=_INT)}),
    Op.NARROW: OpSpec((1,), {"axis": _a(int), "start": _a(int), "length": _a(int)}),
    Op.CONCAT: OpSpec(None, {"axis": _a(int)}),
    Op.EXPAND: OpSpec((1,), {"shape": _a(tuple, items=_INT)}),
    Op.GATHER: OpSpec((2,), {"axis": _a(int, required=False, default=0)}),
    Op.PAD: OpSpec((1,), {"pads": _a(tuple, items=_INT), "mode": _a(str, required=False, default="constant",
                                                                   choices=PAD_MODES),
                          "value": _a(int, float, bool, required=False, default=0.0)}),
    Op.ATTENTION: OpSpec((3, 4), {
        "num_heads": _a(int), "head_dim": _a(int),
        "mask": _a(str, required=False, default="none", choices=MASK_KINDS),
        "scale": _a(int, float, _NONE, required=False, default=None),
        "num_kv_heads": _a(int, _NONE, required=False, default=None),
        "mask_fill": _a(int, float, _NONE, required=False, default=None)}),
    Op.ROPE: OpSpec((3,), {"head_dim": _a(int), "n_rot": _a(int), "interleaved": _a(bool, required=False,
                                                                                   default=False)}),
    Op.FUSED_MATMUL_BIAS_ACT: OpSpec((3,), {
        "activation": _a(str, _NONE, required=False, default=None, choices=(None, *_ACT_NAMES))}),
    Op.FUSED_RESIDUAL_LN: OpSpec((4, 5), {"eps": _a(int, float), "has_bias": _a(bool, required=False, default=False),
                                          "with_sum": _a(bool, required=False, default=False)}),
    Op.FUSED_RESIDUAL_RMS_NORM: OpSpec((4, 5), {"eps": _a(int, float),
                                                "has_bias": _a(bool, required=False, default=False),
                                                "with_sum": _a(bool, required=False, default=False)}),
    Op.FUSED_SWIGLU: OpSpec((1,), {"gate_first": _a(bool, required=False, default=False),
                                   "activation": _a(str, required=False, default="silu",
                                                    choices=tuple(a.value for a in GATE_ACTIVATIONS))}),
    Op.FUSED_ATTENTION_BLOCK: OpSpec((4, 6, 8), {
        "num_heads": _a(int), "head_dim": _a(int),
        "has_bias": _a(bool, required=False, default=True), "has_rope": _a(bool, required=False, default=False),
        "num_kv_heads": _a(int, _NONE, required=False, default=None),
        "mask_fill": _a(int, float, _NONE, required=False, default=None),
        "mask": _a(str, required=False, default="keep", choices=BLOCK_MASK_KINDS)}),
    Op.FUSED_TRANSFORMER_LAYER: OpSpec((14,), {
        "num_heads": _a(int), "head_dim": _a(int), "intermediate_size": _a(int),
        "eps1": _a(int, float), "eps2": _a(int, float),
        "activation": _a(str, choices=_ACT_NAMES), "has_bias": _a(bool, required=False, default=True),
        "mask_fill": _a(int, float, _NONE, required=False, default=None),
        "mask": _a(str, required=False, default="keep", choices=BLOCK_MASK_KINDS)}),
    Op.ELEMENTWISE_REGION: OpSpec(None, {"chain": _a(tuple, items=_TUP)}),
    Op.ONNX_OP: OpSpec(None, {"op_type": _a(str), "name": _a(str, required=False, default=""), "node": _a(str),
                              "opset": _a(int), "shape": _a(tuple, items=_INT), "dtype": _a(str),
                              "output": _a(int, required=False, default=0)}),
}

FTL_INPUTS = ("hidden", "qkv_w", "qkv_b", "out_w", "out_b", "ln1_g", "ln1_b",
              "fc1_w", "fc1_b", "fc2_w", "fc2_b", "ln2_g", "ln2_b", "mask")
"""Operand roles of FusedTransformerLayer, in order (the seed's 14-input layout)."""


def const_shape(value: Any) -> tuple[int, ...] | None:
    """Shape of a const payload (a number, or nested tuples of numbers, any rank); None when ragged or
    when a leaf is not an int, float or bool."""
    if not isinstance(value, tuple):
        return () if isinstance(value, int | float | bool) else None
    if not value:
        return (0,)
    inner = [const_shape(v) for v in value]
    if inner[0] is None or any(i != inner[0] for i in inner):
        return None
    return (len(value), *inner[0])


def operand_roles(op: Op, attrs: dict[str, Any], n: int) -> tuple[str, ...]:
    """Names of a node's operands by position: the one declaration of every op's operand order.

    Used for labels, tooltips and error messages, and by `unpack` / `pack`, through which the
    decompositions (`ir.fused`), shape rules (`ir.infer`), the rules that build fused nodes and the
    MLX lowering read and write fused-op operands by role name instead of by position."""
    if op == Op.FUSED_TRANSFORMER_LAYER:
        return FTL_INPUTS
    if op == Op.FUSED_ATTENTION_BLOCK:
        roles = ["hidden", "qkv_w", "out_w", "mask"]
        if attrs.get("has_bias", True):
            roles += ["qkv_b", "out_b"]
        if attrs.get("has_rope", False):
            roles += ["rope_cos", "rope_sin"]
        return tuple(roles)
    if op in (Op.FUSED_RESIDUAL_LN, Op.FUSED_RESIDUAL_RMS_NORM):
        with_bias = attrs.get("has_bias", n == 5)
        return ("x", "residual", "bias", "gamma", "beta") if with_bias else ("x", "residual", "gamma", "beta")
    fixed = {Op.MATMUL: ("a", "b"), Op.FUSED_MATMUL_BIAS_ACT: ("x", "w", "bias"),
             Op.LAYER_NORM: ("x", "gamma", "beta"), Op.RMS_NORM: ("x", "gamma", "beta"),
             Op.ATTENTION: ("q", "k", "v", "mask"), Op.ROPE: ("x", "cos", "sin"),
             Op.GATHER: ("table", "indices"), Op.WHERE: ("cond", "on_true", "on_false")}
    if op in fixed:
        return fixed[op][:n]
    if op in BINARY | COMPARE:
        return ("lhs", "rhs")
    return tuple(f"in{i}" for i in range(n))


def unpack(op: Op, attrs: dict[str, Any], operands: Sequence[T]) -> dict[str, T]:
    """A node's operands by role name (`operand_roles`), e.g. `{"hidden": ..., "qkv_w": ...}`.

    Raises:
        ValueError: the operand count differs from what the roles declare for these attributes.
    """
    roles = operand_roles(op, attrs, len(operands))
    if len(roles) != len(operands):
        raise ValueError(f"{op.value} with {_attr_text(attrs)} takes {len(roles)} operands "
                         f"({', '.join(roles)}), got {len(operands)}")
    return dict(zip(roles, operands, strict=True))


def pack(op: Op, attrs: dict[str, Any], by_role: Mapping[str, T]) -> list[T]:
    """The operand list of an `op` node from operands by role name (inverse of `unpack`).

    Raises:
        KeyError: a role the op declares for these attributes is missing (named).
    """
    roles = operand_roles(op, attrs, len(by_role))
    missing = [r for r in roles if r not in by_role]
    if missing:
        raise KeyError(f"{op.value}: no operand for role(s) {', '.join(missing)}")
    return [by_role[r] for r in roles]


def _attr_text(attrs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(attrs.items()) if k in ("has_bias", "has_rope")) or "its attributes"
