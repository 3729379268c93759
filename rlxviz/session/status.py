"""Layer status: did layer N fuse as its architecture expects, and if not, why. One function
(`layer_status`) and one text (`LayerStatus.render`) for the CLI, the notebooks and the app.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..ir import Node, Op
from ..ir.identity import IdentityMap
from ..ir.ops import FUSED
from ..passes import PASSES, MissedFusion, Outcome, Pipeline, Trace, explain, layer_of, missed_fusions
from ..passes.architecture import ILLEGAL_HERE
from ..passes.explain import fused_layers
from ..passes.guard import ILLEGAL, NOT_NEAR_MISSES, READ_BY_MODEL
from ..passes.report import left_out
from ..passes.trace import layer_label, resolve_layers, same_stack_as
from ..passes.unrecognized import Unrecognized, unrecognized
from .architecture import Architecture, classify
from .errors import SessionError
from .loading import layer_indices, model_layers
from .pipeline import run_pipeline

PRODUCTS: dict[str, str] = {
    "fuse_sdpa": "packed attention", "fuse_swiglu": "FusedSwiGLU",
    "fuse_shared_input_matmul": "shared-input QKV matmul",
    "fuse_matmul_bias_act": "FusedMatMulBiasAct", "fuse_attention_block": "FusedAttentionBlock",
    "fuse_residual_ln": "FusedResidualLN", "fuse_residual_rms_norm": "FusedResidualRmsNorm",
    "fuse_transformer_layer": "FusedTransformerLayer",
    "canonicalize_norm": "layer_norm / rms_norm", "canonicalize_gelu": "gelu / gelu_tanh",
    "canonicalize_exported": "the exporter's forms as IR ops (silu, rsqrt, where mask)",
}
"""What each pattern pass produces, as named in a layer's expectations."""

LAYER_PASS = "fuse_transformer_layer"
"""The pass that turns a whole post-LN layer into one node (`Op.FUSED_TRANSFORMER_LAYER`)."""

EXPECT_MODES = ("model", "pipeline")
"""What a layer is judged against: `model` (default): every product that is legal for the layer, i.e. what the
canonical pipeline makes of it, so a pipeline without a pass the layer needs cannot pass the check; `pipeline`: only
what the run's own passes could make (the products its missing passes would make are listed, not counted)."""


