"""The `rlxviz` command line (also `python -m rlxviz`).

Each subcommand is one function that adds its parser, registered with `@subcommand`; it sets
`func=handler` where `handler(args) -> int` returns the exit code. To add a subcommand (`passes`,
`explain`, `render`, `ir`, `time`, ...) write one such function below; `build_parser` picks it up.

Errors a user can fix (bad paths, bad inputs, unknown models) are raised as `CLIError` (or the
library's `ValueError`/`KeyError`/`OSError`) and printed by `main` as one line on stderr,
`rlxviz <command>: error: <message>`, with exit code 2 and no traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

if TYPE_CHECKING:
    from .models import Model
    from .passes import Trace

SubParsers = Any  # argparse._SubParsersAction (private type)
Registrar = Callable[[SubParsers], None]
SUBCOMMANDS: list[Registrar] = []


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""


class InternalError(Exception):
    """A bug in rlxviz found while serving a valid request (e.g. a pass crashed): one line, exit code 3."""


EXIT_BAD_INPUT, EXIT_INTERNAL = 2, 3
"""Exit codes of every subcommand: 2 for bad input (one line on stderr), 3 for an internal error."""

EXIT_CODES_HELP = ("exit codes: 0 success; 1 a check failed (explain: a layer did not fuse; time: a version is off); "
                   "2 bad input (one line on stderr); 3 internal error (one line on stderr: a bug in rlxviz, "
                   "e.g. a pass crashed)")


def subcommand(fn: Registrar) -> Registrar:
    """Register `fn(subparsers)`, which adds one subcommand parser with `set_defaults(func=...)`."""
    SUBCOMMANDS.append(fn)
    return fn


# ----------------------------------------------------------------------------------------------- run

BACKENDS = ("reference", "mlx")
"""Backends `run` knows: `reference` is the NumPy interpreter (the oracle), `mlx` the MLX runtime."""


def executor(backend: str, device: str | None = None) -> Callable[..., list[np.ndarray]]:
    """`run(graph, feeds, weights) -> outputs` for `backend` (MLX imported only when asked for); `device`
    (`cpu` / `gpu` / None: the GPU when present) applies to MLX only. Raises DeviceError (a ValueError)."""
    from . import runtime

    if backend == "reference":
        if device is not None:
            raise CLIError("--device applies to --backend mlx (the NumPy reference runs on the CPU)")
        return runtime.run_reference
    from .runtime.executor import MlxExecutor

    return MlxExecutor(device=device).run


def _static_shape(headers: dict[str, tuple[tuple[int, ...], np.dtype]], path: str) -> tuple[int, int]:
    """`(batch, seq)` from the header shape of `input_ids` (BERT-like models) or `hidden_states` (decoder blocks)."""
    for key, rank in (("input_ids", 2), ("hidden_states", 3)):
        if key in headers:
            shape = headers[key][0]
            if len(shape) != rank or 0 in shape:
                raise CLIError(f"{path}: {key} must be a non-empty rank-{rank} array, got shape {list(shape)}")
            return int(shape[0]), int(shape[1])
    raise CLIError(f"{path}: needs 'input_ids' and 'attention_mask' (int64 [batch, seq]); "
                   f"found {sorted(headers) or 'no arrays'}")


def resolve_model(model: str, batch: int, seq: int, style: str = "hf") -> Model:
    """A preset by name, else a Hugging Face checkpoint folder (loaded by `session.load`, so its errors name
    the folder as `explain`'s do). Raises CLIError/SessionError for anything else."""
    from .models import PRESETS
    from .session import Limits, load, unknown_model

    if model in PRESETS or Path(model).is_dir():
        return load(model, batch=batch, seq=seq, style=style, limits=Limits.resolve())
    if Path(model).exists():
        raise CLIError(f"{model}: run takes a preset name or a checkpoint folder, not a file")
    raise unknown_model(model, "nor an existing checkpoint folder")


def resolve_onnx(path: str, shapes: dict[str, tuple[int, ...]]) -> Model:
    """An `.onnx` export with every input's shape taken from the array of the same name (memory limit from
    the environment). Raises CLIError naming the file for anything `load_onnx` refuses."""
    from .models.onnx_import import OnnxImportError, load_onnx
    from .session import Limits

    try:
        return load_onnx(path, input_shapes=shapes,
                         max_bytes=Limits.resolve().max_bytes)
    except OnnxImportError as e:
        raise CLIError(str(e).splitlines()[0]) from None


def _expect_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expect", default=None, metavar="OUT.npz",
                   help="outputs the model must give on these inputs (arrays named like its outputs, or out:NAME): "
                        "version 0 is checked against them, exit 1 if it differs. Members out:NAME of the "
                        "--inputs file are checked the same way")


