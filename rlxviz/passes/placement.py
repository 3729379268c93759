"""Which layer a match is credited to: its path's layer (`Match.layer`), except for a residual norm at a layer's
edge, which is placed by one rule (`RESIDUAL_NORM_RULE`).

A residual norm (`FusedResidualLN`, `FusedResidualRmsNorm`) joins a residual sum to the norm that reads it, and the
two often sit in two layers: the sum closes layer N, the norm opens layer N+1 (pre-LN) or is the model's final norm.
Its path, the common path of what it absorbed, then names no layer (`h.1` and `ln_f`: none), or a wrong one where a
graph optimizer named the nodes (ONNX Runtime's `SkipLayerNormalization` before DeiT's final norm reads
`layers.1.mlp.fc2`). The rule places it by the layer kind, on the model's structure, not on names:

* post-norm (the norm closes its layer: BERT's `h1 = LN(attn(x) + x)`, and a post-norm layer of any other kind,
  BART's and Marian's decoder layers: `LayerArchitecture.post_norm`): the layer of the residual sum it normalizes,
  the layer of the sum's sublayer output (`closed_layer`: its operand other than the skip), else of the sum's own
  path, which may be its skip's (ONNX Runtime named albert.ortopt's layer-0 attention sum after the projection
  before the layers, and its norm was said the `final norm`); a sum in no layer (the embeddings' norm) is outside
  the layers. By its readers, a post-norm layer's last norm would move to the next layer and the embeddings' norm
  into layer 0 (bart-full's decoder, before);
* any other kind (pre-LN, parallel: the norm opens the sublayer that reads it): the layer of the norm's readers;
  none in a layer (the model's final norm, read by a pooler or the graph's output) is outside the layers.

`explain` keys every match by `match_layer`, so a layer's fused ops (`LayerVerdict.done`), the sibling a rejection
is compared with (`LayerExplanation.sibling`) and the ops said outside the layers (`RunVerdict.outside`) read one
placement.

A fused op that took in ops of no layer and is read by several layers is a value the layers share (`SHARED_RULE`:
T5's attention mask plus relative position bias, made in block 0 and read by every block's attention; BLOOM's ALiBi
mask), credited to no layer, whatever its match's path (its last step's, block 0's) says.

What is credited to no layer sits in one named place (`outside_box`), which `explain`'s `outside the layers:` line
says of each op and the app's layers view draws as a box of that name: a residual norm placed by the rule sits by
structure, `final norm` when it reads what a layer made (the model's final norm), else `embeddings` (the embeddings'
norm), whatever path an export gave it; an op that runs after the layers (`after_places`: it reads what a layer
made and no layer reads it) by its path, in a place apart from what runs before them (deit.qdq's `model.layernorm`,
whose embeddings sit in `model`; `after the layers` for none), so the layers view flows one way; every other op by
the first part of its path (`embeddings`, `pooler`; `other` for none). A product `match_layer` credits to a layer
its path does not name sits in that layer's box. The no-layer nodes a placed norm absorbed (its norm, before the
pass fused it) sit where it sits at every version, so a node's box never changes while the node stays the same
(`placed`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection

from ..ir import Graph, Node, Op
from ..ir.identity import DigestCache
from .architecture import classify_layer
from .trace import Layer, Match, Trace, layer_of

RESIDUAL_NORMS = frozenset({Op.FUSED_RESIDUAL_LN, Op.FUSED_RESIDUAL_RMS_NORM})
"""The fused ops `match_layer` places by `RESIDUAL_NORM_RULE`: a residual sum and the norm that reads it."""

RESIDUAL_NORM_RULE = ("a residual norm at a layer's edge is said by the layer whose norm it is: post-norm, the layer "
                      "whose residual sum it closes; otherwise the layer whose sublayer reads it; none (the model's "
                      "final norm, the embeddings' norm) is said outside the layers")
"""`match_layer`'s rule in words."""


SHARED_RULE = ("a fused op that took in ops of no layer and is read by several layers is a value they share (T5's "
               "attention mask plus relative position bias, made once in block 0 and read by every block's "
               "attention): it is said outside the layers, in the place of its path")
"""`shared`'s rule in words."""