@dataclass
class LayerStatus:
    """Whether one layer fused as expected, and if not, why.

    Attributes:
        layer: the layer index.
        fused: True when every expected fusion happened: for a post-LN BERT-style layer one
            `FusedTransformerLayer` (when the pipeline ran `fuse_transformer_layer`), and for every layer
            no rejection that survives to the final graph (a missed fusion) among the rules expected
            for its architecture.
        fused_node: id of the layer's FusedTransformerLayer in the final graph, if any.
        expected: what was expected, e.g. `FusedTransformerLayer`, or `FusedSwiGLU, shared-input QKV matmul`.
        first: the first rejecting rule's outcome (guard, actual vs required message, hint), if any.
        silent: when nothing rejected the expected fusion, why the rule never saw the layer (from the rule's
            anchor ops and its pass's `requires`), else "".
        rejections: every rejected outcome of the layer that counts, in pipeline order.
        misses: missed fusions in this layer (`passes.missed_fusions`), as text.
        sibling / sibling_rule / differences: a sibling layer where the rejected rule fused, and how the
            two layers' primitive structures differ (`passes.explain`).
        explanation: the full `explain` text (one line per rule).
        architecture: the layer's own kind (`architecture.classify`).
        expected_kind: the kind the layer is judged as: its own, or `post_ln` when it deviates from sibling
            layers that are all post-LN (a BERT model with one broken layer is still expected to fuse like
            the rest; see `judged_kind`).
        done: the fusions that happened in the layer, e.g. `FusedSwiGLU %31 (fuse_swiglu)` (non-BERT layers).
        not_expected: rejections that do not count for this architecture, with the reason.
        blocker: when the first rejection's own product was still made in the layer (a soft guard: e.g.
            packed attention that keeps an additive mask), what the fusion left that blocks the layer, e.g.
            `packed attention made, but additive mask kept (mask_form)`; the headline names it instead of
            listing products the layer has. "" otherwise.
        illegal: the refusals of products that are illegal for this layer (`illegal`, `read by the model`: a probe,
            an output the caller asked for, K/V a later layer reads; `passes.guard.REMEDIES`), in pipeline order.
            They do not count: with no other miss the layer is "fused as far as legal".
        cannot_make: products that are legal for the layer (the canonical pipeline makes them) that the run's
            pipeline cannot make, because it lacks the pass that makes them or one they are made from, e.g.
            `the pipeline has no fuse_transformer_layer: FusedTransformerLayer cannot be made`
            (`pipeline_cannot_make`). Under `expect="model"` any makes the layer NOT fused.
        expect: what the layer was judged against (`EXPECT_MODES`).
    """

    layer: int
    fused: bool
    fused_node: int | None
    expected: str
    first: Outcome | None
    architecture: Architecture
    expected_kind: Architecture
    silent: str = ""
    rejections: list[Outcome] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    sibling: int | None = None
    sibling_rule: str = ""
    differences: list[str] = field(default_factory=list)
    explanation: str = ""
    done: list[str] = field(default_factory=list)
    not_expected: list[str] = field(default_factory=list)
    blocker: str = ""
    illegal: list[Outcome] = field(default_factory=list)
    cannot_make: list[str] = field(default_factory=list)
    expect: str = "model"

    @property
    def unmade_products(self) -> list[str]:
        """The product names of `cannot_make`, in order, each once (e.g. `FusedTransformerLayer`)."""
        return list(dict.fromkeys(c.rsplit(": ", 1)[-1].removesuffix(" cannot be made") for c in self.cannot_make))

    @property
    def bert_style(self) -> bool:
        """The layer is judged as a post-LN BERT layer (one FusedTransformerLayer expected)."""
        return self.expected_kind.post_ln

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (outcomes and the architecture as dicts)."""
        d = dataclasses.asdict(self)
        d["layer"], d["stack"], d["label"] = int(self.layer), getattr(self.layer, "stack", ""), layer_label(self.layer)
        d["status"] = ("fused as far as legal" if self.fused and self.illegal else "fused" if self.fused
                       else "not fused")  # the text's headline word for word
        d["bert_style"] = self.bert_style
        return d

    def render(self, verbose: bool = False) -> str:
        """The answer to "why didn't layer N fuse": status, the first rejecting guard (actual vs required),
        the fix, the sibling difference, and for non-BERT layers what the architecture expects."""
        if self.fused and self.illegal:
            lines = [f"layer {self.layer}: fused as far as legal: " + (", ".join(self.done) or "nothing to fuse")]
            for o in self.illegal:
                lines.append(f"  illegal here: {o.rule}")
                lines += o.lines("    ")
        elif self.fused and self.bert_style:
            where = f" -> {self.expected} %{self.fused_node}" if self.fused_node is not None else ""
            lines = [f"{layer_label(self.layer)}: fused{where}"]
        elif self.fused:
            lines = [f"{layer_label(self.layer)}: fused as expected: " + (", ".join(self.done) or "nothing to fuse")]
        else:
            unmade = self.expect == "model" and self.cannot_make
            why = (f": the pipeline cannot make {', '.join(self.unmade_products)}" if unmade else
                   f": {self.blocker}" if self.blocker else
                   f" (expected {self.expected})" if self.expected else "")
            lines = [f"{layer_label(self.layer)}: NOT fused{why}"]
            if unmade:
                lines += [f"  {c}" for c in self.cannot_make]
                lines.append("  (judged against what is legal for the layer; `--expect pipeline` judges against the "
                             "pipeline's passes only)")
            if self.first is not None:
                lines.append(f"  first rejection: {self.first.rule}")
                lines += self.first.lines("    ")  # guard (stage, kind), fix, compiler fix, further failing guards
            elif self.silent:
                lines.append(f"  no rejection: {self.silent}")
            lines += [f"  also rejected: {o.rule}: {o.guard} ({o.kind})" for o in self.rejections
                      if o is not self.first]
            lines += [f"  illegal here (not counted): {o.rule}: {o.guard} ({o.kind}): {o.hint}" for o in self.illegal]
            lines += [f"  also unrecognized: {m}" for m in self.misses if m.startswith("unrecognized.")
                      and (self.first is None or not m.startswith(self.first.rule + " "))]
            if self.expected_kind is not self.architecture:
                lines.append(f"  layer kind: {self.architecture.description}; its sibling layers are "
                             f"{self.expected_kind.description}, so it is expected to fuse like them")
            if self.sibling is not None:
                lines.append(f"  {layer_label(self.sibling)} fused with {self.sibling_rule}; the layers differ in:")
                lines += [f"    {d}" for d in self.differences] or ["    (same primitive structure)"]
        if not self.bert_style or (self.fused and self.illegal):
            lines.append(f"  layer kind: {self.architecture.description}")
            why = ("FusedTransformerLayer is not legal for this layer" if self.bert_style else
                   "FusedTransformerLayer only for post-LN BERT layers")
            lines.append(f"  expected: {self.expected or 'no fusion'} ({why})")
            lines += [f"  not expected here: {x}" for x in self.not_expected]
        if self.expect == "pipeline":
            lines += [f"  judged against the pipeline only: {c}" for c in self.cannot_make]
        if verbose and self.explanation:
            lines += ["  " + ln for ln in self.explanation.splitlines()]
        return "\n".join(lines)


def _op_of(trace: Trace, node: int) -> str | None:
    """The op of node id `node` in the first version that has it; None for a node a later rewrite of the same
    pass consumed (e.g. `fuse_sdpa`'s head split, read into the rope op before the pass's version is taken)."""
    for _, g in trace.versions():
        if node in g:
            return g[node].op.value
    return None


def _silent(trace: Trace, layer: int, pass_name: str) -> str:
    """Why `pass_name` neither fused nor rejected anything in `layer`: its rules' anchor ops were not in the
    layer when it ran, and which of the passes it `requires` had not run before it."""
    p = PASSES[pass_name]
    anchors = sorted({o.value for r in p.rules if r.anchor.ops for o in r.anchor.ops})
    k = next(i for i, s in enumerate(trace.steps) if s.pass_name == pass_name)
    before = {s.pass_name for s in trace.steps[:k] if not s.error}
    late = [r for r in p.requires if r not in before]
    text = (f"{pass_name} anchors on {' or '.join(anchors)}, and layer {layer} held none when it ran "
            f"(step {k + 1})")
    if late:
        text += f"; it requires {', '.join(late)}, which had not run yet: run {pass_name} after them"
    return text


def judged_kind(trace: Trace, layer: int) -> tuple[Architecture, Architecture]:
    """(own kind, kind the layer is judged as) of `layer` in the run's input graph.

    A layer is judged by its own kind, except when it is not post-LN and every other layer of the model is:
    then it is judged as its siblings' kind (a teaching variant or a bug that broke one BERT layer must not
    turn "FusedTransformerLayer expected" into "nothing expected").
    """
    own = classify(trace.input, layer)
    if own.post_ln:
        return own, own
    first = None
    for i in layer_indices(trace.input):  # stops at the first sibling that is not post-LN
        if i == layer or not same_stack_as(i, layer):  # an encoder layer is no sibling of a decoder layer
            continue
        o = classify(trace.input, i)
        if not o.post_ln:
            return own, own
        first = first or o
    return (own, first) if first is not None else (own, own)


_MISSES: IdentityMap[Trace, tuple[MissedFusion, ...]] = IdentityMap(limit=4)


def _run_misses(trace: Trace) -> tuple[MissedFusion, ...]:
    """The run's missed fusions and unrecognized findings, computed once per trace (every layer's status reads
    them: a whole-graph scan per layer was quadratic in the layer count)."""
    hit = _MISSES.get(trace)
    if hit is None:
        hit = _MISSES[trace] = (*missed_fusions(trace), *(u.as_missed() for u in _unrecognized_here(trace)))
    return hit


FAMILY_PASSES: dict[str, tuple[str, ...]] = {
    "norm": ("canonicalize_norm",), "gelu": ("canonicalize_gelu",), "glu": ("fuse_swiglu",),
    "attention": ("fuse_sdpa",), "where_mask": ("canonicalize_exported", "fuse_sdpa"),
    "activation": ("canonicalize_exported", "fuse_matmul_bias_act"),
}
"""The passes whose rules recognize each `passes.unrecognized` family."""


def _unrecognized_here(trace: Trace) -> list[Unrecognized]:
    """The run's "no rule recognizes this" findings, less those only the run's pipeline left unrecognized: a
    family whose pass the pipeline lacks, at a chain the canonical pipeline does recognize (that is a product the
    pipeline cannot make, `pipeline_cannot_make`, not a form no rule knows)."""
    found = unrecognized(trace)
    ran = {s.pass_name for s in trace.steps}
    if not any(set(FAMILY_PASSES.get(u.family, ())) - ran for u in found):
        return found
    ref = reference_run(trace)
    still = {(u.family, u.nodes[0]) for u in unrecognized(ref)} if ref is not None else set()
    return [u for u in found if not (set(FAMILY_PASSES.get(u.family, ())) - ran) or (u.family, u.nodes[0]) in still]


def expected_misses(trace: Trace, arch: Architecture, layer: int | None
                    ) -> tuple[list[MissedFusion], dict[str, str]]:
    """The misses of `layer` (None: the whole graph) that count for `arch`, and `pattern -> "pattern (guard):
    why not expected"` for those that do not. Misses are the run's missed fusions plus its "no rule
    recognizes this" findings (`passes.unrecognized`: a family-shaped chain no rule made a candidate)."""
    found = _run_misses(trace)
    kept: list[MissedFusion] = []
    ignored: dict[str, str] = {}
    for m in found:
        if layer is not None and layer_of(m.path) != layer:
            continue
        reason = arch.not_expected(m.pattern.split(".")[0], m.guard)
        if reason is None:
            kept.append(m)
        elif m.pattern not in ignored:
            ignored[m.pattern] = f"{m.pattern} ({m.guard}): {reason}"
    return kept, ignored


