"""Advice is checked, not written (issue 38): every fix line `explain` prints is applied as a what-if on the user's
graph and printed only when the numbers stay the unfused original's and the fusion then happens.

The Done-when sweep (`test_every_printed_fix_is_a_checked_what_if`, slow) runs every handed case (tests/data/cases,
copied from ../shared/cases, and tests/data/diag, tests/data/epilogue), every preset (with the teaching variants) and
every ONNX fixture (tests/fixtures/onnx and the handed ONNX cases) and of the zoo one file per architecture that
covers every export form (`zoo_sample`: 56 of 138; every zoo file with `RLXVIZ_SWEEP=all`); a fast sample of the
same check runs unmarked. The check re-does each what-if here (its own reference runs and its own count of fusions),
so it does not take `session.advice`'s word for it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from clirun import file_inputs
from zoo_sample import zoo_files

from rlxviz.cli import main
from rlxviz.ir import Builder, Graph, Op, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.passes.guard import COMPILER_ONLY, IN_MODEL, NO_MODEL_FIX, UNCHECKED_FIX
from rlxviz.passes.trace import Trace, layer_of
from rlxviz.passes.whatif import MODEL, PIPELINE, STATEMENT, fix_form, remove_dead_readers, what_if
from rlxviz.runtime import run_reference
from rlxviz.runtime.battery import battery
from rlxviz.runtime.compare import close
from rlxviz.runtime.precision import Tolerance, precision_policy
from rlxviz.session import check_fusion, load
from rlxviz.session.advice import (
    CHANGES_NUMBERS,
    CHECKED,
    NO_WHAT_IF,
    NOT_A_CHANGE,
    NOT_RUN,
    check_fixes,
    printed_refusals,
    vetted,
)

sys.path.insert(0, str(Path(__file__).parent))
from test_model_fixes import probed  # noqa: E402

TESTS = Path(__file__).parent
EXACT = Tolerance(1e-9, 1e-9)


def _fused(trace: Trace, rule: str, layer: int | None) -> int:
    return sum(1 for m in trace.matches if m.rule == rule and layer_of(m.path) == layer)


def _refused(trace: Trace, rule: str, guard: str, layer: int | None) -> int:
    return sum(1 for r in trace.rejections if r.rule == rule and r.guard == guard and layer_of(r.path) == layer)


def _numbers_kept(original: Graph, changed: Graph, fused: Graph, feeds, weights, rounded: bool = False) -> bool:
    """The what-if model (float64, to 1e-9; to the same-backend tolerance when its constants are `rounded`,
    `WhatIf.rounded`) and its fused graph (same-backend tolerance) give the original's outputs on random, fully masked
    and left-padded inputs."""
    tol = precision_policy(original, "cpu").same_backend
    exact = tol if rounded else EXACT
    for s in battery(original, feeds, kinds=("random", "fully_masked_row", "left_padding")).sets:
        with np.errstate(all="ignore"):
            want64 = run_reference(original, s.feeds, weights, float_dtype=np.float64)
            want = run_reference(original, s.feeds, weights)
            got64 = run_reference(changed, s.feeds, weights, float_dtype=np.float64)
            got = run_reference(fused, s.feeds, weights)
        if len(got64) != len(want64) or not close(got64, want64, exact, same_nonfinite=True):
            return False
        if not close(got, want, tol, same_nonfinite=True):
            return False
    return True


def explain_fixes(graph: Graph, weights, feeds, name: str = "m", pipeline: Pipeline | None = None):
    """(trace, check, fix checks, the check `explain` prints) as `rlxviz explain` makes them."""
    trace = (pipeline or Pipeline.canonical()).run(graph)
    check = check_fusion(trace, name)
    fixes = check_fixes(trace, check, feeds, weights)
    shown = check_fusion(vetted(trace, fixes), name) if not all(f.ok for f in fixes) else check
    return trace, check, fixes, shown


def assert_advice_checked(graph: Graph, weights, feeds, name: str = "m", pipeline: Pipeline | None = None) -> list:
    """The Done-when check on one graph: every fix `explain` prints is a statement (no change proposed) or a what-if
    that keeps the numbers and makes the fusion happen, re-done here; every other fix line became `none in the model:
    ...` (the rule declared no change keeps the numbers) or `no checked fix in the model: ...` (the rule proposed one,
    which the check refutes) with a compiler fix. Returns the fix checks."""
    trace, check, fixes, shown = explain_fixes(graph, weights, feeds, name, pipeline)
    refusals = printed_refusals(trace, check)
    assert len(refusals) == len(fixes)
    for (k, r), f in zip(refusals, fixes, strict=True):
        if f.status == NOT_A_CHANGE:
            continue
        if f.status == CHECKED:
            w = what_if(trace, k, r, f.fix)
            assert w is not None, f
            after = w.pipeline.run(w.graph)
            layer = layer_of(r.path)
            made = _fused(after, r.rule, layer) - _fused(trace, r.rule, layer)
            assert made > 0 or (r.soft and made >= 0 and _refused(after, r.rule, r.guard, layer)
                                < _refused(trace, r.rule, r.guard, layer)), f
            assert _numbers_kept(trace.input, w.graph, after.final, feeds, weights, w.rounded), f
            continue
        assert f.printed.startswith((NO_MODEL_FIX, UNCHECKED_FIX)), f
        assert f.printed.startswith(UNCHECKED_FIX) == (r.remedy in ("", IN_MODEL)), (f, r.remedy)
    # what is printed: every fix line is a statement or a checked fix; a withheld fix is a compiler fix
    text = shown.render()
    ok = {f.printed for f in fixes if f.ok}
    for ln in text.splitlines():
        t = ln.strip()
        if t.startswith("fix: "):
            line = t[len("fix: "):]
            assert fix_form(line) == STATEMENT or line in ok, (name, line)
    withheld = {(f.rule, f.anchor, f.guard) for f in fixes if not f.ok}
    for s in shown.layers:
        for o in [*([s.first] if s.first else []), *s.illegal]:
            if o.nodes and (o.rule, o.nodes[0], o.guard) in withheld:
                # the remedy is the rule's: a refuted proposal still counts, a declared `compiler only` is a gap
                assert o.fix and (o.hint.startswith(UNCHECKED_FIX) and o.remedy in ("", IN_MODEL)
                                  or o.hint.startswith(NO_MODEL_FIX) and o.remedy == COMPILER_ONLY), o
    return fixes


def _feeds_weights(g: Graph, seed: int = 0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for n in g.inputs:
        if n.dtype.is_float:
            feeds[n.name] = rng.standard_normal(n.shape).astype(n.dtype.numpy)
        else:
            feeds[n.name] = np.ones(n.shape, n.dtype.numpy)
    weights = {n.name: (0.3 * rng.standard_normal(n.shape)).astype(n.dtype.numpy) for n in g.params}
    return feeds, weights


# ------------------------------------------------------------------------------------------------ fix forms

@pytest.mark.parametrize("hint, form", [
    ("", STATEMENT),
    ("none in the model: h1 is graph output #1", STATEMENT),
    ("nothing to change in the model: the term is the model's own", STATEMENT),
    ("keep the model's activation: the fix is in the compiler", STATEMENT),
    ("fuse_residual_ln ran before but had no candidate here (its pattern did not match these nodes)", STATEMENT),
    ("raise or unset fab_max_tokens (the canonical profile has no gate)", PIPELINE),
    ("run fuse_matmul_bias_act first", PIPELINE),
    ("make h1 single-use (remove the dead reader)", MODEL),
    ("the block uses 1/sqrt(head_dim)", MODEL),
])
def test_fix_form(hint, form):
    assert fix_form(hint) == form


# ------------------------------------------------------------------------------------ a dead reader: checked

@pytest.mark.parametrize("on", ["sum1", "h1", "sum2"])
def test_dead_probe_fix_is_checked_and_printed(on):
    """A probe nothing returns (n4-15 with its output dropped, on three intermediates): the fix line proposes removing
    it; its what-if (dead nodes removed) fuses the layer with the same numbers, so the line is printed as written."""
    g = parse_ir(probed(on, returned=False))
    feeds, weights = _feeds_weights(g)
    fixes = assert_advice_checked(g, weights, feeds, "dead")
    assert fixes and all(f.status == CHECKED and f.printed == f.fix for f in fixes), fixes
    assert all("dead node" in f.what for f in fixes)
    trace, _, _, shown = explain_fixes(g, weights, feeds, "dead")
    assert not shown.ok and shown.render() == check_fusion(trace, "dead").render()  # nothing withheld, verdict same


def test_returned_probe_is_no_fix_and_nothing_dead_to_remove():
    """Control: the probe is returned (the case as handed): no fix line proposes anything, and there is no dead node
    for a what-if to remove."""
    g = parse_ir(probed())
    feeds, weights = _feeds_weights(g)
    fixes = assert_advice_checked(g, weights, feeds, "probe")
    assert all(f.status == NOT_A_CHANGE for f in fixes)
    assert remove_dead_readers(g) is None


# --------------------------------------------------------------------------------- a pipeline fix: checked

def test_size_gate_fix_is_checked_by_running_without_the_gate(capsys):
    code = main(["explain", "bert-tiny", "--variant", "over_threshold", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["fix_checks"]
    for f in doc["fix_checks"]:
        assert f["guard"] == "attention_size_gate" and f["form"] == PIPELINE and f["checked"] and f["printed_as_fix"]
        assert f["what_if"] == "the pipeline with fab_max_tokens unset" and "numbers equal" in f["detail"]


# ----------------------------------------------------------------- fixes that change the numbers: withheld

def _relu_ffn(act: str) -> Graph:
    """x -> linear -> act -> linear (an OPT-like ReLU FFN, or a tanh-GELU one)."""
    b = Builder("ffn")
    x = b.input("x", (2, 4, 8))
    h = b.linear(x, b.param("fc1.weight", (8, 16)), b.param("fc1.bias", (16,)))
    h = b.emit(Op.RELU if act == "relu" else Op.GELU_TANH, [h])
    b.output(b.linear(h, b.param("fc2.weight", (16, 8)), b.param("fc2.bias", (8,))))
    return b.build()


@pytest.mark.parametrize("make", [
    lambda: load("bert-tiny", 1, 16, None, "tanh_gelu", 0),
    lambda: load(str(TESTS / "data" / "epilogue" / "gelu-tanh-f16-cube.rlx")),
    lambda: _relu_ffn("relu"),
    lambda: _relu_ffn("gelu_tanh"),
], ids=["bert-tiny-tanh-gelu", "gelu-tanh-f16-cube", "relu-ffn", "tanh-gelu-op-ffn"])
def test_switching_the_activation_changes_the_numbers_so_it_is_no_fix(make):
    """"exact GELU fuses, but switching the model to it changes its numbers": the what-if switches the activation, the
    numbers differ, so the line is `none in the model: ... changes the model's numbers` and the compiler fix. The rule
    declares it (`compiler only`), so the refusal is a gap in rlxviz's ops, its switch still checked."""
    m = make()
    if isinstance(m, Graph):
        g, (feeds, weights) = m, _feeds_weights(m)
    else:
        g, feeds, weights = m.graph, m.random_feeds(0), m.weights
    fixes = assert_advice_checked(g, weights, feeds, "act")
    acts = [f for f in fixes if f.guard in ("epilogue_activation", "fc1_activation")]
    assert acts and all(f.status == CHANGES_NUMBERS for f in acts), fixes
    assert all("changes the model's numbers" in f.printed for f in acts)
    _, _, _, shown = explain_fixes(g, weights, feeds, "act")
    assert "fuses, but" not in "\n".join(ln for ln in shown.render().splitlines() if "fix:" in ln)


