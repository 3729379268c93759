"""esm.qdyn's attention refusal shows both gaps where it sits, and its caveat says which fix was checked (newcomer run
18).

The headline, the `rlxviz's ops lack:` lines and `--json`'s gaps name two gaps at esm.qdyn's attention: its
integer-matmul Q/K/V projections (`integer_qkv`) and the Q pre-scale before RoPE (`default_scale`). `explain -v`'s
`[rejected]` line tagged the one refusal `△ gap in rlxviz's ops` and the export's node named `default_scale` alone,
so `qkv_packed (not recognized) fails next` read as the pattern gap holding the layer back, when the integer
matmuls are why no packed QKV exists. And the gap line hung `alone it is not enough: qkv_packed ... fails next` on
the joined fix (the int8 block and the scale fold) though the check applied the scale fold alone. Decision: the
`[rejected]` tag names the place's gaps as the drawing's label does (`why.gap_words.group_words` of
`why.standing.place_gap_names`, the verdict's gaps), and a caveat on a line naming several gaps' fixes says whose
fix was checked (`why.caveat.CAVEAT_OF`)."""

from __future__ import annotations

from pathlib import Path

from clirun import run as cli_run
from test_near_miss_rule import trace_of

from rlxviz.passes.why.verdict import RunVerdict

QDYN = Path(__file__).parent / "fixtures" / "onnx" / "cases" / "esm.qdyn.onnx"
TAG = "△ 2 gaps in rlxviz's ops: its integer-matmul Q/K/V projections (integer_qkv), default_scale"
CHECKED = ("the default_scale fix alone is not enough: qkv_packed (a gap in rlxviz's ops: FusedAttentionBlock over "
           "integer-matmul Q/K/V projections (dynamic quantization)) fails next")


def test_the_rule_line_and_the_gap_line_say_both_gaps_and_whose_fix_was_checked(capsys):
    lv = RunVerdict.of(trace_of(QDYN)).layers
    assert all(len(v.gap_forms) == 2 for v in lv), [v.gap_forms for v in lv]  # what the headline names
    code, text, err = cli_run(capsys, "explain", QDYN, "-v")
    assert code == 0, err
    rules = [x for x in text.splitlines() if "[rejected] fuse_attention_block.qkv_attention_out: default_scale" in x]
    assert len(rules) == len(lv) and all(f"(guard, not recognized; {TAG}): " in x for x in rules), rules
    gaps = [x for x in text.splitlines() if x.startswith("  gap in rlxviz's ops: fuse_attention_block.")]
    assert len(gaps) == len(lv), gaps
    for x in gaps:
        assert "(compiler fix: a FusedAttentionBlock over int8 Q/K/V weights" in x, x
        assert x.endswith(f"; {CHECKED})") and "; alone it is not enough:" not in x, x[-300:]
