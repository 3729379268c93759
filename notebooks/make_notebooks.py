"""Write the teaching notebooks (`01_...` to `06_...`) from this script, without outputs.

Run `python notebooks/make_notebooks.py` after editing a cell here; `tests/test_notebooks.py` checks
that the stored notebooks are exactly what this script writes and executes each one top to bottom.
Cells whose output a test checks carry a tag (`metadata.tags`), e.g. `ftl-matches`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}

SETUP = '''\
import sys

import ipywidgets as widgets
from IPython.display import display

import rlxviz
from rlxviz import teach
from rlxviz.runtime import blas_summary

print("python:", sys.executable)
print("rlxviz", rlxviz.__version__, "|", blas_summary())'''


def md(text: str) -> nbformat.NotebookNode:
    return new_markdown_cell(text.strip("\n"))


def code(text: str, tag: str | None = None, hidden: bool = False) -> nbformat.NotebookNode:
    """A code cell; `hidden`: its source collapsed in Jupyter (solutions, shown on a click)."""
    cell = new_code_cell(text.strip("\n"))
    if tag:
        cell.metadata["tags"] = [tag]
    if hidden:
        cell.metadata["jupyter"] = {"source_hidden": True}
        cell.metadata["collapsed"] = True
    return cell


# ------------------------------------------------------------------------------------------------- 01

NB01 = [
    md("""
# 01 — What is fusion?

A model is a graph of small operations. Run one at a time, every intermediate tensor is **written to
memory by one op and read back by the next**. *Fusion* replaces a chain of ops with one op that
computes the same values — and, **if the backend runs that op as one kernel**, keeps the
intermediates in registers or cache.

In this notebook you will

1. build a small graph with the `Builder` and read its IR text,
2. run two fusion passes **one at a time** — `fuse_matmul_bias_act`, then `fuse_residual_ln` — and
   draw the graph before and after each,
3. count the bytes of intermediates an *ideal* fused kernel would not move, then the bytes the program
   MLX **actually executes** saves (a fused op is only a name in the graph; the lowering decides the
   kernels), and place every op and version on a roofline measured on this machine,
4. time every version on MLX in paired, interleaved rounds and read the table honestly (a verdict with
   its confidence interval, or "within noise"), measure what the lowering changes in the numbers, then
   put the measured points on the roofline,
5. check your understanding in an exercise with feedback.

Graphs are drawn by the same renderer as the app; big drawings scroll inside their box.
"""),
    code(SETUP, "setup"),
    md("""
## 1. A small graph

A BERT-style feed-forward block: `LayerNorm(x + fc2(gelu(fc1(x))))`, batch 2, 64 tokens, hidden
size 128, intermediate size 512. `b.linear` emits a `matmul` and an `add` (the bias); `b.scope` sets
the model path shown after `@`.
"""),
    code('''
from rlxviz.ir import Builder, format_graph

B, S, H, FF = 2, 64, 128, 512
b = Builder("ffn_block")
x = b.input("x", (B, S, H))
with b.scope("ffn.fc1"):
    h = b.gelu(b.linear(x, b.param("ffn.fc1.weight", (H, FF)), b.param("ffn.fc1.bias", (FF,))))
with b.scope("ffn.fc2"):
    y = b.linear(h, b.param("ffn.fc2.weight", (FF, H)), b.param("ffn.fc2.bias", (H,)))
with b.scope("ffn.norm"):
    out = b.layer_norm(b.add(y, x), b.param("ffn.norm.weight", (H,)), b.param("ffn.norm.bias", (H,)))
b.output(out)
graph = b.build()
print(format_graph(graph))
print("compute nodes:", len(graph.compute_nodes()))''', "ir-input"),
    code('''teach.show(graph, caption="the unfused graph")'''),
    md("""
## 2. First pass: `fuse_matmul_bias_act`

The pattern is `act(x @ w + bias)`. Each match becomes one `FusedMatMulBiasAct` whose epilogue adds
the bias and applies the activation (only `gelu` and `silu` are in its allow-list). Left: the graph the
pass saw, each match drawn as a cluster. Right: the result, fused nodes marked.
"""),
    code('''
from rlxviz.passes import run_passes

trace1 = run_passes(graph, ["fuse_matmul_bias_act"])
step1 = trace1.steps[0]
for m in step1.matches:
    print(f"{m.rule}: anchor %{m.anchor} -> %{m.fused}  roles {m.bindings}")
print("matches:", len(step1.matches), "| rejections:", len(step1.rejections))
print("op counts after:", step1.after.op_counts())''', "step-fmba"),
    code('''teach.show_step(step1)'''),
    md("""
### Memory traffic: the ideal kernel and the executed program

An intermediate is an absorbed node whose every reader was absorbed too. Unfused, its tensor
(`node.nbytes` bytes) is written once and read once per user. An **ideal** fused kernel moves neither;
the match's *result* is still written by the fused node, so it does not count.

MLX's own lowering (`rlxviz/runtime/lowering.py` with rlxviz's CPU kernels off) runs `FusedMatMulBiasAct` as
its decomposition: `x @ w + b` as **one `mx.addmm`**, then the activation as **separate kernels**. One
`mx.addmm` is not one pass over memory: on the **CPU**, MLX 0.32 first fills the output with the broadcast
bias and lets BLAS read and rewrite it (`beta = 1`), so it moves the bytes that matmul + add move — **0 B
saved** (recorded, not measured here: issue 23 timed the two on this project's CPU and found them equal within
a fraction of a percent). On the GPU a GEMM epilogue reads the bias, and the matmul's output never reaches
memory. `session.executed_traffic_saved` splits the ideal saving by what MLX's own lowering on a device runs
as one kernel; it is a **model** of MLX's kernels that does not know rlxviz's own CPU kernels (which run bias
+ GELU in one pass, or on AVX-512 at small batches the whole linear as one GEMM with the bias and GELU in its
store): the bytes MLX's program really moves are read from MLX below ("What MLX runs").
"""),
    code('''
from rlxviz import session

saved1 = teach.traffic_saved(step1)
run1 = session.executed_traffic_saved(step1, device="cpu")
for node_id, op, nbytes, users, why in run1.saved + run1.still_moved:
    state = "saved" if (node_id, op, nbytes, users, why) in run1.saved else "still moved"
    print(f"  %{node_id:<3} {op:<8} {list(graph[node_id].shape)}  {nbytes:>8} B x (1 write + {users} read): "
          f"{state:<11} ({why})")
print("ideal kernel: traffic saved by fuse_matmul_bias_act (bytes):", saved1.total)
print("model of MLX's own cpu lowering (no rlxviz kernels): saved (bytes):", run1.total)
print("model of MLX's own cpu lowering (no rlxviz kernels): still written and read (bytes):", run1.still_total)
print("model for a GPU (GEMM epilogue reads the bias): saved (bytes):",
      session.executed_traffic_saved(step1, device="gpu").total)''', "traffic-fmba"),
    md("""
## 3. Second pass: `fuse_residual_ln`

`LayerNorm(a + b)` becomes `FusedResidualLN(a, b, gamma, beta)`: `x` is the add's first operand,
`residual` its second, as the model wrote them. The order does not change the numbers (float addition is
commutative), and the transformer-layer fusion later accepts the residual in either order (notebooks 03
and 04).
How it runs is the lowering's choice. MLX's own lowering runs an `add` and then `mx.fast.layer_norm` —
and on the CPU `mx.fast.layer_norm` itself is not one kernel: MLX 0.32 runs its fallback, a chain of
primitives. rlxviz now has **its own CPU kernels** (`rlxviz/kernels`, `docs/performance.md` section 0):
where they are built, the CPU runs residual add + LayerNorm as **one** kernel, as vLLM's
`fused_add_rms_norm` does on a GPU. Which of the two ran here is read from MLX in the next section, not
assumed. (What it saves is the exercise at the end of this notebook.)
"""),
    code('''
trace2 = run_passes(step1.after, ["fuse_residual_ln"])
step2 = trace2.steps[0]
for m in step2.matches:
    print(f"{m.rule}: anchor %{m.anchor} -> %{m.fused}  roles {m.bindings}")
print(format_graph(step2.after))''', "step-rln"),
    code('''teach.show_step(step2)'''),
    md("""
### What MLX runs, read from MLX

The traffic above is a model. MLX can say what it runs: `session.version_primitives` lowers every
version, calls it once without evaluating, and reads MLX's own graph of **primitives** back
(`mx.export_to_dot`). *Views* (`Broadcast`, `Reshape`, ...) move no data; every other primitive is at
most one kernel; `Compiled...` is one `mx.compile`d kernel (here the CPU's fast-math GELU); `Rlxviz...`
is one of rlxviz's own CPU kernels.

The **bytes** come from the same graph (`ProgramBytes`: MLX's arrays give every primitive's input and output
shapes and dtypes): each kernel reads each distinct input once and writes each output once; reading through a
view costs the storage under it. That is each kernel's compulsory traffic (caches are not seen). One column
is a **model**, kept apart: the CPU `AddMM` pre-fills its output with the bias and lets BLAS read and rewrite
it (`beta = 1`), one more write and read of the output than the graph shows (`+ modelled`).
"""),
    code('''
import numpy as np

from rlxviz import kernels
from rlxviz.models import random_weights

weights = random_weights(graph, seed=0)
feeds = {"x": np.random.default_rng(0).standard_normal((B, S, H)).astype(np.float32)}
both = run_passes(graph, ["fuse_matmul_bias_act", "fuse_residual_ln"])
prims = session.version_primitives(both, feeds, weights, device="cpu")
print(session.format_primitives(prims))
shown = ("Matmul", "AddMM", "Add", "Sum", "Rsqrt", "RlxvizGemm", "RlxvizBiasAct", "RlxvizResidualLayerNorm")
for r in prims:
    top = {k: v for k, v in r.program.counts().items() if k in shown}
    print(f"  #{r.index} {r.label:<27} {top}")
layer_norm_kernel = "LayerNorm" in prims[0].program.counts()
print("mx.fast.layer_norm is one kernel here:", layer_norm_kernel)
moved = [r.program.bytes for r in prims]
for r, m in zip(prims, moved, strict=True):
    print(f"  #{r.index} bytes per call, read from MLX's graph: {m.from_graph} (+ {m.modelled} modelled) = {m.total}")
print(kernels.status())''', "primitives"),
    code('''
from IPython.display import Markdown

p0, p1, p2 = (r.program for r in prims)
c1 = p1.counts()  # which of rlxviz's own CPU kernels ran (rlxviz.kernels) is read from MLX's program
linears = ("each linear (`Matmul` + `Add`, and GELU for the first) became one `RlxvizGemm`, rlxviz's GEMM "
           "with the bias and GELU applied in its store" if "RlxvizGemm" in c1 else
           "the linear that GELU reads became a `Matmul` and one `RlxvizBiasAct`, rlxviz's CPU kernel for bias + "
           "GELU in one pass; the other `Matmul` + `Add` one `AddMM`" if "RlxvizBiasAct" in c1 else
           "each `Matmul` + `Add` became one `AddMM`")
display(Markdown(
    f"Read aloud: MLX runs {p0.kernels} non-view primitives for the input, {p1.kernels} after "
    "`fuse_matmul_bias_act` (" + linears
    + f") and {p2.kernels} after `fuse_residual_ln`"
    + (" — the same program: the norm fusion changed the graph, not what MLX runs" if p2.counts() == p1.counts()
       else " — the residual `Add` and the norm became one `RlxvizResidualLayerNorm` kernel"
       if "RlxvizResidualLayerNorm" in p2.counts() else "") + ". "
    + ("`mx.fast.layer_norm` is one `LayerNorm` kernel on this device." if layer_norm_kernel else
       "`mx.fast.layer_norm` is not one kernel on this device: MLX runs its fallback "
       "(`Sum`, `Rsqrt`, ... above).")
    + f" The bytes each call moves, read from the same program: {moved[0].total}, {moved[1].total} and "
    f"{moved[2].total} B (of which {moved[1].modelled} B in versions 1 and 2 are the modelled `AddMM` pre-fill)."))''',
         "primitives-read-aloud"),
    md("""
### The roofline: FLOPs per byte

A kernel that does few FLOPs per byte it moves waits on memory; one that does many waits on arithmetic.
Where the two limits meet is the machine's **ridge point** (peak FLOP/s divided by memory bandwidth).
The next cell measures the two ceilings on this machine with the product's timing
(`session.machine_ridge`): **compute**, a 1024 x 1024 f32 matmul on MLX (multi-threaded BLAS);
**bandwidth**, a streaming f32 add of two 4 Mi-element vectors — which MLX's CPU runs on **one thread**,
so it is the bandwidth one MLX CPU kernel gets, not the memory system's peak. It then places every op
and every version on the roofline (`session.op_costs`: each graph op's FLOPs and bytes from its shapes;
`session.roofline`: FLOPs from the graph, each version's bytes **read from the program MLX runs** (the
table above), and the bytes of ideal kernels, a model) and **predicts**, before anything is timed, which
bound each version is under and its fastest possible time (`session.attainable_ms`).

FLOPs are counted honestly: GELU is not 1 FLOP per element. Its `erf`, as the CPU lowering computes it
(`rlxviz/runtime/fast.py`: a clip, `x^2`, a degree-6 and a degree-4 polynomial, a product and a
division), is **25 FLOPs**, so GELU is 29 per element (`session.ERF_FLOPS`; the same rational
approximation XLA and Eigen use). Fusion changes no FLOP; at best it removes bytes.
"""),
    code('''
ridge = session.machine_ridge("cpu", n=1024, elements=1 << 22, repeat=5)
print(f"measured on MLX cpu: matmul {ridge.gflops:.1f} GFLOP/s, one-thread streaming add {ridge.gbps:.2f} GB/s "
      f"-> ridge {ridge.ridge:.1f} FLOP/B")
costs = session.op_costs(graph)
print(f"{'node':<6}{'op':<12}{'FLOPs':>10}{'bytes':>9}{'FLOP/B':>8}  bound")
for c in costs:
    bound = "memory" if c.intensity < ridge.ridge else "compute"
    print(f"%{c.node:<5}{c.op:<12}{c.flops:>10}{c.bytes:>9}{c.intensity:>8.2f}  {bound}")
both = run_passes(graph, ["fuse_matmul_bias_act", "fuse_residual_ln"])
roof = session.roofline(both, "cpu", feeds, weights)  # feeds given: bytes read from MLX's program
for v in roof:
    print(f"version {v.index} {v.label:<27} FLOPs {v.flops}  bytes executed {v.bytes} (ideal {v.ideal_bytes})  "
          f"FLOP/B executed {v.intensity:.2f} (ideal {v.ideal_intensity:.2f})")
predicted = {v.index: session.bound(v.intensity, ridge) for v in roof}
for v in roof:
    print(f"prediction #{v.index}: {predicted[v.index]}-bound, at best "
          f"{session.attainable_ms(v.flops, v.bytes, ridge):.3f} ms")''', "roofline"),
    code('''
from IPython.display import Markdown

mem = [c for c in costs if c.intensity < ridge.ridge]
where = (f"{len(mem)} of the {len(costs)} ops are memory-bound: " + ", ".join(sorted({c.op for c in mem}))
         + f" (at most {max(c.intensity for c in mem):.2f} FLOP/B)" if mem else
         "no op falls below it (a busy machine measures a low ridge: rerun this cell)")
flops = sorted({v.flops for v in roof})
display(Markdown(
    f"Read aloud: on this machine (a rough ridge of {ridge.ridge:.1f} FLOP/B, measured now) {where}; the matmuls "
    f"do {min(c.intensity for c in costs if c.op == 'matmul'):.1f} FLOP/B. The program does "
    + (f"{flops[0]} FLOPs in every version" if len(flops) == 1 else f"{flops[0]}..{flops[-1]} FLOPs")
    + f"; the bytes the executed program moves (source: {roof[0].bytes_source}, per version; "
    "the ideal kernels' bytes are a model) go from "
    f"{roof[0].bytes} to {roof[-1].bytes} (intensity "
    f"{roof[0].intensity:.2f} to {roof[-1].intensity:.2f} FLOP/B; ideal kernels: {roof[-1].ideal_intensity:.2f}). "
    + ("Prediction: every version is **compute-bound** on this machine, so removing bytes cannot make it faster; "
       "expect the timing below to show no difference." if set(predicted.values()) == {"compute"} else
       "Prediction: " + ", ".join(f"#{k} {b}-bound" for k, b in predicted.items())
       + "; only a memory-bound version can gain from removed bytes.")))''', "roofline-read-aloud"),
    md("""
## 4. Same numbers, less time?

Both passes in one pipeline, then every version timed **together in interleaved rounds** (round *r*
runs every version once, the one that starts rotating, so a busy machine slows them alike): median,
min and IQR (p25..p75) of the rounds; `x input` is the ratio of medians; `first ms` is the first call of a
fresh program (MLX builds, traces and runs it), kept out of the rounds. Two error columns:

* `vs oracle`: MLX against the float64 NumPy oracle of the unfused graph — it mixes in the difference
  between the two backends and precisions, so it is **not** what fusion changed;
* `vs unfused` (repeated below as `error vs input on MLX`): each version against the **unfused graph on
  the same MLX device, in the same dtype** — what the rewrite changed.
