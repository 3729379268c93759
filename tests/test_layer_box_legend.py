"""Layer boxes: a legend for their colours, outside boxes coloured as `explain` words them, one `rewritten as`.

Newcomer findings on the collapsed ("one box per layer") view:

1. the legend explained op colours only; the gap box's indigo (#9094fc, 23 from the attention ops' lavender) read as
   an attention box. Decision: the folded legend ("op and layer-box colours") lists each look of a layer box, its
   fill and frame from the constants `viz.layers` draws with (`styles.box_legend`, `STATUS_COLORS`, `BOX_FRAMES`),
   with the words the boxes print; the gap's fill is `GAP_APART` from every op fill.
2. minilm's and roberta's `embeddings` boxes were yellow "partly fused" beside an op only a `○` refuses (minilm's
   embeddings norm: nothing to fix) or no pass reports (roberta's integer position ids), while esm.qdyn's, also one
   ElementwiseRegion, was green. Decision: a box outside the layers follows `explain`'s `outside the layers:` line
   (`layers.outside_status`): `fused` when it holds a fused op, `partly fused` only where a near-miss refusal sits.
3. gpt-neox's layer 0 at version 26 said "rewritten as attention, where" (the `where` a NaN-guard form rewrite made,
   gone from the final graph) while `explain`, -v, --json and the Why tab said "rewritten as: attention %237".
   The box answers for its version, the verdict for the final graph (bert's packed attention, absorbed by its
   FusedTransformerLayer, is rightly counted at earlier versions). Decision: the box counts the nodes its verdict
   lists and plain ops of a kind their match did not take in (`session.render.listed_nodes`); a `where` re-made as
   a `where` is the model's op re-placed, not a rewrite "as" anything.
"""

from __future__ import annotations

import functools
import html
import re
from dataclasses import replace
from pathlib import Path

from test_near_miss_rule import trace_of

from rlxviz.app.graphpane import ops_legend_html
from rlxviz.passes import Trace
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.session.render import View, dot
from rlxviz.viz.layers import LayerGroup, outside_status
from rlxviz.viz.overlay import Overlay
from rlxviz.viz.styles import (
    BOX_FRAMES,
    FAMILY_COLORS,
    GAP_APART,
    NOT_NEAR_MISS,
    OP_GAP,
    PLAIN_FRAME,
    STATUS_COLORS,
    box_legend,
    delta_e,
)

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"
NEOX, ROBERTA, ESM, DEIT = (CASES / f"{n}.onnx" for n in ("gpt-neox.legacy-sdpa", "roberta", "esm.qdyn",
                                                          "deit.ortopt"))
YELLOW = STATUS_COLORS["partly fused"]


@functools.cache
def _trace(source: str) -> Trace:
    return trace_of(source)


def _box(t: Trace, v: View, key: str) -> tuple[str, str]:
    """(words, DOT attributes) of box `key` in `v`'s layers drawing, the label's markup stripped."""
    text = html.unescape(dot(t, v))
    line = next(x for x in text.splitlines() if x.strip().startswith(f"{key} "))
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", line.split(" fillcolor=")[0])), line


def _attr(line: str, name: str) -> str | None:
    m = re.search(rf'\b{name}="?([^" \]]+)"?', line)
    return m.group(1) if m else None


# 1. the legend


def test_the_gap_box_fill_is_kept_apart_from_every_op_fill_the_attention_lavender_above_all():
    gap = STATUS_COLORS[OP_GAP]
    assert delta_e(gap, FAMILY_COLORS["attention"]) >= GAP_APART, gap
    assert all(delta_e(gap, c) >= GAP_APART for c in FAMILY_COLORS.values())


def test_the_legend_lists_each_box_look_with_the_fill_and_frame_the_drawing_uses():
    legend = box_legend()
    looks = {(fill, frame, style) for _, fill, frame, style, _ in legend}
    for tone, fill in STATUS_COLORS.items():  # every status a box can take has its look in the legend
        frame, style, _ = BOX_FRAMES.get(tone, PLAIN_FRAME)
        assert (fill, frame, style) in looks, tone
    text = ops_legend_html()
    assert "layer boxes" in text.split("</summary>")[1] and "layer-box" in text.split("</summary>")[0]
    for _, fill, frame, style, words in legend:
        assert f"background:{fill};border:2px {style} {frame}" in text and html.escape(words) in text


