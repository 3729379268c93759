"""① clicked while the page still shows the input graph drawn first (the passes of the first load still running)
is kept: the strip says so, and the first pass is shown as soon as the run arrives. The click did nothing (the
versions were the input alone), and a lecturer clicking at once was left on the input graph (CI: the lecturer flow
at 1280x800 on a loaded machine)."""

from __future__ import annotations

from rlxviz.app.jobs import Runner
from rlxviz.app.start import PASSES_PENDING, StartHere
from rlxviz.app.state import AppState


def test_step_clicked_while_the_passes_run_steps_once_they_have():
    s = AppState(runner=Runner(background=False), preset="bert-tiny")
    start = StartHere(state=s, show_why=lambda: None)
    full = s.trace
    s.runs._show_input_first(s.runs._model_key, s.model)  # what a load shows before its passes have run
    assert s.input_first and len(s.version_labels) == 1
    start.next_version()
    assert s.version == 0 and PASSES_PENDING.split("…")[0] in start.note.object
    s.runs._set_trace(full)  # the run arrives
    assert not s.input_first and s.version == 1
    assert "Showing after" in start.note.object
    start.next_version()  # later clicks step as before
    assert s.version == 2
