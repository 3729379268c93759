"""Any size: an export whose weights are external data is explained, drawn and printed without reading them.

The files are LLaMA-shaped decoders written by `scripts/make_big_onnx.py` (the dynamo exporter's op structure) with
every initializer in an external-data file; sparse files (`truncate`: apparent size, nothing on disk) stand for
models too large to read. Every byte read from an external-data file goes through `onnx_weights.read_bytes`, which
the tests replace with a counting reader.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from clirun import one_line_error, run

from rlxviz.ir import format_graph
from rlxviz.ir.memory import peak_memory, workload_peak
from rlxviz.models.onnx import OnnxImportError, load_onnx
from rlxviz.models.onnx import weights as onnx_weights
from rlxviz.models.onnx.weights import LAZY_ELEMENTS, LazyWeights, lazy_names
from rlxviz.runtime import run_reference

_spec = importlib.util.spec_from_file_location("make_big_onnx", Path(__file__).parents[1] / "scripts/make_big_onnx.py")
make_big_onnx = importlib.util.module_from_spec(_spec)
sys.modules["make_big_onnx"] = make_big_onnx  # dataclasses look their module up
_spec.loader.exec_module(make_big_onnx)

SMALL = dict(layers=2, hidden=512, heads=4, kv_heads=2, intermediate=1024, vocab=2048)
"""Weights of 22 MiB: every matrix over `LAZY_ELEMENTS` elements, norm weights and `inv_freq` under it."""
WIDE = dict(layers=2, hidden=384, heads=6, kv_heads=6, intermediate=768, vocab=512)
"""A second kind: no grouped-query heads (kv_heads = heads), most bytes in the layers, not the embedding."""
LIMIT_MB = "8"
"""Under both models' weights: a load that read (or counted) them would be refused."""


class Counter:
    """A `read_bytes` that counts what it reads: calls as (file name, length)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.real = onnx_weights.read_bytes

    def __call__(self, path: Path, offset: int, length: int) -> bytes:
        self.calls.append((Path(path).name, length))
        return self.real(path, offset, length)

    @property
    def total(self) -> int:
        return sum(n for _, n in self.calls)


@pytest.fixture
def reads(monkeypatch) -> Counter:
    c = Counter()
    monkeypatch.setattr(onnx_weights, "read_bytes", c)
    return c


def _write(tmp_path: Path, shape: dict, real: bool, name: str = "m", torch_layout: bool = False) -> Path:
    return make_big_onnx.build(make_big_onnx.Shape(**shape), tmp_path / f"{name}.onnx", real=real,
                               torch_layout=torch_layout)


def _weight_bytes(path: Path) -> int:
    m = onnx.load(str(path), load_external_data=False)
    return sum(4 * math.prod(t.dims) for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)


def _feeds(vocab: int, batch: int = 2, seq: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    mask = np.ones((batch, seq), np.int64)
    mask[-1, :3] = 0  # left padding in the last row
    return {"input_ids": rng.integers(0, vocab, (batch, seq)), "attention_mask": mask}


def test_the_generated_file_is_sparse_and_valid(tmp_path):
    p = _write(tmp_path, SMALL, real=False)
    data = p.with_name(p.name + ".data")
    assert data.stat().st_size >= _weight_bytes(p) > 8 << 20
    assert data.stat().st_blocks * 512 < data.stat().st_size / 4  # mostly holes
    onnx.checker.check_model(str(p), full_check=True)  # shape inference over the whole graph, no data read


@pytest.mark.parametrize("shape, torch_layout", [(SMALL, False), (WIDE, False), (WIDE, True)],
                         ids=["gqa", "mha", "mha-transposed"])
def test_explain_under_a_tiny_limit_reads_no_weight(shape, torch_layout, tmp_path, capsys, monkeypatch, reads):
    p = _write(tmp_path, shape, real=False, torch_layout=torch_layout)
    assert _weight_bytes(p) > float(LIMIT_MB) * (1 << 20)
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", LIMIT_MB)
    code, out, err = run(capsys, "explain", p)
    assert code == 0, out + err
    assert "2/2 layer(s) fused as expected" in out
    assert "version 0 not checked against the ONNX model: its weights" in out and "--layers 0-1" in out
    assert all(n <= 4 * LAZY_ELEMENTS for _, n in reads.calls), reads.calls  # only the small constants
    assert reads.total < 64 << 10, reads.calls


@pytest.mark.parametrize("command", [("render", "--view", "layers", "-o", "g.svg"), ("ir",), ("export", "me.json")])
def test_render_ir_and_model_explorer_json_read_no_weight(command, tmp_path, capsys, monkeypatch, reads):
    p = _write(tmp_path, SMALL, real=False)
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", LIMIT_MB)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, command[0], p, *command[1:])
    assert code == 0, err
    assert all(n <= 4 * LAZY_ELEMENTS for _, n in reads.calls) and reads.total < 64 << 10, reads.calls


@pytest.mark.parametrize("command", [("run", "-i", "in.npz", "-o", "out.npz"), ("time", "--repeat", "1"),
                                     ("export", "x.onnx")])
def test_commands_that_read_every_weight_refuse_in_one_line_and_offer_a_slice(command, tmp_path, capsys,
                                                                              monkeypatch, reads):
    p = _write(tmp_path, SMALL, real=False)
    np.savez(tmp_path / "in.npz", **_feeds(SMALL["vocab"]))
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", LIMIT_MB)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, command[0], p, *command[1:])
    assert code == 2
    one_line_error(err, command[0], "--layers 0-1")
    assert all(n <= 4 * LAZY_ELEMENTS for _, n in reads.calls), reads.calls  # refused before reading


@pytest.mark.parametrize("shape, torch_layout", [(SMALL, False), (WIDE, False), (SMALL, True)],
                         ids=["gqa", "mha", "gqa-transposed"])
def test_lazy_import_is_the_eager_import(shape, torch_layout, tmp_path, reads):
    """Same graph text, same param names, and the same numbers (bit for bit) as reading every weight at load; with
    torch's `[out, in]` weights behind a Transpose node too (read transposed, as the eager import folds them)."""
    p = _write(tmp_path, shape, real=True, torch_layout=torch_layout)
    lazy = load_onnx(p, batch=2, seq=8)
    assert isinstance(lazy.weights, LazyWeights) and reads.total < 64 << 10
    eager = load_onnx(p, batch=2, seq=8, lazy_elements=None)
    assert not lazy_names(eager.weights)
    assert format_graph(lazy.graph) == format_graph(eager.graph)
    assert sorted(lazy.weights) == sorted(eager.weights)
    feeds = _feeds(shape["vocab"])
    before = reads.total
    got = run_reference(lazy.graph, feeds, lazy.weights)[0]
    np.testing.assert_array_equal(got, run_reference(eager.graph, feeds, eager.weights)[0])
    assert reads.total - before == lazy.weights.lazy_bytes()  # each weight read once, on its first use


