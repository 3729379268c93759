"""Linear-layer fusion: `fuse_matmul_bias_act` (the shared-input merge of several linears: `rules.shared_input`).

`fuse_matmul_bias_act` (docs/rlx.md §2.3.1): `act(matmul(x, w) + bias)` -> `FusedMatMulBiasAct`.
Guards: the matmul is single-use and not a graph output (RLX has no output guard), the bias has
rank <= 1 and the matmul's output width (RLX checks neither length nor outputs), and the activation
is absorbed only from the epilogue allow-list (`guard.EPILOGUE_ACTIVATIONS`, from the one table
`ir.ops.EPILOGUE_ACTIVATIONS`: `gelu, silu, relu2`; squared ReLU written as `relu(x)^2` reaches it as `relu2`
through `canonicalize_exported.relu2`). `gelu_tanh` is deliberately not in the list: the fused epilogue is
exact-erf GELU, so a tanh-GELU FFN keeps its activation as a separate node and the rejection
`epilogue_activation` says so. A bias-less `act(matmul(x, w))` with an allow-listed
activation (GPT-style FC1 + GELU) fuses too (`zero_bias_act`), with a zero bias `expand(0.0, [N])`.

A scale between the matmul and its bias (`act(x @ w * s + bias)`, or `act(x @ w * s)`: weight-only quantization's
per-output-channel dequantize scale, or a scalar) is not taken: FusedMatMulBiasAct has no scale, and moving `s`
onto the weight's columns changes the rounding. The near-miss rules `scale_before_bias` / `scale_before_act` name
the mul (not recognized; the compiler fix is an epilogue scale operand), so the layer is not reported fused with
its matmul silently left out. They apply only to a weight-side (param/const) scalar or `[N]` scale of a rank-2
weight's matmul and a scalar or `[N]` bias; they never rewrite.

Validity (numbers equal for every input, up to GEMM summation order): `FusedMatMulBiasAct` is
`act(x @ w + bias)`, the matched ops in the same order; the bias broadcasts the same way because it is
a scalar or a `[N]` vector of the matmul's width (guards `bias_rank`, `bias_length`); an `add` of two
full-size tensors is a residual, never taken for a bias. A zero bias (`zero_bias_act`) is exact: `y + 0 == y`
for every y (finite, infinite or NaN; -0.0 + 0 gives +0.0, which compares equal), so `act(x @ w + 0)` is
`act(x @ w)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ...ir import Graph, Node, Op, Rewriter
from ...ir.infer import TensorType
from ...ir.ops import ACTIVATIONS
from ..activations import SQUARED_RELU, activation_of, owns_users
from ..allow_list import epilogue_allowed
from ..engine import rule_pass, same_for_readers
from ..guard import (
    COMPILER_ONLY,
    EPILOGUE_ACTIVATIONS,
    ILLEGAL,
    NO_MODEL_FIX,
    NOT_RECOGNIZED,
    READ_BY_MODEL,
    Ctx,
    Guard,
    activation_hint,
    extra_readers_why,
    guard,
    not_output,
    rank_le,
    single_user,
)
from ..pattern import P
from ..refusal_kinds import NOTHING_TO_CHANGE, rounding_not_offered
from ..rule import QUIET, Fail, Rule, Soft, reports

# -- fuse_matmul_bias_act ------------------------------------------------------------------------

LINEAR_CORE = ("mm", "w")
"""A linear's core op, first first (`Rule.core`): its matmul, then its weight. A refusal of a matmul + bias epilogue is
filed in the matmul's layer (`trace.REFUSAL_LAYER_RULE`), not in that of its bias add, which ONNX Runtime's optimizer
may have named after the next layer's norm (whisper-encoder.ortopt: layer 0's fc2 bias under layer 1's
SkipLayerNormalization; rlxviz's ONNX importer gives that bias add its bias's path, `contrib.skip_ln`, but another
front end may not)."""

LINEAR = P(Op.ADD, P(Op.MATMUL, P.var("x"), P.var("w"), name="mm"), P.var("bias"), name="add", commutative=True)


@reports(reads=("bias", "mm", "w"))
def _not_residual(c: Ctx) -> Fail | None:
    """An add of two full-size tensors is a residual, not a bias: not a candidate (quiet). Nor is a term of rank
    >= 2 added to a matmul of two computed rank-4 operands (`q @ k^T + position_bias` on `[B, H, S, d]` heads, T5's
    decoder): attention scores and their score term, no linear layer and its bias. (Heads folded into the batch,
    rank 3, keep the named refusal: the verdict of such a layer is pinned by its own cases.)"""
    if c["bias"].shape == c["mm"].shape:
        return QUIET
    w = c["w"]
    if c["bias"].rank >= 2 and c["mm"].rank >= 4 and w.op not in (Op.PARAM, Op.CONST) and w.rank >= 4:
        return QUIET
    return None


def _bias_len_ok(c: Ctx) -> bool:
    return c["bias"].shape in ((), (1,), (c["mm"].shape[-1],))


BIAS_VECTOR_HINT = ("store the bias as a vector [N] without its leading 1s (the same numbers: its reader broadcasts it "
                    "alike)")


def _bias_vector_why(c: Ctx) -> str | None:
    """None when the bias is one `FusedMatMulBiasAct` takes but for leading 1s (`[1, N]` for `[N]`, `[1, 1]` for
    `[1]`) and its readers compute the same with them dropped (`engine.same_for_readers`): storing it as the vector
    keeps every number (`BIAS_VECTOR_HINT`). Else why no model change helps."""
    b, n = c["bias"], c["mm"].shape[-1]
    s = b.shape[next((k for k, d in enumerate(b.shape) if d != 1), len(b.shape)):]
    if s in ((), (1,), (n,)) and s != b.shape and same_for_readers(c.graph, c.id("bias"), TensorType(s, b.dtype)):
        return None
    return f"FusedMatMulBiasAct adds a bias along the output width ({n}) only, and this one is not such a bias " \
           f"with leading 1s"


@reports("epilogue_activation", "add_not_output", reads=("add",), binds=("act",), kinds={"add_not_output": ILLEGAL})
def _epilogue(c: Ctx) -> Fail | None:
    """Absorb the add's activation user when allowed; otherwise say why not (soft)."""
    users = c.users("add")
    form = activation_of(c.graph, c.id("add"))
    if form is not None and owns_users(c.graph, form) and form.name == SQUARED_RELU:  # relu2 refused it
        sq = c.graph[form.out]
        return Fail("guard", "epilogue_activation",
                    f"{c.d('add')} feeds {form.describe()}; relu2 is on the epilogue allow-list, but "
                    f"canonicalize_exported.relu2 did not form it: the square is {sq.type} where the relu is "
                    f"{c.graph[form.nodes[0]].type} (it must keep the relu's dtype and shape), so the linear is "
                    f"fused without it", form.nodes, tuple((c.id("add"), u.id) for u in users),
                    "square the relu in its own dtype (an int exponent widens the ONNX import's pow)",
                    subject=form.out, kind=NOT_RECOGNIZED,
                    fix="read ONNX Pow's result in X's dtype (its exponent cast to it) at import")
    if form is not None and owns_users(c.graph, form):  # QuickGELU, Swish, ... written as primitives
        return Fail("guard", "epilogue_activation",
                    f"{c.d('add')} feeds {form.describe()}, an activation written as primitives that no fused op "
                    f"takes (the epilogue allow-list is {', '.join(EPILOGUE_ACTIVATIONS)}), so the linear is fused "
                    f"without it and the activation stays outside", form.nodes,
                    tuple((c.id("add"), u.id) for u in users), "keep the model's activation: the fix is in the "
                    "compiler", subject=form.out, kind=NOT_RECOGNIZED, remedy=COMPILER_ONLY,
                    fix=f"add {form.name} to the epilogue allow-list, with an op for it (rlxviz has none: it is "
                        "written as primitives)")
    moves, users = _through_relayouts(c.graph, users)
    if len(users) != 1 or users[0].op.value not in {a.value for a in _ACTS}:
        return QUIET  # no activation epilogue to absorb: not a near-miss
    act = users[0]
    if moves:
        return _through_fail(c, moves, act)
    if act.op.value not in epilogue_allowed():
        return Fail("guard", "epilogue_activation",
                    f"{c.d('add')} feeds {act.op.value} (node {act.id}); the epilogue allow-list is "
                    f"{', '.join(EPILOGUE_ACTIVATIONS)}, so the linear is fused without activation",
                    (act.id,), ((c.id("add"), act.id),),
                    activation_hint(act.op.value), subject=act.id, kind=NOT_RECOGNIZED, remedy=COMPILER_ONLY,
                    fix=f"add {act.op.value} to the epilogue allow-list ({_HAS_KERNEL.get(act.op.value, '')}"
                        f"ir.ops.EPILOGUE_ACTIVATIONS)")
    if c.graph.is_output(c.id("add")):
        return Fail("guard", "add_not_output",
                    f"{c.d('add')} is a graph output, so {act.op.value} (node {act.id}) is not absorbed",
                    (c.id("add"),), (), NO_MODEL_FIX + (extra_readers_why(c, "add", ()) or ""),
                    subject=c.id("add"), kind=ILLEGAL, remedy=READ_BY_MODEL,
                    fix="a FusedMatMulBiasAct that also returns the pre-activation value (Rule.outputs)")
    c.bindings["act"] = act.id
    return None


