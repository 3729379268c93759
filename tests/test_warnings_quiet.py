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
    pytest.importorskip("rlxviz.runtime.mlx_backend")
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

    monkeypatch.setattr(cli, "cmd_passes", noisy)
    assert cli.main(["passes"]) == 0
    out, err = capsys.readouterr()
    assert out == "fine\n"
    assert err == "rlxviz passes: warning: first problem (and 1 more warning(s))\n", err
