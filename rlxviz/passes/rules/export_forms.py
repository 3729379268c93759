"""`canonicalize_exported`: the forms exporters write, rewritten to the ops the fusion rules match.

The ONNX importer maps each ONNX node one to one; what used to be rewritten while reading (out of the trace:
no match record, no near-miss, nothing to toggle) is a rule here, at the head of the pipeline:

* `canonicalize_exported.silu`: `x * sigmoid(x)` (torch.onnx's silu) -> `silu(x)`. Exact: the IR defines
  `silu(x)` as that product (reference and MLX).
* `canonicalize_exported.relu2`: squared ReLU as exporters write it (Primer, Nemotron: `relu(x) * relu(x)` with
  one relu node read twice, or `pow(relu(x), 2)`; `activations.activation_form` recognizes both) -> `relu2(x)`,
  the op `fuse_matmul_bias_act` takes as an epilogue. Exact: the IR defines `relu2(x)` as `r * r` with `r =
  relu(x)` (reference and MLX, in x's dtype); `pow(r, 2)` is `r * r` on the reference (NumPy squares for
  exponent 2) and on MLX's CPU (`powf` of an exact square, representable before rounding, rounds it as the
  product does). Only a square of x's dtype and shape (a `[1]` exponent that would broadcast a scalar, or a
  wider exponent dtype, is no record); a relu read by anything else stays (`absorbed_escape`).
* `canonicalize_exported.activation_op`: `x * sigmoid(k * x)` with `k != 1` (QuickGELU `k = 1.702`, Swish with beta
  k; `activations.activation_form`), which no IR op computes: named, never rewritten (guard `activation_op`, not
  recognized, remedy compiler only: a gap in rlxviz's ops, the compiler fix an op for it). A linear's own activation
  is left to `fuse_matmul_bias_act`'s `epilogue_activation`, which names the same gap as its epilogue.
* `canonicalize_exported.rsqrt`: `1 / sqrt(y)` (torch.onnx writes `torch.rsqrt` as Reciprocal(Sqrt)) ->
  `rsqrt(y)`. Exact on the reference (its rsqrt is `1 / sqrt`); MLX's rsqrt kernel may round the last bit
  differently (within every tolerance of `runtime.precision`).
* `canonicalize_exported.where_bias`: `scores + where(keep, 0, finfo(f32).min)` (transformers' padding mask
  as torch.onnx exports it) -> `where(keep, scores, finfo(f32).min)`, the form `fuse_sdpa`'s where-mask rule
  matches. Exact where keep is true (`s + 0 == s`); where it is false, `s + min` rounds to `min` for every
  |s| < 2^103 (~1e31: min's ulp is 2^104), the value `where` puts there; guards: the fills are exactly 0 and
  the lowest value of the mask's own dtype (`bias_fills`: `finfo(dtype).min`, which transformers writes in the
  scores' dtype: f32's, f16's -65504, bf16's), that fill absorbs every realistic score (`fill_absorbs`, the model's
  own term: f16's -65504 has step 32, so `s + -65504` is the fill only for |s| < 16 and -inf for s <= -16; the sum
  is no where there, a fully masked row differs, and the attention takes it as its additive operand as it is),
  scores f32 (`scores_f32`: bf16's sum is a where for |s| < 2^119, but `fuse_sdpa` takes no bf16 where fill, a gap
  in rlxviz's ops), the bias does not widen the scores (`bias_no_widen`).
* `canonicalize_exported.nan_guard`: `where(isnan(p), 0, p)` with `p = softmax(s)` (torch's sdpa export guards
  fully masked rows so) -> `p`. Exact when no score is NaN or infinite: softmax subtracts the row max, so the
  denominator is >= 1 and no output is NaN. Inputs are finite (every front end checks them) and the exporters'
  masks fill with f32's min, so the guard `scores_finite` refuses only a constant fill of -inf/+inf/NaN among
  the nodes computing `s` (there a fully masked row is NaN and the guard gives 0: the rewrite would change it).
* `canonicalize_exported.nan_guard_moved`: the same guard where the scores do read a -inf fill (TorchScript's sdpa
  export: `where(m, [0], [-inf])`, its 0 a `[1]` tensor) and `P @ V` reads it -> `where(isnan(o), 0, o)` after the
  head merge `o = merge(softmax(s) @ v)`, so the attention packs. Exact for finite Q, K, V: a row that is not fully
  masked has a finite max, so its softmax and `P @ V` are finite and both forms pass them unchanged; a fully masked
  row is NaN in every softmax entry, the guard makes it 0 and `0 @ V` is +0 in each of the row's outputs, where the
  unguarded product is NaN in exactly those outputs, which the moved guard makes +0; the merge's transpose and
  reshape carry each element unchanged.
(torch's sdpa split scale, `(q * sqrt(s)) @ (k^T * sqrt(s))`, needs no rule here: `fuse_sdpa.hoist_scale` moves
K's scale next to its head split, bit-exact, and `fuse_sdpa` folds both pre-scales into the attention's scale.)

* `canonicalize_exported.folded_transpose`: `reshape(transpose(reshape(x, [B*H, S, d]), [0, 2, 1]), [B, H, d, S])`
  (a transpose written on heads folded into the batch, as torch's sdpa decomposition writes `k.transpose(-2,
  -1)`) -> `transpose(x, [0, 1, 3, 2])`; when the outer reshape groups the leading axes otherwise (GQA's
  `[B, Hkv, rep, S, d]` folded to `[B*H, S, d]` and split to `[B, H, d, S]`), `transpose(reshape(x, [B, H, S, d]))`.
  Exact (data movement only: merging or regrouping leading axes keeps the row-major order of the trailing ones).
  Matched only when the inner reshape merges leading axes of x into axis 0 and keeps the rest, the transpose keeps
  axis 0 and the outer reshape splits axis 0 into leading axes of the same product (any other reshape/transpose
  chain is another layout: no record).
* `canonicalize_exported.bias_then_mask`: `(s + bias) + where(keep, 0, finfo(f32).min)` with `s` a (scaled) score
  matmul (T5: a relative position bias, then the padding mask) -> `s + (bias + where(keep, 0, min))`, one additive
  score term the attention takes as its operand. Exact where kept (`+ 0`); where masked, both sides round to `min`
  for |s|, |bias| < 2^103 (min's ulp is 2^104). Guards as `where_bias` (`bias_fills`, `fill_absorbs`: here illegal,
  f16's sums round otherwise when reassociated, `scores_f32`); only a sum with a score-matmul operand is this form
  (anything else: no record). `where_bias` leaves such a sum to it.
* `canonicalize_exported.bias_then_table_mask`: `(s + a) + b` (either order at both adds) with `s` a (scaled) score
  matmul and one of the terms a mask table folded at import (a param or const whose values the graph carries, every
  entry 0 or a saturating fill: its own dtype's lowest value, `finfo(dtype).min`, which transformers writes in the
  scores' dtype, or -inf; T5's decoder: its relative position bias, then the causal mask folded to a `[B, 1, S, S]`
  table) -> `s + (a + b)`, one additive score term. Exact for f32 with |s|, |a|, |b| < 2^102 (no real-valued score
  is near): where the table holds 0 both sides are `s + t` for the other term t (`x + 0 == x`); where it holds the
  fill both sides round to the fill (min's ulp is 2^104, so min absorbs any addend below 2^103; -inf absorbs every
  finite one). The same holds in bf16 (its min absorbs |x| < 2^119) and, for a table of 0 and -inf, in any float
  dtype where `s + a` does not overflow; not for f16's min, which absorbs only |x| < 16 (`(s + a) + min` and
  `s + (a + min)` round differently: s = a = 10 gives -65472 and -65504). Guards: `mask_table` (one term is such a
  table: two real-valued terms reassociated round differently, illegal), `fill_absorbs` (the table's fill absorbs
  every realistic sum: f16's min does not, illegal), `scores_f32` (the rule rewrites f32 only; for bf16, or a -inf
  table in f16, the same rewrite would be exact: its fix), `terms_no_widen` (the terms broadcast to the scores'
  shape, which the attention's additive operand needs).
* `canonicalize_exported.inverted_where`: `where(eq(b, false), x, y)` or `where(ne(b, true), x, y)` with b bool
  (torch's `scores.masked_fill(~mask, min)` as exported: the mask inverted by a comparison) -> `where(b, y, x)`.
  Exact: for a bool b, `eq(b, false)` and `ne(b, true)` are `not b` element for element, and `where(not b, x, y)`
  picks what `where(b, y, x)` picks.
* `canonicalize_exported.noop_cast`: `cast(x, dtype)` where x already has that dtype (the TorchScript exporter
  writes a `Cast` to f32 after each f32 softmax) -> `x`. Exact: the IR's cast of a value to its own dtype is the
  identity (reference: `astype` to the same dtype; MLX: `astype` likewise).

Validity (numbers equal for every input each rule accepts): every rule above states its own condition after
"Exact"; the conditions a graph could break are guards (`bias_fills`, `fill_absorbs`, `scores_f32`,
`bias_no_widen`, `scores_finite`), and any other shape of the form is no record at all.

Left in the importer (it needs constant values): `x + 0` with an all-zero constant. transformers' RoPE with
constant tables is `fuse_sdpa.rope_heads` / `.rope_pairs`', which read the small param values the graph carries
(`Graph.values`).
"""

