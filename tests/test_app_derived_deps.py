"""Each of `AppState`'s derivations (`app.derived`) declares the parameters it reads with `param.depends`: reading a
derivation reads no parameter it does not declare (a reader is recorded while it runs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState

DERIVATIONS: list[tuple[str, tuple[Any, ...]]] = [
    ("version_index", ()), ("graph_at", ()), ("version_rows", ()), ("ir_current", ()), ("ir_diff", ()),
    ("trace_json", ()), ("render_key", ()), ("resolved_view", ()), ("dot", ()), ("svg", ()), ("heat", ()),
    ("overlay_legend", ()), ("svg_before", ()), ("heat_before", ()), ("layers", ()), ("verdict", ()),
    ("layer_status", (0,)), ("why_layer", (0,)), ("why_graph", ()), ("svg_why", ()), ("hidden_note", ()),
    ("hidden_before", (1,)), ("node_layer", (5,)), ("node_layer", (5, True)),
]
"""(method, arguments) of every derivation."""

SETUPS = {"auto view": {}, "layers open": {"view": "collapsed", "expanded_layers": [1]},
          "focus": {"view": "focus", "overlay": "error"}}
"""States to read them in (each draws through another branch of `_drawing`)."""


@pytest.fixture(scope="module")
def state() -> AppState:
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.param.update(version=1, selected_layer=0)
    return s


def reads(s: AppState, call: Callable[[], object], monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The parameters of `s` read while `call` runs."""
    names = set(s.param)
    seen: set[str] = set()
    plain = AppState.__getattribute__

    def recording(obj: object, name: str) -> object:
        if obj is s and name in names:
            seen.add(name)
        return plain(obj, name)

    with monkeypatch.context() as m:
        m.setattr(AppState, "__getattribute__", recording)
        call()
    return seen


@pytest.mark.parametrize("setup", SETUPS, ids=list(SETUPS))
def test_every_derivation_reads_only_what_it_declares(state: AppState, monkeypatch: pytest.MonkeyPatch, setup: str):
    state.param.update(**{"view": "auto", "expanded_layers": [], "overlay": "none", **SETUPS[setup]})
    for name, args in DERIVATIONS:
        declared = {d.name for d in state.param.method_dependencies(name)}
        read = reads(state, lambda: getattr(state, name)(*args), monkeypatch)  # noqa: B023 - called at once
        assert read <= declared, f"{name} reads {sorted(read - declared)} without declaring it (param.depends)"


def test_the_recorder_sees_what_a_drawing_reads(state: AppState, monkeypatch: pytest.MonkeyPatch):
    state.param.update(view="auto", overlay="none")
    read = reads(state, state.svg, monkeypatch)
    assert {"trace", "version", "view", "node_figures"} <= read, read
    assert "seq" not in read and "repeat" not in read


def test_a_derivation_that_read_an_undeclared_parameter_would_be_caught(state: AppState,
                                                                        monkeypatch: pytest.MonkeyPatch):
    declared = {d.name for d in state.param.method_dependencies("overlay_legend")}
    read = reads(state, lambda: (state.overlay_legend(), state.seq), monkeypatch)
    assert read - declared == {"seq"}
