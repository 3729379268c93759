"""An encoder-decoder's layers in the app's layer pickers: the Why tab open while an export with an encoder and a
decoder stack loads (bart-full.onnx: "RecursionError: maximum recursion depth exceeded", the load failed)."""

from pathlib import Path

import pytest
from bokeh.document import Document

from rlxviz.app.jobs import Runner
from rlxviz.app.main import WHY_TAB, build_app
from rlxviz.app.panels import VersionStepper
from rlxviz.app.state import AppState
from rlxviz.app.whyview import WhyView
from rlxviz.app.wording import explain_error

ROOT = Path(__file__).resolve().parents[1]
ENC_DEC = [ROOT / "tests/fixtures/onnx/cases/bart-full.onnx", ROOT / "tests/fixtures/onnx/zoo/bart.encdec.onnx",
           ROOT / "tests/fixtures/onnx/zoo/marian.encdec.onnx"]
"""The newcomer's case, then two of the zoo's encoder-decoder exports (5-8 s each drawn in a page: the zoo's are
marked slow)."""


def tiny(**kw: object) -> AppState:
    kw.setdefault("preset", "bert-tiny")
    kw.setdefault("seq", 8)
    return AppState(runner=Runner(background=False), **kw)


def _page(state: AppState) -> tuple[object, Document]:
    """The whole app drawn into a Bokeh document (no server) on the Why tab: its widgets hold Bokeh models, so a
    picker whose value is not among its options is put back on one, as in the browser."""
    app = build_app(state)
    doc = Document()
    app.server_doc(doc)
    tabs = next(o for o in app.main[0].objects if type(o).__name__ == "Tabs")
    tabs.active = WHY_TAB
    doc.to_json()
    return tabs, doc


@pytest.mark.parametrize("path", [ENC_DEC[0], *(pytest.param(p, marks=pytest.mark.sweep) for p in ENC_DEC[1:])],
                         ids=lambda p: p.name)
def test_an_encoder_decoder_loads_with_the_why_tab_open(path: Path) -> None:
    """Both stacks number their layers from 0: the pickers listed `layer 0` twice, so they could not hold the
    encoder's layer 0 the Why tab opened on; the Graph tab's picker moved the pick to the decoder's, the Why tab
    moved it back, each move inside the last, until RecursionError failed the load."""
    s = tiny(preset="minilm")
    tabs, doc = _page(s)
    s.load_upload({path.name: path.read_bytes()})
    assert s.message_kind != "danger" and "Recursion" not in s.message, s.message
    assert s.model.name == path.stem and s.trace is not None and s.stale == ""
    doc.to_json()
    stacks = {k.stack for k in s.layers()}
    assert len(stacks) == 2, stacks  # an encoder and a decoder
    labels = list(s.layer_options())
    assert len(labels) == len(s.layers()) + 1 and any(lbl.startswith("decoder") for lbl in labels), labels
    for layer in s.layers():  # every layer of either stack can be picked, and stays picked
        s.selected_layer = layer
        assert s.selected_layer == layer and s.selected_layer.stack == layer.stack


def test_each_picker_holds_each_stack_s_layer_0() -> None:
    """Without a page: the Why tab's and the Graph tab's pickers list every layer once, under a label naming its
    stack, and each follows a pick of the decoder's layer 0 without moving it to the encoder's."""
    s = tiny()
    why, stepper = WhyView(state=s), VersionStepper(state=s)
    s.load_upload({ENC_DEC[1].name: ENC_DEC[1].read_bytes()})
    assert s.trace is not None, s.message
    dec0 = next(k for k in s.layers() if k.stack.endswith("decoder") and int(k) == 0)
    for picker in (why.layer, stepper.layer):
        assert list(picker.options.values()).count(dec0) == 1 and len(picker.options) == len(s.layers()) + 1
    s.selected_layer = dec0
    assert why.layer.value.stack == stepper.layer.value.stack == s.selected_layer.stack == dec0.stack
    assert "decoder layer 0" in why.graph.title
    # the Why tab's heading and its drawing's title name the layer as `explain` does, never a bare "Layer 0"
    assert why.text.object.startswith("### Decoder layer 0\n") and "decoder layer 0: " in why.text.object
    # (shown above the drawing in HTML, `SvgGraph.caption`: the app's SVG carries no title of its own)
    assert why.graph.caption.endswith(" decoder layer 0"), why.graph.caption


