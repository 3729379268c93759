"""Building what a command works on from its arguments: the model (a preset, a checkpoint folder, an `.onnx` export or
an IR file, or a slice of an export), the pipeline run on it, the executor, and version 0's checks against the
model itself."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .common import CLIError, InternalError
from .output import _emit, _remember

if TYPE_CHECKING:
    from ..models import Model
    from ..passes import Trace


def executor(backend: str, device: str | None = None) -> Callable[..., list[np.ndarray]]:
    """`run(graph, feeds, weights) -> outputs` for `backend` (MLX imported only when asked for); `device`
    (`cpu` / `gpu` / None: the GPU when present) applies to MLX only. Raises DeviceError (a ValueError)."""
    from .. import runtime

    if backend == "reference":
        if device is not None:
            raise CLIError("--device applies to --backend mlx (the NumPy reference runs on the CPU)")
        return runtime.run_reference
    from ..runtime.executor import MlxExecutor

    return MlxExecutor(device=device).run


def _static_shape(headers: dict[str, tuple[tuple[int, ...], np.dtype]], path: str) -> tuple[int, int]:
    """`(batch, seq)` from the header shape of `input_ids` (BERT-like models) or `hidden_states` (decoder blocks), as
    the app's Timing tab takes them (`session.inputs.shape_from_inputs`)."""
    from ..session.inputs import shape_from_inputs

    try:
        found = shape_from_inputs(headers, path)
    except ValueError as e:
        raise CLIError(str(e)) from None
    if found is None:
        raise CLIError(f"{path}: needs 'input_ids' and 'attention_mask' (int64 [batch, seq]); "
                       f"found {sorted(headers) or 'no arrays'}")
    return found


def _slice_aside(args: argparse.Namespace, model: Model) -> list[str]:
    """With `--layers`, the output names of the inputs file's `out:NAME` arrays that name no output of the slice
    (the whole model's: `load_inputs(..., aside=...)` leaves them unread), said in a note (the slice is checked
    against ONNX Runtime on the same slice); else none. Reads the file's headers only."""
    from ..session import npz_headers
    from ..session.fidelity import output_names
    from ..session.inputs import EXPECTED_PREFIX

    if getattr(args, "layers", None) is None or getattr(args, "inputs", None) is None:
        return []
    outs = output_names(model)
    aside = sorted(k.removeprefix(EXPECTED_PREFIX) for k in npz_headers(args.inputs)
                   if k.startswith(EXPECTED_PREFIX) and k.removeprefix(EXPECTED_PREFIX) not in outs)
    if aside:
        _emit(f"note: {', '.join(EXPECTED_PREFIX + k for k in aside)} of the inputs file set aside: {_source(args)} "
              f"ends at its own output(s) ({', '.join(outs)})", sys.stderr)
    return aside


def _import_checks(model: Model, feeds: dict[str, np.ndarray], user: Any, expect: str | None,
                   with_onnx: bool = True, max_memory_mb: int | None = None) -> list[Any]:
    """Version 0 against the model itself (`session.fidelity`): the ONNX file it came from (`with_onnx`), the
    `out:NAME` arrays of the inputs file (a slice's: those `_slice_aside` left), the `--expect` file. Raises
    CLIError for an unreadable --expect file or a name that is no output."""
    from ..session import Limits
    from ..session.fidelity import against_expected, import_checks, inputs_source, weighed
    from ..session.inputs import load_expected

    try:
        # the app's Timing tab shows the same checks for an inputs file (`session.fidelity.onnx_check`)
        out = import_checks(model, feeds, user.expected if user is not None else None,
                            inputs_source(user) if user is not None else "", Limits.resolve(max_memory_mb), with_onnx)
        if expect is not None:
            out.append(against_expected(model, feeds, load_expected(expect, model.graph), Path(expect).name))
    except ValueError as e:
        raise CLIError(str(e).splitlines()[0]) from None
    return weighed(out)  # an expected output that differs is blamed as the file's own run says


def _bound_shapes(args: argparse.Namespace) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
    """(dims, input shapes) from `--dim` and `--inputs` (read from the npz headers: no array is loaded); an
    `--inputs` file with input_ids / hidden_states also sets args.batch / args.seq, as `run` takes them. Input
    shapes are kept for an .onnx MODEL only. Raises CLIError for a --dim given twice with two values."""
    from ..session import npz_headers

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
            _refuse_empty(args.inputs, shapes)
    return dims, shapes


