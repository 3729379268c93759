"""`AppState`: the app's single source of truth, a `param.Parameterized` with no Panel import.

Controls are parameters (model source, shapes, variant, pipeline, selected version, node, layer);
results are parameters too (`model`, `trace`, `timings`, `message`, `progress`), set by jobs that
run on a `Runner` (a worker thread in the app, inline in tests). Views read the state and call its
methods; nothing here knows about widgets.

Example:
    >>> from rlxviz.app.jobs import Runner
    >>> s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    >>> s.model.name
    'bert-tiny'
"""

from __future__ import annotations

import difflib
import hashlib
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import param

from .. import session
from ..ir import Graph, IRSyntaxError, format_graph
from ..models import VARIANTS, BertConfig, Model
from ..passes import CANONICAL_ORDER, DEFAULT_PARAMS, PASSES, PassStep, Trace, layer_of
from ..runtime.battery import EXPECTED_PREFIX
from ..runtime.devices import available_devices
from ..session import OVER_THRESHOLD, LayerStatus, Limits, SessionError, View
from ..session import render as drawing
from . import timeproc
from .jobs import Runner
from .sources import (
    ONNX_UPLOAD_NAME,
    SourceError,
    allowed_dirs,
    check_checkpoint_dir,
    check_ir_text,
    check_upload,
    store_upload,
)
from .views import AUTO, COLLAPSED, FOCUS, FULL, VIEWS
from .wording import explain_error, md_lines, scrub_paths, timing_hint

SHAPE_VARIANT = OVER_THRESHOLD
VARIANT_LABELS: dict[str, str] = {name: v.label for name, v in VARIANTS.items()}
"""Teaching variants, one click each (the labels of `models.VARIANTS`). All but `over_threshold` change one
layer of the model; `over_threshold` raises the sequence length so batch*seq exceeds the attention threshold."""

FULL_VIEW_LIMIT = 400
"""`auto` view: graphs with more nodes than this are drawn one box per layer."""
FULL_VIEW_LAYERS = 6
"""`auto` view: models with more layers than this are drawn one box per layer (a layer expands in place)."""

SOURCES = ("preset", "checkpoint", "upload", "ir")

RUNS = session.cache.LRUCache(maxsize=8)
"""Finished loads by (`AppState.model_key`, `AppState.pipeline_key`): a weak reference to the `Model` and its
`Trace`, shared read-only by every session of the process (neither is ever changed in place: a new variant or
pipeline is a new key and a new run). A new session whose settings were already run (the default model, which
`panel serve --warm` runs at server start) shows the run at once (`AppState.start_cached`), without a job or a
second round trip. The model is held weakly: its weights stay alive only while `session.MODELS` or a session
holds them, so this table adds no memory beyond the model cache's."""

NO_TIMING: dict[str, Any] = {"timings": [], "timing_policy": "", "blas": ""}
"""A new model or run shows no timing (rows, policy and input sets, where it ran) until it is timed."""

TIMING_RUNS = session.cache.LRUCache(maxsize=16)
"""The last timing runs (`timeproc.WorkerTiming`) by (trace key, data digest, repeat), for all sessions:
"Time every version" shows them, "Time again" measures anew."""


def move_position(order: list[str], off: list[int], i: int, delta: int) -> tuple[list[str], list[int]] | None:
    """(`order` with position `i` swapped with position `i + delta`, `off` positions renumbered so each pass keeps
    its on/off state), or None when either position is out of range."""
    j = i + delta
    if not (0 <= i < len(order) and 0 <= j < len(order)):
        return None
    moved = list(order)
    moved[i], moved[j] = moved[j], moved[i]
    swap = {i: j, j: i}
    return moved, sorted(swap.get(k, k) for k in off)


def import_check(model: Model) -> tuple[str, bool]:
    """(`session.fidelity.against_onnx`'s line on the model's random inputs, whether it equals), or why it could
    not run (a gather past its table at these shapes: not equal)."""
    from ..session.fidelity import against_onnx

    try:
        f = against_onnx(model, model.random_feeds(seed=0))
    except ValueError as e:
        return f"version 0 could not be checked against the ONNX model: {str(e).splitlines()[0]}", False
    return (f.line(), f.ok) if f is not None else ("", True)


