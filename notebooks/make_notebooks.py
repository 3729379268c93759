"""Write the teaching notebooks (`01_...`, `02_...`, `03_...`) from this script, without outputs.

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
from IPython.display import HTML, display

import rlxviz
from rlxviz import teach
from rlxviz.runtime import blas_summary

print("python:", sys.executable)
print("rlxviz", rlxviz.__version__, "|", blas_summary())'''


def md(text: str) -> nbformat.NotebookNode:
    return new_markdown_cell(text.strip("\n"))


def code(text: str, tag: str | None = None) -> nbformat.NotebookNode:
    cell = new_code_cell(text.strip("\n"))
    if tag:
        cell.metadata["tags"] = [tag]
    return cell


# ------------------------------------------------------------------------------------------------- 01

NB01 = [
    md("""
# 01 — What is fusion?

A model is a graph of small operations. Run one at a time, every intermediate tensor is **written to
memory by one op and read back by the next**. *Fusion* replaces a chain of ops with one op that
computes the same values while keeping the intermediates in registers or cache.

In this notebook you will

1. build a small graph with the `Builder` and read its IR text,
2. run two fusion passes **one at a time** — `fuse_matmul_bias_act`, then `fuse_residual_ln` — and
   draw the graph before and after each,
3. count, from the graph itself, the bytes of intermediates that are no longer written and read,
4. time every version on MLX and check its error against the NumPy reference.

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

B, S, H, I = 2, 64, 128, 512
b = Builder("ffn_block")
x = b.input("x", (B, S, H))
with b.scope("ffn.fc1"):
    h = b.gelu(b.linear(x, b.param("ffn.fc1.weight", (H, I)), b.param("ffn.fc1.bias", (I,))))
with b.scope("ffn.fc2"):
    y = b.linear(h, b.param("ffn.fc2.weight", (I, H)), b.param("ffn.fc2.bias", (H,)))
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
### Memory traffic saved

An intermediate is an absorbed node whose every reader was absorbed too. Unfused, its tensor
(`node.nbytes` bytes) is written once and read once per user; fused, neither happens. The match's
*result* is still written by the fused node, so it does not count.
"""),
    code('''
saved1 = teach.traffic_saved(step1)
for node_id, op, nbytes, users in saved1.intermediates:
    print(f"  %{node_id:<3} {op:<8} {list(graph[node_id].shape)}  {nbytes:>8} B written, {users} read(s)")
print(saved1)
print("traffic saved by fuse_matmul_bias_act (bytes):", saved1.total)''', "traffic-fmba"),
    md("""
## 3. Second pass: `fuse_residual_ln`

`LayerNorm(a + b)` becomes `FusedResidualLN(a, b, gamma, beta)`. The operand order is kept exactly:
`x` is the add's first operand, `residual` its second (the transformer-layer fusion checks it later).
"""),
    code('''
trace2 = run_passes(step1.after, ["fuse_residual_ln"])
step2 = trace2.steps[0]
for m in step2.matches:
    print(f"{m.rule}: anchor %{m.anchor} -> %{m.fused}  roles {m.bindings}")
saved2 = teach.traffic_saved(step2)
print(saved2)
print("traffic saved by fuse_residual_ln (bytes):", saved2.total)
print(format_graph(step2.after))''', "step-rln"),
    code('''teach.show_step(step2)'''),
    md("""
## 4. Same numbers, less time?

Both passes in one pipeline, then every version timed on MLX (median of a few calls; the first call
includes building and compiling the program) and compared with the NumPy reference interpreter run
on the **unfused** graph. A fused version must give the same result within float32 rounding.
"""),
    code('''
import numpy as np

from rlxviz.models import random_weights

weights = random_weights(graph, seed=0)
feeds = {"x": np.random.default_rng(0).standard_normal((B, S, H)).astype(np.float32)}
both = run_passes(graph, ["fuse_matmul_bias_act", "fuse_residual_ln"])
rows = teach.time_versions(both, feeds, weights, warmup=1, repeat=5)
print(teach.format_timings(rows))
print("all versions match the reference:", all(r.ok for r in rows))''', "timing"),
    md("""
Timings on a small CPU graph are noisy; what does not move is the traffic: the fused graph writes and
reads fewer bytes, and on memory-bound hardware that is where fusion pays.
"""),
    md("""
## 5. Try it

Pick which passes run (in order) and see the resulting graph. Try `fuse_residual_ln` alone:
it still fires, because it does not depend on the first pass.
"""),
    code('''
def run_and_draw(passes):
    t = run_passes(graph, list(passes)) if passes else None
    g = t.final if t else graph
    total = sum(teach.traffic_saved(s).total for s in t.steps) if t else 0
    print(f"passes: {list(passes) or 'none'} -> {len(g.compute_nodes())} compute nodes, {total} bytes of "
          "intermediate traffic saved")
    display(teach.show(g))


controls = widgets.interact(run_and_draw, passes=widgets.SelectMultiple(
    options=["fuse_matmul_bias_act", "fuse_residual_ln"], value=["fuse_matmul_bias_act"], description="passes"))'''),
]

# ------------------------------------------------------------------------------------------------- 02

NB02 = [
    md("""
# 02 — Fusing a BERT layer

The real **all-MiniLM-L6-v2** (sentence-transformers, 6 layers, hidden 384) loaded from its
safetensors checkpoint as Hugging Face primitives, run through the whole canonical pipeline. You will

1. step through every graph version with a slider,
2. read the six `FusedTransformerLayer` matches and the role each node plays,
3. time every version on MLX against the NumPy reference,
4. learn why pass **order** matters by running the layer pass first and reading its rejections.
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

