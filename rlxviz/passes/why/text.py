"""The CLI's wording of a verdict: `explain`'s text and its `--json`, formatters of `verdict.RunVerdict` and
`verdict.LayerVerdict` (they read the verdict's facts and decide nothing).

The verdicts word themselves through this module (`render`, `to_dict`, `headline`), so it imports `verdict` only
for its annotations: data flows from the verdict into the wording, never back.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from ...ir.ops import REWRITTEN_AS
from ..explain import comparison_lines
from ..guard import DOES_NOT_PAY, MODEL_TERM, NOT_A_CANDIDATE
from ..trace import layer_label
from .fix_words import GAP_IS_THE_COMPILERS, UNCHECKED_ALONE, compiler_fix_words, workaround_words
from .policy import OP_GAP_GROUP, TAKEN_LATER_GROUP

if TYPE_CHECKING:  # for annotations only: the verdicts word themselves through this module
    from ..explain import Outcome
    from .verdict import LayerVerdict, RunVerdict


HELD_BACK_BY_OPS = "held back by rlxviz's ops"
"""`LayerVerdict.status` of a layer held back only by gaps in rlxviz's ops with no fused op at all (n3-04b's QK-norm
attention: its block refused for the gap, nothing else of it fuses): not "fused", and never "nothing to fuse"."""
HELD_BACK_BY_LEGAL_AND_OPS = "held back by what is legal and rlxviz's ops"
"""`HELD_BACK_BY_OPS` of a layer that is also fused only as far as legal (a product illegal for it left unmade)."""
FUSED_AS_FAR_AS_OPS = "fused as far as rlxviz's ops go"
"""`LayerVerdict.status` of a layer with fused ops, held back from the rest only by gaps in rlxviz's ops."""
NO_FUSED_OP = "no fused op"
"""What a layer line lists when a layer held back by rlxviz's ops made no fused op (`made_words`)."""
FUSED_AS_EXPECTED = "fused as expected"
"""What the line of a layer fused by parts says first (`render_layer`: `layer 0: fused as expected: ...`), and the box
of a layer fused only as far as its kind's limit goes (`kind_limit`)."""
QUANTIZED_LIMIT = "quantized activations: no float fusion across QDQ steps expected"
"""`kind_limit` of a fused layer with quantized activations: the kind's policy (`policy.not_expected`) expects no
fused op of a float pattern across a QuantizeLinear -> DequantizeLinear step (it would skip the rounding), so its
attention and matmuls stay as they are; ernie.qdq's and granite.qdq's boxes said a bare `fused`, in the green of a
FusedTransformerLayer, of layers that fused elementwise regions alone (newcomer finding)."""
NOTHING_TO_FUSE = "nothing to fuse"
"""What a fused layer line lists when no fused op was expected of the layer and none was made (`made_words`)."""
PATTERNS = "patterns"
"""What a gap layer's status adds after `rlxviz's ops` when the compiler fix of a gap alone leaves a form rlxviz's
patterns do not recognize (`LayerVerdict.pattern_blocked`, `OpGap.pattern_miss`: esm's default_scale, then
`qkv_packed (not recognized)`): "as far as rlxviz's ops go" would say the op alone stands between the layer and its
fusion. Not a refusal whose readers rlxviz's own rewrite made (gpt-neox's `attn_single_user`, read by the NaN guard
`nan_guard_moved` moved past the head merge): no form of the model goes unrecognized there, and "patterns" read as
one did (issue 39); the blocker's words (`caveat.MADE_READERS`) say who made the reader and that the product cannot
take it in, so the layer is fused as far as rlxviz's ops go."""


def held_words(legal: bool = False, patterns: bool = False) -> str:
    """What holds a layer back, as its status says it: `rlxviz's ops`, `legal and rlxviz's ops`, `rlxviz's ops and
    patterns` or `legal, rlxviz's ops and patterns` (`LayerVerdict.status`, the headline's counts)."""
    parts = [w for w, on in (("legal", legal), ("rlxviz's ops", True), (PATTERNS, patterns)) if on]
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def gap_status(made: bool, legal: bool = False, patterns: bool = False) -> str:
    """The status of a layer held back by gaps in rlxviz's ops: `fused as far as ... go` when it `made` a fused op,
    else `held back by ...` (what is legal said `what is legal`), with `held_words`: `FUSED_AS_FAR_AS_OPS`,
    `HELD_BACK_BY_OPS`, `HELD_BACK_BY_LEGAL_AND_OPS`, or those with `and patterns`."""
    words = held_words(legal, patterns)
    if made:
        return f"fused as far as {words} go"
    return "held back by " + words.replace("legal", "what is legal", 1) if legal else f"held back by {words}"