"""),
    code('''
print(teach.check_memory(both.input, "ffn_block", "time"))  # the check `rlxviz time` makes; time_versions repeats it
rows = teach.time_versions(both, feeds, weights, warmup=2, repeat=21, device="cpu", fresh=True)  # fresh: measure again
print("timed on:", rows[0].context)
print(teach.format_timings(rows))
print("all versions match the reference:", all(r.ok for r in rows))
for r in rows:  # `vs unfused`: the unfused graph run on the same MLX device, same dtype
    print(f"  #{r.index} {r.label:<28} error vs input on MLX: {r.err_unfused:.2e}")''', "timing"),
    md("""
### Reading the table aloud

The next cell writes the sentences from the numbers above, each version against the **previous** one
(`session.compare_versions`). Round *r* of two versions ran back to back, so the rounds are **paired**:
the statistic is the median over rounds of the per-round ratio, with a 95% bootstrap confidence
interval (rounds resampled with replacement, 2000 times, seeded). A version is *within noise* when the
interval contains 1, or when the median ratio is within 1% of 1 (below what a shared CPU resolves); a
verdict needs at least 21 rounds; a run whose median is more than twice its minimum is flagged as
unusable (a busy machine). Rerunning the timing cell measures again.
"""),
    code('''
from IPython.display import Markdown

base = rows[0]
busy = session.busy_warning(*rows)  # one warning for the run: a median far above its minimum
lines = [f"Measured on **{base.context.device}** ({base.context}), {len(base.samples_ms)} paired rounds."
         + (f" **{busy}**: the verdicts below are printed, not to be read." if busy else "")]
for prev, r, v in session.compare_versions(rows):
    lines.append(f"- **{r.label}** vs #{prev.index}: median {r.median_ms:.2f} vs {prev.median_ms:.2f} ms; per-round "
                 f"ratio {v.ratio:.3f} (95% CI {v.low:.3f}..{v.high:.3f}): **{v.words}**.")
    print(f"verdict {r.label}: {v.words}")
verdicts = [v.words for *_, v in session.compare_versions(rows)]
all_compute = set(predicted.values()) == {"compute"}
differs = [w for w in verdicts if w != "within noise"]
said = "every version compute-bound" if all_compute else ", ".join(f"#{k} {b}-bound" for k, b in predicted.items())
if busy:
    tail = ": this run cannot confirm or refute it (a busy machine); run the timing cell again, it measures anew."
elif not differs:
    tail = (": the paired rounds agree, no version differs from the one before." if all_compute else
            ": the paired rounds find no version different from the one before, so the bytes removed bought nothing "
            "measurable here.")
else:
    tail = ((": yet" if all_compute else ";") + f" the paired rounds find a difference ({'; '.join(verdicts)}). The "
            f"fused versions dispatch fewer kernels ({prims[0].program.kernels} -> {prims[-1].program.kernels} "
            "non-view primitives, the table of what MLX runs), and each kernel costs a launch and its own pass over "
            "its data, which a roofline of FLOPs and compulsory bytes does not count; the roofline section below puts "
            "the measured points against it. Run the timing cell again (it measures anew) to see whether the verdict "
            "holds.")
lines.append(f"The roofline predicted {said}{tail}")
display(Markdown("\\n".join(lines)))''', "read-aloud"),
    md("""
### What fusion changes in the numbers

