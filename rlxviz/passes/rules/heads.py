"""Attention with the heads folded into the batch (BART / Marian / T5 eager, fairseq): `bmm` on `[B*H, S, d]`.

The exporter writes `q3 = reshape(q4, [B*H, S, d])` (q4 `[B, H, S, d]`), `bmm(q3, transpose(k3, [0, 2, 1]))`,
a softmax over a rank-3 tensor, `bmm(p3, v3)` and `reshape(o3, [B, H, S, d])` back (the mask is often added on
a `[B, H, S, S]` view in between). `unfold_heads` lifts that chain to the 4-D head layout, so `fuse_sdpa`'s rule
sees the same attention as the 4-D form:

* a fold `reshape(x4 [B, H, a, b] -> [B*H, a, b])` is read as x4;
* `transpose(f, [0, 2, 1])` of a folded f -> `transpose(x4, [0, 1, 3, 2])`;
* `matmul(f1, f2)` of two folded operands with the same (B, H) -> `matmul(x4_1, x4_2)`;
* `softmax(f, axis=-1)` (or axis 2) -> `softmax(x4, axis=-1)`;
* `mul` / `div` of a folded value by a 0-d operand (the score scale) -> the same op on x4;
* `add(f, bias)` with a `[B*H, a, b]` bias (T5's position bias; `a` or `b` may be 1, BLOOM's ALiBi `[B*H, 1, Sk]`)
  -> `add(x4, reshape(bias, [B, H, a, b]))`, and
  with a `[a, b]` or `[b]` bias -> `add(x4, bias)` (it broadcasts over the leading axes either way);
* an unfold `reshape(f -> [B, H, a, b])` of a lifted value -> the lifted 4-D value itself.

Validity (numbers equal for every input): the fold merges the two leading axes row-major (batch index
`b * H + h`), and each lifted op acts on each leading index alone (batched matmul, a swap of the last two axes,
a softmax over the last axis, a product with one scalar, a sum with a bias folded the same way or broadcast
over the leading axes), so `op3(reshape(x4)) == reshape(op4(x4))` element
for element with the same arithmetic per row. A lifted value read by anything else keeps its 3-D form
(`reshape(op4, [B*H, a, b])`).
The rewrite runs only on a chain that holds a softmax and two matmuls (an attention; the softmax folded, or a 4-D
softmax whose probabilities are folded into the second bmm, as DeBERTa and BLOOM write it); it is reported as a
`fuse_sdpa.unfold_heads` match per softmax (the `UNFOLD_HEADS` rule, run by the engine as the stage
`fuse_sdpa/unfold_heads`).
"""

from __future__ import annotations

from dataclasses import dataclass
from weakref import WeakKeyDictionary

from ...ir import Graph, Node, Op, Rewriter
from ...ir.identity import IdentityMap
from ..engine import rule_pass
from ..guard import Ctx
from ..pattern import P
from ..rule import QUIET, Fail, Rule, reports
from ..trace import Match

RULE = "fuse_sdpa.unfold_heads"


def _fold_source(g: Graph, n: Node) -> tuple[int, int, int] | None:
    """`(x4, B, H)` when `n` is `reshape(x4 [B, H, a, b] -> [B*H, a, b])`, else None."""
    if n.op != Op.RESHAPE or n.rank != 3:
        return None
    x = g[n.inputs[0]]
    if x.rank != 4 or x.shape[2:] != n.shape[1:] or x.shape[0] * x.shape[1] != n.shape[0]:
        return None
    return x.id, x.shape[0], x.shape[1]


def _other(n: Node, i: int) -> int:
    """`n`'s operand that is not `i`."""
    return n.inputs[1] if n.inputs[0] == i else n.inputs[0]


def _bias_fits(bias: tuple[int, ...], scores: tuple[int, ...]) -> bool:
    """A bias the lift can take: `[B*H, a|1, b|1]` (folded the same way; BLOOM's ALiBi is `[B*H, 1, Sk]`), or
    `[a, b]` / `[b]` broadcast over the leading axes."""
    if bias in (scores[1:], scores[2:]):
        return True
    return len(bias) == 3 and bias[0] == scores[0] and all(d in (1, s) for d, s in zip(bias[1:], scores[1:],
                                                                                      strict=True))


