"""The drawing, its hover text and the node inspector mark a place held by the model's own term once, at its anchor
(newcomer, t5.encdec). T5's decoder cross-attention (%324, %326) stands `○` with `self_attention` (Q and K/V from
different inputs), its `default_scale` gap's fix alone uncovering that term (`standing.held_by`), as `explain` says:
`self_attention [the model's own term]: ...; it also runs into a gap in rlxviz's ops, ... (default_scale)`. The before
pane of `fuse_attention_block` marked %324 `○ the model's own term: default_scale` (the gap's guard as the term), put
`○ the model's own term: self_attention` on the Q-side rms_norm %313 (the guard's `subject`), listed two `○` entries
in %324's hover text and the place twice in the inspector. Now: one `○ ...: self_attention` mark on the attention,
naming the gap it also runs into, nothing on the norms; the self-attention places (%319, %321, %325) keep `△`. The
hover text's `in layer 0` of a decoder node names its stack (`decoder layer 0`), as the inspector does."""

from __future__ import annotations

import html
import re

import pytest
from test_held_by_model_term import T5
from test_inspector_layer_label import _inspect, _load

from rlxviz.app.explain import node_decisions
from rlxviz.session.render import View, dot

CROSS, SELF, NORMS = (324, 326), (319, 321, 325), (313, 316)
TERM = "○ the model's own term: self_attention"


@pytest.fixture(scope="module")
def t5():
    return _load(T5.stem)


def _nodes(text: str) -> dict[int, str]:
    """Node id -> its DOT statement (label and tooltip) in `text`."""
    return {int(m.group(1)): m.group(0) for m in re.finditer(r"^\s*n(\d+) \[.*$", text, re.M)}


def _block_step(s) -> int:
    return next(k for k, x in enumerate(s.trace.steps) if x.pass_name == "fuse_attention_block")


def test_the_before_pane_marks_a_held_place_once_at_its_attention(t5):
    k = _block_step(t5)
    nodes = _nodes(html.unescape(dot(t5.trace, View(version=k + 1, side="before"))))
    for a in CROSS:
        label, tip = nodes[a].split(" tooltip=", 1)
        assert TERM in label and "default_scale" in label, label  # the term, then the gap it also runs into
        assert "○ the model's own term: default_scale" not in label, label
        assert tip.count("○ THE MODEL'S OWN TERM") == 1 and "guard self_attention" in tip, tip
        assert "guard default_scale" not in tip and "it also runs into a gap in rlxviz's ops, " in tip, tip
        assert "— in decoder layer " in tip and "— in layer " not in tip, tip
    for n in NORMS:
        assert "self_attention" not in nodes[n].split(" tooltip=", 1)[0], nodes[n]
    for a in SELF:
        assert "△ gap in rlxviz's ops: default_scale" in nodes[a], nodes[a]


def test_the_inspector_lists_a_held_place_once_and_not_on_its_norm(t5):
    for a in CROSS:
        ds = [d for d in node_decisions(t5.trace, a) if d["rule"].startswith("fuse_attention_block")]
        assert [(d["guard"], d["standing"]) for d in ds] == [("self_attention", "the model's own term")], ds
        assert "it also runs into a gap in rlxviz's ops" in ds[0]["standing_why"], ds
    for n in NORMS:
        assert not [d for d in node_decisions(t5.trace, n) if d["guard"] == "self_attention"], n
    # the version "after fuse_attention_block", whose before pane draws the step's marks
    t5.version = next(i for i, x in enumerate(t5.version_labels) if "fuse_attention_block" in x)
    text = _inspect(t5, 324).replace("\\", "")
    entries = [x for x in text.splitlines() if x.startswith("- ") and "fuse_attention_block.qkv_attention_out" in x]
    assert len(entries) == 1 and "guard **self_attention** (the model's own term)" in entries[0], entries
    assert "**default_scale**" not in text and "default_scale (the model's own term)" not in text, text


def test_the_drawing_words_a_held_place_from_its_data_not_from_the_standing_text(monkeypatch):
    """`overlay.held_places` hands out `standing.held_place`'s `Held` (the term's refusal, the gap's guard, its words):
    with the standing's text worded otherwise (`Held.why`), the drawing's words for the place stay the gap's, so
    nothing recovers them from that text (they once were, by stripping the term's words off it)."""
    from test_encoder_decoder import encoder_decoder

    from rlxviz.passes import Pipeline
    from rlxviz.passes.refusal_kinds import MODEL_TERM
    from rlxviz.passes.why.caveat import held_also
    from rlxviz.passes.why.standing import Held, standing
    from rlxviz.viz.overlay import gap_caveats, held_places, worded

    monkeypatch.setattr(Held, "why", property(lambda h: f"held by its own term, worded otherwise [{h.guard}]"))
    t = Pipeline.canonical().run(encoder_decoder("t5"))  # a fresh run: no standing made before the patch
    step = next(s for s in t.steps if s.pass_name == "fuse_attention_block")
    held = held_places(t, step)
    assert held, [r.guard for r in step.rejections]
    for (rule, anchor), h in held.items():
        head = next(r for r in step.rejections if (r.rule, r.anchor) == (rule, anchor) and r.headline)
        assert standing(t, head) == (MODEL_TERM, f"held by its own term, worded otherwise [{h.guard}]")
        assert h.guard == head.guard == "default_scale" and h.term is not None and h.term.guard == "self_attention"
        also = held_also(list(h.gaps), h.guard, head.pass_name)
        assert h.also == also and also.startswith("it also runs into a gap in rlxviz's ops, "), also
        (mark,) = [r for r in worded(t, step) if (r.rule, r.anchor) == (rule, anchor)]
        assert mark.guard == "self_attention" and mark.message.endswith(f"; {also}"), mark.message
        assert gap_caveats(t, step)[(rule, anchor)] == "it also runs into a gap in rlxviz's ops: default_scale"
