"""One node, one name: a message names a bound node as the drawing tags it (`ln1 (role h1)`: drawn as role `ln1`,
named h1 by the pattern), and the app's search finds every node a rejection's text names, by that name or by the
pattern's role name (a newcomer searched `h1` in minilm's teaching variant and found nothing)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlxviz.app.explain import node_decisions
from rlxviz.app.graphpane import own_text, search_hits
from rlxviz.ir import parse_ir
from rlxviz.models import VARIANTS, load_model
from rlxviz.passes import Pipeline
from rlxviz.passes.guard import role_name
from rlxviz.passes.pipeline import role_label
from rlxviz.viz.dot import node_tooltips
from rlxviz.viz.overlay import Overlay

TESTS = Path(__file__).parent
NAMED = re.compile(r"([A-Za-z_][\w.]*)(\([^()]*\))?( \(role (\w+)\))? \(node (\d+)")
"""A node named in a message: `NAME (node N, ...)`, `OP(attrs) (node N, ...)` or `ROLE (role LABEL) (node N, ...)`."""


def _graph(which: str):
    if which == "scalar-bias":
        return parse_ir((TESTS / "data" / "reliability" / "ir_scalar_bias_layer1.ir").read_text())
    if which == "deepnorm":
        return parse_ir((TESTS / "data" / "cases" / "n4-06-deepnorm-residual.rlx").read_text())
    model, variant = which.split(":")
    return load_model(model, seq=8, variant=VARIANTS[variant]).graph


@pytest.mark.parametrize("which", ["bert-tiny:extra_h1_user", "minilm:extra_h1_user", "bert-tiny:output_intermediate",
                                   "scalar-bias", "deepnorm"])
def test_every_node_a_rejection_names_is_found_by_the_search(which):
    trace = Pipeline.canonical().run(_graph(which))
    checked = 0
    for step in trace.steps:
        if not step.rejections:
            continue
        tips = node_tooltips(step.before, Overlay.before(step, trace=trace))
        for r in step.rejections:
            for m in NAMED.finditer(f"{r.message}\n{r.hint}"):
                name, attrs, composite, label, node = m.group(1), m.group(2), m.group(3), m.group(4), int(m.group(5))
                if node not in tips:  # a folded weight, or a node of another version: not drawn here
                    continue
                queries = [name + (composite or "")] if attrs is None else [name]
                queries += [label] if label else []
                for q in queries:
                    assert node in search_hits(tips, q), (which, r.guard, q, node, own_text(tips[node]))
                checked += 1
    assert checked, which


def test_the_h1_node_has_one_name_in_messages_hints_and_the_drawing():
    trace = Pipeline.canonical().run(_graph("minilm:extra_h1_user"))
    step = next(s for s in trace.steps if s.pass_name == "fuse_transformer_layer")
    r = next(r for r in step.rejections if r.guard == "h1_user_count")
    ln1 = r.bindings["ln1"]
    assert r.message.startswith(f"ln1 (role h1) (node {ln1}, ")
    assert "ln1 (role h1)" in r.fix and " h1 as " not in r.fix
    tips = node_tooltips(step.before, Overlay.before(step, trace=trace))
    assert "roles: ln1 (role h1)" in tips[ln1]
    assert ln1 in search_hits(tips, "h1") and ln1 in search_hits(tips, "ln1 (role h1)")
    assert search_hits(tips, f"%{ln1}") == [ln1]
    # the inspector names the node's role in the refusal the same way
    mine = [d for d in node_decisions(trace, ln1) if d["guard"] == "h1_user_count"]
    assert mine and {d["role"] for d in mine} == {"ln1 (role h1)"}, mine


def test_role_name_rule():
    assert role_name("ln1", "h1") == "ln1 (role h1)"  # a name the pattern gives: after the drawn role
    assert role_name("mean", "mean") == "mean"
    assert role_name("mm", "the matmul") == "the matmul"  # words, not a name: drawn and said as they are
    assert role_label("fuse_transformer_layer.bert_post_ln", "ln1") == "ln1 (role h1)"
    assert role_label("fuse_transformer_layer.bert_post_ln", "fc1") == "fc1"
    assert role_label("no_such.rule", "x") == "x"


def test_the_browser_search_reads_the_same_lines_as_own_text():
    from rlxviz.app import graphpane

    assert f"/^({'|'.join(graphpane.OWN_LINES)}): /.test(l)" in graphpane._ESM
    tip = "%7 layer_norm -> f32[1, 8, 64]\npath: a.b\nroles: ln1 (role h1)\noperands: x=%3 add"
    assert graphpane.own_text(tip) == "layer_norm -> f32[1, 8, 64]\npath: a.b\nroles: ln1 (role h1)"
    assert graphpane.search_hits({7: tip}, "H1") == [7] and graphpane.search_hits({7: tip}, "add") == []
