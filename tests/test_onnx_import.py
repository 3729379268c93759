"""ONNX import: the committed exports (tests/fixtures/onnx, made by scripts/make_onnx_fixtures.py) import,
compute the exporter's own outputs on the reference interpreter, and go through the pipeline; ORT's
contrib fused ops compute what ONNX Runtime computes; unmappable ops are listed in one error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlxviz.ir import Op
from rlxviz.models.onnx import OnnxImportError, load_onnx, node_path
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference
from rlxviz.session import check_fusion

FIX = Path(__file__).parent / "fixtures" / "onnx"
EXPORTS = ("bert", "gpt2", "llama", "vit")


def _case(name: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    d = dict(np.load(FIX / f"{name}.npz"))
    return {k: v for k, v in d.items() if not k.startswith("out:")}, d["out:last_hidden_state"]


def _load(name: str, feeds: dict[str, np.ndarray], **kw):
    first = next(iter(feeds.values()))
    shapes = {k: v.shape for k, v in feeds.items()}
    return load_onnx(FIX / f"{name}.onnx", batch=first.shape[0], seq=first.shape[1], input_shapes=shapes, **kw)


@pytest.mark.parametrize("name", EXPORTS)
def test_export_imports_and_matches_the_exporters_outputs(name):
    feeds, want = _case(name)
    m = _load(name, feeds)
    got = run_reference(m.graph, feeds, m.weights)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
    assert m.meta["opset"] == 18 and m.meta["onnx_nodes"]
    trace = Pipeline.canonical().run(m.graph)  # the pipeline keeps the numbers, and fuses something per layer
    assert not [s.error for s in trace.steps if s.error]
    np.testing.assert_allclose(run_reference(trace.final, feeds, m.weights)[0], want, atol=2e-5, rtol=1e-4)
    check = check_fusion(trace, name)
    assert [r.layer for r in check.layers] == [0, 1]
    for r in check.layers:  # explain names, per layer, what fused or the guard that stopped it
        assert r.fused or r.first is not None or r.silent


def test_minilm_export_reads_weights_from_the_package_safetensors():
    from rlxviz.models import minilm_dir

    feeds, want = _case("minilm")
    with pytest.raises(OnnxImportError, match="external data"):
        _load("minilm", feeds)  # the weights are not next to the committed graph
    m = _load("minilm", feeds, external_data_dir=minilm_dir())
    np.testing.assert_allclose(run_reference(m.graph, feeds, m.weights)[0], want, atol=2e-5, rtol=1e-4)
    _fully_fused(m, "minilm", feeds, want, 6)


def _fully_fused(m, name, feeds, want, layers):
    trace = Pipeline.canonical().run(m.graph)
    check = check_fusion(trace, name)
    assert check.ok and len(check.layers) == layers, check.render()
    assert len(trace.final.find(Op.FUSED_TRANSFORMER_LAYER)) == layers
    np.testing.assert_allclose(run_reference(trace.final, feeds, m.weights)[0], want, atol=2e-5, rtol=1e-4)


def test_bert_export_fuses_every_layer_into_one_transformer_layer():
    feeds, want = _case("bert")
    _fully_fused(_load("bert", feeds), "bert", feeds, want, 2)


def test_dimensions_bind_from_batch_and_seq():
    m = load_onnx(FIX / "bert.onnx", batch=3, seq=5)
    assert {n.attrs["name"]: n.shape for n in m.graph.inputs} == {"input_ids": (3, 5), "attention_mask": (3, 5)}
    assert m.graph[m.graph.outputs[0]].shape == (3, 5, 64)


def test_provenance_is_the_exporters_module_path():
    m = load_onnx(FIX / "bert.onnx", batch=1, seq=4)
    paths = {n.path for n in m.graph}
    assert "encoder.layer.1.attention.self.query" in paths
    mm = next(n for n in m.graph if n.op.value == "matmul" and n.path == "encoder.layer.0.intermediate.dense")
    op_type, node_name, _ = m.meta["onnx_nodes"][mm.id]
    assert op_type == "MatMul" and node_name
    legacy = helper.make_node("MatMul", ["a", "b"], ["c"], name="/encoder/layer.3/attention/self/query/MatMul")
    assert node_path(legacy) == "encoder.layer.3.attention.self.query"


def _model(nodes, inputs, outputs, inits=(), opset=17, contrib=False):
    ops = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if contrib else [])
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=ops, ir_version=8)


def _save(tmp_path, model, name="m.onnx") -> Path:
    p = tmp_path / name
    onnx.save(model, str(p))
    return p


def test_unmapped_ops_are_listed_at_once(tmp_path):
    """Ops the IR lacks run as host nodes (tests/test_onnx_host_op.py); random, multi-output and other domains'
    ops cannot, and are listed together."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="ok"),
             helper.make_node("RandomNormalLike", ["r"], ["h"], name="rn1"),  # random: never a host op
             helper.make_node("Unique", ["x"], ["l", "u1", "u2", "u3"], name="uq1"),  # 4 outputs: neither
             helper.make_node("Frobnicate", ["x"], ["f"], name="fz", domain="com.microsoft"),
             helper.make_node("Sum", ["h", "l", "f"], ["y"], name="sum")]
    p = _save(tmp_path, _model(nodes, [x], [y], contrib=True))
    with pytest.raises(OnnxImportError) as e:
        load_onnx(p, batch=2, seq=4)
    msg = str(e.value)
    assert "3 op(s)" in msg and "opset 17" in msg
    for part in ("RandomNormalLike (rn1)", "Unique (uq1)", "com.microsoft.Frobnicate (fz)"):
        assert part in msg


