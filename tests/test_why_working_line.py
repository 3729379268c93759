"""The Why tab says what it is doing while it works out its first answer. On granite.qdq (2606 ops) its drawing
takes ~10 s, and the pane stayed blank under the header's spinner till then, as the tab's view was built in the
one callback that showed it. The view now shows `working_line` and works on the page's next tick
(`layout.next_tick`), so the line reaches the browser first."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_app_views import tiny

from rlxviz.app import whyview
from rlxviz.app.whyview import WhyView, working_line


def test_the_tab_says_it_is_working_until_its_next_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """bert-tiny's 2 layers: `Working out why for 2 layers…` and nothing drawn until the deferred update runs, then
    the verdict and the drawing, as the tab drew them at once before."""
    s = tiny()
    later: list[Callable[[], object]] = []
    monkeypatch.setattr(whyview, "next_tick", later.append)  # a served page's next tick, held here
    why = WhyView(state=s)
    assert why.text.object == "*Working out why for 2 layers…*" == working_line(len(s.layers()))
    assert why.graph.svg == "" and len(later) == 1
    later.pop()()
    assert "Working out" not in why.text.object and why.text.object == s.why_layer(s.selected_layer)
    assert "<svg" in why.graph.svg


def test_the_line_counts_layers_or_names_the_whole_graph() -> None:
    assert working_line(1) == "*Working out why for 1 layer…*"
    assert working_line(0) == "*Working out why for the whole graph…*"
