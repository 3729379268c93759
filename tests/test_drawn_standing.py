"""The drawings mark each refused place as the chips and `explain` judge it (a newcomer run, the most misleading find):
granite's chip read `△2` at "after fuse_attention_block", yet its before pane drew a red dashed cluster `✗
fuse_attention_block.qkv_attention_out: default_scale` and attention %207 read `✗ default_scale / offending:
default_scale`; at "after fuse_residual_rms_norm" the caption said "0 rejected places, ○3 not near-misses" over three
red `✗ ... sum_single_user`; `rlxviz render --before` wrote `△2` in its header and `✗` on its nodes; and the node
drawer marked the gap `○ gap in rlxviz's ops`.

Decision: one reading (`passes.why.places.place_standings`, carried by `Overlay.standings`) marks every place: `✗` and
the red only for a near-miss, `△` in the gap's ink for a gap in rlxviz's ops, the faded `○` for the others, the node
saying what the place is (`○ not expected here: sum_single_user`); the node drawer's mark for a gap is `△`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from clirun import run as cli_run
from test_near_miss_rule import app, step_index, trace_of
from test_viz import node_stmt

from rlxviz.app.explain import node_report, report_markdown
from rlxviz.passes import Trace
from rlxviz.passes.trace import layer_label, layer_of
from rlxviz.passes.why.places import place_standings, places
from rlxviz.passes.why.verdict import OP_GAP_GROUP
from rlxviz.session.render import View, dot
from rlxviz.viz import styles as st

HERE = Path(__file__).parent
GRANITE = HERE / "fixtures" / "onnx" / "cases" / "granite.onnx"
GPT2 = HERE / "fixtures" / "onnx" / "gpt2.onnx"
DEEPNORM = HERE / "data" / "cases" / "n4-06-deepnorm-residual.rlx"
CLUSTER = re.compile(r'\bid=r(\d+) label="(\S) ([^:"]+): (\w+)')
NOTE = re.compile(r"<B>([✗△○]) (?:[^<:]+: )?(\w+)</B>")


@pytest.fixture(scope="module")
def granite() -> Trace:
    return trace_of(GRANITE)


def drawn_marks(t: Trace, k: int) -> dict[str, list[int]]:
    """Mark (`✗`, `△`, `○`) -> the anchors of the places the before pane of step `k` draws with it, each place once
    (a candidate refused at several guards is one place, as the chips count): read from its rejection cluster's
    label, and from the note on the node its guard marks (a place inside a match's cluster has no cluster of its
    own)."""
    text = dot(t, View(k + 1, "full", "before"))
    step = t.steps[k]
    seen: dict[tuple[str, int], set[str]] = {}
    for m in CLUSTER.finditer(text):
        r = step.rejections[int(m.group(1))]
        assert (m.group(3), m.group(4)) == (r.rule, r.guard)
        seen.setdefault((r.rule, r.anchor), set()).add(m.group(2))
    for r in step.rejections:
        at = r.subject if r.subject is not None and r.subject in step.before else r.anchor
        notes = NOTE.findall(node_stmt(text, at)) if f"n{at} [" in text else []
        seen.setdefault((r.rule, r.anchor), set()).update(mark for mark, guard in notes if guard == r.guard)
    out: dict[str, list[int]] = {}
    for (_, anchor), marks in seen.items():
        assert len(marks) == 1, (anchor, marks)  # one place, one mark
        out.setdefault(marks.pop(), []).append(anchor)
    return {mark: sorted(a) for mark, a in out.items()}


def chip_marks(t: Trace, k: int) -> dict[str, list[int]]:
    """What the version chip of step `k` counts (`places`): `✗` near-misses (with the soft near-misses the pane also
    draws red), `△` gaps in rlxviz's ops, `○` the other places that are no near-miss, by anchor."""
    p = places(t, k)
    soft = [h.anchor for h, stand in place_standings(t, k).values() if stand is None and h.soft]
    out = {"✗": sorted([r.anchor for r in p.near_misses] + soft), "△": sorted(p.excused_at.get(OP_GAP_GROUP, [])),
           "○": sorted(a for at in p.faded_at.values() for a in at)}
    return {mark: a for mark, a in out.items() if a}


def _traces() -> list[tuple[str, Trace]]:
    s = app(preset="bert-tiny")
    s.apply_variant("dead_h1_user")  # a true near-miss
    return [("granite", trace_of(GRANITE)), ("gpt2", trace_of(GPT2)), ("deepnorm", trace_of(DEEPNORM)),
            ("bert-tiny dead_h1_user", s.trace)]