def test_opset_out_of_range_and_unreadable_files(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    p = _save(tmp_path, _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y], opset=12))
    with pytest.raises(OnnxImportError, match="opset 12 is not supported"):
        load_onnx(p)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00not a protobuf\xff" * 3)
    with pytest.raises(OnnxImportError, match="bad.onnx"):
        load_onnx(bad)
    with pytest.raises(OnnxImportError, match="no such file"):
        load_onnx(tmp_path / "missing.onnx")


def test_unbindable_dimension_names_the_input(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", "channels"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    p = _save(tmp_path, _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y]))
    with pytest.raises(OnnxImportError, match="'x'.*dimension 2 \\(channels\\)"):
        load_onnx(p)
    m = load_onnx(p, input_shapes={"x": (2, 3, 5)})
    assert m.graph.inputs[0].shape == (2, 3, 5)


def test_contrib_fused_ops_match_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")  # dev extra
    rng = np.random.default_rng(0)
    B, S, H, heads = 2, 5, 16, 4
    f = TensorProto.FLOAT

    def init(name, shape, scale=0.2):
        return numpy_helper.from_array((scale * rng.standard_normal(shape)).astype(np.float32), name)

    inits = [init("w_qkv", (H, 3 * H)), init("b_qkv", (3 * H,), 0.05), init("g", (H,)), init("beta", (H,), 0.05),
             init("b_skip", (H,), 0.05), init("w1", (H, 2 * H)), init("b1", (2 * H,), 0.05), init("b2", (2 * H,)),
             init("w_o", (2 * H, H)), init("g2", (H,))]
    nodes = [
        helper.make_node("Attention", ["x", "w_qkv", "b_qkv", "mask"], ["att"], domain="com.microsoft",
                         num_heads=heads, name="attn"),
        helper.make_node("SkipLayerNormalization", ["att", "x", "g", "beta", "b_skip"], ["ln", "", "", "sum"],
                         domain="com.microsoft", epsilon=1e-5, name="skipln"),
        helper.make_node("MatMul", ["ln", "w1"], ["h1"]),
        helper.make_node("BiasGelu", ["h1", "b1"], ["g1"], domain="com.microsoft"),
        helper.make_node("FastGelu", ["g1", "b2"], ["g2o"], domain="com.microsoft"),
        helper.make_node("MatMul", ["g2o", "w_o"], ["o"]),
        helper.make_node("SkipSimplifiedLayerNormalization", ["o", "sum", "g2"], ["y"], domain="com.microsoft",
                         epsilon=1e-6),
        helper.make_node("MultiHeadAttention", ["y", "y", "y", "b_qkv", "mask"], ["z"], domain="com.microsoft",
                         num_heads=heads),
    ]
    inputs = [helper.make_tensor_value_info("x", f, ["batch", "seq", H]),
              helper.make_tensor_value_info("mask", TensorProto.INT32, ["batch", "seq"])]
    outputs = [helper.make_tensor_value_info("z", f, None)]
    p = _save(tmp_path, _model(nodes, inputs, outputs, inits, contrib=True))
    feeds = {"x": rng.standard_normal((B, S, H)).astype(np.float32),
             "mask": np.array([[1] * S, [1] * (S - 2) + [0, 0]], dtype=np.int32)}
    want = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    m = load_onnx(p, batch=B, seq=S)
    got = run_reference(m.graph, feeds, m.weights)[0]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert {"attention", "layer_norm", "rms_norm", "gelu", "gelu_tanh"} <= set(m.graph.op_counts())


def _app_state():
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState

    return AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)


