"""The words of a box in the layer-collapsed view (`layers.layers_to_dot`): its label, tooltip and one-line status.

A box says its layer's final verdict when the version drawn holds the layer as the final graph does; else `final:
<word>`, then `at this version:` what the graph drawn holds (`LayerGroup.state`: what the passes so far made there),
then, on its own line, what the pass of the pane found there (`LayerGroup.found_by`: `fuse_attention_block: △ 2 gaps
in rlxviz's ops: ...`), named by that pass, so the before and after panes of one pass say the same of one graph and
neither calls the pass's findings the graph's state.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ..ir import Node
from ..ir.ops import REWRITTEN_AS
from ..passes.trace import layer_label
from .dot import _e, _html, _small, _wrap
from .overlay import group_words
from .styles import KIND_LIMITED_INK, NOT_NEAR_MISS, NOT_NEAR_MISS_INK, OP_GAP, OP_GAP_INK, REJECT, human_count

if TYPE_CHECKING:
    from .layers import LayerGroup, Verdict

WRAP = 44
"""The most characters of a box's `at this version:` and `_found` lines: longer words wrap (esm.qdyn's two gap names
on one line drew its boxes as wide as the pane, newcomer run 18), so a box stays about its `width` (2.6 in)."""

SAME_AS = ("the same ops, shapes and wiring, as many weights, and the same final verdict: its words, the ops it made "
           "and the places each pattern refused (how many, and why)")
"""What a "same as layer K" box's tooltip says two layers share: what `layers.layer_signature` compares, no more."""


SHARED = ("read only by values several layers read (the layers share them: T5's relative position bias, a mask), "
          "counted in this box at every version, whichever op read them first")
"""What a box's tooltip says of the weights it counts that the layers share (`LayerGroup.shared_weights`)."""


def box_label(g: LayerGroup) -> str:
    ops = Counter(n.op.value for n in g.nodes)
    shared = f" ({human_count(g.shared_weights)} shared)" if g.shared_weights else ""
    lines = [f"<B>{_e(g.title)}</B>",
             _small(f"{len(g.nodes)} op(s), {human_count(g.weights)} weights{shared}", "#333333", 9)]
    summary = ", ".join(f"{k}×{v}" if v > 1 else k for k, v in ops.most_common(4))
    if len(ops) > 4:
        summary += ", …"
    lines.append(_small(summary, "#333333", 8))
    if g.verdict is not None and g.verdict.settled:
        lines += _verdict_lines(g.verdict, g)
    elif g.verdict is not None:  # an earlier version: the final verdict first, then what has happened so far
        lines += _verdict_lines(g.verdict)
        lines += [_small(x, "#555555", 9) for x in _wrap(f"at this version: {_so_far(g)}", WRAP)]
    elif g.status == "fused":
        f = g.fused[0]
        by = _small(f"-> {f.op.value} by {f.pass_name}" if len(g.fused) == 1 else f"-> {_counted(g.fused)}", "#1b5e20")
        lines.append(f'<FONT COLOR="#1b5e20"><B>fused</B></FONT> {by}')
    elif g.status == "rejected":
        guards = list(dict.fromkeys(r.guard for r in sorted(g.rejections, key=lambda r: r.stage != "guard")))
        lines.append(f'<FONT COLOR="{REJECT}"><B>rejected: {_e(", ".join(guards[:2]))}</B></FONT>')
        if g.fused:
            lines.append(_small(f"{len(g.fused)} of {len(g.nodes)} ops fused", "#555555"))
    elif g.status in (NOT_NEAR_MISS, OP_GAP):
        ink = OP_GAP_INK if g.status == OP_GAP else NOT_NEAR_MISS_INK
        if g.found_as != g.status or g.layer is not None:  # else the `_found` line below says it, named by its pass
            lines.append(f'<FONT COLOR="{ink}"><B>{_e(_standing_words(g, 2))}</B></FONT>')
        if g.fused:
            lines.append(_small(f"{len(g.fused)} of {len(g.nodes)} ops fused", "#555555"))
    elif g.status == "partly fused":
        c = Counter(n.op.value for n in g.fused)
        lines.append('<FONT COLOR="#8d6e00"><B>partly fused</B></FONT>')
        lines.append(_small(", ".join(f"{k}×{v}" for k, v in c.items()), "#8d6e00"))
    elif g.status == "unfused":
        lines.append(_small("unfused", "#555555", 9))
    # what the pane's pass found there, named by it (the same in its before and after): apart from a verdict, settled
    # or not, and from the status of a box outside the layers; a layer box with neither says it as its status
    if (g.verdict is not None or g.layer is None) and (found := _found(g)):
        lines += [_small(x, FOUND_INK.get(g.found_as, REJECT), 9) for x in _wrap(found, WRAP)]
    if g.same_as is not None:
        lines.append(_small(f"same as {layer_label(g.same_as)}", "#1565c0", 9))
    return _html(lines)


