"""Issue 40, host nodes: an `onnx_op` node is linted with the importer's rules wherever it comes from
(`ir.host_rules`), and every host evaluation is bounded.

The handed files (`tests/data/reliability/ir_hostop_*.ir`: a `Loop` with no trip count labelled Hardmax, a `Neg`
labelled Relu) and variants of each kind written here (control flow under its own label, a subgraph attribute, a
non-default domain, an opset outside the importer's, a ConstantOfShape to [20000, 20000] declared `f32[2, 8]`, a
node that does not parse, an output or operand count the node does not have) are refused by lint: one stderr
line, exit 2, naming the rule, within 10 s, in every subcommand that reads a model. A host node that keeps the
rules still runs (ONNX Runtime's numbers), and an imported model's host nodes still lint.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

import numpy as np
import pytest
from clirun import one_line, run
from onnx import TensorProto, helper
from walltime import within

from rlxviz.ir import Op, format_graph, parse_ir, problems
from rlxviz.ir import onnx_op as host
from rlxviz.ir.host_rules import NEVER_ON_HOST, form_refusal, onnx_op_problem
from rlxviz.ir.onnx_op import encode

DATA = Path(__file__).parent / "data" / "reliability"
BOUND_S = 10


def _ir(node_text: str, label: str, *, opset: int = 17, declared: str = "f32[2, 8]", shape: str = "[2, 8]",
        dtype: str = "f32", operands: str = "%0", extra: str = "", pre: tuple[str, ...] = ()) -> str:
    lines = ['%0 = input {name="x"} : f32[2, 8]', *pre,
             f'%9 = onnx_op({operands}) {{op_type="{label}", name="n", node="{node_text}", opset={opset}, '
             f'shape={shape}, dtype="{dtype}"{extra}}} : {declared}', "return %9"]
    return "graph g {\n" + "".join(f"  {ln}\n" for ln in lines) + "}\n"


def _hardmax(**kw) -> str:
    return encode(helper.make_node("Hardmax", ["x"], ["y"], axis=-1, **kw))


_BODY = helper.make_graph([helper.make_node("Identity", ["c"], ["c2"])], "body",
                          [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("c2", TensorProto.BOOL, [])])

VARIANTS = {
    # control flow under its own label: never on the host, whatever it is called
    "loop_labelled_loop": (_ir(encode(helper.make_node("Loop", ["", "", "x"], ["y"], body=_BODY)), "Loop",
                               operands="%0"), "never runs on the host"),
    "if_labelled_if": (_ir(encode(helper.make_node("If", ["x"], ["y"], then_branch=_BODY, else_branch=_BODY)), "If"),
                       "never runs on the host"),
    "scan_labelled_hardmax": (_ir(encode(helper.make_node("Scan", ["x"], ["y"], body=_BODY, num_scan_inputs=1)),
                                  "Hardmax"), "the label must be the node's op type"),
    # a subgraph attribute on an op that is not control flow
    "subgraph_attribute": (_ir(_hardmax(body=_BODY), "Hardmax"), "holds a subgraph"),
    # a domain other than ONNX's own
    "contrib_domain": (_ir(encode(helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")), "Gelu"),
                       "not the default ONNX domain"),
    "custom_domain": (_ir(encode(helper.make_node("Hardmax", ["x"], ["y"], domain="my.ops")), "Hardmax"),
                      "not the default ONNX domain"),
    # opsets outside the importer's
    "huge_opset": (_ir(_hardmax(), "Hardmax", opset=10000), "opset 10000 is not supported"),
    "old_opset": (_ir(_hardmax(), "Hardmax", opset=7), "opset 7 is not supported"),
    # a declared type other than ONNX's inference (the budget would count the declared one)
    "constant_of_shape_huge": (_ir(encode(helper.make_node("ConstantOfShape", ["s"], ["y"])), "ConstantOfShape",
                                   operands="%1", pre=("%1 = const {value=[20000, 20000]} : i64[2]",)),
                               "ONNX shape inference gives its ConstantOfShape node f32[20000, 20000]"),
    "constant_of_shape_unknown": (_ir(encode(helper.make_node("ConstantOfShape", ["s"], ["y"])), "ConstantOfShape",
                                      operands="%1", pre=('%1 = input {name="s"} : i64[2]',)),
                                  "does not fix the shape"),
    "hardmax_declared_bigger": (_ir(_hardmax(), "Hardmax", declared="f32[4000, 8000]", shape="[4000, 8000]"),
                                "gives its Hardmax node f32[2, 8]"),
    "hardmax_declared_i64": (_ir(_hardmax(), "Hardmax", declared="i64[2, 8]", dtype="i64"),
                             "gives its Hardmax node f32[2, 8]"),
    # a node that is no node, or other counts than it has
    "not_base64": (_ir("@@not base64@@", "Hardmax"), "not a serialized ONNX node"),
    "not_a_node": (_ir(base64.b64encode(b"\xff\xff\xff\xff").decode(), "Hardmax"), "not a serialized ONNX node"),
    "output_past_the_node": (_ir(_hardmax(), "Hardmax", extra=", output=3"), "output 3 is not an output"),
    "operand_count": (_ir(_hardmax(), "Hardmax", operands="%0, %0"), "reads 1 input(s) but the onnx_op has 2"),
}


@pytest.mark.parametrize("name", ["ir_hostop_loop_forever.ir", "ir_hostop_optype_lie.ir"])
@pytest.mark.parametrize("command, extra", [
    ("explain", ()), ("time", ("-r", "1", "--warmup", "0")), ("overlay", ("--time-limit", "5")), ("ir", ()),
    ("render", ("-o", "{tmp}/g.svg")), ("export", ("{tmp}/g.onnx",)),
])
def test_handed_host_node_files_are_refused_in_one_line(capsys, tmp_path, name, command, extra):
    args = [a.format(tmp=tmp_path) for a in extra]
    with within(BOUND_S, f"{command} {name}"):
        code, _, err = run(capsys, command, DATA / name, *args)
    assert code == 2, err
    line = one_line(err, command)
    assert "the label must be the node's op type" in line and "onnx_op" in line, line
    assert not list(tmp_path.iterdir())  # nothing written


def test_handed_host_node_file_given_to_run_is_one_line(capsys, tmp_path):
    np.savez(tmp_path / "in.npz", x=np.ones((2, 8), np.float32))
    with within(BOUND_S, "run"):
        code, _, err = run(capsys, "run", DATA / "ir_hostop_loop_forever.ir", "-i", tmp_path / "in.npz",
                           "-o", tmp_path / "out.npz")
    assert code == 2 and one_line(err, "run")
    assert not (tmp_path / "out.npz").exists()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_host_node_variants_are_refused_by_lint_naming_the_rule(capsys, tmp_path, variant):
    text, fragment = VARIANTS[variant]
    p = tmp_path / f"{variant}.ir"
    p.write_text(text)
    t0 = time.monotonic()
    with within(BOUND_S, variant):
        code, _, err = run(capsys, "explain", p)
    assert code == 2, err
    line = one_line(err, "explain")
    assert fragment in line and "%9 (onnx_op)" in line, line
    assert time.monotonic() - t0 < BOUND_S


@pytest.mark.parametrize("variant", ["constant_of_shape_huge", "loop_labelled_loop", "huge_opset"])
def test_time_of_a_variant_is_refused_before_anything_runs(capsys, tmp_path, variant):
    p = tmp_path / f"{variant}.ir"
    p.write_text(VARIANTS[variant][0])
    with within(BOUND_S, variant):
        code, _, err = run(capsys, "time", p, "-r", "1", "--warmup", "0")
    assert code == 2 and VARIANTS[variant][1] in one_line(err, "time")


def test_a_host_node_that_keeps_the_rules_runs_with_onnx_runtimes_numbers(capsys, tmp_path):
    g = parse_ir(_ir(_hardmax(), "Hardmax"))
    assert problems(g) == []
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    from rlxviz.runtime import run_reference

    got = run_reference(g, {"x": x}, {})[0]
    want = (x == x.max(axis=-1, keepdims=True)).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    p = tmp_path / "ok.ir"
    p.write_text(format_graph(g))
    code, out, err = run(capsys, "explain", p)
    assert code == 0 and "Hardmax" in out, err


def test_a_const_operand_is_read_by_the_inference():
    """ConstantOfShape of a const [2, 8] declared f32[2, 8] is the inferred type: accepted (its value is known)."""
    text = _ir(encode(helper.make_node("ConstantOfShape", ["s"], ["y"])), "ConstantOfShape", operands="%1",
               pre=("%1 = const {value=[2, 8]} : i64[2]",))
    assert problems(parse_ir(text, verify=False)) == []


def test_the_importer_and_lint_share_one_rule_list():
    """Every op of the never-on-host list is refused by the one form rule (the importer's `_host_op` calls it)."""
    for op in NEVER_ON_HOST | {"SequenceAt", "ConcatFromSequence"}:
        assert form_refusal(helper.make_node(op, ["x"], ["y"])) is not None, op
    assert form_refusal(helper.make_node("Hardmax", ["x"], ["y"])) is None
    from rlxviz.models.onnx import host

    assert host._host_op.__code__.co_names.count("form_refusal") == 1
    assert "inferred_types" in host._host_op.__code__.co_names


def test_an_imported_host_node_with_a_constant_shape_input_still_lints(tmp_path):
    """A host node whose output shape ONNX infers from a constant input of several elements (Resize's sizes, held
    as a param) lints after import: the importer hands lint the small weights' values."""
    import onnx

    from rlxviz.models.onnx import load_onnx

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    sizes = onnx.numpy_helper.from_array(np.asarray([1, 2, 8, 8], np.int64), "sizes")
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest")
    m = helper.make_model(helper.make_graph([node], "g", [x], [y], initializer=[sizes]),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "r.onnx")
    model = load_onnx(tmp_path / "r.onnx")
    hosts = [n for n in model.graph if n.op == Op.ONNX_OP]
    if not hosts:
        pytest.skip("Resize is mapped by the importer here: no host node to check")
    assert hosts[0].shape == (1, 2, 8, 8)
    assert problems(model.graph) == []


def test_onnx_op_problem_is_cached_across_lints():
    attrs = {"node": _hardmax(), "op_type": "Hardmax", "opset": 17, "shape": (2, 8), "dtype": "f32"}
    from rlxviz.ir.dtype import DType

    assert onnx_op_problem(attrs, [(DType.f32, (2, 8))], [None]) is None
    t0 = time.perf_counter()
    for _ in range(200):
        onnx_op_problem(attrs, [(DType.f32, (2, 8))], [None])
    assert time.perf_counter() - t0 < 0.5


class _SlowSession:
    """An ONNX Runtime session stand-in whose run works until its RunOptions' terminate flag is set."""

    def run(self, names, feeds, ro):
        t0 = time.monotonic()
        while not ro.terminate:
            if time.monotonic() - t0 > 5:
                return [np.zeros(1)]
            time.sleep(0.01)
        raise RuntimeError("Exiting due to terminate flag being set to true.")


def test_a_host_evaluation_is_stopped_at_its_time_limit(monkeypatch):
    monkeypatch.setattr(host, "HOST_SECONDS", 0.2)
    monkeypatch.setattr(host, "_ort_session", lambda *a: _SlowSession())
    attrs = {"node": _hardmax(), "op_type": "Hardmax", "opset": 17, "shape": (2, 8), "dtype": "f32"}
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"onnx_op Hardmax: the host evaluation took over 0.2 s; stopped"):
        host.evaluate(attrs, [np.ones((2, 8), np.float32)])
    assert time.monotonic() - t0 < 2


