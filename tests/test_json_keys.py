"""`explain --json` names each fix line as the text does, and says where its not-expected lines are (a newcomer's run).

The text prints a refusal's `fix:` line (what to change in the model) and its `compiler fix:` line. `--json` called
the first `hint` and the second `fix` in `first`, `rejections` and `illegal`, while `fix_checks[].fix` held the
model-side fix, and `fix_checks[].compiler_fix_printed` was null while the text printed "compiler fix: multi-output
fusion: ..." (minilm `--variant extra_h1_user`, case n4-06's DeepNorm residual). Now `fix` is the text's `fix:` line
and `compiler_fix` its `compiler fix:` line everywhere, `fix_checks` included.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.passes.why.policy import NOT_EXPECTED_FIX

CASES = Path(__file__).parent / "data" / "cases"
RUNS = {
    "minilm-extra_h1_user": ["minilm", "--variant", "extra_h1_user"],
    # n4-06's DeepNorm refusal is a gap in rlxviz's ops now (no first rejection): n3-08x's folded bias still counts
    "n3-08x": [str(next(CASES.glob("n3-08x-*.rlx")))],
}


def _outcomes(d: dict) -> list[dict]:
    """Every refusal `--json` words as the text does: each layer's first, counted and illegal-here refusals."""
    return [o for lv in d["layers"] for o in [lv["first"], *lv["rejections"], *lv["illegal"]] if o]


@pytest.mark.parametrize("run", RUNS.values(), ids=list(RUNS))
def test_json_fix_and_compiler_fix_are_the_texts_lines(capsys, run):
    _, text, _ = cli_run(capsys, "explain", *run, "-v")
    lines = [ln.strip() for ln in text.splitlines()]
    _, out, _ = cli_run(capsys, "explain", *run, "--json")
    d = json.loads(out)
    outcomes = _outcomes(d)
    assert outcomes and d["fix_checks"], d
    for o in outcomes:
        assert "hint" not in o, o  # one name per line: the text's
        assert not o["fix"] or o["fix"] in o["message"] or f"fix: {o['fix']}" in lines, o
        assert not o["compiler_fix"] or f"compiler fix: {o['compiler_fix']}" in lines, o
    for f in d["fix_checks"]:
        if f["fix"] is None:  # the text prints no `fix:` line for it (`test_fix_checks_fix_is_a_printed_fix_line...`)
            continue
        assert f"fix: {f['fix']}" in lines, f  # what the text prints after `fix:`, not the guard's own line
        said = [o for o in outcomes if (o["rule"], o["guard"], o["nodes"][0]) == (f["rule"], f["guard"], f["anchor"])]
        assert said and all(o["fix"] == f["fix"] for o in said), (f, said)
        # the compiler fix line the text printed for the same refusal, never null when it printed one
        assert all((o["compiler_fix"] or None) == f["compiler_fix"] for o in said), (f, said)
        assert f["compiler_fix"] is None or f"compiler fix: {f['compiler_fix']}" in lines, f


def test_the_multi_output_compiler_fix_is_in_fix_checks(capsys):
    _, out, _ = cli_run(capsys, "explain", *RUNS["minilm-extra_h1_user"], "--json")
    (f,) = json.loads(out)["fix_checks"]
    assert f["guard"] == "h1_user_count" and f["fix"].startswith("none in the model: ")
    assert f["compiler_fix"].startswith("multi-output fusion: ") and f["compiler_fix_enough"] is True, f


def test_a_layered_graphs_not_expected_lines_are_under_its_layers(capsys):
    """Falcon: the text prints its "not expected here" lines under each layer; `--json` has them under
    `layers[].not_expected`, and its top-level `not_expected` is for a graph with no layers (docs say where)."""
    onnx = Path(__file__).parent / "fixtures" / "onnx" / "cases"
    args = ["explain", str(onnx / "falcon.onnx"), "--inputs", str(onnx / "falcon_io.npz")]
    _, text, _ = cli_run(capsys, *args)
    _, out, _ = cli_run(capsys, *args, "--json")
    d = json.loads(out)
    said = [ln.split("not expected here: ", 1)[1] for ln in text.splitlines() if ln.startswith("  not expected here: ")]
    assert said and d["layers"] and d["not_expected"] == []
    assert said == [x for lv in d["layers"] for x in lv["not_expected"]]
    docs = (Path(__file__).parents[1] / "docs" / "passes.md").read_text()
    assert "`layers[].not_expected`" in docs and "top-level `not_expected`" in docs


ONNX_CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"


@pytest.mark.parametrize("stem", ["falcon", "bart-full"])
def test_fix_checks_fix_is_a_printed_fix_line_or_null(capsys, stem):
    """falcon's `fix_checks` held `"fix": "fuse_attention_block ran before and did its part here ..."` with
    `printed_as_fix: true` for `bert_post_ln (attn_is_fused_block)`, whose text never prints a `fix:` line (the
    statement is inside its message); bart-full's held `"fix": ""`. `fix` is now the line the text prints after `fix:`
    or null, and `printed_as_fix` is true only for a printed line (`FixCheck.shown`). Both refusals are not expected
    of their layers: their line is now the one that says nothing needs changing (`policy.not_expected_fix`)."""
    case = ONNX_CASES / f"{stem}.onnx"
    _, text, _ = cli_run(capsys, "explain", case, "-v")
    lines = [ln.strip() for ln in text.splitlines()]
    _, out, _ = cli_run(capsys, "explain", case, "--json")
    checks = json.loads(out)["fix_checks"]
    assert checks and all(f["fix"] != "" for f in checks), checks
    assert any((f["fix"] or "").startswith(f"{NOT_EXPECTED_FIX}: ") for f in checks), checks
    for f in checks:
        if f["fix"] is None:
            assert f["printed_as_fix"] is False, f
            assert not f["proposed_fix"] or f"fix: {f['proposed_fix']}" not in lines, f
        else:
            assert f["fix"] and f"fix: {f['fix']}" in lines, f