def test_each_status_word_the_boxes_print_is_in_the_legend():
    text = html.unescape(ops_legend_html())
    words = [*STATUS_COLORS, "fused as far as legal", "fused as far as rlxviz's ops go", "held back by rlxviz's ops",
             "no fused op", "rewritten as"]
    assert [w for w in words if w not in text] == []


def test_the_boxes_drawn_take_the_legends_fill_and_frame():
    looks = {(fill, frame) for _, fill, frame, _, _ in box_legend()}
    t = _trace(str(NEOX))
    last = len(t.versions()) - 1
    seen = set()
    for version in (5, 26, last):
        for line in html.unescape(dot(t, View(version, "layers", "after"))).splitlines():
            if line.strip().startswith(("layer", "g_")) and "fillcolor=" in line:
                fill, frame = _attr(line, "fillcolor"), _attr(line, "color")
                seen.add(fill)
                assert (fill, frame or PLAIN_FRAME[0]) in looks, line[:200]  # no colour: Graphviz's black
    assert STATUS_COLORS[OP_GAP] in seen  # gpt-neox's final layers are drawn as the gap, in the legend's blue


# 2. boxes outside the layers


def test_embeddings_boxes_are_fused_as_explain_words_them_not_partly_fused():
    for source in ("minilm", str(ROBERTA), str(ESM)):
        t = _trace(source)
        last = len(t.versions()) - 1
        words, line = _box(t, View(last, "layers", "after"), "g_embeddings")
        assert "partly fused" not in words and YELLOW not in line, (source, words)
        assert _attr(line, "fillcolor") == STATUS_COLORS["fused"], (source, line[:200])
        said = RunVerdict.of(t).outside_in  # the CLI names the embeddings' fused ops and nothing missed there
        assert "embeddings" in said.values(), (source, said)


def test_minilms_embeddings_box_is_never_partly_fused_beside_its_not_a_candidate_norm():
    t = _trace("minilm")
    for version in range(1, len(t.versions())):
        for side in ("before", "after"):
            words, line = _box(t, View(version, "layers", side), "g_embeddings")
            assert "partly fused" not in words and YELLOW not in line, (version, side, words)


def test_a_near_miss_in_a_box_outside_the_layers_keeps_it_partly_fused():
    t = _trace(str(DEIT))
    r = next(x for s in t.steps for x in s.rejections if x.near_miss)
    g = t.final
    box = LayerGroup("g_pooler", "pooler", None, [n for n in g if n.op.value == "FusedMatMulBiasAct"][:1])
    outside = replace(r, path="pooler", layer_path="pooler")  # a refusal in no layer (its matmul's path too)
    assert outside.layer is None
    near = Overlay(rejections=(outside,))
    assert outside_status(box, near, {r.anchor: "g_pooler"}) == "partly fused"
    excused = Overlay(rejections=(outside,), standings={(r.rule, r.anchor): NOT_NEAR_MISS})
    assert outside_status(box, excused, {r.anchor: "g_pooler"}) == "fused"  # only a ○: nothing to fix
    assert outside_status(box, None, {}) == "fused"
    assert outside_status(LayerGroup("g_other", "other", None), None, {}) == ""


# 3. one "rewritten as"


def test_gpt_neox_box_says_rewritten_as_what_explain_lists_only():
    t = _trace(str(NEOX))
    listed = [x.split(" %", 1)[0] for x in RunVerdict.of(t).layers[0].rewritten]
    assert listed == ["attention", "rope", "rope"]  # the ropes qkv_columns re-made of fuse_sdpa's, credited to it
    for side in ("before", "after"):
        words, _ = _box(t, View(26, "layers", side), "layer0")
        assert "rewritten as rope×2, attention)" in words and "where" not in words, (side, words)
