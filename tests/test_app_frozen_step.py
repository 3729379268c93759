"""`main.frozen_step`: a page step's Bokeh model changes recompute the document's model graph once, not once per
widget changed (issue 39's first picture: the walk, nine times over, was most of the wait to show a new model), and
a step that raises leaves the document unfrozen."""

from __future__ import annotations

import pytest
from bokeh.document import Document
from bokeh.models import Column, Div

from rlxviz.app.main import frozen_step


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