_ACTS = ACTIVATIONS
_RELAYOUTS = frozenset({Op.RESHAPE, Op.TRANSPOSE})
"""Movement ops that only relabel every element (no element dropped or repeated): a unary elementwise activation
commutes with them exactly, `act(reshape(y)) == reshape(act(y))`."""


def _through_relayouts(g: Graph, users: tuple[Node, ...]) -> tuple[tuple[Node, ...], tuple[Node, ...]]:
    """`(relayouts, users)`: the chain of single-reader reshapes/transposes (`_RELAYOUTS`, none a graph output) from
    the bias add's users on, and the users after it; `((), users)` when the add's one user is not such a node. A
    pooler's `tanh(reshape(x @ w + b))` (ONNX Runtime's optimized ViT/DeiT) reaches its activation so."""
    moves: list[Node] = []
    while len(users) == 1 and users[0].op in _RELAYOUTS and not g.is_output(users[0].id):
        moves.append(users[0])
        users = g.users(users[0].id)
    return tuple(moves), users


def _through_fail(c: Ctx, moves: tuple[Node, ...], act: Node) -> Fail:
    """The refusal of an activation read through relayouts (`_through_relayouts`): the rule's epilogue takes the
    activation only as the bias add's own reader, so the linear is fused without it. No model change: the fix is the
    compiler's (read the activation through the relayout, exact since it commutes with it; for an activation off the
    allow-list, the allow-list too)."""
    via = ", ".join(f"{m.op.value} (node {m.id})" for m in moves)
    chain = (c.id("add"), *(m.id for m in moves), act.id)
    edges = tuple(zip(chain, chain[1:], strict=False))
    name = act.op.value
    listed = name in epilogue_allowed()
    why = ("the epilogue takes an activation only as the bias add's own reader" if listed else
           f"the epilogue allow-list is {', '.join(EPILOGUE_ACTIVATIONS)}, and it takes an activation only as the "
           f"bias add's own reader")
    read = (f"read through the {'/'.join(dict.fromkeys(m.op.value for m in moves))} (an elementwise activation "
            "commutes with it: exact)")
    fix = (f"FusedMatMulBiasAct with its activation {read}" if listed else
           f"add {name} to the epilogue allow-list ({_HAS_KERNEL.get(name, '')}ir.ops.EPILOGUE_ACTIVATIONS), with "
           f"the activation {read}")
    return Fail("guard", "epilogue_activation",
                f"{c.d('add')} feeds {name} (node {act.id}) through {via}; {why}, so the linear is fused without "
                f"its activation", (*(m.id for m in moves), act.id), edges,
                "keep the model: the fix is in the compiler", subject=act.id, kind=NOT_RECOGNIZED,
                remedy=COMPILER_ONLY, fix=fix)
