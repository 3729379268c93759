"""`explain(graph_or_trace, layer=3)`: what every pattern decided for one layer, and why.

For each rule of each pass that ran: `fused` (with the fused node ids, and what it left out: its soft
rejections), `rejected` (the headline guard that said no, its kind, message, hint and compiler-side fix,
then every further failing guard of the same candidate), or `not applicable` (no anchor in this layer). When the layer
was rejected by a rule that fused in a sibling layer, the explanation compares the two layers'
primitive node sequences in the input graph (op, operand order, user count, graph outputs), so a
swapped residual add, an extra reader of h1 or a tanh-GELU shows up as a one-line difference. The comparison
is near linear in the layers' sizes (`layer_diff`), so a 10^4-layer model stays interactive.
"""

from __future__ import annotations

import bisect
import difflib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..ir import Graph, Node, Op
from ..ir.identity import DigestCache
from ..ir.ops import FUSED_INTO, made_as
from .engine import PassResult, settle
from .made import remade_in_run
from .pipeline import PASSES, Pipeline
from .placement import match_layer
from .refusal_kinds import kind_words
from .report import block_cost_in_context, in_context, user_origin
from .trace import Match, PassStep, Rejection, Trace, layer_label, layer_of, same_stack_as
from .whatif import MODEL, fix_form
from .why.policy import OP_GAP_GROUP, WORKAROUND


@dataclass(frozen=True)
class Outcome:
    """One rule's decision for the layer.

    Attributes:
        status: `fused`, `rejected` or `not applicable`.
        guard / stage / message / hint: from the headline rejection (status `rejected`).
        nodes: fused node ids (status `fused`) or the rejection's anchor.
        kind / fix: the headline's kind of "no" (`illegal`, `not recognized`, `not profitable`) and the
            compiler-side fix, if any.
        subject: the node the headline guard is about.
        also: further failing guards of the same candidate, in order: `(guard, kind, message)`.
        soft: status `fused`: what the fusion left out, `(guard, kind, message)` per soft rejection.
        remedy: the headline's `guard.REMEDIES` entry: `compiler only` or `read by the model` when no change to the
            model that keeps its numbers makes the fusion legal (`hint` then says why: `none in the model: ...`).
        subject_origin: when `subject` is a node a rewrite of the run re-made (not in the user's graph, e.g. a
            reshape `fuse_sdpa.hoist_scale` emitted again above a moved scale): `(rule, input-graph ids)` it came
            from (`report.user_origin`); the message names them too. None otherwise.
        dead: the headline's dead extra readers (`trace.Rejection.dead`): its kind is worded from them
            (`refusal_kinds.kind_words`). (): none.
        standing: status `rejected`: the refusal's standing as `render` tags its line
            (`why.places.standing_mark`: `✗ near-miss`, `○ nothing to fix, not expected here`, `△ gap in rlxviz's
            ops`); "" where not worked out (`explain` alone: the verdict's `why.places.with_standings` fills it).
    """

    pass_name: str
    rule: str
    status: str
    guard: str = ""
    stage: str = ""
    message: str = ""
    hint: str = ""
    nodes: tuple[int, ...] = ()
    kind: str = ""
    fix: str = ""
    subject: int | None = None
    also: tuple[tuple[str, str, str], ...] = ()
    soft: tuple[tuple[str, str, str], ...] = ()
    remedy: str = ""
    subject_origin: tuple[str, tuple[int, ...]] | None = None
    dead: tuple[int, ...] = ()
    standing: str = ""

    def lines(self, indent: str = "  ") -> list[str]:
        """The headline, its kind, hint and fix, then every further failing guard (or a fusion's soft
        rejections), one per line. Front ends print these (no other formatting of rejections). At a gap in rlxviz's
        ops (`standing`) a hint that changes the model is a workaround, not the fix: the compiler fix comes first,
        then `a workaround in the model: ...`, as the gap line words it (`policy.WORKAROUND`)."""
        out: list[str] = []
        if self.status == "rejected":
            how = ", ".join(x for x in (self.stage, kind_words(self.kind, self.dead)) if x)
            out.append(f"{indent}guard {self.guard} ({how}): {self.message}")
            hint = self.hint if self.hint and self.hint not in self.message else ""
            if hint and self.fix and OP_GAP_GROUP in self.standing and fix_form(hint) == MODEL:
                # the fault is rlxviz's op: the compiler fix is the fix, the model change a workaround (`WORKAROUND`)
                out.append(f"{indent}compiler fix: {self.fix}")
                out.append(f"{indent}{WORKAROUND.format(fix=hint)}")
            else:
                out += [f"{indent}fix: {hint}"] if hint else []
                out += [f"{indent}compiler fix: {self.fix}"] if self.fix else []
            out += [f"{indent}also fails: {g} ({k}): {m}" for g, k, m in self.also]
        elif self.status == "fused":
            out += [f"{indent}left out: {g} ({k}): {m}" for g, k, m in self.soft]
        return out


