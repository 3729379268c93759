"""The node inspector's text: the Markdown of a `explain.node_report` (`report_markdown`), one item per decision of
`explain.node_decisions` (`decision_markdown`), every piece that comes from the model escaped (`text.md_escape`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..ir.printer import shown_line, shown_value
from ..passes.refusal_kinds import kind_words
from ..passes.trace import layer_label
from ..passes.why.places import LEFT_OUT_STATUS
from ..passes.why.places import REJECTED as NEAR_MISS
from ..passes.why.text import left_out_heading
from ..passes.why.verdict import OP_GAP_GROUP
from ..viz.styles import NOT_NEAR_MISS_INK, OP_GAP_INK
from .onnxorigin import onnx_markdown
from .text import html_text, md_code, md_escape, md_pre

WEIGHTS_SHOWN = 4
"""Most weight tensors the node panel summarizes for one node (its own, or its first param operands)."""



def weights_left(rep: Mapping[str, Any]) -> str:
    """The line under a node's weight summaries when it holds more than `WEIGHTS_SHOWN` (a FusedTransformerLayer
    holds 12: the panel listed 4 under "weights" with no word of the other 8): `4 of 12 weights summarized (at most
    4 per node); the others: ...`, each name quoted; "" when every one is shown."""
    held, shown = rep.get("weights_held", []), [name for name, _ in rep.get("weights", [])]
    rest = [name for name in held if name not in shown]
    if not rest:
        return ""
    return (f"**weights**: {len(shown)} of {len(held)} summarized (at most {WEIGHTS_SHOWN} per node); the others, "
            "among the operands above: " + ", ".join(md_code(name) for name in rest))



def report_markdown(rep: dict[str, Any]) -> str:
    """The inspector's text for a `node_report`. Every piece that comes from the model (path, attribute values,
    operand and user lines, guard messages, the IR line, an `onnx_op`'s op type) goes through `text.md_escape` /
    `md_code` / `md_pre`."""
    lines = [f"#### %{rep['id']} {md_code(rep['op'])} : {md_escape(rep['dtype'])}{md_escape(str(rep['shape']))}"]
    if rep["path"]:  # where it sits (`placement.sits`): a layer, or its place outside the layers (`final norm`)
        at = f" ({layer_label(rep['layer'])})" if rep["layer"] is not None else \
            md_escape(f" (outside the layers: {rep['place']})") if rep.get("place") else ""
        lines.append(f"**provenance** {md_code(rep['path'])}{at}")
    if onnx := onnx_markdown(rep):  # the names Netron and Model Explorer show, so the node can be found there
        lines.append(onnx)
    if rep.get("host"):  # an `onnx_op`: outside MLX, as `explain`'s "ran on the host" line names it
        lines.append(f"**{md_escape(rep['host'])}**")
    # what it replaced itself (`passes.made.replaced`; a node made beside a product only the part it re-makes)
    replacing = ", replacing " + ", ".join(f"%{i}" + md_escape(f" ({w})" if (w := rep.get("was", {}).get(i)) else "")
                                           for i in rep["absorbed"]) if rep["absorbed"] else ""
    if rep.get("made"):
        lines.append(f"**created by** {md_code(rep['pass_name'])}: {md_escape(rep['made'])}{replacing}")
    elif rep["pass_name"]:
        lines.append(f"**created by** {md_code(rep['pass_name'])}{replacing}")
    v = rep.get("verdict")
    if v is not None:  # the layer's verdict, as explain and the Why tab state it
        label = md_escape(v.get("label") or layer_label(v["layer"]))  # `decoder layer 0`, as the Why tab says it
        if v["fused"]:
            status = v.get("status", "fused")  # the verdict's own words (`LayerVerdict.status`)
            lacks = "".join(f"; rlxviz's ops lack: {md_escape(g)}" for g in v.get("gaps") or [])  # as `explain` says
            lines.append(f"**{label}: {'fused as expected' if status == 'fused' else md_escape(status)}**{lacks}")
        elif v["rule"]:
            fix = f" *Fix:* {md_escape(v['hint'])}" if v["hint"] else ""
            comp = f" *Compiler fix:* {md_escape(v['fix'])}" if v["fix"] else ""
            blocker = f": {md_escape(v['blocker'])}" if v.get("blocker") else ""
            lines.append(f"**{label}: NOT fused**{blocker}, first rejection {md_code(v['rule'])}: "
                         f"**{md_escape(v['guard'])}**{fix}{comp}")
        else:
            lines.append(f"**{label}: NOT fused**")
    if rep["attrs"]:  # each value as the IR text and `rlxviz explain` print it (`none`, `"gelu"`, `true`), an
        # `onnx_op`'s serialized node by its size (`shown_value`), never the whole base64
        lines.append("**attributes** " + ", ".join(md_code(f"{k}={shown_value(rep['op'], k, v)}")
                                                   for k, v in rep["attrs"].items()))
    if rep["is_output"]:
        lines.append("**graph output**")
    if rep["operands"]:
        lines.append("**operands**\n" + "\n".join(f"- {md_escape(x)}" for x in rep["operands"]))
    for name, stats in rep.get("weights", []):
        lines.append(f"**weights** {md_code(name)}\n" + "\n".join(f"- {md_escape(x)}" for x in stats))
    if left := weights_left(rep):
        lines.append(left)
    lines.append("**users**\n" + ("\n".join(f"- {md_escape(x)}" for x in rep["users"]) if rep["users"] else "- none"))
    if rep["decisions"]:
        lines.append("**guards evaluated on this node**")
        lines += decisions_markdown(rep["decisions"])
    else:
        lines.append("*No pattern was anchored on or bound to this node.*")
    lines.append(md_pre(shown_line(rep["ir"], rep["op"], rep["attrs"])))  # an onnx_op's node by its size
    if note := record_note(rep):
        lines.append(note)
    return "\n\n".join(lines)


def record_note(rep: Mapping[str, Any]) -> str:
    """The line under the IR line when its `<-` list (the rewrite's record, `Node.absorbed`, as `rlxviz ir` prints
    and parses it) names nodes the node did not replace itself (`passes.made.replaced`, its "replacing" list and
    the other pane's marks): gptj's attention %233 records the ropes %199, %196 and the Q/K/V projection %214 that
    `qkv_columns` re-made beside it. "" when the two agree."""
    extra = [i for i in rep.get("record", ()) if i not in rep["absorbed"]]
    if not extra:
        return ""
    which = ("replaced none of them itself" if not rep["absorbed"] else "did not replace "
             + ", ".join(f"%{i}" for i in extra) + " itself (re-made by another node of its match, or kept)")
    return f"*The IR line's {md_code('<-')} is its match's whole record, as {md_code('rlxviz ir')} prints it; " \
           f"this node {which}.*"


PASSED, LEFT_OUT, REJECTED = ("<b style='color:#2e7d32'>fused</b>", "<b style='color:#e65100'>left out</b>",
                              "<b style='color:#c62828'>rejected</b>")
OPERAND = "<b style='color:#1565c0'>operand</b>"
REMADE, KEPT = "<b style='color:#2e7d32'>re-made</b>", "<b style='color:#1565c0'>kept</b>"
"""The inspector's outcome words (green, orange, red; blue: bound as an input of a fusion, not absorbed; green
`re-made`: replaced by a node the match made beside its product, `made.credit`; blue `kept`: copied into the product
and still there for its other readers)."""
NOT_NEAR_MISS = f"<b style='color:{NOT_NEAR_MISS_INK}'>○ {{standing}}</b>"
"""The inspector's word for a refused place that is no near-miss (grey, the chips' ○), `{standing}` its
`place_status` (`not expected here`, `not a candidate`, ...), as the matches table's kind says it."""
OP_GAP = f"<b style='color:{OP_GAP_INK}'>△ {{standing}}</b>"
"""The inspector's word for a refused place at a gap in rlxviz's ops (`OP_GAP_GROUP`: the chips' and the drawing's
△, a compiler fix, in the gap's ink), never the faded ○ of nothing to fix."""