def shared(g: Graph, node: int) -> bool:
    """Whether node `node` of `g` is a value the layers share (`SHARED_RULE`): its path, the common path of what it
    took in, names no layer, and its readers' paths name more than one layer. T5's `ElementwiseRegion` of the mask's
    `where` (path `model.encoder`) and block 0's position-bias `add` (`model.encoder.block.0.layer.0.SelfAttention`),
    read by both encoder blocks' attentions, is shared; the match's own path (its last step's) named block 0, so
    `explain` credited block 0 with a fusion every block reads, while the app boxed it by its path, outside the
    layers. A region all in one layer's path (clip-vision's residual sum, read by its layer and the next) is that
    layer's; a region of no layer that one layer reads (gemma3's per-layer mask) is that layer's."""
    if layer_of(g[node].path) is not None:
        return False
    return len({k for u in g.users(node) if (k := layer_of(u.path)) is not None}) > 1


def skip_operand(g: Graph, s: int) -> int | None:
    """The skip operand of residual sum node `s` of `g` (`x + sublayer(x)`): of its two operands, the one the other
    reads, directly or through others (the sublayer's input); None where neither reads the other (the embeddings'
    sum of a gather and a table) or `s` has not two operands. Both operands' inputs are walked breadth first, in
    turn, so the walk stops near the sum when one operand is the other's input, as in a residual."""
    ops = [i for i in dict.fromkeys(g[s].inputs) if i in g]
    if len(ops) != 2:
        return None
    walks = [(ops[1], deque(g[ops[0]].inputs), set()), (ops[0], deque(g[ops[1]].inputs), set())]
    while any(todo for _, todo, _ in walks):
        for target, todo, seen in walks:
            if not todo:
                continue
            i = todo.popleft()
            if i == target:
                return target
            if i not in seen and i in g:
                seen.add(i)
                todo.extend(g[i].inputs)
    return None


def closed_layer(g: Graph, s: int) -> Layer | None:
    """The layer whose residual sum node `s` of `g` is: the layer of its other operand than the skip (the sublayer's
    output, `skip_operand`) where that names one, else the sum's own path's. An exporter or graph optimizer may name
    the sum after its skip: ALBERT's (ONNX Runtime's) layer-0 attention sum %55 reads `embedding_hidden_mapping_in`,
    the projection before the shared layer, while the attention it closes is layer 0's; by its path its norm was
    the model's `final norm` and layer 0 listed one residual norm to layer 1's two."""
    k = skip_operand(g, s)
    if k is not None:
        other = next(i for i in g[s].inputs if i != k)
        if (layer := layer_of(g[other].path)) is not None:
            return layer
    return layer_of(g[s].path)


def match_layer(source: Graph, before: Graph, after: Graph, m: Match) -> Layer | None:
    """The layer `m` is credited to (None: outside the layers).

    Args:
        source: the run's input graph (what `architecture.classify_layer` reads a layer's kind from).
        before / after: the graphs the match's pass read and made (its `bindings` name nodes of `before`, its
            `fused` a node of `after`).
        m: the match.

    Returns:
        `m.layer` (its path's layer), except for a residual norm (`RESIDUAL_NORMS`) with a bound residual sum, placed
        by `RESIDUAL_NORM_RULE`, and a value the layers share (`SHARED_RULE`, `shared`): None.
    """
    if m.fused is None or m.fused not in after:
        return m.layer
    if after[m.fused].op not in RESIDUAL_NORMS:
        return None if shared(after, m.fused) else m.layer
    s = m.bindings.get("sum")
    if s is None or s not in before:
        return m.layer
    closes = closed_layer(before, s)  # the layer whose residual sum it normalizes
    opens = sorted({k for u in after.users(m.fused) if (k := layer_of(u.path)) is not None})  # whose sublayer reads
    kind_of = closes if closes is not None else (opens[0] if opens else None)
    if kind_of is None:
        return None
    if classify_layer(source, kind_of).post_norm:
        return closes
    return opens[0] if opens else None


_LEAVES = (Op.INPUT, Op.PARAM, Op.CONST)

FINAL_NORM_BOX, EMBEDDINGS_BOX, NO_PATH_BOX = "final norm", "embeddings", "other"
"""The places `outside_box` names: a residual norm credited to no layer that reads what a layer made, one that does
not, and an op with no path."""


def path_box(path: str) -> str:
    """The place of a node in no layer by its path: the path's first part (`embeddings.LayerNorm` -> `embeddings`),
    `other` for none."""
    return path.split(".")[0] if path else NO_PATH_BOX


AFTER_BOX = "after the layers"
"""The place of an op that runs after the layers (`after_places`) whose path names no module of its own."""


