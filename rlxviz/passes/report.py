"""The missed-fusion report on a pipeline's final graph, in our guard names.

RLX's `fusion_report` re-scans the final graph for three patterns with fixed reasons (docs/rlx.md
§3.1, with false positives). Here misses come from the matcher itself: every rejection of the run
whose anchor or offending nodes are still in the final graph (i.e. no later fusion absorbed
them; being grouped into an `ElementwiseRegion` is not a fusion) is a miss, reported with the rule,
the node, the guard that said no, and the guard's hint.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from ..ir import Graph, Node, Op
from ..ir.identity import DigestCache
from .merge_costs import Cost
from .pipeline import PASSES, STAGES, Pipeline
from .refusal_kinds import kind_words
from .trace import Layer, Rejection, Trace, layer_of, place_label, reading_order


@dataclass(frozen=True)
class MissedFusion:
    """A fusion that did not happen.

    Attributes:
        pattern: the rule, e.g. `fuse_transformer_layer.bert_post_ln`.
        node: the anchor node id (in the graph version the pass saw; still in the final graph or one
            of `offending` is).
        path: its model path.
        guard: the guard or structure step that rejected it (the headline: the first that failed).
        reason: the rejection message (actual vs required values).
        hint: how to fix it in the model.
        kind: `illegal`, `not recognized` or `not profitable` (see `guard.KINDS`).
        fix: the compiler-side fix, if any.
        also: the further failing guards of the same candidate, in order, as `guard (kind): message`.
        remedy: `compiler only` or `read by the model` when no change to the model that keeps its numbers
            makes it legal (`guard.REMEDIES`).
        offending: the rejection's offending nodes (e.g. the extra reader), ids in the version the pass saw.
        dead: the rejection's dead extra readers (`trace.Rejection.dead`), ids in the version the pass saw.
        layer_path: the path that files it in a layer (`trace.Rejection.layer_path`, `trace.REFUSAL_LAYER_RULE`);
            "": `path` does.
    """

    pattern: str
    node: int
    path: str
    guard: str
    reason: str
    hint: str
    kind: str = ""
    fix: str = ""
    also: tuple[str, ...] = ()
    remedy: str = ""
    offending: tuple[int, ...] = ()
    dead: tuple[int, ...] = ()
    layer_path: str = ""

    @property
    def layer(self) -> Layer | None:
        """The layer the miss is filed in, as its refusal's (`trace.Rejection.layer`)."""
        return layer_of(self.layer_path or self.path)

    def __str__(self) -> str:
        hint = f" -> {self.hint}" if self.hint and self.hint not in self.reason else ""
        kind = f" [{self.kind}]" if self.kind else ""
        also = "".join(f"; also {a}" for a in self.also)
        where = place_label(self.node, self.path, with_node=True)
        return f"{self.pattern} @ {where}: {self.guard}{kind}: {self.reason}{hint}{also}"


_RUN_FIRST = re.compile(r"run (\w+) first")


_NODES: DigestCache[dict[int, Node]] = DigestCache(limit=4)


def _all_nodes(trace: Trace) -> dict[int, Node]:
    """Node id -> node over every version of the run (ids are never reused across versions), once per trace."""
    return _NODES.get_or_compute(trace, lambda: {n.id: n for _, g in trace.versions() for n in g})


def _remade_from(nodes: dict[int, Node], n: Node, depth: int = 0) -> tuple[int, ...] | None:
    """The input-graph ids node `n` re-makes: a node a rewrite emitted again in another place (a canonicalization:
    `hoist_scale` re-emits the K path's reshape/expand/transpose above the moved scale) stands for the absorbed
    node of its op (and shape, when several have the op), followed back through earlier rewrites. None for a node
    of the input graph or a product of another op (a fused node is named by its own op)."""
    if not n.pass_name or not n.absorbed or depth > 32:
        return None
    cands = [nodes[a] for a in n.absorbed if a in nodes]
    same = [c for c in cands if c.op == n.op]
    same = [c for c in same if c.shape == n.shape] or same
    out: list[int] = []
    for c in same:
        if not c.pass_name:
            out.append(c.id)
        elif (up := _remade_from(nodes, c, depth + 1)) is not None:
            out += up
    return tuple(dict.fromkeys(out)) or None


