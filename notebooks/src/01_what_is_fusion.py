# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
#   language_info:
#     name: python
# ---

# %% [markdown]
# # 01 — What is fusion?
#
# A model is a graph of small operations. Run one at a time, every intermediate tensor is **written to
# memory by one op and read back by the next**. *Fusion* replaces a chain of ops with one op that
# computes the same values — and, **if the backend runs that op as one kernel**, keeps the
# intermediates in registers or cache.
#
# In this notebook you will
#
# 1. build a small graph with the `Builder` and read its IR text,
# 2. run two fusion passes **one at a time** — `fuse_matmul_bias_act`, then `fuse_residual_ln` — and
#    draw the graph before and after each,
# 3. count the bytes of intermediates an *ideal* fused kernel would not move, then the bytes the program
#    MLX **actually executes** saves (a fused op is only a name in the graph; the lowering decides the
#    kernels), and place every op and version on a roofline measured on this machine,
# 4. time every version on MLX in paired, interleaved rounds and read the table honestly (a verdict with
#    its confidence interval, or "within noise"), measure what the lowering changes in the numbers, then
#    put the measured points on the roofline,
# 5. check your understanding in an exercise with feedback.
#
# Graphs are drawn by the same renderer as the app; big drawings scroll inside their box.

# %% tags=["setup"]
# %load setup_cell.py

# %% [markdown]
# ## 1. A small graph
#
# A BERT-style feed-forward block: `LayerNorm(x + fc2(gelu(fc1(x))))`, batch 2, 64 tokens, hidden
# size 128, intermediate size 512. `b.linear` emits a `matmul` and an `add` (the bias); `b.scope` sets
# the model path shown after `@`.

# %% tags=["ir-input"]
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
print("compute nodes:", len(graph.compute_nodes()))

# %%
teach.show(graph, caption="the unfused graph")

# %% [markdown]
# ## 2. First pass: `fuse_matmul_bias_act`
#
# The pattern is `act(x @ w + bias)`. Each match becomes one `FusedMatMulBiasAct` whose epilogue adds
# the bias and applies the activation (its allow-list: `gelu`, `silu` and `relu2`). Left: the graph the
# pass saw, each match drawn as a cluster. Right: the result, fused nodes marked.

# %% tags=["step-fmba"]
from rlxviz.passes import run_passes

trace1 = run_passes(graph, ["fuse_matmul_bias_act"])
step1 = trace1.steps[0]
for m in step1.matches:
    print(f"{m.rule}: anchor %{m.anchor} -> %{m.fused}  roles {m.bindings}")
print("matches:", len(step1.matches), "| rejections:", len(step1.rejections))
print("op counts after:", step1.after.op_counts())

# %%
teach.show_step(step1)

# %% [markdown]
# ### Memory traffic: the ideal kernel and the executed program
#
# An intermediate is an absorbed node whose every reader was absorbed too. Unfused, its tensor
# (`node.nbytes` bytes) is written once and read once per user. An **ideal** fused kernel moves neither;
# the match's *result* is still written by the fused node, so it does not count.
#
# MLX's own lowering (`rlxviz/runtime/lowering.py` with rlxviz's CPU kernels off) runs `FusedMatMulBiasAct` as
# its decomposition: `x @ w + b` as **one `mx.addmm`**, then the activation as **separate kernels**. One
# `mx.addmm` is not one pass over memory: on the **CPU**, MLX 0.32 first fills the output with the broadcast
# bias and lets BLAS read and rewrite it (`beta = 1`), so it moves the bytes that matmul + add move — **0 B
# saved** (recorded, not measured here: issue 23 timed the two on this project's CPU and found them equal within
# a fraction of a percent). On the GPU a GEMM epilogue reads the bias, and the matmul's output never reaches
# memory. `session.executed_traffic_saved` splits the ideal saving by what MLX's own lowering on a device runs
# as one kernel; it is a **model** of MLX's kernels that does not know rlxviz's own CPU kernels (which run bias
# + GELU in one pass, or on AVX-512 at small batches the whole linear as one GEMM with the bias and GELU in its
# store): the bytes MLX's program really moves are read from MLX below ("What MLX runs").

# %% tags=["traffic-fmba"]
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
      session.executed_traffic_saved(step1, device="gpu").total)

