"""Module-level functions for `session.run_isolated` in tests (a child imports them by name from tests/)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def load_with_stuck_step(path: str, pid_file: str, seconds: float = 600.0):
    """`session.load(path)` with the ONNX import's `import_graph` step made to sleep `seconds` first (a file whose
    import never returns); writes this process's pid to `pid_file` before it sleeps."""
    from rlxviz.models.onnx import read
    from rlxviz.session import loading

    real = read.import_graph

    def stuck(*args, **kwargs):
        Path(pid_file).write_text(str(os.getpid()))
        time.sleep(seconds)
        return real(*args, **kwargs)

    read.import_graph = stuck
    return loading.load(path, 1, 8)


def allocate(nbytes: int) -> int:
    """Allocate and touch `nbytes` bytes (a load whose memory grows past its cap)."""
    block = bytearray(nbytes)
    return len(block)


def crash() -> None:
    """Die by SIGSEGV, as a native library does."""
    os.kill(os.getpid(), signal.SIGSEGV)


def warn_and_return(value: int) -> int:
    """Raise a UserWarning, then return `value`."""
    import warnings

    warnings.warn("a warning from the child", UserWarning, stacklevel=1)
    return value


def server_with_stuck_job(ready_file: str) -> None:
    """(A process's main) what a serving app holds when it is stopped mid-work: the SIGTERM handler installed,
    an upload folder of its own, and a child running a job that never returns. Writes `pid child_pid folder` to
    `ready_file`, then waits for a signal."""
    import threading

    from rlxviz.app.main import stop_on_sigterm
    from rlxviz.app.sources import store_upload
    from rlxviz.session import isolated

    stop_on_sigterm()
    folder = store_upload({"model.onnx": b"x" * 1024})
    threading.Thread(target=lambda: isolated.run_isolated(time.sleep, 10_000, timeout_s=10_000), daemon=True).start()
    while not isolated._RUNNING:
        time.sleep(0.05)
    child = next(iter(isolated._RUNNING)).pid
    Path(ready_file).write_text(f"{os.getpid()} {child} {folder}")
    while True:
        time.sleep(1)


def spin(seconds: float) -> float:
    """Compute (a busy loop, no sleeping) for `seconds` of this process's CPU time; returns the CPU time used. A load
    that keeps a core busy, as a hostile file's import does."""
    start = time.process_time()
    x = 0
    while time.process_time() - start < seconds:
        x += 1
    return time.process_time() - start


def idle(seconds: float, value: int) -> int:
    """Sleep `seconds` of wall time using almost no CPU, then return `value`: a load on a machine so busy that its
    wall time passes while it waits for a core."""
    time.sleep(seconds)
    return value


def slow_teardown(value: int, seconds: float = 600.0) -> int:
    """`value`, after registering an exit handler that sleeps `seconds` (a child whose interpreter teardown is slow:
    the caller must not wait for it)."""
    import atexit

    atexit.register(time.sleep, seconds)
    return value


def parent_pid() -> int:
    """The calling process's parent pid (a child's: the zygote it was forked from, or the server)."""
    return os.getppid()


def environment(name: str) -> tuple[str | None, str]:
    """The environment variable `name` and the working folder, as this process sees them."""
    return os.environ.get(name), os.getcwd()


def spin_ignoring_xcpu(seconds: float) -> float:
    """`spin(seconds)` with SIGXCPU ignored and the CPU-time hard limit 1 s past the soft one: a load in native code
    that never returns to Python, which the kernel ends with SIGKILL at the hard limit."""
    import resource

    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    soft, _ = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))
    return spin(seconds)
