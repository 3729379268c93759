"""Grouped-query attention (issue 10, case 07): HF repeat_kv is recognized into attention(num_kv_heads), K/V
expanded any other way is refused naming the expansion, and the GQA block fuses with equal numbers."""

from pathlib import Path

import numpy as np
import pytest

from rlxviz.ir import Builder, DType, Graph, Op, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions

CASES = Path(__file__).parent / "data" / "cases"
rng = np.random.default_rng(7)


def weights_for(g: Graph) -> dict[str, np.ndarray]:
    return {p.attrs["name"]: (rng.standard_normal(p.shape) * 0.3).astype(np.float32) for p in g.params}


def same_numbers(before: Graph, after: Graph, feeds: dict, weights: dict, mlx: bool = True) -> None:
    want = run_reference(before, feeds, weights)
    got = run_reference(after, feeds, weights)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    if mlx:
        for opts in (LoweringOptions(attention="sdpa", fast_math=False), LoweringOptions(attention="composed")):
            for w, g in zip(want, MlxExecutor(opts).run(after, feeds, weights), strict=True):
                np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4)


def test_case_07_gqa_from_fused_qkv_becomes_grouped_query_attention():
    g = parse_ir((CASES / "07-gqa-fused-qkv.rlx").read_text())
    trace = Pipeline.canonical().run(g)
    (att,) = [n for n in trace.final if n.op == Op.ATTENTION]
    assert (att.attrs["num_heads"], att.attrs["num_kv_heads"], att.attrs["head_dim"]) == (4, 2, 16)
    k = trace.final[att.inputs[1]]
    assert k.op == Op.NARROW and k.shape == (2, 8, 32)  # the 2 kv heads, not the 4-head expansion
    assert not any(n.op == Op.EXPAND for n in trace.final)
    w = weights_for(g)
    for x in (rng.standard_normal((2, 8, 64)), rng.standard_normal((2, 8, 64)) * 30):
        same_numbers(g, trace.final, {"x": x.astype(np.float32)}, w)


def gqa_graph(*, expand: str = "repeat_kv", heads: int = 4, kv: int = 2, d: int = 8, s: int = 6, b: int = 2,
              biased_mask_block: bool = False) -> Graph:
    """Separate-or-fused GQA attention as HF writes it; `expand="tile"` repeats K/V with `repeat(1, n, 1, 1)`."""
    n = heads // kv
    bld = Builder(f"gqa_{expand}")
    hid = heads * d
    x = bld.input("x", (b, s, hid))
    if biased_mask_block:
        m = bld.input("attention_mask", (b, s), DType.i64)
        ext = bld.reshape(bld.mul(bld.sub(1.0, bld.cast(m, DType.f32)), float(np.finfo(np.float32).min)),
                          (b, 1, 1, s))
    width = (heads + 2 * kv) * d
    qkv = bld.add(bld.matmul(x, bld.param("qkv.weight", (hid, width))), bld.param("qkv.bias", (width,)))
    q = bld.narrow(qkv, 2, 0, hid)
    k = bld.narrow(qkv, 2, hid, kv * d)
    v = bld.narrow(qkv, 2, hid + kv * d, kv * d)

    def split(t, nh):
        return bld.transpose(bld.reshape(t, (b, s, nh, d)), (0, 2, 1, 3))

    def rep(t):
        if expand == "repeat_kv":
            return bld.reshape(bld.expand(bld.reshape(t, (b, kv, 1, s, d)), (b, kv, n, s, d)), (b, heads, s, d))
        return bld.reshape(bld.expand(bld.reshape(t, (b, 1, kv, s, d)), (b, n, kv, s, d)), (b, heads, s, d))

    qh, kh, vh = split(q, heads), rep(split(k, kv)), rep(split(v, kv))
    scores = bld.div(bld.matmul(qh, bld.transpose(kh, (0, 1, 3, 2))), float(np.sqrt(d)))
    if biased_mask_block:
        scores = bld.add(scores, ext)
    ctx = bld.reshape(bld.transpose(bld.matmul(bld.softmax(scores, -1), vh), (0, 2, 1, 3)), (b, s, hid))
    out = bld.add(bld.matmul(ctx, bld.param("o.weight", (hid, hid))), bld.param("o.bias", (hid,)))
    bld.output(out)
    return bld.build()