def user_origin(trace: Trace, node: int) -> tuple[str, tuple[int, ...]] | None:
    """`(rule, ids)` when node id `node` is not the user's: a rewrite of the run re-made it (`_remade_from`) from
    the input graph's nodes `ids`, e.g. `("fuse_sdpa.hoist_scale", (12,))`; `rule` is the match of the making pass
    that bound one of the nodes it absorbed (its pass name when none did). None for the user's own nodes and for
    products (fused ops)."""
    nodes = _all_nodes(trace)
    n = nodes.get(node)
    if n is None or node in trace.input:
        return None
    ids = _remade_from(nodes, n)
    if ids is None:
        return None
    absorbed = set(n.absorbed)
    rule = next((m.rule for st in trace.steps if st.family == n.pass_name for m in st.matches
                 if absorbed & {m.anchor, *m.bindings.values()}), n.pass_name)
    return rule, ids


_NODE_REF = re.compile(r"\(node (\d+)(?=[,)])(?!, made by )")  # a node named once (a line worded twice)


def name_users_nodes(trace: Trace, text: str) -> str:
    """`text` with every `(node N, ...)` of a node a rewrite re-made (`user_origin`) naming the user's node it
    came from: `k_rep (node 32, made by fuse_sdpa.hoist_scale from your node 12)`, so blame points into the
    user's file, not at a node only the pipeline made."""
    def sub(m: re.Match[str]) -> str:
        o = user_origin(trace, int(m.group(1)))
        if o is None:
            return m.group(0)
        ids = ", ".join(str(i) for i in o[1])
        return f"{m.group(0)}, made by {o[0]} from your node{'s' if len(o[1]) > 1 else ''} {ids}"
    return _NODE_REF.sub(sub, text) if "(node " in text else text


def in_context(trace: Trace, step: int, r: Rejection) -> tuple[str, str]:
    """`_in_context` with every node a rewrite re-made named by the user's node it came from
    (`name_users_nodes`). A headline refusal the layer's kind does not expect, whose hint is empty or already in its
    message (no fix line would print: `fuse_transformer_layer`'s `fc1_is_fused_linear` in a BART decoder layer), has
    the one line that says nothing needs changing and why (`why.standing.unexpected_fix`) as its hint: what
    `explain -v`, `--json` and the app's table print after "fix". A place the model's own term holds
    (`why.standing.held_by`) has that term's hint: nothing to change in the model."""
    message, hint = _in_context(trace, step, r)
    if r.headline and not r.soft:
        from .why.standing import held_by, unexpected_fix  # the verdict's package reads this module

        if (term := held_by(trace, r)) is not None:  # the model's own term holds the place (t5's cross-attention):
            hint = _in_context(trace, step, term)[1]  # its fix line, never the gap's workaround that does not fuse
        elif (not hint or hint in message) and not r.fix:
            hint = unexpected_fix(trace, r) or hint
    return name_users_nodes(trace, message), name_users_nodes(trace, hint)


def _in_context(trace: Trace, step: int, r: Rejection) -> tuple[str, str]:
    """`(message, hint)` of rejection `r` (recorded by `trace.steps[step]`), with every "run P first" advice
    replaced by what P decided when P already ran before this pass: its rejection on the same nodes
    (e.g. `biases_mergeable`, `merge_keeps_fusions`, worded in context too: its own "run Q first" says what Q
    decided), that it fused nodes a few edges above these (its product then feeds what this pattern refused: a RoPE,
    a norm between the QKV projection and the attention), or that it had no candidate there. A "run P first" stays
    only where P is not in the pipeline or runs after this pass (the advice is then the fix)."""
    said: dict[str, str] = {}

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in said:
            said[name] = _what_ran(trace, step, r, name) or m.group(0)
        return said[name]

    return _RUN_FIRST.sub(sub, block_cost_in_context(trace, r)), _RUN_FIRST.sub(sub, r.hint)


