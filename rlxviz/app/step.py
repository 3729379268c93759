"""One page step: the Bokeh model changes a job's result makes, collected once and sent to the page as one patch.

Bokeh sends a served document's change events one PATCH-DOC message each, and BokehJS drops the models a patch
leaves unreachable when it has applied it. A step whose changes move a model (taken out of one layout, put in
another, or taken out and put back) sent the removal and the re-insertion as two messages: the page dropped the model
after the first, and the second named it by id only ("reference p3018 isn't known", a console error; the model never
showed). The page applies one patch's events under its own freeze, so a model moved within one message is kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from bokeh.document.events import DocumentPatchedEvent
from panel.io import document as panel_document

if TYPE_CHECKING:
    from bokeh.document import Document


def frozen_step(doc: Document, fn: Callable[[], None]) -> Callable[[], None]:
    """`fn` as one step on Bokeh document `doc`: its model graph frozen (`Document.models.freeze`) while `fn` runs,
    so the models `fn` adds or drops are collected once when it ends (unfrozen even when `fn` raises), not once
    per widget it changes. Showing a new model changes a dozen widgets, each of which walked every model of the
    page; on a loaded 2-core machine that walk, nine times over, was 2.1 of the 3.0 s between the input graph's
    SVG being drawn and the page showing it (issue 39's first picture).

    The step's change events are held in order and sent when it ends, after the model graph is collected, as one
    PATCH-DOC message to each connected page (`_one_patch`):
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
    """Hold `doc`'s change events while the block runs; when it ends, send the page patches among them in order as
    one PATCH-DOC message to each page connected to `doc`, by the route Bokeh sends its own (the session's pending
    writes, written in order after the step, under the session's document lock) or, while Panel has messages queued
    for the page, behind them in Panel's queue (`_panel_queue`), and hand the other events (a callback added) to
    Bokeh. With no page connected (a test, a notebook) Bokeh gets them all (`Document.unhold`).

    Panel's `unlocked` sends one message too, but it writes to the socket directly or, while a write is under way,
    queues the message for later: a later step's message could overtake it, and the page kept "Timing every
    version..." after the run had ended (1 run in 5 of `test_browser_timing_origin`)."""
    if doc.callbacks.hold_value is not None:  # Panel's own hold (a browser event's callback) sends them, as one
        yield
        return
    doc.hold("collect")
    try:
        yield
    finally:
        session = getattr(doc.session_context, "session", None)
        writes = getattr(session, "_pending_writes", None)  # a list only under the session's document lock
        if writes is None:
            doc.unhold()
        else:
            events, doc.callbacks._held_events = doc.callbacks._held_events, []
            doc.unhold()  # nothing held now: the hold ends
            ours = [e for e in events if isinstance(e, DocumentPatchedEvent) and e.setter is not session]
            if ours and _panel_queue(doc):
                panel_document.schedule_write_events(doc, session._subscribed_connections, ours)
                _see_written(doc)
            elif ours:
                for conn in session._subscribed_connections:
                    writes.append(conn._socket.send_message(conn.protocol.create("PATCH-DOC", ours)))
            for e in events:
                if not isinstance(e, DocumentPatchedEvent):
                    doc.callbacks.trigger_on_change(e)


def _panel_queue(doc: Document) -> bool:
    """Whether Panel holds messages for `doc`'s page to write later: Panel's own changes (a widget's callback) are
    written at once when the socket is free, else queued (`panel.io.document.schedule_write_events`) until it is.
    A step's message sent by Bokeh's route while Panel's queue held one could reach the page first: a stylesheet
    defined in Panel's queued message was named by the step's ("reference p1274 isn't known", 1 run in 2 of
    `test_browser_problems` test 2 then 6). Then the step's message joins the queue, behind Panel's."""
    return doc in getattr(panel_document, "_WRITE_MSGS", {}) or doc in getattr(panel_document, "_WRITE_BLOCK", {})


KICK_S, KICK_TRIES = 0.05, 200
"""How often (s) and how many times `_see_written` looks at Panel's queue for a document (10 s in all)."""


def _see_written(doc: Document) -> None:
    """See that Panel's queue for `doc` is written: while it holds messages and no write task will send them, start
    one. Panel's queue has a race: a write task that finds the socket busy puts its messages back and starts a new
    task 10 ms later, which sends nothing when the task writing before it has ended the queue's block meanwhile
    (`_dispatch_msgs` returns at once without `_WRITE_BLOCK`). The messages then waited for Panel's next own write:
    on an idle page, for ever; the page kept "Drawing the graph…" after the load had ended (1 CI run in 6 of
    `test_browser_problems` trial 3/4). Nothing when no event loop runs (a test, a notebook)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    loop.create_task(_kick(doc))


async def _kick(doc: Document) -> None:
    """Every `KICK_S` s, up to `KICK_TRIES` times, until Panel's queue for `doc` is empty: where it holds messages
    and no block is set (no write task is under way or due), set it and start Panel's own write task."""
    for _ in range(KICK_TRIES):
        await asyncio.sleep(KICK_S)
        if doc not in panel_document._WRITE_MSGS:
            return
        if doc not in panel_document._WRITE_BLOCK:
            panel_document._WRITE_BLOCK[doc] = True
            panel_document._dispatch_write_task(doc, panel_document._dispatch_msgs, doc)
