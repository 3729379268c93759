"""Advice that keeps the model's numbers, and expectations from what is legal for a layer (issue 38).

Three kinds, each the outside case (tests/data/cases, copied from ../shared/cases) and variants written here:

* DeepNorm's scaled residual `LN(alpha * x + f(x))` (n4-06): FusedResidualLN fires on both norms with `alpha * x`
  as its residual operand; FusedTransformerLayer is refused naming the alpha mul, and no fix line drops alpha.
* Cross-layer KV sharing (n4-13): later layers read layer 0's K/V heads. Every attention packs (the packed op takes
  K/V unsplit, the shared head split stays for its other reader); layer 0's block is illegal (its K/V are read by
  another layer) and not expected; no fix line undoes the sharing.
* A residual sum or h1 read by a probe returned as an output (n4-15): not called pre-LN, the probe is never "fixed"
  away; the layer is fused as far as legal. A probe that is *not* returned is dead: removing it is a fix that keeps
  the numbers, checked here as a what-if.

Every version of every graph keeps the unfused numbers (reference interpreter).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from rlxviz.cli import main
from rlxviz.ir import Graph, Op, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.passes.guard import COMPILER_ONLY, ILLEGAL, NO_MODEL_FIX, READ_BY_MODEL
from rlxviz.passes.pipeline import CANONICAL_ORDER
from rlxviz.passes.refusal_kinds import NOTHING_TO_CHANGE
from rlxviz.passes.whatif import MODEL, fix_form
from rlxviz.runtime import run_reference
from rlxviz.session import check_fusion

CASES = Path(__file__).parent / "data" / "cases"


def case_text(name: str) -> str:
    return next(CASES.glob(f"{name}-*.rlx")).read_text()


def run_checked(g: Graph, pipeline: Pipeline | None = None):
    """The pipeline's trace; every version's outputs equal the unfused graph's (random inputs, a padded keep mask)."""
    t = (pipeline or Pipeline.canonical()).run(g)
    assert not [s.error for s in t.steps if s.error]
    rng = np.random.default_rng(0)
    feeds = {}
    for n in g.inputs:
        if n.dtype.is_float:
            feeds[n.name] = rng.standard_normal(n.shape).astype(np.float32)
        else:
            m = (rng.random(n.shape) > 0.3).astype(np.int64)
            m[..., 0] = 1
            feeds[n.name] = m
    w = {n.name: (0.2 * rng.standard_normal(n.shape)).astype(np.float32) for n in g.params}
    ref = run_reference(g, feeds, w)
    for label, v in t.versions()[1:]:
        out = run_reference(v, feeds, w)
        assert len(out) == len(ref), label
        for a, b in zip(ref, out, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5, err_msg=label)
    return t


def honest(check) -> None:
    """Every refusal the product shows that is illegal for a model reason says so: its fix line is `none in the
    model: ...` (never a change that drops a reader, an output or a scale), and it names a compiler fix."""
    for s in check.layers:
        for o in [*([s.first] if s.first else []), *s.rejections, *s.illegal]:
            if o.remedy in (COMPILER_ONLY, READ_BY_MODEL):
                assert o.hint.startswith((NO_MODEL_FIX, NOTHING_TO_CHANGE)) or fix_form(o.hint) == MODEL, o
                assert o.fix, o
    text = check.render(verbose=True)
    for dropped in ("must not be read elsewhere", "must feed only the norm", "make ln1 (role h1) feed only",
                    "must add the attention output and the layer input", "pre-LN ordering"):
        assert f"fix: {dropped}" not in text and dropped not in "\n".join(
            ln for ln in text.splitlines() if ln.strip().startswith("fix:")), (dropped, text)


def explain_exit(capsys, path: Path) -> tuple[int, str]:
    code = main(["explain", str(path)])
    return code, capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ DeepNorm

