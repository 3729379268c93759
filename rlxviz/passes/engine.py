"""The engine: find every match of a pass's rules on one graph snapshot, then rewrite once.

Cost is linear in the graph: candidates come from one walk over the nodes (anchor op filter),
each candidate's steps follow operands and the snapshot's O(1) def-use index (`graph.users`), and
one `Rewriter` builds the next version. RLX re-scans every node per candidate (docs/rlx.md §7.1).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..ir import Graph, GraphError, Node, Rewriter
from ..ir.emitter import normalize_attrs
from ..ir.infer import ShapeError, TensorType, broadcast, infer
from ..ir.ops import ELEMENTWISE, Op, operand_roles
from .declarations import FAMILIES, QUANTIZATION, TRAITS, check_words
from .guard import ILLEGAL, NOT_PROFITABLE, NOT_RECOGNIZED, Ctx
from .pattern import RuleError, describe
from .rule import Fail, Rule, Soft
from .search import attempt
from .trace import STAGE_SEP, Match, Rejection, refusal_layer_path


@dataclass
class PassResult:
    """A pass's output graph and its decisions."""

    graph: Graph
    matches: list[Match] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)


PassFn = Callable[[Graph, Mapping[str, Any]], PassResult]


@dataclass(frozen=True)
class Pass:
    """A named graph transformation.

    Attributes:
        name: e.g. `fuse_attention_block`.
        fn: `(graph, params) -> PassResult`.
        rules: the pass's rules in priority order (empty for non-pattern passes such as DCE).
        requires: passes whose output this pass matches (used in hints and docs).
        doc: one line for the UI.
        product: what the pass makes, as a layer's expectations name it (e.g. `FusedSwiGLU`); "" for a pass that
            makes nothing a layer is expected to have (DCE, region marking).
        expected_of: the layer traits (`passes.why.kinds.LayerArchitecture.has`: a kind such as `post_ln`, or
            `keep_mask`, `pre_norm`, `kv_cache`) of which the product is expected; () for every layer the pass has a
            candidate in. A refusal in a layer with none of them does not count (`unexpected` says why).
        excused_by: `(trait, why)` pairs: a layer with the trait does not expect the product at all (checked first).
        unexpected: why the product is not expected of a layer without an `expected_of` trait: a text (formatted
            with the layer kind's `description` and `mask`, the pass's `product`, and `expected`: its `expected_of`
            traits in words, `declarations.TRAIT_WORDS`, joined by "or") or a function of the layer kind. It is
            said after the refusal's own reason (`why.policy.not_expected_line`), so it says only what is true of
            every layer without those traits.
        whole_layer: the product is a whole layer as one node (`FusedTransformerLayer`): the verdict finds the layer
            pass by this flag (`why.policy.layer_pass`, exactly one registered pass has it), and a layer that
            expects it is named as expecting nothing else (the layer op absorbs the other products). Needs `product`
            and `expected_of`.
        recognizes_families: the `passes.unrecognized` families (`declarations.FAMILIES`) whose chains the pass's
            rules recognize: a finding of such a family in a run without the pass is what the pipeline cannot make,
            not a form no rule knows (`why.facts.RunFacts.misses`).
        quantization: `(mode, why)`: what a layer with quantized activations does to the pass (a mode of
            `declarations.QUANTIZATION`: `breaks`, a quantization step of an intermediate value breaks the pattern;
            `attention`, the product holds the attention, not expected when the attention stayed primitives), and
            why, for the reader of the pass; () when quantization does not excuse its refusals.
        listed_for: `(trait, qualifier)` pairs: a layer with the trait names the product among what it should end
            with (`why.policy.expected_products`, for messages), as `product (qualifier)` or, with "", as
            `product`; the first pair whose trait the layer has wins. A pass with `expected_of` is listed for those
            traits without saying so.
        stages: exact canonicalizations run before the pass's own rules, in order, each its own pipeline step (named
            `NAME/STAGE`, `stage`): a user sees the graph before and after each and can switch one off
            (`Pipeline.disable`). Their records keep the pass's name (`Match.pass_name`), and they declare no
            product: what they refuse is their own rule's near miss. Called directly, the pass runs its stages and
            its own rules as one (`compose`).
        product_of: `(graph after the pass, a node it made (Match.fused)) -> the product's name for that node`,
            for a pass whose product is named by what it merged (`shared-input QKV matmul` only for an attention's
            q/k/v, else `shared-input matmul`); None: `product` for every match.
        lacks: `(trait, op form, compiler fix)` triples: a layer with the trait gets no product of this pass from
            rlxviz's ops whatever the model does (e.g. `integer_qkv`: no FusedAttentionBlock over integer-matmul
            projections): every refusal of the pass there is a gap in rlxviz's ops, the form named (with the failing
            guard's own gap, `Guard.lacking`), not the model's layout and no near-miss (`why.policy.op_gaps`); the
            layer is fused only as far as rlxviz's ops go. Checked after `excused_by`.
    """

    name: str
    fn: PassFn
    rules: tuple[Rule, ...] = ()
    requires: tuple[str, ...] = ()
    doc: str = ""
    product: str = ""
    expected_of: tuple[str, ...] = ()
    excused_by: tuple[tuple[str, str], ...] = ()
    unexpected: str | Callable[[Any], str] = ""
    whole_layer: bool = False
    recognizes_families: tuple[str, ...] = ()
    quantization: tuple[str, str] = ()
    listed_for: tuple[tuple[str, str], ...] = ()
    stages: tuple[Pass, ...] = ()
    product_of: Callable[[Graph, int], str] | None = None
    lacks: tuple[tuple[str, str, str], ...] = ()

    def __post_init__(self) -> None:
        self._check_policy()
        for st in self.stages:
            if st.name.partition(STAGE_SEP)[0] != self.name or not st.name.partition(STAGE_SEP)[2] or st.stages:
                raise ValueError(f"[Pass {self.name}] stage {st.name!r} must be named {self.name}{STAGE_SEP}NAME and "
                                 f"have no stages of its own")

    def _check_policy(self) -> None:
        """The declarations `why.policy` reads that the pass checks where it is written (`expected_of`, `excused_by`
        and the guards' excuses are checked over the registry, `why.policy.check_declarations`).

        Raises:
            RuleError: a misspelt family, quantization mode or layer trait (naming the close one), a quantization
                without its reason, `listed_for` without a product, or `whole_layer` without `product` and
                `expected_of`.
        """
        owner = f"Pass {self.name}"
        check_words(owner, "unrecognized family", self.recognizes_families, FAMILIES)
        if self.quantization:
            if len(self.quantization) != 2 or not self.quantization[1]:
                raise RuleError(f"[{owner}] quantization must be (mode, why); got {self.quantization!r}")
            check_words(owner, "quantization mode", self.quantization[:1], QUANTIZATION)
        check_words(owner, "layer trait", (t for t, _ in self.listed_for), TRAITS)
        check_words(owner, "layer trait", (t for t, *_ in self.lacks), TRAITS)
        if any(len(x) != 3 or not x[1] for x in self.lacks) or (self.lacks and not self.product):
            raise RuleError(f"[{owner}] lacks must be (trait, op form, compiler fix) of a pass with a product; got "
                            f"{self.lacks!r}")
        if self.listed_for and not self.product:
            raise RuleError(f"[{owner}] listed_for without a product: say what the layer should end with")
        if self.whole_layer and not (self.product and self.expected_of):
            raise RuleError(f"[{owner}] whole_layer needs a product and the layer traits that expect it "
                            f"(expected_of)")

    def __call__(self, graph: Graph, params: Mapping[str, Any] | None = None) -> PassResult:
        if self.stages:
            return compose(graph, params or {}, [*self.stages, self.fn])
        return self.fn(graph, params or {})

    def rewrite(self, graph: Graph) -> tuple[Graph, list[Match]]:
        """The pass run on `graph` with no parameters, as a plain rewrite: its output graph and its matches (its
        refusals dropped); `(graph, [])` when nothing matched."""
        r = self(graph)
        return r.graph, r.matches

    @property
    def own(self) -> Pass:
        """The pass without its stages: its own rules alone (the last of its pipeline steps)."""
        return replace(self, stages=()) if self.stages else self

    @property
    def params(self) -> tuple[str, ...]:
        """The pipeline parameters its rules' guards and steps read (`Guard.params`), its stages' included: a
        pipeline holding the pass accepts them besides `PipelineParams`' fields."""
        steps = (s.step if isinstance(s, Soft) else s for p in (*self.stages, self) for r in p.rules for s in r.steps)
        return tuple(dict.fromkeys(p for s in steps for p in getattr(s, "params", ())))


