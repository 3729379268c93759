"""User inputs (`.npz` for `rlxviz run`, `rlxviz time --inputs` and the app's uploads) go through one loader,
`runtime.battery.load_inputs`: names, shapes and dtypes from the `.npy` headers before any array is read, then the
values (`check_inputs`): integer inputs that index a table in range, masks 0/1, floats finite."""

import io
import zipfile

import numpy as np
import pytest
from clirun import one_line_error, run

from rlxviz.ir import parse_ir
from rlxviz.runtime.battery import check_inputs, index_bounds, load_inputs, npz_headers


def _bert_inputs(ids, mask=1):
    return {"input_ids": np.full((1, 16), ids, np.int64), "attention_mask": np.full((1, 16), mask, np.int64)}


BAD_BERT = [
    (_bert_inputs(10 ** 9), "input 'input_ids' must lie in 0..999 (the vocabulary), got 1000000000..1000000000"),
    (_bert_inputs(1000), "input 'input_ids' must lie in 0..999 (the vocabulary), got 1000..1000"),
    (_bert_inputs(-5), "input 'input_ids' must lie in 0..999 (the vocabulary), got -5..-5"),
    (_bert_inputs(3, mask=7), "input 'attention_mask' is a mask and must hold only 0 and 1, got 7"),
    (_bert_inputs(3, mask=-1), "input 'attention_mask' is a mask and must hold only 0 and 1, got -1"),
]


@pytest.mark.parametrize("command", ["time", "run"])
@pytest.mark.parametrize("arrays, fragment", BAD_BERT)
def test_out_of_range_ids_and_masks_refused_by_run_and_time(tmp_path, capsys, command, arrays, fragment):
    """Was: `time` segfaulted on ids 1e9 (MLX take reads outside the table) and accepted ids -5 and mask 7."""
    np.savez(tmp_path / "in.npz", **arrays)
    if command == "time":
        args = ("time", "bert-tiny", "--repeat", 1, "--no-battery", "--inputs", tmp_path / "in.npz")
    else:
        args = ("run", "bert-tiny", "--inputs", tmp_path / "in.npz", "-o", tmp_path / "out.npz")
    code, _, err = run(capsys, *args)
    assert code == 2
    one_line_error(err, command, fragment)


@pytest.mark.parametrize("arrays, fragment", BAD_BERT)
def test_uploaded_inputs_checked_the_same(arrays, fragment):
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState

    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=16)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    s.set_user_inputs(buf.getvalue(), "upload.npz")
    assert s.user_inputs is None and fragment in s.message


GATHER_IR = """graph g {
  %0 = input {name="tok"} : i32[2, 3]
  %1 = param {name="table"} : f32[10, 4]
  %2 = reshape(%0) {shape=[6]} : i32[6]
  %3 = cast(%2) {dtype="i64"} : i64[6]
  %4 = gather(%1, %3) {axis=0} : f32[6, 4]
  %5 = input {name="pos"} : i64[3]
  %6 = param {name="ptab"} : f32[5, 4]
  %7 = gather(%6, %5) {axis=0} : f32[3, 4]
  return %4, %7
}
"""


def test_gather_indices_fed_by_inputs_are_checked_for_any_graph(tmp_path, capsys):
    g = parse_ir(GATHER_IR)
    assert index_bounds(g) == {"tok": [(10, "the rows of 'table'")], "pos": [(5, "the rows of 'ptab'")]}
    ok = {"tok": np.arange(6, dtype=np.int32).reshape(2, 3) + 4, "pos": np.array([0, 4, 2])}
    assert check_inputs(ok, g).feeds["tok"].dtype == np.int32
    for name, bad, fragment in (("tok", np.full((2, 3), 10, np.int32), "input 'tok' must lie in 0..9 "
                                 "(the rows of 'table'), got 10..10"),
                                ("pos", np.array([0, -1, 2]), "input 'pos' must lie in 0..4 (the rows of 'ptab'), "
                                 "got -1..2")):
        with pytest.raises(ValueError, match=r"must lie in"):
            check_inputs({**ok, name: bad}, g)
        (tmp_path / "g.ir").write_text(GATHER_IR)
        np.savez(tmp_path / "in.npz", **{**ok, name: bad})
        code, _, err = run(capsys, "time", tmp_path / "g.ir", "--repeat", 1, "--no-battery",
                           "--inputs", tmp_path / "in.npz")
        assert code == 2
        one_line_error(err, "time", fragment)


def _bomb(path, name="x", n=6000):
    """An .npz whose one array decompresses to n*n float32 (144 MB for n=6000) from a few hundred KB."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z, z.open(f"{name}.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (n, n)})
        row = bytes(4 * n)
        for _ in range(n):
            f.write(row)


def _lying(path, name="x", shape=(100000, 100000)):
    """An .npz whose header claims `shape` and holds no data."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.npy", buf.getvalue())


@pytest.fixture
def no_array_read(monkeypatch):
    """Fail the test if any array of an .npz is read (decompressed)."""
    def refuse(self, key):
        raise AssertionError(f"array {key!r} was read before its header was checked")

    monkeypatch.setattr(np.lib.npyio.NpzFile, "__getitem__", refuse)


