"""A pass that matched in a layer is never said to have had "no candidate here" there (a newcomer run).

esm (dynamo eager), layer 0: the compiler fix's check said `fuse_shared_input_matmul ran before but had no candidate
here (its pattern did not match these nodes)` while the `-v` trace of the same layer said `[fused]
fuse_shared_input_matmul.concat_weights: -> node(s) 181` (the Q/K/V merge happened). `report._what_ran` looked for
the pass's product among the refused nodes' producers up to four edges up, but fuse_matmul_bias_act had since taken
the merged matmul (node 181) into a FusedMatMulBiasAct (node 194) with its bias: the id was no longer in the graph.

Decision: a product is followed into the nodes that later absorbed it (`report._with_absorbed`); up to four edges above
the refused nodes it "did its part here" (esm: V's narrow reads node 194); above them at any depth within the place's
layer it "did its part in this layer (..., above these nodes)", what the pattern refuses lying past or beside it; a
match elsewhere in the layer, on nodes the pattern does not read, says so ("matched in this layer ..., but not on the
nodes this pattern reads"); "had no candidate here" only where the pass matched nothing in the layer.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from test_session_parity import cli_run

from rlxviz.passes import Pipeline
from rlxviz.passes.report import in_context
from rlxviz.passes.whatif import STATEMENT, fix_form
from rlxviz.session.loading import load

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
ESM = ZOO / "esm.dynamo-eager.onnx"
NO_CANDIDATE = re.compile(r"(\w+) ran before but had no candidate here")
LAYER = re.compile(r"^  layer (\d+) \(canonical pipeline\)$")
FUSED = re.compile(r"^    \[fused\]\s+(\w+)\.")


def _fused_by_layer(out: str) -> dict[int, set[str]]:
    """Layer -> the passes its `explain -v` trace marks `[fused]`."""
    got: dict[int, set[str]] = {}
    layer = None
    for line in out.splitlines():
        if m := LAYER.match(line):
            layer = int(m.group(1))
            got.setdefault(layer, set())
        elif layer is not None and (m := FUSED.match(line)):
            got[layer].add(m.group(1))
        elif not line.startswith("    "):
            layer = None
    return got


def _said_by_layer(out: str) -> dict[int, set[str]]:
    """Layer -> the passes its verdict lines (`layer N: ...` and what follows) say had no candidate there."""
    got: dict[int, set[str]] = {}
    layer = None
    for line in out.splitlines():
        if m := re.match(r"^layer (\d+): ", line):
            layer = int(m.group(1))
        if layer is not None:
            got.setdefault(layer, set()).update(NO_CANDIDATE.findall(line))
    return got


@pytest.mark.parametrize("name", ["esm.dynamo-eager", "esm.optimum", "qwen3.dynamo-eager", "bert.dynamo-eager"])
def test_no_candidate_is_never_said_of_a_pass_that_fused_in_the_layer(capsys, name):
    code, out, err = cli_run(capsys, "explain", ZOO / f"{name}.onnx", "-v")
    assert "Traceback" not in err, err
    fused, said = _fused_by_layer(out), _said_by_layer(out)
    assert fused, out[:2000]
    for layer, passes in said.items():
        assert not passes & fused.get(layer, set()), (layer, passes & fused.get(layer, set()))


def test_esms_compiler_fix_check_says_the_qkv_merge_did_its_part(capsys):
    code, out, _ = cli_run(capsys, "explain", ESM, "-v")
    assert "[fused]    fuse_shared_input_matmul.concat_weights: -> node(s) 181" in out
    assert "fuse_shared_input_matmul ran before but had no candidate here" not in out
    assert ("then qkv_packed (not recognized) fails: q_rope (node 162).inputs[0] (q) is reshape (node 157, "
            "model.encoder.layer.0.attention.self); needs narrow") in out
    assert ("fuse_shared_input_matmul ran before and did its part here (fuse_shared_input_matmul.concat_weights -> "
            "matmul, node 181)") in out  # V's narrow reads the FusedMatMulBiasAct (node 194) that absorbed it


def _esm_qkv_refusal():
    """esm's run and its attention refusal re-worded as `qkv_packed` (what the compiler fix's check finds next)."""
    t = Pipeline.canonical().run(load(str(ESM)).graph)
    k = next(i for i, s in enumerate(t.steps) if s.pass_name == "fuse_attention_block")
    r = next(r for r in t.steps[k].rejections if r.guard == "default_scale" and r.anchor == 178)
    return t, k, r


def test_a_match_elsewhere_in_the_layer_is_no_candidate_here_nor_its_part():
    t, k, r = _esm_qkv_refusal()
    before = t.steps[k].before
    # a place of layer 0 that reads no node the merge made or feeds: one of the layer's weights, alone
    weight = next(n.id for n in before if n.op.value == "param" and n.path == r.path and not n.inputs)
    far = replace(r, bindings={"w": weight}, offending=(), anchor=weight, subject=None,
                  message="run fuse_shared_input_matmul first", hint="")
    said = in_context(t, k, far)[0]
    assert said.startswith("fuse_shared_input_matmul ran before and matched in this layer "
                           "(fuse_shared_input_matmul.concat_weights -> matmul, node 181), but not on the nodes"), said
    assert fix_form(said) == STATEMENT
    # a place further down the layer (the MLP's up projection): the merge is above it, more than four edges up
    mlp = next(n.id for n in before if n.op.value == "FusedMatMulBiasAct" and "layer.0.intermediate" in n.path)
    down = replace(far, bindings={"x": mlp}, anchor=mlp)
    assert in_context(t, k, down)[0].startswith(
        "fuse_shared_input_matmul ran before and did its part in this layer (fuse_shared_input_matmul.concat_weights"
        " -> matmul, node 181, above these nodes)")
    # the same place in a layer the pass never matched in (no layer in the path): no candidate there
    nowhere = replace(far, path="")
    assert in_context(t, k, nowhere)[0].startswith("fuse_shared_input_matmul ran before but had no candidate here")


BETWEEN = "what this pattern does not take stands between that product and this one"
BESIDE = "what this pattern does not take lies beside that product (on an operand it does not feed)"


@pytest.mark.parametrize(("name", "said"), [("esm.dynamo-eager", BETWEEN), ("mobilebert.dynamo-eager", BESIDE),
                                             ("mobilebert.optimum", BESIDE)])
def test_between_or_beside_follows_the_failed_checks_subject(capsys, name, said):
    """esm: the head split sits on the path from the merged QKV matmul to the RoPE (between); mobilebert: V is
    projected from another input than the merged Q/K matmul, so the check's subject is not fed by the merge (beside:
    "between" named a place the product does not reach)."""
    code, out, err = cli_run(capsys, "explain", ZOO / f"{name}.onnx", "-v")
    assert "Traceback" not in err, err
    assert said in out
    assert (BESIDE if said == BETWEEN else BETWEEN) not in out