def stage(parent: str, name: str, p: Pass, doc: str = "") -> Pass:
    """`p` as stage `name` of pass `parent` (step name `parent/name`); its function and its records are `p`'s (a
    rule pass made with `rule_pass(parent, ...)` records its matches under `parent`)."""
    return replace(p, name=f"{parent}{STAGE_SEP}{name}", doc=doc or p.doc, product="", expected_of=(), excused_by=(),
                   unexpected="", whole_layer=False, recognizes_families=(), quantization=(), listed_for=(), lacks=())


@dataclass
class Found:
    """A successful match before rewriting."""

    rule: Rule
    anchor: int
    ctx: Ctx


def _rejection(pass_name: str, rule: Rule, anchor: int, f: Fail, ctx: Ctx, headline: bool = True,
               soft: bool = False) -> Rejection:
    return Rejection(pass_name, rule.name, anchor, f.stage, f.guard, f.message, dict(ctx.bindings), f.offending,
                     f.edges, ctx.graph[anchor].path, f.hint, f.subject, f.kind, f.fix, f.needed, f.found, headline,
                     soft, f.remedy, f.roles, f.dead, refusal_layer_path(ctx.graph, ctx.bindings, rule.core), f.costs)


def try_rule(rule: Rule, graph: Graph, anchor: int, params: Mapping[str, Any]) -> Ctx | Fail:
    """Run `rule` at `anchor`; returns the bound context, or the headline failure (quiet if not applicable)."""
    ctx, fails = attempt(rule, graph, anchor, params)
    return fails[0] if fails else ctx


