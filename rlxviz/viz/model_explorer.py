"""A graph version with its match/rejection annotations as Model Explorer graph JSON.

Google's Model Explorer (`pip install ai-edge-model-explorer`) shows graphs given in its own JSON
form: `{"graphs": [{"id", "nodes": [{"id", "label", "namespace", "attrs", "incomingEdges",
"outputsMetadata", "inputsMetadata", "style"}]}]}` (its `graph_builder` dataclasses; what an adapter
returns; with `label` it is also one `GraphCollection`). Here:

* one node per IR node (`id` = the IR id, `label` = the op), its `namespace` = the model path with `/`
  (`encoder/layer/0/attention`), so Model Explorer folds layers into groups as our viewer does;
* attrs: the op's attributes, `shape`, `dtype`, `path`, the pass that made the node and the rule that
  matched (`match`), the ids it replaced itself (`passes.made.replaced`, as the app's labels
  and search read it), and what it was made beside (`made`: `made by fuse_attention_block.qkv_columns beside attention
  %237 (the k operand)`), and, on every node the app's drawing marks for a rejection (`overlay.marked_nodes`: its
  subject or anchor, and each node it names offending),
  `rejected` lines `rule: guard: message`, its `fix` and `compiler_fix` as `explain -v` words them (`fix_words`: at
  a gap in rlxviz's ops the model-side change is `a workaround in the model: ...` and the compiler fix carries the
  text's caveat, `alone it is not enough: ... fails next`, as the △ mark does), and at a gap each op form the place
  lacks as `explain`'s `rlxviz's ops lack:` lines name them (`gaps_K`, `place_lacks`: esm.qdyn's integer-matmul
  projections beside its `default_scale` refusal);
* edges: each operand as an incoming edge (`targetNodeInputId` = operand position, with its role in
  `inputsMetadata`); `outputsMetadata` gives shape and dtype;
* style: fused nodes filled green; the nodes a refused place marks bordered by its standing, as the app's
  drawings and chips mark it (`overlay.place_groups`, `passes.why.places.place_standings`): a near-miss in the
  rejection's red (`styles.REJECT`, `✗`), a gap in rlxviz's ops in its own ink (`styles.OP_GAP_INK`, `△`), nothing
  to fix in the faded grey (`styles.NOT_NEAR_MISS_INK`, `○`); each `rejected_K` line starts with that mark and word.

All text is data: JSON-escaped by `json.dumps`, never interpreted.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..ir import Graph, operand_roles
from ..ir.ops import FUSED
from ..passes.made import Beside, holders, made_in_run, made_words, replaced
from ..passes.trace import Match, Rejection, Trace, whose_place
from . import styles as st
from .dot import FADED_MARK, GAP_MARK, NEAR_MISS_MARK
from .overlay import (
    Followers,
    GapNames,
    all_versions,
    follower_note,
    gap_caveats,
    gap_followers,
    gap_names,
    group_words,
    is_gap,
    marked_nodes,
    place_groups,
    run_groups,
    worded,
)

FUSED_FILL = "#c8e6c9"
REJECTED_BORDER = st.REJECT
"""The border of a node a near-miss is about (`✗`), the drawings' rejection red."""


def standing_style(group: str | None, gaps: GapNames = ()) -> tuple[str, str, int]:
    """`(mark and word, border colour, rank)` of a refused place whose standing group is `group` (`place_groups`:
    None for a near-miss): `✗ near-miss` in `styles.REJECT`, `△ GROUP` in `styles.OP_GAP_INK` for a gap in rlxviz's
    ops (naming each of the place's `gaps`, `overlay.gap_names`, where it ran into several: `overlay.group_words`,
    `△ 2 gaps in rlxviz's ops: its integer-matmul Q/K/V projections (integer_qkv), default_scale`), else `○ GROUP`
    in `styles.NOT_NEAR_MISS_INK`. `rank` orders them where several places meet at one node: the near-miss's red
    wins, then the gap's ink, then the grey (as the drawings do)."""
    if group is None:
        return f"{NEAR_MISS_MARK} near-miss", st.REJECT, 2
    if is_gap(group):
        return f"{GAP_MARK} {group_words(group, gaps)}", st.OP_GAP_INK, 1
    return f"{FADED_MARK} {group}", st.NOT_NEAR_MISS_INK, 0