@dataclass
class LayerExplanation:
    """`explain`'s result: outcomes in pipeline order, and the comparison with a fused sibling."""

    layer: int
    pipeline: str
    outcomes: list[Outcome] = field(default_factory=list)
    sibling: int | None = None
    sibling_rule: str = ""
    differences: list[str] = field(default_factory=list)
    made: dict[str, str] = field(default_factory=dict)
    """rule -> what its matches in the layer made, as `render` says it after `->` (`made_words`)."""

    @property
    def rejected(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "rejected"]

    def outcome(self, rule_or_pass: str) -> Outcome:
        """The outcome of a rule (`fuse_x.rule`) or of a pass's first rule that applied."""
        hits = [o for o in self.outcomes if rule_or_pass in (o.rule, o.pass_name)]
        if not hits:
            raise KeyError(f"no outcome for {rule_or_pass!r}")
        return next((o for o in hits if o.status != "not applicable"), hits[0])

    def render(self, compare: bool = True) -> str:
        """Plain-text rendering, one line per rule, then the sibling comparison (`comparison_lines`; `compare`
        False: without it, for a reader that says the comparison itself, the verdict's text)."""
        lines = [f"{layer_label(self.layer)} ({self.pipeline} pipeline)"]
        for o in self.outcomes:
            if o.status == "fused":
                made = self.made.get(o.rule) or f"node(s) {', '.join(map(str, o.nodes))}"
                lines.append(f"  [fused]    {o.rule}: -> {made}")
                lines += o.lines("             ")
            elif o.status == "rejected":
                how = "; ".join(x for x in (f"{o.stage}, {kind_words(o.kind, o.dead)}", o.standing) if x)
                lines.append(f"  [rejected] {o.rule}: {o.guard} ({how}): {o.message}")
                lines += o.lines("             ")[1:]
            else:
                lines.append(f"  [-]        {o.rule}: not applicable")
        if compare and self.sibling is not None:
            lines += comparison_lines(self.sibling, self.sibling_rule, self.differences)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


def comparison_lines(sibling: int, rule: str, differences: list[str]) -> list[str]:
    """How a layer differs from its `sibling`, where `rule` fused (`LayerExplanation.differences`), as `render`
    prints it after the rules: `  compared with layer 1, where RULE fused:`, then one difference a line."""
    return [f"  compared with {layer_label(sibling)}, where {rule} fused:",
            *([f"    {d}" for d in differences] or ["    (same primitive structure)"])]


DIFF_WINDOW = 400
"""Lines per side up to which the part between the common head and tail is aligned by `difflib` (quadratic in
it, so bounded); a longer part is compared as multisets of lines (linear)."""