def after_layers(g: Graph) -> frozenset[int]:
    """Ids of the compute nodes of `g` in no layer (by path) that run after the layers: they read, directly or
    through others, a node whose path names a layer, and no such node reads them, directly or through others (the
    final norm, a pooler, a head). What runs before the layers (the embeddings, the mask) reads none; what sits
    between two stacks or is made in one layer for all (T5's position bias) is read by a layer: neither is after.
    Linear in the size of `g`."""
    inside = {n.id for n in g if n.op not in _LEAVES and layer_of(n.path) is not None}
    down, todo = set(), [u.id for i in inside for u in g.users(i)]
    while todo:
        i = todo.pop()
        if i not in down and i not in inside:
            down.add(i)
            todo.extend(u.id for u in g.users(i))
    up, todo = set(), [j for i in inside for j in g[i].inputs]
    while todo:
        i = todo.pop()
        if i not in up and i not in inside and i in g:
            up.add(i)
            todo.extend(g[i].inputs)
    return frozenset(i for i in down - up if g[i].op not in _LEAVES)


def after_box(path: str, roots: Collection[str]) -> str:
    """The place of a node that runs after the layers (`after_layers`) by its path, never a place of what runs
    before them: the path's first part (`pooler.dense` -> `pooler`), or its first two where the first is the root of
    the layers' paths too (`roots`: `model` of `model.layers.0`; `model.layernorm` -> `model.layernorm`, whose
    embeddings sit in `model`); `AFTER_BOX` for a path that names nothing more (``, `model`)."""
    parts = path.split(".") if path else []
    if not parts:
        return AFTER_BOX
    if parts[0] not in roots:
        return parts[0]
    return ".".join(parts[:2]) if len(parts) > 1 else AFTER_BOX


def after_places(g: Graph) -> dict[int, str]:
    """Node id -> place (`after_box`) of each node of `g` that runs after the layers (`after_layers`). deit.qdq's
    final norm and pooler (paths `model.layernorm`, `model.pooler`) sat with its embeddings in `model`, so the layers
    view drew an arrow from its last layer back up into `model`, a cycle to the eye (newcomer finding)."""
    roots = {n.path.split(".")[0] for n in g if layer_of(n.path) is not None}
    return {i: after_box(g[i].path, roots) for i in sorted(after_layers(g))}


def _reads_a_layer(g: Graph, node: int) -> bool:
    """`node` of `g` reads, directly or through others, a node whose path names a layer."""
    seen, todo = {node}, list(g[node].inputs)
    while todo:
        i = todo.pop()
        if i in seen or i not in g:
            continue
        seen.add(i)
        if layer_of(g[i].path) is not None:
            return True
        todo.extend(g[i].inputs)
    return False


_PLACED: DigestCache[dict[int, Layer | str]] = DigestCache(limit=4)


