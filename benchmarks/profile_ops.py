"""Where the time goes: per-op profile of all-MiniLM-L6-v2 on MLX, grouped by op, beside ONNX Runtime's.

Each compute node is evaluated on its own (eager, best of `--repeat`), so the total exceeds a lazy
run; the shares show what bounds the time. With `--inside`, fused ops are not timed as one block:
every kernel their lowering emits is (the linear's `mx.addmm`, attention, layer norm, the fast-math
GELU on CPU streams, ...), which is what shows where the final version's time goes. With `--ort`,
ONNX Runtime's own profiler (`SessionOptions.enable_profiling`) times each ONNX node of rlxviz's
export of the input graph, grouped by ONNX op type (fastest of `--repeat` runs per node), and the
lazy end-to-end medians of both are printed. Prints the active BLAS and the load average.

Usage: .venv/bin/python benchmarks/profile_ops.py [--batch 8] [--seq 128] [--version input|final]
       [--inside] [--ort] [--repeat 3] [--no-kernels] [--gemm auto|on|off]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from rlxviz.ir import Op
from rlxviz.ir.fused import DECOMPOSITIONS
from rlxviz.kernels.mlx_backend import blas_summary, mx
from rlxviz.models import load_model
from rlxviz.passes import Pipeline
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LOWERINGS, OVERRIDES, LoweringOptions, MlxEmitter
from rlxviz.runtime.timing import kernels_line


class TimedEmitter(MlxEmitter):
    """An `MlxEmitter` that evaluates every kernel it emits on its own and records `(label, ms)`:
    fused ops without an override in force are descended into (their decomposition's kernels are
    timed); `linear` / `linear_act` are timed as `linear (rlxviz gemm)` / `linear+gelu (rlxviz gemm)` where
    rlxviz's GEMM runs them (its weights packed once, before the best-of-`repeat`), else `linear (addmm)`."""

    def __init__(self, base: MlxEmitter, repeat: int) -> None:
        super().__init__(base.options, base.device)
        self.repeat, self.rows, self.cpu_rows, self._depth = max(1, repeat), [], [], 0
        self.inner_rows: list[tuple[str, float]] = []  # parts of an attention, already counted in its row
        self._time_softmax = False

    def _best(self, fn: Callable[[], mx.array]) -> tuple[mx.array, float, float]:
        best, cpu = float("inf"), float("inf")
        for _ in range(self.repeat):
            t, c = time.perf_counter(), time.process_time()
            out = fn()
            mx.eval(out)
            best, cpu = min(best, time.perf_counter() - t), min(cpu, time.process_time() - c)
        return out, best, cpu

    def _timed(self, label: str, fn: Callable[[], mx.array], operands: Sequence[Any]) -> mx.array:
        if self._depth:
            return fn()
        mx.eval([a for a in operands if isinstance(a, mx.array)])
        self._depth += 1
        try:
            if label == Op.ATTENTION.value:  # one untimed run that times the softmax inside it
                self._time_softmax = True
                mx.eval(fn())
                self._time_softmax = False
            out, best, cpu = self._best(fn)
        finally:
            self._depth -= 1
        self.rows.append((label, best * 1e3))
        self.cpu_rows.append((label, cpu * 1e3))
        return out

    def emit(self, op: Op, inputs: Sequence[mx.array], **attrs: Any) -> mx.array:
        ov = OVERRIDES.get(op)
        descend = op in DECOMPOSITIONS and op not in LOWERINGS and not (ov and ov.applies(self.options))
        if descend or self._depth:
            return super().emit(op, inputs, **attrs)
        label = op.value + (" (compiled)" if ov and ov.applies(self.options) else "")
        if op == Op.ATTENTION and self.cpu_kernels is not None:
            label += " (rlxviz kernel)"
        return self._timed(label, lambda: super(TimedEmitter, self).emit(op, inputs, **attrs), inputs)

    def softmax(self, x: mx.array, axis: int = -1) -> mx.array:
        if not self._time_softmax:
            return super().softmax(x, axis)
        self._time_softmax = False
        mx.eval(x)
        out, best, _cpu = self._best(lambda: super(TimedEmitter, self).softmax(x, axis))
        self.inner_rows.append(("softmax inside attention", best * 1e3))
        return out

    def linear(self, x: mx.array, w: mx.array, b: mx.array | None = None) -> mx.array:
        label = "linear (rlxviz gemm)" if self.gemm_applies(x, w, b, None) else "linear (addmm)"
        return self._timed(label, lambda: super(TimedEmitter, self).linear(x, w, b), (x, w, b))

    def linear_act(self, x: mx.array, w: mx.array, b: mx.array | None, act: str | None) -> mx.array:
        if not self._depth and self.gemm_applies(x, w, b, act):
            run = super().linear_act
            return self._timed(f"linear+{act} (rlxviz gemm)", lambda: run(x, w, b, act), (x, w, b))
        if self._depth or not self.bias_act_kernel_applies(x, w, b, act):
            return super().linear_act(x, w, b, act)
        self.kernels_ran.add(f"bias+{act}")
        y = self._timed("matmul (before bias+act)", lambda: mx.matmul(x, w), (x, w))
        return self._timed(f"bias+{act} (rlxviz kernel)", lambda: self.cpu_kernels.bias_act(y, b, act), (y, b))

    def residual_norm(self, x: mx.array, residual: mx.array, bias: mx.array | None, gamma: mx.array,
                      beta: mx.array | None, eps: float, kind: str = "layer_norm") -> mx.array:
        plain = super().residual_norm
        if self._depth or not self.residual_norm_kernel_applies(x, residual, bias, gamma, beta):
            return plain(x, residual, bias, gamma, beta, eps, kind)
        return self._timed(f"residual+{kind} (rlxviz kernel)", lambda: plain(x, residual, bias, gamma, beta, eps, kind),
                           (x, residual, bias, gamma, beta))


