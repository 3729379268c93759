"""Graph (+ overlay) -> Graphviz DOT source: a pure function, testable without a layout engine.

Ops are boxes labelled with the op, its key attributes, its output type and any folded weights; graph inputs are ovals
at the top (rank=source), graph outputs ovals at the bottom (rank=sink). Every drawn element carries a stable DOT `id`
that survives into the SVG, so a front end can map a click back to the IR: `n<id>` for nodes, `e<src>_<dst>` for
edges, `m<k>` / `r<k>` for match and rejection clusters, `out<k>` for graph outputs, `s<id>` for stubs of nodes
outside a focus view.

Example:
    >>> from rlxviz.models import load_model
    >>> dot = graph_to_dot(load_model("bert-tiny", 1, 8).graph)
    >>> 'id="n16"' in dot and "rank=source" in dot
    True
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

import graphviz

from ..ir import Graph, Node, Op, operand_roles
from ..ir.ops import FUSED
from ..ir.printer import shown_attrs
from ..ir.text import shown
from ..passes.made import holders, maker, replaced, where_now
from ..passes.placement import path_box
from ..passes.trace import Layer, Rejection, layer_keys, layer_label, layer_of, own_key, whose_place
from . import styles as st
from .heat import UNCOLOURED, readable_on, text_color
from .overlay import INPUT_ROLES, Overlay, follower_note, is_gap, marked_nodes
from .styles import fmt_attrs, fmt_shape, human_count, op_color, short_name, short_value, tint

MAX_NODES = 1500
"""Default limit on drawn nodes; past it `render_dot` raises `GraphTooLarge` instead of hanging the layout."""

NEAR_MISS_MARK, GAP_MARK, FADED_MARK = "✗", "△", "○"
"""A refused place's mark on the drawing, as the app's chips and README's legend read it (`Overlay.standings`): a
near-miss (red, counts against its layer), a gap in rlxviz's ops (a compiler fix), no near-miss (nothing to fix)."""
_MADE = "#1b5e20"
"""A fused node's note: the layer path it came from and its op."""

_FOLDABLE = (Op.PARAM, Op.CONST)
_MAX_FOLDED_LINES = 3


class GraphTooLarge(ValueError):
    """The drawing would have more nodes than the limit; the message says how to draw less."""


@dataclass(frozen=True)
class DotOptions:
    """How to draw.

    Attributes:
        show_params: draw params and consts as their own nodes instead of folding them into labels.
        edge_labels: label every edge with the producer's type (`f32[1,128,768]`).
        max_nodes: limit on drawn nodes (see `GraphTooLarge`).
        tooltips: attach a tooltip (full node description) to every node.
        font: font name for all text.
    """

    show_params: bool = False
    edge_labels: bool = False
    max_nodes: int = MAX_NODES
    tooltips: bool = True
    font: str = "Helvetica"


def _shown(text: object, keep_newlines: bool = False) -> str:
    """Model text with its control characters escaped (`ir.text.shown`): Graphviz refuses some, and a
    drawing must show a name's escape sequence, not act on it."""
    return shown(str(text), keep_newlines)


def _role_name(rule: str, role: str) -> str:
    """A bound node's tag: its role as the rule's messages name it (`passes.pipeline.role_label`: `ln1 (role h1)`)."""
    from ..passes.pipeline import role_label  # the registry reads every rule; the drawing needs it only for tags

    return role_label(rule, role)


def _tip(text: str) -> graphviz.quoting.NoHtml:
    """A DOT escString for plain text (backslashes kept literal, newlines as line breaks, controls escaped)."""
    return graphviz.nohtml(_shown(text, True).replace("\\", "\\\\").replace("\n", "\\n"))


def _e(text: object) -> str:
    return html.escape(_shown(text), quote=False)


def _small(text: str, color: str = "#444444", size: int = 8) -> str:
    return f'<FONT POINT-SIZE="{size}" COLOR="{color}">{_e(text)}</FONT>'


def _html(lines: Iterable[str]) -> str:
    return "<" + "<BR/>".join(lines) + ">"


