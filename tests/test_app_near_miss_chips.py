"""The version chips count near-misses only (issue 39): on bert-tiny and MiniLM, whose fusions all happen, the
`fuse_residual_ln` chip showed ✗1, which a newcomer reads as a failure; the one refusal was the embeddings'
broadcast sum, a lookalike (`guard.NOT_A_CANDIDATE`), not a near-miss. The chips now count what
`report.missed_fusions` counts (`Rejection.near_miss`: no `guard.NOT_NEAR_MISSES` kind), hard refusals as before, and
show a lookalike or the model's own term as a neutral `○N` whose tooltip is the verdict's heading for its kind
(`passes.why.text.left_out_heading`). The pass filter ("hide passes that changed nothing" keeps a pass whose only
events are rejections) keeps a pass whose chip counts anything, ✗ or ○, so no counted place is in no chip.
"""

from __future__ import annotations

import html
import re

import pytest
from test_left_out_kinds import broadcast_sum

from rlxviz.app.derived import not_near_misses, refusals
from rlxviz.app.jobs import Runner
from rlxviz.app.panels import NOT_NEAR_MISS_MARK, VersionStepper
from rlxviz.app.state import AppState
from rlxviz.passes import missed_fusions
from rlxviz.passes.guard import NOT_A_CANDIDATE, NOT_NEAR_MISSES
from rlxviz.passes.trace import place_label
from rlxviz.passes.why.places import own_item
from rlxviz.passes.why.verdict import RunVerdict


def app(**kw: object) -> AppState:
    kw.setdefault("seq", 8)
    return AppState(runner=Runner(background=False), **kw)


def chips(s: AppState) -> dict[str, str]:
    """Version label -> the HTML of its chip."""
    html = VersionStepper(state=s)._counts()
    out = {}
    for c in html.split("<span class='rv-chip'")[1:]:
        label = re.search(r"title='([^']*)'>", c).group(1).split(" (", 1)[0]
        out[label] = c
    return out


@pytest.mark.parametrize("preset", ["bert-tiny", "minilm-shaped"])
def test_a_healthy_berts_chips_show_no_rejection_and_the_lookalike_apart(preset):
    s = app(preset=preset)
    assert RunVerdict.of(s.trace).ok  # every fusion happened
    shown = chips(s)
    assert not [label for label, c in shown.items() if "✗" in c], shown
    chip = shown["after fuse_residual_ln"]
    mark = re.search(r"<span class='rv-lookalike' title='([^']*)'[^>]*>" + NOT_NEAR_MISS_MARK + r"(\d+)</span>", chip)
    assert mark is not None, chip
    assert mark.group(2) == "1"
    # the place by its node and path, its rule and guard, then the refusal's reason, as `explain` lists a lookalike
    (r,) = [r for r in s.trace.rejections if r.kind == NOT_A_CANDIDATE]
    item = own_item(r, s.trace)
    assert item.startswith(f"%{r.anchor} (embeddings.LayerNorm): fuse_residual_ln.residual (residual_same_shape): x ")
    assert html.unescape(mark.group(1)) == ("1 at 1 node (one per pattern and place): "
                                            f"1 lookalike, not a candidate (nothing to fix, not a near-miss): {item}")
    assert "c62828" not in chip  # not in the rejection's red
    row = next(r for r in s.version_rows() if r["version"] == "after fuse_residual_ln")
    assert row["rejections"] == 0 and row["not_near_misses"] == {NOT_A_CANDIDATE: [item]}


# a reader the model returns (extra_h1_user, output_intermediate) is illegal for its layer, no near-miss
# (`test_illegal_one_rule`): the dead reader is the near-miss
@pytest.mark.parametrize("variant", ["dead_h1_user", "over_threshold"])
def test_a_real_near_miss_still_counts_and_the_rule_is_missed_fusions(variant):
    """Each chip's ✗ counts its pass's hard refusals of a near-miss kind; every hard missed fusion of the run is
    counted on its pass's chip; the lookalike stays out of every count."""
    s = app(preset="bert-tiny")
    s.apply_variant(variant)
    rows = {r["version"]: r for r in s.version_rows()}
    assert any(r["rejections"] for r in rows.values()), variant
    steps = {f"after {st.pass_name}": st for st in s.trace.steps}
    for label, r in rows.items():
        if label == "input":
            continue
        st = steps[label]
        assert r["rejections"] == sum(not x.soft and x.kind not in NOT_NEAR_MISSES for x in st.rejections)
        assert all(x.kind not in NOT_NEAR_MISSES for x in refusals(st))
        shown = chips(s)[label]
        assert (f"✗{r['rejections']}<" in shown) == bool(r["rejections"]), shown
    hard = {(x.rule, x.anchor) for x in s.trace.rejections if not x.soft}
    for m in missed_fusions(s.trace):
        if (m.pattern, m.node) in hard:
            st = next(st for st in s.trace.steps if any((x.rule, x.anchor) == (m.pattern, m.node)
                                                        for x in st.rejections))
            assert rows[f"after {st.pass_name}"]["rejections"] >= 1, m