SIBLING_DIFFERS = "; the layers differ in:"
"""Ends the line of a layer not fused that names the sibling where the rule fused, before its differences: the
verbose text (`explain -v`, the Why tab) then prints the rules' outcomes without `explain`'s own comparison, so the
differences are said once (bart-full and `dead_h1_user` printed the same block twice)."""

ALSO_REJECTED_COUNTED = "a near-miss, counted against the layer"
"""The standing an `also rejected` line of a layer not fused ends with: a further refusal that counts (the app's
chips mark its place `✗`), as the layer's first rejection does."""
ALSO_REJECTED_NOT_COUNTED = ("a near-miss (the app's chips mark it ✗), not counted against the layer: none of "
                             "the layer's fused ops waits on it")
"""The standing an `also rejected` line of a fused layer ends with: a refusal of a near-miss kind whose rule makes
no product the layer misses (a rewrite of the attention's mask that `canonicalize_exported` refuses while the
attention still fuses, keeping the mask as an operand), so the layer is fused all the same."""

TAKEN_LATER_STANDING = "not a near-miss, nor a gap in rlxviz's ops: not counted against the layer"
"""The standing a layer's `taken later` line ends with (`LayerVerdict.taken`): a place refused, whose candidate a
later pass fused after all (clip-text's out_proj: its matmul fused later by fuse_attention_block), so nothing is
missed there and no gap stands; `explain -v`'s rule line marks it `○ nothing to fix, taken later: ...` alike."""

OUTSIDE_LAYERS = "outside the layers"
"""The heading of the line after the layers' that lists the fused ops credited to no layer (`RunVerdict.outside`,
`placement.match_layer`: the embeddings' ops, a pooler's, the model's final norm)."""

GROUP_OVER = 3
"""More fused ops than this of one op from one pass are one item of a layer's line (`fused_list`)."""

_DONE = re.compile(r"^(?P<op>\S+) %(?P<id>\d+) \((?P<pass>[^()]+)\)$")
"""One item of `LayerVerdict.done`: `OP %ID (PASS)`."""


_LEFT_OUT_HEADINGS = {
    "left out": ("fusion left something out", "fusions left something out"),
    # a term kept as an operand (a causal band, ALiBi) or a structure the fused op cannot hold (cross-attention, a
    # KV cache: `refusal_kinds.model_term_why`); newcomer run 41: marian's two cross-attentions were "own terms"
    MODEL_TERM: ("place keeps the model's own term or structure (nothing to fix, not a near-miss)",
                 "places keep the model's own terms or structure (nothing to fix, not near-misses)"),
    NOT_A_CANDIDATE: ("lookalike, not a candidate (nothing to fix, not a near-miss)",
                      "lookalikes, not candidates (nothing to fix, not near-misses)"),
    DOES_NOT_PAY: ("refusal the tool's own cost test made (it does not pay: nothing to fix, not a near-miss)",
                   "refusals the tool's own cost test made (they do not pay: nothing to fix, not near-misses)"),
    "not expected here": ("refusal not expected of its layer (its kind does not expect the fusion with rlxviz's ops: "
                          "nothing to fix in the model, not a near-miss)",
                          "refusals not expected of their layers (their kinds do not expect the fusions with rlxviz's "
                          "ops: nothing to fix in the model, not near-misses)"),
    # whether the fix alone is enough is the place's own (`compiler_fix_words`), never the heading's (newcomer run 37:
    # glm's tooltip head said "alone it is not enough", its heading "nothing in the model to change")
    OP_GAP_GROUP: ("refusal at a gap in rlxviz's ops (a compiler fix, not a near-miss)",
                   "refusals at gaps in rlxviz's ops (compiler fixes, not near-misses)"),
    "illegal here": ("refusal illegal for its layer (the layer is fused as far as legal, not a near-miss)",
                     "refusals illegal for their layers (the layers are fused as far as legal, not near-misses)"),
    TAKEN_LATER_GROUP: ("refusal whose candidate a later fusion took (not a near-miss, nor a gap in rlxviz's ops: "
                        "nothing to fix)",
                        "refusals whose candidates later fusions took (not near-misses, nor gaps in rlxviz's ops: "
                        "nothing to fix)"),
}
"""Each group of `RunVerdict.left_out_groups` (`verdict.LEFT_OUT_GROUPS`) and of a refusal's standing
(`standing.STANDING_GROUPS`: what the app's chips mark `○`, and `△` for a gap in rlxviz's ops) as its heading says
it: one, many. A `MODEL_TERM` place is a fusion that kept the model's term as its operand (a causal band, Gemma's
1 + w) or a rule that left the model's own structure as it is (cross-attention: the attention stays packed)."""


