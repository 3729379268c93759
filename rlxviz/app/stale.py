"""What a view shows while the last load or pipeline run failed and it still shows the previous one (`StaleMark`),
and `safe`, which turns a view's failing call into text for the page."""

from __future__ import annotations

from typing import Any

import panel as pn
import param

from ..viz import GraphTooLarge, LayoutError
from .state import AppState
from .text import html_text, md_escape

SAID_AS_IS = (LayoutError, GraphTooLarge)
"""Errors whose message is written for the page (what was drawn, what happened, what to do): shown without their
type's name (`LayoutError: [layout] system failed (exit -11):` read as an internal crash line)."""


def safe(fn: Any, *args: Any) -> tuple[Any, str | None]:
    """`(fn(*args), None)`, or `(None, "TypeName: message")` when it raised (the message alone for `SAID_AS_IS`)."""
    try:
        return fn(*args), None
    except SAID_AS_IS as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - shown in the page instead of breaking the view
        return None, f"{type(e).__name__}: {e}"


MORE_SUMMARY = "the whole message"
"""The label of the stale box's fold that holds the failure's whole message (`AppState.stale_more`)."""


def unfolded(text: str) -> str:
    """`text` (a failure's whole message, data) as a fold under the stale box's line: a `<details>` element, its
    lines joined by `<br>` (in its summary's tooltip by a newline's entity: a blank line would end the HTML block
    in Markdown), every character escaped."""
    lines = [html_text(ln) for ln in text.splitlines() if ln.strip()]
    return (f'\n\n<details class="rv-stale-more"><summary title="{"&#10;".join(lines)}">{MORE_SUMMARY}</summary>'
            f'{"<br>".join(lines)}</details>')


class StaleMark:
    """A banner (`rv-stale rv-stale-WHERE`) over panes that show the state's model or run, and those panes greyed,
    while the last load or pipeline run failed and they still show the previous one (`AppState.stale`)."""

    def __init__(self, state: AppState, where: str, *panes: pn.viewable.Viewable) -> None:
        self.state, self.panes = state, panes
        self.banner = pn.pane.Markdown("", css_classes=["rv-stale", f"rv-stale-{where}"], margin=(0, 10),
                                       styles={"color": "#8a1c1c", "background": "#fff4e5"}, visible=False)
        state.param.watch(self.update, ["stale", "stale_more"])
        self.update()

    def update(self, *events: param.parameterized.Event) -> None:
        stale = self.state.stale
        more = self.state.stale_more if stale else ""
        self.banner.param.update(object=md_escape(stale) + (unfolded(more) if more else ""), visible=bool(stale))
        for p in self.panes:
            # "1", not {}: the browser keeps a style property whose key is left out, so the panes stayed faded
            # after the next good load (Bokeh applies the keys it is sent; it removes none)
            p.styles = {**p.styles, "opacity": "0.45" if stale else "1"}


__all__ = ["MORE_SUMMARY", "StaleMark", "safe", "unfolded"]
