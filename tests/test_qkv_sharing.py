"""MobileBERT's layer (newcomer 27): which of an attention's Q, K and V share an input (`fuse_attention_block`'s
`self_attention`: only K and V of one input other than Q's is cross-attention), and a layer whose norm placement is
not read (`architecture`'s `unknown` kind: no kind is guessed, and none is stated without evidence)."""

import json
from pathlib import Path

import pytest

from rlxviz import cli
from rlxviz.ir import Builder, Graph
from rlxviz.passes import Pipeline
from rlxviz.passes.architecture import classify_layer
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


def _layer(norm: str) -> Graph:
    """One post-norm layer, attention then GELU MLP, each residual sum closed by `norm`: `ln` (LayerNorm, BERT) or
    `affine` (`x * w + b`, MobileBERT's NoNorm: no norm op)."""
    b = Builder(f"layer_{norm}")
    x, m = b.input("x", (1, 4, H)), b.input("mask", (1, 4))

    def close(t, name):
        w, c = b.param(f"{name}.weight", (H,)), b.param(f"{name}.bias", (H,))
        return b.layer_norm(t, w, c, 1e-12) if norm == "ln" else b.add(b.mul(t, w), c)

    def lin(t, name, n_in, n_out):
        return b.linear(t, b.param(f"{name}.weight", (n_in, n_out)), b.param(f"{name}.bias", (n_out,)))

    with b.scope("h.0"):
        qkv = lin(x, "qkv", H, 3 * H)
        att = b.attention(*(b.narrow(qkv, 2, j * H, H) for j in range(3)), m, num_heads=2, head_dim=H // 2,
                          mask_kind="keep")
        h1 = close(b.add(lin(att, "o", H, H), x), "ln1")
        out = close(b.add(lin(b.gelu(lin(h1, "fc1", H, 4 * H)), "fc2", 4 * H, H), h1), "ln2")
    b.output(out)
    return b.build()


def test_a_layer_with_no_norm_op_is_no_guessed_kind():
    """No norm op, so no norm placement read: kind `unknown` (once `pre_ln` with no evidence and the words `norm ->
    sublayer` beside `no norm`); what closes each residual sum is the evidence."""
    arch = classify_layer(_layer("affine"), 0)
    assert arch.kind == "unknown" and arch.norm == "none", arch
    assert "pre-LN" not in arch.description and "norm -> sublayer" not in arch.description, arch.description
    assert len(arch.evidence) == 2 and all("no normalization" in e for e in arch.evidence), arch.evidence
    assert not arch.pre_norm and not arch.post_ln
    assert "not one rlxviz recognizes" in arch.not_expected("fuse_transformer_layer", "attn_is_fused_block")
    assert classify_layer(_layer("ln"), 0).kind == "post_ln"  # the control: a LayerNorm closing each sum


def test_mobilebert_layers_words(capsys):
    """mobilebert.optimum: its layers' kind is not guessed, and its attention is not called cross-attention."""
    assert cli.main(["explain", str(MOBILEBERT), "--json"]) in (0, 1)
    j = json.loads(capsys.readouterr().out)
    for layer in j["layers"]:
        arch = layer["architecture"]
        assert arch["kind"] == "unknown" and arch["evidence"], arch
        assert "norm -> sublayer" not in arch["description"], arch
    assert cli.main(["explain", str(MOBILEBERT), "-v"]) in (0, 1)
    text = capsys.readouterr().out
    assert "layer kind: pre-LN" not in text and "(cross-attention)" not in text, text
    assert "cross-attention block" not in text and text.count("V is projected from another input than Q and K") >= 2
    assert "compiler fix: a block with a packed QK projection and a separate V projection" in text, text