BLOCK_PASS = "fuse_attention_block"
"""The pass whose block `fuse_shared_input_matmul`'s cost test protects (`rules.shared_input`)."""


def _block_formed(trace: Trace, att: int) -> bool:
    """Whether a FusedAttentionBlock of the run (in any version: a later layer fusion may take it) took attention
    `att`, followed through the rewrites that re-made it (`_with_absorbed`: fuse_attention_block's qkv stage)."""
    blocks = [n.id for n in _all_nodes(trace).values() if n.op == Op.FUSED_ATTENTION_BLOCK]
    return any(att in _with_absorbed(trace, {b}) for b in blocks)


def _block_refusal(trace: Trace, att: int) -> Rejection | None:
    """The headline refusal of `BLOCK_PASS` anchored at attention `att` or at an attention re-made from it
    (cohere's node 233 became node 259 in fuse_attention_block's qkv stage): one at a gap in rlxviz's ops first
    (`why.standing.place_gaps`), else the last; None when it refused none there."""
    from .why.standing import place_gaps  # the verdict's package reads this module

    found = [x for s in trace.steps if s.family == BLOCK_PASS and not s.error for x in s.rejections
             if x.headline and not x.soft and att in _with_absorbed(trace, {x.anchor})]
    return next((x for x in found if place_gaps(trace, x)), found[-1] if found else None)


def block_cost_in_context(trace: Trace, r: Rejection) -> str:
    """The message of rejection `r` of `trace`, with each attention block a cost test protects (`r.costs`,
    `merge_costs.Cost.attention`) that did not form in the end (`_block_formed`) named as what holds it back here
    (`block_in_context`); `r.message` itself for a refusal that records no costs."""
    return r.message if r.costs is None else r.costs.message(lambda c: block_in_context(trace, c))


def block_in_context(trace: Trace, c: Cost) -> str | None:
    """The attention block that the member of cost `c` would cost, worded as what holds it back where it did not form
    in the end (`_block_formed`), from `BLOCK_PASS`'s refusal at that attention (`_block_refusal`): at a gap in
    rlxviz's ops, `the attention block at attention (node 233, PATH) that FusedAttentionBlock with interleaved RoPE
    would form (rlxviz lacks it: rope_halves; the compiler fix forms it; Q/K/V packed ...)`, or where that fix alone
    is not enough or not checked, as the headline says it (`why.fix_words.block_fix_words`: gptj's `(rlxviz lacks
    it: rope_full_rotary, a compiler fix; alone it is not enough: rope_halves (...) fails next; Q/K/V ...)`). The
    cost test protects such a block on purpose (the compiler fixes of its gaps form it), but "it would cost the
    attention block" beside no block claimed a cost this run does not pay. None where the block formed, or `c`
    protects none: the words as recorded (`Cost.block`)."""
    if c.attention is None or _block_formed(trace, c.attention):
        return None
    from .why.fix_words import FIX_FORMS_IT
    from .why.standing import place_fix_words, place_gaps  # the verdict's package reads this module

    x = _block_refusal(trace, c.attention)
    head, why = f"the attention block at {c.attention_label}", c.packed
    if x is None:
        ran = any(s.family == BLOCK_PASS for s in trace.steps)
        said = "made none there" if ran else "is not in the pipeline"
        return f"{head}, which does not form in this run ({BLOCK_PASS} {said}; {why})"
    gaps = place_gaps(trace, x)
    if gaps:
        # what the headline says of this fix (newcomer run 38: gptj's "the compiler fix forms it" beside a headline
        # saying rope_halves fails next after it): its own checks, not the group's
        fix = place_fix_words(trace, x)
        sep = "; " if fix == FIX_FORMS_IT else ", "  # `rope_halves; the compiler fix ...`, `X, a compiler fix; ...`
        return f"{head} that {' and '.join(gaps)} would form (rlxviz lacks it: {x.guard}{sep}{fix}; {why})"
    return f"{head}, which {x.rule} does not form here ({x.guard}: {kind_words(x.kind, x.dead)}; {why})"