from __future__ import annotations

import math

from ...ir import DType, Graph, Node, Op, Rewriter
from ...ir.infer import broadcast
from ..activations import OP_GAP_HINT, SQUARED_RELU, activation_form, epilogue_blocker, has_op, op_fix, owns_users
from ..engine import rule_pass
from ..guard import EPILOGUE_ACTIVATIONS, ILLEGAL, MODEL_TERM, NOT_RECOGNIZED, Ctx, guard
from ..pattern import P, const_value, is_const
from ..refusal_kinds import COMPILER_ONLY
from ..rule import QUIET, Fail, Rule, reports
from .head_layout import remove_shared
from .table_mask import (
    BIAS_THEN_TABLE_MASK,
    TWO_TERMS_FIX,
    absorbs_guard,
    const_entries,
    fill_absorbs,
    is_score_matmul,
    lowest,
)


def _const_is(v: float):  # noqa: ANN202 - a pattern predicate
    def check(node) -> bool:  # noqa: ANN001
        return is_const(node) and const_value(node) == v
    check.__doc__ = f"the constant {v:g}"
    return check


SILU = Rule(
    "canonicalize_exported.silu",
    P(Op.MUL, P.var("x"), P(Op.SIGMOID, P.var("x"), name="sig"), name="mul", commutative=True),
    steps=(), result="mul", absorb=("sig", "mul"),
    build=lambda c: (Op.SILU, [c.id("x")], {}),
    doc="x * sigmoid(x) -> silu(x)", form="silu")

