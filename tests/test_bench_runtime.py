"""`benchmarks/bench_runtime.py` compares like with like: every row (rlxviz versions, hand-written MLX,
ONNX Runtime, PyTorch) runs on one set of weights and is checked against one reference. Timings are
not asserted here (they belong to the benchmark); these tests check what the table is computed on."""

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference

_SPEC = importlib.util.spec_from_file_location(
    "bench_runtime", Path(__file__).resolve().parent.parent / "benchmarks" / "bench_runtime.py")
bench = sys.modules.setdefault("bench_runtime", importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(bench)


def test_load_without_the_checkpoint_gives_both_styles_one_set_of_weights():
    """The fallback when the real checkpoint is absent: HF- and RLX-style graphs compute the same
    function (the benchmark once built them from two presets' own random weights: max error 6.0)."""
    hf, rlx, source = bench.load(2, 8, real="no-such-model", shaped="bert-tiny")
    assert "random weights" in source and "no-such-model unavailable" in source
    feeds = rlx.random_feeds(seed=3)
    want = run_reference(hf.graph, feeds, hf.weights)[0]
    got = run_reference(rlx.graph, feeds, rlx.weights)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_side_by_side_table_has_every_version_and_runtime_on_the_same_numbers():
    """One run gives one markdown row per pipeline version, hand-written MLX, ONNX Runtime (rlxviz's
    own export: no torch needed) and a PyTorch row (timed, or "not installed"); every timed row's
    output is within float32 rounding of the reference of the input graph."""
    args = argparse.Namespace(seq=16, model="bert-tiny", device="cpu", warmup=0, repeat=2)
    lines = bench.side_by_side(2, args)
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| runtime")]
    names = [r.split(" | ")[0][2:] for r in rows]
    hf = bench.load(2, 16, "bert-tiny")[0]
    n_versions = 1 + len(bench.pass_versions(hf.graph))
    assert sum(n.startswith("rlxviz ") for n in names) == n_versions + 1  # + the final without the kernels
    final_ops = len(Pipeline.canonical().run(hf.graph).final.compute_nodes())
    assert names[0].startswith("rlxviz input")
    versions = [n for n in names if n.startswith("rlxviz ")]
    assert f"({final_ops} ops)" in versions[-2] and versions[-1].endswith("without rlxviz CPU kernels")
    assert any(ln.startswith("rlxviz CPU kernels: ") for ln in lines)
    assert sum(n.startswith("hand-written MLX") for n in names) == 2
    assert any(n.startswith("ONNX Runtime") and "rlxviz export" in n for n in names)
    assert any(n.startswith("PyTorch") for n in names)
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        if cells[1] == "-":
            assert "not installed" in cells[0]
            continue
        assert float(cells[2]) > 0 and float(cells[-1]) < 1e-4, r
        assert cells[-2] == "-" or float(cells[-2]) > 0
