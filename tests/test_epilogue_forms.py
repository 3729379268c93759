"""Today's MLP activations in the fused epilogue (issue 37, item 7): squared ReLU and GeGLU.

* squared ReLU (Primer, Nemotron), `relu(h) * relu(h)` or `pow(relu(h), 2)`: `canonicalize_exported.relu2` makes
  it the primitive `relu2`, which `fuse_matmul_bias_act` takes as an epilogue (with a bias or, bias-less, a zero
  one). Where the relu is read elsewhere the square is not rewritten and the rejection names why.
* GeGLU (T5 v1.1 gated-gelu, Gemma): `gelu(x @ wg) * (x @ wu)` (erf or tanh GELU, dual matmul or one packed
  projection) -> `FusedSwiGLU(activation=gelu | gelu_tanh)`, the one gated-linear op.

Cases are IR text files in `tests/data/epilogue` (the first line says the right outcome); numbers are checked
with the project's judge (`runtime.compare.check_versions` over the input battery, on MLX, every version) and on
the NumPy reference, where the rewrites are bit-exact. One form of each is also an ONNX file built with
`onnx.helper`, imported, and compared with ONNX Runtime.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from clirun import run as cli_run
from onnx import TensorProto, helper, numpy_helper
from test_activation_forms import clip_like

from rlxviz.ir import Graph, Op, parse_ir
from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline, missed_fusions
from rlxviz.passes.guard import EPILOGUE_ACTIVATIONS
from rlxviz.runtime import run_reference
from rlxviz.runtime.battery import battery
from rlxviz.runtime.compare import check_versions
from rlxviz.runtime.lowering import KERNEL_ACTS
from rlxviz.runtime.precision import precision_policy

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "data" / "epilogue"
KERNELS = ROOT / "rlxviz" / "kernels" / "src"


def case(name: str) -> Graph:
    return parse_ir((CASES / f"{name}.rlx").read_text())


def _feeds_weights(g: Graph, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    feeds = {n.name: rng.standard_normal(n.shape).astype(n.dtype.numpy) for n in g.inputs}
    w = {n.name: (rng.standard_normal(n.shape) / np.sqrt(n.shape[0])).astype(n.dtype.numpy) for n in g.params}
    return feeds, w


def numbers_unchanged(g: Graph, bit_exact: bool = True):
    """Every version of the canonical pipeline judged as the unfused graph is on each input set of the battery (MLX,
    `check_versions`: no pass changed the numbers; a half-precision FFN may itself lose precision or overflow on
    large inputs, which the judge blames on no pass), and, where `bit_exact`, equal bit for bit on the NumPy
    reference."""
    t = Pipeline.canonical().run(g)
    assert not [s.error for s in t.steps if s.error]
    feeds, w = _feeds_weights(g)
    versions = t.versions()
    verdicts = check_versions(versions, battery(g, feeds), w, precision_policy(g))
    base = [c.status for c in verdicts[0].checks]
    for (label, _), v in zip(versions, verdicts, strict=True):
        assert [c.status for c in v.checks] == base and v.changed_by is None and "fusion" not in base, (label, v.note)
    if g.inputs[0].dtype.value == "f32":
        assert set(base) == {"ok"}, verdicts[0].note
    if bit_exact:
        want = run_reference(g, feeds, w)
        for label, v in versions[1:]:
            for a, b in zip(want, run_reference(v, feeds, w), strict=True):
                np.testing.assert_array_equal(b, a, err_msg=label)
    return t


def _fused(t, op: Op) -> list:
    return t.final.find(op)


# -- the one table and the kernels' list ---------------------------------------------------------------------------

def _cpp_acts() -> tuple[set[str], set[str]]:
    """(`enum class Act` members in act.h, the names `parse_act` accepts in common.h)."""
    enum = re.search(r"enum class Act \{([^}]*)\}", (KERNELS / "act.h").read_text())
    assert enum is not None
    members = {m.strip() for m in enum.group(1).split(",") if m.strip()}
    parsed = set(re.findall(r'if \(act == "(\w+)"\) return Act::(\w+);', (KERNELS / "common.h").read_text()))
    assert all(a == b for a, b in parsed), parsed  # each name maps to the member of that name
    return members, {a for a, _ in parsed}


def test_the_kernels_activation_list_matches_the_python_one():
    members, names = _cpp_acts()
    assert members == names == KERNEL_ACTS | {"none"}
    # every epilogue activation has a kernel (an activation without one would run MLX's lowering after the
    # kernel-less linear: correct, but the epilogue would not be one pass)
    assert set(EPILOGUE_ACTIVATIONS) <= KERNEL_ACTS


# -- squared ReLU ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, bias", [("relu2-mul-bias", True), ("relu2-pow-nobias", False)])
def test_squared_relu_becomes_the_relu2_epilogue(name, bias):
    g = case(name)
    t = numbers_unchanged(g)
    (canon,) = [m for m in t.step("canonicalize_exported").matches if m.rule == "canonicalize_exported.relu2"]
    fused = [n for n in _fused(t, Op.FUSED_MATMUL_BIAS_ACT) if n.attrs["activation"] == "relu2"]
    assert len(fused) == 1 and not t.final.find(Op.RELU) and not t.final.find(Op.RELU2)
    assert t.final[fused[0].inputs[2]].op == (Op.PARAM if bias else Op.EXPAND)  # the zero bias when bias-less
    assert canon.rule == "canonicalize_exported.relu2"
    assert not missed_fusions(t)


def test_squared_relu_whose_relu_is_read_elsewhere_is_named():
    g = case("relu2-relu-read-twice")
    t = numbers_unchanged(g)
    assert t.final.find(Op.RELU) and not t.final.find(Op.RELU2)
    misses = {m.guard: m for m in missed_fusions(t)}
    assert misses["absorbed_escape"].kind == "illegal" and "reduce_mean" in misses["absorbed_escape"].reason
    assert misses["epilogue_activation"].kind == "not recognized"


@pytest.mark.parametrize("form", ["squared_relu", "squared_relu_pow"])
def test_a_layer_with_squared_relu_fuses_its_fc1_epilogue(form, tmp_path, capsys):
    """The CLIP-like pre-LN layer of `test_activation_forms` with squared ReLU: FC1 takes it (exit 0)."""
    path = tmp_path / "relu2.ir"
    path.write_text(clip_like(form))
    g = parse_ir(path.read_text())
    t = numbers_unchanged(g, bit_exact=False)  # the attention's fusions reorder sums: judged by the policy
    assert [n.attrs["activation"] for n in _fused(t, Op.FUSED_MATMUL_BIAS_ACT)].count("relu2") == 1
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 0 and "epilogue_activation" not in out, out


@pytest.mark.parametrize("gemm", [False, True])
def test_relu2_runs_in_the_cpu_kernels_epilogue(gemm):
    """On the CPU with rlxviz's kernels, FC1's relu2 runs in the bias_act kernel or the GEMM's store; the numbers
    equal MLX's own lowering and the reference (up to GEMM summation order)."""
    from rlxviz import kernels
    from rlxviz.runtime.executor import MlxExecutor
    from rlxviz.runtime.lowering import LoweringOptions

    g = case("relu2-mul-bias")
    fused = Pipeline.canonical().run(g).final
    feeds, w = _feeds_weights(g, 3)
    want = run_reference(g, feeds, w)[0]
    plain = MlxExecutor(LoweringOptions(kernels=False)).run(fused, feeds, w)[0]
    np.testing.assert_allclose(plain, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    if kernels.load() is None:
        pytest.skip(f"rlxviz CPU kernels not built here: {kernels.status()}")
    ex = MlxExecutor(LoweringOptions(kernels=True, gemm=gemm, compile_fused=False))
    got = ex.run(fused, feeds, w)[0]
    ran = ex.emitter.kernels_ran
    assert ("gemm+bias+relu2" if gemm else "bias+relu2") in ran, ran
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


# -- GeGLU ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, act, gate_first", [("geglu-erf-dual", "gelu", False),
                                                    ("geglu-tanh-dual", "gelu_tanh", False),
                                                    ("geglu-erf-packed-gate-first", "gelu", True)])