def refusal(rule: Rule, graph: Graph, anchor: int, params: Mapping[str, Any] | None = None) -> str:
    """Why `rule` refuses the candidate at node `anchor`: its headline failure's message, "" when it matches there
    or is not applicable (its anchor or a quiet step says the node is no candidate). Another rule's guard quotes it
    to name a rewrite that did not happen (`fuse_sdpa`'s `rope_on_heads`: the rotation `rope_heads` refused), so
    the reason is the rule's own, never a second recognizer's."""
    _, fails = attempt(rule, graph, anchor, params or {})
    return fails[0].message if fails and not fails[0].quiet else ""


def _build_type_error(rule: Rule, ctx: Ctx) -> Fail | None:
    """For a one-node rewrite (`Rule.build`), a failure when the fused op's shape rule refuses the matched operands
    or gives another type than the node it replaces (a scalar fc2 bias made FusedTransformerLayer raise mid-pass:
    every pass then crashed instead of refusing the match); None when it fits. Guards cannot foresee every dtype
    and shape a graph holds, so the fused node's own type rule decides before anything is rewritten."""
    if rule.build is None or rule.rewrite is not None:  # a custom rewrite may replace build's placeholders
        return None
    op, inputs, attrs = rule.build(ctx)
    g = ctx.graph
    result = g[ctx.id(rule.result_role(ctx))]
    want, what = result.type, f"{ctx.d(rule.result_role(ctx))} is {result.type}"
    if rule.outputs:  # a multi-output rewrite: the values packed on the last axis (`Rewriter.fuse_packed`)
        parts = [result, *(g[ctx.id(r)] for r in rule.outputs)]
        want = TensorType((*result.shape[:-1], sum(p.shape[-1] if p.shape else 1 for p in parts)), result.dtype)
        what = f"the packed outputs {', '.join(f'{ctx.d(r)} {g[ctx.id(r)].type}' for r in rule.outputs)} " \
               f"and {what} make {want}"
        if any(p.shape[:-1] != result.shape[:-1] or p.dtype != result.dtype or not p.shape for p in parts):
            return Fail("guard", "fused_types", f"{op.value} cannot replace the match: outputs of a multi-output "
                        f"rewrite pack on the last axis, and {what}", (result.id,), (),
                        "none in the model: the outputs must agree in every dim but the last, and in dtype",
                        subject=result.id, kind=ILLEGAL, fix=f"a {op.value} with separate outputs")
    try:
        t = infer(op, normalize_attrs(op, dict(attrs)), [g[i].type for i in inputs])
    except ShapeError as e:
        why = str(e)
    else:
        if t == want:
            return None
        why = f"it would give {t}, where {what}"
    if (exact := _exact_broadcast(op, dict(attrs), list(inputs), g, want)) is not None:
        said = "; ".join(f"{_operand_name(ctx, i)} as {t}" for i, t in exact)
        first = exact[0][0]
        return Fail("guard", "fused_types", f"{op.value} cannot replace the match: {why}", (result.id,), (),
                    f"{'store' if g[first].op in _LEAVES else 'broadcast'} {said}: the same numbers (every reader "
                    f"broadcasts it to the same result)", subject=first, kind=NOT_RECOGNIZED,
                    fix=f"let {op.value} broadcast " + "; ".join(f"a {g[i].type} operand to {t}" for i, t in exact))
    return Fail("guard", "fused_types", f"{op.value} cannot replace the match: {why}", (result.id,), (),
                "none in the model: the fused op's operands must have the shapes and dtypes it is defined for",
                subject=result.id, kind=ILLEGAL, fix=f"extend {op.value} to these operand types")


