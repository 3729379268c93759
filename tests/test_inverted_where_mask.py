"""Issue 37 item 7: an inverted where-mask (MPT: `where(masked, finfo.min, scores [+ alibi])`, the fill where the
condition holds) is read as `where(not masked, scores, fill)`: ALiBi and the mask become the attention's one
additive operand (or the per-key padding its keep mask); numbers equal on every mask, fully masked rows included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlxviz.ir import Graph, Op, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.runtime import MlxExecutor, run_reference

CASES = Path(__file__).parent / "data" / "cases"
INVERTED = ("mpt-alibi-inverted-where", "mpt-alibi-inverted-where-causal", "inverted-where-padding")
MASKS = ([[1, 1, 1, 0, 1, 1, 0, 1], [1] * 8], [[0, 0, 0, 1, 1, 1, 1, 1], [1] * 6 + [0] * 2], [[1] * 8, [0] * 8])


def _weights(graph: Graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n.attrs["name"]: (rng.standard_normal(n.shape) / np.sqrt(n.shape[0])).astype(np.float32)
            for n in graph if n.op == Op.PARAM}


@pytest.mark.parametrize("name", INVERTED)
def test_an_inverted_where_mask_packs_the_attention_with_equal_numbers(name):
    g = parse_ir((CASES / f"{name}.rlx").read_text())
    trace = Pipeline.canonical().run(g)
    final = trace.final
    assert not any(n.op == Op.SOFTMAX for n in final), name
    assert any(m.rule == "fuse_sdpa.inverted_where" for s in trace.steps for m in s.matches)
    w = _weights(g)
    for mask in MASKS:
        feeds = {"hidden_states": np.random.default_rng(1).standard_normal((2, 8, 64)).astype(np.float32),
                 "attention_mask": np.array(mask, np.int64)}
        want = run_reference(g, feeds, w)[0]
        got = run_reference(final, feeds, w)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{name} {mask}")
        np.testing.assert_allclose(np.asarray(MlxExecutor().run(final, feeds, w)[0]), want, rtol=1e-4, atol=1e-5)


def test_alibi_is_named_in_the_additive_operand():
    trace = Pipeline.canonical().run(parse_ir((CASES / "mpt-alibi-inverted-where.rlx").read_text()))
    notes = [r.message for r in trace.rejections if r.guard == "where_mask_additive"]
    assert notes and "one row per head" in notes[0], [r.guard for r in trace.rejections]


def test_a_where_whose_fill_is_not_constant_is_left_alone():
    """The control: `where(masked, other_scores, scores)` selects between two computed values, no mask fill."""
    src = (CASES / "inverted-where-padding.rlx").read_text().replace("%47 = where(%45, %46, %14)",
                                                                     "%47 = where(%45, %12, %14)")
    trace = Pipeline.canonical().run(parse_ir(src))
    assert not any(m.rule == "fuse_sdpa.inverted_where" for s in trace.steps for m in s.matches)
