"""A gap whose compiler fix alone is not enough, with a pattern rlxviz does not recognize next, is not "as far as
rlxviz's ops go".

A newcomer's run read esm.dynamo-eager's layers as "fused as far as rlxviz's ops go" (exit 0) while the same headline
said "alone it is not enough in 2 of them: qkv_packed (not recognized) fails next": with the op form added, rlxviz's
own `qkv_packed` pattern would still refuse the layer (the head split between the QKV narrow and the RoPE), so the op
alone is not what holds it back. Decision: the blocker's refusal kind is data (`OpGap.blocker_kind`), and a layer
whose gap leaves a `not recognized` form next is "fused as far as rlxviz's ops and patterns go" (or "held back by
rlxviz's ops and patterns"): still nothing in the model to change (exit 0), but both of rlxviz's parts named
(`OpGap.pattern_miss`). A gap whose fix leaves a refusal whose readers rlxviz's own rewrite made (gpt-neox's NaN guard
that `nan_guard_moved` moved past the head merge) is no pattern miss (issue 39: "patterns" read as a form of the model
rlxviz does not recognize): it keeps the ops words, its blocker naming the rewrite that made the reader, that the
block cannot take it in and that nothing in the model is to change (`caveat.MADE_READERS`; `--json`'s
`gaps[].blocker_made_by`). A gap whose fix leaves the model's own use or term next keeps its words
(the caveat says what fails next). Nor is a blocker that is itself a gap in rlxviz's ops of the layer (newcomer run
19): gptj's interleaved RoPE (`rope_halves`, a form the block lacks) behind its partial rotary, esm.qdyn's
`qkv_packed` where its integer-matmul projections are a gap of the whole pass: the layer is held back by rlxviz's
ops alone, and the caveat still says what fails next.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.passes.refusal_kinds import NOT_RECOGNIZED
from rlxviz.passes.why.text import (
    FUSED_AS_FAR_AS_OPS,
    HELD_BACK_BY_LEGAL_AND_OPS,
    HELD_BACK_BY_OPS,
    gap_status,
)
from rlxviz.passes.why.verdict import RunVerdict

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
PATTERNS = "fused as far as rlxviz's ops and patterns go"
QDYN_BLOCKER = ("qkv_packed (a gap in rlxviz's ops: FusedAttentionBlock over integer-matmul Q/K/V projections "
                "(dynamic quantization))")
GPTJ_BLOCKER = "rope_halves (a gap in rlxviz's ops: FusedAttentionBlock with interleaved RoPE)"
"""What fails next named as the gap it is (`caveat.GAP_BLOCKER`)."""


def test_gap_status_words():
    """The plain words stay the constants front ends and docs know; `patterns` adds `and patterns` to each."""
    assert gap_status(True) == FUSED_AS_FAR_AS_OPS
    assert gap_status(False) == HELD_BACK_BY_OPS
    assert gap_status(False, legal=True) == HELD_BACK_BY_LEGAL_AND_OPS
    assert gap_status(True, legal=True) == "fused as far as legal and rlxviz's ops go"
    assert gap_status(True, patterns=True) == PATTERNS
    assert gap_status(False, patterns=True) == "held back by rlxviz's ops and patterns"
    assert gap_status(True, legal=True, patterns=True) == "fused as far as legal, rlxviz's ops and patterns go"
    assert gap_status(False, legal=True, patterns=True) == "held back by what is legal, rlxviz's ops and patterns"


@pytest.mark.parametrize("name", ["esm.dynamo-eager"])
def test_a_recognizer_miss_behind_a_gap_names_the_patterns(name):
    """ESM (head split before the RoPE): the gap's fix alone leaves `not recognized`; the layers, the headline and
    `--json` say `ops and patterns`; exit stays 0."""
    trace = Pipeline.canonical().run(load_onnx(ZOO / f"{name}.onnx", seq=8).graph)
    run = RunVerdict.of(trace, model=name)
    assert run.ok and run.exit_status == 0
    for lv in run.layers:
        assert lv.gap_only and lv.pattern_blocked, lv.gaps
        assert any(g.blocker_kind == NOT_RECOGNIZED and g.blocker.endswith(f"({NOT_RECOGNIZED})") for g in lv.gaps)
        assert lv.status == PATTERNS
    assert f"{len(run.layers)} {PATTERNS} (rlxviz lacks " in run.headline
    assert FUSED_AS_FAR_AS_OPS + " (" not in run.headline


def test_cli_text_and_json_agree_on_esm(capsys):
    path = ZOO / "esm.dynamo-eager.onnx"
    code, out, err = cli_run(capsys, "explain", path, "--seq", "8")
    assert code == 0, err
    assert f"layer 0: {PATTERNS}: " in out
    code, got, err = cli_run(capsys, "explain", path, "--seq", "8", "--json")
    assert code == 0, err
    data = json.loads(got)
    assert [lv["status"] for lv in data["layers"]] == [PATTERNS, PATTERNS]
    assert all(g["blocker_kind"] == NOT_RECOGNIZED for lv in data["layers"] for g in lv["gaps"])
    assert data["headline"] in out


NEOX = ZOO.parent / "cases" / "gpt-neox.legacy-sdpa.onnx"
MOVED = "canonicalize_exported.nan_guard_moved"


def test_a_reader_rlxviz_made_is_no_pattern_miss():
    """gpt-neox: the gap's fix alone leaves `attn_single_user` illegal, only because of a reader rlxviz's own
    `canonicalize_exported.nan_guard_moved` made (`caveat.made_readers`). The layers read "ops and patterns", as if the
    model had a form rlxviz's patterns miss; nothing of the model goes unrecognized: the block cannot take in the NaN
    guard rlxviz moved onto the attention's output. Decision (issue 39): the blocker stays rlxviz's own
    (`OpGap.blocker_own`) and names the rewrite (`OpGap.blocker_made_by`), but is no pattern miss: the layers are fused
    as far as rlxviz's ops go, and the words say that nothing in the model is to change."""
    trace = Pipeline.canonical().run(load_onnx(NEOX, seq=8).graph)
    run = RunVerdict.of(trace)
    assert run.ok and run.exit_status == 0
    assert run.layers and all(lv.gap_only and not lv.pattern_blocked for lv in run.layers)
    assert all(lv.status == FUSED_AS_FAR_AS_OPS for lv in run.layers)
    mine = [g for lv in run.layers for g in lv.gaps if g.blocker]
    assert len(mine) == 2 and all(g.blocker_own and g.blocker_made_by == MOVED and not g.pattern_miss for g in mine)
    assert all(f"a reader rlxviz's own {MOVED} made from your nodes" in g.blocker for g in mine)
    assert all(g.blocker.endswith("FusedAttentionBlock has no form that takes it in; a compiler fix, nothing in the "
                                  "model to change)") for g in mine)
    assert f"2 {FUSED_AS_FAR_AS_OPS} (rlxviz lacks " in run.headline and "patterns" not in run.headline