def test_app_loads_an_onnx_upload():
    s = _app_state()
    s.load_upload({"gpt2.onnx": (FIX / "gpt2.onnx").read_bytes()})
    assert s.message_kind != "danger", s.message
    # the switch is said first (issue 39: the check line replaced it), then the check line as the CLI says it
    said, check = s.message.split(". On random inputs (seed 0): version 0 equals ", 1)  # naming the inputs it ran
    assert said.startswith("Now showing gpt2 (upload), was ") and check.startswith("the ONNX model (ONNX Runtime"), \
        s.message
    assert s.source == "upload" and s.model.meta["onnx_file"].endswith("model.onnx")
    assert any(n.path.startswith("h.1.attn") for n in s.trace.final)  # the exporter's names reach the app
    s.load_upload({"gpt2.onnx": b"not protobuf", "x.json": b"{}"})
    assert s.message_kind == "danger" and "one .onnx file alone" in s.message


def test_app_loads_an_onnx_path_only_under_the_allowed_dirs(monkeypatch, tmp_path):
    import shutil

    s = _app_state()
    inside = tmp_path / "models"
    inside.mkdir()
    shutil.copy(FIX / "vit.onnx", inside / "vit.onnx")
    monkeypatch.setenv("RLXVIZ_ALLOWED_DIRS", str(inside))
    s.param.update(checkpoint_dir=str(inside / "vit.onnx"), source="checkpoint")
    assert s.message_kind != "danger", s.message
    assert s.model.graph.inputs[0].shape == (1, 3, 32, 32)
    shutil.copy(FIX / "vit.onnx", tmp_path / "outside.onnx")
    s.param.update(checkpoint_dir=str(tmp_path / "outside.onnx"), source="checkpoint")
    assert s.message_kind == "danger" and "outside the allowed" in s.message, s.message


