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

A quantized graph (a cast to u8/i8 of a rounded float: QuantizeLinear, DynamicQuantizeLinear) turns a rounding-level
difference before a quantizer into a whole step: a version whose first differing quantized tensor moved by at most
one step, while what it rounds agrees within the same-dtype tolerance, is `precision` with that reason (`flip`,
`quant_flip.quantization_flip`), never blamed on a pass.

A graph whose numbers pass through a quantization step (`precision.judge_of`: QuantizeLinear, DynamicQuantizeLinear,
the quantized operands of MatMulInteger) is not judged by the float64 oracle at all: a value on a rounding boundary
rounds one way in float32 and the other in float64, a whole step apart, in the unfused graph itself. Its "oracle"
(`Baseline.oracle`) is version 0 on the backend under test in the graph's dtype, judged with the same-dtype
tolerance, and no conditioning excuses a difference (`InputCheck.oracle` False): a version is `ok` only when it
equals version 0 within that tolerance; one that differs is `fusion`, or `precision` for a step moved by rounding
(`flip`), and `ok` never.

"2x unfused's error" reads the conditioning of the input set: the bar is 2x the larger of the unfused graph's
error and `err_cond`, how far the oracle itself moves when the float inputs and weights move by one unit in
the last place of the graph's dtype (`conditioning`; `Baseline.conditioning`, computed only for a version that
differs from the unfused graph). On ill-conditioned inputs (+-300 inputs pushing attention logits to 4.5e4)
any correctly rounded evaluation may land that far off, so a version as far from the oracle as that is
`precision`, and its note says it differs from the unfused graph while no farther from the oracle; only a
version farther from the oracle than the bar is blamed on a pass (`fusion`, naming the first pass where the
error vs unfused jumps: `attribute_changes`).