def _plan(g: Graph) -> tuple[dict[int, tuple[int, int]], dict[int, str], dict[int, int]]:
    """Which nodes lift: `folded` (node -> (B, H)) for folds and lifted ops, `kind` (node -> 'fold', 'transpose',
    'matmul', 'softmax', 'scalar', 'bias'), `unfold` (reshape node -> the folded node it unfolds)."""
    folded: dict[int, tuple[int, int]] = {}
    kind: dict[int, str] = {}
    unfold: dict[int, int] = {}
    for n in g:
        src = _fold_source(g, n)
        if src is not None:
            folded[n.id], kind[n.id] = src[1:], "fold"
            continue
        ins = [i for i in n.inputs if i in folded]
        if not ins:
            continue
        bh = folded[ins[0]]
        if n.op == Op.TRANSPOSE and tuple(n.attrs["perm"]) == (0, 2, 1):
            folded[n.id], kind[n.id] = bh, "transpose"
        elif n.op == Op.MATMUL and len(ins) == 2 and len(n.inputs) == 2 and folded[ins[1]] == bh and n.rank == 3:
            folded[n.id], kind[n.id] = bh, "matmul"
        elif n.op == Op.SOFTMAX and int(n.attrs.get("axis", -1)) in (-1, 2):
            folded[n.id], kind[n.id] = bh, "softmax"
        elif n.op in (Op.MUL, Op.DIV) and len(ins) == 1 and len(n.inputs) == 2 and all(
                g[i].rank == 0 for i in n.inputs if i not in folded):
            folded[n.id], kind[n.id] = bh, "scalar"
        elif n.op == Op.ADD and len(ins) == 1 and len(n.inputs) == 2 and n.shape == g[ins[0]].shape and (
                _bias_fits(g[_other(n, ins[0])].shape, n.shape)):
            folded[n.id], kind[n.id] = bh, "bias"
        elif n.op == Op.RESHAPE and kind[ins[0]] != "fold" and n.shape == (*bh, *g[ins[0]].shape[1:]):
            unfold[n.id] = ins[0]
    return folded, kind, unfold


def _softmaxes(g: Graph, kind: dict[int, str]) -> list[int]:
    """The softmaxes of the folded chains: a folded one, then a 4-D one whose probabilities are folded into the second
    bmm (DeBERTa, BLOOM: the scores unfolded for the mask, then folded again)."""
    out = [i for i, k in kind.items() if k == "softmax"]
    return out + [g[i].inputs[0] for i, k in kind.items() if k == "fold" and g[g[i].inputs[0]].op == Op.SOFTMAX]


@dataclass(frozen=True)
class _Plan:
    """`_plan` of one graph, with its folded chains' softmaxes and whether the graph holds an attention to lift
    (a softmax and two folded matmuls)."""

    folded: dict[int, tuple[int, int]]
    kind: dict[int, str]
    unfold: dict[int, int]
    softmaxes: tuple[int, ...]
    attention: bool


_PLANS: IdentityMap[Graph, _Plan] = IdentityMap(limit=2)
"""The plan of the graph a sweep matches on (one plan per snapshot: every candidate softmax reads the same one)."""


def plan(g: Graph) -> _Plan:
    """The folded-heads plan of `g` (`_plan`), made once per graph snapshot."""
    hit = _PLANS.get(g)
    if hit is None:
        folded, kind, unfold = _plan(g)
        soft = _softmaxes(g, kind)
        hit = _PLANS[g] = _Plan(folded, kind, unfold, tuple(soft),
                                bool(soft) and sum(k == "matmul" for k in kind.values()) >= 2)
    return hit


