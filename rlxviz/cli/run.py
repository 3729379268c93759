"""`rlxviz run MODEL --inputs IN.npz -o OUT.npz`: run a model on the user's arrays and save its outputs."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from .args import _command, _device_arg, _expect_arg, _layers_arg
from .common import SubParsers, subcommand
from .loading import (
    _import_checks,
    _refuse_empty,
    _slice_aside,
    _slice_hint,
    _slice_model,
    _source,
    _static_shape,
    executor,
)
from .output import _emit, _output_file, _remember, _warn_nonfinite

BACKENDS = ("reference", "mlx")
"""Backends `run` knows: `reference` is the NumPy interpreter (the oracle), `mlx` the MLX runtime."""


def cmd_run(args: argparse.Namespace) -> int:
    """`rlxviz run MODEL --inputs IN.npz -o OUT.npz`: run a model and save `last_hidden_state`."""
    from ..session import Limits, OpenRequest, all_finite, check_workload, load_inputs, npz_headers, open_model
    from ..session.fidelity import output_names

    out = _output_file(args.output, "a .npz file name", (args.inputs, args.model))
    _slice_model(args)
    headers = npz_headers(args.inputs)  # names, shapes, dtypes: no array is read before the model checks them
    asked = OpenRequest(source=args.model, workload="run-mlx" if args.backend == "mlx" else "run",
                        label=_source(args), hint=_slice_hint(args))
    if args.model.lower().endswith(".onnx") and Path(args.model).is_file():  # every input's shape from the arrays
        shapes = {k: shape for k, (shape, _) in headers.items() if not k.startswith("out:")}
        _refuse_empty(args.inputs, shapes)
        request = replace(asked, kind="onnx-inputs", limits=Limits.resolve(args.max_memory_mb), input_shapes=shapes)
    else:
        batch, seq = _static_shape(headers, args.inputs)
        request = replace(asked, kind="built", batch=batch, seq=seq, style=args.style,
                          limits=Limits.resolve(args.max_memory_mb))
    model = open_model(request)
    _remember(model)  # before any message names its inputs
    check_workload(model, request)  # what the backend holds (the load checked the graph's own run), before running
    user = load_inputs(args.inputs, model.graph, aside=_slice_aside(args, model))  # as `time` and the app
    feeds = user.feeds
    checks = _import_checks(model, feeds, user, args.expect, max_memory_mb=args.max_memory_mb)
    outputs = executor(args.backend, args.device)(model.graph, feeds, model.weights)
    _warn_nonfinite("run", model, all_finite(outputs))
    # each output under the model's own name (an ONNX graph's, else last_hidden_state, output_1...), in its dtype
    names = output_names(model)
    named = {n: np.asarray(o, dtype=np.dtype(model.graph[i].dtype.numpy))
             for n, o, i in zip(names, outputs, model.graph.outputs, strict=True)}
    with out.open("wb") as f:  # an open file keeps numpy from appending `.npz` to the name
        np.savez(f, **named)
    if not args.quiet and args.layers is not None:  # a slice: what each array it wrote is, the stream first
        from ..models.onnx.slice import slice_outputs

        _emit(f"{model.name}: {args.backend} -> {out}, {len(names)} array{'s' if len(names) > 1 else ''}:", sys.stderr)
        for name, role in slice_outputs(args.model):
            a = named[name]
            _emit(f"  {name} {a.dtype} {'x'.join(map(str, a.shape))}: {role}", sys.stderr)
    elif not args.quiet:
        first = named[names[0]]
        shape = "x".join(map(str, first.shape))
        more = f"; {len(names) - 1} more: {', '.join(names[1:4])}{' ...' if len(names) > 4 else ''}" \
            if len(names) > 1 else ""
        _emit(f"{model.name}: {args.backend} -> {out} ({names[0]} {first.dtype} {shape}{more})", sys.stderr)
    for c in checks:
        if not args.quiet or not c.ok:
            _emit(f"{model.name}: {c.line()}", sys.stderr)
    return 0 if all(c.ok for c in checks) else 1


@subcommand
def add_run(sub: SubParsers) -> None:
    p = _command(sub, "run", cmd_run, "run a model on inputs from an .npz file",
                 """Run MODEL on IN.npz (input_ids, attention_mask: int64 [batch, seq]; or hidden_states float32
                 [batch, seq, hidden] for decoder blocks) and write last_hidden_state (float32 [batch, seq, hidden])
                 to OUT.npz. Batch and sequence length come from the inputs. For an .onnx MODEL, IN.npz holds one
                 array per graph input (by name), whose shapes fix the graph's.""")
    p.add_argument("model", metavar="MODEL", help="a preset name (e.g. minilm, bert-tiny, llama-block), a Hugging "
                                                   "Face BERT checkpoint folder (config.json + model.safetensors) "
                                                   "or an .onnx export")
    p.add_argument("--inputs", "-i", required=True, metavar="IN.npz", help="input arrays")
    p.add_argument("--output", "-o", required=True, metavar="OUT.npz",
                   help="where to write the outputs, each under its output name (last_hidden_state for a built "
                        "model; with --layers, the slice's outputs by their ONNX value names, the residual stream "
                        "first, each printed with what it is)")
    _expect_arg(p)
    p.add_argument("--backend", choices=BACKENDS, default="reference", help="executor (default: %(default)s)")
    _device_arg(p)
    p.add_argument("--style", choices=("hf", "rlx"), default="hf",
                   help="BERT graph form: Hugging Face primitives or RLX fused QKV (default: %(default)s)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    p.add_argument("--max-memory-mb", type=int, default=None, metavar="MIB",
                   help="refuse a run whose weights and live tensors would need more than MIB MiB, before allocating "
                        "them (default: $RLXVIZ_MAX_MEMORY_MB or 2048)")
    _layers_arg(p)
