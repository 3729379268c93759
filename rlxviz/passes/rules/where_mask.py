"""`where`-based boolean attention masks in `fuse_sdpa`: `softmax(where(keep, scores, fill))`.

GPT-2-era and hand-written attention masks the scores with `where(keep, scores, finfo(f32).min)` instead of
adding a bias. `attention(mask="keep")` is defined as exactly that (`where(mask > 0.5, scores, finfo(f32).min)`,
rlxviz.runtime.reference), so the rewrite to a keep mask `cast(reshape(keep, [B, Sk]), f32)` is exact when:

* `where_mask_fill`: the fill is `finfo(dtype).min` in the scores' dtype (f32: `finfo(f32).min`; bf16 is
  refused, its rounding of the fill is not checked here). Another fill (-1e4, -1e9, -inf) gives different numbers
  where a kept score is within ~104 of the fill, and -inf turns a fully masked row into NaN where the keep
  mask gives uniform weights;
* per key (`keep`): the condition is a bool `[B, 1, 1, Sk]` padding mask (one value per key), or such a
  mask broadcast along the head and query axes only: `expand`s (numpy broadcasting) and `reshape`s that only insert
  or drop size-1 axes of a bool per-key source `[B, 1, 1, Sk]` or `[B, Sk]` (Hugging Face's SDPA-path padding mask
  `expand(mask[:, None, None, :], [B, 1, Sq, Sk])`). Valid because the trace follows each source axis to the
  condition: when the source's batch axis lands on the condition's axis 0, its key axis on axis 3, and axes 1 and 2
  (heads, queries) carry no source axis (they are size 1 or broadcast), then cond[b, h, q, k] == source[b, k] at
  every head and query position, so `where(cond, s, fill) == where(source[:, None, None, :], s, fill)` element for
  element, and the keep operand is `cast(reshape(source, [B, Sk]), f32)`. The condition must also broadcast
  against the scores without enlarging them (axes 1 and 2 are 1 or the scores' size). A mask that varies over
  queries (causal `[1, 1, Sq, Sk]`, any 2-D `[Sq, Sk]` mask, expanded or not) or heads has no keep-mask form, and
  the refusal names the condition's axis that varies.

A condition that varies over queries or heads (transformers' combined causal + padding mask `[B, 1, Sq, Sk]`, a
sliding band, any constant causal table) becomes the attention's **additive** operand `where(cond, 0, fill)`
instead (`mask="additive"`, `where_mask_additive` says so). Exact under the same two guards: where the condition
holds, `s + 0 == s`; where it does not, `s + fill` rounds to `fill` for every |s| < 2^103 (~1e31: f32 min's ulp is
2^104), the value the unfused where writes there, so softmax sees the same row (a fully masked row is uniform in
both). The condition cannot enlarge the scores: they are the full `[B, heads, Sq, Sk]` of the matched matmul and the
where is rank 4 (the anchor), so a bool condition broadcasting against them is no larger.

Scores that carry a term of the model's own before the where (`where(cond, s + bias, fill)`: BLOOM's ALiBi, or
the padding mask's `(1 - m) * finfo.min` added before Llama 4's chunked where) take the one additive operand
`where(cond, bias, fill)` (`biased_operand`), never `bias + where(cond, 0, fill)`: that sum adds two `finfo.min`
fills where a padded key is also masked by the condition and overflows to -inf, so a fully masked row turns NaN or
attends to other keys than the unfused graph's uniform row. Exact under the same condition as above and nothing
on the bias: where the condition holds the attention adds `bias` to `s` as the unfused add does (`s + bias`, the
same op in the same dtype); where it does not, `s + fill` rounds to `fill` for |s| < 2^103 in f32 (half the ulp
of `finfo(f32).min`; in f16 |s| < 16, half the ulp of -65504), the value the unfused where writes there.

In f16 the fill's ulp is 32, so `s + finfo(f16).min` rounds to the fill only for |s| < 16 (and overflows to
-inf below -16): rows that keep a key still match (`exp(fill - max)` and `exp(s + fill - max)` are both 0), but a
fully masked row, uniform under the where, is not under the operand. Guard `where_mask_rows` (illegal) takes the
additive form in such a dtype only where no row can be fully masked: no term added before the where, no nested
where, and a constant condition (through expands and reshapes) with a kept key in every row (causal, chunked,
banded tables). A per-key condition takes the keep mask, exact in every dtype.

Two where-masks one after the other, `where(cond, where(cond2, s, fill2), fill)` (torch.onnx's padding mask
`s + where(keep, 0, min)`, made a where by `canonicalize_exported.where_bias`, under a chunked or causal where), take
the one additive operand `where(cond, where(cond2, 0, fill2), fill)` (`nested_operand`). Exact when both fills are
the lowest finite value (`where_mask_fill` checks both): where both conditions hold `s + 0 == s`; where either does
not, `s + fill` rounds to that fill (|s| < 2^103 in f32), the value the unfused wheres write.

Validity of `uninvert_where` (the stage `fuse_sdpa/uninvert_where`, numbers equal for every input, bit for bit): it
writes `where(masked, fill, scores)` as `where(eq(masked, false), scores, fill)`; for a bool condition
`eq(c, false)` is `not c` element for element, and `where(c, f, x) == where(not c, x, f)` everywhere. The mask
rewrites above are exact under the guards each paragraph names.
"""