@pytest.mark.parametrize("pos", ["f32[1, 8]", "f32[4, 8]"])
def test_a_pass_that_only_met_a_lookalike_stays_listed_with_its_mark(pos):
    """The broadcast sum into a LayerNorm, and nothing fuse_residual_ln could fuse: its pass changed nothing and
    refused no near-miss, but its chip counts the lookalike (○1), so "hide passes that changed nothing" keeps it
    listed (a hidden one put the place in no chip): no ✗, the ○1."""
    s = app(source="ir", ir_text=broadcast_sum(pos, steps=3))
    step = next(st for st in s.trace.steps if st.pass_name == "fuse_residual_ln")
    assert not step.changed and step.rejections and not refusals(step)
    (r,) = [r for r in step.rejections if r.kind == NOT_A_CANDIDATE]  # without the trace: the message as recorded
    assert not_near_misses(step) == {NOT_A_CANDIDATE: [f"%{r.anchor} (embeddings.LayerNorm): {r.rule} ({r.guard}): "
                                                       f"{r.message}"]}
    assert s.hide_unchanged and "after fuse_residual_ln" in s.version_labels
    chip = chips(s)["after fuse_residual_ln"]
    assert "✗" not in chip and f">{NOT_NEAR_MISS_MARK}1</span>" in chip


def test_the_faded_mark_says_what_it_counts_and_groups_its_places_by_node(monkeypatch):
    """deit (ONNX Runtime's optimizer) showed ○7 on fuse_residual_ln, read as seven refusals at seven norms: they sit at
    four nodes, two patterns (`residual`, `biased`) at three of them. A place is a pattern's candidate at one node
    (`verdict.PLACE_UNIT`); the tooltip says so and how many nodes, and lists the places node by node."""
    from pathlib import Path

    from rlxviz.app.sources import ALLOWED_DIRS_ENV
    from rlxviz.passes.why.places import PLACE_UNIT, places
    from rlxviz.session import isolated

    monkeypatch.setattr(isolated, "run_isolated", lambda fn, *a, timeout_s=None, wall_s=None, max_bytes=None,
                        what="", job=None, **kw: fn(*a, **kw))
    zoo = Path(__file__).resolve().parent / "fixtures" / "onnx" / "zoo"
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(zoo))
    s = app(preset="bert-tiny")
    s.param.update(checkpoint_dir=str(zoo / "deit.ortopt.onnx"), source="checkpoint")
    k = next(i for i, st in enumerate(s.trace.steps) if st.pass_name == "fuse_residual_ln")
    p = places(s.trace, k)
    n, nodes = sum(len(v) for v in p.excused.values()), p.nodes()
    assert n > nodes > 1  # two patterns at some node
    chip = chips(s)["after fuse_residual_ln"]
    tip = re.search(r"class='rv-lookalike' title='([^']*)'[^>]*>" + NOT_NEAR_MISS_MARK + rf"{n}</span>", chip)
    assert tip is not None, chip
    assert tip.group(1).startswith(f"{n} at {nodes} nodes ({PLACE_UNIT}): "), tip.group(1)[:200]
    assert tip.group(1).count("2 patterns at one node: ") == n - nodes
    from rlxviz.viz.overlay import before_caption  # the before pane's caption (the CLI's drawings too): the nodes

    assert before_caption(s.trace.steps[k], s.trace).endswith(f"○{n} not near-misses at {nodes} nodes")


@pytest.mark.parametrize("variant", ["dead_h1_user", "over_threshold"])
def test_the_rejection_mark_names_its_places_node_by_node(variant):
    """The ✗ tooltip said only what it counts ("rejections of this pass (near-misses, one per pattern and place)")
    while the faded ○'s names its places node by node: a newcomer had to open the table to learn where. It now names
    them the same way, from the same reading (`passes.why.places.places`): how many at how many nodes, each place
    as `%ANCHOR (PATH): RULE (GUARD)` (`trace.place_label` with its node, as every chip item names its place)."""
    from rlxviz.passes.why.places import PLACE_UNIT, places

    s = app(preset="bert-tiny")
    s.apply_variant(variant)
    rows = {r["version"]: r for r in s.version_rows()}
    seen = 0
    for k, st in enumerate(s.trace.steps):
        p = places(s.trace, k)
        label = f"after {st.pass_name}"
        if not p.near_misses or label not in rows:
            continue
        seen += 1
        row = rows[label]
        want = [f"{place_label(r.anchor, r.path, with_node=True)}: {r.rule} ({r.guard})" for r in p.near_misses]
        assert row["rejected"] == want and row["rejected_at"] == [r.anchor for r in p.near_misses]
        tip = re.search(r"<span class='rv-rejected' title='([^']*)' style='[^']*'>✗(\d+)</span>", chips(s)[label])
        assert tip is not None and int(tip.group(2)) == len(want), chips(s)[label]
        nodes = len({r.anchor for r in p.near_misses})
        head = f"{len(want)} at {nodes} node{'s' * (nodes != 1)} ({PLACE_UNIT}): "
        assert tip.group(1).startswith(head), tip.group(1)
        assert all(w in tip.group(1) for w in want), tip.group(1)
    assert seen, variant


def test_the_rejection_marks_places_group_by_node_and_are_text_not_markup():
    """Two patterns refused at one node are one node's entry, as in the ○ tooltip; a node's name from the model is
    text in the tooltip, never markup (it cannot close the attribute or open a tag)."""
    from rlxviz.app.panels import rejected_mark

    items = ["enc.0': fuse_a.p (g1)", "enc.0': fuse_b.q (g2)", "x<b onmouseover=alert(1)>: fuse_a.p (g1)"]
    mark = rejected_mark(items, [4, 4, 9], "color:#c62828")
    tip = re.fullmatch(r" <span class='rv-rejected' title='([^']*)' style='color:#c62828'>✗3</span>", mark)
    assert tip is not None, mark
    assert "<b" not in mark and "&lt;b onmouseover=alert(1)&gt;" in tip.group(1)
    assert tip.group(1).startswith("3 at 2 nodes (one per pattern and place): rejections of this pass (near-misses): ")
    assert "2 patterns at one node: enc.0&#x27;: fuse_a.p (g1) | enc.0&#x27;: fuse_b.q (g2); x&lt;b" in tip.group(1)
