"""`fuse_transformer_layer`: a whole post-norm BERT layer -> one `FusedTransformerLayer`.

The seed pass (`transformer_layer.rs`, docs/rlx.md §2.3.12) with every one of its `continue`s turned
into a named structure step or guard with its own message::

    hidden --+--> attn = FusedAttentionBlock(hidden, qkv_w, out_w, mask, qkv_b, out_b)
             +--> ln1 (h1) = FusedResidualLN(x=attn, residual=hidden, ln1_g, ln1_b)
                   +--> fc1 = FusedMatMulBiasAct(h1, fc1_w, fc1_b, activation in EPILOGUE_ACTIVATIONS)
                   |     +--> fc2 = FusedMatMulBiasAct(fc1, fc2_w, fc2_b, activation=None)
                   +--------> ln2 = FusedResidualLN(x=fc2, residual=h1, ln2_g, ln2_b)

Anchored on every attention (packed `attention` or `FusedAttentionBlock`), so running this pass
before its prerequisites is visible: an unfused attention is rejected at `attn_is_fused_block`
("needs FusedAttentionBlock: run fuse_attention_block first"). The batch*seq gate is the same
pipeline parameter as `fuse_attention_block`'s (RLX shares its gate the same way). Differences from
the seed: users come from the def-use index (no scan of all nodes), the activation must be in the
epilogue allow-list (the seed accepts any), and a pre-LN layer is named as such (`post_ln_order`).

Validity (numbers equal for every input): the layer's decomposition (`ir.fused.transformer_layer`)
is the matched parts in order: the attention block with its keep mask and `mask_fill`, LN1 with the
matched `eps1` over `attn + hidden` (operand order checked), FFN with the matched activation, LN2 with
`eps2` over `fc2 + h1`; h1 feeds nothing else (guard `h1_user_count`), so no value escapes.

A residual norm that adds a bias after its residual (`ln1_no_bias`, `ln2_no_bias`; FFN.2 then a bare matmul,
`fc2_bias_after_residual`: ONNX Runtime's SkipLayerNormalization order, `LN((x @ w + skip) + bias)`) is a form the
layer op lacks: adding the bias first rounds differently, so the three share one compiler fix (`RESIDUAL_BIAS_FIX`)
and the model has nothing to change (a gap in rlxviz's ops, not a near-miss).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ...ir import Graph, Op
from ...ir.ops import ACTIVATIONS, ELEMENTWISE, operand_roles
from ..activations import activation_of
from ..allow_list import epilogue_allowed
from ..engine import rule_pass
from ..guard import (
    COMPILER_ONLY,
    EPILOGUE_ACTIVATIONS,
    ILLEGAL,
    NOT_RECOGNIZED,
    READ_BY_MODEL,
    Ctx,
    Guard,
    activation_hint,
    guard,
    not_output,
    operands_are,
    role_name,
    single_user,
    static_dim,
    user_count,
)
from ..pattern import P
from ..refusal_kinds import NOTHING_TO_CHANGE, rounding_not_offered
from ..rule import Fail, Rule, Shape, Step, User, reports
from .block import size_gate
from .sdpa_mask import typed_value

_RLN = ("x", "residual", "gamma", "beta")
FMBA = Op.FUSED_MATMUL_BIAS_ACT


_NORMS = (Op.LAYER_NORM, Op.RMS_NORM, Op.FUSED_RESIDUAL_LN, Op.FUSED_RESIDUAL_RMS_NORM)


def _pre_ln_add(c: Ctx) -> int | None:
    """The residual add after the attention when it feeds a norm *and* another residual add (pre-LN: x + attn(LN(x)),
    the sum goes on to the next residual), else None. A sum read by a norm and a probe (a `mul`, a reduce: a
    logged statistic) is a post-LN layer with an extra reader (`residual_sum_single_user`), not pre-LN."""
    s = _residual_sum(c)
    if s is None:
        return None
    later = c.graph.users(s)
    return s if any(w.op in _NORMS for w in later) and any(w.op == Op.ADD for w in later) else None


def _residual_sum(c: Ctx, of: str = "attn") -> int | None:
    """The residual add that `of` (the attention, or FFN.2) has as its one user (before `fuse_residual_ln` absorbed
    it), else None."""
    users = c.users(of)
    return users[0].id if len(users) == 1 and users[0].op == Op.ADD else None


def _sum_readers(c: Ctx, of: str = "attn") -> list[int]:
    """The readers of the residual sum after `of` other than its norm: what keeps the sum from being absorbed (a
    probe)."""
    s = _residual_sum(c, of)
    if s is None:
        return []
    us = c.graph.users(s)
    norm = next((w.id for w in us if w.op in _NORMS), None)
    return [w.id for w in us if w.id != norm]


def _sum_guard(name: str, of: str, norm: str, h: str) -> Guard:
    """The residual sum after `of` feeds only its norm (`norm`, producing `h`) and is no graph output: the layer op
    absorbs it. A probe reading it (a logged statistic) makes the layer op illegal: the refusal names the probe, and
    no change to the model that keeps its outputs helps (`extra_readers_why`)."""
    def ok(c: Ctx) -> bool:
        s = _residual_sum(c, of)
        if s is None or not any(w.op in _NORMS for w in c.graph.users(s)):  # no norm reads it: a form the layer
            return True                                                   # rule's structure steps name
        return (of == "attn" and _pre_ln_add(c) is not None) or (not _sum_readers(c, of)
                                                                  and not c.graph.is_output(s))

    def explain(c: Ctx) -> str:
        s = _residual_sum(c, of)
        assert s is not None
        who = ", ".join(c.name_of(u) for u in _sum_readers(c, of))
        out = f" and is graph output #{c.graph.outputs.index(s)}" if c.graph.is_output(s) else ""
        read = f" is also read by {who}{out}" if who else out
        return (f"the residual sum {c.name_of(s)} after {c.d(of)}{read}; FusedTransformerLayer absorbs it into "
                f"{h} = {norm} and returns h2 only")

    def readers(c: Ctx) -> tuple[int, list[int]] | None:
        s = _residual_sum(c, of)
        return None if s is None else (s, _sum_readers(c, of))

    return guard(name, ok, explain, f"make the residual sum after {of} feed only its LayerNorm",
                 highlight=lambda c: (tuple(_sum_readers(c, of)),
                                      tuple((_residual_sum(c, of), u) for u in _sum_readers(c, of))),
                 requires=(of,), kind=ILLEGAL, subject=lambda c: _residual_sum(c, of), readers=readers,
                 remedy=READ_BY_MODEL,
                 fix=f"multi-output fusion: a layer op that also returns the residual sum before {h} (no product "
                     f"rule builds one)")


def _scaled(c: Ctx, role: str, base: str) -> tuple[int, float] | None:
    """`(the mul, alpha)` when `role`'s residual operand is `base * alpha` for a scalar constant alpha (DeepNorm's
    `LN(alpha * x + f(x))`), else None."""
    g = c.graph
    for i in c[role].inputs[:2]:
        n = g[i]
        if n.op == Op.MUL and len(n.inputs) == 2 and c.id(base) in n.inputs:
            k = g[next((j for j in n.inputs if j != c.id(base)), c.id(base))]
            if k.op == Op.CONST and k.rank == 0 and (a := typed_value(k)) is not None:
                return n.id, a
    return None


def _scaled_guard(role: str, base: str, sub: str) -> Guard:
    """`role`'s residual is `base` itself, not `alpha * base` (DeepNorm): FusedTransformerLayer adds it unscaled."""
    def explain(c: Ctx) -> str:
        hit = _scaled(c, role, base)
        assert hit is not None
        mul, alpha = hit
        return (f"{c.d(role)} adds {sub} and {c.name_of(mul)} = {c.label(base)} * {alpha:g}: a scaled residual "
                f"LN(alpha * x + f(x)) (DeepNorm, alpha = {alpha:g}); FusedTransformerLayer adds {c.label(base)} "
                f"unscaled")

    return guard(f"{role}_residual_scaled", lambda c: _scaled(c, role, base) is None, explain,
                 highlight=lambda c: ((h[0],), ((h[0], c.id(role)),)) if (h := _scaled(c, role, base)) else ((), ()),
                 requires=(role, base), kind=NOT_RECOGNIZED,
                 fix="a residual scale (alpha) on FusedTransformerLayer: h1 = LN(attn + alpha * hidden), h2 = "
                     "LN(fc2 + alpha * h1); the residual norms already take alpha * x as their residual operand",
                 subject=lambda c: (h[0] if (h := _scaled(c, role, base)) else None),
                 no_model_fix=lambda c: "alpha scales the residual stream the norm reads: dropping it, or moving it to "
                                        "the sublayer side, changes the model's numbers")


