"""Plain-data derivations of a `Trace` for the app's tables and inspectors (no Panel import).

* `decision_rows`: every match and rejection as one table row (pass, rule, layer, guard, message).
* `node_report`: what the inspector says about one node: op, attributes, shapes, provenance,
  operands, users, and every decision that involved it (`node_decisions`: one outcome per rule, candidate and role;
  a fusion with what it left out and why, as `explain`'s `Outcome.soft` says it).

The inspector's Markdown of a report (`report_markdown`) is `inspector_text`'s, re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..ir import Graph, Node, Op, format_node, operand_roles
from ..ir.ops import made_as
from ..ir.printer import format_value
from ..passes.made import Credit, credit, made_in_run, made_words, maker, remade_in_run, replaced, stage_makers
from ..passes.pipeline import role_label
from ..passes.placement import match_layer, outside_box, sits
from ..passes.report import fix_line, in_context
from ..passes.trace import (
    PassStep,
    Rejection,
    Trace,
    anchor_position,
    family_of,
    layer_label,
    layer_of,
    own_key,
    reading_order,
    whose_place,
)
from ..passes.why.facts import RunFacts, layer_indices
from ..passes.why.places import gap_workaround, place_standings, place_status, step_refusals
from ..passes.why.standing import Held
from ..passes.why.standing import standing as refusal_standing
from ..passes.why.verdict import OP_GAP_GROUP, RunVerdict
from ..session import host_words
from ..session.tensors import summarize
from ..viz.overlay import Followers, GapNames, all_versions, follower_note, gap_followers, gap_names, held_places
from .inspector_text import (
    LEFT_OUT,
    NOT_NEAR_MISS,
    OP_GAP,
    OPERAND,
    PASSED,
    REJECTED,
    WEIGHTS_SHOWN,
    _why_markdown,
    decision_markdown,
    decisions_markdown,
    report_markdown,
    weights_left,
)
from .onnxorigin import onnx_in_part, onnx_origin
from .text import md_code


def decision_rows(trace: Trace | None) -> list[dict[str, Any]]:
    """One row per match and per rejection, in the order a reader walks the model (`passes.trace.reading_order`, as
    `explain` lists its left-out lines): by layer, then by the anchor's position in the input graph (`position`),
    then by pass (pipeline order).

    Columns: `kind` (`fused`, its guard `all passed` or, for a fusion that left something out, `passed; left out
    by GUARD` / `rejected` / `left out`: a soft rejection of a rule that fused / `not a
    candidate`: nodes that only look like the rule's input, a broadcast sum; no near-miss), `step` (index
    into `trace.steps`), `pass`, `rule`, `layer` (int or None), `stage`, `guard`, `why` (the guard's kind of
    "no": `illegal`, `not recognized`, `not profitable`; `also: ...` for a further failing guard of the same
    candidate; empty, or `also`, where `kind` already says it: the model's own term is said once a row), `place`
    (for a row of no layer in a graph whose node paths name layers: the place outside the layers its node sits,
    `placement.outside_box`, as `explain`'s `outside the layers: embeddings: ...` names it; "" for any other row),
    `anchor`, `message` (as `explain` words it, `report.in_context`: a "run P first" whose P ran before
    says what P decided there, its rejection on these nodes), `hint` (the fix, `report.fix_line`: the line `explain`
    prints after `fix:`, empty where it prints none, as where the message says it), `fix` (compiler-side), `nodes` (ids
    to highlight), `position` (the anchor's place in the input graph's topological order, 0 the first node, a node a
    pass made where its result stood: `passes.trace.anchor_position`; None for an anchor no version holds).
    """
    rows: list[dict[str, Any]] = []
    if trace is None:
        return rows
    names = trace.step_names()  # a later run as its version is named (`fuse_sdpa#2`): a click finds that version
    layered = bool(RunFacts.of(trace).layers)  # else no place is outside the layers: the whole graph is one
    for k, s in enumerate(trace.steps):
        for m in s.matches:
            nodes = sorted({m.anchor, *m.bindings.values(), *([m.fused] if m.fused is not None else [])})
            fused = s.after.get(m.fused) if m.fused is not None else None
            # a fusion that left something out (its soft rejections, each its own "left out" row) did not pass
            # every guard: its row says which ones it was made without, as the inspector does
            left = [r for r in s.rejections if r.soft and (r.rule, r.anchor) == (m.rule, m.anchor)]
            without = ", ".join(_ops(s.before, [i for r in left for i in r.offending]))
            # a fused op is "fused into"; a plain op a rewrite made (canonicalize_exported's add) "rewritten as"
            made = "rewritten" if fused is None else f"{made_as(fused.op)} {fused.op.value} %{fused.id}"
            # the layer the verdict credits it to (`placement.match_layer`: a final norm's row names no layer)
            layer = match_layer(trace.input, s.before, s.after, m)
            rows.append({"kind": "fused", "step": k, "pass": names[k], "rule": m.rule, "layer": layer,
                         "stage": "", "guard": "all passed" if not left else
                         "passed; left out by " + ", ".join(dict.fromkeys(r.guard for r in left)),
                         "why": "", "fix": "", "anchor": m.anchor,
                         "message": made + (f", without {without}" if left and without else ""),
                         "hint": "", "path": m.path, "nodes": nodes,
                         "place": outside_box(trace, m.fused if fused is not None else m.anchor)
                         if layer is None and layered else ""})
        status = {pl: place_status(head, st) for pl, (head, st) in place_standings(trace, k).items()}
        for r in step_refusals(trace, k):  # the step's, and the unrecognized findings filed under it (as the chips)
            nodes = list(dict.fromkeys([*r.offending, r.anchor]))
            # the place's standing, as the chips count it (`places.place_status`): a refusal the layer's kind does
            # not expect reads "not expected here", never "rejected"; the guard's own kind stays in `why`, unless
            # the kind column says it already (a place keeping the model's own term: said once per row)
            kind = status[(r.rule, r.anchor)]
            why = "" if r.kind == kind else r.kind
            why = why if r.headline else f"also: {why}" if why else "also"
            message = in_context(trace, k, r)[0]  # as `explain` words it: a "run P first" whose P ran says so
            hint = fix_line(trace, k, r)  # the fix, never a copy of the message
            rows.append({"kind": kind, "step": k, "pass": names[k], "rule": r.rule,
                         "layer": r.layer, "stage": r.stage, "guard": r.guard, "why": why, "fix": r.fix,
                         "anchor": r.anchor, "message": message, "hint": hint, "path": r.path, "nodes": nodes,
                         "place": outside_box(trace, r.anchor) if r.layer is None and layered else ""})
    key = reading_order(trace)
    rows.sort(key=lambda r: (key(r["layer"], r["anchor"]), r["step"]))  # stable: a pass's own order kept last
    position = anchor_position(trace)
    for r in rows:
        at = position(r["anchor"])
        r["position"] = int(at) if at != float("inf") else None
    return rows


def _node_line(g: Graph, nid: int, role: str | None = None) -> str:
    """`role: %id op dtype[shape] @path` of node `nid`; a constant's whole value after it (` = [0, 1, ...]`): the
    drawing folds a constant into its reader's label and shortens its value there (`viz.styles.short_value`), so the
    inspector is where its value is read in full."""
    n = g.get(nid)
    if n is None:
        return f"%{nid} (not in this version)"
    where = f" @{n.path}" if n.path else ""
    value = f" = {format_value(n.attrs['value'])}" if n.op == Op.CONST and "value" in n.attrs else ""
    return f"{role + ': ' if role else ''}%{n.id} {n.op.value} {n.dtype}{list(n.shape)}{value}{where}"


def counterparts(before: Graph, after: Graph, node_id: int,
                 trace: Trace | None = None) -> tuple[list[int], list[int]]:
    """Where node `node_id` is in the graphs before and after a pass: (ids in `before`, ids in `after`).

    A node the pass kept has the same id in both. A node it replaced is shown in `after` by the nodes that replaced
    it themselves, and a node the pass made is shown in `before` by what it replaced itself: `passes.made.replaced`,
    the one reading of a node's list every view gives (its label's count, the inspector's "replacing"), never the
    rewrite's raw record (`Node.absorbed`: gptj's attention %233 lists the ropes and the Q/K/V projection that
    `qkv_columns` re-made as %229, %231, %227, so they are those nodes' counterparts, not its). A node made beside a
    product holding the product's list (`made.is_copy`) replaced nothing. A node removed without a replacement (dead
    code) has no counterpart: an empty list.

    Args:
        trace: the run `before` and `after` are versions of: what each node a match made beside its product is
            (`made.made_in_run`) and every node of the run (`viz.overlay.all_versions`); None: read from the two
            graphs alone.

    Returns:
        (ids in `before`, ids in `after`), each in the order `after`'s lists and nodes give them.
    """
    beside = made_in_run(trace) if trace is not None else {}
    versions = all_versions(trace) if trace is not None else None
    in_before = [node_id] if node_id in before else []
    in_after = [node_id] if node_id in after else []
    if in_before and not in_after:
        in_after = [n.id for n in after
                    if node_id in n.absorbed and node_id in replaced(n, after, beside, versions)]
    elif in_after and not in_before:
        in_before = [i for i in replaced(after[node_id], after, beside, versions) if i in before]
    return in_before, in_after


def counterpart_line(before: Graph, after: Graph, node_id: int, pass_name: str, trace: Trace | None = None) -> str:
    """One Markdown line saying what node `node_id` became in the pass `pass_name` (or was made from, `counterparts`
    with `trace`), '' for a node the pass kept or made replacing nothing; op names come from the op table, ids are
    numbers."""
    in_before, in_after = counterparts(before, after, node_id, trace)
    if node_id in before and node_id in after:
        return ""
    name = md_code(pass_name)
    if node_id in before:
        if not in_after:
            return f"**{name} removed this node** (no node of the version after it replaces it)"
        made = ", ".join(f"%{i} {md_code(after[i].op.value)}" for i in in_after)
        return f"**became** {made} after {name} (marked in the after pane)"
    if node_id in after and in_before:
        return f"**made by** {name} from " + ", ".join(f"%{i}" for i in in_before) + " (marked in the before pane)"
    return ""


def made_once(line: str, rest: str, rep: Mapping[str, Any], step_name: str) -> tuple[str, str]:
    """The inspector's step line (`counterpart_line`) and the rest of its report (`report_markdown` of `rep` after
    its heading) with which pass made the node said once: where the step `step_name` made it and the node's pass is
    the step's (`family_of`: `fuse_attention_block` made gptj's %233 at its stage `fuse_attention_block/qkv_columns`),
    the report's "created by" line goes when it says nothing more than the step's "made by" line (both list what the
    node replaced itself, `made.replaced`); where it says more (what the node was made beside, `made`, or the earlier
    product it re-makes, `was`: gpt-neox's %231), it stays and the step's line goes, its pane note moved onto it.

    Returns:
        (the step line, "" when it goes; the rest, its paragraphs split on blank lines as `report_markdown` joins
        them)."""
    if not line.startswith("**made by**") or family_of(rep["pass_name"]) != family_of(step_name):
        return line, rest
    head = f"**created by** {md_code(rep['pass_name'])}"
    paras = rest.split("\n\n")
    if not rep.get("made") and not rep.get("was"):
        return line, "\n\n".join(p for p in paras if not p.startswith(head))
    return "", "\n\n".join(p + " (marked in the before pane)" if p.startswith(head) else p for p in paras)


def weight_names(graph: Graph, n: Node, weights: Mapping[str, np.ndarray]) -> list[str]:
    """The names of every weight a node holds (a param node's own, or a compute node's param operands, in operand
    order) that `weights` has: what `node_weights` summarizes the first `WEIGHTS_SHOWN` of."""
    params = [n] if n.op is Op.PARAM else [graph[i] for i in n.inputs if i in graph and graph[i].op is Op.PARAM]
    return [name for p in params if (name := p.attrs.get("name", "")) in weights]


def node_weights(graph: Graph, n: Node, weights: Mapping[str, np.ndarray]) -> list[tuple[str, list[str]]]:
    """(param name, `session.tensors.TensorSummary.lines()`) for the weights a node holds (`weight_names`), at most
    `WEIGHTS_SHOWN`; each summary reads a bounded sample. The report says how many it left out (`weights_left`)."""
    return [(name, summarize(weights[name]).lines()) for name in weight_names(graph, n, weights)[:WEIGHTS_SHOWN]]


def node_report(graph: Graph, node_id: int, trace: Trace | None = None,
                weights: Mapping[str, np.ndarray] | None = None,
                onnx_nodes: Mapping[int, tuple[str, str, str]] | None = None,
                onnx_domains: Mapping[str, str] | None = None, verdict: RunVerdict | None = None) -> dict[str, Any]:
    """Everything the inspector shows about `node_id` in `graph`.

    Args:
        trace: the run; give the one whose fixes were checked (`AppState.advised_trace`), so that each decision's
            Fix is the one `explain` and the Why tab print.
        verdict: the run's verdict as the Why tab shows it (`AppState.verdict`: every fix checked); None: the
            verdict of `trace` as it stands (`RunVerdict.of`).
        weights: the model's params by name: the report then summarizes the node's weights (`node_weights`).
        onnx_nodes: `Model.meta["onnx_nodes"]` of a model read from ONNX: the report then names the ONNX nodes the
            node came from (`onnx`: `onnx_origin`, each named by one node of `graph`; `onnx_product`: `rope %777`
            for a node made beside that product, which names its match's; `onnx_part`: those absorbed in part,
            `onnx_in_part`), to find it in Netron or Model Explorer.
        onnx_domains: `Model.meta["onnx_domains"]` (ONNX node name -> its domain, as the file says): the report's
            `onnx_domains` then gives the file's domain of each named node (else `onnx_domain` infers it).

    Returns:
        dict with `id, op, attrs, shape, dtype, path, layer, pass_name, absorbed, ir, operands` (role lines; with
        `trace`, `layer` and `place` say where it sits, `placement.sits`, `layer` as the model's own key so its label
        names the stack where there are two, `decoder layer 0`; `absorbed`: the ids it replaced itself),
        `record` (`Node.absorbed`, the IR line's `<-` list), `users` (lines), `is_output`, `weights` ((name,
        lines) per weight tensor, at most `WEIGHTS_SHOWN`),
        `weights_held` (every weight's name, `weight_names`), `host`: where an `onnx_op` runs (`session.host_words`,
        "" for any other node), `decisions`: `node_decisions`
        (one per decision of `trace` whose anchor, bindings, offending nodes or fused node is this node; messages
        and hints as `explain` words them, `report.in_context`: a "run P first" whose P ran says what P did), and
        `verdict`: the node's layer's verdict (`_verdict`); with `trace`, `made`: what a node a match made beside its
        product is (`passes.made.made_words`, "" for any other node), `was`: {id it re-makes: what that was,
        `made.Remade.what`}.

    Raises:
        KeyError: no such node in `graph`.
    """
    n: Node | None = graph.get(node_id)
    if n is None:
        raise KeyError(f"node %{node_id} is not in this version of the graph")
    roles = operand_roles(n.op, n.attrs, len(n.inputs))
    versions = all_versions(trace) if trace is not None else None
    beside = made_in_run(trace) if trace is not None else {}
    report: dict[str, Any] = {
        "id": n.id, "op": n.op.value, "attrs": dict(n.attrs), "shape": list(n.shape), "dtype": str(n.dtype),
        "path": n.path, "layer": layer_of(n.path),
        "pass_name": maker(n, stage_makers(trace)) if trace is not None else n.pass_name,
        "absorbed": list(replaced(n, graph, beside, versions)),  # what it replaced itself, as the drawing counts
        "record": list(n.absorbed),  # the rewrite's record, every node its match absorbed: the IR line's `<-`
        "ir": format_node(n), "is_output": graph.is_output(n),
        "operands": [_node_line(graph, i, roles[k] if k < len(roles) else None) for k, i in enumerate(n.inputs)],
        "users": [_node_line(graph, u.id) for u in graph.users(n)],
        "weights": node_weights(graph, n, weights) if weights else [],
        "weights_held": weight_names(graph, n, weights) if weights else [],
        "decisions": [], "verdict": None, "made": "", "onnx_own": bool(onnx_nodes) and n.id in onnx_nodes,
        "host": host_words(n) or "",  # an `onnx_op`: it runs on the host, as `explain`'s line says of it
    }
    # the ONNX nodes it came from, through every fusion of the run (a fused attention: its MatMuls and Softmax)
    # each imported node named by one live node of `graph`, the one that computes it (`onnxorigin.onnx_claims`)
    report["onnx"] = onnx_origin(n, onnx_nodes, versions, graph, beside)
    report["onnx_part"] = onnx_in_part(n, onnx_nodes, versions, graph, beside)  # gpt2.ortopt's FastGelu: its add
    b = beside.get(node_id) if onnx_nodes else None
    report["onnx_product"] = f"{b.op} %{b.product}" if b is not None and node_id not in onnx_nodes else ""
    report["onnx_domains"] = ({name: onnx_domains[name] for _, name in report["onnx"] if name in onnx_domains}
                              if onnx_domains else {})
    if trace is None:  # its layer as the graph's own key: `decoder layer 0` where the graph has two stacks
        report["layer"] = own_key(layer_indices(graph), report["layer"])
        return report
    report["made"] = made_words(node_id, graph, beside, versions)  # its product named in `graph` (`where_now`)
    report["was"] = {r.old: r.what} if (r := remade_in_run(trace).get(node_id)) is not None else {}  # gptj's %214
    report["decisions"] = node_decisions(trace, node_id)
    layer, report["place"] = sits(trace, n)  # where its box and `explain` say it sits, not its path
    # as the model's own key (`trace.own_key`), so `layer_label` names it as every view does: `decoder layer 0`
    report["layer"] = own_key(RunFacts.of(trace).layers, layer)
    report["verdict"] = _verdict(trace, report["layer"], verdict)
    return report


def _ops(g: Graph, ids: Iterable[int]) -> list[str]:
    """`%id op` of each node (`%id` alone for one `g` lacks)."""
    return [f"%{i} {g[i].op.value}" if i in g else f"%{i}" for i in ids]


def _left(trace: Trace, k: int, r: Rejection,
          standings: Mapping[tuple[str, int], tuple[Rejection, tuple[str, str] | None]]) -> dict[str, Any]:
    """What soft rejection `r` (of step `k`) left out of its fusion: the nodes, the guard, its kind, the message as
    `explain` words it, the hints, and `gap`: whether its place is at a gap in rlxviz's ops (`standings`, the step's
    `place_standings`: gptj's tanh-GELU epilogue, drawn △), so the item says so as the drawing does."""
    message, hint = in_context(trace, k, r)
    st = standings.get((r.rule, r.anchor), (r, None))[1]
    return {"nodes": _ops(trace.steps[k].before, r.offending), "guard": r.guard, "kind": r.kind,
            "message": message, "hint": hint, "fix": r.fix, "dead": r.dead,
            "gap": st is not None and st[0] == OP_GAP_GROUP}


