"""Bounds lint and the IR/JSON readers enforce on untrusted graphs (fresh hostile-input trial): empty tensors,
ranks over `MAX_RANK`, constant gather indices out of range, float consts that overflow their dtype, long
quoted strings/names, deep JSON. Each kind is refused as one line, exit 2, before anything runs."""


import json

import numpy as np
import pytest
from clirun import one_line, run

from rlxviz.ir import GraphError, IRSyntaxError, from_json, lint, parse_ir, to_json
from rlxviz.ir.lint import MAX_RANK
from rlxviz.ir.parser import MAX_STRING_CHARS
from rlxviz.ir.safejson import loads
from rlxviz.runtime import run_reference


def ir(*lines: str) -> str:
    return "graph t {\n" + "".join(f"  {ln}\n" for ln in lines) + "}\n"


def json_form(text: str) -> str:
    """The graph JSON form of `text`, built without lint (so invalid graphs can be written)."""
    return to_json(parse_ir(text, verify=False))


# ------------------------------------------------------------------------------------------ empty tensors

EMPTY = {
    "reduce_mean": ir('%0 = input {name="x"} : f32[2, 0]',
                      "%1 = reduce_mean(%0) {axes=[1], keepdims=true} : f32[2, 1]", "return %1"),
    "reduce_max": ir('%0 = input {name="x"} : f32[0, 4]', "%1 = reduce_max(%0) {axes=[0], keepdims=false} : f32[4]",
                     "return %1"),
    "reduce_sum_other_axis": ir('%0 = input {name="x"} : f32[0, 4]',
                                "%1 = reduce_sum(%0) {axes=[1], keepdims=false} : f32[0]", "return %1"),
    "softmax": ir('%0 = input {name="x"} : f32[3, 0]', "%1 = softmax(%0) {axis=1} : f32[3, 0]", "return %1"),
    "layer_norm": ir('%0 = input {name="x"} : f32[2, 0]', '%1 = param {name="w"} : f32[0]',
                     '%2 = param {name="b"} : f32[0]', "%3 = layer_norm(%0, %1, %2) {eps=1e-5} : f32[2, 0]",
                     "return %3"),
    "gather": ir('%0 = param {name="t"} : f32[0, 3]', '%1 = input {name="i"} : i64[1, 2]',
                 "%2 = gather(%0, %1) {axis=0} : f32[1, 2, 3]", "return %2"),
    "matmul": ir('%0 = input {name="x"} : f32[2, 0]', '%1 = param {name="w"} : f32[0, 3]',
                 "%2 = matmul(%0, %1) : f32[2, 3]", "return %2"),
    "narrow_to_empty": ir('%0 = input {name="x"} : f32[2, 4]',
                          "%1 = narrow(%0) {axis=1, start=1, length=0} : f32[2, 0]", "return %1"),
}


@pytest.mark.parametrize("name", list(EMPTY))
def test_any_empty_tensor_is_refused_by_lint_in_text_and_json(name):
    text = EMPTY[name]
    for load in (parse_ir, lambda t: lint(from_json(json_form(t)))):
        with pytest.raises(GraphError) as e:
            load(text)
        assert "has a dimension of size 0 (empty tensors are not supported)" in e.value.reason
        assert e.value.reason.startswith("%")  # names the node


@pytest.mark.parametrize("command", [["explain"], ["time", "--repeat", "1"]])
@pytest.mark.parametrize("suffix", [".ir", ".json"])
def test_empty_tensor_files_exit_2_in_one_line(tmp_path, capsys, command, suffix):
    """`time` on these hung in mx.eval (reduce_mean, layer_norm) or exited 3 (reduce_max, gather)."""
    text = EMPTY["reduce_mean"]
    f = tmp_path / f"g{suffix}"
    f.write_text(json_form(text) if suffix == ".json" else text)
    code, out, err = run(capsys, *command, f)
    assert code == 2
    line = one_line(err, command[0])
    assert "%0 (input): type f32[2, 0] has a dimension of size 0" in line


