"""Module-level functions for `session.run_isolated` in tests (a child imports them by name from tests/)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def load_with_stuck_step(path: str, pid_file: str, seconds: float = 600.0):
    """`session.load(path)` with the ONNX import's `import_graph` step made to sleep `seconds` first (a file whose
    import never returns); writes this process's pid to `pid_file` before it sleeps."""
    from rlxviz.models import onnx_import
    from rlxviz.session import loading

    real = onnx_import.import_graph

    def stuck(*args, **kwargs):
        Path(pid_file).write_text(str(os.getpid()))
        time.sleep(seconds)
        return real(*args, **kwargs)

    onnx_import.import_graph = stuck
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
