"""`rlxviz time --layers 0-K` on an export whose weights are external data: the slice is timed with its real weights,
version 0 is checked against ONNX Runtime on the same slice, the versions are judged against the float64 oracle, and
naming the weights for the timing cache reads none of them (`session.timing.arrays_digest`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from clirun import run

from rlxviz.models.onnx import load_onnx
from rlxviz.models.onnx import weights as onnx_weights
from rlxviz.session.timing import arrays_digest

_spec = importlib.util.spec_from_file_location("make_big_onnx", Path(__file__).parents[1] / "scripts/make_big_onnx.py")
make_big_onnx = importlib.util.module_from_spec(_spec)
sys.modules["make_big_onnx"] = make_big_onnx
_spec.loader.exec_module(make_big_onnx)

GQA = dict(layers=2, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=1024)
MHA = dict(layers=3, hidden=192, heads=3, kv_heads=3, intermediate=384, vocab=512)


def _write(tmp_path: Path, shape: dict, real_layers: int) -> Path:
    return make_big_onnx.build(make_big_onnx.Shape(**shape), tmp_path / "m.onnx", real_layers=real_layers)


def _inputs(tmp_path: Path, vocab: int) -> Path:
    rng = np.random.default_rng(2)
    mask = np.ones((2, 8), np.int64)
    mask[1, :2] = 0
    np.savez(tmp_path / "in.npz", input_ids=rng.integers(0, vocab, (2, 8)), attention_mask=mask)
    return tmp_path / "in.npz"


@pytest.mark.slow
@pytest.mark.parametrize("shape, last", [(GQA, 0), (MHA, 1)], ids=["0-0 gqa", "0-1 of 3 mha"])
def test_time_layers_times_the_slice_and_checks_it_against_onnx_runtime(shape, last, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    p = _write(tmp_path, shape, real_layers=last + 1)  # the slice's weights real, the rest a hole
    code, out, err = run(capsys, "time", p, "--layers", f"0-{last}", "-i", _inputs(tmp_path, shape["vocab"]),
                         "--repeat", "1", "--warmup", "0", "--no-battery", "--max-memory-mb", "512")
    assert code == 0, out + err
    assert "version 0 equals the ONNX model (ONNX Runtime" in out, out
    rows = [line for line in out.splitlines() if line.strip()[:2].strip().isdigit()]
    assert rows and all(line.rstrip().endswith("yes") or "unchanged" in line for line in rows), out


@pytest.mark.parametrize("shape", [GQA, MHA], ids=["gqa", "mha"])
def test_the_timing_cache_names_weights_left_in_their_file_without_reading_them(shape, tmp_path, monkeypatch):
    p = _write(tmp_path, shape, real_layers=shape["layers"])
    m = load_onnx(p, batch=2, seq=8)
    assert onnx_weights.lazy_names(m.weights)
    calls: list[int] = []
    real = onnx_weights.read_bytes
    monkeypatch.setattr(onnx_weights, "read_bytes", lambda f, o, n: calls.append(n) or real(f, o, n))
    first = arrays_digest(m.weights)
    assert not calls  # nothing read to name them
    assert arrays_digest(m.weights) == first
    name = next(iter(onnx_weights.lazy_names(m.weights)))
    m.weights[name]  # read now: still named by its file, the same key
    assert arrays_digest(m.weights) == first
    data = p.with_name(p.name + ".data")
    import os

    st = data.stat()
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file changed: another key
    assert arrays_digest(m.weights) != first


@pytest.mark.parametrize("shape", [GQA, MHA], ids=["gqa", "mha"])
def test_weights_read_from_the_file_are_held_once_on_the_cpu(shape, tmp_path):
    """After an MLX CPU run, a weight read from its file is a read-only NumPy view of the MLX copy (one copy, not
    two); the next run finds it in the executor's cache (no second conversion) and the numbers are unchanged."""
    from rlxviz.runtime import run_reference
    from rlxviz.runtime.executor import MlxExecutor

    p = _write(tmp_path, shape, real_layers=shape["layers"])
    m = load_onnx(p, batch=2, seq=8)
    feeds = dict(np.load(_inputs(tmp_path, shape["vocab"])))
    want = run_reference(m.graph, feeds, m.weights)[0]  # reads every weight into NumPy arrays
    lazy = sorted(onnx_weights.lazy_names(m.weights))
    before = {k: m.weights[k] for k in lazy}
    ex = MlxExecutor(device="cpu")
    got = ex.run(m.graph, feeds, m.weights)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    cached = {k.split("\0")[0]: a for k, (_, a) in ex._weights.items()}
    for k in lazy:
        held = m.weights[k]
        assert held is not before[k] and not held.flags.writeable and np.shares_memory(held, np.asarray(cached[k]))
        np.testing.assert_array_equal(held, before[k])
    n = len(ex._weights)
    again = ex.run(m.graph, feeds, m.weights)[0]
    assert len(ex._weights) == n and all(cached[k.split("\0")[0]] is a for k, (_, a) in ex._weights.items())
    np.testing.assert_array_equal(again, got)
    np.testing.assert_array_equal(run_reference(m.graph, feeds, m.weights)[0], want)


@pytest.mark.parametrize("shape", [GQA, MHA], ids=["gqa", "mha"])
def test_the_time_estimate_counts_weights_held_once_once(shape, tmp_path):
    from rlxviz.ir import Op
    from rlxviz.ir.memory import SLACK_FRACTION, node_bytes, workload_peak

    m = load_onnx(_write(tmp_path, shape, real_layers=0), batch=2, seq=8)
    lazy = onnx_weights.lazy_names(m.weights)
    both, once = workload_peak(m.graph, "time")[0], workload_peak(m.graph, "time", shared=lazy)[0]
    held = sum(node_bytes(n) for n in m.graph if n.op == Op.PARAM and n.attrs["name"] in lazy)
    assert abs((both - once) - held * (1 + SLACK_FRACTION)) <= 1


@pytest.mark.parametrize("command", ["run", "time"])
def test_a_slice_sets_aside_the_whole_models_expected_outputs(command, tmp_path, capsys):
    """An `_io.npz` keeps the whole model's outputs (`out:last_hidden_state`); a slice ends at its own output, so
    `--layers` sets them aside with a note and checks the slice against ONNX Runtime instead (it refused: "names no
    output of the model"). gpt2.onnx has 2 layers: `--layers 0-1` still ends before the final LayerNorm."""
    from clirun import run as cli_run

    onnx_dir = Path(__file__).parent / "fixtures" / "onnx"
    extra = ("-o", str(tmp_path / "o.npz")) if command == "run" else ("--repeat", "1", "--warmup", "0", "--no-battery")
    code, _, err = cli_run(capsys, command, str(onnx_dir / "gpt2.onnx"), "--inputs", str(onnx_dir / "gpt2.npz"),
                           "--layers", "0-1", *extra)
    assert code == 0, err
    assert "out:last_hidden_state of the inputs file set aside" in err and "--layers 0-1" in err, err