def _verdict_lines(v: Verdict, g: LayerGroup | None = None) -> list[str]:
    """The status lines of a box from the session's verdict `v`: its words (`Verdict.word`), then the guard of a
    layer not fused. For a box drawn at the version the verdict settled at (`g`, its group): what fused it, beside
    the words, and how many of its ops fused under a refusal. For a box drawn at an earlier version (no `g`): the
    words as `final: ...` (e.g. `final: fused as far as legal`), alone: the ops that fused are not in that version.
    A layer held back by rlxviz's ops (`Verdict.at_gap`: `fused as far as rlxviz's ops go`, `held back by ...`) is
    worded in the gap's ink (`OP_GAP_INK`, the chips' `△`) at every version, never in the fused green. A layer fused
    only as far as its kind expects any fusion (`Verdict.limit`) says `fused as expected` and, on lines of its own,
    the limit (`quantized activations: no float fusion across QDQ steps expected`), in `KIND_LIMITED_INK`."""
    word = _e(v.head) if g is not None else f"final: {_e(v.head)}"
    if v.limit:
        beside = f" {_small(_counted(g.fused) or v.none_made, KIND_LIMITED_INK)}" if g is not None else ""
        limit = [_small(x, KIND_LIMITED_INK, 9) for x in _wrap(v.limit, WRAP)]
        return [f'<FONT COLOR="{KIND_LIMITED_INK}"><B>{word}</B></FONT>{beside}', *limit, *_rewritten(g)]
    if v.held_back or v.at_gap:
        beside = f" {_small(_counted(g.fused) or v.none_made, OP_GAP_INK)}" if g is not None else ""
        return [f'<FONT COLOR="{OP_GAP_INK}"><B>{word}</B></FONT>{beside}', *_rewritten(g)]
    if v.fused:
        beside = f" {_small(_counted(g.fused) or v.none_made, '#1b5e20')}" if g is not None else ""
        return [f'<FONT COLOR="#1b5e20"><B>{word}</B></FONT>{beside}', *_rewritten(g)]
    lines = [f'<FONT COLOR="{REJECT}"><B>{word}</B></FONT>']
    if v.guard:
        lines.append(f'<FONT COLOR="{REJECT}">rejected: {_e(v.guard)}</FONT>')
    if g is not None and g.fused:
        lines.append(_small(f"{len(g.fused)} of {len(g.nodes)} ops fused", "#555555"))
    return lines + _rewritten(g)


def _rewritten(g: LayerGroup | None) -> list[str]:
    """The line(s) of a settled box (`g`; None: an earlier version's, which says it in `at this version:`) naming the
    plain ops its layer's matches made (`LayerGroup.rewritten`), as the CLI's `rewritten as:` line does: bart-full's
    decoder layer 0 said `FusedAttentionBlock, FusedResidualLN×3, FusedMatMulBiasAct×4` and dropped `rewritten as:
    attention %312` at the final version while earlier versions' boxes said it (newcomer run 22)."""
    if g is None or not g.rewritten:
        return []
    return [_small(x, "#555555", 9) for x in _wrap(f"{REWRITTEN_AS} {_counted(g.rewritten)}", WRAP)]


def _counted(nodes: list[Node]) -> str:
    """`FusedMatMulBiasAct×4, attention`: the ops of `nodes`, each with its count past one."""
    return ", ".join(f"{k}×{v}" if v > 1 else k for k, v in Counter(n.op.value for n in nodes).items())


def _made(g: LayerGroup) -> str:
    """What the matches so far made in the layer: its fused ops, then `rewritten as` and the plain ops (`rewritten`),
    e.g. `FusedMatMulBiasAct×4; rewritten as attention`; "" when they made nothing there."""
    parts = [_counted(g.fused)] if g.fused else []
    if g.rewritten:
        parts.append(f"{REWRITTEN_AS} {_counted(g.rewritten)}")
    return "; ".join(parts)


def _so_far(g: LayerGroup) -> str:
    """What the graph drawn holds in the layer, in words (`LayerGroup.state`: what the passes up to it did there),
    counting what their matches made: fused ops and the plain ops a match made (`partly fused (FusedMatMulBiasAct×4;
    rewritten as attention)`; `no fused op; rewritten as attention` of a layer whose attention alone was packed).
    Never what the pane's pass found there (`_found`): the before and after panes of a pass that changed nothing
    say the same of the same graph (esm.qdyn's `fuse_attention_block`, newcomer run 18)."""
    made = _made(g)
    if g.state == "fused":
        return f"fused -> {_counted(g.fused)}"
    if g.state == "partly fused":
        return f"partly fused ({made})"
    if g.state == "rewritten":
        return f"no fused op; {made}"
    return g.state or "unfused"


