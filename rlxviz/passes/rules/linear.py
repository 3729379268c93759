"""Linear-layer fusions: `fuse_matmul_bias_act` and `fuse_shared_input_matmul`.

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

`fuse_shared_input_matmul` (§2.3.7): matmuls sharing an lhs `x` (Q/K/V) -> one matmul over a
`concat` of the weights + `narrow`s. Weights stay as they are: the concatenation is a new `concat`
node of the original params (so checkpoints load unchanged and every weight keeps its name); the
MLX runtime can constant-fold it. Unlike RLX, biases are merged too: when every matmul's single
user is `add(matmul, bias[N_i])`, the biases are concatenated and one `add` follows the merged
matmul, so Hugging Face Q/K/V (which all have biases) reach RLX's packed-QKV form and later the
attention-block and layer fusions. This is why our pipeline runs this pass *before*
`fuse_matmul_bias_act` (RLX runs it after, so biased Q/K/V never merge).

Validity (numbers equal for every input, up to GEMM summation order): `FusedMatMulBiasAct` is
`act(x @ w + bias)`, the matched ops in the same order; the bias broadcasts the same way because it is
a scalar or a `[N]` vector of the matmul's width (guards `bias_rank`, `bias_length`); an `add` of two
full-size tensors is a residual, never taken for a bias. The shared-input merge computes
`x @ concat(w_i)` and narrows each `[.., N_i]` back: each column is the same dot product, for rank-2
weights of one dtype (guards `weights_rank2`, `weights_same_dtype`; a batched weight would concatenate
along the wrong axis), and merged biases are `[N_i]` vectors concatenated in the same order. A zero bias
(`zero_bias_act`, the merge's zero slots) is exact: `y + 0 == y` for every y (finite, infinite or NaN;
-0.0 + 0 gives +0.0, which compares equal), so `act(x @ w + 0)` is `act(x @ w)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ...ir import Graph, Node, Op, Rewriter
from ...ir.infer import TensorType
from ...ir.ops import ACTIVATIONS
from ..activations import SQUARED_RELU, activation_of, owns_users
from ..engine import rule_pass, same_for_readers
from ..guard import (
    DOES_NOT_PAY,
    EPILOGUE_ACTIVATIONS,
    ILLEGAL,
    NO_MODEL_FIX,
    NOT_PROFITABLE,
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
    use_count,
)
from ..pattern import P, describe
from ..rule import QUIET, Fail, Rule, Soft, reports

# -- fuse_matmul_bias_act ------------------------------------------------------------------------

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
                    "compiler", subject=form.out, kind=NOT_RECOGNIZED,
                    fix=f"an op for {form.name} and a fused {form.name} epilogue in the allow-list")
    if len(users) != 1 or users[0].op.value not in {a.value for a in _ACTS}:
        return QUIET  # no activation epilogue to absorb: not a near-miss
    act = users[0]
    if act.op.value not in EPILOGUE_ACTIVATIONS:
        return Fail("guard", "epilogue_activation",
                    f"{c.d('add')} feeds {act.op.value} (node {act.id}); the epilogue allow-list is "
                    f"{', '.join(EPILOGUE_ACTIVATIONS)}, so the linear is fused without activation",
                    (act.id,), ((c.id("add"), act.id),),
                    activation_hint(act.op.value), subject=act.id, kind=NOT_RECOGNIZED,
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
    labels={**_SCALE_LABELS, "add": "its bias add"},
    doc="act(x @ w * s + bias), s a weight-side scalar or per-column scale (a dequantize scale): named, not fused "
        "(FusedMatMulBiasAct has no scale)")

SCALE_ACT = Rule(
    "fuse_matmul_bias_act.scale_before_act",
    P(_EPILOGUE_OPS, _SCALED_MM, name="act"),
    steps=(_column_scale(False), _scale_guard("act")),
    result="act", absorb=("mm", "scale_mul", "act"), rewrite=lambda c, rw: c.id("act"),
    labels={**_SCALE_LABELS, "act": "its activation"},
    doc="act(x @ w * s) with no bias, s a weight-side scale: named, not fused (FusedMatMulBiasAct has no scale)")

fuse_matmul_bias_act = rule_pass("fuse_matmul_bias_act", [BIAS_ACT, ZERO_BIAS_ACT, SCALE_BIAS, SCALE_ACT],
                                 f"matmul + bias (+ {'/'.join(EPILOGUE_ACTIVATIONS)}) -> FusedMatMulBiasAct; a "
                                 f"bias-less matmul + {'/'.join(EPILOGUE_ACTIVATIONS)} with a zero bias",
                                 product="FusedMatMulBiasAct", recognizes_families=("activation",))

# -- fuse_shared_input_matmul --------------------------------------------------------------------
#
# The cost test: a merge must not destroy a fusion a member takes part in. A member whose bias add feeds
# an activation from the epilogue allow-list would lose its epilogue (the activation would read a narrow
# of the merged sum); a group of three that feeds one attention as Q, K and V is merged alone (in Q/K/V
# order), because anything else in the packed projection makes it wider than 3*H and costs the attention
# block. Refused members are named in a `merge_keeps_fusions` rejection (kind: not profitable; remedy:
# `guard.DOES_NOT_PAY`: the tool's own rule declined it, so it is no near-miss and no layer is NOT fused for it).


def _value(g: Graph, mm: Node) -> int:
    """The member's output as its users see it: its bias add when it has exactly one, else the matmul."""
    us = g.users(mm.id)
    if len(us) == 1 and us[0].op == Op.ADD and not g.is_output(mm.id) and _bias_of(g, us[0], mm) is not None:
        return us[0].id
    return mm.id


