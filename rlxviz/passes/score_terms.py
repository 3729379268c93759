"""Extra terms on attention scores, classified by kind: what a model adds to `QK^T * scale + mask`.

`fuse_sdpa` packs `softmax(QK^T * scale + mask) @ V`. A model may put more on its scores; this module names each
term by its kind, so `explain` says *which* term of the model's own keeps attention unpacked (or rides along as
the packed attention's additive operand):

* `soft-cap` (Gemma 2, Grok): `tanh(s / c) * c` (or `tanh(s * (1/c)) * c`), `c` a scalar constant: the scores are
  squashed into `(-c, c)`; the attention op has no cap, so it blocks packing.
* `sinks` (GPT-OSS, StreamingLLM): a per-head logit concatenated to the scores on the key axis before the softmax,
  whose column is sliced away after it: softmax over `Sk + 1` columns; the attention op normalizes over `Sk`, so it
  blocks packing.
* `content-position term` (DeBERTa's disentangled attention): an additive term computed by a matmul (Q's heads
  times position keys, gathered by relative distance): the term reads Q itself, so it blocks packing.
* `relative position bias` (T5, MPNet): an additive `[.., heads, Sq, Sk]` term gathered from a learned
  `[buckets, heads]` table: packs as the attention's additive operand.
* `ALiBi` (BLOOM, MPT): an additive term made by multiplying a per-head slope (a constant or parameter holding
  one number per head) with key positions: packs as the additive operand.
* `per-head bias` / `position band`: an additive term with one row per head, or one row per query (a causal or
  sliding-window band, a position bias) of no form above: packs as the additive operand.

A max subtraction `s - reduce_max(s)` (softmax is shift-invariant) and a where-mask are read through; a scalar
scale is the attention's `scale`. Reading only: nothing is rewritten here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir import Graph, Node, Op
from .pattern import const_value, is_const

SOFT_CAP, SINKS, CONTENT_POSITION = "soft-cap", "sinks", "content-position term"
RELATIVE_BIAS, ALIBI, PER_HEAD, BAND = "relative position bias", "ALiBi", "per-head bias", "position band"
BLOCKING = frozenset({SOFT_CAP, SINKS, CONTENT_POSITION})
"""Kinds the attention op cannot take: the attention stays as primitives and `explain` names the term."""

_THROUGH = frozenset({Op.RESHAPE, Op.CAST, Op.EXPAND, Op.TRANSPOSE})


@dataclass(frozen=True)
class ScoreTerm:
    """One extra term on the scores.

    Attributes:
        kind: one of the module's kinds (`soft-cap`, `sinks`, `ALiBi`, ...).
        formula: the term as written, e.g. `tanh(s / 50) * 50`.
        node: the node that applies the term to the scores (the cap's mul, the concat, the add's operand).
        nodes: the term's nodes, `node` first.
    """

    kind: str
    formula: str
    node: int
    nodes: tuple[int, ...]

    @property
    def blocks(self) -> bool:
        """True when the attention op cannot take this term (`BLOCKING`)."""
        return self.kind in BLOCKING

    def describe(self) -> str:
        """`soft-cap tanh(s / 50) * 50 (nodes %78, %77, %76)`."""
        return f"{self.kind} {self.formula} (nodes {', '.join(f'%{i}' for i in self.nodes)})"


def _scalar(g: Graph, i: int) -> float | None:
    n = g[i]
    if not is_const(n) or math.prod(n.shape) != 1:
        return None
    v = const_value(n)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _nonconst(g: Graph, n: Node) -> int | None:
    """The one non-constant operand of a binary op with one scalar-constant operand."""
    a, b = n.inputs
    if _scalar(g, b) is not None and _scalar(g, a) is None:
        return a
    if _scalar(g, a) is not None and _scalar(g, b) is None and n.op == Op.MUL:
        return b
    return None


def _soft_cap(g: Graph, n: Node) -> tuple[ScoreTerm, int] | None:
    """`tanh(s / c) * c` or `tanh(s * k) * c` with `k * c == 1` (to 1e-6): the term and `s`."""
    if n.op != Op.MUL or len(n.inputs) != 2:
        return None
    t = next((g[i] for i in n.inputs if g[i].op == Op.TANH), None)
    cap = _scalar(g, next((i for i in n.inputs if t is None or i != t.id), n.inputs[0]))
    if t is None or cap is None or cap == 0:
        return None
    inner = g[t.inputs[0]]
    if inner.op not in (Op.DIV, Op.MUL) or (s := _nonconst(g, inner)) is None:
        return None
    k = _scalar(g, next(i for i in inner.inputs if i != s))
    per = 1.0 / k if inner.op == Op.MUL and k else k
    if per is None or abs(per - cap) > 1e-6 * abs(cap):
        return None
    return ScoreTerm(SOFT_CAP, f"tanh(s / {cap:g}) * {cap:g}", n.id, (n.id, t.id, inner.id)), s


def _reaches_matmul(g: Graph, i: int, depth: int = 6) -> bool:
    """`i` is, or reaches through elementwise ops, reshapes and where, a matmul: the scores' side of an add."""
    n = g[i]
    if n.op == Op.MATMUL:
        return True
    if depth == 0 or n.op not in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.TANH, Op.WHERE, Op.CONCAT, Op.RESHAPE):
        return False
    return any(_reaches_matmul(g, j, depth - 1) for j in n.inputs)


