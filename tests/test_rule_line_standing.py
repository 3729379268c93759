"""`explain -v`'s per-rule lines (the app's Why tab prints the same text) say each refusal's standing (newcomer
report 17): every refusal read `[rejected] RULE: GUARD (STAGE, KIND)`, so esm's gap `default_scale` (△), its
not-expected `fuse_transformer_layer` and `sum_single_user` (○) and a real near-miss (✗) looked alike. The tag is
`standing.standing` of the place (`places.standing_mark`), as the chips mark it; `--json`'s outcomes carry it as
`standing`."""

from __future__ import annotations

import json
from pathlib import Path

from clirun import run

from rlxviz.passes.why.places import standing_mark
from rlxviz.passes.why.policy import NOT_EXPECTED_HERE
from rlxviz.passes.why.verdict import OP_GAP_GROUP

ESM = Path(__file__).parent / "fixtures" / "onnx" / "zoo" / "esm.dynamo-eager.onnx"
GAP = f"△ {OP_GAP_GROUP}"
NOT_EXPECTED = f"○ nothing to fix, {NOT_EXPECTED_HERE}"


def _rejected(out: str) -> list[str]:
    return [ln.strip() for ln in out.splitlines() if ln.strip().startswith("[rejected] ")]


def test_marks_name_each_standing():
    assert standing_mark(None) == "✗ near-miss"
    assert standing_mark((OP_GAP_GROUP, "why")) == GAP
    assert standing_mark((NOT_EXPECTED_HERE, "why")) == NOT_EXPECTED
    assert standing_mark(("not a candidate", "why")) == "○ nothing to fix, lookalike"


def test_esm_gap_and_not_expected_refusals_are_tagged_apart(capsys):
    code, out, err = run(capsys, "explain", ESM, "-v")
    lines = _rejected(out)
    assert lines, out
    gap = [ln for ln in lines if ln.startswith("[rejected] fuse_attention_block.qkv_attention_out: default_scale ")]
    assert len(gap) == 2 and all(f"(guard, not recognized; {GAP}): " in ln for ln in gap), gap
    ftl = [ln for ln in lines if ln.startswith("[rejected] fuse_transformer_layer.bert_post_ln: attn_is_fused_block ")]
    assert ftl and all(f"(structure, not recognized; {NOT_EXPECTED}): " in ln for ln in ftl), ftl
    res = [ln for ln in lines if ln.startswith("[rejected] fuse_residual_ln.residual: sum_single_user ")]
    assert res and all(f"(guard, illegal; {NOT_EXPECTED}): " in ln for ln in res), res
    assert not any("✗ near-miss" in ln for ln in lines), lines  # esm's layers have none
    code, out, err = run(capsys, "explain", ESM, "--json")
    d = json.loads(out)
    for lv in d["layers"]:
        assert f"default_scale (guard, not recognized; {GAP})" in lv["explanation"]
        for o in [*lv["rejections"], *lv["illegal"], *([lv["first"]] if lv["first"] else [])]:
            assert "standing" in o and (o["status"] != "rejected" or o["standing"]), o


def test_a_near_miss_is_tagged_so_in_text_and_json(capsys):
    code, out, err = run(capsys, "explain", "bert-tiny", "--variant", "dead_h1_user", "--layer", 0, "-v")
    (line,) = [ln for ln in _rejected(out) if ln.startswith("[rejected] fuse_transformer_layer.bert_post_ln: ")]
    assert line.startswith("[rejected] fuse_transformer_layer.bert_post_ln: h1_user_count (guard, ")
    assert "; ✗ near-miss): " in line, line
    # the layer's first rejection is not said again as an `also rejected` line (the text reads it by identity)
    assert "also rejected: fuse_transformer_layer.bert_post_ln" not in out, out
    code, out, err = run(capsys, "explain", "bert-tiny", "--variant", "dead_h1_user", "--layer", 0, "--json")
    (lv,) = json.loads(out)["layers"]
    assert lv["first"]["standing"] == "✗ near-miss", lv["first"]
