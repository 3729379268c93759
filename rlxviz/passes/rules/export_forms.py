"""`canonicalize_exported`: the forms exporters write, rewritten to the ops the fusion rules match.

The ONNX importer maps each ONNX node one to one; what used to be rewritten while reading (out of the trace:
no match record, no near-miss, nothing to toggle) is a rule here, at the head of the pipeline:

* `canonicalize_exported.silu`: `x * sigmoid(x)` (torch.onnx's silu) -> `silu(x)`. Exact: the IR defines
  `silu(x)` as that product (reference and MLX).
* `canonicalize_exported.rsqrt`: `1 / sqrt(y)` (torch.onnx writes `torch.rsqrt` as Reciprocal(Sqrt)) ->
  `rsqrt(y)`. Exact on the reference (its rsqrt is `1 / sqrt`); MLX's rsqrt kernel may round the last bit
  differently (within every tolerance of `runtime.tolerance`).
* `canonicalize_exported.where_bias`: `scores + where(keep, 0, finfo(f32).min)` (transformers' padding mask
  as torch.onnx exports it) -> `where(keep, scores, finfo(f32).min)`, the form `fuse_sdpa`'s where-mask rule
  matches. Exact where keep is true (`s + 0 == s`); where it is false, `s + min` rounds to `min` for every
  |s| < 2^103 (~1e31: min's ulp is 2^104), the value `where` puts there; guards: the fills are exactly 0 and
  f32's min (`bias_fills`), scores f32 (`scores_f32`), the bias does not widen the scores (`bias_no_widen`).
* `canonicalize_exported.nan_guard`: `where(isnan(p), 0, p)` with `p = softmax(s)` (torch's sdpa export guards
  fully masked rows so) -> `p`. Exact when no score is NaN or infinite: softmax subtracts the row max, so the
  denominator is >= 1 and no output is NaN. Inputs are finite (every front end checks them) and the exporters'
  masks fill with f32's min, so the guard `scores_finite` refuses only a constant fill of -inf/+inf/NaN among
  the nodes computing `s` (there a fully masked row is NaN and the guard gives 0: the rewrite would change it).

Left in the importer (they need constant values, which a pass does not read): `x + 0` with an all-zero constant
and transformers' RoPE tables (`models.onnx_import._hf_rope`).
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import DType, Graph, Op, Rewriter
from ...ir.infer import broadcast
from ..engine import rule_pass
from ..guard import ILLEGAL, NOT_RECOGNIZED, Ctx, guard
from ..pattern import P, const_value, is_const
from ..rule import QUIET, Fail, Rule, reports

F32_MIN = float(np.finfo(np.float32).min)


def _const_is(v: float):  # noqa: ANN202 - a pattern predicate
    def check(node) -> bool:  # noqa: ANN001
        return is_const(node) and const_value(node) == v
    check.__doc__ = f"the constant {v:g}"
    return check


SILU = Rule(
    "canonicalize_exported.silu",
    P(Op.MUL, P.var("x"), P(Op.SIGMOID, P.var("x"), name="sig"), name="mul", commutative=True),
    steps=(), result="mul", absorb=("sig", "mul"),
    build=lambda c: (Op.SILU, [c.id("x")], {}),
    doc="x * sigmoid(x) -> silu(x)")

RSQRT = Rule(
    "canonicalize_exported.rsqrt",
    P(Op.DIV, P.var("one", where=_const_is(1.0), what="the constant 1"), P(Op.SQRT, P.var("y"), name="root"),
      name="div"),
    steps=(), result="div", absorb=("root", "div"),
    build=lambda c: (Op.RSQRT, [c.id("y")], {}),
    doc="1 / sqrt(y) -> rsqrt(y)")


def _fills_ok(c: Ctx) -> bool:
    return const_value(c["zero"]) == 0.0 and const_value(c["fill"]) == F32_MIN


WHERE_BIAS = Rule(
    "canonicalize_exported.where_bias",
    P(Op.ADD, P.var("s"), P(Op.WHERE, P.var("keep"), P.var("zero", where=is_const, what="a scalar constant"),
                            P.var("fill", where=is_const, what="a scalar constant"), name="bias"),
      name="add", commutative=True),
    steps=(
        guard("bias_fills", _fills_ok,
              lambda c: f"{c.d('bias')} fills {const_value(c['zero']):.9g} where kept and "
                        f"{const_value(c['fill']):.9g} where masked; needs 0 and finfo(f32).min "
                        f"({F32_MIN:.9g})", requires=("bias", "zero", "fill"), kind=NOT_RECOGNIZED,
              fix="none: another fill is a different mask (the sum is not a where)"),
        guard("scores_f32", lambda c: c["s"].dtype == DType.f32,
              lambda c: f"{c.d('s')} is {c['s'].dtype}; needs f32 (the fill is f32's min)", requires=("s",),
              kind=NOT_RECOGNIZED),
        guard("bias_no_widen", lambda c: broadcast(c["s"].shape, c["bias"].shape) == c["s"].shape,
              lambda c: f"{c.d('bias')} {list(c['bias'].shape)} widens {c.d('s')} {list(c['s'].shape)}",
              requires=("bias", "s"), kind=ILLEGAL),
    ),
    result="add", absorb=("add",),  # the bias is left to DCE: every layer's scores add the same one
    build=lambda c: (Op.WHERE, [c.id("keep"), c.id("s"), c.id("fill")], {}),
    doc="scores + where(keep, 0, f32 min) -> where(keep, scores, f32 min)")


_SCAN_LIMIT = 64
"""Nodes walked up from the softmax looking for a non-finite constant (an attention's scores are a few ops)."""


def _nonfinite_const(g: Graph, root: int) -> int | None:
    """A non-finite scalar constant among the nodes computing `root`, stopping at matmuls and leaves; or None."""
    seen, stack = set(), [root]
    while stack and len(seen) < _SCAN_LIMIT:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        n = g[i]
        if is_const(n):
            v = const_value(n)
            if v is not None and not math.isfinite(v):
                return i
            continue
        if n.op in (Op.MATMUL, Op.INPUT, Op.PARAM, Op.CONST):
            continue
        stack.extend(n.inputs)
    return None


@reports(reads=("p", "p2"))
def _guards_the_softmax(c: Ctx) -> Fail | None:
    """The where reads the same softmax it tests."""
    return None if c.id("p") == c.id("p2") and c["p"].op == Op.SOFTMAX else QUIET


NAN_GUARD = Rule(
    "canonicalize_exported.nan_guard",
    P(Op.WHERE, P(Op.ISNAN, P.var("p"), name="isnan"), P.var("zero", where=_const_is(0.0), what="the constant 0"),
      P.var("p2"), name="guard"),
    steps=(
        _guards_the_softmax,
        guard("scores_finite", lambda c: _nonfinite_const(c.graph, c["p"].inputs[0]) is None,
              lambda c: f"{c.d('p')} reads a non-finite constant "
                        f"(node {_nonfinite_const(c.graph, c['p'].inputs[0])}): a fully masked row is NaN there and "
                        f"{c.d('guard')} makes it 0, so it cannot be dropped",
              requires=("p", "guard"), kind=ILLEGAL, fix="none: the guard is what such a mask needs"),
    ),
    result="guard", absorb=("isnan", "guard"),
    rewrite=lambda c, rw: _drop_guard(c, rw),
    doc="where(isnan(softmax(s)), 0, softmax(s)) -> softmax(s) (finite scores)")


def _drop_guard(c: Ctx, rw: Rewriter) -> int:
    rw.remove([c.id("isnan")])
    rw.replace(c.id("guard"), c.id("p"))
    return c.id("p")


canonicalize_exported = rule_pass(
    "canonicalize_exported", [SILU, RSQRT, WHERE_BIAS, NAN_GUARD],
    "forms exporters write (x*sigmoid(x), 1/sqrt, the padding-mask sum, the sdpa NaN guard) -> the IR's ops")

__all__ = ["NAN_GUARD", "RSQRT", "SILU", "WHERE_BIAS", "canonicalize_exported"]