def _term_nodes(g: Graph, i: int, limit: int = 40) -> list[int]:
    out, todo = [], [i]
    while todo and len(out) < limit:
        j = todo.pop(0)
        if j in out:
            continue
        out.append(j)
        if g[j].op not in (Op.INPUT, Op.PARAM, Op.CONST):
            todo.extend(g[j].inputs)
    return out


def _per_head(n: Node, heads: int) -> bool:
    """A constant or parameter holding one number per head (`[H]`, `[H, 1, 1]`, `[1, H, 1, 1]`, `[B*H, 1, 1]`)."""
    size = math.prod(n.shape)
    return n.op in (Op.CONST, Op.PARAM) and heads > 1 and size >= heads and size % heads == 0 \
        and sum(d > 1 for d in n.shape) == 1


def additive_term(g: Graph, i: int, heads: int) -> ScoreTerm | None:
    """The kind of the additive score term `i` (the operand added to the scores), or None for a padding mask
    (one row per batch, varying only along the key axis). `heads` is the scores' head count."""
    n = g[i]
    nodes = _term_nodes(g, i)
    if any(g[j].op == Op.MATMUL for j in nodes):
        mm = next(j for j in nodes if g[j].op == Op.MATMUL)
        return ScoreTerm(CONTENT_POSITION, f"a matmul (%{mm}) inside the term added to the scores", i, tuple(nodes))
    for j in nodes:
        m = g[j]
        if m.op == Op.GATHER and g[m.inputs[0]].op in (Op.PARAM, Op.CONST) and g[m.inputs[0]].rank == 2 \
                and heads in g[m.inputs[0]].shape:
            table = g[m.inputs[0]]
            return ScoreTerm(RELATIVE_BIAS, f"a learned {list(table.shape)} table gathered by relative position "
                                            f"(%{j})", i, tuple(nodes))
    for j in nodes:
        m = g[j]
        if m.op == Op.MUL and len(m.inputs) == 2 and any(_per_head(g[k], heads) for k in m.inputs):
            slope = next(k for k in m.inputs if _per_head(g[k], heads))
            return ScoreTerm(ALIBI, f"per-head slopes %{slope} times key positions (%{j})", i, tuple(nodes))
    shape = (1,) * max(0, 4 - n.rank) + tuple(n.shape)
    if shape[-3] > 1:
        return ScoreTerm(PER_HEAD, f"{n.op.value} {list(n.shape)}: one row per head", i, tuple(nodes))
    if shape[-2] > 1:
        return ScoreTerm(BAND, f"{n.op.value} {list(n.shape)}: one row per query", i, tuple(nodes))
    return None