def _place(g: Graph, anchor: int, role: str | None = None, node: int | None = None) -> str:
    """A decision's place as the inspector labels it: its candidate's anchor, `%44 layer_norm` (as `g`, the graph
    the pass read, has it), followed by the part of the candidate its guard is about when that is another node than
    the anchor, `%72 FusedAttentionBlock (ln2 %74 FusedResidualLN)` (`role`, bound to `node`)."""
    where = _ops(g, [anchor])[0]
    if role is None or node is None or node == anchor:
        return where
    return f"{where} ({role} {_ops(g, [node])[0]})"


def node_decisions(trace: Trace, node_id: int) -> list[dict[str, Any]]:
    """Every decision of the run about node `node_id`, one per (step, rule, candidate) with one outcome each: the
    facts `explain` reads (a rule's `Match` with what it left out, its soft `Rejection`s, as `Outcome.soft`; a
    refused candidate's `Rejection`s; a leftover-scan finding filed under the step, `Unrecognized.as_rejection`: each
    step's `why.places.step_refusals`, as the chips and the matches table read them), never the same guard twice.

    A candidate whose guards are about several places (FusedTransformerLayer's: its two residual norms) binds the
    nodes of all: a refusal is told to the candidate's anchor, to the nodes its guard marks (`offending`, `subject`)
    and to the node bound to the role the guard is about (`Rejection.place_role`), never to a node bound only to
    another place's role (the second norm's gamma for a guard on the first norm).

    Returns:
        dicts with `pass, rule, role, outcome, guard, message, hint, kind, fix, dead, anchor` (`dead`: the
        refusal's dead extra readers, `Rejection.dead`), `place` (`_place`: the
        anchor, and the part of the candidate the guard is about: `%72 FusedAttentionBlock (ln2 %74
        FusedResidualLN)`), and for a fusion `made`
        (`FusedMatMulBiasAct %6`, "" for a rewrite that made several nodes), `fused` (the `%id op` it replaced) and
        `left_out` (one dict per soft rejection: `nodes, guard, kind, message, hint, fix, dead`). Outcomes:

        * `fused`: the node is one the match's product replaced itself (`made.credit`'s `replaced`, the product's
          `fused` list) or is that product; `guard` is `all guards passed`, or, when the fusion left something out,
          the first such guard (its message and hints too); a product's entry has `remade` (`%218
          FusedMatMulBiasAct as FusedMatMulBiasAct %231`: what the step re-made beside it, never in its list) and
          `kept` (what it copied and left for other readers);
        * `re-made`: the node of the match that a node made beside its product replaced (`by`: `FusedMatMulBiasAct
          %231`, gpt-neox's QKV projection %218 re-made by `qkv_columns`): the same fields as `fused`;
        * `kept`: copied into the product, still there for its other readers; `operand`: the node is bound to a
          role of a match (`role`) but stays, as an input of the product: the same fields as `fused`;
        * `bound`: the node is bound to a role of a candidate refused as a whole (each failing guard about its
          anchor) that no guard is about: `about` names the guards, said at the anchor (`_bound`);
        * `left out`: the node is what a fusion left out (a soft rejection's offending node, not part of the
          match): `guard` and `message` say why, `made` / `fused` what was fused without it;
        * `rejected (STAGE)`: a refused candidate's guard (one entry per failing guard and role), `stage` its
          `Rejection.stage` (`structure` or `guard`), what the inspector says of it.

        A refusal's entry (`rejected` or an unfused `left out`) has its place's `standing` too
        (`passes.why.places.place_status`: `rejected`, `left out`, or the group of a place that is no near-miss,
        `not expected here`, `not a candidate`, ...: the chips' ○) and `standing_why` (`standing.standing`'s why, ''
        for a near-miss), so the inspector calls no place "rejected" that the chips, the table and `explain` excuse;
        `follower` (`_follower`, else None): a further failing guard of a place at a gap in rlxviz's ops that is no
        gap itself, worded as the drawing's note, its `standing_why` "" (never the gap's reason).
    """
    out: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()

    def add(d: dict[str, Any]) -> None:
        key = (d["pass"], d["rule"], d["role"], d["guard"], d["outcome"], d["anchor"])
        if key not in seen:
            seen.add(key)
            out.append(d)

    beside, versions = made_in_run(trace), all_versions(trace)
    for k, s in enumerate(trace.steps):
        standings: dict[tuple[str, int], tuple[Rejection, tuple[str, str] | None]] | None = None
        marks: tuple[dict[tuple[str, int], GapNames], Followers] | None = None  # the step's gap places, once
        held = held_places(trace, s)  # a place the model's own term holds: that term's one entry, at the anchor
        refusals = [x for r in step_refusals(trace, k) if (x := _held(r, held)) is not None]  # as the chips read
        soft: dict[tuple[str, int], list[Rejection]] = {}
        for r in refusals:
            if r.soft:
                soft.setdefault((r.rule, r.anchor), []).append(r)
        told: set[tuple[str, int]] = set()
        for m in s.matches:
            left = soft.get((m.rule, m.anchor), [])
            told.add((m.rule, m.anchor))
            role = next((r for r, i in m.bindings.items() if i == node_id), None)
            mine = m.anchor == node_id or role is not None or m.fused == node_id
            if not mine and not any(node_id in r.offending for r in left):
                continue  # nothing about this node (the words below are made only for its own decisions)
            made = s.after.get(m.fused) if m.fused is not None else None
            # what the product replaced itself, what the step re-made beside it, what it copied and kept
            # (`made.credit`: gpt-neox's attention %237 never "fused" the QKV projection %218 re-made as %231)
            cr = credit(made, s.after, beside, versions) if made is not None else None
            if left and standings is None:
                standings = place_standings(trace, k)
            what = {"pass": s.pass_name, "rule": m.rule, "anchor": m.anchor, "place": _place(s.before, m.anchor),
                    "made": f"{made.op.value} %{made.id}" if made is not None else "",
                    "fused": _ops(s.before, cr.replaced) if cr is not None else [],
                    "remade": _remade(s.before, s.after, cr.remade) if cr is not None else [],
                    "kept": _ops(s.before, cr.kept) if cr is not None else [],
                    "left_out": [_left(trace, k, r, standings or {}) for r in left]}
            if mine:
                first = what["left_out"][0] if left else None
                outcome, by = _outcome(node_id, m.fused, cr, s.after)
                add({**what, "role": "fused node" if m.fused == node_id else (role_label(m.rule, role) if role
                                                                              else "anchor"),
                     "outcome": outcome, "by": by,
                     "guard": first["guard"] if first else "all guards passed",
                     **({k2: first[k2] for k2 in ("message", "hint", "kind", "fix", "dead")} if first else
                        {"message": "", "hint": "", "kind": "", "fix": "", "dead": ()})})
                continue
            for r, d in zip(left, what["left_out"], strict=True):
                if node_id in r.offending:  # the node the fusion did not take
                    add({**what, "role": "left out", "outcome": "left out", "guard": r.guard,
                         "message": d["message"], "hint": d["hint"], "kind": r.kind, "fix": r.fix, "dead": r.dead,
                         "gap": d["gap"], "left_out": [d]})
        bound: dict[tuple[str, int], list[Rejection]] = {}  # refused places binding the node, their refusals
        said: set[tuple[str, int]] = set()  # refused places that told the node a guard
        for r in refusals:
            if r.soft and (r.rule, r.anchor) in told:
                continue  # said with its fusion, above
            if node_id in r.bindings.values() and not r.soft:  # the candidate refused as a whole: at its anchor
                bound.setdefault((r.rule, r.anchor), []).append(r)
            # a candidate of several places (a layer's two residual norms, anchored at its attention) binds the
            # nodes of all; a failing guard is about one (`Rejection.place_role`): a node bound to another role is
            # not told of it, unless it is the candidate's anchor or what the guard marks
            place = r.place_role
            role = next((k2 for k2, i in r.bindings.items() if i == node_id and place in (None, k2)), None)
            if r.anchor == node_id or role or node_id in r.offending or node_id == r.subject:
                message, hint = in_context(trace, k, r)  # what explain and the Why tab say of a "run P first"
                if standings is None:  # the place's standing, as the chips, the table and explain read it
                    standings = place_standings(trace, k)
                head, st = standings[(r.rule, r.anchor)]
                if marks is None and st is not None and st[0] == OP_GAP_GROUP:
                    marks = _gap_marks(trace, s, standings)
                note = _follower(marks, r) if marks is not None else None
                add({"pass": s.pass_name, "rule": r.rule, "standing": place_status(head, st),
                     "standing_why": _own_why(trace, r, head, st) if note is None else "",
                     "follower": note,
                     "gap_workaround": gap_workaround(trace, head, st) and note is None,
                     "role": _role(s.before, r, node_id, role, RunFacts.of(trace).layers),
                     "outcome": "left out" if r.soft else f"rejected ({r.stage})", "stage": r.stage, "guard": r.guard,
                     "message": message, "hint": hint, "kind": r.kind, "fix": r.fix, "dead": r.dead,
                     "anchor": r.anchor,
                     "place": _place(s.before, r.anchor, place, r.bindings.get(place or "", r.anchor)),
                     "made": "", "fused": [], "left_out": []})
                said.add((r.rule, r.anchor))
        for (rule, anchor), refusals in bound.items():
            # bound only to roles its guards are not about, each guard about the candidate as a whole (the
            # anchor): the role the drawing gives it in the candidate's cluster. A candidate of several places
            # (a layer's two residual norms) tells a node bound to neither place's role nothing (issue 39)
            whole = all(r.bindings.get(r.place_role or "", r.anchor) == r.anchor for r in refusals)
            if (rule, anchor) not in said and whole:
                standings = standings if standings is not None else place_standings(trace, k)
                add(_bound(s, node_id, refusals, place_status(*standings[(rule, anchor)])))
    return out


