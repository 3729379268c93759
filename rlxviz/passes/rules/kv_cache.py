"""A decode step's KV cache, `concat(past, new_heads)` in the head layout, read as the head split of a packed concat.

Hugging Face's `DynamicCache.update` appends this step's K (and V) heads to the cache on the sequence axis:

    k_all = concat(past_key [B, h, P, d], transpose(reshape(k [B, S, h*d], [B, S, h, d]), [0, 2, 1, 3]), axis=2)

and the attention reads `k_all` (S = 1 for a decode step). The packed `attention` op takes K as `[B, Sk, h*d]`, so
`pack_cache` gives the attention its own `transpose(reshape(concat(merge(past), k, axis=1), [B, P+S, h, d]),
[0, 2, 1, 3])` with `merge(past) = reshape(transpose(past, [0, 2, 1, 3]), [B, P, h*d])`, and `fuse_sdpa` packs the
attention with `Sq = S`, `Sk = P + S` (the cache returned as the present key/value keeps its own concat).

Validity (numbers equal, bit for bit): only movement ops; element `[b, j, s, :]` of both is `past[b, j, s, :]` for
s < P and `k[b, s - P, j*d:(j+1)*d]` after. Taken when the concat's second operand is a head split of a packed
`[B, S, h*d]` tensor and its first is `[B, h, P, d]` of the same dtype. Each rewrite is a `fuse_sdpa.pack_cache`
match. FusedAttentionBlock does not take a cache (it projects K and V from the hidden states): its `kv_cache`
guard names it, the model's own structure.

The rule (`PACK_CACHE`, a stage of `fuse_sdpa` run by the engine): the anchor `CACHE` is the concat of a head split
on axis 2 (anything else is no candidate, as is a concat nothing reads); the named guards `cache_layout` (a
`[B, S, h*d]` projection split to `[B, S, h, d]`, a `[B, h, P, d]` past) and `cache_dtype` are its refusals.
"""

from __future__ import annotations

from ...ir import Graph, Op, Rewriter
from ..engine import rule_pass
from ..guard import NOT_RECOGNIZED, Ctx, guard
from ..pattern import P
from ..rule import QUIET, Fail, Rule, reports
from ..trace import Match

RULE = "fuse_sdpa.pack_cache"

_SPLIT = P(Op.TRANSPOSE, P(Op.RESHAPE, P.var("new"), name="split_reshape"), name="split",
           attrs={"perm": lambda p: tuple(p) == (0, 2, 1, 3)})
CACHE = P(Op.CONCAT, P.var("past"), _SPLIT, name="cache", attrs={"axis": lambda a: a in (2, -2)},
          where=lambda n: n.rank == 4 and len(n.inputs) == 2)
"""`concat(past, transpose(reshape(new), [0, 2, 1, 3]), axis=2)`: a decode step's cache concat on the sequence
axis of the heads (the anchor: anything else is no candidate)."""


def _layout_ok(c: Ctx) -> bool:
    """`new` is the packed `[B, S, h*d]` of the `[B, S, h, d]` head split and `past` is `[B, h, P, d]`."""
    past, new = c["past"], c["new"]
    if new.rank != 3 or past.rank != 4:
        return False
    b, s, h, d = c["split_reshape"].shape
    return new.shape == (b, s, h * d) and past.shape[:2] == (b, h) and past.shape[3] == d


@reports(reads=("cache",))
def _read(c: Ctx) -> Fail | None:
    """Quiet when nothing reads the concat (no reader to give the packed form)."""
    return None if c.users("cache") else QUIET


CACHE_LAYOUT = guard(
    "cache_layout", _layout_ok,
    lambda c: f"the cache {c.d('cache')} appends the head split of {c.d('new')} {list(c['new'].shape)} (split as "
              f"{list(c['split_reshape'].shape)}) to {c.d('past')} {list(c['past'].shape)}; needs a packed "
              f"[B, S, h*d] projection split to [B, S, h, d] and a [B, h, P, d] past",
    "append this step's K/V heads split from the packed [B, S, h*d] projection", requires=("cache",),
    reads=("past", "new", "split_reshape"), kind=NOT_RECOGNIZED,
    fix="fuse_sdpa.pack_cache reads this cache layout")

