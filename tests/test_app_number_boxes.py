"""Number boxes that take a value which is no whole number (issue 39's newcomer run): `abc`, `2.5` or `1e3` in Batch,
`abc` or `1.5` in the attention gate were put back by the page with no word, and the last message (about another
value) stayed up. Each box now says so, and a message about a box goes when the box gets a valid value or when what
it was about changes."""

from __future__ import annotations

import pytest

from rlxviz.app.controls import ModelControls, PipelineControls, VariantControls
from rlxviz.app.jobs import Runner
from rlxviz.app.numberbox import whole_number
from rlxviz.app.state import AppState


def tiny(**kw: object) -> AppState:
    kw.setdefault("preset", "bert-tiny")
    kw.setdefault("seq", 8)
    return AppState(runner=Runner(background=False), **kw)


@pytest.mark.parametrize("text, read", [("4", (True, 4)), (" -3 ", (True, -3)), ("+7", (True, 7)), ("", (True, None)),
                                        ("abc", (False, None)), ("2.5", (False, None)), ("1e3", (False, None)),
                                        ("4.0", (False, None)), ("0x10", (False, None))])
def test_whole_number_reads_digits_only(text, read):
    assert whole_number(text) == read


@pytest.mark.parametrize("name, typed", [("batch", "abc"), ("batch", "2.5"), ("batch", "1e3"), ("seq", "12.0"),
                                         ("seq", "ten")])
def test_a_shape_that_is_no_whole_number_is_said_and_kept(name, typed):
    s = tiny()
    mc = ModelControls(state=s)
    box, before = getattr(mc, name), getattr(s, name)
    label = {"batch": "Batch", "seq": "Sequence length"}[name]
    box.text.value = "99999"  # out of range first: the clamp's note
    clamped = getattr(s, name)
    assert "99999 is out of range" in s.message, s.message
    box.text.value = typed
    assert s.message == f"{label} must be a whole number; {typed} is not, so it stays {clamped}.", s.message
    assert getattr(s, name) == clamped and box.value == clamped and box.text.value == str(clamped)
    assert "out of range" not in s.message  # the stale clamp's note is replaced
    box.text.value = str(before)  # a valid value: the note about the box goes
    assert getattr(s, name) == before and s.message == "", s.message


def test_a_note_about_a_box_goes_when_the_box_gets_the_same_valid_value():
    s = tiny()
    mc = ModelControls(state=s)
    mc.batch.text.value = "2.5"
    assert "whole number" in s.message
    mc.batch.text.value = str(s.batch)  # the box shows it again, and the user confirms it
    mc.batch.text.value = "x"
    mc.batch.text.value = f"0{s.batch}"  # same value written otherwise: valid, the note goes, the box shows it plainly
    assert s.message == "" and mc.batch.text.value == str(s.batch)


def test_a_note_about_a_shape_goes_with_the_model_it_was_about():
    s = tiny()
    mc = ModelControls(state=s)
    mc.seq.text.value = "1e3"
    assert "Sequence length must be a whole number" in s.message
    s.preset = "minilm-shaped"
    assert "whole number" not in s.message, s.message


def test_a_note_about_another_box_or_a_newer_message_is_left_alone():
    s = tiny()
    mc = ModelControls(state=s)
    mc.batch.text.value = "abc"
    mc.seq.text.value = "4"  # the seq box's value: the batch note is not its own
    assert "Batch must be a whole number" in s.message
    s._error("something else", "warning")
    mc.batch.text.value = "2"
    assert s.message == "something else"


@pytest.mark.parametrize("typed", ["abc", "1.5", "2e2"])
def test_a_gate_that_is_no_whole_number_is_said_and_the_note_goes_on_apply(typed):
    s = tiny()
    pc = PipelineControls(state=s)
    pc.threshold.text.value = typed
    assert s.threshold is None and pc.threshold.text.value == ""
    assert s.message == (f"Attention gate must be a whole number (or empty for the pipeline's default); {typed} is "
                         "not, so it stays empty (the pipeline's default)."), s.message
    pc.threshold.text.value = "64"
    assert s.threshold == 64 and s.message == ""
    pc.threshold.text.value = typed
    assert s.threshold == 64 and f"{typed} is not, so it stays 64." in s.message
    pc.off = [pc.order.index("fuse_sdpa")]  # untick fuse_sdpa, then Apply: the note was about the run before
    pc.apply()
    assert "Attention gate" not in s.message, s.message


def test_a_gate_out_of_range_then_unreadable_then_empty():
    s = tiny()
    pc = PipelineControls(state=s)
    pc.threshold.text.value = "0"
    assert s.threshold == 1 and "Attention gate 0 is out of range" in s.message
    pc.threshold.text.value = "1.5"
    assert s.threshold == 1 and "1.5 is not, so it stays 1." in s.message
    pc.threshold.text.value = ""  # empty: the default, valid
    assert s.threshold is None and s.message == ""


@pytest.mark.parametrize("typed", ["one", "0.5", "1e0"])
def test_a_layer_that_is_no_whole_number_is_said_and_kept(typed):
    s = tiny()
    vc = VariantControls(state=s)
    vc.layer.text.value = "9"
    assert s.variant_layer == 1 and "layers 0..1" in s.message
    vc.layer.text.value = typed
    assert s.variant_layer == 1 and vc.layer.text.value == "1"
    assert s.message == f"Layer to break must be a whole number; {typed} is not, so it stays 1.", s.message
    vc.layer.text.value = "0"
    assert s.variant_layer == 0 and s.message == ""


def _timing(s: AppState):
    from rlxviz.app.timingview import TimingView

    return TimingView(state=s)


