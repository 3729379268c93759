"""The Matches & rejections table's fix column is the fix `rlxviz explain` prints (newcomer run): on granite the
row of `fuse_transformer_layer.bert_post_ln` (`attn_is_fused_block`), a refusal the LLaMA-kind layer does not
expect, proposed "fix fuse_attention_block's refusal first (default_scale at node 207): fold the scale into q_proj
..." while `explain` printed no fix for it and `--json`'s `fix_checks` had `"fix": null`. Both read
`passes.report.fix_line` on the run with its fixes vetted now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run
from test_app_views import tiny

from rlxviz.app.whyview import DecisionTable
from rlxviz.passes.why.policy import NOT_EXPECTED_FIX

ONNX = Path(__file__).parent / "fixtures" / "onnx"


def _table(s) -> list[dict]:
    """The table's rows as the app shows them, with each row's step (kept by the table, not shown)."""
    t = DecisionTable(state=s)
    shown = t.table.value.to_dict("records")
    return [{**row, "step": r["step"], "why": r["why"]} for row, r in zip(shown, t._rows, strict=True)]


def _fix_checks(capsys, *args) -> list[dict]:
    """`explain --json`'s `fix_checks` at the app's shapes (`tiny`: sequence length 8, so the checks' numbers agree)."""
    _, out, _ = run(capsys, "explain", *args, "--seq", "8", "--json")
    return json.loads(out)["fix_checks"]


def _uploaded(path: Path):
    s = tiny()
    s.load_upload({path.name: path.read_bytes()})
    assert s.model is not None and "onnx_file" in s.model.meta, s.message
    return s


def _assert_parity(rows: list[dict], checks: list[dict]) -> None:
    """Every refusal `explain --json` checked has its table row (its headline, the last pass that refused it there),
    and that row's fix is the line `explain` prints after `fix:` ("" where it prints none)."""
    assert checks
    for f in checks:
        mine = [r for r in rows if (r["rule"], r["anchor"], r["guard"]) == (f["rule"], f["anchor"], f["guard"])
                and not r["why"].startswith("also:")]
        assert mine, f
        row = max(mine, key=lambda r: r["step"])
        assert row["hint"] == (f["fix"] or ""), (f, row)


@pytest.mark.parametrize("case, guards", [("granite", ("attn_is_fused_block",)),
                                          ("bart-full", ("fc1_is_fused_linear", "attn_is_fused_block"))])
def test_a_not_expected_row_says_nothing_to_change_as_explain_does(capsys, case, guards):
    """A refusal the layer's kind does not expect proposes no fix (granite's row once proposed an earlier pass's), and
    its fix is not empty either (a newcomer run on bart-full: an empty fix and compiler-fix cell, no `fix:` line under
    `[rejected] ... fc1_is_fused_linear`): the one line `policy.not_expected_fix` words, in the table, `-v` and
    `--json` alike."""
    path = ONNX / "cases" / f"{case}.onnx"
    checks = _fix_checks(capsys, path, "-v")
    rows = _table(_uploaded(path))
    quiet = [f for f in checks if f["rule"] == "fuse_transformer_layer.bert_post_ln" and f["guard"] in guards]
    assert {f["guard"] for f in quiet} == {guards[0]}, quiet  # -v prints a rule's first refusal in the layer
    for f in quiet:
        assert f["fix"].startswith(f"{NOT_EXPECTED_FIX}: FusedTransformerLayer is the post-LN BERT layer; "), f
        assert f["printed_as_fix"] and f["compiler_fix"] is None, f
        (row,) = [r for r in rows if (r["rule"], r["anchor"], r["guard"]) == (f["rule"], f["anchor"], f["guard"])]
        assert row["kind"] == "not expected here" and row["hint"] == f["fix"], row
        assert "refusal first" not in row["hint"]
    unexpected = [r for r in rows if r["rule"] == "fuse_transformer_layer.bert_post_ln" and r["guard"] in guards]
    assert {r["guard"] for r in unexpected} == set(guards)  # every such row of the table, -v's or not
    for r in unexpected:
        assert r["kind"] == "not expected here" and r["hint"].startswith(f"{NOT_EXPECTED_FIX}: "), r
    _, text, _ = run(capsys, "explain", path, "--seq", "8", "-v")
    lines = text.splitlines()
    for k, line in enumerate(lines):  # every such `[rejected]` line of -v is followed by that fix line
        if line.lstrip().startswith("[rejected] fuse_transformer_layer.bert_post_ln: ") and \
                line.split(": ")[1].split(" (")[0] in guards:
            assert lines[k + 1].strip() == f"fix: {quiet[0]['fix']}" or lines[k + 1].strip().startswith(
                f"fix: {NOT_EXPECTED_FIX}: "), lines[k:k + 2]
    _assert_parity(rows, checks)


@pytest.mark.parametrize("case", ["gpt2", "dead_h1_user"])
def test_every_checked_refusals_row_shows_explains_fix(capsys, case):
    if case == "gpt2":
        path = ONNX / "gpt2.onnx"
        checks, s = _fix_checks(capsys, path), _uploaded(path)
    else:
        checks = _fix_checks(capsys, "bert-tiny", "--variant", case)
        s = tiny()
        s.apply_variant(case)
    _assert_parity(_table(s), checks)
