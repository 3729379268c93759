"""A product a later rewrite re-made keeps its credit, whatever its op (newcomer finding on GPT-J, CodeGen, Cohere).

GPT-J's layer 0 expects a "shared-input QKV matmul", and `fuse_shared_input_matmul.concat_weights` made it (%214);
`fuse_attention_block.qkv_columns` then re-made it as matmul %227 with its weight's columns in Q/K/V order, and the
layer line credited it nowhere: `side_products` said only the fused ops a rewrite made beside its product (gpt-neox's
FusedMatMulBiasAct, `test_remade_credit`), so a plain op (the merged matmul, `fuse_sdpa`'s ropes) dropped out of
the text, `-v` and `--json`. The app's search said "%214: absorbed into matmul %227 (layer 0) directly and via matmul
%214", naming the searched node as its own path. Decision: one rule says which node re-makes an earlier product
(`passes.made.remade_in_run`), and every view words it from there: the layer line with `facts.REMADE`, the search
as "re-made as matmul %227 (layer 0) by <rule>", the inspector's "replacing %214 (<pass>'s <role>)".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run as cli_run
from test_near_miss_rule import trace_of

from rlxviz.app.explain import node_report, report_markdown
from rlxviz.app.graphpane import absorbed_index
from rlxviz.ir import Op
from rlxviz.passes.explain import side_products
from rlxviz.passes.made import remade_in_run
from rlxviz.passes.trace import Trace, layer_of
from rlxviz.passes.why.facts import REMADE
from rlxviz.passes.why.verdict import RunVerdict

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
STAGE = "fuse_attention_block.qkv_columns"
_TRACES: dict[str, Trace] = {}


def _trace(stem: str) -> Trace:
    if stem not in _TRACES:
        _TRACES[stem] = trace_of(ZOO / f"{stem}.dynamo-eager.onnx")
    return _TRACES[stem]


def _stage_made(trace: Trace) -> list[tuple[int, int]]:
    """`(new, old)` for each node the QKV-column stage made whose own list is one node of its op that an earlier
    match made: the facts, read from the trace without `remade_in_run`."""
    products = {m.fused for m in trace.matches if m.fused is not None}
    k = next(k for k, s in enumerate(trace.steps) if s.pass_name == "fuse_attention_block/qkv_columns")
    s = trace.steps[k]
    return [(n.id, n.absorbed[0]) for n in s.after if n.id not in s.before and len(n.absorbed) == 1
            and n.absorbed[0] in products and s.before[n.absorbed[0]].op == n.op]


@pytest.mark.parametrize("stem, merged", [("gptj", True), ("cohere", True), ("codegen", False)])
def test_every_remade_product_is_credited_to_its_maker(stem, merged):
    """The layer's line (`rewritten`), `-v`'s `->` and the rule's facts agree on every re-made product: gptj's and
    cohere's merged Q/K/V matmul and each model's ropes. CodeGen's matmul re-makes the model's own qkv_proj (no
    product), so nothing credits it to a pass."""
    trace = _trace(stem)
    pairs = _stage_made(trace)
    remade = remade_in_run(trace)
    assert {(r.new, r.old) for r in remade.values()} == set(pairs), (remade, pairs)
    ops = {trace.final[new].op for new, _ in pairs}
    assert ops == ({Op.MATMUL, Op.ROPE} if merged else {Op.ROPE}), ops
    run = RunVerdict.of(trace)
    beside = [i for ids in side_products(trace).values() for i in ids]
    for new, old in pairs:
        r = remade[new]
        maker = "fuse_shared_input_matmul" if trace.final[new].op == Op.MATMUL else "fuse_sdpa"
        what = "QKV projection " if r.role == "qkv" else f"{r.role} "
        item = f"{trace.final[new].op.value} %{new} (" + REMADE.format(maker=maker, what=what, old=old,
                                                                      rule=STAGE) + ")"
        lv = next(v for v in run.layers if v.layer == layer_of(trace.final[new].path))
        assert item in lv.rewritten, (item, lv.rewritten)
        assert item in lv.render(verbose=True), item  # `-v` and the app's Why tab render it so
        assert new in beside  # `-v`'s `qkv_columns: -> node(s) 233, 227, ...`


def test_gptj_merged_projection_words():
    """The words the finding asked for, on the node it named."""
    trace = _trace("gptj")
    line = RunVerdict.of(trace).layers[0].render(verbose=False)
    assert ("matmul %227 (fuse_shared_input_matmul's QKV projection %214, re-made by "
            "fuse_attention_block.qkv_columns)") in line, line


def test_text_json_and_verbose_say_it_alike(capsys):
    """`explain`, `--json`'s `rewritten` and `-v` carry the same re-made items."""
    path = ZOO / "gptj.dynamo-eager.onnx"
    code, out, err = cli_run(capsys, "explain", path)
    assert code == 0, err
    code, got, _ = cli_run(capsys, "explain", path, "--json")
    items = [x for lv in json.loads(got)["layers"] for x in lv["rewritten"] if "re-made by" in x]
    assert len(items) == 6 and all(x in out for x in items), items  # a matmul and two ropes per layer
    assert any(x.startswith("matmul %227 (fuse_shared_input_matmul's QKV projection %214") for x in items), items
    code, verbose, _ = cli_run(capsys, "explain", path, "-v")
    assert "fuse_attention_block.qkv_columns: -> node(s) 233, 227, 229, 231" in verbose


def test_search_says_re_made_not_via_itself():
    """The app's search on %214: "re-made as matmul %227 (layer 0) by ...", never "via matmul %214"; the nodes
    %214 itself absorbed (the q/k/v projections) are still found through it."""
    trace = _trace("gptj")
    rows = absorbed_index(trace.final, trace)["n227"]
    mine = [r for r in rows if 214 in r[1]]
    assert mine == [["matmul", [214], f"re-made as matmul %227 (layer 0) by {STAGE}"]], rows
    deeper = [r for r in rows if r[1] != [214] and r[0] == "matmul"]
    assert deeper and all(r[2] == "absorbed into matmul %227 (layer 0) via matmul %214" for r in deeper), rows


def test_inspector_says_what_the_replaced_node_was():
    trace = _trace("gptj")
    text = report_markdown(node_report(trace.final, 227, trace))
    assert r"replacing %214 (fuse\_shared\_input\_matmul's QKV projection)" in text, text
    rope = report_markdown(node_report(trace.final, 229, trace))
    assert r"replacing %199 (fuse\_sdpa's q\_rope)" in rope, rope