Tolerances come from `precision.TABLE` (`PrecisionPolicy`). The first input set on which a version is
not `ok` is named in its verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..ir import Graph, Op
from .battery import Battery, InputSet
from .precision import Judge, PrecisionPolicy, Tolerance, judge_of
from .quant_flip import quantization_flip
from .reference import NumpyEmitter, bind_leaf, run_oracle

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
        err_cond: how far the oracle moves when the inputs are rounded to the dtype (`Baseline.conditioning`;
            0.0 when not computed).
        flip: for a `precision` check of a quantized graph, why the difference is a quantization step moved by
            rounding (`quant_flip.quantization_flip`), else ''.
        oracle: judged against the float64 oracle; False: against version 0 in the graph's dtype (a quantized
            graph, `precision.judge_of`), `err_oracle` then being the error against version 0.
    """

    inputs: str
    err_oracle: float
    err_unfused: float
    status: str
    where: str | None = None
    changed: bool = False
    err_base: float = 0.0
    err_cond: float = 0.0
    flip: str = ""
    oracle: bool = True

    def brief(self) -> str:
        """This check's status in words, naming the input set (the verdict's note without `NO: `)."""
        if self.status == "fusion" and not self.oracle:
            return (f"changed the numbers on {self.inputs} ({self.err_unfused:.1e} vs version 0 in its dtype, over "
                    f"the same-dtype tolerance; a quantized graph, judged against version 0)")
        if self.status == "fusion":
            return (f"changed the numbers on {self.inputs} ({self.err_unfused:.1e} vs unfused, over the same-dtype "
                    f"tolerance; {self.err_oracle:.1e} vs the oracle, unfused {self.err_base:.1e})")
        if self.status == "precision" and self.flip:
            return (f"differs from the unfused graph on {self.inputs} ({self.err_unfused:.1e}) by a quantization "
                    f"step: {self.flip}; the graph quantizes at run time, so a rounding-level change moves whole "
                    f"steps (not a pass)")
        if self.status == "precision" and self.changed:
            cond = (f"; rounding the inputs to the dtype alone moves the oracle by {self.err_cond:.1e}"
                    if self.err_cond else "")
            return (f"loses precision in its dtype on {self.inputs}: it differs from the unfused graph "
                    f"({self.err_unfused:.1e}) but is no farther from the oracle ({self.err_oracle:.1e}, unfused "
                    f"{self.err_base:.1e}{cond}); ill-conditioned inputs, not a pass")
        at = f" at {self.where}" if self.where else ""
        if self.status == "overflow" and not self.oracle:
            return f"overflows in its dtype on {self.inputs}{at} (version 0 too)"
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
        changed = bad.status == "fusion"
        who = self.changed_by or "fusion"
        text = f"{who} {bad.brief()}" if changed else bad.brief()
        worst = _worst_check(self.checks)
        if worst is not None and worst is not bad:
            ref = "the oracle" if worst.oracle else "version 0"
            text += f"; worst ({_num(worst.err_oracle)} vs {ref}): {worst.brief()}"
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
          policy: PrecisionPolicy, inputs: str = "", err_cond: float = 0.0, by_oracle: bool = True) -> InputCheck:
    """The `InputCheck` of one version's outputs `got` (see the module table); `err_cond`: the input set's
    conditioning (`Baseline.conditioning`), 0.0 when unknown. `by_oracle` False (a quantized graph, `Baseline.judge`):
    `oracle` is version 0 in the graph's dtype, judged with `policy.same_backend`; nothing is `nonfinite` (that names
    float64's verdict) and `err_cond` is not read."""
    e_or, e_un = max_abs(got, oracle), max_abs(got, unfused, same_nonfinite=True)
    changed = not close(got, unfused, policy.same_backend, same_nonfinite=True)
    e_base = max_abs(unfused, oracle)
    if not by_oracle:
        err_cond = 0.0
    if by_oracle and not finite(oracle):
        status = "nonfinite"
    elif close(got, oracle, policy.oracle if by_oracle else policy.same_backend):
        status = "ok"
    elif not finite(unfused):  # the graph overflows in its dtype already: where the NaNs land is not a pass's fault
        status = "overflow"
    elif changed and not e_or <= 2 * max(e_base, err_cond if np.isfinite(err_cond) else 0.0):
        status = "fusion"  # differs from unfused AND is more than twice as far from the truth as the dtype allows
    else:
        status = "precision" if finite(got) else "overflow"
    return InputCheck(inputs, e_or, e_un, status, changed=changed, err_base=e_base, err_cond=err_cond,
                      oracle=by_oracle)


@dataclass
class Baseline:
    """Per input set: the oracle's outputs and the unfused graph's outputs on the backend under test.

    `judge`: who judges (`precision.judge_of` the unfused graph); for a quantized graph `oracle` holds version 0's
    outputs on the backend under test (the same arrays as `unfused`), not float64 ones.
    `overflow_at(weights)`: where the unfused graph first goes non-finite in its dtype (computed once)."""

    inputs: InputSet
    oracle: list[np.ndarray]
    unfused: list[np.ndarray]
    graph: Graph | None = None
    judge: Judge = Judge()
    _where: list[str | None] = field(default_factory=list, repr=False)
    _cond: list[float] = field(default_factory=list, repr=False)

    def conditioning(self, weights: Mapping[str, np.ndarray]) -> float:
        """Max |oracle(rounded inputs) - oracle|: the oracle (float64) on the float inputs (not masks) and float
        weights each times 1 + s * eps, s = +-1 at random (seeded), eps the dtype's epsilon (2^-23 f32, 2^-10
        f16, 2^-7 bf16; `conditioning`): how far a correctly rounded evaluation in the dtype may land from the
        oracle on this input set. Computed once; 0.0 without a graph, and for a quantized graph (`judge`: no float64
        oracle, so no conditioning of it excuses a difference)."""
        if not self._cond:
            skip = self.graph is None or not self.judge.oracle
            self._cond.append(0.0 if skip else conditioning(self.graph, self.inputs.feeds, weights, self.oracle))
        return self._cond[0]

    def overflow_at(self, weights: Mapping[str, np.ndarray]) -> str | None:
        if not self._where:
            self._where.append(None if self.graph is None else first_nonfinite(self.graph, self.inputs.feeds, weights))
        return self._where[0]


