"""`Runs`: the jobs of `AppState` (a mixin, no Panel import): loading a model and running the pipeline, an
upload's files, and the status they report (busy, progress, message); timing every version and the per-node overlay
are `measure.Measurements`'. Each job runs on the state's `Runner`; its state changes are made on the page's thread.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import session
from ..ir import IRSyntaxError
from ..models import VARIANTS, Model
from ..passes import Trace
from ..session import Limits, SessionError
from ..session import render as drawing
from .derived import INPUT_FIRST
from .measure import Measurements
from .sources import (
    ONNX_UPLOAD_NAME,
    SourceError,
    allowed_dirs,
    check_checkpoint_dir,
    check_ir_text,
    check_upload,
    store_upload,
)
from .wording import (
    SHAPE_VARIANT,
    VARIANT_LABELS,
    explain_error,
    scrub_paths,
    upload_model_name,
    upload_names,
)

RUNS = session.cache.LRUCache(maxsize=8)
"""Finished loads by (`AppState.model_key`, `AppState.pipeline_key`): a weak reference to the `Model` and its
`Trace`, shared read-only by every session of the process (neither is ever changed in place: a new variant or
pipeline is a new key and a new run). A new session whose settings were already run (the default model, which
`panel serve --warm` runs at server start) shows the run at once (`AppState.start_cached`), without a job or a
second round trip. The model is held weakly: its weights stay alive only while `session.MODELS` or a session
holds them, so this table adds no memory beyond the model cache's."""

NO_TIMING: dict[str, Any] = {"timings": [], "timing_policy": "", "blas": "", "timing_split": None}
"""A new model or run shows no timing (rows, policy and input sets, where it ran) until it is timed."""

def import_check(model: Model) -> tuple[str, bool]:
    """Version 0 against the ONNX file it came from: `session.fidelity.onnx_check`'s `(line, equal)`, run in a
    child process (`session.isolated.check_isolated`: ONNX Runtime reads the user's file there, not here)."""
    from ..session.isolated import check_isolated

    return check_isolated(model)


VARIANT_LAYER_RANGE = re.compile(r"variant layer (\d+) out of range 0\.\.(\d+)")
"""A model builder's refusal of a variant layer past its layers (`models.bert.build_bert`): (asked, last layer)."""


