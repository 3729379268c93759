""""No rule recognizes this" as a finding: chains that look like a known family but were never a candidate.

A rule reports a rejection only when its anchor matched, so a family written in a form no rule anchors on
(a LayerNorm whose variance is `E[x^2] - E[x]^2`, a GELU divided by 2 instead of multiplied by 0.5, a
GELU-gated GLU, a `where` mask in front of a softmax) leaves no trace and "0 missed fusions" would be a lie.
`unrecognized(trace)` scans the graph the pipeline left (the version before `mark_elementwise_regions`
packs primitives into regions) for family signatures and reports those whose nodes no rule of the run ever
matched or rejected (no `Match`/`Rejection` binds, anchors or names any of them):

* `norm`: `reduce_mean` reaching `sqrt`/`rsqrt` within a few users (LayerNorm/RMSNorm statistics);
* `gelu`: `erf`, or `tanh` whose user adds a constant (`1 + tanh(...)`);
* `glu`: an activation whose result multiplies a matmul's of the same shape (a gated linear unit: gate and value
  halves of one width), directly or through identical reshapes of both halves (`gate_views`: Qwen2-MoE's shared
  expert as torch.onnx exports it; a SiLU- or GELU-gated one there is a gap in rlxviz's ops, remedy `compiler
  only`, `VIEW_GAP_FIX`, since FusedSwiGLU takes the form itself; `fuse_swiglu.viewed_dual_matmul` fuses two
  matmuls viewed by one reshape each, so only views it does not take leave such a finding). An activation
  broadcast over the other operand (Qwen2-MoE's shared-expert gate `sigmoid(x @ w_g)` `[B, S, 1]` times the
  expert's `[B, S, H]` output) scales a whole output and is no GLU;
* `activation`: an activation written as primitives (`activations.activation_form`: QuickGELU
  `x * sigmoid(1.702 x)`, Swish, squared ReLU), never mistaken for a gate. One that no op computes
  (`activations.has_op`) is a gap in rlxviz's ops, as `canonicalize_exported.activation_op` names it where it runs:
  its finding says so (remedy `compiler only`, the fix `activations.op_fix`), so the verdict counts it as that gap;
* `where_mask`: `where` feeding a softmax (a boolean attention mask);
* `attention`: an attention softmax left as primitives (rank 4, or rank 3+ read as the left operand of `P @ V`:
  heads folded into the batch, `architecture.attention_softmax`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..ir import Graph, Node, Op
from ..ir.ops import GATE_ACTIVATIONS
from .activations import OP_GAP_HINT, activation_form, epilogue_blocker, has_op, op_fix
from .architecture import attention_softmax
from .declarations import FAMILIES, FINDING, FINDING_QUANTIZATION
from .refusal_kinds import COMPILER_ONLY, NOT_RECOGNIZED, NOTHING_TO_CHANGE
from .report import MissedFusion
from .trace import Rejection, Trace, place_label
from .views import GATED, VIEWS, gate_views

GUARD = "no_rule"
"""The guard name of an unrecognized finding (as `MissedFusion.guard`)."""



@dataclass(frozen=True)
class Unrecognized:
    """A chain that looks like `family` but no rule made it a candidate.

    Attributes:
        family: a key of `FAMILIES`.
        nodes: the chain's node ids (the signature node first), in the scanned graph version.
        path: the first node's model path.
        reason: one line naming the nodes and what they look like.
        hint: how to make a rule see it (for an activation no op computes: that the model has nothing to change).
        remedy: `refusal_kinds.COMPILER_ONLY` for an activation no op computes (no change to the model keeps its
            numbers: a gap in rlxviz's ops), else "".
        fix: the compiler fix when `remedy` says it is the only one (`activations.op_fix`), else "".
    """

    family: str
    nodes: tuple[int, ...]
    path: str
    reason: str
    hint: str
    remedy: str = ""
    fix: str = ""

    def __str__(self) -> str:
        where = place_label(self.nodes[0], self.path, with_node=True)
        return f"{FINDING}.{self.family} @ {where}: {GUARD}: {self.reason}"

    def as_rejection(self) -> Rejection:
        """The finding as the refusal record every place-reading view reads (`why.places.step_refusals`: the app's
        version chips and matches table): pass `FINDING`, rule `unrecognized.<family>`, guard `no_rule`, kind `not
        recognized` (no rule takes this form), anchored at the chain's first node, the chain's nodes offending."""
        return Rejection(FINDING, f"{FINDING}.{self.family}", self.nodes[0], "structure", GUARD, self.reason,
                         offending=self.nodes, path=self.path, hint=self.hint, kind=NOT_RECOGNIZED, fix=self.fix,
                         remedy=self.remedy)

    def as_missed(self) -> MissedFusion:
        """The finding as a `MissedFusion`, the fields of `as_rejection` (the verdict's, `explain`'s and `--json`'s
        record; the chips and the table read `as_rejection`'s)."""
        r = self.as_rejection()
        return MissedFusion(r.rule, r.anchor, r.path, r.guard, r.message, r.hint, r.kind, r.fix, remedy=r.remedy)


def _forward(g: Graph, start: int, depth: int) -> list[int]:
    out, seen, todo = [], {start}, deque([(start, 0)])
    while todo:
        i, d = todo.popleft()
        out.append(i)
        if d == depth:
            continue
        for u in g.users(i):
            if u.id not in seen:
                seen.add(u.id)
                todo.append((u.id, d + 1))
    return out


def _const_operand(g: Graph, n: Node) -> bool:
    return any(g[i].op == Op.CONST for i in n.inputs)


VIEW_GAP_HINT = (f"{NOTHING_TO_CHANGE}: the model's gated MLP is the form FusedSwiGLU takes; the reshapes between "
                 "its projections and the gate product hide it from fuse_swiglu's rules; the fix is in the compiler")
"""The fix line in the model of a SiLU- or GELU-gated GLU whose halves reach the product through identical reshapes
(`gate_views`): a statement (its remedy is `compiler only`)."""

VIEW_GAP_FIX = ("a rule moving these reshapes past the gate product (mul(act(reshape(a)), reshape(b)) -> "
                "reshape(mul(act(a), b)), as fuse_swiglu.viewed_dual_matmul does for two matmuls viewed by one "
                "reshape each); then fuse_swiglu takes it")
"""The compiler fix of such a GLU; its first clause is the form rlxviz lacks (`why.policy.fix_gap_form`)."""


def _through_views(g: Graph, act: Node, other: Node, mul: Node, views: tuple[int, ...]) -> str:
    src = next(g[i] for i in reversed(views) if g[i].op not in VIEWS)
    reshapes = ", ".join(f"%{i}" for i in (*views, other.id) if g[i].op in VIEWS)
    return (f"{act.op.value} %{act.id} gates {src.op.value} %{src.id} in mul %{mul.id} through reshape(s) "
            f"{reshapes} (both halves {list(src.shape)} -> {list(other.shape)})")


def _signatures(g: Graph) -> list[tuple[str, tuple[int, ...], str]]:
    """`(family, nodes, what)` for every family signature in `g` (an `activation` signature's first node is its
    form's result, `activations.ActivationForm.out`)."""
    found: list[tuple[str, tuple[int, ...], str]] = []
    for n in g:
        if n.op == Op.REDUCE_MEAN:
            chain = _forward(g, n.id, 5)
            roots = [i for i in chain if g[i].op in (Op.SQRT, Op.RSQRT)]
            if roots:
                keep = chain[:chain.index(roots[0]) + 1]
                found.append(("norm", tuple(keep), f"reduce_mean %{n.id} reaches {g[roots[0]].op.value} "
                                                   f"%{roots[0]}"))
        elif n.op == Op.ERF or (n.op == Op.TANH and any(u.op == Op.ADD and _const_operand(g, u)
                                                         for u in g.users(n.id))):
            found.append(("gelu", (n.id, *(u.id for u in g.users(n.id))), f"{n.op.value} %{n.id} inside a "
                                                                          f"0.5 * x * (1 + ...) product"))
        elif (form := activation_form(g, n)) is not None:
            found.append(("activation", (form.out, *form.nodes[:-1]), f"{form.name} {form.formula}"))
        elif n.op in (Op.GELU, Op.GELU_TANH, Op.SILU, Op.RELU, Op.RELU2, Op.SIGMOID):
            for u in g.users(n.id):
                if activation_form(g, u) is not None:  # x * sigmoid(k x): an activation, not a gate
                    continue
                other = next((g[i] for i in u.inputs if i != n.id), None) if u.op == Op.MUL else None
                if other is None or n.shape != other.shape:  # a gate broadcast over the other's features scales it
                    continue
                if other.op in GATED:
                    found.append(("glu", (u.id, n.id, other.id), f"{n.op.value} %{n.id} gates {other.op.value} "
                                                                 f"%{other.id} in mul %{u.id}"))
                elif (views := gate_views(g, n, other)) is not None:
                    found.append(("glu", (u.id, n.id, other.id, *views), _through_views(g, n, other, u, views)))
        elif n.op == Op.WHERE and any(u.op == Op.SOFTMAX for u in g.users(n.id)):
            sm = next(u for u in g.users(n.id) if u.op == Op.SOFTMAX)
            found.append(("where_mask", (n.id, sm.id), f"where %{n.id} masks the scores of softmax %{sm.id}"))
        elif attention_softmax(g, n):
            scores = "[B, heads, Sq, Sk]" if n.rank == 4 else f"{list(n.shape)} (heads folded into the batch)"
            found.append(("attention", (n.id,), f"softmax %{n.id} over {scores} scores, read by P @ V"
                          if n.rank != 4 else f"softmax %{n.id} over {scores} scores"))
    return found


def _scanned(trace: Trace) -> Graph:
    """The last version before `mark_elementwise_regions` (regions hide primitives)."""
    g = trace.input
    for s in trace.steps:
        if s.pass_name == "mark_elementwise_regions":
            break
        g = s.after
    return g


def _touched(trace: Trace) -> set[int]:
    """Every node id any fusion rule's match or rejection of the run anchored on, bound or named (region
    marking is not recognition: it packs whatever elementwise chain it finds)."""
    ids: set[int] = set()
    for s in trace.steps:
        if s.pass_name == "mark_elementwise_regions":
            continue
        for r in s.rejections:
            ids |= {r.anchor, *r.bindings.values(), *r.offending}
            if r.subject is not None:
                ids.add(r.subject)
        for m in s.matches:
            ids |= {m.anchor, *m.bindings.values()}
    return ids


def unrecognized(trace: Trace) -> list[Unrecognized]:
    """Family-looking chains of the run that no rule ever matched or rejected, in graph order."""
    g = _scanned(trace)
    touched = _touched(trace)
    out = []
    claimed: set[int] = set()
    for family, nodes, what in _signatures(g):
        core = nodes[:3] if family == "glu" else nodes  # a gate's views are read by the rules that made its act
        if touched & set(core) or claimed & set(nodes):
            continue
        claimed |= set(nodes)
        name, hint = FAMILIES[family]
        form = activation_form(g, g[nodes[0]]) if family == "activation" else None
        gap = form is not None and not has_op(form)  # no op computes it: a gap in rlxviz's ops, not a model change
        fix = op_fix(form, epilogue_blocker(g, form)) if gap and form is not None else ""
        if family == "glu" and len(nodes) > 3 and g[nodes[1]].op in GATE_ACTIVATIONS:
            hint, fix = VIEW_GAP_HINT, VIEW_GAP_FIX  # FusedSwiGLU takes it, but for the views: rlxviz's gap
        out.append(Unrecognized(family, nodes, g[nodes[0]].path,
                                f"{what} looks like {name} (nodes {', '.join(f'%{i}' for i in nodes)}), but no rule "
                                f"made it a candidate", OP_GAP_HINT if gap else hint,
                                COMPILER_ONLY if fix else "", fix))
    return out


__all__ = ["FAMILIES", "FINDING", "FINDING_QUANTIZATION", "GUARD", "VIEW_GAP_FIX", "VIEW_GAP_HINT", "Unrecognized",
           "unrecognized"]