def _kv(key: str, value: Any) -> dict[str, str]:
    return {"key": key, "value": value if isinstance(value, str) else json.dumps(value, default=str)}


def fix_words(trace: Trace, r: Rejection, group: str | None, caveat: str = "") -> tuple[str, str]:
    """`(fix, compiler fix)` of refusal `r` (worded: `overlay.worded`) as `explain -v`'s `fix:` and `compiler fix:`
    lines say them, framed as its not-expected line frames them at a gap in rlxviz's ops (`group`, its place's
    standing: `is_gap`): the fix, when it is the checked change to the model (`why.caveat.model_fix_note`), as
    `a workaround in the model: ...` (`why.caveat.workaround_words`: granite's folded scale, beside the compiler fix
    `give FusedAttentionBlock a scale attribute`), and the compiler fix with the place's `caveat`
    (`overlay.gap_caveats`, the △ mark's: esm's `alone it is not enough: qkv_packed (not recognized) fails next`).
    Elsewhere `(r.hint, r.fix)`.
    """
    if group is None or not is_gap(group):
        return r.hint, r.fix
    from ..passes.why.caveat import model_fix_note, workaround_words  # the verdict reads the pipeline

    model = model_fix_note(trace, r.rule, r.anchor, r.guard)
    fix = workaround_words(model) if model and model == r.hint else r.hint
    return fix, "; ".join(x for x in (r.fix, caveat) if x) if r.fix else ""


