"""Activation forms exporters write as primitives, recognized by name so a layer's MLP is never lost.

No fused op of rlxviz takes these forms as written (the epilogue allow-list is `guard.EPILOGUE_ACTIVATIONS`;
squared ReLU enters it as `relu2` once `canonicalize_exported.relu2` rewrote it), so nothing is rewritten here:
`activation_form(g, n)` names the form whose result node is `n`, and the layer kind
(`architecture`), the epilogue rejection (`fuse_matmul_bias_act`), FusedTransformerLayer's `fc1_activation`
and the unrecognized scan read that name. A CLIP layer (QuickGELU) is a layer with an MLP, never
"attention only (no MLP)", and the activation the fused linear leaves outside is a line of `explain`.

Forms (each exact: recognized only when it computes that function of `x`, elementwise, in any dtype):

* swish family `x * sigmoid(k * x)` (operands of both products in either order; `k * x` also as `x / c`,
  `k = 1/c`), `k` a scalar constant: `k == 1` SiLU, `k == 1.702` (to 1e-6 relative) QuickGELU (CLIP,
  `quick_gelu`), any other `k` Swish with that beta. The same node `x` must be read by the sigmoid's argument and
  by the elementwise product `x * sigmoid(k x)`; a different node there is a gate (GLU), not this family.
* squared ReLU `relu(x) * relu(x)` (one relu node read twice) or `pow(relu(x), 2)` (Primer).

`SiLU` as `x * sigmoid(x)` is also rewritten to `silu` by `canonicalize_exported.silu`, squared ReLU to `relu2`
(an epilogue activation) by `canonicalize_exported.relu2`; the others stay as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir import Graph, Node, Op
from .pattern import const_value, describe, is_const
from .refusal_kinds import NOTHING_TO_CHANGE

SQUARED_RELU = "squared ReLU"
"""`ActivationForm.name` of `relu(x)^2`."""
QUICK_GELU_BETA = 1.702
"""CLIP's QuickGELU: `x * sigmoid(1.702 x)` (Hugging Face `QuickGELUActivation`)."""


@dataclass(frozen=True)
class ActivationForm:
    """A recognized activation written as primitives.

    Attributes:
        name: `QuickGELU`, `SiLU`, `Swish (beta=k)` or `squared ReLU`.
        formula: the function, e.g. `x * sigmoid(1.702 * x)`.
        x: the node id of the activation's input.
        out: the node id of its result (the elementwise product `x * sigmoid(k x)`, or the square).
        nodes: every node of the form (computed from `x`), `out` last.
    """

    name: str
    formula: str
    x: int
    out: int
    nodes: tuple[int, ...]

    def describe(self) -> str:
        """`QuickGELU x * sigmoid(1.702 * x) (nodes %57, %58, %59)`."""
        return f"{self.name} {self.formula} (nodes {', '.join(f'%{i}' for i in self.nodes)})"


def _scalar(g: Graph, i: int) -> float | None:
    n = g[i]
    if not is_const(n) or n.shape not in ((), (1,)):
        return None
    v = const_value(n)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _scaled(g: Graph, t: Node, x: int) -> float | None:
    """`k` when `t` computes `k * x` (`mul` with a scalar constant, or `x / c`), 1.0 when `t` is `x`."""
    if t.id == x:
        return 1.0
    if t.op == Op.MUL:
        a, b = t.inputs
        for var, k in ((a, b), (b, a)):
            if var == x and (v := _scalar(g, k)) is not None:
                return v
    if t.op == Op.DIV and t.inputs[0] == x and (c := _scalar(g, t.inputs[1])):
        return 1.0 / c
    return None


def _swish(g: Graph, n: Node) -> ActivationForm | None:
    a, b = (g[i] for i in n.inputs)
    for x, s in ((a, b), (b, a)):
        if s.op != Op.SIGMOID or x.id == s.id:
            continue
        t = g[s.inputs[0]]
        k = _scaled(g, t, x.id)
        if k is None:
            continue
        nodes = (*sorted({t.id, s.id} - {x.id}), n.id)
        if math.isclose(k, QUICK_GELU_BETA, rel_tol=1e-6):
            return ActivationForm("QuickGELU", f"x * sigmoid({QUICK_GELU_BETA} * x)", x.id, n.id, nodes)
        if k == 1.0:
            return ActivationForm("SiLU", "x * sigmoid(x)", x.id, n.id, nodes)
        return ActivationForm(f"Swish (beta={k:.6g})", f"x * sigmoid({k:.6g} * x)", x.id, n.id, nodes)
    return None


def _squared_relu(g: Graph, n: Node) -> ActivationForm | None:
    r = g[n.inputs[0]]
    if r.op != Op.RELU:
        return None
    if (n.op == Op.MUL and n.inputs == (r.id, r.id)) or (n.op == Op.POW and _scalar(g, n.inputs[1]) == 2.0):
        return ActivationForm(SQUARED_RELU, "relu(x)^2", r.inputs[0], n.id, (r.id, n.id))
    return None