def _why_markdown(guard: str, kind: str, message: str, hint: str, fix: str, dead: Sequence[int] = ()) -> str:
    """`guard **G** (kind): message *Fix:* hint *Compiler fix:* fix`, as `explain` words a refusal (its kind from
    `dead`, its dead extra readers: `refusal_kinds.kind_words`). The guard and its kind are names from the pass
    library (shown as they are); message, hint and fix quote the model: escaped."""
    what = f" ({kind_words(kind, dead)})" if kind else ""
    msg = f": {md_escape(message)}" if message else ""
    return (f"guard **{guard}**{what}{msg}" + (f" *Fix:* {md_escape(hint)}" if hint else "")
            + (f" *Compiler fix:* {md_escape(fix)}" if fix else ""))


def _why_of(d: Mapping[str, Any]) -> str:
    """`_why_markdown` of a decision dict (`node_decisions`, or one of its `left_out`)."""
    return _why_markdown(d["guard"], d.get("kind", ""), d["message"], d["hint"], d.get("fix", ""), d.get("dead", ()))


def _stage(d: Mapping[str, Any]) -> str:
    """What a refusal's item says in parentheses after its role: the refusal's stage (`d["stage"]`, `structure` or
    `guard`, as `node_decisions` hands it out beside its `rejected (STAGE)` outcome), the outcome itself for a soft
    refusal's (`left out`); "" for none."""
    return d["outcome"] if d["outcome"] == "left out" else d.get("stage", "")


