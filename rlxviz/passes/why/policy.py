"""What a layer is expected to fuse, by its kind: the one place that decides which refusals count.

The facts come from the trace (`facts`) and the layer's kind (`passes.architecture.classify_layer`); this module
turns them into "expected" and "not expected here", and nothing outside `passes/why/` does. Policy lives on what it
is about and is only read here: a pass declares its product and the layer traits that expect it (`Pass.product`,
`expected_of`, `excused_by`, `unexpected`, `listed_for`), whether it is the whole-layer pass (`whole_layer`), which
unrecognized families it recognizes (`recognizes_families`) and what quantized activations do to it
(`quantization`); a guard declares where its refusal is excused (`Guard.excuses`). No pass name is
written here, so a renamed pass or guard carries its policy with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol, TypeVar

from ...ir import Graph
from ..declarations import (
    FAMILIES,
    FINDING,
    FINDING_QUANTIZATION,
    KINDS,
    QUANTIZATION,
    TRAIT_WORDS,
    TRAITS,
    check_words,
    trait_named,
)
from ..engine import Pass
from ..guard import COMPILER_ONLY, DOES_NOT_PAY, NOT_NEAR_MISSES, READ_BY_MODEL, REMEDIES, Guard, near_miss_kind
from ..guard import KINDS as REFUSAL_KINDS
from ..pattern import RuleError
from ..pipeline import PASSES
from ..rule import Soft
from ..spelling import close

EXPECT_MODES = ("model", "pipeline")
"""What a layer is judged against: `model` (default): every product that is legal for the layer, i.e. what the
canonical pipeline makes of it, so a pipeline without a pass the layer needs cannot pass the check; `pipeline`: only
what the run's own passes could make (the products its missing passes would make are listed, not counted)."""


class _Products(Mapping[str, str]):
    """pass name -> its product, read from the registered passes each time (`Pass.product`): a pass renamed or
    replaced in `PASSES` carries its product with it."""

    def _now(self) -> dict[str, str]:
        return {p.name: p.product for p in PASSES.values() if p.product}

    def __getitem__(self, name: str) -> str:
        return self._now()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())

    def __repr__(self) -> str:
        return repr(self._now())


PRODUCTS: Mapping[str, str] = _Products()
"""What each pattern pass produces, as named in a layer's expectations (`Pass.product`, declared on the pass)."""

ILLEGAL_HERE = ("illegal for this layer: no change to the model that keeps its numbers makes it legal (the layer is "
                "fused as far as legal)")


def layer_pass() -> Pass | None:
    """The registered pass that turns a whole layer into one node (`Pass.whole_layer`: `fuse_transformer_layer`,
    `Op.FUSED_TRANSFORMER_LAYER`); None when no registered pass declares it."""
    return next((p for p in PASSES.values() if p.whole_layer), None)


def recognizers(family: str) -> set[str]:
    """The passes whose rules recognize the `passes.unrecognized` family `family` (`Pass.recognizes_families`)."""
    return {p.name for p in PASSES.values() if family in p.recognizes_families}


def _quantization(pass_name: str) -> tuple[str, str] | tuple[()]:
    """What a quantized layer does to `pass_name`'s refusals (`Pass.quantization`; an unrecognized finding's is
    declared beside its families, `declarations.FINDING_QUANTIZATION`)."""
    p = PASSES.get(pass_name)
    if p is not None:
        return p.quantization
    return FINDING_QUANTIZATION if pass_name == FINDING else ()


def _quantized_out(arch: LayerKind, pass_name: str) -> bool:
    """Whether the layer's quantized activations excuse `pass_name` (its declared `quantization` mode)."""
    q = _quantization(pass_name)
    return bool(arch.quantized and q and (q[0] == "breaks" or q[0] == "attention" and arch.mask == "unknown"))


class LayerKind(Protocol):
    """What the policy reads of a layer's kind (`kinds.LayerArchitecture` is one). `kinds` asks this module, so
    this module names no class of it."""

    @property
    def description(self) -> str: ...
    @property
    def mask(self) -> str | None: ...
    @property
    def evidence(self) -> tuple[str, ...]: ...
    @property
    def kv_cache(self) -> bool: ...
    @property
    def quantized(self) -> int: ...
    @property
    def swiglu(self) -> bool: ...
    @property
    def post_ln(self) -> bool: ...

    def has(self, trait: str) -> bool: ...


