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
# # 06 — A multi-output fusion: the pre-LN residual norm
#
# In notebook 05, 4 of GPT-2's 5 LayerNorms did not fuse with their residual add: guard `sum_single_user`,
# kind *illegal*. In a pre-LN layer the residual sum `h = x + sublayer(...)` has two readers — the next
# norm and the next residual add — and `fuse_residual_ln` builds only the single-output `FusedResidualLN`,
# which returns the normalized value alone, so fusing would take `h` away from the add. The op has a
# **two-output** form, `with_sum=true`, that returns the sum too; no product rule builds it, and the fix the
# product names is a rule that does. ONNX Runtime's `SkipLayerNormalization` has an optional output for the
# sum (notebook 05 shows ONNX Runtime's transformer optimizer using it on this very model); for RMSNorm,
# vLLM's `fused_add_rms_norm` writes the sum back in place.
#
# In this notebook you will
#
# 1. read the refusal again, from the product,
# 2. see how this IR says "two outputs" (one value per node: the outputs are **packed**, then read back
#    by `narrow`s) and how a rule declares it (`Rule(outputs=...)`),
# 3. **write the rule** that makes GPT-2's pre-LN norms fuse, checked as notebook 04 checks (the
#    numbers, the verifier, the matcher's records),
# 4. see what MLX then runs — and why fusing more does not make the program smaller here.

# %% tags=["setup"]
# %load setup_cell.py

# %% [markdown]
# ## 1. The refusal, from the product
#
# GPT-2's ONNX export again (`tests/fixtures/onnx/gpt2.onnx`), the canonical pipeline, and every
# headline rejection of `fuse_residual_ln`:

# %% tags=["refusal"]
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
      f"({', '.join(m.path or 'ln_f' for m in rln.matches)}); refused: {len(refused)} of {n_norms} LayerNorms")

# %% [markdown]
# ## 2. Two outputs in a one-value IR
#
# Every node here has one value. A fused op with two outputs therefore returns them **packed on the
# last axis**: `FusedResidualLN(x, residual, gamma, beta, with_sum=True)` computes `s = x + residual`
# and gives `[LayerNorm(s), s]`, shape `[..., 2H]`; two `narrow` nodes read the halves back (the layout
# `fuse_shared_input_matmul` uses for Q, K and V). A rule declares it with `outputs`: the absorbed roles
# whose values the fused node *also* produces. The engine then
#
# * lets those roles keep readers outside the match (its generic `absorbed_escape` guard exempts them),
# * checks the packed type against the op's own type rule before rewriting (`fused_types`),
# * rewrites with `Rewriter.fuse_packed`: one fused node, one `narrow` per value, each reader redirected.
#
# A small pre-LN block, before and after a rule like the one you will write:

# %% tags=["demo"]
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
print(f"\n{fused.op.value}(with_sum={fused.attrs['with_sum']}) {list(fused.shape)} is read by",
      [f"%{u.id} narrow(start={u.attrs['start']}, length={u.attrs['length']})" for u in demo.after.users(fused.id)])

# %% [markdown]
# ## 3. Exercise: the two-output rule
#
# Write a pass `fuse_residual_ln_two_outputs` with one rule:
#
# * **anchor**: `P(Op.LAYER_NORM, P(Op.ADD, P.var("x"), P.var("residual"), name="sum"), P.var("gamma"),
#   P.var("beta"), name="norm")`;
# * **steps**:
#   1. *not a candidate* (return `QUIET`) when the sum has no reader besides the norm and is not a graph
#      output: the single-output `fuse_residual_ln` takes those, and packing a sum nobody reads would
#      only copy it (a step function with `@reports(reads=("sum", "norm"))`; `c.users("sum")` lists the
#      sum's readers, `c.graph.is_output(c.id("sum"))` says whether it is an output);
#   2. `same_shape("x", "residual", "residual_same_shape")`: a broadcast add (a bias) is not a residual;
# * **rewrite**: `result="norm"`, `outputs=("sum",)`, `absorb=("sum", "norm")`,
#   `build=lambda c: (Op.FUSED_RESIDUAL_LN, [x, residual, gamma, beta ids], {"eps": c["norm"].attrs["eps"],
#   "with_sum": True})`.
#
# **Validity condition** (write it in your rule's `doc`): the fused op computes `s = x + residual` and
# `LayerNorm(s)` with the matched `eps`, the same ops in the same order, and returns `s` itself, so every
# reader of the sum and of the norm gets the same bits — the check demands outputs equal to the last bit
# on the NumPy reference executor.
#
# The check runs your pass right after `fuse_residual_ln` in the canonical pipeline on GPT-2, runs the
# verifier, compares the numbers, reads the matcher's records, and tries two more graphs: a post-LN
# BERT (`bert-tiny`), where nothing should change, and a norm reading a bias add.

# %% tags=["exercise"]
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
teach.feedback(check_ex06, my_two_output);

# %% collapsed=true jupyter={"source_hidden": true} tags=["solution"]
teach.feedback(check_ex06, solutions.ex06());

# %% [markdown]
# ## 4. What the product says now, and what MLX runs
#
# With the solution's pass in the pipeline, GPT-2's norms are all fused. Count two things: the graph's
# ops (the `narrow`s that read the packed values are ops too), and what MLX runs —
# `session.version_primitives` lowers each version and lists MLX's own primitives (views — reshapes,
# slices — counted apart).

# %% tags=["after"]
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
          f"{p.program.kernels:>4}  {kernels}")

# %% tags=["after-read-aloud"]
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
    "lowering to keep the two outputs apart, as ONNX Runtime's `SkipLayerNormalization` kernel does (and "
    "vLLM's `fused_add_rms_norm` for RMSNorm)."))

# %% [markdown]
# ## Try it
#
# Pick a model and a pipeline; the cell prints the norms fused and whether the numbers held (the output
# under the cell before the control is a static copy, for exports). Your rule is for LayerNorm, so LLaMA's
# pre-LN RMSNorms stay unfused (pick it: only the norm the product's single-output rule takes fuses).
# `FusedResidualRmsNorm` takes `with_sum` too; its twin rule is a next exercise
# (LLaMA's norm has no beta: `fuse_residual_rms_norm.residual_no_beta` shows how to give it a zero one).

# %%
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
                            pipeline=widgets.Dropdown(options=list(PIPES), value="with two-output"))
