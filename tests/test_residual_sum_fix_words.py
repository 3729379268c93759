"""The residual norms' compiler fix names the missing rule, not a missing op (a newcomer run: deit, esm, gpt2, falcon,
granite, llama printed "rlxviz's FusedResidualLN returns only the normalized value, not the sum" with "compiler fix: a
two-output FusedResidualLN that also returns the sum (as vLLM's fused_add_rms_norm does)"). Both residual norms have
a two-output form, `with_sum=true` (`ir.ops`, `ir.fused._with_sum`), that parses and runs; what rlxviz lacks is a rule
that builds it. The words say so (`readers.residual_sum_fix`, `readers.single_output_why`) everywhere they are
printed, and a LayerNorm fix cites a LayerNorm precedent (ORT's SkipLayerNormalization), not vLLM's RMSNorm kernel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from clirun import run as cli_run

from rlxviz.ir import Op, parse_ir
from rlxviz.passes import PASSES
from rlxviz.passes.readers import residual_sum_fix, single_output_why
from rlxviz.passes.why import policy
from rlxviz.passes.why.kinds import LayerArchitecture
from rlxviz.runtime.reference import run_reference

GPT2 = Path(__file__).parent / "fixtures" / "onnx" / "gpt2.onnx"
PASS_OF = {Op.FUSED_RESIDUAL_LN: "fuse_residual_ln", Op.FUSED_RESIDUAL_RMS_NORM: "fuse_residual_rms_norm"}
FALSE = "returns only the normalized value"


@pytest.mark.parametrize("fused", list(PASS_OF))
def test_the_two_output_form_the_fix_names_exists_and_runs(fused):
    """The premise of the words: `{op}(...){with_sum=true}` parses and computes `[norm(x + r), x + r]`."""
    g = parse_ir(f"""graph two {{
  %0 = input {{name="x"}} : f32[2, 4]
  %1 = input {{name="r"}} : f32[2, 4]
  %2 = param {{name="gamma"}} : f32[4]
  %3 = param {{name="beta"}} : f32[4]
  %4 = {fused.value}(%0, %1, %2, %3) {{eps=1e-05, with_sum=true}} : f32[2, 8]
  return %4
}}""")
    rng = np.random.default_rng(0)
    x, r = rng.standard_normal((2, 4), dtype=np.float32), rng.standard_normal((2, 4), dtype=np.float32)
    ones = np.ones(4, np.float32)
    (out,) = run_reference(g, {"x": x, "r": r}, {"gamma": ones, "beta": 0 * ones})
    np.testing.assert_allclose(out[:, 4:], x + r, rtol=1e-6)


@pytest.mark.parametrize("fused", list(PASS_OF))
def test_the_fix_names_the_rule_and_a_precedent_of_its_norm_kind(fused):
    fix = residual_sum_fix(fused)
    assert f"a {PASS_OF[fused]} rule that builds {fused.value}(with_sum=true)" in fix, fix
    assert "the two-output form the op already has" in fix, fix
    precedent = "SkipLayerNormalization" if fused is Op.FUSED_RESIDUAL_LN else "fused_add_rms_norm"
    other = "fused_add_rms_norm" if fused is Op.FUSED_RESIDUAL_LN else "SkipLayerNormalization"
    assert precedent in fix and other not in fix, fix
    assert FALSE not in single_output_why(fused) and "builds only the single-output" in single_output_why(fused)


@pytest.mark.parametrize("kind, norms", [("llama", 0), ("pre_ln", 0), ("parallel", 1), ("parallel", 2)])
@pytest.mark.parametrize("pass_name", list(PASS_OF.values()))
def test_every_excuse_and_guard_fix_says_the_rule_is_missing(pass_name, kind, norms):
    fused = Op(PASSES[pass_name].product)
    arch = LayerArchitecture(kind, f"a {kind} layer", mask="causal", parallel_norms=norms)
    for guard in ("sum_single_user", "biased_single_user"):
        why = policy.not_expected(arch, pass_name, guard)
        assert why is not None and f"rlxviz's {fused.value} {FALSE}" not in why, why
        assert residual_sum_fix(fused) in why and single_output_why(fused) in why, why
    fixes = [s.fix for r in PASSES[pass_name].rules for s in r.steps if getattr(s, "name", "") == "sum_single_user"]
    assert fixes and all(residual_sum_fix(fused) in f and "two-output " + fused.value not in f for f in fixes), fixes


def test_gpt2_explain_prints_no_false_op_claim(capsys):
    code, out, err = cli_run(capsys, "explain", "-v", GPT2)
    assert "Traceback" not in err and code in (0, 1), err
    assert f"FusedResidualLN {FALSE}" not in out and "fused_add_rms_norm" not in out, out
    assert out.count("fuse_residual_ln rule that builds FusedResidualLN(with_sum=true)") >= 3, out
