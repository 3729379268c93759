"""A gap place whose compiler fix alone is not enough says so in its drawing, in the text's words.

esm.dynamo-eager's attention (`fuse_attention_block.qkv_attention_out`) is a gap in rlxviz's ops: no
FusedAttentionBlock with the scale applied to Q before RoPE (`default_scale`). `explain -v`'s headline adds that the
fix alone is not enough: `qkv_packed (not recognized) fails next`. That blocker is none of the place's drawn
refusals, so no follower mark (`test_gap_follower_marks`) said it: the attention node read `△ gap in rlxviz's ops:
default_scale` alone, and the Why title named only `default_scale`.

Decision: the place's `△` mark, its tooltip and the Why title carry the text's caveat
(`passes.why.caveat.caveat_words`, via `Overlay.caveats`) where no follower's mark says it; gpt-neox, whose
`attn_single_user` follower says it, is drawn as before.
"""

from __future__ import annotations

import html
from pathlib import Path

from clirun import run as cli_run
from test_gap_follower_marks import _nodes
from test_near_miss_rule import shared_trace, step_index

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.passes.why.verdict import why_step
from rlxviz.session.render import View, dot, picture

HERE = Path(__file__).parent
ESM = HERE / "fixtures" / "onnx" / "zoo" / "esm.dynamo-eager.onnx"
NEOX = HERE / "fixtures" / "onnx" / "cases" / "gpt-neox.legacy-sdpa.onnx"
CAVEAT = "alone it is not enough: qkv_packed (not recognized) fails next"


def test_esms_gap_mark_says_its_fix_alone_is_not_enough_as_the_text_does(capsys):
    code, out, _ = cli_run(capsys, "explain", ESM, "-v")
    assert code == 0 and "alone it is not enough in 2 of them: qkv_packed (not recognized) fails next" in out
    t = shared_trace(ESM)
    k = step_index(t, "fuse_attention_block")
    nodes = _nodes(dot(t, View(k + 1, "full", "before", None)))
    anchors = {r.anchor for r in t.steps[k].rejections if r.guard == "default_scale"}
    assert len(anchors) == 2
    for a in anchors:
        label, tip = nodes[f"n{a}"]
        assert "△ gap in rlxviz's ops: default_scale; | alone it is not enough: | qkv_packed (not recognized) " \
               "fails next" in label, label
        assert CAVEAT in tip, tip


def test_esms_why_title_says_the_caveat_in_the_app_and_the_render_function():
    t = shared_trace(ESM)
    for layer in (0, 1):
        _, ov, _ = picture(t, View(len(t.steps), "full", "why", layer))
        assert t.steps[why_step(t, layer)].pass_name == "fuse_attention_block"
        assert f"default_scale (gap in rlxviz's ops); {CAVEAT}; " in ov.title, ov.title
    s = AppState(runner=Runner(background=False))
    s.load_upload({ESM.name: ESM.read_bytes()})
    s.selected_layer = 0
    assert CAVEAT in html.unescape(s.svg_why())


def test_neoxs_caveat_stays_on_its_follower_alone():
    t = shared_trace(NEOX)
    k = step_index(t, "fuse_attention_block")
    nodes = _nodes(dot(t, View(k + 1, "full", "before", 1)))
    gap_marks = [lb for lb, _ in nodes.values() if "△ gap in rlxviz's ops: rope_full_rotary" in lb]
    assert gap_marks and all("alone it is not enough" not in lb for lb in gap_marks), gap_marks
    assert any("△ fix of rope_full_rotary alone is not enough: | attn_single_user (illegal) fails next" in lb
               for lb, _ in nodes.values())