_LEAVES = (Op.PARAM, Op.CONST)
_BROADCASTING = ELEMENTWISE | {Op.ELEMENTWISE_REGION}
"""Readers that broadcast every operand (NumPy's rule): an operand broadcast further before gives the same result."""
_BROADCAST_ADDED: dict[Op, frozenset[str]] = {Op.FUSED_MATMUL_BIAS_ACT: frozenset({"bias"})}
"""Fused ops' operands (by role, `ir.ops.operand_roles`) that are added with a broadcast (`ir.fused`'s
decomposition: `add(matmul(x, w), bias)`), so a bias of shape `[]`, `[1]` or `[N]` gives the same result."""
_EXACT_COMBOS = 256
"""At most this many combinations of operand shapes are tried by `_exact_broadcast` (each is one `infer` call)."""


def _operand_name(ctx: Ctx, node_id: int) -> str:
    """`encoder.layer.1.output.dense.bias (node 65, ...)` for a parameter, else the node as the match names it."""
    n = ctx.graph[node_id]
    return describe(n, n.name) if n.op in _LEAVES and n.name else ctx.name_of(node_id)


def _broadcasts_to(s: tuple[int, ...], t: tuple[int, ...]) -> bool:
    """Whether shape `s` broadcasts to `t` (NumPy's rule, `ir.infer.broadcast`: `s` and `t` broadcast to `t`)."""
    try:
        return broadcast(s, t) == t
    except ShapeError:
        return False


def same_for_readers(g: Graph, node_id: int, t: TensorType) -> bool:
    """Whether giving node `node_id` the type `t` (its value broadcast to `t`, same dtype) leaves every reader's
    result unchanged: each reader broadcasts it (an elementwise op, `_BROADCASTING`, or a fused op's operand of
    `_BROADCAST_ADDED`) and its type stays the same with `t`, and the node is no graph output. Then every number
    the graph computes and returns is the same: an elementwise op of a broadcast operand is the op of the operand
    broadcast further."""
    if g.is_output(node_id) or not g.users(node_id):
        return False
    for u in g.users(node_id):
        slots = operand_roles(u.op, dict(u.attrs), len(u.inputs))
        if u.op not in _BROADCASTING and not all(_BROADCAST_ADDED.get(u.op, ()) and slots[k] in _BROADCAST_ADDED[u.op]
                                                 for k, i in enumerate(u.inputs) if i == node_id):
            return False
        try:
            got = infer(u.op, normalize_attrs(u.op, dict(u.attrs)), [t if i == node_id else g[i].type
                                                                      for i in u.inputs])
        except ShapeError:
            return False
        if got != u.type:
            return False
    return True


