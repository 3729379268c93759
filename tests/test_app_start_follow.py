"""The start strip's line follows the state it describes (a newcomer run, fresh clone, real browser): after ② a
variant chosen by hand left "Layer 1 now has an extra user..." above a banner that said the opposite; ① at the last
version said "① again, then ②" and wrapped to version 0 unsaid, and "framed in green" for a pass that matched
nothing; "Layer to break" said 0 while ② broke layer 1."""

import html
import re

import pytest
from test_app_views import tiny

from rlxviz.app.controls import VariantControls
from rlxviz.app.start import BREAK_LAYER, BREAK_VARIANT, STEPS, StartHere, note_html
from rlxviz.app.state import SHAPE_VARIANT, VARIANT_LABELS
from rlxviz.session import render as drawing
from rlxviz.viz.styles import MATCH_COLOR_NAMES, MATCH_COLORS, match_frames


def _line(start: StartHere) -> str:
    return html.unescape(start.note.object.split(">", 1)[1])


@pytest.mark.parametrize("variant", ["swapped_residual", "tanh_gelu", SHAPE_VARIANT])
def test_a_variant_chosen_by_hand_after_break_replaces_the_break_line(variant):
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    start.brk.clicks += 1
    assert "dead extra reader of its attention output" in _line(start)
    s.apply_variant(variant)  # the sidebar's button
    line = _line(start)
    assert "extra reader" not in line and f"'{VARIANT_LABELS[variant]}'" in line, line
    assert line.startswith("<b>Next: "), line
    unfused = start.unfused_layers()
    if unfused:  # the next click named is true of the run shown
        assert f"③ to ask why layer {unfused[0]} did not fuse" in line, line
    else:
        assert "③" not in line.split("</b>")[0], line
    if variant == SHAPE_VARIANT:
        assert "every layer" in line and "Layer to break does not apply" in line, line
    else:
        assert f"to layer {s.variant_layer}" in line, line
    s.apply_variant("none")  # back to the model as built: the three steps, no variant named
    assert start.note.object == note_html([(STEPS, False)]), start.note.object


def test_the_layer_moved_by_hand_after_break_is_the_one_the_line_names():
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    vc = VariantControls(state=s)
    start.brk.clicks += 1
    vc.layer.text.value = "0"  # the sidebar box
    line = _line(start)
    assert s.variant_layer == 0 and "Layer 1" not in line and "layer 0" in line, line


def test_a_variant_chosen_after_why_replaces_the_why_line():
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    start.brk.clicks += 1
    start.why.clicks += 1
    assert "outcome on layer 1 and the first guard that failed" in _line(start)
    s.apply_variant("swapped_residual")  # layer 1 fuses now: the why line no longer holds
    line = _line(start)
    assert "first guard that failed" not in line and "'swapped residual operands'" in line, line


def test_a_pipeline_change_after_break_replaces_the_break_line():
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    start.brk.clicks += 1
    s.disabled = [s.passes.index("fuse_transformer_layer")]  # no pass left to refuse the layer
    line = _line(start)
    assert "the banner below names the guard that refused it" not in line and "extra user of h1" in line, line


def test_step_to_the_last_version_says_it_is_the_last_and_wraps_to_the_input():
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    n = len(s.version_labels)
    for _ in range(n - 2):
        start.step.clicks += 1
        assert "last version" not in _line(start)
    start.step.clicks += 1
    assert s.version == n - 1
    line = _line(start)
    assert line.startswith("<b>Next: ② to break a layer, or ① back to the input: this is the last version."), line
    assert "① again" not in line
    start.step.clicks += 1
    assert s.version == 0 and "(version 0)" in _line(start)


def test_the_last_version_with_a_broken_layer_names_why_and_the_way_back():
    s = tiny(variant="dead_h1_user")  # a dead reader: a near-miss (tanh-GELU is a gap in rlxviz's ops)
    start = StartHere(state=s, show_why=lambda: None)
    s.version = len(s.version_labels) - 2
    start.step.clicks += 1
    line = _line(start)
    assert line.startswith("<b>Next: ③ to ask why layer 0 did not fuse, or ① back to the input"), line


def _drawn_frames(s) -> list[str]:
    """The colour of each match frame the before pane's drawing holds, in drawing order, by name."""
    dot = drawing.dot(*s._drawing(None, s.resolved_view(), side="before"))
    colours = re.findall(r'subgraph cluster_m\d+ \{\s*color="(#[0-9a-f]{6})"', dot)
    return [MATCH_COLOR_NAMES[MATCH_COLORS.index(c)] for c in colours]