def graph_json(graph: Graph, matches: list[Match] | None = None, rejections: list[Rejection] | None = None,
               graph_id: str | None = None, standings: dict[tuple[str, int], str] | None = None,
               fixes: dict[tuple[str, int, str], tuple[str, str]] | None = None,
               marks: dict[tuple[str, int, str], tuple[str, str]] | None = None,
               gaps: dict[tuple[str, int], GapNames] | None = None,
               made: dict[int, Beside] | None = None, lacks: dict[tuple[str, int], str] | None = None,
               versions: Graph | None = None) -> dict[str, Any]:
    """One Model Explorer `Graph` dict for `graph`, annotated with the given matches and rejections.

    Args:
        graph: a graph version.
        matches: matches whose `fused` node is in `graph` get a `match` attribute naming the rule.
        rejections: each rejection annotates its anchor and subject (if they are in `graph`).
        graph_id: the graph's id in Model Explorer (default: `graph.name`).
        standings: each place (rule, anchor) that is no near-miss -> its standing group (`overlay.place_groups`);
            a place not in it is a near-miss (None: every place is).
        fixes: (rule, anchor, guard) -> `fix_words` of the refusal; a refusal not in it: `(r.hint, r.fix)`.
        marks: (rule, anchor, guard) of a further failing guard at a gap place that is no gap itself -> its mark's
            two parts (`follower_marks`: `beside the gap rope_full_rotary:` / `rope_halves (not recognized) also
            fails, no gap itself`) instead of the place's group, which would name it a gap.
        gaps: each place at a gap in rlxviz's ops -> the gaps it ran into (`overlay.gap_names`): a place at several
            says each, as the drawing's `△` label does (`overlay.group_words`: esm.qdyn's `△ 2 gaps in rlxviz's ops:
            its integer-matmul Q/K/V projections (integer_qkv), default_scale`).
        lacks: each place at a gap in rlxviz's ops -> the op forms it lacks as `explain`'s `rlxviz's ops lack:`
            lines name them (`place_lacks`, the verdict's `LayerVerdict.gaps`), put in `gaps_K` beside its line.
        made: node id -> what a node a match made beside its product is (`passes.made.made_in_run`): its `made`
            attribute says so; each node's `absorbed` attribute lists what it replaced itself
            (`passes.made.replaced`, as the app's labels, inspector and search index read it): the product the
            match's list, never a rope or narrow made beside it with that list.
        versions: every node of the run (`overlay.all_versions`), to read a list made beside a product that `graph`
            no longer holds.

    Each rejection marks the nodes the app's drawing marks for it (`overlay.marked_nodes`: its subject, else its
    anchor, then each node it names offending), its line's word followed by whose place it is where the node lies in
    another layer (`passes.trace.whose_place`), as the drawing's note does.
    """
    groups = standings or {}
    by_fused: dict[int, Match] = {m.fused: m for m in matches or () if m.fused is not None}
    rejected: dict[int, list[Rejection]] = defaultdict(list)
    for r in rejections or ():
        for i in marked_nodes(r, graph):
            if i in graph and r not in rejected[i]:
                rejected[i].append(r)
    beside = made or {}
    held = holders(graph, beside, versions)  # where a product gone from `graph` went (`passes.made.where_now`)
    nodes = []
    for n in graph:
        attrs = [_kv(k, v) for k, v in n.attrs.items()]
        attrs += [_kv("shape", list(n.shape)), _kv("dtype", n.dtype.value), _kv("path", n.path or "<root>")]
        if n.pass_name:
            attrs.append(_kv("made_by", n.pass_name))
        if n.id in by_fused:
            attrs.append(_kv("match", by_fused[n.id].rule))
        if own := replaced(n, graph, beside, versions):
            attrs.append({"key": "absorbed", "value": {"type": "node_ids", "nodeIds": [str(i) for i in own]}})
        if n.id in beside:
            attrs.append(_kv("made", made_words(n.id, graph, beside, versions, held)))
        border = None
        for k, r in enumerate(rejected.get(n.id, ())):
            group = groups.get((r.rule, r.anchor))
            word, ink, rank = standing_style(group, (gaps or {}).get((r.rule, r.anchor), ()))
            whose = whose_place(r.layer, n.path)
            follower = (marks or {}).get((r.rule, r.anchor, r.guard))
            word = f"{GAP_MARK} {follower[0]}{whose} {follower[1]}" if follower is not None else word + whose
            border = max(border or (ink, rank), (ink, rank), key=lambda b: b[1])
            attrs.append(_kv(f"rejected_{k}", f"{word}: {r.rule}: {r.guard} ({r.stage}): {r.message}"))
            if follower is None and (lacked := (lacks or {}).get((r.rule, r.anchor))):
                attrs.append(_kv(f"gaps_{k}", lacked))
            fix, compiler = (fixes or {}).get((r.rule, r.anchor, r.guard), (r.hint, r.fix))
            if fix:
                attrs.append(_kv(f"fix_{k}", fix))
            if compiler:
                attrs.append(_kv(f"compiler_fix_{k}", compiler))
        roles = operand_roles(n.op, n.attrs, len(n.inputs))
        node: dict[str, Any] = {
            "id": str(n.id), "label": n.op.value, "namespace": n.path.replace(".", "/"), "subgraphIds": [],
            "attrs": attrs,
            "incomingEdges": [{"sourceNodeId": str(i), "sourceNodeOutputId": "0", "targetNodeInputId": str(k)}
                              for k, i in enumerate(n.inputs)],
            "inputsMetadata": [{"id": str(k), "attrs": [_kv("__tensor_tag", roles[k] if k < len(roles) else f"in{k}")]}
                               for k in range(len(n.inputs))],
            "outputsMetadata": [{"id": "0", "attrs": [_kv("shape", str(list(n.shape))), _kv("dtype", n.dtype.value),
                                                      _kv("tensor_name", f"%{n.id}")]}],
        }
        style = {}
        if n.op in FUSED:
            style["backgroundColor"] = FUSED_FILL
        if border is not None:
            style["borderColor"] = style["hoveredBorderColor"] = border[0]
        if style:
            node["style"] = style
        nodes.append(node)
    return {"id": graph_id or graph.name, "nodes": nodes}


def follower_marks(trace: Trace, k: int, groups: dict[tuple[str, int], str]
                   ) -> dict[tuple[str, int, str], tuple[str, str]]:
    """(rule, anchor, guard) of each further failing guard of `trace.steps[k]`'s places at a gap in rlxviz's ops that
    is no gap itself (`overlay.gap_followers`, the drawing's and the Why title's reading, `explain`'s `also fails`) ->
    the two parts of its mark, worded as the drawing's note (`overlay.follower_note`: `fix of rope_full_rotary alone
    is not enough:` / `attn_single_user (illegal) fails next`; `graph_json` puts `△` before and whose place it is
    between): gptj's `qkv_split` and `qkv_user_count` beside its `rope_full_rotary` gap were marked `△ gap in
    rlxviz's ops`, read as gaps of their own."""
    step = trace.steps[k]
    followers: Followers = gap_followers(trace, step, groups)
    if not followers:
        return {}
    names = gap_names(trace, step, groups)
    kinds = {(r.rule, r.anchor, r.guard): r.kind for r in step.rejections}
    return {key: follower_note(names.get(key[:2], ()), key[2], kinds.get(key, ""), words)
            for key, words in followers.items()}


