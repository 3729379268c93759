"""`where`-based boolean attention masks (issue 10): recognized into attention(mask="keep") with equal numbers
(fully masked rows included), refused with a reason when no keep mask computes the same numbers."""

import numpy as np
import pytest

from rlxviz.ir import Builder, DType, Graph, Op
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions

NEG = float(np.finfo(np.float32).min)
rng = np.random.default_rng(5)
B, S, H, NH = 2, 5, 16, 2


def where_attention(fill: float = NEG, cond_shape: tuple[int, ...] = (B, 1, 1, S), scaled: bool = True) -> Graph:
    b = Builder("where_attention")
    x = b.input("x", (B, S, H))
    keep = b.input("keep", cond_shape, DType.bool)

    def heads(name: str):
        t = b.linear(x, b.param(f"{name}.weight", (H, H)), b.param(f"{name}.bias", (H,)))
        return b.transpose(b.reshape(t, (B, S, NH, H // NH)), (0, 2, 1, 3))

    q, k, v = heads("q"), heads("k"), heads("v")
    s = b.matmul(q, b.transpose(k, (0, 1, 3, 2)))
    if scaled:
        s = b.div(s, float(np.sqrt(H // NH)))
    p = b.softmax(b.where(keep, s, fill), -1)
    ctx = b.reshape(b.transpose(b.matmul(p, v), (0, 2, 1, 3)), (B, S, H))
    b.output(b.linear(ctx, b.param("o.weight", (H, H)), b.param("o.bias", (H,))))
    return b.build()


def feeds(cond_shape=(B, 1, 1, S)):
    keep = rng.random(cond_shape) > 0.4
    keep[0] = False  # a fully masked batch row: every query row of it is fully masked
    return {"x": rng.standard_normal((B, S, H)).astype(np.float32) * 4, "keep": keep}


def weights(g: Graph):
    return {p.attrs["name"]: rng.standard_normal(p.shape).astype(np.float32) * 0.5 for p in g.params}


def test_where_mask_becomes_a_keep_mask_with_equal_numbers():
    g = where_attention()
    final = Pipeline.canonical().run(g).final
    fab = [n for n in final if n.op == Op.FUSED_ATTENTION_BLOCK]
    assert len(fab) == 1  # the keep mask lets the whole block fuse
    unfused = Pipeline(["fuse_sdpa"]).run(g).final
    (att,) = [n for n in unfused if n.op == Op.ATTENTION]
    assert att.attrs["mask"] == "keep"
    w = weights(g)
    for _ in range(3):
        f = feeds()
        want = run_reference(g, f, w)[0]
        for version in (unfused, final):
            np.testing.assert_allclose(run_reference(version, f, w)[0], want, rtol=1e-5, atol=1e-5)
        for opts in (LoweringOptions(attention="composed"), LoweringOptions(attention="sdpa", fast_math=False)):
            np.testing.assert_allclose(np.asarray(MlxExecutor(opts).run(final, f, w)[0]), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fill, cond_shape, guard, fragment", [
    (-1e9, (B, 1, 1, S), "where_mask_fill", "the where fill"),
    (float("-inf"), (B, 1, 1, S), "where_mask_fill", "-inf"),
    (NEG, (1, 1, S, S), "where_mask_per_key", "one value per key"),
])
def test_where_mask_refused_with_reason(fill, cond_shape, guard, fragment):
    g = where_attention(fill, cond_shape)
    trace = Pipeline.canonical().run(g)
    assert not any(n.op == Op.ATTENTION for n in trace.final)
    (rej,) = [r for r in trace.rejections if r.rule == "fuse_sdpa.hf_attention" and r.headline]
    assert rej.guard == guard and fragment in rej.message
    f, w = feeds(cond_shape), weights(g)
    f["keep"][..., 0] = True  # finite reference numbers for the -inf fill
    np.testing.assert_allclose(run_reference(trace.final, f, w)[0], run_reference(g, f, w)[0], rtol=1e-5, atol=1e-5)