def _bias_of(g: Graph, add: Node, mm: Node) -> int | None:
    """The vector bias `[N]` of `mm`'s dtype that `add` adds to `mm`, or None (a bias of another dtype, e.g. bool,
    cannot be concatenated with the others: that add stays a separate user of the member's narrow)."""
    if add.inputs.count(mm.id) != 1:
        return None
    other = add.inputs[1] if add.inputs[0] == mm.id else add.inputs[0]
    return other if g[other].shape == (mm.shape[-1],) and g[other].dtype == mm.dtype else None


def _epilogue_of(g: Graph, mm: Node) -> Node | None:
    """The allow-listed activation `fuse_matmul_bias_act` would absorb into this member, if any (after its
    bias add, or directly after a bias-less matmul: `zero_bias_act`)."""
    v = _value(g, mm)
    if g.is_output(v):
        return None
    us = g.users(v)
    act = us[0] if len(us) == 1 and us[0].op.value in EPILOGUE_ACTIVATIONS else None
    if act is not None and v == mm.id and any(u.op == Op.MUL for u in g.users(act.id)):
        return None  # a bias-less gate: zero_bias_act leaves it (`_not_gate`)
    return act


def _attention_triple(g: Graph, members: list[Node]) -> tuple[Node, list[Node]] | None:
    """`(attention, [q, k, v] members)` when three members feed one attention as its Q, K and V."""
    by_value = {_value(g, m): m for m in members}
    for m in members:
        for u in g.users(_value(g, m)):
            if u.op != Op.ATTENTION or len(u.inputs) < 3:
                continue
            qkv = [by_value.get(i) for i in u.inputs[:3]]
            if all(q is not None for q in qkv) and len({q.id for q in qkv if q is not None}) == 3 and all(
                    len(g.users(i)) == 1 and not g.is_output(i) for i in u.inputs[:3]):
                return u, [q for q in qkv if q is not None]
    return None


def _label(g: Graph, mm: Node) -> str:
    w = g[mm.inputs[1]]
    return describe(mm, f"matmul with {w.name}" if w.name else "matmul")