def layer_diff(theirs: list[str], mine: list[str]) -> list[tuple[str, str]]:
    """The lines that differ between two layer signatures, as `("-", line)` (only in `theirs`) and `("+", line)`
    (only in `mine`), in layer order.

    Near linear in the lines: the common head and tail are cut off in one scan; what is left is aligned with
    `difflib.SequenceMatcher` (no intra-line matching: `ndiff`'s was close to cubic, 15 s for 4,000 nodes)
    while it has at most `DIFF_WINDOW` lines a side, else compared as multisets (each line hashed once), so
    a line present in both, in another order, is not reported.
    """
    lo, hi_a, hi_b = 0, len(theirs), len(mine)
    while lo < hi_a and lo < hi_b and theirs[lo] == mine[lo]:
        lo += 1
    while hi_a > lo and hi_b > lo and theirs[hi_a - 1] == mine[hi_b - 1]:
        hi_a, hi_b = hi_a - 1, hi_b - 1
    a, b = theirs[lo:hi_a], mine[lo:hi_b]
    if len(a) <= DIFF_WINDOW and len(b) <= DIFF_WINDOW:
        out: list[tuple[str, str]] = []
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
            if tag != "equal":
                out += [("-", x) for x in a[i1:i2]] + [("+", x) for x in b[j1:j2]]
        return out
    only_a, only_b = Counter(a) - Counter(b), Counter(b) - Counter(a)
    out = []
    for sign, lines, extra in (("-", a, only_a), ("+", b, only_b)):
        for x in lines:
            if extra[x] > 0:
                extra[x] -= 1
                out.append((sign, x))
    return out


def _layer_nodes(g: Graph, layer: int) -> list[Node]:
    return [n for n in g if n.op not in (Op.INPUT, Op.PARAM, Op.CONST) and layer_of(n.path) == layer]


def _layer_output(g: Graph, nodes: list[Node], layer: int) -> int | None:
    """The id of the layer's output among its compute `nodes` (graph order): the node whose value leaves the layer
    (read by a node of another layer, or a graph output) that depends on most of the layer's nodes, the last such on
    a tie; the last node when none leaves it (None for no nodes). Its readers are the next layer, a head or the
    graph: they tell where the layer sits, not how it is built, so `_signature` does not count them. A side reader
    that also leaves the layer (a probe returned as an output) depends on fewer nodes, and is compared as any
    other node."""
    if not nodes:
        return None
    ids = {n.id: k for k, n in enumerate(nodes)}
    leaving = [n for n in nodes if g.is_output(n.id) or any(layer_of(u.path) != layer for u in g.users(n.id))]
    if len(leaving) < 2:
        return (leaving or nodes)[-1].id
    below: list[int] = []  # bit k: nodes[k] is this node or one it depends on (within the layer)
    for k, n in enumerate(nodes):
        bits = 1 << k
        for i in n.inputs:
            if i in ids:
                bits |= below[ids[i]]
        below.append(bits)
    return max(leaving, key=lambda n: (below[ids[n.id]].bit_count(), ids[n.id])).id


def _signature(g: Graph, layer: int) -> list[str]:
    """One line per compute node of the layer: `op@relpath(operands) users=N [graph output]`, N counting every
    reader; the layer's output (`_layer_output`) is `op@relpath(operands)` alone, as its readers are outside it.
    Two layers built alike give the same lines wherever they sit in the stack."""
    nodes = _layer_nodes(g, layer)
    last = _layer_output(g, nodes, layer)
    marker = f"layer.{layer}."

    def rel(path: str) -> str:
        return path[path.index(marker) + len(marker):] if marker in path else path

    def ref(i: int) -> str:
        m = g[i]
        if m.op in (Op.INPUT, Op.PARAM, Op.CONST):
            return m.op.value
        return "<layer input>" if layer_of(m.path) != layer else f"{m.op.value}@{rel(m.path)}"

    lines = []
    for n in nodes:
        head = f"{n.op.value}@{rel(n.path)}({', '.join(ref(i) for i in n.inputs)})"
        if n.id == last:  # the layer's output: its readers are the next layer or the graph
            lines.append(head)
            continue
        out = " [graph output]" if g.is_output(n.id) else ""
        lines.append(f"{head} users={len(g.users(n.id))}{out}")
    return lines


TYPE_DIFF_LINES = 6
"""At most this many operand type differences are listed by `operand_type_diff` (then how many more)."""