def test_a_fix_with_no_what_if_is_withheld_with_the_compiler_fix(capsys):
    """esm-like: the attention's scale is the model's (Q scaled by 0.5 before its RoPE, where fuse_sdpa cannot fold
    it); "the block uses 1/sqrt(head_dim)" is no change the project can apply and keep the numbers (no fold into the Q
    projection either: `scale_fold` leaves a scale it cannot fold alone), so explain prints the compiler fix as the
    fix. The verdict (exit 1, the guard, the kind) is unchanged: the check refutes the rule's proposal, not every
    change to the model, so the line says `no checked fix in the model`, never `none in the model` beside exit 1.
    (03e, whose Q pre-scale folds, once read so too: its fix is now the checked fold, `test_scale_fold`.)"""
    path = TESTS / "data" / "cases" / "esm-like-q-scaled-before-rope.rlx"
    code = main(["explain", str(path)])
    out = capsys.readouterr().out
    assert code == 1 and "guard default_scale (guard, not recognized)" in out
    assert "fix: the block uses 1/sqrt(head_dim)" not in out
    assert "fix: no checked fix in the model: none offered, as rlxviz has no what-if that applies a change" in out
    assert "fix: none in the model" not in out
    main(["explain", str(path), "--json"])
    (f,) = [f for f in json.loads(capsys.readouterr().out)["fix_checks"] if f["guard"] == "default_scale"]
    assert f["status"] == NO_WHAT_IF and not f["checked"] and f["proposed_fix"] == "the block uses 1/sqrt(head_dim)"
    assert f["fix"].startswith(UNCHECKED_FIX) and f["compiler_fix"]  # the lines the text prints