def test_a_host_output_of_another_shape_than_declared_is_refused(monkeypatch):
    """Lint makes the declared type the inferred one; should an engine still give another shape, it is refused."""
    attrs = {"node": _hardmax(), "op_type": "Hardmax", "opset": 17, "shape": (4, 8), "dtype": "f32"}
    with pytest.raises(ValueError, match=r"gave shape \[2, 8\] where the node declares \[4, 8\]"):
        host.evaluate(attrs, [np.ones((2, 8), np.float32)])


def test_onnx_runtime_prints_nothing_raw(capfd):
    """Host sessions are made with the quiet options: a session ORT refuses (no float64 Hardmax kernel) and the
    fallback print nothing to the terminal."""
    attrs = {"node": _hardmax(), "op_type": "Hardmax", "opset": 17, "shape": (2, 8), "dtype": "f64"}
    host.evaluate(attrs, [np.ones((2, 8), np.float64)])
    assert host.ort_options().log_severity_level == host.QUIET
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_a_node_that_crashes_onnx_shape_inference_is_refused_not_the_process(capsys, tmp_path):
    """GatherND with batch_dims -5 segfaults ONNX's shape inference (onnx 1.2x): lint checks host nodes in a forked
    child, so the file is refused in one line naming the node, and the process goes on."""
    node = encode(helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=-5))
    p = tmp_path / "gnd.ir"
    p.write_text(_ir(node, "GatherND", operands="%0, %1", declared="f32[2]", shape="[2]",
                     pre=('%1 = input {name="i"} : i64[2, 1]',)))
    with within(BOUND_S, "explain gnd.ir"):
        code, _, err = run(capsys, "explain", p)
    assert code == 2, err
    line = one_line(err, "explain")
    assert "%9 (onnx_op)" in line and "GatherND cannot run on the host" in line, line
    # the crash is undefined behaviour in ONNX: the child dies by a signal, runs out of its memory, or a corrupt length
    # raises first (seen in CI: "ValueError: basic_string::_M_create"); each is said, and the process goes on
    assert any(w in line for w in ("crashed (SIG", "MemoryError", "refuses it (")), line


