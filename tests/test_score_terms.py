"""Extra terms on attention scores (`passes/score_terms.py`), on hand-built attention graphs: each kind is named by
`score_terms`; the blocking kinds (soft-cap, sinks, a content-position term) keep the attention unpacked with the
`score_term` guard naming the term and its kind; the additive kinds (ALiBi, relative position bias) pack as the
attention's additive operand and the kept-operand line names them. Numbers are the unrewritten graph's in every
case (NumPy reference)."""

from __future__ import annotations

import numpy as np
import pytest

from rlxviz.ir import Builder, Graph, Op
from rlxviz.passes import Pipeline
from rlxviz.passes.score_terms import ALIBI, CONTENT_POSITION, RELATIVE_BIAS, SINKS, SOFT_CAP, score_terms
from rlxviz.runtime import run_reference

B, S, H, D = 2, 6, 4, 8
rng = np.random.default_rng(20)


def _heads(b: Builder, x: int) -> int:
    return b.transpose(b.reshape(x, (B, S, H, D)), (0, 2, 1, 3))


def attention_with(term: str, variant: int = 0) -> Graph:
    """`softmax(term(QK^T / sqrt(d))) @ V` over [B, S, H*D] inputs q, k, v."""
    b = Builder(f"scores_{term}_{variant}")
    q, k, v = (b.input(n, (B, S, H * D)) for n in "qkv")
    qh, kh, vh = _heads(b, q), _heads(b, k), _heads(b, v)
    s = b.mul(b.matmul(qh, b.transpose(kh, (0, 1, 3, 2))), 1 / np.sqrt(D))
    out_of_softmax = None
    if term == SOFT_CAP:
        cap = 30.0
        t = b.tanh(b.div(s, cap) if variant == 0 else b.mul(s, 1 / cap))
        s = b.mul(t, cap) if variant < 2 else b.mul(cap, t)  # variant 2: the cap first, scaled by 1/c
    elif term == SINKS:  # GPT-OSS: cat([s, sinks], -1) - max, softmax, drop the sink column
        sink = b.expand(b.reshape(b.param("sinks", (H,)), (1, H, 1, 1)), (B, H, S, 1))
        s = b.concat([s, sink], -1)
        if variant == 0:  # GPT-OSS subtracts the row max first; variant 1 leaves it to the softmax
            s = b.sub(s, b.reduce_max(s, [-1], keepdims=True))
        out_of_softmax = lambda p: b.narrow(p, -1, 0, S)  # noqa: E731
    elif term == ALIBI:
        slopes = b.const([[[[2.0 ** -(i + 1)]] for i in range(H)]])  # [1, H, 1, 1]
        s = b.add(s, b.mul(slopes, b.const([[[[float(j) for j in range(S)]]]])))  # [1, 1, 1, S] key positions
    elif term == RELATIVE_BIAS:
        idx = b.const([[min(abs(i - j), 3) for j in range(S)] for i in range(S)], "i64")  # bucketed distance
        bias = b.transpose(b.gather(b.param("rel_bias.weight", (4, H)), idx), (2, 0, 1))  # [H, S, S]
        s = b.add(s, b.reshape(bias, (1, H, S, S)))
    elif term == CONTENT_POSITION:  # DeBERTa's c2p: Q's heads times position keys
        s = b.add(s, b.matmul(qh, b.param("pos_key", (1, H, D, S))))
    p = b.softmax(s, -1)
    if out_of_softmax is not None:
        p = out_of_softmax(p)
    b.output(b.reshape(b.transpose(b.matmul(p, vh), (0, 2, 1, 3)), (B, S, H * D)))
    return b.build()


def _numbers(g: Graph, after: Graph) -> None:
    feeds = {n.attrs["name"]: rng.standard_normal(n.shape).astype(np.float32) for n in g.inputs}
    weights = {n.attrs["name"]: rng.standard_normal(n.shape).astype(np.float32) for n in g.params}
    np.testing.assert_allclose(run_reference(after, feeds, weights)[0], run_reference(g, feeds, weights)[0],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind, variant", [(SOFT_CAP, 0), (SOFT_CAP, 1), (SOFT_CAP, 2), (SINKS, 0), (SINKS, 1),
                                           (CONTENT_POSITION, 0)])
def test_a_blocking_score_term_is_named_with_its_kind_and_keeps_the_attention_unpacked(kind, variant):
    g = attention_with(kind, variant)
    (sm,) = [n for n in g if n.op == Op.SOFTMAX]
    assert [t.kind for t in score_terms(g, sm)] == [kind]
    trace = Pipeline.canonical().run(g)
    assert not any(n.op == Op.ATTENTION for n in trace.final)
    rej = next(r for s in trace.steps for r in s.rejections if r.rule.startswith("fuse_sdpa"))  # the headline
    assert rej.guard == "score_term" and rej.kind == "illegal" and f"score term {kind}:" in rej.message
    _numbers(g, trace.final)