def _import_checks(model: Model, feeds: dict[str, np.ndarray], user: Any, expect: str | None,
                   with_onnx: bool = True) -> list[Any]:
    """Version 0 against the model itself (`session.fidelity`): the ONNX file it came from (`with_onnx`), the
    `out:NAME` arrays of the inputs file, the `--expect` file. Raises CLIError for an unreadable --expect file or
    a name that is no output."""
    from .session.fidelity import against_expected, against_onnx
    from .session.inputs import load_expected

    out = []
    try:
        if with_onnx and (c := against_onnx(model, feeds)) is not None:
            out.append(c)
        if user is not None and user.expected:
            out.append(against_expected(model, feeds, user.expected, Path(user.what.split(" ", 1)[-1]).name))
        if expect is not None:
            out.append(against_expected(model, feeds, load_expected(expect, model.graph), Path(expect).name))
    except ValueError as e:
        raise CLIError(str(e).splitlines()[0]) from None
    return out


def _warn(command: str, message: str) -> None:
    _emit(f"rlxviz {command}: warning: {message}", sys.stderr)


def _warn_nonfinite(command: str, model: Model, outputs_finite: bool | None = None) -> bool:
    """Warn on stderr when the outputs are not finite (`outputs_finite` False) or, with no outputs
    computed (None), when the model's weights hold NaN/inf; names a bad weight. True if it warned."""
    from .session import nonfinite_arrays

    bad = nonfinite_arrays(model.weights)
    if outputs_finite is False:
        why = f"; {len(bad)} weight(s) hold NaN/inf, e.g. {bad[0]!r}" if bad else ""
        _warn(command, f"the outputs hold NaN or infinite values{why}")
        return True
    if outputs_finite is None and bad:
        _warn(command, f"{len(bad)} weight(s) hold NaN/inf (e.g. {bad[0]!r}): the model's outputs will not "
                       "be finite, whatever the fusions")
        return True
    return False


def _not_a_directory(output: str, want: str) -> None:
    """Refuse an output path that is (or, ending in `/`, names) a directory. Raises CLIError."""
    if Path(output).is_dir():
        raise CLIError(f"output path {output} is a directory; give {want}")
    if output.endswith(("/", os.sep)):
        raise CLIError(f"output path {output} ends in '/', naming a directory; give {want}")


def _output_file(output: str, want: str, sources: Sequence[str | None] = ()) -> Path:
    """The path of an output file `run`, `render` and `export` write: not a directory, in a folder that exists,
    and none of the command's own input files (`sources`: MODEL, `--inputs`), which it would overwrite.

    Raises:
        CLIError: `output` is or names a directory (`_not_a_directory`), its folder does not exist
            (`OUT: folder DIR does not exist`), or it is one of `sources` (the same file, by any path or link).
    """
    _not_a_directory(output, want)
    out = Path(output)
    if not out.parent.is_dir():
        raise CLIError(f"{output}: folder {out.parent} does not exist")
    for src in sources:
        if src is not None and _same_file(out, Path(src)):
            raise CLIError(f"output path {output} is the input {src}; writing it would overwrite the input: "
                           f"give another file name")
    return out


