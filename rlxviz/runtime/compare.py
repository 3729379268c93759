"""Are a graph's versions equivalent? Each version, on every input set of a battery, compared twice.

1. with the **oracle** (`run_oracle`: the unfused graph in float64): is the answer right, within the
   dtype's tolerance?
2. with the **unfused graph on the same backend in the same dtype**: did a pass change the numbers?

Together they separate a fusion bug from conditioning (`Verdict`):

| status | vs oracle | vs unfused (same backend) | meaning |
|---|---|---|---|
| `ok` | within | any | right (a fused kernel may even be closer than the unfused graph) |
| `fusion` | outside, > 2x unfused's error | differs | a pass changed the numbers: the version is wrong |
| `overflow` | outside | same, or unfused not finite | the graph itself overflows in its dtype (oracle finite) |
| `precision` | outside, <= 2x unfused's error | any | the graph itself loses precision in its dtype (e.g. f16 |
| | | | cancellation: fused and unfused round differently, neither closer to the oracle) |

A `precision` check whose version also differs from the unfused graph beyond the same-dtype tolerance
(`InputCheck.changed`) is not blamed on the dtype alone: its note says the pass changed the numbers, naming
the first pass where the error vs unfused jumps (`attribute_changes`) and the input set.
| `nonfinite` | the oracle is not finite | | the graph's math is not finite even in float64 |

Tolerances come from `tolerance.TABLE` (`PrecisionPolicy`). The first input set on which a version is
not `ok` is named in its verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..ir import Graph, Op
from .battery import Battery, InputSet
from .reference import NumpyEmitter, bind_leaf, run_oracle
from .tolerance import PrecisionPolicy, Tolerance

Runner = Callable[[Graph, Mapping[str, np.ndarray], Mapping[str, np.ndarray]], list[np.ndarray]]
"""`run(graph, feeds, weights) -> outputs`: the backend under test (default: MLX, dtype-true)."""

STATUSES = ("ok", "fusion", "overflow", "precision", "nonfinite")


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def max_abs(got: Sequence[np.ndarray], want: Sequence[np.ndarray], same_nonfinite: bool = False) -> float:
    """Max |got - want| over all outputs (nan when either side is not finite where the other is). With
    `same_nonfinite`, the same inf / nan at the same place on both sides counts as no difference (used
    for "vs the unfused graph": the unfused graph is 0 away from itself even where it overflows)."""
    worst = 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        for g, w in zip(got, want, strict=True):
            if np.shape(g) != np.shape(w):
                return float("inf")
            if np.size(g):
                g64, w64 = _f64(g), _f64(w)
                d = np.abs(g64 - w64)
                if same_nonfinite:
                    same = (g64 == w64) | (np.isnan(g64) & np.isnan(w64))
                    d = np.where(same, 0.0, d)
                worst = float("nan") if np.isnan(d).any() else max(worst, float(d.max()))
    return worst


def close(got: Sequence[np.ndarray], want: Sequence[np.ndarray], tol: Tolerance, same_nonfinite: bool = False) -> bool:
    """Every output within `tol`. Non-finite values never match, unless `same_nonfinite` and both sides
    hold the same inf / nan at the same places (used for "same as the unfused graph")."""
    for g, w in zip(got, want, strict=True):
        if np.shape(g) != np.shape(w):
            return False
        g64, w64 = _f64(g), _f64(w)
        if not same_nonfinite and not (np.isfinite(g64).all() and np.isfinite(w64).all()):
            return False
        if not np.allclose(g64, w64, rtol=tol.rtol, atol=tol.atol, equal_nan=same_nonfinite):
            return False
    return True


def finite(arrays: Sequence[np.ndarray]) -> bool:
    """Every float array holds only finite values."""
    return all(np.isfinite(a).all() for a in map(np.asarray, arrays) if a.dtype.kind in "fc")


@dataclass(frozen=True)
class InputCheck:
    """One version on one input set.

    Attributes:
        inputs: the input set's name.
        err_oracle: max |version - oracle|.
        err_unfused: max |version - unfused graph on the same backend and dtype|.
        status: one of `STATUSES`.
        where: for `overflow`, the first node that is not finite in the unfused graph (`first_nonfinite`).
        changed: the output differs from the unfused graph's by more than the same-dtype tolerance
            (`policy.same_backend`): a pass changed the numbers, whatever the oracle says.
        err_base: max |unfused graph - oracle| on this input set (how far the unfused graph itself is off).
    """

    inputs: str
    err_oracle: float
    err_unfused: float
    status: str
    where: str | None = None
    changed: bool = False
    err_base: float = 0.0

    def brief(self) -> str:
        """This check's status in words, naming the input set (the verdict's note without `NO: `)."""
        if self.status == "fusion" or (self.status == "precision" and self.changed):
            return (f"changed the numbers on {self.inputs} ({self.err_unfused:.1e} vs unfused, over the same-dtype "
                    f"tolerance; {self.err_oracle:.1e} vs the oracle, unfused {self.err_base:.1e})")
        at = f" at {self.where}" if self.where else ""
        if self.status == "overflow" and np.isfinite(self.err_oracle):  # this version's outputs stay finite
            return (f"overflows in its dtype on {self.inputs}{at} in the unfused graph (the oracle is finite); "
                    f"this version's outputs stay finite ({self.err_oracle:.1e} vs the oracle)")
        return {"ok": f"ok on {self.inputs}",
                "overflow": f"overflows in its dtype on {self.inputs}{at} (unfused too; the oracle is finite)",
                "precision": f"loses precision in its dtype on {self.inputs} ({self.err_oracle:.1e} vs the oracle, "
                             f"unfused too: {self.err_base:.1e})",
                "nonfinite": f"not finite even in float64 on {self.inputs}"}[self.status]


@dataclass
class Verdict:
    """One version over the whole battery.

    Attributes:
        checks: one `InputCheck` per input set, in battery order.
        status: the first non-`ok` status (by input order), else `ok`.
        broke_on: the input set that gave that status, None when `ok`.
        note: one line, e.g. `NO: fusion changed the numbers on fully_masked_row (6.1e-02 vs unfused, ...)`;
            where another input set holds the worst error vs the oracle (the number a table shows), the
            note names it too, so the note and the column agree.
        changed_by: the pass that first made this version's numbers differ from the unfused graph (set by
            the caller that knows the passes, e.g. `session.timing`), named in the note instead of `fusion`.
    """

    checks: list[InputCheck] = field(default_factory=list)
    changed_by: str | None = None

    @property
    def first_bad(self) -> InputCheck | None:
        return next((c for c in self.checks if c.status != "ok"), None)

    @property
    def status(self) -> str:
        bad = self.first_bad
        return "ok" if bad is None else bad.status

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def broke_on(self) -> str | None:
        bad = self.first_bad
        return None if bad is None else bad.inputs

    @property
    def err_oracle(self) -> float:
        return _worst(c.err_oracle for c in self.checks)

    @property
    def err_unfused(self) -> float:
        return _worst(c.err_unfused for c in self.checks)

    @property
    def first_changed(self) -> InputCheck | None:
        """The first input set on which this version differs from the unfused graph beyond the same-dtype
        tolerance (None: it matches the unfused graph everywhere)."""
        return next((c for c in self.checks if c.changed), None)

    @property
    def note(self) -> str:
        bad = self.first_bad
        if bad is None:
            return "yes"
        changed = bad.status == "fusion" or (bad.status == "precision" and bad.changed)
        who = self.changed_by or "fusion"
        text = f"{who} {bad.brief()}" if changed else bad.brief()
        worst = _worst_check(self.checks)
        if worst is not None and worst is not bad:
            text += f"; worst ({_num(worst.err_oracle)} vs the oracle): {worst.brief()}"
        return "NO: " + text


def _num(x: float) -> str:
    return "nan" if np.isnan(x) else f"{x:.1e}"


def _worst_check(checks: Sequence[InputCheck]) -> InputCheck | None:
    """The check holding the largest error vs the oracle (a nan first), or None when there are none."""
    return next((c for c in checks if np.isnan(c.err_oracle)), None) or max(checks, key=lambda c: c.err_oracle,
                                                                                default=None)


def _worst(errs: Any) -> float:
    vals = list(errs)
    if any(np.isnan(v) for v in vals):
        return float("nan")
    return max(vals, default=0.0)


def judge(got: Sequence[np.ndarray], oracle: Sequence[np.ndarray], unfused: Sequence[np.ndarray],
          policy: PrecisionPolicy, inputs: str = "") -> InputCheck:
    """The `InputCheck` of one version's outputs `got` (see the module table)."""
    e_or, e_un = max_abs(got, oracle), max_abs(got, unfused, same_nonfinite=True)
    changed = not close(got, unfused, policy.same_backend, same_nonfinite=True)
    e_base = max_abs(unfused, oracle)
    if not finite(oracle):
        status = "nonfinite"
    elif close(got, oracle, policy.oracle):
        status = "ok"
    elif not finite(unfused):  # the graph overflows in its dtype already: where the NaNs land is not a pass's fault
        status = "overflow"
    elif changed and not e_or <= 2 * e_base:
        status = "fusion"  # differs from unfused AND is more than twice as far from the truth as unfused is
    else:
        status = "precision" if finite(got) else "overflow"
    return InputCheck(inputs, e_or, e_un, status, changed=changed, err_base=e_base)


