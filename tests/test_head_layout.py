"""Head splits as exporters write them (`fuse_sdpa.head_layout`): read by the index map of their movement chain.
Falcon's gather of a fused QKV and a `[B, S, 3, H, d]` view are column blocks, GPT-NeoX's per-head `[q, k, v]` is
another per-token layout, K^T with S == d is no head layout at all; a broadcast K/V head becomes repeat_kv. Every
rewrite keeps the numbers bit for bit (reference); the attention packs; the graph's param values change its
pipeline cache key."""

from __future__ import annotations

import numpy as np
import pytest

from rlxviz.ir import Builder, Op
from rlxviz.passes import Pipeline
from rlxviz.passes.rules.head_layout import canonical_heads, head_split, repeat_broadcast_kv
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import run_mlx
from rlxviz.session.pipeline import graph_digest

B, S, H, D = 2, 8, 4, 8


def _attention(layout: str, kv: int = H):
    """One attention whose Q/K/V heads come from a fused QKV `[B, S, (H + 2 kv) d]` in `layout`: "falcon" (view
    `[B, S, H + 2 kv, d]`, heads axis first, gather), "five" (view `[B, S, 3, H, d]`, permute, gather of a scalar
    index), "neox" (per-head `[q, k, v]`: view `[B, S, H, 3 d]`, narrows of the last axis)."""
    b = Builder(layout)
    x = b.input("x", (B, S, 32))
    w = (H + 2 * kv) * D
    qkv = b.matmul(x, b.param("qkv.weight", (32, w)))
    if layout == "falcon":
        t = b.transpose(b.reshape(qkv, (B, S, H + 2 * kv, D)), (2, 0, 1, 3))
        q, k, v = (b.transpose(b.gather(t, b.const(tuple(range(a, a + n)), "i64")), (1, 0, 2, 3))
                   for a, n in ((0, H), (H, kv), (H + kv, kv)))
    elif layout == "five":
        t = b.transpose(b.reshape(qkv, (B, S, 3, H, D)), (2, 0, 3, 1, 4))
        q, k, v = (b.reshape(b.gather(t, b.const((i,), "i64")), (B, H, S, D)) for i in range(3))
    else:
        t = b.transpose(b.reshape(qkv, (B, S, H, 3 * D)), (0, 2, 1, 3))
        q, k, v = (b.narrow(t, 3, i * D, D) for i in range(3))
    s = b.mul(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), 1 / np.sqrt(D))
    o = b.matmul(b.softmax(s), v)
    b.output(b.reshape(b.transpose(o, (0, 2, 1, 3)), (B, S, H * D)))
    g = b.build()
    rng = np.random.default_rng(7)
    weights = {"qkv.weight": (rng.standard_normal((32, w)) / 6).astype(np.float32)}
    feeds = {"x": rng.standard_normal((B, S, 32)).astype(np.float32)}
    return g, weights, feeds


@pytest.mark.parametrize("layout, block", [("falcon", True), ("five", True), ("neox", False)])
def test_exported_head_splits_are_read_by_their_index_map(layout, block):
    g, w, feeds = _attention(layout)
    mm = [n for n in g if n.op == Op.MATMUL and n.rank == 4]
    v = g[mm[1].inputs[1]]
    hs = head_split(g, v.id)
    assert hs is not None and hs.block == block and not hs.standard
    if block:
        assert hs.start == 2 * H * D and (hs.nh, hs.d) == (H, D)
    h, matches = canonical_heads(g)
    assert len(matches) == 3  # Q, K (through its transpose) and V
    assert np.array_equal(run_reference(h, feeds, w)[0], run_reference(g, feeds, w)[0])
    t = Pipeline.canonical().run(g)
    assert any(n.op == Op.ATTENTION for n in t.final)
    np.testing.assert_allclose(np.asarray(run_mlx(t.final, feeds, w)[0]), run_reference(g, feeds, w)[0],
                               rtol=1e-5, atol=1e-5)