from __future__ import annotations

import numpy as np

from ...ir import DType, Graph, Node, Op, Rewriter
from ..engine import rule_pass
from ..guard import ILLEGAL, NOT_RECOGNIZED, Ctx, Guard, guard
from ..pattern import P, const_value, describe, is_const
from ..rule import QUIET, Fail, Rule, reports
from ..trace import Match

NEG = float(np.finfo(np.float32).min)


def where_scores(scaled: P) -> P:
    """`where(cond, scaled_scores, fill)` with a scalar-constant fill."""
    return P(Op.WHERE, P.var("mask_cond"), scaled, P.var("mask_fill", where=is_const, what="a scalar constant"),
             name="mask_where")


def inner_where(scaled: P) -> P:
    """`where(cond2, scaled_scores, fill2)` under the where-mask (`where_scores`): two masks applied one after the
    other (torch.onnx's padding `s + where(keep, 0, min)` made a where by `canonicalize_exported.where_bias`, then
    a chunked or causal where)."""
    return P(Op.WHERE, P.var("inner_cond"), scaled,
             P.var("inner_fill", where=is_const, what="a scalar constant"), name="inner_where")


def _size1_reshape(n: Node, src: Node) -> bool:
    """A reshape that only inserts or drops size-1 axes (same element order, same non-1 sizes in order)."""
    return n.op == Op.RESHAPE and [d for d in n.shape if d != 1] == [d for d in src.shape if d != 1]


def _chain(g: Graph, nid: int) -> list[Node]:
    """The condition, then what it is an `expand` / size-1 `reshape` of, down to the first other node."""
    out = [g[nid]]
    while out[-1].op in (Op.EXPAND, Op.RESHAPE) and out[-1].inputs:
        src = g[out[-1].inputs[0]]
        if out[-1].op == Op.RESHAPE and not _size1_reshape(out[-1], src):
            break
        out.append(src)
    return out