CACHE_DTYPE = guard(
    "cache_dtype", lambda c: c["past"].dtype == c["new"].dtype,
    lambda c: f"the past {c.d('past')} is {c['past'].dtype.value} and this step's {c.d('new')} "
              f"{c['new'].dtype.value}; the packed concat reads one dtype",
    "keep the cache in the dtype of the projection", requires=("cache",), reads=("past", "new"),
    kind=NOT_RECOGNIZED, fix="a cast in front of the packed concat")


def _rewrite(c: Ctx, rw: Rewriter) -> int:
    """The readers of the cache read its packed form's head split; the concat (and the split, when only it read it)
    removed unless it is a graph output (the present key/value)."""
    g = c.graph
    n, past, new = c["cache"], c.id("past"), c.id("new")
    b, h, p, d = g[past].shape
    s = g[new].shape[1]
    with rw.provenance([n.id]):
        merged = rw.reshape(rw.transpose(past, (0, 2, 1, 3)), (b, p, h * d))
        packed = rw.emit(Op.CONCAT, [merged, new], axis=1)
        heads = rw.transpose(rw.reshape(packed, (b, p + s, h, d)), (0, 2, 1, 3))
        for u in g.users(n.id):
            again = rw.emit(u.op, [heads if i == n.id else i for i in u.inputs], **dict(u.attrs))
            rw.replace(u.id, again)
    if not g.is_output(n.id):
        split = g[n.inputs[1]]
        rw.remove([n.id] + ([split.id, split.inputs[0]] if len(g.users(split.id)) == 1
                            and len(g.users(split.inputs[0])) == 1 else []))
    return packed


PACK_CACHE = Rule(RULE, CACHE, steps=(_read, CACHE_LAYOUT, CACHE_DTYPE), result="cache", absorb=("cache",),
                  rewrite=_rewrite, labels={"cache": "cache concat"},
                  doc="a decode step's KV-cache concat in the head layout -> the head split of a packed concat")

PACK_CACHE_PASS = rule_pass("fuse_sdpa", [PACK_CACHE], "KV-cache concat read packed")
"""The rule as a stage of `fuse_sdpa` (`engine.compose`)."""


def kv_workload(queries: object, cached: object) -> str:
    """What a run of an attention reading a KV cache is, named from its query length (the new tokens), the one
    wording of `explain`, the app's Why tab and the block's `kv_cache` refusal: `decode step of 1 token after 7
    cached` for one new token, `prefill of 16 tokens after 0 cached` for more (a prompt's prefill, or a chunk of
    it after earlier chunks). A cache does not make a run a decode step: a 16-token run is a prefill. The words
    before ` of ` name the kind alone (`decode step`, `prefill`).

    Args:
        queries: the new tokens (the attention's query length `Sq`); an int, or a dim the shape left unbound.
        cached: the tokens already in the cache (the past's length on the sequence axis, `Sk - Sq`)."""
    if queries == 1:
        return f"decode step of 1 token after {cached} cached"
    return f"prefill of {queries} tokens after {cached} cached"


def cached_length(g: Graph, concat_id: int) -> object:
    """The past's length of a cache concat `concat(past, new)` on the sequence axis: its first operand's extent on
    the concat's axis (`[B, P, h*d]` packed, `[B, h, P, d]` in the head layout)."""
    n = g[concat_id]
    return g[n.inputs[0]].shape[n.attrs["axis"]]


def pack_cache(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with every cache concat read in packed form by its readers (see the module doc), and one `Match` per
    concat; `(g, [])` when there is none. The `PACK_CACHE` rule run by the engine."""
    return PACK_CACHE_PASS.rewrite(g)


__all__ = ["CACHE", "PACK_CACHE", "PACK_CACHE_PASS", "RULE", "cached_length", "kv_workload", "pack_cache"]