@pytest.mark.parametrize("name, typed", [("repeat", "2.5"), ("repeat", "abc"), ("repeat", "1e3"), ("warmup", "2.5"),
                                         ("warmup", "three"), ("warmup", "1.0")])
def test_rounds_that_are_no_whole_number_are_said_and_kept(name, typed):
    """The Timing tab's rounds boxes (issue 39): the page's integer box made a typed 2.5 into 25 and put back abc with
    no word while the last clamp's note stayed up; now the box says so and keeps the rounds it had."""
    s = tiny()
    view = _timing(s)
    box, before = getattr(view, name), getattr(s, name)
    label = {"repeat": "Timed rounds", "warmup": "Untimed rounds"}[name]
    box.text.value = "99999"  # out of range first: the clamp's note
    clamped = getattr(s, name)
    assert clamped == s.param[name].bounds[1] and "99999 is out of range" in s.message, s.message
    box.text.value = typed
    assert s.message == f"{label} must be a whole number; {typed} is not, so it stays {clamped}.", s.message
    assert getattr(s, name) == clamped and box.value == clamped and box.text.value == str(clamped)
    box.text.value = str(before)  # a valid value: the note about the box goes
    assert getattr(s, name) == before and s.message == "", s.message


@pytest.mark.parametrize("name, typed", [("repeat", "0"), ("repeat", "-2"), ("repeat", "1001"), ("warmup", "-1"),
                                         ("warmup", "101")])
def test_rounds_out_of_range_say_the_range_and_why(name, typed):
    """The ranges are the ones `session.check_rounds` enforces (1..MAX_REPEAT timed, 0..MAX_WARMUP untimed); the
    message says the range and why it is so."""
    from rlxviz.session import MAX_REPEAT, MAX_WARMUP

    s = tiny()
    box = getattr(_timing(s), name)
    lo, hi = {"repeat": (1, MAX_REPEAT), "warmup": (0, MAX_WARMUP)}[name]
    assert s.param[name].bounds == (lo, hi)
    box.text.value = typed
    near = lo if int(typed) < lo else hi
    assert getattr(s, name) == near and box.text.value == str(near)
    assert f"is out of range {lo}..{hi} (" in s.message and f"), so it became {near}." in s.message, s.message
    assert "a typo" in s.message and f"rlxviz time --{name}" in s.message, s.message
    box.text.value = str(lo + 1)  # a value in range: taken, and the note goes
    assert getattr(s, name) == lo + 1 and s.message == ""


def test_a_rounds_note_is_its_own_box_s_and_a_newer_message_stays():
    s = tiny()
    view = _timing(s)
    view.repeat.text.value = "x"
    view.warmup.text.value = "3"  # the other box: the repeat note is not its own
    assert s.warmup == 3 and "Timed rounds must be a whole number" in s.message
    s._error("something else", "warning")
    view.repeat.text.value = "5"
    assert s.repeat == 5 and s.message == "something else"
    view.warmup.text.value = ""  # emptied: the rounds are put back
    assert s.warmup == 3 and view.warmup.text.value == "3"
    s.repeat = 7  # the state moves the box
    assert view.repeat.text.value == "7"


def _boxes(s: AppState) -> dict[str, object]:
    """Every NumberBox of the page, by the state parameter it sets."""
    mc, vc, pc, tv = ModelControls(state=s), VariantControls(state=s), PipelineControls(state=s), _timing(s)
    return {"batch": mc.batch, "seq": mc.seq, "variant_layer": vc.layer, "threshold": pc.threshold,
            "repeat": tv.repeat, "warmup": tv.warmup}


def _enter(box, text: str) -> None:
    """Enter pressed in the page's box holding `text`: Panel's `enter-pressed` event, as the browser sends it (the
    text is sent even when unchanged; a change event sends nothing then)."""
    from types import SimpleNamespace

    box.text._process_event(SimpleNamespace(event_name="enter-pressed", value_input=text))


@pytest.mark.parametrize("name, out", [("warmup", "-1"), ("repeat", "0"), ("batch", "0"), ("seq", "-4"),
                                       ("variant_layer", "9"), ("threshold", "0")])
@pytest.mark.parametrize("how", ["set", "enter"])
def test_the_clamped_value_entered_again_clears_the_range_note(name, out, how):
    """A newcomer run: Untimed rounds -1 became 0 and the box showed 0; entering 0 then changed nothing the page
    could send, so "Untimed rounds -1 is out of range" stayed up. A valid value entered, the same one too, is the
    box's valid value: its note goes. For every number box."""
    s = tiny()
    box = _boxes(s)[name]
    box.text.value = out
    near = getattr(s, name)
    assert f" {out} " in s.message and ("out of range" in s.message or "became" in s.message), s.message
    assert box.text.value == str(near)
    if how == "set":
        box.text.value = str(near)  # the text the box already shows, set again from the page
    else:
        _enter(box, str(near))
    assert s.message == "" and getattr(s, name) == near and box.text.value == str(near), s.message


@pytest.mark.parametrize("name", ["warmup", "batch", "threshold"])
def test_enter_on_a_changed_value_takes_it_once_and_keeps_a_new_note(name):
    """Enter on a changed text: the change and the enter event both arrive; the value is taken, and a clamp's note
    said by the change is said again, not cleared by the enter event that follows it."""
    s = tiny()
    box = _boxes(s)[name]
    box.text.value = "99999" if name != "threshold" else "-5"
    _enter(box, "99999" if name != "threshold" else "-5")
    assert "out of range" in s.message, s.message
    box.text.value = "2"
    _enter(box, "2")
    assert getattr(s, name) == 2 and s.message == "", s.message