RESIDUAL_BIAS_FIX = ("a FusedTransformerLayer with a bias added after each residual add (h1 = LN((attn + hidden) + "
                     "b1), FFN.2 a bare matmul and h2 = LN((fc2 + h1) + b2): the order of the file's residual norms, "
                     "exact)")
"""The compiler fix of a post-LN layer whose linears' biases are added after the residual adds (ONNX Runtime's
SkipLayerNormalization order, `fuse_residual_ln.biased` takes them into the norms): `ln1_no_bias`, `ln2_no_bias`
and `fc2_bias_after_residual` all name it, so one fix covers the three (`whatif.without_guard`). Its first clause is
the op form rlxviz lacks (`why.policy.fix_gap_form`): `FusedTransformerLayer with a bias added after each residual
add`."""

RESIDUAL_BIAS_HINT = (f"{NOTHING_TO_CHANGE}: " + rounding_not_offered(
    "adding the bias before the residual ((x @ w + bias) + skip, the order FusedTransformerLayer computes)",
    "it rounds differently from the file's (x @ w + skip) + bias"))
"""The fix line of those refusals: a statement, no change to the model (a compiler fix only, `why.policy`)."""

_SKIP_ORDER = ("((x @ w + skip) + bias, the order of ONNX Runtime's SkipLayerNormalization; `fuse_residual_ln.biased` "
               "took the bias into the norm, so `fuse_matmul_bias_act.bias_after_residual`, which names a linear "
               "whose bias no norm takes, is quiet here)")