WORKAROUND_TOO = workaround_words(1, 0, one=True)
"""What a gap head adds after the compiler fix where a checked change to the model, exact, works around its one layer
or place: `; a workaround in the model too (its gap line names it)` (`fix_words.workaround_words`)."""
GAP_HAS_A_WORKAROUND = f"a compiler fix{WORKAROUND_TOO}"
"""`GAP_IS_THE_COMPILERS` where a checked change to the model also works around the gap (`caveat.model_fix_note`)."""


def gap_asks(workaround: bool) -> str:
    """What a gap in rlxviz's ops asks of whom: `GAP_HAS_A_WORKAROUND` when a checked change to the model also works
    around it (`excused.OpGap.workaround`, `LayerVerdict.gap_workaround`, `places.Places.gap_worked`: data, not
    read back from the words), else `GAP_IS_THE_COMPILERS`. The headline, the app's layer strip and chip marks read
    it."""
    return GAP_HAS_A_WORKAROUND if workaround else GAP_IS_THE_COMPILERS


_GAP_WORKAROUND_HEADINGS = (
    "refusal at a gap in rlxviz's ops (a compiler fix; a workaround in the model too, its reason names it; not a "
    "near-miss)",
    "refusals at gaps in rlxviz's ops (compiler fixes; a workaround in the model too where a reason names one; not "
    "near-misses)")
"""The gap group's headings when a checked change to the model works around one of its places (`gap_asks`)."""


def left_out_heading(group: str, n: int, workaround: bool = False) -> str:
    """The heading of `n` items of a `verdict.LEFT_OUT_GROUPS` group, e.g. `1 lookalike, not a candidate (nothing to
    fix, not a near-miss)`; the text's line ends it with a colon, the app's chips say it in a tooltip. `workaround`:
    a checked change to the model works around one of the gap group's places (`places.Places.gap_worked`), so
    its heading says so, not "nothing in the model to change" (`gap_asks`).

    Raises:
        KeyError: `group` is not one of `verdict.LEFT_OUT_GROUPS` or `standing.STANDING_GROUPS`.
    """
    one, many = _LEFT_OUT_HEADINGS[group]
    if group == "gap in rlxviz's ops" and workaround:
        one, many = _GAP_WORKAROUND_HEADINGS
    return f"{n} {one if n == 1 else many}"


def fused_list(done: list[str]) -> str:
    """A layer's fused ops (`LayerVerdict.done`, items `OP %ID (PASS)`) as one line: every item when no op and pass
    repeat more than `GROUP_OVER` times, else such a run is one item at its first place,
    `ElementwiseRegion x57 (mark_elementwise_regions; %2429 ... %2569)` (count and its ids, `id_runs`). One line for
    every reader of the text: `explain` with or without `-v` and the app's Why tab (which renders it verbose, with
    each rule's outcome) say it alike; `--json` keeps every item."""
    groups: dict[tuple[str, str], list[str]] = {}
    for item in done:
        m = _DONE.match(item)
        groups.setdefault((m["op"], m["pass"]) if m else (item, ""), []).append(m["id"] if m else item)
    if all(len(ids) <= GROUP_OVER for ids in groups.values()):
        return ", ".join(done)
    out = []
    for (op, pass_name), ids in groups.items():
        if not pass_name:
            out += ids
        elif len(ids) > GROUP_OVER:
            out.append(f"{op} x{len(ids)} ({pass_name}; {id_runs(ids)})")
        else:
            out += [f"{op} %{i} ({pass_name})" for i in ids]
    return ", ".join(out)


def id_runs(ids: list[str]) -> str:
    """`ids` (node ids as text) as `%a ... %b` for each run of at least `GROUP_OVER` consecutive ids, the others one by
    one: a range holds only ids of the list (bart-full's `%361 ... %365` held %362, said outside the layers)."""
    nums = sorted(int(i) for i in ids)
    runs: list[list[int]] = []
    for k in nums:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    out: list[str] = []
    for r in runs:
        out += [f"%{r[0]} ... %{r[-1]}"] if len(r) >= GROUP_OVER else [f"%{k}" for k in r]
    return ", ".join(out)


def none_made_words(v: LayerVerdict) -> str:
    """What a fused layer's line (and its box in the layers drawing) says when no op of it fused: `NO_FUSED_OP` when
    gaps in rlxviz's ops held it back (a fused op was wanted that rlxviz cannot make), else `NOTHING_TO_FUSE`."""
    return NO_FUSED_OP if v.op_gaps else NOTHING_TO_FUSE


