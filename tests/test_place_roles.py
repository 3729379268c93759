"""A node that places of several candidates bind says which place gives it which role (a newcomer's run).

deit.ortopt's bias-after-residual places (`fuse_matmul_bias_act.bias_after_residual`) chain: the bias add of the
place at %50 is the residual of the place at %63. The before pane drew %50 with `the bias add / the residual`, two
places' role labels merged onto one node, read as one node playing two roles in one place.

Decision: when places of more than one bind a node (`viz.dot._Drawer._roles_of`), each role label is followed by the
anchor of the place that gives it, `the bias add @ %50 / the residual @ %63` (the anchors `explain` names the places
by: `at 2 places, %50 (layers.0) and %63 (layers.0)`), one role of several places once (`mask_cond @ %38, %84`); a
node of one place keeps its bare labels. The tooltip's `roles:` line says the same.
"""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path

import pytest
from test_near_miss_rule import trace_of

from rlxviz.passes import Trace
from rlxviz.session.render import View, dot, picture
from rlxviz.viz import render_dot
from rlxviz.viz.dot import DotOptions, _Drawer

ONNX = Path(__file__).parent / "fixtures" / "onnx"
RULE = "fuse_matmul_bias_act.bias_after_residual"
CHAINED = [ONNX / "cases" / "deit.ortopt.onnx", ONNX / "ortopt" / "clip-text.ortopt.onnx",
           ONNX / "ortopt" / "whisper-encoder.ortopt.onnx"]
"""Files whose bias-after-residual places chain (a place's bias add is the next place's residual)."""
SHARED = [*CHAINED, ONNX / "ortopt" / "gpt2.ortopt.onnx", ONNX / "gpt2.onnx"]
"""Files with nodes that places of several candidates bind (chained residual norms, a mask two layers read)."""
ROLE = re.compile(r'<I>([^<]*)</I></B></FONT>(?:<FONT POINT-SIZE="8" COLOR="[^"]*"> ([^<]*)</FONT>)?')


@functools.cache
def _trace(path: Path) -> Trace:
    return trace_of(path)


def _drawn_roles(drawn: str) -> dict[int, list[tuple[str, str]]]:
    """Node id -> (role label, the places it names, `@ %63`, "" for none) of each role drawn on it."""
    out = {}
    for m in re.finditer(r"^\s*n(\d+) \[label=<(.*)>\s", drawn, re.M):
        out[int(m.group(1))] = [(html.unescape(a), html.unescape(b)) for a, b in ROLE.findall(m.group(2))]
    return out


@pytest.mark.parametrize("path", CHAINED, ids=lambda p: p.stem)
def test_a_bias_add_that_is_the_next_places_residual_says_whose_role_is_whose(path):
    t = _trace(path)
    k = next(k for k, s in enumerate(t.steps) if s.pass_name == "fuse_matmul_bias_act")
    step = t.steps[k]
    drawn = _drawn_roles(dot(t, View(k + 1, "full", "before")))
    chained = [r for r in step.rejections if r.rule == RULE and r.bindings.get("residual") in
               {x.anchor for x in step.rejections if x.rule == RULE}]
    assert chained, "no bias add that is the next place's residual"
    for r in chained:
        node = r.bindings["residual"]  # the bias add of the place before
        roles = dict(drawn[node])
        assert roles.get("the residual") == f"@ %{r.anchor}", drawn[node]
        assert roles.get("the bias add") == f"@ %{node}", drawn[node]


@pytest.mark.parametrize("path", SHARED, ids=lambda p: p.parent.name + "/" + p.stem)
def test_each_role_of_a_node_several_places_bind_names_its_places(path):
    t = _trace(path)
    seen = 0
    for k, step in enumerate(t.steps):
        if not step.rejections and not step.matches:
            continue
        g, ov, _ = picture(t, View(k + 1, "full", "before"))
        d = _Drawer(g, ov, DotOptions(max_nodes=10**6), None)
        drawn = _drawn_roles(render_dot(g, ov, max_nodes=10**6))
        for node, roles in d.roles.items():
            if node not in drawn:  # a param or constant, folded into its users' labels
                continue
            places = {p: {n for n, _, q in roles if q == p} for *_, p in roles}
            labels = drawn[node]
            if len(places) < 2:  # one place: its roles, bare
                assert sorted(labels) == sorted((n, "") for n in places.popitem()[1]), (step.pass_name, node, labels)
            elif len({a for _, a in places}) < 2:  # rules at one anchor: each place's roles, by rule
                want = [(n, f"({rule.split('.', 1)[-1]})") for (rule, _), names in places.items() for n in names]
                assert sorted(labels) == sorted(want), (step.pass_name, node, labels)
            else:  # by the anchors of the places that give the node each role, each role once
                seen += 1
                want = [(n, "@ " + ", ".join(sorted(f"%{a}" for (_, a), ns in places.items() if n in ns)))
                        for n in {n for ns in places.values() for n in ns}]
                got = [(n, "@ " + ", ".join(sorted(at.removeprefix("@ ").split(", ")))) for n, at in labels]
                assert sorted(got) == sorted(want), (step.pass_name, node, labels)
    assert seen


def test_a_node_of_one_place_keeps_its_bare_roles_and_the_tooltip_names_the_places():
    t = _trace(ONNX / "cases" / "deit.ortopt.onnx")
    k = next(k for k, s in enumerate(t.steps) if s.pass_name == "fuse_matmul_bias_act")
    drawn = html.unescape(dot(t, View(k + 1, "full", "before", 0)))
    stmt = next(x for x in drawn.splitlines() if re.match(r"\s*n50 \[", x))
    assert "roles: the bias add @ %50, the residual @ %63" in stmt
    matmul = next(x for x in drawn.splitlines() if re.match(r"\s*n47 \[", x))
    assert "<I>the matmul</I></B></FONT><BR/>" in matmul  # one place: no `@`