@reports("merge_keeps_fusions", kind=NOT_PROFITABLE, reads=("x", "mm0"), binds=("mm*", "w*"))
def _group(c: Ctx) -> Fail | None:
    """Bind mm0..mmK, the matmuls reading x as their lhs that may merge; the anchor must be the first reader.

    The cost test refuses members whose merge would cost a fusion (see above); it fails (hard) when fewer
    than two members are left, and otherwise records the refusal (soft) and merges the rest.
    """
    g, x = c.graph, c.id("x")
    group = [u for u in g.users(x) if u.op == Op.MATMUL and u.inputs[0] == x and u.inputs[1] != x]
    if len(group) < 2 or group[0].id != c.id("mm0"):
        return QUIET
    keep, refused = group, []
    if c.params.get("merge_cost_test", True):
        triple = _attention_triple(g, group)
        keep = triple[1] if triple else [m for m in group if _epilogue_of(g, m) is None]
        for m in group:
            if m in keep:
                continue
            costs = []
            act = _epilogue_of(g, m)
            if act is not None:
                costs.append(f"its {act.op.value} epilogue ({act.op.value} node {act.id})")
            if triple:
                att, qkv = triple
                h = sum(q.shape[-1] for q in qkv)
                costs.append(f"the attention block at {describe(att, 'attention')} (Q/K/V packed with it would be "
                             f"{h + m.shape[-1]} wide instead of {h})")
            refused.append((m, " and ".join(costs)))
    for i, m in enumerate(keep):
        c.bindings[f"mm{i}"] = m.id
        c.bindings[f"w{i}"] = m.inputs[1]
    for i in range(len(keep), len(group)):
        c.bindings.pop(f"mm{i}", None)
        c.bindings.pop(f"w{i}", None)
    c.data["n"] = len(keep)
    if not refused:
        return None
    why = "; ".join(f"{_label(g, m)} is not merged: it would cost {cost}" for m, cost in refused)
    ids = tuple(m.id for m, _ in refused)
    hint = "nothing to change in the model: a merge that costs fusions does not pay"
    fix = "a multi-output packed projection whose epilogues apply per slice (PaLM-style QKV+FC1 with one GEMM)"
    if len(keep) < 2:
        left = f" (only {_label(g, keep[0])})" if keep else ""  # e.g. a QKV the model already packs into one matmul
        return Fail("guard", "merge_keeps_fusions", f"{why}; fewer than 2 matmuls would be left to merge{left}", ids,
                    (), hint, subject=ids[0], kind=NOT_PROFITABLE, fix=fix, remedy=DOES_NOT_PAY)
    kept = ", ".join(_label(g, m) for m in keep)
    c.data.setdefault("soft", []).append(
        Fail("guard", "merge_keeps_fusions", f"{why}; merged: {kept}", ids, (), hint, subject=ids[0],
             kind=NOT_PROFITABLE, fix=fix, remedy=DOES_NOT_PAY))
    return None


def _dependent_operand(c: Ctx) -> tuple[int, int] | None:
    """`(operand, member)`: an operand the rewrite merges (a weight, or a vector bias `[N]` added to a member,
    `_bias_of`) computed from a member matmul, else None. Merging it would make the packed weight / bias
    depend on the packed matmul: a cycle. Any other user of a member (`x@W + (x@A)@B`, LoRA: the add of two
    products) is not merged, so what it reads is no dependency of the packed matmul."""
    g = c.graph
    members = {c.id(m) for m in _members(c)}
    for m in _members(c):
        mm = c[m]
        biases = [_bias_of(g, u, mm) for u in c.users(m) if u.op == Op.ADD]
        operands = [c.id(f"w{m[2:]}")] + [b for b in biases if b is not None]
        for start in operands:
            if start in members:  # mm_i + mm_j: no bias, nothing merged into a concat
                continue
            seen, todo = set(), [start]
            while todo:
                i = todo.pop()
                if i in members:
                    return start, i
                if i not in seen:
                    seen.add(i)
                    todo.extend(g[i].inputs)
    return None


def _explain_dependent(c: Ctx) -> str:
    found = _dependent_operand(c)
    assert found is not None
    op, member = found
    return (f"{c.name_of(op)} is computed from {c.name_of(member)}; merged, the packed weight or bias would depend "
            f"on the packed matmul itself (a cycle)")


def _members(c: Ctx) -> list[str]:
    return [f"mm{i}" for i in range(c.data["n"])]


def _weights_rank2(c: Ctx) -> bool:
    return all(c[f"w{i}"].rank == 2 for i in range(c.data["n"]))


def _bad_rank(c: Ctx) -> int:
    return next(i for i in range(c.data["n"]) if c[f"w{i}"].rank != 2)


def _explain_rank2(c: Ctx) -> str:
    bad = _bad_rank(c)
    return f"{c.d(f'w{bad}')} has shape {list(c[f'w{bad}'].shape)}; every weight must be rank 2 [K, N_i]"


def _same_dtype(c: Ctx) -> bool:
    return len({c[f"w{i}"].dtype for i in range(c.data["n"])}) == 1


def _odd_dtype(c: Ctx) -> int:
    first = c["w0"].dtype
    return next((c.id(f"w{i}") for i in range(c.data["n"]) if c[f"w{i}"].dtype != first), c.id("w0"))


def _output_member(c: Ctx) -> str | None:
    return next((r for r in _members(c) if c.graph.is_output(c.id(r))), None)