def _left_word(x: Mapping[str, Any]) -> str:
    """`left out`, with the gap's △ word when what was left out is at a gap in rlxviz's ops (`_left`'s `gap`)."""
    return f"{LEFT_OUT} ({OP_GAP.format(standing=html_text(OP_GAP_GROUP))})" if x.get("gap") else LEFT_OUT


def decisions_markdown(decisions: list[dict[str, Any]]) -> list[str]:
    """The inspector's items for a node's `node_decisions`, one `decision_markdown` each. A node that belongs to
    several places (a norm's own fusion, and the layer candidate whose guard on that norm failed) has its items
    grouped by place, each group under its place's label (`*at %44 layer_norm*`, `*at %72 FusedAttentionBlock (ln2
    %74 FusedResidualLN)*`: the decision's `place`), in the order the places first come; a node of one place has its
    items as they come."""
    places = list(dict.fromkeys(d.get("place", "") for d in decisions))
    if len(places) < 2:
        return [decision_markdown(d) for d in decisions]
    out: list[str] = []
    for p in places:
        out.append(f"*at {md_escape(p)}*" if p else "*elsewhere*")
        out += [decision_markdown(d) for d in decisions if d.get("place", "") == p]
    return out


def decision_markdown(d: dict[str, Any]) -> str:
    """One list item of the inspector for a `node_decisions` entry: one outcome per (rule, role), what was fused
    into what, what was left out of it and why (`explain`'s "left out: GUARD (KIND): MESSAGE")."""
    rule, role = md_code(d["rule"]), md_escape(d["role"])
    product = (f"{md_escape(', '.join(d['fused']))} -> {md_code(d['made'])}" if d.get("made")
               else "rewritten")
    # what the step re-made beside the product and what the product copied but left for other readers: never in
    # its own list (`made.credit`), as every other view credits them (`why.facts.remade_words`)
    product += "".join(f"; {words}: {md_escape(', '.join(d[key]))}" for key, words in
                       (("remade", "re-made beside it"), ("kept", "copied into it, kept for other readers"))
                       if d.get(key))
    passed = ("all guards passed" if not d.get("left_out") else
              "; ".join(f"{_left_word(x)}: {md_escape(', '.join(x['nodes']) or 'a part of it')}, " + _why_of(x)
                        for x in d["left_out"]))
    of = md_code(d["made"]) if d.get("made") else f"{rule}'s rewrite"
    if d["outcome"] == "operand":  # bound to a role, not absorbed: an input of what the match made
        return f"- {OPERAND} *{role}* of {of} ({rule} matched; {passed})"
    if d["outcome"] == "re-made":  # replaced by a node made beside the product, not by the product
        return f"- {REMADE} by {rule} as *{role}*: into {md_code(d['by'])} beside {of} ({passed})"
    if d["outcome"] == "kept":  # copied into the product, still there for its other readers
        return f"- {KEPT} by {rule} as *{role}*: copied into {of}, still here for its other readers ({passed})"
    if d["outcome"] == "bound":  # bound to a role of a refused candidate whose guards are about other nodes
        return _bound_markdown(d, rule, role)
    if d["outcome"] == "fused":
        return f"- {PASSED} by {rule} as *{role}*: {product}; {passed}"
    why = _why_of(d)
    standing = d.get("standing", "")
    if d.get("follower"):  # beside a gap in rlxviz's ops, no gap itself: the drawing's note, never the gap's words
        return _follower_markdown(d, rule, role, why)
    if standing and standing not in (NEAR_MISS, LEFT_OUT_STATUS):  # no near-miss: the chips' ○ (△ a gap), not a failure
        stage = _stage(d)
        heading = left_out_heading(standing, 1, d.get("gap_workaround", False)).split(" ", 1)[1]  # the verdict's words
        reason = f" *Why:* {md_escape(d['standing_why'])}" if d.get("standing_why") else ""
        word = (OP_GAP if standing == OP_GAP_GROUP else NOT_NEAR_MISS).format(standing=html_text(standing))
        return (f"- {word} ({md_escape(heading)}): {rule} as *{role}*"
                + (f" ({md_escape(stage)})" if stage else "") + f": {why}{reason}")
    if d["outcome"] == "left out":
        made = f" ({product})" if d.get("made") else ""
        return f"- {_left_word(d)} of {rule}'s fusion{made}: {why}"
    stage = _stage(d)
    return f"- {REJECTED} {rule} as *{role}*" + (f" ({md_escape(stage)})" if stage else "") + f": {why}"