def mlx_profile(graph, feeds, weights, repeat: int, inside: bool,  # noqa: ANN001
                kernels: bool = True, gemm: bool | str | None = None) -> list[tuple[str, float]]:
    """(label, best ms) per kernel of one eager run of `graph` on the CPU executor (rlxviz's CPU kernels
    on or off; `gemm`: `LoweringOptions.gemm`, None the CPU's default)."""
    ex = MlxExecutor(LoweringOptions(kernels=kernels, gemm=gemm), device="cpu")
    if not inside:
        return [(r["op"], r["ms"]) for r in ex.profile(graph, feeds, weights, repeat=repeat)]
    timed = TimedEmitter(ex.emitter, repeat)
    ex.emitter = timed
    prog, args = ex.bind(graph, feeds, weights)  # static part (weights only) evaluated here, not timed
    timed.rows.clear()
    mx.eval(prog.fn(*args))
    return list(timed.rows) + [(f"  ({label})", ms) for label, ms in timed.inner_rows]


def lazy_median(call: Callable[[], object], repeat: int) -> float:
    call()
    ts = []
    for _ in range(max(3, repeat)):
        t = time.perf_counter()
        call()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def ort_profile(model, feeds, repeat: int) -> tuple[list[tuple[str, float]], Callable[[], object]]:  # noqa: ANN001
    """(ONNX op type, best ms per node) from ORT's profiler on rlxviz's export of `model.graph`."""
    import onnxruntime as ort

    from rlxviz.kernels.blas import cpu_cores
    from rlxviz.models.onnx.export import export_onnx

    tmp = tempfile.mkdtemp()
    export_onnx(model.graph, model.weights, f"{tmp}/m.onnx")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = cpu_cores()
    opts.enable_profiling = True
    opts.profile_file_prefix = f"{tmp}/ort"
    sess = ort.InferenceSession(f"{tmp}/m.onnx", opts, providers=["CPUExecutionProvider"])
    inp = {i.name: feeds[i.name] for i in sess.get_inputs()}
    for _ in range(max(1, repeat) + 1):
        sess.run(None, inp)
    events = json.load(open(sess.end_profiling()))
    per_node: dict[str, list[float]] = defaultdict(list)
    kind: dict[str, str] = {}
    for ev in events:
        if ev.get("cat") == "Node" and ev["name"].endswith("_kernel_time"):
            per_node[ev["name"]].append(ev["dur"] / 1e3)
            kind[ev["name"]] = ev["args"].get("op_name", "?")
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    plain.intra_op_num_threads = cpu_cores()
    timed = ort.InferenceSession(f"{tmp}/m.onnx", plain, providers=["CPUExecutionProvider"])
    return [(kind[n], min(ms[1:] or ms)) for n, ms in per_node.items()], lambda: timed.run(None, inp)