def deepnorm(alpha1: float | None = 2.0, alpha2: float | None = 2.0, const_first: bool = False) -> str:
    """Case n4-06 with the alphas changed (None: that residual unscaled) and, with `const_first`, `alpha * x`
    written with the constant as the mul's first operand."""
    text = case_text("n4-06")
    for mul, const, base, alpha, add in (("%40", "%39", "%0", alpha1, "%41 = add(%38, %40)"),
                                         ("%55", "%54", "%44", alpha2, "%56 = add(%53, %55)")):
        if alpha is None:
            text = text.replace(add, add.replace(mul, base))
            text = "\n".join(ln for ln in text.splitlines()
                             if not ln.strip().startswith((f"{mul} = ", f"{const} = ")))
        else:
            text = text.replace(f"{const} = const {{value=2.0}}", f"{const} = const {{value={alpha}}}")
            if const_first:
                text = text.replace(f"mul({base}, {const})", f"mul({const}, {base})")
    return text


def _scaled_residual_norms(t) -> list[tuple[int, float]]:
    """(residual mul id, alpha) of every FusedResidualLN in the final graph whose residual is a scaled value."""
    g = t.final
    out = []
    for n in g:
        if n.op == Op.FUSED_RESIDUAL_LN:
            for i in n.inputs[:2]:
                if g[i].op == Op.MUL:
                    (k,) = [j for j in g[i].inputs if g[j].op == Op.CONST]
                    out.append((i, float(g[k].attrs["value"])))
    return out


@pytest.mark.parametrize("alpha1, alpha2, const_first, guard, mul", [
    (2.0, 2.0, False, "ln1_residual_scaled", 40),     # the case
    (0.5, 0.5, False, "ln1_residual_scaled", 40),     # another alpha
    (None, 0.81, True, "ln2_residual_scaled", 55),    # only the FFN residual scaled, written alpha * h1
])
def test_deepnorm_scaled_residual_keeps_alpha(alpha1, alpha2, const_first, guard, mul):
    t = run_checked(parse_ir(deepnorm(alpha1, alpha2, const_first)))
    scaled = _scaled_residual_norms(t)
    assert sorted(scaled) == sorted((m, a) for m, a in ((40, alpha1), (55, alpha2)) if a is not None)
    assert t.final.fused_op_counts().get("FusedResidualLN") == 2 and "FusedTransformerLayer" not in \
        t.final.fused_op_counts()
    check = check_fusion(t, "deepnorm")
    (s,) = check.layers
    # no change to the model keeps alpha's numbers: a gap in rlxviz's ops (the layer op lacks a residual scale), not a
    # near-miss, so the layer is fused as far as rlxviz's ops go and the run exits 0
    assert s.fused and s.gap_only and s.first is None and check.ok, s.render()
    (gap,) = s.gaps
    assert (gap.form, gap.rule, gap.by) == ("residual scale (alpha) on FusedTransformerLayer",
                                            "fuse_transformer_layer.bert_post_ln", guard)
    (line,) = [x for x in s.gap_refusals if x.startswith(f"fuse_transformer_layer.bert_post_ln ({guard})")]
    assert f"mul (node {mul}," in line and "DeepNorm" in line and "residual scale (alpha)" in line, line
    (r,) = [r for st in t.steps for r in st.rejections if r.guard == guard]
    assert r.hint.startswith(NO_MODEL_FIX + "alpha scales the residual stream") and r.kind == "not recognized"
    honest(check)


def test_deepnorm_control_alpha1_is_one_layer_op(capsys):
    t = run_checked(parse_ir(case_text("n4-06c")))
    assert t.final.fused_op_counts().get("FusedTransformerLayer") == 1
    assert explain_exit(capsys, next(CASES.glob("n4-06c-*.rlx")))[0] == 0
    code, out = explain_exit(capsys, next(CASES.glob("n4-06-*.rlx")))
    assert code == 0 and "(ln1_residual_scaled)" in out and "mul (node 40, encoder.layer.0) = hidden * 2" in out
    assert "1 fused as far as rlxviz's ops go (rlxviz lacks residual scale (alpha) on FusedTransformerLayer" in out


# ---------------------------------------------------------------------------------------- cross-layer KV sharing