def kind_limit(v: LayerVerdict) -> str:
    """What the kind of a layer `fused` (`LayerVerdict.status`) rules out, so that its `fused` is no full fusion:
    `QUANTIZED_LIMIT` for a layer whose kind has quantized activations (`Architecture.quantized`, the `layer kind:`
    line's `quantized activations (N QuantizeLinear -> DequantizeLinear steps)`) and no whole-layer op
    (`fused_node`); "" otherwise (a layer fused as far as legal or rlxviz's ops go says so in its status)."""
    return QUANTIZED_LIMIT if v.status == "fused" and v.fused_node is None and v.expected_kind.quantized else ""


def made_words(v: LayerVerdict) -> str:
    """What a fused layer's line lists: its fused ops (`fused_list`), else `none_made_words`."""
    return fused_list(v.done) or none_made_words(v)


def outcome_dict(o: dict[str, Any] | None) -> dict[str, Any] | None:
    """An outcome's dict (`dataclasses.asdict` of a `passes.explain.Outcome`) with its keys worded as the text's lines
    (`Outcome.lines`): `fix` the line after `fix:` (the outcome's `hint`: what to change in the model), `compiler_fix`
    the line after `compiler fix:` (its `fix`); `--json`'s `first`, `rejections` and `illegal` items, as its
    `fix_checks` (`session.advice.FixCheck.to_dict`)."""
    if o is None:
        return None
    out = {k: x for k, x in o.items() if k not in ("hint", "fix")}
    out["fix"], out["compiler_fix"] = o["hint"], o["fix"]
    return out


def layer_dict(v: LayerVerdict) -> dict[str, Any]:
    """JSON-ready form of a layer's verdict (outcomes and the architecture as dicts; an outcome's keys as the text
    words its lines, `outcome_dict`)."""
    d = dataclasses.asdict(v)
    del d["missed"]  # the same misses as `misses`' text
    d["first"] = outcome_dict(d["first"])
    d["rejections"] = [outcome_dict(o) for o in d["rejections"]]
    d["illegal"] = [outcome_dict(o) for o in d["illegal"]]
    d["layer"], d["stack"], d["label"] = int(v.layer), getattr(v.layer, "stack", ""), layer_label(v.layer)
    d["status"] = v.status  # the text's headline word for word
    d["missed_products"] = v.missed_products if not v.fused else []  # the NOT fused line's `missed` (`done`: made)
    # `fused` as the headline counts it (`RunVerdict.fused_layers`): a layer held back only by rlxviz's ops is not
    # "fused" in --json either (a script read `fused: true` beside "held back by rlxviz's ops: no fused op");
    # `nothing_to_change` is the verdict's own flag (`LayerVerdict.fused`: nothing in the model to change)
    d["fused"], d["gap_only"], d["nothing_to_change"] = v.fused and not v.gap_only, v.gap_only, v.fused
    d["bert_style"] = v.bert_style
    d["op_gaps"] = v.op_gaps  # `gaps` in words; `gaps` as data, each with the blocker its fix alone leaves
    return d


