"""What ONNX Runtime's own optimizer makes of an ONNX file: the comparison notebook 05 draws.

Two optimizers ship with ONNX Runtime:

* the **graph optimizer** inside every `InferenceSession` (C++, `GraphOptimizationLevel.ORT_ENABLE_ALL`): it
  fuses what its CPU kernels have a fused form for (`SkipLayerNormalization`, `FastGelu`, `FusedMatMul`, ...) and
  writes the optimized model when `optimized_model_filepath` is set;
* the **transformer optimizer** (`onnxruntime.transformers.optimizer`, Python), which adds attention fusions;
  it needs `sympy` for its symbolic shape inference, which rlxviz does not install.

`ort_optimized` runs the first (always available where ONNX Runtime is) and says whether the second can run
here; `OrtFusions.fused` counts the node types the optimizer added (not in the source file), and
`OrtFusions.max_err` is the optimized model's largest difference from the source model on the same feeds
(ONNX Runtime's fusions must preserve the numbers too).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class OrtFusions:
    """ONNX Runtime's graph optimizer on one file.

    Attributes:
        version: `onnxruntime.__version__`.
        nodes_before / nodes_after: node counts of the source and of the optimized model.
        ops_before / ops_after: `op_type` -> count (the domain prefixed for non-standard ops, `com.microsoft.X`).
        fused: the op types in the optimized model that the source model does not have, with their counts.
        node_outputs: fused op type -> the number of outputs each such node produces, in graph order.
        max_err: max |optimized - source| over every output on `feeds`, both run by ONNX Runtime.
        transformer_optimizer: None when `onnxruntime.transformers.optimizer` can run here, else why not (one line).
    """

    version: str
    nodes_before: int
    nodes_after: int
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    fused: dict[str, int]
    node_outputs: dict[str, tuple[int, ...]]
    max_err: float
    transformer_optimizer: str | None


def _op(node: object) -> str:
    domain = getattr(node, "domain", "")
    return f"{domain}.{node.op_type}" if domain and domain != "ai.onnx" else node.op_type  # type: ignore[attr-defined]


def transformer_optimizer_unavailable() -> str | None:
    """None when `onnxruntime.transformers.optimizer` and its symbolic shape inference import here; else why
    not, in one line (e.g. `missing 'sympy'`)."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference  # noqa: F401
        from onnxruntime.transformers import optimizer  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure is the answer, in words
        return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    return None


def ort_optimized(path: str | Path, feeds: Mapping[str, np.ndarray]) -> OrtFusions:
    """Optimize `path` with ONNX Runtime's graph optimizer at `ORT_ENABLE_ALL` on the CPU and compare it with the
    source model on `feeds` (input name -> array).

    Raises:
        ImportError: onnxruntime is not installed. Whatever ONNX Runtime raises for a file it cannot load.
    """
    import onnx
    import onnxruntime as ort

    src = onnx.load(str(path))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "optimized.onnx"
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = str(out)
        so.log_severity_level = 3  # the "hardware specific optimizations" warning is about reusing the file
        optimized = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        opt = onnx.load(str(out))
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    reference = ort.InferenceSession(str(path), plain, providers=["CPUExecutionProvider"])
    names = [o.name for o in reference.get_outputs()]
    got, want = optimized.run(names, dict(feeds)), reference.run(names, dict(feeds))
    err = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) for a, b in
              zip(got, want, strict=True))
    before = Counter(_op(n) for n in src.graph.node)
    after = Counter(_op(n) for n in opt.graph.node)
    fused = {k: v for k, v in after.items() if k not in before}
    outputs: dict[str, list[int]] = {}
    for n in opt.graph.node:
        if _op(n) in fused:
            outputs.setdefault(_op(n), []).append(sum(1 for o in n.output if o))
    return OrtFusions(ort.__version__, len(src.graph.node), len(opt.graph.node), dict(before), dict(after), fused,
                      {k: tuple(v) for k, v in outputs.items()}, err, transformer_optimizer_unavailable())


@dataclass(frozen=True)
class TransformerFusions:
    """ONNX Runtime's transformer optimizer on one file (`optimize_model(..., opt_level=0)`: its Python fusions only).

    Attributes:
        version: `onnxruntime.__version__`. nodes_after: node count of the optimized model.
        fused: fused op type -> count, as its `get_fused_operator_statistics` reports them (zeros dropped).
        norm_outputs: per `SkipLayerNormalization` node in graph order, how many outputs it produces (2: the
            normalized value and the residual sum, the two-output form; 1: the value only).
        layer_norms_left: model paths (the `.weight` initializer's prefix) of the `LayerNormalization` nodes left.
    """

    version: str
    nodes_after: int
    fused: dict[str, int]
    norm_outputs: tuple[int, ...]
    layer_norms_left: tuple[str, ...]


def transformer_optimized(path: str | Path, model_type: str, num_heads: int, hidden_size: int) -> TransformerFusions:
    """Run `onnxruntime.transformers.optimizer.optimize_model` on `path` (no C++ graph optimization: `opt_level=0`).

    Raises:
        ImportError: the transformer optimizer cannot run here (`transformer_optimizer_unavailable` says why).
    """
    why = transformer_optimizer_unavailable()
    if why is not None:
        raise ImportError(f"onnxruntime.transformers.optimizer cannot run here: {why}")
    import onnxruntime as ort
    from onnxruntime.transformers import optimizer

    m = optimizer.optimize_model(str(path), model_type=model_type, num_heads=num_heads, hidden_size=hidden_size,
                                 opt_level=0)
    nodes = list(m.model.graph.node)
    stats = {k: v for k, v in m.get_fused_operator_statistics().items() if v}
    outs = tuple(sum(1 for o in n.output if o) for n in nodes if n.op_type == "SkipLayerNormalization")
    left = tuple(n.input[1].removesuffix(".weight") for n in nodes if n.op_type == "LayerNormalization")
    return TransformerFusions(ort.__version__, len(nodes), stats, outs, left)


__all__ = ["OrtFusions", "TransformerFusions", "ort_optimized", "transformer_optimized",
           "transformer_optimizer_unavailable"]