def product(pass_name: str, made: Iterable[tuple[Graph, int]] = (), rules: Iterable[str] = ()) -> str:
    """The product `pass_name` makes, as named in a layer's expectations (the pass name when it makes none). `made`:
    `(graph after the pass, node it made)` of the layer's matches: a pass that names its product by what it merged
    (`Pass.product_of`) says that name when every match of the layer has it (`shared-input QKV matmul` for Q/K/V,
    `shared-input matmul` otherwise). `rules`: the rules that matched in the layer: a pass whose rules name the form
    each makes (`Rule.form`) says those forms after its product, each once in the pass's rule order, e.g. `the
    exporter's forms as IR ops (where mask)` in a layer whose only rewrite was a where mask; none matched: the
    product alone (no form is claimed of a layer that had none). A pass whose product is its rules' forms themselves
    (`gelu / gelu_tanh`, `layer_norm / rms_norm`: the product is every form joined by ` / `) names only the forms
    that matched, e.g. `gelu` in a layer whose GELU was the erf form."""
    p = PASSES.get(pass_name)
    if p is not None and p.product_of is not None:
        names = {p.product_of(g, i) for g, i in made}
        if len(names) == 1:
            return names.pop()
    name = PRODUCTS.get(pass_name, pass_name)
    matched = set(rules)
    own = p.rules if p is not None else ()
    every = dict.fromkeys(r.form for r in own if r.form)
    forms = list(dict.fromkeys(r.form for r in own if r.form and r.name in matched))
    if forms and name == " / ".join(every):  # the product is its forms: name those the layer had
        return " / ".join(forms)
    return f"{name} ({', '.join(forms)})" if forms else name


def makes_product(pass_name: str, rule: str) -> bool:
    """Whether a match of `rule` in a layer names `pass_name`'s product among what the layer is expected to have: a
    match of one of the pass's own rules (`Pass.rules`), not of its stages (`Pass.stages`: exact canonicalizations
    before its rules, e.g. `fuse_attention_block/qkv_columns` reading a per-head QKV layout as column blocks, which
    makes no FusedAttentionBlock); a pass that is not registered, or has no stages, names its product by any match."""
    p = PASSES.get(pass_name)
    return p is None or not p.stages or any(r.name == rule for r in p.rules)


def _guards(pass_name: str) -> dict[str, Guard]:
    """The `Guard`s of `pass_name`'s rules by name (a guard shared by several rules once)."""
    p = PASSES.get(pass_name)
    steps = (st.step if isinstance(st, Soft) else st for r in (p.rules if p is not None else ()) for st in r.steps)
    return {g.name: g for g in steps if isinstance(g, Guard)}


class Remedied(Protocol):
    """What the policy reads of a refusal's fixes (`report.MissedFusion`, `trace.Rejection`, `explain.Outcome` are
    ones): its remedy (`guard.REMEDIES`), its fix line in the model (`hint`) and its compiler fix (`fix`)."""

    @property
    def remedy(self) -> str: ...
    @property
    def hint(self) -> str: ...
    @property
    def fix(self) -> str: ...


NOTHING_TO_CHANGE = "nothing to change in the model"
"""How a rule's fix line says, as a statement, that the model has nothing to change (n4-09's dequantize scale)."""


def compiler_fix_only(refusal: Remedied | None) -> bool:
    """Whether `refusal`'s one fix is a compiler change: it names a compiler fix (not `none: ...`) and no change to the
    model that keeps its numbers makes the fusion (its remedy is `compiler only`, or its fix line is the statement
    `nothing to change in the model: ...`). Such a refusal is a gap in rlxviz's ops wherever nothing else excuses it
    (`not_expected`, `op_gaps`): never a near-miss beside a fix line that says there is nothing in the model to
    change. A value the model reads elsewhere (`read by the model`) is the model's dataflow instead (`ILLEGAL_HERE`)."""
    if refusal is None or refusal.remedy == READ_BY_MODEL:
        return False
    fix = refusal.fix.strip()
    if not fix or fix.startswith("none"):
        return False
    return refusal.remedy == COMPILER_ONLY or refusal.hint.startswith(NOTHING_TO_CHANGE)


_ALLOW_LIST = re.compile(r"^add (.+?) to the (\S+) allow-list\b")
_GIVE = re.compile(r"^give (\S+) an? (.+)$")


