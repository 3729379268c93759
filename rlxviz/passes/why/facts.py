"""The facts of one run that a verdict reads, gathered once per trace: its misses, its products, the canonical
pipeline's run on the same input (what is legal for each layer) and what the run's pipeline cannot make.

`RunFacts.of(trace)` is the one cache on the verdict's path (it replaced three per-trace caches); everything here
states what happened, `policy` and `verdict` say what it means for a layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...ir import Graph, Node, Op
from ...ir.identity import DigestCache
from ...ir.ops import FUSED, FUSED_INTO, made_as
from ..explain import LayerExplanation, Outcome, outside_layers, side_products
from ..guard import ILLEGAL, READ_BY_MODEL
from ..made import remade_in_run
from ..pipeline import PASSES, Pipeline
from ..placement import outside_box
from ..report import MissedFusion, missed_fusions
from ..report import taken_places as _taken_places
from ..trace import PassStep, Rejection, Trace, layer_keys, layer_of
from ..unrecognized import Unrecognized, unrecognized
from .policy import PRODUCTS, makes_product, not_expected, places_words, recognizers


def layer_indices(graph: Graph) -> tuple[int, ...]:
    """Layer keys present in the graph's node paths, sorted (`passes.trace.layer_keys`)."""
    return layer_keys(i for n in graph if (i := layer_of(n.path)) is not None)


@dataclass(frozen=True)
class Unmade:
    """A product legal in a layer (the canonical pipeline makes it there, `RunFacts.reference`) that the run's
    pipeline cannot make, as `RunFacts.unmade` finds it.

    Attributes:
        missing: the pass the pipeline lacks, e.g. `fuse_shared_input_matmul`.
        product: the product that cannot be made, e.g. `shared-input matmul`.
        via: the product of `missing` that `product` is made from, when `missing` is not its maker (`packed attention`
            for FusedAttentionBlock without `fuse_sdpa`); "" when `missing` makes `product` itself.
        places: `(node, path)` of each place the reference made `product` at and the run did not: the run's own
            node there when it has one (the same op over the same input nodes), else the node of the input graph the
            reference's matches were anchored on (`RunFacts.place_of`).
    """

    missing: str
    product: str
    via: str = ""
    places: tuple[tuple[int, str], ...] = ()

    @property
    def line(self) -> str:
        """`the pipeline has no PASS: PRODUCT cannot be made AT`, `the pipeline has no PASS (PRODUCT is made from its
        VIA): PRODUCT cannot be made AT`, `AT` the places as every refusal line names its own
        (`policy.places_words`: `@ %26 (PATH)`, `at 2 places, %26 (PATH) and %103 (PATH)`; none: nothing)."""
        head = f"the pipeline has no {self.missing}" + (f" ({self.product} is made from its {self.via})"
                                                       if self.via else "")
        at = f" {places_words(dict(self.places))}" if self.places else ""
        return f"{head}: {self.product} cannot be made{at}"


