"""One verdict per run: `RunVerdict.of(trace)`, what every front end prints, draws and serializes.

Per layer (`LayerVerdict`): its kind and the kind it is judged as, the products expected of it, what fused, the
first counted rejection (rule, guard, kind, node, fix), the refusals that do not count and why (excuses), the
misses, the sibling layer that fused and how the two differ; for the run: the headline counts, the graph's misses
when no node path names a layer, and the exit status. `explain`'s text and `--json`, the app's Why tab, the layers
drawing and the node panel are formatters of this object (`text.py` holds the CLI's wording); none recomputes a
fact. What a layer is expected to fuse is decided in `policy.py`, from the run's facts (`facts.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ..architecture import classify_layer
from ..explain import Outcome, explain
from ..guard import near_miss_kind
from ..report import MissedFusion
from ..trace import Trace, resolve_layers, same_stack_as
from . import text
from .excused import (
    LEFT_OUT,
    LEFT_OUT_GROUPS,
    OpGap,
    excused_misses,
    expected_misses,
    held_lines,
    layer_gaps,
    left_out_group,
    left_out_groups,
    outside_refusals,
    places_words,
    unreached_gaps,
)
from .facts import RunFacts, Unmade, fused_items, illegal_here, made_by, outside_items, recognized, silent, taken_places
from .kinds import LayerArchitecture
from .policy import (
    EXPECT_MODES,
    ILLEGAL_HERE,
    NOT_EXPECTED_HERE,
    OP_GAP_GROUP,
    PRODUCTS,
    TAKEN_LATER_GROUP,
    first_refusal,
    layer_pass,
    makes_product,
    not_expected,
    not_expected_line,
    op_gaps,
    product,
)

Architecture = LayerArchitecture

EXIT_OK, EXIT_NOT_FUSED = 0, 1
"""`RunVerdict.exit_status`: every checked layer fused as expected / not (a crashed pass is the caller's 3)."""

ILLEGAL_HERE_GROUP = "illegal here"
STANDING_GROUPS = (*LEFT_OUT_GROUPS[1:], NOT_EXPECTED_HERE, OP_GAP_GROUP, ILLEGAL_HERE_GROUP, TAKEN_LATER_GROUP)
"""The groups of `standing`: why a refusal is no near-miss (`policy.excuse`'s groups, `OP_GAP_GROUP` for a gap in
rlxviz's ops, `ILLEGAL_HERE_GROUP` for a refusal illegal for its layer, `LayerVerdict.illegal`, `TAKEN_LATER_GROUP`
for a place a later pass took after all, `LayerVerdict.taken`)."""


@dataclass(frozen=True)
class LayerVerdict:
    """Whether one layer fused as expected, and if not, why.

    Attributes:
        layer: the layer key (an int; `passes.trace.Layer` in an encoder-decoder model).
        fused: True when every expected fusion happened: for a post-LN BERT-style layer one
            `FusedTransformerLayer` (when the pipeline ran `fuse_transformer_layer`), and for every layer
            no rejection that survives to the final graph (a missed fusion) among the rules expected
            for its architecture.
        fused_node: id of the layer's FusedTransformerLayer in the final graph, if any.
        expected: what was expected, e.g. `FusedTransformerLayer`, or `FusedSwiGLU, shared-input QKV matmul`.
        first: the first counted rejection (rule, guard, kind, message, nodes, hint, fix), if any.
        silent: when nothing rejected the expected fusion, why the rule never saw the layer (from the rule's
            anchor ops and its pass's `requires`), else "".
        rejections: every rejected outcome of the layer that counts, in pipeline order.
        misses: missed fusions in this layer (`passes.missed_fusions`), as text.
        sibling / sibling_rule / differences: a sibling layer where the rejected rule fused, and how the
            two layers' primitive structures differ (`passes.explain`).
        explanation: the `explain` text (one line per rule), without its sibling comparison (`sibling`).
        architecture: the layer's own kind (`architecture.classify_layer`).
        expected_kind: the kind the layer is judged as: its own, or `post_ln` when it deviates from sibling
            layers that are all post-LN (see `judged_kind`).
        done: the fusions that happened in the layer, e.g. `FusedSwiGLU %31 (fuse_swiglu)` (in a fused BERT layer,
            those beside its `fused_node`): fused ops only (`ir.ops.made_as`; a plain op a match made is in
            `rewritten`), those the final version holds (one a later pass absorbed is said by its absorber), placed
            by `placement.match_layer` (a residual norm at the layer's edge: one layer's, or `RunVerdict.outside`).
        not_expected: rejections that do not count for this architecture, with the reason; not gaps (`gap_refusals`).
        blocker: when the first rejection's own product was still made in the layer (a soft guard), what the
            fusion left that blocks the layer, e.g. `packed attention made, but additive mask kept (mask_form)`.
        illegal: the refusals of products that are illegal for this layer (`illegal`, `read by the model`), in
            pipeline order. They do not count: with no other miss the layer is "fused as far as legal".
        cannot_make: products legal for the layer that the run's pipeline cannot make (`RunFacts.cannot_make`).
            Under `expect="model"` any makes the layer NOT fused.
        expect: what the layer was judged against (`EXPECT_MODES`).
        missed: `misses` as `MissedFusion`s (rule, node, guard, kind, fix), in the same order.
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
    missed: list[MissedFusion] = field(default_factory=list)
    """The misses as data (`misses` is their text; `--json` carries the text only)."""
    rewritten: list[str] = field(default_factory=list)
    """The plain ops the layer's matches made (`ir.ops.made_as`: `rewritten as`), each named by the rule or stage that
    made it, e.g. `attention %58 (fuse_sdpa.hf_attention)`, `attention %237 (fuse_attention_block.qkv_columns)` (its
    QKV columns reordered: still an `attention`, the pass's block not made): no fusion, so not in `done`."""
    gaps: list[OpGap] = field(default_factory=list)
    """The gaps in rlxviz's ops that the layer's refusals ran into (`excused.layer_gaps`: not the model's layout),
    each its op form, rule, what ran into it, its places and what fails next when its compiler fix alone is applied
    (`OpGap.blocker`). They do not count (the refusal is not expected of the layer's kind), but a fused layer with any
    is "fused as far as rlxviz's ops go" (or "held back by rlxviz's ops" when no op of it fused), never plainly
    "fused", and the headline counts it apart (`gap_only`)."""
    unmade: list[Unmade] = field(default_factory=list)
    """`cannot_make` as data (`facts.Unmade`: the pass the pipeline lacks, the product, its places)."""
    gap_refusals: list[str] = field(default_factory=list)  # the lines of the refusals at `gaps` (`policy.gap_line`)
    taken: list[str] = field(default_factory=list)  # `RULE: GUARD (KIND) @ %N: its matmul was fused later by ...`
    held: list[tuple[int, str]] = field(default_factory=list)  # places the model's own term holds (`held_lines`)

    @property
    def op_gaps(self) -> list[str]:
        """`gaps` in words, each `FORM (RULE: GUARD)` (`OpGap`), e.g. `FusedAttentionBlock without a mask operand
        (fuse_attention_block.qkv_attention_out: mask_kind_keep)`."""
        return [str(g) for g in self.gaps]

    @property
    def gap_workaround(self) -> bool:
        """Whether a checked change to the model works around one of the layer's gaps (`OpGap.workaround`)."""
        return any(g.workaround for g in self.gaps)

    @property
    def gap_workaround_rounded(self) -> bool:
        """Whether every checked change to the model that works around the layer's gaps keeps its numbers only up to
        rounding (`OpGap.rounded`: a scale folded by a ratio that is no power of two); False without one."""
        worked = [g for g in self.gaps if g.workaround]
        return bool(worked) and all(g.rounded for g in worked)

    @property
    def pattern_blocked(self) -> bool:
        """A gap's compiler fix alone leaves a form rlxviz's patterns do not recognize (`OpGap.pattern_miss`; not a
        reader its own rewrite made, gpt-neox's): its status names the patterns too (`text.gap_status`)."""
        return any(g.pattern_miss for g in self.gaps)

    @property
    def gap_blocker(self) -> str:
        """What fails next when the compiler fix of the layer's first gap whose fix alone is not enough is applied
        (`OpGap.blocker`, e.g. `attn_single_user (illegal)`); "" when every gap's fix alone is enough, or none."""
        return next((g.blocker for g in self.gaps if g.blocker), "")

    @property
    def unmade_products(self) -> list[str]:
        """The product names of `unmade`, in order, each once (e.g. `FusedTransformerLayer`)."""
        return list(dict.fromkeys(u.product for u in self.unmade))

    @property
    def bert_style(self) -> bool:
        """The layer is judged as a post-LN BERT layer (one FusedTransformerLayer expected): not when its kind
        excuses the layer op (a post-LN layer with quantized activations, `policy.not_expected`)."""
        lp = layer_pass()
        return (self.expected_kind.post_ln and self.expected_kind.not_expected(lp.name if lp else "") is None
                and not self.layer_op_gaps)

    @property
    def layer_op_gaps(self) -> list[str]:
        """The op forms rlxviz lacks for the whole-layer product in a layer whose kind expects it (`policy.op_gaps`
        of the layer pass: e.g. `FusedTransformerLayer over integer-matmul projections (dynamic quantization)` in a
        dynamically quantized BERT layer), and the forms of the layer op's refusals at a gap (`gaps`: DeepNorm's
        `residual scale (alpha) on FusedTransformerLayer`); [] when rlxviz's ops can make it."""
        lp = layer_pass()
        if lp is None or not self.expected_kind.post_ln:
            return []
        own = [g.form for g in self.gaps if g.rule.split(".")[0] == lp.name]  # a refusal's gap (`policy._own_gap`)
        own = own or ([g.form for g in self.gaps] if self.fused and self.fused_node is None else [])  # one upstream
        return list(dict.fromkeys([*op_gaps(self.expected_kind, lp.name, ""), *own]))

    @property
    def legal_only(self) -> bool:
        """Fused, with a product illegal for the layer left unmade: "fused as far as legal"."""
        return self.fused and bool(self.illegal)

    @property
    def missed_products(self) -> list[str]:
        """What a layer not fused missed, one per counted refusal place (`first`, then `rejections`): `PRODUCT at %N
        (RULE: GUARD)`, e.g. `FusedMatMulBiasAct at %7 (fuse_matmul_bias_act.scale_before_bias: scale_before_bias)`."""
        out = [f"{product(o.pass_name)} at %{o.nodes[0]} ({o.rule}: {o.guard})" if o.nodes else
               f"{product(o.pass_name)} ({o.rule}: {o.guard})" for o in ([self.first] if self.first else [])
               + [o for o in self.rejections if o is not self.first]]
        return list(dict.fromkeys(out)) if out else [self.expected] if self.expected else []

    @property
    def gap_forms(self) -> list[str]:
        """The op forms of `gaps` alone, each once, without the refusal that ran into them: `FusedAttentionBlock
        without a mask operand` (what the headline's note and the start strip say rlxviz lacks)."""
        return list(dict.fromkeys(g.form for g in self.gaps))

    @property
    def has_fused_op(self) -> bool:
        """Some fused op was made in the layer: its whole-layer op (`fused_node`) or any of `done`."""
        return self.fused_node is not None or bool(self.done)

    @property
    def gap_only(self) -> bool:
        """Fused as far as the model goes, held back only by gaps in rlxviz's ops (`op_gaps`): nothing in the model to
        change, but not "fused as expected" either; the headline counts these layers apart (`text.headline`)."""
        return self.fused and bool(self.op_gaps)

    @property
    def status(self) -> str:
        """`fused`, `fused as far as legal`, `fused as far as rlxviz's ops go` (`op_gaps`), `fused as far as legal and
        rlxviz's ops go`, `held back by rlxviz's ops` (`op_gaps` and no fused op at all: `has_fused_op`), `held back by
        what is legal and rlxviz's ops` (each with `and patterns` when `pattern_blocked`, `text.gap_status`) or `not
        fused`: the headline words of the layer, what `explain`, `--json`, the Why tab and the layers drawing say."""
        if not self.fused:
            return "not fused"
        if self.op_gaps:
            return text.gap_status(self.has_fused_op, self.legal_only, self.pattern_blocked)
        return "fused as far as legal" if self.legal_only else "fused"

    @property
    def reason(self) -> str:
        """One line on why the layer did not fuse ("" when it fused): the first rejection's message, else why the
        expected rule never saw the layer."""
        return "" if self.fused else (self.first.message if self.first is not None else self.silent).split("\n")[0]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (outcomes and the architecture as dicts)."""
        return text.layer_dict(self)

    def render(self, verbose: bool = False) -> str:
        """The answer to "why didn't layer N fuse" (`text.render_layer`)."""
        return text.render_layer(self, verbose)


LayerStatus = LayerVerdict
"""The name front ends knew it by."""


@dataclass(frozen=True)
class RunVerdict:
    """The verdict of one run: every checked layer's `LayerVerdict`, and the whole graph's when no node path names a
    layer. `ok` when every layer checked fused as expected.

    Attributes:
        pipeline: the run's pipeline name.
        layers: the checked layers' verdicts, in layer order.
        counts: the final graph's fused-op counts.
        misses / architecture / not_expected / recognized / cannot_make: for a graph whose node paths name no layer:
            every missed fusion that counts for the whole graph's kind and every "no rule recognizes this" finding
            (then `ok` means none); the whole graph's kind; rejections that do not count, with the reason; every
            form recognized into a primitive op; what is legal in it that the pipeline cannot make.
        left_out_groups: `passes.report.left_out`'s lines by kind (`left_out_groups`): what fusions that happened
            left out, the model's own terms they kept, and lookalikes that were never a candidate; `left_out` is
            every line, in that order.
        crashed: the error of every pass that raised (its result discarded); any makes `ok` False.
        expect: what the layers were judged against (`EXPECT_MODES`).
        model: the model's name, for the headline ("" when not given).
    """

    pipeline: str
    layers: list[LayerVerdict]
    counts: dict[str, int]
    misses: list[str] = field(default_factory=list)
    architecture: Architecture | None = None
    not_expected: list[str] = field(default_factory=list)
    left_out_groups: dict[str, list[str]] = field(default_factory=dict)
    crashed: list[str] = field(default_factory=list)
    recognized: list[str] = field(default_factory=list)
    expect: str = "model"
    cannot_make: list[str] = field(default_factory=list)
    model: str = ""
    gaps: list[OpGap] = field(default_factory=list)
    """For a graph whose node paths name no layer: the gaps in rlxviz's ops its refusals ran into (`LayerVerdict.gaps`
    of the whole graph), which the headline names (`text.headline`)."""
    outside: list[str] = field(default_factory=list)
    """Fused ops of the final version in no layer (`placement.match_layer`: embeddings, pooler, final norm), each
    `OP %ID (PASS)`: the text's `outside the layers:` line. Each fused op is said once: by one layer's line or here."""
    outside_in: dict[str, str] = field(default_factory=dict)  # item of `outside` -> its place (`outside_box`)
    gap_refusals: list[str] = field(default_factory=list)  # no layer in the node paths: the whole graph's
    outside_misses: list[str] = field(default_factory=list)
    """Node paths naming layers: the near-misses anchored in none (`excused.outside_refusals`), said under `outside the
    layers:`, not counted (the headline and `ok` count layers). `outside_gaps`: those at a gap in rlxviz's ops."""
    outside_gaps: list[str] = field(default_factory=list)

    @staticmethod
    def of(trace: Trace, expect: str = "model", layers: Iterable[int] | None = None, model: str = "") -> RunVerdict:
        """The verdict of `trace` on every layer (or on `layers`, keys or plain ints), judged against `expect`.
        Made once per (trace, expect, layers); `model` only names it.

        Raises:
            ValueError: `expect` is not one of `EXPECT_MODES`, or a layer asked for is not in the run's input graph
                (the message names the layers it has).
        """
        _check_expect(expect)
        facts = RunFacts.of(trace)
        have = facts.layers
        wanted = tuple(have if layers is None else resolve_layers(list(have), layers))
        known = set(have)
        for i in wanted:
            if i not in known:
                span = f"{have[0]}..{have[-1]}" if have else "none: no node path names a layer"
                raise ValueError(f"layer {i} is not in {model or 'the model'} (layers: {span})")
        key = ("run", expect, None if layers is None else wanted)
        hit = facts.cache.get(key)
        if hit is None:
            hit = facts.cache[key] = _run_verdict(facts, expect, wanted, layers is None)
        return hit if hit.model == model else replace(hit, model=model)

    def layer(self, layer: int) -> LayerVerdict:
        """The verdict of `layer`.

        Raises:
            KeyError: `layer` was not checked.
        """
        for v in self.layers:
            if v.layer == layer:
                return v
        raise KeyError(f"layer {layer} was not checked")

    @property
    def left_out(self) -> list[str]:
        """Every line of `left_out_groups`, group after group."""
        return [x for lines in self.left_out_groups.values() for x in lines]

    @property
    def fused_layers(self) -> int:
        """The layers fused as expected (the headline's N of "N/M layer(s) fused as expected"): fused all the way, or
        as far as legal; not those held back only by rlxviz's ops (`gap_layers`)."""
        return sum(s.fused and not s.gap_only for s in self.layers)

    @property
    def gap_layers(self) -> int:
        """The layers held back only by gaps in rlxviz's ops (`LayerVerdict.gap_only`): counted apart in the headline;
        nothing in the model to change, so they keep `ok` (and exit status 0)."""
        return sum(s.gap_only for s in self.layers)

    @property
    def ok(self) -> bool:
        """Nothing in the model to change: every checked layer fused as far as the model goes (layers held back only
        by rlxviz's ops included: their gaps are the compiler's), no miss, no crash, nothing the pipeline cannot
        make (under `expect="model"`)."""
        return (all(s.fused for s in self.layers) and not self.misses and not self.crashed
                and not (self.expect == "model" and self.cannot_make))

    @property
    def exit_status(self) -> int:
        """`EXIT_OK` when `ok`, else `EXIT_NOT_FUSED` (a crashed pass is reported by the caller)."""
        return EXIT_OK if self.ok else EXIT_NOT_FUSED

    @property
    def headline(self) -> str:
        """The first line of the text: the model, the pipeline and `N/M layer(s) fused as expected`, then the layers
        held back only by rlxviz's ops and what it lacks (`text.headline`; the final graph's fused ops when no node
        path names a layer)."""
        return text.headline(self)

    def to_dict(self) -> dict[str, Any]:
        return text.run_dict(self)

    def render(self, verbose: bool = False) -> str:
        return text.render_run(self, verbose)


FusionCheck = RunVerdict  # the name `check_fusion` gave its result


def _check_expect(expect: str) -> None:
    if expect not in EXPECT_MODES:
        raise ValueError(f"expect {expect!r}: use one of {', '.join(EXPECT_MODES)}")


def _run_verdict(facts: RunFacts, expect: str, wanted: tuple[int, ...], every: bool) -> RunVerdict:
    trace = facts.trace
    statuses = [layer_verdict(trace, i, expect) for i in wanted]
    crashed = [s.error for s in trace.steps if s.error]
    counts = trace.final.fused_op_counts()
    if facts.layers:
        out = outside_items(trace) if every else {}  # each fused op in no layer -> the place it sits
        missed, gaps = outside_refusals(trace, classify_layer(trace.input, None)) if every else ([], [])
        return RunVerdict(trace.pipeline, statuses, counts, crashed=crashed, expect=expect, outside=list(out),
                          left_out_groups=left_out_groups(trace, None if every else wanted,
                                                          [(v.layer, n, x) for v in statuses for n, x in v.held]),
                          outside_in=out,
                          outside_misses=missed, outside_gaps=gaps)
    arch = classify_layer(trace.input, None)
    misses, excused = excused_misses(trace, arch, None)
    held = [(None, n, x) for n, x in held_lines(trace, excused.values())]  # the model's own term holds them
    return RunVerdict(trace.pipeline, statuses, counts, [str(m) for m in misses], arch,
                      [x.line for x in excused.values() if not (x.gaps or x.held)], left_out_groups(trace, None, held),
                      crashed,
                      recognized(trace), expect, facts.cannot_make(None), gaps=layer_gaps(arch, [], excused.values()),
                      gap_refusals=[x.line for x in excused.values() if x.gaps])


def judged_kind(trace: Trace, layer: int) -> tuple[Architecture, Architecture]:
    """(own kind, kind the layer is judged as) of `layer` in the run's input graph.

    A layer is judged by its own kind, except when it is not post-LN and every other layer of the model is:
    then it is judged as its siblings' kind (a teaching variant or a bug that broke one BERT layer must not
    turn "FusedTransformerLayer expected" into "nothing expected").
    """
    own = classify_layer(trace.input, layer)
    if own.post_ln:
        return own, own
    first = None
    for i in RunFacts.of(trace).layers:  # stops at the first sibling that is not post-LN
        if i == layer or not same_stack_as(i, layer):  # an encoder layer is no sibling of a decoder layer
            continue
        o = classify_layer(trace.input, i)
        if not o.post_ln:
            return own, own
        first = first or o
    return (own, first) if first is not None else (own, own)


def layer_verdict(trace: Trace, layer: int, expect: str = "model") -> LayerVerdict:
    """`LayerVerdict` of `layer` in a pipeline run, judged against `expect` (made once per trace, layer and
    `expect`; `RunVerdict.of` reads the same).

    Raises:
        ValueError: `expect` is not one of `EXPECT_MODES`.
    """
    _check_expect(expect)
    facts = RunFacts.of(trace)
    key = ("layer", expect, layer)
    hit = facts.cache.get(key)
    if hit is None:
        hit = facts.cache[key] = _layer_verdict(facts, layer, expect)
    return hit


def _layer_verdict(facts: RunFacts, layer: int, expect: str) -> LayerVerdict:
    """What is expected depends on the layer's architecture: a post-LN BERT-style layer must become one
    FusedTransformerLayer (when the pipeline runs `fuse_transformer_layer`) with no missed fusion left; any other
    layer must be left with no missed fusion among the rules that apply to it (`policy.not_expected`)."""
    trace = facts.trace
    ex = facts.cache["explained", layer] = explain(trace, layer)  # `places.with_standings` re-renders it
    own, arch = judged_kind(trace, layer)
    ran = facts.ran  # a crashed pass was still expected to fuse
    crashed = {s.pass_name: s.error for s in trace.steps if s.error}
    misses, excused = excused_misses(trace, arch, layer, own == arch)
    ignored = {k: x.line for k, x in excused.items()}
    illegal = illegal_here(facts, ex.rejected, layer, arch)
    legal_only = {(o.rule, o.nodes[0]) for o in illegal}
    misses = [m for m in misses if (m.pattern, m.node) not in legal_only]
    ignored |= {(o.rule, o.guard): f"{o.rule} ({o.guard}): {ILLEGAL_HERE}" for o in illegal
                if (o.rule, o.guard) not in ignored}
    lp = layer_pass()  # the pass that makes the whole layer one node (`Pass.whole_layer`)
    layer_pass_name, layer_op = (lp.name, lp.product) if lp is not None else ("", "")
    ftl_illegal = any(o.pass_name == layer_pass_name for o in illegal)  # the layer op is not legal: its parts are
    ftl_excused = not_expected(arch, layer_pass_name) if arch.post_ln else None  # e.g. a post-LN layer quantized
    if ftl_excused is not None:
        # no refusal: the product only excused
        ignored.setdefault((layer_pass_name, ""), not_expected_line(layer_op, layer_pass_name, "", ftl_excused))
    unmade_here = facts.unmade(layer)
    cannot = list(dict.fromkeys(u.line for u in unmade_here))
    unmade = {u.product for u in unmade_here} if expect == "pipeline" else set()
    unmakeable = bool(layer_op) and layer_op in unmade
    if unmade:  # judged against the pipeline only: a refusal of a product it cannot make does not count
        misses = [m for m in misses if PRODUCTS.get(m.pattern.split(".")[0]) not in unmade]
        ignored |= {(o.rule, o.guard): not_expected_line(o.rule, o.guard, o.message,
                                                         f"the pipeline cannot make {PRODUCTS[o.pass_name]}")
                    for o in ex.rejected if PRODUCTS.get(o.pass_name) in unmade and (o.rule, o.guard) not in ignored}
    skipped = list(dict.fromkeys(r for r, _ in ignored))
    seen = any(o.pass_name == layer_pass_name for o in ex.rejected)  # a gap refused it (DeepNorm) or hid the layer
    ftl_gap = any(x.gaps for (pattern, _), x in excused.items() if not seen or pattern.split(".")[0] == layer_pass_name)
    expect_ftl = layer_pass_name in ran and arch.post_ln and not (ftl_illegal or unmakeable or ftl_gap) and \
        ftl_excused is None
    ftl = facts.layer_products().get(layer, [])
    miss_keys = {(m.pattern, m.node) for m in misses}
    took = {o: w for o in ex.rejected if o.nodes and (w := taken_places(trace).get((o.rule, o.nodes[0])))}
    rejected = [o for o in ex.rejected if o.rule not in skipped and near_miss_kind(o.kind, o.remedy) and o not in took]
    surviving = [o for o in rejected if any((o.rule, a) in miss_keys for a in o.nodes)]
    fused = (bool(ftl) or not expect_ftl) and not misses
    first = None if fused else first_refusal(surviving or rejected, own, arch)
    if first is None and not fused and expect_ftl and not ftl and layer_pass_name in crashed and lp is not None:
        rule = lp.rules[0].name if lp.rules else layer_pass_name
        first = Outcome(layer_pass_name, rule, "rejected", "pass_crashed", "crash",
                        f"the pass crashed and its result was discarded: "
                        f"{str(crashed[layer_pass_name]).splitlines()[0]}",
                        "an internal error in rlxviz: report it with the IR (`rlxviz ir MODEL`)")
    quiet = (silent(trace, layer, layer_pass_name) if first is None and not fused and expect_ftl and not ftl
             and not misses else "")
    if first is None and not fused and misses:
        m = misses[0]
        first = Outcome(m.pattern.split(".")[0], m.pattern, "rejected", m.guard, "", m.reason, m.hint, (m.node,),
                        m.kind, m.fix, remedy=m.remedy, dead=m.dead)
    done: list[str] = []
    rewritten: list[str] = []
    expected = layer_op if expect_ftl else ""
    by_parts = not arch.post_ln or ftl_illegal or ftl_excused is not None or ftl_gap
    if by_parts or not fused:  # what a layer not fused did make is said beside what it missed (`text.missed_words`)
        done, rewritten = fused_items(trace, ex.outcomes)  # what the final version holds (`facts.fused_items`)
    else:  # a whole-layer op: the fused ops beside it (MPNet's position-bias region), so every one is said once
        done = [x for x in fused_items(trace, ex.outcomes)[0] if not any(f" %{n} " in f"{x} " for n in ftl)]
    if by_parts:
        wanted = [o.pass_name for o in ex.outcomes
                  if (o.status == "fused" and makes_product(o.pass_name, o.rule)) or o in rejected]
        expected = ", ".join(product(n, made_by(trace, ex, n), [o.rule for o in ex.outcomes if o.pass_name == n
                                                                 and o.status == "fused"])
                             for n in dict.fromkeys(wanted))
    made = {(o.rule, g) for o in ex.outcomes if o.status == "fused" for g, _, _ in o.soft}
    fused = fused and not (cannot and expect == "model")  # `first` stays what the run itself refused
    if cannot and expect == "model" and expected:
        expected = ", ".join(dict.fromkeys([*expected.split(", "), *(u.product for u in unmade_here)]))
    gaps = layer_gaps(arch, [o for o in ex.rejected if o.rule in skipped], excused.values(), own == arch)
    gaps += unreached_gaps(arch, ex.outcomes, gaps)  # a trait's gap an earlier gap hid (convbert.qdyn)
    legal, at_gap = {o.rule for o in illegal}, {k for k, x in excused.items() if x.gaps}  # gap lines apart (issue 39)
    held = {k for k, x in excused.items() if x.held}  # the run's list of the model's own terms names them
    return LayerVerdict(layer, fused, ftl[0] if ftl else None, expected, first, own, arch, quiet, rejected,
                        [str(m) for m in misses], ex.sibling, ex.sibling_rule, list(ex.differences), ex.render(False),
                        done, [t for k, t in ignored.items() if k[0] not in legal and k not in at_gap | held],
                        _blocker(first, made), illegal, cannot, expect, misses, rewritten, gaps, unmade_here,
                        [t for k, t in ignored.items() if k[0] not in legal and k in at_gap],
                        [f"{o.rule}: {o.guard} ({o.kind}) @ %{o.nodes[0]}: {w}" for o, w in took.items()],
                        held_lines(trace, excused.values()))


def _blocker(first: Outcome | None, made: set[tuple[str, str]]) -> str:
    """`packed attention made, but additive mask kept (mask_form)` when `first` (the layer's first counted
    rejection) is a soft guard of a fusion that still happened in the layer (`made`: (rule, soft guard) of the
    layer's fusions), else ""."""
    if first is None or (first.rule, first.guard) not in made:
        return ""
    head, sep, _ = first.message.partition(": ")
    what = head if sep and len(head) <= 60 else f"guard {first.guard} failed"
    return f"{product(first.pass_name)} made, but {what} ({first.guard})"


def verdict_pass(trace: Trace, layer: int) -> str | None:
    """The pass of the layer's verdict: the pass whose rejection the verdict names first (the one "why didn't layer
    N fuse" answers with), or None when the layer fused as expected or its first rejection is no pass of the run
    (an `unrecognized.*` finding: `why_step` names the step it is filed under). The drawing's "why" side reads this,
    so the picture beside the text is always the text's rejection."""
    first = layer_verdict(trace, layer).first
    return None if first is None or first.pass_name not in {s.pass_name for s in trace.steps} else first.pass_name


def why_step(trace: Trace, layer: int) -> int | None:
    """Index into `trace.steps` of the step whose graph before it the "why" drawing shows for `layer` (the app's Why
    tab, `session.render.View(side="why")`): the step that recorded the verdict's first counted rejection (a stage of
    its pass, `fuse_sdpa/rope_heads`, for that stage's own rule's refusal; `verdict_pass`), or for an `unrecognized.*`
    finding the step it is filed under (`RunFacts.filed_step`: a float `E[x^2] - E[x]^2` norm's, `canonicalize_norm`);
    else, for a layer held back only by gaps in rlxviz's ops (`LayerVerdict.gap_only`), the first step in run order
    holding a refusal at one of its gaps' places (`LayerVerdict.gaps`: rule and anchors), the place its before pane
    draws as a gap (`△`); None when the layer fused as expected (its refusals, if any, nothing to fix: `○`)."""
    v = layer_verdict(trace, layer)
    if v.first is not None:
        name = verdict_pass(trace, layer)
        if name is None:  # a finding, drawn with its step's marks (`places.step_refusals`)
            return RunFacts.of(trace).filed_step(v.first.rule, v.first.nodes)
        stage = next((k for k in range(len(trace.steps) - 1, -1, -1) if trace.steps[k].family == name
                      and trace.steps[k].is_stage and any(r.rule == v.first.rule for r in trace.steps[k].rejections)),
                     None)
        return stage if stage is not None else trace.index_of(trace.step(name))
    if not v.gap_only:
        return None
    at = {(g.rule, a) for g in v.gaps for a in g.at}
    return next((k for k, s in enumerate(trace.steps) if any((r.rule, r.anchor) in at for r in s.rejections)), None)


def first_gap(trace: Trace, layer: int, k: int | None) -> OpGap | None:
    """The gap of `layer` (`LayerVerdict.gaps`) whose refusal step `k` holds, `k` the step `why_step` names (the
    first in run order), for a layer held back only by gaps in rlxviz's ops (`LayerVerdict.gap_only`); else None."""
    v = layer_verdict(trace, layer)
    if k is None or v.first is not None:
        return None
    held = {(r.rule, r.anchor) for r in trace.steps[k].rejections}
    return next((g for g in v.gaps if any((g.rule, a) in held for a in g.at)), None)


__all__ = ["EXIT_NOT_FUSED", "EXIT_OK", "ILLEGAL_HERE_GROUP", "LEFT_OUT", "LEFT_OUT_GROUPS", "OP_GAP_GROUP",
           "STANDING_GROUPS", "Architecture", "FusionCheck", "LayerStatus", "LayerVerdict", "RunVerdict",
           "expected_misses", "first_gap", "judged_kind", "layer_verdict", "left_out_group",
           "left_out_groups", "places_words", "verdict_pass", "why_step"]
