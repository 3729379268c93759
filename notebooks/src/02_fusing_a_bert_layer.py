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
# # 02 — Fusing a BERT layer
#
# The real **all-MiniLM-L6-v2** (sentence-transformers, 6 layers, hidden 384) loaded from its
# safetensors checkpoint as Hugging Face primitives, run through the whole canonical pipeline. You will
#
# 1. step through every graph version with a slider,
# 2. read the six `FusedTransformerLayer` matches and the role each node plays,
# 3. see what each fused op **runs as** on MLX, the traffic each pass saves (ideal, and modelled for MLX's
#    own lowering; horizontal fusion included), what MLX really runs per version and for one fused op,
#    read from MLX,
# 4. time every version on MLX in paired, interleaved rounds and read the table honestly; time
#    `mx.compile` of whole layers on the CPU (a fusion that does not pay) and measure the numerics,
# 5. learn why pass **order** matters by running the layer pass too early: first it is silent, then it
#    rejects every layer,
# 6. learn why RLX gates attention fusion at 64 tokens (a guard of kind *not profitable*) and measure
#    whether that gate pays on MLX,
# 7. check yourself in an exercise with feedback.

# %% tags=["setup"]
# %load setup_cell.py

# %% tags=["load"]
from rlxviz.models import load_model, tokenize
from rlxviz.passes import CANONICAL_ORDER, Pipeline

SEQ = 16
model = load_model("minilm", batch=1, seq=SEQ)
feeds = tokenize(["Fusion makes the graph smaller and the model faster."], SEQ, model.tokenizer_file)
print(model.description)
print("input graph:", len(model.graph.compute_nodes()), "compute nodes;", len(model.weights), "weights")
print("tokens:", int(feeds["attention_mask"].sum()), "of", SEQ)

# %% [markdown]
# ## 1. The canonical pipeline
#
# The canonical pipeline runs its passes in a fixed order (`rlxviz passes` prints them with their guards;
# the cell below counts the steps, one pass may run twice). Each step records its matches (fused) and
# rejections (near-misses, with the guard that said no).

# %% tags=["pipeline"]
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
print("fused layers:", final_counts.get("FusedTransformerLayer", 0))

# %% [markdown]
# ## 2. Every version, one slider
#
# Version 0 is the input graph; version *k* is the graph after pass *k*. The `layers` view draws one
# box per transformer layer with its fusion status; `full` draws every op (scroll inside the box).

# %%
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
    view=widgets.ToggleButtons(options=["layers", "full"], value="layers"))

# %% tags=["version-input"]
display(show_version(0, "full"))

# %% [markdown]
# ## 3. The six `FusedTransformerLayer` matches
#
# A match binds **roles** to node ids of the graph the pass saw: `attn` (the FusedAttentionBlock),
# `ln1` (h1, the post-attention FusedResidualLN), `fc1`/`fc2` (the FFN's two FusedMatMulBiasActs), `ln2`,
# and operands such as `hidden` and the weights, which stay outside the fused node.

# %% tags=["ftl-matches"]
step = trace.step("fuse_transformer_layer")
core = ("attn", "ln1", "fc1", "fc2", "ln2", "hidden")
for m in step.matches:
    roles = ", ".join(f"{r}=%{m.bindings[r]} {step.before[m.bindings[r]].op.value}" for r in core)
    print(f"layer {m.layer}: -> %{m.fused}  {roles}")
print("FusedTransformerLayer matches:", len(step.matches))

# %%
teach.show_step(step, focus=3)

# %% [markdown]
# ### What `FusedTransformerLayer` is
#
# `FusedTransformerLayer` is a **graph-level macro op**: one node standing for a whole encoder layer
# (attention block, two residual norms, the FFN), so later passes, the drawings and the timing table see
# one layer as one thing. It is not one kernel. How it runs is the lowering's choice per device
# (`rlxviz/runtime/lowering.py`, `DEVICE_LOWERING`): on the **GPU** its decomposition is traced into
# **one `mx.compile`d function** per layer; on the **CPU** it runs its decomposition op by op (a compiled
# CPU layer ran its elementwise work on one thread and was slower in the recorded paired runs at MiniLM's
# full shape; section 5, "Fusion that does not pay", prints that record and measures it live at a class-sized
# shape, where the verdict may differ). The next cell reads this from the
# lowering for every fused op in the final graph.

# %% tags=["runs-as"]
from rlxviz import session

fused_ops = sorted(op for op in final_counts if op.startswith("Fused") or op == "ElementwiseRegion")
for op in fused_ops:
    cpu, gpu = session.runs_as(op, "cpu"), session.runs_as(op, "gpu")
    print(f"{op:<24} x{final_counts[op]:<3} cpu: {cpu:<28} gpu: {gpu}")

