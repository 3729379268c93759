"""A product the pipeline cannot make names its places, as every other refusal line names its own.

`rlxviz explain --expect pipeline -p ... granite.onnx` printed "judged against the pipeline only: the pipeline has no
fuse_shared_input_matmul: shared-input matmul cannot be made" under each layer, naming no node, while each
not-expected line names its places by node (`policy.places_words`: `@ %26 (PATH)`, `at 2 places, ...`). Each such
line now names where the canonical pipeline made the product (`facts.Unmade.places`): the run's own node there, or
the input graph's node the reference's matches were anchored on; never a node id of the reference run that means
another node in the run judged (roberta: the reference's bias add %155 is the run's FusedResidualLN %155).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.models.onnx import load_onnx
from rlxviz.passes import CANONICAL_ORDER, Pipeline
from rlxviz.passes.why.facts import RunFacts
from rlxviz.passes.why.verdict import RunVerdict

HERE = Path(__file__).parent
ONNX = HERE / "fixtures" / "onnx" / "cases"
SPEC = "canonicalize_exported,canonicalize_norm,canonicalize_gelu,fuse_sdpa,fuse_swiglu,fuse_residual_ln"
SHARED = "the pipeline has no fuse_shared_input_matmul: shared-input matmul cannot be made"


def test_granite_names_each_layers_place_in_text_and_json(capsys):
    args = ["explain", ONNX / "granite.onnx", "-p", SPEC, "--expect", "pipeline"]
    code, text, _ = cli_run(capsys, *args)
    lines = [ln.strip() for ln in text.splitlines() if "cannot be made" in ln]
    assert code == 0 and lines == [
        f"judged against the pipeline only: {SHARED} @ %26 (layers.0.self_attn.q_proj)",
        f"judged against the pipeline only: {SHARED} @ %103 (layers.1.self_attn.q_proj)"], text
    _, out, _ = cli_run(capsys, *args, "--json")
    layers = json.loads(out)["layers"]
    assert [lv["cannot_make"] for lv in layers] == [[ln.removeprefix("judged against the pipeline only: ")]
                                                    for ln in lines]
    assert [lv["unmade"] for lv in layers] == [
        [{"missing": "fuse_shared_input_matmul", "product": "shared-input matmul", "via": "",
          "places": [[node, f"layers.{i}.self_attn.q_proj"]]}] for i, node in enumerate((26, 103))]


def test_an_ir_case_names_several_places(capsys):
    code, text, _ = cli_run(capsys, "explain", HERE / "data" / "cases" / "n3-09-cross-attention.rlx", "-p", SPEC)
    path = "decoder.layers.0.encoder_attn"
    assert code == 1 and (f"  the pipeline has no fuse_matmul_bias_act: FusedMatMulBiasAct cannot be made at 3 places, "
                          f"%12 ({path}), %16 ({path}) and %39 ({path})") in text.splitlines(), text


@pytest.mark.parametrize("spec", [SPEC, "fuse_swiglu", ",".join(p for p in CANONICAL_ORDER if p != "fuse_sdpa")])
@pytest.mark.parametrize("case", ["roberta.onnx", "bart-full.onnx"])
def test_every_place_named_is_that_node_of_the_run_judged(spec, case):
    trace = Pipeline(spec.split(",")).run(load_onnx(ONNX / case, seq=8).graph)
    nodes = {}
    for _, g in trace.versions():
        for n in g:
            nodes.setdefault(n.id, n)
    v = RunVerdict.of(trace, expect="pipeline")
    facts = RunFacts.of(trace)
    unmade = [u for lv in v.layers for u in lv.unmade] + facts.unmade(None)
    assert unmade and all(u.places for u in unmade), [u for u in unmade if not u.places]
    for u in unmade:
        for node, path in u.places:
            assert node in nodes and nodes[node].path == path, (u, nodes.get(node))
