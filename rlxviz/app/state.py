"""`AppState`: the app's single source of truth, a `param.Parameterized` with no Panel import.

Controls are parameters (model source, shapes, variant, pipeline, selected version, node, layer);
results are parameters too (`model`, `trace`, `timings`, `message`, `progress`), set by jobs that
run on a `Runner` (a worker thread in the app, inline in tests). Views read the state and call its
methods; nothing here knows about widgets.

One job per module: this one holds the parameters, the actions that change them, the watchers that react and the
status the jobs report; `derived.Derived` what is derived from them (versions, graphs, texts, drawings); the state
holds its jobs: `runs.Runs` (`state.runs`: load and pipeline run, uploads) and `measure.Measurements`
(`state.measurements`: timing, the per-node overlay); `wording` the text shown to users.

Example:
    >>> from rlxviz.app.jobs import Runner
    >>> s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    >>> s.model.name
    'bert-tiny'
"""

from __future__ import annotations

import tempfile
from pathlib import PurePath
from typing import Any

import param

from .. import session
from ..models import VARIANTS, BertConfig, Model
from ..passes import Trace, layer_of
from ..passes.trace import Layer, own_key
from ..runtime.devices import available_devices
from ..session.overlays import KINDS
from ..session.render import OPEN_IN_PLACE_NODES, open_nodes
from .derived import FULL_VIEW_LAYERS, FULL_VIEW_LIMIT, Derived
from .jobs import Runner
from .measure import TIMING_RUNS, Measurements
from .pipeline_edits import PipelineEdits, move_position
from .runs import NO_TIMING, RUNS, Runs, import_check
from .sources import DIMS_EXAMPLE, names_ir_file, names_onnx_file
from .views import AUTO, COLLAPSED, VIEWS
from .wording import SHAPE_VARIANT, VARIANT_LABELS, scrub_paths

SOURCES = ("preset", "checkpoint", "upload", "ir")
SOURCE_WORDS = {"preset": "built-in", "checkpoint": "path on the server", "upload": "upload", "ir": "IR text"}
"""Each source in the message a switch of source gives (`AppState._say_switch`)."""
FILE_SOURCES = ("checkpoint", "upload")
"""Sources whose models are files a user brings: one replacing another of the same source is said too (`_say_switch`);
a built-in after another (the list names it) and an edit of the IR text are not."""

OVERLAYS = ("none", *KINDS)
"""The overlay selector's choices: op colours, or a per-node figure (`session.overlays.KINDS`)."""


class LayerKey(param.Integer):
    """A layer of the shown model, held as that model's own key whatever it is set to (`passes.trace.own_key`: a
    plain int from a click on a layer box, a table row's unqualified key). A plain int N equals every stack's layer N,
    so param saw no change from it to the decoder's layer 0 and sent no event: the Why tab kept `Layer 0` with the
    encoder's text under a menu reading `decoder layer 0` (bart-full, after a layer click on GPT-J)."""

    def __set__(self, obj: Any, val: Any) -> None:
        if obj is not None and isinstance(obj, Derived):
            val = own_key(obj.layers(), val)
        super().__set__(obj, val)


class LayerKeys(param.List):
    """Layers of the shown model, each held as that model's own key (`LayerKey`, `passes.trace.own_key`): the layers
    drawn open in place. Plain indices (a click on a layer box sent one, NaN for `layer_decoder_0`) could not tell
    encoder layer 0 from decoder layer 0: the box clicked on an encoder-decoder model never opened."""

    def __set__(self, obj: Any, val: Any) -> None:
        if obj is not None and isinstance(obj, Derived) and val:
            have = obj.layers()
            val = list(dict.fromkeys(own_key(have, k) for k in val))
        super().__set__(obj, val)


