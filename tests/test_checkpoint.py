"""Checkpoint loader on tiny BERT checkpoints written to tmp_path: layout, prefixes, and every refusal."""

import json
import pickle

import numpy as np
import pytest
from safetensors.numpy import save_file

from rlxviz.models import BertConfig, CheckpointError, build_bert, load_checkpoint
from rlxviz.models.bert import random_feeds, random_weights
from rlxviz.runtime import run_reference

CFG = BertConfig(vocab_size=50, hidden=16, heads=2, intermediate=32, layers=2, max_position=20)
HF_CONFIG = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": 50, "hidden_size": 16,
             "num_attention_heads": 2, "intermediate_size": 32, "num_hidden_layers": 2,
             "max_position_embeddings": 20, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}


def hf_tensors(prefix=""):
    """Graph-layout random weights and the same weights in Hugging Face layout (`[out, in]` linears)."""
    g = build_bert(CFG, 1, 4, style="hf")
    w = random_weights(g, seed=7)
    t = {}
    for name, arr in w.items():
        linear = arr.ndim == 2 and not name.startswith("embeddings.")
        t[prefix + name] = np.ascontiguousarray(arr.T) if linear else arr
    t[prefix + "embeddings.position_ids"] = np.arange(20, dtype=np.int64)[None]
    t[prefix + "pooler.dense.weight"] = np.zeros((16, 16), np.float32)
    return w, t


def write_ckpt(folder, tensors, config=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(HF_CONFIG if config is None else config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("prefix", ["", "bert."])
def test_loads_real_layout_and_runs(tmp_path, prefix):
    w, t = hf_tensors(prefix)
    if prefix:
        t["cls.predictions.bias"] = np.zeros(50, np.float32)
    m = load_checkpoint(write_ckpt(tmp_path / "ck", t), batch=2, seq=6)
    assert m.config == CFG and m.meta["key_prefix"] == prefix
    assert set(m.weights) == set(w)
    for name, arr in m.weights.items():
        assert arr.dtype == np.float32
        np.testing.assert_array_equal(arr, w[name])  # linears transposed back to [in, out]
    assert prefix + "pooler.dense.weight" in m.meta["unused_tensors"]
    assert m.graph.inputs[0].shape == (2, 6) and m.tokenizer_file is None
    feeds = random_feeds(2, 6, 50, seed=1)
    got = run_reference(m.graph, feeds, m.weights)[0]
    want = run_reference(build_bert(CFG, 2, 6, style="hf"), feeds, w)[0]
    np.testing.assert_array_equal(got, want)
    rlx = load_checkpoint(tmp_path / "ck", batch=2, seq=6, style="rlx")
    np.testing.assert_allclose(run_reference(rlx.graph, feeds, rlx.weights)[0], got, atol=1e-5)


def test_float16_widened_and_tokenizer_found(tmp_path):
    _, t = hf_tensors()
    t = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in t.items()}
    folder = write_ckpt(tmp_path / "ck", t)
    (folder / "tokenizer.json").write_text("{}")
    m = load_checkpoint(folder, seq=4)
    assert all(a.dtype == np.float32 for a in m.weights.values())
    assert m.tokenizer_file == folder / "tokenizer.json"


def test_sharded_index(tmp_path):
    w, t = hf_tensors()
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    keys = sorted(t)
    parts = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for fname, ks in parts.items():
        save_file({k: t[k] for k in ks}, str(folder / fname))
    weight_map = {k: f for f, ks in parts.items() for k in ks}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    m = load_checkpoint(folder, seq=4)
    np.testing.assert_array_equal(m.weights["encoder.layer.1.output.dense.weight"],
                                  w["encoder.layer.1.output.dense.weight"])
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../x.safetensors"}}))
    with pytest.raises(CheckpointError, match="not a .safetensors file in the folder"):
        load_checkpoint(folder, seq=4)


def test_truncated_safetensors(tmp_path):
    _, t = hf_tensors()
    folder = write_ckpt(tmp_path / "ck", t)
    f = folder / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match="truncated or corrupted safetensors"):
        load_checkpoint(folder, seq=4)
    f.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_checkpoint(folder, seq=4)


def test_garbage_safetensors(tmp_path):
    folder = write_ckpt(tmp_path / "ck", hf_tensors()[1])
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + b"\0" * 64)
    with pytest.raises(CheckpointError, match="model.safetensors: truncated or corrupted"):
        load_checkpoint(folder, seq=4)


