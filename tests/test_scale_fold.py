"""A non-default attention scale has a model-side fix (a newcomer found the old line misleading): Granite scales its
scores by 0.0625 where FusedAttentionBlock computes the default 1/sqrt(16) = 0.25, and `explain -v` said "none in the
model: no change to the model that keeps its numbers is known". Folding ratio = scale / default into the Q
projection's weight (and bias) and scaling the scores by the default is the same function (RoPE and the head split
are linear in Q); exact for a power-of-two ratio, else the same numbers up to rounding.

Decision: `rules.scale_fold` plans the fold on the user's graph; the pipeline words `default_scale`'s fix line from
it; the what-if `whatif.MODEL_WHAT_IFS["default_scale"]` applies it, so advice checks the numbers and the fusion; the
not-expected gap line and the headline name the workaround instead of "nothing in the model to change".
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from clirun import run as cli_run
from test_fix_whatif import _feeds_weights

from rlxviz.app.panels import op_gap_mark
from rlxviz.ir import Graph, Op, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.passes.guard import UNCHECKED_FIX
from rlxviz.passes.rules.scale_fold import scale_fold
from rlxviz.passes.trace import Trace
from rlxviz.passes.whatif import WhatIf, fused_more, what_if
from rlxviz.passes.why.places import places
from rlxviz.passes.why.text import GAP_HAS_A_WORKAROUND, GAP_IS_THE_COMPILERS, left_out_heading
from rlxviz.passes.why.verdict import OP_GAP_GROUP
from rlxviz.runtime import run_reference
from rlxviz.runtime.compare import close
from rlxviz.runtime.precision import Tolerance, precision_policy
from rlxviz.session import check_fusion, load
from rlxviz.session.advice import CHECKED, NO_WHAT_IF, check_fixes, checked_verdict

HERE = Path(__file__).parent
GRANITE = HERE / "fixtures" / "onnx" / "cases" / "granite.onnx"
PRESCALED = HERE / "data" / "cases" / "03e-wrong-factor.rlx"
EXACT = Tolerance(1e-12, 1e-12)


def _attention(heads: int, d: int, scale: str, squashed: bool = False) -> Graph:
    """One LLaMA-style attention (RoPE on the heads, written out; a keep mask), its scores scaled by `scale` (`mul
    0.1`, `div 8.0`); `squashed`: Q is tanh of its projection (no longer linear in it)."""
    return parse_ir(_attention_text(heads, d, scale, squashed))


def _attention_text(heads: int, d: int, scale: str, squashed: bool = False) -> str:
    """`_attention`'s IR text."""
    h, half = heads * d, d // 2
    op, value = scale.split()
    qk = f"[2, {heads}, 8, 8]"
    hd = f"[2, {heads}, 8, {d}]"
    squash = f"  %51 = tanh(%9) : f32[2, 8, {h}] @layers.0.self_attn\n" if squashed else ""
    q = "%51" if squashed else "%9"
    text = f"""graph scaled_attention {{
  %0 = input {{name="hidden_states"}} : f32[2, 8, {h}]
  %1 = input {{name="attention_mask"}} : i64[2, 8]
  %2 = cast(%1) {{dtype="f32"}} : f32[2, 8] @layers.0.self_attn
  %3 = const {{value=1.0}} : f32[] @layers.0.self_attn
  %4 = sub(%3, %2) : f32[2, 8] @layers.0.self_attn
  %5 = const {{value=-10000.0}} : f32[] @layers.0.self_attn
  %6 = mul(%4, %5) : f32[2, 8] @layers.0.self_attn
  %7 = reshape(%6) {{shape=[2, 1, 1, 8]}} : f32[2, 1, 1, 8] @layers.0.self_attn
  %8 = param {{name="q_proj.weight"}} : f32[{h}, {h}] @layers.0.self_attn.q_proj
  %9 = matmul(%0, %8) : f32[2, 8, {h}] @layers.0.self_attn.q_proj
  %10 = param {{name="k_proj.weight"}} : f32[{h}, {h}] @layers.0.self_attn.k_proj
  %11 = matmul(%0, %10) : f32[2, 8, {h}] @layers.0.self_attn.k_proj
  %12 = param {{name="v_proj.weight"}} : f32[{h}, {h}] @layers.0.self_attn.v_proj
  %13 = matmul(%0, %12) : f32[2, 8, {h}] @layers.0.self_attn.v_proj
  %14 = param {{name="rotary_emb.cos_cached"}} : f32[8, {half}] @layers.0.self_attn
  %15 = param {{name="rotary_emb.sin_cached"}} : f32[8, {half}] @layers.0.self_attn
  %16 = concat(%14, %14) {{axis=1}} : f32[8, {d}] @layers.0.self_attn
  %17 = reshape(%16) {{shape=[1, 1, 8, {d}]}} : f32[1, 1, 8, {d}] @layers.0.self_attn
  %18 = concat(%15, %15) {{axis=1}} : f32[8, {d}] @layers.0.self_attn
  %19 = reshape(%18) {{shape=[1, 1, 8, {d}]}} : f32[1, 1, 8, {d}] @layers.0.self_attn
{squash}  %20 = reshape({q}) {{shape=[2, 8, {heads}, {d}]}} : f32[2, 8, {heads}, {d}] @layers.0.self_attn
  %21 = transpose(%20) {{perm=[0, 2, 1, 3]}} : f32{hd} @layers.0.self_attn
  %22 = mul(%21, %17) : f32{hd} @layers.0.self_attn
  %23 = narrow(%21) {{axis=3, start=0, length={half}}} : f32[2, {heads}, 8, {half}] @layers.0.self_attn
  %24 = narrow(%21) {{axis=3, start={half}, length={half}}} : f32[2, {heads}, 8, {half}] @layers.0.self_attn
  %25 = neg(%24) : f32[2, {heads}, 8, {half}] @layers.0.self_attn
  %26 = concat(%25, %23) {{axis=3}} : f32{hd} @layers.0.self_attn
  %27 = mul(%26, %19) : f32{hd} @layers.0.self_attn
  %28 = add(%22, %27) : f32{hd} @layers.0.self_attn
  %29 = reshape(%11) {{shape=[2, 8, {heads}, {d}]}} : f32[2, 8, {heads}, {d}] @layers.0.self_attn
  %30 = transpose(%29) {{perm=[0, 2, 1, 3]}} : f32{hd} @layers.0.self_attn
  %31 = mul(%30, %17) : f32{hd} @layers.0.self_attn
  %32 = narrow(%30) {{axis=3, start=0, length={half}}} : f32[2, {heads}, 8, {half}] @layers.0.self_attn
  %33 = narrow(%30) {{axis=3, start={half}, length={half}}} : f32[2, {heads}, 8, {half}] @layers.0.self_attn
  %34 = neg(%33) : f32[2, {heads}, 8, {half}] @layers.0.self_attn
  %35 = concat(%34, %32) {{axis=3}} : f32{hd} @layers.0.self_attn
  %36 = mul(%35, %19) : f32{hd} @layers.0.self_attn
  %37 = add(%31, %36) : f32{hd} @layers.0.self_attn
  %38 = reshape(%13) {{shape=[2, 8, {heads}, {d}]}} : f32[2, 8, {heads}, {d}] @layers.0.self_attn
  %39 = transpose(%38) {{perm=[0, 2, 1, 3]}} : f32{hd} @layers.0.self_attn
  %40 = transpose(%37) {{perm=[0, 1, 3, 2]}} : f32[2, {heads}, {d}, 8] @layers.0.self_attn
  %41 = matmul(%28, %40) : f32{qk} @layers.0.self_attn
  %42 = const {{value={value}}} : f32[] @layers.0.self_attn
  %43 = {op}(%41, %42) : f32{qk} @layers.0.self_attn
  %44 = add(%43, %7) : f32{qk} @layers.0.self_attn
  %45 = softmax(%44) {{axis=-1}} : f32{qk} @layers.0.self_attn
  %46 = matmul(%45, %39) : f32{hd} @layers.0.self_attn
  %47 = transpose(%46) {{perm=[0, 2, 1, 3]}} : f32[2, 8, {heads}, {d}] @layers.0.self_attn
  %48 = reshape(%47) {{shape=[2, 8, {h}]}} : f32[2, 8, {h}] @layers.0.self_attn
  %49 = param {{name="o_proj.weight"}} : f32[{h}, {h}] @layers.0.self_attn.o_proj
  %50 = matmul(%48, %49) : f32[2, 8, {h}] @layers.0.self_attn.o_proj
  return %50
}}"""
    return text


