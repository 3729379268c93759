"""`fuse_shared_input_matmul` is named by what it merges: `shared-input QKV matmul` only when the slices are an
attention's q, k and v, `shared-input matmul` otherwise (n4-12: a router and a shared-expert gate); and a layer's
list of fused ops names the merged matmul (the node that does the work), not its bias add, in text and --json."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clirun import run

from rlxviz.ir import Builder, Graph, Op
from rlxviz.ir.parser import parse_ir
from rlxviz.passes import Pipeline
from rlxviz.passes.rules.shared_input import QKV_PRODUCT, SHARED_PRODUCT, merged_product

CASES = Path(__file__).parent / "data" / "cases"
N412 = CASES / "n4-12-moe-soft-routing-shared-expert.rlx"
N415 = CASES / "n4-15-residual-logged.rlx"


def projections(kind: str, bias: bool) -> Graph:
    """Three projections of one `x` [1, 8, 64]: `attention` (q, k, v of a primitive attention), `mlp` (a router, a
    gate and an up projection: no attention) or `kv` (q from another input; k and v of x merged, two slices)."""
    b = Builder(f"proj_{kind}")
    x = b.input("x", (1, 8, 64))
    other = b.input("y", (1, 8, 64)) if kind == "kv" else x
    with b.scope("model.layers.0.block"):
        def proj(name: str, src: int, width: int = 64) -> int:
            y = b.matmul(src, b.param(f"{name}.weight", (64, width)))
            return b.add(y, b.param(f"{name}.bias", (width,))) if bias else y

        if kind == "mlp":
            router, gate, up = proj("router", x, 4), proj("gate", x), proj("up", x)
            out = b.add(b.mul(b.sigmoid(gate), up), b.matmul(router, b.param("mix.weight", (4, 64))))
        else:
            q, k, v = proj("q", other), proj("k", x), proj("v", x)
            p = b.softmax(b.mul(b.matmul(q, b.transpose(k, (0, 2, 1))), 0.125))
            out = b.matmul(p, v)
    b.output(out)
    return b.build()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kind, want", [("attention", QKV_PRODUCT), ("mlp", SHARED_PRODUCT), ("kv", SHARED_PRODUCT)])
def test_a_merge_is_named_by_what_its_slices_feed(kind, want, bias):
    trace = Pipeline(["fuse_shared_input_matmul"]).run(projections(kind, bias))
    step = trace.steps[0]
    assert len(step.matches) == 1, step.rejections
    m = step.matches[0]
    assert step.after[m.fused].op == Op.MATMUL  # the merged matmul, not its bias add
    assert merged_product(step.after, m.fused) == want


def test_moe_router_and_gate_merge_is_not_called_qkv(capsys):
    code, out, _ = run(capsys, "explain", N412)
    assert code == 0, out
    assert "expected: FusedSwiGLU, shared-input matmul, " in out and "QKV" not in out, out
    assert re.search(r"matmul %\d+ \(fuse_shared_input_matmul\.concat_weights\)", out), out
    code, out, _ = run(capsys, "explain", N412, "--json")
    layer = json.loads(out)["layers"][0]
    assert "shared-input matmul" in layer["expected"] and "QKV" not in layer["expected"]
    # the merged matmul is a plain op a rewrite made: listed as rewritten, not among the fusions
    merged = r"matmul %\d+ \(fuse_shared_input_matmul\.concat_weights\)"  # by the rule that made it
    assert any(re.fullmatch(merged, d) for d in layer["rewritten"]), layer


def test_attention_merge_lists_its_matmul_not_its_bias_add(capsys):
    code, out, _ = run(capsys, "explain", N415)
    assert "shared-input QKV matmul" in out, out
    assert not re.search(r"add %\d+ \(fuse_shared_input_matmul[.)]", out), out
    # the merged matmul is absorbed by the FusedAttentionBlock, so `rewritten as` (the final graph's plain ops) no
    # longer lists it (newcomer run 17); -v's line names the node the rule made: a matmul
    _, out, _ = run(capsys, "explain", N415, "-v")
    made = re.search(r"fuse_shared_input_matmul\.concat_weights: -> node\(s\) (\d+)", out)
    assert made, out
    trace = Pipeline.canonical().run(parse_ir(N415.read_text()))
    assert next(g[int(made[1])] for _, g in trace.versions() if int(made[1]) in g).op == Op.MATMUL