@reports(reads=("relu",), binds=("sq",))
def _squared(c: Ctx) -> Fail | None:
    """Bind `sq`, the reader of the relu that squares it (`activation_form`: `r * r` or `pow(r, 2)`)."""
    r = c["relu"]
    for u in c.users("relu"):
        f = activation_form(c.graph, u)
        if f is not None and f.name == SQUARED_RELU and u.dtype == r.dtype and u.shape == r.shape:
            c.bindings["sq"] = u.id
            return None
    return QUIET


RELU2 = Rule(
    "canonicalize_exported.relu2", P(Op.RELU, P.var("x"), name="relu"),
    steps=(_squared,), result="sq", absorb=("relu", "sq"),
    build=lambda c: (Op.RELU2, [c.id("x")], {}),
    doc="relu(x) * relu(x) or pow(relu(x), 2) -> relu2(x)", form="relu2")


@reports("activation_op", reads=("out",))
def _no_op_for_it(c: Ctx) -> Fail | None:
    """An activation written as primitives that no IR op computes (`activations.has_op`: QuickGELU, Swish with a
    beta other than 1) is a gap in rlxviz's ops: named here, never rewritten (quiet for any other product, for the
    forms `silu` / `relu2` take, and for a linear's activation, which `fuse_matmul_bias_act`'s `epilogue_activation`
    names as the same gap)."""
    g = c.graph
    form = activation_form(g, c["out"])
    if form is None or has_op(form):
        return QUIET
    x = g[form.x]
    if x.op == Op.ADD and any(g[i].op == Op.MATMUL for i in x.inputs) and owns_users(g, form):
        return QUIET  # the linear's epilogue refusal names it (`FusedMatMulBiasAct with a ... epilogue`)
    why = (blocker := epilogue_blocker(g, form)) or f"the epilogue allow-list is {', '.join(EPILOGUE_ACTIVATIONS)}"
    return Fail("guard", "activation_op",
                f"{form.describe()} is an activation written as primitives, ending at {c.d('out')}: rlxviz has no "
                f"op for it, and no fused op takes it: {why}, so it stays as primitives",
                form.nodes, tuple((form.x, i) for i in form.nodes if form.x in g[i].inputs), OP_GAP_HINT,
                subject=form.out, kind=NOT_RECOGNIZED, remedy=COMPILER_ONLY, fix=op_fix(form, blocker))


ACTIVATION_OP = Rule(
    "canonicalize_exported.activation_op", P(Op.MUL, P.var("a"), P.var("b"), name="out"),
    steps=(_no_op_for_it,), result="out", absorb=("out",), rewrite=lambda c, rw: c.id("out"),
    labels={"out": "the product x * sigmoid(k x)"},
    doc="x * sigmoid(k * x) with k != 1 (QuickGELU, Swish with beta k): no op computes it; named, not rewritten "
        "(a gap in rlxviz's ops)",
    form="QuickGELU / Swish, named only")  # never said: the rule never matches (a layer names matched forms)

