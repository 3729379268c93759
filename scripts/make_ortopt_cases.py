"""Write ONNX Runtime transformer-optimizer versions of zoo files (tests/fixtures/onnx/ortopt/NAME.ortopt.onnx) with
their inputs and ONNX Runtime's outputs on the optimized file (NAME.ortopt_io.npz: the inputs by name, `out:NAME`).

The transformer optimizer needs sympy, which rlxviz does not install: put it on a path of its own first, e.g.

    python -m pip install --target /tmp/sympy sympy
    PYTHONPATH=$PWD:/tmp/sympy python scripts/make_ortopt_cases.py

Each case: (zoo file, the optimizer's model_type). num_heads / hidden_size come from the zoo's config.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ZOO = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "onnx" / "zoo"
OUT = ZOO.parent / "ortopt"
CASES = {"bert.ts-eager": "bert", "gpt2.ts-eager": "gpt2", "distilbert.ts-eager": "bert",
         "albert.ts-eager": "bert", "gemma.dynamo-eager": "gpt2", "clip-text.dynamo-eager": "clip",
         "clip-vision.dynamo-eager": "clip", "falcon.dynamo-eager": "gpt2", "t5-encoder.ts-eager": "t5",
         "whisper-encoder.dynamo-eager": "bart"}
"""zoo file -> the optimizer's model_type; the output is named after the architecture (bert.ortopt.onnx)."""


def main() -> None:
    import onnxruntime as ort
    from onnxruntime.transformers import optimizer

    OUT.mkdir(exist_ok=True)
    files = json.loads((ZOO / "zoo.json").read_text())["files"]
    for name, kind in CASES.items():
        cfg = files[name]["config"]
        heads = (cfg.get("num_attention_heads") or cfg.get("n_head") or cfg.get("n_heads") or cfg.get("num_heads")
                 or cfg.get("encoder_attention_heads") or 0)
        hidden = cfg.get("hidden_size") or cfg.get("n_embd") or cfg.get("dim") or cfg.get("d_model") or 0
        m = optimizer.optimize_model(str(ZOO / f"{name}.onnx"), model_type=kind, num_heads=heads, hidden_size=hidden,
                                     opt_level=0)
        path = OUT / f"{name.split('.')[0]}.ortopt.onnx"
        m.save_model_to_file(str(path))  # as users save it (adds the com.microsoft opset import)
        d = dict(np.load(ZOO / f"{name}.npz"))
        feeds = {k: v for k, v in d.items() if not k.startswith("out:")}
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        outs = sess.run(None, feeds)
        np.savez(OUT / f"{path.stem}_io.npz", **feeds, **{f"out:{k}": v for k, v in zip(names, outs, strict=True)})
        ops = sorted({n.op_type for n in m.model.graph.node if n.domain == "com.microsoft"})
        print(f"{path.name}: {ops}")


if __name__ == "__main__":
    main()
