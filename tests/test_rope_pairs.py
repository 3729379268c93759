"""Interleaved RoPE (GPT-J's rotate_every_two) -> `rope(interleaved=True)` (`fuse_sdpa.rope_pairs`): hand-built
attentions over head dims, rotary fractions, GQA, both head layouts (rotated before the head transpose as GPT-J, or
after it) and two spellings of rotate_every_two (pairs view + narrow + concat, and the exporter's gather of a
transposed view): the rewrite is bit-exact on the reference, the attention packs, MLX gives the same numbers; a
table whose neighbours differ is refused with the entry, a table whose values are unknown is named."""

from __future__ import annotations

import numpy as np
import pytest

from rlxviz.ir import Builder, Graph, Op
from rlxviz.passes import Pipeline
from rlxviz.passes.rules.rope_pairs import RULE, rope_pairs
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import run_mlx

B, S = 2, 8


def _every_two(b: Builder, h: int, shape: tuple[int, ...], spelling: str) -> int:
    """rotate_every_two(h) on the last axis of `shape`: out[2i] = -h[2i+1], out[2i+1] = h[2i]."""
    *lead, r = shape
    if spelling == "pairs":
        p = b.reshape(h, (*lead, r // 2, 2))
        x1, x2 = b.narrow(p, len(lead) + 1, 0, 1), b.narrow(p, len(lead) + 1, 1, 1)
        return b.reshape(b.concat([b.neg(x2), x1], len(lead) + 1), shape)
    last = len(shape) - 1  # the exporter's x[..., ::2] as gather(transpose(x, [last, ...]), [0, 2, ..]) and back
    to_front = (last, *range(last))
    back = (*range(1, last + 1), 0)
    evens = b.const(tuple(range(0, r, 2)), "i64")
    odds = b.const(tuple(range(1, r, 2)), "i64")
    x1 = b.transpose(b.gather(b.transpose(h, to_front), evens), back)
    x2 = b.transpose(b.gather(b.transpose(h, to_front), odds), back)
    pair = (*lead, r // 2, 1)
    return b.reshape(b.concat([b.reshape(b.neg(x2), pair), b.reshape(x1, pair)], len(lead) + 1), shape)


def interleaved_attention(d: int = 16, n_rot: int = 16, heads: int = 4, kv: int = 4, before_split: bool = False,
                          spelling: str = "pairs") -> tuple[Graph, dict[str, np.ndarray]]:
    """One attention of `heads` query heads (`kv` K/V heads, repeat_kv) of `d` dims, RoPE interleaved over the
    first `n_rot` dims of each head with full-width repeat_interleave tables; `before_split`: rotated on the
    `[B, S, nh, d]` view before the head transpose (GPT-J), tables `[1, S, 1, r]`; else after it, `[1, 1, S, r]`.
    Returns the graph and its weights (the tables' values also carried in `Graph.values`)."""
    b = Builder("rope_pairs")
    x = b.input("hidden_states", (B, S, heads * d))
    view = (1, S, 1, n_rot) if before_split else (1, 1, S, n_rot)
    tabs = {n: b.param(f"rotary_emb.{n}", view) for n in ("cos", "sin")}

    def proj(t: str, nh: int) -> int:
        return b.reshape(b.matmul(x, b.param(f"{t}_proj.weight", (heads * d, nh * d))), (B, S, nh, d))

    def rotate(h: int, shape: tuple[int, ...]) -> int:
        part = h if n_rot == d else b.narrow(h, 3, 0, n_rot)
        rshape = (*shape[:3], n_rot)
        out = b.add(b.mul(part, tabs["cos"]), b.mul(_every_two(b, part, rshape, spelling), tabs["sin"]))
        return out if n_rot == d else b.concat([out, b.narrow(h, 3, n_rot, d - n_rot)], 3)

    def heads_of(t: str, nh: int) -> int:
        p = proj(t, nh)
        if before_split:
            return b.transpose(rotate(p, (B, S, nh, d)), (0, 2, 1, 3))
        return rotate(b.transpose(p, (0, 2, 1, 3)), (B, nh, S, d))

    def repeat(h: int) -> int:
        if kv == heads:
            return h
        e = b.expand(b.reshape(h, (B, kv, 1, S, d)), (B, kv, heads // kv, S, d))
        return b.reshape(e, (B, heads, S, d))

    q, k = heads_of("q", heads), repeat(heads_of("k", kv))
    v = repeat(b.transpose(proj("v", kv), (0, 2, 1, 3)))
    s = b.mul(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), 1.0 / np.sqrt(d))
    o = b.matmul(b.softmax(s), v)
    b.output(b.matmul(b.reshape(b.transpose(o, (0, 2, 1, 3)), (B, S, heads * d)),
                      b.param("o_proj.weight", (heads * d, heads * d))))
    g = b.build()
    rng = np.random.default_rng(d * 100 + n_rot + heads + kv)
    w = {n.name: (rng.standard_normal(n.shape) / np.sqrt(n.shape[0])).astype(np.float32) for n in g.params}
    ang = np.arange(S, dtype=np.float32)[:, None] / (10000.0 ** (np.arange(0, n_rot, 2, dtype=np.float32) / n_rot))
    for n, f in (("cos", np.cos), ("sin", np.sin)):
        w[f"rotary_emb.{n}"] = np.repeat(f(ang), 2, axis=-1).reshape(view).astype(np.float32)
    return g.with_values({k_: w[k_] for k_ in ("rotary_emb.cos", "rotary_emb.sin")}), w


CASES = [dict(d=16, n_rot=16), dict(d=8, n_rot=4), dict(d=32, n_rot=8), dict(d=16, n_rot=16, kv=2),
         dict(d=8, n_rot=8, kv=1), dict(d=16, n_rot=8, before_split=True), dict(d=8, n_rot=4, before_split=True,
                                                                                 kv=2, spelling="gather"),
         dict(d=16, n_rot=16, spelling="gather"), dict(d=64, n_rot=64, heads=2, kv=1, before_split=True)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_interleaved_rope_is_rewritten_bit_exact_and_the_attention_packs(case):
    g, w = interleaved_attention(**case)
    h, matches = rope_pairs(g)
    assert len(matches) == 2 and all(m.rule == RULE for m in matches)  # Q and K
    ropes = [n for n in h if n.op == Op.ROPE]
    assert all(r.attrs["interleaved"] and r.attrs["n_rot"] == case["n_rot"] for r in ropes) and len(ropes) == 2
    assert not any(n.op == Op.NEG for n in h)
    feeds = {"hidden_states": np.random.default_rng(3).standard_normal((B, S, g.inputs[0].shape[2]))
             .astype(np.float32)}
    want = run_reference(g, feeds, w)[0]
    assert np.array_equal(run_reference(h, feeds, w)[0], want)
    t = Pipeline.canonical().run(g)
    assert any(n.op in (Op.ATTENTION, Op.FUSED_ATTENTION_BLOCK) for n in t.final)
    tol = 1e-5 * max(1.0, float(np.abs(want).max()))  # the packed attention sums in another order (f32)
    np.testing.assert_allclose(run_reference(t.final, feeds, w)[0], want, rtol=1e-5, atol=tol)
    for version in (g, t.final):
        np.testing.assert_allclose(np.asarray(run_mlx(version, feeds, w)[0]), want, rtol=1e-5, atol=tol)


def test_a_table_whose_neighbours_differ_is_refused_with_the_entry():
    g, w = interleaved_attention(d=8, n_rot=8)
    bad = dict(g.values)
    bad["rotary_emb.sin"] = bad["rotary_emb.sin"].copy()
    bad["rotary_emb.sin"][0, 0, 3, 5] += 0.5
    g = g.with_values(bad)
    assert rope_pairs(g)[1] == []
    t = Pipeline.canonical().run(g)
    (r,) = [r for r in t.rejections if r.guard == "rope_on_heads" and r.headline]
    assert "its sin table: the neighbour pairs of param 'rotary_emb.sin' [1, 1, 8, 8] differ (at [0, 0, 3, 2]" \
        in r.message


def test_a_table_whose_values_are_unknown_is_named():
    g, _ = interleaved_attention(d=8, n_rot=8)
    g = g.with_values({})
    assert rope_pairs(g)[1] == []
    t = Pipeline.canonical().run(g)
    (r,) = [r for r in t.rejections if r.guard == "rope_on_heads" and r.headline]
    assert "interleaved (rotate_every_two" in r.message and "are not known to the pass" in r.message


def test_a_neox_rotation_is_not_read_as_interleaved():
    """rotate_half (halves) computes another map: rope_pairs leaves it to rope_heads."""
    b = Builder("half")
    h = b.input("h", (B, 4, S, 8))
    t = b.param("t", (1, 1, S, 8))
    rot = b.concat([b.neg(b.narrow(h, 3, 4, 4)), b.narrow(h, 3, 0, 4)], 3)
    b.output(b.add(b.mul(h, t), b.mul(rot, t)))
    g = b.build().with_values({"t": np.ones((1, 1, S, 8), np.float32)})
    assert rope_pairs(g)[1] == []