def test_neox_text_json_and_why_tab_say_ops_alone(capsys):
    """The CLI's text, `-v`, `--json` and the app's Why drawing title read the same status and blocker."""
    import html

    from rlxviz.session.render import View, dot

    code, out, err = cli_run(capsys, "explain", NEOX, "--seq", "8", "-v")
    assert code == 0, err
    assert f"layer 0: {FUSED_AS_FAR_AS_OPS}: " in out and "patterns" not in out
    code, got, err = cli_run(capsys, "explain", NEOX, "--seq", "8", "--json")
    data = json.loads(got)
    assert [lv["status"] for lv in data["layers"]] == [FUSED_AS_FAR_AS_OPS] * 2
    assert all(g["blocker_made_by"] == MOVED and g["blocker_own"] for lv in data["layers"] for g in lv["gaps"])
    assert data["headline"] in out
    trace = Pipeline.canonical().run(load_onnx(NEOX, seq=8).graph)
    k = next(k for k, s in enumerate(trace.steps) if s.pass_name == "fuse_attention_block")
    drawn = html.unescape(dot(trace, View(k, "full", "why", 0)))
    assert f'label="{FUSED_AS_FAR_AS_OPS}: △ fuse_attention_block.qkv_attention_out @ %' in drawn  # the title
    # the △ tooltips carry the blocker's words (`places.Places.gaps`), and no view says "patterns"
    assert f"a reader rlxviz's own {MOVED} made from your nodes" in drawn and "patterns" not in drawn


def test_a_blocker_of_the_models_own_is_not_rlxvizs():
    """A blocker that is the model's is not rlxviz's own doing: deit's `sum_single_user` compiler fix (a two-output
    FusedResidualLN) leaves `residual_same_shape (not a candidate)` (the model's shapes), so its group carries the
    blocker with `blocker_own` False, and a gap with such a blocker would keep the ops words."""
    from rlxviz.passes.why.excused import excused_misses
    from rlxviz.passes.why.verdict import judged_kind

    trace = Pipeline.canonical().run(load_onnx(ZOO.parent / "cases" / "deit.ortopt.onnx", seq=8).graph)
    _, ex = excused_misses(trace, judged_kind(trace, 1)[1], 1)
    mine = [x for x in ex.values() if x.blocker]
    assert mine and all(x.blocker == "residual_same_shape (not a candidate)" and not x.blocker_own for x in mine)


