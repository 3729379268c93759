"""A pre-norm layer's residual-norm refusal is excused in true words (a newcomer run: llama-block, falcon, gpt-neox,
granite, optimum.llama-with-past said `pre-norm layout: the residual sum also feeds the next residual add, so it cannot
be fused`). It can: residual add + norm that also returns the sum is the standard LLaMA fusion (vLLM's
fused_add_rms_norm). What stops it is rlxviz's rule, which builds only the op's single-output form; the words say so
and name the compiler fix (a rule that builds the op's `with_sum` form, `test_residual_sum_fix_words`). Which places
count is unchanged: only the words are."""

from __future__ import annotations

from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.models import load_model
from rlxviz.passes import PASSES, Pipeline
from rlxviz.passes.why import policy
from rlxviz.passes.why.kinds import LayerArchitecture
from rlxviz.passes.why.verdict import RunVerdict

ONNX = Path(__file__).parent / "fixtures" / "onnx"


def _true_words(why: str, product: str) -> None:
    assert "cannot be fused" not in why, why
    assert f"builds only the single-output {product}, which returns the normalized value" in why, why
    assert f"rule that builds {product}(with_sum=true)" in why and "the op already has" in why, why


@pytest.mark.parametrize("kind", ["llama", "pre_ln", "parallel"])
@pytest.mark.parametrize("pass_name", ["fuse_residual_ln", "fuse_residual_rms_norm"])
def test_every_pre_norm_excuse_names_the_op_and_its_fix(kind, pass_name):
    arch = LayerArchitecture(kind, f"a {kind} layer", mask="causal")
    layout = "parallel block: " if kind == "parallel" else "pre-norm layout: "  # test_parallel_block_words
    for guard in ("sum_single_user", "biased_single_user"):
        why = policy.not_expected(arch, pass_name, guard)
        assert why is not None and why.startswith(layout)  # still excused: the count is the same
        _true_words(why, PASSES[pass_name].product)


@pytest.mark.parametrize("model", ["llama-block", str(ONNX / "llama.onnx"), str(ONNX / "gpt2.onnx")])
def test_explain_words_the_pre_norm_excuse_truly(capsys, model):
    code, out, err = cli_run(capsys, "explain", model)
    assert "Traceback" not in err and code in (0, 1), err
    lines = [ln for ln in out.splitlines() if "pre-norm layout" in ln]
    assert lines, out
    for ln in lines:
        product = "FusedResidualRmsNorm" if "fuse_residual_rms_norm" in ln else "FusedResidualLN"
        _true_words(ln.split("why it is not expected here: ", 1)[1], product)


def test_the_llama_block_still_counts_as_fused():
    """Only the words changed: the llama block's layer is fused as expected, its residual-norm refusal not counted."""
    v = RunVerdict.of(Pipeline.canonical().run(load_model("llama-block").graph))
    (lv,) = v.layers
    assert v.ok and lv.fused and lv.first is None
    fix = "builds FusedResidualRmsNorm(with_sum=true)"
    assert any("fuse_residual_rms_norm" in x and fix in x for x in lv.not_expected)