def test_forked_says_how_the_child_ended():
    import os
    import signal

    from rlxviz.ir.host_rules import ForkedFailure, forked

    assert forked(lambda: "x" * 300_000, 10) == "x" * 300_000  # longer than a pipe's buffer
    with pytest.raises(ForkedFailure) as e:
        forked(lambda: os.kill(os.getpid(), signal.SIGSEGV) or "", 10)
    assert e.value.said() == "crashed (SIGSEGV)"
    t0 = time.monotonic()
    with pytest.raises(ForkedFailure) as e:
        forked(lambda: time.sleep(30) or "", 0.3)
    assert e.value.timed_out and e.value.said() == "took over 0.3 s" and time.monotonic() - t0 < 5

    def boom() -> str:
        raise RuntimeError

    with pytest.raises(ForkedFailure) as e:
        forked(boom, 10)
    assert e.value.said() == "failed"



def _crash_on_gathernd(monkeypatch) -> None:
    """Make the host-node check crash (SIGSEGV) on every GatherND node, in the forked children too: ONNX's own crash
    on GatherND(batch_dims=-5) is undefined behaviour (a SIGSEGV, or under load a MemoryError first)."""
    import os
    import signal

    from rlxviz.ir import host_rules

    real_problem = host_rules._problem

    def crash(text, label, *rest):
        if label == "GatherND":
            os.kill(os.getpid(), signal.SIGSEGV)
        return real_problem(text, label, *rest)

    monkeypatch.setattr(host_rules, "_problem", crash)

