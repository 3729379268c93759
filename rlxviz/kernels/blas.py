"""Pick the CBLAS that MLX's CPU backend calls for float32 GEMM, before `mlx.core` is imported.

The Linux `mlx[cpu]` wheel resolves `cblas_sgemm` & co. dynamically and ships only a slow
reference BLAS (measured here: ~6 GFLOP/s for `[1024,384] x [384,1152]` on 2 EPYC cores). A
library exporting the plain `cblas_*` symbols loaded with `RTLD_GLOBAL` *before* `import mlx.core`
takes precedence in symbol resolution, and MLX's matmul then runs at that library's speed
(measured: ~200 GFLOP/s with OpenBLAS 0.3.31 on the same 2 cores, on par with NumPy).

Candidates, tried in this order (the first that loads wins):

1. `$RLXVIZ_BLAS`: an explicit path to a shared library, or `none` to keep MLX's bundled BLAS.
2. `cmeel-openblas` (PyPI, a project dependency on Linux): OpenBLAS 0.3.31 exporting plain
   `cblas_*`; needs `libgfortran.so.5` (Debian `libgfortran5`). Chosen first because `pip` installs
   it with the project, so `make app` needs no system package beyond libgfortran.
3. Debian `libopenblas0-pthread` (`/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0`
   or the `libopenblas.so.0` alternative).
4. Intel MKL's single dynamic library `libmkl_rt.so.2` (PyPI `mkl`, 220 MB; not a dependency).
5. Fallback: MLX's bundled BLAS, announced with `warnings.warn` (never silent).

`scipy-openblas32` is not a candidate: its symbols are prefixed (`scipy_cblas_sgemm`), so it
cannot stand in for `cblas_sgemm`. On macOS MLX uses Apple Accelerate and nothing is loaded.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import warnings
from dataclasses import dataclass
from importlib import metadata

ENV_VAR = "RLXVIZ_BLAS"

_DEBIAN_PATHS = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
)


@dataclass(frozen=True)
class BlasRecord:
    """Which BLAS MLX's CPU matmul uses in this process.

    Attributes:
        name: short label, e.g. `cmeel-openblas`, `debian-openblas`, `mkl`, `env`, `accelerate`,
            `mlx-bundled` (the slow fallback).
        path: the loaded shared library, or `None` when nothing was loaded.
        optimized: False only for the fallback (MLX's reference BLAS).
        note: why this choice was made (e.g. which candidates failed).
    """

    name: str
    path: str | None
    optimized: bool
    note: str = ""

    def __str__(self) -> str:
        where = f" ({self.path})" if self.path else ""
        n = blas_threads()
        threads = f", {n} thread{'s' if n != 1 else ''}" if n else ""
        return f"{self.name}{where}{threads}" + ("" if self.optimized else " [SLOW reference BLAS]")


# A CBLAS can load and still die on the first call: cmeel-openblas 0.3.31 executes AVX-512 stores in
# `sgemm_beta` on CPUs without AVX-512 (SIGILL, seen on an AMD EPYC with AVX2 only). So each candidate
# first runs one threaded `cblas_sgemm` in a child process; a crash there rules it out, not us. The verdict is
# cached per library file, Python and CPU (`probe_cached`), so only the first process on a machine pays for it.
_PROBE = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
n = 256
a = (ctypes.c_float * (n * n))(*([1.0] * (n * n)))
c = (ctypes.c_float * (n * n))()
f, i = ctypes.c_float, ctypes.c_int
lib.cblas_sgemm(i(101), i(111), i(111), i(n), i(n), i(n), f(1.0), a, i(n), a, i(n), f(0.0), c, i(n))
sys.exit(0 if c[0] == float(n) else 3)
"""
PROBE_TIMEOUT_S = 20.0


def probe(path: str) -> str | None:
    """Run one 256x256 `cblas_sgemm` from `path` in a child process.

    Returns:
        None when it ran and gave the right number; else why not (e.g. `killed by signal 4
        (SIGILL)`, `wrong result`, `timed out after 20 s`).
    """
    try:
        run = subprocess.run([sys.executable, "-c", _PROBE, path], capture_output=True,
                             timeout=PROBE_TIMEOUT_S, env={**os.environ, "OPENBLAS_NUM_THREADS": "2"})
    except subprocess.TimeoutExpired:
        return f"timed out after {PROBE_TIMEOUT_S:g} s"
    if run.returncode == 0:
        return None
    if run.returncode < 0:
        return f"killed by signal {-run.returncode} ({signal.Signals(-run.returncode).name}) in a test sgemm"
    if run.returncode == 3:
        return "wrong result in a test sgemm"
    return f"test sgemm failed: {run.stderr.decode(errors='replace').strip().splitlines()[-1:]}"


CACHE_ENV_VAR = "RLXVIZ_CACHE_DIR"


def _probe_cache_file() -> str:
    """`$RLXVIZ_CACHE_DIR/blas-probe.json`, else `$XDG_CACHE_HOME/rlxviz/...`, else `~/.cache/rlxviz/...`."""
    root = os.environ.get(CACHE_ENV_VAR) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "rlxviz")
    return os.path.join(root, "blas-probe.json")


