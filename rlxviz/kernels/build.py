"""Build rlxviz's CPU kernels (`src/`) against the installed MLX on first use, into a cache.

The C++ sources are compiled with CMake, MLX's own `share/cmake/MLX` config and nanobind, for the
machine that builds them (`-march=native`), once per cache key: the sources, MLX's version, nanobind's
version, the Python extension suffix, the compiler and the CPU's feature flags. The cache lives in
`$RLXVIZ_KERNELS_CACHE` or `~/.cache/rlxviz/kernels/<key>/`:

* `build.json`, the build record: seconds, compiler, and the library's size in bytes and sha256. A library is
  loaded (mapped) only when its size and hash equal the record's, so a truncated or altered library is built
  again instead of taking the process down (SIGBUS); a record that is missing, not JSON or from an older
  rlxviz counts as none (the library is built again).
* `lock`, a file lock: a second process waits for the first one's build instead of building again, at most
  `$RLXVIZ_KERNELS_LOCK_WAIT_S` seconds (default 120), printing one line that names the holder (pid, host,
  since when, as the holder wrote them into the lock file); past the deadline it runs without the kernels.
  A valid cache is read without the lock, so it is used on a read-only file system too.
* `failed.txt`: a failed build leaves the reason and the log's path there, so later processes fall back at
  once; a change of sources or MLX is a new key, hence a new attempt.

Nothing here raises, for a missing tool, a failed build or a damaged or unwritable cache: `build_kernels`
returns a `KernelStatus` that says why there are no kernels (naming the path to delete), prints that as one
line on stderr where the cache is at fault, and rlxviz then runs the composed MLX lowering.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

SRC = Path(__file__).with_name("src")
MODULE = "_rlxviz_kernels"
BUILD_TIMEOUT_S = 900
CACHE_ENV = "RLXVIZ_KERNELS_CACHE"


@dataclass(frozen=True)
class KernelStatus:
    """Whether rlxviz's CPU kernels can run in this process, and why not.

    Attributes:
        state: `built` (compiled by this process), `cached` (loaded from an earlier build), `off`
            (`RLXVIZ_KERNELS=0`) or `unavailable` (no toolchain, the build or the import failed).
        reason: for `off` / `unavailable`, why (one line); else "".
        path: the extension module (built or cached), else None.
        isa: the vector ISA the build targets (`avx512`, `avx2`, `neon`, `baseline`), else None.
        threads: threads the kernels use, else None.
        build_s: wall-clock seconds of the build that made `path` (from its record), else None.
        retry: `unavailable` only because another process's build held the lock past the wait: a later call may
            find its kernels (`rlxviz.kernels` asks again, without waiting).
    """

    state: str
    reason: str = ""
    path: str | None = None
    isa: str | None = None
    threads: int | None = None
    build_s: float | None = None
    retry: bool = False

    @property
    def available(self) -> bool:
        return self.state in ("built", "cached")

    def __str__(self) -> str:
        if self.available:
            took = f", build {self.build_s:.0f} s" if self.build_s is not None else ""
            return f"rlxviz CPU kernels: {self.state} ({self.isa}, {self.threads} threads{took})"
        what = "off" if self.state == "off" else "not available"
        return f"rlxviz CPU kernels: {what} ({self.reason}); fused ops run MLX's composed lowering"


def cache_root() -> Path:
    """`$RLXVIZ_KERNELS_CACHE`, else `$XDG_CACHE_HOME/rlxviz/kernels`, else `~/.cache/rlxviz/kernels`."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rlxviz" / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else ""
    except (OSError, subprocess.SubprocessError):
        return ""


@dataclass(frozen=True)
class Toolchain:
    """What a build needs: cmake, a C++ compiler, a generator (ninja or make), nanobind's CMake dir."""

    cmake: str
    cxx: str
    generator: list[str]
    nanobind: str


