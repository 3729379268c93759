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
# # 03 — Why did my layer not fuse?
#
# Each **teaching variant** changes one thing in layer 0 of a 2-layer BERT (bert-tiny), so layer 1 is
# a fused sibling to compare with — except `over_threshold`, a pipeline gate on the token count that
# applies to every layer (layer 1 does not fuse either: the table below says so). For each you will see the
# rejecting guard with actual vs required
# values, the drawing of the rejection, and **what kind of "no"** it is — the kind decides where the fix
# belongs:
#
# * *illegal*: fusing would change what the program computes or returns (an extra reader, a graph output
#   of a single-output op). Fix the model, or give the compiler an op that keeps the value.
# * *not recognized*: a pattern limit — the computation could be fused, but no rule takes this form
#   (operand order, an activation off the allow-list). The fix is in the compiler, not the model.
# * *not profitable*: a gate or cost test said no. Nothing is wrong; change the gate if a measurement
#   says the fusion pays (notebook 02 measures the 64-token gate).
#
# An exercise closes the notebook; notebook 04 writes the compiler fixes.

# %% tags=["setup"]
# %load setup_cell.py

# %%
for name, what in teach.TEACHING_CASES.items():
    print(f"{name:<20} {what}")

# %% tags=["all-cases"]
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


def refusal(trace, st):
    """The layer's first counted refusal, else the refusal illegal for it (a layer fused as far as legal), else the
    refusal at a gap in rlxviz's ops (tanh_gelu: fused as far as rlxviz's ops go), else None."""
    gap = next((r for r in trace.rejections if st.gaps and r.layer == 0 and r.headline
                and r.guard == st.gaps[0].by), None)
    return st.first or next(iter(st.illegal), None) or gap


results = {case: analyze(case) for case in teach.TEACHING_CASES}
for case, (_, trace, st) in results.items():
    sibling = teach.layer_status(trace, 1)
    o = refusal(trace, st)
    guard, kind = (o.guard, o.kind) if o else ("-", "-")
    print(f"{case:<20} layer 0: {st.status:<21} guard={guard:<22} kind={kind:<15} layer 1: {sibling.status}")

# %% [markdown]
# ## Explore one case
#
# The report names the **first** rejecting guard in pipeline order, its message (actual vs required),
# the fix, and the difference from layer 1 where the same rule fused. The drawing is the graph the
# rejecting pass saw, focused on layer 0, with the rejection marked (offending nodes and edges).

# %%
from rlxviz.viz import Overlay


def explore(case="dead_h1_user"):
    _, trace, st = results[case]
    print(st.render())
    if refusal(trace, st) is None:  # nothing rejected in layer 0 (swapped_residual: add is commutative)
        return
    step = trace.step(refusal(trace, st).pass_name)
    display(teach.show(step.before, Overlay.before(step), focus=0, max_height=480))


controls = widgets.interact(explore, case=widgets.Dropdown(options=list(teach.TEACHING_CASES),
                                                          value="dead_h1_user"))

# %% tags=["one-case"]
explore("tanh_gelu")

# %% [markdown]
# ## How to fix it: the kind of "no" decides where
#
# The product's own output for every case: the kind of the first rejection, the fix it suggests for the
# model (`fix`) and the fix in the compiler (`compiler fix`), when there is one.

# %% tags=["kinds"]
for case, (_, trace, st) in results.items():
    o = refusal(trace, st)
    if o is None:
        how = trace.step("fuse_transformer_layer").matches[0].rule
        print(f"{case}: fused ({how}; the residual add is accepted in either order: add is commutative)")
        continue
    # illegal for the layer (fused as far as legal), or a gap in rlxviz's ops (no model change keeps its numbers)
    note = ("" if st.first else f" (illegal here: layer 0 is {st.status})" if st.illegal
            else f", a gap in rlxviz's ops: {st.gaps[0].form}")
    print(f"{case}: {o.guard} [{o.kind}]{note}")
    print(f"    fix:          {o.hint or '-'}")
    print(f"    compiler fix: {o.fix or '-'}")