def _cpu_fingerprint() -> str:
    """The machine and its instruction-set flags (`/proc/cpuinfo`): a verdict holds only for the CPU it ran on."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return hashlib.sha256(f"{platform.machine()}|{flags}".encode()).hexdigest()[:16]


def _probe_key(path: str) -> str | None:
    """What a probe verdict depends on: the library file (real path, size, mtime), the Python, the CPU."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    return f"{real}|{st.st_size}|{st.st_mtime_ns}|{sys.executable}|{_cpu_fingerprint()}"


def probe_cached(path: str) -> str | None:
    """`probe(path)`, remembered across processes (~0.1 s of child-process start saved per candidate per process).

    The verdict is stored in `blas-probe.json` (see `_probe_cache_file`) under a key of the library's real
    path, size and mtime, the Python executable and the CPU's flags, so a changed library or a different CPU
    probes again. An unreadable or unwritable cache is ignored: the probe then simply runs.

    Returns:
        As `probe`: None when the library works, else why not.
    """
    key = _probe_key(path)
    file = _probe_cache_file()
    try:
        with open(file, encoding="utf-8") as f:
            cache = json.load(f)
        if not isinstance(cache, dict):
            cache = {}
    except (OSError, ValueError):
        cache = {}
    if key is not None and key in cache and (cache[key] is None or isinstance(cache[key], str)):
        return cache[key]
    why = probe(path)
    if key is not None and not (why or "").startswith("timed out"):  # a timeout may be load, not the library
        cache[key] = why
        try:
            os.makedirs(os.path.dirname(file), exist_ok=True)
            tmp = f"{file}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(cache, f)
            os.replace(tmp, file)
        except OSError:
            pass
    return why


_ACTIVE: BlasRecord | None = None
_HANDLE: ctypes.CDLL | None = None


def cpu_cores() -> int:
    """Cores this process may run on (the affinity mask where the OS has one, e.g. a container's CPU set)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def blas_threads() -> int | None:
    """Threads the loaded OpenBLAS uses (`openblas_get_num_threads`), None for other libraries."""
    fn = getattr(_HANDLE, "openblas_get_num_threads", None) if _HANDLE is not None else None
    return int(fn()) if fn is not None else None


def set_blas_threads(n: int) -> bool:
    """Set the loaded OpenBLAS's thread count (kept in step with the CPU streams); False if it is not OpenBLAS."""
    fn = getattr(_HANDLE, "openblas_set_num_threads", None) if _HANDLE is not None else None
    if fn is None:
        return False
    fn(ctypes.c_int(max(1, int(n))))
    return True


def _cmeel_openblas() -> list[str]:
    try:
        files = metadata.files("cmeel-openblas") or []
    except metadata.PackageNotFoundError:
        return []
    found = [str(f.locate()) for f in files if f.name == "libopenblas.so.0"]
    return [p for p in found if os.path.exists(p)]