def _refusal(trace: Trace) -> tuple[int, object]:
    """(step index, the headline `default_scale` refusal) of the run."""
    return next((k, r) for k, s in enumerate(trace.steps) for r in s.rejections
                if r.guard == "default_scale" and r.headline)


def _blocks(trace: Trace) -> int:
    return sum(1 for n in trace.final if n.op == Op.FUSED_ATTENTION_BLOCK)


def _same_numbers(trace: Trace, w: WhatIf, after: Trace, tol64: Tolerance) -> None:
    """The what-if model in float64 (to `tol64`, with the test's weights and with unit-scale ones) and its fused graph
    (same-backend tolerance, the test's weights: unit-scale ones make softmax a float32 rounding's tie-break) give the
    original's outputs, as `session.advice` checks them."""
    g = trace.input
    feeds, weights = _feeds_weights(g)
    unit = {k: np.random.default_rng(1).standard_normal(v.shape).astype(v.dtype) for k, v in weights.items()}
    same = precision_policy(g, "cpu").same_backend
    for ws in (weights, unit):
        want64 = run_reference(g, feeds, ws, float_dtype=np.float64)
        got64 = run_reference(w.graph, feeds, ws, float_dtype=np.float64)
        assert close(got64, want64, tol64, same_nonfinite=True)
    assert close(run_reference(after.final, feeds, weights), run_reference(g, feeds, weights), same,
                 same_nonfinite=True)


