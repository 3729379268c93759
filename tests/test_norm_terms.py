"""What a fused norm keeps of the model, named (issue 21): Gemma's `* (1 + w)` is the norm's gamma (a constant w
folded to `1 + w` in its dtype; a parameter w keeps its [H] add outside, `gamma_computed`), and an eps constant
that rounds to 0 in its dtype is built as eps = 0 (`eps_rounds_to_zero`). Both are lines of `explain` and of
`explain --json`; every version keeps the unfused numbers (rows of zeros included)."""

import json

import numpy as np
import pytest
from clirun import run as cli_run
from test_unwritten_forms import equal_numbers, ops

from rlxviz.ir import Op, parse_ir
from rlxviz.ir.ops import operand_roles
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import run_mlx
from rlxviz.session.status import check_fusion

AT = " @model.layers.0.post_attention_layernorm"


def gemma_norm(weight: str = "param", residual: bool = True, one_first: bool = True, gamma_first: bool = False,
               layer_norm: bool = False, eps: str = 'const {value=1e-06} : f32[]') -> str:
    """An RMSNorm (or LayerNorm) scaled by `(1 + w)`, w a parameter or a constant."""
    x = "%2" if residual else "%0"
    lines = ['  %0 = input {name="hidden_states"} : f32[2, 4, 4]', '  %1 = input {name="residual"} : f32[2, 4, 4]',
             f"  %2 = add(%0, %1) : f32[2, 4, 4]{AT}"]
    if layer_norm:
        lines += [f"  %20 = reduce_mean({x}) {{axes=[2], keepdims=true}} : f32[2, 4, 1]{AT}",
                  f"  %21 = sub({x}, %20) : f32[2, 4, 4]{AT}"]
        x = "%21"
    lines += [f"  %3 = mul({x}, {x}) : f32[2, 4, 4]{AT}",
              f"  %4 = reduce_mean(%3) {{axes=[2], keepdims=true}} : f32[2, 4, 1]{AT}",
              f"  %5 = {eps}{AT}", f"  %6 = add(%4, %5) : f32[2, 4, 1]{AT}", f"  %7 = rsqrt(%6) : f32[2, 4, 1]{AT}",
              f"  %8 = mul({x}, %7) : f32[2, 4, 4]{AT}"]
    lines.append(f'  %9 = param {{name="post_attention_layernorm.weight"}} : f32[4]{AT}' if weight == "param"
                 else f"  %9 = const {{value=[0.5, -0.25, 0.1, 2.0]}} : f32[4]{AT}")
    lines.append(f"  %10 = const {{value=1.0}} : f32[]{AT}")
    lines.append(f"  %11 = add(%10, %9) : f32[4]{AT}" if one_first else f"  %11 = add(%9, %10) : f32[4]{AT}")
    scale = "mul(%11, %8)" if gamma_first else "mul(%8, %11)"
    lines.append(f"  %12 = {scale} : f32[2, 4, 4]{AT}")
    return "graph gemma_norm {\n" + "\n".join(lines) + "\n  return %12\n}\n"


def _zero_row_numbers(g, t) -> None:
    """Every version equals the unfused graph with a row of zeros in x (NaN where eps is 0, in both)."""
    rng = np.random.default_rng(2)
    feeds = {n.name: rng.standard_normal(n.shape).astype(np.float32) for n in g.inputs}
    feeds["hidden_states"][0, 0] = 0.0
    feeds["residual"][0, 0] = 0.0
    w = {n.name: rng.standard_normal(n.shape).astype(np.float32) for n in g.params}
    ref = run_reference(g, feeds, w)
    for label, v in t.versions()[1:]:
        for run in (run_reference, run_mlx):
            for a, b in zip(ref, run(v, feeds, w), strict=True):
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=f"{label} on {run.__name__}")


@pytest.mark.parametrize("kw", [{}, {"residual": False}, {"one_first": False, "gamma_first": True},
                                {"layer_norm": True}])
def test_gemma_gamma_of_a_parameter_is_the_norms_operand_and_named(capsys, tmp_path, kw):
    path = tmp_path / "g.ir"
    path.write_text(gemma_norm(**kw))
    g = parse_ir(path.read_text())
    t = equal_numbers(g)
    want = ("FusedResidualLN" if kw.get("layer_norm") else "FusedResidualRmsNorm") if kw.get("residual", True) \
        else "rms_norm"
    (norm,) = [n for n in t.final if n.op.value == want]
    roles = operand_roles(norm.op, norm.attrs, len(norm.inputs)) if want != "rms_norm" else ("x", "gamma")
    gamma = t.final[norm.inputs[roles.index("gamma")]]
    assert gamma.op == Op.ADD  # 1 + w, the norm's gamma operand
    assert ops(t.final).get("mul") is None  # the (1 + w) multiply is inside the norm
    assert check_fusion(t).ok
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 0 and "gamma_computed [the model's own term]" in out and "Gemma's 1 + w" in out
    code, out, _ = cli_run(capsys, "explain", path, "--json")
    assert any("gamma_computed" in x for x in json.loads(out)["left_out"])


@pytest.mark.parametrize("kw", [{}, {"one_first": False}])
def test_gemma_gamma_of_a_constant_is_folded(kw):
    g = parse_ir(gemma_norm(weight="const", **kw))
    t = equal_numbers(g)
    assert ops(t.final).get("add") is None and ops(t.final).get("mul") is None
    (norm,) = [n for n in t.final if n.op == Op.FUSED_RESIDUAL_RMS_NORM]
    gamma = t.final[norm.inputs[operand_roles(norm.op, norm.attrs, len(norm.inputs)).index("gamma")]]
    assert gamma.op == Op.CONST
    np.testing.assert_array_equal(np.asarray(gamma.attrs["value"], np.float32),
                                  np.float32(1.0) + np.asarray([0.5, -0.25, 0.1, 2.0], np.float32))
    assert not [r for r in t.rejections if r.guard == "gamma_computed"]


@pytest.mark.parametrize("eps", ['const {value=1e-08} : f16[]', 'const {value=1e-50} : f32[]'])
def test_an_eps_that_rounds_to_0_is_built_as_0_and_named(capsys, tmp_path, eps):
    path = tmp_path / "g.ir"
    path.write_text(gemma_norm(eps=eps))
    g = parse_ir(path.read_text())
    t = equal_numbers(g)
    (norm,) = [n for n in t.final if n.op == Op.FUSED_RESIDUAL_RMS_NORM]
    assert norm.attrs["eps"] == 0.0
    _zero_row_numbers(g, t)
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 0 and "eps_rounds_to_zero" in out and "rounds to 0 in" in out


def test_an_eps_its_dtype_holds_is_not_named():
    t = equal_numbers(parse_ir(gemma_norm(eps='const {value=1e-05} : f16[]')))
    (norm,) = [n for n in t.final if n.op == Op.FUSED_RESIDUAL_RMS_NORM]
    assert norm.attrs["eps"] == float(np.float16(1e-05))  # as f16 holds it, which the graph adds
    assert not [r for r in t.rejections if r.guard == "eps_rounds_to_zero"]
