"""Every layer box a pass refused in names that pass, and a box at one gap names the gap alone (newcomer run 22,
finding 6).

t5.encdec's collapsed view at `fuse_attention_block` (version 22): decoder block 0, whose verdict is settled there,
said only "held back by rlxviz's ops / no fused op", with no `fuse_attention_block:` line, while block 1 (settled
later) had one, and the chip's △6 counted block 0's 2 places; block 1's line read `△ gap in rlxviz's ops:
default_scale, self_attention`, where `explain` says `self_attention` is the model's own term (○) that fails next
once the gap is fixed, no gap.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from test_near_miss_rule import trace_of

from rlxviz.passes import Trace
from rlxviz.session.pipeline import version_index
from rlxviz.session.render import View, picture
from rlxviz.viz.box_words import box_label
from rlxviz.viz.layers import layer_groups

T5 = Path(__file__).parent / "fixtures" / "onnx" / "zoo" / "t5.encdec.onnx"


@functools.cache
def _trace() -> Trace:
    return trace_of(T5)


def _labels(side: str) -> dict[str, str]:
    """Box title -> its label's words (tags dropped), at t5's `fuse_attention_block` pane `side`."""
    t = _trace()
    g, ov, kw = picture(t, View(version_index(t, "fuse_attention_block"), "layers", side))
    boxes = layer_groups(g, ov, kw.get("verdicts"), kw.get("placed"), kw.get("refusals"), kw.get("outside"))
    return {b.title: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", box_label(b))) for b in boxes.values()
            if b.layer is not None}


def test_each_layer_box_names_the_pass_that_refused_there():
    for side in ("before", "after"):
        labels = _labels(side)
        assert len(labels) == 4
        for title, words in labels.items():
            assert "fuse_attention_block: △ gap in rlxviz's ops: default_scale" in words, (side, title, words)


def test_a_box_at_one_gap_names_no_guard_that_is_no_gap():
    for side in ("before", "after"):
        for title, words in _labels(side).items():
            assert "self_attention" not in words, (side, title, words)


def test_the_settled_box_keeps_its_verdict_first():
    words = _labels("after")["model.decoder.block.0"]
    assert words.index("held back by rlxviz's ops") < words.index("fuse_attention_block:")
    assert "final:" not in words  # settled: the verdict's own words, not `final: ...`
