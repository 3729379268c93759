"""A drawing's marks at a place that is a gap in rlxviz's ops say what the text says (a newcomer's run).

gpt-neox's attention place (`fuse_attention_block.qkv_attention_out`, layer 1) is a gap: rlxviz has no
FusedAttentionBlock with partial rotary RoPE (`rope_full_rotary`). `explain` and the Why tab add that the gap's
compiler fix alone is not enough: `attn_single_user (illegal: read there by the sdpa NaN guard ...) fails next`. The
before pane marked the attention and the NaN guard's nodes `△ gap in rlxviz's ops: attn_single_user`, a second gap by
its words, and marked `q_rope` alone though `k_rope` rotates 4 of 16 dims as well.

Decision: a further failing guard of a gap place that is no gap itself (`passes.why.standing.gap_followers`) is drawn
as the text words it: the blocker that fails next once the gap's fix alone is applied (its tooltip carries the text's
caveat whole), else one more guard the candidate also fails, never the place's gap group with its guard. The RoPE
guards name and highlight every rotation that fails (`rules.block._rope_guard`), Q's and K's both.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from clirun import run as cli_run
from test_near_miss_rule import shared_trace, step_index

from rlxviz.session.render import View, dot
from rlxviz.viz.overlay import Overlay

HERE = Path(__file__).parent
NEOX = HERE / "fixtures" / "onnx" / "cases" / "gpt-neox.legacy-sdpa.onnx"
DEEPNORM = HERE / "data" / "cases" / "n4-06-deepnorm-residual.rlx"
RULE = "fuse_attention_block.qkv_attention_out"


def _nodes(drawn: str) -> dict[str, tuple[str, str]]:
    """DOT node name -> (its label's bold lines joined by ' | ', its tooltip), unescaped."""
    out = {}
    for m in re.finditer(r'^\s*(n\d+) \[label=<(.*)> .*?tooltip="((?:[^"\\]|\\.)*)"', drawn, re.M):
        bold = [html.unescape(b) for b in re.findall(r"<B>(?:<I>)?([^<]*)", m.group(2))]
        out[m.group(1)] = (" | ".join(bold), html.unescape(m.group(3)))
    return out


def test_neoxs_next_blocker_is_drawn_as_the_text_words_it_never_as_a_gap(capsys):
    t = shared_trace(NEOX)
    k = step_index(t, "fuse_attention_block")
    drawn = dot(t, View(k + 1, "full", "before", 1))
    nodes = _nodes(drawn)
    assert "gap in rlxviz's ops: attn_single_user" not in html.unescape(drawn)
    (place,) = [r for r in t.steps[k].rejections if r.guard == "attn_single_user" and r.layer == 1]
    marked = {f"n{i}" for i in (place.anchor, *place.offending)}  # the attention and the NaN guard's isnan, where
    assert len(marked) == 3
    for n in marked:
        label, tip = nodes[n]
        assert "△ fix of rope_full_rotary alone is not enough: | attn_single_user (illegal) fails next" in label, label
    code, out, _ = cli_run(capsys, "explain", NEOX)
    assert code == 0
    caveat = re.search(r"alone it is not enough: attn_single_user \(illegal while [^)]*\) fails next", out).group(0)
    assert all(caveat in nodes[n][1] for n in marked)  # the tooltip carries the text's own words


def test_both_of_neoxs_partial_rotations_carry_the_gap_mark(capsys):
    t = shared_trace(NEOX)
    k = step_index(t, "fuse_attention_block")
    (r,) = [r for r in t.steps[k].rejections if r.guard == "rope_full_rotary" and r.layer == 1]
    ropes = {r.bindings["q_rope"], r.bindings["k_rope"]}
    assert set(r.offending) == ropes and r.subject == r.bindings["q_rope"]
    nodes = _nodes(dot(t, View(k + 1, "full", "before", 1)))
    for i in ropes:
        assert "△ gap in rlxviz's ops: rope_full_rotary" in nodes[f"n{i}"][0]
    code, out, _ = cli_run(capsys, "explain", NEOX)
    assert code == 0 and "and k_rope (node 247, model.layers.1.attention) rotate 4 of 16 dims per head" in out


def test_a_further_guard_of_a_gap_place_is_no_gap_itself():
    t = shared_trace(DEEPNORM)
    k = step_index(t, "fuse_transformer_layer")
    s = t.steps[k]
    ov = Overlay.before(s, trace=t)
    place = (s.rejections[0].rule, s.rejections[0].anchor)
    assert ov.followers == {(*place, "ln1_operand_order"): "", (*place, "ln2_operand_order"): ""}
    drawn = html.unescape(dot(t, View(k + 1, "full", "before")))
    assert "gap in rlxviz's ops: ln1_operand_order" not in drawn and "ln1_operand_order (not recognized) also fails" \
        in drawn
    assert "△ gap in rlxviz's ops: ln1_residual_scaled" in drawn  # the gaps keep their mark


def test_a_gap_place_with_every_guard_a_gap_has_no_followers():
    t = shared_trace(HERE / "fixtures" / "onnx" / "cases" / "esm.qdyn.onnx")
    s = t.steps[step_index(t, "fuse_attention_block")]
    ov = Overlay.before(s, trace=t)
    assert ov.gaps and ov.followers == {}