def _roles(chain: list[Node], i: int) -> tuple[int | None, ...]:
    """For each axis of the condition (`chain[0]`), the axis of `chain[i]` its index follows, or None where
    the condition is constant along it (size 1 or broadcast)."""
    src = chain[i]
    roles: list[int | None] = [a if d != 1 else None for a, d in enumerate(src.shape)]
    for j in range(i - 1, -1, -1):
        prev, n = chain[j + 1], chain[j]
        if n.op == Op.RESHAPE:
            carried = iter(r for r, d in zip(roles, prev.shape, strict=True) if d != 1)
            roles = [next(carried) if d != 1 else None for d in n.shape]
        else:  # expand: numpy broadcasting, the input right-aligned
            off = n.rank - prev.rank
            roles = [None if a < off or d == 1 or prev.shape[a - off] != d else roles[a - off]
                     for a, d in enumerate(n.shape)]
    return tuple(roles)


def _dims(c: Ctx) -> tuple[int, int]:
    return c["q_reshape"].shape[0], c["k_reshape"].shape[1]


def per_key_source(c: Ctx) -> int | None:
    """The bool per-key mask (`[B, 1, 1, Sk]` or `[B, Sk]`) the where condition equals at every head and query
    position, or None (module docstring, per key)."""
    b, sk = _dims(c)
    cond, where = c["mask_cond"], c["mask_where"]
    scores = c.graph[where.inputs[1]]
    if (cond.dtype != DType.bool or cond.rank != 4 or (cond.shape[0], cond.shape[3]) != (b, sk)
            or where.shape != scores.shape or any(cond.shape[a] not in (1, where.shape[a]) for a in (1, 2))):
        return None
    chain = _chain(c.graph, c.id("mask_cond"))
    for i in range(len(chain) - 1, -1, -1):  # the deepest one: the expands and reshapes above it become dead
        src = chain[i]
        if src.shape not in ((b, sk), (b, 1, 1, sk)):
            continue
        if _roles(chain, i) == (0 if b != 1 else None, None, None, src.rank - 1 if sk != 1 else None):
            return src.id
    return None


def _per_key(c: Ctx) -> bool:
    return per_key_source(c) is not None


def is_additive(c: Ctx) -> bool:
    """The where-mask is taken as an additive operand: it is not one value per batch row and key, or the scores carry
    a term of the model's own before it (`bias_add`: the operand is `bias + where(cond, 0, fill)`)."""
    return "bias_add" in c or "inner_where" in c or not _per_key(c)


_AXES = ("batch", "head", "query", "key")


def _why_not_per_key(c: Ctx) -> str:
    b, sk = _dims(c)
    cond = c["mask_cond"]
    head = f"the where condition {c.d('mask_cond')} is {cond.dtype}{list(cond.shape)}"
    need = (f"a keep mask needs bool [{b}, 1, 1, {sk}] (one value per key), or an expand of one along the head "
            f"and query axes only")
    chain = _chain(c.graph, c.id("mask_cond"))
    if cond.dtype != DType.bool or cond.rank != 4:
        return f"{head}; {need}"
    src = chain[-1]
    roles = _roles(chain, len(chain) - 1)
    varies = [_AXES[a] for a in (1, 2) if roles[a] is not None]
    via = f", broadcast from {describe(src, 'its source')} {src.dtype}{list(src.shape)}," if len(chain) > 1 else ","
    if varies:
        return f"{head}{via} which varies along the {' and '.join(varies)} axis; {need}"
    return f"{head}{via} which is not one value per batch row and key; {need}"


def _lowest(c: Ctx) -> float:
    d = c["mask_where"].dtype
    return float(np.finfo(d.numpy).min) if d.is_float and d != DType.bf16 else NEG


def _lowest_fill(c: Ctx, role: str) -> bool:
    fill, where = c[role], c["mask_where"]
    v = const_value(fill)
    if v is None or fill.dtype != where.dtype or not where.dtype.is_float or where.dtype == DType.bf16:
        return False
    with np.errstate(over="ignore"):
        return float(np.asarray(v).astype(fill.dtype.numpy)) == _lowest(c)


def _fill_ok(c: Ctx) -> bool:
    """The fill (and a nested where's, `inner_where`), as its dtype holds it, is the lowest finite value of the
    scores' dtype (what the keep mask uses: an f16 const of finfo(f32).min is -inf, which makes a fully masked row
    NaN)."""
    return _lowest_fill(c, "mask_fill") and ("inner_where" not in c or _lowest_fill(c, "inner_fill"))