# ------------------------------------------------------------------------------------------------- rank

@pytest.mark.parametrize("rank", [MAX_RANK + 1, 65, 200])
def test_rank_over_the_limit_is_refused_naming_the_node(rank, tmp_path, capsys):
    dims = ", ".join(["1"] * rank)
    text = ir(f'%0 = input {{name="x"}} : f32[{dims}]', f"%1 = relu(%0) : f32[{dims}]", "return %1")
    with pytest.raises(GraphError) as e:
        parse_ir(text)
    assert e.value.reason == f"%0 (input): type f32[...] has rank {rank} (at most {MAX_RANK} dimensions are supported)"
    f = tmp_path / "deep.ir"
    f.write_text(text)
    code, _, err = run(capsys, "time", "--repeat", "1", f)
    assert code == 2 and f"has rank {rank}" in one_line(err, "time") and "deep.ir" in err


def test_rank_at_the_limit_passes():
    dims = ", ".join(["1"] * MAX_RANK)
    parse_ir(ir(f'%0 = input {{name="x"}} : f32[{dims}]', f"%1 = relu(%0) : f32[{dims}]", "return %1"))


# ------------------------------------------------------------------------------------ const gather indices

def gather_of(index_lines: list[str], idx: int, idx_type: str) -> str:
    out = f"{idx_type}, 3" if idx_type else "3"
    return ir('%0 = param {name="t"} : f32[4, 3]', *index_lines, f"%9 = gather(%0, %{idx}) {{axis=0}} : f32[{out}]",
              "return %9")


@pytest.mark.parametrize("index_lines, idx, idx_type, bad", [
    (["%1 = const {value=[[7, 9]]} : i64[1, 2]"], 1, "1, 2", 7),                       # the handed file
    (["%1 = const {value=4} : i64[]"], 1, "", 4),                                      # one past the end
    (["%1 = const {value=[0, -1]} : i32[2]"], 1, "2", -1),                              # negative
    (["%1 = const {value=[0, 1, 2, 9]} : i64[4]", "%2 = reshape(%1) {shape=[2, 2]} : i64[2, 2]"], 2, "2, 2", 9),
    (["%1 = const {value=[1, 5]} : i32[2]", '%2 = cast(%1) {dtype="i64"} : i64[2]'], 2, "2", 5),
    (['%1 = input {name="i"} : i64[2]', "%2 = const {value=[100]} : i64[1]",
      "%3 = concat(%1, %2) {axis=0} : i64[3]"], 3, "3", 100),
    (["%1 = const {value=[0, 9]} : i64[2]", "%2 = narrow(%1) {axis=0, start=1, length=1} : i64[1]"], 2, "1", 9),
    (["%1 = const {value=[[0], [6]]} : i64[2, 1]", "%2 = expand(%1) {shape=[2, 5]} : i64[2, 5]"], 2, "2, 5", 6),
])
def test_const_gather_indices_out_of_range_are_refused(index_lines, idx, idx_type, bad):
    with pytest.raises(GraphError) as e:
        parse_ir(gather_of(index_lines, idx, idx_type))
    assert e.value.reason.startswith(f"%9 (gather): const index {bad} (from %")
    assert "out of range for table f32[4, 3]: axis 0 has 4 rows (valid indices 0..3)" in e.value.reason


@pytest.mark.parametrize("index_lines, idx, idx_type", [
    (["%1 = const {value=[0, 9]} : i64[2]", "%2 = narrow(%1) {axis=0, start=0, length=1} : i64[1]"], 2, "1"),
    (["%1 = const {value=[[1, 2], [7, 8]]} : i64[2, 2]", "%2 = transpose(%1) {perm=[1, 0]} : i64[2, 2]",
      "%3 = narrow(%2) {axis=1, start=0, length=1} : i64[2, 1]"], 3, "2, 1"),
    (['%1 = input {name="i"} : i64[2]', "%2 = const {value=[9]} : i64[1]", "%3 = concat(%1, %2) {axis=0} : i64[3]",
      "%4 = narrow(%3) {axis=0, start=0, length=2} : i64[2]"], 4, "2"),  # 9 may be cut away: not known
])
def test_const_gather_indices_cut_away_by_narrow_pass(index_lines, idx, idx_type):
    parse_ir(gather_of(index_lines, idx, idx_type))


