"""An attribute is shown as the IR text (and so `rlxviz explain`) prints it (issue 39, a newcomer run: the node
inspector said `activation=None` where the IR line below it said `activation=none`). The inspector, a node's tooltip
and the layer view's search text all go through `ir.printer.format_value`, the one formatter."""

from __future__ import annotations

import re

import pytest

from rlxviz.app.explain import node_report, report_markdown
from rlxviz.app.graphpane import folded_index
from rlxviz.ir import Op, format_node, parse_ir
from rlxviz.models import load_model
from rlxviz.passes import Pipeline
from rlxviz.viz import graph_to_dot

LINEAR = """graph ffn {
  %0 = input {name="x"} : f32[2, 8]
  %1 = param {name="w"} : f32[8, 16]
  %2 = param {name="b"} : f32[16]
  %3 = matmul(%0, %1) : f32[2, 16] @encoder.layer.0.intermediate.dense
  %4 = add(%3, %2) : f32[2, 16] @encoder.layer.0.intermediate.dense
  %5 = relu(%4) : f32[2, 16] @encoder.layer.0.intermediate.act
  return %5
}"""


def _relu_left_out():
    """A matmul + bias fused with its relu left out: FusedMatMulBiasAct with `activation` None."""
    trace = Pipeline.canonical().run(parse_ir(LINEAR))
    (n,) = trace.final.find(Op.FUSED_MATMUL_BIAS_ACT)
    assert n.attrs["activation"] is None
    return trace, n


def _llama_attention():
    """llama-block's attention: `scale`, `num_kv_heads` and `mask_fill` None."""
    trace = Pipeline.canonical().run(load_model("llama-block", 1, 8).graph)
    (n,) = trace.final.find(Op.ATTENTION)
    assert [k for k, v in n.attrs.items() if v is None] == ["scale", "num_kv_heads", "mask_fill"]
    return trace, n


def _bert_layer():
    """bert-tiny's FusedTransformerLayer: a None (`mask_fill`), a string, a bool and floats."""
    trace = Pipeline.canonical().run(load_model("bert-tiny", 1, 8).graph)
    n = trace.final.find(Op.FUSED_TRANSFORMER_LAYER)[0]
    assert n.attrs["mask_fill"] is None and n.attrs["has_bias"] is True
    return trace, n


CASES = {"relu_left_out": _relu_left_out, "llama_attention": _llama_attention, "bert_layer": _bert_layer}


def _attr_pairs(ir_line: str) -> list[str]:
    """`k=v` of an IR line's attribute braces."""
    body = re.search(r" \{(.*)\} : ", ir_line).group(1)
    return re.findall(r'\w+=(?:"[^"]*"|\[[^\]]*\]|[^,]+)', body)


@pytest.mark.parametrize("case", sorted(CASES))
def test_inspector_prints_each_attribute_as_the_ir_line_does(case):
    trace, n = CASES[case]()
    text = report_markdown(node_report(trace.final, n.id, trace))
    line = next(x for x in text.split("\n\n") if x.startswith("**attributes** "))
    shown = [re.sub(r"\\(.)", r"\1", c) for c in re.findall(r"<code>(.*?)</code>", line)]  # md_code, unescaped
    assert shown == _attr_pairs(format_node(n)), (shown, format_node(n))
    assert "None" not in line and "True" not in line and "'" not in line, line
    assert any(p.endswith("=none") for p in shown)


@pytest.mark.parametrize("case", sorted(CASES))
def test_tooltip_and_layer_search_text_print_attributes_as_the_ir_line_does(case):
    trace, n = CASES[case]()
    want = "attrs: " + ", ".join(_attr_pairs(format_node(n)))
    dot = graph_to_dot(trace.final)
    tip = re.search(rf'id="?n{n.id}"?[^\]]*tooltip="([^"\\]*(?:\\.[^"\\]*)*)"', dot) or re.search(
        rf'tooltip="([^"\\]*(?:\\.[^"\\]*)*)"[^\]]*id="?n{n.id}"?', dot)
    assert tip is not None
    tip_text = tip.group(1).replace('\\"', '"').replace("\\n", "\n")
    assert want in tip_text.split("\n"), tip_text
    folded = [t for rows in folded_index(trace.final, [], trace).values() for i, t in rows if i == n.id]
    assert folded and want.lower() in str(folded[0]).split("\n")