def test_run_on_real_external_data_equals_onnx_runtime(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    p = _write(tmp_path, SMALL, real=True)
    feeds = _feeds(SMALL["vocab"])
    np.savez(tmp_path / "in.npz", **feeds)
    code, out, err = run(capsys, "run", p, "-i", tmp_path / "in.npz", "-o", tmp_path / "out.npz")
    assert code == 0, err
    assert "version 0 equals the ONNX model" in err
    want = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["last_hidden_state"], want, atol=1e-4, rtol=1e-4)


def test_weights_read_on_access_one_at_a_time(tmp_path, reads):
    p = _write(tmp_path, SMALL, real=True)
    w = load_onnx(p).weights
    assert isinstance(w, LazyWeights)
    name = next(k for k in w.lazy if "q_proj" in k)
    shape, dtype = w.shape_dtype(name)
    start, pending = reads.total, w.pending_bytes()
    a = w[name]
    assert a.shape == shape == (SMALL["hidden"], SMALL["hidden"]) and a.dtype == dtype == np.float32
    assert reads.total - start == a.nbytes and w.pending_bytes() == pending - a.nbytes
    assert w[name] is a and reads.total - start == a.nbytes  # kept, not read again
    assert name in w.in_memory() and len(w) == len(list(w))


def test_the_load_check_does_not_count_weights_left_in_the_file(tmp_path):
    p = _write(tmp_path, SMALL, real=False)
    m = load_onnx(p)
    unloaded = lazy_names(m.weights)
    full, lean = peak_memory(m.graph), peak_memory(m.graph, unloaded=unloaded)
    proto = onnx.load(str(p), load_external_data=False)
    big = sum(4 * math.prod(t.dims) for t in proto.graph.initializer if math.prod(t.dims) > LAZY_ELEMENTS)
    assert full.leaf_bytes - lean.leaf_bytes == m.weights.lazy_bytes() == big > 0.99 * _weight_bytes(p)
    assert workload_peak(m.graph, "run", unloaded=unloaded) == workload_peak(m.graph, "run")  # run reads them


def test_a_small_limit_still_refuses_what_is_read_at_load(tmp_path):
    """The initializers read at load (the small ones, and all of them with lazy_elements=None) still count."""
    p = _write(tmp_path, SMALL, real=False)
    with pytest.raises(OnnxImportError, match="initializers need"):
        load_onnx(p, max_bytes=1 << 20, lazy_elements=None)
    load_onnx(p, max_bytes=1 << 20)  # the 22 MiB of matrices stay in their file