RSQRT = Rule(
    "canonicalize_exported.rsqrt",
    P(Op.DIV, P.var("one", where=_const_is(1.0), what="the constant 1"), P(Op.SQRT, P.var("y"), name="root"),
      name="div"),
    steps=(), result="div", absorb=("root", "div"),
    build=lambda c: (Op.RSQRT, [c.id("y")], {}),
    doc="1 / sqrt(y) -> rsqrt(y)", form="rsqrt")


def _zero_fill(node: Node) -> bool:
    """The constant 0 as a scalar or a one-element `[1]` tensor (TorchScript writes `[0.0]`): where it fills a rank
    >= 1 value it broadcasts to that value's shape either way."""
    return const_entries(node) == (0.0,) and node.rank <= 1


_zero_fill.__doc__ = "the constant 0"


def _fills_ok(c: Ctx, mask: str) -> bool:
    low = lowest(c, mask)
    return const_value(c["zero"]) == 0.0 and low is not None and const_value(c["fill"]) == low[0]


def _padding_mask(name: str) -> P:
    """`where(keep, 0, fill)` with scalar-constant fills: transformers' padding mask as torch.onnx exports it."""
    return P(Op.WHERE, P.var("keep"), P.var("zero", where=is_const, what="a scalar constant"),
             P.var("fill", where=is_const, what="a scalar constant"), name=name)


def _fills_guard(mask: str, fix: str):  # noqa: ANN202 - a Guard
    """`bias_fills`: the mask role `mask` fills exactly 0 where kept and its own dtype's lowest value where masked
    (`finfo(dtype).min`: f32's, f16's -65504, bf16's; transformers writes the fill in the scores' dtype)."""
    return guard("bias_fills", lambda c: _fills_ok(c, mask),
                 lambda c: f"{c.d(mask)} fills {const_value(c['zero']):.9g} where kept and "
                           f"{const_value(c['fill']):.9g} where masked; needs 0 and " + (
                               f"finfo({c[mask].dtype}).min ({lowest(c, mask)[0]:.9g}), the lowest value of its "
                               f"dtype" if lowest(c, mask) else f"a float dtype's lowest value ({c[mask].dtype})"),
                 requires=(mask, "zero", "fill"), kind=NOT_RECOGNIZED, fix=fix)


@reports(reads=("s",))
def _not_biased_scores(c: Ctx) -> Fail | None:
    """`(scores + bias) + mask` is `bias_then_mask`'s form, not this one's."""
    return QUIET if _biased_scores(c.graph, c["s"]) else None


SCORES_DTYPE_FIX = ("a where mask in the mask's own dtype: for bf16 scores, fuse_sdpa's with a bf16 fill (bf16's min "
                    "absorbs every |s| < 2^119, in the reference's f32 every |s| < 2^103); for scores narrower than "
                    "the mask, the where on the scores cast to it")
"""The compiler fix of `scores_f32`: the fill is recognized in the mask's own dtype (`bias_fills`), f16's stays the
model's own term (`fill_absorbs`), bf16's where is one `fuse_sdpa`'s `where_mask_fill` refuses."""


def _scores_ok(c: Ctx, *terms: str) -> bool:
    """The scores (and `terms`, the mask last) are f32, or all in the mask's f16, which `fill_absorbs` refuses."""
    dts = {c[t].dtype for t in ("s", *terms)}
    return dts == {DType.f32} or (not fill_absorbs(c, terms[-1]) and dts == {c[terms[-1]].dtype})


def _scores_why(c: Ctx, *terms: str) -> str:
    got = " and ".join(f"{c.d(t)} {c[t].dtype}" for t in ("s", *terms))
    if len({c[t].dtype for t in ("s", *terms)}) > 1:
        return f"{got}: the sum is in another dtype than the scores; needs f32 scores and mask"
    return f"{got}; needs f32: the rewrite is made for f32 scores (fuse_sdpa's where mask takes no bf16 fill)"


def _no_cast(c: Ctx) -> str:
    return "the scores' dtype is the model's: casting them to f32 changes its numbers"


WHERE_BIAS = Rule(
    "canonicalize_exported.where_bias",
    P(Op.ADD, P.var("s"), _padding_mask("bias"), name="add", commutative=True),
    steps=(
        _not_biased_scores,
        _fills_guard("bias", "none: another fill is a different mask (the sum is not a where)"),
        absorbs_guard("bias", "the sum is no where (a fully masked row differs): it stays the model's own additive "
                       "score term, which a fused attention takes as its operand as it is (exact)", MODEL_TERM),
        guard("scores_f32", lambda c: _scores_ok(c, "bias"), lambda c: _scores_why(c, "bias"),
              requires=("s", "bias"), kind=NOT_RECOGNIZED, fix=SCORES_DTYPE_FIX, no_model_fix=_no_cast),
        guard("bias_no_widen", lambda c: broadcast(c["s"].shape, c["bias"].shape) == c["s"].shape,
              lambda c: f"{c.d('bias')} {list(c['bias'].shape)} widens {c.d('s')} {list(c['s'].shape)}",
              requires=("bias", "s"), kind=ILLEGAL),
    ),
    result="add", absorb=("add",),  # the bias is left to DCE: every layer's scores add the same one
    build=lambda c: (Op.WHERE, [c.id("keep"), c.id("s"), c.id("fill")], {}),
    doc="scores + where(keep, 0, f32 min) -> where(keep, scores, f32 min)", form="where mask")