def test_const_index_evaluation_is_bounded():
    """Concats of concats double the indices each step; lint keeps the set of values, never 2**40 of them."""
    lines = ["%1 = const {value=[0, 1]} : i64[2]"]
    for k in range(2, 42):
        lines.append(f"%{k} = concat(%{k - 1}, %{k - 1}) {{axis=0}} : i64[{2 ** k}]")
    text = ir('%0 = param {name="t"} : f32[4, 3]', *lines, f"%99 = gather(%0, %41) {{axis=0}} : f32[{2 ** 41}, 3]",
              "return %99")
    g = parse_ir(text, verify=False)
    from rlxviz.ir.lint import problems

    assert peak_bytes(problems, g) < 20 << 20


def test_const_gather_indices_in_range_pass_and_run():
    g = parse_ir(gather_of(["%1 = const {value=[[3, 0]]} : i64[1, 2]"], 1, "1, 2"))
    t = np.arange(12, dtype=np.float32).reshape(4, 3)
    (out,) = run_reference(g, {}, {"t": t})
    assert (out == t[[[3, 0]]]).all()


def test_handed_const_gather_oob_exits_2(tmp_path, capsys):
    f = tmp_path / "g.ir"
    f.write_text(gather_of(["%1 = const {value=[[7, 9]]} : i64[1, 2]"], 1, "1, 2"))
    code, _, err = run(capsys, "time", "--repeat", "1", f)
    assert code == 2 and "%9 (gather): const index 7 (from %1) is out of range" in one_line(err, "time")


# ------------------------------------------------------------------------------ long strings, flat memory

def peak_bytes(f, *args) -> int:
    """Peak Python-allocated bytes while `f(*args)` runs (exceptions swallowed)."""
    import tracemalloc

    tracemalloc.start()
    try:
        f(*args)
    except Exception:  # noqa: BLE001 - only the memory is measured here
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


@pytest.mark.parametrize("body", ["a" * 2_000_000, "\\n" * 1_000_000, "ab\\\"" * 500_000])
def test_long_quoted_string_is_refused_in_flat_memory(body):
    """A 2 MB quoted name cost 590 MB (a regex backtracking frame per character); now a few times the text."""
    text = ir(f'%0 = input {{name="{body}"}} : f32[2]', "return %0")
    with pytest.raises(IRSyntaxError) as e:
        parse_ir(text)
    assert (e.value.line, e.value.col, e.value.reason) == (2, 20, f"quoted string longer than {MAX_STRING_CHARS} "
                                                                    "characters")
    assert len(str(e.value)) < 500  # the error shows a window of the line, not megabytes
    assert peak_bytes(parse_ir, text) < 4 * len(text) + (1 << 20)
    unterminated = ir(f'%0 = input {{name="{body}', "return %0")
    assert peak_bytes(parse_ir, unterminated) < 4 * len(text) + (1 << 20)


@pytest.mark.parametrize("line, col, reason", [
    ('%0 = input {name="x"} : f32[2] @' + "p." * 3000 + "q", 35, "name with 6001 characters (at most 4096)"),
    ('%0 = input {' + "k" * 5000 + '="x"} : f32[2]', 15, "name with 5000 characters (at most 4096)"),
    ('%0 = input {name="x"} : f32[2] ["' + "p" * 5000 + '"]', 35, "quoted string longer than 4096 characters"),
    ('%0 = input {name="x\\"} : f32[2]', 20, "unterminated string"),
])
def test_long_names_paths_and_strings_are_syntax_errors_at_their_column(line, col, reason):
    with pytest.raises(IRSyntaxError) as e:
        parse_ir(ir(line, "return %0"))
    assert (e.value.line, e.value.col, e.value.reason) == (2, col, reason)


