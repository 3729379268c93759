"""`rlxviz time` (every graph version timed on MLX and checked against the reference) and `rlxviz overlay` (each
node's time share or numeric error)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from .args import _after_arg, _command, _device_arg, _expect_arg, _int_in, _layers_arg, _model_args
from .common import CLIError, SubParsers, subcommand
from .loading import _import_checks, _run_model, _slice_aside, _slice_model
from .output import _out, _warn_nonfinite

BUSY_ADVICE = "No ratio below is read: this run cannot tell the versions apart. Run it again " \
    "when the machine is quieter."
"""What follows the busy-machine warning before the table (the Timing tab's banner, with "run it again" for its
button)."""


def busy_verdict(busy: str) -> str:
    """The run's verdict on the machine, printed before the table: "" on a usable run, else `Busy machine: WARNING.`
    and that no ratio below is a verdict (the Timing tab's banner, `app.timingchart.machine_verdict`)."""
    return f"Busy machine: {busy}. {BUSY_ADVICE}" if busy else ""


def _verdict_json(v: Any, busy: str) -> dict[str, Any]:
    """A `session.PairedVerdict` as plain values; its words `NOT_READ` on a busy run. Where the text and the app print
    no ratio (`session.lowerings.step_cell`: a busy run, or medians that disagree) `ratio`, `ci_low` and `ci_high` are
    None: a script reads no number the other front ends refuse."""
    from ..session.timing import DISAGREE, NOT_READ

    read = not busy and v.words != DISAGREE
    return {"ratio": round(v.ratio, 4) if read else None, "ci_low": round(v.low, 4) if read else None,
            "ci_high": round(v.high, 4) if read else None, "rounds": v.rounds,
            "verdict": NOT_READ if busy else v.words}


def split_json(split: Any) -> dict[str, Any] | None:
    """`session.FusionAndKernels` as plain values for `time --json` (`split`): its three rows (`run`, `ops`, ms),
    the `fusion`, `kernels` and `total` verdicts (ratio: the ratio of two rows' medians, `lowerings.medians_verdict`,
    so fusion x kernels = total; its 95% interval, rounds, verdict: `NOT_READ` on a busy run, where ratio and
    interval are None), `x_input` (the final version's `speedup` in `versions`, the median per-round ratio; None
    where that is None or no table was shared), `busy` (the run's one machine check, "" when usable), `kernels_note`
    and `input_kernel_ops` (the input's ops that ran on rlxviz's kernels: its row is not MLX's own lowering
    throughout); `{"not_measured": why}` when the own-lowering row could not be built; None when not asked
    (`--no-split`) or not on the CPU."""
    if split is None:
        return None
    if isinstance(split, str):
        return {"not_measured": split}
    busy = split.warning
    return {"rows": [{"run": r.label, "ops": r.nodes, "median_ms": round(r.median_ms, 4), "min_ms": round(r.min_ms, 4),
                      "iqr_ms": round(r.iqr_ms or 0.0, 4)} for r in split.rows],
            "fusion": _verdict_json(split.fusion, busy), "kernels": _verdict_json(split.kernels, busy),
            "total": _verdict_json(split.total, busy), "busy": busy, "kernels_note": split.kernels_note,
            "x_input": round(split.paired_total, 4) if split.paired_total is not None and split.read() else None,
            "input_kernel_ops": list(split.input_kernel_ops)}


def split_text(split: Any) -> str:
    """The "Fusion or kernels?" block as aligned text, the rows and words of the Timing tab's table
    (`app.timingchart.fusion_kernels_markdown`): the input and the final version (the table's own rows) and the
    final version on MLX's own lowering timed in the same paired rounds, each step's speed-up over the row above
    (the ratio of the two medians, `lowerings.medians_verdict`) with its 95% interval and its verdict (`NOT_READ` on a
    busy run), and the sentence splitting the final version's speed-up (fusion x kernels = total). A str: why the
    own-lowering row is missing; None: "" (not asked, or not on the CPU)."""
    from ..session.lowerings import SPLIT_HEAD, step_cell
    from ..session.timing import NOT_READ, quiet_rule
    from ..session.timing_words import too_few_rounds

    if split is None:
        return ""
    if isinstance(split, str):
        return f"Fusion or kernels? Not measured: {split}\n"
    busy = split.warning
    few = too_few_rounds([split.fusion.rounds])
    check = (f"busy machine: {busy}. No verdict below." if busy else
             f"{few}: no verdict below is read." if few else f"quiet enough ({quiet_rule()}).")
    lines = ["Fusion or kernels? The final version on MLX's own lowering and on rlxviz's kernels",
             f"The input and final rows are the table's own measurements above (the same medians); the final version "
             f"on MLX's own lowering ran in the same {split.fusion.rounds} paired rounds on the CPU, one machine check "
             f"for all: {check}"]
    labels = [split.label(i) for i in range(len(split.rows))]  # the input's names its kernel ops, if any ran
    w = max(len(lb) for lb in labels)
    head = SPLIT_HEAD
    cells = ["", *(step_cell(what, v, busy) for what, v in (("fusion", split.fusion), ("kernels", split.kernels)))]
    words = ["", *(NOT_READ if busy else v.words for v in (split.fusion, split.kernels))]
    sw = max(len(head), *(len(c) for c in cells))
    lines.append(f"{'run':<{w}}  {'ops':>5}  {'median ms':>9}  {head:<{sw}}  verdict")
    for r, label, cell, word in zip(split.rows, labels, cells, words, strict=True):
        lines.append(f"{label:<{w}}  {r.nodes:>5}  {r.median_ms:>9.2f}  {cell:<{sw}}  {word}".rstrip())
    lines.append(split.sentence())
    if split.kernels_note:
        lines.append(split.kernels_note)
    return "\n".join(lines) + "\n"


def cmd_time(args: argparse.Namespace) -> int:
    """`rlxviz time MODEL`: every graph version timed on MLX, checked against the NumPy reference; on the CPU also
    the final version on MLX's own lowering in the same rounds (the fusion / kernels split, unless `--no-split`).
    A busy run (`session.busy_warning`) is said before the table and reads no ratio; it is not a failure."""
    from ..session import describe_host, format_timings, input_sets, load_inputs, shape_summary, timing_table
    from ..session.lowerings import fusion_and_kernels_of
    from ..session.timing import time_versions_and_own
    from ..session.timing_text import json_speedup, kernel_rows
    from ..session.timing_words import KERNELS_LOWERING, KERNELS_NOTE, lowering_note

    _slice_model(args)
    model, trace = _run_model(args, workload="time")  # refused over the memory limit before feeds are made
    user = load_inputs(args.inputs, model.graph, aside=_slice_aside(args, model)) if args.inputs is not None else None
    feeds = user.feeds if user is not None else model.random_feeds(seed=0)
    checks = _import_checks(model, feeds, user, args.expect, max_memory_mb=args.max_memory_mb)
    sets = input_sets(model.graph, feeds, user, args.battery)  # the user's arrays first, then the battery
    rows, own = time_versions_and_own(trace, feeds, model.weights, warmup=args.warmup, repeat=args.repeat,
                                      device=args.device, inputs=sets, own_lowering=args.split)
    split: Any = own  # None (not asked, or not on the CPU) or why the own-lowering row is missing (a str)
    if own is not None and not isinstance(own, str):
        try:
            split = fusion_and_kernels_of(rows, own, trace.input)
        except ValueError as e:  # the input or the final version not timed: the versions' rows stand
            split = f"{type(e).__name__}: {e}"
    also = [own] if own is not None and not isinstance(own, str) else []
    # the app's table: one machine check over every row timed together, the rows on rlxviz's kernels marked
    table = timing_table(rows, also=also, kernels=kernel_rows(trace, rows))
    busy = table[0]["busy"] if table else ""
    if not all(r.finite for r in rows):
        _warn_nonfinite("time", model, False)
    where = next((str(r.context) for r in rows if r.context is not None), "")
    where = where.replace(str(Path.cwd()) + os.sep, "")  # `.venv/...` from a clone, not an absolute path
    policy = next(r.policy for r in rows if r.policy is not None)
    code = 0 if all(r.ok is not False for r in rows) and all(c.ok for c in checks) else 1  # busy: not a failure
    if args.json:
        import dataclasses
        import json

        _out(json.dumps({"model": model.name, "pipeline": trace.pipeline, "context": where, "repeat": args.repeat,
                         "precision": policy.describe(), "ok_rule": policy.ok_rule(), "inputs": sets.names,
                         "skipped": dict(sets.skipped), "busy": busy,
                         # a speed-up only where the text prints one (None when busy: the medians in ms stay)
                         "versions": [{**dataclasses.asdict(r), "speedup": json_speedup(t), "verdict": r.verdict,
                                       "vs_input": t["vs_input"], "lowering": t["lowering"],
                                       "lowering_change": lowering_note(t)}
                                      for r, t in zip(rows, table, strict=True)],
                         "split": split_json(split),
                         "import_checks": [{**dataclasses.asdict(c), "line": c.line()} for c in checks]},
                        indent=2, default=str))
        return code
    _out(f"{model.name} ({trace.pipeline} pipeline), {shape_summary(model, args.batch, args.seq)}; {where}; "
         f"{args.repeat} interleaved round(s) on {sets.sets[0].name} inputs\n"
         + "".join(f"{c.line()}\n" for c in checks)
         + (f"{host}\n" if (host := describe_host(model.graph)) else "")
         + f"{policy.describe()}\n{policy.ok_rule()}\n{sets.describe()}\n"
         + (f"{busy_verdict(busy)}\n" if busy else "")
         + format_timings(rows, busy, table) + f"\n\n{X_INPUT_NOTE}"
         + (f"\n{KERNELS_NOTE}" if any(t["lowering"] == KERNELS_LOWERING for t in table) else "")
         + ("\n\n" + split_text(split).rstrip("\n") if split is not None else ""))
    return code


X_INPUT_NOTE = ("x input: the median over the rounds of (the input's time / this version's time), paired round by "
                "round, so it need not equal the ratio of the two medians; a ratio whose 95% interval holds 1 is "
                "within noise (the app's Timing tab draws the interval and says the verdict).")
"""The line under `rlxviz time`'s table that says what its `x input` column is (newcomer run 5 read a 1.02 beside a
median 0.51 ms against the input's 0.50 ms as a contradiction)."""


@subcommand
def add_time(sub: SubParsers) -> None:
    from ..session import DEFAULT_REPEAT, DEFAULT_WARMUP, MAX_REPEAT, MAX_WARMUP

    p = _command(sub, "time", cmd_time, "time every graph version on MLX, with its error vs the reference",
                 """Run the pipeline on MODEL, then time each distinct graph version on MLX (median, min, first call in
                 ms) in the graph's own dtype, and check it on a battery of inputs (random, a fully masked row, left
                 padding, holes, a single token, large magnitudes, constant rows: those that apply) twice: against
                 the oracle (the unfused graph in float64) and against the unfused graph on MLX in the same dtype,
                 with tolerances from one table per dtype and device. The verdict names the input that broke a
                 version and whether a pass changed the numbers or the dtype cannot hold them. On the CPU the final
                 version also runs on MLX's own lowering in the same rounds, splitting its speed-up into the fusion's
                 and rlxviz's kernels' ("Fusion or kernels?", as the app's Timing tab; --no-split skips it). A run on a
                 busy machine (a median above twice its minimum, or an IQR above half its median) says so before
                 the table and reads no ratio ("busy: not read"); it is not a failure. A ratio whose 95% interval
                 holds 1 or spans more than 1.5x reads "within noise". Exit code 1 if a version is not ok (NaN is
                 never counted as correct).""")
    _model_args(p)  # --inputs: your arrays, timed and checked first
    _expect_arg(p)
    p.add_argument("--battery", action=argparse.BooleanOptionalAction, default=True,
                   help="also check the input battery (default: on)")
    p.add_argument("--repeat", "-r", type=_int_in(1, MAX_REPEAT), default=DEFAULT_REPEAT, metavar="N",
                   help=f"timed interleaved rounds, 1..{MAX_REPEAT} (default: %(default)s, as the app's Timing tab)")
    p.add_argument("--warmup", type=_int_in(0, MAX_WARMUP), default=DEFAULT_WARMUP, metavar="N",
                   help=f"untimed rounds after the first call, 0..{MAX_WARMUP} (default: %(default)s, as the app)")
    _device_arg(p)
    p.add_argument("--split", action=argparse.BooleanOptionalAction, default=True,
                   help="on the CPU, also time the final version on MLX's own lowering in the same rounds: the "
                   "fusion / kernels split (default: on)")
    p.add_argument("--json", action="store_true", help="machine-readable output (each version with its verdict)")
    _layers_arg(p)


def cmd_overlay(args: argparse.Namespace) -> int:
    """`rlxviz overlay MODEL --kind time|error [--after PASS]`: each node's share of the measured time, or its
    error against version 0's reference, largest first (`session.overlays.node_figures`, as the app's overlay)."""
    from ..session import Limits, load_inputs, version_index
    from ..session.overlays import node_figures

    if not 0 < args.time_limit < float("inf"):
        raise CLIError(f"--time-limit must be a positive number of seconds, got {args.time_limit}")
    model, trace = _run_model(args, workload="time")
    k = version_index(trace, args.after)
    feeds = load_inputs(args.inputs, model.graph).feeds if args.inputs is not None else model.random_feeds(seed=0)
    figs = node_figures(trace, k, args.kind, feeds, model.weights, repeat=args.repeat,
                        device=args.device, limits=Limits.resolve(args.max_memory_mb), time_limit_s=args.time_limit)
    _out(figs.render(trace.versions()[k][1], args.top))
    return 0


@subcommand
def add_overlay(sub: SubParsers) -> None:
    from ..session.overlays import DEFAULT_TIME_LIMIT_S, KINDS

    p = _command(sub, "overlay", cmd_overlay, "per-node time share or numeric error of a graph version",
                 """Each compute node of MODEL's version after PASS: with --kind time its share of the per-node time
                 (each node evaluated on its own on MLX, fastest of --repeat), with --kind error max |value -
                 reference| against the float64 reference of the same node in the input graph (matched by node
                 identity). The app's overlay selector colours the graph with the same figures.""")
    _model_args(p)
    p.add_argument("--kind", "-k", choices=KINDS, default="time", help="what to show per node (default: time)")
    _after_arg(p, "final",
               "'final' (default), 'input', a pass name (its first run) or NAME#K (its K-th run)")
    p.add_argument("--repeat", "-r", type=_int_in(1, 50), default=3, metavar="N",
                   help="--kind time: evaluations per node, the fastest counts (default: %(default)s)")
    p.add_argument("--top", type=_int_in(1, 100000), default=20, metavar="N",
                   help="lines printed, largest first (default: %(default)s)")
    p.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, metavar="S",
                   help="stop between nodes after S seconds and print what was measured (default: %(default)s)")
    _device_arg(p)
