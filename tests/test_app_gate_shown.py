"""The over-threshold teaching variant's gate and reach (a newcomer run, fresh clone, real browser): its banner named
"the gate (pipeline param fab_max_tokens) allows at most 64" while the sidebar's Attention gate box stayed empty
(its label said "empty: no gate"), and it broke every layer while "Layer to break" said 1 with no word that a size
gate is model-wide. The box, the layer box, the banner and `rlxviz explain --variant over_threshold` now say the
same."""

import pytest
from clirun import run
from test_app_views import tiny

from rlxviz import session
from rlxviz.app.controls import PipelineControls, VariantControls
from rlxviz.app.start import StartHere
from rlxviz.app.state import SHAPE_VARIANT


def test_the_gate_the_variant_sets_shows_in_the_gate_box():
    s = tiny()
    pc = PipelineControls(state=s)
    assert "64" not in pc.threshold.text.name and not pc.threshold.text.placeholder
    s.apply_variant(SHAPE_VARIANT)
    gate = s.effective_threshold
    assert gate == session.RLX_THRESHOLD and f"empty: {gate}, set by the variant" in pc.threshold.text.name
    assert pc.threshold.text.placeholder.startswith(f"{gate} ") and pc.threshold.value is None
    assert f"the attention threshold {gate}" in s.message, s.message
    s.apply_variant("none")
    assert "set by the variant" not in pc.threshold.text.name and not pc.threshold.text.placeholder


def test_a_gate_typed_is_the_box_own_and_the_variant_sets_none():
    s = tiny(variant=SHAPE_VARIANT)
    pc = PipelineControls(state=s)  # built with the variant already on: the box says so from the start
    assert "set by the variant" in pc.threshold.text.name
    pc.threshold.text.value = "16"
    assert s.threshold == 16 and s.effective_threshold == 16
    assert "set by the variant" not in pc.threshold.text.name and not pc.threshold.text.placeholder
    assert "set by this variant" not in s.message and "model-wide" in s.message.lower(), s.message


@pytest.mark.parametrize("variant", ["extra_h1_user", "tanh_gelu"])
def test_layer_to_break_is_off_only_while_the_size_gate_is_on(variant):
    s = tiny()
    vc = VariantControls(state=s)
    assert not vc.layer.disabled and not vc.layer_off.object
    s.apply_variant(SHAPE_VARIANT)
    assert vc.layer.disabled and vc.layer.text.disabled
    assert "does not apply" in vc.layer_off.object and "every layer" in vc.layer_off.object
    s.apply_variant(variant)  # a variant of one layer: the box is its layer again
    assert not vc.layer.disabled and not vc.layer_off.object


def test_the_banner_says_the_variant_is_model_wide_and_sets_the_gate():
    s = tiny()
    s.apply_variant(SHAPE_VARIANT)
    first = s.message.split(". ")[0]  # the banner opens folded to its first line: model-wide is said there
    assert "model-wide" in first.lower() and "layer to break does not apply" in first.lower(), s.message
    assert "fab_max_tokens" in s.message and "is set by this variant" in s.message, s.message
    assert f"Gate {session.RLX_THRESHOLD}" in s.message or f"gate {session.RLX_THRESHOLD}" in s.message


def test_the_strip_says_layer_to_break_does_not_apply():
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    start.brk.clicks += 1
    s.apply_variant(SHAPE_VARIANT)
    assert "every layer" in start.note.object and "Layer to break does not apply" in start.note.object


@pytest.mark.parametrize("extra, who", [((), "is set by this variant"), (("--threshold", 16), "the one asked for")])
def test_explain_says_the_same_as_the_app(capsys, extra, who):
    code, out, _ = run(capsys, "explain", "bert-tiny", "--seq", 8, "--variant", "over_threshold",
                       "--variant-layer", 1, *extra)
    first = out.splitlines()[0]
    assert code == 1 and first.startswith("teaching variant over_threshold: model-wide"), out
    assert "the layer to break does not apply" in first and who in first, first
    assert "layer 0: NOT fused" in out and "layer 1: NOT fused" in out  # every layer, whatever --variant-layer says


@pytest.mark.parametrize("variant", ["extra_h1_user", "swapped_residual"])
def test_explain_of_a_one_layer_variant_says_no_gate_line(capsys, variant):
    _, out, _ = run(capsys, "explain", "bert-tiny", "--seq", 8, "--variant", variant)
    assert "model-wide" not in out and not out.startswith("teaching variant")


def test_variant_note_words():
    note = session.variant_note("over_threshold", 2, 8, None)
    assert "seq raised from 8 to 33" in note and "2*33 = 66" in note and "is set by this variant" in note
    assert session.variant_note("over_threshold", 1, 100, None).count("raised") == 0  # already over: not raised
    assert session.variant_note("tanh_gelu", 1, 8, None) == "" and session.variant_note(None, 1, 8, None) == ""
    assert session.gate_note("over_threshold", 16) == "" and "64" in session.gate_note("over_threshold", None)