def fix_line(trace: Trace, step: int, r: Rejection) -> str:
    """The line `explain` prints after `fix:` for rejection `r` of `trace.steps[step]`: its hint in context
    (`in_context`) unless the message already holds it (`passes.explain.Outcome.lines` prints no fix line then);
    else "". The app's matches table and graph tooltips show this as the fix, never a copy of the message. Read on
    the run with its fixes vetted (`session.advice.vetted`), it is `--json`'s `fix_checks[].fix` (null: "") for
    every refusal `explain` checks: the table once named an earlier pass's refusal's fix here ("fix
    fuse_attention_block's refusal first ..."), a fix `explain` never printed, proposed on a refusal the layer
    does not expect (granite's `attn_is_fused_block`)."""
    message, hint = in_context(trace, step, r)
    return hint if hint and hint not in message else ""


def _refused_by(trace: Trace, step: int, r: Rejection, name: str) -> tuple[int, Rejection] | None:
    """`(step, refusal)`: the last headline refusal of pass `name`, run before `trace.steps[step]`, on rejection
    `r`'s nodes or their producers: first one whose place binds a node `r`'s failed check blames (`r.offending`:
    beit's layer-1 `ln1` blames attn's user, the layer-scale mul %123, which fuse_residual_ln's refusal at the sum
    %124 binds as its x; its refusal at the layer input's sum %89, where %124 is only an extra reader, is another
    place), then one anchored there (a refusal that only shares a node read by several layers, one RoPE table or
    mask, is another layer's); None when it refused none there (or did not run before).
    A refusal's nodes are what it marks (its subject and offending nodes) and its bound nodes less those its pass
    took in a match of the same step: cohere's `merge_keeps_fusions` binds the Q/K/V projections its
    pass merged (node 352) and marks only the MLP's matmul (node 346), which feeds no RoPE; citing it there told a
    user to change a cost test that never stood in the way. `biases_mergeable` marks a merged projection whose
    bias stayed apart: that one is still its refusal's."""
    mine = {*r.bindings.values(), *r.offending, r.anchor}
    related = []
    for k, s in enumerate(trace.steps[:step]):
        if s.pass_name != name or s.error:
            continue
        near = _producers(s.before, mine)
        taken = {i for m in s.matches for i in (*m.bindings.values(), m.anchor)}
        for x in s.rejections:
            marked = {*x.offending, *([x.subject] if x.subject is not None else [])}
            refused = marked | ({*x.bindings.values(), x.anchor} - taken)
            if x.headline and refused & near:
                related.append((2 if set(r.offending) & {*x.bindings.values()} else int(x.anchor in near), k, x))
    best = max((at for at, _, _ in related), default=0)
    pick = [(k, x) for at, k, x in related if at == best]
    return pick[-1] if pick else None