_PRODUCTS: IdentityMap[Trace, dict[int | None, list[int]]] = IdentityMap(limit=4)


def _layer_products(trace: Trace) -> dict[int | None, list[int]]:
    """layer -> ids of the FusedTransformerLayer nodes of the run's final graph in it, made once per trace (a scan
    of the final graph per layer was quadratic in the layer count)."""
    hit = _PRODUCTS.get(trace)
    if hit is None:
        hit = {}
        for n in trace.final:
            if n.op == Op.FUSED_TRANSFORMER_LAYER:
                hit.setdefault(layer_of(n.path), []).append(n.id)
        _PRODUCTS[trace] = hit
    return hit


_REFERENCE: IdentityMap[Trace, tuple[Trace | None]] = IdentityMap(limit=4)


def reference_run(trace: Trace) -> Trace | None:
    """The canonical pipeline's run on the run's input graph (what is legal for each layer: every product it makes
    passed its guards there), or None when the run already ran every canonical pass. Computed once per trace."""
    hit = _REFERENCE.get(trace)
    if hit is None:
        ran = {s.pass_name for s in trace.steps}
        canonical = Pipeline.canonical()
        ref = None if set(canonical.names) <= ran else run_pipeline(trace.input, canonical)
        hit = _REFERENCE[trace] = (ref,)
    return hit[0]


