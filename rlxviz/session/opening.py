"""One way into a model and its pipeline run for every front end: `open(OpenRequest(...)) -> Opened`.

The CLI (`rlxviz.cli.loading`) and the app (`rlxviz.app.runs`) used to compose "load a model, then build and run the
pipeline" each on its own, with the attention threshold passed twice (once to the pipeline as `fab_max_tokens`,
once to the loader for the over-threshold variant's sequence length). A request now carries every choice once;
`open` reads it in one order:

1. the pipeline (`open_pipeline`: the profile or pass list, with the variant's attention gate), so a misspelt pass
   is refused before any file is read;
2. the model (`open_model`: a preset, a checkpoint folder, an `.onnx` export, an IR file or IR text, in this process
   or in a child process for a user's file), then its memory for the request's workload (`check_workload`);
3. the run (`open_trace`: `run_pipeline`, cached by content).

A front end that shows the model before its run (the app draws the input graph first) calls the steps itself.

`rlxviz.session.open` is the function (the package exports it); this module is `rlxviz.session.opening`.

Example:
    >>> opened = open(OpenRequest(source="bert-tiny", seq=8))
    >>> opened.model.name, opened.trace.pipeline
    ('bert-tiny', 'canonical')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..models import PRESETS, Model
from ..passes import Pipeline, Trace
from .defaults import DEFAULT_BATCH, DEFAULT_SEQ
from .errors import SessionError
from .limits import Limits
from .pipeline import build_pipeline, run_pipeline
from .variants import effective_threshold, variant_named

if TYPE_CHECKING:
    from ..ir import Graph

Kind = Literal["auto", "ir-text", "built", "onnx-inputs"]
KINDS: tuple[str, ...] = ("auto", "ir-text", "built", "onnx-inputs")
"""How `OpenRequest.source` is read:

* `auto`: what `loading.load` makes of it (a preset, a checkpoint folder or its config.json, an `.onnx` export with
  symbolic dims bound to batch/seq, `dims` and `input_shapes`, or an IR file);