def _explain_outputs(c: Ctx) -> str:
    r = _output_member(c)
    assert r is not None
    return (f"{_label(c.graph, c[r])} is graph output #{c.graph.outputs.index(c.id(r))}; merged, it would become a "
            f"narrow of the packed projection (the caller asked for this tensor)")


@reports("biases_mergeable", reads=("mm*",), binds=("add*", "b*"))
def _biases(c: Ctx) -> Fail | None:
    """Merge biases (soft: else merge the matmuls alone).

    Every member either has exactly one user `add(mm, bias[N_i])` (its bias) or none: a member without a
    bias gets a zero bias slot (`expand(0.0, [N_i])`: x + 0 == x, so exact). A group where no member has a
    bias merges the matmuls only, silently (LLaMA style).
    """
    g = c.graph
    adds: list[tuple[int, int] | None] = []
    for r in _members(c):
        mm = c[r]
        v = _value(g, mm)
        if v != mm.id:
            add = g[v]
            b = _bias_of(g, add, mm)
            assert b is not None
            adds.append((add.id, b))
            continue
        users = g.users(mm.id)
        bias_like = [u for u in users if u.op == Op.ADD and _bias_of(g, u, mm) is not None]
        if bias_like and (len(users) != 1 or g.is_output(mm.id)):
            return Fail("guard", "biases_mergeable",
                        f"biases not merged: {use_count(g, mm.id, _label(g, mm), lambda j: describe(g[j]))}"
                        f", so its bias add cannot become a slice of one packed bias; the matmuls are merged "
                        f"alone", (mm.id,), (), "let the projection feed only its bias add", subject=mm.id,
                        kind=NOT_RECOGNIZED, fix="give the extra reader a narrow of the unbiased packed product")
        adds.append(None)
    if all(a is None for a in adds):
        return QUIET  # bias-free group (LLaMA-style): nothing to say
    for i, a in enumerate(adds):
        if a is not None:
            c.bindings[f"add{i}"], c.bindings[f"b{i}"] = a
    c.data["biased"] = True
    return None


def _shared_rewrite(c: Ctx, rw: Rewriter) -> int:
    """One matmul over the concatenated weights (+ one add of the concatenated biases) + a narrow per member.
    Returns the merged matmul's id (`Match.fused`): the node that does the work, not its bias add."""
    n = c.data["n"]
    mms = [c.id(f"mm{i}") for i in range(n)]
    biased = c.data.get("biased", False)
    adds = [c.id(f"add{i}") for i in range(n) if f"add{i}" in c]
    with rw.provenance(mms + adds):
        wcat = rw.concat([c.id(f"w{i}") for i in range(n)], axis=1)
        y = merged = rw.matmul(c.id("x"), wcat)
        if biased:
            dtype = next(c[f"b{i}"].dtype for i in range(n) if f"b{i}" in c)
            parts = [c.id(f"b{i}") if f"b{i}" in c else rw.expand(rw.const(0.0, dtype), (c[f"mm{i}"].shape[-1],))
                     for i in range(n)]
            y = rw.add(y, rw.concat(parts, axis=0))
        axis, off = len(rw.shape_of(y)) - 1, 0
        for i in range(n):
            width = c[f"mm{i}"].shape[-1]
            part = rw.narrow(y, axis, off, width)
            off += width
            rw.replace(c.id(f"add{i}") if f"add{i}" in c else mms[i], part)
    rw.remove([c.id(f"mm{i}") for i in range(n) if f"add{i}" in c])
    return merged