_SCAN_LIMIT = 64
"""Nodes walked up from the softmax looking for a non-finite constant (an attention's scores are a few ops)."""


def _nonfinite_const(g: Graph, root: int) -> int | None:
    """A non-finite scalar constant among the nodes computing `root`, stopping at matmuls and leaves; or None."""
    seen, stack = set(), [root]
    while stack and len(seen) < _SCAN_LIMIT:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        n = g[i]
        if n.op == Op.CONST:  # a scalar or a small tensor constant (`[-inf]` from TorchScript)
            vals = const_entries(n)
            if vals is not None and not all(math.isfinite(v) for v in vals):
                return i
            continue
        if n.op in (Op.MATMUL, Op.INPUT, Op.PARAM, Op.CONST):
            continue
        stack.extend(n.inputs)
    return None


@reports(reads=("p", "p2"))
def _guards_the_softmax(c: Ctx) -> Fail | None:
    """The where reads the same softmax it tests."""
    return None if c.id("p") == c.id("p2") and c["p"].op == Op.SOFTMAX else QUIET


NAN_GUARD = Rule(
    "canonicalize_exported.nan_guard",
    P(Op.WHERE, P(Op.ISNAN, P.var("p"), name="isnan"), P.var("zero", where=_const_is(0.0), what="the constant 0"),
      P.var("p2"), name="guard"),
    steps=(
        _guards_the_softmax,
        guard("scores_finite", lambda c: _nonfinite_const(c.graph, c["p"].inputs[0]) is None,
              lambda c: f"{c.d('p')} reads a non-finite constant "
                        f"(node {_nonfinite_const(c.graph, c['p'].inputs[0])}): a fully masked row is NaN there and "
                        f"{c.d('guard')} makes it 0, so it cannot be dropped",
              requires=("p", "guard"), kind=ILLEGAL, fix="none: the guard is what such a mask needs"),
    ),
    result="guard", absorb=("isnan", "guard"),
    rewrite=lambda c, rw: _drop_guard(c, rw),
    doc="where(isnan(softmax(s)), 0, softmax(s)) -> softmax(s) (finite scores)",
    form="sdpa NaN guard dropped")


def _drop_guard(c: Ctx, rw: Rewriter) -> None:
    """The guard's users read the softmax; no node stands for the match (as `_drop_cast`)."""
    rw.remove([c.id("isnan")])
    rw.replace(c.id("guard"), c.id("p"))


_MERGE_STEPS = 3
"""Movement ops followed from `P @ V` (the head merge: transpose, reshape; a few at most)."""


def _merge_chain(g: Graph, i: int) -> list[int]:
    """The head merge reading node i: its single-reader transposes / reshapes, in order (none is a graph output)."""
    chain: list[int] = []
    while len(chain) < _MERGE_STEPS and not g.is_output(i) and g.use_count(i) == 1:
        (user,) = g.users(i)
        if user.op not in (Op.TRANSPOSE, Op.RESHAPE):
            break
        chain.append(user.id)
        i = user.id
    return chain


@reports(reads=("p",))
def _nonfinite_scores(c: Ctx) -> Fail | None:
    """Scores with a non-finite constant (a -inf fill) are this form; finite ones are `nan_guard`'s."""
    return None if _nonfinite_const(c.graph, c["p"].inputs[0]) is not None else QUIET


NAN_GUARD_MOVED = Rule(
    "canonicalize_exported.nan_guard_moved",
    P(Op.MATMUL, P(Op.WHERE, P(Op.ISNAN, P.var("p"), name="isnan"),
                   P.var("zero", where=_zero_fill, what="the constant 0"), P.var("p2"), name="guard"),
      P.var("v"), name="pv"),
    steps=(_guards_the_softmax, _nonfinite_scores),
    result="pv", absorb=("isnan", "guard", "pv"),
    rewrite=lambda c, rw: _guard_after_merge(c, rw),
    doc="where(isnan(softmax(s)), 0, softmax(s)) @ v -> where(isnan(o), 0, o), o = softmax(s) @ v (head merge "
        "in between)", form="sdpa NaN guard moved past the head merge")


