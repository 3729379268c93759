"""The layer view's boxes say the final verdict at every version (issue 39, a newcomer run: at an early version the
box said what had happened so far, while docs/app.md said it shows the final verdict). The verdict is the run's one
`RunVerdict` (what the Why tab says); at a version before the layer reached its final form the box adds, labelled
`at this version:`, what the passes so far did to it."""

from __future__ import annotations

import re

import pytest

from rlxviz.ir import parse_ir
from rlxviz.models import VARIANTS, load_model
from rlxviz.passes import Pipeline
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.session.render import View, dot
from rlxviz.viz import Verdict, layers_to_dot


def _box(source: str, k: int) -> tuple[str, str]:
    """(label text without markup, tooltip) of layer k's folded box in a layers-view DOT source."""
    line = re.search(rf"^\s*layer{k} \[label=<(.*)$", source, re.M).group(1)
    label = re.sub(r"<[^>]+>", " ", line.split('> ', 1)[0])
    tip = re.search(r'tooltip="([^"]*)"', line).group(1)
    return " ".join(label.split()), tip


@pytest.fixture(scope="module", params=["none", "dead_h1_user", "tanh_gelu"])
def run(request):
    m = load_model("bert-tiny", seq=8, variant=VARIANTS[request.param])
    return Pipeline.canonical().run(m.graph)


def test_every_version_names_the_final_verdict(run):
    verdict = RunVerdict.of(run)
    last = len(run.versions()) - 1
    for version in (0, 1, last // 2, last):
        source = dot(run, View(version=version, view="layers"))
        for lv in verdict.layers:
            text, tip = _box(source, int(lv.layer))
            word = lv.status  # `fused`, `not fused`, `fused as far as rlxviz's ops go` (tanh-GELU: a gap)
            guard = lv.first.guard if lv.first is not None else ""
            if version == 0:  # the input: nothing has happened yet, and the box still says how the layer ends
                assert f"final: {word}" in text and "at this version: unfused" in text, (version, text)
                assert f"final: {word}; at this version: " in tip, tip
            if "final:" in text:  # an earlier state of the layer: the final word, then what happened so far
                assert f"final: {word}" in text and text.index("final:") < text.index("at this version:"), text
            else:  # the layer as it ends: the verdict's own word
                assert re.search(rf"\b{re.escape(word)}\b", text) and "at this version" not in text, (version, text)
            if guard:
                assert f"rejected: {guard}" in text, (version, text)
    text, _ = _box(dot(run, View(version=last, view="layers")), int(verdict.layers[0].layer))
    assert "final:" not in text  # the final graph's boxes are settled


def test_an_opened_layer_says_it_on_its_frame(run):
    lv = RunVerdict.of(run).layers[0]
    source = dot(run, View(version=0, view="layers", expanded=(int(lv.layer),)))
    word = re.escape(lv.status)
    assert re.search(rf'label="encoder\.layer\.0: final: {word}; at this version: [^"]*\[click here to fold\]',
                     source), source[:2000]


def _toy() -> str:
    return """graph toy {
  %0 = input {name="x"} : f32[2, 8]
  %1 = tanh(%0) : f32[2, 8] @encoder.layer.0.block
  %2 = add(%1, %0) : f32[2, 8] @encoder.layer.0.block
  %3 = tanh(%2) : f32[2, 8] @encoder.layer.1.block
  %4 = add(%3, %2) : f32[2, 8] @encoder.layer.1.block
  return %4
}"""


def test_an_unsettled_verdict_is_drawn_beside_the_state_so_far():
    """The drawing alone: a settled verdict is the box's word; an unsettled one is `final: ...` beside what the
    version holds (two ops, nothing fused: `unfused`), and the box keeps the colour of that state."""
    g = parse_ir(_toy())
    source = layers_to_dot(g, verdicts={0: Verdict(True, settled=False),
                                        1: Verdict(False, "h1_user_count", "h1 has 3 users", settled=False)})
    t0, tip0 = _box(source, 0)
    t1, tip1 = _box(source, 1)
    assert "final: fused" in t0 and "at this version: unfused" in t0
    assert "final: fused; at this version: unfused" in tip0
    assert "final: not fused" in t1 and "rejected: h1_user_count" in t1 and "at this version: unfused" in t1
    assert "why: h1 has 3 users" in tip1
    settled = layers_to_dot(g, verdicts={0: Verdict(True), 1: Verdict(False, "h1_user_count")})
    s0, _ = _box(settled, 0)
    s1, _ = _box(settled, 1)
    assert "final:" not in s0 + s1 and "fused" in s0 and "not fused" in s1 and "at this version" not in s0 + s1
