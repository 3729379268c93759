"""Graph navigation in the app's drawings: the layer view's status words agree with "why didn't layer N
fuse?", the culprit of a rejection is drawn and marked, and layers expand in place in the layer view."""

from __future__ import annotations

import re

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState


def _state(**kw) -> AppState:
    return AppState(runner=Runner(background=False), **kw)


def _box_word(dot: str, layer: int) -> str:
    """The status word drawn in layer box `layer` of a layers-view DOT source."""
    stmt = re.search(rf"^\s*layer{layer} \[label=<(.*)$", dot, re.M)
    assert stmt, f"no box for layer {layer}"
    words = re.findall(r"<B>(fused|not fused|partly fused|rejected[^<]*)</B>", stmt.group(1))
    assert len(words) == 1, words
    return words[0]


def _why_word(s: AppState, layer: int) -> str:
    """The verdict of the "why didn't layer N fuse?" tab: `fused` or `not fused`."""
    m = re.search(rf"layer {layer}: (fused|NOT fused)", s.why_layer(layer))
    assert m, s.why_layer(layer)
    return m.group(1).lower()


@pytest.mark.parametrize("preset, variant", [("minilm", "none"), ("bert-tiny", "none"),
                                             ("bert-tiny", "extra_h1_user"), ("llama-block", "none")])
def test_layer_view_says_what_the_why_tab_says(preset, variant):
    """At the final version every layer box carries the Why tab's verdict word (the same session function),
    for fused layers, a teaching variant that breaks layer 0, and a LLaMA block (no FusedTransformerLayer
    expected: its partial fusions are what it expects)."""
    s = _state(preset=preset, variant=variant)
    s.version = len(s.version_labels) - 1
    dot = s.dot(view="collapsed")
    words = {i: (_box_word(dot, i), _why_word(s, i)) for i in s.layers()}
    assert words and all(box == why for box, why in words.values()), words
    if variant == "extra_h1_user":
        assert words[0] == ("not fused", "not fused") and words[1] == ("fused", "fused")
        assert "rejected: h1_user_count" in dot  # the first guard, as the Why tab names it
    else:
        assert {w for w, _ in words.values()} == {"fused"}


def test_layer_view_before_the_end_shows_progress_not_a_verdict():
    """An intermediate version is not the run's result: its boxes say how far fusion got there."""
    s = _state(preset="bert-tiny")
    s.step_to("after fuse_matmul_bias_act")
    assert _box_word(s.dot(view="collapsed"), 0) == "partly fused"