def _mkl() -> list[str]:
    """`libmkl_rt.so*` where PyPI's `mkl` wheel puts it (`<prefix>/lib`)."""
    return sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))


def candidates() -> list[tuple[str, str]]:
    """`(name, path)` pairs in the order `load_blas` tries them (existing files only, plus `$RLXVIZ_BLAS`)."""
    out: list[tuple[str, str]] = []
    env = os.environ.get(ENV_VAR, "").strip()
    if env and env.lower() != "none":
        out.append(("env", env))
    out += [("cmeel-openblas", p) for p in _cmeel_openblas()]
    out += [("debian-openblas", p) for p in _DEBIAN_PATHS if os.path.exists(p)]
    out += [("mkl", p) for p in _mkl()]
    return out


def load_blas() -> BlasRecord:
    """Load the first working CBLAS into the global symbol scope; idempotent.

    Must run before `import mlx.core` (`rlxviz.kernels.mlx_backend` does this). If `mlx.core` is
    already imported, nothing is loaded and the record says so, with a warning.

    Returns:
        The `BlasRecord` of the active library.

    Warns:
        UserWarning: when falling back to MLX's bundled (slow) BLAS, naming what was tried.
    """
    global _ACTIVE, _HANDLE
    if _ACTIVE is not None:
        return _ACTIVE
    if sys.platform == "darwin":
        _ACTIVE = BlasRecord("accelerate", None, True, "macOS: MLX uses Apple Accelerate")
        return _ACTIVE
    if "mlx.core" in sys.modules:
        _ACTIVE = BlasRecord("mlx-bundled", None, False, "mlx.core was imported before load_blas()")
        warnings.warn("rlxviz: mlx.core was imported before rlxviz.kernels.blas.load_blas(); MLX keeps its "
                      "bundled reference BLAS (float32 GEMM ~30x slower). Import rlxviz.kernels.mlx_backend "
                      "first.", stacklevel=2)
        return _ACTIVE
    if os.environ.get(ENV_VAR, "").strip().lower() == "none":
        _ACTIVE = BlasRecord("mlx-bundled", None, False, f"{ENV_VAR}=none")
        warnings.warn(f"rlxviz: {ENV_VAR}=none: MLX uses its bundled reference BLAS (slow).", stacklevel=2)
        return _ACTIVE
    # OpenBLAS worker threads spin for a while after each GEMM; on a small machine they steal the
    # cores that MLX's concurrent CPU streams need for softmax/GELU. A short spin (2^4 cycles)
    # measured: all-MiniLM-L6-v2 at batch 8 250 -> 222 ms, GEMM time unchanged. OpenBLAS reads
    # this when the library loads; a value set by the user wins.
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    # One OpenBLAS thread per core this process may use, the same count as the CPU streams
    # (`lowering.DEVICE_LOWERING`); OpenBLAS itself counts the machine's cores, not the affinity mask.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(cpu_cores()))
    failures: list[str] = []
    for name, path in candidates():
        why = probe_cached(path)
        if why is not None:
            failures.append(f"{name}: {path}: {why}")
            continue
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            lib.cblas_sgemm  # noqa: B018 - must export the plain CBLAS symbol
        except (OSError, AttributeError) as e:
            failures.append(f"{name}: {path}: {e}")
            continue
        _HANDLE = lib
        _ACTIVE = BlasRecord(name, os.path.realpath(path), True, "; ".join(failures))
        return _ACTIVE
    tried = "; ".join(failures) or "no candidate found"
    _ACTIVE = BlasRecord("mlx-bundled", None, False, tried)
    warnings.warn("rlxviz: no optimized CBLAS found, MLX float32 GEMM will use its bundled reference BLAS "
                  f"(~30x slower). Tried: {tried}. Install the project (cmeel-openblas + Debian libgfortran5) "
                  f"or Debian libopenblas0-pthread, or set {ENV_VAR}=/path/to/libcblas.so.", stacklevel=2)
    return _ACTIVE


def active_blas() -> BlasRecord | None:
    """The record of the BLAS chosen by `load_blas`, or None if it has not run yet."""
    return _ACTIVE