_HAS_KERNEL = {"gelu_tanh": "the MLX lowering and rlxviz's CPU kernels already compute it: ",
               "relu": "the MLX lowering and rlxviz's CPU kernels already compute it: "}
"""What the compiler fix can say of an activation off the allow-list whose epilogue code exists already
(`runtime.lowering.KERNEL_ACTS`; `tests/test_epilogue_forms.py` checks the two agree)."""


def _fmba(c: Ctx) -> tuple[Op, list[int], dict]:
    act = c["act"].op.value if "act" in c else None
    return Op.FUSED_MATMUL_BIAS_ACT, [c.id("x"), c.id("w"), c.id("bias")], {"activation": act}


def _fmba_rewrite(c: Ctx, rw: Rewriter) -> int:
    op, ins, attrs = _fmba(c)
    roles = ["mm", "add"] + (["act"] if "act" in c else [])
    return rw.fuse(op, ins, attrs, absorbed=[c.id(r) for r in roles], result=c.id(roles[-1]))


BIAS_ACT = Rule(
    "fuse_matmul_bias_act.bias_act", LINEAR,
    steps=(
        _not_residual,
        single_user("mm", "mm_single_user", "make the matmul feed only its bias add"),
        not_output("mm", "mm_not_output"),
        replace(rank_le("bias", 1, "bias_rank", BIAS_VECTOR_HINT,
                        "none: FusedMatMulBiasAct adds a bias along the output width only"),
                reads=("mm",), no_model_fix=_bias_vector_why),
        guard("bias_length", _bias_len_ok,
              lambda c: f"{c.d('bias')} has shape {list(c['bias'].shape)}; needs [] , [1] or "
                        f"[{c['mm'].shape[-1]}] (the matmul's output width)", BIAS_VECTOR_HINT, requires=("bias", "mm"),
              kind=NOT_RECOGNIZED, fix="none: FusedMatMulBiasAct adds a bias along the output width only",
              no_model_fix=_bias_vector_why),
        Soft(_epilogue),
    ),
    result=("act", "add"), absorb=("mm", "add", "act"), rewrite=_fmba_rewrite,
    core=LINEAR_CORE,
    doc=f"act(x @ w + bias) -> FusedMatMulBiasAct (activation from the allow-list {', '.join(EPILOGUE_ACTIVATIONS)})")