def _same_file(a: Path, b: Path) -> bool:
    """True when `a` and `b` name one file (the same resolved path, or the same inode: a hard link)."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except (OSError, RuntimeError):
        return False


def cmd_run(args: argparse.Namespace) -> int:
    """`rlxviz run MODEL --inputs IN.npz -o OUT.npz`: run a model and save `last_hidden_state`."""
    from .models.onnx_weights import lazy_names
    from .session import Limits, all_finite, load_inputs, npz_headers
    from .session.fidelity import output_names

    out = _output_file(args.output, "a .npz file name", (args.inputs, args.model))
    _slice_model(args)
    headers = npz_headers(args.inputs)  # names, shapes, dtypes: no array is read before the model checks them
    if args.model.lower().endswith(".onnx") and Path(args.model).is_file():
        model = resolve_onnx(args.model, {k: shape for k, (shape, _) in headers.items() if not k.startswith("out:")})
    else:
        batch, seq = _static_shape(headers, args.inputs)
        model = resolve_model(args.model, batch, seq, args.style)
    _remember(model)  # before any message names its inputs
    Limits.resolve().check(model.graph, _source(args), "run-mlx" if args.backend == "mlx" else "run",  # before running
                           hint=_slice_hint(args) if lazy_names(model.weights) else "")
    user = load_inputs(args.inputs, model.graph)  # the one check of user inputs, as `time` and the app
    feeds = user.feeds
    checks = _import_checks(model, feeds, user, args.expect)
    outputs = executor(args.backend, args.device)(model.graph, feeds, model.weights)
    _warn_nonfinite("run", model, all_finite(outputs))
    # each output under the model's own name (an ONNX graph's, else last_hidden_state, output_1...), in its dtype
    names = output_names(model)
    named = {n: np.asarray(o, dtype=np.dtype(model.graph[i].dtype.numpy))
             for n, o, i in zip(names, outputs, model.graph.outputs, strict=True)}
    with out.open("wb") as f:  # an open file keeps numpy from appending `.npz` to the name
        np.savez(f, **named)
    if not args.quiet:
        first = named[names[0]]
        shape = "x".join(map(str, first.shape))
        _emit(f"{model.name}: {args.backend} -> {out} ({names[0]} {first.dtype} {shape})", sys.stderr)
    for c in checks:
        if not args.quiet or not c.ok:
            _emit(f"{model.name}: {c.line()}", sys.stderr)
    return 0 if all(c.ok for c in checks) else 1


@subcommand
def add_run(sub: SubParsers) -> None:
    p = sub.add_parser("run", help="run a model on inputs from an .npz file",
                       description="Run MODEL on IN.npz (input_ids, attention_mask: int64 [batch, seq]; or "
                                   "hidden_states float32 [batch, seq, hidden] for decoder blocks) and write "
                                   "last_hidden_state (float32 [batch, seq, hidden]) to OUT.npz. Batch and "
                                   "sequence length come from the inputs. For an .onnx MODEL, IN.npz holds one array "
                                   "per graph input (by name), whose shapes fix the graph's.")
    p.add_argument("model", metavar="MODEL", help="a preset name (e.g. minilm, bert-tiny, llama-block), a Hugging "
                                                   "Face BERT checkpoint folder (config.json + model.safetensors) "
                                                   "or an .onnx export")
    p.add_argument("--inputs", "-i", required=True, metavar="IN.npz", help="input arrays")
    p.add_argument("--output", "-o", required=True, metavar="OUT.npz", help="where to write last_hidden_state")
    _expect_arg(p)
    p.add_argument("--backend", choices=BACKENDS, default="reference", help="executor (default: %(default)s)")
    _device_arg(p)
    p.add_argument("--style", choices=("hf", "rlx"), default="hf",
                   help="BERT graph form: Hugging Face primitives or RLX fused QKV (default: %(default)s)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    _layers_arg(p)
    p.set_defaults(func=cmd_run)


# ------------------------------------------------------------------------ debugging fusions (session)
# `passes`, `explain`, `render`, `ir`, `time`: MODEL is a preset name, a checkpoint folder or an IR text
# file (random weights from its param shapes). User errors are `session.SessionError` (a ValueError): one line.

EXPLAIN_OK, EXPLAIN_NOT_FUSED = 0, 1
"""`rlxviz explain` exit codes: 0 when every expected fusion happened, 1 otherwise (2: a user error)."""


def _model_args(p: argparse.ArgumentParser) -> None:
    """MODEL and the options that build it and choose the pipeline (shared by explain/render/ir/time/export);
    batch and sequence length default to `session.DEFAULT_BATCH`/`DEFAULT_SEQ`, as in the app."""
    from .session import DEFAULT_BATCH, DEFAULT_SEQ, teaching_cases

    p.add_argument("model", metavar="MODEL", help="a preset name (bert-tiny, minilm, minilm-shaped, llama-block, ...), "
                                                   "a Hugging Face BERT checkpoint folder, an .onnx export (symbolic "
                                                   "batch/sequence dims bound to --batch/--seq), or an IR text file "
                                                   "(.ir/.txt, or .json in rlxviz's to_json form; random weights "
                                                   "from its param shapes)")
    p.add_argument("--pipeline", "-p", default="canonical", metavar="SPEC",
                   help="'canonical', 'rlx', or pass names separated by commas (default: %(default)s)")
    p.add_argument("--threshold", type=int, default=None, metavar="TOKENS",
                   help="attention-fusion gate on batch*seq, a positive integer (pipeline param fab_max_tokens)")
    p.add_argument("--variant", default=None, metavar="NAME",
                   help="teaching variant: " + ", ".join(teaching_cases()))
    p.add_argument("--variant-layer", type=int, default=None, metavar="N",
                   help="layer the variant changes (default: the one layer asked for, explain --layer N or "
                        "render --focus N; else 0)")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH,
                   help="batch size the graph is built for (default: %(default)s, as in the app; time --inputs: "
                        "the inputs')")
    p.add_argument("--seq", type=int, default=DEFAULT_SEQ,
                   help="sequence length the graph is built for (default: %(default)s, as in the app; time "
                        "--inputs: the inputs')")
    p.add_argument("--style", choices=("hf", "rlx"), default=None,
                   help="BERT graph form (default: the preset's own; hf for checkpoint folders)")
    p.add_argument("--max-memory-mb", type=int, default=None, metavar="MIB",
                   help="refuse graphs whose inputs and params would need more than MIB MiB before allocating "
                        "them (default: $RLXVIZ_MAX_MEMORY_MB or 2048)")
    p.add_argument("--dim", action="append", default=None, metavar="NAME=VALUE", type=_dim_arg,
                   help="an .onnx file: bind the symbolic dim NAME to VALUE (repeatable: --dim height=224 --dim "
                        "past_sequence_length=16); a dim written as an expression (past_sequence_length + "
                        "sequence_length) follows from its names")
    p.add_argument("--inputs", "-i", default=None, metavar="IN.npz",
                   help="input arrays (.npz, one per graph input by name): an .onnx file's inputs take their shapes "
                        "(and bind the dims they name); input_ids / hidden_states set --batch and --seq; explain and "
                        "time check version 0 on them (and on out:NAME arrays in the file)")


def _dim_arg(text: str) -> tuple[str, int]:
    """argparse type of `--dim NAME=VALUE` (a bad one: argparse's usage error, exit 2)."""
    from .models.onnx_dims import DimError, parse_dim

    try:
        return parse_dim(text)
    except DimError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--dim {text!r}: ")) from None


def _bound_shapes(args: argparse.Namespace) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
    """(dims, input shapes) from `--dim` and `--inputs` (read from the npz headers: no array is loaded); an
    `--inputs` file with input_ids / hidden_states also sets args.batch / args.seq, as `run` takes them. Input
    shapes are kept for an .onnx MODEL only. Raises CLIError for a --dim given twice with two values."""
    from .session import npz_headers

    dims: dict[str, int] = {}
    for name, value in getattr(args, "dim", None) or []:
        if dims.get(name, value) != value:
            raise CLIError(f"--dim {name} is given twice, as {dims[name]} and {value}")
        dims[name] = value
    shapes: dict[str, tuple[int, ...]] = {}
    if getattr(args, "inputs", None) is not None:
        headers = {k: v for k, v in npz_headers(args.inputs).items() if not k.startswith("out:")}
        if any(k in headers for k in ("input_ids", "hidden_states")):
            args.batch, args.seq = _static_shape(headers, args.inputs)
        if args.model.lower().endswith(".onnx"):
            shapes = {k: tuple(shape) for k, (shape, _) in headers.items()}
    return dims, shapes


def _device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("cpu", "gpu"), default=None,
                   help="MLX device (default: the GPU when MLX has one here, else the CPU)")