def find_toolchain(path: str | None = None) -> Toolchain | str:
    """The toolchain on `path` (default `$PATH`), or one line saying what is missing."""
    cmake = shutil.which("cmake", path=path)
    if cmake is None:
        return "no cmake on PATH"
    cxx = os.environ.get("CXX") or next((c for c in ("c++", "g++", "clang++") if shutil.which(c, path=path)), None)
    cxx = shutil.which(cxx, path=path) if cxx else None
    if cxx is None:
        return "no C++ compiler (c++, g++ or clang++) on PATH"
    ninja = shutil.which("ninja", path=path)
    if ninja:
        generator = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    elif shutil.which("make", path=path):
        generator = ["-G", "Unix Makefiles"]
    else:
        return "no ninja or make on PATH"
    if importlib.util.find_spec("nanobind") is None:
        return "nanobind is not installed (pip install nanobind)"
    import nanobind

    return Toolchain(cmake, cxx, generator, nanobind.cmake_dir())


def cache_key(tools: Toolchain) -> str:
    """Hash of everything the built module depends on (see the module docstring)."""
    import nanobind

    from .mlx_backend import mx

    h = hashlib.sha256()
    for f in sorted(SRC.iterdir()):
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    for part in (mx.__version__, nanobind.__version__, sysconfig.get_config_var("EXT_SUFFIX") or "",
                 _version([tools.cxx, "--version"]), platform.machine(), _cpu_flags()):
        h.update(str(part).encode() + b"\0")
    return f"mlx{mx.__version__}-{h.hexdigest()[:16]}"


def _import(path: Path) -> ModuleType:
    from . import mlx_backend  # noqa: F401  (BLAS first; mlx.core registers the array type)

    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
    spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _compile(tools: Toolchain, out: Path, log: Path) -> str | None:
    """Configure and build into a fresh folder under `out`; the module lands at `out/MODULE+suffix`.
    Returns None on success, else one line saying what failed."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    with tempfile.TemporaryDirectory(dir=out, prefix="build-") as tmp:
        cmds = [[tools.cmake, "-S", str(SRC), "-B", tmp, *tools.generator, f"-DCMAKE_CXX_COMPILER={tools.cxx}",
                 f"-DPython_EXECUTABLE={sys.executable}", f"-Dnanobind_DIR={tools.nanobind}",
                 "-DCMAKE_BUILD_TYPE=Release"],
                [tools.cmake, "--build", tmp, "--parallel", str(os.cpu_count() or 1)]]
        with log.open("w") as fh:
            for cmd in cmds:
                fh.write("$ " + " ".join(cmd) + "\n")
                fh.flush()
                try:
                    done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    return f"build timed out after {BUILD_TIMEOUT_S} s (log {log})"
                except OSError as err:
                    return f"could not run {cmd[0]}: {err}"
                if done.returncode != 0:
                    return f"{Path(cmd[0]).name} exited {done.returncode} (log {log})"
        built = next(Path(tmp).glob(MODULE + "*" + suffix[suffix.rfind("."):]), None)
        if built is None:
            return f"the build made no {MODULE} module (log {log})"
        staged = out / (MODULE + ".tmp" + suffix)
        shutil.copy2(built, staged)
        os.replace(staged, out / (MODULE + suffix))
    return None


LOCK_WAIT_ENV = "RLXVIZ_KERNELS_LOCK_WAIT_S"
LOCK_WAIT_S = 120.0
"""Default seconds a process waits for another one's build (the lock) before it runs without the kernels."""
RECORD_MAX_BYTES = 64 * 1024
"""A build record larger than this is not one of ours (it is not read)."""


def lock_wait_s() -> float:
    """Seconds to wait for the build lock: `$RLXVIZ_KERNELS_LOCK_WAIT_S` when it is a number >= 0, else 120."""
    try:
        wait = float(os.environ.get(LOCK_WAIT_ENV, ""))
    except ValueError:
        return LOCK_WAIT_S
    return wait if wait >= 0 and wait == wait else LOCK_WAIT_S