ESM_QDYN = ZOO.parent / "cases" / "esm.qdyn.onnx"


def test_esm_qdyn_gap_carries_the_blocker_the_v_check_finds(capsys):
    """esm.qdyn: one refusal (`default_scale`) at two gaps (the layer's trait integer_qkv and the scale's own). `-v`'s
    check of the scale fix says `then qkv_packed (not recognized) fails`, while the verdict, headline and `--json`
    said "as far as rlxviz's ops go: a compiler fix, nothing in the model to change": the pass lacking the whole
    product (`policy.lacks_product`) hid the check. Decision: one check (`caveat.fix_blocker`) for every view; the
    blocker sits on the gap whose fix it checked (the guard's own), not the trait's."""
    trace = Pipeline.canonical().run(load_onnx(ESM_QDYN, seq=8).graph)
    run = RunVerdict.of(trace)
    for lv in run.layers:
        # qkv_packed fails for the integer-matmul projections, the layer's other gap: no pattern of rlxviz's misses
        assert lv.gap_only and not lv.pattern_blocked and lv.status == FUSED_AS_FAR_AS_OPS, lv.gaps
        own = [g for g in lv.gaps if g.by == "default_scale"]
        trait = [g for g in lv.gaps if g.by.endswith("(integer_qkv)")]  # `declarations.trait_named`
        assert own and own[0].blocker == QDYN_BLOCKER and not own[0].blocker_own
        assert trait and not trait[0].blocker
    assert "a fix alone is not enough in 2 of them: with the fix for " in run.headline
    assert f" alone, {QDYN_BLOCKER} fails next" in run.headline
    assert "nothing in the model to change" not in run.headline
    code, out, err = cli_run(capsys, "explain", ESM_QDYN, "--seq", "8", "-v")
    assert code == 0, err
    assert "then qkv_packed (not recognized) fails" in out
    assert f"layer 0: {FUSED_AS_FAR_AS_OPS}: " in out
    # the gap line joins both gaps' fixes: its caveat says whose was checked (`caveat.CAVEAT_OF`)
    assert f"the default_scale fix alone is not enough: {QDYN_BLOCKER} fails next" in out
    code, got, err = cli_run(capsys, "explain", ESM_QDYN, "--seq", "8", "--json")
    data = json.loads(got)
    assert [lv["status"] for lv in data["layers"]] == [FUSED_AS_FAR_AS_OPS, FUSED_AS_FAR_AS_OPS]
    assert not any(g["blocker_own"] for lv in data["layers"] for g in lv["gaps"])


def test_a_blocker_that_is_a_gap_itself_is_no_pattern_miss():
    """GPT-J: the n_rot fix alone leaves `rope_halves` (interleaved RoPE), a form FusedAttentionBlock lacks too: the
    layers are fused as far as rlxviz's ops go, and the headline's caveat names what fails next."""
    trace = Pipeline.canonical().run(load_onnx(ZOO / "gptj.dynamo-eager.onnx", seq=8).graph)
    run = RunVerdict.of(trace)
    assert run.ok and run.exit_status == 0
    for lv in run.layers:
        assert lv.gap_only and not lv.pattern_blocked and lv.status == FUSED_AS_FAR_AS_OPS, lv.gaps
        rotary = [g for g in lv.gaps if g.by == "rope_full_rotary"]
        assert rotary and rotary[0].blocker == GPTJ_BLOCKER and not rotary[0].blocker_own
    assert "a fix alone is not enough in 2 of them: with the fix for " in run.headline
    assert f" alone, {GPTJ_BLOCKER} fails next" in run.headline
    assert PATTERNS not in run.headline


def test_esm_qdyn_why_title_carries_the_caveat():
    """The app's Why drawing title of esm.qdyn's layer reads the same check: its caveat follows the place's words."""
    import html

    from rlxviz.session.render import View, dot

    trace = Pipeline.canonical().run(load_onnx(ESM_QDYN, seq=8).graph)
    title = html.unescape(dot(trace, View(len(trace.steps), "full", "why", 0)))
    assert title.startswith(f"{FUSED_AS_FAR_AS_OPS}: ") or f"{FUSED_AS_FAR_AS_OPS}: △" in title, title
    assert f"alone it is not enough: {QDYN_BLOCKER} fails next" in title, title