def operand_type_diff(g: Graph, layer: int, sibling: int) -> list[str]:
    """How the operands of `layer`'s compute nodes differ in shape or dtype from those of the same nodes of
    `sibling` (nodes paired by their `_signature` line, in order): one line per differing operand, e.g. `layer 1:
    add@output.dense operand 1 (encoder.layer.1.output.dense.bias) is f32[] where layer 0's is f32[64]`. A scalar bias
    and a `[64]` one are the same primitive structure but not the same operands. At most `TYPE_DIFF_LINES` lines."""
    def by_line(k: int) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for line, n in zip(_signature(g, k), _layer_nodes(g, k), strict=True):
            out.setdefault(line.split(" users=")[0], []).append(n)
        return out

    theirs = by_line(sibling)
    lines: list[str] = []
    for key, nodes in by_line(layer).items():
        for n, m in zip(nodes, theirs.get(key, []), strict=False):
            for k, (a, b) in enumerate(zip(n.inputs, m.inputs, strict=False)):
                if g[a].type != g[b].type:
                    what = g[a].name or g[a].op.value
                    lines.append(f"{layer_label(layer)}: {key.split('(')[0]} operand {k} ({what}) "
                                 f"is {g[a].type} where {layer_label(sibling)}'s is {g[b].type}")
    more = len(lines) - TYPE_DIFF_LINES
    return lines[:TYPE_DIFF_LINES] + ([f"(and {more} more operand type difference(s))"] if more > 0 else [])


@dataclass(frozen=True)
class _StepIndex:
    """One pass's decisions grouped once: its rules in report order (the pass's own, then any other rule a match or
    rejection names), and its matches and rejections by `(rule, layer)` in trace order. A pass's stages
    (`fuse_sdpa/rope_heads`, `engine.Pass.stages`) are grouped with its own step, in the order they ran, so the pass
    is explained as one (as when its stages ran inside it); `step` is the index of the pass's own step and
    `step_of` the step index of each rejection, in the order of `rejections`."""

    name: str
    step: int
    rules: tuple[str, ...]
    matches: dict[tuple[str, int | None], list[Any]]
    rejections: dict[tuple[str, int | None], list[Any]]
    step_of: dict[tuple[str, int | None], list[int]]
    taken: dict[tuple[str, int], tuple[int, str]] = field(default_factory=dict)
    """(rule, anchor) of a match with no node of its own (`Match.fused` None) -> (the node of the pass's output its
    product went into, the rule that made that node, "" when none did): `_taken`."""


def _taken(steps: list[PassStep], matches: list[Match]) -> dict[tuple[str, int], tuple[int, str]]:
    """For each of the pass's (settled) `matches` with no node of its own whose product a later stage or match of the
    same pass absorbed (Falcon's `fuse_sdpa.head_layout`: its head split went into the `attention` that
    `fuse_sdpa.hf_attention` made; a match whose product another match of the same sweep replaced, as the f16
    RMSNorm's casts around the `rms_norm` the plain-form match made): `(rule, anchor) -> (node of the pass's output,
    rule that made it)`. The product (else the anchor) is followed through the nodes each step made (`Node.absorbed`)
    until one the pass's output holds."""
    before, after = steps[0].before, steps[-1].after
    products = {x.fused for st in steps for x in st.matches if x.fused is not None}
    made_from: dict[int, list[int]] = {}  # a node -> the nodes a later rewrite of the pass made from it
    for st in steps:
        for n in st.after:
            if n.id not in st.before:
                for a in n.absorbed:
                    made_from.setdefault(a, []).append(n.id)
    # of the nodes one rewrite made from a node (a constant, a where, the attention), the match's own product
    into = {a: next((i for i in ns if i in products), ns[-1]) for a, ns in made_from.items()}
    maker = {m.fused: m.rule for m in matches if m.fused is not None}
    out: dict[tuple[str, int], tuple[int, str]] = {}
    for m in matches:
        if m.fused is not None:
            continue
        raw = next((x.fused for st in steps for x in st.matches if x.rule == m.rule and x.fused is not None
                    and (x.anchor == m.anchor or m.anchor in x.bindings.values())), None)
        if raw is None or raw in before:  # no product of its own at any step: what the pass made from its anchor
            raw = into.get(m.anchor)
        seen: set[int] = set()
        while raw is not None and raw not in after and raw not in seen:
            seen.add(raw)
            raw = into.get(raw)
        if raw is not None and raw in after:
            out[(m.rule, m.anchor)] = (raw, maker.get(raw, ""))
    return out


def _form(rule: str) -> str:
    """The `Rule.form` of the registered rule named `rule` ("" when none or no such rule)."""
    p = PASSES.get(rule.partition(".")[0])
    return next((r.form for r in (p.rules if p is not None else ()) if r.name == rule), "")