A fusion is valid when it computes the same function (`docs/passes.md` states each rule's condition); its
kernels need not give the same **bits**. The next cell measures, on this block and this machine:

* the float32 **NumPy reference** executor on every version: these two passes compute the same ops in the
  same order there, so any difference would be the rewrite's own;
* MLX on the CPU, every version against the unfused graph in the same dtype (the timing table's
  `vs unfused`), which adds what the **lowering** changes:
* **fast-math transcendentals**: the CPU lowering and rlxviz's kernels compute GELU's `erf` with a
  rational approximation (`rlxviz/runtime/fast.py`), not libm's; its largest error on a fine grid;
* **`mx.addmm`** (what a fused linear emits): the bias enters the GEMM's accumulation, so it can round
  differently from a matmul followed by an add; measured in float32 and in bfloat16 at fc1's shape.
"""),
    code('''
ref32 = [teach.run_reference(g, feeds, weights, np.float32)[0] for _, g in both.versions()]
for (label, _), out, r in zip(both.versions(), ref32, rows, strict=True):
    print(f"#{r.index} {label:<27} f32 reference vs input {float(np.abs(out - ref32[0]).max()):.1e}; "
          f"MLX cpu vs input {r.err_unfused:.1e}")
err_fast = session.fast_erf_error(-6, 6)
print(f"fast erf vs exact on [-6, 6]: largest difference {err_fast:.1e}")
addmm = {name: session.addmm_rounding(B * S, H, FF, name) for name in ("float32", "bfloat16")}
for name, a in addmm.items():
    print(f"addmm vs matmul + add, {name}: largest difference {a.max_diff:.1e} ({a.ulps:.0f} ulp at the largest "
          "output)")''', "numerics"),
    code('''
ref_moves = [r.index for r, out in zip(rows, ref32, strict=True) if np.abs(out - ref32[0]).max() > 0]
display(Markdown(
    "Read aloud: on the float32 reference "
    + ("no version changes a bit: the two rewrites compute the same ops in the same order. " if not ref_moves else
       f"versions {ref_moves} change the output (by {max(float(np.abs(o - ref32[0]).max()) for o in ref32):.1e} "
       "at most). ")
    + f"On MLX the versions differ from the unfused graph by {max(r.err_unfused for r in rows):.1e} at most: "
    f"the fast erf is within {err_fast:.1e} of the exact one, and one `mx.addmm` differs from matmul + add by "
    + (f"{addmm['float32'].max_diff:.1e} ({addmm['float32'].ulps:.0f} ulp)" if addmm["float32"].max_diff else
       "nothing (the same bits here)")
    + f" in float32 and "
    f"{addmm['bfloat16'].max_diff:.1e} ({addmm['bfloat16'].ulps:.0f} ulp) in bfloat16. Neither comes from the "
    "graph rewrite: both are the lowering's rounding, inside the tolerance the timing table checks."))''',
         "numerics-read-aloud"),
    md("""
### The roofline with the measured points

Each timed version as a point: its intensity (FLOPs over the executed program's bytes) and the FLOP/s it
achieved (its FLOPs over its median time). The line is the roofline measured above.
"""),
    code('''
from IPython.display import HTML

points = [(r.label, v.intensity, v.flops / r.median_ms / 1e6) for r, v in zip(rows, roof, strict=True)]
display(HTML(teach.svg_html(teach.roofline_svg(ridge.gflops, ridge.gbps, points),
                           caption="roofline measured on this machine; dots: the timed versions")))
for label, intensity, achieved in points:
    print(f"measured {label:<27} {intensity:.2f} FLOP/B  {achieved:.2f} GFLOP/s "
          f"({achieved / ridge.gflops:.0%} of the matmul peak)")
compute_bound = [label for label, i, _ in points if i >= ridge.ridge]
print("compute-bound versions:", ", ".join(compute_bound) or "none")''', "roofline-measured"),
    code('''
best = min(session.attainable_ms(v.flops, v.bytes, ridge) for v in roof)  # the roofline's own fastest time
medians, fastest = [r.median_ms for r in rows], min(r.min_ms for r in rows)
dispatched = [r.program.kernels for r in prims]
achieved = [a for *_, a in points]
busy_roof = session.busy_warning(*rows)
differ = not busy_roof and any(v.words != "within noise" for *_, v in session.compare_versions(rows))
span = f"{max(dispatched)} to {min(dispatched)}" if min(dispatched) != max(dispatched) else f"{dispatched[0]}"
text = (f"Read aloud: {len(compute_bound)} of {len(points)} versions sit right of the ridge ({ridge.ridge:.1f} "
        "FLOP/B): " + ("**all are compute-bound**, so removing bytes cannot help them: on the roofline their best "
                       "time is set by arithmetic alone (the matmuls, and GELU's 29 FLOPs per element). "
                       if len(compute_bound) == len(points) else
                       "those left of it are memory-bound and can gain from removed bytes. ")
        + f"A roofline is a ceiling, not a time: its best is {best:.3f} ms, and the versions took {min(medians):.2f}-"
        f"{max(medians):.2f} ms (median; fastest round {fastest:.2f} ms), so they achieve {min(achieved):.2f}-"
        f"{max(achieved):.2f} GFLOP/s of the {ridge.gflops:.1f} the matmul alone reaches. ")
if max(achieved) > ridge.gflops:
    text += ("That is above the measured peak: the ceiling the roofline cell measured is too low (the machine was "
             "busier then, or one 1024 x 1024 matmul is not this machine's fastest), so rerun that cell before "
             "reading the points against it. ")
if busy_roof:
    text += "This timing run was flagged as taken on a busy machine: measure again before reading more into it."
elif differ:
    text += (f"The versions do the same FLOPs, yet the paired rounds find them different: what changed between "
             f"them is the kernels MLX dispatches ({span} non-view primitives per call) and the bytes those move, so "
             "the arithmetic does not set their time. The cost per kernel does (a launch, and each kernel's own pass "
             "over its data), which this roofline does not count: **overhead**, the regime of the GPU section below.")
elif min(medians) > 3 * best:
    text += (f"More than 3 times the ceiling's time, and alike: what sets it is what the roofline leaves out, such "
             f"as the dispatch of {span} non-view primitives per call (the table of what MLX runs), each kernel's "
             "own pass over its data, and other work on the machine.")
else:
    text += "Alike, and within 3 times the ceiling's time: the arithmetic sets most of it."
display(Markdown(text))''', "roofline-conclusion"),
    md("""
### Recorded, not measured here: MiniLM on an H200 GPU

These figures were **recorded** on an NVIDIA H200 host (16 CPU cores) with mlx-cuda 0.32.4 (CUDA 13),
`MLX_ENABLE_TF32=0`, all-MiniLM-L6-v2-shaped encoder, f32, batch 8, seq 128, as reported in issue 12
(filed before 2026-12-01; the issue gives no day), and two figures issue 23 adds. This notebook does **not**
measure them; they are data to compare with, like a table in a paper. The project's own benchmark logs
(`benchmarks/logs/`) would be the better source: the cell first reads which devices they were measured on.
"""),
    code('''
import re
from pathlib import Path

logs = sorted(Path("../benchmarks/logs").glob("*.txt"))  # `rlxviz` and the benchmarks print MLX's Device(...)
devices = {p.name: sorted(set(re.findall(r"Device\\((\\w+)", p.read_text(encoding="utf-8")))) for p in logs}
gpu_logs = [name for name, d in devices.items() if "gpu" in d]
measured_on = sorted({x for d in devices.values() for x in d})
print(f"benchmarks/logs/: {len(logs)} logs, measured on {measured_on}; "
      f"GPU logs: {', '.join(gpu_logs) or 'none (benchmarks/gpu_check.sh writes them on a lent GPU)'}")
RECORDED_GPU = {  # issue 12: NVIDIA H200, mlx-cuda 0.32.4, CUDA 13, TF32 off, MiniLM-shaped, batch 8, seq 128
    "input (109 ops)": 3.54,
    "after fuse_matmul_bias_act": 3.52,
    "after fuse_attention_block": 3.44,
    "after fuse_residual_ln": 3.45,
    "after fuse_transformer_layer (13 ops, compiled per layer)": 2.50,
    "after mark_elementwise_regions (12 ops)": 3.12,
    "PyTorch 2.11 eager CUDA (HF BertModel, sdpa, strict f32)": 2.76,
    "torch.compile, same model": 1.42,
}
RECORDED_ISSUE_23 = {  # issue 23 (2026-12-01), from the same H200 runs
    "bytes the compiled layers keep out of HBM, at H200 bandwidth (ms)": 0.029,
    "second log of the same day: after fuse_transformer_layer (ms)": 2.49,
    "second log of the same day: after mark_elementwise_regions (ms)": 2.52,
}
print("RECORDED (issue 12, H200, mlx-cuda 0.32.4) - not measured in this notebook")
for label, ms in RECORDED_GPU.items():
    print(f"  {label:<60} {ms:>5.2f} ms  ({RECORDED_GPU['input (109 ops)'] / ms:.2f}x input)")
print("RECORDED (issue 23) - not measured in this notebook")
for label, ms in RECORDED_ISSUE_23.items():
    print(f"  {label:<67} {ms}")''', "recorded-gpu"),
    code('''
from IPython.display import Markdown

gpu = RECORDED_GPU
gpu_in = gpu["input (109 ops)"]
per_op = [gpu[k] for k in ("after fuse_matmul_bias_act", "after fuse_attention_block", "after fuse_residual_ln")]
layer = gpu["after fuse_transformer_layer (13 ops, compiled per layer)"]
final = gpu["after mark_elementwise_regions (12 ops)"]
hbm, *second = RECORDED_ISSUE_23.values()
display(Markdown(
    f"Read aloud (recorded figures, not measured here): on that GPU the per-op fusions alone stayed within a few "
    f"percent of the input ({min(per_op):.2f}-{max(per_op):.2f} ms vs {gpu_in:.2f} ms). The gain came from "
    "`FusedTransformerLayer` being **compiled** into one MLX function per layer on the GPU (the lowering table: "
    f"`compile_layers` is on for the GPU, off for the CPU): {layer:.2f} ms, a speed-up of {gpu_in / layer:.2f}x over "
    f"the input (a ratio of times; torch.compile's {gpu['torch.compile, same model']:.2f} ms in the table is a "
    f"time). What was gained is mostly **overhead**, not bytes: {gpu_in - layer:.2f} ms saved, of which the bytes "
    f"the compiled layer keeps out of HBM account for about {hbm} ms (issue 23's count at H200 bandwidth); the rest "
    "is per-op host dispatch and kernel launches, one per primitive. That is a third regime beside memory- and "
    "compute-bound: **overhead-bound**, where the number of kernels, not their bytes or FLOPs, sets the time. "
    f"The final version's {final:.2f} ms (after `mark_elementwise_regions`) is **one unpaired run**; a second log "
    f"of the same day gave {second[0]:.2f} vs {second[1]:.2f} ms for the two last versions, so these figures do not "
    "show that the elementwise regions hurt. "
    + (f"`benchmarks/logs/` holds no GPU run ({len(logs)} logs, all on {', '.join(measured_on)}): "
       "these issue figures are the only GPU record, and they are not paired rounds." if not gpu_logs else
       f"`benchmarks/logs/` holds GPU runs ({', '.join(gpu_logs)}): compare them with these figures.")))''',
         "recorded-gpu-read-aloud"),
    md("""
## 5. Try it

Pick an **order** of passes and see the resulting graph with its ideal traffic and the traffic model of
MLX's own CPU lowering (without rlxviz's kernels; what runs here is read from MLX above). Try
`fuse_residual_ln` alone: it still fires, because it does not depend on the first pass. The output
printed under this cell before the control is a static copy (what an exported HTML page shows).
"""),
    code('''
ORDERS = {"none": [], "fuse_matmul_bias_act": ["fuse_matmul_bias_act"], "fuse_residual_ln": ["fuse_residual_ln"],
          "fuse_matmul_bias_act, fuse_residual_ln": ["fuse_matmul_bias_act", "fuse_residual_ln"],
          "fuse_residual_ln, fuse_matmul_bias_act": ["fuse_residual_ln", "fuse_matmul_bias_act"]}


def run_and_draw(order="fuse_matmul_bias_act, fuse_residual_ln"):
    passes = ORDERS[order]
    t = run_passes(graph, passes) if passes else None
    g = t.final if t else graph
    ideal = sum(teach.traffic_saved(s).total for s in t.steps) if t else 0
    executed = sum(session.executed_traffic_saved(s, "cpu").total for s in t.steps) if t else 0
    print(f"passes: {passes or 'none'} -> {len(g.compute_nodes())} compute nodes; traffic saved: "
          f"ideal {ideal} B, model of MLX's own CPU lowering (no rlxviz kernels) {executed} B")
    display(teach.show(g))


run_and_draw()  # static output for exports
controls = widgets.interact(run_and_draw, order=widgets.Dropdown(options=list(ORDERS), description="order"))'''),
    md("""
## Exercise: what does the executed program move?

Graph `graph`, version after both passes, run by MLX on the CPU. The `FusedResidualLN` reads
`y + x` for `x` of shape `[2, 64, 128]` float32. Fill in two numbers (bytes, write + reads):

* `ideal`: the traffic an ideal single kernel for `FusedResidualLN` saves,
* `executed`: the bytes per call the program MLX runs here moves less after `fuse_residual_ln` than before
  it (read from MLX: the table of "What MLX runs" above).

Run the cell: the check says what is wrong, if anything. A solution is in
`notebooks/solutions.py` (`ex01`); the collapsed cell at the end runs it through the same check.
"""),
    code('''
def check_ex01(answer):
    ideal, executed = teach.expect_ints(answer, ("ideal", "executed"))  # a tuple of two whole numbers
    nbytes = 2 * 64 * 128 * 4
    assert ideal != nbytes, "you counted the write of the sum only: it is also read once by the norm"
    assert ideal == 2 * nbytes, f"ideal: the sum [2, 64, 128] f32 is {nbytes} B, written once and read once"
    saved = moved[1].total - moved[2].total  # read from MLX's program, versions 1 and 2
    assert executed != ideal, ("executed: not the ideal kernel's saving: compare the primitives of versions 1 and 2 "
                               "above and the bytes MLX's program moves in each")
    assert saved == 0 or executed != -saved, ("executed: the saving is version 1's bytes minus version 2's, "
                                              "not the other way")
    assert executed == saved, "executed: subtract the two versions' bytes per call in the table above"
    return "both right"


ex01_answer = (None, None)  # YOUR ANSWER: (ideal bytes, executed bytes)
teach.feedback(check_ex01, ex01_answer);''', "exercise"),
    code('''
import solutions

teach.feedback(check_ex01, solutions.ex01(prims));''', "solution", hidden=True),
]

# ------------------------------------------------------------------------------------------------- 02

NB02 = [
    md("""
# 02 — Fusing a BERT layer

The real **all-MiniLM-L6-v2** (sentence-transformers, 6 layers, hidden 384) loaded from its
safetensors checkpoint as Hugging Face primitives, run through the whole canonical pipeline. You will

1. step through every graph version with a slider,
2. read the six `FusedTransformerLayer` matches and the role each node plays,
3. see what each fused op **runs as** on MLX, the traffic each pass saves (ideal, and modelled for MLX's
   own lowering; horizontal fusion included), what MLX really runs per version and for one fused op,
   read from MLX,
4. time every version on MLX in paired, interleaved rounds and read the table honestly; time
   `mx.compile` of whole layers on the CPU (a fusion that does not pay) and measure the numerics,
5. learn why pass **order** matters by running the layer pass too early: first it is silent, then it
   rejects every layer,
6. learn why RLX gates attention fusion at 64 tokens (a guard of kind *not profitable*) and measure
   whether that gate pays on MLX,
7. check yourself in an exercise with feedback.
"""),
    code(SETUP, "setup"),
    code('''
from rlxviz.models import load_model, tokenize
from rlxviz.passes import CANONICAL_ORDER, Pipeline

SEQ = 16
model = load_model("minilm", batch=1, seq=SEQ)
feeds = tokenize(["Fusion makes the graph smaller and the model faster."], SEQ, model.tokenizer_file)
print(model.description)
print("input graph:", len(model.graph.compute_nodes()), "compute nodes;", len(model.weights), "weights")
print("tokens:", int(feeds["attention_mask"].sum()), "of", SEQ)''', "load"),
    md("""
## 1. The canonical pipeline

The canonical pipeline runs its passes in a fixed order (`rlxviz passes` prints them with their guards;
the cell below counts the steps, one pass may run twice). Each step records its matches (fused) and
rejections (near-misses, with the guard that said no).
"""),
    code('''
trace = Pipeline.canonical().run(model.graph)
print(f"{'#':>2}  {'pass':<26} {'matches':>7} {'rejections':>10} {'nodes after':>11}")
for i, s in enumerate(trace.steps, 1):
    print(f"{i:>2}  {s.pass_name:<26} {len(s.matches):>7} {len(s.rejections):>10} {len(s.after.compute_nodes()):>11}")
final_counts = trace.final.op_counts()
names = [s.pass_name for s in trace.steps]
twice = ", ".join(f"{p} runs {names.count(p)} times" for p in dict.fromkeys(names) if names.count(p) > 1)
print(f"canonical pipeline: {len(names)} steps, {len(set(names))} distinct passes ({twice or 'each runs once'})")
shared = trace.step("fuse_shared_input_matmul")
delta = {op: shared.after.op_counts().get(op, 0) - shared.before.op_counts().get(op, 0)
         for op in ("matmul", "add", "concat", "narrow")}
print(f"fuse_shared_input_matmul: nodes {len(shared.before.compute_nodes())} -> {len(shared.after.compute_nodes())}"
      " (" + ", ".join(f"{op} {d:+d}" for op, d in delta.items()) + ")")
print("fused layers:", final_counts.get("FusedTransformerLayer", 0))''', "pipeline"),
    md("""
## 2. Every version, one slider

Version 0 is the input graph; version *k* is the graph after pass *k*. The `layers` view draws one
box per transformer layer with its fusion status; `full` draws every op (scroll inside the box).
"""),
    code('''
from rlxviz.viz import Overlay

versions = trace.versions()

LAST = len(versions) - 1


def show_version(k=LAST, view="layers"):
    label, g = versions[k]
    overlay = Overlay.after(trace.steps[k - 1]) if k and view == "full" else Overlay.trace_summary(trace)
    print(f"version {k}: {label} — {len(g.compute_nodes())} compute nodes")
    return teach.show(g, overlay, view=view)


controls = widgets.interact(
    show_version, k=widgets.IntSlider(value=len(versions) - 1, min=0, max=len(versions) - 1, description="version"),
    view=widgets.ToggleButtons(options=["layers", "full"], value="layers"))'''),
    code('''display(show_version(0, "full"))''', "version-input"),
    md("""
## 3. The six `FusedTransformerLayer` matches

A match binds **roles** to node ids of the graph the pass saw: `attn` (the FusedAttentionBlock),
`ln1` (h1, the post-attention FusedResidualLN), `fc1`/`fc2` (the FFN's two FusedMatMulBiasActs), `ln2`,
and operands such as `hidden` and the weights, which stay outside the fused node.
"""),
    code('''
step = trace.step("fuse_transformer_layer")
core = ("attn", "ln1", "fc1", "fc2", "ln2", "hidden")
for m in step.matches:
    roles = ", ".join(f"{r}=%{m.bindings[r]} {step.before[m.bindings[r]].op.value}" for r in core)
    print(f"layer {m.layer}: -> %{m.fused}  {roles}")
print("FusedTransformerLayer matches:", len(step.matches))''', "ftl-matches"),
    code('''teach.show_step(step, focus=3)'''),
    md("""
### What `FusedTransformerLayer` is

`FusedTransformerLayer` is a **graph-level macro op**: one node standing for a whole encoder layer
(attention block, two residual norms, the FFN), so later passes, the drawings and the timing table see
one layer as one thing. It is not one kernel. How it runs is the lowering's choice per device
(`rlxviz/runtime/lowering.py`, `DEVICE_LOWERING`): on the **GPU** its decomposition is traced into
**one `mx.compile`d function** per layer; on the **CPU** it runs its decomposition op by op (a compiled
CPU layer ran its elementwise work on one thread and was slower in the recorded paired runs at MiniLM's
full shape; section 5, "Fusion that does not pay", prints that record and measures it live at a class-sized
shape, where the verdict may differ). The next cell reads this from the
lowering for every fused op in the final graph.
"""),
    code('''
from rlxviz import session

fused_ops = sorted(op for op in final_counts if op.startswith("Fused") or op == "ElementwiseRegion")
for op in fused_ops:
    cpu, gpu = session.runs_as(op, "cpu"), session.runs_as(op, "gpu")
    print(f"{op:<24} x{final_counts[op]:<3} cpu: {cpu:<28} gpu: {gpu}")''', "runs-as"),
    md("""
## 4. Traffic each pass saves — ideal kernel vs executed program

Per pass: bytes of intermediates an ideal one-kernel fused op would not write and read, and the part
MLX's own lowering on each device would save (`session.executed_traffic_saved`, a **model** of MLX's
kernels; it does not know rlxviz's own CPU kernels, so its `cpu B` column is MLX's lowering without them).
The bytes the program run here really moves are read from MLX in the next section. Horizontal fusion
(`fuse_shared_input_matmul`: Q, K and V read the same hidden state) removes **no** intermediate; it is
credited with what it saves — reads of the shared input and kernel launches (`session.shared_input_saved`).
"""),
    code('''
print(f"{'pass':<26} {'ideal B':>9} {'cpu B':>9} {'gpu B':>9}  horizontal (input reads B, launches)")
for s in trace.steps:
    if not s.matches:
        continue
    cpu, gpu = (session.executed_traffic_saved(s, d) for d in ("cpu", "gpu"))
    reads, launches = session.shared_input_saved(s)
    extra = f"  {reads} B, {launches} launches" if launches else ""
    print(f"{s.pass_name:<26} {cpu.ideal.total:>9} {cpu.total:>9} {gpu.total:>9}{extra}")
ftl = session.executed_traffic_saved(trace.step("fuse_transformer_layer"), "cpu")
print("fuse_transformer_layer, model of MLX's own cpu lowering (no rlxviz kernels): executed saving", ftl.total,
      "B of", ftl.ideal.total, "B ideal")''', "traffic"),
    md("""
### What MLX runs, read from MLX

The bytes above are a model of the kernels. MLX's own primitive count per version (`session.version_primitives`:
each version lowered, called once, MLX's lazy graph read back; views excluded) is the honest story: how
many primitives the backend dispatches per call, version by version — and, from the same graph, the bytes
each call moves (each kernel's distinct inputs read once and outputs written once; `+ modelled` is the CPU
`AddMM`'s bias pre-fill, a model kept apart). With rlxviz's CPU kernels built, the fused versions run them
(`Rlxviz...` primitives, `docs/performance.md` section 0).
"""),
    code('''
prims = session.version_primitives(trace, feeds, model.weights, device="cpu")
print(session.format_primitives(prims))
changed = [r for p, r in zip(prims[:-1], prims[1:], strict=True) if r.program.counts() != p.program.counts()]
print("versions whose MLX program changed:", ", ".join(f"#{r.index} {r.label}" for r in changed))
k = next(i for i, s in enumerate(trace.steps, 1) if s.pass_name == "fuse_shared_input_matmul")
launches_saved = prims[k - 1].program.kernels - prims[k].program.kernels
print(f"fuse_shared_input_matmul: {prims[k - 1].program.kernels} -> {prims[k].program.kernels} non-view primitives")
for p, r in zip(prims[:-1], prims[1:], strict=True):
    saved = p.program.bytes.total - r.program.bytes.total
    print(f"  #{r.index} {r.label:<30} bytes per call saved, read from MLX: {saved}")
ours = sorted({name for r in prims for name in r.program.counts() if name.startswith("Rlxviz")})
print("rlxviz CPU kernels in the programs:", ", ".join(ours) or "none")''',
         "primitives"),
    code('''
from IPython.display import Markdown

ftl_prims = next(r for r in prims if r.label == "after fuse_transformer_layer")
ftl_changed = ftl_prims in changed
display(Markdown(
    f"Read aloud: the graph goes from {prims[0].ops} to {prims[-1].ops} ops, MLX's program from "
    f"{prims[0].program.kernels} to {prims[-1].program.kernels} non-view primitives. The program changes only at "
    + ", ".join(f"**{r.label}** ({prims[r.index - 1].program.kernels} -> {r.program.kernels})" for r in changed)
    + ". " + ("`fuse_transformer_layer` changes the program too." if ftl_changed else
              f"`fuse_transformer_layer` takes the graph from {prims[ftl_prims.index - 1].ops} to {ftl_prims.ops} ops "
              "and changes "
              "nothing MLX runs on the CPU: it renames groups of ops; the backend runs the same kernels.")
    + f" Bytes per call, read from the same programs: {prims[0].program.bytes.total} for the input, "
    f"{prims[-1].program.bytes.total} for the final version ({prims[-1].program.bytes.from_graph} from MLX's graph "
    f"+ {prims[-1].program.bytes.modelled} modelled `AddMM` pre-fill)"
    + (f", which runs rlxviz's own CPU kernels ({', '.join(ours)})." if ours else " (MLX's own lowering).")))''',
         "primitives-read-aloud"),
    md("""
### One fused op's kernels, on the CPU and on the GPU

A fused op is a name in the graph; what runs is a list of MLX primitives. The next cell builds one
`FusedMatMulBiasAct` (MiniLM's FFN input projection with its GELU, at this notebook's tokens) and reads
from MLX the non-view primitives one call runs, in MLX's order: on the CPU with rlxviz's kernels (the
default), on the CPU with MLX's own lowering, and on the GPU where MLX has one here. Without a GPU it
says so: no list of the GPU's primitives was ever recorded for this op, so none is shown. A `Compiled(...)`
kernel is one `mx.compile`d function; MLX names it after every primitive it fuses, shown here as those
names with their counts (`Multiply x10`: ten multiplies inside that one kernel).
"""),
    code('''
import numpy as np

from rlxviz.ir import Builder
from rlxviz.models import random_weights
from rlxviz.passes import run_passes
from rlxviz.runtime.devices import available_devices
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions
from rlxviz.session.program import VIEWS

ob = Builder("one_fused_linear")
ox = ob.input("x", (1, SEQ, 384))
ob.output(ob.gelu(ob.linear(ox, ob.param("w", (384, 1536)), ob.param("b", (1536,)))))
one = run_passes(ob.build(), ["fuse_matmul_bias_act"]).final
one_w = random_weights(one, seed=0)
one_x = {"x": np.random.default_rng(0).standard_normal((1, SEQ, 384)).astype(np.float32)}
print("graph:", {k: v for k, v in one.op_counts().items() if k not in ("input", "param")})
here = available_devices()
runs = {"cpu, rlxviz's kernels (default)": MlxExecutor(device="cpu"),
        "cpu, MLX's own lowering": MlxExecutor(LoweringOptions(kernels=False), device="cpu")}
if any(d.name == "gpu" for d in here):
    runs["gpu (read from MLX here)"] = MlxExecutor(device="gpu")
op_kernels = {}
for label, ex in runs.items():
    p = session.mlx_primitives(one, one_x, one_w, executor=ex, bytes=False)
    op_kernels[label] = [session.short_primitive(k) for k in p.primitives if k not in VIEWS]
    print(f"{label}: {len(op_kernels[label])} kernels: {' -> '.join(op_kernels[label])}")
if not any(d.name == "gpu" for d in here):
    print("gpu: no GPU for MLX on this machine, so its kernels cannot be read here; no GPU primitive list was "
          "recorded for this op (benchmarks/gpu_check.sh records timings only)")''', "op-kernels"),
    code('''
cpu_ours, cpu_mlx = op_kernels["cpu, rlxviz's kernels (default)"], op_kernels["cpu, MLX's own lowering"]
display(Markdown(
    f"Read aloud: one `FusedMatMulBiasAct` is **{len(cpu_ours)}** kernel(s) on this CPU with rlxviz's kernels "
    f"({', '.join(f'`{k}`' for k in cpu_ours)}: "
    + ("rlxviz's GEMM, the bias and GELU applied in its store" if cpu_ours == ["RlxvizGemm"] else
       "the matmul stays OpenBLAS's, bias + GELU is one pass") + ") and "
    f"**{len(cpu_mlx)}** with MLX's own lowering ({', '.join(f'`{k}`' for k in cpu_mlx)}). "
    + (f"On the GPU here MLX runs {len(op_kernels['gpu (read from MLX here)'])}: "
       + ", ".join(f"`{k}`" for k in op_kernels["gpu (read from MLX here)"]) + "."
       if "gpu (read from MLX here)" in op_kernels else
       "There is no GPU on this machine, so what the GPU runs is not shown: it was never recorded for this op.")))''',
         "op-kernels-read-aloud"),
    md("""
## 5. Timing every version

Each distinct version runs on MLX, all versions **interleaved** round by round on one device (a busy
machine slows them alike); versions a pass did not change are not re-timed. `vs oracle` compares MLX with
the float64 NumPy oracle; `vs unfused` compares each version with the unfused graph on the **same** MLX
device — what the rewrites changed.
"""),
    code('''
print(teach.check_memory(trace.input, "minilm", "time"))  # the check `rlxviz time` makes; time_versions repeats it
rows = teach.time_versions(trace, feeds, model.weights, warmup=1, repeat=21, device="cpu", fresh=True,
                           source="minilm")
print("timed on:", rows[0].context)
print(teach.format_timings(rows))
print("versions timed:", sum(r.same_as is None for r in rows), "| all match the reference:",
      all(r.ok for r in rows if r.same_as is None))
worst = max((r for r in rows if r.same_as is None), key=lambda r: r.err_unfused)
print("largest error vs input on MLX:", f"{worst.err_unfused:.2e} ({worst.label}; each element is judged by "
      f"|fused - input| <= atol + rtol * |input|, {worst.policy.same_backend})")''', "timing"),
    code('''
from IPython.display import Markdown

base, last = rows[0], [r for r in rows if r.same_as is None][-1]
pairs = session.compare_versions(rows)  # each timed version against the previous timed one, paired rounds
for prev, r, v in pairs:
    print(f"verdict {r.label}: {v.words} (vs #{prev.index}; ratio {v.ratio:.3f}, 95% CI {v.low:.3f}..{v.high:.3f})")
overall = session.paired_verdict(base, last)
busy = session.busy_warning(*(r for r in rows if r.same_as is None))
noise = [r.label for _, r, v in pairs if v.words == "within noise"]
display(Markdown(
    f"Measured on **{base.context.device}**, {len(base.samples_ms)} paired rounds. "
    + (f"**{busy}**: the verdicts of this run are printed, not to be read. " if busy else "")
    + f"The final version ({last.nodes} ops) vs the input ({base.nodes} ops): median {last.median_ms:.2f} vs "
    f"{base.median_ms:.2f} ms, **{overall.words}** (per-round ratio {overall.ratio:.3f}, 95% CI "
    f"{overall.low:.3f}..{overall.high:.3f}). {len(noise)} of {len(pairs)} steps are within noise of the version "
    "before them. "
    + "On the CPU `FusedTransformerLayer` runs op by op (see above), so the layer pass changes the drawing, not "
    f"the kernels; the traffic model of MLX's own CPU lowering (without rlxviz's kernels) credits its executed "
    f"saving on the CPU with {ftl.total} B."))''', "read-aloud"),
    md("""
### The same versions on a GPU, where MLX has one

Where MLX has a GPU (Metal on Apple silicon, CUDA on Linux with `mlx-cuda`), the next cell times every
version there too, with the same paired rounds; on a machine without one it says so and times nothing.
On the GPU the lowering differs (`FusedTransformerLayer` is one `mx.compile`d function per layer; MLX's
own kernels, not rlxviz's CPU ones), and a version's time is often set by how many kernels it launches
(*overhead-bound*, section "Recorded" of notebook 01).
"""),
    code('''
from rlxviz.runtime.devices import available_devices

here = available_devices()
print("MLX devices here:", ", ".join(f"{d.name} = {d.label}" for d in here))
if any(d.name == "gpu" for d in here):
    gpu_rows = teach.time_versions(trace, feeds, model.weights, warmup=2, repeat=21, device="gpu", fresh=True,
                                   source="minilm")
    print(teach.format_timings(gpu_rows))
    for prev, r, v in session.compare_versions(gpu_rows):
        print(f"gpu verdict {r.label}: {v.words} (vs #{prev.index}; 95% CI {v.low:.3f}..{v.high:.3f})")
else:
    print("no GPU for MLX on this machine: nothing timed here (Apple silicon, or Linux with mlx-cuda, has one)")''',
         "gpu-timing"),
    md("""
### Fusion that does not pay: compiling a whole layer on the CPU

On the GPU the lowering traces each `FusedTransformerLayer` into one `mx.compile`d function. On the CPU
it does not, because there it did not pay (`docs/performance.md` sections 2 and 3). Why, from MLX's CPU
backend (its source and its kernel cache, read for issue 12): `mx.compile` on the CPU writes C++ loops
for the elementwise chains and builds them without `-march` (baseline x86-64), splits a chain at a depth
and array limit and at every op that is not elementwise, and runs each compiled kernel on **one thread**
of one stream, while the op-by-op lowering splits GELU and the softmax by rows over one CPU stream per
core. The matmuls, most of a layer's time, are the same BLAS calls either way, so compiling can only
change the elementwise part, and it serializes it.

The next cell measures it here, on the final MiniLM version at batch 4, seq 32 (small enough for a class,
with a batch the op-by-op lowering can split over streams): MLX's lowering op by op, each layer compiled,
the whole graph compiled, and the default (rlxviz's CPU kernels), timed **together** in paired rounds
(`session.time_lowerings`; the same statistics as the timing table: `session.paired_verdict`, each
lowering against MLX's op-by-op one). It also prints, as recorded data, the figures measured at MiniLM's
full shape (batch 8, seq 128), where a run takes about a minute (`benchmarks/bench_compile_layers.py`).
"""),
    code('''
from rlxviz.session import Lowering

RECORDED_COMPILE = {  # docs/performance.md section 3 (idle 2-core EPYC, 2026-11-30), batch 8, seq 128, ms
    "whole FusedTransformerLayer compiled vs op by op": (272, 230), "whole graph compiled vs not": (265, 221)}
RECORDED_PAIRED = (  # benchmarks/bench_compile_layers.py, 2-core EPYC, 2026-12-02 04:43 UTC, load 4.1-4.4, b8 s128
    "21 paired rounds: each layer compiled 1.25x slower (95% CI of the ratio 0.754..0.882), whole graph "
    "1.19x slower (0.787..0.858) than MLX's op-by-op lowering")
CM_BATCH, CM_SEQ = 4, 32  # a class-sized shape
cm = load_model("minilm", batch=CM_BATCH, seq=CM_SEQ)
cm_final = Pipeline.canonical().run(cm.graph).final
plain = LoweringOptions(kernels=False)
lowerings = [Lowering("MLX's lowering, op by op", plain),
             Lowering("MLX's lowering, each layer mx.compile'd", LoweringOptions(kernels=False, compile_layers=True)),
             Lowering("MLX's lowering, whole graph mx.compile'd", plain, compile_graph=True),
             Lowering("rlxviz's CPU kernels (the default)")]
low_rows, low_progs = session.time_lowerings(cm_final, cm.random_feeds(0), cm.weights, lowerings, warmup=1,
                                             repeat=21, device="cpu")
w = max(len(lw.label) for lw in lowerings)
print(f"{'lowering':<{w}}  {'median ms':>9}  {'min ms':>7}  {'kernels':>7}  {'compiled':>8}  {'max diff':>8}")
for r, p in zip(low_rows, low_progs, strict=True):
    print(f"{r.label:<{w}}  {r.median_ms:>9.2f}  {r.min_ms:>7.2f}  {p.kernels:>7}  {p.compiled:>8}  "
          f"{r.err_unfused:>8.1e}")
low_verdicts = [session.paired_verdict(low_rows[0], r) for r in low_rows[1:]]  # each against op by op
for r, v in zip(low_rows[1:], low_verdicts, strict=True):
    print(f"lowering verdict {r.label}: {v.words} (vs {low_rows[0].label}; ratio {v.ratio:.3f}, 95% CI "
          f"{v.low:.3f}..{v.high:.3f})")
for what, (compiled_ms, plain_ms) in RECORDED_COMPILE.items():
    print(f"RECORDED, not measured here: {what}: {compiled_ms} vs {plain_ms} ms "
          f"({compiled_ms / plain_ms:.2f}x slower)")
print("RECORDED, not measured here (2026-12-02, batch 8, seq 128):", RECORDED_PAIRED)''',
         "compile-layer"),
    code('''
v_layer, v_graph, v_kernels = low_verdicts
busy_low = session.busy_warning(*low_rows)
display(Markdown(
    f"Read aloud, {v_layer.rounds} paired rounds on **{low_rows[0].context.device}** at batch {CM_BATCH}, seq "
    f"{CM_SEQ}: "
    "compiling each layer is "
    f"**{v_layer.words}** against MLX's op-by-op lowering (ratio {v_layer.ratio:.3f}, 95% CI {v_layer.low:.3f}.."
    f"{v_layer.high:.3f}) and compiling the whole graph **{v_graph.words}** (ratio {v_graph.ratio:.3f}, 95% CI "
    f"{v_graph.low:.3f}..{v_graph.high:.3f}); MLX runs {low_progs[1].compiled} and {low_progs[2].compiled} compiled "
    f"kernels in those programs (against {low_progs[0].compiled} op by op). rlxviz's own CPU kernels, which fuse "
    f"in C++ vectorized for this CPU and threaded, are **{v_kernels.words}** against the same baseline. "
    + (f"**{busy_low}**: do not read these verdicts, and draw no conclusion from them; run the cell again. "
       if busy_low else
       "Here compiling did not make the model faster: the fusion `mx.compile` adds does not pay on this CPU. "
       if not any(v.words.endswith("faster") for v in (v_layer, v_graph)) else
       f"Here compiling measured faster at this shape ({CM_BATCH * CM_SEQ} tokens, where the elementwise work is "
       "small and fewer dispatches can win); the recorded figures below are at the full shape. ")
    + "Recorded at batch 8, seq 128 (not measured here): "
    + "; ".join(f"{k} {a} vs {b} ms (idle, 2026-11-30)" for k, (a, b) in RECORDED_COMPILE.items())
    + f"; and on 2026-12-02, {RECORDED_PAIRED}. That is why `compile_layers` is off on the CPU and on on the "
      "GPU: a fusion pays only where the backend runs the fused code better than the pieces."))''',
         "compile-layer-read-aloud"),
    md("""
### Numerics of the fused versions

A fusion is valid when it computes the same function; it need not give the same **bits**. Three sources,
each measured by the next cell on this model and this machine (nothing below is typed in):

* **reassociation**: `fuse_sdpa` folds the scores' scale `1/sqrt(d)` into one multiply where the model
  divided (`docs/passes.md`: valid up to rounding). The float32 NumPy reference executor shows it alone:
  every other pass computes the same ops in the same order there;
* **fast-math transcendentals**: the CPU lowering computes `erf`/`exp`/`tanh` with rational and polynomial
  formulas (`rlxviz/runtime/fast.py`, also inside rlxviz's CPU kernels), not libm's;
* **`mx.addmm`**: the bias enters the GEMM's accumulation, so it can round differently from a matmul
  followed by an add; measured below in float32 and in bfloat16 (`session.addmm_rounding`).
"""),
    code('''
import numpy as np

mlx_err = [r.err_unfused if r.same_as is None else rows[r.same_as].err_unfused for r in rows]
ref = [teach.run_reference(g, feeds, model.weights, np.float32)[0] for _, g in versions]
print(f"{'#':>2}  {'version':<32} {'f32 reference vs input':>22} {'MLX cpu vs input':>17}")
for (label, _), out, row, e in zip(versions, ref, rows, mlx_err, strict=True):
    print(f"{row.index:>2}  {label:<32} {float(np.abs(out - ref[0]).max()):>22.1e} {e:>17.1e}")
moves = [i for i in range(1, len(ref)) if np.abs(ref[i] - ref[i - 1]).max() > 0]
first = versions[moves[0]][0] if moves else "none"
print("first version whose f32 reference output changes:", first, "| versions that change it:", len(moves))
err_fast = session.fast_erf_error(-6, 6)  # runtime.fast.erf vs scipy's float64 erf on a float32 grid
print(f"fast erf vs exact on [-6, 6]: largest difference {err_fast:.1e}")
addmm_err = {}
for name in ("float32", "bfloat16"):  # x [16, 384] @ w [384, 384] + bias, standard normal
    a = session.addmm_rounding(16, 384, 384, name)
    addmm_err[name] = (a.max_diff, a.ulps)
    print(f"addmm vs matmul + add, {name}: largest difference {a.max_diff:.1e} "
          f"({a.ulps:.0f} ulp at the largest output)")''', "numerics"),
    code('''
ref_max = max(float(np.abs(o - ref[0]).max()) for o in ref)
lines = [f"Read aloud: on the float32 reference {len(moves)} version(s) change the output, the first **{first}** "
         f"(by {ref_max:.1e} at most)"
         + ("; that is `fuse_sdpa`'s reassociation of the scale, and no other pass changes a bit there. "
            if [versions[i][0] for i in moves] == ["after fuse_sdpa"] else ". ")
         + f"On MLX the versions also differ by the lowering (largest {max(mlx_err):.1e}): fast-math "
         f"transcendentals (the fast erf is within {err_fast:.1e} of the exact one), rlxviz's kernels, `mx.addmm` "
         f"({addmm_err['float32'][0]:.1e}, {addmm_err['float32'][1]:.0f} ulp, in float32; "
         f"{addmm_err['bfloat16'][0]:.1e}, {addmm_err['bfloat16'][1]:.0f} ulp, in bfloat16). The tolerance table "
         "(`session.tolerance`) says how far a version may differ before the timing table says no."]
display(Markdown(" ".join(lines)))''', "numerics-read-aloud"),
    md("""
## 6. Order matters

`fuse_transformer_layer` does not look for primitives: it matches the **outputs of other passes**
(`FusedAttentionBlock`, `FusedResidualLN`, `FusedMatMulBiasAct`), anchored on attention ops.

Run it truly first and it says nothing at all: a Hugging Face graph has no `attention` op before
`fuse_sdpa` packs one, so there is no anchor — no match and no rejection. A silent pass is the
hardest kind to debug.
"""),
    code('''
rest = [p for p in CANONICAL_ORDER if p != "fuse_transformer_layer"]
silent = Pipeline(["fuse_transformer_layer", *rest], name="layer-pass-first").run(model.graph)
s0 = silent.steps[0]
print(f"{s0.pass_name} first: {len(s0.matches)} matches, {len(s0.rejections)} rejections; "
      f"fused layers at the end: {silent.final.op_counts().get('FusedTransformerLayer', 0)}")''', "order-silent"),
    md("""
Now run it right after `fuse_sdpa`: it finds the six packed `attention` ops and rejects every one at
the structure step `attn_is_fused_block`, with the hint to run `fuse_attention_block` first.
"""),
    code('''
rest = [p for p in CANONICAL_ORDER if p not in ("fuse_sdpa", "fuse_transformer_layer")]
early = Pipeline(["fuse_sdpa", "fuse_transformer_layer", *rest], name="layer-pass-early").run(model.graph)
first = early.step("fuse_transformer_layer")
print(f"{first.pass_name} after fuse_sdpa: {len(first.matches)} matches, {len(first.rejections)} rejections")
for r in first.rejections:
    print(f"  layer {r.layer}: {r.guard}: {r.message}")
print("fused layers:", early.final.op_counts().get("FusedTransformerLayer", 0))
print(teach.check_fusion(early, "minilm", [0]).render())''', "order"),
    code('''teach.show_step(first, focus=0)'''),
    md("""
The fix is in the pipeline, not the model: run the layer pass **after** its prerequisites (the
canonical order), or run it again at the end. `rlxviz explain minilm --pipeline <passes>` prints
the same report from a shell and exits 1, so CI can fail when a model stops fusing.
"""),
    md("""
## 7. Profitability: why RLX gates attention fusion at 64 tokens

RLX fuses an attention block only when batch*seq <= 64 (`RLX_FUSE_ATTN_THRESHOLD`, docs/rlx.md §2.3.2
and §2.5). The reason (`docs/passes.md`): RLX's fused CPU kernel pays only while one block's working set
stays in cache; above that its separate kernels do as well or better. rlxviz has the same gate as a **guard
of kind *not profitable***,
`attention_size_gate`, reading the pipeline parameter `fab_max_tokens` (the `rlx` profile sets 64; the
canonical profile has no gate). Nothing is wrong with the fusion when it says no — it is legal and
recognized; a cost model decided.

The next cell runs the canonical pipeline with the gate at 64 on MiniLM at 16 tokens and at 2 x 128 =
256 tokens, and computes what the fusion would save: the intermediates an ideal fused attention block
keeps out of memory, and what the traffic model of MLX's own lowering says it saves
(`session.executed_traffic_saved`; what the program really moves is read from MLX in the cell after next).
"""),
    code('''
sizes = {"small": (1, 16), "large": (2, 128)}
for label, (batch, seq) in sizes.items():
    m = load_model("minilm", batch=batch, seq=seq)
    run = Pipeline.canonical(fab_max_tokens=64).run(m.graph)
    fab = run.step("fuse_attention_block")
    ungated = Pipeline.canonical().run(m.graph).step("fuse_attention_block")
    cpu, gpu = (session.executed_traffic_saved(ungated, d) for d in ("cpu", "gpu"))
    heads = [r for r in fab.rejections if r.headline]
    print(f"{label}: batch*seq = {batch * seq}: fuse_attention_block with the gate at 64: {len(fab.matches)} fused, "
          f"{len(heads)} rejected")
    print(f"  ungated, per layer: ideal kernel saves {cpu.ideal.total // 6} B; model of MLX's own lowering saves "
          f"cpu {cpu.total} B, gpu {gpu.total} B (all 6 layers)")
    if heads:
        print(f"  {heads[0].guard} ({heads[0].kind}): {heads[0].message}")
print("FusedAttentionBlock runs as:",
      ", ".join(f"{d}: {session.runs_as('FusedAttentionBlock', d)}" for d in ("cpu", "gpu")))''',
         "gate"),
    md("""
What the numbers say: the ideal saving grows with the tokens (16 times the tokens, 16 times the bytes:
the QKV projection and the attention output are per token), so a fused kernel that keeps them in cache
stops paying at some size; RLX put that size at 64 tokens for its CPU kernel. But MLX runs
`FusedAttentionBlock` as its decomposition on both devices (printed above), and the model of MLX's
own kernels finds nothing it saves at either size: on MLX the gate has no saving to weigh. (On the CPU the
attention inside the block is already rlxviz's `RlxvizAttention` kernel once `fuse_sdpa` packed it, so
the block pass adds no kernel.) The next cell checks this against MLX: it reads the bytes the two
programs move and times them on bert-tiny (2 layers, so the cell takes seconds): the version before
`fuse_attention_block` against the one after, interleaved rounds, at 16 and 256 tokens.
"""),
    code('''
from rlxviz.passes.trace import Trace
from rlxviz.runtime.battery import check_inputs

UPTO_FAB = list(CANONICAL_ORDER[:CANONICAL_ORDER.index("fuse_attention_block") + 1])
verdict_at, read_saving = {}, {}
for label, (batch, seq) in {"small": (1, 16), "large": (4, 64)}.items():
    tiny = load_model("bert-tiny", batch=batch, seq=seq)
    tf = tiny.random_feeds(0)
    fab = Pipeline(UPTO_FAB).run(tiny.graph).step("fuse_attention_block")
    pair = Trace(fab.before, [fab], "attention")  # two versions: before and after fuse_attention_block
    t = teach.time_versions(pair, tf, tiny.weights, warmup=2, repeat=21, device="cpu",
                            inputs=[check_inputs(tf, tiny.graph)], fresh=True)
    verdict_at[label] = session.compare_to_input(t[1], t[0])
    moved = [session.mlx_primitives(g, tf, tiny.weights, "cpu").bytes.total for g in (fab.before, fab.after)]
    read_saving[label] = moved[0] - moved[1]  # bytes per call, read from MLX's two programs
    (q1, q3), (r1, r3) = t[0].quartiles(), t[1].quartiles()
    print(f"{label}: batch*seq = {batch * seq}: unfused {t[0].median_ms:.2f} ms (IQR {q1:.2f}..{q3:.2f}), fused "
          f"{t[1].median_ms:.2f} ms (IQR {r1:.2f}..{r3:.2f}): {verdict_at[label]}; bytes per call saved, read from "
          f"MLX: {read_saving[label]} B; error vs unfused {t[1].err_unfused:.1e}")''',
         "gate-timing"),
    code('''
losing = [k for k, v in verdict_at.items() if v.endswith("slower")]
display(Markdown(
    f"Measured on **{t[0].context.device}** in interleaved rounds: at 16 tokens the fused attention block is "
    f"**{verdict_at['small']}**, at 256 tokens **{verdict_at['large']}**. The programs MLX runs move "
    f"{read_saving['small']} B and {read_saving['large']} B less per call after the fusion (read from MLX): "
    + ("with no bytes saved, a difference can only come from dispatching fewer graph nodes or from noise. "
       if not any(read_saving.values()) else "a difference comes from those bytes, fewer dispatches, or noise. ")
    + ("Nothing here shows the fused block losing above 64 tokens, so a gate at 64 would only hide fusions on "
       "MLX: the canonical profile sets none (`docs/passes.md` records the same on MiniLM). " if "large" not in losing
       else "Here the fused block measured slower at 256 tokens (paired rounds, 95% interval excluding 1); the "
            "executed program is the same kernels, so run the timing cell again (it measures anew) before "
            "trusting it. ")
    + "A gate is a cost model of one kernel on one device: that is why it is a pipeline parameter and its "
      "rejection says *not profitable*, not *illegal*."))''', "gate-read-aloud"),
    md("""
## Exercise: what does horizontal fusion save?

`fuse_shared_input_matmul` merged, in each of the 6 layers, the Q, K and V projections that read the same
hidden state `[1, 16, 384]` float32 into one matmul. The graph gets *more* nodes, not fewer (the op-count
change printed in section 1): the weights and the biases are joined by `concat`s, and `narrow`s split the
merged output back into Q, K and V — the merge saves reads and launches, not nodes. Give `(bytes, launches)`
it saves for the whole
model: bytes of reads of the shared input no longer made, and kernel launches per call no longer made
(the `concat`s run once per set of weights, the `narrow`s are views). The check compares with MLX's own
primitive count of the two versions and tells you what is off. Solution: `notebooks/solutions.py` (`ex02`),
run by the collapsed cell below.
"""),
    code('''
def check_ex02(answer):
    nbytes, launches = teach.expect_ints(answer, ("bytes", "launches"))  # a tuple of two whole numbers
    x = 1 * 16 * 384 * 4
    assert nbytes != 6 * 3 * x, "three reads became one: count the reads saved, not the reads made before"
    assert nbytes % x == 0, f"the shared input is {x} B; the saving is a whole number of reads of it"
    assert nbytes == session.shared_input_saved(trace.step("fuse_shared_input_matmul"))[0], (
        "how many reads of the hidden state does one merged layer save? then all 6 layers")
    assert launches != 6 * 2, ("three matmuls become one in each layer, and so do their three bias adds: count "
                               "both kinds of launch")
    assert launches == launches_saved, (f"MLX runs {launches_saved} fewer non-view primitives per call after the "
                                        "merge: how many matmul and bias-add launches does one layer save?")
    return "right: no intermediate disappears, the input is read once"


ex02_answer = (None, None)  # YOUR ANSWER: (bytes, launches)
teach.feedback(check_ex02, ex02_answer);''', "exercise"),
    code('''
import solutions

teach.feedback(check_ex02, solutions.ex02());''', "solution", hidden=True),
]

# ------------------------------------------------------------------------------------------------- 03

NB03 = [
    md("""
# 03 — Why did my layer not fuse?

Each **teaching variant** changes one thing in layer 0 of a 2-layer BERT (bert-tiny), so layer 1 is
a fused sibling to compare with — except `over_threshold`, a pipeline gate on the token count that
applies to every layer (layer 1 does not fuse either: the table below says so). For each you will see the
rejecting guard with actual vs required
values, the drawing of the rejection, and **what kind of "no"** it is — the kind decides where the fix
belongs:

* *illegal*: fusing would change what the program computes or returns (an extra reader, a graph output
  of a single-output op). Fix the model, or give the compiler an op that keeps the value.
* *not recognized*: a pattern limit — the computation could be fused, but no rule takes this form
  (operand order, an activation off the allow-list). The fix is in the compiler, not the model.
* *not profitable*: a gate or cost test said no. Nothing is wrong; change the gate if a measurement
  says the fusion pays (notebook 02 measures the 64-token gate).

An exercise closes the notebook; notebook 04 writes the compiler fixes.
"""),
    code(SETUP, "setup"),
    code('''
for name, what in teach.TEACHING_CASES.items():
    print(f"{name:<20} {what}")'''),
    code('''
from rlxviz.passes import Pipeline


def analyze(case):
    """(model, trace, layer-0 status) for one teaching case."""
    if case == teach.OVER_THRESHOLD:  # a pipeline parameter, not a model change: RLX's gate of 64 tokens
        model = teach.load("bert-tiny", seq=128, variant=case)
        trace = Pipeline.rlx().run(model.graph)
    else:
        model = teach.load("bert-tiny", seq=8, variant=case)
        trace = Pipeline.canonical().run(model.graph)
    return model, trace, teach.layer_status(trace, 0)


results = {case: analyze(case) for case in teach.TEACHING_CASES}
for case, (_, trace, st) in results.items():
    sibling = teach.layer_status(trace, 1)
    guard, kind = (st.first.guard, st.first.kind) if st.first else ("-", "-")
    print(f"{case:<20} layer 0 fused={st.fused!s:<5} guard={guard:<22} kind={kind:<15} "
          f"layer 1 fused={sibling.fused}")''',
         "all-cases"),
    md("""
## Explore one case

The report names the **first** rejecting guard in pipeline order, its message (actual vs required),
the fix, and the difference from layer 1 where the same rule fused. The drawing is the graph the
rejecting pass saw, focused on layer 0, with the rejection marked (offending nodes and edges).
"""),
    code('''
from rlxviz.viz import Overlay


def explore(case="extra_h1_user"):
    _, trace, st = results[case]
    print(st.render())
    if st.first is None:  # nothing rejected in layer 0 (swapped_residual: add is commutative)
        return
    step = trace.step(st.first.pass_name)
    display(teach.show(step.before, Overlay.before(step), focus=0, max_height=480))


controls = widgets.interact(explore, case=widgets.Dropdown(options=list(teach.TEACHING_CASES),
                                                          value="extra_h1_user"))'''),
    code('''explore("tanh_gelu")''', "one-case"),
    md("""
## How to fix it: the kind of "no" decides where

The product's own output for every case: the kind of the first rejection, the fix it suggests for the
model (`fix`) and the fix in the compiler (`compiler fix`), when there is one.
"""),
    code('''
for case, (_, trace, st) in results.items():
    if st.first is None:
        how = trace.step("fuse_transformer_layer").matches[0].rule
        print(f"{case}: fused ({how}; the residual add is accepted in either order: add is commutative)")
        continue
    print(f"{case}: {st.first.guard} [{st.first.kind}]")
    print(f"    fix:          {st.first.hint or '-'}")
    print(f"    compiler fix: {st.first.fix or '-'}")''', "kinds"),
    md("""
Read per kind:

* **extra_h1_user** — *illegal* for a single-output op: h1 has a third reader (a probe returned as an
  output), and a one-output layer op would no longer produce h1. Dead-code elimination does **not** fix it:
  the probe is a graph output, so it is live. Two fixes: in the model, drop the probe output; in the
  compiler, **multi-output fusion** — a layer op that also returns h1 as a second output, which the probe
  then reads (the engine can express it, `Rule(outputs=...)`, and notebook 06 writes a two-output residual
  norm; no product rule builds a two-output layer op). With the probe output dropped, the probe is dead, and
  a dead reader is **not a user**: no output depends on what it reads. The guard `h1_user_count` still
  counts it (it counts readers, live or not) — a limit of the guard, not a reason; the canonical order
  removes dead code only *after* the layer pass, so run `dead_code_elimination` first as the workaround. The
  cell after the layer rule's steps (below) runs all three.
* **tanh_gelu** — *not recognized*: the FFN is fused without its activation, because `gelu_tanh` is not
  on the epilogue allow-list. Switching the model to exact GELU would fuse, but it changes the model:
  the cell after that measures by how much. (SiLU is on the allow-list too, but it is another activation,
  not a form of GELU: the product's hint names exact GELU only.) The compiler fix is the allow-list
  (notebook 04 writes the epilogue rule).
* **swapped_residual** — fuses: the layer rule accepts either operand order. RLX's strict rule rejects
  it (*not recognized*); notebook 04 rebuilds that rule and fixes it with a canonicalization pass.
* **pre_ln** — **two** blockers, so it is not expected to become `FusedTransformerLayer`. First (*illegal*
  for a single-output op, the guard printed above): the residual sum feeds the norm and the next residual,
  and a one-output `FusedResidualLN` would hide it; a two-output op (as vLLM's `fused_add_rms_norm`) fixes
  that one — notebook 06 writes that rule. Second: the layer rule matches a **post-LN** layer only (its step
  `post_ln_order`, printed below with the rejection it made on pre_ln's layer 0); a pre-LN layer (norm ->
  sublayer -> add) is another op, which no rule here builds. (The status line of `pre_ln` in the explorer
  above says *expected FusedTransformerLayer* only because its sibling layer 1 is post-LN and fuses.)
* **output_intermediate** — *illegal* for a single-output op: h1 is returned, and a one-output layer op
  would hide it. Fix the model (the exercise below); in the compiler, a layer op with h1 as a second
  output would do (no rule builds one).
* **over_threshold** — *not profitable*: RLX's 64-token attention gate. A pipeline parameter; notebook
  02 measures whether the gate pays on MLX.

None of these is *illegal* in the strong sense — a rewrite that would change the numbers whatever the
compiler did. The section *The truly illegal case* below shows one that is.
"""),
    code('''
from rlxviz.passes.rules.layer import LAYER

print("layer rule steps:", ", ".join(LAYER.guard_kinds))
print("post_ln_order kind:", LAYER.guard_kinds["post_ln_order"])
_, pre_trace, _ = results["pre_ln"]
second = [r for r in pre_trace.step("fuse_transformer_layer").rejections
          if r.headline and r.path.startswith("encoder.layer.0")]
for r in second:
    print(f"pre_ln layer 0, fuse_transformer_layer: {r.guard} ({r.kind}): {r.message}")''', "pre-ln-second"),
    code('''
from rlxviz.passes import CANONICAL_ORDER

model, _, _ = results["extra_h1_user"]
dce_only = Pipeline(["dead_code_elimination", *CANONICAL_ORDER]).run(model.graph)
fixed_graph = model.graph.with_outputs(model.graph.outputs[:1])  # the model fix: drop the probe output
before_dce = Pipeline.canonical().run(fixed_graph)
with_dce_first = Pipeline(["dead_code_elimination", *CANONICAL_ORDER]).run(fixed_graph)
print("dead_code_elimination first, probe still returned:", teach.layer_status(dce_only, 0).first.guard)
print("probe output dropped, canonical order:", teach.layer_status(before_dce, 0).first.guard)
print("... and dead_code_elimination first: fused layers =",
      with_dce_first.final.op_counts().get("FusedTransformerLayer", 0))''', "fix-model"),
    code('''
import numpy as np

from rlxviz.ir import Op
from rlxviz.runtime.reference import IMPLS, run_reference

x = np.linspace(-8, 8, 160001, dtype=np.float32)
gap = np.abs(IMPLS[Op.GELU]({}, x).astype(np.float64) - IMPLS[Op.GELU_TANH]({}, x))
print(f"exact vs tanh GELU on [-8, 8]: largest difference {gap.max():.2e} at x = {x[gap.argmax()]:.3f}")
tanh_model, exact = teach.load("bert-tiny", seq=8, variant="tanh_gelu"), teach.load("bert-tiny", seq=8)
feeds = tanh_model.random_feeds(0)
outs = [run_reference(m.graph, feeds, tanh_model.weights) for m in (tanh_model, exact)]  # same weights
print(f"model outputs, tanh GELU vs exact GELU in layer 0: largest difference "
      f"{max(float(np.abs(a - b).max()) for a, b in zip(*outs)):.2e}")''', "tanh-cost"),
    md("""
### The truly illegal case: eps outside the square root

A hand-written norm `(x - mean) / (sqrt(var) + eps)` looks like LayerNorm, but LayerNorm computes
`(x - mean) / sqrt(var + eps)`. Rewriting one into the other changes the numbers — most where the
variance is small — so no compiler may do it, whatever kernel it has: `canonicalize_norm` refuses it
(`eps_inside_sqrt`, kind *illegal*). The cell builds both forms and measures the difference.
"""),
    code('''
import numpy as np

from rlxviz.ir import Builder
from rlxviz.passes import run_passes
from rlxviz.teach import run_reference  # the run memory check rlxviz run makes, then the reference


def hand_norm(eps_inside_sqrt):
    b = Builder("hand_norm")
    x = b.input("x", (2, 8, 16))
    d = b.sub(x, b.reduce_mean(x, [-1], keepdims=True))
    var = b.reduce_mean(b.mul(d, d), [-1], keepdims=True)
    den = b.sqrt(b.add(var, 1e-5)) if eps_inside_sqrt else b.add(b.sqrt(var), 1e-5)
    b.output(b.add(b.mul(b.div(d, den), b.param("g", (16,))), b.param("bt", (16,))))
    return b.build()


for inside in (True, False):
    step = run_passes(hand_norm(inside), ["canonicalize_norm"]).steps[0]
    said = "; ".join(f"{r.guard} ({r.kind}): {r.message}" for r in step.rejections) or "-"
    print(f"eps {'inside' if inside else 'outside'} the sqrt: {len(step.matches)} match(es); rejection: {said}")
xs = {"x": (1e-3 * np.random.default_rng(0).standard_normal((2, 8, 16))).astype(np.float32)}  # small variance
wn = {"g": np.ones(16, np.float32), "bt": np.zeros(16, np.float32)}
a, b_ = (run_reference(hand_norm(v), xs, wn)[0] for v in (True, False))
print(f"inside vs outside, x of std 1e-3: largest difference {float(np.abs(a - b_).max()):.3f}")''', "eps-outside"),
    code('''
model, _, _ = results[teach.OVER_THRESHOLD]
ungated = Pipeline.rlx(fab_max_tokens=None).run(model.graph)
print("rlx profile with the gate unset: fused layers =", ungated.final.op_counts().get("FusedTransformerLayer", 0))''',
         "fix-pipeline"),
    md("""
## Exercise

In `output_intermediate`, h1 (layer 0's post-attention LayerNorm) is also returned as a graph output:
fusing the layer would hide a tensor the caller asked for, so `h1_not_output` says the fusion is
*illegal*. Without changing the pipeline, make layer 0 fuse **by editing the IR text**: return only
the model's first output (the return line, `return %a, %b`, is the one just before the closing `}`), parse
the text back with
`parse_ir`, and run the canonical pipeline. Fill in `fix_ir` below.
"""),
    code('''
from rlxviz.ir import format_graph, parse_ir

model, _, _ = results["output_intermediate"]
ir_text = format_graph(model.graph)


def check_ex03(fix):
    assert callable(fix), f"pass the function itself: teach.feedback(check_ex03, fix_ir), not a {type(fix).__name__}"
    text = fix(ir_text)
    assert text is not None, "fix_ir returned None: end it with `return` and the edited text"
    assert isinstance(text, str), f"fix_ir must return the IR text (a str); it returned a {type(text).__name__}"
    assert text != ir_text, "fix_ir returned the text unchanged: h1 is still a graph output"
    try:
        g = parse_ir(text)
    except Exception as e:  # an IRSyntaxError names the line and column
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise AssertionError(f"parse_ir cannot read your text: {first}; change only the return line") from None
    assert len(g.outputs) == 1, f"the graph returns {len(g.outputs)} values: return only the model's first output"
    assert g.outputs[0] == model.graph.outputs[0], "keep the model's output (the first one), drop the probe of h1"
    st = teach.layer_status(Pipeline.canonical().run(g), 0)
    assert st.fused, f"layer 0 still does not fuse: guard {st.first.guard if st.first else '?'}"
    return "layer 0 fuses: h1 is an ordinary intermediate again"


def fix_ir(text):
    # YOUR CODE: return the text with only the first graph output returned
    return text


teach.feedback(check_ex03, fix_ir);''', "exercise"),
    md("""
### Solution

In `notebooks/solutions.py` (`ex03`); the collapsed cell below runs it through the same check.
"""),
    code('''
import solutions

teach.feedback(check_ex03, solutions.ex03);''', "solution", hidden=True),
]

# ------------------------------------------------------------------------------------------------- 04

NB04 = [
    md("""
# 04 — Write your own pattern and guard

Notebooks 01-03 read what the product's passes did. Here you write two passes yourself with the same
API the product's rules use (`rlxviz/passes/pattern.py`, `rule.py`, `guard.py`):

* a `P` **pattern** (an op, its operand patterns, named captures),
* a `Rule`: the anchor pattern, ordered **steps** (guards, each declaring its kind of "no"), and a
  rewrite (`build` returns the new node's op, operands and attributes),
* `rule_pass(name, [rule])`: a `Pass` a `Pipeline` runs like any product pass; the pipeline runs the
  verifier (`lint`) after every pass.

Exercise A: a **canonicalization** pass (commutative adds in one order), so a layer that a strict
pattern does not recognize fuses. Exercise B: a new **epilogue fusion** behind an *illegal* guard and a
*not profitable* size gate. Each ends in a checked cell that tells you what is wrong; the checks run
your pass on a real graph, compare its outputs with the unfused graph on the NumPy reference executor,
and run the verifier. Solutions: `notebooks/solutions.py` (`ex04a`, `ex04b`), run by collapsed cells.
"""),
    code(SETUP, "setup"),
    md("""
## 1. A product rule, read as a table

`fuse_matmul_bias_act.bias_act` (`rlxviz/passes/rules/linear.py`): its anchor, and every step with the
kind of "no" it says. The engine appends `absorbed_escape` to every rule: nothing outside a match may
read a value the match absorbs.
"""),
    code('''
from rlxviz.passes.guard import KINDS
from rlxviz.passes.rules.linear import BIAS_ACT

print(BIAS_ACT.name, "defined at", "rlxviz/" + BIAS_ACT.source.split("rlxviz/")[-1])
print("anchor:", BIAS_ACT.anchor.describe(), "| captures:", ", ".join(BIAS_ACT.anchor.roles()))
for name, kind in BIAS_ACT.guard_kinds.items():
    print(f"  step {name:<22} kind: {kind}")
print()
for kind, meaning in KINDS.items():
    print(f"{kind}: {meaning}")''', "anatomy"),
    md("""
## 2. Exercise A: canonicalize commutative adds

RLX's layer fusion expects each residual written **branch first**, `add(branch, skip)`, and silently
skips `add(skip, branch)` (docs/rlx.md §5.1). The product's `fuse_transformer_layer` accepts either
order (its operand-order guards are commutative). To see the problem, the next cell builds RLX's
**strict** rule from the product's: the same steps, with the two operand-order guards replaced by
strict ones. On the `swapped_residual` variant of bert-tiny (layer 0's residual adds written skip
first) it rejects layer 0 — a pattern limit, kind *not recognized*.
"""),
    code('''
from dataclasses import replace

from rlxviz.ir import Op, format_graph, lint
from rlxviz.passes import CANONICAL_ORDER, Pipeline, run_passes
from rlxviz.passes.engine import Pass, rule_pass
from rlxviz.passes.guard import not_output, operands_are, single_user, size_le
from rlxviz.passes.pattern import P
from rlxviz.passes.rule import QUIET, Rule, reports
from rlxviz.passes.rules.layer import LAYER

RLN = ("x", "residual", "gamma", "beta")  # FusedResidualLN's operands
FIX = "canonicalize commutative adds (branch first) before matching"
STRICT_GUARDS = {"ln1_operand_order": operands_are("ln1", {0: "attn", 1: "hidden"}, RLN, "ln1_operand_order", fix=FIX),
                 "ln2_operand_order": operands_are("ln2", {0: "fc2", 1: "ln1"}, RLN, "ln2_operand_order", fix=FIX)}
STRICT = replace(LAYER, name="strict_layer.bert_post_ln",
                 steps=tuple(STRICT_GUARDS.get(getattr(s, "name", ""), s) for s in LAYER.steps))
strict_layer = rule_pass("fuse_transformer_layer", [STRICT], "as the product's, residual operands in RLX's order")
STRICT_ORDER = [strict_layer if p == "fuse_transformer_layer" else p for p in CANONICAL_ORDER]


def fused_layers(trace):
    return trace.final.op_counts().get("FusedTransformerLayer", 0)


swapped = teach.load("bert-tiny", seq=8, variant="swapped_residual")
strict_run = Pipeline(STRICT_ORDER, name="strict").run(swapped.graph)
st = teach.layer_status(strict_run, 0)
print(f"strict pipeline on swapped_residual: fused layers = {fused_layers(strict_run)}")
print(f"layer 0: guard {st.first.guard} ({st.first.kind}): {st.first.message}")
print("compiler fix:", st.first.fix)''', "strict"),
    md("""
### Your task

Write a pass `canonicalize_add` that rewrites `add(a, b)` to `add(b, a)` when `b` was computed
**after** `a` (its node id is larger). Node ids follow a topological order in a graph **as loaded**
(the builder and the importers number nodes as they create them), and a residual's branch is computed
from its skip, so there "later operand first" is "branch first". After a rewrite that is no longer
true: a fused node gets a fresh, larger id than the nodes that read it — so run this pass first,
before any fusion (the checks below do). Leave alone:

* adds whose two operands differ in shape (a bias `[N]` or a mask broadcast over a tensor),
* adds already in order (so a second run rewrites nothing: a canonicalization is idempotent).

**Validity condition** (write it in your rule's `doc`): IEEE-754 addition is commutative, `a + b` and
`b + a` are equal bit for bit and broadcast alike, so the rewrite changes no number — the check
demands outputs equal to the last bit.

Tools: `P(Op.ADD, P.var("a"), P.var("b"), name="add")` captures the operands as roles `a`, `b`; a step
is a function of the match context `c` (`c["a"]` is the node, `c.id("a")` its id) declared with
`@reports(reads=(...))`, returning `QUIET` (not a candidate: nothing to report) or None (go on);
`Rule(name, anchor, steps=..., result="add", absorb=("add",), build=lambda c: (Op.ADD, [ids], {}))`;
`rule_pass(name, [rule])`.
"""),
    code('''
def residual_adds(g):
    """The residual adds: two operands of one shape, feeding a layer_norm; in graph order."""
    return [n for n in g if n.op == Op.ADD and g[n.inputs[0]].shape == g[n.inputs[1]].shape
            and any(u.op == Op.LAYER_NORM for u in g.users(n.id))]


def max_diff(g, model=swapped):
    """Largest |difference| between the outputs of `g` and of the unfused `model.graph` on the NumPy reference
    executor (`rlxviz.runtime.reference`, float32), same inputs and weights."""
    from rlxviz.teach import run_reference

    f = model.random_feeds(0)
    want, got = run_reference(model.graph, f, model.weights), run_reference(g, f, model.weights)
    return max(float(abs(a - b).max()) for a, b in zip(got, want, strict=True))


def check_ex04a(my_pass):
    assert my_pass is not None, "build your pass: my_canonicalize = rule_pass('canonicalize_add', [your_rule])"
    assert isinstance(my_pass, Pass), f"rule_pass(...) returns a Pass; you gave a {type(my_pass).__name__}"
    step = run_passes(swapped.graph, [my_pass]).steps[0]
    assert not step.error, f"your pass failed (or the verifier rejected its graph): {step.error}"
    g = lint(step.after)  # the verifier, once more, on your graph
    n = len(step.matches)
    assert n, "your pass rewrote nothing: layer 0 of swapped_residual has two adds written add(skip, branch)"
    assert n == 2, (f"your pass rewrote {n} adds; only the 2 residual adds of layer 0 are out of order: leave "
                    "adds with operands of different shapes (bias, mask) and adds already in order alone")
    for add in residual_adds(g):
        a, b = add.inputs
        assert a > b, (f"residual add %{add.id} @{add.path} reads (%{a}, %{b}): the operand computed later "
                       "(the larger id) must come first")
    again = run_passes(g, [my_pass]).steps[0]
    assert not again.matches, (f"on its own output your pass rewrote {len(again.matches)} adds again: a "
                               "canonicalization must leave adds already in order alone (idempotent)")
    d = max_diff(g)
    assert d == 0.0, f"outputs changed by up to {d:.3e}: swapping the operands of an add changes no bit"
    fused = fused_layers(Pipeline([my_pass, *STRICT_ORDER]).run(swapped.graph))
    assert fused == 2, f"with your pass first, the strict pipeline fuses {fused} layers; expected 2"
    return (f"{n} adds rewritten, verifier passed, outputs equal bit for bit, idempotent; the strict pipeline "
            f"fuses {fused} layers")


my_canonicalize = None  # YOUR PASS: rule_pass("canonicalize_add", [a Rule as described above])
teach.feedback(check_ex04a, my_canonicalize);''', "exercise"),
    code('''
import solutions

teach.feedback(check_ex04a, solutions.ex04a());''', "solution", hidden=True),
    md("""
### Your pass and the product, compared

Three pipelines on `swapped_residual`: the strict rule alone; the solution's `canonicalize_add`
first, then the strict rule; and the product's canonical pipeline (commutative guards, no
canonicalization). The last two fuse; they differ in the operand layout of layer 0's post-attention
`FusedResidualLN` (which operand is `x`, which `residual`), and both compute the unfused graph's
numbers.
"""),
    code('''
canonicalize_add = solutions.ex04a()  # or your my_canonicalize, once its check says correct
runs = {"strict rule": strict_run,
        "canonicalize_add + strict rule": Pipeline([canonicalize_add, *STRICT_ORDER]).run(swapped.graph),
        "product (commutative guards)": Pipeline.canonical().run(swapped.graph)}
for label, run in runs.items():
    rln = run.step("fuse_residual_ln")
    m = next(m for m in rln.matches if m.path.startswith("encoder.layer.0.attention"))
    x, res = (rln.before[m.bindings[r]] for r in ("x", "residual"))
    print(f"{label:<31} fused layers = {fused_layers(run)}; layer 0 ln1: x={x.op.value}, residual={res.op.value}; "
          f"max |diff| vs unfused = {max_diff(run.final):.1e}")''', "compare-canon"),
    md("""
Both fixes are compiler fixes for a *not recognized* rejection: the model was fine. The product's
choice (a commutative guard) keeps the model's layout; a canonicalization pass fixes the layout once
for every later rule — the usual choice in compilers with many patterns (LLVM's InstCombine, for one,
moves the constant operand of a commutative op to the right, so its patterns look in one place only).

## 3. Exercise B: a new epilogue, behind guards

In the `tanh_gelu` variant, layer 0's FFN uses tanh-approximated GELU. `fuse_matmul_bias_act` fuses the
linear but not the activation — `gelu_tanh` is not on the epilogue allow-list (`gelu`, `silu`). The
product says so, with its kind and the compiler-side fix:
"""),
    code('''
tanh = teach.load("bert-tiny", seq=8, variant="tanh_gelu")
UPTO = list(CANONICAL_ORDER[:CANONICAL_ORDER.index("fuse_matmul_bias_act") + 1])
fmba_step = Pipeline(UPTO).run(tanh.graph).step("fuse_matmul_bias_act")
soft = next(r for r in fmba_step.rejections if r.guard == "epilogue_activation")
print(f"{soft.guard} ({soft.kind}): {soft.message}")
print("compiler fix:", soft.fix)''', "tanh-before"),
    md("""
### Your task

Write a pass `fuse_gelu_tanh_epilogue` whose rule anchors on `gelu_tanh` reading a
`FusedMatMulBiasAct(activation=None)` (roles `x`, `w`, `bias`, `fc`; the activation `act`) and rewrites
both into one `FusedMatMulBiasAct(activation="gelu_tanh")` with operands `x, w, bias` (`absorb=("fc",
"act")`, `result="act"`). Its steps:

1. **illegal**: the pre-activation value `fc` has exactly one user and is not a graph output — the
   fused node no longer produces it (`single_user`, `not_output` from `rlxviz.passes.guard`);
2. **not profitable**: a size gate on the pipeline parameter `epilogue_max_rows` (None: no gate), the
   rows being every dim of `fc` but the last — `size_le(param, measure, what, name, role)` where
   `measure(c)` returns `(rows, "1*8")`.

**Validity condition**: `FusedMatMulBiasAct(activation="gelu_tanh")` computes `gelu_tanh(x @ w + bias)`
(`rlxviz/ir/fused.py`, the one definition the reference executor and the MLX lowering use), the same
ops in the same order, so on the NumPy reference executor the numbers equal the unfused graph's (the
check demands it). On MLX they need not: MLX's own lowering runs the fused op's `x @ w + bias` as one
`mx.addmm`, which adds the bias inside the GEMM's accumulation and rounds differently from a matmul
followed by an add (notebooks 01 and 02 measure by how much, in float32 and bfloat16:
`session.addmm_rounding`), and computes the tanh with a fast-math formula; with rlxviz's CPU kernels the
fused op is a matmul and one bias + activation kernel (notebook 02 reads both lists from MLX).
"""),
    code('''
def probe_graph():
    """A linear + gelu_tanh whose pre-activation value is also read by a probe (returned as an output)."""
    from rlxviz.ir import Builder

    b = Builder("probe")
    x = b.input("x", (2, 4, 16))
    pre = b.linear(x, b.param("w", (16, 32)), b.param("b", (32,)))
    b.output(b.gelu_tanh(pre), b.reduce_mean(pre, [-1]))
    return b.build()


def check_ex04b(my_pass):
    assert my_pass is not None, "build your pass: my_epilogue = rule_pass('fuse_gelu_tanh_epilogue', [your_rule])"
    assert isinstance(my_pass, Pass), f"rule_pass(...) returns a Pass; you gave a {type(my_pass).__name__}"
    run = Pipeline([*UPTO, my_pass]).run(tanh.graph)
    step = run.steps[-1]
    assert not step.error, f"your pass failed (or the verifier rejected its graph): {step.error}"
    g = lint(step.after)
    assert len(step.matches) == 1, (f"your pass made {len(step.matches)} matches; expected 1 (layer 0's FFN): "
                                    "anchor on gelu_tanh reading FusedMatMulBiasAct(activation=None)")
    new = g[step.matches[0].fused]
    assert new.op == Op.FUSED_MATMUL_BIAS_ACT and new.attrs.get("activation") == "gelu_tanh", (
        f"the rewrite made {new.op.value}({new.attrs}); expected FusedMatMulBiasAct(activation='gelu_tanh')")
    assert g.op_counts().get("gelu_tanh", 0) == 0, "a gelu_tanh node is left: absorb both fc and act"
    fmba = Op.FUSED_MATMUL_BIAS_ACT.value
    n_fmba = [x.op_counts().get(fmba, 0) for x in (step.before, g)]
    n_ops = [len(x.compute_nodes()) for x in (step.before, g)]
    assert n_fmba[1] == n_fmba[0] and n_ops[1] == n_ops[0] - 1, (
        f"the old pre-activation node is still there ({fmba} {n_fmba[0]} -> {n_fmba[1]}, compute nodes "
        f"{n_ops[0]} -> {n_ops[1]}; expected {n_fmba[0]} -> {n_fmba[0]} and {n_ops[0]} -> {n_ops[0] - 1}): "
        "absorb both fc and act (absorb=('fc', 'act')), so the rewrite replaces the two nodes with one")
    d = max_diff(g, tanh)
    assert d <= 1e-6, f"outputs changed by up to {d:.3e}: the fused op must compute gelu_tanh(x @ w + bias)"
    probe = run_passes(probe_graph(), ["fuse_matmul_bias_act", my_pass]).steps[-1]
    assert not probe.matches, ("your pass fused a gelu_tanh whose pre-activation value is also read by a probe: "
                               "the fused node no longer produces that value (illegal)")
    mine = [r for r in probe.rejections if r.kind == "illegal" and r.guard != "absorbed_escape"]
    assert mine, ("only the engine's generic absorbed_escape refused the probe graph: add your own guard that "
                  "names the problem (single_user on fc, kind illegal)")
    try:
        gated = Pipeline([*UPTO, my_pass], {"epilogue_max_rows": 4}).run(tanh.graph).steps[-1]
    except KeyError:  # no guard of your pass reads epilogue_max_rows, so a pipeline refuses it as unknown
        gated = None
    assert gated is not None and not gated.matches, ("with epilogue_max_rows=4 the 8-row FFN still fused: add a "
                                                     "size_le gate on it")
    gate = [r for r in gated.rejections if r.kind == "not profitable"]
    assert gate and "8" in gate[0].message, (f"the gate's rejection should be of kind 'not profitable' and quote "
                                             f"the 8 rows; got {[(r.guard, r.kind) for r in gated.rejections]}")
    return (f"fused into FusedMatMulBiasAct(activation='gelu_tanh'), max |diff| {d:.1e}, verifier passed; "
            f"probe refused by {mine[0].guard} (illegal); gate: {gate[0].guard} (not profitable)")


my_epilogue = None  # YOUR PASS: rule_pass("fuse_gelu_tanh_epilogue", [a Rule as described above])
teach.feedback(check_ex04b, my_epilogue);''', "exercise-b"),
    code('''
teach.feedback(check_ex04b, solutions.ex04b());''', "solution-b", hidden=True),
    md("""
### What the layer rule says next

With the solution's epilogue pass inserted after `fuse_matmul_bias_act`, the FFN's activation is
absorbed — and `fuse_transformer_layer` names the next limit: its own allow-list. The layer op's
decomposition takes any activation; admitting `gelu_tanh` there (and a tanh-GELU kernel where it is
one kernel) is the compiler fix. Switching the model to exact GELU would change its numbers.
"""),
    code('''
epilogue = solutions.ex04b()
order = list(CANONICAL_ORDER)
order.insert(order.index("fuse_matmul_bias_act") + 1, epilogue)
with_epilogue = Pipeline(order).run(tanh.graph)
st = teach.layer_status(with_epilogue, 0)
print(f"epilogue matches: {len(with_epilogue.step('fuse_gelu_tanh_epilogue').matches)}; "
      f"fused layers = {fused_layers(with_epilogue)}")
print(f"layer 0: guard {st.first.guard} ({st.first.kind}): {st.first.message}")
print("compiler fix:", st.first.fix)''', "after-epilogue"),
    md("""
## 4. Try it

Pick a variant and a pipeline; the cell prints layer 0's status (the output under the cell before the
control is a static copy, for exports).
"""),
    code('''
PIPELINES = {"product (canonical)": lambda: Pipeline.canonical(),
             "strict rule": lambda: Pipeline(STRICT_ORDER),
             "canonicalize_add + strict rule": lambda: Pipeline([canonicalize_add, *STRICT_ORDER]),
             "product + gelu_tanh epilogue": lambda: Pipeline(order)}


def try_it(variant="swapped_residual", pipeline="strict rule"):
    model = swapped if variant == "swapped_residual" else tanh
    run = PIPELINES[pipeline]().run(model.graph)
    print(f"{variant} / {pipeline}: fused layers = {fused_layers(run)}")
    print(teach.layer_status(run, 0).render())


try_it()  # static output for exports
controls = widgets.interact(try_it, variant=widgets.Dropdown(options=["swapped_residual", "tanh_gelu"]),
                            pipeline=widgets.Dropdown(options=list(PIPELINES), value="strict rule"))'''),
]

# ------------------------------------------------------------------------------------------------- 05

NB05 = [
    md("""
# 05 — Bring your own model

Notebooks 01-04 used models built by rlxviz. Here the model comes from outside: an **ONNX file**
exported by PyTorch (`torch.onnx`, dynamo) from Hugging Face's GPT-2 — a tiny configuration (2 layers,
hidden size 64, 4 heads) with random weights, `tests/fixtures/onnx/gpt2.onnx`, 0.6 MB. Any ONNX file
of yours goes through the same cells (the `Try it` control at the end runs the project's other
fixtures: BERT, MiniLM, LLaMA, ViT, RoBERTa, Falcon, GPT-NeoX).

In this notebook you will

1. read the file as ONNX sees it (its operators, opset, inputs),
2. import it and **check the import against ONNX Runtime** (`session.fidelity`: version 0 must compute
   what the file computes, or no later check means anything),
3. read its layers as rlxviz classifies them,
4. run the canonical pipeline and read **why the layers did not fuse**,
5. compare with **ONNX Runtime's own optimizer** on the same file,
6. check your reading in an exercise.

Every figure below is printed by the cell that states it.
"""),
    code(SETUP, "setup"),
    md("""
## 1. The file, as ONNX reads it

`onnx.load` gives the graph the exporter wrote: one node per ONNX operator, the weights as
initializers, and the exporter's record (`gpt2.json`, written next to the file when it was made).
"""),
    code('''
import json
from collections import Counter
from pathlib import Path

import onnx

PATH = Path("../tests/fixtures/onnx/gpt2.onnx")
onnx_model = onnx.load(str(PATH))
record = json.loads(PATH.with_suffix(".json").read_text())
made_by, cfg = record["versions"], record["config"]
print(f"{PATH.name}: {PATH.stat().st_size} bytes, producer {onnx_model.producer_name} "
      f"{onnx_model.producer_version}, opset {[o.version for o in onnx_model.opset_import]}")
print("exported with:", ", ".join(f"{k} {v}" for k, v in made_by.items()))
print(f"config: {cfg['model_type']}, {cfg['n_layer']} layers, hidden size {cfg['n_embd']}, {cfg['n_head']} heads, "
      f"activation {cfg['activation_function']}, random weights")
for i in onnx_model.graph.input:
    dims = [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
    print(f"input {i.name}: {onnx.TensorProto.DataType.Name(i.type.tensor_type.elem_type)} {dims}")
print("outputs:", [o.name for o in onnx_model.graph.output], "| initializers:", len(onnx_model.graph.initializer))
onnx_ops = Counter(n.op_type for n in onnx_model.graph.node)
print(f"ONNX nodes: {sum(onnx_ops.values())}")
print("  " + ", ".join(f"{op} {k}" for op, k in onnx_ops.most_common()))''', "onnx-file"),
    md("""
Many of those nodes compute **shapes**, not tensors (`Shape`, `Concat`, `Unsqueeze`, `Range`,
`Expand`, the mask's `Equal`/`And`/`Where`): the exporter keeps `batch` and `seq` symbolic. rlxviz's
importer builds the graph for one shape (batch 1, 16 tokens by default) and folds every node whose
value follows from shapes and weights alone, within a budget (`models/onnx/fold.py`).

## 2. Import, checked against ONNX Runtime

`teach.load` is the importer the CLI (`rlxviz explain gpt2.onnx`) and the app use. It checks the
model against the memory limit first (the `load` workload); then `session.fidelity.against_onnx` runs
**the ONNX file itself** in ONNX Runtime on the same input and compares it with version 0 on rlxviz's
NumPy reference interpreter, with the oracle tolerance of float32.
"""),
    code('''
from rlxviz import session
from rlxviz.session.fidelity import against_onnx

model = teach.load(str(PATH))
graph = model.graph
feeds = model.random_feeds(0)
print(model.description, "|", {k: list(v.shape) for k, v in feeds.items()})
print(teach.check_memory(graph, PATH.name, "load"))
print(teach.check_memory(graph, PATH.name, "run"))
fidelity = against_onnx(model, feeds)
print(fidelity.line())
print(f"ONNX nodes {sum(onnx_ops.values())} -> rlxviz compute nodes {len(graph.compute_nodes())}")
print("rlxviz ops:", dict(sorted(graph.op_counts().items(), key=lambda kv: -kv[1])))''', "import"),
    md("""
The two memory lines are the checks `rlxviz explain` (load) and `rlxviz run` make, from shapes and
dtypes alone, before anything is allocated (`ir.memory.workload_peak`); set `RLXVIZ_MAX_MEMORY_MB`
below the figure (in the notebook: `os.environ["RLXVIZ_MAX_MEMORY_MB"] = ...`) and the cell stops with the
CLI's one-line message before anything is allocated: a `LimitError` naming the workload, or, for a limit
below the size of the file's weights, the importer's refusal of the initializers.

## 3. Its layers, explained

`session.model_layers` finds the layers from the model paths the exporter kept (`h.0...`, `h.1...`);
`session.classify` says which kind of layer each is, with the evidence it read from the graph. The
kind decides what fusion is *expected*: not every layer is a BERT layer.
"""),
    code('''
layers = session.model_layers(graph)
print("layers:", layers)
for layer in layers:
    kind = session.classify(graph, layer)
    ops = Counter(n.op.value for n in graph.compute_nodes() if n.path.startswith(f"h.{layer}."))
    print(f"layer {layer}: {kind.description}")
    for line in kind.evidence:
        print(f"    evidence: {line}")
    print(f"    ops: {dict(ops.most_common())}")
norms = [n for n in graph if n.op.value == "layer_norm"]
print(f"layer norms in the model: {len(norms)} ({', '.join(n.path for n in norms)})")''', "layers"),
    md("""
GPT-2 is **pre-LN**: each sublayer reads `LayerNorm(h)` and adds its result to `h` itself, so every
residual sum `h` has two readers — the next norm *and* the next residual add. BERT (notebook 02) is
post-LN: the norm is the only reader of its sum. The final `ln_f` reads the last sum alone.

## 4. The pipeline, and why the layers did not fuse
"""),
    code('''
from rlxviz.passes import Pipeline

trace = Pipeline.canonical().run(graph)
check = teach.check_fusion(trace, "gpt2")
print(f"fused layers: {sum(s.fused for s in check.layers)} of {len(check.layers)}; final version: "
      f"{len(trace.final.compute_nodes())} compute nodes")
print("final ops:", dict(sorted(trace.final.op_counts().items(), key=lambda kv: -kv[1])))
print()
st = teach.layer_status(trace, 0)
print(st.render())
rln = trace.step("fuse_residual_ln")
refused = [r for r in rln.rejections if r.headline]
rln_guards = sorted({r.guard for r in refused})
n_rln = trace.final.op_counts().get("FusedResidualLN", 0)
n_fmba = trace.final.op_counts().get("FusedMatMulBiasAct", 0)
n_gelu = trace.final.op_counts().get("gelu_tanh", 0)''', "pipeline"),
    md("""
## 5. ONNX Runtime's optimizer on the same file

ONNX Runtime optimizes every model it loads. Its graph optimizer (C++, `ORT_ENABLE_ALL`) fuses what
its CPU kernels have a fused form for, and can write the optimized model back to a file; its
**transformer optimizer** (`onnxruntime.transformers.optimizer`, Python) adds attention fusions on top.
`session.ort_optimizer.ort_optimized` runs the first on the same file, counts the node types the
optimizer added, checks the optimized model's numbers against the unoptimized one, and says whether
the second can run here.
"""),
    code('''
from rlxviz.session.ort_optimizer import ort_optimized

ort_run = ort_optimized(PATH, feeds)
print(f"ONNX Runtime {ort_run.version}, graph optimizer at ORT_ENABLE_ALL: nodes {ort_run.nodes_before} -> "
      f"{ort_run.nodes_after}; optimized vs source model: max err {ort_run.max_err:.1e}")
for op, k in ort_run.fused.items():
    print(f"  made {k} x {op} (outputs per node: {list(ort_run.node_outputs[op])})")
print("LayerNormalization nodes left:", ort_run.ops_after.get("LayerNormalization", 0),
      "of", ort_run.ops_before.get("LayerNormalization", 0))
why = ort_run.transformer_optimizer
print("transformer optimizer:", "available here" if why is None else f"not available here ({why})")
skip_ln = ort_run.fused.get("com.microsoft.SkipLayerNormalization", 0)
fast_gelu = ort_run.fused.get("com.microsoft.FastGelu", 0)
n_ln = ort_run.ops_before.get("LayerNormalization", 0)''', "ort"),
    md("""
The transformer optimizer, where it can run, is run live by the next cell; where it cannot (the cell
above names why, e.g. `sympy` missing), the cell prints what it made of this same file on 2026-12-02
(onnxruntime 1.32.0, `sympy` 1.14.0 put on the path for that run only), labelled **RECORDED**.
"""),
    code('''
from rlxviz.session.ort_optimizer import TransformerFusions, transformer_optimized

RECORDED_TF = TransformerFusions("1.32.0", 101, {"FastGelu": 2, "LayerNormalization": 1, "SkipLayerNormalization": 4},
                                 (2, 2, 2, 1), ("h.0.ln_1",))
if why is None:
    tf = transformer_optimized(PATH, "gpt2", cfg["n_head"], cfg["n_embd"])
    print(f"MEASURED here: ONNX Runtime {tf.version} transformer optimizer (opt_level=0)")
else:
    tf = RECORDED_TF
    print(f"RECORDED (2026-12-02, ONNX Runtime {tf.version} + sympy 1.14.0) - not measured in this notebook")
print(f"  nodes after: {tf.nodes_after}; fused: {tf.fused}")
print(f"  SkipLayerNormalization outputs per node: {list(tf.norm_outputs)} "
      f"({sum(k == 2 for k in tf.norm_outputs)} also return the residual sum)")
print(f"  LayerNormalization left: {', '.join(tf.layer_norms_left) or 'none'}")''', "transformer-optimizer"),
    md("""
## Exercise: read the norms

From the raw outputs of the pipeline and ONNX Runtime cells above (the next section reads them aloud;
run the check first), fill in three values:

* `rlxviz`: how many of GPT-2's norms the canonical pipeline fused into `FusedResidualLN`,
* `ort`: how many ONNX Runtime's graph optimizer fused into `SkipLayerNormalization`,
* `guard`: the name of the guard that refused the other norms in rlxviz (a string).

The check says what is wrong, if anything. Solution: `notebooks/solutions.py` (`ex05`), run by the
collapsed cell below.
"""),
    code('''
def check_ex05(answer):
    assert isinstance(answer, (tuple, list)) and len(answer) == 3, (
        "give a tuple of 3 values, (rlxviz norms, ONNX Runtime norms, 'guard name')")
    assert all(v is not None for v in answer), "fill in all three values"
    *counts, guard = answer
    rlx, ort_n = teach.expect_ints(tuple(counts), ("rlxviz", "ort"))
    assert rlx != len(norms), (f"rlxviz: {len(norms)} is every norm in the model; fuse_residual_ln refused "
                               f"some: read its rejections in the pipeline cell")
    assert rlx == n_rln, "rlxviz: count FusedResidualLN in the final version (the pipeline cell's final ops)"
    assert ort_n != len(tf.norm_outputs) or ort_n == skip_ln, (
        f"ort: {ort_n} is what the transformer optimizer made (the cell after the graph optimizer's); the question "
        "is the graph optimizer's count")
    assert ort_n == skip_ln, ("ort: count com.microsoft.SkipLayerNormalization in what the optimizer made (the "
                              "ONNX Runtime cell)")
    assert isinstance(guard, str), f"guard: give the guard's name as a string, e.g. 'name'; you gave {guard!r}"
    assert guard != st.first.guard, (f"guard: {guard} refused the FFN's activation, not a norm; the norms were "
                                     "refused by fuse_residual_ln")
    assert guard in rln_guards, (f"guard: {guard!r} did not refuse a norm; read the fuse_residual_ln.residual "
                                 "line of the layer status")
    return (f"rlxviz {rlx}, ONNX Runtime {ort_n}; the other norms' sums have a second reader ({guard}): a "
            "two-output rule is the fix (notebook 06)")


ex05_answer = (None, None, None)  # YOUR ANSWER: (rlxviz norms, ONNX Runtime norms, "guard name")
teach.feedback(check_ex05, ex05_answer);''', "exercise"),
    code('''
import solutions

teach.feedback(check_ex05, solutions.ex05());''', "solution", hidden=True),
    md("""
## 6. Read aloud: rlxviz and ONNX Runtime side by side

The next cells write out what the raw outputs above say, from the same variables.
"""),
    code('''
from IPython.display import Markdown

display(Markdown(
    f"Layer 0's first rejection is `{st.first.guard}` (*{st.first.kind}*): GPT-2's `gelu_new` is the tanh "
    f"approximation of GELU, and the epilogue of `FusedMatMulBiasAct` takes `gelu` and `silu` only. So "
    f"{n_fmba} linears fuse with their bias, and {n_gelu} `gelu_tanh` nodes stay separate. The product's "
    f"fix is on the compiler's side (*{st.first.fix}*): switching the model to exact GELU would change "
    f"its numbers (notebook 03 measures by how much).\\n\\n"
    f"The norms: `fuse_residual_ln` fused **{n_rln} of the {len(norms)}** norms "
    f"({', '.join(m.path or 'the final ln_f' for m in rln.matches) or 'none'}) and refused "
    f"{len(refused)}, each by `{'`, `'.join(rln_guards)}`: a pre-LN sum is also read by the next residual "
    f"add, and `FusedResidualLN` returns only the normalized value. That is *illegal* for this op, "
    f"whatever its kernel, and *expected* for a pre-LN layer (the `not expected here` lines above); "
    f"notebook 06 writes the two-output rule that makes these norms fuse."))''', "why-read-aloud"),
    code('''
rows = [("residual add + LayerNorm", f"{skip_ln} SkipLayerNormalization of {n_ln} norms",
         f"{n_rln} FusedResidualLN of {len(norms)} norms"),
        ("tanh GELU", f"{fast_gelu} FastGelu (the activation alone)",
         f"{n_gelu} gelu_tanh (one op; not in an epilogue)"),
        ("linear + bias", "Gemm (ONNX's Gemm already adds the bias)", f"{n_fmba} FusedMatMulBiasAct"),
        ("attention", f"{ort_run.fused.get('com.microsoft.FusedMatMul', 0)} FusedMatMul (Q @ K^T with its scale)",
         f"{trace.final.op_counts().get('attention', 0)} attention (fuse_sdpa: scores, mask, softmax, @ V)")]
print(f"{'':<26}{'ONNX Runtime ' + ort_run.version:<44}rlxviz canonical pipeline")
for what, ort_says, we_say in rows:
    print(f"{what:<26}{ort_says:<44}{we_say}")''', "ort-vs-rlxviz"),
    code('''
one_output = all(k == 1 for k in ort_run.node_outputs.get("com.microsoft.SkipLayerNormalization", ()))
display(Markdown(
    f"ONNX Runtime's graph optimizer fused **{skip_ln} of {n_ln}** norms with their residual add; rlxviz fused "
    f"**{n_rln} of {len(norms)}**. " + ("The same count, and for the same reason: " if skip_ln == n_rln else
    "Different counts; read the table. ") +
    ("every SkipLayerNormalization it made has one output, so it too fuses only the norm whose sum has no "
     "other reader (`ln_f`). " if one_output and skip_ln else "") +
    "ONNX Runtime's SkipLayerNormalization *has* an optional fourth output, the sum itself "
    "(`input_skip_bias_sum`), and the transformer optimizer uses it when the residual add has another reader "
    "(`onnxruntime/transformers/fusion_skiplayernorm.py`): the two-output fusion notebook 06 builds. The graph "
    "optimizer's attention stops at `FusedMatMul` (the scores' matmul with its scale); rlxviz's `attention` "
    "takes the whole `softmax(Q K^T / sqrt(d) + mask) V`. ONNX Runtime fuses the tanh GELU into one `FastGelu` "
    "kernel, as rlxviz makes it one `gelu_tanh` "
    "op; neither absorbs it into the linear. "
    + ("The transformer optimizer " + ("(recorded, not run here: " + why + ") " if why else "(run here) ")
       + f"fuses **{len(tf.norm_outputs)} of {n_ln}** norms, **{sum(k == 2 for k in tf.norm_outputs)}** of them "
       "with the sum as a second output — the two-output form; it leaves "
       f"{', '.join(tf.layer_norms_left) or 'no norm'}, whose sum adds the token and position embeddings (two "
       "Gathers): embedding sums are left to its EmbedLayerNormalization fusion, which did not match this "
       "export (`fusion_skiplayernorm.py`). rlxviz with notebook 06's rule fuses that one too.")))''',
         "ort-read-aloud"),
    md("""
## Try it

The project's other ONNX fixtures, through the same cells: the import check, each layer's kind and
verdict, and ONNX Runtime's fusions (the output under the cell before the control is a static copy,
for exports). Put your own file in the dictionary to read yours.
"""),
    code('''
FIXTURES = {p.stem: p for p in [*sorted(Path("../tests/fixtures/onnx").glob("*.onnx")),
                                *sorted(Path("../tests/fixtures/onnx/cases").glob("*.onnx"))]}


def read_model(name="gpt2"):
    m = teach.load(str(FIXTURES[name]))
    f = m.random_feeds(0)
    print(against_onnx(m, f).line())
    t = Pipeline.canonical().run(m.graph)
    for s in teach.check_fusion(t, name).layers:
        print(f"layer {s.layer} ({s.architecture.kind}): " + ("fused" if s.fused else "NOT fused: " + s.blocker))
    o = ort_optimized(FIXTURES[name], f)
    print("ONNX Runtime made:", o.fused or "nothing")


read_model()  # static output for exports
controls = widgets.interact(read_model, name=widgets.Dropdown(options=list(FIXTURES), value="gpt2"))'''),
]

# ------------------------------------------------------------------------------------------------- 06

NB06 = [
    md("""
# 06 — A multi-output fusion: the pre-LN residual norm

In notebook 05, 4 of GPT-2's 5 LayerNorms did not fuse with their residual add: guard `sum_single_user`,
kind *illegal*. In a pre-LN layer the residual sum `h = x + sublayer(...)` has two readers — the next
norm and the next residual add — and `FusedResidualLN` returns only the normalized value, so fusing
would take `h` away from the add. The fix the product names is a **two-output** op that returns the
sum too: vLLM's `fused_add_rms_norm` writes the sum back in place, and ONNX Runtime's
`SkipLayerNormalization` has an optional output for it (notebook 05 shows ONNX Runtime's transformer
optimizer using it on this very model).

In this notebook you will

1. read the refusal again, from the product,
2. see how this IR says "two outputs" (one value per node: the outputs are **packed**, then read back
   by `narrow`s) and how a rule declares it (`Rule(outputs=...)`),
3. **write the rule** that makes GPT-2's pre-LN norms fuse, checked as notebook 04 checks (the
   numbers, the verifier, the matcher's records),
4. see what MLX then runs — and why fusing more does not make the program smaller here.
"""),
    code(SETUP, "setup"),
    md("""
## 1. The refusal, from the product

GPT-2's ONNX export again (`tests/fixtures/onnx/gpt2.onnx`), the canonical pipeline, and every
headline rejection of `fuse_residual_ln`:
"""),
    code('''
from collections import Counter

from rlxviz import session
from rlxviz.ir import Op, format_graph, lint
from rlxviz.passes import CANONICAL_ORDER, Pipeline, run_passes
from rlxviz.passes.engine import Pass, rule_pass
from rlxviz.teach import run_reference  # the run memory check rlxviz run makes, then the reference

gpt2 = teach.load("../tests/fixtures/onnx/gpt2.onnx")
print(teach.check_memory(gpt2.graph, "gpt2.onnx", "run"))
canonical = Pipeline.canonical().run(gpt2.graph)
rln = canonical.step("fuse_residual_ln")
refused = [r for r in rln.rejections if r.headline]
for r in refused:
    print(f"{r.path:<8} {r.guard} ({r.kind}): {r.message}")
print("compiler fix:", refused[0].fix)
n_norms = sum(n.op == Op.LAYER_NORM for n in gpt2.graph)
print(f"LayerNorms in the model: {n_norms}; fused by fuse_residual_ln: {len(rln.matches)} "
      f"({', '.join(m.path or 'ln_f' for m in rln.matches)}); refused: {len(refused)} of {n_norms} LayerNorms")''',
         "refusal"),
    md("""
## 2. Two outputs in a one-value IR

Every node here has one value. A fused op with two outputs therefore returns them **packed on the
last axis**: `FusedResidualLN(x, residual, gamma, beta, with_sum=True)` computes `s = x + residual`
and gives `[LayerNorm(s), s]`, shape `[..., 2H]`; two `narrow` nodes read the halves back (the layout
`fuse_shared_input_matmul` uses for Q, K and V). A rule declares it with `outputs`: the absorbed roles
whose values the fused node *also* produces. The engine then

* lets those roles keep readers outside the match (its generic `absorbed_escape` guard exempts them),
* checks the packed type against the op's own type rule before rewriting (`fused_types`),
* rewrites with `Rewriter.fuse_packed`: one fused node, one `narrow` per value, each reader redirected.

A small pre-LN block, before and after a rule like the one you will write:
"""),
    code('''
from rlxviz.ir import Builder

b = Builder("pre_ln_block")
x = b.input("x", (2, 4, 8))
h = b.add(x, b.gelu(x))  # the residual sum h
with b.scope("ln"):
    y = b.layer_norm(h, b.param("ln.weight", (8,)), b.param("ln.bias", (8,)))
b.output(b.add(h, b.gelu(y)))  # h is read again by the next residual add
block = b.build()

import solutions

demo = run_passes(block, [solutions.ex06()]).steps[0]
print(format_graph(block))
print()
print(format_graph(demo.after))
fused = demo.after[demo.matches[0].fused]
print(f"\\n{fused.op.value}(with_sum={fused.attrs['with_sum']}) {list(fused.shape)} is read by",
      [f"%{u.id} narrow(start={u.attrs['start']}, length={u.attrs['length']})" for u in demo.after.users(fused.id)])''',
         "demo"),
    md("""
## 3. Exercise: the two-output rule

Write a pass `fuse_residual_ln_two_outputs` with one rule:

* **anchor**: `P(Op.LAYER_NORM, P(Op.ADD, P.var("x"), P.var("residual"), name="sum"), P.var("gamma"),
  P.var("beta"), name="norm")`;
* **steps**:
  1. *not a candidate* (return `QUIET`) when the sum has no reader besides the norm and is not a graph
     output: the single-output `fuse_residual_ln` takes those, and packing a sum nobody reads would
     only copy it (a step function with `@reports(reads=("sum", "norm"))`; `c.users("sum")` lists the
     sum's readers, `c.graph.is_output(c.id("sum"))` says whether it is an output);
  2. `same_shape("x", "residual", "residual_same_shape")`: a broadcast add (a bias) is not a residual;
* **rewrite**: `result="norm"`, `outputs=("sum",)`, `absorb=("sum", "norm")`,
  `build=lambda c: (Op.FUSED_RESIDUAL_LN, [x, residual, gamma, beta ids], {"eps": c["norm"].attrs["eps"],
  "with_sum": True})`.

**Validity condition** (write it in your rule's `doc`): the fused op computes `s = x + residual` and
`LayerNorm(s)` with the matched `eps`, the same ops in the same order, and returns `s` itself, so every
reader of the sum and of the norm gets the same bits — the check demands outputs equal to the last bit
on the NumPy reference executor.

The check runs your pass right after `fuse_residual_ln` in the canonical pipeline on GPT-2, runs the
verifier, compares the numbers, reads the matcher's records, and tries two more graphs: a post-LN
BERT (`bert-tiny`), where nothing should change, and a norm reading a bias add.
"""),
    code('''
from rlxviz.passes.guard import same_shape
from rlxviz.passes.pattern import P
from rlxviz.passes.rule import QUIET, Rule, reports

PRE = list(CANONICAL_ORDER[:CANONICAL_ORDER.index("fuse_residual_ln") + 1])
post_ln = teach.load("bert-tiny", seq=8)


def with_pass(my_pass):
    """The canonical order with `my_pass` right after fuse_residual_ln."""
    order = list(CANONICAL_ORDER)
    order.insert(order.index("fuse_residual_ln") + 1, my_pass)
    return order


def bias_norm_graph():
    """LayerNorm(x + bias) whose biased sum is also an output: a broadcast add, not a residual."""
    b = Builder("bias_norm")
    x = b.input("x", (2, 4, 8))
    s = b.add(x, b.param("bias", (8,)))
    b.output(b.layer_norm(s, b.param("g", (8,)), b.param("b", (8,))), s)
    return b.build()


def max_diff(g, h, model=gpt2):
    """Largest |difference| between the outputs of graphs `g` and `h` on the NumPy reference, same feeds."""
    f = model.random_feeds(0)
    return max(float(abs(a - b).max()) for a, b in zip(run_reference(g, f, model.weights),
                                                       run_reference(h, f, model.weights), strict=True))


def check_ex06(my_pass):
    assert my_pass is not None, "build your pass: my_two_output = rule_pass('fuse_residual_ln_two_outputs', [rule])"
    assert isinstance(my_pass, Pass), f"rule_pass(...) returns a Pass; you gave a {type(my_pass).__name__}"
    run = Pipeline(with_pass(my_pass)).run(gpt2.graph)
    step = run.step(my_pass.name)
    assert not step.error, f"your pass failed (or the verifier rejected its graph): {step.error}"
    g = lint(step.after)  # the verifier, once more, on your graph
    escaped = [r for r in step.rejections if r.guard == "absorbed_escape"]
    assert step.matches or not escaped, (
        f"the engine refused every candidate: {escaped[0].message}; declare outputs=('sum',) so the fused node "
        "returns the sum to its other readers")
    n = len(step.matches)
    assert n == len(refused), (f"your pass made {n} matches; the {len(refused)} norms fuse_residual_ln refused "
                               f"({', '.join(r.path for r in refused)}) should fuse")
    before, after = (Counter(n.op for n in x) for x in (step.before, g))
    assert after[Op.ADD] == before[Op.ADD] - n, (
        f"the residual sums are still computed by add nodes ({before[Op.ADD]} adds before your pass, "
        f"{after[Op.ADD]} after): absorb the sum too, absorb=('sum', 'norm'), so each is computed once, inside "
        "the fused op")
    assert after[Op.LAYER_NORM] == before[Op.LAYER_NORM] - n, "a layer_norm is left: absorb the norm"
    new = [g[m.fused] for m in step.matches]
    assert all(f.op == Op.FUSED_RESIDUAL_LN and f.attrs.get("with_sum") for f in new), (
        f"the rewrite made {sorted({(f.op.value, str(dict(f.attrs))) for f in new})}; expected "
        "FusedResidualLN(with_sum=True)")
    d = max_diff(step.before, g)
    assert d == 0.0, f"outputs changed by up to {d:.3e}: the fused op computes the same ops in the same order"
    d_all = max_diff(gpt2.graph, run.final)
    quiet = run_passes(post_ln.graph, [my_pass]).steps[0]  # post-LN: every residual sum feeds its norm only
    assert not quiet.matches, (
        f"on post-LN bert-tiny your pass fused {len(quiet.matches)} norms whose sum has no other reader: those are "
        "fuse_residual_ln's (single output); leave them alone (QUIET), packing a sum nobody reads only copies it")
    bias = run_passes(bias_norm_graph(), [my_pass]).steps[0]
    assert not bias.matches, "your pass fused a norm reading a bias add (x [2, 4, 8] + bias [8]): not a residual"
    mine = [r for r in bias.rejections if r.guard not in ("absorbed_escape", "fused_types")]
    assert mine, ("only the engine's fused_types refused the bias add: add your own guard that names the problem "
                  "(same_shape on x and residual)")
    return (f"{n} norms fused with two outputs, verifier passed, outputs equal bit for bit (whole pipeline vs the "
            f"ONNX import: {d_all:.1e}); post-LN untouched; the bias add refused by {mine[0].guard} ({mine[0].kind})")


my_two_output = None  # YOUR PASS: rule_pass("fuse_residual_ln_two_outputs", [a Rule as described above])
teach.feedback(check_ex06, my_two_output);''', "exercise"),
    code('''
teach.feedback(check_ex06, solutions.ex06());''', "solution", hidden=True),
    md("""
## 4. What the product says now, and what MLX runs

With the solution's pass in the pipeline, GPT-2's norms are all fused. Count two things: the graph's
ops (the `narrow`s that read the packed values are ops too), and what MLX runs —
`session.version_primitives` lowers each version and lists MLX's own primitives (views — reshapes,
slices — counted apart).
"""),
    code('''
from rlxviz.session.program import VIEWS

two = solutions.ex06()  # or your my_two_output, once its check says correct
after = Pipeline(with_pass(two)).run(gpt2.graph)
print("final ops, canonical:      ", dict(sorted(canonical.final.op_counts().items())))
print("final ops, with two-output:", dict(sorted(after.final.op_counts().items())))
feeds = gpt2.random_feeds(0)
prims = {label: session.version_primitives(run, feeds, gpt2.weights, device="cpu")[-1]
         for label, run in (("canonical", canonical), ("with two-output", after))}
for label, p in prims.items():  # the non-view primitives by name (a Compiled(...) kernel by its pieces)
    kernels = {session.short_primitive(k): v for k, v in p.program.counts().items() if k not in VIEWS}
    print(f"{label:<16} graph ops {p.ops:>3}  MLX primitives {p.program.count:>4}  not views "
          f"{p.program.kernels:>4}  {kernels}")''', "after"),
    code('''
from IPython.display import Markdown

c0, c1 = (p.program.counts() for p in prims.values())
k0, k1 = (p.program.kernels for p in prims.values())
g0, g1 = (p.ops for p in prims.values())
extra = {k: c1.get(k, 0) - c0.get(k, 0) for k in sorted(set(c0) | set(c1)) if c1.get(k, 0) != c0.get(k, 0)}
two_step = after.step(two.name)
sum_bytes = [two_step.before[m.bindings["sum"]].nbytes for m in two_step.matches]
n_two = len(two_step.matches)
display(Markdown(
    f"The graph went from {g0} to {g1} ops ({n_two} adds and {n_two} norms became {n_two} fused ops and "
    f"{2 * n_two} `narrow`s), and MLX's program from {k0} to **{k1}** non-view primitives "
    f"(changes, views included: {extra or 'none'}). " +
    ("More, not fewer: " if k1 > k0 else "Not fewer: " if k1 == k0 else "Fewer: ") +
    f"rlxviz's residual + LayerNorm kernel has one output (it still runs ln_f: `RlxvizResidualLayerNorm` "
    f"x{c1.get('RlxvizResidualLayerNorm', 0)} in both programs), so the lowering runs the two-output "
    "`FusedResidualLN` as its decomposition (an add, then the norm, then a `concatenate` that packs the two "
    "values), and the packing is a copy the unfused graph never made. "
    "The rule is right — the numbers are equal and every reader gets its value — but on this backend the "
    "fusion changes the graph, not the work. A kernel that pays writes both values in one pass over the "
    f"data: per norm it would save one read of the sum (the norm uses it while it is still in registers), "
    f"{sum_bytes[0] if sum_bytes else 0} B here, {sum(sum_bytes)} B for the {len(sum_bytes)} norms "
    "(a **model** of that kernel, from the sum's shape and dtype, not something MLX ran). That needs the "
    "lowering to keep the two outputs apart, as vLLM's `fused_add_rms_norm` does."))''', "after-read-aloud"),
    md("""
## Try it

Pick a model and a pipeline; the cell prints the norms fused and whether the numbers held (the output
under the cell before the control is a static copy, for exports). Your rule is for LayerNorm, so LLaMA's
pre-LN RMSNorms stay unfused (pick it: only the norm the product's single-output rule takes fuses).
`FusedResidualRmsNorm` takes `with_sum` too; its twin rule is a next exercise
(LLaMA's norm has no beta: `fuse_residual_rms_norm.residual_no_beta` shows how to give it a zero one).
"""),
    code('''
MODELS = {"gpt2 (ONNX)": lambda: gpt2, "llama (ONNX, RMSNorm)": lambda: teach.load("../tests/fixtures/onnx/llama.onnx"),
          "bert-tiny (post-LN)": lambda: post_ln, "bert-tiny pre_ln variant": lambda: teach.load(
              "bert-tiny", seq=8, variant="pre_ln")}
PIPES = {"canonical": lambda: Pipeline.canonical(), "with two-output": lambda: Pipeline(with_pass(two))}


def try_it(model="gpt2 (ONNX)", pipeline="with two-output"):
    m = MODELS[model]()
    run = PIPES[pipeline]().run(m.graph)
    ops = run.final.op_counts()
    left = ops.get("layer_norm", 0) + ops.get("rms_norm", 0)
    print(f"{model} / {pipeline}: FusedResidualLN {ops.get('FusedResidualLN', 0)}, FusedResidualRmsNorm "
          f"{ops.get('FusedResidualRmsNorm', 0)}, norms left unfused {left}; max |diff| vs the input graph "
          f"{max_diff(m.graph, run.final, m):.1e}")


try_it()  # static output for exports
controls = widgets.interact(try_it, model=widgets.Dropdown(options=list(MODELS)),
                            pipeline=widgets.Dropdown(options=list(PIPES), value="with two-output"))'''),
]

NOTEBOOKS = {
    "01_what_is_fusion.ipynb": NB01,
    "02_fusing_a_bert_layer.ipynb": NB02,
    "03_why_did_my_layer_not_fuse.ipynb": NB03,
    "04_write_your_own_pattern_and_guard.ipynb": NB04,
    "05_bring_your_own_model.ipynb": NB05,
    "06_a_multi_output_fusion.ipynb": NB06,
}


def build(cells: list[nbformat.NotebookNode]) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells, metadata={"kernelspec": KERNELSPEC,
                                             "language_info": {"name": "python"}})
    for i, c in enumerate(nb.cells):
        c["id"] = f"c{i:02d}"  # stable ids: regenerating gives byte-identical files
    return nb


def render(name: str) -> str:
    """The notebook file's text for `name` (what `main` writes)."""
    return nbformat.writes(build(NOTEBOOKS[name])) + "\n"


def main(argv: list[str] | None = None) -> int:
    for name in NOTEBOOKS:
        (HERE / name).write_text(render(name), encoding="utf-8")
        print("wrote", HERE / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
