"""Hypothesis strategies for random, well-formed rlxviz graphs with their feeds and weights.

Two strategies, both drawing a `GraphCase(graph, feeds, weights)` that passes `lint` and runs
under `run_reference` with finite results:

* `random_graphs()`: arbitrary small dataflow graphs over the primitive op set. A pool of live
  float values grows one random op at a time: matmul, linear with bias (either operand order),
  binary ops with NumPy broadcasting (full shape, `[N]`, size-1 dims, Python scalars, swapped
  operands), unary ops and activations (gelu, gelu_tanh, silu, relu, sigmoid, tanh, erf, neg; exp
  only of tanh/sigmoid outputs; log/sqrt/rsqrt only of `x*x + 1`), softmax on any axis, layer_norm
  and rms_norm, reshape/transpose/narrow/concat, reductions, where/compare, residual add +
  layer_norm chains, and attention (keep masks with padded positions, causal with q_len != kv_len,
  additive, none). Values are picked from the whole pool, so nodes often get several users, and
  random extra values become graph outputs.
* `random_transformer_like_graphs()`: 1-2 BERT-style post-norm layers containing the patterns the
  fusion passes look for: `matmul + bias (+ gelu/gelu_tanh/silu/relu)`, `add + layer_norm` residuals,
  and a packed QKV matmul (+ bias) split by three `narrow`s feeding a keep-masked attention, and
  sometimes a SwiGLU-style `silu(narrow) * narrow` and RoPE on q/k. Random perturbations keep
  passes honest: extra users of intermediates (which must block a fusion), intermediates exposed as
  graph outputs, swapped `add` operand orders, `narrow` on axis `-1` vs `2`, swapped q/k slices,
  separate q/k/v projections, bias-less matmuls, tanh-GELU.

Typical use in a pass test (sizes are tiny: batch <= 2, seq <= 4, hidden <= 16)::

    from hypothesis import given, settings
    from strategies import random_transformer_like_graphs, run_case   # tests/ is on sys.path under pytest

    @settings(max_examples=30, deadline=None)
    @given(random_transformer_like_graphs())
    def test_pass_keeps_numbers(case):
        before = run_case(case)
        after = run_case(case, my_pass(case.graph))
        for a, b in zip(before, after, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

Data is drawn from a NumPy generator seeded by hypothesis, so failures shrink and replay.
Weights are scaled by `1/sqrt(fan_in)`, LayerNorm gammas are near 1, and keep masks always attend to
key 0 (each row has at least one visible key).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st

from rlxviz.ir import Builder, Graph, Op, lint
from rlxviz.runtime import run_reference

__all__ = ["GraphCase", "random_graphs", "random_transformer_like_graphs", "run_case"]


class GraphCase(NamedTuple):
    """A graph with everything needed to run it: `feeds` (input name -> array) and `weights`
    (param name -> float32 array)."""

    graph: Graph
    feeds: dict[str, np.ndarray]
    weights: dict[str, np.ndarray]


def run_case(case: GraphCase, graph: Graph | None = None) -> list[np.ndarray]:
    """`run_reference` on `graph` (default: `case.graph`) with the case's feeds and weights."""
    return run_reference(case.graph if graph is None else graph, case.feeds, case.weights)