# %% [markdown]
# ## 4. Traffic each pass saves — ideal kernel vs executed program
#
# Per pass: bytes of intermediates an ideal one-kernel fused op would not write and read, and the part
# MLX's own lowering on each device would save (`session.executed_traffic_saved`, a **model** of MLX's
# kernels; it does not know rlxviz's own CPU kernels, so its `cpu B` column is MLX's lowering without them).
# The bytes the program run here really moves are read from MLX in the next section. Horizontal fusion
# (`fuse_shared_input_matmul`: Q, K and V read the same hidden state) removes **no** intermediate; it is
# credited with what it saves — reads of the shared input and kernel launches (`session.shared_input_saved`).

# %% tags=["traffic"]
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
      "B of", ftl.ideal.total, "B ideal")

# %% [markdown]
# ### What MLX runs, read from MLX
#
# The bytes above are a model of the kernels. MLX's own primitive count per version (`session.version_primitives`:
# each version lowered, called once, MLX's lazy graph read back; views excluded) is the honest story: how
# many primitives the backend dispatches per call, version by version — and, from the same graph, the bytes
# each call moves (each kernel's distinct inputs read once and outputs written once; `+ modelled` is the CPU
# `AddMM`'s bias pre-fill, a model kept apart). With rlxviz's CPU kernels built, the fused versions run them
# (`Rlxviz...` primitives, `docs/performance.md` section 0).

# %% tags=["primitives"]
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
print("rlxviz CPU kernels in the programs:", ", ".join(ours) or "none")

# %% tags=["primitives-read-aloud"]
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
    + (f", which runs rlxviz's own CPU kernels ({', '.join(ours)})." if ours else " (MLX's own lowering).")))

# %% [markdown]
# ### One fused op's kernels, on the CPU and on the GPU
#
# A fused op is a name in the graph; what runs is a list of MLX primitives. The next cell builds one
# `FusedMatMulBiasAct` (MiniLM's FFN input projection with its GELU, at this notebook's tokens) and reads
# from MLX the non-view primitives one call runs, in MLX's order: on the CPU with rlxviz's kernels (the
# default), on the CPU with MLX's own lowering, and on the GPU where MLX has one here. Without a GPU it
# says so: no list of the GPU's primitives was ever recorded for this op, so none is shown. A `Compiled(...)`
# kernel is one `mx.compile`d function; MLX names it after every primitive it fuses, shown here as those
# names with their counts (`Multiply x10`: ten multiplies inside that one kernel).

# %% tags=["op-kernels"]
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
          "recorded for this op (benchmarks/gpu_check.sh records timings only)")

# %% tags=["op-kernels-read-aloud"]
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
       "There is no GPU on this machine, so what the GPU runs is not shown: it was never recorded for this op.")))

# %% [markdown]
# ## 5. Timing every version
#
# Each distinct version runs on MLX, all versions **interleaved** round by round on one device (a busy
# machine slows them alike); versions a pass did not change are not re-timed. `vs oracle` compares MLX with
# the float64 NumPy oracle; `vs unfused` compares each version with the unfused graph on the **same** MLX
# device — what the rewrites changed.

# %% tags=["timing"]
print(teach.check_memory(trace.input, "minilm", "time"))  # the check `rlxviz time` makes; time_versions repeats it
rows = teach.time_versions(trace, feeds, model.weights, warmup=1, repeat=21, device="cpu", fresh=True,
                           source="minilm")
print("timed on:", rows[0].context)
print(teach.format_timings(rows))
print("versions timed:", sum(r.same_as is None for r in rows), "| all match the reference:",
      all(r.ok for r in rows if r.same_as is None))
worst = max((r for r in rows if r.same_as is None), key=lambda r: r.err_unfused)
print("largest error vs input on MLX:", f"{worst.err_unfused:.2e} ({worst.label}; each element is judged by "
      f"|fused - input| <= atol + rtol * |input|, {worst.policy.same_backend})")

# %% tags=["read-aloud"]
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
    f"saving on the CPU with {ftl.total} B."))

# %% [markdown]
# ### The same versions on a GPU, where MLX has one
#
# Where MLX has a GPU (Metal on Apple silicon, CUDA on Linux with `mlx-cuda`), the next cell times every
# version there too, with the same paired rounds; on a machine without one it says so and times nothing.
# On the GPU the lowering differs (`FusedTransformerLayer` is one `mx.compile`d function per layer; MLX's
# own kernels, not rlxviz's CPU ones), and a version's time is often set by how many kernels it launches
# (*overhead-bound*, section "Recorded" of notebook 01).

# %% tags=["gpu-timing"]
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
    print("no GPU for MLX on this machine: nothing timed here (Apple silicon, or Linux with mlx-cuda, has one)")

