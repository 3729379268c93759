"""`step.frozen_step`: a page step's Bokeh model changes recompute the document's model graph once, not once per
widget changed (issue 39's first picture: the walk, nine times over, was most of the wait to show a new model), and
a step that raises leaves the document unfrozen."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from bokeh.document import Document
from bokeh.models import Column, Div
from bokeh.protocol import Protocol
from panel.io import document as panel_document

from rlxviz.app.step import frozen_step


def _page(n: int) -> tuple[Document, list[Column]]:
    doc = Document()
    cols = [Column(children=[Div(text=f"{i}")]) for i in range(n)]
    doc.add_root(Column(children=cols))
    return doc, cols


def _counting(doc: Document, monkeypatch) -> list[int]:
    calls: list[int] = []
    real = doc.models.recompute
    monkeypatch.setattr(doc.models, "recompute", lambda: (calls.append(1), real())[1])
    return calls


@pytest.mark.parametrize("n", [3, 9])
def test_a_step_recomputes_once_and_finds_every_new_model(monkeypatch, n):
    doc, cols = _page(n)
    calls = _counting(doc, monkeypatch)
    added = [Div(text=f"new {i}") for i in range(n)]

    def change() -> None:
        for col, div in zip(cols, added, strict=True):
            col.children = [*col.children, div]  # each a new model: unfrozen, a walk of the whole page each

    frozen_step(doc, change)()
    assert len(calls) == 1
    assert all(doc.get_model_by_id(d.id) is d for d in added)
    # the control: the same changes outside a step walk the page once per widget
    calls.clear()
    more = [Div(text=f"more {i}") for i in range(n)]
    for col, div in zip(cols, more, strict=True):
        col.children = [*col.children, div]
    assert len(calls) == n


@pytest.mark.parametrize("error", [ValueError("bad input"), KeyError("k")])
def test_a_step_that_raises_leaves_the_document_unfrozen(monkeypatch, error):
    doc, cols = _page(2)
    div = Div(text="half done")

    def change() -> None:
        cols[0].children = [*cols[0].children, div]
        raise error

    with pytest.raises(type(error)):
        frozen_step(doc, change)()
    assert doc.get_model_by_id(div.id) is div  # collected when the step ended
    later = Div(text="later")
    cols[1].children = [*cols[1].children, later]
    assert doc.get_model_by_id(later.id) is later  # not frozen any more: found at once


# ---------------------------------------------------------------- a model moved within a step, on a served page


class _Socket:
    """A page's websocket: each message written to it is applied to a copy of the document, as BokehJS does (it
    drops the models a message leaves unreachable once it has applied the message)."""

    def __init__(self, doc: Document) -> None:
        self.page = Document.from_json(doc.to_json())
        doc.models.flush_synced()  # what the page was sent whole
        self.messages = 0

    def send_message(self, msg: object) -> None:  # Bokeh's `WSHandler.send_message`: an awaitable, awaited later
        msg.apply_to_document(self.page)
        self.messages += 1

    def patch(self, event: object) -> None:  # Bokeh's own route for one event (`ServerSession._document_patched`)
        self.send_message(Protocol().create("PATCH-DOC", [event]))


class _Context:
    """`Document.session_context` (a weak reference to it): a Bokeh server session with one page connected, in a
    step run under its document lock (`_pending_writes` a list)."""

    def __init__(self, socket: _Socket) -> None:
        self.session = SimpleNamespace(_subscribed_connections=[SimpleNamespace(_socket=socket, protocol=Protocol())],
                                       _pending_writes=[])


@pytest.fixture
def served(monkeypatch):
    """A document served to one page (`_Socket`)."""
    doc, cols = _page(2)
    socket = _Socket(doc)
    context = _Context(socket)
    monkeypatch.setattr(doc, "_session_context", weakref.ref(context))
    yield doc, cols, socket  # `context` lives as long as the test: the document holds only a weak reference


def _move(cols: list[Column], div: Div, text: str) -> Callable[[], None]:
    def move() -> None:
        cols[0].children = [c for c in cols[0].children if c is not div]  # the page drops it ...
        cols[1].children = [*cols[1].children, div]  # ... unless this reaches it in the same message
        div.text = text
    return move


def test_a_model_moved_in_a_step_stays_known_to_the_page(served):
    """The CI fault of stop 44 ("reference p3018 isn't known"): a div taken out of one column and put in another in
    one step reached the page as two patches, and the page had dropped it when the second named it."""
    doc, cols, socket = served
    div = cols[0].children[0]
    frozen_step(doc, _move(cols, div, "moved"))()
    assert socket.messages == 1
    shown = socket.page.get_model_by_id(cols[1].id).children
    assert [c.id for c in shown][-1] == div.id and socket.page.get_model_by_id(div.id).text == "moved"


def test_the_move_sent_as_one_patch_per_event_loses_the_model(served):
    """The control: the same step with Bokeh's own route (one PATCH-DOC per event) leaves the page without it."""
    doc, cols, socket = served
    div = cols[0].children[0]
    doc.on_change(socket.patch)
    doc.hold("collect")
    with doc.models.freeze():
        _move(cols, div, "moved")()
    doc.unhold()
    assert socket.messages == 3 and socket.page.get_model_by_id(div.id) is None


