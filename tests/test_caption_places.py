"""The before-pane of a pass counts rejections as its version chip does: by place (a rule's candidate at one anchor),
never per failing guard, and draws a candidate's role labels once per node however many of its guards failed.

A newcomer run of the DeepNorm case (`n4-06`, one post-LN layer refused by FusedTransformerLayer at four guards of
one candidate) found the chip saying `✗1` while the before pane's caption said "0 match(es), 4 rejection(s)" and every
role label stacked four times ("hidden hidden hidden hidden", "attn" x4, ...): one copy per failing guard.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from test_near_miss_rule import DEEPNORM, app, chips, deepnorm_layers, trace_of
from test_viz import h1_rejection, node_stmt

from rlxviz.app.derived import refusals
from rlxviz.models import VARIANTS, load_model
from rlxviz.passes import Trace
from rlxviz.passes.guard import NOT_A_CANDIDATE
from rlxviz.passes.trace import PassStep
from rlxviz.session.render import View, dot
from rlxviz.viz import Overlay, render_dot

FTL = "fuse_transformer_layer"


def _roles(label: str) -> list[str]:
    """The role names of a node's HTML label (its bold italic lines), in order: `ln1 (role h1)`, the node named as
    messages name it (`guard.role_name`), is the role `ln1`."""
    return [re.sub(r" \(role \w+\)$", "", r) for r in re.findall(r"<I>([^<]*)</I>", label.split("tooltip=")[0])]


def roles_per_node(text: str) -> dict[str, list[str]]:
    """DOT node name -> the role labels drawn on it (the bold italic lines of its HTML label), in order."""
    return {m.group(1): _roles(m.group(2)) for m in re.finditer(r"^\s*(n\d+) \[(.*)\]$", text, re.M)}


def caption(text: str) -> str:
    (line,) = [m.group(1) for m in re.finditer(r'^\s*label="(before [^"]*)"', text, re.M)]
    return line


def ftl_version(t: Trace) -> int:
    return next(i for i, s in enumerate(t.steps) if s.pass_name == FTL) + 1


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_deepnorm_before_pane_counts_places_and_draws_each_role_once(layers):
    """DeepNorm stacked 1-3 times: the caption counts one place per refused layer, never per failing guard (DeepNorm's
    scaled residual is a gap in rlxviz's ops: the chip's △N, no ✗), and no node carries the same role label twice."""
    s = app(source="ir", ir_text=deepnorm_layers(layers))
    t = s.trace
    k = ftl_version(t)
    step = t.steps[k - 1]
    guards = [r for r in step.rejections if not r.soft]
    assert len(guards) >= 2 * layers
    assert f"△{layers}<" in chips(s)["after fuse_transformer_layer"]
    text = dot(t, View(k, "full", "before"))
    want = f"before {FTL}, in the graph: 0 match(es), 0 rejected places, △{layers} place"
    assert caption(text).startswith(want), caption(text)
    assert not refusals(step, t)
    drawn = roles_per_node(text)
    assert any(drawn.values())
    for node, roles in drawn.items():
        assert len(roles) == len(set(roles)), (node, roles)
    # every role of every refused candidate is still drawn, on its node (params are folded, not drawn)
    for r in (r for r in guards if r.headline):
        for role, i in r.bindings.items():
            if f"n{i}" in drawn:
                assert role in drawn[f"n{i}"], (role, i)


def test_the_app_pane_and_the_cli_read_the_same_caption():
    """The app's before pane (`Derived.dot`, side before) and an overlay made with the trace say the same words."""
    t = trace_of(DEEPNORM)
    step = t.steps[ftl_version(t) - 1]
    want = Overlay.before(step, trace=t).title
    assert want == Overlay.before(step).worded_by(t, step).title
    assert "0 rejected places, △1 place at a gap" in want  # DeepNorm: one place, a gap in rlxviz's ops
    assert "rejection(s)" not in want


@pytest.fixture(scope="module")
def tiny():
    return load_model("bert-tiny", 1, 8, variant=VARIANTS["extra_h1_user"]).graph


def _step(g, rejections) -> PassStep:
    return PassStep(FTL, g, g, [], rejections=list(rejections))


def test_one_candidate_refused_at_three_guards_is_one_place_drawn_once(tiny):
    """A hand-made candidate refused at three guards: one place in the caption (no trace: the refusal's kind
    decides), its roles once per node, each guard still named on the drawing."""
    r = h1_rejection(tiny)
    more = [dataclasses.replace(r, guard=g, headline=False) for g in ("ln1_shape", "mask_kind")]
    step = _step(tiny, [r, *more])
    ov = Overlay.before(step)
    assert r.near_miss
    assert ov.title == f"before {FTL}, in the graph: 0 match(es), 1 rejected place (3 failing guards)"
    text = render_dot(tiny, ov)
    for role, i in r.bindings.items():
        roles = _roles(node_stmt(text, i))
        assert roles.count(role) == 1, (role, roles)
    for g in ("h1_user_count", "ln1_shape", "mask_kind"):
        assert f"✗ {g}" in text


def test_a_refusal_that_is_no_near_miss_is_the_chips_faded_mark(tiny):
    """A hard refusal whose kind is no near-miss (a lookalike) is no rejected place: the caption adds it as the
    chip's `○N`, once for its place however many of its guards failed."""
    r = dataclasses.replace(h1_rejection(tiny), kind=NOT_A_CANDIDATE)
    assert not r.near_miss
    step = _step(tiny, [r, dataclasses.replace(r, guard="g2", headline=False)])
    assert Overlay.before(step).title == f"before {FTL}, in the graph: 0 match(es), 0 rejected places, ○1 not near-miss"


def test_two_rules_rejecting_at_the_same_node_both_show(tiny):
    """Two different rules refusing candidates at the same anchor are two places: both counted, and a node bound
    by both carries each rule's role label (a repeat guard of either rule adds none)."""
    r = h1_rejection(tiny)
    other = dataclasses.replace(r, rule="fuse_transformer_layer.other_layout",
                                bindings={"ln1": r.bindings["ln1"], "ln2": r.bindings["ln2"], "block": r.anchor})
    again = dataclasses.replace(other, guard="another_guard", headline=False)
    step = _step(tiny, [r, other, again])
    ov = Overlay.before(step)
    assert r.near_miss
    assert ov.title == f"before {FTL}, in the graph: 0 match(es), 2 rejected places (3 failing guards)"
    text = render_dot(tiny, ov)
    ln1 = _roles(node_stmt(text, r.bindings["ln1"]))
    assert ln1.count("ln1") == 2  # one per rule's place, never one per guard
    anchor = re.findall(r"<I>([^<]*)</I>", node_stmt(text, r.anchor).split("tooltip=")[0])
    assert anchor.count("ln2") == 2 and anchor.count("block") == 1
