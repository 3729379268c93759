"""Non-pattern passes: `dead_code_elimination`, `unfuse`, `mark_elementwise_regions`.

* `dead_code_elimination` (docs/rlx.md §2.3.11): keeps what the outputs reach. Unlike RLX, graph
  *inputs* are kept even when unused, so a graph's feed interface never changes under a pass.
* `unfuse`: expands every fused op back to primitives with `rlxviz.ir.fused.expand` (the same
  decomposition the reference interpreter computes) through one `Rewriter`; each new node records
  the fused node it came from. `unfuse` after fusing gives the same numbers.
* `mark_elementwise_regions` (§2.3.9): chains of elementwise ops -> `ElementwiseRegion`. A node joins
  its operand's region when that operand has exactly one use; cross-dtype casts are excluded.
  Limits come from pipeline params `max_region_steps` (32) and `max_region_inputs` (16), as RLX's
  GPU limits. A chain that would exceed a limit is *split* there (a new region starts; a
  `region_max_steps` / `region_max_inputs` soft rejection, kind not profitable, records it: a line of `explain`
  and of `--json`'s `left_out`); a region is never half-built.

Validity (numbers equal for every input): DCE removes only nodes no output reaches. `unfuse` emits
the decomposition that defines each fused op. A region replays its steps in order on the same
operands; only ops without attributes join, casts only when they keep the dtype, and each operand
must broadcast to the step's shape (`_eligible`), so broadcasting is what it was unfused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...ir import Graph, Node, Op, Rewriter
from ...ir.emitter import Ref
from ...ir.fused import DECOMPOSITIONS, expand
from ...ir.infer import broadcast
from ...ir.ops import FUSED_REGION_OPS
from ..engine import Pass, PassResult
from ..guard import NOT_PROFITABLE
from ..trace import Match, Rejection


def _dce(graph: Graph, params: Mapping[str, Any]) -> PassResult:
    live: set[int] = set()
    stack = list(graph.outputs)
    while stack:
        i = stack.pop()
        if i in live:
            continue
        live.add(i)
        stack.extend(graph[i].inputs)
    dead = [n.id for n in graph if n.id not in live and n.op != Op.INPUT]
    if not dead:
        return PassResult(graph)
    rw = Rewriter(graph, "dead_code_elimination")
    rw.remove(dead)
    return PassResult(rw.finish())


dead_code_elimination = Pass("dead_code_elimination", _dce, doc="remove nodes no output reads (inputs are kept)")


def _unfuse(graph: Graph, params: Mapping[str, Any]) -> PassResult:
    fused = [n for n in graph if n.op in DECOMPOSITIONS]
    if not fused:
        return PassResult(graph)
    only = params.get("unfuse_ops")
    rw = Rewriter(graph, "unfuse")
    matches = []
    for n in fused:
        if only is not None and n.op.value not in only:
            continue
        with rw.provenance([n.id], path=n.path):
            out = expand(rw, n.op, dict(n.attrs), [Ref(i) for i in n.inputs])  # Ref: ids, not scalars
        rw.replace(n.id, out)
        matches.append(Match("unfuse", f"unfuse.{n.op.value}", n.id, {"fused": n.id}, int(out), n.path))
    return PassResult(rw.finish(), matches)


unfuse = Pass("unfuse", _unfuse, doc="expand every fused op back to primitives (param unfuse_ops: op names to expand)")


def _eligible(graph: Graph, n: Any) -> bool:
    if n.op not in FUSED_REGION_OPS:
        return False
    if n.op == Op.CAST and graph[n.inputs[0]].dtype.value != n.attrs["dtype"]:
        return False
    for i in n.inputs:
        try:
            if broadcast(graph[i].shape, n.shape) != n.shape:
                return False
        except ValueError:
            return False
    return True


def region_of_one(graph: Graph, n: Node) -> bool:
    """`n` could sit in an ElementwiseRegion (`_eligible`) but has no neighbour a chain joins it with: no eligible
    operand whose one use it is, and not one use of an eligible user. `mark_elementwise_regions` builds regions of two
    steps or more, so such an op is left alone by it (gpt-neox's boolean mask `where` between a reshape and the
    attention): nothing is left to fuse there."""
    if not _eligible(graph, n):
        return False
    if any(_eligible(graph, graph[i]) and graph.use_count(i) == 1 for i in n.inputs):
        return False
    users = graph.users(n)
    return not (len(users) == 1 and _eligible(graph, users[0]))


def _regions(graph: Graph, params: Mapping[str, Any]) -> PassResult:
    max_steps = int(params.get("max_region_steps", 32))
    max_inputs = int(params.get("max_region_inputs", 16))
    region: dict[int, int] = {}            # member -> root
    members: dict[int, list[int]] = {}     # root -> members in order
    externals: dict[int, list[int]] = {}   # root -> external inputs in first-use order
    rejections: list[Rejection] = []
    for n in graph:
        if not _eligible(graph, n):
            continue
        joinable = {region[i] for i in n.inputs if i in region and graph.use_count(i) == 1
                    and members[region[i]][-1] == i}
        root = next(iter(joinable)) if len(joinable) == 1 else None
        if root is not None:
            new_ext = [i for i in dict.fromkeys(n.inputs) if region.get(i) != root and i not in externals[root]]
            if len(members[root]) + 1 > max_steps:
                rejections.append(Rejection("mark_elementwise_regions", "mark_elementwise_regions.chain", n.id,
                                            "guard", "region_max_steps",
                                            f"region ending at node {members[root][-1]} has {len(members[root])} "
                                            f"steps; the limit (param max_region_steps) is {max_steps}: split "
                                            f"before {n.op.value} (node {n.id})", {"tail": members[root][-1]},
                                            (n.id,), (), n.path, "raise max_region_steps", subject=n.id,
                                            kind=NOT_PROFITABLE, soft=True))
                root = None
            elif len(externals[root]) + len(new_ext) > max_inputs:
                rejections.append(Rejection("mark_elementwise_regions", "mark_elementwise_regions.chain", n.id,
                                            "guard", "region_max_inputs",
                                            f"adding {n.op.value} (node {n.id}) would give the region "
                                            f"{len(externals[root]) + len(new_ext)} external inputs; the limit "
                                            f"(param max_region_inputs) is {max_inputs}: split here",
                                            {"tail": members[root][-1]}, (n.id,), (), n.path,
                                            "raise max_region_inputs", subject=n.id, kind=NOT_PROFITABLE,
                                            soft=True))
                root = None
            else:
                externals[root] += new_ext
        if root is None:
            ext = list(dict.fromkeys(n.inputs))
            if len(ext) > max_inputs:
                continue
            root = n.id
            members[root], externals[root] = [], ext
        members[root].append(n.id)
        region[n.id] = root
    chosen = [(r, ms) for r, ms in members.items() if len(ms) >= 2]
    if not chosen:
        return PassResult(graph, [], rejections)
    rw = Rewriter(graph, "mark_elementwise_regions")
    matches = []
    for root, ms in chosen:
        ext = externals[root]
        index = {m: k for k, m in enumerate(ms)}
        chain = []
        for m in ms:
            node = graph[m]
            name = f"cast:{node.attrs['dtype']}" if node.op == Op.CAST else node.op.value
            refs = [f"s{index[i]}" if i in index else f"i{ext.index(i)}" for i in node.inputs]
            chain.append((name, *refs))
        new = rw.fuse(Op.ELEMENTWISE_REGION, ext, {"chain": tuple(chain)}, absorbed=ms, result=ms[-1])
        matches.append(Match("mark_elementwise_regions", "mark_elementwise_regions.chain", root,
                             {f"step{k}": m for k, m in enumerate(ms)}, new, graph[ms[-1]].path))
    return PassResult(rw.finish(), matches, rejections)


mark_elementwise_regions = Pass("mark_elementwise_regions", _regions,
                                doc="elementwise chains -> ElementwiseRegion (limits: max_region_steps, "
                                    "max_region_inputs; split, never half-built)")

__all__ = ["dead_code_elimination", "mark_elementwise_regions", "region_of_one", "unfuse"]