@pytest.mark.parametrize(("source", "upload", "path", "says"), [
    ("upload", {"bart-full.onnx": "bart-full.onnx"}, "", "the uploaded ONNX file"),
    ("upload", {"model.safetensors": "model.safetensors"}, "", "the uploaded checkpoint"),
    ("checkpoint", {}, "/models/bart-full.ONNX", "the ONNX file at the server path"),
    ("checkpoint", {}, "/models/minilm", "the checkpoint folder"),
])
def test_a_failed_load_names_an_onnx_file_so(source: str, upload: dict, path: str, says: str) -> None:
    """"Error while loading the uploaded checkpoint" was said of an .onnx file too: an ONNX file is named so."""
    s = tiny()
    s.runs._upload_names = upload
    s.checkpoint_dir = path
    s.source = source  # refused or failed: either way the wording is the one checked below
    onnx = s.runs._asked_onnx()
    text = explain_error(RecursionError("deep"), source, s.preset, onnx=onnx)
    assert text.startswith(f"Error while loading {says}: RecursionError"), text
    assert ("checkpoint" in text) != ("ONNX" in text)


@pytest.mark.parametrize("fail_on", ["input", "full"])
def test_a_view_failing_on_a_new_model_leaves_the_previous_one_named(fail_on: str) -> None:
    """A view that raises while the new model is shown (the Why tab's RecursionError on bart-full): some panes drew
    the new model, some did not, and the strip and the stale banner named the new model ("showing the previous
    pipeline run of bart-full") over minilm's panes. The state goes back to the model shown before, named as such;
    `fail_on`: the first picture (the input graph) or the full run fails to show."""
    s = tiny()

    def view(event: object) -> None:  # a view that cannot show the uploaded model
        if s.model.name != "bert-tiny" and (fail_on == "input" or len(s.trace.steps) > 0):
            raise RecursionError("maximum recursion depth exceeded")

    s.param.watch(view, "trace")
    s.load_upload({"gpt2.onnx": (ROOT / "tests/fixtures/onnx/gpt2.onnx").read_bytes()})
    assert s.message_kind == "danger" and s.message.startswith("Error while loading the uploaded ONNX file"), s.message
    assert s.model.name == "bert-tiny" and s.trace is not None and s.trace.input.name == s.model.graph.name  # one model
    assert s.stale.startswith("Stale: showing the previous model (bert-tiny)"), s.stale
    assert "gpt2" not in s.stale
    s.source = "preset"  # back to the model shown: current again
    assert s.stale == "" and s.model.name == "bert-tiny"


def test_a_3000_node_chain_opens_in_the_why_tab() -> None:
    """The Why tab's work (each layer's answer, its drawing, the pickers) on a graph 3000 nodes deep: no walk recurses
    once per node (the bart-full failure was the pickers' loop above, not the graph's depth; this guards the other
    reading of "maximum recursion depth exceeded")."""
    n = 3000
    lines = ["graph deep {", '  %0 = input {name="x"} : f32[1, 4]']
    lines += [f"  %{i} = {'relu' if i % 2 else 'neg'}(%{i - 1}) : f32[1, 4] @encoder.layer.{i % 3}.ff"
              for i in range(1, n + 1)]
    s = tiny()
    why = WhyView(state=s)
    s.param.update(ir_text="\n".join([*lines, f"  return %{n}", "}"]), source="ir")
    assert s.message_kind != "danger" and s.model.name == "deep", s.message
    assert len(s.layers()) == 3 and "### Layer 0" in why.text.object and "Not shown" not in why.text.object
    s.selected_layer = s.layers()[2]
    assert "### Layer 2" in why.text.object and "Not shown" not in why.text.object