def test_a_step_joins_panels_queue_while_it_holds_messages_for_the_page(served, monkeypatch):
    """While Panel holds messages for the page (its socket was busy), the step's message goes behind them, not by
    Bokeh's route ahead of them ("reference p1274 isn't known": a stylesheet defined in Panel's queued message)."""
    doc, cols, socket = served
    queued: list[list] = []
    monkeypatch.setitem(panel_document._WRITE_BLOCK, doc, True)
    monkeypatch.setattr(panel_document, "schedule_write_events", lambda d, conns, events: queued.append(events))
    div = cols[0].children[0]
    frozen_step(doc, _move(cols, div, "moved"))()
    assert socket.messages == 0 and len(queued) == 1
    assert [(e.model.id, e.attr) for e in queued[0]] == [(cols[0].id, "children"), (cols[1].id, "children"),
                                                          (div.id, "text")]


# ---------------------------------------------------------------- Panel's write queue: a message is never left behind


class _BusySocket:
    """A page's socket whose write lock is taken while `busy` (Tornado's `write_lock`, as `_dispatch_msgs` reads it)."""

    def __init__(self) -> None:
        self.busy = True
        self.sent: list[object] = []
        self.write_lock = SimpleNamespace(_block=SimpleNamespace(_value=0))

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self.write_lock._block._value = 0 if busy else 1


class _Conn:
    """A server connection (hashable, as Panel keys its queue by connection)."""

    def __init__(self, socket: _BusySocket) -> None:
        self._socket, self.protocol = socket, Protocol()


def _race(monkeypatch, kick: bool) -> tuple[list[object], int]:
    """Panel's race, played out: a first write task is sending (its future pending, the socket busy) when a step's
    message joins the queue; its task finds the socket busy, puts it back and starts another 10 ms later; the first
    task ends, the queue's block with it, before that other task runs, which then sends nothing. `kick`: the step
    also calls `_see_written`. Returns what the page received and how many messages the queue still holds."""
    import asyncio

    from rlxviz.app import step

    doc = Document()
    div = Div(text="")
    doc.add_root(div)
    events: list[object] = []
    doc.on_change(events.append)
    div.text, div.text = "Drawing the graph…", ""  # two patch events: Panel's write, then the step's
    sock = _BusySocket()
    conn = _Conn(sock)
    sending: list[asyncio.Future] = []

    def handler(c, msg=None, events=None):  # Panel's `extra_socket_handlers` route: a future per write
        c._socket.sent.append(msg)
        fut = asyncio.get_running_loop().create_future()
        sending.append(fut)
        return [fut]

    monkeypatch.setitem(panel_document.extra_socket_handlers, _BusySocket, handler)
    monkeypatch.setattr(step, "KICK_S", 0.02)

    async def play() -> None:
        loop = asyncio.get_running_loop()
        sock.set_busy(False)
        panel_document.schedule_write_events(doc, [conn], events[:1])  # Panel's own write: its task sends ...
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(sending) == 1
        sock.set_busy(True)  # ... the socket is busy while it sends
        panel_document.schedule_write_events(doc, [conn], events[1:])  # the step's message joins the queue
        if kick:
            step._see_written(doc)

        def first_write_done() -> None:
            sending[0].set_result(None)
            sock.set_busy(False)
        loop.call_later(0.004, first_write_done)  # the first task ends (and its block) before the retry at 10 ms
        await asyncio.sleep(0.3)
        for f in sending:
            if not f.done():
                f.set_result(None)

    asyncio.run(play())
    left = panel_document._WRITE_MSGS.pop(doc, None)
    panel_document._WRITE_BLOCK.pop(doc, None)
    return sock.sent, sum(len(m) for m in (left or {}).values())


def test_a_message_panels_queue_left_behind_is_written(monkeypatch):
    """The CI fault of stop 57 (1 run in 6): the page kept "Drawing the graph…" after the load had ended. Without
    `_see_written` the step's message stays in Panel's queue (the control); with it, the page gets it."""
    sent, left = _race(monkeypatch, kick=False)
    assert (len(sent), left) == (1, 1)  # the control: Panel's first write reached the page, the step's is left
    sent, left = _race(monkeypatch, kick=True)
    assert (len(sent), left) == (2, 0)
