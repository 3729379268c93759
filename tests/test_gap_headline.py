"""A gap in rlxviz's ops is said as what it is (a newcomer run): n3-04b's QK-norm attention, whose block rlxviz has no
form for, read "1/1 layer(s) fused as expected" and "layer 0: fused as far as rlxviz's ops go: nothing to fuse" over
a layer with no fused op at all; granite read "2/2 layer(s) fused as expected" with a note under it; and the app's
chips drew the gap as the faded ○ that README calls "nothing to fix".

Decision: the headline's "fused as expected" counts only the layers fused all the way (or as far as legal); the layers
held back only by rlxviz's ops are counted apart in the headline itself with what rlxviz lacks (`text.gap_words`); a
layer with no fused op reads "held back by rlxviz's ops: no fused op", never "nothing to fuse"; exit 0 still means
nothing in the model to change; the chips mark a gap's places `△`, not faded, apart from the ○.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clirun import run as cli_run
from inapp import opened
from test_app_near_miss_chips import app, chips

from rlxviz.app.panels import NOT_NEAR_MISS_MARK, OP_GAP_MARK
from rlxviz.app.start import StartHere
from rlxviz.passes.rules.block import QK_NORM_GAP
from rlxviz.passes.why.places import places
from rlxviz.passes.why.text import GAP_IS_THE_COMPILERS, UNCHECKED_ALONE
from rlxviz.passes.why.verdict import OP_GAP_GROUP, RunVerdict
from rlxviz.session.render import verdicts
from rlxviz.viz.overlay import before_caption

HERE = Path(__file__).parent
QK_NORM = HERE / "data" / "cases" / "n3-04b-qk-norm-full-width.rlx"
GRANITE = HERE / "fixtures" / "onnx" / "cases" / "granite.onnx"
SCALE_GAP = "FusedAttentionBlock with a non-default scale"
HELD = "held back by rlxviz's ops"
AS_FAR = "fused as far as rlxviz's ops go"

NEOX_BLOCKER = ("attn_single_user (illegal while the sdpa NaN guard moved past the head merge reads there, a reader "
                "rlxviz's own canonicalize_exported.nan_guard_moved made from your nodes: the fusion would hide the "
                "value it reads, and FusedAttentionBlock has no form that takes it in; a compiler fix, nothing in the "
                "model to change)")


def _explain(capsys, path: Path) -> tuple[int, str, dict]:
    code, text, err = cli_run(capsys, "explain", path)
    assert "Traceback" not in err, err
    jcode, out, _ = cli_run(capsys, "explain", path, "--json")
    assert jcode == code
    return code, text, json.loads(out)


def test_n3_04b_counts_the_layer_held_back_apart_and_says_no_fused_op(capsys):
    code, text, j = _explain(capsys, QK_NORM)
    head = (f"qk_norm_full_width (canonical pipeline): 0/1 layer(s) fused as expected; 1 {HELD} (rlxviz lacks "
            f"{QK_NORM_GAP}: {GAP_IS_THE_COMPILERS}; {UNCHECKED_ALONE.format(n=1)})")  # a structure miss: unchecked
    assert code == 0 and j["ok"]  # nothing in the model to change
    assert text.splitlines()[:2] == [head, f"layer 0: {HELD}: no fused op"], text
    assert "nothing to fuse" not in text and "1/1" not in text
    (lv,) = j["layers"]
    assert j["headline"] == head and lv["status"] == HELD and lv["done"] == []
    assert (j["fused_layers"], j["gap_layers"], j["checked_layers"], j["gap_forms"]) == (0, 1, 1, [QK_NORM_GAP])


def test_granite_counts_its_layers_fused_as_far_as_rlxvizs_ops_go_apart(capsys):
    code, text, j = _explain(capsys, GRANITE)
    head = (f"granite (canonical pipeline): 0/2 layer(s) fused as expected; 2 {AS_FAR} (rlxviz lacks {SCALE_GAP}: "
            "a compiler fix; a workaround in the model in 2 of them (their gap lines name it))")
    assert code == 0 and j["ok"] and j["headline"] == head and j["headline_notes"] == []
    lines = text.splitlines()
    assert lines[lines.index(head) + 1].startswith(f"layer 0: {AS_FAR}: FusedSwiGLU %"), text
    assert [d["status"] for d in j["layers"]] == [AS_FAR, AS_FAR]


def test_a_run_without_gaps_keeps_its_headline(capsys):
    code, text, j = _explain(capsys, HERE / "data" / "cases" / "n4-06c-deepnorm-alpha1-control.rlx")
    assert code == 0 and text.splitlines()[0].endswith(": 1/1 layer(s) fused as expected"), text
    assert j["gap_layers"] == 0 and j["gap_forms"] == [] and j["fused_layers"] == 1


@pytest.fixture(scope="module")
def qk_app():
    s = app(source="ir", ir_text=QK_NORM.read_text())
    s.hide_unchanged = False
    return s


def test_a_gaps_chip_mark_is_its_own_not_the_faded_one(qk_app):
    s = qk_app
    k = next(i for i, st in enumerate(s.trace.steps) if st.pass_name == "fuse_attention_block")
    p = places(s.trace, k)
    assert not p.near_misses and list(p.excused) == [OP_GAP_GROUP] and p.lacks == [QK_NORM_GAP]
    assert p.faded == {} and len(p.gaps) == 1
    row = next(r for r in s.version_rows() if r["version"] == "after fuse_attention_block")
    assert row["not_near_misses"] == {} and row["op_gaps"] == p.gaps and row["lacks"] == [QK_NORM_GAP]
    chip = chips(s)["after fuse_attention_block"]
    assert NOT_NEAR_MISS_MARK not in chip and "✗" not in chip
    mark = re.search(rf"<span class='rv-op-gap' title='([^']*)'>{OP_GAP_MARK}1</span>", chip)
    assert mark is not None, chip
    # the headline's words, its condition too: no what-if checks the fix at `qkv_packed` (`Places.gap_unchecked`)
    assert mark.group(1).startswith(f"rlxviz&#x27;s ops lack {QK_NORM_GAP}: {GAP_IS_THE_COMPILERS}; "
                                    f"{UNCHECKED_ALONE.format(n=1)}. 1 at 1 node"), mark.group(1)
    assert "opacity" not in mark.group(0)  # not faded: something to fix, in rlxviz
    assert before_caption(s.trace.steps[k], s.trace).endswith(", △1 place at a gap in rlxviz's ops")


def test_the_layer_box_and_the_start_strip_say_the_verdicts_words(qk_app):
    s = qk_app
    (v,) = verdicts(s.trace).values()
    assert v.word == HELD and v.none_made == "no fused op"
    start = StartHere(state=s, show_why=lambda: None)
    said = start._fused_words(0)
    # the headline's words for this layer, its condition too (`text.layer_fix_words`: no what-if checks the fix)
    assert said.startswith(f"Layer 0 {HELD} (rlxviz lacks {QK_NORM_GAP}: {GAP_IS_THE_COMPILERS}; "
                           f"{UNCHECKED_ALONE.format(n=1)})"), said
    assert RunVerdict.of(s.trace).headline.endswith(f"1 {HELD} (rlxviz lacks {QK_NORM_GAP}: {GAP_IS_THE_COMPILERS}; "
                                                    f"{UNCHECKED_ALONE.format(n=1)})")


def test_readme_and_app_docs_name_the_gap_mark():
    readme = (HERE.parent / "README.md").read_text()
    app_md = (HERE.parent / "docs" / "app.md").read_text()
    for text in (readme, app_md):
        flat = " ".join(text.split())
        assert f"{OP_GAP_MARK} marks a gap in rlxviz's ops" in flat, flat[:2000]
    flat = " ".join(readme.split())
    assert "nothing in the model to change" in flat and "keeps exit 0" in flat


def test_a_gap_whose_fix_alone_is_not_enough_says_what_fails_next(capsys):
    """gpt-neox: the partial-rotary gap's compiler fix alone leaves `attn_single_user` (illegal: the exporter's NaN
    guard reads the attention output) standing; the headline said "nothing in the model to change" while each layer's
    line said "alone it is not enough" (`text.gap_words`)."""
    case = HERE / "fixtures" / "onnx" / "cases" / "gpt-neox.legacy-sdpa.onnx"
    code, text, _ = cli_run(capsys, "explain", case, "--inputs", case.with_name("gpt-neox.legacy-sdpa_io.npz"))
    head = next(ln for ln in text.splitlines() if "(canonical pipeline)" in ln)
    # the compiler fix is not claimed enough; only the blocker, a reader rlxviz made, says the model has nothing to
    # change (`caveat.MADE_READERS`, issue 39)
    assert code == 0 and "nothing in the model to change" not in head.replace(NEOX_BLOCKER, ""), head
    assert head.endswith(f"a compiler fix; alone it is not enough in 2 of them: {NEOX_BLOCKER} fails next)"), head
    assert all(f"alone it is not enough: {NEOX_BLOCKER} fails next" in ln
               for ln in text.splitlines() if "rlxviz has no FusedAttentionBlock with partial rotary" in ln)


def test_the_start_strip_says_when_the_fix_alone_is_not_enough(monkeypatch):
    """Newcomer run 36: glm.dynamo-eager's headline says the partial-rotary RoPE fix alone is not enough
    (`rope_halves` fails next); the start strip's layer line said "a compiler fix, nothing in the model to change".
    It now words the layer's gap records as the headline does (`text.layer_fix_words`)."""
    s = opened(monkeypatch, HERE / "fixtures" / "onnx" / "zoo" / "glm.dynamo-eager.onnx")
    said = StartHere(state=s, show_why=lambda: None)._fused_words(0)
    head = RunVerdict.of(s.trace).headline
    assert "alone it is not enough in 2 of them: rope_halves" in head, head
    assert "; alone it is not enough in 1 of them: rope_halves" in said and GAP_IS_THE_COMPILERS not in said, said
