"""`where`-based boolean attention masks (issue 10): recognized into attention(mask="keep") with equal numbers
(fully masked rows included), refused with a reason when no keep mask computes the same numbers."""

import numpy as np
import pytest

from rlxviz.ir import Builder, DType, Graph, Op
from rlxviz.passes import Pipeline
from rlxviz.passes.guard import MODEL_TERM
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions

NEG = float(np.finfo(np.float32).min)
rng = np.random.default_rng(5)
B, S, H, NH = 2, 5, 16, 2


def where_attention(fill: float = NEG, cond_shape: tuple[int, ...] = (B, 1, 1, S), scaled: bool = True,
                    chain: tuple[tuple[str, tuple[int, ...]], ...] = ()) -> Graph:
    """`chain`: ("reshape" | "expand", shape) steps applied to the `keep` input to make the where condition."""
    b = Builder("where_attention")
    x = b.input("x", (B, S, H))
    keep = b.input("keep", cond_shape, DType.bool)
    for op, shape in chain:
        keep = b.reshape(keep, shape) if op == "reshape" else b.expand(keep, shape)

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


def feeds(cond_shape=(B, 1, 1, S), rng=rng):
    keep = rng.random(cond_shape) > 0.4
    keep[0] = False  # a fully masked batch row: every query row of it is fully masked
    return {"x": rng.standard_normal((B, S, H)).astype(np.float32) * 4, "keep": keep}


def weights(g: Graph, rng=rng):
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


# Hugging Face's SDPA-path padding mask: the per-key mask [B, 1, 1, S] (or [B, S] with size-1 axes inserted)
# expanded along the query (and head) axes. It equals the per-key mask at every query position, so it fuses.
EXPANDED = {
    "b11s->b1ss": ((B, 1, 1, S), (("expand", (B, 1, S, S)),)),
    "b11s->bhss": ((B, 1, 1, S), (("expand", (B, NH, S, S)),)),
    "bs->b11s->b1ss": ((B, S), (("reshape", (B, 1, 1, S)), ("expand", (B, 1, S, S)))),
    "bs->b1s->b11s->bhss": ((B, S), (("reshape", (B, 1, S)), ("expand", (B, 1, S)), ("reshape", (B, 1, 1, S)),
                                      ("expand", (B, NH, S, S)))),
}


@pytest.mark.parametrize("form", sorted(EXPANDED))
def test_expanded_per_key_where_mask_fuses_with_equal_numbers(form):
    cond_shape, chain = EXPANDED[form]
    g = where_attention(cond_shape=cond_shape, chain=chain)
    trace = Pipeline.canonical().run(g)
    assert not [r for r in trace.rejections if r.rule == "fuse_sdpa.hf_attention" and r.headline]
    final = trace.final
    assert len([n for n in final if n.op == Op.FUSED_ATTENTION_BLOCK]) == 1
    unfused = Pipeline(["fuse_sdpa"]).run(g).final
    (att,) = [n for n in unfused if n.op == Op.ATTENTION]
    assert att.attrs["mask"] == "keep" and unfused[att.inputs[3]].shape == (B, S)
    assert not any(n.op == Op.EXPAND for n in final)  # the keep operand is the per-key source, not the expand
    base = where_attention()  # the plain per-key [B, 1, 1, S] graph: same weights' names and shapes
    plain_unfused, plain_final = Pipeline(["fuse_sdpa"]).run(base).final, Pipeline.canonical().run(base).final
    r = np.random.default_rng(11)
    w = weights(g, r)
    for _ in range(3):
        f = feeds(cond_shape, r)  # batch row 0 all False: every query row of it is fully masked
        f["keep"][1, ..., 1] = False
        f0 = {**f, "keep": f["keep"].reshape(B, 1, 1, S)}
        want = run_reference(g, f, w)[0]
        assert np.array_equal(want, run_reference(base, f0, w)[0])  # the expanded condition is the per-key mask
        assert np.isfinite(want).all()
        for version, plain in ((unfused, plain_unfused), (final, plain_final)):
            got = run_reference(version, f, w)[0]
            assert np.array_equal(got, run_reference(plain, f0, w)[0])  # what the plain mask's fusion computes
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # f32 rounding of the fused op
            for opts in (LoweringOptions(attention="composed"), LoweringOptions(attention="sdpa", fast_math=False)):
                mlx = np.asarray(MlxExecutor(opts).run(version, f, w)[0])
                assert np.array_equal(mlx, np.asarray(MlxExecutor(opts).run(plain, f0, w)[0]))
                np.testing.assert_allclose(mlx, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cond_shape, chain, fragment", [
    # a causal / arbitrary 2-D [Sq, Sk] mask, expanded over the batch: varies along the query axis
    ((S, S), (("reshape", (1, 1, S, S)), ("expand", (B, 1, S, S))), "varies along the query axis"),
    ((1, 1, S, S), (("expand", (B, NH, S, S)),), "varies along the query axis"),
    # one mask per head, expanded over queries
    ((B, NH, 1, S), (("expand", (B, NH, S, S)),), "varies along the head axis"),
    # a per-query mask [B, Sq] broadcast over keys: not one value per key
    ((B, S), (("reshape", (B, 1, S, 1)), ("expand", (B, 1, S, S))), "varies along the query axis"),
    # a per-key mask shared by the batch: not [B, Sk]
    ((1, 1, 1, S), (("expand", (B, 1, S, S)),), "not one value per batch row and key"),
    # transformers' combined causal + padding mask, as it reaches the where: [B, 1, Sq, Sk]
    ((B, 1, S, S), (), "varies along the query axis"),
])
def test_query_varying_where_mask_packs_as_an_additive_operand(cond_shape, chain, fragment):
    """A where-mask that is not one value per key (causal, causal + padding, per head) packs as attention with the
    additive operand where(cond, 0, fill), says so (the model's own term, no advice), and keeps the numbers."""
    g = where_attention(cond_shape=cond_shape, chain=chain)
    trace = Pipeline.canonical().run(g)
    (att,) = [n for n in Pipeline(["fuse_sdpa"]).run(g).final if n.op == Op.ATTENTION]
    assert att.attrs["mask"] == "additive"
    notes = [r for r in trace.rejections if r.rule == "fuse_sdpa.hf_attention"]
    assert [r.guard for r in notes] == ["where_mask_additive"]
    assert fragment in notes[0].message and f"bool{list(cond_shape)}" in notes[0].message
    assert notes[0].kind == MODEL_TERM and not notes[0].fix
    r = np.random.default_rng(3)
    w = weights(g, r)
    for _ in range(3):
        f = feeds(cond_shape, r)  # keep[0] all False: fully masked rows, uniform in both forms
        want = run_reference(g, f, w)[0]
        assert np.isfinite(want).all()
        for version in (Pipeline(["fuse_sdpa"]).run(g).final, trace.final):
            np.testing.assert_allclose(run_reference(version, f, w)[0], want, rtol=1e-5, atol=1e-5)
            for opts in (LoweringOptions(attention="composed"), LoweringOptions(attention="sdpa", fast_math=False)):
                np.testing.assert_allclose(np.asarray(MlxExecutor(opts).run(version, f, w)[0]), want,
                                           rtol=1e-4, atol=1e-4)