def _products(trace: Trace, layer: int | None) -> dict[str, tuple[str, int, set[str]]]:
    """op -> (the pattern pass that made it, count, the passes that made a node it is made from) of the products
    of `layer` (None: the whole graph): the nodes the matches of `PRODUCTS` passes made, also those a later pass
    absorbed (FusedAttentionBlock inside a FusedTransformerLayer). "Made from" follows each made node's operands
    and `absorbed` ids back through nodes a pass made (`Node.pass_name`)."""
    nodes = {n.id: n for _, g in trace.versions() for n in g}
    out: dict[str, tuple[str, int, set[str]]] = {}
    for step in trace.steps:
        if step.pass_name not in PRODUCTS:
            continue
        for m in step.matches:
            node = step.after.get(m.fused) if m.fused is not None else None
            if node is None or (layer is not None and layer_of(node.path) != layer):
                continue
            maker, n, sources = out.get(node.op.value, (step.pass_name, 0, set()))
            out[node.op.value] = (maker, n + 1, sources | _made_from(nodes, node))
    return out


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


def pipeline_cannot_make(trace: Trace, layer: int | None) -> list[str]:
    """What the run's pipeline cannot make in `layer` (None: the whole graph) that is legal there, one line each:
    `the pipeline has no PASS: PRODUCT cannot be made` when the pass that makes the product is not in the pipeline,
    `the pipeline has no PASS (PRODUCT is made from its ...): PRODUCT cannot be made` when a pass that made a node the
    product is built from is missing. Legal = the canonical pipeline makes it (`reference_run`, counting products a
    later pass absorbed); a product the run makes as often as the reference is not listed (another pass or order
    made it). [] when the run ran every canonical pass."""
    ref = reference_run(trace)
    if ref is None:
        return []
    ran = {s.pass_name for s in trace.steps}
    have = _products(trace, layer)
    out = []
    for op, (maker, n, sources) in _products(ref, layer).items():
        if have.get(op, ("", 0, set()))[1] >= n:
            continue
        product = PRODUCTS.get(maker, op)
        if maker not in ran:
            out.append(f"the pipeline has no {maker}: {product} cannot be made")
        else:
            out += [f"the pipeline has no {u} ({product} is made from its {PRODUCTS[u]}): {product} cannot be made"
                    for u in dict.fromkeys(st.pass_name for st in ref.steps)
                    if u in sources and u in PRODUCTS and u not in ran]
    return list(dict.fromkeys(out))