def placed(trace: Trace) -> dict[int, Layer | str]:
    """Node id -> where it sits, for the nodes of any version of `trace` whose path does not say it: each match's
    product that `match_layer` credits elsewhere than its path's layer (a layer: falcon.ortopt's residual-sum region
    of path `model.h`, credited to layer 1 by its match; for none, its place outside the layers: a residual norm's
    `FINAL_NORM_BOX` when it reads what a layer made, else `EMBEDDINGS_BOX`; any other op's `path_box`), the
    nodes in no layer by path that it absorbed (`Node.absorbed`: never an operand it reads), through every earlier
    match that made them (esm.qdyn's `layer_norm` %768, path `encoder.emb_layer_norm_after`, before
    `fuse_residual_ln` made `FusedResidualLN` %797 of it: `final norm`; node ids are never reused). The norm a placed
    residual norm took in (its match's `norm` binding) and what made that norm sit there too whatever their path:
    deit.ortopt's final `layer_norm` %113, named `layers.1.mlp.fc2` by ONNX Runtime, was boxed in `layers.1` until
    `fuse_residual_ln` made `FusedResidualLN` %144 of it, when a `final norm` box appeared (newcomer run 22); its
    residual sum stays in its layer until fused; and every other node that runs after the layers, in its place
    there (`after_places`) at the first version that holds it, or with the placed norm whose nodes share its path
    (optimum.llama-with-past's casts in `model.norm`, which the fused norm did not take in, sit in `final norm`).
    What `explain` says of these nodes and where the app's layers view boxes them. A weight only values the layers
    share read sits in their place too (`_shared_weights`: no node, a weight the layers view counts there). Made
    once per trace."""
    hit = _PLACED.get(trace)
    if hit is not None:
        return hit
    made: dict[int, tuple[tuple[int, ...], Graph]] = {}  # a match's node -> (what it absorbed, the graph before)
    moved: dict[int, Layer | str] = {}
    own: dict[int, Layer | str] = {}  # the norm a placed residual norm took in (its `norm` binding) -> its place
    for s in trace.steps:
        for m in s.matches:
            if m.fused is None or m.fused not in s.after:
                continue
            n = s.after[m.fused]
            made[m.fused] = (n.absorbed, s.before)
            k, here = match_layer(trace.input, s.before, s.after, m), layer_of(n.path)
            if k is None and n.op in RESIDUAL_NORMS:
                moved[m.fused] = FINAL_NORM_BOX if _reads_a_layer(s.after, m.fused) else EMBEDDINGS_BOX
            elif k is None and here is not None:  # credited to no layer, its path names one
                moved[m.fused] = path_box(n.path)
            elif k is not None and k != here:  # a product whose path names no layer or another one
                moved[m.fused] = k
            if n.op in RESIDUAL_NORMS and m.fused in moved and (t := m.bindings.get("norm")) is not None \
                    and t in s.before:
                own[t] = moved[m.fused]
    out = {**own, **moved}
    for f, place in [*moved.items(), *own.items()]:
        todo = [f]
        while todo:
            absorbed, before = made.get(todo.pop(), ((), None))
            for i in absorbed if before is not None else ():
                if i in before and i not in out and (layer_of(before[i].path) is None or f in own) \
                        and before[i].op not in _LEAVES:
                    out[i] = place
                    todo.append(i)
    norms = {i: p for i, p in out.items() if i not in moved and isinstance(p, str)}  # a placed norm's own nodes
    for _, g in trace.versions():  # the rest of what runs after the layers, where the version that made it says
        beside = {g[i].path: p for i, p in norms.items() if i in g and g[i].path}
        for i, place in after_places(g).items():  # a cast inside the final norm (`model.norm`) sits with it
            out.setdefault(i, beside.get(g[i].path, place))
    out.update(_shared_weights(trace.final, out))
    _PLACED[trace] = out
    return out


def _shared_weights(g: Graph, where: dict[int, Layer | str]) -> dict[int, str]:
    """Param id -> the place (`where`'s, else `path_box` of its path) of the value the layers share (`shared`) that
    reads it in `g`, the run's final graph, for each param only such values read: a weight of every layer, not of
    the one whose path made it, counted in that place's box at every version (`placed`). T5's relative position bias
    (a folded `f32[1, 4, 16, 16]` param) was read by block 0's `add` until `mark_elementwise_regions` took that add
    into the region both blocks read: the app's layers view counted its 1.02K values in encoder layer 0, then, from
    that version on, in `model`."""
    out: dict[int, str] = {}
    for n in g:
        if n.op in _LEAVES or not shared(g, n.id):
            continue
        place = where.get(n.id)
        for i in n.inputs:
            if g[i].op == Op.PARAM and all(shared(g, u.id) for u in g.users(i)):
                out.setdefault(i, place if isinstance(place, str) else path_box(n.path))
    return out


def sits(trace: Trace, n: Node) -> tuple[Layer | None, str]:
    """(layer, place outside the layers) where node `n` of a version of `trace` sits, as its box in the app's layers
    view and `explain` say (`placed`, else its path's layer): `(layer, "")` in a layer, `(None, place)` for a node
    `placed` puts outside the layers (`final norm`), `(None, "")` for any other node of no layer (its path says
    where: `path_box`). The inspector's `(layer N)` beside the node's path."""
    where = placed(trace).get(n.id)
    if where is None:
        return layer_of(n.path), ""
    return (None, where) if isinstance(where, str) else (where, "")


def outside_box(trace: Trace, node: int) -> str:
    """The place of node `node` of a version of `trace` credited to no layer (`placed`, else `path_box` of its path):
    what the `outside the layers:` line says of it, the name of the app's box that holds it."""
    place = placed(trace).get(node)
    if isinstance(place, str):
        return place
    g = trace.final if node in trace.final else next((g for _, g in trace.versions() if node in g), None)
    return path_box(g[node].path) if g is not None else NO_PATH_BOX


__all__ = ["AFTER_BOX", "EMBEDDINGS_BOX", "FINAL_NORM_BOX", "NO_PATH_BOX", "RESIDUAL_NORMS", "RESIDUAL_NORM_RULE",
           "SHARED_RULE", "after_box", "after_layers", "after_places", "closed_layer", "match_layer", "outside_box",
           "path_box", "placed", "shared", "sits", "skip_operand"]