def _no_bias_guard(ln: str, branch: str, skip: str) -> Guard:
    """`{ln}_no_bias`: the residual norm `ln` adds no bias after the residual add (`has_bias=False`). A biased one (the
    sublayer's linear bias moved after the residual, `_SKIP_ORDER`) is a form FusedTransformerLayer lacks, with nothing
    to change in the model (`RESIDUAL_BIAS_HINT`): a gap in rlxviz's ops, not a near-miss."""
    def explain(c: Ctx) -> str:
        bias = c[ln].inputs[2] if len(c[ln].inputs) > 4 else None
        what = f"the bias {c.name_of(bias)}" if bias is not None else "a bias"
        return (f"{c.d(ln)} has has_bias=True: it adds {what} after the residual add of {c.label(branch)} and "
                f"{c.label(skip)} {_SKIP_ORDER}; FusedTransformerLayer adds each sublayer's bias before its residual "
                f"(the attention block's output bias, FFN.2's bias) and takes none after it")

    return guard(f"{ln}_no_bias", lambda c: not c[ln].attrs.get("has_bias", True), explain, RESIDUAL_BIAS_HINT,
                 highlight=lambda c: ((c.id(ln),), ()), requires=(ln,), reads=(branch, skip), kind=NOT_RECOGNIZED,
                 fix=RESIDUAL_BIAS_FIX)


def _operand_no_fix(role: str, want: str) -> Callable[[Ctx], str]:
    """`ln1_operand_order`/`ln2_operand_order` fail only when the residual is another value (the adds are commutative):
    adding `want` instead changes what the layer computes."""
    return lambda c: (f"{c.label(role)} adds another value than {want}; adding {want} instead changes the model's "
                      f"numbers")


