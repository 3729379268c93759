"""A place the model's own term holds says its own *Why* (a newcomer run on marian.encdec): the inspector of decoder
layer 0's cross-attention (%308, `node_softmax_3` fused into it, mask="keep") read `guard self_attention ... *Why:*
nothing was refused: the fusion kept a computation of the model's own as an operand, exactly (an additive score term
...)`, words written for `fuse_sdpa`'s kept additive term (`mask_model_term`), while `fuse_attention_block` did refuse
there for cross-attention. `refusal_kinds.model_term_why`: the score-term words only for a score-term guard; a hard
refusal says it was refused for the model's own structure, with its own message."""

from __future__ import annotations

from test_inspector_layer_label import _load

from rlxviz.passes.refusal_kinds import KINDS, MODEL_STRUCTURE, MODEL_TERM, model_term_why
from rlxviz.passes.why.standing import standing

SCORE_WORDS = "an additive score term"


def test_model_term_why_words_each_refusal_as_its_own():
    assert model_term_why("mask_model_term", "m", True) == KINDS[MODEL_TERM]
    assert model_term_why("self_attention", "Q and K/V ...", False) == f"{MODEL_STRUCTURE}: Q and K/V ..."
    kept = model_term_why("gamma_computed", "the gamma add ...", True)
    assert kept.endswith(": the gamma add ...") and SCORE_WORDS not in kept


def test_marian_cross_attention_why_is_its_refusal_not_a_score_term():
    from rlxviz.app.panels import GraphCompare, NodeInspector

    s = _load("marian.encdec")
    s.version = s.param.version.bounds[1]
    (r,) = [r for st in s.trace.steps for r in st.rejections
            if r.guard == "self_attention" and r.anchor == 308]
    assert s.trace.final[308].attrs["mask"] == "keep"
    group, why = standing(s.trace, r)
    assert group == MODEL_TERM and why == f"{MODEL_STRUCTURE}: {r.message}"
    compare, drawer = GraphCompare(state=s), NodeInspector(state=s)
    compare.after.clicked = 308
    compare.after.clicks += 1
    text = drawer.pane.object.replace("\\", "")
    item = next(line for line in text.splitlines() if "**self_attention**" in line)
    said = item.split("*Why:* ", 1)[1]
    assert said.startswith(MODEL_STRUCTURE) and "Q and K/V come from different inputs" in said, item
    assert SCORE_WORDS not in text and "nothing was refused" not in item, item
