"""What the last newcomer run found misleading (issue 39), without a browser: the search's data for ops absorbed into
a fused node, the note that hidden steps make the version numbers skip, the Timing tab's "Time again" before any
timing and its round boxes clamping out-of-range values with a message, and the IR editor's placeholder.
`test_browser_newcomer_nav.py` drives the same in a real browser."""

from __future__ import annotations

import re

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.numberbox import NumberBox
from rlxviz.app.state import AppState
from rlxviz.models import load_model
from rlxviz.passes import Pipeline
from rlxviz.session import DEFAULT_WARMUP, MAX_REPEAT, MAX_WARMUP, timing_table
from rlxviz.viz import Overlay, render_dot


def _state(**kw: object) -> AppState:
    return AppState(runner=Runner(background=False), **{"preset": "bert-tiny", "seq": 8, **kw})


def _tooltip(dot: str, i: int) -> str:
    m = re.search(rf'^\s*n{i} \[.*tooltip="((?:[^"\\]|\\.)*)"', dot, re.M)  # a value's quotes are escaped: \"
    assert m, f"no tooltip for n{i}"
    return m.group(1)


# --- 1. search: what a fused node absorbed is in its tooltip, by op and with its layer -----------------------------


@pytest.mark.parametrize("model", ["bert-tiny", "minilm"])
def test_a_fused_attention_names_the_softmax_it_absorbed_and_its_layer(model):
    """After fuse_sdpa (Hugging Face primitives) the attention node absorbed the softmax: its tooltip's `absorbed ops`
    line names it, and the layer, so the pane's search finds "softmax" there."""
    trace = Pipeline.canonical().run(load_model(model, 1, 8, style="hf").graph)
    step = trace.step("fuse_sdpa")
    dot = render_dot(step.after, Overlay.after(step))
    fused = [m.fused for m in step.matches if m.fused is not None and step.after[m.fused].absorbed]
    assert fused
    for i in fused:
        tip = _tooltip(dot, i)
        line = next(x for x in tip.split("\\n") if x.startswith("absorbed ops: "))
        assert "softmax" in line.split(" — ")[0], line
        layer = step.after[i].path.split(".")[2]
        assert line.endswith(f" — in layer {layer}"), line
        assert f"absorbed: %{step.after[i].absorbed[0]}" in tip  # the ids stay (tests/test_viz.py reads them)


def test_ops_absorbed_by_an_earlier_pass_are_named_from_the_origin_and_counted():
    """A second kind: fuse_matmul_bias_act's nodes absorbed a matmul and an add (names from the graph before)."""
    trace = Pipeline.canonical().run(load_model("bert-tiny", 1, 8, style="rlx").graph)
    step = trace.step("fuse_matmul_bias_act")
    dot = render_dot(step.after, Overlay.after(step))
    m = step.matches[0]
    assert "absorbed ops: matmul, add — in layer" in _tooltip(dot, m.fused)


def test_without_an_origin_no_absorbed_ops_line():
    """Ids only when the absorbed nodes cannot be named (no graph they come from): no empty `absorbed ops:` line."""
    trace = Pipeline.canonical().run(load_model("bert-tiny", 1, 8, style="rlx").graph)
    step = trace.step("fuse_matmul_bias_act")
    dot = render_dot(step.after, Overlay(fused=Overlay.after(step).fused))
    assert "absorbed: %" in dot and "absorbed ops:" not in dot


def test_the_apps_after_pane_carries_the_absorbed_ops():
    s = _state(style="hf")
    s.step_to("after fuse_sdpa")
    assert "absorbed ops: " in s.svg() and "softmax" in s.svg()


# --- 3. hidden steps: the numbers skip, and the strip says why ---------------------------------------------------


def test_the_hidden_steps_are_counted_and_named_before_the_version_after_them():
    s = _state()
    total = len(s.trace.versions())
    shown = len(s.version_labels)
    assert shown < total  # bert-tiny has passes that change nothing
    note = s.hidden_note()
    assert note.startswith(f"{total - shown} steps that changed nothing hidden") and "rlxviz time" in note
    gaps = [s.hidden_before(k) for k in range(shown)]
    assert gaps[0] == ""  # nothing before the input
    first = next(k for k, g in enumerate(gaps) if g)
    i = s.version_index(first)
    prev = s.version_index(first - 1)
    expected = f"step {prev + 1}" if i - prev == 2 else f"steps {prev + 1}-{i - 1}"
    assert gaps[first] == f"{expected} changed nothing"
    hidden = sum(int(m.group(2) or m.group(1)) - int(m.group(1)) + 1
                 for g in gaps if g for m in [re.match(r"steps? (\d+)(?:-(\d+))?", g)])
    after_last = total - 1 - s.version_index(shown - 1)  # hidden after the last shown version: only in the note
    assert hidden + after_last == total - shown  # every hidden step counted once


