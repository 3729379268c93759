"""Sidebar views: model source and shapes, teaching variants, pipeline, and the status line.

Each is a Panel `Viewer` that reads and writes one `AppState`; none holds state of its own.
"""

from __future__ import annotations

import panel as pn
import param
from panel.viewable import Viewer

from .sources import ALLOWED_DIRS_ENV, allowed_dirs, max_upload_bytes
from .state import SOURCES, VARIANT_LABELS, AppState
from .text import md_escape, md_pre

SOURCE_LABELS = {"preset": "Built-in", "checkpoint": "Folder", "upload": "Upload", "ir": "IR text"}


class ModelControls(Viewer):
    """Model source (preset, checkpoint folder, upload, IR text), graph style, batch, seq and text."""

    state = param.ClassSelector(class_=AppState)

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        s = self.state
        self.source = pn.widgets.RadioButtonGroup(name="Source", options={SOURCE_LABELS[k]: k for k in SOURCES},
                                                  value=s.source, button_type="light", sizing_mode="stretch_width")
        self.source.param.watch(lambda e: setattr(s, "source", e.new), "value")
        self.preset = pn.widgets.Select.from_param(s.param.preset, name="Model", sizing_mode="stretch_width")
        roots = allowed_dirs()
        self.folder = pn.widgets.TextInput(name="Checkpoint folder", value=s.checkpoint_dir,
                                           placeholder=str(roots[0]) if roots else f"disabled: set {ALLOWED_DIRS_ENV}",
                                           sizing_mode="stretch_width")
        self.folder_btn = pn.widgets.Button(label="Load folder", color="primary")
        self.folder_btn.on_click(lambda e: s.param.update(checkpoint_dir=self.folder.value, source="checkpoint"))
        self.upload = pn.widgets.FileInput(accept=".json,.safetensors,.onnx", multiple=True, name="Checkpoint files",
                                           sizing_mode="stretch_width", css_classes=["rv-upload"])
        self.upload.param.watch(self._on_upload, "value")
        limit = max_upload_bytes() / 2**20
        self.upload_doc = pn.pane.Markdown(f"Select **config.json** and **model.safetensors** together, or one "
                                           f"**.onnx** export (at most {limit:.0f} MB).", styles={"font-size": "12px"})
        self.ir = pn.widgets.TextAreaInput(name="IR text", value=s.ir_text, height=220, sizing_mode="stretch_width",
                                           css_classes=["rv-ir-text"],
                                           placeholder="graph g {\n  %0 = input {name=\"x\"} : f32[2, 8]\n  ...")
        self.ir_file = pn.widgets.FileInput(accept=".txt,.ir,.rlx", sizing_mode="stretch_width")
        self.ir_file.param.watch(self._on_ir_file, "value")
        self.ir_btn = pn.widgets.Button(label="Load IR", color="primary", css_classes=["rv-load-ir"])
        self.ir_btn.on_click(lambda e: s.param.update(ir_text=self.ir.value, source="ir"))
        self.ir_copy = pn.widgets.Button(label="Edit the shown version", color="light")
        self.ir_copy.on_click(lambda e: setattr(self.ir, "value", s.ir_current()))
        self.style = pn.widgets.Select.from_param(s.param.style, name="Graph style", sizing_mode="stretch_width")
        self.batch = pn.widgets.IntInput.from_param(s.param.batch, name="Batch", width=90)
        self.seq = pn.widgets.IntInput.from_param(s.param.seq, name="Sequence length", width=120)
        self.text = pn.widgets.TextAreaInput.from_param(s.param.text, name="Text to tokenize (real models)",
                                                        rows=3, auto_grow=True, max_rows=8,
                                                        sizing_mode="stretch_width", css_classes=["rv-text"])
        s.param.watch(lambda e: setattr(self.source, "value", e.new), "source")

    def _preset_doc(self) -> str:
        from ..session import presets

        return presets().get(self.state.preset, "")

    def _on_upload(self, event: param.parameterized.Event) -> None:
        if not event.new:
            return
        names = self.upload.filename if isinstance(self.upload.filename, list) else [self.upload.filename]
        values = event.new if isinstance(event.new, list) else [event.new]
        self.state.load_upload(dict(zip(names, values, strict=False)))

    def _on_ir_file(self, event: param.parameterized.Event) -> None:
        if event.new:
            self.ir.value = event.new.decode("utf-8", errors="replace")

    def __panel__(self) -> pn.viewable.Viewable:
        s = self.state
        by_source = {
            "preset": pn.Column(self.preset, pn.bind(lambda p: self._preset_doc(), s.param.preset),
                                sizing_mode="stretch_width"),
            "checkpoint": pn.Column(self.folder, self.folder_btn, sizing_mode="stretch_width"),
            "upload": pn.Column(self.upload, self.upload_doc, sizing_mode="stretch_width"),
            "ir": pn.Column(self.ir, self.ir_file, pn.Row(self.ir_btn, self.ir_copy), sizing_mode="stretch_width"),
        }
        return pn.Column(
            "### Model", self.source, pn.bind(lambda src: by_source[src], s.param.source),
            self.style, pn.Row(self.batch, self.seq), self.text, sizing_mode="stretch_width")


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
        self.layer = pn.widgets.IntInput.from_param(s.param.variant_layer, name="Layer to break", width=120)
        s.param.watch(self._mark, "variant")
        s.param.watch(self._enable, "source")
        self._enable()

    def _enable(self, *_: object) -> None:
        """Variants rebuild a BERT graph: they are off for IR text."""
        for name, b in self.buttons.items():
            b.disabled = self.state.source == "ir" and name != "none"

    def _mark(self, event: param.parameterized.Event) -> None:
        for name, b in self.buttons.items():
            b.color = "primary" if name == event.new else "light"

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column("### Teaching variants", *self.buttons.values(), self.layer, sizing_mode="stretch_width")