# %% [markdown]
# ## 3. Second pass: `fuse_residual_ln`
#
# `LayerNorm(a + b)` becomes `FusedResidualLN(a, b, gamma, beta)`: `x` is the add's first operand,
# `residual` its second, as the model wrote them. The order does not change the numbers (float addition is
# commutative), and the transformer-layer fusion later accepts the residual in either order (notebooks 03
# and 04).
# How it runs is the lowering's choice. MLX's own lowering runs an `add` and then `mx.fast.layer_norm` —
# and on the CPU `mx.fast.layer_norm` itself is not one kernel: MLX 0.32 runs its fallback, a chain of
# primitives. rlxviz now has **its own CPU kernels** (`rlxviz/kernels`, `docs/performance.md` section 0):
# where they are built, the CPU runs residual add + LayerNorm as **one** kernel, as ONNX Runtime's
# `SkipLayerNormalization` does (vLLM's `fused_add_rms_norm` is the RMSNorm kin, on a GPU). Which of the
# two ran here is read from MLX in the next section, not assumed. (What it saves is the exercise at the end of this notebook.)

# %% tags=["step-rln"]
trace2 = run_passes(step1.after, ["fuse_residual_ln"])
step2 = trace2.steps[0]
for m in step2.matches:
    print(f"{m.rule}: anchor %{m.anchor} -> %{m.fused}  roles {m.bindings}")
print(format_graph(step2.after))

# %%
teach.show_step(step2)

# %% [markdown]
# ### What MLX runs, read from MLX
#
# The traffic above is a model. MLX can say what it runs: `session.version_primitives` lowers every
# version, calls it once without evaluating, and reads MLX's own graph of **primitives** back
# (`mx.export_to_dot`). *Views* (`Broadcast`, `Reshape`, ...) move no data; every other primitive is at
# most one kernel; `Compiled...` is one `mx.compile`d kernel (here the CPU's fast-math GELU); `Rlxviz...`
# is one of rlxviz's own CPU kernels.
#
# The **bytes** come from the same graph (`ProgramBytes`: MLX's arrays give every primitive's input and output
# shapes and dtypes): each kernel reads each distinct input once and writes each output once; reading through a
# view costs the storage under it. That is each kernel's compulsory traffic (caches are not seen). One column
# is a **model**, kept apart: the CPU `AddMM` pre-fills its output with the bias and lets BLAS read and rewrite
# it (`beta = 1`), one more write and read of the output than the graph shows (`+ modelled`).

# %% tags=["primitives"]
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
print(kernels.status())

# %% tags=["primitives-read-aloud"]
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
    f"{moved[2].total} B (of which {moved[1].modelled} B in versions 1 and 2 are the modelled `AddMM` pre-fill)."))

# %% [markdown]
# ### The roofline: FLOPs per byte
#
# A kernel that does few FLOPs per byte it moves waits on memory; one that does many waits on arithmetic.
# Where the two limits meet is the machine's **ridge point** (peak FLOP/s divided by memory bandwidth).
# The next cell measures the two ceilings on this machine with the product's timing
# (`session.machine_ridge`): **compute**, a 1024 x 1024 f32 matmul on MLX (multi-threaded BLAS);
# **bandwidth**, a streaming f32 add of two 4 Mi-element vectors — which MLX's CPU runs on **one thread**,
# so it is the bandwidth one MLX CPU kernel gets, not the memory system's peak. It then places every op
# and every version on the roofline (`session.op_costs`: each graph op's FLOPs and bytes from its shapes;
# `session.roofline`: FLOPs from the graph, each version's bytes **read from the program MLX runs** (the
# table above), and the bytes of ideal kernels, a model) and **predicts**, before anything is timed, which
# bound each version is under and its fastest possible time (`session.attainable_ms`).
#
# FLOPs are counted honestly: GELU is not 1 FLOP per element. Its `erf`, as the CPU lowering computes it
# (`rlxviz/runtime/fast.py`: a clip, `x^2`, a degree-6 and a degree-4 polynomial, a product and a
# division), is **25 FLOPs**, so GELU is 29 per element (`session.ERF_FLOPS`; the same rational
# approximation XLA and Eigen use). Fusion changes no FLOP; at best it removes bytes.

