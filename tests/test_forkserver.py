"""The fork server (`ir.forkserver`): every isolated child is a fork of one zygote, which imported the loader once
(not a fresh interpreter paying ~2.9 s of CPU for the imports). Two calls' children share that parent, which is not
the server; a killed zygote is replaced and its children are reported killed; a child's death by a signal reads as
Popen's return code; a CPU-limit kill is told from a crash by the child's own CPU time; the zygote runs one thread;
another import path starts another zygote (the old one ends with its last child); the child sees the server's
environment and folder now; where the zygote cannot fork, a fresh interpreter serves."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import isolation_helpers as helpers
import pytest

from rlxviz import session
from rlxviz.ir.forkserver import ForkServer, ForkServerError
from rlxviz.session import isolated

SERVE = "rlxviz.session.isolated.serve"


def _gone(pid: int, limit_s: float = 10.0) -> bool:
    """Whether `pid` ends (or is a zombie) within `limit_s` seconds."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        status = Path(f"/proc/{pid}/status")
        if not status.exists() or "State:\tZ" in status.read_text():
            return True
        time.sleep(0.05)
    return False


def test_children_are_forks_of_one_zygote_that_is_not_the_server():
    first = isolated.run_isolated(helpers.parent_pid)
    second = isolated.run_isolated(helpers.parent_pid)
    assert first == second == isolated._ZYGOTE.pid != os.getpid()


def test_a_killed_zygote_is_replaced():
    old = isolated._zygote()
    child = old.fork()
    os.kill(old.pid, signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL  # it dies with its zygote (PR_SET_PDEATHSIG), reported killed
    assert _gone(child.pid)
    new = isolated.run_isolated(helpers.parent_pid)
    assert new == isolated._ZYGOTE.pid != old.pid


def test_a_childs_exit_reads_as_popens_return_code():
    z = ForkServer(SERVE, ("numpy",))
    try:
        child = z.fork()
        os.kill(child.pid, signal.SIGTERM)
        assert child.wait(30) == -signal.SIGTERM and child.poll() == -signal.SIGTERM
        quiet = z.fork()
        quiet.stdin.close()  # an empty request: the child exits at once, with 0
        assert quiet.wait(30) == 0 and quiet.cpu_s is not None
        quiet.kill()  # after its exit was reported: nothing is signalled
        stuck = z.fork()
        with pytest.raises(isolated.subprocess.TimeoutExpired):
            stuck.wait(0.2)
        stuck.kill()
        assert stuck.wait(30) == -signal.SIGKILL
    finally:
        z.stop()
    with pytest.raises(ForkServerError):
        z.fork()


def test_a_cpu_limit_kill_is_told_from_a_crash_by_the_childs_own_cpu_time():
    # SIGXCPU ignored (native code): the kernel SIGKILLs the child at the hard limit; the server's children_cpu()
    # never sees a grandchild's CPU time, the zygote's report does
    with pytest.raises(session.StoppedError) as e:
        isolated.run_isolated(helpers.spin_ignoring_xcpu, 60.0, timeout_s=2, what="busy.onnx")
    assert str(e.value) == "busy.onnx: stopped after 2 s of CPU time (the CPU-time limit on a load)"


def test_the_zygote_runs_one_thread():
    isolated.run_isolated(helpers.parent_pid)  # after a fork: OpenBLAS's pool was shut down by its atfork handler
    pid = isolated._ZYGOTE.pid
    assert os.listdir(f"/proc/{pid}/task") == [str(pid)]


def test_another_import_path_starts_another_zygote_and_the_old_one_ends(monkeypatch, tmp_path):
    before = isolated._zygote()
    running = before.fork()  # a call still served by the old zygote
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    other = isolated.run_isolated(helpers.parent_pid)
    assert other == isolated._ZYGOTE.pid != before.pid
    assert running.poll() is None and before.proc.poll() is None  # retired, not stopped under its child
    running.kill()
    assert running.wait(30) == -signal.SIGKILL
    assert before.proc.wait(30) is not None  # its last child gone, the retired zygote ends


def test_the_child_sees_the_servers_environment_and_folder_now(monkeypatch, tmp_path):
    isolated.run_isolated(helpers.parent_pid)  # the zygote started before the change
    monkeypatch.setenv("RLXVIZ_FORK_PROBE", "now")
    monkeypatch.chdir(tmp_path)
    assert isolated.run_isolated(helpers.environment, "RLXVIZ_FORK_PROBE") == ("now", str(tmp_path))


def test_where_the_zygote_cannot_fork_a_fresh_interpreter_serves(monkeypatch):
    def refuse(self, timeout=0.0):
        raise ForkServerError("no fork")

    monkeypatch.setattr(ForkServer, "fork", refuse)
    isolated.shutdown()
    assert isolated.run_isolated(helpers.parent_pid) == os.getpid()
