"""`rlxviz run MODEL.onnx --layers 0-K`: each array the slice writes is said for what it is, from the graph (newcomer
run: granite's `--layers 0-0` wrote `add_420, unsqueeze_15, unsqueeze_14` and named only the first; the two others,
RoPE's sin and cos tables shared by the layers, were left unexplained). And an inputs file holding the whole
model's outputs (`out:logits` larger than any output of the slice) is set aside, not refused."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from clirun import run
from onnx import TensorProto, helper

from rlxviz.models.onnx.slice import output_roles, slice_layers, slice_outputs

CASES = "tests/fixtures/onnx/cases"


def test_a_slice_file_says_what_each_output_is():
    outs = slice_outputs(slice_layers("tests/fixtures/onnx/llama.onnx", 0, 0))
    (stream, s0), (_, s1), (_, s2) = outs
    assert s0 == "the residual stream after layer 0 (the hidden state layer 1 reads)", outs
    assert s1.startswith("the RoPE sin table, computed from shapes and constants only"), outs
    assert s2.startswith("the RoPE cos table, computed from shapes and constants only"), outs
    assert s1.endswith("; layers 0-1 read it") and s2.endswith("; layers 0-1 read it"), outs


def test_run_layers_prints_each_array_with_what_it_is(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    model = f"{CASES}/optimum.llama-with-past.onnx"
    code, _, err = run(capsys, "run", model, "--layers", "0-0", "-i", f"{CASES}/optimum.llama-with-past_io.npz",
                       "-o", tmp_path / "out.npz")
    assert code == 0, err
    # the whole model's outputs the slice lacks are set aside (out:logits was refused as "larger than every output")
    assert "note: out:logits, out:present.1.key, out:present.1.value of the inputs file set aside" in err, err
    keys = list(np.load(tmp_path / "out.npz").keys())
    lines = {ln.split(" ", 3)[2]: ln for ln in err.splitlines() if ln.startswith("  ")}
    assert list(lines) == keys and len(keys) == 5, err  # one line per key, in the file's order
    assert "the residual stream after layer 0 (the hidden state layer 1 reads)" in lines[keys[0]]
    assert keys[0] == "/model/layers.0/Add_1_output_0" and "float32 2x8x64" in lines[keys[0]]
    assert "an output of the whole model, computed in layer 0" in lines["present.0.key"]
    rope = [lines[k] for k in keys[3:]]
    assert "the RoPE sin table, computed from the input position_ids; layers 0-1 read it" in rope[0], rope
    assert "the RoPE cos table, computed from the input position_ids; layers 0-1 read it" in rope[1], rope
    # present.0.* of the inputs file are outputs of the slice too: checked
    assert "version 0 equals the expected outputs in optimum.llama-with-past_io.npz" in err, err


def _node(op: str, ins: list[str], out: str, layer: int) -> onnx.NodeProto:
    """A node of layer `layer`, by a legacy exporter's node name (`/model/layers.0/Neg` -> `model.layers.0`)."""
    return helper.make_node(op, ins, [out], name=f"/model/layers.{layer}/{op}_{out}")


def test_roles_of_a_mask_and_of_any_other_value():
    """A value built from the mask input only is an attention mask; any other value is said by what it is
    computed from and which layers read it."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4], [1.0] * 4)
    nodes = [_node("Neg", ["attention_mask"], "m", 0),  # layer 0 builds a mask that layer 1 reads too
             _node("Mul", ["x", "w"], "scaled", 0),
             _node("Add", ["x", "m"], "h0", 0),
             _node("Add", ["h0", "m"], "h1", 1),
             _node("Add", ["h1", "scaled"], "y", 1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, [2, 4])
                                           for i in ("x", "attention_mask")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
    roles = output_roles(graph, ["h0", "scaled", "m"], 0)
    assert roles["h0"] == "the residual stream after layer 0 (the hidden state layer 1 reads)"
    assert roles["m"] == "an attention mask, computed from the input attention_mask; layers 0-1 read it"
    assert roles["scaled"] == "a value layer 0 computes from the input x; layer 1 reads it"


def test_docs_quote_what_run_layers_prints(tmp_path, capsys):
    """docs/onnx.md's block of `run --layers 0-0` on granite.onnx is that run's output (the path aside)."""
    import re
    from pathlib import Path

    doc = Path("docs/onnx.md").read_text()
    quoted = re.search(r"```\n(granite\.layers0-0: reference -> out\.npz.*?)```", doc, re.S)
    assert quoted, "docs/onnx.md: no block of run --layers output"
    code, _, err = run(capsys, "run", f"{CASES}/granite.onnx", "--layers", "0-0", "-i", f"{CASES}/granite_io.npz",
                       "-o", tmp_path / "out.npz", "--backend", "reference")
    assert code == 0, err
    got = err.replace(str(tmp_path / "out.npz"), "out.npz").splitlines()
    want = quoted.group(1).splitlines()
    start = got.index(want[0])
    assert got[start:start + len(want)] == want, err
