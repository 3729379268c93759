"""Loading a user's file in a child process that can be stopped: bounded in CPU time (with a wall-clock backstop)
and in address space.

Why a process: an import runs Python and native code (protobuf, ONNX shape inference, NumPy) that a thread cannot
interrupt; a file that makes one step slow would hold the server's GIL and its worker thread until the step ends.
A child process is stopped past its CPU-time limit (`RLIMIT_CPU`, `ir.bounded.cap_cpu`: a busy machine does
not refuse a good file, as a wall-clock limit did) or, as a backstop, past `WALL_FACTOR` times it in wall time (a
stopped or starved child), and its memory is capped by the kernel (`RLIMIT_AS`), so one upload never stalls or
starves another session.

Each call has its own child: a fork of the zygote (`ir.forkserver`), a fresh interpreter that imported the loader's
modules (`PRELOAD`) once and forks a child per call in milliseconds; the child waits for one request on its stdin.
Not a fork of the server: the server has threads (Bokeh's, the sessions', the spawner) and their locks, which a fork
would copy held; the zygote has one thread, and no lock is held when it forks. Where the zygote cannot fork (it
did not start, or died), a call's child is a fresh interpreter (`python -c`) as before, paying the imports (~2.9 s
of CPU on a 2-core AMD EPYC). One child is kept forked as a spare (`spare_ready`; the server starts the zygote and
the spare at its start, so that its first load does not wait for the imports). The child runs
`loading.load` (its own budget checks included: `Limits.check`, the importer's bounds) and writes the `Model`
back pickled on a pipe of its own (its stdout; anything the loaded code prints goes to stderr). Pickling is
exact: the graph's text (`format_graph`), node for node equality, weights (values and dtypes), meta, and the host
nodes' encoded ONNX nodes (tests/test_isolated.py checks it).

Example:
    >>> m = load_isolated("upload/model.onnx", batch=1, seq=16, timeout_s=60)   # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..ir.bounded import (
    WALL_FACTOR,
    CpuTimeExceeded,
    address_space,
    cap_address_space,
    cap_cpu,
    children_cpu,
    spawn,
    stop,
)
from ..ir.forkserver import Forked, ForkServer, ForkServerError
from ..models import PRESETS, Model
from .defaults import DEFAULT_BATCH, DEFAULT_SEQ
from .errors import SessionError, StoppedError
from .limits import Limits, human_bytes
from .loading import MODELS, first_line, load

T = TypeVar("T")

LOAD_SECONDS = 120.0
"""CPU-time limit (seconds) on one load, from the request; the child is stopped past it, and killed past
`WALL_FACTOR` times it in wall time."""

ADDRESS_FACTOR = 3
"""The child's address space may grow by this many times the memory limit: the file's bytes, the weights made
from them, and the pickle sent back each take about the weights' size at the peak."""

ADDRESS_SLACK_BYTES = 512 << 20
"""Address space allowed on top of `ADDRESS_FACTOR` x the limit (bytes): the loader's own temporaries, thread stacks
and allocator arenas."""

PRELOAD = ("numpy", "onnx", "onnx.reference", "rlxviz.session.loading", "rlxviz.models.onnx")
"""Modules a child imports before it reads its request."""

_MAIN = "from rlxviz.session import isolated; isolated.serve()"
"""A fresh child's program after `bounded.spawn`'s prologue (which makes the kernel kill it when the server dies)."""
_TARGET = "rlxviz.session.isolated.serve"
"""What a child forked from the zygote runs (the zygote imported it)."""

USE_FORK_SERVER = True
"""Children are forks of the zygote (False: a fresh interpreter each, as before; benchmarks/bench_isolated_start.py
compares the two)."""
_ZYGOTE: ForkServer | None = None
_ZYGOTE_LOCK = threading.Lock()
_SPARE: tuple[tuple, subprocess.Popen] | None = None
_SPARE_LOCK = threading.Lock()
_RUNNING: set[subprocess.Popen] = set()
"""Children serving a call now (`run_isolated`); `stop_children` kills them."""


def _portable(e: BaseException) -> BaseException:
    """`e` if it survives pickling with its type and message, else a SessionError (a user error) or RuntimeError
    (anything else) holding its type name and first line."""
    try:
        back = pickle.loads(pickle.dumps(e))
        if type(back) is type(e) and str(back) == str(e):
            return e
    except Exception:  # noqa: BLE001 - any exception type may refuse to pickle
        pass
    kind = SessionError if isinstance(e, SessionError) else RuntimeError
    return kind(f"{type(e).__name__}: {first_line(e)}")