def _bad_fill(c: Ctx) -> str:
    return "inner_fill" if "inner_where" in c and _lowest_fill(c, "mask_fill") else "mask_fill"


_WIDE_ULP = 2.0 ** 60
"""Half an ulp of the fill at or above which `s + fill == fill` for every realistic score (f32: 2^103)."""


def _half_ulp(c: Ctx) -> float:
    low = np.asarray(_lowest(c), dtype=c["mask_where"].dtype.numpy)
    return float(np.nextafter(low, low.dtype.type(0)) - low) / 2  # the ulp just above the fill (f16: 32)


def _const_cond(c: Ctx) -> np.ndarray | None:
    """The where condition's values when it is a constant (a const, or a param whose values the graph carries,
    `Graph.values`), or expands and reshapes of one (else None)."""
    chain = _chain(c.graph, c.id("mask_cond"))
    src = chain[-1]
    v = src.attrs.get("value") if src.op == Op.CONST else c.graph.values.get(src.name) if src.op == Op.PARAM else None
    if v is None:
        return None
    arr = np.broadcast_to(np.asarray(v).astype(bool), src.shape)
    for n in reversed(chain[:-1]):
        arr = arr.reshape(n.shape) if n.op == Op.RESHAPE else np.broadcast_to(arr, n.shape)
    return arr


def _row_risk(c: Ctx) -> tuple[str, int] | None:
    """Why a row of the scores can be fully masked, with the node that can do it (None: it cannot): a term added
    before the where, a nested where, a condition that is not a constant, or a constant with a row of no key."""
    if "bias_add" in c:
        return f"the term {c.d('bias')} added before the where can mask every key the where keeps", c.id("bias")
    if "inner_where" in c:
        return f"{c.d('inner_where')} can mask every key the outer where keeps", c.id("inner_cond")
    cond = _const_cond(c)
    if cond is None:
        return f"the condition {c.d('mask_cond')} is not a constant, so a row of it may keep no key", c.id("mask_cond")
    if not np.any(cond, axis=-1).all():
        return f"the condition {c.d('mask_cond')} has a row that keeps no key", c.id("mask_cond")
    return None


def _rows_ok(c: Ctx) -> bool:
    """The additive operand is exact: the keep path is, and so is an f32 fill (|s| < 2^103); in a narrower dtype
    (f16: |s| < 16) only where no row can be fully masked (module docstring)."""
    if not is_additive(c) or not c["mask_where"].dtype.is_float or c["mask_where"].dtype == DType.bf16:
        return True
    return _half_ulp(c) >= _WIDE_ULP or _row_risk(c) is None


def _rows_explain(c: Ctx) -> str:
    risk = _row_risk(c)
    d, low = c["mask_where"].dtype, _lowest(c)
    return (f"in {d}, s + {low:.6g} rounds to {low:.6g} only for |s| < {_half_ulp(c):.6g}, so on a fully masked row "
            f"the attention's additive operand gives other numbers than the where, which writes {low:.6g} at every "
            f"key (a uniform row); {risk[0] if risk else 'a row can be fully masked'}")