def mask_input(g: Graph, i: int, limit: int = 40) -> Node | None:
    """The attention-mask input (`Node.is_mask_input`) the additive score term `i` is built from, or None: the
    term is computed from graph inputs and constants only, each input it reads a mask (no parameter, so nothing
    learned; no matmul, so nothing read from Q or K), within `limit` nodes. Such a term is a mask the model applies
    (Hugging Face's `(1 - attention_mask) * finfo.min`, an additive mask given as an input), not a bias."""
    nodes = _term_nodes(g, i, limit)
    if len(nodes) >= limit or any(g[j].op in (Op.PARAM, Op.MATMUL) for j in nodes):
        return None
    inputs = [g[j] for j in nodes if g[j].op == Op.INPUT]
    return inputs[0] if inputs and all(n.is_mask_input for n in inputs) else None


def _sinks(g: Graph, n: Node, softmax: Node) -> tuple[ScoreTerm, int] | None:
    """`concat([s, sink], axis=-1)` with a narrow `sink` column: the term and `s`."""
    if n.op != Op.CONCAT or len(n.inputs) != 2 or n.attrs.get("axis", -1) not in (-1, n.rank - 1):
        return None
    s, sink = (g[i] for i in n.inputs)
    if not _reaches_matmul(g, s.id) or sink.shape[-1] >= s.shape[-1]:
        return None
    sliced = [u for u in g.users(softmax.id) if u.op == Op.NARROW]
    cut = f", sliced away by %{sliced[0].id}" if sliced else ""
    return (ScoreTerm(SINKS, f"{sink.shape[-1]} sink logit(s) per head concatenated to the scores before the "
                             f"softmax{cut}", n.id, (n.id, sink.id, *(u.id for u in sliced))), s.id)


def score_terms(g: Graph, softmax: Node) -> list[ScoreTerm]:
    """The extra terms on the scores read by `softmax`, outermost first (see the module doc for the kinds).
    Walks from the softmax's input down to `Q @ K^T` through max subtractions, where-masks, scalar scales and adds;
    an add's operand that does not reach the matmul is classified by `additive_term`."""
    heads = softmax.shape[1] if softmax.rank == 4 else 0
    out: list[ScoreTerm] = []
    i = softmax.inputs[0]
    for _ in range(12):
        n = g[i]
        if n.op == Op.MATMUL:
            break
        if (cap := _soft_cap(g, n)) is not None or (cap := _sinks(g, n, softmax)) is not None:
            out.append(cap[0])
            i = cap[1]
        elif n.op == Op.SUB and g[n.inputs[1]].op == Op.REDUCE_MAX and g[n.inputs[1]].inputs[0] == n.inputs[0]:
            i = n.inputs[0]  # s - max(s): softmax is shift-invariant
        elif n.op == Op.WHERE:
            i = n.inputs[1]
        elif n.op in (Op.MUL, Op.DIV) and (s := _nonconst(g, n)) is not None:
            i = s
        elif n.op == Op.ADD:
            a, b = n.inputs
            side, term = (a, b) if _reaches_matmul(g, a) else (b, a)
            if not _reaches_matmul(g, side):
                break
            if (t := additive_term(g, term, heads)) is not None:
                out.append(t)
            i = side
        elif n.op in _THROUGH:
            i = n.inputs[0]
        else:
            break
    return out


__all__ = ["ALIBI", "BAND", "BLOCKING", "CONTENT_POSITION", "PER_HEAD", "RELATIVE_BIAS", "SINKS", "SOFT_CAP",
           "ScoreTerm", "additive_term", "mask_input", "score_terms"]
