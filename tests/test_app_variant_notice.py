"""The teaching variant's notice (`app.variantnote`, out of `app.runs` so that module keeps room under the size
limit): the message after a load is `variant_notice`'s text, which says what the variant is meant to show and
whether the run agrees (`variant_meant`), and selects the variant's layer."""

from __future__ import annotations

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.app.variantnote import variant_meant, variant_notice
from rlxviz.app.wording import VARIANT_LABELS


@pytest.mark.parametrize("variant,meant", [
    ("extra_h1_user", "meant to break the fusion"),
    ("dead_h1_user", "meant to break the fusion"),
    ("swapped_residual", "meant to keep the fusion: the rules should still fuse it"),
])
def test_the_message_after_a_variant_is_the_notice(variant, meant):
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.apply_variant(variant)
    assert variant_meant(s) == meant  # the run agrees: no "; yet ..."
    text = variant_notice(s)
    assert text.startswith(f"Teaching variant '{VARIANT_LABELS[variant]}' ({meant}):"), text
    assert s.message.endswith(text) and s.message_kind == "info"
    assert s.selected_layer == s.variant_layer


def test_a_layer_fused_as_far_as_legal_names_its_illegal_refusal():
    """extra_h1_user's probe is returned: the layer op is illegal there, its parts fused. The notice said "no pass
    rejected anything in layer 0" and "meant to break the fusion; yet it fused" (newcomer run 11's rule change)."""
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.apply_variant("extra_h1_user")
    text = variant_notice(s)
    assert "yet it fused" not in text and "no pass rejected anything" not in text, text
    assert "layer 0 fused as far as legal; fuse_transformer_layer.bert_post_ln is illegal here (guard " \
           "h1_user_count)" in text, text