def activation_form(g: Graph, n: Node) -> ActivationForm | None:
    """The activation form whose result is `n`, or None (see the module doc for the forms)."""
    if n.op == Op.MUL and len(n.inputs) == 2:
        return _swish(g, n) or _squared_relu(g, n)
    if n.op == Op.POW and len(n.inputs) == 2:
        return _squared_relu(g, n)
    return None


def activation_of(g: Graph, x: int) -> ActivationForm | None:
    """The activation form applied to node `x` (reading `x` through its own nodes only), or None."""
    todo, seen = list(g.users(x)), set()
    for _ in range(3):
        nxt = []
        for u in todo:
            if u.id in seen:
                continue
            seen.add(u.id)
            f = activation_form(g, u)
            if f is not None and f.x == x:
                return f
            nxt.extend(g.users(u.id))
        todo = nxt
    return None


def owns_users(g: Graph, f: ActivationForm) -> bool:
    """Every reader of `x` and of each inner node is a node of the form: the form is all `x` feeds."""
    inside = set(f.nodes)
    inner = [i for i in f.nodes if i != f.out]
    return all(u.id in inside for i in (f.x, *inner) for u in g.users(i)) and not any(g.is_output(i) for i in inner)


HAS_OP = ("SiLU", SQUARED_RELU)
"""The forms an IR op computes (`silu`, `relu2`: `canonicalize_exported` rewrites them to it); every other form has no
op in rlxviz (`has_op`)."""


def has_op(f: ActivationForm) -> bool:
    """Whether an IR op computes the form `f` (`HAS_OP`): False for QuickGELU and Swish with another beta, which stay
    as primitives that no fused op takes."""
    return f.name in HAS_OP


def epilogue_blocker(g: Graph, f: ActivationForm) -> str:
    """Why `FusedMatMulBiasAct`'s patterns could not take the form `f` as its epilogue even with an op for it ("" when
    they could): its input `x` must be a linear's output, `x @ w + bias` (`fuse_matmul_bias_act.bias_act`: the
    matmul read by that add alone, a bias of shape `[]`, `[1]` or `[N]`) or a bare `x @ w` (`.zero_bias_act`), and
    the form must be all that reads `x` (`owns_users`), none of them a graph output. E.g. gpt-oss's experts apply
    QuickGELU to `clamp(slice(gate))`: `its input, min (node 129, ...), is no linear's output x @ w + bias or
    x @ w`."""
    x = g[f.x]
    mm = next((g[i] for i in x.inputs if g[i].op == Op.MATMUL), None) if x.op == Op.ADD else None
    if x.op != Op.MATMUL and mm is None:
        return f"its input, {describe(x)}, is no linear's output x @ w + bias or x @ w"
    if mm is not None:
        bias = g[next(i for i in x.inputs if i != mm.id)] if x.inputs.count(mm.id) == 1 else mm
        if bias.shape not in ((), (1,), (mm.shape[-1],)):
            return f"its input, {describe(x)}, adds a term of shape {list(bias.shape)} to a matmul, not a bias"
        if len(g.users(mm.id)) != 1 or g.is_output(mm.id):
            return f"its input's matmul, {describe(mm)}, is read outside the linear too"
    if g.is_output(x.id) or not owns_users(g, f):
        return f"its input, {describe(x)}, is read outside the activation too"
    return ""


def op_fix(f: ActivationForm, blocker: str = "") -> str:
    """The compiler fix of a form no op computes (`has_op` False): `a QuickGELU op (x * sigmoid(1.702 * x)); then
    FusedMatMulBiasAct takes it as an epilogue once the allow-list has it` when its input is a linear's output
    FusedMatMulBiasAct could take it from (`blocker` "", see `epilogue_blocker`), else the op alone: `a QuickGELU op
    (x * sigmoid(1.702 * x))`. Its first clause, up to `; `, is the op form rlxviz lacks (`why.policy.fix_gap_form`:
    `QuickGELU op`)."""
    op = f"a {f.name} op ({f.formula})"
    return op if blocker else f"{op}; then FusedMatMulBiasAct takes it as an epilogue once the allow-list has it"


OP_GAP_HINT = (f"{NOTHING_TO_CHANGE}: keep the model's activation (another activation changes what it "
               "computes); the fix is in the compiler")
"""The fix line in the model of an activation form no op computes: a statement, not a change (its refusal's remedy is
`compiler only`)."""


__all__ = ["HAS_OP", "OP_GAP_HINT", "QUICK_GELU_BETA", "SQUARED_RELU", "ActivationForm", "activation_form",
           "activation_of", "epilogue_blocker", "has_op", "op_fix", "owns_users"]
