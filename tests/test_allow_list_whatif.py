"""An allow-list compiler fix is checked by making it (`passes.whatif._allowed_attempt`), not by passing its guard.

albert.ortopt's layer 0 is refused at `fc1_activation` (gelu_tanh is off the epilogue allow-list). Passing that guard
alone left the gelu_tanh a separate node, so the next failure was `fc2_is_fused_linear` about fc1 itself, dropped as
covered: the check said the fix was enough, though the layer's second norm adds its bias after the residual. The
what-if now re-runs the pipeline with gelu_tanh allow-listed (scoped: `allow_list.allowing`), so fc1 takes its
epilogue and the layer rule's real next failure, the residual bias (`fc2_bias_after_residual`, the form of
`ln2_no_bias` seen from FFN.2), is named. A model where the allow-list fix alone suffices (albert's plain export)
still says nothing more.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.passes.allow_list import allowing, epilogue_allowed
from rlxviz.passes.guard import EPILOGUE_ACTIVATIONS
from rlxviz.passes.whatif import allow_list_fix, without_guard
from rlxviz.passes.why.caveat import fix_blocker

ONNX = Path(__file__).parent / "fixtures" / "onnx"
ORTOPT = ONNX / "ortopt" / "albert.ortopt.onnx"
PLAIN = ONNX / "zoo" / "albert.dynamo-eager.onnx"
RULE = "fuse_transformer_layer.bert_post_ln"
RESIDUAL_BIAS = "FusedTransformerLayer with a bias added after each residual add"


@functools.cache
def _trace(path: Path):
    return Pipeline.canonical().run(load_onnx(str(path), batch=2, seq=8).graph)


def _fc1_refusals(trace):
    return [(k, r) for k, s in enumerate(trace.steps) for r in s.rejections
            if r.rule == RULE and r.guard == "fc1_activation" and r.headline]


def test_the_what_if_allow_list_is_scoped():
    assert epilogue_allowed() == EPILOGUE_ACTIVATIONS and "gelu_tanh" not in EPILOGUE_ACTIVATIONS
    with pytest.raises(RuntimeError), allowing("gelu_tanh"):
        assert epilogue_allowed() == (*EPILOGUE_ACTIVATIONS, "gelu_tanh")
        raise RuntimeError
    assert epilogue_allowed() == EPILOGUE_ACTIVATIONS


def test_the_gelu_tanh_fix_at_albert_ortopt_layer_0_is_not_enough():
    trace = _trace(ORTOPT)
    (k, r), = _fc1_refusals(trace)
    assert r.layer == 0 and allow_list_fix(r) == "gelu_tanh"
    left = without_guard(trace, k, r)
    assert left and left[0][0] == "fc2_bias_after_residual", left
    assert fix_blocker(trace, RULE, r.anchor, r.guard) == \
        f"fc2_bias_after_residual (a gap in rlxviz's ops: {RESIDUAL_BIAS})"
    assert epilogue_allowed() == EPILOGUE_ACTIVATIONS  # the check left no list patched


def test_explain_says_so_for_both_layers(capsys):
    code, text, _ = cli_run(capsys, "explain", ORTOPT, "-v")
    assert code == 0
    head = next(line for line in text.splitlines() if line.startswith("albert.ortopt"))
    assert "a fix alone is not enough in 2 of them" in head, head
    assert f"alone, fc2_bias_after_residual (a gap in rlxviz's ops: {RESIDUAL_BIAS}) fails next" in head, head
    # each form with what its own fix leaves failing (both forms' fixes named before both blockers read as if fixing
    # both were not enough, newcomer run 29)
    assert f"with the fix for {RESIDUAL_BIAS} alone, fc1_activation" in head, head
    layer0 = next(line for line in text.splitlines() if "(fc1_activation) @" in line)
    assert "@0.attention" in layer0
    assert f"alone it is not enough: fc2_bias_after_residual (a gap in rlxviz's ops: {RESIDUAL_BIAS}) fails next" \
        in layer0, layer0
    # layer 1 keeps its own words: the residual-bias fix alone leaves the gelu_tanh epilogue
    assert "alone it is not enough: fc1_activation (a gap in rlxviz's ops: FusedTransformerLayer with a gelu_tanh " \
           "epilogue) fails next" in text


def test_where_the_gelu_tanh_fix_suffices_it_still_says_so(capsys):
    trace = _trace(PLAIN)
    refused = _fc1_refusals(trace)
    assert len(refused) == 2
    for k, r in refused:
        assert without_guard(trace, k, r) == [] and fix_blocker(trace, RULE, r.anchor, r.guard) == ""
    code, text, _ = cli_run(capsys, "explain", PLAIN, "-v")
    assert code == 0 and "not enough" not in text and "checked at this rule alone" not in text
