"""Loading in a child process that can be stopped (`session.isolated`): the model comes back exact, a load that
never returns is killed at its wall-clock backstop while another load in the same process completes, a busy one at
its CPU-time limit (and one slow only in wall time is not refused), memory past the
address-space cap and a native crash are one line, and every error keeps its type and message."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import isolation_helpers as helpers
import numpy as np
import pytest

from rlxviz import session
from rlxviz.ir import format_graph
from rlxviz.session import isolated, loading

ROOT = Path(__file__).resolve().parents[1]
GPT2 = ROOT / "tests/fixtures/onnx/gpt2.onnx"
HOSTILE = sorted((ROOT / "tests/data/reliability").glob("onnx_*.onnx"))


def _same_model(a, b) -> None:
    assert format_graph(a.graph) == format_graph(b.graph)
    assert list(a.graph) == list(b.graph) and a.graph.outputs == b.graph.outputs
    assert a.graph.next_id == b.graph.next_id and a.graph.name == b.graph.name
    assert a.weights.keys() == b.weights.keys()
    for k, w in a.weights.items():
        assert w.dtype == b.weights[k].dtype and np.array_equal(w, b.weights[k]), k
    assert (a.name, a.description, a.meta) == (b.name, b.description, b.meta)


def test_an_isolated_load_returns_the_same_model(monkeypatch):
    monkeypatch.setattr(loading, "MODELS", type(loading.MODELS)(maxsize=4))
    monkeypatch.setattr(isolated, "MODELS", loading.MODELS)
    child = session.load_isolated(str(GPT2), 1, 8)
    _same_model(session.load(str(GPT2), 1, 8), child)
    assert session.load_isolated(str(GPT2), 1, 8) is child  # cached by the file's size and mtime


def test_a_model_with_host_nodes_comes_back_exact(tmp_path):
    from test_onnx_host_op import _model

    path = _model(tmp_path, "Mod")  # a host node holding its ONNX node, and an initializer
    child = isolated.run_isolated(loading.load, str(path), 2, 3)
    host = [n for n in child.graph if n.op.value == "onnx_op"]
    assert host, "the fixture has no host node"
    _same_model(loading.load(str(path), 2, 3), child)


def test_a_load_that_never_returns_is_stopped_while_another_completes(tmp_path):
    pid_file = tmp_path / "pid"
    outcome: dict[str, BaseException] = {}

    def hostile() -> None:
        try:
            isolated.run_isolated(helpers.load_with_stuck_step, str(GPT2), str(pid_file), timeout_s=0.8,
                                  what="stuck.onnx")
        except BaseException as e:  # noqa: BLE001 - kept for the assertions
            outcome["error"] = e

    t = threading.Thread(target=hostile)
    t.start()
    other = isolated.run_isolated(loading.load, str(GPT2), 1, 8)  # the other session's load, meanwhile
    assert t.is_alive(), "the stuck load should still be running when the other one completes"
    assert len(other.graph) > 0
    t.join(60)
    e = outcome["error"]
    assert isinstance(e, session.StoppedError)
    # a step that never returns and uses no CPU (stopped, or starved) ends at the wall-clock backstop, 10x the CPU limit
    assert str(e) == ("stuck.onnx: stopped after 8 s of wall time (the backstop on a load, 10x its 0.8 s CPU-time "
                      "limit: the process was stopped or starved)")
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped


def test_memory_past_the_cap_is_one_line():
    with pytest.raises(session.StoppedError, match=r"^big: out of memory while loading \(the loader may use "
                                                   r"704\.0 MiB of address space for a memory limit of 64\.0 MiB\)$"):
        isolated.run_isolated(helpers.allocate, 4 << 30, max_bytes=64 << 20, what="big")
    assert isolated.run_isolated(helpers.allocate, 32 << 20, max_bytes=64 << 20) == 32 << 20


def test_a_native_crash_is_one_line():
    with pytest.raises(session.StoppedError, match=r"^x\.onnx: the loading process died \(signal SIGSEGV\)"):
        isolated.run_isolated(helpers.crash, what="x.onnx")


def test_warnings_of_the_child_are_raised_again_here():
    with pytest.warns(UserWarning, match="a warning from the child"):
        assert isolated.run_isolated(helpers.warn_and_return, 7) == 7


@pytest.mark.parametrize("path", HOSTILE, ids=lambda p: p.name)
def test_hostile_files_give_the_same_one_line_error_isolated(path, monkeypatch):
    monkeypatch.setattr(loading, "MODELS", type(loading.MODELS)(maxsize=4))
    monkeypatch.setattr(isolated, "MODELS", loading.MODELS)
    limits = session.Limits(64)
    with pytest.raises(session.SessionError) as here:
        session.load(str(path), 1, 8, limits=limits)
    with pytest.raises(session.SessionError) as there:
        session.load_isolated(str(path), 1, 8, limits=limits)
    assert type(there.value) is type(here.value) and str(there.value) == str(here.value)
    assert len(str(there.value).splitlines()) == 1


def test_the_check_against_the_onnx_file_runs_in_the_child_with_the_same_line(monkeypatch):
    """The app's import check (ONNX Runtime reading the user's file) runs where the load did, in a child: the same
    line as in process; past its wall-time limit one line, not equal. The limit is made certain to pass: a child
    forked from the zygote has its imports done and checks bert in ~0.1 s, within a 0.01 s CPU limit's 0.1 s
    wall backstop (`RLIMIT_CPU` counts whole seconds), where a fresh interpreter was still importing."""
    from rlxviz.app.runs import import_check
    from rlxviz.session.fidelity import onnx_check

    m = loading.load(str(Path(__file__).parent / "fixtures" / "onnx" / "bert.onnx"))
    here = onnx_check(m)
    assert here[1] and here[0].startswith("On random inputs (seed 0): version 0 equals the ONNX model")
    assert isolated.check_isolated(m) == here == import_check(m)
    monkeypatch.setattr(isolated, "WALL_FACTOR", 1e-4)  # a 1 us wall backstop on the 0.01 s limit
    line, ok = isolated.check_isolated(m, timeout_s=0.01)
    assert not ok and line.startswith("checking version 0 against the ONNX model: stopped after") and "\n" not in line


def test_the_reply_does_not_wait_for_the_childs_teardown():
    # the child exits as soon as its reply is written: an exit handler that would sleep 600 s never runs, so the
    # call returns well within its 120 s wall limit (before, the reply waited for the interpreter's teardown)
    assert isolated.run_isolated(helpers.slow_teardown, 7, timeout_s=None, wall_s=120) == 7
    assert isolated.run_isolated(helpers.slow_teardown, 8, 3600.0, timeout_s=None, wall_s=120) == 8


@pytest.mark.parametrize("extra", ["dup", "dup-twice"])
def test_the_spare_started_while_a_script_ran_is_used(monkeypatch, extra):
    # `panel serve --warm` starts the spare while Bokeh runs app.py with its folder put first on sys.path (the folder
    # is on the path later too); the sessions' loads see the path without it and must still take that spare
    isolated.shutdown()
    path = [p for p in sys.path if p]
    again = [path[-1]] if extra == "dup" else [path[-1], path[0]]
    monkeypatch.setattr(sys, "path", again + path)
    isolated.spare_ready()
    spare = isolated._SPARE[1]
    monkeypatch.setattr(sys, "path", path)
    taken = isolated._take()
    try:
        assert taken is spare
    finally:
        isolated.stop(taken)


def test_a_spare_with_another_import_path_is_not_used(monkeypatch, tmp_path):
    # a folder the path no longer has: the spare could import other code, so a new child is started
    isolated.shutdown()
    path = [p for p in sys.path if p]
    monkeypatch.setattr(sys, "path", [str(tmp_path), *path])
    isolated.spare_ready()
    spare = isolated._SPARE[1]
    monkeypatch.setattr(sys, "path", path)
    taken = isolated._take()
    try:
        assert taken is not spare and spare.poll() is not None  # the old spare was stopped
    finally:
        isolated.stop(taken)


def test_a_reply_carries_its_arrays_out_of_band_exactly_and_writable():
    """The child's reply (pickle protocol 5, each contiguous array's bytes written from the array itself) reads back
    to equal arrays (values, dtypes, shapes, order) that are writable and own no part of the reply."""
    import io
    import pickle

    import numpy as np

    from rlxviz.session.isolated import _read_reply, _write_reply

    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "f": np.asfortranarray(np.ones((3, 5), np.float16)),
              "t": np.arange(20, dtype=np.int64).reshape(4, 5).T, "b": np.array([True, False]),
              "nan": np.array([np.nan, -0.0, np.inf], np.float64)}
    for value in (("ok", arrays, []), ("memory", None, [("a warning", UserWarning)])):
        buffers: list[pickle.PickleBuffer] = []
        reply = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        out = io.BytesIO()
        _write_reply(out, reply, buffers)
        back = _read_reply(out.getvalue())
        assert back[0] == value[0] and back[2] == value[2]
        for k, a in (value[1] or {}).items():
            got = back[1][k]
            assert got.dtype == a.dtype and got.shape == a.shape and got.tobytes("A") == a.tobytes("A"), k
            assert got.flags.writeable
            got[...] = 0  # its own buffer: the next array is unchanged
    with pytest.raises(ValueError, match="header says"):
        _read_reply(out.getvalue()[:-1])


def _replying(tmp_path, data: bytes, wait_s: float = 0.0):
    """A child that reads its stdin to the end, waits `wait_s`, then writes `data` (a reply as the server reads it)."""
    import subprocess

    f = tmp_path / f"reply-{len(data)}-{wait_s}"
    f.write_bytes(data)
    code = (f"import sys, time; sys.stdin.buffer.read(); time.sleep({wait_s}); "
            f"sys.stdout.buffer.write(open({str(f)!r}, 'rb').read())")
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def test_the_server_reads_a_reply_into_its_buffers_from_the_pipe(tmp_path):
    """`_exchange` reads the child's reply straight from the pipe, each array into its own writable buffer: the same
    outcome `_read_reply` gives from the whole bytes; nothing written is None (the child died first); a reply cut
    short is a ValueError; a child that answers after the wall time raises TimeoutExpired."""
    import io
    import pickle
    import subprocess

    import numpy as np

    from rlxviz.ir.bounded import stop
    from rlxviz.session.isolated import _exchange, _read_reply, _write_reply

    value = ("ok", {"w": np.arange(300_000, dtype=np.float32).reshape(600, 500), "i": np.arange(5)}, [])
    buffers: list[pickle.PickleBuffer] = []
    reply = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    out = io.BytesIO()
    _write_reply(out, reply, buffers)
    data = out.getvalue()
    want = _read_reply(data)
    for payload, expect in ((data, "equal"), (b"", None), (data[:-1], ValueError), (data[:5], ValueError)):
        proc = _replying(tmp_path, payload)
        try:
            if expect is ValueError:
                with pytest.raises(ValueError, match="reply"):
                    _exchange(proc, b"request", 60)
                continue
            got = _exchange(proc, b"request" * 10_000, 60)
        finally:
            stop(proc)
        if expect is None:
            assert got is None
            continue
        assert got[0] == "ok" and got[1].keys() == want[1].keys()
        for k, a in want[1].items():
            assert got[1][k].dtype == a.dtype and np.array_equal(got[1][k], a) and got[1][k].flags.writeable
    proc = _replying(tmp_path, data, wait_s=5)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            _exchange(proc, b"request", 0.5)
    finally:
        stop(proc)