@pytest.mark.parametrize("heads, kv", [(4, 2), (6, 3), (8, 1)])
def test_gqa_attention_block_fuses_with_equal_numbers(heads, kv):
    g = gqa_graph(heads=heads, kv=kv, biased_mask_block=True)
    final = Pipeline.canonical().run(g).final
    (fab,) = [n for n in final if n.op == Op.FUSED_ATTENTION_BLOCK]
    assert fab.attrs["num_kv_heads"] == kv and fab.attrs["num_heads"] == heads
    feeds = {"x": rng.standard_normal((2, 6, heads * 8)).astype(np.float32),
             "attention_mask": np.array([[1] * 6, [1] * 4 + [0] * 2], np.int64)}
    same_numbers(g, final, feeds, weights_for(g))


def test_tiled_kv_expansion_is_refused_naming_the_expansion():
    g = gqa_graph(expand="tile")
    trace = Pipeline.canonical().run(g)
    assert not any(n.op == Op.ATTENTION for n in trace.final)
    (rej,) = [r for r in trace.rejections if r.rule == "fuse_sdpa.hf_attention" and r.headline]
    assert rej.guard == "kv_repeat_form"
    assert "K heads [2, 2, 6, 8] are expanded to [2, 4, 6, 8]" in rej.message and "repeat_kv" in rej.message
    w = weights_for(g)
    same_numbers(g, trace.final, {"x": rng.standard_normal((2, 6, 32)).astype(np.float32)}, w, mlx=False)


DIAG = Path(__file__).parent / "data" / "diag"


def test_mqa_tile_expansion_of_one_kv_head_fuses_as_num_kv_heads_1():
    """With one kv head, tile == repeat_kv (every query head reads kv head 0): 07g and the builder's tile fuse."""
    g = parse_ir((DIAG / "07g-mqa-tile.rlx").read_text())
    trace = Pipeline.canonical().run(g)
    (att,) = trace.final.find(Op.ATTENTION)
    assert (att.attrs["num_heads"], att.attrs["num_kv_heads"]) == (4, 1)
    assert not trace.rejections or all(r.guard not in ("kv_repeat_form", "heads_consistent") for r in trace.rejections)
    same_numbers(g, trace.final, {"x": rng.standard_normal((2, 8, 64)).astype(np.float32)}, weights_for(g))
    g = gqa_graph(expand="tile", heads=4, kv=1, biased_mask_block=True)
    final = Pipeline.canonical().run(g).final
    (fab,) = final.find(Op.FUSED_ATTENTION_BLOCK)
    assert fab.attrs["num_kv_heads"] == 1 and fab.attrs["num_heads"] == 4
    feeds = {"x": rng.standard_normal((2, 6, 32)).astype(np.float32),
             "attention_mask": np.array([[1] * 6, [1] * 4 + [0] * 2], np.int64)}
    same_numbers(g, final, feeds, weights_for(g))


def test_gqa_tile_of_two_kv_heads_is_still_refused():
    g = parse_ir((DIAG / "07c-gqa-tile-expand.rlx").read_text())
    trace = Pipeline.canonical().run(g)
    assert not trace.final.find(Op.ATTENTION)
    (rej,) = [r for r in trace.rejections if r.rule == "fuse_sdpa.hf_attention" and r.headline]
    assert rej.guard == "kv_repeat_form" and "[2, 1, 2, 8, 16] -> [2, 2, 2, 8, 16]" in rej.message


def test_heads_consistent_names_only_the_failing_condition():
    from test_guards import _sdpa

    from rlxviz.passes.engine import find
    from rlxviz.passes.pipeline import PASSES
    g, _ = _sdpa(wide_v=True)
    _, rejections = find(g, "fuse_sdpa", PASSES["fuse_sdpa"].rules, Pipeline.canonical().effective_params)
    (r,) = [r for r in rejections if r.guard == "heads_consistent"]
    assert "head_dim differs" in r.message and "q heads" not in r.message.split("(needs")[0]


def test_mha_split_guard_uses_the_kv_width():
    """A GQA attention whose fused QKV is split MHA-style (0/H/2H) is refused by qkv_split with GQA lengths."""
    b = Builder("gqa_bad_split")
    x, m = b.input("x", (1, 4, 16)), b.input("mask", (1, 4))
    qkv = b.fused_matmul_bias_act(x, b.param("w", (16, 32)), b.param("bias", (32,)))
    q, k, v = b.narrow(qkv, 2, 0, 16), b.narrow(qkv, 2, 16, 8), b.narrow(qkv, 2, 16, 8)
    att = b.attention(q, k, v, m, num_heads=4, head_dim=4, mask_kind="keep", num_kv_heads=2)
    b.output(b.fused_matmul_bias_act(att, b.param("o", (16, 16)), b.param("ob", (16,))))
    trace = Pipeline(["fuse_attention_block"]).run(b.build())
    (rej,) = trace.rejections
    assert rej.guard == "qkv_split" and "needs starts 0/16/24 with lengths 16/8/8 (grouped-query)" in rej.message
