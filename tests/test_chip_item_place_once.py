"""A chip tooltip's item names its place once.

Granite's fuse_attention_block chip (`△`, a gap in rlxviz's ops) read "layers.0.self_attn:
fuse_attention_block.qkv_attention_out (default_scale) @ %207 (layers.0.self_attn): ...": the item's path, then the
not-expected line's own place. Every other item names its place once, `%ANCHOR (PATH): RULE (GUARD)`
(`places.near_miss_item`, an illegal-here item `%ANCHOR (PATH): RULE (GUARD): why`); a not-expected or gap item now
does too, the why after it as `explain` words it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlxviz.app.panels import op_gap_mark
from rlxviz.passes.trace import place_label
from rlxviz.passes.why.places import places
from rlxviz.passes.why.policy import NOT_EXPECTED_WHY
from rlxviz.passes.why.verdict import OP_GAP_GROUP

GRANITE = Path(__file__).parent / "fixtures" / "onnx" / "cases" / "granite.onnx"
RULE = "fuse_attention_block.qkv_attention_out (default_scale)"


@pytest.fixture(scope="module")
def block_places():
    from test_near_miss_rule import trace_of

    t = trace_of(GRANITE)
    return places(t, next(k for k, s in enumerate(t.steps) if s.pass_name == "fuse_attention_block"))


def test_a_gap_item_names_its_place_once(block_places):
    p = block_places
    assert p.excused_at[OP_GAP_GROUP] == [207, 210]
    for item, at, layer in zip(p.gaps, p.excused_at[OP_GAP_GROUP], (0, 1), strict=True):
        place = place_label(at, f"layers.{layer}.self_attn", with_node=True)  # `%207 (layers.0.self_attn)`
        assert item.startswith(f"{place}: {RULE}: attn (node "), item
        # a gap's item says what rlxviz lacks, not "why it is not expected here" (its own heading: test_gap_heading.py)
        assert " @ %" not in item and "; rlxviz has no " in item and NOT_EXPECTED_WHY not in item, item


def test_the_chips_tooltip_says_each_place_once(block_places):
    p = block_places
    tip = op_gap_mark(p.gaps, p.excused_at[OP_GAP_GROUP], p.lacks)
    place = place_label(207, "layers.0.self_attn", with_node=True)
    assert tip.count(f"{place}: {RULE}: ") == 1 and "@ %207" not in tip, tip
