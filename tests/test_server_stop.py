"""A stopping server keeps nothing a session made (issue 40): SIGTERM ends it within seconds with every child
killed and its upload folders removed; folders a killed server left are removed at the next start; a child whose
server died is killed by the kernel (it never outlives it)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlxviz.app import sources

ROOT = Path(__file__).resolve().parents[1]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/status").exists() and "State:\tZ" in Path(f"/proc/{pid}/status").read_text()


def _wait_ready(path: Path, proc: subprocess.Popen, limit_s: float = 120) -> list[str]:
    t0 = time.monotonic()
    while not path.exists() or not path.read_text():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() - t0 < limit_s, "the helper process did not get ready"
        time.sleep(0.1)
    return path.read_text().split()


def _start_server_like(tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    ready = tmp_path / "ready"
    code = f"import isolation_helpers as h; h.server_with_stuck_job({str(ready)!r})"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    pid, child, folder = _wait_ready(ready, proc)
    assert int(pid) == proc.pid and Path(folder).is_dir() and not _gone(int(child))
    return proc, int(child), Path(folder)


def test_sigterm_ends_the_server_its_children_and_its_uploads_within_seconds(tmp_path):
    proc, child, folder = _start_server_like(tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 128 + signal.SIGTERM
    assert time.monotonic() - t0 < 5
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(child), "the job's child outlived the server"
    assert not folder.exists(), "the upload folder was left behind"


def test_a_killed_servers_child_dies_with_it_and_its_uploads_go_at_the_next_start(tmp_path):
    proc, child, folder = _start_server_like(tmp_path)
    proc.kill()  # no handler runs
    proc.wait(10)
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(child), "the job's child outlived a killed server"
    assert folder.is_dir()  # nothing could remove it
    assert folder in sources.remove_stale_uploads(folder.parent) and not folder.exists()


def test_stale_upload_folders_are_told_from_live_ones(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    mine = tmp_path / f"{sources.UPLOAD_PREFIX}{os.getpid()}-abc"
    stale = tmp_path / f"{sources.UPLOAD_PREFIX}{dead_pid}-def"
    ownerless = tmp_path / f"{sources.UPLOAD_PREFIX}ghi"
    other = tmp_path / "someone-elses-folder"
    for f in (mine, stale, ownerless, other):
        f.mkdir()
    assert sorted(sources.remove_stale_uploads(tmp_path)) == sorted([stale, ownerless])
    assert mine.is_dir() and other.is_dir()
    assert sources.remove_uploads(root=tmp_path) == [mine] and not mine.exists() and other.is_dir()


def test_an_upload_folder_names_its_server():
    folder = sources.store_upload({"model.onnx": b"\0"})
    try:
        assert folder.name.startswith(f"{sources.UPLOAD_PREFIX}{os.getpid()}-")
    finally:
        sources.remove_uploads()
    assert not folder.exists()


def test_a_spare_started_from_a_short_lived_thread_stays_alive():
    """PR_SET_PDEATHSIG follows the thread that started a child: the server's warm-up thread starts the spare and
    ends at once, and the spare must still be there for the first upload."""
    import threading

    from rlxviz.session import isolated

    def ask_and_wait_until_serving() -> None:  # the thread ends only after the child set its parent-death signal
        isolated.spare_ready()
        pid, t0 = isolated._SPARE[1].pid, time.monotonic()
        while "pipe" not in Path(f"/proc/{pid}/wchan").read_text() and time.monotonic() - t0 < 120:
            time.sleep(0.1)  # waiting on its stdin: the imports (and the prctl before them) are done

    isolated.shutdown()
    t = threading.Thread(target=ask_and_wait_until_serving)
    t.start()
    t.join()
    time.sleep(1.0)
    spare = isolated._SPARE
    try:
        assert spare is not None and spare[1].poll() is None, "the spare died with the thread that asked for it"
    finally:
        isolated.shutdown()


def _cmdline(proc: object) -> str:
    """A child's command line, or "" once it has exited (a zombie until the server reaps it: psutil raises)."""
    import psutil

    try:
        return " ".join(proc.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return ""


def test_sigterm_stops_a_served_app_with_its_children_and_uploads(tmp_path):
    """The real server (`panel serve app.py`, a page open, its Timing job running in a child): SIGTERM ends it
    within 5 s, its child processes and its upload folders with it."""
    import tempfile
    import urllib.request

    import psutil
    from served import ROOT as APP_ROOT
    from served import chromium, free_port, open_tab

    port = free_port()
    panel = Path(sys.executable).parent / "panel"
    proc = subprocess.Popen([str(panel), "serve", "app.py", "--address", "127.0.0.1", "--port", str(port),
                             f"--allow-websocket-origin=127.0.0.1:{port}", "--num-procs", "1"],
                            cwd=APP_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        t0 = time.monotonic()
        while True:  # up when its static files are served
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/static/extensions/panel/css/alerts.css", timeout=1)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() - t0 < 120, "panel serve did not start"
                time.sleep(0.2)
        with chromium() as b:
            pg = b.new_page()
            pg.goto(f"http://127.0.0.1:{port}/app", timeout=180_000)
            pg.locator(".rv-after g.node").first.wait_for(timeout=180_000)  # a session built the app
            open_tab(pg, "Timing")
            pg.locator(".rv-time button").click()  # the timing job runs in a child of the server
            t0 = time.monotonic()
            while True:
                children = psutil.Process(proc.pid).children(recursive=True)
                if any("isolated.serve" in _cmdline(c) for c in children):
                    break
                assert time.monotonic() - t0 < 120, "no child to end"
                time.sleep(0.2)
            upload = Path(tempfile.mkdtemp(prefix=f"{sources.UPLOAD_PREFIX}{proc.pid}-"))  # a load reading it
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 128 + signal.SIGTERM and time.monotonic() - t0 < 5
        deadline = time.monotonic() + 5
        while any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [c.pid for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        assert not upload.exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