def place_lacks(trace: Trace) -> dict[tuple[str, int], str]:
    """Each place (rule, anchor) of `trace` at a gap in rlxviz's ops -> the op forms its layer's verdict says it lacks
    there (`LayerVerdict.gaps` whose places hold the anchor), as `explain`'s `rlxviz's ops lack:` lines say them
    (`OpGap.__str__`), joined by `; `: esm.qdyn's attention -> `FusedAttentionBlock over integer-matmul Q/K/V
    projections (dynamic quantization) (fuse_attention_block.qkv_attention_out: its integer-matmul Q/K/V projections
    (integer_qkv)); FusedAttentionBlock with the scale applied to Q before RoPE (...: default_scale)`. The headline's
    source, so the export's node names every gap the text names, not the refusing guard's alone."""
    from ..passes.why.verdict import RunVerdict  # the verdict reads the pipeline

    out: dict[tuple[str, int], list[str]] = {}
    for lv in RunVerdict.of(trace).layers:
        for g in lv.gaps:
            for a in g.at:
                out.setdefault((g.rule, a), []).append(str(g))
    return {pl: "; ".join(dict.fromkeys(x)) for pl, x in out.items()}


def trace_json(trace: Trace, versions: str = "all") -> dict[str, Any]:
    """Model Explorer graphs for a pipeline run: the input graph and, with `versions="all"`, the graph
    after every pass that changed or rejected something (annotated with the matches so far, whose fused
    nodes are still there, and that pass's rejections); with
    `versions="final"`, only the final graph annotated with every match and rejection of the run."""
    graphs = []
    name = trace.input.name
    groups = {k: place_groups(trace, s) for k, s in enumerate(trace.steps) if s.rejections}
    fixes: dict[tuple[str, int, str], tuple[str, str]] = {}  # the fix lines, framed as `explain -v` frames them
    marks = {k: follower_marks(trace, k, at) for k, at in groups.items()}  # no gap itself: the drawing's words
    gaps = {k: gap_names(trace, trace.steps[k], at) for k, at in groups.items()}  # each gap a place ran into
    made, every = made_in_run(trace), all_versions(trace)  # a node made beside a product: not the holder of its list
    lacks = place_lacks(trace) if any(is_gap(g) for at in groups.values() for g in at.values()) else {}
    for k, at in groups.items():
        caveats = gap_caveats(trace, trace.steps[k], at)  # the △ mark's, on its place's headline refusal
        fixes |= {(r.rule, r.anchor, r.guard): fix_words(trace, r, at.get((r.rule, r.anchor)),
                                                         caveats.get((r.rule, r.anchor), "") if r.headline else "")
                  for r in worded(trace, trace.steps[k])}
    if versions == "final":
        said = [r for s in trace.steps for r in worded(trace, s)]  # as explain words them (`every` stays the nodes)
        graphs.append(graph_json(trace.final, trace.matches, said, f"{name}: final", run_groups(trace), fixes,
                                 {key: w for m in marks.values() for key, w in m.items()},
                                 {pl: names for g in gaps.values() for pl, names in g.items()}, made, lacks, every))
    else:
        graphs.append(graph_json(trace.input, [], [], f"{name}: 0 input", made=made, versions=every))
        so_far: list[Match] = []
        for k, s in enumerate(trace.steps, 1):
            so_far += s.matches
            if s.changed or s.rejections:
                graphs.append(graph_json(s.after, so_far, list(worded(trace, s)), f"{name}: {k} {s.pass_name}",
                                         groups.get(k - 1, {}), fixes, marks.get(k - 1, {}), gaps.get(k - 1, {}),
                                         made, lacks, every))
    return {"label": name, "graphs": graphs}


def save_model_explorer(trace: Trace, path: str | Path, versions: str = "all") -> Path:
    """Write `trace_json(trace, versions)` to `path` (a `.json` file Model Explorer opens)."""
    p = Path(path)
    p.write_text(json.dumps(trace_json(trace, versions)), encoding="utf-8")
    return p


__all__ = ["fix_words", "follower_marks", "graph_json", "place_lacks", "save_model_explorer", "standing_style",
           "trace_json"]
