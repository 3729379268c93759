"""Which ONNX nodes an IR node came from, for the inspector (no Panel import).

* `onnx_origin`: the ONNX nodes of a node: its own, or every one a fusion absorbed, through the fusions before it,
  less those another node of its version computes (`onnx_claims`).
* `onnx_in_part`: which of them a node absorbed in part (FastGelu's bias add, not its gelu_tanh).
* `onnx_markdown`: the inspector's line for them, bounded: the compute nodes first (MatMul, Softmax, ...), the rest
  counted by op type.
* `onnx_domain`: the ONNX domain an op type came from, read off the importer's table.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..ir import Graph, Node, Op
from ..passes.made import absorbers, is_copy, replaced
from .text import md_code, md_escape

if TYPE_CHECKING:
    from ..passes.made import Beside

ONNX_NAMES_SHOWN = 6
"""Most ONNX node names the inspector lists for a node made of several (the rest counted by op type)."""
OP_TYPES_COUNTED = 6
"""Most op types the count of the ONNX nodes not listed names (the rest summed as `other`)."""

_COMPUTE = ("MatMul", "Gemm", "Conv", "Softmax", "Attention", "Norm", "Einsum", "Gelu", "Rotary")
"""Parts of an ONNX op type that mark what a fusion computes: listed first, before the elementwise ops."""
_LAYOUT = frozenset({"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Slice", "Gather", "Concat", "Cast", "Constant",
                     "Identity", "Expand", "Split", "Flatten", "Shape", "ConstantOfShape", "Range"})
"""ONNX op types that only move or reshape data: listed last (mostly counted)."""


def _rank(op_type: str) -> int:
    """0 for a compute op type (`_COMPUTE`), 2 for a layout one (`_LAYOUT`), 1 for any other."""
    if any(c in op_type for c in _COMPUTE):
        return 0
    return 2 if op_type in _LAYOUT else 1


def onnx_origin(n: Node, onnx_nodes: Mapping[int, tuple[str, str, str]] | None,
                versions: Graph | None = None, live: Graph | None = None,
                beside: Mapping[int, Beside] | None = None) -> list[tuple[str, str]]:
    """The ONNX nodes `n` came from, as `(op type, node name)`, each once (`onnx_claims`, named): its own, or every
    imported node a pass absorbed into it, through the nodes earlier passes made: gptj's attention %251 -> its
    MatMuls, Softmax, Mul, Slices ..., not only the two Reshapes it absorbed itself. Compute op types first
    (`_rank`), each group in the file's order. [] for a model not read from ONNX."""
    if not onnx_nodes:
        return []
    order = {i: k for k, i in enumerate(onnx_nodes)}
    ids = sorted(onnx_claims(n, onnx_nodes, versions, live, beside),
                 key=lambda i: (_rank(onnx_nodes[i][0]), order[i]))
    return list(dict.fromkeys((onnx_nodes[i][0], onnx_nodes[i][1]) for i in ids))


InPart = dict[str, tuple[tuple[str, ...], tuple[str, ...]]]
"""ONNX node name -> (IR op of each of its IR nodes a node claims, `OP %ID` of each it does not): `onnx_in_part`."""


def onnx_in_part(n: Node, onnx_nodes: Mapping[int, tuple[str, str, str]] | None, versions: Graph | None = None,
                 live: Graph | None = None, beside: Mapping[int, Beside] | None = None) -> InPart:
    """The ONNX nodes a node a pass made absorbed in part (arguments as `onnx_claims`): the importer made several
    IR nodes of one ONNX node (a FastGelu: its bias param, an add, a gelu_tanh) and `n` claims some of the compute
    ones (not params or consts) but not all. gpt2.ortopt's `FusedMatMulBiasAct %122` took FastGelu_AddBias_0's add
    and left its gelu_tanh %57 out: `{"FastGelu_AddBias_0": (("add",), ("gelu_tanh %57",))}`. An ONNX node is
    known by its op type and name (an unnamed one is never grouped). {} for an imported `n` (its own ONNX node),
    without `versions` (the IR ops unknown), or none absorbed in part."""
    if not onnx_nodes or versions is None or n.id in onnx_nodes:
        return {}
    claims = onnx_claims(n, onnx_nodes, versions, live, beside)
    named = {onnx_nodes[i][:2] for i in claims if onnx_nodes[i][1]}
    parts: dict[tuple[str, str], list[int]] = {}
    for i, (op, name, _) in onnx_nodes.items():  # every IR node made of each ONNX node `n` names
        if (op, name) in named and i in versions and versions[i].op not in (Op.PARAM, Op.CONST):
            parts.setdefault((op, name), []).append(i)
    out: InPart = {}
    for (_, name), ids in parts.items():
        rest = [i for i in ids if i not in claims]
        if rest and len(rest) < len(ids):
            out[name] = (tuple(versions[i].op.value for i in ids if i in claims),
                         tuple(f"{versions[i].op.value} %{i}" for i in rest))
    return out


