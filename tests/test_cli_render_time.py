"""`rlxviz render / ir / time`, memory limits, the docs' command table and the CLI's shared usage errors: real
outputs, exit codes, and one-line errors for bad input (`passes` and `explain`: tests/test_cli_debug.py)."""

import subprocess
import sys

import pytest
from clirun import PY, ROOT, one_line_error, rlxviz, run

from rlxviz import cli
from rlxviz.ir import parse_ir
from rlxviz.passes import Pipeline
from rlxviz.teach import TEACHING_CASES

# ------------------------------------------------------------------------------------------- render / ir

def test_render_svg_after_pass(tmp_path, capsys):
    out = tmp_path / "layer.svg"
    code, _, err = run(capsys, "render", "bert-tiny", "--seq", 8, "--after", "fuse_transformer_layer", "-o", out)
    assert code == 0, err
    svg = out.read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "FusedTransformerLayer" in svg
    assert "after fuse_transformer_layer" in err


def test_render_dot_before_with_rejection_layers_view_and_focus(tmp_path, capsys):
    dot = tmp_path / "rej.dot"
    code, _, _ = run(capsys, "render", "bert-tiny", "--seq", 8, "--variant", "extra_h1_user", "--after",
                     "fuse_transformer_layer", "--before", "-o", dot, "-q")
    assert code == 0 and capsys.readouterr().err == ""
    text = dot.read_text()
    assert text.startswith("digraph") and "h1_user_count" in text
    code, _, _ = run(capsys, "render", "minilm", "--seq", 8, "--view", "layers", "-o", tmp_path / "l.dot", "-q")
    assert code == 0 and "encoder.layer.5" in (tmp_path / "l.dot").read_text()
    code, _, _ = run(capsys, "render", "minilm", "--seq", 8, "--focus", 2, "-o", tmp_path / "f.dot", "-q")
    assert code == 0 and "— layer 2\"" in (tmp_path / "f.dot").read_text()
    code, _, _ = run(capsys, "render", "bert-tiny", "--seq", 8, "--view", "layers", "--expand", 1, "-o",
                     tmp_path / "e.dot", "-q")
    text = (tmp_path / "e.dot").read_text()
    assert code == 0 and "subgraph cluster_layer1" in text and "\tlayer0 [" in text
    code, _, err = run(capsys, "render", "bert-tiny", "--seq", 8, "--view", "layers", "--expand", 9, "-o",
                       tmp_path / "e.dot")
    one_line_error(err, "render", "--expand 9: layer 9 is not in bert-tiny (layers: 0..1)")
    code, _, err = run(capsys, "render", "bert-tiny", "--expand", 1, "-o", tmp_path / "e.dot")
    one_line_error(err, "render", "--expand N opens layer N inside the layers view; add --view layers")


def test_render_second_run_of_a_pass_and_bad_inputs(tmp_path, capsys):
    code, _, err = run(capsys, "render", "bert-tiny", "--seq", 8, "--after", "dead_code_elimination#2",
                       "-o", tmp_path / "a.dot")
    assert code == 0 and "after dead_code_elimination" in err
    code, _, err = run(capsys, "render", "bert-tiny", "--after", "dead_code_elimination#3", "-o", tmp_path / "a.dot")
    one_line_error(err, "render", "run 3 of 'dead_code_elimination' is not in this pipeline")
    code, _, err = run(capsys, "render", "bert-tiny", "--after", "unfuse", "-o", tmp_path / "a.dot")
    one_line_error(err, "render", "pass 'unfuse' is not in this pipeline; it ran: canonicalize_exported, "
                                  "canonicalize_norm, canonicalize_gelu, fuse_sdpa")
    code, _, err = run(capsys, "render", "bert-tiny", "-o", tmp_path / "a.txt")
    one_line_error(err, "render", "unsupported suffix '.txt'")
    code, _, err = run(capsys, "render", "bert-tiny", "-o", tmp_path / "missing" / "a.svg")
    one_line_error(err, "render", "does not exist")
    code, _, err = run(capsys, "render", "bert-tiny", "--focus", 9, "-o", tmp_path / "a.svg")
    one_line_error(err, "render", "--focus 9: layer 9 is not in bert-tiny (layers: 0..1)")
    code, _, err = run(capsys, "render", "bert-tiny", "--view", "layers", "--focus", 1, "-o", tmp_path / "a.svg")
    one_line_error(err, "render", "--focus N draws layer N of the full view; it cannot be combined with --view layers")
    assert not (tmp_path / "a.svg").exists()


