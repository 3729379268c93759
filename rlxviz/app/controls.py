"""Sidebar views: model source and shapes, teaching variants and the pipeline (the message banner: `statusbar`).

Each is a Panel `Viewer` that reads and writes one `AppState`; none holds state of its own.
"""

from __future__ import annotations

import panel as pn
import param
from panel.viewable import Viewer

from .numberbox import BoxNotes, NumberBox
from .sources import (
    ALLOWED_DIRS_ENV,
    EXTERNAL_DATA_SUFFIXES,
    IR_SUFFIXES,
    MODEL_DROP_SUFFIXES,
    allowed_dirs,
    dropped_elsewhere,
    max_upload_bytes,
    names_ir_file,
    names_onnx_file,
    where_big_files,
)
from .state import SHAPE_VARIANT, SOURCES, VARIANT_LABELS, AppState, move_position
from .text import md_escape
from .wording import DIMS_BOX, LAYER_OFF, gate_box

SHAPE_LABELS = {"batch": "Batch", "seq": "Sequence length"}


def range_label(name: str, most: int) -> str:
    """The Batch or Sequence length box's label with the most it takes (`Sequence length (≤ 512)`): a value past it
    becomes `most` (`ModelControls._shape_typed`), and a newcomer who typed 100000000 saw 512 and an error about seq
    512 with no word of the bound by the box."""
    return f"{SHAPE_LABELS[name]} (≤ {most})"
SOURCE_LABELS = {"preset": "Built-in", "checkpoint": "Folder", "upload": "Upload", "ir": "IR text"}


DROP_CSS = """
.filepond--drop-label label { white-space: normal; font-size: 12px; line-height: 1.3; padding: 0 4px; }
"""
"""The drop zone's words on two lines: on one ("Drag & Drop your files or Browse") they were cut at "Brow" in the
zone's 165 px."""

IR_EDITOR_STYLE = {"border": "1px solid #90a4ae", "border-radius": "4px"}
"""The IR editor's frame (its host's style; a stylesheet there made Bokeh send new stylesheet models the browser did
not know): an empty Ace editor is otherwise one line on white."""

IR_PLACEHOLDER = ("<div style='font:12px monospace;color:#546e7a;background:#f5f7f8;border:1px dashed #b0bec5;"
                  "border-radius:4px;padding:4px 8px;white-space:pre'>"
                  "<span style='font:12px sans-serif'>The editor below is empty: paste or type IR text, e.g.</span>\n"
                  "graph small {\n  %0 = input {name=\"x\"} : f32[2, 8]\n  %1 = tanh(%0) : f32[2, 8]\n  return %1\n}"
                  "</div>")
"""Shown above the IR editor while it is empty: what to paste, as a small graph in IR text."""


