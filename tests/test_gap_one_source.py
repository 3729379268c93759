"""One source for which failing guards at a place are gaps in rlxviz's ops (a newcomer run on gptj.dynamo-eager).

gptj's attention place (layer 1, %258) gave three lists: `explain` and `--json` one gap (`rope_full_rotary`, partial
rotary; `rope_halves` only `also fails`), the app's Why title `rope_full_rotary, rope_halves (2 gaps in rlxviz's ops:
...)` with its drawing marking `△ gap in rlxviz's ops: rope_halves`, and the Model Explorer export `△ gap in rlxviz's
ops` on `qkv_split` and `qkv_user_count` (which `-v` calls not recognized / illegal). Decision: the verdict is the
reference (`LayerVerdict.gaps`, from the place's headline refusal); `why.standing.place_gap_names` names those gaps
and `why.standing.gap_followers` every further failing guard, which each view words as the drawing does
(`viz.overlay.follower_note`: `beside the gap rope_full_rotary: rope_halves (not recognized) also fails, no gap
itself`). Since `fuse_shared_input_matmul` merges Q/K/V alone (tests/test_shared_input_attention_group.py), the
further guard at gptj's attention is `rope_halves` alone, and the n_rot fix's caveat names it (`fix of
rope_full_rotary alone is not enough: rope_halves (not recognized) fails next`); the layer's other gap is its MLP's
tanh-GELU epilogue (`epilogue_activation`), a pass earlier.
"""

from __future__ import annotations

import functools
import html
import json
from pathlib import Path

from clirun import run as cli_run

from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline, Trace
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.session.render import View, dot
from rlxviz.viz.model_explorer import trace_json

GPTJ = Path(__file__).parent / "fixtures" / "onnx" / "zoo" / "gptj.dynamo-eager.onnx"
FOLLOWERS = ("rope_halves", "qkv_split", "qkv_user_count")
PARTIAL, TANH = "FusedAttentionBlock with partial rotary RoPE", "FusedMatMulBiasAct with a gelu_tanh epilogue"


@functools.cache
def _trace() -> Trace:
    return Pipeline.canonical().run(load_onnx(GPTJ, seq=8).graph)


def test_the_verdict_names_one_gap_at_gptjs_attention(capsys):
    run = RunVerdict.of(_trace())
    at_attention = [g.by for g in run.layers[1].gaps if g.rule.startswith("fuse_attention_block.")]
    assert at_attention == ["rope_full_rotary"]
    assert sorted(g.by for g in run.layers[1].gaps) == ["epilogue_activation", "rope_full_rotary"]
    code, got, err = cli_run(capsys, "explain", GPTJ, "--seq", "8", "--json")
    assert code == 0, err
    assert sorted(json.loads(got)["gap_forms"]) == [PARTIAL, TANH]


def test_the_why_title_and_drawing_name_the_verdicts_gaps_alone():
    t = _trace()
    src = html.unescape(dot(t, View(len(t.steps), "full", "why", 1)))
    title = src[src.index('label="'):].split('"')[1]
    # the Why pane draws the first pass with a gap (the epilogue) and names the later one it does not draw
    assert "@ %167: epilogue_activation (gap in rlxviz's ops);" in title, title
    assert f"also △ in fuse_attention_block, a later pass (not drawn): {PARTIAL} (" in title, title
    assert "3 gaps in rlxviz's ops" not in src
    for guard in FOLLOWERS:
        assert f"gap in rlxviz's ops: {guard}" not in src
    k = next(k for k, s in enumerate(t.steps) if s.pass_name == "fuse_attention_block")
    src = html.unescape(dot(t, View(k + 1, "full", "before", 1)))
    assert "△1 place at a gap in rlxviz's ops" in src
    assert "this guard is that blocker, no gap itself: fuse_attention_block.qkv_attention_out [guard] guard " \
           "rope_halves" in src
    for guard in FOLLOWERS:
        assert f"gap in rlxviz's ops: {guard}" not in src


def test_the_model_explorer_export_marks_followers_as_the_drawing_words_them():
    t = _trace()
    values = [a["value"] for g in trace_json(t, "final")["graphs"] for n in g["nodes"] for a in n["attrs"]
              if a["key"].startswith("rejected_") and "fuse_attention_block.qkv_attention_out" in a["value"]]
    gaps = [v for v in values if v.startswith("△ gap in rlxviz's ops: ")]
    assert gaps and all(": rope_full_rotary (" in v for v in gaps), gaps
    mine = [v for v in values if "qkv_attention_out: rope_halves (" in v]
    assert mine and all(v.startswith("△ fix of rope_full_rotary alone is not enough: rope_halves (not recognized) "
                                     "fails next") for v in mine), mine
    assert not [v for v in values if "qkv_split" in v or "qkv_user_count" in v], values
