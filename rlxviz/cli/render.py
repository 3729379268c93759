"""`rlxviz render` (a graph version drawn to .svg/.dot/.png/.pdf), `rlxviz ir` (a version as IR text) and `rlxviz
export` (a version as ONNX, or the run as Model Explorer graphs)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .args import _after_arg, _command, _model_args
from .common import CLIError, SubParsers, subcommand
from .loading import _run_model
from .output import _emit, _not_a_directory, _out, _output_file


def _drawn_nodes(dot: str) -> int:
    """Node statements in DOT text (boxes, ellipses and stubs actually drawn; not edges or defaults)."""
    return sum(1 for m in re.finditer(r"^\s*([A-Za-z_]\w*) \[", dot, re.MULTILINE)
               if m.group(1) not in ("graph", "node", "edge"))


def cmd_render(args: argparse.Namespace) -> int:
    """`rlxviz render MODEL --after PASS -o out.svg`: draw one graph version (with the pass's overlay)."""
    from ..session import View, model_layers, version_index
    from ..session.render import dot as render_dot
    from ..session.render import picture
    from ..viz import LayoutError, save

    out = Path(args.output)
    _not_a_directory(args.output, "a file name ending in .svg, .dot, .png or .pdf")
    if out.suffix.lower() not in (".svg", ".dot", ".gv", ".png", ".pdf"):
        raise CLIError(f"{args.output}: unsupported suffix {out.suffix!r}; use .svg, .dot, .gv, .png or .pdf")
    _output_file(args.output, "a file name ending in .svg, .dot, .png or .pdf", (args.model,))

    if args.focus is not None and args.view == "layers":
        raise CLIError("--focus N draws layer N of the full view; it cannot be combined with --view layers "
                       "(drop --view layers, or drop --focus to see every layer as one box)")
    if args.expand and args.view != "layers":
        raise CLIError("--expand N opens layer N inside the layers view; add --view layers")
    _, trace = _run_model(args)
    i = version_index(trace, args.after)
    expanded = tuple(sorted(set(args.expand or ())))
    view = View(i, args.view, "before" if args.before else "after", args.focus, expanded)
    graph = picture(trace, view)[0]
    have = model_layers(graph)
    present = set(have)
    span = f"layers: {have[0]}..{have[-1]}" if have else "no node path names a layer"
    missing = [k for k in expanded if k not in present]
    if missing:
        raise CLIError(f"--expand {missing[0]}: layer {missing[0]} is not in {args.model} ({span})")
    if args.focus is not None and args.focus not in present:
        raise CLIError(f"--focus {args.focus}: layer {args.focus} is not in {args.model} ({span})")
    dot = render_dot(trace, view)
    try:
        save(out, dot)
    except LayoutError as e:
        raise CLIError(str(e).splitlines()[0]) from None
    if not args.quiet:
        label = trace.versions()[i][0] + (" (before, matches and rejections marked)" if args.before and i else "")
        _emit(f"{args.model}: {label}: {len(graph.compute_nodes())} ops, {_drawn_nodes(dot)} drawn nodes -> {out}",
              sys.stderr)
    return 0


@subcommand
def add_render(sub: SubParsers) -> None:
    p = _command(sub, "render", cmd_render, "draw a graph version to .svg/.dot/.png/.pdf",
                 """Draw MODEL after a pass of the pipeline with the same renderer as the app: the pass's fused nodes
                 marked (or, with --before, the graph the pass saw with every match and rejection marked). The
                 format comes from the suffix of -o.""")
    _model_args(p)
    _after_arg(p, "final",
               "'input', 'final' (default), a pass name (its first run) or NAME#K (its K-th run)")
    p.add_argument("--before", action="store_true", help="draw the graph the pass saw, with its matches and rejections")
    p.add_argument("--view", choices=("full", "layers"), default="full", help="one box per op, or per layer")
    p.add_argument("--focus", type=int, default=None, metavar="N",
                   help="draw only layer N of the full view (not with --view layers); a --variant then changes "
                        "layer N unless --variant-layer says otherwise")
    p.add_argument("--expand", type=int, action="append", metavar="N",
                   help="with --view layers: draw layer N open, its nodes inside the overview (repeatable)")
    p.add_argument("--output", "-o", required=True, metavar="OUT", help="output file: .svg, .dot, .gv, .png or .pdf")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")


def cmd_ir(args: argparse.Namespace) -> int:
    """`rlxviz ir MODEL [--after PASS]`: print a graph version as IR text (`parse_ir` reads it back)."""
    from ..ir import format_graph
    from ..session import version_index

    _, trace = _run_model(args)
    _out(format_graph(trace.versions()[version_index(trace, args.after)][1]))
    return 0


@subcommand
def add_ir(sub: SubParsers) -> None:
    p = _command(sub, "ir", cmd_ir, "print a graph version as IR text",
                 """Print MODEL's graph (or its version after a pass) as IR text; the output can be edited and given
                 back as MODEL.""")
    _model_args(p)
    _after_arg(p, "input",
               "'input' (default), 'final', a pass name (its first run) or NAME#K (its K-th run)")


def cmd_export(args: argparse.Namespace) -> int:
    """`rlxviz export MODEL OUT [--after PASS]`: a graph version as ONNX (`.onnx`; fused ops unfused) or, with
    `.json`, every version of the run as Model Explorer graphs annotated with matches and rejections."""
    from ..session import version_index

    out = Path(args.out)
    suffix = out.suffix.lower()
    if suffix not in (".onnx", ".json"):
        raise CLIError(f"{args.out}: the output must end in .onnx (ONNX model) or .json (Model Explorer graphs)")
    _output_file(args.out, "a file name ending in .onnx or .json", (args.model,))
    model, trace = _run_model(args, workload="export" if suffix == ".onnx" else "load")
    if suffix == ".onnx":
        from ..models.onnx.export import export_onnx

        graph = trace.versions()[version_index(trace, args.after or "final")][1]
        export_onnx(graph, model.weights, out)
        _out(f"wrote {out} ({graph.name}, {len(graph)} nodes before unfuse)")
    else:
        from ..session import Limits
        from ..session.advice import advised
        from ..session.fidelity import unread_weights
        from ..viz.model_explorer import save_model_explorer

        unread = unread_weights(model, limits=Limits.resolve(args.max_memory_mb))
        feeds = model.random_feeds(seed=0) if unread is None else None
        # each refusal's fix_K / compiler_fix_K as `explain -v` prints them: checked, as the app's inspector reads them
        save_model_explorer(advised(trace, model.name, feeds, model.weights), out,
                            "final" if args.after == "final" else "all")
        _out(f"wrote {out} (Model Explorer graphs: pip install ai-edge-model-explorer; model-explorer {out})")
    return 0


@subcommand
def add_export(sub: SubParsers) -> None:
    p = _command(sub, "export", cmd_export, "write a graph version as ONNX, or the run as Model Explorer graph JSON",
                 """OUT ending in .onnx: the graph version after PASS as an ONNX model (fused ops expanded to
                 primitives by unfuse; weights as initializers) for ONNX Runtime. OUT ending in .json: Model
                 Explorer graph JSON with one graph per changed version (or only the final one with --after final),
                 each node annotated with the rule that made it and the rejections about it.""")
    _model_args(p)
    p.add_argument("out", metavar="OUT", help="output file: .onnx or .json")
    _after_arg(p, None,
               ".onnx: 'final' (default), 'input', a pass name (its first run) or NAME#K (its K-th run); "
               ".json: 'final' for the final version only (default: every version)")
