"""The first rejection of a layer that deviates from its siblings names the deviation (a newcomer's run).

The pre-LN teaching variant turns bert-tiny's layer 0 pre-LN among post-LN siblings, and the layer is judged as they
are (`judged_kind`: FusedTransformerLayer expected). Its first rejection, the one the headline, the banner and the
Why tab name, was `fuse_residual_ln`'s `sum_single_user` (pipeline order): a consequence of the pre-LN layout, which
the layer's own kind does not count, not the variant's change. The verdict now names the refusal of the product the
judged kind expects and the layer's own kind does not expect at all (`policy.first_refusal`): FusedTransformerLayer's
`post_ln_order`; the residual refusal is still listed. A layer of its siblings' kind keeps the pipeline order.
"""

from __future__ import annotations

import json

import pytest
from clirun import run as cli_run
from test_app_views import tiny

from rlxviz.models import load_model
from rlxviz.models.bert import VARIANTS
from rlxviz.passes import Pipeline
from rlxviz.passes.why.verdict import RunVerdict, verdict_pass


def _verdict(preset: str, variant: str) -> RunVerdict:
    return RunVerdict.of(Pipeline.canonical().run(load_model(preset, seq=8, variant=VARIANTS[variant]).graph))


@pytest.mark.parametrize("preset", ["bert-tiny", "minilm-shaped"])
def test_a_pre_ln_layer_among_post_ln_siblings_is_refused_for_its_order_first(preset):
    lv = _verdict(preset, "pre_ln").layer(0)
    assert lv.architecture.kind == "pre_ln" and lv.expected_kind.post_ln and not lv.fused
    assert lv.first is not None and (lv.first.pass_name, lv.first.guard) == ("fuse_transformer_layer",
                                                                             "post_ln_order"), lv.first
    # the consequence is still listed: illegal for the layer (the next sublayer reads the sum), not counted
    assert any(o.guard == "sum_single_user" for o in lv.illegal)
    assert "illegal here (not counted): fuse_residual_ln.residual: sum_single_user" in lv.render()


@pytest.mark.parametrize("variant, guard", [("dead_h1_user", "h1_user_count")])  # tanh_gelu: a gap in rlxviz's
# ops, no first rejection (`test_compiler_only_gap`)
def test_a_layer_of_its_siblings_kind_keeps_the_pipeline_order(variant, guard):
    lv = _verdict("bert-tiny", variant).layer(0)
    assert lv.architecture == lv.expected_kind and lv.first is not None and lv.first.guard == guard


def test_text_json_drawing_and_why_tab_name_the_same_first_rejection(capsys):
    code, text, _ = cli_run(capsys, "explain", "bert-tiny", "--seq", 8, "--variant", "pre_ln", "--layer", 0)
    _, out, _ = cli_run(capsys, "explain", "bert-tiny", "--seq", 8, "--variant", "pre_ln", "--layer", 0, "--json")
    (d,) = json.loads(out)["layers"]
    assert code == 1 and d["first"]["guard"] == "post_ln_order" and d["first"]["rule"] == "fuse_transformer_layer." \
        "bert_post_ln"
    assert "  first rejection: fuse_transformer_layer.bert_post_ln\n    guard post_ln_order " in text, text
    s = tiny(variant="pre_ln")
    assert verdict_pass(s.trace, 0) == "fuse_transformer_layer"
    why = s.why_layer(0).replace("\\", "")  # markdown escapes
    assert "post_ln_order" in why and why.index("post_ln_order") < why.index("sum_single_user"), why
