"""A layer box of a quantized (QDQ) model says how far its `fused` goes, and is not drawn as a full fusion.

Newcomer finding: ernie.qdq's and granite.qdq's layer boxes read `final: fused` / `fused`, in the green of bert's
FusedTransformerLayer, of layers whose only fused ops are elementwise regions: their attention and matmuls stayed
unfused, as their kind (quantized activations: no float fusion across a QuantizeLinear -> DequantizeLinear step)
expects. `explain` said it right: `layer 0: fused as expected: ElementwiseRegion x111 (...)` and `layer kind: ...
quantized activations (33 QuantizeLinear -> DequantizeLinear steps)`.

Decision: the verdict words the limit (`passes.why.text.kind_limit`); the box says the CLI's `fused as expected`, what
fused, and the limit on its own line, in the legend's `KIND_LIMITED` look (pale green, dashed olive frame), never the
fused green. A layer fused into one FusedTransformerLayer keeps its `fused` and its green.
"""

from __future__ import annotations

import functools
import html
import re
from collections import Counter
from pathlib import Path

import pytest
from test_near_miss_rule import trace_of

from rlxviz.app.graphpane import ops_legend_html
from rlxviz.passes import Trace
from rlxviz.passes.why.text import FUSED_AS_EXPECTED, QUANTIZED_LIMIT, kind_limit
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.session import OpenRequest, open_model, open_pipeline, open_trace
from rlxviz.session.render import View, dot
from rlxviz.viz.styles import BOX_FRAMES, FUSED_INK, KIND_LIMITED, KIND_LIMITED_INK, STATUS_COLORS

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
QDQ = [ZOO / "ernie.qdq.onnx", ZOO / "granite.qdq.onnx"]


@functools.cache
def _trace(source: str) -> Trace:
    if source.endswith(".onnx"):
        return trace_of(source)
    req = OpenRequest(source=source, seq=8)
    return open_trace(open_model(req).graph, req, open_pipeline(req))


def _box(t: Trace, version: int, layer: int) -> tuple[str, str]:
    """(words, DOT statement) of layer `layer`'s folded box at `version`, the label's markup stripped."""
    source = html.unescape(dot(t, View(version, "layers")))
    line = next(x for x in source.splitlines() if x.strip().startswith(f"layer{layer} "))
    return " ".join(re.sub(r"<[^>]+>", " ", line.split(" fillcolor=")[0]).split()), line


def _fill(line: str) -> str:
    return re.search(r'fillcolor="([^"]+)"', line).group(1)


@pytest.mark.parametrize("path", QDQ, ids=lambda p: p.stem)
def test_a_qdq_layer_box_says_what_fused_and_its_kinds_limit_not_a_bare_fused(path):
    t = _trace(str(path))
    run = RunVerdict.of(t)
    last = len(t.versions()) - 1
    for v in run.layers:
        assert v.status == "fused" and v.expected_kind.quantized and kind_limit(v) == QUANTIZED_LIMIT, v.status
        assert run.render().count(f"layer {v.layer}: {FUSED_AS_EXPECTED}: ElementwiseRegion x") == 1  # the CLI
        made = Counter(x.split(" %", 1)[0] for x in v.done)
        assert set(made) == {"ElementwiseRegion"}, made  # elementwise regions alone: no compute op fused
        words, line = _box(t, last, int(v.layer))
        assert f"{FUSED_AS_EXPECTED} ElementwiseRegion×{made['ElementwiseRegion']} {QUANTIZED_LIMIT}" in words, words
        assert "<B>fused</B>" not in line and f"<B>{FUSED_AS_EXPECTED}</B>" in line, line
        assert _fill(line) == STATUS_COLORS[KIND_LIMITED] != STATUS_COLORS["fused"], line
        assert FUSED_INK not in line and f'color="{KIND_LIMITED_INK}"' in line and "dashed" in line, line
        assert f"{FUSED_AS_EXPECTED} ({QUANTIZED_LIMIT})" in re.search(r'tooltip="([^"]*)"', line).group(1)
        first, line0 = _box(t, 0, int(v.layer))  # the input: the final verdict, then what is there so far
        assert f"final: {FUSED_AS_EXPECTED} {QUANTIZED_LIMIT} at this version: unfused" in first, first
        assert "<B>final: fused</B>" not in line0, line0


def test_a_fully_fused_bert_layer_keeps_its_fused_and_its_green():
    t = _trace("bert-tiny")
    last = len(t.versions()) - 1
    for v in RunVerdict.of(t).layers:
        assert v.status == "fused" and v.fused_node is not None and kind_limit(v) == "", v.status
        words, line = _box(t, last, int(v.layer))
        assert "<B>fused</B>" in line and "fused FusedTransformerLayer" in words, words
        assert FUSED_AS_EXPECTED not in words and "quantized" not in words, words
        assert _fill(line) == STATUS_COLORS["fused"] and f'color="{FUSED_INK}"' in line, line
        first, _ = _box(t, 0, int(v.layer))
        assert "final: fused at this version: unfused" in first, first


def test_the_legend_shows_the_kind_limited_look_with_its_words():
    text = html.unescape(ops_legend_html())
    colour, style, _ = BOX_FRAMES[KIND_LIMITED]
    assert f"background:{STATUS_COLORS[KIND_LIMITED]};border:2px {style} {colour}" in text
    assert f"{FUSED_AS_EXPECTED}, quantized activations: not a full fusion" in text
