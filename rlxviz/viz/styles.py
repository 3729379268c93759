"""Colours and text formatting shared by every drawing: one colour per op family, a hashed fallback.

Colours are stable: the same op gets the same fill in every graph version and every session, so a
reader can follow a `layer_norm` across passes (torch.fx's hashed colours, tinygrad's `uops_colors`).
"""

from __future__ import annotations

import colorsys
import zlib
from typing import Any

from ..ir import Node, Op, family
from ..ir.ops import SPECS
from .heat import linear_rgb

FAMILY_COLORS: dict[str, str] = {
    "leaf": "#a3bac2",
    "blas": "#b3d4fc",
    "binary": "#d4ba7d",
    "unary": "#fbd3a6",
    "compare": "#c6bddb",
    "reduce": "#b1c270",
    "norm": "#a8e6e0",
    "movement": "#c2b7a3",
    "attention": "#c9b6ff",
    "fused": "#92e896",
}
"""Fill colour per `rlxviz.ir.family` name. Each differs from every status and rejection colour (`STATUS_MARKS`) by
at least `MIN_DELTA_E` (CIE76 in Lab, `delta_e`): the fused attention node was pink (#f7c1c1), 5 from a rejected
layer's fill, and leaves and movement ops were the grey of an unfused layer box. Pale enough for black text (L* 74 or
more)."""
FAMILY_WORDS: dict[str, str] = {
    "leaf": "inputs, weights, constants", "blas": "matmul, linear", "binary": "add, mul, ...",
    "unary": "exp, gelu, ...", "compare": "compare, where, cast", "reduce": "sum, max, softmax parts",
    "norm": "layer norm", "movement": "reshape, transpose, slice", "attention": "attention (fused or not)",
    "fused": "fused kernels",
}
"""What each op family holds, in words, for the op-colour legend (`op_legend`)."""

MATCH_COLORS = ("#2e7d32", "#1565c0", "#6a1b9a", "#00838f", "#ef6c00", "#ad1457", "#4e342e", "#283593")
"""Border colours cycled over match clusters (fill is a pale tint of the same hue): the K-th match of a pass
(0-based) gets `MATCH_COLORS[K % len(MATCH_COLORS)]` (`viz.dot`)."""
MATCH_COLOR_NAMES = ("green", "blue", "purple", "teal", "orange", "pink", "brown", "indigo")
"""`MATCH_COLORS` in words, in the same order."""


def match_frames(n: int) -> str:
    """How the drawing frames a pass's `n` matches, in words for a sentence: each match in its own frame, coloured
    as `viz.dot` colours it (`MATCH_COLORS`, in match order): "its match framed in green", "its 3 matches framed in
    green, blue and purple, one colour each", past three "its 8 matches framed, one colour each: green, blue,
    purple and so on", past `len(MATCH_COLORS)` the colours repeat and the words say so. Raises nothing."""
    names = MATCH_COLOR_NAMES
    if n <= 0:
        return "it matched no pattern, so nothing is framed"
    if n == 1:
        return f"its match framed in {names[0]}"
    if n <= 3:
        return f"its {n} matches framed in {', '.join(names[:n - 1])} and {names[n - 1]}, one colour each"
    again = f", the {len(names)} colours repeating" if n > len(names) else ""
    return f"its {n} matches framed, one colour each: {', '.join(names[:3])} and so on{again}"


REJECT = "#c62828"
"""Rejections: anchor border, offending nodes and edges."""
REJECT_FILL = "#fdecea"
CANDIDATE = "#37474f"
"""Role names of a rejected candidate's bindings (neutral: they are not the culprit)."""
ADDED = "#2e7d32"
REMOVED = "#9e9e9e"
NOT_NEAR_MISS = "○ not near-miss"
"""The status of a layer box whose every refusal at this version is no near-miss (the app chips' faded `○`: a
refusal the layer's kind does not expect or that is illegal for it, a lookalike, the model's own term): drawn grey and
dotted, never in the rejection's red."""
NOT_NEAR_MISS_INK = "#757575"
"""Border and words of a `NOT_NEAR_MISS` box: the chips' neutral grey."""
OP_GAP = "△ gap in rlxviz's ops"
"""The status of a layer box held back only by gaps in rlxviz's ops (`passes.why.verdict.OP_GAP_GROUP`, the app
chips' unfaded `△`): at an earlier version, a layer whose every refusal is no near-miss and some is at a gap; settled,
a layer held back by rlxviz's ops (`held back by rlxviz's ops`, no fused op, or `fused as far as rlxviz's ops go`, some
fused: `layers.Verdict.at_gap`). Not fused as expected, and not the model's fault: a compiler fix, so neither the
fused green, the rejection's red nor the faded grey."""
OP_GAP_INK = "#283593"
"""Border and words of an `OP_GAP` box."""
FUSED_INK = "#1b5e20"
"""Border and words of a fused layer box."""
KIND_LIMITED = "fused as expected"
"""The status of a settled layer box whose verdict is `fused` only as far as its kind expects any fusion
(`layers.Verdict.limit`, `passes.why.text.kind_limit`: quantized activations, where no float fusion across a QDQ step
is expected, so attention and matmuls stay as they are): its words say the limit, and its look is not the fused green
of a full fusion (ernie.qdq's elementwise regions were drawn as its FusedTransformerLayer is in bert)."""
KIND_LIMITED_INK = "#33691e"
"""Border (dashed) and words of a `KIND_LIMITED` box: an olive apart from the fused ink."""
STATUS_COLORS = {"fused": "#a5d6a7", "partly fused": "#fff59d", "rejected": "#ffcdd2", "unfused": "#eeeeee",
                 "rewritten": "#eeeeee", "not fused": "#ffcdd2", NOT_NEAR_MISS: "#eeeeee", OP_GAP: "#808cff",
                 KIND_LIMITED: "#d7ecc4"}
