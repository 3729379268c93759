"""Advice is checked, not written (issue 38): every fix line `explain` prints is applied as a what-if first.

For each refusal whose fix line `explain` prints (a layer's first rejection, its illegal-here refusals, a missed
fusion), the fix (`passes.whatif.fix_form`) is

* a statement (`none in the model: ...`, `nothing to change in the model: ...`): printed as it is, nothing to apply;
* a pipeline or model change with a what-if (`passes.whatif.what_if`): the what-if's pipeline runs on the what-if's
  graph; the fix is printed only when the fusion then happens (`passes.whatif.fused_more`) and the numbers stay the
  unfused original's on the small input sets below (NumPy reference interpreter): the what-if model, unfused, in
  float64 to `EXACT` (to the same-backend tolerance for a change whose constants are rounded, `WhatIf.rounded`: an
  attention scale folded by a ratio that is no power of two) with the model's weights and with unit-scale ones
  (`probe_weights`, so small weights do not hide a changed computation), and its fused graph in the graph's dtype
  to `runtime.precision`'s same-backend tolerance (the same inf / NaN at the same place counts as equal);
* a change with no what-if: it cannot be checked, so it is not printed as a fix.

A fix that is not printed is replaced (`vetted`) by `no checked fix in the model: <why>` (`UNCHECKED_FIX`: the rule
proposed a change to the model, which its check refutes; the refusal's remedy stays, so it still counts) or, where
the rule declared that no change to the model keeps its numbers (`compiler only`: a switch to another activation),
by `none in the model: <why>`; and the compiler fix line, so no line ever proposes a change that was not checked.

Input sets: `random` (the base feeds), and for a graph with a mask input `fully_masked_row` and `left_padding`
(`runtime.battery`). Cost: one pipeline run per distinct what-if (what-ifs that run the same thing share it) and
six reference runs per input set (three of them the original's, once), only while the multiply-adds stay within
`BUDGET_MACS`. Past it the numbers are not run and a what-if that passed its fusion check stands on its construction
(`FixCheck.detail` says so); of the what-ifs here only those exact by construction can pass that way (a dead node
removed, a pipeline parameter or pass changed), since the activation switch changes the numbers wherever they run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from ..ir import Graph
from ..passes import Trace, explain
from ..passes.guard import COMPILER_ONLY, IN_MODEL, NO_MODEL_FIX, UNCHECKED_FIX
from ..passes.refusal_kinds import ROUNDING_ONLY
from ..passes.report import MissedFusion, in_context
from ..passes.trace import Rejection
from ..passes.whatif import (
    STATEMENT,
    Blocker,
    WhatIf,
    blocker_words,
    fix_alone_blocker,
    fix_form,
    fused_more,
    still_refused,
    what_if,
)
from ..passes.why.caveat import alone_caveat, model_fix_note
from ..passes.why.facts import RunFacts
from ..passes.why.policy import with_caveat
from ..passes.why.standing import held_by, place_gaps
from ..runtime import run_reference
from ..runtime.battery import InputSet, battery
from ..runtime.compare import close
from ..runtime.precision import Tolerance, precision_policy
from .exactness import run_macs
from .status import FusionCheck

KINDS = ("random", "fully_masked_row", "left_padding")
"""The input sets a what-if's numbers are compared on (those that apply to the graph)."""
BUDGET_MACS = 1.5e9
"""Multiply-adds all what-ifs' reference runs of one `explain` may take together."""

CHECKED = "checked"
NOT_A_CHANGE = "not a change"
CHANGES_NUMBERS = "changes the numbers"
NO_FUSION = "does not fuse"
NO_WHAT_IF = "no what-if"
NOT_RUN = "numbers not run"
STATUSES = (CHECKED, NOT_A_CHANGE, CHANGES_NUMBERS, NO_FUSION, NO_WHAT_IF, NOT_RUN)
"""What checking a fix found; only `checked` and `not a change` fixes are printed as fixes."""