def test_vetting_changes_fix_lines_only():
    """Withholding a fix changes the refusal's hint and (when empty) compiler fix, never its remedy or the verdict
    (tanh-GELU's refusals are gaps in rlxviz's ops before and after: their rule declares them `compiler only`)."""
    m = load("bert-tiny", 1, 16, None, "tanh_gelu", 0)
    trace, check, fixes, shown = explain_fixes(m.graph, m.weights, m.random_feeds(0), "bert-tiny")
    assert any(not f.ok for f in fixes)
    assert shown.to_dict()["ok"] == check.to_dict()["ok"]
    assert [(s.layer, s.fused, s.first and s.first.guard, s.first and s.first.kind) for s in shown.layers] == \
        [(s.layer, s.fused, s.first and s.first.guard, s.first and s.first.kind) for s in check.layers]
    assert vetted(trace, [f for f in fixes if f.ok]) is trace


# ------------------------------------------------------------------------------------------- the sweep

def _handed() -> list[str]:
    return sorted(str(p) for d in ("cases", "diag", "epilogue") for p in (TESTS / "data" / d).glob("*.rlx")) + \
        sorted(str(p) for p in (TESTS / "data").glob("*.rlx"))


def _fixtures() -> list[str]:
    onnx = TESTS / "fixtures" / "onnx"
    return sorted(str(p) for p in [*onnx.glob("*.onnx"), *(onnx / "cases").glob("*.onnx"), *zoo_files()]
                  if p.stem != "minilm")  # minilm.onnx keeps its weights in a file not in the fixtures