def render_layer(v: LayerVerdict, verbose: bool = False) -> str:
    """The answer to "why didn't layer N fuse": status, the first rejecting guard (actual vs required),
    the fix, the sibling difference, and for non-BERT layers what the architecture expects."""
    if v.legal_only:
        lines = [f"{layer_label(v.layer)}: {v.status}: " + made_words(v)]
        for o in v.illegal:
            lines.append(f"  illegal here: {o.rule}")
            lines += o.lines("    ")
    elif v.fused and v.bert_style:
        where = f" -> {v.expected} %{v.fused_node}" if v.fused_node is not None else ""
        also = f"; also {fused_list(v.done)}" if v.done else ""  # fused ops beside the layer op
        lines = [f"{layer_label(v.layer)}: fused{where}{also}"]
    elif v.fused and v.op_gaps:  # the words say the gap: not "as expected" (`LayerVerdict.status`)
        lines = [f"{layer_label(v.layer)}: {v.status}: " + made_words(v)]
    elif v.fused:
        lines = [f"{layer_label(v.layer)}: {FUSED_AS_EXPECTED}: " + made_words(v)]
    else:
        lines = _not_fused(v)
    if v.rewritten and (v.fused or v.legal_only):  # plain ops a rewrite made: no fusion (`ir.ops.made_as`)
        lines.insert(1, f"  {REWRITTEN_AS}: {fused_list(v.rewritten)}")
    if v.fused and not v.legal_only:  # a fused layer can still hold a counted refusal (a form a rule declined)
        lines += [also_rejected_line(o, counted=False) for o in v.rejections]
    if v.fused:  # a place a later pass took after all: neither a near-miss nor a gap (`standing`'s `taken later`)
        lines += taken_later_lines(v)
    if not v.bert_style or v.legal_only:
        lines.append(f"  layer kind: {v.architecture.description}")
        gaps = v.layer_op_gaps
        why = (f"rlxviz's ops lack {' and '.join(gaps)}" if gaps else
               "FusedTransformerLayer is not legal for this layer" if v.expected_kind.post_ln else
               "FusedTransformerLayer only for post-LN BERT layers")
        lines.append(f"  expected: {v.expected or 'no fusion'} ({why})")
        lines += [f"  not expected here: {x}" for x in v.not_expected]
        lines += [f"  {OP_GAP_GROUP}: {x}" for x in v.gap_refusals]  # a compiler fix: no "not expected" (issue 39)
    lines += [f"  rlxviz's ops lack: {g}" for g in v.op_gaps]
    if v.expect == "pipeline":
        lines += [f"  judged against the pipeline only: {c}" for c in v.cannot_make]
    if verbose and v.explanation:  # the rules' outcomes, then the comparison with the sibling, said once
        lines += ["  " + ln for ln in v.explanation.splitlines()]
        if v.sibling is not None and not any(ln.endswith(SIBLING_DIFFERS) for ln in lines):
            lines += ["  " + ln for ln in comparison_lines(v.sibling, v.sibling_rule, v.differences)]
    return "\n".join(lines)


def also_rejected_line(o: Outcome, counted: bool) -> str:
    """A layer's `also rejected` line for its further counted refusal `o` (`LayerVerdict.rejections`), ending with
    its standing as every other refusal line says its own (`not expected here`, `illegal here (not counted)`, the
    groups' `nothing to fix, not a near-miss`): `counted` in a layer not fused (`ALSO_REJECTED_COUNTED`), else in a
    fused layer (`ALSO_REJECTED_NOT_COUNTED`), e.g. `  also rejected: canonicalize_exported.where_bias: bias_fills
    (not recognized); a near-miss (the app's chips mark it ✗), not counted against the layer: ...`."""
    return (f"  also rejected: {o.rule}: {o.guard} ({o.kind}); "
            f"{ALSO_REJECTED_COUNTED if counted else ALSO_REJECTED_NOT_COUNTED}")


def taken_later_lines(v: LayerVerdict) -> list[str]:
    """A layer's `taken later` lines, one per place of `LayerVerdict.taken`, e.g. `  taken later:
    fuse_matmul_bias_act.bias_after_residual: bias_after_residual (not recognized) @ %98: its matmul was fused later
    by fuse_attention_block into %148; not a near-miss, ...` (`TAKEN_LATER_STANDING`)."""
    return [f"  taken later: {x}; {TAKEN_LATER_STANDING}" for x in v.taken]


def not_fused_words(v: LayerVerdict) -> str:
    """What follows `NOT fused` on a layer's line: what the pipeline cannot make, else what a fusion that happened left
    (`blocker`), else what was expected and, when some op of the layer fused, what was made and what was missed
    (`(expected ...): made FusedMatMulBiasAct %12 (fuse_matmul_bias_act); missed FusedMatMulBiasAct at %7
    (fuse_matmul_bias_act.scale_before_bias: scale_before_bias)`: `fused_list`, `LayerVerdict.missed_products`)."""
    if v.expect == "model" and v.cannot_make:
        return f": the pipeline cannot make {', '.join(v.unmade_products)}"
    if v.blocker:
        return f": {v.blocker}"
    expected = f" (expected {v.expected})" if v.expected else ""
    if v.done:
        return f"{expected}: made {fused_list(v.done)}; missed {', '.join(v.missed_products)}"
    return expected


