"""`benchmarks/bench_processes.py` times each configuration in its own process and checks each one's numbers.
Timings are not asserted (they belong to the benchmark); this checks that every configuration asked for gets
a row, and that each row comes from a separate process whose output was compared with the NumPy reference."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_processes.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False,
                          timeout=300)


def test_each_configuration_gets_a_row_from_its_own_process():
    res = run("--batches", "1", "--seq", "8", "--rounds", "2", "--calls", "2", "--warmup", "0",
              "--configs", "ort", "default")
    assert res.returncode == 0, res.stderr
    rows = [ln for ln in res.stdout.splitlines() if ln.startswith("| ort") or ln.startswith("| default")]
    assert [r.split(" ")[1] for r in rows] == ["ort", "default"]
    ort, default = (r.split(" | ") for r in rows)
    assert ort[5] == "1.00"  # the ratio column is against ORT's own median
    assert float(default[5]) > 0 and float(default[-1].rstrip(" |")) < 1e-3  # max abs err vs the reference


def test_a_child_reports_wall_and_cpu_time_and_its_error_against_the_reference():
    res = run("--child", "final-openblas", "1", "--seq", "8", "--calls", "3", "--warmup", "0")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(got["ms"]) == len(got["cpu_ms"]) == 3 and min(got["ms"]) > 0
    assert 0 <= got["err"] < 1e-3
