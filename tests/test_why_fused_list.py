"""Issue 39, advice 2: a layer's "fused as expected" / "fused as far as legal" list names fused ops only.

A plain op a rewrite made (the packed `attention`, a merged QKV `matmul` or `add`, a canonicalization's `transpose`,
`where` or `gelu`) is no fusion: the verdict lists it as "rewritten as", by the rule the app's decision rows use
(`ir.ops.made_as`), so `explain`'s text, its `--json`, the app's Why tab (the same text) and the decision table give
one answer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlxviz.app.explain import decision_rows
from rlxviz.cli import main
from rlxviz.ir.ops import FUSED, FUSED_INTO, REWRITTEN_AS, Op, made_as
from rlxviz.passes import Pipeline
from rlxviz.session import check_fusion, load

TESTS = Path(__file__).parent
MODELS = {
    "llama-block": "llama-block",  # FusedSwiGLU, and the merged QKV matmul
    "rope-control": str(next((TESTS / "data" / "cases").glob("n3-01c-*.rlx"))),  # attention, matmul, the block
    "residual-logged": str(next((TESTS / "data" / "cases").glob("n4-15-*.rlx"))),  # fused as far as legal
    "vit-onnx": str(TESTS / "fixtures" / "onnx" / "vit.onnx"),  # gelu, attention, add from the exporter's forms
}
_ITEM = re.compile(r"^(\S+) (?:%\d+|x\d+) \(")


def _ops(items: list[str]) -> list[str]:
    return [m[1] for x in items if (m := _ITEM.match(x)) is not None]


def test_made_as_is_the_fused_op_table():
    for op in Op:
        assert made_as(op) == (FUSED_INTO if op in FUSED else REWRITTEN_AS)
    assert made_as(Op.TRANSPOSE) == made_as(Op.MUL) == made_as(Op.ATTENTION) == REWRITTEN_AS
    assert made_as(Op.FUSED_MATMUL_BIAS_ACT) == made_as(Op.FUSED_TRANSFORMER_LAYER) == FUSED_INTO


@pytest.mark.parametrize("name", MODELS)
def test_fused_list_holds_fused_ops_and_rewrites_are_named_apart(name, capsys):
    m = load(MODELS[name], seq=8)
    trace = Pipeline.canonical().run(m.graph)
    check = check_fusion(trace, name)
    lv = check.layers[0]
    assert lv.done or lv.rewritten
    assert all(Op(op) in FUSED for op in _ops(lv.done)), lv.done
    # what the final graph holds only (newcomer run 17): a rewrite a later fusion absorbed is said by that fusion
    assert all(Op(op) not in FUSED for op in _ops(lv.rewritten)), lv.rewritten
    assert all(int(i) in trace.final for x in lv.rewritten for i in re.findall(r"%(\d+)", x)), lv.rewritten
    # the decision table says the same of each node: "fused into" for a listed fusion, "rewritten as" for a rewrite
    said = {int(r["message"].split("%")[1].split(",")[0]): r["message"].split(" ")[0] + " " + r["message"].split(" ")[1]
            for r in decision_rows(trace) if r["kind"] == "fused" and "%" in r["message"]}
    for items, word in ((lv.done, FUSED_INTO), (lv.rewritten, REWRITTEN_AS)):
        for x in items:
            if (ids := re.match(r"^\S+ %(\d+) ", x)) is not None:
                assert said[int(ids[1])] == word, (x, said[int(ids[1])])
    text = lv.render()
    head, second = text.splitlines()[:2]
    assert "fused as" in head and not any(f"{op} %" in head for op in _ops(lv.rewritten)), head
    if lv.rewritten:
        assert second.startswith(f"  {REWRITTEN_AS}: ") and all(f"{op} " in second for op in _ops(lv.rewritten))
    else:
        assert not second.startswith(f"  {REWRITTEN_AS}: "), second
    code = main(["explain", MODELS[name], "--seq", "8", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0, d
    (jl,) = [x for x in d["layers"] if x["layer"] == int(lv.layer)]
    assert jl["done"] == lv.done and jl["rewritten"] == lv.rewritten
