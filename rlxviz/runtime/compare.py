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
| `nonfinite` | the oracle is not finite | | the graph's math is not finite even in float64 |

Tolerances come from `tolerance.TABLE` (`PrecisionPolicy`). The first input set on which a version is
not `ok` is named in its verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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


def max_abs(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    """Max |got - want| over all outputs (nan when either side is not finite where the other is)."""
    worst = 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        for g, w in zip(got, want, strict=True):
            if np.shape(g) != np.shape(w):
                return float("inf")
            if np.size(g):
                d = np.abs(_f64(g) - _f64(w))
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
    """

    inputs: str
    err_oracle: float
    err_unfused: float
    status: str
    where: str | None = None


@dataclass
class Verdict:
    """One version over the whole battery.

    Attributes:
        checks: one `InputCheck` per input set, in battery order.
        status: the first non-`ok` status (by input order), else `ok`.
        broke_on: the input set that gave that status, None when `ok`.
        note: one line, e.g. `fusion changed the numbers on fully_masked_row (6.1e-02 vs unfused)`.
    """

    checks: list[InputCheck] = field(default_factory=list)

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
    def note(self) -> str:
        bad = self.first_bad
        if bad is None:
            return "yes"
        return {"fusion": f"NO: fusion changed the numbers on {bad.inputs} ({bad.err_unfused:.1e} vs unfused)",
                "overflow": f"NO: overflows in its dtype on {bad.inputs}"
                            + (f" at {bad.where}" if bad.where else "") + " (unfused too; the oracle is finite)",
                "precision": f"NO: loses precision in its dtype on {bad.inputs} ({bad.err_oracle:.1e} vs the "
                             f"oracle, unfused too)",
                "nonfinite": f"NO: not finite even in float64 on {bad.inputs}"}[bad.status]


def _worst(errs: Any) -> float:
    vals = list(errs)
    if any(np.isnan(v) for v in vals):
        return float("nan")
    return max(vals, default=0.0)


def judge(got: Sequence[np.ndarray], oracle: Sequence[np.ndarray], unfused: Sequence[np.ndarray],
          policy: PrecisionPolicy, inputs: str = "") -> InputCheck:
    """The `InputCheck` of one version's outputs `got` (see the module table)."""
    e_or, e_un = max_abs(got, oracle), max_abs(got, unfused)
    if not finite(oracle):
        status = "nonfinite"
    elif close(got, oracle, policy.oracle):
        status = "ok"
    elif not finite(unfused):  # the graph overflows in its dtype already: where the NaNs land is not a pass's fault
        status = "overflow"
    elif not close(got, unfused, policy.same_backend, same_nonfinite=True) and not e_or <= 2 * max_abs(unfused, oracle):
        status = "fusion"  # differs from unfused AND is more than twice as far from the truth as unfused is
    else:
        status = "precision" if finite(got) else "overflow"
    return InputCheck(inputs, e_or, e_un, status)


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
                    c = InputCheck(c.inputs, c.err_oracle, c.err_unfused, "overflow", where)
            v.checks.append(c)
    return v


def check_versions(versions: Sequence[tuple[str, Graph]], sets: Battery | Sequence[InputSet],
                   weights: Mapping[str, np.ndarray], policy: PrecisionPolicy, run: Runner | None = None
                   ) -> list[Verdict]:
    """A `Verdict` per version; `versions[0]` must be the unfused graph (the baseline)."""
    run = run or mlx_runner()
    bases = baselines(versions[0][1], sets, weights, run)
    return [check_version(g, bases, weights, policy, run) for _, g in versions]


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