class PipelineControls(Viewer):
    """The passes in run order, each with on/off, move up/down and remove; add a pass; the threshold; re-run."""

    state = param.ClassSelector(class_=AppState)

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        s = self.state
        self.enabled = pn.widgets.CheckBoxGroup(options=[], value=[], inline=False, css_classes=["rv-passes"])
        self.enabled.param.watch(self._on_enabled, "value")
        self.pick = pn.widgets.Select(options=[], width=150, margin=(5, 5), name="")
        self.moves = []
        for label, tip, fn in (("↑", "move up", lambda i: s.move_pass(i, -1)), ("↓", "move down",
                               lambda i: s.move_pass(i, 1)), ("✕", "remove", s.remove_pass)):
            b = pn.widgets.Button(label=label, description=tip, width=34, color="light", margin=(5, 1))
            b.on_click(lambda e, fn=fn: self.pick.value is not None and fn(self.pick.value))
            self.moves.append(b)
        self.add = pn.widgets.Select(options=s.available_passes(), width=200, margin=(5, 5))
        self.add_btn = pn.widgets.Button(label="Add", color="light", width=60, margin=(5, 5))
        self.add_btn.on_click(lambda e: self.add.value and s.add_pass(self.add.value))
        default = s.default_threshold()
        self.threshold = pn.widgets.IntInput(
            name=f"Attention gate: max batch*seq (empty: {'no gate' if default is None else default})",
            value=s.threshold, start=1, sizing_mode="stretch_width")
        self.threshold.param.watch(lambda e: setattr(s, "threshold", e.new), "value")
        s.param.watch(lambda e: setattr(self.threshold, "value", e.new), "threshold")
        self.reset = pn.widgets.Button(label="Canonical order", color="light")
        self.reset.on_click(lambda e: s.reset_pipeline())
        self.rerun = pn.widgets.Button(label="Re-run", color="primary")
        self.rerun.on_click(lambda e: s.load())
        s.param.watch(lambda e: self._rebuild(), ["passes", "disabled"])
        self._rebuild()

    def _rebuild(self) -> None:
        s = self.state
        labels = {f"{i + 1}. {name}": i for i, name in enumerate(s.passes)}
        self._syncing = True
        try:
            self.enabled.param.update(options=labels, value=[i for i in labels.values() if i not in s.disabled])
            keep = self.pick.value
            self.pick.param.update(options=labels, value=keep if keep in labels.values() else None)
        finally:
            self._syncing = False

    def _on_enabled(self, event: param.parameterized.Event) -> None:
        if getattr(self, "_syncing", False):
            return
        on = set(event.new)
        self.state.disabled = [i for i in range(len(self.state.passes)) if i not in on]

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column("### Pipeline", "Passes run top to bottom; untick to skip one.", self.enabled,
                         pn.Row(self.pick, *self.moves), pn.Row(self.add, self.add_btn), self.threshold,
                         pn.Row(self.reset, self.rerun), sizing_mode="stretch_width")


class StatusBar(Viewer):
    """The last message (errors say what to do) and the progress of the running job."""

    state = param.ClassSelector(class_=AppState)

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        s = self.state
        self.alert = pn.pane.Alert(_md_text(s.message), alert_type=s.message_kind, visible=bool(s.message),
                                   sizing_mode="stretch_width", css_classes=["rv-message"], margin=(0, 10))
        self.bar = pn.indicators.Progress(value=s.progress, max=100, visible=s.busy, sizing_mode="stretch_width",
                                          height=14, bar_color="primary", margin=(0, 10))
        self.label = pn.pane.Str(s.progress_text, visible=s.busy, css_classes=["rv-progress-text"],
                                 margin=(0, 10), styles={"font-size": "12px"})
        self.close = pn.widgets.Button(label="dismiss", color="light", width=80, visible=bool(s.message))
        self.close.on_click(lambda e: s.param.update(message=""))
        s.param.watch(self._update, ["message", "message_kind", "busy", "progress", "progress_text"])

    def _update(self, *events: param.parameterized.Event) -> None:
        s = self.state
        self.alert.param.update(object=_md_text(s.message), alert_type=s.message_kind, visible=bool(s.message))
        self.close.visible = bool(s.message)
        self.bar.param.update(value=s.progress, visible=s.busy)
        self.label.param.update(object=s.progress_text, visible=s.busy)

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(pn.Row(self.alert, self.close, sizing_mode="stretch_width"), self.bar, self.label,
                         sizing_mode="stretch_width")


def _md_text(text: str) -> str:
    """A message for a Markdown pane: first line as text, quoted IR/details in a code block, the last line
    (what to do) as text."""
    lines = text.splitlines()
    if len(lines) <= 1:
        return md_escape(text)
    head, *mid, last = lines
    block = md_pre("\n".join(mid)) if mid else "\n\n"
    return f"{md_escape(head)}{block}{md_escape(last)}"