def _read_in_another_layer(trace: Trace, m: MissedFusion, layer: int) -> bool:
    """Whether one of the refusal's offending nodes (the extra reader) lies in another layer than `layer`."""
    for i in m.offending:
        path = next((g[i].path for _, g in trace.versions() if i in g), None)
        if path is not None and layer_of(path) not in (None, layer):
            return True
    return False


def _illegal_here(trace: Trace, rejected: list[Outcome], layer: int, arch: Architecture) -> list[Outcome]:
    """The layer's refusals that are `illegal` and `read by the model` (a reader or an output of the model keeps the
    value: no change to the model that keeps its numbers makes the product legal), in pipeline order, one per
    (rule, anchor): the layer's own outcome of the rule when it is that refusal, else one made from the run's
    missed fusion (a rule that fused elsewhere in the layer, e.g. the second residual norm, while its first norm was
    refused). A refusal the layer's kind already excuses (a pre-norm residual sum, `Architecture.not_expected`)
    stays with that reason.

    A refusal whose reader sits in another layer (K/V a later layer reads: cross-layer KV sharing) is the model's
    design. Otherwise a rule that fused in a sibling layer is left out: then the illegality is this layer's deviation
    from its siblings (one layer of a BERT stack with a stray output or a probe, the teaching variants
    `extra_h1_user`, `output_intermediate`), and it stays a miss, named with the sibling difference and an honest
    fix line (`none in the model: ...` and the compiler fix). When no other layer gets the product (every layer logs
    its sum, a one-layer graph), the refusal is the model's design: not expected."""
    mine = {(o.rule, o.nodes[0]): o for o in rejected if o.nodes}
    siblings = fused_layers(trace)
    out = []
    for m in _run_misses(trace):
        if layer_of(m.path) != layer or m.kind != ILLEGAL or m.remedy != READ_BY_MODEL or \
                arch.not_expected(m.pattern.split(".")[0], m.guard) is not None:
            continue
        if any(k != layer for k in siblings.get(m.pattern, ())) and not _read_in_another_layer(trace, m, layer):
            continue
        o = mine.get((m.pattern, m.node))
        out.append(o if o is not None and o.guard == m.guard else
                   Outcome(m.pattern.split(".")[0], m.pattern, "rejected", m.guard, "guard", m.reason, m.hint,
                           (m.node,), m.kind, m.fix, remedy=m.remedy))
    return out