def _residual_norm(ln: str, branch: str, skip: str, sum_name: str, norm: str, h: str, order: str, order_fix: str,
                   skip_words: str) -> tuple[Step, ...]:
    """The checks on one of the layer's two residual norms, `ln` (producing `h`) = `norm` = LN(`branch` + `skip`):
    the post-attention one (h1) and the FFN's (h2) are checked alike. The residual sum feeds only the norm
    (`sum_name`, `_sum_guard`), the norm is a FusedResidualLN (`{ln}_is_residual_ln`, the first user of `branch`)
    without a residual bias (`{ln}_no_bias`), its residual is `skip` unscaled (`{ln}_residual_scaled`) and its
    operands are `branch` and `skip`, in either order (`{ln}_operand_order`: message `order`, compiler fix
    `order_fix`; `skip_words` names `skip` in the no-model-fix line)."""
    return (
        _sum_guard(sum_name, branch, norm, h),
        User(f"{ln}_is_residual_ln", ln, branch, P(Op.FUSED_RESIDUAL_LN, name=ln), "FusedResidualLN",
             "run fuse_residual_ln first"),
        _no_bias_guard(ln, branch, skip),
        _scaled_guard(ln, skip, branch),
        replace(operands_are(ln, {0: branch, 1: skip}, _RLN, f"{ln}_operand_order", order, order_fix,
                             commutative=True),
                no_model_fix=_operand_no_fix(ln, skip_words)),
    )


FFN_GAP = 8
"""Most elementwise nodes between FFN.1 and FFN.2 (`feeds_linear`): an activation written as primitives (erf GELU is
four, a quick GELU or tanh GELU a few more)."""


def feeds_linear(g: Graph, x: int) -> bool:
    """Whether node `x`'s output is the input of a linear, directly or past elementwise nodes only (its activation, as
    one op or as primitives, at most `FFN_GAP` of them; a host node the importer kept may be an activation it does not
    read, so it is passed too): the edge that makes a linear FFN.1 (its output, past the activation, feeds FFN.2).
    A linear: a FusedMatMulBiasAct reading the value as its input, or a matmul reading it as operand 0 with a rank-2
    weight (`[in, out]`; attention's score matmuls read batched heads). False for the cross-attention's q_proj of a
    decoder layer (it feeds the attention) and a linear probe (it feeds the outputs)."""
    seen, todo = {x}, [x]
    for _ in range(FFN_GAP + 1):
        nxt = []
        for i in todo:
            for u in g.users(i):
                if u.inputs and u.inputs[0] == i and (u.op is FMBA or (u.op is Op.MATMUL and g[u.inputs[1]].rank == 2)):
                    return True
                if (u.op in ELEMENTWISE or u.op in ACTIVATIONS or u.op is Op.ONNX_OP) and u.id not in seen:
                    seen.add(u.id)
                    nxt.append(u.id)
        todo = nxt
    return False


def _explain_post_ln(c: Ctx) -> str:
    add = _pre_ln_add(c)
    assert add is not None
    names = ", ".join(f"{w.op.value} (node {w.id})" for w in c.graph.users(add))
    return (f"the residual add (node {add}) after {c.d('attn')} feeds {names}: the norm comes before the "
            f"next sublayer (pre-LN ordering, x + attn(LN(x))); FusedTransformerLayer is post-LN BERT: "
            f"h1 = LN(attn(x) + x)")


def _explain_act(c: Ctx) -> str:
    act = c["fc1"].attrs.get("activation")
    users = c.users("fc1")
    form = activation_of(c.graph, c.id("fc1")) if act is None else None
    after = ""
    if form is not None:
        after = f", followed by {form.describe()} as primitives"
    elif len(users) == 1 and act is None:
        after = f", followed by a separate {users[0].op.value} (node {users[0].id})"
    return (f"{c.d('fc1')} is FusedMatMulBiasAct(activation={act}){after}; needs an activation from the epilogue "
            f"allow-list ({', '.join(EPILOGUE_ACTIVATIONS)})")


H1 = role_name("ln1", "h1")
"""The post-attention LayerNorm's name in messages: drawn as role `ln1`, named h1 by the pattern (`ln1 (role h1)`)."""
_H1_OUT_FIX = (f"multi-output fusion: a layer op that also returns {H1} as a second output "
               "(Rule(outputs=('ln1',))); no product rule builds one")


