"""What a layer box says in a pass's before and after panes (newcomer run 18, finding 5).

esm.qdyn at version 22 (`after fuse_attention_block`, a pass that changed nothing), view collapsed: the before pane's
boxes read `at this version: △ 2 gaps in rlxviz's ops: ...` in blue, stretched to the pane's width, while the after
pane, the version selected, read `at this version: no fused op; rewritten as rope×2, attention, gelu` in grey with no
△: the version where the gap was found did not show it, and the before pane called the pass's finding the state of
the graph. Decision: `at this version:` says what the graph drawn holds (`LayerGroup.state`), the same in both panes of
one graph; what the pane's pass found there is its own line, named by the pass (`fuse_attention_block: △ 2 gaps ...`,
`LayerGroup.found_by`), on both panes (the before pane's pass runs on its graph, the after pane's made it), and long
words wrap (`box_words.WRAP`).
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
from rlxviz.viz.layers import layer_groups

FIX = Path(__file__).parent / "fixtures" / "onnx"
ESM = FIX / "cases" / "esm.qdyn.onnx"
MODELS = [ESM, FIX / "cases" / "granite.onnx", FIX / "cases" / "deit.ortopt.onnx", FIX / "bert.onnx"]
GAPS = "△ 2 gaps in rlxviz's ops: its integer-matmul Q/K/V projections (integer_qkv), default_scale"


@functools.cache
def _trace(path: Path) -> Trace:
    return trace_of(path)


def _boxes(t: Trace, version: int, side: str) -> dict:
    g, ov, kw = picture(t, View(version, "layers", side))
    return layer_groups(g, ov, kw.get("verdicts"), kw.get("placed"), kw.get("refusals"))


def _label(source: str, key: str) -> str:
    """The text of box `key`'s label in a layers-view DOT source, markup dropped."""
    line = re.search(rf"^\s*{key} \[label=<(.*)$", source, re.M).group(1)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", line.split("> ", 1)[0])).split())


def test_esm_qdyn_version_22_says_the_gap_in_both_panes_named_by_its_pass():
    t = _trace(ESM)
    assert t.versions()[22][0] == "after fuse_attention_block" and not t.steps[21].changed
    labels = {side: _label(dot(t, View(22, "layers", side)), "layer0") for side in ("before", "after")}
    for side, label in labels.items():
        assert "at this version: no fused op; rewritten as rope×2, attention, gelu" in label, (side, label)
        assert f"fuse_attention_block: {GAPS}" in label, (side, label)
        assert f"at this version: {GAPS}" not in label and "at this version: △" not in label, (side, label)
    assert labels["before"] == labels["after"]


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_a_pass_that_changed_nothing_draws_alike_boxes_in_both_panes(path):
    t = _trace(path)
    checked = 0
    for k, s in enumerate(t.steps, 1):
        if s.changed:
            continue
        before, after = _boxes(t, k, "before"), _boxes(t, k, "after")
        assert before.keys() == after.keys(), (path.stem, s.pass_name)
        for key, b in before.items():
            a = after[key]
            assert (b.status, b.tone, b.state, b.found_by) == (a.status, a.tone, a.state, a.found_by), \
                (path.stem, k, s.pass_name, key)
            checked += bool(b.found_by)
    assert checked or path.stem == "bert", f"{path.stem}: no pass that changed nothing refused in a layer"


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_at_this_version_says_the_graph_and_the_found_line_names_the_panes_pass(path):
    t = _trace(path)
    for k, s in enumerate(t.steps, 1):
        for side in ("before", "after"):
            for b in _boxes(t, k, side).values():
                if b.layer is None:
                    continue
                assert b.state in ("fused", "partly fused", "rewritten", "unfused"), (path.stem, k, b.state)
                assert b.found_by in ("", s.pass_name), (path.stem, k, side, b.found_by)
                assert bool(b.found_by) == (b.status in ("rejected", "○ not near-miss", "△ gap in rlxviz's ops")), \
                    (path.stem, k, side, b.status)


def test_the_gap_boxes_are_no_wider_than_the_others():
    """The box label's longest line stays near `width` (2.6 in): esm.qdyn's gap words, on one line, drew its boxes as
    wide as the pane."""
    t = _trace(ESM)
    source = dot(t, View(22, "layers", "before"))
    line = re.search(r"^\s*layer0 \[label=<(.*)$", source, re.M).group(1).split("> ", 1)[0]
    longest = max(len(html.unescape(re.sub(r"<[^>]+>", "", x))) for x in line.split("<BR/>"))
    assert longest <= 60, (longest, line)