def layer_status(trace: Trace, layer: int, expect: str = "model") -> LayerStatus:
    """`LayerStatus` of `layer` in a pipeline run, judged against `expect` (`EXPECT_MODES`: `model`, the default,
    also counts what is legal for the layer that the run's pipeline cannot make, `pipeline_cannot_make`).

    What is expected depends on the layer's architecture (`architecture.classify` on the input graph):
    a post-LN BERT-style layer must become one FusedTransformerLayer (when the pipeline runs
    `fuse_transformer_layer`) with no missed fusion left; any other layer must be left with no missed
    fusion among the rules that apply to it (BERT-only fusions and residual-norm fusions a pre-norm layout
    makes illegal are listed as not expected instead of counted as failures).

    Raises:
        SessionError: `expect` is not one of `EXPECT_MODES`.
    """
    if expect not in EXPECT_MODES:
        raise SessionError(f"expect {expect!r}: use one of {', '.join(EXPECT_MODES)}")
    ex = explain(trace, layer)
    own, arch = judged_kind(trace, layer)
    ran = {s.pass_name for s in trace.steps}  # a crashed pass was still expected to fuse
    crashed = {s.pass_name: s.error for s in trace.steps if s.error}
    misses, ignored = expected_misses(trace, arch, layer)
    illegal = _illegal_here(trace, ex.rejected, layer, arch)
    legal_only = {(o.rule, o.nodes[0]) for o in illegal}
    misses = [m for m in misses if (m.pattern, m.node) not in legal_only]
    ignored |= {o.rule: f"{o.rule} ({o.guard}): {ILLEGAL_HERE}" for o in illegal if o.rule not in ignored}
    ftl_illegal = any(o.pass_name == LAYER_PASS for o in illegal)  # the layer op is not legal here: its parts are
    cannot = pipeline_cannot_make(trace, layer)
    unmade = {c.rsplit(": ", 1)[-1].removesuffix(" cannot be made") for c in cannot} if expect == "pipeline" else set()
    unmakeable = PRODUCTS[LAYER_PASS] in unmade
    if unmade:  # judged against the pipeline only: a refusal of a product it cannot make does not count
        misses = [m for m in misses if PRODUCTS.get(m.pattern.split(".")[0]) not in unmade]
        ignored |= {o.rule: f"{o.rule} ({o.guard}): the pipeline cannot make {PRODUCTS[o.pass_name]}"
                    for o in ex.rejected if PRODUCTS.get(o.pass_name) in unmade and o.rule not in ignored}
    skipped = list(ignored)
    expect_ftl = LAYER_PASS in ran and arch.post_ln and not ftl_illegal and not unmakeable
    ftl = _layer_products(trace).get(layer, [])
    miss_keys = {(m.pattern, m.node) for m in misses}
    rejected = [o for o in ex.rejected if o.rule not in skipped and o.kind not in NOT_NEAR_MISSES]
    surviving = [o for o in rejected if any((o.rule, a) in miss_keys for a in o.nodes)]
    fused = (bool(ftl) or not expect_ftl) and not misses
    first = None if fused else (surviving[0] if surviving else (rejected[0] if rejected else None))
    silent = ""
    if first is None and not fused and expect_ftl and not ftl and LAYER_PASS in crashed:
        first = Outcome(LAYER_PASS, f"{LAYER_PASS}.bert_post_ln", "rejected", "pass_crashed", "crash",
                        f"the pass crashed and its result was discarded: {str(crashed[LAYER_PASS]).splitlines()[0]}",
                        "an internal error in rlxviz: report it with the IR (`rlxviz ir MODEL`)")
    if first is None and not fused and expect_ftl and not ftl and not misses:
        silent = _silent(trace, layer, LAYER_PASS)
    if first is None and not fused and misses:
        m = misses[0]
        first = Outcome(m.pattern.split(".")[0], m.pattern, "rejected", m.guard, "", m.reason, m.hint, (m.node,),
                        m.kind, m.fix, remedy=m.remedy)
    done: list[str] = []
    expected = PRODUCTS[LAYER_PASS] if expect_ftl else ""
    if not arch.post_ln or ftl_illegal:
        done = [f"{op} %{n} ({o.pass_name})" for o in ex.outcomes if o.status == "fused"
                for n in o.nodes if (op := _op_of(trace, n)) is not None]
        wanted = [o.pass_name for o in ex.outcomes if o.status == "fused" or o in rejected]
        expected = ", ".join(PRODUCTS.get(n, n) for n in dict.fromkeys(wanted))
    made = {(o.rule, g) for o in ex.outcomes if o.status == "fused" for g, _, _ in o.soft}
    fused = fused and not (cannot and expect == "model")  # `first` stays what the run itself refused
    if cannot and expect == "model" and expected:
        expected = ", ".join(dict.fromkeys([*expected.split(", "), *(c.rsplit(": ", 1)[-1].removesuffix(
            " cannot be made") for c in cannot)]))
    return LayerStatus(layer, fused, ftl[0] if ftl else None, expected, first, own, arch, silent, rejected,
                       [str(m) for m in misses], ex.sibling, ex.sibling_rule, list(ex.differences), ex.render(),
                       done, [t for r, t in ignored.items() if r not in {o.rule for o in illegal}],
                       _blocker(first, made), illegal, cannot, expect)