# %% [markdown]
# ### Fusion that does not pay: compiling a whole layer on the CPU
#
# On the GPU the lowering traces each `FusedTransformerLayer` into one `mx.compile`d function. On the CPU
# it does not, because there it did not pay (`docs/performance.md` sections 2 and 3). Why, from MLX's CPU
# backend (its source and its kernel cache, read for issue 12): `mx.compile` on the CPU writes C++ loops
# for the elementwise chains and builds them without `-march` (baseline x86-64), splits a chain at a depth
# and array limit and at every op that is not elementwise, and runs each compiled kernel on **one thread**
# of one stream, while the op-by-op lowering splits GELU and the softmax by rows over one CPU stream per
# core. The matmuls, most of a layer's time, are the same BLAS calls either way, so compiling can only
# change the elementwise part, and it serializes it.
#
# The next cell measures it here, on the final MiniLM version at batch 4, seq 32 (small enough for a class,
# with a batch the op-by-op lowering can split over streams): MLX's lowering op by op, each layer compiled,
# the whole graph compiled, and the default (rlxviz's CPU kernels), timed **together** in paired rounds
# (`session.time_lowerings`; the same statistics as the timing table: `session.paired_verdict`, each
# lowering against MLX's op-by-op one). It also prints, as recorded data, the figures measured at MiniLM's
# full shape (batch 8, seq 128), where a run takes about a minute (`benchmarks/bench_compile_layers.py`).

# %% tags=["compile-layer"]
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
print(f"{'lowering':<{w}}  {'median ms':>9}  {'min ms':>7}  {'kernels':>7}  {'compiled':>8}  {'max diff':>8}  "
      f"{'IQR ms':>7}")
for r, p in zip(low_rows, low_progs, strict=True):
    print(f"{r.label:<{w}}  {r.median_ms:>9.2f}  {r.min_ms:>7.2f}  {p.kernels:>7}  {p.compiled:>8}  "
          f"{r.err_unfused:>8.1e}  {r.iqr_ms:>7.2f}")
low_verdicts = [session.paired_verdict(low_rows[0], r) for r in low_rows[1:]]  # each against op by op
for r, v in zip(low_rows[1:], low_verdicts, strict=True):
    print(f"lowering verdict {r.label}: {v.words} (vs {low_rows[0].label}; ratio {v.ratio:.3f}, 95% CI "
          f"{v.low:.3f}..{v.high:.3f})")
for what, (compiled_ms, plain_ms) in RECORDED_COMPILE.items():
    print(f"RECORDED, not measured here: {what}: {compiled_ms} vs {plain_ms} ms "
          f"({compiled_ms / plain_ms:.2f}x slower)")
print("RECORDED, not measured here (2026-12-02, batch 8, seq 128):", RECORDED_PAIRED)

# %% tags=["compile-layer-read-aloud"]
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
      "GPU: a fusion pays only where the backend runs the fused code better than the pieces."))

# %% [markdown]
# ### Numerics of the fused versions
#
# A fusion is valid when it computes the same function; it need not give the same **bits**. Three sources,
# each measured by the next cell on this model and this machine (nothing below is typed in):
#
# * **reassociation**: `fuse_sdpa` folds the scores' scale `1/sqrt(d)` into one multiply where the model
#   divided (`docs/passes.md`: valid up to rounding). The float32 NumPy reference executor shows it alone:
#   every other pass computes the same ops in the same order there;
# * **fast-math transcendentals**: the CPU lowering computes `erf`/`exp`/`tanh` with rational and polynomial
#   formulas (`rlxviz/runtime/fast.py`, also inside rlxviz's CPU kernels), not libm's;
# * **`mx.addmm`**: the bias enters the GEMM's accumulation, so it can round differently from a matmul
#   followed by an add; measured below in float32 and in bfloat16 (`session.addmm_rounding`).

# %% tags=["numerics"]
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
          f"({a.ulps:.0f} ulp at the largest output)")

# %% tags=["numerics-read-aloud"]
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
display(Markdown(" ".join(lines)))

# %% [markdown]
# ## 6. Order matters
#
# `fuse_transformer_layer` does not look for primitives: it matches the **outputs of other passes**
# (`FusedAttentionBlock`, `FusedResidualLN`, `FusedMatMulBiasAct`), anchored on attention ops.
#
# Run it truly first and it says nothing at all: a Hugging Face graph has no `attention` op before
# `fuse_sdpa` packs one, so there is no anchor — no match and no rejection. A silent pass is the
# hardest kind to debug.

# %% tags=["order-silent"]
rest = [p for p in CANONICAL_ORDER if p != "fuse_transformer_layer"]
silent = Pipeline(["fuse_transformer_layer", *rest], name="layer-pass-first").run(model.graph)
s0 = silent.steps[0]
print(f"{s0.pass_name} first: {len(s0.matches)} matches, {len(s0.rejections)} rejections; "
      f"fused layers at the end: {silent.final.op_counts().get('FusedTransformerLayer', 0)}")