def _call(fn: Callable[..., Any], args: tuple, kwargs: dict, extra_address: int,
          cpu_s: float | None = None) -> tuple[str, Any, list]:
    """(In the child) `fn(*args, **kwargs)` under the address-space cap and the CPU-time limit `cpu_s` (seconds; None:
    none), as `(status, value, warnings)`: `ok` with the result, `error` with the exception, `memory` when the cap
    was met, `cpu` past the CPU-time limit."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if extra_address:
                cap_address_space(extra_address)
            if cpu_s is not None:
                cap_cpu(cpu_s)
            result: tuple[str, Any] = ("ok", fn(*args, **kwargs))
        except MemoryError:
            result = ("memory", None)
        except CpuTimeExceeded:
            result = ("cpu", None)
        except BaseException as e:  # noqa: BLE001 - every outcome goes back to the parent
            result = ("error", _portable(e))
    return (*result, [(str(w.message), w.category) for w in caught])


def serve() -> None:
    """(The child's main, in a fork of the zygote or a fresh interpreter) import `PRELOAD` (a fork has them
    already), read one pickled request `(fn, args, kwargs, extra_address, cpu_s, environment, folder)` from stdin,
    take the caller's environment variables and working folder (as they are now: the spare, or the zygote, started
    before), write the pickled `_call` outcome to the original stdout, and exit at once (`os._exit`: the parent
    waits for the exit, so the interpreter's teardown is not run). An empty stdin (a spare never used, or the parent
    gone) exits at once."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what the loaded code prints goes to stderr, never into the reply
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which kills the child
    for name in PRELOAD:
        importlib.import_module(name)
    raw = sys.stdin.buffer.read()
    if not raw:
        return
    *call, env, folder = pickle.loads(raw)
    os.environ.clear()  # the caller's, now (a spare was started, or its zygote forked, before any change)
    os.environ.update(env)
    with contextlib.suppress(OSError):
        os.chdir(folder)
    outcome = _call(*call)
    buffers: list[pickle.PickleBuffer] = []
    try:
        reply = pickle.dumps(outcome, protocol=5, buffer_callback=buffers.append)
    except MemoryError:
        buffers, reply = [], pickle.dumps(("memory", None, outcome[2]))
    _write_reply(out, reply, buffers)
    out.flush()
    out.close()  # the parent's read ends here, not when the interpreter is torn down
    sys.stderr.flush()
    os._exit(0)  # the teardown (every imported module freed) took 0.6 s on a loaded machine, on each load's path


def _write_reply(out: Any, reply: bytes, buffers: list[pickle.PickleBuffer]) -> None:
    """Write the pickled outcome with its out-of-band buffers (pickle protocol 5: each contiguous array's bytes, the
    weights, written from the array itself, not first copied into one pickle: 434 MB of a BERT-base-sized export
    took 0.86 s to pickle): an 8-byte little-endian length, a header pickle `(len(reply), [buffer lengths])`, the
    reply, then each buffer. `_read_reply` reads it back."""
    views = [b.raw() for b in buffers]
    header = pickle.dumps((len(reply), [v.nbytes for v in views]))
    out.write(struct.pack("<Q", len(header)))
    out.write(header)
    out.write(reply)
    for v in views:
        out.write(v)


def _read_reply(data: bytes) -> Any:
    """The outcome `_write_reply` wrote (from this module's own child), its arrays in writable buffers of their own.
    Raises ValueError when `data` is cut short."""
    view = memoryview(data)
    (n,) = struct.unpack_from("<Q", view, 0)
    size, lengths = pickle.loads(view[8:8 + n])
    at = 8 + n + size
    if at + sum(lengths) != len(data):
        raise ValueError(f"a reply of {len(data)} bytes; its header says {at + sum(lengths)}")
    buffers = []
    for k in lengths:
        buffers.append(bytearray(view[at:at + k]))
        at += k
    return pickle.loads(view[8 + n:8 + n + size], buffers=buffers)


PIPE_BYTES = 1 << 20
"""The reply pipe's capacity asked of the kernel (`F_SETPIPE_SZ`; Linux's unprivileged maximum by default): with the
default 64 KB a 434 MB reply took 7,000 wake-ups of each side."""


def _feed(pipe: Any, request: bytes) -> None:
    """Write `request` to the child's stdin and close it (a child that died meanwhile: nothing to do)."""
    try:
        pipe.write(request)
        pipe.close()
    except (BrokenPipeError, ValueError, OSError):
        pass


