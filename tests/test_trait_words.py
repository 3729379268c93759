"""A gap's source is said as what it is in the model, and two gaps are joined by "and" (newcomer report 17): esm.qdyn
read `default_scale (a gap in rlxviz's ops: FusedAttentionBlock over integer-matmul Q/K/V projections (dynamic
quantization) nor FusedAttentionBlock with ...)` and `(...: any refusal, the layer's trait integer_qkv)`, an internal
name. Now `its integer-matmul Q/K/V projections (integer_qkv)` (`declarations.trait_named`) wherever a trait is
shown: the text, `--json`'s `op_gaps`, the drawings' titles."""

from __future__ import annotations

import json
from pathlib import Path

from clirun import run

from rlxviz.passes.declarations import GAP_TRAIT_WORDS, trait_named
from rlxviz.passes.pipeline import PASSES

QDYN = Path(__file__).parent / "fixtures" / "onnx" / "cases" / "esm.qdyn.onnx"
WORDS = "its integer-matmul Q/K/V projections (integer_qkv)"


def test_every_trait_a_pass_lacks_a_product_under_has_words():
    lacked = {t for p in PASSES.values() for t, _, _ in p.lacks}
    assert lacked and lacked <= set(GAP_TRAIT_WORDS), lacked - set(GAP_TRAIT_WORDS)
    assert trait_named("integer_qkv") == WORDS


def test_esm_qdyn_says_its_trait_in_words_and_joins_its_gaps_with_and(capsys):
    code, out, err = run(capsys, "explain", QDYN, "-v")
    assert "the layer's trait" not in out and "any refusal, " not in out, out
    assert " nor FusedAttentionBlock" not in out, out
    assert ("a gap in rlxviz's ops: FusedAttentionBlock over integer-matmul Q/K/V projections (dynamic quantization) "
            "and FusedAttentionBlock with the scale applied to Q before RoPE") in out, out
    assert f"(fuse_attention_block.qkv_attention_out: {WORDS})" in out, out
    code, out, err = run(capsys, "explain", QDYN, "--json")
    gaps = [g for lv in json.loads(out)["layers"] for g in lv["op_gaps"]]
    assert gaps and any(g.endswith(f": {WORDS})") for g in gaps), gaps
    assert not any("the layer's trait" in g for g in gaps), gaps