def guards() -> tuple[Guard, ...]:
    return (
        guard("where_mask_fill", _fill_ok,
              lambda c: f"the where fill {c.d(_bad_fill(c))} is {c[_bad_fill(c)].dtype} "
                        f"{const_value(c[_bad_fill(c)])} on {c['mask_where'].dtype} scores; the keep mask fills "
                        f"masked scores with the scores' finfo(dtype).min ({_lowest(c):.9g}), and another fill gives "
                        f"different numbers",
              "fill with torch.finfo(scores.dtype).min", requires=("mask_where",),
              reads=("mask_fill", "mask_where", "inner_where", "inner_fill"),
              kind=ILLEGAL, subject=lambda c: c.id(_bad_fill(c))),
        guard("where_mask_rows", _rows_ok, _rows_explain,
              "nothing to change in the model: its where is exact in its dtype, the additive operand is not",
              requires=("mask_where",),
              reads=("mask_cond", "mask_fill", "bias_add", "bias", "inner_where", "inner_cond", "q_reshape",
                     "k_reshape"),
              kind=ILLEGAL, subject=lambda c: (_row_risk(c) or ("", c.id("mask_cond")))[1],
              fix="an attention op with a select mask (masked scores set to the fill, as where does)"),
    )


def additive_note(c: Ctx) -> str:
    """Why the where-mask became an additive operand rather than a keep mask (for `where_mask_additive`)."""
    return f"where-mask kept as the attention's additive operand where(cond, 0, fill): {_why_not_per_key(c)}"


def additive_operand(c: Ctx, rw: Rewriter) -> int:
    """Emit `where(cond, 0, fill)` in the scores' dtype (module docstring: exact where the fill is the lowest
    finite value)."""
    d = c["mask_where"].dtype
    return rw.emit(Op.WHERE, [c.id("mask_cond"), rw.const(0.0, d), c.id("mask_fill")])


def nested_note(c: Ctx) -> str:
    """The `where_mask_additive` note of two nested where-masks (`nested_operand`)."""
    inner, outer = c["inner_cond"], c["mask_cond"]
    return (f"two where-masks kept as the attention's one additive operand where(cond, where(cond2, 0, fill), fill): "
            f"{c.d('inner_where')} on a {inner.dtype}{list(inner.shape)} condition, then {c.d('mask_where')} on a "
            f"{outer.dtype}{list(outer.shape)} condition (exact)")


def nested_operand(c: Ctx, rw: Rewriter) -> int:
    """Emit `where(cond, where(cond2, 0, fill2), fill)` for `where(cond, where(cond2, s, fill2), fill)` (module
    docstring: both fills the lowest finite value, guard `where_mask_fill`; where both conditions hold `s + 0`,
    elsewhere `s + fill` rounds to the fill the unfused where writes). Its shape is the broadcast of the two
    conditions', in the scores' dtype."""
    d = c["mask_where"].dtype
    inner = rw.emit(Op.WHERE, [c.id("inner_cond"), rw.const(0.0, d), c.id("inner_fill")])
    return rw.emit(Op.WHERE, [c.id("mask_cond"), inner, c.id("mask_fill")])


def biased_operand(c: Ctx, rw: Rewriter) -> int:
    """Emit `where(cond, bias, fill)`, the one additive operand for `where(cond, scores + bias, fill)` (module
    docstring: the fills are never added to each other, so no finfo.min + finfo.min overflow to -inf). Its shape is
    the broadcast of the condition's and the bias's (e.g. `[B, 1, Sq, Sk]` from `[1, 1, Sq, Sk]` and `[B, 1, 1,
    Sk]`), in the scores' dtype."""
    return rw.emit(Op.WHERE, [c.id("mask_cond"), c.id("bias"), c.id("mask_fill")])


def keep_operand(c: Ctx, rw: Rewriter) -> int:
    """Emit the keep mask `[B, Sk]` f32 (1 = attend) from the where condition's per-key source (the condition
    itself, or the `[B, 1, 1, Sk]` / `[B, Sk]` mask it expands, `per_key_source`)."""
    src = per_key_source(c)
    assert src is not None, "the where condition is per key"
    return rw.cast(rw.reshape(src, _dims(c)), DType.f32)


INVERTED_RULE = "fuse_sdpa.inverted_where"
"""The rule name `uninvert_where`'s matches carry."""