Eleven passes in a fixed order (`rlxviz passes` prints them with their guards). Each step records its
matches (fused) and rejections (near-misses, with the guard that said no).
"""),
    code('''
trace = Pipeline.canonical().run(model.graph)
print(f"{'#':>2}  {'pass':<26} {'matches':>7} {'rejections':>10} {'nodes after':>11}")
for i, s in enumerate(trace.steps, 1):
    print(f"{i:>2}  {s.pass_name:<26} {len(s.matches):>7} {len(s.rejections):>10} {len(s.after.compute_nodes()):>11}")
final_counts = trace.final.op_counts()
print("fused layers:", final_counts.get("FusedTransformerLayer", 0))''', "pipeline"),
    md("""
## 2. Every version, one slider

Version 0 is the input graph; version *k* is the graph after pass *k*. The `layers` view draws one
box per transformer layer with its fusion status; `full` draws every op (scroll inside the box).
"""),
    code('''
from rlxviz.viz import Overlay

versions = trace.versions()


def show_version(k=len(versions) - 1, view="layers"):
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
## 4. Timing every version

Each distinct version runs on MLX (versions a pass did not change are not re-timed). The error column
is the largest absolute difference from the NumPy reference of the unfused graph.
"""),
    code('''
rows = teach.time_versions(trace, feeds, model.weights, warmup=1, repeat=3)
print(teach.format_timings(rows))
print("versions timed:", sum(r.same_as is None for r in rows), "| all match the reference:",
      all(r.ok for r in rows if r.same_as is None))''', "timing"),
    md("""
## 5. Order matters

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
]

# ------------------------------------------------------------------------------------------------- 03

NB03 = [
    md("""
# 03 — Why did my layer not fuse?

Each **teaching variant** changes one thing in layer 0 of a 2-layer BERT (bert-tiny), so layer 1 is
a fused sibling to compare with. For each you will see the rejecting guard with actual vs required
values, the drawing of the rejection, and how to fix the model or the pipeline. An exercise closes
the notebook.
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
    guard = st.first.guard if st.first else "-"
    print(f"{case:<20} layer 0 fused={st.fused!s:<5} guard={guard:<22} layer 1 fused={sibling.fused}")''',
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
## How to fix it

| case | guard | fix the model | or fix the pipeline |
|---|---|---|---|
| output_intermediate | `h1_not_output` | do not return h1 | none: a fused layer cannot expose h1 |
| extra_h1_user | `h1_user_count` | remove the extra reader of h1 | run `dead_code_elimination` first (dead reader) |
| tanh_gelu | `fc1_activation` | exact (erf) GELU fuses, but changes the numbers | add gelu_tanh to the epilogue allow-list (a tanh-GELU epilogue kernel) |
| pre_ln | `sum_single_user`, then `post_ln_order` | — (a GPT/LLaMA-style block) | expected: sublayers still fuse |
| swapped_residual | none: it fuses | — | done: `fuse_transformer_layer` takes the residual add in either order (add is commutative) |
| over_threshold | `attention_size_gate` | — | raise or unset `fab_max_tokens` |

Two fixes, shown: the probe that reads h1 is only an extra graph output. Drop the output and the
probe is dead — but dead code is removed *after* the layer pass in the canonical order, so run
`dead_code_elimination` first too. And the size gate is a pipeline parameter.
"""),
    code('''
from rlxviz.passes import CANONICAL_ORDER

model, _, _ = results["extra_h1_user"]
fixed_graph = model.graph.with_outputs(model.graph.outputs[:1])  # the model fix: drop the probe output
before_dce = Pipeline.canonical().run(fixed_graph)
with_dce_first = Pipeline(["dead_code_elimination", *CANONICAL_ORDER]).run(fixed_graph)
print("probe output dropped, canonical order:", teach.layer_status(before_dce, 0).first.guard)
print("... and dead_code_elimination first: fused layers =",
      with_dce_first.final.op_counts().get("FusedTransformerLayer", 0))''', "fix-model"),
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
the model's first output (the last line of the text is `return %a, %b`), parse the text back with
`parse_ir`, and run the canonical pipeline. Fill in `fix_ir` below.
"""),
    code('''
from rlxviz.ir import format_graph, parse_ir

model, _, _ = results["output_intermediate"]
ir_text = format_graph(model.graph)


def fix_ir(text):
    # YOUR CODE: return the text with only the first graph output returned
    return text


attempt = Pipeline.canonical().run(parse_ir(fix_ir(ir_text)))
print("your fix: layer 0 fused =", teach.layer_status(attempt, 0).fused)''', "exercise"),
    md("""
### Solution

The return line looks like `return %71, %29`. Keep its first value: h1 is then an ordinary
intermediate with two readers (FFN.1 and the second residual), and the layer fuses.
"""),
    code('''
import re


def fix_ir_solution(text):
    return re.sub(r"^(\\s*return %\\w+)(, %\\w+)+", r"\\1", text, flags=re.MULTILINE)


solved = Pipeline.canonical().run(parse_ir(fix_ir_solution(ir_text)))
print("solution: layer 0 fused =", teach.layer_status(solved, 0).fused)
print("fused layers:", solved.final.op_counts().get("FusedTransformerLayer", 0))''', "solution"),
]

NOTEBOOKS = {
    "01_what_is_fusion.ipynb": NB01,
    "02_fusing_a_bert_layer.ipynb": NB02,
    "03_why_did_my_layer_not_fuse.ipynb": NB03,
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
