"""What the sweeps over the fixtures share instead of redoing (CI's 20 minutes on 2 cores): `clirun.file_inputs`
decides once per file and process whether a plain load binds the file's dims, each caller getting its own dict."""

from __future__ import annotations

from pathlib import Path

import pytest
from clirun import file_inputs

from rlxviz import session

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"


@pytest.mark.parametrize("stem", ["llama.dynamo-eager", "qwen2.kv"])
def test_file_inputs_loads_a_file_once_and_hands_out_copies(monkeypatch, stem):
    """llama loads plainly ({}); qwen2.kv's cache length binds only from its npz (its shapes). Two asks, at most one
    default load (none when an earlier test of this process asked already), equal answers that share no dict."""
    loads = []
    real = session.load
    monkeypatch.setattr(session, "load", lambda *a, **k: loads.append(a) or real(*a, **k))
    path = ZOO / f"{stem}.onnx"
    first, again = file_inputs(path), file_inputs(path)
    assert len(loads) <= 1, loads
    assert first == again and first is not again
    assert bool(first) == stem.endswith(".kv")
    if first:
        assert first["npz"].name == f"{stem}.npz" and "past_key_values.0.key" in first["shapes"]
        assert not any(k.startswith("out:") for k in first["shapes"])
        first["shapes"].clear()
        assert file_inputs(path)["shapes"] == again["shapes"] != {}