def _held(r: Rejection, held: Mapping[tuple[str, int], Held]) -> Rejection | None:
    """`r` as the inspector tells it where its place is held by the model's own term (`held`: `overlay.held_places`,
    t5's cross-attention): its gap's refusal not at all, its term's at the anchor alone (never the Q norm the guard is
    about, `subject`), as the drawing marks it (`overlay.worded`); `r` itself elsewhere."""
    h = held.get((r.rule, r.anchor))
    term = h.term.guard if h is not None and h.term is not None else None
    if h is None or r.guard not in (term, h.guard):
        return r
    return replace(r, subject=None) if r.guard == term else None


def _bound(s: PassStep, node_id: int, refusals: Sequence[Rejection], standing: str) -> dict[str, Any]:
    """The entry of node `node_id` bound to a role of a candidate of step `s` refused as a whole, whose failing
    guards (`refusals`, each about its anchor: `Rejection.place_role`) are told to the anchor (`node_decisions`):
    gpt-neox's FusedMatMulBiasAct %231, `qkv` of `fuse_attention_block.qkv_attention_out` at attention %237, drawn
    with that role in the candidate's cluster. Outcome `bound`, no guard of its own; `about`: the failing guards
    (`rope_full_rotary`, `attn_single_user`); `standing` the place's (`places.place_status`)."""
    r = refusals[0]
    role = next(k for k, i in r.bindings.items() if i == node_id)
    return {"pass": s.pass_name, "rule": r.rule, "anchor": r.anchor, "role": role_label(r.rule, role),
            "outcome": "bound", "standing": standing, "guard": "",
            "about": list(dict.fromkeys(x.guard for x in refusals)),
            "message": "", "hint": "", "kind": "", "fix": "", "dead": (), "place": _place(s.before, r.anchor),
            "made": "", "fused": [], "left_out": []}


