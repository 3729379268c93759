"""The session's pipeline builder checks `Pass.requires`; a silent pass is explained from rule data."""

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.models import load_model
from rlxviz.passes import CANONICAL_ORDER
from rlxviz.session import PipelineError, build_pipeline, layer_status, version_index


def test_a_pass_without_its_required_pass_is_refused_with_both_names():
    with pytest.raises(PipelineError, match="fuse_transformer_layer requires fuse_attention_block .* not in the "
                                           "pipeline; add or enable fuse_attention_block, or remove fuse_transformer"):
        build_pipeline("fuse_sdpa,fuse_matmul_bias_act,fuse_residual_ln,fuse_transformer_layer")
    with pytest.raises(PipelineError, match="fuse_attention_block requires fuse_matmul_bias_act"):
        build_pipeline(["fuse_sdpa", "fuse_attention_block"])
    with pytest.raises(PipelineError, match="unknown pass 'fuse_nothing'"):
        build_pipeline("fuse_sdpa,fuse_nothing")
    with pytest.raises(PipelineError, match="empty pipeline"):
        build_pipeline(" , ")
    assert build_pipeline([]).active() == [], "the app may switch every pass off"
    assert [p.name for p in build_pipeline("rlx").active()][-1] == "dead_code_elimination"


def test_the_app_says_which_required_pass_is_off():
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.toggle_pass(s.passes.index("fuse_matmul_bias_act"), False)
    assert s.message_kind == "danger" and "requires fuse_matmul_bias_act" in s.message, s.message
    s.reset_pipeline()
    assert s.message_kind != "danger" and s.trace.final.fused_op_counts()["FusedTransformerLayer"] == 2


def test_a_layer_pass_run_before_its_prerequisites_is_explained_from_the_rule_data():
    g = load_model("bert-tiny", seq=8, style="hf").graph  # no attention op until fuse_sdpa packs one
    rest = [p for p in CANONICAL_ORDER if p != "fuse_transformer_layer"]
    trace = build_pipeline(["fuse_transformer_layer", *rest]).run(g)
    st = layer_status(trace, 0)
    assert not st.fused and st.first is None
    assert st.silent.startswith("fuse_transformer_layer anchors on FusedAttentionBlock or attention, and layer 0 "
                                "held none when it ran (step 1); it requires fuse_attention_block")
    assert "no rejection: fuse_transformer_layer anchors on" in st.render()
    assert version_index(trace, "fuse_transformer_layer") == 1