def _exact_broadcast(op: Op, attrs: dict[str, Any], inputs: list[int], g: Graph, want: TensorType
                     ) -> list[tuple[int, TensorType]] | None:
    """The operands (node id, shape to store) whose only difference from what `op` takes is a broadcast that gives
    the same result (a scalar or `[1]` bias for `[N]`, `[1, N]` for `[N]`), when giving them those shapes makes the
    fused op's type rule accept the match with type `want`; None when no such fix exists (a dtype mismatch, a
    shape that needs more than a broadcast, a reader whose result would change).

    Validity: each operand keeps its dtype and values, only broadcast to a shape its readers already broadcast it
    to (`same_for_readers`), so every reader computes the same numbers. Candidate shapes are the trailing parts of
    the result's and the other operands' shapes, and the operand's own shape without leading 1s."""
    types = [g[i].type for i in inputs]
    pool = {want.shape[k:] for k in range(len(want.shape) + 1)}
    pool |= {t.shape[k:] for t in types for k in range(len(t.shape) + 1)}
    options: list[list[tuple[int, ...] | None]] = []
    for i, t in zip(inputs, types, strict=True):
        stripped = t.shape[next((k for k, d in enumerate(t.shape) if d != 1), len(t.shape)):]
        cands = sorted({c for c in pool | {stripped} if c != t.shape and (_broadcasts_to(t.shape, c) or c == stripped)
                        and same_for_readers(g, i, TensorType(c, t.dtype))}, key=lambda c: (math.prod(c), len(c)))
        options.append([None, *cands])
    if all(len(o) == 1 for o in options):
        return None
    for k, combo in enumerate(itertools.product(*options)):
        if k >= _EXACT_COMBOS:
            break
        if all(c is None for c in combo):
            continue
        trial = [t if c is None else TensorType(c, t.dtype) for t, c in zip(types, combo, strict=True)]
        try:
            if infer(op, normalize_attrs(op, dict(attrs)), trial) != want:
                continue
        except ShapeError:
            continue
        return [(i, trial[j]) for j, (i, c) in enumerate(zip(inputs, combo, strict=True)) if c is not None]
    return None


def find(graph: Graph, pass_name: str, rules: Sequence[Rule], params: Mapping[str, Any]
         ) -> tuple[list[Found], list[Rejection]]:
    """All non-overlapping matches of `rules` on `graph`, plus the rejections (near-misses).

    Nodes are visited in graph order; for each node the rules are tried in priority order and the
    first full match wins. Rejections of a node are recorded only if no rule matched it: every failing
    guard of a candidate, the first with `headline=True`. Soft rejections of a match are recorded with
    `soft=True`.
    """
    found: list[Found] = []
    rejections: list[Rejection] = []
    claimed: set[int] = set()
    for node in graph:
        if node.id in claimed:
            continue
        pending: list[Rejection] = []
        for rule in rules:
            if not rule.anchors(node):
                continue
            ctx, fails = attempt(rule, graph, node.id, params)
            if fails:
                if not fails[0].quiet:
                    pending += [_rejection(pass_name, rule, node.id, f, ctx, k == 0) for k, f in enumerate(fails)]
                continue
            ids = {ctx.id(r) for r in rule.absorbed(ctx) if r not in rule.shared}
            if ids & claimed:
                pending.append(Rejection(pass_name, rule.name, node.id, "structure", "already_fused",
                                         f"nodes {sorted(ids & claimed)} were already taken by another match of "
                                         f"{pass_name}", dict(ctx.bindings), tuple(sorted(ids & claimed)), (),
                                         node.path, kind=NOT_PROFITABLE,
                                         layer_path=refusal_layer_path(graph, ctx.bindings, rule.core)))
                continue
            if (bad := _build_type_error(rule, ctx)) is not None:  # the fused node could not hold these operands
                pending.append(_rejection(pass_name, rule, node.id, bad, ctx))
                continue
            claimed |= ids
            found.append(Found(rule, node.id, ctx))
            for soft in ctx.data.get("soft", []):
                rejections.append(_rejection(pass_name, rule, node.id, soft, ctx, soft=True))
            pending = []
            break
        rejections += pending
    return found, rejections