def test_strings_up_to_the_limit_round_trip():
    name = "n" * (MAX_STRING_CHARS - 2)  # with its quotes, exactly at the limit
    g = parse_ir(ir(f'%0 = input {{name="{name}"}} : f32[2]', "return %0"))
    assert g[0].attrs["name"] == name
    assert to_json(from_json(to_json(g))) == to_json(g)


@pytest.mark.parametrize("field", ["name", "path", "attr", "attrname", "op"])
def test_graph_json_strings_are_capped(field):
    long = "x" * (MAX_STRING_CHARS + 1)
    node = {"id": 0, "op": "input", "inputs": [], "shape": [2], "dtype": "f32", "attrs": {"name": "x"}}
    d = {"name": "t", "outputs": [0], "nodes": [node]}
    if field == "name":
        d["name"] = long
    elif field == "path":
        node["path"] = long
    elif field == "attr":
        node["attrs"]["name"] = long
    elif field == "attrname":
        node["attrs"][long] = 1
    else:
        node["op"] = long
    with pytest.raises(GraphError) as e:
        from_json(json.dumps(d))
    assert f"with {MAX_STRING_CHARS + 1} characters (at most {MAX_STRING_CHARS})" in str(e.value)
    assert len(str(e.value)) < 500


@pytest.mark.parametrize("body", ["a" * 2_000_000, "\\n" * 1_000_000])
def test_safejson_scans_long_strings_in_flat_memory(body):
    text = '{"a": "' + body + '"}'
    assert peak_bytes(loads, text) < 6 * len(text) + (1 << 20)


# -------------------------------------------------------------------------------------- deep JSON files

@pytest.mark.parametrize("text", [
    '{"a": ' * 2000 + "1" + "}" * 2000,
    "[" * 100_000 + "]" * 100_000,
    '{"model_type": "bert", "x": ' + "[" * 5000 + "]" * 5000 + "}",
    '{"nodes": [], "outputs": [], "x": ' + '{"b": ' * 3000 + "1" + "}" * 3000 + "}",
])
def test_deep_json_graph_file_is_one_line_exit_2(tmp_path, capsys, text):
    """`_refuse_model_config` read the file with plain json.loads: RecursionError, exit 3."""
    f = tmp_path / "g.json"
    f.write_text(text)
    code, out, err = run(capsys, "explain", f)
    assert code == 2 and out == ""
    assert "nesting deeper than 64 levels" in one_line(err, "explain")


def test_safetensors_header_is_read_with_bounds(tmp_path):
    from rlxviz.models.checkpoint import check_header_dtypes

    header = ("[" * 200_000 + "]" * 200_000).encode()
    f = tmp_path / "model.safetensors"
    f.write_bytes(len(header).to_bytes(8, "little") + header)
    assert check_header_dtypes(f) is None  # left to safe_open, which names what is wrong


# ----------------------------------------------------------------------- float consts past their dtype

@pytest.mark.parametrize("value, dtype", [
    ("1e300", "f32"), ("-1e300", "f32"), ("3.5e38", "f32"), ("65520", "f16"), ("-70000.0", "f16"), ("1e5", "f16"),
    ("3.4e38", "bf16"), ("-3.4028234663852886e38", "bf16"), ("[1.0, 1e39]", "f32"),
])
def test_float_const_not_finite_in_its_dtype_is_refused(value, dtype):
    shape = "2" if value.startswith("[") else ""
    text = ir(f"%1 = const {{value={value}}} : {dtype}[{shape}]", "return %1")
    with pytest.raises(GraphError) as e:
        parse_ir(text)
    assert e.value.reason.startswith("%1 (const): const value ")
    assert f"is not finite in {dtype} (largest " in e.value.reason and "it would become" in e.value.reason
    with pytest.raises(GraphError):
        lint(from_json(json_form(text)))