@pytest.mark.parametrize("make", [_bomb, _lying])
@pytest.mark.parametrize("name, model, fragment", [
    ("x", "minilm", "needs 'input_ids' and 'attention_mask'"),
    ("input_ids", "minilm", "must be in 1..512"),
    ("hidden_states", "llama-block", "must be a non-empty rank-3 array, got shape"),
])
def test_run_checks_headers_before_reading_any_array(tmp_path, capsys, no_array_read, make, name, model, fragment):
    """Was: `run` decompressed a deflate bomb (3.6 GB RSS) before checking names/shapes, and a header claiming
    (100000, 100000) gave 'out of memory ... try a smaller model'. Now the headers decide, as for `time`."""
    make(tmp_path / "in.npz", name)
    code, _, err = run(capsys, "run", model, "--inputs", tmp_path / "in.npz", "-o", tmp_path / "out.npz")
    assert code == 2 and "out of memory" not in err
    one_line_error(err, "run", fragment)


def test_npz_headers_read_nothing_but_headers(tmp_path, no_array_read):
    _bomb(tmp_path / "b.npz", "x")
    _lying(tmp_path / "l.npz", "y")
    assert npz_headers(tmp_path / "b.npz")["x"][0] == (6000, 6000)
    assert npz_headers(tmp_path / "l.npz")["y"][0] == (100000, 100000)
    np.savez(tmp_path / "o.npz", x=np.array([object()], dtype=object))
    with pytest.raises(ValueError, match="holds Python objects"):
        npz_headers(tmp_path / "o.npz")


def test_nonfinite_float_inputs_refused_everywhere(tmp_path):
    g = parse_ir('graph t {\n  %0 = input {name="x"} : f32[2]\n  %1 = exp(%0) : f32[2]\n  return %1\n}\n')
    np.savez(tmp_path / "nan.npz", x=np.array([1.0, np.nan], np.float32))
    with pytest.raises(ValueError, match="input 'x' must hold finite numbers"):
        load_inputs(tmp_path / "nan.npz", g)


COMPUTED_IR = """graph g {
  %0 = input {name="tok"} : i64[6]
  %1 = param {name="table"} : f32[3, 4]
  %2 = const {value=OFFSET} : i64[]
  %3 = add(%0, %2) : i64[6]
  %4 = gather(%1, %3) {axis=0} : f32[6, 4]
  return %4
}
"""


def test_computed_gather_indices_out_of_range_refused_before_mlx(tmp_path, capsys):
    """Was: indices computed from an input (add(ids, 1e8)) reached MLX's take unchecked: exit 139 (segfault).
    Every MLX run (`MlxExecutor.bind`) now checks each gather's indices (computed by the reference if need be)."""
    pytest.importorskip("rlxviz.kernels.mlx_backend")
    from rlxviz.runtime.executor import MlxExecutor, check_gather_indices

    (tmp_path / "g.ir").write_text(COMPUTED_IR.replace("OFFSET", "100000000"))
    code, _, err = run(capsys, "time", tmp_path / "g.ir", "--repeat", 1)
    assert code == 2
    one_line_error(err, "time", "gather %4: index values 100000000..")
    g = parse_ir(COMPUTED_IR.replace("OFFSET", "-2"))
    table = np.arange(12, dtype=np.float32).reshape(3, 4)
    check_gather_indices(g, {"tok": np.array([0, 1, 2, 3, 4, 1])}, {"table": table})  # -2..2: counts from the end
    out = MlxExecutor().run(g, {"tok": np.array([0, 1, 2, 3, 4, 1])}, {"table": table})[0]
    assert np.array_equal(out, np.take(table, np.array([-2, -1, 0, 1, 2, -1]), axis=0))
    with pytest.raises(ValueError, match=r"gather %4: index values -4\.\.2 lie outside the 3 rows of"):
        MlxExecutor().run(g, {"tok": np.array([-2, 1, 2, 3, 4, 1])}, {"table": table})


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


@pytest.mark.parametrize("expected", [
    {"out:last_hidden_state": np.zeros((2, 8, 64), np.float32)},  # as the exporters write it
    {"out:y": np.zeros((3,), np.int64), "out:z": np.ones((1, 1, 1), np.float16)},  # any shape, dtype, count
    {"out:input_ids": np.zeros((5,), np.float64)},  # an expected output named like an input is still set aside
])
def test_expected_outputs_in_an_inputs_npz_are_set_aside(expected):
    """An `.npz` holding `out:NAME` arrays beside the inputs (tests/fixtures/onnx/gpt2.npz, the cases'
    `*_io.npz`) is accepted: the outputs are not inputs, so they are neither checked nor read; any other
    unknown name is still refused."""
    from rlxviz import session

    g = session.load("bert-tiny").graph  # input_ids, attention_mask: i64[1, 16]
    feeds = _bert_inputs(3)
    got = load_inputs(_npz(**feeds, **expected), g, "io.npz")
    assert set(got.feeds) == set(feeds) and all(np.array_equal(got.feeds[k], feeds[k]) for k in feeds)
    with pytest.raises(ValueError, match=r"unknown input\(s\) output"):
        load_inputs(_npz(**feeds, **expected, output=np.zeros(3)), g, "io.npz")


def test_the_projects_gpt2_npz_loads_for_its_onnx_export():
    from pathlib import Path

    from rlxviz import session

    root = Path(__file__).resolve().parents[1] / "tests/fixtures/onnx"
    model = session.load(str(root / "gpt2.onnx"), batch=2, seq=8)  # the shapes its arrays were saved at
    got = load_inputs(root / "gpt2.npz", model.graph)
    with np.load(root / "gpt2.npz") as z:
        assert set(z.files) == {"input_ids", "out:last_hidden_state"}
        assert list(got.feeds) == ["input_ids"] and np.array_equal(got.feeds["input_ids"], z["input_ids"])
