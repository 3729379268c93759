"""Hostile and careless inputs (issue 15): each handed file in `tests/data/reliability/` gives its right
outcome, and each kind of fault is checked on other inputs of the same kind too.

Kinds: deep nesting, huge numbers and bad escapes (one-line error with line and column); lint and lowering
agreeing on attribute defaults; const payloads whose dtype changes their value; a pass that crashes
mid-pipeline (`explain` exits 3, never 0); exit codes 2/3 with one line on stderr.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from clirun import inject_crash, one_line, run

from rlxviz import cli
from rlxviz.ir import GraphError, IRSyntaxError, Op, from_json, lint, parse_ir, to_json
from rlxviz.ir.parser import MAX_NESTING
from rlxviz.ir.safejson import JSONTextError, loads
from rlxviz.passes import CANONICAL_ORDER, Pipeline, run_passes
from rlxviz.passes.pattern import const_value
from rlxviz.runtime import run_reference

DATA = Path(__file__).parent / "data" / "reliability"


def ir(*lines: str, name: str = "t") -> str:
    return "graph " + name + " {\n" + "".join(f"  {ln}\n" for ln in lines) + "}\n"


# ------------------------------------------------------------------------------- nesting, numbers, escapes

def test_handed_deep_nesting_is_one_line_with_line_and_column(capsys):
    code, out, err = run(capsys, "explain", DATA / "ir_nesting_min.ir")
    assert code == 2 and out == ""
    assert "ir_nesting_min.ir:3:36: IR syntax error: attribute value nested deeper than 16 levels" in one_line(
        err, "explain")


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 5000, 200_000])
def test_any_nesting_depth_is_refused_at_its_column(depth):
    deep = f"%1 = relu(%0) {{k={'[' * depth}1{']' * depth}}} : f32[2]"
    text = ir('%0 = input {name="x"} : f32[2]', deep, "return %1")
    with pytest.raises(IRSyntaxError) as e:
        parse_ir(text)
    assert (e.value.line, e.value.col) == (3, 20 + MAX_NESTING)  # the first "[" too many
    ok = ir('%0 = input {name="x"} : f32[2]', f"%1 = relu(%0) {{k={'[' * MAX_NESTING}1{']' * MAX_NESTING}}} : f32[2]",
            "return %1")
    assert parse_ir(ok, verify=False)[1].attrs["k"]  # the deepest allowed nesting parses (and prints back)


def test_handed_huge_int_dim_is_one_line_with_line_and_column(capsys):
    code, _, err = run(capsys, "ir", DATA / "ir_huge_int_dim.ir")
    assert code == 2
    assert "ir_huge_int_dim.ir:2:34: IR syntax error: number with 5000 characters" in one_line(err, "ir")


@pytest.mark.parametrize("line, col, reason", [
    ('%0 = input {name="x"} : f32[2, 99999999999999999999999]', 34, "dimension 99999999999999999999999 is larger"),
    ('%0 = input {name="x", k=' + "7" * 4400 + '} : f32[2]', 27, "number with 4400 characters"),
    ("%" + "1" * 5000 + ' = input {name="x"} : f32[2]', 3, "number with 5001 characters"),
    ('%0 = input {name="x\\q"} : f32[2]', 22, "bad string: Invalid \\escape"),  # at the backslash
    ('%0 = input {name="x\\ud8"} : f32[2]', 23, "bad string"),
    ('%0 = input {name="x"} : f32[2] @"a\\x41"', 37, "bad string"),
])
def test_numbers_and_escapes_of_any_size_give_line_and_column(line, col, reason):
    with pytest.raises(IRSyntaxError) as e:
        parse_ir(ir(line, "return %0"))
    assert (e.value.line, e.value.col) == (2, col) and reason in e.value.reason


def test_bad_escape_in_graph_name_and_huge_next_id():
    with pytest.raises(IRSyntaxError, match="bad string") as e:
        parse_ir('graph "a\\zb" {\n}\n')
    assert (e.value.line, e.value.col) == (1, 9)
    with pytest.raises(IRSyntaxError, match="number with 90 characters"):
        parse_ir("graph g next_id=" + "9" * 90 + " {\n}\n")


@pytest.mark.parametrize("text, where, reason", [
    ("[" * 100 + "]" * 100, (1, 65), "nesting deeper than 64"),
    ('{"a": ' * 3000 + "1" + "}" * 3000, (1, 385), "nesting deeper"),
    ('{"n":\n  ' + "9" * 5000 + "}", (2, 3), "number with 5000 characters"),
    ('{"eps": NaN}', (1, 9), "non-finite"),
    ('{"eps": -Infinity}', (1, 9), "non-finite"),
    ('{"a": "\\q"}', (1, 8), "Invalid \\escape"),
])
def test_json_text_is_bounded_with_line_and_column(text, where, reason):
    with pytest.raises(JSONTextError) as e:
        loads(text)
    assert (e.value.line, e.value.col) == where and reason in e.value.reason


@pytest.mark.parametrize("body", [
    '{"nodes": [{"id": 0, "op": "input", "inputs": [], "shape": [2, 1e400], "dtype": "f32"}]}',
    '{"nodes": [{"id": -1, "op": "input", "inputs": [], "shape": [2], "dtype": "f32"}]}',
    '{"nodes": [{"id": 0, "op": "input", "inputs": [], "shape": [true], "dtype": "f32"}]}',
    '{"nodes": [{"id": 0, "op": "relu", "inputs": [], "shape": [2], "dtype": "f32", "attrs": {"k": ' + "[" * 40
    + "]" * 40 + "}}]}",
    '{"nodes": [{"id": 0, "op": "relu", "inputs": [], "shape": [2], "dtype": "f32", "attrs": {"k": {"a": 1}}}]}',
    '{"nodes": [7]}', '[1, 2]', '{"nodes": [], "outputs": "x"}', '{"nodes": [], "name": 3}',
])
def test_graph_json_of_the_wrong_shape_is_a_graph_error(body):
    with pytest.raises((GraphError, JSONTextError)):
        from_json(body)


def test_graph_json_round_trip_still_exact():
    g = parse_ir((DATA / "ir_scalar_bias_layer1.ir").read_text())
    assert to_json(from_json(to_json(g))) == to_json(g)


def test_deep_config_json_is_one_line(tmp_path, capsys):
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    code, _, err = run(capsys, "explain", folder)
    assert code == 2 and "invalid JSON at line 1 column 92: nesting deeper than 64 levels" in one_line(err, "explain")
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 2}).replace("2", "NaN"))
    code, _, err = run(capsys, "explain", folder)
    assert code == 2 and "non-finite" in one_line(err, "explain")


# -------------------------------------------------------------------------------- lint agrees with lowering

def test_handed_reduce_without_keepdims_lowers_as_lint_accepts(capsys):
    code, out, err = run(capsys, "time", DATA / "ir_reduce_no_keepdims.ir", "--repeat", 1)
    assert code == 0, err
    assert "yes" in out and "NO" not in out


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max"])
@pytest.mark.parametrize("axes, out", [("[1]", "[2]"), ("[0, 1]", "[]"), ("[-1]", "[2]")])
def test_every_reduce_default_lowers_equal_to_the_reference(op, axes, out):
    from rlxviz.runtime import run_mlx

    g = parse_ir(ir('%0 = input {name="x"} : f32[2, 4]', f"%1 = {op}(%0) {{axes={axes}}} : f32{out}", "return %1"))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(run_mlx(g, {"x": x}, {})[0], run_reference(g, {"x": x}, {})[0], rtol=1e-6)


@pytest.mark.parametrize("line", [
    "%1 = softmax(%0) : f32[2, 4]",                       # axis defaults to -1
    "%1 = layer_norm(%0, %2, %3) {eps=1e-5} : f32[2, 4]",  # axis defaults to -1
    "%1 = rms_norm(%0, %2, %3) {eps=1e-5} : f32[2, 4]",
])
def test_other_optional_attributes_lower_as_lint_accepts(line):
    from rlxviz.runtime import run_mlx

    text = ir('%0 = input {name="x"} : f32[2, 4]', '%2 = param {name="g"} : f32[4]', '%3 = param {name="b"} : f32[4]',
              line, "return %1")
    g = parse_ir(text.replace("%1 = ", "%9 = ").replace("return %1", "return %9"))
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    w = {"g": np.ones(4, np.float32), "b": np.zeros(4, np.float32)}
    np.testing.assert_allclose(run_mlx(g, {"x": x}, w)[0], run_reference(g, {"x": x}, w)[0], rtol=1e-5, atol=1e-6)


def test_every_lowering_sees_every_optional_attribute(monkeypatch):
    """The kind, not the case: for every op with optional attributes, the MLX lowering is handed their
    defaults when the IR leaves them out (as the reference interpreter is)."""
    from rlxviz.ir.ops import SPECS
    from rlxviz.runtime.lowering import LOWERINGS, OVERRIDES, MlxEmitter

    class Seen(Exception):
        pass

    checked = 0
    for op, spec in SPECS.items():
        optional = {k for k, a in spec.attrs.items() if not a.required}
        if not optional or op not in LOWERINGS:
            continue
        got: dict = {}

        def spy(e, attrs, *xs, _got=got):
            _got.update(attrs)
            raise Seen

        monkeypatch.setitem(LOWERINGS, op, spy)
        monkeypatch.delitem(OVERRIDES, op, raising=False)
        required = {k: 0 for k, a in spec.attrs.items() if a.required}
        with pytest.raises(Seen):
            MlxEmitter().emit(op, [], **required)
        assert optional <= set(got), (op, optional - set(got))
        checked += 1
    assert checked >= 8


# ------------------------------------------------------------------------------ const payloads and dtypes

def test_handed_bool_scale_const_is_refused_in_one_line(capsys):
    code, out, err = run(capsys, "time", DATA / "ir_bool_scale_const.ir")
    assert code == 2 and out == ""
    assert "const value 4.0 is not a bool" in one_line(err, "time")


@pytest.mark.parametrize("payload, dtype", [("4.0", "bool"), ("2", "bool"), ("-1", "bool"), ("2.5", "i64"),
                                            ("5e9", "i32"), ("[0, 3]", "bool"), ("[1.5, 2]", "i32")])
def test_consts_that_their_dtype_would_change_are_refused(payload, dtype):
    shape = "[2]" if payload.startswith("[") else "[]"
    with pytest.raises(GraphError, match="const value"):
        parse_ir(ir(f"%0 = const {{value={payload}}} : {dtype}{shape}", "return %0"))


@pytest.mark.parametrize("payload, dtype", [("true", "bool"), ("1", "bool"), ("0.0", "bool"), ("7", "i32"),
                                            ("3.0", "i64"), ("0.1", "f16"), ("-3.4e38", "f32")])
def test_consts_that_fit_their_dtype_pass(payload, dtype):
    parse_ir(ir(f"%0 = const {{value={payload}}} : {dtype}[]", "return %0"))


def test_fuse_sdpa_reads_a_const_as_its_dtype_holds_it():
    """A scale const that its dtype rounds (f16 holds 2049 as 2048): the fused scale is what the runtime
    divides by, so the numbers stay equal. (A bool const of 4.0 never gets past lint, which runs after
    every pass, but `const_value` reads it as the runtime would: 1.0.)"""
    from rlxviz.models import random_weights
    from rlxviz.models.presets import Model

    text = (DATA / "ir_bool_scale_const.ir").read_text()
    bad = parse_ir(text, verify=False)
    assert const_value(next(n for n in bad if n.op == Op.CONST and n.dtype.value == "bool")) == 1.0
    g = parse_ir(text.replace("const {value=4.0} : bool[]", "const {value=2049.0} : f16[]"))
    c = next(n for n in g if n.op == Op.CONST and n.dtype.value == "f16")
    assert const_value(c) == 2048.0
    m = Model("t", g, random_weights(g))
    feeds = m.random_feeds()
    ref = run_reference(g, feeds, m.weights)[0]
    trace = run_passes(g, ["fuse_sdpa"])
    assert not trace.steps[0].error
    scales = sorted(n.attrs["scale"] or 0.25 for n in trace.final if n.op == Op.ATTENTION)
    assert scales == [pytest.approx(1 / 2048), 0.25]
    np.testing.assert_allclose(run_reference(trace.final, feeds, m.weights)[0], ref, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ crashed passes

def test_handed_scalar_bias_is_refused_by_a_guard_not_a_crash(capsys):
    """A scalar fc2 bias made fuse_transformer_layer raise mid-pass (every later report incomplete); the engine
    checks a one-node rewrite's operands against the fused op's type rule first, so the match is refused by
    `fused_types`, explain exits 1 naming it, and every version keeps the numbers."""
    code, out, err = run(capsys, "explain", DATA / "ir_scalar_bias_layer1.ir")
    assert code == 1 and "CRASHED" not in out and not err, (out, err)
    assert "guard fused_types (guard, not recognized): FusedTransformerLayer cannot replace the match" in out
    assert "fc2 bias must be [64], got f32[]" in out
    code, out, _ = run(capsys, "time", DATA / "ir_scalar_bias_layer1.ir", "--repeat", 1, "--no-battery")
    assert code == 0 and "NO" not in out


@pytest.mark.parametrize("victim", ["fuse_sdpa", "dead_code_elimination", "mark_elementwise_regions"])
def test_any_pass_that_raises_makes_explain_exit_3(capsys, monkeypatch, victim):
    inject_crash(monkeypatch, victim)
    code, out, err = run(capsys, "explain", "bert-tiny", "--seq", 8)
    assert code == 3, (out, err)
    assert f"CRASHED pass {victim}: RuntimeError: injected failure" in out
    assert "injected failure" in one_line(err, "explain", "internal error")


def test_unexpected_exception_anywhere_is_one_line_exit_3(capsys):
    @cli.subcommand
    def add_bug(sub):
        def bug(_args):
            raise RecursionError("maximum recursion depth exceeded\nmore")
        sub.add_parser("bug").set_defaults(func=bug)

    try:
        code, _, err = run(capsys, "bug")
    finally:
        cli.SUBCOMMANDS.remove(add_bug)
    assert code == 3
    assert "RecursionError: maximum recursion depth exceeded" in one_line(err, "bug", "internal error")


def test_help_documents_exit_codes(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert re.search(r"2\s+bad\s+input", out) and re.search(r"3\s+internal\s+error", out)


def test_only_the_crashing_pass_is_discarded(monkeypatch):
    """A pass that raises (injected into fuse_transformer_layer) is discarded alone; the run goes on and its final
    graph is valid. Without the injection the scalar fc2 bias no longer crashes it: layer 1 is refused, layer 0
    fuses."""
    g = parse_ir((DATA / "ir_scalar_bias_layer1.ir").read_text())
    clean = Pipeline(list(CANONICAL_ORDER)).run(g)
    assert not [s for s in clean.steps if s.error] and clean.final.op_counts().get("FusedTransformerLayer") == 1
    inject_crash(monkeypatch, "fuse_transformer_layer")
    trace = Pipeline(list(CANONICAL_ORDER)).run(g)
    assert [s.pass_name for s in trace.steps if s.error] == ["fuse_transformer_layer"]
    assert lint(trace.final) is trace.final
