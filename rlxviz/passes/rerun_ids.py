"""Node ids of a re-run's graph, said as the shown run's graph has them.

A what-if re-runs the pipeline on a changed model (`passes.whatif.what_if`); the nodes the passes make in that run get
other ids than in the run the user sees. granite.optimum-past's fix line said "then kv_cache fails: K is concat (node
287, ...)" where the shown graph's K concat is %282 and its %287 a reshape. `in_shown_ids` rewrites every `node N` and
`%N` of such a message to the id of N's counterpart in the shown graph (the node of that id when it is the same op,
path, pass and shape, else the one node of the same op, path, pass, shape and operands, compared three operands deep),
and where there is none, or more than one, names it as the what-if run's node.
"""

from __future__ import annotations

import re
from collections.abc import Hashable

from ..ir import Graph

NODE_REF = re.compile(r"\b(node )(\d+)\b|(%)(\d+)\b")
"""A node named in a message: `node 287` (a `Ctx.d` description) or `%287`."""
DEPTH = 3
"""How many operands deep two nodes are compared (`_key`)."""


def _key(g: Graph, i: int, depth: int = DEPTH) -> Hashable:
    """Node `i` of `g` as structure: op, path, pass, shape, dtype, and its operands' keys `depth - 1` deep."""
    n = g[i]
    head = (n.op, n.path, n.pass_name, n.shape, n.dtype)
    if depth == 0:
        return head
    return head, tuple(_key(g, j, depth - 1) if j in g else None for j in n.inputs)


def counterpart(rerun: Graph, i: int, shown: Graph) -> int | None:
    """The id in `shown` of node `i` of `rerun`: the same id where that node has the same op, path, pass, shape and
    dtype, else the one node of equal `_key`, else None."""
    if i not in rerun:
        return None
    if i in shown and _key(shown, i, 0) == _key(rerun, i, 0):
        return i  # the same node where the what-if changed only what feeds it (albert's fc2 once fc1 takes gelu_tanh)
    key = _key(rerun, i)
    hits = [n.id for n in shown if n.op == rerun[i].op and _key(shown, n.id) == key]
    return hits[0] if len(hits) == 1 else None


def in_shown_ids(message: str, rerun: Graph, shown: Graph) -> str:
    """`message` (about `rerun`'s nodes) with each node id said as `shown` has it (`counterpart`): `node 287` ->
    `node 282`; a node with no single counterpart reads `the what-if run's node 287` (`%287`: `the what-if run's
    %287`), so no id in the line names another node of the graph the user sees."""
    def one(m: re.Match[str]) -> str:
        word, num = (m.group(1), m.group(2)) if m.group(2) else (m.group(3), m.group(4))
        j = counterpart(rerun, int(num), shown)
        return f"{word}{j}" if j is not None else f"the what-if run's {word}{num}"
    return NODE_REF.sub(one, message)


__all__ = ["DEPTH", "NODE_REF", "counterpart", "in_shown_ids"]