@pytest.mark.parametrize("heads, d, scale, ratio, exact, rounded", [
    (4, 16, "div 8.0", 0.5, True, False),      # 1/8 for 1/4: a power of two, bit-exact
    (4, 16, "mul 0.0625", 0.25, True, False),  # Granite's multiplier
    (4, 16, "mul 0.1", 0.4, False, False),     # no power of two: float32's 0.1 * 4 is still one float32 number
    (8, 8, "mul 0.125", 0.125 * math.sqrt(8), False, True),  # 1/sqrt(8) is irrational: the constants are rounded
], ids=["div8-pow2", "granite-pow2", "mul0.1", "d8-rounded"])
def test_the_fold_keeps_the_numbers_and_makes_the_block(heads, d, scale, ratio, exact, rounded):
    g = _attention(heads, d, scale)
    trace = Pipeline.canonical().run(g)
    assert _blocks(trace) == 0
    k, r = _refusal(trace)
    words = "exact here: 0.5 is a power of two and RoPE is linear" if ratio == 0.5 else (
        "exact here: 0.25 is a power of two and RoPE is linear" if exact else
        f"changes the numbers at rounding level only: {ratio:.6g} is not a power of two")
    assert r.hint.startswith(f"fold the scale into q_proj (matmul, node 9): multiply its weight q_proj.weight (node 8) "
                             f"by {ratio:.6g} = "), r.hint
    assert f"scale the scores by the default 1/sqrt({d}): the scores' scale {scale.split()[0]} (node 43) by " in r.hint
    assert r.hint.endswith(f"({words})"), r.hint
    w = what_if(trace, k, r)
    assert w is not None and (w.exact, w.rounded) == (exact, rounded), w
    after = w.pipeline.run(w.graph)
    assert fused_more(trace, after, r) and _blocks(after) == 1
    assert not any(x.guard == "default_scale" for x in after.rejections)
    same = precision_policy(g, "cpu").same_backend
    _same_numbers(trace, w, after, same if rounded else EXACT)
    # advice runs the same check and prints the fix
    feeds, weights = _feeds_weights(g)
    (f,) = [f for f in check_fixes(trace, check_fusion(trace, "m"), feeds, weights, verbose=True)
            if f.guard == "default_scale"]
    assert f.status == CHECKED, f
    assert ("numbers equal the unfused model up to rounding" in f.detail) == rounded, f.detail
    # a rounding-only change checked says how far rounding moved the numbers, in the line every view prints
    measured = re.search(r"changes the numbers at rounding level only, max err (\S+) in float64 on random", f.printed)
    assert (measured is not None) == rounded and (f.printed == r.hint) == (not rounded), f.printed
    assert measured is None or 0.0 < float(measured[1]) < 1e-5, f.printed


