"""Timing every graph version of a run on MLX, each with a verdict from the input battery.

One function (`time_versions`) for every front end: versions a pass left unchanged are listed with
`same_as` and not re-timed; every other version is timed in interleaved rounds and runs, in the
graph's dtype, on every input set (`input_sets`: the user's arrays and/or the battery), compared with
the float64 oracle and with the unfused graph on the same device and dtype (`runtime.compare`), with
tolerances from `runtime.precision.TABLE`; a quantized graph's versions with version 0 in its dtype alone, the
float64 oracle not applying there (`runtime.precision.judge_of`, named in the policy's line). NaN never counts
as correct. Results are cached by the trace's content key, the inputs' digest and the run settings.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..ir import Graph
from ..passes import Trace
from .cache import LRUCache
from .defaults import MIN_VERDICT_ROUNDS
from .timing_words import KERNELS_LOWERING, MLX_LOWERING, lowering_change, over_limit, over_limit_ms, unchanged_text

TIMINGS = LRUCache(maxsize=64)
"""A run's (InterleavedTimings, Verdict per timed version) by (trace key, arrays digest, input sets, warmup,
repeat, device, precision policy), shared by sessions."""

Progress = Callable[[int, int, str], None]
"""`progress(done, total, label)`: called before each version is timed."""


@dataclass
class VersionTiming:
    """One row of the per-version timing table.

    Attributes:
        index / label: position in `trace.versions()` and its label (`input`, `after fuse_sdpa`, ...).
        nodes: ops (compute nodes) in the version.
        median_ms / min_ms / iqr_ms / first_call_ms: MLX timing (ms) over interleaved rounds
            (`runtime.timing.time_versions_interleaved`), None when `same_as` is set.
        speedup: the input version's median / this version's median (interleaved medians).
        context: where it ran (`runtime.timing.TimingContext`: device, precision policy, BLAS).
        max_abs: max |MLX output - oracle (the unfused graph in float64)| over all outputs and every input
            set (nan when either side holds NaN or infinities); for a quantized graph, against version 0 on MLX in
            its dtype (`runtime.precision.judge_of`).
        err_unfused: max |MLX output - the unfused graph on the same device in the same dtype|.
        ok: `ok` on every input set (`runtime.compare.Verdict`); NaN never counts as correct.
        status / note / broke_on: the verdict: `ok`, `fusion`, `overflow`, `precision` or `nonfinite`, one
            line saying why, and the input set that broke the version (None when ok).
        policy: the precision policy it was judged by (`runtime.precision.PrecisionPolicy`).
        finite: both errors are finite (no NaN or infinity on either side).
        same_as: index of an earlier identical version (the pass changed nothing; not re-timed).
    """

    index: int
    label: str
    nodes: int
    median_ms: float | None = None
    min_ms: float | None = None
    first_call_ms: float | None = None
    max_abs: float | None = None
    ok: bool | None = None
    same_as: int | None = None
    finite: bool = True
    iqr_ms: float | None = None
    speedup: float | None = None
    context: Any = None
    err_unfused: float | None = None
    status: str | None = None
    note: str = ""
    broke_on: str | None = None
    policy: Any = None
    samples_ms: tuple[float, ...] = ()

    def quartiles(self) -> tuple[float, float]:
        """(p25, p75) of the timed rounds (ms); `(median, median)` when no samples were kept."""
        if not self.samples_ms:
            return (self.median_ms or 0.0, self.median_ms or 0.0)
        q1, q3 = np.percentile(np.asarray(self.samples_ms), [25, 75])
        return float(q1), float(q3)

    @property
    def verdict(self) -> str:
        """`unchanged`, `ok`, or why not (e.g. `fusion changed the numbers on fully_masked_row (...)`)."""
        if self.same_as is not None:
            return "unchanged"
        return "ok" if self.ok else self.note.removeprefix("NO: ")


def all_finite(arrays: Iterable[np.ndarray]) -> bool:
    """True when every float array holds only finite values (integer arrays always do)."""
    return all(np.isfinite(a).all() for a in map(np.asarray, arrays) if a.dtype.kind in "fc")


def nonfinite_arrays(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """Names of the float arrays holding NaN or infinities (e.g. a checkpoint's corrupted weights); of weights left
    in their file (`models.onnx.weights.LazyWeights`), only those read so far (none is read here)."""
    from ..models.onnx.weights import in_memory

    return [k for k, a in in_memory(arrays).items() if np.asarray(a).dtype.kind in "fc" and not np.isfinite(a).all()]


def arrays_digest(*groups: Mapping[str, np.ndarray]) -> str:
    """A content hash of named arrays (names, dtypes, shapes and bytes), for cache keys; a weight left in its file
    (`models.onnx.weights.LazyWeights.source`) is hashed by its file, place and the file's size and mtime, so 4 GB
    of an 8B slice's weights are not read to name them."""
    from ..models.onnx.weights import LazyWeights

    h = hashlib.sha256()
    for arrays in groups:
        for k in sorted(arrays):
            src = arrays.source(k) if isinstance(arrays, LazyWeights) else None
            if src is not None:  # a weight in its file: named by where it is and the file's size and mtime, unread
                st = src.file.stat()
                h.update(f"{k}:file:{src.file}:{st.st_size}:{st.st_mtime_ns}:{src.offset}:{src.length}:"
                         f"{src.data_type}:{src.stored}:{src.perm};".encode())
                continue
            a = np.ascontiguousarray(arrays[k])
            h.update(f"{k}:{a.dtype}:{a.shape};".encode())
            h.update(a.reshape(-1).view(np.uint8) if a.size else b"")  # its bytes, not a copy (an 8B embedding: 2 GB)
    return h.hexdigest()[:24]


OWN_LOWERING_LABEL = "final, MLX's own lowering"
"""The label of the row `time_versions_and_own` times beside the versions: the final version with rlxviz's CPU kernels
off (`LoweringOptions(kernels=False)`)."""


def own_lowering_executor() -> Any:
    """The executor of the own-lowering row: the CPU with rlxviz's kernels off (MLX's composed lowering of every
    fused op). Raises what `MlxExecutor` raises."""
    from ..runtime.executor import MlxExecutor
    from ..runtime.lowering import LoweringOptions

    return MlxExecutor(LoweringOptions(kernels=False), device="cpu")


def time_versions(trace: Trace, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
                  warmup: int = 1, repeat: int = 5, progress: Progress | None = None,
                  device: str | None = None, inputs: Any = None, policy: Any = None,
                  fresh: bool = False) -> list[VersionTiming]:
    """Time every distinct graph version of a run on MLX and check it on a battery of inputs (see
    `time_versions_and_own`, whose rows these are, with no extra row)."""
    return time_versions_and_own(trace, feeds, weights, warmup, repeat, progress, device, inputs, policy, fresh)[0]


def time_versions_and_own(trace: Trace, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
                          warmup: int = 1, repeat: int = 5, progress: Progress | None = None,
                          device: str | None = None, inputs: Any = None, policy: Any = None,
                          fresh: bool = False, own_lowering: bool = False
                          ) -> tuple[list[VersionTiming], VersionTiming | str | None]:
    """Time every distinct graph version of a run on MLX and check it on a battery of inputs; with
    `own_lowering` on the CPU, also the final version on MLX's own lowering in the same paired rounds.

    The versions are timed together in interleaved rounds on one device
    (`runtime.timing.time_versions_interleaved`) on `feeds`, so a busy machine slows them alike;
    `speedup` is the ratio of the interleaved medians. Each is then run, in the graph's dtype, on every
    input set and compared twice (`runtime.compare`): with the oracle (the unfused graph in float64)
    and with the unfused graph on the same device and dtype.

    Args:
        trace: the pipeline run; its input graph is the unfused baseline.
        feeds / weights: graph inputs (timed, and the base of the battery) and params by name.
        warmup: untimed rounds after the first call (0..MAX_WARMUP). repeat: timed rounds (1..MAX_REPEAT).
        progress: told before each version is built and first run.
        device: `cpu`, `gpu` or None (the GPU when MLX has one here).
        inputs: the input sets to check (`runtime.battery.Battery` or a list of `InputSet`); default
            `input_sets(trace.input, feeds)`: the whole battery that applies.
        policy: `runtime.precision.PrecisionPolicy`; default: the graph's dtype on that device
            (`runtime.precision.precision_policy`, TF32 on CUDA included).
        fresh: measure again even when `TIMINGS` holds a run with the same key (a notebook's "rerun this
            cell" must measure anew); the new run replaces the cached one.
        own_lowering: on the CPU, time `trace.final` on MLX's own lowering (`own_lowering_executor`: rlxviz's
            kernels off) in the same interleaved rounds as the versions, so the versions' rows and it are one
            measurement (the Timing tab's "Fusion or kernels?" rows, `lowerings.fusion_and_kernels_of`).

    Returns:
        `(rows, own)`: one `VersionTiming` per version of `trace.versions()`, in order; `own` the final version on
        MLX's own lowering (`index` past the versions, label `OWN_LOWERING_LABEL`, `speedup` the input's median over
        its own), or why it could not be built (a str: the versions' rows stand), or None (not asked, or not on the
        CPU, where every version runs MLX's own lowering already).

    Raises:
        SessionError: `repeat` or `warmup` outside its bound (`defaults.check_rounds`).
        DeviceError: the device is unknown or not available here (a ValueError, one line).
        Whatever the MLX runtime raises for a version it cannot run (NotImplementedError, MemoryError, ...).
    """
    from ..runtime.compare import attribute_changes, baselines, check_version
    from ..runtime.executor import MlxExecutor
    from ..runtime.precision import judge_of, precision_policy
    from ..runtime.timing import time_versions_interleaved
    from .defaults import check_rounds

    check_rounds(repeat, warmup)
    ex = MlxExecutor(device=device)
    sets = input_sets(trace.input, feeds) if inputs is None else inputs
    items = tuple(sets.sets if hasattr(sets, "sets") else sets)
    policy = policy or precision_policy(trace.input, ex.device)
    policy = replace(policy, judge=judge_of(trace.input))  # a policy given for a dtype: the graph's judge all the same
    versions = trace.versions()
    distinct = [i for i in range(len(versions)) if i == 0 or trace.steps[i - 1].changed]
    data = arrays_digest(feeds, weights, *(s.feeds for s in items))
    kernels = ex.emitter.cpu_kernels is not None  # rlxviz's CPU kernels change what runs: part of the key
    own_wanted = own_lowering and ex.device == "cpu"
    key = (trace.key, data, tuple(s.name for s in items), warmup, repeat, ex.device, policy, kernels, own_wanted)
    hit = None if fresh else TIMINGS.get(key)
    if hit is None:
        def told(j: int) -> None:
            if progress is not None:
                progress(distinct[j], len(versions), versions[distinct[j]][0])

        extra, failed = [], ""
        if own_wanted:
            try:  # built once here, so a lowering that cannot run it leaves the versions' timing standing
                own_ex = own_lowering_executor()
                own_ex.bind(trace.final, feeds, weights)
                extra = [(trace.final, own_ex)]
            except Exception as e:  # noqa: BLE001 - said in the row's place
                failed = f"{type(e).__name__}: {e}"
        run = time_versions_interleaved([versions[i][1] for i in distinct], feeds, weights, rounds=repeat,
                                        warmup=warmup, executor=ex, on_version=told, extra=extra)
        runner = ex.run
        bases = baselines(trace.input, items, weights, runner)
        judged = attribute_changes([versions[i][0] for i in distinct],
                                   [check_version(versions[i][1], bases, weights, policy, runner) for i in distinct])
        hit = TIMINGS.put(key, (run, judged, failed))
    run, judged, failed = hit
    rows: list[VersionTiming] = []
    last = 0
    for i, (label, g) in enumerate(versions):
        compute = len(g.compute_nodes())
        if i not in distinct:
            rows.append(VersionTiming(i, label, compute, same_as=last))
            continue
        j = distinct.index(i)
        t, v = run.timings[j], judged[j]
        finite = bool(np.isfinite(v.err_oracle) and np.isfinite(v.err_unfused))
        rows.append(VersionTiming(i, label, compute, t.median_ms, t.min_ms, t.first_call_ms, v.err_oracle, v.ok,
                                  finite=finite, iqr_ms=t.iqr_ms, speedup=run.speedup(j), context=t.context,
                                  err_unfused=v.err_unfused, status=v.status, note=v.note, broke_on=v.broke_on,
                                  policy=policy, samples_ms=tuple(t.samples_ms)))
        last = i
    own: VersionTiming | str | None = failed or None
    if len(run.timings) > len(distinct):  # the final version on MLX's own lowering, timed in the same rounds
        t = run.timings[len(distinct)]
        own = VersionTiming(len(versions), OWN_LOWERING_LABEL, len(trace.final.compute_nodes()), t.median_ms, t.min_ms,
                            t.first_call_ms, iqr_ms=t.iqr_ms, speedup=run.timings[0].median_ms / t.median_ms,
                            context=t.context, policy=policy, samples_ms=tuple(t.samples_ms))
    return rows, own


def input_sets(graph: Graph, feeds: Mapping[str, np.ndarray], user: Any = None, battery: bool = True,
               base: tuple[str, str] | None = None) -> Any:
    """The input sets a check runs: the user's arrays first (an `InputSet`, see `runtime.battery.load_inputs`),
    then the battery derived from `feeds` (`runtime.battery.battery`; only `random` with `battery=False`). `base`:
    the name and line of `feeds` itself where it is not random (`inputs.feeds_kind`: `text` for the tokenized text
    box), the first set's name and line instead of `random`'s (it was listed "random" while it held input_ids 101,
    1054, ...)."""
    from ..runtime.battery import Battery, InputSet
    from ..runtime.battery import battery as make

    sets = make(graph, feeds) if battery else make(graph, feeds, kinds=("random",))
    if base is not None and user is None:
        sets = Battery(tuple(InputSet(*base, s.feeds, s.expected) if s.name == "random" else s for s in sets.sets),
                       sets.skipped)
    if user is None:
        return sets
    rest = tuple(s for s in sets.sets if s.name != "random") if battery else ()
    return Battery((user, *rest), sets.skipped if battery else ())


PRACTICAL = 0.01
"""An interval inside 1 +- this is read as within noise too: a difference under 1% is below what a timing on a
shared machine can be trusted to (it would read "1.00x slower")."""

BUSY_RATIO = 2.0
"""A version whose median is more than this many times its minimum was timed on a busy machine."""

NOISY_IQR = 0.5
"""A version whose IQR (ms) is more than this fraction of its median was timed on a busy machine too: a run can keep
its median within `BUSY_RATIO` x its minimum while half its rounds spread wider than the median itself (a newcomer's
bert-tiny input row: median 1.13 ms, IQR 1.33 ms, judged quiet, and the app and CLI read opposite verdicts from it).
IQR / median is the quartile dispersion a robust benchmark reads (pyperf warns past a standard deviation of 10% of
the mean; for a normal spread IQR = 1.35 sd, so 0.5 is a coefficient of variation near 37%: far past any ratio)."""

WIDE_CI = 1.5
"""A paired ratio whose 95% interval spans more than this factor (`high / low`) is read `within noise` even when the
interval excludes 1: a "1.07x faster" over an interval 0.6..1.9 says more than the rounds do."""


def quiet_rule(times: str = "x") -> str:
    """The machine check in words, as the CLI and the app print it on a usable run: `every median within 2x its
    minimum and every IQR within 0.5x its median` (`times`: "x" for text, "×" for the app's Markdown)."""
    return f"every median within {BUSY_RATIO:g}{times} its minimum and every IQR within {NOISY_IQR:g}{times} its median"

NOT_READ = "busy: not read"
"""What a comparison reads on a run `busy_warning` flags (`timing_table`): no "faster" or "slower" from it."""

DISAGREE = "not read: the paired ratio and the medians disagree (the rounds vary; read neither)"
"""What a comparison reads when the median per-round ratio and the ratio of the two medians disagree
(`medians_disagree`): a table showing both medians would contradict a "faster" drawn from the ratios (issue 39:
"final, rlxviz's CPU kernels" rose from 1.27 to 1.63 ms under "kernels: 1.21x"; llama-block: medians 0.50 and 0.49 ms
under "kernels: 0.87x"), so neither is read."""


def medians_disagree(ratio: float, low: float, high: float, of_medians: float) -> bool:
    """The paired ratio (`ratio`, the median per-round ratio, with its 95% interval `low..high`) and the ratio of the
    two medians (`of_medians`) tell different stories:

    * they point opposite ways, each at least `PRACTICAL` from 1 (minilm: medians 134.70 -> 295.59 ms, "1.19x"); or
    * the medians' ratio lies outside the interval by more than `PRACTICAL` (relative), and either reads another
      direction than the interval does (the interval excludes 1 and the medians are within `PRACTICAL` of equal, or
      the other way round: llama-block's 0.50 and 0.49 ms under "0.87x") or is further from the paired ratio (on a
      log scale) than the interval is wide and than 2 x `PRACTICAL` (a 2% gap beside a 0.4% interval tells no
      story of its own).

    Both ratios are `base / row` (> 1: the row is faster); dimensionless, positive."""
    def way(x: float) -> int:
        return 0 if abs(x - 1) < PRACTICAL else (1 if x > 1 else -1)

    opposite = way(ratio) * way(of_medians) < 0
    outside = of_medians < low / (1 + PRACTICAL) or of_medians > high * (1 + PRACTICAL)
    interval_way = 0 if low <= 1.0 <= high else way(ratio)
    gap = abs(float(np.log(of_medians / ratio)))
    far = gap > max(float(np.log(high / low)), 2 * PRACTICAL)
    return bool(opposite or (outside and (way(of_medians) != interval_way or far)))


@dataclass(frozen=True)
class PairedVerdict:
    """One version against another, read from paired rounds (round r of both ran back to back).

    Attributes:
        ratio: the median over rounds of `base[r] / row[r]` (> 1: `row` is faster).
        low / high: a 95% bootstrap confidence interval of that median (rounds resampled with replacement,
            2000 resamples, seeded: the same samples give the same interval).
        rounds: paired rounds.
        words: `within noise` (the interval contains 1, lies within 1 +- `PRACTICAL`, or spans more than `WIDE_CI`
            (high / low)), `N.NNx faster` /
            `N.NNx slower`, or `too few rounds` (fewer than `MIN_VERDICT_ROUNDS`).
        warning: why the run is unusable (a busy machine: median above `BUSY_RATIO` x min, or IQR above `NOISY_IQR`
            x median), or "".
    """

    ratio: float
    low: float
    high: float
    rounds: int
    words: str
    warning: str = ""

    def __str__(self) -> str:
        ci = f"median ratio {self.ratio:.3f}, 95% CI {self.low:.3f}..{self.high:.3f}, {self.rounds} paired rounds"
        return f"{self.words} ({ci})" + (f"; {self.warning}" if self.warning else "")


SPLIT_TABLE = "Fusion or kernels?"
"""The title of the table that lists the own-lowering row (`OWN_LOWERING_LABEL`): the app's and `rlxviz time`'s."""


def row_name(row: VersionTiming) -> str:
    """A timed row as the user sees it named: a version by its number and label, as `rlxviz time`'s `#` and
    `version` columns list it and the chart's axis numbers it (`#3 after fuse_sdpa`); the own-lowering row, which is no
    version and has no number anywhere, by its label and the table that lists it (`final, MLX's own lowering (in
    "Fusion or kernels?")`): its index past the versions (`#28`) named a row no view shows."""
    if row.label == OWN_LOWERING_LABEL:
        return f'{row.label} (in "{SPLIT_TABLE}")'
    return f"#{row.index} {row.label}"


def busy_warning(*rows: VersionTiming) -> str:
    """"" or a sentence naming the worst row timed on a busy machine as the user sees it (`row_name`: `#3 after
    fuse_sdpa`; the own-lowering row by its label and its table): first one whose median is more than `BUSY_RATIO`
    times its minimum, else one whose IQR is more than `NOISY_IQR` times its median (`quiet_rule` in words). Rows
    not timed (no median) are passed over."""
    bad = [r for r in rows if r.median_ms and r.min_ms and r.median_ms > BUSY_RATIO * r.min_ms]
    if bad:
        worst = max(bad, key=lambda r: r.median_ms / r.min_ms)
        med, low = over_limit_ms(worst.median_ms, worst.min_ms, BUSY_RATIO)
        return (f"unusable run: median {med} ms is {over_limit(worst.median_ms / worst.min_ms, BUSY_RATIO)} "
                f"the minimum {low} ms on {row_name(worst)} (a busy machine): measure again")
    noisy = [r for r in rows if r.median_ms and r.iqr_ms is not None and r.iqr_ms > NOISY_IQR * r.median_ms]
    if not noisy:
        return ""
    worst = max(noisy, key=lambda r: r.iqr_ms / r.median_ms)
    iqr, med = over_limit_ms(worst.iqr_ms, worst.median_ms, NOISY_IQR)
    return (f"unusable run: IQR {iqr} ms is {over_limit(worst.iqr_ms / worst.median_ms, NOISY_IQR)} the median "
            f"{med} ms on {row_name(worst)} (a busy machine): measure again")


def paired_verdict(base: VersionTiming, row: VersionTiming, resamples: int = 2000, seed: int = 0) -> PairedVerdict:
    """`row` against `base` from their paired rounds: median per-round ratio and its bootstrap interval; its words
    are `DISAGREE` when the ratio of the two medians points the other way or lies outside that interval
    (`medians_disagree`), whatever else the interval says.

    Raises:
        ValueError: either row was not timed, or they hold different numbers of rounds.
    """
    if row.median_ms is None or base.median_ms is None:
        raise ValueError(f"version {row.index if row.median_ms is None else base.index} was not timed")
    a, b = np.asarray(base.samples_ms, float), np.asarray(row.samples_ms, float)
    if len(a) != len(b) or not len(a):
        raise ValueError(f"versions #{base.index} and #{row.index} hold {len(a)} and {len(b)} rounds: "
                         "time them together (interleaved) to pair them")
    r = a / b
    ratio = float(np.median(r))
    of_medians = float(np.median(a) / np.median(b))
    idx = np.random.default_rng(seed).integers(0, len(r), size=(resamples, len(r)))
    low, high = (float(v) for v in np.percentile(np.median(r[idx], axis=1), [2.5, 97.5]))
    if len(r) < MIN_VERDICT_ROUNDS:
        words = f"too few rounds ({len(r)} < {MIN_VERDICT_ROUNDS}) for a verdict"
    elif medians_disagree(ratio, low, high, of_medians):  # before "within noise": its ratio would be printed as read
        words = DISAGREE
    else:
        words = interval_words(ratio, low, high)
    return PairedVerdict(ratio, low, high, len(r), words, busy_warning(base, row))


def interval_words(ratio: float, low: float, high: float) -> str:
    """A ratio (> 1: faster) with its 95% interval `low..high` in words: `within noise` where the interval holds 1,
    lies within 1 +- `PRACTICAL`, spans more than `WIDE_CI` (high / low), or the ratio is within `PRACTICAL` of 1;
    else `N.NNx faster` / `N.NNx slower` (`paired_verdict`'s and the fusion / kernels split's one rule)."""
    if (low <= 1.0 <= high or (1 - PRACTICAL <= low and high <= 1 + PRACTICAL) or abs(ratio - 1) < PRACTICAL
            or not high <= WIDE_CI * low):
        return "within noise"  # under 1%, or an interval too wide to read a factor from (`WIDE_CI`)
    return f"{ratio:.2f}x faster" if ratio > 1 else f"{1 / ratio:.2f}x slower"


def compare_to_input(row: VersionTiming, base: VersionTiming) -> str:
    """Read one timed version against `base` in words (`paired_verdict(base, row).words`).

    `within noise` when the 95% bootstrap interval of the median per-round ratio contains 1, lies within
    1 +- `PRACTICAL` (1%) or spans more than `WIDE_CI` (high / low), or the median ratio itself is within 1%; otherwise
    `N.NNx faster` / `N.NNx slower` (the median per-round ratio); `too few rounds ...` below
    `MIN_VERDICT_ROUNDS`.

    Raises:
        ValueError: either row was not timed (`same_as` set), or the two were not timed together.
    """
    return paired_verdict(base, row).words


def timing_table(rows: Sequence[VersionTiming],
                 visible: Sequence[tuple[int, str]] | None = None,
                 also: Sequence[VersionTiming] = (), kernels: Collection[int] = ()) -> list[dict[str, Any]]:
    """The per-version timing table as rows of plain values, for the app's table and chart (and any front end).

    Every comparison is a paired verdict (`paired_verdict`, the one the notebooks print): `speedup` is the median
    per-round ratio over the input, `ci_low`/`ci_high` its 95% bootstrap interval and `ci` the same as text
    (`0.97..1.04`), `vs_input` / `vs_previous` the verdict's words against the input and against the shown version
    before ("within noise" when the interval holds 1). A version a pass left unchanged (`same_as`) was not timed
    again: its times, error and speed-up are NaN (no copied figures that read as a measurement of its own), its
    comparisons "", and `same_as` names the version it equals (`timing_words.unchanged_text`). On a busy machine
    (`busy_warning` over every timed version, as the notebooks read it) no verdict is given: both read `NOT_READ`, and
    every row's `busy` holds the warning ("" on a usable run). Times in ms: median, min, IQR and its ends
    `p25_ms`/`p75_ms` over the rounds, first call.

    Args:
        rows: `time_versions`' rows, one per version of the trace.
        visible: (index into `rows`, label) of the versions to list, in order (default: every row).
        also: rows timed in the same rounds that are no version (`time_versions_and_own`'s own-lowering row):
            not listed, but part of the one machine check (`busy`).
        kernels: indices of the versions lowered with rlxviz's CPU kernels (`timing_text.kernel_rows`): their
            `lowering` reads `KERNELS_LOWERING`, every other's `MLX_LOWERING`; `lowering_change` says where it
            differs from the listed row above (`timing_words.lowering_change`), "" elsewhere.

    Returns:
        One dict per listed version: `#` (index into `rows`, unique where labels repeat), `version`, `ops`, the
        times, `max_err` (vs the float64 oracle), `speedup`, `ci`, `ci_low`, `ci_high`, `vs_input`,
        `vs_previous`, `verdict`, `busy`, `same_as`, `lowering`, `lowering_change`, `rounds` (the paired rounds
        `vs_input` was read from; the input's row its own timed rounds; 0 where no comparison could be made). A
        comparison that cannot be made (a version not timed) reads "-", its numbers NaN.
    """
    visible = [(r.index, r.label) for r in rows] if visible is None else list(visible)
    timed = [rows[r.same_as] if r.same_as is not None else r for r in rows]
    nan = math.nan  # one object: equal rows compare equal (a NaN equals itself only by identity)
    # one verdict on the machine for the whole run, as the notebooks print it: every timed version, shown or not
    busy = busy_warning(*(r for r in (*rows, *also) if r.same_as is None and r.median_ms is not None))

    def words(v: PairedVerdict | None) -> str:
        return "-" if v is None else (NOT_READ if busy else v.words)

    def verdict(base: VersionTiming, row: VersionTiming) -> PairedVerdict | None:
        try:
            return paired_verdict(base, row)
        except ValueError:
            return None

    out = []
    for n, (i, label) in enumerate(visible):
        r, t = rows[i], timed[i]
        p25, p75 = t.quartiles()
        first = timed[visible[0][0]]
        prev = timed[visible[n - 1][0]] if n else None
        vi = verdict(first, t) if n else None
        vp = verdict(prev, t) if prev is not None else None
        # an interval is shown only where it is read: not on a busy run, not from fewer rounds than a verdict needs
        # (three rounds' bootstrap interval beside "not read" told a reader the opposite of the verdict)
        read = vi is not None and not busy and vi.rounds >= MIN_VERDICT_ROUNDS
        # on a busy run the input's own row reads "not read" too (its "1.0-1.0" was an interval printed on a busy run)
        ci = (vi.low, vi.high) if read else ((1.0, 1.0) if not n and not busy else (nan, nan))
        lowering = KERNELS_LOWERING if i in kernels else MLX_LOWERING
        before = (KERNELS_LOWERING if visible[n - 1][0] in kernels else MLX_LOWERING) if n else lowering
        change = lowering_change(before, lowering)
        if r.same_as is not None:  # not timed again: no figure of its own, only which version it is
            out.append({"#": i, "version": label, "ops": r.nodes, "median_ms": nan, "min_ms": nan, "iqr_ms": nan,
                        "p25_ms": nan, "p75_ms": nan, "first_call_ms": nan, "max_err": nan, "speedup": nan, "ci": "",
                        "ci_low": nan, "ci_high": nan, "vs_input": "", "vs_previous": "", "verdict": r.verdict,
                        "busy": busy, "same_as": r.same_as, "lowering": lowering, "lowering_change": change,
                        "rounds": 0})
            continue
        out.append({"#": i, "version": label, "ops": r.nodes, "median_ms": round(t.median_ms or nan, 3),
                    "min_ms": round(t.min_ms or nan, 3), "iqr_ms": round(t.iqr_ms or 0.0, 3),
                    "p25_ms": round(p25, 3), "p75_ms": round(p75, 3),
                    "first_call_ms": round(t.first_call_ms or nan, 1),
                    "max_err": float(t.max_abs) if t.max_abs is not None else nan,
                    "speedup": 1.0 if not n else (round(vi.ratio, 2) if vi is not None else nan),
                    "ci": (f"{ci[0]:.2f}..{ci[1]:.2f}" if read else "" if not n and not busy else "-"
                           if vi is None and n else "not read"),
                    "ci_low": round(ci[0], 3), "ci_high": round(ci[1], 3),
                    "vs_input": words(vi) if n else "",
                    "vs_previous": words(vp) if prev is not None else "",
                    "verdict": r.verdict, "busy": busy, "same_as": None, "lowering": lowering,
                    "lowering_change": change,
                    "rounds": vi.rounds if vi is not None else 0 if n else len(t.samples_ms)})
    return out


DISAGREE_CELL = "not read: medians disagree"
"""The speed-up cell (`speedup_text`) of a comparison whose words are `DISAGREE`: no number, its reason short."""


def speedup_text(row: Mapping[str, Any]) -> str:
    """The speed-up over the input as every front end prints it, from one `timing_table` row: `rlxviz time`'s `x
    input` column (`format_timings`), the app's speed-up column, and whether the app draws a speed-up bar
    (`speedup_shown`). The input's own row: its `1.00`; a comparison that could not be made: `-`; a busy run
    (`row["busy"]`): `NOT_READ` on every row, the input's own included, no number (a number beside a busy verdict
    was read as one; the input's `1.00` under a caption saying no speed-up is printed was a speed-up printed); a
    ratio that the medians contradict (`DISAGREE`): `DISAGREE_CELL`, no number; a version a pass left unchanged
    (`row["same_as"]`): `unchanged_text`, no figure copied from the version it equals; else the paired median ratio,
    `N.NN`."""
    if row.get("same_as") is not None:  # not timed again: no ratio of its own, busy or not
        return unchanged_text(row["same_as"])
    words = row.get("vs_input")
    speed = row.get("speedup", float("nan"))
    if row.get("busy") and not words:  # the input's own 1.00 beside the other rows' "not read" read as a ratio
        return NOT_READ
    if not words:  # the first row shown: the input against itself
        return f"{speed:.2f}"
    if words == "-" or speed != speed:
        return "-"
    if row.get("busy"):
        return NOT_READ
    if words == DISAGREE:
        return DISAGREE_CELL
    return f"{speed:.2f}"


def speedup_shown(row: Mapping[str, Any]) -> bool:
    """Whether a row's speed-up is a number at all (`speedup_text` prints one): the app draws its bar only then."""
    try:
        float(speedup_text(row))
    except ValueError:
        return False
    return True


def compare_versions(rows: Sequence[VersionTiming]) -> list[tuple[VersionTiming, VersionTiming, PairedVerdict]]:
    """Each timed version against the previous timed one: `(previous, row, verdict)` in order."""
    timed = [r for r in rows if r.same_as is None]
    return [(p, r, paired_verdict(p, r)) for p, r in zip(timed[:-1], timed[1:], strict=True)]


__all__ = ["BUSY_RATIO", "DISAGREE", "DISAGREE_CELL", "SPLIT_TABLE", "medians_disagree", "row_name", "speedup_shown",
           "speedup_text", "MIN_VERDICT_ROUNDS", "NOISY_IQR", "NOT_READ", "OWN_LOWERING_LABEL",
           "PRACTICAL",
           "TIMINGS", "WIDE_CI",
           "PairedVerdict",
           "Progress",
           "VersionTiming",
           "all_finite",
           "arrays_digest", "busy_warning", "compare_to_input", "compare_versions", "input_sets", "interval_words",
           "paired_verdict", "quiet_rule",
           "nonfinite_arrays", "own_lowering_executor", "time_versions", "time_versions_and_own", "timing_table"]