class AppState(param.Parameterized):
    """Everything the app shows, and the actions that change it.

    Args:
        runner: where long work runs (default: a background worker thread).
        autorun: load the model and run the pipeline right away and on every change of a model or
            pipeline control (the app); False waits for `run()`.
    """

    # -- model ------------------------------------------------------------------------------------
    source = param.Selector(objects=list(SOURCES), default="preset", doc="Where the model comes from.")
    preset = param.Selector(objects=[], doc="Built-in model (see rlxviz.models.PRESETS).")
    checkpoint_dir = param.String("", doc="Hugging Face BERT checkpoint folder under RLXVIZ_ALLOWED_DIRS.")
    ir_text = param.String("", doc="IR text of a graph (typed or uploaded).")
    style = param.Selector(objects=["default", "rlx", "hf"], default="default",
                           doc="BERT graph style: fused-QKV RLX layers or Hugging Face primitives.")
    batch = param.Integer(session.DEFAULT_BATCH, bounds=(1, 64), doc="Batch size (default: as the CLI's).")
    seq = param.Integer(session.DEFAULT_SEQ, bounds=(2, 512), doc="Sequence length (tokens; default: as the CLI's).")
    text = param.String("rlxviz shows why a fusion did or did not happen.", doc="Text to tokenize for real models.")
    variant = param.Selector(objects=list(VARIANT_LABELS), default="none", doc="Teaching variant.")
    variant_layer = param.Integer(0, bounds=(0, None), doc="Layer the teaching variant changes.")

    # -- pipeline ---------------------------------------------------------------------------------
    passes = param.List(default=[], item_type=str, doc="Passes in the order they run (a pass may appear twice).")
    disabled = param.List(default=[], item_type=int, doc="Positions in `passes` that are switched off.")
    threshold = param.Integer(None, allow_None=True, bounds=(1, None),
                              doc="Attention-fusion threshold on batch*seq (None: the pipeline's default).")

    # -- navigation -------------------------------------------------------------------------------
    version = param.Integer(0, bounds=(0, None), doc="Index into `version_labels`.")
    hide_unchanged = param.Boolean(True, doc="Hide versions of passes that changed nothing.")
    view = param.Selector(objects=list(VIEWS), default=AUTO,
                          doc="Graph view: all nodes, one box per layer, or the selected layer only.")
    selected_node = param.Integer(None, allow_None=True, doc="Node id clicked in the graph.")
    selected_layer = param.Integer(None, allow_None=True, doc="Layer asked about in 'why didn't it fuse'.")
    expanded_layers = param.List(default=[], item_type=int,
                                 doc="Layers drawn open in place in the collapsed view (the others stay boxes).")
    highlight = param.List(default=[], item_type=int, doc="Node ids highlighted (a table row's match/rejection).")

    # -- results (set by jobs) --------------------------------------------------------------------
    model = param.ClassSelector(class_=Model, default=None, allow_None=True, doc="The loaded `Model`.")
    trace = param.ClassSelector(class_=Trace, default=None, allow_None=True, doc="The pipeline's `Trace`.")
    timings = param.List(default=[], doc="One dict per version: label, median_ms, speedup, max_err, ...")
    blas = param.String("", doc="Which BLAS MLX uses.")
    user_inputs = param.Parameter(None, doc="The user's input arrays (`runtime.battery.InputSet`) or None.")
    timing_policy = param.String("", doc="The precision policy and the input sets of the last timing run.")
    message = param.String("", doc="The last error or notice, in plain words with what to do.")
    stale = param.String("", doc="Why the panes show an older model or run than the controls ask for (the last load "
                                 "or pipeline run failed), in plain words; '' when they show what was asked.")
    message_kind = param.Selector(objects=["info", "success", "warning", "danger"], default="info")
    busy = param.Boolean(False, doc="A job is running.")
    progress = param.Integer(-1, bounds=(-1, 100), doc="Progress of the running job in % (-1: indeterminate).")
    progress_text = param.String("", doc="What the running job does.")
    upload_id = param.String("", doc="Content digest of the last accepted upload ('' for none). Its files are held in "
                                     "memory; a load writes them to a private temp folder and removes it when done.")
    ir_error = param.Parameter(None, doc="(line, column, reason) of the last IR text that did not parse or load "
                                         "(1-based; a lint error: the line defining the node it names), else None.")
    repeat = param.Integer(session.DEFAULT_REPEAT, bounds=(1, session.MAX_REPEAT),
                           doc="Timed interleaved rounds (each runs every version once), as `rlxviz time --repeat`.")
    warmup = param.Integer(session.DEFAULT_WARMUP, bounds=(0, session.MAX_WARMUP),
                           doc="Untimed rounds after the first call, as `rlxviz time --warmup`.")
    device = param.Selector(objects=[d.name for d in available_devices()],
                            default=available_devices()[0].name,
                            doc="MLX device the versions are timed on (`runtime.devices`; the GPU when present).")

    def __init__(self, runner: Runner | None = None, autorun: bool = True, **params: Any) -> None:
        self.param.preset.objects = list(session.presets())
        params.setdefault("preset", session.default_preset())
        super().__init__(**params)
        self.runner = runner or Runner()
        self.autorun = autorun
        self._model_key: tuple = ()
        self._shown_key: tuple = ()  # (model key, pipeline key) of the run the panes show
        self._generation = 0
        self._variant_notice = ""
        self._seq_raised: tuple[int, int] | None = None
        self._upload: dict[str, bytes] = {}  # the accepted upload's files (`load_upload`)
        self._upload_tmp = self._last_upload_tmp = ""  # the temp folder a load wrote them to (removed after it)
        if not self.passes:
            self.passes = self.canonical_passes()
        self._sync_shape_seq()
        if autorun:
            self.load()

    # ============================================================ model + pipeline (jobs)
    @property
    def effective_seq(self) -> int:
        """The sequence length the model is built with (raised above the threshold by `over_threshold`; the
        app also writes the raised value into `seq`, see `_sync_shape_seq`)."""
        need = self._needed_seq()
        return self.seq if need is None else max(self.seq, need)

    def _needed_seq(self) -> int | None:
        """The smallest sequence length that puts batch*seq over the threshold (within `seq`'s bounds) for the
        over-threshold variant, else None."""
        if self.variant != SHAPE_VARIANT or self.effective_threshold is None:
            return None
        return session.effective_seq(VARIANTS[self.variant], self.batch, 1, self.threshold, self.param.seq.bounds[1])

    def _sync_shape_seq(self) -> bool:
        """Make the over-threshold variant's sequence length visible: raise `seq` itself (so the control shows
        the real value) and put the old value back when the variant is left. True when `seq` changed."""
        need = self._needed_seq()
        if need is not None and self.seq < need:
            before = self._seq_raised[0] if self._seq_raised else self.seq
            self._seq_raised = (before, need)
            self.seq = need
            return True
        if need is None and self._seq_raised is not None:
            before, raised = self._seq_raised
            self._seq_raised = None
            if self.seq == raised and before != raised:
                self.seq = before
                return True
        return False

    def model_key(self) -> tuple:
        """What identifies the model: source, its content, shapes, style and variant."""
        v = self.variant
        if self.source == "preset":
            src: tuple = ("preset", self.preset)
        elif self.source == "checkpoint":
            src = ("checkpoint", self.checkpoint_dir)
        elif self.source == "upload":
            src = ("upload", self.upload_id)
        else:
            src = ("ir", self.ir_text)
            return src
        return (*src, self.batch, self.effective_seq, self.style, v, self.variant_layer)

    def pipeline_key(self) -> tuple:
        return (tuple(self.enabled_passes), self.effective_threshold)

    @property
    def enabled_passes(self) -> list[str]:
        """The passes that run, in order."""
        return [p for i, p in enumerate(self.passes) if i not in self.disabled]

    @property
    def effective_threshold(self) -> int | None:
        """The batch*seq attention gate passed to the pipeline (RLX's 64 for the over-threshold variant
        when no threshold is set)."""
        return session.effective_threshold(VARIANTS[self.variant], self.threshold)

    def toggle_pass(self, i: int, enabled: bool) -> None:
        """Switch pass position `i` on or off."""
        off = set(self.disabled)
        off.discard(i) if enabled else off.add(i)
        self.disabled = sorted(off)

    def move_pass(self, i: int, delta: int) -> None:
        """Move pass position `i` up (-1) or down (+1), keeping its on/off state."""
        if (moved := move_position(self.passes, self.disabled, i, delta)) is not None:
            self.param.update(passes=moved[0], disabled=moved[1])

    def remove_pass(self, i: int) -> None:
        """Drop pass position `i` from the pipeline."""
        if 0 <= i < len(self.passes):
            self.param.update(passes=self.passes[:i] + self.passes[i + 1:],
                              disabled=[k - (k > i) for k in self.disabled if k != i])

    def add_pass(self, name: str) -> None:
        """Append pass `name` (enabled). Raises ValueError for an unknown pass."""
        known = self.available_passes()
        if known and name not in known:
            raise ValueError(f"unknown pass {name!r}; known: {', '.join(known)}")
        self.passes = [*self.passes, name]

    def _load_model(self) -> Model:
        limits = Limits.resolve()
        if self.source == "ir":
            return session.load_ir_text(check_ir_text(self.ir_text), limits)
        roots = None
        if self.source == "preset":
            where = self.preset
        elif self.source == "checkpoint":
            roots = check_checkpoint_dir(self.checkpoint_dir, allowed_dirs())
            where = self.checkpoint_dir
        else:
            if not self._upload:
                raise SourceError("Upload a checkpoint's config.json and model.safetensors (or an .onnx file) first.")
            where = self._upload_tmp = str(store_upload(self._upload))  # removed when the load ends (`_load_job`)
            if (onnx_file := Path(where) / ONNX_UPLOAD_NAME).is_file():
                where = str(onnx_file)
        # a file a user brings loads in a child process killed past its wall time (`session.isolated`)
        return session.load_isolated(where, self.batch, self.effective_seq,
                                     None if self.style == "default" else self.style, self.variant,
                                     self.variant_layer, limits, self.threshold, roots)

    def _run_pipeline(self, model: Model) -> Trace:
        pipe = session.build_pipeline(self.enabled_passes, {"fab_max_tokens": self.effective_threshold}, name="app")
        return session.run_pipeline(model.graph, pipe)

    def load(self) -> None:
        """Load the model (if its key changed) and run the pipeline, as one job."""
        self._generation += 1
        gen = self._generation
        self.runner.submit("load", lambda: self._load_job(gen))

    run = param.Action(lambda self: self.load(), doc="Re-run the pipeline.")

    def start_cached(self) -> bool:
        """Show the run another session already finished for these settings (`RUNS`) at once, in the caller's
        thread and without a job; autorun is then on. False (nothing changed) when there is none: call `load`."""
        key = self.model_key()
        hit = RUNS.get((key, self.pipeline_key()))
        model = hit[0]() if hit is not None else None
        if model is None:
            return False
        trace = hit[1]
        self._model_key = key
        self._set_trace(trace, model)
        self._notice_variant()
        self.autorun = True
        return True

    def _load_job(self, gen: int) -> None:
        """Load and run in the runner's thread; every change of the state (progress, the new trace, a failure)
        is made on the page's thread (`Runner.on_page`), as one step, so the page sees them in order."""
        page = self.runner.on_page
        page(lambda: self._start("Loading the model…"))
        done = False
        try:
            key = self.model_key()
            pipeline_key = self.pipeline_key()
            model = self._load_model() if key != self._model_key or self.model is None else self.model
            if gen != self._generation:
                return
            checked = None
            if model is not self.model and model.meta.get("onnx_file"):  # does version 0 equal the file itself?
                page(lambda: self._set_progress(30, "Checking version 0 against the ONNX model…"))
                checked = import_check(model)
            page(lambda: self._set_progress(40, "Running the fusion pipeline…"))
            try:
                trace = self._run_pipeline(model)
            except SessionError:
                if model is not self.model:
                    page(lambda: self._show_model(key, model))
                raise
            if gen != self._generation:
                return
            self._draw_ahead(trace)  # here, so that the page's thread finds the pictures it shows drawn

            def show() -> None:
                self.ir_error = None
                new = model is not self.model
                if new:
                    self._model_key = key
                # model and trace change together: views never see the new model with the old trace
                self._set_trace(trace, model if new else None)
                self._notice_variant()
                if checked is not None:  # the CLI's line, word for word (`session.fidelity`)
                    self.param.update(message=checked[0], message_kind="info" if checked[1] else "danger")
                self._set_progress(80, "Drawing the graph…")

            page(show)
            self._draw_shown()
            RUNS.put((key, pipeline_key), (weakref.ref(model), trace))
            done = True
        except Exception as e:  # noqa: BLE001 - every failure becomes a message; the app keeps working
            page(lambda err=e: self._failed(err))
        finally:
            self._remove_upload_copy()
            page(self._stop)
        if done:  # after the job: the page is usable while the other versions are drawn
            self.runner.submit("prerender", lambda: self.prerender(gen))

    def _show_model(self, key: tuple, model: Model) -> None:
        """The new model, whose pipeline run failed: shown without a trace."""
        self._model_key = key
        self.param.update(model=model, trace=None, selected_node=None, highlight=[], **NO_TIMING)

    def _failed(self, e: Exception) -> None:
        # a syntax error's place, or the line defining the node a lint error names: the editor marks it
        at = (e.line, e.col, e.reason) if isinstance(e, IRSyntaxError | session.GraphTextError) and e.line else None
        self.ir_error = at if self.source == "ir" else None
        self._error(explain_error(e, self.source, self.preset))
        self.stale = self._stale_reason()

    def _draw_ahead(self, trace: Trace) -> None:
        """Draw the version `_set_trace(trace)` will select (after, and before its pass) into the cache, from the
        runner's thread: the views then draw it from the cache. A guess (the variant notice may still change the
        selected layer): a miss is drawn by the view."""
        try:
            labels = self._visible(trace)
            k = max(min(self.version, len(labels) - 1) if self.trace is None else self._same_version(trace, labels),
                    0)
            view = self.resolved_view(trace)
            drawing.svg(*self._drawing(k, view, trace=trace))
            if labels[k][0] > 0:
                drawing.svg(*self._drawing(k, view, side="before", trace=trace))
        except Exception:  # noqa: BLE001 - the view shows the error
            pass

    def _stale_reason(self) -> str:
        """After a failed load or run: what the panes still show instead of what the controls ask for ('' when
        they show nothing, or the new model's graph with no run)."""
        if self.model is None:
            return ""
        name = self.model.name
        if self._model_key != self.model_key():
            return (f"Stale: showing the previous model ({name}); loading the new one failed (see the message "
                    "above). Fix the input or go back to a model that loads.")
        if self.trace is not None and self._shown_key != (self._model_key, self.pipeline_key()):
            return (f"Stale: showing the previous pipeline run of {name}; the new pipeline failed (see the message "
                    "above). Change the pipeline and apply again.")
        return ""

    def _set_trace(self, trace: Trace, model: Model | None = None) -> None:
        """Show `trace` (and `model`, when it is new) in one update."""
        labels = self._visible(trace)
        version = min(self.version, len(labels) - 1) if self.trace is None else self._same_version(trace, labels)
        new = {"model": model, "selected_node": None} if model is not None else {}
        self.param.version.bounds = (0, max(len(labels) - 1, 0))
        self.param.update(**new, trace=trace, version=max(version, 0), highlight=[], stale="", **NO_TIMING)
        self._shown_key = (self._model_key, self.pipeline_key())
        errors = [s for s in trace.steps if s.error]
        if errors:
            s = errors[0]
            more = f" (and {len(errors) - 1} more pass(es))" if len(errors) > 1 else ""
            self._error(f"Pass {s.pass_name} CRASHED{more}: an internal error, so its result was discarded and the "
                        f"pipeline went on with the graph before it; the fusion report is incomplete:\n{s.error}\n"
                        "Disable or move that pass (Pipeline) and re-run, and report the bug with the IR (IR tab).",
                        kind="danger")
        elif self.message_kind == "danger":
            self.param.update(message="", message_kind="info")

    def _same_version(self, trace: Trace, labels: list[tuple[int, str]]) -> int:
        """Keep the selected version's pass when re-running (else the nearest earlier one)."""
        old = self.version_labels[self.version] if self.version < len(self.version_labels) else "input"
        names = [lbl for _, lbl in labels]
        return names.index(old) if old in names else min(self.version, len(names) - 1)

    def _notice_variant(self) -> None:
        """Say which guard the teaching variant trips (and clear the last variant's notice when it no longer
        applies, e.g. after "none (as built)")."""
        stale = bool(self._variant_notice) and self.message == self._variant_notice
        if self.variant == "none" or self.trace is None:
            if stale:
                self.param.update(message="", message_kind="info")
            self._variant_notice = ""
            return
        layer = None if self.variant == SHAPE_VARIANT else self.variant_layer
        rej = [r for r in self.trace.rejections if layer is None or r.layer == layer]
        label = VARIANT_LABELS[self.variant]
        shape = ""
        if self.variant == SHAPE_VARIANT and self.effective_threshold is not None:
            b, sq, limit = self.batch, self.effective_seq, self.effective_threshold
            raised = (f"The sequence length was raised from {self._seq_raised[0]} to {sq} (see Sequence length) so "
                      if self._seq_raised else "")
            over = "is over" if b * sq > limit else "is still not over"
            shape = f" {raised}batch*seq = {b}*{sq} = {b * sq} {over} the attention threshold {limit}."
        status = self.layer_status(layer) if layer is not None and layer in self.layers() else None
        if status is not None and status.first is not None:  # the Why tab's answer, word for word
            first = status.first
            shown = next((r for r in rej if (r.rule, r.guard) == (first.rule, first.guard)), None)
            self.param.update(selected_layer=layer, highlight=list(
                (shown.offending or (shown.anchor,)) if shown is not None else first.nodes))
            verdict = "fused" if status.fused else "NOT fused"
            text = (f"Teaching variant '{label}':{shape} layer {layer} {verdict}; first rejection {first.rule} at "
                    f"guard {first.guard}: {first.message}")
        elif rej:
            first = rej[0]
            self.param.update(selected_layer=layer if layer is not None else first.layer,
                              highlight=list(first.offending or (first.anchor,)))
            text = (f"Teaching variant '{label}':{shape} {first.pass_name} rejected at guard {first.guard}: "
                    f"{first.message}")
        else:
            where = "" if layer is None else f" in layer {layer}"
            text = f"Teaching variant '{label}':{shape} no pass rejected anything{where}."
        self._variant_notice = text
        self.param.update(message=text, message_kind="info")

    # ============================================================ upload / IR / variants
    def load_upload(self, files: dict[str, bytes]) -> None:
        """Accept an uploaded `config.json` + `model.safetensors` or one `.onnx` file (size-limited) and load it.

        The files stay in memory (`upload_id` is their digest); each load writes them to a private temp folder and
        removes it when the load ends, failed or not, so no upload outlives its session on the server's disk."""
        try:
            checked = check_upload(files)
        except SourceError as e:
            self._error(str(e))
            return
        h = hashlib.sha256()
        for name in sorted(checked):
            h.update(f"{name}:{len(checked[name])};".encode())
            h.update(checked[name])
        self._upload = checked
        # a new model starts as built: a teaching variant of the last one would refuse an ONNX file (a variant, then
        # a dropped gpt2.onnx, showed an error and the old model)
        self.param.update(upload_id=h.hexdigest()[:24], source="upload", variant="none")

    def _remove_upload_copy(self) -> None:
        """Remove the temp folder the last load wrote the upload to (none: nothing to do)."""
        if self._upload_tmp:
            shutil.rmtree(self._upload_tmp, ignore_errors=True)
            self._last_upload_tmp, self._upload_tmp = self._upload_tmp, ""

    def variant_unavailable(self, name: str) -> str:
        """Why teaching variant `name` does not apply to the current model, in plain words ('' when it does).

        The service's rule (`session.variant_unavailable`), as `load` refuses: every variant, the over-threshold
        one too, applies to BERT presets and checkpoints only (not IR text, ONNX exports, or other architectures
        such as the LLaMA block or GPT-2).
        """
        if name == "none":
            return ""
        if self.source == "ir":
            return ("Teaching variants change a built BERT graph; they do not apply to IR text. Switch the source "
                    "to Built-in (or Folder/Upload) to try one, or edit the IR.")
        if self.source == "preset":
            return session.variant_unavailable(name, "preset", self.preset, session.preset_is_bert(self.preset))
        if self.model is None:
            return ""
        if "onnx_file" in self.model.meta:
            return session.variant_unavailable(name, "onnx", self.model.name, False)
        return session.variant_unavailable(name, "checkpoint", self.model.name,
                                           isinstance(self.model.config, BertConfig))

    def apply_variant(self, name: str) -> None:
        """One click: switch to teaching variant `name` and re-run. A variant that does not apply to the current
        model (`variant_unavailable`) only says why."""
        reason = self.variant_unavailable(name)
        if reason:
            self._error(reason, "warning")
            return
        self.variant = name

    @param.depends("source", "preset", watch=True)
    def _drop_inapplicable_variant(self) -> None:
        """Switching to IR text or to a model the variant does not apply to drops the variant (and says so)."""
        reason = self.variant_unavailable(self.variant)
        if reason:
            self.variant = "none"
            self._error(f"Teaching variant dropped: {reason}", "warning")

    @param.depends("source", "preset", "checkpoint_dir", "ir_text", "style", "batch", "seq", "variant",
                   "variant_layer", "passes", "disabled", "threshold", "upload_id", watch=True)
    def _reload(self) -> None:
        if self._sync_shape_seq():
            return  # the seq change reloads
        if self.autorun:
            self.load()

    # ============================================================ pipeline
    def canonical_passes(self) -> list[str]:
        """The pipeline's canonical pass order."""
        return list(CANONICAL_ORDER)

    def available_passes(self) -> list[str]:
        """Every pass a user may add."""
        return list(PASSES)

    def default_threshold(self) -> int | None:
        """The canonical pipeline's attention gate on batch*seq (`fab_max_tokens`; None = no gate)."""
        return DEFAULT_PARAMS.get("fab_max_tokens")

    def reset_pipeline(self) -> None:
        """Canonical order, every pass enabled, default threshold."""
        self.param.update(passes=self.canonical_passes(), disabled=[], threshold=None)

    # ============================================================ versions
    def _visible(self, trace: Trace) -> list[tuple[int, str]]:
        """(index into trace.versions(), label) of the versions shown (memoized per trace content and setting)."""
        key = (trace.key, self.hide_unchanged)
        memo = getattr(self, "_visible_memo", None)
        if memo is not None and memo[0] == key:
            return memo[1]
        out = self._compute_visible(trace, self.hide_unchanged)
        self._visible_memo = (key, out)
        return out

    @staticmethod
    def _compute_visible(trace: Trace, hide: bool) -> list[tuple[int, str]]:
        out = []
        for k, (label, _g) in enumerate(trace.versions()):
            step = trace.steps[k - 1] if k else None
            # a crash stays shown, and so does a pass whose only events are rejections (the one an engineer looks for)
            if step is None or not hide or step.changed or step.error or any(not r.soft for r in step.rejections):
                out.append((k, label))
        return out

    @param.depends("hide_unchanged", watch=True)
    def _rebound(self) -> None:
        if self.trace is None:
            return
        before = self._compute_visible(self.trace, not self.hide_unchanged)
        old = before[self.version][1] if self.version < len(before) else "input"
        labels = self._visible(self.trace)
        self.param.version.bounds = (0, max(len(labels) - 1, 0))
        names = [lbl for _, lbl in labels]
        self.version = names.index(old) if old in names else 0

    @property
    def version_labels(self) -> list[str]:
        """Labels of the shown versions: "input", "after fuse_matmul_bias_act", ..."""
        return [lbl for _, lbl in self._visible(self.trace)] if self.trace is not None else []

    def version_index(self, k: int | None = None, trace: Trace | None = None) -> int:
        """Index into `trace.versions()` of shown version `k` (default: the selected one) of `trace` (default:
        the state's trace)."""
        trace = self.trace if trace is None else trace
        vis = self._visible(trace) if trace is not None else [(0, "input")]
        k = self.version if k is None else k
        return vis[min(k, len(vis) - 1)][0]

    def graph_at(self, k: int | None = None) -> Graph | None:
        """The graph of shown version `k` (default: the selected one)."""
        if self.trace is None:
            return self.model.graph if self.model is not None else None
        return self.trace.versions()[self.version_index(k)][1]

    @property
    def current_graph(self) -> Graph | None:
        return self.graph_at()

    @property
    def previous_graph(self) -> Graph | None:
        """The graph before the selected version's pass (the version itself for the input)."""
        if self.trace is None:
            return self.current_graph
        i = self.version_index()
        return self.trace.versions()[max(i - 1, 0)][1]

    @property
    def current_step(self) -> PassStep | None:
        """The `PassStep` that produced the selected version (None for the input)."""
        i = self.version_index() if self.trace is not None else 0
        return self.trace.steps[i - 1] if i > 0 else None

    def step_to(self, label: str) -> None:
        """Select the shown version with `label` (e.g. "after fuse_transformer_layer").

        Raises:
            ValueError: no shown version has that label.
        """
        labels = self.version_labels
        if label not in labels:
            raise ValueError(f"no version {label!r}; shown: {labels}")
        self.version = labels.index(label)

    def version_rows(self) -> list[dict[str, Any]]:
        """One row per shown version: label, compute-node count, fused-node count, change in nodes, the pass's
        matches and (hard) rejections."""
        if self.trace is None:
            return []
        versions = self.trace.versions()
        rows = []
        for k, (i, label) in enumerate(self._visible(self.trace)):
            g = versions[i][1]
            n = len(g.compute_nodes())
            prev = len(versions[i - 1][1].compute_nodes()) if i else n
            step = self.trace.steps[i - 1] if i else None
            rows.append({"#": k, "version": label, "nodes": n, "change": n - prev,
                         "matches": len(step.matches) if step else 0,
                         "rejections": sum(not r.soft for r in step.rejections) if step else 0,
                         "crashed": bool(i and self.trace.steps[i - 1].error),
                         "fused": sum(1 for x in g if x.pass_name), "ms": (self.trace.steps[i - 1].seconds * 1e3
                                                                          if i else 0.0)})
        return rows

    # ============================================================ text views
    def ir_current(self) -> str:
        g = self.current_graph
        return format_graph(g) if g is not None else ""

    def ir_diff(self) -> str:
        """Unified diff (difflib) of the selected version's IR against the version before it."""
        cur, prev = self.current_graph, self.previous_graph
        if cur is None or prev is None or cur is prev:
            return ""
        step = self.current_step
        name = step.pass_name if step is not None else "input"
        return "".join(difflib.unified_diff(format_graph(prev).splitlines(True), format_graph(cur).splitlines(True),
                                            f"before {name}", f"after {name}", n=1))

    def trace_json(self) -> str:
        return self.trace.to_json(graphs=True, indent=1) if self.trace is not None else "{}"

    # ============================================================ rendering
    def _drawing(self, k: int | None, view: str, side: str = "after",
                 trace: Trace | None = None) -> tuple[Trace | Graph, View]:
        """What to draw for shown version `k` in the app's `view` (`full`, `collapsed`, `focus`): the source
        (the trace, or the bare model graph before a run) and the session's `View`.

        Raises:
            ValueError: no model loaded yet, or `focus` with no layer selected.
        """
        trace = self.trace if trace is None else trace
        source: Trace | Graph | None = trace if trace is not None else (
            self.model.graph if self.model is not None else None)
        if source is None:
            raise ValueError("no model loaded yet")
        i = self.version_index(k, trace) if trace is not None else 0
        focus = self.selected_layer if view == FOCUS or side == "why" else None
        if view == FOCUS and focus is None:
            raise ValueError("pick a layer to focus on")
        expanded = tuple(sorted(set(self.expanded_layers))) if view == COLLAPSED else ()
        return source, View(i, "layers" if view == COLLAPSED else "full", side, focus, expanded)

    def render_key(self, k: int | None = None, view: str | None = None) -> tuple:
        """Cache key of a drawing, derived from the graph it draws: the trace's content key (`Trace.key`), the
        version index, the view (and layer for `focus`)."""
        source, v = self._drawing(k, view or self.resolved_view())
        return ("svg", drawing.source_key(source), v)

    def resolved_view(self, trace: Trace | None = None) -> str:
        """`auto` is the full graph for small models, one box per layer for big ones: more than
        `FULL_VIEW_LIMIT` nodes or `FULL_VIEW_LAYERS` layers in the run's input graph (decided once per run,
        so stepping through versions never switches the view)."""
        if self.view != AUTO:
            return self.view
        trace = self.trace if trace is None else trace
        g = trace.input if trace is not None else (self.model.graph if self.model is not None else None)
        if g is None:
            return FULL
        big = len(g) > FULL_VIEW_LIMIT or len(session.model_layers(g)) > FULL_VIEW_LAYERS
        return COLLAPSED if big else FULL

    def toggle_layer(self, layer: int) -> None:
        """A click on layer `layer` in the collapsed view: expand it in place, or fold it back when it is open;
        it also becomes the selected layer (the one "focus" and "why didn't layer N fuse?" show)."""
        open_ = [i for i in self.expanded_layers if i != layer]
        if layer not in self.expanded_layers:
            open_.append(layer)
        self.param.update(expanded_layers=open_, selected_layer=layer)

    def dot(self, k: int | None = None, view: str | None = None) -> str:
        """DOT source of shown version `k` in `view`, with the pass's overlay."""
        return drawing.dot(*self._drawing(k, view or self.resolved_view()))

    def svg(self, k: int | None = None, view: str | None = None) -> str:
        """SVG of shown version `k` with its pass's fused nodes marked (cached by trace content, version, view)."""
        return drawing.svg(*self._drawing(k, view or self.resolved_view()))

    def svg_before(self, k: int | None = None, view: str | None = None) -> str:
        """SVG of the graph before version `k`'s pass, with its matches clustered and rejections marked."""
        return drawing.svg(*self._drawing(k, view or self.resolved_view(), side="before"))

    def _draw_shown(self) -> None:
        """Render the selected version's SVGs (after, and before its pass) into the cache."""
        try:
            self.svg()
            if self.current_step is not None:
                self.svg_before()
        except Exception:  # noqa: BLE001 - the view shows the error
            pass

    def prerender(self, gen: int | None = None) -> None:
        """Render every shown version's SVGs (before and after) into the cache, so stepping is a lookup. Runs as
        its own job after a load; stops as soon as a newer load (`gen` no longer current) is asked for."""
        for k in range(len(self.version_labels)):
            if gen is not None and gen != self._generation:
                return
            try:
                self.svg(k)
                if k:
                    self.svg_before(k)
            except Exception:  # noqa: BLE001 - the view shows the error when this version is selected
                pass

    # ============================================================ decisions, layers, timing
    def show_decision(self, row: dict[str, Any]) -> None:
        """Select the version a table row's pass produced and highlight the row's nodes (in the collapsed
        overview, the layers holding them are expanded in place, so the highlighted nodes are drawn)."""
        labels = self.version_labels
        target = f"after {row['pass']}"
        if self.hide_unchanged and target not in labels:
            self.hide_unchanged = False
            labels = self.version_labels
        if target in labels:
            self.version = labels.index(target)
        nodes = [int(i) for i in row["nodes"]]
        expanded = list(self.expanded_layers)
        if self.resolved_view() == COLLAPSED:
            graphs = [g for g in (self.previous_graph, self.current_graph) if g is not None]
            paths = [g[i].path for i in nodes for g in graphs if i in g]
            expanded += [k for k in dict.fromkeys(map(layer_of, paths)) if k is not None and k not in expanded]
        self.param.update(highlight=nodes, expanded_layers=expanded,
                          selected_layer=row["layer"] if row["layer"] is not None else self.selected_layer)

    def layers(self) -> list[int]:
        """Layer indices found in the input graph's provenance."""
        g = self.trace.input if self.trace is not None else (self.model.graph if self.model else None)
        return session.model_layers(g) if g is not None else []

    def layer_status(self, layer: int) -> LayerStatus:
        """The session's status of `layer` in the current run (`session.layer_status`).

        Raises:
            SessionError: no run yet, or no such layer.
        """
        if self.trace is None:
            raise SessionError("no pipeline run yet: load a model first")
        session.check_layer(self.trace, layer, self.model.name if self.model is not None else "")
        return session.layer_status(self.trace, layer)

    def why_layer(self, layer: int) -> str:
        """"Why didn't layer N fuse?" as Markdown: the session's text (`LayerStatus.render`, the same the CLI
        prints), every line escaped, under a heading."""
        return f"### Layer {layer}\n\n" + md_lines(self.layer_status(layer).render(verbose=True))

    def why_graph(self) -> str:
        """The Why tab for a graph without layer paths, as Markdown: the whole-graph answer `rlxviz explain` prints
        for it (`session.check_fusion`: the graph kind and its evidence, each missed fusion with its guard), every
        line escaped.

        Raises:
            SessionError: no run yet.
        """
        if self.trace is None:
            raise SessionError("no pipeline run yet: load a model first")
        text = session.check_fusion(self.trace, self.model.name if self.model is not None else "").render(verbose=True)
        return "### The whole graph (no node path names a layer)\n\n" + md_lines(text)

    def svg_why(self) -> str:
        """The selected layer, focused, in the graph before the pass that first rejected something in it."""
        return drawing.svg(*self._drawing(None, FOCUS, side="why"))

    def time_all(self, fresh: bool = False) -> None:
        """Time every version on MLX (a job with progress); fills `timings` and `blas`.

        Args:
            fresh: measure again even when this model, pipeline and setting were timed before.
        """
        self.runner.submit("time", lambda: self._time_job(fresh))

    def _time_job(self, fresh: bool = False) -> None:
        """Time in the timing process; the state changes are made on the page's thread (`Runner.on_page`)."""
        page = self.runner.on_page
        if self.trace is None or self.model is None:
            page(lambda: self._error("Nothing to time yet: load a model and run the pipeline first.", kind="warning"))
            return
        page(lambda: self._start(f"Timing every version on MLX in the timing process ({self.repeat} interleaved "
                                 "rounds)… (the page holds still meanwhile: an animation would take CPU time from "
                                 "the measurement)", still=True))
        trace, model = self.trace, self.model  # one consistent pair, even if a reload is queued
        try:
            Limits.resolve().check(model.graph, model.name, "time")  # what timing holds, as `rlxviz time` checks
            user = self.user_inputs if self._inputs_fit(model) else None
            feeds = user.feeds if user is not None else session.feeds(model, self.text)
            sets = session.input_sets(model.graph, feeds, user)  # the user's arrays first, then the battery
            key = ("timing", trace.key, session.timing.arrays_digest(feeds, model.weights), user is not None,
                   self.warmup, self.repeat, self.device)
            run = None if fresh else TIMING_RUNS.get(key)
            if run is None:
                run = TIMING_RUNS.put(key, timeproc.time_in_worker(trace, feeds, model.weights, warmup=self.warmup,
                                                                   repeat=self.repeat, device=self.device,
                                                                   inputs=sets))
            policy = next((r.policy for r in run.rows if r.policy is not None), None)
            where = next((r.context for r in run.rows if r.context is not None), None)
            # device, precision policy (f32 / TF32), BLAS and its threads, and where the timing ran
            page(lambda: self.trace is trace and self.param.update(  # not over a newer run's tab
                timing_policy=(policy.describe() + "\n\n" if policy else "") + sets.describe(),
                blas=(f"{where if where is not None else 'MLX'}; {self.repeat} interleaved round(s) per version, "
                      f"in a worker process (pid {run.pid}), as `rlxviz time --repeat {self.repeat}`"),
                timings=self._timing_rows(run.rows, self._visible(trace))))
        except Exception as e:  # noqa: BLE001
            text = f"Timing failed: {type(e).__name__}: {e}\n{timing_hint(e)}"
            page(lambda: self._error(text))
        finally:
            page(self._stop)

    def set_user_inputs(self, data: bytes | None, filename: str = "inputs.npz") -> None:
        """Use the arrays of an uploaded `.npz` (one per graph input, by name) in the next timing run, or
        drop them (`data=None`). A bad file is a message, never a traceback."""
        if not data:
            self.user_inputs = None
            return
        if self.model is None:
            self._error("Load a model first: its graph decides which input arrays it takes.", kind="warning")
            return
        try:
            self.user_inputs = session.load_inputs(data, self.model.graph, filename)
            aside = [k for k in session.npz_headers(data, filename) if k.startswith(EXPECTED_PREFIX)]
            if aside:
                self.param.update(message=f"{filename}: the next timing runs on its arrays; set aside "
                                          f"{len(aside)} expected output(s): {', '.join(aside)}.", message_kind="info")
        except ValueError as e:
            self.user_inputs = None
            self._error(str(e), kind="warning")

    @param.depends("model", watch=True)
    def _drop_user_inputs(self) -> None:
        """Arrays uploaded for one model are not the next model's: a new model starts on its own inputs."""
        self.user_inputs = None

    def _inputs_fit(self, model: Model) -> bool:
        """The uploaded arrays still match `model`'s inputs (the model may have changed since)."""
        u = self.user_inputs
        if u is None:
            return False
        ok = {n.attrs["name"]: n.shape for n in model.graph.inputs} == {k: v.shape for k, v in u.feeds.items()}
        if not ok:
            self._error("The uploaded input arrays do not fit this model's inputs; timing on its own inputs.",
                        kind="warning")
        return ok

    @staticmethod
    def _timing_rows(rows: list[session.VersionTiming], visible: list[tuple[int, str]]) -> list[dict[str, Any]]:
        """The timing table's rows for the shown versions (`session.timing.timing_table`: paired verdicts, the
        notebooks' too)."""
        return session.timing_table(rows, visible)

    # ============================================================ status helpers
    def _start(self, text: str, still: bool = False) -> None:
        """Show a job as running: an animated (indeterminate) bar, or with `still` a full, unmoving one (a timing run:
        the browser redrawing an animation on the same cores inflated the app's timings, see
        `benchmarks/bench_app_vs_cli_timing.py`)."""
        self.param.update(busy=True, progress=100 if still else -1, progress_text=text)

    def _set_progress(self, pct: int, text: str) -> None:
        self.param.update(progress=max(-1, min(100, pct)), progress_text=text)

    def _stop(self) -> None:
        self.param.update(busy=False, progress=-1, progress_text="")

    def _error(self, text: str, kind: str = "danger") -> None:
        upload = self._upload_tmp or self._last_upload_tmp
        self.param.update(message=scrub_paths(text, upload, tempfile.gettempdir()), message_kind=kind)