class ModelControls(Viewer):
    """Model source (preset, checkpoint folder, upload, IR text), graph style, batch, seq and text.

    Choosing a source only shows its controls: the model changes when something is loaded from it (a preset at
    once; a folder, an upload or IR text on its button), so no error appears before the user gave anything.
    """

    state = param.ClassSelector(class_=AppState)
    shown = param.Selector(objects=list(SOURCES), default="preset", doc="Whose controls are shown.")

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        s = self.state
        self.shown = s.source
        self._drop_holders: list[pn.Column] = []  # each drop zone's holder (`make_dropper`)
        self._dropped: dict[str, bytes] = {}  # half a checkpoint dropped, waiting for its other file
        self.source = pn.widgets.RadioButtonGroup(name="Source", options={SOURCE_LABELS[k]: k for k in SOURCES},
                                                  value=s.source, button_type="light", sizing_mode="stretch_width")
        self.source.param.watch(self._on_source, "value")
        # not bound to `state.preset`: a choice in the list shows that model (from any source), said in the message;
        # "Show" shows the listed one. Opening this tab changes nothing (it replaced an uploaded model unasked)
        self.preset = pn.widgets.Select(name="Model", options=list(s.param.preset.objects), value=s.preset,
                                        sizing_mode="stretch_width", css_classes=["rv-preset"])
        self.preset.param.watch(self._on_preset, "value")
        self.preset_btn = pn.widgets.Button(label="", color="primary", css_classes=["rv-load-preset"])
        self.preset_btn.on_click(lambda e: self.show_preset())
        self.preset_note = pn.pane.Markdown("", styles={"font-size": "12px"}, css_classes=["rv-preset-note"],
                                            margin=(0, 10))
        self._syncing = False
        s.param.watch(self._follow_preset, ["preset", "source", "model"])
        roots = allowed_dirs()
        self.folder = pn.widgets.TextInput(name="Folder, .onnx or IR file (a path on the server)",
                                           value=s.checkpoint_dir, css_classes=["rv-path"],
                                           placeholder=str(roots[0]) if roots else f"disabled: set {ALLOWED_DIRS_ENV}",
                                           sizing_mode="stretch_width")
        self.folder_btn = pn.widgets.Button(label="Load path", color="primary", css_classes=["rv-load-path"])
        self.folder_btn.on_click(lambda e: s.param.update(checkpoint_dir=self.folder.value, source="checkpoint"))
        self.upload = pn.widgets.FileInput(accept=".json,.safetensors,.onnx", multiple=True, name="Checkpoint files",
                                           sizing_mode="stretch_width", css_classes=["rv-upload"])
        self.upload.param.watch(self._on_upload, "value")
        limit = max_upload_bytes() / 2**20
        self.upload_doc = pn.pane.Markdown(f"Select **config.json** and **model.safetensors** together, or one "
                                           f"**.onnx** export (at most {limit:.0f} MB). "
                                           f"{md_escape(where_big_files())}", styles={"font-size": "12px"})
        # Ace editor: line numbers, no length cap (the server's memory budget limits the graph, not the text)
        # a framed box with a gutter (empty, Ace showed one line on white: it did not read as an editor), and while
        # it is empty a placeholder above it says what to paste (Ace has no placeholder of its own)
        self.ir = pn.widgets.CodeEditor(value=s.ir_text, language="text", min_height=300, sizing_mode="stretch_both",
                                        css_classes=["rv-ir-text"], print_margin=False, indent=2, soft_tabs=True,
                                        styles=IR_EDITOR_STYLE)
        self.ir_placeholder = pn.pane.HTML(IR_PLACEHOLDER, css_classes=["rv-ir-placeholder"],
                                           sizing_mode="stretch_width", visible=not s.ir_text.strip(), margin=(0, 10))
        self.ir.param.watch(lambda e: setattr(self.ir_placeholder, "visible", not (e.new or "").strip()), "value")
        self.ir_doc = pn.pane.Markdown("Type or paste a graph (the *IR & diff* tab shows the syntax), or start from "
                                       "**Edit the shown version**, then **Load IR**.", styles={"font-size": "12px"},
                                       css_classes=["rv-ir-doc"], margin=(0, 10))
        self.ir_hint = pn.pane.Markdown("The editor is the **IR editor** tab, at the full size of the page.",
                                        styles={"font-size": "12px"}, css_classes=["rv-ir-hint"])
        self.ir_file = pn.widgets.FileInput(accept=",".join(IR_SUFFIXES), width=260)
        self.ir_file.param.watch(self._on_ir_file, "value")
        self.ir_btn = pn.widgets.Button(label="Load IR", color="primary", css_classes=["rv-load-ir"])
        self.ir_btn.on_click(lambda e: s.param.update(ir_text=self.ir.value, source="ir"))
        self.ir_copy = pn.widgets.Button(label="Edit the shown version", color="light", css_classes=["rv-ir-copy"])
        self.ir_copy.on_click(lambda e: self._edit_shown())
        self.style = pn.widgets.Select.from_param(s.param.style, name="Graph style", sizing_mode="stretch_width")
        # not bound to the state's parameters, and no start/end: a value out of range was put back with no word (the
        # browser's input itself puts back a value past its start or end); now it is clamped to the range, and the
        # message says the range and why (`_shape_typed`)
        # text boxes read on the server (`NumberBox`): a value that is no whole number is said too
        self.notes = BoxNotes(s)
        self.batch = NumberBox("Batch", s.batch, lambda t: self._shape_unreadable("batch", t), width=100,
                               css_classes=["rv-batch"])
        self.seq = NumberBox("Sequence length", s.seq, lambda t: self._shape_unreadable("seq", t), width=165,
                             css_classes=["rv-seq"])
        self._follow_range()
        s.param.watch(self._follow_range, "model")  # the most a sequence takes is the shown model's position table
        for name in ("batch", "seq"):
            getattr(self, name).param.watch(lambda e, n=name: self._shape_typed(n, e.new), "value")
            # the state's value now, not the event's: an event delivered after a later change (a refused upload
            # puts the over-threshold variant's raised seq back while the box still reads the one it had lowered)
            # set the box to the old value, and box and state passed 8 and 65 to each other until RecursionError
            s.param.watch(lambda e, n=name: setattr(getattr(self, n), "value", getattr(s, n)), name)
        # a note about a shape is about the model it was typed for: another model or source, and it no longer holds
        s.param.watch(lambda *e: self.notes.drop("batch", "seq"), ["source", "preset", "upload_id", "checkpoint_dir"])
        self.dims = pn.widgets.TextInput.from_param(s.param.dims, name=f"{DIMS_BOX} (an .onnx export's other dims)",
                                                    placeholder=s.dims_hint, sizing_mode="stretch_width",
                                                    css_classes=["rv-dims"])
        s.param.watch(lambda e: setattr(self.dims, "placeholder", e.new), "dims_hint")
        self.text = pn.widgets.TextAreaInput.from_param(s.param.text, name="Text to tokenize (real models)",
                                                        rows=3, auto_grow=True, max_rows=8,
                                                        sizing_mode="stretch_width", css_classes=["rv-text"])
        self.shape_note = pn.pane.Markdown("", styles={"font-size": "12px"}, css_classes=["rv-shape-note"])
        s.param.watch(self._follow_source, ["source", "checkpoint_dir"])
        s.param.watch(self._mark_ir_error, "ir_error")
        self._follow_source()
        self._follow_preset()

    def _shape_typed(self, name: str, typed: int | None) -> None:
        """A batch or sequence length typed: within `AppState.shape_range` it is the state's; past it, the nearest
        end of the range instead, and the message says the range and why; an empty box is put back."""
        s, widget = self.state, getattr(self, name)
        if typed is None:
            widget.value = getattr(s, name)
            return
        lo, hi, why = s.shape_range(name)
        if lo <= typed <= hi:
            self.notes.drop(name)  # the last note about this box no longer holds
            setattr(s, name, typed)
            return
        near = lo if typed < lo else hi
        text = f"{SHAPE_LABELS[name]} {typed} is out of range {lo}..{hi} ({why}), so it became {near}."
        if s.variant != "none" and near != getattr(s, name):
            s.layer_note = text  # said with the variant's notice after the reload (it replaces the message)
            widget.value = near  # back here with a value in range: it becomes the state's
            return
        widget.value = near
        self.notes.say(name, text)  # no variant notice follows the reload (or nothing reloads): said now

    def _follow_range(self, *_: object) -> None:
        """Each shape box's label says the most it takes now (`AppState.shape_range`, `range_label`)."""
        for name in ("batch", "seq"):
            getattr(self, name).text.label = range_label(name, self.state.shape_range(name)[1])

    def _shape_unreadable(self, name: str, typed: str) -> None:
        """A batch or sequence length that is no whole number (`abc`, `2.5`, `1e3`): the box shows the state's value
        again, and the message says so (it replaces any older note about the box)."""
        self.notes.say(name, f"{SHAPE_LABELS[name]} must be a whole number; {typed} is not, so it stays "
                             f"{getattr(self.state, name)}.")

    def _on_source(self, event: param.parameterized.Event) -> None:
        """A tab shows its source's controls only; the model changes on that source's own action (a built-in model
        chosen or shown, a path loaded, a file uploaded, IR loaded)."""
        self.shown = event.new

    def _on_preset(self, event: param.parameterized.Event) -> None:
        """A built-in model chosen in the list: shown, whatever the source shown now (the message says what it
        replaced)."""
        if not self._syncing:
            self.state.param.update(source="preset", preset=event.new)

    def show_preset(self) -> None:
        """Show the built-in model the list names (its "Show" button, there while another source is shown)."""
        self.state.param.update(source="preset", preset=self.preset.value)

    def _follow_preset(self, *_: object) -> None:
        """The list names the state's built-in model; while another source's model is shown, a line says which and
        the "Show" button offers the listed one."""
        s = self.state
        self._syncing = True
        try:
            self.preset.value = s.preset
        finally:
            self._syncing = False
        kind = s.shown_kind()
        other = kind is not None and kind != "preset"
        self.preset_btn.param.update(label=f"Show {self.preset.value}", visible=other or s.source != "preset")
        name = s.model.name if s.model is not None else ""
        self.preset_note.param.update(
            object=(f"Showing **{md_escape(name)}** ({SOURCE_LABELS[kind]}) until you choose a built-in model here "
                    "or press Show." if other else ""), visible=other)

    def _follow_source(self, *_: object) -> None:
        """Show the loaded source's controls; shapes and text do not apply to IR text, pasted or an IR text file
        typed in the path box (its shapes are written in it)."""
        s = self.state
        self.source.value = self.shown = s.source
        path = s.checkpoint_dir.strip()
        ir = s.source == "ir" or (s.source == "checkpoint" and names_ir_file(path))
        # a folder (a checkpoint: config.json + model.safetensors, or none) has no symbolic dims: the box would be
        # ignored; the note does not call it a checkpoint (newcomer run 41: after "a folder without config.json")
        folder = s.source == "checkpoint" and bool(path) and not ir and not names_onnx_file(path)
        for w in (self.batch, self.seq, self.text, self.style):
            w.disabled = ir
        self.dims.disabled = ir or folder
        self.shape_note.object = ("*Batch, sequence length, style and text do not apply to IR text: its shapes "
                                  "are written in it.*" if ir else f"*{DIMS_BOX} apply to an .onnx export only, not "
                                  "to a folder: a checkpoint folder's shapes are Batch and Sequence length.*"
                                  if folder else "")

    def _edit_shown(self) -> None:
        """Put the selected version's IR into the editor (and show the IR controls)."""
        self.ir.value = self.state.ir_current()
        self.shown = "ir"
        self.source.value = "ir"

    def _mark_ir_error(self, event: param.parameterized.Event) -> None:
        """Mark the line the parser stopped at in the editor's gutter (Ace annotation)."""
        at = event.new
        self.ir.annotations = ([{"row": at[0] - 1, "column": max(at[1] - 1, 0), "text": at[2], "type": "error"}]
                               if at else [])

    def _preset_doc(self) -> str:
        from ..session import presets

        return presets().get(self.state.preset, "")

    def _on_upload(self, event: param.parameterized.Event) -> None:
        if not event.new:
            return
        names = self.upload.filename if isinstance(self.upload.filename, list) else [self.upload.filename]
        values = event.new if isinstance(event.new, list) else [event.new]
        files = dict(zip(names, values, strict=False))
        self.upload.clear()  # emptied on every load, good or bad (it kept the last file's name)
        self.state.load_upload(files)

    def make_dropper(self) -> pn.Column:
        """A drop zone for a model file (Panel's FileDropper): one `.onnx` export, or `config.json` and
        `model.safetensors` (together or one after the other); the upload's size limit applies. It comes in a
        holder whose FileDropper is replaced by an empty one once its files are taken: the zone kept the last file
        (its name shown) and a second drop of it did nothing."""
        # a fixed width only: its height is the zone's ("fixed" asked for a height too, Bokeh's W-1005 in the log)
        holder = pn.Column(self._new_drop(), margin=0, width=170, align="center")
        self._drop_holders.append(holder)
        return holder

    def _new_drop(self) -> pn.widgets.FileDropper:
        limit = max_upload_bytes() / 2**20
        # no accepted_filetypes: the browser gives an .onnx file no MIME type, which FilePond's type check refused
        # ("invalid type"); `sources.check_upload` judges the files by name instead
        drop = pn.widgets.FileDropper(multiple=True, max_files=2, max_total_file_size=f"{limit:.0f}MB",
                                      layout="compact", width=165, css_classes=["rv-drop"],
                                      stylesheets=[DROP_CSS])
        drop.param.watch(self._on_drop, "value")
        return drop

    def _empty_drops(self) -> None:
        """Put an empty drop zone in every holder (the dropped files are taken: `_dropped` holds a half checkpoint)."""
        for holder in self._drop_holders:
            holder.objects = [self._new_drop()]

    def _on_drop(self, event: param.parameterized.Event) -> None:
        """Load what was dropped once it is a whole model: the last `.onnx` alone, or a `.json` and a `.safetensors`
        (the latest of each, this drop's or an earlier one's); one half of a checkpoint waits for the other. Files
        of other kinds are not held: alone, one line names them and what the zone takes (`dropped_elsewhere`); an
        `.onnx` with its external data is not loaded (it would fail on the missing data) and the line says where
        such a model goes (`where_big_files`). The model shown stays in both."""
        if not event.new:
            return
        # files the zone does not take (a .txt, a .pt, a .zip) are said, not kept: they were held silently
        taken = {k: v for k, v in event.new.items() if k.lower().endswith(MODEL_DROP_SUFFIXES)}
        others = [k for k in event.new if k not in taken]
        self._dropped.update({k: v.encode("utf-8") if isinstance(v, str) else v for k, v in taken.items()})
        files = self._dropped
        onnx = [k for k in taken if names_onnx_file(k)]
        cfg = [k for k in files if k.lower().endswith(".json")]
        st = [k for k in files if k.lower().endswith(".safetensors")]
        self._empty_drops()
        wait = (f"Dropped {(cfg or st)[-1]}: now drop the checkpoint's {'model.safetensors' if cfg else 'config.json'} "
                "too.") if cfg or st else ""
        data = [k for k in others if k.lower().endswith(EXTERNAL_DATA_SUFFIXES)]
        if onnx and data:  # its external data cannot come along (an upload is one file): it opens by path instead
            self._dropped = {}
            s = self.state
            still = f" Still showing {s.model.name}." if s.model is not None else ""
            s.param.update(message=f"Dropped {onnx[-1]} with its external data {', '.join(data)}: an .onnx file's "
                                   f"external data is never uploaded. {where_big_files()}{still}",
                           message_kind="warning")
        elif onnx:
            self._dropped = {}
            self.state.load_upload({onnx[-1]: files[onnx[-1]]})
        elif cfg and st:
            self._dropped = {}
            self.state.load_upload({cfg[-1]: files[cfg[-1]], st[-1]: files[st[-1]]})
        elif others:  # nothing loads: the model shown stays, and the line says so
            s = self.state
            still = f" Still showing {s.model.name}." if s.model is not None else ""
            s.param.update(message=f"{dropped_elsewhere(others)}{' ' + wait if wait else ''}{still}",
                           message_kind="warning")
        elif wait:
            self.state.param.update(message=wait, message_kind="info")

    def _on_ir_file(self, event: param.parameterized.Event) -> None:
        if event.new:
            self.ir.value = event.new.decode("utf-8", errors="replace")

    def __panel__(self) -> pn.viewable.Viewable:
        # Plain panes swapped by watchers, not `pn.bind` functions: each of those adds a layout model of its own to
        # every session's page (the page's Bokeh models are what a session costs the server).
        preset_doc = pn.pane.Markdown(self._preset_doc(), sizing_mode="stretch_width")
        self.state.param.watch(lambda e: setattr(preset_doc, "object", self._preset_doc()), "preset")
        by_source = {
            "preset": [self.preset_note, self.preset, self.preset_btn, preset_doc],
            "checkpoint": [self.folder, self.folder_btn],
            "upload": [self.upload, self.make_dropper(), self.upload_doc],
            "ir": [self.ir_hint],
        }
        box = pn.Column(*by_source[self.shown], sizing_mode="stretch_width")
        self.param.watch(lambda e: setattr(box, "objects", by_source[e.new]), "shown")
        return pn.Column("### Model", self.source, box, self.style, pn.Row(self.batch, self.seq), self.dims, self.text,
                         self.shape_note, sizing_mode="stretch_width")


    def editor(self) -> pn.viewable.Viewable:
        """The IR editor at the size of its tab: the text, a file to read it from, Load IR and Edit the shown
        version (the sidebar's "IR text" source opens this tab; `main.follow_editor`)."""
        return pn.Column(pn.Row(self.ir_btn, self.ir_copy, self.ir_file, sizing_mode="stretch_width"), self.ir_doc,
                         self.ir_placeholder, self.ir, sizing_mode="stretch_both", css_classes=["rv-ir-editor"])