def verdict_pass(trace: Trace, layer: int) -> str | None:
    """The pass of the layer's verdict: the pass whose rejection `layer_status` names first (the one "why didn't
    layer N fuse" answers with), or None when the layer fused as expected or its first rejection is no pass of
    the run (an `unrecognized.*` finding). The drawing's "why" side (`render._why`) reads this, so the picture
    beside the text is always the text's rejection."""
    first = layer_status(trace, layer).first
    if first is None or first.pass_name not in {s.pass_name for s in trace.steps}:
        return None
    return first.pass_name


def _blocker(first: Outcome | None, made: set[tuple[str, str]]) -> str:
    """`packed attention made, but additive mask kept (mask_form)` when `first` (the layer's first counted
    rejection) is a soft guard of a fusion that still happened in the layer (`made`: (rule, soft guard) of the
    layer's fusions), else ""."""
    if first is None or (first.rule, first.guard) not in made:
        return ""
    product = PRODUCTS.get(first.pass_name, first.pass_name)
    head, sep, _ = first.message.partition(": ")
    what = head if sep and len(head) <= 60 else f"guard {first.guard} failed"
    return f"{product} made, but {what} ({first.guard})"


@dataclass
class FusionCheck:
    """`check_fusion`'s result: `ok` when every layer checked fused as expected."""

    model: str
    pipeline: str
    layers: list[LayerStatus]
    counts: dict[str, int]
    misses: list[str] = field(default_factory=list)
    """For a graph whose node paths name no layer: every missed fusion of the run that counts for the whole
    graph's architecture, and every "no rule recognizes this" finding (then `ok` means none)."""
    architecture: Architecture | None = None
    """For a graph whose node paths name no layer: the whole graph's kind."""
    not_expected: list[str] = field(default_factory=list)
    """For a graph whose node paths name no layer: rejections that do not count for its kind, with the reason."""
    left_out: list[str] = field(default_factory=list)
    """What fusions that happened left out, deliberately (`passes.report.left_out`: e.g. a refused merge)."""
    crashed: list[str] = field(default_factory=list)
    """The error of every pass that raised (its result discarded); any makes `ok` False."""
    recognized: list[str] = field(default_factory=list)
    """For a graph whose node paths name no layer: every form a pass recognized into a primitive op (not a fused
    one) that is in the final graph, e.g. a LayerNorm written as primitives -> `layer_norm` (`recognized`)."""
    expect: str = "model"
    """What the layers were judged against (`EXPECT_MODES`)."""
    cannot_make: list[str] = field(default_factory=list)
    """For a graph whose node paths name no layer: what is legal in it that the pipeline cannot make
    (`pipeline_cannot_make`); under `expect="model"` any makes `ok` False."""

    @property
    def ok(self) -> bool:
        return (all(s.fused for s in self.layers) and not self.misses and not self.crashed
                and not (self.expect == "model" and self.cannot_make))

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "pipeline": self.pipeline, "ok": self.ok,
                "fused_layers": sum(s.fused for s in self.layers), "checked_layers": len(self.layers),
                "final_op_counts": self.counts, "layers": [s.to_dict() for s in self.layers],
                "misses": self.misses, "not_expected": self.not_expected, "left_out": self.left_out,
                "architecture": None if self.architecture is None else dataclasses.asdict(self.architecture),
                "crashed_passes": self.crashed, "recognized": self.recognized, "expect": self.expect,
                "cannot_make": self.cannot_make or sorted({c for s in self.layers for c in s.cannot_make})}

    def render(self, verbose: bool = False) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in self.counts.items()) or "no fused ops"
        crashes = [f"CRASHED pass {c.splitlines()[0]} (its result was discarded)" for c in self.crashed]
        if not self.layers:
            head = [f"{self.model} ({self.pipeline} pipeline): no node path names a layer; final graph: {counts}",
                    *crashes]
            if self.architecture is not None:
                head.append(f"graph kind: {self.architecture.description}")
                head += [f"  evidence: {e}" for e in self.architecture.evidence]
            head += [f"recognized: {r}" for r in self.recognized]
            head.append(f"{len(self.misses)} missed fusion(s)" + (":" if self.misses else ""))
            unmade = ([f"  NOT made: {c}" for c in self.cannot_make] if self.expect == "model" else
                      [f"  judged against the pipeline only: {c}" for c in self.cannot_make])
            return "\n".join(head + [f"  {m}" for m in self.misses] + unmade
                             + [f"  not expected here: {x}" for x in self.not_expected] + self._left_out())
        head = (f"{self.model} ({self.pipeline} pipeline): {sum(s.fused for s in self.layers)}/{len(self.layers)} "
                f"layer(s) fused as expected")
        return "\n".join([head, *crashes, *(s.render(verbose) for s in self.layers), *self._left_out()])

    def _left_out(self) -> list[str]:
        head = [f"{len(self.left_out)} fusion(s) left something out:"] if self.left_out else []
        return head + [f"  {x}" for x in self.left_out]


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