@dataclass
class Baseline:
    """Per input set: the oracle's outputs and the unfused graph's outputs on the backend under test.

    `overflow_at(weights)`: where the unfused graph first goes non-finite in its dtype (computed once)."""

    inputs: InputSet
    oracle: list[np.ndarray]
    unfused: list[np.ndarray]
    graph: Graph | None = None
    _where: list[str | None] = field(default_factory=list, repr=False)

    def overflow_at(self, weights: Mapping[str, np.ndarray]) -> str | None:
        if not self._where:
            self._where.append(None if self.graph is None else first_nonfinite(self.graph, self.inputs.feeds, weights))
        return self._where[0]


def baselines(unfused: Graph, sets: Battery | Sequence[InputSet], weights: Mapping[str, np.ndarray],
              run: Runner) -> list[Baseline]:
    """Run the oracle and the unfused graph (on `run`) once per input set."""
    items = sets.sets if isinstance(sets, Battery) else sets
    out = []
    with np.errstate(all="ignore"):
        for s in items:
            out.append(Baseline(s, run_oracle(unfused, s.feeds, weights), run(unfused, s.feeds, weights), unfused))
    return out


def check_version(version: Graph, bases: Sequence[Baseline], weights: Mapping[str, np.ndarray],
                  policy: PrecisionPolicy, run: Runner) -> Verdict:
    """Run `version` on every input set of `bases` and judge it (see the module table)."""
    v = Verdict()
    with np.errstate(all="ignore"):
        for b in bases:
            c = judge(run(version, b.inputs.feeds, weights), b.oracle, b.unfused, policy, b.inputs.name)
            if c.status in ("overflow", "precision"):
                where = b.overflow_at(weights)
                if where is not None:  # finite output, but an intermediate overflowed (e.g. rsqrt(inf) = 0)
                    c = InputCheck(c.inputs, c.err_oracle, c.err_unfused, "overflow", where, c.changed, c.err_base)
            v.checks.append(c)
    return v


