"""What a node a rewrite made beside its match's product is: the one rule for labels, tooltips and the inspector.

A rewrite's product (`Match.fused`) holds the nodes the match absorbed (`Node.absorbed`). The other nodes the same
match made are no second home for them: an operand the product reads (the mask `fuse_sdpa.hf_attention` reshapes and
casts for its `attention`, the half tables of a `rope`), or a view of the product's result in the old layout (the
heads `rope_heads` re-splits). `made_beside` names each by the product it was made for, e.g.
"made by fuse_sdpa.hf_attention beside attention %309 (the mask operand)", so no such node claims the match's list.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import Graph, Node
from ..ir.identity import DigestCache
from ..ir.ops import operand_roles
from .trace import PassStep, Trace


@dataclass(frozen=True)
class Beside:
    """Node made by match `rule` for its product `product` (`op`): `what` it is there ("the mask operand", "reads its
    result"), `upstream` when the product reads it, and `more` other products of the step it also feeds."""

    rule: str
    product: int
    op: str
    what: str
    upstream: bool = True
    more: int = 0

    @property
    def words(self) -> str:
        """E.g. `made by fuse_sdpa.hf_attention beside attention %309 (the mask operand)`."""
        where = "beside" if self.upstream else "after"
        also = f"; shared with {self.more} more" if self.more else ""
        return f"made by {self.rule} {where} {self.op} %{self.product} ({self.what}{also})"


def made_beside(step: PassStep) -> dict[int, Beside]:
    """Every node `step` made that is not a match's product but was made for one: the product's operands the step
    made (absorbing nothing, the product's own list, or the part of it they re-make: `qkv_columns`' new ropes), and
    the nodes of the product's own list that read its result.
    A node shared by several products is named by the first match (`Beside.more` counts the rest). Each product's
    walk stays within the nodes the step added for it."""
    after = step.after
    added = set(step.added)
    products: dict[int, str] = {}
    for m in step.matches:
        if m.fused is not None and m.fused in after:
            products.setdefault(m.fused, m.rule)
    out: dict[int, Beside] = {}
    readers: dict[int, set[int]] = {}

    def helper(n: Node, p: Node) -> bool:  # its list: none, the product's, or the part of it it re-makes
        return n.id in added and n.id not in products and set(n.absorbed) <= set(p.absorbed)

    for pid, rule in products.items():
        p = after[pid]
        roles = operand_roles(p.op, p.attrs, len(p.inputs))
        feeds: dict[int, list[str]] = {}  # node -> the product's operands it is made for, in operand order
        for k, first in enumerate(p.inputs):
            role = roles[k] if k < len(roles) else f"in{k}"
            todo, seen = [first], set()
            while todo:
                i = todo.pop()
                n = after.get(i)
                if n is None or i in seen or not helper(n, p):
                    continue
                seen.add(i)
                readers.setdefault(i, set()).add(pid)
                if i not in out:
                    feeds.setdefault(i, []).append(role)
                todo += n.inputs
        for i, names in feeds.items():
            out[i] = Beside(rule, pid, p.op.value, _operands(names))
        if not p.absorbed:
            continue
        todo = [u.id for u in after.users(pid)]
        while todo:
            i = todo.pop(0)
            n = after[i]
            if i in out or n.absorbed != p.absorbed or not helper(n, p):
                continue
            out[i] = Beside(rule, pid, p.op.value, "reads its result", upstream=False)
            todo += [u.id for u in after.users(i)]
    return {i: (b if len(readers.get(i, ())) < 2 else
                Beside(b.rule, b.product, b.op, b.what, b.upstream, len(readers[i]) - 1)) for i, b in out.items()}


def _operands(roles: list[str]) -> str:
    """`the mask operand`, `the q, k and v operands`; `operand #0` for an op whose operands have no role names."""
    names = [r if not r.startswith("in") or not r[2:].isdigit() else f"#{r[2:]}" for r in dict.fromkeys(roles)]
    if all(n.startswith("#") for n in names):
        return ("operand " if len(names) == 1 else "operands ") + _joined(names)
    return "the " + _joined(names) + (" operand" if len(names) == 1 else " operands")


def _joined(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def holders(graph: Graph) -> list[Node]:
    """The nodes of `graph` that hold what a rewrite absorbed: the one reading of "whose list is `Node.absorbed`" for
    the app's search (`app.graphpane.absorbed_index`) and the Model Explorer export (`viz.model_explorer`). A rewrite
    that makes several nodes gives each the whole match's list (`fuse_sdpa` on an ONNX export: a mask reshape, a cast
    and the attention op, each "absorbed 14 node(s)"; `fuse_attention_block.qkv_columns`: the packed projection, its
    narrows and ropes beside the attention), so of the nodes sharing one list only those none of the others reads hold
    it: the attention op, not the reshape that feeds it (the search said "softmax: absorbed into reshape %122"; the
    export said gpt-neox's k rope absorbed the Q/K/V matmuls)."""
    groups: dict[tuple[int, ...], list[Node]] = {}
    for n in graph:
        if n.absorbed:
            groups.setdefault(n.absorbed, []).append(n)
    keep: set[int] = set()
    for made in groups.values():
        read = {i for m in made for i in m.inputs}
        keep |= {m.id for m in made if m.id not in read} or {m.id for m in made}
    return [n for n in graph if n.id in keep]  # in graph order


_RUN: DigestCache[dict[int, Beside]] = DigestCache(limit=4)


def made_in_run(trace: Trace) -> dict[int, Beside]:
    """`made_beside` of every step of `trace`, by node id (ids are never reused across versions); once per run."""
    def every() -> dict[int, Beside]:
        out: dict[int, Beside] = {}
        for s in trace.steps:
            for i, b in made_beside(s).items():
                out.setdefault(i, b)
        return out

    return _RUN.get_or_compute(trace, every)
