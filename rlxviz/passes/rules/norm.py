"""Residual + norm fusions: `fuse_residual_ln` and `fuse_residual_rms_norm` (docs/rlx.md §2.3.3-2.3.4).

`norm(add(x, residual))` -> `FusedResidualLN(x, residual, gamma, beta)`, and the bias form
`norm(add(add(x, residual), bias))` -> `FusedResidualLN(x, residual, bias, gamma, beta, has_bias=True)`
(documented but never produced by RLX). The operand order is kept exactly (x = the add's first
operand): `fuse_transformer_layer` checks it. Guards RLX lacks: the norm is over the last axis, and
x and residual have the same shape (so a broadcast add, like BERT's embedding sum with the
`[1, H]` token-type row, is not taken for a residual).

Validity (numbers equal for every input): the fused op's decomposition is `norm((x + residual) [+ bias])`
with the matched `eps`, the adds in the matched order; the norm is over the last axis (guard
`norm_last_axis`), x and residual have one shape and the bias is `[H]` (so no broadcast changes what
is summed). The sum is formed in the operands' dtype exactly as unfused: an f16 sum that overflows
overflows in both forms (the equivalence check reports it, `runtime.compare`).
"""

from __future__ import annotations

from ...ir import Op, Rewriter
from ..engine import rule_pass
from ..guard import NOT_A_CANDIDATE, NOT_RECOGNIZED, Ctx, Guard, guard, not_output, same_shape, single_user
from ..pattern import P
from ..readers import residual_sum_fix, single_output_why
from ..rule import Rule


def pre_norm(fused: Op) -> str:
    """Why a residual-norm refusal for the sum's other readers does not count in a pre-norm layout (`Guard.excused`):
    the layout needs the sum too, and rlxviz's rule builds only the single-output form of `fused`
    (`readers.single_output_why`). It once read "so it cannot be fused" (false: residual add + norm returning the sum
    is a standard fusion), then "rlxviz's op returns only the normalized value" (false too: the op has a two-output
    `with_sum` form); the gap is the rule, and the words name it (`readers.residual_sum_fix`)."""
    return (f"pre-norm layout: the residual sum also feeds the next residual add, and {single_output_why(fused)}, so "
            f"this layer kind does not expect the fusion with this rule (compiler fix: {residual_sum_fix(fused)})")


def parallel_block(fused: Op, norms: int) -> str:
    """Why the same refusal does not count in a parallel block (GPT-J, GPT-NeoX), whose words are its own: `norms`
    (`LayerArchitecture.parallel_norms`) 1 when one norm of the residual sum feeds both sublayers (Falcon), 2 when
    each sublayer reads its own (GPT-NeoX: the sum feeds two norms and the next residual add). It read "pre-norm
    layout: the residual sum also feeds the next residual add" of GPT-NeoX, whose sum has three readers. With two
    norms a two-output op takes the add into one of them only: the other norm's match needs the same add, which
    `passes.whatif.without_guard` finds taken (`already_fused`), so its not-expected line says the fix alone is not
    enough there (`why.caveat.fix_caveat`); the whole fix normalizes the one sum twice."""
    why, fix = single_output_why(fused), residual_sum_fix(fused)
    if norms < 2:
        return (f"parallel block: one norm of the residual sum feeds both sublayers, and the next residual add reads "
                f"the sum too; {why}, so this layer kind does not expect the fusion with this rule (compiler fix: "
                f"{fix})")
    return (f"parallel block: both sublayers' norms (the attention's and the MLP's) read the residual sum, and so does "
            f"the next residual add; {why}, so this layer kind does not expect the fusion with this rule; taking the "
            f"add into both norms needs one op that normalizes the sum once per sublayer (a gamma and beta each) and "
            f"returns the sum too (compiler fix: {fix}; it takes the add into one of the two norms only)")


def _excused(g: Guard, fused: Op) -> Guard:
    """`g` (a refusal because the residual sum has other readers) excused where the layout reads the sum elsewhere:
    a parallel block (its own words, by its norms) before any other pre-norm layer (`pre_norm`)."""
    return (g.excused(("norm_per_sublayer",), parallel_block(fused, 2)).excused(("parallel",), parallel_block(fused, 1))
            .excused(("pre_norm",), pre_norm(fused)))


def _last_axis(c: Ctx) -> bool:
    a = c["norm"].attrs.get("axis", -1)
    return a in (-1, c["norm"].rank - 1)