class _Ctx:
    """Builder plus the data that goes with it (feeds, weights) and a pool of live float values."""

    def __init__(self, draw: Callable, name: str) -> None:
        self.draw = draw
        self.b = Builder(name)
        self.rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        self.feeds: dict[str, np.ndarray] = {}
        self.weights: dict[str, np.ndarray] = {}
        self.pool: list[int] = []
        self.extra_outputs: list[int] = []

    # -- leaves -----------------------------------------------------------------------------
    def input(self, name: str, shape: tuple[int, ...], scale: float = 1.0) -> int:
        self.feeds[name] = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return self.b.input(name, shape)

    def keep_mask(self, batch: int, kv_len: int) -> int:
        """A binary keep mask with some padded (0) tail positions; key 0 is always kept."""
        name = f"mask{len(self.feeds)}"
        lengths = self.rng.integers(1, kv_len + 1, size=batch)
        if self.draw(st.booleans()):
            lengths[0] = kv_len  # usually at least one unpadded row
        mask = (np.arange(kv_len)[None, :] < lengths[:, None]).astype(np.float32)
        self.feeds[name] = mask
        return self.b.input(name, (batch, kv_len))

    def param(self, shape: tuple[int, ...], kind: str = "normal", fan_in: int | None = None) -> int:
        name = f"p{len(self.weights)}"
        if kind == "gamma":
            arr = 1.0 + 0.1 * self.rng.standard_normal(shape)
        elif kind == "positive":
            arr = self.rng.uniform(1.0, 2.0, shape)
        else:
            arr = self.rng.standard_normal(shape) / math.sqrt(fan_in or 1)
            if kind == "small":
                arr *= 0.1
        self.weights[name] = arr.astype(np.float32)
        return self.b.param(name, shape)

    def weight(self, k: int, n: int) -> int:
        return self.param((k, n), fan_in=k)

    # -- helpers ----------------------------------------------------------------------------
    def shape(self, v: int) -> tuple[int, ...]:
        return self.b.lookup(v).shape

    def pick(self, pred: Callable[[tuple[int, ...]], bool] = lambda s: True) -> int | None:
        cands = [v for v in self.pool if pred(self.shape(v))]
        return self.draw(st.sampled_from(cands)) if cands else None

    def linear(self, x: int, n: int, bias: bool = True, swap: bool = False) -> int:
        k = self.shape(x)[-1]
        y = self.b.matmul(x, self.weight(k, n))
        if not bias:
            return y
        bv = self.param((n,), "small")
        return self.b.add(bv, y) if swap else self.b.add(y, bv)

    def layer_norm(self, x: int, rms: bool = False) -> int:
        h = self.shape(x)[-1]
        g, beta = self.param((h,), "gamma"), self.param((h,), "small")
        eps = self.draw(st.sampled_from([1e-12, 1e-5, 1e-6]))
        return self.b.rms_norm(x, g, beta, eps) if rms else self.b.layer_norm(x, g, beta, eps)

    def finish(self, result: int) -> GraphCase:
        outs = [result, *[o for o in dict.fromkeys(self.extra_outputs) if o != result]]
        self.b.output(*outs)
        return GraphCase(lint(self.b.build()), self.feeds, self.weights)


# ---------------------------------------------------------------------------------------------
# random_graphs
# ---------------------------------------------------------------------------------------------

_ACTS = ("gelu", "gelu_tanh", "silu", "relu", "sigmoid", "tanh", "erf", "neg")


