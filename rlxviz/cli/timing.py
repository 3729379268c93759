"""`rlxviz time` (every graph version timed on MLX and checked against the reference) and `rlxviz overlay` (each
node's time share or numeric error)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .args import _after_arg, _command, _device_arg, _expect_arg, _int_in, _layers_arg, _model_args
from .common import CLIError, SubParsers, subcommand
from .loading import _import_checks, _run_model, _slice_model, _source
from .output import _out, _warn_nonfinite


def cmd_time(args: argparse.Namespace) -> int:
    """`rlxviz time MODEL`: every graph version timed on MLX, checked against the NumPy reference."""
    from ..ir.onnx_op import describe_host
    from ..session import format_timings, input_sets, load_inputs, shape_summary, time_versions

    _slice_model(args)
    model, trace = _run_model(args, workload="time")  # refused over the memory limit before feeds are made
    user = load_inputs(args.inputs, model.graph) if args.inputs is not None else None
    feeds = user.feeds if user is not None else model.random_feeds(seed=0)
    checks = _import_checks(model, feeds, user, args.expect, max_memory_mb=args.max_memory_mb,
                            sliced=_source(args) if args.layers is not None else None)
    sets = input_sets(model.graph, feeds, user, args.battery)  # the user's arrays first, then the battery
    rows = time_versions(trace, feeds, model.weights, warmup=args.warmup, repeat=args.repeat, device=args.device,
                         inputs=sets)
    if not all(r.finite for r in rows):
        _warn_nonfinite("time", model, False)
    where = next((str(r.context) for r in rows if r.context is not None), "")
    where = where.replace(str(Path.cwd()) + os.sep, "")  # `.venv/...` from a clone, not an absolute path
    policy = next(r.policy for r in rows if r.policy is not None)
    if args.json:
        import dataclasses
        import json

        _out(json.dumps({"model": model.name, "pipeline": trace.pipeline, "context": where, "repeat": args.repeat,
                         "precision": policy.describe(), "inputs": sets.names, "skipped": dict(sets.skipped),
                         "versions": [{**dataclasses.asdict(r), "verdict": r.verdict} for r in rows],
                         "import_checks": [{**dataclasses.asdict(c), "line": c.line()} for c in checks]},
                        indent=2, default=str))
        return 0 if all(r.ok is not False for r in rows) and all(c.ok for c in checks) else 1
    _out(f"{model.name} ({trace.pipeline} pipeline), {shape_summary(model, args.batch, args.seq)}; {where}; "
         f"{args.repeat} interleaved round(s) on {sets.sets[0].name} inputs\n"
         + "".join(f"{c.line()}\n" for c in checks)
         + (f"{host}\n" if (host := describe_host(model.graph)) else "")
         + f"{policy.describe()}\n{sets.describe()}\n" + format_timings(rows))
    return 0 if all(r.ok is not False for r in rows) and all(c.ok for c in checks) else 1


@subcommand
def add_time(sub: SubParsers) -> None:
    from ..session import DEFAULT_REPEAT, DEFAULT_WARMUP, MAX_REPEAT, MAX_WARMUP

    p = _command(sub, "time", cmd_time, "time every graph version on MLX, with its error vs the reference",
                 """Run the pipeline on MODEL, then time each distinct graph version on MLX (median, min, first call in
                 ms) in the graph's own dtype, and check it on a battery of inputs (random, a fully masked row, left
                 padding, holes, a single token, large magnitudes, constant rows: those that apply) twice: against
                 the oracle (the unfused graph in float64) and against the unfused graph on MLX in the same dtype,
                 with tolerances from one table per dtype and device. The verdict names the input that broke a
                 version and whether a pass changed the numbers or the dtype cannot hold them. Exit code 1 if a
                 version is not ok (NaN is never counted as correct).""")
    _model_args(p)  # --inputs: your arrays, timed and checked first
    _expect_arg(p)
    p.add_argument("--battery", action=argparse.BooleanOptionalAction, default=True,
                   help="also check the input battery (default: on)")
    p.add_argument("--repeat", "-r", type=_int_in(1, MAX_REPEAT), default=DEFAULT_REPEAT, metavar="N",
                   help=f"timed interleaved rounds, 1..{MAX_REPEAT} (default: %(default)s, as the app's Timing tab)")
    p.add_argument("--warmup", type=_int_in(0, MAX_WARMUP), default=DEFAULT_WARMUP, metavar="N",
                   help=f"untimed rounds after the first call, 0..{MAX_WARMUP} (default: %(default)s, as the app)")
    _device_arg(p)
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