"""Fill of a layer box in the layer-collapsed view, by fusion status. `rewritten` (a layer whose matches so far made
plain ops only, e.g. the `attention` `fuse_sdpa` packed: its box says `no fused op; rewritten as attention`) keeps
the grey of `unfused`: the yellow says some fused op was made (`ir.ops.made_as`, as the verdict counts them). The
gap's blue is `GAP_APART` from the attention ops' lavender: its #9094fc was 23 from it, and a reader of the legend
took a gap box for an attention box."""
PLAIN_BOX = "#f5f5f5"
"""Fill of a box with no status (`""`: a place outside the layers holding no fused op, `layers.outside_status`)."""
GAP_APART = 30.0
"""The least CIE76 distance (`delta_e`) between the gap box's fill (`STATUS_COLORS[OP_GAP]`) and any op fill."""
BOX_FRAMES: dict[str, tuple[str, str, str]] = {
    "fused": (FUSED_INK, "solid", "2"), OP_GAP: (OP_GAP_INK, "solid", "2"), "rejected": (REJECT, "dashed", "2.5"),
    KIND_LIMITED: (KIND_LIMITED_INK, "dashed", "2"),
    "not fused": (REJECT, "dashed", "2.5"), NOT_NEAR_MISS: (NOT_NEAR_MISS_INK, "dotted", "1.5")}
"""A layer box's frame by its tone (`layers.LayerGroup.tone`): (colour, line style, width in points); a tone not
here has Graphviz's plain thin black frame (`PLAIN_FRAME`). The one source of `viz.layers` and the legend
(`box_legend`)."""
PLAIN_FRAME = ("#000000", "solid", "1")
"""The frame Graphviz draws a box of a tone not in `BOX_FRAMES` (its default: black, solid, 1 point)."""
BOX_WORDS: dict[str, str] = {
    "fused": "fused, fused as far as legal: fused as the layer's kind expects",
    KIND_LIMITED: f"{KIND_LIMITED}, quantized activations: not a full fusion; fused only what a layer with quantized "
                  "activations expects (no float fusion across its QDQ steps)",
    "partly fused": "partly fused: some fused op made, some op a fusion could take left",
    OP_GAP: f"fused as far as rlxviz's ops go, held back by rlxviz's ops, {OP_GAP}: a compiler fix, "
            "not the model's",
    "not fused": "not fused, rejected: a near-miss, its guard named",
    NOT_NEAR_MISS: f"{NOT_NEAR_MISS}: refused, nothing to fix (the model's own term, a lookalike)",
    "unfused": "unfused, no fused op, rewritten as attention: no fused op (yet)",
    "": "no status word: a place outside the layers with no fused op",
}
"""What each layer-box colour means, in the words the boxes print (`box_legend`), one row per look."""


def box_legend() -> list[tuple[str, str, str, str, str]]:
    """The layer boxes' legend: (tone, fill, frame colour, frame style, words) per `BOX_WORDS` row, the fill from
    `STATUS_COLORS` and the frame from `BOX_FRAMES`, as `viz.layers` draws them; a tone not there has Graphviz's
    plain frame (`PLAIN_FRAME`). Raises nothing."""
    out = []
    for tone, words in BOX_WORDS.items():
        colour, style, _ = BOX_FRAMES.get(tone, PLAIN_FRAME)
        out.append((tone, STATUS_COLORS.get(tone, PLAIN_BOX), colour, style, words))
    return out

STATUS_MARKS: dict[str, str] = {**{f"status {k}": v for k, v in STATUS_COLORS.items()}, "rejected": REJECT,
                                 "rejected fill": REJECT_FILL}