def made_words(matches: list[Match], taken: dict[tuple[str, int], tuple[int, str]], form: str = "",
               beside: dict[int, tuple[int, ...]] | None = None) -> str:
    """What one rule's `matches` in a layer made, after `explain -v`'s `->`: `node(s) 12, 14` (the nodes standing for
    them, each with the fused ops and re-made products its rewrite made beside it, `beside`: `side_products`),
    `no node of its own: taken into node 171 by fuse_sdpa.hf_attention in the same pass` (`_taken`), or `no
    node of its own: plain ops no one node stands for` (a rewrite that made no one node, and nothing the pass made
    took its nodes), said as the rule's `form` when it has one (`no node of its own: no-op cast dropped`: a rule that
    drops a node makes none); never an empty list."""
    ids = [k for m in matches if m.fused is not None for k in (m.fused, *(beside or {}).get(m.fused, ()))]
    took = dict.fromkeys(taken[(m.rule, m.anchor)] for m in matches
                         if m.fused is None and (m.rule, m.anchor) in taken)
    bare = any(m.fused is None and (m.rule, m.anchor) not in taken for m in matches)
    parts = [f"node(s) {', '.join(map(str, ids))}"] if ids else []
    if took:
        parts.append("no node of its own: taken into " + ", ".join(
            f"node {i}" + (f" by {r}" if r else "") for i, r in took) + " in the same pass")
    if bare:
        parts.append(f"no node of its own: {form or 'plain ops no one node stands for'}")
    return "; ".join(parts)


_STEPS: DigestCache[tuple[_StepIndex, ...]] = DigestCache(limit=4)
_FUSED: DigestCache[dict[str, list[int]]] = DigestCache(limit=4)
_BESIDE: DigestCache[dict[int, tuple[int, ...]]] = DigestCache(limit=4)


def side_products(trace: Trace) -> dict[int, tuple[int, ...]]:
    """A match's product (`Match.fused`) -> the fused ops its rewrite made beside it (`ir.ops.made_as`; new in the
    same step, made from nodes the match bound), e.g. the reordered FusedMatMulBiasAct the QKV-column stage of
    `fuse_attention_block` makes beside the attention it rewrites, and the nodes of any op it made in place of an
    earlier match's product (`made.remade_in_run`: gptj's merged Q/K/V matmul and ropes the stage re-makes): the layer
    line (`why.facts.fused_items`) and `explain -v`'s `->` (`made_words`) both say it. Made once per trace."""
    hit = _BESIDE.get(trace)
    if hit is None:
        out: dict[int, list[int]] = {}
        remade = remade_in_run(trace)
        for s in trace.steps:
            made = [m for m in s.matches if m.fused is not None]
            for n in s.after:
                if n.id in s.before or (made_as(n.op) != FUSED_INTO and n.id not in remade) \
                        or any(m.fused == n.id for m in made):
                    continue
                m = next((m for m in made if set(n.absorbed) & {m.anchor, *m.bindings.values()}), None)
                if m is not None and m.fused is not None:
                    out.setdefault(m.fused, []).append(n.id)
        hit = _BESIDE[trace] = {k: tuple(v) for k, v in out.items()}
    return hit


def _groups(trace: Trace) -> list[list[int]]:
    """The step indices of each pass of the run, in order: a pass's stage steps with its own step after them (a
    stage step without its pass's step after it is a group of its own)."""
    out: list[list[int]] = []
    pending: list[int] = []
    for k, step in enumerate(trace.steps):
        if step.is_stage:
            if pending and trace.steps[pending[-1]].family != step.family:
                out += [[i] for i in pending]
                pending = []
            pending.append(k)
            continue
        if pending and trace.steps[pending[-1]].family == step.pass_name:
            out.append([*pending, k])
        else:
            out += [[i] for i in pending] + [[k]]
        pending = []
    return out + [[i] for i in pending]


