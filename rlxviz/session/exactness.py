"""`explain`'s numeric check: no claim of "exact" without numbers (issue 38).

Every rewrite of the pipeline states that it keeps the graph's numbers; `explain` prints "(exact)" on the mask
rewrites without running anything. `check_exactness` runs the cheap subset of `rlxviz time`'s battery where mask
rewrites go wrong, a fully masked row and left padding (`runtime.battery`, only for graphs with a mask input), on
the NumPy reference interpreter in the graph's own dtype, and compares every distinct version with the unfused
graph with the same-dtype tolerance of `runtime.precision` (the same inf / NaN at the same place counts as equal).
A version that differs is then judged as `rlxviz time` judges it (`runtime.compare`: against the float64 oracle too,
so rounding an ill-conditioned input is not blamed on a pass), and a pass that changed the numbers is named.

Cost: one reference run per version and input set. The check estimates the multiply-adds of one run (the graph's
matmuls and attention) and checks every distinct version when the total is within `BUDGET_MACS`, else the final
version alone (the other versions only when it differs, to name the pass), else nothing (`skipped` says why;
`rlxviz time` still checks the whole battery).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..ir import Graph, Op
from ..passes import Trace
from ..passes.trace import RUN_SEP, family_of
from ..runtime import run_reference
from ..runtime.battery import InputSet, battery, mask_form, mask_inputs
from ..runtime.compare import attribute_changes, baselines, check_version, close
from ..runtime.precision import PrecisionPolicy, precision_policy

KINDS = ("fully_masked_row", "left_padding")
"""The input sets of the check: the mask forms on which a mask rewrite's fills matter."""
FILLS = ("-inf",)
"""Extreme fills an additive mask input is also run with, in every set of `KINDS` (the battery writes the dtype's
lowest finite value, HF's `finfo.min`; PyTorch's sdpa masks write -inf): `fully_masked_row (-inf fill)`. They run
when the budget leaves room after the versions chosen (`check_exactness`)."""
NOTHING_CHANGED = "no pass changed the graph, so every version is the unfused graph"
"""`ExactnessCheck.skipped` of a run whose passes changed nothing."""
NO_MASK_NO_CLAIM = ("the graph has no mask input (the check runs a fully masked row and left padding) and no pass "
                    "of the run states its rewrites exact; `rlxviz time` compares every version on random inputs")
"""`ExactnessCheck.skipped` of a graph the check has no input set for (`check_exactness`)."""
CLAIM = "(exact)"
"""What a pass's decision says when it states a rewrite or a kept term exact (`explain` prints it)."""
BUDGET_MACS = 1.5e9
"""Multiply-adds all the check's reference runs may take together (about a second on one core)."""


@dataclass(frozen=True)
class Disagreement:
    """A version whose numbers differ from the unfused graph's.

    Attributes:
        label: the version, e.g. `after fuse_sdpa`.
        inputs: the input set it differs on (`fully_masked_row`).
        err: max |version - unfused| there (nan: non-finite on one side only).
        changed_by: the pass that first made the numbers differ (None when the float64 oracle says the
            difference is the dtype's rounding, not a pass: `runtime.compare`'s `precision` / `overflow`; or, in a
            quantized graph, a quantization step moved by rounding).
        why: for a difference no pass is blamed for, `rlxviz time`'s words for it (`InputCheck.brief`), else ''.
        status: `rlxviz time`'s status of the version on that input set (`runtime.compare.STATUSES`).
        since: the first version that differs from the unfused graph on that input set (where the difference
            starts), e.g. `after fuse_sdpa`.
    """

    label: str
    inputs: str
    err: float
    changed_by: str | None
    why: str = ""
    status: str = "fusion"
    since: str = ""