def _refuse_empty(path: str, shapes: dict[str, tuple[int, ...]]) -> None:
    """Raise CLIError when an array of the inputs file `path` is empty (an empty KV cache `[2, 2, 0, 16]`), saying
    why none can be (`ir.lint.NO_EMPTY_TENSORS`), before the import refuses its dimension."""
    from ..ir.lint import NO_EMPTY_TENSORS

    if (name := next((k for k, shape in shapes.items() if 0 in shape), None)) is not None:
        raise CLIError(f"{path}: {name!r} has shape {list(shapes[name])}: {NO_EMPTY_TENSORS}")


def _variant_layer(args: argparse.Namespace) -> tuple[int, str]:
    """The layer a `--variant` changes and the option that chose it: `--variant-layer` when given, else the one
    layer asked for (`explain --layer N`, `render --focus N`: the variant breaks the layer looked at), else 0 (named
    as `--variant-layer`, the option that changes it)."""
    for option in ("variant_layer", "layer", "focus"):
        if (layer := getattr(args, option, None)) is not None:
            return int(layer), "--" + option.replace("_", "-")
    return 0, "--variant-layer"


def _run_model(args: argparse.Namespace, allow_crashes: bool = False, workload: str = "load") -> tuple[Model, Trace]:
    """(Model, Trace) for the shared options, the model checked against the memory limit for `workload` (`time`:
    the oracle and MLX copies too; `Limits.check`) before the pipeline runs. Raises SessionError/CLIError for bad
    input, LimitError over the limit, and InternalError (exit 3) when a pass crashed, unless `allow_crashes`
    (`explain` prints its report first, then exits 3)."""
    from ..session import Limits, OpenRequest, VariantLayerError, check_workload, open_model, open_pipeline, open_trace
    from ..session.dimroles import override_notes

    if args.batch < 1 or args.seq < 1:
        raise CLIError(f"--batch and --seq must be >= 1, got {args.batch} and {args.seq}")
    if args.threshold is not None and args.threshold < 1:
        raise CLIError(f"--threshold must be a positive integer (tokens, batch*seq), got {args.threshold}")
    args.variant_layer, chosen_by = _variant_layer(args)
    asked = OpenRequest(source=args.model, style=args.style, variant=args.variant, variant_layer=args.variant_layer,
                        threshold=args.threshold, pipeline=args.pipeline, workload=workload, label=_source(args),
                        hint=_slice_hint(args))
    pipe = open_pipeline(asked)  # a misspelt pass is refused before any file is read
    dims, shapes = _bound_shapes(args)  # an --inputs file sets args.batch and args.seq
    request = replace(asked, batch=args.batch, seq=args.seq, dims=dims, input_shapes=shapes,
                      limits=Limits.resolve(args.max_memory_mb))
    try:
        model = open_model(request)
    except VariantLayerError as e:  # `--variant-layer 9: bert-tiny has layers 0-1`, naming the option used
        raise CLIError(e.said_as(chosen_by)) from None
    _remember(model)  # before a refusal names its inputs
    for note in override_notes(model.meta, dims, args.batch, args.seq, "--dim", {"batch": "--batch", "seq": "--seq"}):
        _emit(f"note: {note}", sys.stderr)  # the shape built is the dim's, not the option's (the app says the same)
    check_workload(model, request, held_once=_on_cpu(args))  # what `workload` copies, before the run
    trace = open_trace(model.graph, request, pipe)
    _remember(trace)
    crashed = [s.error for s in trace.steps if s.error]
    if crashed and not allow_crashes:
        raise InternalError(_crash_message(crashed))
    return model, trace


def _on_cpu(args: argparse.Namespace) -> bool:
    """Whether MLX runs on the CPU for this command (`--device`, else the GPU when MLX has one): there the weights
    read from an external-data file are held once for NumPy and MLX (`MlxExecutor._host_view`)."""
    from ..runtime.devices import resolve_device

    try:
        return resolve_device(getattr(args, "device", None)) == "cpu"
    except ValueError:  # an unavailable device: the run refuses it later, in its own words
        return False


def _slice_model(args: argparse.Namespace) -> None:
    """With `--layers`, replace `args.model` (an .onnx export) by the file of that slice (`models.onnx.slice`).
    Raises CLIError for a model that is no .onnx file or a range the file cannot be cut at."""
    if getattr(args, "layers", None) is None:
        return
    from ..models.onnx.slice import parse_layers, slice_layers

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
    from ..session.fidelity import SLICE_HINT

    if args is not None and getattr(args, "layers", None) is not None:
        return f"a shorter slice than --layers {args.layers} may fit"
    return SLICE_HINT


def _crash_message(crashed: Sequence[str]) -> str:
    """The one line of an internal error for the passes that raised (a bug in rlxviz: exit 3)."""
    more = f" (and {len(crashed) - 1} more)" if len(crashed) > 1 else ""
    return (f"a pass crashed{more}, its result discarded: {crashed[0].splitlines()[0]} "
            "(a bug in rlxviz; please report it)")