def _remade(before: Graph, after: Graph, remade: Mapping[int, int]) -> list[str]:
    """`%218 FusedMatMulBiasAct as FusedMatMulBiasAct %231` for each node a match's step re-made beside its product
    (`made.Credit.remade`), the ids it re-makes together: `%71 matmul, %75 matmul as matmul %191` (llama's packed
    gate/up projection)."""
    by: dict[int, list[int]] = {}
    for old, new in remade.items():
        by.setdefault(new, []).append(old)
    return [f"{', '.join(_ops(before, olds))} as {after[new].op.value} %{new}" for new, olds in by.items()]


def _outcome(node_id: int, product: int | None, cr: Credit | None, after: Graph) -> tuple[str, str]:
    """The outcome of a node a match anchored on or bound (`node_decisions`), and the node that holds it now for
    `re-made`: `fused` (the product, or among what it replaced itself: `cr.replaced`), `re-made` (a node the step
    made beside the product replaced it: `cr.remade`, `FusedMatMulBiasAct %231`), `kept` (copied into the product,
    still there for its other readers: `cr.kept`), else `operand` (bound, an input of the product). A rewrite
    that made no product (`cr` None): `fused` when the node is gone from its version `after`."""
    if cr is None:
        return ("operand" if node_id in after else "fused"), ""
    if node_id == product or node_id in cr.replaced:
        return "fused", ""
    if node_id in cr.remade:
        new = cr.remade[node_id]
        return "re-made", f"{after[new].op.value} %{new}"
    return ("kept" if node_id in cr.kept else "operand"), ""


