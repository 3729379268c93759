"""`AppState` declares what its model and pipeline keys read (`@param.depends`), and the reload watches the keys: a
control reloads exactly when it can change what is loaded or run (issue 36, item 5)."""

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState

KEYS = {"source", "preset", "checkpoint_dir", "upload_id", "ir_text", "batch", "seq", "style", "variant",
        "variant_layer", "threshold", "dims", "passes", "disabled"}


@pytest.fixture
def state(monkeypatch):
    s = AppState(runner=Runner(background=False), autorun=False, preset="bert-tiny", seq=8)
    loads: list[int] = []
    monkeypatch.setattr(s, "load", lambda: loads.append(1))
    s.autorun = True
    return s, loads


def test_the_reload_watches_exactly_the_keys_dependencies(state):
    s, _ = state
    assert {d.name for d in s.param.method_dependencies("_reload")} == KEYS


@pytest.mark.parametrize("change", [{"threshold": 40}, {"style": "hf"}, {"disabled": [0]}, {"batch": 2},
                                    {"variant": "tanh_gelu", "variant_layer": 1}])
def test_a_key_control_reloads_once(state, change):
    s, loads = state
    before = (s.model_key(), s.pipeline_key())
    s.param.update(**change)
    assert (s.model_key(), s.pipeline_key()) != before and len(loads) == 1, (change, loads)


@pytest.mark.parametrize("change", [{"view": "collapsed"}, {"hide_unchanged": False}, {"text": "another sentence"},
                                    {"repeat": 3, "warmup": 2}, {"selected_layer": 1, "highlight": [3]}])
def test_a_control_outside_the_keys_leaves_them_and_does_not_reload(state, change):
    s, loads = state
    before = (s.model_key(), s.pipeline_key())
    s.param.update(**change)
    assert (s.model_key(), s.pipeline_key()) == before and not loads, (change, loads)