def _op_summary(ids: Iterable[int], origin: Graph | None) -> str:
    """`4 matmul, 7 add, 2 layer_norm` for ids resolved in `origin` (else just a count)."""
    ids = list(ids)
    if origin is None or not any(i in origin for i in ids):
        return ""
    c = Counter(origin[i].op.value for i in ids if i in origin)
    return ", ".join(f"{k}×{v}" if v > 1 else k for k, v in c.most_common())


def _wrap(text: str, width: int = 42) -> list[str]:
    out, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*out, line] if line else out


def _into(path: str, op: str) -> str:
    """A match cluster's second line: the layer path it matched in and the op that replaced it (`encoder.layer.0 ->
    FusedAttentionBlock`); without a path (IR text without @paths), "becomes OP" (it read "? -> OP", like an error)."""
    return f"{path} -> {op}" if path else f"becomes {op}"


class _Drawer:
    """One rendering: collects per-node decorations from the overlay, then emits DOT."""

    def __init__(self, graph: Graph, overlay: Overlay, opts: DotOptions, include: set[int] | None,
                 placed: Mapping[int, Layer | str] | None = None) -> None:
        self.g, self.ov, self.opts = graph, overlay, opts
        self.placed = placed or {}
        self.ghosts = {n.id: n for n in overlay.removed if n.id not in graph}
        self.nodes: dict[int, Node] = {n.id: n for n in graph}
        self.nodes.update(self.ghosts)  # its layer keys (`own_key` of them names a stack: `decoder layer 0`)
        self._keys = layer_keys(x for n in self.nodes.values() if (x := layer_of(n.path)) is not None)
        self.folded = set() if opts.show_params else {i for i, n in self.nodes.items() if n.op in _FOLDABLE}
        drawn = [i for i in self.nodes if i not in self.folded]
        if include is not None:
            drawn = [i for i in drawn if i in include]
        self.drawn = set(drawn)
        self.order = drawn
        self.stubs: dict[int, Node] = {}
        if include is not None:
            for i in drawn:
                for j in self.nodes[i].inputs:
                    if j not in self.drawn and j not in self.folded:
                        self.stubs[j] = self.nodes[j]
                for u in graph.users(i) if i in graph else ():
                    if u.id not in self.drawn:
                        self.stubs[u.id] = u
        total = len(self.drawn) + len(self.stubs) + len(graph.outputs)
        if total > opts.max_nodes:
            raise GraphTooLarge(
                f"[graph_to_dot] {graph.name!r} would draw {total} nodes (limit max_nodes={opts.max_nodes}); "
                "draw the layer-collapsed view (view='layers'), focus on one layer (focus=3), "
                "or raise max_nodes")
        self.roles: dict[int, list[tuple[str, str, tuple[str, int]]]] = {}  # (name, colour, its place: rule, anchor)
        self.border: dict[int, tuple[str, float, bool]] = {}  # color, penwidth, dashed
        self.notes: dict[int, list[tuple[str, str]]] = {}  # (words, colour) under a node's op
        self.fill: dict[int, str] = {}
        self.hot_edges: dict[tuple[int, int], str] = {}
        self.cluster_of: dict[int, int] = {}
        self.clusters: list[tuple[str, dict[str, str], list[int]]] = []
        self.rejection_tips: dict[int, list[str]] = {}
        self.offending: set[int] = set()
        self._place_roles: set[tuple[str, int, int, str]] = set()  # (rule, anchor, node, role) already labelled
        self._decorate()

    # -- overlay -> per-node decorations ----------------------------------------------------------
    def _claim(self, ids: Iterable[int], key: int) -> list[int]:
        got = []
        for i in ids:
            if i in self.drawn and i not in self.cluster_of and self.nodes[i].op != Op.INPUT:
                self.cluster_of[i] = key
                got.append(i)
        return got

    def _cluster_fill(self, fill: str) -> str:
        """A match's or rejection's cluster fill: `fill`, or grey (`heat.UNCOLOURED`) while an overlay colours nodes
        (`Overlay.heat`), as every node and layer box it does not colour (a match's green tint read as a legend
        colour); its outline and label keep the cluster's colour."""
        return UNCOLOURED if self.ov.heat else fill

    def _decorate(self) -> None:
        ov = self.ov
        for k, m in enumerate(ov.matches):
            color = st.MATCH_COLORS[k % len(st.MATCH_COLORS)]
            extent = set(ov.extent(m))
            for role, i in m.bindings.items():
                if i in extent:  # operands bound as inputs (hidden, weights) belong to no cluster
                    self.roles.setdefault(i, []).append((_role_name(m.rule, role), color, (m.rule, m.anchor)))
                    self.border[i] = (color, 2.0, False)
            members = self._claim(sorted(extent), len(self.clusters))
            label = f"{m.rule or m.pass_name}\n{_into(m.path, ov.match_ops.get(m.anchor, 'fused'))}"
            fill = self._cluster_fill(tint(color, 0.9))
            self.clusters.append((f"m{k}", {"label": label, "color": color, "fillcolor": fill,
                                            "style": "rounded,filled", "penwidth": "2", "fontcolor": color,
                                            "tooltip": _tip(f"{m.pass_name} / {m.rule}: roles "
                                                            + ", ".join(f"{r}=%{i}" for r, i in m.bindings.items()))},
                                  members))
        for k, r in enumerate(ov.rejections):
            self._decorate_rejection(k, r)
        for m in ov.fused:
            # a match with no layer path (IR text without @paths) has nothing to add to the node's own op and
            # "by PASS, absorbed N node(s)" lines: no note ("? -> ElementwiseRegion" read as an error)
            if m.fused is not None and m.path:
                self.notes.setdefault(m.fused, []).append((f"{m.path} -> {self.nodes[m.fused].op.value}"
                                                           if m.fused in self.nodes else m.path, _MADE))
        for i in ov.added:
            if i in self.nodes:
                self.border.setdefault(i, (st.ADDED, 2.5, False))

    def _standing(self, r: Rejection) -> tuple[str, str, str]:
        """`(mark, ink, group)` of the place of `r` as the chips mark it (`Overlay.standings`, read by
        `passes.why.places.place_standings`): `✗` in the rejection's red for a near-miss (group ""), `△` in
        `styles.OP_GAP_INK` for a gap in rlxviz's ops, else the faded `○` in `styles.NOT_NEAR_MISS_INK`."""
        group = self.ov.standings.get((r.rule, r.anchor))
        if group is None:
            return NEAR_MISS_MARK, st.REJECT, ""
        return (GAP_MARK, st.OP_GAP_INK, group) if is_gap(group) else (FADED_MARK, st.NOT_NEAR_MISS_INK, group)

    def _whose(self, r: Rejection, i: int) -> str:
        """`trace.whose_place` of node `i` for the place of `r`: ` in layer 0` on layer 1's attention that
        n4-13's layer-0 `qkv_narrows_single_use` names offending, so its mark says whose refusal it carries."""
        n = self.nodes.get(i)
        return whose_place(own_key(self._keys, r.layer), n.path) if n is not None else ""

    def _follower(self, r: Rejection, mark_word: str) -> tuple[tuple[str, ...], str] | None:
        """`(note lines, tooltip head)` of `r`, a further failing guard of a gap place that is no gap itself
        (`Overlay.followers`), else None: `△ fix of rope_full_rotary alone is not enough:` / `attn_single_user (illegal)
        fails next` (the caveat, whole, in the tooltip), `△ beside the gap ln1_residual_scaled:` / `ln1_operand_order
        (not recognized) also fails, no gap itself`; never the gap group with its guard as if that guard were a gap."""
        place = (r.rule, r.anchor)
        caveat = self.ov.followers.get((*place, r.guard))
        if caveat is None:
            return None
        gaps = self.ov.gap_names.get(place, ())
        first, said = follower_note(gaps, r.guard, r.kind, caveat)
        head = (f"{mark_word} {self.ov.standings[place].upper()} (not a near-miss): "
                f"{', '.join(dict.fromkeys(n for _, n in gaps)) or 'gap'}")
        if caveat:
            return ((f"{mark_word} {first}", said), f"{head}; {caveat}; this guard is that blocker, no gap itself:")
        return ((f"{mark_word} {first}", said), f"{head}; this guard also fails there, no gap itself:")

    def _decorate_rejection(self, k: int, r: Rejection) -> None:
        mark_word, ink, group = self._standing(r)
        follower = self._follower(r, mark_word) if group else None
        head = f"{mark_word} {group.upper()} (not a near-miss)" if group else "REJECTED"
        head = follower[1] if follower is not None else head
        caveat = self.ov.caveats.get((r.rule, r.anchor), "") if follower is None else ""  # the text's, on the gap
        head += f"; {'a compiler fix; ' * (mark_word == GAP_MARK)}{caveat};" if caveat else ""  # held: `○`, no fix
        cut = caveat.partition(": ")  # two label lines: `alone it is not enough:` / `qkv_packed (...) fails next`
        tip = f"{head} {r.rule} [{r.stage}] guard {r.guard}: {r.message}" + (f"\nhint: {r.hint}" if r.hint else "")
        for role, i in r.bindings.items():  # the candidate's roles, in a neutral colour: red is for the culprit
            # once per node per place (rule, anchor): a candidate refused at four guards is one candidate, so its
            # roles are drawn once ("hidden", not "hidden hidden hidden hidden"); another rule's roles still show
            if (r.rule, r.anchor, i, role) in self._place_roles:
                continue
            self._place_roles.add((r.rule, r.anchor, i, role))
            self.roles.setdefault(i, []).append((_role_name(r.rule, role), st.CANDIDATE, (r.rule, r.anchor)))
        marked = marked_nodes(r, self.nodes)  # its subject (else anchor), then what it names offending
        mark = marked[0]
        if group:  # no near-miss: its node says what the place is, in the chips' mark and ink, never the red
            for i in marked:
                lines = (follower[0][0] + self._whose(r, i), follower[0][1]) if follower is not None else \
                    (f"{mark_word} {group}{self._whose(r, i)}: {r.guard}" + (";" if caveat else ""),
                     *((f"{cut[0]}:", cut[2]) if cut[2] else (caveat,) * bool(caveat)))
                notes = self.notes.setdefault(i, [])
                if not any(notes[j:j + len(lines)] == [(x, ink) for x in lines] for j in range(len(notes))):
                    notes += [(x, ink) for x in lines]
                # a near-miss's red and a match's colour at the same node stay; a gap's ink over the faded grey
                if self.border.get(i, (st.NOT_NEAR_MISS_INK,))[0] == st.NOT_NEAR_MISS_INK:
                    self.border[i] = (ink, 2.0, False)
        else:
            self.border[mark] = (st.REJECT, 3.0, True)
            self.notes.setdefault(mark, []).append((f"{NEAR_MISS_MARK} {r.guard}", st.REJECT))
            for i in r.offending:
                self.offending.add(i)
                self.fill[i] = st.REJECT_FILL
                self.border[i] = (st.REJECT, 3.0, False)
                self.notes.setdefault(i, []).append((f"offending{self._whose(r, i)}: {r.guard}", st.REJECT))
            for e in r.offending_edges:
                self.hot_edges[e] = r.guard
        inner = [i for role, i in r.bindings.items() if role not in INPUT_ROLES]
        members = self._claim([r.anchor, *inner], len(self.clusters))
        if group:  # the gap's solid ink (a compiler fix), or the faded grey and dots of nothing to fix
            style, fill = ("rounded,filled", tint(ink, 0.92)) if mark_word == GAP_MARK else \
                ("rounded,dotted,filled", "#fafafa")
            label = f"{mark_word} {r.rule}: " + (" ".join(follower[0]) if follower is not None else
                                                 f"{r.guard} ({self.ov.standing_words((r.rule, r.anchor))})")
            label += f"\n{r.path}"
        else:
            style = "rounded,dashed,filled" if r.stage == "guard" else "rounded,dotted,filled"
            fill, label = "#fff5f5", f"{NEAR_MISS_MARK} {r.rule}: {r.guard}\n{r.path}"
        self.clusters.append((f"r{k}", {"label": label, "color": ink, "fillcolor": self._cluster_fill(fill),
                                        "style": style, "penwidth": "2", "fontcolor": ink, "tooltip": _tip(tip)},
                              members))
        for i in dict.fromkeys((r.anchor, mark, *r.offending)):
            self.rejection_tips.setdefault(i, []).append(tip)

    # -- labels -------------------------------------------------------------------------------------
    def _folded_lines(self, n: Node, fg: Callable[[str], str] = str) -> list[str]:
        roles = operand_roles(n.op, n.attrs, len(n.inputs))
        items = []
        for role, j in zip(roles, n.inputs, strict=False):
            if j in self.folded:
                p = self.nodes[j]
                if p.op == Op.PARAM:
                    items.append((role, f"{short_name(p.attrs['name'])} [{','.join(map(str, p.shape))}]", p))
                else:
                    items.append((role, short_value(p.attrs.get("value")), p))
        if len(items) > _MAX_FOLDED_LINES:
            size = sum(_numel(p) for *_, p in items)
            return [_small(f"+ {len(items)} weights ({human_count(size)} values)", fg("#555555"))]
        return [_small(f"{role}: {text}", fg("#555555")) for role, text, _ in items]

    def _label_colors(self, n: Node) -> Callable[[str], str]:
        """The colour each coloured line of `n`'s label takes: its own, except on an overlay's fill (time share,
        error: `Overlay.heat`), where a colour short of `heat.MIN_CONTRAST` on that fill becomes the fill's label
        colour (`heat.readable_on`; a grey shape on the darkest time bin read as nothing, issue 39)."""
        if n.id not in self.ov.heat or n.id in self.ghosts:
            return str
        fill = self.ov.heat[n.id][0]
        return lambda color: readable_on(color, fill)

    def _roles_of(self, node_id: int) -> list[tuple[str, str, str]]:
        """`(role, colour, whose)` of each role drawn on node `node_id`, once per place (rule, anchor) that gives it:
        `whose` names the place when places of more than one give the node roles, else "". Places at several anchors
        by anchor, one role of several of them once (`the residual @ %63`, `mask_cond @ %38, %84`); rules at one
        anchor by rule, each its own (`ln2 (bert_post_ln)`, `ln2 (other_layout)`). deit's bias add %50 is the bias add
        of the place at %50 and the residual of the next bias-after-residual place, at %63: drawn `the bias add / the
        residual` it read as one node playing two roles in one place."""
        per: dict[tuple[str, int], dict[str, str]] = {}  # place -> its role names -> colour (the first)
        for name, color, place in self.roles.get(node_id, []):
            per.setdefault(place, {}).setdefault(name, color)
        if len(per) < 2:
            return [(name, color, "") for names in per.values() for name, color in names.items()]
        if len({a for _, a in per}) < 2:
            return [(name, color, f"({rule.split('.', 1)[-1]})") for (rule, _), names in per.items()
                    for name, color in names.items()]
        by: dict[str, tuple[str, dict[str, None]]] = {}
        for (_, a), names in per.items():
            for name, color in names.items():
                by.setdefault(name, (color, {}))[1][f"%{a}"] = None
        return [(name, color, "@ " + ", ".join(at)) for name, (color, at) in by.items()]

    def _replaced(self, n: Node) -> tuple[int, ...]:
        """The ids `n` itself replaced (`passes.made.replaced`; a ghost of an older version: its list)."""
        return replaced(n, self.g, self.ov.made, self.ov.origin) if n.id in self.g else n.absorbed

    @cached_property
    def _held(self) -> dict[int, int]:
        return holders(self.g, self.ov.made, self.ov.origin)  # where each absorbed id is now (`passes.made`)

    def _made(self, n: Node) -> tuple[str, ...]:
        """`Beside.said` of a node made beside a product, naming where a product gone from this version went."""
        b = self.ov.made.get(n.id)
        return () if b is None else b.said(where_now(b, self.g, self._held) if b.product not in self.g else "")

    def _label(self, n: Node) -> str:
        lines = []
        fg = self._label_colors(n)
        for role, color, whose in self._roles_of(n.id):
            lines.append(f'<FONT COLOR="{fg(color)}" POINT-SIZE="10"><B><I>{_e(role)}</I></B></FONT>'
                         + (_small(f" {whose}", fg(color)) if whose else ""))
        if n.op == Op.INPUT:
            lines.append(f"<B>{_e(n.attrs['name'])}</B>")
        elif n.op == Op.PARAM:
            lines.append(f"<B>{_e(short_name(n.attrs['name']))}</B>")
        else:
            lines.append(f"<B>{_e(n.op.value)}</B> {_small(f'%{n.id}', fg('#777777'))}")
        attrs = fmt_attrs(n)
        if attrs and n.op not in (Op.INPUT, Op.PARAM):
            lines.append(_small(attrs, fg("#222222"), 9))
        lines += self._folded_lines(n, fg)
        made, own = self._made(n), self._replaced(n)
        if made:  # made beside a match's product: for which, never its absorbed list; whole words in 3 lines
            lines += [_small(s, fg("#1b5e20")) for s in _wrap(next((w for w in made if len(_wrap(w)) <= 3),
                                                                   made[-1]))[:3]]
        elif (n.op in FUSED or n.absorbed) and n.pass_name:  # the stage that made it, where one did (`made.maker`)
            lines.append(_small(f"by {maker(n, self.ov.makers)}", fg("#1b5e20")))
        if own:  # what it replaced itself (`passes.made.replaced`), as the inspector counts it
            ops = _op_summary(own, self.ov.origin)
            summary = f"absorbed {len(own)} node(s)" + (f": {ops}" if ops else "")
            lines += [_small(s, fg("#1b5e20")) for s in _wrap(summary)[:3]]
        for note, color in self.notes.get(n.id, []):
            lines.append(f'<FONT COLOR="{fg(color)}" POINT-SIZE="9"><B>{_e(note)}</B></FONT>')
        if n.id in self.ghosts:
            lines.insert(0, _small("removed", st.REMOVED))
        lines.append(_small(fmt_shape(n), fg("#333333"), 9))
        return _html(lines)

    def _tooltip(self, n: Node) -> str:
        roles = operand_roles(n.op, n.attrs, len(n.inputs))
        ops = ", ".join(f"{r}=%{j} {self.nodes[j].op.value}" if j in self.nodes else f"{r}=%{j}"
                        for r, j in zip(roles, n.inputs, strict=False))
        parts = [f"%{n.id} {n.op.value} -> {fmt_shape(n)}", f"path: {n.path or '-'}"]
        if n.attrs:  # each value as the IR text prints it (`none`, `"gelu"`, `true`), a blob by its size
            parts.append("attrs: " + shown_attrs(n))
        # the names messages give the node (the app's search matches this line), drawn as tags or not (`names`)
        named = [f"{r} {whose}" if whose else r for r, _, whose in self._roles_of(n.id)] + [
            _role_name(rule, role) for rule, role in self.ov.names.get(n.id, ())]
        if named:
            parts.append("roles: " + ", ".join(dict.fromkeys(named)))
        if ops:
            parts.append(f"operands: {ops}")
        if n.pass_name:
            parts.append(f"created by: {maker(n, self.ov.makers)}")
        if made := self._made(n):
            parts.append(made[0])
        if own := self._replaced(n):
            parts.append(f"absorbed: {' '.join(f'%{i}' for i in own)}")
            ops = _op_summary(own, self.ov.origin)
            if ops:  # for the reader: op names, and the node's layer (the app's search reads `absorbed_index`)
                layer = own_key(self._keys, layer_of(n.path))  # `decoder layer 0`, as the inspector names it
                parts.append(f"absorbed ops: {ops}" + (f" — in {layer_label(layer)}" if layer is not None else ""))
        parts += self.rejection_tips.get(n.id, [])
        if n.id in self.ov.heat:
            parts.append(self.ov.heat[n.id][1])
        return "\n".join(parts)

    def _node_attrs(self, n: Node) -> dict[str, object]:
        color, pen, dashed = self.border.get(n.id, ("#555555", 1.0, False))
        style = ["rounded", "filled"]
        fill = self.fill.get(n.id, op_color(n.op))
        fontcolor = "black"
        if n.id in self.ov.heat:
            fill = self.ov.heat[n.id][0]
            fontcolor = text_color(fill)
        elif self.ov.heat and n.id not in self.fill:  # an overlay is on and colours not this node: no op colour
            fill = UNCOLOURED  # (a tan add read as the legend's orange)
        if n.id in self.ghosts:
            color, fill, fontcolor, dashed = st.REMOVED, "#fafafa", st.REMOVED, True
        if dashed:
            style.append("dashed")
        if n.op in FUSED and n.id not in self.border:
            color, pen = "#1b5e20", 2.0
        attrs: dict[str, object] = {"id": f"n{n.id}", "fillcolor": fill, "color": color, "style": ",".join(style),
                                    "fontcolor": fontcolor}
        if pen != 1.0:
            attrs["penwidth"] = f"{pen:g}"
        if n.id in self.offending:
            attrs["class"] = "offending"  # SVG `class="node offending"`: the culprit of a rejection
        if n.op in (Op.INPUT, Op.PARAM, Op.CONST):
            attrs["shape"] = "ellipse" if n.op == Op.INPUT else "note"
            attrs["style"] = ",".join(s for s in style if s != "rounded")
        if self.opts.tooltips:
            attrs["tooltip"] = _tip(self._tooltip(n))
        return attrs

    # -- emit ---------------------------------------------------------------------------------------
    def _place(self, n: Node) -> str:
        """Where a stub's node sits, as `explain` says: its path in its own layer, else its `placed` layer or place
        outside the layers (else `placement.path_box`): bart-full's %376 read `encoder`, the CLI `embeddings`."""
        place = self.placed.get(n.id)
        if isinstance(place, str):
            return _shown(place)
        if place is not None and place != layer_of(n.path):
            return layer_label(place)
        return _shown(n.path) if layer_of(n.path) is not None else _shown(path_box(n.path))

    def dot(self, title: str) -> str:
        d = graphviz.Digraph(_shown(self.g.name), graph_attr={
            "rankdir": "TB", "newrank": "true", "nodesep": "0.25", "ranksep": "0.35", "fontname": self.opts.font,
            "fontsize": "12", "labelloc": "t", "id": "graph_" + _shown(self.g.name), "outputorder": "edgesfirst"},
            node_attr={"shape": "box", "style": "rounded,filled", "fontname": self.opts.font, "fontsize": "10",
                       "margin": "0.08,0.03", "height": "0.3"},
            edge_attr={"color": "#555555", "arrowsize": "0.6", "fontname": self.opts.font, "fontsize": "8"})
        if title:
            d.attr(label=graphviz.nohtml(title))
        loose = [i for i in self.order if i not in self.cluster_of]
        for i in loose:
            self._emit_node(d, self.nodes[i])
        for k, (name, attrs, members) in enumerate(self.clusters):
            if not any(self.cluster_of.get(i) == k for i in members):
                continue  # nothing of it is drawn (focus view)
            with d.subgraph(name=f"cluster_{name}") as c:
                c.attr(id=name, fontname=self.opts.font, fontsize="11", **attrs)
                for i in members:
                    if self.cluster_of.get(i) == k:
                        self._emit_node(c, self.nodes[i])
        for j, n in self.stubs.items():
            if j in self.offending:  # a culprit outside what is drawn still reads as the culprit
                d.node(f"s{j}", graphviz.nohtml(f"… %{j} {n.op.value}\n{self._place(n)}\noffending"), id=f"s{j}",
                       style="dashed,filled", shape="box", fontsize="8", fontcolor=st.REJECT, color=st.REJECT,
                       fillcolor=st.REJECT_FILL, penwidth="3", **{"class": "offending"})
                continue
            d.node(f"s{j}", graphviz.nohtml(f"… %{j} {n.op.value}\n{self._place(n)}"), id=f"s{j}", style="dotted",
                   shape="box", fontsize="8", fontcolor="#777777", color="#999999")
        inputs = [i for i in self.order if self.nodes[i].op == Op.INPUT]
        if inputs:
            with d.subgraph() as s:
                s.attr(rank="source")
                for i in inputs:
                    s.node(f"n{i}")
        with d.subgraph() as s:
            s.attr(rank="sink")
            for k, o in enumerate(self.g.outputs):
                if o not in self.drawn:
                    continue
                s.node(f"out{k}", graphviz.nohtml(f"output {k}\n{fmt_shape(self.g[o])}"), id=f"out{k}",
                       shape="ellipse", style="filled", fillcolor="#ffffff", fontsize="9")
        self._emit_edges(d)
        return d.source

    def _emit_node(self, d: graphviz.Digraph, n: Node) -> None:
        d.node(f"n{n.id}", self._label(n), **{k: v for k, v in self._node_attrs(n).items()})

    def _emit_edges(self, d: graphviz.Digraph) -> None:
        def name(i: int) -> str | None:
            if i in self.drawn:
                return f"n{i}"
            return f"s{i}" if i in self.stubs else None

        seen: Counter[tuple[int, int]] = Counter()
        for i in self.order:
            n = self.nodes[i]
            ghost_edge = i in self.ghosts
            for j in n.inputs:
                src = name(j) if i in self.drawn else None
                if src is None or j in self.folded:
                    continue
                seen[(j, i)] += 1
                eid = f"e{j}_{i}" + (f"_{seen[(j, i)] - 1}" if seen[(j, i)] > 1 else "")
                attrs: dict[str, str] = {"id": eid}
                if self.opts.edge_labels:
                    attrs["label"] = graphviz.nohtml(fmt_shape(self.nodes[j]))
                if (j, i) in self.hot_edges:
                    attrs.update(color=st.REJECT, penwidth="3", fontcolor=st.REJECT, **{"class": "offending"},
                                 label=graphviz.nohtml(self.hot_edges[(j, i)]))
                elif ghost_edge or j in self.ghosts:
                    attrs.update(color=st.REMOVED, style="dashed")
                d.edge(src, f"n{i}", **attrs)
        # old consumers of removed nodes that survived (diff view)
        if self.ghosts and self.ov.origin is not None:
            for n in self.ov.origin:
                if n.id in self.g and n.id in self.drawn:
                    for j in n.inputs:
                        if j in self.ghosts and j not in self.g[n.id].inputs:
                            d.edge(f"n{j}", f"n{n.id}", id=f"e{j}_{n.id}_old", color=st.REMOVED, style="dashed")
        for j, stub in self.stubs.items():  # edges from drawn nodes into downstream stubs
            for i in dict.fromkeys(stub.inputs):
                if i in self.drawn:
                    d.edge(f"n{i}", f"s{j}", id=f"e{i}_{j}", style="dotted")
        for k, o in enumerate(self.g.outputs):
            src = name(o)
            if src is not None and o in self.drawn:
                d.edge(src, f"out{k}", id=f"eout{k}")