def _gap_marks(trace: Trace, s: PassStep, standings: Mapping[tuple[str, int], tuple[Rejection, tuple[str, str] | None]]
               ) -> tuple[dict[tuple[str, int], GapNames], Followers]:
    """The gaps in rlxviz's ops of each place of step `s` and the further failing guards there that are no gap
    themselves, read as the drawing reads them (`viz.overlay.gap_names`, `viz.overlay.gap_followers`: both
    `passes.why.standing`'s one reading), from the step's `standings` (`places.place_standings`)."""
    groups = {pl: st[0] for pl, (_, st) in standings.items() if st is not None}
    return gap_names(trace, s, groups), gap_followers(trace, s, groups)


def _follower(marks: tuple[dict[tuple[str, int], GapNames], Followers], r: Rejection) -> dict[str, str] | None:
    """What the inspector says of refusal `r` when it is a further failing guard of a place at a gap in rlxviz's ops
    that is no gap itself (`marks`: `_gap_marks` of its step), as the drawing's note says it (`viz.overlay.
    follower_note`): `{"mark": "beside the gap rope_full_rotary:", "said": "rope_halves (not recognized) also fails,
    no gap itself", "caveat": ""}` (gptj's attention), or `fix of rope_full_rotary alone is not enough:` / `qkv_split
    (not recognized) fails next` with the text's caveat; None for a refusal that is a gap, or at no gap place."""
    names, followers = marks
    caveat = followers.get((r.rule, r.anchor, r.guard))
    if caveat is None:
        return None
    mark, said = follower_note(names.get((r.rule, r.anchor), ()), r.guard, r.kind, caveat)
    return {"mark": mark, "said": said, "caveat": caveat}