def test_geglu_becomes_fused_swiglu_with_its_gelu(name, act, gate_first, capsys):
    g = case(name)
    t = numbers_unchanged(g, bit_exact=False)  # the dual-matmul rule packs [wu | wg]: one GEMM, another order
    (n,) = _fused(t, Op.FUSED_SWIGLU)
    assert n.attrs["activation"] == act and n.attrs["gate_first"] == gate_first
    assert not t.final.find(Op.GELU) and not t.final.find(Op.GELU_TANH)
    assert not missed_fusions(t)
    code, out, _ = cli_run(capsys, "explain", CASES / f"{name}.rlx")
    assert code == 0 and "GeGLU" in out and "FusedSwiGLU=1" in out, out


def test_packed_geglu_is_exact_on_the_reference():
    """No GEMM is repacked when the projection is already one tensor: the fused op is bit-exact."""
    numbers_unchanged(case("geglu-erf-packed-gate-first"), bit_exact=True)


def test_a_gelu_scaled_by_a_constant_is_no_gate():
    """`gelu(h) * 0.5` is not a GLU: nothing fuses into FusedSwiGLU and the layer does not expect one."""
    from rlxviz.ir import Builder
    from rlxviz.passes.architecture import classify_layer

    b = Builder("gelu_scaled")
    x = b.input("x", (2, 4, 8))
    b.output(b.mul(b.gelu(b.matmul(x, b.param("w", (8, 16)))), 0.5))
    g = b.build()
    t = Pipeline.canonical().run(g)
    assert not t.final.find(Op.FUSED_SWIGLU)
    assert not classify_layer(g, None).swiglu


