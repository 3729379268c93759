"""A post-norm decoder's residual norms sit in the layer whose norms they are (newcomer finding on bart-full).

`placement.match_layer` placed a residual norm by its sum's layer only for the `post_ln` kind (BERT); a post-norm
layer of another kind (BART's and Marian's decoder layers, `cross_decoder`) was placed by its readers, so each
layer's last norm (`final_layer_norm`) moved on to the next layer, the last one's became a `final norm` the model
does not have, and the decoder's `layernorm_embedding` was credited to decoder layer 0. The rule now asks whether
the layer is post-norm (`LayerArchitecture.post_norm`), whatever its kind; T5's pre-norm decoder keeps its final
norm outside the layers.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
from clirun import run as cli_run
from test_near_miss_rule import trace_of

from rlxviz.ir.ops import SPECS
from rlxviz.passes import Trace
from rlxviz.passes.placement import EMBEDDINGS_BOX, FINAL_NORM_BOX, RESIDUAL_NORMS
from rlxviz.passes.trace import Layer, layer_of
from rlxviz.passes.why.kinds import POST_NORM, PRE_NORM, LayerArchitecture
from rlxviz.passes.why.text import OUTSIDE_LAYERS
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.session.render import View, picture
from rlxviz.viz.layers import layer_groups

FIX = Path(__file__).parent / "fixtures" / "onnx"
BART = FIX / "cases" / "bart-full.onnx"
MODELS = [BART, FIX / "zoo" / "bart.encdec.onnx", FIX / "zoo" / "marian.encdec.onnx", FIX / "zoo" / "t5.encdec.onnx"]
_ID = re.compile(r"%(\d+) ")


@functools.cache
def _trace(path: Path) -> Trace:
    return trace_of(path)


def _key(k: Layer | int | None) -> tuple[str, int] | None:
    return None if k is None else (getattr(k, "stack", ""), int(k))


def _gamma_layers(t: Trace) -> dict[int, tuple[str, int] | None]:
    """Each residual norm of the final graph -> the layer its gamma param's name names (None: no layer's)."""
    g, out = t.final, {}
    for n in g:
        if n.op in RESIDUAL_NORMS:
            roles = SPECS[n.op].roles
            gamma = g[n.inputs[(roles(n.attrs, len(n.inputs)) if callable(roles) else roles).index("gamma")]]
            out[n.id] = _key(layer_of(gamma.attrs.get("name") or gamma.path))
    return out


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_each_residual_norm_sits_in_the_layer_its_gamma_names(path):
    t = _trace(path)
    want = _gamma_layers(t)
    assert want, path.stem
    v = RunVerdict.of(t)
    said: dict[int, tuple[str, int] | None] = {}
    for lv in v.layers:
        for x in lv.done:
            said[int(_ID.search(x + " ")[1])] = _key(lv.layer)
    said.update({int(_ID.search(x + " ")[1]): None for x in v.outside})
    assert {i: said.get(i, "unsaid") for i in want} == want, path.stem
    g, ov, kw = picture(t, View(len(t.versions()) - 1, "layers", "after"))
    boxes = layer_groups(g, ov, kw.get("verdicts"), kw.get("placed"))
    drawn = {n.id: _key(b.layer) for b in boxes.values() for n in b.nodes}
    assert {i: drawn.get(i, "undrawn") for i in want} == want, path.stem


@pytest.mark.parametrize("path", MODELS[:3], ids=lambda p: p.stem)
def test_a_post_norm_encoder_decoder_has_no_final_norm(path):
    """BART and Marian end each stack with a layer's own `final_layer_norm`: nothing is said as a `final norm`, and
    the decoder's `layernorm_embedding` (BART) sits in `embeddings` with the encoder's."""
    v = RunVerdict.of(_trace(path))
    assert FINAL_NORM_BOX not in v.outside_in.values(), (path.stem, v.outside_in)
    norms = [x for x in v.outside if x.startswith("FusedResidualLN")]
    assert all(v.outside_in[x] == EMBEDDINGS_BOX for x in norms), v.outside_in
    assert len(norms) == (0 if "marian" in path.stem else 2), norms


def test_t5_pre_norm_stacks_keep_their_final_norms_outside():
    v = RunVerdict.of(_trace(MODELS[3]))
    assert sorted(v.outside_in[x] for x in v.outside if x.startswith("FusedResidualRmsNorm")) == [FINAL_NORM_BOX] * 2


def test_bart_full_cli_text_and_json_agree(capsys):
    _, out, _ = cli_run(capsys, "explain", BART, "--json")
    d = json.loads(out)
    assert d["outside_boxes"] == {"FusedMatMulBiasAct %362 (fuse_matmul_bias_act)": "decoder",
                                  "FusedResidualLN %376 (fuse_residual_ln)": EMBEDDINGS_BOX,
                                  "FusedResidualLN %381 (fuse_residual_ln)": EMBEDDINGS_BOX}
    norms = {lv["label"]: [x.split(" (")[0] for x in lv["done"] if x.startswith("FusedResidualLN")]
             for lv in d["layers"] if lv["stack"] == "decoder"}
    assert norms == {"decoder layer 0": ["FusedResidualLN %382", "FusedResidualLN %383", "FusedResidualLN %384"],
                     "decoder layer 1": ["FusedResidualLN %385", "FusedResidualLN %386", "FusedResidualLN %387"]}
    _, text, _ = cli_run(capsys, "explain", BART)
    line = next(ln for ln in text.splitlines() if ln.startswith(f"{OUTSIDE_LAYERS}: "))
    assert FINAL_NORM_BOX not in line and "FusedResidualLN %387" not in line, line
    assert f"{EMBEDDINGS_BOX}: FusedResidualLN %376 (fuse_residual_ln), FusedResidualLN %381 (fuse_residual_ln)" in line


@pytest.mark.parametrize("evidence,post", [
    ((f"residual sum add %1 feeds only layer_norm %2 {POST_NORM}",), True),  # BART's decoder layer
    ((f"layer_norm %2 reads add %1, which also feeds residual add %3 {PRE_NORM}", "pre-norm residual"), False),  # T5
    ((f"residual sum add %1 feeds only layer_norm %2 {POST_NORM}",
      f"layer_norm %4 reads add %3, which also feeds residual add %5 {PRE_NORM}"), False),  # mixed: not post-norm
    ((), False),  # no norm order read
])
def test_post_norm_is_read_from_the_norms_whatever_the_kind(evidence, post):
    assert LayerArchitecture("cross_decoder", "a decoder layer", evidence=evidence).post_norm is post
    assert LayerArchitecture("post_ln", "a BERT layer").post_norm  # the BERT kind is post-norm by its kind
    assert not LayerArchitecture("pre_ln", "a GPT-2 layer", evidence=evidence).post_norm


def test_bart_full_layers_view_chains_encoder_layer_0_to_1():
    """The collapsed layers view drew encoder.layers.1 at the top right, far from encoder.layers.0: encoder.layers.0
    also makes the cross-attention's mask, read by 3 boxes, so every edge out of it was drawn as a broadcast (dashed,
    `constraint=false`), the hidden state's to encoder.layers.1 too. A broadcast is now told by value: the hidden
    state's edge holds the chain, the mask's stay dashed."""
    from rlxviz.viz.layers import layers_to_dot

    t = _trace(BART)
    g, ov, kw = picture(t, View(len(t.versions()) - 1, "layers", "after"))
    dot = layers_to_dot(g, ov, verdicts=kw.get("verdicts"), placed=kw.get("placed"))
    edges = {m[1]: m[2] for m in re.finditer(r"^\s*(\S+ -> \S+) \[(.*)\]$", dot, re.M)}
    chain = edges["layer_encoder_0 -> layer_encoder_1"]
    assert "constraint=false" not in chain and "dashed" not in chain and 'label="f32[1,16,64]"' in chain, chain
    masks = [a for e, a in edges.items() if e.startswith("layer_encoder_0 -> layer_decoder_")]
    assert len(masks) == 2 and all("constraint=false" in a and "dashed" in a for a in masks), masks
    assert sum("(to 3 groups)" in a for a in masks) == 1, masks  # the broadcast value is labelled once