def test_one_crashing_node_among_good_ones_is_named_alone(monkeypatch):

    from rlxviz.ir.dtype import DType
    from rlxviz.ir.host_rules import onnx_op_problems

    _crash_on_gathernd(monkeypatch)

    good = {"node": _hardmax(name="fresh_one"), "op_type": "Hardmax", "opset": 17, "shape": (2, 8), "dtype": "f32"}
    bad = {"node": encode(helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=-5, name="b2")),
           "op_type": "GatherND", "opset": 17, "shape": (2,), "dtype": "f32"}
    found = onnx_op_problems([(good, [(DType.f32, (2, 8))], [None]),
                              (bad, [(DType.f32, (2, 8)), (DType.i64, (2, 1))], [None, None])])
    # ONNX's own shape inference on this node is undefined behaviour (a SIGSEGV, or under load a MemoryError, or
    # a third end once): the child is crashed here on purpose, and the bad node alone is named
    assert found[0] is None and "crashed (SIGSEGV)" in str(found[1]), found


def test_mutants_of_a_host_node_are_refused_by_lint_or_run_as_declared():
    """60 seeded mutants of a valid Hardmax `onnx_op` (its node bytes, label, opset, declared shape and dtype):
    lint raises nothing and either refuses the node, or the reference runs it to the declared type (or refuses the
    run in one ValueError line). Bounded: the whole walk within 30 s."""
    import random

    from rlxviz.runtime import run_reference

    rng = random.Random(40)
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    base = base64.b64decode(_hardmax())
    accepted = refused = 0
    with within(30, "host node mutants"):
        for _ in range(60):
            raw, label, opset, shape, dtype = bytearray(base), "Hardmax", 17, (2, 8), "f32"
            field = rng.choice(["none", "bytes", "label", "opset", "shape", "dtype"])  # one field per mutant
            if field == "bytes":
                for _ in range(rng.randint(1, 3)):
                    raw[rng.randrange(len(raw))] = rng.randrange(256)
            elif field == "label":
                label = rng.choice(["Relu", "Loop", "", "hardmax"])
            elif field == "opset":
                opset = rng.choice([13, 21, 22, 1, 10**6])
            elif field == "shape":
                shape = rng.choice([(8, 2), (4000, 4000), (2, 8, 1), (16,)])
            elif field == "dtype":
                dtype = rng.choice(["f64", "i64", "bool"])
            text = _ir(base64.b64encode(bytes(raw)).decode(), label, opset=opset,
                       declared=f"{dtype}[{', '.join(map(str, shape))}]", shape=f"[{', '.join(map(str, shape))}]",
                       dtype=dtype)
            g = parse_ir(text, verify=False)
            found = problems(g)
            if found:
                refused += 1
                assert all(isinstance(m, str) and m for _, m in found)
                continue
            accepted += 1
            try:
                (out,) = run_reference(g, {"x": x}, {})
            except ValueError as e:
                assert len(str(e).splitlines()) == 1, e
                continue
            assert out.shape == shape and str(out.dtype) == {"f32": "float32", "f64": "float64", "i64": "int64",
                                                             "bool": "bool"}[dtype]
    assert refused >= 20 and accepted >= 5, (refused, accepted)


