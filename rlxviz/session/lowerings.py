"""One graph version under several MLX lowerings, timed in paired rounds (is a lowering choice worth it?).

`session.time_versions` compares graph versions under one lowering; this compares **lowerings** of one
graph (e.g. the CPU's default against `mx.compile` of each FusedTransformerLayer, or of the whole graph),
with the same statistics: interleaved rounds kept in order, so `session.paired_verdict` /
`compare_versions` read them (median per-round ratio, bootstrap interval, "within noise").
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import numpy as np

from ..ir import Graph
from ..ir.ops import Op
from .program import ProgramPrimitives
from .timing import DISAGREE, PairedVerdict, VersionTiming


@dataclass(frozen=True)
class Lowering:
    """One way to run a graph on MLX: lowering options and whether the whole graph is `mx.compile`d.

    Attributes:
        label: the row's name in a timing table.
        options: `runtime.lowering.LoweringOptions` (None: the device's choice).
        compile_graph: wrap the whole graph in `mx.compile` (`runtime.executor.MlxExecutor`).
        graph: the version this row runs (None: the graph `time_lowerings` is given); another version of the same
            model (same inputs and outputs) pairs a version with a lowering in one run (`fusion_and_kernels`).
    """

    label: str
    options: Any = None
    compile_graph: bool = False
    graph: Graph | None = None


def time_lowerings(graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None,
                   lowerings: Sequence[Lowering], warmup: int = 1, repeat: int = 21,
                   device: str = "cpu", programs: bool = True) -> tuple[list[VersionTiming], list[ProgramPrimitives]]:
    """Time `graph` under each lowering in interleaved rounds (round k calls every lowering once, the
    starting one rotating) and read each lowering's MLX program.

    Args:
        graph: one graph version. feeds / weights: its inputs and params (NumPy or MLX arrays) by name.
        lowerings: at least one; the first is the baseline of `err_unfused` and `speedup`.
        warmup: untimed rounds (0..MAX_WARMUP). repeat: timed rounds (1..MAX_REPEAT; a verdict needs 21).
        device: `cpu` or `gpu`.
        programs: read each lowering's MLX program (`ProgramPrimitives`); False: an empty list (faster).

    Returns:
        `(rows, programs)`: one `VersionTiming` per lowering (`index` its position, `nodes` its graph's ops,
        `err_unfused` the largest |output - the first lowering's output|, `samples_ms` in round order) and its
        `ProgramPrimitives` (MLX's primitives of one call; `bytes` not read).

    Raises:
        SessionError: `repeat` or `warmup` outside its bound; ValueError: no lowerings.
        DeviceError: unknown device or no GPU here. KeyError / ValueError: as `MlxExecutor.bind`.
    """
    from ..kernels.mlx_backend import mx
    from ..runtime.executor import MlxExecutor
    from ..runtime.timing import summarize, timing_context
    from .defaults import check_rounds
    from .program import mlx_primitives

    check_rounds(repeat, warmup)
    if not lowerings:
        raise ValueError("[time_lowerings] give at least one lowering")
    built = []
    for lw in lowerings:
        ex = MlxExecutor(lw.options, lw.compile_graph, device)
        prog, args = ex.bind(lw.graph or graph, feeds, weights)
        mx.eval(args)
        t = time.perf_counter()
        outs = prog.fn(*args)
        mx.eval(outs)
        built.append((ex, prog, args, time.perf_counter() - t, [np.array(o.astype(mx.float32)) for o in outs]))
    for _ in range(warmup):
        for _ex, prog, args, *_ in built:
            mx.eval(prog.fn(*args))
    samples: list[list[float]] = [[] for _ in built]
    n = len(built)
    for k in range(repeat):
        for j in range(n):
            i = (j + k) % n
            _ex, prog, args, *_ = built[i]
            t = time.perf_counter()
            mx.eval(prog.fn(*args))
            samples[i].append(time.perf_counter() - t)
    base_out = built[0][4]
    rows, read = [], []
    base_median = None
    for i, (lw, (ex, _prog, _args, first, outs), s) in enumerate(zip(lowerings, built, samples, strict=True)):
        g = lw.graph or graph
        t = summarize(s, first, timing_context(ex))
        base_median = base_median or t.median_ms
        err = max((float(np.abs(a - b).max()) for a, b in zip(outs, base_out, strict=True)), default=0.0)
        rows.append(VersionTiming(i, lw.label, len(g.compute_nodes()), t.median_ms, t.min_ms, t.first_call_ms,
                                  iqr_ms=t.iqr_ms, speedup=base_median / t.median_ms, context=t.context,
                                  err_unfused=err, samples_ms=t.samples_ms))
        if programs:
            read.append(mlx_primitives(g, feeds, weights, executor=ex, bytes=False))
    return rows, read


def medians_verdict(base: VersionTiming, row: VersionTiming, resamples: int = 2000, seed: int = 0) -> PairedVerdict:
    """`row` against `base` as the ratio of their medians (`base`'s median ms / `row`'s), the statistic of the fusion /
    kernels split: ratios of the same three medians multiply exactly (input / final = input / own x own / final),
    where medians of per-round ratios do not (a newcomer read "1.17x ... gives 1.01x and ... 0.93x" as a product).

    The 95% interval resamples the paired rounds (the same round of both, `paired_verdict`'s resamples and seed) and
    takes the ratio of the two medians of each resample; the words follow `timing.interval_words` on it. Where
    `paired_verdict` reads no ratio (too few rounds, or `DISAGREE`: the per-round ratios and the medians tell
    different stories) its words stand, so the split is read where the versions' table reads its ratio and nowhere
    else. Dimensionless; > 1: `row` is faster.

    Raises:
        ValueError: as `paired_verdict` (a row not timed, or rows of different numbers of rounds).
    """
    from .timing import MIN_VERDICT_ROUNDS, interval_words, paired_verdict

    paired = paired_verdict(base, row, resamples, seed)
    a, b = np.asarray(base.samples_ms, float), np.asarray(row.samples_ms, float)
    ratio = float(np.median(a) / np.median(b))
    idx = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
    low, high = (float(v) for v in np.percentile(np.median(a[idx], axis=1) / np.median(b[idx], axis=1), [2.5, 97.5]))
    unread = paired.rounds < MIN_VERDICT_ROUNDS or paired.words == DISAGREE
    return PairedVerdict(ratio, low, high, paired.rounds, paired.words if unread else interval_words(ratio, low, high),
                         paired.warning)


def shown_product(a: float, b: float, sign: str = "×", digits: int = 2) -> str:
    """`"a × b = c"` true as printed: `a` and `b` printed to `digits` decimals as every ratio is (`f"{a:.2f}"`, so they
    read as the table's and the sentence's), and `c` the exact product of those printed factors (not of the unrounded
    ratios) rounded to `digits` decimals, half up: "1.03 × 3.40 = 3.50" where the ratios' own product printed 3.52.

    Args:
        a, b: the factors (ratios, dimensionless); finite.
        sign: the multiplication sign printed (`x` in text, `×` in Markdown).
        digits: decimals printed for each number.
    """
    x, y = (Decimal(f"{float(v):.{digits}f}") for v in (a, b))
    return f"{x} {sign} {y} = {(x * y).quantize(Decimal(1).scaleb(-digits), ROUND_HALF_UP)}"


def step_cell(what: str, v: PairedVerdict, busy: str, times: str = "x", dash: str = "-") -> str:
    """One step's speed-up cell in the "Fusion or kernels?" table (`rlxviz time`'s `split_text` and the app's
    `fusion_kernels_markdown`, one function): `fusion: 1.19x (1.10-1.25)` (`medians_verdict`: the ratio of the two
    rows' medians), the interval only where it is read (at least `MIN_VERDICT_ROUNDS` rounds, `timing_table`'s
    rule); on a busy run (`busy`) `fusion: no ratio (busy)` and where the medians contradict the per-round ratios
    (`DISAGREE`) `fusion: no ratio (medians disagree)`, no number in either (minilm busy printed "fusion: 1.19x"
    from an input of 134.70 ms to 295.59 ms). `times` / `dash`: the signs printed (`x` and `-` in text, `×` and `–`
    in Markdown)."""
    from .timing import MIN_VERDICT_ROUNDS

    if busy:
        return f"{what}: no ratio (busy)"
    if v.words == DISAGREE:
        return f"{what}: no ratio (medians disagree)"
    ci = f" ({v.low:.2f}{dash}{v.high:.2f})" if v.rounds >= MIN_VERDICT_ROUNDS else ""
    return f"{what}: {v.ratio:.2f}{times}{ci}"


SPLIT_HEAD = "speed-up over the row above (ratio of medians, 95% ci)"
"""The heading of the split table's speed-up column (`rlxviz time` and the Timing tab): each cell is
`medians_verdict` of its row against the row above."""


@dataclass(frozen=True)
class FusionAndKernels:
    """Which part of a speed-up is the fusion and which rlxviz's CPU kernels: three rows timed in one paired run.

    Every ratio is `medians_verdict`'s ratio of two of the rows' medians, so `fusion.ratio * kernels.ratio ==
    total.ratio` (up to float rounding): a factor-by-factor split of the total, each checkable from the medians.

    Attributes:
        rows: `VersionTiming` of (0) the input graph on MLX's own lowering, (1) the final version on MLX's own
            lowering (`LoweringOptions(kernels=False)`), (2) the final version on the device's default lowering
            (on the CPU: rlxviz's own kernels for the fused ops, as `rlxviz time` runs it).
        fusion: row 1 against row 0 (`medians_verdict`): what the rewrites buy on MLX's own lowering.
        kernels: row 2 against row 1: what rlxviz's kernels buy on the same fused graph.
        total: row 2 against row 0: both (fusion x kernels).
        warning: `busy_warning` over the rows measured together ("" on a usable run): the verdicts are not to be
            read. For a split of the versions' own run (`shared`), the one machine check of that whole run.
        kernels_note: which of rlxviz's kernels ran (`runtime.timing.kernels_line`), or why none did.
        shared: rows 0 and 2 are the versions' own measurements (the input and the final version as the timing
            chart shows them), row 1 was timed in the same paired rounds (`fusion_and_kernels_of`); False: the three
            rows are a run of their own (`fusion_and_kernels`).
        input_kernel_ops: with `shared`, the ops of the input graph that rlxviz's kernels ran (a model built with an
            attention op, as bert-tiny is): row 0 is then not MLX's own lowering throughout, and the fusion's ratio
            holds those kernels' share too (`label` says so).
        paired_total: with `shared`, the final version's speed-up over the input as the versions' table prints it
            (`paired_verdict`'s median of the per-round ratios, `timing_table`'s `speedup`); the sentence says why
            it differs from `total` where it does. None: no such table (`fusion_and_kernels`).
    """

    rows: list[VersionTiming]
    fusion: Any
    kernels: Any
    total: Any
    warning: str
    kernels_note: str
    shared: bool = False
    input_kernel_ops: tuple[str, ...] = ()
    paired_total: float | None = None

    def sentence(self, times: str = "x", table: str = "The x input column above") -> str:
        """The final version's speed-up split into the fusion's and the kernels': `time`'s line and the Timing tab's
        first sentence (`times`: the sign printed after a ratio and between factors). The two factors and the total
        are ratios of the table's medians, and the sentence shows their product as printed (`shown_product`; where
        rounding the factors moves it, the total from the unrounded ratios beside it). Where the versions' table
        prints another speed-up for the final version (`paired_total`, its median per-round ratio), the sentence
        names it (`table`: that column as the front end calls it) and says why the two differ. On a busy run, or
        where medians and paired rounds disagree (`timing.DISAGREE`), no ratio at all, only why it is not split (a
        number beside "not read" was read as a verdict)."""
        from .timing import DISAGREE

        f, k, t = self.fusion, self.kernels, self.total
        if self.warning:
            return ("The final version's speed-up is not split into the fusion's and the kernels' (not read: a busy "
                    "machine).")
        if DISAGREE in (f.words, k.words, t.words):
            return ("The final version's speed-up is not split into the fusion's and the kernels': the paired ratio "
                    "and the medians disagree, the rounds vary; read neither (not read: medians and paired rounds "
                    "disagree).")
        unread = {v.words for v in (t, f, k) if not v.words.endswith(("x faster", "x slower"))}
        once = len(unread) == 1 and all(not v.words.endswith(("x faster", "x slower")) for v in (t, f, k))

        def said(v: Any) -> str:  # a ratio its verdict does not read as a speed-up says so beside it (or once, below)
            read = once or v.words.endswith(("x faster", "x slower"))
            return f"{v.ratio:.2f}{times}" + ("" if read else f" ({v.words})")

        product = shown_product(f.ratio, k.ratio, times)
        if not product.endswith(f"= {t.ratio:.2f}"):  # the printed factors' product rounds elsewhere
            product += f" ({t.ratio:.2f} from the unrounded ratios)"
        text = (f"Of the final version's {said(t)} over the input, the fusion on MLX's own lowering gives {said(f)} "
                f"and rlxviz's kernels on the same fused graph {said(k)}: {product}, as all three are ratios of this "
                "table's medians (input / own lowering, own lowering / final, input / final)"
                + (f"; none of the three is a verdict: {t.words}." if once else "."))
        if self.paired_total is not None and f"{self.paired_total:.2f}" != f"{t.ratio:.2f}":
            text += (f" {table} reads {self.paired_total:.2f}{times} for the final version: the median of its "
                     f"{t.rounds} per-round ratios, another statistic, which need not equal the ratio of the medians "
                     "(medians of ratios do not multiply).")
        return text

    def read(self) -> bool:
        """The split's ratios are read: not a busy run, and no step's medians contradict its ratio."""
        from .timing import DISAGREE

        return not self.warning and DISAGREE not in (self.fusion.words, self.kernels.words, self.total.words)

    def label(self, i: int) -> str:
        """Row `i`'s label; the input's names the ops of it that ran on rlxviz's kernels (`input_kernel_ops`)."""
        r = self.rows[i]
        if i == 0 and self.input_kernel_ops:
            return f"{r.label} except {', '.join(self.input_kernel_ops)} (on rlxviz's kernels)"
        return r.label


KERNEL_OPS = frozenset({Op.FUSED_MATMUL_BIAS_ACT, Op.FUSED_RESIDUAL_LN, Op.FUSED_RESIDUAL_RMS_NORM,
                        Op.FUSED_ATTENTION_BLOCK, Op.FUSED_TRANSFORMER_LAYER, Op.ATTENTION})
"""Ops whose MLX lowering may hand them to rlxviz's own CPU kernels (`runtime.kernel_routing`: the dense layer with
its activation, the residual norms, attention, and the blocks made of them; `ir.fused`'s decompositions)."""


FUSION_LABELS = ("input, MLX's own lowering", "final, MLX's own lowering", "final, rlxviz's CPU kernels (default)")
"""The three rows of `fusion_and_kernels`, in order."""


def fusion_and_kernels(input_graph: Graph, final: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None,
                       warmup: int = 1, repeat: int = 21) -> FusionAndKernels:
    """Tell the fusion's speed-up from the kernels': the input and the final version on MLX's own lowering, and the
    final version on rlxviz's CPU kernels, timed together on the CPU in paired rounds (`time_lowerings`), as
    `benchmarks/bench_runtime.py --table` sets the final version without the kernels beside it.

    Args:
        input_graph / final: the unfused graph and the pipeline's final version (same inputs and outputs).
        feeds / weights: inputs and params by name (NumPy or MLX arrays).
        warmup / repeat: untimed and timed rounds (a verdict needs `MIN_VERDICT_ROUNDS`).

    Returns:
        `FusionAndKernels` (rows, three `medians_verdict`s, the busy warning, which kernels ran).

    Raises:
        SessionError: rounds outside their bounds. KeyError / ValueError: as `MlxExecutor.bind`.
    """
    from ..runtime.lowering import LoweringOptions
    from .timing import busy_warning

    own = LoweringOptions(kernels=False)
    rows, _ = time_lowerings(final, feeds, weights, [Lowering(FUSION_LABELS[0], own, graph=input_graph),
                                                     Lowering(FUSION_LABELS[1], own),
                                                     Lowering(FUSION_LABELS[2])],
                             warmup=warmup, repeat=repeat, device="cpu", programs=False)
    note = rows[2].context.kernels if rows[2].context is not None else ""
    return FusionAndKernels(rows, medians_verdict(rows[0], rows[1]), medians_verdict(rows[1], rows[2]),
                            medians_verdict(rows[0], rows[2]), busy_warning(*rows), note)


def fusion_and_kernels_of(rows: Sequence[VersionTiming], own: VersionTiming,
                          input_graph: Graph | None = None) -> FusionAndKernels:
    """The fusion / kernels split of one timing run, with no measurement of its own: the input's and the final
    version's rows are the versions' rows (`time_versions_and_own`, the numbers the timing chart draws), the middle
    row the final version on MLX's own lowering timed in the same paired rounds (`own`). The input row is the
    input's default lowering: MLX's own, unless `input_graph` holds an op rlxviz's kernels take (`KERNEL_OPS`; a
    model built with an attention op, as bert-tiny is) and the row's timing says they ran: those ops are
    `input_kernel_ops`, and the fusion's ratio holds their share too. The warning is the whole run's machine check
    (every timed version and `own`), as the chart's (`timing_table(rows, also=[own])`).

    Raises:
        ValueError: the input or the final version was not timed, or `own` holds another number of rounds.
    """
    from dataclasses import replace

    from .timing import busy_warning, paired_verdict

    timed = [rows[r.same_as] if r.same_as is not None else r for r in rows]
    first, last = timed[0], timed[-1]
    three = [replace(first, label=FUSION_LABELS[0]), replace(own, label=FUSION_LABELS[1]),
             replace(last, label=FUSION_LABELS[2])]
    note = last.context.kernels if last.context is not None else ""
    run = [r for r in rows if r.same_as is None and r.median_ms is not None]
    ran = first.context is not None and ", ran " in first.context.kernels  # `runtime.timing.kernels_line`
    ops = tuple(sorted({n.op.value for n in input_graph.compute_nodes() if n.op in KERNEL_OPS})) \
        if ran and input_graph is not None else ()
    return FusionAndKernels(three, medians_verdict(three[0], three[1]), medians_verdict(three[1], three[2]),
                            medians_verdict(three[0], three[2]), busy_warning(*run, own), note, shared=True,
                            input_kernel_ops=ops, paired_total=paired_verdict(three[0], three[2]).ratio)


__all__ = ["FUSION_LABELS", "KERNEL_OPS", "SPLIT_HEAD", "FusionAndKernels", "Lowering", "fusion_and_kernels",
           "fusion_and_kernels_of", "medians_verdict", "shown_product", "step_cell", "time_lowerings"]
