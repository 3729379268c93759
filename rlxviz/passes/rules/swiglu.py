"""`fuse_swiglu`: `act(gate) * up` -> `FusedSwiGLU` (docs/rlx.md §2.3.6, §2.3.8), three rules, for every gate of
`ir.ops.GATE_ACTIVATIONS`: SwiGLU (`silu`, LLaMA) and GeGLU (`gelu` / `gelu_tanh`: Gemma, T5 v1.1's gated-gelu),
the gate recorded in the fused op's `activation` (default `silu`; one op, one decomposition, so a GeGLU
takes the same packed GEMM and the same lowering as a SwiGLU: a GELU-gated `FusedGeGLU` would copy all of them).

* `fuse_swiglu.dual_matmul`: `mul(act(matmul(x, wg)), matmul(x, wu))` -> `FusedSwiGLU(matmul(x,
  concat([wu, wg], 1)), activation=act)`. Guards RLX lacks: both matmuls and the gate activation single-use and
  not outputs, equal weight shapes.
* `fuse_swiglu.narrow_pair`: `mul(act(narrow(c, gate half)), narrow(c, up half))` -> `FusedSwiGLU(c,
  gate_first, activation=act)`. Guards RLX lacks: the narrows are on the last axis and `c` is exactly `2N` wide;
  the narrows and the gate activation are single-use and not outputs. `gate_first` is honoured everywhere
  in rlxviz (RLX's MLX lowering and unfuse ignore it).
* `fuse_swiglu.viewed_dual_matmul`: the dual-matmul form with both products viewed alike before the gate product,
  `mul(act(reshape(x @ wg)), reshape(x @ wu))` (Qwen2-MoE's shared expert as torch.onnx writes it: tokens
  flattened to `[S, N]` after `[1, S, N]` products) -> `reshape(FusedSwiGLU(x @ concat([wu, wg], 1)))`. The
  rule does what a canonicalization `mul(act(reshape(a)), reshape(b))` -> `reshape(mul(act(a), b))` followed by
  `dual_matmul` would, in one step: a canonicalization in `canonicalize_exported` never sees the gate as `silu`
  (that pass's `silu` rule makes it, and a pass matches its input graph once), and a stage of its own would
  renumber every later version of every model. Conditions: both reshapes view one shape as one shape
  (`views.gate_views`), and the guards of `dual_matmul` with the views and the activation single-use too.

Validity (numbers equal for every input, up to GEMM summation order): `FusedSwiGLU(c, activation=act)` is
`act(gate) * up` on the two halves of `c`'s last axis, `act` the very op the graph applied (its decomposition
emits that op, so the activation's numbers are unchanged); the dual-matmul rule packs `[wu | wg]` so the
low half is `x @ wu` (equal `[K, N]` weights, guard `weights_match`); the narrow rule requires the
exact halves of the last axis (`halves_of_last_axis`) and records which half is the gate. The viewed form is
exact beyond that: a reshape keeps each element's row-major position, and an elementwise op of equal-shaped
operands reads element k of each, so `act(reshape(a)) * reshape(b)` is `reshape(act(a) * b)` bit for bit.
"""

from __future__ import annotations

from ...ir import Op, Rewriter
from ...ir.ops import GATE_ACTIVATIONS
from ..engine import rule_pass
from ..guard import NOT_RECOGNIZED, Ctx, all_single_use, guard
from ..pattern import P
from ..rule import QUIET, Fail, Rule, reports
from ..views import gate_views

_SHARED_FIX = "a FusedSwiGLU that also returns the intermediate read elsewhere (Rule.outputs)"

_GATES = frozenset(GATE_ACTIVATIONS)
_LABELS = {"act": "gate activation"}


def _act(c: Ctx) -> str:
    """The gate's activation name (`silu`, `gelu`, `gelu_tanh`): the fused op's `activation`."""
    return c["act"].op.value


DUAL = Rule(
    "fuse_swiglu.dual_matmul",
    P(Op.MUL, P(_GATES, P(Op.MATMUL, P.var("x"), P.var("wg"), name="gate_mm"), name="act"),
      P(Op.MATMUL, P.var("x"), P.var("wu"), name="up_mm"), name="mul", commutative=True),
    steps=(
        all_single_use(("gate_mm", "up_mm", "act"), "swiglu_single_use", fix=_SHARED_FIX),
        guard("weights_match", lambda c: c["wg"].rank == 2 and c["wg"].shape == c["wu"].shape,
              lambda c: f"{c.d('wg')} (gate weight) has shape {list(c['wg'].shape)} and {c.d('wu')} (up weight) "
                        f"{list(c['wu'].shape)}; needs equal [K, N]", "give gate and up equal [K, N] weights",
              requires=("wu", "wg"), kind=NOT_RECOGNIZED, fix="none: SwiGLU halves must be the same width"),
    ),
    result="mul", absorb=("gate_mm", "up_mm", "act", "mul"), labels=_LABELS,
    rewrite=lambda c, rw: _dual(c, rw),
    doc="act(x @ wg) * (x @ wu), act silu/gelu/gelu_tanh -> FusedSwiGLU(x @ concat([wu, wg]), activation=act)")