def _zero_bias_rewrite(c: Ctx, rw: Rewriter) -> int:
    """FusedMatMulBiasAct(x, w, expand(0.0, [N]), activation=act): the bias-less linear with its epilogue."""
    mm, act = c["mm"], c["act"]
    absorbed = [mm.id, act.id]
    with rw.provenance(absorbed):
        zero = rw.expand(rw.const(0.0, mm.dtype), (mm.shape[-1],))
    return rw.fuse(Op.FUSED_MATMUL_BIAS_ACT, [c.id("x"), c.id("w"), zero], {"activation": act.op.value},
                   absorbed=absorbed, result=act.id)


_EPILOGUE_OPS = frozenset(Op(a) for a in EPILOGUE_ACTIVATIONS)


@reports(reads=("act",))
def _not_gate(c: Ctx) -> Fail | None:
    """A gating activation (GLU: `act(x @ w_g) * (x @ w_u)`) is not a candidate (quiet): it is left to
    `fuse_swiglu` and to the unrecognized-GLU report, which a zero-bias linear would hide."""
    return QUIET if any(u.op == Op.MUL for u in c.users("act")) else None


ZERO_BIAS_ACT = Rule(
    "fuse_matmul_bias_act.zero_bias_act",
    P(_EPILOGUE_OPS, P(Op.MATMUL, P.var("x"), P.var("w"), name="mm"), name="act"),
    steps=(
        _not_gate,
        single_user("mm", "mm_single_user", "make the matmul feed only its activation"),
        not_output("mm", "mm_not_output"),
    ),
    result="act", absorb=("mm", "act"), rewrite=_zero_bias_rewrite,
    core=LINEAR_CORE,
    doc="act(x @ w) with no bias (GPT-style FC1) -> FusedMatMulBiasAct with a zero bias (exact: x + 0 == x), "
        f"activation from the allow-list {', '.join(EPILOGUE_ACTIVATIONS)}")

# -- a scale between the matmul and its bias (weight-only quantization's dequantize scale) -------------------------

def _static(g: Graph, i: int) -> bool:
    """`i` is a param or constant, through casts, reshapes and expands (a weight-side value, not the input's)."""
    n = g[i]
    while n.op in (Op.CAST, Op.RESHAPE, Op.EXPAND) and n.inputs:
        n = g[n.inputs[0]]
    return n.op in (Op.PARAM, Op.CONST)