@pytest.mark.parametrize("value, dtype", [
    ("3.4028235e38", "f32"), ("-3.4028234663852886e38", "f32"), ("65504", "f16"), ("65519.0", "f16"),
    ("3.3895313892515355e38", "bf16"), ("1e300", "f64"), ("inf", "f32"), ("-inf", "f16"), ("nan", "bf16"),
    ("1e-999999", "f32"),
])
def test_float_consts_that_round_to_a_finite_value_or_say_inf_pass(value, dtype):
    g = parse_ir(ir(f"%1 = const {{value={value}}} : {dtype}[]", "return %1"))
    with np.errstate(all="raise"):
        if dtype in ("f32", "f16") and value.lstrip("-") not in ("inf", "nan"):
            assert np.isfinite(np.array(g[1].attrs["value"], dtype=g[1].dtype.numpy))


@pytest.mark.parametrize("literal", ["1e999999", "-1e400", "1.5e309"])
def test_float_literal_past_float64_is_a_syntax_error(literal, tmp_path, capsys):
    text = ir('%0 = input {name="x"} : f32[2, 4]', f"%1 = const {{value={literal}}} : f32[]",
              "%2 = mul(%0, %1) : f32[2, 4]", "return %2")
    with pytest.raises(IRSyntaxError) as e:
        parse_ir(text)
    assert (e.value.line, e.value.col) == (3, 21) and "is too large (beyond float64" in e.value.reason
    f = tmp_path / "g.ir"
    f.write_text(text)
    code, out, err = run(capsys, "time", "--repeat", "1", f)
    assert code == 2 and "g.ir:3:21: IR syntax error: number" in one_line(err, "time")


def test_json_number_past_float64_is_refused_at_its_column():
    from rlxviz.ir.safejson import JSONTextError

    with pytest.raises(JSONTextError) as e:
        loads('{"a": [1, 1e400]}')
    assert (e.value.line, e.value.col) == (1, 11) and "too large" in e.value.reason
    assert loads('{"a": 1e-400}') == {"a": 0.0}


def test_handed_f32_overflow_const_exits_2_before_running(tmp_path, capsys):
    f = tmp_path / "g.ir"
    f.write_text(ir('%0 = input {name="x"} : f32[2, 4]', "%1 = const {value=1e300} : f32[]",
                    "%2 = mul(%0, %1) : f32[2, 4]", "return %2"))
    code, out, err = run(capsys, "time", "--repeat", "1", f)
    assert code == 2
    assert "%1 (const): const value 1e+300 is not finite in f32 (largest 3.4028235e+38)" in one_line(err, "time")


def test_huge_lines_are_lexed_lazily_in_bounded_memory():
    """A 2 MB shape list was lexed into 1.4 M token objects first (300 MB); now the type stops at 1024 dims."""
    from rlxviz.ir.parser import MAX_PARSED_DIMS

    text = ir('%0 = input {name="x"} : f32[' + ", ".join(["1"] * 700_000) + "]", "return %0")
    with pytest.raises(IRSyntaxError) as e:
        parse_ir(text)
    assert e.value.reason == f"type with more than {MAX_PARSED_DIMS} dimensions" and e.value.line == 2
    assert peak_bytes(parse_ir, text) < 2 * len(text) + (1 << 20)
    bad_tail = ir('%0 = input {name="x"} : f32[2] # ' + "x" * 1_000_000, '%1 = relu(%0) : f32[2] $', "return %1")
    with pytest.raises(IRSyntaxError) as e:
        parse_ir(bad_tail)
    assert (e.value.line, e.value.reason) == (3, "unexpected character '$'")


def test_an_invalid_ir_file_names_the_line_of_the_node(tmp_path, capsys):
    """An IR file that parses but fails lint says the line defining the node the error names, as pasted IR text
    does in the app (one line, exit 2)."""
    f = tmp_path / "bad_decl.ir"
    f.write_text('graph bad_decl {\n  %0 = input {name="x"} : f32[2, 8]\n  %1 = gelu(%0) : f32[2, 9]\n  return %1\n}\n')
    code, _, err = run(capsys, "explain", f)
    assert code == 2
    assert f"{f}: line 3: invalid graph: %1 (gelu): declared type f32[2, 9]" in one_line(err, "explain")