def _act_name(c: Ctx) -> str | None:
    """The layer's own activation: fc1's epilogue, or the one op that reads fc1 (None for primitives)."""
    act = c["fc1"].attrs.get("activation")
    users = c.users("fc1")
    form = activation_of(c.graph, c.id("fc1")) if act is None else None
    return act or (users[0].op.value if len(users) == 1 and form is None else None)


def _act_fix(c: Ctx) -> str:
    """The compiler-side fix naming the layer's own activation. That changing the model's activation changes its
    numbers is the model-side fix's to say (`guard.activation_hint`, or the checked what-if that replaces it), once."""
    act = c["fc1"].attrs.get("activation")
    form = activation_of(c.graph, c.id("fc1")) if act is None else None
    name = _act_name(c)
    if name == "gelu_tanh":
        return ("add gelu_tanh to the epilogue allow-list (ir.ops.EPILOGUE_ACTIVATIONS: the MLX lowering and rlxviz's "
                "CPU kernels already compute it)")
    if form is not None:
        return f"add {form.name} to the epilogue allow-list, with an op for it ({form.formula})"
    what = name or "the layer's activation"
    return f"add {what} to the epilogue allow-list (a fused {what} epilogue kernel)"


@reports("fc1_activation", reads=("fc1",))
def _fc1_activation(c: Ctx) -> Fail | None:
    """FFN.1's activation is on the epilogue allow-list (FusedTransformerLayer applies it in the FC1 epilogue)."""
    if c["fc1"].attrs.get("activation") in epilogue_allowed():
        return None
    shown = tuple(u.id for u in c.users("fc1")) + (c.id("fc1"),)
    return Fail("guard", "fc1_activation", _explain_act(c), shown, (),
                activation_hint(_act_name(c)), subject=c.id("fc1"), kind=NOT_RECOGNIZED, fix=_act_fix(c),
                remedy=COMPILER_ONLY)  # the hint (another activation) changes the numbers: `activation_hint`


@reports(reads=("ln1", "ln2"), binds=("ln1_g", "ln1_b", "ln2_g", "ln2_b"))
def _ln_params(c: Ctx) -> None:
    """Bind the two norms' gamma and beta (their last two operands; `ln1_no_bias`/`ln2_no_bias` ran before)."""
    for r in ("ln1", "ln2"):
        g, b = c[r].inputs[-2:]
        c.bindings[f"{r}_g"], c.bindings[f"{r}_b"] = g, b


def _extra_h1_users(c: Ctx) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """The users of h1 that are not one of its two expected readers (FFN.1, a linear with h1 as its input, and
    the second residual, a residual LayerNorm or add with h1 as an operand) and their edges; all users when
    that leaves none (two readers of the same kind, say)."""
    i = c.id("ln1")
    users = c.users("ln1")
    legit: list[int] = []
    for kind in ((FMBA, Op.MATMUL), (Op.FUSED_RESIDUAL_LN, Op.ADD)):
        u = next((u for u in users if u.op in kind and u.id not in legit and i in u.inputs[:2]), None)
        if u is not None:
            legit.append(u.id)
    extra = [u.id for u in users if u.id not in legit] or [u.id for u in users]
    return tuple(extra), tuple((i, u) for u in extra)


def _intermediate(c: Ctx) -> int:
    return c["fc1_w"].shape[-1]


_FC2 = User("fc2_is_fused_linear", "fc2", "fc1",
            P(FMBA, P.var("fc1"), P.var("fc2_w"), P.var("fc2_b"), name="fc2", attrs={"activation": None}),
            "FFN.2 as FusedMatMulBiasAct(fc1, ..., activation=None)", "run fuse_matmul_bias_act first")