EXACT = Tolerance(1e-9, 1e-9)
"""How close the what-if model's float64 outputs must be to the original's: a rewrite exact in real arithmetic
differs by float64 rounding only."""
DEFAULT_COMPILER_FIX = "a rule that takes this form as the model writes it (its numbers kept)"
"""The compiler fix of a refusal whose guard names none, when its model-side fix is withheld."""


@dataclass(frozen=True)
class FixCheck:
    """One printed fix, checked.

    Attributes:
        rule / anchor / guard: the refusal (its rule, anchor node id and headline guard).
        fix: the fix line as the guard wrote it (after `report.in_context`): what was checked (`--json`'s
            `proposed_fix`; its `fix` is `printed`, the line the text prints after `fix:`).
        form: `statement`, `pipeline` or `model` (`passes.whatif.fix_form`).
        status: one of `STATUSES`.
        what: the what-if applied ("" when none).
        detail: what the check found, one line (the error and the input set that differs, the budget note).
        printed: the fix line `explain` prints: `fix`, or the `none in the model: ...` line that replaces it.
        compiler: the compiler fix line `explain` prints when its own check (`passes.whatif.without_guard`: the rule
            again with the refused guard passed) found another failure in the fusion's way: the guard's compiler fix,
            then `(checked at this rule alone: that passes GUARD only; then GUARD2 (KIND) fails: ...)`; "" when the
            fix line stands as
            the guard wrote it (nothing else failed, or nothing could be checked).
        compiler_fix: the line `explain` prints after `compiler fix:` for this refusal (`compiler`, else the guard's
            compiler fix, or `DEFAULT_COMPILER_FIX` where the model-side fix is withheld); "" when it prints none.
        shown: whether `explain` prints `printed` as a `fix:` line at all (`passes.explain.Outcome.lines`: not when
            the line is empty or the refusal's message already holds it, as falcon's `attn_is_fused_block`
            statement `fuse_attention_block ran before and did its part here ...`); `_shown` decides it.
        found: where the check refuted the fix (not `ok`), what it found (`applying it (...) does not make the fusion
            happen`), the words `printed` says after `NO_MODEL_FIX` or `UNCHECKED_FIX` (`_refuted`); "" otherwise.
    """

    rule: str
    anchor: int
    guard: str
    fix: str
    form: str
    status: str
    what: str = ""
    detail: str = ""
    printed: str = ""
    compiler: str = ""
    compiler_fix: str = ""
    shown: bool = True
    found: str = ""

    @property
    def ok(self) -> bool:
        """The fix is printed as a fix (checked, or no change proposed)."""
        return self.status in (CHECKED, NOT_A_CHANGE)

    @property
    def checked(self) -> bool:
        """A what-if ran and the fix passed it."""
        return self.status == CHECKED

    def to_dict(self) -> dict[str, object]:
        """`explain --json`'s `fix_checks` item, its keys worded as the text's lines: `fix` the line after `fix:`
        (`printed`; None when the text prints no `fix:` line for it, `shown`), `printed_as_fix` whether that line is
        the proposed fix itself (checked, or no change proposed) rather than the `none in the model: ...` line that
        replaces it (False when no line is printed), `compiler_fix` the line after `compiler fix:` (None when none is
        printed), `proposed_fix` the guard's own fix line that was checked; `compiler_fix_enough` False when the
        compiler fix's check at its rule alone found another failure (`compiler`), None when no compiler fix is
        printed."""
        return {"rule": self.rule, "anchor": self.anchor, "guard": self.guard,
                "fix": self.printed if self.shown else None,
                "proposed_fix": self.fix, "form": self.form, "status": self.status, "checked": self.checked,
                "printed_as_fix": self.ok and self.shown, "what_if": self.what or None, "detail": self.detail or None,
                "compiler_fix": self.compiler_fix or None,
                "compiler_fix_enough": not self.compiler if self.compiler_fix else None}

    @property
    def rewords(self) -> bool:
        """`vetted` changes the refusal's words: its fix failed its check, its compiler fix is not enough, or its
        check measured what a rounding-only change does to the numbers (`printed` then says it)."""
        return not self.ok or bool(self.compiler) or self.printed != self.fix