def _out(text: str) -> None:
    """Print `text` to stdout (through `_emit`); a reader that left early (`rlxviz ir MODEL | head`) is not an error."""
    try:
        _emit(text, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


MODEL_TEXT = None
"""The model strings of this command (`session.ModelText`) that hold a line break: set by `main`, filled where
a model is loaded (`_remember`)."""


def _remember(*things: object) -> None:
    """Remember model text (graphs, models' names, file names) so `_emit` escapes its line breaks too."""
    if MODEL_TEXT is None:
        return
    for t in things:
        graph = getattr(t, "graph", None)
        if graph is not None:
            MODEL_TEXT.remember([getattr(t, "name", None)])
            MODEL_TEXT.remember_graph(graph)
        elif hasattr(t, "versions"):
            for _, g in t.versions():
                MODEL_TEXT.remember_graph(g)
        else:
            MODEL_TEXT.remember([t])


def _emit(text: str, stream: Any) -> None:
    """The CLI's one print path for human-readable text: control characters in model text (names, paths,
    file names) escaped (`session.text`), so a name cannot retitle the terminal, clear it or forge a line.
    JSON output passes through unchanged in meaning (`json.dumps` leaves no raw control character)."""
    from .session.text import ModelText

    print((MODEL_TEXT or ModelText()).shown(str(text)), file=stream)


def _variant_layer(args: argparse.Namespace) -> int:
    """The layer a `--variant` changes: `--variant-layer` when given, else the one layer asked for (`explain
    --layer N`, `render --focus N`: the variant breaks the layer looked at), else 0."""
    if args.variant_layer is not None:
        return int(args.variant_layer)
    layer = getattr(args, "layer", None)
    if layer is None:
        layer = getattr(args, "focus", None)
    return 0 if layer is None else int(layer)


def _run_model(args: argparse.Namespace, allow_crashes: bool = False, workload: str = "load") -> tuple[Model, Trace]:
    """(Model, Trace) for the shared options, the model checked against the memory limit for `workload` (`time`:
    the oracle and MLX copies too; `Limits.check`) before the pipeline runs. Raises SessionError/CLIError for bad
    input, LimitError over the limit, and InternalError (exit 3) when a pass crashed, unless `allow_crashes`
    (`explain` prints its report first, then exits 3)."""
    from .session import Limits, build_pipeline, effective_threshold, load, run_pipeline, variant_named

    if args.batch < 1 or args.seq < 1:
        raise CLIError(f"--batch and --seq must be >= 1, got {args.batch} and {args.seq}")
    if args.threshold is not None and args.threshold < 1:
        raise CLIError(f"--threshold must be a positive integer (tokens, batch*seq), got {args.threshold}")
    args.variant_layer = _variant_layer(args)
    gate = effective_threshold(variant_named(args.variant, args.variant_layer), args.threshold)
    pipe = build_pipeline(args.pipeline, {} if gate is None else {"fab_max_tokens": gate})
    dims, shapes = _bound_shapes(args)
    limits = Limits.resolve(args.max_memory_mb)
    model = load(args.model, args.batch, args.seq, args.style, args.variant, args.variant_layer, limits,
                 args.threshold, dims=dims, input_shapes=shapes)
    _remember(model)
    if workload != "load":  # `load` checked the graph's own run; this adds what the command copies
        from .models.onnx_weights import lazy_names

        limits.check(model.graph, _source(args), workload,
                     hint=_slice_hint(args) if lazy_names(model.weights) else "")
    trace = run_pipeline(model.graph, pipe)
    _remember(trace)
    crashed = [s.error for s in trace.steps if s.error]
    if crashed and not allow_crashes:
        raise InternalError(_crash_message(crashed))
    return model, trace


def _layers_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", default=None, metavar="0-K",
                   help="an .onnx export: run only its layers 0..K (the graph cut after layer K, their real weights), "
                        "checked against ONNX Runtime on the same slice; for a model whose weights do not fit")