def test_wrong_shape_names_tensor_and_shapes(tmp_path):
    _, t = hf_tensors("bert.")
    t["bert.encoder.layer.1.intermediate.dense.weight"] = np.zeros((16, 32), np.float32)  # not transposed
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(write_ckpt(tmp_path / "ck", t), seq=4)
    msg = str(e.value)
    assert "'bert.encoder.layer.1.intermediate.dense.weight'" in msg
    assert "[16, 32]" in msg and "expected [32, 16]" in msg


def test_missing_tensor_named(tmp_path):
    _, t = hf_tensors()
    del t["encoder.layer.0.attention.self.value.bias"]
    with pytest.raises(CheckpointError, match=r"missing tensor 'encoder.layer.0.attention.self.value.bias'.*\[16\]"):
        load_checkpoint(write_ckpt(tmp_path / "ck", t), seq=4)


def test_not_bert_keys(tmp_path):
    with pytest.raises(CheckpointError, match="missing tensor 'embeddings.word_embeddings.weight' or 'bert."):
        load_checkpoint(write_ckpt(tmp_path / "ck", {"model.embed_tokens.weight": np.zeros((2, 2), np.float32)}), seq=4)


def test_integer_weight_refused(tmp_path):
    _, t = hf_tensors()
    t["embeddings.LayerNorm.bias"] = np.zeros(16, np.int32)
    with pytest.raises(CheckpointError, match="'embeddings.LayerNorm.bias' has dtype int32, expected a float"):
        load_checkpoint(write_ckpt(tmp_path / "ck", t), seq=4)