def one_reason(reasons: dict[str, str]) -> str:
    """One line for the sidebar: why the teaching variants are off (`reasons`: variant name -> why it does not apply,
    '' when it does), without the variant's name (llama-block's six reasons differ in "(pre_ln too)" only and were
    printed six times); '' when none is off."""
    lines = dict.fromkeys(r.replace(f" ({name} too)", "") for name, r in reasons.items() if r)
    return " ".join(lines)


class VariantControls(Viewer):
    """One button per teaching variant (breaks one layer on purpose) and the layer it applies to."""

    state = param.ClassSelector(class_=AppState)

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        s = self.state
        self.buttons = {}
        for name, label in VARIANT_LABELS.items():
            b = pn.widgets.Button(label=label, color="primary" if s.variant == name else "light",
                                  sizing_mode="stretch_width", css_classes=[f"rv-variant-{name}"], margin=(2, 5))
            b.on_click(lambda e, n=name: s.apply_variant(n))
            self.buttons[name] = b
        # no start: the browser's input put back a negative layer with no word; `_layer_typed` clamps and says so
        self.notes = BoxNotes(s)
        self.layer = NumberBox("Layer to break", s.variant_layer, self._layer_unreadable, width=120,
                               css_classes=["rv-variant-layer"])
        self.layer.param.watch(self._layer_typed, "value")
        s.param.watch(lambda *e: self.notes.drop("layer"), ["source", "preset", "upload_id", "checkpoint_dir"])
        s.param.watch(lambda e: setattr(self.layer, "value", e.new), "variant_layer")
        self.why_off = pn.pane.Markdown("", styles={"font-size": "12px"}, css_classes=["rv-variant-note"])
        s.param.watch(self._mark, "variant")
        self.layer_off = pn.pane.Markdown("", styles={"font-size": "12px"}, css_classes=["rv-variant-layer-note"])
        s.param.watch(self._enable, ["source", "preset", "model", "variant"])
        self._enable()

    def _enable(self, *_: object) -> None:
        """A variant that does not apply to the current model is disabled, with the reason beside it."""
        reasons = {name: self.state.variant_unavailable(name) for name in self.buttons}
        for name, b in self.buttons.items():
            b.param.update(disabled=bool(reasons[name]), description=reasons[name] or None)
        self.why_off.object = f"*{md_escape(off)}*" if (off := one_reason(reasons)) else ""
        # over_threshold's size gate is model-wide: no layer to break while it is on, and the note says why
        model_wide = self.state.variant == SHAPE_VARIANT
        self.layer.disabled = model_wide or all(reasons[n] for n in self.buttons if n not in ("none", SHAPE_VARIANT))
        self.layer_off.object = f"*{md_escape(LAYER_OFF)}*" if model_wide else ""

    def _layer_typed(self, event: param.parameterized.Event) -> None:
        """A layer the model has becomes the variant's layer; a number past them is clamped to the nearest layer
        (the last, or 0), with the range said; an empty box is put back."""
        s = self.state
        lo, hi = s.param.variant_layer.bounds
        if event.new is not None and lo <= event.new and (hi is None or event.new <= hi):
            self.notes.drop("layer")
            s.variant_layer = event.new
            return
        if event.new is None:
            self.layer.value = s.variant_layer
            return
        near = lo if event.new < lo else hi
        text = f"Layer to break: this model has layers {lo}..{hi}, so {event.new} became {near}."
        if s.variant in ("none", SHAPE_VARIANT) or near == s.variant_layer:
            self.layer.value = near  # back here with a layer the model has: it becomes the variant's layer
            self.notes.say("layer", text)  # nothing reloads (or no variant notice follows): said now
        else:
            s.layer_note = text  # said with the variant's notice after the reload (it replaces the message)
            self.layer.value = near

    def _layer_unreadable(self, typed: str) -> None:
        """A layer that is no whole number: the box shows the variant's layer again, and the message says so."""
        self.notes.say("layer", f"Layer to break must be a whole number; {typed} is not, so it stays "
                                f"{self.state.variant_layer}.")

    def _mark(self, event: param.parameterized.Event) -> None:
        for name, b in self.buttons.items():
            b.color = "primary" if name == event.new else "light"

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column("### Teaching variants", *self.buttons.values(), self.why_off, self.layer, self.layer_off,
                         sizing_mode="stretch_width")