def test_every_before_pane_marks_each_place_as_its_chip_counts_it():
    """On a gap (granite, DeepNorm), not-expected places (granite, a pre-LN GPT-2) and a near-miss (bert-tiny
    dead_h1_user), each place of each before pane wears the mark its chip counts it under, and nothing else."""
    seen = set()
    for name, t in _traces():
        for k, s in enumerate(t.steps):
            if s.rejections:
                got, want = drawn_marks(t, k), chip_marks(t, k)
                assert got == want, (name, s.pass_name, got, want)
                seen |= set(got)
    assert seen == {"✗", "△", "○"}  # the cases hold every kind of place


def test_granites_attention_gap_is_drawn_as_a_gap_never_in_red(granite):
    t = granite
    k = step_index(t, "fuse_attention_block")
    text = dot(t, View(k + 1, "full", "before"))
    assert "in the graph: " in text and "△2 places at gaps in rlxviz's ops" in text
    assert "✗" not in text and st.REJECT not in text and st.REJECT_FILL not in text
    n207 = node_stmt(text, 207)
    assert "△ gap in rlxviz's ops: default_scale" in n207 and "offending" not in n207
    assert "△ fuse_attention_block.qkv_attention_out: default_scale (gap in rlxviz's ops)" in text


def test_granites_not_expected_norms_are_faded_and_say_what_they_are(granite):
    t = granite
    k = step_index(t, "fuse_residual_rms_norm")
    text = dot(t, View(k + 1, "full", "before"))
    assert "0 rejected places, ○3 not near-misses" in text
    assert "✗" not in text and st.REJECT not in text
    assert text.count("○ not expected here: sum_single_user") >= 3
    assert text.count("○ fuse_residual_rms_norm.residual_no_beta: sum_single_user (not expected here)") == 3


def test_a_near_miss_keeps_its_red_cross():
    s = app(preset="bert-tiny")
    s.apply_variant("dead_h1_user")
    t = s.trace
    k = next(k for k, _ in enumerate(t.steps) if places(t, k).near_misses)
    text = dot(t, View(k + 1, "full", "before"))
    r = places(t, k).near_misses[0]
    assert f"✗ {r.rule}: {r.guard}" in text and st.REJECT in text


def test_the_node_drawer_marks_a_gap_with_a_triangle(granite):
    t = granite
    k = step_index(t, "fuse_attention_block")
    text = report_markdown(node_report(t.steps[k].before, 207, t))
    assert "△ gap in rlxviz" in text, text
    assert "○ gap in rlxviz" not in text


def test_the_drawer_keeps_the_faded_circle_for_not_expected(granite):
    t = granite
    k = step_index(t, "fuse_residual_rms_norm")
    anchor = next(h.anchor for h, stand in place_standings(t, k).values() if stand is not None)
    text = report_markdown(node_report(t.steps[k].before, anchor, t))
    assert "○ not expected here" in text and "△" not in text


def test_cli_render_before_marks_the_gap_as_its_header_counts_it(capsys, tmp_path):
    out = tmp_path / "gr.svg"
    code, _, err = cli_run(capsys, "render", GRANITE, "--after", "fuse_attention_block", "--before", "-o", out)
    assert code == 0, err
    svg = out.read_text()
    assert "△2 places at gaps in rlxviz&#39;s ops" in svg
    assert "✗" not in svg and "△ gap in rlxviz&#39;s ops: default_scale" in svg


def test_a_reader_in_another_layer_says_whose_refusal_its_mark_is():
    """n4-13 (cross-layer KV sharing), before fuse_attention_block: layer 1's attention %61 sits in its own place's
    `○ ... self_attention (the model's own term)` cluster and is the second reader of layer 0's K, so layer 0's
    `qkv_narrows_single_use` names it offending. Its mark read `○ illegal here: qkv_narrows_single_use`, as if the
    refusal were its own; a node of another layer than the place now says whose (`○ illegal here in layer 0: ...`),
    and the place's own nodes keep the plain mark."""
    t = trace_of(HERE / "data" / "cases" / "n4-13-cross-layer-kv-sharing.rlx")
    k = step_index(t, "fuse_attention_block")
    text = dot(t, View(k + 1, "full", "before"))
    before = t.steps[k].before
    r = next(r for r in t.steps[k].rejections if r.guard == "qkv_narrows_single_use")
    mine = r.subject if r.subject is not None and r.subject in before else r.anchor
    others = [i for i in r.offending if layer_of(before[i].path) != r.layer]
    assert others and layer_of(before[mine].path) == r.layer
    assert f"<B>○ illegal here: {r.guard}</B>" in node_stmt(text, mine)
    for i in others:
        stmt = node_stmt(text, i)
        assert f"<B>○ illegal here in {layer_label(r.layer)}: {r.guard}</B>" in stmt, stmt
        assert f"<B>○ illegal here: {r.guard}</B>" not in stmt
    for i in others:  # the node drawer's role says the same
        said = [d for d in node_report(before, i, t)["decisions"] if d["guard"] == r.guard]
        assert said and all(d["role"] == f"offending in {layer_label(r.layer)}" for d in said), said