@pytest.mark.parametrize("where, message", [("../outside.bin", "outside the model's folder"),
                                            ("missing.bin", "does not exist")])
def test_a_bad_external_location_is_one_error_even_for_a_weight_left_in_the_file(where, message, tmp_path):
    p = _write(tmp_path, SMALL, real=False)
    m = onnx.load(str(p), load_external_data=False)
    big = next(t for t in m.graph.initializer if math.prod(t.dims) > LAZY_ELEMENTS)
    for e in big.external_data:
        if e.key == "location":
            e.value = where
    q = tmp_path / "q.onnx"  # next to the data file the other initializers read
    onnx.save(m, str(q))
    with pytest.raises(OnnxImportError, match=message):
        load_onnx(q)


# -- --layers: a slice of a model that does not fit ------------------------------------------------------------------

def _full_with_output(p: Path, value: str) -> Path:
    """The model at `p` with `value` added as a graph output (same folder, same data file), for ONNX Runtime."""
    from onnx import shape_inference

    m = shape_inference.infer_shapes(onnx.load(str(p), load_external_data=False))
    vi = next(v for v in m.graph.value_info if v.name == value)
    m.graph.output.append(vi)
    q = p.with_name("with_cut.onnx")
    onnx.save(m, str(q))
    return q


@pytest.mark.parametrize("shape, last", [(SMALL, 0), (dict(WIDE, layers=3), 1)], ids=["0-0 gqa", "0-1 of 3 mha"])
def test_run_layers_runs_the_slice_with_real_weights_and_checks_it(shape, last, tmp_path, capsys, monkeypatch,
                                                                  reads):
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    p = _write(tmp_path, shape, real=True)
    feeds = _feeds(shape["vocab"])
    np.savez(tmp_path / "in.npz", **feeds)
    from rlxviz.models.onnx.slice import slice_layers

    need = [workload_peak(load_onnx(f, batch=2, seq=8).graph, "run")[0] for f in (p, slice_layers(p, 0, last))]
    assert need[1] < need[0]
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", str((need[0] + need[1]) / 2 / (1 << 20)))  # the slice fits, not all
    code, _, err = run(capsys, "run", p, "-i", tmp_path / "in.npz", "-o", tmp_path / "full.npz")
    assert code == 2 and "--layers 0-1" in err
    code, _, err = run(capsys, "run", p, "--layers", f"0-{last}", "-i", tmp_path / "in.npz", "-o", tmp_path / "out.npz")
    assert code == 0, err
    assert f"{p.stem}.layers0-{last}: version 0 equals the ONNX model" in err
    out = dict(np.load(tmp_path / "out.npz"))
    (name, got), = out.items()
    assert got.shape == (2, 8, shape["hidden"])
    # the original model's own value at the cut, from ONNX Runtime on the whole file
    want = ort.InferenceSession(str(_full_with_output(p, name)), providers=["CPUExecutionProvider"]).run(
        [name], feeds)[0]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    per_layer = sum(4 * math.prod(t.dims) for t in onnx.load(str(p), load_external_data=False).graph.initializer
                    if ".layers.1." in t.name)
    assert reads.total <= _weight_bytes(p) - (shape["layers"] - last - 1) * per_layer + (64 << 10)  # not the rest