@dataclass(frozen=True)
class ExactnessCheck:
    """The outcome of `check_exactness`.

    Attributes:
        inputs: the input sets run (`KINDS` that apply; `random` for a graph without a mask input whose passes
            claim exactness).
        checked: the version labels compared with the unfused graph.
        policy: the dtype and the tolerances judged with.
        bad: the versions a pass changed the numbers of (empty when ok).
        skipped: why nothing was checked ("" when something was).
    """

    inputs: tuple[str, ...]
    checked: tuple[str, ...]
    policy: PrecisionPolicy | None
    bad: tuple[Disagreement, ...] = ()
    skipped: str = ""
    fills: tuple[str, ...] = ()
    """The extra input sets run with an extreme additive-mask fill (`FILLS`), e.g. `left_padding (-inf fill)`."""
    claimed: tuple[str, ...] = ()
    """The passes of the run whose decisions say `(exact)` (`claims_exact`); each of their versions is checked
    whenever the budget allows more than the final version."""

    @property
    def refuted(self) -> tuple[Disagreement, ...]:
        """In a quantized graph (judged against version 0, `runtime.precision.judge_of`), the differences no pass is
        blamed for that start at the version of a pass stating its rewrites exact (`claimed`) and that `rlxviz time`
        judges not ok (a quantization step moved by the pass's rounding): its "(exact)" is not what the numbers
        show, so the check fails for it too. Empty for a graph the float64 oracle judges (there such a difference is
        the dtype's rounding or overflow, told so by the line)."""
        if self.policy is None or self.policy.judge.oracle:
            return ()
        return tuple(d for d in self.bad if not d.changed_by and d.status != "ok"
                     and family_of(d.since.removeprefix("after ")) in self.claimed)

    @property
    def ok(self) -> bool:
        """No version that a pass changed the numbers of, and no pass stating exactness whose version's numbers
        `rlxviz time` finds changed (`refuted`); a skipped check is not a failure."""
        return not [d for d in self.bad if d.changed_by] and not self.refuted

    def line(self) -> str:
        """One line for `explain`, e.g. `numbers: 5 version(s) equal the unfused graph on fully_masked_row, ...`."""
        if self.skipped:
            return f"numbers not checked by explain: {self.skipped}"
        on = ", ".join(self.inputs) + (f" (and {len(self.fills)} with -inf mask fills)" if self.fills else "")
        blamed = [d for d in self.bad if d.changed_by]
        if not blamed and self.refuted:
            d = self.refuted[0]
            who = family_of(d.since.removeprefix("after "))
            return (f"numbers: {d.label} DIFFERS from the unfused graph on {d.inputs} (max err {d.err:.3g}, allowed "
                    f"{self.policy.same_backend if self.policy else '?'}) from {d.since} on: {who} states its "
                    f"rewrites exact, but {d.why} (`rlxviz time` shows every input set)")
        if not blamed and self.bad:  # differs, but not by a pass: never "equal" (time says NO for it too)
            d = self.bad[0]
            return (f"numbers: {d.label} differs from the unfused graph on {d.inputs} (max err {d.err:.3g}, allowed "
                    f"{self.policy.same_backend if self.policy else '?'}), not by a pass: {d.why}")
        if not blamed:
            return (f"numbers: {len(self.checked)} version(s) equal the unfused graph on {on} (NumPy reference, "
                    f"{self.policy.dtype if self.policy else '?'}, {self.policy.same_backend if self.policy else ''})")
        d = blamed[0]
        return (f"numbers: {d.label} DIFFERS from the unfused graph on {d.inputs} (max err {d.err:.3g}, allowed "
                f"{self.policy.same_backend if self.policy else '?'}): {d.changed_by} changed the numbers although "
                f"its rewrites are stated exact; its fusions on this graph are wrong (`rlxviz time` shows every "
                f"input set)")

    def to_dict(self) -> dict[str, object]:
        """JSON-ready (a non-finite error as the string `nan` / `inf`, which strict JSON cannot hold as a number)."""
        return {"ok": self.ok, "inputs": list(self.inputs), "fills": list(self.fills),
                "claimed_exact": list(self.claimed), "checked": list(self.checked),
                "skipped": self.skipped or None,
                "changed": [{"version": d.label, "inputs": d.inputs,
                             "max_err": d.err if math.isfinite(d.err) else str(d.err), "pass": d.changed_by,
                             "why": d.why or None, "status": d.status, "since": d.since or None}
                            for d in self.bad]}


