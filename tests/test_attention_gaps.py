"""The attention forms issue 37's zoo left unpacked, built by hand as kinds (not the zoo's files): a half-precision
RoPE computed in float32 between casts (`rope_casts`), an interleaved RoPE in a decode step or with per-row tables
(`rope_pairs`), and two additive score terms of which one is a mask table folded at import
(`canonicalize_exported.bias_then_table_mask`). Each rewrite is bit-exact on the reference, the attention packs and
gives the unfused graph's numbers on the reference and MLX; each control stays unpacked, named by its guard."""

from __future__ import annotations

import numpy as np
import pytest

from rlxviz.ir import Builder, Graph, Op
from rlxviz.passes import Pipeline, run_passes
from rlxviz.passes.rules.table_mask import TABLE_DTYPE_FIX, TWO_TERMS_FIX
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import run_mlx

F32_MIN = float(np.finfo(np.float32).min)
PACKED = (Op.ATTENTION, Op.FUSED_ATTENTION_BLOCK)


def _weights(g: Graph, seed: int, scale: float = 0.3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n.name: (scale * rng.standard_normal(n.shape)).astype(n.dtype.numpy) for n in g.params}


def _packed(g: Graph) -> int:
    return sum(1 for n in g if n.op in PACKED)


def _same(g: Graph, h: Graph, feeds: dict, w: dict, rtol: float, atol: float) -> None:
    """h gives g's numbers on the reference and on MLX (each backend against itself on g)."""
    for run in (run_reference, run_mlx):
        for a, b in zip(run(g, feeds, w), run(h, feeds, w), strict=True):
            np.testing.assert_allclose(np.asarray(b, np.float64), np.asarray(a, np.float64), rtol=rtol, atol=atol,
                                       err_msg=run.__name__)


# -- a half-precision model's RoPE in float32 between casts --------------------------------------------------------

