"""`Runs`: the jobs of an `AppState`, which holds them (`state.runs`; no Panel import): loading a model and running the
pipeline, and an upload's files; timing every version and the per-node overlay are `measure.Measurements`'. Each job
runs on the state's `Runner`; its state changes are made on the page's thread, through the state's status calls
(`AppState._start`, `_set_progress`, `_stop`, `_error`). The teaching variant's notice after a load is
`variantnote.variant_notice`'s.
"""

from __future__ import annotations

import hashlib
import shutil
import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import param

from .. import session
from ..ir import IRSyntaxError
from ..models import VARIANTS, BertConfig, Model
from ..passes import Trace
from ..session import Limits, SessionError, VariantLayerError
from ..session import render as drawing
from .derived import INPUT_FIRST
from .sources import (
    ONNX_UPLOAD_NAME,
    SourceError,
    allowed_dirs,
    check_checkpoint_dir,
    check_in_roots,
    check_ir_text,
    check_path_kind,
    check_upload,
    names_onnx_file,
    parse_dims,
    resolve_in_roots,
    store_upload,
)
from .variantnote import variant_notice
from .wording import (
    SHAPE_VARIANT,
    VARIANT_LABELS,
    dims_notes,
    explain_error,
    stale_more,
    stale_why,
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

NO_TIMING: dict[str, Any] = {"timings": [], "timing_policy": "", "blas": "", "timing_split": None,
                             "timing_origin": "", "timing_when": ""}
"""A new model or run shows no timing (rows, policy and input sets, where it ran) until it is timed."""

def import_check(model: Model, user: Any = None) -> tuple[str, bool]:
    """Version 0 against the model itself: `session.fidelity.onnx_check`'s `(line, equal)`, on random inputs or on
    `user`'s arrays (an inputs file, `session.InputSet`) with its expected outputs. Against an ONNX file it runs in a
    child process (`session.isolated.check_isolated`: ONNX Runtime reads the user's file there, not here); else only
    expected outputs are checked, here (the reference interpreter)."""
    from ..session.fidelity import onnx_check
    from ..session.isolated import check_isolated

    if model.meta.get("onnx_file"):
        return check_isolated(model, user=user)
    return onnx_check(model, user)


def takes_variants(model: Model) -> bool:
    """True when teaching variants apply to `model`: a BERT encoder built from a preset or a checkpoint (not an ONNX
    export, IR text or a decoder), as `session.variant_unavailable` rules."""
    return isinstance(model.config, BertConfig) and not model.meta.get("onnx_file")


class Runs:
    """The jobs of one `AppState` (`state.runs`): a load and its pipeline run, an upload, and what they remember."""

    _layer_clamped: int | None = None
    """The last layer a load used instead of a "Layer to break" past the model's layers (None: as asked)."""
    clamp_note = ""
    """"Layer to break" moved into the range of a model shown with no variant that changes a layer: said after its
    load (`_notice_variant`), then ''."""
    _quiet_layer = False
    """Set while fields move to what is shown (`_bound_variant_layer`, `_keep_shown`): no reload for it."""
    _kept: tuple | None = None
    """While an upload loads over a shown model: (upload id, the fields, key, upload files and names, `_seq_raised`
    the shown model had), put back if the upload is refused (`_keep_shown`)."""
    _partial_asked: tuple[str | None, int] | None = None
    """While the input graph drawn first (`_show_input_first`) is shown: the (label, index) of the version selected
    before it, which the full trace selects again; None otherwise."""
    _dims_from: tuple[str, str] = ("", "")
    """(the Input dims box's text, the model last loaded with it): a refusal of the same text names that model."""

    def __init__(self, state: param.Parameterized) -> None:
        """`state`: the `AppState` whose jobs these are (its parameters are read and set through it)."""
        self.state = state
        self._model_key: tuple = ()
        # the model whose version 0 was checked against its ONNX file (weak: an old model's memory is not kept)
        self._checked: weakref.ref[Model] | Callable[[], None] = lambda: None
        self._shown_key: tuple = ()  # (model key, pipeline key) of the run the panes show
        self._stale_why = ""  # the last failure's reason as the stale banner says it (`stale.stale_why`)
        self._shown_run: tuple[tuple, Model, Trace] | None = None  # the last whole run shown: (key, model, trace)
        self._generation = 0
        self._variant_notice = ""
        self._upload: dict[str, bytes] = {}  # the accepted upload's files (`load_upload`)
        self._upload_tmp = self._last_upload_tmp = ""  # the temp folder a load wrote them to (removed after it)
        self._upload_names: dict[str, str] = {}  # stored name -> the user's file name (messages name the latter)

    def _request(self) -> session.OpenRequest:
        """The state's model and pipeline as the session's one request (`session.OpenRequest`): the threshold once,
        for the over-threshold variant's sequence and the attention gate alike. A file a user brings loads in a child
        process killed past its wall time (`isolated`)."""
        s = self.state
        return session.OpenRequest(
            source=s.preset, batch=s.batch, seq=s.effective_seq,
            style=None if s.style == "default" else s.style, variant=s.variant,
            variant_layer=s.variant_layer, threshold=s.threshold, pipeline=tuple(s.pipeline_spec),
            limits=Limits.resolve(), isolated=True,  # named as `explain` names the same passes (`pipeline_name`)
            bounds=(("batch", s.param.batch.bounds[1]), ("seq", s.param.seq.bounds[1])))  # the boxes' for a dim too

    def _load_model(self) -> Model:
        s = self.state
        request = self._request()
        if s.source == "ir":
            return session.open_model(replace(request, source=check_ir_text(s.ir_text), kind="ir-text"))
        if s.source == "checkpoint":
            roots = check_checkpoint_dir(s.checkpoint_dir, allowed_dirs())
            where = resolve_in_roots(s.checkpoint_dir, roots)
            check_in_roots(where, roots)  # refused here, before the load: not a failed load (`_failed`)
            check_path_kind(where, roots)  # no checkpoint folder, .onnx or IR text file: refused, naming all three
            request = replace(request, source=where, allowed_roots=roots)
        elif s.source == "upload":
            if not self._upload:
                raise SourceError("Upload a checkpoint's config.json and model.safetensors (or an .onnx file) first.")
            where = self._upload_tmp = str(store_upload(self._upload))  # removed when the load ends (`_load_job`)
            if (onnx_file := Path(where) / ONNX_UPLOAD_NAME).is_file():
                where = str(onnx_file)
            request = replace(request, source=where)
        if s.dims.strip() and names_onnx_file(str(request.source)):  # a checkpoint has no dims to bind
            request = replace(request, dims=parse_dims(s.dims))
        try:
            model = session.open_model(request)
        except VariantLayerError as e:
            # "Layer to break" past the new model's layers (layer 5 of minilm, then bert-tiny): its last layer
            # instead of a failed load; `_bound_variant_layer` moves the control there and says so
            if e.layer != s.variant_layer:
                raise
            self._layer_clamped = e.last
            model = session.open_model(replace(request, variant_layer=self._layer_clamped))
        if s.source == "upload":  # named after the user's file, as `rlxviz explain falcon.onnx` names it
            model.name = upload_model_name(self._upload_names, model.name)
        return model

    def _run_pipeline(self, model: Model) -> Trace:
        return session.open_trace(model.graph, self._request())

    def load(self) -> None:
        """Load the model (if its key changed) and run the pipeline, as one job. The page is busy from this call
        (the page's thread), not from when the job starts: in between, a variant clicked took the model still shown
        for a refused load and went back to it (`AppState.shown_source`)."""
        self._generation += 1
        gen = self._generation
        self.state._start("Loading the model…")
        self.state.runner.submit("load", lambda: self._load_job(gen))

    def start_cached(self) -> bool:
        """Show the run another session already finished for these settings (`RUNS`) at once, in the caller's
        thread and without a job; autorun is then on. False (nothing changed) when there is none: call `load`."""
        s = self.state
        key = s.model_key()
        hit = RUNS.get((key, s.pipeline_key()))
        model = hit[0]() if hit is not None else None
        if model is None:
            return False
        trace = hit[1]
        self._model_key = key
        self._set_trace(trace, model)
        self._notice_variant()
        s.autorun = True
        return True

    def _load_job(self, gen: int) -> None:
        """Load and run in the runner's thread; every change of the state (progress, the new trace, a failure)
        is made on the page's thread (`Runner.on_page`), as one step, so the page sees them in order."""
        s = self.state

        def page(fn: Any) -> None:
            """Run `fn` on the page's thread unless a newer load was asked for by then: the check in this thread
            comes before the page runs the step, and a click in between (② while the first run was on its way)
            let a superseded run be shown after the newer load had begun: it took ②'s jump to the refusing pass."""
            s.runner.on_page(lambda: fn() if gen == self._generation else None)

        page(lambda: s._start("Loading the model…"))
        done = False
        try:
            key = s.model_key()
            pipeline_key = s.pipeline_key()
            self._layer_clamped = None
            model = self._load_model() if key != self._model_key or s.model is None else s.model
            if self._layer_clamped is not None and key and key[-1] == s.variant_layer:
                key = (*key[:-1], self._layer_clamped)  # what was loaded: the state's layer moves there on show
            if gen != self._generation:
                return
            new_model = model is not s.model
            if new_model:  # the first picture: the input graph as read, before the check and the passes (issue 39)
                self._show_input_first(key, model, gen)
            checked = None
            # does version 0 equal the file itself? Once per model read: a load superseded after its input graph
            # was shown left the model read but unchecked, and the newer load (same model) said nothing of the file
            if model.meta.get("onnx_file") and self._checked() is not model:
                page(lambda: s._set_progress(30, "Checking version 0 against the ONNX model…"))
                checked = import_check(model)
            page(lambda: s._set_progress(40, "Running the fusion pipeline…"))
            try:
                trace = self._run_pipeline(model)
            except SessionError:
                if new_model:  # the input graph drawn first goes: the model stays, without a trace
                    page(lambda: self._show_model(key, model))
                raise
            if gen != self._generation:
                return
            self._draw_ahead(trace)  # here, so that the page's thread finds the pictures it shows drawn

            notes = dims_notes(model.meta, s.dims, s.batch, s.effective_seq) if new_model else []

            def show() -> None:
                s.ir_error = None
                self._kept = None  # the upload loaded: nothing to put back
                new = model is not s.model  # False after `_show_input_first`: it showed the model already
                if new:
                    self._model_key = key
                # model and trace change together: views never see the new model with the old trace
                self._set_trace(trace, model if new else None)
                self._notice_variant()
                if checked is not None:
                    self._checked = weakref.ref(model)
                if checked is not None:  # the CLI's line, word for word (`session.fidelity`), after a switch's
                    # and what the file had already fused, as `explain` prints it below that line (the app said
                    # nothing of ONNX Runtime's fusions: `session.imported_forms`), the nodes run on the host before
                    # it, as `explain` prints them (`session.describe_host`: the app never named them)
                    host = session.describe_host(model.graph)
                    text = "; ".join([checked[0], *([host] if host else []), *session.imported_forms(model), *notes])
                    s.param.update(message=s.with_switch(text), message_kind="info" if checked[1] else "danger")
                elif notes:  # a dim that set the batch or sequence length: which value won (the CLI's note)
                    s.param.update(message=s.with_switch("; ".join(notes)), message_kind="info")
                if new_model and s.dims.strip() and session.dimroles.ROLES_META in model.meta:
                    self._dims_from = (" ".join(s.dims.split()), model.name)
                s._set_progress(80, "Drawing the graph…")

            page(show)
            self._draw_shown()
            RUNS.put((key, pipeline_key), (weakref.ref(model), trace))
            done = True
        except Exception as e:  # noqa: BLE001 - every failure becomes a message; the app keeps working
            if gen == self._generation:  # a superseded load's failure is not the model asked for now
                page(lambda err=e: self._failed(err))
        finally:
            self._remove_upload_copy()
            if gen == self._generation:  # the load an inputs file's shapes started: its arrays now, or refused
                page(s.measurements.apply_pending)
                page(s._stop)  # a superseded load leaves the page busy: the newer load is queued and stops it
                # (it cleared `busy` between the two jobs; a variant clicked then went back to the superseded
                # model shown, `AppState.shown_source`)
        if done:  # after the job: the page is usable while the other versions are drawn
            s.runner.submit("prerender", lambda: self.prerender(gen), ahead=True)

    def _show_input_first(self, key: tuple, model: Model, gen: int | None = None) -> None:
        """Draw `model`'s input graph as soon as it is read (from the runner's thread) and show it as a trace with no
        pass: the passes, the import check, the verdicts and timing arrive with the full trace after. On the 8B-shaped
        32-layer export the passes took longer than reading the graph; the first picture waited for them. `gen`: the
        load's generation; a newer load asked for before the page runs the step shows nothing of this one."""
        s = self.state
        first = Trace(input=model.graph, pipeline=INPUT_FIRST)
        self._draw_ahead(first)
        asked = (s.version_labels[s.version] if s.trace is not None and s.version < len(s.version_labels)
                 else None, s.version)

        def show() -> None:
            if gen is not None and gen != self._generation:
                return
            s.ir_error = None
            self._model_key = key
            self._set_trace(first, model)
            self._partial_asked = asked  # the full trace selects what was asked, not this trace's only version
            s._set_progress(40, "Input graph drawn; running the fusion pipeline…")

        s.runner.on_page(show)

    def _show_model(self, key: tuple, model: Model) -> None:
        """The new model, whose pipeline run failed: shown without a trace."""
        self._model_key = key
        self.state.param.update(model=model, trace=None, selected_node=None, highlight=[], **NO_TIMING)

    def _failed(self, e: Exception) -> None:
        s = self.state
        # a syntax error's place, or the line defining the node a lint error names: the editor marks it
        at = (e.line, e.col, e.reason) if isinstance(e, IRSyntaxError | session.GraphTextError) and e.line else None
        s.ir_error = at if s.source == "ir" else None
        kept = self._dims_from[1] if self._dims_from[0] == " ".join(s.dims.split()) else ""  # a box kept from it
        s._error(explain_error(e, s.source, s.preset, onnx=self._asked_onnx(), text=s.ir_text if at else None,
                               dims_from=kept))
        if isinstance(e, session.UnboundDimsError):  # the empty box shows what the message asks to type
            s.dims_hint = e.pairs()
        self._keep_shown()
        refused = isinstance(e, SourceError) or (s.source == "checkpoint" and self._model_key != s.model_key())
        if refused and s.model is not None and "Still showing" not in s.message:
            # a refused path, upload or IR text: which model stays (`_keep_shown` says it for an upload it puts back)
            end = "" if s.message.rstrip().endswith((".", "!", "?")) else "."  # a loader's line may end bare
            s.param.update(message=f"{s.message.rstrip()}{end} Still showing {s.model.name}.")
        if isinstance(e, SourceError):
            # refused before any load (a path outside the folders, no upload, empty IR text): nothing was loaded,
            # so the panes still show what they showed, and a refusal marks no model stale (as on a page with no
            # earlier failure: the message says which model is still shown). A mark an earlier failed load left
            # named a load no longer asked for ("loading the new one failed" over "Still showing granite"): it
            # goes; a failed pipeline's mark stays (the pipeline asked for is still the one that failed)
            if s.stale and self._model_key != s.model_key():
                s.stale = self._stale_reason(self._stale_why, refused=True)
            return
        self._stale_why = stale_why(s.message)
        s.param.update(stale=self._stale_reason(self._stale_why), stale_more=stale_more(s.message))

    def _asked_onnx(self) -> bool:
        """The path or upload asked for is an ONNX file (not a config.json + model.safetensors checkpoint)."""
        s, up = self.state, self._upload_names
        asked = {"checkpoint": [s.checkpoint_dir], "upload": [*up, *up.values()]}.get(s.source, [])
        return any(names_onnx_file(str(n)) for n in asked)

    def _keep_shown(self) -> None:
        """After an upload refused before its graph was read: the model shown stays, with the fields asking for it
        (source, variant, last upload), so ② and a re-run act on it (they were dropped: ② lost, the panes stale)."""
        s = self.state
        kept, self._kept = self._kept, None
        asked = kept is not None and (s.source, s.upload_id) == ("upload", kept[0])  # nothing else meanwhile
        if not asked or self._model_key or s.model is None:  # `_model_key`: its graph was read (and is shown)
            return
        _, fields, key, files, names, seq_raised = kept
        self._quiet_layer = True  # the fields ask for the model shown again: nothing to load
        try:
            s.param.update(**fields)
        finally:
            self._quiet_layer = False
        self._model_key, self._upload, self._upload_names, s._seq_raised = key, files, names, seq_raised
        s.param.update(message=f"{s.message} Still showing {s.model.name}, as before the upload.")

    def _draw_ahead(self, trace: Trace) -> None:
        """Draw the version `_set_trace(trace)` will select (after, and before its pass) into the cache, from the
        runner's thread: the views then draw it from the cache. A guess (the variant notice may still change the
        selected layer): a miss is drawn by the view."""
        s = self.state
        try:
            labels = s._visible(trace)
            k = max(min(s.version, len(labels) - 1) if s.trace is None else self._same_version(trace, labels),
                    0)
            view = s.resolved_view(trace)
            drawing.svg(*s._drawing(k, view, trace=trace), titled=False)  # as the panes draw it (`State.svg`)
            if labels[k][0] > 0:
                drawing.svg(*s._drawing(k, view, side="before", trace=trace), titled=False)
        except Exception:  # noqa: BLE001 - the view shows the error
            pass

    def _stale_reason(self, why: str, refused: bool = False) -> str:
        """After a failed load or run: what the panes still show instead of what the controls ask for, and `why`
        (`stale_why` of the failure's message) in the banner itself: it stays when the message is dismissed (it
        said "see the message above" over no message). '' when they show nothing, or the new model's graph with
        no run; with `refused` (the model asked for now was refused before any load) no model-level mark."""
        s = self.state
        if s.model is None:
            return ""
        name = s.model.name
        if self._model_key != s.model_key() and not refused:
            return (f"Stale: showing the previous model ({name}); loading the new one failed: {why} Fix the input "
                    "or go back to a model that loads.")
        if s.trace is not None and self._shown_key != (self._model_key, s.pipeline_key()):
            return (f"Stale: showing the previous pipeline run of {name}; the new pipeline failed: {why} Change the "
                    "pipeline and apply again.")
        return ""

    def _set_trace(self, trace: Trace, model: Model | None = None) -> None:
        """Show `trace` (and `model`, when it is new) in one update."""
        s = self.state
        labels = s._visible(trace)
        asked, self._partial_asked = self._partial_asked, None
        if asked is not None:  # after `_show_input_first`: the version selected before the input graph was drawn
            names = [lbl for _, lbl in labels]
            version = names.index(asked[0]) if asked[0] in names else min(asked[1], len(labels) - 1)
        else:
            version = min(s.version, len(labels) - 1) if s.trace is None else self._same_version(trace, labels)
        new = {"model": model, "selected_node": None} if model is not None else {}
        if model is not None and (s.model is None or s.model.name != model.name):  # another model (not a variant)
            new["expanded_layers"] = []  # its layers are not the ones opened (gpt2's layer 3 stayed open on bert)
        if model is not None:
            self._bound_variant_layer(model)
        s.param.version.bounds = (0, max(len(labels) - 1, 0))
        try:
            s.param.update(**new, trace=trace, version=max(version, 0), highlight=[], stale="", stale_more="",
                           **NO_TIMING)
        except Exception:
            self._put_back_shown()
            raise
        self._shown_key = (self._model_key, s.pipeline_key())
        if trace.pipeline != INPUT_FIRST:  # a whole run (the input graph shown first is a load's first half)
            self._shown_run = (self._model_key, s.model, trace)
        errors = [st for st in trace.steps if st.error]
        if errors:
            first = errors[0]
            more = f" (and {len(errors) - 1} more pass(es))" if len(errors) > 1 else ""
            s._error(f"Pass {first.pass_name} CRASHED{more}: an internal error, so its result was discarded and the "
                     f"pipeline went on with the graph before it; the fusion report is incomplete:\n{first.error}\n"
                     "Disable or move that pass (Pipeline) and re-run, and report the bug with the IR (IR tab).",
                     kind="danger")
        elif s.message_kind == "danger":
            s.param.update(message="", message_kind="info")

    def _put_back_shown(self) -> None:
        """After a view failed while a new model or run was being shown (its watchers raised part way, so some panes
        drew it and some did not): the state goes back to the run shown last, so that the strip, the stale banner
        and the panes name one model (they named the new model over the previous model's panes). Then the caller's
        failure marks the panes stale as for a failed load."""
        s, shown = self.state, self._shown_run
        if shown is None:
            return
        key, model, trace = shown
        self._model_key = key
        try:
            s.param.version.bounds = (0, max(len(s._visible(trace)) - 1, 0))
            s.param.update(model=model, trace=trace, version=min(s.version, s.param.version.bounds[1]),
                           selected_node=None, highlight=[], **NO_TIMING)
        except Exception:  # noqa: BLE001 - the caller reports the first failure; this one would hide it
            pass

    def _bound_variant_layer(self, model: Model) -> None:
        """"Layer to break" takes only the layers `model` has (0..N-1) when teaching variants apply to it (a BERT
        preset or checkpoint): a value past them (left from a larger model) becomes the last layer, without a reload
        (the load already used it, `_load_model`), and the message says so (`layer_note`, or `clamp_note` with no
        variant on). A model variants do not apply to (IR text, an ONNX export, a decoder preset) leaves the value
        and its bounds as the user set them: going there and back to minilm changed layer 1 to 0 unsaid, and ② then
        broke layer 0."""
        s = self.state
        n = len(session.model_layers(model.graph))
        if n == 0 or not takes_variants(model):
            s.param.variant_layer.bounds = (0, None)
            return
        hi = n - 1
        old = s.variant_layer
        if old > hi:
            self._quiet_layer = True  # the model shown was built for `hi` (or takes no layer): nothing to reload
            try:
                s.variant_layer = hi
            finally:
                self._quiet_layer = False
            if self._model_key and self._model_key[-1] == old:
                self._model_key = (*self._model_key[:-1], hi)
            note = f"Layer to break: {model.name} has layers 0..{hi}, so layer {old} became {hi}."
            if s.variant not in ("none", SHAPE_VARIANT):
                s.layer_note = note
            else:
                self.clamp_note = note
        s.param.variant_layer.bounds = (0, hi)

    def move_layer_quietly(self, layer: int) -> None:
        """Set "Layer to break" to `layer` without a reload while the teaching variant changes no layer (`none`,
        `over_threshold`): the model is the same (`AppState.model_key` holds 0 for it), so nothing is to run.

        Raises:
            ValueError: a variant that changes a layer is on (its model would change).
        """
        s = self.state
        if VARIANTS[s.variant].changes_graph:
            raise ValueError(f"[move_layer_quietly] variant {s.variant} changes layer {s.variant_layer}: set "
                             "variant_layer to re-run")
        self._quiet_layer = True
        try:
            s.variant_layer = layer
        finally:
            self._quiet_layer = False

    def _same_version(self, trace: Trace, labels: list[tuple[int, str]]) -> int:
        """Keep the selected version's pass when re-running (else the nearest earlier one)."""
        s = self.state
        old = s.version_labels[s.version] if s.version < len(s.version_labels) else "input"
        names = [lbl for _, lbl in labels]
        return names.index(old) if old in names else min(s.version, len(names) - 1)

    def _notice_variant(self) -> None:
        """Say which guard the teaching variant trips (and clear the last variant's notice when it no longer
        applies, e.g. after "none (as built)")."""
        s = self.state
        stale = bool(self._variant_notice) and s.message == self._variant_notice
        clamped, self.clamp_note = self.clamp_note, ""
        if s.variant == "none" or s.trace is None:
            if stale:
                s.param.update(message="", message_kind="info")
            self._variant_notice = ""
            if clamped:  # no variant notice says it: the message does, after a switch's sentence
                s.param.update(message=s.with_switch(clamped), message_kind="info")
            return
        text = variant_notice(s)
        if clamped and s.variant == SHAPE_VARIANT:
            text = f"{clamped} {text}"
        if s.layer_note:  # the layer asked for was past the model's: say which one the variant changed
            text, s.layer_note = f"{s.layer_note} {text}", ""
        self._variant_notice = text
        s.param.update(message=text, message_kind="info")

    def load_upload(self, files: dict[str, bytes]) -> None:
        """Accept an uploaded `config.json` + `model.safetensors` or one `.onnx` file (size-limited) and load it.

        The files stay in memory (`upload_id` is their digest); each load writes them to a private temp folder and
        removes it when the load ends, failed or not, so no upload outlives its session on the server's disk."""
        s = self.state
        try:
            checked = check_upload(files)
        except SourceError as e:  # refused before anything changed: the model shown stays, and the message says so
            s._error(str(e) + (f" Still showing {s.model.name}." if s.model is not None else ""))
            return
        shown = self._kept[1:] if self._kept is not None else None  # an upload on its way: it puts back the same
        if s.model is not None and self._model_key:  # the model shown is the one its fields ask for
            shown = ({"source": s.source, "upload_id": s.upload_id, "variant": s.variant, "seq": s.seq},
                     self._model_key, self._upload, self._upload_names, s._seq_raised)
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
        again = upload_id == s.upload_id and s.source == "upload" and s.variant == "none"
        # every upload is read from its file and checked again, as a first one is: the model shown may be this
        # file's already (the same file twice, or gpt2.onnx, a broken file, gpt2.onnx: the last load reused the
        # model on screen, checked nothing and left the broken file's error up)
        self._model_key = ()
        dropped = {}
        if s.variant != "none":  # said in one line, kept after the switch's sentence (`AppState._say_switch`)
            onnx = any(names_onnx_file(n) for n in names.values())
            name = upload_model_name(names, "the upload")
            why = (session.variant_unavailable(s.variant, "onnx", name, False) if onnx else
                   f"{name} is a new model, and a new model starts as built; choose the variant again to apply it")
            s._dropped_note = f"Teaching variant '{VARIANT_LABELS[s.variant]}' set to none (as built): {why}."
            dropped = {"message": s._dropped_note, "message_kind": "warning"}
        s.param.update(upload_id=upload_id, source="upload", variant="none", **dropped)
        if again and s.autorun:  # the same file once more: nothing changed, so no watcher loads it
            s.load()

    def check_inputs(self, model: Model, user: Any) -> tuple[str, bool]:
        """`import_check(model, user)`: version 0 on an inputs file's arrays, against the ONNX file `model` was read
        from. An upload's copy was removed when its load ended (`_remove_upload_copy`), so the upload is written
        again for the check and removed after it."""
        path = model.meta.get("onnx_file")
        if not path or Path(path).is_file() or not self._upload:
            return import_check(model, user)
        where = store_upload(self._upload)
        try:
            return import_check(replace(model, meta={**model.meta, "onnx_file": str(where / ONNX_UPLOAD_NAME)}), user)
        finally:
            shutil.rmtree(where, ignore_errors=True)

    def _remove_upload_copy(self) -> None:
        """Remove the temp folder the last load wrote the upload to (none: nothing to do)."""
        if self._upload_tmp:
            shutil.rmtree(self._upload_tmp, ignore_errors=True)
            self._last_upload_tmp, self._upload_tmp = self._upload_tmp, ""

    def _draw_shown(self) -> None:
        """Render the selected version's SVGs (after, and before its pass) into the cache."""
        s = self.state
        try:
            s.svg()
            if s.current_step is not None:
                s.svg_before()
        except Exception:  # noqa: BLE001 - the view shows the error
            pass

    def prerender(self, gen: int | None = None) -> None:
        """Render every shown version's SVGs (before and after) into the cache, so stepping is a lookup. Runs as
        its own job after a load; stops as soon as a newer load (`gen` no longer current) is asked for."""
        s = self.state
        for k in range(len(s.version_labels)):
            if gen is not None and gen != self._generation:
                return
            try:
                s.svg(k)
                if k:
                    s.svg_before(k)
            except Exception:  # noqa: BLE001 - the view shows the error when this version is selected
                pass
