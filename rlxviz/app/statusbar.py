"""The message banner: the last message (errors say what to do), folded to one line when long, and the progress of
the running job. A Panel `Viewer` that reads one `AppState`; the message is data, shown escaped.
"""

from __future__ import annotations

import re

import panel as pn
import param
from panel.viewable import Viewer

from .state import AppState
from .text import md_escape, md_pre

MESSAGE_CSS = (":host(.alert) { padding: 0.3rem 0.75rem; font-size: 14px; line-height: 1.35; } "
               ":host(.alert) p { margin: 0.15em 0; } "
               ":host(.rv-clamp) { max-height: 30px; overflow: hidden; padding-top: 0.2rem; padding-bottom: 0.2rem; } "
               ":host(.rv-clamp) p, :host(.rv-clamp) pre { white-space: nowrap; overflow: hidden; "
               "text-overflow: ellipsis; margin: 0; }")
"""The message banner, compact: a teaching variant's notice (three lines at 1280 px) took 104 px above the graph
panes with the alert's padding and the paragraphs' margins (issue 39's room). A long message is folded to its first
line (`rv-clamp`, cut with an ellipsis) until its "more" button unfolds it: unfolded, that notice still took 77 px,
and the graph got 382 px of a 800 px window instead of 450."""
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
        small = dict(color="light", height=26, margin=(2, 4), sizing_mode="fixed", align="center")
        # "more": a long message opens folded to its first line; this button unfolds (and folds) it
        self.more = pn.widgets.Button(label="more ▾", width=72, css_classes=["rv-message-more"], **small)
        self.more.on_click(lambda e: self.unfold(not self.unfolded))
        # shown with a message only: a page that opened on another session's run (no job, so no `_update`) showed
        # a lone "dismiss" over the version row
        self.close = pn.widgets.Button(label="dismiss", width=72, css_classes=["rv-message-dismiss"],
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

    def unfold(self, whole: bool) -> None:
        """Show the whole message (`whole`) or fold it to its first line (the "more ▾" / "less ▴" button)."""
        self.unfolded = whole
        self.alert.css_classes = ["rv-message"] if whole else ["rv-message", "rv-clamp"]
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
        return pn.Column(pn.Row(self.alert, self.more, self.close, sizing_mode="stretch_width"), self.bar, self.label,
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