def _headline(trace: Trace, rule: str, anchor: int, guard: str) -> tuple[int, Rejection] | None:
    """The last headline refusal of `rule` at `anchor` by `guard` in the run, with its step index."""
    hit = None
    for k, s in enumerate(trace.steps):
        for r in s.rejections:
            if r.rule == rule and r.anchor == anchor and r.guard == guard and r.headline:
                hit = (k, r)
    return hit


def printed_refusals(trace: Trace, check: FusionCheck, verbose: bool = False) -> list[tuple[int, Rejection]]:
    """The refusals whose fix line `check.render(verbose)` prints (each once, in print order), with their step index:
    every layer's first rejection (when not fused) and illegal-here refusals, every missed fusion it lists, every
    refusal at a gap in rlxviz's ops whose gap line names its model-side fix (`why.caveat.model_fix_note`)
    or whose rule proposes a change it declares not to keep the numbers (`_refuted_by_rule`),
    and with `verbose` every rule's rejected outcome of each layer (`passes.explain`)."""
    keys: list[tuple[str, int, str]] = []
    shown = set(check.misses)
    for s in check.layers:
        shown |= set(s.misses)
        outs = ([s.first] if s.first is not None and not s.fused else []) + list(s.illegal)
        outs += explain(trace, s.layer).rejected if verbose else []
        keys += [(o.rule, o.nodes[0], o.guard) for o in outs if o.status == "rejected" and o.nodes]
    keys += [(m.pattern, m.node, m.guard) for m in RunFacts.of(trace).misses() if str(m) in shown]
    keys += [(m.pattern, m.node, m.guard) for m in RunFacts.of(trace).misses()
             if (model_fix_note(trace, m.pattern, m.node, m.guard) or _refuted_by_rule(m))
             and (hit := _headline(trace, m.pattern, m.node, m.guard)) is not None and place_gaps(trace, hit[1])]
    out: list[tuple[int, Rejection]] = []
    seen: set[tuple[str, int, str]] = set()
    for key in keys:
        if key in seen:
            continue
        seen.add(key)
        hit = _headline(trace, *key)
        if hit is not None:
            out.append(hit)
    return out


def _refuted_by_rule(m: MissedFusion) -> bool:
    """A refusal whose rule proposes a change to the model and declares that it changes the numbers (`compiler
    only`: another activation, `guard.activation_hint`): a gap in rlxviz's ops, its change checked all the same, so
    the Fix the app's panels show says what the check found."""
    return m.remedy == COMPILER_ONLY and fix_form(m.hint) != STATEMENT


def _sets(g: Graph, feeds: Mapping[str, np.ndarray]) -> tuple[InputSet, ...]:
    return battery(g, feeds, kinds=KINDS).sets


def _outputs(g: Graph, s: InputSet, weights: Mapping[str, np.ndarray], float_dtype: type | None = None
             ) -> list[np.ndarray]:
    with np.errstate(all="ignore"):
        return run_reference(g, s.feeds, weights, float_dtype=float_dtype)


