"""What an imported ONNX file carried that the passes did not make: ONNX Runtime's own fusions (contrib ops written by
its transformer optimizer) and quantization steps, in words for `explain` (`imported_forms(model)`).

Read from `Model.meta["onnx_nodes"]` (IR node id -> (op_type, node name, doc_string) of the ONNX node it came from),
so it names what the file holds, counted per ONNX node.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

PREFUSED = {
    "Attention": "QKV projection + attention: read as matmul -> attention",
    "MultiHeadAttention": "attention: read as attention",
    "GroupQueryAttention": "RoPE + grouped-query causal attention: read as rope -> attention",
    "SkipLayerNormalization": "residual add + LayerNorm: read as add -> layer_norm, a bias input added after the "
                              "residual as its kernel does ((x + skip) + bias), which FusedTransformerLayer (bias "
                              "first) does not take exactly",
    "SkipSimplifiedLayerNormalization": "residual add + RMSNorm: read as add -> rms_norm",
    "SimplifiedLayerNormalization": "RMSNorm: read as rms_norm",
    "EmbedLayerNormalization": "embedding lookups + LayerNorm: read as gathers -> add -> layer_norm",
    "BiasGelu": "bias add + GELU: read as add -> gelu",
    "Gelu": "erf-GELU as one op: read as gelu",
    "FastGelu": "bias add + tanh-GELU: read as add -> gelu_tanh",
    "QuickGelu": "x * sigmoid(1.702 x): read as its primitives",
    "BiasAdd": "bias add + residual add: read as add -> add",
    "RotaryEmbedding": "RoPE at position_ids: read as the rope op with one cos/sin table per batch row",
}
"""ONNX Runtime's contrib fusions and how the importer reads each (`models.onnx.handlers.contrib`)."""

QUANTIZED = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger")
"""Quantization steps (`models.onnx.handlers.quant`)."""


def _counts(meta: dict[str, Any], ops: Any) -> Counter[str]:
    seen: set[tuple[str, str]] = set()
    out: Counter[str] = Counter()
    for op, name, _ in (meta.get("onnx_nodes") or {}).values():
        if op in ops and (op, name) not in seen:
            seen.add((op, name))
            out[op] += 1
    return out


def imported_forms(model: Any) -> list[str]:
    """Lines naming what the ONNX file had already fused (ORT contrib ops) and its quantization steps; [] for any
    other model. Raises nothing."""
    meta = getattr(model, "meta", None) or {}
    lines = []
    pre = _counts(meta, PREFUSED)
    if int(meta.get("opset") or 0) >= 20:  # the default domain has its own Gelu from opset 20: not told apart
        pre.pop("Gelu", None)
    if pre:
        parts = ", ".join(f"{k} {op} ({PREFUSED[op]})" for op, k in sorted(pre.items()))
        lines.append(f"already fused in the file (ONNX Runtime's optimizer): {parts}; the passes judge the rest")
    q = _counts(meta, QUANTIZED)
    if q:
        parts = ", ".join(f"{k} {op}" for op, k in sorted(q.items()))
        why = (f"; its {q['MatMulInteger']} integer matmul(s) are written as f32 matmuls of the centered int8/uint8 "
               f"operands, exact in int32, then scaled: no float-matmul fusion (shared-input QKV, FusedMatMulBiasAct) "
               f"applies to them" if q.get("MatMulInteger") else
               "; a dequantized weight is an f32 matmul operand, so the matmul fusions apply to it"
               if q.get("DequantizeLinear") else "")
        lines.append(f"quantized: {parts} (int8/uint8 tensors; each step read as casts, round-half-even and scales)"
                     + why)
    return lines


__all__ = ["PREFUSED", "QUANTIZED", "imported_forms"]