def _not_fused(v: LayerVerdict) -> list[str]:
    unmade = v.expect == "model" and v.cannot_make
    why = not_fused_words(v)
    lines = [f"{layer_label(v.layer)}: NOT fused{why}"]
    if unmade:
        lines += [f"  {c}" for c in v.cannot_make]
        lines.append("  (judged against what is legal for the layer; `rlxviz explain --expect pipeline` judges "
                     "against the pipeline's passes only)")
    if v.first is not None:
        lines.append(f"  first rejection: {v.first.rule}")
        lines += v.first.lines("    ")  # guard (stage, kind), fix, compiler fix, further failing guards
    elif v.silent:
        lines.append(f"  no rejection: {v.silent}")
    lines += [also_rejected_line(o, counted=True) for o in v.rejections if o is not v.first]
    lines += taken_later_lines(v)
    shown = {(o.rule, o.guard) for o in v.rejections} | ({(v.first.rule, v.first.guard)} if v.first else set())
    lines += [f"  also missed: {m}" for m in v.missed if not m.pattern.startswith("unrecognized.")
              and (m.pattern, m.guard) not in shown]  # e.g. a fusion that left its activation out (a soft guard)
    lines += [f"  illegal here (not counted): {o.rule}: {o.guard} ({o.kind}): {o.hint}" for o in v.illegal]
    lines += [f"  also unrecognized: {m}" for m in v.misses if m.startswith("unrecognized.")
              and (v.first is None or not m.startswith(v.first.rule + " "))]
    if v.expected_kind is not v.architecture:
        lines.append(f"  layer kind: {judged_words(v)}")
    if v.sibling is not None:
        lines.append(f"  {layer_label(v.sibling)} fused with {v.sibling_rule}{SIBLING_DIFFERS}")
        lines += [f"    {d}" for d in v.differences] or ["    (same primitive structure)"]
    return lines


def _kind_name(description: str) -> str:
    """A layer kind's short name from its description: `pre-LN` of `pre-LN (GPT-2, ViT): norm -> ...; LayerNorm`."""
    return description.split(";")[0].split(" (")[0].split(":")[0]


def judged_words(v: LayerVerdict) -> str:
    """The kind of a layer judged as its siblings' kind (`verdict.judged_kind`: it deviates from them, e.g. a teaching
    variant's pre-LN layer among post-LN ones), in words that promise no fusion: the layer is judged as its siblings
    to show what its change broke, `pre-LN (GPT-2, ViT): ...; judged as its post-LN siblings (post-LN (BERT): ...) to
    show what its change broke: its pre-LN layout is the change that stops FusedTransformerLayer`."""
    own, judged = v.architecture.description, v.expected_kind.description
    return (f"{own}; judged as its {_kind_name(judged)} siblings ({judged}) to show what its change broke: its "
            f"{_kind_name(own)} layout is the change that stops {v.expected or 'their fusions'}")


def headline(r: RunVerdict) -> str:
    """The text's first line: `MODEL (PIPELINE pipeline): N/M layer(s) fused as expected` (N: `fused_layers`, fused all
    the way or as far as legal), then the layers held back only by rlxviz's ops (`gap_words`), e.g. `0/2 layer(s) fused
    as expected; 2 fused as far as rlxviz's ops go (rlxviz lacks FusedAttentionBlock with a non-default scale: a
    compiler fix, nothing in the model to change)`."""
    if not r.layers:
        counts = ", ".join(f"{k}={v}" for k, v in r.counts.items()) or "no fused ops"
        held = graph_gap_words(r)
        return f"{r.model} ({r.pipeline} pipeline): no node path names a layer; final graph: {counts}" + (
            f"; {held}" if held else "")
    gaps = gap_words(r)
    return (f"{r.model} ({r.pipeline} pipeline): {r.fused_layers}/{len(r.layers)} layer(s) fused as expected"
            + (f"; {gaps}" if gaps else ""))


def gap_forms(r: RunVerdict) -> list[str]:
    """The op forms rlxviz lacks that held back the run's `gap_only` layers, each once, in layer order; for a graph
    whose node paths name no layer, those its refusals ran into when it has no miss (`RunVerdict.gaps`)."""
    if not r.layers:
        return list(dict.fromkeys(g.form for g in r.gaps)) if not r.misses else []
    return list(dict.fromkeys(g for s in r.layers if s.gap_only for g in s.gap_forms))


def graph_gap_words(r: RunVerdict) -> str:
    """What the headline of a graph whose node paths name no layer says of its gaps in rlxviz's ops when nothing else
    is missed, as a layered graph's says of a layer (`LayerVerdict.status`, `gap_words`): `held back by rlxviz's ops
    (rlxviz lacks FusedAttentionBlock without a mask operand: a compiler fix, nothing in the model to change)`, or
    `fused as far as rlxviz's ops go (...)` when the graph has fused ops; "" when it has none or a miss."""
    forms = gap_forms(r)
    if not forms:
        return ""
    status = gap_status(bool(r.counts), patterns=any(g.pattern_miss for g in r.gaps))
    blockers = list(dict.fromkeys(g.blocker for g in r.gaps if g.blocker))
    asks = gap_asks(any(g.workaround for g in r.gaps))
    if blockers:  # the compiler fix alone leaves a refusal standing: "nothing in the model to change" says too much
        asks = f"a compiler fix; alone it is not enough: {', '.join(blockers)} fails next"
    return f"{status} (rlxviz lacks {', '.join(forms)}: {asks})"