class AppState(Derived, PipelineEdits, param.Parameterized):
    """Everything the app shows, and the actions that change it.

    Args:
        runner: where long work runs (default: a background worker thread).
        autorun: load the model and run the pipeline right away and on every change of a model or
            pipeline control (the app); False waits for `run()`.
    """

    layer_note = ""
    """Why "Layer to break" moved to the model's last layer (said with the variant's notice), or ""."""

    # -- model ------------------------------------------------------------------------------------
    source = param.Selector(objects=list(SOURCES), default="preset", doc="Where the model comes from.")
    preset = param.Selector(objects=[], doc="Built-in model (see rlxviz.models.PRESETS).")
    checkpoint_dir = param.String("", doc="The path typed in the path box: a Hugging Face BERT checkpoint "
                                 "folder, an .onnx file (its external data beside it) or an IR text file, under "
                                 "RLXVIZ_ALLOWED_DIRS.")
    ir_text = param.String("", doc="IR text of a graph (typed or uploaded).")
    style = param.Selector(objects=["default", "rlx", "hf"], default="default",
                           doc="BERT graph style: fused-QKV RLX layers or Hugging Face primitives.")
    batch = param.Integer(session.DEFAULT_BATCH, bounds=(1, 64), doc="Batch size (default: as the CLI's).")
    seq = param.Integer(session.DEFAULT_SEQ, bounds=(2, 512), doc="Sequence length (tokens; default: as the CLI's).")
    dims = param.String("", doc="Values of an .onnx export's symbolic input dims that batch and sequence length do "
                              "not bind, as NAME=N pairs (`num_channels=3 height=224 width=224`): the CLI's --dim.")
    dims_hint = param.String(DIMS_EXAMPLE, doc="What the Input dims box shows while empty: the pairs the last "
                             "unbound-dims message asked for (`num_channels=3 height=32 width=32`), else an example.")
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
    selected_before = param.Boolean(False, doc="The node was clicked in the before pane: the inspector describes it "
                                               "as the version before the step has it.")
    selected_layer = LayerKey(None, allow_None=True, doc="Layer asked about in 'why didn't it fuse'.")
    expanded_layers = LayerKeys(default=[], item_type=int,
                                doc="Layers drawn open in place in the collapsed view (the others stay boxes).")
    highlight = param.List(default=[], item_type=int, doc="Node ids highlighted (a table row's match/rejection).")
    overlay = param.Selector(objects=list(OVERLAYS), default="none",
                             doc="Node colours of the shown version: none (op colours), each node's share of the "
                                 "measured time, or its error against version 0's reference (`session.overlays`).")

    # -- results (set by jobs) --------------------------------------------------------------------
    model = param.ClassSelector(class_=Model, default=None, allow_None=True, doc="The loaded `Model`.")
    trace = param.ClassSelector(class_=Trace, default=None, allow_None=True, doc="The pipeline's `Trace`.")
    timings = param.List(default=[], doc="One dict per version: label, median_ms, speedup, max_err, ...")
    blas = param.String("", doc="Which BLAS MLX uses.")
    user_inputs = param.Parameter(None, doc="The user's input arrays (`runtime.battery.InputSet`) or None.")
    inputs_file = param.String("", doc="The name of the .npz whose arrays the next timing runs on (or that waits for "
                                       "the load its batch and sequence length started); '' for none: the Timing "
                                       "tab's file box then names no file.")
    timing_policy = param.String("", doc="The precision policy and the input sets of the last timing run.")
    timing_split = param.Parameter(None, doc="`session.FusionAndKernels` of the last timing run (the final version on "
                                             "MLX's own lowering beside rlxviz's kernels), None on the GPU or before "
                                             "a run, or why its run failed (a str).")
    timing_origin = param.String("", doc="Said next to a stored timing run shown instead of a new measurement "
                                         "(`measure.reuse_note`: when, and in which session); '' for a new one.")
    timing_when = param.String("", doc="`HH:MM UTC` of a stored timing run shown (its busy verdict is from then); ''.")
    node_figures = param.Parameter(None, doc="`session.overlays.NodeFigures` of the shown version for `overlay` "
                                             "(None: none chosen, or not measured yet).")
    overlay_status = param.String("", doc="Where the overlay's measurement stands: 'measuring…', why it is "
                                          "partial (the time limit), 'not measured' after a failure, or ''.")
    message = param.String("", doc="The last error or notice, in plain words with what to do.")
    stale = param.String("", doc="Why the panes show an older model or run than the controls ask for (the last load "
                                 "or pipeline run failed), in plain words; '' when they show what was asked.")
    stale_more = param.String("", doc="The whole message of the failure `stale` names where `stale` cuts it "
                                      "(`wording.stale_more`), for the stale box to unfold; '' else.")
    message_kind = param.Selector(objects=["info", "success", "warning", "danger"], default="info")
    busy = param.Boolean(False, doc="A job is running.")
    timing_running = param.Boolean(False, doc="A timing run is under way: the Timing tab's figures are the previous "
                                              "run's until it ends (`TimingView` marks them so).")
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
        self._seq_raised: tuple[int, int] | None = None
        self.runs = Runs(self)
        """The jobs that load the model and run the pipeline, and what they remember (`runs.Runs`)."""
        self.measurements = Measurements(self)
        """The timing and overlay jobs (`measure.Measurements`)."""
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

    def shape_range(self, name: str) -> tuple[int, int, str]:
        """The values `batch` or `seq` may take, and why in words: `(least, most, reason)`. A sequence is at most the
        shown model's position table (`config.max_position` rows, one per token position; a longer one cannot be
        built) and the app's bound on `seq`; a batch, the app's bound on `batch`.

        Raises:
            KeyError: `name` is neither "batch" nor "seq".
        """
        if name not in ("batch", "seq"):
            raise KeyError(name)
        lo, hi = self.param[name].bounds
        if name == "batch":
            return lo, hi, "the app's bounds on a batch"
        table = getattr(getattr(self.model, "config", None), "max_position", None)
        if isinstance(table, int) and table < hi:
            return lo, table, f"{self.model.name}'s position table has {table} rows, one per token position"
        if isinstance(table, int):
            return lo, hi, f"the app's bounds on a sequence; {self.model.name}'s position table has {table} rows"
        return lo, hi, "the app's bounds on a sequence"

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

    @param.depends("source", "preset", "checkpoint_dir", "upload_id", "ir_text", "batch", "seq", "style", "variant",
                   "variant_layer", "threshold", "dims")
    def model_key(self) -> tuple:
        """What identifies the model: source, its content, shapes (`effective_seq`: the threshold may raise the
        sequence), style, variant and the layer it changes (0 for a variant that changes no layer, `none` and
        `over_threshold`: "Layer to break" then builds the same model, and a run kept for one value serves all)."""
        v = self.variant
        layer = self.variant_layer if VARIANTS[v].changes_graph else 0
        if self.source == "preset":
            src: tuple = ("preset", self.preset)
        elif self.source == "checkpoint":
            src = ("checkpoint", self.checkpoint_dir, " ".join(self.dims.split()))
        elif self.source == "upload":
            src = ("upload", self.upload_id, " ".join(self.dims.split()))
        else:
            src = ("ir", self.ir_text)
            return src
        return (*src, self.batch, self.effective_seq, self.style, v, layer)

    @param.depends("passes", "disabled", "variant", "threshold")
    def pipeline_key(self) -> tuple:
        """What identifies the pipeline run on the model: the passes that run and the attention gate."""
        return (tuple(self.pipeline_spec), self.effective_threshold)

    run = param.Action(lambda self: self.load(), doc="Re-run the pipeline.")

    # ============================================================ jobs (held: `runs`, `measurements`)
    def load(self) -> None:
        """Load the model (if its key changed) and run the pipeline, as one job (`Runs.load`)."""
        self.runs.load()

    def start_cached(self) -> bool:
        """Show a run another session finished for these settings at once (`Runs.start_cached`)."""
        return self.runs.start_cached()

    def load_upload(self, files: dict[str, bytes]) -> None:
        """Accept uploaded model files and load them (`Runs.load_upload`)."""
        self.runs.load_upload(files)

    def prerender(self, gen: int | None = None) -> None:
        """Render every shown version's SVGs into the cache (`Runs.prerender`)."""
        self.runs.prerender(gen)

    def time_all(self, fresh: bool = False) -> None:
        """Time every version on MLX, as a job (`Measurements.time_all`)."""
        self.measurements.time_all(fresh)

    def measure_overlay(self) -> None:
        """Fill `node_figures` for the shown version and `overlay` (`Measurements.measure_overlay`)."""
        self.measurements.measure_overlay()

    def set_user_inputs(self, data: bytes | None, filename: str = "inputs.npz") -> None:
        """Use (or drop) the arrays of an uploaded `.npz` in the next timing run (`Measurements.set_user_inputs`)."""
        self.measurements.set_user_inputs(data, filename)

    _timing_rows = staticmethod(Measurements._timing_rows)

    # ============================================================ upload / IR / variants

    def variant_unavailable(self, name: str, source: str | None = None, preset: str | None = None) -> str:
        """Why teaching variant `name` does not apply to the current model, in plain words ('' when it does).

        The service's rule (`session.variant_unavailable`), as `load` refuses: every variant, the over-threshold
        one too, applies to BERT presets and checkpoints only (not IR text, ONNX exports, or other architectures
        such as the LLaMA block or GPT-2). `source` and `preset` judge another source than the state's (the shown
        model's, `shown_source`).
        """
        source = source or self.source
        preset = preset or self.preset
        if name == "none":
            return ""
        if source == "ir":
            return ("Teaching variants change a built BERT graph; they do not apply to IR text. Switch the source "
                    "to Built-in (or Folder/Upload) to try one, or edit the IR.")
        if source == "preset":
            return session.variant_unavailable(name, "preset", preset, session.preset_is_bert(preset))
        if self.model is None:
            return ""
        if "ir_file" in self.model.meta:
            return session.variant_unavailable(name, "ir", self.model.name, False)
        if "onnx_file" in self.model.meta:
            return session.variant_unavailable(name, "onnx", self.model.name, False)
        return session.variant_unavailable(name, "checkpoint", self.model.name,
                                           isinstance(self.model.config, BertConfig))

    def shown_source(self) -> tuple[str, dict[str, object]] | None:
        """When the model shown did not come from the source the state asks for because its load was refused (IR
        text that does not parse): that model's source and the fields that ask for it again (`{"preset":
        "minilm"}`), so a step on the model shown can go back to it; None when the model shown is the one asked
        for, or came from IR text, or nothing is shown, or a job is running (a load may be on its way: the user's
        new choice is not undone)."""
        key = self.runs._model_key
        if self.model is None or self.busy or len(key) < 2 or key[0] == "ir" or key[:2] == self.model_key()[:2]:
            return None
        field = {"preset": "preset", "checkpoint": "checkpoint_dir", "upload": "upload_id"}.get(key[0])
        return (key[0], {field: key[1]}) if field else None

    def apply_variant(self, name: str) -> None:
        """One click: switch to teaching variant `name` and re-run the model shown. A variant that does not apply to
        the current model (`variant_unavailable`) only says why. After a refused or failed load the fields asking for
        that model (a path still in the box) go back to the model shown first (`shown_source`): a variant choice never
        loads another model ("none (as built)" loaded the refused path's roberta)."""
        back = self.shown_source()
        if back is not None and not self.variant_unavailable(name, back[0], str(back[1].get("preset", "")) or None):
            source, fields = back
            self.param.update(source=source, **fields, variant=name)
            return
        reason = self.variant_unavailable(name)
        if reason:
            self._error(reason, "warning")
            return
        self.variant = name

    _dropped_note = ""
    """The line `_drop_inapplicable_variant` said for the model on its way ('' for none): the switch keeps it."""

    def variant_drop_reason(self) -> str:
        """Why the teaching variant on does not apply to the model the fields ask for ('' when it does, or is none):
        IR text, a non-BERT preset, or a path to an `.onnx` or IR text file (known from its name, before the load: the
        load with the variant was refused, and the user was left on the old model)."""
        v = self.variant
        if v == "none":
            return ""
        if self.source == "checkpoint":
            path = self.checkpoint_dir.strip()
            if names_onnx_file(path):
                return session.variant_unavailable(v, "onnx", PurePath(path).stem or path, False)
            if names_ir_file(path):
                return session.variant_unavailable(v, "ir", PurePath(path).name or path, False)
            return ""
        if self.source == "ir":
            return session.variant_unavailable(v, "ir", "IR text", False)
        return self.variant_unavailable(v) if self.source == "preset" else ""

    def drop_variant(self, reason: str) -> None:
        """Set the teaching variant to none (as built) and say so in one line, `reason` its why: a model it cannot
        apply to loads as built instead of being refused."""
        label = VARIANT_LABELS[self.variant]
        end = "" if reason.rstrip().endswith(".") else "."
        self._error(f"Teaching variant '{label}' set to none (as built): {reason.rstrip()}{end}", "warning")
        self._dropped_note = self.message  # first: the load setting it to none starts says it after the switch
        self.variant = "none"

    @param.depends("source", "preset", "checkpoint_dir", watch=True)
    def _drop_inapplicable_variant(self) -> None:
        """Switching to IR text, a non-BERT preset or an `.onnx` path drops the variant (and says so in one line)."""
        reason = self.variant_drop_reason()
        if reason:
            self.drop_variant(reason)

    @param.depends("source", "preset", "checkpoint_dir", "upload_id", watch=True)
    def _forget_dims_hint(self) -> None:
        """The dims a model asked for are that model's: another source shows the Input dims box's example until it
        asks for its own (declared before `_reload`, whose failed load sets the new model's)."""
        self.dims_hint = DIMS_EXAMPLE

    @param.depends("model_key", "pipeline_key", watch=True)
    def _reload(self) -> None:
        """A control that changes the model or the pipeline (what the keys read, declared on them) loads again."""
        if self.runs._quiet_layer:
            return  # "Layer to break" moved to the layer the shown model was built for (`_bound_variant_layer`)
        if self._sync_shape_seq():
            return  # the seq change reloads
        if self.autorun:
            self.load()

    # ============================================================ versions


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
        timed = self.measurements._timed
        if timed is not None and timed[0] is self.trace:  # the timing table follows the filter
            self.timings = self._timing_rows(timed[1], labels, timed[2], timed[3])

    # ============================================================ rendering

    def toggle_layer(self, layer: Layer | int) -> None:
        """A click on layer `layer` in the collapsed view: expand it in place, or fold it back when it is open;
        it also becomes the selected layer (the one "focus" and "why didn't layer N fuse?" show). `layer` is the
        model's key (`viz.box_layer` of the box's id: `Layer(0, "decoder")` for `layer_decoder_0`) or a plain index
        (the first stack's layer of that index, `own_key`): only that box opens or folds, never the other stack's
        layer of its index. A layer whose opening would put more than `session.render.OPEN_IN_PLACE_NODES` ops in
        place opens alone, the others folding (the search's Enter on a hit in convbert.qdq's layer 1, layer 0 open)."""
        layer = own_key(self.layers(), layer)
        open_ = [i for i in self.expanded_layers if i != layer]
        if layer not in self.expanded_layers:
            open_.append(layer)
            g = self.current_graph
            if g is not None and len(open_) > 1 and open_nodes(g, open_) > OPEN_IN_PLACE_NODES:
                open_ = [layer]  # too many to open together: this layer opens, the others fold
        self.param.update(expanded_layers=open_, selected_layer=layer)

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


    @param.depends("overlay", "version", "trace", "hide_unchanged", "device", watch=True)
    def _overlay_changed(self) -> None:
        """A new overlay choice, version or run: the colours of the version shown, measured when not yet (not for the
        input graph drawn before the passes: the run follows)."""
        if not self.input_first:
            self.measure_overlay()

    @param.depends("selected_node", watch=True)
    def _node_layer(self) -> None:
        """A click on a node selects its layer (`node_layer`), as a click on a layer box does (`toggle_layer`): the
        Why tab and the focus view show the layer the drawer names (marian.encdec's decoder cross-attention softmax
        opened the Why tab on encoder layer 0). A node of no layer leaves the selected layer as it was."""
        layer = self.node_layer(self.selected_node, self.selected_before)
        if layer is not None:
            self.selected_layer = layer

    @param.depends("trace", watch=True)
    def _own_layer_key(self) -> None:
        """A new run: the selected layer and the layers drawn open become its model's own keys (`LayerKey`,
        `LayerKeys`), without an event, before any view draws (a dependency's watcher runs before the views'): the
        last model's key compared equal to the new one's layer of its index, in either stack."""
        with param.parameterized.discard_events(self):
            self.selected_layer = self.selected_layer
            self.expanded_layers = list(self.expanded_layers)

    @param.depends("model", watch=True)
    def _drop_user_inputs(self) -> None:
        """Arrays uploaded for one model are not the next model's: a new model starts on its own inputs (a file that
        waits for this load, `Measurements.apply_pending`, keeps its name until the load ends)."""
        self.user_inputs = None
        if self.measurements._pending is None:
            self.inputs_file = ""

    _was_shown: tuple[str, str, tuple] | None = None
    """(name, source, what it was read from: `Runs._model_key[:2]`) of the model shown (`_say_switch`)."""
    _switch_said = ""
    """The sentence `_say_switch` gave for the model shown ("" when showing it switched no source)."""
    _shape_kept: tuple[str, int, int] | None = None
    """(model name, batch, seq) when an inputs file of that model set the sidebar's batch and sequence length
    (`Measurements.apply_pending`) and no hand has changed them since: the next model is built at them, which its
    switch sentence says once (`_kept_note`)."""

    @param.depends("batch", "seq", watch=True)
    def _forget_kept_shape(self) -> None:
        """Batch or sequence length set by hand (or by another file) to other values: no longer the inputs file's
        (the file's own update may reach this watcher after `apply_pending` recorded it, so equal values stay)."""
        if self._shape_kept is not None and self._shape_kept[1:] != (self.batch, self.seq):
            self._shape_kept = None

    def _kept_note(self) -> str:
        """' at batch B, seq S (kept from OLD's inputs)' when the model shown, another than OLD, was built at the
        batch and sequence length OLD's inputs file set (`_shape_kept`), '' otherwise (IR text fixes its own shapes;
        a graph whose first input does not start [B, S] was not built at them). Said once: the note is forgotten."""
        kept, name = self._shape_kept, self.model.name if self.model is not None else None
        if kept is None or name is None or kept[0] == name or self.shown_kind() == "ir":
            return ""
        _, batch, seq = kept
        inputs = self.model.graph.inputs
        if (self.batch, self.seq) != (batch, seq) or not inputs or tuple(inputs[0].shape[:2]) != (batch, seq):
            return ""
        self._shape_kept = None
        return f" at batch {batch}, seq {seq} (kept from {kept[0]}'s inputs)"

    def shown_kind(self) -> str | None:
        """The source the model shown came from (one of `SOURCES`; it may differ from `source` while another source's
        load runs or after one was refused), or None before the first model."""
        return self._was_shown[1] if self._was_shown is not None and self.model is not None else None

    @param.depends("model", watch=True)
    def _say_switch(self) -> None:
        """A model from another source than the last one's is shown, or another file from the same file source (an
        upload after another upload, a path after another path): the message says so, naming both ("Now showing
        bert-tiny (built-in), was gpt2 (upload)."; "Now showing deit (upload), was roberta (upload)."), so a switch of
        source or of file is never silent. The same file again (other shapes) and one built-in after another (the list
        shows it) or an IR edit stay quiet. A warning the switch gave (a teaching variant dropped) stays after it, and
        a message its load gives after it (an ONNX file's check, from a path or an upload) follows it (`with_switch`):
        every pair of sources is said alike (issue 39: a path after IR text was announced, then the check's line
        replaced the announcement)."""
        if self.model is None:
            return
        kind = self.runs._model_key[0] if self.runs._model_key else self.source
        read_from = tuple(self.runs._model_key[:2])
        was, self._was_shown = self._was_shown, (self.model.name, kind, read_from)
        other_file = was is not None and kind in FILE_SOURCES and was[2] != read_from
        said, self._switch_said = self._switch_said, ""
        dropped, self._dropped_note = self._dropped_note, ""  # said for this model only
        if was is not None and was[1] == kind and said and self.message.startswith(said):
            # the same source (the list says what is shown): the last switch's sentence named another model, and it
            # stayed over this one ("Now showing bert-tiny (built-in), was ..." over minilm)
            self.param.update(message=self.message[len(said):].lstrip(), message_kind="info")
        kept = self._kept_note() if was is not None else ""  # the batch and seq an inputs file set, carried over
        if was is None or (was[1] == kind and not other_file):
            if kept:  # one built-in after another: the list says which, but not at what shapes
                self._switch_said = text = f"Now showing {self.model.name}{kept}."
                self.param.update(message=text, message_kind="info")
            return
        text = (f"Now showing {self.model.name} ({SOURCE_WORDS[kind]}){kept}, was {was[0]} "
                f"({SOURCE_WORDS[was[1]]}).")
        if dropped and self.message == dropped:  # the variant set to none for this model: said after the switch
            text = f"{text} {dropped}"
        self._switch_said = text  # a line the load gives after (an ONNX file's check) keeps both (`with_switch`)
        self.param.update(message=text, message_kind="warning" if dropped and dropped in text else "info")

    def with_switch(self, text: str) -> str:
        """`text`, a message the load of the model shown gives after showing it (an ONNX file's check line), after
        the switch sentence that showing it gave (`_say_switch`), if any, so the switch is still said."""
        said = self._switch_said
        return f"{said} {text}" if said and not text.startswith(said) else text

    # ============================================================ status (what the jobs report)
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
        upload = self.runs._upload_tmp or self.runs._last_upload_tmp
        text = scrub_paths(text, upload, tempfile.gettempdir(), self.runs._upload_names)
        self.param.update(message=text, message_kind=kind)


__all__ = ["FILE_SOURCES", "FULL_VIEW_LAYERS", "FULL_VIEW_LIMIT", "NO_TIMING", "RUNS", "SHAPE_VARIANT", "SOURCES",
           "SOURCE_WORDS", "TIMING_RUNS", "VARIANT_LABELS", "OVERLAYS", "AppState", "import_check", "move_position",
           "scrub_paths"]
