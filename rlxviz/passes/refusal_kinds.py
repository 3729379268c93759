"""What kind of "no" a refusal says and where it can be fixed: the kinds every guard declares (`KINDS`: illegal, not
recognized, not profitable, ...) and the remedies (`REMEDIES`: in the model, compiler only, read by the model, does
not pay), with `near_miss_kind`, the refusal-level half of the near-miss rule. Data only: `passes.guard` declares
guards with them, `passes.readers` words reader refusals with them, and every front end reads them from there.
"""

from __future__ import annotations

from collections.abc import Sequence

ILLEGAL = "illegal"
NOT_RECOGNIZED = "not recognized"
NOT_PROFITABLE = "not profitable"
MODEL_TERM = "the model's own term"
NOT_A_CANDIDATE = "not a candidate"
KINDS: dict[str, str] = {
    ILLEGAL: "fusing would change what the program computes or returns (an extra reader, a graph output of a "
             "single-output op)",
    NOT_RECOGNIZED: "a pattern limit: the computation could be fused, but no rule takes this form (operand order, "
                    "an activation off the allow-list, a layout or form no rule knows); the fix is in the compiler",
    NOT_PROFITABLE: "a gate or cost test decided against it (a size gate, a merge that would cost other fusions)",
    MODEL_TERM: "nothing was refused: the fusion kept a computation of the model's own as an operand, exactly (an "
                "additive score term that is not a per-key mask such as padding alone: a causal band, a sliding "
                "window, ALiBi, a relative position bias, any of them with padding too); rewriting the model would "
                "change what it computes",
    NOT_A_CANDIDATE: "the nodes only look like the fusion's input: a broadcast sum (the embeddings' word + position + "
                     "type tables) is not a residual; nothing to fix, not a near-miss (every BERT run showed one at "
                     "embeddings.LayerNorm as `not recognized`)",
}
NOT_NEAR_MISSES = (MODEL_TERM, NOT_A_CANDIDATE)
"""Kinds of refusal that are no missed fusion: `report.missed_fusions` and `session.status` leave them out,
`report.left_out` lists them (one answer for the app, `rlxviz explain` and the notebooks)."""
"""What kind of "no" a guard says (issue 17): every guard declares one."""

SCORE_TERM_GUARDS = frozenset({"mask_model_term", "where_mask_additive", "fill_absorbs"})
"""The guards whose `MODEL_TERM` refusal is an additive score term kept as the attention's operand
(`rules.sdpa_mask`, `rules.export_forms`): the only ones `KINDS[MODEL_TERM]`'s words (a causal band, ALiBi, ...) are
about. Every other guard of that kind refuses for the model's own structure (`self_attention`: cross-attention;
`kv_cache`) or keeps another term of its own (`gamma_computed`), and is worded by `model_term_why`."""
MODEL_STRUCTURE = ("refused for the model's own structure, which the fused op cannot hold (nothing to fix in the "
                   "model, not a near-miss)")
"""How `model_term_why` begins for a hard `MODEL_TERM` refusal that is no additive score term."""


def model_term_why(guard: str, message: str, soft: bool) -> str:
    """Why a refusal of kind `MODEL_TERM` by `guard` is no near-miss, in one line: `KINDS[MODEL_TERM]` for an
    additive score term (`SCORE_TERM_GUARDS`); for a hard refusal (`soft` False: `self_attention`, `kv_cache`)
    `MODEL_STRUCTURE: MESSAGE`, the refusal's own `message` as `explain -v` prints it; for any other term kept
    (`soft`: `gamma_computed`) `nothing was refused: the fusion kept a computation of the model's own, exactly:
    MESSAGE`. Never the score-term words for a refusal they are not about (marian's cross-attention read them)."""
    if guard in SCORE_TERM_GUARDS:
        return KINDS[MODEL_TERM]
    if not soft:
        return f"{MODEL_STRUCTURE}: {message}"
    return f"nothing was refused: the fusion kept a computation of the model's own, exactly: {message}"

