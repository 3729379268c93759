"""A node a rewrite re-made beside its product keeps its ONNX origins after a later pass absorbs it (newcomer run 38).

qwen2-moe's `fuse_swiglu.viewed_dual_matmul` re-makes the shared expert's gate and up projections as one matmul
(%328) beside its FusedSwiGLU (%329); `fuse_shared_input_matmul` then merges %328 with the router and the expert
gate into matmul %345. From that version on, the inspector listed the gate/up Gemms under FusedSwiGLU %329 (whose
record still names the two matmuls) and left them out of %345, while the search said they were in %345.

Decision (`passes.made.replaced`, `remade_beside`): what a node a match made beside a product replaced stays its for
good: the product never replaced it, in any later version, and the walk of whatever absorbed the re-made node reaches
it (`app.onnxorigin.onnx_claims` counts a node as another's only where that node replaced it). Checked here on both
qwen2-moe exports, and, over every version of a few zoo exports, that each live node's inspector lists the ONNX node
of every imported node the search says it holds (`app.graphpane.absorbed_index`), and claims only those.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from rlxviz import session
from rlxviz.app.explain import node_report, report_markdown
from rlxviz.app.graphpane import absorbed_index
from rlxviz.app.onnxorigin import onnx_claims
from rlxviz.ir import Op
from rlxviz.passes import Pipeline
from rlxviz.passes.made import credit, holders, made_in_run, replaced
from rlxviz.passes.trace import Trace
from rlxviz.viz.overlay import all_versions

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
QWEN_MOE = ["qwen2-moe.dynamo-sdpa", "qwen2-moe.dynamo-eager"]
SWEPT = [*QWEN_MOE, "glm.dynamo-eager", "falcon.dynamo-sdpa", "bert.dynamo-sdpa"]


@cache
def _run(name: str) -> tuple[dict[int, tuple[str, str, str]], Trace]:
    m = session.load(str(ZOO / f"{name}.onnx"), 1, 8)
    return m.meta["onnx_nodes"], Pipeline.canonical().run(m.graph)


def _onnx_line(text: str) -> str:
    return next(x for x in text.splitlines() if "ONNX node" in x)


@pytest.mark.parametrize("name", QWEN_MOE)
def test_the_merged_matmul_names_the_shared_gate_up_gemms_and_swiglu_does_not(name):
    onnx, t = _run(name)
    every, made = all_versions(t), made_in_run(t)
    g = t.final
    held = holders(g, made, every)
    products = {m.fused for s in t.steps for m in s.matches if m.rule == "fuse_swiglu.viewed_dual_matmul"}
    checked = 0
    for sw in (g[i] for i in products if i in g):
        remade = next(i for i, b in made.items() if b.product == sw.id and every[i].op == Op.MATMUL
                      and every[i].absorbed != sw.absorbed)
        gemms = every[remade].absorbed  # the gate and up projections' matmuls, imported from two Gemms
        assert len(gemms) == 2 and all(onnx[i][0] == "Gemm" for i in gemms), [onnx.get(i) for i in gemms]
        assert remade not in g  # the version this is about: a later pass absorbed the re-made matmul
        merged = g[held[remade]]
        assert merged.op == Op.MATMUL and merged.pass_name == "fuse_shared_input_matmul", merged
        names = [onnx[i][1] for i in gemms]

        # FusedSwiGLU never replaced them: its count, its claims, its ONNX line, its credit
        assert not set(gemms) & set(replaced(sw, g, made, every))
        assert not set(gemms) & onnx_claims(sw, onnx, every, g, made)
        said_sw = report_markdown(node_report(g, sw.id, t, None, onnx))
        line = _onnx_line(said_sw)
        for gemm, nm in zip(gemms, names, strict=True):  # only each Gemm's reshape, said in part
            assert f"{nm}</code> (Gemm, in part: its reshape, not its matmul %{gemm})" in line.replace("\\", ""), line
        cr = credit(sw, g, made, every)
        assert {i: cr.remade.get(i) for i in gemms} == dict.fromkeys(gemms, remade) and not set(gemms) & set(
            cr.replaced), cr

        # the merged matmul computes them: it claims them, and its line names them
        assert set(gemms) <= onnx_claims(merged, onnx, every, g, made)
        rep = node_report(g, merged.id, t, None, onnx)
        assert set(names) <= {nm for _, nm in rep["onnx"]}, rep["onnx"]
        line = _onnx_line(report_markdown(rep)).replace("\\", "")
        for nm in names:  # the importer's other IR node of the Gemm, its reshape: FusedSwiGLU's
            view = next(i for i, (_, n2, _) in onnx.items() if n2 == nm and every[i].op == Op.RESHAPE)
            assert f"{nm}</code> (Gemm, in part: its matmul, not its reshape %{view})" in line, line
        # and the search says so: the merged matmul holds them, FusedSwiGLU does not
        index = absorbed_index(g, t)
        assert set(gemms) <= {i for _, ids, _ in index[f"n{merged.id}"] for i in ids}
        assert not set(gemms) & {i for _, ids, _ in index.get(f"n{sw.id}", []) for i in ids}
        checked += 1
    assert checked == 2, (name, products)


@pytest.mark.parametrize("name", SWEPT)
def test_every_onnx_node_the_search_finds_in_a_node_its_inspector_lists(name):
    """In every version: the ONNX nodes of the imported nodes the search index says a live node holds (at any depth,
    less those still live: they name themselves) are the ones its inspector lists (`onnx_claims`); its claims are
    among what the search says it holds."""
    onnx, t = _run(name)
    seen: set[str] = set()
    for k, s in enumerate(t.steps):
        g = s.after
        if g.digest in seen:
            continue
        seen.add(g.digest)
        index = absorbed_index(g, t)
        every, made = all_versions(t), made_in_run(t)
        for n in g:
            held = {i for _, ids, _ in index.get(f"n{n.id}", []) for i in ids if isinstance(i, int)}
            claims = onnx_claims(n, onnx, every, g, made)
            assert claims <= held | {n.id}, (name, s.pass_name, k, n.id, sorted(claims - held))
            found = {onnx[i][1] for i in held if i in onnx and i not in g and onnx[i][1]}
            listed = {nm for _, nm in node_report(g, n.id, t, None, onnx)["onnx"]}
            assert found <= listed, (name, s.pass_name, k, f"{n.op.value} %{n.id}", sorted(found - listed))
