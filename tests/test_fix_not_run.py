"""A fix whose numbers were not run says why, and never contradicts the compiler fix line (a newcomer run: minilm with
`tanh_gelu` at layer 2 printed "fix: ... replaced by gelu) fuses, but its numbers could not be checked" and then
"compiler fix: ...; changing the model to exact GELU changes its numbers", while on bert-tiny the same check ran:
minilm's reference runs are past explain's budget `BUDGET_MACS`). The not-run line names the limit and its value; that
the activation switch changes what the model computes is said once, on the fix line, whether measured or not."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from rlxviz.cli import main
from rlxviz.models import VARIANTS, load_model
from rlxviz.passes import Pipeline
from rlxviz.passes.guard import NO_MODEL_FIX
from rlxviz.session import check_fusion
from rlxviz.session.advice import BUDGET_MACS, CHANGES_NUMBERS, NOT_RUN, check_fixes, checked_verdict
from rlxviz.session.exactness import run_macs

ACTS = ("epilogue_activation", "fc1_activation")
CHANGE = re.compile(r"changes (its|the model's) numbers|changes what the model computes")


def _run(model: str, layer: int, seq: int = 16):
    m = load_model(model, seq=seq, variant=replace(VARIANTS["tanh_gelu"], layer=layer))
    return m, Pipeline.canonical().run(m.graph)


def _fix_lines(check, layer: int, printed: str) -> list[str]:
    """The fix line `printed` and the compiler fix line after it in the layer's `explain -v` text: the tanh-GELU
    refusal is a gap in rlxviz's ops (its rule declares no change to the model keeps the numbers), so its lines are
    those of the layer op's rule in the verbose explanation."""
    text = next(s for s in check.layers if s.layer == layer).render(verbose=True)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(("fix:", "compiler fix:"))]
    i = lines.index(f"fix: {printed}")
    return lines[i:i + 2]


@pytest.mark.parametrize("model, layer", [("bert-tiny", 0), ("bert-tiny", 1), ("minilm-shaped", 2),
                                          ("minilm-shaped", 4)])
def test_a_fix_past_the_budget_names_the_budget_and_its_value(model, layer):
    m, trace = _run(model, layer)
    cost = run_macs(trace.input) * 3 * 6  # the mask input gives three input sets, six reference runs each
    budget = cost / 2
    fixes = check_fixes(trace, check_fusion(trace, model), m.random_feeds(0), m.weights, budget_macs=budget)
    acts = [f for f in fixes if f.guard in ACTS]
    assert acts and all(f.status == NOT_RUN for f in acts)
    for f in acts:
        for said in (f.printed, f.detail):  # the text and --json say the same facts
            assert f"its reference runs take {cost:.2g} multiply-adds, over explain's budget of {budget:.2g} " \
                   "(BUDGET_MACS)" in said, said
        assert f.printed.startswith(NO_MODEL_FIX) and "could not be checked" in f.printed
        assert len(CHANGE.findall(f.printed)) == 1, f.printed


@pytest.mark.parametrize("model, layer, seq", [("minilm-shaped", 2, 16), ("minilm-shaped", 3, 16),
                                               ("bert-tiny", 1, 8), ("bert-tiny", 0, 8)])
def test_fix_and_compiler_fix_say_the_change_once(model, layer, seq):
    """Measured (bert-tiny: within the budget) or not (minilm: past it), the two lines state the numbers' change
    once, and a line that did not measure claims no measurement."""
    m, trace = _run(model, layer, seq)
    over = run_macs(trace.input) * 3 * 6 > BUDGET_MACS
    check, fixes = checked_verdict(trace, model, m.random_feeds(0), m.weights)
    acts = [f for f in fixes if f.guard in ACTS]
    assert acts and {f.status for f in acts} == {NOT_RUN if over else CHANGES_NUMBERS}, acts
    f = next(f for f in acts if f.guard == "fc1_activation")  # the layer op's refusal: its lines are printed (-v)
    lines = _fix_lines(check, layer, f.printed)
    assert [ln.split(":")[0] for ln in lines] == ["fix", "compiler fix"], lines
    assert sum(len(CHANGE.findall(ln)) for ln in lines) == 1, lines
    if over:
        assert "max err" not in lines[0] and f"explain's budget of {BUDGET_MACS:.2g} (BUDGET_MACS)" in lines[0]
    else:
        assert "max err" in lines[0] and "could not be checked" not in lines[0]


def test_explain_text_and_json_give_the_same_reason(capsys):
    args = ["explain", "minilm-shaped", "--variant", "tanh_gelu", "--variant-layer", "2"]
    assert main([*args, "--verbose"]) == 0  # tanh-GELU is a gap in rlxviz's ops: nothing in the model to change
    text = capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    acts = [f for f in doc["fix_checks"] if f["guard"] in ACTS]
    assert acts and {f["status"] for f in acts} == {NOT_RUN}
    f = next(f for f in acts if f["guard"] == "fc1_activation")
    assert f["status"] == NOT_RUN and "(BUDGET_MACS)" in f["detail"]
    assert f"fix: {f['fix']}" in text
    reason = f["fix"].split("could not be checked: ")[1]
    assert reason in f["detail"] and "changing the model to exact GELU" not in text