def _dual(c: Ctx, rw: Rewriter, views: tuple[str, ...] = ()) -> int:
    """FusedSwiGLU(x @ concat([wu, wg], 1)), then reshaped to the mul's shape when the halves were `views`."""
    absorbed = [c.id(r) for r in ("gate_mm", "up_mm", *views, "act", "mul")]
    with rw.provenance(absorbed):
        with rw.absorbing():  # the weight concat replaces nothing
            weights = rw.concat([c.id("wu"), c.id("wg")], axis=1)
        with rw.absorbing(absorbed[:2]):  # the packed matmul computes the two products: it replaces the matmuls
            packed = rw.matmul(c.id("x"), weights)
        fused = rw.emit(Op.FUSED_SWIGLU, [packed], gate_first=False, activation=_act(c))
        out = rw.emit(Op.RESHAPE, [fused], shape=tuple(c["mul"].shape)) if views else fused
    rw.remove(absorbed[:-1])
    rw.replace(c.id("mul"), out)
    return fused


@reports(reads=("act", "rb", "gate_mm", "up_mm"))
def _identical_views(c: Ctx) -> Fail | None:
    """Only two products of one shape viewed as one shape (`views.gate_views`) are this form (anything else: no
    record)."""
    same = c["gate_mm"].shape == c["up_mm"].shape
    return None if same and gate_views(c.graph, c["act"], c["rb"]) is not None else QUIET


VIEWED = Rule(
    "fuse_swiglu.viewed_dual_matmul",
    P(Op.MUL, P(_GATES, P(Op.RESHAPE, P(Op.MATMUL, P.var("x"), P.var("wg"), name="gate_mm"), name="gate_view"),
                name="act"),
      P(Op.RESHAPE, P(Op.MATMUL, P.var("x"), P.var("wu"), name="up_mm"), name="rb"), name="mul", commutative=True),
    steps=(
        _identical_views,
        all_single_use(("gate_mm", "up_mm", "gate_view", "rb", "act"), "swiglu_single_use", fix=_SHARED_FIX),
        DUAL.steps[1],
    ),
    result="mul", absorb=("gate_mm", "up_mm", "gate_view", "rb", "act", "mul"), labels=_LABELS,
    rewrite=lambda c, rw: _dual(c, rw, ("gate_view", "rb")),
    doc="act(reshape(x @ wg)) * reshape(x @ wu), identical views -> reshape(FusedSwiGLU(x @ concat([wu, wg]), "
        "activation=act))")


def _halves(c: Ctx) -> bool:
    g, u, src = c["gate"].attrs, c["up"].attrs, c["src"]
    n = u["length"]
    last = (-1, src.rank - 1)
    return (g["axis"] in last and u["axis"] in last and g["length"] == n and src.shape[-1] == 2 * n
            and {g["start"], u["start"]} == {0, n})


NARROW = Rule(
    "fuse_swiglu.narrow_pair",
    P(Op.MUL, P(_GATES, P(Op.NARROW, P.var("src"), name="gate"), name="act"),
      P(Op.NARROW, P.var("src"), name="up"), name="mul", commutative=True),
    steps=(
        guard("halves_of_last_axis", _halves,
              lambda c: f"{c.d('up')} and {c.d('gate')} slice {c.d('src')}: "
                        f"gate=narrow(axis {c['gate'].attrs['axis']}, start {c['gate'].attrs['start']}, len "
                        f"{c['gate'].attrs['length']}), up=narrow(axis {c['up'].attrs['axis']}, start "
                        f"{c['up'].attrs['start']}, len {c['up'].attrs['length']}) of shape "
                        f"{list(c['src'].shape)}; needs the two halves of the last axis",
              "split the packed gate/up projection into its two halves", requires=("up", "gate", "src"),
              kind=NOT_RECOGNIZED, fix="none: FusedSwiGLU takes the two halves of one tensor"),
        all_single_use(("gate", "up", "act"), "swiglu_single_use", fix=_SHARED_FIX),
    ),
    result="mul", absorb=("gate", "up", "act", "mul"), labels=_LABELS,
    build=lambda c: (Op.FUSED_SWIGLU, [c.id("src")], {"gate_first": c["gate"].attrs["start"] == 0,
                                                      "activation": _act(c)}),
    doc="act(narrow(c, gate)) * narrow(c, up), act silu/gelu/gelu_tanh -> FusedSwiGLU(c, gate_first, activation)")

fuse_swiglu = rule_pass("fuse_swiglu", [DUAL, VIEWED, NARROW],
                        "SwiGLU / GeGLU (dual matmul or packed halves) -> FusedSwiGLU with its gate activation",
                        product="FusedSwiGLU", recognizes_families=("glu",), listed_for=(("swiglu", ""),))

__all__ = ["DUAL", "NARROW", "VIEWED", "fuse_swiglu"]