# -- ONNX files built with onnx.helper -----------------------------------------------------------------------------

def _onnx(tmp_path: Path, name: str, nodes, inits, opset: int = 18) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    m = helper.make_model(helper.make_graph(nodes, name, [x], [y], initializer=inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def _w(name: str, *shape: int, seed: int) -> object:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)


def _against_ort(path: Path) -> tuple:
    m = load_onnx(path, batch=2, seq=4)
    t = Pipeline.canonical().run(m.graph)
    feeds = {"x": np.random.default_rng(5).standard_normal((2, 4, 16)).astype(np.float32)}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for label, v in t.versions():
        got = run_reference(v, feeds, m.weights)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()), err_msg=label)
    return m, t


@pytest.mark.parametrize("square", ["Pow", "Mul"])
def test_onnx_squared_relu_mlp_fuses_relu2(tmp_path, square):
    # (an int64 exponent is left out: the importer reads Pow(f32, i64) as an f64 pow, wider than the relu, which
    # relu2 rightly does not take; ONNX's Pow keeps X's type, an importer fix)
    inits = [_w("w1", 16, 32, seed=1), _w("b1", 32, seed=2), _w("w2", 32, 16, seed=3),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    sq = (helper.make_node("Pow", ["r", "two"], ["s"]) if square == "Pow"
          else helper.make_node("Mul", ["r", "r"], ["s"]))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]), sq, helper.make_node("MatMul", ["s", "w2"], ["y"])]
    _, t = _against_ort(_onnx(tmp_path, f"relu2_{square.lower()}", nodes, inits))
    assert [n.attrs["activation"] for n in _fused(t, Op.FUSED_MATMUL_BIAS_ACT)] == ["relu2"]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_onnx_gelu_opset20_geglu_fuses(tmp_path, approximate):
    """ONNX `Gelu` (opset 20, both approximations) as the gate of a GeGLU."""
    inits = [_w("wg", 16, 32, seed=1), _w("wu", 16, 32, seed=2), _w("wd", 32, 16, seed=3)]
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"]), helper.make_node("MatMul", ["x", "wu"], ["u"]),
             helper.make_node("Gelu", ["g"], ["a"], approximate=approximate),
             helper.make_node("Mul", ["a", "u"], ["m"]), helper.make_node("MatMul", ["m", "wd"], ["y"])]
    _, t = _against_ort(_onnx(tmp_path, f"geglu_{approximate}", nodes, inits, opset=20))
    (n,) = _fused(t, Op.FUSED_SWIGLU)
    assert n.attrs["activation"] == ("gelu_tanh" if approximate == "tanh" else "gelu")


# -- GELU constants as half precision rounds them --------------------------------------------------------------------

@pytest.mark.parametrize("name, op", [("gelu-erf-f16-rounded", Op.GELU), ("gelu-erf-bf16-rounded", Op.GELU),
                                      ("gelu-tanh-f16-pow", Op.GELU_TANH), ("gelu-tanh-f16-cube", Op.GELU_TANH)])