def _bare_fc2(c: Ctx) -> tuple[int, int] | None:
    """`(matmul, norm)` when fc1's one user is a bare matmul of it (a rank-2 weight) whose one reader is a
    FusedResidualLN adding a bias after the residual (has_bias, the matmul its x or residual): FFN.2 with its bias in
    the norm (`_SKIP_ORDER`); else None."""
    users = c.users("fc1")
    if len(users) != 1 or users[0].op is not Op.MATMUL or users[0].inputs[0] != c.id("fc1"):
        return None
    mm = users[0]
    if c.graph[mm.inputs[1]].rank != 2:
        return None
    readers = c.graph.users(mm.id)
    ok = (len(readers) == 1 and readers[0].op is Op.FUSED_RESIDUAL_LN and readers[0].attrs.get("has_bias")
          and mm.id in readers[0].inputs[:2])
    return (mm.id, readers[0].id) if ok else None


@reports("fc2_is_fused_linear", "fc2_bias_after_residual", reads=("fc1",), binds=("fc2", "fc2_w", "fc2_b"))
def _fc2(c: Ctx) -> Fail | None:
    """FFN.2: the user of fc1 that is FusedMatMulBiasAct(fc1, ..., activation=None) (`fc2_is_fused_linear`, a structure
    step: `_FC2`); or a bare matmul of fc1 whose bias a FusedResidualLN adds after the residual (`_bare_fc2`), bound as
    fc2 (its bias fc2_b left unbound) and refused as `fc2_bias_after_residual`, the form of `ln2_no_bias` seen from
    FFN.2: a gap in rlxviz's ops, so the layer's later checks still run (and a compiler fix checked at this rule alone
    is checked on all of them)."""
    got = _bare_fc2(c)
    if got is None:
        return _FC2(c)
    mm, norm = got
    c.bindings["fc2"], c.bindings["fc2_w"] = mm, c.graph[mm].inputs[1]
    ins = c.graph[norm].inputs
    bias = c.name_of(ins[2]) if len(ins) > 4 else "its bias"
    msg = (f"{c.d('fc2')} is a bare matmul of {c.label('fc1')}: its bias, {bias}, is added after the residual by "
           f"{c.name_of(norm)} (has_bias) {_SKIP_ORDER}; FusedTransformerLayer's FFN.2 is "
           f"FusedMatMulBiasAct(fc1, ..., activation=None), its bias added before the residual")
    return Fail("guard", "fc2_bias_after_residual", msg, (mm, norm), ((mm, norm),), RESIDUAL_BIAS_HINT, subject=mm,
                kind=NOT_RECOGNIZED, fix=RESIDUAL_BIAS_FIX, remedy=COMPILER_ONLY)


_BLOCK_ATTRS = {"has_bias": True, "has_rope": False}
"""The FusedAttentionBlock a FusedTransformerLayer absorbs; its operands are bound under their role names."""