def _guard_after_merge(c: Ctx, rw: Rewriter) -> int:
    g = c.graph
    chain = _merge_chain(g, c.id("pv"))
    with rw.provenance([c.id("isnan"), c.id("guard"), c.id("pv"), *chain]):
        out = rw.emit(Op.MATMUL, [c.id("p"), c.id("v")])
        for i in chain:
            out = rw.emit(g[i].op, [out], **g[i].attrs)
        fixed = rw.emit(Op.WHERE, [rw.emit(Op.ISNAN, [out]), c.id("zero"), out])
    last = chain[-1] if chain else c.id("pv")
    rw.remove([c.id("isnan"), c.id("guard"), *([c.id("pv")] + chain)[:-1]])
    rw.replace(last, fixed)
    return fixed


def _batch_fold(c: Ctx) -> bool:
    """x [*lead, *rest] -> r1 [prod(lead), *rest] -> t (axis 0 kept) -> r2 [*lead2, *t.shape[1:]], prod(lead2) ==
    prod(lead) (lead2 may group the leading axes differently: [B, Hkv, rep] folded, [B, Hkv*rep] unfolded)."""
    x, r1, t, r2 = c["x"], c["r1"], c["t"], c["r2"]
    perm = list(t.attrs.get("perm", ()))
    if not perm or perm[0] != 0 or len(r1.shape) < 2:
        return False
    rest = r1.shape[1:]
    k, k2 = len(x.shape) - len(rest), len(r2.shape) - len(rest)
    if k < 1 or k2 < 1 or tuple(x.shape[k:]) != tuple(rest) or math.prod(x.shape[:k]) != r1.shape[0]:
        return False
    return tuple(r2.shape[k2:]) == tuple(t.shape[1:]) and math.prod(r2.shape[:k2]) == r1.shape[0]


def _unfold(c: Ctx, rw: Rewriter) -> int:
    """transpose(reshape(x, [*lead2, *rest])) (no reshape when lead2 is x's own leading axes)."""
    x, r1, t, r2 = c["x"], c["r1"], c["t"], c["r2"]
    rest = tuple(r1.shape[1:])
    k2 = len(r2.shape) - len(rest)
    lead2 = tuple(r2.shape[:k2])
    perm = list(range(k2)) + [k2 - 1 + p for p in t.attrs["perm"][1:]]
    with rw.provenance([c.id("r1"), c.id("t"), c.id("r2")]):
        same = lead2 == tuple(x.shape[:len(x.shape) - len(rest)])
        src = c.id("x") if same else rw.emit(Op.RESHAPE, [c.id("x")], shape=lead2 + rest)
        out = rw.emit(Op.TRANSPOSE, [src], perm=perm)
    rw.remove([c.id("r1"), c.id("t")])
    rw.replace(c.id("r2"), out)
    return out


@reports(reads=("x", "r1", "t", "r2"))
def _is_batch_fold(c: Ctx) -> Fail | None:
    """Only a batch fold is this form; any other reshape/transpose/reshape is another layout (not a near-miss)."""
    return None if _batch_fold(c) else QUIET


FOLDED_TRANSPOSE = Rule(
    "canonicalize_exported.folded_transpose",
    P(Op.RESHAPE, P(Op.TRANSPOSE, P(Op.RESHAPE, P.var("x"), name="r1"), name="t"), name="r2"),
    steps=(_is_batch_fold,),
    result="r2", absorb=("r1", "t", "r2"), rewrite=lambda c, rw: _unfold(c, rw),
    doc="reshape(transpose(reshape(x, [B*H, ...]), [0, ...]), [B, H, ...]) -> transpose(x, ...)",
    form="folded transpose unfolded")



def _biased_scores(g: Graph, n: Node) -> bool:
    """`scores + bias`: a sum with one score-matmul operand (T5's position bias)."""
    return n.op == Op.ADD and any(is_score_matmul(g, i) for i in n.inputs)


@reports(reads=("s",))
def _sum_of_scores(c: Ctx) -> Fail | None:
    """Only a sum whose `s` operand is a (scaled) score matmul is this form."""
    return None if is_score_matmul(c.graph, c.id("s")) else QUIET


