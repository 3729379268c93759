"""What fails next when a gap's compiler fix alone is applied is a fact of the verdict, not of its words.

The headline's "alone it is not enough in N of them: GUARD (KIND) fails next" (`text.gap_words`) found its blocker
by matching `caveat.CAVEAT` against the layer's rendered "not expected here" lines: the text layer parsed its own
text. Each gap a layer's refusals ran into is now a record (`excused.OpGap`: its op form, rule, what ran into it,
its places and `blocker`, from `caveat.fix_blocker`), and the headline, the gap line (`excused.Excused`, headed `gap
in rlxviz's ops:` since issue 39) and `--json`'s `layers[].gaps` read that field.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.passes.why.excused import Excused, OpGap
from rlxviz.passes.why.text import GAP_IS_THE_COMPILERS, gap_words
from rlxviz.passes.why.verdict import RunVerdict

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"
GRANITE = CASES / "granite.onnx"
NEOX = CASES / "gpt-neox.legacy-sdpa.onnx"
SCALE_GAP = "FusedAttentionBlock with a non-default scale"
RULE = "fuse_attention_block.qkv_attention_out"
NEOX_BLOCKER = ("attn_single_user (illegal while the sdpa NaN guard moved past the head merge reads there, a reader "
                "rlxviz's own canonicalize_exported.nan_guard_moved made from your nodes: the fusion would hide the "
                "value it reads, and FusedAttentionBlock has no form that takes it in; a compiler fix, nothing in the "
                "model to change)")


@pytest.fixture(scope="module")
def granite() -> RunVerdict:
    from test_near_miss_rule import trace_of

    return RunVerdict.of(trace_of(GRANITE), model="granite")


def test_each_gap_is_a_record_with_its_places_and_no_blocker_where_the_fix_is_enough(granite):
    for lv, node in zip(granite.layers, (207, 210), strict=True):
        [g] = lv.gaps
        assert g == OpGap(SCALE_GAP, RULE, "default_scale", (node,), "", g.workaround)
        assert g.workaround.startswith("fold the scale into q_proj"), g.workaround  # `rules.scale_fold`, checked
        assert lv.op_gaps == [f"{SCALE_GAP} ({RULE}: default_scale)"] and lv.gap_forms == [SCALE_GAP]
        assert lv.gap_blocker == "" and lv.gap_workaround
    assert gap_words(granite).endswith(f"(rlxviz lacks {SCALE_GAP}: a compiler fix; a workaround in the model in 2 "
                                       f"of them (their gap lines name it))"), gap_words(granite)
    none = replace(granite, layers=[replace(lv, gaps=[replace(g, workaround="") for g in lv.gaps])
                                    for lv in granite.layers])
    assert gap_words(none).endswith(f"(rlxviz lacks {SCALE_GAP}: {GAP_IS_THE_COMPILERS})")  # read from the field


def test_the_headline_reads_the_blocker_field_not_the_lines(granite):
    """A blocker on the record is said though no line says it; caveat words in a line the record does not hold are
    not."""
    said = replace(granite, layers=[replace(lv, gaps=[replace(g, blocker="attn_single_user (illegal)", workaround="")
                                                      for g in lv.gaps]) for lv in granite.layers])
    assert gap_words(said).endswith("a compiler fix; alone it is not enough in 2 of them: attn_single_user (illegal) "
                                    "fails next)"), gap_words(said)
    words = [replace(lv, gap_refusals=[x.replace("scale attribute", "scale attribute; alone it is not enough: "
                                                 "default_scale fails next") for x in lv.gap_refusals])
             for lv in granite.layers]
    assert any("alone it is not enough" in x for lv in words for x in lv.gap_refusals)
    assert gap_words(replace(granite, layers=words)) == gap_words(granite)


def test_an_excused_groups_line_carries_its_blocker_on_the_compiler_fix():
    x = Excused("r.p", "g", "it failed", "a gap (compiler fix: give it a scale)", {7: "layers.0"}, ("a gap",),
                "h (illegal)")
    # a gap's line: no "why it is not expected here" (issue 39)
    assert x.line == ("r.p (g) @ %7 (layers.0): it failed; a gap (compiler fix: give it a scale; alone it is not "
                      "enough: h (illegal) fails next)")
    two = replace(x, places={7: "layers.0", 9: ""}, blocker="")
    assert two.line == ("r.p (g) at 2 places, %7 (layers.0) and %9 (-): at %7: it failed; a gap (compiler fix: give "
                        "it a scale)")
    plain = replace(x, gaps=(), blocker="")  # no gap: a not-expected line
    assert plain.line == ("r.p (g) @ %7 (layers.0): it failed; why it is not expected here: a gap (compiler fix: "
                          "give it a scale)")


def test_json_gaps_carry_the_blocker_the_headline_says(capsys):
    """gpt-neox: the partial-rotary gap's compiler fix alone leaves `attn_single_user (illegal)` standing, read there
    by the exporter's NaN guard that rlxviz's canonicalization moved (`caveat.MADE_READERS`)."""
    code, out, _ = cli_run(capsys, "explain", NEOX, "--json")
    j = json.loads(out)
    gaps = [g for lv in j["layers"] for g in lv["gaps"]]
    assert code == 0 and len(gaps) == 2 and all(g["blocker"] == NEOX_BLOCKER for g in gaps), gaps
    assert all(any(f"{RULE} ({g['by']}) @ %{a} (" in x for x in lv["gap_refusals"])  # its place, as its line names it
               for lv in j["layers"] for g in lv["gaps"] for a in g["at"])
    assert all(lv["op_gaps"] == [f"{g['form']} ({g['rule']}: {g['by']})" for g in lv["gaps"]] for lv in j["layers"])
    assert j["headline"].endswith(f"alone it is not enough in 2 of them: {NEOX_BLOCKER} fails next)")
