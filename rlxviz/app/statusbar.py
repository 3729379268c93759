"""The message banner: the last message (errors say what to do), folded to one line when long ("more" drops the
whole message down over the rows below it, the graph keeping its room), and the progress of the running job. A Panel
`Viewer` that reads one `AppState`; the message is data, shown escaped.
"""

from __future__ import annotations

import re

import panel as pn
import param
from panel.viewable import Viewer

from .state import AppState
from .text import md_escape, md_pre

BUTTON_W, BUTTON_MARGIN = 72, 4
"""Width of the "more" and "dismiss" buttons beside the message, and their left and right margins (px)."""
BESIDE = 2 * (BUTTON_W + 2 * BUTTON_MARGIN) + 2 * 10
"""What the banner's row gives the buttons and the message's own margins (px): the dropped message's width is the
row's less this, as the folded one's is."""
MESSAGE_CSS = (":host(.alert) { padding: 0.3rem 0.75rem; font-size: 14px; line-height: 1.35; } "
               ":host(.alert) p { margin: 0.15em 0; } "
               ":host(.rv-clamp) { max-height: 30px; overflow: hidden; padding-top: 0.2rem; padding-bottom: 0.2rem; } "
               ":host(.rv-clamp) p, :host(.rv-clamp) pre { white-space: nowrap; overflow: hidden; "
               "text-overflow: ellipsis; margin: 0; } "
               f":host(.rv-over) {{ position: absolute; top: 0; left: 0; width: calc(100% - {BESIDE}px) !important; "
               "z-index: 20; box-shadow: 0 4px 12px rgba(0, 0, 0, 0.25); max-height: calc(100vh - 150px); "
               "overflow-y: auto; }")
"""The message banner, compact: a teaching variant's notice (three lines at 1280 px) took 104 px above the graph
panes with the alert's padding and the paragraphs' margins (issue 39's room). A long message is folded to its first
line (`rv-clamp`, cut with an ellipsis) until its "more" button unfolds it: unfolded in the page's flow, that notice
still took 77 px, and the graph got 408 px of an 800 px window instead of 450: its whole text was never readable
beside a 450 px graph (a newcomer at 1280x800). "more" drops it down whole over
the version rows below it instead (`rv-over`: out of the flow, in the folded line's place and width, with a shadow),
the graph keeping its size and place; "less" folds it back. A message whose whole text is taller than the window
less the header and the strip scrolls in its box."""
LONG_MESSAGE = 100
"""A message longer than this (characters), or of more than one line, opens folded to one line with a "more"
button (one line of the banner holds about 130 characters at 1280 px)."""


QUOTED_PLACE = re.compile(r"\n[ \t]*\^[ \t]*(?:\n|$)")
"""A message's caret line under a quoted line of IR text (`ir.quote_place`): such a message opens unfolded."""


class StatusBar(Viewer):
    """The last message (errors say what to do) and the progress of the running job."""

    state = param.ClassSelector(class_=AppState)

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        s = self.state
        self.alert = pn.pane.Alert(_md_text(s.message), alert_type=s.message_kind, visible=bool(s.message),
                                   sizing_mode="stretch_width", css_classes=["rv-message"], margin=(0, 10),
                                   stylesheets=[MESSAGE_CSS])
        self.bar = pn.indicators.Progress(value=s.progress, max=100, visible=s.busy, sizing_mode="stretch_width",
                                          height=14, bar_color="primary", margin=(0, 10))
        self.label = pn.pane.Str(s.progress_text, visible=s.busy, css_classes=["rv-progress-text"],
                                 margin=(0, 10), styles={"font-size": "12px"})
        small = dict(color="light", height=26, margin=(2, BUTTON_MARGIN), sizing_mode="fixed", align="center")
        # "more": a long message opens folded to its first line; this button drops it down whole (and folds it)
        self.more = pn.widgets.Button(label="more ▾", width=BUTTON_W, css_classes=["rv-message-more"], **small)
        self.more.on_click(lambda e: self.unfold(not self.unfolded, over=True))
        # shown with a message only: a page that opened on another session's run (no job, so no `_update`) showed
        # a lone "dismiss" over the version row
        self.close = pn.widgets.Button(label="dismiss", width=BUTTON_W, css_classes=["rv-message-dismiss"],
                                       visible=bool(s.message), **small)
        self.close.on_click(lambda e: s.param.update(message=""))
        self.unfolded = False
        self._fold_to(s.message)
        s.param.watch(self._update, ["message", "message_kind", "busy", "progress", "progress_text"])

    def _fold_to(self, message: str) -> None:
        """A new message: folded to one line when long (`LONG_MESSAGE`), with "more" shown; a short one whole. An
        error that quotes a line of IR text with a caret under its column (`ir.quote_place`) opens whole, "less"
        folding it: folded, its first line showed the place but neither the line nor the caret (issue 39)."""
        long = len(message) > LONG_MESSAGE or "\n" in message.strip()
        self.more.visible = bool(message) and long
        self.unfold(not long or QUOTED_PLACE.search(message) is not None)

    def unfold(self, whole: bool, over: bool = False) -> None:
        """Show the whole message (`whole`) or fold it to its first line (the "more ▾" / "less ▴" button). `over`:
        the whole message lies over the rows below the banner (`rv-over`, "more" clicked) instead of pushing them
        down (a message that opens whole, `_fold_to`)."""
        self.unfolded = whole
        shown = ("rv-over",) if over else ()
        self.alert.css_classes = ["rv-message", *(shown if whole else ("rv-clamp",))]
        self.more.label = "less ▴" if whole else "more ▾"

    def _update(self, *events: param.parameterized.Event) -> None:
        s = self.state
        if any(e.name == "message" for e in events):
            self._fold_to(s.message)
        self.alert.param.update(object=_md_text(s.message), alert_type=s.message_kind, visible=bool(s.message))
        self.close.visible = bool(s.message)
        self.bar.param.update(value=s.progress, visible=s.busy)
        self.label.param.update(object=s.progress_text, visible=s.busy)

    def __panel__(self) -> pn.viewable.Viewable:
        # the buttons keep the row's right end while the dropped message (`rv-over`) is out of the row's flow
        row = pn.Row(self.alert, self.more, self.close, sizing_mode="stretch_width",
                     styles={"justify-content": "flex-end"})
        return pn.Column(row, self.bar, self.label, sizing_mode="stretch_width")


def _md_text(text: str) -> str:
    """A message for a Markdown pane: first line as text, quoted IR/details in a code block, the last line
    (what to do) as text."""
    lines = text.splitlines()
    if len(lines) <= 1:
        return md_escape(text)
    head, *mid, last = lines
    block = md_pre("\n".join(mid)) if mid else "\n\n"
    return f"{md_escape(head)}{block}{md_escape(last)}"