def test_a_q_projection_with_a_bias_and_a_prescale_scales_both():
    """03e: Q = (x @ W + b) * 0.5 (total 0.5, head_dim 16): W and b times 2, the Q pre-scale 0.25 (the default)."""
    g = parse_ir(PRESCALED.read_text())
    trace = Pipeline.canonical().run(g)
    k, r = _refusal(trace)
    assert r.hint == ("fold the scale into the Q projection (matmul, node 14): multiply its weight q.weight (node 8) "
                      "and its bias q.bias (node 9) by 2 = 0.5 / 0.25 and scale the scores by the default 1/sqrt(16): "
                      "the Q pre-scale mul (node 17) by 0.25 instead of 0.5 (exact here: 2 is a power of two)")
    w = what_if(trace, k, r)
    assert w is not None and w.exact
    after = w.pipeline.run(w.graph)
    assert fused_more(trace, after, r) and _blocks(after) == 1
    _same_numbers(trace, w, after, EXACT)


def test_a_hidden_state_deeper_than_pythons_stack_still_folds():
    """The hidden state reaches the projections through 1500 ops (a deep model): the fold's search for what reads a
    graph input walks them without recursion (it once followed them recursively, past Python's stack)."""
    src = _attention_text(4, 16, "mul 0.0625")
    chain = "".join(f"  %{1000 + i} = neg(%{1000 + i - 1 if i else 0}) : f32[2, 8, 64]\n" for i in range(1500))
    src = src.replace("  %1 = input", chain + "  %1 = input", 1)
    for mm in ("%9 = matmul(%0,", "%11 = matmul(%0,", "%13 = matmul(%0,"):
        src = src.replace(mm, mm.replace("%0,", "%2499,"))
    trace = Pipeline.canonical().run(parse_ir(src))
    assert not any(s.error for s in trace.steps), [s.error for s in trace.steps if s.error]
    k, r = _refusal(trace)
    assert r.hint.startswith("fold the scale into q_proj (matmul, node 9)") and what_if(trace, k, r) is not None


def test_a_transposed_weight_is_named_by_its_param():
    """`x @ transpose(W)` (a Gemm's transB): the line names the param the weight is read from."""
    src = _attention_text(4, 16, "mul 0.0625").replace(
        "  %9 = matmul(%0, %8)",
        "  %51 = transpose(%8) {perm=[1, 0]} : f32[64, 64] @layers.0.self_attn.q_proj\n  %9 = matmul(%0, %51)")
    trace = Pipeline.canonical().run(parse_ir(src))
    k, r = _refusal(trace)
    assert "multiply its weight q_proj.weight (node 8, read through transpose node 51) by 0.25" in r.hint, r.hint
    w = what_if(trace, k, r)
    assert w is not None
    after = w.pipeline.run(w.graph)
    assert fused_more(trace, after, r)
    _same_numbers(trace, w, after, EXACT)


