"""What a node a rewrite made beside its match's product is: the one rule for labels, tooltips and the inspector.

A rewrite's product (`Match.fused`) holds the nodes the match absorbed (`Node.absorbed`). The other nodes the same
match made are no second home for them: an operand the product reads (the mask `fuse_sdpa.hf_attention` reshapes and
casts for its `attention`, the half tables of a `rope`), or a view of the product's result in the old layout (the
heads `rope_heads` re-splits). `made_beside` names each by the product it was made for, e.g.
"made by fuse_sdpa.hf_attention beside attention %309 (the mask operand)", so no such node claims the match's list.
`replaced` reads what each node of a version replaced itself: the one count of "absorbed N" for drawings, the
inspector, the search index and the Model Explorer export. A version that lacks the product (a later pass absorbed
it) names where it went, by the same lists the search follows (`holders`, `where_now`): "beside matmul %197 (the b
operand; now in FusedAttentionBlock %210)", so no label names a node its version lacks as if it were there.
`remade_in_run` names the nodes such a rewrite made in place of an earlier match's product (gptj's merged Q/K/V
matmul %214, re-made as %227 by `fuse_attention_block.qkv_columns`), so every view credits them to the pass that made
the product.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..ir import Graph, Node
from ..ir.identity import DigestCache
from ..ir.ops import operand_roles
from .pipeline import role_label
from .trace import PassStep, Trace, family_of


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
        """E.g. `made by fuse_sdpa.hf_attention beside attention %309 (the mask operand)`; in a version that lacks
        the product, `made_words` says where it went."""
        return self.said()[0]

    def said(self, now: str = "") -> tuple[str, str, str, str]:
        """Its wordings, whole first, then shorter for a label with little room (`viz.dot` takes the first that
        fits its lines, so a label never ends inside a parenthesis): `words`, then without the rule (the tooltip
        keeps it), then without what it is there, then neither. `now`: where the product went when the version
        shown lacks it (`where_now`: `in FusedAttentionBlock %210`, `gone`), said in each, e.g.
        `made beside matmul %197 (the b operand; now in FusedAttentionBlock %210)`."""
        where = "beside" if self.upstream else "after"
        also = f"; shared with {self.more} more" if self.more else ""
        what, tail = f" ({self.what}{also}" + (f"; now {now})" if now else ")"), f" (now {now})" if now else ""
        return (f"made by {self.rule} {where} {self.op} %{self.product}{what}",
                f"made {where} {self.op} %{self.product}{what}",
                f"made by {self.rule} {where} {self.op} %{self.product}{tail}",
                f"made {where} {self.op} %{self.product}{tail}")


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


def is_copy(i: int, beside: Mapping[int, Beside], *graphs: Graph | None) -> bool:
    """Whether node `i` was made beside a match's product (`beside`: `made_in_run`, else `made_beside`) holding the
    product's list as it is (`fuse_attention_block`'s bias expands, `rope_heads`' heads view): such a node replaced
    nothing itself. The lists are read in the first of `graphs` holding both nodes (the version drawn, then every node
    of the run); where none does, a node made beside a product is taken as a copy."""
    b = beside.get(i)
    if b is None:
        return False
    for g in graphs:
        if g is not None and i in g and b.product in g:
            return g[i].absorbed == g[b.product].absorbed
    return True


def replaced(n: Node, live: Graph, beside: Mapping[int, Beside], versions: Graph | None = None) -> tuple[int, ...]:
    """The ids of `n.absorbed` that `n` itself replaced, as its version `live` shows it: the one reading of a node's
    "absorbed N" for drawing labels and tooltips (`viz.dot`), the inspector's `replacing` and its ONNX provenance
    (`app.onnxorigin.onnx_claims`, the first level of its walk). The rewriter gives every node a match makes the
    match's whole list (llama's two bias `expand`s and its FusedAttentionBlock each said "absorbed 8"), so a node
    of `n.absorbed` is left out when
    * `n` is a copy (`is_copy`): made beside a product, holding the product's list: () for it;
    * it is still live in `live` (absorbed by a match but kept for another reader): not replaced;
    * another live node of `live` that is no copy absorbed it in a shorter list: the nearer one replaced it
      (`qkv_columns`' new rope the old rope, `fuse_swiglu.dual_matmul`'s packed matmul its MatMuls,
      `fuse_shared_input_matmul`'s merged bias add the adds); of two such lists of one length, the later node's
      (a match's product is made after what it reads);
    * a node the same match made beside `n` (or `n`'s product beside which `n` was made) that is no copy re-made it
      in a nearer list, as above, and has left `live` since (`remade_beside`): what a node replaced is its for good,
      and goes on to whatever later absorbed it. qwen2-moe's shared-expert FusedSwiGLU %329 never replaced the
      gate/up Gemms `fuse_swiglu.viewed_dual_matmul` re-made beside it as matmul %328, also once
      `fuse_shared_input_matmul` merged %328 into matmul %345 (newcomer run 38: the inspector listed them in %329).
    So no id is replaced by two live nodes of a version, and a match's nodes together replace the nodes it removed.

    Args:
        n: a node of `live`.
        live: the version shown.
        beside: node id -> what a node a match made beside its product is (`made_in_run`; `made_beside` of the step
            that made `live` when there is no trace).
        versions: every node of the run (`viz.overlay.all_versions`), to read a copy's product gone from `live`.

    Returns:
        The ids in `n.absorbed`'s order (ids of earlier versions, not of `live`).
    """
    if not n.absorbed or is_copy(n.id, beside, live, versions):
        return ()
    direct, order = absorbers(live), _order(live)
    mine = (len(n.absorbed), order.get(n.id, -1))

    def nearer(i: int) -> bool:  # a shorter list, or one as long made later, of a node that is no copy
        return any(m != n.id and (size, -order.get(m, -1)) < (mine[0], -mine[1])
                   and not is_copy(m, beside, live, versions) for size, m in direct.get(i, ()))

    gone = remade_beside(n, live, beside, versions)
    return tuple(i for i in n.absorbed if i not in live and not nearer(i) and i not in gone)


def remade_beside(n: Node, live: Graph, beside: Mapping[int, Beside], versions: Graph | None) -> dict[int, int]:
    """Each id of `n.absorbed` that a node made with `n` by one match and gone from `live` re-made itself -> that
    node's id (`replaced`'s last case): a node made beside `n`, or `n`'s product and the nodes made beside it when
    `n` was made beside one, each no copy (`is_copy`), read in `versions` (every node of the run), whose list is
    nearer than `n`'s: shorter, or as long and made later (a larger id). qwen2-moe's FusedSwiGLU %329 -> {91: 328,
    96: 328} once matmul %328 is merged into %345. {} without `versions` or for a node made with none."""
    if versions is None or not n.absorbed:
        return {}
    out: dict[int, int] = {}
    mine = (len(n.absorbed), -n.id)
    for m in _made_with(n.id, beside):
        node = versions.get(m)
        if (m == n.id or m in live or node is None or (len(node.absorbed), -m) >= mine
                or is_copy(m, beside, versions)):
            continue
        for i in node.absorbed:
            if i in n.absorbed:
                out.setdefault(i, m)
    return out


_MADE_WITH: list[tuple[Mapping[int, Beside], dict[int, tuple[int, ...]]]] = []
"""The last few `beside` mappings read (by identity: `made_in_run`'s is one per run) -> product id -> the ids made
beside it (`_made_with`)."""


def _made_with(i: int, beside: Mapping[int, Beside]) -> tuple[int, ...]:
    """The ids made by one match with node `i`: the product and every node made beside it, where `i` is either
    (`beside`: `made_in_run`); () for a node made with none."""
    index = next((ix for b, ix in _MADE_WITH if b is beside), None)
    if index is None:
        found: dict[int, list[int]] = {}
        for j, b in beside.items():
            found.setdefault(b.product, []).append(j)
        index = {p: (p, *js) for p, js in found.items()}
        _MADE_WITH.insert(0, (beside, index))
        del _MADE_WITH[4:]
    b = beside.get(i)
    return index.get(b.product if b is not None else i, ())


@dataclass(frozen=True)
class Credit:
    """How the nodes a match's product `p` lists (`Node.absorbed`) went, as its version `live` shows them
    (`credit`): the one split of a match's list for the inspector's "fused ... -> attention %237" item.

    Attributes:
        replaced: what `p` replaced itself (`replaced`): gpt-neox's attention %237 the reshapes, narrows and the
            old attention %216.
        remade: each id a node the same step made beside `p` replaced itself -> that node: the QKV projection %218
            and the ropes %194, %199 -> %231, %233, %235 (`qkv_columns`), llama's MatMuls %71, %75 -> the packed
            matmul %191 (`fuse_swiglu.dual_matmul`); such a node gone from `live` since, too (`remade_beside`).
        kept: ids still live in `live`, copied into `p` and kept for their other readers (`fuse_sdpa.head_layout`'s
            shared reshape and transpose).
    """

    replaced: tuple[int, ...]
    remade: dict[int, int]
    kept: tuple[int, ...]


def credit(p: Node, live: Graph, beside: Mapping[int, Beside], versions: Graph | None = None) -> Credit:
    """`Credit` of node `p` of version `live` (`beside`, `versions`: as for `replaced`). Every id of `p.absorbed`
    falls in one of its three parts, `replaced` where no other node of `live` replaced it itself."""
    mine = replaced(p, live, beside, versions)
    kept = tuple(i for i in p.absorbed if i in live)
    direct, remade, gone = absorbers(live), {}, remade_beside(p, live, beside, versions)
    for i in p.absorbed:
        if i in mine or i in live:
            continue
        by = next((m for _, m in direct.get(i, ()) if m != p.id and i in replaced(live[m], live, beside, versions)),
                  gone.get(i))
        if by is not None:
            remade[i] = by
    rest = tuple(i for i in p.absorbed if i not in kept and i not in remade)
    return Credit(rest, remade, kept)


_ABSORBERS: DigestCache[dict[int, list[tuple[int, int]]]] = DigestCache(limit=8)
_ORDER: DigestCache[dict[int, int]] = DigestCache(limit=8)


def absorbers(g: Graph) -> dict[int, list[tuple[int, int]]]:
    """Each id a node of `g` absorbed -> `(length of its list, its id)` of each such node; once per graph."""
    def index() -> dict[int, list[tuple[int, int]]]:
        out: dict[int, list[tuple[int, int]]] = {}
        for m in g:
            for i in m.absorbed:
                out.setdefault(i, []).append((len(m.absorbed), m.id))
        return out

    return _ABSORBERS.get_or_compute(g, index)


def _order(g: Graph) -> dict[int, int]:
    """Each node id of `g` -> its place in `g`'s order; once per graph."""
    return _ORDER.get_or_compute(g, lambda: {n.id: k for k, n in enumerate(g)})


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


def holders(live: Graph, beside: Mapping[int, Beside], versions: Graph | None = None) -> dict[int, int]:
    """Each id a node of `live` holds at any depth -> that node's id: what it replaced itself (`replaced`), then
    what those replaced in turn (their lists in `versions`, a copy's left out), as the search follows them
    (`app.graphpane.absorbed_index`): matmul %197 -> FusedAttentionBlock %210 in llama's versions after
    `fuse_attention_block`."""
    out: dict[int, int] = {}
    for n in live:
        todo = list(replaced(n, live, beside, versions))
        while todo:
            i = todo.pop()
            if i in out:
                continue
            out[i] = n.id
            m = versions.get(i) if versions is not None else None
            if m is not None and m.absorbed and not is_copy(i, beside, versions):
                todo += m.absorbed
    return out


def where_now(b: Beside, live: Graph, held: Mapping[int, int]) -> str:
    """Where product `b.product` is in version `live`: "" when it is live, `in OP %M` for the live node holding it
    (`held`: `holders(live, ...)`), else `gone` (a label never names a node its version lacks as if it were there)."""
    if b.product in live:
        return ""
    m = held.get(b.product)
    return f"in {live[m].op.value} %{m}" if m is not None else "gone"


def made_words(i: int, live: Graph, beside: Mapping[int, Beside], versions: Graph | None = None,
               held: Mapping[int, int] | None = None) -> str:
    """What node `i` of version `live` was made beside, whole (`Beside.said`), its product's place in `live` said
    where it is gone (`where_now`); "" for a node made beside no product. `held`: `holders(live, ...)` when the
    caller has it (computed here only for a product `live` lacks)."""
    b = beside.get(i)
    if b is None:
        return ""
    gone = b.product not in live
    return b.said(where_now(b, live, holders(live, beside, versions) if gone and held is None else held or {})
                  if gone else "")[0]


@dataclass(frozen=True)
class Remade:
    """A node a rewrite made beside its product in place of one node of the same op that an earlier match made
    (`remade_in_run`): gptj's matmul %227, which `fuse_attention_block.qkv_columns` made from
    `fuse_shared_input_matmul`'s merged Q/K/V projection %214 with its weight's columns in Q/K/V order.

    Attributes:
        new: the node made (`Node.absorbed` is `(old,)`).
        old: the node it re-makes, the product (`Match.fused`) of an earlier match.
        maker: the pass whose match made `old` (`fuse_shared_input_matmul`).
        rule: the rule whose rewrite made `new` (`fuse_attention_block.qkv_columns`).
        product: that rewrite's own product, beside which `new` was made (the attention %233).
        role: `old`'s role in that match's bindings (`qkv`), "" when it has none.
    """

    new: int
    old: int
    maker: str
    rule: str
    product: int
    role: str = ""

    @property
    def label(self) -> str:
        """`old`'s role as the re-making rule's messages name it (`pipeline.role_label`: `QKV projection`), ""
        without one."""
        return role_label(self.rule, self.role) if self.role else ""

    @property
    def what(self) -> str:
        """What `old` was, e.g. `fuse_shared_input_matmul's QKV projection` (the inspector's `replacing %214 (...)`)."""
        return f"{self.maker}'s {self.label or 'product'}"


_REMADE: DigestCache[dict[int, Remade]] = DigestCache(limit=4)


def remade_in_run(trace: Trace) -> dict[int, Remade]:
    """Each node of `trace` that re-makes an earlier match's product -> `Remade`: a node a step made that is no
    product of the step's matches, whose own list (`Node.absorbed`) is one node of its op that an earlier match made
    (`Match.fused`), and that the step's match bound or anchored on. The one rule by which a layer's line credits
    such a node to the pass that made the product (`why.facts.remade_words`), `explain -v` says it beside the match
    (`explain.side_products`) and the app's search and inspector say what it re-makes. Once per run."""
    def every() -> dict[int, Remade]:
        makers: dict[int, str] = {}
        out: dict[int, Remade] = {}
        for s in trace.steps:
            mine = [m for m in s.matches if m.fused is not None]
            for n in s.after:
                old = s.before.get(n.absorbed[0]) if len(n.absorbed) == 1 and n.id not in s.before else None
                if old is None or old.op != n.op or old.id not in makers or any(m.fused == n.id for m in mine):
                    continue
                m = next((m for m in mine if old.id in (m.anchor, *m.bindings.values())), None)
                if m is not None and m.fused is not None:
                    role = next((r for r, i in m.bindings.items() if i == old.id), "")
                    out[n.id] = Remade(n.id, old.id, makers[old.id], m.rule, m.fused, role)
            makers.update((m.fused, family_of(m.pass_name)) for m in mine)
        return out

    return _REMADE.get_or_compute(trace, every)


def step_makers(steps: Iterable[PassStep]) -> dict[int, str]:
    """Each node id a stage of a pass added (`PassStep.is_stage`) -> that stage's step name: glm's attention %298,
    made by `fuse_attention_block/qkv_columns`, whose `Node.pass_name` is the pass's (`engine.stage`: a stage records
    under its pass), `fuse_attention_block`."""
    return {i: s.pass_name for s in steps if s.is_stage for i in s.added}


_STAGES: DigestCache[dict[int, str]] = DigestCache(limit=4)


def stage_makers(trace: Trace) -> dict[int, str]:
    """`step_makers` of every step of `trace` (ids are never reused across versions); once per run."""
    return _STAGES.get_or_compute(trace, lambda: step_makers(trace.steps))


def maker(n: Node, makers: Mapping[int, str]) -> str:
    """Who made `n`, as its label (`by ...`), tooltip and the inspector's "created by" say it: the stage of its pass
    that made it (`makers`, `stage_makers`), else its `Node.pass_name` ("" for a node of the model)."""
    stage = makers.get(n.id)
    return stage if stage is not None and n.pass_name and family_of(stage) == n.pass_name else n.pass_name