def onnx_claims(n: Node, onnx_nodes: Mapping[int, tuple[str, str, str]] | None, versions: Graph | None = None,
                live: Graph | None = None, beside: Mapping[int, Beside] | None = None) -> set[int]:
    """The imported node ids (`onnx_nodes` keys) `n` claims in its version `live`: each imported node is claimed by
    at most one live node of a version, the one that computes it (none once a pass removed it; an ONNX node the
    importer split into several IR nodes, a Gather and its table, is named by each of them). `n`'s own id when
    imported; else the absorbed ids followed back through the nodes earlier passes made (`versions`: every node of
    the run, `viz.overlay.all_versions`; without it, one step back), except
    * a node still live in `live` (absorbed by a match but kept for another reader): it claims its own;
    * a node made beside a match's product with the product's list (`beside`: `passes.made.made_in_run`; the
      reshape and transpose `rope_heads` makes after its rope, a mask cast before an attention): the rewriter gives
      it the match's list, which is the product's. So esm's attention, which absorbed the transposes after its ropes,
      claims its MatMuls and Softmax, not the rotation the ropes still compute; and such an `n` claims nothing (one
      that re-makes part of the list, `qkv_columns`' new rope, claims that part);
    * a node another live node of `live` replaced nearer (`passes.made.replaced`): itself, where `n` reached it
      through an earlier fusion, or in a shorter list than `n`'s own, or one as long made after it
      (`fuse_shared_input_matmul`'s merged matmul holds the match's matmuls and bias adds, its merged bias add the
      adds: the adds are the add's). A node only listed by another live node, not replaced by it, stays `n`'s:
      qwen2-moe's merged matmul %345 claims the shared expert's gate/up Gemms through matmul %328, which
      `fuse_swiglu.viewed_dual_matmul` re-made of them beside FusedSwiGLU %329, whose list still names them.
    The first level is `passes.made.replaced`, what the drawing counts as the node's "absorbed N".

    Args:
        onnx_nodes: `Model.meta["onnx_nodes"]` (IR node id -> (op type, node name, doc string), from the importer).
        live: the version `n` is shown in (None: no node of it is taken as live).
        beside: node id -> what a node a match made beside its product is (`passes.made.made_in_run`).
    """
    if not onnx_nodes:
        return set()
    if n.id in onnx_nodes:
        return {n.id}
    beside = beside or {}

    def copy(i: int) -> bool:  # made beside a product, holding the product's list as it is (or, unknown, so taken)
        return is_copy(i, beside, versions)

    # what `n` itself replaced (`passes.made.replaced`: the drawing's "absorbed N" reads the same), then followed back
    first = replaced(n, live, beside, versions) if live is not None else () if copy(n.id) else n.absorbed
    direct = absorbers(live) if live is not None else {}

    own: dict[int, tuple[int, ...]] = {}  # live node -> what it replaced itself, read once

    def nearer(i: int) -> bool:  # reached through an earlier fusion: another live node's that replaced it itself
        for _, m in direct.get(i, ()):
            if m != n.id and m not in own and live is not None:
                own[m] = replaced(live[m], live, beside, versions)
            if m != n.id and i in own.get(m, ()):
                return True
        return False

    found: set[int] = set()
    seen: set[int] = {n.id}
    todo = [(i, 1) for i in first]
    while todo:
        i, depth = todo.pop()
        if i in seen or (live is not None and i in live) or copy(i) or (depth > 1 and nearer(i)):
            continue
        seen.add(i)
        if i in onnx_nodes:
            found.add(i)
        elif versions is not None and i in versions:
            todo += [(j, depth + 1) for j in versions[i].absorbed]
    return found