def test_run_max_memory_mb_is_the_limit_of_the_run_and_of_its_check(tmp_path, capsys, monkeypatch):
    """`run --max-memory-mb` (as every other subcommand) sets the limit, and the check of version 0 against ONNX
    Runtime reads the weights under that same limit: no "left in their file ... over the limit (default)" while the
    run itself, under the flag, read them."""
    pytest.importorskip("onnxruntime")
    p = _write(tmp_path, SMALL, real=True)
    np.savez(tmp_path / "in.npz", **_feeds(SMALL["vocab"]))
    need = workload_peak(load_onnx(p, batch=2, seq=8).graph, "run")[0]
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", str(need / 2 / (1 << 20)))  # the default: too small for the run
    args = ("run", p, "-i", tmp_path / "in.npz", "-o", tmp_path / "out.npz")
    code, _, err = run(capsys, *args)
    assert code == 2 and "over the limit" in err
    code, _, err = run(capsys, *args, "--max-memory-mb", str(2 * need // (1 << 20) + 1))
    assert code == 0, err
    assert "version 0 equals the ONNX model" in err and "not checked" not in err, err


@pytest.mark.parametrize("layers, message", [("1-1", "a slice starts at the first layer (0): give 0-1"),
                                             ("0-5", "layer 5 is not in this model (layers 0..1)"),
                                             ("1-0", "the last layer 0 is before the first 1"),
                                             ("first", "expected FIRST-LAST")])
def test_a_bad_slice_is_one_line(layers, message, tmp_path, capsys):
    p = _write(tmp_path, SMALL, real=False)
    np.savez(tmp_path / "in.npz", **_feeds(SMALL["vocab"]))
    code, _, err = run(capsys, "run", p, "--layers", layers, "-i", tmp_path / "in.npz", "-o", tmp_path / "o.npz")
    assert code == 2
    one_line_error(err, "run", message)


def test_layers_needs_an_onnx_file(tmp_path, capsys):
    np.savez(tmp_path / "in.npz", **_feeds(100))
    code, _, err = run(capsys, "run", "llama-block", "--layers", "0-0", "-i", tmp_path / "in.npz", "-o",
                       tmp_path / "o.npz")
    assert code == 2
    one_line_error(err, "run", "--layers applies to an .onnx export")


def test_time_layers_checks_the_slice(tmp_path, capsys, monkeypatch):
    p = _write(tmp_path, SMALL, real=True)
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", "300")
    code, out, err = run(capsys, "time", p, "--layers", "0-0", "--repeat", "1", "--warmup", "0", "--no-battery")
    assert code == 0, out + err
    assert "version 0 equals the ONNX model" in out


def test_the_session_loader_and_a_pickled_model_read_nothing(tmp_path, monkeypatch, reads):
    """`session.load` (every front end, the app's child process too) under a limit below the weights, and the
    model pickled back from that child: nothing big is read, and a weight still reads from its file afterwards."""
    import pickle

    from rlxviz.session import Limits, load

    p = _write(tmp_path, SMALL, real=True)
    m = load(str(p), limits=Limits(float(LIMIT_MB)))
    back = pickle.loads(pickle.dumps(m))
    assert len(pickle.dumps(m)) < 1 << 20 and reads.total < 64 << 10
    name = next(iter(back.weights.lazy))
    np.testing.assert_array_equal(back.weights[name], load_onnx(p, lazy_elements=None).weights[name])


def _table_model(tmp_path: Path, select: str) -> Path:
    """x [2, 8, 64] times rows 0..7 of an external [4096, 64] table (a RoPE cache: 256 Ki elements, over
    `LAZY_ELEMENTS`), selected by a constant Gather or Slice, plus x @ an external [64, 4096] weight summed back."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    table = rng.standard_normal((4096, 64)).astype(np.float32)
    w = rng.standard_normal((64, 4096)).astype(np.float32)
    data = tmp_path / "t.onnx.data"
    data.write_bytes(table.tobytes() + w.tobytes())
    inits = []
    for name, arr, off in (("rope.cos_cached", table, 0), ("proj.weight", w, table.nbytes)):
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(arr.shape),
                        data_location=TensorProto.EXTERNAL)
        for k, v in (("location", data.name), ("offset", str(off)), ("length", str(arr.nbytes))):
            t.external_data.add(key=k, value=v)
        inits.append(t)
    inits += [onnx.numpy_helper.from_array(np.arange(8, dtype=np.int64), "pos"),
              onnx.numpy_helper.from_array(np.array([0], np.int64), "zero"),
              onnx.numpy_helper.from_array(np.array([8], np.int64), "eight"),
              onnx.numpy_helper.from_array(np.array([-1], np.int64), "last")]
    sel = (helper.make_node("Gather", ["rope.cos_cached", "pos"], ["cos"], axis=0) if select == "gather" else
           helper.make_node("Slice", ["rope.cos_cached", "zero", "eight", "zero"], ["cos"]))
    nodes = [sel, helper.make_node("Mul", ["x", "cos"], ["xc"]),
             helper.make_node("MatMul", ["xc", "proj.weight"], ["h"]),
             helper.make_node("ReduceSum", ["h", "last"], ["s"], keepdims=1),
             helper.make_node("Add", ["xc", "s"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 64])], inits)
    p = tmp_path / "t.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(p))
    return p


@pytest.mark.parametrize("select", ["gather", "slice"])
def test_a_table_selected_by_constants_is_read_on_demand_and_folded(select, tmp_path, reads):
    """A weight the import must fold (a cache table gathered or sliced at constant positions) is read when that
    node is reached, and the graph is the eager import's; the matmul weight next to it is not read."""
    p = _table_model(tmp_path, select)
    lazy = load_onnx(p)
    assert reads.calls == [("t.onnx.data", 4096 * 64 * 4)]  # the table, once; not the projection
    eager = load_onnx(p, lazy_elements=None)
    assert format_graph(lazy.graph) == format_graph(eager.graph)
    assert lazy_names(lazy.weights) == {"proj.weight"}
    x = {"x": np.random.default_rng(0).standard_normal((2, 8, 64)).astype(np.float32)}
    np.testing.assert_array_equal(run_reference(lazy.graph, x, lazy.weights)[0],
                                  run_reference(eager.graph, x, eager.weights)[0])