def _slice_model(args: argparse.Namespace) -> None:
    """With `--layers`, replace `args.model` (an .onnx export) by the file of that slice (`models.onnx_slice`).
    Raises CLIError for a model that is no .onnx file or a range the file cannot be cut at."""
    if getattr(args, "layers", None) is None:
        return
    from .models.onnx_slice import parse_layers, slice_layers

    if not (args.model.lower().endswith(".onnx") and Path(args.model).is_file()):
        raise CLIError(f"--layers applies to an .onnx export; {args.model} is not one")
    first, last = parse_layers(args.layers)
    args.model_label = f"{args.model} --layers {first}-{last}"
    args.model = str(slice_layers(args.model, first, last))
    _remember(args.model)


def _source(args: argparse.Namespace) -> str:
    """The model as messages name it: MODEL, or `MODEL --layers 0-K` for a slice (not its temporary file)."""
    return getattr(args, "model_label", None) or args.model


def _slice_hint(args: argparse.Namespace | None = None) -> str:
    """What a refusal for a model whose weights do not fit suggests: a slice, or a shorter one under `--layers`."""
    from .session.fidelity import SLICE_HINT

    if args is not None and getattr(args, "layers", None) is not None:
        return f"a shorter slice than --layers {args.layers} may fit"
    return SLICE_HINT


def _crash_message(crashed: Sequence[str]) -> str:
    """The one line of an internal error for the passes that raised (a bug in rlxviz: exit 3)."""
    more = f" (and {len(crashed) - 1} more)" if len(crashed) > 1 else ""
    return (f"a pass crashed{more}, its result discarded: {crashed[0].splitlines()[0]} "
            "(a bug in rlxviz; please report it)")


def cmd_passes(args: argparse.Namespace) -> int:
    """`rlxviz passes`: the pipeline's passes with their patterns and guard names."""
    import json

    from .session import build_pipeline, format_passes, pass_catalog

    pipe = build_pipeline(args.pipeline)
    if args.json:
        _out(json.dumps({"pipeline": pipe.name, "params": pipe.effective_params, "passes": pass_catalog(pipe)},
                        indent=2))
    else:
        _out(format_passes(pipe))
    return 0