def gap_words(r: RunVerdict) -> str:
    """The headline's count of the layers held back only by rlxviz's ops (`LayerVerdict.gap_only`), by their status
    words, and what rlxviz lacks: `1 held back by rlxviz's ops (rlxviz lacks FusedAttentionBlock with QK-norm: a
    compiler fix, nothing in the model to change)`; where layers' gap lines name a model-side workaround
    (`caveat.model_fix_note`), in how many: `(rlxviz lacks FusedAttentionBlock with a non-default scale: a compiler
    fix; a workaround in the model in 2 of them (their gap lines name it))`; "" when there are none."""
    short = [s for s in r.layers if s.gap_only]
    if not short:
        return ""
    counts = [f"{n} {gap_status(made, patterns=pat)}" for made in (True, False) for pat in (False, True)
              if (n := sum(s.has_fused_op == made and s.pattern_blocked == pat for s in short))]
    lacks = f"{', '.join(counts)} (rlxviz lacks {', '.join(gap_forms(r))}"
    return f"{lacks}: {layer_fix_words(short, len(gap_forms(r)) > 1)})"


def layer_fix_words(short: list[LayerVerdict], several: bool) -> str:
    """What the compiler fix asks for layers `short` held back by rlxviz's ops (`LayerVerdict.gap_only`), from their
    gap records (`compiler_fix_words`): what fails next after a fix alone (`OpGap.blocker`, each layer's first), in
    how many no what-if checks it (`OpGap.unchecked`), in how many a checked change to the model works around it
    (`OpGap.workaround`, rounding-only ones said so). The headline (`gap_words`, every such layer) and the app's start
    strip (one layer) say it; `several`: rlxviz lacks several forms there."""
    firsts = [g for s in short if (g := next((x for x in s.gaps if x.blocker), None))]  # `LayerVerdict.gap_blocker`
    worked = sum(s.gap_workaround for s in short)  # `OpGap.workaround`: a checked change to the model
    # no what-if checks the fix where its refusal is a structure miss (`OpGap.unchecked`: codegen.qdyn's
    # `qkv_packed`, its RoPE guards never run): "nothing in the model to change" alone read as the fix being enough
    unchecked = sum(not any(g.blocker for g in s.gaps) and any(g.unchecked for g in s.gaps) for s in short)
    rounded = sum(s.gap_workaround_rounded for s in short)  # `OpGap.rounded`: equal only up to rounding
    workaround = workaround_words(worked, rounded, len(short) == 1)  # the start strip's one layer: "too"
    pairs = [(g.form, g.blocker) for g in firsts]  # `OpGap.blocker`: the fix alone not enough
    return compiler_fix_words(pairs, unchecked, several, workaround)


def run_dict(r: RunVerdict) -> dict[str, Any]:
    """`explain --json` of a run's verdict. Its top-level `misses`, `not_expected`, `architecture` and `recognized` are
    for a graph whose node paths name no layer; a layered graph's are under each layer (`layers[].not_expected`)."""
    return {"model": r.model, "pipeline": r.pipeline, "ok": r.ok, "fused_layers": r.fused_layers,
            "checked_layers": len(r.layers), "gap_layers": r.gap_layers, "gap_forms": gap_forms(r),
            "final_op_counts": r.counts, "layers": [layer_dict(s) for s in r.layers], "outside_layers": r.outside,
            "outside_boxes": r.outside_in, "outside_misses": r.outside_misses, "outside_gaps": r.outside_gaps,
            "misses": r.misses, "not_expected": r.not_expected, "gap_refusals": r.gap_refusals,
            "left_out": r.left_out,
            "left_out_groups": [{"kind": g, "heading": left_out_heading(g, len(lines)),
                                 "items": lines}
                                for g, lines in r.left_out_groups.items()],
            "architecture": None if r.architecture is None else dataclasses.asdict(r.architecture),
            "crashed_passes": r.crashed, "recognized": r.recognized, "expect": r.expect,
            "cannot_make": r.cannot_make or sorted({c for s in r.layers for c in s.cannot_make}),
            "headline": headline(r), "headline_notes": headline_notes(r)}


