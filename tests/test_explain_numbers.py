"""`session.exactness.check_exactness` (explain's numeric check, issue 38): every distinct version within the
multiply-add budget, the final version alone past it (the others only to name the pass when it differs), nothing
past that (said, not a failure); graphs without a mask input (and no pass stating its rewrites exact) are not
checked, and the check says why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_mask_combinations import MASKS, chunked_attention, weights_for

from rlxviz.cli import main
from rlxviz.ir import Builder
from rlxviz.passes import Pipeline
from rlxviz.session.exactness import NO_MASK_NO_CLAIM, NOTHING_CHANGED, check_exactness, run_macs

CASES = Path(__file__).parent / "data" / "cases"


def _run(g):
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 8, 16)).astype(np.float32), "attention_mask": MASKS["holes"]}
    return Pipeline.canonical().run(g), feeds, weights_for(g, rng)


def test_every_distinct_version_is_checked_within_the_budget():
    trace, feeds, w = _run(chunked_attention())
    c = check_exactness(trace, feeds, w)
    distinct = [f"after {s.pass_name}" for s in trace.steps if s.changed]
    assert c is not None and c.ok and list(c.checked) == distinct and c.inputs == ("fully_masked_row", "left_padding")
    assert c.line().startswith(f"numbers: {len(distinct)} version(s) equal the unfused graph")


def test_past_the_budget_the_final_version_alone_then_nothing():
    trace, feeds, w = _run(chunked_attention())
    per_run = run_macs(trace.input) * 2
    c = check_exactness(trace, feeds, w, budget_macs=per_run * 2)
    last = [f"after {s.pass_name}" for s in trace.steps if s.changed][-1]  # the final graph (later steps unchanged)
    assert c.ok and c.checked == (last,)
    c = check_exactness(trace, feeds, w, budget_macs=per_run)
    assert c.ok and not c.checked and c.skipped and c.line().startswith("numbers not checked by explain")
    assert c.to_dict()["skipped"]


def test_final_only_still_names_the_pass(monkeypatch):
    """With the old overflowing operand and a budget for the final version alone, the pass is still named."""
    from test_mask_combinations import _old_operand

    from rlxviz.passes.rules import where_mask

    monkeypatch.setattr(where_mask, "biased_operand", _old_operand)
    trace, feeds, w = _run(chunked_attention())
    c = check_exactness(trace, feeds, w, budget_macs=run_macs(trace.input) * 4)
    assert not c.ok and c.bad[0].changed_by == "fuse_sdpa" and c.bad[0].label == "after fuse_sdpa"
    assert "fuse_sdpa changed the numbers" in c.line()


@pytest.mark.parametrize("masked", [False, True])
def test_nothing_to_check_without_a_mask_input_or_a_change(masked):
    b = Builder("mlp")
    x = b.input("x", (2, 4, 8))
    b.output(b.gelu(b.linear(x, b.param("w", (8, 8)), b.param("b", (8,)))))
    g = b.build()
    trace = Pipeline.canonical().run(g) if not masked else Pipeline([]).run(chunked_attention())
    feeds = {"x": np.ones((2, 4, 8), np.float32)} if not masked else {}
    c = check_exactness(trace, feeds, {})
    assert c.ok and not c.checked and c.skipped == (NOTHING_CHANGED if masked else NO_MASK_NO_CLAIM)
    assert c.line() == f"numbers not checked by explain: {c.skipped}" and c.to_dict()["skipped"] == c.skipped


@pytest.mark.parametrize("case", ["n4-09-dequant-scale-after-matmul", "n4-12-moe-soft-routing-shared-expert"])
def test_explain_says_why_it_ran_no_numeric_check(capsys, case):
    """n4-09 and n4-12 (no mask input, no pass stating its rewrites exact): `explain -v` printed no `numbers:` line
    and `--json` a null `numeric_check`, so nothing said the check was skipped. Now one line says why, and `--json`
    holds the same reason in `numeric_check.skipped`."""
    path = str(CASES / f"{case}.rlx")
    main(["explain", path, "-v"])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("numbers")]
    assert lines == [f"numbers not checked by explain: {NO_MASK_NO_CLAIM}"], lines
    main(["explain", path, "--json"])
    check = json.loads(capsys.readouterr().out)["numeric_check"]
    assert check is not None and check["skipped"] == NO_MASK_NO_CLAIM and check["checked"] == [], check