@dataclass
class RunFacts:
    """What the run did, computed on first use and kept for the trace's life (see `RunFacts.of`).

    Attributes:
        trace: the run.
        cache: the verdicts made of these facts, by `(what, key)` (`verdict` fills it).
    """

    trace: Trace
    cache: dict[Any, Any] = field(default_factory=dict)
    _misses: tuple[MissedFusion, ...] | None = None
    _ftl: dict[int | None, list[int]] | None = None
    _reference: tuple[Trace | None] | None = None
    _layers: tuple[int, ...] | None = None

    @staticmethod
    def of(trace: Trace) -> RunFacts:
        """The facts of `trace` (one object per trace, for the last few traces)."""
        return _FACTS.get_or_compute(trace, lambda: RunFacts(trace))

    @property
    def layers(self) -> tuple[int, ...]:
        """The layer keys of the run's input graph."""
        if self._layers is None:
            self._layers = layer_indices(self.trace.input)
        return self._layers

    @property
    def ran(self) -> set[str]:
        return {s.pass_name for s in self.trace.steps}

    def misses(self) -> tuple[MissedFusion, ...]:
        """The run's missed fusions and unrecognized findings (every layer's verdict reads them: a whole-graph scan
        per layer was quadratic in the layer count)."""
        if self._misses is None:
            self._misses = (*missed_fusions(self.trace), *(u.as_missed() for u in self._unrecognized_here()))
        return self._misses

    def findings(self) -> dict[int, tuple[Rejection, ...]]:
        """Step index -> the run's unrecognized findings that `misses` holds, as refusals (`Unrecognized.as_rejection`)
        filed under that step (`why.places.step_refusals`): the first step of a pass that recognizes the family
        (`policy.recognizers`: convbert.qdq's erf GELU under `canonicalize_gelu`) whose graph before it holds the
        chain's nodes, else the last step whose graph before it holds them. A finding no step's graph holds is filed
        nowhere (`explain` still lists it). Each keeps its hint: `places.step_refusals` drops the hint of one the
        layer's kind does not expect."""
        if "findings" not in self.cache:
            out: dict[int, list[Rejection]] = {}
            steps = self.trace.steps
            for u in self._unrecognized_here():
                holds = [k for k, s in enumerate(steps) if all(i in s.before for i in u.nodes)]
                own = [k for k in holds if steps[k].pass_name in recognizers(u.family)]
                if own or holds:
                    out.setdefault(own[0] if own else holds[-1], []).append(u.as_rejection())
            self.cache["findings"] = {k: tuple(v) for k, v in out.items()}
        return self.cache["findings"]

    def filed_step(self, rule: str, anchors: tuple[int, ...]) -> int | None:
        """Index into `trace.steps` of the step `findings` files the finding of `rule` (`unrecognized.<family>`)
        anchored at one of `anchors` under (a verdict's `Outcome.nodes`: the Why tab draws the graph before it); None
        when no step holds it (a finding no step's graph holds, or `rule` no finding of the run)."""
        return next((k for k, rs in sorted(self.findings().items())
                     if any(r.rule == rule and r.anchor in anchors for r in rs)), None)

    def _unrecognized_here(self) -> list[Unrecognized]:
        """The run's "no rule recognizes this" findings, less those only the run's pipeline left unrecognized: a
        family whose pass the pipeline lacks, at a chain the canonical pipeline does recognize (that is a product
        the pipeline cannot make, `cannot_make`, not a form no rule knows)."""
        found = unrecognized(self.trace)
        ran = self.ran
        if not any(recognizers(u.family) - ran for u in found):
            return found
        ref = self.reference()
        still = {(u.family, u.nodes[0]) for u in unrecognized(ref)} if ref is not None else set()
        return [u for u in found
                if not (recognizers(u.family) - ran) or (u.family, u.nodes[0]) in still]

    def layer_products(self) -> dict[int | None, list[int]]:
        """layer -> ids of the FusedTransformerLayer nodes of the run's final graph in it."""
        if self._ftl is None:
            self._ftl = {}
            for n in self.trace.final:
                if n.op == Op.FUSED_TRANSFORMER_LAYER:
                    self._ftl.setdefault(layer_of(n.path), []).append(n.id)
        return self._ftl

    def reference(self) -> Trace | None:
        """The canonical pipeline's run on the run's input graph (what is legal for each layer: every product it
        makes passed its guards there), or None when the run already ran every canonical pass."""
        if self._reference is None:
            canonical = Pipeline.canonical()
            ref = None if set(canonical.names) <= self.ran else _canonical_run(self.trace.input, canonical)
            self._reference = (ref,)
        return self._reference[0]

    def cannot_make(self, layer: int | None) -> list[str]:
        """What the run's pipeline cannot make in `layer` (None: the whole graph) that is legal there, one line
        each (`Unmade.line` of `unmade`): `the pipeline has no PASS: PRODUCT cannot be made @ %26 (PATH)` when the
        pass that makes the product is not in the pipeline, `the pipeline has no PASS (PRODUCT is made from its ...):
        PRODUCT cannot be made at 2 places, ...` when a pass that made a node the product is built from is missing.
        [] when the run ran every canonical pass."""
        return list(dict.fromkeys(u.line for u in self.unmade(layer)))

    def unmade(self, layer: int | None) -> list[Unmade]:
        """What the run's pipeline cannot make in `layer` (None: the whole graph) that is legal there (`Unmade`), in
        the reference's order. Legal = the canonical pipeline makes it (`reference`, counting products a later pass
        absorbed); a product the run makes as often as the reference is not listed (another pass or order made it).
        [] when the run ran every canonical pass."""
        ref = self.reference()
        if ref is None:
            return []
        ran = self.ran
        have = _products(self.trace, layer)
        out: list[Unmade] = []
        for op, (maker, n, sources, anchors) in _products(ref, layer).items():
            had = have.get(op, ("", 0, set(), []))
            if had[1] >= n:
                continue
            made = set(had[3])
            at = tuple(dict.fromkeys(pl for a in anchors if (pl := self.place_of(a)) is not None and pl[0] not in made))
            product = PRODUCTS.get(maker, op)
            if maker not in ran:
                out.append(Unmade(maker, product, "", at))
            else:
                out += [Unmade(u, product, PRODUCTS[u], at) for u in dict.fromkeys(st.pass_name for st in ref.steps)
                        if u in sources and u in PRODUCTS and u not in ran]
        return list(dict.fromkeys(out))

    def place_of(self, anchor: int) -> tuple[int, str] | None:
        """`(node, path)` in the run of the place a match of the reference (`reference`) was anchored on at
        `anchor` (a node id of the reference's run): the node itself when it is the input graph's (node ids of the
        input graph are every run's); else the run's own node of the same op made over the same input nodes
        (`_origins`); else, following the reference's matches back (the match that made `anchor`, its anchor, ...),
        the input graph's node they were first anchored on, or the first input node under a node no match names
        (one a rewrite made beside its product). None when none is found."""
        ref = self.reference()
        if ref is None:
            return None
        if "places" not in self.cache:
            self.cache["places"] = _Places(self.trace, ref)
        return self.cache["places"].of(anchor)