def _fill(fd: int, into: memoryview, deadline: float) -> int:
    """Read from `fd` (non-blocking) into `into` until it is full or the pipe ends; the bytes read.
    Raises subprocess.TimeoutExpired past `deadline` (`time.monotonic`)."""
    got = 0
    while got < len(into):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise subprocess.TimeoutExpired("the child", 0)
        try:
            n = os.readv(fd, [into[got:]])
        except BlockingIOError:
            continue
        if n == 0:
            break
        got += n
    return got


def _exchange(proc: subprocess.Popen, request: bytes, wall: float) -> Any:
    """Send `request` to the child and read its reply as `_write_reply` wrote it, each array's bytes straight into a
    writable buffer of its own (no copy of the whole reply, then of each array, as `communicate` and `_read_reply`
    made: 434 MB took seconds on a loaded machine). The reply's outcome, or None when the child wrote nothing (it
    died first).

    Raises:
        subprocess.TimeoutExpired: past `wall` seconds.
        ValueError: the reply was cut short (the child died while writing).
    """
    deadline = time.monotonic() + wall
    threading.Thread(target=_feed, args=(proc.stdin, request), daemon=True).start()  # the child reads it all first
    fd = proc.stdout.fileno()
    if hasattr(fcntl, "F_SETPIPE_SZ"):
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    os.set_blocking(fd, False)
    head = bytearray(8)
    got = _fill(fd, memoryview(head), deadline)
    if got == 0:
        return None
    if got < 8:
        raise ValueError(f"a reply of {got} bytes")
    (n,) = struct.unpack("<Q", head)
    header = bytearray(n)
    size, lengths = pickle.loads(header) if _fill(fd, memoryview(header), deadline) == n else (None, None)
    if size is None:
        raise ValueError("a reply cut short in its header")
    reply = bytearray(size)
    buffers = [bytearray(k) for k in lengths]
    for part in (reply, *buffers):
        if _fill(fd, memoryview(part), deadline) != len(part):
            raise ValueError(f"a reply cut short: its header says {8 + n + size + sum(lengths)} bytes")
    return pickle.loads(reply, buffers=buffers)


def _environment() -> tuple:
    """What a child must share with this process: the interpreter and the import path's folders.

    The folders as a set: `panel serve --warm` starts the spare while Bokeh runs the app's script, with the
    script's folder put first on `sys.path` for that while (it is also on `PYTHONPATH`, later); the sessions'
    loads see the path without it. Compared in order, the spare never matched, and the first load after every
    server start paid a cold child's imports (7-10 s on a loaded 2-core machine) instead of none."""
    return (sys.executable, frozenset(p for p in sys.path if p))


def _zygote() -> ForkServer:
    """The zygote for this environment (`_environment`): the running one, else a new one. A zygote of another
    environment is retired: it is stopped once the children it serves have exited (a zygote's children die with
    it)."""
    global _ZYGOTE
    with _ZYGOTE_LOCK:
        z = _ZYGOTE
        if z is None or z.key != _environment() or not z.alive():
            if z is not None:
                z.retire()
            _ZYGOTE = z = ForkServer(_TARGET, PRELOAD, _environment())
        return z


def _start() -> subprocess.Popen | Forked:
    """A new child: a fork of the zygote (started first if needed), or, where that fails, a fresh interpreter
    (`bounded.spawn`: started from its one spawner thread, killed when this process dies)."""
    if USE_FORK_SERVER:
        try:
            return _zygote().fork()
        except ForkServerError:
            pass
    return spawn(_MAIN)


def _stop_zygote() -> None:
    """Stop the zygote; its children die with it."""
    global _ZYGOTE
    with _ZYGOTE_LOCK:
        z, _ZYGOTE = _ZYGOTE, None
    if z is not None:
        z.stop()


def _take() -> subprocess.Popen | Forked:
    """The spare child if it is alive and shares this environment, else a new child. The spare is taken, not
    replaced: `run_isolated` starts the next one after its load (a spare's imports would compete with the load)."""
    global _SPARE
    with _SPARE_LOCK:
        spare, _SPARE = _SPARE, None
    if spare is not None and spare[0] == _environment() and spare[1].poll() is None:
        return spare[1]
    if spare is not None:
        stop(spare[1])
    return _start()


@atexit.register
def shutdown() -> None:
    """Stop the spare child and the zygote, and with it every child forked from it (the next call starts new
    ones)."""
    global _SPARE
    with _SPARE_LOCK:
        spare, _SPARE = _SPARE, None
    if spare is not None:
        stop(spare[1])
    _stop_zygote()


def stop_children() -> None:
    """Kill every child: the spare and those serving a call now (each such call raises `StoppedError`). For a
    server that is stopping (SIGTERM)."""
    shutdown()
    with _SPARE_LOCK:
        running = list(_RUNNING)
    for proc in running:
        if proc.poll() is None:
            proc.kill()