def apply(graph: Graph, pass_name: str, found: Sequence[Found]) -> tuple[Graph, list[Match]]:
    """Rewrite all `found` matches with one `Rewriter`; returns the new graph and the `Match` records."""
    if not found:
        return graph, []
    rw = Rewriter(graph, pass_name)
    rw.pass_name = pass_name
    matches = []
    for f in found:
        new = f.rule.apply(f.ctx, rw)
        matches.append(Match(pass_name, f.rule.name, f.anchor, dict(f.ctx.bindings), new,
                             rw.lookup(new).path if new is not None else graph[f.anchor].path))
    out = rw.finish()
    # A match's product may itself be replaced by a later match of the same sweep (a node one rule made that another
    # match of the sweep absorbs): it is the value the replacements lead to, if that survives.
    def product(i: int | None) -> int | None:
        j = rw.resolve(i) if i is not None else None
        return j if j is not None and j in out else None

    return out, [replace(m, fused=product(m.fused)) for m in matches]


def rule_pass(name: str, rules: Sequence[Rule], doc: str = "", requires: Sequence[str] = (), **policy: Any) -> Pass:
    """A pass made of pattern rules: `find` on the snapshot, then `apply` once. `policy`: `Pass`'s `product`,
    `expected_of`, `excused_by`, `unexpected`, `whole_layer`, `recognizes_families`, `quantization`,
    `listed_for` and `product_of`."""
    rules = tuple(rules)

    def run(graph: Graph, params: Mapping[str, Any]) -> PassResult:
        found, rejections = find(graph, name, rules, params)
        new, matches = apply(graph, name, found)
        return PassResult(new, matches, rejections)

    return Pass(name, run, rules, tuple(requires), doc, **policy)


def dead_refs(before: Graph, result: PassResult) -> list[str]:
    """What a pass's records name that is in neither its input graph `before` nor its output graph: every match's
    anchor and bindings and every rejection's anchor, bindings, offending nodes and edges and subject must be a
    node of one of the two (the nodes it matched, or nodes it made that survive), and a match's `fused` a node of
    the output. One line per dead reference; empty when every record names live nodes.

    A pass made of stages (`compose`) binds its later stages' matches on graphs between the two: a node an earlier
    stage made and a later one removed is in neither, and a reader of the trace that looks it up in the step's
    graphs fails (`GraphError: no node %N`, the Granite crash of `fuse_attention_block` reading `fuse_sdpa`'s
    match).
    """
    after = result.graph

    def live(i: int) -> bool:
        return i in before or i in after

    out: list[str] = []
    for m in result.matches:
        refs = [("anchor", m.anchor), *m.bindings.items()]
        out += [f"match {m.rule} @ %{m.anchor}: {what} names %{int(i)}, a node of neither its input nor its output "
                f"graph" for what, i in refs if not live(i)]
        if m.fused is not None and m.fused not in after:
            out.append(f"match {m.rule} @ %{m.anchor}: fused names %{int(m.fused)}, not a node of its output graph")
    for r in result.rejections:
        refs = [("anchor", r.anchor), *r.bindings.items(), *(("offending", i) for i in r.offending),
                *(("offending edge", i) for e in r.offending_edges for i in e),
                *((("subject", r.subject),) if r.subject is not None else ())]
        out += [f"rejection {r.rule}.{r.guard} @ %{r.anchor}: {what} names %{int(i)}, a node of neither its input "
                f"nor its output graph" for what, i in refs if not live(i)]
    return out


