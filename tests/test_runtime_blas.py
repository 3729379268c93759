"""BLAS selection: the record is present, the fallback warns, a bad explicit path is skipped."""

import os
import subprocess
import sys

from rlxviz.kernels.blas import active_blas, candidates

PROBE = ("import warnings; warnings.simplefilter('always');"
         "from rlxviz.kernels.mlx_backend import BLAS, mx; print(BLAS.name, BLAS.optimized, '|', BLAS.note)")


def _probe(env_value):
    env = dict(os.environ, RLXVIZ_BLAS=env_value)
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)


def test_record_present_in_this_process():
    from rlxviz.kernels import mlx_backend

    rec = active_blas()
    assert rec is mlx_backend.BLAS and rec.name and str(rec)
    assert candidates(), "no CBLAS candidate on this machine (cmeel-openblas or Debian libopenblas0-pthread)"


def test_fallback_is_announced():
    r = _probe("none")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("mlx-bundled False")
    assert "UserWarning" in r.stderr and "bundled reference BLAS" in r.stderr


def test_bad_explicit_path_is_skipped_and_noted():
    r = _probe("/nonexistent/libcblas.so")
    assert r.returncode == 0, r.stderr
    name, optimized = r.stdout.split()[:2]
    assert optimized == "True" and name != "env"
    assert "/nonexistent/libcblas.so" in r.stdout


def test_probe_verdict_is_cached_per_library_and_cpu(tmp_path, monkeypatch):
    """A verdict is reused by later processes; a changed library file or an unreadable cache probes again."""
    from rlxviz.kernels import blas

    lib = tmp_path / "libfake.so"
    lib.write_bytes(b"x")
    monkeypatch.setenv(blas.CACHE_ENV_VAR, str(tmp_path / "cache"))
    calls = []
    monkeypatch.setattr(blas, "probe", lambda p: calls.append(p) or "killed by signal 4 (SIGILL) in a test sgemm")
    assert blas.probe_cached(str(lib)).startswith("killed by signal 4")
    assert blas.probe_cached(str(lib)).startswith("killed by signal 4")
    assert len(calls) == 1
    lib.write_bytes(b"xy")  # a new build of the library: its verdict is not the old one's
    blas.probe_cached(str(lib))
    assert len(calls) == 2
    (tmp_path / "cache" / "blas-probe.json").write_text("{not json")
    blas.probe_cached(str(lib))
    assert len(calls) == 3
    monkeypatch.setattr(blas, "probe", lambda p: calls.append(p) or "timed out after 20 s")
    lib.write_bytes(b"xyz")
    blas.probe_cached(str(lib))
    blas.probe_cached(str(lib))  # a timeout may be the machine's load: never remembered
    assert len(calls) == 5


def test_probe_cache_survives_an_unwritable_folder(tmp_path, monkeypatch):
    from rlxviz.kernels import blas

    lib = tmp_path / "libfake.so"
    lib.write_bytes(b"x")
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(blas.CACHE_ENV_VAR, str(blocker / "sub"))  # a folder under a file: cannot be made
    monkeypatch.setattr(blas, "probe", lambda p: None)
    assert blas.probe_cached(str(lib)) is None
