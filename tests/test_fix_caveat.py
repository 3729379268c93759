"""A not-expected line promises no more than its compiler fix's check found (a newcomer's run).

deit (pre-LN ViT), layer 1: `explain` without -v ended the `fuse_residual_ln.residual (sum_single_user)` not-expected
line with "(compiler fix: a fuse_residual_ln rule that builds FusedResidualLN(with_sum=true) ...)", while `explain -v`
and the app's Matches & rejections row said "checked at this rule alone: that passes sum_single_user only; then
residual_same_shape (not a candidate) fails". The line now carries the same check's finding
(`passes.whatif.fix_alone_blocker`, read by `caveat.fix_caveat`): "(compiler fix: ...; alone it is not enough:
residual_same_shape (not a candidate) fails next)", in the text, `--json` and the app's chips alike
(`verdict.standing`, `places.places`); where the fix alone is enough (layer 0's sum) the line stands as it was.
"""

from __future__ import annotations

import json
from pathlib import Path

from clirun import run as cli_run

from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.passes.why.places import places
from rlxviz.passes.why.policy import NOT_EXPECTED_HERE, with_caveat

DEIT = Path(__file__).parent / "fixtures" / "onnx" / "cases" / "deit.ortopt.onnx"
RULE = "fuse_residual_ln.residual (sum_single_user)"
FIX_END = "returns the sum as an optional output"
CAVEAT = "; alone it is not enough: residual_same_shape (not a candidate) fails next)"


def _lines(text: str, layer: int) -> list[str]:
    block = text.split(f"\nlayer {layer}: ", 1)[1].split("\nlayer ", 1)[0]
    return [ln for ln in block.splitlines() if ln.startswith(f"  not expected here: {RULE}")]


def test_plain_text_json_and_verbose_agree_on_the_caveat(capsys):
    code, text, _ = cli_run(capsys, "explain", DEIT)
    (one,) = _lines(text, 1)
    assert one.endswith(f"{FIX_END}{CAVEAT}"), one
    # the embeddings' sum (layer 0's other place, %53, has its own line: its why differs)
    (zero,) = [ln for ln in _lines(text, 0) if ": sum (node 16, embeddings) " in ln]
    assert "alone it is not enough" not in zero and zero.endswith(f"{FIX_END})"), zero
    _, out, _ = cli_run(capsys, "explain", DEIT, "--json")
    layers = {lv["layer"]: lv for lv in json.loads(out)["layers"]}
    assert one.removeprefix("  not expected here: ") in layers[1]["not_expected"]
    assert zero.removeprefix("  not expected here: ") in layers[0]["not_expected"]
    _, verbose, _ = cli_run(capsys, "explain", DEIT, "-v")
    assert _lines(verbose, 1) == [one]
    assert ("(checked at this rule alone: that passes sum_single_user only; then residual_same_shape (not a "
            "candidate) fails: ") in verbose


def test_the_apps_chips_read_the_same_caveat():
    trace = Pipeline.canonical().run(load_onnx(DEIT, seq=8).graph)
    step = next(k for k, s in enumerate(trace.steps) if s.pass_name == "fuse_residual_ln")
    items = [x for x in places(trace, step).excused.get(NOT_EXPECTED_HERE, []) if f": {RULE}: " in x]
    by_node = {x.split("): sum (node ", 1)[1].split(",", 1)[0]: x for x in items}
    assert by_node["63"].endswith(CAVEAT) and not by_node["16"].endswith(CAVEAT), items


def test_with_caveat_goes_inside_the_compiler_fix():
    assert with_caveat("x (compiler fix: y)", "z") == "x (compiler fix: y; z)"
    assert with_caveat("x (compiler fix: y) so", "z") == "x (compiler fix: y) so (z)"
    assert with_caveat("no fix named", "z") == "no fix named"
    assert with_caveat("x (compiler fix: y)", "") == "x (compiler fix: y)"


def test_verbose_fix_line_carries_the_caveat_its_compiler_check_found(capsys):
    """`explain -v`: a `fix: none in the model: ... (compiler fix: ...)` line whose compiler fix the check at its rule
    alone finds not enough (the next line says `checked at this rule alone`) carries the plain line's caveat, in the
    same words (`caveat.alone_caveat`); one whose compiler fix is enough stays as it was. `--json`'s `fix_checks`
    print the same line."""
    _, text, _ = cli_run(capsys, "explain", DEIT, "-v")
    lines = [ln.strip() for ln in text.splitlines()]
    seen = {True: 0, False: 0}
    for ln, nxt in zip(lines, lines[1:], strict=False):
        if ln.startswith("fix: none in the model: ") and "(compiler fix: " in ln:
            checked = nxt.startswith("compiler fix: ") and "(checked at this rule alone: " in nxt
            assert ln.endswith(CAVEAT) == checked, (ln, nxt)
            seen[checked] += 1
    assert seen[True] and seen[False], seen
    (one,) = _lines(text, 1)
    assert one.endswith(CAVEAT)  # the plain line's caveat, word for word
    _, out, _ = cli_run(capsys, "explain", DEIT, "--json")
    printed = [f["fix"] for f in json.loads(out)["fix_checks"] if f["guard"] == "sum_single_user"
               and f["compiler_fix_enough"] is False]
    assert printed and all(p.endswith(CAVEAT) for p in printed), printed