def library_record(library: Path) -> dict[str, int | str]:
    """`{"size": bytes, "sha256": hex digest}` of the file `library` (what a build record keeps of it).

    Raises:
        OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    size = 0
    with library.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": h.hexdigest()}


def read_record(record: Path) -> dict | None:
    """The build record at `record` when it is one (a JSON object of at most 64 KiB), else None (missing, not
    JSON, not an object, unreadable)."""
    try:
        if record.stat().st_size > RECORD_MAX_BYTES:
            return None
        data = json.loads(record.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_library(library: Path, record: Path) -> str | None:
    """Whether `library` is the one its build record describes: "" when its size and sha256 equal the record's,
    None when neither exists (nothing built yet), else one line saying what differs. Reads, never writes."""
    data = read_record(record)
    if not library.exists():
        return None if not record.exists() else f"{library.name} is missing"
    if data is None:
        return f"{record.name} is missing" if not record.exists() else f"{record.name} is not a build record"
    size, digest = data.get("size"), data.get("sha256")
    if not isinstance(size, int) or not isinstance(digest, str):
        return f"{record.name} has no size and sha256 of the library (an older rlxviz built it)"
    try:
        got = library_record(library)
    except OSError as err:
        return f"{library.name} cannot be read ({err.strerror or err})"
    if got["size"] != size:
        return f"{library.name} is {got['size']} bytes, its build record says {size}"
    if got["sha256"] != digest:
        return f"{library.name}'s sha256 differs from its build record's"
    return ""


def _printable(text: str, limit: int = 80) -> str:
    """`text` from a file another process wrote, cut to `limit` characters, control characters as `?`."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def _holder(lock: Path) -> str:
    """Who holds the build lock, as its holder wrote it into the lock file: `pid N on host H since T`."""
    try:
        with lock.open("rb") as fh:
            data = json.loads(fh.read(4096) or b"null")
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        return "a process that recorded no pid (an older rlxviz?)"
    host = _printable(str(data.get("host", "?")))
    since = f" since {_printable(str(data['since']), 40)}" if data.get("since") else ""
    return f"pid {_printable(str(data['pid']), 20)} on host {host}{since}"


def _take_lock(fd: int, lock: Path, quiet: bool, wait: float) -> str | None:
    """Take the exclusive build lock on `fd` (open on `lock`) within `wait` seconds, printing one line naming the
    holder when it has to wait (none when `wait` is 0); then write this process's pid, host and time into the lock
    file. Returns None once held, else one line saying whose build held it too long."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(lock)
        if not quiet and wait > 0:
            print(f"rlxviz: waiting up to {wait:g} s for the CPU kernels build of {holder} (lock {lock}; "
                  f"{LOCK_WAIT_ENV} sets the wait), then fused ops run MLX's composed lowering",
                  file=sys.stderr, flush=True)
        end, pause = time.monotonic() + wait, 0.02
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return (f"the CPU kernels build of {holder} held {lock} over {wait:g} s ({LOCK_WAIT_ENV}); "
                        f"remove {lock} if that build is stuck")
            time.sleep(min(pause, left))
            pause = min(2 * pause, 0.5)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                continue
    me = {"pid": os.getpid(), "host": platform.node(), "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    return None


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename, so a reader sees the old or the new file."""
    staged = path.with_name(path.name + f".{os.getpid()}.tmp")
    staged.write_text(text)
    os.replace(staged, path)


def _unavailable(reason: str, quiet: bool, say: bool = True) -> tuple[KernelStatus, None]:
    """The `unavailable` status for `reason`, printed as one line on stderr when `say` and not `quiet`."""
    st = KernelStatus("unavailable", reason)
    if say and not quiet:
        print(str(st), file=sys.stderr, flush=True)
    return st, None