class Runs(Measurements):
    """The jobs of `AppState` and the status they show."""

    _layer_clamped: int | None = None
    """The last layer a load used instead of a "Layer to break" past the model's layers (None: as asked)."""
    layer_note = ""
    """Why "Layer to break" moved to the model's last layer (said with the variant's notice), or ""."""
    _quiet_layer = False
    """Set while fields move to what is shown (`_bound_variant_layer`, `_keep_shown`): no reload for it."""
    _kept: tuple | None = None
    """While an upload loads over a shown model: (upload id, the fields, key, upload files and names, `_seq_raised`
    the shown model had), put back if the upload is refused (`_keep_shown`)."""
    _partial_asked: tuple[str | None, int] | None = None
    """While the input graph drawn first (`_show_input_first`) is shown: the (label, index) of the version selected
    before it, which the full trace selects again; None otherwise."""

    def _request(self) -> session.OpenRequest:
        """The state's model and pipeline as the session's one request (`session.OpenRequest`): the threshold once,
        for the over-threshold variant's sequence and the attention gate alike. A file a user brings loads in a child
        process killed past its wall time (`isolated`)."""
        return session.OpenRequest(
            source=self.preset, batch=self.batch, seq=self.effective_seq,
            style=None if self.style == "default" else self.style, variant=self.variant,
            variant_layer=self.variant_layer, threshold=self.threshold, pipeline=tuple(self.pipeline_spec),
            pipeline_name="app", limits=Limits.resolve(), isolated=True)

    def _load_model(self) -> Model:
        request = self._request()
        if self.source == "ir":
            return session.open_model(replace(request, source=check_ir_text(self.ir_text), kind="ir-text"))
        if self.source == "checkpoint":
            request = replace(request, source=self.checkpoint_dir,
                              allowed_roots=check_checkpoint_dir(self.checkpoint_dir, allowed_dirs()))
        elif self.source == "upload":
            if not self._upload:
                raise SourceError("Upload a checkpoint's config.json and model.safetensors (or an .onnx file) first.")
            where = self._upload_tmp = str(store_upload(self._upload))  # removed when the load ends (`_load_job`)
            if (onnx_file := Path(where) / ONNX_UPLOAD_NAME).is_file():
                where = str(onnx_file)
            request = replace(request, source=where)
        try:
            model = session.open_model(request)
        except SessionError as e:
            # "Layer to break" past the new model's layers (layer 5 of minilm, then bert-tiny): its last layer
            # instead of a failed load; `_bound_variant_layer` moves the control there and says so
            past = VARIANT_LAYER_RANGE.search(str(e))
            if past is None or int(past.group(1)) != self.variant_layer:
                raise
            self._layer_clamped = int(past.group(2))
            model = session.open_model(replace(request, variant_layer=self._layer_clamped))
        if self.source == "upload":  # named after the user's file, as `rlxviz explain falcon.onnx` names it
            model.name = upload_model_name(self._upload_names, model.name)
        return model

    def _run_pipeline(self, model: Model) -> Trace:
        return session.open_trace(model.graph, self._request())

    def load(self) -> None:
        """Load the model (if its key changed) and run the pipeline, as one job."""
        self._generation += 1
        gen = self._generation
        self.runner.submit("load", lambda: self._load_job(gen))

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
            self._layer_clamped = None
            model = self._load_model() if key != self._model_key or self.model is None else self.model
            if self._layer_clamped is not None and key and key[-1] == self.variant_layer:
                key = (*key[:-1], self._layer_clamped)  # what was loaded: the state's layer moves there on show
            if gen != self._generation:
                return
            new_model = model is not self.model
            if new_model:  # the first picture: the input graph as read, before the check and the passes (issue 39)
                self._show_input_first(key, model)
            checked = None
            if new_model and model.meta.get("onnx_file"):  # does version 0 equal the file itself?
                page(lambda: self._set_progress(30, "Checking version 0 against the ONNX model…"))
                checked = import_check(model)
            page(lambda: self._set_progress(40, "Running the fusion pipeline…"))
            try:
                trace = self._run_pipeline(model)
            except SessionError:
                if new_model:  # the input graph drawn first goes: the model stays, without a trace
                    page(lambda: self._show_model(key, model))
                raise
            if gen != self._generation:
                return
            self._draw_ahead(trace)  # here, so that the page's thread finds the pictures it shows drawn

            def show() -> None:
                self.ir_error = None
                self._kept = None  # the upload loaded: nothing to put back
                new = model is not self.model  # False after `_show_input_first`: it showed the model already
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

    def _show_input_first(self, key: tuple, model: Model) -> None:
        """Draw `model`'s input graph as soon as it is read (from the runner's thread) and show it as a trace with no
        pass: the passes, the import check, the verdicts and timing arrive with the full trace after. On the 8B-shaped
        32-layer export the passes took longer than reading the graph; the first picture waited for them."""
        first = Trace(input=model.graph, pipeline=INPUT_FIRST)
        self._draw_ahead(first)
        asked = (self.version_labels[self.version] if self.trace is not None and self.version < len(self.version_labels)
                 else None, self.version)

        def show() -> None:
            self.ir_error = None
            self._model_key = key
            self._set_trace(first, model)
            self._partial_asked = asked  # the full trace selects what was asked, not this trace's only version
            self._set_progress(40, "Input graph drawn; running the fusion pipeline…")

        self.runner.on_page(show)

    def _show_model(self, key: tuple, model: Model) -> None:
        """The new model, whose pipeline run failed: shown without a trace."""
        self._model_key = key
        self.param.update(model=model, trace=None, selected_node=None, highlight=[], **NO_TIMING)

    def _failed(self, e: Exception) -> None:
        # a syntax error's place, or the line defining the node a lint error names: the editor marks it
        at = (e.line, e.col, e.reason) if isinstance(e, IRSyntaxError | session.GraphTextError) and e.line else None
        self.ir_error = at if self.source == "ir" else None
        self._error(explain_error(e, self.source, self.preset))
        self._keep_shown()
        self.stale = self._stale_reason()

    def _keep_shown(self) -> None:
        """After an upload refused before its graph was read: the model shown stays, with the fields asking for it
        (source, variant, last upload), so ② and a re-run act on it (they were dropped: ② lost, the panes stale)."""
        kept, self._kept = self._kept, None
        asked = kept is not None and (self.source, self.upload_id) == ("upload", kept[0])  # nothing else meanwhile
        if not asked or self._model_key or self.model is None:  # `_model_key`: its graph was read (and is shown)
            return
        _, fields, key, files, names, seq_raised = kept
        self._quiet_layer = True  # the fields ask for the model shown again: nothing to load
        try:
            self.param.update(**fields)
        finally:
            self._quiet_layer = False
        self._model_key, self._upload, self._upload_names, self._seq_raised = key, files, names, seq_raised
        self.param.update(message=f"{self.message} Still showing {self.model.name}, as before the upload.")

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
        asked, self._partial_asked = self._partial_asked, None
        if asked is not None:  # after `_show_input_first`: the version selected before the input graph was drawn
            names = [lbl for _, lbl in labels]
            version = names.index(asked[0]) if asked[0] in names else min(asked[1], len(labels) - 1)
        else:
            version = min(self.version, len(labels) - 1) if self.trace is None else self._same_version(trace, labels)
        new = {"model": model, "selected_node": None} if model is not None else {}
        if model is not None:
            self._bound_variant_layer(model)
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

    def _bound_variant_layer(self, model: Model) -> None:
        """"Layer to break" takes only the layers `model` has (0..N-1): a value past them (left from a larger model)
        becomes the last layer, without a reload (the load already used it, `_load_model`), and the message says so
        (`layer_note`)."""
        n = len(session.model_layers(model.graph))
        hi = max(n - 1, 0)
        old = self.variant_layer
        if old > hi:
            self._quiet_layer = True  # the model shown was built for `hi` (or takes no layer): nothing to reload
            try:
                self.variant_layer = hi
            finally:
                self._quiet_layer = False
            if self._model_key and self._model_key[-1] == old:
                self._model_key = (*self._model_key[:-1], hi)
            self.layer_note = (f"Layer to break: {model.name} has layers 0..{hi}, so layer {old} became {hi}."
                               if self.variant not in ("none", SHAPE_VARIANT) else "")
        self.param.variant_layer.bounds = (0, hi)

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
        text = text.replace(f"Teaching variant '{label}':", f"Teaching variant '{label}' ({self._variant_meant()}):", 1)
        if self.layer_note:  # the layer asked for was past the model's: say which one the variant changed
            text, self.layer_note = f"{self.layer_note} {text}", ""
        self._variant_notice = text
        self.param.update(message=text, message_kind="info")

    def _variant_meant(self) -> str:
        """What the chosen teaching variant is meant to show (`Variant.breaks`), and whether the run agrees."""
        v = VARIANTS[self.variant]
        layer = None if self.variant == SHAPE_VARIANT else self.variant_layer
        fused = (self.layer_status(layer).fused if layer is not None and layer in self.layers()
                 else not any(not r.soft for r in self.trace.rejections))
        if v.breaks:
            return "meant to break the fusion" + ("; yet it fused" if fused else "")
        return "meant to keep the fusion: the rules should still fuse it" + ("" if fused else "; yet it did not fuse")

    def load_upload(self, files: dict[str, bytes]) -> None:
        """Accept an uploaded `config.json` + `model.safetensors` or one `.onnx` file (size-limited) and load it.

        The files stay in memory (`upload_id` is their digest); each load writes them to a private temp folder and
        removes it when the load ends, failed or not, so no upload outlives its session on the server's disk."""
        try:
            checked = check_upload(files)
        except SourceError as e:
            self._error(str(e))
            return
        shown = self._kept[1:] if self._kept is not None else None  # an upload on its way: it puts back the same
        if self.model is not None and self._model_key:  # the model shown is the one its fields ask for
            shown = ({"source": self.source, "upload_id": self.upload_id, "variant": self.variant, "seq": self.seq},
                     self._model_key, self._upload, self._upload_names, self._seq_raised)
        h = hashlib.sha256()
        names = upload_names(files, checked)
        for name in sorted(checked):  # the user's name too: the model shown is named after it
            h.update(f"{name}:{names[name]}:{len(checked[name])};".encode())
            h.update(checked[name])
        self._upload = checked
        self._upload_names = names
        # a new model starts as built: a teaching variant of the last one would refuse an ONNX file (a variant, then
        # a dropped gpt2.onnx, showed an error and the old model)
        upload_id = h.hexdigest()[:24]
        self._kept = (upload_id, *shown) if shown is not None else None
        again = upload_id == self.upload_id and self.source == "upload" and self.variant == "none"
        # every upload is read from its file and checked again, as a first one is: the model shown may be this
        # file's already (the same file twice, or gpt2.onnx, a broken file, gpt2.onnx: the last load reused the
        # model on screen, checked nothing and left the broken file's error up)
        self._model_key = ()
        self.param.update(upload_id=upload_id, source="upload", variant="none")
        if again and self.autorun:  # the same file once more: nothing changed, so no watcher loads it
            self.load()

    def _remove_upload_copy(self) -> None:
        """Remove the temp folder the last load wrote the upload to (none: nothing to do)."""
        if self._upload_tmp:
            shutil.rmtree(self._upload_tmp, ignore_errors=True)
            self._last_upload_tmp, self._upload_tmp = self._upload_tmp, ""

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
        text = scrub_paths(text, upload, tempfile.gettempdir(), self._upload_names)
        self.param.update(message=text, message_kind=kind)
