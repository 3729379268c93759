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