def _rules(pass_name: str, norm: Op, fused: Op, label: str) -> list[Rule]:
    last_axis = guard("norm_last_axis", _last_axis,
                      lambda c: f"{c.d('norm')} normalizes axis {c['norm'].attrs.get('axis')}; the fused op "
                                f"normalizes the last axis only", "normalize over the last axis",
                      requires=("norm",), kind=NOT_RECOGNIZED,
                      fix=f"an axis attribute on {fused.value}")
    common = (
        _excused(single_user("sum", "sum_single_user", "the residual sum must feed only the norm (post-norm layout)",
                    f"{residual_sum_fix(fused)}; the single-output form rlxviz's rule builds is "
                    f"illegal here"), fused),
        not_output("sum", "sum_not_output"),
        same_shape("x", "residual", "residual_same_shape", "not a candidate: a broadcast sum, not a residual",
                   "none: a broadcast add is not a residual", kind=NOT_A_CANDIDATE),
        last_axis,
    )

    def bias_ok(c: Ctx) -> bool:
        return c["bias"].shape == (c["norm"].shape[-1],)

    biased = Rule(
        f"{pass_name}.biased",
        P(norm, P(Op.ADD, P(Op.ADD, P.var("x"), P.var("residual"), name="sum"),
                  P.var("bias", where=lambda n: n.rank <= 1), name="biased", commutative=True),
          P.var("gamma"), P.var("beta"), name="norm"),
        steps=(*common,
               _excused(single_user("biased", "biased_single_user"), fused),
               not_output("biased", "biased_not_output"),
               guard("bias_shape", bias_ok, lambda c: f"{c.d('bias')} has shape {list(c['bias'].shape)}; needs "
                                                      f"[{c['norm'].shape[-1]}]",
                     "give the residual bias the norm's width", requires=("bias", "norm"), kind=NOT_RECOGNIZED,
                     fix="none: the fused op adds a bias vector")),
        result="norm", absorb=("sum", "biased", "norm"),
        build=lambda c: (fused, [c.id(r) for r in ("x", "residual", "bias", "gamma", "beta")],
                         {"eps": c["norm"].attrs["eps"], "has_bias": True}),
        doc=f"{label}(x + residual + bias) -> {fused.value}(has_bias=True)")
    plain = Rule(
        f"{pass_name}.residual",
        P(norm, P(Op.ADD, P.var("x"), P.var("residual"), name="sum"), P.var("gamma"), P.var("beta"), name="norm"),
        steps=common,
        result="norm", absorb=("sum", "norm"),
        build=lambda c: (fused, [c.id(r) for r in ("x", "residual", "gamma", "beta")],
                         {"eps": c["norm"].attrs["eps"], "has_bias": False}),
        doc=f"{label}(x + residual) -> {fused.value} (operand order kept)")
    rules = [biased, plain]
    if norm == Op.RMS_NORM:  # LLaMA's rms_norm has no beta: the fused op takes a zero beta (y + 0 == y)
        rules.append(Rule(
            f"{pass_name}.residual_no_beta",
            P(norm, P(Op.ADD, P.var("x"), P.var("residual"), name="sum"), P.var("gamma"), name="norm"),
            steps=common,
            result="norm", absorb=("sum", "norm"), rewrite=lambda c, rw: _zero_beta(c, rw, fused),
            doc=f"{label}(x + residual) without beta -> {fused.value} with a zero beta"))
    return rules


def _zero_beta(c: Ctx, rw: Rewriter, fused: Op) -> int:
    absorbed = [c.id("sum"), c.id("norm")]
    with rw.provenance(absorbed):
        with rw.absorbing():  # the zero beta replaces nothing: only the fused norm does
            beta = rw.const((0.0,) * c["norm"].shape[-1], c["norm"].dtype)
        new = rw.emit(fused, [c.id("x"), c.id("residual"), c.id("gamma"), beta], eps=c["norm"].attrs["eps"],
                      has_bias=False)
    rw.remove([c.id("sum")])
    rw.replace(c.id("norm"), new)
    return new


fuse_residual_ln = rule_pass("fuse_residual_ln", _rules("fuse_residual_ln", Op.LAYER_NORM, Op.FUSED_RESIDUAL_LN,
                                                        "LayerNorm"),
                             "add (+ bias) + LayerNorm -> FusedResidualLN", product="FusedResidualLN",
                             quantization=("breaks", "a residual sum quantized before its norm is no residual add "
                                                     "feeding the norm"))
fuse_residual_rms_norm = rule_pass("fuse_residual_rms_norm",
                                   _rules("fuse_residual_rms_norm", Op.RMS_NORM, Op.FUSED_RESIDUAL_RMS_NORM,
                                          "RmsNorm"),
                                   "add (+ bias) + RmsNorm -> FusedResidualRmsNorm", product="FusedResidualRmsNorm",
                                   quantization=("breaks", "a residual sum quantized before its norm is no residual "
                                                           "add feeding the norm"))

__all__ = ["fuse_residual_ln", "fuse_residual_rms_norm"]