def fix_gap_form(fix: str, product: str = "") -> str:
    """The op form a compiler fix `fix` names (the gap in rlxviz's ops a refusal with no model-side fix runs into,
    `compiler_fix_only`): its first clause, up to `: `, `; `, `, or ` or a checked note, without a closing
    parenthesis or a leading article; `add X to the epilogue allow-list` is `PRODUCT with a X epilogue`
    (`PRODUCT with an epilogue for X` when X is words: `the layer's activation`), `give OP a
    Y` is `OP with a Y`. E.g. `residual scale (alpha) on FusedTransformerLayer`, `epilogue scale operand for
    FusedMatMulBiasAct`, `FusedMatMulBiasAct with a gelu_tanh epilogue`."""
    head = _first_clause(fix.strip())
    if (m := _ALLOW_LIST.match(head)) is not None and product:  # an op named in one word, else words
        what, kind = m.groups()
        return f"{product} with a {what} {kind}" if " " not in what else f"{product} with an {kind} for {what}"
    if (m := _GIVE.match(head)) is not None:
        return f"{m.group(1)} with a {m.group(2)}"
    if head.endswith(")") and " (" in head:  # a closing parenthesis: what the form computes, not its name
        depth, k = 0, len(head) - 1
        for k in range(len(head) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(head[k], 0)
            if depth == 0:
                break
        head = head[:k].rstrip() or head
    return re.sub(r"^(a|an|the) ", "", head)


def _first_clause(text: str) -> str:
    """`text` up to its first `: `, `; ` or `, or ` outside parentheses, or a ` (checked` note."""
    depth = 0
    for k, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and (text.startswith((": ", "; ", ", or "), k) or text.startswith(" (checked ", k)):
            return text[:k].strip()
    return text


def _own_gap(pass_name: str, guard: str, refusal: Remedied | None) -> tuple[str, str] | None:
    """`(op form, compiler fix)` of a refusal whose one fix is the compiler's (`compiler_fix_only`): the form its guard
    declares for its compiler fix (`Guard.lacking_fix`: ESM's `FusedAttentionBlock with the scale applied to Q before
    RoPE`), else anywhere (`Guard.lacking`, e.g. `FusedAttentionBlock with a non-default scale`), else the one its
    compiler fix names (`fix_gap_form`); None for any other refusal."""
    if not compiler_fix_only(refusal):
        return None
    assert refusal is not None
    g = _guards(pass_name).get(guard) if guard else None
    p = PASSES.get(pass_name)
    form = (g.gap_of_fix(refusal.fix) if g is not None else None) or (
        g.gaps[0][1] if g is not None and g.gaps else fix_gap_form(refusal.fix, p.product if p else ""))
    return form, refusal.fix


def not_expected(arch: LayerKind, pass_name: str, guard: str = "", refusal: Remedied | None = None) -> str | None:
    """Why a rejection of `pass_name` at `guard` does not count in a layer of kind `arch` (None: it counts). (A
    refusal that is `illegal` and `read by the model`, the model's own dataflow, is excused per layer by
    `verdict.layer_verdict`: `ILLEGAL_HERE`.)

    Read from what the pass and the guard declare: a trait of the layer in the pass's `excused_by`, a gap in rlxviz's
    ops (`op_gaps`: a trait in the pass's `lacks`, or the guard's `lacking` where the product is not expected), or
    none of its `expected_of` (then its `unexpected` says why), or a trait in the guard's `excused_in` (its
    `excuse`). E.g.
    `FusedTransformerLayer` is expected only of `post_ln`; `FusedAttentionBlock` of `post_ln` and of a layer whose
    attention has a keep mask, never with a KV cache; a residual-norm fusion refused because the residual sum has
    other users is not expected of a pre-norm layer, whose next residual add reads the sum that the single-output op
    rlxviz's rule builds does not return. A `refusal` (its remedy and fixes) whose one fix is the compiler's
    (`compiler_fix_only`: DeepNorm's scaled residual, a dequantize scale between a matmul and its bias) is a gap in
    rlxviz's ops where nothing above excuses it (`_own_gap`). Everything else counts."""
    why = _declared(arch, pass_name, guard, refusal)
    if why is None and (own := _own_gap(pass_name, guard, refusal)) is not None:
        return gap_words(*own)
    return why


def _declared(arch: LayerKind, pass_name: str, guard: str, refusal: Remedied | None = None) -> str | None:
    """`not_expected` by what the pass and the guard declare (a refusal's compiler fix read only for the form its
    guard declares for it, `Guard.lacking_fix`)."""
    p = PASSES.get(pass_name)
    if p is not None:
        for trait, why in p.excused_by:
            if arch.has(trait):
                return why
        gaps = _gaps(arch, p, guard, refusal)
        if gaps:  # not the model's layout: op forms rlxviz lacks (the pass's `lacks`, the guard's `lacking`)
            return gap_words(" and no ".join(f for f, _ in gaps), "; ".join(dict.fromkeys(x for _, x in gaps if x)))
        if p.expected_of and not any(arch.has(t) for t in p.expected_of):
            u = p.unexpected
            return u(arch) if callable(u) else u.format(description=arch.description, mask=arch.mask,
                                                        product=p.product or p.name, expected=expected_of_words(p))
    g = _guards(pass_name).get(guard) if guard else None
    if g is not None and (why := g.excuse_for(arch.has)) is not None:
        return why
    if _quantized_out(arch, pass_name):
        return (f"the layer's activations are quantized ({arch.quantized} quantization step(s) of computed values: "
                f"round(x / scale) + zero point, then dequantized): a fused op of the float pattern would skip those "
                f"roundings and change the numbers")
    return None


def _gaps(arch: LayerKind, p: Pass, guard: str, refusal: Remedied | None = None) -> list[tuple[str, str]]:
    """`(op form, compiler fix)` of each gap in rlxviz's ops that a refusal of `p` at `guard` in a layer of kind `arch`
    runs into (`op_gaps`); a `refusal` whose compiler fix its guard declares a form for (`Guard.gap_of_fix`) runs
    into that form, with that fix (its first clause, `_first_clause`)."""
    if any(arch.has(t) for t, _ in p.excused_by):
        return []
    g = _guards(p.name).get(guard) if guard else None
    own = [(f, g.fix) for f in (g.gap_for(arch.has),) if f is not None] if g is not None and g.gaps else []
    mine = g.gap_of_fix(refusal.fix) if g is not None and refusal is not None else None
    if own and mine is not None:
        own = [(mine, _first_clause(refusal.fix.strip()) if refusal is not None else g.fix)]
    expects = not p.expected_of or any(arch.has(t) for t in p.expected_of)
    lacked = [] if not expects and _layout_only(p) else [(form, fix) for t, form, fix in p.lacks if arch.has(t)]
    if not lacked and (expects or not own):  # a kind that expects a product rlxviz can make counts the refusal; one
        return []  # that does not, and no gap, is the model's layout (`unexpected`)
    return [*lacked, *(x for x in own if x[0] not in {f for f, _ in lacked})]


def _layout_only(p: Pass) -> bool:
    """Whether `p`'s product is expected of layer kinds alone (`expected_of` all in `KINDS`: FusedTransformerLayer of
    `post_ln`): a layer of another kind has another layout, which no op form of the pass changes, so the forms its
    `lacks` names are no gap there. A pass also expected of a fact of rlxviz's op (FusedAttentionBlock of `keep_mask`:
    the block takes an additive mask too, and is not expected elsewhere by rlxviz's choice) lacks its forms in every
    layer with the trait."""
    return bool(p.expected_of) and all(t in KINDS for t in p.expected_of)


def op_gaps(arch: LayerKind, pass_name: str, guard: str, refusal: Remedied | None = None) -> list[str]:
    """The op forms rlxviz lacks when `guard`'s refusal of `pass_name` in a layer of kind `arch` is a gap in rlxviz's
    own ops, not the model's layout, else []. Two declarations say so: the pass's `lacks` (a trait of the layer under
    which rlxviz makes no product of the pass at all, e.g. `integer_qkv`: no FusedAttentionBlock over integer-matmul
    projections; every refusal of the pass there is that gap, whatever guard refused and whether or not the layer's
    kind expects the product: a `qkv_packed` layout refusal in a pre-LN layer with a causal mask names it too; only a
    product expected of layer kinds alone, FusedTransformerLayer of `post_ln`, lacks nothing in a layer of another
    kind, whose layout is the reason, `_layout_only`), and the guard's `gaps` (`Guard.lacking`: a trait of the layer
    in its `gap_in`), which counts only where the layer's kind does not expect the product (`expected_of`) or the pass
    lacks it there: where the kind expects a product rlxviz can make, the refusal counts anyway. E.g. an unmasked ViT
    attention and `fuse_attention_block`'s `mask_kind_keep`: rlxviz has no FusedAttentionBlock without a mask operand;
    a dynamically quantized layer refused at `default_scale`: no block over integer-matmul projections, nor one with its
    scale (esm.qdyn: the scale applied to Q before RoPE, the form `Guard.lacking_fix` names for that refusal's fix). A
    third is the `refusal`'s own fixes: no change to the model that keeps its numbers, a compiler
    fix (`compiler_fix_only`), where nothing declared excuses it: the form its compiler fix names (`_own_gap`). The
    layer is fused only as far as rlxviz's ops go (`LayerVerdict.op_gaps`). An unrecognized finding (`FINDING`, no
    pass) has only the third: an activation no op computes (`passes.unrecognized`) names its op form so."""
    return [f for f, _ in _all_gaps(arch, pass_name, guard, refusal)]


def _all_gaps(arch: LayerKind, pass_name: str, guard: str, refusal: Remedied | None) -> list[tuple[str, str]]:
    """`_gaps`, else the refusal's own gap (`_own_gap`) where nothing the pass or the guard declares excuses it (for
    a name no registered pass has, an unrecognized finding's `FINDING`, the own gap alone)."""
    p = PASSES.get(pass_name)
    gaps = _gaps(arch, p, guard, refusal) if p is not None else []
    if gaps or _declared(arch, pass_name, guard, refusal) is not None:
        return gaps
    own = _own_gap(pass_name, guard, refusal)
    return [own] if own is not None else []


def gap_sources(arch: LayerKind, pass_name: str, guard: str, refusal: Remedied | None = None
                ) -> list[tuple[str, str]]:
    """`(op form, what ran into it)` of each of `op_gaps`: `guard` for a guard's own gap (`Guard.lacking`), else the
    layer trait under which the pass makes no product at all, whatever guard refused (`Pass.lacks`), as what it is in
    the model (`declarations.trait_named`): `its integer-matmul Q/K/V projections (integer_qkv)`. What
    `LayerVerdict.op_gaps` puts after the rule, so a trait's gap is not blamed on the guard that happened to refuse
    first (esm's integer projections are no fault of `default_scale`)."""
    return [(f, trait_named(trait) if trait else guard)
            for f, trait in _gap_traits(arch, pass_name, guard, refusal)]


def _gap_traits(arch: LayerKind, pass_name: str, guard: str, refusal: Remedied | None) -> list[tuple[str, str]]:
    """`(op form, trait)` of each of `op_gaps`: the layer trait under which the pass makes no product at all
    (`Pass.lacks`), "" for a guard's own gap or the refusal's own."""
    p = PASSES.get(pass_name)
    traits = {form: t for t, form, _ in p.lacks if arch.has(t)} if p is not None else {}
    return [(f, traits.get(f, "")) for f, _ in _all_gaps(arch, pass_name, guard, refusal)]


def gap_names(arch: LayerKind, pass_name: str, guard: str, refusal: Remedied | None = None
              ) -> list[tuple[str, str]]:
    """`(op form, short name)` of each of `op_gaps`, in its order: the name is the layer trait under which the pass
    makes no product at all (`integer_qkv`), else `guard` (`default_scale`): what a drawing's label says a gap place
    ran into, `integer_qkv, default_scale` for esm's attention (`gap_sources` in one word each)."""
    return [(form, trait or guard) for form, trait in _gap_traits(arch, pass_name, guard, refusal)]


def op_gap(arch: LayerKind, pass_name: str, guard: str, refusal: Remedied | None = None) -> str | None:
    """`op_gaps` in one phrase, the forms joined by "and" (None: no gap)."""
    return " and ".join(op_gaps(arch, pass_name, guard, refusal)) or None


def gap_words(gap: str, fix: str) -> str:
    """Why a refusal that is an op gap (`op_gap`) is not counted, in words: `not the model's layout but a gap in
    rlxviz's ops: rlxviz has no GAP (compiler fix: FIX)`."""
    return f"{GAP_WHY_HEAD}rlxviz has no {gap}" + (f" {COMPILER_FIX_WORDS}{fix})" if fix else "")


GAP_WHY_HEAD = "not the model's layout but a gap in rlxviz's ops: "
"""How `gap_words` begins: what a gap line (`gap_line`) says by its heading instead."""


COMPILER_FIX_WORDS = "(compiler fix: "
"""How a reason names a compiler fix in parentheses (`gap_words`, a guard's `excuse`)."""


def lacks_product(arch: LayerKind, pass_name: str) -> bool:
    """Whether rlxviz makes no product of `pass_name` at all in a layer of kind `arch` (a trait of the pass's `lacks`):
    the compiler fix a refusal's reason names there is that whole form, not its guard's alone."""
    p = PASSES.get(pass_name)
    return p is not None and any(arch.has(t) for t, *_ in p.lacks)


def with_caveat(why: str, caveat: str) -> str:
    """`why` with `caveat` on the compiler fix it names: inside its closing `(compiler fix: ...)` parenthesis,
    `(compiler fix: FIX; CAVEAT)`, else after it; `why` as it is when it names no compiler fix or `caveat` is ""."""
    if not caveat or COMPILER_FIX_WORDS not in why:
        return why
    return f"{why[:-1]}; {caveat})" if why.endswith(")") else f"{why} ({caveat})"


NOT_EXPECTED_HERE = "not expected here"
"""`excuse`'s group of a refusal the layer's kind does not expect (`not_expected`)."""
OP_GAP_GROUP = "gap in rlxviz's ops"
"""`standing`'s group of a refusal at a gap in rlxviz's ops (`op_gaps`): a not-expected refusal whose reason is an op
form rlxviz lacks, not the model's layout. No near-miss, but no "nothing to fix" either: a compiler fix, nothing in the
model to change (the app's chips mark it `△`, apart from the faded `○`; the text heads its line so, `gap_line`)."""
TAKEN_LATER_GROUP = "taken later"
"""`standing`'s group of a refusal whose candidate a later pass fused after all (`report.taken_by`: clip-text's linear
refused for its bias after the residual, its matmul taken by fuse_attention_block): no near-miss, nor a gap."""
WORKAROUND = "a workaround in the model: {fix}"
"""How a refusal at a gap in rlxviz's ops names a checked change to the model (`caveat.model_fix_note`): after its
compiler fix, as a workaround, never as the fix (Granite's attention scale: the block lacks a scale attribute)."""


def excuse(arch: LayerKind | None, pass_name: str, guard: str, kind: str, remedy: str = "",
           refusal: Remedied | None = None) -> tuple[str, str] | None:
    """The one rule deciding whether a refusal is a near-miss, and if not, why: `(group, why)`, or None when it is a
    near-miss that counts against its layer. Every front end reads it (the verdict and `explain`'s text and
    `--json` through `excused.expected_misses` and `standing.standing`, the app's version chips through
    `standing.standing`); a refusal illegal for its layer is the verdict's one further excuse (`ILLEGAL_HERE`).

    `group` is the refusal's kind when that is no near-miss (`guard.NOT_NEAR_MISSES`: the model's own term, a
    lookalike), `guard.DOES_NOT_PAY` when the tool's own cost test declined it (a merge that would cost fusions),
    else `NOT_EXPECTED_HERE` when the layer's kind `arch` does not expect it (`not_expected`; None: a place outside
    every layer of a layered graph, judged by its refusal alone). `refusal`: its fixes, read for a gap in rlxviz's ops
    that no declaration names (`compiler_fix_only`)."""
    if not near_miss_kind(kind, remedy):
        return (kind, REFUSAL_KINDS[kind]) if kind in NOT_NEAR_MISSES else (DOES_NOT_PAY, REMEDIES[DOES_NOT_PAY])
    why = not_expected(arch, pass_name, guard, refusal) if arch is not None else None
    return None if why is None else (NOT_EXPECTED_HERE, why)


def expected_of_words(p: Pass) -> str:
    """`p`'s `expected_of` traits in words (`declarations.TRAIT_WORDS`), joined by "or": e.g. `a post-LN layer or a
    layer whose attention has a keep mask`."""
    return " or ".join(TRAIT_WORDS.get(t, t) for t in p.expected_of)


NOT_EXPECTED_FIX = (f"{NOTHING_TO_CHANGE} or in rlxviz: this layer's kind does not expect the fusion "
                    f"({NOT_EXPECTED_HERE})")
"""The fix line of a refusal the layer's kind does not expect whose own fix line is empty (`not_expected_fix`)."""


def not_expected_fix(why: str) -> str:
    """The one fix line of a refusal the layer's kind does not expect (`excuse`'s `NOT_EXPECTED_HERE`, no gap in
    rlxviz's ops) whose guard proposes no fix of its own: `NOT_EXPECTED_FIX: WHY`, `why` what the kind says of the
    product (`not_expected`). `report.in_context` gives it as the refusal's hint, so `explain -v`'s `fix:` line, the
    app's Matches & rejections table and `--json`'s `fix_checks` say the same (the README: every refusal gives a fix
    that keeps the model or says none is needed)."""
    return f"{NOT_EXPECTED_FIX}: {why}"


NOT_EXPECTED_WHY = "why it is not expected here"
"""The words between a "not expected here" line's refusal and the reason the layer's kind excuses it."""


def not_expected_line(rule: str, guard: str, reason: str, why: str, at: str = "") -> str:
    """One "not expected here" line, the one wording of every front end (`explain`'s text and `--json`, the app's Why
    tab): `RULE (GUARD) AT: REASON; why it is not expected here: WHY`. `reason` is the failing guard's own message (as
    the run's rejection says it, `report.in_context`; "" when there is no refusal, e.g. a product only excused),
    `why` what the layer's kind says of the product (`not_expected`), so the line says first what failed and then
    why that does not count here, never a reason of another guard. `at` names the places (`places_words`:
    `@ %186 (PATH)`, `at 2 places, %186 (PATH) and %187 (PATH)`); "" for none (a product only excused)."""
    head = (f"{rule} ({guard})" if guard else rule) + (f" {at}" if at else "")
    return f"{head}: {reason}; {NOT_EXPECTED_WHY}: {why}" if reason else f"{head}: {why}"


def gap_line(rule: str, guard: str, reason: str, why: str, at: str = "") -> str:
    """One line of a refusal at a gap in rlxviz's ops (`op_gaps`: `OP_GAP_GROUP`, the app's `△`), which the text
    heads `gap in rlxviz's ops:` and `--json` lists apart from the not-expected lines (`LayerVerdict.gap_refusals`):
    `RULE (GUARD) AT: REASON; rlxviz has no FORM (compiler fix: FIX)`. No "why it is not expected here": a gap is no
    layout the layer's kind does not expect but a compiler fix (issue 39). `why` is `gap_words`' (its
    `GAP_WHY_HEAD` dropped: the heading says it); the other arguments as `not_expected_line`'s."""
    return not_expected_line(rule, guard, "", (f"{reason}; " if reason else "") + why.removeprefix(GAP_WHY_HEAD), at)


def places_words(places: dict[int, str]) -> str:
    """The places (anchor node -> node path) a not-expected line names (`not_expected_line`), as a product the
    pipeline cannot make names its own (`facts.Unmade`): `@ %186 (PATH)` for one, `at 2 places, %186 (PATH) and %187
    (PATH)` for several, `-` for no path."""
    named = [f"%{n} ({p or '-'})" for n, p in places.items()]
    if len(named) == 1:
        return f"@ {named[0]}"
    return f"at {len(named)} places, {', '.join(named[:-1])} and {named[-1]}"


class _Refusal(Protocol):
    @property
    def pass_name(self) -> str: ...


_R = TypeVar("_R", bound=_Refusal)


def first_refusal(counted: Sequence[_R], own: LayerKind, judged: LayerKind) -> _R | None:
    """The refusal that explains a layer's failure best, of its `counted` ones (pipeline order): the first, except in
    a layer judged as another kind than its own (`verdict.judged_kind`: it deviates from its siblings). There the
    first refusal of a product the `judged` kind expects and the layer's `own` kind does not expect at all (the
    pass's declarations: `not_expected` without a guard) names the deviation: a pre-LN layer among post-LN siblings
    is refused by FusedTransformerLayer's `post_ln_order`, and the residual-norm refusal before it in the pipeline
    (`sum_single_user`: the pre-LN sum feeds the next residual add) is a consequence of that layout, which the
    layer's own kind does not count. None when nothing counted."""
    if own != judged:
        for o in counted:
            if not_expected(own, o.pass_name) is not None and not_expected(judged, o.pass_name) is None:
                return o
    return counted[0] if counted else None


def check_declarations() -> None:
    """Every layer trait a pass or a guard names is one `LayerArchitecture.has` knows (`TRAITS`), exactly one
    registered pass is the whole-layer pass, and the unrecognized finding's declaration is well formed, so a misspelt
    trait fails at import instead of silently expecting nothing. (A pass checks its families, quantization mode and
    `listed_for` traits itself when it is built, `engine.Pass`.)

    Raises:
        RuleError: a pass's `expected_of` / `excused_by`, or a guard's `excused_in`, names an unknown trait, or a guard
            is excused somewhere without saying why; no registered pass, or more than one, is `whole_layer`; the
            finding's quantization mode is unknown.
    """
    missing = [t for t in TRAITS if t not in TRAIT_WORDS]
    if missing:
        raise RuleError(f"[Traits] no words for layer trait(s) {', '.join(missing)} (declarations.TRAIT_WORDS)")
    for p in PASSES.values():
        for t in (*p.expected_of, *(t for t, _ in p.excused_by)):
            if t not in TRAITS:
                raise RuleError(f"[Pass {p.name}] unknown layer trait {t!r}{close(t, TRAITS)}; known: "
                                f"{', '.join(TRAITS)}")
        if p.expected_of and not p.unexpected:
            raise RuleError(f"[Pass {p.name}] expected_of without `unexpected`: say why the others do not expect it")
        for g in _guards(p.name).values():
            for t, why in g.excuses:
                if t not in TRAITS:
                    raise RuleError(f"[Guard {g.name}] unknown layer trait {t!r}{close(t, TRAITS)}; known: "
                                    f"{', '.join(TRAITS)}")
                if not why:
                    raise RuleError(f"[Guard {g.name}] excused_in {t!r} without an excuse")
            for t in g.gap_in:
                if t not in TRAITS:
                    raise RuleError(f"[Guard {g.name}] unknown layer trait {t!r} in gap_in{close(t, TRAITS)}; known: "
                                    f"{', '.join(TRAITS)}")
    whole = [p.name for p in PASSES.values() if p.whole_layer]
    if len(whole) != 1:
        raise RuleError(f"[Pipeline] exactly one registered pass makes a whole layer (whole_layer=True); found "
                        f"{', '.join(whole) or 'none'}")
    check_words(f"Finding {FINDING}", "quantization mode", FINDING_QUANTIZATION[:1], QUANTIZATION)


def _excused(arch: LayerKind, p: Pass) -> bool:
    """Whether a layer of kind `arch` does not expect `p`'s product at all (`excused_by`, `lacks`, or its
    quantization)."""
    return (any(arch.has(t) for t, _ in p.excused_by) or any(arch.has(t) for t, *_ in p.lacks)
            or _quantized_out(arch, p.name))


def expected_products(arch: LayerKind) -> list[str]:
    """The fused ops a layer of kind `arch` should end with (for messages), in pass order, read from the passes'
    declarations: the whole-layer pass's product alone when the layer has a trait of its `expected_of`; else each
    product the layer has a trait for (`expected_of`, or `listed_for` with its qualifier) that the layer does not
    excuse (`excused_by`, `quantization`). E.g. `FusedTransformerLayer` for a post-LN layer, `packed attention
    (grouped-query), FusedSwiGLU` for a Llama layer with grouped-query attention."""
    whole = layer_pass()
    if whole is not None and any(arch.has(t) for t in whole.expected_of):
        return [whole.product]
    out = []
    for p in PASSES.values():
        if not p.product or p.whole_layer or _excused(arch, p):
            continue
        q = next((q for t, q in p.listed_for if arch.has(t)), None)
        if q is None and any(arch.has(t) for t in p.expected_of):
            q = ""
        if q is not None:
            out.append(f"{p.product} ({q})" if q else p.product)
    return out


__all__ = ["COMPILER_FIX_WORDS", "EXPECT_MODES", "FAMILIES", "ILLEGAL_HERE", "KINDS", "NOTHING_TO_CHANGE",
           "NOT_EXPECTED_FIX", "NOT_EXPECTED_HERE", "NOT_EXPECTED_WHY", "OP_GAP_GROUP", "PRODUCTS", "TAKEN_LATER_GROUP",
           "TRAITS",
           "GAP_WHY_HEAD", "LayerKind", "Remedied", "check_declarations", "compiler_fix_only", "excuse",
           "expected_of_words", "expected_products", "first_refusal", "fix_gap_form", "gap_line", "gap_names",
           "gap_sources", "gap_words", "lacks_product", "layer_pass", "makes_product", "not_expected",
           "not_expected_fix", "not_expected_line", "op_gap", "op_gaps", "places_words", "product", "recognizers",
           "with_caveat"]


check_declarations()
