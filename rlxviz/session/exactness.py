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
from dataclasses import dataclass

import numpy as np

from ..ir import Graph, Op
from ..passes import Trace
from ..runtime import run_reference
from ..runtime.battery import InputSet, battery
from ..runtime.compare import attribute_changes, baselines, check_version, close
from ..runtime.precision import PrecisionPolicy, precision_policy

KINDS = ("fully_masked_row", "left_padding")
"""The input sets of the check: the mask forms on which a mask rewrite's fills matter."""
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
            difference is the dtype's rounding, not a pass: `runtime.compare`'s `precision` / `overflow`).
    """

    label: str
    inputs: str
    err: float
    changed_by: str | None


@dataclass(frozen=True)
class ExactnessCheck:
    """The outcome of `check_exactness`.

    Attributes:
        inputs: the input sets run (`KINDS` that apply).
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

    @property
    def ok(self) -> bool:
        """No version that a pass changed the numbers of (a skipped check is not a failure)."""
        return not [d for d in self.bad if d.changed_by]

    def line(self) -> str:
        """One line for `explain`, e.g. `numbers: 5 version(s) equal the unfused graph on fully_masked_row, ...`."""
        if self.skipped:
            return f"numbers not checked by explain: {self.skipped}"
        on = ", ".join(self.inputs)
        blamed = [d for d in self.bad if d.changed_by]
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
        return {"ok": self.ok, "inputs": list(self.inputs), "checked": list(self.checked),
                "skipped": self.skipped or None,
                "changed": [{"version": d.label, "inputs": d.inputs,
                             "max_err": d.err if math.isfinite(d.err) else str(d.err), "pass": d.changed_by}
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


def check_exactness(trace: Trace, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
                    budget_macs: float = BUDGET_MACS) -> ExactnessCheck | None:
    """Compare the pipeline's versions with the unfused graph on a fully masked row and left padding.

    Args:
        trace: the pipeline run (its input is the unfused graph).
        feeds: one complete set of inputs (e.g. `Model.random_feeds(0)`), the base of the mask sets.
        weights: params by name.
        budget_macs: the multiply-adds the runs may take together (module docstring).

    Returns:
        None when the graph has no mask input or no pass changed it; else an `ExactnessCheck`.

    Raises:
        Nothing of the runs: a version the reference cannot run (any exception of a run, e.g. an `onnx_op` the host
        refuses) makes the check `skipped`, naming the error.
    """
    distinct = _distinct(trace)
    if not distinct:
        return None
    sets = battery(trace.input, feeds, kinds=KINDS).sets
    if not sets:
        return None
    names = tuple(s.name for s in sets)
    try:
        policy = precision_policy(trace.input, "cpu")
    except KeyError as e:  # no tolerance row for the graph's dtype
        return ExactnessCheck(names, (), None, skipped=str(e).strip("'\""))
    per = run_macs(trace.input) * len(sets)
    if per * (len(distinct) + 1) <= budget_macs:
        first = distinct
    elif per * 2 <= budget_macs:
        first = distinct[-1:]
    else:
        return ExactnessCheck(names, (), policy, skipped=f"one run is {per / len(sets) / 1e6:.0f}M multiply-adds, "
                                                        f"over explain's budget; `rlxviz time` checks the versions")
    try:
        unfused = [_outputs(trace.input, s, weights) for s in sets]
        differs = [(label, g) for label, g in first
                   if not all(close(_outputs(g, s, weights), u, policy.same_backend, same_nonfinite=True)
                              for s, u in zip(sets, unfused, strict=True))]
        if not differs:
            return ExactnessCheck(names, tuple(label for label, _ in first), policy)
        return _judged(trace, distinct, sets, weights, policy, names)
    except Exception as e:  # noqa: BLE001 - a version the reference cannot run: the check says so, explain goes on
        return ExactnessCheck(names, (), policy, skipped=f"the reference interpreter could not run a version "
                                                        f"({type(e).__name__}: {str(e).splitlines()[0][:160]})")


def _judged(trace: Trace, distinct: Sequence[tuple[str, Graph]], sets: Sequence[InputSet],
            weights: Mapping[str, np.ndarray], policy: PrecisionPolicy, names: tuple[str, ...]) -> ExactnessCheck:
    """Every distinct version judged as `rlxviz time` judges it (oracle and unfused), the changing pass named."""
    run = lambda g, f, w: run_reference(g, f, w)  # noqa: E731 - the reference, in the graph's dtype
    bases = baselines(trace.input, sets, weights, run)
    labels = ["input", *(label for label, _ in distinct)]
    verdicts = attribute_changes(labels, [check_version(trace.input, bases, weights, policy, run),
                                          *(check_version(g, bases, weights, policy, run) for _, g in distinct)])
    bad = []
    for label, v in zip(labels[1:], verdicts[1:], strict=True):
        c = v.first_changed
        if c is None:
            continue
        bad.append(Disagreement(label, c.inputs, c.err_unfused, v.changed_by if v.status == "fusion" else None))
    return ExactnessCheck(names, tuple(labels[1:]), policy, tuple(bad))


__all__ = ["BUDGET_MACS", "KINDS", "Disagreement", "ExactnessCheck", "check_exactness", "run_macs"]