def test_a_q_that_is_not_linear_in_its_projection_has_no_fold():
    """Q = tanh(x @ W) (no longer linear in the projection): scaling the weight would change the function; no fold,
    no fix."""
    g = _attention(4, 16, "mul 0.0625", squashed=True)
    trace = Pipeline.canonical().run(g)
    k, r = _refusal(trace)
    assert scale_fold(trace.input, trace.steps[:k], r) is None and what_if(trace, k, r) is None
    assert r.hint == "the block uses 1/sqrt(head_dim)"
    feeds, weights = _feeds_weights(g)
    (f,) = [f for f in check_fixes(trace, check_fusion(trace, "m"), feeds, weights, verbose=True)
            if f.guard == "default_scale"]
    assert f.status == NO_WHAT_IF and f.printed.startswith(UNCHECKED_FIX)  # a refuted proposal: still counts


def test_granite_prints_the_checked_fold_and_no_longer_says_nothing_in_the_model(capsys):
    code, text, err = cli_run(capsys, "explain", "-v", GRANITE)
    assert "Traceback" not in err, err
    # at a gap in rlxviz's ops the rule's own line names the model change as a workaround, after the compiler fix
    # (newcomer run 18: `fix: fold ...` read as the fix while the headline blamed rlxviz's op)
    lines = [ln.strip() for ln in text.splitlines()]
    assert not any(ln.startswith("fix: fold the scale") for ln in lines)
    fixes = [ln for ln in lines if ln.startswith("a workaround in the model: fold the scale")]
    assert all(lines[lines.index(f) - 1] == "compiler fix: give FusedAttentionBlock a scale attribute" for f in fixes)
    want = ("a workaround in the model: fold the scale into q_proj (matmul, node {proj}): multiply its weight "
            "layers.{layer}.self_attn.q_proj.{weight} (node {w}) by 0.25 = 0.0625 / 0.25 and scale the scores by the "
            "default 1/sqrt(16): the scores' scale mul (node {scale}) by 0.25 instead of 0.0625 (exact here: 0.25 is a "
            "power of two and RoPE is linear)")
    assert fixes == [want.format(proj=26, layer=0, weight="val_57", w=25, scale=62),
                     want.format(proj=103, layer=1, weight="val_187", w=102, scale=136)], fixes
    assert "no change to the model that keeps its numbers is known" not in text
    head = next(ln for ln in text.splitlines() if ln.startswith("granite (canonical pipeline)"))
    assert head.endswith("(rlxviz lacks FusedAttentionBlock with a non-default scale: a compiler fix; a workaround in "
                         "the model in 2 of them (their gap lines name it))"), head
    assert "nothing in the model to change" not in head
    gap = [ln for ln in text.splitlines() if "gap in rlxviz's ops: fuse_attention_block" in ln]
    assert len(gap) == 2 and all("(compiler fix: give FusedAttentionBlock a scale attribute; a workaround in the "
                                 "model: fold the scale into q_proj" in ln for ln in gap), gap
    assert code == 0  # still a gap in rlxviz's ops: the layers are not near-misses of the model
    jcode, out, _ = cli_run(capsys, "explain", GRANITE, "--json")
    j = json.loads(out)
    checks = [f for f in j["fix_checks"] if f["guard"] == "default_scale"]
    assert [f["fix"] for f in checks] == [x[len("a workaround in the model: "):] for x in fixes]
    assert all(f["status"] == CHECKED and f["compiler_fix"] == "give FusedAttentionBlock a scale attribute"
               for f in checks)
    assert jcode == code and j["headline"] == head
    assert [g["rounded"] for layer in j["layers"] for g in layer["gaps"] if g["workaround"]] == [False, False]