@pytest.mark.parametrize("variant", ["none", "tanh_gelu"])
def test_the_frames_named_are_the_frames_drawn(variant):
    """dead_code_elimination matches no pattern: its line says nothing is framed (it said "framed in green"). A pass
    with several matches frames each in its own colour (fuse_transformer_layer: layer 1 in blue): the line said
    "framed in green" of all of them. Now the line gives the count and the colours the before pane draws. Every
    pass shown (none hidden), so passes that matched nothing are stepped through too."""
    s = tiny(hide_unchanged=False, variant=variant)
    start = StartHere(state=s, show_why=lambda: None)
    seen = set()
    for _ in range(len(s.version_labels) - 1):
        start.step.clicks += 1
        step = s.current_step
        line = _line(start)
        drawn = _drawn_frames(s)
        assert len(drawn) == len(step.matches), (step.pass_name, drawn)
        seen.add(min(len(drawn), 2))
        assert ("nothing is framed" in line) == (not drawn), (step.pass_name, line)
        if not drawn:
            continue
        said = [w for w in MATCH_COLOR_NAMES if re.search(rf"\b{w}\b", line)]
        assert said and said == drawn[:len(said)], (step.pass_name, said, drawn, line)  # the first, in order
        if len(drawn) == 1:
            assert "its match framed in green" in line, line
        else:
            assert f"its {len(drawn)} matches framed" in line and "framed in green" not in line.replace(
                f"framed in {', '.join(drawn[:-1])} and {drawn[-1]}", ""), line
            assert ("one colour each" in line) == (len(set(drawn)) == len(drawn)), line
    assert seen == {0, 1, 2}  # passes with no match, one, and several were stepped through


def test_the_layer_boxes_frame_no_match_and_the_line_says_so():
    s = tiny(hide_unchanged=False, view="collapsed")
    start = StartHere(state=s, show_why=lambda: None)
    s.version = s.version_labels.index(next(lbl for lbl in s.version_labels if "fuse_transformer_layer" in lbl))
    start._say_version()
    line = _line(start)
    assert not _drawn_frames(s) and s.current_step.matches
    assert "one box per layer" in line and not any(re.search(rf"\b{w}\b", line) for w in MATCH_COLOR_NAMES), line


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, len(MATCH_COLORS), len(MATCH_COLORS) + 1, 20])
def test_match_frames_words_follow_the_colour_cycle(n):
    words = match_frames(n)
    assert ("repeating" in words) == (n > len(MATCH_COLORS)), words
    assert ("one colour each" in words) == (n > 1), words
    named = [w for w in MATCH_COLOR_NAMES if re.search(rf"\b{w}\b", words)]
    assert named == list(MATCH_COLOR_NAMES[:min(n, 3)]), words


def test_the_layer_box_shows_the_layer_break_breaks():
    s = tiny()
    vc = VariantControls(state=s)
    trace = s.trace
    start = StartHere(state=s, show_why=lambda: None)
    assert s.variant_layer == BREAK_LAYER and vc.layer.text.value == str(BREAK_LAYER)
    assert s.trace is trace  # the model as built does not depend on the box: nothing reloads
    start.brk.clicks += 1
    assert s.variant == BREAK_VARIANT and s.variant_layer == BREAK_LAYER and vc.layer.text.value == "1"


@pytest.mark.parametrize("typed", ["0", "1"])
def test_break_breaks_the_layer_the_box_shows(typed):
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    vc = VariantControls(state=s)
    vc.layer.text.value = typed  # chosen before ②
    start.brk.clicks += 1
    assert s.variant_layer == int(typed) and vc.layer.text.value == typed
    assert f"layer {typed} NOT fused" in s.message and _line(start).startswith(f"<b>Next: ③. </b>Layer {typed} ")


def test_a_variant_already_on_keeps_its_layer_when_the_strip_opens():
    s = tiny(variant="tanh_gelu", variant_layer=0)
    StartHere(state=s, show_why=lambda: None)
    assert s.variant_layer == 0


def test_opening_the_strip_changes_neither_the_model_nor_its_key():
    """The box moves to layer 1 with no variant on: the same model, under the same key (a run kept by another
    session for these settings still serves this one), and a layer typed with no variant on rebuilds nothing."""
    s = tiny()
    key, model = s.model_key(), s.model
    StartHere(state=s, show_why=lambda: None)
    assert s.variant_layer == BREAK_LAYER and s.model_key() == key and s.model is model
    s.variant_layer = 0
    assert s.model_key() == key and s.model is model
    s.variant = "tanh_gelu"  # a variant of one layer: the layer is part of the model again
    assert s.model_key() != key and s.model is not model
    with pytest.raises(ValueError, match="changes layer"):
        s.runs.move_layer_quietly(1)


def test_the_state_line_names_no_verdict_of_a_run_not_yet_shown():
    """Between a variant chosen and its run shown (a background job), the line names no layer to ask about: the
    verdicts shown are the last run's."""
    s = tiny(autorun=False)
    s.load()
    start = StartHere(state=s, show_why=lambda: None)
    start.brk.clicks += 1  # autorun off: ② changes the fields, the run shown stays the model as built
    # a layer that does not fuse, not ②'s own variant (tanh-GELU's is held back by rlxviz's ops; dead_h1_user is
    # `BREAK_VARIANT`, whose line of ② holds again)
    s.apply_variant("pre_ln")
    assert "③" not in _line(start).split("</b>")[0], _line(start)
    s.load()
    assert _line(start).startswith("<b>Next: ③ to ask why layer"), _line(start)


def test_the_break_line_comes_back_with_the_state_it_spoke_of():
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    start.brk.clicks += 1
    said = start.note.object
    s.apply_variant("none")
    assert start.note.object == note_html([(STEPS, False)])
    s.apply_variant(BREAK_VARIANT)  # the same variant on the same layer, by hand: the line of ② holds again
    assert start.note.object == said
