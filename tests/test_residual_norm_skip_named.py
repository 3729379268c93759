"""A post-norm layer's residual norm sits in the layer whose sublayer it closes, whatever path its sum carries.

ONNX Runtime named albert.ortopt's layer-0 attention residual sum (add %55, of the `SkipLayerNormalization` that
closes layer 0's attention) after its skip operand, `embedding_hidden_mapping_in`: ALBERT's projection before its
shared layer, in no layer. `placement.match_layer` placed a post-norm residual norm by its sum's path, so
`FusedResidualLN` %120 (layer 0's `attention.LayerNorm`) was said and boxed as the model's `final norm`, and layer 0
listed one residual norm to layer 1's two. The layer a sum closes is now its non-skip operand's (the attention's
output: `placement.closed_layer`, `placement.skip_operand`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from clirun import run as cli_run
from test_near_miss_rule import trace_of
from test_shared_region_place import _drawn, _said

from rlxviz.ir import Op
from rlxviz.passes import Trace
from rlxviz.passes.placement import FINAL_NORM_BOX, RESIDUAL_NORMS, closed_layer, placed, sits, skip_operand
from rlxviz.passes.trace import layer_of
from rlxviz.passes.why.verdict import RunVerdict

ORT = Path(__file__).parent / "fixtures" / "onnx" / "ortopt"
ALBERT = ORT / "albert.ortopt.onnx"
POST_LN = [ALBERT, ORT / "bert.ortopt.onnx", ORT / "distilbert.ortopt.onnx"]
"""Post-LN encoders whose residual norms ONNX Runtime fused (`SkipLayerNormalization`): two per layer, none after
the last layer."""


@functools.cache
def _trace(path: Path) -> Trace:
    return trace_of(path)


def _norms(t: Trace) -> list[int]:
    return [n.id for n in t.final if n.op in RESIDUAL_NORMS]


def test_albert_layer_0_attention_norm_is_layer_0_s():
    t = _trace(ALBERT)
    s = next(s for s in t.steps if any(m.bindings.get("sum") == 55 for m in s.matches))
    assert s.before[55].path.endswith("embedding_hidden_mapping_in")  # the sum named after its skip
    skip = skip_operand(s.before, 55)
    assert skip is not None and layer_of(s.before[skip].path) is None  # the projection the attention reads
    assert closed_layer(s.before, 55) == 0
    said, drawn = _said(t), _drawn(t)
    norms = _norms(t)
    per_layer = {k: sorted(i for i in norms if said[i] == k) for k in (0, 1)}
    assert [len(v) for v in per_layer.values()] == [2, 2], per_layer
    assert {i: drawn.get(i) for i in norms} == {i: said[i] for i in norms}
    assert FINAL_NORM_BOX not in placed(t).values()
    assert sits(t, s.before[55]) == (0, "")  # the inspector's `(layer 0)` beside the sum's path


def test_albert_cli_text_and_json_say_no_final_norm(capsys):
    _, out, _ = cli_run(capsys, "explain", ALBERT, "-v")
    lines = out.splitlines()
    assert FINAL_NORM_BOX not in next(x for x in lines if x.startswith("outside the layers:"))
    for k in (0, 1):
        head = next(x for x in lines if x.startswith(f"layer {k}: "))
        assert head.count("FusedResidualLN %") == 2, head
    _, out, _ = cli_run(capsys, "explain", ALBERT, "--json")
    d = json.loads(out)
    assert FINAL_NORM_BOX not in d["outside_boxes"].values()
    assert [sum(x.startswith("FusedResidualLN %") for x in lv["done"]) for lv in d["layers"]] == [2, 2]


@pytest.mark.parametrize("path", POST_LN, ids=lambda p: p.stem)
def test_a_post_ln_encoder_has_no_final_norm(path):
    """Every residual norm of a post-LN encoder is its layers' (the last one closes the last layer) or the
    embeddings' norm: none is said or drawn as a `final norm`, and each layer holds as many."""
    t = _trace(path)
    v = RunVerdict.of(t)
    assert len(v.layers) >= 2, path.stem
    said, drawn = _said(t), _drawn(t)
    norms = _norms(t)
    assert {i: drawn.get(i) for i in norms} == {i: said[i] for i in norms}, path.stem
    counts = [sum(said[i] == lv.layer for i in norms) for lv in v.layers]
    assert len(set(counts)) == 1 and counts[0] >= 1, (path.stem, counts)
    assert FINAL_NORM_BOX not in placed(t).values(), path.stem
    assert all(t.final[i].op in (Op.FUSED_RESIDUAL_LN,) for i in norms)