def test_a_fold_equal_only_up_to_rounding_says_so_in_the_headline(capsys):
    """A newcomer read granite.fp16's headline, "a workaround in the model in 2 of them", as the exact fold of the
    float32 export, though its fix line says "the same numbers up to rounding" (0.848633 is no power of two): the
    headline says it too, from the what-if's `rounded` (`OpGap.rounded`), and `--json`'s gaps carry it."""
    path = HERE / "fixtures" / "onnx" / "zoo" / "granite.fp16.onnx"
    code, text, _ = cli_run(capsys, "explain", path)
    head = text.splitlines()[1]
    assert head.endswith("a compiler fix; a workaround in the model in 2 of them (it changes the numbers at rounding "
                         "level only; their gap lines name it))"), head
    assert code == 0 and text.count("(changes the numbers at rounding level only, max err ") == 2, text
    _, out, _ = cli_run(capsys, "explain", path, "--json")
    j = json.loads(out)
    assert j["headline"] == head
    assert [g["rounded"] for layer in j["layers"] for g in layer["gaps"] if g["workaround"]] == [True, True]


def test_the_fold_is_checked_without_verbose_too(capsys):
    """The gap line names the fold without `-v`: the plain run checks it as well (`printed_refusals`)."""
    code, text, _ = cli_run(capsys, "explain", GRANITE)
    assert code == 0 and text.count("a workaround in the model: fold the scale into q_proj") == 2, text
    m = load(str(GRANITE))
    trace = Pipeline.canonical().run(m.graph)
    _, fixes = checked_verdict(trace, m.name, m.random_feeds(0), m.weights)
    assert [(f.anchor, f.status) for f in fixes if f.guard == "default_scale"] == [(207, CHECKED), (210, CHECKED)]


def test_the_app_says_the_workaround_where_it_says_the_gap():
    """The start strip's layer line and the chip's gap mark read the same words as the headline (`text.gap_asks`):
    granite's gap is a compiler fix with a workaround in the model, not "nothing in the model to change"."""
    from test_app_start_own_model import _line, _onnx_start

    s, start = _onnx_start("cases/granite.onnx")
    start.why.clicks += 1
    said = _line(start)
    assert (f"Layer 0 fused as far as rlxviz's ops go (rlxviz lacks FusedAttentionBlock with a non-default scale: "
            f"{GAP_HAS_A_WORKAROUND})") in said, said
    k = next(i for i, st in enumerate(s.trace.steps) if st.pass_name == "fuse_attention_block")
    p = places(s.trace, k)
    assert (p.gap_worked, p.gap_rounded) == (2, 0)  # the checked fold, as data: no chip reads it back from the words
    mark = html.unescape(op_gap_mark(p.gaps, None, p.lacks, p.gap_worked, rounded=p.gap_rounded))
    # two places, as the headline counts its two layers (newcomer run 38: the chip said "too (its gap line ...)")
    assert ("rlxviz's ops lack FusedAttentionBlock with a non-default scale: a compiler fix; a workaround in the model "
            "in 2 of them (their gap lines name it). ") in mark, mark
    assert "nothing in the model to change" not in mark
    assert left_out_heading(OP_GAP_GROUP, len(p.gaps), True) in mark  # the group's heading says it too
    # the words alone decide nothing: the same items without the flag say the compiler's fix only
    plain = html.unescape(op_gap_mark(p.gaps, None, p.lacks))
    assert f": {GAP_IS_THE_COMPILERS}. " in plain and "a workaround in the model too" not in plain.split(". ")[0]


def test_a_float16_fold_says_what_its_rounding_did(capsys):
    """granite.fp16 (newcomer run 40): the fold's line gave 1/sqrt(8) as 0.353553 and then the new constant 0.353516
    beside it, and the weight's ratio 0.848633 as 0.300049 / 0.353553 (0.848666), saying nothing of float16. Each
    value its dtype rounds says the value meant and the rounding; a float32 model's line is unchanged (above)."""
    code, text, err = cli_run(capsys, "explain", "-v", HERE / "fixtures" / "onnx" / "zoo" / "granite.fp16.onnx")
    assert "Traceback" not in err, err
    fixes = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("a workaround in the model: fold")]
    assert fixes, text
    for fix in fixes:
        assert "by 0.848633 (0.300049 / 0.353553 = 0.848666, rounded to float16)" in fix, fix
        assert "by 0.353516 (1/sqrt(8) = 0.353553, rounded to float16) instead of 0.300049" in fix, fix