def test_render_reports_ops_and_drawn_nodes(tmp_path, capsys):
    from rlxviz.models import load_model
    from rlxviz.passes import Pipeline

    final = Pipeline.canonical().run(load_model("bert-tiny", seq=8).graph).final
    ops = len(final.compute_nodes())
    assert ops < len(final)  # params and consts are not ops
    for view, extra in (("full", []), ("layers", []), ("full", ["--focus", 1])):
        dot = tmp_path / f"{view}{len(extra)}.dot"
        code, _, err = run(capsys, "render", "bert-tiny", "--seq", 8, "--view", view, *extra, "-o", dot)
        assert code == 0, err
        heads = [ln.split(" [")[0].strip() for ln in dot.read_text().splitlines() if " [" in ln]
        drawn = sum(1 for h in heads if h.isidentifier() and h not in ("graph", "node", "edge"))  # not `a -> b`
        assert f": {ops} ops, {drawn} drawn nodes -> {dot}" in err, err
        assert " nodes ->" in err and f"{len(final)} nodes" not in err


@pytest.mark.parametrize("command", ["explain", "render", "ir", "time"])
@pytest.mark.parametrize("value", [-5, 0])
def test_threshold_must_be_positive(capsys, command, value):
    code, out, err = run(capsys, command, "bert-tiny", "--threshold", value, *(["-o", "x.svg"] if command == "render"
                                                                                 else []))
    assert code == 2 and out == ""
    one_line_error(err, command, f"--threshold must be a positive integer (tokens, batch*seq), got {value}")


def test_ir_round_trips_and_after(capsys):
    code, out, _ = run(capsys, "ir", "bert-tiny", "--seq", 8)
    assert code == 0
    g = parse_ir(out)
    assert g.op_counts()["attention"] == 2 and "FusedTransformerLayer" not in g.op_counts()
    code, out, _ = run(capsys, "ir", "bert-tiny", "--seq", 8, "--after", "final")
    assert parse_ir(out).op_counts()["FusedTransformerLayer"] == 2
    assert "[fuse_transformer_layer <- " in out
    code, out, _ = run(capsys, "ir", "bert-tiny", "--seq", 8, "--after", "fuse_matmul_bias_act")
    counts = parse_ir(out).op_counts()
    assert counts["FusedMatMulBiasAct"] == 8 and "FusedAttentionBlock" not in counts