def _own_why(trace: Trace, r: Rejection, head: Rejection, st: tuple[str, str] | None) -> str:
    """The *Why* of refusal `r` at a place of headline `head` whose standing is `st` (`places.place_standings`): the
    place's why (`standing.standing` of its headline), but for a further guard at a gap in rlxviz's ops that is a
    gap of its own (DeepNorm's `ln2_residual_scaled` beside `ln1_residual_scaled`) its own gap's why, so no refusal
    reads another guard's gap reason; "" for a near-miss."""
    if st is None:
        return ""
    if st[0] == OP_GAP_GROUP and r is not head and r.guard != head.guard:
        own = refusal_standing(trace, r)
        if own is not None and own[0] == OP_GAP_GROUP:
            return own[1]
    return st[1]


def _role(g: Graph, r: Rejection, node_id: int, role: str | None, keys: Sequence[int] = ()) -> str:
    """The role of node `node_id` of `g` in refusal `r`: its bound role's label, else `anchor`, else `offending`; with
    whose place it is where the node lies in another layer than the place (`trace.whose_place`: `the bias add in
    layer 0` on a bias add a graph optimizer named after layer 1's norm, whose refusal is filed in its matmul's layer
    0 by `trace.REFUSAL_LAYER_RULE`), as its drawn mark says. `keys`: the model's layer keys (`RunFacts.layers`),
    so that layer is named as every view names it (`encoder layer 0` in an encoder-decoder model, `trace.own_key`)."""
    layer = own_key(keys, r.layer)
    if not role and r.anchor != node_id:
        return "offending" + whose_place(layer, g[node_id].path if node_id in g else "")
    return (role_label(r.rule, role) if role else "anchor") + whose_place(layer, g[node_id].path if node_id in g
                                                                          else "")