def test_gelu_with_half_precision_constants_is_recognized(name, op):
    """torch writes sqrt(2), sqrt(2/pi) and 0.044715 as float16 / bfloat16 round them in a half-precision export:
    still GELU, to the dtype's own rounding (judged by that dtype's precision policy on MLX)."""
    g = case(name)
    t = numbers_unchanged(g, bit_exact=False)
    (m,) = t.step("canonicalize_gelu").matches
    assert m.rule == f"canonicalize_gelu.{'erf' if op == Op.GELU else 'tanh'}"
    assert not [r for r in t.rejections if r.guard == "gelu_constants"]
    if op == Op.GELU:
        assert [n.attrs["activation"] for n in _fused(t, Op.FUSED_MATMUL_BIAS_ACT)] == ["gelu", None]


def test_a_half_precision_constant_in_a_float32_chain_is_still_illegal():
    t = Pipeline.canonical().run(case("gelu-erf-f32-f16-constant"))
    (r,) = [r for r in t.rejections if r.guard == "gelu_constants"]
    assert r.kind == "illegal" and "1/sqrt(2) is 0.70718232" in r.message and "to 1e-6" in r.message
    assert not t.final.find(Op.GELU)


def test_a_wrong_constant_in_float16_is_named_with_the_dtype_tolerance():
    src = (CASES / "gelu-erf-f16-rounded.rlx").read_text().replace("{value=1.4140625}", "{value=1.5}")
    t = Pipeline.canonical().run(parse_ir(src))
    (r,) = [r for r in t.rejections if r.guard == "gelu_constants"]
    assert "to 0.000977 (the rounding of f16)" in r.message


@pytest.mark.parametrize("gate", ["gelu", "gelu_tanh", "silu"])
def test_a_llama_layer_with_a_gelu_gate_is_judged_like_swiglu(gate, tmp_path, capsys):
    """llama-block with its silu gate swapped for a GELU (a Gemma-style GeGLU MLP): the layer expects and gets
    FusedSwiGLU (with that activation); with the gate fusion switched off the verdict is a miss."""
    from rlxviz.ir.printer import format_graph
    from rlxviz.models import load_model
    from rlxviz.session.status import check_fusion

    src = format_graph(load_model("llama-block", seq=8).graph).replace("= silu(", f"= {gate}(")
    g = parse_ir(src)
    t = numbers_unchanged(g, bit_exact=False)
    (n,) = _fused(t, Op.FUSED_SWIGLU)
    assert n.attrs["activation"] == gate
    check = check_fusion(t, "geglu")
    assert check.ok, check.misses
    path = tmp_path / "geglu.ir"
    path.write_text(src)
    code, out, _ = cli_run(capsys, "explain", path)
    # (its causal attention is a form rlxviz's block lacks: "as far as rlxviz's ops go")
    assert code == 0 and "fused as far as rlxviz's ops go: FusedSwiGLU" in out, out
    assert ("GeGLU" in out) == (gate != "silu"), out
    gate_id = re.search(rf"%(\d+) = {gate}\(", src).group(1)  # the gate also returned: swiglu_single_use refuses
    held = parse_ir(re.sub(r"return (.*)", rf"return \1, %{gate_id}", src))
    missed = check_fusion(Pipeline.canonical().run(held), "geglu")
    (layer,) = missed.layers
    # the model reads the gate (a graph output): FusedSwiGLU is illegal here, so the layer is fused as far as legal
    # (issue 38) and the refusal is named, not counted
    assert missed.ok and "FusedSwiGLU" not in layer.expected  # expected: only what is legal here
    (refusal,) = [r for r in layer.illegal if r.guard == "swiglu_single_use"]
    assert refusal.kind == "illegal" and "gate activation (node " in refusal.message


