"""`fuse_swiglu.gate_views` (stage `fuse_swiglu/gate_views`, before the pass's own rules): a gated MLP whose halves
reach the gate product through identical reshapes, `mul(act(reshape(a)), reshape(b))` -> `reshape(mul(act(a), b))`,
so `fuse_swiglu` sees its own form.

torch.onnx writes Qwen2-MoE's shared expert (an `nn.Linear` applied to tokens flattened to `[S, H]`) as
`silu(reshape(x @ wg, [S, N])) * reshape(x @ wu, [S, N])` with both products `[1, S, N]`; no `fuse_swiglu` rule
anchors on a reshape, so the SwiGLU stayed primitives (the `glu` scan names such a chain left alone,
`unrecognized.glu`). A stage of `fuse_swiglu`, not a rule of `canonicalize_exported`: the gate is `silu` only
after that pass's `silu` rule, and a pass matches on its input graph once. `act` is a gate `FusedSwiGLU` takes
(`ir.ops.GATE_ACTIVATIONS`: silu, gelu, gelu_tanh), `a` and `b` projections (`views.GATED`: a matmul, a linear,
a narrow of a packed one).

Validity (numbers equal for every input, bit for bit): a reshape (`views.VIEWS`) keeps every element and its
row-major order, so element k of `reshape(a)` is element k of `a`; an elementwise op of equal-shaped operands
computes element k from the operands' elements k alone, so `act(reshape(a)) * reshape(b)` and
`reshape(act(a) * b)` compute every element from the same two numbers by the same ops. Conditions, all
structural (anything else is another form, no record): both reshapes view one source shape as one target shape
(`views.gate_views`), `a` and `b` of one shape and dtype (no broadcast in the new product). Guard
`views_single_use`: the two reshapes and the activation are read by nothing else and are no output (the rewrite
drops them; a reader elsewhere would keep a matmul read twice, which `fuse_swiglu`'s `swiglu_single_use`
refuses anyway).
"""

from __future__ import annotations

from ...ir import Op, Rewriter
from ...ir.ops import GATE_ACTIVATIONS
from ..engine import rule_pass
from ..guard import Ctx, all_single_use
from ..pattern import P
from ..rule import QUIET, Fail, Rule, reports
from ..views import gate_views


@reports(reads=("a", "b", "act", "rb"))
def _identical_views(c: Ctx) -> Fail | None:
    """Only projections of one shape viewed as one shape (`views.gate_views`), `a` and `b` of one shape, are this
    form."""
    same = c["a"].shape == c["b"].shape and c["a"].dtype == c["b"].dtype
    return None if same and gate_views(c.graph, c["act"], c["rb"]) is not None else QUIET


def _views_after(c: Ctx, rw: Rewriter) -> int:
    """reshape(mul(act(a), b)) in the mul's operand order, the mul's shape."""
    mul = c["mul"]
    act = c["act"]
    with rw.provenance([c.id("ra"), c.id("act"), c.id("rb"), c.id("mul")]):
        gate = rw.emit(act.op, [c.id("a")], **act.attrs)
        operands = [gate if i == act.id else c.id("b") for i in mul.inputs]
        out = rw.emit(Op.RESHAPE, [rw.emit(Op.MUL, operands)], shape=tuple(mul.shape))
    rw.remove([c.id("ra"), c.id("act"), c.id("rb")])
    rw.replace(c.id("mul"), out)
    return out


GATE_VIEWS = Rule(
    "fuse_swiglu.gate_views",
    P(Op.MUL, P(frozenset(GATE_ACTIVATIONS), P(Op.RESHAPE, P.var("a"), name="ra"), name="act"),
      P(Op.RESHAPE, P.var("b"), name="rb"), name="mul", commutative=True),
    steps=(_identical_views,
           all_single_use(("ra", "rb", "act"), "views_single_use",
                          fix="none: the gate's halves are read elsewhere, so no FusedSwiGLU takes them")),
    result="mul", absorb=("ra", "act", "rb", "mul"), labels={"act": "gate activation"},
    rewrite=lambda c, rw: _views_after(c, rw),
    doc="act(reshape(a)) * reshape(b), identical views -> reshape(act(a) * b)",
    form="reshapes moved past the gate product")

GATE_VIEWS_PASS = rule_pass("fuse_swiglu", [GATE_VIEWS], "a gated MLP's identical reshapes moved past its gate "
                                                        "product")
"""The rule as a stage of `fuse_swiglu` (`engine.compose`)."""

__all__ = ["GATE_VIEWS", "GATE_VIEWS_PASS"]