INVERTED = P(Op.WHERE, P.var("mask_cond", where=lambda n: n.dtype == DType.bool, what="a bool condition"),
             P.var("mask_fill", where=lambda n: is_const(n) and all(d == 1 for d in n.shape),
                   what="a scalar constant"),
             P.var("scores", where=lambda n: not is_const(n), what="a computed value"), name="mask_where")
"""`where(masked, fill, scores)`: the fill where the bool condition holds (the anchor: anything else is no
candidate)."""


@reports(reads=("mask_where",))
def _under_softmax(c: Ctx) -> Fail | None:
    """Quiet unless softmaxes, and only they, read the where (a where-mask elsewhere is no attention's)."""
    users = c.users("mask_where")
    return None if users and all(u.op == Op.SOFTMAX for u in users) else QUIET


SCORES_SHAPE = guard(
    "inverted_scores_shape", lambda c: c["scores"].shape == c["mask_where"].shape,
    lambda c: f"{c.d('mask_where')} broadcasts the scores {c.d('scores')} {list(c['scores'].shape)} to "
              f"{list(c['mask_where'].shape)}; the where the attention reads keeps the scores' shape",
    "mask the full scores (the broadcast belongs before the where)", requires=("mask_where", "scores"),
    kind=NOT_RECOGNIZED, fix="fuse_sdpa.inverted_where broadcasts the scores first")


def _uninvert(c: Ctx, rw: Rewriter) -> int:
    """`where(eq(masked, false), scores, fill)` in place of `where(masked, fill, scores)`."""
    with rw.provenance([c.id("mask_where")]):
        keep = rw.emit(Op.EQ, [c.id("mask_cond"), rw.const(0.0, DType.bool)])
        new = rw.emit(Op.WHERE, [keep, c.id("scores"), c.id("mask_fill")])
    rw.replace(c.id("mask_where"), new)
    return new


INVERTED_WHERE = Rule(INVERTED_RULE, INVERTED, steps=(_under_softmax, SCORES_SHAPE), result="mask_where",
                      absorb=("mask_where",), rewrite=_uninvert, labels={"mask_where": "where-mask"},
                      doc="an inverted where-mask under a softmax -> where(eq(masked, false), scores, fill)")

UNINVERT_WHERE_PASS = rule_pass("fuse_sdpa", [INVERTED_WHERE], "inverted where-masks un-inverted")
"""The rule as a stage of `fuse_sdpa` (`engine.compose`)."""


def uninvert_where(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with every inverted where-mask under a softmax, `where(masked, fill, scores)` (MPT: the fill where the
    bool condition holds, `masked_fill(mask, finfo.min)` of an inverted mask, after ALiBi is added), written as
    `where(eq(masked, false), scores, fill)`, the form `where_scores` reads (then `biased_operand` takes ALiBi and
    the mask as the one additive operand, under the same guards: the fill, the rows). Exact: for a bool condition
    `eq(c, false)` is `not c` element for element, and `where(c, f, x) == where(not c, x, f)` everywhere. Only a
    `where` read by a softmax whose on-true operand is a scalar constant and whose on-false operand is not a
    constant (the anchor `INVERTED` and the quiet step `_under_softmax`), the scores not broadcast by the where
    (guard `inverted_scores_shape`); one `fuse_sdpa.inverted_where` match per where, the `INVERTED_WHERE` rule run
    by the engine. (`canonicalize_exported.inverted_where` swaps the other way only for an explicit `eq(b, false)`
    test, which this form does not start from, so the two never undo each other's rewrite within one pipeline: that
    pass runs earlier.)"""
    return UNINVERT_WHERE_PASS.rewrite(g)


__all__ = ["INVERTED", "INVERTED_RULE", "INVERTED_WHERE", "NEG", "UNINVERT_WHERE_PASS", "additive_note",
           "additive_operand", "biased_operand", "guards", "inner_where", "is_additive", "keep_operand", "nested_note",
           "nested_operand", "uninvert_where", "where_scores"]
