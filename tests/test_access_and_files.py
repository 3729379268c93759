"""Allowed folders hold only what resolves inside them, and only this machine may open a session unless remote
use is configured (issue 15)."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from rlxviz.app.access import ALLOW_REMOTE_ENV, is_loopback, refusal
from rlxviz.models import BertConfig, CheckpointError, build_bert, load_checkpoint
from rlxviz.models.bert import random_weights

SECRET = "TOP-SECRET-VALUE-42"
CFG = {"model_type": "bert", "vocab_size": 30, "hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 16,
       "num_hidden_layers": 1, "max_position_embeddings": 8, "type_vocab_size": 2}


def _checkpoint(folder):
    g = build_bert(BertConfig(vocab_size=30, hidden=8, heads=2, intermediate=16, layers=1, max_position=8), 1, 4, "hf")
    w = random_weights(g)
    linear = ("query.weight", "key.weight", "value.weight", "dense.weight")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(CFG))
    save_file({k: np.ascontiguousarray(v.T) if v.ndim == 2 and k.endswith(linear) else v for k, v in w.items()},
              str(folder / "model.safetensors"))
    return folder


@pytest.fixture
def roots(tmp_path):
    allowed = tmp_path / "allowed"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text(json.dumps({**CFG, "model_type": SECRET}))
    (outside / "tokenizer.json").write_text(json.dumps({"secret": SECRET}))
    _checkpoint(outside / "real")
    _checkpoint(allowed / "ok")
    return allowed, outside


def test_a_plain_checkpoint_inside_the_roots_loads(roots):
    allowed, _ = roots
    m = load_checkpoint(allowed / "ok", 1, 4, [allowed])
    assert m.graph.inputs


@pytest.mark.parametrize("name, target", [
    ("config.json", "secret.json"),                     # the handed kind: config.json pointing outside
    ("tokenizer.json", "tokenizer.json"),               # the tokenizer the app would read
    ("model.safetensors", "real/model.safetensors"),    # the weights themselves
    ("model.safetensors.index.json", "secret.json"),    # the shard index
])
def test_a_symlinked_file_pointing_outside_is_refused_unread(roots, name, target):
    allowed, outside = roots
    folder = allowed / "ok"
    link = folder / name
    if link.exists():
        link.unlink()
    if name == "model.safetensors.index.json":
        (folder / "model.safetensors").unlink()
    link.symlink_to(outside / target)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(folder, 1, 4, [allowed])
    assert "resolves outside the allowed model folders" in str(e.value) and name in str(e.value)
    assert SECRET not in str(e.value) and str(outside) not in str(e.value)


def test_a_symlink_inside_the_roots_is_fine(roots):
    allowed, _ = roots
    other = _checkpoint(allowed / "other")
    folder = allowed / "ok"
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to(other / "config.json")
    assert load_checkpoint(folder, 1, 4, [allowed]).graph.inputs


def test_config_values_quoted_in_errors_are_cut(tmp_path):
    folder = _checkpoint(tmp_path / "c")
    (folder / "config.json").write_text(json.dumps({**CFG, "model_type": SECRET * 20}))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(folder, 1, 4)
    assert len(str(e.value)) < len(str(folder)) + 120 and SECRET * 2 not in str(e.value)


@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1", True), ("127.5.6.7", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("192.0.2.2", False), ("10.0.0.1", False), ("::ffff:192.0.2.2", False), ("fd00::2", False),
    ("0.0.0.0", False), ("localhost", False), ("", False), (None, False), ("127.0.0.1.evil", False),
])
def test_only_loopback_addresses_count_as_this_machine(address, loopback):
    assert is_loopback(address) is loopback


def test_remote_sessions_need_the_variable():
    assert refusal("127.0.0.1", {}) is None
    text = refusal("192.0.2.2", {})
    assert text and "192.0.2.2" in text and f"{ALLOW_REMOTE_ENV}=1" in text
    assert refusal("192.0.2.2", {ALLOW_REMOTE_ENV: "1"}) is None
    assert refusal("192.0.2.2", {ALLOW_REMOTE_ENV: "0"}) and refusal(None, {ALLOW_REMOTE_ENV: "no"})


def test_build_app_refuses_before_making_state(monkeypatch):
    from rlxviz.app import main

    monkeypatch.delenv(ALLOW_REMOTE_ENV, raising=False)
    monkeypatch.setattr(main, "_client_address", lambda: "192.0.2.2")
    monkeypatch.setattr(main, "AppState", lambda *a, **k: pytest.fail("state made for a refused client"))
    assert main.build_app().state is None
    monkeypatch.setenv(ALLOW_REMOTE_ENV, "1")
    monkeypatch.setattr(main, "AppState", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("state made")))
    with pytest.raises(RuntimeError, match="state made"):
        main.build_app()