# %% [markdown]
# Now run it right after `fuse_sdpa`: it finds the six packed `attention` ops and rejects every one at
# the structure step `attn_is_fused_block`, with the hint to run `fuse_attention_block` first.

# %% tags=["order"]
rest = [p for p in CANONICAL_ORDER if p not in ("fuse_sdpa", "fuse_transformer_layer")]
early = Pipeline(["fuse_sdpa", "fuse_transformer_layer", *rest], name="layer-pass-early").run(model.graph)
first = early.step("fuse_transformer_layer")
print(f"{first.pass_name} after fuse_sdpa: {len(first.matches)} matches, {len(first.rejections)} rejections")
for r in first.rejections:
    print(f"  layer {r.layer}: {r.guard}: {r.message}")
print("fused layers:", early.final.op_counts().get("FusedTransformerLayer", 0))
print(teach.check_fusion(early, "minilm", [0]).render())

# %%
teach.show_step(first, focus=0)

# %% [markdown]
# The fix is in the pipeline, not the model: run the layer pass **after** its prerequisites (the
# canonical order), or run it again at the end. `rlxviz explain minilm --pipeline <passes>` prints
# the same report from a shell and exits 1, so CI can fail when a model stops fusing.

# %% [markdown]
# ## 7. Profitability: why RLX gates attention fusion at 64 tokens
#
# RLX fuses an attention block only when batch*seq <= 64 (`RLX_FUSE_ATTN_THRESHOLD`, docs/rlx.md §2.3.2
# and §2.5). The reason (`docs/passes.md`): RLX's fused CPU kernel pays only while one block's working set
# stays in cache; above that its separate kernels do as well or better. rlxviz has the same gate as a **guard
# of kind *not profitable***,
# `attention_size_gate`, reading the pipeline parameter `fab_max_tokens` (the `rlx` profile sets 64; the
# canonical profile has no gate). Nothing is wrong with the fusion when it says no — it is legal and
# recognized; a cost model decided.
#
# The next cell runs the canonical pipeline with the gate at 64 on MiniLM at 16 tokens and at 2 x 128 =
# 256 tokens, and computes what the fusion would save: the intermediates an ideal fused attention block
# keeps out of memory, and what the traffic model of MLX's own lowering says it saves
# (`session.executed_traffic_saved`; what the program really moves is read from MLX in the cell after next).

# %% tags=["gate"]
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
      ", ".join(f"{d}: {session.runs_as('FusedAttentionBlock', d)}" for d in ("cpu", "gpu")))

# %% [markdown]
# What the numbers say: the ideal saving grows with the tokens (16 times the tokens, 16 times the bytes:
# the QKV projection and the attention output are per token), so a fused kernel that keeps them in cache
# stops paying at some size; RLX put that size at 64 tokens for its CPU kernel. But MLX runs
# `FusedAttentionBlock` as its decomposition on both devices (printed above), and the model of MLX's
# own kernels finds nothing it saves at either size: on MLX the gate has no saving to weigh. (On the CPU the
# attention inside the block is already rlxviz's `RlxvizAttention` kernel once `fuse_sdpa` packed it, so
# the block pass adds no kernel.) The next cell checks this against MLX: it reads the bytes the two
# programs move and times them on bert-tiny (2 layers, so the cell takes seconds): the version before
# `fuse_attention_block` against the one after, interleaved rounds, at 16 and 256 tokens.

# %% tags=["gate-timing"]
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
          f"MLX: {read_saving[label]} B; error vs unfused {t[1].err_unfused:.1e}")

# %% tags=["gate-read-aloud"]
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
      "rejection says *not profitable*, not *illegal*."))


# %% [markdown]
# ## Exercise: what does horizontal fusion save?
#
# `fuse_shared_input_matmul` merged, in each of the 6 layers, the Q, K and V projections that read the same
# hidden state `[1, 16, 384]` float32 into one matmul. The graph gets *more* nodes, not fewer (the op-count
# change printed in section 1): the weights and the biases are joined by `concat`s, and `narrow`s split the
# merged output back into Q, K and V — the merge saves reads and launches, not nodes. Give `(bytes, launches)`
# it saves for the whole
# model: bytes of reads of the shared input no longer made, and kernel launches per call no longer made
# (the `concat`s run once per set of weights, the `narrow`s are views). The check compares with MLX's own
# primitive count of the two versions and tells you what is off. Solution: `notebooks/solutions.py` (`ex02`),
# run by the collapsed cell below.

# %% tags=["exercise"]
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
teach.feedback(check_ex02, ex02_answer);

# %% collapsed=true jupyter={"source_hidden": true} tags=["solution"]
import solutions

teach.feedback(check_ex02, solutions.ex02());