def _verdict(trace: Trace, layer: int | None, run: RunVerdict | None = None) -> dict[str, Any] | None:
    """The run's verdict on the node's layer (`run`, else `passes.why.RunVerdict.of(trace)`; the app gives its one
    checked verdict, `AppState.verdict`, so the Fix is the one `explain` and the Why tab print):
    `layer, fused, rule, guard, fix, hint, legal_only, status` (rule/guard/fix/hint empty when it fused or nothing
    rejected; `status` the verdict's words, `LayerVerdict.status`),
    or None outside a layer of the model; `blocker`: what a fusion that happened left that blocks the layer
    (`LayerVerdict.blocker`, `explain`'s "NOT fused: ..." words), else ""; `label` the layer's label
    (`passes.trace.layer_label`: `decoder layer 0`); `gaps` the gaps in rlxviz's ops its refusals ran into
    (`LayerVerdict.op_gaps`, `explain`'s "rlxviz's ops lack:" lines), the first of them the one the Why tab's drawing
    shows `△` for a layer held back only by them (`passes.why.verdict.first_gap`)."""
    run = run if run is not None else RunVerdict.of(trace)
    v = next((v for v in run.layers if layer is not None and v.layer == layer), None)
    if v is None:
        return None
    f = v.first
    return {"layer": layer, "fused": v.fused, "rule": f.rule if f else "", "guard": f.guard if f else "",
            "fix": f.fix if f else "", "hint": f.hint if f else "", "legal_only": v.legal_only, "status": v.status,
            "blocker": v.blocker, "label": layer_label(layer), "gaps": v.op_gaps}


__all__ = ["LEFT_OUT", "NOT_NEAR_MISS", "OPERAND", "OP_GAP", "PASSED", "REJECTED", "WEIGHTS_SHOWN", "_why_markdown",
           "counterpart_line", "counterparts", "decision_markdown", "decision_rows", "decisions_markdown", "made_once",
           "node_decisions", "node_report", "node_weights", "report_markdown", "weight_names", "weights_left"]