class _Checker:
    """Runs each distinct what-if once (pipeline, fusion, numbers) and keeps the outcome by `WhatIf.key`."""

    def __init__(self, trace: Trace, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
                 budget_macs: float) -> None:
        self.trace, self.weights, self.feeds = trace, weights, feeds
        self.budget, self.budget_total = budget_macs, budget_macs
        self.runs: dict[tuple[str, ...], Trace] = {}
        self.numbers: dict[tuple[str, ...], tuple[str | None, bool]] = {}
        self.not_run: dict[tuple[str, ...], str] = {}  # WhatIf.key -> why its numbers were not run
        self.faint: dict[tuple[str, ...], str] = {}  # WhatIf.key -> the dtype whose rounding hides its difference
        self.measured: dict[tuple[str, ...], float] = {}  # WhatIf.key -> max err of its model in float64 (rounded)
        self._unfused: list[tuple[list[np.ndarray], ...]] | None = None

    @cached_property
    def sets(self) -> tuple[InputSet, ...]:
        """The input sets (made on first use: a fix line that is a statement runs nothing)."""
        return _sets(self.trace.input, self.feeds) if self.feeds else ()

    @cached_property
    def probe(self) -> dict[str, np.ndarray]:
        """`probe_weights` of the model's weights (made on first use: as large as the model's weights)."""
        return probe_weights(self.weights)

    def run(self, w: WhatIf) -> Trace:
        if w.key not in self.runs:
            self.runs[w.key] = w.pipeline.run(w.graph)
        return self.runs[w.key]

    def differs(self, w: WhatIf, after: Trace) -> tuple[str | None, bool]:
        """`(where the what-if's numbers differ from the unfused original's, or None; whether they were run)`: not
        run without input sets or past the budget (`not_run[w.key]` then says which, with the numbers)."""
        if w.key not in self.numbers:
            why: str | None = None
            ran = False
            if len(w.graph.outputs) != len(self.trace.input.outputs):
                why, ran = (f"the model returns {len(w.graph.outputs)} output(s) instead of "
                            f"{len(self.trace.input.outputs)}"), True
            elif not self.sets:
                self.not_run[w.key] = "no inputs to run it on"
            else:
                cost = run_macs(self.trace.input) * len(self.sets) * 6
                if cost <= self.budget:
                    self.budget -= cost
                    why, skipped, faint = self._compare(w.graph, after.final, w.rounded, w.key)
                    ran = skipped is None
                    if faint:
                        self.faint[w.key] = faint
                    if skipped is not None:
                        self.not_run[w.key] = skipped
                else:
                    self.not_run[w.key] = over_budget(cost, self.budget, self.budget_total)
            self.numbers[w.key] = (why, ran)
        return self.numbers[w.key]

    def _compare(self, model: Graph, fused: Graph, rounded: bool = False, key: tuple[str, ...] = ()
                 ) -> tuple[str | None, str | None, str]:
        """Where the what-if differs from the unfused original: its model (`model`, unfused) in float64 against the
        original in float64 to `EXACT` (to the same-backend tolerance when the change is `rounded`: its constants are
        the model's dtype's rounding of exact ones, `WhatIf.rounded`), with the model's weights and with unit-scale
        ones (`probe_weights`: a change of what the model computes shows there even where the model's small weights
        keep the activations near 0, where tanh-GELU and GELU agree to 1e-10), and its fused final graph in the
        graph's dtype against the original to the same-backend tolerance (`runtime.precision`); the same inf / NaN at
        the same place counts as equal. Every run is compared, and the difference reported is the first that the
        model's output dtype can hold (beyond its rounding, `_rounding`): GPT-2's small weights made tanh-GELU vs
        GELU differ by 1.07e-09 in float64 on its own weights, below float32's rounding, while unit-scale weights
        show the change. `(where they differ or None, None, "")` when the numbers ran, with the output dtype's name
        last when every difference found is below its rounding (then the first is reported); `(None, why not, "")`
        when they could not be run (no tolerance for the dtype, a graph the reference cannot run). For a `rounded`
        change, `measured[key]` is the largest error of its model in float64 with the model's weights over the input
        sets: how far rounding moves the numbers, which its fix line says (`ROUNDING_ONLY`)."""
        try:
            policy = precision_policy(self.trace.input, "cpu")
        except KeyError as e:
            return None, str(e.args[0] if e.args else e).split(";")[0], ""  # "no tolerance for DTYPE on cpu"
        faint: list[str] = []
        rounding, dtype = _rounding(self.trace.input)
        try:
            if self._unfused is None:
                self._unfused = [(_outputs(self.trace.input, s, self.weights, np.float64),
                                  _outputs(self.trace.input, s, self.weights),
                                  _outputs(self.trace.input, s, self.probe, np.float64)) for s in self.sets]
            exact = policy.same_backend if rounded else EXACT
            runs = [(model, self.weights, 0, exact, True, "in float64"),
                    (model, self.probe, 2, exact, True, "in float64 with unit-scale weights"),
                    (fused, self.weights, 1, policy.same_backend, False, "fused")]
            for s, want in zip(self.sets, self._unfused, strict=True):
                for g, weights, k, tol, wide, how in runs:
                    got = _outputs(g, s, weights, np.float64 if wide else None)
                    if rounded and k == 0 and len(got) == len(want[k]):
                        self.measured[key] = max(self.measured.get(key, 0.0), _err(got, want[k]))
                    if len(got) != len(want[k]) or not close(got, want[k], tol, same_nonfinite=True):
                        why = f"differs from the unfused model {how} on {s.name} (max err {_err(got, want[k]):.3g})"
                        if len(got) != len(want[k]) or not close(got, want[k], rounding, same_nonfinite=True):
                            return why, None, ""
                        faint.append(why)
        except Exception as e:  # noqa: BLE001 - a graph the reference cannot run (a host op): the numbers are not known
            return None, f"the reference interpreter cannot run it ({type(e).__name__})", ""
        return (faint[0], None, dtype) if faint else (None, None, "")


