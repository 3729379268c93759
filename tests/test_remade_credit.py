"""A fused op a rewrite re-made beside its product is credited to the pass whose fusion it is (issue 39, newcomer).

gpt-neox's layer line read `FusedMatMulBiasAct %231 (fuse_attention_block)`: true of the node (the QKV-column stage
of `fuse_attention_block` emitted it, `Node.pass_name`), but it read as a FusedMatMulBiasAct that pass fused. The
matmul-bias fusion is `fuse_matmul_bias_act`'s (%218); the stage re-made that node with its weight's columns in
Q/K/V order beside the attention it rewrote. Decision: the one wording of a layer's fused ops (`facts.fused_items`,
read by `explain`, `-v`, `--json`'s `done` and the app's Why tab) names the pass whose fused op it re-makes, that
node, its role in the match and the rule that re-made it (`facts.REMADE`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clirun import run as cli_run
from test_near_miss_rule import trace_of

from rlxviz.ir import Op
from rlxviz.passes.trace import Trace
from rlxviz.passes.why.facts import REMADE
from rlxviz.passes.why.verdict import RunVerdict

NEOX = Path(__file__).parent / "fixtures" / "onnx" / "cases" / "gpt-neox.legacy-sdpa.onnx"
STAGE = "fuse_attention_block.qkv_columns"


@pytest.fixture(scope="module")
def neox() -> Trace:
    return trace_of(NEOX)


def _remade(trace: Trace) -> list[tuple[int, int]]:
    """`(new, old)` for each FusedMatMulBiasAct the QKV-column stage made, with the node it re-makes."""
    k = next(k for k, s in enumerate(trace.steps) if s.pass_name == "fuse_attention_block/qkv_columns")
    after, before = trace.steps[k].after, trace.steps[k].before
    return [(n.id, n.absorbed[0]) for n in after if n.op == Op.FUSED_MATMUL_BIAS_ACT and n.id not in before]


def test_the_trace_says_who_made_what(neox):
    """The facts the words rest on: the stage emitted the node, re-making fuse_matmul_bias_act's."""
    pairs = _remade(neox)
    assert len(pairs) == 2, pairs
    for new, old in pairs:
        assert neox.final[new].pass_name == "fuse_attention_block"
        maker = next(s.after[old] for s in neox.steps if old in s.after)
        assert maker.op == Op.FUSED_MATMUL_BIAS_ACT and maker.pass_name == "fuse_matmul_bias_act"


def test_layer_line_credits_the_fusion_to_its_pass(neox):
    run = RunVerdict.of(neox)
    for (new, old), lv in zip(_remade(neox), run.layers, strict=True):
        item = f"FusedMatMulBiasAct %{new} (" + REMADE.format(maker="fuse_matmul_bias_act", what="QKV projection ",
                                                             old=old, rule=STAGE) + ")"
        assert item == f"FusedMatMulBiasAct %{new} (fuse_matmul_bias_act's QKV projection %{old}, re-made by {STAGE})"
        assert item in lv.done, lv.done
        assert not any(x.startswith("FusedMatMulBiasAct") and x.endswith("(fuse_attention_block)") for x in lv.done)
        assert item in lv.render(verbose=True).splitlines()[0]  # `-v` and the app's Why tab render it so


def test_text_and_json_say_it_alike(capsys):
    code, out, err = cli_run(capsys, "explain", NEOX, "--seq", "8")
    assert code == 0, err
    lines = [ln for ln in out.splitlines() if ln.startswith("layer ")]
    assert len(lines) == 2 and all(re.search(rf"%\d+, re-made by {re.escape(STAGE)}\)", ln) for ln in lines), lines
    assert "FusedMatMulBiasAct %231 (fuse_attention_block)" not in out
    code, got, _ = cli_run(capsys, "explain", NEOX, "--seq", "8", "--json")
    done = [x for lv in json.loads(got)["layers"] for x in lv["done"] if "re-made by" in x]
    assert len(done) == 2 and all(x in out for x in done), done