@subcommand
def add_passes(sub: SubParsers) -> None:
    p = sub.add_parser("passes", help="list the pipeline's passes, patterns and guard names",
                       description="Print the canonical pipeline (or another one): each pass in order, its pattern "
                                   "rules and the names of their structure steps and guards, in the order they run.")
    p.add_argument("--pipeline", "-p", default="canonical", metavar="SPEC",
                   help="'canonical', 'rlx', or pass names separated by commas (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_passes)


def cmd_explain(args: argparse.Namespace) -> int:
    """`rlxviz explain MODEL`: per layer, fused or the first rejecting guard; exit 1 if any layer did not fuse."""
    import json

    from .ir.onnx_op import describe_host
    from .models.onnx_notes import imported_forms
    from .session import check_fusion, load_inputs
    from .session.advice import check_fixes, vetted
    from .session.exactness import ExactnessCheck, check_exactness
    from .session.fidelity import unread_weights

    model, trace = _run_model(args, allow_crashes=True)
    _warn_nonfinite("explain", model)
    user = load_inputs(args.inputs, model.graph) if args.inputs is not None else None
    feeds = user.feeds if user is not None else model.random_feeds(seed=0)
    checks = _import_checks(model, feeds, user, None)
    if (unread := unread_weights(model)) is None:
        exact = check_exactness(trace, feeds, model.weights)
    else:  # weights left in their file that the limit does not let a run read
        exact = ExactnessCheck((), (), None, skipped=unread.split(": ", 1)[-1].split("; ")[0])
    check = check_fusion(trace, model.name, None if args.layer is None else [args.layer], args.expect)
    fixes = check_fixes(trace, check, feeds if unread is None else None, model.weights,  # advice checked, not written
                        verbose=args.verbose or args.json)  # --json carries every rule's explanation
    if not all(f.ok for f in fixes):
        check = check_fusion(vetted(trace, fixes), model.name, None if args.layer is None else [args.layer],
                             args.expect)
    imported = imported_forms(model)  # what the file had already fused (ORT contrib ops), its quantization
    if args.json:
        _out(json.dumps({**check.to_dict(), "import_checks": [c.line() for c in checks], "imported_forms": imported,
                         "numeric_check": None if exact is None else exact.to_dict(),
                         "fix_checks": [f.to_dict() for f in fixes]}, indent=2, default=str))
    else:
        host = describe_host(model.graph)
        numbers = f"{exact.line()}\n" if exact is not None and (args.verbose or not exact.ok) else ""
        _out("".join(f"{c.line()}\n" for c in checks) + numbers + (f"{host}\n" if host else "")
             + "".join(f"{line}\n" for line in imported) + check.render(verbose=args.verbose))
    if not all(c.ok for c in checks) or (exact is not None and not exact.ok):
        return EXPLAIN_NOT_FUSED
    if check.crashed:
        raise InternalError(_crash_message(check.crashed).replace("discarded:", "discarded, so this report is "
                                                                  "incomplete:"))
    return EXPLAIN_OK if check.ok else EXPLAIN_NOT_FUSED


@subcommand
def add_explain(sub: SubParsers) -> None:
    p = sub.add_parser("explain", help="why each layer did (not) fuse; exit 1 unless every expected fusion happened",
                       description="Run the pipeline on MODEL and report, per layer, whether every expected fusion "
                                   "happened, or else the "
                                   "first rejecting guard with its actual vs required values, the fix, and how the "
                                   "layer differs from a sibling layer that fused. What is expected depends on the "
                                   "layer: a post-LN BERT-style layer (attention -> residual add -> LayerNorm) must "
                                   "become one FusedTransformerLayer (when the pipeline runs fuse_transformer_layer); "
                                   "any other layer (e.g. LLaMA: RmsNorm, pre-norm, SwiGLU) must get the fusions the "
                                   "pipeline's rules apply to it (FusedSwiGLU, the shared-input QKV matmul, a "
                                   "residual norm where legal). In both, no missed fusion may be left. What is "
                                   "expected is what is legal for the layer (what the canonical pipeline makes of "
                                   "it): a pipeline without a pass a layer needs is named with the products it "
                                   "cannot make and counts as not fused, unless --expect pipeline. Exit code 0 "
                                   "when every checked layer fused as expected, 1 otherwise, 2 for bad input.")
    _model_args(p)
    p.add_argument("--layer", "-l", type=int, default=None, metavar="N",
                   help="check only layer N (a --variant then changes layer N unless --variant-layer says otherwise)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--verbose", "-v", action="store_true", help="also print every rule's outcome per layer")
    p.add_argument("--expect", choices=("model", "pipeline"), default="model",
                   help="judge each layer against what is legal for it (model: a product the pipeline cannot make, "
                        "because it lacks the pass, counts as not fused) or against the pipeline's own passes only "
                        "(pipeline: such products are listed, not counted). Default: %(default)s")
    p.set_defaults(func=cmd_explain)


def _drawn_nodes(dot: str) -> int:
    """Node statements in DOT text (boxes, ellipses and stubs actually drawn; not edges or defaults)."""
    return sum(1 for m in re.finditer(r"^\s*([A-Za-z_]\w*) \[", dot, re.MULTILINE)
               if m.group(1) not in ("graph", "node", "edge"))


def cmd_render(args: argparse.Namespace) -> int:
    """`rlxviz render MODEL --after PASS -o out.svg`: draw one graph version (with the pass's overlay)."""
    from .session import View, model_layers, version_index
    from .session.render import dot as render_dot
    from .session.render import picture
    from .viz import LayoutError, save

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
    p = sub.add_parser("render", help="draw a graph version to .svg/.dot/.png/.pdf",
                       description="Draw MODEL after a pass of the pipeline with the same renderer as the app: the "
                                   "pass's fused nodes marked (or, with --before, the graph the pass saw with every "
                                   "match and rejection marked). The format comes from the suffix of -o.")
    _model_args(p)
    p.add_argument("--after", "-a", default="final", metavar="PASS",
                   help="'input', 'final' (default), a pass name (its first run) or NAME#K (its K-th run)")
    p.add_argument("--before", action="store_true", help="draw the graph the pass saw, with its matches and rejections")
    p.add_argument("--view", choices=("full", "layers"), default="full", help="one box per op, or per layer")
    p.add_argument("--focus", type=int, default=None, metavar="N",
                   help="draw only layer N of the full view (not with --view layers); a --variant then changes "
                        "layer N unless --variant-layer says otherwise")
    p.add_argument("--expand", type=int, action="append", metavar="N",
                   help="with --view layers: draw layer N open, its nodes inside the overview (repeatable)")
    p.add_argument("--output", "-o", required=True, metavar="OUT", help="output file: .svg, .dot, .gv, .png or .pdf")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    p.set_defaults(func=cmd_render)


def cmd_ir(args: argparse.Namespace) -> int:
    """`rlxviz ir MODEL [--after PASS]`: print a graph version as IR text (`parse_ir` reads it back)."""
    from .ir import format_graph
    from .session import version_index

    _, trace = _run_model(args)
    _out(format_graph(trace.versions()[version_index(trace, args.after)][1]))
    return 0


@subcommand
def add_ir(sub: SubParsers) -> None:
    p = sub.add_parser("ir", help="print a graph version as IR text",
                       description="Print MODEL's graph (or its version after a pass) as IR text; the output can "
                                   "be edited and given back as MODEL.")
    _model_args(p)
    p.add_argument("--after", "-a", default="input", metavar="PASS",
                   help="'input' (default), 'final', a pass name (its first run) or NAME#K (its K-th run)")
    p.set_defaults(func=cmd_ir)


def cmd_export(args: argparse.Namespace) -> int:
    """`rlxviz export MODEL OUT [--after PASS]`: a graph version as ONNX (`.onnx`; fused ops unfused) or, with
    `.json`, every version of the run as Model Explorer graphs annotated with matches and rejections."""
    from .session import version_index

    out = Path(args.out)
    suffix = out.suffix.lower()
    if suffix not in (".onnx", ".json"):
        raise CLIError(f"{args.out}: the output must end in .onnx (ONNX model) or .json (Model Explorer graphs)")
    _output_file(args.out, "a file name ending in .onnx or .json", (args.model,))
    model, trace = _run_model(args, workload="export" if suffix == ".onnx" else "load")
    if suffix == ".onnx":
        from .models.onnx_export import export_onnx

        graph = trace.versions()[version_index(trace, args.after or "final")][1]
        export_onnx(graph, model.weights, out)
        _out(f"wrote {out} ({graph.name}, {len(graph)} nodes before unfuse)")
    else:
        from .viz.model_explorer import save_model_explorer

        save_model_explorer(trace, out, "final" if args.after == "final" else "all")
        _out(f"wrote {out} (Model Explorer graphs: pip install ai-edge-model-explorer; model-explorer {out})")
    return 0


@subcommand
def add_export(sub: SubParsers) -> None:
    p = sub.add_parser("export", help="write a graph version as ONNX, or the run as Model Explorer graph JSON",
                       description="OUT ending in .onnx: the graph version after PASS as an ONNX model (fused ops "
                                   "expanded to primitives by unfuse; weights as initializers) for ONNX Runtime. "
                                   "OUT ending in .json: Model Explorer graph JSON with one graph per changed "
                                   "version (or only the final one with --after final), each node annotated with "
                                   "the rule that made it and the rejections about it.")
    _model_args(p)
    p.add_argument("out", metavar="OUT", help="output file: .onnx or .json")
    p.add_argument("--after", "-a", default=None, metavar="PASS",
                   help=".onnx: 'final' (default), 'input', a pass name (its first run) or NAME#K (its K-th run); "
                        ".json: 'final' for the final version only (default: every version)")
    p.set_defaults(func=cmd_export)


def cmd_time(args: argparse.Namespace) -> int:
    """`rlxviz time MODEL`: every graph version timed on MLX, checked against the NumPy reference."""
    from .ir.onnx_op import describe_host
    from .session import format_timings, input_sets, load_inputs, shape_summary, time_versions

    _slice_model(args)
    model, trace = _run_model(args, workload="time")  # refused over the memory limit before feeds are made
    user = load_inputs(args.inputs, model.graph) if args.inputs is not None else None
    feeds = user.feeds if user is not None else model.random_feeds(seed=0)
    checks = _import_checks(model, feeds, user, args.expect)
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
    from .session import DEFAULT_REPEAT, DEFAULT_WARMUP, MAX_REPEAT, MAX_WARMUP

    p = sub.add_parser("time", help="time every graph version on MLX, with its error vs the reference",
                       description="Run the pipeline on MODEL, then time each distinct graph version on MLX "
                                   "(median, min, first call in ms) in the graph's own dtype, and check it on a "
                                   "battery of inputs (random, a fully masked row, left padding, holes, a single "
                                   "token, large magnitudes, constant rows: those that apply) twice: against the "
                                   "oracle (the unfused graph in float64) and against the unfused graph on MLX in "
                                   "the same dtype, with tolerances from one table per dtype and device. The "
                                   "verdict names the input that broke a version and whether a pass changed the "
                                   "numbers or the dtype cannot hold them. Exit code 1 if a version is not ok "
                                   "(NaN is never counted as correct).")
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
    p.set_defaults(func=cmd_time)


def cmd_overlay(args: argparse.Namespace) -> int:
    """`rlxviz overlay MODEL --kind time|error [--after PASS]`: each node's share of the measured time, or its
    error against version 0's reference, largest first (`session.overlays.node_figures`, as the app's overlay)."""
    from .session import Limits, load_inputs, version_index
    from .session.overlays import node_figures

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
    from .session.overlays import DEFAULT_TIME_LIMIT_S, KINDS

    p = sub.add_parser("overlay", help="per-node time share or numeric error of a graph version",
                       description="Each compute node of MODEL's version after PASS: with --kind time its share "
                                   "of the per-node time (each node evaluated on its own on MLX, fastest of "
                                   "--repeat), with --kind error max |value - reference| against the float64 "
                                   "reference of the same node in the input graph (matched by node identity). "
                                   "The app's overlay selector colours the graph with the same figures.")
    _model_args(p)
    p.add_argument("--kind", "-k", choices=KINDS, default="time", help="what to show per node (default: time)")
    p.add_argument("--after", "-a", default="final", metavar="PASS",
                   help="'final' (default), 'input', a pass name (its first run) or NAME#K (its K-th run)")
    p.add_argument("--repeat", "-r", type=_int_in(1, 50), default=3, metavar="N",
                   help="--kind time: evaluations per node, the fastest counts (default: %(default)s)")
    p.add_argument("--top", type=_int_in(1, 100000), default=20, metavar="N",
                   help="lines printed, largest first (default: %(default)s)")
    p.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, metavar="S",
                   help="stop between nodes after S seconds and print what was measured (default: %(default)s)")
    _device_arg(p)
    p.set_defaults(func=cmd_overlay)


