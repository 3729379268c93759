"""Build rlxviz's CPU kernels (`src/`) against the installed MLX on first use, into a cache.

The C++ sources are compiled with CMake, MLX's own `share/cmake/MLX` config and nanobind, for the
machine that builds them (`-march=native`), once per cache key: the sources, MLX's version, nanobind's
version, the Python extension suffix, the compiler and the CPU's feature flags. The cache lives in
`$RLXVIZ_KERNELS_CACHE` or `~/.cache/rlxviz/kernels/<key>/`; a file lock makes a second process wait
for the first one's build instead of building again. A failed build leaves `failed.txt` there (with
the reason and the log's path) so later processes fall back at once; a change of sources or MLX is a
new key, hence a new attempt.

Nothing here raises for a missing tool or a failed build: `build_kernels` returns a `KernelStatus`
that says why there are no kernels, and rlxviz then runs the composed MLX lowering.
"""

from __future__ import annotations

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
    """

    state: str
    reason: str = ""
    path: str | None = None
    isa: str | None = None
    threads: int | None = None
    build_s: float | None = None

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
    env = os.environ.get("RLXVIZ_KERNELS_CACHE")
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

    from ..runtime.mlx_backend import mx

    h = hashlib.sha256()
    for f in sorted(SRC.iterdir()):
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    for part in (mx.__version__, nanobind.__version__, sysconfig.get_config_var("EXT_SUFFIX") or "",
                 _version([tools.cxx, "--version"]), platform.machine(), _cpu_flags()):
        h.update(str(part).encode() + b"\0")
    return f"mlx{mx.__version__}-{h.hexdigest()[:16]}"


def _import(path: Path) -> ModuleType:
    from ..runtime import mlx_backend  # noqa: F401  (BLAS first; mlx.core registers the array type)

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


def build_kernels(root: Path | None = None, path: str | None = None, quiet: bool = False
                  ) -> tuple[KernelStatus, ModuleType | None]:
    """Load the kernels from the cache, building them first when the cache has none.

    Args:
        root: the cache folder (default `cache_root()`).
        path: the search path for cmake / the compiler / ninja (default `$PATH`).
        quiet: do not print the one line that announces a build on stderr.

    Returns:
        (status, module): the module is None exactly when `status.available` is False.
    """
    if os.environ.get("RLXVIZ_KERNELS", "1").strip().lower() in ("0", "off", "false", "no"):
        return KernelStatus("off", "RLXVIZ_KERNELS=0"), None
    tools = find_toolchain(path)
    if isinstance(tools, str):
        return KernelStatus("unavailable", tools), None
    root = root or cache_root()
    try:
        key = cache_key(tools)
        out = root / key
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return KernelStatus("unavailable", f"cache folder {root}: {err.strerror or err}"), None
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target, record, failed = out / (MODULE + suffix), out / "build.json", out / "failed.txt"
    state = "cached"
    with (out / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here for the first one's build
        if failed.exists():
            return KernelStatus("unavailable", failed.read_text().strip()), None
        if not target.exists():
            if not quiet:
                print(f"rlxviz: building the CPU kernels once into {out} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            err = _compile(tools, out, out / "build.log")
            if err is not None:
                why = f"build failed: {err}; remove {out} to retry"
                failed.write_text(why + "\n")
                return KernelStatus("unavailable", why), None
            record.write_text(json.dumps({"build_s": round(time.perf_counter() - t0, 1), "cxx": tools.cxx}))
            state = "built"
    try:
        module = _import(target)
    except (ImportError, OSError) as err:
        return KernelStatus("unavailable", f"import failed: {str(err).splitlines()[0]}"), None
    build_s = json.loads(record.read_text()).get("build_s") if record.exists() else None
    return KernelStatus(state, path=str(target), isa=module.isa(), threads=module.threads(), build_s=build_s), module


__all__ = ["KernelStatus", "Toolchain", "build_kernels", "cache_key", "cache_root", "find_toolchain"]
