"""codegen.qdyn's headline claimed the int8 block alone was enough (newcomer finding).

The layers' attention is refused at `qkv_packed`, a structure miss: the integer-matmul Q/K/V projections are no packed
projection. The gap is the layer trait's (`integer_qkv`), and no what-if builds that fix (`whatif.without_guard` knows
nothing of a structure miss), so the RoPE guards after it (interleaved, partial rotary: the float export
codegen.dynamo-eager's gaps) never ran. The headline said `a compiler fix, nothing in the model to change` with no
caveat, read as the one fix needed. Decision: where no what-if checks a trait gap's fix (`caveat.fix_unchecked`), the
headline and the gap line say so (`text.UNCHECKED_ALONE`, `caveat.UNCHECKED`); esm.qdyn, whose check finds
`qkv_packed` next, keeps its words."""

from __future__ import annotations

from pathlib import Path

from test_near_miss_rule import trace_of

from rlxviz.passes.why.caveat import UNCHECKED
from rlxviz.passes.why.text import GAP_IS_THE_COMPILERS, UNCHECKED_ALONE
from rlxviz.passes.why.verdict import RunVerdict

ONNX = Path(__file__).parent / "fixtures" / "onnx"
CODEGEN = ONNX / "zoo" / "codegen.qdyn.onnx"
ESM = ONNX / "cases" / "esm.qdyn.onnx"
INT8 = "FusedAttentionBlock over integer-matmul Q/K/V projections (dynamic quantization)"


def test_codegen_qdyn_headline_says_the_int8_fix_is_unchecked():
    v = RunVerdict.of(trace_of(CODEGEN))
    assert v.headline.endswith(f"(rlxviz lacks {INT8}: {GAP_IS_THE_COMPILERS}; "
                               f"{UNCHECKED_ALONE.format(n=len(v.layers))})"), v.headline
    assert all(g.unchecked and not g.blocker for s in v.layers for g in s.gaps)
    lines = [x for s in v.layers for x in s.gap_refusals]
    assert lines and all(x.endswith(f"; {UNCHECKED.format(guard='qkv_packed')})") for x in lines), lines


def test_esm_qdyn_keeps_its_checked_blocker_words():
    v = RunVerdict.of(trace_of(ESM))
    assert "not checked whether" not in v.headline and "a fix alone is not enough in 2 of them" in v.headline
    assert not any(g.unchecked for s in v.layers for g in s.gaps)
    assert not any("not checked whether" in x for s in v.layers for x in s.gap_refusals)