def check_versions(versions: Sequence[tuple[str, Graph]], sets: Battery | Sequence[InputSet],
                   weights: Mapping[str, np.ndarray], policy: PrecisionPolicy, run: Runner | None = None
                   ) -> list[Verdict]:
    """A `Verdict` per version; `versions[0]` must be the unfused graph (the baseline)."""
    run = run or mlx_runner()
    bases = baselines(versions[0][1], sets, weights, run)
    return attribute_changes([label for label, _ in versions],
                             [check_version(g, bases, weights, policy, run) for _, g in versions])


def attribute_changes(labels: Sequence[str], verdicts: Sequence[Verdict]) -> list[Verdict]:
    """`verdicts` (one per version, in pipeline order, labels like `after fuse_sdpa`) with `changed_by` set
    where a version's first bad input set differs from the unfused graph: the pass of the first version
    that differs from the unfused graph on that input set (the pass where the error vs unfused jumps).
    Returns new `Verdict`s; the given ones are not changed."""
    out = []
    for i, v in enumerate(verdicts):
        bad = v.first_bad
        who = None
        if bad is not None and bad.changed:
            first = next((k for k in range(i + 1) if any(c.changed and c.inputs == bad.inputs
                                                          for c in verdicts[k].checks)), i)
            who = labels[first].removeprefix("after ")
        out.append(replace(v, changed_by=who) if who != v.changed_by else v)
    return out


def mlx_runner() -> Runner:
    """The default backend: `run_mlx` on the default executor (each graph in its own dtype)."""
    from .executor import run_mlx

    return lambda g, feeds, weights: run_mlx(g, feeds, weights)


def first_nonfinite(graph: Graph, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray]
                    ) -> str | None:
    """The first node whose value is not finite when `graph` runs in NumPy in its declared dtypes
    (e.g. `%12 reduce_sum f16[2, 8, 1]`), or None: where an overflow starts."""
    e = NumpyEmitter()
    env: dict[int, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for n in graph:
            if n.op in (Op.INPUT, Op.PARAM, Op.CONST):
                env[n.id] = bind_leaf(n, feeds, weights)
                continue
            out = np.asarray(e.emit(n.op, [env[i] for i in n.inputs], **n.attrs)).astype(n.dtype.numpy)
            env[n.id] = out
            if out.dtype.kind == "f" and not np.isfinite(out).all():
                return f"%{n.id} {n.op.value} {n.type}"
    return None


__all__ = ["STATUSES", "Baseline", "InputCheck", "Runner", "Verdict", "baselines", "check_version",
           "check_versions", "close", "finite", "first_nonfinite", "judge", "max_abs", "mlx_runner"]
