"""Page layout helpers: the sidebar folded on a laptop-sized window, and the tab that follows the IR editor.

At 1280 px the sidebar (340 px) left the before and after panes 265 px each; folded, they get about 600 px each.
The sidebar's ☰ button (the template's own) opens and folds it at any width.
"""

from __future__ import annotations

from collections.abc import Callable

import panel as pn
import param
from panel.custom import JSComponent

from .state import AppState

NARROW_PX = 1600
"""A window narrower than this opens with the sidebar folded: beside an open sidebar (357 px with its border) two
panes of 560 px and the page's margins need about 1600 px."""


class FoldSidebar(JSComponent):
    """Folds the template's sidebar in a window narrower than `narrow` px when the page is first drawn, and again
    each time `folds` goes up (`fold_for_drawer`: the node drawer opened; beside an open sidebar at 1280 px it left
    the after pane ~97 px). Calls the template's own `closeNav`, so its ☰ button opens it again. Draws nothing."""

    narrow = param.Integer(NARROW_PX)
    folds = param.Integer(0, doc="Raised to fold the sidebar now (in a narrow window only).")

    _esm = """
export function render({ model, el }) {
  el.style.display = 'none';
  const fold = () => {
    if (window.innerWidth < model.narrow && typeof window.closeNav === 'function') window.closeNav();
  };
  fold();
  model.on('folds', fold);
}
"""


def fold_for_drawer(fold: FoldSidebar, state: AppState) -> None:
    """Fold the sidebar (in a narrow window) when a node is selected with none selected before: the node drawer
    (`panels.DRAWER_PX`, 360 px over the after pane's right edge) then opens beside panes of ~600 px, not ~460."""
    state.param.watch(lambda e: e.old is None and e.new is not None and fold.param.update(folds=fold.folds + 1),
                      "selected_node")


def next_tick(fn: Callable[[], object]) -> None:
    """`fn` on the page's next tick, after the step running now has sent its events (`step.frozen_step`); at once
    outside a served page."""
    doc = pn.state.curdoc
    if doc is not None and doc.session_context is not None:
        pn.state.execute(fn, schedule=True)
    else:
        fn()


def follow_editor(tabs: pn.Tabs, editor_tab: int, shown: param.Parameterized, state: AppState,
                  load_button: pn.widgets.Button) -> None:
    """Open the IR editor tab when the sidebar's source becomes "IR text" (`shown.shown`) or an IR text fails to
    load (`state.ir_error`, its line marked there); go to the Graph tab (0) when "Load IR" is pressed."""
    shown.param.watch(lambda e: e.new == "ir" and setattr(tabs, "active", editor_tab), "shown")
    state.param.watch(lambda e: e.new is not None and next_tick(lambda: setattr(tabs, "active", editor_tab)),
                      "ir_error")
    load_button.on_click(lambda e: setattr(tabs, "active", 0))


LOST_TEXT = ("Server connection lost: this page no longer updates. Start the server again (make app) and reload the "
             "page.")
"""What the page says when its server stopped (killed, crashed, the machine asleep): before, clicks did nothing and
nothing said why."""


class ConnectionNotice(JSComponent):
    """A red notice across the top of the window when the page loses its server (Bokeh's `connection_lost`
    document event, raised when the websocket closes), gone again if the connection comes back
    (`client_reconnected`). Draws nothing while connected."""

    text = param.String(LOST_TEXT)

    _esm = """
export function render({ model, el }) {
  el.style.display = 'none';
  const note = document.createElement('div'); note.className = 'rv-lost'; note.setAttribute('role', 'alert');
  note.textContent = model.text;
  Object.assign(note.style, { display: 'none', position: 'fixed', left: '0', right: '0', top: '0', zIndex: '20000',
    padding: '10px 16px', background: '#b71c1c', color: '#fff', font: '600 15px system-ui, sans-serif',
    textAlign: 'center', boxShadow: '0 2px 8px rgba(0,0,0,.4)' });
  document.body.appendChild(note);
  const doc = model.document;
  if (doc) {
    doc.on_event('connection_lost', () => { note.style.display = 'block'; });
    doc.on_event('client_reconnected', () => { note.style.display = 'none'; });
  }
}
"""