def test_ir_pipe_closed_early_is_not_an_error():
    py = str(PY if PY.exists() else sys.executable)
    r = subprocess.run(f"'{py}' -m rlxviz ir minilm --seq 8 | head -1", shell=True, capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.stdout.startswith("graph ") and "error" not in r.stderr


# ------------------------------------------------------------------------------------------------- time

def test_time_table_every_version_checked(capsys):
    code, out, err = run(capsys, "time", "bert-tiny", "--seq", 8, "--repeat", 2)
    assert code == 0, err
    lines = out.splitlines()
    assert "canonical pipeline" in lines[0] and "BLAS" in lines[0] and "on random inputs" in lines[0]
    assert lines[1].startswith("precision: f32 on MLX ") and "oracle: the unfused graph in float64" in lines[1]
    assert lines[2].startswith("ok: every output element within ")  # what "ok" is judged against
    assert lines[3].startswith("inputs: random, fully_masked_row, left_padding, holes, single_token;")
    assert "large_magnitude (no float input)" in lines[3]  # token ids only: said, not silently dropped
    h = 5 if lines[4].startswith("Busy machine: ") else 4  # a busy run says so before the table
    assert lines[h].split()[:3] == ["#", "version", "ops"]  # compute ops, as in render and the app
    assert lines[h].split()[-4:] == ["oracle", "vs", "unfused", "ok"]
    rows = lines[h + 1:(lines + [""]).index("")]  # the table, then (on the CPU) a blank line and the split
    assert len(rows) == 1 + len(Pipeline.canonical().steps())  # a version per step, fuse_sdpa's stages too
    timed = [r for r in rows if "unchanged" not in r]
    assert len(timed) >= 5 and all(r.rstrip().endswith("yes") for r in timed)
    assert "after fuse_transformer_layer" in out
    assert "(unchanged: same as #0, not timed again)" in out  # fuse_sdpa changes nothing in the rlx-style preset
    assert "), batch 1, seq 8; " in lines[0]  # a preset is built for --batch/--seq: they are its shape


def test_time_header_of_an_ir_file_gives_its_own_input_shapes(capsys):
    """An IR file's graph has its own shapes ([2, 8, 64] here): --batch/--seq mean nothing to it."""
    code, out, err = run(capsys, "time", ROOT / "tests/data/f16-residual-ln-decomposed.rlx", "--repeat", 1,
                         "--warmup", 0, "--no-battery")
    head = out.splitlines()[0]
    assert head.startswith("ln16_decomposed (canonical pipeline), inputs x f16[2, 8, 64], r f16[2, 8, 64]; "), head
    assert "seq" not in head and "batch" not in head


@pytest.mark.parametrize("args, fragment", [
    (("--repeat", "0"), "argument --repeat/-r: must be in 1..1000, got 0"),
    (("--repeat", "99999999999999999999999"), "argument --repeat/-r: must be in 1..1000"),
    (("--warmup", "999999999999"), "argument --warmup: must be in 0..100"),
    (("--warmup", "-1"), "argument --warmup: must be in 0..100"),
    (("--repeat", "ten"), "argument --repeat/-r: expected an integer in 1..1000, got 'ten'"),
])
def test_time_rounds_bounded_in_argparse(capsys, args, fragment):
    """A huge --repeat/--warmup is refused before any model is built (one line, exit 2), not run forever."""
    with pytest.raises(SystemExit) as e:
        cli.main(["time", "bert-tiny", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlxviz time: error: ") and fragment in lines[0], err


def test_time_rounds_bounded_in_session_and_app():
    """One bound (session.MAX_REPEAT / MAX_WARMUP) for the CLI, the session and the app's controls."""
    from rlxviz import session
    from rlxviz.app.state import AppState
    from rlxviz.session import SessionError, time_versions

    assert (session.MAX_REPEAT, session.MAX_WARMUP) == (1000, 100)
    assert AppState.param.repeat.bounds == (1, session.MAX_REPEAT)
    assert AppState.param.warmup.bounds == (0, session.MAX_WARMUP)
    for kw in ({"repeat": 10 ** 22, "warmup": 0}, {"repeat": 1, "warmup": 10 ** 12}, {"repeat": 0, "warmup": 0}):
        with pytest.raises(SessionError, match="must be an integer in"):
            time_versions(None, {}, {}, **kw)


def test_time_nan_is_never_ok(tmp_path, capsys):
    from test_cli_run import tiny_checkpoint

    ck = tiny_checkpoint(tmp_path / "ck", nan=["encoder.layer.0.output.dense.weight"])
    code, out, err = run(capsys, "time", ck, "--seq", 4, "--repeat", 1)
    assert code == 1
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith(" #  version"))
    rows = [ln for ln in lines[head + 1:(lines + [""]).index("")]  # the table only (no lowering-change mark)
            if "unchanged" not in ln and not ln.lstrip().startswith("^")]
    assert rows and all(" nan " in r and r.endswith("NO: not finite even in float64 on random") for r in rows), out
    assert " yes" not in out
    assert "rlxviz time: warning: the outputs hold NaN or infinite values" in err
    code, out, err = run(capsys, "explain", ck, "--seq", 4)
    assert code == 0 and "2/2 layer(s) fused" in out  # the fusions are fine; the weights are not
    assert "rlxviz explain: warning: 1 weight(s) hold NaN/inf (e.g. 'encoder.layer.0.output.dense.weight')" in err


def test_time_versions_nan_reference_and_output_are_not_ok():
    import numpy as np

    from rlxviz.ir import Builder
    from rlxviz.passes import Pipeline
    from rlxviz.teach import format_timings, time_versions

    b = Builder("g")
    x = b.input("x", (2, 3))
    b.output(b.relu(x))
    trace = Pipeline.canonical().run(b.build())
    for bad in (np.nan, np.inf):
        feeds = {"x": np.array([[1, bad, 0], [0, 1, 2]], np.float32)}
        rows = time_versions(trace, feeds, {}, warmup=0, repeat=1)
        assert rows[0].ok is False and rows[0].finite is False and rows[0].status == "nonfinite"
        assert "NO: not finite even in float64 on random" in format_timings(rows)
    rows = time_versions(trace, {"x": np.ones((2, 3), np.float32)}, {}, warmup=0, repeat=1)
    assert rows[0].ok is True and rows[0].max_abs == 0.0


def test_teaching_cases_cover_app_variants():
    from rlxviz.models import VARIANTS

    assert set(VARIANTS) - {"none"} <= set(TEACHING_CASES)


# ----------------------------------------------------------------------------------------------- memory

HUGE = ('graph g {\n  %0 = input {name="x"} : f32[200000, 200000]\n  %1 = relu(%0) : f32[200000, 200000]\n'
        '  return %1\n}\n')


def test_time_refuses_inputs_over_the_memory_limit_before_allocating(tmp_path, capsys, monkeypatch):
    f = tmp_path / "huge.ir"
    f.write_text(HUGE)
    code, out, err = run(capsys, "time", f)
    assert code == 2 and out == ""
    # the peak counts the relu output too (input and output live at once), not only inputs and params
    one_line_error(err, "time", 'a run needs 298.0 GiB at its peak at %1 (relu) (the largest tensor, %0 "x" '
                                "f32[200000, 200000], 149.0 GiB), over the limit of 2.0 GiB (default)")
    assert "--max-memory-mb" in err and "RLXVIZ_MAX_MEMORY_MB" in err
    small = tmp_path / "small.ir"  # 4 MiB in, 4 MiB out: over a 1 MiB limit from the option or the environment
    small.write_text(HUGE.replace("200000", "1024"))
    code, _, err = run(capsys, "time", small, "--max-memory-mb", 1)
    one_line_error(err, "time", "needs 8.0 MiB at its peak")
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", "1")
    code, _, err = run(capsys, "time", small)
    one_line_error(err, "time", "over the limit of 1.0 MiB (RLXVIZ_MAX_MEMORY_MB)")
    code, _, err = run(capsys, "time", small, "--max-memory-mb", 8, "--repeat", 1)  # the option wins
    one_line_error(err, "time", "time needs")  # 8 MiB holds a run, not `time`'s oracle, battery and MLX copies
    code, _, err = run(capsys, "time", small, "--max-memory-mb", 241, "--repeat", 1)
    assert code == 0, err
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", "lots")
    code, _, err = run(capsys, "explain", small)
    one_line_error(err, "explain", "RLXVIZ_MAX_MEMORY_MB='lots': must be a positive number")
    code, _, err = run(capsys, "explain", small, "--max-memory-mb", 0)
    one_line_error(err, "explain", "--max-memory-mb must be a positive number")


def test_huge_params_refused_when_the_ir_file_is_loaded(tmp_path, capsys):
    f = tmp_path / "bigw.ir"
    f.write_text('graph g {\n  %0 = input {name="x"} : f32[2, 100000]\n'
                 '  %1 = param {name="w"} : f32[100000, 100000]\n  %2 = matmul(%0, %1) : f32[2, 100000]\n'
                 '  return %2\n}\n')
    code, _, err = run(capsys, "explain", f)  # random weights would be 37 GiB
    assert code == 2
    one_line_error(err, "explain", 'needs 37.3 GiB at its peak at %2 (matmul) (the largest tensor, %1 "w" '
                                   "f32[100000, 100000]")
    r = rlxviz("ir", f)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_memory_error_anywhere_is_one_line(capsys):
    @cli.subcommand
    def add_oom(sub):
        def boom(_args):
            raise MemoryError("Unable to allocate 298. GiB for an array with shape (200000, 200000)")
        sub.add_parser("oom").set_defaults(func=boom)

    try:
        code, _, err = run(capsys, "oom")
    finally:
        cli.SUBCOMMANDS.remove(add_oom)
    assert code == 2
    one_line_error(err, "oom", "out of memory (Unable to allocate 298. GiB")


# ------------------------------------------------------------------------------------------------- docs

def test_docs_list_every_command_and_no_developer_paths(capsys):
    doc = (ROOT / "docs" / "teach-and-debug.md").read_text()
    commands = list(cli.build_parser()._subparsers._group_actions[0].choices)
    words = {5: "five", 6: "six", 7: "seven", 8: "eight"}
    assert f"has {words[len(commands)]} commands" in doc
    for c in commands:
        assert f"| `rlxviz {c} " in doc, c
    assert "/work/" not in doc and "/home/" not in doc
    # pasted outputs that do not depend on timing are what the commands print now
    for args in (["explain", "llama-block"], ["explain", "minilm", "--layer", "6"],
                 ["explain", "minilm", "--threshold", "-5"], ["explain", "nope"]):
        code, out, err = run(capsys, *args)
        assert code in (0, 2)
        for line in (out + err).strip().splitlines():
            assert line in doc, line


def test_usage_errors_are_one_line_and_exit_2(capsys):
    from rlxviz.cli import main

    for argv in (["explain", "minilm", "--bogus"], ["explain"], ["nosuchcommand"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error:" in err and "usage:" not in err


def test_seq_over_max_position_is_refused_not_shrunk(capsys):
    from rlxviz.cli import main

    assert main(["ir", "bert-tiny", "--seq", "200"]) == 2
    err = capsys.readouterr().err
    assert "seq 200 must be in 1..128" in err and err.count("\n") == 1



def test_model_help_names_onnx_and_a_non_graph_json_says_so(capsys):
    for command in ("explain", "export"):
        helptext = " ".join(rlxviz(command, "--help").stdout.split())
        assert "an .onnx export" in helptext, command
    code, _, err = run(capsys, "explain", ROOT / "tests/fixtures/onnx/bert.json")
    assert code == 2
    one_line_error(err, "explain", "not an rlxviz graph JSON (to_json form")
    assert "'versions', 'config'" in err and "no outputs" not in err


def test_export_and_render_refuse_a_missing_folder_alike(tmp_path, capsys):
    for command, out in (("export", "x.onnx"), ("render", "x.svg"), ("export", "x.json")):
        target = tmp_path / "nodir" / out
        args = [command, "bert-tiny", "--seq", 4] + ([target] if command == "export" else ["-o", target])
        code, _, err = run(capsys, *args)
        assert code == 2
        one_line_error(err, command, f"{target}: folder {target.parent} does not exist")