def _records(steps: list[PassStep], group: list[int]) -> tuple[list[Match], list[tuple[int, Rejection]]]:
    """The matches and the (step index, rejection)s of one pass's steps (`_groups`), in the order they ran. A pass
    with stages is read as one pass (`engine.settle`, as `engine.compose` ran it): its records name only nodes of the
    pass's input or output graph (a product one stage made and a later one absorbed is no product of the pass)."""
    if len(steps) == 1:
        return list(steps[0].matches), [(group[0], r) for r in steps[0].rejections]
    tagged = [(k, r) for k, s in zip(group, steps, strict=True) for r in s.rejections]
    res = settle(steps[0].before, PassResult(steps[-1].after, [m for s in steps for m in s.matches],
                                             [r for _, r in tagged]), [s.after for s in steps[:-1]])
    refused: list[tuple[int, Rejection]] = []
    at = 0
    for r in res.rejections:  # settle keeps their order and drops those that name nothing the trace holds
        while at < len(tagged) and _key(tagged[at][1]) != _key(r):
            at += 1
        refused.append((tagged[min(at, len(tagged) - 1)][0], r))
        at += 1
    return res.matches, refused


def _key(r: Rejection) -> tuple[str, str, str, str, bool, bool]:
    return r.rule, r.guard, r.stage, r.message, r.headline, r.soft


def _by_step(name: str, own: list[str], recorded: list[str]) -> list[str]:
    """The rules of pass `name` in the order its steps ran them: each stage's (`Pass.stages`, in order) before the
    pass's own, `own` being the pass's declared rules and `recorded` the rules the run's records name, in the order
    it recorded them; within a step, declared rules in their order, then recorded ones as recorded. A rule no stage
    or pass of `name` declares is listed with the pass's own step. (The stage rule that made a node was listed after
    the pass's own refusal of that node: `fuse_attention_block.qkv_columns` after `qkv_attention_out`.)"""
    rules = own + [r for r in dict.fromkeys(recorded) if r not in own]
    stages = PASSES[name].stages if name in PASSES else ()
    step = {}
    for k, st in enumerate(stages):
        for r in st.rules:
            step.setdefault(r.name, k)
    return sorted(rules, key=lambda r: step.get(r, len(stages)))  # stable: each step's order as above


def _step_index(trace: Trace) -> tuple[_StepIndex, ...]:
    """`_StepIndex` per pass of `trace` (`_groups`), made once per trace (each layer's explanation had rescanned
    every decision of the run: 10^4 layers x 10^4 decisions)."""
    hit = _STEPS.get(trace)
    if hit is not None:
        return hit
    out = []
    for group in _groups(trace):
        steps = [trace.steps[k] for k in group]
        name = steps[-1].family
        found, refused = _records(steps, group)
        rules = _by_step(name, [r.name for r in PASSES[name].rules] if name in PASSES else [],
                         [m.rule for m in found] + [r.rule for _, r in refused])
        matches: dict[tuple[str, int | None], list[Any]] = {}
        for m in found:  # a residual norm at a layer's edge by the placement rule, every other match by its path
            matches.setdefault((m.rule, match_layer(trace.input, steps[0].before, steps[-1].after, m)), []).append(m)
        rejections: dict[tuple[str, int | None], list[Any]] = {}
        step_of: dict[tuple[str, int | None], list[int]] = {}
        for k, r in refused:
            rejections.setdefault((r.rule, r.layer), []).append(r)
            step_of.setdefault((r.rule, r.layer), []).append(k)
        out.append(_StepIndex(name, group[-1], tuple(rules), matches, rejections, step_of, _taken(steps, found)))
    hit = _STEPS[trace] = tuple(out)
    return hit


def _fused_layers(trace: Trace, steps: tuple[_StepIndex, ...]) -> dict[str, list[int]]:
    """rule -> the sorted layers where it fused anywhere in the run (made once per trace)."""
    hit = _FUSED.get(trace)
    if hit is None:
        found: dict[str, set[int]] = {}
        for at in steps:
            for rule, layer in at.matches:
                if layer is not None:
                    found.setdefault(rule, set()).add(layer)
        hit = _FUSED[trace] = {rule: sorted(layers) for rule, layers in found.items()}
    return hit


def fused_layers(trace: Trace) -> dict[str, list[int]]:
    """rule -> the sorted layers where it fused anywhere in the run (cached per trace)."""
    return _fused_layers(trace, _step_index(trace))