IN_MODEL = "in the model"
COMPILER_ONLY = "compiler only"
READ_BY_MODEL = "read by the model"
DOES_NOT_PAY = "does not pay"
REMEDIES: dict[str, str] = {
    IN_MODEL: "the hint is a change to the model (or the pipeline) that keeps every number the model computes and "
              "returns: an operand order, a layout written another way, a dead reader removed, a pass run first",
    COMPILER_ONLY: "no change to the model keeps its numbers and makes the fusion legal (the residual is scaled, the "
                   "constants are not GELU's, eps sits outside the sqrt): the hint says why (`none in the model: "
                   "...`), the compiler fix is the fix",
    READ_BY_MODEL: "compiler only, because the value the fusion would absorb is read elsewhere by the model: a probe "
                   "or a later layer reads it, or it is an output the caller asked for. The product is not legal "
                   "for that layer (it is fused as far as legal); the compiler fix is an op that also returns it",
    DOES_NOT_PAY: "nothing to change: the tool's own cost test decided the fusion costs more than it makes (a merge "
                  "that would cost a member's epilogue or the attention block), so leaving it unmade is the right "
                  "outcome, not a near-miss; only a compiler fix that keeps both would make it",
}
"""Where a refusal can be fixed (issue 38): a guard declares it (`Guard.no_model_fix`, `Guard.remedy`), so no front
end prints a fix line that would change the model's numbers or drop an output. A refusal that is `illegal` and
`read by the model` is the model's own dataflow: the product is not expected of that layer
(`passes.why.verdict`)."""
NO_MODEL_FIX = "none in the model: "
UNCHECKED_FIX = "no checked fix in the model: "
"""How a fix line starts when the rule proposed a change to the model that its check did not confirm
(`session.advice.vetted`: it changes the numbers, does not fuse, or cannot be applied): unlike `NO_MODEL_FIX`, no
rule said that no change to the model keeps its numbers, so the refusal still counts (`passes.why.policy
.compiler_fix_only` reads only what the rule declared)."""
NOTHING_TO_CHANGE = "nothing to change in the model"
"""How a guard's hint that is itself a statement begins (no change to make, e.g. a dequantize scale that is the
quantized weight's own): its refusal's remedy is the guard's `remedy`, not `IN_MODEL` (`Guard.remedy_of`), so
`--json`'s `remedy` and `fix` never disagree."""

ROUNDING_ONLY = "changes the numbers at rounding level only"
"""The one wording of a model change that keeps the numbers in real arithmetic but not bit for bit (a constant that is
no power of two folded into a weight, an addition reordered): `rounding_not_offered` where rlxviz cannot check the
change, and a checked fix's line (`scale_fold.fold_hint`) where it can; `session.advice` adds the measured error."""


def rounding_not_offered(change: str, reason: str = "") -> str:
    """The words of a model change that would keep the numbers up to rounding only but that rlxviz has no what-if to
    check (`passes.whatif`): `a workaround, not offered: CHANGE changes the numbers at rounding level only
    (REASON), by reasoning, not measured: rlxviz has no check for that change`. The same words on every model for every
    such form, so no view calls one form offered on one model and unknown on another; a change rlxviz can check is
    offered as a fix instead, with its measured error (the scale fold), and one it cannot says it was not measured.
    `reason` (no parentheses) says why the numbers round differently; "" for none."""
    why = f" ({reason})" if reason else ""
    return (f"a workaround, not offered: {change} {ROUNDING_ONLY}{why}, by reasoning, not measured: rlxviz has no "
            "check for that change")


DEAD_READER_KIND = "illegal as it stands: its extra reader is dead code"
DEAD_READERS_KIND = "illegal as it stands: its extra readers are dead code"
"""How an `illegal` refusal whose extra readers all reach no graph output (`rule.Fail.dead`) is worded wherever its
kind is printed: plain `illegal` (the model reads the value elsewhere) was untrue for a reader that reaches no
output. The refusal's `kind` stays `ILLEGAL` (`--json`, the near-miss rule and the verdict read it)."""


def kind_words(kind: str, dead: Sequence[int] = ()) -> str:
    """How a refusal's `kind` is printed: `DEAD_READER_KIND` (`DEAD_READERS_KIND` for several) when it is `ILLEGAL`
    and `dead`, its extra readers that reach no graph output (`trace.Rejection.dead`, node ids), is not empty; else
    `kind` as is. Read from the refusal's data, never from its fix's words."""
    if kind != ILLEGAL or not dead:
        return kind
    return DEAD_READERS_KIND if len(dead) > 1 else DEAD_READER_KIND


def near_miss_kind(kind: str, remedy: str = "") -> bool:
    """Whether a refusal of `kind` with `remedy` (`REMEDIES`) can be a near-miss at all: not one of `NOT_NEAR_MISSES`
    (the model's own term, a lookalike) and not `DOES_NOT_PAY` (the tool's own cost test declined it: nothing to fix).
    The refusal-level half of the one rule; `passes.why.standing` adds the layer-level half (a refusal the layer's
    kind does not expect, or one illegal for the layer) and every front end reads that."""
    return kind not in NOT_NEAR_MISSES and remedy != DOES_NOT_PAY


__all__ = ["ILLEGAL", "NOT_RECOGNIZED", "NOT_PROFITABLE", "MODEL_TERM", "NOT_A_CANDIDATE", "KINDS", "NOT_NEAR_MISSES",
           "IN_MODEL", "COMPILER_ONLY", "READ_BY_MODEL", "DOES_NOT_PAY", "REMEDIES", "NO_MODEL_FIX", "UNCHECKED_FIX",
           "NOTHING_TO_CHANGE", "ROUNDING_ONLY", "near_miss_kind", "rounding_not_offered", "DEAD_READER_KIND",
           "DEAD_READERS_KIND", "kind_words", "SCORE_TERM_GUARDS", "MODEL_STRUCTURE", "model_term_why"]