_FACTS: DigestCache[RunFacts] = DigestCache(limit=4)

_CANONICAL: DigestCache[Trace] = DigestCache(limit=4)
"""The last few canonical runs made as references, by input graph (several traces of one graph share one)."""


def _canonical_run(graph: Graph, canonical: Pipeline) -> Trace:
    return _CANONICAL.get_or_compute(graph, lambda: canonical.run(graph))


def _products(trace: Trace, layer: int | None) -> dict[str, tuple[str, int, set[str], list[int]]]:
    """op -> (the pattern pass that made it, count, the passes that made a node it is made from, the anchors of the
    matches that made it) of the products of `layer` (None: the whole graph): the nodes the matches of `PRODUCTS`
    passes made, also those a later pass absorbed (FusedAttentionBlock inside a FusedTransformerLayer). "Made from"
    follows each made node's operands and `absorbed` ids back through nodes a pass made (`Node.pass_name`)."""
    nodes = {n.id: n for _, g in trace.versions() for n in g}
    out: dict[str, tuple[str, int, set[str], list[int]]] = {}
    for step in trace.steps:
        if step.family not in PRODUCTS:
            continue
        for m in step.matches:
            if not makes_product(step.family, m.rule):  # a stage's canonicalization: no product of its pass
                continue
            node = _made(trace, step, m.fused)
            if node is None or (layer is not None and layer_of(node.path) != layer):
                continue
            maker, n, sources, anchors = out.get(node.op.value, (step.family, 0, set(), []))
            out[node.op.value] = (maker, n + 1, sources | _made_from(nodes, node), [*anchors, m.anchor])
    return out


def _origins(nodes: dict[int, Node], node: Node, graph: Graph) -> list[int]:
    """The nodes of the input graph `graph` that `node` was made over, in the order its `absorbed` ids name them,
    through nodes a pass made (`Node.pass_name`), down to the input graph's."""
    seen: set[int] = set()
    todo, out = list(reversed(node.absorbed)), []
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        if i in graph:
            out.append(i)
        elif (n := nodes.get(i)) is not None:
            todo += reversed(n.absorbed)
    return out