def _what_ran(trace: Trace, step: int, r: Rejection, name: str) -> str | None:
    """What pass `name` decided about rejection `r`'s nodes when it ran before `trace.steps[step]` (None: it did
    not run before: it is not in the pipeline, it runs later, or it crashed)."""
    earlier = [(k, s) for k, s in enumerate(trace.steps[:step]) if s.pass_name == name and not s.error]
    if not earlier:
        return None
    mine = {*r.bindings.values(), *r.offending, r.anchor}
    before = trace.steps[step].before
    near = _producers(before, mine, depth=4)
    layer = r.layer
    # one layer's own producers at any depth: esm's Q is scaled and biased between the merged QKV matmul and
    # the RoPE, more than 4 edges above the attention; a product in another layer is no part of this place
    close = _with_absorbed(trace, near)
    upstream = close | _with_absorbed(trace, (
        {i for i in _producers(before, mine, depth=len(before)) if layer_of(before[i].path) == layer}
        if layer is not None else set()))
    matched = [(x, s.after) for _, s in earlier for x in s.matches if x.fused is not None]
    made = [(x, after) for x, after in matched if x.fused in close]
    above = [(x, after) for x, after in matched if x.fused in upstream]
    related = _refused_by(trace, step, r, name)
    if related:
        k, x = related
        from .why.standing import held_by, place_gaps  # the verdict's package reads this module

        x = held_by(trace, x) or x  # held by the model's own term (t5's cross-attention): say that term, not the gap
        message = _in_context(trace, k, x)[0]  # k < step: its own "run Q first" in context too

        gaps = place_gaps(trace, x)  # at a gap in rlxviz's ops: say so, as its own line and the marks do (issue 39)
        said = f"a gap in rlxviz's ops: {' and '.join(gaps)}" if gaps else kind_words(x.kind, x.dead)
        return f"{name} ran before and said no here: {x.guard} ({said}): {message}"
    if made:  # P did its part on these nodes: what blocks is between its product and this pattern, or beside it
        x, after = made[-1]
        where = ("stands between that product and this one" if _feeds(trace, before, x.fused, r) else
                 "lies beside that product (on an operand it does not feed)")  # mobilebert's V, another projection
        return (f"{name} ran before and did its part here ({x.rule} -> {_op_of(after, x.fused)}, node {x.fused}); "
                f"what this pattern does not take {where}")
    if above:  # further up in the layer: what blocks may lie past that product (esm's Q scale) or beside it
        x, after = above[-1]  # (mobilebert's V, projected from another input)
        return (f"{name} ran before and did its part in this layer ({x.rule} -> {_op_of(after, x.fused)}, node "
                f"{x.fused}, above these nodes); what this pattern refuses lies past or beside that product")
    elsewhere = [(x, after) for x, after in matched if layer is not None and x.layer == layer]
    if elsewhere:  # P matched in this layer, on nodes these do not read: "no candidate here" would be false
        x, after = elsewhere[-1]
        return (f"{name} ran before and matched in this layer ({x.rule} -> {_op_of(after, x.fused)}, node "
                f"{x.fused}), but not on the nodes this pattern reads")
    return f"{name} ran before but had no candidate here (its pattern did not match these nodes)"


def _feeds(trace: Trace, g: Graph, product: int, r: Rejection) -> bool:
    """Whether `product` (or the node of `g` that absorbed it) lies above the node rejection `r`'s failed check is
    about (its `subject`, else its `offending` nodes, else its anchor): then what the pattern does not take stands
    between the two. esm's reshape between the merged QKV matmul and the RoPE does; mobilebert's V, projected from
    another input than the merged Q/K matmul (the subject), does not."""
    blamed = {r.subject} if r.subject is not None else set(r.offending) or {r.anchor}
    above = _producers(g, blamed, depth=len(g))
    return product in _with_absorbed(trace, above)


def _with_absorbed(trace: Trace, ids: set[int]) -> set[int]:
    """`ids` and every node id they absorbed, followed back through later rewrites: esm's merged QKV matmul (node
    181) lives on inside the FusedMatMulBiasAct (node 194) that took it with its bias, so the attention's operands
    still come from it."""
    nodes = _all_nodes(trace)
    out, todo = set(ids), list(ids)
    while todo:
        n = nodes.get(todo.pop())
        new = set(n.absorbed) - out if n is not None else set()
        out |= new
        todo += new
    return out


def _op_of(g: Graph, node: int) -> str:
    """The op of `node` in `g` (e.g. `matmul`), or "its product" where `g` no longer holds it."""
    return g[node].op.value if node in g else "its product"


def _producers(g: Graph, ids: set[int], depth: int = 3) -> set[int]:
    """`ids` (those in `g`) and their operands up to `depth` edges up (the nodes an earlier pass may have
    decided about: e.g. the matmul under a bias add that a later pattern found in the wrong place)."""
    seen = {i for i in ids if i in g}
    frontier = set(seen)
    for _ in range(depth):
        frontier = {j for i in frontier for j in g[i].inputs} - seen
        seen |= frontier
    return seen