def run_macs(g: Graph) -> float:
    """Multiply-adds of one run of `g` (an estimate), from its matmuls (`[.., M, K] @ [.., K, N]`: out elements x K)
    and attention ops (out elements `B*S*H` x 2 * Sk: QK^T and PV); other ops count one per output element."""
    total = 0.0
    for n in g.compute_nodes():
        out = float(math.prod(n.shape)) if n.shape else 1.0
        if n.op == Op.MATMUL:
            total += out * g[n.inputs[0]].shape[-1]
        elif n.op == Op.ATTENTION:
            total += out * 2 * g[n.inputs[1]].shape[-2]
        else:
            total += out
    return total


def _distinct(trace: Trace) -> list[tuple[str, Graph]]:
    versions = trace.versions()
    return [versions[i] for i in range(1, len(versions)) if trace.steps[i - 1].changed and not trace.steps[i - 1].error]


def _outputs(g: Graph, s: InputSet, weights: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    with np.errstate(all="ignore"):
        return run_reference(g, s.feeds, weights)


def claims_exact(trace: Trace) -> tuple[str, ...]:
    """The passes of the run whose decisions (a refusal, a soft rejection: what a fusion kept) say `(exact)`."""
    return tuple(dict.fromkeys(s.family for s in trace.steps if not s.error
                               for r in s.rejections if CLAIM in r.message))


def fill_sets(graph: Graph, sets: Sequence[InputSet]) -> list[InputSet]:
    """`sets` again with every additive mask input's masked entries (the dtype's lowest finite value) written as each
    fill of `FILLS`; none when the graph has no additive mask input."""
    additive = [n.attrs["name"] for n in mask_inputs(graph) if mask_form(graph, n) == "additive"]
    out = []
    for fill in FILLS:
        for s in sets:
            feeds = dict(s.feeds)
            for name in additive:
                a = np.asarray(feeds[name])
                feeds[name] = np.where(a == np.finfo(a.dtype).min, np.array(float(fill), a.dtype), a)
            if additive:
                out.append(InputSet(f"{s.name} ({fill} fill)", f"{s.what}, masked as {fill}", feeds))
    return out


def check_exactness(trace: Trace, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
                    budget_macs: float = BUDGET_MACS) -> ExactnessCheck:
    """Compare the pipeline's versions with the unfused graph on a fully masked row and left padding, in every mask
    form: an additive mask input also with -inf fills (`FILLS`).

    Which versions (each run costs `run_macs`): every distinct version when the budget allows; else the final
    version and the version of every pass that claims exactness (`claims_exact`); else the final version alone (the
    others only when it differs, to name the pass); else nothing (`skipped` says why). The -inf fill sets run when
    the budget leaves room after that. A graph without a mask input is checked on its `random` inputs when a pass of
    the run claims exactness, else not at all.

    Args:
        trace: the pipeline run (its input is the unfused graph).
        feeds: one complete set of inputs (e.g. `Model.random_feeds(0)`), the base of the mask sets.
        weights: params by name.
        budget_macs: the multiply-adds the runs may take together (module docstring).

    Returns:
        The `ExactnessCheck`; `skipped` says why nothing was run where no pass changed the graph (`NOTHING_CHANGED`),
        or the graph has no mask input and no pass claims exactness (`NO_MASK_NO_CLAIM`), as past the budget: an
        n4-09 dequantize-scale FFN printed no `numbers:` line and `--json` a null check, which told no one why.

    Raises:
        Nothing of the runs: a version the reference cannot run (any exception of a run, e.g. an `onnx_op` the host
        refuses) makes the check `skipped`, naming the error.
    """
    distinct = _distinct(trace)
    if not distinct:
        return ExactnessCheck((), (), None, skipped=NOTHING_CHANGED)
    claimed = claims_exact(trace)
    sets = battery(trace.input, feeds, kinds=KINDS).sets
    if not sets and claimed:
        sets = battery(trace.input, feeds, kinds=("random",)).sets
    if not sets:
        return ExactnessCheck((), (), None, skipped=NO_MASK_NO_CLAIM)
    names = tuple(s.name for s in sets)
    try:
        policy = precision_policy(trace.input, "cpu")
    except KeyError as e:  # no tolerance row for the graph's dtype
        return ExactnessCheck(names, (), None, skipped=str(e).strip("'\""), claimed=claimed)
    macs = run_macs(trace.input)
    per = macs * len(sets)
    chosen = [v for v in distinct if v[0].removeprefix("after ").partition(RUN_SEP)[0] in claimed or v is distinct[-1]]
    if per * (len(distinct) + 1) <= budget_macs:
        first = distinct
    elif per * (len(chosen) + 1) <= budget_macs:
        first = chosen
    elif per * 2 <= budget_macs:
        first = distinct[-1:]
    else:
        return ExactnessCheck(names, (), policy, skipped=f"one run is {per / len(sets) / 1e6:.0f}M multiply-adds, "
                                                        f"over explain's budget; `rlxviz time` checks the versions",
                              claimed=claimed)
    extra = fill_sets(trace.input, sets) if sets[0].name != "random" else []
    if extra and per * (len(first) + 1) + macs * len(extra) * (len(first) + 1) > budget_macs:
        extra = []
    every = [*sets, *extra]
    fills = tuple(s.name for s in extra)
    try:
        unfused = [_outputs(trace.input, s, weights) for s in every]
        differs = [(label, g) for label, g in first
                   if not all(close(_outputs(g, s, weights), u, policy.same_backend, same_nonfinite=True)
                              for s, u in zip(every, unfused, strict=True))]
        if not differs:
            return ExactnessCheck(names, tuple(label for label, _ in first), policy, fills=fills, claimed=claimed)
        return replace(_judged(trace, distinct, every, weights, policy, names), fills=fills, claimed=claimed)
    except Exception as e:  # noqa: BLE001 - a version the reference cannot run: the check says so, explain goes on
        return ExactnessCheck(names, (), policy, skipped=f"the reference interpreter could not run a version "
                                                        f"({type(e).__name__}: {str(e).splitlines()[0][:160]})",
                              claimed=claimed)


def _judged(trace: Trace, distinct: Sequence[tuple[str, Graph]], sets: Sequence[InputSet],
            weights: Mapping[str, np.ndarray], policy: PrecisionPolicy, names: tuple[str, ...]) -> ExactnessCheck:
    """Every distinct version judged as `rlxviz time` judges it (oracle and unfused), the changing pass named."""
    run = lambda g, f, w: run_reference(g, f, w)  # noqa: E731 - the reference, in the graph's dtype
    bases = baselines(trace.input, sets, weights, run)
    labels = ["input", *(label for label, _ in distinct)]
    verdicts = attribute_changes(labels, [check_version(trace.input, bases, weights, policy, run),
                                          *(check_version(g, bases, weights, policy, run) for _, g in distinct)])
    bad = []
    for k, (label, v) in enumerate(zip(labels[1:], verdicts[1:], strict=True), start=1):
        c = v.first_changed
        if c is None:
            continue
        blamed = v.changed_by if v.status == "fusion" else None
        why = "" if blamed else c.brief() if c.status != "ok" else (
            f"within the float64 oracle's tolerance ({c.err_oracle:.1e} from it)")
        since = next(labels[j] for j in range(1, k + 1)
                     if any(x.changed and x.inputs == c.inputs for x in verdicts[j].checks))
        bad.append(Disagreement(label, c.inputs, c.err_unfused, blamed, why, c.status, since))
    return ExactnessCheck(names, tuple(labels[1:]), policy, tuple(bad))


__all__ = ["BUDGET_MACS", "CLAIM", "FILLS", "KINDS", "NOTHING_CHANGED", "NO_MASK_NO_CLAIM", "Disagreement",
           "ExactnessCheck", "check_exactness", "claims_exact", "fill_sets", "run_macs"]