@pytest.mark.parametrize("form", ["pow", "cube", "onnx_gelu"])
def test_onnx_tanh_gelu_after_a_linear_is_canonicalized_and_named(tmp_path, form):
    """tanh GELU as exporters write it after FC1 + bias (Tanh with Pow 3 or x*x*x; ONNX Gelu approximate=tanh at
    opset 20) becomes gelu_tanh; the fused linear names it (not recognized: the epilogue computes it, but it is
    off the allow-list, see `guard.EPILOGUE_ACTIVATIONS`); numbers equal ONNX Runtime's."""
    c = helper.make_node
    inits = [_w("w1", 16, 32, seed=1), _w("b1", 32, seed=2), _w("w2", 32, 16, seed=3)]
    for name, v in (("three", 3.0), ("k3", 0.044715), ("s", 0.7978845608028654), ("half", 0.5), ("one", 1.0)):
        inits.append(numpy_helper.from_array(np.array(v, np.float32), name))
    nodes = [c("MatMul", ["x", "w1"], ["h0"]), c("Add", ["h0", "b1"], ["h"])]
    if form == "onnx_gelu":
        nodes.append(c("Gelu", ["h"], ["a"], approximate="tanh"))
    else:
        nodes += ([c("Pow", ["h", "three"], ["h3"])] if form == "pow"
                  else [c("Mul", ["h", "h"], ["h2"]), c("Mul", ["h2", "h"], ["h3"])])
        nodes += [c("Mul", ["h3", "k3"], ["t0"]), c("Add", ["h", "t0"], ["t1"]), c("Mul", ["t1", "s"], ["t2"]),
                  c("Tanh", ["t2"], ["t3"]), c("Add", ["t3", "one"], ["t4"]), c("Mul", ["h", "half"], ["t5"]),
                  c("Mul", ["t5", "t4"], ["a"])]
    nodes.append(c("MatMul", ["a", "w2"], ["y"]))
    _, t = _against_ort(_onnx(tmp_path, f"gelu_tanh_{form}", nodes, inits, opset=20))
    assert t.final.find(Op.GELU_TANH)
    (r,) = [r for r in t.rejections if r.guard == "epilogue_activation"]
    assert r.kind == "not recognized" and "gelu_tanh" in r.message


def test_the_epilogue_fix_says_which_activations_already_have_kernels():
    """`fuse_matmul_bias_act`'s compiler fix for an activation off the allow-list says when the kernels already
    compute it (relu, gelu_tanh): the list it reads agrees with the kernels' list."""
    from rlxviz.passes.rules.linear import _HAS_KERNEL

    assert set(_HAS_KERNEL) == KERNEL_ACTS - set(EPILOGUE_ACTIVATIONS)


def test_fused_swiglu_activation_round_trips_and_a_bad_gate_is_one_line():
    from rlxviz.ir.printer import format_graph

    text = format_graph(Pipeline.canonical().run(case("geglu-tanh-dual")).final)
    assert 'FusedSwiGLU(%' in text and 'activation="gelu_tanh"' in text
    assert format_graph(parse_ir(text)) == text
    with pytest.raises(Exception, match=r"activation='relu' must be one of \['silu', 'gelu', 'gelu_tanh'\]"):
        parse_ir(text.replace('activation="gelu_tanh"', 'activation="relu"'))
    unfused = Pipeline(["unfuse"]).run(parse_ir(text)).final
    assert unfused.find(Op.GELU_TANH) and not unfused.find(Op.FUSED_SWIGLU)


def test_a_widened_square_of_a_relu_is_named_not_called_an_unknown_activation():
    """`pow(relu(h), 2)` whose result is wider than the relu (f64: how an int64 ONNX exponent imports today) is
    not relu2 (the rewrite keeps dtypes); the fused linear's rejection says so instead of asking for an op."""
    src = (CASES / "relu2-pow-nobias.rlx").read_text()
    src = src.replace("%5 = pow(%3, %4) : f32[2, 4, 32]", "%5 = pow(%3, %4) : f64[2, 4, 32]")
    src = src.replace("%7 = matmul(%5, %6) : f32[2, 4, 16]", "%7 = matmul(%5, %6) : f64[2, 4, 16]")
    src = src.replace("%9 = add(%7, %8) : f32[2, 4, 16]", "%9 = add(%7, %8) : f64[2, 4, 16]")
    src = src.replace("%4 = const {value=2.0} : f32[]", "%4 = const {value=2} : i64[]")
    t = Pipeline.canonical().run(parse_ir(src.replace("%2 = matmul(%0, %1) : f32[2, 4, 32]\n",
                                                      "%2 = matmul(%0, %1) : f32[2, 4, 32]\n  %20 = param "
                                                      "{name=\"b\"} : f32[32]\n  %21 = add(%2, %20) : f32[2, 4, 32]\n")
                                          .replace("relu(%2)", "relu(%21)")))
    assert not t.final.find(Op.RELU2)
    (r,) = [r for r in t.rejections if r.guard == "epilogue_activation"]
    assert "relu2 is on the epilogue allow-list" in r.message and "f64[2, 4, 32]" in r.message
    assert r.kind == "not recognized" and "an op for" not in r.fix
