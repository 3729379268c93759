"""An unmasked attention that does not form a FusedAttentionBlock is a gap in rlxviz's op, said so (a newcomer run,
deit.ortopt: `not expected here: fuse_attention_block.qkv_attention_out (mask_kind_keep): ... has mask='none';
FusedAttentionBlock takes a keep or an additive mask operand`, then "expected only of ... a layer whose attention has
a keep mask", and `2/2 layer(s) fused as expected`). No mask is the simplest case; rlxviz's block has no form without a
mask operand. The refusal is still not counted against the model (exit 0), but the words say the gap: the layer is
`fused as far as rlxviz's ops go`, the headline counts it apart from the layers fused as expected and names what rlxviz
lacks, and its line names the compiler fix, in the text, `--json`, the node panel and the layers drawing alike
(`LayerVerdict.status`, `op_gaps`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clirun import run as cli_run
from clirun import unplaced

from rlxviz.app.explain import _verdict as node_panel_verdict
from rlxviz.app.explain import node_report, report_markdown
from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline, layer_of
from rlxviz.passes.why import policy
from rlxviz.passes.why.kinds import LayerArchitecture
from rlxviz.passes.why.verdict import OP_GAP_GROUP, RunVerdict
from rlxviz.session.render import verdicts

ONNX = Path(__file__).parent / "fixtures" / "onnx"
GAP = "FusedAttentionBlock without a mask operand"
WORDS = "fused as far as rlxviz's ops go"
BLOCK_LINE = "fuse_attention_block.qkv_attention_out (mask_kind_keep): "


@pytest.mark.parametrize("kind", ["pre_ln", "llama", "parallel"])
def test_an_unmasked_attention_is_an_op_gap_in_every_kind_that_does_not_expect_the_block(kind):
    arch = LayerArchitecture(kind, f"a {kind} layer; no mask", mask="none")
    why = policy.not_expected(arch, "fuse_attention_block", "mask_kind_keep")
    assert why is not None and why.startswith("not the model's layout but a gap in rlxviz's ops"), why
    assert f"rlxviz has no {GAP}" in why and "zero additive mask" in why, why
    assert "keep mask;" not in why and "has a keep mask" not in why  # the op takes keep or additive: no keep story
    assert policy.op_gap(arch, "fuse_attention_block", "mask_kind_keep") == GAP


@pytest.mark.parametrize("arch, guard", [
    (LayerArchitecture("pre_ln", "additive", mask="additive"), "mask_kind_keep"),  # a mask the block takes: no gap
    (LayerArchitecture("pre_ln", "none", mask="none"), "qkv_split"),  # another guard: its own excuse
    (LayerArchitecture("post_ln", "none", mask="none"), "mask_kind_keep"),  # expected there: it counts, no excuse
    (LayerArchitecture("llama", "kv", mask="none", kv_cache=True), "mask_kind_keep"),  # excused by the KV cache
])
def test_no_gap_where_the_declaration_does_not_say_one(arch, guard):
    assert policy.op_gap(arch, "fuse_attention_block", guard) is None
    why = policy.not_expected(arch, "fuse_attention_block", guard)
    assert why is None or "gap in rlxviz's ops" not in why, why


def _explain(capsys, path: Path) -> tuple[str, dict]:
    code, text, err = cli_run(capsys, "explain", path)
    assert "Traceback" not in err and code == 0, err
    jcode, out, _ = cli_run(capsys, "explain", path, "--json")
    assert jcode == code
    return text, json.loads(out)


BIAS_GAP = "FusedMatMulBiasAct with a residual operand added before its bias"
"""deit.ortopt's other gap: ONNX Runtime's optimizer moved o_proj's and fc2's bias after the residual add
(tests/test_bias_after_residual.py)."""


@pytest.mark.parametrize("path, before", [(ONNX / "cases" / "deit.ortopt.onnx", [BIAS_GAP]), (ONNX / "vit.onnx", [])])
def test_vit_layers_say_the_gap_in_text_and_json(capsys, path, before):
    text, j = _explain(capsys, path)
    n = len(j["layers"])
    assert n >= 2 and j["ok"] and j["fused_layers"] == 0 and j["gap_layers"] == n  # counted apart, still exit 0
    forms = ", ".join([*before, GAP])
    assert re.search(rf"\): 0/{n} layer\(s\) fused as expected; {n} {WORDS} \(rlxviz lacks {forms}: a compiler "
                     rf"fix, nothing in the model to change\)\n", text), text
    assert j["headline"] in text.splitlines() and j["gap_forms"] == [*before, GAP]
    for d in j["layers"]:
        # not "fused" in --json either: held back by rlxviz's ops, nothing in the model to change
        assert d["status"] == WORDS and not d["fused"] and d["gap_only"] and d["nothing_to_change"]
        assert d["op_gaps"][-1] == f"{GAP} (fuse_attention_block.qkv_attention_out: mask_kind_keep)"
        assert [g.split(" (")[0] for g in d["op_gaps"]] == [*before, GAP]
        assert f"layer {d['layer']}: {WORDS}: " in text and f"layer {d['layer']}: fused as expected" not in text
        (line,) = [unplaced(x) for x in d["gap_refusals"] if unplaced(x).startswith(BLOCK_LINE)]
        assert policy.NOT_EXPECTED_WHY not in line and not any(x.startswith(BLOCK_LINE) for x in d["not_expected"])
        reason, _, why = line.removeprefix(BLOCK_LINE).partition(f"; rlxviz has no {GAP}")
        assert "has mask='none' (no mask operand)" in reason and "keep or an additive mask operand" in reason
        assert why.startswith(" (compiler fix: "), why
        assert f"  {OP_GAP_GROUP}: {line}" in map(unplaced, text.splitlines())
    assert text.count(f"  rlxviz's ops lack: {GAP} (fuse_attention_block.qkv_attention_out: mask_kind_keep)") == n


def test_the_app_says_the_same_words():
    trace = Pipeline.canonical().run(load_onnx(str(ONNX / "vit.onnx"), seq=8).graph)
    v = RunVerdict.of(trace)
    boxes = verdicts(trace)
    for lv in v.layers:
        assert lv.status == WORDS
        assert boxes[lv.layer].word == WORDS  # the layers drawing's box and frame
        p = node_panel_verdict(trace, lv.layer)
        assert p is not None and p["status"] == WORDS
        node = next(n for n in trace.final if layer_of(n.path) == lv.layer and n.pass_name)  # a node of the layer
        md = report_markdown(node_report(trace.final, node.id, trace)).replace("\\", "")
        assert f"**layer {lv.layer}: {WORDS}**" in md, md