PRESETS = ["bert-tiny:" + v for v in ("none", "output_intermediate", "extra_h1_user", "tanh_gelu", "pre_ln",
                                      "swapped_residual", "over_threshold")] + ["llama-block", "minilm-shaped"]
FAST = [str(TESTS / "data" / "cases" / n) for n in ("n4-15-residual-logged.rlx", "n4-06-deepnorm-residual.rlx",
                                                     "n3-08x-folded-bias-not-liftable.rlx")] + \
    [str(TESTS / "data" / "diag" / "07c-gqa-tile-expand.rlx"), "bert-tiny:extra_h1_user"]


def _check_source(src: str) -> None:
    name, variant = (src.split(":") + ["none"])[:2] if ":" in src and not src.startswith("/") else (src, "none")
    gate = 64 if variant == "over_threshold" else None
    seq = 65 if gate else 8
    m = load(name, 1, seq, None, variant, 0, None, gate, input_shapes=file_inputs(name).get("shapes"))
    pipe = Pipeline.canonical(**({"fab_max_tokens": gate} if gate else {}))
    assert_advice_checked(m.graph, m.weights, m.random_feeds(0), m.name, pipe)


@pytest.mark.parametrize("src", FAST, ids=[Path(s).name for s in FAST])
def test_printed_fixes_are_checked_sample(src):
    _check_source(src)


@pytest.mark.slow
@pytest.mark.sweep
@pytest.mark.parametrize("src", _handed() + PRESETS + _fixtures(), ids=lambda s: Path(s).name)
def test_every_printed_fix_is_a_checked_what_if(src):
    _check_source(src)


def test_past_the_budget_only_an_exact_what_if_is_printed():
    """With no budget for numbers, the dead-reader what-if (exact by construction) still passes on its fusion check;
    the activation switch (not exact) is withheld as unchecked, never printed as a fix."""
    g = parse_ir(probed(returned=False))
    feeds, weights = _feeds_weights(g)
    trace = Pipeline.canonical().run(g)
    fixes = check_fixes(trace, check_fusion(trace, "dead"), feeds, weights, budget_macs=0)
    assert fixes and all(f.status == CHECKED and "exact by construction" in f.detail for f in fixes)
    m = load("bert-tiny", 1, 16, None, "tanh_gelu", 0)
    trace = Pipeline.canonical().run(m.graph)
    fixes = check_fixes(trace, check_fusion(trace, "bert-tiny"), m.random_feeds(0), m.weights, budget_macs=0)
    acts = [f for f in fixes if f.guard in ("epilogue_activation", "fc1_activation")]
    assert acts and all(f.status == NOT_RUN and not f.ok for f in acts)
    assert all(f.printed.startswith(NO_MODEL_FIX) and "could not be checked" in f.printed for f in acts)


@pytest.mark.parametrize("case, status", [("esm-like-q-scaled-before-rope.rlx", NO_WHAT_IF),
                                          ("granite-like-scaled-rope.rlx", CHECKED)])
def test_json_and_verbose_carry_only_checked_fixes(capsys, case, status):
    """--json carries every rule's explanation per layer, and --verbose prints it: neither prints the unchecked
    "the block uses 1/sqrt(head_dim)" as a fix; granite-like's scale folds into its Q projection (checked), esm-like's
    (scaled before its RoPE) does not."""
    path = str(TESTS / "data" / "cases" / case)
    assert main(["explain", path, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    text = json.dumps(doc["layers"])
    folded = "fix: fold the scale into the Q projection" if status == CHECKED else "fix: no checked fix in the model"
    assert "fix: the block uses 1/sqrt(head_dim)" not in text and folded in text
    assert {f["status"] for f in doc["fix_checks"] if f["guard"] == "default_scale"} == {status}
    assert main(["explain", path, "--verbose"]) == 1
    out = capsys.readouterr().out
    assert "fix: the block uses 1/sqrt(head_dim)" not in out and "compiler fix: give FusedAttentionBlock a scale" in out