def test_k_transposed_with_s_equal_to_d_is_no_head_layout():
    """`transpose(k_heads, [0, 1, 3, 2])` has the heads' shape when S == d, but reads other tokens' rows."""
    g, _, _ = _attention("neox")
    kt = next(n for n in g if n.op == Op.TRANSPOSE and tuple(n.attrs["perm"]) == (0, 1, 3, 2))
    assert kt.shape == (B, H, S, D) and head_split(g, kt.id) is None


def test_one_broadcast_kv_head_becomes_repeat_kv_exactly():
    g, w, feeds = _attention("falcon", kv=1)
    lifted, _ = canonical_heads(g)
    h, matches = repeat_broadcast_kv(lifted)
    assert len(matches) == 2 and sum(n.op == Op.EXPAND for n in h) == 2  # the scores and P @ V
    assert np.array_equal(run_reference(h, feeds, w)[0], run_reference(g, feeds, w)[0])
    t = Pipeline.canonical().run(g)
    (a,) = [n for n in t.final if n.op == Op.ATTENTION]
    assert a.attrs["num_kv_heads"] == 1


def test_the_values_a_graph_carries_are_part_of_its_cache_key():
    g, w, _ = _attention("falcon")
    same = g.with_values(w)
    other = g.with_values({"qkv.weight": w["qkv.weight"] + 1})
    assert len({graph_digest(g), graph_digest(same), graph_digest(other)}) == 3
    assert graph_digest(same) == graph_digest(g.with_values(dict(w)))


@pytest.mark.parametrize("n_rot", [D, D // 2])
def test_rope_on_gpt_neox_per_head_qkv_is_rewritten_for_q_at_offset_zero_too(n_rot):
    """GPT-NeoX's Q is `narrow(heads, -1, 0, d)` of the per-head `[q, k, v]`: with full rotary no concat completes
    it, and it is the heads themselves (not a partial rotary of wider heads); both Q and K are rewritten."""
    from rlxviz.passes.rules.rope_heads import rope_heads

    b = Builder("neox_rope")
    x = b.input("x", (B, S, 32))
    t = b.transpose(b.reshape(b.matmul(x, b.param("qkv.weight", (32, 3 * H * D))), (B, S, H, 3 * D)), (0, 2, 1, 3))
    tabs = [b.param(f"rotary.{n}", (1, 1, S, n_rot)) for n in ("cos", "sin")]

    def rot(h: int) -> int:
        part = h if n_rot == D else b.narrow(h, 3, 0, n_rot)
        half = n_rot // 2
        r = b.concat([b.neg(b.narrow(part, 3, half, half)), b.narrow(part, 3, 0, half)], 3)
        out = b.add(b.mul(part, tabs[0]), b.mul(r, tabs[1]))
        return out if n_rot == D else b.concat([out, b.narrow(h, 3, n_rot, D - n_rot)], 3)

    q, k, v = (b.narrow(t, 3, i * D, D) for i in range(3))
    s = b.mul(b.matmul(rot(q), b.transpose(rot(k), (0, 1, 3, 2))), 1 / np.sqrt(D))
    b.output(b.reshape(b.transpose(b.matmul(b.softmax(s), v), (0, 2, 1, 3)), (B, S, H * D)))
    ang = np.arange(S, dtype=np.float32)[:, None] * np.linspace(0.1, 1, n_rot // 2, dtype=np.float32)
    vals = {"rotary.cos": np.cos(np.concatenate([ang, ang], -1))[None, None],
            "rotary.sin": np.sin(np.concatenate([ang, ang], -1))[None, None]}
    g = b.build().with_values(vals)
    rng = np.random.default_rng(2)
    w = {"qkv.weight": (rng.standard_normal((32, 3 * H * D)) / 6).astype(np.float32), **vals}
    feeds = {"x": rng.standard_normal((B, S, 32)).astype(np.float32)}
    h, matches = rope_heads(g)
    assert len(matches) == 2
    assert np.array_equal(run_reference(h, feeds, w)[0], run_reference(g, feeds, w)[0])
    assert any(n.op == Op.ATTENTION for n in Pipeline.canonical().run(g).final)
