"""A before pane labels its nodes by the rule the after pane of the same graph uses (newcomer run 22, finding 4: minilm
with "dead extra user of h1", Graph tab steps 23-27: the before pane labelled concat %314 "made beside matmul %315 (the
b operand; now gone)" while the after pane of the same version said "now in FusedAttentionBlock %380" / "now in
FusedTransformerLayer %398").

A product a later pass absorbed is "now in OP %M" (`passes.made.where_now`), read against every node of the run; the
before pane's overlay (`Overlay.before(step).worded_by(trace, step)`, `session.render.picture`) read it against no
earlier version, so it found no holder ("now gone") and named no absorbed op ("absorbed 5 node(s)" where the after
pane says "absorbed 5 node(s): FusedResidualLN×2, ..."). Version k's before pane and version k-1's after pane draw one
graph: their "made ..." and "absorbed ..." lines must be the same."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import cache

import pytest
from named_exports import FILES, ONNX

from rlxviz import session
from rlxviz.models import VARIANTS, load_model
from rlxviz.passes import Pipeline
from rlxviz.passes.trace import Trace
from rlxviz.session.render import View, dot


@cache
def _trace(name: str) -> Trace:
    if name == "minilm":  # the preset with the start strip's ② (layer 1), as the newcomer ran it
        return Pipeline.canonical().run(load_model("minilm", seq=16,
                                                   variant=replace(VARIANTS["dead_h1_user"], layer=1)).graph)
    return Pipeline.canonical().run(session.load(str(ONNX / FILES[name])).graph)


def _lines(d: str) -> dict[int, list[str]]:
    """Each drawn node's label lines in DOT source `d` that say what it was made beside or what it absorbed."""
    out = {}
    for m in re.finditer(r"^\tn(\d+) \[label=<(.*?)> color=", d, re.M):
        parts = [re.sub(r"<[^>]+>", "", x).strip() for x in re.split(r"<BR\s*/?>", m[2])]
        out[int(m[1])] = [p for p in parts if p.startswith(("made ", "absorbed ")) or "now " in p]
    return out


def _label(d: str, node: int) -> str:
    m = re.search(rf"^\tn{node} \[label=<(.*?)> color=", d, re.M)
    assert m, node
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", m[1]))


def test_minilm_concat_reads_now_in_its_holder_in_both_panes():
    trace = _trace("minilm")
    names = [s.pass_name for s in trace.steps]
    for k in range(names.index("fuse_attention_block") + 2, len(trace.steps) + 1):  # steps 23-27 of the app
        before = _label(dot(trace, View(version=k, side="before")), 314)
        after = _label(dot(trace, View(version=k - 1, side="after")), 314)
        assert "now gone" not in before, (k, before)
        now = re.search(r"now in (\w+ %\d+)", after)
        assert now and f"now in {now[1]}" in before, (k, before, after)


@pytest.mark.parametrize("name", ["minilm", "gpt-neox", "llama", "bert", "esm.qdyn"])
def test_a_before_pane_labels_as_the_after_pane_of_its_graph(name):
    trace = _trace(name)
    seen = 0
    for k in range(2, len(trace.steps) + 1):
        assert trace.steps[k - 1].before.digest == trace.steps[k - 2].after.digest
        before = _lines(dot(trace, View(version=k, side="before")))
        after = _lines(dot(trace, View(version=k - 1, side="after")))
        for i in set(before) & set(after):
            assert before[i] == after[i], (name, k, trace.steps[k - 1].pass_name, i, before[i], after[i])
            seen += bool(before[i])
    assert seen, name