def check_layer(trace: Trace, layer: int, model: str = "") -> None:
    """Raise `SessionError` unless `layer` is a layer of the run's input graph (the message gives the span)."""
    have = model_layers(trace.input)
    if layer not in have:
        span = f"{have[0]}..{have[-1]}" if have else "none: no node path names a layer"
        raise SessionError(f"layer {layer} is not in {model or 'the model'} (layers: {span})")


def check_fusion(trace: Trace, model: str = "", layers: Iterable[int] | None = None,
                 expect: str = "model") -> FusionCheck:
    """Status of every layer (or of `layers`) of a run, judged against `expect` (`EXPECT_MODES`, `layer_status`).

    Raises:
        SessionError: a requested layer is not in the model (the message gives the layers it has), or `expect` is
            not one of `EXPECT_MODES`.
    """
    if expect not in EXPECT_MODES:
        raise SessionError(f"expect {expect!r}: use one of {', '.join(EXPECT_MODES)}")
    have = model_layers(trace.input)
    wanted = list(have if layers is None else resolve_layers(have, layers))
    known = set(have)
    for i in wanted:
        if i not in known:
            check_layer(trace, i, model)  # raises, naming the layers the model has
    statuses = [layer_status(trace, i, expect) for i in wanted]
    crashed = [s.error for s in trace.steps if s.error]
    if have:
        return FusionCheck(model, trace.pipeline, statuses, trace.final.fused_op_counts(),
                           left_out=left_out(trace, None if layers is None else set(wanted)), crashed=crashed,
                           expect=expect)
    arch = classify(trace.input, None)
    misses, ignored = expected_misses(trace, arch, None)
    return FusionCheck(model, trace.pipeline, statuses, trace.final.fused_op_counts(), [str(m) for m in misses],
                       arch, list(ignored.values()), left_out(trace), crashed, recognized(trace), expect,
                       pipeline_cannot_make(trace, None))


__all__ = ["EXPECT_MODES", "LAYER_PASS", "PRODUCTS", "FusionCheck", "LayerStatus", "check_fusion", "check_layer",
           "expected_misses",
           "judged_kind", "layer_status", "pipeline_cannot_make", "recognized", "reference_run", "verdict_pass"]
