"""MobileBERT's layer (newcomer 27): which of an attention's Q, K and V share an input (`fuse_attention_block`'s
`self_attention`: only K and V of one input other than Q's is cross-attention)."""

from pathlib import Path

import pytest

from rlxviz import cli
from rlxviz.ir import Builder, Graph
from rlxviz.passes import Pipeline
from rlxviz.passes.rules.block import SHARING_WORDS, qkv_sharing

MOBILEBERT = Path(__file__).parent / "fixtures" / "onnx" / "zoo" / "mobilebert.optimum.onnx"
H = 16


def _attention(share: str) -> Graph:
    """One attention whose Q, K and V linears read the inputs `share` names in Q, K, V order (`xxy`: Q and K from
    `x`, V from `y`, MobileBERT's bottleneck; `xyy`: a cross-attention), a keep mask, an output linear."""
    b = Builder(f"qkv_{share}")
    ins = {n: b.input(n, (1, 4, H)) for n in sorted(set(share))}
    m = b.input("mask", (1, 4))
    with b.scope("h.0"):
        q, k, v = (b.linear(ins[s], b.param(f"{r}.weight", (H, H)), b.param(f"{r}.bias", (H,)))
                   for r, s in zip("qkv", share, strict=True))
        att = b.attention(q, k, v, m, num_heads=2, head_dim=H // 2, mask_kind="keep")
        b.output(b.linear(att, b.param("o.weight", (H, H)), b.param("o.bias", (H,))))
    return b.build()


def _refusal(share: str):
    (r,) = {r.message: r for r in Pipeline.canonical().run(_attention(share)).rejections
            if r.guard == "self_attention"}.values()
    return r


@pytest.mark.parametrize("q, k, v, form", [(1, 1, 1, "self"), (1, 2, 2, "cross"), (1, 1, 2, "qk"), (1, 2, 1, "qv"),
                                           (1, 2, 3, "apart")])
def test_qkv_sharing_names_each_form(q, k, v, form):
    assert qkv_sharing(q, k, v) == form


def test_q_and_k_of_one_input_v_of_another_is_not_cross_attention():
    """Q and K from `x`, V from `y` (MobileBERT): self-attention with a separate V input, never `cross-attention`,
    and a compiler fix that would take it (a packed QK projection and a separate V projection)."""
    r = _refusal("xxy")
    assert r.message.startswith("V is projected from another input than Q and K: Q and K from input x"), r.message
    assert "(cross-attention)" not in r.message and "not cross-attention" in r.message, r.message
    assert r.hint.startswith("nothing to change in the model: V read from another input"), r.hint
    assert "packed QK projection and a separate V projection" in r.fix and "cross-attention" not in r.fix, r.fix


@pytest.mark.parametrize("share, start", [("xyx", "K is projected from another input than Q and V"),
                                          ("xyz", "Q, K and V are projected from three different inputs")])
def test_other_splits_are_named_as_they_are(share, start):
    r = _refusal(share)
    assert r.message.startswith(start) and "(cross-attention)" not in r.message, r.message
    assert r.fix == SHARING_WORDS[qkv_sharing(*map(ord, share))][2] and "cross-attention" not in r.fix


def test_k_and_v_of_one_input_stays_cross_attention():
    """The control: K and V from `y`, Q from `x` (BART's encoder_attn, n3-09) is called cross-attention."""
    r = _refusal("xyy")
    assert "K and V from input y" in r.message and "(cross-attention)" in r.message, r.message
    assert r.hint == "nothing to change in the model: cross-attention keeps its packed attention"
    assert r.fix == "a cross-attention block (a Q projection and a packed K/V projection)"


def test_mobilebert_layers_words(capsys):
    """mobilebert.optimum: its attention is not called cross-attention."""
    assert cli.main(["explain", str(MOBILEBERT), "-v"]) in (0, 1)
    text = capsys.readouterr().out
    assert "(cross-attention)" not in text, text
    assert "cross-attention block" not in text and text.count("V is projected from another input than Q and K") >= 2
    assert "compiler fix: a block with a packed QK projection and a separate V projection" in text, text