def _lift(g: Graph, rw: Rewriter, p: _Plan) -> None:
    """Rewrite every folded chain of `p` to the 4-D head layout with `rw` (the module doc's list)."""
    folded, kind, unfold = p.folded, p.kind, p.unfold
    four: dict[int, int] = {}  # folded node -> its 4-D value
    lifted = {i for i, k in kind.items() if k != "fold"}
    for n in g:
        k = kind.get(n.id)
        if k == "fold":
            four[n.id] = four.get(n.inputs[0], n.inputs[0])
            continue
        if k is None:
            continue
        with rw.provenance([n.id]):
            if k == "transpose":
                four[n.id] = rw.transpose(four[n.inputs[0]], (0, 1, 3, 2))
            elif k == "matmul":
                four[n.id] = rw.matmul(four[n.inputs[0]], four[n.inputs[1]])
            elif k == "bias":
                f = next(i for i in n.inputs if i in folded)
                other = _other(n, f)
                if g[other].rank == 3:  # a [B*H, a, b] bias: the same fold, read back as [B, H, a, b]
                    other = rw.reshape(other, (*folded[f], *g[other].shape[1:]))
                pair = (four[f], other) if n.inputs[0] == f else (other, four[f])
                four[n.id] = rw.emit(Op.ADD, list(pair))  # node ids: rw.add would read a plain int as a number
            elif k == "scalar":
                four[n.id] = rw.emit(n.op, [four.get(i, i) for i in n.inputs])
            else:
                four[n.id] = rw.softmax(four[n.inputs[0]], -1)
    for u, src in unfold.items():
        rw.replace(u, four[src])
    done = lifted | set(unfold)
    for i in folded:
        if i in unfold:
            continue
        others = [u for u in g.users(i) if u.id not in done] or g.is_output(i)
        if i in lifted:
            if others:
                with rw.provenance([i]):
                    rw.replace(i, rw.reshape(four[i], g[i].shape))
            else:
                rw.remove([i])
        elif not others:  # a fold read only by lifted ops
            rw.remove([i])


@reports(reads=("softmax",))
def _folded_softmax(c: Ctx) -> Fail | None:
    """Quiet unless the softmax is a folded chain's (`_softmaxes`): a folded softmax, or a 4-D one whose
    probabilities are folded into the second bmm. Any other softmax is no candidate."""
    return None if c.id("softmax") in plan(c.graph).softmaxes else QUIET


@reports(reads=("softmax",))
def _attention_to_lift(c: Ctx) -> Fail | None:
    """Quiet unless the graph's folded chains hold two matmuls beside the softmax (an attention, not a lone
    folded softmax): without them there is nothing for `fuse_sdpa.hf_attention` to read in the 4-D layout."""
    return None if plan(c.graph).attention else QUIET


_LIFTED: WeakKeyDictionary[Rewriter, bool] = WeakKeyDictionary()
"""The rewriters (one per sweep) whose graph's folded chains were lifted already."""


def _unfold(c: Ctx, rw: Rewriter) -> None:
    """Lift the graph's folded chains once per sweep (with its first match), and nothing for the later matches of the
    sweep: the lift's region is the graph's whole folded-heads plan, not the match (see `UNFOLD_HEADS`)."""
    if not _LIFTED.get(rw):
        _LIFTED[rw] = True
        _lift(c.graph, rw, plan(c.graph))


UNFOLD_HEADS = Rule(RULE, P(Op.SOFTMAX, name="softmax"), steps=(_folded_softmax, _attention_to_lift),
                    result="softmax", absorb=("softmax",), rewrite=_unfold,
                    doc="heads folded into the batch (bmm on [B*H, S, d]) -> the 4-D head layout [B, H, S, d], one "
                        "match per softmax")
"""The lift as a guarded rule. Its anchor is each folded chain's softmax and its steps are quiet (a softmax of no
folded chain, or a graph whose folded chains hold no attention, is no candidate: nothing to refuse). The rewrite's
region cannot be the match: a chain spans the mask added on a `[B, H, S, S]` view between an unfold and a fold (and
DeBERTa's / BLOOM's 4-D softmax between two folds), and `_plan` lifts every folded chain of the graph, whichever
attention it feeds; so the first match of a sweep lifts them all, the others record their softmax (each a
`fuse_sdpa.unfold_heads` match, no product: `fused` is None)."""

UNFOLD_HEADS_PASS = rule_pass("fuse_sdpa", [UNFOLD_HEADS], "heads folded into the batch lifted to [B, H, S, d]")
"""The rule as a stage of `fuse_sdpa` (`fuse_sdpa/unfold_heads`), recording under `fuse_sdpa`."""


def unfold_heads(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with every folded-heads attention chain lifted to the 4-D head layout (see the module doc), and one
    `Match` per chain's softmax; `(g, [])` when there is none. The `UNFOLD_HEADS` rule run by the engine."""
    return UNFOLD_HEADS_PASS.rewrite(g)


__all__ = ["RULE", "UNFOLD_HEADS", "UNFOLD_HEADS_PASS", "plan", "unfold_heads"]
