"""The nodes a rewrite makes around its product absorb nothing (a newcomer run: after `fuse_shared_input_matmul`
both weight `concat`s were labelled "absorbed 6 node(s): matmul x3, add x3", the merge's whole list). Only the
merged matmul (`Match.fused`) records the match's nodes; the merged bias add the bias adds it re-makes; the weight
and bias concats, the zero slots and the narrows none (`Rewriter.absorbing`). Set on the node, so the after pane's
labels and tooltips, the IR text and `--json` agree; the same for `fuse_swiglu`'s weight concat. The labels count
what each node replaced itself (`passes.made.replaced`, issue 39): the matmul its matmuls, the bias add its adds."""

from __future__ import annotations

import json
import re

from test_app_views import tiny
from test_shared_input_naming import projections

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.ir import Op, format_graph
from rlxviz.ir.serialize import graph_to_dict


def _after(s, pass_name: str):
    s.step_to(f"after {pass_name}")
    step = s.current_step
    assert step is not None and step.matches, pass_name
    return step, s.current_graph


def test_only_the_merged_matmul_absorbs_the_shared_input_merge():
    # Q/K/V with biases (a BERT's): one matmul over a weight concat, one bias add of a bias concat, three narrows
    s = AppState(runner=Runner(background=False), source="ir", ir_text=format_graph(projections("attention", True)))
    step, g = _after(s, "fuse_shared_input_matmul")
    made = [n for n in g if n.pass_name == "fuse_shared_input_matmul"]
    concats = [n for n in made if n.op == Op.CONCAT]
    assert len(concats) == 2 * len(step.matches), [n.op for n in made]
    for m in step.matches:
        merged = g[m.fused]
        assert merged.op == Op.MATMUL and len(merged.absorbed) == 6
        assert {step.before[i].op for i in merged.absorbed} == {Op.MATMUL, Op.ADD}
        bias_add = next(u for u in g.users(merged.id) if u.op == Op.ADD)
        assert [step.before[i].op for i in bias_add.absorbed] == [Op.ADD] * 3
    assert all(not n.absorbed for n in made if n.op not in (Op.MATMUL, Op.ADD)), \
        [(n.op, n.absorbed) for n in made if n.absorbed]
    # the after pane: the merged matmul's label counts the matmuls it replaced, the bias add's the adds (each node
    # what it replaced itself, `passes.made.replaced`, as the inspector names them), no concat's
    svg = s.svg()
    assert svg.count("absorbed 3 node(s): matmul×3") == len(step.matches), svg.count("absorbed 3 node(s): matmul×3")
    assert svg.count("absorbed 3 node(s): add×3") == len(step.matches), svg.count("absorbed 3 node(s): add×3")
    assert len(re.findall(r"absorbed \d+ node\(s\)", svg)) == 2 * len(step.matches)
    text = format_graph(g)  # the IR text: `<- %ids` only on the matmul and the bias add
    for n in concats:
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"%{n.id} = concat"))
        assert "<-" not in line, line
    nodes = {d["id"]: d for d in json.loads(json.dumps(graph_to_dict(g)))["nodes"]}
    assert all(nodes[n.id]["absorbed"] == [] for n in concats)


def test_swiglus_weight_concat_absorbs_nothing():
    s = tiny(preset="llama-block")
    step, g = _after(s, "fuse_swiglu")
    made = [n for n in g if n.pass_name == "fuse_swiglu"]
    assert [n.absorbed for n in made if n.op == Op.CONCAT] == [()]
    fused = g[step.matches[0].fused]
    assert fused.op == Op.FUSED_SWIGLU and len(fused.absorbed) == 4