def check_records(before: Graph, result: PassResult, pass_name: str) -> None:
    """The verifier's half for records (`lint` checks the graph): raises when `dead_refs` finds any.

    Raises:
        GraphError: naming the first dead reference and how many there are.
    """
    dead = dead_refs(before, result)
    if dead:
        more = f" (and {len(dead) - 1} more)" if len(dead) > 1 else ""
        raise GraphError(f"[{pass_name}] a record names a removed node: {dead[0]}{more}")


def settle(before: Graph, result: PassResult, between: Sequence[Graph] = ()) -> PassResult:
    """`result`'s records re-validated against the pass's input `before` and output `result.graph`, for a pass run
    as stages whose later records were bound on the `between` graphs (`compose`). Kept: every reference to a live
    node (in `before` or the output). A dead node (made by an earlier stage, removed by a later one) is dropped from
    bindings, offending nodes and edges and `subject`; a dead `fused` becomes None (nothing in the output stands
    for that match alone: a later stage absorbed it); a dead anchor becomes the last node of `before` it was made
    from (following `Node.absorbed` through `between`), else the match's live fused node, else its first live
    binding; a record with none of these is dropped (it names nothing the trace holds)."""
    after = result.graph
    made: dict[int, Node] = {n.id: n for g in between for n in g if n.id not in before}
    seen: dict[int, tuple[int, ...]] = {}

    def live(i: int) -> bool:
        return i in before or i in after

    def origins(i: int) -> tuple[int, ...]:
        """The nodes of `before` that node `i` was made from (through every stage's provenance)."""
        if i in before:
            return (i,)
        if i not in seen:
            seen[i] = ()  # a cycle cannot occur (absorbed ids are older), but never recurse forever
            n = made.get(i) or after.get(i)
            seen[i] = tuple(dict.fromkeys(o for a in (n.absorbed if n is not None else ()) for o in origins(a)))
        return seen[i]

    def anchor(i: int, fused: int | None, bound: Sequence[int]) -> int | None:
        if live(i):
            return i
        src = origins(i)
        if src:
            return max(src, key=before.position)
        return next((j for j in (fused, *bound) if j is not None and live(j)), None)

    matches: list[Match] = []
    for m in result.matches:
        fused = m.fused if m.fused is not None and m.fused in after else None
        bindings = {r: i for r, i in m.bindings.items() if live(i)}
        a = anchor(m.anchor, fused, list(bindings.values()))
        if a is not None:
            matches.append(replace(m, anchor=int(a), bindings=bindings, fused=fused))
    rejections: list[Rejection] = []
    for r in result.rejections:
        bindings = {k: i for k, i in r.bindings.items() if live(i)}
        a = anchor(r.anchor, None, list(bindings.values()))
        if a is None:
            continue
        rejections.append(replace(r, anchor=int(a), bindings=bindings,
                                  offending=tuple(i for i in r.offending if live(i)),
                                  offending_edges=tuple(e for e in r.offending_edges if live(e[0]) and live(e[1])),
                                  subject=r.subject if r.subject is not None and live(r.subject) else None))
    return PassResult(after, matches, rejections)


def compose(graph: Graph, params: Mapping[str, Any], stages: Sequence[PassFn]) -> PassResult:
    """Run `stages` in order, each on the graph the one before it made, as one pass: the last graph, every stage's
    matches and rejections in stage order, `settle`d so they name only nodes of `graph` or of the last graph."""
    g, matches, rejections, between = graph, [], [], []
    for stage in stages:
        r = stage(g, params)
        matches += r.matches
        rejections += r.rejections
        g = r.graph
        between.append(g)
    return settle(graph, PassResult(g, matches, rejections), between[:-1])


__all__ = ["STAGE_SEP", "Found", "Pass", "PassFn", "PassResult", "apply", "attempt", "check_records", "compose",
           "dead_refs", "find", "refusal", "rule_pass", "settle", "stage", "try_rule"]