def test_cli_run_takes_an_onnx_export(tmp_path, capsys):
    from rlxviz.cli import main

    feeds, want = _case("vit")
    np.savez(tmp_path / "in.npz", **feeds)
    assert main(["run", str(FIX / "vit.onnx"), "-i", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["last_hidden_state"], want, atol=2e-5, rtol=1e-4)
    np.savez(tmp_path / "bad.npz", pixel_values=feeds["pixel_values"][:, :2])  # 2 channels: the kernel needs 3
    assert main(["run", str(FIX / "vit.onnx"), "-i", str(tmp_path / "bad.npz"), "-o", str(tmp_path / "o.npz")]) == 2
    assert "vit.onnx" in capsys.readouterr().err


def _opset13_graph():
    f = TensorProto.FLOAT
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1], keepdims=1),  # opset-13 attribute form
             helper.make_node("Sub", ["x", "mu"], ["c"]),
             helper.make_node("MatMul", ["c", "w"], ["h"]),
             helper.make_node("Split", ["h", "sp"], ["a", "b"], axis=-1),
             helper.make_node("Softmax", ["b"], ["sb"], axis=-1),
             helper.make_node("Concat", ["sb", "a"], ["cat"], axis=-1),
             helper.make_node("Shape", ["cat"], ["s"]),
             helper.make_node("Unsqueeze", ["cat", "ax"], ["u"]),  # axes as an input since opset 13
             helper.make_node("Squeeze", ["u", "ax"], ["y"])]
    ax = numpy_helper.from_array(np.array([1], dtype=np.int64), "ax")
    sp = numpy_helper.from_array(np.array([3, 5], dtype=np.int64), "sp")
    return _model(nodes, [helper.make_tensor_value_info("x", f, ["batch", "seq", 8])],
                  [helper.make_tensor_value_info("y", f, None)], [w, ax, sp], opset=13)


@pytest.mark.parametrize("opset", [13, 21])
def test_opsets_13_and_21_match_onnxruntime(tmp_path, opset):
    ort = pytest.importorskip("onnxruntime")
    from onnx import version_converter

    model = _opset13_graph()
    if opset != 13:
        model = version_converter.convert_version(model, opset)  # ReduceMean's axes attribute becomes an input
    p = _save(tmp_path, model)
    x = np.random.default_rng(4).standard_normal((2, 3, 8)).astype(np.float32)
    want = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    m = load_onnx(p, batch=2, seq=3)
    assert m.meta["opset"] == opset
    np.testing.assert_allclose(run_reference(m.graph, {"x": x}, m.weights)[0], want, atol=1e-5, rtol=1e-5)


def test_external_data_cannot_leave_the_folder_and_size_is_checked_first(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\x00" * 64)
    w = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4], data_location=TensorProto.EXTERNAL)
    for k, v in (("location", "../secret.bin"), ("offset", "0"), ("length", "64")):
        w.external_data.add(key=k, value=v)
    inner = tmp_path / "model"
    inner.mkdir()
    p = _save(inner, _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [x], [y], [w]))
    with pytest.raises(OnnxImportError, match="cannot load external data"):
        load_onnx(p)
    with pytest.raises(OnnxImportError, match="64 bytes, over the limit of 32 bytes"):  # before any read
        load_onnx(p, max_bytes=32)


def test_llama_export_gets_rope_and_packed_grouped_query_attention():
    feeds, want = _case("llama")
    m = _load("llama", feeds)
    trace = Pipeline.canonical().run(m.graph)
    ropes = [x for s in trace.steps for x in s.matches if x.rule == "fuse_sdpa.rope_heads"]
    assert not m.graph.find(Op.ROPE) and len(ropes) == 4  # q and k of both layers: a pass makes the rope op
    # one RoPE table pair read by Q and K (fuse_sdpa makes each table's narrow once): the block takes the layer
    attn = trace.final.find(Op.FUSED_ATTENTION_BLOCK)
    assert [(a.attrs["num_heads"], a.attrs["num_kv_heads"], a.attrs["has_rope"]) for a in attn] == [(4, 2, True)] * 2
    assert len(trace.final.find(Op.FUSED_SWIGLU)) == 2
    np.testing.assert_allclose(run_reference(trace.final, feeds, m.weights)[0], want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name, seq, limit", [
    ("gpt2", 65, "seq 65 is over the 64 positions of the export's position table 'wpe.weight' (Gather node "),
    ("bert", 1000, "seq 1000 is over the 64 positions of the export's fixed-shape tensor "),
])
def test_a_seq_past_what_the_export_fixed_names_the_limit(name, seq, limit):
    """A bound seq past a position table (Gather) or a traced fixed-shape tensor (Expand): one line naming the
    limit, not NumPy's IndexError / broadcast text."""
    with pytest.raises(OnnxImportError) as e:
        load_onnx(FIX / f"{name}.onnx", seq=seq)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and limit in msg, msg
    assert "IndexError" not in msg and "could not be broadcast" not in msg
    load_onnx(FIX / f"{name}.onnx", seq=64)  # the export's own limit still imports