# ---------------------------------------------------------------------------------------------- main

def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse `type`: an integer in lo..hi, else a one-line usage error naming the bound."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in {lo}..{hi}, got {text[:40]!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be in {lo}..{hi}, got {text[:40]}")
        return value

    parse.__name__ = f"integer in {lo}..{hi}"
    return parse


class OneLineParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose usage errors are one line on stderr and exit 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {_one_line(message)} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand (subparsers inherit `OneLineParser`)."""
    from . import __version__

    parser = OneLineParser(prog="rlxviz", description="Make ML-compiler fusion visible.",
                                     epilog=EXIT_CODES_HELP)
    parser.add_argument("--version", action="version", version=f"rlxviz {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in SUBCOMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse `argv` (default `sys.argv[1:]`), run the subcommand, return its exit code.

    User errors print one line on stderr and return 2, as does running out of memory (`MemoryError`);
    argparse usage errors exit 2 as usual. Anything else (a bug: `InternalError`, `RecursionError`, an
    unexpected exception) prints one line naming it and returns 3; never a traceback.
    """
    global MODEL_TEXT
    from .session.text import ModelText

    parser = build_parser()
    args = parser.parse_args(argv)
    MODEL_TEXT = ModelText()
    _remember(*(v for v in vars(args).values() if isinstance(v, str)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # each warning once per place, recorded, never printed raw
        try:
            return _dispatch(args)
        finally:
            _report_warnings(args.command, caught)


def _report_warnings(command: str, caught: Sequence[warnings.WarningMessage]) -> None:
    """Python warnings raised while serving a command, as at most one line on stderr (never a file:line and
    source line): the first one's message, and how many more there were."""
    if not caught:
        return
    more = f" (and {len(caught) - 1} more warning(s))" if len(caught) > 1 else ""
    _warn(command, _one_line(str(caught[0].message)) + more)


def _dispatch(args: argparse.Namespace) -> int:
    """Run the subcommand; map its exceptions to one line on stderr and an exit code (see `main`)."""
    try:
        return int(args.func(args) or 0)
    except (CLIError, ValueError, KeyError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        _emit(f"rlxviz {args.command}: error: {_one_line(msg)}", sys.stderr)
        return EXIT_BAD_INPUT
    except MemoryError as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else "an allocation failed"
        _emit(f"rlxviz {args.command}: error: out of memory ({detail}); try a smaller model, --batch or --seq",
              sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rlxviz {args.command}: interrupted", file=sys.stderr)
        return 130
    except InternalError as e:
        _emit(f"rlxviz {args.command}: internal error: {_one_line(str(e))}", sys.stderr)
        return EXIT_INTERNAL
    except Exception as e:  # noqa: BLE001 - a bug: one line, exit 3, never a traceback
        _emit(f"rlxviz {args.command}: internal error: {type(e).__name__}: {_one_line(str(e))} "
              "(a bug in rlxviz; please report it with the command)", sys.stderr)
        return EXIT_INTERNAL


def _one_line(msg: object) -> str:
    """The first non-empty line of `msg`, at most 2000 characters."""
    text = str(msg).strip()
    if MODEL_TEXT is not None:  # a model name's line break is escaped, not taken for the message's end
        text = MODEL_TEXT.shown(text)
    line = text.splitlines()[0] if text else "(no message)"
    return line if len(line) <= 2000 else line[:1997] + "..."


if __name__ == "__main__":
    raise SystemExit(main())
