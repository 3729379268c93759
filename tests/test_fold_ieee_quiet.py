"""A constant fold whose IEEE result is the node's value prints no warning (newcomer run 19).

T5's relative-position buckets take `log` of a position difference that is 0 on the diagonal: `log(0) = -inf`,
clipped a few nodes later, as ONNX Runtime computes it. `explain` on t5.encdec printed `rlxviz explain: warning: divide
by zero encountered in log (and 1 more warning(s))` on a good file; folds now evaluate under `np.errstate` ignoring
divide/invalid/overflow (`models.onnx.fold.fold`), while a value NumPy cannot make still raises.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from clirun import run
from onnx import helper

from rlxviz.models.onnx.fold import fold

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"


def test_explain_on_t5_prints_no_warning(capsys):
    code, out, err = run(capsys, "explain", ZOO / "t5.encdec.onnx")
    assert code == 0, err
    assert "warning" not in err and err.strip() == "", err


def test_a_fold_keeps_ieee_values_quietly():
    node = helper.make_node("Log", ["x"], ["y"])
    with np.errstate(all="raise"):  # would raise FloatingPointError without the fold's own errstate
        (y,) = fold(node, [np.array([0.0, 1.0, -1.0], dtype=np.float32)], onnx.defs.onnx_opset_version())
    assert y[0] == -np.inf and y[1] == 0.0 and np.isnan(y[2])
