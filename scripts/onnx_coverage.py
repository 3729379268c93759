"""The ONNX coverage table of docs/onnx.md: for each export, does it import, with the exporter's numbers, and what
fuses.

    .venv/bin/python scripts/onnx_coverage.py [EXTRA.onnx ...]          # prints a Markdown table

Rows: the committed exports (tests/fixtures/onnx/*.onnx with their `NAME.npz`), the handed cases (`NAME_io.npz`:
inputs plus the exporter's outputs as `out:NAME`), the zoo (tests/fixtures/onnx/zoo, with PyTorch's outputs) and any
extra file given (checked against ONNX Runtime on random inputs). Columns: imports (or the first line of the
refusal), layers found, fused ops by kind in the final version, whether attention was packed (an `attention` op or a
fused block holding one), max error of version 0 and of the final version against the exporter's outputs (else ONNX
Runtime), host nodes (ops the IR lacks), `explain`'s verdict line, and for the zoo what ONNX Runtime's transformer
optimizer fuses on the same file (read from `zoo/ort_optimizer.json`, which `scripts/ort_optimizer_stats.py` writes:
the optimizer needs sympy and torch). Everything runs on the NumPy reference (no timing): the figures do not depend
on the machine.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from functools import cache
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "onnx"


def _cases() -> list[tuple[str, Path, Path | None]]:
    rows = []
    for p in sorted(FIX.glob("*.onnx")):
        rows.append((p.stem, p, FIX / f"{p.stem}.npz"))
    for p in sorted((FIX / "cases").glob("*.onnx")):
        rows.append((p.stem, p, FIX / "cases" / f"{p.stem}_io.npz"))
    for p in sorted((FIX / "zoo").glob("*.onnx")):
        rows.append((p.stem, p, FIX / "zoo" / f"{p.stem}.npz"))
    return rows + [(Path(a).stem, Path(a), None) for a in sys.argv[1:]]


@cache
def _ort_record() -> dict:
    """zoo/ort_optimizer.json's rows by file, read once ({} without the record)."""
    rec = FIX / "zoo" / "ort_optimizer.json"
    return json.loads(rec.read_text())["files"] if rec.is_file() else {}


def _ort_fused(name: str) -> str:
    """ORT's transformer optimizer on the zoo file `name` (its fused-op statistics), or '' for other rows."""
    row = _ort_record().get(name)
    if row is None:
        return ""
    if "error" in row:
        return f"optimizer failed ({row['error'].split(':')[0]})"
    return ", ".join(f"{k} x{v}" for k, v in sorted(row["fused"].items())) or "none"


def _row(name: str, path: Path, io: Path | None) -> str:
    from rlxviz.ir import Op
    from rlxviz.ir.onnx_op import host_nodes
    from rlxviz.models.minilm import minilm_dir
    from rlxviz.models.onnx import OnnxImportError, load_onnx
    from rlxviz.passes import Pipeline
    from rlxviz.runtime import run_reference
    from rlxviz.runtime.compare import max_abs
    from rlxviz.session import check_fusion
    from rlxviz.session.fidelity import against_onnx

    feeds = want = None
    if io is not None and io.is_file():
        d = dict(np.load(io))
        feeds = {k: v for k, v in d.items() if not k.startswith("out:")}
        want = [v for k, v in d.items() if k.startswith("out:")]
    ext = minilm_dir() if name == "minilm" else None
    try:
        shapes = {k: v.shape for k, v in feeds.items()} if feeds else None
        m = load_onnx(path, batch=2, seq=8, input_shapes=shapes, external_data_dir=ext)
    except OnnxImportError as e:
        return f"| {name} | no: {str(e).split(': ', 1)[-1][:90]} | | | | | | | | |"
    if feeds is None:
        feeds = m.random_feeds(seed=0)
    trace = Pipeline.canonical().run(m.graph)
    fused = Counter(n.op.value for n in trace.final if n.op.value[0].isupper() and n.op != Op.ELEMENTWISE_REGION)
    packed = any(n.op in (Op.ATTENTION, Op.FUSED_ATTENTION_BLOCK, Op.FUSED_TRANSFORMER_LAYER) for n in trace.final)
    if want is not None:
        e0 = max_abs(run_reference(m.graph, feeds, m.weights)[:len(want)], want)
        e1 = max_abs(run_reference(trace.final, feeds, m.weights)[:len(want)], want)
        against = "exporter"
    else:
        f = against_onnx(m, feeds)
        e0 = f.max_err if f else float("nan")
        e1 = max_abs(run_reference(trace.final, feeds, m.weights), run_reference(m.graph, feeds, m.weights))
        against = "ORT"
    check = check_fusion(trace, m.name)
    verdict = check.render().splitlines()[0].split(": ", 1)[-1]
    kinds = ", ".join(f"{k} x{v}" for k, v in sorted(fused.items())) or "none"
    layers = len(check.layers)
    return (f"| {name} | yes | {layers} | {kinds} | {'yes' if packed else 'no'} | {e0:.1e} ({against}) | {e1:.1e} | "
            f"{len(host_nodes(m.graph))} | {verdict} | {_ort_fused(name)} |")


def main() -> None:
    print("| export | imports | layers | fused ops (final version) | attention packed | max err, version 0 | "
          "max err, final | host nodes | explain | ONNX Runtime's optimizer (zoo) |")
    print("|---|---|---:|---|---|---:|---:|---:|---|---|")
    for name, path, io in _cases():
        print(_row(name, path, io))


if __name__ == "__main__":
    main()