def test_no_note_when_nothing_is_hidden():
    s = _state(hide_unchanged=False)
    assert s.hidden_note() == ""
    assert all(s.hidden_before(k) == "" for k in range(len(s.version_labels)))


def test_the_version_strip_says_the_steps_are_hidden():
    from rlxviz.app.panels import VersionStepper

    s = _state()
    strip = VersionStepper(state=s)
    n = len(s.trace.versions()) - len(s.version_labels)
    assert strip.select.name == f"Version · {n} unchanged steps hidden"
    assert "changed nothing, hidden" in strip.counts.object
    s.hide_unchanged = False
    assert "changed nothing" not in strip.counts.object and strip.select.name == "Version"


# --- 4. the Timing tab: "Time again" once there are figures; rounds clamped with a word -------------------------


def _timing_view(s: AppState):
    from rlxviz.app.timingview import TimingView

    return TimingView(state=s)


def test_time_again_is_hidden_until_a_timing_exists():
    from test_app_timing import timed

    s = _state()
    view = _timing_view(s)
    assert not view.again.visible and view.button.visible
    s.param.update(blas="MLX", timings=timing_table([timed(0, "input", [1.0] * 21),
                                                     timed(1, "after fuse_sdpa", [0.5] * 21)]))
    assert view.again.visible
    s.timings = []
    assert not view.again.visible


@pytest.mark.parametrize(("name", "typed", "became"), [
    ("repeat", MAX_REPEAT + 5, MAX_REPEAT), ("repeat", 0, 1), ("repeat", -4, 1),
    ("warmup", MAX_WARMUP + 1, MAX_WARMUP), ("warmup", -1, 0)])
def test_rounds_out_of_range_are_clamped_and_said(name, typed, became):
    """The number boxes have no start/end (the browser put back such a value with no word, so the server never saw
    it): the server clamps it and the message says the range."""
    s = _state()
    view = _timing_view(s)
    box = getattr(view, name)
    assert isinstance(box, NumberBox)  # text read on the server: no start/end in the page to put a value back
    box.value = typed
    assert getattr(s, name) == became and box.value == became
    lo, hi = s.param[name].bounds
    assert f"out of range {lo}..{hi}" in s.message and f"so it became {became}" in s.message
    assert s.message_kind == "info"
    box.value = lo + 1  # a value in range: taken, and the clamp's note goes
    assert getattr(s, name) == lo + 1 and s.message == ""


def test_rounds_in_range_and_an_empty_box():
    s = _state()
    view = _timing_view(s)
    view.warmup.value = 7
    assert s.warmup == 7 and s.message == ""
    view.warmup.value = None  # emptied: put back
    assert view.warmup.value == 7 and s.warmup == 7
    s.warmup = DEFAULT_WARMUP  # the state moves the box too
    assert view.warmup.value == DEFAULT_WARMUP


# --- 5. the IR editor: a frame and a placeholder when empty ---------------------------------------------------


def test_an_empty_ir_editor_shows_what_to_paste():
    from rlxviz.app.controls import ModelControls

    s = _state()
    c = ModelControls(state=s)
    c.ir.value = ""
    assert c.ir_placeholder.visible and re.search(r"%\d+ = \w+\(", c.ir_placeholder.object)
    c.ir.value = "graph g {\n}"
    assert not c.ir_placeholder.visible
    c.ir.value = "  \n"
    assert c.ir_placeholder.visible


def test_no_hidden_pass_holds_a_place_a_chip_counts():
    """llama-block's passes that changed nothing held three places that are nothing to fix (○), and "hide passes that
    changed nothing" hid them, so they were in no chip (the note said "they hold ○3"): a pass with any refusal a chip
    counts (✗ or ○) stays listed now, and every ○ place of the run is on a chip shown."""
    from test_app_views import tiny

    from rlxviz.app.derived import not_near_misses

    for s in (tiny(preset="llama-block"), tiny()):
        assert s.hide_unchanged
        every = sum(len(x) for st in s.trace.steps for x in not_near_misses(st, s.trace).values())
        shown = sum(len(x) for r in s.version_rows() for x in r["not_near_misses"].values())
        assert shown == every and "○" not in s.hidden_note() and s.hidden_note(), (shown, every, s.hidden_note())
    assert every and shown  # bert-tiny's lookalike
    llama = tiny(preset="llama-block")  # 2 nothing to fix (○) and 1 at a gap in rlxviz's ops (△), all on a chip
    assert sum(len(x) for r in llama.version_rows() for x in r["not_near_misses"].values()) == 2
    assert sum(len(r["op_gaps"]) for r in llama.version_rows()) == 1
