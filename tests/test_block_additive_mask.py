"""Issue 37 item 7: FusedAttentionBlock and FusedTransformerLayer take an additive mask operand (`mask="additive"`),
so any mask the attention takes, the block takes: a TorchScript sdpa padding mask expanded per query
(`[B, 1, S, S]`, equal rows), the extended mask expanded the same way, a sliding-window band. Numbers equal to the
unfused graph on every mask (all-zero rows included), on the NumPy reference and on MLX with the CPU kernels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlxviz.ir import Graph, Op, parse_ir
from rlxviz.ir.infer import ShapeError, infer
from rlxviz.ir.ops import FTL_INPUTS
from rlxviz.passes import Pipeline
from rlxviz.runtime import MlxExecutor, run_reference

CASES = Path(__file__).parent / "data" / "cases"
BERT = ("bert-ts-sdpa-expanded-mask", "bert-expanded-additive-mask", "bert-band-mask")
MASKS = {"random": [[1, 1, 1, 0, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1, 1, 0]],
         "left_padding": [[0, 0, 0, 1, 1, 1, 1, 1], [1] * 8],
         "fully_masked_row": [[1] * 6 + [0] * 2, [0] * 8],
         "all_zero": [[0] * 8, [0] * 8]}


def _graph(name: str) -> Graph:
    return parse_ir((CASES / f"{name}.rlx").read_text())


def _weights(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for n in graph:
        if n.op == Op.PARAM:
            fan = n.shape[0] if n.rank == 2 else 1
            base = 1.0 if n.rank == 1 and n.attrs["name"].startswith("ln") and "weight" in n.attrs["name"] else 0.0
            out[n.attrs["name"]] = (base + rng.standard_normal(n.shape) / np.sqrt(fan)).astype(np.float32)
    return out


def _feeds(mask: list[list[int]]) -> dict[str, np.ndarray]:
    hidden = np.random.default_rng(1).standard_normal((2, 8, 64)).astype(np.float32)
    return {"hidden_states": hidden, "attention_mask": np.array(mask, np.int64)}


def _fused(graph: Graph, op: Op, passes: list[str] | None = None) -> tuple[Graph, list]:
    final = (Pipeline(passes) if passes else Pipeline.canonical()).run(graph).final
    nodes = [n for n in final if n.op == op]
    return final, nodes


@pytest.mark.parametrize("name", BERT)
def test_bert_with_an_additive_mask_becomes_one_transformer_layer_with_equal_numbers(name):
    g = _graph(name)
    final, layers = _fused(g, Op.FUSED_TRANSFORMER_LAYER)
    assert len(layers) == 1 and layers[0].attrs["mask"] == "additive", [n.op.value for n in final]
    assert not any(n.op in (Op.SOFTMAX, Op.ATTENTION, Op.FUSED_ATTENTION_BLOCK) for n in final)
    w = _weights(g)
    ex = MlxExecutor()
    for label, mask in MASKS.items():
        feeds = _feeds(mask)
        want = run_reference(g, feeds, w)[0]
        got = run_reference(final, feeds, w)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{name} reference, {label}")
        assert np.isfinite(got).all(), label
        mlx = np.asarray(ex.run(final, feeds, w)[0])
        np.testing.assert_allclose(mlx, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} MLX, {label}")


@pytest.mark.parametrize("name", BERT[:2])
def test_an_expanded_padding_mask_is_named_as_such_not_a_band(name):
    trace = Pipeline.canonical().run(_graph(name))
    notes = [r.message for r in trace.rejections if r.guard == "mask_model_term"]
    assert notes and "padding mask expanded per query" in notes[0] and "band" in notes[0], notes
    assert "FusedTransformerLayer take it" in notes[0]


def test_a_band_is_still_named_a_band():
    trace = Pipeline.canonical().run(_graph("bert-band-mask"))
    notes = [r.message for r in trace.rejections if r.guard == "mask_model_term"]
    assert notes and "sliding-window band" in notes[0] and "expanded per query" not in notes[0], notes


def test_the_attention_block_alone_takes_the_additive_mask_and_keeps_the_numbers():
    g = _graph("bert-ts-sdpa-expanded-mask")
    final, blocks = _fused(g, Op.FUSED_ATTENTION_BLOCK, ["fuse_sdpa", "fuse_shared_input_matmul",
                                                         "fuse_matmul_bias_act", "fuse_attention_block"])
    assert len(blocks) == 1 and blocks[0].attrs["mask"] == "additive"
    assert final[blocks[0].inputs[3]].shape == (2, 1, 8, 8)  # the mask operand as the model computes it
    w = _weights(g)
    for label, mask in MASKS.items():
        feeds = _feeds(mask)
        np.testing.assert_allclose(run_reference(final, feeds, w)[0], run_reference(g, feeds, w)[0],
                                   rtol=1e-5, atol=1e-5, err_msg=label)


def test_a_keep_mask_block_is_unchanged():
    """The control: HF's extended mask is traced to the `[B, S]` keep mask, the layer's default mask kind."""
    g = parse_ir((CASES / "n4-06c-deepnorm-alpha1-control.rlx").read_text())
    final, layers = _fused(g, Op.FUSED_TRANSFORMER_LAYER)
    mask = final[layers[0].inputs[FTL_INPUTS.index("mask")]]
    assert len(layers) == 1 and layers[0].attrs["mask"] == "keep" and mask.shape == (2, 8)


def test_an_additive_mask_that_does_not_broadcast_is_refused_in_one_line():
    g = _graph("bert-band-mask")
    final, blocks = _fused(g, Op.FUSED_ATTENTION_BLOCK, ["fuse_sdpa", "fuse_shared_input_matmul",
                                                         "fuse_matmul_bias_act", "fuse_attention_block"])
    block = blocks[0]
    types = [final[i].type for i in block.inputs]
    bad = [*types]
    bad[3] = type(types[3])((1, 1, 8, 7), types[3].dtype)
    with pytest.raises(ShapeError, match="does not broadcast"):
        infer(Op.FUSED_ATTENTION_BLOCK, block.attrs, bad)
    with pytest.raises(ShapeError, match="mask must be"):  # the keep form still checks [B, S]
        infer(Op.FUSED_ATTENTION_BLOCK, {**block.attrs, "mask": "keep"}, types)
