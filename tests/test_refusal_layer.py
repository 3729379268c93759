"""A refusal of a matmul + bias epilogue is filed in the layer of its matmul, not of its bias add (a newcomer run on
whisper-encoder.ortopt: layer 0's fc2 `%53 = matmul(...) @model.layers.0.fc2` stays a plain matmul, yet layer 0 read
"fused as far as rlxviz's ops go" naming only the missing mask operand, while layer 1 listed `bias_after_residual at 2
places, %56 ... the bias of the matmul (node 53, model.layers.0.fc2)` and its box's caption said `△2 places`).

ONNX Runtime's optimizer moved fc2's bias into the next layer's SkipLayerNormalization, so the bias add (the refusal's
anchor) was named after layer 1's norm (it now takes its bias's path, `contrib.skip_ln`: test_skip_ln_bias_path).
`trace.REFUSAL_LAYER_RULE`: a refusal is filed in the layer of the refused
candidate's core op (`Rule.core`: the linear's matmul), which `Rejection.layer` reads, and with it `explain`'s text,
`-v`, `--json`, the Why tab, the chips and the layer boxes' captions. The anchor's own label (`%56 (PATH)`) is kept."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from clirun import run as cli_run
from inapp import uploaded

from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.passes.rules.linear import LINEAR_CORE, fuse_matmul_bias_act
from rlxviz.passes.trace import REFUSAL_LAYER_RULE, layer_of
from rlxviz.viz.overlay import before_caption

ONNX = Path(__file__).parent / "fixtures" / "onnx"
WHISPER = ONNX / "ortopt" / "whisper-encoder.ortopt.onnx"
RULE, GUARD = "fuse_matmul_bias_act.bias_after_residual", "bias_after_residual"
ORTOPT = [WHISPER, ONNX / "cases" / "deit.ortopt.onnx", ONNX / "ortopt" / "gpt2.ortopt.onnx",
          ONNX / "ortopt" / "clip-text.ortopt.onnx", ONNX / "ortopt" / "clip-vision.ortopt.onnx"]


@functools.cache
def _trace(path: Path):
    """The canonical run of the file at batch 2 and seq 8, made once per test process (its tests only read it)."""
    return Pipeline.canonical().run(load_onnx(str(path), batch=2, seq=8).graph)


def _sections(text: str) -> dict[str, str]:
    """`explain` text split by its `layer N:` headings (each section runs to the next heading)."""
    out: dict[str, str] = {}
    key = ""
    for line in text.splitlines():
        if line.startswith(("layer ", "outside the layers")) and ":" in line.split(" (")[0]:
            key = line.split(":")[0]
        out[key] = out.get(key, "") + line + "\n"
    return out


def test_every_linear_rule_names_its_core_and_the_rule_is_worded():
    assert all(r.core == LINEAR_CORE for r in fuse_matmul_bias_act.rules)
    assert "core op" in REFUSAL_LAYER_RULE and "matmul" in REFUSAL_LAYER_RULE


@pytest.mark.parametrize("path", ORTOPT, ids=lambda p: p.stem)
def test_a_linear_refusal_is_filed_in_its_matmuls_layer(path):
    trace = _trace(path)
    refused = [(k, r) for k, s in enumerate(trace.steps) for r in s.rejections if r.pass_name == "fuse_matmul_bias_act"]
    assert refused
    for k, r in refused:
        mm = trace.steps[k].before[r.bindings["mm"]]
        assert r.layer == layer_of(mm.path), (r.anchor, r.path, mm.path)
        assert r.path == trace.steps[k].before[r.anchor].path  # the place's label stays its anchor's


def test_whisper_layer_0_names_its_fc2_and_layer_1_does_not(capsys):
    code, verbose, _ = cli_run(capsys, "explain", WHISPER, "-v")
    assert code == 0
    parts = _sections(verbose)
    mine, next_ = parts["layer 0"], parts["layer 1"]
    assert f"{RULE} ({GUARD}) @ %56 (" in mine and "the bias of the matmul (node 53, model.layers.0.fc2)" in mine
    assert "node 53" not in next_ and "%56" not in next_
    assert f"{RULE} ({GUARD}) @ %87 (" in next_  # layer 1's own out_proj, its bias in its final_layer_norm's node
    jcode, out, _ = cli_run(capsys, "explain", WHISPER, "--json")
    assert jcode == 0
    at = {d["layer"]: [a for g in d["gaps"] if g["rule"] == RULE for a in g["at"]] for d in json.loads(out)["layers"]}
    assert at == {0: [56], 1: [87]}


def test_whisper_layer_boxes_count_one_gap_place_each():
    trace = _trace(WHISPER)
    step = next(s for s in trace.steps if s.pass_name == "fuse_matmul_bias_act")
    for layer in (0, 1):
        caption = before_caption(step, trace, layer)
        assert "△1 place at a gap in rlxviz's ops" in caption, caption


def test_whisper_why_tab_files_fc2_in_layer_0(monkeypatch):
    s = uploaded(monkeypatch, WHISPER)  # the upload in this process
    mine, next_ = (s.why_layer(k).replace("\\", "") for k in (0, 1))
    assert f"{RULE} ({GUARD}) @ %56 (" in mine and "node 53, model.layers.0.fc2" in mine
    assert "node 53" not in next_ and f"{RULE} ({GUARD}) @ %87 (" in next_


def test_whisper_node_panel_of_the_bias_add_says_whose_place_it_is():
    """%56 sits in layer 0's box (its path, its bias's: fc2's), the layer its refusal is filed in, so its role needs no
    `in layer N` aside (it read `the bias add in layer 0` while its path named layer 1's norm)."""
    from rlxviz.app.explain import node_report

    trace = _trace(WHISPER)
    k = next(k for k, s in enumerate(trace.steps) if s.pass_name == "fuse_matmul_bias_act")
    rep = node_report(trace.steps[k].before, 56, trace)
    (said,) = [x for x in rep["decisions"] if x["rule"] == RULE and x["guard"] == GUARD]
    assert said["role"] == "the bias add" and rep["layer"] == 0