def _numel(n: Node) -> int:
    size = 1
    for s in n.shape:
        size *= s
    return size


def graph_to_dot(graph: Graph, overlay: Overlay | None = None, *, options: DotOptions | None = None,
               include: Iterable[int] | None = None, title: str | None = None,
               placed: Mapping[int, Layer | str] | None = None) -> str:
    """DOT source for `graph` with `overlay` drawn on it.

    Args:
        graph: the graph version to draw.
        overlay: matches / rejections / fused nodes / diff to draw (see `Overlay.before`, `.after`, `.diff`).
        options: drawing options (`DotOptions`); default folds params and consts into their consumers.
        include: draw only these node ids; their outside neighbours become dotted stubs (focus views).
        title: caption (default: the overlay's title, else the graph name and node count).
        placed: node id -> where it sits, for nodes placed by structure, not path (`passes.placement.placed`):
            what a stub says of where its node is (`_Drawer._place`).

    Returns:
        DOT source text (a `digraph`).

    Raises:
        GraphTooLarge: more than `options.max_nodes` nodes would be drawn.
    """
    ov = overlay or Overlay()
    opts = options or DotOptions()
    drawer = _Drawer(graph, ov, opts, set(include) if include is not None else None, placed)
    if title is None:
        title = ov.title or f"{graph.name}: {len(graph.compute_nodes())} ops"
    return drawer.dot(title)


def node_tooltips(graph: Graph, overlay: Overlay | None = None, *, options: DotOptions | None = None) -> dict[int, str]:
    """Each drawn node's tooltip as `graph_to_dot` draws it with `overlay`, by node id: what the app's search reads
    (`app.graphpane.own_text`). Raises `GraphTooLarge` as `graph_to_dot` does."""
    drawer = _Drawer(graph, overlay or Overlay(), options or DotOptions(), None)
    drawer.dot("")
    return {i: drawer._tooltip(drawer.nodes[i]) for i in drawer.order}


__all__ = ["DotOptions", "GraphTooLarge", "MAX_NODES", "graph_to_dot", "node_tooltips"]