def test_a_seq_past_the_position_table_from_input_arrays():
    """`rlxviz run` binds shapes from the user's arrays: their seq is the one named."""
    with pytest.raises(OnnxImportError, match=r"seq 65 is over the 64 positions of the export's position table"):
        load_onnx(FIX / "gpt2.onnx", input_shapes={"input_ids": (1, 65), "attention_mask": (1, 65)})


def _const_fold_model(kind: str, big: int):
    """x f32[1, 1] + ReduceSum(a constant of `big` x `big` floats built by `kind` from small constants)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    i64 = lambda n, v: numpy_helper.from_array(np.asarray(v, dtype=np.int64), n)  # noqa: E731
    one = numpy_helper.from_array(np.ones((1, 1), np.float32), "one")
    if kind == "ConstantOfShape":
        inits, make = [i64("s", [big, big])], [helper.make_node("ConstantOfShape", ["s"], ["c"], name="k")]
    elif kind == "Expand":
        inits, make = [one, i64("s", [big, big])], [helper.make_node("Expand", ["one", "s"], ["c"], name="k")]
    elif kind == "Tile":
        inits, make = [one, i64("s", [big, big])], [helper.make_node("Tile", ["one", "s"], ["c"], name="k")]
    else:  # Range, then a reshape-free sum
        f = lambda n, v: numpy_helper.from_array(np.asarray(v, dtype=np.float32), n)  # noqa: E731
        inits, make = [f("a", 0), f("b", big * big), f("d", 1)], [helper.make_node("Range", ["a", "b", "d"], ["c"],
                                                                                    name="k")]
    nodes = make + [helper.make_node("ReduceSum", ["c"], ["r"], keepdims=0),
                    helper.make_node("Add", ["x", "r"], ["y"])]
    return _model(nodes, [x], [y], inits)


@pytest.mark.parametrize("kind", ["ConstantOfShape", "Expand", "Tile", "Range"])
def test_a_folded_constant_over_the_memory_limit_is_refused_before_it_is_allocated(tmp_path, kind):
    p = _save(tmp_path, _const_fold_model(kind, 100_000))  # 37.3 GiB if it were allocated
    with pytest.raises(OnnxImportError) as e:
        load_onnx(p, max_bytes=2 << 30)
    msg = str(e.value)
    assert "\n" not in msg and f"{kind} node 'k'" in msg and "37.3 GiB" in msg and "over the limit of 2.0 GiB" in msg
    small = _save(tmp_path, _const_fold_model(kind, 8), "small.onnx")
    m = load_onnx(small, max_bytes=2 << 30)  # small folds still pass
    assert m.graph.inputs[0].shape == (1, 1)


def test_a_cycle_a_bad_dimension_and_an_empty_file_are_named(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="add"), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Identity", ["a"], ["y"])]
    with pytest.raises(OnnxImportError, match="node 'add'.*reads 'b', which no earlier node or input produces"):
        load_onnx(_save(tmp_path, _model(nodes, [x], [y])))
    for dim in (-3, 0):
        xn = helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim, 4])
        with pytest.raises(OnnxImportError, match=f"input 'x': dimension 0 is {dim}; .* must be positive"):
            load_onnx(_save(tmp_path, _model([helper.make_node("Relu", ["x"], ["y"])], [xn], [y]), f"d{dim}.onnx"))
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(OnnxImportError, match="not an ONNX model \\(the file is empty\\)"):
        load_onnx(empty)
