"""The op set: one enum value per operation and one `OpSpec` per op, the record of everything rlxviz knows about
it (signature, family, operand roles, ONNX name, FLOPs, activation flags). The families (`UNARY`, ...), the
activation lists (`ACTIVATIONS`, `EPILOGUE_ACTIVATIONS`, `KERNEL_ACTIVATIONS`, `GATE_ACTIVATIONS`), the ONNX name
tables (`ONNX_UNARY`, ...) and the FLOPs (`op_flops_per`) are derived from `SPECS`: adding an op is its enum
member, its `SPECS` entry and its implementations (reference, MLX lowering, ONNX export), which
`tests/test_op_tables.py` forces.

Op names and fused-op input layouts follow RLX (`rlx-ir/src/op.rs`, `docs/rlx.md` §1.4–1.5).
Unlike RLX, binary/unary/compare/reduce operators are individual ops (grouped by family), so
a pattern names exactly the op it wants and the printer needs no sub-operator syntax.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
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


# -- FLOPs per element of the transcendentals, as the CPU lowering computes them (`runtime.fast`) ---------------------
ERF_FLOPS = 2 + 1 + 2 * 6 + 2 * 4 + 2
"""erf as `runtime.fast.erf` computes it: clip (2), x^2 (1), Horner P of degree 6 (12) and Q of degree 4
(8), the product by x and the division (2) = 25 FLOPs per element (the rational approximation XLA and
Eigen also use; MLX's own CPU `erf` is scalar code of a similar polynomial)."""
TANH_FLOPS = 2 + 1 + 2 * 6 + 2 * 3 + 2
"""tanh as `runtime.fast.tanh`: clip (2), x^2 (1), P degree 6 (12), Q degree 3 (6), x * P / Q (2) = 23."""
EXP_FLOPS = 20
"""exp as `runtime.fast.exp`: range reduction (4), a degree-7 polynomial by Estrin's scheme (14), 2^k from
the exponent bits (2): about 20 (bit operations counted as FLOPs)."""


@dataclass(frozen=True)
class AttrSpec:
    """One attribute of an op: its Python type(s), whether it may be omitted, a default, the allowed
    values (`choices`) and, for tuple values, the allowed element types (`items`)."""

    types: tuple[type, ...]
    required: bool = True
    default: Any = None
    choices: tuple[Any, ...] | None = None
    items: tuple[type, ...] | None = None


RolesFn = Callable[[Mapping[str, Any], int], tuple[str, ...]]
"""`roles(attrs, n)`: an op's operand roles when they depend on its attributes or operand count."""
FlopsFn = Callable[[Any, Any], int]
"""`flops(graph, node)`: FLOPs of one node of an op whose count is not per output element (matmul, a reduction)."""

OP_KINDS = ("leaf", "blas", "binary", "unary", "predicate", "compare", "select", "cast", "reduce", "scan", "norm",
         "movement", "attention", "host", "fused")
"""`OpSpec.kind`, the op's family; the family sets (`BINARY`, `UNARY`, ...) are the ops of one kind."""


@dataclass(frozen=True)
class OpSpec:
    """Everything rlxviz knows about an op as data: the one record every op table is derived from.

    Attributes:
        arity: the allowed operand counts (None: variadic, >= 1).
        attrs: the attribute schema (`AttrSpec` by name).
        kind: the op's family (one of `OP_KINDS`): `BINARY`, `UNARY`, `COMPARE`, ... are the ops of a kind.
        roles: the operands' names by position (`operand_roles`): a tuple (cut to the operand count), a `RolesFn`,
            or None (`in0`, `in1`, ...).
        onnx: the ONNX operator (default domain) that is this op one to one: the exporter writes it (with the op's
            attributes) and the importer maps it to this op (`onnx_name`, `onnx_unary`, `onnx_binary`). None: no
            such ONNX operator (the op is written as the ONNX form of its formula, e.g. `gelu`).
        flops: FLOPs per output element (an int; 0 for data movement) or a `FlopsFn`; None for a fused op, whose
            FLOPs are its decomposition's (`session.roofline`).
        commutative: a binary op whose operands may be swapped (patterns match both orders).
        blas: a matrix product run by a BLAS kernel (`BLAS`).
        activation: an activation (`ACTIVATIONS`): `FusedMatMulBiasAct`'s and FusedTransformerLayer's `activation`
            attribute may name it.
        mlp: an activation between an MLP's two linears (`MLP_ACTIVATIONS`; the layer classifier's evidence of
            an MLP).
        epilogue: in the epilogue allow-list (`EPILOGUE_ACTIVATIONS`): `fuse_matmul_bias_act` absorbs it.
        kernel_act: rlxviz's C++ kernels compute it in their epilogue (`KERNEL_ACTS`; `kernels/src/act.h`'s
            `enum class Act`, checked by `tests/test_op_tables.py`).
        gate: `FusedSwiGLU`'s gate rank (`GATE_ACTIVATIONS`, 0 = the default gate); None: not a gate.
    """

    arity: tuple[int, ...] | None  # None: variadic (>= 1)
    attrs: dict[str, AttrSpec] = field(default_factory=dict)
    kind: str = "fused"
    roles: tuple[str, ...] | RolesFn | None = None
    onnx: str | None = None
    flops: int | FlopsFn | None = None
    commutative: bool = False
    blas: bool = False
    activation: bool = False
    mlp: bool = False
    epilogue: bool = False
    kernel_act: bool = False
    gate: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in OP_KINDS:
            raise ValueError(f"OpSpec kind {self.kind!r}: one of {', '.join(OP_KINDS)}")
        if (self.epilogue or self.kernel_act or self.mlp or self.gate is not None) and not self.activation:
            raise ValueError("OpSpec: epilogue, kernel_act, mlp and gate describe an activation (activation=True)")


def _a(*types: type, required: bool = True, default: Any = None, choices: tuple[Any, ...] | None = None,
       items: tuple[type, ...] | None = None) -> AttrSpec:
    return AttrSpec(types, required, default, choices, items)


def _unary(flops: int = 1, onnx: str | None = None, **facts: Any) -> OpSpec:
    return OpSpec((1,), kind="unary", onnx=onnx, flops=flops, **facts)


def _act(flops: int = 1, onnx: str | None = None, **facts: Any) -> OpSpec:
    return _unary(flops, onnx, activation=True, **facts)


def _binary(onnx: str | None, kind: str = "binary", commutative: bool = False) -> OpSpec:
    return OpSpec((2,), kind=kind, roles=_lhs_rhs, onnx=onnx, flops=1, commutative=commutative)


def _lhs_rhs(attrs: Mapping[str, Any], n: int) -> tuple[str, ...]:
    return ("lhs", "rhs")


def _matmul_flops(graph: Any, node: Any) -> int:
    """2 per multiply-add: `[M, K] x [K, N]` is `2*M*K*N`."""
    return 2 * math.prod(node.shape) * graph[node.inputs[0]].shape[-1]


def _reduce_flops(graph: Any, node: Any) -> int:
    """1 per input element."""
    return math.prod(graph[node.inputs[0]].shape)


def _attention_flops(graph: Any, node: Any) -> int:
    """QK^T and PV (2 multiply-adds each) plus the softmax on the scores (5 per score)."""
    b, sq = node.shape[0], node.shape[1]
    sk = graph[node.inputs[1]].shape[1]
    h, d = node.attrs["num_heads"], node.attrs["head_dim"]
    return 4 * b * h * sq * sk * d + 5 * b * h * sq * sk


def _residual_norm_roles(attrs: Mapping[str, Any], n: int) -> tuple[str, ...]:
    with_bias = attrs.get("has_bias", n == 5)
    return ("x", "residual", "bias", "gamma", "beta") if with_bias else ("x", "residual", "gamma", "beta")


def _attention_block_roles(attrs: Mapping[str, Any], n: int) -> tuple[str, ...]:
    roles = ["hidden", "qkv_w", "out_w", "mask"]
    if attrs.get("has_bias", True):
        roles += ["qkv_b", "out_b"]
    if attrs.get("has_rope", False):
        roles += ["rope_cos", "rope_sin"]
    return tuple(roles)


FTL_INPUTS = ("hidden", "qkv_w", "qkv_b", "out_w", "out_b", "ln1_g", "ln1_b",
              "fc1_w", "fc1_b", "fc2_w", "fc2_b", "ln2_g", "ln2_b", "mask")
"""Operand roles of FusedTransformerLayer, in order (the seed's 14-input layout)."""

_INT, _FLOAT, _STR, _BOOL, _TUP = (int,), (int, float), (str,), (bool,), (tuple,)
_NONE = type(None)
_AXES = {"axes": _a(tuple, items=_INT), "keepdims": _a(bool, required=False, default=False)}
_NORM = {"eps": _a(int, float), "axis": _a(int, required=False, default=-1)}

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

SPECS: dict[Op, OpSpec] = {
    Op.INPUT: OpSpec((0,), {"name": _a(str)}, kind="leaf", flops=0),
    Op.PARAM: OpSpec((0,), {"name": _a(str)}, kind="leaf", flops=0),
    Op.CONST: OpSpec((0,), {"value": _a(int, float, bool, tuple, items=(int, float, bool, tuple))}, kind="leaf",
                     flops=0),
    Op.MATMUL: OpSpec((2,), kind="blas", roles=("a", "b"), onnx="MatMul", flops=_matmul_flops, blas=True),
    Op.ADD: _binary("Add", commutative=True),
    Op.SUB: _binary("Sub"),
    Op.MUL: _binary("Mul", commutative=True),
    Op.DIV: _binary("Div"),
    Op.POW: _binary("Pow"),
    Op.MAX: _binary("Max", commutative=True),
    Op.MIN: _binary("Min", commutative=True),
    Op.GELU: _act(ERF_FLOPS + 4, mlp=True, epilogue=True, kernel_act=True, gate=1),  # 0.5x(1 + erf(x/sqrt 2))
    Op.GELU_TANH: _act(TANH_FLOPS + 8, mlp=True, kernel_act=True, gate=2),  # 0.5x(1 + tanh(c(x + 0.044715x^3)))
    Op.SILU: _act(EXP_FLOPS + 4, mlp=True, epilogue=True, kernel_act=True, gate=0),  # x * sigmoid(x)
    Op.RELU: _act(1, "Relu", mlp=True, kernel_act=True),
    Op.RELU2: _act(1, mlp=True, epilogue=True, kernel_act=True),
    Op.SIGMOID: _act(EXP_FLOPS + 3, "Sigmoid"),  # 1 / (1 + exp(-x))
    Op.TANH: _act(TANH_FLOPS, "Tanh"),
    Op.EXP: _unary(EXP_FLOPS, "Exp"),
    Op.LOG: _unary(1, "Log"),
    Op.SQRT: _unary(1, "Sqrt"),
    Op.RSQRT: _unary(1),
    Op.NEG: _unary(1, "Neg"),
    Op.ERF: _unary(ERF_FLOPS, "Erf"),
    Op.ABS: _unary(1, "Abs"),
    Op.SIN: _unary(1, "Sin"),
    Op.COS: _unary(1, "Cos"),
    Op.FLOOR: _unary(1, "Floor"),
    Op.ISNAN: OpSpec((1,), kind="predicate", onnx="IsNaN", flops=1),
    Op.EQ: _binary("Equal", "compare"),
    Op.NE: _binary(None, "compare"),
    Op.LT: _binary("Less", "compare"),
    Op.LE: _binary("LessOrEqual", "compare"),
    Op.GT: _binary("Greater", "compare"),
    Op.GE: _binary("GreaterOrEqual", "compare"),
    Op.WHERE: OpSpec((3,), kind="select", roles=("cond", "on_true", "on_false"), onnx="Where", flops=1),
    Op.CAST: OpSpec((1,), {"dtype": _a(str)}, kind="cast", onnx="Cast", flops=0),
    Op.REDUCE_SUM: OpSpec((1,), _AXES, kind="reduce", onnx="ReduceSum", flops=_reduce_flops),
    Op.REDUCE_MEAN: OpSpec((1,), _AXES, kind="reduce", onnx="ReduceMean", flops=_reduce_flops),
    Op.REDUCE_MAX: OpSpec((1,), _AXES, kind="reduce", onnx="ReduceMax", flops=_reduce_flops),
    Op.SOFTMAX: OpSpec((1,), {"axis": _a(int, required=False, default=-1)}, kind="scan", onnx="Softmax",
                       flops=EXP_FLOPS + 4),
    Op.ARGMAX: OpSpec((1,), {"axis": _a(int), "keepdims": _a(bool, required=False, default=False)}, kind="scan",
                      onnx="ArgMax", flops=1),
    Op.CUMSUM: OpSpec((1,), {"axis": _a(int), "exclusive": _a(bool, required=False, default=False),
                             "reverse": _a(bool, required=False, default=False)}, kind="scan", onnx="CumSum",
                      flops=1),
    Op.LAYER_NORM: OpSpec((3,), _NORM, kind="norm", roles=("x", "gamma", "beta"), onnx="LayerNormalization",
                          flops=8),
    Op.RMS_NORM: OpSpec((2, 3), _NORM, kind="norm", roles=("x", "gamma", "beta"), flops=6),
    Op.RESHAPE: OpSpec((1,), {"shape": _a(tuple, items=_INT)}, kind="movement", onnx="Reshape", flops=0),
    Op.TRANSPOSE: OpSpec((1,), {"perm": _a(tuple, items=_INT)}, kind="movement", onnx="Transpose", flops=0),
    Op.NARROW: OpSpec((1,), {"axis": _a(int), "start": _a(int), "length": _a(int)}, kind="movement", flops=0),
    Op.CONCAT: OpSpec(None, {"axis": _a(int)}, kind="movement", onnx="Concat", flops=0),
    Op.EXPAND: OpSpec((1,), {"shape": _a(tuple, items=_INT)}, kind="movement", onnx="Expand", flops=0),
    Op.GATHER: OpSpec((2,), {"axis": _a(int, required=False, default=0)}, kind="movement",
                      roles=("table", "indices"), onnx="Gather", flops=0),
    Op.PAD: OpSpec((1,), {"pads": _a(tuple, items=_INT),
                          "mode": _a(str, required=False, default="constant", choices=PAD_MODES),
                          "value": _a(int, float, bool, required=False, default=0.0)}, kind="movement", onnx="Pad",
                   flops=0),
    Op.ATTENTION: OpSpec((3, 4), {
        "num_heads": _a(int), "head_dim": _a(int),
        "mask": _a(str, required=False, default="none", choices=MASK_KINDS),
        "scale": _a(int, float, _NONE, required=False, default=None),
        "num_kv_heads": _a(int, _NONE, required=False, default=None),
        "mask_fill": _a(int, float, _NONE, required=False, default=None)},
        kind="attention", roles=("q", "k", "v", "mask"), flops=_attention_flops),
    Op.ROPE: OpSpec((3,), {"head_dim": _a(int), "n_rot": _a(int),
                           "interleaved": _a(bool, required=False, default=False)},
                    kind="attention", roles=("x", "cos", "sin"), flops=3),
    Op.ONNX_OP: OpSpec(None, {"op_type": _a(str), "name": _a(str, required=False, default=""), "node": _a(str),
                              "opset": _a(int), "shape": _a(tuple, items=_INT), "dtype": _a(str),
                              "output": _a(int, required=False, default=0)}, kind="host", flops=1),
}
"""Op -> its `OpSpec`: the one table of op facts. The fused ops' entries follow (they name the activations)."""


def _of(keep: Callable[[OpSpec], Any]) -> tuple[Op, ...]:
    """The ops whose spec passes `keep`, in `Op`'s declaration order (the order messages list them in)."""
    return tuple(op for op in Op if op in SPECS and keep(SPECS[op]))


ACTIVATIONS = frozenset(_of(lambda s: s.activation))
MLP_ACTIVATIONS: tuple[Op, ...] = _of(lambda s: s.mlp)
"""The activations an MLP puts between its two linears (`OpSpec.mlp`): the layer classifier's evidence."""
EPILOGUE_ACTIVATIONS: tuple[Op, ...] = _of(lambda s: s.epilogue)
"""The one table of the activations a fused linear takes in its epilogue (`FusedMatMulBiasAct`'s `activation`,
FusedTransformerLayer's fc1), in the order messages list them, derived from `OpSpec.epilogue`:
`passes.guard.EPILOGUE_ACTIVATIONS` (names) and the rules' patterns derive from it. Which of them rlxviz's C++
kernels compute is `KERNEL_ACTIVATIONS` (`OpSpec.kernel_act`; the others run the activation's own MLX lowering
after the kernel's bias add; a test checks that list against the kernels' `Act`)."""
KERNEL_ACTIVATIONS: tuple[Op, ...] = _of(lambda s: s.kernel_act)
"""The activations rlxviz's C++ kernels apply in their epilogue (`OpSpec.kernel_act`; `runtime.kernel_routing.
KERNEL_ACTS` by name; `kernels/src/act.h` `enum class Act` lists them plus `none`)."""
GATE_ACTIVATIONS: tuple[Op, ...] = tuple(sorted(_of(lambda s: s.gate is not None), key=lambda op: SPECS[op].gate))
"""The gates `FusedSwiGLU` takes (`activation`): SwiGLU (silu) and GeGLU (gelu, gelu_tanh), first the default."""
_ACT_NAMES = tuple(sorted(a.value for a in ACTIVATIONS))

SPECS.update({
    Op.FUSED_MATMUL_BIAS_ACT: OpSpec((3,), {
        "activation": _a(str, _NONE, required=False, default=None, choices=(None, *_ACT_NAMES))},
        roles=("x", "w", "bias"), blas=True),
    Op.FUSED_RESIDUAL_LN: OpSpec((4, 5), {"eps": _a(int, float), "has_bias": _a(bool, required=False, default=False),
                                          "with_sum": _a(bool, required=False, default=False)},
                                 roles=_residual_norm_roles),
    Op.FUSED_RESIDUAL_RMS_NORM: OpSpec((4, 5), {"eps": _a(int, float),
                                                "has_bias": _a(bool, required=False, default=False),
                                                "with_sum": _a(bool, required=False, default=False)},
                                       roles=_residual_norm_roles),
    Op.FUSED_SWIGLU: OpSpec((1,), {"gate_first": _a(bool, required=False, default=False),
                                   "activation": _a(str, required=False, default=GATE_ACTIVATIONS[0].value,
                                                    choices=tuple(a.value for a in GATE_ACTIVATIONS))}),
    Op.FUSED_ATTENTION_BLOCK: OpSpec((4, 6, 8), {
        "num_heads": _a(int), "head_dim": _a(int),
        "has_bias": _a(bool, required=False, default=True), "has_rope": _a(bool, required=False, default=False),
        "num_kv_heads": _a(int, _NONE, required=False, default=None),
        "mask_fill": _a(int, float, _NONE, required=False, default=None),
        "mask": _a(str, required=False, default="keep", choices=BLOCK_MASK_KINDS),
        "rope_dtype": _a(str, _NONE, required=False, default=None, choices=(None, "f32", "f16", "bf16", "f64"))},
        roles=_attention_block_roles),
    Op.FUSED_TRANSFORMER_LAYER: OpSpec((14,), {
        "num_heads": _a(int), "head_dim": _a(int), "intermediate_size": _a(int),
        "eps1": _a(int, float), "eps2": _a(int, float),
        "activation": _a(str, choices=_ACT_NAMES), "has_bias": _a(bool, required=False, default=True),
        "mask_fill": _a(int, float, _NONE, required=False, default=None),
        "mask": _a(str, required=False, default="keep", choices=BLOCK_MASK_KINDS)},
        roles=lambda attrs, n: FTL_INPUTS),
    Op.ELEMENTWISE_REGION: OpSpec(None, {"chain": _a(tuple, items=_TUP)}),
})


def _kind(*kinds: str) -> frozenset[Op]:
    return frozenset(_of(lambda s: s.kind in kinds))


LEAF = _kind("leaf")
BINARY = _kind("binary")
COMMUTATIVE = frozenset(_of(lambda s: s.commutative))
UNARY = _kind("unary")
COMPARE = _kind("compare")
PREDICATES = _kind("predicate")
"""Unary ops with a bool result."""
ELEMENTWISE = _kind("binary", "unary", "compare", "predicate", "select", "cast")
FUSED_REGION_OPS = ELEMENTWISE
"""Ops allowed as steps of an ElementwiseRegion chain."""
REDUCE = _kind("reduce")
MOVEMENT = _kind("movement")
FUSED = _kind("fused")
BLAS = frozenset(_of(lambda s: s.blas))

_FAMILY = {"leaf": "leaf", "blas": "blas", "binary": "binary", "unary": "unary", "predicate": "compare",
           "compare": "compare", "select": "compare", "cast": "compare", "reduce": "reduce", "scan": "reduce",
           "norm": "norm", "movement": "movement", "attention": "attention", "host": "other", "fused": "fused"}


FUSED_INTO = "fused into"
REWRITTEN_AS = "rewritten as"


def made_as(op: Op) -> str:
    """How a node a match made is named, by its op: `fused into` for a fused op (`FUSED`: FusedMatMulBiasAct,
    FusedResidualLN, FusedAttentionBlock, FusedTransformerLayer, ElementwiseRegion, ...), `rewritten as` for a plain op
    a rewrite made (a canonicalization's transpose or mul, the packed `attention`, a merged matmul). The one rule the
    app's decision rows and a layer's verdict (its fused ops, `LayerVerdict.done`, apart from `rewritten`) read."""
    return FUSED_INTO if op in FUSED else REWRITTEN_AS


def family(op: Op) -> str:
    """A short family name used for colours and grouping (`leaf`, `binary`, `fused`, ...)."""
    return _FAMILY[SPECS[op].kind]


def kv_heads(attrs: dict[str, Any]) -> int:
    """Key/value heads of an `attention` or `FusedAttentionBlock` (`num_kv_heads`, default `num_heads`: MHA).

    Grouped-query attention (GQA): query head i reads key/value head `i // (num_heads // num_kv_heads)`,
    as Hugging Face's `repeat_kv`."""
    kv = attrs.get("num_kv_heads")
    return attrs["num_heads"] if kv is None else kv


def op_flops_per(graph: Any, node: Any) -> int:
    """FLOPs of one primitive node from its spec (`OpSpec.flops`: per output element, or its formula).

    Raises:
        ValueError: a fused op (its FLOPs are its decomposition's: `session.roofline.graph_flops`).
    """
    flops = SPECS[node.op].flops
    if flops is None:
        raise ValueError(f"[op_flops] {node.op.value} is fused: count its decomposition (graph_flops)")
    return flops(graph, node) if callable(flops) else flops * math.prod(node.shape)


# -- ONNX names, derived (the importer's and the exporter's tables) ----------------------------------------------------
def onnx_name(op: Op) -> str | None:
    """The ONNX operator that is `op` one to one (`OpSpec.onnx`), None when `op` has none."""
    return SPECS[op].onnx


def _onnx_of(ops: frozenset[Op]) -> dict[str, Op]:
    return {SPECS[op].onnx: op for op in _of(lambda s: s.onnx is not None) if op in ops}  # type: ignore[misc]


ONNX_OPS: dict[str, Op] = _onnx_of(frozenset(Op))
"""ONNX operator type -> the op that is it one to one (the inverse of `OpSpec.onnx`)."""
ONNX_UNARY: dict[str, Op] = _onnx_of(UNARY | PREDICATES)
"""ONNX type -> op for the one-operand elementwise ops (`Relu` -> `relu`, `IsNaN` -> `isnan`)."""
ONNX_BINARY: dict[str, Op] = _onnx_of(BINARY | COMPARE)
"""ONNX type -> op for the broadcasting binary and compare ops (`Add` -> `add`, `Max` -> `max`, `Less` -> `lt`)."""


def onnx_op(onnx_type: str) -> Op | None:
    """The op an ONNX operator of the default domain is one to one (`OpSpec.onnx`), None when there is none."""
    return ONNX_OPS.get(onnx_type)


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
    roles = SPECS[op].roles
    if roles is None:
        return tuple(f"in{i}" for i in range(n))
    return roles(attrs, n) if callable(roles) else roles[:n]


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
