"""The Why tab's layer after a model switch (newcomer run): GPT-J shown, a click on layer 0's box in the layers view
(the browser sends the index, a plain int), then bart-full loaded and "decoder layer 0" chosen in the Why tab: the menu
read `decoder layer 0`, the heading `Layer 0` and the text `encoder layer 0: fused -> FusedTransformerLayer %388`.
A plain int N equals every stack's layer N, so neither the state nor the picker saw a change from 0 to the decoder's
layer 0, and the Why tab kept its answer for 0 (resolved to the encoder's). The selected layer is now always the
shown model's own key (`state.LayerKey`, `passes.trace.own_key`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.panels import VersionStepper
from rlxviz.app.state import AppState
from rlxviz.app.whyview import WhyView
from rlxviz.passes.trace import Layer, layer_keys, own_key

ROOT = Path(__file__).resolve().parents[1]
GPTJ = ROOT / "tests/fixtures/onnx/zoo/gptj.dynamo-eager.onnx"
BART = ROOT / "tests/fixtures/onnx/cases/bart-full.onnx"

ENC_DEC = layer_keys([Layer(0, "encoder"), Layer(1, "encoder"), Layer(0, "decoder"), Layer(1, "decoder")])


@pytest.mark.parametrize("asked, stack", [(0, "encoder"), (Layer(0, ""), "encoder"), (Layer(0, "decoder"), "decoder"),
                                          (Layer(1, "encoder"), "encoder")])
def test_own_key_is_the_models_key_itself(asked, stack):
    """A plain int, another model's key or an unqualified key: the model's own key (qualified: its label names the
    stack), the first of its index where the stack does not say which."""
    key = own_key(ENC_DEC, asked)
    assert any(key is k for k in ENC_DEC) and key.stack == stack and int(key) == int(asked)
    assert key.label == f"{stack} layer {int(asked)}"


def test_own_key_keeps_a_layer_the_model_lacks_and_none():
    assert own_key(ENC_DEC, 7) == 7 and own_key(ENC_DEC, None) is None and own_key((), 3) == 3


def _state() -> AppState:
    return AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)


def test_a_layer_box_click_selects_the_models_own_key():
    """The layers view sends a box's index as a plain int (`toggle_layer`): the state holds the model's key."""
    s = _state()
    s.toggle_layer(1)
    assert type(s.selected_layer) is Layer and any(s.selected_layer is k for k in s.layers())


def test_why_tab_follows_the_decoder_layer_picked_after_a_model_switch():
    s = _state()
    why, stepper = WhyView(state=s), VersionStepper(state=s)
    s.load_upload({GPTJ.name: GPTJ.read_bytes()})
    assert s.trace is not None and s.model.name.startswith("gptj"), s.message
    s.toggle_layer(0)  # a click on layer 0's box in the layers view
    s.load_upload({BART.name: BART.read_bytes()})
    assert s.model.name == "bart-full" and s.trace is not None, s.message
    shown = s.selected_layer
    assert any(shown is k for k in s.layers()), repr(shown)  # bart's own key, not GPT-J's 0
    label = shown.label
    assert why.text.object.startswith(f"### {label[:1].upper()}{label[1:]}\n"), why.text.object[:80]
    dec0 = next(k for k in s.layers() if k.stack == "decoder" and int(k) == 0)
    why.layer.value = dec0  # the user's choice in the Why tab's menu
    assert s.selected_layer is dec0 or (s.selected_layer == dec0 and s.selected_layer.stack == "decoder")
    assert why.text.object.startswith("### Decoder layer 0\n"), why.text.object[:80]
    assert "decoder layer 0: " in why.text.object and "encoder layer 0: " not in why.text.object
    assert stepper.layer.value.stack == "decoder" and why.graph.caption.endswith(" decoder layer 0")


def test_a_one_stack_models_layer_becomes_the_encoder_decoders_own_key():
    """bert-tiny's layer 0 (`encoder.layer.0`: stack `encoder`, unqualified) equals bart's encoder layer 0, so the
    Why tab's pick of that layer on the new run changed nothing, and it kept the old key: heading `Layer 0` over
    `encoder layer 0: ...`. A new run makes it the new model's own key before any view draws."""
    s = _state()
    why = WhyView(state=s)
    s.selected_layer = next(k for k in s.layers() if int(k) == 0)
    assert s.selected_layer.label == "layer 0"
    s.load_upload({BART.name: BART.read_bytes()})
    assert s.model.name == "bart-full" and s.trace is not None, s.message
    assert any(s.selected_layer is k for k in s.layers()), repr(s.selected_layer)
    label = s.selected_layer.label
    assert label != "layer 0" and why.text.object.startswith(f"### {label[:1].upper()}{label[1:]}\n"), label
    assert why.graph.caption.endswith(f" {label}"), why.graph.caption


T5 = ROOT / "tests/fixtures/onnx/zoo/t5.encdec.onnx"
BERT = ROOT / "tests/fixtures/onnx/zoo/bert.dynamo-eager.onnx"


def _shown_label(root) -> str | None:
    """The option label the browser's picker shows: its value looked up among its options (Panel sends `(value,
    label)` pairs, or the labels alone when two values print alike); None when the value is no option (a blank box,
    selectedIndex -1)."""
    for o in root.options:
        v, label = o if isinstance(o, tuple) else (o, o)
        if v == root.value:
            return label
    return None


def test_both_layer_pickers_show_the_layer_answered_for_after_a_model_switch():
    """Newcomer run: encoder layer 0 picked on t5, then a one-stack model loaded: the Why picker showed an empty box
    (options `choose`, `layer 0`, `layer 1`; value still `encoder layer 0`) over `Layer 0`. The new key equals the old
    one (`Layer.__eq__` ignores `qualified`), so Panel saw no value change and never sent the new option's value."""
    s = _state()
    why, stepper = WhyView(state=s), VersionStepper(state=s)
    roots = {"why": why.layer.get_root(), "focus": stepper.layer.get_root()}
    s.view = "focus"  # the graph's focus view shows its own layer picker
    for path in (T5, BERT):
        s.load_upload({path.name: path.read_bytes()})
        assert s.trace is not None and s.model.name == path.name.removesuffix(".onnx"), s.message
        if path is T5:
            why.layer.value = next(k for k in s.layers() if k.stack == "encoder" and int(k) == 0)
            assert s.selected_layer.label == "encoder layer 0"
        label = s.selected_layer.label
        for where, root in roots.items():
            assert _shown_label(root) == label, (path.name, where, root.options, root.value)
        assert why.text.object.startswith(f"### {label[:1].upper()}{label[1:]}\n"), why.text.object[:80]
