"""A refusal at a gap in rlxviz's ops has its own heading in the layer text (issue 39, a newcomer run): esm's
`explain -v` printed its attention block's `default_scale` refusal under "not expected here:" and then said "why it is
not expected here: not the model's layout but a gap in rlxviz's ops", though the README keeps ○ (nothing to fix: not
expected here) and △ (a gap in rlxviz's ops) apart; and its FusedTransformerLayer line said the same refusal was
"default_scale (not recognized)", a third name.

Decision: a gap's line is headed `gap in rlxviz's ops:` and says `RULE (GUARD) @ %N (PATH): REASON; rlxviz has no FORM
(compiler fix: ...)`, with no "why it is not expected here" (`policy.gap_line`); `--json` lists it under
`gap_refusals`, not under `not_expected`; a later pass's "X ran before and said no here: GUARD (...)" names an
upstream refusal at a gap as "a gap in rlxviz's ops: FORM". Other not-expected refusals keep their heading and why.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from clirun import run

from rlxviz import cli
from rlxviz.passes.why.policy import NOT_EXPECTED_WHY
from rlxviz.passes.why.verdict import OP_GAP_GROUP

HERE = Path(__file__).parent
ESM = HERE / "fixtures" / "onnx" / "zoo" / "esm.dynamo-eager.onnx"
VIT = HERE / "fixtures" / "onnx" / "vit.onnx"
LN_EPS = HERE.parent / "docs" / "examples" / "ln-eps-outside-sqrt.rlx"
SCALE_GAP = "FusedAttentionBlock with the scale applied to Q before RoPE"


def _layer0(text: str) -> list[str]:
    """The lines of layer 0's block of an `explain` text (up to layer 1's line)."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("layer 0:"))
    end = next((i for i, ln in enumerate(lines) if i > start and ln.startswith("layer 1:")), len(lines))
    return lines[start:end]


@pytest.fixture(scope="module")
def esm_text() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        cli.main(["explain", str(ESM), "-v"])
    return out.getvalue()


def test_esm_gap_has_its_own_heading(esm_text):
    layer = _layer0(esm_text)
    gap = [ln for ln in layer if ln.startswith(f"  {OP_GAP_GROUP}: ")]
    assert len(gap) == 1, layer
    (line,) = gap
    assert line.startswith(f"  {OP_GAP_GROUP}: fuse_attention_block.qkv_attention_out (default_scale) @ %178 (")
    assert f"; rlxviz has no {SCALE_GAP} (compiler fix: " in line
    assert NOT_EXPECTED_WHY not in line and "not the model's layout" not in line
    # no "not expected here" line is the gap's refusal (the FusedTransformerLayer line may quote it)
    assert not any(ln.startswith("  not expected here: fuse_attention_block.") for ln in layer), layer


def test_a_plain_not_expected_refusal_keeps_its_heading(esm_text):
    layer = _layer0(esm_text)
    (line,) = [ln for ln in layer if ln.startswith("  not expected here: fuse_residual_ln.residual (sum_single_user)")]
    assert f"; {NOT_EXPECTED_WHY}: pre-norm layout" in line


def test_upstream_refusal_at_a_gap_is_named_a_gap(esm_text):
    layer = _layer0(esm_text)
    (line,) = [ln for ln in layer if ln.startswith("  not expected here: fuse_transformer_layer.bert_post_ln ")]
    assert f"said no here: default_scale (a gap in rlxviz's ops: {SCALE_GAP}): " in line
    assert "default_scale (not recognized)" not in line
    # the -v trace's rejection line says the same of it
    assert not any("said no here: default_scale (not recognized)" in ln for ln in layer), layer


def test_json_lists_gaps_apart(capsys):
    _, text, _ = run(capsys, "explain", str(VIT), "--layer", "0")
    _, out, _ = run(capsys, "explain", str(VIT), "--layer", "0", "--json")
    d = json.loads(out)
    (lv,) = d["layers"]
    said = [ln.split(": ", 1)[1] for ln in text.splitlines() if ln.startswith(f"  {OP_GAP_GROUP}: ")]
    assert said and said == lv["gap_refusals"]  # the text's gap lines, word for word
    assert any(x.startswith("fuse_attention_block.qkv_attention_out (mask_kind_keep) @ %") for x in lv["gap_refusals"])
    assert all(NOT_EXPECTED_WHY not in x for x in lv["gap_refusals"])
    assert not any(x.startswith("fuse_attention_block.qkv_attention_out (mask_kind_keep)") for x in lv["not_expected"])
    assert any(x.startswith("fuse_residual_ln.residual (sum_single_user)") for x in lv["not_expected"])
    assert d["gap_refusals"] == [] and {g["rule"] for g in lv["gaps"]} >= {"fuse_attention_block.qkv_attention_out"}


def test_graph_without_layers_lists_gaps_apart(capsys):
    _, out, _ = run(capsys, "explain", str(LN_EPS))
    assert f"  {OP_GAP_GROUP}: canonicalize_norm.layer_norm (eps_inside_sqrt) @ %1 (-): " in out
    assert "not expected here: canonicalize_norm.layer_norm" not in out
