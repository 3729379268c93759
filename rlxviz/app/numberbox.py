"""Number boxes read on the server (`NumberBox`) and the notes a control gives about them (`BoxNotes`).

Bokeh's integer input filters what is typed in the page, so a value that is no whole number never reached the server
and no message could say why it was put back (issue 39); these boxes send their text instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import panel as pn
import param
from panel.viewable import Viewer

from .state import AppState

WHOLE = re.compile(r"[-+]?\d+")
"""A whole number as a box takes it: digits, an optional sign (`2.5`, `1e3` and `abc` are not)."""


def whole_number(text: str | None) -> tuple[bool, int | None]:
    """`text` read as a whole number: (True, n); an empty box (True, None); anything else (`abc`, `2.5`, `1e3`)
    (False, None)."""
    t = (text or "").strip()
    if not t:
        return True, None
    return (True, int(t)) if WHOLE.fullmatch(t) else (False, None)


class NumberBox(Viewer):
    """A box for a whole number, typed as text and read on the server.

    Bokeh's integer input filters what is typed in the page: `abc`, `2.5` or `1e3` were put back there (or the box
    emptied) and the server never heard of it, so no message said why and the last one stayed up. Here the page sends
    the text; a whole number (or an empty box) becomes `value`, anything else calls `on_bad(text)` and the box shows
    `value` again. `value` set from Python shows in the box; a whole number entered that equals `value` still
    notifies `value`'s watchers (`param.trigger`), so a stale message about the box can go: also when the box's text
    already says it (after a clamp, "-1" became "0" in the box; "0" entered again sent no change, and "-1 is out of
    range" stayed up). Enter sends the text even when unchanged (Panel's `enter_pressed` sets the text again), and
    the text is watched with `onlychanged=False`, so that same text is heard.
    """

    value = param.Integer(default=None, allow_None=True, doc="The whole number in the box (None: empty).")
    disabled = param.Boolean(False)

    def __init__(self, label: str, value: int | None, on_bad: Callable[[str], None], **text_params: object) -> None:
        super().__init__(value=value)
        self._on_bad, self._syncing = on_bad, False
        self.text = pn.widgets.TextInput(name=label, value=_shown(value), **text_params)
        self.text.param.watch(self._typed, "value", onlychanged=False)  # the same text entered again counts
        self.param.watch(lambda e: self._show(e.new), "value")
        self.param.watch(lambda e: setattr(self.text, "disabled", e.new), "disabled")

    def _show(self, value: int | None) -> None:
        self._syncing = True
        try:
            self.text.value = _shown(value)
        finally:
            self._syncing = False

    def _typed(self, event: param.parameterized.Event) -> None:
        if self._syncing:
            return
        ok, n = whole_number(event.new)
        if not ok:
            self._show(self.value)
            self._on_bad(event.new.strip())
        elif n == self.value:
            self._show(n)  # "04" shows as 4
            self.param.trigger("value")
        else:
            self.value = n

    def __panel__(self) -> pn.viewable.Viewable:
        return self.text


def _shown(value: int | None) -> str:
    return "" if value is None else str(value)


class BoxNotes:
    """What a control said about its number boxes: a message about a box goes when that box gets a valid value or
    when what it was about changes (`drop_note`), unless another message replaced it."""

    def __init__(self, state: AppState) -> None:
        self._state, self._said = state, {}

    def say(self, box: str, text: str) -> None:
        self._state._error(text, "info")
        self._said[box] = self._state.message

    def drop(self, *boxes: str) -> None:
        s = self._state
        for box in boxes:
            said = self._said.pop(box, None)
            if said and s.message == said:
                s.param.update(message="", message_kind="info")


__all__ = ["WHOLE", "BoxNotes", "NumberBox", "whole_number"]