# %% [markdown]
# Read per kind:
#
# * **extra_h1_user** — *illegal* for a single-output op: h1 has a third reader (a probe returned as an
#   output), and a one-output layer op would no longer produce h1. Dead-code elimination does **not** fix it:
#   the probe is a graph output, so it is live. No change to the model that keeps what it returns makes the
#   layer op legal, so the layer is **fused as far as legal** (its parts fused, no near-miss), as a probe of the
#   residual sum would be. The fix is in the compiler, **multi-output fusion** — a layer op that also returns h1
#   as a second output, which the probe then reads (the engine can express it, `Rule(outputs=...)`, and
#   notebook 06 writes a two-output residual norm; no product rule builds a two-output layer op).
# * **dead_h1_user** — the same probe, returned by nothing (as if the probe output were dropped): it is dead,
#   and a dead reader is **not a user**: no output depends on what it reads. The guard `h1_user_count` still
#   counts it (it counts readers, live or not) — a limit of the guard, not a reason; the canonical order
#   removes dead code only *after* the layer pass, so run `dead_code_elimination` first: a fix in the model
#   that keeps every output, so the layer is a near-miss (NOT fused). The cell after the layer rule's steps
#   (below) runs all three.
# * **tanh_gelu** — *not recognized*: the FFN is fused without its activation, because `gelu_tanh` is not
#   on the epilogue allow-list. Switching the model to exact GELU would fuse, but it changes the model:
#   the cell after that measures by how much. So there is nothing in the model to change: the refusal is a
#   **gap in rlxviz's ops** (`rlxviz's ops lack: FusedTransformerLayer with a gelu_tanh epilogue`), the layer
#   is "fused as far as rlxviz's ops go" and `rlxviz explain` exits 0. (SiLU is on the allow-list too, but it is
#   another activation, not a form of GELU: the product's hint names exact GELU only.) The compiler fix is the
#   allow-list (notebook 04 writes the epilogue rule).
# * **swapped_residual** — fuses: the layer rule accepts either operand order. RLX's strict rule rejects
#   it (*not recognized*); notebook 04 rebuilds that rule and fixes it with a canonicalization pass.
# * **pre_ln** — **two** blockers, so it is not expected to become `FusedTransformerLayer`. First (*not
#   recognized*, the guard printed above): the layer rule matches a **post-LN** layer only (its step
#   `post_ln_order`); a pre-LN layer (norm -> sublayer -> add) is another op, which no rule here builds. It is
#   the variant's change, so the verdict names it first although `fuse_residual_ln` refused earlier in the
#   pipeline (the verdict's first rejection of a layer that deviates from its siblings is the refusal of the
#   product its siblings' kind expects and its own does not). Second, a consequence of that layout (*illegal*
#   for a single-output op, printed below): the residual sum feeds the norm and the next residual, and a
#   one-output `FusedResidualLN` would hide it; a rule that builds the op's two-output form
#   (`with_sum=true`, as ONNX Runtime's `SkipLayerNormalization` returns the sum) fixes that one — notebook 06
#   writes that rule. (The status line of `pre_ln` in the explorer above says *expected
#   FusedTransformerLayer* only because its sibling layer 1 is post-LN and fuses.)
# * **output_intermediate** — *illegal* for a single-output op: h1 is returned, and a one-output layer op
#   would hide it: fused as far as legal. A caller that does not need h1 can stop returning it (the exercise
#   below; that changes what the model returns); in the compiler, a layer op with h1 as a second output would
#   do (no rule builds one).
# * **over_threshold** — *not profitable*: RLX's 64-token attention gate. A pipeline parameter; notebook
#   02 measures whether the gate pays on MLX.
#
# None of these is *illegal* in the strong sense — a rewrite into the product's op that would change the
# numbers whatever kernel that op had. The section *The truly illegal case* below shows one that is.

# %% tags=["pre-ln-second"]
from rlxviz.passes.rules.layer import LAYER

