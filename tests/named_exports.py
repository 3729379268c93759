"""The ONNX fixtures the re-made-credit and label tests run, by short name (one table for them)."""

from pathlib import Path

ONNX = Path(__file__).parent / "fixtures" / "onnx"
FILES = {"gpt-neox": "cases/gpt-neox.legacy-sdpa.onnx", "gptj": "zoo/gptj.dynamo-eager.onnx",
         "cohere": "zoo/cohere.dynamo-eager.onnx", "llama": "llama.onnx", "bert": "bert.onnx",
         "esm.qdyn": "cases/esm.qdyn.onnx"}
"""Short name -> path under `ONNX`: merged Q/K/V re-made by a later stage (gpt-neox, gptj, cohere), a LLaMA block,
BERT, and an integer-quantized ESM."""