_EPSILON = {"f16": 2.0 ** -10, "bf16": 2.0 ** -7}
"""Machine epsilon per float dtype name (others: float32's 2^-23): x * (1 +- eps) rounds to a neighbour of x."""


def conditioning(graph: Graph, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
                 oracle: Sequence[np.ndarray] | None = None, seed: int = 0) -> float:
    """How far the oracle's outputs move when `graph`'s float inputs (masks excepted: `mask_inputs`) and float
    weights move by one unit in the last place of its dtype: max |oracle(x * (1 +- eps)) - oracle(x)| with eps the
    machine epsilon of the graph's widest float input or weight dtype (the oracle rounds x * (1 +- eps) to a
    neighbour of x in that dtype). nan when the moved oracle is not finite."""
    from .battery import mask_inputs

    floats = [n.dtype for n in (*graph.inputs, *graph.params) if n.dtype.is_float]
    u = min((_EPSILON.get(d.value, 2.0 ** -23) for d in floats), default=2.0 ** -23)
    rng = np.random.default_rng(seed)
    masks = {n.attrs["name"] for n in mask_inputs(graph)}

    def nudge(values: Mapping[str, np.ndarray], skip: set[str]) -> dict[str, np.ndarray]:
        out = {}
        for k, v in values.items():
            a = np.asarray(v)
            if a.dtype.kind == "f" and k not in skip:
                a = a.astype(np.float64) * (1.0 + u * rng.choice((-1.0, 1.0), size=a.shape))
            out[k] = a
        return out

    with np.errstate(all="ignore"):
        base = list(oracle) if oracle is not None else run_oracle(graph, feeds, weights)
        moved = run_oracle(graph, nudge(feeds, masks), nudge(weights, set()))
    return max_abs(moved, base)


def baselines(unfused: Graph, sets: Battery | Sequence[InputSet], weights: Mapping[str, np.ndarray],
              run: Runner) -> list[Baseline]:
    """Run the oracle and the unfused graph (on `run`) once per input set; for a quantized graph (`judge_of`), the
    unfused graph alone, its outputs the reference too (module doc)."""
    items = sets.sets if isinstance(sets, Battery) else sets
    who = judge_of(unfused)
    out = []
    with np.errstate(all="ignore"):
        for s in items:
            base = run(unfused, s.feeds, weights)
            ref = run_oracle(unfused, s.feeds, weights) if who.oracle else base
            out.append(Baseline(s, ref, base, unfused, who))
    return out


def check_version(version: Graph, bases: Sequence[Baseline], weights: Mapping[str, np.ndarray],
                  policy: PrecisionPolicy, run: Runner) -> Verdict:
    """Run `version` on every input set of `bases` and judge it (see the module table)."""
    v = Verdict()
    with np.errstate(all="ignore"):
        for b in bases:
            got = run(version, b.inputs.feeds, weights)
            c = judge(got, b.oracle, b.unfused, policy, b.inputs.name, by_oracle=b.judge.oracle)
            if b.judge.oracle and (c.status == "fusion" or (c.status == "precision" and c.changed)):
                c = judge(got, b.oracle, b.unfused, policy, b.inputs.name, b.conditioning(weights))  # conditioning
            if c.status == "fusion" and b.graph is not None and (flip := quantization_flip(
                    version, b.graph, b.inputs.feeds, weights, policy.same_backend, run)):
                c = replace(c, status="precision", flip=flip)  # a quantization step moved by rounding
            if c.status in ("overflow", "precision"):
                where = b.overflow_at(weights)
                if where is not None:  # finite output, but an intermediate overflowed (e.g. rsqrt(inf) = 0)
                    c = replace(c, status="overflow", where=where)
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
        if bad is not None and bad.status == "fusion":
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
           "check_versions", "close", "conditioning", "finite", "first_nonfinite", "judge", "max_abs", "mlx_runner"]
