"""ONNX Runtime's transformer optimizer on every zoo file: which fused ops it makes (its own statistics), for the
coverage table of docs/onnx.md (`scripts/onnx_coverage.py` reads the record).

The optimizer's fusions need sympy (and torch for its GPU check), which are not project dependencies: run it in
the zoo's venv (scripts/make_onnx_zoo.py says how to make it, plus `pip install sympy onnxruntime`):

    /tmp/zoo/bin/python scripts/ort_optimizer_stats.py [ARCH ...]  # writes tests/fixtures/onnx/zoo/ort_optimizer.json

With ARCH arguments only those architectures' files are optimized again; the record's other rows are kept.

Each file is optimized with the model type ORT offers for its architecture (`bert` where none fits), the zoo's
4 heads and hidden 32, and `opt_level=0` (ORT's Python fusions only, no graph-level rewrites), so what is
counted is the transformer fusions, the same question rlxviz's passes answer.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import onnxruntime
from onnxruntime.transformers.optimizer import optimize_model

ZOO = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "onnx" / "zoo"
MODEL_TYPE = {"bart-encoder": "bart", "clip-text": "clip", "clip-vision": "clip", "vit": "vit", "gpt2": "gpt2",
              "gpt-neox": "gpt_neox", "t5-encoder": "t5", "phi3": "phi", "bloom": "gpt2", "falcon": "gpt2",
              "opt": "gpt2", "llama": "gpt2", "qwen2": "gpt2", "mistral": "gpt2", "gemma": "gpt2"}
MODEL_TYPE.update({a: "gpt2" for a in ("qwen3", "gemma2", "olmo2", "qwen2-moe", "mixtral", "gpt-oss")})  # decoders


def main(archs: list[str]) -> None:
    logging.disable(logging.WARNING)
    record = ZOO / "ort_optimizer.json"
    kept = json.loads(record.read_text())["files"] if archs and record.is_file() else {}
    out: dict = {"onnxruntime": onnxruntime.__version__, "opt_level": 0, "files": kept}
    for p in sorted(ZOO.glob("*.onnx")):
        arch = p.stem.split(".")[0]
        if archs and arch not in archs:
            continue
        kind = MODEL_TYPE.get(arch, "bert")
        try:
            m = optimize_model(str(p), model_type=kind, num_heads=4, hidden_size=32, opt_level=0)
            stats = {k: v for k, v in m.get_fused_operator_statistics().items() if v}
            out["files"][p.stem] = {"model_type": kind, "fused": stats}
        except Exception as e:  # noqa: BLE001 - the optimizer's failure is a row of the record
            out["files"][p.stem] = {"model_type": kind, "error": f"{type(e).__name__}: {str(e)[:160]}"}
        print(p.stem, out["files"][p.stem], flush=True)
    out["files"] = dict(sorted(out["files"].items()))
    record.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