def _first_nodes(trace: Trace) -> dict[int, Node]:
    """Each node id of `trace`'s versions -> its node in the first version that has it."""
    out: dict[int, Node] = {}
    for _, g in trace.versions():
        for n in g:
            out.setdefault(n.id, n)
    return out


class _Places:
    """What `RunFacts.place_of` reads, gathered once per run: the reference's nodes and matches by the node they
    made, and the run's made nodes by (op, the input nodes they were made over)."""

    def __init__(self, trace: Trace, ref: Trace) -> None:
        self.graph = trace.input
        self.ref_nodes = _first_nodes(ref)
        self.made_by = {m.fused: m.anchor for m in ref.matches if m.fused is not None}
        mine = _first_nodes(trace)
        self.mine: dict[tuple[Op, frozenset[int]], Node] = {}
        for n in mine.values():
            if n.pass_name and (under := _origins(mine, n, self.graph)):
                self.mine.setdefault((n.op, frozenset(under)), n)

    def of(self, anchor: int) -> tuple[int, str] | None:
        """`RunFacts.place_of` of `anchor`."""
        seen: set[int] = set()
        while anchor not in seen:
            seen.add(anchor)
            if anchor in self.graph:
                return anchor, self.graph[anchor].path
            node = self.ref_nodes.get(anchor)
            if node is None:
                return None
            under = _origins(self.ref_nodes, node, self.graph)
            same = self.mine.get((node.op, frozenset(under))) if under else None
            if same is not None:
                return same.id, same.path
            if anchor not in self.made_by:  # made beside a match's product (no match names it): the first input under
                return (under[0], self.graph[under[0]].path) if under else None
            anchor = self.made_by[anchor]
        return None


def _made(trace: Trace, step: PassStep, fused: int | None) -> Node | None:
    """The node a match of `step` made, as its pass left it: for a stage of a pass (`fuse_sdpa/rope_heads`), in the
    graph after the pass's own step (a rope its stage made survives as the attention's operand; one a later stage
    absorbed does not), else in the step's own graph."""
    if fused is None:
        return None
    if step.is_stage:
        k = trace.index_of(step)
        assert k is not None, "a stage step of another trace"
        own = next((s for s in trace.steps[k + 1:] if not s.is_stage or s.family != step.family), None)
        g = own.after if own is not None and own.pass_name == step.family else step.after
        return g.get(fused)
    return step.after.get(fused)


def _made_from(nodes: dict[int, Node], node: Node) -> set[str]:
    """The passes that made a node `node` was built from (its operands and absorbed nodes, transitively through
    made nodes; a node of the input graph ends the walk)."""
    seen: set[int] = set()
    todo = [*node.inputs, *node.absorbed]
    passes: set[str] = set()
    while todo:
        i = todo.pop()
        n = nodes.get(i)
        if i in seen or n is None or not n.pass_name:
            continue
        seen.add(i)
        passes.add(n.pass_name)
        todo += [*n.inputs, *n.absorbed]
    return passes


def op_of(trace: Trace, node: int) -> str | None:
    """The op of node id `node` in the first version that has it; None for a node a later rewrite of the same
    pass consumed (e.g. `fuse_sdpa`'s head split, read into the rope op before the pass's version is taken)."""
    for _, g in trace.versions():
        if node in g:
            return g[node].op.value
    return None


REMADE = "{maker}'s {what}%{old}, re-made by {rule}"
"""How a layer's line credits a node that a rewrite made beside its product in place of an earlier match's product of
the same op (`made.remade_in_run`; `remade_words`): gpt-neox's FusedMatMulBiasAct %231 is `fuse_matmul_bias_act's QKV
projection %218, re-made by fuse_attention_block.qkv_columns` (its weight's columns put in Q/K/V order), gptj's matmul
%227 `fuse_shared_input_matmul's QKV projection %214, re-made by fuse_attention_block.qkv_columns` (the merged Q/K/V
projection) and its rope %229 `fuse_sdpa's q_rope %199, re-made by ...`. The product is the earlier pass's: crediting
the rewrite (`(fuse_attention_block)`) read as a FusedMatMulBiasAct that pass fused, and a plain op said by nothing
lost the merge's credit."""


