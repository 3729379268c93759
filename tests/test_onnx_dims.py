"""Binding an ONNX file's symbolic dims from the CLI (`--dim NAME=VALUE`, `--inputs IN.npz`) in every subcommand that
loads a model (`models.onnx.dims`): optimum's decoder with past key values (a dim written as
`past_sequence_length + sequence_length`) explains, and so do files whose dims no default binds (`height`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from clirun import one_line_error, run
from onnx import TensorProto, helper, numpy_helper

from rlxviz.ir import Op
from rlxviz.models.onnx.dims import DimError, bind_input_shapes, parse_dim
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference
from rlxviz.session import load

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"
LLAMA = CASES / "optimum.llama-with-past.onnx"
LLAMA_IO = CASES / "optimum.llama-with-past_io.npz"


def test_optimum_decoder_with_past_explains_from_the_cli_on_its_inputs(capsys):
    """Was refused: "index 23 is outside the 16 rows" (the mask's `past + seq` dim bound to seq alone)."""
    code, out, err = run(capsys, "explain", LLAMA, "--inputs", LLAMA_IO)
    assert code == 0, out + err  # RoPE at per-row position ids packs too (one cos/sin table per batch row)
    assert "2/2 layer(s) fused as expected" in out
    assert "equals the expected outputs in optimum.llama-with-past_io.npz" in out
    assert "equals the ONNX model" in out


def test_optimum_decoder_with_past_explains_with_no_flags_and_packs(capsys):
    """The defaults bind past_sequence_length and sequence_length each to --seq; the mask's dim is their sum."""
    code, out, err = run(capsys, "explain", LLAMA)
    assert code == 0, out + err
    assert "2/2 layer(s) fused as expected" in out and "attention" in out


def test_optimum_decoder_with_past_keeps_the_files_numbers_in_every_version(tmp_path):
    """Every version (the rope op reading [B, S, d/2] tables gathered at position_ids) and the exported final
    version (run by ONNX Runtime) give the file's numbers."""
    import onnxruntime as ort

    from rlxviz.models.onnx.export import export_onnx

    d = dict(np.load(LLAMA_IO))
    feeds = {k: v for k, v in d.items() if not k.startswith("out:")}
    m = load(str(LLAMA), input_shapes={k: v.shape for k, v in feeds.items()})
    trace = Pipeline.canonical().run(m.graph)
    assert sum(n.op == Op.ATTENTION for n in trace.final) == 2
    assert sum(n.op == Op.ROPE and trace.final[n.inputs[1]].shape == (2, 8, 8) for n in trace.final) == 4
    want = [d[f"out:{name}"] for name in m.meta["onnx_outputs"]]
    for _, g in trace.versions():
        for got, w in zip(run_reference(g, feeds, m.weights), want, strict=True):
            np.testing.assert_allclose(got, w, atol=1e-5, rtol=0)
    export_onnx(trace.final, m.weights, tmp_path / "final.onnx")
    sess = ort.InferenceSession(str(tmp_path / "final.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    for got, w in zip(sess.run(None, {k: v for k, v in feeds.items() if k in names}), want, strict=True):
        np.testing.assert_allclose(got, w, atol=1e-5, rtol=0)


def test_dims_named_on_the_command_line_bind_every_input(capsys):
    m = load(str(LLAMA), dims={"batch_size": 2, "sequence_length": 8, "past_sequence_length": 16})
    shapes = {n.attrs["name"]: n.shape for n in m.graph.inputs}
    assert shapes["attention_mask"] == (2, 24) and shapes["past_key_values.0.key"] == (2, 2, 16, 16)
    assert shapes["input_ids"] == (2, 8)


def _vision(path: Path) -> None:
    """pixel_values [batch, 3, height, width] -> mean over the image -> Linear: the dims optimum names for images."""
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "w")
    axes = numpy_helper.from_array(np.asarray([2, 3], np.int64), "axes")
    g = helper.make_graph([helper.make_node("ReduceMean", ["pixel_values", "axes"], ["m"], keepdims=0),
                           helper.make_node("MatMul", ["m", "w"], ["y"])], "vision",
                          [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT,
                                                         ["batch_size", 3, "height", "width"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch_size", 4])], [w, axes])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))


@pytest.mark.parametrize("command", ["explain", "ir", "render", "export"])
def test_a_dim_no_default_binds_is_named_with_the_flag_that_binds_it(tmp_path, capsys, command):
    _vision(tmp_path / "v.onnx")
    extra = {"render": ["-o", tmp_path / "o.dot"], "export": [tmp_path / "o.json"]}.get(command, [])
    code, _, err = run(capsys, command, tmp_path / "v.onnx", *extra)
    assert code == 2
    one_line_error(err, command, "cannot bind dimensions 2 (height), 3 (width); pass --dim height=N --dim width=N "
                                 "(Python: dims={'height': N, 'width': N})")
    code, out, err = run(capsys, command, tmp_path / "v.onnx", "--dim", "height=6", "--dim", "width=10", *extra)
    assert code in (0, 1), err
    if command == "ir":
        assert "[1, 3, 6, 10]" in out


def test_inputs_bind_the_shapes_and_the_dims_they_name(tmp_path, capsys):
    _vision(tmp_path / "v.onnx")
    np.savez(tmp_path / "in.npz", pixel_values=np.zeros((2, 3, 5, 7), np.float32))
    code, out, err = run(capsys, "ir", tmp_path / "v.onnx", "--inputs", tmp_path / "in.npz")
    assert code == 0, err
    assert "[2, 3, 5, 7]" in out


def _vi(name: str, dims: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def test_expressions_follow_their_names_and_given_arrays_bind_names():
    ins = [_vi("ids", ["batch_size", "sequence_length"]), _vi("mask", ["batch_size", "past + sequence_length"]),
           _vi("past_k", ["batch_size", 2, "past", 4])]
    with pytest.raises(DimError, match=r"'mask': dimension 1 \(past \+ sequence_length\) needs 'past'; pass --dim "
                                       r"past=N \(Python: dims=\{'past': N\}\)"):
        bind_input_shapes(ins, 2, 8)
    assert bind_input_shapes(ins, 2, 8, {"past": 3})["mask"] == (2, 11)
    got = bind_input_shapes(ins, 1, 8, None, {"past_k": (2, 2, 5, 4)})
    assert got == {"ids": (2, 8), "mask": (2, 13), "past_k": (2, 2, 5, 4)}
    with pytest.raises(DimError, match="the inputs disagree on 'batch_size'"):
        bind_input_shapes(ins, 1, 8, None, {"past_k": (2, 2, 5, 4), "ids": (3, 8)})
    with pytest.raises(DimError, match="cannot bind dimension 1"):
        bind_input_shapes([_vi("x", ["n", "a * (b"])], 1, 8, {"n": 1})


@pytest.mark.parametrize("dims, said, names", [
    # newcomer run: `(Python: dims=)` was empty for an expression; each form names its dims in both remedies
    (["batch", "past + 1"], "dimension 1 (past + 1) needs 'past'", ["past"]),
    (["batch", "2*n"], "dimension 1 (2*n) needs 'n'", ["n"]),
    (["batch", "past+kv"], "dimension 1 (past+kv) needs 'past' and 'kv'", ["past", "kv"]),
    (["batch", "(past +\n kv) // 2"], "dimension 1 ((past + kv) // 2) needs 'past' and 'kv'", ["past", "kv"]),
])
def test_an_expressions_unbound_names_are_all_in_the_python_hint(dims, said, names):
    with pytest.raises(DimError) as e:
        bind_input_shapes([_vi("mask", dims)], 1, 8)
    msg = str(e.value)
    flags = " ".join(f"--dim {n}=N" for n in names)
    python = ", ".join(f"{n!r}: N" for n in names)
    assert msg == f"input 'mask': {said}; pass {flags} (Python: dims={{{python}}}) or the inputs with --inputs", msg
    assert e.value.names == tuple(names) and e.value.input == "mask" and e.value.where == {}
    values = dict.fromkeys(names, 4)
    assert bind_input_shapes([_vi("mask", dims)], 1, 8, values)["mask"][1] > 0  # the hint's names do bind it


def test_every_unbound_dim_is_named_at_once_across_inputs():
    """The newcomer set num_channels, then was told of height, then of width: one message now names them all, each
    name once (at the first input that meets it), and where each is an input's own dim."""
    ins = [_vi("pixel_values", ["batch", "num_channels", "height", "width"]),
           _vi("mask", ["batch", "height * width + extra"]), _vi("extra_k", ["batch", 2, "extra", 4])]
    with pytest.raises(DimError) as e:
        bind_input_shapes(ins, 1, 8)
    assert str(e.value) == (
        "input 'pixel_values': cannot bind dimensions 1 (num_channels), 2 (height), 3 (width); input 'mask': "
        "dimension 1 (height * width + extra) needs 'extra'; pass --dim num_channels=N --dim height=N --dim width=N "
        "--dim extra=N (Python: dims={'num_channels': N, 'height': N, 'width': N, 'extra': N}) or the inputs with "
        "--inputs")
    assert e.value.names == ("num_channels", "height", "width", "extra") and e.value.input == "pixel_values"
    assert e.value.where == {"num_channels": ("pixel_values", 1), "height": ("pixel_values", 2),
                             "width": ("pixel_values", 3), "extra": ("extra_k", 2)}
    assert e.value.what == str(e.value).split("; pass ")[0]
    got = bind_input_shapes(ins, 1, 8, {"num_channels": 3, "height": 4, "width": 5, "extra": 2})
    assert got == {"pixel_values": (1, 3, 4, 5), "mask": (1, 22), "extra_k": (1, 2, 2, 4)}
    with pytest.raises(DimError, match=r"^input 'pixel_values': cannot bind dimension 2 \(height\); pass --dim "
                                       r"height=N \(Python: dims=\{'height': N\}\) or the input's array with"):
        bind_input_shapes(ins[:1], 1, 8, {"num_channels": 3, "width": 5})


@pytest.mark.parametrize("text", ["height", "height=", "height=-3", "=4", "h=2.5"])
def test_a_bad_dim_flag_is_refused(text, capsys):
    with pytest.raises(DimError, match="NAME=VALUE"):
        parse_dim(text)
    with pytest.raises(SystemExit) as e:  # argparse's usage error
        run(capsys, "explain", LLAMA, "--dim", text)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err and "argument --dim: give NAME=VALUE" in err


@pytest.mark.parametrize("command", ["explain", "run"])
def test_an_empty_cache_is_refused_saying_why(tmp_path, capsys, command):
    """`--dim past_sequence_length=0` (the empty cache of a with-past export's first step) was refused as "give a
    positive integer", which says nothing of why. The graph cannot hold an empty tensor (`ir.lint`: an input with a
    dimension of 0 is refused by the verifier), so the cache is refused in one line that says so, whether the 0
    comes from --dim or from an --inputs array of shape [2, 2, 0, 16]."""
    from rlxviz.ir.lint import NO_EMPTY_TENSORS

    out = ["-o", tmp_path / "out.npz"] if command == "run" else []
    if command == "explain":
        with pytest.raises(SystemExit) as e:  # argparse's usage error
            run(capsys, command, LLAMA, "--dim", "past_sequence_length=0")
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
        assert f"argument --dim: past_sequence_length=0: {NO_EMPTY_TENSORS}, so an empty KV cache" in err
    with np.load(LLAMA_IO) as z:
        arrays = {k: z[k] for k in z.files if not k.startswith("out:")}
    for k in [k for k in arrays if k.startswith("past_key_values.")]:
        arrays[k] = arrays[k][:, :, :0]
    arrays["attention_mask"] = arrays["attention_mask"][:, -arrays["input_ids"].shape[1]:]
    np.savez(tmp_path / "first_step.npz", **arrays)
    code, _, err = run(capsys, command, LLAMA, "--inputs", tmp_path / "first_step.npz", *out)
    assert code == 2
    one_line_error(err, command, f"first_step.npz: 'past_key_values.0.key' has shape [2, 2, 0, 16]: {NO_EMPTY_TENSORS}")


def test_dims_are_refused_for_a_model_with_fixed_shapes(capsys):
    code, _, err = run(capsys, "explain", "bert-tiny", "--dim", "batch=2")
    assert code == 2
    one_line_error(err, "explain", "--dim / input shapes bind an .onnx file's symbolic dims")


def _decoder_with_past(path: Path) -> None:
    """One attention over [past K/V ; new K/V], optimum's input naming: hidden [batch_size, sequence_length, 8],
    past_key/past_value [batch_size, 2, past_sequence_length, 4], attention_mask [batch_size,
    past_sequence_length + sequence_length] (additive -1e4 fill), outputs y and present_key/present_value."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.3).astype(np.float32), f"w{c}") for c in "qkv"]
    inits += [numpy_helper.from_array(np.asarray([0, 0, 2, 4], np.int64), "split"),
              numpy_helper.from_array(np.asarray([0, 0, 8], np.int64), "merge"),
              numpy_helper.from_array(np.asarray([1, 2], np.int64), "axes"),
              numpy_helper.from_array(np.asarray(0.5, np.float32), "scale"),
              numpy_helper.from_array(np.asarray(1.0, np.float32), "one"),
              numpy_helper.from_array(np.asarray(-1e4, np.float32), "fill")]
    nodes = []
    for c in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{c}"], [f"{c}0"]),
                  helper.make_node("Reshape", [f"{c}0", "split"], [f"{c}1"]),
                  helper.make_node("Transpose", [f"{c}1"], [f"{c}h"], perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Concat", ["past_key", "kh"], ["present_key"], axis=2),
              helper.make_node("Concat", ["past_value", "vh"], ["present_value"], axis=2),
              helper.make_node("Transpose", ["present_key"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qh", "kt"], ["s0"]),
              helper.make_node("Mul", ["s0", "scale"], ["s1"]),
              helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
              helper.make_node("Sub", ["one", "mf"], ["inv"]),
              helper.make_node("Mul", ["inv", "fill"], ["bias"]),
              helper.make_node("Unsqueeze", ["bias", "axes"], ["bias4"]),
              helper.make_node("Add", ["s1", "bias4"], ["s2"]),
              helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "present_value"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merge"], ["y"])]
    kv = ["batch_size", 2, "past_sequence_length", 4]
    total = ["batch_size", 2, "past_sequence_length + sequence_length", 4]
    g = helper.make_graph(nodes, "decoder", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch_size", "sequence_length", 8]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                      ["batch_size", "past_sequence_length + sequence_length"]),
        helper.make_tensor_value_info("past_key", TensorProto.FLOAT, kv),
        helper.make_tensor_value_info("past_value", TensorProto.FLOAT, kv)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch_size", "sequence_length", 8]),
         helper.make_tensor_value_info("present_key", TensorProto.FLOAT, total),
         helper.make_tensor_value_info("present_value", TensorProto.FLOAT, total)], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))


def test_a_decoder_with_past_of_its_own_binds_past_plus_seq_everywhere(tmp_path, capsys):
    """A decoder step built here: no flags, named dims, or the arrays of --inputs; each explains (the mask's
    `past + seq` dim follows from the past and new lengths) with ONNX Runtime's numbers on the given inputs."""
    import onnxruntime as ort

    _decoder_with_past(tmp_path / "d.onnx")
    code, out, err = run(capsys, "explain", tmp_path / "d.onnx")
    assert code in (0, 1) and "equals the ONNX model" in out, out + err
    assert "recognized: fuse_sdpa.hf_attention -> attention" in out and "KV cache" in out
    code, out, err = run(capsys, "ir", tmp_path / "d.onnx", "--dim", "past_sequence_length=5", "--dim",
                         "sequence_length=1", "--dim", "batch_size=3")
    assert code == 0 and "i64[3, 6]" in out, out + err
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((2, 3, 8)).astype(np.float32),
             "attention_mask": np.asarray([[1] * 7, [0, 0, 1, 1, 1, 1, 1]], np.int64),
             "past_key": rng.standard_normal((2, 2, 4, 4)).astype(np.float32),
             "past_value": rng.standard_normal((2, 2, 4, 4)).astype(np.float32)}
    want = ort.InferenceSession(str(tmp_path / "d.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.savez(tmp_path / "in.npz", **feeds, **{f"out:{k}": v for k, v in zip(("y", "present_key", "present_value"),
                                                                           want, strict=True)})
    code, out, err = run(capsys, "explain", tmp_path / "d.onnx", "--inputs", tmp_path / "in.npz")
    assert code in (0, 1) and "equals the expected outputs in in.npz" in out, out + err


@pytest.mark.parametrize("name", ["gpt2.onnx", "bert.onnx", "zoo/phi3.dynamo-eager.onnx"])
def test_parse_onnx_reads_what_onnx_load_reads(name):
    """`parse_onnx` parses the file from a memory map (no copy of it first): the same message as `onnx.load`, whose
    weights stay readable once the map is closed."""
    from rlxviz.models.onnx.dims import parse_onnx

    path = Path(__file__).parent / "fixtures/onnx" / name
    got, want = parse_onnx(path), onnx.load(str(path), load_external_data=False)
    assert got == want
    assert all(a.raw_data == b.raw_data for a, b in zip(got.graph.initializer, want.graph.initializer, strict=True))


@pytest.mark.parametrize("data, why", [(b"", None), (b"\x08\x07garbage", "byte 2 starts no protobuf field"),
                                       (b"not an onnx file", "byte 0 starts no protobuf field")])
def test_parse_onnx_on_an_empty_or_broken_file(tmp_path, data, why):
    """An empty file is the empty model `onnx.load` gives (the importer then says it holds no graph); bytes that do
    not parse are refused in one line naming the file, in the app's upload check's words (`layout`)."""
    from rlxviz.models.onnx import OnnxImportError
    from rlxviz.models.onnx.dims import parse_onnx

    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    if why is None:
        assert parse_onnx(path) == onnx.load(str(path), load_external_data=False)
        return
    with pytest.raises(OnnxImportError, match=rf"^{path}: not a readable ONNX model \({why}"):
        parse_onnx(path)
    with pytest.raises(OnnxImportError, match=r"not a readable ONNX model \(FileNotFoundError"):
        parse_onnx(tmp_path / "missing.onnx")