print("layer rule steps:", ", ".join(LAYER.guard_kinds))
print("post_ln_order kind:", LAYER.guard_kinds["post_ln_order"])
_, pre_trace, _ = results["pre_ln"]
second = [r for r in pre_trace.step("fuse_residual_ln").rejections
          if r.headline and r.path.startswith("encoder.layer.0")]
for r in second:
    print(f"pre_ln layer 0, fuse_residual_ln: {r.guard} ({r.kind}): {r.message}")

# %% tags=["fix-model"]
from rlxviz.passes import CANONICAL_ORDER

model, _, _ = results["extra_h1_user"]
dce_only = Pipeline(["dead_code_elimination", *CANONICAL_ORDER]).run(model.graph)
fixed_graph = model.graph.with_outputs(model.graph.outputs[:1])  # drop the probe output: dead_h1_user
before_dce = Pipeline.canonical().run(fixed_graph)
with_dce_first = Pipeline(["dead_code_elimination", *CANONICAL_ORDER]).run(fixed_graph)
print("dead_code_elimination first, probe still returned:", refusal(dce_only, teach.layer_status(dce_only, 0)).guard)
print("probe output dropped, canonical order:", teach.layer_status(before_dce, 0).first.guard)
print("... and dead_code_elimination first: fused layers =",
      with_dce_first.final.op_counts().get("FusedTransformerLayer", 0))

# %% tags=["tanh-cost"]
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
      f"{max(float(np.abs(a - b).max()) for a, b in zip(*outs)):.2e}")

# %% [markdown]
# ### The truly illegal case: eps outside the square root
#
# A hand-written norm `(x - mean) / (sqrt(var) + eps)` looks like LayerNorm, but LayerNorm computes
# `(x - mean) / sqrt(var + eps)`. Rewriting one into the other changes the numbers — most where the
# variance is small — so no compiler may rewrite it into `layer_norm`, whatever kernel `layer_norm` has:
# `canonicalize_norm` refuses it (`eps_inside_sqrt`, kind *illegal*). The cell builds both forms and
# measures the difference. Nothing in the model is wrong either: what a compiler could add is *another*
# op, a norm that computes `sqrt(var) + eps` itself. rlxviz has none, so `rlxviz explain` reads this
# refusal as a gap in rlxviz's ops ("rlxviz lacks std + eps (eps outside the sqrt) as a norm op: a
# compiler fix, nothing in the model to change"): illegal as this rewrite, a new op as the fix.

# %% tags=["eps-outside"]
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
print(f"inside vs outside, x of std 1e-3: largest difference {float(np.abs(a - b_).max()):.3f}")

# %% tags=["fix-pipeline"]
model, _, _ = results[teach.OVER_THRESHOLD]
ungated = Pipeline.rlx(fab_max_tokens=None).run(model.graph)
print("rlx profile with the gate unset: fused layers =", ungated.final.op_counts().get("FusedTransformerLayer", 0))

# %% [markdown]
# ## Exercise
#
# In `output_intermediate`, h1 (layer 0's post-attention LayerNorm) is also returned as a graph output:
# fusing the layer would hide a tensor the caller asked for, so `h1_not_output` says the fusion is
# *illegal*. Without changing the pipeline, make layer 0 fuse **by editing the IR text**: return only
# the model's first output (the return line, `return %a, %b`, is the one just before the closing `}`), parse
# the text back with
# `parse_ir`, and run the canonical pipeline. Fill in `fix_ir` below.

# %% tags=["exercise"]
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
    trace = Pipeline.canonical().run(g)
    st = teach.layer_status(trace, 0)
    assert st.fused_node is not None, f"layer 0 is still no FusedTransformerLayer: guard {refusal(trace, st).guard}"
    return "layer 0 fuses: h1 is an ordinary intermediate again"


def fix_ir(text):
    # YOUR CODE: return the text with only the first graph output returned
    return text


teach.feedback(check_ex03, fix_ir);

# %% [markdown]
# ### Solution
#
# In `notebooks/solutions.py` (`ex03`); the collapsed cell below runs it through the same check.

# %% collapsed=true jupyter={"source_hidden": true} tags=["solution"]
import solutions

teach.feedback(check_ex03, solutions.ex03);