def render_run(r: RunVerdict, verbose: bool = False) -> str:
    """`explain`'s text of a run's verdict."""
    crashes = [f"CRASHED pass {c.splitlines()[0]} (its result was discarded)" for c in r.crashed]
    if not r.layers:
        head = [headline(r), *crashes]
        if r.architecture is not None:
            head.append(f"graph kind: {r.architecture.description}")
            head += [f"  evidence: {e}" for e in r.architecture.evidence]
        head += [f"recognized: {x}" for x in r.recognized]
        head.append(f"{len(r.misses)} missed fusion(s)" + (":" if r.misses else ""))
        unmade = ([f"  NOT made: {c}" for c in r.cannot_make] if r.expect == "model" else
                  [f"  judged against the pipeline only: {c}" for c in r.cannot_make])
        return "\n".join(head + [f"  {m}" for m in r.misses] + unmade
                         + [f"  not expected here: {x}" for x in r.not_expected]
                         + [f"  {OP_GAP_GROUP}: {x}" for x in r.gap_refusals]
                         + [f"  rlxviz's ops lack: {g}" for g in r.gaps] + _left_out(r))
    outside = ([outside_line(r)] if r.outside or r.outside_misses or r.outside_gaps else []) \
        + [f"  near-miss: {x}" for x in r.outside_misses] \
        + [f"  {OP_GAP_GROUP}: {x}" for x in r.outside_gaps]
    return "\n".join([headline(r), *crashes, *(f"  {n}" for n in headline_notes(r)),
                      *(render_layer(s, verbose) for s in r.layers), *outside, *_left_out(r)])


def outside_line(r: RunVerdict) -> str:
    """The `outside the layers:` line: the fused ops credited to no layer (`RunVerdict.outside`), by the place each
    sits (`RunVerdict.outside_in`, the name of the app's layers-view box that holds it): `outside the layers:
    embeddings: ElementwiseRegion %798 (mark_elementwise_regions); final norm: FusedResidualLN %797
    (fuse_residual_ln)`; its refusals (`outside_misses`, `outside_gaps`) go on the lines below it."""
    if not r.outside:
        return f"{OUTSIDE_LAYERS}: {NO_FUSED_OP}"
    by: dict[str, list[str]] = {}
    for item in r.outside:
        by.setdefault(r.outside_in.get(item, ""), []).append(item)
    return f"{OUTSIDE_LAYERS}: " + "; ".join(f"{box}: {fused_list(items)}" if box else fused_list(items)
                                           for box, items in by.items())


def headline_notes(r: RunVerdict) -> list[str]:
    """The notes under the headline (text: indented two spaces; `--json`: `headline_notes`), one per way a layer
    the count says "fused as expected" of falls short, so the count hides no shortfall (the counts and the exit
    status are unchanged): fused only as far as legal (`LayerVerdict.legal_only`), the products illegal for those
    layers, by rule ("1 of them only as far as legal: fuse_residual_ln.residual illegal for them"). A layer held back
    by rlxviz's ops is not among "them": the headline counts it apart (`gap_words`).

    [] when every layer counted is fused all the way, or no node path names a layer.
    """
    legal = [s for s in r.layers if s.legal_only and not s.gap_only]
    if not legal:
        return []
    rules = dict.fromkeys(o.rule for s in legal for o in s.illegal)
    return [f"{len(legal)} of them only as far as legal: {', '.join(rules)} illegal for "
            f"{'it' if len(legal) == 1 else 'them'}"]


def _left_out(r: RunVerdict) -> list[str]:
    """Each group of `left_out_groups`: its heading (`left_out_heading`), then its lines indented."""
    return [ln for g, lines in r.left_out_groups.items()
            for ln in (f"{left_out_heading(g, len(lines))}:", *(f"  {x}" for x in lines))]


__all__ = ["UNCHECKED_ALONE",
           "ALSO_REJECTED_COUNTED", "ALSO_REJECTED_NOT_COUNTED", "TAKEN_LATER_STANDING", "also_rejected_line",
           "taken_later_lines",
           "FUSED_AS_EXPECTED", "FUSED_AS_FAR_AS_OPS", "GAP_HAS_A_WORKAROUND", "GAP_IS_THE_COMPILERS", "WORKAROUND_TOO",
           "compiler_fix_words", "layer_fix_words", "workaround_words", "GROUP_OVER",
           "PATTERNS",
           "gap_status", "held_words",
           "HELD_BACK_BY_LEGAL_AND_OPS", "HELD_BACK_BY_OPS", "NOTHING_TO_FUSE", "NO_FUSED_OP", "OUTSIDE_LAYERS",
           "fused_list", "id_runs",
           "gap_forms", "gap_words", "graph_gap_words", "headline", "headline_notes", "judged_words", "kind_limit",
           "layer_dict", "QUANTIZED_LIMIT",
           "left_out_heading", "made_words", "none_made_words", "not_fused_words", "gap_asks", "outcome_dict",
           "render_layer", "render_run", "run_dict"]
