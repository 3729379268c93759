"""Write optimum-onnx exports of tiny random-weight models into the zoo (`tests/fixtures/onnx/zoo/ARCH.FORM.onnx`):
`optimum` (an encoder or vision model, task feature-extraction) and `optimum-past` (a decoder with past key values,
task text-generation-with-past: inputs `input_ids`, `attention_mask`, `position_ids`, `past_key_values.N.key/value`;
outputs `logits`, `present.N.key/value`). `ARCH.FORM.npz` holds the inputs and ONNX Runtime's outputs on the file
(`out:NAME`): a decode of 4 new tokens after 6 cached ones, the second row left-padded by 2.

optimum pins an older transformers than the zoo's, so it runs in a throwaway venv of its own:

    python3 -m venv /tmp/opt && /tmp/opt/bin/pip install torch==2.13.0 "optimum-onnx[onnxruntime]"
    cd scripts && /tmp/opt/bin/python make_onnx_optimum.py [ARCH.FORM ...]

Weights are random (`_randomize`, seeded by the name); the model is saved to a temporary folder and exported from
there (no hub access). `zoo.json` records each file with the versions that wrote it.
"""

from __future__ import annotations

import json
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import transformers
from make_onnx_fixtures import _randomize

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "onnx" / "zoo"
VOCAB, BATCH, SEQ, PAST, NEW = 96, 2, 8, 6, 4
SMALL = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64, "num_hidden_layers": 2}


def _models() -> dict[str, tuple[str, transformers.PretrainedConfig, str]]:
    """name -> (task, config, model class)."""
    t = transformers
    dec = {**SMALL, "vocab_size": VOCAB, "max_position_embeddings": 64, "tie_word_embeddings": False}
    return {
        "granite.optimum-past": ("text-generation-with-past", t.GraniteConfig(
            **dec, num_key_value_heads=2, embedding_multiplier=2.0, residual_multiplier=0.5,
            attention_multiplier=0.3, logits_scaling=2.0), "GraniteForCausalLM"),
        "qwen2.optimum-past": ("text-generation-with-past", t.Qwen2Config(**dec, num_key_value_heads=2),
                               "Qwen2ForCausalLM"),
        "gpt-bigcode.optimum-past": ("text-generation-with-past", t.GPTBigCodeConfig(
            vocab_size=VOCAB, n_embd=32, n_head=4, n_layer=2, n_positions=64, multi_query=True),
            "GPTBigCodeForCausalLM"),
        "olmo.optimum-past": ("text-generation-with-past", t.OlmoConfig(**dec, num_key_value_heads=2),
                              "OlmoForCausalLM"),
        "cohere.optimum-past": ("text-generation-with-past", t.CohereConfig(**dec, num_key_value_heads=2),
                                "CohereForCausalLM"),
        "convbert.optimum": ("feature-extraction", t.ConvBertConfig(
            **{**SMALL, "vocab_size": VOCAB, "max_position_embeddings": 64}, embedding_size=32, head_ratio=2,
            conv_kernel_size=3), "ConvBertModel"),
        "esm.optimum": ("feature-extraction", t.EsmConfig(
            **{**SMALL, "vocab_size": VOCAB, "max_position_embeddings": 64}, position_embedding_type="rotary",
            pad_token_id=1, mask_token_id=2, token_dropout=False), "EsmModel"),
        "mobilebert.optimum": ("feature-extraction", t.MobileBertConfig(
            **{**SMALL, "vocab_size": VOCAB, "max_position_embeddings": 64, "num_attention_heads": 2},
            embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16, num_feedforward_networks=2),
            "MobileBertModel"),
        "deit.optimum": ("feature-extraction", t.DeiTConfig(image_size=32, patch_size=8, **SMALL), "DeiTModel"),
        "beit.optimum": ("feature-extraction", t.BeitConfig(image_size=32, patch_size=8,
                                                            use_relative_position_bias=True,
                                                            layer_scale_init_value=0.5, **SMALL), "BeitModel"),
    }


def _feeds(sess: ort.InferenceSession, cfg: transformers.PretrainedConfig, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    past = any(i.name.startswith("past_key_values") for i in sess.get_inputs())
    new = NEW if past else SEQ
    for i in sess.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = rng.integers(3, VOCAB, (BATCH, new)).astype(np.int64)
        elif i.name == "attention_mask":
            m = np.ones((BATCH, PAST + new if past else new), np.int64)
            if past:
                m[1, :2] = 0  # left padding in the cache
            else:
                m[1, new - 3:] = 0
            feeds[i.name] = m
        elif i.name == "token_type_ids":
            feeds[i.name] = np.zeros((BATCH, new), np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.stack([np.arange(PAST, PAST + new), np.arange(PAST - 2, PAST - 2 + new)]).astype(
                np.int64)
        elif i.name == "pixel_values":
            feeds[i.name] = rng.standard_normal((BATCH, 3, 32, 32)).astype(np.float32)
        elif i.name.startswith("past_key_values"):
            dims = [BATCH if d in ("batch_size",) or isinstance(d, str) and "batch" in d else d for d in i.shape]
            shape = [d if isinstance(d, int) else PAST for d in dims]
            feeds[i.name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
        else:
            raise ValueError(f"no feed for input {i.name} {i.shape}")
    return feeds


def main(argv: list[str]) -> None:
    from optimum.exporters.onnx import main_export

    models = _models()
    record_path = OUT / "zoo.json"
    record = json.loads(record_path.read_text())
    for key in argv or list(models):
        task, cfg, cls = models[key]
        torch.manual_seed(0)
        model = _randomize(getattr(transformers, cls)(cfg).eval(), zlib.crc32(key.encode()) % 1000, scale=0.08)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(f"{tmp}/model")
            main_export(f"{tmp}/model", output=f"{tmp}/onnx", task=task, no_post_process=False, do_validation=False)
            m = onnx.load(f"{tmp}/onnx/model.onnx")
        path = OUT / f"{key}.onnx"
        onnx.save(m, str(path))
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = _feeds(sess, cfg, zlib.crc32(key.encode()))
        names = [o.name for o in sess.get_outputs()]
        outs = dict(zip(names, sess.run(None, feeds), strict=True))
        np.savez_compressed(OUT / f"{key}.npz", **feeds, **{f"out:{k}": v for k, v in outs.items()})
        kb = path.stat().st_size / 1e3
        print(f"{key}: {kb:.0f} kB, {len(m.graph.node)} nodes, inputs {list(feeds)}", flush=True)
        record["files"][key] = {"file": path.name, "kB": round(kb), "nodes": len(m.graph.node),
                                "config": cfg.to_diff_dict(), "reference": "onnxruntime", "task": task,
                                "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    record["files"] = dict(sorted(record["files"].items()))
    record_path.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
