"""The padding fill in the mask's own dtype (newcomer run, olmo.fp16): `canonicalize_exported.where_bias` refused
`s + where(keep, 0, -65504)` as `bias_fills` ("another fill is a different mask", the app's `✗`), though -65504 is
`finfo(float16).min`, the same mask transformers writes in float16. `bias_fills` now takes the lowest value of the
mask's own dtype (f16, bf16, f32); what is left is said by the dtype:

* f16: `s + -65504` is the fill only for |s| < 16 (half its step, 32) and -inf for s <= -16, so the sum is no where
  (a fully masked row differs): `fill_absorbs`, the model's own term (`○`), which the attention takes as it is;
* bf16: the rewrite would be exact (|s| < 2^119) but fuse_sdpa's where mask takes no bf16 fill: `scores_f32`, a gap
  in rlxviz's ops (`△`) with its compiler fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from clirun import run as cli_run

from rlxviz import session
from rlxviz.app.derived import version_rows
from rlxviz.ir import Builder, DType
from rlxviz.passes import Pipeline
from rlxviz.passes.refusal_kinds import COMPILER_ONLY, MODEL_TERM
from rlxviz.passes.rules.table_mask import LOWEST
from rlxviz.passes.why.standing import standing
from rlxviz.passes.why.verdict import OP_GAP_GROUP
from rlxviz.runtime import run_reference

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
WHERE_BIAS = "canonicalize_exported.where_bias"


def _padded(dtype: str, fill: float, mask_dtype: str | None = None, where: bool = False):
    """softmax(q k^T + where(keep, 0, fill)) @ v in `dtype`, the mask's constants in `mask_dtype` (default `dtype`);
    `where`: the rewrite's form `where(keep, q k^T, fill)` instead."""
    b = Builder(f"padded_{dtype}")
    q, k, v = (b.input(n, (1, 1, 2, 4), dtype) for n in "qkv")
    keep = b.input("keep", (1, 1, 1, 2), "bool")
    s = b.matmul(q, b.transpose(k, (0, 1, 3, 2)))
    md = mask_dtype or dtype
    t = b.where(keep, s, b.const(fill, md)) if where else b.add(s, b.where(keep, b.const(0.0, md), b.const(fill, md)))
    b.output(b.matmul(b.softmax(t, -1), v))
    return b.build()


def _refusals(g):
    t = Pipeline.canonical().run(g)
    return t, [r for r in t.rejections if r.rule == WHERE_BIAS]


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_the_lowest_value_absorbs_a_score_below_half_its_step_and_no_more(dtype):
    """`LOWEST`'s half step is where `s + lowest` stops being `lowest` (MLX computes each dtype natively)."""
    import mlx.core as mx  # after rlxviz (its BLAS loads first)

    low, half = LOWEST[DType(dtype)]
    mdt = {"f16": mx.float16, "bf16": mx.bfloat16, "f32": mx.float32}[dtype]

    def add(s: float) -> float:
        return float((mx.array(s, mdt) + mx.array(low, mdt)).astype(mx.float32).item())

    below = half * (1 - 2.0**-7)  # representable in each dtype (7 fraction bits: bf16's)
    assert add(below) == low and add(-below) == low
    assert add(half) != low and add(-half) == -np.inf


@pytest.mark.parametrize("dtype,fill", [("f16", -65504.0), ("bf16", LOWEST[DType.bf16][0])])
def test_a_fill_that_is_the_masks_own_min_is_the_mask_fill(dtype, fill):
    """Before: `bias_fills` (`✗`, "another fill is a different mask"). After: the fill test passes; the refusal left
    is f16's `fill_absorbs` (the model's own term) or bf16's `scores_f32` (a gap in rlxviz's ops)."""
    t, refused = _refusals(_padded(dtype, fill))
    (r,) = refused
    assert r.guard != "bias_fills" and "another fill" not in r.fix + r.message, r
    assert not [m for m in t.matches if m.rule == WHERE_BIAS]  # the sum stays
    if dtype == "f16":
        assert (r.guard, r.kind) == ("fill_absorbs", MODEL_TERM) and "|s| < 16" in r.message, r.message
        assert standing(t, r)[0] == MODEL_TERM
    else:
        assert (r.guard, r.remedy) == ("scores_f32", COMPILER_ONLY) and "bf16" in r.fix, r
        assert standing(t, r)[0] == OP_GAP_GROUP


def test_another_fill_is_still_another_mask():
    """f16's min in an f32 mask is a real-valued term, not the mask fill (nor is -1e4 in f16)."""
    for g in (_padded("f32", -65504.0), _padded("f16", -1e4)):
        (r,) = [r for r in _refusals(g)[1] if r.headline]
        assert r.guard == "bias_fills" and r.fix.startswith("none: another fill is a different mask"), r


def test_in_f16_the_where_would_change_a_fully_masked_row():
    """Why f16's sum stays a sum: with scores of |s| >= 16 on a fully masked row, `s + -65504` rounds off the fill
    (or to -inf), so the softmax differs from the where's uniform row (the rewrite would not be exact)."""
    feeds = {"q": np.array([[[[4, 0, 0, 0], [0, 0, 0, 0]]]], np.float16),
             "k": np.array([[[[8, 0, 0, 0], [-8, 0, 0, 0]]]], np.float16),  # scores 32 and -32 in row 0
             "v": np.array([[[[1, 0, 0, 0], [0, 1, 0, 0]]]], np.float16), "keep": np.zeros((1, 1, 1, 2), bool)}
    summed = run_reference(_padded("f16", -65504.0), feeds)[0]
    where = run_reference(_padded("f16", -65504.0, where=True), feeds)[0]
    np.testing.assert_allclose(where[0, 0, 0, :2], [0.5, 0.5])  # uniform: both keys masked
    assert not np.allclose(summed[0, 0, 0], where[0, 0, 0])


def test_olmo_fp16_padding_sum_is_the_models_own_term_end_to_end(capsys):
    """`explain --json` on olmo.fp16 with its reference inputs: the where_bias refusals are `fill_absorbs`, standing
    `○` as the model's own term (never `✗`, never "another fill"); the app's chip for canonicalize_exported counts no
    near-miss; the layers still fuse and the numbers match the reference."""
    path = ZOO / "olmo.fp16.onnx"
    code, out, err = cli_run(capsys, "explain", path, "--inputs", path.with_suffix(".npz"), "--json")
    assert code == 0 and "Traceback" not in err, err
    j = json.loads(out)
    assert (j["fused_layers"], j["checked_layers"], j["numeric_check"]["ok"]) == (2, 2, True)
    assert not [r for layer in j["layers"] for r in layer["rejections"] if r["rule"] == WHERE_BIAS]
    kept = [x for x in j["left_out"] if x.startswith(WHERE_BIAS)]  # the model's own terms: no near-miss
    assert len(kept) == 2 and all("fill_absorbs [the model's own term]" in x for x in kept), j["left_out"]
    assert "another fill" not in out and "bias_fills" not in out
    m = session.load(str(path), 1, 16)
    trace = session.run_pipeline(m.graph, session.build_pipeline())
    rows = version_rows(trace, [(i, label) for i, (label, _) in enumerate(trace.versions())])
    (row,) = [r for r in rows if r["version"] == "after canonicalize_exported"]
    assert row["rejections"] == 0 and len(row["not_near_misses"][MODEL_TERM]) == 2, row