BIAS_THEN_MASK = Rule(
    "canonicalize_exported.bias_then_mask",
    P(Op.ADD, P(Op.ADD, P.var("s"), P.var("bias"), name="sum", commutative=True), _padding_mask("mask"),
      name="add", commutative=True),
    steps=(
        _sum_of_scores,
        _fills_guard("mask", "none: another fill is a different mask"),
        absorbs_guard("mask", "(s + bias) + mask is not s + (bias + mask) (a fully masked row differs)", ILLEGAL,
                       TWO_TERMS_FIX),
        guard("scores_f32", lambda c: _scores_ok(c, "bias", "mask"), lambda c: _scores_why(c, "bias", "mask"),
              requires=("s", "bias", "mask"), kind=NOT_RECOGNIZED, fix=SCORES_DTYPE_FIX, no_model_fix=_no_cast),
    ),
    result="add", absorb=("sum", "add"),
    rewrite=lambda c, rw: _bias_plus_mask(c, rw),
    doc="(scores + bias) + where(keep, 0, f32 min) -> scores + (bias + where(keep, 0, f32 min))",
    form="bias and mask summed first")


def _bias_plus_mask(c: Ctx, rw: Rewriter) -> int:
    with rw.provenance([c.id("sum"), c.id("add")]):
        term = rw.emit(Op.ADD, [c.id("bias"), c.id("mask")])  # ids, not Python numbers: emit, not rw.add
        out = rw.emit(Op.ADD, [c.id("s"), term])
    rw.remove([c.id("sum")])
    rw.replace(c.id("add"), out)
    return out


def _bool_const(node: Node, value: bool) -> bool:
    return is_const(node) and node.dtype == DType.bool and const_value(node) == float(value)


@reports(reads=("test", "b", "c"))
def _is_not(c: Ctx) -> Fail | None:
    """`eq(b, false)` / `ne(b, true)` on a bool b: `not b` (anything else: another condition, no record)."""
    t, b, k = c["test"], c["b"], c["c"]
    if b.dtype != DType.bool or b.shape != t.shape:
        return QUIET
    return None if (t.op == Op.EQ and _bool_const(k, False)) or (t.op == Op.NE and _bool_const(k, True)) else QUIET


def _swap_where(c: Ctx, rw: Rewriter) -> int:
    with rw.provenance([c.id("where")]):
        out = rw.emit(Op.WHERE, [c.id("b"), c.id("y"), c.id("x")])
    rw.replace(c.id("where"), out)
    return out


INVERTED_WHERE = Rule(
    "canonicalize_exported.inverted_where",
    P(Op.WHERE, P(Op.EQ, P.var("b"), P.var("c", where=is_const, what="a constant"), name="test", commutative=True)
      | P(Op.NE, P.var("b"), P.var("c", where=is_const, what="a constant"), name="test", commutative=True),
      P.var("x"), P.var("y"), name="where"),
    steps=(_is_not,), result="where", absorb=("where",),  # the test is left to DCE: every layer reads one mask
    rewrite=lambda c, rw: _swap_where(c, rw),
    doc="where(not b, x, y) -> where(b, y, x)", form="where without its not")


@reports(reads=("x", "cast"))
def _same_dtype(c: Ctx) -> Fail | None:
    """Only a cast to the value's own dtype is a no-op (any other cast converts: not a near-miss)."""
    return None if c["cast"].dtype == c["x"].dtype else QUIET


def _drop_cast(c: Ctx, rw: Rewriter) -> None:
    """The cast's users read x. No node stands for the match (`Match.fused` None): x is the model's own value, not
    something the rule made, so a layer's `rewritten as` never names it (`Rule.form` says the cast was dropped)."""
    rw.replace(c.id("cast"), c.id("x"))


NOOP_CAST = Rule(
    "canonicalize_exported.noop_cast", P(Op.CAST, P.var("x"), name="cast"),
    steps=(_same_dtype,), result="cast", absorb=("cast",), rewrite=lambda c, rw: _drop_cast(c, rw),
    doc="cast(x, dtype of x) -> x", form="no-op cast dropped")


def _unit_split(c: Ctx) -> tuple[int, int, int, int] | None:
    """(B, S, start, length) when `cut` narrows the last axis of `r = reshape(x [B, S, N] -> [B, 1, S, N])` (the
    exporter's `unsqueeze(1)` of a fused projection written before its split), else None."""
    x, r, cut = c["x"], c["r"], c["cut"]
    if len(x.shape) != 3 or len(r.shape) != 4 or tuple(r.shape) != (x.shape[0], 1, x.shape[1], x.shape[2]):
        return None
    if int(cut.attrs.get("axis", -1)) % 4 != 3:
        return None
    return x.shape[0], x.shape[1], int(cut.attrs["start"]), int(cut.attrs["length"])


@reports(reads=("x", "r", "cut", "split"))
def _is_head_split_of_unit_cut(c: Ctx) -> Fail | None:
    """Only `reshape(narrow(unsqueeze(x)), [B, S, h, d])` is this form (anything else: another layout, quiet)."""
    u = _unit_split(c)
    split = c["split"]
    if u is None or len(split.shape) != 4 or tuple(split.shape[:2]) != u[:2] or \
            split.shape[2] * split.shape[3] != u[3]:
        return QUIET
    return None