def remade_words(trace: Trace, node: int, fallback: str) -> str:
    """What a layer's line says in brackets after a node `node` that a fused outcome's rewrite made beside its product
    (`side_products`): `REMADE` when `node` re-makes an earlier match's product (`made.remade_in_run`), naming that
    node by its role in the re-making match (`pipeline.role_label`: `QKV projection`); else `fallback` (the outcome's
    pass for a fused op, its rule for a plain op, as for its product)."""
    r = remade_in_run(trace).get(node)
    if r is None:
        return fallback
    return REMADE.format(maker=r.maker, what=f"{r.label} " if r.label else "", old=r.old, rule=r.rule)


def fused_items(trace: Trace, outcomes: list[Outcome]) -> tuple[list[str], list[str]]:
    """(fused ops, plain ops) the fused `outcomes` made that the final version holds (a node a later rewrite replaced
    is said by what replaced it), each `OP %ID (PASS)` for a fused
    op (`ir.ops.made_as`: `LayerVerdict.done`, `RunVerdict.outside`) and `OP %ID (RULE)` for a plain op a rewrite
    made (`LayerVerdict.rewritten`); a node a rewrite made beside its product is said with it (`side_products`), one
    that re-makes an earlier match's product credited to the pass that made it (`remade_words`: `FusedMatMulBiasAct
    %231 (fuse_matmul_bias_act's QKV projection %218, re-made by fuse_attention_block.qkv_columns)`, `matmul %227
    (fuse_shared_input_matmul's QKV projection %214, re-made by ...)`). The one wording of every view: `explain`,
    `-v`, `--json`'s `done` and `rewritten`, and the app's Why tab.
    A fused op a later pass absorbed (GPT-2's q/k/v FusedMatMulBiasAct, into its
    FusedAttentionBlock) is said by what absorbed it, not as a product of its own."""
    beside = side_products(trace)
    items = [(op, n, o, n != p) for o in outcomes if o.status == "fused" for p in o.nodes
             for n in (p, *beside.get(p, ())) if (op := op_of(trace, n)) is not None]  # a fused op by its pass, a
    # plain op by the rule that made it
    done = [f"{op} %{n} ({remade_words(trace, n, o.pass_name) if side else o.pass_name})" for op, n, o, side in items
            if made_as(Op(op)) == FUSED_INTO and n in trace.final]
    plain = [f"{op} %{n} ({remade_words(trace, n, o.rule) if side else o.rule})" for op, n, o, side in items
             if made_as(Op(op)) != FUSED_INTO and n in trace.final]
    return done, plain  # both of the final version: gptj's attention %217 that a later rule replaced is not said


def outside_items(trace: Trace) -> dict[str, str]:
    """`OP %ID (PASS)` of each fused op of the final version credited to no layer (`explain.outside_layers`, worded by
    `fused_items`: `RunVerdict.outside`) -> the place it sits (`placement.outside_box`: `embeddings`, `final norm`),
    the name of the app's layers-view box that holds it."""
    items = fused_items(trace, outside_layers(trace))[0]
    return {item: outside_box(trace, int(item.split(" %", 1)[1].split(" ", 1)[0])) for item in items}


def made_nodes(trace: Trace) -> frozenset[int]:
    """Ids of the nodes the run's matches made (`Match.fused`, the nodes a layer's outcomes list: its verdict's fused
    ops, `LayerVerdict.done`, and plain ops, `LayerVerdict.rewritten`, told apart by `ir.ops.made_as`). Node ids are
    never reused, so those a version holds are what the matches up to it made and a later pass left standing."""
    return frozenset(m.fused for m in trace.matches if m.fused is not None)


def made_by(trace: Trace, ex: LayerExplanation, pass_name: str) -> list[tuple[Graph, int]]:
    """`(graph after the step that made it, node)` of each node `pass_name` made in the explained layer `ex`
    (`policy.product` names a merge by what it merged)."""
    out = []
    for o in ex.outcomes:
        if o.pass_name == pass_name and o.status == "fused":
            for n in o.nodes:
                g = next((s.after for s in trace.steps if s.pass_name == pass_name and n in s.after), None)
                if g is not None:
                    out.append((g, n))
    return out