REGION_PASS = "mark_elementwise_regions"


def _in_regions(trace: Trace) -> set[int]:
    """Ids of the nodes that `mark_elementwise_regions` absorbed into an `ElementwiseRegion` still in the final
    graph (they left the graph only by being grouped, not by any rule fusing them)."""
    final = trace.final
    return {i for s in trace.steps if s.pass_name == REGION_PASS and not s.error for m in s.matches
            if m.fused is not None and m.fused in final for i in m.bindings.values()}


def taken_by(trace: Trace, step: int, r: Rejection) -> str:
    """What a later pass did with a node of the refusal `r` (of step `step` of `trace`) that its rule names as
    settling it (`Rule.taken_later`): `its matmul was fused later by fuse_attention_block into %148` when that pass
    fused it into its product (an ElementwiseRegion aside: it fuses nothing a rule wanted), else "". clip-text's bias
    added after the residual at the attention's output projection, whose matmul FusedAttentionBlock takes after all:
    such a place is no standing miss, nor a standing gap in rlxviz's ops (`why.standing.standing`'s taken-later
    group)."""
    p = STAGES.get(r.pass_name) or PASSES.get(r.pass_name)
    rule = next((x for x in (p.rules if p is not None else ()) if x.name == r.rule), None)
    ids = {r.bindings[x]: x for x in (rule.taken_later if rule is not None else ()) if x in r.bindings}
    for s in trace.steps[step + 1:] if ids else ():
        if s.pass_name == REGION_PASS or s.error:
            continue
        for m in s.matches:
            if m.fused is None or m.fused not in s.after:
                continue
            took = next((i for i in s.after[m.fused].absorbed if int(i) in ids), None)
            if took is not None:
                before = trace.steps[step].before
                what = before[int(took)].op if int(took) in before else ids[int(took)]
                return f"its {what} was fused later by {s.pass_name} into %{m.fused}"
    return ""


def taken_later(trace: Trace, step: int, r: Rejection) -> bool:
    """Whether a later pass took a node of the refusal `r` that settles it (`taken_by`)."""
    return bool(taken_by(trace, step, r))


def taken_places(trace: Trace) -> dict[tuple[str, int], str]:
    """Each place (rule, anchor) of `trace` whose headline refusal a later pass took (`taken_by`) -> its words: the
    places no view may call a near-miss or a gap (`why.facts.taken_places` keeps it per run)."""
    return {(r.rule, r.anchor): w for k, s in enumerate(trace.steps) for r in s.rejections
            if r.headline and (w := taken_by(trace, k, r))}


def missed_fusions(source: Graph | Trace, pipeline: Pipeline | None = None) -> list[MissedFusion]:
    """Misses of a run (a `Trace`, or a graph run through `pipeline`, default canonical), in pass order.

    A rejection counts when its anchor or one of its offending nodes survives in the final graph, or was
    only absorbed into an `ElementwiseRegion` that survives (`mark_elementwise_regions` groups leftover
    elementwise ops; it fuses nothing a rule wanted, e.g. a decomposed GELU whose constant a recognizer
    rejected is still a miss inside the region), unless a later pass fused the node its rule names as settling it
    (`taken_later`); duplicates (same rule and anchor) keep the last pass's reason. Each miss carries its headline
    guard and the further failing guards of the same candidate.
    """
    trace = source if isinstance(source, Trace) else (pipeline or Pipeline.canonical()).run(source)
    final = trace.final
    regioned = _in_regions(trace)
    out: dict[tuple[str, int], MissedFusion] = {}
    for k, s in enumerate(trace.steps):
        own = s.pass_name == REGION_PASS
        for r in s.rejections:
            if not r.near_miss:  # the model's own structure, or not a candidate: reported by `left_out`
                continue
            if not r.headline or not any(i in final or (not own and i in regioned)
                                         for i in (r.anchor, *r.offending)) or taken_later(trace, k, r):
                continue
            also = tuple(f"{o.guard} ({o.kind}): {in_context(trace, k, o)[0]}" for o in s.rejections
                         if not o.headline and o.rule == r.rule and o.anchor == r.anchor)
            message, hint = in_context(trace, k, r)
            out[(r.rule, r.anchor)] = MissedFusion(r.rule, r.anchor, r.path, r.guard, message, hint, r.kind,
                                                   r.fix, also, r.remedy, r.offending, r.dead, r.layer_path)
    return list(out.values())