"""The colours that say a fusion's status or a rejection: an op fill must not be read as one of them."""
MIN_DELTA_E = 20.0
"""The least CIE76 distance (`delta_e`) between an op fill and a `STATUS_MARKS` colour."""


def lab(hex_color: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB `#rrggbb` colour: L* in 0..100. Raises ValueError for another form."""
    if len(hex_color) != 7 or not hex_color.startswith("#"):
        raise ValueError(f"not a #rrggbb colour: {hex_color!r}")
    r, g, b = linear_rgb(hex_color)
    xyz = ((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b,
           (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883)
    fx, fy, fz = (v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in xyz)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def delta_e(a: str, b: str) -> float:
    """CIE76 colour difference of two `#rrggbb` colours (Euclidean in Lab): about 2 is just seen, 20 clearly
    another colour."""
    return sum((x - y) ** 2 for x, y in zip(lab(a), lab(b), strict=True)) ** 0.5


def op_legend() -> list[tuple[str, str, str]]:
    """The op-colour legend: (family, fill, what it holds) per `FAMILY_COLORS` entry, in its order; ops of no family
    get a pale colour hashed from their name (`hashed_color`)."""
    return [(f, c, FAMILY_WORDS.get(f, f)) for f, c in FAMILY_COLORS.items()]


HIGHLIGHT_MARK = "#ff6f00"
"""A highlighted node's thick border in the app's graph panes (`SvgGraph.highlight`)."""
SELECTED_MARK = "#1565c0"
"""The selected node's dashed border (and its counterpart's dotted one) in the app's graph panes."""
SEARCH_MARK = "#ff00ff"
"""The graph search's mark on a found node: a thick magenta outline with a magenta glow, the node's own fill left
as drawn (`app.graphpane`). Magenta means nothing else in any drawing (`meaningful_colors`): the search used to fill
found nodes yellow, the fill of a "partly fused" layer box, so a found box read as a partial fusion (issue 39)."""
SEARCH_MARK_WORDS = "a thick magenta outline with a glow"
"""`SEARCH_MARK` in words, for the search's legend (`search_key`)."""


def search_key() -> str:
    """The search's legend, one sentence: how a found node is marked, and that a yellow fill is a status, not a hit.
    Raises nothing."""
    return (f"Found nodes get {SEARCH_MARK_WORDS} (their fill stays: a yellow box is partly fused, "
            "not a search hit); Enter steps through them.")


def meaningful_colors() -> dict[str, str]:
    """Every colour a drawing gives a meaning, by what it means: the layer boxes' status fills (`STATUS_COLORS`),
    the match frames (`MATCH_COLORS`), rejections, added and removed nodes, the op family fills (`FAMILY_COLORS`)
    and the overlays' heat fills (`heat.PALETTE`, `heat.NONFINITE`). A new mark's colour must differ from all of
    them (`SEARCH_MARK` does: tests/test_app_search_mark.py). Raises nothing."""
    from .heat import NONFINITE, PALETTE

    out = {f"status {k}": v for k, v in STATUS_COLORS.items()}
    out.update({f"match frame {MATCH_COLOR_NAMES[k]}": c for k, c in enumerate(MATCH_COLORS)})
    out.update({"rejected": REJECT, "rejected fill": REJECT_FILL, "rejected candidate": CANDIDATE, "added": ADDED,
                "removed": REMOVED, "heat non-finite": NONFINITE, "highlighted": HIGHLIGHT_MARK,
                "selected": SELECTED_MARK})
    out.update({f"family {k}": v for k, v in FAMILY_COLORS.items()})
    out.update({f"heat bin {k}": c for k, c in enumerate(PALETTE)})
    return out


def hashed_color(key: str) -> str:
    """A pale colour derived from `key` by CRC32 (stable across runs, unlike `hash`), its hue turned on (by 20° steps)
    while it lies within `MIN_DELTA_E` of a status or rejection colour (`STATUS_MARKS`): a hashed pink read as a
    rejection."""
    h = zlib.crc32(key.encode()) % 360
    out = ""
    for turn in range(0, 360, 20):
        r, g, b = colorsys.hls_to_rgb((h + turn) % 360 / 360.0, 0.85, 0.6)
        out = f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"
        if all(delta_e(out, c) >= MIN_DELTA_E for c in STATUS_MARKS.values()):
            return out
    return out


def op_color(op: Op | str) -> str:
    """Fill colour of an op: its family's colour, or a colour hashed from its name."""
    try:
        fam = family(Op(op))
    except ValueError:
        return hashed_color(str(op))
    return FAMILY_COLORS.get(fam) or hashed_color(str(op))