def silent(trace: Trace, layer: int, pass_name: str) -> str:
    """Why `pass_name` neither fused nor rejected anything in `layer`: its rules' anchor ops were not in the
    layer when it ran, and which of the passes it `requires` had not run before it."""
    p = PASSES[pass_name]
    anchors = sorted({o.value for r in p.rules if r.anchor.ops for o in r.anchor.ops})
    k = next(i for i, s in enumerate(trace.steps) if s.pass_name == pass_name)
    before = {s.pass_name for s in trace.steps[:k] if not s.error}
    late = [r for r in p.requires if r not in before]
    text = (f"{pass_name} anchors on {' or '.join(anchors)}, and layer {layer} held none when it ran "
            f"(step {trace.pass_number(k)})")
    if late:
        text += f"; it requires {', '.join(late)}, which had not run yet: run {pass_name} after them"
    return text


def illegal_here(facts: RunFacts, rejected: list[Outcome], layer: int, arch: Any) -> list[Outcome]:
    """The layer's refusals that are `illegal` and `read by the model` (a reader or an output of the model keeps the
    value: no change to the model that keeps its numbers makes the product legal), in pipeline order, one per
    (rule, anchor): the layer's own outcome of the rule when it is that refusal, else one made from the run's
    missed fusion (a rule that fused elsewhere in the layer, e.g. the second residual norm, while its first norm was
    refused). A refusal the layer's kind already excuses (a pre-norm residual sum, `policy.not_expected`) stays with
    that reason.

    One rule, whatever rule refused (a residual norm, the attention block, the whole-layer op) and whichever value the
    reader touches (the residual sum, K, h1), and whether or not a sibling layer got the product: the reader keeps the
    value (it is read on to a graph output), so no change to the model that keeps its numbers makes the product legal,
    and the layer is fused as far as legal. A refusal whose reader is dead (it reaches no output) is not `read by the
    model` (`readers.reader_advice`: its fix, dead-code elimination, is a checked change to the model): a near-miss."""
    mine = {(o.rule, o.nodes[0]): o for o in rejected if o.nodes}
    out = []
    for m in facts.misses():
        if m.layer != layer or m.kind != ILLEGAL or m.remedy != READ_BY_MODEL or \
                not_expected(arch, m.pattern.split(".")[0], m.guard) is not None:
            continue
        o = mine.get((m.pattern, m.node))
        out.append(o if o is not None and o.guard == m.guard else
                   Outcome(m.pattern.split(".")[0], m.pattern, "rejected", m.guard, "guard", m.reason, m.hint,
                           (m.node,), m.kind, m.fix, remedy=m.remedy, dead=m.dead))
    return out


def recognized(trace: Trace) -> list[str]:
    """Every match whose product is a primitive op still in the final graph, as `rule -> op %id (replaces %a, ...)`:
    the forms the pipeline recognized without fusing them (a decomposed LayerNorm or GELU, HF attention -> the
    packed `attention` op), in pipeline order. A fused product is reported by the op counts instead."""
    out = []
    for step in trace.steps:
        for m in step.matches:
            node = trace.final.get(m.fused) if m.fused is not None else None
            if node is not None and node.op not in FUSED:
                ids = ", ".join(f"%{i}" for i in node.absorbed)
                out.append(f"{m.rule} -> {node.op.value} %{node.id} (replaces {ids})")
    return out


def taken_places(trace: Trace) -> dict[tuple[str, int], str]:
    """`report.taken_places` of `trace`, kept per run (`RunFacts.cache`): place (rule, anchor) -> `its matmul was
    fused later by fuse_attention_block into %148`, the places whose standing is `policy.TAKEN_LATER_GROUP`."""
    facts = RunFacts.of(trace)
    if "taken" not in facts.cache:
        facts.cache["taken"] = _taken_places(trace)
    return facts.cache["taken"]


__all__ = ["REMADE", "RunFacts", "Unmade", "illegal_here", "layer_indices", "made_by", "op_of", "recognized",
           "remade_words", "silent", "taken_places"]