def _follower_markdown(d: Mapping[str, Any], rule: str, role: str, why: str) -> str:
    """The item of a further failing guard of a place at a gap in rlxviz's ops that is no gap itself (`d["follower"]`:
    `_follower`), in the gap's ink and as the drawing's note words it: `△ beside the gap rope_full_rotary: rope_halves
    (not recognized) also fails, no gap itself (not a near-miss)`, then the refusal with its own message and fixes;
    its *Why* is the text's caveat where that says more than the note (gpt-neox's `attn_single_user (illegal while
    the sdpa NaN guard ...) fails next`), never the gap's reason."""
    f = d["follower"]
    stage = _stage(d)
    word = f"<b style='color:{OP_GAP_INK}'>△ {html_text(f['mark'])}</b>"
    caveat = f["caveat"] if f["caveat"] and f["caveat"] != f"alone it is not enough: {f['said']}" else ""
    reason = f" *Why:* {md_escape(caveat)}" if caveat else ""
    return (f"- {word} {md_escape(f['said'])} (not a near-miss): {rule} as *{role}*"
            + (f" ({md_escape(stage)})" if stage else "") + f": {why}{reason}")


def _bound_markdown(d: Mapping[str, Any], rule: str, role: str) -> str:
    """The item of a node bound to a role of a candidate refused as a whole (the `bound` entry of `node_decisions`),
    in the place's standing word, as the drawing shows its role in the candidate's cluster: `△ gap in rlxviz's ops:
    bound as *QKV projection* of fuse_attention_block.qkv_attention_out's candidate at %237 attention, refused there
    by rope_full_rotary, attn_single_user (its guards are said at %237 attention)`."""
    standing = d.get("standing", "")
    word = (REJECTED if standing in ("", NEAR_MISS) else LEFT_OUT if standing == LEFT_OUT_STATUS else
            (OP_GAP if standing == OP_GAP_GROUP else NOT_NEAR_MISS).format(standing=html_text(standing)))
    about = ", ".join(f"**{guard}**" for guard in d.get("about", ()))
    place = md_escape(d["place"])
    return (f"- {word}: bound as *{role}* of {rule}'s candidate at {place}, refused there"
            + (f" by {about}" if about else "") + f" (its guards are said at {place})")