def _layer(k: int, h: str, n: int, kt_of: str | None = None, own_kv: bool = False) -> tuple[list[str], str, int]:
    """Lines of attention layer `k` reading hidden `h`, ids from `n`: own Q (and own K/V with `own_kv`), else layer
    0's K/V heads `%19`/`%25` (or, with `kt_of`, layer 0's transposed K `kt_of` straight into the scores)."""
    p = f"@model.layers.{k}.self_attn"
    ids = iter(range(n, n + 40))
    lines: list[str] = []

    def emit(body: str) -> str:
        i = f"%{next(ids)}"
        lines.append(f"  {i} = {body} {p}")
        return i

    def proj(name: str) -> str:
        w = emit(f'param {{name="{name}_{k}.weight"}} : f32[64, 64]')
        mm = emit(f"matmul({h}, {w}) : f32[2, 8, 64]")
        b = emit(f'param {{name="{name}_{k}.bias"}} : f32[64]')
        a = emit(f"add({mm}, {b}) : f32[2, 8, 64]")
        r = emit(f"reshape({a}) {{shape=[2, 8, 4, 16]}} : f32[2, 8, 4, 16]")
        return emit(f"transpose({r}) {{perm=[0, 2, 1, 3]}} : f32[2, 4, 8, 16]")

    q = proj("q_proj")
    kh, vh = (proj("k_proj"), proj("v_proj")) if own_kv else ("%19", "%25")
    kt = kt_of or emit(f"transpose({kh}) {{perm=[0, 1, 3, 2]}} : f32[2, 4, 16, 8]")
    s = emit(f"matmul({q}, {kt}) : f32[2, 4, 8, 8]")
    c = emit("const {value=4.0} : f32[]")
    d = emit(f"div({s}, {c}) : f32[2, 4, 8, 8]")
    m = emit(f"add({d}, %7) : f32[2, 4, 8, 8]")
    sm = emit(f"softmax({m}) {{axis=-1}} : f32[2, 4, 8, 8]")
    pv = emit(f"matmul({sm}, {vh}) : f32[2, 4, 8, 16]")
    tr = emit(f"transpose({pv}) {{perm=[0, 2, 1, 3]}} : f32[2, 8, 4, 16]")
    rs = emit(f"reshape({tr}) {{shape=[2, 8, 64]}} : f32[2, 8, 64]")
    ow = emit(f'param {{name="o_proj_{k}.weight"}} : f32[64, 64]')
    om = emit(f"matmul({rs}, {ow}) : f32[2, 8, 64]")
    ob = emit(f'param {{name="o_proj_{k}.bias"}} : f32[64]')
    oa = emit(f"add({om}, {ob}) : f32[2, 8, 64]")
    out = emit(f"add({h}, {oa}) : f32[2, 8, 64]")
    return lines, out, next(ids)


def kv_shared(layers: int = 3, kt_direct: bool = False) -> str:
    """Case n4-13's layer 0 (its lines %0..%39), then `layers - 1` layers with their own Q reading layer 0's K/V
    heads; with `kt_direct` they read layer 0's transposed K (`%26`) itself."""
    head = case_text("n4-13").split("  %40 = ")[0]
    body, h, n = [], "%39", 100
    for k in range(1, layers):
        lines, h, n = _layer(k, h, n, "%26" if kt_direct else None)
        body += lines
    return head + "\n".join(body) + f"\n  return {h}\n}}\n"


@pytest.mark.parametrize("text", [lambda: case_text("n4-13"), lambda: kv_shared(3), lambda: kv_shared(2, True)],
                         ids=["case", "three-layers", "k-transposed-shared"])
def test_cross_layer_kv_sharing_packs_every_attention(text):
    g = parse_ir(text())
    layers = sum(1 for n in g if n.op == Op.SOFTMAX)
    t = run_checked(g)
    assert sum(1 for n in t.final if n.op == Op.ATTENTION) == layers  # every attention packed
    check = check_fusion(t, "kv")
    assert check.ok, check.render()
    honest(check)
    first = check.layers[0]
    (block,) = [o for o in first.illegal if o.pass_name == "fuse_attention_block"]
    assert block.kind == ILLEGAL and block.remedy == READ_BY_MODEL and "model.layers.1.self_attn" in block.hint
    assert "returns the Q/K/V it projects" in block.fix
    for s in check.layers[1:]:
        # the packed attention is a plain op a rewrite made: "rewritten as", not a fusion (issue 39)
        assert s.fused and not s.illegal and "attention %" in " ".join(s.rewritten)
    said = "\n".join(check.left_out)
    assert said.count("cross-layer KV sharing") == layers - 1  # the later layers' blocks: the model's own term
    (shared,) = {r.fix for r in t.rejections if r.guard == "self_attention"}
    assert shared.startswith("the block would need a KV input it does not own")


