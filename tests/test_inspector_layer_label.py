"""The node inspector names a layer of an encoder-decoder model as every other view does (`passes.trace.layer_label`
of the model's own key: `decoder layer 0`). marian.encdec's softmax `node_softmax_3` (decoder layer 0's cross
attention) read `provenance model.decoder.layers.0.encoder_attn (layer 0)` and `layer 0: fused as expected` while
the search banner, the Why tab's picker, the matches table and `rlxviz explain` said `decoder layer 0`, and the
encoder's layer 0, with a verdict of its own, is a `layer 0` too. One key per layer (`trace.own_key`), one label."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV
from rlxviz.app.state import AppState
from rlxviz.passes.trace import Layer, layer_of
from rlxviz.passes.why.text import render_layer

ZOO = Path(__file__).parent / "fixtures/onnx/zoo"


def _load(name: str) -> AppState:
    """AppState showing `ZOO/NAME.onnx`, run in the foreground."""
    path = ZOO / f"{name}.onnx"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ALLOWED_DIRS_ENV, str(ZOO))
        s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
        s.param.update(checkpoint_dir=str(path), source="checkpoint")
    assert s.model.name == name and s.trace is not None, s.message
    return s


def _inspect(s: AppState, node: int) -> str:
    """The inspector's Markdown for `node` of the before pane, clicked as the app's drawing clicks it."""
    from rlxviz.app.panels import GraphCompare, NodeInspector

    compare, drawer = GraphCompare(state=s), NodeInspector(state=s)
    compare.before.clicked = node
    compare.before.clicks += 1
    return drawer.pane.object


def _cli_line(s: AppState, layer: Layer) -> str:
    """The first line `rlxviz explain` prints for `layer` (`render_layer` of the app's verdict)."""
    (v,) = [v for v in s.verdict().layers if v.layer == layer]
    return render_layer(v).splitlines()[0]


def _says_its_layer(s: AppState, node: int) -> str:
    """Check the inspector's layer words for `node` against the Why picker's and the CLI's; return its label."""
    layer = layer_of(s.previous_graph[node].path)
    label = next(k for k, v in s.layer_options().items() if v is not None and v == layer)  # the Why tab's picker
    cli = _cli_line(s, layer)
    assert cli.startswith(f"{label}: "), (cli, label)
    text = _inspect(s, node).replace("\\", "")
    assert f"({label})\n" in text, text  # the provenance line's `(decoder layer 0)`
    status = cli.removeprefix(f"{label}: ").split(":")[0]  # `fused as expected`, `NOT fused`, ...
    assert f"**{label}: {status}" in text, (status, text)
    assert "(layer 0)" not in text and "**layer 0" not in text, text
    return label


def test_marian_cross_attention_softmax_names_the_decoder_layer():
    """`node_softmax_3`, absorbed by decoder layer 0's cross attention: `(decoder layer 0)` on its provenance line
    and `decoder layer 0: fused as expected`, the words of the banner, the Why tab and `explain`."""
    s = _load("marian.encdec")
    (node,) = [i for i, (_, name, _) in s.model.meta["onnx_nodes"].items() if name == "node_softmax_3"]
    assert _says_its_layer(s, node) == "decoder layer 0"


def test_t5_both_layers_0_read_apart():
    """t5.encdec's encoder layer 0 and decoder layer 0: a softmax of each names its own stack's layer and verdict."""
    s = _load("t5.encdec")
    g = s.previous_graph
    said = set()
    for stack in ("encoder", "decoder"):
        node = next(n.id for n in g if n.op.value == "softmax" and layer_of(n.path) == Layer(0, stack))
        said.add(_says_its_layer(s, node))
    assert said == {"encoder layer 0", "decoder layer 0"}