SHARED = Rule(
    "fuse_shared_input_matmul.concat_weights", P(Op.MATMUL, P.var("x"), P.var("w0"), name="mm0"),
    steps=(
        _group,
        guard("weights_rank2", _weights_rank2, _explain_rank2, "use [K, N] weights", reads=("w*",),
              subject=lambda c: c.id(f"w{_bad_rank(c)}"), kind=NOT_RECOGNIZED,
              fix="merge batched weights along their last axis"),
        guard("weights_same_dtype", _same_dtype,
              lambda c: "weights have dtypes " + ", ".join(f"{c.d(f'w{i}')}: {c[f'w{i}'].dtype}"
                                                           for i in range(c.data["n"])) + "; needs one dtype",
              "store the projections in one dtype", reads=("w*",), subject=_odd_dtype, kind=NOT_RECOGNIZED,
              fix="merge only the members of one dtype"),
        guard("not_outputs", lambda c: _output_member(c) is None, _explain_outputs,
              "do not return a projection's raw output from the model", reads=("mm*",),
              subject=lambda c: c.id(_output_member(c) or "mm0"), kind=ILLEGAL,
              fix="narrow the returned projection's columns out of the packed product for the caller",
              no_model_fix=lambda c: extra_readers_why(c, r, ()) if (r := _output_member(c)) else None,
              remedy=READ_BY_MODEL),
        guard("operands_independent", lambda c: _dependent_operand(c) is None, _explain_dependent,
              "a projection whose weight is computed from another projection's output cannot share its matmul",
              reads=("mm*", "w*"), subject=lambda c: (_dependent_operand(c) or (c.id("w0"),))[0], kind=ILLEGAL),
        Soft(_biases),
    ),
    result="mm0", absorb=(), rewrite=_shared_rewrite,
    doc="matmuls sharing an input -> one matmul over concat(weights) (+ concat(biases), zero slots for bias-less "
        "members) + narrows; never merges a matmul whose merge would cost a fusion (an epilogue, the attention "
        "block)")

SHARED_PRODUCT = "shared-input matmul"
QKV_PRODUCT = "shared-input QKV matmul"
_SLICE_HOPS = 8
"""Nodes a merged slice is followed through (reshapes, transposes, a rotation, a scale) to the attention reading it."""


def _first_readers(g: Graph, start: int) -> set[tuple[int, int]]:
    """`(node, operand slot)` of the first attention or matmul nodes that read `start`'s value, through at most
    `_SLICE_HOPS` other nodes (its reshapes, transposes, RoPE, a scale)."""
    hits: set[tuple[int, int]] = set()
    seen, frontier = {start}, [start]
    for _ in range(_SLICE_HOPS):
        nxt = []
        for i in frontier:
            for u in g.users(i):
                if u.op in (Op.ATTENTION, Op.MATMUL):
                    hits |= {(u.id, k) for k, j in enumerate(u.inputs) if j == i}
                elif u.id not in seen:
                    seen.add(u.id)
                    nxt.append(u.id)
        frontier = nxt
    return hits


def merged_product(g: Graph, merged: int) -> str:
    """What a merge of `fuse_shared_input_matmul` is, by what its slices feed (`g`: the graph after the pass,
    `merged`: the merged matmul, `Match.fused`): `shared-input QKV matmul` when its three slices are the q, k and v
    of one attention (operands 0, 1, 2 of an `attention` node, or of the primitive form: q and k the two operands of
    the scores matmul, v the right operand of another matmul); else `shared-input matmul` (a router and a gate, an
    MLP's up projections)."""
    if merged not in g:
        return SHARED_PRODUCT
    out = [u.id for u in g.users(merged) if u.op == Op.ADD] or [merged]
    slices = [u.id for o in out for u in g.users(o) if u.op == Op.NARROW]
    if len(slices) != 3:
        return SHARED_PRODUCT
    hits = [_first_readers(g, s) for s in slices]
    attn = set.intersection(*({n for n, k in h if g[n].op == Op.ATTENTION} for h in hits))
    if any(sorted(k for h in hits for n, k in h if n == a) == [0, 1, 2] for a in attn):
        return QKV_PRODUCT
    for q, k, v in ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)):
        scores = {n for n, s in hits[q] if s == 0 and g[n].op == Op.MATMUL} & \
                 {n for n, s in hits[k] if s == 1 and g[n].op == Op.MATMUL}
        context = {n for n, s in hits[v] if s == 1 and g[n].op == Op.MATMUL} - scores
        if scores and context:
            return QKV_PRODUCT
    return SHARED_PRODUCT


fuse_shared_input_matmul = rule_pass("fuse_shared_input_matmul", [SHARED],
                                     "projections of one input (Q/K/V, a router and a gate) -> one matmul + narrows "
                                     "(biases merged; cost test keeps epilogues and the attention block)",
                                     product=SHARED_PRODUCT, product_of=merged_product,
                                     quantization=("attention", "the merged matmul is the attention's Q/K/V "
                                                                "projections, quantized with the attention"))

__all__ = ["BIAS_ACT", "QKV_PRODUCT", "SHARED", "SHARED_PRODUCT", "ZERO_BIAS_ACT", "fuse_matmul_bias_act",
           "fuse_shared_input_matmul", "merged_product"]