def test_cross_layer_kv_sharing_explain_exits_0(capsys):
    code, out = explain_exit(capsys, next(CASES.glob("n4-13-*.rlx")))
    assert code == 0 and "layer 0: fused as far as legal" in out and "layer 1: fused as expected" in out
    assert "illegal here: fuse_attention_block.qkv_attention_out" in out
    assert main(["explain", str(next(CASES.glob("n4-13-*.rlx"))), "--json"]) == 0  # the same verdict as data
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and [x["status"] for x in doc["layers"]] == ["fused as far as legal", "fused"]
    assert [(o["rule"], o["kind"], o["remedy"]) for o in doc["layers"][0]["illegal"]] == [
        ("fuse_attention_block.qkv_attention_out", ILLEGAL, READ_BY_MODEL)]


def test_kv_source_layer_is_legal_only_even_when_other_layers_get_their_block():
    """Gemma 3n's shape: layer 1 reuses layer 0's K/V, layer 2 projects its own (its block fuses). Layer 0's block is
    still not expected: the reader of its K/V is another layer (the model's design, not a stray reader)."""
    head = case_text("n4-13").split("  %40 = ")[0]
    one, h, n = _layer(1, "%39", 100)
    two, h, n = _layer(2, h, n, own_kv=True)
    t = run_checked(parse_ir(head + "\n".join(one + two) + f"\n  return {h}\n}}\n"))
    assert t.final.fused_op_counts().get("FusedAttentionBlock") == 1  # layer 2's
    check = check_fusion(t, "kv")
    assert check.ok, check.render()
    assert [o.guard for o in check.layers[0].illegal] == ["qkv_narrows_single_use"]
    honest(check)


def test_unshared_layers_still_expect_their_blocks():
    """Control: the same three layers, each projecting its own K/V: no attention keeps a shared head split, every
    layer's block fuses (the shared-view change leaves single-use head splits absorbed as before)."""
    head = case_text("n4-13").split("  %40 = ")[0]
    body, h, n = [], "%39", 100
    for k in range(1, 3):
        lines, h, n = _layer(k, h, n, own_kv=True)
        body += lines
    t = run_checked(parse_ir(head + "\n".join(body) + f"\n  return {h}\n}}\n"))
    assert t.final.fused_op_counts().get("FusedAttentionBlock") == 3
    assert not [n for n in t.final if n.op in (Op.RESHAPE, Op.TRANSPOSE) and n.shape == (2, 4, 8, 16)]


# ----------------------------------------------------------------------------------------- probes

def probed(on: str = "sum1", returned: bool = True) -> str:
    """Case n4-15 with its probe `reduce_mean(v * v)` on the first residual sum (`sum1`, the case), on h1 (`h1`) or on
    the second residual sum (`sum2`); not returned (`returned=False`): a dead probe."""
    text = case_text("n4-15")
    probe = ("  %43 = mul(%39, %39) : f32[2, 8, 64] @encoder.layer.0\n"
             "  %44 = reduce_mean(%43) {axes=[2], keepdims=false} : f32[2, 8] @encoder.layer.0\n")
    assert probe in text
    if on == "h1":
        text = text.replace("mul(%39, %39)", "mul(%42, %42)")
    elif on == "sum2":
        text = text.replace(probe, "").replace("  return %57, %44", probe.replace("%39", "%54") + "  return %57, %44")
    if not returned:
        text = text.replace("return %57, %44", "return %57")
    return text


