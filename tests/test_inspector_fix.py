"""The node inspector's Fix is the Why tab's and `rlxviz explain`'s for the same refusal (a newcomer run: on a
bert-base-shaped model with tanh-GELU in layer 3 the inspector said "Fix: exact GELU (gelu) fuses, but switching the
model to it changes its numbers: prefer the compiler fix" where the Why tab and the CLI said "fix: none in the model:
... its numbers could not be checked: ... over explain's budget"). Both now read the one checked verdict
(`AppState.verdict`, `AppState.advised_trace`); so does the matches table's hint column. bert-tiny stands in for the
big model, with explain's budget cut to one multiply-add where the case needs the over-budget words."""

from __future__ import annotations

import pytest
from test_app_views import tiny

from rlxviz.app.explain import decision_rows
from rlxviz.app.panels import NodeInspector
from rlxviz.app.text import md_escape
from rlxviz.app.whyview import DecisionTable
from rlxviz.passes.why.verdict import OP_GAP_GROUP
from rlxviz.session import advice


class _NoBudget(advice._Checker):
    """explain's what-if checker with a budget of one multiply-add: every reference run is over it, as bert-base's
    2.5e+10 are over the real one."""

    def __init__(self, trace, feeds, weights, budget_macs):
        super().__init__(trace, feeds, weights, 1.0)


CASES = {  # variant, the words the Why tab's fix must hold, whether explain's budget is cut, whether the rule's own
    # hint differs from the checked one (the extra reader's "none in the model" is the rule's own: no what-if)
    "tanh_gelu": ("tanh_gelu", "changes the model's numbers", False, True),
    "tanh_gelu_over_budget": ("tanh_gelu", "over explain's budget", True, True),
    "dead_h1_user": ("dead_h1_user", "reaches no graph output (dead code)", False, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_inspector_and_the_table_give_the_why_tabs_fix(case, monkeypatch):
    variant, words, tight, differs = CASES[case]
    if tight:
        monkeypatch.setattr(advice, "_Checker", _NoBudget)
    s = tiny(variant=variant)
    layer = s.variant_layer
    first = s.layer_status(layer).first
    kind = "rejected"  # the place's status in the matches table
    if variant == "tanh_gelu":  # a gap in rlxviz's ops (no first rejection): the layer op's refusal, as checked
        assert first is None and s.layer_status(layer).gap_only
        kind = OP_GAP_GROUP
        first = next(r for st in s.advised_trace().steps for r in st.rejections if r.guard == "fc1_activation")
    assert first is not None and words in first.hint, first.hint  # what the Why tab (and explain) print
    assert f"fix: {first.hint}" in s.why_layer(layer).replace("\\", "").replace("&nbsp;", " ")
    raw = next(r for st in s.trace.steps for r in st.rejections if (r.rule, r.guard) == (first.rule, first.guard))
    assert (raw.hint != first.hint) == differs  # the rule's own hint, which the inspector printed before
    # the inspector on the refused layer's subject node, in the version before the pass that refused it
    step = next(k for k, st in enumerate(s.trace.steps, 1) if st.pass_name == first.pass_name)
    s.version = s.version_labels.index(next(lbl for lbl in s.version_labels if first.pass_name in lbl))
    assert s.version_index() == step
    inspector = NodeInspector(state=s)
    s.param.update(selected_before=True, selected_node=first.subject if first.subject is not None else first.nodes[0])
    text = inspector.pane.object
    assert f"*Fix:* {md_escape(first.hint)}" in text, text
    assert not differs or md_escape(raw.hint) not in text, text
    # the matches table: the refusal's row gives the same hint
    rows = [r for r in decision_rows(s.advised_trace()) if (r["rule"], r["guard"], r["kind"]) ==
            (first.rule, first.guard, kind) and r["layer"] == layer]
    assert rows and all(r["hint"] == first.hint for r in rows), rows
    table = DecisionTable(state=s)
    shown = table.table.value
    assert first.hint in set(shown["hint"]) and (not differs or raw.hint not in set(shown["hint"]))