def left_out_rejections(trace: Trace, layers: Collection[int] | None = None) -> list[Rejection]:
    """The rejections `left_out` lists, in the order a reader walks the model (`trace.reading_order`: by layer, then
    the anchor's position in the graph, then pass order; the app's matches table's order): what fusions that happened
    left out (their soft
    rejections, e.g. a refused merge, an additive mask kept, an activation not absorbed) and the refusals that are no
    near-miss (`Rejection.near_miss`: the model's own term kept out of a fusion, cross-attention and
    FusedAttentionBlock; nodes that only look like a rule's input, the embeddings' broadcast sum; a merge the tool's
    own cost test declined, `guard.DOES_NOT_PAY`), each by its headline refusal, except those already reported as
    missed fusions. A place that is no near-miss is listed whether or not its anchor survives: the app's version chips
    count it (`why.places.places`) even where a later fusion took its nodes (Falcon's QKV merge declined, then the
    QKV matmul absorbed into the FusedAttentionBlock), so the text lists every place a chip counts. With `layers`,
    only rejections whose node path lies in one of those layers (a question about layer N is not answered with the
    embeddings' line)."""
    missed = {(m.pattern, m.node) for m in missed_fusions(trace)}
    rows = [r for r in trace.rejections if (r.rule, r.anchor) not in missed
            and (layers is None or r.layer in layers) and (
                r.soft or (not r.near_miss and r.headline))]
    key = reading_order(trace)
    return sorted(rows, key=lambda r: key(r.layer, r.anchor))  # stable: pass order between places of one anchor


def left_out_line(trace: Trace, r: Rejection) -> str:
    """One line of `left_out`: `RULE @ %ANCHOR (PATH): GUARD [KIND]: MESSAGE`, a protected attention block that did
    not form named as what holds it back (`block_cost_in_context`, as `in_context` words it for the app; the app's
    chips say the same line's place and message, `why.places.own_item`)."""
    place = place_label(r.anchor, r.path, with_node=True)
    return f"{r.rule} @ {place}: {r.guard} [{r.kind}]: {block_cost_in_context(trace, r)}"


def left_out(trace: Trace, layers: Collection[int] | None = None) -> list[str]:
    """`left_out_rejections` one line each (`left_out_line`). Which of them a fusion left out and which are no
    near-miss is the verdict's to say (`passes.why.verdict.RunVerdict.left_out_groups`)."""
    return [left_out_line(trace, r) for r in left_out_rejections(trace, layers)]


def format_report(trace: Trace) -> str:
    """A short text report: node counts before/after, fused-op counts, then the misses."""
    before, after = trace.input, trace.final
    fused = after.fused_op_counts()
    lines = [f"fusion report ({trace.pipeline}): nodes {len(before)} -> {len(after)}; "
             + ", ".join(f"{k}={v}" for k, v in fused.items())]
    errors = [s for s in trace.steps if s.error]
    lines += [f"  ERROR in {s.pass_name}: {s.error}" for s in errors]
    missed = missed_fusions(trace)
    if missed:
        lines.append("  missed:")
        lines += [f"    {m}" for m in missed]
    return "\n".join(lines)


__all__ = ["MissedFusion", "block_cost_in_context", "block_in_context", "fix_line", "format_report", "in_context",
           "left_out", "left_out_line", "left_out_rejections", "missed_fusions", "taken_by",
           "taken_later",
           "taken_places"]