# %% tags=["roofline"]
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
          f"{session.attainable_ms(v.flops, v.bytes, ridge):.3f} ms")

# %% tags=["roofline-read-aloud"]
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
       + "; only a memory-bound version can gain from removed bytes.")))

# %% [markdown]
# ## 4. Same numbers, less time?
#
# Both passes in one pipeline, then every version timed **together in interleaved rounds** (round *r*
# runs every version once, the one that starts rotating, so a busy machine slows them alike): median,
# min and IQR (p25..p75) of the rounds; `x input` is the median of the paired per-round ratios over the input
# (`busy: not read` on a busy run; `not read: medians disagree` where the ratio of the medians points the other
# way); `first ms` is the first call of a fresh program (MLX builds, traces and runs it), kept out of the rounds.
# Two error columns:
#
# * `vs oracle`: MLX against the float64 NumPy oracle of the unfused graph — it mixes in the difference
#   between the two backends and precisions, so it is **not** what fusion changed;
# * `vs unfused` (repeated below as `error vs input on MLX`): each version against the **unfused graph on
#   the same MLX device, in the same dtype** — what the rewrite changed.

# %% tags=["timing"]
print(teach.check_memory(both.input, "ffn_block", "time"))  # the check `rlxviz time` makes; time_versions repeats it
rows = teach.time_versions(both, feeds, weights, warmup=2, repeat=21, device="cpu", fresh=True)  # fresh: measure again
print("timed on:", rows[0].context)
print(teach.format_timings(rows))
print("all versions match the reference:", all(r.ok for r in rows))
for r in rows:  # `vs unfused`: the unfused graph run on the same MLX device, same dtype
    print(f"  #{r.index} {r.label:<28} error vs input on MLX: {r.err_unfused:.2e}")

# %% [markdown]
# ### Reading the table aloud
#
# The next cell writes the sentences from the numbers above, each version against the **previous** one
# (`session.compare_versions`). Round *r* of two versions ran back to back, so the rounds are **paired**:
# the statistic is the median over rounds of the per-round ratio, with a 95% bootstrap confidence
# interval (rounds resampled with replacement, 2000 times, seeded). A version is *within noise* when the
# interval contains 1, when the median ratio is within 1% of 1 (below what a shared CPU resolves), or
# when the interval is too wide to read a factor from (its high end more than 1.5x its low end); a
# verdict needs at least 21 rounds; a run whose median is more than twice its minimum, or whose IQR is
# more than half its median, is flagged as unusable (a busy machine). Rerunning the timing cell
# measures again.

# %% tags=["read-aloud"]
from IPython.display import Markdown

base = rows[0]
busy = session.busy_warning(*rows)  # one warning for the run: a median far above its minimum, or a wide IQR
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
display(Markdown("\n".join(lines)))

# %% [markdown]
# ### What fusion changes in the numbers
#
# A fusion is valid when it computes the same function (`docs/passes.md` states each rule's condition); its
# kernels need not give the same **bits**. The next cell measures, on this block and this machine:
#
# * the float32 **NumPy reference** executor on every version: these two passes compute the same ops in the
#   same order there, so any difference would be the rewrite's own;
# * MLX on the CPU, every version against the unfused graph in the same dtype (the timing table's
#   `vs unfused`), which adds what the **lowering** changes:
# * **fast-math transcendentals**: the CPU lowering and rlxviz's kernels compute GELU's `erf` with a
#   rational approximation (`rlxviz/runtime/fast.py`), not libm's; its largest error on a fine grid;
# * **`mx.addmm`** (what a fused linear emits): the bias enters the GEMM's accumulation, so it can round
#   differently from a matmul followed by an add; measured in float32 and in bfloat16 at fc1's shape.

# %% tags=["numerics"]
ref32 = [teach.run_reference(g, feeds, weights, np.float32)[0] for _, g in both.versions()]
for (label, _), out, r in zip(both.versions(), ref32, rows, strict=True):
    print(f"#{r.index} {label:<27} f32 reference vs input {float(np.abs(out - ref32[0]).max()):.1e}; "
          f"MLX cpu vs input {r.err_unfused:.1e}")
