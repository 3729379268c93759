"""The activation what-if names the user's nodes and rests its "changes the numbers" on a difference the model can
hold (a newcomer run of `explain -v tests/fixtures/onnx/gpt2.onnx`).

The guard said "feeds gelu_tanh (node 129)" and the fix "the model's gelu_tanh (node 61) replaced by gelu", but node
61 of the user's graph is a `mul`: gelu_tanh 129 is what `canonicalize_gelu` made of eight written-out nodes, 61
their result. The fix now names them (`whatif._users_activation`). Its evidence was "max err 1.07e-09" in float64 on
the model's own small weights, below float32's rounding: the check now reports the first difference the model's
output dtype can hold (`advice._rounding`; unit-scale weights show tanh-GELU vs GELU), and words one that stays
below it as what was measured.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from clirun import run as cli_run
from test_near_miss_rule import trace_of

from rlxviz.ir import parse_ir
from rlxviz.session.advice import _rounding

GPT2 = Path(__file__).parent / "fixtures" / "onnx" / "gpt2.onnx"
LINE = re.compile(r"fix: none in the model: applying it \(the model's gelu_tanh \(node (\d+) in the pipeline's "
                  r"graph\), written out as your nodes ([\d, ]+) \(its result: (\w+) node (\d+)\) replaced by gelu\) "
                  r"changes the model's numbers: .*\(max err ([\d.e+-]+)\)")


def test_the_gelu_fix_names_the_users_nodes_and_a_difference_float32_holds(capsys):
    code, text, err = cli_run(capsys, "explain", "-v", GPT2)
    assert "Traceback" not in err, err
    # the layer is held back by a gap in rlxviz's ops (no near-miss): the switch to gelu is still checked, and
    # `fix_checks` keeps its evidence (the text names the gap)
    assert text.count("rlxviz's ops lack: FusedMatMulBiasAct with a gelu_tanh epilogue") == 2, text
    code, out, err = cli_run(capsys, "explain", "-v", "--json", GPT2)
    checks = [c for c in json.loads(out)["fix_checks"] if c["guard"] == "epilogue_activation"]
    assert [c["status"] for c in checks] == ["changes the numbers"] * 2, checks
    found = [m for c in checks if (m := LINE.search("fix: " + c["fix"]))]
    assert len(found) == 2, checks  # one per layer
    trace = trace_of(GPT2)
    made = {n.id: n for s in trace.steps for n in s.after}
    eps = float(np.finfo(np.float32).eps)
    for m in found:
        here, ids, op, out, worst = int(m[1]), [int(i) for i in m[2].split(", ")], m[3], int(m[4]), float(m[5])
        assert made[here].op.value == "gelu_tanh" and here not in trace.input, here
        assert set(made[here].absorbed) == set(ids) and out in ids, (ids, made[here].absorbed)
        assert trace.input[out].op.value == op == "mul", op  # the user's node by its own op
        assert f"feeds gelu_tanh (node {here})" in text
        assert worst > 100 * eps, worst  # far beyond float32's rounding, not 1e-9


def test_rounding_is_the_finest_float_outputs_epsilon():
    g = parse_ir("""graph t {
  %0 = input {name="x"} : f32[2]
  %1 = cast(%0) {dtype="f16"} : f16[2]
  %2 = neg(%0) : f32[2]
  return %1, %2
}""")
    tol, name = _rounding(g)
    assert name == "f32" and tol.rtol == tol.atol == float(np.finfo(np.float32).eps)


def test_a_difference_below_the_output_dtypes_rounding_is_worded_as_measured():
    """`_Checker._compare`: a what-if 1e-8 off in float64 (beyond `EXACT`, within float32's rounding) differs, but
    only faintly: the dtype is returned, and `_check_fix` words it `by less than f32 rounding on these inputs`."""
    from rlxviz.passes import Pipeline
    from rlxviz.session.advice import _Checker

    src = """graph t {{
  %0 = input {{name="x"}} : f32[2, 4]
  %1 = param {{name="w"}} : f32[4]
  %2 = mul(%0, %1) : f32[2, 4]
{extra}  return {out}
}}"""
    g = parse_ir(src.format(extra="", out="%2"))
    off = parse_ir(src.format(extra='  %3 = const {value=1e-08} : f32[]\n  %4 = add(%2, %3) : f32[2, 4]\n',
                              out="%4"))
    trace = Pipeline.canonical().run(g)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)}
    checker = _Checker(trace, feeds, {"w": np.ones(4, np.float32)}, 1e12)
    why, skipped, faint = checker._compare(off, trace.final)
    assert skipped is None and why is not None and "in float64" in why and faint == "f32", (why, faint)
    why, _, faint = checker._compare(parse_ir(src.format(
        extra='  %3 = const {value=0.01} : f32[]\n  %4 = add(%2, %3) : f32[2, 4]\n', out="%4")), trace.final)
    assert why is not None and faint == "", (why, faint)  # a difference float32 holds: said as a change
