"""No raw Python warning reaches the terminal: numeric warnings are handled where they arise (the reference's and
the MLX executor's casts and arithmetic), and the CLI turns any other warning into at most one line."""

import warnings

import numpy as np
import pytest

from rlxviz import cli
from rlxviz.ir import DType, Node, Op, parse_ir
from rlxviz.runtime import run_reference

NUMERIC_IR = """graph t {
  %0 = input {name="x"} : f32[2, 3]
  %1 = exp(%0) : f32[2, 3]
  %2 = const {value=0.0} : f32[]
  %3 = div(%0, %2) : f32[2, 3]
  %4 = log(%0) : f32[2, 3]
  %5 = cast(%1) {dtype="f16"} : f16[2, 3]
  return %1, %3, %4, %5
}
"""


def test_reference_raises_no_numeric_warning():
    """exp overflow, x/0, log of a negative, a cast that overflows f16: inf/NaN results, no RuntimeWarning."""
    g = parse_ir(NUMERIC_IR)
    x = np.array([[1000.0, -1.0, 0.0], [1.0, 2.0, 3.0]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outs = run_reference(g, {"x": x})
    assert np.isinf(outs[0]).any() and np.isnan(outs[2]).any() and np.isinf(outs[3]).any()


def test_reference_mean_of_empty_slice_is_quiet():
    from rlxviz.runtime.reference import quiet_numerics

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with quiet_numerics():
            assert np.isnan(np.zeros((2, 0), np.float32).mean(-1)).all()


def test_executor_const_cast_overflow_is_quiet():
    pytest.importorskip("rlxviz.kernels.mlx_backend")
    from rlxviz.runtime.executor import _const

    node = Node(0, Op.CONST, (), (), DType.f32, {"value": 1e39})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isinf(np.array(_const(node)))


def test_cli_prints_any_python_warning_as_one_line(capsys, monkeypatch):
    def noisy(args):
        warnings.warn("first problem\n  with a second line", RuntimeWarning, stacklevel=1)
        warnings.warn("another\x1b[2J", UserWarning, stacklevel=1)
        print("fine")
        return 0

    monkeypatch.setattr(cli.explain, "cmd_passes", noisy)
    assert cli.main(["passes"]) == 0
    out, err = capsys.readouterr()
    assert out == "fine\n"
    assert err == "rlxviz passes: warning: first problem (and 1 more warning(s))\n", err


def _cli_process(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, str]:
    """(exit code, stderr) of `python -W default -m rlxviz.cli ARGS` in a new process: pytest records warnings
    in its own process, so only a real one shows what would reach a terminal (`-W default`: every warning once
    per place, DeprecationWarning included)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    full = dict(os.environ, PYTHONPATH=str(root), RLXVIZ_MAX_MEMORY_MB="64")
    for k, v in (env or {}).items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    p = subprocess.run([sys.executable, "-W", "default", "-m", "rlxviz.cli", *args], capture_output=True, text=True,
                       env=full, cwd=root, timeout=120)
    return p.returncode, p.stderr


@pytest.mark.parametrize("case", ["regex-onnx", "outer-run", "truncated-npz", "budget-ir", "deprecated-env"])
def test_no_raw_warning_reaches_the_terminal_on_hostile_files(case, tmp_path):
    from pathlib import Path

    rel = Path(__file__).parent / "data" / "reliability"
    env: dict[str, str | None] | None = None
    if case == "regex-onnx":
        args = ["explain", str(rel / "onnx_regex_redos_11s.onnx")]
    elif case == "outer-run":
        d = rel / "onnx_outer_no_budget"
        args = ["run", str(d / "outer.onnx"), "--inputs", str(d / "outer_12000.npz"), "-o", str(tmp_path / "o.npz")]
    elif case == "truncated-npz":
        np.savez(tmp_path / "ok.npz", input_ids=np.zeros((1, 4), np.int64), attention_mask=np.ones((1, 4), np.int64))
        data = (tmp_path / "ok.npz").read_bytes()
        (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
        args = ["run", "bert-tiny", "--inputs", str(tmp_path / "cut.npz"), "-o", str(tmp_path / "o.npz")]
    elif case == "budget-ir":
        args = ["time", str(rel / "budget_param_381mb.ir"), "--max-memory-mb", "512"]
    else:  # the deprecated variable warns: one line, then the command's own error line
        env = {"RLXVIZ_MAX_TENSOR_MB": "64", "RLXVIZ_MAX_MEMORY_MB": None}
        args = ["explain", str(rel / "ir_outer_3gb.ir")]
    code, err = _cli_process(*args, env=env)
    lines = err.strip().splitlines()
    assert code == 2 and lines, err
    assert all(line.startswith(f"rlxviz {args[0]}: ") for line in lines), err  # every line is the CLI's own
    assert "Traceback" not in err and ".py:" not in err and "Warning:" not in err, err
    assert len(lines) == (2 if case == "deprecated-env" else 1), err