def tint(hex_color: str, amount: float = 0.88) -> str:
    """`hex_color` mixed with white (`amount` = share of white)."""
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    mix = [round(c + (255 - c) * amount) for c in (r, g, b)]
    return "#" + "".join(f"{c:02x}" for c in mix)


def fmt_shape(node: Node) -> str:
    """`f32[1,128,768]`."""
    return f"{node.dtype.value}[{','.join(map(str, node.shape))}]"


_ABBREV = {"num_heads": "heads", "head_dim": "dh", "intermediate_size": "ffn", "activation": "act",
           "keepdims": "keep", "length": "len", "has_bias": "bias", "has_rope": "rope", "gate_first": "gate1st"}


VALUE_WIDTH = 44
"""The most characters a node label gives one attribute or folded constant value (`short_value`): a gather's index
list of 192 values drew a node 1000 px wide (gpt-neox after `fuse_attention_block/qkv_columns`), and the fit view
shrank the rest of the graph to specks. The node inspector keeps the whole value."""


def _runs(values: tuple[int, ...]) -> list[str]:
    """`values` as runs of consecutive integers: `(0, 1, 2, 3, 9, 48, 49)` -> `["0..3", "9", "48", "49"]` (a run of
    three or more as `first..last`)."""
    out: list[str] = []
    k = 0
    while k < len(values):
        end = k
        while end + 1 < len(values) and values[end + 1] == values[end] + 1:
            end += 1
        if end - k >= 2:
            out.append(f"{values[k]}..{values[end]}")
        else:
            out += [str(x) for x in values[k:end + 1]]
        k = end + 1
    return out


def _items(v: tuple) -> list[str]:
    """The items `short_value` lists of tuple `v`: its runs (`_runs`) where `v` is flat integers and runs shorten it
    to half its items or fewer, else each item as a label prints it."""
    if v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        runs = _runs(v)
        if len(runs) * 2 <= len(v):
            return runs
    return [_fmt_value(x) for x in v]


def short_value(v: Any, width: int = VALUE_WIDTH) -> str:
    """An attribute or constant value as a node label prints it, at most about `width` characters: a float as `%g`,
    a short tuple whole (`(0,2,1,3)`), a longer one by its first items, its last and its count, runs of consecutive
    integers as ranges: `(0, 1, 2, …, 63) · 48 values`, `(0..15, 48..63, …, 176..191) · 192 values`. The one place
    a label shortens a value; the inspector and the tooltip print it whole (`ir.printer.format_value`)."""
    if not isinstance(v, tuple | list):
        s = _fmt_value(v)
        return s if len(s) <= width else s[:width - 1] + "…"
    v = tuple(v)
    whole = "(" + ",".join(_fmt_value(x) for x in v) + ")"
    if len(whole) <= width:
        return whole
    items, count = _items(v), f" · {len(v)} values"
    if len(items) < len(v) and len(shown := "(" + ", ".join(items) + ")" + count) <= width:
        return shown
    room = width - len(count) - len(f"(, …, {items[-1]})")
    head: list[str] = []
    for x in items[:-1]:
        if len(", ".join([*head, x])) > room and head:
            break
        head.append(x)
    return "(" + ", ".join(head) + f", …, {items[-1]})" + count


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, tuple | list):
        return short_value(v)
    return str(v)


def fmt_attrs(node: Node, limit: int = 48) -> str:
    """Key attributes of `node`, defaults and names omitted: `heads=12 dh=64 mask=keep`; for an `onnx_op`, the ONNX
    op and node name it holds (`Conv node_conv1d`, `out=1` for a later output), never its serialized node (its
    base64 filled the label: `op_type=Conv node=Cg5pbnB1dF9m…`)."""
    if node.op == Op.ONNX_OP:
        out = int(node.attrs.get("output", 0) or 0)
        s = " ".join(x for x in (str(node.attrs.get("op_type", "?")), str(node.attrs.get("name") or ""),
                                 f"out={out}" if out else "") if x)
        return s if len(s) <= limit else s[:limit - 1] + "…"
    spec = SPECS.get(node.op)
    parts: list[str] = []
    for k, v in node.attrs.items():
        if k == "name" or v is None:
            continue
        a = spec.attrs.get(k) if spec else None
        if a is not None and not a.required and v == a.default:
            continue
        if node.op == Op.CAST and k == "dtype":
            parts.append(f"to {v}")
            continue
        parts.append(f"{_ABBREV.get(k, k)}={_fmt_value(v)}")
    s = " ".join(parts)
    return s if len(s) <= limit else s[:limit - 1] + "…"


def short_name(name: str, keep: int = 2) -> str:
    """The last `keep` dotted parts of a parameter name: `qkv.weight`."""
    return ".".join(name.split(".")[-keep:])


def human_count(n: int) -> str:
    """`1.2M`, `590K`, `768`."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.3g}{suffix}"
    return str(n)