def _column_scale(bias: bool) -> Callable[[Ctx], Fail | None]:
    @reports(reads=("mm", "scale", "scale_mul", *(("bias",) if bias else ())), optional=("bias",))
    def column_scale(c: Ctx) -> Fail | None:
        """Only a weight-side scale of the matmul's output columns is this near-miss (quiet otherwise): a scalar or
        a `[N]` (`[1, .., 1, N]`) static vector, N the matmul's width, on a rank-2 weight; the mul's output is the
        matmul's shape (the scale does not broadcast it larger); the bias (if any) a scalar or `[N]`. Attention
        scores (`q @ k^T * c + mask`: a 4-D weight-less matmul, a mask of rank > 1) and a scaled LoRA branch added
        to the base projection (a full-size add) are never this."""
        mm, sc = c["mm"], c["scale"]
        n = mm.shape[-1] if mm.shape else 0
        per_column = all(d == 1 for d in sc.shape[:-1]) and (not sc.shape or sc.shape[-1] in (1, n))
        ok = (c.graph[mm.inputs[1]].rank == 2 and per_column and c["scale_mul"].shape == mm.shape
              and _static(c.graph, c.id("scale")) and (not bias or c["bias"].shape in ((), (1,), (n,))))
        return None if ok else QUIET
    return column_scale


def _scale_explain(c: Ctx) -> str:
    sc, after = c["scale"], c.d("add") if "add" in c else c.d("act")
    what = "per-output-channel" if sc.shape and sc.shape[-1] > 1 else "scalar"
    return (f"{c.d('scale_mul')} multiplies {c.d('mm')} by {c.d('scale')}, a {what} {sc.dtype}{list(sc.shape)} "
            f"scale (a dequantize scale of weight-only quantization), between the matmul and {after}; "
            f"FusedMatMulBiasAct computes act(x @ w + bias) and has no scale, so this matmul stays a "
            f"separate op and the mul, the bias and the activation run as elementwise ops")


_SCALE_FIX = ("an epilogue scale operand for FusedMatMulBiasAct (act(x @ w * s + bias), exact), or fold the scale "
              "into the weight columns (x @ (w * s): a rounding-level change, to be shown as its own rewrite)")


def _scale_guard(after: str) -> Guard:
    return guard("scale_before_bias" if after == "add" else "scale_before_act", lambda c: False, _scale_explain,
                 "nothing to change in the model: the scale is the quantized weight's own (moving it onto the "
                 "weight changes the rounding)", requires=("scale_mul", "mm", "scale"), reads=(after,),
                 kind=NOT_RECOGNIZED, fix=_SCALE_FIX, subject=lambda c: c.id("scale_mul"), optional=("add", "act"))


_SCALE_LABELS = {"mm": "the matmul", "scale_mul": "the scale mul", "scale": "the scale"}
_SCALED_MM = P(Op.MUL, P(Op.MATMUL, P.var("x"), P.var("w"), name="mm"), P.var("scale"), name="scale_mul",
               commutative=True)

SCALE_BIAS = Rule(
    "fuse_matmul_bias_act.scale_before_bias",
    P(Op.ADD, _SCALED_MM, P.var("bias"), name="add", commutative=True),
    steps=(_column_scale(True), _scale_guard("add")),
    result="add", absorb=("mm", "scale_mul", "add"), rewrite=lambda c, rw: c.id("add"),
    core=LINEAR_CORE,
    labels={**_SCALE_LABELS, "add": "its bias add"},
    doc="act(x @ w * s + bias), s a weight-side scalar or per-column scale (a dequantize scale): named, not fused "
        "(FusedMatMulBiasAct has no scale)")

SCALE_ACT = Rule(
    "fuse_matmul_bias_act.scale_before_act",
    P(_EPILOGUE_OPS, _SCALED_MM, name="act"),
    steps=(_column_scale(False), _scale_guard("act")),
    result="act", absorb=("mm", "scale_mul", "act"), rewrite=lambda c, rw: c.id("act"),
    core=LINEAR_CORE,
    labels={**_SCALE_LABELS, "act": "its activation"},
    doc="act(x @ w * s) with no bias, s a weight-side scale: named, not fused (FusedMatMulBiasAct has no scale)")

# -- a bias added after the residual (ONNX Runtime's SkipLayerNormalization order) -----------------------------------

@reports(reads=("mm", "w", "residual", "sum", "bias", "add"))
def _residual_then_bias(c: Ctx) -> Fail | None:
    """Only a linear whose bias is added after a residual is this near-miss (quiet otherwise): a rank-2 weight-side
    weight, the matmul read by the residual add alone, the residual a computed tensor of the matmul's shape, the bias
    a weight-side scalar or `[N]` vector of the matmul's width. An add of two computed terms (attention scores and
    their mask, a LoRA branch) is never this. Nor is a sum and bias add read by one norm alone (post-LN, or the
    final norm): `fuse_residual_ln.biased` takes the residual and the bias into FusedResidualLN (has_bias) there."""
    mm, res, b = c["mm"], c["residual"], c["bias"]
    ok = (c["w"].rank == 2 and _static(c.graph, c.id("w")) and len(c.users("mm")) == 1
          and res.shape == mm.shape and not _static(c.graph, c.id("residual"))
          and b.shape in ((), (1,), (mm.shape[-1],)) and _static(c.graph, c.id("bias")))
    return None if ok and not _norm_takes_bias(c) else QUIET


