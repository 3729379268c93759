"""Issue 37 item 7: multi-query K/V sliced from one fused `c_attn` (GPT-BigCode: `[hidden, H + 2*head_dim]`, Q the
first H columns, K and V one head each) is grouped-query attention with one KV head, whether the matmuls broadcast
the one head or an `expand` repeats it to every head first; numbers equal to the unfused graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlxviz.ir import Graph, Op, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.runtime import MlxExecutor, run_reference

CASES = Path(__file__).parent / "data" / "cases"
MQA = ("mqa-c-attn-broadcast", "mqa-c-attn-expand", "mqa-c-attn-expand-prescaled-k")


def _weights(graph: Graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n.attrs["name"]: (rng.standard_normal(n.shape) / np.sqrt(n.shape[0])).astype(np.float32)
            for n in graph if n.op == Op.PARAM}


@pytest.mark.parametrize("name", MQA)
def test_multi_query_from_a_fused_c_attn_is_attention_with_one_kv_head(name):
    g = parse_ir((CASES / f"{name}.rlx").read_text())
    final = Pipeline.canonical().run(g).final
    attn = [n for n in final if n.op == Op.ATTENTION]
    assert len(attn) == 1 and attn[0].attrs["num_kv_heads"] == 1 and attn[0].attrs["num_heads"] == 4
    assert attn[0].attrs["scale"] is None  # 1/sqrt(16), wherever the factors were
    assert [final[i].shape for i in attn[0].inputs[1:3]] == [(2, 8, 16), (2, 8, 16)]  # one packed head each
    assert not any(n.op in (Op.SOFTMAX, Op.EXPAND) for n in final)
    w = _weights(g)
    for seed in (1, 2):
        feeds = {"x": np.random.default_rng(seed).standard_normal((2, 8, 64)).astype(np.float32)}
        want = run_reference(g, feeds, w)[0]
        np.testing.assert_allclose(run_reference(final, feeds, w)[0], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(MlxExecutor().run(final, feeds, w)[0]), want, rtol=1e-4, atol=1e-5)


def test_an_expand_of_more_than_the_head_axis_is_not_read_as_multi_query():
    """The control: K expanded along its sequence axis too (`[B, 1, 1, d]` -> `[B, 4, 8, d]`) is no head split;
    the attention stays unpacked rather than read as one KV head."""
    src = (CASES / "mqa-c-attn-expand.rlx").read_text()
    src = src.replace("%8 = reshape(%4) {shape=[2, 8, 1, 16]} : f32[2, 8, 1, 16]",
                      "%40 = narrow(%4) {axis=1, start=0, length=1} : f32[2, 1, 16] @h.0.attn\n"
                      "  %8 = reshape(%40) {shape=[2, 1, 1, 16]} : f32[2, 1, 1, 16]")
    src = src.replace("%9 = transpose(%8) {perm=[0, 2, 1, 3]} : f32[2, 1, 8, 16]",
                      "%9 = transpose(%8) {perm=[0, 2, 1, 3]} : f32[2, 1, 1, 16]")
    g = parse_ir(src)
    final = Pipeline.canonical().run(g).final
    assert not any(n.op == Op.ATTENTION and n.attrs.get("num_kv_heads") == 1 for n in final)
    w = _weights(g)
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 8, 64)).astype(np.float32)}
    np.testing.assert_allclose(run_reference(final, feeds, w)[0], run_reference(g, feeds, w)[0], rtol=1e-5, atol=1e-6)