def test_logged_residual_sum_is_post_ln_fused_as_far_as_legal(capsys):
    t = run_checked(parse_ir(probed()))
    assert len(t.final.outputs) == 2 and t.final.fused_op_counts().get("FusedResidualLN") == 1
    check = check_fusion(t, "probe")
    assert check.ok
    (s,) = check.layers
    assert s.architecture.kind == "post_ln" and s.fused and s.first is None
    assert [(o.rule, o.guard) for o in s.illegal] == [("fuse_residual_ln.residual", "sum_single_user"),
                                                      ("fuse_transformer_layer.bert_post_ln",
                                                       "residual_sum_single_user")]
    assert all("reduce_mean (node 44" in o.hint for o in s.illegal)  # the probe named, never "removed"
    honest(check)
    code, out = explain_exit(capsys, next(CASES.glob("n4-15-*.rlx")))
    assert code == 0 and "fused as far as legal" in out and "pre-LN" not in out


@pytest.mark.parametrize("on, illegal", [
    ("h1", [("fuse_transformer_layer.bert_post_ln", "h1_user_count")]),
    ("sum2", [("fuse_residual_ln.residual", "sum_single_user"),
              ("fuse_transformer_layer.bert_post_ln", "ffn_sum_single_user")]),
])
def test_probe_on_another_intermediate(on, illegal):
    t = run_checked(parse_ir(probed(on)))
    check = check_fusion(t, "probe")
    (s,) = check.layers
    assert len(t.final.outputs) == 2 and check.ok and s.fused and s.first is None
    assert [(o.rule, o.guard) for o in s.illegal] == illegal
    # h1 read: both residual norms fuse, the layer op would hide h1; the second sum read: ln1 fuses only
    assert t.final.fused_op_counts().get("FusedResidualLN") == (2 if on == "h1" else 1)
    assert all("reduce_mean (node 44" in o.hint for o in s.illegal)
    honest(check)


def test_dead_probe_is_a_fix_in_the_model_checked_as_a_what_if():
    """A probe nothing returns is dead: its refusal is fixable in the model (remove the reader) and counts; applying
    that fix (dead-code elimination first) fuses the whole layer with the same numbers."""
    g = parse_ir(probed(returned=False))
    check = check_fusion(run_checked(g), "dead")
    (s,) = check.layers
    assert not s.fused and not s.illegal and s.first.kind == ILLEGAL
    assert s.first.remedy not in (COMPILER_ONLY, READ_BY_MODEL)
    assert not s.first.hint.startswith(NO_MODEL_FIX), s.first
    fixed = run_checked(g, Pipeline(["dead_code_elimination", *CANONICAL_ORDER]))
    assert fixed.final.fused_op_counts().get("FusedTransformerLayer") == 1
    assert check_fusion(fixed, "dead").ok


# ------------------------------------------------------------------------------------- the invariant, everywhere

def _handed_and_variants():
    from rlxviz.models import VARIANTS, load_model

    out = [(p.stem, lambda p=p: parse_ir(p.read_text())) for p in sorted(CASES.glob("*.rlx"))]
    return out + [(f"bert-tiny:{v}", lambda v=v: load_model("bert-tiny", seq=8, variant=VARIANTS[v]).graph)
                  for v in VARIANTS if v != "none"]


@pytest.mark.parametrize("name, make", _handed_and_variants(), ids=[n for n, _ in _handed_and_variants()])
def test_no_fix_line_changes_the_model(name, make):
    """Every refusal of every handed case and teaching variant whose guard says no model change keeps the numbers
    prints `fix: none in the model: <why>` and names a compiler fix; a `read by the model` refusal names a reader
    that reaches a graph output (or the value is itself one): removing it would change what the model returns."""
    from rlxviz.passes.guard import reaches_output

    t = Pipeline.canonical().run(make())
    for s in t.steps:
        for r in s.rejections:
            if r.remedy in (COMPILER_ONLY, READ_BY_MODEL):
                # the hint says so: `none in the model: <why>`, or a statement (`nothing to change in the model`), or
                # a change its rule says changes the numbers, which `explain` checks and prints as
                # `none in the model: applying it ...` (`test_fix_whatif`)
                assert (r.hint.startswith((NO_MODEL_FIX, NOTHING_TO_CHANGE)) or fix_form(r.hint) == MODEL) and r.fix, \
                    (r.rule, r.guard, r.hint, r.fix)
            if r.remedy == READ_BY_MODEL:
                g = s.before
                assert any(reaches_output(g, i) is not None for i in (*r.offending, r.subject) if i in g), r