def half_rope_in_f32(d: int = 16, heads: int = 4, kv: int = 4, dtype: str = "f16", S: int = 6, B: int = 2,
                     tables: str = "full", halves_differ: bool = False) -> tuple[Graph, dict]:
    """OLMo's float16 attention: Q/K heads in `dtype`, rotated in f32 (`cast(h) * cos + cast(rotate_half(h)) * sin`
    with f32 tables, `tables` "full" `[1, 1, S, d]` params with equal halves or "concat" `concat(t, t)` of an
    `[S, d/2]` param), cast back, then `dtype` scores; GQA when kv < heads."""
    b = Builder("half_rope")
    x = b.input("x", (B, S, heads * d), dtype)

    def split(t: str, nh: int) -> int:
        p = b.matmul(x, b.param(f"{t}_proj", (heads * d, nh * d), dtype))
        return b.transpose(b.reshape(p, (B, S, nh, d)), (0, 2, 1, 3))

    if tables == "full":
        cos, sin = b.param("cos", (1, 1, S, d)), b.param("sin", (1, 1, S, d))
    else:
        tc, ts = b.param("cos_half", (S, d // 2)), b.param("sin_half", (S, d // 2))
        cos, sin = (b.reshape(b.concat([t, t], -1), (1, 1, S, d)) for t in (tc, ts))

    def rotate(h: int) -> int:
        rot = b.concat([b.neg(b.narrow(h, 3, d // 2, d // 2)), b.narrow(h, 3, 0, d // 2)], 3)
        out = b.add(b.mul(b.cast(h, "f32"), cos), b.mul(b.cast(rot, "f32"), sin))
        return b.cast(out, dtype)

    def repeat(h: int) -> int:
        if kv == heads:
            return h
        return b.reshape(b.expand(b.reshape(h, (B, kv, 1, S, d)), (B, kv, heads // kv, S, d)), (B, heads, S, d))

    q, k, v = rotate(split("q", heads)), repeat(rotate(split("k", kv))), repeat(split("v", kv))
    s = b.mul(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), 1.0 / np.sqrt(d))
    o = b.matmul(b.softmax(s, -1), v)
    b.output(b.matmul(b.reshape(b.transpose(o, (0, 2, 1, 3)), (B, S, heads * d)),
                      b.param("o_proj", (heads * d, heads * d), dtype)))
    g = b.build()
    w = _weights(g, d + heads + kv)
    ang = np.arange(S, dtype=np.float32)[:, None] / (10000.0 ** (np.arange(0, d, 2, dtype=np.float32) / d))
    half = {"cos": np.cos(ang), "sin": np.sin(ang)}
    if tables == "full":
        for n in ("cos", "sin"):
            full = np.concatenate([half[n], half[n]], -1)
            if halves_differ and n == "cos":
                full[2, 1] += 0.25
            w[n] = full.reshape(1, 1, S, d).astype(np.float32)
        g = g.with_values({n: w[n] for n in ("cos", "sin")})
    else:
        w["cos_half"], w["sin_half"] = half["cos"], half["sin"]
    return g, w


HALF_CASES = [dict(d=16), dict(d=32, heads=2, kv=1), dict(d=8, kv=2, tables="concat"), dict(d=16, dtype="bf16")]


@pytest.mark.parametrize("case", HALF_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_a_half_precision_rope_in_f32_between_casts_is_rewritten_exactly_and_packs(case):
    g, w = half_rope_in_f32(**case)
    feeds = {"x": np.random.default_rng(1).standard_normal(g.inputs[0].shape).astype(g.inputs[0].dtype.numpy)}
    ropes = run_passes(g, ["fuse_sdpa"])
    rules = {m.rule for s in ropes.steps for m in s.matches}
    assert {"fuse_sdpa.cast_rotation", "fuse_sdpa.cast_heads", "fuse_sdpa.rope_heads"} <= rules, rules
    rope_ops = [n for n in ropes.final if n.op == Op.ROPE]
    assert len(rope_ops) == 2 and all(n.dtype.value == "f32" for n in rope_ops)  # the rotation stays in f32
    assert _packed(ropes.final) == 1
    t = Pipeline.canonical().run(g)
    assert _packed(t.final) == 1 and not [n for n in t.final if n.op == Op.SOFTMAX]
    # the canonicalizations alone (casts moved, rope op) are bit-exact; the packed attention rounds once per op
    canon = run_passes(g, ["fuse_sdpa"], **{}).final
    _same(g, canon, feeds, w, rtol=2e-2, atol=2e-2)
    _same(g, t.final, feeds, w, rtol=2e-2, atol=2e-2)


def test_the_cast_moves_are_bit_exact_on_the_reference():
    """cast(rotate_half(h)) == rotate_half(cast(h)) and cast(split(x)) == split(cast(x)), element for element: the
    version after the cast rules and the rope op equals the unfused graph bit for bit up to the attention."""
    from rlxviz.passes.engine import compose
    from rlxviz.passes.rules.rope_casts import CAST_HEADS_PASS, CAST_ROTATION_PASS
    from rlxviz.passes.rules.rope_heads import ROPE_HEADS_PASS

    g, w = half_rope_in_f32(d=16, kv=2)
    feeds = {"x": np.random.default_rng(2).standard_normal(g.inputs[0].shape).astype(np.float16)}
    h = compose(g, {}, [CAST_ROTATION_PASS, CAST_HEADS_PASS, ROPE_HEADS_PASS, CAST_HEADS_PASS]).graph
    assert sum(1 for n in h if n.op == Op.ROPE) == 2 and not [n for n in h if n.op == Op.NEG]
    assert np.array_equal(run_reference(h, feeds, w)[0], run_reference(g, feeds, w)[0])


def test_a_table_whose_halves_differ_keeps_the_casts_rotation_unpacked_and_named():
    g, _ = half_rope_in_f32(d=8, halves_differ=True)
    t = Pipeline.canonical().run(g)
    assert _packed(t.final) == 0
    (r,) = [r for r in t.rejections if r.guard == "rope_on_heads" and r.headline]
    assert "its cos table" in r.message and "differ" in r.message, r.message


# -- an interleaved RoPE in a decode step, tables per batch row -----------------------------------------------------

def decode_step(past: int, S: int, d: int = 8, heads: int = 4, kv: int = 2, B: int = 2, per_row: bool = True,
                halves: bool = False) -> tuple[Graph, dict]:
    """Cohere's attention with a KV cache: `past` cached K/V (none when 0), S new tokens at positions past..past+S-1,
    RoPE interleaved (rotate_every_two as a pairs view) with tables from a `position_ids` input (`per_row`:
    `repeat_interleave(pos * inv_freq, 2)` as `[B, 1, S, d]`, computed at run time) or constant `[1, 1, S, d]`
    tables of those positions; `halves`: the per-row table repeated by concat (halves, not neighbours: a control)."""
    b = Builder("decode")
    x = b.input("x", (B, S, heads * d))
    pos = b.input("position_ids", (B, S), "i64") if per_row else None
    caches = {t: b.input(f"past_{t}", (B, kv, past, d)) for t in "kv"} if past else {}

    def split(t: str, nh: int) -> int:
        return b.transpose(b.reshape(b.matmul(x, b.param(f"{t}_proj", (heads * d, nh * d))), (B, S, nh, d)),
                           (0, 2, 1, 3))

    if per_row:
        ang = b.mul(b.reshape(b.cast(pos, "f32"), (B, S, 1)), b.param("inv_freq", (1, 1, d // 2)))
        if halves:
            rep = b.concat([ang, ang], -1)
        else:
            rep = b.reshape(b.expand(b.reshape(ang, (B, S, d // 2, 1)), (B, S, d // 2, 2)), (B, S, d))
        cos, sin = (b.reshape(f(rep), (B, 1, S, d)) for f in (b.cos, b.sin))
    else:
        cos, sin = b.param("cos", (1, 1, S, d)), b.param("sin", (1, 1, S, d))

    def rotate(h: int, nh: int) -> int:
        p = b.reshape(h, (B, nh, S, d // 2, 2))
        x1, x2 = b.narrow(p, 4, 0, 1), b.narrow(p, 4, 1, 1)
        rot = b.reshape(b.concat([b.neg(x2), x1], 4), (B, nh, S, d))
        return b.add(b.mul(h, cos), b.mul(rot, sin))

    def repeat(h: int, n: int) -> int:
        return b.reshape(b.expand(b.reshape(h, (B, kv, 1, n, d)), (B, kv, heads // kv, n, d)), (B, heads, n, d))

    q = rotate(split("q", heads), heads)
    k, v = rotate(split("k", kv), kv), split("v", kv)
    if past:
        k, v = b.concat([caches["k"], k], 2), b.concat([caches["v"], v], 2)
    n = past + S
    s = b.mul(b.matmul(q, b.transpose(repeat(k, n), (0, 1, 3, 2))), 1.0 / np.sqrt(d))
    o = b.matmul(b.softmax(s, -1), repeat(v, n))
    b.output(b.reshape(b.transpose(o, (0, 2, 1, 3)), (B, S, heads * d)))
    g = b.build()
    w = _weights(g, past * 10 + S)
    inv = (1.0 / 10000.0 ** (np.arange(0, d, 2, dtype=np.float32) / d)).astype(np.float32)
    if per_row:
        w["inv_freq"] = inv.reshape(1, 1, d // 2)
    else:
        a = np.repeat((np.arange(past, past + S, dtype=np.float32)[:, None] * inv), 2, axis=-1)
        w["cos"], w["sin"] = (f(a).reshape(1, 1, S, d).astype(np.float32) for f in (np.cos, np.sin))
        g = g.with_values({"cos": w["cos"], "sin": w["sin"]})
    return g, w


def _decode_feeds(g: Graph, past: int, seed: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {n.name: rng.standard_normal(n.shape).astype(np.float32) for n in g.inputs if n.dtype.is_float}
    if any(n.name == "position_ids" for n in g.inputs):
        (p,) = [n for n in g.inputs if n.name == "position_ids"]
        b, s = p.shape
        feeds["position_ids"] = (past + np.arange(s)[None, :] - np.array([[0], [1]])[:b]).clip(0).astype(np.int64)
    return feeds


DECODE_CASES = [dict(past=3, S=1), dict(past=3, S=3), dict(past=0, S=4), dict(past=3, S=1, per_row=False),
                dict(past=5, S=2, d=16, heads=2, kv=1)]


@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_an_interleaved_rope_at_the_caches_offset_is_rewritten_exactly_and_packs(case):
    g, w = decode_step(**case)
    feeds = _decode_feeds(g, case["past"])
    r = run_passes(g, ["fuse_sdpa"])
    assert sum(1 for s in r.steps for m in s.matches if m.rule == "fuse_sdpa.rope_pairs") == 2
    ropes = [n for n in r.final if n.op == Op.ROPE]
    assert len(ropes) == 2 and all(n.attrs["interleaved"] for n in ropes)
    assert all(r.final[n.inputs[1]].rank == (3 if case.get("per_row", True) else 2) for n in ropes)  # [B, S, d/2]
    t = Pipeline.canonical().run(g)
    assert _packed(t.final) == 1 and not [n for n in t.final if n.op == Op.SOFTMAX]
    _same(g, t.final, feeds, w, rtol=1e-5, atol=1e-5)


def test_the_per_row_interleaved_rewrite_is_bit_exact():
    from rlxviz.passes.rules.rope_pairs import rope_pairs

    g, w = decode_step(past=3, S=3)
    feeds = _decode_feeds(g, 3)
    h, matches = rope_pairs(g)
    assert len(matches) == 2
    assert np.array_equal(run_reference(h, feeds, w)[0], run_reference(g, feeds, w)[0])


def test_a_per_row_table_repeated_by_halves_is_no_interleaved_table_and_is_named():
    g, _ = decode_step(past=3, S=2, halves=True)
    t = Pipeline.canonical().run(g)
    assert _packed(t.final) == 0
    (r,) = [r for r in t.rejections if r.guard == "rope_on_heads" and r.headline]
    assert "interleaved" in r.message and "its cos table" in r.message, r.message


# -- two additive score terms, one a mask table folded at import ----------------------------------------------------

def two_terms(order: str = "bias_first", fill: float = F32_MIN, bias_shape: tuple[int, ...] = (1, 4, 6, 6),
              mask_shape: tuple[int, ...] = (2, 1, 6, 6), B: int = 2, scaled: bool = False,
              dtype: str = "f32") -> tuple[Graph, dict, dict]:
    """T5's decoder self-attention: `(s + bias) + mask` (`order` "bias_first"; "mask_first": `(s + mask) + bias`;
    "summed": `s + (bias + mask)`, the rule's rewrite written by hand),
    bias a real-valued `bias_shape` param (a relative position bias), mask a causal `mask_shape` table of 0 and `fill`
    (its values carried, `Graph.values`); s = q k^T, times 1/sqrt(d) when `scaled` (T5 does not scale). Returns the
    graph, its weights and node ids by role."""
    H, S, d = 4, 6, 8
    b = Builder("two_terms")
    x = b.input("x", (B, S, H * d), dtype)

    def split(t: str) -> int:
        return b.transpose(b.reshape(b.matmul(x, b.param(f"{t}_proj", (H * d, H * d), dtype)), (B, S, H, d)),
                           (0, 2, 1, 3))

    q, k, v = split("q"), split("k"), split("v")
    s = b.matmul(q, b.transpose(k, (0, 1, 3, 2)))
    if scaled:
        s = b.mul(s, 1.0 / np.sqrt(d))
    bias, mask = b.param("position_bias", bias_shape, dtype), b.param("causal_mask", mask_shape, dtype)
    first, second = (bias, mask) if order == "bias_first" else (mask, bias)
    scores = b.add(s, b.add(bias, mask)) if order == "summed" else b.add(b.add(s, first), second)
    o = b.matmul(b.softmax(scores, -1), v)
    b.output(b.reshape(b.transpose(o, (0, 2, 1, 3)), (max(B, mask_shape[0] if len(mask_shape) == 4 else 1), S,
                                                      H * d)))
    g = b.build()
    w = _weights(g, 7)
    causal = np.where(np.tril(np.ones((S, S), bool)), 0.0, fill)
    m = np.broadcast_to(causal, mask_shape).copy()
    if len(mask_shape) == 4 and mask_shape[0] > 1:
        m[1, ..., 0] = fill if mask_shape[-1] > 1 else m[1, ..., 0]  # row 1 pads key 0 (every row keeps its diagonal)
        m[1, ..., 0, 0] = 0.0
    w["causal_mask"] = m.astype(g[mask].dtype.numpy)
    return g.with_values({"causal_mask": w["causal_mask"]}), w, {"s": int(s), "bias": int(bias), "mask": int(mask)}


TERM_CASES = [dict(), dict(order="mask_first"), dict(fill=float("-inf"), mask_shape=(1, 1, 6, 6)),
              dict(scaled=True, bias_shape=(4, 6, 6), mask_shape=(6, 6))]


@pytest.mark.parametrize("case", TERM_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()) or "t5")
def test_two_additive_terms_with_a_mask_table_are_one_operand_and_pack(case):
    g, w, _ = two_terms(**case)
    feeds = {"x": np.random.default_rng(5).standard_normal(g.inputs[0].shape).astype(np.float32)}
    r = run_passes(g, ["canonicalize_exported"])
    assert [m.rule for m in r.steps[0].matches] == ["canonicalize_exported.bias_then_table_mask"]
    assert np.array_equal(run_reference(r.final, feeds, w)[0], run_reference(g, feeds, w)[0])  # bit-exact
    t = Pipeline.canonical().run(g)
    (attn,) = [n for n in t.final if n.op in PACKED]
    assert attn.attrs.get("mask") == "additive" and attn.attrs.get("scale") in ((None,) if case.get("scaled") else
                                                                                 (1.0,))
    _same(g, t.final, feeds, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case,guard,subject", [
    (dict(fill=-1e9), "mask_table", "mask"),  # two real-valued terms: (s + a) + b rounds otherwise than s + (a + b)
    (dict(B=1, mask_shape=(2, 1, 6, 6)), "terms_no_widen", "mask"),  # a term wider than the scores
    (dict(dtype="f16", fill=float("-inf")), "scores_f32", "s"),
])
def test_two_terms_the_rule_cannot_sum_stay_unpacked_and_are_named(case, guard, subject):
    g, _, ids = two_terms(**case)
    t = Pipeline.canonical().run(g)
    assert _packed(t.final) == 0
    (r,) = [r for r in t.rejections if r.rule == "canonicalize_exported.bias_then_table_mask" and r.headline]
    assert r.guard == guard and r.subject == ids[subject], r
    assert f"node {ids[subject]}" in r.message, r.message


BF16_MIN, F16_MIN = -(2 - 2.0**-7) * 2.0**127, -65504.0  # finfo(bf16).min, finfo(f16).min
INF = float("-inf")
RULE = "canonicalize_exported.bias_then_table_mask"


def _score_sums(g: Graph, w: dict, seed: int) -> np.ndarray:
    """The softmax's input (the summed scores) of `g` on the reference, for x ~ 3 N(0, 1) (scores of tens: past f16's
    absorbing |x| < 16)."""
    from rlxviz.runtime.reference import reference_values
    (sm,) = [n for n in g if n.op == Op.SOFTMAX]
    feeds = {"x": (3 * np.random.default_rng(seed).standard_normal(g.inputs[0].shape)).astype(g.inputs[0].dtype.numpy)}
    return reference_values(g, feeds, w, [sm.inputs[0]])[sm.inputs[0]]


@pytest.mark.parametrize("dtype,fill,refusal", [
    ("f32", F32_MIN, None), ("f32", INF, None),
    ("bf16", BF16_MIN, ("scores_f32", "not recognized", TABLE_DTYPE_FIX, "s")),  # was mask_table: "two real-valued"
    ("bf16", INF, ("scores_f32", "not recognized", TABLE_DTYPE_FIX, "s")),
    ("f16", INF, ("scores_f32", "not recognized", TABLE_DTYPE_FIX, "s")),
    ("f16", F16_MIN, ("fill_absorbs", "illegal", TWO_TERMS_FIX, "mask")),  # was mask_table; f16's min absorbs |x| < 16
], ids=lambda v: v if isinstance(v, str) else (f"{v:.4g}" if isinstance(v, float) else None))
def test_a_table_of_its_dtypes_lowest_value_is_a_mask_and_each_refusal_is_true(dtype, fill, refusal):
    """A mask table holding its own dtype's lowest value (transformers' finfo(dtype).min) or -inf is recognized in
    f32, bf16 and f16; the rule rewrites f32 (numbers kept), refuses bf16 and f16 -inf as not yet made for the dtype,
    with the fix that the same rewrite is exact there, and f16's min as illegal (its sums round otherwise). Each
    claim is checked on the reference on random inputs: `s + (a + b)` written by hand gives `(s + a) + b`'s sums
    exactly where the rewrite fires or the fix says so, and other sums for f16's min."""
    g, w, ids = two_terms(dtype=dtype, fill=fill)
    r = run_passes(g, ["canonicalize_exported"])
    got = [(x.guard, x.kind, x.fix, x.subject) for x in r.rejections if x.rule == RULE]
    want = [] if refusal is None else [(*refusal[:3], ids[refusal[3]])]
    assert got == want, got
    assert [m.rule for m in r.steps[0].matches] == ([RULE] if refusal is None else [])
    h, hw, _ = two_terms(dtype=dtype, fill=fill, order="summed")
    exact = all(np.array_equal(_score_sums(g, w, seed), _score_sums(h, hw, seed), equal_nan=True) for seed in range(4))
    assert exact == (refusal is None or refusal[0] == "scores_f32")
    if refusal is None:  # the rule's own rewrite keeps the numbers
        for seed in range(4):
            assert np.array_equal(_score_sums(g, w, seed), _score_sums(r.final, w, seed))


def test_a_residual_sum_is_no_score_term_and_no_record():
    """`(x @ W + b) + residual` (every layer's output) is not `(s + a) + b` of scores: nothing a softmax reads, so the
    rule is quiet (no near miss on every residual add)."""
    b = Builder("residual")
    x = b.input("x", (2, 8, 32))
    y = b.add(b.add(b.matmul(x, b.param("w", (32, 32))), b.param("bias", (32,))), x)
    b.output(y)
    g = b.build().with_values({"bias": np.zeros(32, np.float32)})
    t = run_passes(g, ["canonicalize_exported"])
    assert not [r for r in t.rejections if r.rule == "canonicalize_exported.bias_then_table_mask"]
    assert not t.steps[0].matches
