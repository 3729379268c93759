"""A layer's "expected:" line names the exporter's forms that layer had rewritten, never every form the pass knows.

A newcomer read falcon's "expected: the exporter's forms as IR ops (silu, rsqrt, where mask), ..." as a claim about
the model: falcon has neither silu nor rsqrt. The parenthesis is now the forms (`Rule.form`) of the
`canonicalize_exported` rules that matched in the layer (`why.policy.product`), and none where none matched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from clirun import case_trace as trace_of

from rlxviz.passes import PASSES
from rlxviz.passes.why import policy
from rlxviz.passes.why.verdict import RunVerdict

ONNX = Path(__file__).parent / "fixtures" / "onnx" / "cases"
PASS = "canonicalize_exported"
HEAD = "the exporter's forms as IR ops"


def said_forms(expected: str) -> list[str] | None:
    """The forms the expected list names in the exporter's product's parenthesis ([] without one; None when the
    product is not listed)."""
    m = re.search(re.escape(HEAD) + r"(?: \(([^()]*)\))?(?:, |$)", expected)
    if m is None:
        return None
    return m.group(1).split(", ") if m.group(1) else []


def test_every_rule_of_the_pass_names_its_form_and_the_product_names_none():
    p = PASSES[PASS]
    assert all(r.form for r in p.rules), [r.name for r in p.rules if not r.form]
    assert p.product == HEAD and policy.product(PASS) == HEAD


def test_falcon_is_not_said_to_have_silu_or_rsqrt():
    v = RunVerdict.of(trace_of(ONNX / "falcon.onnx"))
    for lv in v.layers:
        assert said_forms(lv.expected) == ["where mask"], lv.expected
        assert "silu" not in lv.expected and "rsqrt" not in lv.expected


@pytest.mark.parametrize("case", sorted(ONNX.glob("*.onnx")), ids=lambda p: p.stem)
def test_the_forms_named_are_those_the_layer_had_rewritten(case):
    """Each layer that lists the exporter's product names exactly the forms of the pass's matches in that layer (by
    the match's own path), in the pass's rule order."""
    trace = trace_of(case)
    rules = {r.name: r for r in PASSES[PASS].rules}
    order = list(rules)
    checked = 0
    for lv in RunVerdict.of(trace).layers:
        said = said_forms(lv.expected)
        if said is None:
            continue
        made = {m.rule for s in trace.steps if s.pass_name == PASS for m in s.matches if m.layer == lv.layer}
        want = list(dict.fromkeys(rules[r].form for r in sorted(made, key=order.index)))
        assert said == want, (lv.layer, lv.expected)
        checked += bool(want)
    if case.stem == "falcon":
        assert checked == 2
