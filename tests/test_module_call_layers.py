"""Layers named by a module's call count (ALBERT's one shared layer, called once per layer: `albert_layers.0@1`)
drawn one box per layer.

Newcomer run 23: the collapsed view and `rlxviz render --view layers` crashed on ALBERT exports ("StopIteration",
said as an error in the uploaded file, exit 3 on the CLI): the box's title looked for a path component equal to the
layer's index, and `albert_layers.0@1` has none. The title is the path up to its layer (`trace.layer_prefix`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_near_miss_rule import trace_of

from rlxviz.cli.entry import main
from rlxviz.passes.trace import layer_of, layer_prefix
from rlxviz.session.render import View, dot

ONNX = Path(__file__).parent / "fixtures" / "onnx"
ALBERT = [ONNX / "ortopt" / "albert.ortopt.onnx", ONNX / "zoo" / "albert.ts-eager.onnx"]


@pytest.mark.parametrize(("path", "prefix"), [
    ("albert_layers.0@1.attention", "albert_layers.0@1"), ("albert_layers.0@0", "albert_layers.0@0"),
    ("encoder.layer.3.attention.self", "encoder.layer.3"), ("model.decoder.block.1.layer.0", "model.decoder.block.1"),
    ("h.11.mlp", "h.11"), ("embeddings.word", None), ("", None)])
def test_the_layer_prefix_ends_at_the_layer_layer_of_reads(path, prefix):
    assert layer_prefix(path) == prefix
    assert (layer_of(path) is None) == (prefix is None)


@pytest.mark.parametrize("path", ALBERT, ids=lambda p: p.name)
def test_every_version_of_an_albert_export_draws_one_box_per_layer(path):
    trace = trace_of(path)
    for k in range(len(trace.versions())):
        text = dot(trace, View(k, "layers", "after"))
        titles = set(re.findall(r"albert_layers\.0@(\d+)", text))
        assert titles == {"0", "1"}, (k, titles)


def test_render_layers_on_the_cli(tmp_path, capsys):
    out = tmp_path / "a.svg"
    assert main(["render", str(ALBERT[0]), "--view", "layers", "-o", str(out)]) == 0
    assert "albert_layers.0@1" in out.read_text()