def spare_ready() -> None:
    """Start the spare child now, and the zygote first where none serves this environment (a server calls this at
    start-up, so that its first load does not wait for the imports)."""
    global _SPARE
    with _SPARE_LOCK:
        if _SPARE is not None and _SPARE[0] == _environment() and _SPARE[1].poll() is None:
            return
        old, _SPARE = _SPARE, None
    if old is not None:
        stop(old[1])
    new: tuple | None = (_environment(), _start())  # not under the lock: a new zygote's imports take seconds
    with _SPARE_LOCK:
        if _SPARE is None:
            _SPARE, new = new, None
    if new is not None:  # another thread made one meanwhile
        stop(new[1])


def _refill() -> None:
    """After a call: a new spare, forked at once where the zygote serves this environment (else the next call
    starts the zygote: a call does not wait for its imports to return); a fresh interpreter without the fork
    server."""
    z = _ZYGOTE
    if not USE_FORK_SERVER or (z is not None and z.alive() and z.key == _environment()):
        spare_ready()


@dataclass(frozen=True)
class Job:
    """The words a stopped child's message uses for its work: `noun` ("a load"), `gerund` ("loading") and
    `agent` ("the loader")."""

    noun: str
    gerund: str
    agent: str


LOAD = Job("a load", "loading", "the loader")
TIMING = Job("a timing job", "timing", "the timing job")


