"""ONNX Runtime's transformer optimizer next to rlxviz's canonical pipeline, on the same ONNX exports.

For each export in tests/fixtures/onnx (made by scripts/make_onnx_fixtures.py):

* ORT: `onnxruntime.transformers.optimizer.optimize_model(model, model_type, num_heads, hidden_size,
  opt_level=0)` (the Python fusion passes only: opt_level >= 1 needs PyTorch installed) and its
  `get_fused_operator_statistics()` (the non-zero counts).
* rlxviz: `load_onnx(path, batch=1, seq=8)`, the canonical pipeline, and the fused ops of the final
  version; per layer, `check_fusion`'s verdict (fused as expected, or the first rejecting guard).
* The ORT-optimized model is imported too (its contrib ops map to IR primitives) and run on the
  reference interpreter: the max |difference| to the original export shows it is read correctly.

Run: `.venv/bin/python benchmarks/compare_ort_optimizer.py [--markdown]` (needs onnxruntime and sympy,
see benchmarks/requirements.txt). Prints a table and, per model, each layer's verdict.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx.external_data_helper import load_external_data_for_model

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlxviz.models.onnx import import_graph, load_onnx  # noqa: E402
from rlxviz.passes import Pipeline  # noqa: E402
from rlxviz.runtime import run_reference  # noqa: E402
from rlxviz.teach import check_fusion  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "onnx"
SEQ = 8
MODELS = [  # name, ORT model_type, heads, hidden
    ("bert", "bert", 4, 64), ("minilm", "bert", 12, 384), ("gpt2", "gpt2", 4, 64),
    ("llama", "gpt2", 4, 64), ("vit", "vit", 4, 64)]
"""ORT has no `llama` model_type for the Python optimizer's generic fusions; `gpt2` applies its decoder
fusions (SkipSimplifiedLayerNormalization for RMSNorm graphs)."""

OURS = ("FusedTransformerLayer", "FusedAttentionBlock", "attention", "FusedResidualLN", "FusedResidualRmsNorm",
        "FusedMatMulBiasAct", "FusedSwiGLU")


def _external_dir(name: str) -> Path | None:
    if name != "minilm":
        return None
    from rlxviz.models import minilm_dir

    return minilm_dir()


def _proto(name: str) -> onnx.ModelProto:
    p = FIX / f"{name}.onnx"
    m = onnx.load(str(p), load_external_data=False)
    load_external_data_for_model(m, str(_external_dir(name) or p.parent))
    return m


def as_saved(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` as ORT's `OnnxModel.save` writes it: with the `com.microsoft` opset import its contrib nodes need (the
    optimizer's in-memory model lacks it, and ONNX's shape inference refuses a node of an undeclared domain)."""
    uses = any(n.domain == "com.microsoft" for n in model.graph.node)
    if uses and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return model


def ort_side(name: str, model_type: str, heads: int, hidden: int) -> tuple[dict[str, int], onnx.ModelProto]:
    from onnxruntime.transformers.optimizer import optimize_model

    logging.disable(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = optimize_model(_proto(name), model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0)
    stats = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
    return stats, as_saved(opt.model)


def ours_side(name: str) -> tuple[dict[str, int], list[str], object]:
    m = load_onnx(FIX / f"{name}.onnx", batch=1, seq=SEQ, external_data_dir=_external_dir(name))
    trace = Pipeline.canonical().run(m.graph)
    counts = Counter(n.op.value for n in trace.final)
    acts = Counter(n.attrs.get("activation") for n in trace.final if n.op.value == "FusedMatMulBiasAct")
    ours = {k: counts[k] for k in OURS if counts[k]}
    if ours.get("FusedMatMulBiasAct"):
        ours["FusedMatMulBiasAct"] = ", ".join(f"{v} {k or 'no act'}" for k, v in sorted(acts.items(), key=str))
    check = check_fusion(trace, name)
    lines = check.render().splitlines()
    return ours, lines, m


def read_back(name: str, optimized: onnx.ModelProto, model: object) -> float:
    """Max |reference(ORT-optimized, imported) - reference(original, imported)| on random inputs."""
    g, w, _ = import_graph(optimized, batch=1, seq=SEQ, name=f"{name}_ort")
    feeds = model.random_feeds(seed=0)  # type: ignore[attr-defined]
    feeds = {k: v for k, v in feeds.items() if k in {n.attrs["name"] for n in g.inputs}}
    a = run_reference(g, feeds, w)[0]
    b = run_reference(model.graph, feeds, model.weights)[0]  # type: ignore[attr-defined]
    return float(np.abs(a - b).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the README)")
    args = ap.parse_args()
    rows, details = [], []
    for name, mt, heads, hidden in MODELS:
        ort_stats, optimized = ort_side(name, mt, heads, hidden)
        ours, lines, model = ours_side(name)
        err = read_back(name, optimized, model)
        rows.append((name, ort_stats, ours, err))
        details.append((name, lines))
    def fmt(d: dict) -> str:
        return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"

    if args.markdown:
        print("| export | ORT optimizer (opt_level 0) | rlxviz canonical pipeline "
              "| ORT's output read back (max abs diff) |")
        print("|---|---|---|---|")
        for name, o, r, err in rows:
            print(f"| {name} | {fmt(o)} | {fmt(r)} | {err:.1e} |")
    else:
        for name, o, r, err in rows:
            print(f"{name:7s} ORT: {fmt(o)}\n{'':7s} rlxviz: {fmt(r)}\n"
                  f"{'':7s} ORT output imported, max abs diff {err:.1e}")
    print()
    for _, lines in details:
        print("\n".join(lines[:1] + [ln for ln in lines[1:] if ln.startswith(("layer", "  first", "    guard"))]))


if __name__ == "__main__":
    main()
