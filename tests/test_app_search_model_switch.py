"""A node-id query does not outlive its model (issue 39, a newcomer run): `%795` typed in the after pane's search box
stayed there when another model was chosen and read "%795 — no match" on it, though a node id names one model's node.
A term (`softmax`) carries over on purpose (`test_browser_zoom_search.py`: a kept term finds the next model's hits).

Decision: when the pane's scope names another model (`ZoomScope`'s model part), a query that starts with `%`
(`graphpane.NODE_QUERY`) is cleared; within one model (a version step, another view, a new run) every query stays.
No browser: `kept_query` is the rule in Python, and the ESM's own `keptQuery` is run under node on the same cases."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from rlxviz.app.graphpane import _ESM, ZoomScope, kept_query, scope_model

MINILM, BERT = object(), object()


def _scopes() -> tuple[str, str, str, str]:
    """(minilm full, minilm focus on layer 3, bert-tiny full, minilm full again): the scopes the panes get."""
    z = ZoomScope()
    return z(MINILM, "full"), z(MINILM, "focus", 3), z(BERT, "full"), z(MINILM, "full")


CASES = [  # (query, scope before, scope after, kept?)
    ("%795", 0, 2, False), (" %12", 0, 2, False), ("%", 2, 3, False),
    ("softmax", 0, 2, True), ("layer_norm", 2, 3, True), ("795", 0, 2, True), ("ln1 (role h1)", 0, 2, True),
    ("%795", 0, 1, True), ("%795", 0, 0, True),
]
"""Index into `_scopes`: 0 -> 2 and 2 -> 3 are model switches, 0 -> 1 a view change within minilm."""


def _want(query: str, kept: bool) -> str:
    return query if kept else ""


@pytest.mark.parametrize(("query", "was", "now", "kept"), CASES)
def test_a_node_id_query_is_cleared_on_a_model_switch_and_a_term_is_kept(query, was, now, kept):
    scopes = _scopes()
    assert scope_model(scopes[0]) == scope_model(scopes[1]) != scope_model(scopes[2]) != scope_model(scopes[3])
    assert kept_query(query, scopes[was], scopes[now]) == _want(query, kept)


@pytest.mark.parametrize("was", [None, "", "1:full"])
def test_a_scope_not_known_keeps_every_query(was):
    """The first picture (no scope yet) or a pane given no scope ('') is no promise of another model."""
    assert kept_query("%795", was, "") == "%795" and kept_query("%795", "", was) == "%795"
    if was is None:
        assert kept_query("%795", None, "1:full") == "%795"


def _browser_rule() -> str:
    """The ESM's `modelOf`, `otherModel` and `keptQuery` definitions, as written."""
    lines = [ln.strip() for ln in _ESM.splitlines() if re.match(r"\s*const (modelOf|otherModel|keptQuery) = ", ln)]
    assert len(lines) == 3, lines
    return "\n".join(lines)


def test_the_browsers_rule_is_the_same():
    node = shutil.which("node")
    assert node, "node is needed to run the pane's script"
    scopes = _scopes()
    cases = [(q, scopes[a], scopes[b]) for q, a, b, _ in CASES] + [("%795", None, "1:full"), ("%795", "", "2:full")]
    script = (_browser_rule() + f"\nconst cases = {json.dumps(cases)};\n"
              "console.log(JSON.stringify(cases.map(([q, a, b]) => keptQuery(q, otherModel(a, b)))));")
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, check=True, timeout=60).stdout
    assert json.loads(out) == [kept_query(q, a, b) for q, a, b in cases]


def test_the_pane_applies_it_before_it_takes_the_new_scope():
    """Both ways a new model's scope arrives (with its picture, `setSvg`, or apart, `rescope`, the order a patch
    hands them over in is not forced) clear the query against the scope before it, then search again."""
    for fn in ("setSvg", "rescope"):
        body = re.search(rf"const {fn} = \(\) => \{{(.*?)\}};\n", _ESM, re.S).group(1)
        assert "rebase(scope)" in body and body.index("rebase(scope)") < body.index("scope = model.scope"), fn
    rebase = re.search(r"const rebase = (.*?)\};\n", _ESM, re.S).group(1)
    assert "search.value = q" in rebase and "find('again')" in rebase, rebase  # marks, the view kept
