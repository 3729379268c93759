"""The "start here" strip the page opens on: three clicks (step through the passes, break a layer, ask why) and a
drop zone for one's own model. Each click does the step itself and says what to look at next.
"""

from __future__ import annotations

from collections.abc import Callable

import panel as pn
import param
from panel.viewable import Viewer

from .state import AppState
from .text import md_escape

BREAK_VARIANT = "extra_h1_user"
"""The variant the second click applies: a second user of the attention output h1, which the layer fusion's guard
refuses (the Why tab then names that guard)."""
BREAK_LAYER = 1
"""The layer the second click breaks (layer 0 when the model has only one)."""

STEPS = ("Three clicks: watch the graph shrink pass by pass, break a layer on purpose, ask why it did not fuse. "
         "Or drop your own model (.onnx) at the right.")


class StartHere(Viewer):
    """Three buttons that do the first three steps, a line saying what each did, and a model drop zone.

    Args:
        state: the session's state.
        show_why: opens the Why tab (the page's tabs belong to the template).
        dropper: the drop zone to place at the right (`ModelControls.make_dropper`), or None.
    """

    state = param.ClassSelector(class_=AppState)

    def __init__(self, show_why: Callable[[], None], dropper: pn.viewable.Viewable | None = None,
                 **params: object) -> None:
        super().__init__(**params)
        s = self.state
        self.show_why = show_why
        fixed = dict(color="primary", sizing_mode="fixed", height=34, align="center")
        self.step = pn.widgets.Button(label="① Step through the passes ▶", width=220, **fixed,
                                      css_classes=["rv-start-step"])
        self.brk = pn.widgets.Button(label="② Break a layer", width=140, **fixed, css_classes=["rv-start-break"])
        self.why = pn.widgets.Button(label="③ Ask why", width=110, **fixed, css_classes=["rv-start-why"])
        # no tooltips: a button's popover lay over its neighbour and took its click
        self.hide = pn.widgets.Button(label="✕", color="light", width=36, height=34, sizing_mode="fixed",
                                      align="center", css_classes=["rv-start-hide"])
        self.note = pn.pane.Markdown(STEPS, css_classes=["rv-start-note"], margin=(0, 8), align="center",
                                     styles={"font-size": "12px", "line-height": "1.25"}, sizing_mode="stretch_width")
        self.title = pn.pane.Markdown("**Start here**", margin=(0, 4, 0, 10), align="center", width=90, height=24,
                                      sizing_mode="fixed", css_classes=["rv-start-title"])
        self.step.on_click(lambda e: self.next_version())
        self.brk.on_click(lambda e: self.break_layer())
        self.why.on_click(lambda e: self.ask_why())
        self.dropper = dropper
        drop = [dropper] if dropper is not None else []
        self.strip = pn.Row(self.title, self.step, self.brk, self.why, self.note, *drop, self.hide,
                            sizing_mode="stretch_width", css_classes=["rv-start"],
                            styles={"background": "#e3f2fd", "border-radius": "6px"})
        self.dismissed = False
        self.hide.on_click(lambda e: self.dismiss())
        s.param.watch(self._enable, ["model", "source", "preset"])
        self._enable()

    def _enable(self, *_: object) -> None:
        reason = self.state.variant_unavailable(BREAK_VARIANT)
        self.brk.disabled = bool(reason)
        if reason:
            self.note.object = md_escape(reason)

    def next_version(self) -> None:
        """Show the next version (after the last: the input again)."""
        s = self.state
        n = len(s.version_labels)
        if n:
            s.version = (s.version + 1) % n
            self.note.object = (f"Showing **{md_escape(s.version_labels[s.version])}** ({s.version} of {n - 1}): "
                                "the left pane is the graph before this pass (what it matched framed in green), the "
                                "right one after it. Click again for the next pass, then ②.")

    def break_layer(self) -> None:
        """Apply `BREAK_VARIANT` to `BREAK_LAYER` (or layer 0) and re-run; the banner names the guard it trips."""
        s = self.state
        reason = s.variant_unavailable(BREAK_VARIANT)
        if reason:
            self.note.object = md_escape(reason)
            return
        layers = s.layers()
        layer = BREAK_LAYER if BREAK_LAYER in layers else (layers[0] if layers else 0)
        s.param.update(variant_layer=layer, variant=BREAK_VARIANT)
        self.note.object = (f"Layer {layer} now has an extra user of its attention output, so it must stay unfused: "
                            "the message above names the guard that refused it. Now ③.")

    def ask_why(self) -> None:
        """Open the Why tab on the broken layer (or the selected one, or the first)."""
        s = self.state
        layers = s.layers()
        if s.selected_layer is None and layers:
            s.selected_layer = s.variant_layer if s.variant_layer in layers else layers[0]
        self.show_why()
        self.note.object = ("The Why tab lists each pattern's outcome on the layer and the first guard that failed. "
                            "More: the Matches & rejections table, the Timing tab, the sidebar (☰).")

    def dismiss(self) -> None:
        """Hide the strip for the rest of the session (its ✕)."""
        self.dismissed = True
        self.strip.visible = False

    def show_on(self, shown: bool) -> None:
        """Show the strip (unless dismissed) or hide it: the page shows it on the tabs its steps use (Graph and
        Why), not over the table, timing, IR and editor tabs, whose room it would take."""
        self.strip.visible = shown and not self.dismissed

    def __panel__(self) -> pn.viewable.Viewable:
        return self.strip


__all__ = ["BREAK_LAYER", "BREAK_VARIANT", "STEPS", "StartHere"]