LAYER = Rule(
    "fuse_transformer_layer.bert_post_ln", P({Op.ATTENTION, Op.FUSED_ATTENTION_BLOCK}, name="attn"),
    steps=(
        size_gate("attn"),
        Shape("attn_is_fused_block", "attn",
              P(Op.FUSED_ATTENTION_BLOCK, *map(P.var, operand_roles(Op.FUSED_ATTENTION_BLOCK, _BLOCK_ATTRS, 0)),
                name="attn", attrs=_BLOCK_ATTRS,
                what="FusedAttentionBlock(has_bias=True, has_rope=False)"),
              "run fuse_attention_block first"),
        single_user("attn", "attn_single_user", "the attention block must feed only the post-attention residual"),
        not_output("attn", "attn_not_output"),
        guard("post_ln_order", lambda c: _pre_ln_add(c) is None, _explain_post_ln,
              "only post-LN (BERT) layers fuse; pre-LN (GPT-2/LLaMA) blocks keep their parts fused separately",
              no_model_fix=lambda c: "pre-LN is another computation than post-LN: moving the norm changes the "
                                     "model's numbers; pre-LN blocks keep their parts fused separately",
              highlight=lambda c: (tuple(u.id for u in c.users("attn")), ()), requires=("attn",),
              kind=NOT_RECOGNIZED, fix="a pre-LN layer op (no rule builds one: pre-LN blocks keep their parts "
                                       "fused separately)"),
        *_residual_norm("ln1", "attn", "hidden", "residual_sum_single_user", "LN(attn + hidden)", "h1",
                        "the post-attention residual must add the attention output and the layer input hidden",
                        "none: FusedTransformerLayer's first residual is its own input", "the layer input hidden"),
        not_output("ln1", "h1_not_output", f"do not return {H1} (the post-attention LayerNorm) from the model",
                   fix=_H1_OUT_FIX),
        user_count("ln1", 2, "FFN.1 and the ln2 residual", "h1_user_count",
                   f"make {H1} feed only FFN.1 and the second residual (remove the extra reader)",
                   fix=_H1_OUT_FIX,
                   highlight=_extra_h1_users),
        User("fc1_is_fused_linear", "fc1", "ln1", P(FMBA, P.var("ln1"), P.var("fc1_w"), P.var("fc1_b"), name="fc1"),
             "FFN.1 as FusedMatMulBiasAct(ln1, ...)", "run fuse_matmul_bias_act first", plays=feeds_linear,
             plays_what="feeds FFN.2 (a linear), directly or past its activation"),
        _fc1_activation,
        single_user("fc1", "fc1_single_user"),
        not_output("fc1", "fc1_not_output"),
        _fc2,
        single_user("fc2", "fc2_single_user"),
        not_output("fc2", "fc2_not_output"),
        *_residual_norm("ln2", "fc2", "ln1", "ffn_sum_single_user", "LN(fc2 + h1)", "h2",
                        f"the FFN residual must add the FFN output and {H1}",
                        f"none: FusedTransformerLayer's second residual is {H1}", H1),
        _ln_params,
        static_dim("fc1_w", -1, "fc1_weight_static",
                   fix="a FusedTransformerLayer whose FFN width is read from the fc1 weight when it runs"),
        guard("fc1_weight_rank2", lambda c: c["fc1_w"].rank == 2,
              lambda c: f"{c.d('fc1_w')} has shape {list(c['fc1_w'].shape)}; needs [H, intermediate]",
              requires=("fc1_w",), kind=NOT_RECOGNIZED, fix="none: FusedTransformerLayer takes [H, I] weights"),
    ),
    result="ln2", absorb=("attn", "ln1", "fc1", "fc2", "ln2"),
    labels={"ln1": "h1"},
    build=lambda c: (Op.FUSED_TRANSFORMER_LAYER,
                     [c.id(r) for r in operand_roles(Op.FUSED_TRANSFORMER_LAYER, {}, 0)],  # bound by role name
                     {"num_heads": c["attn"].attrs["num_heads"], "head_dim": c["attn"].attrs["head_dim"],
                      "intermediate_size": _intermediate(c), "eps1": c["ln1"].attrs["eps"],
                      "eps2": c["ln2"].attrs["eps"], "activation": c["fc1"].attrs["activation"], "has_bias": True,
                      "mask_fill": c["attn"].attrs.get("mask_fill"),
                      "mask": c["attn"].attrs.get("mask", "keep")}),
    doc="FusedAttentionBlock + FusedResidualLN + FFN (2 x FusedMatMulBiasAct) + FusedResidualLN -> "
        "FusedTransformerLayer")

fuse_transformer_layer = rule_pass("fuse_transformer_layer", [LAYER], "a post-LN BERT layer -> FusedTransformerLayer",
                                   requires=("fuse_attention_block", "fuse_residual_ln", "fuse_matmul_bias_act"),
                                   product="FusedTransformerLayer", expected_of=("post_ln",), whole_layer=True,
                                   quantization=("attention", "FusedTransformerLayer holds the attention, computed in "
                                                              "float"),
                                   unexpected="FusedTransformerLayer is the post-LN BERT layer; this layer is "
                                              "{description}",
                                   lacks=(("integer_qkv", "FusedTransformerLayer over integer-matmul projections "
                                                          "(dynamic quantization)",
                                           "a FusedTransformerLayer over int8 weights with their scales (its "
                                           "FusedAttentionBlock and FFN of integer matmuls)"),
                                          ("qk_norm", "FusedTransformerLayer with QK-norm",
                                           "a FusedTransformerLayer whose FusedAttentionBlock takes per-head norms of "
                                           "Q and K")))

__all__ = ["LAYER", "fuse_transformer_layer"]