def test_soft_cap_names_its_cap_and_a_cap_that_does_not_undo_the_division_is_not_one():
    g = attention_with(SOFT_CAP)
    (sm,) = [n for n in g if n.op == Op.SOFTMAX]
    (t,) = score_terms(g, sm)
    assert t.formula == "tanh(s / 30) * 30" and t.blocks
    b = Builder("not_a_cap")  # tanh(s / 30) * 20 squashes and scales: not the soft-cap form
    q, k = b.input("q", (B, H, S, D)), b.input("k", (B, H, S, D))
    s = b.mul(b.tanh(b.div(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), 30.0)), 20.0)
    b.output(b.softmax(s, -1))
    g2 = b.build()
    (sm2,) = [n for n in g2 if n.op == Op.SOFTMAX]
    assert score_terms(g2, sm2) == []


@pytest.mark.parametrize("kind", [ALIBI, RELATIVE_BIAS])
def test_an_additive_position_term_packs_as_the_operand_and_is_named_by_kind(kind):
    g = attention_with(kind)
    (sm,) = [n for n in g if n.op == Op.SOFTMAX]
    (t,) = score_terms(g, sm)
    assert t.kind == kind and not t.blocks
    trace = Pipeline.canonical().run(g)
    (attn,) = [n for n in trace.final if n.op == Op.ATTENTION]
    assert attn.attrs["mask"] == "additive"
    (kept,) = [r for s in trace.steps for r in s.rejections if r.guard == "mask_model_term"]
    assert f"score term {kind}:" in kept.message and "not a per-key mask such as padding alone" in kept.message
    assert "not a padding mask" not in kept.message  # a per-query or per-head term may hold padding too
    _numbers(g, trace.final)


def test_plain_scores_have_no_extra_term():
    b = Builder("plain")
    q, k = b.input("q", (B, H, S, D)), b.input("k", (B, H, S, D))
    mask = b.input("mask", (B, 1, 1, S))
    b.output(b.softmax(b.add(b.div(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), 8.0 ** 0.5), mask), -1))
    g = b.build()
    (sm,) = [n for n in g if n.op == Op.SOFTMAX]
    assert score_terms(g, sm) == []


# -- QK-norm on the heads (Qwen3, OLMo 2, Gemma 3): plain scores after the norm, so attention packs ---------------

def qk_norm_attention(where: str, norm: str = "rms") -> Graph:
    """Q and K normalized per head over head_dim: on `[B, S, H, d]` before the head transpose (`before`, Qwen3's
    export), on `[B, H, S, d]` after it (`after`), or on the full `[B, S, H*d]` projection (`full`, OLMo 2)."""
    b = Builder(f"qk_norm_{where}_{norm}")
    q, k, v = (b.input(n, (B, S, H * D)) for n in "qkv")

    def normed(x: int, tag: str) -> int:
        width = H * D if where == "full" else D
        gamma = b.param(f"{tag}_norm.weight", (width,))
        if norm == "rms":
            return b.rms_norm(x, gamma, eps=1e-6)
        return b.layer_norm(x, gamma, b.param(f"{tag}_norm.bias", (width,)), eps=1e-5)

    def heads(x: int, tag: str) -> int:
        if where == "full":
            return _heads(b, normed(x, tag))
        r = b.reshape(x, (B, S, H, D))
        if where == "before":
            return b.transpose(normed(r, tag), (0, 2, 1, 3))
        return normed(b.transpose(r, (0, 2, 1, 3)), tag)

    qh, kh, vh = heads(q, "q"), heads(k, "k"), _heads(b, v)
    s = b.mul(b.matmul(qh, b.transpose(kh, (0, 1, 3, 2))), 1 / np.sqrt(D))
    b.output(b.reshape(b.transpose(b.matmul(b.softmax(s, -1), vh), (0, 2, 1, 3)), (B, S, H * D)))
    return b.build()


@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("where", ["before", "after", "full"])
def test_qk_norm_on_the_heads_packs_with_the_same_numbers(where, norm):
    g = qk_norm_attention(where, norm)
    trace = Pipeline.canonical().run(g)
    assert sum(n.op == Op.ATTENTION for n in trace.final) == 1, where
    assert not any(n.op == Op.SOFTMAX for n in trace.final)
    hoisted = [m for s in trace.steps for m in s.matches if m.rule == "fuse_sdpa.hoist_head_norm"]
    assert len(hoisted) == (0 if where == "full" else 2)
    _numbers(g, trace.final)


def test_hoisting_the_head_norm_is_bit_exact():
    from rlxviz.passes.rules.head_norm import hoist_head_norms

    g = qk_norm_attention("after")
    moved, matches = hoist_head_norms(g)
    assert len(matches) == 2 and moved is not g
    feeds = {n.attrs["name"]: (rng.standard_normal(n.shape) * 10).astype(np.float32) for n in g.inputs}
    weights = {n.attrs["name"]: rng.standard_normal(n.shape).astype(np.float32) for n in g.params}
    assert np.array_equal(run_reference(moved, feeds, weights)[0], run_reference(g, feeds, weights)[0])


def test_a_head_norm_whose_transpose_is_read_elsewhere_stays():
    from rlxviz.passes.rules.head_norm import hoist_head_norms

    b = Builder("qk_norm_shared")
    q = b.input("q", (B, S, H * D))
    t = b.transpose(b.reshape(q, (B, S, H, D)), (0, 2, 1, 3))
    b.output(b.rms_norm(t, b.param("q_norm.weight", (D,))), t)
    g = b.build()
    assert hoist_head_norms(g) == (g, [])
