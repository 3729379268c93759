"""A gap whose compiler fix alone would only uncover the model's own term is no compiler fix (newcomer, t5.encdec).

T5's decoder cross-attention (EncDecAttention) is refused first by `default_scale` (FusedAttentionBlock has no scale
attribute: a gap in rlxviz's ops), and next by `self_attention` (Q and K/V from different inputs: the model's own
term). The chips counted it `△` (a compiler fix), its gap line said "alone it is not enough: self_attention (the
model's own term) fails next", and the headline said the fix is not enough "in 2 of them", while marian's and bart's
same cross-attention, refused by `self_attention` first, stands `○` and their decoder layers are "fused as expected".
The place is held by the model's own structure: it stands `○` with the model's own terms, its line naming the gap it
also runs into, and the headline counts a fix as not enough only where something other than the model's own term
still refuses after it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import case_trace
from clirun import run as cli_run
from test_encoder_decoder import encoder_decoder

from rlxviz.passes import Pipeline
from rlxviz.passes.refusal_kinds import MODEL_TERM
from rlxviz.passes.report import in_context
from rlxviz.passes.trace import Trace
from rlxviz.passes.why.places import places
from rlxviz.passes.why.standing import held_by, place_gap_names, standing
from rlxviz.passes.why.verdict import OP_GAP_GROUP, RunVerdict

T5 = Path(__file__).parent / "fixtures" / "onnx" / "zoo" / "t5.encdec.onnx"
NOT_ENOUGH = "alone it is not enough"
ALSO = "it also runs into a gap in rlxviz's ops, FusedAttentionBlock with a non-default scale (default_scale)"


@pytest.fixture(scope="module")
def t5() -> Trace:
    return case_trace(T5)


def _block_heads(trace: Trace) -> dict[int, tuple[str, object]]:
    """Anchor -> (path, standing group) of each headline refusal of fuse_attention_block."""
    return {r.anchor: (r.path, (standing(trace, r) or ("near-miss",))[0]) for r in trace.rejections
            if r.rule.startswith("fuse_attention_block") and r.headline}


def _block_step(trace: Trace) -> int:
    return next(k for k, s in enumerate(trace.steps) if s.pass_name == "fuse_attention_block")


def test_t5s_cross_attention_stands_with_the_models_own_terms(t5):
    heads = _block_heads(t5)
    cross = {a for a, (path, _) in heads.items() if "EncDecAttention" in path}
    assert cross == {324, 326}, heads
    assert {heads[a][1] for a in cross} == {MODEL_TERM}, heads
    assert {g for a, (_, g) in heads.items() if a not in cross} == {OP_GAP_GROUP}, heads
    for r in t5.rejections:
        if r.anchor in cross and r.headline and r.rule.startswith("fuse_attention_block"):
            assert held_by(t5, r) is not None and held_by(t5, r).guard == "self_attention"
            assert place_gap_names(t5, [r]) == []  # no `△` label on the drawing either
            assert ALSO in standing(t5, r)[1]


def test_t5s_block_chip_counts_four_gaps_and_two_own_terms(t5):
    p = places(t5, _block_step(t5))
    assert len(p.gaps) == 4 and not p.near_misses, p
    assert [len(v) for v in p.faded.values()] == [2] and MODEL_TERM in p.faded, p.faded
    assert all(ALSO in item for item in p.faded[MODEL_TERM]), p.faded  # the tooltip still names the gap


def test_t5s_headline_counts_the_fix_enough_in_the_decoder_layers(capsys):
    code, text, err = cli_run(capsys, "explain", T5)
    assert code == 0, err
    head = next(line for line in text.splitlines() if line.startswith("t5.encdec "))
    assert "4 held back by rlxviz's ops" in head and NOT_ENOUGH not in head, head
    assert NOT_ENOUGH not in text, text  # no gap line calls its fix not enough
    own = text.split("places keep the model's own terms", 1)[1]
    for anchor in (324, 326):
        rule = "fuse_attention_block.qkv_attention_out"
        line = next(x for x in own.splitlines() if x.startswith(f"  {rule} @ %{anchor} "))
        assert "self_attention [the model's own term]" in line and ALSO in line, line
    assert "said no here: self_attention (the model's own term)" in text  # the layer op's line says the same


def test_t5s_json_says_the_same(capsys):
    _, out, _ = cli_run(capsys, "explain", T5, "--json")
    d = json.loads(out)
    assert d["gap_layers"] == 4, d["headline"]
    dec = [lv for lv in d["layers"] if lv["label"].startswith("decoder")]
    assert dec and all("%324" not in x and "%326" not in x for lv in dec for x in lv["gap_refusals"])
    own = next(g for g in d["left_out_groups"] if g["kind"] == MODEL_TERM)["items"]
    assert sum(x.startswith(("fuse_attention_block.qkv_attention_out @ %324 ",
                             "fuse_attention_block.qkv_attention_out @ %326 ")) for x in own) == 2, own
    assert not [c for c in d["fix_checks"] if c["anchor"] in ("324", "326")], d["fix_checks"]
    assert all(c["compiler_fix_enough"] is not False for c in d["fix_checks"]
               if c["rule"].startswith("fuse_attention_block")), d["fix_checks"]


def test_a_generated_t5_like_cross_attention_is_held_by_its_own_term():
    """The T5-like encoder-decoder built here (unscaled scores): the same standing, the same headline."""
    g = encoder_decoder("t5")
    trace = Pipeline.canonical().run(g)
    heads = _block_heads(trace)
    cross = [g_ for path, g_ in heads.values() if "EncDecAttention" in path]
    assert cross and set(cross) == {MODEL_TERM}, heads
    v = RunVerdict.of(trace)
    assert NOT_ENOUGH not in v.headline, v.headline
    dec = [lv for lv in v.layers if lv.layer.stack == "decoder"]
    assert all(not lv.gap_blocker for lv in dec) and all(lv.gaps for lv in dec), [lv.gaps for lv in dec]


def test_t5s_cross_attention_offers_no_gap_workaround_in_the_table(t5):
    """The app's matches table and node panel read a place's hint in context (`report.in_context`): at a place the
    model's own term holds, that term's (nothing to change in the model), never the scale fold its check refutes."""
    k = _block_step(t5)
    for r in t5.steps[k].rejections:
        if r.headline and r.anchor in (324, 326):
            hint = in_context(t5, k, r)[1]
            assert hint.startswith("nothing to change in the model") and "fold the scale" not in hint, hint