def run_isolated(fn: Callable[..., T], *args: Any, timeout_s: float | None = LOAD_SECONDS,
                 wall_s: float | None = None, max_bytes: int | None = None, what: str = "the load", job: Job = LOAD,
                 **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` run in a child process that is stopped after `timeout_s` seconds of CPU time, or killed
    after `wall_s` seconds of wall time (default `WALL_FACTOR * timeout_s`: a stopped or starved child).

    `fn` and its arguments are pickled to the child (`fn` by reference: a module-level function of a module on
    `sys.path`), its result pickled back. The caller's thread waits; other threads and other calls run on (each
    call has its own child). Warnings the child raised are raised again here.

    Args:
        fn: a module-level function.
        timeout_s: CPU-time limit in seconds, from the request (the child's own CPU time: a machine busy with other
            work does not count against it); None: none (then `wall_s` is required).
        wall_s: wall-time limit in seconds, from the request: a measurement whose time is the point (a timing job)
            is bounded in wall time; None: `WALL_FACTOR * timeout_s`, the backstop of a CPU-time limit.
        max_bytes: the memory limit (bytes): the child's address space may then grow by
            `ADDRESS_FACTOR * max_bytes + ADDRESS_SLACK_BYTES` (None: no cap).
        what: the work, for messages (`reliability/x.onnx`).
        job: the kind of work, for messages (`LOAD`, `TIMING`).

    Raises:
        StoppedError: past `timeout_s` of CPU time or its wall-clock backstop (the child is killed), out of memory
            under the cap, or the child died (a signal in native code). One line, naming `what`.
        Whatever `fn` raised in the child (SessionError and friends keep their type; a type that does not pickle
        becomes SessionError or RuntimeError with its name and first line).
    """
    extra = 0 if max_bytes is None else ADDRESS_FACTOR * max_bytes + ADDRESS_SLACK_BYTES
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    request = pickle.dumps((fn, args, kwargs, extra, timeout_s, env, os.getcwd()), protocol=pickle.HIGHEST_PROTOCOL)
    if timeout_s is None and wall_s is None:
        raise ValueError("run_isolated needs a CPU-time or a wall-time limit")
    over_cpu = ("" if timeout_s is None
                else f"{what}: stopped after {timeout_s:g} s of CPU time (the CPU-time limit on {job.noun})")
    proc = _take()
    with _SPARE_LOCK:
        _RUNNING.add(proc)
    wall, cpu0 = wall_s if wall_s is not None else timeout_s * WALL_FACTOR, children_cpu()
    try:
        outcome = _exchange(proc, request, wall)
    except subprocess.TimeoutExpired:
        if wall_s is not None:
            raise StoppedError(f"{what}: stopped after {wall:g} s (the wall-time limit on {job.noun})") from None
        raise StoppedError(f"{what}: stopped after {wall:g} s of wall time (the backstop on {job.noun}, "
                           f"{WALL_FACTOR:g}x its {timeout_s:g} s CPU-time limit: the process was stopped or "
                           "starved)") from None
    finally:
        with _SPARE_LOCK:
            _RUNNING.discard(proc)
        stop(proc)
        _refill()
    if outcome is None:
        code = proc.returncode  # a fork's CPU time is its own, from the zygote (children_cpu counts only our children)
        used = (proc.cpu_s or 0.0) if isinstance(proc, Forked) else children_cpu() - cpu0
        if timeout_s is not None and (code == -signal.SIGXCPU or (code == -signal.SIGKILL and used >= timeout_s)):
            raise StoppedError(over_cpu)  # SIGKILL: the hard limit, native code never returned to Python
        how = (f"signal {signal.Signals(-code).name}" if code < 0 and -code in signal.Signals._value2member_map_
               else f"exit {code}")
        raise StoppedError(f"{what}: the {job.gerund} process died ({how}): out of memory or a crash in native code")
    status, value, notes = outcome
    for message, category in notes:
        warnings.warn(message, category, stacklevel=2)
    if status == "cpu":
        raise StoppedError(over_cpu)
    if status == "memory":
        raise StoppedError(f"{what}: out of memory while {job.gerund} ({job.agent} may use "
                           f"{human_bytes(extra)} of address space for a memory limit of "
                           f"{human_bytes(max_bytes or 0)})")
    if status == "error":
        raise value
    return value


def _signature(p: Path) -> tuple:
    """What identifies the content at `p` for the cache: size and mtime of the file, or of a folder's files."""
    try:
        if p.is_dir():
            return tuple(sorted((c.name, c.stat().st_size, c.stat().st_mtime_ns) for c in p.iterdir()
                                if c.is_file())[:64])
        st = p.stat()
        return (st.st_size, st.st_mtime_ns)
    except OSError:
        return ()


def load_isolated(model: str, batch: int = DEFAULT_BATCH, seq: int = DEFAULT_SEQ, style: str | None = None,
                  variant: str | None = None, variant_layer: int = 0, limits: Limits | None = None,
                  threshold: int | None = None, allowed_roots: Sequence[Path] | None = None,
                  max_seq: int | None = None, timeout_s: float = LOAD_SECONDS,
                  dims: tuple[tuple[str, int], ...] = (), bounds: tuple[tuple[str, int], ...] = ()) -> Model:
    """`loading.load` with the same arguments, run in a child process (`run_isolated`) for anything but a preset.
    `dims`, `bounds`: values of an `.onnx` file's symbolic dims by name and the most those that set the batch or
    sequence length may be (`loading.load`'s `dims` and `bounds`, as pairs).

    The child's address space is capped from `limits` and it is killed after `timeout_s` seconds; the model comes
    back pickled and is cached in `MODELS` by the file's (or folder's files') size and mtime and the arguments.
    Presets are built in this process (no user file is read).

    Raises:
        SessionError: what `load` raises (one line), and `StoppedError` past `timeout_s`, out of memory, or when
            the loading process died.
    """
    limits = limits or Limits.resolve()
    call = (model, batch, seq, style, variant, variant_layer, limits, threshold,
            None if allowed_roots is None else tuple(Path(r) for r in allowed_roots), max_seq)
    if model in PRESETS:
        return load(*call)
    p = Path(model)
    key = ("isolated", str(p.expanduser().resolve()), _signature(p), *call[1:], tuple(dims), tuple(bounds))
    return MODELS.get_or_compute(key, lambda: run_isolated(load, *call, dims=dict(dims) or None,
                                                           bounds=dict(bounds) or None, timeout_s=timeout_s,
                                                           max_bytes=limits.max_bytes, what=model))


def check_isolated(model: Model, limits: Limits | None = None, timeout_s: float = LOAD_SECONDS,
                   user: Any = None) -> tuple[str, bool]:
    """`fidelity.onnx_check(model, user)` (version 0 against its ONNX file, run by ONNX Runtime, on random inputs or
    on `user`'s arrays with its expected outputs) in a child process, as the load is: ONNX Runtime reads the user's
    file itself, and a crash, a hang or a blown memory limit there must not reach the server. Past `timeout_s`
    seconds, out of memory, or a dead child: `(its one line, False)`."""
    from .fidelity import onnx_check

    limits = limits or Limits.resolve()
    try:
        return run_isolated(onnx_check, model, user, timeout_s=timeout_s, max_bytes=limits.max_bytes,
                            what="checking version 0 against the ONNX model")
    except StoppedError as e:
        return str(e).splitlines()[0], False


__all__ = ["ADDRESS_FACTOR", "ADDRESS_SLACK_BYTES", "LOAD_SECONDS", "PRELOAD", "address_space", "check_isolated",
           "load_isolated", "run_isolated", "serve", "shutdown", "spare_ready"]