def _partner_shape(draw: Callable, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against `shape` without changing it: dims set to 1, leading dims dropped."""
    drop = draw(st.integers(0, len(shape)))
    tail = shape[drop:]
    return tuple(1 if draw(st.booleans()) else d for d in tail)


def _op_matmul(c: _Ctx) -> int | None:
    x = c.pick(lambda s: len(s) >= 2)
    if x is None:
        return None
    n = c.draw(st.sampled_from([2, 4, 8]))
    if c.draw(st.booleans()):
        return c.linear(x, n, bias=True, swap=c.draw(st.booleans()))
    if c.draw(st.booleans()):  # batched matmul against another pool value with matching contraction
        s = c.shape(x)
        other = c.pick(lambda t: len(t) >= 2 and t[-2] == s[-1] and _bcast_ok(s[:-2], t[:-2]))
        if other is not None:
            return c.b.matmul(x, other)
    return c.b.matmul(x, c.weight(c.shape(x)[-1], n))


def _bcast_ok(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b), strict=False))


def _op_binary(c: _Ctx) -> int | None:
    x = c.pick()
    assert x is not None
    s = c.shape(x)
    op = c.draw(st.sampled_from(["add", "sub", "mul", "max", "min", "div", "pow"]))
    if op == "div":
        den = c.draw(st.sampled_from(["scalar", "param"]))
        return c.b.div(x, 2.0) if den == "scalar" else c.b.div(x, c.param(_partner_shape(c.draw, s), "positive"))
    if op == "pow":
        return c.b.pow(x, 2.0)
    kind = c.draw(st.sampled_from(["same", "param", "scalar"]))
    if kind == "same":
        y = c.pick(lambda t: t == s)
    elif kind == "param":
        y = c.param(_partner_shape(c.draw, s))
    else:
        y = c.draw(st.sampled_from([0.5, -1.0, 2.0, 3]))
    a, b = (y, x) if c.draw(st.booleans()) else (x, y)
    fn = {"add": c.b.add, "sub": c.b.sub, "mul": c.b.mul, "max": c.b.maximum, "min": c.b.minimum}[op]
    return fn(a, b)


def _op_unary(c: _Ctx) -> int | None:
    x = c.pick()
    assert x is not None
    kind = c.draw(st.sampled_from(["act", "exp", "positive"]))
    if kind == "act":
        return c.b.unary(c.draw(st.sampled_from(_ACTS)), x)
    if kind == "exp":  # exp only of a bounded value
        return c.b.exp(c.b.unary(c.draw(st.sampled_from(["tanh", "sigmoid"])), x))
    pos = c.b.add(c.b.mul(x, x), 1.0)
    return c.b.unary(c.draw(st.sampled_from(["log", "sqrt", "rsqrt"])), pos)


def _op_softmax(c: _Ctx) -> int | None:
    x = c.pick(lambda s: len(s) >= 1)
    if x is None:
        return None
    rank = len(c.shape(x))
    return c.b.softmax(x, c.draw(st.integers(-rank, rank - 1)))


def _op_norm(c: _Ctx) -> int | None:
    x = c.pick(lambda s: len(s) >= 1)
    return None if x is None else c.layer_norm(x, rms=c.draw(st.booleans()))


def _op_residual_ln(c: _Ctx) -> int | None:
    x = c.pick(lambda s: len(s) >= 2)
    if x is None:
        return None
    branch = c.b.unary(c.draw(st.sampled_from(["gelu", "silu", "tanh"])), c.linear(x, c.shape(x)[-1]))
    s = c.b.add(x, branch) if c.draw(st.booleans()) else c.b.add(branch, x)
    return c.layer_norm(s)


def _op_movement(c: _Ctx) -> int | None:
    x = c.pick(lambda s: len(s) >= 1)
    if x is None:
        return None
    s = c.shape(x)
    kind = c.draw(st.sampled_from(["reshape", "transpose", "narrow", "concat"]))
    if kind == "reshape":
        if len(s) >= 2 and c.draw(st.booleans()):  # merge the two leading dims (or all but last)
            return c.b.reshape(x, (-1, s[-1]) if c.draw(st.booleans()) else (s[0] * s[1], *s[2:]))
        if s[-1] % 2 == 0 and len(s) < 4:  # split the last dim
            return c.b.reshape(x, (*s[:-1], 2, s[-1] // 2))
        return c.b.reshape(x, (*s, 1)) if len(s) < 4 else None
    if kind == "transpose":
        perm = c.draw(st.permutations(range(len(s))))
        return c.b.transpose(x, tuple(perm))
    if kind == "narrow":
        axis = c.draw(st.integers(0, len(s) - 1))
        if s[axis] < 1:
            return None
        start = c.draw(st.integers(0, s[axis] - 1))
        length = c.draw(st.integers(1, s[axis] - start))
        return c.b.narrow(x, axis - len(s) if c.draw(st.booleans()) else axis, start, length)
    axis = c.draw(st.integers(0, len(s) - 1))
    def fits(t: tuple[int, ...]) -> bool:
        return len(t) == len(s) and all(a == b for i, (a, b) in enumerate(zip(t, s, strict=True)) if i != axis)

    others = [v for v in c.pool if fits(c.shape(v))]
    parts = [x, *c.draw(st.lists(st.sampled_from(others), min_size=1, max_size=2))]
    return c.b.concat(parts, axis)


def _op_reduce(c: _Ctx) -> int | None:
    x = c.pick(lambda s: len(s) >= 2)
    if x is None:
        return None
    rank = len(c.shape(x))
    axes = c.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank - 1, unique=True))
    fn = c.draw(st.sampled_from([c.b.reduce_sum, c.b.reduce_mean, c.b.reduce_max]))
    return fn(x, tuple(axes), keepdims=c.draw(st.booleans()))


def _op_where(c: _Ctx) -> int | None:
    x = c.pick()
    assert x is not None
    cond = c.draw(st.sampled_from([c.b.gt, c.b.lt, c.b.ge, c.b.le]))(x, 0.0)
    return c.b.where(cond, x, c.b.mul(x, 0.1))


def _op_attention(c: _Ctx) -> int | None:
    x = c.pick(lambda s: len(s) == 3)
    if x is None:
        return None
    bsz, sq, _ = c.shape(x)
    heads, hd = c.draw(st.sampled_from([(1, 4), (2, 2), (2, 4)]))
    width = heads * hd
    kvsrc = c.pick(lambda s: len(s) == 3 and s[0] == bsz)
    if kvsrc is None or c.draw(st.booleans()):  # a memory with its own length (q_len != kv_len)
        kvsrc = c.input(f"mem{len(c.feeds)}", (bsz, c.draw(st.integers(1, 4)), 4))
    sk = c.shape(kvsrc)[1]
    q, k, v = c.linear(x, width), c.linear(kvsrc, width), c.linear(kvsrc, width)
    kind = c.draw(st.sampled_from(["keep", "keep", "causal", "additive", "none"]))
    if kind == "keep":
        mask = c.keep_mask(bsz, sk)
    elif kind == "additive":
        mask = c.input(f"bias{len(c.feeds)}", (bsz, 1, 1, sk))
    else:
        mask = None
    scale = c.draw(st.sampled_from([None, None, 0.3]))
    return c.b.attention(q, k, v, mask, num_heads=heads, head_dim=hd, mask_kind=kind, scale=scale)


_OPS = (_op_matmul, _op_binary, _op_unary, _op_softmax, _op_norm, _op_residual_ln, _op_movement,
        _op_reduce, _op_where, _op_attention)


@st.composite
def random_graphs(draw: Callable, min_ops: int = 1, max_ops: int = 8) -> GraphCase:
    """A random well-formed graph of `min_ops..max_ops` random op groups over 1-2 float inputs.

    Shapes stay tiny (batch <= 2, seq <= 4, width <= 8). The result is the last value built; extra
    values (sometimes intermediates with other users) are added as outputs.
    """
    c = _Ctx(draw, "random")
    bsz, seq = draw(st.integers(1, 2)), draw(st.integers(1, 4))
    width = draw(st.sampled_from([4, 8]))
    c.pool.append(c.input("x", (bsz, seq, width)))
    if draw(st.booleans()):
        c.pool.append(c.input("y", draw(st.sampled_from([(bsz, seq, width), (seq, width), (width,)]))))
    last = c.pool[0]
    for _ in range(draw(st.integers(min_ops, max_ops))):
        fn = draw(st.sampled_from(_OPS))
        v = fn(c)
        if v is None:
            continue
        c.pool.append(v)
        last = v
        if draw(st.integers(0, 5)) == 0:
            c.extra_outputs.append(v)
    if last == c.pool[0] or c.b.lookup(last).op == Op.INPUT:
        last = c.b.relu(last)
    return c.finish(last)


# ---------------------------------------------------------------------------------------------
# random_transformer_like_graphs
# ---------------------------------------------------------------------------------------------


def _attention_block(c: _Ctx, h: int, mask: int, heads: int, hd: int) -> int:
    """Packed QKV (+bias) -> narrow x3 -> [rope] -> keep-masked attention -> out proj (+bias)."""
    draw = c.draw
    hidden = c.shape(h)[-1]
    width = heads * hd
    biased = draw(st.integers(0, 4)) > 0
    if draw(st.integers(0, 5)) == 0:  # perturbation: separate q, k, v projections
        q, k, v = (c.linear(h, width, bias=biased) for _ in range(3))
    else:
        qkv_mm = c.b.matmul(h, c.weight(hidden, 3 * width))
        qkv = qkv_mm
        if biased:
            bv = c.param((3 * width,), "small")
            qkv = c.b.add(bv, qkv_mm) if draw(st.booleans()) else c.b.add(qkv_mm, bv)
        if draw(st.integers(0, 6)) == 0:
            c.extra_outputs.append(qkv_mm)
        axis = draw(st.sampled_from([2, -1]))
        q, k, v = (c.b.narrow(qkv, axis, i * width, width) for i in range(3))
        if draw(st.integers(0, 7)) == 0:  # perturbation: q and k slices swapped
            q, k = k, q
    if draw(st.integers(0, 4)) == 0:  # RoPE on q and k (FusedAttentionBlock has_rope)
        seq = c.shape(h)[1]
        ang = np.arange(seq)[:, None] / (10000.0 ** (np.arange(hd // 2)[None, :] * 2.0 / hd))
        cos, sin = c.param((seq, hd // 2)), c.param((seq, hd // 2))
        c.weights[c.b.lookup(cos).name] = np.cos(ang).astype(np.float32)
        c.weights[c.b.lookup(sin).name] = np.sin(ang).astype(np.float32)
        q, k = c.b.rope(q, cos, sin, hd), c.b.rope(k, cos, sin, hd)
    att = c.b.attention(q, k, v, mask, num_heads=heads, head_dim=hd, mask_kind="keep")
    if draw(st.integers(0, 6)) == 0:
        c.extra_outputs.append(att)
    return c.linear(att, hidden, bias=biased, swap=draw(st.booleans()))


def _residual_ln(c: _Ctx, x: int, skip: int) -> int:
    s = c.b.add(skip, x) if c.draw(st.booleans()) else c.b.add(x, skip)
    if c.draw(st.integers(0, 6)) == 0:  # perturbation: the residual sum has a second user
        c.extra_outputs.append(s)
    return c.layer_norm(s, rms=c.draw(st.integers(0, 5)) == 0)


def _ffn(c: _Ctx, h: int, inter: int) -> int:
    draw = c.draw
    hidden = c.shape(h)[-1]
    if draw(st.integers(0, 4)) == 0:  # SwiGLU: packed [.., 2*inter] -> silu(gate) * up
        packed = c.b.matmul(h, c.weight(hidden, 2 * inter))
        up, gate = c.b.narrow(packed, 2, 0, inter), c.b.narrow(packed, 2, inter, inter)
        if draw(st.booleans()):
            up, gate = gate, up
        mid = c.b.mul(c.b.silu(gate), up) if draw(st.booleans()) else c.b.mul(up, c.b.silu(gate))
        return c.b.matmul(mid, c.weight(inter, hidden))
    biased = draw(st.integers(0, 5)) > 0
    mm = c.b.matmul(h, c.weight(hidden, inter))
    pre = mm
    if biased:
        bv = c.param((inter,), "small")
        pre = c.b.add(bv, mm) if draw(st.booleans()) else c.b.add(mm, bv)
    act = draw(st.sampled_from(["gelu", "gelu", "gelu_tanh", "silu", "relu"]))
    mid = c.b.unary(act, pre)
    extra = draw(st.integers(0, 6))
    if extra == 0:  # perturbation: the pre-activation value has another user (blocks act fusion)
        mid = c.b.add(mid, c.b.mul(pre, 0.01))
    elif extra == 1:
        c.extra_outputs.append(mm)
    return c.linear(mid, hidden, bias=biased, swap=draw(st.booleans()))


@st.composite
def random_transformer_like_graphs(draw: Callable, max_layers: int = 2) -> GraphCase:
    """1..`max_layers` post-norm transformer layers on `hidden [B, S, heads*head_dim]` with a keep
    mask `[B, S]` (some padded positions), with random perturbations (see the module docstring)."""
    c = _Ctx(draw, "transformer_like")
    bsz, seq = draw(st.integers(1, 2)), draw(st.integers(1, 4))
    heads, hd = draw(st.sampled_from([(1, 4), (2, 2), (2, 4)]))
    hidden = heads * hd
    inter = draw(st.sampled_from([8, 16]))
    h = c.input("hidden", (bsz, seq, hidden))
    mask = c.keep_mask(bsz, seq)
    for layer in range(draw(st.integers(1, max_layers))):
        with c.b.scope(f"layer.{layer}"):
            with c.b.scope("attention"):
                att = _attention_block(c, h, mask, heads, hd)
                h1 = _residual_ln(c, att, h)
            with c.b.scope("ffn"):
                out = _ffn(c, h1, inter)
                h = _residual_ln(c, out, h1)
    return c.finish(h)
