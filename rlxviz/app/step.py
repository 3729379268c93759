"""One page step: the Bokeh model changes a job's result makes, collected once and sent to the page as one patch.

Bokeh sends a served document's change events one PATCH-DOC message each, and BokehJS drops the models a patch
leaves unreachable when it has applied it. A step whose changes move a model (taken out of one layout, put in
another, or taken out and put back) sent the removal and the re-insertion as two messages: the page dropped the model
after the first, and the second named it by id only ("reference p3018 isn't known", a console error; the model never
showed). The page applies one patch's events under its own freeze, so a model moved within one message is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from panel.io.document import unlocked
from panel.io.state import set_curdoc

if TYPE_CHECKING:
    from bokeh.document import Document


def frozen_step(doc: Document, fn: Callable[[], None]) -> Callable[[], None]:
    """`fn` as one step on Bokeh document `doc`: its model graph frozen (`Document.models.freeze`) while `fn` runs,
    so the models `fn` adds or drops are collected once when it ends (unfrozen even when `fn` raises), not once
    per widget it changes. Showing a new model changes a dozen widgets, each of which walked every model of the
    page; on a loaded 2-core machine that walk, nine times over, was 2.1 of the 3.0 s between the input graph's
    SVG being drawn and the page showing it (issue 39's first picture).

    The step's change events are held in order and sent when it ends, after the model graph is collected, as one
    PATCH-DOC message to each connected page (Panel's `unlocked(policy="collect")`):
    - a model added during the step (the before pane put back beside the after pane) is attached to the document
      only then, so a change made to it later in the same step sent no event, and the browser kept the values it
      had when it was added (after ① then ②, the left pane stayed on "before fuse_sdpa"); sent at the end, each new
      model goes out with its final values;
    - a model moved within the step stays known to the page (see the module's docstring).
    A hold already on (Panel's own, inside a browser event's callback) sends the events itself, in one message."""
    def step() -> None:
        with _one_patch(doc):
            freeze = doc.models.freeze()
            freeze.__enter__()
            try:
                fn()
            finally:
                freeze.__exit__(None, None, None)  # Bokeh's context manager has no `finally` of its own
    return step


@contextmanager
def _one_patch(doc: Document) -> Iterator[None]:
    """Hold `doc`'s change events while the block runs; when it ends, send them in order as one PATCH-DOC message
    to each page connected to `doc` (Panel's `unlocked`), or, with no page connected or loaded yet (a test, a
    notebook, a session still starting), hand them to Bokeh (`Document.unhold`)."""
    with set_curdoc(doc), unlocked(policy="collect"):
        own = doc.callbacks.hold_value is None  # Panel holds only for a loaded page with a session
        if own:
            doc.hold("collect")
        try:
            yield
        finally:
            if own:
                doc.unhold()