def outside_layers(trace: Trace) -> list[Outcome]:
    """The fused outcomes, one per rule, of the run's matches credited to no layer (`placement.match_layer` None: the
    embeddings' ops, a pooler's, the model's final norm), in pipeline order: what `RunVerdict.outside` says apart
    from every layer's line."""
    return [Outcome(at.name, rule, "fused", nodes=tuple(m.fused for m in mine if m.fused is not None))
            for at in _step_index(trace) for rule in at.rules if (mine := at.matches.get((rule, None)))]


def _nearest(layers: list[int] | tuple[()], layer: int) -> int | None:
    """The layer of sorted `layers` other than `layer` nearest to it (the lower one on a tie), or None."""
    i = bisect.bisect_left(layers, layer)
    below = next((layers[j] for j in (i - 1, i - 2) if 0 <= j < len(layers) and layers[j] != layer), None)
    above = next((layers[j] for j in (i, i + 1) if j < len(layers) and layers[j] != layer), None)
    if below is None or above is None:
        return above if below is None else below
    return below if layer - below <= above - layer else above


def explain(source: Graph | Trace, layer: int, pipeline: Pipeline | None = None) -> LayerExplanation:
    """Explain every pattern's outcome for `layer` (by provenance path, see `layer_of`).

    Args:
        source: a `Trace`, or a graph (then `pipeline`, default canonical, is run on it).
        layer: the layer index, e.g. 3 for `encoder.layer.3...`.

    Returns:
        LayerExplanation; `str()` renders it as text.

    Example:
        >>> from rlxviz.models import load_model, VARIANTS
        >>> g = load_model("bert-tiny", seq=8, variant=VARIANTS["swapped_residual"]).graph
        >>> explain(g, 0).outcome("fuse_transformer_layer").guard
        'ln1_operand_order'
    """
    trace = source if isinstance(source, Trace) else (pipeline or Pipeline.canonical()).run(source)
    ex = LayerExplanation(layer, trace.pipeline)
    steps = _step_index(trace)
    for at in steps:
        for rule in at.rules:
            mine = at.matches.get((rule, layer), [])
            rej = at.rejections.get((rule, layer), [])
            if mine:
                soft = tuple((r.guard, r.kind, block_cost_in_context(trace, r)) for r in rej if r.soft)
                ex.outcomes.append(Outcome(at.name, rule, "fused",
                                           nodes=tuple(m.fused for m in mine if m.fused is not None), soft=soft))
                ex.made[rule] = made_words(mine, at.taken, _form(rule), side_products(trace))
            elif rej:
                at_r = next((i for i, x in enumerate(rej) if x.headline and not x.soft), 0)
                r = rej[at_r]
                at_k = at.step_of[(rule, layer)]  # a further guard's "run P first" in context too
                also = tuple((x.guard, x.kind, in_context(trace, at_k[i], x)[0]) for i, x in enumerate(rej)
                             if x is not r and x.anchor == r.anchor and not x.headline)
                message, hint = in_context(trace, at.step_of[(rule, layer)][at_r], r)
                ex.outcomes.append(Outcome(at.name, rule, "rejected", r.guard, r.stage, message, hint,
                                           (r.anchor,), r.kind, r.fix, r.subject, also, remedy=r.remedy,
                                           subject_origin=None if r.subject is None else user_origin(trace, r.subject),
                                           dead=r.dead))
            else:
                ex.outcomes.append(Outcome(at.name, rule, "not applicable"))
    fused_in = _fused_layers(trace, steps)
    for o in ex.rejected:
        same_stack = [k for k in fused_in.get(o.rule, ()) if same_stack_as(k, layer)]
        sibling = _nearest(same_stack, layer)  # an encoder layer is no sibling of a decoder layer
        if sibling is not None:
            ex.sibling = sibling
            ex.sibling_rule = o.rule
            mine, theirs = _signature(trace.input, layer), _signature(trace.input, ex.sibling)
            ex.differences = [f"{layer_label(layer if sign == '+' else ex.sibling)}: {line}"
                              for sign, line in layer_diff(theirs, mine)]
            ex.differences += operand_type_diff(trace.input, layer, ex.sibling)
            break
    return ex


__all__ = ["LayerExplanation", "Outcome", "comparison_lines", "explain", "fused_layers", "layer_diff", "outside_layers"]