def _head_split_of_cut(c: Ctx, rw: Rewriter) -> int:
    """reshape(narrow(x, axis 2), [B, S, h, d]): the same elements in the same order (the unit axis holds one)."""
    _, _, start, length = _unit_split(c)
    with rw.provenance([c.id("cut"), c.id("split")]):
        cut = rw.emit(Op.NARROW, [c.id("x")], axis=2, start=start, length=length)
        out = rw.emit(Op.RESHAPE, [cut], shape=tuple(c["split"].shape))
    rw.replace(c.id("split"), out)
    remove_shared(rw, [c.id("cut"), c.id("r")])  # the old cut and view go with their last reader (a QKV's extra user)
    return out


UNIT_AXIS_HEAD_SPLIT = Rule(
    "canonicalize_exported.unit_axis_head_split",
    P(Op.RESHAPE, P(Op.NARROW, P(Op.RESHAPE, P.var("x"), name="r"), name="cut"), name="split"),
    steps=(_is_head_split_of_unit_cut,), result="split", absorb=("split",),
    rewrite=lambda c, rw: _head_split_of_cut(c, rw),
    doc="reshape(narrow(reshape(x, [B, 1, S, N]), -1), [B, S, h, d]) -> reshape(narrow(x, -1), [B, S, h, d])",
    form="head split of a unit-axis cut")


@reports(reads=("x", "r", "cut"))
def _is_one_head_cut(c: Ctx) -> Fail | None:
    """Only a cut of `unsqueeze(x)` not read as a head split (K or V of multi-query: one head) is this form."""
    if _unit_split(c) is None or any(u.op == Op.RESHAPE and len(u.shape) == 4 and u.shape[1] != 1
                                     for u in c.graph.users(c.id("cut"))):
        return QUIET
    return None


def _one_head_of_cut(c: Ctx, rw: Rewriter) -> int:
    """transpose(reshape(narrow(x, axis 2), [B, S, 1, L]), [0, 2, 1, 3]): one head split the usual way, the same
    `[B, 1, S, L]` values (moving a unit axis moves no element)."""
    b, s, start, length = _unit_split(c)
    with rw.provenance([c.id("cut")]):
        cut = rw.emit(Op.NARROW, [c.id("x")], axis=2, start=start, length=length)
        heads = rw.emit(Op.RESHAPE, [cut], shape=(b, s, 1, length))
        out = rw.emit(Op.TRANSPOSE, [heads], perm=(0, 2, 1, 3))
    rw.replace(c.id("cut"), out)
    remove_shared(rw, [c.id("r")])
    return out


UNIT_AXIS_ONE_HEAD = Rule(
    "canonicalize_exported.unit_axis_one_head",
    P(Op.NARROW, P(Op.RESHAPE, P.var("x"), name="r"), name="cut"),
    steps=(_is_one_head_cut,), result="cut", absorb=("cut",), rewrite=lambda c, rw: _one_head_of_cut(c, rw),
    doc="narrow(reshape(x, [B, 1, S, N]), -1) -> transpose(reshape(narrow(x, -1), [B, S, 1, L]), [0, 2, 1, 3]) "
        "(GPT-BigCode's multi-query K and V sliced from c_attn)", form="one head of a unit-axis cut")


canonicalize_exported = rule_pass(
    "canonicalize_exported", [SILU, RELU2, ACTIVATION_OP, RSQRT, WHERE_BIAS, NAN_GUARD, NAN_GUARD_MOVED,
                              FOLDED_TRANSPOSE, BIAS_THEN_MASK, BIAS_THEN_TABLE_MASK, INVERTED_WHERE, NOOP_CAST,
                              UNIT_AXIS_HEAD_SPLIT, UNIT_AXIS_ONE_HEAD],
    "forms exporters write (x*sigmoid(x), relu(x)^2, 1/sqrt, the padding-mask sum, the sdpa NaN guard, its folded "
    "transpose, T5's bias then mask, an inverted where, no-op casts) -> the IR's ops",
    product="the exporter's forms as IR ops",  # a layer's list adds the forms rewritten there (`Rule.form`)
    recognizes_families=("where_mask", "activation"))

__all__ = ["ACTIVATION_OP", "BIAS_THEN_MASK", "BIAS_THEN_TABLE_MASK",
           "FOLDED_TRANSPOSE", "INVERTED_WHERE", "NAN_GUARD", "NAN_GUARD_MOVED", "NOOP_CAST", "RELU2",
           "RSQRT", "SILU", "UNIT_AXIS_HEAD_SPLIT", "UNIT_AXIS_ONE_HEAD", "WHERE_BIAS", "canonicalize_exported"]