FOUND_INK = {OP_GAP: OP_GAP_INK, NOT_NEAR_MISS: NOT_NEAR_MISS_INK}
"""The ink of a box's `_found` line by what it found (`LayerGroup.found_as`; else the rejection's red): the chips'
marks' inks."""


def _found(g: LayerGroup) -> str:
    """What the pass of the pane found in the box (`LayerGroup.found_by`, `found_as`), named by it:
    `fuse_attention_block: △ 2 gaps in rlxviz's ops: ...`, `fuse_transformer_layer: rejected: h1_user_count`; "" when
    it refused nothing there. The before pane's pass runs on the graph drawn; the after pane's made it: one pass, so
    both panes say it, on a box whose verdict is settled as on one whose is not, and on a box outside the layers
    (minilm's `embeddings`, `fuse_residual_ln: ○ not near-miss: residual_same_shape`)."""
    if not g.found_by:
        return ""
    if g.found_as == "rejected":
        guards = list(dict.fromkeys(r.guard for r in sorted(g.rejections, key=lambda r: r.stage != "guard")))
        return f"{g.found_by}: rejected: {', '.join(guards[:2])}"
    return f"{g.found_by}: {_standing_words(g, status=g.found_as)}"


def _standing_words(g: LayerGroup, most: int | None = None, status: str = "") -> str:
    """`STATUS: GUARDS` of a box whose refusals are no near-miss (`most`: at most that many guards; `status`: the
    standing said, what the pane's pass found, `LayerGroup.found_as`; else the box's status), but a box at several
    gaps in rlxviz's ops, or one met by several guards, names each gap (`LayerGroup.gaps`, `group_words`), `△ 2 gaps
    in rlxviz's ops: its integer-matmul Q/K/V projections (integer_qkv), default_scale`, as the gap's `△` cluster
    label does (`Overlay.standing_words`), never its one failing guard alone; a box at one gap names that gap alone,
    never a further guard that is no gap (t5's decoder block 1 said `△ gap in rlxviz's ops: default_scale,
    self_attention`, where `explain` calls `self_attention` the model's own term that fails next, newcomer run 22)."""
    status = status or g.status
    if status == OP_GAP and (words := group_words(OP_GAP, g.gaps)) != OP_GAP:
        return words
    names = list(dict.fromkeys(n for _, n in g.gaps)) if status == OP_GAP else []
    guards = names or list(dict.fromkeys(r.guard for r in g.rejections))
    return f"{status}: {', '.join(guards[:most])}"


def status_text(g: LayerGroup) -> str:
    """The box's status in one line (tooltip, open layer's frame): the verdict's word when settled; at an earlier
    version `final: <word>; at this version: <what the graph holds>`, then what the pane's pass found there
    (`; <pass>: <words>`, `_found`); else the status at this version."""
    if g.verdict is not None and not g.verdict.settled:
        found = _found(g)
        return f"final: {g.verdict.word}; at this version: {_so_far(g)}" + (f"; {found}" if found else "")
    if g.layer is None and (found := _found(g)):
        return "; ".join(x for x in (g.status, found) if x)
    return g.status


def box_tooltip(g: LayerGroup) -> str:
    parts = [f"{g.title}: {status_text(g) or 'no layer'}", f"nodes: {' '.join(f'%{n.id}' for n in g.nodes[:60])}"]
    if g.same_as is not None:
        parts.append(f"same as {layer_label(g.same_as)}: {SAME_AS}")
    if g.shared_weights:
        parts.append(f"weights: {human_count(g.weights)} values, {human_count(g.shared_weights)} of them {SHARED}")
    if g.verdict is not None and g.verdict.message:
        parts.append(f"why: {g.verdict.message}")
    for r in g.rejections:
        said = {NOT_NEAR_MISS: "NOT A NEAR-MISS", OP_GAP: "GAP IN RLXVIZ'S OPS"}.get(g.found_as or g.status, "REJECTED")
        parts.append(f"{said} {r.rule} [{r.stage}] guard {r.guard}: {r.message}")
        if r.hint:
            parts.append(f"hint: {r.hint}")
    return "\n".join(parts)


__all__ = ["SAME_AS", "SHARED", "box_label", "box_tooltip", "status_text"]
