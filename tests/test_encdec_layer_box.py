"""A click on a layer box of an encoder-decoder model's layers view opens that box, and only it.

The boxes of bart/marian are `layer_encoder_0` ... `layer_decoder_1`; the pane opened only ids matching `layer\\d+` and
sent `parseInt(id.slice(5))` (NaN for these), and `expanded_layers` held bare indices, so encoder layer 0 and decoder
layer 0 were one entry (a plain 0 opened both). The pane now sends the box's id (`SvgGraph.layer_clicked`), read back
by `viz.box_layer`, and `AppState.expanded_layers` holds the model's own keys (`state.LayerKeys`, `own_key`).
A one-stack model (bert, gpt2) keeps its `layer<i>` ids and its plain-index behaviour."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.panels import GraphCompare
from rlxviz.app.state import AppState
from rlxviz.passes.trace import Layer
from rlxviz.session import render as drawing
from rlxviz.viz import box_layer, layer_groups

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "tests/fixtures/onnx/zoo"
BART, MARIAN = ZOO / "bart.encdec.onnx", ZOO / "marian.encdec.onnx"
BART_FULL = ROOT / "tests/fixtures/onnx/cases/bart-full.onnx"
GPT2 = ZOO / "gpt2.dynamo-eager.onnx"


def _state(path: Path | None = None) -> AppState:
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    if path is not None:
        s.load_upload({path.name: path.read_bytes()})
        assert s.trace is not None and s.model.name == path.stem, s.message
    s.view = "collapsed"
    return s


def _opened(dot: str) -> set[str]:
    """The ids of the layers drawn open in place (their clusters)."""
    return set(re.findall(r"subgraph cluster_(layer\w*(?:\.\w+)*)", dot))


def _boxes(dot: str) -> set[str]:
    return set(re.findall(r"^\s*(layer[\w.]*) \[", dot, re.M))


def _click(pane, box: str) -> None:
    """What the browser does on a click on box `box` (graphpane.js `open`)."""
    pane.param.update(layer_clicked=box, layer_clicks=pane.layer_clicks + 1)


def test_box_layer_reads_every_box_id_back():
    assert box_layer("layer3") == 3 and type(box_layer("layer3")) is int
    dec = box_layer("layer_decoder_0")
    assert isinstance(dec, Layer) and (int(dec), dec.stack) == (0, "decoder")
    two = box_layer("layer_text_model.encoder_12")
    assert (int(two), two.stack) == (12, "text_model.encoder")
    assert all(box_layer(k) is None for k in ("g_embeddings", "n12", "layer_x", "layers", "", None))


@pytest.mark.parametrize("path", [BART, MARIAN], ids=lambda p: p.stem)
def test_every_encdec_box_id_names_its_own_layer(path):
    s = _state(path)
    keys = [(k, g.layer) for k, g in layer_groups(s.current_graph).items() if g.layer is not None]
    assert {k for k, _ in keys} == {"layer_encoder_0", "layer_encoder_1", "layer_decoder_0", "layer_decoder_1"}
    for key, layer in keys:
        got = box_layer(key)
        assert got == layer and got.stack == layer.stack, (key, got, layer)


@pytest.mark.parametrize("path", [BART, MARIAN, BART_FULL], ids=lambda p: p.stem)
def test_a_click_on_decoder_layer_0_opens_that_box_only(path):
    s = _state(path)
    view = GraphCompare(state=s)
    closed = s.dot()
    assert {"layer_encoder_0", "layer_decoder_0"} <= _boxes(closed) and not _opened(closed)
    _click(view.after, "layer_decoder_0")
    dec0 = s.expanded_layers[0]
    assert len(s.expanded_layers) == 1 and dec0.stack == "decoder" and int(dec0) == 0
    assert any(dec0 is k for k in s.layers()) and s.selected_layer is dec0  # the model's own key
    assert _opened(s.dot()) == {"layer_decoder_0"}
    assert "layer_encoder_0" in _boxes(s.dot())  # encoder layer 0 stays a box
    # the drawing the layers view asks for, from the state's keys
    v = drawing.View(s.version, "layers", expanded=tuple(s.expanded_layers))
    assert _opened(drawing.dot(s.trace, v)) == {"layer_decoder_0"}
    _click(view.after, "layer_encoder_0")
    assert _opened(s.dot()) == {"layer_encoder_0", "layer_decoder_0"}
    assert "layer_encoder_0" not in view.after.folded and "layer_decoder_1" in view.after.folded
    _click(view.after, "layer_decoder_0")  # the open cluster's click folds it back
    assert _opened(s.dot()) == {"layer_encoder_0"} and [k.stack for k in s.expanded_layers] == ["encoder"]
    _click(view.after, "g_model")  # no layer's box: nothing changes
    assert _opened(s.dot()) == {"layer_encoder_0"}


def test_a_plain_index_on_an_encdec_model_opens_one_box():
    """A plain 0 (an old caller, a table row's unqualified key) equals both stacks' layer 0: it is the model's first
    key of that index (as `selected_layer`), so one box opens, never both."""
    s = _state(BART)
    s.toggle_layer(0)
    assert _opened(s.dot()) == {"layer_encoder_0"}
    s.expanded_layers = [Layer(1, "decoder")]
    assert _opened(s.dot()) == {"layer_decoder_1"} and any(s.expanded_layers[0] is k for k in s.layers())


@pytest.mark.parametrize("path, first", [(None, "layer0"), (GPT2, "layer0")], ids=["bert-tiny", "gpt2"])
def test_one_stack_models_keep_their_ids_and_clicks(path, first):
    s = _state(path)
    view = GraphCompare(state=s)
    boxes = _boxes(s.dot())
    assert first in boxes and "layer1" in boxes and not any(b.startswith("layer_") for b in boxes)
    _click(view.after, "layer1")
    assert s.expanded_layers == [1] and s.selected_layer == 1 and _opened(s.dot()) == {"layer1"}
    _click(view.after, "layer0")
    assert sorted(s.expanded_layers) == [0, 1] and _opened(s.dot()) == {"layer0", "layer1"}
    _click(view.after, "layer1")
    _click(view.after, "layer0")
    assert s.expanded_layers == [] and not _opened(s.dot())
    s.toggle_layer(1)  # a plain index, as before
    assert s.expanded_layers == [1] and _opened(s.dot()) == {"layer1"}