err_fast = session.fast_erf_error(-6, 6)
print(f"fast erf vs exact on [-6, 6]: largest difference {err_fast:.1e}")
addmm = {name: session.addmm_rounding(B * S, H, FF, name) for name in ("float32", "bfloat16")}
for name, a in addmm.items():
    print(f"addmm vs matmul + add, {name}: largest difference {a.max_diff:.1e} ({a.ulps:.0f} ulp at the largest "
          "output)")

# %% tags=["numerics-read-aloud"]
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
    "graph rewrite: both are the lowering's rounding, inside the tolerance the timing table checks."))

# %% [markdown]
# ### The roofline with the measured points
#
# Each timed version as a point: its intensity (FLOPs over the executed program's bytes) and the FLOP/s it
# achieved (its FLOPs over its median time). The line is the roofline measured above.

# %% tags=["roofline-measured"]
from IPython.display import HTML

points = [(r.label, v.intensity, v.flops / r.median_ms / 1e6) for r, v in zip(rows, roof, strict=True)]
display(HTML(teach.svg_html(teach.roofline_svg(ridge.gflops, ridge.gbps, points),
                           caption="roofline measured on this machine; dots: the timed versions")))
for label, intensity, achieved in points:
    print(f"measured {label:<27} {intensity:.2f} FLOP/B  {achieved:.2f} GFLOP/s "
          f"({achieved / ridge.gflops:.0%} of the matmul peak)")
compute_bound = [label for label, i, _ in points if i >= ridge.ridge]
print("compute-bound versions:", ", ".join(compute_bound) or "none")

# %% tags=["roofline-conclusion"]
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
display(Markdown(text))

# %% [markdown]
# ### Recorded, not measured here: MiniLM on an H200 GPU
#
# These figures were **recorded** on an NVIDIA H200 host (16 CPU cores) with mlx-cuda 0.32.4 (CUDA 13),
# `MLX_ENABLE_TF32=0`, all-MiniLM-L6-v2-shaped encoder, f32, batch 8, seq 128, as reported in issue 12
# (filed before 2026-12-01; the issue gives no day), and two figures issue 23 adds. This notebook does **not**
# measure them; they are data to compare with, like a table in a paper. The project's own benchmark logs
# (`benchmarks/logs/`) would be the better source: the cell first reads which devices they were measured on.

# %% tags=["recorded-gpu"]
import re
from pathlib import Path

logs = sorted(Path("../benchmarks/logs").glob("*.txt"))  # `rlxviz` and the benchmarks print MLX's Device(...)
devices = {p.name: sorted(set(re.findall(r"Device\((\w+)", p.read_text(encoding="utf-8")))) for p in logs}
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
    print(f"  {label:<67} {ms}")

# %% tags=["recorded-gpu-read-aloud"]
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
       f"`benchmarks/logs/` holds GPU runs ({', '.join(gpu_logs)}): compare them with these figures.")))

# %% [markdown]
# ## 5. Try it
#
# Pick an **order** of passes and see the resulting graph with its ideal traffic and the traffic model of
# MLX's own CPU lowering (without rlxviz's kernels; what runs here is read from MLX above). Try
# `fuse_residual_ln` alone: it still fires, because it does not depend on the first pass. The output
# printed under this cell before the control is a static copy (what an exported HTML page shows).

# %%
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
controls = widgets.interact(run_and_draw, order=widgets.Dropdown(options=list(ORDERS), description="order"))


# %% [markdown]
# ## Exercise: what does the executed program move?
#
# Graph `graph`, version after both passes, run by MLX on the CPU. The `FusedResidualLN` reads
# `y + x` for `x` of shape `[2, 64, 128]` float32. Fill in two numbers (bytes, write + reads):
#
# * `ideal`: the traffic an ideal single kernel for `FusedResidualLN` saves,
# * `executed`: the bytes per call the program MLX runs here moves less after `fuse_residual_ln` than before
#   it (read from MLX: the table of "What MLX runs" above).
#
# Run the cell: the check says what is wrong, if anything. A solution is in
# `notebooks/solutions.py` (`ex01`); the collapsed cell at the end runs it through the same check.

# %% tags=["exercise"]
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
teach.feedback(check_ex01, ex01_answer);

# %% collapsed=true jupyter={"source_hidden": true} tags=["solution"]
import solutions

teach.feedback(check_ex01, solutions.ex01(prims));
