"""BLAS selection: the record is present, the fallback warns, a bad explicit path is skipped."""

import os
import subprocess
import sys

from rlxviz.runtime.blas import active_blas, candidates

PROBE = ("import warnings; warnings.simplefilter('always');"
         "from rlxviz.runtime.mlx_backend import BLAS, mx; print(BLAS.name, BLAS.optimized, '|', BLAS.note)")


def _probe(env_value):
    env = dict(os.environ, RLXVIZ_BLAS=env_value)
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)


def test_record_present_in_this_process():
    from rlxviz.runtime import mlx_backend

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
