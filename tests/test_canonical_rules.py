"""`fuse_sdpa`'s canonicalizations as guarded rules (issue 36, item 1): each is a `Rule` the engine runs as a stage
of `fuse_sdpa`, so a form it refuses is its own named near miss in the trace, and what is no candidate stays
quiet. Two variants of each refusal kind."""

from __future__ import annotations

import pytest

from rlxviz.ir import parse_ir
from rlxviz.passes.engine import refusal
from rlxviz.passes.rules.kv_cache import PACK_CACHE, PACK_CACHE_PASS, pack_cache


def _cache(new: str, split: str = "[2, 1, 4, 16]") -> str:
    return f"""graph odd_cache {{
  %0 = input {{name="x"}} : {new}
  %1 = input {{name="past"}} : f32[2, 4, 7, 16]
  %2 = reshape(%0) {{shape={split}}} : f32{split}
  %3 = transpose(%2) {{perm=[0, 2, 1, 3]}} : f32[2, 4, 1, 16]
  %4 = concat(%1, %3) {{axis=2}} : f32[2, 4, 8, 16]
  %5 = softmax(%4) {{axis=-1}} : f32[2, 4, 8, 16]
  return %5
}}"""


@pytest.mark.parametrize("new", ["f32[2, 64]", "f32[2, 64, 1]"])
def test_a_cache_whose_new_part_is_no_packed_projection_is_named(new):
    """A head split of something other than a `[B, S, h*d]` projection: `cache_layout`, at the concat."""
    g = parse_ir(_cache(new))
    assert pack_cache(g)[1] == []
    (r,) = PACK_CACHE_PASS(g).rejections
    assert (r.rule, r.guard, r.anchor) == ("fuse_sdpa.pack_cache", "cache_layout", 4)
    assert "needs a packed [B, S, h*d] projection" in r.message and refusal(PACK_CACHE, g, 4) == r.message


def test_a_cache_concat_nothing_reads_is_no_candidate():
    text = _cache("f32[2, 64]").replace("return %5", "return %1")
    g = parse_ir("\n".join(line for line in text.splitlines() if "softmax" not in line))
    assert PACK_CACHE_PASS(g).rejections == [] and refusal(PACK_CACHE, g, 4) == ""


@pytest.mark.parametrize("where, norm", [("before", "rms"), ("after", "layer")])
def test_a_head_norm_whose_inner_node_is_read_elsewhere_is_named(where, norm):
    """The inner node of the QK-norm form (the norm before the transpose, the transpose before the norm) also a
    graph output: the engine's `absorbed_escape` names it, the other head's norm is hoisted."""
    from test_score_terms import qk_norm_attention

    from rlxviz.ir import Graph, Op
    from rlxviz.passes.rules.head_norm import HOIST_HEAD_NORMS_PASS

    g = qk_norm_attention(where, norm)
    norms = [n for n in g if n.op in (Op.RMS_NORM, Op.LAYER_NORM)]
    inner = norms[0].id if where == "before" else norms[0].inputs[0]
    g = Graph(list(g), [*g.outputs, inner], g.name, g.next_id, g.values)
    r = HOIST_HEAD_NORMS_PASS(g)
    assert len(r.matches) == 1
    (rej,) = r.rejections
    assert (rej.rule, rej.guard, rej.subject) == ("fuse_sdpa.hoist_head_norm", "absorbed_escape", inner)


def _inverted(scores: str, reader: str = "softmax(%3) {axis=-1}") -> str:
    return f"""graph inverted {{
  %0 = input {{name="masked"}} : bool[2, 1, 1, 8]
  %1 = input {{name="scores"}} : f32{scores}
  %2 = const {{value=-3.4028234663852886e+38}} : f32[]
  %3 = where(%0, %2, %1) : f32[2, 4, 8, 8]
  %4 = {reader} : f32[2, 4, 8, 8]
  return %4
}}"""


@pytest.mark.parametrize("scores", ["[1, 4, 8, 8]", "[4, 8, 8]"])
def test_an_inverted_where_that_broadcasts_the_scores_is_named(scores):
    from rlxviz.passes.rules.where_mask import INVERTED_WHERE, UNINVERT_WHERE_PASS, uninvert_where

    g = parse_ir(_inverted(scores))
    assert uninvert_where(g)[1] == []
    (r,) = UNINVERT_WHERE_PASS(g).rejections
    assert (r.rule, r.guard, r.anchor) == ("fuse_sdpa.inverted_where", "inverted_scores_shape", 3)
    assert refusal(INVERTED_WHERE, g, 3) == r.message and scores in r.message


@pytest.mark.parametrize("reader", ["exp(%3)", "neg(%3)"])
def test_an_inverted_where_no_softmax_reads_is_no_candidate(reader):
    from rlxviz.passes.rules.where_mask import UNINVERT_WHERE_PASS

    r = UNINVERT_WHERE_PASS(parse_ir(_inverted("[2, 4, 8, 8]", reader)))
    assert r.matches == [] and r.rejections == []
    assert len(UNINVERT_WHERE_PASS(parse_ir(_inverted("[2, 4, 8, 8]"))).matches) == 1
