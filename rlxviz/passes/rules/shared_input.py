"""`fuse_shared_input_matmul` (docs/rlx.md §2.3.7): matmuls sharing an lhs `x` (Q/K/V, a router and a gate) -> one
matmul over a `concat` of the weights + `narrow`s. Weights stay as they are: the concatenation is a new `concat`
node of the original params (so checkpoints load unchanged and every weight keeps its name); the MLX runtime can
constant-fold it. Unlike RLX, biases are merged too: when every matmul's single user is `add(matmul, bias[N_i])`,
the biases are concatenated and one `add` follows the merged matmul, so Hugging Face Q/K/V (which all have biases)
reach RLX's packed-QKV form and later the attention-block and layer fusions. This is why our pipeline runs this pass
*before* `fuse_matmul_bias_act` (`rules.linear`; RLX runs it after, so biased Q/K/V never merge).

Validity (numbers equal for every input, up to GEMM summation order): the merge computes `x @ concat(w_i)` and
narrows each `[.., N_i]` back: each column is the same dot product, for rank-2 weights of one dtype (guards
`weights_rank2`, `weights_same_dtype`; a batched weight would concatenate along the wrong axis), and merged biases
are `[N_i]` vectors concatenated in the same order; a member without a bias gets a zero slot, exact since
`y + 0 == y` for every y.
"""

from __future__ import annotations

from ...ir import Graph, Node, Op, Rewriter
from ..allow_list import epilogue_allowed
from ..engine import rule_pass
from ..guard import (
    DOES_NOT_PAY,
    ILLEGAL,
    NOT_PROFITABLE,
    NOT_RECOGNIZED,
    READ_BY_MODEL,
    Ctx,
    extra_readers_why,
    guard,
    use_count,
)
from ..merge_costs import Cost, MergeCosts
from ..pattern import P, describe
from ..rule import QUIET, Fail, Rule, Soft, reports
from .block import model_refusal

# -- fuse_shared_input_matmul --------------------------------------------------------------------
#
# The cost test: a merge must not destroy a fusion a member takes part in. A member whose bias add feeds
# an activation from the epilogue allow-list would lose its epilogue (the activation would read a narrow
# of the merged sum); the members that feed one attention's Q, K and V (directly or through their head
# split and RoPE: GPT-J's, Phi's and CodeGen's parallel blocks read one normed input for Q/K/V and the MLP)
# are merged alone (in Q/K/V order), because anything else in the packed projection makes it wider than
# Q/K/V and costs the attention block. Only a block that can form is protected: where the block refuses the
# attention for the model's own term (`block.model_refusal`: a KV cache, cross-attention), no block forms whatever
# rlxviz's ops gain, and the members merge as any other group (PaLM-style QKV+FC1: one GEMM); a block held back
# only by gaps in rlxviz's ops (RoPE forms) stays protected, since their compiler fixes would form it: also where one
# fix alone is not enough (GPT-J's partial rotary RoPE, then its interleaved RoPE: two gaps, no model term; the
# words say so, `why.fix_words.block_fix_words`). Refused
# members are named in a `merge_keeps_fusions` rejection (kind: not profitable; remedy: `guard.DOES_NOT_PAY`: the
# tool's own rule declined it, so it is no near-miss and no layer is NOT fused for it).


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
    act = us[0] if len(us) == 1 and us[0].op.value in epilogue_allowed() else None
    if act is not None and v == mm.id and any(u.op == Op.MUL for u in g.users(act.id)):
        return None  # a bias-less gate: zero_bias_act leaves it (`_not_gate`)
    return act


def _attention_triple(g: Graph, members: list[Node]) -> tuple[Node, list[Node]] | None:
    """`(attention, members)` when members feed one attention's Q, K and V (operands 0, 1, 2) between them, each
    directly or through its head split, RoPE and scale (`_first_readers`): three members (Q, K, V, in that order),
    or fewer when one is already packed (CodeGen's `qkv_proj`: one member feeds all three). Merging any other member
    with them would make the packed projection wider than Q/K/V, which costs the attention block (`qkv_packed`)."""
    slots: dict[int, dict[int, Node]] = {}  # attention -> operand slot -> member feeding it
    for m in members:
        for a, k in sorted(_first_readers(g, _value(g, m))):
            if k < 3 and g[a].op == Op.ATTENTION:
                slots.setdefault(a, {}).setdefault(k, m)
    for a, by_slot in slots.items():
        if len(by_slot) == 3:
            qkv = list({by_slot[k].id: by_slot[k] for k in range(3)}.values())
            return g[a], qkv
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
        if triple and model_refusal(g, triple[0].id) is not None:
            triple = None  # no block forms here (the model's own term, e.g. a KV cache): nothing to protect
        keep = triple[1] if triple else [m for m in group if _epilogue_of(g, m) is None]
        for m in group:
            if m in keep:
                continue
            act = _epilogue_of(g, m)
            att, h = (triple[0], sum(q.shape[-1] for q in triple[1])) if triple else (None, 0)
            refused.append(Cost(m.id, _label(g, m), act.id if act else None, act.op.value if act else "",
                                att.id if att else None, describe(att, "attention") if att else "",
                                h + m.shape[-1] if att else 0, h))
    for i, m in enumerate(keep):
        c.bindings[f"mm{i}"] = m.id
        c.bindings[f"w{i}"] = m.inputs[1]
    for i in range(len(keep), len(group)):
        c.bindings.pop(f"mm{i}", None)
        c.bindings.pop(f"w{i}", None)
    c.data["n"] = len(keep)
    if not refused:
        return None
    costs = MergeCosts(tuple(refused), tuple(_label(g, m) for m in keep))  # the words are made from it, never read
    ids = tuple(x.member for x in refused)
    fail = Fail("guard", "merge_keeps_fusions", costs.message(), ids, (), subject=ids[0], kind=NOT_PROFITABLE,
                hint="nothing to change in the model: a merge that costs fusions does not pay", remedy=DOES_NOT_PAY,
                fix="a multi-output packed projection whose epilogues apply per slice (PaLM-style QKV+FC1 with one "
                    "GEMM)", costs=costs)
    if len(keep) < 2:  # e.g. a QKV the model already packs into one matmul: fails (hard)
        return fail
    c.data.setdefault("soft", []).append(fail)
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
    # only the merged matmul (`Match.fused`) absorbs the match; the merged bias add re-makes the bias adds; the
    # concats, the zero slots and the narrows replace nothing (`Rewriter.absorbing`)
    with rw.provenance(mms + adds), rw.absorbing():
        wcat = rw.concat([c.id(f"w{i}") for i in range(n)], axis=1)
        with rw.absorbing(mms + adds):
            y = merged = rw.matmul(c.id("x"), wcat)
        if biased:
            dtype = next(c[f"b{i}"].dtype for i in range(n) if f"b{i}" in c)
            parts = [c.id(f"b{i}") if f"b{i}" in c else rw.expand(rw.const(0.0, dtype), (c[f"mm{i}"].shape[-1],))
                     for i in range(n)]
            bias = rw.concat(parts, axis=0)
            with rw.absorbing(adds):
                y = rw.add(y, bias)
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
        "block where the model's own terms let one form)")

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
    MLP's up projections, Q/K/V packed with an MLP projection where no block can form: cohere's prefill with a KV
    cache)."""
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

__all__ = ["QKV_PRODUCT", "SHARED", "SHARED_PRODUCT", "fuse_shared_input_matmul", "merged_product"]
