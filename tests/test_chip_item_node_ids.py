"""Every chip item names its place by its node: `%ANCHOR (PATH)`, as `rlxviz explain -v` lists places.

A chip's tooltip mixed two forms: the `○` items of the model's own term, a lookalike or a declined merge read
`%39 (PATH): RULE (GUARD): MESSAGE` (`places.own_item`), while the `✗` items (`places.near_miss_item`) and the other
`○`/`△` groups (not expected here, gaps, illegal here, taken later, a declined merge that left nodes out) read
`PATH: RULE (GUARD)...`: one tooltip, two forms, and the `✗` items gave no node id to search for. Each item now starts
with `trace.place_label(anchor, path, with_node=True)`. Checked on every chip of three exports of other
architectures (an encoder-decoder, a decoder exported through dynamo's SDPA, a vision encoder ONNX Runtime
optimized: `○` and `△` items, no `✗`) and of bert-tiny with a dead reader on layer 1's attention output (the ✗ of
the app's "Break a layer"), each item against its anchor (`rejected_at`, `not_near_miss_at`, `op_gap_at`) and the
step's graphs.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from rlxviz.app.derived import version_rows
from rlxviz.app.jobs import Runner
from rlxviz.app.panels import counts_html
from rlxviz.app.sources import ALLOWED_DIRS_ENV
from rlxviz.app.state import AppState
from rlxviz.passes.trace import place_label
from rlxviz.session import isolated

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
_NODE = re.compile(r"^%(\d+) \(")
"""The head of a chip item: its place's node, `%ANCHOR (`."""


BROKEN = "dead_h1_user"
"""The app's variant of bert-tiny whose chips have `✗` items (`AppState.apply_variant`)."""


@pytest.fixture(scope="module", params=["t5.encdec", "gpt-neox.dynamo-sdpa", "beit.ortopt", BROKEN])
def opened(request) -> AppState:
    """The app with `ZOO/STEM.onnx` opened at seq 8 (the run in this process), or bert-tiny with variant `BROKEN`,
    every version listed."""
    mp = pytest.MonkeyPatch()
    mp.setattr(isolated, "run_isolated", lambda fn, *a, timeout_s=None, wall_s=None, max_bytes=None,
               what="", job=None, **kw: fn(*a, **kw))
    mp.setenv(ALLOWED_DIRS_ENV, str(ZOO))
    try:
        s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
        if request.param == BROKEN:
            s.apply_variant(BROKEN)
        else:
            s.param.update(checkpoint_dir=str(ZOO / f"{request.param}.onnx"), source="checkpoint")
            assert s.model is not None and s.model.name.startswith(request.param), s.message
        assert s.trace is not None, s.message
        s.hide_unchanged = False
        yield s
    finally:
        mp.undo()


def _items(row: dict) -> list[tuple[str, str, int]]:
    """`(mark, item, anchor)` of every item of a version row's chip marks: `✗` (`rejected`), `○` per group
    (`not_near_misses`) and `△` (`op_gaps`), each with its anchor node from the row."""
    out = [("✗", x, a) for x, a in zip(row["rejected"], row["rejected_at"], strict=True)]
    for group, xs in row["not_near_misses"].items():
        out += [(f"○ {group}", x, a) for x, a in zip(xs, row["not_near_miss_at"][group], strict=True)]
    return out + [("△", x, a) for x, a in zip(row["op_gaps"], row["op_gap_at"], strict=True)]


def test_every_chip_item_starts_with_its_node_and_path(opened):
    s = opened
    trace = s.chip_trace()
    rows = version_rows(trace, [(k, label) for k, (label, _g) in enumerate(trace.versions())])
    marks: set[str] = set()
    for k, row in enumerate(rows):
        if not k:
            continue
        step = trace.steps[k - 1]
        for mark, item, anchor in _items(row):
            marks.add(mark.split(" ", 1)[0])
            m = _NODE.match(item)
            assert m is not None and int(m.group(1)) == anchor, (row["version"], mark, item)
            assert anchor in step.before or anchor in step.after, (row["version"], item)
            node = step.before[anchor] if anchor in step.before else step.after[anchor]
            assert item.startswith(f"{place_label(anchor, node.path, with_node=True)}: "), (row["version"], item)
    assert marks >= ({"✗"} if s.variant == BROKEN else {"○"}), marks  # the chips still have items: a check


def test_every_tooltip_says_each_item_whole(opened):
    """The tooltips show the items as the rows name them (`panels.counts_html`, grouped by node), so each item of a
    chip, `%ANCHOR (PATH): ...`, is in its chip's HTML whole (unescaped)."""
    s = opened
    rows = s.version_rows()
    chips = counts_html(rows, s.version, s.hidden_before).split("<span class='rv-chip'")[1:]
    assert len(chips) == len(rows)
    for row, chip in zip(rows, chips, strict=True):
        said = html.unescape(chip)
        for mark, item, _ in _items(row):
            assert item in said, (row["version"], mark, item)