def _rounding(g: Graph) -> tuple[Tolerance, str]:
    """The rounding of `g`'s float outputs as a tolerance (the finest output dtype's machine epsilon, relative and
    absolute) and that dtype's name: a difference within it is one the model's outputs cannot hold."""
    dts = sorted({g[i].dtype for i in g.outputs if g[i].dtype.is_float}, key=lambda d: float(np.finfo(d.numpy).eps))
    if not dts:
        return Tolerance(0.0, 0.0), ""
    eps = float(np.finfo(dts[0].numpy).eps)
    return Tolerance(eps, eps), dts[0].value


def over_budget(cost: float, left: float, total: float) -> str:
    """Why a what-if's numbers were not run: its reference runs' multiply-adds `cost` past the `left` of explain's
    budget `total` (`BUDGET_MACS`), e.g. `its reference runs take 6.1e+09 multiply-adds, over explain's budget of
    1.5e+09 (BUDGET_MACS)`."""
    left_of = f"the {left:.2g} left of " if left < total else ""
    return (f"its reference runs take {cost:.2g} multiply-adds, over {left_of}explain's budget of {total:.2g} "
            "(BUDGET_MACS)")


def probe_weights(weights: Mapping[str, np.ndarray], seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal float weights of the same names, shapes and dtypes (integer ones kept): a rewrite that keeps the
    numbers for every input and weight keeps them for these too, and a change of the computation is not hidden by
    small weights."""
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(np.shape(v)).astype(np.asarray(v).dtype) if np.asarray(v).dtype.kind == "f"
            else v for k, v in weights.items()}


def _err(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """max |got - want| over the outputs of equal shape (nan: none, or a non-finite on one side)."""
    errs = [float(np.nanmax(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), initial=0.0))
            for a, b in zip(got, want, strict=False) if np.shape(a) == np.shape(b)]
    return max(errs, default=float("nan"))


CHECKED_ONLY = "(the compiler fix below passes this guard only)"
"""What a `none in the model` line says of the compiler fix when that fix's own check found another failure."""


def _words(trace: Trace, k: int, r: Rejection, b: Blocker) -> str:
    """`passes.whatif.blocker_words` of `b`, its message worded in the context of `trace.steps[k]` as `explain` words
    every message (`report.in_context`: a "run P first" whose P ran says what P decided)."""
    guard, kind, message = b
    message = in_context(trace, k, replace(r, guard=guard, kind=kind, message=message, hint=""))[0]
    return blocker_words(r.guard, (guard, kind, message))


def _compiler_line(trace: Trace, k: int, r: Rejection, left: Blocker | None) -> str:
    """The compiler fix line of `r` when its check finds the fusion still refused (`left`: what
    `passes.whatif.fix_alone_blocker` found standing): `FIX (checked at this rule alone: that passes GUARD only; then
    GUARD2 (KIND) fails: ...)`; "" when it stands as written. The check is the refusing rule's alone: a compiler fix
    that also changes an earlier pass (an allow-list two rules share) may do more than it shows, so the words claim no
    more than what was checked."""
    if not r.fix or left is None:
        return ""
    return f"{r.fix} (checked at this rule alone: that passes {r.guard} only; {_words(trace, k, r, left)})"


def _check_one(trace: Trace, k: int, r: Rejection, checker: _Checker) -> FixCheck:
    """`_check_fix` of `r`'s fix line, and its compiler fix checked too (`_compiler_line`). When that check finds the
    compiler fix not enough, a fix line that names it (`none in the model: ... (compiler fix: ...)`) says so with the
    caveat a not-expected line says (`why.caveat.alone_caveat`, `why.policy.with_caveat`): `explain -v`'s line and
    the plain line agree."""
    c = _check_fix(trace, k, r, checker)
    if not c.ok and r.remedy in ("", IN_MODEL) and c.found:
        # the rule proposed a change to the model: its check refutes that change, not every change (`UNCHECKED_FIX`)
        c = _refuted(c, c.found, lead=UNCHECKED_FIX)
    left = fix_alone_blocker(trace, k, r) if r.fix else None
    compiler = _compiler_line(trace, k, r, left)
    withheld = not c.ok  # `_reworded` then names a compiler fix as the fix
    c = replace(c, compiler_fix=compiler or r.fix or (DEFAULT_COMPILER_FIX if withheld else ""))
    if compiler:
        printed = with_caveat(c.printed.replace("(the compiler fix is the fix)", CHECKED_ONLY),
                              alone_caveat(r.guard, left))
        c = replace(c, compiler=compiler, printed=printed)
    return replace(c, shown=_shown(trace, k, r, c))


def _shown(trace: Trace, k: int, r: Rejection, c: FixCheck) -> bool:
    """Whether `explain` prints a `fix:` line for `r` as `vetted` words it by `c`: the hint it then has (`printed`
    where `_reworded` replaces it, else the guard's own in context, `fix`) is not empty and not inside the message
    (`passes.explain.Outcome.lines`, the one place that decides it)."""
    message = in_context(trace, k, r)[0]
    line = c.printed if _reworded(r, c).hint != r.hint else c.fix
    return bool(line) and line not in message


def _refuted(c: FixCheck, found: str, lead: str = NO_MODEL_FIX, **kw: object) -> FixCheck:
    """`c` (with `kw`'s fields) whose check refuted its fix: `found` what the check found, its `printed` line that
    finding after `lead` (`NO_MODEL_FIX`: `none in the model: applying it (...) changes the model's numbers: ...`;
    `UNCHECKED_FIX` where the rule proposed a change to the model, `_check_one`). The one wording of that line."""
    return replace(c, **kw, found=found, printed=lead + found)


def _check_fix(trace: Trace, k: int, r: Rejection, checker: _Checker) -> FixCheck:
    message, hint = in_context(trace, k, r)
    form = fix_form(hint) if hint not in message else STATEMENT  # a hint inside the message prints no fix line
    base = FixCheck(r.rule, r.anchor, r.guard, hint, form, NOT_A_CHANGE, printed=hint)
    if form == STATEMENT:
        return base
    try:
        w = what_if(trace, k, r, hint)
    except Exception:  # noqa: BLE001 - a what-if that cannot be built is no check: the fix is withheld, explain goes on
        w = None
    if w is None:
        return _refuted(base, "none offered, as rlxviz has no what-if that applies a change to the model here to "
                              "check it (the compiler fix is the fix)",
                        status=NO_WHAT_IF, detail="no what-if rewrite applies this fix, so it cannot be checked")
    try:
        after = checker.run(w)
    except Exception as e:  # noqa: BLE001 - the what-if graph broke a pass: the fix is not shown to work
        return _refuted(base, f"applying it ({w.what}) does not make the fusion happen", status=NO_FUSION,
                        what=w.what, detail=f"the pipeline failed on it ({type(e).__name__})")
    why, ran = checker.differs(w, after)
    if why is not None:
        faint = checker.faint.get(w.key, "")
        said = (f"changes what the model computes, by less than {faint} rounding on these inputs" if faint else
                "changes the model's numbers")
        return _refuted(base, f"applying it ({w.what}) {said}: {why}", status=CHANGES_NUMBERS, what=w.what,
                        detail=why)
    if not fused_more(trace, after, r):
        left = still_refused(after, r, trace)  # what stands in the way then: the checked fix's result decides the words
        then = f": {_words(trace, k, r, left)}" if left is not None else ""
        return _refuted(base, f"applying it ({w.what}) does not make the fusion happen{then}", status=NO_FUSION,
                        what=w.what, detail=f"{r.rule} still does not fuse after {w.what}")
    skipped = checker.not_run.get(w.key, "")
    if not ran and not w.exact:  # said once: the change is not exact, and why its numbers were not run
        why_not = f"its numbers could not be checked: {skipped}"
        return _refuted(base, f"applying it ({w.what}) fuses, but it changes what the model computes (not exact by "
                              f"construction) and {why_not}",
                        status=NOT_RUN, what=w.what, detail=f"the change is not exact by construction and {why_not}")
    sets = ", ".join(s.name for s in checker.sets)
    err = checker.measured.get(w.key) if w.rounded and ran else None
    measured = f", max err {err:.2g} in float64" if err is not None and math.isfinite(err) else ""
    rounding = f" up to rounding (its constants are rounded to the model's dtype{measured})" if w.rounded else ""
    note = f"numbers equal the unfused model{rounding} on {sets}" if ran else \
        f"exact by construction (numbers not run: {skipped})"
    # a rounding-only change says how much it moved the numbers, in every view that prints its line (`ROUNDING_ONLY`)
    printed = hint.replace(ROUNDING_ONLY, f"{ROUNDING_ONLY}{measured} on {sets}", 1) if measured else hint
    return replace(base, status=CHECKED, what=w.what, detail=f"{r.rule} fuses after {w.what}; {note}",
                   printed=printed)


def check_fixes(trace: Trace, check: FusionCheck, feeds: Mapping[str, np.ndarray] | None,
                weights: Mapping[str, np.ndarray], budget_macs: float = BUDGET_MACS,
                verbose: bool = False) -> list[FixCheck]:
    """Check every fix line `check.render(verbose)` prints (`printed_refusals`) as a what-if.

    Args:
        trace: the run `check` judged (`check_fusion(trace, ...)`).
        check: its verdict.
        feeds: one complete set of inputs (e.g. `Model.random_feeds(0)`), the base of the input sets; None or empty:
            the numbers are not run (the what-ifs stand on their construction).
        weights: params by name.
        budget_macs: the multiply-adds the reference runs may take together.
        verbose: also the fix lines of `render(verbose=True)` (every rule's outcome per layer).

    Returns:
        One `FixCheck` per printed refusal, in print order.
    """
    checker = _Checker(trace, feeds or {}, weights, budget_macs)
    return [_check_one(trace, k, r, checker) for k, r in printed_refusals(trace, check, verbose)]


def vetted(trace: Trace, checks: Iterable[FixCheck]) -> Trace:
    """`trace` with every refusal whose fix failed its check (`FixCheck.ok` False) saying so: its hint the check's
    `printed` line (`no checked fix in the model: ...`, or `none in the model: ...` where the rule declared its
    remedy `compiler only`; the remedy is kept: a check refutes one change, the verdict is the rule's), its compiler
    fix kept (or
    `DEFAULT_COMPILER_FIX`); and every refusal whose compiler fix is not enough (`FixCheck.compiler`) saying what
    else stands in the way; a place the model's own term holds (`standing.held_by`: t5's cross-attention) has that
    term's hint, never its gap's unchecked workaround. The same trace when every fix passed as written. The graphs
    and matches are shared; its content key (`Trace.digest`) is its own, since its rejections differ."""
    bad = {(c.rule, c.anchor, c.guard): c for c in checks if c.rewords}
    held = {(r.rule, r.anchor, r.guard): t.hint for r in trace.rejections  # the model's own term holds the place:
            if r.headline and not r.soft and (t := held_by(trace, r)) is not None}  # its hint, no gap's workaround
    if not bad and not held:
        return trace
    steps = []
    for s in trace.steps:
        rejections = [replace(r, hint=held[k]) if (k := (r.rule, r.anchor, r.guard)) in held else
                      r if (c := bad.get(k)) is None else _reworded(r, c) for r in s.rejections]
        steps.append(replace(s, rejections=rejections))
    return Trace(trace.input, steps, trace.pipeline)


__all__ = ["BUDGET_MACS", "CHANGES_NUMBERS", "CHECKED", "CHECKED_ONLY", "DEFAULT_COMPILER_FIX", "KINDS", "NOT_A_CHANGE",
           "NO_FUSION",
           "NO_WHAT_IF", "NOT_RUN", "STATUSES", "FixCheck", "advised", "check_fixes", "over_budget", "printed_refusals",
           "vetted"]


def _reworded(r: Rejection, c: FixCheck) -> Rejection:
    """`r` as `vetted` words it by its check `c`."""
    if not c.ok:  # a proposed change that failed its check; one the rule declared no fix keeps `compiler only`
        r = replace(r, hint=c.printed, remedy=r.remedy if r.remedy in ("", IN_MODEL) else COMPILER_ONLY)
    elif c.printed != c.fix:  # a statement naming the compiler fix as the fix, checked only so far; a measured
        r = replace(r, hint=c.printed)  # rounding-only change with its measured error
    return replace(r, fix=c.compiler_fix)  # the compiler fix line `explain` prints (`FixCheck.compiler_fix`)


def checked_verdict(trace: Trace, model: str, feeds: Mapping[str, np.ndarray] | None,
                    weights: Mapping[str, np.ndarray], layers: Iterable[int] | None = None, expect: str = "model",
                    verbose: bool = False) -> tuple[FusionCheck, list[FixCheck]]:
    """The run's verdict with every printed fix checked (`check_fixes`, then `vetted` where one failed): what
    `rlxviz explain` prints and the app's Why tab shows, one answer for both.

    Args:
        trace, model, layers, expect: as `session.check_fusion`.
        feeds, weights: as `check_fixes` (None feeds: the what-ifs stand on their construction).
        verbose: also the fix lines of every rule's explanation (`explain -v`, `--json`, the Why tab).

    Returns:
        (the verdict, one `FixCheck` per printed refusal).

    Raises:
        SessionError: as `session.check_fusion`.
    """
    from .status import check_fusion

    check = check_fusion(trace, model, layers, expect)
    fixes = check_fixes(trace, check, feeds, weights, verbose=verbose)
    if any(f.rewords for f in fixes):
        check = check_fusion(vetted(trace, fixes), model, layers, expect)
    return check, fixes


def advised(trace: Trace, model: str, feeds: Mapping[str, np.ndarray] | None, weights: Mapping[str, np.ndarray]
            ) -> Trace:
    """`trace` with every fix line as `explain -v` prints it (`checked_verdict(verbose=True)`, then `vetted`): the
    words the app's inspector (`AppState.advised_trace`) and the Model Explorer export (`rlxviz export OUT.json`)
    give each refusal, so no view prints a fix its check refuted. Arguments as `checked_verdict`'s."""
    _, fixes = checked_verdict(trace, model, feeds, weights, verbose=True)
    return vetted(trace, fixes)