def table(title: str, rows: list[tuple[str, float]]) -> None:
    """Rows grouped by label, largest total first; labels `  (...)` are parts of a row already counted
    (e.g. the softmax inside attention): listed last, left out of the total."""
    by_op: dict[str, list[float]] = defaultdict(list)
    for op, ms in rows:
        by_op[op].append(ms)
    counted = [(op, ms) for op, ms in rows if not op.startswith("  (")]
    total = sum(ms for _, ms in counted)
    print(f"\n{title}\n{'op':<34}{'count':>6}{'total ms':>10}{'share':>8}{'ms/op':>8}")
    for op, ms in sorted(by_op.items(), key=lambda kv: (kv[0].startswith("  ("), -sum(kv[1]))):
        print(f"{op:<34}{len(ms):>6}{sum(ms):>10.2f}{sum(ms) / total:>8.1%}{sum(ms) / len(ms):>8.2f}")
    print(f"{'total (each op on its own)':<34}{len(counted):>6}{total:>10.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--version", choices=("input", "final"), default="input")
    ap.add_argument("--inside", action="store_true", help="time the kernels inside fused ops")
    ap.add_argument("--ort", action="store_true", help="also ONNX Runtime's per-node profile (input graph export)")
    ap.add_argument("--no-kernels", action="store_true", help="MLX's composed lowering instead of rlxviz's CPU kernels")
    ap.add_argument("--gemm", choices=("auto", "on", "off"), default="auto",
                    help="rlxviz's GEMM for fused ops' dense layers: the CPU's default rule (auto), always, never")
    args = ap.parse_args()

    model = load_model("minilm", args.batch, args.seq)
    feeds = model.random_feeds()
    graph = model.graph if args.version == "input" else Pipeline.canonical().run(model.graph).final
    print(f"all-MiniLM-L6-v2, {args.version} graph ({len(graph.compute_nodes())} ops), batch {args.batch}, "
          f"seq {args.seq}; {blas_summary()}; load average {os.getloadavg()[0]:.2f}")
    gemm = {"auto": None, "on": True, "off": False}[args.gemm]
    rows = mlx_profile(graph, feeds, model.weights, args.repeat, args.inside, not args.no_kernels, gemm)
    table(f"MLX CPU, {args.version} version{' (kernels inside fused ops)' if args.inside else ''}", rows)
    ex = MlxExecutor(LoweringOptions(kernels=not args.no_kernels, gemm=gemm), device="cpu")
    prog, xs = ex.bind(graph, feeds, model.weights)
    mx.eval(prog.fn(*xs))
    print(kernels_line(ex))
    lazy = {"MLX (lazy, whole graph)": lambda: mx.eval(prog.fn(*xs))}
    if args.ort:
        ort_rows, ort_call = ort_profile(model, feeds, args.repeat)
        table("ONNX Runtime CPU EP (rlxviz export of the input graph, after ORT's graph optimizations)", ort_rows)
        lazy["ONNX Runtime (whole graph)"] = ort_call
    for _ in range(2):  # interleave the end-to-end timings
        for name, call in lazy.items():
            print(f"{name}: median {lazy_median(call, args.repeat):.2f} ms")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
