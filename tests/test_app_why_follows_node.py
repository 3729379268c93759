"""The Why tab opens on the clicked node's layer (newcomer run: marian.encdec at its last version, the search's
`node_softmax_3` clicked, decoder layer 0's cross-attention softmax as the node drawer names it, then the Why tab
opened on ENCODER layer 0). A click on a node selects the layer it sits in (`AppState.node_layer`), as a click on a
layer box does; with no node selected the tab keeps its own default."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlxviz.app.explain import node_report
from rlxviz.app.graphpane import absorbed_index
from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.app.whyview import WhyView
from rlxviz.passes.trace import layer_label

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "tests/fixtures/onnx/zoo"
MARIAN = ZOO / "marian.encdec.onnx"
ENC_DEC = [pytest.param(ZOO / "t5.encdec.onnx", marks=pytest.mark.sweep),
           pytest.param(ROOT / "tests/fixtures/onnx/cases/bart-full.onnx", marks=pytest.mark.sweep)]
GPT2 = ROOT / "tests/fixtures/onnx/gpt2.onnx"


def loaded(path: Path) -> AppState:
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.load_upload({path.name: path.read_bytes()})
    assert s.model is not None and s.model.name == path.stem and s.trace is not None, s.message
    s.version = len(s.version_labels) - 1  # the last version, as the newcomer's
    return s


def drawn_holder(s: AppState, onnx_name: str) -> int:
    """The node of the shown version a search for ONNX node `onnx_name` lands on: the imported node itself, else the
    fused node that holds it (`graphpane.absorbed_index`, the search's index)."""
    nid = next(i for i, (_, name, *_) in s.model.meta["onnx_nodes"].items() if name == onnx_name)
    g = s.current_graph
    if nid in g:
        return nid
    held = absorbed_index(g, s.trace)
    return next(int(k[1:]) for k, rows in held.items() if any(nid in ids for _, ids, *_ in rows))


def click(s: AppState, node: int) -> None:
    """A click on `node` in the after pane (`GraphPanes`' watcher on `SvgGraph.clicks`)."""
    s.param.update(selected_before=False, selected_node=node)


def drawer_layer(s: AppState, node: int) -> str:
    """The layer the node drawer names for `node` (`explain.node_report`'s `layer`)."""
    return layer_label(node_report(s.current_graph, node, s.trace)["layer"])


def heading(why: WhyView) -> str:
    return why.text.object.split("\n", 1)[0]


def test_marian_opens_the_why_tab_on_the_clicked_softmaxs_decoder_layer():
    s = loaded(MARIAN)
    node = drawn_holder(s, "node_softmax_3")
    assert drawer_layer(s, node) == "decoder layer 0"
    click(s, node)
    why = WhyView(state=s)  # the tab shown for the first time after the click
    assert why.layer.value.label == "decoder layer 0" and heading(why) == "### Decoder layer 0", heading(why)
    assert why.graph.caption.endswith(" decoder layer 0"), why.graph.caption
    enc1 = next(k for k in s.layers() if k.stack == "encoder" and int(k) == 1)
    why.layer.value = enc1  # the user's own pick in the tab, then a click on a node of another layer
    assert heading(why) == "### Encoder layer 1"
    other = next(n.id for n in s.current_graph if n.path.startswith("model.decoder.layers.1."))
    click(s, other)
    assert heading(why) == "### Decoder layer 1" and why.layer.value.label == "decoder layer 1", heading(why)


@pytest.mark.parametrize("path", ENC_DEC, ids=lambda p: p.name)
def test_an_encoder_decoders_why_tab_follows_a_clicked_decoder_node(path: Path):
    s = loaded(path)
    for stack in ("decoder", "encoder"):
        layer = max(k for k in s.layers() if k.stack.endswith(stack))  # its last layer: not the tab's default
        node = next(n.id for n in s.current_graph if s.node_layer(n.id) == layer)  # a Layer: index and stack
        click(s, node)
        why = WhyView(state=s)
        want = drawer_layer(s, node)
        assert want == layer.label and why.layer.value.label == want, (want, why.layer.value)
        assert heading(why) == f"### {want[:1].upper()}{want[1:]}", heading(why)


def test_a_decoder_only_models_why_tab_opens_on_the_clicked_layer():
    s = loaded(GPT2)
    default = WhyView(state=s).layer.value  # no node selected: the tab's own default
    last = max(s.layers())
    assert int(last) > 0 and default != last
    node = next(n.id for n in s.current_graph if s.node_layer(n.id) == last)
    click(s, node)
    why = WhyView(state=s)
    assert why.layer.value == last and heading(why) == f"### Layer {int(last)}", heading(why)
    assert drawer_layer(s, node) == f"layer {int(last)}"


def test_a_node_of_no_layer_and_no_node_keep_the_tabs_default():
    s = loaded(GPT2)
    default = WhyView(state=s).layer.value
    outside = next(n.id for n in s.current_graph if s.node_layer(n.id) is None)
    click(s, outside)
    assert WhyView(state=s).layer.value == default and s.selected_layer == default
    click(s, None)  # the drawer closed: the layer shown stays
    assert WhyView(state=s).layer.value == default


def test_a_node_clicked_in_the_before_pane_is_found_in_that_version():
    """A node the before pane holds and the after pane does not (absorbed by the step): its layer all the same."""
    s = loaded(GPT2)

    def gone() -> list[int]:  # nodes of a layer past 0 the shown step took away
        after = s.current_graph
        return [n.id for n in s.previous_graph if n.id not in after and int(s.node_layer(n.id, before=True) or 0)]

    s.version = next(k for k in range(1, len(s.version_labels)) if s.param.update(version=k) or gone())
    node = gone()[0]
    s.param.update(selected_before=True, selected_node=node)
    assert s.selected_layer == s.node_layer(node, before=True) and int(s.selected_layer) > 0
    assert s.node_layer(node) == s.selected_layer  # not in the version shown: found in another


def test_a_layer_picked_in_the_graph_tab_is_the_why_tabs():
    """A layer box clicked (or picked in the focus view) in the Graph tab before the Why tab was first shown: the tab
    opens on it, not on its own default (layer 0 here, every layer fused), and keeps it over a new run of the model
    (newcomer runs 35-39: the tab followed a clicked node's layer, not a picked one)."""
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    assert len(s.layers()) == 2
    s.toggle_layer(1)  # the collapsed overview's layer 1 box
    why = WhyView(state=s)
    assert heading(why) == "### Layer 1", heading(why)
    s.threshold = 4  # another pipeline: a new run of the same model
    assert s.trace is not None and heading(why) == "### Layer 1", heading(why)
    s.toggle_layer(0)  # picked again in the Graph tab, the tab shown
    assert heading(why) == "### Layer 0", heading(why)
    fresh = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    assert heading(WhyView(state=fresh)) == "### Layer 0"  # nothing picked: the tab's own default