class _Marker:
    """Unpickling this creates the marker file: proof that a pickle was opened."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("fname", ["pytorch_model.bin", "model.pt", "weights.pkl"])
def test_pickle_refused_never_opened(tmp_path, fname):
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    marker = tmp_path / "PWNED"
    (folder / fname).write_bytes(pickle.dumps(_Marker(marker)))
    with pytest.raises(CheckpointError, match=f"refusing pickled checkpoint {fname}.*arbitrary code"):
        load_checkpoint(folder, seq=4)
    with pytest.raises(CheckpointError, match="arbitrary code"):
        load_checkpoint(folder / fname, seq=4)  # the file itself
    assert not marker.exists()


@pytest.mark.parametrize("text, match", [
    ("{bad json", r"invalid JSON at line 1 column 2"),
    ("[1, 2]", "expected a JSON object, got list"),
    (json.dumps({**HF_CONFIG, "model_type": "llama"}), "model_type 'llama' is not supported"),
    (json.dumps({k: v for k, v in HF_CONFIG.items() if k != "hidden_size"}), "lacks 'hidden_size'"),
    (json.dumps({**HF_CONFIG, "num_attention_heads": 3}), "hidden_size 16 is not divisible by num_attention_heads 3"),
    (json.dumps({**HF_CONFIG, "num_hidden_layers": 0}), "num_hidden_layers must be positive"),
    (json.dumps({**HF_CONFIG, "hidden_size": "big"}), "config.json"),
    (json.dumps({**HF_CONFIG, "hidden_act": "swish_v9"}), "hidden_act 'swish_v9' is not supported"),
    (json.dumps({**HF_CONFIG, "position_embedding_type": "relative_key"}), "position_embedding_type"),
])
def test_bad_config(tmp_path, text, match):
    folder = write_ckpt(tmp_path / "ck", hf_tensors()[1])
    (folder / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(folder, seq=4)


def test_missing_files(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text(json.dumps(HF_CONFIG))
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_checkpoint(tmp_path / "empty", seq=4)
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(CheckpointError, match="not a folder"):
        load_checkpoint(tmp_path / "file.txt")


def test_seq_beyond_max_position(tmp_path):
    with pytest.raises(CheckpointError, match="seq 21 must be in 1..20"):
        load_checkpoint(write_ckpt(tmp_path / "ck", hf_tensors()[1]), seq=21)


def test_allowed_roots(tmp_path):
    root, other = tmp_path / "models", tmp_path / "elsewhere"
    inside = write_ckpt(root / "tiny", hf_tensors()[1])
    outside = write_ckpt(other / "tiny", hf_tensors()[1])
    assert load_checkpoint(inside, seq=4, allowed_roots=[root]).meta["folder"] == str(inside.resolve())
    with pytest.raises(CheckpointError, match="outside the allowed model folders"):
        load_checkpoint(outside, seq=4, allowed_roots=[root])
    with pytest.raises(CheckpointError, match="outside the allowed"):
        load_checkpoint(root / ".." / "elsewhere" / "tiny", seq=4, allowed_roots=[root])
    with pytest.raises(CheckpointError, match="outside the allowed"):  # refused before existence is revealed
        load_checkpoint("/etc/does-not-exist", allowed_roots=[root])
    (root / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(CheckpointError, match="outside the allowed"):
        load_checkpoint(root / "link", seq=4, allowed_roots=[root])
    sneaky = root / "sneaky"
    sneaky.mkdir()
    (sneaky / "config.json").write_text(json.dumps(HF_CONFIG))
    (sneaky / "model.safetensors").symlink_to(outside / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors: resolves outside"):
        load_checkpoint(sneaky, seq=4, allowed_roots=[root])
    with pytest.raises(CheckpointError, match="none configured"):
        load_checkpoint(inside, allowed_roots=[])


def test_bfloat16_tensors_are_read_as_float32_exactly(tmp_path):
    """BF16 tensors (how many checkpoints are saved) are widened to float32 bit for bit: bfloat16 is a float32's
    upper half. Offsets that do not describe the bytes are one CheckpointError naming the file."""
    from rlxviz.models.checkpoint import read_tensors

    want = np.array([[1.0, -2.5, 3.140625], [0.0, -0.0, 65280.0]], dtype=np.float32)
    raw = (want.view(np.uint32) >> 16).astype("<u2").tobytes()
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, len(raw)]}}).encode()
    f = tmp_path / "model.safetensors"
    f.write_bytes(len(header).to_bytes(8, "little") + header + raw)
    got = read_tensors([f])["w"]
    assert got.dtype == np.float32 and got.shape == (2, 3)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    bad = json.dumps({"w": {"dtype": "BF16", "shape": [4, 3], "data_offsets": [0, len(raw)]}}).encode()
    f.write_bytes(len(bad).to_bytes(8, "little") + bad + raw)
    with pytest.raises(CheckpointError, match="model.safetensors: (truncated or corrupted|tensor 'w' \\(BF16\\))"):
        read_tensors([f])


@pytest.mark.parametrize("dtype", ["F8_E4M3", "F8_E5M2", "U16", "U32", "U64", "C64", "weird", 7])
def test_unsupported_safetensors_dtype_refused_from_header(tmp_path, dtype):
    """A dtype NumPy (or rlxviz) cannot hold is one CheckpointError naming the tensor, the dtype and the supported
    ones, read from the header before any data (was: F8_E4M3 -> AttributeError numpy.float8_e4m3fn, exit 3)."""
    folder = write_ckpt(tmp_path / "ck", hf_tensors()[1])
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "embeddings.word_embeddings.weight": {"dtype": dtype, "shape": [2],
                                                               "data_offsets": [0, 2]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 2)
    with pytest.raises(CheckpointError, match=r"tensor 'embeddings.word_embeddings.weight' has dtype "
                                              rf"'{dtype}'.*supported: F64, F32, F16"):
        load_checkpoint(folder, seq=4)


def test_unsupported_safetensors_dtype_cli_exit_2(tmp_path, capsys):
    from rlxviz import cli

    folder = write_ckpt(tmp_path / "ck", hf_tensors()[1])
    header = json.dumps({"embeddings.word_embeddings.weight": {"dtype": "F8_E4M3", "shape": [2],
                                                               "data_offsets": [0, 2]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 2)
    assert cli.main(["explain", str(folder), "--seq", "4"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "F8_E4M3" in err and "Traceback" not in err, err


def test_a_bfloat16_checkpoint_loads_with_its_rounded_weights(tmp_path):
    """A whole checkpoint saved in BF16 (float tensors; position ids stay int64) loads, and every weight is the
    float32 weight rounded to bfloat16's 8 mantissa bits (truncated here, as written)."""
    w, t = hf_tensors()
    header: dict = {}
    blobs, at = [], 0
    for name, arr in t.items():
        raw = ((arr.view(np.uint32) >> 16).astype("<u2") if arr.dtype == np.float32 else arr).tobytes()
        header[name] = {"dtype": "BF16" if arr.dtype == np.float32 else "I64", "shape": list(arr.shape),
                        "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    head = json.dumps(header).encode()
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    (folder / "model.safetensors").write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))
    m = load_checkpoint(folder, seq=4)
    for name, arr in w.items():
        want = (arr.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        np.testing.assert_array_equal(m.weights[name], want, err_msg=name)


def test_unused_tensors_are_listed_but_never_read(tmp_path):
    """A checkpoint's unused tensors (a 64 MiB head here; a 1 GiB one cost 2.1 GB) are named from the header only."""
    import tracemalloc

    _, t = hf_tensors()
    t["lm_head.weight"] = np.ones((4096, 4096), np.float32)  # 64 MiB, read by nothing
    folder = write_ckpt(tmp_path / "big", t)
    tracemalloc.start()
    try:
        m = load_checkpoint(folder, batch=1, seq=4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "lm_head.weight" in m.meta["unused_tensors"] and "lm_head.weight" not in m.weights
    assert peak < 32 << 20, peak