def onnx_markdown(rep: Mapping[str, Any]) -> str:
    """The inspector's line for a `node_report`'s `onnx` (`onnx_origin`), "" for none: `**ONNX node** ...` for an
    imported node; for a node a pass made, `**absorbed ONNX nodes** (38): node_linear (MatMul), domain ai.onnx;
    ... and 32 more: 14 Slice, 6 Mul, 4 Reshape, 4 Transpose, 4 other` (`ONNX_NAMES_SHOWN` listed, compute ops first);
    one it absorbed in part (`onnx_part`: `onnx_in_part`) says what it took, `FastGelu_AddBias_0 (FastGelu, in part:
    its add, not its gelu_tanh %57)`, and the counted rest how many of them were;
    for a node made beside a match's product (`onnx_product`: `rope %777`), `... none of its own; its match's are
    named by rope %777`. Each name, op type and domain is escaped (text from the model)."""
    onnx = rep.get("onnx") or []
    if not onnx:  # made beside a product (`onnx_claims`): the match's ONNX nodes are the product's
        return (f"**absorbed ONNX nodes**: none of its own; its match's are named by {md_escape(rep['onnx_product'])}"
                if rep.get("onnx_product") else "")
    known = rep.get("onnx_domains") or {}  # the file's own word; else read off the importer's table
    part = rep.get("onnx_part") or {}  # absorbed in part (`onnx_in_part`): what it took of the node, what not
    named = [f"{md_code(name or '(unnamed)')} ({md_escape(op)}{_in_part(part.get(name))}), "
             f"domain {md_code(known.get(name) or onnx_domain(op))}" for op, name in onnx[:ONNX_NAMES_SHOWN]]
    rest = Counter(op for op, _ in onnx[ONNX_NAMES_SHOWN:])
    counted = [f"{c} {md_escape(op)}" for op, c in rest.most_common(OP_TYPES_COUNTED)]
    other = sum(rest.values()) - sum(c for _, c in rest.most_common(OP_TYPES_COUNTED))
    more = f" and {sum(rest.values())} more: {', '.join(counted + ([f'{other} other'] if other else []))}" \
        if rest else ""
    if inside := sum(1 for _, name in onnx[ONNX_NAMES_SHOWN:] if name in part):
        more += f" ({inside} of them in part)"
    if rep.get("onnx_own"):
        what = "**ONNX node**"
    else:  # a node a pass made: the ONNX nodes its fusions took in, counted, so none reads as its whole source
        what = f"**absorbed ONNX nodes** ({len(onnx)}, compute first):"
    return f"{what} {'; '.join(named)}{more}"


def _in_part(part: tuple[tuple[str, ...], tuple[str, ...]] | None) -> str:
    """`, in part: its add, not its gelu_tanh %57` for an ONNX node absorbed in part (`InPart`'s value), escaped;
    "" for None."""
    if not part:
        return ""
    took, left = part
    return md_escape(f", in part: its {' and '.join(took)}, not its {' and '.join(left)}")


DEFAULT_DOMAIN = "ai.onnx"
"""How the inspector names ONNX's default domain (written "" or "ai.onnx" in a file)."""


@functools.cache
def onnx_domain(op_type: str) -> str:
    """The ONNX domain an imported node of `op_type` came from, read off the importer's table
    (`models.onnx.HANDLERS`, keyed by (domain, op type)): every node the importer keeps is read by a
    handler of its domain, or kept as a host node, which only a default-domain node becomes. So an op type the
    table reads only in `com.microsoft` came from there, any other from `ai.onnx`; an op type read in both (Gelu,
    SimplifiedLayerNormalization) gives both, joined by " or " (the import keeps the op type, not the domain).
    Raises nothing."""
    from ..models.onnx.context import HANDLERS  # the package import registers every handler

    domains = {d or DEFAULT_DOMAIN for d, op in HANDLERS if op == op_type} or {DEFAULT_DOMAIN}
    domains = sorted(domains, key=lambda d: (d != DEFAULT_DOMAIN, d))  # ai.onnx first
    return " or ".join(domains)