def build_kernels(root: Path | None = None, path: str | None = None, quiet: bool = False, wait: float | None = None
                  ) -> tuple[KernelStatus, ModuleType | None]:
    """Load the kernels from the cache, building them first when the cache has none or a damaged one.

    Args:
        root: the cache folder (default `cache_root()`).
        path: the search path for cmake / the compiler / ninja (default `$PATH`).
        quiet: print nothing on stderr (else: one line announcing a build, one while waiting for another
            process's build, one when the cache or a build fails).
        wait: seconds to wait for another process's build (default `lock_wait_s()`); past it the status is
            `unavailable` with `retry` set.

    Returns:
        (status, module): the module is None exactly when `status.available` is False. Never raises: a
        damaged, unreadable or unwritable cache, a lock held past `lock_wait_s()` or a failed build is an
        `unavailable` status whose reason names the path to remove.
    """
    if os.environ.get("RLXVIZ_KERNELS", "1").strip().lower() in ("0", "off", "false", "no"):
        return KernelStatus("off", "RLXVIZ_KERNELS=0"), None
    tools = find_toolchain(path)
    if isinstance(tools, str):
        return KernelStatus("unavailable", tools), None
    root = root or cache_root()
    try:
        key = cache_key(tools)
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        return _unavailable(f"cache key: {err}", quiet)
    out = root / key
    try:
        return _cached_or_built(tools, out, quiet, lock_wait_s() if wait is None else wait)
    except Exception as err:  # noqa: BLE001 - the whole cached path fails soft: the run goes on without kernels
        detail = getattr(err, "strerror", None) or (str(err).splitlines() or ["(no message)"])[0]
        return _unavailable(f"kernel cache {out}: {type(err).__name__}: {detail}; remove {out} to rebuild", quiet)


def _cached_or_built(tools: Toolchain, out: Path, quiet: bool, wait: float) -> tuple[KernelStatus, ModuleType | None]:
    """`build_kernels` for the cache folder `out` (see there); exceptions are the caller's to turn into a status."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target, record, failed, lock = out / (MODULE + suffix), out / "build.json", out / "failed.txt", out / "lock"
    damage = check_library(target, record)
    if damage == "":  # valid: load without the lock, which a read-only cache could not take
        return _load(target, record, "cached", out, quiet)
    step = f"the cache folder {out}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        step = f"the build lock {lock}"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as err:
        why = err.strerror or str(err)
        if err.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):  # e.g. the lock is a folder, `out` a file
            return _unavailable(f"cannot open {step} ({why}); remove {out} to rebuild", quiet)
        fix = (f"set {CACHE_ENV} to a writable folder to build them" if damage is None
               else f"{damage}; remove {out} or make it writable to build them")
        return _unavailable(f"cache folder {out} is not writable ({why}) and "
                            f"{'holds no kernels; ' if damage is None else ''}{fix}", quiet)
    state = "cached"
    try:
        if (why := _take_lock(fd, lock, quiet, wait)) is not None:
            return KernelStatus("unavailable", why, retry=True), None  # the wait line said what happens next
        if failed.exists():
            return _unavailable(_printable(failed.read_text(errors="replace").strip(), 2000), quiet, say=False)
        damage = check_library(target, record)  # again: another process may have built it while we waited
        if damage != "":
            if not quiet:
                doing = (f"building the CPU kernels once into {out}" if damage is None
                         else f"building the CPU kernels again into {out} ({damage})")
                print(f"rlxviz: {doing} ...", file=sys.stderr, flush=True)
            record.unlink(missing_ok=True)  # no record until the new library is whole
            t0 = time.perf_counter()
            err = _compile(tools, out, out / "build.log")
            if err is not None:
                why = f"build failed: {err}; remove {out} to retry"
                failed.write_text(why + "\n")
                return _unavailable(why, quiet)
            entry = {"build_s": round(time.perf_counter() - t0, 1), "cxx": tools.cxx, **library_record(target)}
            _write_atomic(record, json.dumps(entry))
            state = "built"
    finally:
        os.close(fd)  # releases the lock
    return _load(target, record, state, out, quiet)


def _load(target: Path, record: Path, state: str, out: Path, quiet: bool) -> tuple[KernelStatus, ModuleType | None]:
    """Import the checked library `target` as the kernels module; an import error is an `unavailable` status."""
    try:
        module = _import(target)
    except (ImportError, OSError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        return _unavailable(f"import failed: {first}; remove {out} to rebuild", quiet)
    build_s = (read_record(record) or {}).get("build_s")
    build_s = build_s if isinstance(build_s, (int, float)) else None
    return KernelStatus(state, path=str(target), isa=module.isa(), threads=module.threads(), build_s=build_s), module


__all__ = ["KernelStatus", "Toolchain", "build_kernels", "cache_key", "cache_root", "check_library",
           "find_toolchain", "library_record", "lock_wait_s"]