class PipelineControls(Viewer):
    """The passes in run order, each with on/off, move up/down and remove; add a pass; the threshold.

    Edits go to a draft shown here; "Apply and re-run" hands the draft to the state in one update, so the
    pipeline runs once per apply, not once per click. ↑/↓ move the selected pass, and the selection follows it.
    """

    state = param.ClassSelector(class_=AppState)
    order = param.List(default=[], item_type=str, doc="Draft pass order.")
    off = param.List(default=[], item_type=int, doc="Draft: positions in `order` that are switched off.")

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        s = self.state
        self.enabled = pn.widgets.CheckBoxGroup(options=[], value=[], inline=False, css_classes=["rv-passes"])
        self.enabled.param.watch(self._on_enabled, "value")
        self._syncing, self._follow = False, None
        self.pick = pn.widgets.Select(options=[], width=150, margin=(5, 5), name="", css_classes=["rv-pick"])
        self.pick.param.watch(lambda e: None if self._syncing else setattr(self, "_follow", e.new), "value")
        self.moves = []
        for label, tip, fn, cls in (("↑", "move the selected pass up", lambda i: self._move(i, -1), "rv-up"),
                                    ("↓", "move the selected pass down", lambda i: self._move(i, 1), "rv-down"),
                                    ("✕", "remove the selected pass", self._remove, "rv-remove")):
            b = pn.widgets.Button(label=label, description=tip, width=34, color="light", margin=(5, 1),
                                  css_classes=[cls])
            b.on_click(lambda e, fn=fn: self.pick.value is not None and fn(self.pick.value))
            self.moves.append(b)
        self.add = pn.widgets.Select(options=s.available_passes(), width=200, margin=(5, 5))
        self.add_btn = pn.widgets.Button(label="Add", color="light", width=60, margin=(5, 5))
        self.add_btn.on_click(lambda e: self.add.value and setattr(self, "order", [*self.order, self.add.value]))
        self.notes = BoxNotes(s)
        self.threshold = NumberBox(  # no start: the browser put back 0 with no word
            gate_box(s.variant, s.threshold, s.default_threshold())[0], s.threshold,
            self._threshold_unreadable, sizing_mode="stretch_width", css_classes=["rv-threshold"])
        self.threshold.param.watch(self._threshold_typed, "value")
        s.param.watch(self._gate_shown, ["variant", "threshold"])  # the gate a variant sets shows in the box
        self._gate_shown()
        s.param.watch(lambda e: setattr(self.threshold, "value", e.new), "threshold")
        # a note about the gate is about the pipeline it was typed for: another one applied, and it no longer holds
        s.param.watch(lambda *e: self.notes.drop("threshold"), ["passes", "disabled", "source", "preset"])
        self.reset = pn.widgets.Button(label="Canonical order", color="light")
        self.reset.on_click(lambda e: s.reset_pipeline())
        self.rerun = pn.widgets.Button(label="Apply and re-run", color="primary", css_classes=["rv-apply"])
        self.rerun.on_click(lambda e: self.apply())
        self.pending = pn.pane.Markdown("", styles={"font-size": "12px"}, css_classes=["rv-pending"])
        s.param.watch(lambda *e: self._from_state(), ["passes", "disabled"])
        self.param.watch(lambda *e: self._rebuild(), ["order", "off"])
        self._from_state()

    def _gate_shown(self, *_: object) -> None:
        label, placeholder = gate_box(self.state.variant, self.state.threshold, self.state.default_threshold())
        self.threshold.text.param.update(name=label, placeholder=placeholder)

    def _threshold_typed(self, event: param.parameterized.Event) -> None:
        """A gate typed: empty is the pipeline's default; below 1 it becomes 1, and the message says so."""
        s = self.state
        if event.new is None or event.new >= 1:
            self.notes.drop("threshold")
            s.threshold = event.new
            return
        self.threshold.value = 1
        self.notes.say("threshold", f"Attention gate {event.new} is out of range: batch*seq is at least 1, so it "
                                    "became 1 (empty: the pipeline's default).")

    def _threshold_unreadable(self, typed: str) -> None:
        """A gate that is no whole number: the box shows the gate again, and the message says so."""
        gate = self.state.threshold
        now = "empty (the pipeline's default)" if gate is None else gate
        self.notes.say("threshold", f"Attention gate must be a whole number (or empty for the pipeline's default); "
                                    f"{typed} is not, so it stays {now}.")

    def _from_state(self) -> None:
        order, off = list(self.state.passes), list(self.state.disabled)
        if order == self.order and off == self.off:
            self._rebuild()  # param sends no event when the draft already equals the pipeline (after Apply)
        else:
            self.param.update(order=order, off=off)  # the draft's watcher rebuilds, once

    @property
    def dirty(self) -> bool:
        """The draft differs from the pipeline that ran."""
        return self.order != self.state.passes or sorted(self.off) != sorted(self.state.disabled)

    def apply(self) -> None:
        """Run the draft pipeline (or re-run the same one)."""
        s = self.state
        self.notes.drop("threshold")  # a run applied: the note about the gate typed before it no longer holds
        if self.dirty:
            s.param.update(passes=list(self.order), disabled=sorted(self.off))
        else:
            s.load()

    def _move(self, i: int, delta: int) -> None:
        """Move draft position `i` by `delta`, keeping its on/off state; the selection follows the pass."""
        if (moved := move_position(self.order, self.off, i, delta)) is not None:
            self._follow = i + delta
            self.param.update(order=moved[0], off=moved[1])

    def _remove(self, i: int) -> None:
        if 0 <= i < len(self.order):
            self._follow = None
            self.param.update(order=self.order[:i] + self.order[i + 1:],
                              off=[k - (k > i) for k in self.off if k != i])

    def _rebuild(self) -> None:
        labels = {f"{i + 1}. {name}": i for i, name in enumerate(self.order)}
        self._syncing = True
        try:
            self.enabled.param.update(options=labels, value=[i for i in labels.values() if i not in self.off])
            keep = self._follow if self._follow in labels.values() else None
            self._follow = keep
            self.pick.param.update(options=labels, value=keep)
        finally:
            self._syncing = False
        self.pending.object = ("**Pipeline changed:** press *Apply and re-run* to run it." if self.dirty else "")

    def _on_enabled(self, event: param.parameterized.Event) -> None:
        if self._syncing:
            return
        on = set(event.new)
        self.off = [i for i in range(len(self.order)) if i not in on]

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column("### Pipeline", "Passes run top to bottom; untick to skip one, then apply.", self.enabled,
                         pn.Row(self.pick, *self.moves), pn.Row(self.add, self.add_btn), self.threshold,
                         self.pending, pn.Row(self.reset, self.rerun), sizing_mode="stretch_width")
