"""convbert.qdyn's verdict names its integer-matmul Q/K/V gap, as mobilebert.qdyn's does (newcomer 38).

The headline read word for word as the float export's (convbert.optimum): `fuse_sdpa` refuses ConvBERT's attention
at `merge_reshape` (its head merge joins the convolution heads, a gap in rlxviz's ops), so no `attention` node forms,
`architecture.integer_qkv` (which read only an `attention` node) found no integer projections, and
`fuse_attention_block` had no anchor to refuse. Decision: the trait is read on an attention left as primitives too
(the softmax's scores matmul and `P @ V`), and a trait's gap in a pass that found no anchor in the layer is the
layer's gap (`excused.unreached_gaps`), unchecked: no what-if builds it, so the first gap's fix is not said to be
enough."""

from __future__ import annotations

from pathlib import Path

from test_near_miss_rule import trace_of

from rlxviz.passes.architecture import classify_layer
from rlxviz.passes.rules.block import INTEGER_QKV_GAP
from rlxviz.passes.why.text import UNCHECKED_ALONE
from rlxviz.passes.why.verdict import RunVerdict

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"


def test_convbert_qdyn_headline_names_the_integer_qkv_gap_as_mobilebert_qdyn_does():
    said = {}
    for stem in ("convbert.qdyn", "mobilebert.qdyn"):
        t = trace_of(ZOO / f"{stem}.onnx")
        v = RunVerdict.of(t)
        said[stem] = v.headline
        assert INTEGER_QKV_GAP in v.headline, (stem, v.headline)
        assert UNCHECKED_ALONE.format(n=len(v.layers)) in v.headline, (stem, v.headline)
        assert all(classify_layer(t.input, s.layer).integer_qkv for s in v.layers), stem
        assert all(any(g.form == INTEGER_QKV_GAP and g.unchecked for g in s.gaps) for s in v.layers), stem
    assert "packed attention whose output stays in heads layout" in said["convbert.qdyn"]  # its first gap kept


def test_the_float_convbert_export_has_no_integer_gap():
    v = RunVerdict.of(trace_of(ZOO / "convbert.optimum.onnx"))
    assert INTEGER_QKV_GAP not in v.headline and "integer" not in v.headline, v.headline
    assert not any(g.form == INTEGER_QKV_GAP for s in v.layers for g in s.gaps)