def test_a_crash_among_many_nodes_is_found_by_halves_and_a_timeout_is_not_split(monkeypatch):

    from rlxviz.ir import host_rules
    from rlxviz.ir.dtype import DType

    children = []
    real = host_rules.forked

    def counting(check, seconds):
        children.append(1)
        return real(check, seconds)

    monkeypatch.setattr(host_rules, "forked", counting)
    _crash_on_gathernd(monkeypatch)
    goods = [({"node": _hardmax(name=f"h{i}_{time.monotonic_ns()}"), "op_type": "Hardmax", "opset": 17,
               "shape": (2, 8), "dtype": "f32"}, [(DType.f32, (2, 8))], [None]) for i in range(15)]
    bad = ({"node": encode(helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=-5,
                                            name=f"b{time.monotonic_ns()}")),
            "op_type": "GatherND", "opset": 17, "shape": (2,), "dtype": "f32"},
           [(DType.f32, (2, 8)), (DType.i64, (2, 1))], [None, None])
    found = host_rules.onnx_op_problems([*goods[:7], bad, *goods[7:]])
    assert [f is None for f in found] == [True] * 7 + [False] + [True] * 8
    assert "crashed (SIGSEGV) on this node" in found[7]
    assert len(children) <= 1 + 2 * 4 + 1, len(children)  # halves: about 2 log2(16) children, not 16

    monkeypatch.setattr(host_rules, "LINT_SECONDS", 0.2)
    monkeypatch.setattr(host_rules, "_problem", lambda *a: time.sleep(5))  # in the forked child: past its deadline
    children.clear()
    slow = [({**g[0], "node": _hardmax(name=f"s{i}_{time.monotonic_ns()}")}, g[1], g[2]) for i, g in enumerate(goods)]
    found = host_rules.onnx_op_problems(slow)
    assert len(children) == 1 and all("took over 0.2 s on this graph's 15 host nodes" in f for f in found), found


def test_an_onnx_reference_evaluation_is_waited_for_at_most_its_time_limit(monkeypatch):
    """Where ONNX Runtime has no kernel (Hardmax in float64, the oracle's), onnx.reference runs the node; the caller
    waits for it at most HOST_SECONDS and gets one line."""
    monkeypatch.setattr(host, "HOST_SECONDS", 0.2)
    monkeypatch.setattr(host, "_reference", lambda *a: time.sleep(3) or [])
    attrs = {"node": _hardmax(name="slow_ref"), "op_type": "Hardmax", "opset": 17, "shape": (2, 8), "dtype": "f64"}
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"onnx_op Hardmax: the host evaluation took over 0.2 s; stopped"):
        host.evaluate(attrs, [np.ones((2, 8), np.float64)])
    assert time.monotonic() - t0 < 2


def test_an_onnx_reference_error_reaches_the_caller_in_one_line(monkeypatch):
    def fails(*a):
        raise RuntimeError("no such op here\nsecond line")

    monkeypatch.setattr(host, "_reference", fails)
    attrs = {"node": _hardmax(name="bad_ref"), "op_type": "Hardmax", "opset": 17, "shape": (2, 8), "dtype": "f64"}
    with pytest.raises(ValueError, match=r"failed \(RuntimeError: no such op here\)$"):
        host.evaluate(attrs, [np.ones((2, 8), np.float64)])


def test_a_timeout_counts_a_two_output_node_once(monkeypatch):
    """Lint checks a TopK's values and indices (two `onnx_op` nodes over one ONNX node) as two checks; a time-out
    names that one node ("on this node"), not "this graph's 2 host nodes"."""
    from rlxviz.ir import host_rules
    from rlxviz.ir.dtype import DType

    monkeypatch.setattr(host_rules, "LINT_SECONDS", 0.2)
    monkeypatch.setattr(host_rules, "_problem", lambda *a: time.sleep(5))  # in the forked child: past its deadline
    node = encode(helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1, name=f"t{time.monotonic_ns()}"))
    checks = [({"node": node, "op_type": "TopK", "opset": 17, "output": k, "shape": (2, 2), "dtype": dt},
               [(DType.f32, (2, 8)), (DType.i64, (1,))], [None, np.asarray([2], np.int64)])
              for k, dt in ((0, "f32"), (1, "i64"))]
    found = host_rules.onnx_op_problems(checks)
    assert all(f is not None and f.endswith("took over 0.2 s on this node") for f in found), found