* `ir-text`: the source is IR text itself (`loading.load_ir_text`);
* `built`: a preset or a checkpoint folder only (`rlxviz run`, whose batch and seq come from the inputs file);
* `onnx-inputs`: an `.onnx` export whose every input shape is given by `input_shapes` (`rlxviz run`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenRequest:
    """Everything a front end asks of a model and its pipeline run, each choice once.

    Attributes:
        source: a preset name, a folder, a file path, or IR text (`kind="ir-text"`).
        kind: how `source` is read (`KINDS`).
        batch / seq: the static input shape (tokens) of a built or exported model; ignored for IR.
        style: `hf` / `rlx` BERT form (None: the preset's own).
        variant / variant_layer: a teaching variant (`models.VARIANTS`) and the layer it changes.
        threshold: the attention gate on batch*seq (tokens; None: the pipeline's own, or RLX's 64 for
            `over_threshold`). It sizes the over-threshold variant's sequence and gates `fuse_attention_block`.
        dims: values of an `.onnx` file's symbolic dims by name (`--dim`).
        input_shapes: shapes of some (`auto`) or all (`onnx-inputs`) of an `.onnx` file's inputs by name.
        pipeline: a profile (`canonical`, `rlx`), comma-separated pass names, or a sequence of pass names.
        pipeline_name: the name the trace shows for a pass list (None: `custom`).
        limits: the memory limits (None: `Limits.resolve()`, the environment or 2048 MiB).
        allowed_roots: folders a typed checkpoint or `.onnx` path must lie in (None: any).
        max_seq: cap on the over-threshold variant's raised sequence length (None: none).
        bounds: the most a dim of `dims` that sets the batch (`batch`) or sequence length (`seq`) may be, as pairs
            (the app's boxes' bounds; (): only the memory limit, as for `batch` / `seq` themselves).
        isolated: load a user's file in a child process stopped past its time or memory (`session.isolated`).
        workload: what the caller does with the model beyond loading it (`load`, `time`, `export`, `run`,
            `run-mlx`: `Limits.check`'s workloads), checked before the pipeline runs.
        label: how messages name the model (None: `source`; e.g. `MODEL --layers 0-3` for a slice).
        hint: what a workload refusal suggests when some weights stay in their file (e.g. a shorter slice).

    Raises:
        SessionError: an unknown `kind`.
    """

    source: str
    kind: Kind = "auto"
    batch: int = DEFAULT_BATCH
    seq: int = DEFAULT_SEQ
    style: str | None = None
    variant: str | None = None
    variant_layer: int = 0
    threshold: int | None = None
    dims: tuple[tuple[str, int], ...] = ()
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    pipeline: str | tuple[str, ...] = "canonical"
    pipeline_name: str | None = None
    limits: Limits | None = None
    allowed_roots: tuple[Path, ...] | None = None
    max_seq: int | None = None
    bounds: tuple[tuple[str, int], ...] = ()
    isolated: bool = False
    workload: str = "load"
    label: str | None = None
    hint: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SessionError(f"unknown source kind {self.kind!r}; known: {', '.join(KINDS)}")
        # mappings and lists as frozen tuples
        for name in ("dims", "bounds", "input_shapes", "allowed_roots", "pipeline"):
            value = getattr(self, name)
            if isinstance(value, Mapping):
                value = tuple((k, tuple(v) if name == "input_shapes" else v) for k, v in value.items())
            elif isinstance(value, list):
                value = tuple(Path(v) for v in value) if name == "allowed_roots" else tuple(value)
            object.__setattr__(self, name, value)

    @property
    def gate(self) -> int | None:
        """The batch*seq attention gate the pipeline runs with (`variants.effective_threshold`; None: the
        pipeline's own)."""
        return effective_threshold(variant_named(self.variant, self.variant_layer), self.threshold)

    @property
    def resolved_limits(self) -> Limits:
        return self.limits if self.limits is not None else Limits.resolve()


@dataclass(frozen=True, slots=True)
class Opened:
    """A request's model, the pipeline it ran and its trace."""

    model: Model
    pipeline: Pipeline
    trace: Trace


def open_pipeline(request: OpenRequest) -> Pipeline:
    """The checked pipeline of `request`, with its attention gate (`OpenRequest.gate`) as `fab_max_tokens`.

    Raises:
        PipelineError: an unknown pass or parameter, an empty list, a missing required pass.
    """
    gate = request.gate
    spec = list(request.pipeline) if isinstance(request.pipeline, tuple) else request.pipeline
    return build_pipeline(spec, {} if gate is None else {"fab_max_tokens": gate}, name=request.pipeline_name)


def open_model(request: OpenRequest) -> Model:
    """The model `request` names, checked against its limits for the graph's own run (`check_workload` checks
    `request.workload`).

    Raises:
        SessionError: what `loading.load` raises (unknown model, a variant where it does not apply, unreadable
            or invalid files, one line each); `StoppedError` for an isolated load stopped past its time or memory;
            `LimitError` over the memory limit; `IRSyntaxError` for IR text that does not parse.
    """
    from . import loading
    from .isolated import load_isolated

    r, limits = request, request.resolved_limits
    if r.kind == "ir-text":
        model = loading.load_ir_text(r.source, limits)
    elif r.kind == "built":
        model = _built(r, limits)
    elif r.kind == "onnx-inputs":
        model = _onnx_with_inputs(r, limits)
    elif r.isolated:
        model = load_isolated(r.source, r.batch, r.seq, r.style, r.variant, r.variant_layer, limits, r.threshold,
                              r.allowed_roots, r.max_seq, dims=r.dims, bounds=r.bounds)
    else:
        model = loading.load(r.source, r.batch, r.seq, r.style, r.variant, r.variant_layer, limits, r.threshold,
                             r.allowed_roots, r.max_seq, dims=dict(r.dims), input_shapes=dict(r.input_shapes),
                             bounds=dict(r.bounds))
    return model


def check_workload(model: Model, request: OpenRequest, *, held_once: bool = False) -> None:
    """Refuse `model` when `request.workload` (beyond the load `open_model` checked) would pass the memory limit:
    `Limits.check` on what the command copies (`time`: the oracle's and MLX's copies too), before anything is
    allocated for it. `held_once`: MLX runs on the CPU, where weights read from an external-data file are held once
    for NumPy and MLX (`MlxExecutor._host_view`), so `time` counts them once. Raises LimitError."""
    if request.workload == "load":
        return
    from ..models.onnx.weights import lazy_names

    lazy = lazy_names(model.weights)
    request.resolved_limits.check(model.graph, request.label or request.source, request.workload,
                                  hint=request.hint if lazy else "",
                                  shared=lazy if request.workload == "time" and lazy and held_once else ())


def _built(r: OpenRequest, limits: Limits) -> Model:
    """A preset or a checkpoint folder (`loading.load`, so its errors name the folder as `explain`'s do)."""
    from .loading import load, unknown_model

    if r.source in PRESETS or Path(r.source).is_dir():
        return load(r.source, batch=r.batch, seq=r.seq, style=r.style, limits=limits)
    if Path(r.source).exists():
        raise SessionError(f"{r.source}: run takes a preset name or a checkpoint folder, not a file")
    raise unknown_model(r.source, "nor an existing checkpoint folder")


def _onnx_with_inputs(r: OpenRequest, limits: Limits) -> Model:
    """An `.onnx` export with every input's shape from `input_shapes`. Raises SessionError (the importer's first
    line, naming the file)."""
    from ..models.onnx import OnnxImportError, load_onnx

    try:
        return load_onnx(r.source, input_shapes=dict(r.input_shapes), max_bytes=limits.max_bytes)
    except OnnxImportError as e:
        raise SessionError(str(e).splitlines()[0]) from None


def open_trace(graph: Graph, request: OpenRequest, pipeline: Pipeline | None = None) -> Trace:
    """`request`'s pipeline (or the `pipeline` already built from it) run on `graph` (`run_pipeline`, cached)."""
    return run_pipeline(graph, pipeline if pipeline is not None else open_pipeline(request))


def open(request: OpenRequest) -> Opened:
    """The pipeline, then the model, then the run of `request` (module docstring).

    Raises:
        PipelineError, SessionError, LimitError: as `open_pipeline`, `open_model` and `check_workload`; nothing runs
            after the first.
    """
    pipe = open_pipeline(request)
    model = open_model(request)
    check_workload(model, request)
    return Opened(model, pipe, open_trace(model.graph, request, pipe))


__all__ = ["KINDS", "OpenRequest", "Opened", "check_workload", "open", "open_model", "open_pipeline", "open_trace"]