_NORMS = frozenset((Op.LAYER_NORM, Op.RMS_NORM))


def _norm_takes_bias(c: Ctx) -> bool:
    """Whether the residual sum and its bias add each have one reader, the bias add's a norm of it: the form
    `fuse_residual_ln.biased` (and its RMSNorm twin) fuses with the bias, so the linear's bias is fused after all."""
    users = c.users("add")
    return (len(c.users("sum")) == 1 and len(users) == 1 and users[0].op in _NORMS
            and users[0].inputs[0] == c.id("add") and not c.graph.is_output(c.id("add")))


def _after_residual_explain(c: Ctx) -> str:
    return (f"{c.d('add')} adds {c.d('bias')}, the bias of {c.d('mm')}, after {c.d('sum')} added the residual "
            f"((x @ w + skip) + bias: the order of ONNX Runtime's SkipLayerNormalization, whose bias input the file's "
            f"optimizer moved the linear's bias into); FusedMatMulBiasAct computes act(x @ w + bias) and takes no "
            f"residual, so it does not take this linear; FusedResidualLN takes such a bias (has_bias) only where a "
            f"norm is the bias add's one reader, and here it has {len(c.users('add'))} readers")


BIAS_AFTER_RESIDUAL_FIX = ("a FusedMatMulBiasAct with a residual operand added before its bias (act((x @ w + skip) + "
                           "bias), exact), or a FusedResidualLN that takes the bias where the layout lets it "
                           "(has_bias)")
"""The compiler fix of a linear whose bias sits after the residual add (`bias_after_residual`); its first clause is
the op form rlxviz lacks (`why.policy.fix_gap_form`)."""

BIAS_AFTER_RESIDUAL_HINT = (f"{NOTHING_TO_CHANGE}: " + rounding_not_offered(
    "adding the bias before the residual ((x @ w + bias) + skip, the form FusedMatMulBiasAct takes)",
    "it rounds differently from the file's (x @ w + skip) + bias"))

BIAS_AFTER_RESIDUAL = Rule(
    "fuse_matmul_bias_act.bias_after_residual",
    P(Op.ADD, P(Op.ADD, P(Op.MATMUL, P.var("x"), P.var("w"), name="mm"), P.var("residual"), name="sum",
                commutative=True), P.var("bias"), name="add", commutative=True),
    steps=(_residual_then_bias,
           guard("bias_after_residual", lambda c: False, _after_residual_explain, BIAS_AFTER_RESIDUAL_HINT,
                 requires=("add", "mm", "bias", "sum"), kind=NOT_RECOGNIZED, fix=BIAS_AFTER_RESIDUAL_FIX,
                 subject=lambda c: c.id("add"))),
    result="add", absorb=("mm", "sum", "add"), rewrite=lambda c, rw: c.id("add"), taken_later=("mm",),
    core=LINEAR_CORE,
    labels={"mm": "the matmul", "sum": "the residual add", "add": "the bias add", "bias": "the bias",
            "residual": "the residual"},
    doc="(x @ w + skip) + bias, the linear's bias added after the residual (ONNX Runtime's SkipLayerNormalization "
        "order): named, not fused (FusedMatMulBiasAct takes no residual)")

fuse_matmul_bias_act = rule_pass("fuse_matmul_bias_act", [BIAS_ACT, ZERO_BIAS_ACT, SCALE_BIAS, SCALE_ACT,
                                                         BIAS_AFTER_RESIDUAL],
                                 f"matmul + bias (+ {'/'.join(EPILOGUE_ACTIVATIONS)}) -> FusedMatMulBiasAct; a "
                                 f"bias-less matmul + {'/'.join(EPILOGUE_ACTIVATIONS)} with a zero bias",
                                 product="FusedMatMulBiasAct", recognizes_families=("activation",))

__all__ = ["BIAS_ACT", "ZERO_BIAS_ACT", "fuse_matmul_bias_act"]
